-- A child process of the sidecar specs:
--   qtgd exec spec/lua/sidecars/sidecar_child.lua WORKER SECONDS MODE RESULT_FILE
-- ticks qtg.workers.WORKER on a fresh session each time, as the runtime does,
-- and writes {ok, ticks, items, process_id[, error]} to RESULT_FILE (by
-- rename, so the parent never reads half a file).  MODE:
--   once   one tick
--   drain  until no callback row of this network class is pending
--   ff     like drain, and after each tick every pending row of this class is
--          made due at once ("fast-forward": the stored schedule is asserted
--          on movement_callback_attempts, not on the wall clock)
--   audit  until audit_outbox is empty
-- The process's settings (network class, callback key, signer keys, timeout)
-- come from its environment, which the spec sets.
local worker, seconds, mode, out = ...
seconds = tonumber(seconds)
assert(worker and seconds and mode and out, "usage: sidecar_child.lua WORKER SECONDS MODE RESULT_FILE")

local here = debug.getinfo(1, "S").source:match("^@(.*)$") or ""
package.path = (here:match("^(.*)/spec/lua/") or ".") .. "/?.lua;" .. package.path
local qtg = require "qtg"
local common = require "spec.lua.support.common"

local PENDING_SQL = [[
SELECT count(*)::int AS n FROM movement_callback_outbox c
  JOIN movement_requests r ON r.id = c.request_id
 WHERE r.network_class = $1 AND c.status = 'pending']]
local FAST_FORWARD_SQL = [[
UPDATE movement_callback_outbox c SET next_attempt_at = now()
  FROM movement_requests r
 WHERE r.id = c.request_id AND r.network_class = $1 AND c.status = 'pending'
   AND c.next_attempt_at > now()]]

local function run()
  require("qtg.workers." .. worker)
  local class = qtg.settings.network_class
  local deadline = qtg.monotonic() + seconds
  local ticks, items = 0, 0
  repeat
    local n = common.tick(worker)
    ticks, items = ticks + 1, items + n
    if mode == "once" then break end
    if mode == "ff" then common.query(FAST_FORWARD_SQL, class) end
    local left = mode == "audit" and common.query("SELECT count(*)::int AS n FROM audit_outbox")[1].n
      or common.query(PENDING_SQL, class)[1].n
    if left == 0 then break end
    if n == 0 then qtg.sleep(0.05) end
  until qtg.monotonic() > deadline
  return { ok = true, ticks = ticks, items = items,
           process_id = require("qtg.heartbeats").process_id() }
end

return common.child_main(run, out)
