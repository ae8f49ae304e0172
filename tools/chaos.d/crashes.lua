-- Scenario "crashes": 4 processes under load, killed with SIGKILL again and
-- again and restarted each time: at random moments by the driver, and at
-- two exact points through the chaos overrides (tools/chaos.d/override,
-- loaded through MG_LUA_PATH): right after a provider submit was recorded
-- in the sim ledger and before the dispatch transaction commits ("submit"),
-- and right after a callback POST was answered and before the outbox row is
-- marked delivered ("callback").  At least 20 kills.  Nothing may be lost;
-- no side effect may be repeated beyond what the idempotency keys absorb
-- (one ledger row per (node, attempt), submit_count counting the
-- resubmissions); every callback reaches the receiver at least once, and
-- every repeat carries the same nonce and body.
local qtg = require "qtg"
local M = {}

local function count_kills(lib)
  local counts = { submit = 0, callback = 0 }
  local text = lib.read(lib.tokens .. "/kills.log") or ""
  for point in text:gmatch("(%a+) [^\n]*\n") do counts[point] = (counts[point] or 0) + 1 end
  return counts
end

function M.run(lib)
  local N = lib.ci and 150 or 600
  local want = lib.ci and { random = 12, submit = 4, callback = 4 } or { random = 20, submit = 6, callback = 6 }
  local interval = lib.ci and 1.5 or 3
  local t0 = qtg.monotonic()
  lib.load_workload()
  local rx = lib.start_receiver("receiver", "ok")
  lib.start_daemons(4)
  lib.log("crashes: 4 processes, %d requests, kills: %d random, %d at submit, %d at callback",
    N, want.random, want.submit, want.callback)
  local random_kills, restarts, created = 0, 0, 0
  local last = { random = qtg.monotonic(), submit = 0, callback = 0 }
  local function armed(point) return lib.exists(lib.tokens .. "/" .. point .. ".token") end
  local function driver_tick()
    restarts = restarts + lib.restart_dead()
    local now = qtg.monotonic()
    local kills = count_kills(lib)
    for _, point in ipairs({ "submit", "callback" }) do
      if kills[point] < want[point] and not armed(point) and now - last[point] > interval then
        lib.write(lib.tokens .. "/" .. point .. ".token", "armed\n")
        last[point] = now
      end
    end
    if random_kills < want.random and now - last.random > interval then
      local alive = {}
      for i, h in pairs(lib.daemons) do if lib.alive(h) then alive[#alive + 1] = i end end
      if #alive > 0 then
        local i = alive[lib.random(1, #alive)]
        if lib.signal(lib.daemons[i], "KILL") then random_kills = random_kills + 1 end
        last.random = now
      end
    end
  end
  local deadline = qtg.monotonic() + (lib.ci and 240 or 900)
  while qtg.monotonic() < deadline do
    driver_tick()
    for _ = 1, (lib.ci and 5 or 10) do
      if created < N then created = created + 1; lib.create_request(created, rx.url) end
    end
    local kills = count_kills(lib)
    if created >= N and random_kills >= want.random and kills.submit >= want.submit
        and kills.callback >= want.callback then break end
    qtg.sleep(0.3)
  end
  -- keep creating load while the hooks wait for a submit or a callback
  local kills = count_kills(lib)
  lib.log("crashes: %d random kills, %d at submit, %d at callback, %d restarts; settling",
    random_kills, kills.submit, kills.callback, restarts)
  -- no more tokens: remove any still armed, then let everything finish
  os.remove(lib.tokens .. "/submit.token")
  os.remove(lib.tokens .. "/callback.token")
  if not lib.settle(lib.ci and 300 or 1200, function() restarts = restarts + lib.restart_dead() end) then
    lib.fail("not settled before the deadline")
  end
  lib.drain_audit(30)
  kills = count_kills(lib)
  local total = random_kills + kills.submit + kills.callback
  if random_kills < want.random then lib.fail("only %d random kills", random_kills) end
  if kills.submit < want.submit then lib.fail("only %d kills between submit and commit", kills.submit) end
  if kills.callback < want.callback then lib.fail("only %d kills during callback delivery", kills.callback) end
  if total < 20 then lib.fail("only %d kills in all", total) end
  local r = lib.check{ receivers = { rx }, max_resubmits = total, max_callback_dups = lib.callbacks_in_flight() * total }
  -- each kill between submit and commit must show as one absorbed
  -- resubmission; each kill after a delivered POST as one repeat
  if r.resubmits_absorbed < kills.submit then
    lib.fail("%d kills at submit but only %d resubmissions absorbed", kills.submit, r.resubmits_absorbed)
  end
  if r.callbacks_duplicated < kills.callback then
    lib.fail("%d kills after a delivered POST but only %d repeats", kills.callback, r.callbacks_duplicated)
  end
  lib.stop_daemons_cleanly()
  lib.check_nothing_left("after SIGTERM")
  r.processes = 4
  r.faults = total
  r.kills_random, r.kills_submit, r.kills_callback, r.restarts = random_kills, kills.submit, kills.callback, restarts
  r.seconds = math.floor(qtg.monotonic() - t0)
  return lib.result("crashes", r)
end

return M
