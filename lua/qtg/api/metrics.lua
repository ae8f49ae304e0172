-- qtg.api.metrics: /metrics in the Prometheus text format (0.0.4).
--
-- Gauges come from the durable tables through one collector whose result is
-- cached for M.CACHE_SECONDS, so scrapes (and several scrapers) do not load
-- the database; they describe the whole network class, not this process, so
-- several replicas report the same numbers (alert on max, not sum).
-- Counters and histograms are this process's own (qtg.metrics: HTTP
-- requests by route and status, signer decisions, approve -> SUBMITTED;
-- the runtime's worker passes, errors and pass durations).  Label values are small enums
-- (state names, route names, worker names), never ids.
local qtg = require "qtg"

local M = {}

M.CACHE_SECONDS = 2

-- qtg_nodes_repeatedly_unknown counts the nodes at this many observations
-- in a row that ended UNKNOWN (sql/0212) or more.
M.REPEATEDLY_UNKNOWN = 3

local counters = require "qtg.metrics"

function M.observe_http(route, method, status, seconds)
  counters.count("qtg_http_requests_total", { route = route, method = method, status = tostring(status) })
  if tonumber(status) and tonumber(status) >= 500 then counters.count("qtg_http_server_errors_total", {}) end
  counters.observe("qtg_http_request_duration_seconds", { route = route }, seconds)
end

-- ---------------------------------------------------------------- writing
local function esc(v)
  return (tostring(v):gsub("\\", "\\\\"):gsub("\n", "\\n"):gsub('"', '\\"'))
end

local function labels(t, order)
  if not order or #order == 0 then return "" end
  local parts = {}
  for i, k in ipairs(order) do parts[i] = k .. '="' .. esc(t[k]) .. '"' end
  return "{" .. table.concat(parts, ",") .. "}"
end

local function num(v)
  if v == nil or v == qtg.db.NULL then return "0" end
  return counters.num(tonumber(v) or 0)
end

local function family(out, name, kind, help, samples, order)
  out[#out + 1] = "# HELP " .. name .. " " .. help
  out[#out + 1] = "# TYPE " .. name .. " " .. kind
  for _, s in ipairs(samples) do out[#out + 1] = name .. labels(s, order) .. " " .. num(s.value) end
end

-- ------------------------------------------------------------ the collector
-- The ended states: no transition leaves them (the terminal rows of
-- node_states and request_states), so their counts only grow, with the
-- history.  A gauge's `sql` counts the live states through the partial
-- indexes at each collection; its `history_sql` counts the ended ones, a
-- read of the whole history, at most once in M.HISTORY_SECONDS per process
-- (metrics_spec checks these lists against the tables).
M.HISTORY_SECONDS = 60
M.ENDED_NODE_STATES = { "CANCELLED", "COMPLETED", "SKIPPED" }
M.ENDED_REQUEST_STATES = { "CANCELLED", "COMPLETED", "EXPIRED", "REJECTED" }

local function quoted(list)
  local out = {}
  for i, v in ipairs(list) do out[i] = "'" .. v .. "'" end
  return table.concat(out, ", ")
end

-- a row's request is of class $1: one probe of the request's key, so a
-- walk of a partial index is not joined to the requests it does not need
local function of_class(request_id)
  return "(SELECT r.network_class FROM movement_requests r WHERE r.id = " .. request_id .. ") = $1"
end

-- The requests of class $1 in a live state, one arm per partial index:
-- movement_requests_pending_expiry, _dispatchable and _held (sql/0213).
-- A BLOCKED node belongs to one of them (a request that ends cancels its
-- nodes that have not started).
local LIVE_REQUESTS = [[
  SELECT id, request_state FROM movement_requests
   WHERE request_state = 'PENDING_APPROVAL' AND network_class = $1
  UNION ALL
  SELECT id, request_state FROM movement_requests
   WHERE request_state IN ('APPROVED', 'EXECUTING') AND network_class = $1
  UNION ALL
  SELECT id, request_state FROM movement_requests
   WHERE request_state IN ('WAITING_MANUAL_ACTION', 'MANUAL_INTERVENTION', 'FAILED') AND network_class = $1]]

-- The nodes in a live state other than BLOCKED, one arm per partial index of
-- the claims (ready, observable, recoverable, troubled), with these columns.
local function started_nodes(columns)
  local arms = {}
  for i, states in ipairs({ "= 'READY'", "IN ('SUBMITTED', 'OBSERVING')", "IN ('UNKNOWN', 'SUBMITTING')",
                            "= 'FAILED'" }) do
    arms[i] = "SELECT " .. columns .. " FROM movement_request_nodes WHERE node_state " .. states
  end
  return table.concat(arms, "\n UNION ALL\n")
end

-- Each gauge's `sql` reads its tables through partial indexes, never whole
-- (plans_spec checks its generic plan with 10,000 rows of history), so a
-- collection costs what is live, not what has been.
local GAUGES = {
  { name = "qtg_nodes", help = "nodes by state and action_type (the ended states "
      .. "COMPLETED, SKIPPED and CANCELLED counted at most " .. M.HISTORY_SECONDS .. " s ago)",
    labels = { "state", "action_type" }, sql = [[
      SELECT n.node_state AS state, n.action_type, count(*) AS value
        FROM (]] .. started_nodes("request_id, node_state, action_type") .. [[
              UNION ALL
              SELECT request_id, node_state, action_type FROM movement_request_nodes
               WHERE request_id = ANY (ARRAY (SELECT id FROM (]] .. LIVE_REQUESTS .. [[) r))
                 AND node_state = 'BLOCKED') n
       WHERE ]] .. of_class("n.request_id") .. [[
       GROUP BY 1, 2 ORDER BY 1, 2]],
    history_sql = [[
      SELECT n.node_state AS state, n.action_type, count(*) AS value
        FROM movement_request_nodes n JOIN movement_requests r ON r.id = n.request_id
       WHERE r.network_class = $1 AND n.node_state IN (]] .. quoted(M.ENDED_NODE_STATES) .. [[)
       GROUP BY 1, 2 ORDER BY 1, 2]] },
  -- BLOCKED nodes (waiting on a predecessor, whose own age tells) are left
  -- out of the ages.
  { name = "qtg_node_oldest_age_seconds",
    help = "how long the oldest node in each live state (READY, SUBMITTING, SUBMITTED, OBSERVING, UNKNOWN, FAILED) has been in it",
    labels = { "state" }, sql = [[
      SELECT n.node_state AS state, extract(epoch FROM now() - min(coalesce(n.state_since, n.updated_at)))::float8 AS value
        FROM (]] .. started_nodes("request_id, node_state, state_since, updated_at") .. [[) n
       WHERE ]] .. of_class("n.request_id") .. [[
       GROUP BY 1 ORDER BY 1]] },
  { name = "qtg_nodes_repeatedly_unknown",
    help = "nodes in flight whose last " .. M.REPEATEDLY_UNKNOWN .. " or more observations in a row ended UNKNOWN",
    labels = {}, sql = [[
      SELECT count(*) AS value
        FROM (SELECT request_id, unknown_observations FROM movement_request_nodes
               WHERE node_state IN ('SUBMITTED', 'OBSERVING')
              UNION ALL
              SELECT request_id, unknown_observations FROM movement_request_nodes
               WHERE node_state IN ('UNKNOWN', 'SUBMITTING')) n
       WHERE n.unknown_observations >= ]] .. M.REPEATEDLY_UNKNOWN .. [[
         AND ]] .. of_class("n.request_id") },
  { name = "qtg_requests", help = "requests by state (the ended states COMPLETED, "
      .. "REJECTED, CANCELLED and EXPIRED counted at most " .. M.HISTORY_SECONDS .. " s ago)",
    labels = { "state" }, sql = [[
      SELECT r.request_state AS state, count(*) AS value
        FROM (]] .. LIVE_REQUESTS .. [[) r
       GROUP BY 1 ORDER BY 1]],
    history_sql = [[
      SELECT request_state AS state, count(*) AS value FROM movement_requests
       WHERE network_class = $1 AND request_state IN (]] .. quoted(M.ENDED_REQUEST_STATES) .. [[)
       GROUP BY 1 ORDER BY 1]] },
  { name = "qtg_approvals_pending", help = "requests waiting for approval", labels = {}, sql = [[
      SELECT count(*) AS value FROM movement_requests
       WHERE network_class = $1 AND request_state = 'PENDING_APPROVAL']] },
  { name = "qtg_approvals_pending_oldest_age_seconds", help = "age of the oldest request waiting for approval",
    labels = {}, sql = [[
      SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS value FROM movement_requests
       WHERE network_class = $1 AND request_state = 'PENDING_APPROVAL']] },
  -- A dead letter an operator redelivered is answered (its copy is a row
  -- of its own, counted as it goes): dlq counts those nobody redelivered,
  -- so the alert on it clears once each is.  Only a dead letter is ever
  -- redelivered, so only that arm asks.
  { name = "qtg_callbacks", help = "callback rows by status: pending, and dlq not redelivered",
    labels = { "status" }, sql = [[
      SELECT o.status, count(*) AS value
        FROM (SELECT status, request_id FROM movement_callback_outbox WHERE status = 'pending'
              UNION ALL
              SELECT d.status, d.request_id FROM movement_callback_outbox d
               WHERE d.status = 'dlq'
                 AND NOT EXISTS (SELECT 1 FROM movement_callback_outbox c WHERE c.redelivery_of = d.id)) o
       WHERE ]] .. of_class("o.request_id") .. [[
       GROUP BY 1 ORDER BY 1]] },
  -- the pending index in its order, to the first row of the class
  { name = "qtg_callback_oldest_undelivered_age_seconds",
    help = "age of the oldest pending callback row", labels = {}, sql = [[
      SELECT coalesce(extract(epoch FROM now() - (
        SELECT o.created_at FROM movement_callback_outbox o
         WHERE o.status = 'pending'
           AND ]] .. of_class("o.request_id") .. [[
         ORDER BY o.created_at, o.id LIMIT 1)), 0)::float8 AS value]] },
  -- The outbox is a queue the promoter empties (a row leaves it in the
  -- transaction that writes its audit event): its first row by id is the
  -- oldest waiting.  Not per class: the audit chain is the database's.
  { name = "qtg_audit_outbox_lag_seconds", help = "age of the oldest audit record not yet promoted",
    labels = {}, sql = [[
      SELECT coalesce(extract(epoch FROM now() - (
        SELECT created_at FROM audit_outbox ORDER BY id LIMIT 1)), 0)::float8 AS value
       WHERE $1::text IS NOT NULL]] },
}

M.GAUGES = GAUGES
for _, g in ipairs(GAUGES) do counters.zero("qtg_metrics_gauge_errors_total", { gauge = g.name }) end

local cache -- {at=, lines=}
local history = {} -- gauge name -> {at=, rows=}: its ended states' counts

local function failed(g, err, what)
  counters.count("qtg_metrics_gauge_errors_total", { gauge = g.name })
  qtg.log.warn(what, { gauge = g.name, error = require("qtg.errors").text(err) })
end

-- ended_rows(s, g, now) -> the counts of g's ended states, read again when
-- older than M.HISTORY_SECONDS; when that read fails, the last ones read
-- (nil before any) and false.
local function ended_rows(s, g, now)
  local h = history[g.name]
  if h and now - h.at < M.HISTORY_SECONDS then return h.rows, true end
  local ok, rows = pcall(s.query, s, g.history_sql, qtg.settings.network_class)
  if not ok then return h and h.rows, false, rows end
  history[g.name] = { at = now, rows = rows }
  return rows, true
end

-- collect(s) -> the gauges' lines, and whether every statement answered.
-- A gauge whose statement fails (a statement timeout on a large history)
-- is left out, logged and counted (qtg_metrics_gauge_errors_total), and
-- the collection is not cached, so the next scrape asks again.
local function collect(s)
  local out, whole, now = {}, true, qtg.monotonic()
  for _, g in ipairs(GAUGES) do
    local ok, rows = pcall(s.query, s, g.sql, qtg.settings.network_class)
    if ok and g.history_sql then
      local ended, fresh, err = ended_rows(s, g, now)
      if not fresh then
        whole = false
        failed(g, err, "a /metrics gauge's count of its ended states failed: the gauge shows the last one read, "
          .. "if any")
      end
      for _, r in ipairs(ended or {}) do rows[#rows + 1] = r end
    end
    if ok then
      family(out, g.name, "gauge", g.help, rows, g.labels)
    else
      whole = false
      failed(g, rows, "a /metrics gauge's statement failed: the gauge is left out of this answer")
    end
  end
  return out, whole
end

function M.render(s)
  local now = qtg.monotonic()
  local lines = cache and now - cache.at < M.CACHE_SECONDS and cache.lines
  if not lines then
    local whole
    lines, whole = collect(s)
    cache = whole and { at = now, lines = lines } or nil
  end
  local out = {}
  for i, l in ipairs(lines) do out[i] = l end
  -- build info
  family(out, "qtg_build_info", "gauge", "the running qtgd", { { version = qtg.version or "unknown",
    network_class = qtg.settings.network_class, value = 1 } }, { "version", "network_class" })
  -- workers (this process)
  local passes, errors = {}, {}
  for _, w in ipairs(qtg.runtime.workers()) do
    passes[#passes + 1] = { worker = w.name, value = w.ticks }
    errors[#errors + 1] = { worker = w.name, value = w.errors_total }
  end
  family(out, "qtg_worker_passes_total", "counter", "worker passes run by this process", passes, { "worker" })
  family(out, "qtg_worker_errors_total", "counter", "worker passes that failed in this process", errors, { "worker" })
  -- what each worker is doing now: a worker that fails every pass backs off
  -- to a pass a minute (its error rate stays low), one that is paused, dead
  -- or inside a pass that does not end makes no error at all
  local states, consecutive, since, intervals = {}, {}, {}, {}
  local wall = qtg.now()
  for _, w in ipairs(qtg.runtime.workers()) do
    states[#states + 1] = { worker = w.name, group = w.group, state = w.paused and "paused" or w.state, value = 1 }
    consecutive[#consecutive + 1] = { worker = w.name, value = w.consecutive_errors }
    intervals[#intervals + 1] = { worker = w.name, value = w.interval }
    if w.last_tick_at then
      since[#since + 1] = { worker = w.name, value = math.max(0, wall - w.last_tick_at) }
    end
  end
  family(out, "qtg_worker_state", "gauge",
    "each worker of this process, 1 under its state (sleeping, running, paused, stopped, dead) and group",
    states, { "worker", "group", "state" })
  family(out, "qtg_worker_consecutive_errors", "gauge",
    "passes in a row that failed, per worker of this process (0 after a pass that did not)", consecutive, { "worker" })
  family(out, "qtg_worker_last_pass_age_seconds", "gauge",
    "seconds since each worker of this process last ended a pass (none before its first)", since, { "worker" })
  family(out, "qtg_worker_interval_seconds", "gauge", "each worker's interval between passes in this process",
    intervals, { "worker" })
  -- each worker's pass durations, as the runtime keeps them
  out[#out + 1] = "# HELP qtg_worker_pass_duration_seconds time one worker pass took in this process"
  out[#out + 1] = "# TYPE qtg_worker_pass_duration_seconds histogram"
  for _, w in ipairs(qtg.runtime.workers()) do
    if w.pass_seconds then
      counters.histogram_lines(out, "qtg_worker_pass_duration_seconds", { worker = w.name }, { "worker" },
        w.pass_seconds)
    end
  end
  -- this process's sessions: the API's share of its pool and the rest
  local db = qtg.db.stats()
  family(out, "qtg_db_sessions_in_use", "gauge",
    "this process's database sessions in use: the API's requests (its share: MG_API_DB_SESSIONS) and the other tasks (workers, console)",
    { { holder = "api", value = db.api_in_use }, { holder = "other", value = db.in_use - db.api_in_use } },
    { "holder" })
  family(out, "qtg_db_acquires_waiting", "gauge",
    "this process's tasks waiting for a database session: the API's requests and the other tasks",
    { { holder = "api", value = db.api_waiting }, { holder = "other", value = db.waiting - db.api_waiting } },
    { "holder" })
  -- this process's statements past MG_DB_SLOW_WARN_SECONDS (its pool's watch)
  family(out, "qtg_db_slow_statements_in_flight", "gauge",
    "statements and commits of this process still running past MG_DB_SLOW_WARN_SECONDS (warned about)",
    { { value = db.slow } }, {})
  family(out, "qtg_db_slow_statements_total", "counter",
    "statements and commits of this process that ran past MG_DB_SLOW_WARN_SECONDS (each counted once)",
    { { value = db.slow_total } }, {})
  family(out, "qtg_db_oldest_statement_seconds", "gauge",
    "how long this process's oldest statement in flight has run (0: none, or MG_DB_SLOW_WARN_SECONDS=0)",
    { { value = db.oldest_seconds } }, {})
  -- this process's API connections and request records (a record that
  -- outlived its connection would show as a count that only grows)
  local api = qtg.api_server.stats()
  family(out, "qtg_api_connections_open", "gauge", "connections open to this process's API",
    { { value = api.connections } }, {})
  family(out, "qtg_api_request_records", "gauge",
    "request records this process's API holds: requests running or being answered, and request lines whose "
      .. "headers are still coming", { { value = api.records } }, {})
  -- HTTP, signer decisions, approve -> SUBMITTED (qtg.metrics)
  counters.render(out)
  return table.concat(out, "\n") .. "\n"
end

return M
