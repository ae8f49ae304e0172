-- Pure rules of the movement engine: $ref resolution, the ExecutionContext
-- merges, derive_request_state, advancing a chain and a join, observe
-- intervals, executor answer checks.  No database.
local ref = require "qtg.ref"
local context = require "qtg.context"
local state = require "qtg.state"
local intervals = require "qtg.observe_intervals"
local executors = require "qtg.executors"
local canon = require "qtg.canon_json"
local nodes = require "qtg.nodes"
local errors = require "qtg.errors"
local qtg = require "qtg"
local NULL = require("cjson").null

describe("$ref resolution", function()
  local nodes = {
    { node_key = "withdraw", node_state = "COMPLETED",
      provider_refs = { withdrawal_id = "w-1", receipt = { tx = { hash = "0xabc" }, fee = 2 } } },
    { node_key = "status", node_state = "COMPLETED", provider_refs = { tx_hash = "0xdef", empty = NULL } },
    { node_key = "pending", node_state = "SUBMITTED", provider_refs = { tx_hash = "0x000" } },
  }
  local map = ref.ref_map(nodes)

  it("resolves top-level refs, keeping literal values", function()
    local out, bindings = ref.resolve({ id = "$ref:withdraw.withdrawal_id", confirmations = 12,
      note = "plain" }, map)
    assert.same({ id = "w-1", confirmations = 12, note = "plain" }, out)
    assert.same({ ["$ref:withdraw.withdrawal_id"] = "w-1" }, bindings)
  end)

  it("resolves a dotted path into nested values and copies a nested value whole", function()
    local out = ref.resolve({ h = "$ref:withdraw.receipt.tx.hash", r = "$ref:withdraw.receipt" }, map)
    assert.equal("0xabc", out.h)
    assert.same({ tx = { hash = "0xabc" }, fee = 2 }, out.r)
    out.r.fee = 99 -- a copy: the node's provider_refs are untouched
    assert.equal(2, nodes[1].provider_refs.receipt.fee)
  end)

  it("refuses a node that is not completed, with CONFIG_REF_UNRESOLVED", function()
    local ok, err = pcall(ref.resolve, { x = "$ref:pending.tx_hash" }, map)
    assert.is_false(ok)
    assert.equal("CONFIG_REF_UNRESOLVED", err.code)
    assert.matches("pending is not a completed node", err.message, 1, true)
  end)

  it("refuses a node that does not exist", function()
    local ok, err = pcall(ref.resolve, { x = "$ref:nosuch.tx_hash" }, map)
    assert.is_false(ok)
    assert.equal("CONFIG_REF_UNRESOLVED", err.code)
  end)

  it("refuses a missing field, a JSON null and a path through a scalar", function()
    for _, expr in ipairs({ "$ref:status.nope", "$ref:status.empty", "$ref:status.tx_hash.deeper" }) do
      local ok, err = pcall(ref.resolve, { x = expr }, map)
      assert.is_false(ok, expr)
      assert.equal("CONFIG_REF_UNRESOLVED", err.code, expr)
      assert.matches(expr, err.message, 1, true)
    end
  end)

  it("leaves a ref below the top level as it is", function()
    local out = ref.resolve({ deep = { x = "$ref:status.tx_hash" }, list = { "$ref:status.tx_hash" } }, map)
    assert.equal("$ref:status.tx_hash", out.deep.x)
    assert.equal("$ref:status.tx_hash", out.list[1])
  end)

  it("parses and refuses malformed expressions", function()
    assert.same({ "a", { "b", "c" } }, { ref.parse("$ref:a.b.c") })
    assert.is_nil((ref.parse("$ref:a")))
    assert.is_nil((ref.parse("$ref:A.b")))
    assert.is_nil((ref.parse("$ref:a..b")))
    local top, nested = ref.scan({ a = "$ref:x.y", b = { c = "$ref:x.z" } })
    assert.same({ { path = "a", expr = "$ref:x.y" } }, top)
    assert.same({ { path = "b.c", expr = "$ref:x.z" } }, nested)
  end)
end)

describe("ExecutionContext", function()
  local nodes = {
    { id = "n-a", node_key = "a", node_state = "COMPLETED", attempt_no = 1,
      provider_refs = { tx_hash = "0xa", a_only = 1 }, artifacts = { { kind = "r", v = 1 } } },
    { id = "n-b", node_key = "b", node_state = "COMPLETED", attempt_no = 1,
      provider_refs = { tx_hash = "0xb", b_only = 2 }, artifacts = { { kind = "r", v = 2 } } },
    { id = "n-c", node_key = "c", node_state = "FAILED", attempt_no = 1,
      provider_refs = { c_only = 3 }, artifacts = {} },
    { id = "n-up", node_key = "up", node_state = "COMPLETED", attempt_no = 1,
      provider_refs = { far = "away" }, artifacts = {} },
    { id = "n-j", node_key = "j", node_state = "READY", attempt_no = 2,
      provider_refs = {}, artifacts = {} },
  }
  local args = {
    request = { id = "r-1", compiled_plan_hash = "h", intent = { asset = "USDC", amount = "5" },
                input_params = { chain_family = "evm" } },
    node = nodes[5],
    plan_node = { node_kind = "observe", action_type = "destination_chain_receive_observe",
                  config = { far = "$ref:up.far", x = 1 }, timeout_policy = { observe_seconds = 60 } },
    plan_version = { version = 3, risk_controls = { max_amount = "9" }, template_key = "t" },
    nodes = nodes,
    pred_keys = { "b", "a", "c" },
  }

  it("has exactly the spec's fields", function()
    local ctx = context.build(args)
    local keys = {}
    for k in pairs(ctx) do keys[#keys + 1] = k end
    table.sort(keys)
    assert.same({ "action_type", "attempt_no", "compiled_plan_hash", "input_params", "intent",
      "node_config", "node_key", "node_kind", "prior_artifacts", "protocol_version",
      "provider_context", "request_id", "request_node_id", "resolved_bindings", "risk_controls",
      "template_key", "template_version", "timeout_policy" }, keys)
    assert.equal("1.0", ctx.protocol_version)
    assert.equal(3, ctx.attempt_no) -- attempt_no + 1
    assert.equal(3, ctx.template_version)
  end)

  it("flat-merges provider_refs of completed direct predecessors only, later node_key winning", function()
    local ctx = context.build(args)
    assert.same({ tx_hash = "0xb", a_only = 1, b_only = 2 }, ctx.provider_context)
    assert.is_nil(ctx.provider_context.c_only) -- FAILED predecessor
    assert.is_nil(ctx.provider_context.far)    -- completed, but not a direct predecessor
  end)

  it("resolves $ref against every completed node, not only predecessors", function()
    local ctx = context.build(args)
    assert.same({ far = "away", x = 1 }, ctx.node_config)
    assert.same({ ["$ref:up.far"] = "away" }, ctx.resolved_bindings)
  end)

  it("lists the predecessors' artifacts in node_key order, tagged with their node", function()
    local ctx = context.build(args)
    assert.same({ { kind = "r", v = 1, node_key = "a" }, { kind = "r", v = 2, node_key = "b" } },
      ctx.prior_artifacts)
    assert.equal("[]", canon.encode(context.prior_artifacts({})))
  end)

  it("builds the SignRequest from the context and the prepared action", function()
    local ctx = context.build(args)
    local sr = context.sign_request(ctx, { action_type = "x", payload_format = "hex",
      payload = "ab", payload_hash = "0x1" })
    assert.equal("0x1", sr.signing_intent.allowed_payload_hash)
    assert.equal("USDC", sr.signing_intent.asset)
    assert.equal("5", sr.signing_intent.amount)
    assert.equal("evm", sr.signing_intent.chain_family)
    assert.equal("n-j", sr.request_node_id)
    assert.equal("ab", sr.payload)
  end)

  it("derives the idempotency key from (node id, attempt)", function()
    assert.equal("qtg:n-j:3", context.idempotency_key("n-j", 3))
    assert.are_not.equal(context.idempotency_key("n-j", 3), context.idempotency_key("n-j", 4))
  end)
end)

describe("derive_request_state", function()
  local function n(st, extra)
    local t = { node_state = st, action_type = "withdrawal", side_effect = false }
    for k, v in pairs(extra or {}) do t[k] = v end
    return t
  end
  local SE = { side_effect = true }
  local MANUAL = { action_type = "manual_confirmation" }
  local rows = {
    { "all COMPLETED", { n("COMPLETED"), n("COMPLETED") }, "COMPLETED" },
    { "COMPLETED and SKIPPED", { n("COMPLETED"), n("SKIPPED") }, "COMPLETED" },
    { "FAILED + side-effect COMPLETED", { n("COMPLETED", SE), n("FAILED") }, "MANUAL_INTERVENTION" },
    { "UNKNOWN + side-effect COMPLETED", { n("COMPLETED", SE), n("UNKNOWN") }, "MANUAL_INTERVENTION" },
    { "FAILED, completed without side effect", { n("COMPLETED"), n("FAILED") }, "FAILED" },
    { "FAILED alone", { n("FAILED"), n("BLOCKED") }, "FAILED" },
    { "UNKNOWN without side effect", { n("COMPLETED"), n("UNKNOWN") }, nil },
    -- a node still in flight has not settled whether the request had a side
    -- effect, and only an EXECUTING request's nodes are observed: hold
    { "FAILED, a side effect in flight", { n("SUBMITTED", SE), n("FAILED") }, nil },
    { "FAILED, a node SUBMITTING", { n("SUBMITTING"), n("FAILED") }, nil },
    { "FAILED, a node OBSERVING", { n("OBSERVING"), n("FAILED"), n("READY") }, nil },
    { "FAILED + side-effect COMPLETED, a node in flight",
      { n("COMPLETED", SE), n("FAILED"), n("SUBMITTED", SE) }, nil },
    { "UNKNOWN + side-effect COMPLETED, a node in flight",
      { n("COMPLETED", SE), n("UNKNOWN"), n("OBSERVING") }, nil },
    -- node_recovery sweeps EXECUTING requests only
    { "FAILED + UNKNOWN, no side effect", { n("FAILED"), n("UNKNOWN") }, nil },
    { "FAILED + UNKNOWN + side-effect COMPLETED", { n("COMPLETED", SE), n("FAILED"), n("UNKNOWN") },
      "MANUAL_INTERVENTION" },
    { "FAILED after the in-flight node settled", { n("COMPLETED"), n("FAILED"), n("READY") }, "FAILED" },
    { "READY manual, nothing executing", { n("COMPLETED"), n("READY", MANUAL) }, "WAITING_MANUAL_ACTION" },
    { "READY manual, a node SUBMITTED", { n("SUBMITTED"), n("READY", MANUAL) }, nil },
    { "READY manual, another READY node", { n("READY"), n("READY", MANUAL) }, nil },
    -- an UNKNOWN node is still executing: WAITING_MANUAL_ACTION would end its
    -- recovery (node_recovery sweeps EXECUTING requests only)
    { "READY manual, a node UNKNOWN", { n("UNKNOWN"), n("READY", MANUAL) }, nil },
    { "READY manual + FAILED", { n("FAILED"), n("READY", MANUAL) }, "FAILED" },
    { "in progress", { n("COMPLETED"), n("OBSERVING"), n("BLOCKED") }, nil },
    { "no nodes", {}, nil },
  }
  for _, row in ipairs(rows) do
    it(row[1] .. " -> " .. tostring(row[3]), function()
      assert.equal(row[3], state.derive_request_state(row[2]))
    end)
  end
end)

describe("advancing the DAG", function()
  local function nodes(states)
    local by = {}
    for k, st in pairs(states) do by[k] = { node_key = k, node_state = st } end
    return by
  end

  it("advances a chain one node at a time", function()
    local g = state.graph({ { from_key = "a", to_key = "b" }, { from_key = "b", to_key = "c" } })
    local succ, ready = state.advance(nodes({ a = "COMPLETED", b = "BLOCKED", c = "BLOCKED" }), g, "a")
    assert.same({ "b" }, succ)
    assert.same({ "b" }, ready)
    succ, ready = state.advance(nodes({ a = "COMPLETED", b = "COMPLETED", c = "BLOCKED" }), g, "b")
    assert.same({ "c" }, ready)
    succ, ready = state.advance(nodes({ a = "COMPLETED", b = "COMPLETED", c = "COMPLETED" }), g, "c")
    assert.same({}, succ)
  end)

  it("makes a join READY only when all its predecessors are COMPLETED or SKIPPED", function()
    local g = state.graph({ { from_key = "a", to_key = "j" }, { from_key = "b", to_key = "j" } })
    local succ, ready = state.advance(nodes({ a = "COMPLETED", b = "OBSERVING", j = "BLOCKED" }), g, "a")
    assert.same({ "j" }, succ)
    assert.same({}, ready)
    succ, ready = state.advance(nodes({ a = "COMPLETED", b = "COMPLETED", j = "BLOCKED" }), g, "b")
    assert.same({ "j" }, ready)
    succ, ready = state.advance(nodes({ a = "COMPLETED", b = "SKIPPED", j = "BLOCKED" }), g, "a")
    assert.same({ "j" }, ready)
    -- a successor that already moved on is not made READY again
    succ, ready = state.advance(nodes({ a = "COMPLETED", b = "COMPLETED", j = "SUBMITTED" }), g, "b")
    assert.same({}, ready)
  end)

  it("finds the roots of a graph", function()
    local g = state.graph({ { from_key = "a", to_key = "j" }, { from_key = "b", to_key = "j" } })
    assert.same({ "a", "b" }, state.roots({ "j", "b", "a" }, g))
  end)
end)

describe("observe intervals", function()
  it("equal the spec's DEFAULT_OBSERVE_INTERVALS", function()
    assert.same({
      cex_withdrawal_status = 5, cex_deposit_status = 10, destination_chain_receive_observe = 10,
      destination_chain_finality_observe = 15, protocol_observe = 15, cctp_attestation = 15,
      cctp_mint_status = 5, ccip_delivery = 60, debridge_fulfillment = 30,
    }, intervals.DEFAULT_OBSERVE_INTERVALS)
    assert.equal(10, intervals.delay("withdrawal"))
    assert.equal(60, intervals.delay("ccip_delivery"))
  end)

  it("lets retry_after_seconds win, clamped to 600", function()
    assert.equal(2, intervals.delay("ccip_delivery", 2))
    assert.equal(0, intervals.delay("ccip_delivery", 0))
    assert.equal(600, intervals.delay("cex_withdrawal_status", 601))
    assert.equal(600, intervals.delay("cex_withdrawal_status", 1e9))
  end)
end)

describe("executor answers", function()
  it("accepts well-formed answers", function()
    assert.truthy(executors.check("submit", { status = "SUBMITTED", provider_refs = { a = 1 } }))
    assert.truthy(executors.check("observe", { status = "OBSERVING", retry_after_seconds = 3 }))
    assert.truthy(executors.check("preflight", { ok = true }))
  end)

  it("refuses garbage with a reason", function()
    local cases = {
      { "submit", "yes" }, { "submit", { status = "DONE" } },
      { "submit", { status = "SUBMITTED", provider_refs = "x" } },
      { "observe", { status = "OBSERVING", retry_after_seconds = -1 } },
      { "observe", { status = "COMPLETED", artifacts = { a = 1 } } },
      { "preflight", { ok = "yes" } }, { "prepare", { payload_format = 1 } },
      { "prepare", { payload_format = "hex", signer_key = "k" } },
      { "recover", { status = "OBSERVING" } },
      { "submit", { status = "SUBMITTED", provider_refs = { f = function() end } } },
      { "observe", { status = "COMPLETED", artifacts = { { x = 0 / 0 } } } },
    }
    for _, c in ipairs(cases) do
      local ok, why = executors.check(c[1], c[2])
      assert.is_nil(ok, c[1])
      assert.is_string(why)
    end
  end)

  it("turns a raise into EXECUTOR_ERROR and garbage into EXECUTOR_BAD_RESPONSE", function()
    local adapter = {
      submit = function() error("provider exploded") end,
      observe = function() return { status = 42 } end,
    }
    local a, err = executors.call(adapter, "submit", {})
    assert.is_nil(a)
    assert.equal("executor", err.kind)
    assert.equal("EXECUTOR_ERROR", err.code)
    assert.matches("provider exploded", err.message, 1, true)
    assert.equal("executor: " .. err.message, tostring(err))
    a, err = executors.call(adapter, "observe", {})
    assert.equal("EXECUTOR_BAD_RESPONSE", err.code)
    a, err = executors.call(adapter, "recover", {})
    assert.equal("EXECUTOR_ERROR", err.code)
  end)

  it("records an executor's own raised error as its code and detail", function()
    local adapter = {
      prepare = function() error(executors.error("EVM_FEE_ABOVE_CAP", "fees too high"), 0) end,
      submit = function() error(qtg.error("sql", "lost"), 0) end,
    }
    local a, err = executors.call(adapter, "prepare", {})
    assert.is_nil(a)
    assert.equal("EXECUTOR_ERROR", err.code)
    assert.equal("prepare raised: EVM_FEE_ABOVE_CAP: fees too high", err.message)
    a, err = executors.call(adapter, "submit", {})
    assert.equal("submit raised: sql: lost", err.message)
  end)

  it("maps every action type to a registered executor", function()
    for action_type, name in pairs(executors.ACTION_TYPES) do
      assert.truthy(executors.ADAPTERS[name], action_type)
    end
  end)
end)

describe("answer fields", function()
  local node = { node_state = "SUBMITTED", action_type = "cex_withdrawal_status", observe_count = 0 }

  it("maps each call's answer to node fields, with its default error code", function()
    local f = nodes.answer_fields(node, "observe", { observe_count = 1 },
      { status = "OBSERVING", retry_after_seconds = 5000, provider_refs = { a = 1 }, side_effect = true })
    assert.equal("OBSERVING", f.node_state)
    assert.equal(1, f.observe_count)
    assert.equal(intervals.MAX_BACKOFF_SECONDS, f.next_observe_in)
    assert.same({ a = 1 }, f.merge_provider_refs)
    assert.is_true(f.side_effect)
    assert.is_nil(f.finished_now)
    f = nodes.answer_fields(node, "observe", {}, { status = "FAILED" })
    assert.equal("OBSERVED_FAILURE", f.error_code)
    assert.is_true(f.finished_now)
    f = nodes.answer_fields(node, "submit", {}, { status = "UNKNOWN", error_code = "X" })
    assert.equal("X", f.error_code)
    f = nodes.answer_fields(node, "recover", {}, { status = "UNKNOWN" })
    assert.equal("STILL_UNKNOWN", f.error_code)
  end)

  it("recovery's SUBMITTED is observed again at the floor, the observer's at the action's default", function()
    assert.equal(intervals.delay("cex_withdrawal_status", 0),
      nodes.answer_fields(node, "recover", {}, { status = "SUBMITTED" }).next_observe_in)
    assert.equal(intervals.delay("cex_withdrawal_status"),
      nodes.answer_fields(node, "observe", {}, { status = "OBSERVING" }).next_observe_in)
  end)

  it("without an answer: submit and observe leave the node UNKNOWN, recovery where it is", function()
    local f = nodes.answer_fields(node, "observe", {}, nil, executors.error("EXECUTOR_ERROR", "raised"))
    assert.equal("UNKNOWN", f.node_state)
    assert.equal("EXECUTOR_ERROR", f.error_code)
    f = nodes.answer_fields({ node_state = "UNKNOWN" }, "recover", {}, nil,
      executors.error("EXECUTOR_BAD_RESPONSE", "garbage"))
    assert.equal("UNKNOWN", f.node_state)
    assert.equal("garbage", f.error_detail)
  end)

  it("refuses a call it does not know and a status the call may not answer", function()
    assert.has_error(function() nodes.answer_fields(node, "poll", {}, { status = "OBSERVING" }) end)
    assert.has_error(function() nodes.answer_fields(node, "recover", {}, { status = "OBSERVING" }) end)
    -- no answer needs the executor error saying why (not a bare code and detail)
    assert.has_error(function() nodes.answer_fields(node, "observe", {}, nil, "EXECUTOR_ERROR", "raised") end)
  end)
end)

describe("errors", function()
  it("qtg.error builds the host's error: kind and message win over fields, tostring reads kind: message", function()
    local e = qtg.error("not_found", "request x does not exist", { kind = "other", id = "x" })
    assert.equal("not_found", e.kind)
    assert.equal("x", e.id)
    assert.equal("not_found: request x does not exist", tostring(e))
    assert.equal("not_found: request x does not exist", errors.text(e))
    -- the same shape as the host's own errors
    local ok, host = pcall(qtg.crypto.unhex, "zz")
    assert.is_false(ok)
    assert.equal("invalid", host.kind)
    assert.equal(getmetatable(host), getmetatable(e))
    assert.equal("evm_rpc rpc (eth_call): reverted [code -32000]",
      tostring(qtg.error("rpc", "reverted", { where = "evm_rpc", method = "eth_call", code = -32000 })))
    assert.equal("signer: no key", tostring(qtg.error("signer", "no key", { code = "SIGNER_NOT_FOUND" })))
  end)

  it("errors.raise raises one; a bad kind or message is refused", function()
    local ok, e = pcall(errors.raise, "usage", "%d items", 3)
    assert.is_false(ok)
    assert.equal("usage", e.kind)
    assert.equal("3 items", e.message)
    assert.has_error(function() qtg.error(nil, "m") end)
    assert.has_error(function() qtg.error("k", "m", "not a table") end)
  end)

  it("errors.text renders any raised value in one way", function()
    assert.equal("plain", errors.text("plain"))
    assert.equal("nil", errors.text(nil))
    assert.equal("sql: bad (sqlstate 42P01)\nmore", errors.text({ kind = "sql", message = "bad", sqlstate = "42P01",
                                                                  detail = "more" }))
    assert.is_nil(errors.text({ 1, 2 }, true))
  end)
end)

-- The canonical text is what graph and plan hashes are taken over, so it
-- must not change: fixed texts, and every byte of a string against an
-- escape written here byte by byte.
describe("canonical JSON", function()
  local function by_hand(s)
    local out = {}
    for i = 1, #s do
      local b = s:byte(i)
      local c = s:sub(i, i)
      local named = ({ [34] = '\\"', [92] = "\\\\", [8] = "\\b", [12] = "\\f",
                       [10] = "\\n", [13] = "\\r", [9] = "\\t" })[b]
      if named then out[#out + 1] = named
      elseif b < 32 or b == 127 then out[#out + 1] = ("\\u%04x"):format(b)
      else out[#out + 1] = c end
    end
    return '"' .. table.concat(out) .. '"'
  end

  it("sorts keys, marks arrays and writes integers exactly", function()
    assert.equal('{"a":[1,2.5,"x"],"b":{"c":null,"d":true},"e":[],"f":{}}',
      canon.encode({ f = {}, e = canon.array(), b = { d = true, c = NULL }, a = { 1, 2.5, "x" } }))
    assert.equal("9007199254740991", canon.encode(2 ^ 53 - 1))
    assert.equal("0.10000000000000001", canon.encode(0.1))
    assert.equal("1.0000000000000001e+300", canon.encode(1e300))
    assert.equal("-42", canon.encode(-42))
  end)

  it("excerpt: a peer's text made storable, controls blanked, cut at a byte budget, repaired", function()
    local R = "\239\191\189" -- U+FFFD
    assert.equal("short", canon.excerpt("short", 10))
    assert.equal("a b c", canon.excerpt("a\0b\nc", 10))
    assert.equal("caf\195\169", canon.excerpt("caf\195\169", 5))           -- whole at the budget
    assert.equal("caf" .. R .. "...", canon.excerpt("caf\195\169!", 4))   -- split by the cut
    assert.equal("x" .. R .. R .. "...", canon.excerpt("x\226\128\162 y", 3))
    assert.equal("caf" .. R .. " " .. R, canon.excerpt("caf\233 \255", 100)) -- latin-1, 0xff
    assert.equal("nil", canon.excerpt(nil, 10))
    for _, s in ipairs({ "\255\254", string.rep("\226\128\162", 50), "\237\160\128", "\192\175" }) do
      for max = 1, 12 do assert.is_true(canon.text_ok(canon.excerpt(s, max))) end
    end
  end)

  it("escapes quotes, backslashes and control bytes, in values and keys", function()
    assert.equal('{"k\\"ey\\n":"a\\\\b\\u0000c\\u007f\\t"}', canon.encode({ ['k"ey\n'] = "a\\b\0c\127\t" }))
    for b = 0, 255 do
      local s = "x" .. string.char(b) .. "y"
      assert.equal(by_hand(s), canon.encode(s), "byte " .. b)
    end
    assert.equal('"plain-id_1.2:3 é"', canon.encode("plain-id_1.2:3 é"))
  end)

  it("gives the same text as the escape by hand for random strings, and cjson reads it back", function()
    local cjson = require "cjson"
    math.randomseed(20261203)
    for _ = 1, 500 do
      local t = {}
      for i = 1, math.random(0, 24) do
        t[i] = string.char(math.random() < 0.7 and math.random(32, 126) or math.random(0, 127))
      end
      local s = table.concat(t)
      local text = canon.encode({ [s] = s })
      assert.equal("{" .. by_hand(s) .. ":" .. by_hand(s) .. "}", text)
      assert.same({ [s] = s }, cjson.decode(text))
    end
  end)

  it("refuses what it cannot write canonically", function()
    for _, v in ipairs({ 0 / 0, math.huge, -math.huge, { [1] = 1, [3] = 3 }, { [true] = 1 }, print }) do
      assert.has_error(function() canon.encode(v) end)
    end
    local deep = {}
    for _ = 1, 70 do deep = { deep } end
    assert.has_error(function() canon.encode(deep) end, "canon_json: nesting deeper than 64")
  end)

  it("checks syntax strictly, at any depth, naming the byte at fault", function()
    local json = {
      "{}", "[]", ' {"a" : 1 } ', '{"a":[1,2,{"b":null}],"c":"x\\u00e9\\n\\/"}', "0", "-0.5e+10",
      "1E-3", '"\\ud83d\\ude00"', "true", "false", "null", '"\\u0000"', "\t[ 1 ,\r\n2 ]\n",
    }
    for _, t in ipairs(json) do assert.is_nil(canon.syntax_error(t), t) end
    local not_json = {
      { "0x10", "byte 2: text after the value" },
      { '{"a":0x10}', "byte 7: ',' or '}' expected" },
      { '"a\tb"', "byte 3: a raw control character in a string" },
      { '"a\0b"', "byte 3: a raw control character in a string" },
      { "[1,,2]", "byte 4: a value expected" },
      { "[1,]", "byte 4: a value expected" },
      { '{"a":1,}', "byte 8: a key expected" },
      { '{"a" 1}', "byte 6: ':' expected after a key" },
      { "{a:1}", "byte 2: a key expected" },
      { "01", "byte 1: a number with a leading zero" },
      { "-01", "byte 1: a number with a leading zero" },
      { "+1", "byte 1: a value expected" },
      { ".5", "byte 1: a value expected" },
      { "1.", "byte 2: a '.' without digits after it" },
      { "1e", "byte 2: an exponent without digits" },
      { "NaN", "byte 1: a value expected" },
      { "-Infinity", "byte 1: a value expected" },
      { '"\\x"', "byte 2: an escape JSON does not have" },
      { '"\\u12"', "byte 2: \\u without four hex digits" },
      { '"\\ud83d"', "byte 2: a high surrogate escape without its low one" },
      { '"\\ud83dx"', "byte 2: a high surrogate escape without its low one" },
      { '"\\ude00"', "byte 2: a low surrogate escape without its high one" },
      { '"\\ud83d\\u0041"', "byte 8: a high surrogate escape without its low one" },
      { "[1] 2", "byte 5: text after the value" },
      { "", "byte 1: a value expected, the text ended" },
      { "  ", "byte 3: a value expected, the text ended" },
      { "[", "byte 2: a value expected, the text ended" },
      { '{"a":1', "byte 7: ',' or '}' expected" },
      { '"abc', "byte 1: a string without its closing quote" },
      { "tru", "byte 1: a value expected" },
      { "truex", "byte 5: text after the value" },
      { "[1 2]", "byte 4: ',' or ']' expected" },
      { '{"a":1]', "byte 7: ',' or '}' expected" },
      { "[-]", "byte 2: a value expected" },
    }
    for _, c in ipairs(not_json) do assert.equal(c[2], canon.syntax_error(c[1]), c[1]) end
    -- deeper than any decoder's limit, one pass, no recursion
    local deep = string.rep("[", 200000) .. string.rep("]", 200000)
    assert.is_nil(canon.syntax_error(deep))
    assert.equal("byte 400001: text after the value", canon.syntax_error(deep .. "]"))
    assert.equal("byte 400000: ',' or ']' expected", canon.syntax_error(deep:sub(1, -2) .. "}"))
  end)
end)
