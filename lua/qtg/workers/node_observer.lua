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
-- provider never holds another node's lock.  While passes find work, the
-- first id's claim goes in the snapshot's statement (SNAPSHOT_SQL), which
-- then opens that claim's transaction: one round trip per pass less, and
-- the snapshot still locks nothing else.
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
-- Answers: OBSERVING (next_observe_at from qtg.observe_intervals; the
-- executor's retry_after_seconds wins, clamped to 600, floored as above),
-- COMPLETED (advance the DAG), FAILED, UNKNOWN; a raise or a malformed answer
-- is UNKNOWN with EXECUTOR_ERROR / EXECUTOR_BAD_RESPONSE.
local qtg = require "qtg"
local context = require "qtg.context"
local executors = require "qtg.executors"
local nodes_db = require "qtg.nodes"
local pacing = require "qtg.pacing"

local M = {}

M.ACTOR = "system:node_observer"
M.TIMEOUT_CODE = "OBSERVATION_TIMEOUT"

M.MAX_PER_PASS = 200

-- claim_sql(id, class) -> the per-id claim (the spec's re-select FOR
-- UPDATE ... SKIP LOCKED, still filtered on the due predicate) of the node
-- whose id is the SQL expression id, in the network class `class` (a
-- parameter).  It returns the request row too (and node_id, request_id:
-- qtg.nodes.claimed).
local function claim_sql(id, class)
  return [[
SELECT movement_request_nodes.id AS node_id, movement_requests.id AS request_id,
       movement_requests.*, plan_nodes.timeout_policy AS claim_timeout_policy,
       extract(epoch FROM now() - movement_request_nodes.started_at)::float8 AS claim_age_seconds
  FROM movement_request_nodes
  JOIN movement_requests ON movement_requests.id = movement_request_nodes.request_id
  JOIN plan_nodes ON plan_nodes.id = movement_request_nodes.plan_node_id
 WHERE movement_request_nodes.id = ]] .. id .. [[

   AND movement_request_nodes.node_state IN ('SUBMITTED', 'OBSERVING')
   AND movement_requests.request_state = 'EXECUTING'
   AND movement_requests.network_class = ]] .. class .. [[

   AND (movement_request_nodes.next_observe_at IS NULL
        OR movement_request_nodes.next_observe_at <= now())
   FOR UPDATE OF movement_request_nodes, movement_requests SKIP LOCKED]]
end

-- $1: node id, $2: network class.
M.CLAIM_SQL = "SELECT claimed.*, " .. nodes_db.note_claimed("claimed.request_id")
  .. "\n  FROM (\n" .. claim_sql("$1::uuid", "$2") .. "\n  ) claimed"

-- The snapshot, and the claim of the node its walk starts at, in one
-- statement.  $1: network class, $2: batch (requests of the spec's
-- snapshot), $3: cap, $4: a random number that picks the walk's first
-- request, $5: claim its first node (boolean).  `snapshot` is the spec's
-- (the first $2 due nodes' requests) widened to every due node of the
-- requests it names, in request order, locking nothing; `start` is the
-- first node (by node_key) of request number $4 modulo their count;
-- `claimed` claims it when $5 (CLAIM_SQL's claim).
-- Each snapshot row comes back as snapshot_id, snapshot_request_id,
-- snapshot_executor and snapshot_start (the walk's first node), the start
-- row with the claimed row's columns (node_id set) on a hit.
M.SNAPSHOT_SQL = [[
WITH snapshot AS MATERIALIZED (
SELECT movement_request_nodes.id, movement_request_nodes.request_id,
       movement_request_nodes.executor, movement_request_nodes.node_key,
       movement_requests.created_at
  FROM movement_request_nodes
  JOIN movement_requests ON movement_requests.id = movement_request_nodes.request_id
 WHERE movement_request_nodes.request_id IN (
         SELECT n.request_id
           FROM movement_request_nodes n
           JOIN movement_requests r ON r.id = n.request_id
          WHERE n.node_state IN ('SUBMITTED', 'OBSERVING')
            AND r.request_state = 'EXECUTING'
            AND r.network_class = $1
            AND (n.next_observe_at IS NULL OR n.next_observe_at <= now())
          ORDER BY r.created_at ASC
          LIMIT $2)
   AND movement_request_nodes.node_state IN ('SUBMITTED', 'OBSERVING')
   AND movement_requests.request_state = 'EXECUTING'
   AND movement_requests.network_class = $1
   AND (movement_request_nodes.next_observe_at IS NULL
        OR movement_request_nodes.next_observe_at <= now())
 ORDER BY movement_requests.created_at ASC, movement_request_nodes.request_id,
          movement_request_nodes.node_key
 LIMIT $3
), grouped AS (
SELECT snapshot.*, dense_rank() OVER (ORDER BY created_at, request_id) AS group_no,
       row_number() OVER (PARTITION BY request_id ORDER BY node_key) AS in_group
  FROM snapshot
), start AS (
SELECT id FROM grouped
 WHERE in_group = 1 AND group_no = $4::int % (SELECT max(group_no) FROM grouped) + 1
), claimed AS MATERIALIZED (
]] .. claim_sql("(SELECT id FROM start WHERE $5::boolean)", "$1") .. [[

)
SELECT grouped.id AS snapshot_id, grouped.request_id AS snapshot_request_id,
       grouped.executor AS snapshot_executor,
       coalesce(grouped.id = (SELECT id FROM start), false) AS snapshot_start,
       claimed.*, ]] .. nodes_db.note_claimed("claimed.request_id", "claimed.node_id IS NOT NULL") .. [[

  FROM grouped
  LEFT JOIN claimed ON claimed.node_id = grouped.id
 ORDER BY grouped.created_at, grouped.request_id, grouped.node_key]]

local NULL = qtg.db.NULL

local function timed_out(row)
  if not qtg.settings.observe_timeout_enforcement_enabled then return false end
  local tp = row.claim_timeout_policy
  local limit = type(tp) == "table" and tp.observe_seconds
  if type(limit) ~= "number" or limit <= 0 then return false end
  return type(row.claim_age_seconds) == "number" and row.claim_age_seconds > limit, limit
end

-- observe_claimed(s, row[, nodes[, commit]]): the node and request are
-- locked; row is the claim's (CLAIM_SQL), nodes the request's nodes read
-- after it.  commit: the write ends the claim's pipeline transaction
-- (committed on return, its last write carrying the commit: qtg.nodes.apply).
function M.observe_claimed(s, row, nodes, commit)
  local g, node = nodes_db.claimed(s, row, nodes)
  local over, limit = timed_out(row)
  if over then
    return nodes_db.apply(s, g, node, { node_state = "UNKNOWN", error_code = M.TIMEOUT_CODE,
      next_observe_in = NULL, error_detail = string.format("no outcome %.0f s after start (observe_seconds %s)",
        row.claim_age_seconds, tostring(limit)) }, M.ACTOR, nil, commit)
  end
  local fields = { observe_count = node.observe_count + 1 }
  local adapter, why = executors.get(node.executor)
  if not adapter then
    return nodes_db.apply_answer(s, g, node, M.ACTOR, "observe", fields, nil,
      executors.error(executors.NOT_REGISTERED, why), nil, commit)
  end
  local answer, err = executors.call(adapter, "observe", context.observe_context(g.request, node))
  return nodes_db.apply_answer(s, g, node, M.ACTOR, "observe", fields, answer, err, nil, commit)
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
local function claim(s, id, class)
  return s:query(M.CLAIM_SQL, id, class)[1]
end

-- The claimed node (row: a claim's, nodes: its request's, locks held in
-- s's open transaction): put back when the executor's observe limit asks
-- for a long wait (0), else observed, the last write carrying the commit (1).
local function observe_held(s, row, nodes, executor)
  local adapter = executors.get(executor)
  if adapter then
    local go, wait = pacing.take(executor, adapter, "observe")
    if not go then
      s:query(M.DEFER_SQL, row.node_id, wait)
      return 0
    end
  end
  M.observe_claimed(s, row, nodes, true)
  return 1
end

local function observe_one(s, cand, class)
  local adapter = executors.get(cand.executor)
  if adapter then
    local go, wait = pacing.take(cand.executor, adapter, "observe")
    if not go then
      return s:pipeline_transaction(function()
        local row = claim(s, cand.id, class)
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
    local rows, nodes = s:batch({ M.CLAIM_SQL, cand.id, class }, { nodes_db.CLAIMED_NODES_SQL })
    if not rows[1] then return nil end
    M.observe_claimed(s, rows[1], nodes, true)
    return 1
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

-- The snapshot's rows grouped by request, in order (each node as {id,
-- request_id, executor}), the index of the walk's first group, and the
-- claimed row (the first group's first node) on a hit, as CLAIM_SQL's.
local function by_request(rows)
  local groups, at, first, claimed = {}, {}, 1, nil
  for _, r in ipairs(rows) do
    local g = at[r.snapshot_request_id]
    if not g then
      g = {}
      at[r.snapshot_request_id] = g
      groups[#groups + 1] = g
    end
    g[#g + 1] = { id = r.snapshot_id, request_id = r.snapshot_request_id, executor = r.snapshot_executor }
    if r.snapshot_start == true then first = #groups end
    if r.node_id ~= nil and r.node_id ~= NULL then claimed = r end
  end
  if claimed then
    claimed.snapshot_id, claimed.snapshot_request_id = nil, nil
    claimed.snapshot_executor, claimed.snapshot_start = nil, nil
  end
  return groups, first, claimed
end

-- The snapshot with its first claim, as its pipeline transaction's first
-- statement, and the claimed request's nodes (one round trip); the
-- transaction stays open on a hit, and is ended otherwise (a miss's
-- partial lock released, as a claim's miss is).  After a snapshot that
-- found nothing (M.busy false: an idle stretch, whose passes each stay one
-- statement and one round trip), the snapshot goes alone, claiming
-- nothing, and the walk claims its first node as it claims the others.
-- -> groups, the first group's index, the claimed row and its request's
-- nodes (nil on a miss), and whether the first node was tried.
M.busy = false

local function snapshot(s, class)
  local r1, r2 = qtg.crypto.random_bytes(2):byte(1, 2)
  local stmt = { M.SNAPSHOT_SQL, class, qtg.settings.node_observe_batch_size or 10, M.MAX_PER_PASS,
                 r1 * 256 + r2, M.busy }
  if not M.busy then
    local rows = s:query(unpack(stmt))
    M.busy = #rows > 0
    local groups, first = by_request(rows)
    return groups, first, nil, nil, false
  end
  s:begin_pipeline()
  local ok, rows, nodes = pcall(s.batch, s, stmt, { nodes_db.CLAIMED_NODES_SQL })
  if not ok then
    pcall(s.rollback, s)
    error(rows, 0)
  end
  M.busy = #rows > 0
  local groups, first, claimed = by_request(rows)
  if not claimed then s:commit() end
  return groups, first, claimed, nodes, true
end

function M.tick(s)
  local class = qtg.settings.network_class
  local groups, first, claimed, nodes, tried = snapshot(s, class)
  if #groups == 0 then return 0 end
  -- Each pass walks its snapshot from a random request (wrapping round): two
  -- processes that took the same snapshot mostly claim different requests
  -- instead of missing on each other's locks, one by one.  When the
  -- snapshot's statement tried the first request's first node, this
  -- session observes it (a hit) or leaves that request (a miss), and the
  -- walk goes on from the next request.
  -- A miss means another process (or worker) holds that request, or has
  -- already observed the node since the snapshot: the rest of that
  -- request's nodes are left to it, and once this pass has observed a node,
  -- the walk ends there.  Walking on, a pass would follow the other process
  -- through the part of the snapshot it has done, one missed claim per node;
  -- ending it, the drain's next pass takes a fresh snapshot (one statement)
  -- without those nodes.  A pass that has observed nothing walks on, so a
  -- due node is never left waiting for the fallback poll by a miss.
  local next_g, hits, first_err, done = tried and 2 or 1, 0, nil, false
  local function walk(ls, group, from)
    for i = from, #group do
      local ok, res = pcall(observe_one, ls, group[i], class)
      if not ok then first_err = first_err or res; return end
      if res == nil then
        done = hits > 0
        return
      end
      hits = hits + res
    end
  end
  local function lane(ls)
    while first_err == nil and not done and next_g <= #groups do
      local group = groups[(first + next_g - 2) % #groups + 1]
      next_g = next_g + 1
      walk(ls, group, 1)
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
  if claimed then
    local group = groups[first]
    local ok, res = pcall(s.finish_transaction, s, observe_held, s, claimed, nodes, group[1].executor)
    if ok then
      hits = hits + res
      walk(s, group, 2)
    else
      first_err = res
    end
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
