-- qtg.busy_stops: what the busy guard stopped while it worked on a node,
-- remembered so that the node is not worked on the same way again.
--
-- A task that holds the loop past MG_TASK_BUSY_LIMIT_SECONDS is stopped by
-- the busy guard (src/qtg_busy.c), which raises at every instruction of the
-- task until it has ended: nothing after the stop runs, the claim rolls
-- back, and the node would be claimed again at the next pass and stopped
-- again, the loop held for the limit each time.  What is watched here is
-- one node's piece of work (an executor's call, the dispatcher's pipeline,
-- an outcome's write): a userdata whose finalizer runs when the stopped
-- task's garbage is collected (the host collects at once after a stop,
-- with qtg.busy_collecting() naming that task).  A piece of work that
-- never finished was stopped, and its key is kept; the workers ask for it
-- before working on a node (qtg.executors answers the call with its
-- error, the workers record an engine error or leave the node alone:
-- docs/operations.md, "Lua that never yields"; docs/conformance.md, 13).
--
-- A key is "node id:attempt:what".  The keys are this process's and a
-- reload forgets them (this module is reloaded), as it replaces the code an
-- operator has mended.  At most MAX are kept, the oldest dropped first.
local qtg = require "qtg"

local M = {}

M.MAX = 1000

local stopped, order, noted = {}, {}, {} -- key -> true; keys oldest first; {key, line, inner} not yet taken

function M.key(node_id, attempt_no, what)
  return string.format("%s:%s:%s", tostring(node_id), tostring(attempt_no), what)
end

local function split(key)
  return key:match("^(.-):(.-):(.-)$")
end

-- the first of whats whose key for the node and attempt is in set
local function first_of(set, node_id, attempt_no, whats)
  for _, what in ipairs(whats) do
    if set[M.key(node_id, attempt_no, what)] then return what end
  end
  return nil
end

-- from a finalizer: no yield, no raise, no I/O
local function note(key, line, inner)
  noted[#noted + 1] = { key, line, inner }
end

-- Take what the finalizers noted (all of one stop's at once: the host
-- collects in full after a stop): a piece of work whose inner piece (an
-- executor's call inside a dispatch) was stopped in the same collection
-- is that piece's stop, not its own (an inner piece stopped earlier at the
-- same attempt is answered without running: it cannot have been this
-- stop).  Each stop is logged once and counted; the oldest past MAX
-- are dropped.
local function take_notes()
  if #noted == 0 then return end
  local taken, fresh = noted, {}
  noted = {}
  for _, n in ipairs(taken) do
    if not stopped[n[1]] then fresh[n[1]] = true end
  end
  for _, n in ipairs(taken) do
    local key, line, inner = n[1], n[2], n[3]
    local node, attempt, what = split(key)
    if fresh[key] and not stopped[key] and not (inner and first_of(fresh, node, attempt, inner)) then
      stopped[key] = true
      order[#order + 1] = key
      qtg.log.error(line, { node_id = node, attempt_no = attempt, call = what })
      require("qtg.metrics").count("qtg_busy_stops_total", { what = what })
    end
  end
  while #order > M.MAX do stopped[table.remove(order, 1)] = nil end
end

-- watch(key, line[, inner]) -> a userdata and its finish(w).  Collected
-- unfinished while the host collects what the task it was made in held,
-- that task stopped by the busy guard (qtg.busy_collecting names the task;
-- an interrupt, the console's guard, a task that ended otherwise and is
-- collected later are not its stops), the work was stopped, and it is
-- blamed when it had held the loop half the limit at least in the resume
-- the guard stopped (the guard measures the whole resume, which may have
-- held the loop before the work began).  line: the error logged once for
-- it.  inner: the whats of work watched inside this one (for the same node
-- and attempt), whose stop, in the same collection, is not this one's.
-- finish(w) takes the userdata, which keeps it alive until then;
-- retarget(key, line, inner) names the work it watches from then on.
function M.watch(key, line, inner)
  local finished, started, task = false, qtg.monotonic(), qtg.task_serial()
  local w = newproxy(true)
  getmetatable(w).__gc = function()
    if finished then return end
    local stopped_task, resume_began = qtg.busy_collecting()
    if stopped_task ~= task then return end
    local limit = tonumber(qtg.settings.task_busy_limit_seconds) or 0
    if qtg.monotonic() - math.max(started, resume_began) >= limit / 2 then note(key, line, inner) end
  end
  return w, function(kept) finished = kept ~= nil end,
    function(k, l, i) key, line, inner = k, l, i end
end

local function after_finish(finish, w, ...)
  finish(w)
  return ...
end

-- watched(key, line, inner, f, ...) -> pcall(f, ...), f's work watched
-- under key (watch's line and inner)
function M.watched(key, line, inner, f, ...)
  local w, finish = M.watch(key, line, inner)
  return after_finish(finish, w, pcall(f, ...))
end

-- stopped(key) -> true when the busy guard stopped the work of key
function M.stopped(key)
  take_notes()
  return stopped[key] == true
end

-- held(what) -> the ids of the nodes whose work `what` was stopped, sorted
function M.held(what)
  take_notes()
  local out, seen = {}, {}
  for _, key in ipairs(order) do
    local node, _, w = split(key)
    if w == what and not seen[node] then
      seen[node] = true
      out[#out + 1] = node
    end
  end
  table.sort(out)
  return out
end

-- What this process does with a node whose work `what` was stopped (the
-- workers' rules above); any other what is an executor's call.
M.EFFECTS = {
  dispatch = "recorded FAILED (ENGINE_ERROR) at its next claim, nothing sent",
  dispatch_write = "left as it is by this process until a reload",
  observation = "left as it is by this process until a reload",
  recovery = "left as it is by this process until a reload",
}
M.CALL_EFFECT = "this call is answered with the busy guard's error at this attempt until a reload"

-- of(node_ids) -> { {node_id, attempt_no, what, effect}, ... }: the stops
-- kept for those nodes, oldest first (the console's req(id))
function M.of(node_ids)
  take_notes()
  local wanted = {}
  for _, id in ipairs(node_ids) do wanted[tostring(id)] = true end
  local out = {}
  for _, key in ipairs(order) do
    local node, attempt, what = split(key)
    if wanted[node] then
      out[#out + 1] = { node_id = node, attempt_no = tonumber(attempt), what = what,
                        effect = M.EFFECTS[what] or M.CALL_EFFECT }
    end
  end
  return out
end

-- keys() -> every key kept, oldest first
function M.keys()
  take_notes()
  local out = {}
  for i, k in ipairs(order) do out[i] = k end
  return out
end

return M
