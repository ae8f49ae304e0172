-- spec/lua/support/host.lua -- helpers for specs that start qtgd processes:
-- temp dirs, files, background processes with their exit codes, and
-- bounded waiting on a condition (polling, never a fixed sleep).  What
-- every support module does alike is in spec/lua/support/common.lua.
local qtg = require("qtg")
local common = require("spec.lua.support.common")

local M = {}

-- Every process started here, so a failing spec can still stop them all
-- (support.stop_all in an after_each).
M.started = {}

M.bin = os.getenv("QTG_BIN") or (qtg.root .. "/build/qtgd")
M.root = qtg.root


-- A fresh temporary directory (the caller removes it).
function M.tmpdir() return common.tmpdir("qtg-spec") end

-- write(path, text): creates the parent directories.
function M.write(path, text)
  os.execute("mkdir -p " .. common.quote(path:match("^(.*)/[^/]*$")))
  common.write(path, text)
end

M.read = common.read

-- Run a command to completion; returns exit code, stdout+stderr.
function M.run(env, args)
  local out, rc = common.sh("env " .. common.env_words(env) .. " " .. table.concat(args, " "))
  return rc, out
end

-- own_database(s, prefix, dir[, child]) -> url, db, out: a database of its
-- own on the suite's cluster (named prefix_RANDOM, created through session
-- s), migrated by the qtgd under test.  With child (Lua source), written
-- to dir/child.lua, `qtgd exec` runs it there with the repo's root as its
-- argument: out is what it printed.  drop_database(s, db) removes it.
function M.own_database(s, prefix, dir, child)
  local db = prefix .. "_" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
  s:exec("CREATE DATABASE " .. db)
  local url = common.database_url(db)
  local env = common.base_env({ MG_DATABASE_URL = url })
  local rc, out = M.run(env, { common.quote(M.bin), "migrate" })
  assert(rc == 0, out)
  if child then
    common.write(dir .. "/child.lua", child)
    rc, out = M.run(env, { common.quote(M.bin), "exec", common.quote(dir .. "/child.lua"), common.quote(M.root) })
    assert(rc == 0, out)
  end
  return url, db, out
end

function M.drop_database(s, db)
  s:exec("DROP DATABASE IF EXISTS " .. db .. " WITH (FORCE)")
end

-- Start `qtgd ARGS` in the background; returns a handle with pid, log
-- (common.spawn) and dir, its own temporary directory.
function M.start(env, args)
  local dir = M.tmpdir()
  local h = common.spawn(dir .. "/qtgd", env or {}, common.quote(M.bin) .. " " .. table.concat(args or {"run"}, " "))
  h.dir = dir
  M.started[#M.started + 1] = h
  return h
end

-- Signal the process (common.signal: never one that exited, never pid <= 1).
M.signal = common.signal

-- Wait (polling) until the process exits; returns its exit code or nil.
M.wait_exit = common.exit_code

-- SIGTERM, wait, SIGKILL after `timeout`; returns the exit code or nil.
M.stop = common.stop

-- Every process started here is gone afterwards (killed if still running),
-- and so is its log directory.
function M.stop_all()
  for _, h in ipairs(M.started) do
    if common.signal(h, "KILL") then M.wait_exit(h, 5) end
    os.execute("rm -rf " .. common.quote(h.dir))
  end
  M.started = {}
end

-- Poll fn() until it returns a truthy value or the timeout passes (nil then).
M.eventually = common.poll

function M.with_session(fn)
  return qtg.db.with_session(fn)
end

-- An approver's key (`qtgd approver key`) in dir: its path and its
-- enrolment key ("ed25519:HEX").
function M.approver_key(dir, name)
  local path = dir .. "/" .. name .. ".key"
  local rc, out = M.run({}, { common.quote(M.bin), "approver", "key", common.quote(path) })
  assert(rc == 0, "qtgd approver key: " .. out)
  return path, out:match("ed25519:%x+")
end

-- The signature (128 hex) of statement with the key at path (`qtgd
-- approver sign`); with document and plan (texts), signed only when they
-- are what the statement hashes: nil, the tool's message when not;
-- without them, --unchecked (the specs that forge rows sign what they
-- wrote).  It
-- confirms the request, kind and step the statement names (--request,
-- --kind, an attestation's --step):
-- the specs of what the flags refuse call the tool themselves.
function M.approver_sign(path, statement, document, plan)
  local file = path .. ".statement"
  common.write(file, statement)
  local kind = statement:match("^qtg%-(%a+)%-v%d+\n") or "approval"
  local extra = " --kind " .. common.quote(kind) .. " --request "
    .. common.quote(statement:match("\nrequest ([^\n]*)\n") or "none")
  local step = statement:match("\nstep ([^\n]*)\n$")
  if kind == "attestation" then extra = extra .. " --step " .. common.quote(step or "none") end
  if document then
    common.write(file .. ".document", document)
    common.write(file .. ".plan", plan)
    extra = extra .. " " .. common.quote(file .. ".document") .. " " .. common.quote(file .. ".plan")
  else
    extra = extra .. " --unchecked"
  end
  -- its stdout alone (what it shows on stderr is for the approver's eyes)
  local rc, out = M.run({}, { "sh", "-c", common.quote(common.quote(M.bin) .. " approver sign "
    .. common.quote(path) .. extra .. " < " .. common.quote(file) .. " 2>" .. common.quote(file .. ".err")) })
  local sig = out:match("^(%x+)\n$")
  if document and rc == 1 and out == "" then return nil, common.read(file .. ".err") end
  assert(rc == 0 and sig and #sig == 128, "qtgd approver sign: " .. out)
  return sig
end

M.query = common.query
M.base_env = common.base_env

return M
