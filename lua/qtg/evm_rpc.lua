-- qtg.evm_rpc: an Ethereum JSON-RPC 2.0 client over qtg.http, for the
-- nonce reaper, verify_drift and the evm_transfer executor.
--
-- Every call returns `value` or `nil, err`; it never raises for anything a
-- node or the network does.  err is a qtg.error {kind=, message=,
-- where="evm_rpc", method=, url= [, code=, data=, status=]}, reading
-- "evm_rpc kind (method): message [code N]", kind one of:
--   invalid      an argument refused before any I/O (a malformed address,
--                hash, block tag or raw transaction)
--   timeout, refused, dns, closed, tls, too_large, http, interrupted
--                the transport failed (qtg.http's kinds, unchanged)
--   status       the node answered a non-2xx HTTP status
--   garbage      the body is not a JSON-RPC 2.0 response to our request
--   rpc          the node answered a JSON-RPC error object (code, message, data)
--   bad_result   a result that is not what the method returns (e.g. a
--                quantity that is not 0x-hex)
-- A JSON null result (an unknown transaction, a receipt not yet mined) is
-- returned as `false`, never as an error.
--
-- Endpoints come from MG_EVM_RPC_URLS, "chain_id=url[,chain_id=url...]"
-- (M.endpoints).  A "pending" transaction count from a load-balanced RPC is
-- not trustworthy (two calls may reach two nodes with different mempools):
-- the reaper asks for "latest" only.
local qtg = require("qtg")
local cjson = require("cjson.safe")
local canon = require("qtg.canon_json")

local M = {}

M.DEFAULT_TIMEOUT = 10
M.MAX_BODY = 4 * 1024 * 1024

local json = cjson.new()
json.decode_invalid_numbers(false)
json.decode_max_depth(64)

local function fail(kind, message, extra)
  local fields = { where = "evm_rpc" }
  for k, v in pairs(extra or {}) do fields[k] = v end
  return nil, qtg.error(kind, message, fields)
end
M.fail = fail

-- ---- argument checks -------------------------------------------------------

-- check_address(a) -> lowercase address, or nil, reason.  All-lowercase and
-- all-uppercase hex are accepted as they are; mixed case must be the EIP-55
-- checksum form (a typo in a checksummed address is refused, not guessed).
function M.check_address(a)
  if type(a) ~= "string" then return nil, "address is not a string" end
  if not a:match("^0x%x+$") or #a ~= 42 then
    return nil, string.format("malformed EVM address %q (want 0x and 40 hex digits)", a:sub(1, 80))
  end
  local body = a:sub(3)
  if body:lower() ~= body and body:upper() ~= body then
    local ok, sum = pcall(qtg.signer.checksum_address, a)
    if not ok or sum ~= a then
      return nil, string.format("EVM address %q fails its EIP-55 checksum", a)
    end
  end
  return a:lower()
end

local function check_hash(h, what)
  if type(h) ~= "string" or not h:match("^0x%x+$") or #h ~= 66 then
    return nil, string.format("malformed %s %q (want 0x and 64 hex digits)", what, tostring(h):sub(1, 80))
  end
  return h:lower()
end
M.check_hash = check_hash

local BLOCK_TAGS = { latest = true, earliest = true, pending = true, safe = true, finalized = true }

local function check_block(b)
  b = b or "latest"
  if type(b) == "number" and b >= 0 and b % 1 == 0 then return string.format("0x%x", b) end
  if type(b) == "string" and (BLOCK_TAGS[b] or b:match("^0x%x+$")) then return b end
  return nil, "block must be a tag (latest, safe, finalized, ...), a 0x quantity or an integer"
end

local function check_data(d, what)
  if type(d) ~= "string" or not d:match("^0x%x*$") or #d % 2 ~= 0 then
    return nil, string.format("malformed %s (want 0x and an even number of hex digits)", what)
  end
  return d:lower()
end

-- quantity("0x1a") -> 26; nil for anything else.  Values from 2^53 on
-- are refused (nonces, block numbers and chain ids are far below it): a
-- double holds every integer below 2^53 exactly, and rounds past it.
-- 2^53 is 0x20000000000000, 14 hex digits.
function M.quantity(q)
  if type(q) ~= "string" or not q:match("^0x%x+$") or #q > 16 then return nil end
  if #q > 3 and q:sub(3, 3) == "0" then return nil end -- no leading zeros in a quantity
  if #q == 16 and q:sub(3, 3) ~= "1" then return nil end -- 2^53 or more
  return tonumber(q:sub(3), 16)
end

-- ---- endpoints ---------------------------------------------------------------

-- endpoints(text) -> {[chain_id] = url}, or nil, reason.  Text is
-- MG_EVM_RPC_URLS: "chain_id=url[,chain_id=url...]".
function M.endpoints(text)
  local out, n = {}, 0
  if type(text) ~= "string" then return nil, "MG_EVM_RPC_URLS is not text" end
  for entry in text:gmatch("[^,]+") do
    entry = entry:match("^%s*(.-)%s*$")
    if entry ~= "" then
      local id, url = entry:match("^(%d+)=(https?://%S+)$")
      if not id then
        return nil, string.format("MG_EVM_RPC_URLS: entry %q is not chain_id=http(s)://url", entry)
      end
      id = tonumber(id)
      if id < 1 then return nil, "MG_EVM_RPC_URLS: chain id must be positive in " .. entry end
      if out[id] then return nil, "MG_EVM_RPC_URLS: chain " .. id .. " is listed twice" end
      out[id] = url
      n = n + 1
    end
  end
  return out, nil, n
end

-- ---- the call ----------------------------------------------------------------

-- request(url, method, params, opts) -> result (false for JSON null) or nil, err.
-- opts: timeout (seconds, default MG_EVM_RPC_TIMEOUT_SECONDS or 10).
function M.request(url, method, params, opts)
  opts = opts or {}
  local timeout = opts.timeout or (qtg.settings and qtg.settings.evm_rpc_timeout_seconds) or M.DEFAULT_TIMEOUT
  -- cjson writes an empty table as {}, so params are encoded one by one.
  local parts = {}
  for i, p in ipairs(params or {}) do parts[i] = json.encode(p) end
  local body = string.format('{"jsonrpc":"2.0","id":1,"method":%s,"params":[%s]}',
    json.encode(method), table.concat(parts, ","))
  local ctx = { method = method, url = url }
  local resp, herr = qtg.http.request{
    method = "POST", url = url, body = body, timeout = timeout,
    connect_timeout = math.min(timeout, 5), max_body = M.MAX_BODY,
    headers = { ["Content-Type"] = "application/json", ["Accept"] = "application/json" },
  }
  if not resp then
    ctx.url = herr and herr.url or url
    return fail(herr and herr.kind or "http", herr and herr.message or "request failed", ctx)
  end
  if resp.status < 200 or resp.status > 299 then
    ctx.status = resp.status
    return fail("status", string.format("HTTP %d: %s", resp.status, canon.excerpt(resp.body or "", 200)), ctx)
  end
  local doc = canon.decode(resp.body or "", json)
  if type(doc) ~= "table" or doc.jsonrpc ~= "2.0" or doc.id ~= 1 then
    return fail("garbage", "not a JSON-RPC 2.0 response: " .. canon.excerpt(resp.body or "", 120), ctx)
  end
  if doc.error ~= nil then
    local e = doc.error
    if type(e) ~= "table" then return fail("garbage", "error member is not an object", ctx) end
    ctx.code = tonumber(e.code)
    ctx.data = e.data ~= cjson.null and e.data or nil
    local message = type(e.message) == "string" and canon.excerpt(e.message, 300)
      or "(an error without a text message)"
    return fail("rpc", message, ctx)
  end
  if doc.result == nil then return fail("garbage", "response has neither result nor error", ctx) end
  if doc.result == cjson.null then return false end
  return doc.result
end

local function quantity_result(url, method, params, opts)
  local r, err = M.request(url, method, params, opts)
  if r == nil then return nil, err end
  local n = M.quantity(r)
  if not n then
    return fail("bad_result", string.format("%s answered %s, not a quantity", method,
      tostring(r):sub(1, 80)), { method = method, url = url })
  end
  return n
end

function M.chain_id(url, opts) return quantity_result(url, "eth_chainId", {}, opts) end

function M.block_number(url, opts) return quantity_result(url, "eth_blockNumber", {}, opts) end

-- get_transaction_count(url, address, block) -> integer.  block defaults to
-- "latest".
function M.get_transaction_count(url, address, block, opts)
  local a, why = M.check_address(address)
  if not a then return fail("invalid", why, { method = "eth_getTransactionCount" }) end
  local b, bwhy = check_block(block)
  if not b then return fail("invalid", bwhy, { method = "eth_getTransactionCount" }) end
  return quantity_result(url, "eth_getTransactionCount", { a, b }, opts)
end

local function object_result(url, method, params, opts, fields)
  local r, err = M.request(url, method, params, opts)
  if r == nil or r == false then return r, err end
  if type(r) ~= "table" then
    return fail("bad_result", method .. " answered a non-object", { method = method, url = url })
  end
  for _, f in ipairs(fields) do
    if type(r[f]) ~= "string" then
      return fail("bad_result", method .. " answer lacks " .. f, { method = method, url = url })
    end
  end
  return r
end

-- get_transaction_by_hash -> tx object (hash, from, nonce, blockNumber...) or false.
function M.get_transaction_by_hash(url, hash, opts)
  local h, why = check_hash(hash, "transaction hash")
  if not h then return fail("invalid", why, { method = "eth_getTransactionByHash" }) end
  return object_result(url, "eth_getTransactionByHash", { h }, opts, { "hash", "from", "nonce" })
end

-- get_transaction_receipt -> receipt (status, blockNumber, transactionHash...) or false.
function M.get_transaction_receipt(url, hash, opts)
  local h, why = check_hash(hash, "transaction hash")
  if not h then return fail("invalid", why, { method = "eth_getTransactionReceipt" }) end
  return object_result(url, "eth_getTransactionReceipt", { h }, opts,
    { "transactionHash", "blockNumber", "status" })
end

local function data_result(url, method, params, opts)
  local r, err = M.request(url, method, params, opts)
  if r == nil then return nil, err end
  if type(r) ~= "string" or not r:match("^0x%x*$") or #r % 2 ~= 0 then
    return fail("bad_result", method .. " answered " .. tostring(r):sub(1, 80) .. ", not 0x data",
      { method = method, url = url })
  end
  return r:lower()
end

-- call(url, {to=, data=[, from=]}, block) -> 0x result data.
function M.call(url, tx, block, opts)
  if type(tx) ~= "table" then return fail("invalid", "call needs {to=, data=}", { method = "eth_call" }) end
  local to, why = M.check_address(tx.to)
  if not to then return fail("invalid", why, { method = "eth_call" }) end
  local data, dwhy = check_data(tx.data or "0x", "call data")
  if not data then return fail("invalid", dwhy, { method = "eth_call" }) end
  local b, bwhy = check_block(block)
  if not b then return fail("invalid", bwhy, { method = "eth_call" }) end
  local obj = { to = to, data = data }
  if tx.from then
    local from, fwhy = M.check_address(tx.from)
    if not from then return fail("invalid", fwhy, { method = "eth_call" }) end
    obj.from = from
  end
  return data_result(url, "eth_call", { obj, b }, opts)
end

-- get_code(url, address, block) -> 0x code ("0x" for an account without code).
function M.get_code(url, address, block, opts)
  local a, why = M.check_address(address)
  if not a then return fail("invalid", why, { method = "eth_getCode" }) end
  local b, bwhy = check_block(block)
  if not b then return fail("invalid", bwhy, { method = "eth_getCode" }) end
  return data_result(url, "eth_getCode", { a, b }, opts)
end

-- send_raw_transaction(url, raw) -> transaction hash.
function M.send_raw_transaction(url, raw, opts)
  local r, why = check_data(raw, "raw transaction")
  if not r or #r < 4 then
    return fail("invalid", why or "empty raw transaction", { method = "eth_sendRawTransaction" })
  end
  local h, err = M.request(url, "eth_sendRawTransaction", { r }, opts)
  if h == nil then return nil, err end
  local hash = h and check_hash(h, "transaction hash")
  if not hash then
    return fail("bad_result", "eth_sendRawTransaction answered " .. tostring(h):sub(1, 80),
      { method = "eth_sendRawTransaction", url = url })
  end
  return hash
end

-- Node errors that mean "these exact bytes are already known to the node or
-- already mined": a rebroadcast that gets one of them did no harm.  Clients
-- word them differently (geth, erigon, nethermind, besu, anvil).
M.ALREADY_KNOWN = { "already known", "already imported", "known transaction",
                    "alreadyknown", "transaction already exists", "already in the pool",
                    "already in pool" }
M.NONCE_TOO_LOW = { "nonce too low", "nonce is too low", "oldnonce", "nonce has already been used",
                    "transaction nonce is too low" }

-- Node errors that refuse the transaction itself: its pool's validation
-- found these bytes unfit whatever the moment (funds, intrinsic gas, gas
-- above the block's limit, signature, chain, type, size, a fee over the
-- node's cap or under its fixed minimum), so they are in no pool of this
-- node.  The wording of geth, erigon, nethermind (old and new), besu,
-- reth and anvil.  Not here, since the same bytes can be pooled or mined
-- later: a future nonce ("nonce too high"), a full pool (a bare
-- "transaction underpriced", nethermind's "FeeTooLow"), a fee cap below the
-- current base fee, a full block ("gas limit reached"); nor any other
-- JSON-RPC error (a rate limit, an internal or upstream error, a busy or
-- syncing node), which says nothing of the bytes: a proxy may have passed
-- them on before it failed.
M.TX_REFUSED = {
  "insufficient funds", "insufficientfunds", "upfront cost exceeds account balance",
  "intrinsic gas too low", "intrinsicgas", "intrinsic gas exceeds gas limit",
  "exceeds block gas limit", "gas limit is too high", "gaslimitexceeded",
  "invalid sender", "invalid transaction v, r, s values", "invalidtxsignature", "failed to recover sender",
  "failedtoresolvesender", "invalid chain id", "incorrect chain id", "invalidtxchainid", "wrong chainid",
  "incompatible eip-155 transaction", "only replay-protected",
  "transaction type not supported", "tx type not supported", "unsupported transaction type",
  "notsupportedtxtype", "invalid transaction type", "oversized data", "transaction too large",
  "maxtxsizeexceeded", "exceeds the configured cap", "transaction fee cap exceeded",
  "max priority fee per gas higher than max fee per gas", "tip higher than fee cap",
  "max priority fee per gas exceeds max fee per gas", "invalidmaxpriorityfeepergas",
  "transaction gas price below minimum", "transaction underpriced: gas tip cap",
  "transaction underpriced: tip needed", "gas price below configured minimum gas price",
  "below minimum required priority fee",
}

local function matches_any(err, list)
  if type(err) ~= "table" or err.kind ~= "rpc" then return false end
  local msg = tostring(err.message):lower()
  for _, needle in ipairs(list) do
    if msg:find(needle, 1, true) then return true end
  end
  return false
end

-- Another transaction of the sender holds the nonce in the pool, at fees
-- these bytes do not beat by the pool's margin (geth, erigon, reth, anvil;
-- besu; nethermind).
M.OUTBID = { "replacement transaction underpriced", "replacement transaction under-priced",
             "replacementnotallowed" }

function M.is_already_known(err) return matches_any(err, M.ALREADY_KNOWN) end
function M.is_nonce_too_low(err) return matches_any(err, M.NONCE_TOO_LOW) end
function M.is_outbid(err) return matches_any(err, M.OUTBID) end
-- Being outbid is not a refusal of the bytes: another transaction of the
-- sender holds the nonce in the pool, and these bytes can still be mined.
function M.is_tx_refused(err)
  if M.is_outbid(err) then return false end
  return matches_any(err, M.TX_REFUSED)
end

return M
