-- qtg.requests: the lifecycle of a movement request, as the console (and
-- later an API) calls it.  Every function takes (s, target, actor, extra):
--   create(s, args, actor)                     -> request, created
--   approve(s, request_id, actor)              -> request
--   reject(s, request_id, actor, reason)       -> request
--   cancel(s, request_id, actor, reason)       -> request
--   resume(s, request_id, actor)               -> request
--   retry(s, node_id, actor)                   -> request, node
--   complete_manual_step(s, node_id, actor, input) -> request, node
--   get(s, request_id)                         -> request, nodes
--
-- Transactions: a function joins the caller's transaction when one is open
-- (s:in_transaction()) and leaves the commit to the caller; otherwise it runs
-- in its own transaction, committed on success and rolled back on error.
-- Either way the state change, its callback-outbox row and its audit-outbox
-- row commit together or not at all.
--
-- Refusals raise qtg.error(kind, message) (qtg.errors), kind one of
-- "illegal_transition", "not_found", "invalid_intent", "invalid_input",
-- "forbidden".
--
-- `actor` is a principal table (qtg.principals: the console and the API
-- build one) or, for in-process callers, an actor string.  A principal
-- needs the operate role to create, cancel, resume, retry and complete a
-- manual step, and the approve role (plus one the matched approval rule
-- names) to approve or reject.  The initiator never approves its own
-- request; a request is APPROVED once the approval policy's quorum of
-- distinct principals approved the same approval digest (docs/approvals.md).
--
-- A process serves one network class (MG_NETWORK_CLASS): requests are
-- created in it, and a request of another class is "not_found" here.
local canon = require "qtg.canon_json"
local state = require "qtg.state"
local nodes_db = require "qtg.nodes"
local outbox = require "qtg.outbox"
local templates = require "qtg.templates"
local executors = require "qtg.executors"
local context = require "qtg.context"
local principals = require "qtg.principals"
local approvals = require "qtg.approvals"
local signed = require "qtg.signed_approvals"
local risk = require "qtg.risk_controls"
local errors = require "qtg.errors"

local M = {}

-- A key of the console's own or the API's "api:<token name>:<key>"
-- (sql/0193).
M.MAX_IDEMPOTENCY_KEY = 256
-- An intent, and input_params, at most this many bytes as canonical JSON.
M.MAX_DOCUMENT_BYTES = 65536

local NULL = require("cjson").null

local refuse = errors.raise
M.refuse = refuse

local function settings()
  return require("qtg").settings
end

-- Run fn in the caller's transaction, or in one of its own.
local function in_tx(s, fn)
  if s:in_transaction() then return fn() end
  return s:transaction(fn)
end
M.in_tx = in_tx

local UUID = "^%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x$"

local function check_uuid(id, what)
  if type(id) ~= "string" or not id:lower():match(UUID) then
    refuse("not_found", "%s %s: not a request id (uuid)", what, tostring(id))
  end
end

local function check_actor(actor)
  if type(actor) == "table" then principals.of(actor) return end
  if type(actor) ~= "string" or not actor:match("^[a-z]+:[%w%._%-@]+$") then
    refuse("invalid_input", "actor must look like console:<uid> or system:<worker>, got %s",
      tostring(actor))
  end
end

-- acting(who, role, action) -> principal, its actor string: refused unless
-- the principal holds `role`.
local function acting(who, role, action)
  local p = principals.of(who)
  principals.require_role(p, role, action)
  return p, p.actor
end

-- The request of this process's network class (locked with `lock`), or
-- not_found: another class's request is not this process's to touch, nor to
-- show.  The operator is told whose it is; a client outside (the API's
-- public_message) is told only that it does not exist here.
local function own_request(s, id, lock)
  check_uuid(id, "request")
  local req = nodes_db.load_request(s, id, lock)
  if not req then refuse("not_found", "request %s does not exist", id) end
  local class = settings().network_class
  if req.network_class ~= class then
    errors.raise_with("not_found", { public_message = ("request %s does not exist"):format(id) },
      "request %s belongs to network class %s; this process serves %s", id, req.network_class, class)
  end
  return req
end

local function lock_request(s, id)
  return own_request(s, id, true)
end

-- Lock a node's request (first) and then the node.  Another class's node
-- is not_found as a node: a client outside is not told its request's id.
local function lock_node(s, node_id)
  check_uuid(node_id, "node")
  local row = s:query([[SELECT n.request_id, r.network_class FROM movement_request_nodes n
                          JOIN movement_requests r ON r.id = n.request_id WHERE n.id = $1::uuid]], node_id)[1]
  if not row then refuse("not_found", "node %s does not exist", node_id) end
  local class = settings().network_class
  if row.network_class ~= class then
    errors.raise_with("not_found", { public_message = ("node %s does not exist"):format(node_id) },
      "node %s belongs to request %s of network class %s; this process serves %s", node_id, row.request_id,
      row.network_class, class)
  end
  local req = lock_request(s, row.request_id)
  local node = s:query("SELECT * FROM movement_request_nodes WHERE id = $1::uuid FOR UPDATE", node_id)[1]
  return req, node
end

local function expect_state(req, allowed, action)
  for _, st in ipairs(allowed) do if req.request_state == st then return end end
  refuse("illegal_transition", "cannot %s request %s: it is %s (allowed from %s)", action,
    req.id, req.request_state, table.concat(allowed, ", "))
end

-- --------------------------------------------------------- approval policy
-- evaluate_policy(s, req) -> decision | nil, error: a rule that raises (or
-- a policy that never loaded) leaves the request waiting with the error
-- recorded, never approved by accident.
local function evaluate_policy(s, req)
  local ok, decision = pcall(approvals.evaluate, s, req)
  if ok then return decision end
  return nil, tostring(decision)
end

-- What approval_policy stores: the matched rule and its inputs, or the error.
local function policy_record(decision, policy_error, initiator)
  local rec = { evaluated_at = os.date("!%Y-%m-%dT%H:%M:%SZ"), initiator_roles = initiator.roles }
  if decision then
    rec.rule, rec.action, rec.approvals = decision.rule, decision.action, decision.approvals
    rec.roles, rec.reason, rec.inputs = decision.roles, decision.reason, decision.inputs
  else
    rec.error = policy_error
  end
  return rec
end

local function votes(s, id)
  return s:query([[SELECT principal, decision, comment, approval_digest, signature, created_at
                     FROM request_approvals WHERE request_id = $1::uuid ORDER BY id]], id)
end

local function holds_one(p, roles)
  for _, r in ipairs(roles) do if principals.has_role(p, r) then return true end end
  return false
end

-- counts(p, roles): whether principal p's vote counts toward a quorum of a
-- rule naming `roles`: it holds approve and one of them.
local function counts(p, roles)
  return principals.has_role(p, "approve") and (roles == nil or holds_one(p, roles))
end

-- counted(s, req, digest, roles[, lock]) -> the approve votes that count toward
-- the quorum, checked when it is counted, not only when each was cast:
-- votes for `digest`, by voters who still exist and are active
-- (principals.current: an operator row, a live API token) and hold approve
-- and one of the current rule's roles, one per principal as it resolves
-- now; the initiator's never counts.  lock: the voters' rows FOR SHARE, as
-- a vote's transaction counts them (principals.current).
local function counted(s, req, digest, roles, lock)
  local approving = {}
  for _, v in ipairs(votes(s, req.id)) do
    if v.decision == "approve" and v.approval_digest == digest then approving[#approving + 1] = v end
  end
  return signed.count(s, req, principals.current_votes(s, req.created_by, approving,
    function(p) return counts(p, roles) end, lock))
end

-- grant(s, req, actor, approved, decision): PENDING_APPROVAL -> APPROVED,
-- the frontier READY.  The audit detail says what was approved: the digest,
-- the intent and amount, the rule and every approval.
local function grant(s, req, actor, approved, decision)
  local digest = s:query("SELECT qtg_approval_digest(r) AS d FROM movement_requests r WHERE id = $1::uuid",
    req.id)[1].d
  if req.approval_digest == nil or req.approval_digest == NULL then
    s:query("UPDATE movement_requests SET approval_digest = $2 WHERE id = $1::uuid", req.id, digest)
    req.approval_digest = digest
  end
  local list, voters = {}, {}
  for _, v in ipairs(approved) do
    list[#list + 1] = { principal = v.principal, comment = v.comment, at = v.created_at }
    voters[#voters + 1] = { principal = v.principal, at = v.created_at }
  end
  local g = nodes_db.load_all(s, req)
  -- the callback names every counted approval (not its comment, which is
  -- the approvers' own note), so a client system sees who approved
  nodes_db.write_request(s, req, { request_state = "APPROVED", approved_by = actor, approved_now = true },
    { event = "request_approved", data = { from_state = "PENDING_APPROVAL", approved_by = actor,
                                           approvals_required = req.approvals_required,
                                           approvals = canon.array(voters) } },
    { actor = actor, action = "request.approve", detail = {
        from_state = "PENDING_APPROVAL", approval_digest = digest, intent = req.intent,
        amount = type(req.intent) == "table" and req.intent.amount or nil,
        approval_rule = decision and decision.rule, approvals_required = req.approvals_required,
        approvals = canon.array(list) } })
  for _, key in ipairs(req.current_frontier) do
    local node = g.by_key[key]
    if node and node.node_state == "BLOCKED" then
      nodes_db.set_node_state(s, g, node, { node_state = "READY" }, actor)
    end
  end
  nodes_db.apply_request_state(s, g, actor)
  return req
end

-- ----------------------------------------------------------------- create
local function check_create_args(args)
  if type(args) ~= "table" then refuse("invalid_input", "create needs a table of arguments") end
  if type(args.template_key) ~= "string" or args.template_key == "" then
    refuse("invalid_input", "template_key is required")
  end
  -- a key no template can have is refused as such, not echoed back in a
  -- "not loaded" (a client's megabyte stored with its idempotency key)
  if not templates.is_key(args.template_key) then
    refuse("invalid_input", "template_key must be a template's key ([a-z][a-z0-9_]*, at most 63 characters)")
  end
  if type(args.idempotency_key) ~= "string" or args.idempotency_key == ""
      or #args.idempotency_key > M.MAX_IDEMPOTENCY_KEY then
    refuse("invalid_input", "idempotency_key is required (1 to %d characters)", M.MAX_IDEMPOTENCY_KEY)
  end
  -- text PostgreSQL cannot hold is refused here, not by a failing write
  if not canon.text_ok(args.idempotency_key) then
    refuse("invalid_input", "idempotency_key holds a NUL byte or is not valid UTF-8")
  end
  if type(args.intent) ~= "table" then refuse("invalid_intent", "intent is required (a JSON object)") end
  -- what every reader of a request (approvers, the API's listings, the
  -- workers) loads and encodes again, bounded at the door
  for _, f in ipairs({ "intent", "input_params" }) do
    local ok, text = pcall(canon.encode, args[f])
    if ok and type(text) == "string" and #text > M.MAX_DOCUMENT_BYTES then
      refuse(f == "intent" and "invalid_intent" or "invalid_input", "%s is %d bytes as JSON, more than %d",
        f, #text, M.MAX_DOCUMENT_BYTES)
    end
  end
  -- Every rule about money (the approval policy's amounts and velocity,
  -- risk_controls, the signer's tiers) reads intent.amount as a decimal
  -- string; a JSON number can lose digits and no such rule could read it.
  local amount = args.intent.amount
  if amount ~= nil and not risk.is_decimal(amount) then
    refuse("invalid_intent", "intent.amount must be a decimal string such as \"1.5\" (digits, at most one point), got %s",
      type(amount) == "string" and string.format("%q", amount:sub(1, 64)) or (amount == NULL and "null" or "a JSON " .. type(amount)))
  end
  if args.input_params ~= nil and type(args.input_params) ~= "table" then
    refuse("invalid_input", "input_params must be a JSON object")
  end
  if args.input_params ~= nil then
    local ok, why = canon.storable(args.input_params, "input_params")
    if not ok then refuse("invalid_input", "input_params cannot be stored: %s", why) end
  end
  if type(args.callback_url) == "string" and not canon.text_ok(args.callback_url) then
    refuse("invalid_input", "bad callback_url: it holds a NUL byte or is not valid UTF-8")
  end
  if args.callback_url ~= nil and args.callback_url ~= NULL then
    -- the callback dispatcher's own rule for a URL it may POST to
    local ok, why = require("qtg.callbacks").check_url(args.callback_url)
    if not ok then refuse("invalid_input", "bad callback_url: %s", why) end
  end
  if args.network_class ~= nil and args.network_class ~= settings().network_class then
    refuse("invalid_input", "network_class %s: this process serves %s (MG_NETWORK_CLASS)",
      tostring(args.network_class), settings().network_class)
  end
end

local function find_existing(s, network_class, key)
  return s:query("SELECT * FROM movement_requests WHERE network_class = $1 AND idempotency_key = $2",
    network_class, key)[1]
end

local function callback_url_of(args)
  return type(args.callback_url) == "string" and require("qtg.callbacks").normalize_url(args.callback_url) or nil
end

-- The request a repeated idempotency key names, when the repeat asks for
-- the same thing: the template, the intent, the input_params, the callback
-- URL and the maker.  Anything else is idempotency_mismatch, naming no
-- request: a key never answers a different request with the first one,
-- nor hands one maker's request to another.
local function same_as_existing(s, existing, args, actor)
  if not existing then refuse("conflict", "idempotency_key %s changed hands; retry", args.idempotency_key) end
  local same = s:query([[
    SELECT template_key = $2 AND intent = $3::jsonb AND input_params = $4::jsonb
           AND callback_url IS NOT DISTINCT FROM $5 AND created_by = $6 AS same
      FROM movement_requests WHERE id = $1]], existing.id, args.template_key, canon.encode(args.intent),
    canon.encode(args.input_params or {}), callback_url_of(args), actor)[1]
  if not (same and same.same == true) then
    refuse("idempotency_mismatch", "idempotency_key %s was already used for a different request "
      .. "(template, intent, input_params, callback_url or maker); use a new key", args.idempotency_key)
  end
  return existing, false
end

-- create(s, {template_key=, intent=, idempotency_key=, input_params=,
--            callback_url=}, actor) -> request, created
-- The latest plan version of the template is used.  A repeated
-- (network_class, idempotency_key) returns the first request, created=false.
function M.create(s, args, who)
  local initiator, actor = acting(who, "operate", "create requests")
  check_create_args(args)
  signed.check_maker(actor)
  local network_class = settings().network_class
  return in_tx(s, function()
    local existing = find_existing(s, network_class, args.idempotency_key)
    if existing then return same_as_existing(s, existing, args, actor) end
    local pv = s:query([[
      SELECT pv.*, t.template_key FROM plan_versions pv
        JOIN movement_templates t ON t.id = pv.template_id
       WHERE t.template_key = $1 ORDER BY pv.version DESC LIMIT 1]], args.template_key)[1]
    if not pv then refuse("not_found", "template %s is not loaded", args.template_key) end
    local ok, why = templates.validate_intent(pv.intent_schema, args.intent)
    if not ok then refuse("invalid_intent", "template %s: %s", args.template_key, why) end
    local rc_ok, rc_why = risk.check(pv.risk_controls, args.intent, s, pv.id)
    if not rc_ok then refuse("invalid_intent", "template %s: %s", args.template_key, rc_why) end
    local target = approvals.target(s, { intent = args.intent, plan_version_id = pv.id })
    -- the velocity windows of this asset serialised, as at approval: a
    -- request the policy allows here is approved by this transaction
    approvals.lock_velocity(s, { network_class = network_class, intent = args.intent })
    local decision, policy_error = evaluate_policy(s, {
      template_key = args.template_key, network_class = network_class, intent = args.intent,
      plan_version_id = pv.id, target = target, initiator = initiator })
    if decision and decision.action == "block" then
      refuse("invalid_intent", "approval policy rule %s blocks this request: %s", decision.rule,
        tostring(decision.reason))
    end
    local keys = {}
    for _, r in ipairs(s:query("SELECT node_key FROM plan_nodes WHERE plan_version_id = $1", pv.id)) do
      keys[#keys + 1] = r.node_key
    end
    local frontier = state.roots(keys, nodes_db.load_graph(s, pv.id))
    -- signed approvals: at least the enrolment's quorum, whatever the policy allows
    local required = decision and decision.approvals or 1
    required = math.max(required, (signed.floor(s, { id = "(new)", network_class = network_class,
                                                     intent_json = canon.encode(args.intent),
                                                     plan_version_id = pv.id })))
    -- created_at and expires_at from one clock reading: the approval
    -- window is exactly MG_APPROVAL_TTL_SECONDS long
    local req = s:query([[
      INSERT INTO movement_requests (network_class, template_key, plan_version_id,
        compiled_plan_hash, request_state, intent, input_params, current_frontier,
        idempotency_key, callback_url, created_at, expires_at, created_by, approvals_required,
        approval_policy)
      SELECT $1, $2, $3, $4, 'PENDING_APPROVAL', $5::jsonb, $6::jsonb, $7::jsonb, $8, $9,
             t.at, t.at + $10::int * interval '1 second', $11, $12, $13::jsonb
        FROM (SELECT clock_timestamp() AS at) t
      ON CONFLICT (network_class, idempotency_key) DO NOTHING
      RETURNING *]], network_class, args.template_key, pv.id, pv.compiled_plan_hash,
      canon.encode(args.intent), canon.encode(args.input_params or {}),
      canon.encode(canon.array(frontier)), args.idempotency_key,
      callback_url_of(args), settings().approval_ttl_seconds, actor, required,
      canon.encode(policy_record(decision, policy_error, initiator)))[1]
    if not req then
      -- a concurrent create with the same key won the race
      return same_as_existing(s, find_existing(s, network_class, args.idempotency_key), args, actor)
    end
    s:query([[
      INSERT INTO movement_request_nodes (request_id, plan_node_id, node_key, node_kind,
                                          action_type, executor, node_state)
      SELECT $1::uuid, id, node_key, node_kind, action_type, executor, 'BLOCKED'
        FROM plan_nodes WHERE plan_version_id = $2]], req.id, pv.id)
    outbox.enqueue_callback(s, req, "request_created", {
      template_key = args.template_key, template_version = pv.version,
      expires_at = req.expires_at,
    }, { actor = actor, action = "request.create", entity_type = "movement_request", entity_id = req.id,
         request_id = req.id, detail = {
      template_key = args.template_key, template_version = pv.version,
      idempotency_key = args.idempotency_key, network_class = network_class,
      approval_rule = decision and decision.rule, approvals_required = req.approvals_required,
      approval_policy_error = policy_error,
      -- what was asked for: the trail shows it without the request row
      intent = args.intent, callback_url = req.callback_url,
    } })
    if decision and decision.action == "allow" and required == 0 then
      -- approved by the policy itself
      local locked = lock_request(s, req.id)
      grant(s, locked, "policy:" .. decision.rule, {}, decision)
    end
    return nodes_db.load_request(s, req.id), true
  end)
end

-- ---------------------------------------------------------------- approve
-- approve(s, id, who[, comment]) -> request: one principal's approval.  The
-- policy is evaluated again (its rule may now ask for more approvals, or
-- block: then the vote is refused and the request keeps waiting, the
-- refusal recorded); the request becomes APPROVED when the quorum of
-- distinct principals who approved this digest is met.
local function approve(s, id, p, comment, signature)
  local actor = p.actor
  local req = lock_request(s, id)
  expect_state(req, { "PENDING_APPROVAL" }, "approve")
  local expired = s:query("SELECT expires_at IS NOT NULL AND expires_at <= now() AS x FROM movement_requests WHERE id = $1::uuid", id)[1].x
  if expired then
    refuse("illegal_transition", "cannot approve request %s: its approval window closed at %s",
      id, tostring(req.expires_at))
  end
  if actor == req.created_by then
    refuse("forbidden", "%s created request %s and cannot approve it (four eyes)", actor, id)
  end
  if s:query("SELECT 1 FROM request_approvals WHERE request_id = $1::uuid AND principal = $2",
      id, actor)[1] then
    refuse("illegal_transition", "%s already decided on request %s", actor, id)
  end
  if not signed.initiated(s, req) then
    refuse("illegal_transition", "request %s is not initiated yet: its maker %s signs its initiation "
      .. "statement first (initiation signed)", id, tostring(req.created_by))
  end
  local digest = s:query([[
    SELECT qtg_approval_digest(r) AS d FROM movement_requests r WHERE id = $1::uuid]], id)[1].d
  if req.approval_digest ~= nil and req.approval_digest ~= NULL and req.approval_digest ~= digest then
    refuse("illegal_transition", "cannot approve request %s: it changed since its first approval",
      id)
  end
  local rc = s:query("SELECT risk_controls FROM plan_versions WHERE id = $1", req.plan_version_id)[1]
  local rc_ok, rc_why = risk.check(rc and rc.risk_controls, req.intent, s, req.plan_version_id)
  if not rc_ok then refuse("invalid_intent", "request %s: %s", id, rc_why) end
  local target = approvals.target(s, req)
  -- the policy again, with the velocity windows of this asset serialised
  approvals.lock_velocity(s, req)
  local stored = type(req.approval_policy) == "table" and req.approval_policy or {}
  local initiator = { actor = req.created_by,
                      roles = type(stored.initiator_roles) == "table" and stored.initiator_roles or {} }
  local decision, policy_error = evaluate_policy(s, { id = req.id, template_key = req.template_key,
    network_class = req.network_class, intent = req.intent, plan_version_id = req.plan_version_id,
    target = target, initiator = initiator })
  local refusal
  if not decision then
    refusal = errors.new("illegal_transition", string.format(
      "cannot approve request %s now: the approval policy failed: %s", id, policy_error))
  elseif decision.action == "block" then
    refusal = errors.new("invalid_intent", string.format(
      "cannot approve request %s now: approval policy rule %s blocks it: %s", id, decision.rule,
      tostring(decision.reason)))
  end
  if refusal then
    -- recorded and committed; the request keeps waiting
    s:query("UPDATE movement_requests SET approval_policy = $2::jsonb WHERE id = $1::uuid", id,
      canon.encode(policy_record(decision, policy_error, initiator)))
    outbox.audit(s, actor, "request.approval_refused", "movement_request", id, id,
      { reason = refusal.message, rule = decision and decision.rule })
    return req, refusal
  end
  local roles = decision.roles
  if roles and not holds_one(p, roles) then
    refuse("forbidden", "%s may not approve request %s: rule %s needs one of the roles %s", actor, id,
      decision.rule, table.concat(roles, ", "))
  end
  -- the voter as it is now, as its vote will be counted
  local now = principals.current(s, actor, true)
  if not now or not counts(now, roles) then
    refuse("forbidden", "%s may not approve request %s: it is %s", actor, id,
      now and "without the approve role or one of the rule's roles now" or "no enrolled operator or live API token")
  end
  signed.check_vote(s, req, actor, signature)
  local required = math.max(tonumber(req.approvals_required) or 1, decision.approvals, (signed.floor(s, req)))
  s:query([[
    INSERT INTO request_approvals (request_id, principal, decision, comment, approval_digest, signature)
    VALUES ($1::uuid, $2, 'approve', $3, $4, $5)]], id, actor, type(comment) == "string" and comment or nil,
    digest, signature)
  s:query([[UPDATE movement_requests SET approval_digest = $2, approvals_required = $3,
                   approval_policy = $4::jsonb WHERE id = $1::uuid]],
    id, digest, required, canon.encode(policy_record(decision, nil, initiator)))
  req.approval_digest, req.approvals_required = digest, required
  local approved = counted(s, req, digest, roles, true)
  if #approved < required then
    outbox.audit(s, actor, "request.approval", "movement_request", id, id, {
      approval_digest = digest, intent = req.intent, amount = req.intent.amount,
      approval_rule = decision.rule, approvals = #approved, approvals_required = required,
      comment = comment })
    return req
  end
  return grant(s, req, actor, approved, decision)
end

function M.approve(s, id, who, comment, signature)
  local p = acting(who, "approve", "approve requests")
  signed.check_signature(signature)
  local req, refusal = in_tx(s, function()
    local r, why = approve(s, id, p, comment, signature)
    return r, why
  end)
  if refusal then error(refusal, 0) end
  return req
end

-- initiate(s, id, who, signature): the maker's signature of its request's
-- initiation statement (MG_SIGNER_APPROVERS with 'initiation signed';
-- qtg.signed_approvals), stored once; approvals are taken after it.
function M.initiate(s, id, who, signature)
  local p = acting(who, "operate", "initiate requests")
  signed.check_signature(signature)
  return in_tx(s, function()
    local req = lock_request(s, id)
    expect_state(req, { "PENDING_APPROVAL" }, "initiate")
    if signed.initiation_required() and signed.initiated(s, req) then
      refuse("illegal_transition", "request %s is initiated already", id)
    end
    signed.check_initiation(s, req, p.actor, signature)
    s:query("UPDATE movement_requests SET initiation_signature = $2 WHERE id = $1::uuid", id, signature)
    outbox.audit(s, p.actor, "request.initiate", "movement_request", id, id, { signature = signature })
    req.initiation_signature = signature
    return req
  end)
end

-- status(s, id) -> {approvals_required=, approved_by={...}, rejected_by=,
-- still_needed=, rule=, roles=, error=}: who approved, who is still needed
-- and why (req() in the console, the API).
function M.approval_status(s, id)
  local req = own_request(s, id, false)
  local pol = type(req.approval_policy) == "table" and req.approval_policy or {}
  local initiation = signed.initiation_statement(s, req.id)
  local out = { approvals_required = req.approvals_required, approved_by = {}, rejected_by = {},
                rule = pol.rule, roles = pol.roles, error = pol.error, digest = req.approval_digest,
                statement = signed.statement(s, req.id), signed = signed.enrolment() ~= nil,
                initiation_statement = initiation, initiated = signed.initiated(s, req, initiation) }
  local valid = {}
  for _, v in ipairs(counted(s, req, req.approval_digest, type(pol.roles) == "table" and pol.roles or nil)) do
    valid[v.principal] = true
  end
  local n = 0
  for _, v in ipairs(votes(s, id)) do
    local list = v.decision == "approve" and out.approved_by or out.rejected_by
    list[#list + 1] = { principal = v.principal, comment = v.comment, at = v.created_at,
                        current = v.approval_digest == req.approval_digest,
                        counts = v.decision == "approve" and valid[v.principal] == true }
    if v.decision == "approve" and valid[v.principal] then n = n + 1 end
  end
  out.still_needed = req.request_state == "PENDING_APPROVAL"
    and math.max(0, req.approvals_required - n) or 0
  return out
end

-- Cancel every node that has not started (BLOCKED/READY).
local function cancel_pending_nodes(s, g, actor)
  for _, n in ipairs(g.nodes) do
    if n.node_state == "BLOCKED" or n.node_state == "READY" then
      nodes_db.set_node_state(s, g, n, { node_state = "CANCELLED" }, actor)
    end
  end
end

-- ----------------------------------------------------------------- reject
function M.reject(s, id, who, reason)
  local p, actor = acting(who, "approve", "reject requests")
  return in_tx(s, function()
    local req = lock_request(s, id)
    expect_state(req, { "PENDING_APPROVAL" }, "reject")
    if s:query("SELECT 1 FROM request_approvals WHERE request_id = $1::uuid AND principal = $2",
        id, p.actor)[1] then
      refuse("illegal_transition", "%s already decided on request %s", p.actor, id)
    end
    -- a rejection takes one of the roles an approval takes: those of the
    -- rule the request was last judged by
    local stored = type(req.approval_policy) == "table" and req.approval_policy or {}
    if type(stored.roles) == "table" and not holds_one(p, stored.roles) then
      refuse("forbidden", "%s may not reject request %s: rule %s needs one of the roles %s", p.actor, id,
        tostring(stored.rule), table.concat(stored.roles, ", "))
    end
    s:query([[INSERT INTO request_approvals (request_id, principal, decision, comment, approval_digest)
              SELECT $1::uuid, $2, 'reject', $3, qtg_approval_digest(r) FROM movement_requests r
               WHERE r.id = $1::uuid]], id, p.actor, type(reason) == "string" and reason or nil)
    local g = nodes_db.load_all(s, req)
    cancel_pending_nodes(s, g, actor)
    nodes_db.set_request_state(s, req, "REJECTED", actor, {
      event = "request_rejected", action = "request.reject",
      data = { reason = reason }, fields = { current_frontier = canon.array() },
    })
    return req
  end)
end

-- ----------------------------------------------------------------- cancel
-- Allowed while no node is in flight (SUBMITTING/SUBMITTED/OBSERVING): a
-- submitted movement cannot be called back by cancelling its request.  An
-- UNKNOWN node's request may have reached the provider and nothing recovers
-- it once its request is CANCELLED: such a cancel needs `reconciled` (the
-- canceller found out from the provider what the node did), recorded with
-- the reason and the UNKNOWN nodes.  So does a READY node whose executor's
-- records hold a submit under the key its next attempt carries
-- (qtg.executors.sent_before), or cannot tell: a dispatch whose
-- transaction was lost after the provider acted leaves its node READY, and
-- only its replay (same key) would record what the provider did.
local function sent_before(req, node)
  local adapter = executors.get(node.executor)
  if not adapter then return false end
  local octx = context.observe_context(req, node)
  octx.idempotency_key = context.key_of(node, node.attempt_no + 1)
  local sent, why = executors.sent_before(adapter, octx)
  return sent, why, octx.idempotency_key
end

local function check_ready_cancel(req, node, reconciled)
  local sent, why, key = sent_before(req, node)
  if sent == false then return false end
  if reconciled ~= true then
    refuse("illegal_transition", "cannot cancel request %s: node %s is READY and %s under the key its next "
      .. "attempt carries (%s): a dispatch lost after the provider acted leaves its node READY; resume or wait "
      .. "for the dispatcher to send it again under that key (the provider answers what it did), or find out "
      .. "from the provider what it did and cancel with reconciled = true", req.id, node.node_key,
      sent and "its executor's records hold a submit" or ("nobody can tell whether a submit went out (" .. why .. ")"),
      key)
  end
  return true
end

function M.cancel(s, id, actor, reason, reconciled)
  check_actor(actor)
  return in_tx(s, function()
    local req = lock_request(s, id)
    if not state.request_can(req.request_state, "CANCELLED") then
      refuse("illegal_transition", "cannot cancel request %s: it is %s", id, req.request_state)
    end
    local g = nodes_db.load_all(s, req)
    local unknown = canon.array()
    for _, n in ipairs(g.nodes) do
      if state.IN_FLIGHT[n.node_state] then
        refuse("illegal_transition",
          "cannot cancel request %s: node %s is %s (in flight); wait for it or resolve it first",
          id, n.node_key, n.node_state)
      end
      if n.node_state == "READY" and check_ready_cancel(req, n, reconciled) then
        unknown[#unknown + 1] = n.node_key
      elseif n.node_state == "UNKNOWN" then
        if reconciled ~= true then
          refuse("illegal_transition",
            "cannot cancel request %s: node %s is UNKNOWN (its submit may have reached the provider, and nothing "
              .. "recovers it once the request is cancelled); resume the request to let recovery settle it, or "
              .. "find out from the provider what it did and cancel with reconciled = true", id, n.node_key)
        end
        unknown[#unknown + 1] = n.node_key
      end
    end
    cancel_pending_nodes(s, g, actor)
    nodes_db.set_request_state(s, req, "CANCELLED", actor, {
      event = "request_cancelled", action = "request.cancel",
      data = { reason = reason, reconciled_unknown_nodes = #unknown > 0 and unknown or nil },
      fields = { current_frontier = canon.array() },
    })
    return req
  end)
end

-- ----------------------------------------------------------------- resume
-- MANUAL_INTERVENTION -> EXECUTING: the operator has looked; recovery sweeps
-- the request's UNKNOWN nodes again.  Refused while a node is FAILED (no
-- worker moves a FAILED node: retry it, which resumes the request, or
-- cancel the request) and when no node is left that a worker would move:
-- an EXECUTING request that nothing can move would vanish from every
-- MANUAL_INTERVENTION list.
local MOVABLE = { UNKNOWN = true, READY = true, BLOCKED = true,
                  SUBMITTING = true, SUBMITTED = true, OBSERVING = true }

local function check_resumable(s, req)
  local g = nodes_db.load_all(s, req)
  local failed, movable = {}, false
  for _, n in ipairs(g.nodes) do
    if n.node_state == "FAILED" then
      failed[#failed + 1] = string.format("%s (%s, %s)", n.node_key, n.id, tostring(n.error_code))
    elseif MOVABLE[n.node_state] then
      movable = true
    end
  end
  if #failed > 0 then
    refuse("illegal_transition", "cannot resume request %s: node %s is FAILED and no worker moves a "
      .. "FAILED node; retry(node_id) it (that resumes the request) or cancel the request",
      req.id, table.concat(failed, ", node "))
  end
  if not movable then
    refuse("illegal_transition", "cannot resume request %s: none of its nodes is UNKNOWN, READY, "
      .. "BLOCKED or in flight, so nothing would move it; cancel it instead", req.id)
  end
end

-- A FAILED request with a node still in flight (it went FAILED beside a
-- sibling in flight before the engine held such a request EXECUTING:
-- docs/conformance.md, difference 11) resumes too, so that the observer
-- watches that node without the failed one being submitted again: the
-- failed node stops the request starting anything more (qtg.state.stopping),
-- and once the node settles the request derives FAILED or
-- MANUAL_INTERVENTION again.
local function check_watchable(s, req)
  for _, n in ipairs(nodes_db.load_all(s, req).nodes) do
    if state.IN_FLIGHT[n.node_state] then return end
  end
  refuse("illegal_transition", "cannot resume request %s: it is FAILED and none of its nodes is in flight; "
    .. "retry(node_id) its failed node, or leave it FAILED", req.id)
end

local RESUMABLE = { MANUAL_INTERVENTION = check_resumable, FAILED = check_watchable }

function M.resume(s, id, actor)
  check_actor(actor)
  return in_tx(s, function()
    local req = lock_request(s, id)
    expect_state(req, { "MANUAL_INTERVENTION", "FAILED" }, "resume")
    RESUMABLE[req.request_state](s, req)
    nodes_db.set_request_state(s, req, "EXECUTING", actor, {
      event = "request_resumed", action = "request.resume",
      fields = { clear_finished = true },   -- a FAILED request had finished
    })
    return req
  end)
end

-- ------------------------------------------------------------------ retry
-- A FAILED or UNKNOWN node back to READY; its next dispatch is attempt
-- attempt_no + 1 with a new idempotency key (or the one the failed attempt
-- would have carried, when it ended before its submit: sql/0211).  The request returns to
-- EXECUTING, and then to what its nodes derive: FAILED again while another
-- node is FAILED, MANUAL_INTERVENTION while one is UNKNOWN beside a
-- completed side effect (retry those too, then it stays EXECUTING).
function M.retry(s, node_id, actor)
  check_actor(actor)
  return in_tx(s, function()
    local req, node = lock_node(s, node_id)
    if node.node_state ~= "FAILED" and node.node_state ~= "UNKNOWN" then
      refuse("illegal_transition", "cannot retry node %s (%s): it is %s (only FAILED or UNKNOWN)",
        node.node_key, node_id, node.node_state)
    end
    expect_state(req, { "FAILED", "MANUAL_INTERVENTION", "EXECUTING" }, "retry a node of")
    local g = nodes_db.load_all(s, req)
    node = g.by_key[node.node_key]
    local previous = { error_code = node.error_code, error_detail = node.error_detail,
                       node_state = node.node_state, attempt_no = node.attempt_no }
    local fields = { node_state = "READY", error_code = NULL, error_detail = NULL,
                     next_observe_in = NULL, clear_finished = true, unknown_observations = 0 }
    -- An UNKNOWN node's last submit may have acted: the next attempt
    -- carries that submit's key, so the provider answers what it did under
    -- it (or acts now, when it never saw it) instead of acting again.
    local last_key = node.idempotency_key
    if node.node_state == "UNKNOWN" and last_key ~= nil and last_key ~= NULL then
      fields.carried_idempotency_key = last_key
      previous.carried_idempotency_key = last_key
    end
    -- A FAILED node's next attempt is a new one: what the failed attempt
    -- reported (a transaction hash, an order, an address) is not its, and
    -- would otherwise stay beside what it reports (refs are merged), for an
    -- observe to look the failed attempt up by, or a successor's $ref to
    -- take.  The audit row keeps them.
    if node.node_state == "FAILED" and type(node.provider_refs) == "table" and next(node.provider_refs) then
      fields.provider_refs = {}
      previous.provider_refs = node.provider_refs
    end
    nodes_db.set_node_state(s, g, node, fields, actor)
    if req.request_state ~= "EXECUTING" then
      -- the request's own transition is audited too (the callback is node_retried's)
      nodes_db.write_request(s, req, { request_state = "EXECUTING", clear_finished = true }, nil,
        { actor = actor, action = "request.executing",
          detail = { from_state = req.request_state, cause = "node.retry", node_key = node.node_key } })
    end
    outbox.enqueue_callback(s, req, "node_retried", { node_key = node.node_key,
      previous_state = previous.node_state, previous_error_code = previous.error_code },
      { actor = actor, action = "node.retry", entity_type = "movement_request_node", entity_id = node.id,
        request_id = req.id, detail = previous })
    -- another node still FAILED (or UNKNOWN beside a completed side effect)
    -- sends the request back where the nodes say it is: left EXECUTING,
    -- nothing would move it (the dispatcher passes a stopping request over)
    nodes_db.apply_request_state(s, g, actor)
    return req, node
  end)
end

-- ---------------------------------------------------- complete a manual step

-- Whether actor is the request's initiator: the same actor, the same
-- enrolled person, or the same principal as both resolve now.
local function same_initiator(s, actor, created_by)
  if actor == created_by or signed.same_person(actor, created_by) then return true end
  local a, c = principals.current(s, actor), principals.current(s, created_by)
  return a ~= nil and c ~= nil and a.actor == c.actor
end

function M.complete_manual_step(s, node_id, actor, input, signature)
  check_actor(actor)
  signed.check_signature(signature)
  return in_tx(s, function()
    local req, node = lock_node(s, node_id)
    if not state.is_manual(node.action_type) then
      refuse("illegal_transition", "node %s (%s) is not a manual step (%s)", node.node_key,
        node_id, node.action_type)
    end
    if node.node_state ~= "READY" then
      refuse("illegal_transition", "cannot complete manual step %s: it is %s (must be READY)",
        node.node_key, node.node_state)
    end
    expect_state(req, { "WAITING_MANUAL_ACTION", "EXECUTING" }, "complete a manual step of")
    -- a request bound for FAILED or MANUAL_INTERVENTION, held while a node
    -- settles (qtg.state.stopping), starts nothing more: nor does an
    -- attestation release what follows it
    local troubled = {}
    local g = nodes_db.load_all(s, req)
    if state.stopping(g.nodes) then
      for _, n in ipairs(g.nodes) do
        if n.node_state == "FAILED" or n.node_state == "UNKNOWN" then
          troubled[#troubled + 1] = string.format("%s is %s", n.node_key, n.node_state)
        end
      end
      refuse("illegal_transition", "cannot complete manual step %s of request %s: node %s, so the request "
        .. "ends FAILED or MANUAL_INTERVENTION once its nodes in flight settle and starts nothing more; "
        .. "retry that node first, or cancel the request", node.node_key, req.id, table.concat(troubled, ", node "))
    end
    -- an attestation (a settlement seen, a desk's confirmation) releases what
    -- follows it: never by the request's initiator (four eyes, as approval),
    -- compared as both resolve now too (a console uid enrolled since as an
    -- operator is that operator), as votes are counted
    if same_initiator(s, actor, req.created_by) then
      refuse("forbidden", "%s created request %s and cannot complete its manual step %s (four eyes)",
        actor, req.id, node.node_key)
    end
    -- under signed approvals the completing person signs that it is done:
    -- the signer takes no node state the runtime wrote for it alone
    if signed.check_attestation(s, req, node.node_key, actor, signature) then
      s:query([[UPDATE movement_request_nodes SET attested_by = $2, attestation_signature = $3
                 WHERE id = $1::uuid]], node.id, actor, signature)
    end
    local adapter, why = executors.get(node.executor)
    if not adapter or type(adapter.complete) ~= "function" then
      refuse("illegal_transition", "node %s: executor %s cannot complete manual steps (%s)",
        node.node_key, node.executor, tostring(why))
    end
    local config = s:query("SELECT config FROM plan_nodes WHERE id = $1", node.plan_node_id)[1].config
    local done, err = adapter.complete(config, input)
    if not done then refuse("invalid_input", "manual step %s: %s", node.node_key, err) end
    node = g.by_key[node.node_key]
    if req.request_state == "WAITING_MANUAL_ACTION" then
      nodes_db.write_request(s, req, { request_state = "EXECUTING" }, nil,
        { actor = actor, action = "request.executing",
          detail = { from_state = "WAITING_MANUAL_ACTION", cause = "manual_step_completed",
                     node_key = node.node_key } })
    end
    outbox.enqueue_callback(s, req, "manual_step_completed", { node_key = node.node_key })
    nodes_db.apply_answer(s, g, node, actor, "complete", { attempt_no = node.attempt_no + 1,
      resolved_config = config }, { status = "COMPLETED", provider_refs = done.provider_refs,
      artifacts = done.artifacts, side_effect = done.side_effect })
    return req, node
  end)
end

-- The other mutations need the operate role; they pass the actor string on.
for _, name in ipairs({ "cancel", "resume", "retry", "complete_manual_step" }) do
  local fn = M[name]
  M[name] = function(s, target, who, ...)
    local _, actor = acting(who, "operate", (name:gsub("_", " ")) .. " requests")
    return fn(s, target, actor, ...)
  end
end

-- -------------------------------------------------------------------- get
function M.get(s, id)
  local req = own_request(s, id, false)
  local nodes = nodes_db.load_nodes(s, id)
  return req, nodes
end

return M
