-- 0211_node_carried_key.sql -- the idempotency key a node's next submit
-- carries after an attempt that ended before its submit (docs/data-model.md,
-- "A replay that ends before its submit").
--
-- A dispatch whose transaction is lost after the provider's call (a crash,
-- a lost connection before the commit) leaves the node READY at the same
-- attempt_no, and its replay carries the same key (qtg:<node>:<attempt>),
-- which the provider deduplicates.  A replay that ends before its submit
-- (a preflight refusing what the lost call already spent, a setting changed
-- meanwhile, a signature refused) records the node FAILED with nothing sent
-- by it; an operator's retry then ran under a new attempt number, so a new
-- key, and the provider acted a second time.  The dispatcher writes the key
-- such an attempt would have carried here, and the next submit carries it;
-- the write of an attempt that reached its submit clears it.  NULL: the next
-- submit carries its own attempt's key.

ALTER TABLE movement_request_nodes ADD COLUMN carried_idempotency_key text
  CHECK (length(carried_idempotency_key) BETWEEN 1 AND 200);
