-- qtg.heartbeats: the worker_heartbeats rows of this process ("Worker
-- heartbeats" in the spec).
--
-- seed(s, workers): at start-up, one row per worker this process is expected
-- to run, for its network class (MG_NETWORK_CLASS), so the database shows
-- which workers should be alive even before their first tick.  A restarted
-- process with the same process id starts its rows afresh.  Rows of any
-- process of this class silent for PRUNE_AFTER are deleted.
-- flush(s): the liveness of every worker of qtg.runtime.workers() in ONE
-- statement (last tick, last count, consecutive errors; updated_at = now).
-- maybe_flush(s): flush unless the last flush is less than FLUSH_EVERY
-- seconds old.
-- start(), stop(): the flush task.  Under `qtgd run` (qtg.main starts it
-- after the seed) it flushes every FLUSH_EVERY seconds, so liveness is at
-- most about FLUSH_EVERY s old while the process is healthy, and a row whose
-- updated_at is older than STALE_AFTER means the process is gone or its
-- loop is stuck.  A fresh row says the process lives, not that the worker
-- works: a worker whose passes fail, that is paused or whose pass does not
-- end shows in its own columns (last_tick_at, consecutive_errors) and on
-- /metrics (qtg_worker_state, qtg_worker_consecutive_errors,
-- qtg_worker_last_pass_age_seconds).
local qtg = require("qtg")
local canon = require("qtg.canon_json")

local M = {}

M.FLUSH_EVERY = 5
M.STALE_AFTER = 60
M.PRUNE_AFTER = "7 days"

local state = { last_flush = nil, process_id = nil }

-- "<hostname>:<pid>", as the host names itself.
function M.process_id()
  if not state.process_id then state.process_id = qtg.process_id() end
  return state.process_id
end

M.SEED_SQL = [[
INSERT INTO worker_heartbeats AS h
  (network_class, worker_name, process_id, group_name, started_at, last_tick_at,
   last_count, consecutive_errors, updated_at)
SELECT $1, w.name, $2, w.group_name, clock_timestamp(), NULL, NULL, 0, clock_timestamp()
  FROM jsonb_to_recordset($3::jsonb) AS w(name text, group_name text)
ON CONFLICT (network_class, worker_name, process_id) DO UPDATE
   SET group_name = EXCLUDED.group_name, started_at = EXCLUDED.started_at,
       last_tick_at = NULL, last_count = NULL, consecutive_errors = 0,
       updated_at = EXCLUDED.updated_at]]

M.PRUNE_SQL = [[
DELETE FROM worker_heartbeats
 WHERE network_class = $1 AND process_id <> $2
   AND updated_at < now() - $3::interval]]

M.FLUSH_SQL = [[
INSERT INTO worker_heartbeats AS h
  (network_class, worker_name, process_id, group_name, last_tick_at, last_count,
   consecutive_errors, updated_at)
SELECT $1, w.name, $2, w.group_name, to_timestamp(w.last_tick_at), w.last_count,
       coalesce(w.consecutive_errors, 0), clock_timestamp()
  FROM jsonb_to_recordset($3::jsonb) AS w(name text, group_name text,
       last_tick_at double precision, last_count int, consecutive_errors int)
ON CONFLICT (network_class, worker_name, process_id) DO UPDATE
   SET group_name = EXCLUDED.group_name, last_tick_at = EXCLUDED.last_tick_at,
       last_count = EXCLUDED.last_count, consecutive_errors = EXCLUDED.consecutive_errors,
       updated_at = EXCLUDED.updated_at]]

local function check_name(name, where)
  if type(name) ~= "string" or not name:match("^[a-z][a-z0-9_]*$") then
    error(string.format("heartbeats.%s: worker name %q is not [a-z][a-z0-9_]*", where,
      tostring(name)), 3)
  end
end

-- workers: an array of {name=, group=} (the registry's entries).
function M.seed(s, workers)
  if type(workers) ~= "table" or #workers == 0 then
    error("heartbeats.seed: workers must be a non-empty array of {name=, group=}", 2)
  end
  local list = {}
  for i, w in ipairs(workers) do
    check_name(w.name, "seed")
    if w.group ~= "core" and w.group ~= "sidecar" then
      error(string.format("heartbeats.seed: worker %s has group %q, not core or sidecar",
        w.name, tostring(w.group)), 2)
    end
    list[i] = { name = w.name, group_name = w.group }
  end
  local class, pid = qtg.settings.network_class, M.process_id()
  local _, n = s:query(M.SEED_SQL, class, pid, canon.encode(list))
  s:query(M.PRUNE_SQL, class, pid, M.PRUNE_AFTER)
  return n
end

-- A unix time from the runtime's view (number or nil).
local function unix_time(v)
  if type(v) == "number" then return v end
  return nil
end

function M.flush(s)
  local list = {}
  for _, w in ipairs(qtg.runtime.workers()) do
    check_name(w.name, "flush")
    list[#list + 1] = {
      name = w.name, group_name = w.group, last_tick_at = unix_time(w.last_tick_at),
      last_count = w.last_count, consecutive_errors = w.consecutive_errors,
    }
  end
  state.last_flush = qtg.monotonic()
  if #list == 0 then return 0 end
  local _, n = s:query(M.FLUSH_SQL, qtg.settings.network_class, M.process_id(), canon.encode(list))
  return n
end

-- The heartbeat rows of a network class (default: this process's), each
-- with `alive`: written by its process within the last STALE_AFTER seconds.
function M.liveness(s, network_class)
  return s:query([[
    SELECT *, updated_at > now() - make_interval(secs => $2) AS alive
      FROM worker_heartbeats WHERE network_class = $1
     ORDER BY worker_name, process_id]], network_class or qtg.settings.network_class, M.STALE_AFTER)
end

-- Flush when the last flush is FLUSH_EVERY seconds old or more; returns the
-- rows written, or 0 when it was not yet time.
function M.maybe_flush(s)
  if state.last_flush and qtg.monotonic() - state.last_flush < M.FLUSH_EVERY then
    return 0
  end
  return M.flush(s)
end

-- start(): the flush task (once per process until stop(); under `qtgd run`
-- it ends with the process).  A flush that fails (the database is away) is
-- logged and tried again at the next turn.
function M.start()
  if state.task then return state.task end
  state.stop = false
  state.task = qtg.spawn(function()
    while not state.stop and not qtg.runtime.stopping() do
      local ok, err = pcall(qtg.db.with_session, M.maybe_flush)
      if not ok then qtg.log.warn("cannot flush worker heartbeats: " .. tostring(err)) end
      local since = qtg.monotonic() - (state.last_flush or 0)
      qtg.sleep(math.max(0.1, M.FLUSH_EVERY - since))
    end
    state.task = nil
  end)
  return state.task
end

-- stop(): the flush task ends at its next turn.
function M.stop()
  state.stop = true
end

return M
