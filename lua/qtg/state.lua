-- qtg.state: the state rules of requests and nodes, as data and pure
-- functions (no I/O).  The transition tables mirror request_state_transitions
-- and node_state_transitions in sql/0001_core.sql (the database refuses any
-- other edge; spec/lua/engine/engine_lifecycle_spec.lua checks both lists are equal).
local M = {}

M.REQUEST_TRANSITIONS = {
  PENDING_APPROVAL = { "APPROVED", "REJECTED", "CANCELLED", "EXPIRED" },
  APPROVED = { "EXECUTING", "WAITING_MANUAL_ACTION", "CANCELLED" },
  EXECUTING = { "COMPLETED", "FAILED", "MANUAL_INTERVENTION", "WAITING_MANUAL_ACTION", "CANCELLED" },
  WAITING_MANUAL_ACTION = { "EXECUTING", "COMPLETED", "MANUAL_INTERVENTION", "FAILED", "CANCELLED" },
  MANUAL_INTERVENTION = { "EXECUTING", "CANCELLED" },
  FAILED = { "EXECUTING" },
  COMPLETED = {}, REJECTED = {}, CANCELLED = {}, EXPIRED = {},
}

M.NODE_TRANSITIONS = {
  BLOCKED = { "READY", "SKIPPED", "CANCELLED" },
  READY = { "SUBMITTING", "SUBMITTED", "COMPLETED", "FAILED", "UNKNOWN", "CANCELLED" },
  SUBMITTING = { "SUBMITTED", "COMPLETED", "FAILED", "UNKNOWN" },
  SUBMITTED = { "OBSERVING", "COMPLETED", "FAILED", "UNKNOWN" },
  OBSERVING = { "COMPLETED", "FAILED", "UNKNOWN" },
  UNKNOWN = { "SUBMITTED", "COMPLETED", "FAILED", "READY" },
  FAILED = { "READY" },
  COMPLETED = {}, SKIPPED = {}, CANCELLED = {},
}

local function index(lists)
  local set = {}
  for from, tos in pairs(lists) do
    set[from] = {}
    for _, to in ipairs(tos) do set[from][to] = true end
  end
  return set
end

local request_edges = index(M.REQUEST_TRANSITIONS)
local node_edges = index(M.NODE_TRANSITIONS)

function M.request_can(from, to)
  return request_edges[from] ~= nil and request_edges[from][to] == true
end

function M.node_can(from, to)
  return node_edges[from] ~= nil and node_edges[from][to] == true
end

-- Node states in which the engine itself still has work on a node.
M.IN_FLIGHT = { SUBMITTING = true, SUBMITTED = true, OBSERVING = true }
M.DONE = { COMPLETED = true, SKIPPED = true }

function M.is_manual(action_type)
  return type(action_type) == "string" and action_type:sub(1, 7) == "manual_"
end

-- A node the engine is "currently executing": in flight, UNKNOWN (its
-- request reached the provider, and node_recovery, which sweeps EXECUTING
-- requests only, is still to settle it), or READY and not a manual step
-- (the dispatcher will pick it up without an operator).
function M.is_executing(node)
  if M.IN_FLIGHT[node.node_state] or node.node_state == "UNKNOWN" then return true end
  return node.node_state == "READY" and not M.is_manual(node.action_type)
end

-- derive_request_state(nodes) -> new request state, or nil (no change).
-- The spec's rules, in order:
--   all nodes COMPLETED/SKIPPED                      -> COMPLETED
--   a FAILED/UNKNOWN node + a side-effect COMPLETED  -> MANUAL_INTERVENTION
--   a FAILED node (no side effects)                  -> FAILED
--   a READY manual_* node + no executing node        -> WAITING_MANUAL_ACTION
-- with one hold before the second and third: while a node is FAILED or
-- UNKNOWN and another is still in flight (SUBMITTING, SUBMITTED,
-- OBSERVING), or a node is FAILED and another UNKNOWN with no side-effect
-- COMPLETED, nothing changes.  Whether the request had "no side effects"
-- is not known until those nodes settle, and only an EXECUTING request's
-- nodes are observed and recovered: leaving EXECUTING would strand money
-- already sent.  No node of such a request starts meanwhile (M.stopping);
-- docs/conformance.md.
--   otherwise                                        -> nil
function M.derive_request_state(nodes)
  local all_done, failed, unknown, side_effect = true, false, false, false
  local manual_ready, executing, in_flight = false, false, false
  for _, n in ipairs(nodes) do
    local st = n.node_state
    if not M.DONE[st] then all_done = false end
    if st == "FAILED" then failed = true end
    if st == "UNKNOWN" then unknown = true end
    if M.IN_FLIGHT[st] then in_flight = true end
    if st == "COMPLETED" and n.side_effect == true then side_effect = true end
    if st == "READY" and M.is_manual(n.action_type) then manual_ready = true end
    if M.is_executing(n) then executing = true end
  end
  local troubled = failed or unknown
  if #nodes > 0 and all_done then return "COMPLETED" end
  if troubled and in_flight then return nil end
  if failed and unknown and not side_effect then return nil end
  if troubled and side_effect then return "MANUAL_INTERVENTION" end
  if failed then return "FAILED" end
  if manual_ready and not executing then return "WAITING_MANUAL_ACTION" end
  return nil
end

-- stopping(nodes) -> true when the request is bound for FAILED or
-- MANUAL_INTERVENTION once its nodes in flight settle (derive_request_state's
-- hold): a node is FAILED, or one is UNKNOWN beside a COMPLETED node with a
-- side effect.  No further node of such a request starts: not by the
-- dispatcher, not by an operator's manual step.  CANDIDATES_SQL of
-- qtg.workers.node_dispatcher asks the same in SQL.
function M.stopping(nodes)
  local failed, unknown, side_effect = false, false, false
  for _, n in ipairs(nodes) do
    local st = n.node_state
    if st == "FAILED" then failed = true end
    if st == "UNKNOWN" then unknown = true end
    if st == "COMPLETED" and n.side_effect == true then side_effect = true end
  end
  return failed or (unknown and side_effect)
end

-- The graph of one plan version as predecessor/successor key lists.
-- edges: array of {from_key=, to_key=}.
function M.graph(edges)
  local preds, succs = {}, {}
  for _, e in ipairs(edges) do
    preds[e.to_key] = preds[e.to_key] or {}
    succs[e.from_key] = succs[e.from_key] or {}
    table.insert(preds[e.to_key], e.from_key)
    table.insert(succs[e.from_key], e.to_key)
  end
  for _, list in pairs(preds) do table.sort(list) end
  for _, list in pairs(succs) do table.sort(list) end
  return { preds = preds, succs = succs }
end

-- Root nodes (no predecessors), sorted: the first frontier.
function M.roots(node_keys, graph)
  local out = {}
  for _, k in ipairs(node_keys) do
    if not graph.preds[k] then out[#out + 1] = k end
  end
  table.sort(out)
  return out
end

-- advance(nodes_by_key, graph, completed_key) -> successor_keys, ready_keys
-- The successors of the completed node, and those of them that become READY:
-- a BLOCKED successor is READY only when every direct predecessor is
-- COMPLETED or SKIPPED (a join waits for all its branches).
function M.advance(nodes_by_key, graph, completed_key)
  local successors = graph.succs[completed_key] or {}
  local ready = {}
  for _, key in ipairs(successors) do
    local node = nodes_by_key[key]
    if node and node.node_state == "BLOCKED" then
      local all = true
      for _, p in ipairs(graph.preds[key] or {}) do
        local pn = nodes_by_key[p]
        if not (pn and M.DONE[pn.node_state]) then all = false; break end
      end
      if all then ready[#ready + 1] = key end
    end
  end
  local copy = {}
  for i, k in ipairs(successors) do copy[i] = k end
  return copy, ready
end

return M
