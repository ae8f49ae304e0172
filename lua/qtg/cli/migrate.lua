-- qtgd migrate: apply sql/NNNN_name.sql in order, each in its own
-- transaction, recorded in schema_migrations with a checksum.  Idempotent;
-- refuses to go on when an applied file was edited afterwards (write a new
-- migration instead).  An advisory lock serialises concurrent migrators.
local qtg = require("qtg")
local lfs = require("lfs")

local M = {}

local MIGRATION_LOCK = 7460281 -- any constant shared by every qtgd

-- list_files(dir) -> the migration file names (NNNN_name.sql) in dir,
-- sorted; raises when dir cannot be read.  `qtgd check` lists with it too.
local function list_files(dir)
  local files = {}
  local ok, iter, state = pcall(lfs.dir, dir)
  if not ok then error("cannot read the migrations directory " .. dir .. ": " .. tostring(iter), 0) end
  for name in iter, state do
    if name:match("^%d%d%d%d_[%w_%-]+%.sql$") then files[#files + 1] = name end
  end
  table.sort(files)
  return files
end
M.list_files = list_files

local function read_file(path)
  local f, err = io.open(path, "rb")
  if not f then error("cannot read " .. tostring(err), 0) end
  local body = f:read("*a")
  f:close()
  return body
end

-- applied_versions(s) -> {version = checksum}, the versions in order.
local function applied_versions(s)
  local done, versions = {}, {}
  for _, row in ipairs(s:query("SELECT version, checksum FROM schema_migrations ORDER BY version")) do
    done[row.version] = row.checksum
    versions[#versions + 1] = row.version
  end
  return done, versions
end

-- grant_roles(s, log): the runtime role's grants on every table there is
-- now (sql/0102), after every run, so tables of later migrations are
-- covered.  Before 0102 is applied there is nothing to call.
function M.grant_roles(s, log)
  local has = s:query("SELECT to_regprocedure('qtg_grant_roles()') IS NOT NULL AS ok")[1].ok
  if not has then return end
  local said = s:query("SELECT qtg_grant_roles() AS said")[1].said
  if said ~= "granted" then (log or function() end)("roles: " .. tostring(said)) end
end

-- A migration waits at most LOCK_WAIT_SECONDS for a table's lock, then
-- lets go, says who holds it and tries again, LOCK_TRIES times: a lock
-- request that waits queues every later reader of that table behind it,
-- so an idle transaction anywhere (an operator's psql, a report) held
-- every daemon's workers for as long as it stayed open (a review, session
-- 44).  The statements themselves have no bound.
M.LOCK_WAIT_SECONDS = 5
M.LOCK_TRIES = 60
M.LOCK_PAUSE_SECONDS = 2

-- who_holds(s) -> the oldest open transactions of this database as text
-- (the lock the migration waited for is let go of by then, so the
-- likeliest holders: an idle one is the usual culprit)
local function who_holds(s)
  local ok, rows = pcall(s.query, s, [[
    SELECT pid, coalesce(nullif(application_name, ''), '-') AS app, state,
           to_char(xact_start, 'YYYY-MM-DD HH24:MI:SS') AS since
      FROM pg_stat_activity
     WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
     ORDER BY xact_start LIMIT 5]])
  if not ok or #rows == 0 then return "a session that has ended" end
  local out = {}
  for i, r in ipairs(rows) do
    out[i] = ("pid %s (%s, %s, in a transaction since %s)"):format(r.pid, r.app, r.state, r.since)
  end
  return "one of " .. table.concat(out, ", ")
end

-- apply_one(s, name, body, sum, log): the file and its schema_migrations
-- row in one transaction, its lock waits bounded (M.LOCK_WAIT_SECONDS,
-- tried M.LOCK_TRIES times).
local function apply_one(s, name, body, sum, log)
  for try = 1, M.LOCK_TRIES do
    local blocked = false
    local ok, err = pcall(s.transaction, s, function()
      s:exec(("SET LOCAL lock_timeout = '%ds'"):format(M.LOCK_WAIT_SECONDS))
      -- the file's own error is reported with its name, detail and hint
      -- (the INSERT's as it is)
      local ran, ferr = pcall(s.exec, s, body)
      if not ran then
        blocked = type(ferr) == "table" and ferr.sqlstate == "55P03" and try < M.LOCK_TRIES
        local said = { tostring(type(ferr) == "table" and ferr.message or ferr) }
        for _, k in ipairs({ "detail", "hint" }) do
          if type(ferr) == "table" and ferr[k] then said[#said + 1] = k .. ": " .. tostring(ferr[k]) end
        end
        error(("migration %s failed: %s"):format(name, table.concat(said, "; ")), 0)
      end
      s:query("INSERT INTO schema_migrations (version, checksum) VALUES ($1, $2)", name, sum)
    end)
    if ok then return end
    if not blocked then error(err, 0) end
    log(("migration %s waits for a lock: held by %s; trying again (%d of %d)"):format(name, who_holds(s), try,
      M.LOCK_TRIES))
    qtg.sleep(M.LOCK_PAUSE_SECONDS)
  end
end

-- Returns applied, skipped counts; raises a message on refusal or failure.
function M.apply(s, dir, log)
  log = log or function() end
  -- A migration may rewrite a table and wait for its lock, and concurrent
  -- migrators wait for each other: the session's bounds
  -- (MG_DB_STATEMENT_TIMEOUT_SECONDS, MG_DB_LOCK_TIMEOUT_SECONDS) are for
  -- the workers' statements, not for this.
  require("qtg.cli").unbound(s)
  -- the lock first: two first migrators creating the table at once race
  -- in the catalog (one failed with a duplicate key of pg_type)
  s:query("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
  local ok, applied, skipped = pcall(function()
    s:exec([[CREATE TABLE IF NOT EXISTS schema_migrations (
      version text PRIMARY KEY, checksum text NOT NULL,
      applied_at timestamptz NOT NULL DEFAULT now())]])
    local done = applied_versions(s)
    local napplied, nskipped = 0, 0
    for _, name in ipairs(list_files(dir)) do
      local body = read_file(dir .. "/" .. name)
      local sum = s:query("SELECT md5($1) AS sum", body)[1].sum
      if done[name] then
        if done[name] ~= sum then
          error(("migration %s was changed after it was applied (checksum %s, applied %s): "
            .. "refusing to continue; restore the file and put the change in a new migration")
            :format(name, sum, done[name]), 0)
        end
        nskipped = nskipped + 1
      else
        apply_one(s, name, body, sum, log)
        log("applied " .. name)
        napplied = napplied + 1
      end
    end
    M.grant_roles(s, log)
    return napplied, nskipped
  end)
  s:query("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)
  s:exec("RESET statement_timeout; RESET lock_timeout")
  if not ok then error(applied, 0) end
  return applied, skipped
end

-- pending(s, dir) -> pending, changed, unknown (for `qtgd check`): the
-- files on disk not applied, the applied files edited since, and the
-- applied versions with no file here (a newer qtgd migrated the database),
-- in version order.  A database without schema_migrations has applied none.
function M.pending(s, dir)
  local exists = s:query("SELECT to_regclass('schema_migrations') IS NOT NULL AS ok")[1].ok
  local done, versions = {}, {}
  if exists then done, versions = applied_versions(s) end
  local pending, changed, on_disk = {}, {}, {}
  for _, name in ipairs(list_files(dir)) do
    on_disk[name] = true
    if not done[name] then
      pending[#pending + 1] = name
    else
      local sum = s:query("SELECT md5($1) AS sum", read_file(dir .. "/" .. name))[1].sum
      if sum ~= done[name] then changed[#changed + 1] = name end
    end
  end
  local unknown = {}
  for _, v in ipairs(versions) do
    if not on_disk[v] then unknown[#unknown + 1] = v end
  end
  return pending, changed, unknown
end

function M.dir()
  return qtg.root .. "/sql"
end

function M.run(args)
  local dir = args[1] or M.dir()
  local got, s = pcall(qtg.db.acquire)
  if not got then
    io.stderr:write("qtgd migrate: ", tostring(s), "\n")
    return 1
  end
  local ok, applied, skipped = pcall(M.apply, s, dir, function(msg) qtg.log.info(msg, {command = "migrate"}) end)
  s:release()
  if not ok then
    io.stderr:write("qtgd migrate: ", tostring(applied), "\n")
    return 1
  end
  io.stdout:write(("migrations: %d applied, %d already applied\n"):format(applied, skipped))
  return 0
end

return M
