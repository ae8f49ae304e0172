-- qtg.risk_controls: a template's limits, enforced by the engine at create
-- and again at approval (qtg.requests), not only by executors.
--
--   validate(rc) -> array of errors (empty when the table is well formed):
--     called when templates load; an unknown key or a malformed value is
--     refused there, so a typo never silently disables a limit, and so is a
--     key qtg cannot enforce (max_fee_usd: docs/approvals.md).
--   check(rc, intent[, s, plan_version_id]) -> true | nil, reason: the
--     intent against the limits; the reason names the key that refused
--     ("risk_controls.max_amount refuses: ...").  A wrong intent is an
--     answer, not an error: the caller refuses the request with it
--     (invalid_intent).  The keys about where money goes
--     (allowed_destinations, destination_allowlist_required,
--     counterparty_allowlist_required) reason over every destination the
--     plan pays (qtg.approvals.target) and the address book, so they need
--     the session and the plan version: without them they refuse (fail
--     closed), never pass.
--
-- Amounts are compared as exact decimals (decimal text, never floats).
local M = {}

local DECIMAL = "^(%d+)%.?(%d*)$"

-- norm(d) -> integer digits, fraction digits (no leading/trailing zeros), or nil.
local function norm(d)
  if type(d) ~= "string" then return nil end
  local int, frac = d:match(DECIMAL)
  if not int or (d:find("%.") and frac == "") then return nil end
  int = int:gsub("^0+", "")
  frac = frac:gsub("0+$", "")
  return int, frac
end

-- cmp(a, b) -> -1, 0, 1 for two non-negative decimal strings, or nil.
function M.cmp(a, b)
  local ai, af = norm(a)
  local bi, bf = norm(b)
  if not ai or not bi then return nil end
  if #ai ~= #bi then return #ai < #bi and -1 or 1 end
  if ai ~= bi then return ai < bi and -1 or 1 end
  local n = math.max(#af, #bf)
  af, bf = af .. string.rep("0", n - #af), bf .. string.rep("0", n - #bf)
  if af == bf then return 0 end
  return af < bf and -1 or 1
end

function M.is_decimal(v) return norm(v) ~= nil end

-- asset(a) -> the canonical form of an asset name: ASCII upper case, the
-- form evm_transfer and the signer use ("eth", "Eth" and "ETH" are one
-- asset); nil for a value that is no string.  Every comparison of assets
-- (approval rules, velocity sums and locks, allowed_assets, the address
-- book) compares canonical forms; the stored intent keeps its spelling.
function M.asset(a)
  if type(a) ~= "string" then return nil end
  return (a:upper())
end

-- asset_sql(expr) -> SQL for the canonical form of a text expression, the
-- same folding as asset() (ASCII only, whatever the database's locale).
function M.asset_sql(expr)
  return string.format("translate(%s, 'abcdefghijklmnopqrstuvwxyz', 'ABCDEFGHIJKLMNOPQRSTUVWXYZ')", expr)
end

-- ---- the keys: their shape, and the check each one makes -------------------

-- At most 78 integer digits (a uint256's), as intents' decimals.
local MAX_DIGITS = 78
local function decimal(v)
  local int = norm(v)
  if not int or #int > MAX_DIGITS then
    return "must be a non-negative decimal string (e.g. \"250000\" or \"0.5\")"
  end
end
local function wei(v)
  if type(v) ~= "string" or not v:match("^%d+$") or #v > MAX_DIGITS then
    return "must be a non-negative integer in a decimal string (wei)"
  end
end
local function integer(v)
  if type(v) ~= "number" or v ~= math.floor(v) or v < 0 then return "must be a non-negative integer" end
end
local function boolean(v)
  if type(v) ~= "boolean" then return "must be true or false" end
end
local function array_of(pred, what)
  return function(v)
    if type(v) ~= "table" or next(v) ~= nil and #v == 0 then return "must be an array of " .. what end
    for k, x in pairs(v) do
      if type(k) ~= "number" or not pred(x) then return "must be an array of " .. what end
    end
  end
end
local function nonempty_string(x) return type(x) == "string" and x ~= "" end
local function chain_id(x) return type(x) == "number" and x >= 1 and x == math.floor(x) end

local function amount_of(intent) return intent.amount end

-- where(ctx) -> the request's target (qtg.approvals.target: chain,
-- destinations, unresolved), computed once per check; nil when the check
-- was given no session and plan version.
local function where(ctx)
  if ctx.target == nil and ctx.s ~= nil and ctx.plan_version_id ~= nil then
    ctx.target = require("qtg.approvals").target(ctx.s, { intent = ctx.intent, plan_version_id = ctx.plan_version_id })
  end
  return ctx.target
end

local NO_PLAN = "it needs the plan's destinations and this check was given no session and plan version"

-- paid(ctx) -> target | nil, why: every destination must be known.
local function paid(ctx)
  local t = where(ctx)
  if not t then return nil, NO_PLAN end
  if #t.unresolved > 0 then
    return nil, string.format("node %s pays a destination that is not a literal address", t.unresolved[1])
  end
  if #t.destinations == 0 then return nil, "the request names no destination" end
  return t
end

-- in_book(ctx, label) -> nil | why: every destination the plan pays is in
-- the address book for the intent's asset on its chain (with `label`, when
-- given: the counterparty register).
local function in_book(ctx, label)
  local t, why = paid(ctx)
  if not t then return why end
  if t.chain == nil then
    return string.format("destination %s: the request names no chain, so it is in no address book",
      t.destinations[1])
  end
  local found = require("qtg.approvals").book_entries(ctx.s, ctx.intent.asset, t)
  for _, d in ipairs(t.destinations) do
    local labels = found[d:lower()]
    if not labels then
      return string.format("destination %s is not in the address book for %s on %s", d,
        tostring(M.asset(ctx.intent.asset)), t.chain)
    end
    if label ~= nil then
      local ok = false
      for _, l in ipairs(labels) do if l == label then ok = true end end
      if not ok then
        return string.format("destination %s is in the address book for %s on %s as %s, not as counterparty %s",
          d, tostring(M.asset(ctx.intent.asset)), t.chain, table.concat(labels, ", "), label)
      end
    end
  end
end

-- The shape each key takes, and the check each one makes:
-- check(limit, intent, ctx) -> nil when allowed, else the refusal's message.
-- ctx = {s=, plan_version_id=, intent=} (where(ctx) is the plan's target).
-- A key without a check is enforced by an executor (named in its comment).
M.KEYS = {
  max_amount = { shape = decimal, check = function(limit, intent)
    local c = M.cmp(amount_of(intent), limit)
    if c == nil then return "the intent's amount is not a decimal" end
    if c > 0 then return string.format("amount %s exceeds max_amount %s", intent.amount, limit) end
  end },
  min_amount = { shape = decimal, check = function(limit, intent)
    local c = M.cmp(amount_of(intent), limit)
    if c == nil then return "the intent's amount is not a decimal" end
    if c < 0 then return string.format("amount %s is below min_amount %s", intent.amount, limit) end
  end },
  allowed_assets = { shape = array_of(nonempty_string, "asset names"), check = function(list, intent)
    local want = M.asset(intent.asset)
    for _, a in ipairs(list) do if want ~= nil and M.asset(a) == want then return end end
    return string.format("asset %s is not in allowed_assets (%s)", tostring(intent.asset), table.concat(list, ", "))
  end },
  allowed_chain_ids = { shape = array_of(chain_id, "positive integer chain ids"), check = function(list, intent)
    if intent.chain_id == nil then return nil end -- a template whose intent names no chain id
    for _, c in ipairs(list) do if c == intent.chain_id then return end end
    return string.format("chain_id %s is not in allowed_chain_ids", tostring(intent.chain_id))
  end },
  -- every destination the plan pays (not only the intent's) is on the list
  allowed_destinations = { shape = array_of(nonempty_string, "addresses"), check = function(list, _, ctx)
    local t, why = paid(ctx)
    if not t then return why end
    local ok = {}
    for _, a in ipairs(list) do ok[a:lower()] = true end
    for _, d in ipairs(t.destinations) do
      if not ok[d:lower()] then return string.format("destination %s is not in allowed_destinations", d) end
    end
  end },
  -- true: every destination the plan pays is in the address book for the
  -- intent's asset on its chain (a request naming no chain is in no book)
  destination_allowlist_required = { shape = boolean, check = function(on, _, ctx)
    if on then return in_book(ctx) end
  end },
  -- true: the address book is the counterparty register (qtg has no other):
  -- the intent names a counterparty, and every destination the plan pays is
  -- in the address book for its asset on its chain with that counterparty as
  -- its label (exactly).  A counterparty nobody registered, or paid at
  -- another counterparty's address, is refused.
  counterparty_allowlist_required = { shape = boolean, check = function(on, intent, ctx)
    if not on then return nil end
    if type(intent.counterparty) ~= "string" or intent.counterparty == "" then
      return "the intent names no counterparty (a non-empty string)"
    end
    return in_book(ctx, intent.counterparty)
  end },
  -- not enforceable: qtg has no USD price source and no executor reports a
  -- fee in USD, so a template setting it is refused when it loads (and a
  -- plan version stored before this refusal existed refuses every request)
  -- rather than look like a fee cap.  The enforced fee caps are the EVM
  -- executor's (and the signer's) wei limits below.
  max_fee_usd = { shape = function(v)
    return decimal(v) or "is not enforced: qtg has no USD price source and no executor reports a fee in USD; "
      .. "remove it (EVM fees are capped by max_fee_per_gas_wei, max_priority_fee_per_gas_wei and gas_limit)"
  end, check = function()
    return "max_fee_usd cannot be enforced (qtg has no USD price source): this plan version is refused"
  end },
  -- shapes only here: the EVM executor and the signer enforce them
  -- (qtg.evm_tx.controls, qtgd-signerd)
  max_fee_per_gas_wei = { shape = wei },
  max_priority_fee_per_gas_wei = { shape = wei },
  gas_limit = { shape = integer },
  max_pending_nonces = { shape = integer },
}

local ORDER = {}
for k in pairs(M.KEYS) do ORDER[#ORDER + 1] = k end
table.sort(ORDER)

function M.validate(rc)
  local errs = {}
  if type(rc) ~= "table" then return { "\"risk_controls\" must be an object" } end
  for k, v in pairs(rc) do
    local key = M.KEYS[k]
    if not key then
      errs[#errs + 1] = string.format("\"risk_controls\" has an unknown key %q (known: %s)",
        tostring(k), table.concat(ORDER, ", "))
    else
      local why = key.shape(v)
      if why then errs[#errs + 1] = string.format("\"risk_controls.%s\" %s", k, why) end
    end
  end
  if #errs == 0 and rc.min_amount and rc.max_amount and M.cmp(rc.min_amount, rc.max_amount) > 0 then
    errs[#errs + 1] = "\"risk_controls.min_amount\" exceeds max_amount"
  end
  table.sort(errs)
  return errs
end

local function refuses(k, why) return nil, string.format("risk_controls.%s refuses: %s", k, why) end

function M.check(rc, intent, s, plan_version_id)
  if type(rc) ~= "table" then return true end
  if type(intent) ~= "table" then return refuses("intent", "the intent is not an object") end
  local ctx = { s = s, plan_version_id = plan_version_id, intent = intent }
  for _, k in ipairs(ORDER) do
    local key = M.KEYS[k]
    if rc[k] ~= nil and key.check then
      local why = key.check(rc[k], intent, ctx)
      if why then return refuses(k, why) end
    end
  end
  return true
end

return M
