-- qtg.api.routes: every route of the HTTP API, one table (M.LIST), each row
-- { method, path ("/v3/requests/{id}"), name, role (read | operate |
--   approve | admin; public routes have none), query = {param = {type=,
--   description=}}, body = {fields = {name = {type=, required=}}},
--   mutating (Idempotency-Key honoured), requires_idempotency_key,
--   owned (what a token of scope own reaches: qtg.api.ownership),
--   summary, response (schema name in qtg.api.openapi), handler(ctx),
--   outside(ctx): work away from the database, run with no session held
--   before the handler (qtg.api) }.
-- Handlers call the same lifecycle functions as the console
-- (qtg.requests, qtg.callbacks, qtg.signers, qtg.balances) with the token's
-- principal as the actor, and return status, document[, headers].
-- role "any": any valid token (GET /v3/me).
local qtg = require "qtg"
local canon = require "qtg.canon_json"
local problem = require "qtg.api.problem"
local ownership = require "qtg.api.ownership"
local redact = require "qtg.redact"

local M = {}

-- A page of GET /v3/requests or /v3/approvals ends early, with its
-- next_cursor, once the documents of its requests (intents and
-- input_params; the approval texts) pass this many bytes (it holds one
-- request at least): a listing is encoded on the daemon's one loop.
M.LIST_BYTES = 1048576

-- page_length(rows, limit, bytes_of) -> how many of rows (fetched limit + 1)
-- a page holds: at most limit, and past the first, none that takes the
-- page's documents over LIST_BYTES.
local function page_length(rows, limit, bytes_of)
  local n, bytes = 0, 0
  for i = 1, math.min(#rows, limit) do
    bytes = bytes + bytes_of(rows[i])
    if i > 1 and bytes > M.LIST_BYTES then break end
    n = i
  end
  return n
end

local NULL = qtg.db.NULL
local UUID = "^%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x$"

-- The lifecycle functions (qtg.requests) take the principal itself, so its
-- roles decide (four eyes across the API and the console); the functions
-- that record only who acted take its actor string.
local function principal(ctx) return ctx.principal end
local function actor(ctx) return ctx.principal.actor end

local function uuid_param(ctx, name, what)
  local id = ctx.params[name]
  if type(id) ~= "string" or not id:match(UUID) then
    problem.raise("not_found", "%s %s: not a %s id (uuid)", what, tostring(id), what)
  end
  return id:lower()
end

local function int_param(ctx, name, default, min, max)
  local v = ctx.query[name]
  if v == nil then return default end
  local n = v:match("^%d+$") and tonumber(v)
  if not n or n < min or n > max then
    problem.raise("bad_request", "%s must be an integer from %d to %d", name, min, max)
  end
  return n
end

local function bool_param(ctx, name)
  local v = ctx.query[name]
  if v == nil then return false end
  if v == "true" then return true end
  if v == "false" then return false end
  problem.raise("bad_request", "%s must be true or false", name)
end

local function arr(t)
  local a = canon.array()
  for i, v in ipairs(t or {}) do a[i] = v end
  return a
end

-- An opaque cursor: hex of the last row's sort key.
local function encode_cursor(...)
  return qtg.crypto.hex(table.concat({ ... }, "|"))
end

-- valid_time(v): v is a time PostgreSQL reads as the same timestamptz
-- and never refuses: a date (year 1-9999, a real month and day), then
-- optionally a time (hh:mm[:ss[.fraction]]) after T, t or a space, and an
-- offset (Z, +hh, +hhmm, +hh:mm; PostgreSQL's text has +00).  Checked here
-- because a value PostgreSQL refuses is an error of the statement: a 500.
local DAYS = { 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 }
function M.valid_time(v)
  if type(v) ~= "string" or #v > 40 then return false end
  local y, mo, d, rest = v:match("^(%d%d%d%d)%-(%d%d)%-(%d%d)(.*)$")
  if not y then return false end
  y, mo, d = tonumber(y), tonumber(mo), tonumber(d)
  if y < 1 or mo < 1 or mo > 12 or d < 1 or d > DAYS[mo] then return false end
  if mo == 2 and d == 29 and not (y % 4 == 0 and (y % 100 ~= 0 or y % 400 == 0)) then return false end
  if rest == "" then return true end
  local h, mi, tail = rest:match("^[Tt ](%d%d):(%d%d)(.*)$")
  if not h or tonumber(h) > 23 or tonumber(mi) > 59 then return false end
  local sec, after = tail:match("^:(%d%d)(.*)$")
  if sec then
    if tonumber(sec) > 59 then return false end
    tail = after
    local frac, after2 = tail:match("^%.(%d+)(.*)$")
    if frac then
      if #frac > 9 then return false end
      tail = after2
    end
  end
  if tail == "" or tail == "Z" or tail == "z" then return true end
  local oh, om = tail:match("^[%+%-](%d%d):?(%d%d)$")
  if not oh then oh = tail:match("^[%+%-](%d%d)$"); om = "00" end
  return oh ~= nil and tonumber(oh) <= 15 and tonumber(om) <= 59
end

local function bad_cursor()
  problem.raise("bad_request", "cursor is not one this API returned")
end

-- decode_cursor(text, n) -> its n parts, or 400
local function decode_cursor(text, n)
  local ok, raw = pcall(qtg.crypto.unhex, text)
  if ok and #text <= 400 then
    local parts = {}
    for p in (raw .. "|"):gmatch("([^|]*)|") do parts[#parts + 1] = p end
    if #parts == n then return parts end
  end
  bad_cursor()
end

-- A (created_at, id) cursor: the time as PostgreSQL wrote it and a uuid.
local function time_id_cursor(text)
  local parts = decode_cursor(text, 2)
  if not M.valid_time(parts[1]) or not parts[2]:match(UUID) then bad_cursor() end
  return parts[1], parts[2]
end

-- An id cursor: a bigint id this API returned (ids stay below 2^53, so
-- they are exact as Lua numbers; 15 digits are far past any real id).
local function id_cursor(text)
  local v = decode_cursor(text, 1)[1]
  if not v:match("^%d+$") or #v > 15 then bad_cursor() end
  return tonumber(v)
end

-- id_page(rows, limit) -> {items, next_cursor}: rows were asked for with
-- LIMIT limit + 1, so one more than a page means there is a next one, which
-- starts after the last item's id.
local function id_page(rows, limit)
  local items = canon.array()
  for i = 1, math.min(#rows, limit) do items[i] = rows[i] end
  local next_cursor = NULL
  if #rows > limit then next_cursor = encode_cursor(tostring(rows[limit].id)) end
  return { items = items, next_cursor = next_cursor }
end

-- ---------------------------------------------------------------- requests
local REQUEST_FIELDS = { "id", "template_key", "request_state", "network_class", "intent", "input_params",
  "current_frontier", "idempotency_key", "callback_url", "created_by", "approved_by", "approved_at",
  "created_at", "updated_at", "expires_at", "finished_at", "last_error_code", "approvals_required",
  "approval_digest" }
local NODE_FIELDS = { "id", "node_key", "node_kind", "action_type", "executor", "node_state", "attempt_no",
  "observe_count", "provider_refs", "error_code", "error_detail", "started_at", "finished_at",
  "next_observe_at", "updated_at", "side_effect", "state_since", "unknown_observations" }

local function pick(row, fields)
  local out = {}
  for _, f in ipairs(fields) do
    local v = row[f]
    if v == nil then v = NULL end
    out[f] = v
  end
  return out
end

local function request_doc(s, req)
  local doc = pick(req, REQUEST_FIELDS)
  doc.current_frontier = arr(req.current_frontier)
  if type(doc.intent) == "table" and next(doc.intent) == nil then doc.intent = setmetatable({}, nil) end
  return doc
end

local function request_detail(s, id)
  local req, nodes = require("qtg.requests").get(s, id)
  local doc = request_doc(s, req)
  local list, errors = canon.array(), canon.array()
  -- a manual step's instructions and the inputs completing it requires;
  -- under signed approvals the statement completing it signs, and who did
  local manual = {}
  local signed = require "qtg.signed_approvals"
  for _, m in ipairs(s:query([[
      SELECT n.id, n.node_key, n.attested_by, pn.config FROM movement_request_nodes n
        JOIN plan_nodes pn ON pn.id = n.plan_node_id
       WHERE n.request_id = $1::uuid AND n.node_kind = 'manual']], id)) do
    local c = type(m.config) == "table" and m.config or {}
    manual[m.id] = { instructions = type(c.instructions) == "string" and c.instructions or NULL,
                     required_inputs = arr(type(c.required_inputs) == "table" and c.required_inputs or {}),
                     attestation_statement = signed.attestation_statement(s, id, m.node_key) or NULL,
                     attested_by = m.attested_by or NULL }
  end
  for i, n in ipairs(nodes) do
    list[i] = pick(n, NODE_FIELDS)
    list[i].manual = manual[n.id]
    if n.error_code ~= NULL and n.error_code ~= nil then
      errors[#errors + 1] = { node_key = n.node_key, node_id = n.id, error_code = n.error_code,
                              error_detail = n.error_detail }
    end
  end
  doc.nodes = list
  doc.errors = errors
  -- the plan's edges by node key (from must finish before to starts)
  doc.edges = arr(s:query([[
    SELECT fn.node_key AS "from", tn.node_key AS "to"
      FROM movement_requests r
      JOIN plan_edges e ON e.plan_version_id = r.plan_version_id
      JOIN plan_nodes fn ON fn.id = e.from_node_id
      JOIN plan_nodes tn ON tn.id = e.to_node_id
     WHERE r.id = $1::uuid ORDER BY fn.ordinal, tn.ordinal]], id))
  doc.approvals = arr(s:query([[
    SELECT principal, decision, comment, created_at, signature IS NOT NULL AS signed FROM request_approvals
     WHERE request_id = $1::uuid ORDER BY id]], id))
  -- who is still needed, and why: the policy's matched rule and its roles
  local st = require("qtg.requests").approval_status(s, id)
  doc.approval_policy = { rule = st.rule or NULL, roles = arr(st.roles or {}),
                          still_needed = st.still_needed, error = st.error or NULL,
                          signed_approvals = st.signed }
  -- what an approver signs (docs/approvals.md "Signed approvals"); null
  -- when no approvers are enrolled
  doc.approval_statement = st.statement or NULL
  -- what the request's maker signs first, with 'initiation signed' (null
  -- otherwise), and whether it did
  doc.initiation_statement = st.initiation_statement or NULL
  doc.initiated = st.initiated
  return doc
end

-- The lifecycle function's argument after the reason or comment, from the
-- body: an approval's signature; a cancel's acknowledgement that its
-- UNKNOWN nodes were reconciled with the provider.
local LAST_ARGUMENT = {
  approve = function(body) return body.signature end,
  cancel = function(body) return body.reconciled == true end,
}

local function lifecycle(fn_name, target_kind, extra)
  return function(ctx)
    local requests = require "qtg.requests"
    local id = uuid_param(ctx, "id", target_kind)
    local body = ctx.body or {}
    if extra == "reason" and (type(body.reason) ~= "string" or not body.reason:match("%S")) then
      problem.raise("invalid_input", "a reason (non-empty string) is required")
    end
    local req = requests[fn_name](ctx.s, id, principal(ctx), extra == "reason" and body.reason or body.comment,
      LAST_ARGUMENT[fn_name] and LAST_ARGUMENT[fn_name](body))
    return 200, request_detail(ctx.s, req.id or req.request_id or id)
  end
end

local function initiate(ctx)
  local id = uuid_param(ctx, "id", "request")
  local req = require("qtg.requests").initiate(ctx.s, id, principal(ctx), (ctx.body or {}).signature)
  return 200, request_detail(ctx.s, req.id)
end

local function node_action(fn_name)
  return function(ctx)
    local requests = require "qtg.requests"
    local id = uuid_param(ctx, "id", "node")
    local req
    if fn_name == "complete_manual_step" then
      local input = (ctx.body or {}).input
      if input == nil then input = {} end
      req = requests.complete_manual_step(ctx.s, id, principal(ctx), input, (ctx.body or {}).signature)
    else
      req = requests.retry(ctx.s, id, principal(ctx))
    end
    return 200, request_detail(ctx.s, req.id)
  end
end

-- The callback_url's check resolves its name (up to seconds): outside the
-- database session (qtg.api's run_outside).
local function check_callback_url(ctx)
  local url = ctx.body.callback_url
  if url == nil then return end
  local ok, why = require("qtg.api.ssrf").check(url)
  if not ok then problem.raise("invalid_input", "bad callback_url: %s", why) end
end

local function create_request(ctx)
  local b = ctx.body
  local key = ctx.headers["idempotency-key"]
  local args = { template_key = b.template_key, intent = b.intent, input_params = b.input_params,
                 callback_url = b.callback_url,
                 -- a client's keys never collide with another client's or the console's
                 idempotency_key = ctx.principal.actor .. ":" .. key }
  local req, created = require("qtg.requests").create(ctx.s, args, principal(ctx))
  local doc = request_detail(ctx.s, req.id)
  return created and 201 or 200, doc, { Location = "/v3/requests/" .. req.id }
end

local REQUEST_STATES
local function check_state(s, st)
  if not REQUEST_STATES then
    REQUEST_STATES = {}
    for _, r in ipairs(s:query("SELECT state FROM request_states")) do REQUEST_STATES[r.state] = true end
  end
  if not REQUEST_STATES[st] then problem.raise("bad_request", "unknown request state %s", st) end
end

local function check_time(name, v)
  if v and not M.valid_time(v) then
    problem.raise("bad_request", "%s must be an RFC 3339 timestamp such as 2024-05-01T12:00:00Z", name)
  end
  return v
end

local function decimal_param(ctx, name)
  local v = ctx.query[name]
  if v ~= nil and (#v > 40 or not (v:match("^%d+$") or v:match("^%d+%.%d+$"))) then
    problem.raise("bad_request", "%s must be a non-negative decimal such as 1500 or 0.25", name)
  end
  return v
end

local function text_param(ctx, name, max)
  local v = ctx.query[name]
  if v ~= nil and (v == "" or #v > max) then
    problem.raise("bad_request", "%s must be 1 to %d characters", name, max)
  end
  return v
end

-- The filters of GET /v3/requests: the intent's asset, destination and
-- amount (compared as numbers; an amount that is not a plain decimal never
-- matches a range), and an error code on the request or any of its nodes.
local function list_requests(ctx)
  local q = ctx.query
  local limit = int_param(ctx, "limit", 50, 1, 200)
  local st = q.state and q.state:upper()
  if st then check_state(ctx.s, st) end
  local asset, destination = text_param(ctx, "asset", 64), text_param(ctx, "destination", 200)
  local error_code = text_param(ctx, "error_code", 100)
  local amount_min, amount_max = decimal_param(ctx, "amount_min"), decimal_param(ctx, "amount_max")
  local after_ts, after_id
  if q.cursor then after_ts, after_id = time_id_cursor(q.cursor) end
  local rows = ctx.s:query([[
    SELECT r.*, r.created_at::text AS cursor_ts,
           octet_length(r.intent::text) + octet_length(r.input_params::text) AS doc_bytes
      FROM movement_requests r
     WHERE network_class = $1
       AND ($2::text IS NULL OR request_state = $2)
       AND ($3::text IS NULL OR template_key = $3)
       AND ($4::timestamptz IS NULL OR created_at >= $4::timestamptz)
       AND ($5::timestamptz IS NULL OR created_at < $5::timestamptz)
       AND ($6::timestamptz IS NULL OR (created_at, id) < ($6::timestamptz, $7::uuid))
       AND ($9::text IS NULL OR intent->>'asset' = $9)
       AND ($10::text IS NULL OR lower(intent->>'destination') = lower($10))
       AND ($11::numeric IS NULL OR (CASE WHEN intent->>'amount' ~ '^[0-9]+(\.[0-9]+)?$'
                                          THEN (intent->>'amount')::numeric END) >= $11::numeric)
       AND ($12::numeric IS NULL OR (CASE WHEN intent->>'amount' ~ '^[0-9]+(\.[0-9]+)?$'
                                          THEN (intent->>'amount')::numeric END) <= $12::numeric)
       AND ($13::text IS NULL OR r.last_error_code = $13
            OR EXISTS (SELECT 1 FROM movement_request_nodes n WHERE n.request_id = r.id AND n.error_code = $13))
       AND ($14::text IS NULL OR r.created_by = $14)
     ORDER BY created_at DESC, id DESC
     LIMIT $8]], qtg.settings.network_class, st, q.template_key,
    check_time("created_after", q.created_after), check_time("created_before", q.created_before),
    after_ts, after_id, limit + 1, asset, destination, amount_min, amount_max, error_code,
    ownership.owner(ctx.principal) or NULL)
  local n = page_length(rows, limit, function(r) return r.doc_bytes end)
  local items = canon.array()
  for i = 1, n do items[i] = request_doc(ctx.s, rows[i]) end
  local next_cursor = NULL
  if #rows > n then next_cursor = encode_cursor(rows[n].cursor_ts, rows[n].id) end
  return 200, { items = items, next_cursor = next_cursor }
end

local function request_events(ctx)
  local id = uuid_param(ctx, "id", "request")
  require("qtg.requests").get(ctx.s, id) -- not_found for another class's request
  local limit = int_param(ctx, "limit", 100, 1, 200)
  local after = 0
  if ctx.query.cursor then after = id_cursor(ctx.query.cursor) end
  local rows = ctx.s:query([[
    SELECT id, actor, action, entity_type, entity_id, detail, created_at FROM (
      SELECT outbox_id AS id, actor, action, entity_type, entity_id, detail, created_at
        FROM audit_events WHERE request_id = $1::uuid AND outbox_id > $2
      UNION ALL
      SELECT id, actor, action, entity_type, entity_id, detail, created_at
        FROM audit_outbox WHERE request_id = $1::uuid AND id > $2
    ) e ORDER BY id LIMIT $3]], id, after, limit + 1)
  return 200, id_page(rows, limit)
end

-- ------------------------------------------------------------ other routes
-- fresh=true fetches one venue now, outside the database session (the
-- venue's API may take its timeout): it calls the venue with the
-- operator's credentials and appends rows, so it takes the operate role,
-- and one fetch starts every balances.FRESH_MIN_SECONDS at most (a call
-- within them answers the latest snapshot).
local function fetch_balances(ctx)
  if not bool_param(ctx, "fresh") then return end
  if not require("qtg.api.tokens").has_role(ctx.principal, "operate") then
    problem.raise("forbidden", "token %s lacks the operate role that fresh=true requires (it calls the venue "
      .. "and writes a snapshot)", ctx.principal.name)
  end
  local b = require "qtg.balances"
  local venue = ctx.query.venue_key
  if not venue then problem.raise("bad_request", "fresh=true needs venue_key") end
  if not b.fetcher_of(venue) then problem.raise("not_found", "no balance fetcher for venue %s", venue) end
  ctx.fetched = b.fetch_throttled(venue)
end

local function balances(ctx)
  local b = require "qtg.balances"
  if ctx.fetched then b.store(ctx.s, ctx.fetched, "fresh") end
  local rows = b.latest(ctx.s)
  for _, r in ipairs(rows) do
    if type(r.last_error) == "string" then r.last_error = redact.text(r.last_error) end
  end
  return 200, { items = arr(rows) }
end

local function signers(ctx)
  return 200, { items = arr(require("qtg.signers").roster(ctx.s)) }
end

local function set_expected_identity(ctx)
  local key = ctx.params.signer_key
  local signers_mod = require "qtg.signers"
  if not key:match("^[A-Za-z0-9_.-]+$") or #key > 64 then
    problem.raise("invalid_input", "signer key must be 1-64 of [A-Za-z0-9_.-]")
  end
  local ok, why = signers_mod.canonical_address(ctx.body.expected_signer_address)
  if not ok then problem.raise("invalid_input", "expected_signer_address: %s", tostring(why)) end
  local row = signers_mod.set_expected_identity(ctx.s, key, ctx.body.expected_signer_address, actor(ctx))
  return 200, row
end

-- redelivered_as: the newest row made by redelivering this one (a dlq row
-- is redelivered once while that copy is pending or delivered).
local CALLBACK_COLUMNS = [[o.id, o.request_id, o.event_type, o.status, o.attempts, o.last_status,
  o.last_error, o.created_at, o.updated_at,
  (SELECT max(r.id) FROM movement_callback_outbox r WHERE r.redelivery_of = o.id) AS redelivered_as]]

local function list_callbacks(ctx)
  local status = ctx.query.status or "dlq"
  if status ~= "dlq" and status ~= "pending" and status ~= "delivered" then
    problem.raise("bad_request", "status must be dlq, pending or delivered")
  end
  local limit = int_param(ctx, "limit", 50, 1, 200)
  local after = ctx.query.cursor and id_cursor(ctx.query.cursor) or nil
  local rows = ctx.s:query([[
    SELECT ]] .. CALLBACK_COLUMNS .. [[ FROM movement_callback_outbox o
      JOIN movement_requests q ON q.id = o.request_id
     WHERE o.status = $1 AND q.network_class = $2 AND ($3::bigint IS NULL OR o.id < $3)
       AND ($5::text IS NULL OR q.created_by = $5)
     ORDER BY o.id DESC LIMIT $4]], status, qtg.settings.network_class, after, limit + 1,
    ownership.owner(ctx.principal) or NULL)
  return 200, id_page(rows, limit)
end

local function own_callback(s, id)
  local row = s:query([[
    SELECT o.id, o.status FROM movement_callback_outbox o JOIN movement_requests q ON q.id = o.request_id
     WHERE o.id = $1 AND q.network_class = $2]], id, qtg.settings.network_class)[1]
  if not row then problem.raise("not_found", "callback %s does not exist", tostring(id)) end
  if row.status ~= "dlq" then
    problem.raise("illegal_transition", "callback %s is %s; only dlq rows are redelivered", tostring(id), row.status)
  end
end

local function redeliver(ctx)
  local id = ctx.params.id:match("^%d+$") and tonumber(ctx.params.id)
  if not id or id > 2 ^ 53 then problem.raise("not_found", "callback %s does not exist", ctx.params.id) end
  own_callback(ctx.s, id)
  local new = require("qtg.callbacks").redeliver(ctx.s, id, actor(ctx))
  return 201, { id = new.id, redelivery_of = id, status = new.status }
end

M.BULK_CAP = 1000

local function bulk_redeliver(ctx)
  local b = ctx.body
  local rows = ctx.s:query([[
    SELECT o.id FROM movement_callback_outbox o JOIN movement_requests q ON q.id = o.request_id
     WHERE o.status = 'dlq' AND q.network_class = $1
       AND ($2::text IS NULL OR o.event_type = $2)
       AND ($3::uuid IS NULL OR o.request_id = $3::uuid)
       AND NOT EXISTS (SELECT 1 FROM movement_callback_outbox r WHERE r.redelivery_of = o.id)
       AND ($5::text IS NULL OR q.created_by = $5)
     ORDER BY o.id LIMIT $4]], qtg.settings.network_class, b.event_type,
    b.request_id and (b.request_id:match(UUID) and b.request_id or problem.raise("invalid_input", "request_id must be a uuid")),
    M.BULK_CAP + 1, ownership.owner(ctx.principal) or NULL)
  local capped = #rows > M.BULK_CAP
  local n = math.min(#rows, M.BULK_CAP)
  if b.dry_run ~= false then
    return 200, { dry_run = true, count = n, capped = capped, cap = M.BULK_CAP }
  end
  local ids = canon.array()
  for i = 1, n do
    local new = require("qtg.callbacks").redeliver(ctx.s, rows[i].id, actor(ctx))
    ids[i] = new.id
  end
  return 200, { dry_run = false, count = n, capped = capped, cap = M.BULK_CAP, redelivered = ids }
end

local function workers(ctx)
  local items = canon.array()
  for i, w in ipairs(qtg.runtime.workers()) do
    items[i] = { name = w.name, group = w.group, state = w.state, ticks = w.ticks,
                 interval = w.interval, paused = w.paused and true or false,
                 errors_total = w.errors_total, consecutive_errors = w.consecutive_errors,
                 last_tick_at = w.last_tick_at or NULL, next_run_at = w.next_run_at or NULL,
                 last_error = w.last_error and redact.text(w.last_error) or NULL }
  end
  table.sort(items, function(a, b) return a.name < b.name end)
  return 200, { items = items }
end

-- Every process's worker liveness rows for this class; a row not updated
-- for qtg.heartbeats.STALE_AFTER seconds is stale (its process is gone or
-- stuck).
local function heartbeats(ctx)
  local hb = require "qtg.heartbeats"
  local rows = ctx.s:query([[
    SELECT worker_name, process_id, group_name, started_at, last_tick_at, last_count, consecutive_errors,
           updated_at, updated_at < now() - $2 * interval '1 second' AS stale
      FROM worker_heartbeats WHERE network_class = $1
     ORDER BY process_id, worker_name]], qtg.settings.network_class, hb.STALE_AFTER)
  return 200, { items = arr(rows), stale_after_seconds = hb.STALE_AFTER }
end

-- The token's own principal: what the web console shows and offers.
local function me(ctx)
  local p = ctx.principal
  return 200, { actor = p.actor, kind = p.kind, name = p.name, roles = arr(p.roles),
                network_class = qtg.settings.network_class, scope = p.own and "own" or "class" }
end

-- The approvals inbox: PENDING_APPROVAL requests of this class that the
-- token's principal may still approve (not its own, not decided yet, and it
-- holds one of the roles the matched policy rule asks for), oldest first,
-- each with the document an approval approves (qtg_approval_document) and
-- its digest.
local function approvals_inbox(ctx)
  local p = ctx.principal
  local limit = int_param(ctx, "limit", 50, 1, 200)
  local after_ts, after_id
  if ctx.query.cursor then after_ts, after_id = time_id_cursor(ctx.query.cursor) end
  -- the principal's roles as a text[] literal (role names are [a-z]+)
  local roles = "{" .. table.concat(p.roles, ",") .. "}"
  local rows = ctx.s:query([[
    SELECT r.id, r.template_key, r.created_by, r.created_at, r.created_at::text AS cursor_ts, r.expires_at,
           r.approvals_required, r.approval_policy->>'rule' AS rule,
           COALESCE(r.approval_policy->'roles', '[]'::jsonb) AS roles,
           (SELECT count(*)::int FROM request_approvals a WHERE a.request_id = r.id
               AND a.decision = 'approve' AND a.approval_digest = r.approval_digest) AS approvals,
           qtg_approval_document(r) AS approval_document, qtg_approval_digest(r) AS digest,
           r.approval_digest AS approved_digest, qtg_approval_statement(r, $7) AS approval_statement,
           qtg_approval_document(r)::text AS approval_document_text,
           qtg_approval_plan_document(r.plan_version_id)::text AS plan_document_text
      FROM movement_requests r
     WHERE r.network_class = $1 AND r.request_state = 'PENDING_APPROVAL'
       AND r.created_by <> $2
       AND NOT EXISTS (SELECT 1 FROM request_approvals a WHERE a.request_id = r.id AND a.principal = $2)
       AND (jsonb_typeof(r.approval_policy->'roles') IS DISTINCT FROM 'array'
            OR jsonb_array_length(r.approval_policy->'roles') = 0
            OR r.approval_policy->'roles' ?| $5::text[])
       AND ($3::timestamptz IS NULL OR (r.created_at, r.id) > ($3::timestamptz, $4::uuid))
       AND (NOT $8::bool OR r.initiation_signature IS NOT NULL)
     ORDER BY r.created_at, r.id LIMIT $6]], qtg.settings.network_class, p.actor, after_ts, after_id, roles,
    limit + 1, require("qtg.signed_approvals").deployment() or NULL,
    require("qtg.signed_approvals").initiation_required())
  -- each item carries its document twice (as JSON and as the text it hashes)
  local n = page_length(rows, limit, function(r) return 2 * #r.approval_document_text + #r.plan_document_text end)
  local items = canon.array()
  for i = 1, n do
    local row = rows[i]
    row.roles = arr(type(row.roles) == "table" and row.roles or {})
    -- what the approval lets the signer sign, as `qtgd approver sign` reads it
    row.signer_may_sign = qtg.approvers.describe(row.approval_document_text, row.plan_document_text) or NULL
    items[i] = row
  end
  local next_cursor = NULL
  if #rows > n then next_cursor = encode_cursor(rows[n].cursor_ts, rows[n].id) end
  for _, item in ipairs(items) do item.cursor_ts = nil end
  return 200, { items = items, next_cursor = next_cursor }
end

local function templates(ctx)
  local rows = ctx.s:query([[
    SELECT DISTINCT ON (t.template_key) t.template_key, pv.version, pv.compiled_plan_hash,
           pv.intent_schema, pv.created_at
      FROM movement_templates t JOIN plan_versions pv ON pv.template_id = t.id
     ORDER BY t.template_key, pv.version DESC]])
  return 200, { items = arr(rows) }
end

local function healthz() return 200, { status = "ok" } end

local function readyz(ctx) return require("qtg.api.health").readyz(ctx.s) end

local function metrics(ctx)
  return 200, require("qtg.api.metrics").render(ctx.s), { ["Content-Type"] = "text/plain; version=0.0.4; charset=utf-8" }
end

local function openapi() return 200, require("qtg.api.openapi").document() end

-- ------------------------------------------------------------------ table
local PAGE = { limit = { type = "integer", description = "at most 200" },
               cursor = { type = "string", description = "next_cursor of the previous page" } }
local function with_page(t)
  local out = { limit = PAGE.limit, cursor = PAGE.cursor }
  for k, v in pairs(t or {}) do out[k] = v end
  return out
end
local REASON = { fields = { reason = { type = "string", required = true } } }
local CANCEL = { fields = { reason = { type = "string", required = true }, reconciled = { type = "boolean" } } }
local COMMENT = { optional = true, fields = { comment = { type = "string" } } }
local APPROVAL = { optional = true, fields = { comment = { type = "string" },
                                               signature = { type = "string" } } }
local NONE = { optional = true, fields = {} }

M.LIST = {
  { method = "GET", path = "/healthz", name = "healthz", public = true, handler = healthz,
    summary = "the process is alive", response = "Health" },
  { method = "GET", path = "/readyz", name = "readyz", role = "read", handler = readyz,
    summary = "database reachable, migrations current, core workers running, signer reachable",
    response = "Ready" },
  { method = "GET", path = "/metrics", name = "metrics", role = "read", handler = metrics,
    summary = "Prometheus text format", response = "text" },
  { method = "GET", path = "/v3/openapi.json", name = "openapi", owned = "self", role = "read", handler = openapi,
    summary = "this API's OpenAPI 3.1 document", response = "any" },
  { method = "POST", path = "/v3/requests", name = "create_request", owned = "filtered", role = "operate", mutating = true,
    requires_idempotency_key = true, outside = check_callback_url, handler = create_request,
    body = { fields = { template_key = { type = "string", required = true },
                        intent = { type = "object", required = true },
                        input_params = { type = "object" }, callback_url = { type = "string" } } },
    summary = "create a movement request (Idempotency-Key required)", response = "RequestDetail" },
  { method = "GET", path = "/v3/requests", name = "list_requests", owned = "filtered", role = "read", handler = list_requests,
    query = with_page{ state = { type = "string" }, template_key = { type = "string" },
                       created_after = { type = "string" }, created_before = { type = "string" },
                       asset = { type = "string", description = "the intent's asset" },
                       destination = { type = "string", description = "the intent's destination (case-insensitive)" },
                       amount_min = { type = "string", description = "decimal; the intent's amount at least this" },
                       amount_max = { type = "string", description = "decimal; the intent's amount at most this" },
                       error_code = { type = "string", description = "the request's or any node's error code" } },
    summary = "requests, newest first, keyset-paginated", response = "RequestPage" },
  { method = "GET", path = "/v3/requests/{id}", name = "get_request", owned = "request", role = "read",
    handler = function(ctx) return 200, request_detail(ctx.s, uuid_param(ctx, "id", "request")) end,
    summary = "a request with its nodes, frontier, approvals and errors", response = "RequestDetail" },
  { method = "GET", path = "/v3/requests/{id}/events", name = "request_events", owned = "request", role = "read",
    handler = request_events, query = with_page(), summary = "the request's audit timeline",
    response = "EventPage" },
  { method = "POST", path = "/v3/requests/{id}/initiate", name = "initiate_request", owned = "request",
    role = "operate", mutating = true, body = { fields = { signature = { type = "string", required = true } } },
    handler = initiate,
    summary = "the maker's signature of its request's initiation statement (initiation signed)",
    response = "RequestDetail" },
  { method = "POST", path = "/v3/requests/{id}/approve", name = "approve_request", owned = "request", role = "approve",
    mutating = true, body = APPROVAL, handler = lifecycle("approve", "request"),
    summary = "approve a PENDING_APPROVAL request", response = "RequestDetail" },
  { method = "POST", path = "/v3/requests/{id}/reject", name = "reject_request", owned = "request", role = "approve",
    mutating = true, body = REASON, handler = lifecycle("reject", "request", "reason"),
    summary = "reject a PENDING_APPROVAL request (reason required)", response = "RequestDetail" },
  { method = "POST", path = "/v3/requests/{id}/cancel", name = "cancel_request", owned = "request", role = "operate",
    mutating = true, body = CANCEL, handler = lifecycle("cancel", "request", "reason"),
    summary = "cancel a request with no node in flight (reason required; reconciled = true for one with an "
      .. "UNKNOWN node, once the provider was asked)", response = "RequestDetail" },
  { method = "POST", path = "/v3/requests/{id}/resume", name = "resume_request", owned = "request", role = "operate",
    mutating = true, body = NONE, handler = lifecycle("resume", "request"),
    summary = "resume a MANUAL_INTERVENTION request, or a FAILED one with a node in flight", response = "RequestDetail" },
  { method = "POST", path = "/v3/nodes/{id}/retry", name = "retry_node", owned = "node", role = "operate",
    mutating = true, body = NONE, handler = node_action("retry"),
    summary = "retry a FAILED or UNKNOWN node", response = "RequestDetail" },
  { method = "POST", path = "/v3/nodes/{id}/complete", name = "complete_node", owned = "node", role = "operate",
    mutating = true, body = { optional = true, fields = { input = { type = "any" }, signature = { type = "string" } } },
    handler = node_action("complete_manual_step"),
    summary = "complete a READY manual step with its input (and, under signed approvals, the signature of "
      .. "its manual.attestation_statement)", response = "RequestDetail" },
  { method = "GET", path = "/v3/balances", name = "balances", role = "read", outside = fetch_balances,
    handler = balances, query = { fresh = { type = "boolean" }, venue_key = { type = "string" } },
    summary = "latest balance of each venue and asset; fresh=true (operate) fetches one venue now",
    response = "ItemList" },
  { method = "GET", path = "/v3/signers", name = "signers", role = "read", handler = signers,
    summary = "the signer roster with postures", response = "ItemList" },
  { method = "PUT", path = "/v3/signers/{signer_key}/expected-identity", name = "set_expected_identity",
    role = "admin", mutating = true, handler = set_expected_identity,
    body = { fields = { expected_signer_address = { type = "string", required = true } } },
    summary = "enroll the address a signer key must have", response = "Signer" },
  { method = "GET", path = "/v3/callbacks", name = "list_callbacks", owned = "filtered", role = "read", handler = list_callbacks,
    query = with_page{ status = { type = "string", description = "dlq (default), pending, delivered" } },
    summary = "callback rows by status", response = "CallbackPage" },
  { method = "POST", path = "/v3/callbacks/{id}/redeliver", name = "redeliver_callback", owned = "callback", role = "operate",
    mutating = true, body = NONE, handler = redeliver,
    summary = "deliver a dead-lettered callback again (a new row)", response = "Redelivery" },
  { method = "POST", path = "/v3/callbacks/redeliver", name = "bulk_redeliver", owned = "filtered", role = "operate",
    mutating = true, handler = bulk_redeliver,
    body = { optional = true, fields = { dry_run = { type = "boolean" }, event_type = { type = "string" },
                                         request_id = { type = "string" } } },
    summary = "redeliver every dlq row matching a filter (dry_run, the default, counts them)",
    response = "BulkRedelivery" },
  { method = "GET", path = "/v3/workers", name = "workers", role = "read", handler = workers,
    summary = "this process's workers", response = "ItemList" },
  { method = "GET", path = "/v3/heartbeats", name = "heartbeats", role = "read", handler = heartbeats,
    summary = "every process's worker heartbeats for this network class, stale ones flagged",
    response = "HeartbeatList" },
  { method = "GET", path = "/v3/me", name = "me", owned = "self", role = "any", handler = me,
    summary = "the token's principal: actor, name and roles", response = "Me" },
  { method = "GET", path = "/v3/approvals", name = "approvals_inbox", role = "approve", handler = approvals_inbox,
    query = with_page(),
    summary = "requests waiting for this token's approval, with the approval document and its digest",
    response = "ApprovalPage" },
  { method = "GET", path = "/v3/templates", name = "templates", owned = "self", role = "read", handler = templates,
    summary = "the latest plan version of each template", response = "ItemList" },
}

-- ---------------------------------------------------------------- matching
local compiled = {}
for _, r in ipairs(M.LIST) do
  local segs = {}
  for seg in r.path:gmatch("[^/]+") do
    segs[#segs + 1] = seg:match("^{([%w_]+)}$") and { param = seg:match("^{([%w_]+)}$") } or seg
  end
  compiled[#compiled + 1] = { route = r, segs = segs }
end

-- match(method, path) -> route, params | nil, nil, allow ("GET, POST") when
-- the path exists under other methods.  path is the request's path as sent,
-- not decoded: one spelling per route.  A path with an empty segment
-- (//v3///me, a trailing /) or a percent-encoding (/v3/%6de: no route
-- needs one, and decoding would give a route two spellings) matches none.
function M.match(method, path)
  if type(path) ~= "string" or path:sub(1, 1) ~= "/" or #path > 2048 then return nil end
  if path:find("//", 1, true) or path:find("%", 1, true) then return nil end
  local segs = {}
  for seg in path:gmatch("[^/]+") do segs[#segs + 1] = seg end
  if path ~= "/" and path:sub(-1) == "/" then return nil end
  local allow = {}
  for _, c in ipairs(compiled) do
    if #c.segs == #segs then
      local params, ok = {}, true
      for i, want in ipairs(c.segs) do
        if type(want) == "table" then params[want.param] = segs[i]
        elseif want ~= segs[i] then ok = false break end
      end
      if ok then
        if c.route.method == method then return c.route, params end
        allow[#allow + 1] = c.route.method
      end
    end
  end
  if #allow > 0 then return nil, nil, table.concat(allow, ", ") end
  return nil
end

return M
