-- 0171_signer_one_nonce.sql -- the signer signs one approved transfer at one
-- nonce (docs/security.md section 6, docs/http-and-signing.md).
--
-- Two transactions at one nonce replace each other: at most one is mined.
-- Two at different nonces can both be mined, so a second nonce for the same
-- transfer would pay twice from one approval.  The daemon's role writes the
-- nodes and the nonce reservations the signer checks, so the signer cannot
-- learn from them whether a transfer was signed before (a node moved
-- READY -> FAILED -> READY, or a second node row for the same plan node,
-- each with a fresh reservation, looked new).  It learns it from its own
-- log instead: each grant records the plan node, chain and nonce it was
-- for, and a grant for the same request and plan node at another chain,
-- sender or nonce is refused (ALREADY_SIGNED_ELSEWHERE).  signer_events is
-- append-only and the runtime role cannot insert into it (0061, 0102).
-- Rows written before this migration name no nonce and do not count.
ALTER TABLE signer_events
  ADD COLUMN plan_node_id bigint,
  ADD COLUMN chain_id bigint,
  ADD COLUMN nonce bigint;

CREATE INDEX signer_events_granted_transfer ON signer_events (request_id, plan_node_id)
  WHERE decision = 'granted';

DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'qtg_signer') THEN
    GRANT SELECT ON signer_events TO qtg_signer;
  ELSE
    RAISE NOTICE 'role qtg_signer does not exist: after creating it, GRANT SELECT ON signer_events TO qtg_signer';
  END IF;
END $$;
