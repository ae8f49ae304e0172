-- qtg prelude (src/lua_core.c runs it once qtg's C functions are registered;
-- it gets the qtg table): the wrappers over bindings that resume with a
-- value to unpack or raise, since LuaJIT has no lua_yieldk continuations.
local qtg = ...
local raw_sleep, raw_join, unpack = qtg.raw_sleep, qtg.raw_join, unpack
function qtg.sleep(s) local err = raw_sleep(s) if err ~= nil then error(err, 2) end end
function qtg.join(h) local r, err = raw_join(h) if r == nil then error(err, 2) end return r.ok, unpack(r, 1, r.n) end
local mt = debug.getregistry()['qtg.task']
mt.__index.join = qtg.join
