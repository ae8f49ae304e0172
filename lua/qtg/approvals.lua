-- qtg.approvals: the approval policy's engine.  The rules live in
-- qtg.policies.approval (operator-overridable, reloadable); this module
-- validates them, evaluates them for a request (first match wins, no match
-- = deny) and computes the database inputs a rule asks for (address book,
-- velocity windows).
--
--   allow() / require{approvals=, roles=} / block{reason=}: the actions
--   validate(policy) -> array of errors (empty when well formed)
--   policy() -> the policy in force: the loaded module when it validates,
--     else the last one that did (a broken edit never turns approvals off);
--     raises when no valid policy was ever loaded
--   evaluate(s, req) -> decision {rule=, action=, approvals=, roles=,
--     reason=, inputs=}; raises when a rule raises while matching
--   target(s, req) -> {chain=, destination=}: where the request moves to,
--     as its executor reads it; raises invalid_intent when its chains conflict
--   lock_velocity(s, req): the lock every approving decision takes first
local risk = require "qtg.risk_controls"
local principals = require "qtg.principals"
local errors = require "qtg.errors"

local M = {}

M.MODULE = "qtg.policies.approval"

function M.allow() return { kind = "allow" } end
function M.block(t) return { kind = "block", reason = type(t) == "table" and t.reason or t } end
function M.require(t)
  t = type(t) == "table" and t or {}
  return { kind = "require", approvals = t.approvals, roles = t.roles }
end

local MATCH_KEYS = {
  template_key = "list", network_class = "list", asset = "list", initiator = "list",
  amount_at_least = "decimal", amount_below = "decimal", initiator_role = "role",
  destination_in = "book", destination_not_in = "book", velocity = "velocity", when = "func",
}

local function list_ok(v)
  if type(v) == "string" then return v ~= "" end
  if type(v) ~= "table" or #v == 0 then return false end
  for _, x in ipairs(v) do if type(x) ~= "string" or x == "" then return false end end
  return true
end

local CHECKS = {
  list = function(v) return list_ok(v) or "must be a non-empty string or array of strings" end,
  decimal = function(v) return risk.is_decimal(v) or "must be a decimal string" end,
  role = function(v) return principals.ROLES[v] == true or "must be one of read, operate, approve, admin" end,
  book = function(v) return v == "address_book" or "must be \"address_book\"" end,
  func = function(v) return type(v) == "function" or "must be a function(request, inputs) -> boolean" end,
  velocity = function(v)
    if type(v) ~= "table" then return "must be a table {window_seconds=, over=}" end
    if type(v.window_seconds) ~= "number" or v.window_seconds < 1 or v.window_seconds ~= math.floor(v.window_seconds) then
      return "window_seconds must be a positive integer"
    end
    if not risk.is_decimal(v.over) then return "over must be a decimal string" end
    if v.per_destination ~= nil and type(v.per_destination) ~= "boolean" then return "per_destination must be a boolean" end
    return true
  end,
}

local function validate_action(a)
  if type(a) ~= "table" then return "action must be allow(), require{...} or block{...}" end
  if a.kind == "allow" then return nil end
  if a.kind == "block" then
    if type(a.reason) ~= "string" or a.reason == "" then return "block needs a reason" end
    return nil
  end
  if a.kind == "require" then
    if type(a.approvals) ~= "number" or a.approvals < 1 or a.approvals ~= math.floor(a.approvals) or a.approvals > 20 then
      return "require needs approvals = an integer from 1 to 20"
    end
    if type(a.roles) ~= "table" or #a.roles == 0 then return "require needs roles = a non-empty list" end
    for _, r in ipairs(a.roles) do
      if not principals.ROLES[r] then return "require: unknown role " .. tostring(r) end
    end
    return nil
  end
  return "action must be allow(), require{...} or block{...}"
end

function M.validate(policy)
  local errs = {}
  if type(policy) ~= "table" or type(policy.rules) ~= "table" or #policy.rules == 0 then
    return { "the approval policy must return { rules = { ... } } with at least one rule" }
  end
  local names = {}
  for i, rule in ipairs(policy.rules) do
    local where = string.format("rule %d", i)
    if type(rule) ~= "table" then
      errs[#errs + 1] = where .. " is not a table"
    else
      if type(rule.name) ~= "string" or not rule.name:match("^[%w_%.%-]+$") then
        errs[#errs + 1] = where .. ": name must be a word ([A-Za-z0-9_.-])"
      elseif names[rule.name] then
        errs[#errs + 1] = where .. ": name " .. rule.name .. " is used twice"
      else
        names[rule.name] = true
        where = where .. " (" .. rule.name .. ")"
      end
      if type(rule.match) ~= "table" then
        errs[#errs + 1] = where .. ": match must be a table"
      else
        for k, v in pairs(rule.match) do
          local check = CHECKS[MATCH_KEYS[k]]
          if not check then
            errs[#errs + 1] = string.format("%s: unknown match key %s", where, tostring(k))
          else
            local ok = check(v)
            if ok ~= true then errs[#errs + 1] = string.format("%s: match.%s %s", where, k, ok) end
          end
        end
      end
      local why = validate_action(rule.action)
      if why then errs[#errs + 1] = where .. ": " .. why end
    end
  end
  return errs
end

-- The last policy that validated survives a reload of this module.
local function store() 
  local qtg = require "qtg"
  qtg.approval_policy_state = qtg.approval_policy_state or {}
  return qtg.approval_policy_state
end

-- load() -> policy, nil | nil, error: load and validate the module now.
function M.load()
  local ok, policy = pcall(require, M.MODULE)
  if not ok then return nil, "the approval policy does not load: " .. tostring(policy) end
  local errs = M.validate(policy)
  if #errs > 0 then return nil, "the approval policy is malformed: " .. table.concat(errs, "; ") end
  return policy
end

function M.policy()
  local st = store()
  local policy, err = M.load()
  if policy then
    st.good = policy
    return policy
  end
  if st.good then
    if st.warned ~= err then
      st.warned = err
      pcall(function() require("qtg").log.warn("approval policy: " .. err .. "; the previous policy stays in force") end)
    end
    return st.good
  end
  error(err, 0)
end

-- ---- matching ----------------------------------------------------------------

-- one_of(v, x[, canon]) -> whether x is v or in the list v, both sides
-- through canon when given.
local function one_of(v, x, canon)
  canon = canon or function(y) return y end
  local want = canon(x)
  if want == nil then return false end
  if type(v) == "string" then return canon(v) == want end
  for _, y in ipairs(v) do if canon(y) == want then return true end end
  return false
end

-- ---- where a request moves to ---------------------------------------------
-- The address book is looked up on the chain and destination the executor
-- will use, not on whichever intent field names one first.  Each executor
-- that reads them from its node's config says so here (the signer reads
-- the same: the config's chain_id, else the intent's); any other plan moves
-- to the intent's destination on its chain_id / destination_chain.

local function is_ref(v) return type(v) == "string" and v:match("^%$ref:") ~= nil end

-- executor -> {action_type=, chain = fn(config, intent), destination = fn(config, intent)}
local TARGETS = {
  evm_transfer = {
    action_type = "evm_transfer",
    chain = function(cfg, intent) if cfg.chain_id ~= nil then return cfg.chain_id end return intent.chain_id end,
    destination = function(cfg, intent) if cfg.destination ~= nil then return cfg.destination end return intent.destination end,
  },
}

-- The intent fields that name the destination's chain.
local INTENT_CHAINS = { "chain_id", "destination_chain" }

local NULL = require("cjson").null

-- chain(v) -> the canonical text of a chain: a chain id as its decimal
-- digits ("0137" and 137 are "137"), any other name in ASCII lower case
-- (book chains are free text); nil when v names no chain (absent, JSON
-- null); false when v is malformed (no integer >= 0, no non-empty string).
function M.chain(v)
  if v == nil or v == NULL then return nil end
  if type(v) == "number" then
    if v < 0 or v ~= math.floor(v) or v >= 2^53 then return false end
    return string.format("%d", v)
  end
  if type(v) ~= "string" or v == "" then return false end
  if v:match("^%d+$") then
    local digits = v:gsub("^0+", "")
    return digits ~= "" and digits or "0"
  end
  return (v:lower())
end

-- SQL for the canonical text of an address_book.chain, as chain() makes it
-- (ASCII folding only, whatever the database's locale).
local BOOK_CHAIN = [[CASE WHEN chain ~ '^[0-9]+$' THEN COALESCE(NULLIF(ltrim(chain, '0'), ''), '0')
  ELSE translate(chain, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz') END]]

local function refuse_chain(code, fmt, ...)
  errors.raise_with("invalid_intent", { code = code }, fmt, ...)
end

-- target(s, req) -> {chain=, destination=}: where the request moves to, by
-- the chain every source names (the intent's chain fields, the nodes'
-- configs); raises invalid_intent (code INTENT_CHAIN_INVALID or
-- INTENT_CHAIN_CONFLICT) when one is malformed or two disagree.  chain is
-- nil when nothing names one: such a destination is in no address book.
function M.target(s, req)
  local intent = req.intent
  local named, first, destination = {}, nil, intent.destination
  local function add(where, v)
    local c = M.chain(v)
    if c == false then
      refuse_chain("INTENT_CHAIN_INVALID", "%s %s is not a chain (a chain id or a name)", where, tostring(v))
    end
    if c == nil then return end
    named[#named + 1] = string.format("%s %s", where, tostring(v))
    if first == nil then first = c
    elseif c ~= first then
      refuse_chain("INTENT_CHAIN_CONFLICT", "the request names two chains: %s", table.concat(named, ", "))
    end
  end
  for _, k in ipairs(INTENT_CHAINS) do add("intent." .. k, intent[k]) end
  local nodes = req.plan_version_id and s:query([[
    SELECT node_key, executor, action_type, config FROM plan_nodes
     WHERE plan_version_id = $1 ORDER BY node_key]], req.plan_version_id) or {}
  for _, n in ipairs(nodes) do
    local t = TARGETS[n.executor]
    if t and n.action_type == t.action_type then
      local cfg = type(n.config) == "table" and n.config or {}
      local c = t.chain(cfg, intent)
      if not is_ref(c) then add(string.format("node %s's chain_id", n.node_key), c) end
      local d = t.destination(cfg, intent)
      if type(d) == "string" and not is_ref(d) then destination = d end
    end
  end
  return { chain = first, destination = destination }
end

local function in_book(s, req, inputs)
  if inputs.in_address_book == nil then
    local t = req.target or M.target(s, req)
    local dest = type(t.destination) == "string" and t.destination or nil
    local row = t.chain and dest and s:query([[
      SELECT label FROM address_book
       WHERE ]] .. risk.asset_sql("asset") .. [[ = $1 AND lower(address) = lower($2)
         AND ]] .. BOOK_CHAIN .. [[ = $3
       LIMIT 1]], risk.asset(req.intent.asset), dest, t.chain)[1]
    inputs.in_address_book = row ~= nil
    inputs.address_label = row and row.label or nil
    inputs.destination_chain = t.chain
  end
  return inputs.in_address_book
end

local function velocity_total(s, req, v)
  local intent = req.intent
  local row = s:query([[
    SELECT COALESCE(sum((intent->>'amount')::numeric), 0)::text AS total,
           COALESCE(sum((intent->>'amount')::numeric), 0) + $4::numeric > $5::numeric AS over
      FROM movement_requests
     WHERE network_class = $1 AND ]] .. risk.asset_sql("intent->>'asset'") .. [[ = $2
       AND approved_at > now() - $3::int * interval '1 second'
       AND request_state NOT IN ('CANCELLED', 'REJECTED', 'EXPIRED')
       AND intent->>'amount' ~ '^[0-9]+(\.[0-9]+)?$'
       AND ($6::uuid IS NULL OR id <> $6::uuid)
       AND ($7::text IS NULL OR lower(intent->>'destination') = lower($7))]],
    req.network_class, risk.asset(intent.asset), v.window_seconds, intent.amount, v.over,
    req.id, v.per_destination and tostring(intent.destination) or nil)[1]
  return row.total, row.over
end

local function matches(s, req, rule, inputs)
  local m, intent = rule.match, req.intent
  if m.template_key and not one_of(m.template_key, req.template_key) then return false end
  if m.network_class and not one_of(m.network_class, req.network_class) then return false end
  if m.asset and not one_of(m.asset, intent.asset, risk.asset) then return false end
  if m.initiator and not one_of(m.initiator, req.initiator.actor) then return false end
  if m.initiator_role and not principals.has_role(req.initiator, m.initiator_role) then return false end
  if m.amount_at_least or m.amount_below then
    local a = intent.amount
    if not risk.is_decimal(a) then return false end
    if m.amount_at_least and risk.cmp(a, m.amount_at_least) < 0 then return false end
    if m.amount_below and risk.cmp(a, m.amount_below) >= 0 then return false end
  end
  if m.destination_in and not in_book(s, req, inputs) then return false end
  if m.destination_not_in and in_book(s, req, inputs) then return false end
  if m.velocity then
    if not risk.is_decimal(intent.amount) then return false end
    local total, over = velocity_total(s, req, m.velocity)
    inputs.velocity = inputs.velocity or {}
    inputs.velocity[rule.name] = { window_seconds = m.velocity.window_seconds, over = m.velocity.over,
                                   approved_in_window = total }
    if not over then return false end
  end
  if m.when and not m.when(req, inputs) then return false end
  return true
end

-- lock_velocity(s, req): serialise the decisions that approve requests of
-- one asset (canonical form) in a network class -- a create the policy
-- allows and an approval alike -- so two of them that together cross a
-- velocity window cannot both read the sum without the other (held to the
-- end of the transaction).
function M.lock_velocity(s, req)
  s:query("SELECT pg_advisory_xact_lock(hashtextextended('qtg.velocity:' || $1 || ':' || $2, 0))",
    req.network_class, risk.asset(req.intent.asset) or "")
end

-- evaluate(s, req): req = {id=, template_key=, network_class=, intent=,
-- initiator = principal}.
function M.evaluate(s, req)
  local policy = M.policy()
  local inputs = { amount = req.intent.amount, asset = req.intent.asset,
                   destination = req.intent.destination, initiator = req.initiator.actor }
  for _, rule in ipairs(policy.rules) do
    local ok, hit = pcall(matches, s, req, rule, inputs)
    if not ok then
      error(string.format("approval policy rule %s raised while matching: %s", rule.name, tostring(hit)), 0)
    end
    if hit then
      local a = rule.action
      return { rule = rule.name, action = a.kind, approvals = a.kind == "require" and a.approvals or 0,
               roles = a.roles, reason = a.reason, inputs = inputs }
    end
  end
  return { rule = "default_deny", action = "block", approvals = 0,
           reason = "no approval policy rule matches", inputs = inputs }
end

return M
