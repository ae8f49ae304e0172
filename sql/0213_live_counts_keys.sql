-- 0213_live_counts_keys.sql -- two keys for counting what is live without
-- reading the history (qtg.api.metrics: every /metrics gauge reads its
-- rows through partial indexes; plans_spec checks).
--
-- The requests that wait on a person (a manual step, the operator, a
-- retry after a failure), by network class.  The other live request
-- states have their claim indexes already (PENDING_APPROVAL:
-- movement_requests_pending_expiry; APPROVED and EXECUTING:
-- movement_requests_dispatchable); these three had none, so counting them
-- read every request ever made.  A request enters this index only when it
-- stops for someone: the engine's path through a node writes no more.
CREATE INDEX movement_requests_held ON movement_requests (network_class)
  WHERE request_state IN ('WAITING_MANUAL_ACTION', 'MANUAL_INTERVENTION', 'FAILED');

-- The copies an operator's redelivery made, by the dead letter they copy
-- (movement_callback_outbox_one_redelivery holds only the pending ones):
-- whether a dead letter was redelivered is one probe, not a read of the
-- whole outbox.  Only a redelivery writes here.
CREATE INDEX movement_callback_outbox_redelivered ON movement_callback_outbox (redelivery_of)
  WHERE redelivery_of IS NOT NULL;
