-- tools/chaos.d/run.lua SCENARIO -- run one chaos scenario inside `qtgd exec`
-- (tools/chaos calls it once per scenario, each in a fresh database).  The
-- scenario module (tools/chaos.d/<scenario>.lua) returns {run = fn(lib)}; its
-- result line ("RESULT {json}") and <work>/result.json are written by
-- lib.result.  Whatever happens, every process it started is stopped.
local qtg = require "qtg"
local name = ...
-- the tree (this file's path up to /tools/) on the path, for
-- spec/lua/support/common.lua
local tree = debug.getinfo(1, "S").source:match("^@(.*)/tools/") or "."
package.path = package.path .. ";" .. tree .. "/?.lua"
if not name then
  io.stderr:write("usage: qtgd exec tools/chaos.d/run.lua SCENARIO\n")
  return 2
end
local lib = dofile(tree .. "/tools/chaos.d/lib.lua")
local path = tree .. "/tools/chaos.d/" .. name:gsub("-", "_") .. ".lua"
local scenario = assert(loadfile(path))()
local t0 = qtg.monotonic()
local ok, rc = xpcall(scenario.run, function(e)
  return debug.traceback(type(e) == "table" and (tostring(e.message) .. " (" .. tostring(e.kind) .. ")") or tostring(e), 2)
end, lib)
if not ok then
  lib.fail("the scenario raised: %s", tostring(rc))
  rc = lib.result(name, {}, { seconds = math.floor(qtg.monotonic() - t0) })
end
lib.stop_all("KILL")
lib.release()
return rc
