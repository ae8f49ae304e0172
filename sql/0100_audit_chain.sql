-- 0100_audit_chain.sql -- the audit trail is hash-chained (docs/security.md,
-- "Tamper evidence").
--
-- Each audit_events row carries the hash of the row before it in its chain
-- and its own: row_hash = sha256(prev_hash || qtg_audit_row_text(row)), hex.
-- There is one chain per network class (the class of the row's request; ''
-- for rows about no request: templates, operators, workers).  chain_seq
-- numbers a chain's rows 1, 2, 3, ... with no gap, so a deleted row breaks
-- the sequence and an edited one no longer hashes to its row_hash.  The
-- chain's end is kept in audit_chain_heads, so a deleted tail shows too.
--
-- The chain is written by a BEFORE INSERT trigger, in the order rows are
-- inserted: promotion is serialised (the promoter's advisory lock) and the
-- head row is locked for the rest of the inserting transaction, so two
-- writers can never give two rows the same place (and the UNIQUE
-- (network_class, chain_seq) says so if they tried).
--
-- `qtgd audit verify` recomputes every hash with its own copy of the row
-- text's expression (not by calling qtg_audit_row_text, which a role able to
-- replace functions could change) and reports the first broken link.
-- What this proves and what it does not: a role that can rewrite rows can
-- also recompute the chain after its edit; the defence is that the runtime
-- role cannot write audit_events at all (0101) and that `qtgd audit export`
-- copies the rows, hashes included, to storage the database cannot reach.
ALTER TABLE audit_events
  ADD COLUMN network_class text,
  ADD COLUMN chain_seq bigint,
  ADD COLUMN prev_hash text,
  ADD COLUMN row_hash text;

CREATE TABLE audit_chain_heads (
  network_class text PRIMARY KEY,
  chain_seq     bigint NOT NULL CHECK (chain_seq >= 0),
  row_hash      text NOT NULL
);

-- Times as whole microseconds since the epoch: the text must not depend on
-- the session's TimeZone or DateStyle.
CREATE FUNCTION qtg_audit_row_text(e audit_events) RETURNS text
  LANGUAGE sql IMMUTABLE AS $$
  SELECT jsonb_build_object(
    'id', e.id, 'outbox_id', e.outbox_id, 'actor', e.actor, 'action', e.action,
    'entity_type', e.entity_type, 'entity_id', e.entity_id, 'request_id', e.request_id,
    'detail', e.detail,
    'created_us', (extract(epoch FROM e.created_at) * 1000000)::bigint,
    'promoted_us', (extract(epoch FROM e.promoted_at) * 1000000)::bigint,
    'network_class', e.network_class, 'chain_seq', e.chain_seq)::text
$$;

-- The place of each inserted row.  The head is read and locked (FOR UPDATE)
-- once per transaction and chain, then carried in a transaction-local setting
-- (qtg_chain.h<md5 of the class>: "seq:hash") from row to row; one
-- statement-level trigger writes the heads back once per statement.  Updating
-- the head row once per inserted row would leave a version per row that the
-- next lookup walks (a 500-row batch would walk 125,000 versions).  The
-- settings are transaction-local, so a rolled-back (sub)transaction forgets
-- them along with its rows and its head updates.
CREATE FUNCTION qtg_audit_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  key text;
  carried text;
  seq bigint;
  prev text;
BEGIN
  NEW.network_class := coalesce(
    (SELECT r.network_class FROM movement_requests r WHERE r.id = NEW.request_id), '');
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

-- After each INSERT statement: the carried ends become the heads.  The head
-- rows stay locked by this transaction, so the carried values stay right
-- for its later statements.
CREATE FUNCTION qtg_audit_chain_heads() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  class text;
  carried text;
BEGIN
  FOR class IN SELECT jsonb_array_elements_text(
      coalesce(nullif(current_setting('qtg_chain.dirty', true), ''), '[]')::jsonb) LOOP
    carried := current_setting('qtg_chain.h' || md5(class), true);
    UPDATE audit_chain_heads
       SET chain_seq = split_part(carried, ':', 1)::bigint, row_hash = split_part(carried, ':', 2)
     WHERE network_class = class AND chain_seq <> split_part(carried, ':', 1)::bigint;
  END LOOP;
  RETURN NULL;
END $$;

-- Rows written before this migration join the chains in id order.
ALTER TABLE audit_events DISABLE TRIGGER audit_events_no_update;
DO $$
DECLARE
  e audit_events;
  head audit_chain_heads;
BEGIN
  FOR e IN SELECT * FROM audit_events ORDER BY id LOOP
    e.network_class := coalesce(
      (SELECT r.network_class FROM movement_requests r WHERE r.id = e.request_id), '');
    SELECT * INTO head FROM audit_chain_heads WHERE network_class = e.network_class;
    IF NOT FOUND THEN
      head.network_class := e.network_class;
      head.chain_seq := 0;
      head.row_hash := repeat('0', 64);
      INSERT INTO audit_chain_heads VALUES (head.network_class, head.chain_seq, head.row_hash);
    END IF;
    e.chain_seq := head.chain_seq + 1;
    e.prev_hash := head.row_hash;
    e.row_hash := encode(sha256(convert_to(e.prev_hash || qtg_audit_row_text(e), 'UTF8')), 'hex');
    UPDATE audit_events SET network_class = e.network_class, chain_seq = e.chain_seq,
           prev_hash = e.prev_hash, row_hash = e.row_hash WHERE id = e.id;
    UPDATE audit_chain_heads SET chain_seq = e.chain_seq, row_hash = e.row_hash
     WHERE network_class = e.network_class;
  END LOOP;
END $$;
ALTER TABLE audit_events ENABLE TRIGGER audit_events_no_update;

ALTER TABLE audit_events
  ALTER COLUMN network_class SET NOT NULL,
  ALTER COLUMN chain_seq SET NOT NULL,
  ALTER COLUMN prev_hash SET NOT NULL,
  ALTER COLUMN row_hash SET NOT NULL,
  ADD CONSTRAINT audit_events_chain_place UNIQUE (network_class, chain_seq);

CREATE TRIGGER audit_events_chain BEFORE INSERT ON audit_events
  FOR EACH ROW EXECUTE FUNCTION qtg_audit_chain();
CREATE TRIGGER audit_events_chain_heads AFTER INSERT ON audit_events
  FOR EACH STATEMENT EXECUTE FUNCTION qtg_audit_chain_heads();
