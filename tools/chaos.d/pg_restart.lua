-- Scenario "pg-restart": PostgreSQL is stopped (fast: every session is cut)
-- and started again twice while 4 processes work under load.  Every process
-- must carry on without a restart (same pids, still running at the end) and
-- all work must complete, with nothing lost and side effects exactly once
-- per (node, attempt).  A dispatch whose commit was cut after the provider
-- call is redone with the same idempotency key, which the ledger absorbs.
local qtg = require "qtg"
local common = require "spec.lua.support.common"
local M = {}

function M.run(lib)
  assert(lib.pg_dir, "QTG_PG_DIR is not set")
  local N = lib.ci and 200 or 800
  local down = lib.ci and 3 or 6
  local t0 = qtg.monotonic()
  lib.load_workload()
  local rx = lib.start_receiver("receiver", "ok")
  lib.start_daemons(4)
  local pids = lib.pids_of_daemons()
  lib.log("pg-restart: 4 processes, %d requests, PostgreSQL down %d s twice", N, down)
  local restarts, recovery = 0, {}
  local pg = common.quote(lib.root .. "/tools/pg") .. " --dir " .. common.quote(lib.pg_dir)
  for i = 1, N do
    lib.create_request(i, rx.url)
    if i == math.floor(N / 3) or i == math.floor(2 * N / 3) then
      lib.release()
      lib.log("pg-restart: stopping PostgreSQL")
      local out = lib.sh(pg .. " stop")
      if not out:match("stopped") and not out:match("server stopped") and out:match("%S") then
        lib.log("pg-restart: tools/pg stop said: %s", out)
      end
      qtg.sleep(down)
      lib.sh(pg .. " start")
      restarts = restarts + 1
      -- recovery: the first node change committed after the start
      recovery[#recovery + 1] = lib.wait_progress("PostgreSQL restart " .. restarts, 120)
      lib.log("pg-restart: PostgreSQL back; work resumed after %s s", tostring(recovery[#recovery]))
    end
    if i % 50 == 0 then qtg.sleep(0.1) end
  end
  if not lib.settle(lib.ci and 360 or 1200) then lib.fail("not settled before the deadline") end
  lib.carried_on(pids)
  lib.drain_audit(30)
  -- a cut commit after the provider call can be redone once per in-flight
  -- dispatch or POST per process per restart
  local r = lib.check{ receivers = { rx }, max_resubmits = 4 * restarts,
                       max_callback_dups = 4 * lib.callbacks_in_flight() * restarts }
  lib.stop_daemons_cleanly()
  lib.check_nothing_left("after SIGTERM")
  r.processes, r.faults = 4, restarts
  r.recovery_seconds = table.concat(recovery, "/")
  r.seconds = math.floor(qtg.monotonic() - t0)
  return lib.result("pg-restart", r)
end

return M
