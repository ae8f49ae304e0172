-- The README's first command runs the demo (tools/demo, driver
-- tools/demo.lua): here it runs non-interactively (CI=true, no terminal) as
-- CI and a newcomer's pipe would, with the qtgd under test, and must reach
-- its summary and exit 0 -- so the demo cannot rot.  The spec then checks
-- the demo's claims against the database and the receiver's own record, not
-- only its output; and that a demo which cannot finish fails and leaves no
-- process behind.
local qtg = require "qtg"
local cjson = require "cjson"

local sup -- spec/lua/support/host.lua

local q = require("spec.lua.support.common").quote

local function demo(dir, class, args)
  return sup.run({
    MG_DATABASE_URL = os.getenv("MG_DATABASE_URL"),
    QTG_BIN = sup.bin, QTG_DEMO_DIR = dir, QTG_DEMO_NETWORK_CLASS = class, CI = "true",
  }, { q(sup.root .. "/tools/demo"), "--no-setup", args or "" })
end

local function alive(pid)
  return os.execute("kill -0 " .. pid .. " 2>/dev/null") == 0
end

describe("tools/demo (the README's first command)", function()
  local tmp
  setup(function()
    sup = require "spec.lua.support.host"
    tmp = sup.tmpdir()
  end)
  teardown(function()
    if tmp then os.execute("rm -rf " .. q(tmp)) end
  end)

  it("runs to its summary and exits 0; the database and the receiver agree with it", function()
    local dir = tmp .. "/ok"
    local class = "demo-" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
    local rc, out = demo(dir, class, "--exit")
    assert.equals(0, rc, out)
    local shipped = {}
    local p = io.popen("ls " .. q(sup.root .. "/templates"))
    for f in p:lines() do if f:match("%.json$") then shipped[#shipped + 1] = f:gsub("%.json$", "") end end
    p:close()
    assert.matches(("== all %d movements COMPLETED; every callback delivered and verified"):format(#shipped + 1),
      out, 1, true)
    assert.matches("desk_confirmation: the desk confirmed; manual step completed", out, 1, true)
    assert.matches("withdraw is UNKNOWN (SUBMIT_OUTCOME_UNKNOWN)", out, 1, true)
    assert.matches("withdraw recovered by system:node_recovery", out, 1, true)
    assert.matches("stopped cleanly (exit 0)", out, 1, true)
    -- one movement needs two approvers (the OTC settlement, over the shipped policy's 100000 tier)
    assert.matches("otc_settlement_manual: approved once; the policy %(rule [%w_]+%) needs 2 approvers: "
      .. "a second client approves", out)
    local otc = sup.query([[SELECT count(*)::int AS n FROM request_approvals a JOIN movement_requests r ON r.id = a.request_id
                             WHERE r.network_class = $1 AND r.template_key = 'otc_settlement_manual'
                               AND a.decision = 'approve']], class)[1]
    assert.equals(2, otc.n)

    -- the movements, from the database: one per shipped template plus the
    -- UNKNOWN case, all COMPLETED, in the demo's network class
    local reqs = sup.query([[SELECT id::text AS id, template_key, request_state FROM movement_requests
                              WHERE network_class = $1 ORDER BY template_key]], class)
    local keys = {}
    for i, r in ipairs(reqs) do
      keys[i] = r.template_key
      assert.equals("COMPLETED", r.request_state, r.template_key)
    end
    local evm_shipped = false
    for _, k in ipairs(shipped) do if k == "evm_transfer" then evm_shipped = true end end
    shipped[#shipped + 1] = "cex_withdrawal_lost_ack"
    table.sort(shipped)
    assert.same(shipped, keys)

    -- the UNKNOWN node really was UNKNOWN and recovered by node_recovery
    local lost
    for _, r in ipairs(reqs) do if r.template_key == "cex_withdrawal_lost_ack" then lost = r.id end end
    local trail = sup.query([[SELECT actor, action FROM audit_events WHERE request_id = $1::uuid
                               AND entity_type = 'movement_request_node' ORDER BY outbox_id]], lost)
    local seen_unknown, recovered = false, false
    for _, a in ipairs(trail) do
      if a.action == "node.unknown" then seen_unknown = true end
      if seen_unknown and a.actor == "system:node_recovery" then recovered = true end
    end
    assert.is_true(seen_unknown)
    assert.is_true(recovered)

    -- the manual step was completed by the operator
    local manual = sup.query([[SELECT n.node_state, n.provider_refs FROM movement_request_nodes n
                                 JOIN movement_requests r ON r.id = n.request_id
                                WHERE r.network_class = $1 AND n.action_type = 'manual_confirmation']], class)
    assert.equals(1, #manual)
    assert.equals("COMPLETED", manual[1].node_state)
    assert.matches("^OTC%-DEMO%-", manual[1].provider_refs.desk_reference)

    -- every callback row delivered; the receiver verified exactly those
    local cbs = sup.query([[SELECT c.status, c.callback_nonce FROM movement_callback_outbox c
                              JOIN movement_requests r ON r.id = c.request_id WHERE r.network_class = $1]], class)
    assert.is_true(#cbs >= 5 * 4)
    local nonces = {}
    for _, c in ipairs(cbs) do
      assert.equals("delivered", c.status)
      nonces[c.callback_nonce] = true
    end
    local verified = 0
    for line in (sup.read(dir .. "/callbacks.jsonl") or ""):gmatch("[^\n]+") do
      local e = cjson.decode(line)
      assert.is_true(e.verdict.ok, line)
      local nonce = e.headers["X-QTG-Callback-Nonce"] or e.headers["x-qtg-callback-nonce"]
      assert.is_true(nonces[nonce] ~= nil, "a delivery the outbox does not know: " .. line)
      verified = verified + 1
    end
    assert.equals(#cbs, verified)
    assert.matches(("callbacks: %d delivered to"):format(#cbs), out, 1, true)

    -- the ETH movement, checked by the demo on the chain itself
    if evm_shipped then
      assert.matches("EVM: 0.25 ETH arrived at 0x%x+ on chain 31337 %(eth_getBalance%)", out)
    end

    -- nothing is left running
    local pid = tonumber(out:match("running, pid (%d+)"))
    assert.is_truthy(pid, out)
    assert.is_false(alive(pid))
    local port = sup.read(dir .. "/receiver.port")
    assert.is_false(alive(tonumber(port:match("%d+ (%d+)"))))
  end)

  it("fails, saying why, when the movements cannot finish in time, and leaves nothing running", function()
    local dir = tmp .. "/late"
    local rc, out = demo(dir, "demo-" .. qtg.crypto.hex(qtg.crypto.random_bytes(4)), "--exit --timeout 1")
    assert.are_not.equal(0, rc, out)
    assert.matches("not every movement finished within 1 s", out, 1, true)
    assert.matches("the demo did not end as it should", out, 1, true)
    local pid = tonumber(out:match("running, pid (%d+)"))
    assert.is_truthy(pid, out)
    assert.is_false(alive(pid))
  end)

  it("refuses bad arguments", function()
    local rc, out = demo(tmp .. "/bad", "demo-x", "--timeout soon")
    assert.equals(1, rc, out)
    assert.matches("--timeout needs a whole number of seconds", out, 1, true)
    rc, out = demo(tmp .. "/bad", "demo-x", "--frobnicate")
    assert.equals(2, rc, out)
    assert.matches("unknown argument: --frobnicate", out, 1, true)
  end)
end)
