-- run_loop and supervision, with test workers: counts and recorded delays,
-- never wall-clock assertions.  Daemon behaviour (signals, groups, exit
-- codes) is driven through real `qtgd run` processes whose worker registry
-- comes from an operator override directory (MG_LUA_PATH).
local qtg = require("qtg")
local common = require "spec.lua.support.common"
local rt = qtg.runtime
local support = require("spec.lua.support.host")

local function worker(name)
  for _, w in ipairs(rt.workers()) do
    if w.name == name then return w end
  end
end

describe("run_loop delays", function()
  it("sleeps interval +- jitter with a 0.1 s floor", function()
    assert.are.equal(2, rt.delay_for(0, 2, 0.5, 0))
    assert.are.equal(2.5, rt.delay_for(0, 2, 0.5, 1))
    assert.are.equal(1.5, rt.delay_for(0, 2, 0.5, -1))
    assert.are.equal(0.1, rt.delay_for(0, 0.05, 0, 0))
    assert.are.equal(0.1, rt.delay_for(0, 0.2, 0.5, -1))
  end)

  it("backs off min(2^errors, 60) from the fifth consecutive error", function()
    assert.are.equal(5, rt.delay_for(4, 5, 0, 0))
    assert.are.equal(32, rt.delay_for(5, 5, 0, 0))
    assert.are.equal(60, rt.delay_for(6, 5, 0, 0))
    assert.are.equal(60, rt.delay_for(30, 5, 0, 0))
  end)
end)

describe("run_loop in the host", function()
  it("keeps each planned sleep within interval +- jitter", function()
    local n = 0
    rt.start_worker{name = "spec_jitter", interval = 0.2, jitter = 0.1, sleep_scale = 0.05,
                    tick = function() n = n + 1 return 1 end}
    support.eventually(function() return n >= 12 end, 20)
    local w = worker("spec_jitter")
    rt.stop_worker("spec_jitter")
    assert.is_true(#w.delays >= 10)
    local distinct = {}
    for _, d in ipairs(w.delays) do
      assert.is_true(d >= 0.1 and d <= 0.3, "delay " .. d)
      distinct[d] = true
    end
    local nd = 0
    for _ in pairs(distinct) do nd = nd + 1 end
    assert.is_true(nd > 1, "jitter varies the delay")
    assert.are.equal(0, w.consecutive_errors)
  end)

  it("counts consecutive errors, resets them on success, and backs off from the fifth", function()
    local calls = 0
    local plan = {false, false, false, true, false, false, false, false, false, false, false}
    rt.start_worker{name = "spec_errors", interval = 0.5, sleep_scale = 0.001, tick = function(s)
      calls = calls + 1
      if plan[calls] == false then error("planned failure " .. calls) end
      s:query("SELECT 1")
      return 2
    end}
    support.eventually(function() return calls >= #plan end, 30)
    local w = worker("spec_errors")
    rt.stop_worker("spec_errors")
    -- 3 errors, a success (reset), then 7 errors: the 5th, 6th and 7th back off
    assert.are.same({0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 32, 60, 60},
                    {unpack(w.delays, 1, 11)})
    assert.are.equal(10, w.errors_total)
    assert.are.equal(2, w.items_total)
    assert.matches("planned failure", w.last_error)
  end)

  it("a SQL error is a counted error and the loop goes on", function()
    local calls = 0
    rt.start_worker{name = "spec_sql", interval = 0.05, tick = function(s)
      calls = calls + 1
      s:query("SELEC broken")
      return 1
    end}
    local w = support.eventually(function()
      local w = worker("spec_sql")
      return w.consecutive_errors >= 3 and w
    end, 10)
    rt.stop_worker("spec_sql")
    assert.is_true(w.consecutive_errors >= 3)
    assert.matches("syntax error", w.last_error)
  end)

  it("rolls back and releases a session the tick left in a transaction", function()
    support.query("DROP TABLE IF EXISTS spec_rt_tx")
    support.query("CREATE TABLE spec_rt_tx (v int)")
    local done = false
    rt.start_worker{name = "spec_tx", interval = 5, tick = function(s)
      s:begin()
      s:query("INSERT INTO spec_rt_tx VALUES (1)")
      done = true
      return 1
    end}
    support.eventually(function() return done end, 10)
    qtg.sleep(0.1)
    rt.stop_worker("spec_tx")
    assert.are.equal(0, support.query("SELECT count(*)::int AS n FROM spec_rt_tx")[1].n)
    assert.are.equal(0, qtg.db.stats().in_use)
  end)

  it("refuses a bad worker definition with a clear error", function()
    assert.has_error(function() rt.start_worker{name = "x", interval = 0, tick = function() end} end)
    assert.has_error(function() rt.start_worker{name = "x", interval = 1, group = "odd", tick = function() end} end)
    assert.has_error(function() rt.start_worker{name = "x", interval = 1} end)
    -- delays that would wrap into a timer no tick ever reaches
    local noop = function() end
    for _, bad in ipairs({ { interval = math.huge }, { interval = 0 / 0 }, { interval = 1, first_delay = -1 },
                           { interval = 1, first_delay = 0 / 0 }, { interval = 1, jitter = math.huge },
                           { interval = 1, sleep_scale = 0 }, { interval = 1, sleep_scale = -2 } }) do
      bad.name, bad.tick = "x", noop
      local ok, err = pcall(rt.start_worker, bad)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("worker 'x': ", 1, true), tostring(err))
    end
    assert.has_error(function() rt.pause("no_such_worker") end)
  end)

  it("pause, resume and wake", function()
    local n = 0
    rt.start_worker{name = "spec_pause", interval = 3600, tick = function() n = n + 1 return 0 end}
    support.eventually(function() return n >= 1 end, 5)
    rt.wake("spec_pause")
    support.eventually(function() return n >= 2 end, 5)
    assert.are.equal(2, n)
    rt.pause("spec_pause")
    assert.are.equal("paused", worker("spec_pause").state)
    rt.wake("spec_pause")
    qtg.sleep(0.1)
    assert.are.equal(2, n, "a paused worker does not wake")
    rt.resume("spec_pause")
    support.eventually(function() return n >= 3 end, 5)
    rt.stop_worker("spec_pause")
    assert.are.equal(3, n)
  end)
end)

-- A throwaway operator override directory: a registry of test workers.
local function override_dir(registry_rows, modules)
  local dir = support.tmpdir()
  local lines = {"local M = {}", "function M.registry(settings) return {"}
  for _, r in ipairs(registry_rows) do
    lines[#lines + 1] = ("  {name=%q, group=%q, module=%q, interval=%s, jitter=0, enabled=true},")
      :format(r.name, r.group, r.module, tostring(r.interval))
  end
  lines[#lines + 1] = "} end return M"
  support.write(dir .. "/qtg/workers/init.lua", table.concat(lines, "\n"))
  for name, body in pairs(modules) do
    support.write(dir .. "/" .. name:gsub("%.", "/") .. ".lua", body)
  end
  return dir
end

local TICKS = [[CREATE TABLE IF NOT EXISTS spec_ticks (worker text, pid int, at timestamptz DEFAULT clock_timestamp())]]

local function ticker(name, extra)
  return ([[
local M = {}
function M.tick(s)
  s:query("INSERT INTO spec_ticks (worker, pid) VALUES ($1, $2)", %q, %s)
  %s
  return 1
end
return M]]):format(name, "tonumber(io.open('/proc/self/stat'):read('*l'):match('^(%d+)'))", extra or "")
end

local function ticks(name)
  return support.query("SELECT count(*)::int AS n FROM spec_ticks WHERE worker = $1", name)[1].n
end

describe("qtgd run supervision", function()
  before_each(function()
    support.query(TICKS)
    support.query("TRUNCATE spec_ticks")
  end)
  after_each(function() support.stop_all() end)

  it("SIGTERM cancels sleeping workers and exits 0", function()
    local dir = override_dir({{name = "sleepy", group = "core", module = "t.sleepy", interval = 3600}},
                             {["t.sleepy"] = ticker("sleepy")})
    local p = support.start(support.base_env{MG_LUA_PATH = dir}, {"run"})
    assert.is_truthy(support.eventually(function() return ticks("sleepy") >= 1 end, 20))
    assert.are.equal(0, support.stop(p, 20))
    assert.matches("all workers stopped", support.read(p.log))
  end)

  it("SIGTERM lets a running tick finish within the grace period", function()
    local dir = override_dir({{name = "slow", group = "core", module = "t.slow", interval = 3600}},
      {["t.slow"] = [[
local qtg = require("qtg")
local M = {}
function M.tick(s)
  s:begin()
  s:query("INSERT INTO spec_ticks (worker) VALUES ('slow-started')")
  s:commit()
  qtg.sleep(1.5)
  s:query("INSERT INTO spec_ticks (worker) VALUES ('slow-finished')")
  return 1
end
return M]]})
    local p = support.start(support.base_env{MG_LUA_PATH = dir, MG_SHUTDOWN_GRACE_SECONDS = "20"}, {"run"})
    assert.is_truthy(support.eventually(function() return ticks("slow-started") >= 1 end, 20))
    assert.are.equal(0, support.stop(p, 30))
    assert.are.equal(1, ticks("slow-finished"))
  end)

  it("a tick past the grace period is rolled back and the process still exits 0", function()
    local dir = override_dir({{name = "stuck", group = "core", module = "t.stuck", interval = 3600}},
      {["t.stuck"] = [[
local qtg = require("qtg")
local M = {}
function M.tick(s)
  s:query("INSERT INTO spec_ticks (worker) VALUES ('stuck-started')")
  s:begin()
  s:query("INSERT INTO spec_ticks (worker) VALUES ('stuck-uncommitted')")
  qtg.sleep(600)
  s:commit()
  return 1
end
return M]]})
    local p = support.start(support.base_env{MG_LUA_PATH = dir, MG_SHUTDOWN_GRACE_SECONDS = "0.5"}, {"run"})
    assert.is_truthy(support.eventually(function() return ticks("stuck-started") >= 1 end, 20))
    assert.are.equal(0, support.stop(p, 30))
    assert.matches("grace period over", support.read(p.log))
    assert.are.equal(0, ticks("stuck-uncommitted"))
    assert.is_truthy(support.eventually(function()
      return support.query([[SELECT count(*)::int AS n FROM pg_stat_activity
        WHERE application_name = 'qtgd' AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%']])[1].n == 0
    end, 10))
  end)

  -- The busy guard (src/qtg_busy.c): Lua that never yields held the loop
  -- for good before; every other worker, SIGTERM and the tick's database
  -- locks waited with it.
  it("stops a tick that never yields after MG_TASK_BUSY_LIMIT_SECONDS, lets go of its locks, and runs on", function()
    local dir = override_dir({
      {name = "spinner", group = "core", module = "t.spinner", interval = 3600},
      {name = "steady", group = "core", module = "t.steady", interval = 0.1},
    }, {
      -- it resists: a pcall around the loop, the loop in fresh coroutines
      ["t.spinner"] = [[
local M = {}
function M.tick(s)
  s:begin()
  s:query("INSERT INTO spec_ticks (worker) VALUES ('spinner-uncommitted')")
  s:query("SELECT pg_advisory_xact_lock(7719)")
  s:query("INSERT INTO spec_ticks (worker) VALUES ('spinner-started')")
  while true do
    coroutine.resume(coroutine.create(function() while true do pcall(function() while true do end end) end end))
  end
end
return M]],
      ["t.steady"] = ticker("steady"),
    })
    local p = support.start(support.base_env{MG_LUA_PATH = dir, MG_TASK_BUSY_LIMIT_SECONDS = "1"}, {"run"})
    local stopped = support.eventually(function()
      local log = support.read(p.log) or ""
      return log:match('"msg":"tick failed","worker":"spinner","error":"busy: ([^"]+)"')
    end, 30)
    assert.is_truthy(stopped, support.read(p.log))
    assert.matches("held the loop longer than MG_TASK_BUSY_LIMIT_SECONDS (1 s): stopped", stopped, 1, true)
    local log = support.read(p.log)
    -- the first strike stops the coroutine running, the next the whole tick
    assert.matches('"task":"spinner","where":"[^"]*t/spinner.lua:%d+","held_seconds":"[%d.]+","limit_seconds":"1",'
      .. '"stopping":"the coroutine running"', log)
    assert.matches('"task":"spinner","where":"[^"]*t/spinner.lua:%d+","held_seconds":"[%d.]+","limit_seconds":"1",'
      .. '"stopping":"the task"', log)
    -- its transaction was rolled back and its lock let go of, though its
    -- own clean-up never ran
    assert.is_truthy(support.eventually(function()
      return support.query([[SELECT count(*)::int AS n FROM pg_locks
                              WHERE locktype = 'advisory' AND objid = 7719]])[1].n == 0
    end, 10), "the stopped tick's lock is still held")
    assert.are.equal(0, ticks("spinner-uncommitted"))
    local before = ticks("steady")
    assert.is_truthy(support.eventually(function() return ticks("steady") >= before + 3 end, 20))
    assert.are.equal(0, support.stop(p, 20))
  end)

  -- The guard measured wall time, which runs on while the whole process is
  -- frozen (SIGSTOP, a cgroup freezer, a paused VM): a freeze of a limit
  -- stopped the healthy task that happened to run, one of 2.5 limits
  -- aborted the process.  Here a tick spins about a second of its own time around a
  -- 4 s freeze, under a 3 s limit: it is not a loop held.
  it("does not count time the process was frozen as the loop held", function()
    local dir = override_dir({{name = "frozen", group = "core", module = "t.frozen", interval = 3600}}, {
      ["t.frozen"] = [[
local qtg = require "qtg"
local M = {}
function M.tick(s)
  s:query("INSERT INTO spec_ticks (worker) VALUES ('frozen-started')")
  -- the shell's parent is this process: stopped 0.3 s into the spin, for 4 s
  os.execute("(sleep 0.3; kill -STOP $PPID; sleep 4; kill -CONT $PPID) >/dev/null 2>&1 &")
  local t0 = qtg.monotonic()
  while qtg.monotonic() - t0 < 5 do end
  s:query("INSERT INTO spec_ticks (worker) VALUES ('frozen-done')")
  return 1
end
return M]]})
    local p = support.start(support.base_env{MG_LUA_PATH = dir, MG_TASK_BUSY_LIMIT_SECONDS = "3"}, {"run"})
    assert.is_truthy(support.eventually(function() return ticks("frozen-done") == 1 end, 30), support.read(p.log))
    local log = support.read(p.log)
    assert.is_nil(log:find("held the loop", 1, true), log)
    assert.are.equal(1, ticks("frozen-started"))
    assert.are.equal(0, support.stop(p, 20))
  end)

  it("aborts the process when a tick is stuck where no Lua runs, naming it", function()
    -- a pattern that backtracks for ever: one C call, no Lua instruction
    local dir = override_dir({{name = "matcher", group = "core", module = "t.matcher", interval = 3600}}, {
      ["t.matcher"] = [[
local M = {}
function M.tick(s)
  s:query("INSERT INTO spec_ticks (worker) VALUES ('matcher-started')")
  return string.find(string.rep("a", 60), string.rep("a*", 60) .. "b") and 1 or 0
end
return M]]})
    local p = support.start(support.base_env{MG_LUA_PATH = dir, MG_TASK_BUSY_LIMIT_SECONDS = "1"}, {"run"})
    local rc = support.wait_exit(p, 30)
    assert.are.equal(134, rc, support.read(p.log))   -- SIGABRT: the service manager restarts it
    assert.are.equal(1, ticks("matcher-started"))
    assert.matches('"msg":"a task has held the loop [%d.]+ s, 2.5 times MG_TASK_BUSY_LIMIT_SECONDS, and could not '
      .. 'be stopped %(a C call that does not return%?%): aborting","task":"matcher"', support.read(p.log))
  end)

  it("a reload whose module never finishes loading fails, and the old code runs on", function()
    local dir = override_dir({{name = "steady", group = "core", module = "t.steady", interval = 0.1}},
                             {["t.steady"] = ticker("steady")})
    local p = support.start(support.base_env{MG_LUA_PATH = dir, MG_TASK_BUSY_LIMIT_SECONDS = "1"}, {"run"})
    assert.is_truthy(support.eventually(function() return ticks("steady") >= 2 end, 20))
    support.write(dir .. "/t/steady.lua", "local M = {}\nwhile true do end\nreturn M\n")
    support.signal(p, "HUP")
    local failed = support.eventually(function()
      return (support.read(p.log) or ""):match('"msg":"policy reload failed; the old code keeps running"[^\n]*')
    end, 30)
    assert.is_truthy(failed, support.read(p.log))
    assert.matches("busy: [^\"]*t/steady.lua:2: held the loop longer than MG_TASK_BUSY_LIMIT_SECONDS", failed)
    local before = ticks("steady")
    assert.is_truthy(support.eventually(function() return ticks("steady") >= before + 3 end, 20))
    assert.are.equal(0, support.stop(p, 20))
  end)

  -- Each SIGHUP ran a whole reload on the loop: a burst (a configuration
  -- tool reloading once per file it changed) held the loop one reload per
  -- signal.  They are coalesced: one runs, and those that come meanwhile
  -- make one more.
  it("coalesces SIGHUPs: one reload at a time and one after it for those that came meanwhile", function()
    local dir = override_dir({{name = "steady", group = "core", module = "t.steady", interval = 0.1}},
                             {["t.steady"] = ticker("steady")})
    local p = support.start(support.base_env{MG_LUA_PATH = dir}, {"run"})
    assert.is_truthy(support.eventually(function() return ticks("steady") >= 2 end, 20))
    -- a module that takes 4 s to load (its own CPU time), and 20 signals
    -- sent at once: all come while the first reload runs
    support.write(dir .. "/t/steady.lua", "local t0 = os.clock() while os.clock() - t0 < 4 do end\n"
      .. ticker("steady"))
    for _ = 1, 20 do support.signal(p, "HUP") end
    local function reloads()
      local n = 0
      for _ in (support.read(p.log) or ""):gmatch('"msg":"policy reloaded"') do n = n + 1 end
      return n
    end
    -- the first, and one for those that came meanwhile (one signal handled
    -- after the first reload ended would make a third): not twenty
    assert.is_truthy(support.eventually(function() return reloads() >= 2 end, 60), support.read(p.log))
    qtg.sleep(6)
    local n = reloads()
    assert.is_true(n >= 2 and n <= 3, n .. " reloads for 20 signals")
    local before = ticks("steady")
    assert.is_truthy(support.eventually(function() return ticks("steady") >= before + 3 end, 20))
    assert.are.equal(0, support.stop(p, 20))
  end)

  -- Which policy code ran when: a reload's audit row said how many modules
  -- it loaded and no more, so an override that approved everything, loaded
  -- and then removed, left two rows the same (a review, session 44).
  it("records the override scripts in force, each with its SHA-256, at start and at each reload", function()
    local dir = override_dir({{name = "steady", group = "core", module = "t.steady", interval = 0.1}},
                             {["t.steady"] = ticker("steady")})
    local p = support.start(support.base_env{MG_LUA_PATH = dir}, {"run"})
    assert.is_truthy(support.eventually(function() return ticks("steady") >= 2 end, 20))
    local function audited(action)
      return support.query([[
        SELECT detail FROM (SELECT action, detail, created_at FROM audit_outbox
                            UNION ALL SELECT action, detail, created_at FROM audit_events) a
         WHERE action = $1 AND detail->'overrides'->>'root' = $2 ORDER BY created_at]], action, dir)
    end
    local function digests(detail)
      local out = {}
      for _, f in ipairs(detail.overrides.files) do out[f.module] = f.sha256 end
      return out
    end
    local function sha256_of(path) return qtg.crypto.sha256_hex(support.read(path)) end
    local start = audited("policy.start")
    assert.are.equal(1, #start)
    -- the specs let the stand-in executor run on every class (spec/env.sh): said at warn and on the record
    assert.matches("the stand%-in executor sim may run on this network class [^ ]+ %(MG_SIM_NETWORK_CLASSES=%*%)",
      start[1].detail.stand_in)
    assert.truthy(support.read(p.log):find("the stand-in executor sim may run on this network class", 1, true),
      support.read(p.log))
    assert.same({ ["qtg.workers"] = sha256_of(dir .. "/qtg/workers/init.lua"),
                  ["t.steady"] = sha256_of(dir .. "/t/steady.lua") }, digests(start[1].detail))
    local first = support.read(dir .. "/t/steady.lua")
    -- the operator edits a script and reloads
    support.write(dir .. "/t/steady.lua", first .. "\n-- edited\n")
    support.signal(p, "HUP")
    assert.is_truthy(support.eventually(function() return #audited("policy.reload") == 1 end, 30), support.read(p.log))
    local reload = audited("policy.reload")[1].detail
    assert.is_true(reload.ok)
    local after = digests(reload)
    assert.are.equal(sha256_of(dir .. "/t/steady.lua"), after["t.steady"])
    assert.are_not.equal(qtg.crypto.sha256_hex(first), after["t.steady"])
    assert.are_not.equal(start[1].detail.overrides.digest, reload.overrides.digest)
    local log = support.read(p.log)
    assert.truthy(log:find('"overrides_digest":"' .. reload.overrides.digest .. '"', 1, true))
    -- this registry runs none of the node workers: said at start and at the reload
    assert.truthy(log:find("this process does not run node_dispatcher, node_observer, node_recovery (at start)",
      1, true), log)
    assert.truthy(log:find("this process does not run node_dispatcher, node_observer, node_recovery (after the "
      .. "reload by system:sighup)", 1, true), log)
    assert.are.equal(0, support.stop(p, 20))
    -- and `qtgd check` warns of it
    local _, out = support.run(support.base_env{MG_LUA_PATH = dir}, { support.bin, "check" })
    assert.truthy(out:find("the worker registry does not run node_dispatcher, node_observer, node_recovery", 1, true),
      out)
    assert.truthy(out:find("the stand-in executor sim may run on this network class", 1, true), out)
  end)

  -- A reload that dropped an executor (an executors override with a typo)
  -- was "policy reloaded" at info, and every node of it in flight went
  -- UNKNOWN at its next pass.
  it("a reload that drops the executor of nodes in flight says so at warn, naming it", function()
    local class = common.uid("unadapted", 4)
    local dir = support.tmpdir()
    local eng = require("spec.lua.support.engine")
    local T = "spec_rt_unadapted"
    -- a READY sim node of a request waiting for approval: nothing moves it meanwhile
    qtg.db.with_session(function(s)
      eng.load_doc(s, eng.doc(T, { { "a", "action", "withdrawal", { sim = {} } } }))
      s:begin()
      eng.insert_requests(s, class, 1, T, common.uid("ua", 4), { request = "'PENDING_APPROVAL'", node = "'READY'" })
      s:commit()
    end)
    local p = support.start(support.base_env{MG_LUA_PATH = dir, MG_NETWORK_CLASS = class,
                                              MG_WORKERS_ENABLED = "false"}, {"run"})
    assert.is_truthy(support.eventually(function()
      return (support.read(p.log) or ""):find("qtgd running", 1, true)
    end, 30), support.read(p.log))
    support.write(dir .. "/qtg/executors/init.lua", ("local M = dofile(%q)\nM.ADAPTERS.sim = nil\nreturn M\n")
      :format(support.root .. "/lua/qtg/executors/init.lua"))
    support.signal(p, "HUP")
    local line = support.eventually(function()
      return (support.read(p.log) or ""):match('[^\n]*nodes in flight name executors the policy in force has no '
        .. 'adapter for %(after the reload by system:sighup%)[^\n]*')
    end, 30)
    assert.is_truthy(line, support.read(p.log))
    assert.truthy(line:find('"executors":"sim"', 1, true), line)
    assert.truthy(line:find('"level":"warn"', 1, true), line)
    assert.are.equal(0, support.stop(p, 20))
  end)

  it("a core worker dying stops the process non-zero and stops the others", function()
    local dir = override_dir({
      {name = "doomed", group = "core", module = "t.doomed", interval = 0.2},
      {name = "bystander", group = "sidecar", module = "t.bystander", interval = 0.1},
    }, {
      ["t.doomed"] = [[
local qtg = require("qtg")
local M, n = {}, 0
function M.tick(s) n = n + 1 if n >= 3 then qtg.fatal("impossible state") end return 0 end
return M]],
      ["t.bystander"] = ticker("bystander"),
    })
    local p = support.start(support.base_env{MG_LUA_PATH = dir}, {"run"})
    local rc = support.wait_exit(p, 30)
    assert.are.equal(3, rc)
    local log = support.read(p.log)
    assert.matches("core worker died", log)
    assert.matches("impossible state", log)
    local after = ticks("bystander")
    qtg.sleep(0.3)
    assert.are.equal(after, ticks("bystander"), "no worker ticks after the process ended")
  end)

  it("a sidecar dying leaves the other workers ticking", function()
    local dir = override_dir({
      {name = "fragile", group = "sidecar", module = "t.fragile", interval = 0.1},
      {name = "steady", group = "core", module = "t.steady", interval = 0.1},
    }, {
      ["t.fragile"] = [[
local qtg = require("qtg")
local M = {}
function M.tick(s) qtg.fatal("sidecar gives up") end
return M]],
      ["t.steady"] = ticker("steady"),
    })
    local p = support.start(support.base_env{MG_LUA_PATH = dir}, {"run"})
    assert.is_truthy(support.eventually(function()
      return (support.read(p.log) or ""):match("sidecar worker died") end, 20))
    local before = ticks("steady")
    assert.is_truthy(support.eventually(function() return ticks("steady") >= before + 3 end, 20))
    assert.are.equal(0, support.stop(p, 20))
  end)

  it("keeps ticking across a PostgreSQL restart without being restarted", function()
    local dir = override_dir({{name = "survivor", group = "core", module = "t.survivor", interval = 0.5}},
                             {["t.survivor"] = ticker("survivor")})
    local p = support.start(support.base_env{MG_LUA_PATH = dir}, {"run"})
    assert.is_truthy(support.eventually(function() return ticks("survivor") >= 3 end, 20))
    local rc, out = support.run({}, {support.root .. "/tools/pg", "--dir", os.getenv("QTG_PG_DIR"), "restart"})
    assert.are.equal(0, rc, out)
    local last_err
    local before = support.eventually(function()
      local ok, n = pcall(ticks, "survivor")
      if not ok then last_err = n end
      return ok and n
    end, 60, 0.2)
    local st = qtg.db.stats()
    assert.is_truthy(before, ("no query succeeded after the restart: %s (pool open %d, in use %d, waiting %d)")
      :format(tostring(last_err), st.open, st.in_use, st.waiting))
    -- ticks that fail while the server is down count as errors; from the
    -- fifth in a row run_loop backs off (32 s, then 60 s), so a slow restart
    -- on a loaded machine can delay the next good tick by up to a minute
    assert.is_truthy(support.eventually(function() return ticks("survivor") >= before + 3 end, 150, 0.5))
    assert.are.equal(0, support.stop(p, 20))
  end)

  it("a syntax error in a worker module names the file and line and stops start-up", function()
    local dir = override_dir({{name = "broken", group = "core", module = "t.broken", interval = 1}},
                             {["t.broken"] = "local M = {}\nfunction M.tick(s)\n  return 1 +\nend\nreturn M\n"})
    local rc, out = support.run(support.base_env{MG_LUA_PATH = dir}, {support.bin, "run"})
    assert.are.equal(1, rc)
    assert.matches("t/broken%.lua:4:", out)
  end)
end)

describe("qtgd command line", function()
  it("refuses invalid settings naming the variable and the accepted form", function()
    local cases = {
      {MG_NODE_DISPATCH_INTERVAL_SECONDS = "fast", "MG_NODE_DISPATCH_INTERVAL_SECONDS", "a number"},
      {MG_WORKERS_ENABLED = "maybe", "MG_WORKERS_ENABLED", "true or false"},
      {MG_CALLBACK_MAX_ATTEMPTS = "2.5", "MG_CALLBACK_MAX_ATTEMPTS", "an integer"},
      {MG_DB_POOL_SIZE = "0", "MG_DB_POOL_SIZE", "between 1 and 256"},
      {MG_LOG_LEVEL = "loud", "MG_LOG_LEVEL", "debug, info"},
      {MG_NETWORK_CLASS = "Main Net", "MG_NETWORK_CLASS", "a%-z"},
    }
    for _, c in ipairs(cases) do
      local env = support.base_env()
      for k, v in pairs(c) do if type(k) == "string" then env[k] = v end end
      local rc, out = support.run(env, {support.bin, "run"})
      assert.are.equal(2, rc, out)
      assert.matches(c[1], out)
      assert.matches(c[2], out)
    end
  end)

  -- A port past 65535 listened on its low 16 bits (74016 on 8480).
  it("refuses an API address it cannot listen on as written, naming the setting", function()
    for _, v in ipairs({ "127.0.0.1:74016", "127.0.0.1:65536", "127.0.0.1:000080", "127.0.0.1:-1", "127.0.0.1:8a",
                         "abc" }) do
      local rc, out = support.run(support.base_env{MG_API_LISTEN = v, MG_CONSOLE_ENABLED = "false"},
        {support.bin, "run"})
      assert.are.equal(1, rc, v .. ": " .. out)
      assert.truthy(out:find("MG_API_LISTEN", 1, true), out)
      assert.is_nil(out:find('"msg":"api listening"', 1, true), out)
    end
  end)

  -- systemd's watchdog ends a held loop before the busy guard can when
  -- 2.5 limits reach it: said at start.
  it("warns at start of a busy limit the service's watchdog would overtake", function()
    local p = support.start(support.base_env{WATCHDOG_USEC = "10000000", MG_TASK_BUSY_LIMIT_SECONDS = "5",
                                              MG_CONSOLE_BUSY_LIMIT_SECONDS = "3"}, {"run"})
    assert.is_truthy(support.eventually(function()
      return (support.read(p.log) or ""):find("qtgd running", 1, true)
    end, 30), support.read(p.log))
    local log = support.read(p.log)
    assert.truthy(log:find("MG_TASK_BUSY_LIMIT_SECONDS=5: 2.5 times it reaches the service's watchdog (10 s)", 1, true),
      log)
    assert.is_nil(log:find("MG_CONSOLE_BUSY_LIMIT_SECONDS=3:", 1, true), log)
    assert.are.equal(0, support.stop(p, 20))
  end)

  it("gives usage and exit 2 for unknown commands and options", function()
    local rc, out = support.run({}, {support.bin, "frobnicate"})
    assert.are.equal(2, rc)
    assert.matches("unknown command", out)
    assert.matches("usage: qtgd", out)
    rc, out = support.run({}, {support.bin, "--frob"})
    assert.are.equal(2, rc)
    assert.matches("unknown option", out)
    -- a command's own arguments too: `run --bogus` must not start a daemon
    for _, a in ipairs({ {"run", "--bogus"}, {"run", "extra"}, {"version", "x"}, {"help", "x"},
                         {"settings", "--bogus"}, {"settings", "--markdown", "x"},
                         {"migrate", "--bogus"}, {"migrate", "a", "b"} }) do
      local args = {support.bin}
      for _, x in ipairs(a) do args[#args + 1] = x end
      local what = table.concat(a, " ")
      rc, out = support.run({}, args)
      assert.are.equal(2, rc, what .. ": " .. out)
      assert.matches("qtgd " .. a[1] .. ": ", out, 1, true)
      assert.matches("usage: qtgd", out, 1, true)
    end
    rc, out = support.run({}, {support.bin, "settings", "--markdown"})
    assert.are.equal(0, rc, out)
    rc, out = support.run({}, {support.bin, "--help"})
    assert.are.equal(0, rc)
    assert.matches("migrate [DIR]", out, 1, true)
    rc, out = support.run({}, {support.bin, "version"})
    assert.are.equal(0, rc)
    assert.matches("^qtgd %d", out)
  end)

  it("exec runs a script in a task and exits with its result", function()
    local dir = support.tmpdir()
    support.write(dir .. "/ok.lua", "local qtg = require('qtg') local s = qtg.db.acquire() "
      .. "local v = s:query('SELECT $1::int AS v', tonumber(arg[1]))[1].v s:release() return v")
    support.write(dir .. "/bad.lua", "error('script failed on purpose')")
    local rc = support.run(support.base_env(), {support.bin, "exec", dir .. "/ok.lua", "7"})
    assert.are.equal(7, rc)
    local rc2, out2 = support.run(support.base_env(), {support.bin, "exec", dir .. "/bad.lua"})
    assert.are.equal(1, rc2)
    assert.matches("script failed on purpose", out2)
    local rc3, out3 = support.run(support.base_env(), {support.bin, "exec", dir .. "/missing.lua"})
    assert.are.equal(1, rc3)
    assert.matches("missing.lua", out3)
  end)

  -- I/O where Lua cannot yield (a module's load under require, a sort's
  -- comparator) was started, its yield failed, the task ended and was
  -- freed, and the operation's completion resumed it: a use after free
  -- (ASan), a crash, or a session left busy.  It is refused before it starts.
  it("refuses I/O where Lua cannot wait for it, and the task's next I/O works", function()
    local dir = support.tmpdir()
    support.write(dir .. "/noyield.lua", [[
local qtg = require "qtg"
package.preload["spec_io_at_load"] = function()
  return qtg.db.with_session(function(s) return s:query("SELECT 1 AS x")[1].x end)
end
print("require", pcall(require, "spec_io_at_load"))
print("sort", pcall(table.sort, { 3, 1, 2 }, function(a, b) qtg.sleep(0) return a < b end))
print("after", qtg.db.with_session(function(s) return s:query("SELECT 42 AS x")[1].x end))
qtg.sleep(0.2) -- a completion of anything started above would arrive now
print("done")
]])
    local rc, out = support.run(support.base_env(), {support.bin, "exec", dir .. "/noyield.lua"})
    assert.are.equal(0, rc, out)
    assert.matches("require\tfalse\t[^\n]*I/O where Lua cannot wait for it", out)
    assert.matches("sort\tfalse\t[^\n]*I/O where Lua cannot wait for it", out)
    assert.matches("after\t42", out)
    assert.matches("\ndone", out)
  end)
end)

describe("qtgd migrate", function()
  it("applies in order, is idempotent, and refuses an edited applied migration", function()
    local dir = support.tmpdir()
    support.write(dir .. "/9901_spec_a.sql", "CREATE TABLE spec_mig_a (id int);")
    support.write(dir .. "/9902_spec_b.sql", "INSERT INTO spec_mig_a VALUES (1);")
    support.query("DROP TABLE IF EXISTS spec_mig_a")
    pcall(support.query, "DELETE FROM schema_migrations WHERE version LIKE '990%'")
    local env = support.base_env()
    local rc, out = support.run(env, {support.bin, "migrate", dir})
    assert.are.equal(0, rc, out)
    assert.matches("2 applied", out)
    rc, out = support.run(env, {support.bin, "migrate", dir})
    assert.are.equal(0, rc, out)
    assert.matches("0 applied, 2 already applied", out)
    assert.are.equal(1, support.query("SELECT count(*)::int AS n FROM spec_mig_a")[1].n)
    support.write(dir .. "/9902_spec_b.sql", "INSERT INTO spec_mig_a VALUES (2);")
    rc, out = support.run(env, {support.bin, "migrate", dir})
    assert.are.equal(1, rc)
    assert.matches("9902_spec_b.sql was changed after it was applied", out)
    -- a failing migration is rolled back whole and reported with its file
    support.write(dir .. "/9903_spec_c.sql", "INSERT INTO spec_mig_a VALUES (3); SELEC oops;")
    support.write(dir .. "/9902_spec_b.sql", "INSERT INTO spec_mig_a VALUES (1);")
    rc, out = support.run(env, {support.bin, "migrate", dir})
    assert.are.equal(1, rc)
    assert.matches("9903_spec_c.sql failed", out)
    assert.are.equal(1, support.query("SELECT count(*)::int AS n FROM spec_mig_a")[1].n)
    support.query("DROP TABLE spec_mig_a")
    support.query("DELETE FROM schema_migrations WHERE version LIKE '990%'")
  end)

  -- Two first migrators at once (hosts provisioned together) both created
  -- schema_migrations before the advisory lock: one failed on a duplicate
  -- key of pg_type.
  it("two migrators on a new database both succeed, one after the other", function()
    local dir = support.tmpdir()
    support.write(dir .. "/9901_spec_race.sql", "CREATE TABLE spec_mig_race (id int);")
    for round = 1, 4 do
      local db = "spec_mig_race_" .. round
      support.query("DROP DATABASE IF EXISTS " .. db .. " WITH (FORCE)")
      support.query("CREATE DATABASE " .. db)
      local url = common.database_url(db)
      local a = support.start(support.base_env{MG_DATABASE_URL = url}, {"migrate", dir})
      local b = support.start(support.base_env{MG_DATABASE_URL = url}, {"migrate", dir})
      local ra, rb = support.wait_exit(a, 60), support.wait_exit(b, 60)
      assert.are.equal(0, ra, support.read(a.log))
      assert.are.equal(0, rb, support.read(b.log))
      local logs = (support.read(a.log) or "") .. (support.read(b.log) or "")
      local n = 0
      for _ in logs:gmatch("applied 9901_spec_race.sql") do n = n + 1 end
      assert.are.equal(1, n, logs)
      support.query("DROP DATABASE " .. db .. " WITH (FORCE)")
    end
  end)

  -- `qtgd run` on a database nobody migrated opened its API and console
  -- and said READY, then every worker failed each pass; one a newer qtgd
  -- migrated started without a word.
  it("run refuses a database with migrations not applied, and warns of ones it does not know", function()
    local db = "spec_run_unmigrated"
    support.query("DROP DATABASE IF EXISTS " .. db .. " WITH (FORCE)")
    support.query("CREATE DATABASE " .. db)
    local url = common.database_url(db)
    local env = support.base_env{MG_DATABASE_URL = url, MG_CONSOLE_ENABLED = "false"}
    local p = support.start(env, {"run"})
    assert.are.equal(1, support.wait_exit(p, 60), support.read(p.log))
    assert.truthy(support.read(p.log):find("the database is not migrated for this qtgd: run `qtgd migrate`", 1, true))
    assert.is_nil(support.read(p.log):find("qtgd running", 1, true))
    local rc, out = support.run(env, {support.bin, "migrate"})
    assert.are.equal(0, rc, out)
    -- a version of a newer qtgd's, written in that database
    local script = support.tmpdir() .. "/newer.lua"
    support.write(script, "require('qtg').db.with_session(function(s) s:query([[INSERT INTO schema_migrations "
      .. "(version, checksum) VALUES ('9999_from_a_newer_qtgd.sql', 'x')]]) end) return 0")
    rc, out = support.run(env, {support.bin, "exec", script})
    assert.are.equal(0, rc, out)
    p = support.start(env, {"run"})
    assert.is_truthy(support.eventually(function()
      return (support.read(p.log) or ""):find("qtgd running", 1, true)
    end, 60), support.read(p.log))
    assert.truthy(support.read(p.log):find("the database has migrations this qtgd does not know", 1, true),
      support.read(p.log))
    assert.are.equal(0, support.stop(p, 20))
    support.query("DROP DATABASE " .. db .. " WITH (FORCE)")
  end)

  -- A migration's lock request that waits queues every later reader of
  -- the table behind it: one idle transaction anywhere held every
  -- daemon's workers as long as it stayed open.
  it("a migration waiting for a table's lock lets go, names the open transactions, and goes in after them", function()
    local dir = support.tmpdir()
    support.query("DROP TABLE IF EXISTS spec_mig_lock")
    support.query("CREATE TABLE spec_mig_lock (id int)")
    support.query("DELETE FROM schema_migrations WHERE version LIKE '990%'")
    support.write(dir .. "/9904_spec_lock.sql", "ALTER TABLE spec_mig_lock ADD COLUMN v int;")
    local holder = qtg.db.acquire()
    local ok, err = pcall(function()
      holder:begin()
      local pid = holder:query("SELECT pg_backend_pid() AS pid, count(*) FROM spec_mig_lock")[1].pid
      local h = support.start(support.base_env(), {"migrate", dir})
      assert.is_truthy(support.eventually(function()
        return (support.read(h.log) or ""):find("migration 9904_spec_lock.sql waits for a lock: held by one of pid "
          .. pid, 1, true)
      end, 30), support.read(h.log))
      holder:rollback()
      assert.are.equal(0, support.wait_exit(h, 60), support.read(h.log))
      assert.truthy(support.read(h.log):find("applied 9904_spec_lock.sql", 1, true))
      assert.are.equal(1, #support.query([[SELECT 1 FROM information_schema.columns
                                            WHERE table_name = 'spec_mig_lock' AND column_name = 'v']]))
    end)
    if holder:in_transaction() then holder:rollback() end
    holder:release()
    support.query("DROP TABLE IF EXISTS spec_mig_lock")
    support.query("DELETE FROM schema_migrations WHERE version LIKE '990%'")
    assert(ok, err)
  end)

  it("without MG_DATABASE_URL, starts the private cluster under the repo and uses it (the embedded default)", function()
    -- a repo of links to this one's lua/, sql/ and tools/, with no var/:
    -- nothing there yet for tools/pg to find
    local q = common.quote
    local root = support.tmpdir()
    os.execute("chmod 755 " .. q(root)) -- as root, the server runs as postgres
    for _, d in ipairs({ "lua", "sql", "tools" }) do
      assert.is_true(os.execute("ln -s " .. q(support.root .. "/" .. d) .. " " .. q(root .. "/" .. d)) == 0)
    end
    local env = { QTG_ROOT = root, MG_DATABASE_URL = "", MG_CONSOLE_ENABLED = "false" }
    local ok, err = pcall(function()
      local rc, out = support.run(env, { q(support.bin), "migrate" })
      assert.are.equal(0, rc, out)
      assert.matches("applied 0001_core.sql", out, 1, true)
      assert.is_not_nil(support.read(root .. "/var/pg/data/PG_VERSION"), "no cluster under " .. root .. "/var/pg")
      -- the next command finds the same cluster, already migrated
      rc, out = support.run(env, { q(support.bin), "migrate" })
      assert.are.equal(0, rc, out)
      assert.matches("0 applied", out, 1, true)
    end)
    support.run({}, { q(root .. "/tools/pg"), "--dir", q(root .. "/var/pg"), "stop" })
    os.execute("rm -rf " .. q(root))
    if not ok then error(err, 0) end
  end)
end)
