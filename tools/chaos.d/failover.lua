-- Scenario "failover": PostgreSQL's own failover, nothing of qtg's.  A
-- primary with a synchronous standby (tools/pg replica), every process
-- (4 qtgd and this driver) on one multi-host URL with
-- target_session_attrs=read-write.  Half-way through the load the primary's
-- postmaster is killed (-9) and the standby promoted; every process must
-- reconnect to the new primary by itself (same pids), its listener re-LISTEN,
-- and all work finish: nothing lost, side effects exactly once per (node,
-- attempt), no callback lost.  Synchronous replication is what makes
-- "nothing lost" hold: a commit is acknowledged only once the standby has it.
-- Measured: the seconds from the promotion to the first node change
-- committed on the new primary.
local qtg = require "qtg"
local common = require "spec.lua.support.common"
local M = {}

local function postmaster_pid(dir)
  local f = io.open(dir .. "/data/postmaster.pid")
  if not f then return nil end
  local pid = tonumber(f:read("*l") or "")
  f:close()
  return pid
end

function M.run(lib)
  local standby = os.getenv("QTG_PG_STANDBY_DIR")
  assert(lib.pg_dir and standby and standby ~= "", "QTG_PG_DIR and QTG_PG_STANDBY_DIR must be set (tools/chaos failover)")
  local N = lib.ci and 200 or 600
  local t0 = qtg.monotonic()
  lib.load_workload()
  local rx = lib.start_receiver("receiver", "ok")
  lib.start_daemons(4)
  local pids = lib.pids_of_daemons()
  lib.log("failover: 4 processes, %d requests, the primary killed half-way", N)
  local recovery
  for i = 1, N do
    lib.create_request(i, rx.url)
    if i == math.floor(N / 2) then
      lib.release()
      local pid = assert(postmaster_pid(lib.pg_dir), "no postmaster.pid in " .. lib.pg_dir)
      lib.log("failover: kill -9 of the primary's postmaster (pid %d)", pid)
      lib.sh(("kill -9 %d"):format(pid))
      qtg.sleep(1)
      local out = lib.sh(common.quote(lib.root .. "/tools/pg") .. " --dir " .. common.quote(standby) .. " promote 2>&1")
      if out:match("%S") then lib.log("failover: tools/pg promote said: %s", out) end
      recovery = lib.wait_progress("the promotion", 120)
      lib.log("failover: work resumed on the new primary %s s after the promotion", tostring(recovery))
    end
    if i % 50 == 0 then qtg.sleep(0.1) end
  end
  if not lib.settle(lib.ci and 360 or 1200) then lib.fail("not settled before the deadline") end
  lib.carried_on(pids)
  for i, h in pairs(lib.daemons) do
    if not (lib.read(h.log) or ""):find("wake-up listener re-established", 1, true) then
      lib.fail("qtgd%d: its wake-up listener never re-established after the failover", i)
    end
  end
  lib.drain_audit(30)
  -- a commit cut by the kill after the provider call is redone once per
  -- in-flight dispatch or POST per process
  local r = lib.check{ receivers = { rx }, max_resubmits = 4,
                       max_callback_dups = 4 * lib.callbacks_in_flight() }
  if not lib.with_retry(function(s) return require("qtg.audit").verify(s) end).ok then
    lib.fail("the audit chain does not verify on the new primary")
  end
  lib.stop_daemons_cleanly()
  lib.check_nothing_left("after SIGTERM")
  r.processes, r.faults = 4, 1
  r.recovery_seconds = recovery
  r.seconds = math.floor(qtg.monotonic() - t0)
  return lib.result("failover", r)
end

return M
