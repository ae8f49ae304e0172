-- qtg.balances: the balance fetcher registry, the append-only snapshot
-- writes, and the read side with staleness judged at read time (spec
-- section 7; docs/conditional-workers.md section 5).
--
-- FETCHERS is one row per venue: venue_key, and fetch(settings) -> array of
-- {asset=, amount= (decimal text), detail= (object)} or nil, reason.  The
-- default (and only built-in) fetcher reads the unified USDC balance of
-- MG_GATEWAY_DEPOSITORS from the Gateway API (MG_GATEWAY_API_URL,
-- POST /v1/balances) and sums it over domains into one venue_key "gateway"
-- snapshot.  An operator adds a venue by adding a row (M.register).
--
-- A failed fetch is stored as a snapshot too (ok = false, error): the last
-- good amount stays visible, with its age, and the reason it is not fresher.
-- latest(s) is what the console's balances() shows: the last good amount of
-- each venue and asset, its age and `stale` = age > MG_BALANCE_STALE_THRESHOLD_SECONDS
-- (judged now, never stored), and the error of a later failed fetch.
local qtg = require("qtg")
local cjson = require("cjson.safe")
local evm_rpc = require("qtg.evm_rpc")
local canon = require("qtg.canon_json")

local M = {}

M.CONSOLE_COLUMNS = { "venue_key", "asset", "amount", "captured_at", "age_seconds", "stale", "last_error" }
M.MAX_BODY = 1024 * 1024

local json = cjson.new()
json.decode_invalid_numbers(false)
json.decode_max_depth(32)

local function is_decimal(v)
  return type(v) == "string" and #v <= 80 and v:match("^%d+$") ~= nil
    or type(v) == "string" and #v <= 80 and v:match("^%d+%.%d+$") ~= nil
end
M.is_decimal = is_decimal

-- The Gateway API: POST {base}/v1/balances {"token":"USDC","sources":[{"depositor":...}]}
-- -> {"token":"USDC","balances":[{"domain":n,"depositor":"0x..","balance":"12.5"}]}.
-- A source without a domain asks for every domain of that depositor.
function M.gateway_fetch(settings)
  local base = settings.gateway_api_url
  if type(base) ~= "string" or not base:match("^https?://") then
    return nil, "MG_GATEWAY_API_URL is not set to an http(s) URL"
  end
  local sources = {}
  for entry in (settings.gateway_depositors or ""):gmatch("[^,]+") do
    entry = entry:match("^%s*(.-)%s*$")
    if entry ~= "" then
      local a, why = evm_rpc.check_address(entry)
      if not a then return nil, "MG_GATEWAY_DEPOSITORS: " .. why end
      sources[#sources + 1] = { depositor = a }
    end
  end
  if #sources == 0 then return nil, "MG_GATEWAY_DEPOSITORS names no depositor address" end
  local resp, err = qtg.http.request{
    method = "POST", url = base:gsub("/+$", "") .. "/v1/balances",
    headers = { ["Content-Type"] = "application/json", ["Accept"] = "application/json" },
    body = json.encode({ token = "USDC", sources = sources }),
    timeout = settings.provider_timeout_seconds, connect_timeout = math.min(5, settings.provider_timeout_seconds),
    max_body = M.MAX_BODY,
  }
  if not resp then return nil, string.format("gateway: %s: %s", err.kind, err.message) end
  if resp.status ~= 200 then
    return nil, string.format("gateway: HTTP %d: %s", resp.status, canon.excerpt(resp.body or "", 120))
  end
  local doc = canon.decode(resp.body or "", json)
  if type(doc) ~= "table" or doc.token ~= "USDC" or type(doc.balances) ~= "table" then
    return nil, "gateway: answer is not a USDC balances object: " .. canon.excerpt(resp.body or "", 120)
  end
  local amounts, domains = {}, canon.array()
  for i, b in ipairs(doc.balances) do
    if type(b) ~= "table" or not is_decimal(b.balance) or type(b.domain) ~= "number" then
      return nil, string.format("gateway: balances[%d] lacks a decimal balance and a domain", i)
    end
    if type(b.depositor) ~= "string" or #b.depositor > 200 or not canon.text_ok(b.depositor) then
      return nil, string.format("gateway: balances[%d] has no depositor text (at most 200 bytes of UTF-8, no NUL)", i)
    end
    amounts[#amounts + 1] = b.balance
    domains[#domains + 1] = { domain = b.domain, depositor = b.depositor, balance = b.balance }
  end
  return { { asset = "USDC", amounts = amounts, detail = { domains = domains, depositors = #sources } } }
end

M.FETCHERS = {
  { venue_key = "gateway", fetch = M.gateway_fetch },
}

-- register{venue_key=, fetch=}: add or replace a fetcher (operator policy).
function M.register(row)
  if type(row) ~= "table" or type(row.venue_key) ~= "string" or not row.venue_key:match("^[a-z0-9][a-z0-9_.:-]*$")
     or type(row.fetch) ~= "function" then
    error("balances.register: want {venue_key = [a-z0-9][a-z0-9_.:-]*, fetch = function}", 2)
  end
  for i, r in ipairs(M.FETCHERS) do
    if r.venue_key == row.venue_key then M.FETCHERS[i] = row return end
  end
  M.FETCHERS[#M.FETCHERS + 1] = row
end

-- Amounts are summed by PostgreSQL (numeric: exact).
M.INSERT_OK_SQL = [[
INSERT INTO balance_snapshots (network_class, venue_key, asset, ok, amount, detail, source, process_id)
SELECT $1, $2, $3, true, coalesce(sum(a::numeric), 0), $5::jsonb, $6, $7
  FROM jsonb_array_elements_text($4::jsonb) AS a
RETURNING id]]

M.INSERT_ERR_SQL = [[
INSERT INTO balance_snapshots (network_class, venue_key, asset, ok, error, source, process_id)
VALUES ($1, $2, $3, false, $4, $5, $6)
RETURNING id]]

-- A failed fetch's reason as stored and logged: whatever a fetcher (an
-- operator's included) answered, at most 500 bytes of valid text.
local function clip(s) return canon.excerpt(s, 500) end

-- fetch(fetcher) -> fetched: the venue's answer, {fetcher=, res=, why=}
-- (res nil: why says what failed).  Needs no database session.
function M.fetch(fetcher)
  local ok, res, why = pcall(fetcher.fetch, qtg.settings)
  if not ok then res, why = nil, "fetcher raised: " .. tostring(res) end
  return { fetcher = fetcher, res = res, why = why }
end

-- store(s, fetched, source[, process_id]) -> rows written: what fetch
-- brought back, appended (a failure as a row with ok = false).
function M.store(s, fetched, source, process_id)
  local settings = qtg.settings
  local fetcher, res, why = fetched.fetcher, fetched.res, fetched.why
  if not res then
    s:query(M.INSERT_ERR_SQL, settings.network_class, fetcher.venue_key, "*", clip(why), source, process_id)
    qtg.log.warn("balance fetch failed", { worker = "balance_snapshot", venue_key = fetcher.venue_key,
      error = clip(why) })
    return 1
  end
  for _, b in ipairs(res) do
    local amounts = b.amounts or { b.amount }
    s:query(M.INSERT_OK_SQL, settings.network_class, fetcher.venue_key, b.asset,
      canon.encode(canon.array(amounts)), canon.encode(b.detail or {}), source, process_id)
  end
  return #res
end

-- snapshot(s, fetcher, source) -> rows written: fetch, then store (no
-- transaction needed around them).
function M.snapshot(s, fetcher, source, process_id)
  return M.store(s, M.fetch(fetcher), source, process_id)
end

-- fetcher_of(venue_key) -> the venue's fetcher row, or nil.
function M.fetcher_of(venue_key)
  for _, f in ipairs(M.FETCHERS) do
    if f.venue_key == venue_key then return f end
  end
  return nil
end

M.LATEST_SQL = [[
WITH good AS (
  SELECT DISTINCT ON (venue_key, asset) venue_key, asset, amount, captured_at
    FROM balance_snapshots
   WHERE network_class = $1 AND ok
   ORDER BY venue_key, asset, captured_at DESC, id DESC
), bad AS (
  SELECT DISTINCT ON (venue_key) venue_key, error, captured_at
    FROM balance_snapshots
   WHERE network_class = $1 AND NOT ok
   ORDER BY venue_key, captured_at DESC, id DESC
)
SELECT coalesce(g.venue_key, b.venue_key) AS venue_key, coalesce(g.asset, '*') AS asset,
       g.amount::text AS amount, g.captured_at,
       extract(epoch from clock_timestamp() - g.captured_at)::float8 AS age_seconds,
       CASE WHEN b.captured_at IS NOT NULL AND (g.captured_at IS NULL OR b.captured_at > g.captured_at)
            THEN b.error END AS last_error
  FROM good g FULL JOIN bad b ON b.venue_key = g.venue_key
 ORDER BY 1, 2]]

-- latest(s[, now_threshold]) -> rows {venue_key, asset, amount, captured_at,
-- age_seconds, stale, last_error}; stale is judged here, against
-- MG_BALANCE_STALE_THRESHOLD_SECONDS (or the threshold given).
function M.latest(s, threshold)
  threshold = threshold or qtg.settings.balance_stale_threshold_seconds
  local rows = s:query(M.LATEST_SQL, qtg.settings.network_class)
  for _, r in ipairs(rows) do
    if r.age_seconds == qtg.db.NULL then
      r.stale = true -- never fetched successfully
    else
      r.stale = r.age_seconds > threshold
      r.age_seconds = math.floor(r.age_seconds * 10 + 0.5) / 10
    end
  end
  return rows
end

-- fresh(s, venue_key): fetch one venue now (source 'fresh'), then latest().
function M.fresh(s, venue_key)
  local f = M.fetcher_of(venue_key)
  if not f then error("balances.fresh: no fetcher for venue " .. tostring(venue_key), 2) end
  M.snapshot(s, f, "fresh")
  return M.latest(s)
end

-- The API's fresh reads of one venue start one fetch at most every
-- FRESH_MIN_SECONDS in this process: each calls the venue with the
-- operator's credentials and appends rows, and a client looping on it
-- would spend the venue's rate limit and grow the table.
M.FRESH_MIN_SECONDS = 5
local fresh_started = {}   -- venue_key -> qtg.monotonic() of the last fetch's start

-- fetch_throttled(venue_key) -> fetched | nil: M.fetch of the venue now,
-- or nil when one started less than FRESH_MIN_SECONDS ago (the caller
-- answers the latest snapshot).  Raises for a venue without a fetcher.
function M.fetch_throttled(venue_key)
  local f = M.fetcher_of(venue_key)
  if not f then error("balances.fetch_throttled: no fetcher for venue " .. tostring(venue_key), 2) end
  local now = qtg.monotonic()
  local last = fresh_started[venue_key]
  if last and now - last < M.FRESH_MIN_SECONDS then return nil end
  fresh_started[venue_key] = now
  return M.fetch(f)
end

return M
