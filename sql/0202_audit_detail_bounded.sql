-- 0202_audit_detail_bounded.sql -- an audit outbox row's detail is at most
-- 1 MiB as stored (docs/security.md, "The audit trail").
--
-- The runtime role inserts audit rows' content (sql/0194: the id and the
-- time are the defaults').  One row whose detail was a string of 180 MB of
-- control characters (about 1 GB as JSON text, each escaped) made every
-- promotion run out of memory in the chain trigger, which hashes the row's
-- text: the row stayed first in the outbox, the runtime role may not delete
-- it, and no later row was promoted (an adversarial review, session 32).
-- No writer of the engine's comes near the bound: a console chunk is
-- recorded up to 64 KiB (128 KiB as hex), a request's documents are bounded
-- at 64 KiB.  pg_column_size reads the value's stored size, with no
-- conversion to text; JSON text escapes a byte to at most six, so a row's
-- text stays under 6 MiB.
ALTER TABLE audit_outbox
  ADD CONSTRAINT audit_outbox_detail_bounded CHECK (pg_column_size(detail) <= 1048576);
