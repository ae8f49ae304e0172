-- 0110_claim_order_indexes.sql -- the pending partial indexes of the two
-- outboxes carry the claims' whole order (created_at, id), so a claim's
-- generic plan walks the index in order and stops at the first unlocked
-- row, instead of reading every pending row and sorting them to lock one
-- (docs/performance.md, "Plan-stable hot statements").
DROP INDEX movement_callback_outbox_pending;
CREATE INDEX movement_callback_outbox_pending ON movement_callback_outbox (created_at, id)
  WHERE status = 'pending';

DROP INDEX notification_outbox_pending;
CREATE INDEX notification_outbox_pending ON notification_outbox (network_class, created_at, id)
  WHERE status = 'pending';
