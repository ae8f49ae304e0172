-- qtg.workers.template_proposal_expiration (spec section 8): PENDING template
-- proposals whose review window (expires_at) has passed become EXPIRED, up
-- to BATCH per pass, oldest deadline first, FOR UPDATE SKIP LOCKED, each with
-- its audit row in the same transaction (qtg.proposals.expire_due).
local qtg = require("qtg")
local proposals = require("qtg.proposals")

local M = {}

M.BATCH = 50

-- A pipeline transaction (no BEGIN or COMMIT statement): an idle pass is
-- its one statement.
function M.tick(s)
  local rows = s:pipeline_transaction(proposals.expire_due, s, M.BATCH)
  for _, row in ipairs(rows) do
    qtg.log.info("template proposal expired", { worker = "template_proposal_expiration",
      proposal_id = row.id, template_key = row.template_key })
  end
  return #rows
end

return M
