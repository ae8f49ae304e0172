-- 0102_database_roles.sql -- the role the daemon runs as (docs/security.md,
-- "Database roles"; docs/operations.md shows the set-up).
--
-- Three roles: the OWNER runs `qtgd migrate` and owns every table and
-- function; qtg_runtime (NOLOGIN, a group: the daemon logs in as a member of
-- it) may read and write the engine's tables and nothing more; the signer has
-- a role of its own.  qtg_runtime has:
--   * no DDL: it owns nothing, and PostgreSQL 15 gives PUBLIC no CREATE on
--     the public schema, so it can neither alter, drop nor disable triggers;
--   * no TRUNCATE on any table;
--   * SELECT only on the audit trail (audit_events, audit_chain_heads) and
--     on what others write (schema_migrations, signer_events); it promotes
--     audit rows only through qtg_audit_promote (SECURITY DEFINER, 0101),
--     and may INSERT into audit_outbox but never UPDATE or DELETE there.
--
-- qtg_grant_roles() creates qtg_runtime when missing and (re)grants it on
-- every table and sequence there is; `qtgd migrate` calls it after each run,
-- so tables of later migrations are covered.  A migrating role that may not
-- create roles (neither superuser nor CREATEROLE) and does not own the role
-- gets a notice and nothing changes: an administrator runs it once.
CREATE FUNCTION qtg_grant_roles() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  me pg_roles;
  t text;
  read_only text[] := ARRAY['audit_events', 'audit_chain_heads', 'schema_migrations',
                            'signer_events'];
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
      EXECUTE format('GRANT SELECT, INSERT ON TABLE %I TO qtg_runtime', t);
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
