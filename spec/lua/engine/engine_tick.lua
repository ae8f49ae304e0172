-- qtgd exec spec/lua/engine/engine_tick.lua WORKER [N]: run N ticks (default 1) of
-- one core worker in this process, with this process's settings (the engine
-- specs use it to run a worker under other MG_* settings).  Prints the total.
local name, n = ...
local here = debug.getinfo(1, "S").source:match("^@(.*)$") or ""
package.path = (here:match("^(.*)/spec/lua/") or ".") .. "/?.lua;" .. package.path
local common = require("spec.lua.support.common")
local total = 0
for _ = 1, tonumber(n) or 1 do total = total + common.tick(name) end
io.stdout:write(tostring(total), "\n")
return 0
