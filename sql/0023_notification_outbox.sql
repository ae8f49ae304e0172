-- 0023_notification_outbox.sql -- operator notifications (issue 5; written
-- by the workers that surface things, delivered by notification_dispatcher
-- to MG_NOTIFY_WEBHOOK_URL with the callbacks' signature, retry schedule and
-- dead-letter queue; docs/conditional-workers.md section 4).
--
-- dedupe_key: one notification per event (e.g. "nonce_surfaced:<id>"), so a
-- worker that surfaces the same thing twice (two processes, a retried pass)
-- notifies once.
CREATE TABLE notification_outbox (
  id                  bigserial PRIMARY KEY,
  network_class       text NOT NULL CHECK (network_class <> ''),
  kind                text NOT NULL CHECK (kind ~ '^[a-z][a-z0-9_]*$'),
  severity            text NOT NULL DEFAULT 'warning' CHECK (severity IN ('info', 'warning', 'critical')),
  dedupe_key          text NOT NULL CHECK (dedupe_key <> ''),
  payload             text NOT NULL,
  status              text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'dlq')),
  attempts            int NOT NULL DEFAULT 0 CHECK (attempts >= 0),
  max_attempts        int NOT NULL CHECK (max_attempts >= 1),
  next_attempt_at     timestamptz NOT NULL DEFAULT now(),
  callback_timestamp  bigint NOT NULL DEFAULT extract(epoch from now())::bigint CHECK (callback_timestamp > 0),
  callback_nonce      text NOT NULL DEFAULT replace(gen_random_uuid()::text, '-', '')
                      CHECK (callback_nonce ~ '^[A-Za-z0-9_-]{8,128}$'),
  last_error          text,
  last_status         int,
  last_attempt_at     timestamptz,
  delivered_at        timestamptz,
  created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
  UNIQUE (network_class, dedupe_key),
  CHECK ((status = 'delivered') = (delivered_at IS NOT NULL))
);

-- notification_dispatcher's claim: pending and due, FIFO.
CREATE INDEX notification_outbox_pending ON notification_outbox (network_class, created_at)
  WHERE status = 'pending';
CREATE INDEX notification_outbox_dlq ON notification_outbox (updated_at) WHERE status = 'dlq';
