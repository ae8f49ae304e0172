-- Scenario "many": 4 qtgd processes share one database; 2,000 requests
-- (200 with --ci) over the shipped templates with sim outcomes mixing
-- successes, failures, UNKNOWNs and retry-afters, plus manual steps an
-- operator completes.  No fault is injected: every request must end where
-- its variant says, each (node, attempt) side effect exactly once (no
-- resubmission at all), every callback delivered exactly once, every
-- process must have done work, and after a SIGTERM nothing is left in
-- PostgreSQL.
local qtg = require "qtg"
local M = {}

function M.run(lib)
  local N = lib.ci and 200 or 2000
  local t0 = qtg.monotonic()
  lib.load_workload()
  local rx = lib.start_receiver("receiver", "ok")
  lib.start_daemons(4)
  lib.log("many: 4 processes, %d requests", N)
  for i = 1, N do
    lib.create_request(i, rx.url)
    if i % 50 == 0 then
      qtg.sleep(0.1)
      lib.log("many: %d requests created", i)
    end
  end
  if not lib.settle(lib.ci and 300 or 1800) then lib.fail("not settled before the deadline") end
  for i, h in pairs(lib.daemons) do
    if not lib.alive(h) then lib.fail("qtgd%d exited during the run (rc %s)", i, tostring(lib.rc(h))) end
  end
  -- let the audit promoter catch up (it runs every second)
  lib.drain_audit(30)
  local r = lib.check{ receivers = { rx }, max_resubmits = 0, max_callback_dups = 0 }
  -- every process took part (SKIP LOCKED shares the work)
  local per = lib.query([[SELECT process_id, count(*)::int AS n FROM movement_callback_attempts
                           GROUP BY 1 ORDER BY 1]])
  local shares = {}
  for _, p in ipairs(per) do shares[#shares + 1] = p.n end
  if #per < 4 then lib.fail("only %d of 4 processes delivered callbacks", #per) end
  lib.stop_daemons_cleanly()
  lib.check_nothing_left("after SIGTERM")
  r.processes, r.faults = 4, 0
  r.callback_shares = table.concat(shares, "/")
  r.seconds = math.floor(qtg.monotonic() - t0)
  return lib.result("many", r)
end

return M
