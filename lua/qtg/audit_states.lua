-- qtg.audit_states: every node and request against the audit trail (qtgd
-- audit verify; docs/security.md, "States against the trail").  The runtime
-- role may UPDATE node and request states without the audit row every
-- engine change writes in the same statement (qtg.outbox); this finds such
-- a change, in the state now or in a step the audited changes skip.
--   check_states(s[, limit]) -> report
local NULL = require("cjson").null

local M = {}

-- Each state change of a node or a request writes its audit row in the
-- same statement (qtg.outbox.write): a node's action is node.<state>
-- (qtg.outbox), a request's request.<state> (qtg.nodes.set_request_state)
-- or one of these, which name a request state too.  Other actions about a
-- request (request.approval: a vote short of the quorum, request.initiate,
-- request.approval_refused) and node.retry change no state and are passed
-- over.
M.REQUEST_ACTIONS = {
  ["request.create"] = "PENDING_APPROVAL",
  ["request.approve"] = "APPROVED",
  ["request.reject"] = "REJECTED",
  ["request.cancel"] = "CANCELLED",
  ["request.expire"] = "EXPIRED",
  ["request.resume"] = "EXECUTING",
}

-- What is checked, per kind of row: its table and state column, the audit
-- rows' entity_type, the actions that name a state (action, state rows;
-- $2, $3: REQUEST_ACTIONS as two arrays), the state a row has before any
-- audited change (nodes are created BLOCKED with their request, whose
-- request.create row is the only one written; a request without a row
-- naming its state is a mismatch), what its first audited change must be
-- (a node's leaves BLOCKED; a request's is its creation) and the columns
-- the report shows.
M.STATE_CHECKS = {
  { kind = "node", table = "movement_request_nodes", column = "node_state",
    entity_type = "movement_request_node", initial = "'BLOCKED'",
    first = "t.from_state = 'BLOCKED'",
    actions = "SELECT 'node.' || lower(state), state FROM node_states",
    shown = "x.request_id, x.node_key" },
  { kind = "request", table = "movement_requests", column = "request_state",
    entity_type = "movement_request", initial = "NULL::text",
    first = "t.action = 'request.create'",
    actions = "SELECT 'request.' || lower(state), state FROM request_states\n"
      .. "    UNION ALL SELECT * FROM unnest($2::text[], $3::text[])",
    shown = "x.id AS request_id, NULL::text AS node_key" },
}

-- One statement per kind, so its rows, the audit trail and the outbox rows
-- not yet promoted are read in one snapshot: a change and its outbox row
-- commit together, and a promotion moves a row from the outbox to the
-- trail in one statement, so a state is never seen without the row that
-- names it.  The rows are in the order they were written (the outbox id:
-- one sequence for both tables).  Two things are judged per entity:
--   * its state now is the one its latest state-naming row names;
--   * each such row starts where the one before it (or the entity's
--     creation) left it: its from_state is the previous row's state, and
--     the first is the creation (a request's request.create) or leaves the
--     state it was created in (a node's, BLOCKED).  So a change made
--     without its row shows even after the engine has written more rows on
--     top of it (a request set APPROVED by hand, then run by the engine).
-- The trail is read once, sorted by entity and order (one sort serves the
-- window and the DISTINCT ON): no index is needed, and none is added to
-- the promotion's inserts (docs/security.md).
local STATES_SQL = [[
WITH named(action, state) AS (
  %s
), trail AS (
  SELECT e.outbox_id AS seq, e.id AS event_id, e.entity_id, e.action, e.detail->>'from_state' AS from_state
    FROM audit_events e WHERE e.entity_type = '%s'
  UNION ALL
  SELECT o.id, NULL, o.entity_id, o.action, o.detail->>'from_state'
    FROM audit_outbox o WHERE o.entity_type = '%s'
), steps AS (
  SELECT t.entity_id, t.seq, t.event_id, t.action, t.from_state, n.state,
         lag(n.state) OVER (PARTITION BY t.entity_id ORDER BY t.seq) AS before,
         row_number() OVER (PARTITION BY t.entity_id ORDER BY t.seq) = 1 AS first_row,
         max(t.seq) OVER (PARTITION BY t.entity_id) AS last_seq
    FROM trail t JOIN named n ON n.action = t.action
), last AS (
  SELECT entity_id, seq, event_id, state FROM steps WHERE seq = last_seq
), gaps AS (
  SELECT DISTINCT ON (entity_id) entity_id, seq AS gap_seq, event_id AS gap_event, action AS gap_action,
         from_state AS gap_from, before AS gap_before
    FROM steps t
   WHERE CASE WHEN first_row THEN NOT coalesce(%s, false) ELSE from_state IS DISTINCT FROM before END
   ORDER BY entity_id, seq
), judged AS (
  SELECT x.id, %s, x.%s AS state, x.updated_at, l.state AS audited, l.event_id, l.seq AS outbox_id,
         g.gap_seq, g.gap_event, g.gap_action, g.gap_from, g.gap_before,
         (x.%s IS DISTINCT FROM coalesce(l.state, %s) OR g.entity_id IS NOT NULL) AS mismatch
    FROM %s x LEFT JOIN last l ON l.entity_id = x.id::text LEFT JOIN gaps g ON g.entity_id = x.id::text
)
SELECT c.checked, c.mismatched, b.*
  FROM (SELECT count(*) AS checked, count(*) FILTER (WHERE mismatch) AS mismatched FROM judged) c
  LEFT JOIN LATERAL (SELECT * FROM judged WHERE mismatch ORDER BY updated_at DESC, id LIMIT $1) b ON true]]

for _, c in ipairs(M.STATE_CHECKS) do
  c.sql = STATES_SQL:format(c.actions, c.entity_type, c.entity_type, c.first, c.shown, c.column, c.column,
    c.initial, c.table)
end

local function request_action_arrays()
  local names = {}
  for action in pairs(M.REQUEST_ACTIONS) do names[#names + 1] = action end
  table.sort(names)
  local states = {}
  for i, action in ipairs(names) do states[i] = M.REQUEST_ACTIONS[action] end
  return "{" .. table.concat(names, ",") .. "}", "{" .. table.concat(states, ",") .. "}"
end

local function value(v) if v == NULL then return nil end return v end

-- check_states(s[, limit]) -> {ok = bool, checked = {node = n, request =
-- n}, mismatched = {node = n, request = n}, count = n, mismatches =
-- {{kind, id, request_id, node_key, state, audited, event_id, outbox_id,
-- gap}, ...}}: every node and request whose current state is not the one
-- its latest audited state change names (audited nil: none names one), or
-- whose audited changes skip one (gap = {outbox_id, event_id, action,
-- from_state, before}: the first row that does not start where the one
-- before it left the entity, before nil: its first row is not its
-- creation), counted all, listed up to `limit` per kind (default 20), the
-- most recently updated first.  event_id is the audit_events row, or nil
-- while the row is still in audit_outbox (outbox_id).
function M.check_states(s, limit)
  limit = limit or 20
  local names, states = request_action_arrays()
  local report = { ok = true, checked = {}, mismatched = {}, count = 0, mismatches = {} }
  for _, c in ipairs(M.STATE_CHECKS) do
    local rows = c.kind == "request" and s:query(c.sql, limit, names, states) or s:query(c.sql, limit)
    local head = rows[1]
    report.checked[c.kind], report.mismatched[c.kind] = tonumber(head.checked), tonumber(head.mismatched)
    report.count = report.count + report.mismatched[c.kind]
    for _, r in ipairs(rows) do
      if r.id ~= NULL then
        report.mismatches[#report.mismatches + 1] = { kind = c.kind, id = r.id,
          request_id = r.request_id, node_key = value(r.node_key), state = r.state,
          audited = value(r.audited), event_id = value(r.event_id), outbox_id = value(r.outbox_id),
          gap = value(r.gap_seq) and { outbox_id = r.gap_seq, event_id = value(r.gap_event),
            action = r.gap_action, from_state = value(r.gap_from), before = value(r.gap_before) } or nil }
      end
    end
  end
  report.ok = report.count == 0
  return report
end

return M
