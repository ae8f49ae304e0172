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

local sh_quote = common.quote
M.sh_quote = sh_quote

-- A fresh temporary directory (the caller removes it).
function M.tmpdir() return common.tmpdir("qtg-spec") end

-- write(path, text): creates the parent directories.
function M.write(path, text)
  os.execute("mkdir -p " .. sh_quote(path:match("^(.*)/[^/]*$")))
  common.write(path, text)
end

M.read = common.read

-- Run a command to completion; returns exit code, stdout+stderr.
function M.run(env, args)
  local cmd = common.env_words(env) .. " " .. table.concat(args, " ") .. " 2>&1; echo \"__rc=$?\""
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
  M.started[#M.started + 1] = h
  return common.start_qtgd(h, env or {}, args or {"run"}, M.bin, 2.5)
end

-- Signal the process; without a known pid, nothing (never `kill -1`,
-- which would signal every process of this user).
function M.signal(h, sig)
  local pid = tonumber(h.pid)
  if not pid or pid <= 1 then return end
  os.execute(("kill -%s %d 2>/dev/null"):format(sig, pid))
end

-- Wait (polling) until the process exits; returns its exit code or nil.
M.wait_exit = common.exit_code

function M.stop(h, timeout)
  M.signal(h, "TERM")
  local rc = M.wait_exit(h, timeout or 30)
  if rc == nil then M.signal(h, "KILL") end
  return rc
end

-- Every process started here is gone afterwards (killed if still running),
-- and so is its log directory.
function M.stop_all()
  for _, h in ipairs(M.started) do
    if not M.read(h.rcfile) or not M.read(h.rcfile):match("%d") then
      M.signal(h, "KILL")
      M.wait_exit(h, 5)
    end
    os.execute("rm -rf " .. sh_quote(h.dir))
  end
  M.started = {}
end

-- Poll fn() until it returns a truthy value or the timeout passes (nil then).
M.eventually = common.poll

function M.with_session(fn)
  return qtg.db.with_session(fn)
end

M.query = common.query
M.base_env = common.base_env

return M
