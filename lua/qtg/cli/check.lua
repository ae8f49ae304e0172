-- qtgd check [--templates DIR] [--strict] [--quiet]: is this qtgd ready to
-- run?  Validates, in order, the settings, the database (reachable), the
-- migrations (all applied, none edited), the templates (every file valid;
-- loaded versions current) and the policy scripts (every .lua compiles; the
-- worker registry, the enabled workers and the executors load).  The
-- packaged unit runs it as ExecStartPre, so a broken deployment fails before
-- the daemon starts, with one line per problem saying what to do.
--
-- Settings that do not parse never reach this module: `qtgd` itself refuses
-- them at start-up (exit 2, naming the variable).  Here: MG_* variables that
-- are not settings (typos), directories that do not exist, the console's
-- run directory, the callback key, workers skipped for lack of a client.
--
-- Output: one line per finding, `ok`, `warn` or `FAIL`, then a summary.
-- Exit code: 0 (warnings allowed unless --strict), 1 a check failed,
-- 2 usage.
local qtg = require("qtg")
local ffi = require("ffi")

pcall(ffi.cdef, [[
extern char **environ;
int access(const char *path, int mode);
]])

local M = {}

local W_OK, X_OK = 2, 1

-- ---- findings -------------------------------------------------------------

local function new_report()
  return { findings = {}, fails = 0, warns = 0 }
end

local function add(report, level, area, text)
  report.findings[#report.findings + 1] = { level = level, area = area, text = text }
  if level == "FAIL" then report.fails = report.fails + 1 end
  if level == "warn" then report.warns = report.warns + 1 end
end

local message_of = require("qtg.errors").text

local function plural(n, word, words)
  return n .. " " .. (n == 1 and word or (words or word .. "s"))
end

-- ---- small file-system helpers ------------------------------------------------

local function lfs() return require("lfs") end

local function is_dir(path)
  return lfs().attributes(path, "mode") == "directory"
end

local function accessible(path, mode)
  return ffi.C.access(path, mode) == 0
end

local function parent(path)
  return path:match("^(.*)/[^/]+/*$") or "."
end

-- the nearest existing ancestor of path (path itself when it exists)
local function existing_ancestor(path)
  local p = path
  for _ = 1, 64 do
    if lfs().attributes(p) then return p end
    local up = parent(p)
    if up == p or up == "" then return "/" end
    p = up
  end
  return p
end

-- ---- settings ------------------------------------------------------------------

-- Levenshtein distance, bounded: good enough to suggest a setting's name.
local function distance(a, b)
  if math.abs(#a - #b) > 8 then return 99 end
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

function M.suggest(name, known)
  local best, best_d
  for _, k in ipairs(known) do
    local d = distance(name, k)
    if k:sub(1, #name) == name or name:sub(1, #k) == k then d = math.min(d, 2) end
    if not best_d or d < best_d then best, best_d = k, d end
  end
  if best_d and best_d <= math.max(3, math.floor(#name / 4)) then return best end
end

-- The MG_* names in this process's environment.
function M.environment_names()
  local out = {}
  local env = ffi.C.environ
  local i = 0
  while env[i] ~= nil do
    local entry = ffi.string(env[i])
    local name = entry:match("^(MG_[^=]*)=")
    if name then out[#out + 1] = name end
    i = i + 1
  end
  table.sort(out)
  return out
end

-- Where the console socket goes, as qtgd decides it (src/qtg_console.c).
local function console_socket(settings)
  if settings.console_socket ~= "" then return settings.console_socket, "MG_CONSOLE_SOCKET" end
  if settings.run_dir ~= "" then return settings.run_dir .. "/console.sock", "MG_RUN_DIR" end
  local rt = os.getenv("RUNTIME_DIRECTORY")
  if rt and rt ~= "" then return rt .. "/console.sock", "RUNTIME_DIRECTORY" end
  return qtg.root .. "/var/run/console.sock", "the default (<root>/var/run)"
end

-- unknown_settings([env_names]) -> {{name=, hint=}}: MG_* names in the
-- environment that are not settings (typos), with the closest setting.
function M.unknown_settings(env_names)
  local known, known_set = {}, {}
  for _, row in ipairs(qtg.settings_list()) do
    known[#known + 1] = row.name
    known_set[row.name] = true
  end
  local out = {}
  for _, name in ipairs(env_names or M.environment_names()) do
    if not known_set[name] then out[#out + 1] = { name = name, hint = M.suggest(name, known) } end
  end
  return out
end

function M.check_settings(report, opts)
  local settings = qtg.settings
  local known, known_set = {}, {}
  for _, row in ipairs(qtg.settings_list()) do
    known[#known + 1] = row.name
    known_set[row.name] = true
  end
  local ok = true
  for _, name in ipairs(opts.env_names or M.environment_names()) do
    if not known_set[name] then
      local hint = M.suggest(name, known)
      add(report, "FAIL", "settings", name .. " is not a qtg setting"
        .. (hint and (" (did you mean " .. hint .. "?)") or "")
        .. "; `qtgd settings` lists them all")
      ok = false
    end
  end
  local lua_path_error = qtg.crypto.lua_path_error()
  if lua_path_error then
    add(report, "FAIL", "settings", lua_path_error)
    ok = false
  elseif settings.lua_path ~= "" and not is_dir(settings.lua_path) then
    add(report, "FAIL", "settings", "MG_LUA_PATH=" .. settings.lua_path .. " is not a directory")
    ok = false
  end
  if settings.templates_dir ~= "" and not is_dir(settings.templates_dir) then
    add(report, "FAIL", "settings", "MG_TEMPLATES_DIR=" .. settings.templates_dir .. " is not a directory")
    ok = false
  end
  if settings.console_enabled then
    local sock, from = console_socket(settings)
    local dir = parent(sock)
    local base = existing_ancestor(dir)
    if lfs().attributes(base, "mode") ~= "directory" then
      add(report, "FAIL", "settings", ("the console socket %s (from %s) cannot be created: %s is not a directory")
        :format(sock, from, base))
      ok = false
    elseif not accessible(base, W_OK + X_OK) then
      add(report, "FAIL", "settings", ("the console socket %s (from %s) cannot be created: %s is not writable"
        .. " by this user; set MG_RUN_DIR to a writable directory, or MG_CONSOLE_ENABLED=false")
        :format(sock, from, base))
      ok = false
    end
  end
  if ok then
    local n = 0
    for _, row in ipairs(qtg.settings_list()) do if row.set then n = n + 1 end end
    add(report, "ok", "settings", ("%s valid (%d set, the rest default); network class %s")
      :format(plural(#known, "setting"), n, settings.network_class))
  end
  local stand_in = require("qtg.executors").stand_in_here(settings.network_class)
  if stand_in then add(report, "warn", "settings", stand_in .. "; a class that moves real money must not be listed") end
  local keys_error = qtg.crypto.keys_error()
  if keys_error then
    add(report, "FAIL", "settings", keys_error)
    ok = false
  elseif not settings.callback_key_configured and settings.callback_key_file == "" then
    add(report, "warn", "settings", "no callback key (MG_CALLBACK_KEY_FILE): callbacks cannot be signed,"
      .. " so requests with a callback_url keep them pending")
  elseif settings.callback_key_file ~= "" and not qtg.crypto.callback_key_id() then
    add(report, "FAIL", "settings", "MG_CALLBACK_KEY_FILE=" .. settings.callback_key_file .. " was not loaded")
    ok = false
  end
  if settings.signer_approvers ~= "" then
    local enrolment, why = qtg.approvers.load(settings.signer_approvers)
    if not enrolment then
      add(report, "FAIL", "settings", why)
      ok = false
    elseif not enrolment:quorum(settings.network_class) then
      add(report, "FAIL", "settings", ("MG_SIGNER_APPROVERS names no quorum for network class %s (nor *):"
        .. " no request of it can be created"):format(settings.network_class))
      ok = false
    else
      local tiers = enrolment:tiers(settings.network_class)
      add(report, "ok", "settings", ("signed approvals: %s enrolled, quorum %d for %s%s, deployment %s%s"):format(
        plural(enrolment:count(), "person", "persons"), enrolment:quorum(settings.network_class),
        settings.network_class, tiers and " (" .. tiers .. ")" or "", enrolment:deployment(),
        enrolment:initiation_signed() and ", initiation signed" or ""))
    end
  end
  if not settings.workers_enabled then
    add(report, "warn", "settings", "MG_WORKERS_ENABLED=false: `qtgd run` will start no worker")
  end
  local batch = tonumber(settings.node_recovery_batch_size)
  if batch and batch < 4 then
    local recovery = require("qtg.workers.node_recovery")
    local starved = {}
    for i, n in ipairs(recovery.arm_sizes(batch)) do
      if n == 0 then starved[#starved + 1] = recovery.LANES[i].name end
    end
    add(report, "warn", "settings", ("MG_NODE_RECOVERY_BATCH_SIZE=%d is below 4: recovery's batch is"
      .. " split over four arms of max(1, batch // 4) in priority order, so the later arms (%s)"
      .. " never recover a node; keep it at 4 or more"):format(batch, table.concat(starved, ", ")))
  end
  return ok
end

-- ---- database ------------------------------------------------------------------

-- The database URL without its password.
M.redact = require("qtg.redact").database_url

-- Acquire a session, giving up after `timeout` seconds.
local function acquire(timeout)
  local box = {}
  local task = qtg.spawn(function()
    local ok, s = pcall(qtg.db.acquire)
    if box.abandoned then
      if ok then s:release() end
      return
    end
    box.done, box.ok, box.value = true, ok, s
  end)
  local deadline = qtg.monotonic() + timeout
  while not box.done and qtg.monotonic() < deadline do qtg.sleep(0.02) end
  if not box.done then
    box.abandoned = true
    return nil, ("no answer within %.14g s (MG_CHECK_TIMEOUT_SECONDS)"):format(timeout), task
  end
  if not box.ok then return nil, message_of(box.value) end
  return box.value
end

function M.check_database(report, opts)
  local s, err = acquire(opts.timeout)
  if not s then
    local url = os.getenv("MG_DATABASE_URL") or ""
    local where = url ~= "" and ("MG_DATABASE_URL=" .. M.redact(url)) or "the private cluster of tools/pg"
    add(report, "FAIL", "database", ("cannot connect to PostgreSQL (%s): %s; is it running,"
      .. " and is the URL right?"):format(where, err))
    return nil
  end
  local ok, info = pcall(s.query, s, [[SELECT current_setting('server_version') AS version,
    current_database() AS db, current_user AS usr, pg_is_in_recovery() AS standby]])
  if not ok then
    s:release()
    add(report, "FAIL", "database", "connected, but a first query failed: " .. message_of(info))
    return nil
  end
  info = info[1]
  if info.standby then
    s:release()
    add(report, "FAIL", "database", "database " .. info.db .. " is a read-only standby; point MG_DATABASE_URL at the primary")
    return nil
  end
  add(report, "ok", "database", ("PostgreSQL %s, database %s as %s"):format(info.version, info.db, info.usr))
  return s
end

-- ---- the daemon's database role -------------------------------------------------

-- Network classes that move no real money are those the stand-in executor
-- may run on (MG_SIM_NETWORK_CLASSES): there a superuser or owning role is a
-- warning (the development cluster connects as its superuser); everywhere
-- else it is a failure.
local function development_class(class)
  return require("qtg.executors").allowed("sim", class) == true
end

M.ROLE_SQL = [[
SELECT r.rolsuper AS superuser,
       (SELECT count(*)::int FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p')
           AND pg_has_role(current_user, c.relowner, 'USAGE')) AS owned,
       pg_has_role(current_user, 'qtg_runtime', 'MEMBER') AS runtime
  FROM pg_roles r WHERE r.rolname = current_user]]

-- A daemon that owns its tables or is a superuser can rewrite the audit
-- trail and switch its guards off (docs/security.md, "Database roles").
function M.check_role(report, s)
  local has_runtime = s:query("SELECT to_regrole('qtg_runtime') IS NOT NULL AS ok")[1].ok
  local sql = has_runtime and M.ROLE_SQL or M.ROLE_SQL:gsub(
    "pg_has_role%(current_user, 'qtg_runtime', 'MEMBER'%)", "false")
  local r = s:query(sql)[1]
  local class = qtg.settings.network_class
  local level = development_class(class) and "warn" or "FAIL"
  local user = s:query("SELECT current_user AS u")[1].u
  if r.superuser then
    add(report, level, "db role", ("%s is a superuser: it can disable the audit trail's guards;"
      .. " run the daemon as a member of qtg_runtime (docs/operations.md)%s"):format(user,
      level == "warn" and (" (a warning: MG_SIM_NETWORK_CLASSES lets the stand-in executor run on " .. class
        .. ", which is taken for a class that moves no real money)") or ""))
  elseif r.owned > 0 then
    add(report, level, "db role", ("%s owns %s: it can alter them and disable their triggers;"
      .. " migrate as the owner, run the daemon as a member of qtg_runtime"):format(user,
      plural(r.owned, "table")))
  elseif not r.runtime then
    add(report, "warn", "db role", user .. " is not a member of qtg_runtime: grants may be missing")
  else
    add(report, "ok", "db role", user .. " is a member of qtg_runtime and owns nothing")
  end
  -- A role that may create in public can shadow a built-in there (an
  -- overload with exact argument types wins), in the functions that run
  -- with the owner's rights (qtg_audit_promote) as in any other session:
  -- PostgreSQL 15 no longer lets PUBLIC create there; a cluster upgraded
  -- from 14 or older keeps the old grant.
  -- sql/0201: no function of qtg reads a temporary table any more, but a
  -- role that may create them can still shadow a table for its own session
  if not r.superuser and s:query("SELECT has_database_privilege($1, current_database(), 'TEMPORARY') AS t",
      user)[1].t then
    add(report, "warn", "db role", ("%s may create temporary tables; REVOKE TEMPORARY ON DATABASE %s FROM PUBLIC"
      .. " (and from %s) as the database's owner (`qtgd migrate` does when it may)"):format(user,
      s:query("SELECT current_database() AS d")[1].d, user))
  end
  if s:query("SELECT has_schema_privilege($1, 'public', 'CREATE') AS c", user)[1].c then
    add(report, level, "db role", ("%s may create objects in schema public: it could shadow a"
      .. " built-in function there; REVOKE CREATE ON SCHEMA public FROM PUBLIC (and from %s)"
      .. " as the schema's owner"):format(user, user))
  end
end

-- ---- the API clients' callback keys -------------------------------------------

-- A client whose key derives from the host's callback key (scheme c) can
-- have its callbacks forged by any receiver of operator callbacks, which
-- holds that key (docs/callbacks.md, "The clients' keys and the host key").
function M.check_api_clients(report, s)
  local rows = s:query([[SELECT name FROM api_clients WHERE key_scheme = 'c' ORDER BY name]])
  local all = s:query("SELECT count(*)::int AS n FROM api_clients")[1].n
  if all == 0 then return end
  local names = {}
  for i = 1, math.min(#rows, 5) do names[i] = rows[i].name end
  if #rows > 5 then names[#names + 1] = "..." end
  if qtg.api_keys.scheme() == "c" then
    add(report, "warn", "api clients", ("MG_CALLBACK_CLIENT_KEY_FILE is not set: the callback keys of %s"
      .. " derive from the callback key, which every receiver of operator callbacks holds, so any of"
      .. " them can forge a client's callbacks; set it (docs/callbacks.md)"):format(plural(all, "API client")))
  elseif #rows > 0 then
    add(report, "warn", "api clients", ("%s still on a key derived from the callback key (c. key ids: %s);"
      .. " `qtgd tokens rotate-callback-key NAME` moves each onto MG_CALLBACK_CLIENT_KEY_FILE")
      :format(plural(#rows, "API client is", "API clients are"), table.concat(names, ", ")))
  else
    add(report, "ok", "api clients", ("%s, each on its own callback key (m.)"):format(plural(all, "API client")))
  end
end

-- ---- payments in flight that nothing observes ----------------------------------

-- The observer and recovery sweep the nodes of EXECUTING requests only.  A
-- request in any other state with a node still in flight (SUBMITTING,
-- SUBMITTED, OBSERVING) has a payment out that nothing watches: a request
-- that went FAILED beside a sibling in flight before the engine held such a
-- request EXECUTING (docs/conformance.md, difference 11), or a row changed
-- by hand.  What brings the node back under watch, by the request's state:
M.UNWATCHED_LIMIT = 10
M.UNWATCHED_ADVICE = {
  FAILED = "`resume` it: the observer watches the node, nothing is submitted again",
  MANUAL_INTERVENTION = "`resume` it: the observer watches the node",
}
M.UNWATCHED_OTHERWISE = "no command resumes it: ask the provider what became of the node"

-- The node states in flight, written so that the partial indexes of
-- SUBMITTED/OBSERVING and of SUBMITTING nodes serve the query.
M.UNWATCHED_SQL = [[
SELECT r.id::text AS id, r.request_state,
       string_agg(n.node_key || ' ' || n.node_state, ', ' ORDER BY n.node_key) AS nodes
  FROM movement_requests r
  JOIN movement_request_nodes n ON n.request_id = r.id
 WHERE r.network_class = $1 AND r.request_state <> 'EXECUTING'
   AND (n.node_state IN ('SUBMITTED', 'OBSERVING') OR n.node_state = 'SUBMITTING')
 GROUP BY r.id, r.request_state
 ORDER BY r.id
 LIMIT $2]]

function M.check_unwatched_nodes(report, s)
  local rows = s:query(M.UNWATCHED_SQL, qtg.settings.network_class, M.UNWATCHED_LIMIT + 1)
  if #rows == 0 then
    add(report, "ok", "in flight", "every node in flight belongs to an EXECUTING request (observed)")
    return
  end
  local shown = {}
  for i = 1, math.min(#rows, M.UNWATCHED_LIMIT) do
    local r = rows[i]
    shown[i] = ("%s (%s; %s): %s"):format(r.id, r.request_state, r.nodes,
      M.UNWATCHED_ADVICE[r.request_state] or M.UNWATCHED_OTHERWISE)
  end
  if #rows > M.UNWATCHED_LIMIT then shown[#shown + 1] = "..." end
  add(report, "warn", "in flight", "nodes in flight that nothing observes, their requests not EXECUTING: "
    .. table.concat(shown, "; "))
end

-- ---- migrations ------------------------------------------------------------------

function M.check_migrations(report, s)
  local migrate = require("qtg.cli.migrate")
  local dir = migrate.dir()
  local ok, pending, changed, newer = pcall(migrate.pending, s, dir)
  if not ok then
    add(report, "FAIL", "migrations", message_of(pending))
    return false
  end
  local good = true
  if #pending > 0 then
    local shown = { unpack(pending, 1, math.min(#pending, 4)) }
    if #pending > 4 then shown[#shown + 1] = "..." end
    add(report, "FAIL", "migrations", ("%s not applied (%s); run `qtgd migrate`")
      :format(plural(#pending, "migration"), table.concat(shown, ", ")))
    good = false
  end
  if #changed > 0 then
    add(report, "FAIL", "migrations", ("%s changed after being applied: %s; restore the files"
      .. " and put the change in a new migration"):format(plural(#changed, "file"), table.concat(changed, ", ")))
    good = false
  end
  if #newer > 0 then
    add(report, "warn", "migrations", ("the database has %s this qtgd does not know (%s): a newer qtgd migrated it")
      :format(plural(#newer, "migration"), table.concat(newer, ", ")))
  end
  if good then
    -- none pending: every migration file here is applied
    add(report, "ok", "migrations", ("%d applied, none pending (%s)"):format(#migrate.list_files(dir), dir))
  end
  return good
end

-- ---- templates ----------------------------------------------------------------------

function M.templates_dir(opts)
  if opts.templates then return opts.templates end
  if qtg.settings.templates_dir ~= "" then return qtg.settings.templates_dir end
  return qtg.root .. "/templates"
end

function M.check_templates(report, s, opts)
  local dir = M.templates_dir(opts)
  local templates = require("qtg.templates")
  local ok, compiled, errors = pcall(templates.compile_dir, dir)
  if not ok then
    add(report, "FAIL", "templates", dir .. ": " .. message_of(compiled))
    return false
  end
  if not compiled then
    for _, e in ipairs(errors) do add(report, "FAIL", "templates", e) end
    return false
  end
  local keys = {}
  for i, c in ipairs(compiled) do keys[i] = c.template_key end
  add(report, "ok", "templates", ("%s valid in %s (%s)"):format(plural(#compiled, "template"), dir,
    table.concat(keys, ", ")))
  if s then
    local latest = {}
    for _, r in ipairs(s:query([[
        SELECT DISTINCT ON (t.template_key) t.template_key, pv.version, pv.content_hash
          FROM movement_templates t JOIN plan_versions pv ON pv.template_id = t.id
         ORDER BY t.template_key, pv.version DESC]])) do
      latest[r.template_key] = r
    end
    local missing, stale = {}, {}
    for _, c in ipairs(compiled) do
      local l = latest[c.template_key]
      if not l then missing[#missing + 1] = c.template_key
      elseif l.content_hash ~= c.content_hash then
        stale[#stale + 1] = ("%s (loaded: version %d)"):format(c.template_key, l.version)
      end
    end
    if #missing > 0 then
      add(report, "warn", "templates", ("not loaded: %s; run `qtgd templates load %s`")
        :format(table.concat(missing, ", "), dir))
    end
    if #stale > 0 then
      add(report, "warn", "templates", ("the file differs from the loaded version: %s; run `qtgd templates load %s`")
        :format(table.concat(stale, ", "), dir))
    end
    -- a loaded template whose nodes run on an executor not allowed on this
    -- class (sim on a real network) would fail there: say so now
    local executors = require("qtg.executors")
    local class = qtg.settings.network_class
    for _, r in ipairs(s:query([[
        SELECT t.template_key, string_agg(DISTINCT pn.executor, ',') AS executors
          FROM movement_templates t
          JOIN LATERAL (SELECT id FROM plan_versions WHERE template_id = t.id
                         ORDER BY version DESC LIMIT 1) pv ON true
          JOIN plan_nodes pn ON pn.plan_version_id = pv.id
         GROUP BY t.template_key ORDER BY t.template_key]])) do
      for name in r.executors:gmatch("[^,]+") do
        local allowed, why = executors.allowed(name, class)
        if not allowed then
          add(report, "FAIL", "templates", ("template %s would run on %s: %s"):format(r.template_key, name, why))
        end
      end
    end
  end
  return true
end

-- ---- policy scripts -------------------------------------------------------------------

-- Load a module in a plain coroutine: a script that tries I/O while it
-- loads fails here, as it would fail the daemon's start or a reload.
-- A module that failed to load earlier (e.g. an executor the template
-- check asked for) left the loader's sentinel in package.loaded (LuaJIT's
-- is not even a userdata): anything but a table is cleared, so the real
-- error is reported again rather than "loop or previous error".
local function load_module(name)
  if type(package.loaded[name]) ~= "table" then package.loaded[name] = nil end
  local co = coroutine.create(function() return require(name) end)
  local ok, res = coroutine.resume(co)
  if not ok then return nil, message_of(res) end
  if coroutine.status(co) ~= "dead" then return nil, "yielded while loading (no I/O at load time)" end
  return res
end

function M.check_policies(report)
  local reload = require("qtg.reload")
  local roots = reload.roots()
  local seen, overridden, nfiles, good = {}, {}, 0, true
  for i, root in ipairs(roots) do
    if not is_dir(root) then
      if i == #roots then
        add(report, "FAIL", "policies", root .. " is not a directory (the packaged policy scripts)")
        good = false
      end
    else
      for _, f in ipairs(reload.files(root)) do
        if not seen[f.name] then
          seen[f.name] = f.file
          nfiles = nfiles + 1
          if i < #roots then overridden[#overridden + 1] = f.name end
          local fn, err = loadfile(f.file)
          if not fn then
            -- Lua shortens long chunk names ("...spec/x.lua:4:"): name the file whole
            local line, msg = message_of(err):match(":(%d+): (.*)$")
            add(report, "FAIL", "policies", line and (f.file .. ":" .. line .. ": " .. msg)
              or (f.file .. ": " .. message_of(err)))
            good = false
          end
        end
      end
    end
  end
  if not good then return false end
  -- what `qtgd run` loads: the entry point, the worker registry and every
  -- enabled worker, the executors, and every module the override provides
  local names = { "qtg.main", "qtg.workers" }
  local wmod, werr = load_module("qtg.workers")
  local nworkers = 0
  if not wmod then
    add(report, "FAIL", "policies", "qtg.workers: " .. werr)
    return false
  end
  local ok, registry = pcall(wmod.registry, qtg.settings)
  if not ok or type(registry) ~= "table" then
    add(report, "FAIL", "policies", "qtg.workers.registry(settings) failed: " .. message_of(registry))
    return false
  end
  local missing = require("qtg.reload").missing_workers(registry)
  if #missing > 0 then
    add(report, "warn", "policies", "the worker registry does not run " .. table.concat(missing, ", ")
      .. ": they move and watch money in flight, so another process must, or nodes sit unwatched")
  end
  for _, w in ipairs(registry) do
    if w.skip_reason then
      add(report, "warn", "policies", ("worker %s is enabled but skipped: %s"):format(w.name, w.skip_reason))
    elseif w.enabled then
      if package.searchpath(w.module, package.path) then
        names[#names + 1] = w.module
        nworkers = nworkers + 1
      else
        add(report, "warn", "policies", ("worker %s is enabled but %s is not in this build")
          :format(w.name, w.module))
      end
    end
  end
  local emod, eerr = load_module("qtg.executors")
  if not emod then
    add(report, "FAIL", "policies", "qtg.executors: " .. eerr)
    return false
  end
  local adapters = {}
  for name, modname in pairs(emod.ADAPTERS or {}) do adapters[#adapters + 1] = { name, modname } end
  table.sort(adapters, function(a, b) return a[1] < b[1] end)
  local adapter_modules = {}
  for _, a in ipairs(adapters) do
    names[#names + 1] = a[2]
    adapter_modules[a[2]] = true
  end
  for _, n in ipairs(overridden) do names[#names + 1] = n end
  local loaded = {}
  for _, name in ipairs(names) do
    if not loaded[name] then
      loaded[name] = true
      local mod, err = load_module(name)
      if mod == nil then
        add(report, "FAIL", "policies", name .. ": " .. err)
        good = false
      elseif name:match("^qtg%.workers%.") and (type(mod) ~= "table" or type(mod.tick) ~= "function") then
        add(report, "FAIL", "policies", ("%s (%s) must return a table with tick(session)")
          :format(name, tostring(seen[name])))
        good = false
      elseif adapter_modules[name] then
        local errs = emod.validate(mod)
        if #errs > 0 then
          add(report, "FAIL", "policies", name .. ": " .. table.concat(errs, "; "))
          good = false
        end
      end
    end
  end
  -- the approval policy: loads and its rules are well formed
  local policy, perr = load_module("qtg.policies.approval")
  local perrs = policy ~= nil and require("qtg.approvals").validate(policy) or { perr }
  for _, e in ipairs(perrs) do
    add(report, "FAIL", "policies", "qtg.policies.approval: " .. tostring(e))
    good = false
  end
  if good then
    local text = ("%s compile; %s and %s load"):format(plural(nfiles, "script"),
      plural(nworkers, "enabled worker"), plural(#adapters, "executor"))
    if #overridden > 0 then
      table.sort(overridden)
      text = text .. ("; %s from %s: %s"):format(plural(#overridden, "override"), roots[1],
        table.concat(overridden, ", "))
    end
    add(report, "ok", "policies", text)
  end
  return good
end

-- ---- running the checks ------------------------------------------------------------------

-- run_checks(opts) -> report.  opts: templates (dir), timeout, env_names.
function M.run_checks(opts)
  opts = opts or {}
  opts.timeout = opts.timeout or qtg.settings.check_timeout_seconds
  local report = new_report()
  M.check_settings(report, opts)
  local s = M.check_database(report, opts)
  local migrated = false
  if s then
    local ok, res = pcall(M.check_migrations, report, s)
    if not ok then add(report, "FAIL", "migrations", message_of(res)) end
    migrated = ok and res
    local rok, rerr = pcall(M.check_role, report, s)
    if not rok then add(report, "FAIL", "db role", message_of(rerr)) end
    if migrated then
      local cok, cerr = pcall(M.check_api_clients, report, s)
      if not cok then add(report, "FAIL", "api clients", message_of(cerr)) end
      local uok, uerr = pcall(M.check_unwatched_nodes, report, s)
      if not uok then add(report, "FAIL", "in flight", message_of(uerr)) end
    end
  else
    add(report, "FAIL", "migrations", "not checked: no database")
  end
  -- the loaded versions are compared only on a migrated schema
  local ok, err = pcall(M.check_templates, report, migrated and s or nil, opts)
  if not ok then add(report, "FAIL", "templates", message_of(err)) end
  if s then s:release() end
  ok, err = pcall(M.check_policies, report)
  if not ok then add(report, "FAIL", "policies", message_of(err)) end
  return report
end

function M.format(report, opts)
  opts = opts or {}
  local lines = {}
  for _, f in ipairs(report.findings) do
    if not (opts.quiet and f.level == "ok") then
      local text = f.text:gsub("\n", "\n" .. string.rep(" ", 18))
      lines[#lines + 1] = ("%-5s %-11s %s"):format(f.level, f.area, text)
    end
  end
  local failed = report.fails > 0 or (opts.strict and report.warns > 0)
  if failed then
    lines[#lines + 1] = ("qtgd check: FAILED (%s, %s)"):format(plural(report.fails, "failure"),
      plural(report.warns, "warning"))
  else
    lines[#lines + 1] = ("qtgd check: ok%s"):format(report.warns > 0
      and (" (" .. plural(report.warns, "warning") .. ")") or "")
  end
  return table.concat(lines, "\n") .. "\n", failed
end

local USAGE = "usage: qtgd check [--templates DIR] [--strict] [--quiet]\n"

function M.parse_args(args)
  local opts, i = {}, 1
  while i <= #args do
    local a = args[i]
    if a == "--templates" then
      if not args[i + 1] or args[i + 1] == "" then return nil, "--templates needs a directory" end
      opts.templates = args[i + 1]
      i = i + 1
    elseif a:match("^%-%-templates=") then
      opts.templates = a:sub(13)
      if opts.templates == "" then return nil, "--templates needs a directory" end
    elseif a == "--strict" then opts.strict = true
    elseif a == "--quiet" or a == "-q" then opts.quiet = true
    elseif a == "--help" or a == "-h" then opts.help = true
    else return nil, "unknown argument: " .. a end
    i = i + 1
  end
  return opts
end

function M.run(args)
  local opts, err = M.parse_args(args or {})
  if not opts then
    io.stderr:write("qtgd check: ", err, "\n", USAGE)
    return 2
  end
  if opts.help then
    io.stdout:write(USAGE)
    return 0
  end
  local report = M.run_checks(opts)
  local text, failed = M.format(report, opts)
  io.stdout:write(text)
  io.stdout:flush() -- before the host closes: nothing at exit may lose the report
  return failed and 1 or 0
end

return M
