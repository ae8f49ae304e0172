-- 0024_balances.sql -- balance snapshots and their hourly/daily history
-- (issue 5; balance_snapshot writes snapshots, balance_history_rollup rolls
-- them up; docs/conditional-workers.md sections 5 and 6).
--
-- balance_snapshots is append-only: one row per fetch of one venue and
-- asset.  A failed fetch is recorded too (ok = false, error, no amount), so
-- an operator sees why a balance is stale.  Rows are never updated; the
-- worker's retention cleanup deletes rows older than
-- MG_BALANCE_SNAPSHOT_RETENTION_SECONDS.  Staleness is not stored: it is
-- judged when read (lua/qtg/balances.lua, MG_BALANCE_STALE_THRESHOLD_SECONDS).
CREATE TABLE balance_snapshots (
  id             bigserial PRIMARY KEY,
  network_class  text NOT NULL CHECK (network_class <> ''),
  venue_key      text NOT NULL CHECK (venue_key ~ '^[a-z0-9][a-z0-9_.:-]*$'),
  asset          text NOT NULL CHECK (asset <> ''),
  ok             boolean NOT NULL,
  amount         numeric CHECK (amount >= 0),
  detail         jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(detail) = 'object'),
  error          text,
  source         text NOT NULL DEFAULT 'worker' CHECK (source IN ('worker', 'fresh')),
  process_id     text,
  captured_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
  CHECK (ok = (amount IS NOT NULL)),
  CHECK (ok = (error IS NULL))
);
CREATE INDEX balance_snapshots_latest ON balance_snapshots (network_class, venue_key, asset, captured_at DESC);
CREATE INDEX balance_snapshots_captured ON balance_snapshots (network_class, captured_at);

CREATE FUNCTION qtg_balance_snapshots_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'balance_snapshots is append-only (snapshot %)', OLD.id
    USING ERRCODE = 'check_violation';
END $$;
CREATE TRIGGER balance_snapshots_append_only BEFORE UPDATE ON balance_snapshots
  FOR EACH ROW EXECUTE FUNCTION qtg_balance_snapshots_append_only();

-- One row per (class, venue, asset, granularity, bucket): the successful
-- snapshots of that hour or day.  Recomputed from the snapshots while they
-- are kept; kept after the snapshots are deleted.
CREATE TABLE balance_history (
  network_class  text NOT NULL,
  venue_key      text NOT NULL,
  asset          text NOT NULL,
  granularity    text NOT NULL CHECK (granularity IN ('hour', 'day')),
  bucket_start   timestamptz NOT NULL,
  open_amount    numeric NOT NULL,
  close_amount   numeric NOT NULL,
  min_amount     numeric NOT NULL,
  max_amount     numeric NOT NULL,
  samples        int NOT NULL CHECK (samples > 0),
  first_at       timestamptz NOT NULL,
  last_at        timestamptz NOT NULL,
  updated_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (network_class, venue_key, asset, granularity, bucket_start)
);
