-- qtg.workers.audit_outbox_promoter (spec section 9): move audit_outbox rows
-- into audit_events, exactly once and in order, with any number of
-- processes running.
--
-- One pass = one transaction = one statement: the oldest BATCH outbox rows
-- are deleted and inserted into audit_events in outbox id order.  Exactly
-- once: the delete and the insert commit together, and audit_events.outbox_id
-- is UNIQUE.  In order, across processes: promotion is serialized by a row
-- lock on audit_promoter_turn (sql/0201); a process that does not get it
-- promotes nothing this pass (another one is promoting), so audit_events.id follows
-- the outbox order batch after batch.  (An outbox row whose writing
-- transaction commits late is promoted late; its outbox_id and created_at
-- still tell its true place.)

local M = {}

M.BATCH = 500

-- The statement lives in the database as qtg_audit_promote(batch)
-- (sql/0101): it runs with the owner role's rights, so the runtime role
-- needs no INSERT on audit_events.  It takes the row lock of
-- audit_promoter_turn (SKIP LOCKED; the runtime role cannot lock that row,
-- where an advisory lock was anyone's to hold) so passes of several
-- processes never interleave, and picks the batch in a MATERIALIZED CTE:
-- `id IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)` may be rescanned once
-- per outer row (a nested-loop semi join), each rescan skipping the rows
-- already deleted and locking the next, so the "batch" would grow to the
-- whole table.  The chain columns are written by audit_events' trigger
-- (sql/0100).
M.PROMOTE_SQL = "SELECT qtg_audit_promote($1) AS promoted"

-- promote(s, batch) -> rows promoted (0 while another process promotes).
function M.promote(s, batch)
  return s:query(M.PROMOTE_SQL, batch or M.BATCH)[1].promoted
end

function M.tick(s)
  -- one statement is its own transaction (the turn's lock is held for
  -- it): no BEGIN/COMMIT round trips, an idle pass costs one statement
  return M.promote(s, M.BATCH)
end

return M
