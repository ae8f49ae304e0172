-- 0002_sim_ledger.sql -- the ledger of the sim executor (lua/qtg/executors/sim.lua).
-- The sim stands in for a provider: every submit it accepts is one row here,
-- keyed by the submit's idempotency key and written on the sim's own session
-- (committed independently of the dispatch transaction, as a real provider's
-- books would be).  A resubmission with the same key is deduplicated: it only
-- bumps submit_count.  No foreign key to movement_request_nodes on purpose:
-- the dispatcher holds the node row FOR UPDATE while it submits, and a foreign
-- key check from the sim's session would wait on that lock.
CREATE TABLE sim_ledger (
  idempotency_key  text PRIMARY KEY,
  request_node_id  uuid NOT NULL,
  attempt_no       int NOT NULL,
  action_type      text NOT NULL,
  side_effect      boolean NOT NULL DEFAULT false,
  submit_count     int NOT NULL DEFAULT 1,
  observe_count    int NOT NULL DEFAULT 0,
  created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX sim_ledger_node ON sim_ledger (request_node_id, attempt_no);
