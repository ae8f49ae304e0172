-- qtg.api.ownership: what a token of scope own may reach (sql/0191,
-- docs/api.md "Authentication and roles").
--
-- A token's roles apply to its network class; a token of scope own reaches
-- only the requests its own client created (created_by = its actor).  Each
-- route says how its target is found (qtg.api.routes, `owned`):
--   "request"   {id} is a request id      "node"  {id} is a node id
--   "callback"  {id} is a callback row id
--   "filtered"  the handler keeps to owner(principal)'s requests (the
--               lists, bulk redelivery, the approvals inbox) or makes one
--               of them (create)
--   "self"      about the token or the API itself (/v3/me, the API
--               document, the templates a request may name)
--   (none)      about the whole class (balances, signers, workers,
--               heartbeats, readiness, metrics): refused
-- Another client's request is "does not exist", as a request that does not
-- exist is: a token learns nothing of requests that are not its own.
local qtg = require "qtg"
local problem = require "qtg.api.problem"

local M = {}

local UUID = "^%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x$"

-- How each kind of target is found, and its owner read: {pattern, sql}.
M.TARGETS = {
  request = { UUID, [[SELECT created_by FROM movement_requests
                       WHERE id = $1::uuid AND network_class = $2]] },
  node = { UUID, [[SELECT r.created_by FROM movement_request_nodes n
                     JOIN movement_requests r ON r.id = n.request_id
                    WHERE n.id = $1::uuid AND r.network_class = $2]] },
  callback = { "^%d%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?%d?$", [[
    SELECT r.created_by FROM movement_callback_outbox o JOIN movement_requests r ON r.id = o.request_id
     WHERE o.id = $1::bigint AND r.network_class = $2]] },
}

-- owner(principal) -> the actor whose requests a handler keeps to, or nil
-- (every request of the class).
function M.owner(principal)
  return principal.own and principal.actor or nil
end

-- check(s, route, params, principal): nothing for a token of scope class;
-- for one of scope own, raises forbidden for a route about the whole class
-- and not_found for a target that is not its own request's.
function M.check(s, route, params, principal)
  if not principal.own then return end
  local how = route.owned
  if how == "filtered" or how == "self" then return end
  local target = M.TARGETS[how]
  if not target then
    problem.raise("forbidden", "token %s reaches its own requests only (scope own); %s %s is about the "
      .. "whole network class", principal.name, route.method, route.path)
  end
  local id = params.id
  local row = type(id) == "string" and id:match(target[1])
    and s:query(target[2], id:lower(), qtg.settings.network_class)[1]
  if not row or row.created_by ~= principal.actor then
    problem.raise("not_found", "%s %s does not exist", how, tostring(id))
  end
end

return M
