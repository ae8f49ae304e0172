-- spec/lua/host_support.lua -- helpers for specs that start qtgd processes:
-- temp dirs, files, background processes with their exit codes, and
-- bounded waiting on a condition (polling, never a fixed sleep).
local qtg = require("qtg")

local M = {}

-- Every process started here, so a failing spec can still stop them all
-- (support.stop_all in an after_each).
M.started = {}

M.bin = os.getenv("QTG_BIN") or (qtg.root .. "/build/qtgd")
M.root = qtg.root

local function sh_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
M.sh_quote = sh_quote

function M.tmpdir()
  local p = io.popen("mktemp -d /tmp/qtg-spec.XXXXXX")
  local dir = p:read("*l")
  p:close()
  return dir
end

function M.write(path, text)
  os.execute("mkdir -p " .. sh_quote(path:match("^(.*)/[^/]*$")))
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

function M.read(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- Run a command to completion; returns exit code, stdout+stderr.
function M.run(env, args)
  local parts = {}
  for k, v in pairs(env or {}) do parts[#parts + 1] = k .. "=" .. sh_quote(v) end
  local cmd = table.concat(parts, " ") .. " " .. table.concat(args, " ") .. " 2>&1; echo \"__rc=$?\""
  local p = io.popen("env " .. cmd)
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("__rc=(%d+)%s*$"))
  return rc, (out:gsub("__rc=%d+%s*$", ""))
end

-- Start `qtgd ARGS` in the background; returns a handle with pid, log.
function M.start(env, args)
  local dir = M.tmpdir()
  local h = {dir = dir, log = dir .. "/log", rcfile = dir .. "/rc"}
  local parts = {}
  for k, v in pairs(env or {}) do parts[#parts + 1] = k .. "=" .. sh_quote(v) end
  local cmd = ("(env %s %s %s >%s 2>&1; echo $? >%s) </dev/null >/dev/null 2>&1 & echo $!"):format(
    table.concat(parts, " "), sh_quote(M.bin), table.concat(args or {"run"}, " "),
    sh_quote(h.log), sh_quote(h.rcfile))
  local p = io.popen("sh -c " .. sh_quote(cmd))
  local subshell = tonumber(p:read("*l"))
  p:close()
  h.subshell = subshell
  M.started[#M.started + 1] = h
  -- the qtgd process is the subshell's child
  for _ = 1, 50 do
    local q = io.popen("pgrep -P " .. subshell .. " -f qtgd")
    h.pid = tonumber(q:read("*l") or "")
    q:close()
    if h.pid then break end
    qtg.sleep(0.05)
  end
  return h
end

function M.signal(h, sig)
  os.execute(("kill -%s %d 2>/dev/null"):format(sig, h.pid or -1))
end

-- Wait (polling) until the process exits; returns its exit code or nil.
function M.wait_exit(h, timeout)
  local deadline = qtg.monotonic() + (timeout or 30)
  while qtg.monotonic() < deadline do
    local rc = M.read(h.rcfile)
    if rc and rc:match("%d") then return tonumber(rc:match("%d+")) end
    qtg.sleep(0.05)
  end
  return nil
end

function M.stop(h, timeout)
  M.signal(h, "TERM")
  local rc = M.wait_exit(h, timeout or 30)
  if rc == nil then M.signal(h, "KILL") end
  return rc
end

function M.stop_all()
  for _, h in ipairs(M.started) do
    if not M.read(h.rcfile) or not M.read(h.rcfile):match("%d") then
      M.signal(h, "KILL")
    end
  end
  M.started = {}
end

-- Poll fn() until it returns a truthy value or the timeout passes.
function M.eventually(fn, timeout, step)
  local deadline = qtg.monotonic() + (timeout or 20)
  repeat
    local v = fn()
    if v then return v end
    qtg.sleep(step or 0.05)
  until qtg.monotonic() > deadline
  return nil
end

function M.with_session(fn)
  return qtg.db.with_session(fn)
end

function M.query(sql, ...)
  local s = qtg.db.acquire()
  local ok, rows, n = pcall(s.query, s, sql, ...)
  s:release()
  if not ok then error(rows, 2) end
  return rows, n
end

function M.base_env(extra)
  local env = {
    MG_DATABASE_URL = os.getenv("MG_DATABASE_URL"),
    MG_CONSOLE_ENABLED = "false",
    MG_LOG_LEVEL = "info",
  }
  for k, v in pairs(extra or {}) do env[k] = v end
  return env
end

return M
