-- tools/chaos.d/override/qtg/workers/callback_dispatcher.lua -- chaos only:
-- the packaged callback_dispatcher (lua/qtg/workers/callback_dispatcher.lua),
-- loaded as is, with one kill point (found first through MG_LUA_PATH, see
-- override/qtg/executors/sim.lua).
--
-- Kill point "callback": a callback POST got its answer from the receiver
-- (the receiver has it) and the dispatcher's transaction, which holds the
-- outbox row and would mark it delivered, has not committed.  The process
-- dies there; the row is still pending and a later pass sends it again with
-- the same nonce, which the receiver uses to deduplicate.
local qtg = require "qtg"
local hook = dofile(qtg.root .. "/tools/chaos.d/hook.lua")

local request = qtg.http.request
qtg.http.request = function(args)
  local resp, err = request(args)
  local nonce = type(args) == "table" and type(args.headers) == "table"
    and args.headers["X-QTG-Callback-Nonce"]
  if nonce and resp then hook.maybe_die("callback", nonce) end
  return resp, err
end

return assert(loadfile(qtg.root .. "/lua/qtg/workers/callback_dispatcher.lua"))()
