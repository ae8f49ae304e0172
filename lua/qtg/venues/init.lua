-- qtg.venues: the registry of CEX venue adapters used by cex_transfer_ingest
-- (docs/conditional-workers.md section 7).  One row per venue name that may
-- appear in MG_CEX_TRANSFER_INGEST_VENUES_CSV, naming the adapter module
-- that speaks for it.  A name without a row is an unknown venue: the worker
-- records the error on that venue's cursor row and goes on with the others.
--
-- An adapter is a module with fetch_page(venue, cursor, settings) ->
-- {transfers = {normalized...}, next_cursor = text|nil, has_more = bool}
-- or nil, reason.  Normalized transfer: {id, direction = deposit|withdrawal,
-- asset, amount (decimal text), fee (decimal text or nil), network, address,
-- tx_hash, status = pending|completed|failed|cancelled, time (ISO-8601 UTC),
-- raw (the venue's object)}.
--
-- Every venue listed here goes through the venue connector service at
-- MG_CEX_API_URL (qtg.venues.connector): one documented HTTP shape for all
-- venues, the connector holding the venue credentials.  An operator adds a
-- venue, or an adapter that talks to a venue directly, with register().
local M = {}

M.VENUES = {
  binance = "qtg.venues.connector",
  coinbase = "qtg.venues.connector",
  kraken = "qtg.venues.connector",
  okx = "qtg.venues.connector",
  bybit = "qtg.venues.connector",
}

-- register(venue, module_name): add or replace a venue's adapter.
function M.register(venue, module_name)
  if type(venue) ~= "string" or not venue:match("^[a-z0-9][a-z0-9_-]*$") then
    error("venues.register: venue must be [a-z0-9][a-z0-9_-]*, got " .. tostring(venue), 2)
  end
  if type(module_name) ~= "string" then error("venues.register: module name required", 2) end
  M.VENUES[venue] = module_name
end

-- validate(adapter) -> list of errors (empty: usable), for reload.
function M.validate(adapter)
  local ok, f = pcall(function() return type(adapter) == "table" and adapter.fetch_page end)
  if not ok or type(f) ~= "function" then
    return { "a venue adapter module must return a table with fetch_page(venue, cursor, settings)" }
  end
  return {}
end

-- adapter(venue) -> adapter module, or nil, reason.
function M.adapter(venue)
  local name = M.VENUES[venue]
  if not name then
    return nil, string.format("unknown venue %q: no adapter in qtg.venues (known: %s)", tostring(venue),
      table.concat(M.names(), ", "))
  end
  local ok, mod = pcall(require, name)
  if not ok then return nil, "venue " .. venue .. ": cannot load adapter " .. name .. ": " .. tostring(mod) end
  if type(mod) ~= "table" or type(mod.fetch_page) ~= "function" then
    return nil, "venue " .. venue .. ": adapter " .. name .. " has no fetch_page"
  end
  return mod
end

function M.names()
  local out = {}
  for k in pairs(M.VENUES) do out[#out + 1] = k end
  table.sort(out)
  return out
end

-- parse_csv(text) -> array of venue names (trimmed, lower-case, unique, in order).
function M.parse_csv(text)
  local out, seen = {}, {}
  for entry in (text or ""):gmatch("[^,]+") do
    local v = entry:match("^%s*(.-)%s*$"):lower()
    if v ~= "" and not seen[v] then
      seen[v] = true
      out[#out + 1] = v
    end
  end
  return out
end

return M
