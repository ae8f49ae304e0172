-- The runtime role (sql/0102_database_roles.sql): what the daemon's database
-- role may not do, each attempted and refused -- including
-- (sql/0170_trust_seal.sql) the state machines' tables, a frozen column
-- changed in the UPDATE that leaves PENDING_APPROVAL, the plan of a
-- version a request references and a request node's identity; that the
-- approval path and a new plan version still work; that a real daemon logged in
-- as a member of qtg_runtime still moves a request to the end, audit
-- included; and what `qtgd check` says of the role it runs as.
local qtg = require "qtg"
local support = require "spec.lua.support.host"
local promoter = require "qtg.workers.audit_outbox_promoter"

local LOGIN = "spec_runtime_login"
local s

-- The URL of this database for another role (trust auth: no password).
local function url_as(role)
  local url = os.getenv("MG_DATABASE_URL")
  local out = url:gsub("^postgresql://[^@/]*@", "postgresql://" .. role .. "@", 1)
  assert(out ~= url, "cannot change the user of " .. url)
  return out
end

-- Run sql as qtg_runtime (SET ROLE: privileges are those of the role) in a
-- transaction that is rolled back whatever happens -> ok, err.  Trailing
-- nil parameters are dropped.
local function as_runtime(sql, ...)
  local args, n = { ... }, select("#", ...)
  while n > 0 and args[n] == nil do n = n - 1 end
  s:begin()
  s:exec("SET LOCAL ROLE qtg_runtime")
  local ok, err = pcall(s.query, s, sql, unpack(args, 1, n))
  s:rollback()
  return ok, err
end

describe("the runtime role", function()
  setup(function()
    s = qtg.db.acquire()
    s:exec(string.format([[DO $$ BEGIN
      IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '%s') THEN
        CREATE ROLE %s LOGIN IN ROLE qtg_runtime;
      END IF; END $$]], LOGIN, LOGIN))
    repeat until promoter.promote(s, 500) == 0
  end)
  teardown(function()
    support.stop_all()
    s:release()
  end)

  it("exists after qtgd migrate, owns nothing and is no superuser", function()
    local r = s:query([[SELECT rolsuper, rolcanlogin,
      (SELECT count(*)::int FROM pg_class WHERE relowner = 'qtg_runtime'::regrole) AS owned
      FROM pg_roles WHERE rolname = 'qtg_runtime']])[1]
    assert.is_false(r.rolsuper)
    assert.is_false(r.rolcanlogin)
    assert.equals(0, r.owned)
  end)

  local attacks = {
    { "insert a forged audit row", [[INSERT INTO audit_events (outbox_id, actor, action, entity_type,
        entity_id, detail, created_at) VALUES (-77, 'operator:mallory', 'request.approve',
        'movement_request', 'x', '{}', now() - interval '400 days')]] },
    { "update an audit row", "UPDATE audit_events SET actor = 'operator:mallory'" },
    { "delete audit rows", "DELETE FROM audit_events" },
    { "truncate the audit trail", "TRUNCATE audit_events" },
    { "move a chain's head", "UPDATE audit_chain_heads SET chain_seq = 0" },
    { "update an audit outbox row", "UPDATE audit_outbox SET actor = 'operator:mallory'" },
    { "delete audit outbox rows", "DELETE FROM audit_outbox" },
    -- sql/0194: an id already promoted stopped every later promotion (a
    -- unique outbox_id), an id taken ahead failed a real writer's insert
    { "give an audit outbox row its own id", [[INSERT INTO audit_outbox (id, actor, action, entity_type,
        entity_id, detail) VALUES (1, 'system:x', 'forged.reuse', 'x', 'x', '{}')]] },
    { "backdate an audit outbox row", [[INSERT INTO audit_outbox (actor, action, entity_type, entity_id,
        detail, created_at) VALUES ('system:x', 'forged.time', 'x', 'x', '{}', now() - interval '400 days')]] },
    { "disable the audit triggers", "ALTER TABLE audit_events DISABLE TRIGGER USER" },
    { "drop an audit trigger", "DROP TRIGGER audit_events_no_update ON audit_events" },
    { "alter a table", "ALTER TABLE movement_requests ADD COLUMN mallory text" },
    { "drop a table", "DROP TABLE movement_requests" },
    { "create a table", "CREATE TABLE public.mallory (x int)" },
    { "truncate the requests", "TRUNCATE movement_requests CASCADE" },
    { "replace the promotion function", [[CREATE OR REPLACE FUNCTION qtg_audit_promote(batch int)
        RETURNS int LANGUAGE sql AS 'SELECT 0']] },
    { "rewrite the migrations' record", "DELETE FROM schema_migrations" },
    { "grant itself more", "SELECT qtg_grant_roles()" },
    -- the state machines' tables (sql/0170): a new edge would let a
    -- finished node run again
    { "add a request transition", "INSERT INTO request_state_transitions VALUES ('COMPLETED', 'EXECUTING')" },
    { "add a node transition", "INSERT INTO node_state_transitions VALUES ('COMPLETED', 'READY')" },
    { "make a node state non-terminal", "UPDATE node_states SET terminal = false WHERE state = 'COMPLETED'" },
    { "add a request state", "INSERT INTO request_states VALUES ('PAID_TWICE', false)" },
    { "delete a nonce transition", "DELETE FROM evm_nonce_transitions" },
    -- sql/0201: a temporary table shadows a table of public for its session
    { "create a temporary table", "CREATE TEMP TABLE audit_events (x int)" },
    -- sql/0201: the promotion's turn; an advisory lock was anyone's to hold
    { "take the promotion's turn", "SELECT id FROM audit_promoter_turn FOR UPDATE" },
  }
  for _, a in ipairs(attacks) do
    it("may not " .. a[1], function()
      local ok, err = as_runtime(a[2])
      assert.is_false(ok, a[1] .. " was allowed")
      assert.equals("42501", err.sqlstate, tostring(err.message)) -- insufficient_privilege
    end)
  end

  it("may do the engine's work: write requests and the outbox, promote audit rows", function()
    s:begin()
    s:exec("SET LOCAL ROLE qtg_runtime")
    s:query([[INSERT INTO audit_outbox (actor, action, entity_type, entity_id, detail)
              VALUES ('system:spec', 'spec.roles', 'spec', '1', '{}')]])
    assert.equals(1, promoter.promote(s, 500))
    local n = s:query("SELECT count(*)::int AS n FROM audit_events WHERE action = 'spec.roles'")[1].n
    s:rollback()
    assert.equals(1, n)
  end)

  -- sql/0202: one row of a detail too large to hash stopped every later
  -- promotion (the chain trigger ran out of memory on its text)
  it("may not write an audit row too large to promote; promotion goes on", function()
    s:begin()
    s:exec("SET LOCAL ROLE qtg_runtime")
    local ok, err = pcall(s.query, s, [[INSERT INTO audit_outbox (actor, action, entity_type, entity_id, detail)
      VALUES ('system:spec', 'spec.poison', 'spec', '1', jsonb_build_object('x', repeat(chr(1), 2000000)))]])
    s:rollback()
    assert.is_false(ok, "a 2 MB detail was taken")
    assert.equals("23514", err.sqlstate, tostring(err.message))   -- check_violation
    assert.matches("audit_outbox_detail_bounded", tostring(err.message), 1, true)
    -- one just under the bound is taken and promoted
    s:begin()
    s:exec("SET LOCAL ROLE qtg_runtime")
    s:query([[INSERT INTO audit_outbox (actor, action, entity_type, entity_id, detail)
      VALUES ('system:spec', 'spec.large', 'spec', '1', jsonb_build_object('x', repeat('y', 1000000)))]])
    local promoted = promoter.promote(s, 500)
    local n = s:query("SELECT count(*)::int AS n FROM audit_events WHERE action = 'spec.large'")[1].n
    s:rollback()
    assert.is_true(promoted >= 1)
    assert.equals(1, n)
  end)

  it("may not hand the promotion a made-up end of a chain (sql/0194)", function()
    -- the chain's end is carried in transaction-local settings while rows
    -- are promoted; a caller that set them before the call made the row
    -- link to a hash of its choosing (verify: broken for good)
    s:begin()
    s:exec("SET LOCAL ROLE qtg_runtime")
    local ok, err = pcall(function()
      s:query([[INSERT INTO audit_outbox (actor, action, entity_type, entity_id, detail)
                VALUES ('system:spec', 'spec.forged_end', 'spec', '1', '{}')]])
      local head = s:query("SELECT chain_seq, row_hash FROM audit_chain_heads WHERE network_class = ''")[1]
      local forged = "2:" .. string.rep("e", 64)
      for _, tok in ipairs({ "", "x" }) do
        s:query("SELECT set_config('qtg_chain.token', $1, true)", tok)
        s:query("SELECT set_config('qtg_chain.h' || $1 || md5(''), $2, true)", tok, forged)
        s:query("SELECT set_config('qtg_chain.dirty' || $1, '[]', true)", tok)
      end
      assert.equals(1, promoter.promote(s, 500))
      local row = s:query([[SELECT chain_seq, prev_hash FROM audit_events
                             WHERE action = 'spec.forged_end']])[1]
      local now = s:query("SELECT chain_seq, row_hash FROM audit_chain_heads WHERE network_class = ''")[1]
      if head then
        assert.equals(head.row_hash, row.prev_hash)
        assert.equals(tonumber(head.chain_seq) + 1, tonumber(row.chain_seq))
      else
        assert.equals(string.rep("0", 64), row.prev_hash)
      end
      assert.equals(tonumber(row.chain_seq), tonumber(now.chain_seq))
    end)
    s:rollback()
    assert(ok, err)
  end)

  -- sql/0201: with a temporary table of the same name (made here by the
  -- superuser, as a cluster where PUBLIC keeps TEMPORARY would let the
  -- runtime role make it), the promotion moved the outbox rows into it:
  -- gone from the trail, and the chain still verified.
  it("promotes into the real audit trail whatever temporary table its session holds", function()
    s:begin()
    local ok, err = pcall(function()
      s:exec("CREATE TEMP TABLE audit_events (LIKE public.audit_events) ON COMMIT DROP")
      s:exec("GRANT ALL ON pg_temp.audit_events TO PUBLIC")
      s:exec("SET LOCAL ROLE qtg_runtime")
      s:query([[INSERT INTO audit_outbox (actor, action, entity_type, entity_id, detail)
                VALUES ('system:spec', 'spec.shadowed', 'spec', '1', '{}')]])
      assert.equals(1, promoter.promote(s, 500))
      s:exec("RESET ROLE")
      assert.equals(0, s:query("SELECT count(*)::int AS n FROM pg_temp.audit_events")[1].n)
      assert.equals(1, s:query("SELECT count(*)::int AS n FROM public.audit_events WHERE action = 'spec.shadowed'")[1].n)
      assert.equals(0, s:query("SELECT count(*)::int AS n FROM audit_outbox WHERE action = 'spec.shadowed'")[1].n)
    end)
    s:rollback()
    assert(ok, err)
  end)

  it("promotes while the runtime role holds the advisory lock the promotion once took", function()
    local other = qtg.db.acquire()
    other:begin()
    other:exec("SET LOCAL ROLE qtg_runtime")
    other:query("SELECT pg_advisory_xact_lock(hashtext('qtg.audit_outbox_promoter'))")
    local ok, err = pcall(function()
      s:begin()
      s:exec("SET LOCAL ROLE qtg_runtime")
      s:query([[INSERT INTO audit_outbox (actor, action, entity_type, entity_id, detail)
                VALUES ('system:spec', 'spec.turn', 'spec', '1', '{}')]])
      assert.equals(1, promoter.promote(s, 500))
    end)
    if s:in_transaction() then s:rollback() end
    other:rollback()
    other:release()
    assert(ok, err)
  end)

  -- What an approval covers, against the runtime role (sql/0170).  A
  -- template of its own per case, so the one pending request on its plan
  -- version is the one an error names.
  local function new_template()
    local sup = require "spec.lua.support.engine"
    local key = "spec_seal_" .. sup.uid():lower():gsub("[^a-z0-9]", "_")
    local pv = sup.load_doc(s, sup.doc(key, { { "a", "action", "withdrawal", { sim = { observes = 0 } } },
                                              { "b", "action", "withdrawal", { sim = { observes = 0 } } } },
      { { "a", "b" } })).plan_version_id
    local pn = {}
    for _, r in ipairs(s:query("SELECT id, node_key FROM plan_nodes WHERE plan_version_id = $1", pv)) do
      pn[r.node_key] = r.id
    end
    return key, pv, pn
  end

  local function new_pending()
    local key, pv, pn = new_template()
    local req = require("spec.lua.support.engine").create(s, key, { callback_url = false })
    assert.equals("PENDING_APPROVAL", req.request_state)
    assert.equals(pv, req.plan_version_id)
    return req, pn, key
  end

  local function refused_55000(want, ok, err)
    assert.is_false(ok, want .. ": was allowed")
    assert.equals("55000", err.sqlstate, tostring(err.message))
    assert.equals(want, err.message)
  end

  it("may not move a request out of PENDING_APPROVAL and change what was approved in the same UPDATE", function()
    local req = new_pending()
    local digest = s:query("SELECT qtg_approval_digest(r) AS d FROM movement_requests r WHERE id = $1::uuid",
      req.id)[1].d
    for _, c in ipairs({
      { "intent", "APPROVED", [[intent = intent || '{"amount": "99999"}']] },
      { "approvals_required", "APPROVED", "approvals_required = 0" },
      -- even the digest the rows hash to: the approval path stores it
      -- while the request is still pending
      { "approval_digest", "APPROVED", "approval_digest = $2", digest },
      { "approval_policy", "APPROVED", [[approval_policy = '{"rule": "mallory"}']] },
      { "callback_url", "CANCELLED", "callback_url = 'http://127.0.0.1:9/evil'" },
      { "network_class", "EXPIRED", "network_class = 'elsewhere'" },
    }) do
      local ok, err = as_runtime("UPDATE movement_requests SET request_state = '" .. c[2] .. "', " .. c[3]
        .. " WHERE id = $1::uuid", req.id, c[4])
      refused_55000(string.format("movement_requests.%s of request %s is frozen: only an update that keeps "
        .. "the request in PENDING_APPROVAL may change it (this one moves it to %s)", c[1], req.id, c[2]),
        ok, err)
    end
    -- the state alone moves; a frozen column alone changes while pending
    assert.is_true((as_runtime("UPDATE movement_requests SET request_state = 'CANCELLED' WHERE id = $1::uuid",
      req.id)))
    assert.is_true((as_runtime("UPDATE movement_requests SET approvals_required = 2 WHERE id = $1::uuid",
      req.id)))
  end)

  it("may not change, add to or remove from the plan version a request references", function()
    local req, pn = new_pending()
    local pv = req.plan_version_id
    local function sealed(tbl, op)
      return string.format("%s of plan version %s is sealed: request %s references it (%s refused)",
        tbl, pv, req.id, op)
    end
    local cases = {
      { sealed("plan_nodes", "UPDATE"), [[UPDATE plan_nodes SET config = config || '{"destination": "0x00000000000000000000000000000000000000bb"}'
          WHERE plan_version_id = $1]], pv },
      { sealed("plan_nodes", "UPDATE"), "UPDATE plan_nodes SET executor = 'evm_transfer' WHERE id = $1", pn.a },
      { sealed("plan_nodes", "DELETE"), "DELETE FROM plan_nodes WHERE id = $1", pn.b },
      { sealed("plan_nodes", "INSERT"), [[INSERT INTO plan_nodes (plan_version_id, node_key, node_kind, action_type,
          executor, ordinal) VALUES ($1, 'c', 'action', 'withdrawal', 'sim', 3)]], pv },
      { sealed("plan_edges", "DELETE"), "DELETE FROM plan_edges WHERE plan_version_id = $1", pv },
      { sealed("plan_edges", "UPDATE"), "UPDATE plan_edges SET to_node_id = from_node_id, from_node_id = to_node_id WHERE plan_version_id = $1", pv },
      { sealed("plan_edges", "INSERT"), "INSERT INTO plan_edges VALUES ($1, $2, $3)", pv, pn.b, pn.a },
      { sealed("plan_versions", "UPDATE"), [[UPDATE plan_versions SET risk_controls = risk_controls
          || '{"max_fee_per_gas_wei": "999999999999999"}' WHERE id = $1]], pv },
      { sealed("plan_versions", "DELETE"), "DELETE FROM plan_versions WHERE id = $1", pv },
    }
    for _, c in ipairs(cases) do
      refused_55000(c[1], as_runtime(c[2], c[3], c[4], c[5]))
    end
    -- through a plan version no request references: a node moved into the
    -- sealed one, an edge of it joining the sealed one's nodes
    local _, other, other_pn = new_template()
    refused_55000(sealed("plan_nodes", "UPDATE"),
      as_runtime("UPDATE plan_nodes SET plan_version_id = $1, node_key = 'c' WHERE id = $2", pv, other_pn.a))
    refused_55000(sealed("plan_edges", "INSERT"),
      as_runtime("INSERT INTO plan_edges VALUES ($1, $2, $3)", other, pn.b, pn.a))
    -- the unreferenced version's own rows still change (nothing approved them)
    assert.is_true((as_runtime([[UPDATE plan_nodes SET config = '{"sim": {"observes": 2}}' WHERE id = $1]],
      other_pn.a)))
    local n = s:query("SELECT count(*)::int AS n FROM plan_nodes WHERE plan_version_id = $1", pv)[1].n
    assert.equals(2, n)
  end)

  -- sql/0201: the seal's trigger read movement_requests from the session's
  -- temporary schema first, and found no request referencing the plan
  it("keeps a sealed plan sealed whatever temporary table the session holds", function()
    local req, pn = new_pending()
    s:begin()
    local ok, err = pcall(function()
      s:exec("CREATE TEMP TABLE movement_requests (LIKE public.movement_requests) ON COMMIT DROP")
      s:exec("GRANT ALL ON pg_temp.movement_requests TO PUBLIC")
      s:exec("SET LOCAL ROLE qtg_runtime")
      return s:query([[UPDATE plan_nodes SET config = config || '{"destination": "0x00000000000000000000000000000000000000bb"}'
                        WHERE id = $1]], pn.a)
    end)
    s:rollback()
    refused_55000(string.format("plan_nodes of plan version %s is sealed: request %s references it (UPDATE refused)",
      req.plan_version_id, req.id), ok, err)
  end)

  it("may not change which plan node a request's node runs", function()
    local req, pn = new_pending()
    local node = s:query("SELECT id FROM movement_request_nodes WHERE request_id = $1::uuid AND node_key = 'a'",
      req.id)[1].id
    for _, c in ipairs({
      { "executor", "executor = 'evm_transfer'" },
      { "action_type", "action_type = 'evm_transfer'" },
      { "plan_node_id", "plan_node_id = $2", pn.b },
      { "node_key", "node_key = 'c'" },
      { "node_kind", "node_kind = 'observe'" },
    }) do
      refused_55000(string.format("movement_request_nodes.%s of node %s is immutable: it names the plan node "
        .. "the node runs", c[1], node),
        as_runtime("UPDATE movement_request_nodes SET " .. c[2] .. " WHERE id = $1::uuid", node, c[3]))
    end
    assert.is_true((as_runtime("UPDATE movement_request_nodes SET error_detail = 'x' WHERE id = $1::uuid", node)))
  end)

  -- A node deleted and inserted again naming another plan's step (or
  -- saying another executor than its step's) was run by the dispatcher,
  -- and the state check could not tell (sql/0203).
  it("may not insert a node that is not a step of its request's plan, nor delete a node or a request", function()
    local req, pn = new_pending()
    local other, other_pn = new_pending()
    local step = s:query([[SELECT node_kind, action_type, executor FROM plan_nodes WHERE id = $1]], pn.b)[1]
    local insert = [[INSERT INTO movement_request_nodes (request_id, plan_node_id, node_key, node_kind,
                       action_type, executor, node_state)
                     SELECT $1::uuid, id, $2, node_kind, action_type, $3, 'BLOCKED' FROM plan_nodes WHERE id = $4]]
    -- another plan version's step, under a key the request does not have
    refused_55000(string.format("movement_request_nodes: plan node %s is not a step of plan version %s (request %s)",
      other_pn.a, req.plan_version_id, req.id), as_runtime(insert, req.id, "a_again", step.executor, other_pn.a))
    -- its own plan's step under another key, or with another executor
    refused_55000(string.format("movement_request_nodes: a node of plan node %s is (b, %s, %s, %s), not (b_again, %s, %s, %s)",
      pn.b, step.node_kind, step.action_type, step.executor, step.node_kind, step.action_type, step.executor),
      as_runtime(insert, req.id, "b_again", step.executor, pn.b))
    -- its step's key once more (the owner took the node out: the runtime may not), another executor
    s:query("DELETE FROM movement_request_nodes WHERE request_id = $1::uuid AND node_key = 'b'", req.id)
    refused_55000(string.format("movement_request_nodes: a node of plan node %s is (b, %s, %s, %s), not (b, %s, %s, evm_transfer)",
      pn.b, step.node_kind, step.action_type, step.executor, step.node_kind, step.action_type),
      as_runtime(insert, req.id, "b", "evm_transfer", pn.b))
    -- the step as it is: the engine's own insert, allowed
    assert.is_true((as_runtime(insert, req.id, "b", step.executor, pn.b)))
    -- deleting: no privilege, for a node or a request
    for _, c in ipairs({ { "DELETE FROM movement_request_nodes WHERE request_id = $1::uuid", "movement_request_nodes" },
                         { "DELETE FROM movement_requests WHERE id = $1::uuid", "movement_requests" } }) do
      local ok, err = as_runtime(c[1], other.id)
      assert.is_false(ok, c[1])
      assert.equals("42501", err.sqlstate, tostring(err.message))
      assert.equals("permission denied for table " .. c[2], err.message)
    end
    assert.equals(2, s:query("SELECT count(*)::int AS n FROM movement_request_nodes WHERE request_id = $1::uuid",
      other.id)[1].n)
  end)

  -- An edge of one plan version joined another version's node, and a
  -- pending request moved to another plan kept its nodes: the plan
  -- document approvers sign read "gate, then transfer" while the signer,
  -- following the edge, reached a step of another version that asked no
  -- attestation (sql/0209; a review, session 36).
  it("may not join two plan versions by an edge, nor move a request that has nodes to another plan", function()
    local _, y, ypn = new_template()
    local _, z, zpn = new_template()
    for _, c in ipairs({ { y, zpn.a, ypn.b }, { y, ypn.a, zpn.b }, { z, ypn.b, ypn.a }, { y, zpn.b, zpn.a } }) do
      local ok, err = as_runtime("INSERT INTO plan_edges (plan_version_id, from_node_id, to_node_id) VALUES ($1, $2, $3)",
        c[1], c[2], c[3])
      assert.is_false(ok, "an edge of version " .. c[1] .. " from " .. c[2] .. " to " .. c[3])
      assert.equals("23503", err.sqlstate, tostring(err.message))
    end
    local req = new_pending()
    refused_55000(string.format("request %s has nodes of plan version %s: its plan version does not change", req.id,
      req.plan_version_id), as_runtime("UPDATE movement_requests SET plan_version_id = $2 WHERE id = $1::uuid", req.id, y))
  end)

  -- Two runtime sessions, one inserting a node of the request's plan
  -- version while the other moved the request to another plan, each
  -- committed without seeing the other and left a request holding a node
  -- of another version's step (sql/0210; a review, session 37).
  it("makes a node's insert and a change of its request's plan wait for each other, and refuses the second", function()
    local common = require "spec.lua.support.common"
    local _, y = new_template()
    local s2 = qtg.db.acquire()
    local ok, err = pcall(function()
      for _, first in ipairs({ "move", "insert" }) do
        local req, zpn = new_pending()
        -- a pending request whose nodes are not written yet (the owner may delete them)
        s:query("DELETE FROM movement_request_nodes WHERE request_id = $1::uuid", req.id)
        local change = {
          move = function(x) return x:query("UPDATE movement_requests SET plan_version_id = $2 WHERE id = $1::uuid", req.id, y) end,
          insert = function(x)
            return x:query([[INSERT INTO movement_request_nodes (request_id, plan_node_id, node_key, node_kind,
                               action_type, executor, node_state)
                             SELECT $1::uuid, id, node_key, node_kind, action_type, executor, 'SKIPPED'
                               FROM plan_nodes WHERE id = $2]], req.id, zpn.a)
          end,
        }
        local second = first == "move" and "insert" or "move"
        s:begin()
        s:exec("SET LOCAL ROLE qtg_runtime")
        change[first](s)
        local pid = s:query("SELECT pg_backend_pid() AS p")[1].p
        s2:begin()
        s2:exec("SET LOCAL ROLE qtg_runtime")
        local task = qtg.spawn(function() return change[second](s2) end)
        common.wait_for(function() return common.waiting_on(pid) > 0 end, 10, "the " .. second .. " waiting on the " .. first)
        s:commit()
        local done, why = qtg.join(task)
        s2:rollback()
        if first == "move" then
          refused_55000(string.format("movement_request_nodes: plan node %s is not a step of plan version %s (request %s)",
            zpn.a, y, req.id), done, why)
        else
          refused_55000(string.format("request %s has nodes of plan version %s: its plan version does not change",
            req.id, req.plan_version_id), done, why)
        end
        local held = s:query([[SELECT r.plan_version_id AS v, count(n.id)::int AS nodes FROM movement_requests r
                                 LEFT JOIN movement_request_nodes n ON n.request_id = r.id
                                WHERE r.id = $1::uuid GROUP BY r.plan_version_id]], req.id)[1]
        assert.same(first == "move" and { v = y, nodes = 0 } or { v = req.plan_version_id, nodes = 1 }, held)
      end
    end)
    if s:in_transaction() then s:rollback() end
    if s2:in_transaction() then s2:rollback() end
    s2:release()
    assert(ok, err)
  end)

  -- The seal and the node check read other rows with a plain SELECT: from
  -- a REPEATABLE READ snapshot taken before a request existed, its sealed
  -- plan was changed after it (sql/0209).
  it("writes the plan tables, a request's nodes and its plan version only at READ COMMITTED", function()
    local req, pn = new_pending()
    local step = s:query("SELECT node_kind, action_type, executor FROM plan_nodes WHERE id = $1", pn.b)[1]
    for _, level in ipairs({ "repeatable read", "serializable" }) do
      for _, c in ipairs({
        { "UPDATE", "plan_nodes", "UPDATE plan_nodes SET config = config WHERE id = $1", pn.a },
        { "DELETE", "plan_edges", "DELETE FROM plan_edges WHERE plan_version_id = $1", req.plan_version_id },
        { "UPDATE", "plan_versions", "UPDATE plan_versions SET risk_controls = risk_controls WHERE id = $1",
          req.plan_version_id },
        { "INSERT", "movement_request_nodes", [[INSERT INTO movement_request_nodes (request_id, plan_node_id, node_key,
            node_kind, action_type, executor, node_state) VALUES ($1::uuid, $2, 'b2', $3, $4, $5, 'BLOCKED')]],
          req.id, pn.b, step.node_kind, step.action_type, step.executor },
        { "UPDATE", "movement_requests", "UPDATE movement_requests SET plan_version_id = plan_version_id WHERE id = $1::uuid",
          req.id },
      }) do
        s:begin()
        s:exec("SET TRANSACTION ISOLATION LEVEL " .. level)
        s:exec("SET LOCAL ROLE qtg_runtime")
        local ok, err = pcall(s.query, s, c[3], unpack(c, 4))
        s:rollback()
        refused_55000(string.format("%s on %s runs only at READ COMMITTED, not %s: its checks must see every commit "
          .. "before it", c[1], c[2], level), ok, err)
      end
    end
  end)

  it("still loads a new plan version of a template whose old one is sealed, and approves and runs a request on it", function()
    local sup = require "spec.lua.support.engine"
    local templates = require "qtg.templates"
    local req, _, key = new_pending()
    local doc = sup.doc(key, { { "a", "action", "withdrawal", { sim = { observes = 0 } } } })
    local c = assert(templates.validate_and_compile(doc, "spec:" .. key))
    s:begin()
    s:exec("SET LOCAL ROLE qtg_runtime")
    local ok, stored = pcall(templates.store, s, c)
    if ok then s:commit() else s:rollback() end
    assert(ok, stored)
    assert.is_true(stored.created)
    assert.equals(2, stored.version)
    assert.is_true(stored.plan_version_id ~= req.plan_version_id)
    local edges = s:query("SELECT count(*)::int AS n FROM plan_edges WHERE plan_version_id = $1",
      req.plan_version_id)[1].n
    assert.equals(1, edges)
    -- the pending request on the old version is approved and completes
    sup.approve(s, req.id)
    local done = sup.drive(s, function() return sup.request(s, req.id).request_state == "COMPLETED" end, 30)
    assert.is_true(done, sup.request(s, req.id).request_state)
  end)

  it("runs a real daemon that moves a request to COMPLETED with its audit trail", function()
    local sup = require "spec.lua.support.engine"
    local class = "spec-roles-" .. sup.uid()
    local key = "spec_roles_" .. sup.uid():lower():gsub("[^a-z0-9]", "_")
    sup.load_doc(s, sup.doc(key, { { "a", "action", "withdrawal", { sim = { observes = 1 } } } }))
    local daemon = support.start(support.base_env{
      MG_DATABASE_URL = url_as(LOGIN), MG_NETWORK_CLASS = class,
      MG_NODE_DISPATCH_INTERVAL_SECONDS = "0.2", MG_NODE_OBSERVE_INTERVAL_SECONDS = "0.2",
      MG_EVM_NONCE_REAPER_ENABLED = "false", MG_CCIP_STRANDED_REAPER_ENABLED = "false",
      MG_BALANCE_HISTORY_ENABLED = "false",
    }, { "run" })
    -- the request is made in the daemon's class, as a second process would
    local old = qtg.settings.network_class
    local req
    local ok, err = pcall(function()
      rawset(qtg.settings, "network_class", class)
      req = sup.create_approved(s, key, { callback_url = false })
    end)
    rawset(qtg.settings, "network_class", old)
    assert(ok, err)
    local done = support.eventually(function()
      return sup.request(s, req.id).request_state == "COMPLETED"
        and s:query([[SELECT count(*)::int AS n FROM audit_outbox WHERE request_id = $1::uuid]],
          req.id)[1].n == 0
    end, 60, 0.2)
    assert(done, "not completed: " .. tostring(support.read(daemon.log)):sub(-2000))
    local actions = {}
    for _, r in ipairs(s:query([[SELECT action FROM audit_events WHERE request_id = $1::uuid
                                  ORDER BY chain_seq]], req.id)) do
      actions[#actions + 1] = r.action
    end
    assert.is_truthy(table.concat(actions, " "):find("request.completed", 1, true), table.concat(actions, " "))
    assert.is_true(require("qtg.audit").verify(s).ok)
    assert.equals(0, support.stop(daemon, 30))
    assert.is_nil(support.read(daemon.log):find("permission denied", 1, true), support.read(daemon.log))
  end)
end)

describe("qtgd check on the daemon's role", function()
  local function check(env)
    env.MG_SIM_NETWORK_CLASSES = "devnet,test*"
    return support.run(support.base_env(env), { support.bin, "check" })
  end
  local function line(out, level)
    return out:match("\n?(" .. level .. "%s+db role[^\n]*)")
  end

  it("is ok for a member of qtg_runtime that owns nothing", function()
    local rc, out = check({ MG_DATABASE_URL = url_as(LOGIN), MG_NETWORK_CLASS = "mainnet" })
    assert.is_truthy(line(out, "ok"), out)
    assert.matches(LOGIN .. " is a member of qtg_runtime and owns nothing", out, 1, true)
    assert.is_nil(line(out, "FAIL"), out)
    assert.is_number(rc)
  end)

  it("FAILs a superuser outside the development classes, and warns on them", function()
    local rc, out = check({ MG_NETWORK_CLASS = "mainnet" })
    assert.equals(1, rc, out)
    assert.matches("is a superuser: it can disable the audit trail's guards", line(out, "FAIL"), 1, true)
    rc, out = check({ MG_NETWORK_CLASS = "devnet" })
    assert.matches("a warning: MG_SIM_NETWORK_CLASSES lets the stand-in executor run on devnet", line(out, "warn") or "", 1, true)
    assert.is_nil(line(out, "FAIL"), out)
  end)

  it("FAILs a role that may create in schema public (it could shadow a built-in there)", function()
    s = qtg.db.acquire()
    s:exec("GRANT CREATE ON SCHEMA public TO " .. LOGIN)
    local ok, rc, out = pcall(check, { MG_DATABASE_URL = url_as(LOGIN), MG_NETWORK_CLASS = "mainnet" })
    s:exec("REVOKE CREATE ON SCHEMA public FROM " .. LOGIN)
    s:release()
    assert(ok, rc)
    assert.equals(1, rc, out)
    assert.matches(LOGIN .. " may create objects in schema public", line(out, "FAIL"), 1, true)
  end)

  it("warns about a role that may create temporary tables", function()
    local rc, out = check({ MG_DATABASE_URL = url_as(LOGIN), MG_NETWORK_CLASS = "mainnet" })
    assert.is_nil(out:find("temporary tables", 1, true), out) -- qtgd migrate revoked PUBLIC's
    s = qtg.db.acquire()
    s:exec("GRANT TEMPORARY ON DATABASE " .. s:query("SELECT current_database() AS d")[1].d .. " TO " .. LOGIN)
    local ok
    ok, rc, out = pcall(check, { MG_DATABASE_URL = url_as(LOGIN), MG_NETWORK_CLASS = "mainnet" })
    s:exec("REVOKE TEMPORARY ON DATABASE " .. s:query("SELECT current_database() AS d")[1].d .. " FROM " .. LOGIN)
    s:release()
    assert(ok, rc)
    assert.matches(LOGIN .. " may create temporary tables", line(out, "warn") or "", 1, true)
  end)

  it("FAILs a role that owns tables", function()
    s = qtg.db.acquire()
    s:exec([[DO $$ BEGIN
      IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'spec_owner_login') THEN
        CREATE ROLE spec_owner_login LOGIN;
      END IF; END $$]])
    s:exec("CREATE TABLE IF NOT EXISTS spec_owned_by_login (x int)")
    s:exec("ALTER TABLE spec_owned_by_login OWNER TO spec_owner_login")
    s:release()
    local rc, out = check({ MG_DATABASE_URL = url_as("spec_owner_login"), MG_NETWORK_CLASS = "mainnet" })
    assert.equals(1, rc, out)
    assert.matches("spec_owner_login owns 1 table: it can alter them", line(out, "FAIL"), 1, true)
  end)
end)
