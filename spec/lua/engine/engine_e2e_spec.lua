-- End to end with two `qtgd run` processes on one database: 200 requests
-- over the shipped templates, driven by the sim executor, all reach
-- COMPLETED; the sim's ledger shows exactly one submit per (node, attempt);
-- each request's callbacks are numbered 1..n in order, with the expected
-- events.  The spec plays the operator for the manual step.
local qtg = require "qtg"
local requests = require "qtg.requests"
local templates = require "qtg.templates"
local common = require "spec.lua.support.common"

local sup, s
local N = 200
local TIMEOUT = 300
local procs = {}

local ADDRESS = "0x" .. string.rep("5b", 20)
local TEMPLATES = {
  { key = "cex_withdrawal_to_wallet",
    intent = { asset = "USDC", amount = "1250.00", venue = "binance", destination = ADDRESS,
               destination_chain = "ethereum" },
    events = { "request_created", "request_approved", "request_executing", "frontier_advanced",
               "frontier_advanced", "frontier_advanced", "request_completed" } },
  { key = "cctp_bridge",
    intent = { asset = "USDC", amount = "50000", source_chain = "ethereum",
               destination_chain = "base", destination = ADDRESS },
    events = { "request_created", "request_approved", "request_executing", "frontier_advanced",
               "frontier_advanced", "frontier_advanced", "request_completed" } },
  { key = "otc_settlement_manual",
    intent = { asset = "USDT", amount = "2000000", venue = "okx", destination = ADDRESS,
               destination_chain = "ethereum", counterparty = "desk-7" },
    events = { "request_created", "request_approved", "request_executing", "frontier_advanced",
               "frontier_advanced", "request_attention", "manual_step_completed", "request_completed" } },
  { key = "dual_venue_funding",
    intent = { asset = "USDC", amount = "300000", primary_venue = "binance",
               secondary_venue = "kraken", destination = ADDRESS },
    events = { "request_created", "request_approved", "request_executing", "frontier_advanced",
               "frontier_advanced", "frontier_advanced", "frontier_advanced", "request_completed" } },
}

local function start_qtgd(i, dir)
  procs[#procs + 1] = common.spawn(string.format("%s/qtgd-%d", dir, i), {
    MG_CONSOLE_ENABLED = "false",
    MG_NODE_DISPATCH_INTERVAL_SECONDS = "0.05",
    MG_NODE_OBSERVE_INTERVAL_SECONDS = "0.1",
    MG_NODE_RECOVERY_INTERVAL_SECONDS = "1",
    MG_CALLBACK_DISPATCH_INTERVAL_SECONDS = "30",
    MG_NETWORK_CLASS = qtg.settings.network_class,
    MG_RUN_DIR = dir .. "/run-" .. i,
  }, common.quote(sup.qtgd_bin()) .. " run")
end

-- SIGTERM to all, then each gets 30 s to exit before SIGKILL.
local function stop_all()
  for _, p in ipairs(procs) do common.signal(p, "TERM") end
  for _, p in ipairs(procs) do
    if not common.exit_code(p, 30) then common.signal(p, "KILL") end
  end
end

local function count_lines(file, needle)
  local n = 0
  for line in io.lines(file) do
    if line:find(needle, 1, true) then n = n + 1 end
  end
  return n
end

describe("two qtgd processes, 200 requests", function()
  local dir
  setup(function()
    sup = require("spec.lua.support.engine")
    s = qtg.db.acquire()
    dir = common.tmpdir("qtg-e2e")
  end)
  teardown(function()
    stop_all()
    s:release()
    os.execute("rm -rf " .. common.quote(dir))
  end)

  it("completes every request, one submit per (node, attempt), callbacks in order", function()
    sup.park_others(s)
    assert(templates.load_dir(s, sup.repo_root() .. "/templates"))
    -- the shipped templates' allow-lists: the CEX withdrawal's destination,
    -- and desk-7's wallet for the OTC settlement (docs/approvals.md)
    local book = require "spec.lua.support.book"
    book.ensure(s, book.for_intent(TEMPLATES[1].intent))
    book.ensure(s, book.for_intent(TEMPLATES[3].intent))
    local ids, kind_of = {}, {}
    for i = 1, N do
      local t = TEMPLATES[(i - 1) % #TEMPLATES + 1]
      local req = sup.create(s, t.key, { intent = t.intent })
      sup.approve(s, req.id)
      ids[i] = req.id
      kind_of[req.id] = t
    end
    start_qtgd(1, dir)
    start_qtgd(2, dir)

    local done = 0
    common.poll(function()
      -- the operator: confirm every desk settlement that waits
      for _, r in ipairs(s:query([[
          SELECT n.id FROM movement_request_nodes n JOIN movement_requests r ON r.id = n.request_id
           WHERE r.network_class = $1 AND r.request_state = 'WAITING_MANUAL_ACTION'
             AND n.node_state = 'READY' AND n.action_type LIKE 'manual\_%']],
          qtg.settings.network_class)) do
        requests.complete_manual_step(s, r.id, sup.ACTOR, { desk_reference = "DESK-" .. r.id:sub(1, 8) })
      end
      done = s:query([[SELECT count(*)::int AS n FROM movement_requests
                        WHERE network_class = $1 AND request_state = 'COMPLETED']],
        qtg.settings.network_class)[1].n
      if done == N then return true end
      for _, p in ipairs(procs) do assert.is_true(common.alive(p), "qtgd " .. p.pid .. " died: see " .. p.log) end
    end, TIMEOUT, 0.5)
    stop_all()
    local states = s:query([[SELECT request_state, count(*)::int AS n FROM movement_requests
                              WHERE network_class = $1 GROUP BY 1 ORDER BY 1]], qtg.settings.network_class)
    assert.equal(N, done, "request states: " .. require("cjson").encode(states))

    -- every node COMPLETED at its first attempt
    local nodes = s:query([[
      SELECT n.node_state, n.attempt_no, count(*)::int AS n FROM movement_request_nodes n
        JOIN movement_requests r ON r.id = n.request_id
       WHERE r.network_class = $1 GROUP BY 1, 2]], qtg.settings.network_class)
    assert.equal(1, #nodes)
    assert.equal("COMPLETED", nodes[1].node_state)
    assert.equal(1, nodes[1].attempt_no)

    -- the ledger: exactly one submit for each (node, attempt) the engine dispatched
    local L = s:query([[
      WITH dispatched AS (
        SELECT n.id, n.attempt_no, n.idempotency_key FROM movement_request_nodes n
          JOIN movement_requests r ON r.id = n.request_id
         WHERE r.network_class = $1 AND n.action_type NOT LIKE 'manual\_%')
      SELECT (SELECT count(*) FROM dispatched)::int AS dispatched,
             (SELECT count(*) FROM sim_ledger l JOIN dispatched d ON d.id = l.request_node_id)::int AS rows,
             (SELECT count(*) FROM dispatched d
                WHERE NOT EXISTS (SELECT 1 FROM sim_ledger l WHERE l.request_node_id = d.id
                                     AND l.attempt_no = d.attempt_no
                                     AND l.idempotency_key = d.idempotency_key))::int AS missing,
             (SELECT count(*) FROM sim_ledger l JOIN dispatched d ON d.id = l.request_node_id
                WHERE l.submit_count <> 1)::int AS resubmitted,
             (SELECT count(*) FROM (SELECT 1 FROM sim_ledger l JOIN dispatched d ON d.id = l.request_node_id
                GROUP BY l.request_node_id, l.attempt_no HAVING count(*) > 1) x)::int AS doubled]],
      qtg.settings.network_class)[1]
    assert.equal(N / 4 * (4 + 4 + 2 + 5), L.dispatched)
    assert.equal(L.dispatched, L.rows)
    assert.equal(0, L.missing)
    assert.equal(0, L.resubmitted)
    assert.equal(0, L.doubled)

    -- callbacks: per request, sequence 1..n in commit order, the expected events
    for _, id in ipairs(ids) do
      local cbs = sup.callbacks(s, id)
      local events = {}
      local last_at = ""
      for i, c in ipairs(cbs) do
        assert.equal(i, c.body.sequence, id)
        assert.equal(id, c.body.request_id)
        assert.is_true(c.body.occurred_at >= last_at, id)
        last_at = c.body.occurred_at
        events[i] = c.body.event_type
      end
      assert.same(kind_of[id].events, events, id .. " " .. kind_of[id].key)
      assert.equal("COMPLETED", cbs[#cbs].body.request_state)
    end

    -- both processes did the work, and no core worker logged an error
    for _, p in ipairs(procs) do
      assert.is_true(count_lines(p.log, '"node dispatched"') > 0, "no dispatch in " .. p.log)
      for line in io.lines(p.log) do
        if line:find('"level":"error"', 1, true) and line:find('"worker":"node_', 1, true) then
          error("core worker error in " .. p.log .. ": " .. line)
        end
      end
    end
  end)
end)
