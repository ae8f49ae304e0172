-- Helpers of the sidecar specs (callbacks_spec, sidecars_spec, signers_spec):
-- real receivers (tools/fake-receiver, python3) and real child qtgd
-- processes (spec/lua/sidecars/sidecar_child.lua) started in the background, waited
-- for by polling files with qtg.sleep so the host's loop never blocks on
-- them.  Required from inside a spec's blocks, never at load time.  What
-- every support module does alike is in spec/lua/support/common.lua.
local qtg = require "qtg"
local common = require "spec.lua.support.common"

local M = {}

local q = common.quote
M.root, M.qtgd_bin = common.root, common.bin
M.write_file, M.read_file = common.write, common.read

function M.uid(prefix) return common.uid(prefix or "x", 6) end

-- A fresh temporary directory (removed by M.cleanup).
local dirs = {}
function M.tmpdir() return common.tmpdir("qtg-sidecar-spec", dirs) end

-- Poll until fn() returns a truthy value or `seconds` pass.
M.wait_for = common.wait_for

-- One tick of a worker on a fresh session, as the runtime runs it.
M.tick = common.tick

local pids = {}

-- Start tools/fake-receiver (common.start_receiver); returns {port, pid,
-- url, record, ...}.  opts: mode, keys = {id = path}, bind (the address,
-- 127.0.0.1 unless given), args (a list of further words).
function M.start_receiver(dir, name, opts)
  local h = common.start_receiver(dir, name, opts)
  pids[#pids + 1] = h.pid
  return h
end

-- The requests a receiver recorded, in arrival order.
function M.received(rcv) return common.records(rcv.record) end

-- Case-insensitive header lookup in a recorded request.
M.header = common.header

-- Start a child qtgd running spec/lua/sidecars/sidecar_child.lua in the background.
-- env: table of extra environment variables; args: {worker, seconds, mode}.
-- Returns a handle for M.wait_child.
function M.start_child(dir, name, env, args)
  return common.start_script(dir, name, env, "sidecars/sidecar_child.lua", args)
end

-- Wait for a child's result file; returns the decoded result.
function M.wait_child(child, seconds)
  local res = common.wait_result(child, seconds or 120)
  if not res.ok then error("child failed: " .. tostring(res.error) .. "\n" .. (M.read_file(child.log) or "")) end
  return res
end

function M.cleanup()
  common.kill_pids(pids)
  common.remove_dirs(dirs)
end

-- A callback key file (mode 0600, as qtgd requires) holding `key`.
function M.key_file(dir, name, key)
  local path = dir .. "/" .. name .. ".key"
  M.write_file(path, key .. "\n", "600")
  return path
end

-- Load a minimal one-node template (once per database).
function M.template(s, key)
  require("spec.lua.support.engine").load_doc(s, { template_key = key, name = key, nodes = {
    { key = "a", kind = "action", action_type = "withdrawal", config = {} } },
    edges = {}, intent = { required = { "asset", "amount" } } })
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
  }, "console:spec-initiator")
  if class and class ~= qtg.settings.network_class then
    s:query("UPDATE movement_requests SET network_class = $1 WHERE id = $2", class, req.id)
    req.network_class = class
  end
  return req, created
end

return M
