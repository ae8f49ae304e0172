-- Helpers of the conditional worker specs (spec/lua/conditional_*_spec.lua):
-- the local stand-ins (tools/fake-providers), a real chain (tools/anvil),
-- settings overrides for in-process ticks, and child qtgd processes
-- (spec/lua/sidecars/conditional_child.lua) released together through a start file
-- so that two of them really run a pass at the same time.  Required inside
-- a spec's blocks, never at load time; stop_all() in teardown.  What every
-- support module does alike is in spec/lua/support/common.lua.
local qtg = require "qtg"
local cjson = require "cjson"
local common = require "spec.lua.support.common"

local M = {}

local q = common.quote
M.root, M.bin = common.root, common.bin
M.read, M.write = common.read, common.write
M.wait_for, M.query, M.base_env = common.wait_for, common.query, common.base_env
M.rpc, M.DEV = common.rpc, common.DEV

local dirs, pids, anvils = {}, {}, {}

function M.tmpdir() return common.tmpdir("qtg-cond-spec", dirs) end

function M.uid(prefix) return common.uid(prefix or "x", 5) end

-- with_settings(overrides, fn, ...): run fn with qtg.settings overlaid
-- (in-process ticks read qtg.settings at tick time).
function M.with_settings(over, fn, ...)
  local orig = qtg.settings
  qtg.settings = setmetatable(over, { __index = orig })
  local res = table.pack(pcall(fn, ...))
  qtg.settings = orig
  if not res[1] then error(res[2], 0) end
  return table.unpack(res, 2, res.n)
end

-- tick(worker[, overrides]) -> the count of one tick on a fresh session.
function M.tick(worker, over)
  return M.with_settings(over or {}, common.tick, worker)
end

-- ---- tools/fake-providers --------------------------------------------------

function M.start_providers(dir, state)
  local portfile, record = dir .. "/providers.port", dir .. "/providers.jsonl"
  local log = dir .. "/providers.log"
  local cmd = q(M.root() .. "/tools/fake-providers") .. " --port-file " .. q(portfile)
    .. " --record " .. q(record) .. " --hang-seconds 30"
  if state then cmd = cmd .. " --state " .. q(cjson.encode(state)) end
  local pid = common.spawn(dir .. "/providers", {}, cmd).pid
  pids[#pids + 1] = pid
  local port = common.wait_port_file(portfile, 30, "fake-providers", log)
  local p = { port = port, pid = pid, record = record, url = "http://127.0.0.1:" .. port }
  function p.control(t)
    local resp, err = qtg.http.request{ method = "POST", url = p.url .. "/_control", body = cjson.encode(t),
      headers = { ["Content-Type"] = "application/json" }, timeout = 5 }
    assert(resp and resp.status == 200, "control failed: " .. tostring(err or (resp and resp.body)))
  end
  function p.stats()
    local resp = assert(qtg.http.request{ url = p.url .. "/_stats", timeout = 5 })
    return cjson.decode(resp.body)
  end
  function p.received(service)
    local out = {}
    for line in (M.read(record) or ""):gmatch("[^\n]+") do
      local e = cjson.decode(line)
      if not service or e.service == service then out[#out + 1] = e end
    end
    return out
  end
  return p
end

-- ---- tools/anvil ------------------------------------------------------------

local function free_port()
  local p = io.popen([[python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()']])
  local port = tonumber(p:read("*l"))
  p:close()
  return port
end

-- start_anvil() -> {url=, dir=}.  The install is idempotent (npm, once).
function M.start_anvil()
  local dir = M.tmpdir()
  for _ = 1, 3 do
    local port = free_port()
    local p = io.popen(q(M.root() .. "/tools/anvil") .. " start " .. port .. " " .. q(dir) .. " 2>" .. q(dir .. "/start.err"))
    local url = p:read("*l")
    p:close()
    if url and url:match("^http://") then
      anvils[#anvils + 1] = dir
      return { url = url, dir = dir }
    end
  end
  error("cannot start anvil: " .. tostring(M.read(dir .. "/start.err")) .. tostring(M.read(dir .. "/anvil.log")))
end

-- ---- child processes -----------------------------------------------------------

-- start_child(dir, name, env, worker, ticks, gofile): a qtgd running
-- conditional_child.lua, which waits for gofile to exist, then ticks.
function M.start_child(dir, name, env, worker, ticks, gofile)
  return common.start_script(dir, name, env, "sidecars/conditional_child.lua",
    { worker, tostring(ticks or 1), gofile or "-" })
end

function M.wait_child(child, seconds)
  return common.wait_result(child, seconds or 60)
end

-- Start a `qtgd run` in the background; returns a common.spawn handle
-- ({log=, rcfile=, pid=, ...}, the files DIR/NAME.*).
function M.start_run(dir, name, env)
  local h = common.spawn(dir .. "/" .. name, env, q(M.bin()) .. " run")
  pids[#pids + 1] = h.pid
  return h
end

M.exit_code = common.exit_code

-- SIGTERM; the exit code, or nil when it did not exit within 30 s.
function M.stop_run(h)
  common.signal(h, "TERM")
  return M.exit_code(h, 30)
end

function M.stop_all()
  common.kill_pids(pids)
  for _, d in ipairs(anvils) do os.execute(q(M.root() .. "/tools/anvil") .. " stop " .. q(d)) end
  anvils = {}
  common.remove_dirs(dirs)
end

return M
