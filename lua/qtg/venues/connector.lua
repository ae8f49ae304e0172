-- qtg.venues.connector: the adapter for venues served by the venue
-- connector service at MG_CEX_API_URL (docs/conditional-workers.md
-- section 7 has the shape):
--   GET {base}/v1/venues/{venue}/transfers?limit=N[&cursor=C]
--   200 {"transfers": [{"id", "direction", "asset", "amount", "fee",
--        "network", "address", "tx_hash", "status", "time"}...],
--        "next_cursor": "..." | null, "has_more": true|false}
-- The feed lists transfer versions in the order the venue changed them, so
-- a transfer appears again when its status changes; the cursor is opaque.
-- Anything else is refused as a whole page (nothing of it is stored and the
-- cursor does not move).
local qtg = require("qtg")
local cjson = require("cjson.safe")
local canon = require("qtg.canon_json")

local M = {}

M.PAGE_SIZE = 100
M.MAX_BODY = 4 * 1024 * 1024

local json = cjson.new()
json.decode_invalid_numbers(false)
json.decode_max_depth(32)

local DIRECTIONS = { deposit = true, withdrawal = true }
local STATUSES = { pending = true, completed = true, failed = true, cancelled = true }

local function urlencode(s)
  return (s:gsub("[^%w%-%._~]", function(c) return string.format("%%%02X", c:byte()) end))
end

local function decimal(v)
  return type(v) == "string" and #v <= 80 and (v:match("^%d+$") or v:match("^%d+%.%d+$")) and v or nil
end

local function opt_text(v, max)
  if v == nil or v == cjson.null then return nil end
  if type(v) ~= "string" or #v > (max or 200) then return false end
  return v
end

local function leap(y) return y % 4 == 0 and (y % 100 ~= 0 or y % 400 == 0) end
local MONTH_DAYS = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 }

-- utc_time(v) -> v when it is YYYY-MM-DDTHH:MM:SS[.fraction]Z naming a real
-- instant: the database casts it to timestamptz, and a string that only
-- looks like a time ("2026-13-45T99:99:99Z") would fail that cast inside
-- the venue's transaction instead of being refused here with a reason.
-- Seconds are 0-59 (no leap second: PostgreSQL would roll it over).
local function utc_time(v)
  if type(v) ~= "string" then return nil end
  local y, mo, d, h, mi, sec, frac = v:match("^(%d%d%d%d)%-(%d%d)%-(%d%d)T(%d%d):(%d%d):(%d%d)(%.?%d*)Z$")
  if not y then return nil end
  if frac ~= "" and not frac:match("^%.%d%d?%d?%d?%d?%d?%d?%d?%d?$") then return nil end
  y, mo, d, h, mi, sec = tonumber(y), tonumber(mo), tonumber(d), tonumber(h), tonumber(mi), tonumber(sec)
  if y < 1 or mo < 1 or mo > 12 or h > 23 or mi > 59 or sec > 59 then return nil end
  local days = (mo == 2 and leap(y)) and 29 or MONTH_DAYS[mo]
  if d < 1 or d > days then return nil end
  return v
end

-- normalize(t) -> transfer or nil, reason
function M.normalize(t, i)
  local where = "transfers[" .. i .. "]"
  if type(t) ~= "table" then return nil, where .. " is not an object" end
  -- the whole venue object is stored as raw jsonb: every field counts, not
  -- only the ones read here
  local ok, why = canon.storable(t, where)
  if not ok then return nil, why end
  if type(t.id) ~= "string" or t.id == "" or #t.id > 200 then return nil, where .. ".id missing" end
  if not DIRECTIONS[t.direction] then return nil, where .. ".direction is not deposit or withdrawal" end
  if type(t.asset) ~= "string" or not t.asset:match("^[%w._-]+$") or #t.asset > 32 then
    return nil, where .. ".asset invalid"
  end
  if not decimal(t.amount) then return nil, where .. ".amount is not a decimal string" end
  if t.fee ~= nil and t.fee ~= cjson.null and not decimal(t.fee) then return nil, where .. ".fee invalid" end
  if not STATUSES[t.status] then return nil, where .. ".status is not pending/completed/failed/cancelled" end
  if not utc_time(t.time) then
    return nil, where .. ".time is not a valid ISO-8601 UTC time (YYYY-MM-DDTHH:MM:SS[.fff]Z)"
  end
  local network, address, tx = opt_text(t.network), opt_text(t.address), opt_text(t.tx_hash)
  if network == false or address == false or tx == false then return nil, where .. " has an invalid text field" end
  return { id = t.id, direction = t.direction, asset = t.asset, amount = t.amount,
           fee = decimal(t.fee), network = network, address = address, tx_hash = tx,
           status = t.status, time = t.time, raw = t }
end

function M.fetch_page(venue, cursor, settings)
  local base = settings.cex_api_url
  if type(base) ~= "string" or not base:match("^https?://") then
    return nil, "MG_CEX_API_URL is not set to an http(s) URL"
  end
  local url = string.format("%s/v1/venues/%s/transfers?limit=%d", base:gsub("/+$", ""), urlencode(venue),
    M.PAGE_SIZE)
  if cursor then url = url .. "&cursor=" .. urlencode(cursor) end
  local resp, err = qtg.http.request{
    url = url, headers = { Accept = "application/json" },
    timeout = settings.provider_timeout_seconds, connect_timeout = math.min(5, settings.provider_timeout_seconds),
    max_body = M.MAX_BODY,
  }
  if not resp then return nil, string.format("%s: %s", err.kind, err.message) end
  if resp.status ~= 200 then
    return nil, string.format("HTTP %d: %s", resp.status, canon.excerpt(resp.body or "", 120))
  end
  local doc = canon.decode(resp.body or "", json)
  if type(doc) ~= "table" or type(doc.transfers) ~= "table" then
    return nil, "answer is not a transfers page: " .. canon.excerpt(resp.body or "", 120)
  end
  local next_cursor = doc.next_cursor
  if next_cursor == cjson.null then next_cursor = nil end
  if next_cursor ~= nil and (type(next_cursor) ~= "string" or #next_cursor > 1000 or not canon.text_ok(next_cursor)) then
    return nil, "next_cursor is not text (at most 1000 bytes of UTF-8, no NUL)"
  end
  local out = {}
  for i, t in ipairs(doc.transfers) do
    local n, why = M.normalize(t, i)
    if not n then return nil, "page refused: " .. why end
    out[i] = n
  end
  return { transfers = out, next_cursor = next_cursor, has_more = doc.has_more == true }
end

return M
