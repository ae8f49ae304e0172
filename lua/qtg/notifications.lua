-- qtg.notifications: the operator notifications of notification_outbox,
-- delivered by the notification_dispatcher worker to MG_NOTIFY_WEBHOOK_URL.
--
-- enqueue(s, kind, dedupe_key, data, severity) is how workers surface
-- things to operators: call it inside the transaction that made the change.
-- The dedupe key makes it idempotent (a second enqueue of the same event is
-- a no-op and returns nil).  surface(s, t) adds the audit row and the
-- request's callback.
local qtg = require("qtg")
local canon = require("qtg.canon_json")
local outbox = require("qtg.outbox")

local M = {}

M.ENQUEUE_SQL = [[
INSERT INTO notification_outbox (network_class, kind, severity, dedupe_key, payload, max_attempts)
VALUES ($1, $2, $3, $4,
        jsonb_build_object('kind', $2::text, 'severity', $3::text, 'network_class', $1::text,
          'dedupe_key', $4::text,
          'occurred_at', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
          'data', $5::jsonb)::text,
        $6)
ON CONFLICT (network_class, dedupe_key) DO NOTHING
RETURNING id, payload]]

local SEVERITIES = { info = true, warning = true, critical = true }

function M.enqueue(s, kind, dedupe_key, data, severity)
  severity = severity or "warning"
  if type(kind) ~= "string" or not kind:match("^[a-z][a-z0-9_]*$") then
    error("notifications.enqueue: kind must be [a-z][a-z0-9_]*, got " .. tostring(kind), 2)
  end
  if type(dedupe_key) ~= "string" or dedupe_key == "" then
    error("notifications.enqueue: a dedupe key is required", 2)
  end
  if not SEVERITIES[severity] then
    error("notifications.enqueue: severity must be info, warning or critical", 2)
  end
  return s:query(M.ENQUEUE_SQL, qtg.settings.network_class, kind, severity, dedupe_key,
    canon.encode(data or {}), qtg.settings.notify_max_attempts)[1]
end

-- surface(s, t): tell operators about something a worker cannot settle,
-- in the caller's transaction: an audit row (actor system:<worker>), a
-- notification (kind, dedupe key) and, when the thing belongs to a movement
-- request, that request's request_attention callback (qtg.outbox).
-- t = {worker=, kind=, dedupe_key=, entity_type=, entity_id=, request_id=,
--      data=, severity=}.  Returns the notification row (nil when that event
-- was already surfaced: then nothing else is written either).
function M.surface(s, t)
  local note = M.enqueue(s, t.kind, t.dedupe_key, t.data, t.severity)
  if not note then return nil end
  local audit = { actor = "system:" .. t.worker, action = t.kind, entity_type = t.entity_type,
                  entity_id = t.entity_id, request_id = t.request_id, detail = t.data }
  if t.request_id then
    outbox.enqueue_callback(s, { id = t.request_id }, "request_attention",
      { reason = t.kind, entity_type = t.entity_type, entity_id = tostring(t.entity_id), detail = t.data }, audit)
  else
    outbox.write(s, nil, nil, { audit = audit })
  end
  return note
end

return M
