-- Helpers of the conditional worker specs (spec/lua/conditional_*_spec.lua):
-- the local stand-ins (tools/fake-providers), a real chain (tools/anvil),
-- settings overrides for in-process ticks, and child qtgd processes
-- (spec/lua/conditional_child.lua) released together through a start file
-- so that two of them really run a pass at the same time.  Required inside
-- a spec's blocks, never at load time; stop_all() in teardown.
local qtg = require "qtg"
local cjson = require "cjson"

local M = {}

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
M.q = q

function M.root()
  local r = os.getenv("QTG_ROOT")
  return (r and r ~= "") and r or qtg.root
end

function M.bin()
  local b = os.getenv("QTG_BIN")
  if b and b ~= "" then return b end
  local p = io.popen("readlink -f /proc/$PPID/exe")
  local path = p:read("*l")
  p:close()
  return path
end

local dirs, pids, anvils = {}, {}, {}

function M.tmpdir()
  local p = io.popen("mktemp -d /tmp/qtg-cond-spec.XXXXXX")
  local d = p:read("*l")
  p:close()
  dirs[#dirs + 1] = d
  return d
end

function M.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local d = f:read("*a")
  f:close()
  return d
end

function M.write(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

function M.uid(prefix)
  return (prefix or "x") .. "-" .. qtg.crypto.hex(qtg.crypto.random_bytes(5))
end

function M.wait_for(fn, seconds, what)
  local deadline = qtg.monotonic() + (seconds or 20)
  while true do
    local v = fn()
    if v then return v end
    if qtg.monotonic() > deadline then error("timed out waiting for " .. (what or "a condition"), 2) end
    qtg.sleep(0.05)
  end
end

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
  local w = require("qtg.workers." .. worker)
  return M.with_settings(over or {}, function()
    local s = qtg.db.acquire()
    local ok, n = pcall(w.tick, s)
    if s:in_transaction() then s:rollback() end
    s:release()
    if not ok then error(n, 0) end
    return n
  end)
end

function M.query(sql, ...)
  local s = qtg.db.acquire()
  local ok, rows, n = pcall(s.query, s, sql, ...)
  s:release()
  if not ok then error(rows, 2) end
  return rows, n
end

-- ---- tools/fake-providers --------------------------------------------------

function M.start_providers(dir, state)
  local portfile, record = dir .. "/providers.port", dir .. "/providers.jsonl"
  local cmd = q(M.root() .. "/tools/fake-providers") .. " --port-file " .. q(portfile)
    .. " --record " .. q(record) .. " --hang-seconds 30"
  if state then cmd = cmd .. " --state " .. q(cjson.encode(state)) end
  assert(os.execute(cmd .. " </dev/null >" .. q(dir .. "/providers.log") .. " 2>&1 &") == 0)
  local text = M.wait_for(function() return M.read(portfile) end, 30, "fake-providers")
  local port, pid = text:match("^(%d+) (%d+)")
  pids[#pids + 1] = pid
  local p = { port = tonumber(port), pid = pid, record = record, url = "http://127.0.0.1:" .. port }
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

-- rpc(url, method, params) -> result; raises on any error.
function M.rpc(url, method, params)
  local parts = {}
  for i, v in ipairs(params or {}) do parts[i] = cjson.encode(v) end
  local body = string.format('{"jsonrpc":"2.0","id":1,"method":"%s","params":[%s]}', method, table.concat(parts, ","))
  local resp, err = qtg.http.request{ method = "POST", url = url, body = body, timeout = 10,
    headers = { ["Content-Type"] = "application/json" } }
  assert(resp, "rpc " .. method .. ": " .. tostring(err))
  local doc = cjson.decode(resp.body)
  if doc.error then error("rpc " .. method .. ": " .. cjson.encode(doc.error), 2) end
  return doc.result
end

-- The dev accounts of anvil's default mnemonic (public keys: dev only).
M.DEV = {
  { address = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266",
    key = "ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80" },
  { address = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8",
    key = "59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d" },
  { address = "0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc",
    key = "5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a" },
}

-- ---- child processes -----------------------------------------------------------

-- start_child(dir, name, env, worker, ticks, gofile): a qtgd running
-- conditional_child.lua, which waits for gofile to exist, then ticks.
function M.start_child(dir, name, env, worker, ticks, gofile)
  local out = dir .. "/" .. name .. ".result"
  local parts = {}
  for k, v in pairs(env) do parts[#parts + 1] = k .. "=" .. q(v) end
  parts[#parts + 1] = "MG_CONSOLE_ENABLED=false"
  parts[#parts + 1] = q(M.bin()) .. " exec " .. q(M.root() .. "/spec/lua/conditional_child.lua")
  for _, a in ipairs({ worker, tostring(ticks or 1), gofile or "-", out }) do parts[#parts + 1] = q(a) end
  local line = "env " .. table.concat(parts, " ") .. " </dev/null >" .. q(dir .. "/" .. name .. ".log") .. " 2>&1 &"
  assert(os.execute(line) == 0, "cannot start " .. line)
  return { out = out, log = dir .. "/" .. name .. ".log" }
end

function M.wait_child(child, seconds)
  local text = M.wait_for(function() return M.read(child.out) end, seconds or 60,
    "child " .. child.out .. " (log: " .. tostring(M.read(child.log)) .. ")")
  return cjson.decode(text)
end

-- Start a `qtgd run` in the background; returns {log=, rcfile=, pid=}.
function M.start_run(dir, name, env)
  local h = { log = dir .. "/" .. name .. ".log", rcfile = dir .. "/" .. name .. ".rc" }
  local parts = {}
  for k, v in pairs(env) do parts[#parts + 1] = k .. "=" .. q(v) end
  local cmd = ("(env %s %s run >%s 2>&1; echo $? >%s) </dev/null >/dev/null 2>&1 & echo $!"):format(
    table.concat(parts, " "), q(M.bin()), q(h.log), q(h.rcfile))
  local p = io.popen("sh -c " .. q(cmd))
  local sub = tonumber(p:read("*l"))
  p:close()
  M.wait_for(function()
    local g = io.popen("pgrep -P " .. sub .. " -f qtgd")
    h.pid = tonumber(g:read("*l") or "")
    g:close()
    return h.pid
  end, 10, "qtgd run to start")
  pids[#pids + 1] = tostring(h.pid)
  return h
end

function M.exit_code(h, seconds)
  local ok, rc = pcall(M.wait_for, function()
    local t = M.read(h.rcfile)
    return t and t:match("%d+")
  end, seconds or 30, "qtgd to exit")
  return ok and tonumber(rc) or nil
end

function M.stop_run(h)
  os.execute("kill -TERM " .. h.pid .. " 2>/dev/null")
  return M.exit_code(h, 30)
end

function M.stop_all()
  for _, pid in ipairs(pids) do os.execute("kill " .. pid .. " 2>/dev/null") end
  pids = {}
  for _, d in ipairs(anvils) do os.execute(q(M.root() .. "/tools/anvil") .. " stop " .. q(d)) end
  anvils = {}
  for _, d in ipairs(dirs) do os.execute("rm -rf " .. q(d)) end
  dirs = {}
end

function M.base_env(extra)
  local env = { MG_DATABASE_URL = os.getenv("MG_DATABASE_URL"), MG_CONSOLE_ENABLED = "false",
                MG_LOG_LEVEL = "info" }
  for k, v in pairs(extra or {}) do env[k] = v end
  return env
end

return M
