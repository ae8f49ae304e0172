-- qtg.executors.evm_transfer: native-asset transfers on an EVM chain over
-- JSON-RPC (qtg.evm_rpc on qtg.http), signed by the host's signer
-- (qtg.signer) -- docs/evm.md has the whole story and every error code.
--
-- Action types it serves:
--   evm_transfer                       the transfer itself
--     preflight  chain id, destination (EIP-55 honoured), amount and fee
--                caps, the sender's balance, the sender's nonce backlog
--     prepare    EIP-1559 fields (fees from eth_feeHistory and
--                eth_maxPriorityFeePerGas within risk_controls), nonce
--                reserved in evm_nonce_reservation (qtg.evm_nonces, own
--                session, committed), payload = 0x02 || rlp(9 fields),
--                payload_hash = its signing hash (the allowed_payload_hash)
--     submit     the signed bytes are stored with the reservation, then
--                eth_sendRawTransaction; "already known" / "nonce too low"
--                are looked up by hash, never taken as a failure
--     observe    receipt: status 1 -> COMPLETED, status 0 -> FAILED
--                EVM_TX_REVERTED; not mined -> OBSERVING (a dropped
--                transaction whose nonce is still free is broadcast again)
--     recover    finds the transaction by its hash (or the node's
--                reservation) and decides from the chain: FAILED only when
--                the chain proves the bytes dead (reverted, nonce taken) or
--                nothing was signed; a refused rebroadcast of bytes that may
--                be out is UNKNOWN with the side effect
--   destination_chain_receive_observe    COMPLETED once the transaction is
--                mined with status 1 (optionally checked against the intent)
--   destination_chain_finality_observe   COMPLETED once the receipt's block
--                has config.confirmations confirmations
-- Every chain answer that is not understood is UNKNOWN (after a broadcast)
-- or a refused preflight (before): nothing is guessed.
-- Its helpers fail with nil, err (err = qtg.executors.error(code, detail):
-- code the node's error code, message its detail); the executor's calls
-- turn err into a refusal or an answer, and prepare raises it.
local qtg = require "qtg"
local executors = require "qtg.executors"
local rpc = require "qtg.evm_rpc"
local evm_tx = require "qtg.evm_tx"
local nonces = require "qtg.evm_nonces"

local M = {}

M.TRANSFER = "evm_transfer"
M.RECEIVE = "destination_chain_receive_observe"
M.FINALITY = "destination_chain_finality_observe"
M.PAYLOAD_FORMAT = "evm_eip1559"
M.FEE_HISTORY_BLOCKS = 5
M.FEE_PERCENTILE = 50
M.POLL_SECONDS = 2          -- observe hint while a transaction is pending
M.HEALTH_TIMEOUT = 3

-- Calls to the RPC provider (qtg.pacing): a submit makes about four RPC
-- requests (chain id, fees, nonce, send), an observe one or two.  Hosted
-- RPC plans allow some tens of requests a second per key, and every qtgd
-- process uses the same key: the budget is shared through the database.
M.RATE_LIMITS = {
  submit = { per_second = 4, burst = 4 },
  observe = { per_second = 10, burst = 10 },
  recover = { per_second = 2, burst = 4 },
  shared = true,
}

-- Node config fields per action type: name -> check(value) -> ok.
local function is_string(x) return type(x) == "string" and x ~= "" end
local function is_chain(x) return evm_tx.chain_id(x) ~= nil or (type(x) == "string" and x:match("^%$ref:") ~= nil) end
local function is_count(x) return type(x) == "number" and x >= 1 and x == math.floor(x) and x <= 10000 end
local function is_seconds(x) return type(x) == "number" and x > 0 and x <= 600 end
local function is_bool(x) return type(x) == "boolean" end

M.CONFIG = {
  [M.TRANSFER] = { signer_key = is_string, chain_id = is_chain, destination = is_string,
                   poll_seconds = is_seconds },
  [M.RECEIVE] = { tx_hash = is_string, chain_id = is_chain, verify_intent = is_bool,
                  poll_seconds = is_seconds },
  [M.FINALITY] = { tx_hash = is_string, chain_id = is_chain, confirmations = is_count,
                   poll_seconds = is_seconds },
}
M.REQUIRED = { [M.TRANSFER] = { "signer_key" }, [M.RECEIVE] = { "tx_hash" },
               [M.FINALITY] = { "tx_hash", "confirmations" } }

-- Template loader hook.
function M.validate_config(config, action_type)
  local fields = M.CONFIG[action_type]
  if not fields then
    return nil, "evm_transfer does not serve action type " .. tostring(action_type)
  end
  for k, x in pairs(config) do
    if not fields[k] then return nil, "evm_transfer: unknown config field " .. tostring(k) end
    if not fields[k](x) then return nil, "evm_transfer: bad config field " .. tostring(k) end
  end
  for _, k in ipairs(M.REQUIRED[action_type]) do
    if config[k] == nil then return nil, "evm_transfer: config." .. k .. " is required" end
  end
  return true
end

-- ---- helpers -----------------------------------------------------------------------

local TRANSPORT = { timeout = true, refused = true, dns = true, closed = true, tls = true,
                    interrupted = true, http = true }

-- rpc_code(err): the executor's error code for an evm_rpc error.
function M.rpc_code(err)
  local kind = type(err) == "table" and err.kind or "garbage"
  if TRANSPORT[kind] then return "EVM_RPC_UNREACHABLE" end
  if kind == "rpc" then return "EVM_RPC_ERROR" end
  if kind == "invalid" then return "EVM_BAD_REQUEST" end
  return "EVM_RPC_BAD_RESPONSE"
end

-- An endpoint for logs and error details: scheme://host[:port] only (RPC
-- URLs often carry an API key in their path or user part).
M.redact = require("qtg.redact").endpoint

local function rpc_detail(err, url)
  return string.format("%s (%s)", tostring(err), M.redact(url))
end

local fail = executors.error

-- rpc_error(err, url): the executor's error for an evm_rpc error at url.
local function rpc_error(err, url)
  return fail(M.rpc_code(err), rpc_detail(err, url))
end

-- A refused preflight for the failure e.
local function refuse(e) return { ok = false, error_code = e.code, error_detail = e.message } end

-- answer(status, e[, with]) -> the answer {status=, error_code=,
-- error_detail=} of the failure e, with the fields of `with` added.
local function answer(status, e, with)
  local a = { status = status, error_code = e.code, error_detail = e.message }
  for k, x in pairs(with or {}) do a[k] = x end
  return a
end

-- endpoint(chain_id) -> url, or nil, err.
function M.endpoint(chain_id)
  local eps, why = rpc.endpoints(qtg.settings.evm_rpc_urls or "")
  if not eps then return nil, fail("EVM_RPC_MISCONFIGURED", why) end
  local url = eps[chain_id]
  if not url then
    return nil, fail("EVM_NO_RPC_ENDPOINT", string.format("no RPC endpoint for chain %d in MG_EVM_RPC_URLS", chain_id))
  end
  return url
end

-- connect(chain_id) -> url, or nil, err: the endpoint answers eth_chainId
-- with the chain we mean.
function M.connect(chain_id)
  local url, uerr = M.endpoint(chain_id)
  if not url then return nil, uerr end
  local id, err = rpc.chain_id(url)
  if not id then return nil, rpc_error(err, url) end
  if id ~= chain_id then
    return nil, fail("EVM_CHAIN_ID_MISMATCH", string.format(
      "the RPC endpoint for chain %d (%s) serves chain %d", chain_id, M.redact(url), id))
  end
  return url
end

local function node_chain(config, intent)
  local raw = config.chain_id
  if raw == nil then raw = intent and intent.chain_id end
  return evm_tx.chain_id(raw)
end

-- plan(ctx) -> {chain_id=, to=, value_wei=, signer_key=, from=, controls=},
-- or nil, err.  Everything that needs no chain.
function M.plan(ctx)
  local cfg, intent = ctx.node_config or {}, ctx.intent or {}
  local asset = type(intent.asset) == "string" and intent.asset:upper() or nil
  if not evm_tx.NATIVE_ASSETS[asset or ""] then
    return nil, fail("EVM_UNSUPPORTED_ASSET", string.format(
      "evm_transfer moves the chain's native asset (ETH), not %s", tostring(intent.asset)))
  end
  local chain_id = node_chain(cfg, intent)
  if not chain_id then
    return nil, fail("EVM_BAD_INTENT", "chain_id (intent or node config) must be a positive integer, got "
      .. tostring(cfg.chain_id or intent.chain_id))
  end
  local c, why = evm_tx.controls(ctx.risk_controls)
  if not c then return nil, fail("EVM_RISK_CONTROLS_INVALID", why) end
  if c.allowed_chain_ids and not c.allowed_chain_ids[chain_id] then
    return nil, fail("EVM_CHAIN_NOT_ALLOWED", string.format(
      "chain %d is not in the template's risk_controls.allowed_chain_ids", chain_id))
  end
  local wei, awhy = evm_tx.to_wei(intent.amount)
  if not wei then return nil, fail("EVM_BAD_AMOUNT", awhy) end
  if c.max_amount_wei and evm_tx.cmp(wei, c.max_amount_wei) > 0 then
    return nil, fail("EVM_AMOUNT_ABOVE_CAP", string.format("amount %s ETH exceeds the template's max_amount %s ETH",
      evm_tx.from_wei(wei), evm_tx.from_wei(c.max_amount_wei)))
  end
  local dest = cfg.destination
  if dest == nil then dest = intent.destination end
  local to, dwhy = rpc.check_address(dest)
  if not to then return nil, fail("EVM_BAD_DESTINATION", dwhy) end
  if to == "0x" .. string.rep("0", 40) then
    return nil, fail("EVM_BAD_DESTINATION", "the zero address burns funds: refused")
  end
  local key = cfg.signer_key
  local from, serr
  if type(key) == "string" then from, serr = qtg.signer.address(key) end
  if not from and type(serr) == "table" and serr.kind == "signer_unavailable" then error(serr, 0) end
  if not from then
    return nil, fail("EVM_SIGNER_NOT_LOADED", string.format(
      "signer key %s is not held by the signer (qtgd signer, MG_SIGNER_KEYS)", tostring(key)))
  end
  return { chain_id = chain_id, to = to, value_wei = wei, signer_key = key, from = from, controls = c }
end

-- fee_data(url, controls) -> fees, or nil, err.
function M.fee_data(url, controls)
  local doc, err = rpc.request(url, "eth_feeHistory",
    { M.FEE_HISTORY_BLOCKS, "latest", { M.FEE_PERCENTILE } })
  if doc == nil then return nil, rpc_error(err, url) end
  local hist, why = evm_tx.fee_history(doc)
  if not hist then return nil, fail("EVM_RPC_BAD_RESPONSE", why .. " (" .. M.redact(url) .. ")") end
  local tip
  local t, terr = rpc.request(url, "eth_maxPriorityFeePerGas", {})
  if t == nil and TRANSPORT[terr.kind] then return nil, rpc_error(terr, url) end
  if t then
    tip = evm_tx.quantity(t)
    if not tip then return nil, fail("EVM_RPC_BAD_RESPONSE", "eth_maxPriorityFeePerGas answered " .. tostring(t)) end
  end
  -- a node without eth_maxPriorityFeePerGas (an rpc error): the median reward
  return evm_tx.fees({ base_fee_next = hist.base_fee_next, suggested_tip = tip,
                       rewards = hist.rewards, controls = controls })
end

local function receipt_block(receipt)
  return rpc.quantity(receipt.blockNumber)
end

local function receipt_refs(receipt)
  return {
    block_number = receipt_block(receipt),
    block_hash = type(receipt.blockHash) == "string" and receipt.blockHash or nil,
    gas_used = evm_tx.hex_to_dec(receipt.gasUsed),
    effective_gas_price = evm_tx.hex_to_dec(receipt.effectiveGasPrice),
  }
end

local function transfer_refs(row, extra)
  local refs = { tx_hash = row.tx_hash, chain_id = row.chain_id, from = row.address,
                 to = row.to_address, nonce = row.nonce, value_wei = row.value_wei,
                 nonce_reservation_id = row.id }
  for k, x in pairs(extra or {}) do refs[k] = x end
  return refs
end

-- chain_status(url, row) -> {state=, receipt=} with state one of
--   mined     mined with status 1          reverted  mined with status 0
--   pending   known to the node, not mined  dropped   unknown, nonce still free
--   taken     unknown, and the chain used the nonce for another transaction
-- or nil, err when the chain could not be asked.
function M.chain_status(url, row)
  local function from_receipt(r)
    -- a receipt is ours only when it names the hash we signed: an RPC that
    -- answers another transaction's receipt proves nothing of ours
    if type(r.transactionHash) ~= "string" or r.transactionHash:lower() ~= tostring(row.tx_hash):lower() then
      return nil, fail("EVM_RPC_BAD_RESPONSE", ("a receipt for %s answered the lookup of %s")
        :format(tostring(r.transactionHash):sub(1, 80), tostring(row.tx_hash)))
    end
    if not receipt_block(r) then return nil, fail("EVM_RPC_BAD_RESPONSE", "receipt without a block number") end
    if r.status == "0x1" then return { state = "mined", receipt = r } end
    if r.status == "0x0" then return { state = "reverted", receipt = r } end
    return nil, fail("EVM_RPC_BAD_RESPONSE", "receipt status " .. tostring(r.status))
  end
  local r, err = rpc.get_transaction_receipt(url, row.tx_hash)
  if r == nil then return nil, rpc_error(err, url) end
  if r then return from_receipt(r) end
  local tx
  tx, err = rpc.get_transaction_by_hash(url, row.tx_hash)
  if tx == nil then return nil, rpc_error(err, url) end
  if tx then
    if type(tx.hash) ~= "string" or tx.hash:lower() ~= tostring(row.tx_hash):lower() then
      return nil, fail("EVM_RPC_BAD_RESPONSE", ("a transaction %s answered the lookup of %s")
        :format(tostring(tx.hash):sub(1, 80), tostring(row.tx_hash)))
    end
    return { state = "pending" }
  end
  local count
  count, err = rpc.get_transaction_count(url, row.address, "latest")
  if not count then return nil, rpc_error(err, url) end
  if count <= row.nonce then return { state = "dropped" } end
  -- the nonce is used: ours after all (mined since the first look)?
  r, err = rpc.get_transaction_receipt(url, row.tx_hash)
  if r == nil then return nil, rpc_error(err, url) end
  if r then return from_receipt(r) end
  return { state = "taken", count = count }
end

-- ---- broadcasting --------------------------------------------------------------------

-- broadcast(url, row[, again]) -> status[, err]   (status: "sent",
-- "failed", "unknown", or "taken" with the chain's status when `again`
-- and the nonce reads as taken; err says why it is not "sent").  Sends the row's signed bytes; "already known" and
-- "nonce too low" are looked up by hash.  again: the bytes may already be
-- out (a rebroadcast of a dropped transaction): another node's mempool can
-- still hold and mine them, so a refusal of this send proves nothing about
-- them -- it is "unknown" (EVM_REBROADCAST_REFUSED) and the row keeps its
-- status; only the chain (their nonce used by another transaction) can say
-- they are dead.  Bytes a fill of qtg's was sent to void (qtg.evm_fill) are
-- not sent, first time or again: they would race the fill for the nonce.
function M.broadcast(url, row, again)
  local f = nonces.read_fill_at(row)
  if f then
    local why = string.format("fill %s (%s, %s) was sent at nonce %d of %s on chain %d to void transaction %s: "
      .. "its bytes are not sent; whichever transaction the chain mines at the nonce settles the node",
      tostring(f.id), f.tx_hash, f.status, row.nonce, row.address, row.chain_id, row.tx_hash)
    nonces.note(row.id, why)
    return "unknown", fail("EVM_NONCE_FILLED", why)
  end
  local h, err = rpc.send_raw_transaction(url, row.signed_raw_tx)
  if h then
    if h ~= row.tx_hash then
      nonces.note(row.id, "eth_sendRawTransaction answered hash " .. h)
      return "unknown", fail("EVM_RPC_BAD_RESPONSE", string.format(
        "eth_sendRawTransaction answered hash %s for transaction %s", h, row.tx_hash))
    end
    nonces.mark_broadcast(row.id)
    qtg.log.info("evm transaction broadcast", { tx_hash = row.tx_hash, chain_id = row.chain_id,
      from = row.address, nonce = row.nonce, request_node_id = row.request_node_id })
    return "sent"
  end
  local known, too_low = rpc.is_already_known(err), rpc.is_nonce_too_low(err)
  if known or too_low then
    local tx, lerr = rpc.get_transaction_by_hash(url, row.tx_hash)
    if tx == nil then return "unknown", rpc_error(lerr, url) end
    if tx then
      -- only our own transaction is ours (as chain_status checks it)
      if type(tx) ~= "table" or tx.hash ~= row.tx_hash then
        return "unknown", fail("EVM_RPC_BAD_RESPONSE", string.format(
          "eth_getTransactionByHash answered the lookup of %s with transaction %s", row.tx_hash,
          type(tx) == "table" and tostring(tx.hash) or type(tx)))
      end
      nonces.mark_broadcast(row.id)
      return "sent"
    end
    if too_low then
      local st, serr = M.chain_status(url, row)
      if not st then return "unknown", serr end
      if st.state ~= "taken" then return "sent" end
      -- bytes that may be out already: only a verdict that holds (taken())
      if again then return "taken", st end
      local why = string.format("nonce %d of %s on chain %d was used by another transaction; %s can never be mined",
        row.nonce, row.address, row.chain_id, row.tx_hash)
      nonces.surface(row.id, why, "nonce_taken")
      return "failed", fail("EVM_NONCE_TAKEN", why)
    end
    return "unknown", fail("EVM_BROADCAST_OUTCOME_UNKNOWN",
      "the node says it knows the transaction but cannot find it: " .. tostring(err))
  end
  if err.kind == "rpc" and again then
    local why = string.format("the RPC refused to rebroadcast transaction %s (nonce %d, still free on the chain): %s; "
      .. "the bytes may have been broadcast before and can still be mined", row.tx_hash, row.nonce,
      tostring(err.message))
    nonces.note(row.id, why)
    return "unknown", fail("EVM_REBROADCAST_REFUSED", why .. " (" .. M.redact(url) .. ")")
  end
  if rpc.is_tx_refused(err) then
    local why = string.format("the RPC refused transaction %s (nonce %d): %s", row.tx_hash, row.nonce,
      tostring(err.message))
    nonces.surface(row.id, why, "rejected")
    return "failed", fail("EVM_TX_REJECTED", why)
  end
  -- a transport failure, or a JSON-RPC error that does not refuse the
  -- bytes (a rate limit, an upstream error): recovery asks the chain and
  -- sends the same bytes again
  nonces.note(row.id, tostring(err))
  return "unknown", fail("EVM_BROADCAST_OUTCOME_UNKNOWN",
    "the broadcast may or may not have reached the node: " .. rpc_detail(err, url))
end

-- ---- the executor interface ------------------------------------------------------------

-- observe_target(config, intent) -> chain_id, tx_hash, or nil, err.
local function observe_target(config, intent)
  local chain_id = node_chain(config, intent)
  if not chain_id then return nil, fail("EVM_BAD_INTENT", "chain_id (node config or intent) is missing") end
  local h = rpc.check_hash(config.tx_hash, "transaction hash")
  if not h then
    return nil, fail("EVM_BAD_TX_HASH", "config.tx_hash is not a transaction hash: " .. tostring(config.tx_hash))
  end
  return chain_id, h
end

function M.preflight(ctx)
  if ctx.action_type ~= M.TRANSFER then
    local chain_id, terr = observe_target(ctx.node_config or {}, ctx.intent)
    if not chain_id then return refuse(terr) end
    local url, uerr = M.endpoint(chain_id)
    if not url then return refuse(uerr) end
    return { ok = true }
  end
  -- Bytes signed for this node before (a crash came between their send and
  -- its commit) may be on the chain already: nothing here may refuse the
  -- node then, for a refusal FAILs it with no side effect while the money
  -- moved.  The same bytes go out again (submit); funds were checked then.
  local cur = nonces.read(function(s) return nonces.for_node(s, ctx.request_node_id) end)
  if nonces.reusable_signed(cur) then return { ok = true } end
  local p, perr = M.plan(ctx)
  if not p then return refuse(perr) end
  local url, uerr = M.connect(p.chain_id)
  if not url then return refuse(uerr) end
  local count, err = rpc.get_transaction_count(url, p.from, "latest")
  if not count then return refuse(rpc_error(err, url)) end
  local backlog = nonces.read(function(s) return nonces.backlog(s, p.chain_id, p.from, count) end)
  if backlog.n >= p.controls.max_pending then
    return refuse(fail("EVM_NONCE_BACKLOG", string.format(
      "%d transactions of %s on chain %d are in flight from nonce %d (chain count %d, limit %d): later ones would queue behind them",
      backlog.n, p.from, p.chain_id, backlog.lowest, count, p.controls.max_pending)))
  end
  if backlog.gap >= 0 then
    -- a surfaced nonce the chain has not used: nothing in qtg sends it
    -- again, so a new transfer's nonce would wait behind it for ever
    return refuse(fail("EVM_NONCE_GAP", string.format(
      "nonce %d of %s on chain %d is surfaced and not used on the chain (count %d): a new transfer would wait "
        .. "behind it for ever; fill that nonce (at the console: fill_nonce(%d, '%s', %d); docs/evm.md, "
        .. "\"Filling a nonce\"), then retry",
      backlog.gap, p.from, p.chain_id, count, p.chain_id, p.from, backlog.gap)))
  end
  if backlog.ahead > 0 then
    return refuse(fail("EVM_NONCE_BOOKS_MISMATCH", string.format(
      "qtg's books say nonce %d of %s on chain %d was mined, but the chain's count is %d (a reset or different chain under this id?); reconcile evm_nonce_reservation before sending",
      backlog.ahead_nonce, p.from, p.chain_id, count)))
  end
  if backlog.top - count > p.controls.max_pending then
    -- the books are far ahead of the chain: a reset devnet, or rows of
    -- another chain under this id.  New nonces would never be mined.
    return refuse(fail("EVM_NONCE_BACKLOG", string.format(
      "qtg's reservations for %s on chain %d reach nonce %d but the chain's count is %d: the books and the chain disagree (a reset chain?); reconcile evm_nonce_reservation before sending",
      p.from, p.chain_id, backlog.top - 1, count)))
  end
  local fees, ferr = M.fee_data(url, p.controls)
  if not fees then return refuse(ferr) end
  local bal
  bal, err = rpc.request(url, "eth_getBalance", { p.from, "latest" })
  if bal == nil then return refuse(rpc_error(err, url)) end
  local balance = evm_tx.hex_to_dec(bal)
  if not balance then return refuse(fail("EVM_RPC_BAD_RESPONSE", "eth_getBalance answered " .. tostring(bal))) end
  local need = evm_tx.max_cost(p.controls.gas_limit, fees.max_fee_per_gas, p.value_wei)
  if evm_tx.cmp(balance, need) < 0 then
    return refuse(fail("EVM_INSUFFICIENT_FUNDS", string.format(
      "%s holds %s ETH on chain %d; the transfer needs up to %s ETH (%s ETH + gas %d x %d wei)",
      p.from, evm_tx.from_wei(balance), p.chain_id, evm_tx.from_wei(need),
      evm_tx.from_wei(p.value_wei), p.controls.gas_limit, fees.max_fee_per_gas)))
  end
  return { ok = true }
end

local function prepared_of(ctx, p, row)
  return {
    payload_format = M.PAYLOAD_FORMAT,
    payload = row.payload,
    payload_hash = row.payload_hash,
    action_type = ctx.action_type,
    signer_key = p.signer_key,
    evm = { reservation_id = row.id, fields = row.fields, from = p.from, chain_id = p.chain_id,
            nonce = row.nonce },
  }
end

function M.prepare(ctx)
  if ctx.action_type ~= M.TRANSFER then
    return { payload_format = "none", action_type = ctx.action_type }
  end
  -- Bytes signed for this node before go out again as they are: no plan,
  -- no RPC and no signer is asked (the signer refuses a reservation the
  -- reaper has since settled), so nothing fails a transfer that may have
  -- moved money; submit sends them.
  local cur = nonces.read(function(s) return nonces.for_node(s, ctx.request_node_id) end)
  if nonces.reusable_signed(cur) then
    local function text(v) return type(v) == "string" and v or nil end
    return { payload_format = M.PAYLOAD_FORMAT, payload = text(cur.payload), payload_hash = text(cur.payload_hash),
             action_type = ctx.action_type, evm = { reservation_id = cur.id, stored = true } }
  end
  -- a refusal raises its error: executors.call records it as
  -- EXECUTOR_ERROR with the detail "prepare raised: CODE: detail"
  local p, perr = M.plan(ctx)
  if not p then error(perr, 0) end
  local url, uerr = M.connect(p.chain_id)
  if not url then error(uerr, 0) end
  local count, err = rpc.get_transaction_count(url, p.from, "latest")
  if not count then error(rpc_error(err, url), 0) end
  local fees, ferr = M.fee_data(url, p.controls)
  if not fees then error(ferr, 0) end
  local row, how = nonces.reserve({ chain_id = p.chain_id, address = p.from,
      request_node_id = ctx.request_node_id, attempt_no = ctx.attempt_no, latest_count = count },
    function(nonce)
      local fields = evm_tx.fields({ chain_id = p.chain_id, nonce = nonce, to = p.to,
        value_wei = p.value_wei, gas_limit = p.controls.gas_limit, fees = fees })
      local tx = qtg.evm.eip1559(fields)
      return { fields = fields, payload = tx.payload, payload_hash = tx.signing_hash,
               to = p.to, value_wei = p.value_wei }
    end)
  qtg.log.info("evm nonce reserved", { request_node_id = ctx.request_node_id, chain_id = p.chain_id,
    from = p.from, nonce = row.nonce, how = how })
  return prepared_of(ctx, p, row)
end

local function poll(config)
  return (config and config.poll_seconds) or M.POLL_SECONDS
end

-- taken(row, st, waiting, cfg) -> the answer to a look that reads the
-- row's nonce as taken (st: chain_status's): FAILED EVM_NONCE_TAKEN once the
-- verdict holds (qtg.evm_nonces.look_taken), else the node waits in
-- `waiting`, its side effect kept, and is looked at again.
local function taken(row, st, waiting, cfg)
  local final, how = nonces.look_taken(row.id)
  local what = string.format("nonce %d of %s on chain %d was used by another transaction (chain count %d) "
    .. "and the RPC has no trace of %s", row.nonce, row.address, row.chain_id, st.count, row.tx_hash)
  if final then
    local why = string.format("%s: it can never be mined (%s)", what, how)
    nonces.surface(row.id, why, "nonce_taken")
    return { status = "FAILED", provider_refs = transfer_refs(row), error_code = "EVM_NONCE_TAKEN",
             error_detail = why }
  end
  return { status = waiting, side_effect = true, provider_refs = transfer_refs(row),
           error_code = "EVM_NONCE_TAKEN_UNCONFIRMED", error_detail = string.format(
             "as the RPC reads it, %s; not final: a lagging node answers the same for a mined transaction (%s)",
             what, how), retry_after_seconds = poll(cfg) }
end

-- send(row, first, cfg) -> submit's answer for the signed bytes of row,
-- sent now.  Bytes stored before this dispatch (a crash came between a send
-- and its commit) may be out already: a refusal of this send is then no
-- proof they are dead (UNKNOWN, as a refused rebroadcast), only on a first
-- send.
local function send(row, first, cfg)
  local refs = transfer_refs(row)
  local url, uerr = M.endpoint(row.chain_id)
  if not url then return answer("UNKNOWN", uerr, { provider_refs = refs, side_effect = true }) end
  local st, berr = M.broadcast(url, row, not first)
  if st == "sent" then
    return { status = "SUBMITTED", provider_refs = refs, side_effect = true,
             retry_after_seconds = poll(cfg) }
  elseif st == "taken" then
    return taken(row, berr, "SUBMITTED", cfg)
  elseif st == "failed" then
    return answer("FAILED", berr, { provider_refs = refs })
  end
  return answer("UNKNOWN", berr, { provider_refs = refs, side_effect = true })
end

-- resend(ctx, reservation_id, cfg): prepare found bytes signed for this
-- node before; they go out again as they are, never anything new.
local function resend(ctx, reservation_id, cfg)
  local row = nonces.read(function(s) return nonces.by_id(s, reservation_id) end)
  if not row or row.request_node_id ~= ctx.request_node_id or not nonces.reusable_signed(row) then
    return { status = "UNKNOWN", side_effect = true, error_code = "EVM_RESERVATION_LOST", error_detail =
      string.format("the bytes signed for this node (reservation %s) are no longer there to send again; "
        .. "recovery settles the node from the chain", tostring(reservation_id)) }
  end
  qtg.log.info("evm transaction sent again", { tx_hash = row.tx_hash, chain_id = row.chain_id,
    request_node_id = row.request_node_id, nonce = row.nonce, status = row.status })
  return send(row, false, cfg)
end

function M.submit(ctx, submission)
  local cfg = ctx.node_config or {}
  if ctx.action_type ~= M.TRANSFER then
    local chain_id, tx_hash = observe_target(cfg, ctx.intent)
    if not chain_id then return answer("FAILED", tx_hash) end   -- tx_hash: the error
    return { status = "SUBMITTED", retry_after_seconds = 0,
             provider_refs = { tx_hash = tx_hash, chain_id = chain_id } }
  end
  local ev = submission.prepared and submission.prepared.evm
  if type(ev) == "table" and ev.stored then return resend(ctx, ev.reservation_id, cfg) end
  local sig = submission.signature
  if type(ev) ~= "table" or type(sig) ~= "table" then
    return { status = "FAILED", error_code = "EVM_NOT_SIGNED",
             error_detail = "submit needs the prepared transaction and its signature" }
  end
  local ok, signed = pcall(qtg.evm.eip1559, ev.fields, sig)
  if not ok then
    return { status = "FAILED", error_code = "EVM_ENCODING_FAILED", error_detail = tostring(signed) }
  end
  if signed.from ~= ev.from then
    return { status = "FAILED", error_code = "EVM_SIGNER_ADDRESS_MISMATCH", error_detail = string.format(
      "the signature recovers to %s, the transaction is from %s", tostring(signed.from), ev.from) }
  end
  local row, why, first = nonces.store_signed(ev.reservation_id, ctx.request_node_id, signed.raw, signed.tx_hash)
  if not row then
    return { status = "FAILED", error_code = "EVM_RESERVATION_LOST", error_detail = why }
  end
  return send(row, first, cfg)
end

-- The reservation behind a transfer node: by the transaction hash it
-- reported, else by the node.
local function transfer_row(octx)
  local refs = octx.provider_refs or {}
  return nonces.read(function(s)
    local row = type(refs.tx_hash) == "string" and nonces.by_tx_hash(s, refs.tx_hash) or nil
    return row or nonces.for_node(s, octx.request_node_id)
  end)
end

-- settle(url, row, pending_status) -> an observe/recover answer from the
-- chain's view of the row's transaction.
local function settle(url, row, pending_status, cfg)
  local st, serr = M.chain_status(url, row)
  if not st then return answer("UNKNOWN", serr) end
  if st.state == "mined" then
    local r = receipt_refs(st.receipt)
    nonces.mark_mined(row.id, r.block_number, true)
    return { status = "COMPLETED", side_effect = true, provider_refs = transfer_refs(row, r),
             artifacts = { { kind = "evm_receipt", tx_hash = row.tx_hash, status = 1,
                             block_number = r.block_number, block_hash = r.block_hash,
                             gas_used = r.gas_used } } }
  elseif st.state == "reverted" then
    local r = receipt_refs(st.receipt)
    nonces.mark_mined(row.id, r.block_number, false)
    return { status = "FAILED", side_effect = true, provider_refs = transfer_refs(row, r),
             error_code = "EVM_TX_REVERTED", error_detail = string.format(
               "transaction %s was mined in block %d with status 0 (reverted): no value moved, gas %s was paid",
               row.tx_hash, r.block_number, tostring(r.gas_used)) }
  elseif st.state == "pending" then
    nonces.clear_taken(row)
    return { status = pending_status, side_effect = true, provider_refs = transfer_refs(row),
             retry_after_seconds = poll(cfg) }
  elseif st.state == "taken" then
    return taken(row, st, pending_status, cfg)
  end
  nonces.clear_taken(row)
  -- dropped: the node forgot it and the nonce is free: the same bytes again.
  -- They were handed to an RPC before (a row holds bytes only once submit
  -- was about to send them), so they may sit in another node's mempool and
  -- be mined later: a refused rebroadcast leaves the node UNKNOWN with its
  -- side effect (the operator decides; recovery keeps asking the chain).
  -- FAILED only when the chain proves them dead (EVM_NONCE_TAKEN).
  local b, berr = M.broadcast(url, row, true)
  if b == "sent" then
    return { status = pending_status, side_effect = true, provider_refs = transfer_refs(row),
             retry_after_seconds = poll(cfg) }
  elseif b == "taken" then
    return taken(row, berr, pending_status, cfg)
  end
  return answer("UNKNOWN", berr, { side_effect = true, provider_refs = transfer_refs(row) })
end

local function observe_transfer(octx, pending_status)
  local row = transfer_row(octx)
  if not row then
    return { status = pending_status == "SUBMITTED" and "FAILED" or "UNKNOWN",
             error_code = "EVM_NOT_SIGNED",
             error_detail = "no nonce reservation for this node: nothing was signed or broadcast" }
  end
  if not row.signed_raw_tx then
    if pending_status == "SUBMITTED" then   -- recover: it was never signed, so never sent
      nonces.release(row.id, "released by evm_transfer recover: the node never signed it")
      return { status = "FAILED", error_code = "EVM_NOT_BROADCAST", error_detail = string.format(
        "nonce %d was reserved but nothing was signed: no transaction exists", row.nonce) }
    end
    return { status = "UNKNOWN", error_code = "EVM_NOT_BROADCAST",
             error_detail = "the node's reservation holds no signed transaction" }
  end
  -- the endpoint must still serve the transfer's chain: judged against
  -- another chain, a live transaction could look dead (settle)
  local url, uerr = M.connect(row.chain_id)
  if not url then return answer("UNKNOWN", uerr) end
  return settle(url, row, pending_status, octx.node_config)
end

local function observe_chain(octx, recovering)
  local cfg = octx.node_config or {}
  local chain_id, tx_hash = observe_target(cfg, octx.intent)
  if not chain_id then return answer("FAILED", tx_hash) end   -- tx_hash: the error
  local url, uerr = M.connect(chain_id)
  if not url then return answer("UNKNOWN", uerr) end
  local r, err = rpc.get_transaction_receipt(url, tx_hash)
  if r == nil then return answer("UNKNOWN", rpc_error(err, url)) end
  if recovering then return { status = "SUBMITTED" } end   -- the chain answers again: observe anew
  if not r then return { status = "OBSERVING", retry_after_seconds = poll(cfg) } end
  local block = receipt_block(r)
  if not block or (r.status ~= "0x1" and r.status ~= "0x0") then
    return { status = "UNKNOWN", error_code = "EVM_RPC_BAD_RESPONSE", error_detail = "malformed receipt for " .. tx_hash }
  end
  if type(r.transactionHash) ~= "string" or r.transactionHash:lower() ~= tx_hash:lower() then
    return { status = "UNKNOWN", error_code = "EVM_RPC_BAD_RESPONSE", error_detail = ("a receipt for %s answered "
      .. "the lookup of %s"):format(tostring(r.transactionHash):sub(1, 80), tx_hash) }
  end
  if r.status == "0x0" then
    return { status = "FAILED", error_code = "EVM_TX_REVERTED",
             error_detail = string.format("transaction %s was mined in block %d with status 0 (reverted)", tx_hash, block) }
  end
  if octx.action_type == M.RECEIVE then
    if cfg.verify_intent then
      local intent = octx.intent or {}
      local tx
      tx, err = rpc.get_transaction_by_hash(url, tx_hash)
      if not tx then
        return answer("UNKNOWN", tx == nil and rpc_error(err, url)
          or fail("EVM_RPC_BAD_RESPONSE", "receipt without transaction"))
      end
      if type(tx.hash) ~= "string" or tx.hash:lower() ~= tx_hash:lower() then
        return answer("UNKNOWN", fail("EVM_RPC_BAD_RESPONSE", ("a transaction %s answered the lookup of %s")
          :format(tostring(tx.hash):sub(1, 80), tx_hash)))
      end
      local want_to = rpc.check_address(intent.destination)
      local want_value = evm_tx.to_wei(intent.amount)
      local got_value = evm_tx.hex_to_dec(tx.value)
      if type(tx.to) ~= "string" or tx.to:lower() ~= want_to or got_value ~= want_value then
        return { status = "FAILED", error_code = "EVM_RECEIVE_MISMATCH", error_detail = string.format(
          "transaction %s sent %s wei to %s; the intent says %s wei to %s", tx_hash, tostring(got_value),
          tostring(tx.to), tostring(want_value), tostring(want_to)) }
      end
    end
    return { status = "COMPLETED", provider_refs = { received_block = block, received_tx_hash = tx_hash } }
  end
  local latest
  latest, err = rpc.block_number(url)
  if not latest then return answer("UNKNOWN", rpc_error(err, url)) end
  local conf = evm_tx.confirmations(block, latest)
  if conf >= (cfg.confirmations or 1) then
    return { status = "COMPLETED", provider_refs = { confirmations = conf, final_block = block,
                                                     final_checked_at_block = latest },
             artifacts = { { kind = "evm_finality", tx_hash = tx_hash, block_number = block,
                             confirmations = conf } } }
  end
  return { status = "OBSERVING", retry_after_seconds = poll(cfg) }
end

function M.observe(octx)
  if octx.action_type == M.TRANSFER then return observe_transfer(octx, "OBSERVING") end
  return observe_chain(octx, false)
end

-- recover: UNKNOWN (or SUBMITTING) nodes, decided from the chain.
function M.recover(octx)
  if octx.action_type == M.TRANSFER then return observe_transfer(octx, "SUBMITTED") end
  return observe_chain(octx, true)
end

-- sent_before: a transfer node holds signed bytes that are not dead (a
-- dispatch lost after their send, a retried UNKNOWN transfer): they may be
-- on the chain whatever the node's state says.
function M.sent_before(octx)
  if octx.action_type ~= M.TRANSFER then return false end
  return nonces.reusable_signed(nonces.read(function(s) return nonces.for_node(s, octx.request_node_id) end))
end

-- health(): every configured endpoint answers eth_chainId with its chain.
function M.health()
  local eps, why, n = rpc.endpoints(qtg.settings.evm_rpc_urls or "")
  if not eps then return { state = "down", detail = why } end
  if (n or 0) == 0 then return { state = "down", detail = "no EVM RPC endpoints (MG_EVM_RPC_URLS is empty)" } end
  local ids = {}
  for id in pairs(eps) do ids[#ids + 1] = id end
  table.sort(ids)
  local good, parts = 0, {}
  for _, id in ipairs(ids) do
    local got, err = rpc.chain_id(eps[id], { timeout = M.HEALTH_TIMEOUT })
    if got == id then
      good = good + 1
      parts[#parts + 1] = string.format("chain %d ok (%s)", id, M.redact(eps[id]))
    elseif got then
      parts[#parts + 1] = string.format("chain %d: EVM_CHAIN_ID_MISMATCH, %s serves chain %d", id, M.redact(eps[id]), got)
    else
      parts[#parts + 1] = string.format("chain %d: %s, %s", id, M.rpc_code(err), rpc_detail(err, eps[id]))
    end
  end
  local state = good == #ids and "healthy" or (good > 0 and "degraded" or "down")
  return { state = state, detail = table.concat(parts, "; ") }
end

return M
