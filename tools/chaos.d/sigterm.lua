-- Scenario "sigterm": graceful stops under load.  Three times (twice with
-- --ci), while nodes are in flight, every process gets SIGTERM: each must
-- exit 0 within the grace period (MG_SHUTDOWN_GRACE_SECONDS, 10 s here)
-- plus 2 s, leaving no session, open transaction or lock; then they are
-- started again.  No work may be lost, and since a graceful stop lets every
-- tick finish, nothing may be done twice: no resubmission, no callback
-- received twice.
local qtg = require "qtg"
local M = {}

function M.run(lib)
  local N = lib.ci and 150 or 600
  local rounds = lib.ci and 2 or 3
  local grace = 10
  local t0 = qtg.monotonic()
  lib.load_workload()
  local rx = lib.start_receiver("receiver", "ok")
  lib.start_daemons(4)
  lib.log("sigterm: 4 processes, %d requests, %d rounds of SIGTERM", N, rounds)
  local exits, worst, stops_done = {}, 0, 0
  for i = 1, N do
    lib.create_request(i, rx.url)
    if i % math.floor(N / (rounds + 1)) == 0 and stops_done < rounds then
      qtg.sleep(1)
      local in_flight = lib.scalar([[SELECT count(*)::int FROM movement_request_nodes
                                      WHERE node_state IN ('READY', 'SUBMITTED', 'OBSERVING', 'UNKNOWN')]])
      local res = lib.stop_daemons(grace + 20)
      stops_done = stops_done + 1
      for d, s in pairs(res) do
        exits[#exits + 1] = s.seconds
        if s.seconds > worst then worst = s.seconds end
        if s.rc ~= 0 then lib.fail("round %d: qtgd%d exited with %s", stops_done, d, tostring(s.rc)) end
        if s.seconds > grace + 2 then lib.fail("round %d: qtgd%d took %.1f s to stop", stops_done, d, s.seconds) end
      end
      lib.log("sigterm: round %d with %d nodes in flight: every process stopped within %.2f s",
        stops_done, in_flight, worst)
      lib.check_nothing_left("round " .. stops_done)
      lib.start_daemons(4)
    end
  end
  if not lib.settle(lib.ci and 300 or 900) then lib.fail("not settled before the deadline") end
  lib.drain_audit(30)
  local r = lib.check{ receivers = { rx }, max_resubmits = 0, max_callback_dups = 0 }
  local res = lib.stop_daemons(grace + 20)
  for d, s in pairs(res) do
    if s.rc ~= 0 then lib.fail("final stop: qtgd%d exited with %s", d, tostring(s.rc)) end
  end
  lib.check_nothing_left("after the final SIGTERM")
  r.processes = 4
  r.faults = rounds * 4
  r.slowest_stop_seconds = math.floor(worst * 100 + 0.5) / 100
  r.seconds = math.floor(qtg.monotonic() - t0)
  return lib.result("sigterm", r)
end

return M
