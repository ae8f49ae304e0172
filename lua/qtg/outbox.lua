-- qtg.outbox: the two outboxes every state change writes in its own
-- transaction: the request's callback (movement_callback_outbox, delivered by
-- the callback_dispatcher) and the audit record (audit_outbox, promoted into
-- audit_events by the audit_outbox_promoter).
--
-- Callbacks: a request without a callback_url gets no callback rows (there
-- is nowhere to deliver them; its history is in the audit trail).  Each row's
-- payload is the exact JSON body that will be POSTed and signed:
--   {"event_type", "request_id", "request_state", "current_frontier",
--    "occurred_at", "sequence", "data"}
-- request_state and current_frontier are read from the row as the current
-- transaction left it; sequence is the request's callback_sequence, bumped
-- under the request's row lock, so a request's callbacks are numbered 1, 2, 3
-- in the order their transactions committed.
local canon = require "qtg.canon_json"

local M = {}

-- Event types, for documentation and for checks in callers.
M.EVENTS = {
  request_created = true, request_approved = true, request_rejected = true,
  request_cancelled = true, request_expired = true, request_executing = true,
  frontier_advanced = true, request_attention = true, request_completed = true,
  request_failed = true, request_resumed = true, node_retried = true,
  manual_step_completed = true,
}

-- The INSERT of one callback row for the request row `r` (already bumped
-- to its new callback_sequence), given the parameter numbers of the event
-- type, the data (jsonb) and max_attempts.  Shared by ENQUEUE_SQL and by
-- writers that fold the enqueue into their own statement (qtg.nodes).
function M.callback_insert_sql(r, ev, data, max)
  local sql = ([[
INSERT INTO movement_callback_outbox (request_id, event_type, payload, callback_url, max_attempts)
SELECT R.id, $EV::text,
       jsonb_build_object(
         'event_type', $EV::text,
         'request_id', R.id,
         'request_state', R.request_state,
         'current_frontier', R.current_frontier,
         'occurred_at', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
         'sequence', R.callback_sequence,
         'data', $DATA::jsonb)::text,
       R.callback_url, $MAX::int
  FROM R WHERE R.callback_url IS NOT NULL]]):gsub("%$EV", "$" .. ev):gsub("%$DATA", "$" .. data)
    :gsub("%$MAX", "$" .. max):gsub("R%.", r .. "."):gsub("FROM R ", "FROM " .. r .. " ")
  return sql
end

local ENQUEUE_SQL = [[
WITH r AS (
  UPDATE movement_requests
     SET callback_sequence = callback_sequence + 1
   WHERE id = $1::uuid AND callback_url IS NOT NULL
  RETURNING id, request_state, current_frontier, callback_url, callback_sequence)
]] .. M.callback_insert_sql("r", 2, 3, 4) .. "\nRETURNING id, payload"

function M.max_attempts()
  local ok, qtg = pcall(require, "qtg")
  local n = ok and qtg.settings and qtg.settings.callback_max_attempts
  return tonumber(n) or 5
end
local max_attempts = M.max_attempts

-- check_event(event_type[, level]): raise unless event_type is one of
-- M.EVENTS (also for writers that fold the enqueue into their own statement,
-- e.g. qtg.nodes.write_request).  level as for error(), from the caller.
function M.check_event(event_type, level)
  if not M.EVENTS[event_type] then
    error("outbox.enqueue_callback: unknown event type " .. tostring(event_type), (level or 1) + 1)
  end
end

-- enqueue_callback(s, request_row, event_type, data) -> outbox row or nil
-- (nil when the request has no callback_url).  Call it inside the
-- transaction that made the change, after the change.
function M.enqueue_callback(s, request_row, event_type, data)
  M.check_event(event_type, 2)
  local rows = s:query(ENQUEUE_SQL, request_row.id, event_type, canon.encode(data or {}),
    max_attempts())
  return rows[1]
end

local ACTOR_PATTERN = "^[a-z]+:[%w%._%-@]+$"

-- audit(s, actor, action, entity_type, entity_id, request_id, detail)
-- actor: "system:<worker>" or "console:<uid>" (or "api:<client>").
-- check_actor(actor[, level]): raise unless actor is "system:<worker>",
-- "console:<uid>" or "api:<client>" (for writers that build their audit
-- INSERT into a larger statement, e.g. qtg.nodes.set_node_state).
function M.check_actor(actor, level)
  if type(actor) ~= "string" or not actor:match(ACTOR_PATTERN) then
    error("outbox.audit: actor must look like system:<worker> or console:<uid>, got "
      .. tostring(actor), (level or 1) + 1)
  end
end

function M.audit(s, actor, action, entity_type, entity_id, request_id, detail)
  M.check_actor(actor, 2)
  s:query([[INSERT INTO audit_outbox (actor, action, entity_type, entity_id, request_id, detail)
            VALUES ($1, $2, $3, $4, $5::uuid, $6::jsonb)]],
    actor, action, entity_type, tostring(entity_id), request_id, canon.encode(detail or {}))
end

return M
