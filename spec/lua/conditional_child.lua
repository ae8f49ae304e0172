-- A child process of the conditional worker specs:
--   qtgd exec spec/lua/conditional_child.lua WORKER TICKS GOFILE RESULT_FILE
-- waits (polling, at most 30 s) until GOFILE exists ("-": no wait), so that
-- several children start their passes together, then ticks
-- qtg.workers.WORKER TICKS times on a fresh session each, as the runtime
-- does, and writes {ok, ticks, items, counts, process_id[, error]} to
-- RESULT_FILE (by rename).  Its settings come from its environment.
local qtg = require "qtg"
local canon = require "qtg.canon_json"

local worker, ticks, gofile, out = ...
ticks = tonumber(ticks)
assert(worker and ticks and gofile and out, "usage: conditional_child.lua WORKER TICKS GOFILE RESULT_FILE")

local function exists(p)
  local f = io.open(p, "r")
  if f then f:close() return true end
  return false
end

local function run()
  local w = require("qtg.workers." .. worker)
  if gofile ~= "-" then
    local deadline = qtg.monotonic() + 30
    while not exists(gofile) do
      if qtg.monotonic() > deadline then error("no go file " .. gofile) end
      qtg.sleep(0.01)
    end
  end
  local items, counts = 0, canon.array()
  for i = 1, ticks do
    local s = qtg.db.acquire()
    local ok, n = pcall(w.tick, s)
    if s:in_transaction() then s:rollback() end
    s:release()
    if not ok then error(n, 0) end
    counts[i] = n
    items = items + n
  end
  return { ok = true, ticks = ticks, items = items, counts = counts,
           process_id = require("qtg.heartbeats").process_id() }
end

local ok, res = pcall(run)
if not ok then res = { ok = false, error = tostring(res) } end
local f = assert(io.open(out .. ".tmp", "w"))
f:write(canon.encode(res))
f:close()
assert(os.rename(out .. ".tmp", out))
return ok and 0 or 1
