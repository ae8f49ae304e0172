-- 0201_pinned_search_paths.sql -- the guards and the promotion resolve their
-- tables in public, never in a session's temporary schema; the promotion's
-- turn is a row lock the runtime role cannot take (docs/security.md,
-- "Database roles").
--
-- PostgreSQL searches a session's temporary schema (pg_temp) FIRST for
-- tables whenever search_path does not name it.  Any role may create
-- temporary tables by default (the database's TEMPORARY privilege is
-- PUBLIC's), so the runtime role could shadow a table for its own session:
--   * a temporary audit_events, and qtg_audit_promote (SECURITY DEFINER,
--     search_path pg_catalog, public) moved the real outbox rows into it:
--     erased from the trail, and `qtgd audit verify` still passed; a
--     temporary audit_outbox chained forged rows into the real trail;
--   * a temporary movement_requests, and the plan seal's trigger (0170) found
--     no request referencing the plan: a sealed plan node's destination was
--     changed.
-- Every plpgsql function of the schema, and every SQL function that is not
-- IMMUTABLE except the two that read only their arguments and are inlined
-- on the hot paths (qtg_audit_row_text, qtg_wake_payload), now runs with
-- search_path = pg_catalog, public, pg_temp (pg_temp last: searched only
-- for what the others lack).  qtg_grant_roles() pins them at every
-- `qtgd migrate`, so a later migration's CREATE OR REPLACE (which drops a
-- function's SET clause) is pinned again; it also revokes TEMPORARY on the
-- database from PUBLIC where the migrating role may (nothing of qtg uses
-- temporary tables at run time).
--
-- The promotion was serialised by an advisory lock, which any role may take
-- and hold: the runtime role could stop promotion for as long as it liked.
-- Its turn is now a row lock on audit_promoter_turn, a table the runtime
-- role has no privilege on (locking a row asks UPDATE on it).

CREATE TABLE audit_promoter_turn (
  id int PRIMARY KEY CHECK (id = 1)
);
INSERT INTO audit_promoter_turn VALUES (1);

CREATE OR REPLACE FUNCTION qtg_audit_promote(batch int) RETURNS int
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  promoted int;
BEGIN
  IF batch IS NULL OR batch < 1 OR batch > 10000 THEN
    RAISE EXCEPTION 'qtg_audit_promote: batch must be 1..10000, got %', batch
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- one promoter at a time; another one's turn: nothing to do now
  PERFORM 1 FROM audit_promoter_turn WHERE id = 1 FOR UPDATE SKIP LOCKED;
  IF NOT FOUND THEN RETURN 0; END IF;
  -- a new token: nothing the caller set before this call is carried
  PERFORM set_config('qtg_chain.token', replace(gen_random_uuid()::text, '-', ''), true);
  WITH picked AS MATERIALIZED (
    SELECT o.id FROM audit_outbox o
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
  f regprocedure;
  pinned text := 'search_path=pg_catalog, public, pg_temp';
  read_only text[] := ARRAY['audit_events', 'audit_chain_heads', 'schema_migrations',
                            'signer_events',
                            'request_states', 'request_state_transitions',
                            'node_states', 'node_state_transitions', 'evm_nonce_transitions'];
  owner_only text[] := ARRAY['audit_promoter_turn'];
BEGIN
  -- the search paths first: they need no role
  FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
             JOIN pg_namespace n ON n.oid = p.pronamespace
             JOIN pg_language l ON l.oid = p.prolang
            WHERE n.nspname = 'public' AND p.prokind = 'f'
              AND (l.lanname = 'plpgsql'
                   OR (l.lanname = 'sql' AND p.provolatile <> 'i'
                       AND p.proname NOT IN ('qtg_audit_row_text', 'qtg_wake_payload')))
              AND pg_has_role(current_user, p.proowner, 'USAGE')
              AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
                                 AND d.objid = p.oid AND d.deptype = 'e')
              AND NOT (pinned = ANY (coalesce(p.proconfig, '{}'))) LOOP
    EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, public, pg_temp', f);
  END LOOP;
  BEGIN
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
  EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE '% may not revoke TEMPORARY on database % from PUBLIC: an administrator should',
      current_user, current_database();
  END;
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
    IF t = ANY (owner_only) THEN
      NULL;
    ELSIF t = ANY (read_only) THEN
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
