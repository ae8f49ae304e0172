-- A child process of spec/lua/engine/approvals_spec.lua:
--   qtgd exec spec/lua/engine/approvals_child.lua REQUEST_ID APPROVER GATE_FILE HOLD RESULT_FILE
-- waits for GATE_FILE (so two children start together), approves the
-- request as operator:APPROVER under a velocity policy (over 1000 a day
-- blocks) and holds its transaction open HOLD seconds before committing, so
-- two approvals overlap.  Writes {ok, approved, error} to RESULT_FILE.
local id, approver, gate, hold, out = ...
assert(id and approver and gate and hold and out, "usage: approvals_child.lua ID APPROVER GATE HOLD RESULT")

local here = debug.getinfo(1, "S").source:match("^@(.*)$") or ""
package.path = (here:match("^(.*)/spec/lua/") or ".") .. "/?.lua;" .. package.path
local common = require "spec.lua.support.common"
local P = require "qtg.approvals"

package.loaded["qtg.policies.approval"] = { rules = {
  { name = "day_cap", match = { velocity = { window_seconds = 86400, over = "1000" } },
    action = P.block{ reason = "over 1000 a day" } },
  { name = "rest", match = {}, action = P.require{ approvals = 1, roles = { "approve" } } },
} }

local function run()
  local ok, err = common.gated_transaction(gate, hold, function(s)
    return require("qtg.requests").approve(s, id,
      { actor = "operator:" .. approver, kind = "operator", name = approver, roles = { "approve" } })
  end)
  return { ok = true, approved = ok, error = not ok and tostring(err) or nil }
end

return common.child_main(run, out)
