-- 0032_wake_payload_volatile.sql -- qtg_wake_payload (0030_wakeups.sql) reads
-- clock_timestamp(), so it is volatile, not STABLE as 0030 declared it: a
-- STABLE function may be evaluated once for many rows of a statement, and
-- then the "seconds until due" of a later row would be computed from a
-- stale clock.  Declared as what it is.
ALTER FUNCTION qtg_wake_payload(text, timestamptz) VOLATILE;
