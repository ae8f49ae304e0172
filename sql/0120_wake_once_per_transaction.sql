-- 0120_wake_once_per_transaction.sql -- a transaction sends at most one
-- wake-up NOTIFY, naming every worker it woke (docs/performance.md,
-- "Wake-ups"; lua/qtg/wakeups.lua reads it).
--
-- 0030 notified from each waking row: PostgreSQL folds identical payloads,
-- but a dispatch still sent three (the observer, the callback dispatcher,
-- the audit promoter), each a queue entry and a message to every listener.
-- Now the row triggers add their payload (a "token": "node_dispatcher",
-- "node_observer:4.9") to a set kept in a transaction-local setting, and
-- deferred triggers on the same rows send that set once, as the commit
-- begins: one NOTIFY whose payload is the tokens joined by spaces,
-- "node_observer:4.9 callback_dispatcher audit_outbox_promoter".  The first
-- deferred trigger sends and empties the set; the rest find it empty.  A
-- rolled-back savepoint takes its tokens with it (the setting is
-- transaction-local, and its deferred events are dropped with it).
--
-- A payload stays under PostgreSQL's 8000 bytes: past MAX_PENDING characters
-- a token with a delay is left out (its worker's polling finds the work; a
-- lost wake-up costs latency, never work), and the tokens without one, at
-- most one per worker, always fit.
--
-- The dispatcher is no longer woken for a manual node becoming READY: it
-- never claims those (an operator completes them), so the pass would find
-- nothing.

CREATE FUNCTION qtg_wake_add(token text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  pending text := coalesce(current_setting('qtg_wake.pending', true), '');
BEGIN
  IF pending = '' THEN
    PERFORM set_config('qtg_wake.pending', token, true);
  ELSIF position(' ' || token || ' ' IN ' ' || pending || ' ') = 0
        AND (length(pending) < 7000 OR position(':' IN token) = 0) THEN
    PERFORM set_config('qtg_wake.pending', pending || ' ' || token, true);
  END IF;
END $$;

CREATE FUNCTION qtg_wake_send() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  pending text := coalesce(current_setting('qtg_wake.pending', true), '');
BEGIN
  IF pending <> '' THEN
    PERFORM pg_notify('qtg_wake', pending);
    PERFORM set_config('qtg_wake.pending', '', true);
  END IF;
  RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION qtg_wake_now() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM qtg_wake_add(TG_ARGV[0]);
  RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION qtg_wake_observer() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM qtg_wake_add(qtg_wake_payload('node_observer', NEW.next_observe_at));
  RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION qtg_wake_callback() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM qtg_wake_add(qtg_wake_payload('callback_dispatcher', NEW.next_attempt_at));
  RETURN NULL;
END $$;

-- node_dispatcher: a node it can claim becomes READY (not a manual one).
DROP TRIGGER qtg_wake_ready_ins ON movement_request_nodes;
DROP TRIGGER qtg_wake_ready_upd ON movement_request_nodes;
CREATE TRIGGER qtg_wake_ready_ins AFTER INSERT ON movement_request_nodes
  FOR EACH ROW WHEN (NEW.node_state = 'READY' AND NEW.action_type NOT LIKE 'manual\_%')
  EXECUTE FUNCTION qtg_wake_now('node_dispatcher');
CREATE TRIGGER qtg_wake_ready_upd AFTER UPDATE OF node_state ON movement_request_nodes
  FOR EACH ROW WHEN (NEW.node_state = 'READY' AND OLD.node_state <> 'READY'
                     AND NEW.action_type NOT LIKE 'manual\_%')
  EXECUTE FUNCTION qtg_wake_now('node_dispatcher');

-- The sending triggers: deferred to the commit, on every row whose change
-- may have added a token (their conditions cover the adding triggers'; a
-- row that added none finds the set empty or already sent).
CREATE CONSTRAINT TRIGGER qtg_wake_send_node AFTER INSERT OR UPDATE ON movement_request_nodes
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW WHEN (NEW.node_state IN ('READY', 'SUBMITTED', 'OBSERVING'))
  EXECUTE FUNCTION qtg_wake_send();
CREATE CONSTRAINT TRIGGER qtg_wake_send_callback AFTER INSERT OR UPDATE ON movement_callback_outbox
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW WHEN (NEW.status = 'pending')
  EXECUTE FUNCTION qtg_wake_send();
CREATE CONSTRAINT TRIGGER qtg_wake_send_audit AFTER INSERT ON audit_outbox
  DEFERRABLE INITIALLY DEFERRED
  FOR EACH ROW
  EXECUTE FUNCTION qtg_wake_send();
