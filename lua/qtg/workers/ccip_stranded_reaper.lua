-- qtg.workers.ccip_stranded_reaper (spec section 11;
-- MG_CCIP_STRANDED_REAPER_ENABLED, core group): a CCIP send intent that has
-- stayed unresolved (pending or sent) for MG_CCIP_STRANDED_AGE_SECONDS is
-- marked stranded and surfaced to operators: an audit row, a notification
-- (notification_outbox, kind ccip_intent_stranded) and, when the intent
-- belongs to a movement request, that request's request_attention callback.
--
-- One pass, one transaction: claim up to BATCH unresolved intents of this
-- network class past the age, oldest first, FOR UPDATE SKIP LOCKED (no
-- external call is made, so the locks are short), mark them, surface them,
-- commit.  A second pass finds nothing: stranded intents are no longer
-- claimed, and the dedupe key of the notification makes a surfacing
-- idempotent even if two passes raced.  An operator settles a stranded
-- intent with resolve() (status resolved, audited).
local qtg = require("qtg")
local notify = require("qtg.notifications")
local outbox = require("qtg.outbox")

local M = {}

M.BATCH = 50
M.WORKER = "ccip_stranded_reaper"

M.CLAIM_SQL = [[
SELECT * FROM ccip_send_intent
 WHERE network_class = $1 AND status IN ('pending', 'sent')
   AND created_at < now() - make_interval(secs => $2)
 ORDER BY created_at ASC, id ASC
 LIMIT $3
 FOR UPDATE SKIP LOCKED]]

M.MARK_SQL = [[
UPDATE ccip_send_intent
   SET status = 'stranded', stranded_at = clock_timestamp(), stranded_reason = $2,
       updated_at = clock_timestamp()
 WHERE id = $1]]

local function present(v)
  if v == nil or v == qtg.db.NULL then return nil end
  return v
end

function M.tick(s)
  local settings = qtg.settings
  local age = settings.ccip_stranded_age_seconds
  -- a pipeline transaction (no BEGIN or COMMIT statement): an idle pass
  -- is its claim alone
  return s:pipeline_transaction(function()
    local rows = s:query(M.CLAIM_SQL, settings.network_class, age, M.BATCH)
    for _, row in ipairs(rows) do
      local reason = string.format("unresolved (%s) for more than %d s", row.status, age)
      s:query(M.MARK_SQL, row.id, reason)
      notify.surface(s, {
        worker = M.WORKER, kind = "ccip_intent_stranded", severity = "critical",
        dedupe_key = "ccip_intent_stranded:" .. row.id,
        entity_type = "ccip_send_intent", entity_id = row.id, request_id = present(row.request_id),
        data = { intent_id = row.id, from_status = row.status, reason = reason,
                 message_id = present(row.message_id), source_tx_hash = present(row.source_tx_hash),
                 source_chain_selector = row.source_chain_selector,
                 dest_chain_selector = row.dest_chain_selector, created_at = row.created_at,
                 request_node_id = present(row.request_node_id) },
      })
      qtg.log.warn("ccip send intent stranded", { worker = M.WORKER, intent_id = row.id,
        request_id = present(row.request_id), message_id = present(row.message_id) })
    end
    return #rows
  end)
end

-- resolve(s, intent_id, actor, note): an operator settled a stranded intent.
function M.resolve(s, intent_id, actor, note)
  if type(actor) ~= "string" or actor == "" then error("ccip_stranded_reaper.resolve: actor is required", 2) end
  s:transaction(function()
    local row = s:query([[UPDATE ccip_send_intent SET status = 'resolved', resolved_by = $2,
                            updated_at = clock_timestamp()
                           WHERE id = $1::uuid AND status = 'stranded' RETURNING *]], intent_id, actor)[1]
    if not row then error("ccip_stranded_reaper.resolve: intent " .. tostring(intent_id) .. " is not stranded", 0) end
    outbox.audit(s, actor, "ccip_intent.resolve", "ccip_send_intent", row.id, present(row.request_id),
      { note = note })
  end)
end

return M
