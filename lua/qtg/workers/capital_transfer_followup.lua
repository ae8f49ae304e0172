-- qtg.workers.capital_transfer_followup (spec section 12;
-- MG_CAPITAL_TRANSFER_FOLLOWUP_ENABLED, sidecar): follow up capital
-- transfers that went stale, advancing them from the state of the movement
-- request that carries them, or surfacing them to operators.
--
-- One pass, one transaction: claim up to BATCH transfers of this network
-- class, FOR UPDATE OF the transfer SKIP LOCKED, longest idle first:
--   * pending, untouched for MG_CAPITAL_TRANSFER_STALE_SECONDS, and
--   * surfaced ones whose movement has since finished;
-- and apply RULES, first match wins (the movement's request_state):
--   COMPLETED                              -> completed (advanced)
--   CANCELLED, REJECTED, EXPIRED           -> failed (advanced)
--   no movement request                    -> surfaced
--   FAILED, MANUAL_INTERVENTION, WAITING_MANUAL_ACTION -> surfaced
--   still in progress, MAX_QUIET_FOLLOWUPS follow-ups already -> surfaced
--   still in progress                      -> followups + 1, looked at
--                                             again after another stale period
-- Every decision is audited (actor system:capital_transfer_followup); a
-- surfacing also writes an operator notification and, with a movement, its
-- request_attention callback.  Nothing here calls a provider.
local qtg = require("qtg")
local notify = require("qtg.notifications")
local outbox = require("qtg.outbox")

local M = {}

M.BATCH = 20
M.WORKER = "capital_transfer_followup"
M.MAX_QUIET_FOLLOWUPS = 3

M.CLAIM_SQL = [[
SELECT t.*, r.request_state
  FROM capital_transfer_requests t
  LEFT JOIN movement_requests r ON r.id = t.movement_request_id
 WHERE t.network_class = $1
   AND ((t.status = 'pending' AND t.updated_at < now() - make_interval(secs => $2))
        OR (t.status = 'surfaced' AND r.request_state IN ('COMPLETED', 'CANCELLED', 'REJECTED', 'EXPIRED')))
 ORDER BY t.updated_at ASC, t.id ASC
 LIMIT $3
 FOR UPDATE OF t SKIP LOCKED]]

M.UPDATE_SQL = [[
UPDATE capital_transfer_requests
   SET status = $2, status_reason = $3, followups = followups + 1,
       last_followup_at = clock_timestamp(), updated_at = clock_timestamp(),
       surfaced_at = CASE WHEN $2 = 'surfaced' THEN clock_timestamp() ELSE surfaced_at END,
       settled_at = CASE WHEN $2 IN ('completed', 'failed') THEN clock_timestamp() ELSE settled_at END
 WHERE id = $1]]

local TERMINAL_FAILED = { CANCELLED = true, REJECTED = true, EXPIRED = true }
local NEEDS_OPERATOR = { FAILED = true, MANUAL_INTERVENTION = true, WAITING_MANUAL_ACTION = true }

-- decide(row) -> new status, reason.  Pure: row has status, followups and
-- request_state (NULL without a movement).
function M.decide(row)
  local st = row.request_state
  if st == qtg.db.NULL or st == nil then
    if row.movement_request_id == qtg.db.NULL or row.movement_request_id == nil then
      return "surfaced", "no movement request carries this transfer"
    end
    return "surfaced", "its movement request is missing"
  end
  if st == "COMPLETED" then return "completed", "movement request completed" end
  if TERMINAL_FAILED[st] then return "failed", "movement request " .. st end
  if row.status == "surfaced" then return "surfaced", "movement request " .. st end
  if NEEDS_OPERATOR[st] then return "surfaced", "movement request needs an operator (" .. st .. ")" end
  if row.followups >= M.MAX_QUIET_FOLLOWUPS then
    return "surfaced", string.format("movement request still %s after %d follow-ups", st, row.followups)
  end
  return "pending", "movement request still " .. st
end

function M.tick(s)
  local settings = qtg.settings
  -- a pipeline transaction (no BEGIN or COMMIT statement): an idle pass
  -- is its claim alone
  return s:pipeline_transaction(function()
    local rows = s:query(M.CLAIM_SQL, settings.network_class, settings.capital_transfer_stale_seconds, M.BATCH)
    for _, row in ipairs(rows) do
      local to, reason = M.decide(row)
      s:query(M.UPDATE_SQL, row.id, to, reason)
      local request_id = row.movement_request_id ~= qtg.db.NULL and row.movement_request_id or nil
      local detail = { transfer_id = row.id, from_status = row.status, to_status = to, reason = reason,
                       from_venue = row.from_venue, to_venue = row.to_venue, asset = row.asset,
                       amount = row.amount, movement_request_id = request_id }
      if to == "surfaced" and row.status ~= "surfaced" then
        notify.surface(s, { worker = M.WORKER, kind = "capital_transfer_surfaced",
          dedupe_key = "capital_transfer_surfaced:" .. row.id, entity_type = "capital_transfer_request",
          entity_id = row.id, request_id = request_id, data = detail })
      else
        outbox.audit(s, "system:" .. M.WORKER, "capital_transfer." .. (to == row.status and "followup" or to),
          "capital_transfer_request", row.id, request_id, detail)
      end
      qtg.log.info("capital transfer followed up", { worker = M.WORKER, transfer_id = row.id,
        from = row.status, to = to, reason = reason })
    end
    return #rows
  end)
end

return M
