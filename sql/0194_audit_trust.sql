-- 0194_audit_trust.sql -- the runtime role can neither stop the audit
-- promotion nor make `qtgd audit verify` report a break that never
-- happened (docs/security.md, "The audit trail").
--
-- 1. audit_outbox: the runtime role inserts an audit row's content only.
--    With INSERT on every column it could give a row an id already
--    promoted (every later qtg_audit_promote then failed on
--    audit_events.outbox_id, and it may not delete the row), take an id the
--    sequence would hand out next (a real writer's transaction failed), or
--    backdate created_at.  The id and the time are now the defaults'.
-- 2. The chain's carried state (0100: each chain's end, carried from row
--    to row in transaction-local settings, and the list of chains to write
--    back) was read from setting names any session can set before calling
--    qtg_audit_promote, which runs as the owner: a caller could hand the
--    trigger a made-up end (verify then reported a broken link forever and
--    the chain stopped at the next place).  The names now carry a token
--    qtg_audit_promote draws at each call (gen_random_uuid, which setseed
--    does not steer), so nothing set before the call is read.  A plain
--    INSERT by the owner draws one the same way.

CREATE OR REPLACE FUNCTION qtg_audit_chain_token() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  tok text := current_setting('qtg_chain.token', true);
BEGIN
  IF coalesce(tok, '') = '' THEN
    tok := replace(gen_random_uuid()::text, '-', '');
    PERFORM set_config('qtg_chain.token', tok, true);
  END IF;
  RETURN tok;
END $$;

CREATE OR REPLACE FUNCTION qtg_audit_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  tok text := qtg_audit_chain_token();
  key text;
  carried text;
  seq bigint;
  prev text;
BEGIN
  IF NEW.network_class IS NULL THEN
    NEW.network_class := coalesce(
      (SELECT r.network_class FROM movement_requests r WHERE r.id = NEW.request_id), '');
  END IF;
  key := 'qtg_chain.h' || tok || md5(NEW.network_class);
  carried := current_setting(key, true);
  IF coalesce(carried, '') = '' THEN
    INSERT INTO audit_chain_heads (network_class, chain_seq, row_hash)
    VALUES (NEW.network_class, 0, repeat('0', 64)) ON CONFLICT DO NOTHING;
    SELECT h.chain_seq, h.row_hash INTO seq, prev
      FROM audit_chain_heads h WHERE h.network_class = NEW.network_class FOR UPDATE;
    PERFORM set_config('qtg_chain.dirty' || tok, (
      coalesce(nullif(current_setting('qtg_chain.dirty' || tok, true), ''), '[]')::jsonb
        || to_jsonb(NEW.network_class))::text, true);
  ELSE
    seq := split_part(carried, ':', 1)::bigint;
    prev := split_part(carried, ':', 2);
  END IF;
  NEW.chain_seq := seq + 1;
  NEW.prev_hash := prev;
  NEW.row_hash := encode(sha256(convert_to(NEW.prev_hash || qtg_audit_row_text(NEW), 'UTF8')), 'hex');
  PERFORM set_config(key, NEW.chain_seq || ':' || NEW.row_hash, true);
  RETURN NEW;
END $$;

-- After each INSERT statement: the carried ends become the heads (0100),
-- read under this call's token.
CREATE OR REPLACE FUNCTION qtg_audit_chain_heads() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  class text;
  carried text;
  tok text := qtg_audit_chain_token();
BEGIN
  FOR class IN SELECT jsonb_array_elements_text(
      coalesce(nullif(current_setting('qtg_chain.dirty' || tok, true), ''), '[]')::jsonb) LOOP
    carried := current_setting('qtg_chain.h' || tok || md5(class), true);
    UPDATE audit_chain_heads
       SET chain_seq = split_part(carried, ':', 1)::bigint, row_hash = split_part(carried, ':', 2)
     WHERE network_class = class AND chain_seq <> split_part(carried, ':', 1)::bigint;
  END LOOP;
  RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION qtg_audit_promote(batch int) RETURNS int
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  promoted int;
BEGIN
  IF batch IS NULL OR batch < 1 OR batch > 10000 THEN
    RAISE EXCEPTION 'qtg_audit_promote: batch must be 1..10000, got %', batch
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- a new token: nothing the caller set before this call is carried
  PERFORM set_config('qtg_chain.token', replace(gen_random_uuid()::text, '-', ''), true);
  WITH lock AS (
    SELECT pg_try_advisory_xact_lock(hashtext('qtg.audit_outbox_promoter')) AS held
  ), picked AS MATERIALIZED (
    SELECT o.id FROM audit_outbox o, lock
     WHERE lock.held
     ORDER BY o.id
     LIMIT batch
     FOR UPDATE OF o SKIP LOCKED
  ), moved AS (
    DELETE FROM audit_outbox a USING picked p
     WHERE a.id = p.id
    RETURNING a.*
  )
  INSERT INTO audit_events
    (outbox_id, actor, action, entity_type, entity_id, request_id, detail, created_at,
     promoted_at, network_class)
  SELECT m.id, m.actor, m.action, m.entity_type, m.entity_id, m.request_id, m.detail,
         m.created_at, clock_timestamp(), coalesce(r.network_class, '')
    FROM moved m
    LEFT JOIN movement_requests r ON r.id = m.request_id
   ORDER BY m.id;
  GET DIAGNOSTICS promoted = ROW_COUNT;
  RETURN promoted;
END $$;

CREATE OR REPLACE FUNCTION qtg_grant_roles() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  me pg_roles;
  t text;
  read_only text[] := ARRAY['audit_events', 'audit_chain_heads', 'schema_migrations',
                            'signer_events',
                            'request_states', 'request_state_transitions',
                            'node_states', 'node_state_transitions', 'evm_nonce_transitions'];
BEGIN
  SELECT * INTO me FROM pg_roles WHERE rolname = current_user;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'qtg_runtime') THEN
    IF NOT (me.rolsuper OR me.rolcreaterole) THEN
      RAISE NOTICE 'qtg_runtime does not exist and % may not create roles: skipped', current_user;
      RETURN 'skipped: ' || current_user || ' may not create roles';
    END IF;
    CREATE ROLE qtg_runtime NOLOGIN;
  END IF;
  EXECUTE 'GRANT USAGE ON SCHEMA public TO qtg_runtime';
  FOR t IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') LOOP
    EXECUTE format('REVOKE ALL ON TABLE %I FROM qtg_runtime', t);
    IF t = ANY (read_only) THEN
      EXECUTE format('GRANT SELECT ON TABLE %I TO qtg_runtime', t);
    ELSIF t = 'audit_outbox' THEN
      -- its content only: the id and the time are the database's
      EXECUTE format('GRANT SELECT ON TABLE %I TO qtg_runtime', t);
      EXECUTE format('GRANT INSERT (actor, action, entity_type, entity_id, request_id, detail) '
                     'ON TABLE %I TO qtg_runtime', t);
    ELSE
      EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %I TO qtg_runtime', t);
    END IF;
  END LOOP;
  EXECUTE 'GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO qtg_runtime';
  EXECUTE 'GRANT EXECUTE ON FUNCTION qtg_audit_promote(int) TO qtg_runtime';
  RETURN 'granted';
END $$;
REVOKE ALL ON FUNCTION qtg_grant_roles() FROM PUBLIC;

SELECT qtg_grant_roles();
