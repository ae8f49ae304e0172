-- 0025_cex_transfers.sql -- transfer history pulled from CEX venues (issue
-- 5; cex_transfer_ingest; docs/conditional-workers.md section 7).
--
-- cex_transfers: one row per (class, venue, venue's transfer id), upserted:
-- a pass that sees the same transfer again changes the row only when the
-- venue changed something (status, tx hash, fee...).
-- cex_ingest_cursors: one row per (class, venue): the venue's opaque cursor
-- after the last page stored, and the last error.  The row is locked for
-- the length of a venue's pass, so two processes never ingest one venue at
-- the same time.
CREATE TABLE cex_transfers (
  id                 bigserial PRIMARY KEY,
  network_class      text NOT NULL CHECK (network_class <> ''),
  venue              text NOT NULL CHECK (venue ~ '^[a-z0-9][a-z0-9_-]*$'),
  venue_transfer_id  text NOT NULL CHECK (venue_transfer_id <> ''),
  direction          text NOT NULL CHECK (direction IN ('deposit', 'withdrawal')),
  asset              text NOT NULL CHECK (asset <> ''),
  amount             numeric NOT NULL CHECK (amount >= 0),
  fee                numeric CHECK (fee >= 0),
  network            text,
  address            text,
  tx_hash            text,
  status             text NOT NULL CHECK (status IN ('pending', 'completed', 'failed', 'cancelled')),
  venue_time         timestamptz NOT NULL,
  raw                jsonb NOT NULL CHECK (jsonb_typeof(raw) = 'object'),
  first_seen_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
  UNIQUE (network_class, venue, venue_transfer_id)
);
CREATE INDEX cex_transfers_time ON cex_transfers (network_class, venue, venue_time);

CREATE TABLE cex_ingest_cursors (
  network_class         text NOT NULL CHECK (network_class <> ''),
  venue                 text NOT NULL CHECK (venue <> ''),
  cursor                text,
  last_success_at       timestamptz,
  last_error            text,
  last_error_at         timestamptz,
  consecutive_failures  int NOT NULL DEFAULT 0,
  transfers_seen        bigint NOT NULL DEFAULT 0,
  updated_at            timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (network_class, venue)
);
