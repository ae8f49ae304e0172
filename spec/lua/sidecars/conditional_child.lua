-- A child process of the conditional worker specs:
--   qtgd exec spec/lua/sidecars/conditional_child.lua WORKER TICKS GOFILE RESULT_FILE
-- waits (polling, at most 30 s) until GOFILE exists ("-": no wait), so that
-- several children start their passes together, then ticks
-- qtg.workers.WORKER TICKS times on a fresh session each, as the runtime
-- does, and writes {ok, ticks, items, counts, process_id[, error]} to
-- RESULT_FILE (by rename).  Its settings come from its environment.
local worker, ticks, gofile, out = ...
ticks = tonumber(ticks)
assert(worker and ticks and gofile and out, "usage: conditional_child.lua WORKER TICKS GOFILE RESULT_FILE")

local here = debug.getinfo(1, "S").source:match("^@(.*)$") or ""
package.path = (here:match("^(.*)/spec/lua/") or ".") .. "/?.lua;" .. package.path
local canon = require "qtg.canon_json"
local common = require "spec.lua.support.common"

local function run()
  require("qtg.workers." .. worker)
  if gofile ~= "-" then
    common.wait_for(function() return common.read(gofile) end, 30, "the go file " .. gofile, 0.01)
  end
  local items, counts = 0, canon.array()
  for i = 1, ticks do
    local n = common.tick(worker)
    counts[i] = n
    items = items + n
  end
  return { ok = true, ticks = ticks, items = items, counts = counts,
           process_id = require("qtg.heartbeats").process_id() }
end

return common.child_main(run, out)
