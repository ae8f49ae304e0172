-- qtg.workers.node_dispatcher (spec section 1): one READY node per tick,
-- FIFO by request created_at, through preflight -> prepare -> (sign) ->
-- submit, in one transaction that holds the node and request locks from the
-- claim to the commit (no per-node commit split).
--
-- Claim: M.claim_one walks the unlocked FIFO candidates one at a time and
-- claims one by id with FOR UPDATE OF nodes, requests SKIP LOCKED, the
-- listing and the claim in one statement that opens its transaction; a miss
-- ends the transaction (so a node whose request is locked elsewhere keeps
-- no lock) and the next try excludes the tried ids.
--
-- Outcomes (docs/data-model.md has the table):
--   bad $ref                      FAILED   CONFIG_REF_UNRESOLVED
--   no such executor              FAILED   EXECUTOR_NOT_REGISTERED
--   executor not for this class   FAILED   EXECUTOR_NOT_ALLOWED (sim off dev classes)
--   preflight/prepare raise, garbage  FAILED EXECUTOR_ERROR / EXECUTOR_BAD_RESPONSE
--   preflight refuses             FAILED   PREFLIGHT_REJECTED
--   signer refuses                FAILED   SIGNING_REFUSED ("CODE: reason")
--   signer cannot be asked        held back: rolled back, node stays READY
--   the busy guard stopped it     before submit: FAILED ENGINE_ERROR at its
--                                 next claim; in the outcome's write: left
--                                 READY by this process until a reload
--   submit answers                SUBMITTED / SUBMITTING / COMPLETED / FAILED / UNKNOWN
--   submit raises or garbage      UNKNOWN  EXECUTOR_ERROR / EXECUTOR_BAD_RESPONSE
--     (it may have reached the provider: never guessed, recovery decides)
-- Pacing: once claimed, the node's executor's submit limit (qtg.pacing) is
-- taken before the pipeline starts.  A short wait is waited with the node
-- claimed; a longer one rolls the claim back (the node stays READY, nothing
-- recorded), the executor is left out of this process's candidates until
-- the limit allows, a wake-up is set for then, and the pass claims the next
-- candidate of another executor.  Nothing is failed for pacing.
-- Every submit carries context.idempotency_key(node id, attempt_no): if this
-- transaction is lost after the provider call, the node is READY again with
-- the same attempt_no and the resubmission carries the same key.  An
-- attempt that ends before its submit hands the key it would have carried
-- to the next (qtg.context.key_of): its replay of a lost dispatch may be what ended;
-- a retry of an UNKNOWN node hands on its last submit's key.
local qtg = require "qtg"
local busy_stops = require "qtg.busy_stops"
local canon = require "qtg.canon_json"
local context = require "qtg.context"
local executors = require "qtg.executors"
local nodes_db = require "qtg.nodes"
local metrics = require "qtg.metrics"
local pacing = require "qtg.pacing"
local state = require "qtg.state"

local M = {}

M.ACTOR = "system:node_dispatcher"

-- $1: ids already tried or held back (text[], given by M.claim_one: the
-- ids of the nodes held back, M.hold_back, and of those whose outcome
-- write the busy guard stopped, qtg.busy_stops), $2: network
-- class, $3: executors paced out for now (JSON array of names).
-- A request bound for FAILED or MANUAL_INTERVENTION is passed over
-- (qtg.state.stopping: a FAILED node, or an UNKNOWN one beside a completed
-- side effect): it is EXECUTING only while another of its nodes settles
-- (qtg.state.derive_request_state's hold), and starting more of its nodes
-- would move money for a request that has already failed.  sql/0200 keys
-- the test: the FAILED and UNKNOWN nodes of a request, from an index leaf;
-- the side effect beside an UNKNOWN one is a scalar subquery, read by the
-- request's key for that row only (an EXISTS there became a hashed subplan
-- over every completed side-effect node the table holds).  The test is
-- inside the LATERAL, a filter of its READY nodes below the lock: applied
-- to the request above it, the claim locked a stopping request's READY
-- node, passed the request over and kept that lock through the dispatch of
-- the node it claimed (the spec's claim path keeps no such lock).
-- FIFO by the request's created_at (the spec's order; created_at is each
-- row's clock_timestamp()), its READY nodes by node_key.  The requests are
-- walked in their index's order and each one's first READY node taken in a
-- LATERAL: no sort over the candidates, so a claim with LOCK (FOR UPDATE
-- SKIP LOCKED, which keeps a LIMIT from bounding a sort under it) reads
-- the first requests only, where a sort over all of them read at least 32
-- READY nodes a claim (an incremental sort's smallest batch).
local function candidates_sql(lock)
  return [[
SELECT n.id, r.id AS request_id
  FROM movement_requests r
 CROSS JOIN LATERAL (
   SELECT n.id
     FROM movement_request_nodes n
    WHERE n.request_id = r.id
      AND n.node_state = 'READY'
      AND n.action_type NOT LIKE 'manual\_%'
      AND NOT (n.id::text = ANY ($1::text[]))
      AND coalesce(n.executor, '') <> ALL (ARRAY(SELECT jsonb_array_elements_text($3::jsonb)))
      AND NOT EXISTS (SELECT 1 FROM movement_request_nodes t
                       WHERE t.request_id = r.id AND t.node_state IN ('FAILED', 'UNKNOWN')
                         AND (t.node_state = 'FAILED'
                              OR (SELECT true FROM movement_request_nodes p
                                   WHERE p.request_id = t.request_id AND p.node_state = 'COMPLETED' AND p.side_effect
                                   LIMIT 1) IS TRUE))
    ORDER BY n.node_key ASC
    LIMIT 1]] .. (lock and "\n      FOR UPDATE SKIP LOCKED" or "") .. [[

 ) n
 WHERE r.request_state IN ('APPROVED', 'EXECUTING')
   AND r.network_class = $2
 ORDER BY r.created_at ASC
 LIMIT 1]]
end
M.CANDIDATES_SQL = candidates_sql(false)

-- claim_sql(id, request_id) -> the per-id claim of the node whose id and
-- request id are the SQL expressions id and request_id ($1::uuid and its
-- node's request read by id, for qtg.db.claim.one; the candidate's columns
-- inside CLAIM_ONE_SQL).  It returns the request row too (and node_id,
-- request_id), so dispatch() need not read it again (qtg.nodes.claimed).
-- Both rows are found by key under any plan.  A generic plan made when
-- the statistics saw few READY nodes and few live requests (a quiet spell
-- before a burst; a large table is not analyzed again for a long while)
-- took the partial indexes for them, estimated empty: the READY index
-- filtered by `id = ...`, the dispatchable one by the request's id, each
-- a walk over every entry (read from the heap) on every claim.  The
-- request id gives the READY index its key, and the request's state is
-- tested as `(...) IS TRUE`, which the planner does not prove implies the
-- partial indexes' predicates, so they are not candidates for the request
-- (spec/lua/engine/plans_spec.lua, "after a burst").
local function claim_sql(id, request_id)
  return [[
SELECT movement_request_nodes.id AS node_id, movement_requests.id AS request_id,
       movement_request_nodes.executor AS claim_executor, movement_requests.*
  FROM movement_request_nodes
  JOIN movement_requests ON movement_requests.id = movement_request_nodes.request_id
 WHERE movement_request_nodes.id = ]] .. id .. [[

   AND movement_request_nodes.request_id = ]] .. request_id .. [[

   AND movement_request_nodes.node_state = 'READY'
   AND (movement_requests.request_state IN ('APPROVED', 'EXECUTING')) IS TRUE
   AND movement_requests.network_class = $2
   AND movement_request_nodes.executor <> ALL (ARRAY(SELECT jsonb_array_elements_text($3::jsonb)))
   FOR UPDATE OF movement_request_nodes, movement_requests SKIP LOCKED]]
end
M.CLAIM_SQL = claim_sql("$1::uuid",
  "(SELECT by_id.request_id FROM movement_request_nodes by_id WHERE by_id.id = $1::uuid)")

M.MAX_MISSES = 50

-- The listing and the per-id claim in one statement: the first FIFO
-- candidate whose node no one holds (CANDIDATES_SQL, its node row locked
-- with SKIP LOCKED, so a node another dispatcher is dispatching is passed
-- over instead of missed; a node that stopped being READY since the
-- statement's snapshot is re-checked and passed over too), then CLAIM_SQL
-- for its id, which locks the request (SKIP LOCKED: a miss).  It
-- returns candidate_id with the claimed row (node_id set) on a hit, with
-- node_id NULL on a miss, and no row when no candidate is left.  Run as its
-- transaction's first statement, so a miss is undone by ending the
-- transaction (the spec's miss-only savepoint, with the transaction as
-- the savepoint: a partial lock on the node is released) and the next
-- transaction excludes the id: one statement per dispatch, where the
-- savepoint walk took BEGIN, candidates, SAVEPOINT and the claim.
M.CLAIM_ONE_SQL = "WITH candidate AS MATERIALIZED (\n" .. candidates_sql(true) .. "\n)\n"
  .. "SELECT candidate.id AS candidate_id, claimed.*, " .. nodes_db.note_claimed("claimed.request_id") .. "\n"
  .. "  FROM candidate\n  LEFT JOIN LATERAL (\n"
  .. claim_sql("candidate.id", "candidate.request_id") .. "\n) claimed ON true"

local NULL = qtg.db.NULL

-- Plan nodes never change once committed: each is read once per process
-- (one statement less per dispatch).  Callers only read the rows
-- (context.build copies what it hands to executors).
M.PLAN_CACHE_MAX = 5000
local plans = { n = 0, by_id = {} }

-- The pipeline's savepoint is taken only before the pipeline's first
-- statement on the claim's session (reading a plan not yet cached): a
-- statement that fails there aborts the transaction, and rolling back to
-- the savepoint keeps the claim so the failure is recorded.  Executors and
-- the signer never use the claim's session, so a pipeline that runs no
-- statement on it cannot leave it aborted and needs no savepoint (one
-- statement less per dispatch).
M.SAVEPOINT = "dispatch_pipeline"

-- SQLSTATEs that say the database's moment, not the node, failed: a lock
-- or statement timeout (MG_DB_LOCK_TIMEOUT_SECONDS,
-- MG_DB_STATEMENT_TIMEOUT_SECONDS: a migration's lock on the plan tables,
-- another process's nonce reservation), a deadlock, a serialization
-- failure.  Before submit nothing was sent, so dispatch raises, its claim
-- rolls back and the node is dispatched again later (held back: M.tick),
-- rather than failing a money movement on a transient condition.  After
-- submit (the outcome's write or commit failed) the tick raises as for
-- any error: the node is dispatched again at the same attempt, with the
-- same idempotency key, which the provider deduplicates.
M.TRANSIENT_SQLSTATES = { ["55P03"] = true, ["57014"] = true, ["40P01"] = true, ["40001"] = true }

local function before_statement(s, progress)
  if not progress.savepoint then
    s:savepoint(M.SAVEPOINT)
    progress.savepoint = true
  end
end

local function plan_of(s, node, progress)
  local hit = plans.by_id[node.plan_node_id]
  if hit then return hit[1], hit[2] end
  before_statement(s, progress)
  local row = s:query([[
    SELECT pn.config, pn.timeout_policy, pn.node_kind, pn.action_type,
           pv.version, pv.risk_controls, t.template_key
      FROM plan_nodes pn
      JOIN plan_versions pv ON pv.id = pn.plan_version_id
      JOIN movement_templates t ON t.id = pv.template_id
     WHERE pn.id = $1]], node.plan_node_id)[1]
  local pv = { version = row.version, risk_controls = row.risk_controls,
               template_key = row.template_key }
  if plans.n >= M.PLAN_CACHE_MAX then plans.n, plans.by_id = 0, {} end
  plans.by_id[node.plan_node_id] = { row, pv }
  plans.n = plans.n + 1
  return row, pv
end

-- The pipeline: -> outcome {attempt_no =, idempotency_key =,
-- resolved_config =, answer =, err =} for nodes.apply_answer (answer, err
-- as qtg.executors.call returns them; a refusal before submit is a FAILED
-- answer).  `progress` tells the caller whether submit
-- was reached (for an engine error after it).
local function pipeline(s, g, node, progress)
  local plan_node, plan_version = plan_of(s, node, progress)
  local attempt_no = node.attempt_no + 1
  local function fail(code, detail)
    return { attempt_no = attempt_no, answer = { status = "FAILED", error_code = code, error_detail = detail } }
  end
  local ok, ctx = pcall(context.build, { request = g.request, node = node, plan_node = plan_node,
    plan_version = plan_version, nodes = g.nodes, pred_keys = g.graph.preds[node.node_key] })
  if not ok then
    if type(ctx) == "table" and ctx.code then return fail(ctx.code, ctx.message) end
    error(ctx, 0)
  end
  local adapter, why = executors.get(node.executor)
  if not adapter then return fail(executors.NOT_REGISTERED, why) end
  local allowed, not_here = executors.allowed(node.executor, g.request.network_class)
  if not allowed then return fail("EXECUTOR_NOT_ALLOWED", not_here) end
  -- a submit the busy guard stopped at this attempt is answered as it was
  -- (qtg.executors): nothing is prepared or signed for a call not made
  local resubmit = not executors.was_stopped(ctx, "submit")
  local pre, perr = true, nil
  if resubmit then pre, perr = executors.call(adapter, "preflight", ctx) end
  if not pre then return fail(perr.code, perr.message) end
  if resubmit and not pre.ok then
    return fail("PREFLIGHT_REJECTED", string.format("%s: %s", tostring(pre.error_code),
      tostring(pre.error_detail or "preflight refused")))
  end
  local prepared, prerr = {}, nil
  if resubmit then prepared, prerr = executors.call(adapter, "prepare", ctx) end
  if not prepared then return fail(prerr.code, prerr.message) end
  local signature
  if prepared.signer_key then
    local sreq = context.sign_request(ctx, prepared)
    local sig, err = qtg.signer.sign(prepared.signer_key, sreq)
    if not sig then
      if type(err) == "table" and err.kind == "signer_unavailable" then
        metrics.count("qtg_signer_decisions_total", { outcome = "unavailable", code = "" })
        error(err, 0)
      end
      local code = type(err) == "table" and tostring(err.code) or "SIGNER_ERROR"
      metrics.count("qtg_signer_decisions_total", { outcome = "refused", code = code })
      metrics.count("qtg_signer_refusals_total", {})
      local why = type(err) == "table" and tostring(err.message) or tostring(err)
      qtg.log.warn("signing refused", { worker = "node_dispatcher", request_id = g.request.id,
        node_id = node.id, node_key = node.node_key, attempt_no = attempt_no, code = code, reason = why })
      return fail("SIGNING_REFUSED", code .. ": " .. why)
    end
    metrics.count("qtg_signer_decisions_total", { outcome = "granted", code = "" })
    signature = sig
  end
  local key = context.key_of(node, attempt_no)
  if progress.before_submit then progress.before_submit() end
  progress.submitted = true
  progress.attempt_no, progress.key = attempt_no, key
  local answer, serr = executors.call(adapter, "submit", ctx,
    { idempotency_key = key, prepared = prepared, signature = signature })
  return { attempt_no = attempt_no, idempotency_key = key, resolved_config = ctx.node_config,
           answer = answer, err = serr }
end

-- The request's first dispatch moves it APPROVED -> EXECUTING, written
-- with the node's outcome, in one statement (qtg.nodes.apply's `first`),
-- the request's rows first.
local STARTING = { to = "EXECUTING", action = "request.executing" }

-- Write the outcome of this attempt and what follows from it (commit: and
-- commit the transaction, its last write carrying the commit).
-- An attempt that ended before its submit carries its key to the next
-- (qtg.context.key_of); one that reached it clears a carried key.
local function record(s, g, node, outcome, starting, commit)
  local fields = { attempt_no = outcome.attempt_no, started_now = true,
                   idempotency_key = outcome.idempotency_key, resolved_config = outcome.resolved_config }
  local carried = node.carried_idempotency_key
  if outcome.idempotency_key == nil then
    fields.carried_idempotency_key = context.key_of(node, outcome.attempt_no)
  elseif carried ~= nil and carried ~= NULL then
    fields.carried_idempotency_key = NULL
  end
  nodes_db.apply_answer(s, g, node, M.ACTOR, "submit", fields, outcome.answer, outcome.err,
    starting and STARTING or nil, commit)
  local code = node.error_code
  qtg.log.info("node dispatched", { worker = "node_dispatcher", request_id = g.request.id,
    node_id = node.id, node_key = node.node_key, node_state = node.node_state,
    attempt_no = node.attempt_no, error_code = code ~= NULL and code or nil })
end

-- The busy guard (qtg.busy_stops): a dispatch it stopped before submit,
-- outside an executor's call (its own answer: qtg.executors), in engine or
-- policy code on this node's data (a `$ref` resolution, the context, the
-- signing request), is recorded at the node's next claim as that code's
-- raise would be: FAILED, ENGINE_ERROR, nothing sent.  A stop in the
-- outcome's write (the state rules) leaves the node READY for this process
-- until a reload: writing anything about it runs the same code, and
-- nothing was sent, or the provider deduplicates the resubmission's key.
-- Either way the loop is held once for the node, not at every pass.
M.STOP_DISPATCH, M.STOP_WRITE = "dispatch", "dispatch_write"
M.STOPPED_DETAIL = "the dispatch held the loop past MG_TASK_BUSY_LIMIT_SECONDS and was stopped by the busy guard "
  .. "before submit (not run again at this attempt until a reload)"
M.STOPPED_LINE = "dispatch stopped by the busy guard before submit: its node is FAILED (ENGINE_ERROR) at its next claim"
M.WRITE_STOPPED_LINE = "a dispatch's outcome write was stopped by the busy guard: "
  .. "its node is left READY by this process until a reload"

-- dispatch(s, row[, nodes[, commit]]): the claimed node, locks held; row
-- is the claim's (CLAIM_SQL), nodes its request's nodes read after it.
-- commit: the outcome's write ends the claim's pipeline transaction
-- (committed on return; qtg.nodes.apply).
-- -> the node, or nil when its request is stopping (qtg.state.stopping):
-- the claim's snapshot was taken before the change that stops it committed
-- (CANDIDATES_SQL passes such a request over; its nodes, read after the
-- lock, see it), so nothing is started and the transaction ends (committed
-- when commit).
function M.dispatch(s, row, nodes, commit)
  local g, node = nodes_db.claimed(s, row, nodes)
  local req = g.request
  if state.stopping(g.nodes) then
    qtg.log.info("dispatch passed over: the request is stopping", { worker = "node_dispatcher",
      request_id = req.id, node_id = node.id, node_key = node.node_key })
    if commit then s:commit() end
    return nil
  end
  local starting = req.request_state == "APPROVED"
  local approved_at = starting and metrics.epoch(req.approved_at) or nil
  local progress = {}
  local attempt_no = node.attempt_no + 1
  local ok, outcome
  if busy_stops.stopped(busy_stops.key(node.id, attempt_no, M.STOP_DISPATCH)) then
    ok, outcome = true, { attempt_no = attempt_no, answer = { status = "FAILED", error_code = "ENGINE_ERROR",
      error_detail = M.STOPPED_DETAIL } }
  else
    -- from the submit call on, a stop is the submit's (qtg.executors
    -- answers it: UNKNOWN, for recovery), the provider may have acted:
    -- also when the call's own watch, begun late in the stopped resume,
    -- is not blamed
    local w, finish, retarget = busy_stops.watch(busy_stops.key(node.id, attempt_no, M.STOP_DISPATCH),
      M.STOPPED_LINE, executors.CALLS)
    progress.before_submit = function()
      retarget(busy_stops.key(node.id, attempt_no, "submit"), executors.STOPPED_LINE, nil)
    end
    ok, outcome = pcall(pipeline, s, g, node, progress)
    finish(w)
  end
  if not ok then
    -- An engine error (not the executor's): record it rather than loop on
    -- the node.  Past submit the provider may have acted: UNKNOWN.
    if type(outcome) == "table" and (outcome.kind == "connection" or outcome.kind == "signer_unavailable"
        or (not progress.submitted and M.TRANSIENT_SQLSTATES[outcome.sqlstate])) then
      error(outcome, 0)
    end
    if progress.savepoint then s:rollback_to(M.SAVEPOINT) end
    local detail = type(outcome) == "table" and tostring(outcome.message) or tostring(outcome)
    qtg.log.error("dispatch failed", { worker = "node_dispatcher", node_id = node.id, error = detail })
    g = nodes_db.load_all(s, req)
    node = g.by_key[node.node_key]
    outcome = { attempt_no = progress.attempt_no or (node.attempt_no + 1),
                idempotency_key = progress.key, err = executors.error("ENGINE_ERROR", detail) }
    if not progress.submitted then
      outcome.answer = { status = "FAILED", error_code = "ENGINE_ERROR", error_detail = detail }
    end
  end
  -- a savepoint taken is not released: COMMIT ends it (one round trip less).
  -- A failure of the outcome's write after submit is marked so (the
  -- provider was asked): the tick raises it rather than holding it back
  local written, werr = busy_stops.watched(busy_stops.key(node.id, outcome.attempt_no, M.STOP_WRITE),
    M.WRITE_STOPPED_LINE, nil, record, s, g, node, outcome, starting, commit)
  if not written then
    if type(werr) == "table" and progress.submitted then werr.after_submit = true end
    error(werr, 0)
  end
  -- the request's first dispatch: how long it took from its approval
  if approved_at and node.node_state == "SUBMITTED" then
    metrics.observe("qtg_approve_to_submitted_seconds", {}, math.max(0, qtg.now() - approved_at))
  end
  return node
end

-- Executors whose submit limit is spent: name -> monotonic time it allows
-- a call again (process state; a reload forgets it, which costs one more
-- rolled-back claim).
M.paced_until = {}
local paced = M.paced_until

-- The live names of a map name -> monotonic time it holds until (the
-- past ones dropped), sorted.
local function still_held(map)
  local now, out = qtg.monotonic(), {}
  for name, until_t in pairs(map) do
    if until_t > now then out[#out + 1] = name else map[name] = nil end
  end
  table.sort(out)
  return out
end

local function paced_out()
  local out = canon.array()
  for i, name in ipairs(still_held(paced)) do out[i] = name end
  return canon.encode(out)
end

-- Held back (process state): a dispatch that could not go on for a reason
-- outside its node rolls its claim back, and the pass goes on with the
-- next candidate instead of raising out of the tick, where the FIFO head
-- would be claimed again at once and every node behind it would wait
-- (a review, session 38: a signer down stopped every executor's dispatch
-- in the class).
--   the signer cannot be asked -> that executor, for a back-off that
--     doubles from HOLD_MIN to HOLD_MAX while it keeps failing (a frozen
--     signer costs the pass MG_SIGNER_TIMEOUT_SECONDS each try);
--   a transient SQLSTATE (above) -> that node, for HOLD_MIN.
-- A wake-up is set for the hold's end.  Nothing is recorded on the node:
-- it is dispatched as before once the hold ends.
M.HOLD_MIN, M.HOLD_MAX = 2, 60
M.held_nodes = {}
M.signer_backoff = {}
local held_nodes, signer_backoff = M.held_nodes, M.signer_backoff

local function hold(map, key, seconds, why, fields)
  map[key] = qtg.monotonic() + seconds
  require("qtg.wakeups").wake_in("node_dispatcher", seconds)
  fields.worker, fields.hold_seconds, fields.error = "node_dispatcher", seconds, why.message
  fields.kind, fields.sqlstate = why.kind, why.sqlstate
  qtg.log.warn("dispatch held back", fields)
end

-- hold_back(s, row, err) -> true when err is one that holds back (the
-- claim rolled back), false for any other (the caller raises it).
function M.hold_back(s, row, err)
  if type(err) ~= "table" then return false end
  local why = { message = tostring(err.message), kind = err.kind, sqlstate = err.sqlstate }
  if err.kind == "signer_unavailable" then
    pcall(s.rollback, s)
    local name = row.claim_executor
    local seconds = math.min(M.HOLD_MAX, (signer_backoff[name] or M.HOLD_MIN / 2) * 2)
    signer_backoff[name] = seconds
    hold(paced, name, seconds, why, { executor = name, node_id = row.node_id, reason = "the signer cannot be asked" })
    return true
  end
  if err.kind ~= "connection" and not err.after_submit and M.TRANSIENT_SQLSTATES[err.sqlstate] then
    pcall(s.rollback, s)
    hold(held_nodes, row.node_id, M.HOLD_MIN, why, { node_id = row.node_id, reason = "a transient database error" })
    return true
  end
  return false
end

-- claim_one(s, class[, rows, nodes]) -> the claimed row in s's open
-- transaction, or nil (no transaction open) when no candidate is left or
-- MAX_MISSES missed.  rows, nodes: the answer of a claim sent ahead with the
-- last pass's commit (M.tick), its transaction open: the first try.
-- An idle pass is this one statement: the claim finds no candidate and its
-- read-only transaction ends with the Sync (no probe first: that would be a
-- second round trip on the pass a wake-up starts, when work is there).
-- The transaction is a pipeline transaction (no BEGIN, no COMMIT
-- statement: qtg.db's begin_pipeline).  A miss ends it with its Sync alone:
-- ending the transaction releases a partial lock as a rollback would, it
-- wrote nothing else, and a commit is one statement fewer than BEGIN and
-- ROLLBACK (a skipped lock writes no WAL, so there is nothing to flush; a
-- partial lock that was taken is flushed with the commit record, which is
-- rare: the request locked and its node not).
--
-- While the dispatcher drains (its last claim found a node), the claimed
-- request's nodes are sent with the claim (qtg.nodes.CLAIMED_NODES_SQL,
-- one round trip for both) and returned as the second value; the first
-- claim after a pass that found nothing goes alone, so an idle pass stays
-- one statement.
M.draining = false

local function claim_statement(tried, class)
  local ids = still_held(held_nodes)
  for _, id in ipairs(busy_stops.held(M.STOP_WRITE)) do ids[#ids + 1] = id end
  for _, id in ipairs(tried) do ids[#ids + 1] = id end
  return { M.CLAIM_ONE_SQL, "{" .. table.concat(ids, ",") .. "}", class, paced_out() }
end

function M.claim_one(s, class, rows, nodes)
  local tried = {}
  for _ = 0, M.MAX_MISSES do
    if not rows then
      s:begin_pipeline()
      local claim = claim_statement(tried, class)
      if M.draining then rows, nodes = s:batch(claim, { nodes_db.CLAIMED_NODES_SQL }) else rows = s:query(unpack(claim)) end
    end
    local row = rows[1]
    rows = nil
    M.draining = row ~= nil
    if row and row.node_id ~= nil and row.node_id ~= NULL then
      row.candidate_id = nil -- the claimed row is CLAIM_SQL's
      return row, nodes
    end
    s:commit()
    if not row then return nil end
    tried[#tried + 1] = row.candidate_id
  end
  return nil
end

M.MAX_PACED_CLAIMS = 8   -- claims rolled back for pacing or held back in one tick, at most

-- Passes per tick, at most.  Each pass claims one node, runs it and
-- commits its outcome before the next pass's claim runs (the spec's one
-- node at a time); the next claim is sent with the commit, after its Sync
-- (s:send_ahead): the server runs it once the commit is done, and the pass
-- that takes it starts without a round trip of its own.  The last pass of
-- a tick sends none, so a tick leaves no claim behind; the runtime runs
-- the next tick at once while one finds work (the registry's drain).
-- The passes are part of draining (docs/conformance.md, difference 1):
-- without wake-ups a tick is one pass, as the spec's.  passes (M.tick's
-- second argument) overrides it: the specs tick one pass at a time.
M.PASSES_PER_TICK = 8

function M.passes(settings) return settings.wakeups_enabled and M.PASSES_PER_TICK or 1 end

function M.tick(s, passes)
  passes = passes or M.passes(qtg.settings)
  local class = qtg.settings.network_class
  local done, paced_claims = 0, 0
  local rows, nodes -- the claim sent ahead with the last pass's commit
  while done < passes and paced_claims < M.MAX_PACED_CLAIMS do
    local row, claimed_nodes = M.claim_one(s, class, rows, nodes)
    rows, nodes = nil, nil
    if not row then break end
    local name = row.claim_executor
    local adapter = executors.get(name)
    local go, wait = true, nil
    if adapter then go, wait = pacing.take(name, adapter, "submit") end
    if go then
      if done + 1 < passes then s:send_ahead(claim_statement({}, class), { nodes_db.CLAIMED_NODES_SQL }) end
      local ok, err = pcall(M.dispatch, s, row, claimed_nodes, true)
      if ok then
        done = done + 1
        signer_backoff[name] = nil
        rows, nodes = s:take_ahead()
      elseif M.hold_back(s, row, err) then
        paced_claims = paced_claims + 1
      else
        error(err, 0)
      end
    else
      s:rollback()
      paced_claims = paced_claims + 1
      paced[name] = qtg.monotonic() + wait
      require("qtg.wakeups").wake_in("node_dispatcher", wait)
      qtg.log.debug("submit paced", { worker = "node_dispatcher", executor = name, wait = wait })
    end
  end
  return done
end

return M
