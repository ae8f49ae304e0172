-- qtg.workers.notification_dispatcher (issue 5; MG_NOTIFY_ENABLED, sidecar):
-- deliver the operator notifications of notification_outbox to the webhook
-- MG_NOTIFY_WEBHOOK_URL with exactly the callbacks' discipline, by calling
-- qtg.callbacks (never a copy of it): signature v3 headers, 2xx = delivered,
-- next attempt after 2^min(attempts, 6) s, dlq at max_attempts
-- (MG_NOTIFY_MAX_ATTEMPTS, stored on the row when it is written).
--
-- One pass, one transaction, like callback_dispatcher: claim up to BATCH
-- pending due rows of this network class, FIFO, FOR UPDATE SKIP LOCKED;
-- POST them concurrently, each bounded by MG_NOTIFY_TIMEOUT_SECONDS; write
-- the outcomes; commit.  The row locks are held across the POSTs (bounded by
-- the timeout) so two processes never deliver one row at the same time.
--
-- M.enqueue(s, kind, dedupe_key, data, severity) is how other workers
-- surface things to operators: call it inside the transaction that made the
-- change.  The dedupe key makes it idempotent (a second enqueue of the same
-- event is a no-op and returns nil).
local qtg = require("qtg")
local callbacks = require("qtg.callbacks")
local canon = require("qtg.canon_json")

local M = {}

M.BATCH = 5

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
    error("notification_dispatcher.enqueue: kind must be [a-z][a-z0-9_]*, got " .. tostring(kind), 2)
  end
  if type(dedupe_key) ~= "string" or dedupe_key == "" then
    error("notification_dispatcher.enqueue: a dedupe key is required", 2)
  end
  if not SEVERITIES[severity] then
    error("notification_dispatcher.enqueue: severity must be info, warning or critical", 2)
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
  local outbox = require("qtg.outbox")
  local note = M.enqueue(s, t.kind, t.dedupe_key, t.data, t.severity)
  if not note then return nil end
  outbox.audit(s, "system:" .. t.worker, t.kind, t.entity_type, t.entity_id, t.request_id, t.data)
  if t.request_id then
    outbox.enqueue_callback(s, { id = t.request_id }, "request_attention",
      { reason = t.kind, entity_type = t.entity_type, entity_id = tostring(t.entity_id), detail = t.data })
  end
  return note
end

M.CLAIM_SQL = [[
SELECT * FROM notification_outbox
 WHERE status = 'pending' AND next_attempt_at <= now() AND network_class = $1
 ORDER BY created_at ASC, id ASC
 LIMIT $2
 FOR UPDATE SKIP LOCKED]]

-- $1: the ids written (bigint[], the primary key's index condition, see
-- callback_dispatcher.WRITE_SQL); $2: send_batch's writes.
M.WRITE_SQL = [[
WITH o AS (
  SELECT * FROM jsonb_to_recordset($2::jsonb) AS o(
    id bigint, status text, attempts int, backoff_seconds double precision,
    last_error text, last_status int, attempted boolean, stamp bigint)
), t AS (SELECT clock_timestamp() AS at)
UPDATE notification_outbox n
   SET status = o.status, attempts = o.attempts, last_error = o.last_error,
       callback_timestamp = coalesce(o.stamp, n.callback_timestamp),
       last_status = o.last_status,
       next_attempt_at = CASE WHEN o.backoff_seconds IS NULL THEN n.next_attempt_at
                              ELSE t.at + make_interval(secs => o.backoff_seconds) END,
       last_attempt_at = CASE WHEN o.attempted THEN t.at ELSE n.last_attempt_at END,
       delivered_at = CASE WHEN o.status = 'delivered' THEN t.at ELSE n.delivered_at END,
       updated_at = t.at
  FROM o, t
 WHERE n.id = ANY ($1::bigint[]) AND n.id = o.id]]

-- The arguments of WRITE_SQL for send_batch's writes.
function M.write_args(writes)
  local ids = {}
  for i, w in ipairs(writes) do ids[i] = string.format("%d", w.id) end
  return { "{" .. table.concat(ids, ",") .. "}", canon.encode(writes) }
end

local function webhook_url()
  local url = qtg.settings.notify_webhook_url
  local ok, why = callbacks.check_url(url)
  if not ok then
    error("notification_dispatcher: MG_NOTIFY_WEBHOOK_URL is unusable (" .. why
      .. "); nothing was sent and no attempt was spent", 0)
  end
  return url
end

-- Why a notification can never be sent, or nil (the URL is checked once
-- per pass, by webhook_url).
local function refusal(row)
  local ok, why = callbacks.check_payload(row.payload)
  if not ok then return why end
  return nil
end

local function attempted(row, out, nxt)
  local log = out.delivered and qtg.log.info or qtg.log.warn
  log(out.delivered and "notification delivered" or "notification attempt failed", {
    worker = "notification_dispatcher", notification_id = row.id, kind = row.kind,
    attempt = nxt.attempts, status = nxt.status, http_status = out.status, error = out.error,
  })
end

function M.tick(s)
  local settings = qtg.settings
  -- A missing webhook URL or callback key is a deployment error: raise
  -- before claiming (the runtime records it; nothing is spent).
  local url = webhook_url()
  local timeout = settings.notify_timeout_seconds
  s:begin()
  local rows = callbacks.stamp_first_attempts(s:query(M.CLAIM_SQL, settings.network_class, M.BATCH))
  if #rows == 0 then
    s:commit()
    return 0
  end
  local writes = callbacks.send_batch(rows, { refusal = refusal, url = function() return url end,
                                              timeout = timeout, attempted = attempted })
  s:query(M.WRITE_SQL, unpack(M.write_args(writes)))
  s:commit()
  return #rows
end

return M
