-- 0101_audit_promote_function.sql -- promotion of audit_outbox rows into
-- audit_events as one function owned by the migrating (owner) role and run
-- with its rights (SECURITY DEFINER), so the daemon's runtime role needs no
-- INSERT on audit_events (docs/security.md, "Database roles").
--
-- The statement is audit_outbox_promoter's (see its comment for the
-- advisory lock and the MATERIALIZED batch); the function returns how many
-- rows it promoted.  search_path is pinned so the caller cannot point the
-- names at objects of its own.
CREATE FUNCTION qtg_audit_promote(batch int) RETURNS int
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
  promoted int;
BEGIN
  IF batch IS NULL OR batch < 1 OR batch > 10000 THEN
    RAISE EXCEPTION 'qtg_audit_promote: batch must be 1..10000, got %', batch
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
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
    (outbox_id, actor, action, entity_type, entity_id, request_id, detail, created_at, promoted_at)
  SELECT id, actor, action, entity_type, entity_id, request_id, detail, created_at,
         clock_timestamp()
    FROM moved
   ORDER BY id;
  GET DIAGNOSTICS promoted = ROW_COUNT;
  RETURN promoted;
END $$;
REVOKE ALL ON FUNCTION qtg_audit_promote(int) FROM PUBLIC;
