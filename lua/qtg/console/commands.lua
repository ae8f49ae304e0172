-- qtg.console.commands: the operator commands of the console (help() lists
-- them).  bind(ctx) returns the functions of one console session, closed
-- over its actor ("console:<uid>"): every mutation is audited under it, in
-- the same transaction as the change where the change is in the database
-- (the request lifecycle, callbacks and signers modules do that), and in a
-- transaction around the change for the runtime's workers.
--
-- Each command acquires its own database session and gives it back however
-- it ends (interrupt included).  Answers are plain tables with a readable
-- rendering attached (qtg.console.view), so `w = workers()` can be kept and
-- indexed.  Commands whose tables or modules are not installed say so.
local qtg = require("qtg")
local view = require("qtg.console.view")
local pretty = require("qtg.console.pretty")

local M = {}

-- name, arguments, summary: the order help() lists them in.
M.LIST = {
  { "help", "()", "this list" },
  { "workers", "()", "workers: group, state, last tick, items, consecutive errors, next run" },
  { "pause", "(name)", "pause a worker (its running pass finishes)" },
  { "resume_worker", "(name)", "resume a paused worker" },
  { "tick", "(name)", "run one pass of a worker now and wait for it" },
  { "req", "(id)", "a request with its nodes, states, attempts, provider refs, errors" },
  { "requests", "{state=, limit=}", "recent requests of this network class" },
  { "create", "{template_key=, intent=, idempotency_key=}", "create a movement request" },
  { "approve", "(id)", "approve a PENDING_APPROVAL request: your vote towards its quorum (approve(id, comment) adds a comment)" },
  { "reject", "(id, reason)", "reject a PENDING_APPROVAL request (any rejection ends it)" },
  { "approvals", "{pending=true}", "requests waiting for approval that you may still approve (your inbox)" },
  { "whoami", "()", "your principal: actor and roles" },
  { "operators", "()", "the operators: name, uid, roles" },
  { "add_operator", "(name, uid, roles)", "map a console uid to a named operator (admin)" },
  { "remove_operator", "(name)", "remove an operator (admin)" },
  { "address_book", "()", "the address book, and its changes waiting for a quorum" },
  { "propose_address", "{action=, asset=, chain=, address=, label=}", "propose adding/removing an address (admin)" },
  { "vote_address", "(change_id, decision, comment)", "approve or reject an address book change (admin)" },
  { "cancel", "(id, reason)", "cancel a request" },
  { "resume", "(id)", "resume a request (MANUAL_INTERVENTION/FAILED -> EXECUTING)" },
  { "retry", "(node_id)", "retry a FAILED or UNKNOWN node" },
  { "complete_manual", "(node_id, artifacts)", "complete a manual step with its artifacts" },
  { "dlq", "()", "dead-lettered callbacks" },
  { "redeliver", "(callback_id)", "deliver a dead-lettered callback again (new row)" },
  { "signers", "()", "the signer roster: expected and observed addresses, posture" },
  { "set_expected_signer", "(key, address)", "enroll the address a signer key must have" },
  { "balances", "()", "the latest balance snapshot of each venue" },
  { "settings", "()", "the MG_* settings of this process (secrets hidden)" },
  { "reload", "()", "reload the policy scripts (as SIGHUP does)" },
  { "sql", "(query, ...)", "run one SQL statement ($1.. parameters); not audited: read-only use" },
  { "pp", "(value)", "print a value pretty-printed" },
}

local UUID = "^%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x$"

local function usage(fmt, ...)
  error({ kind = "usage", message = string.format(fmt, ...) }, 0)
end

local function check_uuid(what, id)
  if type(id) ~= "string" or not id:match(UUID) then
    usage("%s must be a uuid string, got %s", what, pretty.pretty(id))
  end
  return id:lower()
end

local function check_name(what, v)
  if type(v) ~= "string" or v == "" then usage("%s must be a non-empty string, got %s", what, pretty.pretty(v)) end
  return v
end

local function check_reason(reason)
  if type(reason) ~= "string" or not reason:match("%S") then
    usage("a reason (non-empty string) is required")
  end
  return reason
end

-- fn(s, ...) on a fresh database session; its first result.
local function with_session(fn, ...)
  return (qtg.db.with_session(fn, ...))
end

-- A missing table means a migration is not installed: say which.
local function explain_missing(e, what)
  if type(e) == "table" and e.sqlstate == "42P01" then
    error({ kind = "unavailable",
            message = what .. ": " .. tostring(e.message) .. " (run `qtgd migrate`; the module that owns it may not be installed)" }, 0)
  end
  error(e, 0)
end

local function optional_module(name, what)
  local ok, mod = pcall(require, name)
  if not ok then
    if tostring(mod):find("module '" .. name .. "' not found", 1, true) then
      error({ kind = "unavailable", message = what .. " is not available: module " .. name .. " is not installed" }, 0)
    end
    error(mod, 0)
  end
  return mod
end

local function find_worker(name)
  check_name("worker name", name)
  for _, w in ipairs(qtg.runtime.workers()) do
    if w.name == name then return w end
  end
  local names = {}
  for _, w in ipairs(qtg.runtime.workers()) do names[#names + 1] = w.name end
  table.sort(names)
  usage("no worker named %q (workers: %s)", name, table.concat(names, ", "))
end

-- A runtime change and its audit row: the row is written in a transaction
-- that commits only after the change was made.
local function audited_runtime(actor, action, name, detail, change)
  return with_session(function(s)
    s:transaction(function()
      require("qtg.outbox").audit(s, actor, action, "worker", name, nil, detail or {})
      change()
    end)
  end)
end

-- ---- workers ----------------------------------------------------------------

local WORKER_COLUMNS = { "name", "group", "state", "last tick", "items", "errors", "next run" }

local function workers()
  local now = qtg.now()
  local out = {}
  for _, w in ipairs(qtg.runtime.workers()) do
    local state = w.state
    if w.paused and state ~= "paused" then state = state .. " (pausing)" end
    local row = {}
    for k, v in pairs(w) do row[k] = v end
    row["last tick"] = w.last_tick_at and view.when(w.last_tick_at, now) or "never"
    row["items"] = string.format("%d", w.items_total or 0)
    row["errors"] = string.format("%d", w.consecutive_errors or 0)
    row["next run"] = w.next_run_at and view.when(w.next_run_at, now) or (w.paused and "paused" or "-")
    row.state = state
    out[#out + 1] = row
  end
  table.sort(out, function(a, b)
    if a.group ~= b.group then return a.group == "core" end
    return a.name < b.name
  end)
  return view.rows(out, WORKER_COLUMNS)
end

-- Wait for the worker's next pass to end; returns its outcome.
local function wait_for_pass(name, before, timeout)
  local deadline = qtg.monotonic() + timeout
  while qtg.monotonic() < deadline do
    qtg.sleep(0.05)
    local w = find_worker(name)
    if w.ticks > before.ticks or w.errors_total > before.errors_total then
      return w
    end
  end
  return nil
end

-- ---- requests ---------------------------------------------------------------

local NODE_COLUMNS = { "node_key", "node_kind", "action_type", "node_state", "attempt_no",
                       "provider_refs", "error_code", "error_detail", "next_observe_at", "id" }
local REQUEST_ORDER = { "id", "created", "template_key", "request_state", "network_class", "created_by",
                        "approved_by", "approvals", "created_at", "updated_at", "expires_at", "finished_at",
                        "last_error_code", "current_frontier", "callback_url", "idempotency_key",
                        "intent", "nodes", "callbacks" }
local REQUEST_COLUMNS = { "id", "template_key", "request_state", "created_at", "created_by",
                          "last_error_code" }
local CALLBACK_COLUMNS = { "id", "event_type", "status", "attempts", "last_status", "last_error",
                           "created_at" }

local function request_detail(s, id)
  local r = s:query("SELECT * FROM movement_requests WHERE id = $1::uuid", id)[1]
  if not r then
    error({ kind = "not_found", message = "no request " .. id }, 0)
  end
  r.nodes = view.rows(s:query([[
    SELECT n.*, pn.ordinal FROM movement_request_nodes n
      JOIN plan_nodes pn ON pn.id = n.plan_node_id
     WHERE n.request_id = $1::uuid ORDER BY pn.ordinal, n.node_key]], id), NODE_COLUMNS)
  r.callbacks = view.rows(s:query([[
    SELECT id, event_type, status, attempts, last_status, last_error, created_at
      FROM movement_callback_outbox WHERE request_id = $1::uuid ORDER BY id DESC LIMIT 10]], id),
    CALLBACK_COLUMNS)
  -- who approved, who is still needed and why
  local pol = type(r.approval_policy) == "table" and r.approval_policy or {}
  local votes = s:query([[SELECT principal, decision, comment, created_at,
                                 approval_digest = $2 AS current
                            FROM request_approvals WHERE request_id = $1::uuid ORDER BY id]],
    id, r.approval_digest)
  local approved = 0
  for _, v in ipairs(votes) do if v.decision == "approve" and v.current then approved = approved + 1 end end
  r.approvals = {
    rule = pol.rule, error = pol.error, required = r.approvals_required, roles = pol.roles,
    still_needed = r.request_state == "PENDING_APPROVAL" and math.max(0, r.approvals_required - approved) or 0,
    votes = view.rows(votes, { "principal", "decision", "comment", "created_at", "current" }),
  }
  return view.record(r, REQUEST_ORDER)
end

local REQUEST_FILTERS = { state = true, limit = true, template_key = true }

local function requests(filter)
  filter = filter or {}
  if type(filter) ~= "table" then usage("requests{state=, limit=, template_key=} takes a table") end
  for k in pairs(filter) do
    if not REQUEST_FILTERS[k] then usage("requests: unknown filter %s (state, limit, template_key)", tostring(k)) end
  end
  local limit = filter.limit or 20
  if type(limit) ~= "number" or limit < 1 or limit > 1000 or limit ~= math.floor(limit) then
    usage("requests: limit must be an integer from 1 to 1000")
  end
  if filter.state ~= nil and type(filter.state) ~= "string" then usage("requests: state must be a string") end
  if filter.template_key ~= nil and type(filter.template_key) ~= "string" then
    usage("requests: template_key must be a string")
  end
  local state = filter.state and filter.state:upper()
  return with_session(function(s)
    if state and not s:query("SELECT 1 FROM request_states WHERE state = $1", state)[1] then
      local names = {}
      for _, r in ipairs(s:query("SELECT state FROM request_states ORDER BY state")) do names[#names + 1] = r.state end
      usage("requests: unknown state %s (%s)", state, table.concat(names, ", "))
    end
    local rows = s:query([[
      SELECT id, template_key, request_state, created_at, created_by, last_error_code
        FROM movement_requests
       WHERE network_class = $1 AND ($2::text IS NULL OR request_state = $2)
         AND ($3::text IS NULL OR template_key = $3)
       ORDER BY created_at DESC LIMIT $4]],
      qtg.settings.network_class, state, filter.template_key, limit)
    return view.rows(rows, REQUEST_COLUMNS)
  end)
end

-- A lifecycle change through qtg.requests (which writes the change, its
-- callback and its audit row in one transaction); the answer is the
-- request as it is afterwards.  call(mod, s) makes the change and returns
-- the request id.
local function lifecycle(call)
  local mod = optional_module("qtg.requests", "the request lifecycle")
  return with_session(function(s)
    local id = call(mod, s)
    return request_detail(s, id)
  end)
end
-- ---- callbacks, signers, balances ----------------------------------------------

local DLQ_COLUMNS = { "id", "request_id", "event_type", "attempts", "last_status", "last_error",
                      "updated_at", "redelivered_as" }

local function dlq()
  return with_session(function(s)
    local ok, rows = pcall(s.query, s, [[
      SELECT o.id, o.request_id, o.event_type, o.attempts, o.last_status, o.last_error,
             o.updated_at, o.callback_url,
             (SELECT max(r.id) FROM movement_callback_outbox r WHERE r.redelivery_of = o.id) AS redelivered_as
        FROM movement_callback_outbox o
        JOIN movement_requests q ON q.id = o.request_id
       WHERE o.status = 'dlq' AND q.network_class = $1
       ORDER BY o.updated_at DESC LIMIT 200]], qtg.settings.network_class)
    if not ok then explain_missing(rows, "dlq") end
    return view.rows(rows, DLQ_COLUMNS)
  end)
end

local SIGNER_COLUMNS = { "signer_key", "posture", "expected_signer_address", "observed_signer_address",
                         "health_state", "runtime_present", "observed_at" }

local function signers()
  local mod = optional_module("qtg.signers", "the signer roster")
  return with_session(function(s)
    local ok, rows = pcall(mod.roster, s)
    if not ok then explain_missing(rows, "signers") end
    local hok, health = pcall(s.query, s, [[
      SELECT component_name, health_state FROM component_health
       WHERE network_class = $1 AND component_kind = 'signer']], qtg.settings.network_class)
    local by_name = {}
    if hok then for _, h in ipairs(health) do by_name[h.component_name] = h.health_state end end
    for _, r in ipairs(rows) do r.health_state = by_name[r.signer_key] or "unknown" end
    return view.rows(rows, SIGNER_COLUMNS)
  end)
end

local BALANCE_COLUMNS = { "venue_key", "asset", "amount", "stale", "age_seconds", "captured_at", "error" }

-- The latest snapshot of each venue and asset of this network class, stale
-- when older than MG_BALANCE_STALE_THRESHOLD_SECONDS (judged now, as the
-- spec says), failed fetches with their error.
local function balances()
  return with_session(function(s)
    local ok, rows = pcall(s.query, s, [[
      SELECT DISTINCT ON (venue_key, asset) venue_key, asset, ok, amount, error, source, captured_at,
             round(extract(epoch FROM now() - captured_at)::numeric, 1) AS age_seconds,
             (now() - captured_at) > $2::float8 * interval '1 second' AS stale
        FROM balance_snapshots
       WHERE network_class = $1
       ORDER BY venue_key, asset, captured_at DESC]],
      qtg.settings.network_class, qtg.settings.balance_stale_threshold_seconds)
    if not ok then
      if type(rows) == "table" and rows.sqlstate == "42P01" then
        error({ kind = "unavailable",
                message = "balances: there is no balance_snapshots table in this database (the balance "
                  .. "snapshot migration is not installed; run `qtgd migrate` once it is)" }, 0)
      end
      error(rows, 0)
    end
    return view.rows(rows, BALANCE_COLUMNS)
  end)
end

local SETTING_COLUMNS = { "name", "value", "default", "set" }

local function settings()
  local rows = {}
  for _, r in ipairs(qtg.settings_list()) do
    rows[#rows + 1] = { name = r.name, value = r.value, default = r.default,
                        set = r.set and "env" or "", help = r.help, type = r.type }
  end
  return view.rows(rows, SETTING_COLUMNS)
end

-- ---- help -----------------------------------------------------------------------

local function help()
  local lines = { "Operator commands (mutations are audited as your console:<uid>):", "" }
  local width = 0
  for _, c in ipairs(M.LIST) do
    if #(c[1] .. c[2]) > width then width = #(c[1] .. c[2]) end
  end
  for _, c in ipairs(M.LIST) do
    local sig = c[1] .. c[2]
    lines[#lines + 1] = "  " .. sig .. string.rep(" ", width - #sig + 2) .. c[3]
  end
  lines[#lines + 1] = ""
  lines[#lines + 1] = "Any Lua runs too: `=expr` or a bare expression prints its value; `qtg` is the host "
    .. "module (qtg.db, qtg.runtime, ...); Tab completes names; Ctrl-C interrupts a command."
  return view.text(table.concat(lines, "\n"))
end

-- bind(ctx) -> the command table of one session.  ctx.actor is the audit
-- actor ("console:<uid>"); ctx.print writes a line to the operator.
function M.bind(ctx)
  local actor = ctx.actor
  local out = ctx.print or print
  local c = {}
  local principals = require("qtg.principals")
  local uid = type(actor) == "string" and tonumber(actor:match("^console:(%d+)$")) or nil
  -- me(s): the principal this session acts as, looked up at each command
  -- (an operator enrolled or removed meanwhile takes effect at once)
  local function me(s)
    if uid then return principals.console(s, uid) end
    return principals.from_actor(actor)
  end

  c.help = help
  c.workers = workers

  function c.pause(name)
    find_worker(name)
    audited_runtime(actor, "worker.pause", name, {}, function() qtg.runtime.pause(name) end)
    return view.text("paused " .. name)
  end

  function c.resume_worker(name)
    find_worker(name)
    audited_runtime(actor, "worker.resume", name, {}, function() qtg.runtime.resume(name) end)
    return view.text("resumed " .. name)
  end

  function c.tick(name, timeout)
    local before = find_worker(name)
    timeout = timeout or 300
    if type(timeout) ~= "number" or timeout <= 0 then usage("tick: timeout must be a positive number of seconds") end
    audited_runtime(actor, "worker.tick", name, {}, function() qtg.runtime.tick_now(name) end)
    local started = qtg.monotonic()
    local after = wait_for_pass(name, before, timeout)
    if not after then
      return view.text(string.format("%s: pass requested; not finished after %.0fs", name, timeout))
    end
    if after.errors_total > before.errors_total then
      return view.text(string.format("%s: pass failed after %.2fs: %s", name, qtg.monotonic() - started,
        tostring(after.last_error)))
    end
    return view.text(string.format("%s: pass done in %.2fs, %d item%s", name, qtg.monotonic() - started,
      after.last_count or 0, after.last_count == 1 and "" or "s"))
  end

  function c.req(id)
    id = check_uuid("request id", id)
    return with_session(request_detail, id)
  end

  c.requests = requests

  -- create{template_key=, intent=, idempotency_key=, input_params=,
  -- callback_url=}: without an idempotency_key, one is made up (shown in
  -- the answer); give your own to make a retyped create harmless.
  function c.create(args)
    if type(args) ~= "table" then usage("create{...} takes a table of request fields") end
    local fields = {}
    for k, v in pairs(args) do fields[k] = v end
    if fields.idempotency_key == nil then
      fields.idempotency_key = actor .. ":" .. qtg.crypto.nonce()
    end
    local created
    local detail = lifecycle(function(mod, s)
      local r
      r, created = mod.create(s, fields, me(s))
      return r.id
    end)
    detail.created = created
    return detail
  end

  function c.approve(id, comment)
    id = check_uuid("request id", id)
    if comment ~= nil and type(comment) ~= "string" then usage("approve(id, comment): comment must be a string") end
    return lifecycle(function(mod, s) mod.approve(s, id, me(s), comment) return id end)
  end

  function c.reject(id, reason)
    id = check_uuid("request id", id)
    reason = check_reason(reason)
    return lifecycle(function(mod, s) mod.reject(s, id, me(s), reason) return id end)
  end

  function c.cancel(id, reason)
    id = check_uuid("request id", id)
    reason = check_reason(reason)
    return lifecycle(function(mod, s) mod.cancel(s, id, me(s), reason) return id end)
  end

  function c.resume(id)
    id = check_uuid("request id", id)
    return lifecycle(function(mod, s) mod.resume(s, id, me(s)) return id end)
  end

  function c.retry(node_id)
    node_id = check_uuid("node id", node_id)
    return lifecycle(function(mod, s)
      local r = mod.retry(s, node_id, me(s))
      return r.id
    end)
  end

  function c.complete_manual(node_id, artifacts)
    node_id = check_uuid("node id", node_id)
    if type(artifacts) ~= "table" then
      usage("complete_manual(node_id, artifacts): artifacts must be a table (the step's inputs)")
    end
    return lifecycle(function(mod, s)
      local r = mod.complete_manual_step(s, node_id, me(s), artifacts)
      return r.id
    end)
  end

  c.dlq = dlq

  function c.whoami()
    return with_session(function(s)
      local p = me(s)
      return view.record({ actor = p.actor, kind = p.kind, name = p.name, roles = table.concat(p.roles, ", "),
                           uid = uid }, { "actor", "kind", "name", "roles", "uid" })
    end)
  end

  -- approvals{pending=true}: PENDING_APPROVAL requests of this class that
  -- this principal may still approve (not its own, not voted yet).
  function c.approvals(filter)
    if filter ~= nil and type(filter) ~= "table" then usage("approvals{pending=true} takes a table") end
    return with_session(function(s)
      local p = me(s)
      local rows = s:query([[
        SELECT r.id, r.template_key, r.intent->>'asset' AS asset, r.intent->>'amount' AS amount,
               r.created_by, r.approvals_required,
               (SELECT count(*)::int FROM request_approvals a WHERE a.request_id = r.id
                   AND a.decision = 'approve' AND a.approval_digest = r.approval_digest) AS approvals,
               r.approval_policy->>'rule' AS rule, r.expires_at
          FROM movement_requests r
         WHERE r.network_class = $1 AND r.request_state = 'PENDING_APPROVAL'
           AND r.created_by <> $2
           AND NOT EXISTS (SELECT 1 FROM request_approvals a WHERE a.request_id = r.id AND a.principal = $2)
         ORDER BY r.created_at LIMIT 200]], qtg.settings.network_class, p.actor)
      return view.rows(rows, { "id", "template_key", "asset", "amount", "created_by", "approvals",
                               "approvals_required", "rule", "expires_at" })
    end)
  end

  function c.operators()
    return with_session(function(s)
      return view.rows(principals.list(s), { "name", "uid", "roles", "created_by", "created_at" })
    end)
  end

  function c.add_operator(name, op_uid, roles)
    check_name("name", name)
    return with_session(function(s)
      return view.record(principals.add(s, name, op_uid, roles, me(s)), { "name", "uid", "roles" })
    end)
  end

  function c.remove_operator(name)
    check_name("name", name)
    return with_session(function(s)
      return view.record(principals.remove(s, name, me(s)), { "name", "uid", "roles" })
    end)
  end

  local CHANGE_COLUMNS = { "id", "action", "asset", "chain", "address", "label", "state", "approvals",
                           "approvals_required", "proposed_by", "created_at" }

  function c.address_book()
    local book = require("qtg.address_book")
    return with_session(function(s)
      return view.record({
        entries = view.rows(book.list(s), { "asset", "chain", "address", "label", "added_at" }),
        pending = view.rows(book.changes(s, { pending = true }), CHANGE_COLUMNS),
      }, { "entries", "pending" })
    end)
  end

  function c.propose_address(change)
    if type(change) ~= "table" then usage("propose_address{action=, asset=, chain=, address=, label=}") end
    local book = require("qtg.address_book")
    return with_session(function(s) return view.record(book.propose(s, change, me(s)), CHANGE_COLUMNS) end)
  end

  function c.vote_address(change_id, decision, comment)
    local book = require("qtg.address_book")
    return with_session(function(s)
      return view.record(book.vote(s, change_id, me(s), decision, comment), CHANGE_COLUMNS)
    end)
  end

  function c.redeliver(callback_id)
    if type(callback_id) ~= "number" or callback_id ~= math.floor(callback_id) or callback_id < 1 then
      usage("redeliver(callback_id): the id is a positive integer, got %s", pretty.pretty(callback_id))
    end
    local mod = optional_module("qtg.callbacks", "callback redelivery")
    return with_session(function(s)
      local ok, row = pcall(mod.redeliver, s, callback_id, actor)
      if not ok then explain_missing(row, "redeliver") end
      return view.record(row, { "id", "redelivery_of", "request_id", "event_type", "status",
                                "callback_timestamp", "callback_nonce" })
    end)
  end

  c.signers = signers

  function c.set_expected_signer(key, address)
    check_name("signer key", key)
    check_name("address", address)
    local mod = optional_module("qtg.signers", "the signer roster")
    return with_session(function(s)
      local ok, row = pcall(mod.set_expected_identity, s, key, address, actor)
      if not ok then explain_missing(row, "set_expected_signer") end
      return view.record(row, { "signer_key", "posture", "expected_signer_address",
                                "observed_signer_address", "expected_set_by", "expected_set_at" })
    end)
  end

  c.balances = balances
  c.settings = settings

  function c.reload()
    local reload = require("qtg.reload")
    local report = reload.reload(actor)
    local text = reload.describe(report)
    if not report.ok then error({ kind = "reload", message = text.text }, 0) end
    return text
  end

  function c.sql(query, ...)
    if type(query) ~= "string" then usage("sql(query, ...): query must be a string") end
    local args = { n = select("#", ...), ... }
    return with_session(function(s) return (s:query(query, unpack(args, 1, args.n))) end)
  end

  function c.pp(v)
    out(pretty.pretty(v))
  end

  return c
end

return M
