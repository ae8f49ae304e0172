-- tools/chaos.d/override/qtg/executors/sim.lua -- chaos only: the packaged
-- sim executor (lua/qtg/executors/sim.lua), loaded as is, with one kill
-- point.  qtgd finds this file first because the chaos scenarios run it
-- with MG_LUA_PATH=tools/chaos.d/override (the operator override directory,
-- docs/host-api.md).
--
-- Kill point "submit": after the sim's submit returned -- its ledger row is
-- written and committed on the sim's own session, as a provider's books
-- would be -- and before the dispatcher's transaction commits the node's
-- new state.  The process dies there (tools/chaos.d/hook.lua); the node is
-- READY again with the same attempt, and its resubmission carries the same
-- idempotency key, which the ledger absorbs (submit_count + 1).
local qtg = require "qtg"
local hook = dofile(qtg.root .. "/tools/chaos.d/hook.lua")
local sim = assert(loadfile(qtg.root .. "/lua/qtg/executors/sim.lua"))()

local submit = sim.submit
sim.submit = function(ctx, submission)
  local result = submit(ctx, submission)
  -- only where the ledger row was written (a refused submit writes none)
  if type(result) == "table" and result.status ~= "FAILED" then
    hook.maybe_die("submit", submission and submission.idempotency_key)
  end
  return result
end

return sim
