-- The sim executor only on the network classes MG_SIM_NETWORK_CLASSES lists
-- (qtg.executors.allowed): elsewhere its nodes fail at dispatch with
-- EXECUTOR_NOT_ALLOWED, and `qtgd check` prints a FAIL line for every loaded
-- template that would run on sim there.  Real `qtgd run` / `qtgd check`
-- processes, real PostgreSQL.
local qtg = require "qtg"
local common = require "spec.lua.support.common"

describe("sim on real network classes", function()
  local sup, engine, s
  setup(function()
    sup = require "spec.lua.support.evm"
    engine = require "spec.lua.support.engine"
    s = qtg.db.acquire()
  end)
  teardown(function()
    sup.host.stop_all()
    s:release()
  end)

  it("matches names and prefixes", function()
    local executors = require "qtg.executors"
    assert.is_true(executors.allowed("evm_transfer", "mainnet"))
    assert.is_true(executors.allowed("manual", "mainnet"))
    local ok, why = executors.allowed("sim", "mainnet")
    if qtg.settings.sim_network_classes == "*" then assert.is_true(ok) else assert.is_nil(ok) end
    assert.truthy(ok or why:match("MG_SIM_NETWORK_CLASSES"))
  end)

  it("fails a sim node on a class not listed, and qtgd check reports the template", function()
    local class = "mainnet-" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
    local key = "simcls_" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
    engine.load_doc(s, engine.doc(key, { { "a", "action", "withdrawal", { sim = { observes = 0 } } } }))
    local req = sup.create(s, key, class, { asset = "USDC", amount = "10" })
    local env = sup.run_env(class, { MG_SIM_NETWORK_CLASSES = "devnet,test*" })
    local h = sup.start_run(env)
    sup.wait_states(s, { req.id }, { COMPLETED = true, FAILED = true }, 60, { h })
    local a = engine.nodes(s, req.id).a
    assert.equal("FAILED", a.node_state)
    assert.equal("EXECUTOR_NOT_ALLOWED", a.error_code)
    assert.truthy(a.error_detail:find(class, 1, true), a.error_detail)
    assert.equal(0, #s:query("SELECT 1 FROM sim_ledger WHERE request_node_id = $1", a.id))
    -- the same template on an allowed class by prefix: it completes
    local ok_class = "testing-" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
    local req2 = sup.create(s, key, ok_class, { asset = "USDC", amount = "10" })
    local h2 = sup.start_run(sup.run_env(ok_class, { MG_SIM_NETWORK_CLASSES = "devnet,test*" }))
    sup.wait_states(s, { req2.id }, { COMPLETED = true, FAILED = true }, 60, { h2 })
    assert.equal("COMPLETED", engine.request(s, req2.id).request_state)
    -- qtgd check on the real class: one FAIL line per template on sim
    local rc, out = sup.host.run(sup.host.base_env({ MG_NETWORK_CLASS = class,
      MG_SIM_NETWORK_CLASSES = "devnet,test*" }), { common.quote(sup.host.bin), "check" })
    assert.is_not.equal(0, rc)
    assert.truthy(out:find("FAIL  templates   template " .. key .. " would run on sim: executor sim does not run on network class "
      .. class, 1, true), out)
    local rc2, out2 = sup.host.run(sup.host.base_env({ MG_NETWORK_CLASS = "devnet",
      MG_SIM_NETWORK_CLASSES = "devnet,test*" }), { common.quote(sup.host.bin), "check" })
    assert.is_nil(out2:find("would run on sim", 1, true), out2)
    assert.truthy(rc2 ~= nil)
  end)
end)
