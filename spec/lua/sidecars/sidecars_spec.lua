-- The sidecar workers other than callbacks and signers (docs/callbacks.md):
-- expiration_checker, template proposals and
-- their expiry, executor health states, the audit promoter (exactly once, in
-- order, with two processes) and worker heartbeats.  Real PostgreSQL; the
-- per-class workers run in child qtgd processes of their own network class.
local qtg = require "qtg"
local cjson = require "cjson"

local sup -- spec/lua/support/sidecar.lua

-- One tick of a worker on a fresh session, as the runtime runs it.
local function tick(name) return sup.tick(name) end

-- Runs `sql` in s's open transaction with the plans that rescan a subquery
-- once per outer row (no hash, merge, sort, hash aggregate or materialize):
-- the plan under which `id IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)`
-- takes more than n rows.  The comment gives the statement a plan of its own.
local function query_with_rescan_plans(s, sql, ...)
  s:exec([[SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off;
           SET LOCAL enable_hashagg = off; SET LOCAL enable_material = off;
           SET LOCAL enable_sort = off]])
  return s:query(sql .. "\n-- planned to rescan subqueries", ...)
end

local function run_child(dir, name, class, worker, mode)
  return sup.wait_child(sup.start_child(dir, name, { MG_NETWORK_CLASS = class },
    { worker, "60", mode or "once" }), 120)
end

describe("expiration_checker", function()
  local s, s2, dir, T
  setup(function()
    sup = require "spec.lua.support.sidecar"
    s, s2 = qtg.db.acquire(), qtg.db.acquire()
    dir = sup.tmpdir()
    T = sup.template(s, "spec_expiry")
  end)
  teardown(function()
    for _, x in ipairs({ s, s2 }) do
      if x:in_transaction() then x:rollback() end
      x:release()
    end
    sup.cleanup()
  end)

  local function make(class, expires_in)
    local r = sup.request(s, T, class, "http://127.0.0.1:9/cb")
    if expires_in == "none" then
      s:query("UPDATE movement_requests SET expires_at = NULL WHERE id = $1::uuid", r.id)
    else
      s:query([[UPDATE movement_requests SET expires_at = now() + make_interval(secs => $2)
                 WHERE id = $1::uuid]], r.id, expires_in)
    end
    return r.id
  end

  local function req(id)
    return s:query("SELECT * FROM movement_requests WHERE id = $1::uuid", id)[1]
  end

  it("expires past-due PENDING_APPROVAL requests of its class with a callback and audit rows in one go", function()
    local class, other = sup.uid("exp"), sup.uid("exp-other")
    local due1, due2 = make(class, -5), make(class, -1)
    local future, never = make(class, 3600), make(class, "none")
    local foreign = make(other, -5)
    local res = run_child(dir, "exp1", class, "expiration_checker")
    assert.equals(2, res.items)
    for _, id in ipairs({ due1, due2 }) do
      local r = req(id)
      assert.equals("EXPIRED", r.request_state)
      assert.equals("APPROVAL_EXPIRED", r.last_error_code)
      assert.are_not.equal(qtg.db.NULL, r.finished_at)
      for _, n in ipairs(s:query("SELECT * FROM movement_request_nodes WHERE request_id = $1::uuid", id)) do
        assert.equals("CANCELLED", n.node_state)
      end
      local cb = s:query([[SELECT * FROM movement_callback_outbox WHERE request_id = $1::uuid
                            AND event_type = 'request_expired']], id)
      assert.equals(1, #cb)
      local body = cjson.decode(cb[1].payload)
      assert.equals("EXPIRED", body.request_state)
      assert.equals("APPROVAL_EXPIRED", body.data.reason)
      assert.equals("PENDING_APPROVAL", body.data.from_state)
      local audit = s:query([[SELECT * FROM audit_outbox WHERE request_id = $1::uuid
                               AND action = 'request.expire']], id)
      assert.equals(1, #audit)
      assert.equals("system:expiration_checker", audit[1].actor)
    end
    for _, id in ipairs({ future, never, foreign }) do
      assert.equals("PENDING_APPROVAL", req(id).request_state)
    end
  end)

  it("takes at most 20 per pass and skips a request locked elsewhere", function()
    local class = sup.uid("exp-batch")
    local ids = {}
    for i = 1, 23 do ids[i] = make(class, -2) end
    s2:begin()
    s2:query("SELECT id FROM movement_requests WHERE id = $1::uuid FOR UPDATE", ids[1])
    local first = run_child(dir, "exp-b1", class, "expiration_checker")
    assert.equals(20, first.items)
    local second = run_child(dir, "exp-b2", class, "expiration_checker")
    assert.equals(2, second.items) -- the locked one is skipped, not waited for
    assert.equals("PENDING_APPROVAL", req(ids[1]).request_state)
    s2:rollback()
    local third = run_child(dir, "exp-b3", class, "expiration_checker")
    assert.equals(1, third.items)
    local left = s:query([[SELECT count(*)::int AS n FROM movement_requests
                            WHERE network_class = $1 AND request_state <> 'EXPIRED']], class)[1].n
    assert.equals(0, left)
  end)

  it("writes nothing of a pass that fails part-way: its pipeline transaction rolls back", function()
    local ids = { make(nil, -5), make(nil, -4) }
    local nodes_db = require "qtg.nodes"
    local real, calls = nodes_db.set_request_state, 0
    nodes_db.set_request_state = function(...)
      calls = calls + 1
      if calls == 2 then error({ code = "SPEC_BOOM", message = "second expiry fails" }) end
      return real(...)
    end
    local ok, err = pcall(tick, "expiration_checker")
    nodes_db.set_request_state = real
    assert.is_false(ok)
    assert.equals("SPEC_BOOM", err.code)
    for _, id in ipairs(ids) do
      assert.equals("PENDING_APPROVAL", req(id).request_state)
      assert.equals(0, #s:query([[SELECT 1 FROM movement_callback_outbox WHERE request_id = $1::uuid
                                   AND event_type = 'request_expired']], id))
      for _, n in ipairs(s:query("SELECT node_state FROM movement_request_nodes WHERE request_id = $1::uuid", id)) do
        assert.are_not.equal("CANCELLED", n.node_state)
      end
    end
    assert.equals(2, tick("expiration_checker"))
    for _, id in ipairs(ids) do assert.equals("EXPIRED", req(id).request_state) end
  end)

  it("leaves a request approved before the pass alone", function()
    local class = sup.uid("exp-approved")
    -- approved in this process's class, then moved to the class under test
    local id = make(nil, 3600)
    require("qtg.requests").approve(s, id, "console:spec")
    require("spec.lua.support.common").unfrozen(s, "UPDATE movement_requests SET network_class = $2 WHERE id = $1::uuid", id, class)
    s:query("UPDATE movement_requests SET expires_at = now() - interval '1 second' WHERE id = $1::uuid", id)
    local res = run_child(dir, "exp-appr", class, "expiration_checker")
    assert.equals(0, res.items)
    assert.are_not.equal("EXPIRED", req(id).request_state)
  end)
end)

describe("template proposals", function()
  local s, proposals, KEY

  local function doc(amount_field)
    return { template_key = KEY, name = "proposed " .. amount_field, nodes = {
      { key = "a", kind = "action", action_type = "withdrawal", config = { note = amount_field } } },
      edges = {}, intent = { required = { "asset", amount_field } } }
  end

  setup(function()
    sup = require "spec.lua.support.sidecar"
    proposals = require "qtg.proposals"
    s = qtg.db.acquire()
    KEY = "spec_proposed_" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
  end)
  teardown(function()
    if s:in_transaction() then s:rollback() end
    s:release()
  end)

  local function get(id)
    return s:query("SELECT * FROM template_proposals WHERE id = $1", id)[1]
  end

  it("proposes, refuses a self-review, approves into a new plan version, audited", function()
    local p = proposals.propose(s, doc("amount"), "console:alice", "first version")
    assert.equals("PENDING", p.proposal_state)
    local ttl = s:query([[SELECT extract(epoch from expires_at - created_at)::float8 AS t
                            FROM template_proposals WHERE id = $1]], p.id)[1].t
    assert.is_true(math.abs(ttl - qtg.settings.template_proposal_ttl_seconds) < 5)
    assert.matches("already pending", select(2, pcall(proposals.propose, s, doc("amount"), "console:carol")), 1, true)
    assert.matches("cannot review", select(2, pcall(proposals.approve, s, p.id, "console:alice")), 1, true)
    assert.equals("PENDING", get(p.id).proposal_state)

    local done = proposals.approve(s, p.id, "console:bob", "looks right")
    assert.equals("APPROVED", done.proposal_state)
    assert.equals("console:bob", done.decided_by)
    local pv = s:query([[SELECT pv.*, t.template_key FROM plan_versions pv
                           JOIN movement_templates t ON t.id = pv.template_id WHERE pv.id = $1]],
      done.plan_version_id)[1]
    assert.equals(KEY, pv.template_key)
    assert.equals(p.content_hash, pv.content_hash)
    local nodes = s:query("SELECT * FROM plan_nodes WHERE plan_version_id = $1", pv.id)
    assert.equals(1, #nodes)
    for _, action in ipairs({ "template_proposal.proposed", "template_proposal.approved" }) do
      assert.equals(1, #s:query([[SELECT 1 FROM audit_outbox WHERE action = $1 AND entity_id = $2]],
        action, tostring(p.id)))
    end
    -- decided is final, in Lua and in the database
    assert.matches("is APPROVED", select(2, pcall(proposals.reject, s, p.id, "console:carol")), 1, true)
    assert.has_error(function()
      s:query("UPDATE template_proposals SET proposal_state = 'PENDING', decided_at = NULL WHERE id = $1", p.id)
    end)
    -- the same content as the latest version is not a proposal
    assert.matches("already has this content",
      select(2, pcall(proposals.propose, s, doc("amount"), "console:alice")), 1, true)
  end)

  it("refuses invalid definitions and bad arguments, writing nothing", function()
    local before = s:query("SELECT count(*)::int AS n FROM template_proposals")[1].n
    local bad = {
      { nodes = {} },
      { template_key = "Bad-Key", name = "x", nodes = { { key = "a", kind = "action", action_type = "withdrawal" } } },
      { template_key = KEY, name = "x", nodes = {} },
      { template_key = KEY, name = "x", nodes = { { key = "a", kind = "action", action_type = "withdrawal" } },
        edges = { { from = "a", to = "zz" } } },
      "{not json",
      42,
    }
    for _, d in ipairs(bad) do
      assert.has_error(function() proposals.propose(s, d, "console:alice") end)
    end
    assert.has_error(function() proposals.propose(s, doc("qty"), "alice") end)
    assert.has_error(function() proposals.approve(s, "1", "console:bob") end)
    assert.has_error(function() proposals.approve(s, 1.5, "console:bob") end)
    assert.matches("no proposal", select(2, pcall(proposals.approve, s, 987654321, "console:bob")), 1, true)
    assert.has_error(function() proposals.list(s, "WHATEVER") end)
    assert.equals(before, s:query("SELECT count(*)::int AS n FROM template_proposals")[1].n)
    assert.is_false(s:in_transaction())
  end)

  it("refuses to approve a proposal made against an older plan version", function()
    local p1 = proposals.propose(s, doc("qty_a"), "console:alice")
    local p2 = proposals.propose(s, doc("qty_b"), "console:alice")
    proposals.approve(s, p1.id, "console:bob")
    assert.matches("changed since proposal", select(2, pcall(proposals.approve, s, p2.id, "console:bob")), 1, true)
    assert.equals("PENDING", get(p2.id).proposal_state)
    local r = proposals.reject(s, p2.id, "console:bob", "stale")
    assert.equals("REJECTED", r.proposal_state)
    assert.equals("stale", r.decision_note)
  end)

  it("expires proposals whose window passed, audited, and refuses late reviews", function()
    local due = proposals.propose(s, doc("qty_c"), "console:alice")
    local open = proposals.propose(s, doc("qty_d"), "console:alice")
    s:query("UPDATE template_proposals SET expires_at = now() - interval '1 second' WHERE id = $1", due.id)
    -- the window is closed even before the worker passes
    assert.matches("review window closed", select(2, pcall(proposals.approve, s, due.id, "console:bob")), 1, true)
    assert.is_true(tick("template_proposal_expiration") >= 1)
    local d = get(due.id)
    assert.equals("EXPIRED", d.proposal_state)
    assert.are_not.equal(qtg.db.NULL, d.decided_at)
    assert.equals(qtg.db.NULL, d.decided_by)
    assert.equals("PENDING", get(open.id).proposal_state)
    assert.equals(1, #s:query([[SELECT 1 FROM audit_outbox WHERE action = 'template_proposal.expired'
                                 AND entity_id = $1 AND actor = 'system:template_proposal_expiration']],
      tostring(due.id)))
    assert.matches("is EXPIRED", select(2, pcall(proposals.approve, s, due.id, "console:bob")), 1, true)
    assert.equals(0, tick("template_proposal_expiration"))
    local listed = proposals.list(s, "EXPIRED")
    assert.is_true(#listed >= 1)
    for _, row in ipairs(listed) do assert.equals("EXPIRED", row.proposal_state) end
  end)

  it("expires at most its batch in a pass, whatever plan PostgreSQL picks", function()
    local ids = {}
    for i = 1, 3 do
      local p = proposals.propose(s, doc("qty_batch" .. i), "console:alice")
      s:query("UPDATE template_proposals SET expires_at = now() - interval '1 second' WHERE id = $1", p.id)
      ids[i] = p.id
    end
    s:begin()
    local rows = query_with_rescan_plans(s, proposals.EXPIRE_SQL, 1)
    s:rollback()
    assert.equals(1, #rows)
    for _, id in ipairs(ids) do assert.equals("PENDING", get(id).proposal_state) end
    assert.equals(3, tick("template_proposal_expiration"))
  end)
end)

describe("executor_health", function()
  local s, executors, saved
  local FAKES = {
    spec_degraded = { health = function() return { state = "degraded", detail = "slow provider" } end },
    spec_raises = { health = function() error("provider unreachable") end },
    spec_garbage = { health = function() return { state = "fine" } end },
    spec_no_health = { submit = function() end },
  }

  setup(function()
    sup = require "spec.lua.support.sidecar"
    executors = require "qtg.executors"
    s = qtg.db.acquire()
    saved = {}
    for k, v in pairs(executors.ADAPTERS) do saved[k] = v end
    for name, mod in pairs(FAKES) do
      package.loaded["spec.executor." .. name] = mod
      executors.ADAPTERS[name] = "spec.executor." .. name
    end
    executors.ADAPTERS.spec_missing = "spec.executor.does_not_exist"
  end)
  teardown(function()
    for k in pairs(executors.ADAPTERS) do executors.ADAPTERS[k] = saved[k] end
    for name in pairs(FAKES) do package.loaded["spec.executor." .. name] = nil end
    s:release()
  end)

  local function health()
    local out = {}
    for _, r in ipairs(s:query([[SELECT * FROM component_health
                                  WHERE network_class = $1 AND component_kind = 'executor']],
        qtg.settings.network_class)) do
      out[r.component_name] = r
    end
    return out
  end

  it("persists each executor's health: healthy, degraded, down, unknown", function()
    local n = tick("executor_health")
    local h = health()
    assert.is_true(n >= 7)
    assert.equals("healthy", h.sim.health_state)
    assert.equals("healthy", h.manual.health_state)
    assert.are_not.equal(qtg.db.NULL, h.sim.last_healthy_at)
    assert.equals("degraded", h.spec_degraded.health_state)
    assert.equals("slow provider", h.spec_degraded.detail.detail)
    assert.equals("down", h.spec_raises.health_state)
    assert.matches("provider unreachable", h.spec_raises.last_error, 1, true)
    assert.equals("down", h.spec_garbage.health_state)
    assert.matches("EXECUTOR_BAD_RESPONSE", h.spec_garbage.last_error, 1, true)
    assert.equals("unknown", h.spec_no_health.health_state)
    assert.equals("down", h.spec_missing.health_state)
    assert.matches("failed to load", h.spec_missing.last_error, 1, true)
  end)

  -- A health detail or a raise often quotes a node or a provider: any
  -- bytes, a character split where a message was cut, latin-1, 0xff, NUL.
  it("records every component's health whatever bytes a detail or an error holds", function()
    local R = "\239\191\189" -- U+FFFD
    package.loaded["spec.executor.spec_bytes_detail"] = { health = function()
      return { state = "degraded", detail = "HTTP 502: " .. string.rep("x", 10) .. "\226\128 caf\233 \255\0" } end }
    package.loaded["spec.executor.spec_bytes_raise"] = { health = function()
      error(string.rep("\195\169", 200), 0) end }
    executors.ADAPTERS.spec_bytes_detail = "spec.executor.spec_bytes_detail"
    executors.ADAPTERS.spec_bytes_raise = "spec.executor.spec_bytes_raise"
    local ok, n = pcall(tick, "executor_health")
    executors.ADAPTERS.spec_bytes_detail, executors.ADAPTERS.spec_bytes_raise = nil, nil
    package.loaded["spec.executor.spec_bytes_detail"], package.loaded["spec.executor.spec_bytes_raise"] = nil, nil
    assert.is_true(ok, tostring(n))
    local h = health()
    assert.equals("healthy", h.sim.health_state)
    assert.equals("degraded", h.spec_bytes_detail.health_state)
    assert.equals("HTTP 502: " .. string.rep("x", 10) .. R .. R .. " caf" .. R .. " " .. R .. R,
      h.spec_bytes_detail.detail.detail)
    assert.equals("down", h.spec_bytes_raise.health_state)
    assert.matches("^EXECUTOR_ERROR: health raised: [\195\169]+" .. R .. "%.%.%.$", h.spec_bytes_raise.last_error)
  end)

  it("keeps state_changed_at while a state holds and marks a component that left unknown", function()
    tick("executor_health")
    local before = health()
    executors.ADAPTERS.spec_degraded = nil
    package.loaded["spec.executor.spec_raises"] = { health = function() return { state = "healthy" } end }
    tick("executor_health")
    local after = health()
    assert.equals(before.sim.state_changed_at, after.sim.state_changed_at)
    assert.are_not.equal(before.sim.checked_at, after.sim.checked_at)
    assert.equals("healthy", after.spec_raises.health_state)
    assert.are_not.equal(before.spec_raises.state_changed_at, after.spec_raises.state_changed_at)
    assert.equals(qtg.db.NULL, after.spec_raises.last_error)
    assert.equals("unknown", after.spec_degraded.health_state)
    assert.equals("no longer registered in this runtime", after.spec_degraded.last_error)
    assert.equals("slow provider", after.spec_degraded.detail.detail) -- last evidence kept
  end)
end)

describe("audit_outbox_promoter", function()
  local s, s2, dir, promoter
  setup(function()
    sup = require "spec.lua.support.sidecar"
    promoter = require "qtg.workers.audit_outbox_promoter"
    s, s2 = qtg.db.acquire(), qtg.db.acquire()
    dir = sup.tmpdir()
  end)
  teardown(function()
    for _, x in ipairs({ s, s2 }) do
      if x:in_transaction() then x:rollback() end
      x:release()
    end
    sup.cleanup()
  end)

  local function fill(n, tag)
    return s:query([[INSERT INTO audit_outbox (actor, action, entity_type, entity_id, detail)
                     SELECT 'system:spec', $2, 'spec', g::text, jsonb_build_object('n', g)
                       FROM generate_series(1, $1) g RETURNING id]], n, tag)
  end

  it("promotes every row exactly once and in order with two processes", function()
    -- drain what earlier specs left (a tick promotes at most its batch)
    local drained = 0
    repeat drained = drained + 1 until tick("audit_outbox_promoter") == 0 or drained > 1000
    local N = 5000
    local tag = sup.uid("spec.two")
    local ids = fill(N, tag)
    local a = sup.start_child(dir, "audit-a", { MG_NETWORK_CLASS = "spec-audit" },
      { "audit_outbox_promoter", "60", "audit" })
    local b = sup.start_child(dir, "audit-b", { MG_NETWORK_CLASS = "spec-audit" },
      { "audit_outbox_promoter", "60", "audit" })
    local ra, rb = sup.wait_child(a, 120), sup.wait_child(b, 120)
    assert.equals(N, ra.items + rb.items)
    assert.equals(0, s:query("SELECT count(*)::int AS n FROM audit_outbox")[1].n)
    local rows = s:query([[SELECT id, outbox_id, entity_id, detail FROM audit_events
                            WHERE action = $1 ORDER BY id]], tag)
    assert.equals(N, #rows)
    for i, r in ipairs(rows) do
      assert.equals(ids[i].id, r.outbox_id) -- each once, in outbox order
      assert.equals(tostring(i), r.entity_id)
      assert.equals(i, r.detail.n)
    end
  end)

  it("promotes at most its batch, whatever plan PostgreSQL picks", function()
    tick("audit_outbox_promoter")
    local tag = sup.uid("spec.batch")
    fill(10, tag)
    s2:begin()
    local n = query_with_rescan_plans(s2, promoter.PROMOTE_SQL, 3)[1].promoted
    assert.equals(3, n)
    s2:rollback()
    assert.equals(10, s:query("SELECT count(*)::int AS n FROM audit_outbox WHERE action = $1", tag)[1].n)
    assert.equals(10, tick("audit_outbox_promoter"))
  end)

  it("promotes nothing while another promoter holds the turn, and nothing twice after a rollback", function()
    tick("audit_outbox_promoter")
    local tag = sup.uid("spec.lock")
    fill(10, tag)
    -- the turn is audit_promoter_turn's row lock (sql/0201), which a
    -- promotion in another transaction holds until it ends
    s2:begin()
    s2:query("SELECT id FROM audit_promoter_turn FOR UPDATE")
    assert.equals(0, tick("audit_outbox_promoter"))
    s2:rollback()
    -- a pass that rolls back leaves its rows in the outbox
    s2:begin()
    assert.equals(3, promoter.promote(s2, 3))
    s2:rollback()
    assert.equals(10, s:query("SELECT count(*)::int AS n FROM audit_outbox WHERE action = $1", tag)[1].n)
    assert.equals(10, tick("audit_outbox_promoter"))
    assert.equals(10, s:query([[SELECT count(DISTINCT outbox_id)::int AS n FROM audit_events
                                 WHERE action = $1]], tag)[1].n)
    assert.has_error(function()
      s:query([[INSERT INTO audit_events (outbox_id, actor, action, entity_type, entity_id, created_at)
                SELECT outbox_id, actor, action, entity_type, entity_id, created_at
                  FROM audit_events WHERE action = $1 LIMIT 1]], tag)
    end)
  end)
end)

describe("worker heartbeats", function()
  local s, heartbeats
  setup(function()
    heartbeats = require "qtg.heartbeats"
    s = qtg.db.acquire()
  end)
  teardown(function()
    pcall(qtg.runtime.stop_worker, "spec_hb_a")
    pcall(qtg.runtime.stop_worker, "spec_hb_b")
    s:release()
  end)

  local function rows()
    local out = {}
    for _, r in ipairs(s:query([[SELECT *, extract(epoch from updated_at)::float8 AS u
                                  FROM worker_heartbeats
                                  WHERE network_class = $1 AND process_id = $2]],
        qtg.settings.network_class, heartbeats.process_id())) do
      out[r.worker_name] = r
    end
    return out
  end

  it("seeds a row per expected worker of this process and class", function()
    assert.matches("^.+:%d+$", heartbeats.process_id())
    local n = heartbeats.seed(s, { { name = "spec_hb_a", group = "core" },
                                   { name = "spec_hb_b", group = "sidecar" } })
    assert.equals(2, n)
    local r = rows()
    assert.equals("core", r.spec_hb_a.group_name)
    assert.equals("sidecar", r.spec_hb_b.group_name)
    assert.equals(qtg.db.NULL, r.spec_hb_a.last_tick_at)
    for _, bad in ipairs({ {}, "x", { { name = "Bad Name", group = "core" } },
                           { { name = "ok_name", group = "other" } }, { { group = "core" } } }) do
      assert.has_error(function() heartbeats.seed(s, bad) end)
    end
  end)

  it("flushes every worker's liveness in one statement, at most once per FLUSH_EVERY", function()
    local count = 0
    qtg.runtime.start_worker{ name = "spec_hb_a", group = "core", interval = 0.05, jitter = 0,
                              tick = function() count = count + 1; return 3 end }
    qtg.runtime.start_worker{ name = "spec_hb_b", group = "sidecar", interval = 0.05, jitter = 0,
                              tick = function() return 0 end }
    sup.wait_for(function() return count >= 2 end, 10, "ticks")
    local n = heartbeats.flush(s)
    assert.equals(#qtg.runtime.workers(), n)
    local r = rows()
    assert.are_not.equal(qtg.db.NULL, r.spec_hb_a.last_tick_at)
    assert.equals(3, r.spec_hb_a.last_count)
    assert.equals(0, r.spec_hb_b.last_count)
    assert.equals(0, r.spec_hb_a.consecutive_errors)
    -- throttled: a second flush right away writes nothing
    local saved = heartbeats.FLUSH_EVERY
    heartbeats.FLUSH_EVERY = 0.3
    assert.equals(0, heartbeats.maybe_flush(s))
    qtg.sleep(0.35)
    -- the flush task flushes on its own
    heartbeats.start()
    sup.wait_for(function() return rows().spec_hb_a.u > r.spec_hb_a.u end, 10, "a heartbeat flush")
    heartbeats.stop()
    heartbeats.FLUSH_EVERY = saved
    local after = rows()
    assert.is_true(after.spec_hb_a.u > r.spec_hb_a.u)
    local live = {}
    for _, row in ipairs(heartbeats.liveness(s)) do
      if row.process_id == heartbeats.process_id() then live[row.worker_name] = row.alive end
    end
    assert.is_true(live.spec_hb_a)
    s:query([[UPDATE worker_heartbeats SET updated_at = now() - interval '61 seconds'
               WHERE network_class = $1 AND process_id = $2 AND worker_name = 'spec_hb_b']],
      qtg.settings.network_class, heartbeats.process_id())
    for _, row in ipairs(heartbeats.liveness(s)) do
      if row.process_id == heartbeats.process_id() then live[row.worker_name] = row.alive end
    end
    assert.is_false(live.spec_hb_b)
    qtg.runtime.stop_worker("spec_hb_a")
    qtg.runtime.stop_worker("spec_hb_b")
  end)
end)

describe("idle passes", function()
  -- statements_sent(fn) -> the statements every session sent while fn ran,
  -- BEGIN and COMMIT included (a pipeline transaction ends with a Sync,
  -- which is no statement)
  local function statements_sent(fn)
    local probe = qtg.db.acquire()
    local methods = getmetatable(probe).__index
    probe:release()
    local real_query, real_exec, sent = methods.query, methods.exec, {}
    methods.query = function(self, sql, ...) sent[#sent + 1] = sql return real_query(self, sql, ...) end
    methods.exec = function(self, sql) sent[#sent + 1] = sql return real_exec(self, sql) end
    local ok, err = pcall(fn)
    methods.query, methods.exec = real_query, real_exec
    assert(ok, err)
    return sent
  end

  local function no_block(sent)
    for _, sql in ipairs(sent) do
      assert.is_nil(sql:match("^%s*BEGIN"), sql)
      assert.is_nil(sql:match("^%s*COMMIT"), sql)
    end
  end

  setup(function() sup = require "spec.lua.support.sidecar" end)

  for _, worker in ipairs({ "expiration_checker", "template_proposal_expiration",
                            "ccip_stranded_reaper", "capital_transfer_followup" }) do
    it(worker .. ": its claim alone, no BEGIN or COMMIT", function()
      local n = 0
      repeat n = n + 1 until tick(worker) == 0 or n > 20
      local sent = statements_sent(function() assert.equals(0, tick(worker)) end)
      assert.equals(1, #sent, table.concat(sent, " | "))
      no_block(sent)
    end)
  end

  it("executor_health: its writes in one transaction with no BEGIN or COMMIT statement", function()
    local sent = statements_sent(function() assert.is_true(tick("executor_health") >= 1) end)
    no_block(sent)
    local wrote = {}
    for _, sql in ipairs(sent) do
      if sql:match("component_health") then wrote[#wrote + 1] = sql end
    end
    assert.is_true(#wrote >= 2, table.concat(sent, " | "))
  end)
end)
