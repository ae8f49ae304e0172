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
--   target(s, req) -> {chain=, destination=, destinations=, unresolved=,
--     paying=}: where the request moves money to, as its executors read
--     it: EVERY destination it pays, and how many nodes pay; raises
--     invalid_intent when its chains conflict
--   moved(s, amount, paying) -> what a request moves: the amount times its
--     paying nodes (the amount rules, the velocity sums and the signer's
--     amount tiers all judge this)
--   book_entries(s, asset, target) -> {lower(address) = {label, ...}}
--   lock_velocity(s, req): the lock every approving decision takes first
local risk = require "qtg.risk_controls"
local principals = require "qtg.principals"
local errors = require "qtg.errors"
local canon = require "qtg.canon_json"
local NULL = require("cjson").null

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
-- The address book is looked up on the chain and destinations the executors
-- will use, not on whichever intent field names one first.  Each executor
-- that reads them from its node's config says so here (the signer reads
-- the same: the config's chain_id and destination, else the intent's; every
-- such node pays, so every one's destination counts); the intent's
-- destination on its chain_id / destination_chain always counts too.
-- PAYS_SQL below says the same in SQL: keep the two in step.

local function is_ref(v) return type(v) == "string" and v:match("^%$ref:") ~= nil end

-- executor -> {action_type=, chain = fn(config, intent), destination = fn(config, intent)}
-- The paying node kinds: each pays the intent's amount (the signer signs
-- an evm_transfer for exactly that), so a plan with n of them moves n times
-- the amount (moved()).
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
-- (book chains are free text; sql/0197's qtg_book_chain is the same in
-- SQL); nil when v names no chain (absent, JSON null); false when v is
-- malformed (no integer >= 0, no non-empty string).
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

local function refuse_chain(code, fmt, ...)
  errors.raise_with("invalid_intent", { code = code }, fmt, ...)
end

-- target(s, req) -> {chain=, destination=, destinations=, unresolved=}:
-- where the request moves money to, by the chain every source names (the
-- intent's chain fields, the nodes' configs); raises invalid_intent (code
-- INTENT_CHAIN_INVALID or INTENT_CHAIN_CONFLICT) when one is malformed or
-- two disagree.  chain is nil when nothing names one: such a destination
-- is in no address book.
--   destinations: EVERY address the plan pays, each once (first spelling
--     kept, compared case-insensitively): the intent's destination, and
--     each paying node's (an evm_transfer node pays its config's
--     destination, else the intent's -- as the signer reads it).  Every
--     check of where money goes (the address-book rules, velocity
--     per_destination, risk_controls' allowed_destinations and allow-lists)
--     reasons over this one list.
--   unresolved: the paying nodes whose destination is not a literal address
--     now (a $ref, a non-string): no such request is in the book or on a list.
--   destination: the intent's destination (what the request names).
--   paying: how many paying nodes the plan has (moved()).
--   times: {lower(address) = n}: how many of them pay each destination.
function M.target(s, req)
  local intent = req.intent
  local named, first = {}, nil
  local dests, seen, unresolved = {}, {}, {}
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
  local times = {}
  local function pays(d, by_node)
    if type(d) ~= "string" or d == "" then return end
    local k = d:lower()
    if not seen[k] then seen[k] = true; dests[#dests + 1] = d end
    if by_node then times[k] = (times[k] or 0) + 1 end
  end
  for _, k in ipairs(INTENT_CHAINS) do add("intent." .. k, intent[k]) end
  pays(intent.destination)
  local nodes = req.plan_version_id and s:query([[
    SELECT node_key, executor, action_type, config FROM plan_nodes
     WHERE plan_version_id = $1 ORDER BY node_key]], req.plan_version_id) or {}
  local paying = 0
  for _, n in ipairs(nodes) do
    local t = TARGETS[n.executor]
    if t and n.action_type == t.action_type then
      paying = paying + 1
      local cfg = type(n.config) == "table" and n.config or {}
      local c = t.chain(cfg, intent)
      if not is_ref(c) then add(string.format("node %s's chain_id", n.node_key), c) end
      local d = t.destination(cfg, intent)
      if type(d) == "string" and d ~= "" and not is_ref(d) then pays(d, true)
      else unresolved[#unresolved + 1] = n.node_key end
    end
  end
  return { chain = first, destination = intent.destination, destinations = dests, unresolved = unresolved,
           paying = paying, times = times }
end

-- PAYING_SQL: target()'s paying count for a plan version (%s: an SQL
-- expression of its id).  qtgd signer counts the same nodes
-- (src/qtg_signerd.c), and so do the amount tiers (qtg.signed_approvals).
M.PAYING_SQL = [[(SELECT count(*)::int FROM plan_nodes pn WHERE pn.plan_version_id = %s
                    AND pn.executor = 'evm_transfer' AND pn.action_type = 'evm_transfer')]]

-- moved(s, amount, paying) -> the amount a request moves, exact decimal
-- text: the intent's amount times its plan's paying nodes (once when it has
-- none); nil when amount is not a plain decimal.
function M.moved(s, amount, paying)
  if not risk.is_decimal(amount) then return nil end
  if (paying or 0) <= 1 then return amount end
  return s:query("SELECT ($1::numeric * $2::int)::text AS m", amount, paying)[1].m
end

-- book_entries(s, asset, t) -> {lower(address) = {label, ...}}: the address
-- book's entries for the asset (canonical) on t.chain among t.destinations
-- (empty when t names no chain or no destination).
function M.book_entries(s, asset, t)
  local found = {}
  if not t.chain or #t.destinations == 0 or risk.asset(asset) == nil then return found end
  local rows = s:query([[
    SELECT lower(address) AS address, label FROM address_book
     WHERE qtg_book_asset(asset) = $1 AND qtg_book_chain(chain) = $2
       AND lower(address) IN (SELECT lower(x) FROM jsonb_array_elements_text($3::jsonb) AS d(x))
     ORDER BY label]], risk.asset(asset), t.chain, canon.encode(canon.array(t.destinations)))
  for _, r in ipairs(rows) do
    found[r.address] = found[r.address] or {}
    table.insert(found[r.address], r.label)
  end
  return found
end

-- in_book: every destination the request pays is in the address book (for
-- its asset, on its chain); a request paying nothing known, or through an
-- unresolved node, or naming no chain, is not.
local function in_book(s, req, inputs)
  if inputs.in_address_book == nil then
    local t = req.target or M.target(s, req)
    local found = M.book_entries(s, req.intent.asset, t)
    local all = t.chain ~= nil and #t.destinations > 0 and #t.unresolved == 0
    local labels = canon.array()
    for i, d in ipairs(t.destinations) do
      local e = found[d:lower()]
      labels[i] = e and e[1] or NULL    -- null: not in the book
      if not e then all = false end
    end
    inputs.in_address_book = all
    inputs.address_label = found[tostring(t.destinations[1]):lower()] and labels[1] or nil
    inputs.destination_chain = t.chain
    if #t.destinations > 1 or #t.unresolved > 0 then
      inputs.destinations = t.destinations
      inputs.address_labels = labels
      inputs.unresolved_destinations = #t.unresolved > 0 and t.unresolved or nil
    end
  end
  return inputs.in_address_book
end

-- NODE_PAYS_D: an evm_transfer node pn of a stored request r's plan pays
-- d.x (its config's destination, else the intent's).
local NODE_PAYS_D = [[pn.plan_version_id = r.plan_version_id
                 AND pn.executor = 'evm_transfer' AND pn.action_type = 'evm_transfer'
                 AND lower(CASE WHEN jsonb_typeof(pn.config->'destination') IS NULL THEN r.intent->>'destination'
                                WHEN jsonb_typeof(pn.config->'destination') = 'string' THEN pn.config->>'destination'
                           END) = lower(d.x)]]

-- PAYS_SQL: the same list as target()'s destinations, for a stored request
-- r (the velocity sums): r pays d when d is its intent's destination or
-- an evm_transfer node of its plan pays d.
local PAYS_SQL = [[(lower(r.intent->>'destination') = lower(d.x)
   OR EXISTS (SELECT 1 FROM plan_nodes pn WHERE ]] .. NODE_PAYS_D .. [[))]]

-- RECEIVED_SQL: what d.x receives from r: its amount times the nodes that
-- pay d, and once when d is its intent's destination that no node pays
-- (as own_times() counts for the request being decided).
local RECEIVED_SQL = [[(r.intent->>'amount')::numeric * greatest(
     (SELECT count(*) FROM plan_nodes pn WHERE ]] .. NODE_PAYS_D .. [[),
     CASE WHEN lower(r.intent->>'destination') = lower(d.x) THEN 1 ELSE 0 END)]]

-- own_times(t, intent) -> [{x = destination, n = times it receives the
-- amount}], in t.destinations' order.
local function own_times(t, intent)
  local dest = type(intent.destination) == "string" and intent.destination:lower() or nil
  local out = canon.array()
  for i, d in ipairs(t.destinations) do
    local n = t.times[d:lower()] or 0
    if n == 0 and d:lower() == dest then n = 1 end
    out[i] = { x = d, n = n }
  end
  return out
end

-- velocity_total(s, req, moved, v) -> total, over.  Without
-- per_destination: the asset's amounts approved in the window (a request
-- cancelled after a node of it was submitted still counts: its money may
-- have moved), each as its request moves it (a plan that pays twice counts twice), plus moved.
-- With it: per destination the request pays (target().destinations), what
-- the approved requests paid that destination (RECEIVED_SQL), plus what
-- this one pays it (own_times); the largest is the total, and the rule
-- holds when any destination's crosses `over` (a request paying no
-- literal destination counts as crossing: nothing to sum it by).
local function velocity_total(s, req, moved, v)
  local intent = req.intent
  -- $1 network class, $2 asset (canonical), $3 window, $4 this request's id
  local window = [[
      FROM movement_requests r
     WHERE r.network_class = $1 AND ]] .. risk.asset_sql("r.intent->>'asset'") .. [[ = $2
       AND r.approved_at > now() - $3::int * interval '1 second'
       AND (r.request_state NOT IN ('CANCELLED', 'REJECTED', 'EXPIRED')
            OR EXISTS (SELECT 1 FROM movement_request_nodes n
                        WHERE n.request_id = r.id AND (n.side_effect OR n.started_at IS NOT NULL)))
       AND r.intent->>'amount' ~ '^[0-9]+(\.[0-9]+)?$'
       AND ($4::uuid IS NULL OR r.id <> $4::uuid)]]
  local sum = "COALESCE(sum((r.intent->>'amount')::numeric * greatest(1, "
    .. M.PAYING_SQL:format("r.plan_version_id") .. ")), 0)"
  if not v.per_destination then
    local row = s:query("SELECT " .. sum .. "::text AS total, " .. sum .. " + $5::numeric > $6::numeric AS over"
      .. window, req.network_class, risk.asset(intent.asset), v.window_seconds, req.id, moved, v.over)[1]
    return row.total, row.over
  end
  -- per destination: what each received, and what this request pays it
  local t = req.target or M.target(s, req)
  if #t.destinations == 0 or #t.unresolved > 0 then return "0", true end
  local row = s:query([[
    WITH per AS (SELECT (SELECT COALESCE(sum(]] .. RECEIVED_SQL .. "), 0)" .. window .. " AND " .. PAYS_SQL
      .. [[) AS total, d.n
                   FROM jsonb_to_recordset($7::jsonb) AS d(x text, n int))
    SELECT max(total)::text AS total, bool_or(total + $5::numeric * n > $6::numeric) AS over FROM per]],
    req.network_class, risk.asset(intent.asset), v.window_seconds, req.id, intent.amount, v.over,
    canon.encode(own_times(t, intent)))[1]
  return row.total, row.over
end

local function matches(s, req, rule, inputs)
  local m, intent = rule.match, req.intent
  if m.template_key and not one_of(m.template_key, req.template_key) then return false end
  if m.network_class and not one_of(m.network_class, req.network_class) then return false end
  if m.asset and not one_of(m.asset, intent.asset, risk.asset) then return false end
  if m.initiator and not one_of(m.initiator, req.initiator.actor) then return false end
  if m.initiator_role and not principals.has_role(req.initiator, m.initiator_role) then return false end
  -- An amount the rules cannot read (a request made before create refused
  -- such amounts) fails closed: it is at least every amount, below none,
  -- over every velocity limit.  No amount at all moves nothing.
  local unreadable = inputs.moved_amount == nil and intent.amount ~= nil
  if m.amount_at_least or m.amount_below then
    local a = inputs.moved_amount
    if unreadable then
      if m.amount_below then return false end
    elseif a == nil then
      return false
    else
      if m.amount_at_least and risk.cmp(a, m.amount_at_least) < 0 then return false end
      if m.amount_below and risk.cmp(a, m.amount_below) >= 0 then return false end
    end
  end
  if m.destination_in and not in_book(s, req, inputs) then return false end
  if m.destination_not_in and in_book(s, req, inputs) then return false end
  if m.velocity and not unreadable then
    if inputs.moved_amount == nil then return false end
    local total, over = velocity_total(s, req, inputs.moved_amount, m.velocity)
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
  local paying = (req.target or M.target(s, req)).paying
  local inputs = { amount = req.intent.amount, asset = req.intent.asset,
                   moved_amount = M.moved(s, req.intent.amount, paying), paying_nodes = paying,
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
