-- 0010_callback_delivery.sql -- what callback_dispatcher records beyond the
-- outbox row itself (issue 4; docs/callbacks.md).
--
-- movement_callback_attempts: one row per delivery attempt that reached the
-- network (a POST was made): when, what came back, and the retry it
-- scheduled.  Operators read a row's history here; tests assert the backoff
-- schedule on it (next_attempt_at - attempted_at = 2, 4, 8, 16 s ...).
-- Rows refused before any POST (a non-JSON payload, an invalid URL) move to
-- dlq with last_error and get no attempt row: nothing was attempted.
--
-- redelivery_of: an operator's redelivery of a dead-lettered row is a new
-- outbox row (fresh timestamp and nonce) pointing at the dead one, so the dead
-- row and its attempts stay as they were.

ALTER TABLE movement_callback_outbox
  ADD COLUMN last_attempt_at timestamptz,
  ADD COLUMN redelivery_of bigint REFERENCES movement_callback_outbox(id),
  ADD CONSTRAINT movement_callback_outbox_attempts_range
    CHECK (attempts >= 0 AND max_attempts >= 1),
  ADD CONSTRAINT movement_callback_outbox_stamp
    CHECK (callback_timestamp > 0 AND callback_nonce ~ '^[A-Za-z0-9_-]{8,128}$'),
  ADD CONSTRAINT movement_callback_outbox_delivered
    CHECK ((status = 'delivered') = (delivered_at IS NOT NULL));

-- At most one live (pending) redelivery of a dead row at a time.
CREATE UNIQUE INDEX movement_callback_outbox_one_redelivery
  ON movement_callback_outbox (redelivery_of)
  WHERE redelivery_of IS NOT NULL AND status = 'pending';

-- The dead-letter queue as operators list it.
CREATE INDEX movement_callback_outbox_dlq ON movement_callback_outbox (updated_at)
  WHERE status = 'dlq';

CREATE TABLE movement_callback_attempts (
  id               bigserial PRIMARY KEY,
  outbox_id        bigint NOT NULL REFERENCES movement_callback_outbox(id),
  attempt_no       int NOT NULL CHECK (attempt_no >= 1),
  attempted_at     timestamptz NOT NULL,
  outcome          text NOT NULL CHECK (outcome IN ('delivered', 'retry', 'dlq')),
  http_status      int,
  error            text,
  duration_ms      int NOT NULL CHECK (duration_ms >= 0),
  next_attempt_at  timestamptz,
  process_id       text NOT NULL,
  UNIQUE (outbox_id, attempt_no),
  CHECK ((outcome = 'retry') = (next_attempt_at IS NOT NULL)),
  CHECK (next_attempt_at IS NULL OR next_attempt_at > attempted_at)
);
