-- qtg.workers.audit_outbox_promoter (spec section 9): move audit_outbox rows
-- into audit_events, exactly once and in order, with any number of
-- processes running.
--
-- One pass = one transaction = one statement: the oldest BATCH outbox rows
-- are deleted and inserted into audit_events in outbox id order.  Exactly
-- once: the delete and the insert commit together, and audit_events.outbox_id
-- is UNIQUE.  In order, across processes: promotion is serialized by a
-- transaction-scoped advisory lock; a process that does not get it promotes
-- nothing this pass (another one is promoting), so audit_events.id follows
-- the outbox order batch after batch.  (An outbox row whose writing
-- transaction commits late is promoted late; its outbox_id and created_at
-- still tell its true place.)
--
-- The tick also flushes this process's worker heartbeats, at most once every
-- qtg.heartbeats.FLUSH_EVERY seconds: this worker ticks every second in
-- every process, so liveness stays fresh without a write per tick per worker.
local qtg = require("qtg")
local heartbeats = require("qtg.heartbeats")

local M = {}

M.BATCH = 500
-- The advisory lock key: hashtext('qtg.audit_outbox_promoter'), computed by
-- PostgreSQL so every process agrees.
--
-- The batch is picked in a MATERIALIZED CTE, never in `id IN (SELECT ...
-- LIMIT $1 FOR UPDATE SKIP LOCKED)`: a plan may rescan such a subquery once
-- per outer row (a nested-loop semi join), and each rescan skips the rows
-- this statement has already deleted and locks the next ones, so the
-- "batch" grows to the whole table.  A CTE is computed once.
M.PROMOTE_SQL = [[
WITH lock AS (
  SELECT pg_try_advisory_xact_lock(hashtext('qtg.audit_outbox_promoter')) AS held
), picked AS MATERIALIZED (
  SELECT o.id FROM audit_outbox o, lock
   WHERE lock.held
   ORDER BY o.id
   LIMIT $1
   FOR UPDATE OF o SKIP LOCKED
), moved AS (
  DELETE FROM audit_outbox a USING picked p
   WHERE a.id = p.id
  RETURNING a.*
)
INSERT INTO audit_events
  (outbox_id, actor, action, entity_type, entity_id, request_id, detail, created_at, promoted_at)
SELECT id, actor, action, entity_type, entity_id, request_id, detail, created_at,
       clock_timestamp()
  FROM moved
 ORDER BY id]]

function M.tick(s)
  -- one statement is its own transaction (the advisory lock is held for
  -- it): no BEGIN/COMMIT round trips, an idle pass costs one statement
  local _, promoted = s:query(M.PROMOTE_SQL, M.BATCH)
  heartbeats.maybe_flush(s)
  return promoted or 0
end

return M
