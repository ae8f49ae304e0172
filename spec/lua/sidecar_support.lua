-- Helpers of the sidecar specs (callbacks_spec, sidecars_spec, signers_spec):
-- real receivers (tools/fake-receiver, python3) and real child qtgd
-- processes (spec/lua/sidecar_child.lua) started in the background, waited
-- for by polling files with qtg.sleep so the host's loop never blocks on
-- them.  Required from inside a spec's blocks, never at load time.
local qtg = require "qtg"
local cjson = require "cjson"

local M = {}

local function q(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
M.q = q

function M.root()
  local r = os.getenv("QTG_ROOT")
  if r and r ~= "" then return r end
  return qtg.root
end

function M.qtgd_bin()
  local env = os.getenv("QTG_BIN")
  if env and env ~= "" then return env end
  local p = io.popen("readlink -f /proc/$PPID/exe")
  local path = p:read("*l")
  p:close()
  return path
end

function M.uid(prefix)
  return (prefix or "x") .. "-" .. qtg.crypto.hex(qtg.crypto.random_bytes(6))
end

-- A fresh temporary directory (removed by M.cleanup).
local dirs = {}
function M.tmpdir()
  local p = io.popen("mktemp -d /tmp/qtg-sidecar-spec.XXXXXX")
  local d = p:read("*l")
  p:close()
  dirs[#dirs + 1] = d
  return d
end

function M.write_file(path, data, mode)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
  if mode then assert(os.execute("chmod " .. mode .. " " .. q(path)) == 0) end
end

function M.read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local d = f:read("*a")
  f:close()
  return d
end

-- Poll until fn() returns a truthy value or `seconds` pass.
function M.wait_for(fn, seconds, what)
  local deadline = qtg.monotonic() + seconds
  while true do
    local v = fn()
    if v then return v end
    if qtg.monotonic() > deadline then
      error("timed out after " .. seconds .. " s waiting for " .. (what or "a condition"), 2)
    end
    qtg.sleep(0.05)
  end
end

local pids = {}

-- Start tools/fake-receiver; returns {port, pid, url, record}.
-- opts: mode, keys = {id = path}, args (extra command-line text).
function M.start_receiver(dir, name, opts)
  local record = dir .. "/" .. name .. ".jsonl"
  local portfile = dir .. "/" .. name .. ".port"
  local cmd = { q(M.root() .. "/tools/fake-receiver"), "--mode", q(opts.mode),
                "--record", q(record), "--port-file", q(portfile) }
  for id, path in pairs(opts.keys or {}) do
    cmd[#cmd + 1] = "--key-file " .. q(id .. "=" .. path)
  end
  if opts.args then cmd[#cmd + 1] = opts.args end
  local line = table.concat(cmd, " ") .. " >" .. q(dir .. "/" .. name .. ".log") .. " 2>&1 &"
  assert(os.execute(line) == 0, "cannot start " .. line)
  local text = M.wait_for(function() return M.read_file(portfile) end, 30, "receiver " .. name)
  local port, pid = text:match("^(%d+) (%d+)")
  pids[#pids + 1] = pid
  return { port = tonumber(port), pid = pid, record = record,
           url = "http://127.0.0.1:" .. port .. "/callbacks/" .. name }
end

-- The requests a receiver recorded, in arrival order.
function M.received(rcv)
  local out = {}
  local text = M.read_file(rcv.record) or ""
  for line in text:gmatch("[^\n]+") do out[#out + 1] = cjson.decode(line) end
  return out
end

-- Case-insensitive header lookup in a recorded request.
function M.header(entry, name)
  name = name:lower()
  for k, v in pairs(entry.headers) do
    if k:lower() == name then return v end
  end
  return nil
end

-- Start a child qtgd running spec/lua/sidecar_child.lua in the background.
-- env: table of extra environment variables; args: {worker, seconds, mode}.
-- Returns a handle for M.wait_child.
function M.start_child(dir, name, env, args)
  local out = dir .. "/" .. name .. ".result"
  local parts = {}
  for k, v in pairs(env) do parts[#parts + 1] = k .. "=" .. q(v) end
  parts[#parts + 1] = "MG_CONSOLE_ENABLED=false"
  parts[#parts + 1] = q(M.qtgd_bin()) .. " exec " .. q(M.root() .. "/spec/lua/sidecar_child.lua")
  for _, a in ipairs(args) do parts[#parts + 1] = q(a) end
  parts[#parts + 1] = q(out)
  local line = "env " .. table.concat(parts, " ") .. " >" .. q(dir .. "/" .. name .. ".log")
    .. " 2>&1 &"
  assert(os.execute(line) == 0, "cannot start " .. line)
  return { out = out, log = dir .. "/" .. name .. ".log" }
end

-- Wait for a child's result file; returns the decoded result.
function M.wait_child(child, seconds)
  local text = M.wait_for(function() return M.read_file(child.out) end, seconds or 120,
    "child " .. child.out .. " (log: " .. tostring(M.read_file(child.log)) .. ")")
  local res = cjson.decode(text)
  if not res.ok then error("child failed: " .. tostring(res.error) .. "\n" .. (M.read_file(child.log) or "")) end
  return res
end

function M.cleanup()
  for _, pid in ipairs(pids) do os.execute("kill " .. pid .. " 2>/dev/null") end
  pids = {}
  for _, d in ipairs(dirs) do os.execute("rm -rf " .. q(d)) end
  dirs = {}
end

-- A callback key file (mode 0600, as qtgd requires) holding `key`.
function M.key_file(dir, name, key)
  local path = dir .. "/" .. name .. ".key"
  M.write_file(path, key .. "\n", "600")
  return path
end

-- Load a minimal one-node template (once per database).
function M.template(s, key)
  local templates = require "qtg.templates"
  local doc = { template_key = key, name = key, nodes = {
    { key = "a", kind = "action", action_type = "withdrawal", config = {} } },
    edges = {}, intent = { required = { "asset", "amount" } } }
  local c, errs = templates.validate_and_compile(doc, "spec:" .. key)
  assert(c, errs and table.concat(errs, "\n"))
  s:begin()
  templates.store(s, c)
  s:commit()
  return key
end

-- A PENDING_APPROVAL request of network class `class` (its request_created
-- callback is enqueued when callback_url is given).
-- The lifecycle only creates requests of this process's class, so a request
-- of another class is created here and then moved, as another deployment
-- would have written it.
function M.request(s, template_key, class, callback_url)
  local requests = require "qtg.requests"
  local req, created = requests.create(s, {
    template_key = template_key, intent = { asset = "USDC", amount = "1.00" },
    idempotency_key = M.uid("idem"), callback_url = callback_url,
  }, "console:spec")
  if class and class ~= qtg.settings.network_class then
    s:query("UPDATE movement_requests SET network_class = $1 WHERE id = $2", class, req.id)
    req.network_class = class
  end
  return req, created
end

return M
