-- 0012_component_health.sql -- executor/signer health and the signer roster
-- (issue 4, spec section 6; docs/callbacks.md "Executor health and signers").
--
-- component_health: the last health() result of every registered executor
-- adapter and signer, per network class: healthy, degraded or down as the
-- component said (a signer: ok -> healthy, not ok -> down), down with
-- last_error when health() raised or answered garbage, and 'unknown' where
-- the component has no health().  Written only by executor_health.
--
-- signer_roster: one row per signer key name.  Two addresses, two writers:
--   expected_signer_address: written only by signers.set_expected_identity
--     (the console's enrollment, audited); executor_health never touches it;
--   observed_signer_address: written only by executor_health, from a valid
--     nonzero health().signer_address, stored lowercase; cleared when the
--     signer is no longer loaded in the runtime (the row is then an orphan)
--     or when health() stops reporting a valid address.
-- Identity posture (match, mismatch, unobserved, unenrolled, orphan) is not
-- stored: it is derived when the roster is read (lua/qtg/signers.lua).

CREATE TABLE component_health (
  network_class     text NOT NULL CHECK (network_class <> ''),
  component_kind    text NOT NULL CHECK (component_kind IN ('executor', 'signer')),
  component_name    text NOT NULL CHECK (component_name <> ''),
  health_state      text NOT NULL DEFAULT 'unknown'
                    CHECK (health_state IN ('healthy', 'degraded', 'down', 'unknown')),
  detail            jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(detail) = 'object'),
  last_error        text,
  checked_at        timestamptz,
  last_healthy_at   timestamptz,
  state_changed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
  process_id        text,
  created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (network_class, component_kind, component_name)
);

CREATE TABLE signer_roster (
  network_class            text NOT NULL CHECK (network_class <> ''),
  signer_key               text NOT NULL CHECK (signer_key ~ '^[A-Za-z0-9_.-]{1,64}$'),
  expected_signer_address  text CHECK (expected_signer_address ~ '^0x[0-9a-f]{40}$'
                             AND expected_signer_address <> '0x0000000000000000000000000000000000000000'),
  observed_signer_address  text CHECK (observed_signer_address ~ '^0x[0-9a-f]{40}$'
                             AND observed_signer_address <> '0x0000000000000000000000000000000000000000'),
  runtime_present          boolean NOT NULL DEFAULT false,
  observed_at              timestamptz,
  expected_set_by          text,
  expected_set_at          timestamptz,
  created_at               timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at               timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (network_class, signer_key),
  CHECK (runtime_present OR observed_signer_address IS NULL),
  CHECK ((expected_signer_address IS NULL) = (expected_set_at IS NULL))
);
