-- 0040_audit_append_only.sql -- the audit trail is append-only from the
-- application's side (docs/security.md, "The audit trail").
--
-- audit_events: no UPDATE, no DELETE, no TRUNCATE, whoever asks through the
-- application's role: each is refused with SQLSTATE 42501
-- (insufficient_privilege) and a message naming the table.
--
-- audit_outbox: its rows leave only by promotion.  UPDATE and TRUNCATE are
-- refused; a DELETE is allowed only for a row whose promoted copy
-- (audit_events.outbox_id = the row's id) exists when the deleting statement
-- ends, which is what audit_outbox_promoter's one statement does (its DELETE
-- and INSERT are parts of one statement, and AFTER row triggers fire at its
-- end, when both are visible).  Anything else rolls the statement back.
--
-- What this does not stop: a role that owns the tables can drop or disable
-- these triggers (ALTER TABLE ... DISABLE TRIGGER, DROP TRIGGER).  qtgd never
-- runs DDL outside `qtgd migrate`; a deployment that wants the guarantee
-- against its own operators runs the daemon as a role that does not own the
-- tables (docs/security.md shows the grants).
CREATE FUNCTION qtg_audit_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION '% on % is refused: the audit trail is append-only', TG_OP, TG_TABLE_NAME
    USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER audit_events_no_update BEFORE UPDATE ON audit_events
  FOR EACH ROW EXECUTE FUNCTION qtg_audit_refuse();
CREATE TRIGGER audit_events_no_delete BEFORE DELETE ON audit_events
  FOR EACH ROW EXECUTE FUNCTION qtg_audit_refuse();
CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events
  FOR EACH STATEMENT EXECUTE FUNCTION qtg_audit_refuse();

CREATE TRIGGER audit_outbox_no_update BEFORE UPDATE ON audit_outbox
  FOR EACH ROW EXECUTE FUNCTION qtg_audit_refuse();
CREATE TRIGGER audit_outbox_no_truncate BEFORE TRUNCATE ON audit_outbox
  FOR EACH STATEMENT EXECUTE FUNCTION qtg_audit_refuse();

CREATE FUNCTION qtg_audit_outbox_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM audit_events WHERE outbox_id = OLD.id) THEN
    RAISE EXCEPTION 'DELETE of audit_outbox row % is refused: it was not promoted to audit_events', OLD.id
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER audit_outbox_delete_only_promoted AFTER DELETE ON audit_outbox
  FOR EACH ROW EXECUTE FUNCTION qtg_audit_outbox_deleted();
