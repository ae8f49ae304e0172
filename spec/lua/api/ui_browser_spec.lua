-- ui_browser_spec: the web console in headless Chromium against a running
-- qtgd and this database.  The spec seeds rows through the API (and 10,000
-- copies by SQL for paging), runs spec/ui/driver.mjs once (puppeteer-core
-- driving Debian's chromium, tools/browser), and checks what the browser
-- saw and did against the database: sign-in and a filter, the DAG's node
-- states, an approval by a second principal, a rejection with its reason,
-- a redelivered dead letter, a read-only token offered nothing it may not
-- do (and its forged call refused by the API), paging through 10,000 rows,
-- a maker signing its request (initiation signed) before anyone may
-- approve it, a token of scope own seeing its own requests and no
-- class-wide page, no browser console error anywhere, and a screenshot of
-- each page in var/ui-browser/.
local cjson = require "cjson"

local api, common, host
local d, report, plan
local tokens = {}
local ids = {}
local keydir, statement, approver_key, desk_key
-- the approvers' enrolment of this daemon names this deployment
local DEPLOYMENT = "ui-desk"

local function rows(sql, ...) return common.query(sql, ...) end

local maker_key   -- the client system's key that signs what it makes (initiation signed)

-- create(intent[, extra[, opts]]) -> id: made by the operator token (or
-- opts.token) and signed by its maker's key, unless opts.unsigned
local function create(intent, extra, opts)
  opts = opts or {}
  local body = { template_key = "otc_settlement_manual", intent = intent }
  for k, v in pairs(extra or {}) do body[k] = v end
  local token = opts.token or tokens.operator
  local r = api.call(d, "POST", "/v3/requests", { token = token, key = common.uid("k", 6), json = body })
  assert.equal(201, r.status, r.body)
  if not opts.unsigned then
    local i = api.call(d, "POST", "/v3/requests/" .. r.json.id .. "/initiate", { token = token,
      key = common.uid("k", 6), json = { signature = host.approver_sign(maker_key, r.json.initiation_statement) } })
    assert.equal(200, i.status, i.body)
  end
  return r.json.id
end

local function intent(over)
  local t = {}
  for k, v in pairs(api.OTC_INTENT) do t[k] = v end
  for k, v in pairs(over or {}) do t[k] = v end
  return t
end

local function dead_letter(id)
  return rows([[UPDATE movement_callback_outbox SET status = 'dlq', attempts = max_attempts,
                  last_error = 'connection refused (ui spec)' WHERE request_id = $1::uuid RETURNING id]], id)[1].id
end

local SEEDED = 10000

local function seed_many(from_id)
  rows([[
    INSERT INTO movement_requests
    SELECT (jsonb_populate_record(NULL::movement_requests, to_jsonb(r) || jsonb_build_object(
              'id', gen_random_uuid(), 'idempotency_key', 'ui-seed-' || g, 'request_state', 'EXPIRED',
              'created_at', r.created_at - g * interval '1 second', 'updated_at', r.created_at,
              'intent', r.intent || jsonb_build_object('amount', g::text)))).*
      FROM movement_requests r, generate_series(1, $2::int) g WHERE r.id = $1::uuid]], from_id, SEEDED)
end

-- the approver's signature of the request's statement (qtgd approver sign)
local function statement_of(id, kind, step)
  return common.statement(id, DEPLOYMENT, kind, step)
end

local function signed(id)
  return { signature = host.approver_sign(approver_key, statement_of(id)) }
end

local function scenario(name)
  local s = report[name]
  assert.truthy(s, "the driver reported nothing for " .. name)
  assert.is_true(s.ok, name .. ": " .. tostring(s.error))
  assert.same({}, s.problems, name .. " had browser errors: " .. cjson.encode(s.problems))
  return s
end

-- at_manual_step(amount) -> id: a request made, approved and run to its
-- manual step (WAITING_MANUAL_ACTION)
local function at_manual_step(amount)
  local id = create(intent{ amount = amount })
  assert.equal(200, api.call(d, "POST", "/v3/requests/" .. id .. "/approve",
    { token = tokens.approver, json = signed(id) }).status)
  common.wait_for(function()
    local st = rows("SELECT request_state FROM movement_requests WHERE id = $1::uuid", id)[1].request_state
    return st == "WAITING_MANUAL_ACTION", st
  end, 60, "request " .. id .. " to wait for its manual step")
  return id
end

describe("the web console in a browser", function()
  setup(function()
    api = require "spec.lua.support.api"
    common = require "spec.lua.support.common"
    host = require "spec.lua.support.host"
    local rc, chromium = host.run({}, { common.quote(host.root .. "/tools/browser"), "chromium" })
    assert.equal(0, rc, "no chromium (tools/setup installs it): " .. chromium)
    rc = host.run({}, { common.quote(host.root .. "/tools/browser"), "install" })
    assert.equal(0, rc, "tools/browser install failed")
    -- signed approvals: the approver is enrolled with a key of their own,
    -- and every approval carries their signature of the request's statement;
    -- the requests' maker (the operator's and the own-scope client's
    -- system) signs each request it makes first (initiation signed)
    keydir = host.tmpdir()
    local pub, maker_pub, desk_pub, approver_name, operator_name, own_name, desk_name
    approver_key, pub = host.approver_key(keydir, "approver")
    maker_key, maker_pub = host.approver_key(keydir, "desk-system")
    desk_key, desk_pub = host.approver_key(keydir, "desk")
    local class = common.uid("api", 4)   -- the tokens are made before their daemon starts
    tokens.approver, approver_name = api.token("read,approve", { class = class })
    tokens.operator, operator_name = api.token("read,operate", { class = class })
    tokens.own, own_name = api.token("read,operate", { scope = "own", class = class })
    -- a second operator attests the manual step (never the initiator: four
    -- eyes), a person with a key of their own who signs that it is done
    tokens.desk, desk_name = api.token("read,operate", { class = class })
    local enrolment = keydir .. "/approvers"
    host.write(enrolment, ("deployment %s\ninitiation signed\nperson approver %s api:%s\nperson desk %s api:%s\n"
      .. "initiator desk-system %s api:%s,api:%s\nquorum * 1\n"):format(DEPLOYMENT, pub, approver_name, desk_pub,
      desk_name, maker_pub, operator_name, own_name))
    os.execute("chmod 644 " .. common.quote(enrolment))
    d = api.start({ MG_NETWORK_CLASS = class, MG_NODE_DISPATCH_INTERVAL_SECONDS = "0.2",
                    MG_NODE_OBSERVE_INTERVAL_SECONDS = "0.2",
                    MG_API_RATE_LIMIT_PER_SECOND = "1000", MG_API_RATE_LIMIT_BURST = "1000",
                    MG_SIGNER_APPROVERS = enrolment })
    tokens.reader = api.token("read")

    -- the filter: two requests to one fresh destination, one of them rejected
    local dest = "0x" .. common.uid("", 20):gsub("[^%x]", ""):sub(1, 40)
    dest = dest .. string.rep("0", 42 - #dest)
    -- acme's (otc_settlement_manual's counterparty_allowlist_required)
    require("spec.lua.support.book").ensure_all({ { asset = "USDC", chain = "ethereum", address = dest, label = "acme" } })
    ids.filtered = create(intent{ destination = dest })
    ids.filtered_other = create(intent{ destination = dest })
    assert.equal(200, api.call(d, "POST", "/v3/requests/" .. ids.filtered_other .. "/reject",
      { token = tokens.approver, json = { reason = "duplicate" } }).status)
    -- the DAG: a request run to its manual step
    ids.dag = at_manual_step("11")
    -- a second one, whose manual step the browser completes
    ids.complete = at_manual_step("17")
    -- a third, whose manual step an operator found UNKNOWN (its state set
    -- by hand: the browser's part is only the cancel)
    ids.cancel_unknown = at_manual_step("21")
    require("qtg").db.with_session(common.unfrozen, [[UPDATE movement_request_nodes SET node_state = 'UNKNOWN'
                                         WHERE request_id = $1::uuid AND node_key = 'desk_confirmation']],
      ids.cancel_unknown)
    -- a fourth, stopped by a FAILED node with its manual step READY (set by
    -- hand, triggers off: the browser's part is what it shows and offers)
    ids.stopping = at_manual_step("22")
    require("qtg").db.with_session(function(s)
      common.unfrozen(s, [[UPDATE movement_request_nodes SET node_state = 'FAILED', error_code = 'OBSERVED_FAILURE'
                            WHERE request_id = $1::uuid AND node_key = 'withdrawal_status']], ids.stopping)
      common.unfrozen(s, "UPDATE movement_requests SET request_state = 'EXECUTING' WHERE id = $1::uuid", ids.stopping)
    end)
    -- a note of the maker's with a right-to-left override (U+202E) in it
    ids.approve = create(intent{ amount = "12", desk_note = "ok\226\128\174lave" })
    ids.reject = create(intent{ amount = "13" })
    ids.read_only = create(intent{ amount = "14" })
    -- dead letters: one to redeliver, one counted by filter
    ids.dlq_request = create(intent{ amount = "15" }, { callback_url = "http://127.0.0.1:9/hook" })
    ids.dlq = dead_letter(ids.dlq_request)
    ids.bulk_request = create(intent{ amount = "16" }, { callback_url = "http://127.0.0.1:9/hook" })
    dead_letter(ids.bulk_request)
    -- paging: 10,000 more rows of this class
    seed_many(ids.read_only)
    -- one its maker has not signed yet; one the own-scope client made
    ids.initiate = create(intent{ amount = "18" }, nil, { unsigned = true })
    ids.own = create(intent{ amount = "19" }, nil, { token = tokens.own })

    -- the approver pastes the signature of the statement the card shows
    -- (the daemon verifies it against the enrolment)
    statement = statement_of(ids.approve)
    local signature = host.approver_sign(approver_key, statement)
    local out = host.root .. "/var/ui-browser"
    os.execute("rm -rf " .. common.quote(out) .. " && mkdir -p " .. common.quote(out))
    plan = {
      base = d.base, chromium = chromium:match("[^\n]+"), out = out, report = out .. "/report.json",
      tokens = tokens,
      scenarios = { "filter", "dag", "approve", "reject", "complete", "cancelUnknown", "stopping", "deadLetters",
                    "readOnly", "health", "paging", "initiate", "ownScope" },
      filter = { destination = dest:upper():gsub("^0X", "0x"), state = "PENDING_APPROVAL", expect = 1 },
      dag = { id = ids.dag },
      approve = { id = ids.approve, signature = signature },
      reject = { id = ids.reject, reason = "amount does not match the desk ticket" },
      cancelUnknown = { id = ids.cancel_unknown, reason = "desk confirmed by phone: nothing was paid" },
      stopping = { id = ids.stopping },
      complete = { id = ids.complete, node = "desk_confirmation", reference = "DESK-UI-1", attester = "api:" .. desk_name,
                   signature = host.approver_sign(desk_key, statement_of(ids.complete, "attestation",
                     "desk_confirmation")) },
      dlq = { id = ids.dlq, bulkRequest = ids.bulk_request },
      readOnly = { id = ids.read_only },
      paging = { template = "otc_settlement_manual", state = "EXPIRED", pages = 3 },
      initiate = { id = ids.initiate, signature = host.approver_sign(maker_key,
        statement_of(ids.initiate, "initiation")) },
      ownScope = { id = ids.own },
    }
    host.write(out .. "/plan.json", cjson.encode(plan))
    local _, node_path = host.run({}, { common.quote(host.root .. "/tools/browser"), "node-path" })
    node_path = node_path:match("[^\n]+")
    local rc2, log = host.run({ NODE_PATH = node_path }, { "timeout", "300", "node",
      common.quote(host.root .. "/spec/ui/driver.mjs"), common.quote(out .. "/plan.json") })
    assert.equal(0, rc2, "the browser driver failed: " .. log)
    report = cjson.decode(host.read(plan.report))
  end)
  teardown(function()
    api.stop(d)
    host.stop_all()
    if keydir then os.execute("rm -rf " .. common.quote(keydir)) end
  end)

  it("signs in and finds a request by filter", function()
    local s = scenario("filter")
    assert.same({ ids.filtered }, s.ids)
    assert.truthy(s.hash:find("destination=", 1, true), "the filter is kept in the URL: " .. s.hash)
  end)

  it("draws the DAG with each node's state as the database has it", function()
    local s = scenario("dag")
    local db = rows("SELECT node_key, node_state FROM movement_request_nodes WHERE request_id = $1::uuid", ids.dag)
    assert.equal(#db, #s.nodes)
    local drawn = {}
    for _, n in ipairs(s.nodes) do drawn[n.key] = n end
    for _, n in ipairs(db) do
      assert.truthy(drawn[n.node_key], "node " .. n.node_key .. " is not drawn")
      assert.equal(n.node_state, drawn[n.node_key].state, n.node_key)
    end
    local frontier = rows("SELECT current_frontier FROM movement_requests WHERE id = $1::uuid", ids.dag)[1].current_frontier
    for _, key in ipairs(frontier) do assert.is_true(drawn[key].frontier, key .. " is on the frontier") end
    local n_edges = rows([[SELECT count(*)::int AS n FROM plan_edges e JOIN movement_requests r
                             ON r.plan_version_id = e.plan_version_id WHERE r.id = $1::uuid]], ids.dag)[1].n
    assert.equal(n_edges, #s.edges)
    assert.truthy(#s.why > 0)
    local waits = false
    for _, line in ipairs(s.why) do if line:find("waits for an operator", 1, true) then waits = true end end
    assert.is_true(waits, "the why panel names the manual step: " .. cjson.encode(s.why))
    local has_create, has_approve = false, false
    for _, a in ipairs(s.timeline) do
      has_create = has_create or a == "request.create"
      has_approve = has_approve or a == "request.approve"
    end
    assert.is_true(has_create and has_approve, cjson.encode(s.timeline))
    -- a reader is offered no action
    assert.same({}, s.actions)
  end)

  it("approves with a second principal, showing the frozen intent and its digest", function()
    local s = scenario("approve")
    local db = rows([[SELECT qtg_approval_digest(r) AS digest FROM movement_requests r WHERE id = $1::uuid]], ids.approve)[1]
    assert.equal(db.digest, s.digest)
    assert.equal("12", s.fields["intent.amount"])
    -- shown as written, escaped: a right-to-left override cannot turn the text around
    assert.equal("ok\\u{202e}lave", s.fields["intent.desk_note"])
    assert.equal(api.OTC_INTENT.destination, s.fields["intent.destination"])
    -- the statement shown is the request's, and the pasted signature went with the vote
    assert.equal(statement, s.statement)
    -- what the approval lets the signer sign: the plan's nodes, none of them the signer's
    assert.truthy(s.payments:find("what qtg's signer may sign under this statement", 1, true), s.payments)
    assert.truthy(s.payments:find("\n  node withdraw: [^\n]*: not signed by qtg's signer\n"), s.payments)
    assert.truthy(s.payments:find("\n  nothing: no node of this plan is one the signer signs", 1, true), s.payments)
    assert.equal(plan.approve.signature, rows("SELECT signature FROM request_approvals WHERE request_id = $1::uuid",
      ids.approve)[1].signature)
    local votes = rows([[SELECT a.principal, a.decision, a.comment, a.approval_digest, r.created_by
                          FROM request_approvals a JOIN movement_requests r ON r.id = a.request_id
                         WHERE a.request_id = $1::uuid]], ids.approve)
    assert.equal(1, #votes)
    assert.equal("approve", votes[1].decision)
    assert.equal("checked against the desk ticket", votes[1].comment)
    assert.equal(db.digest, votes[1].approval_digest)
    assert.truthy(votes[1].principal:match("^api:"))
    assert.not_equal(votes[1].created_by, votes[1].principal)
  end)

  it("rejects with a reason, which the dialog requires", function()
    local s = scenario("reject")
    assert.is_true(s.disabledEmpty)
    assert.is_true(s.disabledBlank)
    assert.is_false(s.disabledTyped)
    local req = rows("SELECT request_state FROM movement_requests WHERE id = $1::uuid", ids.reject)[1]
    assert.equal("REJECTED", req.request_state)
    local vote = rows("SELECT decision, comment FROM request_approvals WHERE request_id = $1::uuid", ids.reject)[1]
    assert.equal("reject", vote.decision)
    assert.equal(plan.reject.reason, vote.comment)
  end)

  it("completes a manual step through its input form, as another operator than the initiator, who signs it", function()
    local s = scenario("complete")
    assert.equal(0, s.offeredToInitiator)
    assert.same({ "desk_reference" }, s.fields)
    assert.is_true(s.disabledEmpty)
    -- the input given, the attestation not signed yet
    assert.is_true(s.disabledUnsigned)
    assert.is_false(s.disabledTyped)
    assert.equal(statement_of(ids.complete, "attestation", "desk_confirmation"), s.statement)
    local instructions = false
    for _, l in ipairs(s.lines) do instructions = instructions or l:find("OTC desk", 1, true) ~= nil end
    assert.is_true(instructions, "the dialog shows the step's instructions: " .. cjson.encode(s.lines))
    common.wait_for(function()
      local st = rows("SELECT request_state FROM movement_requests WHERE id = $1::uuid", ids.complete)[1].request_state
      return st == "COMPLETED", st
    end, 30, "the request to complete")
    local node = rows([[SELECT node_state, provider_refs->>'desk_reference' AS ref, attestation_signature
                          FROM movement_request_nodes
                         WHERE request_id = $1::uuid AND node_key = 'desk_confirmation']], ids.complete)[1]
    assert.equal("COMPLETED", node.node_state)
    assert.equal("DESK-UI-1", node.ref)
    assert.equal(plan.complete.signature, node.attestation_signature)
    assert.equal(plan.complete.attester, s.attestedBy)
  end)

  it("cancels beside an UNKNOWN node only as reconciled, saying what the operator vouches for", function()
    local s = scenario("cancelUnknown")
    local offered = {}
    for _, a in ipairs(s.actions) do offered[a] = true end
    assert.is_true(offered["cancel-reconciled"], cjson.encode(s.actions))
    assert.is_nil(offered.cancel, cjson.encode(s.actions))
    assert.truthy(table.concat(s.lines, " "):find("Node desk_confirmation is UNKNOWN", 1, true), cjson.encode(s.lines))
    assert.equal("CANCELLED", rows("SELECT request_state FROM movement_requests WHERE id = $1::uuid",
      ids.cancel_unknown)[1].request_state)
    local a = rows([[SELECT detail FROM audit_events WHERE request_id = $1::uuid AND action = 'request.cancel'
                     UNION ALL SELECT detail FROM audit_outbox WHERE request_id = $1::uuid AND action = 'request.cancel']],
      ids.cancel_unknown)[1]
    assert.truthy(a, "an audit row of the cancel")
    local detail = type(a.detail) == "string" and cjson.decode(a.detail) or a.detail
    assert.same({ "desk_confirmation" }, detail.reconciled_unknown_nodes)
    assert.equal(plan.cancelUnknown.reason, detail.reason)
  end)

  it("offers no manual step of a request bound for FAILED, and says why nothing starts", function()
    local s = scenario("stopping")
    local text = table.concat(s.why, "\n")
    assert.truthy(text:find("Stopping: it waits for its nodes in flight", 1, true), text)
    assert.truthy(text:find("Node desk_confirmation is ready but does not start while the request is stopping", 1, true),
      text)
    local offered = {}
    for _, a in ipairs(s.nodeActions) do offered[a] = true end
    assert.is_nil(offered["desk_confirmation:complete"], cjson.encode(s.nodeActions))
    assert.is_true(offered["withdrawal_status:retry"], cjson.encode(s.nodeActions))
  end)

  it("redelivers a dead letter, and counts a bulk redelivery before doing it", function()
    local s = scenario("deadLetters")
    local new = rows("SELECT id, status FROM movement_callback_outbox WHERE redelivery_of = $1", ids.dlq)
    assert.equal(1, #new)
    assert.truthy(s.status:find(tostring(new[1].id), 1, true), s.status)
    assert.truthy(s.rowText:find("redelivered as " .. new[1].id, 1, true), s.rowText)
    assert.equal("Redeliver 1 dead letter(s)?", s.bulkTitle)
    -- the bulk dialog was cancelled: nothing redelivered for that request
    assert.equal(0, rows([[SELECT count(*)::int AS n FROM movement_callback_outbox o
                            WHERE o.request_id = $1::uuid AND o.redelivery_of IS NOT NULL]], ids.bulk_request)[1].n)
  end)

  it("offers a read-only token nothing it may not do, and the API refuses a forged call", function()
    local s = scenario("readOnly")
    assert.same({}, s.actions)
    assert.same({ "Requests", "Dead letters", "Workers and health" }, s.nav)
    assert.equal(0, s.redeliverButtons)
    assert.equal(0, s.bulkForm)
    -- what the page would have sent, sent anyway
    local forged = api.call(d, "POST", "/v3/requests/" .. ids.read_only .. "/approve",
      { token = tokens.reader, json = { comment = "forged" } })
    assert.equal(403, forged.status)
    assert.equal("forbidden", forged.json.kind)
    assert.equal(403, api.call(d, "POST", "/v3/callbacks/" .. ids.dlq .. "/redeliver", { token = tokens.reader }).status)
    assert.equal(0, rows("SELECT count(*)::int AS n FROM request_approvals WHERE request_id = $1::uuid",
      ids.read_only)[1].n)
    assert.equal("PENDING_APPROVAL",
      rows("SELECT request_state FROM movement_requests WHERE id = $1::uuid", ids.read_only)[1].request_state)
  end)

  it("shows workers, heartbeats and readiness", function()
    local s = scenario("health")
    local names = {}
    for _, w in ipairs(api.call(d, "GET", "/v3/workers", { token = tokens.reader }).json.items) do
      names[#names + 1] = w.name
    end
    assert.same(names, s.workers)
    assert.same({ "database", "migrations", "core_workers", "signer" }, s.checks)
  end)

  it("pages through 10,000 requests one page at a time, in the database's order", function()
    local s = scenario("paging")
    assert.equal(3, #s.pages)
    local want = rows([[SELECT id FROM movement_requests WHERE network_class = $1 AND template_key = $2
                         AND request_state = 'EXPIRED' ORDER BY created_at DESC, id DESC LIMIT 150]],
      d.class, plan.paging.template)
    local i = 0
    for _, page in ipairs(s.pages) do
      assert.equal(50, #page)
      for _, id in ipairs(page) do
        i = i + 1
        assert.equal(want[i].id, id, "row " .. i)
      end
    end
    assert.same(s.pages[2], s.back)
    assert.truthy(s.domRows <= 52, "the page holds one page of rows, not all: " .. s.domRows)
    assert.truthy(rows("SELECT count(*)::int AS n FROM movement_requests WHERE network_class = $1", d.class)[1].n
      > SEEDED)
  end)

  it("lets the maker sign its request (initiation signed) before anyone is offered to approve it", function()
    local s = scenario("initiate")
    assert.same({}, s.approverBefore)
    assert.truthy(table.concat(s.whyBefore, "\n"):find("sign its initiation statement", 1, true),
      cjson.encode(s.whyBefore))
    -- the statement shown is the request's, and the pasted signature is the one stored
    assert.equal(statement_of(ids.initiate, "initiation"), s.statement)
    assert.equal(0, s.offeredAfter)
    assert.equal(plan.initiate.signature, rows("SELECT initiation_signature FROM movement_requests WHERE id = $1::uuid",
      ids.initiate)[1].initiation_signature)
    assert.same({ "approve", "reject" }, s.approverAfter)
  end)

  it("shows a token of scope own its own requests and no page about the whole class", function()
    local s = scenario("ownScope")
    assert.same({ "Requests", "Dead letters" }, s.nav)
    assert.truthy(s.healthText:find("its own requests only", 1, true), s.healthText)
    assert.same({ ids.own }, s.ids)
    assert.equal(ids.own, s.detailId)
  end)

  it("saved a screenshot of each page", function()
    for _, f in ipairs({ "requests", "request-detail", "approvals", "reject-dialog", "complete-dialog", "dead-letters",
                         "health", "initiate-dialog", "own-requests" }) do
      local png = host.read(plan.out .. "/" .. f .. ".png")
      assert.truthy(png and #png > 1000, f .. ".png")
      assert.equal("\137PNG", png:sub(1, 4), f .. ".png")
    end
  end)
end)
