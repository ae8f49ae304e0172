-- 0121_audit_promote_class.sql -- the promotion names each audit row's
-- chain (its request's network class) from one join, instead of the chain
-- trigger looking it up row by row (docs/performance.md: the per-row lookup
-- ran the executor once per row and was half of the promotion's time).
--
-- The chain trigger (0100) takes the class the inserting statement names
-- and looks it up itself only when the statement names none, so a plain
-- INSERT still lands in the right chain.  The only inserter the runtime
-- role can reach is qtg_audit_promote (0101), which reads the class from
-- the request row in the same statement; a role able to name a wrong
-- class can also write audit_events directly, which the chain does not
-- defend against (0100's header says what it proves).  Everything else about
-- the chain (its place, its hash, its head) is unchanged, and `qtgd audit
-- verify` checks the same links.
CREATE OR REPLACE FUNCTION qtg_audit_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  key text;
  carried text;
  seq bigint;
  prev text;
BEGIN
  IF NEW.network_class IS NULL THEN
    NEW.network_class := coalesce(
      (SELECT r.network_class FROM movement_requests r WHERE r.id = NEW.request_id), '');
  END IF;
  key := 'qtg_chain.h' || md5(NEW.network_class);
  carried := current_setting(key, true);
  IF coalesce(carried, '') = '' THEN
    INSERT INTO audit_chain_heads (network_class, chain_seq, row_hash)
    VALUES (NEW.network_class, 0, repeat('0', 64)) ON CONFLICT DO NOTHING;
    SELECT h.chain_seq, h.row_hash INTO seq, prev
      FROM audit_chain_heads h WHERE h.network_class = NEW.network_class FOR UPDATE;
    PERFORM set_config('qtg_chain.dirty', (
      coalesce(nullif(current_setting('qtg_chain.dirty', true), ''), '[]')::jsonb
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

CREATE OR REPLACE FUNCTION qtg_audit_promote(batch int) RETURNS int
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
