-- 0206_manual_step_attestations.sql -- a manual step is done when a person
-- signs that it is (docs/approvals.md "Attested manual steps").
--
-- The signer signs a transfer only once the steps before it in the sealed
-- plan are done (0204), but the runtime role writes node states: it could
-- set a manual gate COMPLETED by itself.  With MG_SIGNER_APPROVERS, the
-- operator who completes a manual step signs its attestation statement
-- with their enrolled key, the daemon stores who and the signature on the
-- node, and the signer signs a transfer only when every manual step before
-- it in the plan is COMPLETED with an attestation that verifies for an
-- enrolled person other than the request's maker (src/qtg_signerd.c,
-- STEP_NOT_ATTESTED).
--   qtg-attestation-v1 / deployment / request / class / digest / plan /
--   step NODE_KEY
ALTER TABLE movement_request_nodes
  ADD COLUMN attested_by text CHECK (attested_by <> ''),
  ADD COLUMN attestation_signature text CHECK (attestation_signature ~ '^[0-9a-f]{128}$');

CREATE FUNCTION qtg_attestation_statement(r movement_requests, deployment text, step text) RETURNS text
  LANGUAGE sql STABLE AS $$
  SELECT 'qtg-attestation-v1' || E'\n' || qtg_statement_facts(r, deployment) || 'step ' || step || E'\n'
$$;
