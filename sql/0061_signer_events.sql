-- 0061_signer_events.sql -- the signer process's own log, and its role
-- (docs/http-and-signing.md, docs/security.md "The signer").
--
-- signer_events: every decision `qtgd signer` takes, granted or refused,
-- with the reason, the approval digest it recomputed and the payload hash.
-- Append-only: UPDATE, DELETE and TRUNCATE are refused (42501), as for
-- audit_events.
--
-- qtg_signer: the role the signer connects as.  It reads the rows a
-- decision needs (requests, nodes, approvals, plan rows, the signer roster's
-- enrolled identity, nonce reservations) and may only INSERT into
-- signer_events.  It is created here when the migrating role may create
-- roles; otherwise the DBA creates it and runs the GRANTs below by hand.
-- It is created LOGIN without a password: how it authenticates
-- (peer map for the qtg-signer system user, a password, a certificate) is
-- pg_hba.conf's business.
CREATE TABLE signer_events (
  id               bigserial PRIMARY KEY,
  decision         text NOT NULL CHECK (decision IN ('granted', 'refused')),
  code             text NOT NULL,
  reason           text NOT NULL,
  request_id       uuid,
  request_node_id  uuid,
  attempt_no       int,
  signer_key       text,
  signer_address   text,
  approval_digest  text,
  payload_hash     text,
  peer_uid         bigint,
  peer_pid         bigint,
  created_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX signer_events_request ON signer_events (request_id, created_at);

CREATE FUNCTION qtg_signer_events_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION '% on signer_events is refused: the signer log is append-only', TG_OP
    USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER signer_events_no_update BEFORE UPDATE ON signer_events
  FOR EACH ROW EXECUTE FUNCTION qtg_signer_events_refuse();
CREATE TRIGGER signer_events_no_delete BEFORE DELETE ON signer_events
  FOR EACH ROW EXECUTE FUNCTION qtg_signer_events_refuse();
CREATE TRIGGER signer_events_no_truncate BEFORE TRUNCATE ON signer_events
  FOR EACH STATEMENT EXECUTE FUNCTION qtg_signer_events_refuse();

DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'qtg_signer') THEN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = current_user
                 AND (rolsuper OR rolcreaterole)) THEN
      CREATE ROLE qtg_signer LOGIN;
    ELSE
      RAISE NOTICE 'role qtg_signer does not exist and % may not create it: create it, then run the GRANTs of 0061_signer_events.sql', current_user;
      RETURN;
    END IF;
  END IF;
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO qtg_signer', current_database());
  GRANT USAGE ON SCHEMA public TO qtg_signer;
  GRANT SELECT ON movement_requests, movement_request_nodes, request_approvals,
                  plan_versions, plan_nodes, movement_templates, signer_roster,
                  evm_nonce_reservation TO qtg_signer;
  GRANT INSERT ON signer_events TO qtg_signer;
  GRANT USAGE ON SEQUENCE signer_events_id_seq TO qtg_signer;
END $$;
