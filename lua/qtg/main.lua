-- qtg.main: `qtgd run`.  Starts the console and the API, starts every
-- enabled worker from the registry (lua/qtg/workers/init.lua), seeds and
-- starts flushing their heartbeats, listens for wake-ups, then returns: the
-- loop keeps running until SIGTERM/SIGINT or a core failure.
local qtg = require("qtg")
local heartbeats = require("qtg.heartbeats")
local wakeups = require("qtg.wakeups")
local reload = require("qtg.reload")
local errors = require("qtg.errors")

local M = {}

-- Load each enabled worker's module first, so that a broken script stops
-- start-up with its file and line before any worker runs.
local function load_workers(registry)
  local plan = {}
  for _, w in ipairs(registry) do
    if w.skip_reason then
      qtg.log.warn("worker skipped: " .. w.skip_reason, {worker = w.name})
    elseif w.enabled then
      local ok, mod = pcall(require, w.module)
      if not ok then error("cannot load worker " .. w.name .. ": " .. tostring(mod), 0) end
      if type(mod) ~= "table" or type(mod.tick) ~= "function" then
        error("worker module " .. w.module .. " must return a table with tick(session)", 0)
      end
      plan[#plan + 1] = {spec = w, mod = mod}
    end
  end
  return plan
end

function M.start_workers(settings)
  local registry = require("qtg.workers").registry(settings)
  reload.warn_missing_workers(registry, "at start")
  local plan = load_workers(registry)
  for _, p in ipairs(plan) do
    local w = p.spec
    qtg.runtime.start_worker{
      name = w.name, group = w.group, interval = w.interval, jitter = w.jitter,
      tick = p.mod.tick, drain = w.drain,
    }
  end
  return plan
end

-- `qtgd check` fails on an MG_* name that is not a setting; run, which
-- may start without check, says so too (a typo leaves a default in force).
local function warn_unknown_settings()
  local check = require("qtg.cli.check")
  for _, u in ipairs(check.unknown_settings()) do
    qtg.log.warn(u.name .. " is not a qtg setting" .. (u.hint and (" (did you mean " .. u.hint .. "?)") or "")
      .. "; it is ignored", {setting = u.name, suggestion = u.hint})
  end
end

-- The database's schema against this qtgd's migrations: a file not applied
-- or edited since stops the start (every worker would fail each pass on a
-- table that is not there, while the API and the readiness notice said
-- the daemon was up); versions this qtgd does not know (a newer one
-- migrated the database, and this one was rolled back to) are said at
-- warn.  A database that cannot be asked now is the workers' to wait for.
local function schema_ready()
  local migrate = require("qtg.cli.migrate")
  local ok, pending, changed, unknown = pcall(qtg.db.with_session, function(s)
    return migrate.pending(s, migrate.dir())
  end)
  if not ok then
    qtg.log.warn("cannot read the database's migrations at start: " .. errors.text(pending))
    return true
  end
  if #pending > 0 or #changed > 0 then
    qtg.log.error("the database is not migrated for this qtgd: run `qtgd migrate`", {
      pending = table.concat(pending, ","), changed = table.concat(changed, ",") })
    return false
  end
  if #unknown > 0 then
    qtg.log.warn("the database has migrations this qtgd does not know: a newer qtgd migrated it, and this one "
      .. "was not made for that schema", { unknown = table.concat(unknown, ",") })
  end
  return true
end

-- systemd's watchdog (WatchdogSec=, $WATCHDOG_USEC for this process) ends
-- a process whose loop is held before the busy guard's last resort can
-- when 2.5 busy limits reach it: the guard's stop and its log line never
-- come.  Said at warn (the unit's comments state the bound).
local function warn_watchdog(settings)
  local pid = tonumber(os.getenv("WATCHDOG_PID") or "")
  local usec = tonumber(os.getenv("WATCHDOG_USEC") or "")
  if not usec or usec <= 0 or (pid and pid ~= qtg.pid()) then return end
  local seconds = usec / 1e6
  for _, limit in ipairs({ { "MG_TASK_BUSY_LIMIT_SECONDS", settings.task_busy_limit_seconds },
                           { "MG_CONSOLE_BUSY_LIMIT_SECONDS", settings.console_busy_limit_seconds } }) do
    local v = tonumber(limit[2])
    if v and v > 0 and 2.5 * v >= seconds then
      qtg.log.warn(("%s=%g: 2.5 times it reaches the service's watchdog (%g s), which ends a held loop first, "
        .. "without the busy guard's stop or its log line; keep it under %g"):format(limit[1], v, seconds,
        seconds / 2.5), { setting = limit[1] })
    end
  end
end

function M.run()
  local settings = qtg.settings
  warn_unknown_settings()
  warn_watchdog(settings)
  if not schema_ready() then return 1 end
  -- signed approvals: a file the daemon cannot read or parse stops it here,
  -- not at the first vote
  local eok, enrolment = pcall(require("qtg.signed_approvals").enrolment)
  if not eok then
    qtg.log.error(errors.text(enrolment))
    return 1
  end
  if enrolment then
    qtg.log.info("signed approvals: only votes signed by enrolled persons count",
      {persons = enrolment:count(), deployment = enrolment:deployment(), file = settings.signer_approvers})
  end
  reload.record_start()
  if settings.console_enabled then qtg.console_server.start() end
  if settings.api_listen ~= "" then
    local aok, aerr = pcall(qtg.api_server.start, settings.api_listen)
    if not aok then
      qtg.log.error(tostring(aerr))
      return 1
    end
  end
  local ok, plan = pcall(M.start_workers, settings)
  if not ok then
    qtg.log.error(tostring(plan))
    return 1
  end
  if #plan > 0 then
    local names = {}
    for i, p in ipairs(plan) do names[i] = {name = p.spec.name, group = p.spec.group} end
    local hb_ok, err = pcall(qtg.db.with_session, heartbeats.seed, names)
    if not hb_ok then qtg.log.warn("cannot seed worker heartbeats: " .. tostring(err)) end
    heartbeats.start()
  end
  if settings.wakeups_enabled then wakeups.start() end
  qtg.log.info("qtgd running", {workers = #plan, network_class = settings.network_class,
                                pid = tostring(qtg.pid())})
  -- Type=notify: ready once the workers run (a no-op without NOTIFY_SOCKET)
  local _, nerr = qtg.systemd.notify(("READY=1\nSTATUS=%d workers running"):format(#plan))
  if nerr then qtg.log.warn("sd_notify READY=1: " .. tostring(nerr)) end
  return 0
end

-- SIGHUPs are coalesced: one reload runs at a time, and the signals that
-- come while it does make one more when it ends (it reads the files as
-- they are then).  Each signal ran a whole reload on the loop before: 100
-- signals 20 ms apart (a configuration tool reloading once per file it
-- changed) made 101 reloads, and with a module slow to load they held the
-- loop 45 s (a review, session 43).
-- A reload the busy guard stopped whole never clears `running`: one whose
-- start is older than 3 busy limits (it would have been stopped by then)
-- no longer holds the next back.
local sighup = { running = false, again = false, started = 0 }

local function reload_running()
  if not sighup.running then return false end
  local limit = tonumber(qtg.settings.task_busy_limit_seconds) or 0
  return limit <= 0 or qtg.monotonic() - sighup.started < 3 * limit
end

function M.on_sighup()
  if reload_running() then
    sighup.again = true
    return
  end
  sighup.running = true
  local report
  repeat
    sighup.again = false
    sighup.started = qtg.monotonic()
    qtg.systemd.notify("RELOADING=1\nMONOTONIC_USEC=" .. qtg.systemd.monotonic_usec())
    local ok, r = pcall(reload.reload, "sighup")
    report = ok and r or nil
    if not ok then qtg.log.error("policy reload raised", { error = require("qtg.errors").text(r) }) end
    qtg.systemd.notify(report and report.ok and "READY=1\nSTATUS=policy reloaded"
                       or "READY=1\nSTATUS=policy reload failed; the old code keeps running")
  until not sighup.again
  sighup.running = false
  -- after READY: a core worker failing its first passes is logged (warn)
  if report and report.ok then pcall(reload.watch, report, reload.WATCH_SECONDS) end
end

return M
