-- 0030_wakeups.sql -- NOTIFY wake-ups for the workers (issue 8;
-- docs/performance.md, lua/qtg/wakeups.lua).
--
-- One channel, qtg_wake.  The payload names the worker to wake, and when the
-- work becomes due later than now, after a colon the seconds until then
-- (rounded up to 0.1 s):  "node_dispatcher", "node_observer:4.9".
--   node READY (inserted or updated into it)      -> node_dispatcher
--   node SUBMITTED/OBSERVING, or its
--     next_observe_at changed                     -> node_observer[:delay]
--   callback row pending (queued, or rescheduled) -> callback_dispatcher[:delay]
--   audit row queued                              -> audit_outbox_promoter
-- A NOTIFY is delivered when its transaction commits, and PostgreSQL folds
-- identical (channel, payload) pairs of one transaction into one, so a
-- transaction that readies ten nodes sends one "node_dispatcher".
-- Nothing here decides anything: a process with wake-ups off (or no process
-- listening) loses nothing, the workers' polling finds the same rows.
-- The triggers fire for every network class; a process woken for another
-- class's row makes one empty pass.

CREATE FUNCTION qtg_wake_now() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('qtg_wake', TG_ARGV[0]);
  RETURN NULL;
END $$;

-- qtg_wake_payload(worker, due): "worker" when due is NULL or past, else
-- "worker:<seconds until due, rounded up to 0.1>".
CREATE FUNCTION qtg_wake_payload(worker text, due timestamptz) RETURNS text
LANGUAGE sql STABLE AS $$
  SELECT CASE WHEN due IS NULL OR due <= clock_timestamp() THEN worker
              ELSE worker || ':' ||
                   (ceil(extract(epoch FROM due - clock_timestamp()) * 10) / 10)::numeric(12, 1)::text
         END
$$;

CREATE FUNCTION qtg_wake_observer() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('qtg_wake', qtg_wake_payload('node_observer', NEW.next_observe_at));
  RETURN NULL;
END $$;

CREATE FUNCTION qtg_wake_callback() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('qtg_wake', qtg_wake_payload('callback_dispatcher', NEW.next_attempt_at));
  RETURN NULL;
END $$;

-- node_dispatcher: a node becomes READY.
CREATE TRIGGER qtg_wake_ready_ins AFTER INSERT ON movement_request_nodes
  FOR EACH ROW WHEN (NEW.node_state = 'READY')
  EXECUTE FUNCTION qtg_wake_now('node_dispatcher');
CREATE TRIGGER qtg_wake_ready_upd AFTER UPDATE OF node_state ON movement_request_nodes
  FOR EACH ROW WHEN (NEW.node_state = 'READY' AND OLD.node_state <> 'READY')
  EXECUTE FUNCTION qtg_wake_now('node_dispatcher');

-- node_observer: a node enters SUBMITTED/OBSERVING, or its observe time moves.
CREATE TRIGGER qtg_wake_observe_upd AFTER UPDATE OF node_state, next_observe_at ON movement_request_nodes
  FOR EACH ROW WHEN (NEW.node_state IN ('SUBMITTED', 'OBSERVING')
                     AND (OLD.node_state IS DISTINCT FROM NEW.node_state
                          OR OLD.next_observe_at IS DISTINCT FROM NEW.next_observe_at))
  EXECUTE FUNCTION qtg_wake_observer();

-- callback_dispatcher: a row is queued, or rescheduled for a retry.
CREATE TRIGGER qtg_wake_callback_ins AFTER INSERT ON movement_callback_outbox
  FOR EACH ROW WHEN (NEW.status = 'pending')
  EXECUTE FUNCTION qtg_wake_callback();
CREATE TRIGGER qtg_wake_callback_upd AFTER UPDATE OF status, next_attempt_at ON movement_callback_outbox
  FOR EACH ROW WHEN (NEW.status = 'pending'
                     AND (OLD.status IS DISTINCT FROM NEW.status
                          OR OLD.next_attempt_at IS DISTINCT FROM NEW.next_attempt_at))
  EXECUTE FUNCTION qtg_wake_callback();

-- audit_outbox_promoter: audit rows queued (once per statement).
CREATE TRIGGER qtg_wake_audit AFTER INSERT ON audit_outbox
  FOR EACH STATEMENT EXECUTE FUNCTION qtg_wake_now('audit_outbox_promoter');
