-- 0090_provider_pacing.sql -- rate limits on calls to providers that every
-- qtgd process shares (lua/qtg/pacing.lua, docs/pacing.md), and the sim
-- provider's call log.
--
-- provider_pacing: one row per shared bucket ("<executor>:<call>"), holding
-- the bucket's theoretical arrival time (GCRA): a call may start at
-- tat - tolerance, and each call moves tat one emission interval on.  One
-- atomic INSERT ... ON CONFLICT DO UPDATE per call, on its own short
-- transaction (never inside a node's transaction: the row lock would
-- serialise every lane until that transaction ends).
CREATE TABLE provider_pacing (
  bucket      text PRIMARY KEY,
  tat         timestamptz NOT NULL,
  updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- sim_calls: the sim executor's access log, written by the sim as a provider
-- logs the calls it receives (only when the sim's CALL_LOG is on): which
-- call, for which submission, by which qtgd process, and when it arrived
-- (the database clock, one clock for every process).
CREATE TABLE sim_calls (
  id               bigserial PRIMARY KEY,
  call             text NOT NULL,
  idempotency_key  text,
  caller           text NOT NULL,
  at               timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX sim_calls_at ON sim_calls (at);
