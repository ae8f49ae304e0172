-- The core workers in one process, tick by tick, on a real database: bad
-- input (unresolvable $ref, executors that raise or answer garbage, another
-- network class), recovery of UNKNOWN and SUBMITTING nodes, intervention
-- when a side effect completed, and the observe timeout flag off and on.
local qtg = require "qtg"
local requests = require "qtg.requests"
local recovery = require "qtg.workers.node_recovery"
local common = require "spec.lua.support.common"

local sup, s

local function one(key, sim, extra)
  local config = { sim = sim }
  for k, v in pairs(extra or {}) do config[k] = v end
  sup.load_doc(s, sup.doc(key, { { "a", "action", "withdrawal", config } }))
  return key
end

-- a (side effect or not, completes on submit) -> b (observe, configured)
local function two(key, a_side_effect, b_sim, b_config, b_timeout)
  local config = { sim = b_sim }
  for k, v in pairs(b_config or {}) do config[k] = v end
  sup.load_doc(s, sup.doc(key, {
    { "a", "action", "withdrawal", { sim = { observes = 0, side_effect = a_side_effect,
                                             refs = { receipt = { id = "R-1" } } } } },
    { "b", "observe", "cex_withdrawal_status", config, b_timeout },
  }, { { "a", "b" } }))
  return key
end

local function node_audit(request_id, node_key)
  local out = {}
  for _, r in ipairs(sup.audit(s, request_id)) do
    if r.entity_type == "movement_request_node" and r.detail.node_key == node_key then
      out[#out + 1] = r.action .. "@" .. r.actor:gsub("^system:", "")
    end
  end
  return out
end

local function ledger(node_id)
  return s:query("SELECT * FROM sim_ledger WHERE request_node_id = $1::uuid ORDER BY attempt_no", node_id)
end

-- The nodes of request req_id, locked as a worker's claim holds them, in a
-- transaction (pipeline: a pipeline transaction, which fn must end itself);
-- fn(counted, g, count) gets a session that counts its statements (in a
-- pipeline transaction: its round trips, query, batch, commit_batch and
-- commit, and commit_if_open when it has a transaction to commit).
local nodes_db = require "qtg.nodes"
local STATEMENTS = { query = true }
local ROUND_TRIPS = { query = true, batch = true, commit_batch = true, commit = true }

local function with_claim(req_id, pipeline, fn)
  if pipeline then s:begin_pipeline() else s:begin() end
  local counts = pipeline and ROUND_TRIPS or STATEMENTS
  local ok, err = pcall(function()
    local g = nodes_db.load_all(s, nodes_db.load_request(s, req_id, true))
    local n = 0
    local counted = setmetatable({}, { __index = function(_, k)
      local f = s[k]
      return function(_, ...)
        if counts[k] or (k == "commit_if_open" and pipeline and (s:pipeline() or s:in_transaction())) then
          n = n + 1
        end
        return f(s, ...)
      end
    end })
    fn(counted, g, function() return n end)
  end)
  if not ok then
    if s:pipeline() or s:in_transaction() then s:rollback() end
    error(err, 0)
  end
  if not pipeline then return s:commit() end
  assert.is_nil(s:pipeline())
  assert.is_false(s:in_transaction())
end

local function done_fields()
  return { node_state = "COMPLETED", finished_now = true, next_observe_in = qtg.db.NULL,
           append_artifacts = { { receipt = "R-9" } }, merge_provider_refs = { done = { id = "D-1" } } }
end

-- actions_of(actor) -> function(req_id): the actor's audit actions on the
-- request, "node.<state>:<key>" for a node's
local function actions_of(actor)
  return function(req_id)
    local out = {}
    for _, r in ipairs(sup.audit(s, req_id)) do
      if r.actor == actor then out[#out + 1] = r.action .. (r.detail.node_key and (":" .. r.detail.node_key) or "") end
    end
    return out
  end
end

-- a and x are observed (a -> b; x alone), both SUBMITTED; b completes on submit
local function started(key)
  sup.load_doc(s, sup.doc(key, {
    { "a", "observe", "cex_withdrawal_status", { sim = { observes = 5 } } },
    { "b", "action", "withdrawal", { sim = { observes = 0 } } },
    { "x", "observe", "cex_withdrawal_status", { sim = { observes = 5 } } },
  }, { { "a", "b" } }))
  local req = sup.create_approved(s, key)
  assert.equal(1, sup.tick("node_dispatcher"))
  assert.equal(1, sup.tick("node_dispatcher"))
  local n = sup.nodes(s, req.id)
  assert.equal("SUBMITTED", n.a.node_state)
  assert.equal("SUBMITTED", n.x.node_state)
  return req
end

describe("engine pipeline", function()
  setup(function()
    sup = require("spec.lua.support.engine")
    s = qtg.db.acquire()
  end)
  teardown(function() s:release() end)
  before_each(function() sup.park_others(s) end)

  describe("bad input", function()
    -- A dispatch whose transaction was lost after the provider acted (a
    -- crash before the commit) leaves the node READY at its attempt; here
    -- the provider's side of it is the sim's submit under the attempt's
    -- key.  The replay ends before its submit (the executor no longer
    -- allowed on the class, as after a settings change): FAILED, nothing
    -- sent by it.  The operator's retry must carry the key the lost call
    -- carried, so the provider deduplicates it, and not pay a second time.
    -- a: a completed node whose submits all carried key; its provider took
    -- the key twice and acted once, and no key is left to carry
    local function acted_once(a, key)
      assert.equal(qtg.db.NULL, a.carried_idempotency_key)
      local rows = ledger(a.id)
      assert.equal(1, #rows, "the provider acted twice")
      assert.same({ key, 2 }, { rows[1].idempotency_key, rows[1].submit_count })
    end

    it("a retry after a replay that ended before its submit carries the lost attempt's key", function()
      local t = one("spec_pl_carried_key", { observes = 0, side_effect = true })
      local req = sup.create_approved(s, t)
      local a = sup.nodes(s, req.id).a
      local context = require "qtg.context"
      local lost_key = context.idempotency_key(a.id, 1)
      assert.equal(lost_key, context.key_of(a, 1))
      local sim = require "qtg.executors.sim"
      assert.equal("COMPLETED", sim.submit({ node_config = { sim = { observes = 0, side_effect = true } },
        request_node_id = a.id, attempt_no = 1, action_type = "withdrawal" }, { idempotency_key = lost_key }).status)
      local cond = require "spec.lua.support.conditional"
      assert.equal(1, cond.with_settings({ sim_network_classes = "none-such" }, sup.tick, "node_dispatcher"))
      a = sup.nodes(s, req.id).a
      assert.same({ "FAILED", 1, "EXECUTOR_NOT_ALLOWED", lost_key },
        { a.node_state, a.attempt_no, a.error_code, a.carried_idempotency_key })
      -- the column holds a key or nothing
      assert.has_error(function()
        s:query("UPDATE movement_request_nodes SET carried_idempotency_key = '' WHERE id = $1::uuid", a.id)
      end)
      -- a second replay that ends before its submit carries the same key on
      requests.retry(s, a.id, sup.ACTOR)
      assert.equal(1, cond.with_settings({ sim_network_classes = "none-such" }, sup.tick, "node_dispatcher"))
      a = sup.nodes(s, req.id).a
      assert.same({ "FAILED", 2, lost_key }, { a.node_state, a.attempt_no, a.carried_idempotency_key })
      requests.retry(s, a.id, sup.ACTOR)
      assert.is_true(sup.drive(s, sup.state_is(req.id, "COMPLETED"), 10))
      a = sup.nodes(s, req.id).a
      assert.same({ "COMPLETED", 3, lost_key }, { a.node_state, a.attempt_no, a.idempotency_key })
      acted_once(a, lost_key)
      -- a retry after an attempt that reached the provider takes a new key
      assert.equal(context.idempotency_key(a.id, 4), context.key_of(a, 4))
    end)

    -- The attack: the provider took the submit, a later observe could not
    -- say what became of it, and anyone holding `operate` (the request's
    -- own maker, a client's token of scope own) retried the node: the next
    -- attempt went out under a new key and the provider acted twice.
    it("a retry of an UNKNOWN node carries its last submit's key: the provider acts once", function()
      local t = one("spec_pl_unknown_retry", { observes = 3, unknown_at_observe = 1, side_effect = true,
                                               retry_after_seconds = 0 })
      local req = sup.create_approved(s, t)
      assert.equal(1, sup.tick("node_dispatcher"))
      local a = sup.nodes(s, req.id).a
      local key = require("qtg.context").idempotency_key(a.id, 1)
      assert.same({ "SUBMITTED", key }, { a.node_state, a.idempotency_key })
      assert.is_true(sup.drive(s, function() return sup.nodes(s, req.id).a.node_state == "UNKNOWN" end, 10,
        { "node_observer" }))
      local maker = { actor = sup.INITIATOR, kind = "operator", name = "spec-initiator", roles = { "read", "operate" } }
      assert.equal(sup.INITIATOR, sup.request(s, req.id).created_by)
      requests.retry(s, a.id, maker)
      a = sup.nodes(s, req.id).a
      assert.same({ "READY", key }, { a.node_state, a.carried_idempotency_key })
      assert.is_true(sup.drive(s, sup.state_is(req.id, "COMPLETED"), 20))
      a = sup.nodes(s, req.id).a
      assert.same({ "COMPLETED", 2, key }, { a.node_state, a.attempt_no, a.idempotency_key })
      acted_once(a, key)
      local retried = {}
      for _, r in ipairs(sup.audit(s, req.id)) do
        if r.action == "node.retry" then retried[#retried + 1] = r end
      end
      assert.equal(1, #retried)
      assert.same({ sup.INITIATOR, "UNKNOWN", key },
        { retried[1].actor, retried[1].detail.node_state, retried[1].detail.carried_idempotency_key })
    end)

    it("an unresolvable $ref fails the node with CONFIG_REF_UNRESOLVED", function()
      local t = two("spec_pl_badref", false, { observes = 0 }, { id = "$ref:a.receipt.missing" })
      local req = sup.create_approved(s, t)
      assert.is_true(sup.drive(s, sup.state_is(req.id, "FAILED"), 10))
      local b = sup.nodes(s, req.id).b
      assert.equal("FAILED", b.node_state)
      assert.equal("CONFIG_REF_UNRESOLVED", b.error_code)
      assert.matches("$ref:a.receipt.missing", b.error_detail, 1, true)
      assert.equal(0, #ledger(b.id)) -- never reached the provider
      assert.equal("CONFIG_REF_UNRESOLVED", sup.request(s, req.id).last_error_code)
    end)

    -- A provider's error text is outside text: cut at a byte count, or no
    -- UTF-8 at all, it failed the node's write, the attempt rolled back and
    -- the node, first in FIFO order, was claimed (and submitted) again on
    -- every pass while no later request of the class went out.
    it("keeps a provider's error text that is no UTF-8 repaired, and the next request goes out", function()
      local executors = require "qtg.executors"
      local sim = require "qtg.executors.sim"
      local submits = 0
      package.loaded["spec.bad_text_sim"] = setmetatable({
        submit = function()
          submits = submits + 1
          return { status = "FAILED", error_code = "PROVIDER_\252", error_detail = "502 from the provider: \252\253 caf\195" }
        end }, { __index = sim })
      executors.ADAPTERS.spec_bad_text = "spec.bad_text_sim"
      local ok, err = pcall(function()
        local bad = sup.doc("spec_pl_bad_text", { { "a", "action", "withdrawal", { sim = { observes = 0 } } } })
        bad.nodes[1].executor = "spec_bad_text"
        sup.load_doc(s, bad)
        local first = sup.create_approved(s, "spec_pl_bad_text")
        local next_one = sup.create_approved(s, two("spec_pl_after_bad", false, { observes = 0 }))
        assert.equal(1, sup.tick("node_dispatcher"))
        local a = sup.nodes(s, first.id).a
        assert.equal("FAILED", a.node_state)
        assert.equal("PROVIDER_\239\191\189", a.error_code)
        assert.equal("502 from the provider: \239\191\189\239\191\189 caf\239\191\189", a.error_detail)
        assert.equal(1, sup.tick("node_dispatcher"))
        assert.equal(1, submits)
        assert.are_not.equal("READY", sup.nodes(s, next_one.id).a.node_state)
        -- provider_refs PostgreSQL cannot store are a bad response, not a failed write
        local ok_refs, why = executors.check("submit", { status = "SUBMITTED", provider_refs = { id = "x\255" } })
        assert.is_nil(ok_refs)
        assert.matches("bad provider_refs", why, 1, true)
        assert.is_nil((executors.check("observe", { status = "COMPLETED", artifacts = { { ["k\0"] = 1 } } })))
      end)
      executors.ADAPTERS.spec_bad_text = nil
      package.loaded["spec.bad_text_sim"] = nil
      assert(ok, err)
    end)

    it("a resolvable nested $ref reaches the executor resolved", function()
      local t = two("spec_pl_goodref", false, { observes = 0 }, { id = "$ref:a.receipt.id" })
      local req = sup.create_approved(s, t)
      assert.is_true(sup.drive(s, sup.state_is(req.id, "COMPLETED"), 10))
      assert.equal("R-1", sup.nodes(s, req.id).b.resolved_config.id)
    end)

    local cases = {
      { "raise", "preflight", "FAILED", "EXECUTOR_ERROR", 0 },
      { "raise", "prepare", "FAILED", "EXECUTOR_ERROR", 0 },
      { "garbage", "preflight", "FAILED", "EXECUTOR_BAD_RESPONSE", 0 },
      { "garbage", "prepare", "FAILED", "EXECUTOR_BAD_RESPONSE", 0 },
      { "raise", "submit", "UNKNOWN", "EXECUTOR_ERROR", 0 },
      { "garbage", "submit", "UNKNOWN", "EXECUTOR_BAD_RESPONSE", 1 },
      { "raise", "observe", "UNKNOWN", "EXECUTOR_ERROR", 1 },
      { "garbage", "observe", "UNKNOWN", "EXECUTOR_BAD_RESPONSE", 1 },
    }
    for _, c in ipairs(cases) do
      it(string.format("an executor that %ss in %s leaves the node %s with %s", c[1], c[2], c[3], c[4]),
        function()
          local t = one("spec_pl_" .. c[1] .. "_" .. c[2],
            { [c[1]] = c[2], observes = 1, retry_after_seconds = 0 })
          local req = sup.create_approved(s, t)
          sup.drive(s, function(x) return sup.nodes(x, req.id).a.node_state == c[3] end, 10,
            { "node_dispatcher", "node_observer" })
          local a = sup.nodes(s, req.id).a
          assert.equal(c[3], a.node_state)
          assert.equal(c[4], a.error_code)
          assert.is_string(a.error_detail)
          local sent = c[2] == "observe" and 1 or 0
          assert.equal(sent, #ledger(a.id))
          -- the workers keep going: nothing left to do, no error raised
          assert.equal(0, sup.tick("node_dispatcher"))
        end)
    end

    it("a preflight refusal is FAILED PREFLIGHT_REJECTED", function()
      local req = sup.create_approved(s, one("spec_pl_refuse", { fail = "preflight" }))
      sup.tick("node_dispatcher")
      local a = sup.nodes(s, req.id).a
      assert.equal("FAILED", a.node_state)
      assert.equal("PREFLIGHT_REJECTED", a.error_code)
      assert.equal("FAILED", sup.request(s, req.id).request_state)
      -- the request's rows of its first dispatch come before the node's
      local seq = {}
      for _, r in ipairs(sup.audit(s, req.id)) do
        if r.actor == "system:node_dispatcher" then seq[#seq + 1] = r.action end
      end
      assert.same({ "request.executing", "node.failed", "request.failed" }, seq)
      local events = {}
      for _, c in ipairs(sup.callbacks(s, req.id)) do events[#events + 1] = c.event_type end
      assert.same({ "request_created", "request_approved", "request_executing", "request_failed" }, events)
    end)

    -- The pipeline's savepoint is taken before its first statement on the
    -- claim's session (a plan not yet read by this process): a statement
    -- that fails there is rolled back to it, and the claim records the
    -- failure instead of looping on the node.  The failure here is one no
    -- retry cures: the plan's table lacks a column it reads.
    it("a pipeline statement that fails on the claim's session fails the node with ENGINE_ERROR", function()
      local key = ("spec_pl_engine_" .. sup.uid("e")):gsub("-", "_")
      local req = sup.create_approved(s, one(key, { observes = 0 }))
      local dispatcher = require "qtg.workers.node_dispatcher"
      local d = qtg.db.acquire()
      s:query("ALTER TABLE plan_nodes RENAME COLUMN timeout_policy TO spec_timeout_policy")
      local ok, n = pcall(dispatcher.tick, d)
      s:query("ALTER TABLE plan_nodes RENAME COLUMN spec_timeout_policy TO timeout_policy")
      if d:in_transaction() then d:rollback() end
      d:release()
      assert.is_true(ok, tostring(n))
      assert.equal(1, n)
      local a = sup.nodes(s, req.id).a
      assert.equal("FAILED", a.node_state)
      assert.equal("ENGINE_ERROR", a.error_code)
      assert.matches("timeout_policy", a.error_detail, 1, true)
      assert.equal(1, a.attempt_no)
      assert.equal(0, #ledger(a.id)) -- never reached the provider
      assert.equal("FAILED", sup.request(s, req.id).request_state)
      -- the next request of the template reads the plan and completes
      local again = sup.create_approved(s, key)
      assert.is_true(sup.drive(s, sup.state_is(again.id, "COMPLETED"), 10))
    end)

    -- A lock the pipeline waits on past the session's lock_timeout (a
    -- migration's lock on the plan tables, say) is the database's moment:
    -- nothing was sent, so the node stays READY and goes out at a later
    -- pass.  Before, such a timeout failed the node and its request.
    it("a lock timeout before submit leaves the node READY, and a later pass dispatches it", function()
      local key = ("spec_pl_locked_" .. sup.uid("e")):gsub("-", "_")
      local req = sup.create_approved(s, one(key, { observes = 0 }))
      local dispatcher = require "qtg.workers.node_dispatcher"
      local locker, d = qtg.db.acquire(), qtg.db.acquire()
      locker:begin()
      locker:query("LOCK TABLE movement_templates IN ACCESS EXCLUSIVE MODE")
      d:query("SET lock_timeout = '300ms'")
      local ok, err = pcall(dispatcher.tick, d)
      if d:in_transaction() then d:rollback() end
      d:query("RESET lock_timeout")
      d:release()
      locker:rollback()
      locker:release()
      -- the pass holds the node back (for dispatcher.HOLD_MIN) and goes on,
      -- rather than raising out of the tick with every node behind it waiting
      assert.is_true(ok, tostring(err))
      assert.equal(0, err)
      local a = sup.nodes(s, req.id).a
      assert.equal("READY", a.node_state)
      assert.equal(0, a.attempt_no)
      assert.equal(0, #ledger(a.id))
      assert.equal("APPROVED", sup.request(s, req.id).request_state)
      assert.is_number(dispatcher.held_nodes[a.id])
      assert.is_true(sup.drive(s, sup.state_is(req.id, "COMPLETED"), 10))
      assert.equal(1, sup.nodes(s, req.id).a.attempt_no)
    end)

    it("a signer that cannot be asked leaves the node READY; one that refuses fails it with SIGNING_REFUSED", function()
      local req = sup.create_approved(s, one("spec_pl_nosigner", { signer_key = "no_such_signer" }))
      local metrics = require "qtg.metrics"
      local function decisions(outcome, code)
        return metrics.value("qtg_signer_decisions_total", { outcome = outcome, code = code or "" }) or 0
      end
      local unavailable, refused = decisions("unavailable"), decisions("refused", "SIGNER_NOT_FOUND")
      -- no signer listens: the tick raises, its transaction is rolled back
      local ok, err = pcall(sup.tick, "node_dispatcher")
      assert.equal(unavailable + 1, decisions("unavailable"))
      local a = sup.nodes(s, req.id).a
      assert.equal("READY", a.node_state, tostring(err))
      assert.equal(0, a.attempt_no)
      assert.falsy(ok and a.node_state ~= "READY")
      -- a signer (`qtgd signer` on this process's socket) refuses a key it
      -- does not hold, and a sim payload is no EIP-1559 transfer anyway
      local evm = require "spec.lua.support.evm"
      local dir = evm.host.tmpdir()
      local keys = "ops=" .. evm.key_file(dir, "ops", evm.DEV[1].key)
      local signer = evm.start_signer(evm.run_env("unused", { MG_SIGNER_KEYS = keys,
        MG_SIGNER_SOCKET = qtg.signer.socket_path() }))
      finally(function()
        evm.host.stop(signer, 30)
        os.execute("rm -rf " .. common.quote(dir))
      end)
      -- the executor is held back for a while (below): then asked again
      sup.drive(s, function(x) return sup.nodes(x, req.id).a.node_state ~= "READY" end, 10, { "node_dispatcher" })
      a = sup.nodes(s, req.id).a
      assert.equal("FAILED", a.node_state)
      assert.equal("SIGNING_REFUSED", a.error_code)
      assert.truthy(a.error_detail:match("^SIGNER_NOT_FOUND: "), a.error_detail)
      assert.equal(0, #ledger(a.id))
      -- each answer is counted for /metrics, the refusal under its code
      assert.equal(refused + 1, decisions("refused", "SIGNER_NOT_FOUND"))
      local text = table.concat(metrics.render({}), "\n")
      assert.truthy(text:find('qtg_signer_decisions_total{outcome="refused",code="SIGNER_NOT_FOUND"} '
        .. (refused + 1), 1, true), text)
    end)

    -- A review (session 38): a signer down raised out of every tick at the
    -- FIFO head's node, which the next tick claimed again, and no node of
    -- the class behind it was dispatched, whatever its executor.
    it("a signer that cannot be asked holds back its executor, and the other executors' nodes go on", function()
      local dispatcher = require "qtg.workers.node_dispatcher"
      local executors = require "qtg.executors"
      executors.ADAPTERS.spec_signing = "qtg.executors.sim"
      local ok, err = pcall(function()
        local key = "spec_pl_signing_head"
        sup.load_doc(s, (function()
          local doc = sup.doc(key, { { "a", "action", "withdrawal", { sim = { signer_key = "no_such_signer" } } } })
          doc.nodes[1].executor = "spec_signing"
          return doc
        end)())
        local head = sup.create_approved(s, key)
        local behind = {}
        for i = 1, 3 do behind[i] = sup.create_approved(s, one("spec_pl_behind_signing", { observes = 0 })) end
        local n = sup.tick("node_dispatcher", 8)
        assert.equal(3, n) -- the three behind it, in one tick
        for i = 1, 3 do assert.are_not.equal("READY", sup.nodes(s, behind[i].id).a.node_state) end
        local a = sup.nodes(s, head.id).a
        assert.equal("READY", a.node_state)
        assert.equal(0, a.attempt_no)
        assert.is_true(dispatcher.paced_until.spec_signing > qtg.monotonic())
        assert.equal(dispatcher.HOLD_MIN, dispatcher.signer_backoff.spec_signing)
        -- held back: the next tick does not ask for it
        assert.equal(0, sup.tick("node_dispatcher", 8))
        -- after the hold it is asked again; still down, the hold doubles
        qtg.sleep(dispatcher.HOLD_MIN + 0.1)
        assert.equal(0, sup.tick("node_dispatcher", 8))
        assert.equal(2 * dispatcher.HOLD_MIN, dispatcher.signer_backoff.spec_signing)
        assert.equal("READY", sup.nodes(s, head.id).a.node_state)
        assert.equal(0, #ledger(a.id))
      end)
      executors.ADAPTERS.spec_signing = nil
      dispatcher.paced_until.spec_signing, dispatcher.signer_backoff.spec_signing = nil, nil
      assert(ok, err)
    end)

    it("leaves a request of another network class alone", function()
      local t = one("spec_pl_other_class", { observes = 0 })
      local other = sup.create_approved(s, t, { network_class = "spec-elsewhere" })
      local mine = sup.create_approved(s, t)
      assert.is_true(sup.drive(s, sup.state_is(mine.id, "COMPLETED"), 10))
      for _ = 1, 3 do
        for _, w in ipairs({ "node_dispatcher", "node_observer", "node_recovery" }) do sup.tick(w) end
      end
      assert.equal("APPROVED", sup.request(s, other.id).request_state)
      assert.equal("READY", sup.nodes(s, other.id).a.node_state)
      -- nor its UNKNOWN nodes
      s:query([[UPDATE movement_requests SET request_state = 'EXECUTING' WHERE id = $1::uuid]], other.id)
      s:query([[UPDATE movement_request_nodes SET node_state = 'UNKNOWN' WHERE request_id = $1::uuid]], other.id)
      assert.equal(0, sup.tick("node_recovery"))
      assert.equal("UNKNOWN", sup.nodes(s, other.id).a.node_state)
      -- nor its SUBMITTED nodes, however due
      s:query([[UPDATE movement_request_nodes SET node_state = 'SUBMITTED', next_observe_at = now() - interval '1 hour'
                 WHERE request_id = $1::uuid]], other.id)
      assert.equal(0, sup.tick("node_observer"))
      local a = sup.nodes(s, other.id).a
      assert.equal("SUBMITTED", a.node_state)
      assert.equal(0, a.observe_count)
      sup.unfrozen(s, "UPDATE movement_requests SET network_class = 'parked-spec' WHERE id = $1::uuid", other.id)
    end)
  end)

  -- A request with a FAILED node stays EXECUTING while another of its
  -- nodes is in flight: the observer settles that node, which it does for
  -- EXECUTING requests only, and the dispatcher starts no more of its
  -- nodes.  Derived FAILED at once, the request left money in flight
  -- unobserved and reported that it had failed.
  describe("a failure beside a node in flight", function()
    -- a: submitted, completes at its first observation; b: refused at
    -- preflight; c: would complete on submit.  Three roots, in key order.
    local function three(key, a_side_effect)
      sup.load_doc(s, sup.doc(key, {
        { "a", "action", "withdrawal", { sim = { observes = 1, side_effect = a_side_effect,
                                                 retry_after_seconds = 0 } } },
        { "b", "action", "withdrawal", { sim = { fail = "preflight" } } },
        { "c", "action", "withdrawal", { sim = { observes = 0, side_effect = true } } },
      }))
      return key
    end

    local function failed_beside_a(key, a_side_effect)
      local req = sup.create_approved(s, three(key, a_side_effect))
      assert.equal(1, sup.tick("node_dispatcher"))
      assert.equal(1, sup.tick("node_dispatcher"))
      local n = sup.nodes(s, req.id)
      assert.same({ "SUBMITTED", "FAILED", "READY" }, { n.a.node_state, n.b.node_state, n.c.node_state })
      assert.equal("PREFLIGHT_REJECTED", n.b.error_code)
      assert.equal("EXECUTING", sup.request(s, req.id).request_state)
      -- c is passed over, however often the dispatcher looks
      for _ = 1, 3 do assert.equal(0, sup.tick("node_dispatcher")) end
      assert.equal("READY", sup.nodes(s, req.id).c.node_state)
      assert.equal(0, #ledger(n.c.id))
      return req, n
    end

    it("observes the node in flight to the end; its side effect makes it MANUAL_INTERVENTION", function()
      local req = failed_beside_a("spec_pl_fail_beside_paid", true)
      assert.is_true(sup.drive(s, sup.state_is(req.id, "MANUAL_INTERVENTION"), 10,
        { "node_dispatcher", "node_observer" }))
      local n = sup.nodes(s, req.id)
      assert.same({ "COMPLETED", "FAILED", "READY" }, { n.a.node_state, n.b.node_state, n.c.node_state })
      assert.is_true(n.a.side_effect)
      assert.equal(0, #ledger(n.c.id))
      local cbs = sup.callbacks(s, req.id)
      assert.equal("request_attention", cbs[#cbs].body.event_type)
      assert.equal("manual_intervention", cbs[#cbs].body.data.reason)
      assert.same({ { node_key = "b", node_state = "FAILED", error_code = "PREFLIGHT_REJECTED" } },
        cbs[#cbs].body.data.nodes)
    end)

    it("without a side effect the request is FAILED once the node in flight settles", function()
      local req = failed_beside_a("spec_pl_fail_beside_free", false)
      assert.is_true(sup.drive(s, sup.state_is(req.id, "FAILED"), 10, { "node_dispatcher", "node_observer" }))
      local n = sup.nodes(s, req.id)
      assert.same({ "COMPLETED", "FAILED", "READY" }, { n.a.node_state, n.b.node_state, n.c.node_state })
      assert.equal("PREFLIGHT_REJECTED", sup.request(s, req.id).last_error_code)
      assert.equal(0, #ledger(n.c.id))
    end)

    it("a retry of the FAILED node makes the request's nodes dispatchable again", function()
      local req, n = failed_beside_a("spec_pl_fail_beside_retry", true)
      requests.retry(s, n.b.id, sup.ACTOR)
      assert.equal(1, sup.tick("node_dispatcher")) -- b again (its preflight refuses again)
      local after = sup.nodes(s, req.id)
      assert.same({ "FAILED", 2 }, { after.b.node_state, after.b.attempt_no })
      assert.equal(0, sup.tick("node_dispatcher")) -- and c is passed over again
      assert.equal("EXECUTING", sup.request(s, req.id).request_state)
    end)

    -- Refs are merged into a node's: what a failed attempt reported (here
    -- an address besides its key) stayed beside the next attempt's, for an
    -- observe to look the failed attempt up by or a successor's $ref to take.
    it("a retry of a FAILED node starts its next attempt with no provider_refs; the audit row keeps them", function()
      sup.load_doc(s, sup.doc("spec_pl_retry_refs", {
        { "a", "action", "withdrawal", { sim = { fail = "observe", retry_after_seconds = 0 } } },
      }))
      local req = sup.create_approved(s, "spec_pl_retry_refs")
      assert.is_true(sup.drive(s, sup.state_is(req.id, "FAILED"), 10, { "node_dispatcher", "node_observer" }))
      local a = sup.nodes(s, req.id).a
      local first_key = a.idempotency_key
      assert.same({ sim_key = first_key }, a.provider_refs)
      -- as a provider would report it with the failed attempt
      s:query([[UPDATE movement_request_nodes SET provider_refs = provider_refs || '{"deposit_address": "0xold"}'
                 WHERE id = $1::uuid]], a.id)
      requests.retry(s, a.id, sup.ACTOR)
      a = sup.nodes(s, req.id).a
      assert.same({}, a.provider_refs)
      local audit = s:query([[SELECT detail FROM audit_outbox WHERE entity_id = $1 AND action = 'node.retry']], a.id)
      assert.equal(1, #audit)
      assert.same({ sim_key = first_key, deposit_address = "0xold" }, audit[1].detail.provider_refs)
      assert.equal(1, sup.tick("node_dispatcher"))
      a = sup.nodes(s, req.id).a
      assert.equal(2, a.attempt_no)
      assert.are_not.equal(first_key, a.idempotency_key)
      assert.same({ sim_key = a.idempotency_key }, a.provider_refs)
    end)

    -- Bound for MANUAL_INTERVENTION (an UNKNOWN node beside a payment that
    -- went through) while a node is in flight: held, and nothing more starts.
    it("starts nothing beside an UNKNOWN node once a payment went through, and ends MANUAL_INTERVENTION", function()
      sup.load_doc(s, sup.doc("spec_pl_unknown_beside_paid", {
        { "a", "action", "withdrawal", { sim = { observes = 0, side_effect = true } } },
        { "b", "action", "withdrawal", { sim = { observes = 1, retry_after_seconds = 0 } } },
        { "c", "action", "withdrawal", { sim = { unknown = "submit" } } },
        { "d", "action", "withdrawal", { sim = { observes = 0, side_effect = true } } },
      }))
      local req = sup.create_approved(s, "spec_pl_unknown_beside_paid")
      for _ = 1, 3 do assert.equal(1, sup.tick("node_dispatcher")) end
      for _ = 1, 3 do assert.equal(0, sup.tick("node_dispatcher")) end
      local n = sup.nodes(s, req.id)
      assert.same({ "COMPLETED", "SUBMITTED", "UNKNOWN", "READY" },
        { n.a.node_state, n.b.node_state, n.c.node_state, n.d.node_state })
      assert.equal("EXECUTING", sup.request(s, req.id).request_state)
      assert.is_true(sup.drive(s, sup.state_is(req.id, "MANUAL_INTERVENTION"), 10,
        { "node_dispatcher", "node_observer" }))
      n = sup.nodes(s, req.id)
      assert.same({ "COMPLETED", "UNKNOWN", "READY" }, { n.b.node_state, n.c.node_state, n.d.node_state })
      assert.equal(0, #ledger(n.d.id))
    end)

    -- A retry while another node is FAILED leaves the request where its
    -- nodes say: EXECUTING, it would sit with nothing to move it.
    it("a retry beside another FAILED node leaves the request FAILED until that one is retried too", function()
      sup.load_doc(s, sup.doc("spec_pl_two_failed", {
        { "a", "action", "withdrawal", { sim = { observes = 1, fail = "observe", retry_after_seconds = 0 } } },
        { "b", "action", "withdrawal", { sim = { fail = "preflight" } } },
      }))
      local req = sup.create_approved(s, "spec_pl_two_failed")
      assert.equal(1, sup.tick("node_dispatcher"))
      assert.equal(1, sup.tick("node_dispatcher"))
      assert.equal("EXECUTING", sup.request(s, req.id).request_state) -- held: a is in flight
      assert.is_true(sup.drive(s, sup.state_is(req.id, "FAILED"), 10, { "node_observer" }))
      local n = sup.nodes(s, req.id)
      assert.same({ "FAILED", "FAILED" }, { n.a.node_state, n.b.node_state })
      requests.retry(s, n.a.id, sup.ACTOR)
      assert.equal("FAILED", sup.request(s, req.id).request_state)
      assert.equal("READY", sup.nodes(s, req.id).a.node_state)
      local cbs = sup.callbacks(s, req.id)
      assert.equal("request_failed", cbs[#cbs].body.event_type)
      requests.retry(s, n.b.id, sup.ACTOR)
      assert.equal("EXECUTING", sup.request(s, req.id).request_state)
      assert.equal(1, sup.tick("node_dispatcher"))
    end)

    it("refuses to complete a manual step while the request is stopping", function()
      sup.load_doc(s, sup.doc("spec_pl_fail_beside_manual", {
        { "a", "action", "withdrawal", { sim = { observes = 1, side_effect = true, retry_after_seconds = 0 } } },
        { "b", "action", "withdrawal", { sim = { fail = "preflight" } } },
        { "m", "manual", "manual_confirmation", { required_inputs = { "desk_reference" }, side_effect = true } },
      }))
      local req = sup.create_approved(s, "spec_pl_fail_beside_manual")
      assert.equal(1, sup.tick("node_dispatcher"))
      assert.equal(1, sup.tick("node_dispatcher"))
      local n = sup.nodes(s, req.id)
      assert.same({ "SUBMITTED", "FAILED", "READY" }, { n.a.node_state, n.b.node_state, n.m.node_state })
      local ok, err = pcall(requests.complete_manual_step, s, n.m.id, sup.ACTOR, { desk_reference = "DESK-9" })
      assert.is_false(ok)
      assert.equal("illegal_transition", err.kind)
      assert.matches("node b is FAILED", err.message, 1, true)
      assert.equal("READY", sup.nodes(s, req.id).m.node_state)
      -- the node in flight settles: FAILED beside a payment
      assert.is_true(sup.drive(s, sup.state_is(req.id, "MANUAL_INTERVENTION"), 10,
        { "node_dispatcher", "node_observer" }))
    end)

    -- The claim's snapshot can predate the failure's commit (the request's
    -- lock is free again by the time the claim takes it): the nodes read
    -- after the lock show it, and nothing is started.
    it("a claim whose snapshot missed the failure starts nothing", function()
      local d = require "qtg.workers.node_dispatcher"
      local req, n = failed_beside_a("spec_pl_fail_beside_race", true)
      local s2 = qtg.db.acquire()
      s2:begin()
      local row = qtg.db.claim.one(s2, {
        candidates_sql = [[SELECT id FROM movement_request_nodes
                            WHERE id = ']] .. n.c.id .. [['::uuid AND NOT (id::text = ANY ($1::text[]))
                              AND $2::text IS NOT NULL AND $3::jsonb IS NOT NULL]],
        claim_sql = d.CLAIM_SQL, args = { qtg.settings.network_class, "[]" } })
      assert.equal(n.c.id, row.node_id)
      assert.is_nil(d.dispatch(s2, row))
      s2:commit()
      s2:release()
      local c = sup.nodes(s, req.id).c
      assert.same({ "READY", 0 }, { c.node_state, c.attempt_no })
      assert.equal(0, #ledger(c.id))
      assert.equal("EXECUTING", sup.request(s, req.id).request_state)
    end)
  end)

  describe("advance", function()
    it("a completion readies its successors with its frontier write: READY, an audit row each, one callback", function()
      -- a -> b, a -> c, b -> d, c -> d; a completes on submit
      sup.load_doc(s, sup.doc("spec_pl_fanout", {
        { "a", "action", "withdrawal", { sim = { observes = 0 } } },
        { "b", "action", "withdrawal", { sim = { observes = 0 } } },
        { "c", "action", "withdrawal", { sim = { observes = 0 } } },
        { "d", "action", "withdrawal", { sim = { observes = 0 } } },
      }, { { "a", "b" }, { "a", "c" }, { "b", "d" }, { "c", "d" } }))
      local req = sup.create_approved(s, "spec_pl_fanout")
      assert.equal(1, sup.tick("node_dispatcher"))
      local n = sup.nodes(s, req.id)
      assert.equal("COMPLETED", n.a.node_state)
      assert.equal("READY", n.b.node_state)
      assert.equal("READY", n.c.node_state)
      assert.equal("BLOCKED", n.d.node_state)
      for _, key in ipairs({ "b", "c" }) do
        assert.same({ "node.ready@node_dispatcher" }, node_audit(req.id, key))
      end
      local readied = {}
      for _, r in ipairs(sup.audit(s, req.id)) do
        if r.action == "node.ready" and r.detail.node_key ~= "a" then
          readied[#readied + 1] = r.detail.node_key
          assert.equal("BLOCKED", r.detail.from_state)
          assert.equal(0, r.detail.attempt_no)
          assert.equal("movement_request_node", r.entity_type)
          assert.equal(n[r.detail.node_key].id, r.entity_id)
        end
      end
      assert.same({ "b", "c" }, readied)
      local cbs = sup.callbacks(s, req.id)
      local last = cbs[#cbs].body
      assert.equal("frontier_advanced", last.event_type)
      assert.same({ "b", "c" }, last.current_frontier)
      assert.same({ "b", "c" }, last.data.ready)
      assert.same({}, last.data.waiting)
      assert.equal("EXECUTING", last.request_state)
      -- b completes: d waits for c; then c completes and d is readied
      assert.equal(1, sup.tick("node_dispatcher"))
      assert.equal("BLOCKED", sup.nodes(s, req.id).d.node_state)
      cbs = sup.callbacks(s, req.id)
      assert.same({ "d" }, cbs[#cbs].body.data.waiting)
      assert.is_true(sup.drive(s, sup.state_is(req.id, "COMPLETED"), 10))
      -- d was readied by c's completion (on submit, in the dispatcher)
      assert.same({ "node.ready@node_dispatcher", "node.completed@node_dispatcher" },
        node_audit(req.id, "d"))
    end)
  end)

  describe("node changes in the request's statement", function()
    local ACTOR = "system:spec_completion"
    local actions = actions_of(ACTOR)

    it("is one statement with the frontier write; the audit rows follow the changes; the node is read back", function()
      local req = started("spec_pl_done_one")
      with_claim(req.id, false, function(cs, g, statements)
        local a = g.by_key.a
        local back = nodes_db.apply(cs, g, a, done_fields(), ACTOR)
        assert.equal(1, statements())
        assert.equal(a, back)
        local row = s:query("SELECT * FROM movement_request_nodes WHERE id = $1::uuid", a.id)[1]
        for k, v in pairs(row) do assert.same(v, a[k], k) end
        assert.equal("COMPLETED", a.node_state)
        assert.are_not.equal(qtg.db.NULL, a.finished_at)
        assert.same({ id = "D-1" }, a.provider_refs.done)
        assert.same({ receipt = "R-9" }, a.artifacts[#a.artifacts])
        assert.equal("READY", g.by_key.b.node_state)
        assert.same({ "b" }, g.request.current_frontier)
      end)
      local n = sup.nodes(s, req.id)
      assert.equal("COMPLETED", n.a.node_state)
      assert.equal("READY", n.b.node_state)
      assert.same({ "node.completed:a", "node.ready:b" }, actions(req.id))
      local cbs = sup.callbacks(s, req.id)
      assert.equal("frontier_advanced", cbs[#cbs].body.event_type)
      assert.equal("a", cbs[#cbs].body.data.completed)
    end)

    it("a branch that ends while another runs is written alone; the last one with the request's completion", function()
      local req = started("spec_pl_done_last")
      -- x has no successors and a still runs: no request write follows
      with_claim(req.id, false, function(cs, g, statements)
        nodes_db.apply(cs, g, g.by_key.x, done_fields(), ACTOR)
        assert.equal(1, statements())
        assert.equal("COMPLETED", g.by_key.x.node_state)
        assert.are_not.equal(qtg.db.NULL, g.by_key.x.finished_at)
      end)
      assert.equal("EXECUTING", sup.request(s, req.id).request_state)
      assert.same({ "node.completed:x" }, actions(req.id))
      with_claim(req.id, false, function(cs, g) nodes_db.apply(cs, g, g.by_key.a, done_fields(), ACTOR) end)
      -- b completes: the request completes in the same statement, after it
      with_claim(req.id, false, function(cs, g, statements)
        nodes_db.apply(cs, g, g.by_key.b, { node_state = "SUBMITTED", attempt_no = 1 }, ACTOR)
        local before = statements()
        nodes_db.apply(cs, g, g.by_key.b, done_fields(), ACTOR)
        assert.equal(before + 1, statements())
        assert.equal("COMPLETED", g.request.request_state)
        assert.are_not.equal(qtg.db.NULL, g.by_key.b.finished_at)
      end)
      assert.equal("COMPLETED", sup.request(s, req.id).request_state)
      assert.same({ "node.completed:x", "node.completed:a", "node.ready:b", "node.submitted:b",
                    "node.completed:b", "request.completed" }, actions(req.id))
    end)

    it("a request's first dispatch: EXECUTING and the node's outcome are one statement, the request's rows first", function()
      sup.load_doc(s, sup.doc("spec_pl_start", {
        { "a", "observe", "cex_withdrawal_status", { sim = { observes = 5 } } },
      }))
      local req = sup.create_approved(s, "spec_pl_start")
      with_claim(req.id, false, function(cs, g, statements)
        local a = g.by_key.a
        nodes_db.apply(cs, g, a, { node_state = "SUBMITTED", attempt_no = 1, started_now = true,
          next_observe_in = 5 }, ACTOR, { to = "EXECUTING", action = "request.executing" })
        assert.equal(1, statements())
        assert.equal("EXECUTING", g.request.request_state)
        assert.equal("SUBMITTED", a.node_state)
        assert.are_not.equal(qtg.db.NULL, a.started_at)
        assert.are_not.equal(qtg.db.NULL, a.next_observe_at)
      end)
      assert.equal("EXECUTING", sup.request(s, req.id).request_state)
      assert.same({ "request.executing", "node.submitted:a" }, actions(req.id))
      local cbs = sup.callbacks(s, req.id)
      assert.equal("request_executing", cbs[#cbs].event_type)
      assert.equal("APPROVED", cbs[#cbs].body.data.from_state)
    end)

    it("a request state it cannot reach is refused before anything is written, the node's change neither", function()
      local req = started("spec_pl_start_bad")
      with_claim(req.id, false, function(cs, g)
        local ok, err = pcall(nodes_db.apply, cs, g, g.by_key.a, { node_state = "OBSERVING" }, ACTOR,
          { to = "APPROVED", action = "request.approved" })
        assert.is_false(ok)
        assert.matches("illegal request transition EXECUTING %-> APPROVED", tostring(err))
      end)
      assert.equal("SUBMITTED", sup.nodes(s, req.id).a.node_state)
      assert.same({}, actions(req.id))
    end)

    it("a completion of a row that is not there raises and leaves nothing written", function()
      local req = started("spec_pl_done_none")
      local before = sup.request(s, req.id)
      local ok, err = pcall(with_claim, req.id, false, function(cs, g)
        local a = g.by_key.a
        a.id = "00000000-0000-4000-8000-000000000001"
        nodes_db.apply(cs, g, a, done_fields(), ACTOR)
      end)
      assert.is_false(ok)
      assert.matches("changed no row", tostring(err))
      local n = sup.nodes(s, req.id)
      assert.equal("SUBMITTED", n.a.node_state)
      assert.equal("BLOCKED", n.b.node_state)
      assert.same(before.current_frontier, sup.request(s, req.id).current_frontier)
      assert.same({}, actions(req.id))
    end)
  end)

  describe("the last write with the commit", function()
    local outbox = require "qtg.outbox"
    local ACTOR = "system:spec_commit"
    local actions = actions_of(ACTOR)

    it("a node change that nothing follows is one round trip with the commit, read back as written", function()
      local req = started("spec_cl_observing")
      with_claim(req.id, true, function(cs, g, trips)
        local x = g.by_key.x
        local back = nodes_db.apply(cs, g, x, { node_state = "OBSERVING", observe_count = 1, next_observe_in = 5 },
          ACTOR, nil, true)
        assert.equal(1, trips())
        assert.equal(x, back)
        assert.equal("OBSERVING", x.node_state)
        assert.are_not.equal(qtg.db.NULL, x.next_observe_at)
      end)
      local row = s:query("SELECT * FROM movement_request_nodes WHERE id = $1::uuid",
        sup.nodes(s, req.id).x.id)[1]
      assert.equal("OBSERVING", row.node_state)
      assert.equal(1, row.observe_count)
      assert.same({ "node.observing:x" }, actions(req.id))
    end)

    it("fields without a state change: the write and the commit in one round trip", function()
      local req = started("spec_cl_fields")
      with_claim(req.id, true, function(cs, g, trips)
        nodes_db.apply(cs, g, g.by_key.a, { observe_count = 3, next_observe_in = 7 }, ACTOR, nil, true)
        assert.equal(1, trips())
        assert.equal(3, g.by_key.a.observe_count)
      end)
      assert.equal(3, sup.nodes(s, req.id).a.observe_count)
    end)

    it("a completion's frontier write carries the commit; the request's completion does for the last node", function()
      local req = started("spec_cl_done")
      with_claim(req.id, true, function(cs, g, trips)
        nodes_db.apply(cs, g, g.by_key.a, done_fields(), ACTOR, nil, true)
        assert.equal(1, trips())
        assert.equal("COMPLETED", g.by_key.a.node_state)
      end)
      local n = sup.nodes(s, req.id)
      assert.equal("COMPLETED", n.a.node_state)
      assert.equal("READY", n.b.node_state)
      -- x alone: no request write follows while b runs
      with_claim(req.id, true, function(cs, g, trips)
        nodes_db.apply(cs, g, g.by_key.x, done_fields(), ACTOR, nil, true)
        assert.equal(1, trips())
      end)
      with_claim(req.id, true, function(cs, g, trips)
        nodes_db.apply(cs, g, g.by_key.b, { node_state = "SUBMITTED", attempt_no = 1 }, ACTOR, nil, true)
        assert.equal(1, trips())
      end)
      with_claim(req.id, true, function(cs, g, trips)
        nodes_db.apply(cs, g, g.by_key.b, done_fields(), ACTOR, nil, true)
        assert.equal(1, trips())
        assert.equal("COMPLETED", g.request.request_state)
      end)
      assert.equal("COMPLETED", sup.request(s, req.id).request_state)
      assert.same({ "node.completed:a", "node.ready:b", "node.completed:x", "node.submitted:b",
                    "node.completed:b", "request.completed" }, actions(req.id))
    end)

    it("a change that a request write follows: the request write carries the commit", function()
      sup.load_doc(s, sup.doc("spec_cl_failed", { { "x", "observe", "cex_withdrawal_status", { sim = { observes = 5 } } } }))
      local req = sup.create_approved(s, "spec_cl_failed")
      assert.equal(1, sup.tick("node_dispatcher"))
      with_claim(req.id, true, function(cs, g, trips)
        nodes_db.apply(cs, g, g.by_key.x, { node_state = "FAILED", error_code = "SPEC_REFUSED", next_observe_in = qtg.db.NULL },
          ACTOR, nil, true)
        assert.equal(2, trips())
        assert.equal("FAILED", g.request.request_state)
      end)
      local r = sup.request(s, req.id)
      assert.equal("FAILED", r.request_state)
      assert.equal("SPEC_REFUSED", r.last_error_code)
      assert.same({ "node.failed:x", "request.failed" }, actions(req.id))
    end)

    local EXECUTING = { to = "EXECUTING", action = "request.executing" }

    -- one observed node, the request APPROVED (its first dispatch to come)
    local function approved(key)
      sup.load_doc(s, sup.doc(key, { { "a", "observe", "cex_withdrawal_status", { sim = { observes = 5 } } } }))
      return sup.create_approved(s, key)
    end

    it("a request's first dispatch: EXECUTING and the node's change carry the commit", function()
      local req = approved("spec_cl_start")
      with_claim(req.id, true, function(cs, g, trips)
        nodes_db.apply(cs, g, g.by_key.a, { node_state = "SUBMITTED", attempt_no = 1, next_observe_in = 5 }, ACTOR,
          EXECUTING, true)
        assert.equal(1, trips())
        assert.equal("EXECUTING", g.request.request_state)
        assert.equal("SUBMITTED", g.by_key.a.node_state)
        assert.equal(1, g.by_key.a.attempt_no)
      end)
      assert.equal("EXECUTING", sup.request(s, req.id).request_state)
      assert.equal("SUBMITTED", sup.nodes(s, req.id).a.node_state)
      assert.same({ "request.executing", "node.submitted:a" }, actions(req.id))
    end)

    it("a first dispatch that a request write follows: that write carries the commit", function()
      local req = approved("spec_cl_start_failed")
      with_claim(req.id, true, function(cs, g, trips)
        nodes_db.apply(cs, g, g.by_key.a, { node_state = "FAILED", attempt_no = 1, error_code = "SPEC_REFUSED" }, ACTOR,
          EXECUTING, true)
        assert.equal(2, trips())
        assert.equal("FAILED", g.request.request_state)
      end)
      assert.equal("FAILED", sup.request(s, req.id).request_state)
      assert.same({ "request.executing", "node.failed:a", "request.failed" }, actions(req.id))
    end)

    -- A tampered or stale id: the statement that carries the commit must
    -- refuse by itself, since the caller's check of its row comes after.
    local tampered = {
      { "the completed node's id", function(g) g.by_key.a.id = "00000000-0000-4000-8000-000000000001" end,
        function(g) return g.by_key.a end, done_fields },
      { "the request's id under a completion", function(g) g.request.id = "00000000-0000-4000-8000-000000000002" end,
        function(g) return g.by_key.a end, done_fields },
      { "the node's id under a change that nothing follows",
        function(g) g.by_key.x.id = "00000000-0000-4000-8000-000000000003" end,
        function(g) return g.by_key.x end, function() return { node_state = "OBSERVING", observe_count = 1 } end },
      { "the node's id under fields alone", function(g) g.by_key.x.id = "00000000-0000-4000-8000-000000000004" end,
        function(g) return g.by_key.x end, function() return { observe_count = 9 } end },
    }
    -- the same under a first dispatch: the statement carries the request's
    -- change and the node's, and must refuse when either found no row
    local tampered_first = {
      { "the node's id", function(g) g.by_key.a.id = "00000000-0000-4000-8000-000000000005" end },
      { "the request's id", function(g) g.request.id = "00000000-0000-4000-8000-000000000006" end },
    }
    for _, t in ipairs(tampered_first) do
      it("a tampered id under a first dispatch (" .. t[1] .. ") raises, and nothing of the transaction commits",
        function()
        local req = approved("spec_cl_tamper_first")
        local before = sup.nodes(s, req.id).a
        local ok, err = pcall(with_claim, req.id, true, function(cs, g)
          cs:query("UPDATE movement_request_nodes SET error_detail = 'spec: earlier write' WHERE id = $1::uuid",
            g.by_key.a.id)
          t[2](g)
          nodes_db.apply(cs, g, g.by_key.a, { node_state = "SUBMITTED", attempt_no = 1, next_observe_in = 5 }, ACTOR,
            EXECUTING, true)
        end)
        assert.is_false(ok)
        assert.matches("changed no row", tostring(err))
        assert.is_nil(s:pipeline())
        local a = sup.nodes(s, req.id).a
        assert.equal(before.node_state, a.node_state)
        assert.same(before.error_detail, a.error_detail)
        assert.equal("APPROVED", sup.request(s, req.id).request_state)
        assert.same({}, actions(req.id))
      end)
    end

    for _, t in ipairs(tampered) do
      it("a tampered id (" .. t[1] .. ") raises, and nothing of the transaction commits", function()
        local req = started("spec_cl_tamper")
        local before = sup.nodes(s, req.id)
        local before_req = sup.request(s, req.id)
        local ok, err = pcall(with_claim, req.id, true, function(cs, g)
          -- a write earlier in the transaction: rolled back with it
          cs:query("UPDATE movement_request_nodes SET error_detail = 'spec: earlier write' WHERE id = $1::uuid",
            g.by_key.x.id)
          t[2](g)
          nodes_db.apply(cs, g, t[3](g), t[4](), ACTOR, nil, true)
        end)
        assert.is_false(ok)
        assert.matches("changed no row", tostring(err))
        assert.is_nil(s:pipeline())
        local n = sup.nodes(s, req.id)
        for _, key in ipairs({ "a", "b", "x" }) do
          assert.equal(before[key].node_state, n[key].node_state, key)
          assert.equal(before[key].observe_count, n[key].observe_count, key)
          assert.same(before[key].error_detail, n[key].error_detail, key)
        end
        local r = sup.request(s, req.id)
        assert.same(before_req.current_frontier, r.current_frontier)
        assert.equal(before_req.callback_sequence, r.callback_sequence)
        assert.same({}, actions(req.id))
      end)
    end

    it("outbox.write refuses a commit without a change or without a name for it", function()
      local ok, err = pcall(outbox.write, s, nil, nil, { audit = { actor = ACTOR, action = "spec.x", entity_type = "x",
        entity_id = "1" }, commit = "x" })
      assert.is_false(ok)
      assert.matches("a commit needs a change", tostring(err))
      s:begin_pipeline()
      ok, err = pcall(outbox.write, s, "UPDATE movement_requests SET updated_at = now() WHERE false RETURNING *", {},
        { commit = true })
      s:rollback()
      assert.is_false(ok)
      assert.matches("t.commit must name the change", tostring(err))
    end)

    it("the dispatcher and the observer end their transactions with their writes", function()
      sup.load_doc(s, sup.doc("spec_cl_workers", {
        { "a", "action", "withdrawal", { sim = { observes = 1, retry_after_seconds = 0 } } },
        { "b", "action", "withdrawal", { sim = { observes = 1, retry_after_seconds = 0 } } } }, { { "a", "b" } }))
      local req = sup.create_approved(s, "spec_cl_workers")
      assert.equal(1, sup.tick("node_dispatcher"))
      assert.equal("SUBMITTED", sup.nodes(s, req.id).a.node_state)
      assert.equal(1, sup.tick("node_observer"))
      local n = sup.nodes(s, req.id)
      assert.equal("COMPLETED", n.a.node_state)
      assert.equal("READY", n.b.node_state)
      assert.equal(1, sup.tick("node_dispatcher"))
      assert.equal(1, sup.tick("node_observer"))
      assert.equal("COMPLETED", sup.request(s, req.id).request_state)
      local idle = s:query([[SELECT count(*)::int AS n FROM pg_stat_activity
        WHERE datname = current_database() AND state LIKE 'idle in transaction%']])[1].n
      assert.equal(0, idle)
    end)
  end)

  describe("recovery", function()
    -- One arm claimed both UNKNOWN nodes of a request; the second was applied
    -- against the request as the claim read it (EXECUTING) after the first
    -- had moved it on, asked for a transition the database refuses, and the
    -- whole tick failed every pass: the arms after it never ran.
    it("recovers one node of a request per arm, and a failing arm stops no other", function()
      sup.load_doc(s, sup.doc("spec_pl_two_unknown", {
        { "a", "action", "withdrawal", { sim = { observes = 5, side_effect = true, unknown_at_observe = 1,
                                                 recover = "completed", retry_after_seconds = 0 } } },
        { "b", "action", "withdrawal", { sim = { unknown = "submit", recover = "completed" } } } }))
      sup.load_doc(s, sup.doc("spec_pl_other_lane", {
        { "x", "action", "evm_transfer", { sim = { unknown = "submit", recover = "completed" } } } }))
      local req = sup.create_approved(s, "spec_pl_two_unknown")
      sup.tick("node_dispatcher")
      sup.tick("node_observer")
      sup.tick("node_dispatcher")
      local other = sup.create_approved(s, "spec_pl_other_lane")
      sup.tick("node_dispatcher")
      local n = sup.nodes(s, req.id)
      assert.same({ "UNKNOWN", "UNKNOWN" }, { n.a.node_state, n.b.node_state })
      assert.equal("UNKNOWN", sup.nodes(s, other.id).x.node_state)
      for _ = 1, 3 do sup.tick("node_recovery") end   -- raises on a failed arm
      assert.equal("COMPLETED", sup.request(s, other.id).request_state)
      n = sup.nodes(s, req.id)
      assert.equal("COMPLETED", n.a.node_state)
      local st = sup.request(s, req.id).request_state
      if st == "MANUAL_INTERVENTION" then
        assert.equal("UNKNOWN", n.b.node_state)
        require("qtg.requests").resume(s, req.id, "console:spec")
        sup.tick("node_recovery")
      end
      assert.equal("COMPLETED", sup.request(s, req.id).request_state)
      assert.equal("COMPLETED", sup.nodes(s, req.id).b.node_state)
      -- one request_completed and no request_failed among its callbacks
      local events = {}
      for _, r in ipairs(s:query("SELECT payload::jsonb->>'event' AS e FROM movement_callback_outbox WHERE request_id = $1::uuid",
        req.id)) do events[r.e] = (events[r.e] or 0) + 1 end
      assert.is_nil(events.request_failed)
    end)

    it("keeps a request EXECUTING beside an UNKNOWN node until recovery settles it, then waits for the manual step", function()
      sup.load_doc(s, sup.doc("spec_pl_unknown_manual", {
        { "a", "action", "withdrawal", { sim = { unknown = "submit", recover = "completed" } } },
        { "m", "manual", "manual_confirmation", { required_inputs = { "desk_reference" } } } }))
      local req = sup.create_approved(s, "spec_pl_unknown_manual")
      sup.tick("node_dispatcher")
      local n = sup.nodes(s, req.id)
      assert.same({ "UNKNOWN", "READY" }, { n.a.node_state, n.m.node_state })
      assert.equal("EXECUTING", sup.request(s, req.id).request_state)
      assert.equal(1, sup.tick("node_recovery"))
      assert.equal("COMPLETED", sup.nodes(s, req.id).a.node_state)
      assert.equal("WAITING_MANUAL_ACTION", sup.request(s, req.id).request_state)
    end)

    -- The manual step's side effect is reported with its completion: the
    -- derivation in that write must count it.
    it("a manual step completed with a side effect beside an UNKNOWN node needs intervention at once", function()
      sup.load_doc(s, sup.doc("spec_pl_unknown_paid_manual", {
        { "a", "action", "withdrawal", { sim = { unknown = "submit" } } },
        { "m", "manual", "manual_confirmation", { required_inputs = { "desk_reference" }, side_effect = true } } }))
      local req = sup.create_approved(s, "spec_pl_unknown_paid_manual")
      sup.tick("node_dispatcher")
      local n = sup.nodes(s, req.id)
      assert.same({ "UNKNOWN", "READY" }, { n.a.node_state, n.m.node_state })
      requests.complete_manual_step(s, n.m.id, sup.ACTOR, { desk_reference = "DESK-7" })
      n = sup.nodes(s, req.id)
      assert.same({ "UNKNOWN", "COMPLETED" }, { n.a.node_state, n.m.node_state })
      assert.is_true(n.m.side_effect)
      assert.equal("MANUAL_INTERVENTION", sup.request(s, req.id).request_state)
    end)

    it("recovers a node that went UNKNOWN to SUBMITTED, then it completes", function()
      local t = two("spec_pl_unknown", false, { unknown_at_observe = 1, observes = 2, retry_after_seconds = 0 })
      local req = sup.create_approved(s, t)
      assert.is_true(sup.drive(s, function(x) return sup.nodes(x, req.id).b.node_state == "UNKNOWN" end, 10,
        { "node_dispatcher", "node_observer" }))
      assert.equal("EXECUTING", sup.request(s, req.id).request_state) -- no side effect: no intervention
      assert.equal(1, sup.tick("node_recovery"))
      local b = sup.nodes(s, req.id).b
      assert.equal("SUBMITTED", b.node_state)
      assert.equal(1, b.attempt_no) -- same attempt: nothing resubmitted
      assert.is_true(sup.drive(s, sup.state_is(req.id, "COMPLETED"), 10))
      assert.same({ "node.ready@node_dispatcher", "node.submitted@node_dispatcher",
        "node.unknown@node_observer", "node.submitted@node_recovery", "node.completed@node_observer" },
        node_audit(req.id, "b"))
      local rows = ledger(b.id)
      assert.equal(1, #rows)
      assert.equal(1, rows[1].submit_count)
      assert.equal(2, rows[1].observe_count)
    end)

    -- /metrics' gauges, their SQL as the API runs it
    local function gauge(name, label)
      for _, g in ipairs(require("qtg.api.metrics").GAUGES) do
        if g.name == name then
          for _, row in ipairs(s:query(g.sql, qtg.settings.network_class)) do
            if label == nil or row.state == label then return tonumber(row.value) end
          end
          return 0
        end
      end
      error("no gauge " .. name)
    end

    -- An observe() that raised every time while the provider had the
    -- transfer in flight went UNKNOWN, was recovered to SUBMITTED and went
    -- UNKNOWN again, twice a minute for good: no state lasted long enough
    -- for an alert to see.
    it("an observe that fails every time is observed later at each round, and /metrics counts the node", function()
      local req = sup.create_approved(s, one("spec_pl_observe_raises", { observes = 3, raise = "observe",
        retry_after_seconds = 0 }))
      local before = gauge("qtg_nodes_repeatedly_unknown")
      sup.tick("node_dispatcher")
      local function round()
        s:query("UPDATE movement_request_nodes SET next_observe_at = now() WHERE request_id = $1::uuid", req.id)
        assert.equal(1, sup.tick("node_observer"))
        local a = sup.nodes(s, req.id).a
        assert.equal("UNKNOWN", a.node_state)
        assert.equal("EXECUTOR_ERROR", a.error_code)
        assert.equal(1, sup.tick("node_recovery"))
        a = sup.nodes(s, req.id).a
        assert.equal("SUBMITTED", a.node_state)
        local due = s:query("SELECT extract(epoch FROM next_observe_at - now())::float8 AS s FROM movement_request_nodes WHERE id = $1::uuid",
          a.id)[1].s
        return a, due
      end
      local a, due = round()   -- one UNKNOWN observation is a passing fault: observed again at once
      assert.equal(1, a.unknown_observations)
      assert.is_true(due < 2, "due in " .. due)
      local waits = {}
      for i = 2, 4 do
        a, due = round()
        assert.equal(i, a.unknown_observations)
        waits[#waits + 1] = due
        assert.equal(0, sup.tick("node_observer"))  -- not due: nothing observed, nothing written
        assert.equal("SUBMITTED", sup.nodes(s, req.id).a.node_state)
        assert.matches("after its last " .. i .. " observations in a row ended UNKNOWN %(the last: EXECUTOR_ERROR",
          a.error_detail)
      end
      -- 10, 20, 40 s for an action of the default interval
      assert.is_true(waits[1] > 8 and waits[1] <= 10, "first wait " .. waits[1])
      assert.is_true(waits[2] > 18 and waits[2] <= 20, "second wait " .. waits[2])
      assert.is_true(waits[3] > 38 and waits[3] <= 40, "third wait " .. waits[3])
      assert.equal(before + 1, gauge("qtg_nodes_repeatedly_unknown"))
      assert.equal("EXECUTING", sup.request(s, req.id).request_state)
      -- a good answer ends the run: the executor mended (the ledger says the
      -- transfer completed), the node completes and is counted no more
      s:query("UPDATE movement_request_nodes SET next_observe_at = now(), resolved_config = resolved_config #- '{sim,raise}' WHERE id = $1::uuid",
        a.id)
      assert.is_true(sup.drive(s, sup.state_is(req.id, "COMPLETED"), 10, { "node_observer" }))
      assert.equal(0, sup.nodes(s, req.id).a.unknown_observations)
      assert.equal(before, gauge("qtg_nodes_repeatedly_unknown"))
    end)

    -- Recovery writes an UNKNOWN node it cannot settle at every pass, so
    -- the node's updated_at is never older than a pass: an age taken from
    -- it said a node stuck for days was a minute old.
    it("a node recovery cannot settle keeps its age in UNKNOWN: /metrics' oldest age is since it entered", function()
      local req = sup.create_approved(s, one("spec_pl_stuck_unknown", { unknown = "submit", raise = "recover" }))
      sup.tick("node_dispatcher")
      local a = sup.nodes(s, req.id).a
      assert.equal("UNKNOWN", a.node_state)
      local week = 7 * 86400
      -- a week ago (the write moves updated_at, not state_since: the trigger
      -- moves that at a change of state only)
      s:query("UPDATE movement_request_nodes SET state_since = state_since - interval '7 days' WHERE id = $1::uuid",
        a.id)
      assert.is_true(gauge("qtg_node_oldest_age_seconds", "UNKNOWN") >= week)
      assert.equal(1, sup.tick("node_recovery"))
      local after = sup.nodes(s, req.id).a
      assert.equal("UNKNOWN", after.node_state)
      assert.equal("EXECUTOR_ERROR", after.error_code)
      local ages = s:query([[SELECT extract(epoch FROM now() - updated_at)::float8 AS written,
                                    extract(epoch FROM now() - state_since)::float8 AS since
                               FROM movement_request_nodes WHERE id = $1::uuid]], a.id)[1]
      assert.is_true(ages.written < 60, "written " .. ages.written .. " s ago")   -- the pass wrote it
      assert.is_true(ages.since >= week, "in UNKNOWN for " .. ages.since .. " s")
      assert.is_true(gauge("qtg_node_oldest_age_seconds", "UNKNOWN") >= week)
      -- a change of state starts the age again
      s:query("UPDATE movement_request_nodes SET resolved_config = resolved_config #- '{sim,raise}' WHERE id = $1::uuid", a.id)
      assert.equal(1, sup.tick("node_recovery"))
      ages = s:query("SELECT node_state, extract(epoch FROM now() - state_since)::float8 AS since FROM movement_request_nodes WHERE id = $1::uuid",
        a.id)[1]
      assert.equal("SUBMITTED", ages.node_state)
      assert.is_true(ages.since < 60, "in SUBMITTED for " .. ages.since .. " s")
    end)

    it("a completed side effect plus an UNKNOWN node needs intervention and is not swept until resumed", function()
      local t = two("spec_pl_intervene", true, { unknown_at_observe = 1, observes = 2, retry_after_seconds = 0 })
      local req = sup.create_approved(s, t)
      assert.is_true(sup.drive(s, sup.state_is(req.id, "MANUAL_INTERVENTION"), 10,
        { "node_dispatcher", "node_observer" }))
      local cbs = sup.callbacks(s, req.id)
      assert.equal("request_attention", cbs[#cbs].body.event_type)
      assert.equal("manual_intervention", cbs[#cbs].body.data.reason)
      local before = sup.nodes(s, req.id).b
      for _ = 1, 3 do assert.equal(0, sup.tick("node_recovery")) end
      local after = sup.nodes(s, req.id).b
      assert.equal("UNKNOWN", after.node_state)
      assert.equal(before.updated_at, after.updated_at)
      requests.resume(s, req.id, sup.ACTOR)
      assert.equal(1, sup.tick("node_recovery"))
      assert.equal("SUBMITTED", sup.nodes(s, req.id).b.node_state)
      assert.is_true(sup.drive(s, sup.state_is(req.id, "COMPLETED"), 10))
    end)

    it("an ambiguous submit is recorded UNKNOWN, never guessed; recovery finds it at the provider", function()
      local req = sup.create_approved(s, one("spec_pl_ambiguous", { unknown = "submit", observes = 1,
        retry_after_seconds = 0 }))
      sup.tick("node_dispatcher")
      local a = sup.nodes(s, req.id).a
      assert.equal("UNKNOWN", a.node_state)
      assert.equal("SUBMIT_OUTCOME_UNKNOWN", a.error_code)
      assert.equal(1, #ledger(a.id))
      assert.equal(1, sup.tick("node_recovery"))
      assert.equal("SUBMITTED", sup.nodes(s, req.id).a.node_state)
      assert.is_true(sup.drive(s, sup.state_is(req.id, "COMPLETED"), 10))
      assert.equal(1, ledger(a.id)[1].submit_count)
    end)

    it("a dispatch lost after the provider call resubmits the same key, which the provider deduplicates", function()
      local d = require "qtg.workers.node_dispatcher"
      local req = sup.create_approved(s, one("spec_pl_crash", { observes = 1, retry_after_seconds = 0 }))
      local s2 = qtg.db.acquire()
      s2:begin()
      local row = qtg.db.claim.one(s2, { candidates_sql = d.CANDIDATES_SQL, claim_sql = d.CLAIM_SQL,
        args = { qtg.settings.network_class, "[]" } })
      d.dispatch(s2, row)
      s2:rollback() -- the process died between the provider call and its commit
      s2:release()
      local a = sup.nodes(s, req.id).a
      assert.equal("READY", a.node_state)
      assert.equal(0, a.attempt_no)
      local rows = ledger(a.id)
      assert.equal(1, #rows)
      assert.equal(1, rows[1].submit_count)
      assert.equal(1, sup.tick("node_dispatcher"))
      a = sup.nodes(s, req.id).a
      assert.equal("SUBMITTED", a.node_state)
      assert.equal(1, a.attempt_no)
      rows = ledger(a.id)
      assert.equal(1, #rows)                      -- one side effect
      assert.equal(2, rows[1].submit_count)       -- two submits, deduplicated by key
      assert.equal(a.idempotency_key, rows[1].idempotency_key)
      assert.is_true(sup.drive(s, sup.state_is(req.id, "COMPLETED"), 10))
    end)

    it("a submit that raised before reaching the provider is recovered as FAILED", function()
      local req = sup.create_approved(s, one("spec_pl_lost", { raise = "submit" }))
      sup.tick("node_dispatcher")
      assert.equal("UNKNOWN", sup.nodes(s, req.id).a.node_state)
      assert.equal(1, sup.tick("node_recovery"))
      local a = sup.nodes(s, req.id).a
      assert.equal("FAILED", a.node_state)
      assert.equal("SUBMIT_NOT_FOUND", a.error_code)
      assert.equal("FAILED", sup.request(s, req.id).request_state)
    end)

    it("a recover() that raises leaves the node UNKNOWN with the error recorded", function()
      local t = two("spec_pl_recover_raise", false,
        { unknown_at_observe = 1, raise = "recover", retry_after_seconds = 0 })
      local req = sup.create_approved(s, t)
      sup.drive(s, function(x) return sup.nodes(x, req.id).b.node_state == "UNKNOWN" end, 10,
        { "node_dispatcher", "node_observer" })
      assert.equal(1, sup.tick("node_recovery"))
      local b = sup.nodes(s, req.id).b
      assert.equal("UNKNOWN", b.node_state)
      assert.equal("EXECUTOR_ERROR", b.error_code)
    end)

    it("sweeps a SUBMITTING node only past its lane's grace cutoff", function()
      local req = sup.create_approved(s, one("spec_pl_submitting", { submitting = true, observes = 1,
        retry_after_seconds = 0 }))
      sup.tick("node_dispatcher")
      assert.equal("SUBMITTING", sup.nodes(s, req.id).a.node_state)
      assert.equal(0, sup.tick("node_recovery"))      -- within the cex lane's grace
      local saved = recovery.LANES[3].grace_seconds
      assert.equal("cex", recovery.LANES[3].name)
      recovery.LANES[3].grace_seconds = 0
      local ok, n = pcall(sup.tick, "node_recovery")
      recovery.LANES[3].grace_seconds = saved
      assert.is_true(ok, tostring(n))
      assert.equal(1, n)
      assert.equal("SUBMITTED", sup.nodes(s, req.id).a.node_state)
      assert.is_true(sup.drive(s, sup.state_is(req.id, "COMPLETED"), 10))
    end)

    it("splits the batch into four arms of max(1, batch // 4), in lane order", function()
      assert.equal(2, recovery.arm_size(10))
      assert.equal(1, recovery.arm_size(3))
      assert.equal(25, recovery.arm_size(100))
      local names = {}
      for i, l in ipairs(recovery.LANES) do names[i] = l.name end
      assert.same({ "ccip", "stargate", "cex", "other" }, names)
    end)

    it("takes at most batch // 4 nodes of one lane per pass, longest idle first", function()
      local t = one("spec_pl_many_unknown", { unknown = "submit", observes = 1, retry_after_seconds = 0 })
      local ids = {}
      for i = 1, 3 do
        local req = sup.create_approved(s, t)
        sup.tick("node_dispatcher")
        ids[i] = sup.nodes(s, req.id).a.id
      end
      -- default batch 10: the cex arm takes 2; the oldest two go first
      assert.equal(2, sup.tick("node_recovery"))
      local states = {}
      for i, id in ipairs(ids) do
        states[i] = s:query("SELECT node_state FROM movement_request_nodes WHERE id = $1::uuid", id)[1].node_state
      end
      assert.same({ "SUBMITTED", "SUBMITTED", "UNKNOWN" }, states)
    end)
  end)

  describe("observe timeout", function()
    local function timed_out_request(key)
      local t = two(key, true, { observes = 100, retry_after_seconds = 0 }, nil, { observe_seconds = 30 })
      local req = sup.create_approved(s, t)
      assert.is_true(sup.drive(s, function(x) return sup.nodes(x, req.id).b.node_state == "SUBMITTED" end,
        10, { "node_dispatcher" }))
      s:query([[UPDATE movement_request_nodes SET started_at = now() - interval '1 hour'
                 WHERE request_id = $1::uuid AND node_key = 'b']], req.id)
      return req
    end

    it("is not enforced with the flag off (the default)", function()
      assert.is_false(qtg.settings.observe_timeout_enforcement_enabled)
      local req = timed_out_request("spec_pl_timeout_off")
      sup.tick("node_observer")
      local b = sup.nodes(s, req.id).b
      assert.equal("OBSERVING", b.node_state)
      assert.equal(1, b.observe_count)
      assert.equal("EXECUTING", sup.request(s, req.id).request_state)
    end)

    -- one node_observer pass in a child with the flag on; its output
    local function observe_enforced()
      local cmd = string.format("MG_OBSERVE_TIMEOUT_ENFORCEMENT_ENABLED=true MG_CONSOLE_ENABLED=false %s exec %s node_observer 2>&1",
        common.quote(sup.qtgd_bin()), common.quote(sup.repo_root() .. "/spec/lua/engine/engine_tick.lua"))
      local p = io.popen(cmd)
      local out = p:read("*a")
      p:close()
      return out
    end

    it("with the flag on, marks the node UNKNOWN OBSERVATION_TIMEOUT without calling the executor", function()
      local req = timed_out_request("spec_pl_timeout_on")
      local b = sup.nodes(s, req.id).b
      local out = observe_enforced()
      local after = sup.nodes(s, req.id).b
      assert.equal("UNKNOWN", after.node_state, out)
      assert.equal("OBSERVATION_TIMEOUT", after.error_code)
      assert.equal(b.observe_count, after.observe_count)
      assert.equal(0, ledger(after.id)[1].observe_count) -- the provider was not asked
      assert.equal("MANUAL_INTERVENTION", sup.request(s, req.id).request_state)
      local cbs = sup.callbacks(s, req.id)
      assert.equal("request_attention", cbs[#cbs].body.event_type)
    end)

    it("after the operator resumes and recovery finds it in flight, the node is observed again", function()
      local req = timed_out_request("spec_pl_timeout_resume")
      observe_enforced()
      assert.equal("MANUAL_INTERVENTION", sup.request(s, req.id).request_state)
      require("qtg.requests").resume(s, req.id, sup.ACTOR)
      assert.equal(1, sup.tick("node_recovery"))
      local b = sup.nodes(s, req.id).b
      assert.equal("SUBMITTED", b.node_state)
      -- the observation window starts again: not timed out at once
      local age = s:query("SELECT extract(epoch FROM now() - started_at)::float8 AS a FROM movement_request_nodes WHERE id = $1::uuid",
        b.id)[1].a
      assert.is_true(age < 30, "age " .. age)
      local out = observe_enforced()
      local after = sup.nodes(s, req.id).b
      assert.equal("OBSERVING", after.node_state, out)
      assert.equal(b.observe_count + 1, after.observe_count)
      assert.equal(1, ledger(after.id)[1].observe_count) -- the provider was asked this time
      assert.equal("EXECUTING", sup.request(s, req.id).request_state)
    end)
  end)
end)
