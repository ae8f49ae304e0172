-- The console's request, lifecycle and signer commands
-- (lua/qtg/console/commands.lua) called in process on the test database,
-- as one console session: what each prints (its value pretty-printed, as
-- the console shows it), the rows it changes, the audit row it writes under
-- the session's actor, and the error text an operator reads for bad input.
-- req/requests/dlq/redeliver on a seeded request in MANUAL_INTERVENTION;
-- create (idempotent), reject, cancel, approve, complete_manual, resume and
-- retry; set_expected_signer, signers and balances.  The socket, the framing,
-- the peer uid check, interrupts and the workers of a running daemon are
-- spec/c/test_console.c's.
local qtg = require "qtg"
local pretty = require "qtg.console.pretty"
local eval = require "qtg.console.eval"
local templates = require "qtg.templates"

local ACTOR = "console:spec-lifecycle"
local ZERO = "00000000-0000-0000-0000-000000000000"

local sup, s, cmds
local leftover = {}   -- requests left open, parked at teardown

-- What the console prints for a command's value.
local function shown(v) return pretty.pretty(v) end

-- The text the console prints for a command that raised.
local function fails(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return eval.describe(err)
end

local function has(text, want) assert.matches(want, text, 1, true) end

local function count(sql, ...) return tonumber(s:query(sql, ...)[1].n) end

-- Audit rows (in the outbox, or already promoted) of actor, action, entity.
local function audit_count(action, entity_id)
  return count([[SELECT count(*) AS n FROM (
      SELECT id FROM audit_outbox WHERE actor = $1 AND action = $2 AND entity_id = $3
      UNION SELECT outbox_id FROM audit_events WHERE actor = $1 AND action = $2 AND entity_id = $3) x]],
    ACTOR, action, tostring(entity_id))
end

local function request_state(id)
  return s:query("SELECT request_state FROM movement_requests WHERE id = $1::uuid", id)[1].request_state
end

-- A request of this network class in MANUAL_INTERVENTION (no worker sweeps
-- it) with one UNKNOWN node and one dead-lettered callback.
local function seed_request()
  -- the plan first: a plan version takes no node once a request
  -- references it (sql/0170), even in the same statement
  local plan = s:query([[
    WITH t AS (INSERT INTO movement_templates (template_key, name) VALUES ('console_test', 'console test')
               ON CONFLICT (template_key) DO UPDATE SET name = EXCLUDED.name RETURNING id),
     pv AS (INSERT INTO plan_versions (template_id, version, graph_hash, compiled_plan_hash, content_hash)
            SELECT t.id, (SELECT coalesce(max(version), 0) + 1 FROM plan_versions p WHERE p.template_id = t.id),
                   repeat('a', 64), repeat('b', 64), repeat('c', 64) FROM t RETURNING id),
     pn AS (INSERT INTO plan_nodes (plan_version_id, node_key, node_kind, action_type, executor, ordinal)
            SELECT pv.id, 'step_one', 'action', 'noop_transfer', 'noop', 1 FROM pv RETURNING id)
    SELECT pv.id AS pv_id, pn.id AS pn_id FROM pv, pn]])[1]
  local row = s:query([[
    WITH r AS (INSERT INTO movement_requests (network_class, template_key, plan_version_id, compiled_plan_hash,
             request_state, intent, idempotency_key, callback_url, created_by)
           SELECT $1, 'console_test', $2, repeat('b', 64), 'MANUAL_INTERVENTION',
                  '{"amount": "1"}', 'console-test-' || gen_random_uuid(), 'http://127.0.0.1:9/cb', 'test'
           RETURNING id),
     n AS (INSERT INTO movement_request_nodes (request_id, plan_node_id, node_key, node_kind, action_type,
             executor, node_state, attempt_no, provider_refs, error_code, error_detail)
           SELECT r.id, $3, 'step_one', 'action', 'noop_transfer', 'noop', 'UNKNOWN', 2,
                  '{"tx_hash": "0xfeed"}', 'PROVIDER_TIMEOUT', 'provider did not answer' FROM r
           RETURNING id),
     cb AS (INSERT INTO movement_callback_outbox (request_id, event_type, payload, callback_url, status,
              attempts, max_attempts, last_error)
            SELECT r.id, 'request_attention', '{"event_type": "request_attention"}',
                   'http://127.0.0.1:9/cb', 'dlq', 5, 5, 'connection refused' FROM r RETURNING id)
    SELECT r.id::text AS request_id, n.id::text AS node_id, cb.id AS dlq_id FROM r, n, cb]],
    qtg.settings.network_class, plan.pv_id, plan.pn_id)[1]
  leftover[#leftover + 1] = row.request_id
  return { request_id = row.request_id, node_id = row.node_id, dlq_id = tonumber(row.dlq_id) }
end

local function create_otc(key)
  return cmds.create({ template_key = "otc_settlement_manual", idempotency_key = key,
    intent = { asset = "USDC", amount = "125.50", venue = "sim", destination = "0x" .. string.rep("1", 40),
               destination_chain = "ethereum", counterparty = "desk-a" } })
end

describe("console lifecycle and signer commands", function()
  setup(function()
    sup = require("spec.lua.support.engine")
    s = qtg.db.acquire()
    assert(templates.load_dir(s, sup.repo_root() .. "/templates"))
    -- desk-a's wallet (otc_settlement_manual's counterparty_allowlist_required)
    require("spec.lua.support.book").ensure(s, { asset = "USDC", chain = "ethereum",
      address = "0x" .. string.rep("1", 40), label = "desk-a" })
    cmds = require("qtg.console.commands").bind({ actor = ACTOR, print = function() end })
  end)
  teardown(function()
    -- the requests this spec leaves open are no other spec's to drive
    for _, id in ipairs(leftover) do
      sup.unfrozen(s, [[UPDATE movement_requests SET network_class = 'parked-' || network_class
                         WHERE id = $1::uuid AND network_class NOT LIKE 'parked-%']], id)
    end
    s:release()
  end)

  it("req() and requests{} show a request, its nodes and callbacks, and refuse bad filters and ids", function()
    local sd = seed_request()
    local out = shown(cmds.req(sd.request_id))
    for _, want in ipairs({ sd.request_id, "MANUAL_INTERVENTION", "step_one", "UNKNOWN", "PROVIDER_TIMEOUT",
                            "0xfeed", "attempt_no", "request_attention" }) do
      has(out, want)
    end
    assert.equals("2", shown(cmds.req(sd.request_id).nodes[1].attempt_no))

    out = shown(cmds.requests({ state = "manual_intervention", limit = 50 }))
    has(out, sd.request_id)
    has(out, "request_state")

    has(fails(cmds.requests, { state = "BOGUS" }), "unknown state BOGUS")
    has(fails(cmds.requests, { limit = 0 }), "limit must be an integer")
    has(fails(cmds.requests, { colour = "red" }), "unknown filter colour")
    has(fails(cmds.req, "not-a-uuid"), "request id must be a uuid")
    has(fails(cmds.req, ZERO), "no request " .. ZERO)
  end)

  it("dlq() lists a dead letter; redeliver() adds a new pending row, keeps the old one, and audits it", function()
    local sd = seed_request()
    local out = shown(cmds.dlq())
    has(out, tostring(sd.dlq_id))
    has(out, "connection refused")

    has(shown(cmds.redeliver(sd.dlq_id)), "redelivery_of")
    assert.equals(1, count("SELECT count(*) AS n FROM movement_callback_outbox WHERE id = $1 AND status = 'dlq'",
      sd.dlq_id))
    assert.equals(1, count([[SELECT count(*) AS n FROM movement_callback_outbox n JOIN movement_callback_outbox o
                               ON o.id = n.redelivery_of WHERE o.id = $1 AND n.payload = o.payload
                              AND n.callback_nonce <> o.callback_nonce AND n.attempts <= n.max_attempts]],
      sd.dlq_id))
    local new = s:query("SELECT id FROM movement_callback_outbox WHERE redelivery_of = $1", sd.dlq_id)[1]
    assert.is_table(new)
    assert.equals(1, audit_count("callback.redeliver", new.id))

    has(fails(cmds.redeliver, 999999999), "no callback row 999999999")
    has(fails(cmds.redeliver, "abc"), "positive integer")
  end)

  it("set_expected_signer() enrolls a lower-cased address, audited; signers() shows it; bad addresses are refused",
    function()
      local key = sup.uid("console_k")
      has(shown(cmds.set_expected_signer(key, "0xAbCdEf0123456789abcdef0123456789ABCDEF01")),
        "0xabcdef0123456789abcdef0123456789abcdef01")
      assert.equals("0xabcdef0123456789abcdef0123456789abcdef01",
        s:query("SELECT expected_signer_address FROM signer_roster WHERE signer_key = $1", key)[1]
          .expected_signer_address)
      assert.is_true(audit_count("signer.expected_identity.set", qtg.settings.network_class .. "/" .. key) >= 1)

      local out = shown(cmds.signers())
      has(out, key)
      has(out, "posture")
      has(out, "orphan")   -- enrolled, never loaded by this process

      has(fails(cmds.set_expected_signer, key, "0x1234"), "40 hex")
      has(fails(cmds.set_expected_signer, key, "0x" .. string.rep("0", 40)), "zero signer address")
    end)

  it("balances() shows the latest snapshot per venue and asset, stale ones and failed fetches", function()
    if count("SELECT count(*) AS n FROM pg_class WHERE relname = 'balance_snapshots'") ~= 1 then
      -- until the balance migration is installed, the command says so
      has(fails(cmds.balances), "unavailable: balances: there is no balance_snapshots table")
      return
    end
    local venue = sup.uid("console_venue")
    s:query([[INSERT INTO balance_snapshots (network_class, venue_key, asset, ok, amount, error, captured_at)
              VALUES ($1, $2, 'USDC', true, 10, NULL, now() - interval '1 hour'),
                     ($1, $2, 'USDC', true, 12.5, NULL, now() - interval '1 day'),
                     ($1, $2, 'USDT', false, NULL, 'venue down', now())]], qtg.settings.network_class, venue)
    local out = shown(cmds.balances())
    has(out, venue)
    has(out, "stale")
    has(out, "venue down")
    local usdc
    for _, b in ipairs(cmds.balances()) do
      if b.venue_key == venue and b.asset == "USDC" then usdc = b end
    end
    assert.is_table(usdc)
    assert.equals("10", usdc.amount)   -- the newest one, stale after an hour
    assert.is_true(usdc.stale)
  end)

  it("create{} makes a request idempotently as the session's actor, audited; bad input is refused", function()
    local key = sup.uid("console-create")
    local id = create_otc(key).id
    assert.is_string(id)
    assert.equals("PENDING_APPROVAL", request_state(id))
    assert.equals(1, count("SELECT count(*) AS n FROM movement_requests WHERE id = $1::uuid AND created_by = $2",
      id, ACTOR))
    assert.equals(1, audit_count("request.create", id))
    assert.equals(id, create_otc(key).id)
    -- the key names that request only: another intent under it is refused
    has(fails(cmds.create, { template_key = "otc_settlement_manual", idempotency_key = key, intent = {} }),
      "idempotency_mismatch")
    has(fails(cmds.create, { template_key = "otc_settlement_manual", intent = { asset = "USDC" } }), "invalid_intent")
    has(fails(cmds.create, "x"), "takes a table")
    leftover[#leftover + 1] = id
  end)

  it("reject() needs an id and a reason, ends the request, audits it, and is refused a second time", function()
    local id = create_otc(sup.uid("console-reject")).id
    has(fails(cmds.reject, nil, "x"), "request id must be a uuid")
    has(fails(cmds.reject, id), "a reason (non-empty string) is required")
    has(shown(cmds.reject(id, "wrong desk")), "REJECTED")
    assert.equals("REJECTED", request_state(id))
    assert.equals(1, audit_count("request.reject", id))
    has(fails(cmds.reject, id, "wrong desk"), "illegal_transition")
  end)

  it("cancel() ends a pending request, audited", function()
    local id = create_otc(sup.uid("console-cancel")).id
    has(fails(cmds.cancel, id, "not needed any more", "yes"), "the third argument is a table")
    has(fails(cmds.cancel, id, "not needed any more", { reconciled = "yes" }), "the third argument is a table")
    has(shown(cmds.cancel(id, "not needed any more")), "CANCELLED")
    assert.equals("CANCELLED", request_state(id))
    assert.equals(1, audit_count("request.cancel", id))
  end)

  it("approve() votes as the session's actor; the workers run it to its manual step; complete_manual() ends it",
    function()
      local id = create_otc(sup.uid("console-approve")).id
      leftover[#leftover + 1] = id
      -- four eyes: the request this console approves was initiated by someone
      -- else (its initiator may still be set while it is PENDING_APPROVAL)
      assert.equals(1, #s:query([[UPDATE movement_requests SET created_by = 'operator:desk'
                                  WHERE id = $1::uuid RETURNING 1]], id))
      -- a signature (signed approvals) is 128 lowercase hex digits, sent with the vote
      has(fails(cmds.approve, id, nil, 42), "signature must be a string")
      has(fails(cmds.approve, id, nil, "AB" .. string.rep("ab", 63)), "128 lowercase hex")
      -- no approvers are enrolled here: nothing is signed by them, no statement is shown
      local detail = shown(cmds.req(id))
      has(detail, "signed = false")
      assert.is_nil(detail:find("qtg-approval", 1, true), detail)
      local out = shown(cmds.approve(id, nil, string.rep("ab", 64)))
      assert.equals(string.rep("ab", 64), s:query("SELECT signature FROM request_approvals WHERE request_id = $1::uuid",
        id)[1].signature)
      has(out, "approved_by:")
      has(out, ACTOR)
      assert.equals(1, audit_count("request.approve", id))
      assert.is_true(sup.drive(s, sup.state_is(id, "WAITING_MANUAL_ACTION"), 60),
        "the request did not reach WAITING_MANUAL_ACTION: " .. request_state(id))
      local nodes = sup.nodes(s, id)
      assert.is_table(nodes.desk_confirmation)
      assert.is_table(nodes.withdraw)
      local node, other = nodes.desk_confirmation.id, nodes.withdraw.id

      has(fails(cmds.complete_manual, node, "REF"), "artifacts must be a table")
      has(fails(cmds.complete_manual, other, { desk_reference = "REF-42" }), "not a manual step")
      has(shown(cmds.complete_manual(node, { desk_reference = "REF-42" })), "desk_confirmation")
      assert.equals("COMPLETED", request_state(id))
      assert.equals(1, count([[SELECT count(*) AS n FROM movement_request_nodes
                                WHERE id = $1::uuid AND node_state = 'COMPLETED']], node))
      assert.equals(1, audit_count("node.completed", node))
      has(fails(cmds.retry, node), "cannot retry node")   -- only FAILED or UNKNOWN nodes
    end)

  it("resume() and retry() move requests left in MANUAL_INTERVENTION, audited; approve() of no request is not_found",
    function()
      local s1, s2 = seed_request(), seed_request()
      has(shown(cmds.resume(s1.request_id)), "EXECUTING")
      assert.equals(1, audit_count("request.resume", s1.request_id))
      has(shown(cmds.retry(s2.node_id)), s2.request_id)
      assert.equals(1, audit_count("node.retry", s2.node_id))
      assert.equals(0, count([[SELECT count(*) AS n FROM movement_request_nodes
                                WHERE id = $1::uuid AND node_state = 'UNKNOWN']], s2.node_id))
      has(fails(cmds.approve, ZERO), "not_found")
    end)
end)
