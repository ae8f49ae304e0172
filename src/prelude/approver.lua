-- What an approval (or an initiation) with these two texts lets qtg's
-- signer sign, read by the signer's own rules, for `qtgd approver sign KEY
-- DOCUMENT PLAN` (src/qtg_approver_payments.c) to show before it signs.
-- It runs in a plain LuaJIT state with cjson: no database, no daemon.
--
-- The rules are those of src/qtg_signerd.c (qtg_signerd_facts_sql and the
-- checks after it): the signer signs only nodes whose executor and action
-- are evm_transfer; each pays the intent's amount of the intent's asset
-- (ETH only, a plain decimal of at most 18 decimals) to the node's config
-- destination when it names one (a literal address only) or else the
-- intent's, on the node's config chain_id or else the intent's, within the
-- plan's risk_controls, once the steps right before it (its "after") are
-- done.  Every other node is listed as not signed here; each node's
-- "after" is shown under it.
--
-- The chunk returns describe(document_text, plan_text) -> text, or nil and
-- why when a text is no JSON object (the tool then signs nothing).
local cjson = require "cjson"

local format, concat, floor, abs = string.format, table.concat, math.floor, math.abs

local ADDRESS = "^0[xX]" .. ("%x"):rep(40) .. "$"

local function object(text, what)
  local ok, v = pcall(cjson.decode, text)
  if not ok or type(v) ~= "table" or not text:match("^%s*{") then return nil, what .. " is not a JSON object" end
  return v
end

local function field(t, name)
  local v = type(t) == "table" and t[name] or nil
  if v == cjson.null then return nil end
  return v
end

-- A JSON value as the signer reads its text (->>): strings as they are,
-- whole numbers exactly up to 2^53.
local function shown(v)
  if type(v) == "string" then return v end
  if type(v) == "number" then
    if v == floor(v) and abs(v) < 2 ^ 53 then return format("%.0f", v) end
    return "(a number not shown exactly here: read it in the text)"
  end
  if v == nil then return "(none)" end
  return "(a JSON " .. (type(v) == "table" and "object or array" or type(v)) .. ")"
end

-- As the signer reads an amount: a JSON string of a plain decimal (a JSON
-- number is refused there, whatever its digits: this tool could not show
-- a large one exactly).
local function plain_decimal(s)
  if type(s) ~= "string" then return false end
  local whole, frac = s:match("^(%d+)%.?(%d*)$")
  return whole ~= nil and #frac <= 18 and not s:match("%.$")
end

local function signed_here(n)
  return field(n, "executor") == "evm_transfer" and field(n, "action_type") == "evm_transfer"
end

-- chain_id(v) -> a chain id's decimal digits without leading zeros, as
-- the signer takes it (a JSON integer or a digit string, from 1 to
-- 2^53 - 1), or nil.
local function chain_id(v)
  if type(v) == "number" then
    if v >= 1 and v == floor(v) and v < 2 ^ 53 then return format("%.0f", v) end
    return nil
  end
  if type(v) ~= "string" or not v:match("^%d+$") then return nil end
  local digits = v:gsub("^0+", "")
  if digits == "" or #digits > 16 or tonumber(digits) >= 2 ^ 53 then return nil end
  return digits
end

-- Why the signer refuses a transfer of amount of asset to dest on chain
-- (allowed: the plan's allowed_chain_ids, when it has them), or nil.
local function refusal(dest, asset, amount, chain, allowed)
  if type(dest) ~= "string" or not dest:match(ADDRESS) then
    return "its destination is not a literal address"
  end
  if asset ~= "ETH" then return "only ETH is signed, and the intent moves " .. shown(asset) end
  if not plain_decimal(amount) then return "the amount is not a plain decimal string of at most 18 decimals" end
  local id = chain_id(chain)
  if not id then return "its chain_id is not a chain id (decimal digits from 1 to 2^53 - 1)" end
  if type(allowed) == "table" then
    local found = false
    for _, c in ipairs(allowed) do
      local a = type(c) == "number" and chain_id(c)
      if not a then
        return "the plan's allowed_chain_ids holds " .. shown(c) .. ", which is no chain id, so it allows nothing"
      end
      if a == id then found = true end
    end
    if not found then return "chain " .. shown(chain) .. " is not in the plan's allowed_chain_ids" end
  end
  return nil
end

local function caps(rc)
  local allowed = field(rc, "allowed_chain_ids")
  local chains = {}
  if type(allowed) == "table" then
    for i, c in ipairs(allowed) do chains[i] = shown(c) end
  end
  return format("  within the plan's risk_controls: max_amount %s, max_fee_per_gas %s wei, "
    .. "max_priority_fee_per_gas %s wei, gas_limit %s, allowed_chain_ids %s",
    shown(field(rc, "max_amount")), shown(field(rc, "max_fee_per_gas_wei")),
    shown(field(rc, "max_priority_fee_per_gas_wei")), shown(field(rc, "gas_limit") or "21000"),
    type(allowed) == "table" and "[" .. concat(chains, ", ") .. "]" or "(any)")
end

-- A plan node's action is a manual step's: a person completes it, and the
-- signer asks that person's signed attestation (docs/approvals.md,
-- "Attested manual steps"); any other step is done on the daemon's word.
local function manual(n)
  local action = field(n, "action_type")
  return type(action) == "string" and action:sub(1, 7) == "manual_"
end

-- The steps right before node n, as the plan document lists them (its
-- "after"): the signer signs n's transfer only once each is COMPLETED or
-- SKIPPED, and a manual one only with a person's attestation.  A line, or
-- nil when n runs first.  by_key: the plan's nodes by key.
local function order(n, by_key)
  local after = field(n, "after")
  if type(after) ~= "table" then
    return "    its steps before it are not listed (" .. shown(after) .. "): read the plan text"
  end
  if #after == 0 then return nil end
  local keys = {}
  for i, k in ipairs(after) do
    keys[i] = shown(k) .. (manual(by_key[k]) and " (attested by a person)" or " (the daemon's word)")
  end
  return "    runs only after: " .. concat(keys, ", ")
end

-- The manual steps anywhere before node n (its "after", followed back):
-- each needs a person's attestation before the signer signs n.  A line, or
-- nil when there is none.
local function attested_before(n, by_key)
  local seen, found, queue = {}, {}, { n }
  while #queue > 0 do
    local after = field(table.remove(queue), "after")
    for _, k in ipairs(type(after) == "table" and after or {}) do
      if type(k) == "string" and not seen[k] then
        seen[k] = true
        if manual(by_key[k]) then found[#found + 1] = k end
        if by_key[k] then queue[#queue + 1] = by_key[k] end
      end
    end
  end
  if #found == 0 then return nil end
  table.sort(found)
  return "    signed only once an enrolled person (not the request's maker) has attested: " .. concat(found, ", ")
end

local function describe(document_text, plan_text)
  local doc, why = object(document_text, "the document")
  if not doc then return nil, why end
  local plan
  plan, why = object(plan_text, "the plan")
  if not plan then return nil, why end
  local intent = field(doc, "intent")
  local asset = field(intent, "asset")
  asset = type(asset) == "string" and asset:upper() or asset
  local amount = field(intent, "amount")
  local rc = field(plan, "risk_controls")
  local out = { "what qtg's signer may sign under this statement (by its own rules; docs/approvals.md):" }
  local transfers = 0
  local nodes = type(field(plan, "nodes")) == "table" and plan.nodes or {}
  local by_key = {}
  for _, n in ipairs(nodes) do
    local key = field(n, "node_key")
    if type(key) == "string" then by_key[key] = n end
  end
  for _, n in ipairs(nodes) do
    local key = shown(field(n, "node_key"))
    if signed_here(n) then
      local cfg = field(n, "config")
      local own = field(cfg, "destination")
      local dest = own == nil and field(intent, "destination") or (type(own) == "string" and own or nil)
      local chain = field(cfg, "chain_id")
      if chain == nil then chain = field(intent, "chain_id") end
      local no = refusal(dest, asset, amount, chain, field(rc, "allowed_chain_ids"))
      if no then
        out[#out + 1] = format("  node %s: refused by the signer: %s", key, no)
      else
        transfers = transfers + 1
        out[#out + 1] = format("  node %s: pays %s ETH to %s on chain %s, signed with key %s", key, shown(amount), dest,
          shown(chain), shown(field(cfg, "signer_key")))
        local theirs = field(intent, "destination")
        if own ~= nil and (type(theirs) ~= "string" or theirs:lower() ~= dest:lower()) then
          out[#out + 1] = format("    the node's own destination, not the intent's (%s)", shown(theirs))
        end
        out[#out + 1] = attested_before(n, by_key)
      end
    else
      out[#out + 1] = format("  node %s: %s / %s: not signed by qtg's signer", key,
        shown(field(n, "executor")), shown(field(n, "action_type")))
    end
    out[#out + 1] = order(n, by_key)
  end
  if transfers == 0 then
    out[#out + 1] = "  nothing: no node of this plan is one the signer signs"
  else
    if transfers > 1 then
      out[#out + 1] = format("  in all: %d transfers of %s ETH each", transfers, shown(amount))
    end
    out[#out + 1] = caps(rc)
  end
  return concat(out, "\n")
end

return describe
