-- qtg.workers.callback_dispatcher (spec section 4): POST due callbacks of
-- the outbox, signed (qtg.callbacks), and record what happened.
--
-- One pass, one transaction:
--   1. claim up to BATCH pending rows whose next_attempt_at is due, of this
--      process's network class, FIFO by created_at, FOR UPDATE OF the outbox
--      row SKIP LOCKED;
--   2. refuse unsent what can never be delivered (a payload that is not a
--      JSON object, an invalid URL, a malformed stamp): dlq with last_error;
--   3. POST the others concurrently (one task each), so one slow receiver
--      does not hold up the batch; each POST is bounded by
--      MG_CALLBACK_TIMEOUT_SECONDS;
--   4. write every row's outcome and one movement_callback_attempts row per
--      POST in a single statement, and commit.
-- The row locks are held across the POSTs on purpose (the spec's pickup is
-- the locked SELECT, then the send): another process's pass skips a row
-- while it is being delivered, so a fault-free callback is delivered once.
-- The hold is bounded by the timeout.  If this process dies after a POST but
-- before the commit, the row is sent again later: delivery is at least once,
-- and the nonce is the receiver's idempotency key.
local qtg = require("qtg")
local callbacks = require("qtg.callbacks")
local heartbeats = require("qtg.heartbeats")
local canon = require("qtg.canon_json")

local M = {}

M.BATCH = 5

M.CLAIM_SQL = [[
SELECT c.*
  FROM movement_callback_outbox c
  JOIN movement_requests r ON r.id = c.request_id
 WHERE c.status = 'pending'
   AND c.next_attempt_at <= now()
   AND r.network_class = $1
 ORDER BY c.created_at ASC, c.id ASC
 LIMIT $2
 FOR UPDATE OF c SKIP LOCKED]]

-- The claim's predicate without its locks: whether a pass has anything to
-- do, asked before a transaction is opened (idle passes: one statement).
M.PROBE_SQL = [[
SELECT 1
  FROM movement_callback_outbox c
  JOIN movement_requests r ON r.id = c.request_id
 WHERE c.status = 'pending'
   AND c.next_attempt_at <= now()
   AND r.network_class = $1
 LIMIT 1]]

-- $1: array of {id, status, attempts, backoff_seconds?, last_error?,
-- last_status?, attempted, outcome?, duration_ms?}; $2: process id.
M.WRITE_SQL = [[
WITH o AS (
  SELECT * FROM jsonb_to_recordset($1::jsonb) AS o(
    id bigint, status text, attempts int, backoff_seconds double precision,
    last_error text, last_status int, attempted boolean, outcome text, duration_ms int)
), t AS (SELECT clock_timestamp() AS at),
upd AS (
  UPDATE movement_callback_outbox c
     SET status = o.status,
         attempts = o.attempts,
         last_error = o.last_error,
         last_status = o.last_status,
         next_attempt_at = CASE WHEN o.backoff_seconds IS NULL THEN c.next_attempt_at
                                ELSE t.at + make_interval(secs => o.backoff_seconds) END,
         last_attempt_at = CASE WHEN o.attempted THEN t.at ELSE c.last_attempt_at END,
         delivered_at = CASE WHEN o.status = 'delivered' THEN t.at ELSE c.delivered_at END,
         updated_at = t.at
    FROM o, t
   WHERE c.id = o.id
  RETURNING c.id, c.attempts, c.next_attempt_at, o.attempted, o.outcome, o.last_status,
            o.last_error, o.duration_ms, t.at
)
INSERT INTO movement_callback_attempts
  (outbox_id, attempt_no, attempted_at, outcome, http_status, error, duration_ms,
   next_attempt_at, process_id)
SELECT id, attempts, at, outcome, last_status, last_error, duration_ms,
       CASE WHEN outcome = 'retry' THEN next_attempt_at END, $2
  FROM upd WHERE attempted]]

-- Why a row can never be sent, or nil.
local function refusal(row)
  local ok, why = callbacks.check_url(row.callback_url)
  if not ok then return why end
  ok, why = callbacks.check_payload(row.payload)
  if not ok then return why end
  ok, why = callbacks.check_stamp(row.callback_timestamp, row.callback_nonce)
  if not ok then return why end
  return nil
end

-- One POST, in its own task.  Returns the outcome with duration_ms.
local function deliver(row, headers, timeout)
  local started = qtg.monotonic()
  local resp, err = qtg.http.request{
    method = "POST", url = row.callback_url, headers = headers, body = row.payload,
    timeout = timeout, connect_timeout = math.min(timeout, callbacks.CONNECT_TIMEOUT_SECONDS),
    max_body = callbacks.MAX_RESPONSE_BYTES, follow_redirects = false,
  }
  local out = callbacks.outcome(resp, err)
  out.duration_ms = math.floor((qtg.monotonic() - started) * 1000 + 0.5)
  return out
end

-- After a pass that found nothing, the next probes first (see PROBE_SQL); a
-- draining run goes straight to the claim.
local last_pass_empty = false

function M.tick(s)
  local settings = qtg.settings
  local timeout = settings.callback_timeout_seconds
  if last_pass_empty and #s:query(M.PROBE_SQL, settings.network_class) == 0 then return 0 end
  s:begin()
  local rows = s:query(M.CLAIM_SQL, settings.network_class, M.BATCH)
  last_pass_empty = #rows == 0
  if #rows == 0 then
    s:commit()
    return 0
  end
  -- Decide and sign every row before the first POST: a missing key raises
  -- here with nothing sent and no attempt spent (the runtime rolls back).
  local writes, headers = {}, {}
  for i, row in ipairs(rows) do
    local why = refusal(row)
    if why then
      writes[i] = { id = row.id, status = "dlq", attempts = row.attempts, attempted = false,
                    last_error = "refused unsent: " .. why }
    else
      headers[i] = callbacks.headers(row.callback_timestamp, row.callback_nonce, row.payload)
    end
  end
  local tasks = {}
  for i, row in ipairs(rows) do
    if headers[i] then tasks[i] = qtg.spawn(deliver, row, headers[i], timeout) end
  end
  for i, row in ipairs(rows) do
    if tasks[i] then
      local ok, out = qtg.join(tasks[i])
      if not ok then
        out = { delivered = false, error = callbacks.clip("dispatcher: " .. tostring(out)),
                duration_ms = 0 }
      end
      local next_state = callbacks.after_attempt(row, out, row.max_attempts)
      writes[i] = {
        id = row.id, status = next_state.status, attempts = next_state.attempts,
        backoff_seconds = next_state.backoff_seconds, outcome = next_state.outcome,
        last_error = out.error or qtg.db.NULL, last_status = out.status or qtg.db.NULL,
        attempted = true, duration_ms = out.duration_ms,
      }
      local log = out.delivered and qtg.log.info or qtg.log.warn
      log(out.delivered and "callback delivered" or "callback attempt failed", {
        worker = "callback_dispatcher", request_id = row.request_id, outbox_id = row.id,
        attempt = next_state.attempts, status = next_state.status, http_status = out.status,
        error = out.error,
      })
    else
      qtg.log.warn("callback refused unsent", {
        worker = "callback_dispatcher", request_id = row.request_id, outbox_id = row.id,
        error = writes[i].last_error,
      })
    end
  end
  s:query(M.WRITE_SQL, canon.encode(writes), heartbeats.process_id())
  s:commit()
  return #rows
end

return M
