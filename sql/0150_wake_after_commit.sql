-- 0150_wake_after_commit.sql -- qtgd's own transactions hand their wake-up
-- to qtgd instead of NOTIFYing (docs/performance.md, "Wake-ups after the
-- commit"; src/qtg_pg.c, "After-commit notifications").
--
-- A NOTIFY holds PostgreSQL's notification lock (one per database) from the
-- start of its transaction's commit to its end, WAL flush included: every
-- transaction that notifies commits alone, one flush after the other, where
-- transactions that do not share flushes (group commit).  Nearly all of
-- qtg's write transactions wake a worker, so on a durable cluster they
-- queued behind each other's flushes.
--
-- The pool sessions of a qtgd that has started wake-ups set qtg.notify =
-- 'after_commit' (a connection option).  For them the sending trigger
-- raises the payload as a NOTICE
-- "qtg_after_commit qtg_wake <payload>"; qtgd keeps it with the open
-- transaction, and once the transaction has committed wakes its own workers
-- and sends on, as a NOTIFY in a transaction of its own that does not wait
-- for its flush, what other processes must hear (lua/qtg/wakeups.lua).  A
-- transaction that rolls back or fails hands nothing on, as a NOTIFY would
-- not be sent.  Every other session (qtgd exec, psql, a migration, another
-- tool) NOTIFYs as before.
CREATE OR REPLACE FUNCTION qtg_wake_send() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  pending text := coalesce(current_setting('qtg_wake.pending', true), '');
BEGIN
  IF pending <> '' THEN
    IF current_setting('qtg.notify', true) = 'after_commit' THEN
      RAISE NOTICE 'qtg_after_commit qtg_wake %', pending;
    ELSE
      PERFORM pg_notify('qtg_wake', pending);
    END IF;
    PERFORM set_config('qtg_wake.pending', '', true);
  END IF;
  RETURN NULL;
END $$;
