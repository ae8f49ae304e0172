-- qtg.evm_tx: the pure part of an EVM transfer (docs/evm.md): amounts in
-- wei, the risk controls a template sets, the EIP-1559 fees chosen from the
-- node's fee data within those caps, the transaction's fields for
-- qtg.evm.eip1559, and confirmation counting.  No I/O: every function takes
-- what the RPC answered and returns a value, or nil + reason (fees: nil +
-- an executor error carrying the node's error code, qtg.executors.error).
--
-- Big integers (wei amounts and balances exceed 2^53) are decimal strings
-- without leading zeros; fees per gas are Lua numbers, refused at 2^53 and
-- above (9e6 gwei: far above any cap a template may set).
local executors = require "qtg.executors"

local M = {}

M.DECIMALS = 18                 -- native ETH
M.DEFAULT_GAS_LIMIT = 21000     -- a plain value transfer to an account
M.MAX_SAFE = 2 ^ 53
M.DEFAULT_MAX_PENDING = 64      -- nonces in flight per sender (geth AccountQueue)
M.BASE_FEE_MULTIPLIER = 2       -- max_fee = 2 * next base fee + tip (rides out 6 full blocks)
M.NATIVE_ASSETS = { ETH = true }

-- ---- decimal integer strings -------------------------------------------------

-- dec(s) -> normalised decimal integer string, or nil.
function M.dec(s)
  if type(s) == "number" then
    if s < 0 or s ~= math.floor(s) or s >= M.MAX_SAFE then return nil end
    return string.format("%d", s)
  end
  if type(s) ~= "string" or not s:match("^%d+$") then return nil end
  s = s:gsub("^0+", "")
  return s == "" and "0" or s
end

function M.cmp(a, b)
  if #a ~= #b then return #a < #b and -1 or 1 end
  if a == b then return 0 end
  return a < b and -1 or 1
end

function M.add(a, b)
  local out, carry = {}, 0
  local i, j = #a, #b
  while i > 0 or j > 0 or carry > 0 do
    local d = carry + (i > 0 and a:byte(i) - 48 or 0) + (j > 0 and b:byte(j) - 48 or 0)
    out[#out + 1] = string.char(48 + d % 10)
    carry = math.floor(d / 10)
    i, j = i - 1, j - 1
  end
  return M.dec(string.reverse(table.concat(out))) or "0"
end

function M.mul(a, b)
  local r = {}
  for k = 1, #a + #b do r[k] = 0 end
  for i = #a, 1, -1 do
    local da = a:byte(i) - 48
    for j = #b, 1, -1 do
      local k = i + j
      local v = r[k] + da * (b:byte(j) - 48)
      r[k] = v % 10
      r[k - 1] = r[k - 1] + math.floor(v / 10)
    end
  end
  local out = {}
  for k = 1, #r do out[k] = string.char(48 + r[k]) end
  return M.dec(table.concat(out)) or "0"
end

-- hex_to_dec("0x1bc16d674ec80000") -> "2000000000000000000", or nil.
-- At most 64 hex digits (a uint256): the conversion is quadratic in the
-- length, and an RPC answer of megabytes of digits would hold the loop.
function M.hex_to_dec(h)
  if type(h) ~= "string" or #h > 66 or not h:match("^0x%x+$") then return nil end
  local digits = { 0 }            -- little-endian base 10^7 limbs
  for c in h:sub(3):gmatch(".") do
    local carry = tonumber(c, 16)
    for k = 1, #digits do
      local v = digits[k] * 16 + carry
      digits[k] = v % 10000000
      carry = math.floor(v / 10000000)
    end
    if carry > 0 then digits[#digits + 1] = carry end
  end
  local out = { string.format("%d", digits[#digits]) }
  for k = #digits - 1, 1, -1 do out[#out + 1] = string.format("%07d", digits[k]) end
  return M.dec(table.concat(out))
end

-- ---- amounts -----------------------------------------------------------------

-- to_wei("1.5") -> "1500000000000000000", or nil, reason.  A positive
-- decimal with at most 18 fractional digits (a wei is the smallest unit).
function M.to_wei(amount, decimals)
  decimals = decimals or M.DECIMALS
  if type(amount) == "number" then amount = tostring(amount) end
  if type(amount) ~= "string" then return nil, "amount is not a decimal string" end
  local int, frac = amount:match("^(%d+)%.(%d+)$")
  if not int then int, frac = amount:match("^(%d+)$"), "" end
  if not int then return nil, string.format("amount %q is not a plain decimal", amount:sub(1, 40)) end
  if #frac > decimals then
    return nil, string.format("amount %s has more than %d decimals (below one wei)", amount, decimals)
  end
  local wei = M.dec(int .. frac .. string.rep("0", decimals - #frac))
  if wei == "0" then return nil, "amount must be positive" end
  return wei
end

-- from_wei("1500000000000000000") -> "1.5" (for messages).
function M.from_wei(wei, decimals)
  decimals = decimals or M.DECIMALS
  wei = M.dec(wei) or "0"
  local padded = string.rep("0", decimals + 1 - #wei) .. wei
  local int, frac = padded:sub(1, #padded - decimals), padded:sub(#padded - decimals + 1)
  frac = frac:gsub("0+$", "")
  return frac == "" and (M.dec(int) or "0") or ((M.dec(int) or "0") .. "." .. frac)
end

-- ---- risk controls -------------------------------------------------------------

local function wei_number(v)
  local d = M.dec(v)
  if not d or M.cmp(d, string.format("%d", M.MAX_SAFE)) >= 0 then return nil end
  return tonumber(d)
end

-- controls(risk_controls) -> {max_amount_wei=, max_fee_per_gas=,
-- max_priority_fee_per_gas=, gas_limit=, allowed_chain_ids=set|nil,
-- max_pending=}, or nil, reason.  Fee caps are required: a treasury never
-- signs a transaction whose price it did not bound.
function M.controls(rc)
  if type(rc) ~= "table" then return nil, "risk_controls must be an object" end
  local c = {}
  c.max_fee_per_gas = wei_number(rc.max_fee_per_gas_wei)
  if not c.max_fee_per_gas or c.max_fee_per_gas <= 0 then
    return nil, "risk_controls.max_fee_per_gas_wei must be a positive integer (wei, decimal string)"
  end
  c.max_priority_fee_per_gas = wei_number(rc.max_priority_fee_per_gas_wei)
  if not c.max_priority_fee_per_gas then
    return nil, "risk_controls.max_priority_fee_per_gas_wei must be an integer >= 0 (wei, decimal string)"
  end
  if c.max_priority_fee_per_gas > c.max_fee_per_gas then
    return nil, "risk_controls.max_priority_fee_per_gas_wei exceeds max_fee_per_gas_wei"
  end
  c.gas_limit = rc.gas_limit == nil and M.DEFAULT_GAS_LIMIT or wei_number(rc.gas_limit)
  if not c.gas_limit or c.gas_limit < 21000 or c.gas_limit > 30000000 then
    return nil, "risk_controls.gas_limit must be an integer from 21000 to 30000000"
  end
  if rc.max_amount ~= nil then
    local w, why = M.to_wei(type(rc.max_amount) == "number" and tostring(rc.max_amount) or rc.max_amount)
    if not w then return nil, "risk_controls.max_amount: " .. why end
    c.max_amount_wei = w
  end
  if rc.allowed_chain_ids ~= nil then
    if type(rc.allowed_chain_ids) ~= "table" then
      return nil, "risk_controls.allowed_chain_ids must be an array of chain ids"
    end
    c.allowed_chain_ids = {}
    for _, id in ipairs(rc.allowed_chain_ids) do
      if type(id) ~= "number" or id < 1 or id ~= math.floor(id) then
        return nil, "risk_controls.allowed_chain_ids must hold positive integers"
      end
      c.allowed_chain_ids[id] = true
    end
  end
  c.max_pending = rc.max_pending_nonces == nil and M.DEFAULT_MAX_PENDING or rc.max_pending_nonces
  if type(c.max_pending) ~= "number" or c.max_pending < 1 or c.max_pending ~= math.floor(c.max_pending) then
    return nil, "risk_controls.max_pending_nonces must be a positive integer"
  end
  return c
end

-- chain_id(v) -> a positive integer chain id, or nil.
function M.chain_id(v)
  if type(v) == "string" and v:match("^%d+$") then v = tonumber(v) end
  if type(v) ~= "number" or v < 1 or v ~= math.floor(v) or v >= M.MAX_SAFE then return nil end
  return v
end

-- ---- fees ----------------------------------------------------------------------

local function qty(h)
  if type(h) ~= "string" or not h:match("^0x%x+$") or #h > 15 then return nil end
  return tonumber(h:sub(3), 16)
end
M.quantity = qty

-- fee_history(doc) -> {base_fee_next=, rewards={...}}, or nil, reason.  doc
-- is eth_feeHistory's answer; its baseFeePerGas has one entry more than the
-- blocks asked for: the base fee of the next block.
function M.fee_history(doc)
  if type(doc) ~= "table" or type(doc.baseFeePerGas) ~= "table" or #doc.baseFeePerGas == 0 then
    return nil, "eth_feeHistory answer has no baseFeePerGas"
  end
  local next_base = qty(doc.baseFeePerGas[#doc.baseFeePerGas])
  if not next_base then return nil, "eth_feeHistory baseFeePerGas is not a quantity below 2^53" end
  local rewards = {}
  if type(doc.reward) == "table" then
    for _, r in ipairs(doc.reward) do
      local v = type(r) == "table" and qty(r[1])
      if v then rewards[#rewards + 1] = v end
    end
  end
  return { base_fee_next = next_base, rewards = rewards }
end

local function median(list)
  if #list == 0 then return nil end
  local c = {}
  for i, v in ipairs(list) do c[i] = v end
  table.sort(c)
  return c[math.floor((#c + 1) / 2)]
end

-- fees{base_fee_next=, suggested_tip= (eth_maxPriorityFeePerGas, may be
-- nil), rewards=, controls=} -> {max_fee_per_gas=, max_priority_fee_per_gas=,
-- base_fee_next=}, or nil, err (executors.error: EVM_RPC_BAD_RESPONSE,
-- EVM_FEE_ABOVE_CAP).
--   tip     = the node's suggestion (else the median reward), at most the cap
--   max_fee = 2 * next base fee + tip, at most the cap
-- Refused (EVM_FEE_ABOVE_CAP) when even the capped max fee cannot cover the
-- next block's base fee plus the tip: the transaction would sit unmined.
function M.fees(a)
  local c = a.controls
  local base = a.base_fee_next
  if type(base) ~= "number" or base < 0 then
    return nil, executors.error("EVM_RPC_BAD_RESPONSE", "no base fee")
  end
  local tip = a.suggested_tip or median(a.rewards or {}) or 0
  if tip > c.max_priority_fee_per_gas then tip = c.max_priority_fee_per_gas end
  local max_fee = M.BASE_FEE_MULTIPLIER * base + tip
  if max_fee > c.max_fee_per_gas then max_fee = c.max_fee_per_gas end
  if max_fee < base + tip then
    return nil, executors.error("EVM_FEE_ABOVE_CAP", string.format(
      "next block's base fee %d wei + tip %d wei exceeds the template's max_fee_per_gas_wei %d",
      base, tip, c.max_fee_per_gas))
  end
  return { max_fee_per_gas = max_fee, max_priority_fee_per_gas = tip, base_fee_next = base }
end

-- ---- the transaction -------------------------------------------------------------

-- fields{chain_id=, nonce=, to=, value_wei=, gas_limit=, fees=} -> the table
-- qtg.evm.eip1559 takes (integers as decimal strings, empty data and access
-- list), JSON-safe so it can be stored and read back unchanged.
function M.fields(a)
  return {
    chain_id = a.chain_id,
    nonce = a.nonce,
    max_priority_fee_per_gas = string.format("%d", a.fees.max_priority_fee_per_gas),
    max_fee_per_gas = string.format("%d", a.fees.max_fee_per_gas),
    gas_limit = a.gas_limit,
    to = a.to,
    value = a.value_wei,
    data = "0x",
  }
end

-- max_cost(gas_limit, max_fee_per_gas, value_wei) -> wei the sender may
-- spend at most (the balance a node checks before it accepts the bytes).
function M.max_cost(gas_limit, max_fee_per_gas, value_wei)
  return M.add(M.mul(M.dec(gas_limit), M.dec(max_fee_per_gas)), value_wei)
end

-- confirmations(receipt_block, latest_block): the receipt's own block counts
-- as the first.
function M.confirmations(receipt_block, latest)
  if type(receipt_block) ~= "number" or type(latest) ~= "number" then return 0 end
  return math.max(0, latest - receipt_block + 1)
end

return M
