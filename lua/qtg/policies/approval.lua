-- qtg.policies.approval: who must approve a movement request.  An operator
-- overrides this file by putting its own qtg/policies/approval.lua under
-- MG_LUA_PATH; `qtgd check` validates it and reload() / SIGHUP reloads it
-- (a module that fails to load or validate keeps the old one running).
--
-- An ordered list of rules: the first whose `match` holds decides; no match
-- is a refusal (default deny).  The grammar (docs/approvals.md):
--   match = { template_key =, network_class =, asset =   (a value or a list),
--             amount_at_least = "decimal", amount_below = "decimal",
--             destination_in = "address_book", destination_not_in = "address_book",
--             initiator = actor or list, initiator_role = role,
--             velocity = { window_seconds =, over = "decimal", per_destination = bool },
--             when = function(request, inputs) -> boolean   (any other test, in Lua) }
--   action = P.allow() | P.require{ approvals = N, roles = { ... } } | P.block{ reason = "..." }
-- destination_in holds when EVERY destination the plan pays is in the
-- address book (for the asset, on the request's chain), destination_not_in
-- when one is not.  The velocity clause holds when the amounts of this
-- asset approved in the window and not cancelled, rejected or expired, plus
-- this request's amount, exceed `over` (per_destination: summed for each
-- destination the plan pays; any one crossing holds it).
local P = require "qtg.approvals"

return {
  -- address book changes need this many admins besides the proposer
  address_book = { approvals = 2 },
  rules = {
    { name = "two_approvers_from_100k",
      match = { amount_at_least = "100000" },
      action = P.require{ approvals = 2, roles = { "approve" } } },
    { name = "two_approvers_over_1m_per_day",
      match = { network_class = "mainnet",
                velocity = { window_seconds = 86400, over = "1000000" } },
      action = P.require{ approvals = 2, roles = { "approve" } } },
    { name = "one_approver",
      match = {},
      action = P.require{ approvals = 1, roles = { "approve" } } },
  },
}
