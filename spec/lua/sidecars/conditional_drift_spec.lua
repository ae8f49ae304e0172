-- verify_drift against a real chain (anvil: a contract deployed here, its
-- code changed with anvil_setCode to make real drift), with the JSON-RPC
-- stand-in only for garbage, hangs and the concurrency count; ccip_drift
-- against the CCIP sidecar stand-in (tools/fake-providers).  Findings,
-- checks and notifications are asserted on the rows.
local qtg = require "qtg"

local sup -- spec/lua/support/conditional.lua

local CHAIN = 31337
-- runtime: return the 32-byte word 42 for any call; init: copy and return it
local RUNTIME = "0x602a60005260206000f3"
local INIT = "0x600a600c600039600a6000f3" .. RUNTIME:sub(3)
local WORD42 = "0x" .. string.rep("00", 31) .. "2a"

local function count(sql, ...) return sup.query(sql, ...)[1].n end
local function keccak(hex) return "0x" .. qtg.crypto.keccak256_hex(qtg.crypto.unhex(hex)) end

local function findings(class, source)
  return sup.query([[SELECT subject, status, expected, observed FROM drift_findings
                      WHERE network_class = $1 AND source = $2 ORDER BY id]], class, source)
end
local function checks(class, source)
  return sup.query([[SELECT scope, ok, checked, drifted, errors FROM drift_checks
                      WHERE network_class = $1 AND source = $2 ORDER BY id]], class, source)
end

describe("verify_drift", function()
  local s, dir, chain, prov, contract
  setup(function()
    sup = require "spec.lua.support.conditional"
    s = qtg.db.acquire()
    dir = sup.tmpdir()
    chain = sup.start_anvil()
    prov = sup.start_providers(dir, { rpc_chain_id = 31338 })
    local hash = sup.rpc(chain.url, "eth_sendTransaction", { { from = sup.DEV[1].address, data = INIT } })
    local rc = sup.wait_for(function()
      local r = sup.rpc(chain.url, "eth_getTransactionReceipt", { hash })
      return r ~= require("cjson").null and r
    end, 10, "the deployment")
    contract = rc.contractAddress
  end)
  teardown(function()
    s:release()
    sup.stop_all()
  end)

  local function baseline(class, t)
    return sup.with_settings({ network_class = class }, require("qtg.drift").set_baseline, s, t, "console:spec")
  end
  local function over(class, extra)
    local t = { network_class = class, evm_rpc_urls = CHAIN .. "=" .. chain.url .. ",31338=" .. prov.url .. "/rpc",
                verify_drift_interval_seconds = 0, verify_drift_lane_timeout_seconds = 5 }
    for k, v in pairs(extra or {}) do t[k] = v end
    return t
  end

  it("opens a finding when the chain drifts from a baseline, once, and resolves it when it comes back", function()
    local class = sup.uid("vd")
    baseline(class, { chain_id = CHAIN, lane = "router", name = "code", kind = "code_hash", address = contract,
                      expected = keccak(RUNTIME) })
    baseline(class, { chain_id = CHAIN, lane = "router", name = "answer", kind = "call", address = contract,
                      call_data = "0x", expected = WORD42 })
    assert.equals(2, sup.tick("verify_drift", over(class)))
    assert.same({}, findings(class, "verify"))
    local c = checks(class, "verify")
    assert.equals(1, #c)
    assert.same({ CHAIN .. ":router", true, 2, 0 }, { c[1].scope, c[1].ok, c[1].checked, c[1].drifted })
    -- the contract is replaced: return 43 instead
    local other = "0x602b60005260206000f3"
    sup.rpc(chain.url, "anvil_setCode", { contract, other })
    assert.equals(2, sup.tick("verify_drift", over(class)))
    local f = findings(class, "verify")
    assert.equals(2, #f)
    local seen = {}
    for _, x in ipairs(f) do
      assert.equals("open", x.status)
      seen[x.expected] = x.observed
    end
    assert.equals(keccak(other), seen[keccak(RUNTIME)])
    assert.equals("0x" .. string.rep("00", 31) .. "2b", seen[WORD42])
    assert.equals(2, count([[SELECT count(*)::int AS n FROM notification_outbox WHERE network_class = $1
                              AND kind = 'registry_drift']], class))
    -- seen again: nothing new
    assert.equals(2, sup.tick("verify_drift", over(class)))
    assert.equals(2, #findings(class, "verify"))
    assert.equals(2, count("SELECT count(*)::int AS n FROM notification_outbox WHERE network_class = $1", class))
    -- restored: resolved
    sup.rpc(chain.url, "anvil_setCode", { contract, RUNTIME })
    sup.tick("verify_drift", over(class))
    for _, x in ipairs(findings(class, "verify")) do assert.equals("resolved", x.status) end
    -- within half an interval of the last check, a pass does nothing
    assert.equals(0, sup.tick("verify_drift", over(class, { verify_drift_interval_seconds = 3600 })))
  end)

  it("refuses malformed baselines at entry, and records bad ones, missing endpoints and RPC failures per lane", function()
    local class = sup.uid("vd-bad")
    assert.has_error(function()
      baseline(class, { chain_id = CHAIN, lane = "x", name = "y", kind = "call", address = "0x1234", call_data = "0x",
                        expected = WORD42 })
    end, 'drift.set_baseline: malformed EVM address "0x1234" (want 0x and 40 hex digits)')
    baseline(class, { chain_id = CHAIN, lane = "good", name = "answer", kind = "call", address = contract,
                      call_data = "0x", expected = WORD42 })
    s:query([[INSERT INTO drift_baselines (network_class, chain_id, lane, name, kind, address, call_data, expected, created_by)
              VALUES ($1, $2, 'typo', 'answer', 'call', '0xNOTANADDRESS', '0x', $3, 'sql:spec')]], class, CHAIN, WORD42)
    baseline(class, { chain_id = 424242, lane = "nowhere", name = "x", kind = "call", address = contract,
                      call_data = "0x", expected = WORD42 })
    baseline(class, { chain_id = 31338, lane = "flaky", name = "a", kind = "call", address = contract,
                      call_data = "0x", expected = WORD42 })
    local function lane_errors(scope)
      for _, c in ipairs(checks(class, "verify")) do if c.scope == scope then return c end end
    end
    for _, case in ipairs({ { mode = "garbage", want = "garbage" }, { mode = "error", want = "status" },
                            { mode = "hang", want = "timeout" } }) do
      prov.control({ service = "rpc", mode = case.mode })
      sup.query("DELETE FROM drift_checks WHERE network_class = $1", class)
      assert.equals(4, sup.tick("verify_drift", over(class, { verify_drift_lane_timeout_seconds = 2 })))
      assert.is_true(lane_errors(CHAIN .. ":good").ok)
      local typo = lane_errors(CHAIN .. ":typo")
      assert.is_false(typo.ok)
      assert.matches("malformed EVM address", typo.errors[1])
      assert.matches("no RPC endpoint for chain 424242", lane_errors("424242:nowhere").errors[1])
      assert.matches(case.want, lane_errors("31338:flaky").errors[1])
    end
    prov.control({ service = "rpc", mode = "ok" })
    assert.same({}, findings(class, "verify"), "an error is never a finding")
  end)

  -- A node's answer is any bytes: a 502 page whose bullet straddles byte
  -- 200, where evm_rpc cuts a body, then latin-1, 0xff and a NUL.
  it("records a lane whose node answers bytes that are not text, and the other lanes' findings stand", function()
    local class = sup.uid("vd-bytes")
    baseline(class, { chain_id = CHAIN, lane = "router", name = "code", kind = "code_hash", address = contract,
                      expected = keccak("0x6000") })
    baseline(class, { chain_id = 31338, lane = "flaky", name = "a", kind = "call", address = contract,
                      call_data = "0x", expected = WORD42 })
    local page = "<html><title>502 Bad Gateway</title>" .. string.rep(" ", 162) .. "\226\128\162 caf\233 \255\0</html>"
    prov.control({ service = "rpc", mode = "raw", status = 502, body_hex = qtg.crypto.hex(page) })
    assert.equals(2, sup.tick("verify_drift", over(class)))
    prov.control({ service = "rpc", mode = "ok" })
    local f = findings(class, "verify")
    assert.equals(1, #f)
    assert.equals("open", f[1].status)
    local by = {}
    for _, c in ipairs(checks(class, "verify")) do by[c.scope] = c end
    assert.same({ true, 1 }, { by[CHAIN .. ":router"].ok, by[CHAIN .. ":router"].drifted })
    assert.is_false(by["31338:flaky"].ok)
    local e = by["31338:flaky"].errors[1]
    assert.matches("HTTP 502: <html>", e, 1, true)
    assert.matches("\239\191\189...", e, 1, true) -- the split bullet, repaired, and the cut marked
  end)

  it("rolls back a lane whose write fails alone, and records it as a failed check", function()
    local class = sup.uid("vd-lane")
    baseline(class, { chain_id = CHAIN, lane = "a", name = "code", kind = "code_hash", address = contract,
                      expected = keccak("0x6000") })
    baseline(class, { chain_id = CHAIN, lane = "b", name = "code", kind = "code_hash", address = contract,
                      expected = keccak("0x6000") })
    local drift = require("qtg.drift")
    local check, failed = drift.check, false
    drift.check = function(x, t)
      if t.scope == CHAIN .. ":a" and not failed then
        failed = true
        x:query("SELECT 1 / 0") -- a statement the database refuses: the transaction is aborted
      end
      return check(x, t)
    end
    local ok, n = pcall(sup.tick, "verify_drift", over(class))
    drift.check = check
    assert.is_true(ok, tostring(n))
    assert.equals(2, n)
    local f = findings(class, "verify")
    assert.equals(1, #f, "lane b's finding stands, lane a's is rolled back")
    local by = {}
    for _, c in ipairs(checks(class, "verify")) do by[c.scope] = c end
    assert.is_false(by[CHAIN .. ":a"].ok)
    assert.matches("recording the lane failed: .*division by zero", by[CHAIN .. ":a"].errors[1])
    assert.same({ true, 1 }, { by[CHAIN .. ":b"].ok, by[CHAIN .. ":b"].drifted })
  end)

  it("keeps at most MG_VERIFY_DRIFT_CONCURRENCY calls in flight per chain and bounds each lane", function()
    local class = sup.uid("vd-conc")
    for i = 1, 6 do
      baseline(class, { chain_id = 31338, lane = "slow", name = "n" .. i, kind = "call", address = contract,
                        call_data = "0x", expected = WORD42 })
    end
    prov.control({ service = "rpc", mode = "slow", reset_stats = true, state = { delay = 0.3 } })
    assert.equals(6, sup.tick("verify_drift", over(class, { verify_drift_concurrency = 2 })))
    local st = prov.stats()
    assert.equals(2, st.max_inflight.rpc)
    assert.equals(7, st.requests.rpc) -- eth_chainId, then six calls
    assert.is_true(checks(class, "verify")[1].ok)
    -- a lane of 0.8 s: the calls that would start after it are not made
    sup.query("DELETE FROM drift_checks WHERE network_class = $1", class)
    prov.control({ service = "rpc", mode = "slow", reset_stats = true, state = { delay = 0.5 } })
    sup.tick("verify_drift", over(class, { verify_drift_concurrency = 2, verify_drift_lane_timeout_seconds = 0.8 }))
    prov.control({ service = "rpc", mode = "ok" })
    local c = checks(class, "verify")[1]
    assert.is_false(c.ok)
    assert.is_true(#c.errors >= 2)
    assert.matches("lane timeout", c.errors[#c.errors])
    assert.is_true(prov.stats().requests.rpc < 7)
  end)

  it("two processes at once run one pass between them", function()
    local class = sup.uid("vd-two")
    baseline(class, { chain_id = CHAIN, lane = "a", name = "answer", kind = "call", address = contract,
                      call_data = "0x", expected = WORD42 })
    baseline(class, { chain_id = CHAIN, lane = "b", name = "code", kind = "code_hash", address = contract,
                      expected = keccak(RUNTIME) })
    local go = dir .. "/go-vd"
    local env = sup.base_env{ MG_NETWORK_CLASS = class, MG_EVM_RPC_URLS = CHAIN .. "=" .. chain.url }
    local c1 = sup.start_child(dir, "vd1", env, "verify_drift", 2, go)
    local c2 = sup.start_child(dir, "vd2", env, "verify_drift", 2, go)
    sup.write(go, "go")
    local r1, r2 = sup.wait_child(c1), sup.wait_child(c2)
    assert.is_true(r1.ok and r2.ok, tostring(r1.error or r2.error))
    assert.equals(2, r1.items + r2.items)
    assert.equals(2, #checks(class, "verify"))
  end)
end)

describe("ccip_drift", function()
  local dir, prov
  setup(function()
    sup = require "spec.lua.support.conditional"
    dir = sup.tmpdir()
    prov = sup.start_providers(dir)
  end)
  teardown(function() sup.stop_all() end)

  local F1 = { subject = "lane:eth-base:onramp", lane = "eth->base", field = "onRamp", expected = "0xaa", observed = "0xbb",
               severity = "critical" }
  local F2 = { subject = "lane:eth-arb:rmn", lane = "eth->arb", field = "rmnProxy", expected = "0x01", observed = "0x02" }

  local function over(class, extra)
    local t = { network_class = class, ccip_sidecar_url = prov.url, ccip_drift_poll_interval_seconds = 0,
                provider_timeout_seconds = 2 }
    for k, v in pairs(extra or {}) do t[k] = v end
    return t
  end

  it("records the sidecar's findings once, and resolves those it stops reporting", function()
    local class = sup.uid("cd")
    prov.control({ service = "ccip", mode = "ok", state = { ccip_findings = { F1, F2 }, ccip_lanes = 12 } })
    assert.equals(2, sup.tick("ccip_drift", over(class)))
    local f = findings(class, "ccip")
    assert.equals(2, #f)
    assert.equals("ccip:lane:eth-base:onramp", f[1].subject)
    assert.equals("0xbb", f[1].observed)
    local c = checks(class, "ccip")
    assert.same({ true, 12, 2 }, { c[1].ok, c[1].checked, c[1].drifted })
    assert.equals(2, sup.tick("ccip_drift", over(class)))
    assert.equals(2, #findings(class, "ccip"))
    assert.equals(2, count("SELECT count(*)::int AS n FROM notification_outbox WHERE network_class = $1", class))
    prov.control({ state = { ccip_findings = { F2 } } })
    assert.equals(1, sup.tick("ccip_drift", over(class)))
    f = findings(class, "ccip")
    assert.equals("resolved", f[1].status)
    assert.equals("open", f[2].status)
  end)

  it("records garbage, error statuses, timeouts and malformed findings as failed checks, findings untouched", function()
    local class = sup.uid("cd-bad")
    prov.control({ service = "ccip", mode = "ok", state = { ccip_findings = { F1 }, ccip_lanes = 3 } })
    sup.tick("ccip_drift", over(class))
    local cases = {
      { ctl = { service = "ccip", mode = "garbage" }, want = "not a drift report" },
      { ctl = { service = "ccip", mode = "error", status = 503 }, want = "HTTP 503" },
      { ctl = { service = "ccip", mode = "hang" }, want = "timeout" },
      { ctl = { service = "ccip", mode = "ok", state = { ccip_findings = { { lane = "x" } } } }, want = "has no subject" },
    }
    for i, c in ipairs(cases) do
      prov.control(c.ctl)
      assert.equals(0, sup.tick("ccip_drift", over(class)))
      local ch = checks(class, "ccip")
      assert.equals(i + 1, #ch)
      assert.is_false(ch[#ch].ok)
      assert.matches(c.want, ch[#ch].errors[1])
      local f = findings(class, "ccip")
      assert.equals(1, #f)
      assert.equals("open", f[1].status, "a failed poll resolves nothing")
    end
    prov.control({ service = "ccip", mode = "ok" })
  end)

  -- A sidecar's answer is any bytes: a character split at the 120-byte
  -- excerpt, latin-1, 0xff and NUL in a body or a field, numbers an int
  -- column cannot hold.
  it("records a failed poll whatever bytes the sidecar answers, and refuses fields that are not text", function()
    local class = sup.uid("cd-bytes")
    local R = "\239\191\189" -- U+FFFD
    local cases = {
      { 500, string.rep("x", 119) .. "\195\169tail", "ccip sidecar: HTTP 500: " .. string.rep("x", 119) .. R .. "..." },
      { 502, "Erreur caf\233 \255\0 fin", "ccip sidecar: HTTP 502: Erreur caf" .. R .. " " .. R .. "  fin" },
      { 200, '{"findings":[{"subject":"a\\u0000b"}],"lanes_checked":1}',
        "ccip sidecar: findings[1] has no subject (text of at most 300 bytes)" },
      { 200, '{"findings":[{"subject":"a\255b"}],"lanes_checked":1}',
        "ccip sidecar: findings[1] has no subject (text of at most 300 bytes)" },
      { 200, '{"findings":[],"lanes_checked":1.5}', "ccip sidecar: lanes_checked is not a whole number in [0, 2^31): 1.5" },
      { 200, '{"findings":[],"lanes_checked":1e300}', "ccip sidecar: lanes_checked is not a whole number in [0, 2^31): 1e+300" },
      { 200, '{"findings":[],"lanes_checked":-1}', "ccip sidecar: lanes_checked is not a whole number in [0, 2^31): -1" },
    }
    for i, c in ipairs(cases) do
      prov.control({ service = "ccip", mode = "raw", status = c[1], body_hex = qtg.crypto.hex(c[2]) })
      assert.equals(0, sup.tick("ccip_drift", over(class)))
      local ch = checks(class, "ccip")
      assert.equals(i, #ch)
      assert.is_false(ch[i].ok)
      assert.equals(c[3], ch[i].errors[1])
    end
    -- an expected or observed value that is not text is left out, the finding recorded
    prov.control({ service = "ccip", mode = "raw", status = 200, body_hex = qtg.crypto.hex(
      '{"findings":[{"subject":"s1","expected":"\255","observed":"a\\u0000"}],"lanes_checked":1}') })
    assert.equals(1, sup.tick("ccip_drift", over(class)))
    prov.control({ service = "ccip", mode = "ok" })
    local f = findings(class, "ccip")
    assert.equals(1, #f)
    assert.same({ "ccip:s1", qtg.db.NULL, qtg.db.NULL }, { f[1].subject, f[1].expected, f[1].observed })
  end)

  it("two processes at once poll once between them", function()
    local class = sup.uid("cd-two")
    prov.control({ service = "ccip", mode = "slow", state = { delay = 0.3, ccip_findings = { F1, F2 } } })
    local go = dir .. "/go-cd"
    local env = sup.base_env{ MG_NETWORK_CLASS = class, MG_CCIP_SIDECAR_URL = prov.url, MG_CCIP_ENABLED = "true" }
    local c1 = sup.start_child(dir, "cd1", env, "ccip_drift", 2, go)
    local c2 = sup.start_child(dir, "cd2", env, "ccip_drift", 2, go)
    sup.write(go, "go")
    local r1, r2 = sup.wait_child(c1), sup.wait_child(c2)
    prov.control({ service = "ccip", mode = "ok" })
    assert.is_true(r1.ok and r2.ok, tostring(r1.error or r2.error))
    assert.equals(2, r1.items + r2.items)
    assert.equals(1, #checks(class, "ccip"))
    assert.equals(2, count("SELECT count(*)::int AS n FROM notification_outbox WHERE network_class = $1", class))
  end)
end)
