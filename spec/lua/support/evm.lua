-- spec/lua/support/evm.lua -- helpers of the evm_transfer specs
-- (spec/lua/evm_*_spec.lua): a real anvil chain (the binary tools/anvil
-- installs from npm), JSON-RPC from the spec, 0600 key files, `qtgd run`
-- processes (spec/lua/support/host.lua) and requests in their network class.
-- Loaded with require from inside a spec's blocks, never at load time.  What
-- every support module does alike is in spec/lua/support/common.lua.
local qtg = require "qtg"
local cjson = require "cjson"
local common = require "spec.lua.support.common"
local host = require "spec.lua.support.host"
local engine = require "spec.lua.support.engine"
local evm_tx = require "qtg.evm_tx"

local M = {}

local q = common.quote
M.host, M.engine = host, engine
M.DEV, M.rpc, M.read = common.DEV, common.rpc, common.read

local anvils, servers, dirs = {}, {}, {}

local function tmpdir() return common.tmpdir("qtg-spec", dirs) end
M.tmpdir = tmpdir

function M.root() return engine.repo_root() end

-- wait_for(fn, seconds, what) -> fn's value; raises naming `what` on timeout.
function M.wait_for(fn, seconds, what)
  return common.wait_for(fn, seconds or 30, what, 0.1)
end

-- ---- anvil -------------------------------------------------------------------

M.anvil_bin = common.anvil_bin

-- start_anvil{chain_id=, block_time=} -> {url=, port=, dir=, pid=, ...}
-- (common.start_anvil, its log DIR/anvil.log), once it answers eth_chainId.
function M.start_anvil(opts)
  local dir = tmpdir()
  local a = common.start_anvil(dir .. "/anvil", opts)
  a.dir = dir
  anvils[#anvils + 1] = a
  M.wait_for(function() return pcall(M.rpc, a.url, "eth_chainId", {}) end, 20, "anvil to answer")
  return a
end

function M.stop_anvil(a)
  common.signal(a, "TERM")
end

function M.balance(url, address)
  return evm_tx.hex_to_dec(M.rpc(url, "eth_getBalance", { address, "latest" }))
end

function M.nonce(url, address)
  return tonumber(M.rpc(url, "eth_getTransactionCount", { address, "latest" }):sub(3), 16)
end

function M.receipt(url, tx_hash)
  local r = M.rpc(url, "eth_getTransactionReceipt", { tx_hash })
  if r == cjson.null then return nil end
  return r
end

function M.random_address()
  return "0x" .. qtg.crypto.hex(qtg.crypto.random_bytes(20))
end

-- ---- files, keys, stand-in servers ------------------------------------------------

function M.key_file(dir, name, hex)
  local path = dir .. "/" .. name .. ".key"
  host.write(path, hex .. "\n")
  os.execute("chmod 600 " .. q(path))
  return path
end

-- A random funded-nowhere key: {key=, path=} (its address comes from the
-- child's signer; the spec computes it with qtg.signer.recover below).
function M.random_key()
  return qtg.crypto.hex(qtg.crypto.random_bytes(32))
end

-- A JSON-RPC endpoint that answers garbage: tools/fake-receiver --mode ok
-- answers every POST with 200 {"ok":true}, which is no JSON-RPC response.
function M.start_garbage_server()
  local dir = tmpdir()
  local portfile, log = dir .. "/port", dir .. "/log"
  local pid = common.background(("%s --mode ok --record %s --port-file %s"):format(
    q(M.root() .. "/tools/fake-receiver"), q(dir .. "/rec.jsonl"), q(portfile)), log)
  servers[#servers + 1] = pid
  local port = common.wait_port_file(portfile, 20, "fake-receiver", log)
  return "http://127.0.0.1:" .. port
end

-- start_forwarder(target_port[, port]) -> {port=, pid=, url=}: an RPC
-- endpoint that goes down (stop_forwarder) and comes back on the same port
-- while the chain behind it goes on (common.start_forwarder).
function M.start_forwarder(target_port, port)
  local f = common.start_forwarder(tmpdir(), target_port, port)
  servers[#servers + 1] = f.pid
  f.url = "http://127.0.0.1:" .. f.port
  return f
end

M.stop_forwarder = common.stop_forwarder

-- ---- qtgd processes -----------------------------------------------------------------

-- run_env(extra) -> env for a `qtgd run` that works one network class
-- quickly (short intervals; callbacks parked).
function M.run_env(class, extra)
  local env = host.base_env({
    MG_NETWORK_CLASS = class,
    MG_NODE_DISPATCH_INTERVAL_SECONDS = "0.1",
    MG_NODE_OBSERVE_INTERVAL_SECONDS = "0.1",
    MG_NODE_RECOVERY_INTERVAL_SECONDS = "0.5",
    MG_CALLBACK_DISPATCH_INTERVAL_SECONDS = "60",
    MG_EXECUTOR_HEALTH_INTERVAL_SECONDS = "3600",
  })
  for k, v in pairs(extra or {}) do env[k] = v end
  return env
end

-- start_run(env) -> the `qtgd run` handle.  When env names signer keys
-- (MG_SIGNER_KEYS), a `qtgd signer` holding them is started first on its
-- own socket (h.signer is its handle) and the daemon gets no MG_SIGNER_KEYS.
function M.start_run(env)
  local dir = tmpdir()
  env.MG_RUN_DIR = env.MG_RUN_DIR or (dir .. "/run")
  local signer
  if env.MG_SIGNER_KEYS and env.MG_SIGNER_KEYS ~= "" then
    env.MG_SIGNER_SOCKET = env.MG_SIGNER_SOCKET or (dir .. "/signer/signer.sock")
    signer = M.start_signer(env)
    env.MG_SIGNER_KEYS = nil
  end
  local h = host.start(env, { "run" })
  h.signer = signer
  return h
end

-- start_signer(env) -> the handle of a `qtgd signer` with env's keys and
-- socket (MG_SIGNER_SOCKET), once it listens.  Without an enrolment
-- (MG_SIGNER_APPROVERS) it counts the approval rows as written
-- (MG_SIGNER_TRUST_APPROVAL_ROWS=true, unless env says otherwise): the
-- specs of signing itself approve as the daemon does, unsigned.
function M.start_signer(env)
  local senv = {}
  for k, v in pairs(env) do senv[k] = v end
  if (senv.MG_SIGNER_APPROVERS or "") == "" and senv.MG_SIGNER_TRUST_APPROVAL_ROWS == nil then
    senv.MG_SIGNER_TRUST_APPROVAL_ROWS = "true"
  end
  local h = host.start(senv, { "signer" })
  common.wait_log(h, '"signer: listening"', 30, "the signer listening")
  h.socket = env.MG_SIGNER_SOCKET
  return h
end

function M.log_count(h, needle)
  local n = 0
  for line in ((host.read(h.log) or "") .. "\n"):gmatch("([^\n]*)\n") do
    if line:find(needle, 1, true) then n = n + 1 end
  end
  return n
end

function M.stop_all()
  host.stop_all()
  for _, a in ipairs(anvils) do M.stop_anvil(a) end
  anvils = {}
  common.kill_pids(servers)
end

-- remove the spec's temporary directories (anvil logs, run dirs); qtgd logs
-- live in spec.lua.support.host's own directories.
function M.cleanup()
  common.remove_dirs(dirs)
end

-- fresh_chain(chain_id) -> s, dir, anvil: a database session, a directory
-- for key files and an anvil of chain_id (a block a second), the books of
-- an earlier run on that chain id forgotten: the set-up of a spec with a
-- chain of its own.  done(s, dir) is its tear-down.
function M.fresh_chain(chain_id)
  local s = qtg.db.acquire()
  local dir = host.tmpdir()
  local anvil = M.start_anvil({ chain_id = chain_id, block_time = 1 })
  s:query("DELETE FROM evm_transfer_tx WHERE chain_id = $1", chain_id)
  s:query("DELETE FROM evm_nonce_reservation WHERE chain_id = $1", chain_id)
  return s, dir, anvil
end

function M.done(s, dir)
  M.stop_all()
  M.cleanup()
  s:release()
  os.execute("rm -rf " .. q(dir))
end

-- ---- requests -------------------------------------------------------------------------

-- A template doc like templates/evm_transfer.json, for a signer key and
-- risk controls of the spec's choosing.
function M.template(key, signer_key, rc, confirmations)
  local path = M.root() .. "/templates/evm_transfer.json"
  local doc = cjson.decode((assert(host.read(path), path)))
  doc.template_key = key
  doc.nodes[1].config.signer_key = signer_key
  for k, v in pairs(rc or {}) do doc.risk_controls[k] = v end
  if confirmations then doc.nodes[3].config.confirmations = confirmations end
  return doc
end

-- create(s, template_key, class, intent) -> request, approved and moved to
-- `class` (the network class of the qtgd processes under test).
function M.create(s, template_key, class, intent)
  return engine.create_approved(s, template_key, { intent = intent, network_class = class,
                                                   callback_url = false })
end

function M.request(s, id) return engine.request(s, id) end

function M.nodes(s, id) return engine.nodes(s, id) end

function M.reservations(s, node_id)
  return s:query([[SELECT r.*, t.outcome, t.attempt_no FROM evm_nonce_reservation r
                     LEFT JOIN evm_transfer_tx t ON t.reservation_id = r.id
                    WHERE r.request_node_id = $1::uuid ORDER BY r.id]], node_id)
end

-- wait until every request in ids is in one of `states` (a set).
function M.wait_states(s, ids, states, seconds, procs)
  return M.wait_for(function()
    for _, h in ipairs(procs or {}) do
      local rc = common.rc(h)
      if rc then error("qtgd exited (" .. rc .. "); log " .. h.log, 0) end
    end
    for _, id in ipairs(ids) do
      if not states[M.request(s, id).request_state] then return false end
    end
    return true
  end, seconds or 60, "requests to reach " .. cjson.encode(states))
end

function M.detail(s, id)
  local out = { request = M.request(s, id) }
  out.nodes = s:query([[SELECT node_key, node_state, error_code, error_detail, attempt_no, provider_refs
                          FROM movement_request_nodes WHERE request_id = $1::uuid ORDER BY node_key]], id)
  return cjson.encode(out)
end

return M
