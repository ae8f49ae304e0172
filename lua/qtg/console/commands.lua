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
local errors = require("qtg.errors")
local lifecycle_mod = require("qtg.requests")
local signers_mod = require("qtg.signers")
local callbacks_mod = require("qtg.callbacks")

local M = {}

-- name, arguments, summary: the order help() lists them in.
M.LIST = {
  { "help", "()", "this list" },
  { "workers", "()", "workers: group, state, last tick, items, consecutive errors, next run" },
  { "pause", "(name)", "pause a worker (its running pass finishes)" },
  { "resume_worker", "(name)", "resume a paused worker" },
  { "tick", "(name)", "run one pass of a worker now and wait for it" },
  { "req", "(id)", "a request (any state; id or its first 6+ hex digits): nodes, attempts, errors, "
    .. "manual steps' instructions and inputs, why it was rejected or cancelled" },
  { "requests", "{state=, limit=}", "recent requests of this network class" },
  { "create", "{template_key=, intent=, idempotency_key=}", "create a movement request" },
  { "approve", "(id)", "PENDING_APPROVAL (within its approval window): your vote; -> APPROVED once "
    .. "the policy's quorum is met (approve(id, comment) adds a comment; approve(id, comment, signature) "
    .. "with signed approvals: qtgd approver sign of req(id).approvals.statement)" },
  { "initiate", "(id, signature)", "the maker's signature of its request's initiation statement, with "
    .. "'initiation signed' (qtgd approver sign of req(id).approvals.initiation_statement)" },
  { "reject", "(id, reason)", "PENDING_APPROVAL -> REJECTED (any rejection ends it)" },
  { "approvals", "{pending=true}", "requests waiting for approval that you may still approve (your inbox)" },
  { "whoami", "()", "your principal: actor and roles" },
  { "operators", "()", "the operators: name, uid, roles" },
  { "add_operator", "(name, uid, roles)", "map a console uid to a named operator (admin)" },
  { "remove_operator", "(name)", "remove an operator (admin)" },
  { "address_book", "()", "the address book, and its changes waiting for a quorum" },
  { "propose_address", "{action=, asset=, chain=, address=, label=}", "propose adding/removing an address (admin)" },
  { "vote_address", "(change_id, decision, comment)", "approve or reject an address book change (admin)" },
  { "cancel", "(id, reason[, {reconciled = true}])", "PENDING_APPROVAL, APPROVED, EXECUTING, WAITING_MANUAL_ACTION or "
    .. "MANUAL_INTERVENTION -> CANCELLED, while no node is in flight; an UNKNOWN node needs reconciled = true "
    .. "(the provider was asked what it did)" },
  { "resume", "(id)", "MANUAL_INTERVENTION -> EXECUTING; refused while a node is FAILED (retry it) "
    .. "or when no node is left to move; FAILED -> EXECUTING while a node is in flight (observed, "
    .. "nothing submitted again)" },
  { "retry", "(node_id)", "a FAILED or UNKNOWN node -> READY, of a FAILED, MANUAL_INTERVENTION or "
    .. "EXECUTING request (which becomes EXECUTING)" },
  { "complete_manual", "(node_id, artifacts[, signature])", "a READY manual step -> COMPLETED, of a "
    .. "WAITING_MANUAL_ACTION or EXECUTING request; artifacts: the step's required_inputs (req() lists them); "
    .. "under signed approvals, your signature of its attestation statement (req(id).attestation_statements; "
    .. "qtgd approver sign --kind attestation --step KEY)" },
  { "dlq", "()", "dead-lettered callbacks" },
  { "redeliver", "(callback_id)", "a dlq callback row -> a new pending row; refused while its last "
    .. "redelivery is pending or was delivered" },
  { "fill_nonce", "(chain_id, sender, nonce[, signature[, {cancel = true}]])", "have the signer fill a nonce it "
    .. "granted a transfer at (a transfer of nothing to the sender itself), and send it: the way out of "
    .. "EVM_NONCE_GAP, EVM_TX_REJECTED and a grant audit verify lists; with signed approvals, your signature "
    .. "from qtgd approver sign-fill; a transfer in flight on its own bytes only with cancel = true (operate)" },
  { "signers", "()", "the signer roster: expected and observed addresses, posture" },
  { "set_expected_signer", "(key, address)", "enroll the address a signer key must have" },
  { "balances", "()", "the latest balance snapshot of each venue" },
  { "settings", "()", "the MG_* settings of this process (secrets hidden)" },
  { "reload", "()", "reload the policy scripts (as SIGHUP does)" },
  { "sql", "(query, ...)", "run one SQL statement ($1.. parameters), read-only; audited" },
  { "sql_write", "(query, ...)", "run one SQL statement that may write (emergencies); audited" },
  { "pp", "(value)", "print a value pretty-printed" },
}

local UUID = "^%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x$"

local function usage(fmt, ...)
  errors.raise("usage", fmt, ...)
end

-- A request or node id as the operator typed it: the full uuid, or a
-- prefix of at least 6 hex digits (the demo prints 8) naming exactly one
-- request (or node of a request) of this network class.
local SHORT_MIN = 6
local SHORT_TABLES = {
  request = [[SELECT id::text FROM movement_requests
               WHERE network_class = $1 AND id::text LIKE $2 ORDER BY id LIMIT 5]],
  node = [[SELECT n.id::text FROM movement_request_nodes n JOIN movement_requests r ON r.id = n.request_id
            WHERE r.network_class = $1 AND n.id::text LIKE $2 ORDER BY n.id LIMIT 5]],
}

local function resolve_id(what, id)
  if type(id) == "string" and id:match(UUID) then return id:lower() end
  if type(id) ~= "string" or not id:match("^[%x%-]+$") or #id:gsub("%-", "") < SHORT_MIN then
    usage("%s id must be a uuid or its first %d or more hex digits, got %s", what, SHORT_MIN, pretty.pretty(id))
  end
  local rows = qtg.db.with_session(function(s)
    return s:query(SHORT_TABLES[what], qtg.settings.network_class, id:lower() .. "%")
  end)
  if #rows == 0 then
    error(qtg.error("not_found", string.format("no %s id of network class %s starts with %s", what,
      qtg.settings.network_class, id)), 0)
  elseif #rows > 1 then
    local ids = {}
    for _, r in ipairs(rows) do ids[#ids + 1] = r.id end
    usage("%s id %s is ambiguous: %s%s; type more of it", what, id, table.concat(ids, ", "),
      #rows == 5 and ", ..." or "")
  end
  return rows[1].id
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
    error(qtg.error("unavailable", what .. ": " .. tostring(e.message)
      .. " (run `qtgd migrate`; the module that owns it may not be installed)"), 0)
  end
  error(e, 0)
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

local WORKER_COLUMNS = { "name", "group", "state", "last tick", "items", "errors", "next run", "last error" }

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
    -- the error of the last failed pass, while the worker keeps failing
    row["last error"] = (w.consecutive_errors or 0) > 0 and w.last_error
      and (w.last_error:match("^[^\n]*")) or "-"
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
                        "approved_by", "approvals", "created_at", "updated_at", "expires_at",
                        "finished_at", "last_error_code", "reason", "manual_steps", "attestation_statements",
                        "current_frontier",
                        "callback_url", "idempotency_key", "intent", "nodes", "busy_stops", "callbacks" }
local REQUEST_COLUMNS = { "id", "template_key", "request_state", "created_at", "created_by",
                          "last_error_code" }
local CALLBACK_COLUMNS = { "id", "event_type", "status", "attempts", "last_status", "last_error",
                           "created_at" }

local function request_detail(s, id)
  -- through the lifecycle: another network class's request is not this
  -- process's to show
  local ok, r = pcall(lifecycle_mod.get, s, id)
  if not ok then
    if type(r) == "table" and r.kind == "not_found"
        and not s:query("SELECT 1 FROM movement_requests WHERE id = $1::uuid", id)[1] then
      error(qtg.error("not_found", "no request " .. id), 0)
    end
    error(r, 0)
  end
  r.nodes = view.rows(s:query([[
    SELECT n.*, pn.ordinal FROM movement_request_nodes n
      JOIN plan_nodes pn ON pn.id = n.plan_node_id
     WHERE n.request_id = $1::uuid ORDER BY pn.ordinal, n.node_key]], id), NODE_COLUMNS)
  -- work on its nodes this process's busy guard stopped (qtg.busy_stops)
  local key_of, ids = {}, {}
  for _, n in ipairs(r.nodes) do
    key_of[tostring(n.id)] = n.node_key
    ids[#ids + 1] = n.id
  end
  local stops = {}
  for _, st in ipairs(require("qtg.busy_stops").of(ids)) do
    stops[#stops + 1] = string.format("%s (node %s), attempt %d: %s stopped by the busy guard; %s",
      tostring(key_of[st.node_id]), st.node_id, st.attempt_no or 0, st.what, st.effect)
  end
  if #stops > 0 then r.busy_stops = stops end
  -- what an operator must do for a manual step, and what to give
  local manual, attestations = {}, {}
  local signed = require "qtg.signed_approvals"
  for _, n in ipairs(s:query([[
    SELECT n.id, n.node_key, n.node_state, n.attested_by, pn.config->>'instructions' AS instructions,
           pn.config->'required_inputs' AS required_inputs
      FROM movement_request_nodes n JOIN plan_nodes pn ON pn.id = n.plan_node_id
     WHERE n.request_id = $1::uuid AND n.action_type LIKE 'manual\_%' ORDER BY pn.ordinal, n.node_key]], id)) do
    local inputs = type(n.required_inputs) == "table" and n.required_inputs or {}
    manual[#manual + 1] = string.format("%s (%s, node %s): %s%s", n.node_key, n.node_state, n.id,
      tostring(n.instructions ~= qtg.db.NULL and n.instructions or "(no instructions)"),
      #inputs > 0 and ("; complete_manual(node_id, {" .. table.concat(inputs, "=, ") .. "=})") or "")
      .. (type(n.attested_by) == "string" and ("; attested by " .. n.attested_by) or "")
    -- under signed approvals, what completing it signs
    if n.node_state == "READY" then attestations[n.node_key] = signed.attestation_statement(s, id, n.node_key) end
  end
  if #manual > 0 then r.manual_steps = manual end
  if next(attestations) then r.attestation_statements = attestations end
  -- who rejected or cancelled it, and why (the audit trail keeps the reason)
  local why = s:query([[
    SELECT actor, action, detail->>'reason' AS reason, created_at FROM (
      SELECT actor, action, detail, created_at, id FROM audit_events WHERE request_id = $1::uuid
      UNION ALL
      SELECT actor, action, detail, created_at, id FROM audit_outbox WHERE request_id = $1::uuid) a
     WHERE action IN ('request.reject', 'request.cancel') ORDER BY created_at DESC LIMIT 1]], id)[1]
  if why then
    r.reason = string.format("%s by %s: %s", why.action == "request.reject" and "rejected" or "cancelled",
      why.actor, tostring(why.reason ~= qtg.db.NULL and why.reason or "(none given)"))
  end
  r.callbacks = view.rows(s:query([[
    SELECT id, event_type, status, attempts, last_status, last_error, created_at
      FROM movement_callback_outbox WHERE request_id = $1::uuid ORDER BY id DESC LIMIT 10]], id),
    CALLBACK_COLUMNS)
  -- who approved, who is still needed and why
  local pol = type(r.approval_policy) == "table" and r.approval_policy or {}
  local votes = s:query([[SELECT principal, decision, comment, created_at,
                                 approval_digest = $2 AS current, signature IS NOT NULL AS signed
                            FROM request_approvals WHERE request_id = $1::uuid ORDER BY id]],
    id, r.approval_digest)
  -- a vote counts when its voter still exists, is active and holds the
  -- rule's roles now (qtg.requests.approval_status)
  local st = lifecycle_mod.approval_status(s, id)
  local counting = {}
  for _, v in ipairs(st.approved_by) do counting[v.principal] = v.counts end
  for _, v in ipairs(votes) do v.counts = counting[v.principal] == true end
  -- what an approval lets the signer sign, as `qtgd approver sign` reads it
  local texts = s:query([[SELECT qtg_approval_document(r)::text AS document,
                                 qtg_approval_plan_document(r.plan_version_id)::text AS plan
                            FROM movement_requests r WHERE id = $1::uuid]], id)[1]
  r.approvals = {
    signer_may_sign = texts and qtg.approvers.describe(texts.document, texts.plan) or nil,
    rule = pol.rule, error = pol.error, required = r.approvals_required, roles = pol.roles,
    still_needed = st.still_needed, signed = st.signed, statement = st.statement,
    initiation_statement = st.initiation_statement, initiated = st.initiated,
    votes = view.rows(votes, { "principal", "decision", "comment", "created_at", "current", "signed", "counts" }),
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
  local mod = lifecycle_mod
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
  local mod = signers_mod
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
        error(qtg.error("unavailable", "balances: there is no balance_snapshots table in this database (the balance "
                  .. "snapshot migration is not installed; run `qtgd migrate` once it is)"), 0)
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
  local lines = { "Operator commands (mutations are audited as the operator your uid is enrolled as; whoami()):", "" }
  local width = 0
  for _, c in ipairs(M.LIST) do
    if #(c[1] .. c[2]) > width then width = #(c[1] .. c[2]) end
  end
  for _, c in ipairs(M.LIST) do
    local sig = c[1] .. c[2]
    lines[#lines + 1] = "  " .. sig .. string.rep(" ", width - #sig + 2) .. c[3]
  end
  lines[#lines + 1] = ""
  lines[#lines + 1] = "Request and node ids: the full uuid or its first 6 or more hex digits, when only "
    .. "one id of this network class starts with them."
  lines[#lines + 1] = "Any Lua runs too: `=expr` or a bare expression prints its value; `qtg` is the host "
    .. "module (qtg.db, qtg.runtime, ...); Tab completes names; Ctrl-C interrupts a command."
  return view.text(table.concat(lines, "\n"))
end

-- sql(query, ...) runs in a READ ONLY transaction; sql_write(query, ...) may
-- write, for emergencies.  Both are audited (console.sql / console.sql_write,
-- the statement and its parameters): a read in its own transaction before the
-- statement runs, a write in the statement's own transaction, so the change
-- and its record commit together.  A read-only transaction may still change
-- its session (set_config(..., false), pg_advisory_lock, PREPARE), so the
-- connection is closed afterwards rather than handed to a worker.
local SQL_MODES = {
  sql = { read_only = true, action = "console.sql" },
  sql_write = { read_only = false, action = "console.sql_write" },
}

local function sql_params(args)
  local out = {}
  for i = 1, args.n do out[i] = args[i] == nil and "nil" or tostring(args[i]) end
  return out
end

local function run_sql(actor, mode_name, query, ...)
  local mode = SQL_MODES[mode_name]
  if type(query) ~= "string" then usage("%s(query, ...): query must be a string", mode_name) end
  local args = { n = select("#", ...), ... }
  local outbox = require("qtg.outbox")
  local detail = { query = query, params = sql_params(args), read_only = mode.read_only }
  return (qtg.db.with_discarded_session(function(s)
    if mode.read_only then
      s:transaction(function()
        outbox.audit(s, actor, mode.action, "sql", "console", nil, detail)
      end)
    end
    return s:transaction(function()
      if mode.read_only then s:exec("SET TRANSACTION READ ONLY")
      else outbox.audit(s, actor, mode.action, "sql", "console", nil, detail) end
      return (s:query(query, unpack(args, 1, args.n)))
    end)
  end))
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

  -- as(role, action) -> the actor of this session's principal, after
  -- refusing one without `role` (an unmapped uid only reads): every command
  -- that changes something records the operator's name, never a bare uid.
  local function as(role, action)
    return with_session(function(s)
      local p = me(s)
      principals.require_role(p, role, action)
      return p.actor
    end)
  end

  c.help = help
  c.workers = workers

  function c.pause(name)
    find_worker(name)
    audited_runtime(as("operate", "pause a worker"), "worker.pause", name, {}, function() qtg.runtime.pause(name) end)
    return view.text("paused " .. name)
  end

  function c.resume_worker(name)
    find_worker(name)
    audited_runtime(as("operate", "resume a worker"), "worker.resume", name, {}, function() qtg.runtime.resume(name) end)
    return view.text("resumed " .. name)
  end

  function c.tick(name, timeout)
    local before = find_worker(name)
    timeout = timeout or 300
    if type(timeout) ~= "number" or timeout <= 0 then usage("tick: timeout must be a positive number of seconds") end
    audited_runtime(as("operate", "run a worker's pass"), "worker.tick", name, {}, function() qtg.runtime.tick_now(name) end)
    local started = qtg.monotonic()
    local after = wait_for_pass(name, before, timeout)
    -- a pass that failed or did not finish is an error, so `qtgd console -e`
    -- exits 1 and a script stops there
    if not after then
      error(qtg.error("tick", string.format("%s: pass requested; not finished after %.0fs",
        name, timeout)), 0)
    end
    if after.errors_total > before.errors_total then
      error(qtg.error("tick", string.format("%s: pass failed after %.2fs: %s", name,
        qtg.monotonic() - started, tostring(after.last_error))), 0)
    end
    return view.text(string.format("%s: pass done in %.2fs, %d item%s", name, qtg.monotonic() - started,
      after.last_count or 0, after.last_count == 1 and "" or "s"))
  end

  function c.req(id)
    id = resolve_id("request", id)
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

  function c.approve(id, comment, signature)
    id = resolve_id("request", id)
    if comment ~= nil and type(comment) ~= "string" then usage("approve(id, comment): comment must be a string") end
    if signature ~= nil and type(signature) ~= "string" then
      usage("approve(id, comment, signature): signature must be a string (qtgd approver sign)")
    end
    return lifecycle(function(mod, s) mod.approve(s, id, me(s), comment, signature) return id end)
  end

  function c.initiate(id, signature)
    id = resolve_id("request", id)
    if type(signature) ~= "string" then
      usage("initiate(id, signature): signature must be a string (qtgd approver sign)")
    end
    return lifecycle(function(mod, s) mod.initiate(s, id, me(s), signature) return id end)
  end

  function c.reject(id, reason)
    id = resolve_id("request", id)
    reason = check_reason(reason)
    return lifecycle(function(mod, s) mod.reject(s, id, me(s), reason) return id end)
  end

  function c.cancel(id, reason, opts)
    id = resolve_id("request", id)
    reason = check_reason(reason)
    if opts ~= nil and (type(opts) ~= "table" or (opts.reconciled ~= nil and type(opts.reconciled) ~= "boolean")) then
      usage("cancel(id, reason[, {reconciled = true}]): the third argument is a table, got %s", pretty.pretty(opts))
    end
    local reconciled = opts ~= nil and opts.reconciled == true
    return lifecycle(function(mod, s) mod.cancel(s, id, me(s), reason, reconciled) return id end)
  end

  function c.resume(id)
    id = resolve_id("request", id)
    return lifecycle(function(mod, s) mod.resume(s, id, me(s)) return id end)
  end

  function c.retry(node_id)
    node_id = resolve_id("node", node_id)
    return lifecycle(function(mod, s)
      local r = mod.retry(s, node_id, me(s))
      return r.id
    end)
  end

  function c.complete_manual(node_id, artifacts, signature)
    node_id = resolve_id("node", node_id)
    if type(artifacts) ~= "table" then
      usage("complete_manual(node_id, artifacts[, signature]): artifacts must be a table (the step's inputs)")
    end
    return lifecycle(function(mod, s)
      local r = mod.complete_manual_step(s, node_id, me(s), artifacts, signature)
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
    local mod = callbacks_mod
    local who = as("operate", "redeliver a callback")
    return with_session(function(s)
      local ok, row = pcall(mod.redeliver, s, callback_id, who)
      if not ok then explain_missing(row, "redeliver") end
      return view.record(row, { "id", "redelivery_of", "request_id", "event_type", "status",
                                "callback_timestamp", "callback_nonce" })
    end)
  end

  function c.fill_nonce(chain_id, sender, nonce, signature, opts)
    if opts ~= nil and type(opts) ~= "table" then
      usage("fill_nonce(chain_id, sender, nonce[, signature[, {cancel = true}]]): the options are a table")
    end
    local who = as("operate", "fill a nonce")
    local r = require("qtg.evm_fill").fill({ chain_id = chain_id, sender = sender, nonce = nonce,
                                             signature = signature, cancel = opts and opts.cancel }, who)
    return view.record(r, { "tx_hash", "chain_id", "sender", "nonce", "max_fee_per_gas",
                            "max_priority_fee_per_gas", "sent", "request_id" })
  end

  c.signers = signers

  function c.set_expected_signer(key, address)
    check_name("signer key", key)
    check_name("address", address)
    local mod = signers_mod
    local who = as("admin", "enroll a signer identity")
    return with_session(function(s)
      local ok, row = pcall(mod.set_expected_identity, s, key, address, who)
      if not ok then explain_missing(row, "set_expected_signer") end
      return view.record(row, { "signer_key", "posture", "expected_signer_address",
                                "observed_signer_address", "expected_set_by", "expected_set_at" })
    end)
  end

  c.balances = balances
  c.settings = settings

  -- The reload runs in a task of its own, as SIGHUP's does: a stop of this
  -- command (Ctrl-C, its busy limit, the client gone) ends only the wait,
  -- never the reload half-way (its restore of the old modules, its log and
  -- its audit row); the busy guard still stops a module that never loads.
  function c.reload()
    local reload = require("qtg.reload")
    local who = as("admin", "reload the policies")
    local ok, report = qtg.join(qtg.spawn_unowned(reload.reload, who, { watch = reload.WATCH_SECONDS }))
    if not ok then error(report, 0) end
    local text = reload.describe(report)
    if not report.ok then error(qtg.error("reload", text.text), 0) end
    return text
  end

  c.sql = function(query, ...) return run_sql(as("read", "run sql()"), "sql", query, ...) end
  c.sql_write = function(query, ...)
    return run_sql(as("admin", "run sql_write()"), "sql_write", query, ...)
  end

  function c.pp(v)
    out(pretty.pretty(v))
  end

  return c
end

return M
