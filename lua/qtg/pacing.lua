-- qtg.pacing: rate limits on the calls qtg makes to providers, as each
-- executor adapter declares them (docs/pacing.md).
--
-- An adapter declares, in Lua (reloaded with the policy scripts):
--   RATE_LIMITS = {
--     submit  = { per_second = 5,  burst = 5 },    -- the dispatch pipeline
--     observe = { per_second = 20, burst = 10 },   -- node_observer
--     recover = { per_second = 2,  burst = 2 },    -- node_recovery
--     shared = true,            -- one budget for every qtgd process (the
--                               -- database holds it), not one per process
--     max_hold_seconds = 0.5,   -- longest wait a call makes in place
--   }
-- A call left out is not limited; `shared` may also be set per call.
--
-- Each limit is a GCRA bucket (a token bucket written as one timestamp):
-- calls start at most per_second a second on average, up to `burst` at once
-- after a quiet spell.  take() answers whether a call may go now: when it
-- has to wait at most max_hold_seconds it sleeps that long and says yes (the
-- slot is its own: no one else takes it meanwhile); when it would wait
-- longer it takes nothing and says how long, and the worker puts the node
-- back, due again then.  A call over the limit is never failed.
--
-- Process buckets live in this process (every lane of every worker shares
-- them; their state survives a reload).  Shared buckets are one row of
-- provider_pacing each (sql/0090_provider_pacing.sql), moved by one atomic
-- statement on a session of their own, so no node transaction ever holds a
-- bucket's row lock.
local qtg = require "qtg"

local M = {}

M.MAX_HOLD_SECONDS = 0.5   -- default longest in-place wait

-- Process state (not policy): kept in the Lua registry so a reload of this
-- module keeps the buckets' positions.
local REG_KEY = "qtg.pacing.state"
local function state()
  local reg = debug.getregistry()
  local st = reg[REG_KEY]
  if not st then
    st = { tat = {}, stats = { taken = 0, waited = 0, deferred = 0, shared = 0 } }
    reg[REG_KEY] = st
  end
  return st
end

-- $1 bucket, $2 emission interval (s), $3 tolerance (s), $4 longest wait (s).
-- A row comes back when the call may go, with the seconds it must wait.
M.TAKE_SQL = [[
INSERT INTO provider_pacing AS p (bucket, tat)
VALUES ($1, clock_timestamp() + $2::float8 * interval '1 second')
ON CONFLICT (bucket) DO UPDATE
   SET tat = greatest(p.tat, clock_timestamp()) + $2::float8 * interval '1 second',
       updated_at = clock_timestamp()
 WHERE greatest(p.tat, clock_timestamp()) - $3::float8 * interval '1 second'
       <= clock_timestamp() + $4::float8 * interval '1 second'
RETURNING greatest(0, extract(epoch FROM p.tat - ($2::float8 + $3::float8) * interval '1 second'
                                         - clock_timestamp()))::float8 AS wait]]

-- $1 bucket, $2 tolerance: seconds until the bucket lets a call go.
M.WAIT_SQL = [[
SELECT greatest(0, extract(epoch FROM greatest(tat, clock_timestamp())
                                      - $2::float8 * interval '1 second' - clock_timestamp()))::float8 AS wait
  FROM provider_pacing WHERE bucket = $1]]

local function positive(v)
  return type(v) == "number" and v > 0 and v < math.huge
end

-- check_declaration(decl) -> true | nil, reason: a RATE_LIMITS table the
-- workers can use (`qtgd check` fails an adapter whose declaration is not;
-- at run time a malformed limit is no limit).
local CALLS = { submit = true, observe = true, recover = true }
local OPTIONS = { shared = "boolean", max_hold_seconds = "number" }

function M.check_declaration(decl)
  if decl == nil or decl == false then return true end
  if type(decl) ~= "table" then return nil, "RATE_LIMITS must be a table" end
  for k, v in pairs(decl) do
    if CALLS[k] then
      if type(v) ~= "table" then return nil, ("RATE_LIMITS.%s must be a table"):format(k) end
      if not positive(v.per_second) then
        return nil, ("RATE_LIMITS.%s.per_second must be a number > 0"):format(k)
      end
      if v.burst ~= nil and not (positive(v.burst) and v.burst >= 1) then
        return nil, ("RATE_LIMITS.%s.burst must be a number >= 1"):format(k)
      end
      for opt, t in pairs(OPTIONS) do
        if v[opt] ~= nil and type(v[opt]) ~= t then
          return nil, ("RATE_LIMITS.%s.%s must be a %s"):format(k, opt, t)
        end
      end
      for f in pairs(v) do
        if f ~= "per_second" and f ~= "burst" and not OPTIONS[f] then
          return nil, ("RATE_LIMITS.%s: unknown field %s"):format(k, tostring(f))
        end
      end
    elseif OPTIONS[k] then
      if type(v) ~= OPTIONS[k] then return nil, ("RATE_LIMITS.%s must be a %s"):format(k, OPTIONS[k]) end
    else
      return nil, "RATE_LIMITS: unknown field " .. tostring(k)
    end
  end
  local hold = decl.max_hold_seconds
  if hold ~= nil and (hold < 0 or hold ~= hold) then return nil, "RATE_LIMITS.max_hold_seconds must be >= 0" end
  return true
end

-- limit_of(adapter, call) -> {interval =, tolerance =, shared =, max_hold =} or nil
function M.limit_of(adapter, call)
  local decl = type(adapter) == "table" and adapter.RATE_LIMITS
  if type(decl) ~= "table" then return nil end
  local l = decl[call]
  if type(l) ~= "table" or not positive(l.per_second) then return nil end
  local burst = positive(l.burst) and math.max(1, l.burst) or 1
  local interval = 1 / l.per_second
  local shared = l.shared
  if shared == nil then shared = decl.shared end
  local hold = l.max_hold_seconds or decl.max_hold_seconds
  if type(hold) ~= "number" or hold < 0 then hold = M.MAX_HOLD_SECONDS end
  return { interval = interval, tolerance = (burst - 1) * interval, shared = shared == true,
           max_hold = hold }
end

-- One bucket of this process: the wait, and the bucket moved if taken.
local function take_local(key, l)
  local st = state()
  local now = qtg.monotonic()
  local t = math.max(st.tat[key] or now, now)
  local wait = math.max(0, t - l.tolerance - now)
  if wait > l.max_hold then return false, wait end
  st.tat[key] = t + l.interval
  return true, wait
end

local function take_shared(key, l)
  return qtg.db.with_session(function(s)
    local row = s:query(M.TAKE_SQL, key, l.interval, l.tolerance, l.max_hold)[1]
    if row then return true, row.wait end
    row = s:query(M.WAIT_SQL, key, l.tolerance)[1]
    return false, row and row.wait or l.interval
  end)
end

-- take(executor, adapter, call) -> true (it may call now; any short wait is
-- over) | false, seconds until it may.  No limit declared: true at once.
function M.take(executor, adapter, call)
  local l = M.limit_of(adapter, call)
  if not l then return true end
  local key = tostring(executor) .. ":" .. call
  local st = state()
  local ok, wait
  if l.shared then
    st.stats.shared = st.stats.shared + 1
    ok, wait = take_shared(key, l)
  else
    ok, wait = take_local(key, l)
  end
  if not ok then
    st.stats.deferred = st.stats.deferred + 1
    return false, math.max(wait, 0.01)
  end
  st.stats.taken = st.stats.taken + 1
  if wait > 0 then
    st.stats.waited = st.stats.waited + 1
    qtg.sleep(wait)
  end
  return true
end

-- Counters since start: taken, waited (of taken), deferred, shared.
function M.stats()
  local out = {}
  for k, v in pairs(state().stats) do out[k] = v end
  return out
end

-- Forget this process's buckets (tests).
function M.reset()
  local st = state()
  st.tat = {}
  for k in pairs(st.stats) do st.stats[k] = 0 end
end

return M
