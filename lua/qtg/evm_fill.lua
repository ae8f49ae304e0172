-- qtg.evm_fill: fill a nonce -- a transfer of nothing from a signer key's
-- address to itself, signed by qtg's signer at a nonce it granted a
-- transfer at, and sent -- so that, once it is mined, whatever else was
-- signed at that nonce never is, and the sender's later transfers no
-- longer wait behind it (docs/evm.md, "Filling a nonce").  A fill above
-- the chain's count waits in the pools behind the nonces before it, and a
-- pool may drop it: the answer says so (queued_behind), and fill_nonce
-- again sends a new one.  The operator's way out of EVM_NONCE_GAP and
-- EVM_TX_REJECTED, and the way to void a grant `qtgd audit verify` lists
-- as not settled, without taking the key out of the signer.
--   fill(args, principal) -> {tx_hash=, chain_id=, sender=, nonce=,
--     sent=, queued_behind= (nonces before it not yet mined, or nil), ...}
--     args: {chain_id=, sender=, nonce=, signature=, cancel=}; signature: the
--     person's signature of the fill statement (`qtgd approver sign-fill`),
--     which a signer with an enrolment asks for.
-- What binds the signature is the signer's (qtg_signerd.c, FILL): this
-- module picks the fees and sends the bytes.
local qtg = require("qtg")
local errors = require("qtg.errors")
local rpc = require("qtg.evm_rpc")
local evm_tx = require("qtg.evm_tx")
local outbox = require("qtg.outbox")

local M = {}

M.GAS_LIMIT = 21000
-- Bytes already stored at the nonce may be in a pool: a node replaces them
-- only for fees at least 10 % higher, so a fill asks 25 % more than they
-- did (within the plan's caps).
M.REPLACE_PERCENT = 125

-- The transfer the signer's log shows granted at the nonce, with the plan
-- caps it was signed under (what the signer checks the fill against).
-- With it, what the daemon's rows say of that transfer (audit_grants.in_flight).
local GRANT_SQL = [[
  SELECT e.signer_key, e.request_id::text AS request_id, m.network_class, pv.risk_controls,
         n.node_state, n.node_key, r.status AS reservation, r.payload_hash = e.payload_hash AS same_payload
    FROM signer_events e
    LEFT JOIN movement_requests m ON m.id = e.request_id
    LEFT JOIN plan_versions pv ON pv.id = m.plan_version_id
    LEFT JOIN movement_request_nodes n ON n.id = e.request_node_id
    LEFT JOIN evm_nonce_reservation r ON r.chain_id = e.chain_id AND r.address = e.signer_address
                                     AND r.nonce = e.nonce
   WHERE e.decision = 'granted' AND e.request_id IS NOT NULL AND e.chain_id = $1
     AND e.signer_address = $2 AND e.nonce = $3
   ORDER BY e.id DESC LIMIT 1]]

-- The fees of the bytes stored at the nonce, if any were.
local STORED_SQL = [[
  SELECT t.fields FROM evm_nonce_reservation r JOIN evm_transfer_tx t ON t.reservation_id = r.id
   WHERE r.chain_id = $1 AND r.address = $2 AND r.nonce = $3 AND t.fields IS NOT NULL
   ORDER BY r.id DESC LIMIT 1]]

local function refuse(kind, fmt, ...) errors.raise(kind, fmt, ...) end

local function whole(v, least, what)
  if type(v) == "string" and v:match("^%d+$") then v = tonumber(v) end
  if type(v) ~= "number" or v ~= math.floor(v) or v < least or v >= 2 ^ 53 then
    refuse("usage", "%s must be a whole number from %d, got %s", what, least, tostring(v))
  end
  return v
end

-- check(args) -> chain_id, sender (lowercase), nonce, signature | raises usage.
local function check(args)
  if type(args) ~= "table" then
    refuse("usage", "fill takes {chain_id=, sender=, nonce=, signature=, cancel=}")
  end
  if args.cancel ~= nil and type(args.cancel) ~= "boolean" then refuse("usage", "cancel must be true or false") end
  local chain_id = whole(args.chain_id, 1, "chain_id")
  local sender, why = rpc.check_address(args.sender)
  if not sender then refuse("usage", "sender: %s", why) end
  local nonce = whole(args.nonce, 0, "nonce")
  local sig = args.signature
  if sig ~= nil and (type(sig) ~= "string" or not sig:match("^%x+$") or #sig ~= 128) then
    refuse("usage", "signature must be the 128 hex digits `qtgd approver sign-fill` printed")
  end
  return chain_id, sender, nonce, sig and sig:lower() or nil
end

-- bumped(fees, stored, controls): fees raised to REPLACE_PERCENT of the
-- stored transaction's, never past the caps.
local function bumped(fees, stored, controls)
  if type(stored) ~= "table" then return fees end
  local out = { max_fee_per_gas = fees.max_fee_per_gas, max_priority_fee_per_gas = fees.max_priority_fee_per_gas }
  for field, cap in pairs({ max_fee_per_gas = controls.max_fee_per_gas,
                            max_priority_fee_per_gas = controls.max_priority_fee_per_gas }) do
    local was = tonumber(stored[field])
    if was then
      local want = math.ceil(was * M.REPLACE_PERCENT / 100)
      if want > out[field] then out[field] = math.min(want, cap) end
    end
  end
  if out.max_priority_fee_per_gas > out.max_fee_per_gas then out.max_priority_fee_per_gas = out.max_fee_per_gas end
  return out
end

function M.fill(args, principal)
  local chain_id, sender, nonce, sig = check(args)
  local actor = type(principal) == "table" and principal.actor or principal
  if type(actor) ~= "string" or actor == "" then refuse("usage", "fill needs the principal who asks") end
  local grant, stored = qtg.db.with_session(function(s)
    return s:query(GRANT_SQL, chain_id, sender, nonce)[1], s:query(STORED_SQL, chain_id, sender, nonce)[1]
  end)
  if not grant then
    refuse("not_found", "the signer granted no transfer at nonce %d on chain %d from %s: only such a nonce is "
      .. "filled", nonce, chain_id, sender)
  end
  -- a daemon fills its own class's nonces: one signer may serve several
  if grant.network_class ~= qtg.settings.network_class then
    refuse("forbidden", "the transfer granted at nonce %d on chain %d from %s is of network class %s, and this "
      .. "daemon serves %s: fill it from a daemon of that class", nonce, chain_id, sender,
      tostring(grant.network_class), tostring(qtg.settings.network_class))
  end
  -- a live payment is cancelled only when asked to be
  if require("qtg.audit_grants").in_flight(grant) and args.cancel ~= true then
    refuse("illegal_transition", "the transfer at nonce %d on chain %d from %s (node %s of request %s) is %s on its "
      .. "own signed bytes: a fill would cancel a live payment; ask with cancel = true to do that", nonce, chain_id,
      sender, tostring(grant.node_key), grant.request_id, tostring(grant.node_state))
  end
  local controls, cwhy = evm_tx.controls(grant.risk_controls)
  if not controls then refuse("invalid", "the granted transfer's plan: %s", tostring(cwhy)) end
  local transfer = require("qtg.executors.evm_transfer")
  local url, uerr = transfer.connect(chain_id)
  if not url then refuse("unavailable", "%s", errors.text(uerr)) end
  local count, nerr = rpc.get_transaction_count(url, sender, "latest")
  if not count then refuse("unavailable", "eth_getTransactionCount: %s", errors.text(nerr)) end
  if count > nonce then
    refuse("illegal_transition", "nonce %d of %s on chain %d is used already (the chain's count is %d): "
      .. "nothing to fill", nonce, sender, chain_id, count)
  end
  local fees, ferr = transfer.fee_data(url, controls)
  if not fees then refuse("unavailable", "fees: %s", errors.text(ferr)) end
  fees = bumped(fees, stored and stored.fields, controls)
  local fields = evm_tx.fields({ chain_id = chain_id, nonce = nonce, to = sender, value_wei = "0",
                                 gas_limit = M.GAS_LIMIT, fees = fees })
  local tx = qtg.evm.eip1559(fields)
  local signature, serr = qtg.signer.fill(grant.signer_key, { payload = tx.payload, principal = actor,
                                                              signature = sig })
  if not signature then
    refuse(serr.kind == "signer" and "forbidden" or "unavailable", "the signer: %s%s",
      serr.code and (serr.code .. ": ") or "", tostring(serr.message))
  end
  local signed = qtg.evm.eip1559(fields, signature)
  if signed.from ~= sender then
    refuse("invalid", "the signature recovers to %s, not the sender %s", tostring(signed.from), sender)
  end
  local result = { tx_hash = signed.tx_hash, chain_id = chain_id, sender = sender, nonce = nonce,
                   max_fee_per_gas = fields.max_fee_per_gas,
                   max_priority_fee_per_gas = fields.max_priority_fee_per_gas, request_id = grant.request_id,
                   -- a nonce above the chain's count waits in the pools, which may drop it: it
                   -- voids the bytes at its nonce only once mined
                   queued_behind = count < nonce and (nonce - count) or nil }
  -- recorded before it is sent, with its bytes: a fill is never out
  -- without its audit row, and can be sent again as it is
  qtg.db.with_session(function(s)
    outbox.audit(s, actor, "evm.fill", "evm_nonce", string.format("%d/%s/%d", chain_id, sender, nonce),
      grant.request_id, { tx_hash = signed.tx_hash, raw = signed.raw, chain_id = chain_id, sender = sender,
                          nonce = nonce, max_fee_per_gas = fields.max_fee_per_gas,
                          max_priority_fee_per_gas = fields.max_priority_fee_per_gas,
                          chain_count = count })
  end)
  local sent, err = rpc.send_raw_transaction(url, signed.raw)
  result.sent = sent ~= nil or rpc.is_already_known(err)
  qtg.log.warn("evm nonce filled", { chain_id = chain_id, from = sender, nonce = nonce, tx_hash = signed.tx_hash,
    sent = result.sent, queued_behind = result.queued_behind, actor = actor,
    error = not result.sent and errors.text(err) or nil })
  if not result.sent then
    refuse("unavailable", "the fill %s was signed, and %s: %s (its raw bytes, in the audit row evm.fill too: %s)",
      signed.tx_hash, rpc.is_tx_refused(err) and "the RPC refused it"
        or "whether the RPC took it is not known (look the hash up before filling again)",
      errors.text(err), signed.raw)
  end
  return result
end

return M
