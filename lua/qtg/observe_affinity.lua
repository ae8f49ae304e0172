-- qtg.observe_affinity: with several qtgd processes, each observer takes the
-- nodes its own process made due first (docs/performance.md, "Each
-- process observes what it submitted").
--
-- With wake-ups on, a transaction's wake-up goes to its own process after
-- its commit (sql/0150): the process that submitted a node wakes its
-- observer, which finds it due at once.  Every other process's observer
-- that happens to run a pass then finds it due too, and both claim it: one
-- observes, the other misses (a claim, its node load and a round trip for
-- nothing; with two processes, about one miss per node observed).
--
-- So, once this process has missed a claim (another observer is at work)
-- and while wake-ups run, a pass passes over a request whose due nodes this
-- process did not write and that have been due for less than GRACE
-- seconds: the process that wrote them was woken for them.  The pass asks
-- to be woken again when the first of them has been due GRACE seconds, and
-- takes it then if it is still due (the other process is gone or slow).
-- A node written by anything else (an operator's SQL, a tool) waits GRACE
-- at most.  No claim or order changes: the walk is the spec's snapshot
-- with some of its requests left for one pass, as the random start already
-- leaves them to the lanes of another process.
--
-- State of this process (not policy): the requests it made due (a set,
-- wiped when it reaches MAX_MINE: a forgotten one is observed after GRACE),
-- and until when it counts as contended.
local qtg = require "qtg"

local M = {}

M.GRACE = 0.5               -- seconds a fresh node is left to the process that wrote it
M.CONTENDED_SECONDS = 10    -- after a miss, how long passes leave others' fresh nodes
M.MAX_MINE = 4096

local state = { mine = {}, n = 0, contended_until = -math.huge }

-- The observed states: a write leaving a node in one makes it due (now or
-- at next_observe_at).
M.OBSERVED = { SUBMITTED = true, OBSERVING = true }

-- note(request_id, node_state): this process wrote one of the request's
-- nodes into node_state (qtg.nodes.apply).
function M.note(request_id, node_state)
  if not M.OBSERVED[node_state] or request_id == nil then return end
  if state.mine[request_id] then return end
  if state.n >= M.MAX_MINE then
    state.mine, state.n = {}, 0
  end
  state.mine[request_id] = true
  state.n = state.n + 1
end

-- missed(wakes): a claim of this process's observer missed (another
-- session holds the node or has observed it since the snapshot); wakes:
-- whether wake-ups run for the observer here.  Without them every observer
-- polls alike and nothing is left to anyone.
function M.missed(wakes)
  if wakes then
    state.contended_until = qtg.monotonic() + M.CONTENDED_SECONDS
  end
end

function M.contended()
  return qtg.monotonic() < state.contended_until
end

-- select(groups) -> the groups to walk, and the seconds until the first
-- group left out may be taken (nil if none was).  groups: the snapshot's
-- rows by request, each row with request_id and due_for (seconds it has
-- been due).  The groups walked are forgotten from the set.
function M.select(groups)
  local contended = M.contended()
  local walk, soonest = {}, nil
  for _, g in ipairs(groups) do
    local rid = g[1].request_id
    local due_for = -math.huge
    for _, row in ipairs(g) do
      if type(row.due_for) == "number" and row.due_for > due_for then due_for = row.due_for end
    end
    if not contended or state.mine[rid] or due_for >= M.GRACE then
      walk[#walk + 1] = g
      if state.mine[rid] then
        state.mine[rid] = nil
        state.n = state.n - 1
      end
    else
      local wait = math.min(math.max(M.GRACE - due_for, 0.01), M.GRACE)
      if soonest == nil or wait < soonest then soonest = wait end
    end
  end
  return walk, soonest
end

-- stats() -> the set's size and whether this process counts as contended.
function M.stats()
  return { mine = state.n, contended = M.contended() }
end

-- reset(): forget everything (specs).
function M.reset()
  state.mine, state.n, state.contended_until = {}, 0, -math.huge
end

return M
