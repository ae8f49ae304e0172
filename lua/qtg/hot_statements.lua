-- qtg.hot_statements: the statements every node or callback runs (the
-- claims and the batch writes of the queue workers), with sample arguments,
-- and their GENERIC plans: what the host runs, since every connection uses
-- plan_cache_mode = force_generic_plan (src/qtg_pg.c).  An EXPLAIN of the
-- statement with its parameters bound plans a custom plan for those values
-- and can hide a generic plan that scans a whole table; here each statement
-- is PREPAREd and its EXECUTE explained under force_generic_plan.
--
-- Used by tools/bench (the plans half-way through a burn-down) and by
-- spec/lua/engine/plans_spec.lua (no sequential scan on a queue table holding
-- 10,000 rows).  docs/performance.md lists the plans.
local M = {}

-- The tables the claims walk: a sequential scan of one of them costs in
-- proportion to the history, not to the work.
M.QUEUE_TABLES = {
  "movement_requests", "movement_request_nodes", "movement_callback_outbox",
  "notification_outbox", "audit_outbox",
}

local NO_ID = "00000000-0000-0000-0000-000000000000"

-- Each entry: name, the worker module and its field holding the SQL, and
-- args(ctx) -> the statement's arguments.  ctx: { class = network class,
-- node_id = a node id or nil, request_id = its request's id or nil,
-- outbox_ids = { callback ids } or nil, notification_ids = { ids } or nil,
-- process_id = text }.
M.LIST = {
  { name = "dispatcher candidates", module = "qtg.workers.node_dispatcher", field = "CANDIDATES_SQL",
    args = function(c) return { "{}", c.class, "[]" } end },
  { name = "dispatcher claim", module = "qtg.workers.node_dispatcher", field = "CLAIM_SQL",
    args = function(c) return { c.node_id or NO_ID, c.class, "[]" } end },
  { name = "dispatcher one-statement claim", module = "qtg.workers.node_dispatcher", field = "CLAIM_ONE_SQL",
    args = function(c) return { "{}", c.class, "[]" } end },
  { name = "claimed request's nodes", module = "qtg.nodes", field = "CLAIMED_NODES_SQL",
    args = function() return {} end },
  { name = "request nodes", module = "qtg.nodes", field = "NODES_SQL",
    args = function() return { NO_ID } end },
  { name = "observer snapshot", module = "qtg.workers.node_observer", field = "SNAPSHOT_SQL",
    args = function(c) return { c.class, 10, 200, "{}" } end },
  { name = "observer claim", module = "qtg.workers.node_observer", field = "CLAIM_SQL",
    args = function(c) return { c.node_id or NO_ID, c.class, c.request_id or NO_ID } end },
  { name = "recovery arm", module = "qtg.workers.node_recovery", field = "ARM_SQL",
    args = function(c) return { c.class, 60, '["ccip_%"]', 2, 1, "{}" } end },
  { name = "recovery arm (everything else)", module = "qtg.workers.node_recovery", field = "ARM_SQL",
    args = function(c) return { c.class, 60, '["ccip_%","stargate_%","cex_%"]', 4, 0, "{}" } end },
  { name = "callback probe", module = "qtg.workers.callback_dispatcher", field = "PROBE_SQL",
    args = function(c) return { c.class } end },
  { name = "callback claim", module = "qtg.workers.callback_dispatcher", field = "CLAIM_SQL",
    args = function(c) return { c.class, 5, "{}" } end },
  { name = "callback claim (receivers skipped)", module = "qtg.workers.callback_dispatcher",
    field = "CLAIM_SQL",
    args = function(c) return { c.class, 5, '{"http://127.0.0.1:9/slow"}' } end },
  { name = "callback outcome write", module = "qtg.workers.callback_dispatcher", field = "WRITE_SQL",
    args = function(c) return M.outcome_args(c.outbox_ids, c.process_id) end },
  { name = "notification claim", module = "qtg.workers.notification_dispatcher", field = "CLAIM_SQL",
    args = function(c) return { c.class, 5 } end },
  { name = "notification outcome write", module = "qtg.workers.notification_dispatcher",
    field = "WRITE_SQL",
    args = function(c) return M.outcome_args(c.notification_ids, nil) end },
}

-- Arguments of an outcome write for these row ids, each delivered now:
-- built by the worker module itself when it says how (write_args), so the
-- plan is of the shape the worker sends.
-- No ids: id 0, which no row has (the plan is the same, nothing is written).
function M.outcome_args(ids, process_id)
  if ids == nil or #ids == 0 then ids = { 0 } end
  return { ids = ids, process_id = process_id or "bench" }
end

local function literal(v)
  if type(v) == "number" then v = string.format("%.17g", v) end
  return "'" .. tostring(v):gsub("'", "''") .. "'"
end
M.literal = literal

-- The statement's arguments for ctx: a list, or (for the outcome writes)
-- what the worker's write_args makes of the ids.
function M.args_of(e, ctx)
  local a = e.args(ctx)
  if a.ids then
    local mod = require(e.module)
    local writes = {}
    for i, id in ipairs(a.ids) do
      -- an attempt number no row has reached: the attempt row is new
      writes[i] = { id = id, status = "delivered", attempts = 1000000 + i, attempted = true,
                    outcome = "delivered", last_status = 200, duration_ms = 1 }
    end
    return mod.write_args(writes, a.process_id)
  end
  return a
end

-- generic_plan(s, sql, args, analyze) -> the plan's text: sql PREPAREd
-- under force_generic_plan and its EXECUTE explained (ANALYZE, BUFFERS when
-- analyze), inside a transaction rolled back (a claim locks nothing after, a
-- write leaves nothing), or a savepoint rolled back when s is in one.
function M.generic_plan(s, sql, args, analyze)
  local lits = {}
  for i, v in ipairs(args) do lits[i] = literal(v) end
  local name = "qtg_hot_statement"
  local nested = s:in_transaction()
  if nested then s:savepoint(name) else s:begin() end
  local ok, rows = pcall(function()
    s:exec("SET LOCAL plan_cache_mode = force_generic_plan")
    s:exec("PREPARE " .. name .. " AS " .. sql)
    local list = #lits > 0 and ("(" .. table.concat(lits, ", ") .. ")") or ""
    return s:query("EXPLAIN (" .. (analyze and "ANALYZE, BUFFERS, " or "") .. "COSTS) EXECUTE "
      .. name .. list)
  end)
  if nested then pcall(s.rollback_to, s, name) else pcall(s.rollback, s) end
  pcall(s.exec, s, "DEALLOCATE " .. name) -- a prepared statement outlives a rollback
  if not ok then
    error("hot_statements.generic_plan: " .. tostring(type(rows) == "table" and rows.message or rows)
      .. " (" .. sql:gsub("%s+", " "):sub(1, 80) .. ")", 0)
  end
  local lines = {}
  for i, r in ipairs(rows) do lines[i] = r["QUERY PLAN"] end
  return table.concat(lines, "\n")
end

-- The queue tables a plan reads with a sequential scan: { "table", ... }.
function M.seq_scans(plan)
  local found = {}
  for _, t in ipairs(M.QUEUE_TABLES) do
    if plan:find("Seq Scan on " .. t .. "[%s\n]") or plan:find("Seq Scan on " .. t .. "$") then
      found[#found + 1] = t
    end
  end
  return found
end

-- explain_all(s, ctx, analyze) -> { {name, plan, ms, buffers, seq_scans}, ... }
-- for every statement of M.LIST.
function M.explain_all(s, ctx, analyze)
  local out = {}
  for _, e in ipairs(M.LIST) do
    local sql = require(e.module)[e.field]
    local plan = M.generic_plan(s, sql, M.args_of(e, ctx), analyze)
    out[#out + 1] = { name = e.name, plan = plan,
      ms = tonumber(plan:match("Execution Time: ([%d%.]+) ms")),
      buffers = tonumber(plan:match("Buffers: shared hit=(%d+)")),
      seq_scans = M.seq_scans(plan) }
  end
  return out
end

return M
