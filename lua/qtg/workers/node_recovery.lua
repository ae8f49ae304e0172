-- qtg.workers.node_recovery (spec section 3): recover UNKNOWN nodes, and
-- SUBMITTING nodes idle past their lane's grace cutoff, through the
-- executor's recover(), for EXECUTING requests only.
--
-- MG_NODE_RECOVERY_BATCH_SIZE (default 10) is split over four arms in
-- priority order (CCIP, Stargate, CEX, everything else), each taking
-- max(1, batch // 4), each ordered by movement_request_nodes.updated_at ASC
-- and claimed FOR UPDATE OF nodes, requests SKIP LOCKED, one transaction per
-- arm.  A lane is the set of action types matching its LIKE patterns.  The
-- batch caps the pass's total, as the spec's warning says ("keep the batch
-- at 4 or more, or the later arms starve"): with a batch of 3 the first
-- three arms take one node each and the last gets nothing (`qtgd check`
-- warns about a batch below 4).
--
-- Pacing: the executor's recover limit (qtg.pacing) is taken before each
-- call; a short wait is waited, a longer one leaves the node as it is
-- (nothing recorded, so it stays the arm's longest idle and comes first at
-- the next pass).  A node recovery finds in flight (SUBMITTED) is observed
-- no sooner than the observe floor (MG_NODE_OBSERVE_MIN_INTERVAL_SECONDS).
--
-- recover() answers SUBMITTED (observed again at once; after two or more
-- observations in a row that ended UNKNOWN, later by their count:
-- observe_intervals.after_unknowns),
-- COMPLETED (the DAG advances), FAILED, or UNKNOWN (still unknown: an
-- UNKNOWN node stays, a SUBMITTING one becomes UNKNOWN).  A raise or
-- malformed answer leaves the node where it is with EXECUTOR_ERROR /
-- EXECUTOR_BAD_RESPONSE recorded (updated_at moves, so the arm's other
-- nodes come first next time; state_since does not, so the node's age in
-- its state, which /metrics reports, keeps growing).
--
-- The busy guard (qtg.busy_stops): a node whose observe() it stopped at
-- this attempt is not observed again by this process (qtg.executors answers
-- the call with the stop: UNKNOWN), so a recover() that finds it in flight
-- leaves it UNKNOWN, the reason recorded, instead of moving it to
-- SUBMITTED for an observation that would put it back at every pass.  A
-- recovery it stopped outside the executor's call (engine or policy code:
-- the state rules of the outcome's write) leaves the node as it is for
-- this process until a reload (the arm's $6 passes it over).
local qtg = require "qtg"
local busy_stops = require "qtg.busy_stops"
local canon = require "qtg.canon_json"
local context = require "qtg.context"
local executors = require "qtg.executors"
local intervals = require "qtg.observe_intervals"
local nodes_db = require "qtg.nodes"
local pacing = require "qtg.pacing"

local M = {}

local NULL = qtg.db.NULL

M.ACTOR = "system:node_recovery"

-- Lanes in priority order; grace_seconds: how long a SUBMITTING node may sit
-- before recovery asks the provider.  The last lane (no patterns) is
-- everything the others do not match.
M.LANES = {
  { name = "ccip", patterns = { "ccip%" }, grace_seconds = 900 },
  { name = "stargate", patterns = { "stargate%" }, grace_seconds = 600 },
  { name = "cex", patterns = { "cex%", "withdrawal" }, grace_seconds = 300 },
  { name = "other", grace_seconds = 120 },
}

-- $1 network class, $2 grace seconds, $3 patterns (JSON array), $4 limit,
-- $5 1 = the lane's patterns match, 0 = none of them matches ("other"),
-- $6 the ids of nodes this process leaves alone (text[], the busy guard's).
-- The arm walks the recoverable index in its order and reads each node's
-- request by its key.  The request's test is one opaque boolean
-- (`coalesce(...)`, which the planner rates at one in two): with its two
-- comparisons visible, statistics that saw no request executing (a quiet
-- hour, then a burst) and some UNKNOWN nodes of ended requests rated the
-- requests side at one row, and the plan read every request, probed the
-- nodes of each executing one and sorted them all at every pass.  The same
-- test keeps the EXECUTING index out of the lookup by key
-- (qtg.workers.node_dispatcher, claim_sql).
M.ARM_SQL = [[
SELECT movement_request_nodes.id AS node_id, movement_requests.id AS request_id,
       movement_requests.*
  FROM movement_request_nodes
  JOIN movement_requests ON movement_requests.id = movement_request_nodes.request_id
 WHERE (movement_request_nodes.node_state = 'UNKNOWN'
        OR (movement_request_nodes.node_state = 'SUBMITTING'
            AND movement_request_nodes.updated_at < now() - $2::float8 * interval '1 second'))
   AND coalesce(movement_requests.request_state = 'EXECUTING'
                AND movement_requests.network_class = $1, false)
   AND (movement_request_nodes.action_type LIKE ANY (ARRAY(SELECT jsonb_array_elements_text($3::jsonb))))
       = ($5::int = 1)
   AND NOT (movement_request_nodes.id::text = ANY ($6::text[]))
 ORDER BY movement_request_nodes.updated_at ASC
 LIMIT $4
   FOR UPDATE OF movement_request_nodes, movement_requests SKIP LOCKED]]

function M.arm_size(batch)
  return math.max(1, math.floor(batch / 4))
end

-- The patterns an arm tests, and whether they must match.
local function lane_filter(i)
  local lane = M.LANES[i]
  if lane.patterns then return canon.array(lane.patterns), 1 end
  local all = canon.array()
  for _, l in ipairs(M.LANES) do
    for _, p in ipairs(l.patterns or {}) do all[#all + 1] = p end
  end
  return all, 0
end

M.STOP_RECOVERY = "recovery"
M.STOPPED_LINE = "a recovery was stopped by the busy guard outside the executor's call: "
  .. "its node is left as it is by this process until a reload"
M.UNOBSERVABLE_DETAIL = "recover() found it in flight, but its observe() held the loop past "
  .. "MG_TASK_BUSY_LIMIT_SECONDS at this attempt and is not called again until a reload"

-- unknown_run_detail(node, seconds) -> the error_detail of a node recovery
-- found in flight after observations in a row ended UNKNOWN: their count,
-- the last one's error, and when it is observed again.
function M.unknown_run_detail(node, seconds)
  local last = node.error_code ~= NULL and node.error_code or "none"
  if node.error_detail ~= NULL and node.error_detail ~= nil then
    last = last .. ": " .. canon.excerpt(node.error_detail, 300)
  end
  return string.format("recover() found it in flight after its last %d observations in a row ended UNKNOWN "
    .. "(the last: %s); observed again in %.0f s, later after each one more", node.unknown_observations,
    last, seconds)
end

local function recover_node(s, g, node)
  local adapter, why = executors.get(node.executor)
  local answer, err
  if adapter then
    local go = pacing.take(node.executor, adapter, "recover")
    if not go then return node, false end
    answer, err = executors.call(adapter, "recover", context.observe_context(g.request, node))
  else
    err = executors.error(executors.NOT_REGISTERED, why)
  end
  local fields = {}
  if answer and answer.status == "SUBMITTED"
      and busy_stops.stopped(busy_stops.key(node.id, node.attempt_no, "observe")) then
    answer, err = nil, executors.error(executors.ERROR, M.UNOBSERVABLE_DETAIL)
  end
  if not answer then
    qtg.log.warn("recover failed", { worker = "node_recovery", node_id = node.id,
      error_code = err.code, error = err.message })
  elseif answer.status == "SUBMITTED" and node.error_code == "OBSERVATION_TIMEOUT" then
    -- A node the observer timed out, found still in flight: its observation
    -- window starts again.  Measured from the first started_at it would time
    -- out again at its next pass without the provider ever being asked, and
    -- an operator's resume would land back in MANUAL_INTERVENTION each time.
    fields.started_now = true
  end
  fields = nodes_db.answer_fields(node, "recover", fields, answer, err)
  local later = intervals.after_unknowns(node.action_type, node.unknown_observations)
  if fields.node_state == "SUBMITTED" and later > 0 then
    fields.next_observe_in = math.max(fields.next_observe_in, later)
    if fields.error_detail == NULL then fields.error_detail = M.unknown_run_detail(node, fields.next_observe_in) end
  end
  return nodes_db.apply(s, g, node, fields, M.ACTOR)
end

-- recover_claimed(s, row) -> node[, false when paced out]: the node and
-- request are locked; row is the claim's (ARM_SQL).
function M.recover_claimed(s, row)
  local g, node = nodes_db.claimed(s, row)
  local ok, res, recovered = busy_stops.watched(busy_stops.key(node.id, node.attempt_no, M.STOP_RECOVERY),
    M.STOPPED_LINE, executors.CALLS, recover_node, s, g, node)
  if not ok then error(res, 0) end
  return res, recovered
end

-- arm_sizes(batch) -> the number each arm may take, in arm order: each
-- max(1, batch // 4) while the batch lasts.
function M.arm_sizes(batch)
  local size, left, out = M.arm_size(batch), batch, {}
  for i = 1, #M.LANES do
    out[i] = math.min(size, left)
    left = left - out[i]
  end
  return out
end

-- One node per request per arm: a row carries its request as the claim
-- read it, and after the first node's write (the request may have moved on,
-- to MANUAL_INTERVENTION say) a second node of it would be applied against
-- that stale request and ask for a transition the database refuses, every
-- pass.  The other nodes of the request stay locked until the arm commits
-- and are recovered by a later pass, as their request then stands.
-- Each arm is its own transaction: one that fails is logged and the next
-- arms still run; the first failure is raised once they have.
function M.tick(s)
  local sizes = M.arm_sizes(qtg.settings.node_recovery_batch_size or 10)
  local total, failed = 0, nil
  local held = "{" .. table.concat(busy_stops.held(M.STOP_RECOVERY), ",") .. "}"
  for i, lane in ipairs(M.LANES) do
    if sizes[i] > 0 then
      local patterns, match = lane_filter(i)
      local ok, err = pcall(s.pipeline_transaction, s, function()
        local rows = s:query(M.ARM_SQL, qtg.settings.network_class, lane.grace_seconds,
          canon.encode(patterns), sizes[i], match, held)
        local seen = {}
        for _, row in ipairs(rows) do
          if not seen[row.request_id] then
            seen[row.request_id] = true
            local _, recovered = M.recover_claimed(s, row)
            if recovered ~= false then total = total + 1 end
          end
        end
      end)
      if not ok then
        qtg.log.error("recovery arm failed", { worker = "node_recovery", lane = lane.name,
          error = require("qtg.errors").text(err) })
        failed = failed or err
      end
    end
  end
  if failed then error(failed, 0) end
  return total
end

return M
