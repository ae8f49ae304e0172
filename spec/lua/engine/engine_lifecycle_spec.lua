-- The request lifecycle (qtg.requests) on a real database: create with an
-- idempotency key, approve, reject, cancel, resume, retry, complete a manual
-- step; refusals; the callback and audit rows written with each change; the
-- state machine as the database enforces it.
local qtg = require "qtg"
local requests = require "qtg.requests"
local state = require "qtg.state"

local sup, s

local CHAIN = "spec_lc_chain"
local MANUAL = "spec_lc_manual"
local SE_THEN_UNKNOWN = "spec_lc_se_unknown"

describe("request lifecycle", function()
  setup(function()
    sup = require("spec.lua.support.engine")
    s = qtg.db.acquire()
    sup.load_doc(s, sup.doc(CHAIN, {
      { "a", "action", "withdrawal", { sim = { observes = 0, side_effect = true } } },
      { "b", "observe", "cex_withdrawal_status", { sim = { observes = 0 } } },
    }, { { "a", "b" } }))
    sup.load_doc(s, sup.doc(MANUAL, {
      { "a", "action", "withdrawal", { sim = { observes = 0 } } },
      { "m", "manual", "manual_confirmation", { required_inputs = { "desk_reference" } } },
    }, { { "a", "m" } }))
    sup.load_doc(s, sup.doc(SE_THEN_UNKNOWN, {
      { "a", "action", "withdrawal", { sim = { observes = 0, side_effect = true } } },
      { "b", "observe", "cex_withdrawal_status", { sim = { unknown_at_observe = 1, retry_after_seconds = 0 } } },
    }, { { "a", "b" } }))
  end)
  teardown(function() s:release() end)
  before_each(function() sup.park_others(s) end)

  describe("create", function()
    it("makes a PENDING_APPROVAL request with BLOCKED nodes, expiring after the approval TTL", function()
      local req, created = sup.create(s, CHAIN)
      assert.is_true(created)
      assert.equal("PENDING_APPROVAL", req.request_state)
      assert.same({ "a" }, req.current_frontier)
      local ttl = s:query([[SELECT extract(epoch FROM expires_at - created_at)::float8 AS ttl
                              FROM movement_requests WHERE id = $1::uuid]], req.id)[1].ttl
      assert.near(qtg.settings.approval_ttl_seconds, ttl, 2)
      local nodes = sup.nodes(s, req.id)
      assert.equal("BLOCKED", nodes.a.node_state)
      assert.equal("BLOCKED", nodes.b.node_state)
      local cbs = sup.callbacks(s, req.id)
      assert.equal(1, #cbs)
      assert.equal("request_created", cbs[1].body.event_type)
      assert.equal(1, cbs[1].body.sequence)
      assert.equal(1, #sup.audit(s, req.id))
    end)

    it("returns the first request for a repeated idempotency key, and refuses the key for another request", function()
      local key = sup.uid("idem")
      local first = sup.create(s, CHAIN, { idempotency_key = key })
      local again, created = sup.create(s, CHAIN, { idempotency_key = key })
      assert.is_false(created)
      assert.equal(first.id, again.id)
      local ok, err = pcall(sup.create, s, CHAIN, { idempotency_key = key,
        intent = { asset = "USDT", amount = "999" } })
      assert.is_false(ok)
      assert.equal("idempotency_mismatch", err.kind, tostring(err.message))
      local n = s:query("SELECT count(*)::int AS n FROM movement_requests WHERE idempotency_key = $1", key)[1].n
      assert.equal(1, n)
    end)

    it("refuses an intent missing required fields, and writes nothing", function()
      local key = sup.uid("idem")
      local err = sup.refused("invalid_intent", sup.create, s, CHAIN,
        { idempotency_key = key, intent = { asset = "USDC" } })
      assert.matches("amount", err.message)
      local n = s:query("SELECT count(*)::int AS n FROM movement_requests WHERE idempotency_key = $1", key)[1].n
      assert.equal(0, n)
    end)

    it("refuses an intent field of the wrong type", function()
      local doc = sup.doc("spec_lc_typed", { { "a", "action", "withdrawal" } }, {},
        { intent = { required = { "amount", "destination" },
                     types = { amount = "decimal", destination = "evm_address" } } })
      sup.load_doc(s, doc)
      local err = sup.refused("invalid_intent", sup.create, s, "spec_lc_typed",
        { intent = { amount = "-5", destination = "0x" .. string.rep("a", 40) } })
      assert.matches("amount", err.message)
      -- an amount as a JSON number is refused too: it may already have lost digits
      for _, n in ipairs({ 5, 125.5, 1e14 }) do
        err = sup.refused("invalid_intent", sup.create, s, "spec_lc_typed",
          { intent = { amount = n, destination = "0x" .. string.rep("a", 40) } })
        assert.matches("amount.*decimal string", err.message)
      end
      err = sup.refused("invalid_intent", sup.create, s, "spec_lc_typed",
        { intent = { amount = "5", destination = "bob" } })
      assert.matches("destination", err.message)
    end)

    -- The intent is what approvers read: a field named "аmount" (a
    -- Cyrillic а) stood on the approval card as a second intent.amount
    -- beside the real one, the same to the eye.
    it("refuses an intent field name that is not a key, naming it escaped, and writes nothing", function()
      local key = sup.uid("idem")
      for _, bad in ipairs({ "\208\176mount", "amount\27[2K", "Amount", "amount-x", "1amount", "",
                             string.rep("a", 64), "amount\226\128\174" }) do
        local intent = { asset = "USDC", amount = "25" }
        intent[bad] = "0.01"
        local err = sup.refused("invalid_intent", sup.create, s, CHAIN, { idempotency_key = key, intent = intent })
        assert.matches("intent field name", err.message)
        assert.is_nil(err.message:find("[%c\128-\255]"), err.message)
      end
      assert.equal(0, s:query("SELECT count(*)::int AS n FROM movement_requests WHERE idempotency_key = $1", key)[1].n)
      -- a field the template does not declare, named as a key, is taken (policies read some)
      local req = sup.create(s, CHAIN, { intent = { asset = "USDC", amount = "25", desk_ticket = "t-4" } })
      assert.equal("t-4", req.intent.desk_ticket)
    end)

    it("refuses an unknown template, a missing key and a bad callback URL", function()
      sup.refused("not_found", sup.create, s, "no_such_template")
      sup.refused("invalid_input", requests.create, s, { template_key = CHAIN, intent = sup.INTENT }, sup.ACTOR)
      sup.refused("invalid_input", sup.create, s, CHAIN, { callback_url = "ftp://x" })
      sup.refused("invalid_input", sup.create, s, CHAIN, { callback_url = "https://user:pw@example.com/cb" })
      sup.refused("invalid_input", requests.create, s, { template_key = CHAIN, intent = sup.INTENT,
        idempotency_key = sup.uid() }, "nobody")
      -- a scheme in capitals is the same URL: stored in lower case, not an SQL error
      local req = sup.create(s, CHAIN, { callback_url = "HTTPS://Example.com/CB" })
      assert.equal("https://Example.com/CB", req.callback_url)
    end)

    it("joins the caller's transaction when one is open", function()
      s:begin()
      local req = sup.create(s, CHAIN)
      s:rollback()
      assert.is_nil(sup.request(s, req.id))
      assert.equal(0, #sup.callbacks(s, req.id))
    end)

    it("writes no callback rows for a request without a callback_url", function()
      local req = sup.create(s, CHAIN, { callback_url = false })
      requests.approve(s, req.id, sup.ACTOR)
      assert.equal(0, #sup.callbacks(s, req.id))
      assert.equal(3, #sup.audit(s, req.id)) -- create, approve, node a READY
    end)
  end)

  describe("approve / reject / cancel", function()
    it("approve makes the frontier READY", function()
      local req = sup.create(s, CHAIN)
      req = requests.approve(s, req.id, sup.ACTOR)
      assert.equal("APPROVED", req.request_state)
      assert.equal(sup.ACTOR, req.approved_by)
      local nodes = sup.nodes(s, req.id)
      assert.equal("READY", nodes.a.node_state)
      assert.equal("BLOCKED", nodes.b.node_state)
      local cbs = sup.callbacks(s, req.id)
      assert.equal("request_approved", cbs[#cbs].body.event_type)
      assert.equal("APPROVED", cbs[#cbs].body.request_state)
    end)

    it("refuses to approve twice, to approve an expired request, or an unknown one", function()
      local req = sup.create(s, CHAIN)
      requests.approve(s, req.id, sup.ACTOR)
      sup.refused("illegal_transition", requests.approve, s, req.id, sup.ACTOR)
      local late = sup.create(s, CHAIN)
      s:query("UPDATE movement_requests SET expires_at = now() - interval '1 second' WHERE id = $1::uuid", late.id)
      local err = sup.refused("illegal_transition", requests.approve, s, late.id, sup.ACTOR)
      assert.matches("approval window", err.message)
      assert.equal("PENDING_APPROVAL", sup.request(s, late.id).request_state)
      sup.refused("not_found", requests.approve, s, "00000000-0000-0000-0000-000000000000", sup.ACTOR)
      sup.refused("not_found", requests.approve, s, "not-a-uuid", sup.ACTOR)
      -- a request of another network class is not this process's
      local other = sup.create(s, CHAIN)
      s:query("UPDATE movement_requests SET network_class = 'spec-other' WHERE id = $1::uuid", other.id)
      local e = sup.refused("not_found", requests.approve, s, other.id, sup.ACTOR)
      assert.matches("network class spec-other", e.message, 1, true)
      e = sup.refused("not_found", requests.get, s, other.id) -- not even shown
      assert.matches("network class spec-other", e.message, 1, true)
      assert.equal(req.id, (requests.get(s, req.id)).id)
      sup.refused("invalid_input", sup.create, s, CHAIN, { network_class = "spec-other" })
    end)

    it("reject closes a pending request and cancels its nodes", function()
      local req = sup.create(s, CHAIN)
      req = requests.reject(s, req.id, sup.ACTOR, "wrong venue")
      assert.equal("REJECTED", req.request_state)
      assert.equal("CANCELLED", sup.nodes(s, req.id).a.node_state)
      local cbs = sup.callbacks(s, req.id)
      assert.equal("request_rejected", cbs[#cbs].body.event_type)
      assert.equal("wrong venue", cbs[#cbs].body.data.reason)
      sup.refused("illegal_transition", requests.reject, s, req.id, sup.ACTOR)
      sup.refused("illegal_transition", requests.approve, s, req.id, sup.ACTOR)
    end)

    it("cancel works before anything is in flight and is refused while a node is in flight", function()
      local req = sup.create_approved(s, CHAIN)
      req = requests.cancel(s, req.id, sup.ACTOR, "not needed")
      assert.equal("CANCELLED", req.request_state)
      assert.equal("CANCELLED", sup.nodes(s, req.id).a.node_state)
      sup.refused("illegal_transition", requests.cancel, s, req.id, sup.ACTOR)

      local busy = sup.create_approved(s, MANUAL)
      s:query([[UPDATE movement_request_nodes SET node_state = 'SUBMITTED' WHERE request_id = $1::uuid
                 AND node_key = 'a']], busy.id)
      local err = sup.refused("illegal_transition", requests.cancel, s, busy.id, sup.ACTOR)
      assert.matches("in flight", err.message)
    end)

    -- An UNKNOWN node's submit may have reached the provider; once its
    -- request is CANCELLED nothing recovers it.  The canceller says it asked.
    it("cancel beside an UNKNOWN node needs the canceller's word that the provider was asked, recorded", function()
      local req = sup.create_approved(s, MANUAL)
      s:query([[UPDATE movement_request_nodes SET node_state = 'UNKNOWN' WHERE request_id = $1::uuid
                 AND node_key = 'a']], req.id)
      for _, word in ipairs({ false, "yes", 1 }) do
        local err = sup.refused("illegal_transition", requests.cancel, s, req.id, sup.ACTOR, "stuck", word)
        assert.matches("node a is UNKNOWN", err.message, 1, true)
        assert.matches("reconciled = true", err.message, 1, true)
      end
      assert.equal("APPROVED", sup.request(s, req.id).request_state)
      requests.cancel(s, req.id, sup.ACTOR, "the desk confirms nothing left", true)
      assert.equal("CANCELLED", sup.request(s, req.id).request_state)
      local audit = s:query([[SELECT detail FROM audit_outbox WHERE entity_id = $1 AND action = 'request.cancel'
                              UNION ALL SELECT detail FROM audit_events WHERE entity_id = $1 AND action = 'request.cancel']],
        req.id)[1]
      assert.truthy(audit, "no request.cancel audit row")
      local detail = type(audit.detail) == "table" and audit.detail or require("cjson").decode(audit.detail)
      assert.same({ "a" }, detail.reconciled_unknown_nodes)
    end)

    -- A dispatch whose transaction is lost after the provider acted (a
    -- crash, a lost connection before the commit) leaves its node READY;
    -- a cancel then closed the request with the provider's submission on
    -- its books and nothing in qtg saying so.
    it("cancel beside a READY node whose provider holds a submit under its next key needs the same word", function()
      local req = sup.create_approved(s, CHAIN)
      local a = sup.nodes(s, req.id).a
      local context = require "qtg.context"
      local key = context.key_of(a, 1)
      local sim = require "qtg.executors.sim"
      -- the provider's side of the lost dispatch: its books, not ours
      assert.equal("COMPLETED", sim.submit({ node_config = { sim = { observes = 0, side_effect = true } },
        request_node_id = a.id, attempt_no = 1, action_type = "withdrawal" }, { idempotency_key = key }).status)
      for _, word in ipairs({ "none", false, "yes" }) do
        if word == "none" then word = nil end
        local err = sup.refused("illegal_transition", requests.cancel, s, req.id, sup.ACTOR, "changed my mind", word)
        assert.matches("node a is READY and its executor's records hold a submit", err.message, 1, true)
        assert.matches(key, err.message, 1, true)
      end
      assert.same({ "APPROVED", "READY" }, { sup.request(s, req.id).request_state, sup.nodes(s, req.id).a.node_state })
      -- an executor that cannot tell counts as one that holds a submit
      local executors = require "qtg.executors"
      local saved = sim.sent_before
      sim.sent_before = function() error("the provider's lookup timed out") end
      local ok, err = pcall(requests.cancel, s, req.id, sup.ACTOR, "changed my mind")
      sim.sent_before = saved
      assert.is_false(ok)
      assert.matches("nobody can tell whether a submit went out", err.message, 1, true)
      assert.matches("the provider's lookup timed out", err.message, 1, true)
      assert.same({ false }, { executors.sent_before({}, {}) })
      -- a READY node the provider never saw is cancelled without a word
      local clean = sup.create_approved(s, CHAIN)
      assert.equal("CANCELLED", requests.cancel(s, clean.id, sup.ACTOR, "not needed").request_state)
      -- with the canceller's word, recorded
      requests.cancel(s, req.id, sup.ACTOR, "the provider shows the withdrawal; booked by hand", true)
      assert.equal("CANCELLED", sup.request(s, req.id).request_state)
      local audit = s:query([[SELECT detail FROM audit_outbox WHERE entity_id = $1 AND action = 'request.cancel'
                              UNION ALL SELECT detail FROM audit_events WHERE entity_id = $1 AND action = 'request.cancel']],
        req.id)[1]
      local detail = type(audit.detail) == "table" and audit.detail or require("cjson").decode(audit.detail)
      assert.same({ "a" }, detail.reconciled_unknown_nodes)
    end)
  end)

  describe("manual steps", function()
    it("waits for an operator, refuses bad input, then completes", function()
      local req = sup.create_approved(s, MANUAL)
      assert.is_true(sup.drive(s, sup.state_is(req.id, "WAITING_MANUAL_ACTION"), 20))
      local m = sup.nodes(s, req.id).m
      assert.equal("READY", m.node_state)
      local cbs = sup.callbacks(s, req.id)
      assert.equal("request_attention", cbs[#cbs].body.event_type)
      assert.equal("waiting_manual_action", cbs[#cbs].body.data.reason)
      -- the dispatcher never takes a manual step
      assert.equal(0, sup.tick("node_dispatcher"))
      local err = sup.refused("invalid_input", requests.complete_manual_step, s, m.id, sup.ACTOR, {})
      assert.matches("desk_reference", err.message)
      sup.refused("illegal_transition", requests.complete_manual_step, s, sup.nodes(s, req.id).a.id,
        sup.ACTOR, { desk_reference = "x" })
      requests.complete_manual_step(s, m.id, sup.ACTOR, { desk_reference = "DESK-42" })
      assert.equal("COMPLETED", sup.request(s, req.id).request_state)
      -- the request's own WAITING_MANUAL_ACTION -> EXECUTING is audited, by the operator
      local resumed = s:query([[SELECT actor, detail FROM audit_outbox WHERE request_id = $1::uuid
                                  AND action = 'request.executing' AND detail->>'cause' = 'manual_step_completed']],
        req.id)
      assert.equal(1, #resumed)
      assert.equal(sup.ACTOR, resumed[1].actor)
      assert.equal("WAITING_MANUAL_ACTION", resumed[1].detail.from_state)
      m = sup.nodes(s, req.id).m
      assert.equal("COMPLETED", m.node_state)
      assert.equal("DESK-42", m.provider_refs.desk_reference)
      sup.refused("illegal_transition", requests.complete_manual_step, s, m.id, sup.ACTOR,
        { desk_reference = "again" })
    end)
  end)

  describe("manual steps and four eyes", function()
    -- A request made from a console uid before any operator held it, the
    -- uid enrolled as an operator since: that operator is its initiator
    -- and attests none of its steps (its votes are not counted either).
    it("refuses the initiator's step under the name its uid has now", function()
      local principals = require "qtg.principals"
      local uid = 3000000000 + math.random(1, 900000000)
      local name = "spec-maker-" .. uid
      local req = requests.create(s, { template_key = MANUAL, intent = sup.INTENT, idempotency_key = sup.uid("idem"),
        callback_url = "http://127.0.0.1:9/callback" }, "console:" .. uid)
      sup.approve(s, req.id)
      assert.is_true(sup.drive(s, sup.state_is(req.id, "WAITING_MANUAL_ACTION"), 20))
      principals.add(s, name, uid, { "read", "operate" }, "system:spec")
      local ok, err = pcall(function()
        local m = sup.nodes(s, req.id).m
        local e = sup.refused("forbidden", requests.complete_manual_step, s, m.id, "operator:" .. name,
          { desk_reference = "DESK-own" })
        assert.matches("four eyes", e.message, 1, true)
        assert.equal("READY", sup.nodes(s, req.id).m.node_state)
        requests.complete_manual_step(s, m.id, sup.ACTOR, { desk_reference = "DESK-other" })
        assert.equal("COMPLETED", sup.request(s, req.id).request_state)
      end)
      principals.remove(s, name, "system:spec")
      assert(ok, err)
    end)
  end)

  describe("resume and retry", function()
    it("a side effect plus an UNKNOWN node needs intervention; resume returns it to EXECUTING", function()
      local req = sup.create_approved(s, SE_THEN_UNKNOWN)
      assert.is_true(sup.drive(s, sup.state_is(req.id, "MANUAL_INTERVENTION"), 20,
        { "node_dispatcher", "node_observer" }))
      sup.refused("illegal_transition", requests.approve, s, req.id, sup.ACTOR)
      req = requests.resume(s, req.id, sup.ACTOR)
      assert.equal("EXECUTING", req.request_state)
      sup.refused("illegal_transition", requests.resume, s, req.id, sup.ACTOR)
    end)

    it("resume refuses a request whose node is FAILED, naming it and the way out (retry)", function()
      sup.load_doc(s, sup.doc("spec_lc_se_fail", {
        { "a", "action", "withdrawal", { sim = { observes = 0, side_effect = true } } },
        { "c", "action", "withdrawal", { sim = { fail = "submit" } } },
      }, { { "a", "c" } }))
      local req = sup.create_approved(s, "spec_lc_se_fail")
      assert.is_true(sup.drive(s, sup.state_is(req.id, "MANUAL_INTERVENTION"), 20))
      local c = sup.nodes(s, req.id).c
      assert.equal("FAILED", c.node_state)
      local err = sup.refused("illegal_transition", requests.resume, s, req.id, sup.ACTOR)
      assert.matches("node c (" .. c.id .. ", SIM_SUBMIT_REJECTED) is FAILED", err.message, 1, true)
      assert.matches("retry(node_id)", err.message, 1, true)
      -- nothing changed: still listed as needing intervention, no audit row
      assert.equal("MANUAL_INTERVENTION", s:query("SELECT request_state FROM movement_requests WHERE id = $1::uuid",
        req.id)[1].request_state)
      assert.equal(0, #s:query([[SELECT 1 FROM audit_outbox WHERE request_id = $1::uuid
                                  AND action = 'request.resume']], req.id))
      -- the way out it names works
      local r2 = requests.retry(s, c.id, sup.ACTOR)
      assert.equal("EXECUTING", r2.request_state)
    end)

    -- A request that went FAILED beside a sibling in flight (before the
    -- engine held such requests EXECUTING) left that node unobserved, and
    -- the only way back, retry, submitted the failed node again.
    it("resume takes a FAILED request with a node in flight back to EXECUTING, observing it without resubmitting", function()
      sup.load_doc(s, sup.doc("spec_lc_fail_beside", {
        { "a", "action", "withdrawal", { sim = { observes = 1, side_effect = true } } },
        { "b", "action", "withdrawal", { sim = { fail = "submit" } } },
      }))
      local req = sup.create_approved(s, "spec_lc_fail_beside")
      sup.tick("node_dispatcher")
      sup.tick("node_dispatcher")
      local n = sup.nodes(s, req.id)
      assert.equal("SUBMITTED", n.a.node_state)
      assert.equal("FAILED", n.b.node_state)
      assert.equal("EXECUTING", sup.request(s, req.id).request_state)
      -- as an earlier engine left it
      s:query("UPDATE movement_requests SET request_state = 'FAILED', finished_at = now() WHERE id = $1::uuid", req.id)
      assert.is_truthy(sup.request(s, req.id).finished_at ~= qtg.db.NULL)
      local r2 = requests.resume(s, req.id, sup.ACTOR)
      assert.equal("EXECUTING", r2.request_state)
      assert.equal(qtg.db.NULL, sup.request(s, req.id).finished_at)   -- running again
      assert.equal(1, #s:query([[SELECT 1 FROM audit_outbox WHERE request_id = $1::uuid
                                  AND action = 'request.resume' AND actor = $2]], req.id, sup.ACTOR))
      local settled = sup.drive(s, function() return sup.request(s, req.id).request_state ~= "EXECUTING" end, 60,
        { "node_dispatcher", "node_observer" })
      n = sup.nodes(s, req.id)
      assert.is_true(settled, require("cjson").encode({ sup.request(s, req.id).request_state, n.a.node_state,
        n.a.side_effect, n.b.node_state }))
      assert.equal("MANUAL_INTERVENTION", sup.request(s, req.id).request_state)
      assert.equal("COMPLETED", n.a.node_state)
      assert.equal("FAILED", n.b.node_state)
      assert.equal(1, n.b.attempt_no)          -- never submitted again
    end)

    -- failed_request(key) -> a request of one withdrawal whose submit the
    -- provider refused, driven to FAILED
    local function failed_request(key)
      sup.load_doc(s, sup.doc(key, {
        { "a", "action", "withdrawal", { sim = { fail = "submit" } } },
      }))
      local req = sup.create_approved(s, key)
      assert.is_true(sup.drive(s, sup.state_is(req.id, "FAILED"), 20))
      return req
    end

    it("resume refuses a FAILED request with no node in flight, naming retry", function()
      local req = failed_request("spec_lc_fail_alone")
      local err = sup.refused("illegal_transition", requests.resume, s, req.id, sup.ACTOR)
      assert.matches("it is FAILED and none of its nodes is in flight; retry(node_id)", err.message, 1, true)
      assert.equal("FAILED", sup.request(s, req.id).request_state)
    end)

    it("retry puts a FAILED node back to READY with the next attempt and a new key", function()
      local req = failed_request("spec_lc_fail")
      local a = sup.nodes(s, req.id).a
      assert.equal("FAILED", a.node_state)
      assert.equal("SIM_SUBMIT_REJECTED", a.error_code)
      assert.equal(1, a.attempt_no)
      sup.refused("invalid_input", requests.retry, s, a.id, "bad actor")
      local r2, node = requests.retry(s, a.id, sup.ACTOR)
      assert.equal("EXECUTING", r2.request_state)
      local back = s:query([[SELECT actor, detail FROM audit_outbox WHERE request_id = $1::uuid
                               AND action = 'request.executing' AND detail->>'cause' = 'node.retry']], req.id)
      assert.equal(1, #back)
      assert.equal(sup.ACTOR, back[1].actor)
      assert.equal("FAILED", back[1].detail.from_state)
      assert.equal("READY", node.node_state)
      assert.equal(qtg.db.NULL, node.error_code)
      sup.refused("illegal_transition", requests.retry, s, a.id, sup.ACTOR) -- READY now
      sup.tick("node_dispatcher")
      a = sup.nodes(s, req.id).a
      assert.equal(2, a.attempt_no)
      assert.equal("qtg:" .. a.id .. ":2", a.idempotency_key)
      local cbs = sup.callbacks(s, req.id)
      local seen = {}
      for _, c in ipairs(cbs) do seen[#seen + 1] = c.body.event_type end
      assert.same({ "request_created", "request_approved", "request_executing", "request_failed",
        "node_retried", "request_failed" }, seen)
    end)
  end)

  describe("state machine", function()
    it("has the same transitions in Lua and in the database", function()
      for _, t in ipairs({ { "request_state_transitions", state.REQUEST_TRANSITIONS },
                           { "node_state_transitions", state.NODE_TRANSITIONS } }) do
        local db = {}
        for _, r in ipairs(s:query("SELECT from_state, to_state FROM " .. t[1])) do
          db[#db + 1] = r.from_state .. ">" .. r.to_state
        end
        local lua = {}
        for from, tos in pairs(t[2]) do
          for _, to in ipairs(tos) do lua[#lua + 1] = from .. ">" .. to end
        end
        table.sort(db); table.sort(lua)
        assert.same(db, lua)
      end
    end)

    it("the database refuses an illegal transition and an unknown state", function()
      local req = sup.create(s, CHAIN)
      local ok, err = pcall(s.query, s,
        "UPDATE movement_requests SET request_state = 'COMPLETED' WHERE id = $1::uuid", req.id)
      assert.is_false(ok)
      assert.equal("23514", err.sqlstate)
      ok, err = pcall(s.query, s,
        "UPDATE movement_request_nodes SET node_state = 'DONE' WHERE request_id = $1::uuid", req.id)
      assert.is_false(ok)
      ok, err = pcall(s.query, s,
        "UPDATE movement_request_nodes SET node_state = 'COMPLETED' WHERE request_id = $1::uuid", req.id)
      assert.is_false(ok)
      assert.matches("illegal node transition BLOCKED %-> COMPLETED", err.message)
    end)
  end)
end)
