-- qtg.reload: live reload of the policy scripts (console reload(), SIGHUP).
--
-- The policy path is the operator's override directory (MG_LUA_PATH) first,
-- then the packaged lua/.  A reload:
--   0. checks the override directory's ownership and modes again (as at
--      start: src/qtg_lua_path.c), and is refused when it fails;
--   1. compiles every .lua file under the policy path (a syntax error in a
--      script nobody has loaded yet is reported now, not at first use);
--   2. loads afresh every policy module that is loaded now, and the worker
--      registry (qtg.workers) with each enabled worker's module, into a
--      fresh package.loaded for those names; then every module a registry
--      loads at its first use (M.FIRST_USE: the executors, the venues'
--      adapters, the approval policy), so that one which raises while
--      loading is refused now and not found broken by the first request
--      that needs it;
--   3. only if all of that succeeded keeps the new modules, else puts every
--      old module back: a script that fails to compile or raises while
--      loading leaves the old code running, and the report names its file
--      and line;
--   4. applies the new registry to the runtime: set_tick (a tick already
--      running finishes on the old code, the next one runs the new),
--      set_interval when the interval or jitter changed (used from the next
--      sleep), start_worker for added workers, stop_worker for removed ones,
--      and qtg.wakeups.refresh (which workers a NOTIFY may wake).
-- Steps 1-3 run inside a plain coroutine, so a module that tries I/O while
-- it loads fails at once instead of yielding: no other task ever runs
-- between the first module being replaced and the last, so nothing sees a
-- half-reloaded set.  The result is logged and audited (action
-- policy.reload) under the caller's actor ("console:<uid>", or
-- "system:sighup").
local qtg = require("qtg")
local lfs = require("lfs")

local M = {}

-- Loaded modules that are not reloaded: the process's entry points and
-- this module (they hold the process's own state; changes to them take
-- effect at the next start).  They are still compiled in step 1.
-- qtg.wakeups is kept too: it is the NOTIFY listener's process state (the
-- listener calls the module it started with); apply() asks it to take the
-- new registry's wakeable workers instead.  qtg.metrics holds the
-- process's counters, which a reload must not reset, and qtg.heartbeats
-- the flush task it started.
M.KEEP = { ["qtg"] = true, ["qtg.main"] = true, ["qtg.cli"] = true, ["qtg.reload"] = true,
           ["qtg.wakeups"] = true, ["qtg.metrics"] = true, ["qtg.heartbeats"] = true }
M.KEEP_PREFIXES = { "qtg.cli." }
M.MAX_DEPTH = 8

-- The workers that move and watch money in flight.  A registry that does
-- not run one of them (an override that drops node_observer, a settings
-- typo that skips it) is said at warn at start and at each reload, and by
-- `qtgd check`: a payment submitted would sit unwatched.  It is not
-- refused, since a fleet may split them over its hosts; the example alert
-- QtgNodeWorkerMissing fires when no process of the fleet runs one
-- (packaging/qtg-alerts.yml).
M.REQUIRED_WORKERS = { "node_dispatcher", "node_observer", "node_recovery" }

-- missing_workers(registry) -> the required workers the registry does not
-- run (absent, disabled or skipped), in M.REQUIRED_WORKERS order; none
-- while workers are off.
function M.missing_workers(registry)
  if not qtg.settings.workers_enabled or type(registry) ~= "table" then return {} end
  local runs = {}
  for _, w in ipairs(registry) do
    if type(w) == "table" and w.enabled and not w.skip_reason then runs[w.name] = true end
  end
  local out = {}
  for _, name in ipairs(M.REQUIRED_WORKERS) do
    if not runs[name] then out[#out + 1] = name end
  end
  return out
end

-- warn_missing_workers(registry, when): the warning, when one is missing.
function M.warn_missing_workers(registry, when)
  local missing = M.missing_workers(registry)
  if #missing == 0 then return missing end
  qtg.log.warn("this process does not run " .. table.concat(missing, ", ") .. " (" .. when .. "): they move "
    .. "and watch money in flight, so another process must, or nodes sit unwatched",
    { missing = table.concat(missing, ","), network_class = qtg.settings.network_class })
  return missing
end

-- What start_worker and set_interval accept (src/qtg_runtime.c): a registry
-- the runtime would refuse half-way through applying it is refused whole.
M.WORKER_NAME_MAX = 63
M.WORKER_MAX_SECONDS = 31536000

-- The registries whose modules are loaded at their first use: registry
-- module -> the field naming them (a module name, or a table whose values
-- are module names), and the registry's own check of a loaded module when
-- it has one (a function returning a list of errors).
M.FIRST_USE = {
  { registry = "qtg.executors", field = "ADAPTERS", check = "validate" },
  { registry = "qtg.venues", field = "VENUES", check = "validate" },
  { registry = "qtg.approvals", field = "MODULE", check = "validate" },
}

local function kept(name)
  if M.KEEP[name] then return true end
  for _, p in ipairs(M.KEEP_PREFIXES) do
    if name:sub(1, #p) == p then return true end
  end
  return false
end

-- The policy roots, override first.
function M.roots()
  local roots = {}
  local over = qtg.settings.lua_path
  if type(over) == "string" and over ~= "" then roots[#roots + 1] = over end
  roots[#roots + 1] = qtg.root .. "/lua"
  return roots
end

function M.policy_path()
  local parts = {}
  for _, r in ipairs(M.roots()) do
    parts[#parts + 1] = r .. "/?.lua"
    parts[#parts + 1] = r .. "/?/init.lua"
  end
  return table.concat(parts, ";")
end

-- ---- listing the .lua files of a root ---------------------------------------

-- The names in a directory, sorted; nil when it is not a readable directory.
local function list_dir(path)
  if lfs.attributes(path, "mode") ~= "directory" then return nil end
  local ok, iter, dir = pcall(lfs.dir, path)
  if not ok then return nil end
  local names = {}
  for name in iter, dir do
    if name ~= "." and name ~= ".." then names[#names + 1] = name end
  end
  table.sort(names)
  return names
end

-- files(root) -> array of {name = module name, file = path}
function M.files(root)
  local out = {}
  local function walk(dir, prefix, depth)
    if depth > M.MAX_DEPTH then return end
    local names = list_dir(dir)
    if not names then return end
    for _, n in ipairs(names) do
      local path = dir .. "/" .. n
      local stem = n:match("^([%a_][%w_%-]*)%.lua$")
      if stem then
        local mod = stem == "init" and prefix ~= "" and prefix:sub(1, -2) or prefix .. stem
        out[#out + 1] = { name = mod, file = path }
      elseif n:match("^[%a_][%w_%-]*$") then
        walk(path, prefix .. n .. ".", depth + 1)
      end
    end
  end
  walk(root, "", 0)
  return out
end

-- ---- what is in force ---------------------------------------------------------

-- The executors the class's live nodes name (READY, SUBMITTING, SUBMITTED,
-- OBSERVING, UNKNOWN: the claims' partial indexes) that the executor
-- registry now in force has no adapter for.  A reload that drops one
-- (an executors override with a typo) sends each such node UNKNOWN
-- (EXECUTOR_NOT_REGISTERED) at its next pass; recovery settles it once
-- the adapter is back, but the reload should say so: it is said at warn.
M.LIVE_EXECUTORS_SQL = [[
  SELECT DISTINCT n.executor FROM (
    SELECT executor, request_id FROM movement_request_nodes WHERE node_state = 'READY'
    UNION ALL
    SELECT executor, request_id FROM movement_request_nodes WHERE node_state IN ('SUBMITTED', 'OBSERVING')
    UNION ALL
    SELECT executor, request_id FROM movement_request_nodes WHERE node_state IN ('UNKNOWN', 'SUBMITTING')) n
   WHERE (SELECT r.network_class FROM movement_requests r WHERE r.id = n.request_id) = $1
   ORDER BY 1]]

function M.warn_unadapted_nodes(when)
  local ok, rows = pcall(qtg.db.with_session, function(s)
    return s:query(M.LIVE_EXECUTORS_SQL, qtg.settings.network_class)
  end)
  if not ok then return {} end
  local executors, missing = require("qtg.executors"), {}
  for _, r in ipairs(rows) do
    if not executors.known_executor(r.executor) then missing[#missing + 1] = r.executor end
  end
  if #missing > 0 then
    qtg.log.warn("nodes in flight name executors the policy in force has no adapter for (" .. when .. "): they go "
      .. "UNKNOWN (EXECUTOR_NOT_REGISTERED) at their next pass, and recovery settles them once it is back",
      { executors = table.concat(missing, ","), network_class = qtg.settings.network_class })
  end
  return missing
end

-- overrides() -> {root =, digest =, files = {{module, file, sha256}, ...}}:
-- every script of the override directory (MG_LUA_PATH) with the SHA-256 of
-- its text, as it is now; root nil and files empty without one.  The
-- start's and each reload's audit rows carry it, so which policy code ran
-- when (an approval rule, a venue adapter) is on the record, as each
-- console chunk is; digest (of the list) tells two sets apart in a log line.
function M.overrides()
  local over = qtg.settings.lua_path
  local out = { files = {} }
  if type(over) ~= "string" or over == "" then return out end
  out.root = over
  local lines = {}
  for _, f in ipairs(M.files(over)) do
    local fh = io.open(f.file, "rb")
    local text = fh and fh:read("*a")
    if fh then fh:close() end
    local digest = text and qtg.crypto.sha256_hex(text) or "unreadable"
    out.files[#out.files + 1] = { module = f.name, file = f.file, sha256 = digest }
    lines[#lines + 1] = f.name .. " " .. digest
  end
  out.digest = qtg.crypto.sha256_hex(table.concat(lines, "\n"))
  return out
end

-- ---- errors with file and line ----------------------------------------------

local message_of = require("qtg.errors").text

-- {module, file, line, message, traceback}: the location is the first
-- "file.lua:N:" of the message, else the first frame of the traceback in
-- the module's file, else the file alone.
local function failure(name, file, e, tb)
  local msg = message_of(e)
  local f, line = msg:match("([^%s:]+%.lua):(%d+):")
  if not f and tb and file then
    line = tb:match(file:gsub("%p", "%%%0") .. ":(%d+):")
    if line then f = file end
  end
  return { module = name, file = f or file, line = tonumber(line), message = msg, traceback = tb }
end

-- ---- the load phase (runs inside a plain coroutine: no I/O possible) ----------

local function traceback(e)
  return { err = e, traceback = debug.traceback("", 2) }
end

-- Load one module by name as require would, from the policy path.
local function load_module(name, policy_path, errors)
  local existing = package.loaded[name]
  if existing ~= nil then return existing end
  local file = package.searchpath(name, policy_path)
  if not file then
    errors[#errors + 1] = { module = name, message = "module " .. name .. " not found on the policy path" }
    return nil
  end
  local fn, err = loadfile(file)
  if not fn then
    errors[#errors + 1] = failure(name, file, err)
    return nil
  end
  local ok, res = xpcall(fn, traceback, name, file)
  if not ok then
    errors[#errors + 1] = failure(name, file, res.err, res.traceback)
    return nil
  end
  if res == nil then res = package.loaded[name] end
  if res == nil then res = true end
  package.loaded[name] = res
  return res
end

local function check_registry(list, errors)
  if type(list) ~= "table" then
    errors[#errors + 1] = { module = "qtg.workers", message = "registry(settings) did not return a table" }
    return {}
  end
  local plan, seen = {}, {}
  for i, w in ipairs(list) do
    local where = "qtg.workers registry entry " .. i
    if type(w) ~= "table" or type(w.name) ~= "string" or w.name == "" or #w.name > M.WORKER_NAME_MAX then
      errors[#errors + 1] = { module = "qtg.workers", message = where .. ": name must be a string of 1 to "
        .. M.WORKER_NAME_MAX .. " characters" }
    elseif seen[w.name] then
      errors[#errors + 1] = { module = "qtg.workers", message = where .. ": duplicate worker " .. w.name }
    elseif w.group ~= "core" and w.group ~= "sidecar" then
      errors[#errors + 1] = { module = "qtg.workers", message = where .. " (" .. w.name .. "): group must be core or sidecar" }
    elseif type(w.interval) ~= "number" or not (w.interval > 0 and w.interval <= M.WORKER_MAX_SECONDS) then
      errors[#errors + 1] = { module = "qtg.workers", message = where .. " (" .. w.name .. "): interval must be a number > 0"
        .. " and at most " .. M.WORKER_MAX_SECONDS .. " seconds" }
    elseif w.jitter ~= nil and (type(w.jitter) ~= "number" or not (w.jitter >= 0 and w.jitter <= M.WORKER_MAX_SECONDS)) then
      errors[#errors + 1] = { module = "qtg.workers", message = where .. " (" .. w.name .. "): jitter must be a number >= 0"
        .. " and at most " .. M.WORKER_MAX_SECONDS .. " seconds" }
    elseif type(w.module) ~= "string" then
      errors[#errors + 1] = { module = "qtg.workers", message = where .. " (" .. w.name .. "): module must be a string" }
    else
      seen[w.name] = true
      if w.enabled and not w.skip_reason then plan[#plan + 1] = w end
    end
  end
  return plan
end

-- add_once(list, name): name appended to the array list unless it is there
-- (list doubles as the set of its names).
local function add_once(list, name)
  if not list[name] then
    list[name] = true
    list[#list + 1] = name
  end
end

-- The module names a registry's field holds: one name, or a plain table
-- (no metatable: its names must all be visible to this walk) of them.
local function named_modules(r, reg, errors)
  local named = reg[r.field]
  local where = r.registry .. "." .. r.field
  if type(named) == "string" then return { named } end
  if type(named) ~= "table" or getmetatable(named) ~= nil then
    errors[#errors + 1] = { module = r.registry, message = where
      .. " must be a module name or a plain table of them, got " .. type(named)
      .. (type(named) == "table" and " with a metatable" or "") }
    return {}
  end
  local mods = {}
  for _, m in pairs(named) do
    if type(m) ~= "string" then
      errors[#errors + 1] = { module = r.registry, message = where
        .. " must name modules by their names, got a " .. type(m) }
    else
      add_once(mods, m)
    end
  end
  table.sort(mods)
  return mods
end

-- Load a module named by a registry: from the policy path as every policy
-- module, else as `require` finds it at first use (package.path beyond the
-- policy path, a C module), so that a registry naming a module nothing can
-- load is refused too.
local function load_named(m, policy_path, errors)
  if package.searchpath(m, policy_path) or package.loaded[m] ~= nil then
    return load_module(m, policy_path, errors)
  end
  local ok, res = xpcall(require, traceback, m)
  if not ok then
    errors[#errors + 1] = failure(m, nil, res.err, res.traceback)
    return nil
  end
  return res
end

-- The modules the registries of M.FIRST_USE name (each once, sorted), loaded
-- from the new registries; a registry's check runs on each.
local function load_first_use(policy_path, errors)
  local loaded = {}
  for _, r in ipairs(M.FIRST_USE) do
    local reg = load_module(r.registry, policy_path, errors)
    if type(reg) == "table" then
      for _, m in ipairs(named_modules(r, reg, errors)) do
        local mod = load_named(m, policy_path, errors)
        if mod ~= nil then
          loaded[#loaded + 1] = m
          local check = r.check and reg[r.check]
          local ok, errs = true, {}
          if type(check) == "function" then ok, errs = pcall(check, mod) end
          if not ok then errs = { message_of(errs) } end
          if type(errs) == "table" and #errs > 0 then
            errors[#errors + 1] = { module = m, file = package.searchpath(m, policy_path),
                                    message = m .. ": " .. table.concat(errs, "; ") }
          end
        end
      end
    end
  end
  return loaded
end

-- The load phase.  Returns the reloaded modules' names and the worker plan
-- (each entry with .tick); errors go to `errors`.  package.loaded then holds
-- the new modules (the caller restores it when there were errors).
local function load_all(policy_path, roots, errors)
  -- 1. compile every file (first root wins for a module name)
  local seen = {}
  for _, root in ipairs(roots) do
    for _, f in ipairs(M.files(root)) do
      if not seen[f.name] then
        seen[f.name] = true
        local fn, err = loadfile(f.file)
        if not fn then errors[#errors + 1] = failure(f.name, f.file, err) end
      end
    end
  end
  if #errors > 0 then return nil end
  -- 2. the loaded policy modules, afresh
  local names = {}
  for name in pairs(package.loaded) do
    if type(name) == "string" and not kept(name) and package.searchpath(name, policy_path) then
      names[#names + 1] = name
    end
  end
  table.sort(names)
  for _, name in ipairs(names) do package.loaded[name] = nil end
  for _, name in ipairs(names) do load_module(name, policy_path, errors) end
  -- the modules the registries load at first use, from the new registries
  for _, name in ipairs(names) do names[name] = true end
  for _, name in ipairs(load_first_use(policy_path, errors)) do add_once(names, name) end
  for _, name in ipairs(names) do names[name] = nil end
  table.sort(names)
  -- the registry and the modules of the workers it enables
  local plan = {}
  local workers = load_module("qtg.workers", policy_path, errors)
  if type(workers) == "table" and type(workers.registry) == "function" then
    local ok, res = xpcall(workers.registry, traceback, qtg.settings)
    if not ok then
      errors[#errors + 1] = failure("qtg.workers", package.searchpath("qtg.workers", policy_path),
        res.err, res.traceback)
    else
      for _, w in ipairs(check_registry(res, errors)) do
        if package.searchpath(w.module, policy_path) or package.loaded[w.module] then
          local mod = load_module(w.module, policy_path, errors)
          if mod ~= nil then
            if type(mod) ~= "table" or type(mod.tick) ~= "function" then
              errors[#errors + 1] = { module = w.module, file = package.searchpath(w.module, policy_path),
                                      message = "worker module " .. w.module .. " must return a table with tick(session)" }
            else
              plan[#plan + 1] = { spec = w, tick = mod.tick }
            end
          end
        end
      end
    end
  elseif workers ~= nil then
    errors[#errors + 1] = { module = "qtg.workers", message = "qtg.workers must return a table with registry(settings)" }
  end
  return names, plan
end

-- prune(errors, policy_path) -> errors without the cascade: once a module
-- failed, every module that requires it fails too with "loop or previous
-- error loading module 'X'" (Lua keeps a sentinel for X), which names an
-- innocent file; those are dropped, and so are repeats of one file, line
-- and message (a module failing inside another's require is reported by
-- both).
function M.prune(errors, policy_path)
  local failed_files = {}
  for _, e in ipairs(errors) do if e.file then failed_files[e.file] = true end end
  local function failed(dep)
    local file = package.searchpath(dep, policy_path)
    return file and failed_files[file]
  end
  local out, seen = {}, {}
  for _, e in ipairs(errors) do
    local msg = tostring(e.message or "")
    local dep = msg:match("loop or previous error loading module '([^']+)'")
    local key = tostring(e.file) .. ":" .. tostring(e.line) .. ":" .. msg:gsub("^[^\n]-%.lua:%d+: ", "")
    if not (dep and failed(dep)) and not seen[key] then
      seen[key] = true
      out[#out + 1] = e
    end
  end
  if #out == 0 then out[1] = errors[1] end
  return out
end

-- ---- applying the registry ------------------------------------------------------

local function apply(plan, report)
  local rt = qtg.runtime
  local current = {}
  for _, w in ipairs(rt.workers()) do current[w.name] = w end
  local wanted = {}
  for _, p in ipairs(plan) do
    local w = p.spec
    local jitter = w.jitter or 0
    wanted[w.name] = true
    local cur = current[w.name]
    if cur and cur.group ~= w.group then
      rt.stop_worker(w.name)
      report.stopped[#report.stopped + 1] = w.name
      cur = nil
    end
    if cur then
      rt.set_tick(w.name, p.tick)
      report.updated[#report.updated + 1] = w.name
      if cur.interval ~= w.interval or cur.jitter ~= jitter then
        rt.set_interval(w.name, w.interval, jitter)
        report.interval_changed[#report.interval_changed + 1] =
          { name = w.name, from = cur.interval, to = w.interval, jitter = jitter }
      end
    else
      rt.start_worker { name = w.name, group = w.group, interval = w.interval, jitter = jitter,
                        tick = p.tick, drain = w.drain }
      report.started[#report.started + 1] = w.name
    end
  end
  for name in pairs(current) do
    if not wanted[name] then
      rt.stop_worker(name)
      report.stopped[#report.stopped + 1] = name
    end
  end
  table.sort(report.started)
  table.sort(report.stopped)
  table.sort(report.updated)
  -- wake-ups follow the new registry (a worker added, removed, or its
  -- `wake` flag changed); a process without them started has none to follow
  local wakeups = package.loaded["qtg.wakeups"]
  if type(wakeups) == "table" and wakeups.refresh then wakeups.refresh() end
end

-- ---- the first passes after a reload --------------------------------------------

-- A reload can succeed and leave a core worker failing every pass on the
-- new code.  watch(report, seconds) waits (at most `seconds`) for each core
-- worker the reload touched whose next pass is due within that time to
-- finish its first pass on the new code, and lists in report.failing those
-- whose pass failed, with the error; report.unwatched names the ones not
-- due in time, paused, or in a pass on the old code during the swap (the
-- answer does not wait for an old pass to end).
M.WATCH_SECONDS = 10

function M.watch(report, seconds)
  local rt = qtg.runtime
  local touched = {}
  for _, n in ipairs(report.updated) do touched[n] = true end
  for _, n in ipairs(report.started) do touched[n] = true end
  local now = qtg.now()
  local watched = {}
  for _, w in ipairs(rt.workers()) do
    if touched[w.name] and w.group == "core" then
      local due = w.state ~= "running" and (w.state == "ready"
        or (w.next_run_at and w.next_run_at - now <= seconds))
      if due and not w.paused then
        watched[w.name] = { passes = w.ticks, errors = w.errors_total, need = 1 }
      else
        report.unwatched[#report.unwatched + 1] = w.name
      end
    end
  end
  local deadline = qtg.monotonic() + seconds
  while next(watched) and qtg.monotonic() < deadline do
    qtg.sleep(0.1)
    local seen = {}
    for _, w in ipairs(rt.workers()) do seen[w.name] = w end
    for name, b in pairs(watched) do
      local w = seen[name]
      if not w then
        watched[name] = nil
      elseif w.ticks - b.passes >= b.need then
        -- the last pass (the first on the new code) failed
        if w.consecutive_errors > 0 and w.errors_total > b.errors then
          report.failing[#report.failing + 1] = { name = name, error = w.last_error or "?" }
        end
        watched[name] = nil
      end
    end
  end
  for name in pairs(watched) do report.unwatched[#report.unwatched + 1] = name end
  table.sort(report.failing, function(a, b) return a.name < b.name end)
  table.sort(report.unwatched)
  for _, f in ipairs(report.failing) do
    qtg.log.warn("core worker failing after a reload", { worker = f.name, error = f.error, actor = report.actor })
  end
end

-- ---- reporting ----------------------------------------------------------------------

-- describe(report) -> text for the operator.
function M.describe(report)
  local lines = {}
  if report.ok then
    lines[1] = string.format("reloaded %d module%s", #report.modules, #report.modules == 1 and "" or "s")
    if #report.started > 0 then lines[#lines + 1] = "started: " .. table.concat(report.started, ", ") end
    if #report.stopped > 0 then lines[#lines + 1] = "stopped: " .. table.concat(report.stopped, ", ") end
    for _, c in ipairs(report.interval_changed) do
      lines[#lines + 1] = string.format("interval of %s: %.14gs -> %.14gs (from its next sleep)", c.name, c.from, c.to)
    end
    lines[#lines + 1] = string.format("workers on the new code from their next pass: %d", #report.updated)
    for _, f in ipairs(report.failing or {}) do
      lines[#lines + 1] = string.format("FAILING: core worker %s failed its first pass on the new code: %s",
        f.name, f.error)
    end
  else
    lines[1] = report.partly_applied
      and "reload failed while applying the worker registry; the new modules are in force:"
      or "reload failed; the old code keeps running:"
    for _, e in ipairs(report.errors) do
      local where = e.file and (e.file .. (e.line and (":" .. e.line) or "")) or (e.module or "?")
      local msg = e.message
      if msg:sub(1, #where + 2) == where .. ": " then msg = msg:sub(#where + 3) end -- the place once
      lines[#lines + 1] = "  " .. where .. ": " .. msg:gsub("\n", "\n    ")
    end
  end
  local text = table.concat(lines, "\n")
  return setmetatable({ text = text, report = report }, { __pretty = function(self) return self.text end })
end

local function actor_of(who)
  who = tostring(who or "system:reload")
  if who:find(":", 1, true) then return who end
  return "system:" .. who
end

local function audit(report)
  local detail = { ok = report.ok, modules = #report.modules, started = report.started,
                   stopped = report.stopped, version = qtg.version, overrides = report.overrides }
  if not report.ok then
    detail.errors = {}
    for i, e in ipairs(report.errors) do
      detail.errors[i] = { module = e.module, file = e.file, line = e.line, message = e.message }
    end
  end
  local ok, err = pcall(qtg.db.with_session, function(s)
    require("qtg.outbox").audit(s, report.actor, "policy.reload", "policy", "lua", nil, detail)
  end)
  if not ok then qtg.log.warn("reload: cannot write the audit record: " .. message_of(err)) end
end

-- record_start(): the policy code a starting daemon runs, logged and
-- audited (action policy.start), as a reload's is.
function M.record_start()
  local o = M.overrides()
  local stand_in = require("qtg.executors").stand_in_here(qtg.settings.network_class)
  qtg.log.info("policy in force", { version = qtg.version, overrides = #o.files, root = o.root,
    overrides_digest = o.digest })
  if stand_in then qtg.log.warn(stand_in .. "; a class that moves real money must not be listed") end
  local ok, err = pcall(qtg.db.with_session, function(s)
    require("qtg.outbox").audit(s, "system:start", "policy.start", "policy", "lua", nil,
      { version = qtg.version, overrides = o, network_class = qtg.settings.network_class, stand_in = stand_in })
  end)
  if not ok then qtg.log.warn("start: cannot write the policy audit record: " .. message_of(err)) end
end

-- reload(who) -> report {ok, actor, modules, started, stopped, updated,
-- interval_changed, errors, approvers_error (the enrolment of signed
-- approvals could not be read again)}.  Never raises for a broken script: the report
-- says what failed.  who: "console:<uid>" or a reason such as "sighup".
-- opts.watch: seconds to watch the touched core workers' first passes
-- (M.watch; the console and SIGHUP use M.WATCH_SECONDS).
function M.reload(who, opts)
  local report = { ok = false, actor = actor_of(who), modules = {}, started = {}, stopped = {},
                   updated = {}, interval_changed = {}, errors = {}, failing = {}, unwatched = {} }
  local policy_path, roots = M.policy_path(), M.roots()
  report.overrides = M.overrides()
  local before = {}
  for name, mod in pairs(package.loaded) do before[name] = mod end
  -- the override directory's ownership and modes as they are now, not as
  -- they were at start (src/qtg_lua_path.c)
  local untrusted = qtg.crypto.lua_path_check()
  local co = coroutine.create(load_all)
  local done, names, plan = true, nil, nil
  if untrusted then
    report.errors[#report.errors + 1] = { message = untrusted }
  else
    done, names, plan = coroutine.resume(co, policy_path, roots, report.errors)
  end
  if not done then
    report.errors[#report.errors + 1] = { message = "reload failed: " .. message_of(names) }
  elseif not untrusted and coroutine.status(co) ~= "dead" then
    report.errors[#report.errors + 1] = { message = "a policy module yielded while loading (no I/O at load time)" }
  end
  if #report.errors > 0 then
    report.errors = M.prune(report.errors, policy_path)
    -- put package.loaded back exactly as it was: the old modules, and none
    -- of the new ones
    for name in pairs(package.loaded) do
      if before[name] == nil then package.loaded[name] = nil end
    end
    for name, mod in pairs(before) do package.loaded[name] = mod end
  else
    report.modules = names
    local ok, err = pcall(apply, plan, report)
    if not ok then
      -- past the point of no return: the new modules are in force
      report.partly_applied = true
      report.errors[#report.errors + 1] = { message = "applying the worker registry: " .. message_of(err) }
    else
      report.ok = true
    end
  end
  if report.ok then
    local wok, wmod = pcall(require, "qtg.workers")
    if wok and type(wmod) == "table" and type(wmod.registry) == "function" then
      local rok, reg = pcall(wmod.registry, qtg.settings)
      if rok then report.missing_workers = M.warn_missing_workers(reg, "after the reload by " .. report.actor) end
    end
    report.unadapted = M.warn_unadapted_nodes("after the reload by " .. report.actor)
    -- a worker stopped is one that watched something: warn
    local log = #report.stopped > 0 and qtg.log.warn or qtg.log.info
    log("policy reloaded", { actor = report.actor, modules = #report.modules,
      started = table.concat(report.started, ","), stopped = table.concat(report.stopped, ","),
      overrides = #report.overrides.files, overrides_digest = report.overrides.digest })
  else
    local first = report.errors[1]
    qtg.log.error(report.partly_applied
      and "policy reload failed while applying the worker registry: the new modules are in force, the registry partly applied"
      or "policy reload failed; the old code keeps running", { actor = report.actor,
      file = first.file and tostring(first.file) or "", line = first.line and tostring(first.line) or "",
      error = first.message })
  end
  if report.ok then
    -- signed approvals: the new modules read the enrolment again (a revoked
    -- approver stops counting); one they cannot take refuses every vote
    -- until it is fixed and reloaded (qtg.signed_approvals raises)
    local eok, eerr = pcall(function() return require("qtg.signed_approvals").enrolment() end)
    if not eok then
      report.approvers_error = message_of(eerr)
      qtg.log.error("reload: the approvers' enrolment cannot be read: no vote is taken until it is fixed "
        .. "and reloaded", { actor = report.actor, error = report.approvers_error })
    end
  end
  if report.ok and opts and opts.watch and opts.watch > 0 then
    local ok, err = pcall(M.watch, report, opts.watch)
    if not ok then qtg.log.warn("reload: cannot watch the workers: " .. message_of(err)) end
  end
  audit(report)
  return report
end

return M
