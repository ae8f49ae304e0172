-- 0026_drift.sql -- registry drift: configured baselines, the checks run and
-- the findings (issue 5; verify_drift compares on-chain registry values with
-- drift_baselines, ccip_drift records what the CCIP sidecar reports;
-- docs/conditional-workers.md sections 8 and 9).
--
-- drift_baselines: what the chain should say.  kind 'code_hash': keccak256 of
-- eth_getCode(address); kind 'call': the exact eth_call(address, call_data)
-- result.  Rows are written by operators (lua/qtg/drift.lua set_baseline
-- checks them; a row entered by hand with a malformed address is reported
-- by the check as an error, never crashes it).
CREATE TABLE drift_baselines (
  id             bigserial PRIMARY KEY,
  network_class  text NOT NULL CHECK (network_class <> ''),
  chain_id       bigint NOT NULL CHECK (chain_id > 0),
  lane           text NOT NULL CHECK (lane <> ''),
  name           text NOT NULL CHECK (name <> ''),
  kind           text NOT NULL CHECK (kind IN ('code_hash', 'call')),
  address        text NOT NULL,
  call_data      text,
  expected       text NOT NULL,
  enabled        boolean NOT NULL DEFAULT true,
  created_by     text NOT NULL,
  created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  UNIQUE (network_class, chain_id, lane, name),
  CHECK (kind <> 'call' OR call_data IS NOT NULL)
);

-- One row per lane (verify_drift) or per poll (ccip_drift) of a pass: when,
-- whether it could be judged, and why not.
CREATE TABLE drift_checks (
  id             bigserial PRIMARY KEY,
  network_class  text NOT NULL,
  source         text NOT NULL CHECK (source IN ('verify', 'ccip')),
  scope          text NOT NULL,
  ok             boolean NOT NULL,
  checked        int NOT NULL DEFAULT 0,
  drifted        int NOT NULL DEFAULT 0,
  errors         jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(errors) = 'array'),
  process_id     text,
  started_at     timestamptz NOT NULL,
  finished_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX drift_checks_latest ON drift_checks (network_class, source, scope, finished_at DESC);

-- An open finding per (class, source, subject); resolved when a later check
-- sees the expected value again (resolved rows are kept).
CREATE TABLE drift_findings (
  id             bigserial PRIMARY KEY,
  network_class  text NOT NULL,
  source         text NOT NULL CHECK (source IN ('verify', 'ccip')),
  subject        text NOT NULL,
  baseline_id    bigint REFERENCES drift_baselines(id),
  severity       text NOT NULL DEFAULT 'warning' CHECK (severity IN ('info', 'warning', 'critical')),
  expected       text,
  observed       text,
  detail         jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(detail) = 'object'),
  status         text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'resolved')),
  first_seen_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
  resolved_at    timestamptz,
  CHECK ((status = 'resolved') = (resolved_at IS NOT NULL))
);
CREATE UNIQUE INDEX drift_findings_one_open ON drift_findings (network_class, source, subject)
  WHERE status = 'open';
