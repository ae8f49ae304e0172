-- The generic plans of the hot statements (qtg.hot_statements: the claims
-- and batch writes of the queue workers) with 10,000 rows in each queue
-- table, most of them history (finished requests, delivered callbacks and
-- notifications): no plan may read a queue table with a sequential scan,
-- since that costs in proportion to the history on every claim, and the
-- dispatcher's claims may not sort their candidates.  The host
-- runs generic plans (plan_cache_mode = force_generic_plan on every
-- connection), so an EXPLAIN with the parameters bound, which plans for
-- those values, would not show what runs.  The rows are loaded and ANALYZEd
-- in one transaction that is rolled back at the end.
local qtg = require "qtg"
local hot = require "qtg.hot_statements"

local sup
local T = "spec_plans_chain"
local N = 10000

local function insert_requests(s, class, n, prefix, states, every)
  sup.insert_requests(s, class, n, T, prefix, states, every)
end

-- Load N requests of template T (one in `every` APPROVED with a READY node,
-- as many EXECUTING with a SUBMITTED node, one in 500 of all with an UNKNOWN
-- node too, the rest COMPLETED; every = 0: all of them COMPLETED), their
-- nodes, N callback rows (10 % pending), N notifications (5 % pending) and N
-- audit outbox rows, in s's open transaction; ANALYZE them.  UNKNOWN is an
-- exception (a provider that could not say), so its nodes are few: with
-- hundreds of them the planner rightly joins the recovery arm's nodes to
-- one read of a small requests table instead of hundreds of probes, and
-- goes back to the probes as the table grows (its choice depends on how
-- many requests earlier specs left, not on this statement).
local function load(s, class, every)
  insert_requests(s, class, N, "plans", {
    request = [[CASE WHEN e.every > 0 AND g % e.every = 0 THEN 'APPROVED'
                     WHEN e.every > 0 AND g % e.every = 1 THEN 'EXECUTING'
                     ELSE 'COMPLETED' END]],
    node = [[CASE WHEN r.request_state = 'COMPLETED' THEN 'COMPLETED'
                  WHEN r.request_state = 'APPROVED' THEN
                    CASE pn.node_key WHEN 'a' THEN 'READY' ELSE 'BLOCKED' END
                  ELSE CASE WHEN pn.node_key = 'a' THEN 'SUBMITTED'
                            WHEN pn.node_key = 'b'
                             AND split_part(r.idempotency_key, '-', 2)::int % 500 = 1 THEN 'UNKNOWN'
                            ELSE 'BLOCKED' END END]],
    next_observe_at = "clock_timestamp()",
  }, every)
  s:query([[
    INSERT INTO movement_callback_outbox (request_id, event_type, payload, callback_url,
           status, attempts, max_attempts, delivered_at)
    SELECT id, 'request.completed', '{}', callback_url,
           CASE WHEN k % 10 = 0 THEN 'pending' ELSE 'delivered' END,
           CASE WHEN k % 10 = 0 THEN 0 ELSE 1 END, 5,
           CASE WHEN k % 10 = 0 THEN NULL ELSE clock_timestamp() END
      FROM (SELECT r.id, r.callback_url, row_number() OVER (ORDER BY r.created_at) AS k
              FROM movement_requests r
             WHERE r.idempotency_key LIKE 'plans-%' AND r.network_class = $1) x]], class)
  s:query([[
    INSERT INTO notification_outbox (network_class, kind, dedupe_key, payload, max_attempts,
           status, delivered_at)
    SELECT $1, 'spec_plans', 'plans-' || g, '{}', 5,
           CASE WHEN g % 20 = 0 THEN 'pending' ELSE 'delivered' END,
           CASE WHEN g % 20 = 0 THEN NULL ELSE clock_timestamp() END
      FROM generate_series(1, $2::int) g]], class, N)
  s:query([[
    INSERT INTO audit_outbox (actor, action, entity_type, entity_id, detail)
    SELECT 'system:spec', 'spec.plans', 'spec', g::text, '{}'
      FROM generate_series(1, $1::int) g]], N)
  s:query([[ANALYZE movement_requests, movement_request_nodes, movement_callback_outbox,
            notification_outbox, audit_outbox]])
end

describe("generic plans of the hot statements", function()
  local s
  setup(function()
    sup = require("spec.lua.support.engine")
    s = qtg.db.acquire()
    sup.load_doc(s, sup.doc(T, {
      { "a", "action", "withdrawal", { sim = { observes = 1 } } },
      { "b", "action", "withdrawal", { sim = { observes = 1 } } },
      { "c", "action", "withdrawal", { sim = { observes = 1 } } },
    }, { { "a", "b" }, { "b", "c" } }))
  end)
  teardown(function()
    if s:in_transaction() then s:rollback() end
    s:release()
  end)

  it("read no queue table with a sequential scan, 10,000 rows in each", function()
    local class = qtg.settings.network_class
    -- load and explain in one transaction on one session: generic_plan
    -- opens its own transaction, so the rows are loaded in a savepoint-free
    -- outer one and the plans taken with the same session's statements
    s:begin()
    local ok, err = pcall(function()
      load(s, class, 20)
      local node = s:query([[SELECT n.id, n.request_id FROM movement_request_nodes n
                               JOIN movement_requests r ON r.id = n.request_id
                              WHERE r.idempotency_key LIKE 'plans-%' AND n.node_state = 'READY'
                              LIMIT 1]])[1]
      local cb = s:query([[SELECT array_agg(id) AS ids FROM (
                             SELECT id FROM movement_callback_outbox
                              WHERE status = 'pending' ORDER BY id LIMIT 5) x]])[1]
      local nt = s:query([[SELECT array_agg(id) AS ids FROM (
                             SELECT id FROM notification_outbox
                              WHERE status = 'pending' ORDER BY id LIMIT 5) x]])[1]
      local function list(text)
        local out = {}
        for id in tostring(text):gmatch("%d+") do out[#out + 1] = tonumber(id) end
        return out
      end
      local ctx = { class = class, node_id = node.id, request_id = node.request_id, outbox_ids = list(cb.ids),
                    notification_ids = list(nt.ids), process_id = "spec" }
      local plans = hot.explain_all(s, ctx, true)
      assert.is_true(#plans >= #hot.LIST)
      local bad = {}
      for _, p in ipairs(plans) do
        if os.getenv("QTG_SPEC_PLANS_PRINT") then io.stderr:write("== ", p.name, "\n", p.plan, "\n") end
        assert.truthy(p.plan:find("Execution Time", 1, true), p.name .. " was not executed")
        -- the dispatcher's FIFO walk stops at the first candidate: no sort
        -- over the candidates in FIFO order (one under its lock reads at
        -- least 32 of them); one request's READY nodes are sorted by key
        if p.name:match("^dispatcher") and p.plan:find("Sort Key: r.created_at", 1, true) then
          bad[#bad + 1] = ("%s: sorts its candidates\n%s"):format(p.name, p.plan)
        end
        if #p.seq_scans > 0 then
          bad[#bad + 1] = ("%s: Seq Scan on %s\n%s"):format(p.name, table.concat(p.seq_scans, ", "),
            p.plan)
        end
      end
      assert.equal(0, #bad, table.concat(bad, "\n\n"))
    end)
    s:rollback()
    if not ok then error(err, 0) end
  end)

  -- The /metrics gauges read the live rows through partial indexes, never
  -- the history: here one request in 500 is live (as in a
  -- system that has run for a while), the rest COMPLETED with their
  -- callbacks delivered.  A gauge's history_sql (the ended states, read
  -- once a minute) is the one place a gauge may read every row.
  it("the /metrics gauges read no history", function()
    local class = qtg.settings.network_class
    s:begin()
    local ok, err = pcall(function()
      load(s, class, 500)
      local bad, n = {}, 0
      for _, g in ipairs(require("qtg.api.metrics").GAUGES) do
        n = n + 1
        local plan = hot.generic_plan(s, g.sql, { class }, true)
        local scans = hot.seq_scans(plan)
        if #scans > 0 then
          bad[#bad + 1] = ("gauge %s: Seq Scan on %s\n%s"):format(g.name, table.concat(scans, ", "), plan)
        end
      end
      assert.is_true(n >= 9, "gauges: " .. n)
      assert.equal(0, #bad, table.concat(bad, "\n\n"))
    end)
    s:rollback()
    if not ok then error(err, 0) end
  end)

  -- The statistics taken before a burst (no node READY or in flight, and
  -- ENDED cancelled requests each with an UNKNOWN node, as an operator
  -- leaves one reconciled with the provider), then BURST requests
  -- EXECUTING, each with node a SUBMITTED and due, node b READY and node c
  -- UNKNOWN, not yet analyzed: the claims of one node by its id read a few
  -- buffers, and the walks find their first nodes at once, with no
  -- sequential scan.  With `id = ...` alone the generic plan took the READY
  -- (or observable) partial index, estimated empty, and filtered every
  -- entry of it by id, reading each node from the heap; with the recovery
  -- arm's request test visible to the planner, it read every request and
  -- sorted the nodes of the executing ones.
  local BURST = 3000
  local ENDED = 500
  it("claim one node by its id with a few buffers after a burst the statistics have not seen", function()
    local class = qtg.settings.network_class
    s:begin()
    local ok, err = pcall(function()
      insert_requests(s, class, ENDED, "ended", {
        request = "'CANCELLED'",
        node = "CASE pn.node_key WHEN 'b' THEN 'UNKNOWN' ELSE 'COMPLETED' END",
        next_observe_at = "NULL",
      })
      load(s, class, 0)
      insert_requests(s, class, BURST, "burst", {
        request = "'EXECUTING'",
        node = "CASE pn.node_key WHEN 'a' THEN 'SUBMITTED' WHEN 'b' THEN 'READY' ELSE 'UNKNOWN' END",
        next_observe_at = "now() - interval '1 second'",
      })
      local function node(key)
        return s:query([[SELECT n.id, n.request_id FROM movement_request_nodes n
                           JOIN movement_requests r ON r.id = n.request_id
                          WHERE r.idempotency_key = 'burst-' || $1 AND n.node_key = $2]],
          math.floor(BURST / 2), key)[1]
      end
      local ready, submitted = node("b"), node("a")
      -- the one-statement claim's FIFO walk is the candidates' plan (its
      -- cost is the walk's); its claim is the part under `claimed`.  The
      -- walks find their first candidates at once (every burst request has
      -- a READY node and a due one); their bound leaves room for the index
      -- entries of rows an earlier test rolled back.
      local claims = {
        ["dispatcher claim"] = { ready = true, most = 60 },
        ["dispatcher one-statement claim"] = { ready = true, part = "Subquery Scan on claimed", most = 60 },
        ["observer claim"] = { most = 60 },
        ["dispatcher candidates"] = { ready = true, most = BURST },
        ["observer snapshot"] = { most = BURST },
        ["recovery arm (everything else)"] = { most = BURST },
      }
      local seen = 0
      for _, e in ipairs(hot.LIST) do
        if claims[e.name] then
          local n = claims[e.name].ready and ready or submitted
          local plan = hot.generic_plan(s, require(e.module)[e.field],
            hot.args_of(e, { class = class, node_id = n.id, request_id = n.request_id }), true)
          if os.getenv("QTG_SPEC_PLANS_PRINT") then io.stderr:write("== ", e.name, "\n", plan, "\n") end
          assert.truthy(plan:match("^[^\n]*"):find("rows=[1-9]%d* loops=1"), e.name .. " found nothing:\n" .. plan)
          assert.same({}, hot.seq_scans(plan), e.name .. " reads a table whole:\n" .. plan)
          local part = claims[e.name].part
          local buffers = tonumber(part and plan:match(part .. ".-Buffers: shared hit=(%d+)")
            or plan:match("Buffers: shared hit=(%d+)"))
          assert.is_true(buffers ~= nil and buffers <= claims[e.name].most,
            ("%s read %s buffers for one node:\n%s"):format(e.name, tostring(buffers), plan))
          seen = seen + 1
        end
      end
      assert.equal(6, seen)
    end)
    s:rollback()
    if not ok then error(err, 0) end
  end)

  it("finds a sequential scan where a plan has one", function()
    local plan = hot.generic_plan(s, "SELECT count(*) FROM movement_callback_outbox WHERE payload = $1",
      { "x" }, false)
    assert.same({ "movement_callback_outbox" }, hot.seq_scans(plan))
    assert.same({}, hot.seq_scans("Index Scan using movement_callback_outbox_pkey on movement_callback_outbox c"))
  end)
end)
