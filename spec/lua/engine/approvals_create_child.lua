-- A child process of spec/lua/engine/approvals_spec.lua:
--   qtgd exec spec/lua/engine/approvals_create_child.lua TEMPLATE ASSET AMOUNT GATE HOLD RESULT_FILE
-- waits for GATE_FILE (so two children start together), creates a request
-- of TEMPLATE moving AMOUNT of ASSET under a policy that allows below 80
-- unless the asset's approved amount over a day would exceed 100 (then 2
-- approvers), and holds its transaction open HOLD seconds before
-- committing, so two creates overlap.  Writes {ok, id, state, error} to
-- RESULT_FILE.
local template, asset, amount, gate, hold, out = ...
assert(template and asset and amount and gate and hold and out,
  "usage: approvals_create_child.lua TEMPLATE ASSET AMOUNT GATE HOLD RESULT")

local here = debug.getinfo(1, "S").source:match("^@(.*)$") or ""
package.path = (here:match("^(.*)/spec/lua/") or ".") .. "/?.lua;" .. package.path
local common = require "spec.lua.support.common"
local P = require "qtg.approvals"

package.loaded["qtg.policies.approval"] = { rules = {
  { name = "velocity_two", match = { velocity = { window_seconds = 86400, over = "100" } },
    action = P.require{ approvals = 2, roles = { "approve" } } },
  { name = "petty", match = { amount_below = "80" }, action = P.allow() },
  { name = "rest", match = {}, action = P.require{ approvals = 1, roles = { "approve" } } },
} }

local function run()
  local ok, req = common.gated_transaction(gate, hold, function(s)
    return require("qtg.requests").create(s, { template_key = template,
      intent = { asset = asset, amount = amount }, idempotency_key = "create-child-" .. common.uid("k", 8) },
      "console:spec-create-child")
  end)
  return { ok = true, created = ok, id = ok and req.id or nil, state = ok and req.request_state or nil,
           error = not ok and tostring(req) or nil }
end

return common.child_main(run, out)
