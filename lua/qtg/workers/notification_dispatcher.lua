-- qtg.workers.notification_dispatcher (MG_NOTIFY_ENABLED, sidecar):
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
-- The rows are written by qtg.notifications (enqueue, surface).
local qtg = require("qtg")
local callbacks = require("qtg.callbacks")

local M = {}

M.BATCH = 5

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
  local ids, json = callbacks.write_args(writes)
  return { ids, json }
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
