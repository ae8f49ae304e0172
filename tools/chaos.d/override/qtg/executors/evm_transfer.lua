-- tools/chaos.d/override/qtg/executors/evm_transfer.lua -- chaos only: the
-- packaged evm_transfer executor (lua/qtg/executors/evm_transfer.lua),
-- loaded as is, with one kill point (see override/qtg/executors/sim.lua for
-- how the override directory is found).
--
-- Kill point "broadcast": after submit sent the signed transaction to the
-- chain (eth_sendRawTransaction answered) and before the dispatcher's
-- transaction commits the node's new state.  The process dies there
-- (tools/chaos.d/hook.lua); the node is READY again at the same attempt,
-- its reservation holds the signed bytes, and the next dispatch sends the
-- same bytes again (the chain knows them, or has mined them): the value
-- must arrive once.
local qtg = require "qtg"
local hook = dofile(qtg.root .. "/tools/chaos.d/hook.lua")
local evm = assert(loadfile(qtg.root .. "/lua/qtg/executors/evm_transfer.lua"))()

local submit = evm.submit
evm.submit = function(ctx, submission)
  local result = submit(ctx, submission)
  if type(result) == "table" and result.status == "SUBMITTED" and ctx.action_type == evm.TRANSFER then
    hook.maybe_die("broadcast", ctx.request_node_id)
  end
  return result
end

return evm
