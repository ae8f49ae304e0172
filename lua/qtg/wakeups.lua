-- qtg.wakeups: NOTIFY wake-ups of idle workers (docs/performance.md).
--
-- The database says when work appears (sql/0030_wakeups.sql,
-- sql/0120_wake_once_per_transaction.sql): one channel, qtg_wake, and at
-- most one NOTIFY per transaction, whose payload is the workers it woke
-- separated by spaces, each optionally with the seconds until its work is
-- due ("node_observer:4.9 callback_dispatcher").  This module LISTENs on it
-- and, for each worker named,
--   * wakes the worker at once (qtg.runtime.wake: a sleeping worker runs now,
--     a running one runs again right after its pass), or
--   * for work due later, wakes it when it is due: one timer per worker and
--     0.1 s slot, at most MAX_TIMERS per worker (past that the worker's own
--     polling finds the work);
--   * after the listener connection was lost and re-established (fn(nil)),
--     wakes every listed worker once: NOTIFYs sent meanwhile are gone, so
--     this is the catch-up poll.
-- Once it LISTENs, this process's own transactions do not NOTIFY: their
-- wake-up comes to the same handler after their commit (sql/0150,
-- qtg.db.after_commit), so they commit without PostgreSQL's notification
-- lock and wake only this process's workers.
-- Only workers whose registry row has `wake` set (lua/qtg/workers/init.lua)
-- are woken; a token naming anything else is ignored (one raised here is
-- sent on as a NOTIFY).  Nothing here claims
-- or decides: a lost notification costs latency (the worker's fallback
-- polling still runs), never work.
--
-- Switch: MG_WAKEUPS_ENABLED (default true); qtg.main calls start() when it
-- is on.  start() is idempotent.
local qtg = require("qtg")

local M = {}

M.CHANNEL = "qtg_wake"
M.MAX_TIMERS = 64     -- pending due-time timers per worker
M.SLOT = 0.1          -- seconds: due times in the same slot share a timer

-- Workers whose wake-ups are gathered: a NOTIFY wakes them this many
-- seconds later, and every NOTIFY of the same slot shares that one wake.
-- The audit promoter is notified by every transaction that writes audit
-- rows (most of them); waking it for each would cost a pass (one
-- statement) per transaction.  Gathered, it moves up to its batch
-- (500) per pass at most 1 / SLOT times a second.  The callback dispatcher is
-- notified by every transaction that queues a callback: gathered, a pass
-- finds up to 0.1 s of them due and sends full batches (5 rows of a
-- receiver) instead of chasing each row as it commits.
M.GATHER = { audit_outbox_promoter = 0.1, callback_dispatcher = 0.1 }

-- Process state of the listener (not policy): which workers may be woken,
-- pending timers per worker and slot, counters for the console and tests.
local state = { workers = nil, timers = {}, ntimers = {}, stats = nil }

local function new_stats()
  return { notifies = 0, woken = 0, scheduled = 0, dropped = 0, ignored = 0, catchups = 0, sent_on = 0 }
end

-- The workers that take wake-ups: registry rows with `wake` set.
function M.wakeable(settings)
  local set = {}
  for _, w in ipairs(require("qtg.workers").registry(settings)) do
    if w.enabled and w.wake then set[w.name] = true end
  end
  return set
end

-- parse(token) -> worker name, delay seconds (0 = now); nil if malformed.
function M.parse(token)
  if type(token) ~= "string" then return nil end
  local name, delay = token:match("^([%a_][%w_]*):?([%d%.]*)$")
  if not name then return nil end
  if delay == "" then return name, 0 end
  delay = tonumber(delay)
  if not delay then return nil end
  return name, delay
end

-- tokens(payload) -> the payload's tokens (separated by spaces), in order.
function M.tokens(payload)
  local list = {}
  if type(payload) ~= "string" then return list end
  for token in payload:gmatch("%S+") do list[#list + 1] = token end
  return list
end

local function wake(name)
  state.stats.woken = state.stats.woken + 1
  qtg.runtime.wake(name)
end

-- Wake `name` in `delay` seconds: due times that fall in the same slot
-- share one timer.
local function schedule(name, delay)
  local due = qtg.monotonic() + delay
  local slot = math.ceil(due / M.SLOT)
  local timers = state.timers[name]
  if not timers then
    timers = {}
    state.timers[name] = timers
    state.ntimers[name] = 0
  end
  if timers[slot] then return end
  if state.ntimers[name] >= M.MAX_TIMERS then
    state.stats.dropped = state.stats.dropped + 1
    return
  end
  timers[slot] = true
  state.ntimers[name] = state.ntimers[name] + 1
  state.stats.scheduled = state.stats.scheduled + 1
  qtg.spawn(function()
    qtg.sleep(math.max(0, slot * M.SLOT - qtg.monotonic()))
    timers[slot] = nil
    state.ntimers[name] = state.ntimers[name] - 1
    wake(name)
  end)
end

-- wakes(name): whether wake-ups run in this process and wake `name`.
function M.wakes(name)
  return state.workers ~= nil and state.workers[name] == true and not state.stopped
end

-- wake_in(name, delay): wake a wakeable worker in `delay` seconds (the
-- dispatcher, when a provider's limit makes its work due later: no row
-- changes, so no NOTIFY says so).  Nothing when wake-ups are off.
function M.wake_in(name, delay)
  if not state.workers or not state.workers[name] or state.stopped then return end
  if type(delay) ~= "number" or delay <= 0 then return wake(name) end
  schedule(name, delay)
end

-- The LISTEN handler: runs in its own task per NOTIFY (the host delivers
-- identical ones that arrive together once: docs/host-api.md), and per
-- wake-up of this process's own committed transactions (here = true: once
-- start() has LISTENed, this process's sessions raise it for qtgd instead
-- of NOTIFYing, qtg.db.after_commit and sql/0150).  Those wake this
-- process's workers; the tokens of workers that do not run here are sent
-- on as one NOTIFY (qtg.db.notify) for the processes that run them.
function M.on_notify(payload, channel, here)
  local stats = state.stats
  if payload == nil then
    -- the listener came back: whatever was notified meanwhile is lost
    stats.catchups = stats.catchups + 1
    qtg.log.info("wake-up listener re-established: catch-up pass", { channel = M.CHANNEL })
    for name in pairs(state.workers) do wake(name) end
    return
  end
  stats.notifies = stats.notifies + 1
  local elsewhere = {}
  for _, token in ipairs(M.tokens(payload)) do
    local name, delay = M.parse(token)
    if not name then
      stats.ignored = stats.ignored + 1
    elseif not state.workers[name] then
      if here then elsewhere[#elsewhere + 1] = token else stats.ignored = stats.ignored + 1 end
    else
      local gather = M.GATHER[name]
      if gather and delay < gather then delay = gather end
      if delay <= 0 then
        wake(name)
      else
        schedule(name, delay)
      end
    end
  end
  if #elsewhere > 0 then
    stats.sent_on = stats.sent_on + 1
    qtg.db.notify(channel or M.CHANNEL, table.concat(elsewhere, " "))
  end
end

-- start([settings]): LISTEN and wake.  Returns the set of wakeable workers.
function M.start(settings)
  settings = settings or qtg.settings
  state.workers = M.wakeable(settings)
  if not state.stats then state.stats = new_stats() end
  if next(state.workers) == nil then return state.workers end -- nothing to wake
  qtg.db.listen(M.CHANNEL, M.on_notify)
  qtg.db.after_commit(true)
  local names = {}
  for name in pairs(state.workers) do names[#names + 1] = name end
  table.sort(names)
  qtg.log.info("wake-ups on", { channel = M.CHANNEL, workers = table.concat(names, ",") })
  return state.workers
end

-- refresh([settings]): the wakeable workers again, after a reload changed
-- the registry; LISTENs if there were none before.  Nothing when wake-ups
-- were not started in this process (or were stopped).
function M.refresh(settings)
  if state.workers == nil or state.stopped then return state.workers end
  local had = next(state.workers) ~= nil
  state.workers = M.wakeable(settings or qtg.settings)
  if not had and next(state.workers) ~= nil then
    qtg.db.listen(M.CHANNEL, M.on_notify)
    qtg.db.after_commit(true)
  end
  return state.workers
end

function M.stop()
  qtg.db.after_commit(false)
  qtg.db.unlisten(M.CHANNEL)
  state.workers = {}
  state.stopped = true
end

-- Counters since start: notifies, woken, scheduled, dropped, ignored,
-- catchups, sent_on (own wake-ups sent on to other processes).
function M.stats()
  local out = {}
  for k, v in pairs(state.stats or new_stats()) do out[k] = v end
  return out
end

return M
