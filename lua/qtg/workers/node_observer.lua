-- qtg.workers.node_observer (spec section 2): observe SUBMITTED/OBSERVING
-- nodes of EXECUTING requests whose next_observe_at is due, FIFO by request
-- created_at.
--
-- Two-phase claim: an unlocked snapshot of due ids, then per id, in its own
-- transaction, a re-select FOR UPDATE OF movement_request_nodes,
-- movement_requests SKIP LOCKED as the transaction's first statement (a
-- miss ends the transaction, which releases a partial lock as the spec's
-- savepoint would), still filtered on the due predicate.  A hit keeps the node
-- and request locks through observe() and the commit; one node's slow
-- provider never holds another node's lock.
--
-- A pass and one request's nodes: the snapshot is the spec's (the first
-- MG_NODE_OBSERVE_BATCH_SIZE due nodes) widened to every due node of the
-- requests it names (so a request's due nodes are never split over passes;
-- at most MAX_PER_PASS in all), and the nodes of one request go to one lane,
-- which observes them one after another, each under its own claim of node
-- and request.  Lanes that each took a node of the same request would miss
-- on each other's request lock, and the misses would wait for later passes.
--
-- Pacing: before the call, the executor's observe limit (qtg.pacing) is
-- taken; a short wait is waited, a long one puts the node back with
-- next_observe_at moved to when the limit allows (never failed).  After an
-- OBSERVING answer the next observation is at least
-- MG_NODE_OBSERVE_MIN_INTERVAL_SECONDS away (qtg.observe_intervals).
--
-- Observe timeout (MG_OBSERVE_TIMEOUT_ENFORCEMENT_ENABLED, default off): a
-- due node older than its plan node's positive timeout_policy.observe_seconds
-- (since started_at) goes to UNKNOWN with OBSERVATION_TIMEOUT without calling
-- the executor; never FAILED.
--
-- The busy guard (qtg.busy_stops): an observation it stopped outside the
-- executor's call (whose stop qtg.executors answers: UNKNOWN), in engine or
-- policy code on this node's data (the observe intervals, the state rules
-- of the outcome's write), leaves the node as it is for this process until
-- a reload (the snapshot's $4 passes it over): writing anything about it
-- runs the same code.  The loop is held once for the node, not at every
-- pass.
--
-- Answers: OBSERVING (next_observe_at from qtg.observe_intervals; the
-- executor's retry_after_seconds wins, clamped to 600, floored as above),
-- COMPLETED (advance the DAG), FAILED, UNKNOWN; a raise or a malformed answer
-- is UNKNOWN with EXECUTOR_ERROR / EXECUTOR_BAD_RESPONSE.
local qtg = require "qtg"
local busy_stops = require "qtg.busy_stops"
local context = require "qtg.context"
local executors = require "qtg.executors"
local nodes_db = require "qtg.nodes"
local pacing = require "qtg.pacing"
local affinity = require "qtg.observe_affinity"
local wakeups = require "qtg.wakeups"

local M = {}

M.ACTOR = "system:node_observer"
M.TIMEOUT_CODE = "OBSERVATION_TIMEOUT"

M.MAX_PER_PASS = 200

-- $1: network class, $2: batch (due nodes of the spec's snapshot), $3: cap,
-- $4: the ids of nodes this process leaves alone (text[], the busy guard's).
-- `first` is the spec's snapshot: the first $2 due nodes in FIFO order of
-- their requests (each with its request); the outer select takes every due
-- node of the requests it names, in request order.  Both read a request's
-- nodes in a LATERAL subquery with a LIMIT, which the planner cannot
-- flatten into a join: it runs per request with the request's id as its
-- index key, so the snapshot walks the EXECUTING requests in their index's
-- order and reads each one's nodes by key under any plan.  As a join, a
-- generic plan made when the statistics saw no node in flight (a quiet
-- spell before a burst) joined requests to nodes by a nested loop whose
-- inner side scanned the whole in-flight index with the request id as a
-- filter: 21.8 s a pass after a burst of 3,000 requests
-- (spec/lua/engine/plans_spec.lua, "after a burst").  The due test is the
-- spec's (next_observe_at IS NULL OR <= now()) written as one range,
-- coalesce(next_observe_at, '-infinity') <= now(), which the observable
-- index keys (sql/0160): a request whose nodes are not due is passed over
-- on the index alone.  due_for: the seconds each node has been due (since
-- its last write or its next_observe_at), for qtg.observe_affinity.
M.SNAPSHOT_SQL = [[
WITH first AS MATERIALIZED (
  SELECT r.id, r.created_at
    FROM movement_requests r
   CROSS JOIN LATERAL (
     SELECT n.id
       FROM movement_request_nodes n
      WHERE n.request_id = r.id
        AND n.node_state IN ('SUBMITTED', 'OBSERVING')
        AND coalesce(n.next_observe_at, '-infinity') <= now()
        AND NOT (n.id::text = ANY ($4::text[]))
      LIMIT $2) due
   WHERE r.request_state = 'EXECUTING'
     AND r.network_class = $1
   ORDER BY r.created_at ASC
   LIMIT $2)
SELECT n.id, n.request_id, n.executor, n.due_for
  FROM (SELECT DISTINCT first.id, first.created_at FROM first) f
 CROSS JOIN LATERAL (
   SELECT n.id, n.request_id, n.executor, n.node_key,
          extract(epoch FROM now() - greatest(n.updated_at,
            coalesce(n.next_observe_at, '-infinity')))::float8 AS due_for
     FROM movement_request_nodes n
    WHERE n.request_id = f.id
      AND n.node_state IN ('SUBMITTED', 'OBSERVING')
      AND coalesce(n.next_observe_at, '-infinity') <= now()
      AND NOT (n.id::text = ANY ($4::text[]))
    ORDER BY n.node_key
    LIMIT $3) n
 ORDER BY f.created_at ASC, n.request_id, n.node_key
 LIMIT $3]]

-- $1: node id, $2: network class, $3: the node's request id (from the
-- snapshot).  The plan node's timeout policy is read by its key in a
-- subquery: joined, the generic plan hashed every plan node (a small table,
-- scanned whole) for the one row claimed.  Both rows are found by key
-- under any plan, as the dispatcher's claim finds them (qtg.workers.
-- node_dispatcher, claim_sql): the request id is the observable index's
-- key, and `(...) IS TRUE` keeps the EXECUTING index out of the request's
-- lookup.
M.CLAIM_SQL = [[
SELECT claimed.*, ]] .. nodes_db.note_claimed("claimed.request_id") .. [[

  FROM (
SELECT movement_request_nodes.id AS node_id, movement_requests.id AS request_id,
       movement_requests.*,
       (SELECT plan_nodes.timeout_policy FROM plan_nodes
         WHERE plan_nodes.id = movement_request_nodes.plan_node_id) AS claim_timeout_policy,
       extract(epoch FROM now() - movement_request_nodes.started_at)::float8 AS claim_age_seconds
  FROM movement_request_nodes
  JOIN movement_requests ON movement_requests.id = movement_request_nodes.request_id
 WHERE movement_request_nodes.id = $1::uuid
   AND movement_request_nodes.request_id = $3::uuid
   AND movement_request_nodes.node_state IN ('SUBMITTED', 'OBSERVING')
   AND (movement_requests.request_state = 'EXECUTING') IS TRUE
   AND movement_requests.network_class = $2
   AND (movement_request_nodes.next_observe_at IS NULL
        OR movement_request_nodes.next_observe_at <= now())
   FOR UPDATE OF movement_request_nodes, movement_requests SKIP LOCKED
  ) claimed]]

local NULL = qtg.db.NULL

local function timed_out(row)
  if not qtg.settings.observe_timeout_enforcement_enabled then return false end
  local tp = row.claim_timeout_policy
  local limit = type(tp) == "table" and tp.observe_seconds
  if type(limit) ~= "number" or limit <= 0 then return false end
  return type(row.claim_age_seconds) == "number" and row.claim_age_seconds > limit, limit
end

M.STOP_OBSERVATION = "observation"
M.STOPPED_LINE = "an observation was stopped by the busy guard outside the executor's call: "
  .. "its node is left as it is by this process until a reload"

-- unknown_observations(node, answer) -> the node's count of observations in
-- a row that ended UNKNOWN after this one (sql/0212): one more when the
-- observation ends UNKNOWN (no answer: a raise, garbage, no executor; or
-- an UNKNOWN status), 0 after any other answer.
function M.unknown_observations(node, answer)
  if answer == nil or answer.status == "UNKNOWN" then
    return (tonumber(node.unknown_observations) or 0) + 1
  end
  return 0
end

local function observe_node(s, g, node, row, commit)
  local over, limit = timed_out(row)
  if over then
    return nodes_db.apply(s, g, node, { node_state = "UNKNOWN", error_code = M.TIMEOUT_CODE,
      next_observe_in = NULL, error_detail = string.format("no outcome %.0f s after start (observe_seconds %s)",
        row.claim_age_seconds, tostring(limit)) }, M.ACTOR, nil, commit)
  end
  local fields = { observe_count = node.observe_count + 1 }
  local adapter, why = executors.get(node.executor)
  if not adapter then
    fields.unknown_observations = M.unknown_observations(node, nil)
    return nodes_db.apply_answer(s, g, node, M.ACTOR, "observe", fields, nil,
      executors.error(executors.NOT_REGISTERED, why), nil, commit)
  end
  local answer, err = executors.call(adapter, "observe", context.observe_context(g.request, node))
  fields.unknown_observations = M.unknown_observations(node, answer)
  return nodes_db.apply_answer(s, g, node, M.ACTOR, "observe", fields, answer, err, nil, commit)
end

-- observe_claimed(s, row[, nodes[, commit]]): the node and request are
-- locked; row is the claim's (CLAIM_SQL), nodes the request's nodes read
-- after it.  commit: the write ends the claim's pipeline transaction
-- (committed on return, its last write carrying the commit: qtg.nodes.apply).
function M.observe_claimed(s, row, nodes, commit)
  local g, node = nodes_db.claimed(s, row, nodes)
  local ok, res = busy_stops.watched(busy_stops.key(node.id, node.attempt_no, M.STOP_OBSERVATION), M.STOPPED_LINE,
    executors.CALLS, observe_node, s, g, node, row, commit)
  if not ok then error(res, 0) end
  return res
end

-- held() -> the snapshot's $4: the nodes whose observation the busy guard
-- stopped outside the executor's call
function M.held()
  return "{" .. table.concat(busy_stops.held(M.STOP_OBSERVATION), ",") .. "}"
end

-- $1 node id, $2 seconds: put a claimed node back, due when the executor's
-- limit lets it be observed.
M.DEFER_SQL = [[
UPDATE movement_request_nodes
   SET next_observe_at = clock_timestamp() + $2::float8 * interval '1 second'
 WHERE id = $1::uuid]]

-- One candidate: its own pipeline transaction on session s (no BEGIN or
-- COMMIT statement: qtg.db begin_pipeline); 1 if claimed and observed, 0
-- if claimed and put back for pacing, nil if the claim missed.
-- The claim is the transaction's first statement and a miss ends the
-- transaction, so a miss's partial lock (the node, when SKIP LOCKED then
-- rejected its request) is released at once without a savepoint: the
-- spec's miss-only savepoint, with the transaction as the savepoint.
--
-- The next claim with the commit: an observation's last write carries the
-- commit (qtg.nodes.apply), and the claim of the walk's next candidate
-- goes after it in the same flush (s:send_ahead), with that node's request
-- nodes: the server runs it as the next transaction once the commit is
-- done, so a lane's later claims cost no round trip of their own.  A claim
-- sent ahead was not paced before it: its executor's observe limit is
-- taken once it has claimed (a wait is waited with the node's locks held,
-- a long one puts the node back as before).
local function claim(s, cand, class)
  return s:query(M.CLAIM_SQL, cand.id, class, cand.request_id)[1]
end

local function claim_statements(cand, class)
  return { M.CLAIM_SQL, cand.id, class, cand.request_id }, { nodes_db.CLAIMED_NODES_SQL }
end

-- The claimed candidate (rows, nodes: its claim's answer in the open
-- transaction) observed and committed.  pace: take the observe limit now;
-- next_candidate() names the candidate whose claim goes with the commit.
local function observe_in(s, cand, class, rows, nodes, pace, next_candidate)
  local row = rows[1]
  if not row then return nil end
  local adapter = pace and executors.get(cand.executor)
  if adapter then
    local go, wait = pacing.take(cand.executor, adapter, "observe")
    if not go then
      s:query(M.DEFER_SQL, cand.id, wait)
      return 0
    end
  end
  local after = next_candidate()
  if after then s:send_ahead(claim_statements(after, class)) end
  M.observe_claimed(s, row, nodes, true)
  return 1
end

-- ahead: {rows, nodes} of cand's claim sent with the last commit (its
-- transaction open), or nil.
local function observe_one(s, cand, class, ahead, next_candidate)
  if ahead then
    return s:continue_transaction(observe_in, s, cand, class, ahead[1], ahead[2], true, next_candidate)
  end
  local adapter = executors.get(cand.executor)
  if adapter then
    local go, wait = pacing.take(cand.executor, adapter, "observe")
    if not go then
      return s:pipeline_transaction(function()
        local row = claim(s, cand, class)
        if not row then return nil end
        s:query(M.DEFER_SQL, cand.id, wait)
        return 0
      end)
    end
  end
  -- the claim and the claimed request's nodes in one round trip (s:batch):
  -- the nodes are read by the next statement, after the claim's lock; the
  -- observation's last write carries the commit
  return s:pipeline_transaction(function()
    local rows, nodes = s:batch(claim_statements(cand, class))
    return observe_in(s, cand, class, rows, nodes, false, next_candidate)
  end)
end

-- Concurrent lanes per pass: the requests of one snapshot are
-- taken by up to MAX_LANES tasks, each on its own session, so one slow
-- provider call does not hold up the batch.  A quarter of the pool at most:
-- an observe may hold its session while the executor takes another (the sim
-- does, and so does a shared pacing bucket), and the other workers need
-- theirs.
M.MAX_LANES = 4

function M.lanes(candidates)
  local pool = tonumber(qtg.settings.db_pool_size) or 8
  return math.max(1, math.min(candidates, M.MAX_LANES, math.floor(pool / 4)))
end

-- The snapshot's rows grouped by request, in order.
local function by_request(rows)
  local groups, at = {}, {}
  for _, r in ipairs(rows) do
    local g = at[r.request_id]
    if not g then
      g = {}
      at[r.request_id] = g
      groups[#groups + 1] = g
    end
    g[#g + 1] = r
  end
  return groups
end

function M.tick(s)
  local class = qtg.settings.network_class
  local rows = s:query(M.SNAPSHOT_SQL, class, qtg.settings.node_observe_batch_size or 10,
    M.MAX_PER_PASS, M.held())
  if #rows == 0 then return 0 end
  -- with several processes, requests another process has just made due
  -- are left to it for a moment (qtg.observe_affinity)
  local groups, later = affinity.select(by_request(rows))
  if later then wakeups.wake_in("node_observer", later) end
  if #groups == 0 then return 0 end
  -- Each pass walks its snapshot from a random request (wrapping round): two
  -- processes that took the same snapshot mostly claim different requests
  -- instead of missing on each other's locks, one by one.
  -- A miss means another process (or worker) holds that request, or has
  -- already observed the node since the snapshot: the rest of that
  -- request's nodes are left to it, and once this pass has observed a node,
  -- the walk ends there.  Walking on, a pass would follow the other process
  -- through the part of the snapshot it has done, one missed claim per node;
  -- ending it, the drain's next pass takes a fresh snapshot (one statement)
  -- without those nodes.  A pass that has observed nothing walks on, so a
  -- due node is never left waiting for the fallback poll by a miss.
  local r1, r2 = qtg.crypto.random_bytes(2):byte(1, 2)
  local start = (r1 * 256 + r2) % #groups
  local next_g, hits, first_err, done = 1, 0, nil, false
  local function lane(ls)
    local group, at = nil, 0
    -- the walk's next candidate: the rest of this lane's request, then the
    -- first due node of the next request no lane has taken
    local function next_candidate()
      if group and at < #group then
        at = at + 1
        return group[at]
      end
      if first_err ~= nil or done or next_g > #groups then return nil end
      group, at = groups[(start + next_g - 1) % #groups + 1], 1
      next_g = next_g + 1
      return group[1]
    end
    local sent -- the candidate whose claim went with the last commit
    local function send_next()
      sent = next_candidate()
      return sent
    end
    local cand, ahead = next_candidate(), nil
    while cand do
      sent = nil
      local ok, res = pcall(observe_one, ls, cand, class, ahead, send_next)
      if not ok then
        first_err = first_err or res
        return
      end
      ahead = nil
      if res == nil then
        affinity.missed(wakeups.wakes("node_observer"))
        done = hits > 0
        at = #group
      else
        hits = hits + res
        local rows, nodes = ls:take_ahead()
        if rows then ahead = { rows, nodes } end
      end
      cand = sent or next_candidate()
    end
  end
  local tasks = {}
  for i = 2, M.lanes(#groups) do
    tasks[i - 1] = qtg.spawn(function()
      local ls = qtg.db.acquire()
      local ok, err = pcall(lane, ls)
      ls:release()
      if not ok then error(err, 0) end
    end)
  end
  lane(s)
  for _, t in ipairs(tasks) do
    local ok, err = qtg.join(t)
    if not ok and first_err == nil then first_err = err end
  end
  if first_err ~= nil then error(first_err, 0) end
  return hits
end

return M
