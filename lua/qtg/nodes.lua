-- qtg.nodes: the engine's writes on requests and nodes, shared by the
-- lifecycle (qtg.requests) and the core workers: load a request's graph,
-- change a node or a request (with its callback and audit rows), turn an
-- executor's answer into a node change (claimed, apply_answer), advance the
-- DAG after a completion and derive the request state.  Every function runs
-- inside the caller's open transaction, with the request row already locked
-- by the caller (rule: a request row is locked before any of its node rows).
local qtg = require "qtg"
local canon = require "qtg.canon_json"
local state = require "qtg.state"
local outbox = require "qtg.outbox"
local executors = require "qtg.executors"
local errors = require "qtg.errors"
local intervals = require "qtg.observe_intervals"
local affinity = require "qtg.observe_affinity"

local M = {}

local NULL = require("cjson").null

-- ------------------------------------------------------------------ loads
function M.load_request(s, id, lock)
  local sql = "SELECT * FROM movement_requests WHERE id = $1::uuid"
  if lock then sql = sql .. " FOR UPDATE" end
  return s:query(sql, id)[1]
end

-- $1: a request id.  Its nodes, sorted by node_key.
M.NODES_SQL = "SELECT * FROM movement_request_nodes WHERE request_id = $1::uuid ORDER BY node_key"

-- A claim statement notes the request it locked with note_claimed(its
-- request id expression) among its columns, in a transaction-local
-- setting; CLAIMED_NODES_SQL, the statement after it, reads that request's
-- nodes (none after a miss).  The two are sent together (s:batch: one
-- round trip), when the claim's request id is not known before it runs.
-- The note belongs in a query above the one that locks: a SELECT ... FOR
-- UPDATE computes its columns below the lock, so a row that SKIP LOCKED
-- then passes over would have been noted already.
function M.note_claimed(request_id)
  return "set_config('qtg.claimed_request', coalesce(" .. request_id .. "::text, ''), true) AS claim_noted"
end
M.CLAIMED_NODES_SQL = [[
SELECT * FROM movement_request_nodes
 WHERE request_id = nullif(current_setting('qtg.claimed_request', true), '')::uuid
 ORDER BY node_key]]

-- nodes (NODES_SQL's rows) -> nodes, a by-key and a by-id index.
local function index_nodes(nodes)
  local by, by_id = {}, {}
  for _, n in ipairs(nodes) do by[n.node_key], by_id[n.id] = n, n end
  return nodes, by, by_id
end

-- All nodes of a request, sorted by node_key, a by-key and a by-id index.
function M.load_nodes(s, request_id)
  return index_nodes(s:query(M.NODES_SQL, request_id))
end

-- A plan version never changes once committed (a new template version is a
-- new plan_versions row), so its graph is read once per process and kept
-- (one statement less per node transition).  Callers treat the graph as
-- read-only.
M.GRAPH_CACHE_MAX = 1000
local graphs = { n = 0, by_id = {} }

function M.load_graph(s, plan_version_id)
  local cached = graphs.by_id[plan_version_id]
  if cached then return cached end
  local g = M.read_graph(s, plan_version_id)
  if graphs.n >= M.GRAPH_CACHE_MAX then graphs.n, graphs.by_id = 0, {} end
  graphs.by_id[plan_version_id] = g
  graphs.n = graphs.n + 1
  return g
end

function M.read_graph(s, plan_version_id)
  local edges = s:query([[
    SELECT f.node_key AS from_key, t.node_key AS to_key
      FROM plan_edges e
      JOIN plan_nodes f ON f.id = e.from_node_id
      JOIN plan_nodes t ON t.id = e.to_node_id
     WHERE e.plan_version_id = $1
     ORDER BY 1, 2]], plan_version_id)
  return state.graph(edges)
end

-- The request, its nodes and its graph: what every decision needs.  nodes:
-- the request's nodes read already (NODES_SQL's rows), else read here.
function M.load_all(s, request, nodes)
  local by, by_id
  nodes, by, by_id = index_nodes(nodes or s:query(M.NODES_SQL, request.id))
  return { request = request, nodes = nodes, by_key = by, by_id = by_id,
           graph = M.load_graph(s, request.plan_version_id) }
end

-- claimed(s, row[, nodes]) -> g, node: what a worker's claim locked.  Every claim
-- (node_dispatcher, node_observer, node_recovery) returns one row per node:
-- movement_requests.* (the request, not read again), node_id, request_id and
-- its own columns named claim_*.  The request's nodes are read here, by a
-- statement of their own after the claim's lock, not by the claim: the
-- claim's snapshot is older than its lock, and a transaction that changed
-- sibling nodes under the request lock and committed in between would be
-- read stale (only the locked rows are brought up to date).  A statement
-- that starts after the lock sees every such commit: a later statement of
-- the claim's transaction, sent with the claim in one round trip by the
-- dispatcher and the observer (s:batch), whose rows come in as `nodes`
-- (read again here unless they are the claimed request's).
function M.claimed(s, row, nodes)
  if nodes and (nodes[1] == nil or nodes[1].request_id ~= row.request_id) then nodes = nil end
  local req = {}
  for k, v in pairs(row) do
    if k ~= "node_id" and k ~= "request_id" and k:sub(1, 6) ~= "claim_" then req[k] = v end
  end
  local g = M.load_all(s, req, nodes)
  return g, g.by_id[row.node_id]
end

-- node_name(node) -> "node <key> <id>", as errors name a node.
function M.node_name(node)
  return string.format("node %s %s", tostring(node.node_key), tostring(node.id))
end

-- ---------------------------------------------------------- node updates
-- field -> SET clause; "%d" is the parameter number.  json fields are sent
-- as canonical JSON text; `array` ones are marked as JSON arrays.
local NODE_SET = {
  node_state = { "node_state = $%d" },
  attempt_no = { "attempt_no = $%d::int" },
  idempotency_key = { "idempotency_key = $%d" },
  carried_idempotency_key = { "carried_idempotency_key = $%d" },
  side_effect = { "side_effect = $%d::boolean" },
  observe_count = { "observe_count = $%d::int" },
  unknown_observations = { "unknown_observations = $%d::int" },
  next_observe_in = { "next_observe_at = clock_timestamp() + $%d::float8 * interval '1 second'" },
  error_code = { "error_code = $%d" },
  error_detail = { "error_detail = $%d" },
  resolved_config = { "resolved_config = $%d::jsonb", json = true },
  provider_refs = { "provider_refs = $%d::jsonb", json = true },
  merge_provider_refs = { "provider_refs = provider_refs || $%d::jsonb", json = true },
  append_artifacts = { "artifacts = artifacts || $%d::jsonb", json = true, array = true },
  started_now = { "started_at = clock_timestamp()", noparam = true },
  finished_now = { "finished_at = clock_timestamp()", noparam = true },
  clear_finished = { "finished_at = NULL", noparam = true },
}

local function param(spec, v)
  if v == nil or v == NULL then return NULL end
  if spec.json then
    if spec.array then v = canon.array(canon.copy(v)) end
    return canon.encode(v)
  end
  return v
end

-- set_clauses(SET, fields, id, who, caller_level) -> the SET clauses and
-- their parameters ($1 = id), in field-name order (so the same fields give
-- the same statement text, prepared once).  SET is NODE_SET or REQUEST_SET.
local function set_clauses(SET, fields, id, who, level)
  local names = {}
  for k in pairs(fields) do
    if not SET[k] then error("nodes." .. who .. ": unknown field " .. k, level + 1) end
    names[#names + 1] = k
  end
  table.sort(names)
  local sets, args = {}, { id }
  for _, k in ipairs(names) do
    local spec = SET[k]
    if spec.noparam then
      sets[#sets + 1] = spec[1]
    else
      args[#args + 1] = param(spec, fields[k])
      sets[#sets + 1] = string.format(spec[1], #args)
    end
  end
  return sets, args
end

-- node_update_sql(node, fields, caller_level) -> the UPDATE ... RETURNING *
-- text and its parameters ($1 = node id), after the checks.
local function node_update_sql(node, fields, level)
  local to = fields.node_state
  if to and to ~= node.node_state and not state.node_can(node.node_state, to) then
    error(string.format("illegal node transition %s -> %s (node %s %s)",
      node.node_state, to, node.node_key, node.id), level + 1)
  end
  local sets, args = set_clauses(NODE_SET, fields, node.id, "update_node", level + 1)
  return "UPDATE movement_request_nodes SET " .. table.concat(sets, ", ") ..
    " WHERE id = $1::uuid RETURNING *", args
end

-- update_node(s, node, fields[, commit]): write fields (keys of NODE_SET)
-- on the node row and refresh the Lua table `node` from the returned row.  A
-- state change is checked against qtg.state first (the database checks it
-- too).  commit: the write ends its pipeline transaction (qtg.outbox.write's
-- t.commit).
function M.update_node(s, node, fields, commit)
  local sql, args = node_update_sql(node, fields, 2)
  local row
  if commit then
    row = outbox.write(s, sql, args, { commit = M.node_name(node) }, 2)
  else
    row = s:query(sql, unpack(args, 1, #args))[1]
  end
  if row == nil then error(string.format("the change of %s changed no row", M.node_name(node)), 2) end
  for k, v in pairs(row) do node[k] = v end
  return node
end

-- -------------------------------------------------------- request updates
local REQUEST_SET = {
  request_state = { "request_state = $%d" },
  current_frontier = { "current_frontier = $%d::jsonb", json = true, array = true },
  approved_by = { "approved_by = $%d" },
  approved_now = { "approved_at = clock_timestamp()", noparam = true },
  finished_now = { "finished_at = clock_timestamp()", noparam = true },
  clear_finished = { "finished_at = NULL", noparam = true },
  last_error_code = { "last_error_code = $%d" },
}

local function request_update_sql(request, fields, level)
  local to = fields.request_state
  if to and to ~= request.request_state and not state.request_can(request.request_state, to) then
    error(string.format("illegal request transition %s -> %s (request %s)",
      request.request_state, to, request.id), level + 1)
  end
  return set_clauses(REQUEST_SET, fields, request.id, "update_request", level + 1)
end

function M.update_request(s, request, fields)
  return M.write_request(s, request, fields)
end

-- write_request(s, request, fields[, cb[, audit[, also[, commit]]]]) ->
-- request, the row an `also` piece returns: the request update, its callback
-- row (cb = {event, data}, only when the request has a callback_url:
-- callback_sequence is bumped in the same UPDATE) and its audit row (audit
-- = {actor, action, detail}) in one statement (qtg.outbox.write), with
-- `also` (qtg.outbox.write's t.also) when given.  Either cb or audit may be
-- nil.  commit: the statement ends its pipeline transaction
-- (qtg.outbox.write's t.commit).
function M.write_request(s, request, fields, cb, audit, also, commit)
  local sets, args = request_update_sql(request, fields, 2)
  if cb then sets[#sets + 1] = outbox.BUMP end
  local what
  if commit then
    what = "request " .. tostring(request.id)
    for _, piece in ipairs(also or {}) do
      if piece.returns and piece.what then what = what .. " and " .. piece.what end
    end
  end
  local row = outbox.write(s,
    "UPDATE movement_requests SET " .. table.concat(sets, ", ") .. " WHERE id = $1::uuid RETURNING *",
    args, { callback = cb, audit = audit and { of = "request", actor = audit.actor, action = audit.action,
                                               detail = audit.detail }, also = also, commit = what }, 2)
  if row == nil then error(string.format("the change of request %s changed no row", tostring(request.id)), 2) end
  local returned
  for _, piece in ipairs(also or {}) do
    if piece.returns then returned, row[piece.returns] = row[piece.returns], nil end
  end
  for k, v in pairs(row) do request[k] = v end
  return request, returned
end

-- The callback event and audit action of each request state reached by
-- derivation or by a worker.
M.STATE_EVENTS = {
  EXECUTING = "request_executing",
  COMPLETED = "request_completed",
  FAILED = "request_failed",
  MANUAL_INTERVENTION = "request_attention",
  WAITING_MANUAL_ACTION = "request_attention",
}

M.TERMINAL_REQUEST = { COMPLETED = true, REJECTED = true, CANCELLED = true, EXPIRED = true }

-- States an operator must hear about: a warn line when a request or a node
-- enters one (written with the change, in its transaction).
M.WARN_REQUEST_STATES = { FAILED = true, MANUAL_INTERVENTION = true }
M.WARN_NODE_STATES = { FAILED = true, UNKNOWN = true }

-- set_request_state(s, request, to, actor, opts) -> the row opts.also
-- returns: the change, its callback and its audit row.  opts: {event =
-- (default M.STATE_EVENTS[to]), data = {}, fields = {extra REQUEST_SET
-- fields}, action = audit action, also = qtg.outbox.write's t.also, commit
-- = true: the statement ends its pipeline transaction}.
function M.set_request_state(s, request, to, actor, opts)
  opts = opts or {}
  local from = request.request_state
  local fields = {}
  for k, v in pairs(opts.fields or {}) do fields[k] = v end
  fields.request_state = to
  if M.TERMINAL_REQUEST[to] or to == "FAILED" then fields.finished_now = true end
  local data = opts.data or {}
  data.from_state = from
  local event = opts.event or M.STATE_EVENTS[to]
  local _, returned = M.write_request(s, request, fields, event and { event = event, data = data } or nil,
    { actor = actor, action = opts.action or ("request." .. to:lower()), detail = data }, opts.also, opts.commit)
  if M.WARN_REQUEST_STATES[to] and from ~= to then
    local code = request.last_error_code
    qtg.log.warn("request " .. to, { request_id = request.id, from_state = from, actor = actor,
      error_code = code ~= NULL and code or nil, request_state = to })
  end
  return returned
end

-- The warn line of a node entering a state an operator must hear about.
local function warn_node_state(g, node, from, actor)
  if M.WARN_NODE_STATES[node.node_state] and from ~= node.node_state then
    local code, detail = node.error_code, node.error_detail
    qtg.log.warn("node " .. node.node_state, { request_id = g.request.id, node_id = node.id,
      node_key = node.node_key, from_state = from, attempt_no = node.attempt_no, actor = actor,
      error_code = code ~= NULL and code or nil,
      error_detail = type(detail) == "string" and detail:sub(1, 500) or nil,
      node_state = node.node_state })
  end
end

-- set_node_state(s, g, node, fields, actor[, commit]): a node change plus
-- its audit row, in one statement (qtg.outbox.write; node changes have no
-- callback of their own: the request-level events that follow from them
-- carry the news).  The audit detail is {node_key, from_state, attempt_no[,
-- error_code]} of the row as written.  commit: the statement ends its
-- pipeline transaction (qtg.outbox.write's t.commit).
function M.set_node_state(s, g, node, fields, actor, commit)
  outbox.check_actor(actor, 2)
  local from = node.node_state
  local upd, args = node_update_sql(node, fields, 2)
  local row = outbox.write(s, upd, args, { audit = { of = "node", actor = actor, from_state = from },
                                           commit = commit and M.node_name(node) or nil }, 2)
  if row == nil then error(string.format("the change of %s changed no row", M.node_name(node)), 2) end
  for k, v in pairs(row) do node[k] = v end
  warn_node_state(g, node, from, actor)
  return node
end

-- node_change_piece(node, fields, actor, caller_level) -> the node change
-- and its audit row as set_node_state writes them, as a qtg.outbox.write
-- `also` piece: `done` returns the changed row.
local function node_change_piece(node, fields, actor, level)
  outbox.check_actor(actor, level + 1)
  local upd, args = node_update_sql(node, fields, level + 1)
  local n = #args
  args[n + 1], args[n + 2] = actor, node.node_state
  return { sql = "done AS (" .. upd .. "),\ndone_audit AS ("
             .. outbox.node_audit_sql("done", "$" .. (n + 1), "$" .. (n + 2) .. "::text") .. ")",
           values = args, returns = "done", what = M.node_name(node) }
end

-- take_back(node, row, level): the node as node_change_piece's `done`
-- returned it; a row of NULLs means the change found no row.
local function take_back(node, row, level)
  if row.id == NULL then
    error(string.format("the change of %s changed no row", M.node_name(node)), level + 1)
  end
  for k, v in pairs(row) do node[k] = v end
end

-- derived_change(g) -> the request state the nodes derive when the request
-- is not in it and can move to it, else nil: what apply_request_state
-- writes.
function M.derived_change(g)
  local to = state.derive_request_state(g.nodes)
  local from = g.request.request_state
  if not to or to == from or not state.request_can(from, to) then return nil end
  return to
end

-- apply_request_state(s, g, actor[, also[, commit]]) -> the state applied or
-- nil, the row `also` returns: derive the request state from the nodes and
-- apply it when it changes (never out of a state it cannot leave), with
-- `also` (qtg.outbox.write's t.also) in the statement; nothing is written,
-- `also` neither, when it does not change.  commit: a write ends its
-- pipeline transaction.
function M.apply_request_state(s, g, actor, also, commit)
  local to = M.derived_change(g)
  local req = g.request
  if not to then return nil end
  local data = {}
  if to == "WAITING_MANUAL_ACTION" or to == "MANUAL_INTERVENTION" then
    data.reason = to:lower()
    data.nodes = canon.array()
    for _, n in ipairs(g.nodes) do
      if (to == "WAITING_MANUAL_ACTION" and n.node_state == "READY")
        or (to == "MANUAL_INTERVENTION" and (n.node_state == "FAILED" or n.node_state == "UNKNOWN")) then
        data.nodes[#data.nodes + 1] = { node_key = n.node_key, node_state = n.node_state,
          error_code = n.error_code ~= NULL and n.error_code or nil }
      end
    end
  end
  local fields = {}
  if to == "FAILED" or to == "MANUAL_INTERVENTION" then
    for _, n in ipairs(g.nodes) do
      if (n.node_state == "FAILED" or n.node_state == "UNKNOWN") and n.error_code ~= NULL then
        fields.last_error_code = n.error_code
      end
    end
  end
  if to == "COMPLETED" then fields.current_frontier = canon.array() end
  return to, M.set_request_state(s, req, to, actor, { data = data, fields = fields, also = also,
                                                      commit = commit })
end

-- The successors a completion readies, written by the statement of its
-- frontier update (one round trip less per completion): BLOCKED -> READY
-- and an audit row each, as set_node_state writes them, the ids as one
-- uuid[] parameter so the text is the same for any count.  The database's
-- transition trigger checks each change as it does for set_node_state.
local READY_SQL = "ready AS (UPDATE movement_request_nodes SET node_state = 'READY'\n"
  .. "           WHERE id = ANY ($1::uuid[]) RETURNING *),\n"
  .. "ready_audit AS (" .. outbox.node_audit_sql("ready", "$2", "'BLOCKED'") .. " ORDER BY ready.node_key)"

-- advance_after_completion(s, g, node, actor[, piece[, commit]]) -> the
-- request state applied or nil, the row `piece` returns (nil when nothing
-- was written with it): the spec's function.  The completed node's BLOCKED
-- successors whose direct predecessors are all COMPLETED/SKIPPED become
-- READY; current_frontier becomes the successor keys and a
-- frontier_advanced callback is written.  Without successors the request
-- state is derived (full completion).  `piece` (an outbox.write `also`
-- piece: the completion itself, from M.apply) rides in the first request
-- write.  commit: the last write ends the pipeline transaction.
function M.advance_after_completion(s, g, node, actor, piece, commit)
  local successors, ready = state.advance(g.by_key, g.graph, node.node_key)
  if #successors == 0 then
    return M.apply_request_state(s, g, actor, piece and { piece }, commit)
  end
  local also = { piece }
  if #ready > 0 then
    outbox.check_actor(actor, 2)
    local ids = {}
    for i, key in ipairs(ready) do ids[i] = g.by_key[key].id end
    also[#also + 1] = { sql = READY_SQL, values = { "{" .. table.concat(ids, ",") .. "}", actor } }
  end
  local waiting = canon.array()
  local ready_set = {}
  for _, k in ipairs(ready) do ready_set[k] = true end
  for _, k in ipairs(successors) do
    if not ready_set[k] and g.by_key[k].node_state == "BLOCKED" then waiting[#waiting + 1] = k end
  end
  -- the readied rows are not read back: their state is all that is read
  -- of them in this transaction (the request's derivation below, which
  -- also tells whether the frontier write is the last)
  for _, key in ipairs(ready) do g.by_key[key].node_state = "READY" end
  local last = commit and M.derived_change(g) == nil
  local _, returned = M.write_request(s, g.request, { current_frontier = successors }, { event = "frontier_advanced",
    data = { completed = node.node_key, ready = canon.array(ready), waiting = waiting } }, nil, also, last)
  return M.apply_request_state(s, g, actor, nil, commit and not last), returned
end

-- after_node_change(s, g, node, actor[, commit]): what follows any node
-- change: a completion advances the DAG; every change re-derives the
-- request state.  commit: a last write ends the pipeline transaction.
function M.after_node_change(s, g, node, actor, commit)
  if node.node_state == "COMPLETED" then
    return M.advance_after_completion(s, g, node, actor, nil, commit)
  end
  return M.apply_request_state(s, g, actor, nil, commit)
end

-- complete(s, g, node, fields, actor): a completion, written by the
-- statement of the request write that follows from it (the frontier, or the
-- derived state): one statement less per completed node.  The node is
-- COMPLETED in `g` while that write is worked out; when no request write
-- follows (a branch ends while another runs), it is written alone.
local function complete(s, g, node, fields, actor, commit)
  local from, had_side_effect = node.node_state, node.side_effect
  local piece = node_change_piece(node, fields, actor, 3)
  -- the derivation sees the node as the write leaves it: a side effect
  -- reported with the completion (a manual step's) counts at once
  node.node_state = "COMPLETED"
  if fields.side_effect then node.side_effect = true end
  local _, row = M.advance_after_completion(s, g, node, actor, piece, commit)
  if row == nil then
    node.node_state, node.side_effect = from, had_side_effect
    return M.set_node_state(s, g, node, fields, actor, commit)
  end
  take_back(node, row, 3)
  return node
end

-- nothing_follows(g, node, to[, request_to]): no request write follows
-- node's change to `to` (with the request moved to request_to first, when
-- given), so that write is the transaction's last.  A completion advances
-- the DAG: something follows it.
local function nothing_follows(g, node, to, request_to)
  if to == "COMPLETED" then return false end
  local from, request_from = node.node_state, g.request.request_state
  node.node_state, g.request.request_state = to, request_to or request_from
  local change = M.derived_change(g)
  node.node_state, g.request.request_state = from, request_from
  return change == nil
end

-- start(s, g, node, fields, actor, first[, commit]): the request's state
-- change `first` = {to =, action =} (with its callback and audit row) and
-- the node change in one statement, the request's rows written first; then
-- what follows from the node change.  The dispatcher's APPROVED ->
-- EXECUTING with the request's first dispatch: one statement less per
-- request, and with commit, when nothing follows, that statement carries
-- the commit (its guard checks the request's change and the node's).
local function start(s, g, node, fields, actor, first, commit)
  local from = node.node_state
  local last = commit and nothing_follows(g, node, fields.node_state, first.to)
  local piece = node_change_piece(node, fields, actor, 3)
  piece.last = true
  take_back(node, M.set_request_state(s, g.request, first.to, actor,
    { action = first.action, also = { piece }, commit = last or nil }), 3)
  warn_node_state(g, node, from, actor)
  if not last then M.after_node_change(s, g, node, actor, commit) end
  return node
end

-- change(s, g, node, fields, actor, first, commit): apply's writes; with
-- commit, the last one carries the commit.
local function change(s, g, node, fields, actor, first, commit)
  local changes = fields.node_state ~= nil and fields.node_state ~= node.node_state
  if first then
    if changes then return start(s, g, node, fields, actor, first, commit) end
    M.set_request_state(s, g.request, first.to, actor, { action = first.action })
  end
  if not changes then return M.update_node(s, node, fields, commit) end
  if fields.node_state == "COMPLETED" then return complete(s, g, node, fields, actor, commit) end
  local last = commit and nothing_follows(g, node, fields.node_state)
  M.set_node_state(s, g, node, fields, actor, last)
  if not last then M.after_node_change(s, g, node, actor, commit) end
end

-- apply(s, g, node, fields, actor[, first[, commit]]) -> node: a node
-- change.  The same state: the fields are written (no state change to
-- audit); another state: the change, its audit row and what follows from it
-- (after_node_change; a completion in one statement with it).  first = {to
-- =, action =}: a request state change written before it (in one statement
-- with a node state change: start).  commit: the change ends its pipeline
-- transaction, committed on return; the last write carries the commit (one
-- round trip less) and refuses by itself to change no row (qtg.outbox.write's
-- t.commit), and a change that writes nothing after all commits alone.
function M.apply(s, g, node, fields, actor, first, commit)
  change(s, g, node, fields, actor, first, commit or nil)
  if commit then s:commit_if_open() end
  affinity.note(g.request.id, fields.node_state or node.node_state)
  return node
end

-- --------------------------------------------------------- executor answers
-- How each call's answer moves a node (docs/data-model.md has the table):
--   statuses   answer status -> node state
--   waiting    the state in which the node is observed again: next_observe_at
--              from qtg.observe_intervals (the hint retry_after_seconds, or
--              `hint` when the answer gives none, else the action's default)
--   codes      the error code of a FAILED/UNKNOWN answer that names none
--   no_answer  the state when the call raised or answered garbage (the error
--              is recorded); nil: the node stays where it is
M.ANSWERS = {
  submit = { statuses = executors.STATUSES.submit, waiting = "SUBMITTED", no_answer = "UNKNOWN",
             codes = { FAILED = "SUBMIT_REJECTED", UNKNOWN = "SUBMIT_OUTCOME_UNKNOWN" } },
  observe = { statuses = executors.STATUSES.observe, waiting = "OBSERVING", no_answer = "UNKNOWN",
              codes = { FAILED = "OBSERVED_FAILURE", UNKNOWN = "OBSERVE_OUTCOME_UNKNOWN" } },
  recover = { statuses = executors.STATUSES.recover, waiting = "SUBMITTED", hint = 0,
              codes = { FAILED = "RECOVERED_AS_FAILED", UNKNOWN = "STILL_UNKNOWN" } },
  -- an operator's manual step: the adapter's complete() found the input good
  complete = { statuses = { COMPLETED = "COMPLETED" }, codes = {} },
}

local FINAL = { COMPLETED = true, FAILED = true }

-- answer_fields(node, call, fields, answer, err) -> fields: what an
-- executor's answer to `call` writes on the node, added to `fields` (the
-- caller's own: attempt_no, observe_count...).  answer, err are what
-- qtg.executors.call returns (answer nil: err, an executors.error, says
-- why: its code and message become error_code and error_detail).
function M.answer_fields(node, call, fields, answer, err)
  local rule = M.ANSWERS[call]
  if not rule then error("nodes.answer_fields: unknown call " .. tostring(call), 2) end
  fields = fields or {}
  if not answer then
    fields.node_state = rule.no_answer or node.node_state
    if not executors.is_error(err) then
      error("nodes.answer_fields: no answer and no executor error: " .. errors.text(err), 2)
    end
    fields.error_code, fields.error_detail = err.code, err.message
    if rule.no_answer then fields.next_observe_in = NULL end
    return fields
  end
  local to = rule.statuses[answer.status]
  if not to then error("nodes.answer_fields: " .. call .. " answered status " .. tostring(answer.status), 2) end
  fields.node_state = to
  if answer.provider_refs then fields.merge_provider_refs = answer.provider_refs end
  if answer.artifacts then fields.append_artifacts = answer.artifacts end
  if answer.side_effect then fields.side_effect = true end
  if to == rule.waiting then
    local hint = answer.retry_after_seconds
    if hint == nil then hint = rule.hint end
    fields.next_observe_in = intervals.delay(node.action_type, hint)
    fields.error_code = answer.error_code or NULL
  else
    fields.next_observe_in = NULL
    fields.error_code = answer.error_code or rule.codes[to] or NULL
  end
  fields.error_detail = answer.error_detail or NULL
  if FINAL[to] then fields.finished_now = true end
  return fields
end

-- apply_answer(s, g, node, actor, call, fields, answer, err[, first[,
-- commit]]) -> node: answer_fields, then apply.
function M.apply_answer(s, g, node, actor, call, fields, answer, err, first, commit)
  return M.apply(s, g, node, M.answer_fields(node, call, fields, answer, err), actor, first, commit)
end

return M
