-- Approvals on a real database: the freeze trigger, risk_controls at
-- create and approval, principals and roles, the approval policy's rule
-- kinds (tiers, allowlist, velocity, block, allow, default deny, a rule
-- that raises), quorums of distinct principals, rejection, duplicate votes,
-- expiry with a partial quorum, a policy edit and reload, the address book.
local qtg = require "qtg"
local cjson = require "cjson"
local requests = require "qtg.requests"
local approvals = require "qtg.approvals"
local common = require "spec.lua.support.common"
local P = approvals

local sup, s

local T = "spec_appr_sim"
local LIMITED = "spec_appr_limited"

local function who(name, roles)
  return { actor = "operator:" .. name, kind = "operator", name = name, roles = roles }
end
local ALICE = who("alice", { "read", "operate", "approve" })
local BOB = who("bob", { "read", "approve" })
local CAROL = who("carol", { "read", "approve" })
local DAVE = who("dave", { "read", "approve", "admin" })
local ERIN = who("erin", { "read", "operate" })
local READER = who("reader", { "read" })
-- The approvers above are enrolled operators while this file runs: a vote
-- counts only while its operator row exists (docs/approvals.md).
local ENROLLED = { ALICE, BOB, CAROL, DAVE, ERIN, READER, who("adm2", { "read", "approve", "admin" }),
                   who("adm1", { "admin" }), who("adm3", { "admin" }),
                   who("ab1", { "admin" }), who("ab2", { "admin" }), who("ab3", { "admin" }) }

local function enrol(p)
  s:query([[INSERT INTO operators (name, roles, created_by) VALUES ($1, $2::text[], 'system:spec')
            ON CONFLICT (name) DO UPDATE SET roles = EXCLUDED.roles]],
    p.name, "{" .. table.concat(p.roles, ",") .. "}")
end

local function create(template, intent, initiator, callback_url)
  return requests.create(s, { template_key = template or T, intent = intent or sup.INTENT,
    idempotency_key = sup.uid("idem"), callback_url = callback_url }, initiator or ALICE)
end

local function state(id) return sup.request(s, id).request_state end

describe("approvals", function()
  setup(function()
    sup = require("spec.lua.support.engine")
    s = qtg.db.acquire()
    sup.load_doc(s, sup.doc(T, { { "a", "action", "withdrawal", { sim = { observes = 0 } } } }))
    sup.load_doc(s, sup.doc(LIMITED, { { "a", "action", "withdrawal", { sim = { observes = 0 } } } }, nil,
      { risk_controls = { max_amount = "1000", min_amount = "0.5", allowed_assets = { "USDC", "USDT" } } }))
    for _, p in ipairs(ENROLLED) do enrol(p) end
  end)
  teardown(function()
    for _, p in ipairs(ENROLLED) do s:query("DELETE FROM operators WHERE name = $1", p.name) end
    s:release()
  end)
  before_each(function() sup.park_others(s) end)

  describe("the freeze", function()
    it("refuses a change to an approved request's intent, naming the column, and its plan rows", function()
      local req = create()
      -- still pending: the initiator may be corrected by SQL (nobody approved yet)
      s:query([[UPDATE movement_requests SET intent = jsonb_set(intent, '{amount}', '"101.00"')
                 WHERE id = $1::uuid]], req.id)
      requests.approve(s, req.id, BOB)
      assert.equal("APPROVED", state(req.id))
      for _, sql in ipairs({
        [[UPDATE movement_requests SET intent = '{"asset":"USDC","amount":"20000"}' WHERE id = $1::uuid]],
        [[UPDATE movement_requests SET callback_url = 'http://127.0.0.1:9/evil' WHERE id = $1::uuid]],
        [[UPDATE movement_requests SET approvals_required = 0 WHERE id = $1::uuid]],
      }) do
        local ok, err = pcall(s.query, s, sql, req.id)
        assert.is_false(ok, sql)
        local col = sql:match("SET ([%w_]+)")
        assert.truthy(tostring(err.message or err):find("movement_requests." .. col .. " of request", 1, true), tostring(err.message or err))
      end
      local r = sup.request(s, req.id)
      assert.equal("101.00", r.intent.amount)
      -- the plan version and nodes it references (sealed since the request
      -- was created: sql/0170)
      local ok, err = pcall(s.query, s, "UPDATE plan_nodes SET config = '{}' WHERE plan_version_id = $1", r.plan_version_id)
      assert.is_false(ok)
      assert.truthy(tostring(err.message or err):find("is sealed", 1, true))
      ok = pcall(s.query, s, "DELETE FROM plan_nodes WHERE plan_version_id = $1", r.plan_version_id)
      assert.is_false(ok)
      ok = pcall(s.query, s, "UPDATE plan_versions SET risk_controls = '{}' WHERE id = $1", r.plan_version_id)
      assert.is_false(ok)
      -- the votes are append-only
      ok = pcall(s.query, s, "UPDATE request_approvals SET principal = 'operator:mallory' WHERE request_id = $1::uuid", req.id)
      assert.is_false(ok)
      ok = pcall(s.query, s, "DELETE FROM request_approvals WHERE request_id = $1::uuid", req.id)
      assert.is_false(ok)
      -- state changes still go through
      requests.cancel(s, req.id, ALICE, "changed my mind")
      assert.equal("CANCELLED", state(req.id))
    end)

    it("puts the digest, the intent, the amount and every approval in the audit detail, the voters in the callback", function()
      local req = create(T, { asset = "USDC", amount = "250000" }, nil, "http://127.0.0.1:9/callback")
      requests.approve(s, req.id, BOB, "checked the invoice")
      requests.approve(s, req.id, CAROL)
      local a = s:query([[SELECT detail FROM audit_outbox WHERE request_id = $1::uuid AND action = 'request.approve']], req.id)[1]
      local d = a.detail
      local digest = s:query("SELECT qtg_approval_digest(r) AS d FROM movement_requests r WHERE id = $1::uuid", req.id)[1].d
      assert.equal(digest, d.approval_digest)
      assert.equal(digest, sup.request(s, req.id).approval_digest)
      assert.equal("250000", d.amount)
      assert.equal("USDC", d.intent.asset)
      assert.equal(2, #d.approvals)
      assert.equal("operator:bob", d.approvals[1].principal)
      assert.equal("checked the invoice", d.approvals[1].comment)
      assert.equal("operator:carol", d.approvals[2].principal)
      assert.equal("two_approvers_from_100k", d.approval_rule)
      local vote = s:query([[SELECT detail FROM audit_outbox WHERE request_id = $1::uuid AND action = 'request.approval']], req.id)[1]
      assert.equal(digest, vote.detail.approval_digest)
      assert.equal("250000", vote.detail.amount)
      -- the client system's callback names both voters, without their comments
      local cbs = sup.callbacks(s, req.id)
      local approved = cbs[#cbs].body
      for _, cb in ipairs(cbs) do
        if cb.body.event_type == "request_approved" then approved = cb.body end
      end
      assert.equal("request_approved", approved.event_type)
      assert.equal("operator:carol", approved.data.approved_by)
      assert.equal(2, approved.data.approvals_required)
      assert.equal(2, #approved.data.approvals)
      assert.equal("operator:bob", approved.data.approvals[1].principal)
      assert.equal("operator:carol", approved.data.approvals[2].principal)
      assert.is_string(approved.data.approvals[1].at)
      assert.is_nil(approved.data.approvals[1].comment)
      for _, cb in ipairs(cbs) do assert.is_nil(cb.payload:find("checked the invoice", 1, true)) end
    end)
  end)

  describe("risk_controls", function()
    it("refuses at create with invalid_intent naming the rule, comparing exact decimals", function()
      local e = sup.refused("invalid_intent", create, LIMITED, { asset = "USDC", amount = "1000.000000000000000001" })
      assert.matches("risk_controls.max_amount", e.message, 1, true)
      e = sup.refused("invalid_intent", create, LIMITED, { asset = "DOGE", amount = "1" })
      assert.matches("risk_controls.allowed_assets", e.message, 1, true)
      e = sup.refused("invalid_intent", create, LIMITED, { asset = "USDC", amount = "0.4999" })
      assert.matches("risk_controls.min_amount", e.message, 1, true)
      assert.equal("PENDING_APPROVAL", create(LIMITED, { asset = "USDT", amount = "1000.000" }).request_state)
      assert.equal("PENDING_APPROVAL", create(LIMITED, { asset = "USDT", amount = "0.50" }).request_state)
    end)

    it("checks again at approval", function()
      local req = create(LIMITED, { asset = "USDC", amount = "10" })
      s:query([[UPDATE movement_requests SET intent = jsonb_set(intent, '{amount}', '"999999999"')
                 WHERE id = $1::uuid]], req.id)
      local e = sup.refused("invalid_intent", requests.approve, s, req.id, BOB)
      assert.matches("risk_controls.max_amount", e.message, 1, true)
      assert.equal("PENDING_APPROVAL", state(req.id))
    end)

    it("refuses unknown keys and malformed values when templates load", function()
      local templates = require "qtg.templates"
      for _, case in ipairs({
        { { max_amout = "5" }, "unknown key \"max_amout\"" },
        { { max_amount = 5 }, "risk_controls.max_amount\" must be a non-negative decimal string" },
        { { max_amount = "1e9" }, "risk_controls.max_amount\" must be a non-negative decimal string" },
        { { allowed_assets = "USDC" }, "risk_controls.allowed_assets\" must be an array" },
        { { allowed_chain_ids = { 0 } }, "risk_controls.allowed_chain_ids\" must be an array" },
        { { min_amount = "10", max_amount = "1" }, "min_amount\" exceeds max_amount" },
      }) do
        local doc = sup.doc("spec_appr_bad_rc", { { "a", "action", "withdrawal", { sim = {} } } }, nil,
          { risk_controls = case[1] })
        local c, errs = templates.validate_and_compile(doc, "bad.json")
        assert.is_nil(c)
        assert.truthy(table.concat(errs, "\n"):find(case[2], 1, true), table.concat(errs, "\n"))
      end
    end)
  end)

  describe("principals and quorum", function()
    it("never lets the initiator approve, nor a principal without the role", function()
      local req = create()
      local e = sup.refused("forbidden", requests.approve, s, req.id, ALICE)
      assert.matches("four eyes", e.message, 1, true)
      sup.refused("forbidden", requests.approve, s, req.id, ERIN)
      sup.refused("forbidden", requests.approve, s, req.id, READER)
      sup.refused("forbidden", requests.create, s, { template_key = T, intent = sup.INTENT,
        idempotency_key = sup.uid("i") }, READER)
      sup.refused("forbidden", requests.cancel, s, req.id, READER, "no")
      sup.refused("invalid_input", requests.approve, s, req.id, { actor = "operator:x", roles = { "root" } })
      assert.equal("PENDING_APPROVAL", state(req.id))
      assert.equal(0, #s:query("SELECT 1 FROM request_approvals WHERE request_id = $1::uuid", req.id))
      -- an unmapped console uid reads only
      local p = require("qtg.principals").resolve_uid(s, 4242)
      assert.equal("console:4242", p.actor)
      sup.refused("forbidden", requests.approve, s, req.id, p)
    end)

    it("needs 2 distinct approvers from 100000, refuses a second vote by the same one", function()
      local req = create(T, { asset = "USDC", amount = "100000" })
      assert.equal(2, req.approvals_required)
      requests.approve(s, req.id, BOB)
      assert.equal("PENDING_APPROVAL", state(req.id))
      local e = sup.refused("illegal_transition", requests.approve, s, req.id, BOB)
      assert.matches("already decided", e.message, 1, true)
      local st = requests.approval_status(s, req.id)
      assert.equal(1, st.still_needed)
      assert.equal("operator:bob", st.approved_by[1].principal)
      assert.equal("two_approvers_from_100k", st.rule)
      requests.approve(s, req.id, CAROL)
      local r = sup.request(s, req.id)
      assert.equal("APPROVED", r.request_state)
      assert.equal("operator:carol", r.approved_by)
      assert.equal("READY", sup.nodes(s, req.id).a.node_state)
      -- the signer's rule holds: distinct approvals of the stored digest >= approvals_required
      local n = s:query([[SELECT count(DISTINCT principal)::int AS n FROM request_approvals a
                           JOIN movement_requests r ON r.id = a.request_id
                          WHERE a.request_id = $1::uuid AND a.decision = 'approve'
                            AND a.approval_digest = qtg_approval_digest(r)]], req.id)[1].n
      assert.is_true(n >= r.approvals_required)
      assert.equal(0, #s:query("SELECT 1 FROM request_approvals WHERE request_id = $1::uuid AND decision = 'reject'", req.id))
    end)

    it("refuses an approver without a role the rule names", function()
      sup.with_policy({ rules = { { name = "admins_only", match = {}, action = P.require{ approvals = 1, roles = { "admin" } } } } }, function()
        local req = create()
        local e = sup.refused("forbidden", requests.approve, s, req.id, BOB)
        assert.matches("admins_only", e.message, 1, true)
        -- nor reject it: a rejection takes the roles an approval takes
        e = sup.refused("forbidden", requests.reject, s, req.id, BOB, "not mine to judge")
        assert.equal("operator:bob may not reject request " .. req.id .. ": rule admins_only needs one of the roles admin",
          e.message)
        assert.equal("PENDING_APPROVAL", state(req.id))
        requests.approve(s, req.id, DAVE)
        assert.equal("APPROVED", state(req.id))
        local rejected = create()
        requests.reject(s, rejected.id, DAVE, "unknown beneficiary")
        assert.equal("REJECTED", state(rejected.id))
      end)
    end)

    it("ends the request at any rejection, even with a partial quorum", function()
      local req = create(T, { asset = "USDC", amount = "500000" })
      requests.approve(s, req.id, BOB)
      requests.reject(s, req.id, CAROL, "unknown beneficiary")
      assert.equal("REJECTED", state(req.id))
      sup.refused("illegal_transition", requests.approve, s, req.id, DAVE)
      local rows = s:query("SELECT principal, decision, comment FROM request_approvals WHERE request_id = $1::uuid ORDER BY id", req.id)
      assert.equal(2, #rows)
      assert.equal("reject", rows[2].decision)
      assert.equal("unknown beneficiary", rows[2].comment)
    end)

    it("expires a request whose quorum was not met within the approval TTL", function()
      local req = create(T, { asset = "USDC", amount = "500000" })
      requests.approve(s, req.id, BOB)
      s:query("UPDATE movement_requests SET expires_at = now() - interval '1 second' WHERE id = $1::uuid", req.id)
      sup.refused("illegal_transition", requests.approve, s, req.id, CAROL)
      assert.is_true(sup.tick("expiration_checker") >= 1)
      assert.equal("EXPIRED", state(req.id))
      assert.equal(1, #s:query("SELECT 1 FROM request_approvals WHERE request_id = $1::uuid", req.id))
    end)

    it("refuses an approval when the request changed since the first approval", function()
      local req = create(T, { asset = "USDC", amount = "500000" })
      requests.approve(s, req.id, BOB)
      s:query([[UPDATE movement_requests SET intent = jsonb_set(intent, '{amount}', '"600000"')
                 WHERE id = $1::uuid]], req.id)
      local e = sup.refused("illegal_transition", requests.approve, s, req.id, CAROL)
      assert.matches("changed since its first approval", e.message, 1, true)
      assert.equal("PENDING_APPROVAL", state(req.id))
    end)
  end)

  describe("the policy's rules", function()
    it("tiers: the shipped policy asks 1 approver below 100000 and 2 from it", function()
      assert.equal(1, create(T, { asset = "USDC", amount = "99999.99" }).approvals_required)
      assert.equal(2, create(T, { asset = "USDC", amount = "100000.00" }).approvals_required)
    end)

    it("allow: approved by the policy itself, recorded as such", function()
      sup.with_policy({ rules = { { name = "petty_cash", match = { amount_below = "10" }, action = P.allow() },
                              { name = "rest", match = {}, action = P.require{ approvals = 1, roles = { "approve" } } } } }, function()
        local req = create(T, { asset = "USDC", amount = "9.99" })
        assert.equal("APPROVED", req.request_state)
        assert.equal("policy:petty_cash", req.approved_by)
        assert.equal(0, req.approvals_required)
        assert.equal("petty_cash", req.approval_policy.rule)
        assert.is_string(req.approval_digest)
        assert.equal("PENDING_APPROVAL", create(T, { asset = "USDC", amount = "10" }).request_state)
      end)
    end)

    it("block and default deny refuse at create, naming the rule", function()
      sup.with_policy({ rules = { { name = "no_doge", match = { asset = "DOGE" }, action = P.block{ reason = "not a treasury asset" } },
                              { name = "usdc_only", match = { asset = "USDC" }, action = P.require{ approvals = 1, roles = { "approve" } } } } }, function()
        local e = sup.refused("invalid_intent", create, T, { asset = "DOGE", amount = "1" })
        assert.matches("no_doge", e.message, 1, true)
        assert.matches("not a treasury asset", e.message, 1, true)
        e = sup.refused("invalid_intent", create, T, { asset = "USDT", amount = "1" })
        assert.matches("default_deny", e.message, 1, true)
        assert.equal("PENDING_APPROVAL", create(T, { asset = "USDC", amount = "1" }).request_state)
      end)
    end)

    it("initiator and its role", function()
      sup.with_policy({ rules = { { name = "erin_needs_two", match = { initiator = "operator:erin" }, action = P.require{ approvals = 2, roles = { "approve" } } },
                              { name = "admins_alone", match = { initiator_role = "admin" }, action = P.allow() },
                              { name = "rest", match = {}, action = P.require{ approvals = 1, roles = { "approve" } } } } }, function()
        assert.equal(2, create(T, nil, ERIN).approvals_required)
        assert.equal("APPROVED", create(T, nil, who("root", { "operate", "admin" })).request_state)
        assert.equal(1, create(T, nil, ALICE).approvals_required)
      end)
    end)

    it("allowlist: a destination outside the address book needs more", function()
      local dest_in, dest_out = "0x" .. string.rep("a1", 20), "0x" .. string.rep("b2", 20)
      local book = require "qtg.address_book"
      local c = book.propose(s, { action = "add", asset = "USDC", chain = "ethereum", address = dest_in, label = "cold wallet" },
        who("adm1", { "admin" }))
      book.vote(s, c.id, who("adm2", { "admin" }), "approve")
      book.vote(s, c.id, who("adm3", { "admin" }), "approve")
      sup.with_policy({ rules = { { name = "known", match = { destination_in = "address_book" }, action = P.require{ approvals = 1, roles = { "approve" } } },
                              { name = "unknown", match = { destination_not_in = "address_book" }, action = P.require{ approvals = 3, roles = { "approve" } } } } }, function()
        local a = create(T, { asset = "USDC", amount = "5", destination = dest_in:upper():gsub("^0X", "0x"), destination_chain = "ethereum" })
        assert.equal(1, a.approvals_required)
        assert.equal("cold wallet", a.approval_policy.inputs.address_label)
        assert.equal(3, create(T, { asset = "USDC", amount = "5", destination = dest_out, destination_chain = "ethereum" }).approvals_required)
        -- the same address on another chain is not in the book
        assert.equal(3, create(T, { asset = "USDC", amount = "5", destination = dest_in, destination_chain = "base" }).approvals_required)
      end)
    end)

    it("velocity: a request that would now cross the window waits, refused at approval", function()
      local asset = "V" .. sup.uid("a"):upper():gsub("[^%w]", "")
      sup.with_policy({ rules = { { name = "day_cap", match = { velocity = { window_seconds = 86400, over = "1000" } },
                                action = P.block{ reason = "over 1000 a day" } },
                              { name = "rest", match = {}, action = P.require{ approvals = 1, roles = { "approve" } } } } }, function()
        local r1 = create(T, { asset = asset, amount = "600" })
        local r2 = create(T, { asset = asset, amount = "600" })
        assert.equal("rest", r2.approval_policy.rule)
        requests.approve(s, r1.id, BOB)
        assert.equal("APPROVED", state(r1.id))
        local e = sup.refused("invalid_intent", requests.approve, s, r2.id, BOB)
        assert.matches("day_cap", e.message, 1, true)
        local r = sup.request(s, r2.id)
        assert.equal("PENDING_APPROVAL", r.request_state)
        assert.equal("day_cap", r.approval_policy.rule)
        assert.equal("600", r.approval_policy.inputs.velocity.day_cap.approved_in_window)
        assert.equal(1, #s:query("SELECT 1 FROM audit_outbox WHERE request_id = $1::uuid AND action = 'request.approval_refused'", r2.id))
        -- a new request crossing it is refused at create
        sup.refused("invalid_intent", create, T, { asset = asset, amount = "401" })
        assert.equal("PENDING_APPROVAL", create(T, { asset = asset, amount = "400" }).request_state)
      end)
    end)

    it("velocity: two processes approving at once cannot both cross the window", function()
      local common = require "spec.lua.support.common"
      local dir = common.tmpdir("approvals")
      local asset = "W" .. sup.uid("a"):upper():gsub("[^%w]", "")
      local ids = {}
      sup.with_policy({ rules = { { name = "day_cap", match = { velocity = { window_seconds = 86400, over = "1000" } },
                                action = P.block{ reason = "over 1000 a day" } },
                              { name = "rest", match = {}, action = P.require{ approvals = 1, roles = { "approve" } } } } }, function()
        ids[1] = create(T, { asset = asset, amount = "600" }).id
        ids[2] = create(T, { asset = asset, amount = "600" }).id
      end)
      local env = { MG_NETWORK_CLASS = qtg.settings.network_class, MG_WORKERS_ENABLED = "false" }
      local gate = dir .. "/go"
      local kids = {
        common.start_script(dir, "a", env, "engine/approvals_child.lua", { ids[1], "bob", gate, "0.5" }),
        common.start_script(dir, "b", env, "engine/approvals_child.lua", { ids[2], "carol", gate, "0.5" }),
      }
      qtg.sleep(0.3)
      common.write(gate, "go")
      local approved, refusals = 0, {}
      for _, k in ipairs(kids) do
        local res = common.wait_result(k, 60)
        assert.is_true(res.ok, tostring(res.error))
        if res.approved then approved = approved + 1 else refusals[#refusals + 1] = res.error end
      end
      os.execute("rm -rf " .. common.quote(dir))
      assert.equal(1, approved)
      assert.equal(1, #refusals)
      assert.matches("day_cap", refusals[1], 1, true)
      local states = {}
      for _, id in ipairs(ids) do states[#states + 1] = state(id) end
      table.sort(states)
      assert.same({ "APPROVED", "PENDING_APPROVAL" }, states)
    end)

    it("a rule that raises leaves the request waiting with the error recorded, never approved", function()
      sup.with_policy({ rules = { { name = "buggy", match = { when = function() error("nil index") end }, action = P.allow() } } }, function()
        local req = create()
        assert.equal("PENDING_APPROVAL", req.request_state)
        assert.matches("buggy raised while matching", req.approval_policy.error, 1, true)
        local e = sup.refused("illegal_transition", requests.approve, s, req.id, BOB)
        assert.matches("approval policy failed", e.message, 1, true)
        assert.equal("PENDING_APPROVAL", state(req.id))
        assert.equal(0, #s:query("SELECT 1 FROM request_approvals WHERE request_id = $1::uuid", req.id))
      end)
    end)

    it("a malformed policy is reported and the previous one stays in force", function()
      approvals.policy() -- the shipped one, validated
      for _, bad in ipairs({
        { rules = {} },
        { rules = { { name = "x", match = { bogus = 1 }, action = P.allow() } } },
        { rules = { { name = "x", match = {}, action = P.require{ approvals = 0, roles = { "approve" } } } } },
        { rules = { { name = "x", match = { amount_below = 5 }, action = P.allow() } } },
        { rules = { { name = "x", match = {}, action = "allow" } } },
      }) do
        sup.with_policy(bad, function()
          local p, err = approvals.load()
          assert.is_nil(p)
          assert.matches("malformed", err, 1, true)
          -- the shipped policy still decides
          assert.equal(2, create(T, { asset = "USDC", amount = "100000" }).approvals_required)
        end)
      end
    end)

    it("an edit and reload changes the next request, not approved ones", function()
      local before = create()
      requests.approve(s, before.id, BOB)
      local pending = create()
      sup.with_policy({ rules = { { name = "three_now", match = {}, action = P.require{ approvals = 3, roles = { "approve" } } } } }, function()
        local after = create()
        assert.equal(3, after.approvals_required)
        local r = sup.request(s, before.id)
        assert.equal("APPROVED", r.request_state)
        assert.equal(1, r.approvals_required)
        -- re-evaluated at approval: the pending one now waits for three
        requests.approve(s, pending.id, BOB)
        assert.equal("PENDING_APPROVAL", state(pending.id))
        assert.equal(3, sup.request(s, pending.id).approvals_required)
      end)
    end)
  end)

  describe("the console", function()
    it("acts as the operator of the session's uid; an unmapped uid reads only once operators exist", function()
      local commands = require "qtg.console.commands"
      local uid_ok, uid_other = 900000 + math.random(1, 9999), 800000 + math.random(1, 9999)
      local lines = {}
      local cmds = commands.bind({ actor = "console:" .. uid_ok, print = function(l) lines[#lines + 1] = l end })
      local stranger = commands.bind({ actor = "console:" .. uid_other, print = function() end })
      local ok, err = pcall(function()
        local principals = require "qtg.principals"
        principals.add(s, "spec-approver", uid_ok, { "read", "approve" }, "system:spec")
        assert.equal("operator:spec-approver", cmds.whoami().actor)
        assert.equal("console:" .. uid_other, stranger.whoami().actor)
        assert.equal("read", stranger.whoami().roles)
        local req = create(T, { asset = "USDC", amount = "100000" })
        local inbox = cmds.approvals({ pending = true })
        local found = false
        for _, r in ipairs(inbox) do if r.id == req.id then found = true end end
        assert.is_true(found)
        local e = select(2, pcall(stranger.approve, req.id))
        assert.equal("forbidden", e.kind)
        local detail = cmds.approve(req.id, "looks right")
        assert.equal(1, detail.approvals.still_needed)
        assert.truthy(detail.approvals.signer_may_sign:find("what qtg's signer may sign", 1, true),
          tostring(detail.approvals.signer_may_sign))
        assert.equal("operator:spec-approver", detail.approvals.votes[1].principal)
        assert.equal("looks right", detail.approvals.votes[1].comment)
        -- voted: out of my inbox
        for _, r in ipairs(cmds.approvals({ pending = true })) do assert.not_equal(req.id, r.id) end
        e = select(2, pcall(cmds.add_operator, "x-" .. uid_ok, uid_ok + 1, { "read" }))
        assert.equal("forbidden", e.kind)
        -- the runtime's and the signer roster's commands ask their roles
        -- too: operate to redeliver and to fill a nonce, admin for the rest; the reader and the
        -- approver hold neither
        local address = "0x" .. string.rep("1", 40)
        for _, c in ipairs({
          { "redeliver", { 1 }, "operate" },
          { "fill_nonce", { 31337, address, 0 }, "operate" },
          { "set_expected_signer", { "evm_hot", address }, "admin" },
          { "reload", {}, "admin" },
          { "sql_write", { "UPDATE operators SET roles = roles WHERE false" }, "admin" },
        }) do
          for who, bound in pairs({ reader = stranger, approver = cmds }) do
            e = select(2, pcall(bound[c[1]], unpack(c[2])))
            assert.equal("forbidden", type(e) == "table" and e.kind, who .. " " .. c[1] .. ": " .. tostring(e))
            assert.truthy(tostring(e.message):find("needs the " .. c[3] .. " role", 1, true), tostring(e.message))
          end
        end
      end)
      s:query("DELETE FROM operators WHERE uid = $1", uid_ok)
      if not ok then error(err, 0) end
    end)
  end)

  describe("qtgd operators", function()
    it("adds, lists and removes operators, audited; refuses bad input with its usage", function()
      local host = require "spec.lua.support.host"
      local bin = common.quote(host.bin)
      local env = { MG_DATABASE_URL = os.getenv("MG_DATABASE_URL") or "" }
      local name, uid = "cli-op-" .. math.random(1000, 9999), tostring(700000 + math.random(1, 9999))
      local ok, err = pcall(function()
        local rc, out = host.run(env, { bin, "operators", "add", name, uid, "read,approve" })
        assert.equal(0, rc, out)
        assert.matches("operator " .. name .. ": uid " .. uid, out, 1, true)
        rc, out = host.run(env, { bin, "operators", "list" })
        assert.equal(0, rc, out)
        assert.matches(name, out, 1, true)
        rc, out = host.run(env, { bin, "operators", "add", name .. "x", uid, "read" })
        assert.equal(1, rc, out)
        assert.matches("already enrolled", out, 1, true)
        rc, out = host.run(env, { bin, "operators", "add", "y" .. name, "12", "read,root" })
        assert.equal(1, rc, out)
        assert.matches("unknown role root", out, 1, true)
        rc, out = host.run(env, { bin, "operators", "add", "z" .. name, "-1", "read" })
        assert.equal(2, rc, out)
        rc, out = host.run(env, { bin, "operators", "frobnicate" })
        assert.equal(2, rc, out)
        assert.matches("usage: qtgd operators", out, 1, true)
        rc, out = host.run(env, { bin, "operators", "remove", name })
        assert.equal(0, rc, out)
        assert.equal(0, #s:query("SELECT 1 FROM operators WHERE name = $1", name))
        assert.equal(2, #s:query([[SELECT 1 FROM audit_outbox WHERE entity_type = 'operator' AND entity_id = $1
                                    AND actor = 'system:qtgd-operators']], name)
          + #s:query([[SELECT 1 FROM audit_events WHERE entity_type = 'operator' AND entity_id = $1]], name))
      end)
      s:query("DELETE FROM operators WHERE name = $1", name)
      if not ok then error(err, 0) end
    end)
  end)

  describe("the address book", function()
    it("takes a change into effect only once its quorum of admins approved it", function()
      local book = require "qtg.address_book"
      local addr = "0x" .. string.rep("c3", 20)
      local a1, a2, a3 = who("ab1", { "admin" }), who("ab2", { "admin" }), who("ab3", { "admin" })
      sup.refused("forbidden", book.propose, s, { action = "add", asset = "USDT", chain = "1", address = addr, label = "x" }, BOB)
      local c = book.propose(s, { action = "add", asset = "USDT", chain = "1", address = addr, label = "ops" }, a1)
      assert.equal(2, c.approvals_required)
      sup.refused("illegal_transition", book.propose, s, { action = "add", asset = "USDT", chain = "1", address = addr, label = "y" }, a2)
      sup.refused("forbidden", book.vote, s, c.id, a1, "approve")
      local function present()
        return #s:query("SELECT 1 FROM address_book WHERE asset = 'USDT' AND chain = '1' AND address = $1", addr) == 1
      end
      book.vote(s, c.id, a2, "approve")
      assert.is_false(present())
      sup.refused("illegal_transition", book.vote, s, c.id, a2, "approve")
      local done = book.vote(s, c.id, a3, "approve")
      assert.equal("APPLIED", done.state)
      assert.is_true(present())
      -- removal: one rejection ends it, the entry stays
      local r = book.propose(s, { action = "remove", asset = "USDT", chain = "1", address = addr }, a2)
      book.vote(s, r.id, a1, "reject", "still in use")
      assert.is_true(present())
      assert.equal("REJECTED", s:query("SELECT state FROM address_book_changes WHERE id = $1", r.id)[1].state)
      assert.is_true(#s:query("SELECT 1 FROM audit_outbox WHERE entity_type = 'address_book_change' AND entity_id = $1", tostring(c.id)) >= 4)
    end)

    it("counts an admin's approval as the admin is when the quorum is counted", function()
      local book = require "qtg.address_book"
      local principals = require "qtg.principals"
      local addr = "0x" .. qtg.crypto.hex(qtg.crypto.random_bytes(20))
      local key = { asset = "USDT", chain = "1", address = addr }
      local gone, demoted = who("ab_gone", { "admin" }), who("ab_demoted", { "admin" })
      enrol(gone); enrol(demoted)
      local c = book.propose(s, { action = "add", asset = "USDT", chain = "1", address = addr, label = "ops" }, who("ab1", { "admin" }))
      assert.equal(2, c.approvals_required)
      assert.equal(1, book.vote(s, c.id, gone, "approve").approvals)
      -- removed: its vote no longer counts, nor once enrolled again
      principals.remove(s, "ab_gone", "system:spec")
      local second = book.vote(s, c.id, demoted, "approve")
      assert.same({ "PENDING", 1 }, { second.state, second.approvals })
      enrol(gone)
      -- demoted to read: neither
      s:query("UPDATE operators SET roles = '{read}' WHERE name = 'ab_demoted'")
      local third = book.vote(s, c.id, who("ab3", { "admin" }), "approve")
      assert.same({ "PENDING", 1 }, { third.state, third.approvals })
      assert.is_nil(book.entry(s, key))
      local fourth = book.vote(s, c.id, who("ab2", { "admin" }), "approve")
      assert.same({ "APPLIED", 2 }, { fourth.state, fourth.approvals })
      assert.is_not_nil(book.entry(s, key))
      s:query("DELETE FROM operators WHERE name IN ('ab_demoted', 'ab_gone')")
    end)

    it("keys an address as requests match it: one entry and one pending change, whatever the spelling", function()
      local book = require "qtg.address_book"
      local hex = qtg.crypto.hex(qtg.crypto.random_bytes(20))
      local upper, lower = "0x" .. hex:upper(), "0x" .. hex
      local a1, a2, a3 = who("ab1", { "admin" }), who("ab2", { "admin" }), who("ab3", { "admin" })
      local function rows() return s:query("SELECT * FROM address_book WHERE lower(address) = $1", lower) end
      local function matched()
        local t = { chain = "1", destinations = { lower } }
        return approvals.book_entries(s, "usdt", t)[lower] ~= nil
      end
      -- a change stores the asset and the chain canonical, the address as proposed
      local c = book.propose(s, { action = "add", asset = "usdt", chain = "01", address = upper, label = "ops" }, a1)
      assert.same({ "USDT", "1", upper }, { c.asset, c.chain, c.address })
      -- a second add of it in any other spelling is the same pending change
      for _, other in ipairs({ { "USDT", "1", lower }, { "Usdt", 1, upper }, { "usdt", "001", "0x" .. hex:sub(1, 20):upper() .. hex:sub(21) } }) do
        sup.refused("illegal_transition", book.propose, s,
          { action = "add", asset = other[1], chain = other[2], address = other[3], label = "twin" }, a2)
      end
      book.vote(s, c.id, a2, "approve")
      assert.equal("APPLIED", book.vote(s, c.id, a3, "approve").state)
      assert.equal(1, #rows())
      assert.is_true(matched())
      sup.refused("illegal_transition", book.propose, s,
        { action = "add", asset = "USDT", chain = 1, address = lower, label = "twin" }, a2)
      -- written past qtg.address_book, a second spelling is refused by the database
      assert.has_error(function()
        s:query([[INSERT INTO address_book (asset, chain, address, label, change_id) VALUES ('usdt', '0001', $1, 'twin', 0)]], lower)
      end)
      assert.has_error(function()
        s:query([[INSERT INTO address_book_changes (action, asset, chain, address, approvals_required, proposed_by)
                  VALUES ('remove', 'Usdt', '1', $1, 2, 'system:spec'), ('remove', 'USDT', '01', $2, 2, 'system:spec')]], lower, upper)
      end)
      assert.equal(1, #rows())
      -- a removal in another spelling removes the entry, and requests no longer match it
      local r = book.propose(s, { action = "remove", asset = "Usdt", chain = 1, address = lower }, a2)
      assert.equal(r.id, book.pending(s, { asset = "usdt", chain = "01", address = upper }).id)
      book.vote(s, r.id, a1, "approve")
      assert.equal("APPLIED", book.vote(s, r.id, a3, "approve").state)
      assert.equal(0, #rows())
      assert.is_false(matched())
      assert.is_nil(book.entry(s, { asset = "USDT", chain = "1", address = upper }))
      -- a chain that is neither an integer >= 0 nor a name is refused
      for _, bad in ipairs({ -1, 1.5, 2^53, true, {}, "" }) do
        sup.refused("invalid_input", book.propose, s,
          { action = "add", asset = "USDT", chain = bad, address = lower, label = "x" }, a1)
      end
    end)

    it("sql/0197 stops on an address already in two spellings, and names them, until admins keep one", function()
      local db = "qtg_book_" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
      local url = common.database_url(db)
      local dir = common.tmpdir("qtg-book-migrate")
      s:exec("CREATE DATABASE " .. db)
      local ok, err = pcall(function()
        local q = common.quote
        local out, rc = common.sh(("cp %s/sql/*.sql %s/ && rm %s/0197_*.sql"):format(q(common.root()), q(dir), q(dir)))
        assert(rc == 0, out)
        local function migrate(d)
          local o, c = common.sh(("env %s %s migrate %s"):format(common.env_words(common.base_env({ MG_DATABASE_URL = url })),
            q(common.bin()), d and q(d) or ""))
          return c, o
        end
        local function psql(sql) common.psql(url, sql) end
        rc, out = migrate(dir)
        assert.equal(0, rc, out)
        psql([[INSERT INTO address_book (asset, chain, address, label, change_id)
               VALUES ('USDT', '1', '0xAbC0000000000000000000000000000000000001', 'ops', 1),
                      ('usdt', '01', '0xabc0000000000000000000000000000000000001', 'ops twin', 2);
               INSERT INTO address_book_changes (action, asset, chain, address, label, approvals_required, proposed_by)
               VALUES ('add', 'ETH', 'mainnet', '0xdef0000000000000000000000000000000000002', 'a', 2, 'operator:x'),
                      ('add', 'eth', 'MainNet', '0xDEF0000000000000000000000000000000000002', 'b', 2, 'operator:y')]])
        rc, out = migrate()
        assert.not_equal(0, rc, out)
        assert.matches("0197_address_book_one_spelling.sql", out, 1, true)
        assert.matches("the address book holds one address in several spellings: USDT 0xabc0000000000000000000000000000000000001 on 1 (USDT/1/0xAbC0000000000000000000000000000000000001, usdt/01/0xabc0000000000000000000000000000000000001)", out, 1, true)
        assert.matches("hint: the admins choose the spelling to keep", out, 1, true)
        psql("DELETE FROM address_book WHERE change_id = 2")
        rc, out = migrate()
        assert.not_equal(0, rc, out)
        assert.matches("several address book changes of one address are pending: ETH 0xdef0000000000000000000000000000000000002 on mainnet (changes 1, 2)", out, 1, true)
        assert.matches("hint: reject all but one", out, 1, true)
        psql("UPDATE address_book_changes SET state = 'REJECTED', decided_at = now() WHERE id = 2")
        rc, out = migrate()
        assert.equal(0, rc, out)
        psql([[DO $$ BEGIN
                 INSERT INTO address_book (asset, chain, address, label, change_id)
                 VALUES ('Usdt', '1', '0xABC0000000000000000000000000000000000001', 'third', 3);
                 RAISE EXCEPTION 'a third spelling was accepted';
               EXCEPTION WHEN unique_violation THEN NULL; END $$]])
      end)
      s:exec("DROP DATABASE IF EXISTS " .. db .. " WITH (FORCE)")
      os.execute("rm -rf " .. common.quote(dir))
      if not ok then error(err, 0) end
    end)
  end)

  -- The security review's findings, each with its attacker's variants.
  describe("the security review", function()
    local function three_ways(fn)
      sup.with_policy({ rules = {
        { name = "eth_three", match = { asset = "ETH", amount_at_least = "10" }, action = P.require{ approvals = 3, roles = { "approve" } } },
        { name = "usdt_two", match = { asset = { "usdt" }, amount_at_least = "10" }, action = P.require{ approvals = 2, roles = { "approve" } } },
        { name = "rest", match = {}, action = P.require{ approvals = 1, roles = { "approve" } } } } }, fn)
    end

    it("asset case: a rule and allowed_assets match every spelling of the asset", function()
      three_ways(function()
        for _, a in ipairs({ "ETH", "eth", "Eth", "eTh" }) do
          assert.equal(3, create(T, { asset = a, amount = "10" }).approvals_required, a)
        end
        -- a rule written in lower case matches the upper-case spelling
        assert.equal(2, create(T, { asset = "USDT", amount = "10" }).approvals_required)
        assert.equal(2, create(T, { asset = "uSdT", amount = "10" }).approvals_required)
        assert.equal(1, create(T, { asset = "eth", amount = "9.99" }).approvals_required)
        -- the stored intent keeps its spelling: the digest covers it as sent
        assert.equal("eth", create(T, { asset = "eth", amount = "1" }).intent.asset)
      end)
      assert.equal("PENDING_APPROVAL", create(LIMITED, { asset = "usdc", amount = "5" }).request_state)
      local e = sup.refused("invalid_intent", create, LIMITED, { asset = "doge", amount = "5" })
      assert.matches("risk_controls.allowed_assets", e.message, 1, true)
    end)

    it("amount: only a decimal string is taken; an unreadable amount already stored fails closed", function()
      three_ways(function()
        -- every rule about money reads intent.amount as a decimal string
        for _, bad in ipairs({ 150000, 10.5, "1e5", "0x10", "-5", " 10", "10.", ".5", "", cjson.null, true, {} }) do
          local e = sup.refused("invalid_intent", create, T, { asset = "ETH", amount = bad })
          assert.matches("intent.amount must be a decimal string", e.message, 1, true)
        end
        assert.equal(3, create(T, { asset = "ETH", amount = "150000" }).approvals_required)
        -- no amount at all moves nothing: no amount rule holds
        local NO_AMOUNT = "spec_appr_no_amount"
        sup.load_doc(s, sup.doc(NO_AMOUNT, { { "a", "action", "withdrawal", { sim = { observes = 0 } } } }, nil,
          { intent = { required = { "asset" } } }))
        assert.equal(1, create(NO_AMOUNT, { asset = "ETH" }).approvals_required)
        -- a request made before create refused such amounts, written here
        -- past create: amount_at_least holds for it, amount_below does not
        local req = create(T, { asset = "ETH", amount = "1" })
        assert.equal(1, req.approvals_required)
        s:query([[UPDATE movement_requests SET intent = jsonb_set(intent, '{amount}', '150000'::jsonb) WHERE id = $1::uuid]], req.id)
        sup.refused("forbidden", requests.approve, s, req.id, ERIN)
        requests.approve(s, req.id, BOB)
        local row = s:query("SELECT request_state, approvals_required, approval_policy->>'rule' AS rule FROM movement_requests WHERE id = $1::uuid", req.id)[1]
        assert.same({ "PENDING_APPROVAL", 3, "eth_three" }, { row.request_state, row.approvals_required, row.rule })
      end)
      sup.with_policy({ rules = { { name = "small", match = { amount_below = "100" }, action = P.allow() },
                                { name = "cap", match = { velocity = { window_seconds = 86400, over = "1000" } }, action = P.block{ reason = "over" } },
                                { name = "rest", match = {}, action = P.require{ approvals = 1, roles = { "approve" } } } } }, function()
        local req = create(T, { asset = "ETH", amount = "1" })
        assert.equal("APPROVED", req.request_state)
        local held = create(T, { asset = "ETH", amount = "500" })
        assert.equal("PENDING_APPROVAL", held.request_state)
        s:query([[UPDATE movement_requests SET intent = jsonb_set(intent, '{amount}', '5'::jsonb) WHERE id = $1::uuid]], held.id)
        -- neither "small" (an amount below 100) nor past "cap": the velocity limit holds
        local e = sup.refused("invalid_intent", requests.approve, s, held.id, BOB)
        assert.matches("cap", e.message, 1, true)
      end)
    end)

    it("a removal committing during a vote waits for it; a vote during a removal waits and is refused", function()
      local principals = require "qtg.principals"
      local s2 = qtg.db.acquire()
      local ok, err = pcall(function()
        local voter = who("racer", { "read", "approve" })
        -- the vote first: the removal waits until the vote commits, and applies after it
        enrol(voter)
        local req = create()
        s:begin()
        requests.approve(s, req.id, voter)
        local pid = s:query("SELECT pg_backend_pid() AS p")[1].p
        local removal = qtg.spawn(function() return principals.remove(s2, "racer", "system:spec") end)
        common.wait_for(function() return common.waiting_on(pid) > 0 end, 10, "the removal waiting on the vote")
        s:commit()
        local done, why = qtg.join(removal)
        assert.is_true(done, tostring(why))
        assert.equal("APPROVED", state(req.id))
        -- the removal first: the vote waits until it commits, then is refused
        local first = req   -- it holds racer's vote
        enrol(voter)
        req = create()
        s2:begin()
        principals.remove(s2, "racer", "system:spec")
        -- a reader of the approvals (a GET, req() in the console) takes no
        -- lock: it does not wait for the removal
        s:exec("SET lock_timeout = '2s'")
        local shown_ok, shown = pcall(requests.approval_status, s, first.id)
        s:exec("RESET lock_timeout")
        assert.is_true(shown_ok, tostring(type(shown) == "table" and shown.message or shown))
        local pid2 = s2:query("SELECT pg_backend_pid() AS p")[1].p
        local vote = qtg.spawn(function() return requests.approve(s, req.id, voter) end)
        common.wait_for(function() return common.waiting_on(pid2) > 0 end, 10, "the vote waiting on the removal")
        s2:commit()
        local voted, verr = qtg.join(vote)
        assert.is_false(voted)
        assert.equal("forbidden", verr.kind, tostring(verr))
        assert.equal("PENDING_APPROVAL", state(req.id))
      end)
      if s2:in_transaction() then s2:rollback() end
      s2:release()
      if not ok then error(err, 0) end
    end)

    it("velocity: a request cancelled after one of its nodes was submitted still counts", function()
      local K = "spec_appr_pay_confirm"
      sup.load_doc(s, sup.doc(K, {
        { "pay", "action", "withdrawal", { sim = { observes = 0, side_effect = true } } },
        { "confirm", "manual", "manual_confirmation", { required_inputs = { "desk_reference" } } } },
        { { "pay", "confirm" } }))
      local asset = "VX" .. sup.uid("a"):upper():gsub("[^%w]", "")
      sup.with_policy({ rules = {
        { name = "two_past_1000", match = { velocity = { window_seconds = 86400, over = "1000" } },
          action = P.require{ approvals = 2, roles = { "approve" } } },
        { name = "one", match = {}, action = P.require{ approvals = 1, roles = { "approve" } } } } }, function()
        -- cancelled before anything ran: out of the sums
        local idle = create(K, { asset = asset, amount = "900" })
        requests.cancel(s, idle.id, ALICE, "not needed")
        local paid = create(K, { asset = asset, amount = "900" })
        assert.equal(1, paid.approvals_required)
        requests.approve(s, paid.id, BOB)
        sup.drive(s, sup.state_is(paid.id, "WAITING_MANUAL_ACTION"), 20)
        assert.equal("COMPLETED", sup.nodes(s, paid.id).pay.node_state)
        assert.equal(2, create(K, { asset = asset, amount = "900" }).approvals_required)
        -- its maker cancels it with the money gone: the window still holds it
        requests.cancel(s, paid.id, ALICE, "done with it")
        assert.equal("CANCELLED", state(paid.id))
        assert.equal(2, create(K, { asset = asset, amount = "900" }).approvals_required)
      end)
    end)

    it("asset case: one velocity window for every spelling", function()
      local base = "VC" .. sup.uid("a"):upper():gsub("[^%w]", "")
      sup.with_policy({ rules = { { name = "day_cap", match = { velocity = { window_seconds = 86400, over = "1000" } },
                                action = P.block{ reason = "over 1000 a day" } },
                              { name = "rest", match = {}, action = P.require{ approvals = 1, roles = { "approve" } } } } }, function()
        local r1 = create(T, { asset = base, amount = "600" })
        local r2 = create(T, { asset = base:lower(), amount = "600" })
        requests.approve(s, r1.id, BOB)
        local e = sup.refused("invalid_intent", requests.approve, s, r2.id, BOB)
        assert.matches("day_cap", e.message, 1, true)
        assert.equal("600", sup.request(s, r2.id).approval_policy.inputs.velocity.day_cap.approved_in_window)
        e = sup.refused("invalid_intent", create, T, { asset = base:sub(1, 3):lower() .. base:sub(4), amount = "401" })
        assert.matches("day_cap", e.message, 1, true)
      end)
    end)

    -- children: {script, args...} per child; returns their results
    local function race(kids_args, hold)
      local dir = common.tmpdir("approvals")
      local env = { MG_NETWORK_CLASS = qtg.settings.network_class, MG_WORKERS_ENABLED = "false" }
      local gate = dir .. "/go"
      local kids = {}
      for i, a in ipairs(kids_args) do
        local args = { unpack(a, 2) }
        args[#args + 1] = gate
        args[#args + 1] = hold
        kids[i] = common.start_script(dir, "k" .. i, env, a[1], args)
      end
      qtg.sleep(0.3)
      common.write(gate, "go")
      local results = {}
      for i, k in ipairs(kids) do
        results[i] = common.wait_result(k, 60)
        assert.is_true(results[i].ok, tostring(results[i].error))
      end
      os.execute("rm -rf " .. common.quote(dir))
      return results
    end

    it("asset case: two approvals in two processes share one velocity lock whatever the spelling", function()
      local base = "WC" .. sup.uid("a"):upper():gsub("[^%w]", "")
      local ids = {}
      sup.with_policy({ rules = { { name = "day_cap", match = { velocity = { window_seconds = 86400, over = "1000" } },
                                action = P.block{ reason = "over 1000 a day" } },
                              { name = "rest", match = {}, action = P.require{ approvals = 1, roles = { "approve" } } } } }, function()
        ids[1] = create(T, { asset = base, amount = "600" }).id
        ids[2] = create(T, { asset = base:lower(), amount = "600" }).id
      end)
      local res = race({ { "engine/approvals_child.lua", ids[1], "bob" }, { "engine/approvals_child.lua", ids[2], "carol" } }, "0.5")
      local approved = 0
      for _, r in ipairs(res) do if r.approved then approved = approved + 1 end end
      assert.equal(1, approved)
      local states = { state(ids[1]), state(ids[2]) }
      table.sort(states)
      assert.same({ "APPROVED", "PENDING_APPROVAL" }, states)
    end)

    it("create: a request the policy allows takes the velocity lock, so two concurrent creates cannot both be allowed", function()
      for _, spell in ipairs({ function(a) return a end, string.lower }) do
        local base = "XC" .. sup.uid("a"):upper():gsub("[^%w]", "")
        local res = race({ { "engine/approvals_create_child.lua", T, base, "70" },
                           { "engine/approvals_create_child.lua", T, spell(base), "70" } }, "0.5")
        local rows = {}
        for _, r in ipairs(res) do
          assert.is_true(r.created, tostring(r.error))
          local row = s:query([[SELECT request_state, approvals_required, approved_by, approval_policy->>'rule' AS rule
                                  FROM movement_requests WHERE id = $1::uuid]], r.id)[1]
          rows[#rows + 1] = row
        end
        table.sort(rows, function(a, b) return a.request_state < b.request_state end)
        assert.equal("APPROVED", rows[1].request_state)
        assert.equal("policy:petty", rows[1].approved_by)
        assert.equal("PENDING_APPROVAL", rows[2].request_state)
        assert.equal("velocity_two", rows[2].rule)
        assert.equal(2, rows[2].approvals_required)
      end
    end)

    local ADM2 = who("adm2", { "read", "approve", "admin" })

    it("quorum: a rule tightened since the first vote counts only voters holding its roles now", function()
      local req
      sup.with_policy({ rules = { { name = "two", match = {}, action = P.require{ approvals = 2, roles = { "approve" } } } } }, function()
        req = create()
        requests.approve(s, req.id, BOB)
      end)
      sup.with_policy({ rules = { { name = "two_admins", match = {}, action = P.require{ approvals = 2, roles = { "admin" } } } } }, function()
        requests.approve(s, req.id, DAVE)
        assert.equal("PENDING_APPROVAL", state(req.id))
        local st = requests.approval_status(s, req.id)
        assert.equal(1, st.still_needed)
        assert.is_false(st.approved_by[1].counts)
        assert.is_true(st.approved_by[2].counts)
        requests.approve(s, req.id, ADM2)
        assert.equal("APPROVED", state(req.id))
      end)
      local d = s:query([[SELECT detail FROM audit_outbox WHERE request_id = $1::uuid AND action = 'request.approve']], req.id)[1].detail
      assert.equal(2, #d.approvals)
      assert.equal("operator:dave", d.approvals[1].principal)
      assert.equal("operator:adm2", d.approvals[2].principal)
    end)

    it("quorum: a removed or demoted operator's vote no longer counts, nor may it vote", function()
      local principals = require "qtg.principals"
      local ok, err = pcall(function()
        local req = create(T, { asset = "USDC", amount = "100000" })
        requests.approve(s, req.id, BOB)
        principals.remove(s, "bob", "system:spec")
        requests.approve(s, req.id, CAROL)
        assert.equal("PENDING_APPROVAL", state(req.id))
        -- the removed operator's session cannot vote either
        local other = create(T, { asset = "USDC", amount = "100000" })
        local e = sup.refused("forbidden", requests.approve, s, other.id, BOB)
        assert.matches("no enrolled operator", e.message, 1, true)
        -- an operator enrolled again under the name did not cast the vote
        -- made before it: it does not count again
        enrol(BOB)
        local st = requests.approval_status(s, req.id)
        assert.same({ 1, false, true }, { st.still_needed, st.approved_by[1].counts, st.approved_by[2].counts })
        requests.approve(s, req.id, DAVE)
        assert.equal("APPROVED", state(req.id))
        -- demoted: carol's approve role taken away after her vote
        local r2 = create(T, { asset = "USDC", amount = "100000" })
        requests.approve(s, r2.id, CAROL)
        s:query("UPDATE operators SET roles = '{read}' WHERE name = 'carol'")
        requests.approve(s, r2.id, DAVE)
        assert.equal("PENDING_APPROVAL", state(r2.id))
        assert.equal(1, requests.approval_status(s, r2.id).still_needed)
      end)
      enrol(BOB)
      enrol(CAROL)
      if not ok then error(err, 0) end
    end)

    it("quorum: a revoked or expired API token's vote no longer counts", function()
      local tokens = require "qtg.api.tokens"
      for _, ending in ipairs({
        function(name) tokens.revoke(s, name, "system:spec") end,
        function(name) s:query("UPDATE api_tokens SET expires_at = now() - interval '1 second' WHERE name = $1", name) end,
      }) do
        local name = "spec-appr-" .. sup.uid("t"):gsub("[^%w]", "")
        local secret = tokens.create(s, { name = name, roles = { "read", "approve" }, created_by = "system:spec",
                                          network_class = qtg.settings.network_class })
        local client = tokens.authenticate(s, "Bearer " .. secret)
        local req = create(T, { asset = "USDC", amount = "100000" })
        requests.approve(s, req.id, client)
        ending(name)
        if s:query("SELECT 1 FROM api_tokens WHERE name = $1 AND revoked_at IS NOT NULL", name)[1] then
          -- a new token under the revoked one's name did not cast its vote
          tokens.create(s, { name = name, roles = { "read", "approve" }, created_by = "system:spec",
                             network_class = qtg.settings.network_class })
        end
        requests.approve(s, req.id, CAROL)
        assert.equal("PENDING_APPROVAL", state(req.id))
        assert.equal(1, requests.approval_status(s, req.id).still_needed)
        requests.approve(s, req.id, DAVE)
        assert.equal("APPROVED", state(req.id))
      end
    end)

    it("quorum: the initiator's vote never counts, even as a row in the table", function()
      local req = create(T, { asset = "USDC", amount = "100000" })
      s:query([[INSERT INTO request_approvals (request_id, principal, decision, approval_digest)
                SELECT id, created_by, 'approve', qtg_approval_digest(r) FROM movement_requests r WHERE id = $1::uuid]], req.id)
      requests.approve(s, req.id, BOB)
      assert.equal("PENDING_APPROVAL", state(req.id))
      assert.equal(1, requests.approval_status(s, req.id).still_needed)
      requests.approve(s, req.id, CAROL)
      assert.equal("APPROVED", state(req.id))
    end)

    -- Each evm_transfer node pays the intent's amount (the signer signs it
    -- for exactly that), so a plan with two moves twice the amount: the
    -- amount rules and the velocity sums judge what it moves, as the
    -- signer's amount tiers do.  A template that pays 0.6 twice does not
    -- slip under a rule for 1.
    it("judges what a plan that pays twice moves: amount rules and velocity, per destination too", function()
      local dest = "0x" .. string.rep("ab", 20)
      local TWICE, ONCE = "spec_appr_evm_twice", "spec_appr_evm_once"
      sup.load_doc(s, sup.doc(TWICE, { { "transfer", "action", "evm_transfer", { signer_key = "evm_hot" }, executor = "evm_transfer" },
                                       { "again", "action", "evm_transfer", { signer_key = "evm_hot" }, executor = "evm_transfer" } }))
      sup.load_doc(s, sup.doc(ONCE, { { "transfer", "action", "evm_transfer", { signer_key = "evm_hot" }, executor = "evm_transfer" } }))
      local asset = "MV" .. sup.uid("a"):upper():gsub("[^%w]", ""):sub(1, 8)
      local function intent(amount) return { asset = asset, amount = amount, destination = dest, chain_id = 1 } end
      sup.with_policy({ rules = { { name = "large", match = { amount_at_least = "1" }, action = P.require{ approvals = 3, roles = { "approve" } } },
                                  { name = "rest", match = {}, action = P.require{ approvals = 1, roles = { "approve" } } } } }, function()
        local twice = create(TWICE, intent("0.6"))
        assert.equal(3, twice.approvals_required)
        assert.same({ "0.6", "1.2", 2 }, { twice.approval_policy.inputs.amount, twice.approval_policy.inputs.moved_amount,
                                           twice.approval_policy.inputs.paying_nodes })
        assert.equal(3, create(TWICE, intent("0.5")).approvals_required)     -- 1.0: at least 1
        assert.equal(1, create(TWICE, intent("0.49")).approvals_required)
        assert.equal(1, create(ONCE, intent("0.6")).approvals_required)
        assert.equal(1, create(T, { asset = asset, amount = "0.6" }).approvals_required)   -- no paying node: once
      end)
      sup.with_policy({ rules = { { name = "day_cap", match = { velocity = { window_seconds = 86400, over = "1000" } },
                                    action = P.block{ reason = "over 1000 a day" } },
                                  { name = "rest", match = {}, action = P.require{ approvals = 1, roles = { "approve" } } } } }, function()
        -- 600 paid twice is 1200: over the cap by itself
        local e = sup.refused("invalid_intent", create, TWICE, intent("600"))
        assert.matches("day_cap", e.message, 1, true)
        -- 300 paid twice counts 600 in the window: 500 more crosses 1000
        local r1 = create(TWICE, intent("300"))
        requests.approve(s, r1.id, BOB)
        assert.equal("APPROVED", state(r1.id))
        e = sup.refused("invalid_intent", create, ONCE, intent("500"))
        assert.matches("day_cap", e.message, 1, true)
        local r2 = create(ONCE, intent("400"))
        assert.equal("600", r2.approval_policy.inputs.velocity.day_cap.approved_in_window)
      end)
      -- per destination: both nodes pay the one destination, which receives twice
      local dest2 = "0x" .. string.rep("cd", 20)
      local function to2(amount) return { asset = asset .. "P", amount = amount, destination = dest2, chain_id = 1 } end
      sup.with_policy({ rules = { { name = "per_dest", match = { velocity = { window_seconds = 86400, over = "1000",
                                                                             per_destination = true } },
                                    action = P.block{ reason = "over 1000 a day to one destination" } },
                                  { name = "rest", match = {}, action = P.require{ approvals = 1, roles = { "approve" } } } } }, function()
        local e = sup.refused("invalid_intent", create, TWICE, to2("600"))
        assert.matches("per_dest", e.message, 1, true)
        local r1 = create(TWICE, to2("300"))
        requests.approve(s, r1.id, BOB)
        e = sup.refused("invalid_intent", create, ONCE, to2("500"))
        assert.matches("per_dest", e.message, 1, true)
        assert.equal("600", create(ONCE, to2("400")).approval_policy.inputs.velocity.per_dest.approved_in_window)
      end)
    end)

    it("address book: looked up on the chain the executor uses; conflicting chains refused; no chain is not in the book", function()
      local book = require "qtg.address_book"
      local dest = "0x" .. sup.uid("d"):gsub("[^%x]", ""):sub(1, 8) .. string.rep("e5", 16)
      dest = dest:sub(1, 42)
      local c = book.propose(s, { action = "add", asset = "ETH", chain = "1", address = dest, label = "treasury" },
        who("adm1", { "admin" }))
      book.vote(s, c.id, who("adm2", { "admin" }), "approve")
      book.vote(s, c.id, who("adm3", { "admin" }), "approve")
      local EVM, EVM137 = "spec_appr_evm", "spec_appr_evm137"
      sup.load_doc(s, sup.doc(EVM, { { "transfer", "action", "evm_transfer", { signer_key = "evm_hot" }, executor = "evm_transfer" } }))
      sup.load_doc(s, sup.doc(EVM137, { { "transfer", "action", "evm_transfer", { signer_key = "evm_hot", chain_id = 137 }, executor = "evm_transfer" } }))
      sup.with_policy({ rules = { { name = "known", match = { destination_in = "address_book" }, action = P.require{ approvals = 1, roles = { "approve" } } },
                              { name = "unknown", match = { destination_not_in = "address_book" }, action = P.require{ approvals = 3, roles = { "approve" } } } } }, function()
        local function need(template, intent) return create(template, intent).approvals_required end
        local function conflict(template, intent, code)
          local e = sup.refused("invalid_intent", create, template, intent)
          assert.equal(code or "INTENT_CHAIN_CONFLICT", e.code, tostring(e))
        end
        assert.equal(1, need(EVM, { asset = "ETH", amount = "1", destination = dest, chain_id = 1 }))
        assert.equal(1, need(EVM, { asset = "eth", amount = "1", destination = dest:upper():gsub("^0X", "0x"), chain_id = 1 }))
        assert.equal(3, need(EVM, { asset = "ETH", amount = "1", destination = dest, chain_id = 137 }))
        -- an extra intent field naming the booked chain is refused, not looked up
        conflict(EVM, { asset = "ETH", amount = "1", destination = dest, chain_id = 137, destination_chain = "1" })
        assert.equal(1, need(EVM, { asset = "ETH", amount = "1", destination = dest, chain_id = 1, destination_chain = "01" }))
        -- the node's config decides the chain: the intent cannot name another
        assert.equal(3, need(EVM137, { asset = "ETH", amount = "1", destination = dest }))
        conflict(EVM137, { asset = "ETH", amount = "1", destination = dest, chain_id = 1 })
        conflict(EVM137, { asset = "ETH", amount = "1", destination = dest, destination_chain = "1" })
        -- an intent naming no chain is in no book
        assert.equal(3, need(T, { asset = "ETH", amount = "1", destination = dest }))
        assert.equal(3, need(EVM, { asset = "ETH", amount = "1", destination = dest }))
        assert.equal(1, need(T, { asset = "ETH", amount = "1", destination = dest, destination_chain = "1" }))
        conflict(T, { asset = "ETH", amount = "1", destination = dest, chain_id = 1, destination_chain = "ethereum" })
        assert.equal(3, need(T, { asset = "ETH", amount = "1", destination = dest, destination_chain = require("cjson").null }))
        assert.equal(1, need(T, { asset = "ETH", amount = "1", destination = dest, chain_id = 1, destination_chain = "0001" }))
        conflict(T, { asset = "ETH", amount = "1", destination = dest, destination_chain = "" }, "INTENT_CHAIN_INVALID")
        conflict(T, { asset = "ETH", amount = "1", destination = dest, chain_id = 1.5 }, "INTENT_CHAIN_INVALID")
        conflict(T, { asset = "ETH", amount = "1", destination = dest, chain_id = { 1 } }, "INTENT_CHAIN_INVALID")
      end)
    end)
  end)
end)
