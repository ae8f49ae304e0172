-- globals_spec: the policy scripts (lua/) and the host's prelude
-- (src/prelude/) read no global but the standard library's and set none
-- ("locals only"), read from LuaJIT's own bytecode listing (`luajit -bl`,
-- GGET and GSET).  A misspelt local, or a `local function` called above
-- its definition, reads a global that is nil, and fails only when that
-- line runs: in a path a spec may never take (a re-dispatch after a crash).
local sup -- spec/lua/support/host.lua
local q = require("spec.lua.support.common").quote

-- The globals LuaJIT 2.1 defines (5.1's base library, its modules, bit,
-- jit) and arg, which `qtgd exec` sets.
local STANDARD = {}
for name in ([[_G _VERSION arg assert bit collectgarbage coroutine debug error gcinfo getfenv
               getmetatable io ipairs jit load loadfile loadstring math module newproxy next os
               package pairs pcall print rawequal rawget rawset require select setfenv
               setmetatable string table tonumber tostring type unpack xpcall]]):gmatch("%S+") do
  STANDARD[name] = true
end

-- globals(path) -> { {op=, name=}... } of the chunk at path, or raises.
local function globals(path)
  local p = assert(io.popen("luajit -bl " .. q(path) .. " 2>&1"))
  local listing = p:read("*a")
  local ok = p:close()
  assert(ok and listing:find("BYTECODE", 1, true), "luajit -bl " .. path .. ": " .. listing)
  local out = {}
  for op, name in listing:gmatch("(G[GS]ET)%s[^\n]-; \"([^\"]*)\"") do
    out[#out + 1] = { op = op, name = name }
  end
  return out
end

-- The uses that break the rule, as "path: GGET name" lines.
local function strays(path)
  local bad = {}
  for _, g in ipairs(globals(path)) do
    if g.op == "GSET" or not STANDARD[g.name] then bad[#bad + 1] = path .. ": " .. g.op .. " " .. g.name end
  end
  return bad
end

describe("the Lua under lua/ and src/prelude/", function()
  setup(function() sup = require "spec.lua.support.host" end)

  it("is read as the rule means: a global read or written is found", function()
    local dir = sup.tmpdir()
    local path = dir .. "/stray.lua"
    sup.write(path, "local M = {}\nfunction M.a() return later(1) end\nlocal function later(x) return x end\n"
      .. "counter = 0\nreturn M\n")
    local bad = strays(path)
    table.sort(bad)
    assert.same({ path .. ": GGET later", path .. ": GSET counter" }, bad)
    os.execute("rm -rf " .. q(dir))
  end)

  it("reads no global but the standard library's, and sets none", function()
    local p = assert(io.popen("find " .. q(sup.root .. "/lua") .. " " .. q(sup.root .. "/src/prelude")
      .. " -name '*.lua' -type f | sort"))
    local files = {}
    for line in p:lines() do files[#files + 1] = line end
    p:close()
    assert.is_true(#files > 50, "found only " .. #files .. " Lua files")
    local bad = {}
    for _, path in ipairs(files) do
      for _, b in ipairs(strays(path)) do bad[#bad + 1] = b end
    end
    assert.same({}, bad)
  end)
end)
