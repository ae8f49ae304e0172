-- qtg.api.metrics in this process: the table gauges count what is live
-- through partial indexes at each collection and the ended states (which
-- only grow) at most once in M.HISTORY_SECONDS; together they are every
-- row, as a full count says.  Their plans are plans_spec's; what a running
-- daemon serves is api_spec's.
local qtg = require "qtg"
local metrics = require "qtg.api.metrics"
local common = require "spec.lua.support.common"

local sup, s
local T = "spec_metrics_chain"

-- {labels text = value} of one family in a /metrics answer
local function family(body, name)
  local out = {}
  for labels, value in body:gmatch("\n" .. name .. "({[^}]*}) ([%d%.e+-]+)") do out[labels] = tonumber(value) end
  return out
end

-- every node and request of the class by state, from a read of them all
local function full_counts()
  local nodes, requests = {}, {}
  for _, r in ipairs(s:query([[
      SELECT n.node_state, n.action_type, count(*) AS value
        FROM movement_request_nodes n JOIN movement_requests r ON r.id = n.request_id
       WHERE r.network_class = $1 GROUP BY 1, 2]], qtg.settings.network_class)) do
    nodes[('{state="%s",action_type="%s"}'):format(r.node_state, r.action_type)] = tonumber(r.value)
  end
  for _, r in ipairs(s:query([[SELECT request_state, count(*) AS value FROM movement_requests
                                WHERE network_class = $1 GROUP BY 1]], qtg.settings.network_class)) do
    requests[('{state="%s"}'):format(r.request_state)] = tonumber(r.value)
  end
  return nodes, requests
end

-- n requests of template T in request_state, with node a in a_state and
-- nodes b, c in rest_state, in s's open transaction
local function insert(n, request_state, a_state, rest_state)
  local function lit(v) return "'" .. v .. "'" end
  sup.insert_requests(s, qtg.settings.network_class, n, T, common.uid("metrics", 6), {
    request = lit(request_state),
    node = "CASE pn.node_key WHEN 'a' THEN " .. lit(a_state) .. " ELSE " .. lit(rest_state) .. " END",
  })
end

describe("qtg.api.metrics, the table gauges", function()
  local saved
  setup(function()
    sup = require("spec.lua.support.engine")
    s = qtg.db.acquire()
    sup.load_doc(s, sup.doc(T, {
      { "a", "action", "withdrawal", { sim = { observes = 1 } } },
      { "b", "action", "burn", { sim = { observes = 1 } } },
      { "c", "observe", "cex_withdrawal_status", { sim = { observes = 1 } } },
    }, { { "a", "b" }, { "b", "c" } }))
    saved = { cache = metrics.CACHE_SECONDS, history = metrics.HISTORY_SECONDS }
  end)
  teardown(function()
    metrics.CACHE_SECONDS, metrics.HISTORY_SECONDS = saved.cache, saved.history
    if s:in_transaction() then s:rollback() end
    s:release()
  end)
  before_each(function() metrics.CACHE_SECONDS, metrics.HISTORY_SECONDS = 0, 0 end)

  it("names as ended exactly the states no transition leaves", function()
    local function terminal(tbl)
      local out = {}
      for _, r in ipairs(s:query("SELECT state FROM " .. tbl .. " WHERE terminal ORDER BY state")) do
        out[#out + 1] = r.state
      end
      return out
    end
    assert.same(terminal("node_states"), metrics.ENDED_NODE_STATES)
    assert.same(terminal("request_states"), metrics.ENDED_REQUEST_STATES)
    -- and no transition leaves them
    local leaving = s:query([[
      SELECT from_state FROM node_state_transitions t JOIN node_states n ON n.state = t.from_state WHERE n.terminal
      UNION ALL
      SELECT from_state FROM request_state_transitions t JOIN request_states r ON r.state = t.from_state
       WHERE r.terminal]])
    assert.equal(0, #leaving)
  end)

  it("counts every node and request of the class in every state: the live ones and the ended ones add up", function()
    s:begin()
    local ok, err = pcall(function()
      -- each live request state with its nodes as the engine leaves them,
      -- and each ended one
      insert(2, "PENDING_APPROVAL", "READY", "BLOCKED")
      insert(2, "APPROVED", "READY", "BLOCKED")
      insert(3, "EXECUTING", "SUBMITTED", "BLOCKED")
      insert(1, "EXECUTING", "OBSERVING", "BLOCKED")
      insert(1, "EXECUTING", "SUBMITTING", "BLOCKED")
      insert(2, "EXECUTING", "UNKNOWN", "BLOCKED")
      insert(1, "WAITING_MANUAL_ACTION", "COMPLETED", "BLOCKED")
      insert(2, "MANUAL_INTERVENTION", "UNKNOWN", "BLOCKED")
      insert(3, "FAILED", "FAILED", "BLOCKED")
      insert(5, "COMPLETED", "COMPLETED", "SKIPPED")
      insert(2, "CANCELLED", "UNKNOWN", "CANCELLED")
      insert(2, "REJECTED", "CANCELLED", "CANCELLED")
      insert(1, "EXPIRED", "CANCELLED", "CANCELLED")
      local body = metrics.render(s)
      local nodes, requests = full_counts()
      assert.same(nodes, family(body, "qtg_nodes"))
      assert.same(requests, family(body, "qtg_requests"))
      -- the spec's own rows are there in every state it wrote
      for _, state in ipairs({ "BLOCKED", "READY", "SUBMITTED", "OBSERVING", "SUBMITTING", "UNKNOWN", "FAILED",
                               "COMPLETED", "SKIPPED", "CANCELLED" }) do
        assert.truthy(body:find('\nqtg_nodes{state="' .. state .. '",', 1, true), state)
      end
      for _, state in ipairs({ "PENDING_APPROVAL", "APPROVED", "EXECUTING", "WAITING_MANUAL_ACTION",
                               "MANUAL_INTERVENTION", "FAILED", "COMPLETED", "CANCELLED", "REJECTED", "EXPIRED" }) do
        assert.truthy(body:find('\nqtg_requests{state="' .. state .. '"}', 1, true), state)
      end
    end)
    s:rollback()
    if not ok then error(err, 0) end
  end)

  it("reads the ended states again only after M.HISTORY_SECONDS, the live ones at each collection", function()
    s:begin()
    local ok, err = pcall(function()
      local before = metrics.render(s) -- the ended states read now
      metrics.HISTORY_SECONDS = 3600
      insert(2, "COMPLETED", "COMPLETED", "COMPLETED")
      insert(1, "EXECUTING", "SUBMITTED", "BLOCKED")
      local held = metrics.render(s)
      local function count(body, name, labels) return family(body, name)[labels] or 0 end
      -- live: at once
      assert.equal(count(before, "qtg_requests", '{state="EXECUTING"}') + 1,
        count(held, "qtg_requests", '{state="EXECUTING"}'))
      assert.equal(count(before, "qtg_nodes", '{state="BLOCKED",action_type="burn"}') + 1,
        count(held, "qtg_nodes", '{state="BLOCKED",action_type="burn"}'))
      -- ended: as read before, within the minute
      assert.equal(count(before, "qtg_requests", '{state="COMPLETED"}'), count(held, "qtg_requests", '{state="COMPLETED"}'))
      assert.equal(count(before, "qtg_nodes", '{state="COMPLETED",action_type="withdrawal"}'),
        count(held, "qtg_nodes", '{state="COMPLETED",action_type="withdrawal"}'))
      metrics.HISTORY_SECONDS = 0
      local after = metrics.render(s)
      assert.equal(count(before, "qtg_requests", '{state="COMPLETED"}') + 2,
        count(after, "qtg_requests", '{state="COMPLETED"}'))
      assert.equal(count(before, "qtg_nodes", '{state="COMPLETED",action_type="withdrawal"}') + 2,
        count(after, "qtg_nodes", '{state="COMPLETED",action_type="withdrawal"}'))
      local nodes, requests = full_counts()
      assert.same(nodes, family(after, "qtg_nodes"))
      assert.same(requests, family(after, "qtg_requests"))
    end)
    s:rollback()
    if not ok then error(err, 0) end
  end)

  -- Outside a transaction, as the API runs it: a failed read of the ended
  -- states leaves the live counts and the last ended ones read, counts the
  -- failure and is tried again at the next collection.
  it("keeps the live counts and the last ended ones when the read of the ended states fails", function()
    local g
    for _, x in ipairs(metrics.GAUGES) do if x.name == "qtg_requests" then g = x end end
    local good = g.history_sql
    local first = metrics.render(s)
    local ended = family(first, "qtg_requests")['{state="COMPLETED"}']
    local errors = tonumber(first:match('\nqtg_metrics_gauge_errors_total{gauge="qtg_requests"} (%d+)'))
    g.history_sql = "SELECT 'COMPLETED' AS state, 1 / (length($1::text) - length($1::text)) AS value"
    local ok, err = pcall(function()
      local body = metrics.render(s)
      assert.equal(errors + 1, tonumber(body:match('\nqtg_metrics_gauge_errors_total{gauge="qtg_requests"} (%d+)')))
      assert.equal(ended, family(body, "qtg_requests")['{state="COMPLETED"}'])
      assert.truthy(body:find("# TYPE qtg_requests gauge", 1, true))
      -- not cached: the next collection asks again
      metrics.CACHE_SECONDS = 3600
      body = metrics.render(s)
      assert.equal(errors + 2, tonumber(body:match('\nqtg_metrics_gauge_errors_total{gauge="qtg_requests"} (%d+)')))
    end)
    g.history_sql = good
    if not ok then error(err, 0) end
    local body = metrics.render(s)
    local _, requests = full_counts()
    assert.same(requests, family(body, "qtg_requests"))
  end)
end)
