-- qtg.workers.expiration_checker (spec section 5): PENDING_APPROVAL requests
-- of this network class whose expires_at has passed move to EXPIRED.
--
-- One pass, one transaction: claim up to BATCH such requests FOR UPDATE SKIP
-- LOCKED (the spec's query: no ORDER BY), and for each, in that transaction,
-- with the engine's own writers (qtg.nodes, as reject and cancel do): its
-- nodes that never ran (BLOCKED, READY) go to CANCELLED, the request goes to
-- EXPIRED (finished_at, last_error_code APPROVAL_EXPIRED, empty frontier),
-- and a request_expired callback and the audit rows are written.
-- expires_at is set when a request is created (MG_APPROVAL_TTL_SECONDS after
-- it); a request without expires_at never expires.  An approval that commits
-- first wins: the request is then no longer PENDING_APPROVAL and not claimed.
local qtg = require("qtg")
local canon = require("qtg.canon_json")
local nodes = require("qtg.nodes")

local M = {}

M.BATCH = 20
M.ACTOR = "system:expiration_checker"
M.ERROR_CODE = "APPROVAL_EXPIRED"

M.CLAIM_SQL = [[
SELECT *
  FROM movement_requests
 WHERE request_state = 'PENDING_APPROVAL'
   AND expires_at IS NOT NULL
   AND expires_at < now()
   AND network_class = $1
 LIMIT $2
 FOR UPDATE SKIP LOCKED]]

local function expire(s, req)
  local expires_at = req.expires_at
  local g = nodes.load_all(s, req)
  local cancelled = 0
  for _, n in ipairs(g.nodes) do
    if n.node_state == "BLOCKED" or n.node_state == "READY" then
      nodes.set_node_state(s, g, n, { node_state = "CANCELLED", error_code = M.ERROR_CODE },
        M.ACTOR)
      cancelled = cancelled + 1
    end
  end
  nodes.set_request_state(s, req, "EXPIRED", M.ACTOR, {
    event = "request_expired", action = "request.expire",
    data = { reason = M.ERROR_CODE, expires_at = expires_at, cancelled_nodes = cancelled },
    fields = { current_frontier = canon.array(), last_error_code = M.ERROR_CODE },
  })
  qtg.log.info("request expired", { worker = "expiration_checker", request_id = req.id,
                                    expires_at = expires_at })
end

-- A pipeline transaction (no BEGIN or COMMIT statement): an idle pass is
-- its claim alone.
function M.tick(s)
  return s:pipeline_transaction(function()
    local rows = s:query(M.CLAIM_SQL, qtg.settings.network_class, M.BATCH)
    for _, req in ipairs(rows) do expire(s, req) end
    return #rows
  end)
end

return M
