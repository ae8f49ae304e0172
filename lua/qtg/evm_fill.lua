-- qtg.evm_fill: fill a nonce -- a transfer of nothing from a signer key's
-- address to itself, signed by qtg's signer at a nonce it granted a
-- transfer at, and sent -- so that, once it is mined, whatever else was
-- signed at that nonce never is, and the sender's later transfers no
-- longer wait behind it (docs/evm.md, "Filling a nonce").  The operator's
-- way out of EVM_NONCE_GAP and EVM_TX_REJECTED, and the way to void a
-- grant `qtgd audit verify` lists as not settled, without taking the key
-- out of the signer.
--   fill(args, principal) -> {tx_hash=, chain_id=, sender=, nonce=,
--     sent=, queued_behind= (nonces before it not yet mined, or nil), ...}
--     args: {chain_id=, sender=, nonce=, signature=, cancel=}; signature: the
--     person's signature of the fill statement (`qtgd approver sign-fill`),
--     which a signer with an enrolment asks for.
-- A fill voids the bytes at its nonce only once mined, and a pool may drop
-- it (one above the chain's count waits behind the nonces before it), so
-- it is written to evm_fills (sql/0208) with its bytes before they are
-- sent, and evm_nonce_reaper watches it (M.WATCH_SQL, M.watch): mined;
-- sent again, the same bytes, while the node has lost them; replaced by
-- another fill mined at the nonce; taken, when the chain used the nonce for
-- a transaction that is none of qtg's fills (operators are alerted: maybe
-- the very bytes it was to void); dropped, when the RPC refuses it.
-- What binds the signature is the signer's (qtg_signerd.c, FILL): this
-- module picks the fees and sends the bytes.
local qtg = require("qtg")
local canon = require("qtg.canon_json")
local errors = require("qtg.errors")
local rpc = require("qtg.evm_rpc")
local evm_tx = require("qtg.evm_tx")
local outbox = require("qtg.outbox")
local nonces = require("qtg.evm_nonces")
local notify = require("qtg.notifications")

local M = {}

M.GAS_LIMIT = 21000
-- Bytes already stored at the nonce (the transfer's, or an earlier fill's)
-- may be in a pool: a node replaces them only for fees at least 10 %
-- higher, so a fill asks 25 % more than they did (within the plan's caps).
-- Where the daemon's rows hold no fees of the transfer granted there (the
-- bytes were kept off the rows, or their write was lost), the fill bids
-- the caps: the kept bytes may bid them too.
M.REPLACE_PERCENT = 125

-- The transfer the signer's log shows granted at the nonce, with the plan
-- caps it was signed under (what the signer checks the fill against).
-- With it, what the daemon's rows say of that transfer (audit_grants.in_flight).
local GRANT_SQL = [[
  SELECT e.signer_key, e.request_id::text AS request_id, m.network_class, pv.risk_controls,
         n.node_state, n.node_key, r.status AS reservation, r.payload_hash = e.payload_hash AS same_payload,
         (SELECT max((pn.config->>'confirmations')::int) FROM plan_nodes pn
           WHERE pn.plan_version_id = m.plan_version_id
             AND pn.config->>'confirmations' ~ '^[1-9][0-9]{0,5}$') AS confirmations
    FROM signer_events e
    LEFT JOIN movement_requests m ON m.id = e.request_id
    LEFT JOIN plan_versions pv ON pv.id = m.plan_version_id
    LEFT JOIN movement_request_nodes n ON n.id = e.request_node_id
    LEFT JOIN evm_nonce_reservation r ON r.chain_id = e.chain_id AND r.address = e.signer_address
                                     AND r.nonce = e.nonce
   WHERE e.decision = 'granted' AND e.request_id IS NOT NULL AND e.chain_id = $1
     AND e.signer_address = $2 AND e.nonce = $3
   ORDER BY e.id DESC LIMIT 1]]

-- The fees of the bytes stored at the nonce: the transfer's (kind
-- 'transfer'), and the fills' still sent.
local STORED_SQL = [[
  (SELECT 'transfer' AS kind, t.fields FROM evm_nonce_reservation r JOIN evm_transfer_tx t ON t.reservation_id = r.id
    WHERE r.chain_id = $1 AND r.address = $2 AND r.nonce = $3 AND t.fields IS NOT NULL
    ORDER BY r.id DESC LIMIT 1)
  UNION ALL
  SELECT 'fill', jsonb_build_object('max_fee_per_gas', f.max_fee_per_gas::text,
                                    'max_priority_fee_per_gas', f.max_priority_fee_per_gas::text)
    FROM evm_fills f
   WHERE f.chain_id = $1 AND f.address = $2 AND f.nonce = $3 AND f.status = 'sent']]

-- The row, or the one already watching these very bytes (fresh = false).
local INSERT_SQL = [[
  INSERT INTO evm_fills (chain_id, address, nonce, tx_hash, payload_hash, signed_raw_tx, max_fee_per_gas,
                         max_priority_fee_per_gas, request_id, actor, confirmations)
  VALUES ($1, $2, $3, $4, $5, $6, $7::numeric, $8::numeric, $9::uuid, $10, $11)
  ON CONFLICT (tx_hash) WHERE status = 'sent' DO UPDATE SET last_checked_at = evm_fills.last_checked_at
  RETURNING id, xmax = 0 AS fresh]]

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

-- bumped(fees, stored, controls): fees raised to REPLACE_PERCENT of every
-- stored transaction's (stored: rows of STORED_SQL), never past the caps;
-- the caps when no transfer's fees are stored.
local function bumped(fees, stored, controls)
  local known = false
  for _, row in ipairs(stored) do known = known or row.kind == "transfer" end
  if not known then
    return { max_fee_per_gas = controls.max_fee_per_gas, max_priority_fee_per_gas = controls.max_priority_fee_per_gas }
  end
  local out = { max_fee_per_gas = fees.max_fee_per_gas, max_priority_fee_per_gas = fees.max_priority_fee_per_gas }
  for _, row in ipairs(stored) do
    for field, cap in pairs({ max_fee_per_gas = controls.max_fee_per_gas,
                              max_priority_fee_per_gas = controls.max_priority_fee_per_gas }) do
      local was = type(row.fields) == "table" and tonumber(row.fields[field])
      if was then
        local want = math.ceil(was * M.REPLACE_PERCENT / 100)
        if want > out[field] then out[field] = math.min(want, cap) end
      end
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
    return s:query(GRANT_SQL, chain_id, sender, nonce)[1], s:query(STORED_SQL, chain_id, sender, nonce)
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
  fees = bumped(fees, stored, controls)
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
  -- without its row and its audit row, and is sent again as it is; the
  -- same bytes twice (fees at the caps both times) are the one row
  local confirmations = tonumber(grant.confirmations)
  if not confirmations or confirmations < 1 or confirmations ~= math.floor(confirmations) then confirmations = 1 end
  local row = qtg.db.with_session(function(s)
    return s:transaction(function()
      outbox.audit(s, actor, "evm.fill", "evm_nonce", string.format("%d/%s/%d", chain_id, sender, nonce),
        grant.request_id, { tx_hash = signed.tx_hash, raw = signed.raw, chain_id = chain_id, sender = sender,
                            nonce = nonce, max_fee_per_gas = fields.max_fee_per_gas,
                            max_priority_fee_per_gas = fields.max_priority_fee_per_gas,
                            chain_count = count })
      return s:query(INSERT_SQL, chain_id, sender, nonce, signed.tx_hash, tx.signing_hash, signed.raw,
        fields.max_fee_per_gas, fields.max_priority_fee_per_gas, grant.request_id, actor, confirmations)[1]
    end)
  end)
  result.fill_id = row.id
  local sent, err = rpc.send_raw_transaction(url, signed.raw)
  result.sent = sent ~= nil or rpc.is_already_known(err)
  -- refused bytes are dropped, unless an earlier call's row watches them
  -- (they may be in a pool already): the reaper settles that one
  if not result.sent and rpc.is_tx_refused(err) and row.fresh then
    qtg.db.with_session(function(s)
      s:transaction(function()
        local reason = "refused at its first send: " .. errors.text(err)
        s:query([[UPDATE evm_fills SET status = 'dropped', settled_at = clock_timestamp(), last_error = $2
                   WHERE id = $1 AND status = 'sent']], row.id, reason)
        outbox.audit(s, actor, "evm.fill_dropped", "evm_nonce", string.format("%d/%s/%d", chain_id, sender, nonce),
          grant.request_id, { fill_id = row.id, tx_hash = signed.tx_hash, reason = reason })
      end)
    end)
  end
  qtg.log.warn("evm nonce filled", { chain_id = chain_id, from = sender, nonce = nonce, tx_hash = signed.tx_hash,
    sent = result.sent, queued_behind = result.queued_behind, actor = actor,
    error = not result.sent and errors.text(err) or nil })
  if not result.sent then
    refuse("unavailable", "the fill %s was signed, and %s: %s (its raw bytes, in the audit row evm.fill too: %s)",
      signed.tx_hash, rpc.is_tx_refused(err) and "the RPC refused it"
        or "whether the RPC took it is not known (evm_nonce_reaper looks it up, and sends it again if the node "
          .. "lost it)",
      errors.text(err), signed.raw)
  end
  return result
end

-- ---- the watch (evm_nonce_reaper's fills arm) ----------------------------------------

-- The claim: fills still sent, untouched for $1 seconds, of chains $2, least
-- recently looked at first, at most $3, leased for $4 seconds to owner $5
-- (the reaper's other arms' form).  kind = 'fill' tells the reaper's rows apart.
M.WATCH_SQL = nonces.leased{ table = "evm_fills",
  where = "status = 'sent' AND coalesce(last_checked_at, created_at) < now() - make_interval(secs => $1)",
  order = "coalesce(last_checked_at, created_at) ASC",
  returning = "r.id, r.chain_id, r.address, r.nonce, r.tx_hash, r.signed_raw_tx, r.request_id::text AS request_id, "
    .. "r.rebroadcasts, r.nonce_taken_since, r.confirmations, 'fill' AS kind" }

local NOTE_SQL = [[
UPDATE evm_fills
   SET last_error = $2, last_checked_at = clock_timestamp(), reap_lease_until = NULL, reap_lease_owner = NULL
 WHERE id = $1 AND reap_lease_owner = $3]]

local SETTLE_SQL = [[
UPDATE evm_fills
   SET status = $2, mined_block = $3, last_error = $4, settled_at = clock_timestamp(),
       last_checked_at = clock_timestamp(), reap_lease_until = NULL, reap_lease_owner = NULL
 WHERE id = $1 AND status = 'sent' AND reap_lease_owner = $5
RETURNING id]]

local LOOK_TAKEN_SQL = [[
UPDATE evm_fills
   SET nonce_taken_since = coalesce(nonce_taken_since, clock_timestamp()), nonce_taken_looks = nonce_taken_looks + 1
 WHERE id = $1 AND reap_lease_owner = $2
RETURNING nonce_taken_looks AS looks, extract(epoch FROM clock_timestamp() - nonce_taken_since)::float8 AS seconds]]

local CLEAR_TAKEN_SQL = [[
UPDATE evm_fills SET nonce_taken_since = NULL, nonce_taken_looks = 0
 WHERE id = $1 AND reap_lease_owner = $2 AND nonce_taken_since IS NOT NULL]]

-- The transfers' signed bytes the daemon holds at the row's nonce.
local KEPT_SQL = [[
SELECT tx_hash FROM evm_nonce_reservation
 WHERE chain_id = $1 AND address = $2 AND nonce = $3 AND tx_hash IS NOT NULL]]

-- The other fills at the row's nonce that may have been mined: a dropped
-- one's bytes were refused by a node, yet another pool may hold them.
local SIBLINGS_SQL = [[
SELECT id, tx_hash, status FROM evm_fills
 WHERE chain_id = $1 AND address = $2 AND nonce = $3 AND id <> $4 AND status IN ('sent', 'mined', 'dropped')
 ORDER BY id]]

local function clip(v) return canon.excerpt(v, 500) end

local function entity(row) return string.format("%d/%s/%d", row.chain_id, row.address, row.nonce) end

local function request_of(row) return row.request_id ~= qtg.db.NULL and row.request_id or nil end

-- note(s, row, owner, text): what the look saw, the lease dropped.
function M.note(s, row, owner, text)
  s:query(NOTE_SQL, row.id, clip(text), owner)
  qtg.log.info("fill watched", { fill_id = row.id, chain_id = row.chain_id, from = row.address,
    nonce = row.nonce, note = clip(text) })
end

-- surface(s, row, kind, detail): the operators hear of it (a critical
-- notification, once per fill, and the request's request_attention callback).
local function surface(s, row, kind, detail)
  notify.surface(s, { worker = "evm_nonce_reaper", kind = kind, dedupe_key = kind .. ":" .. tostring(row.id),
    entity_type = "evm_nonce", entity_id = entity(row), request_id = request_of(row), data = detail,
    severity = "critical" })
end

-- settle(s, row, owner, to, t): the final status with its audit row; a
-- nonce taken by another transaction is the operators' to hear of.
local function settle(s, row, owner, to, t)
  s:transaction(function()
    if not s:query(SETTLE_SQL, row.id, to, t.block or qtg.db.NULL, t.reason and clip(t.reason) or qtg.db.NULL,
                   owner)[1] then
      return
    end
    local detail = { fill_id = row.id, chain_id = row.chain_id, sender = row.address, nonce = row.nonce,
                     tx_hash = row.tx_hash, status = to, block = t.block, reason = t.reason }
    if to == "taken" then
      surface(s, row, "fill_nonce_taken", detail)
    else
      outbox.audit(s, "system:evm_nonce_reaper", "evm.fill_" .. to, "evm_nonce", entity(row), request_of(row),
        detail)
    end
  end)
  local log = to == "mined" and qtg.log.info or qtg.log.warn
  log("fill " .. to, { fill_id = row.id, chain_id = row.chain_id, from = row.address, nonce = row.nonce,
    tx_hash = row.tx_hash, reason = t.reason })
end

-- Our hash has a receipt: the fill is mined if the transaction is ours,
-- once its block has the confirmations its transfer's plan asks of its
-- transfer (the most any node of the plan names; a reorg before them can
-- still put other bytes at the nonce).
local function mined(s, row, owner, url, receipt)
  local tx, err = rpc.get_transaction_by_hash(url, row.tx_hash)
  if not tx then
    return M.note(s, row, owner, "a receipt for " .. row.tx_hash .. " but eth_getTransactionByHash: "
      .. (tx == false and "not found" or errors.text(err)))
  end
  local block = rpc.quantity(receipt.blockNumber)
  if type(tx.from) ~= "string" or tx.from:lower() ~= row.address or rpc.quantity(tx.nonce) ~= row.nonce
      or block == nil then
    return M.note(s, row, owner, string.format("the node's answer for %s is not this fill (from %s, nonce %s, "
      .. "block %s): looked at again", row.tx_hash, tostring(tx.from), tostring(tx.nonce),
      tostring(receipt.blockNumber)))
  end
  if row.confirmations > 1 then
    local head, herr = rpc.block_number(url)
    if not head then return M.note(s, row, owner, "eth_blockNumber: " .. errors.text(herr)) end
    local have = evm_tx.confirmations(block, head)
    if have < row.confirmations then
      return M.note(s, row, owner, string.format("mined in block %d: %d of %d confirmations", block, have,
        row.confirmations))
    end
  end
  settle(s, row, owner, "mined", { block = block })
end

-- The nonce is used, and not by this fill: by another of ours (replaced),
-- by the transfer's bytes the daemon holds there (taken: the payment
-- moved), or, once that has held (qtg.evm_nonces.taken_verdict), by
-- something else.
local function used(s, row, owner, url, latest)
  -- a lookup that fails says nothing: noted, and no look is counted
  for _, sib in ipairs(s:query(SIBLINGS_SQL, row.chain_id, row.address, row.nonce, row.id)) do
    local receipt, err = true, nil
    if sib.status ~= "mined" then receipt, err = rpc.get_transaction_receipt(url, sib.tx_hash) end
    if receipt == nil then return M.note(s, row, owner, "eth_getTransactionReceipt (fill " .. sib.tx_hash .. "): "
      .. errors.text(err)) end
    if receipt then
      return settle(s, row, owner, "replaced", { reason = "fill " .. sib.tx_hash .. " was mined at this nonce" })
    end
  end
  for _, kept in ipairs(s:query(KEPT_SQL, row.chain_id, row.address, row.nonce)) do
    local receipt, err = rpc.get_transaction_receipt(url, kept.tx_hash)
    if receipt == nil then return M.note(s, row, owner, "eth_getTransactionReceipt (the transfer's bytes "
      .. kept.tx_hash .. "): " .. errors.text(err)) end
    if receipt then
      return settle(s, row, owner, "taken", { reason = string.format("the transfer's own bytes %s were mined at "
        .. "this nonce (block %s) instead of the fill: the payment it was to void moved; reconcile its request",
        kept.tx_hash, tostring(rpc.quantity(receipt.blockNumber))) })
    end
  end
  local look = s:query(LOOK_TAKEN_SQL, row.id, owner)[1]
  if not look then return end -- the lease is gone: another pass has the row
  local final, how = nonces.taken_verdict(look.looks, look.seconds)
  local what = string.format("the chain's count (%d) has passed nonce %d and no fill of qtg's at it was mined",
    latest, row.nonce)
  if not final then return M.note(s, row, owner, what .. ": " .. how) end
  settle(s, row, owner, "taken", { reason = what .. " (" .. how .. "): another transaction used the nonce, "
    .. "maybe the very bytes the fill was to void; look the nonce up on the chain" })
end

-- The nonce is free: the fill waits, or is sent again, the same bytes.
local function pending(s, row, owner, url, latest)
  if row.nonce_taken_since ~= nil and row.nonce_taken_since ~= qtg.db.NULL then
    s:query(CLEAR_TAKEN_SQL, row.id, owner)
  end
  local known, kerr = rpc.get_transaction_by_hash(url, row.tx_hash)
  if known == nil then return M.note(s, row, owner, "eth_getTransactionByHash: " .. errors.text(kerr)) end
  local behind = row.nonce > latest and string.format(" (behind %d nonces not yet mined)", row.nonce - latest) or ""
  if known then return M.note(s, row, owner, "pending in the node's pool" .. behind) end
  local hash, serr = rpc.send_raw_transaction(url, row.signed_raw_tx)
  if hash and hash:lower() ~= row.tx_hash then
    qtg.log.error("the node answered another hash for a fill's bytes", { fill_id = row.id, hash = hash })
    return M.note(s, row, owner, "IMPOSSIBLE: the node answered hash " .. hash .. " for bytes that hash to "
      .. row.tx_hash)
  end
  if hash or rpc.is_already_known(serr) then
    s:query("UPDATE evm_fills SET rebroadcasts = rebroadcasts + 1 WHERE id = $1 AND reap_lease_owner = $2",
      row.id, owner)
    return M.note(s, row, owner, "the node had lost it: sent again, the same bytes" .. behind)
  end
  -- outbid: other bytes of the sender hold the nonce in the pool, at fees
  -- the fill does not beat -- maybe the very bytes it was to void
  if rpc.is_outbid(serr) then
    local what = "sending it again: " .. errors.text(serr) .. ": other bytes hold nonce " .. row.nonce
      .. " in the node's pool at higher fees, maybe the transfer's the fill was to void; fill again at higher "
      .. "fees within the caps, or look the nonce up"
    s:transaction(function()
      surface(s, row, "fill_outbid", { fill_id = row.id, chain_id = row.chain_id, sender = row.address,
        nonce = row.nonce, tx_hash = row.tx_hash, reason = clip(what) })
    end)
    return M.note(s, row, owner, what)
  end
  -- only a refusal of the bytes themselves counts towards dropping them
  if not rpc.is_tx_refused(serr) then return M.note(s, row, owner, "sending it again: " .. errors.text(serr)) end
  local n = row.rebroadcasts + 1
  if n >= qtg.settings.evm_nonce_reaper_max_rebroadcasts then
    return settle(s, row, owner, "dropped", { reason = string.format("the RPC refused it %d times, last: %s; "
      .. "fill the nonce again (fill_nonce)", n, errors.text(serr)) })
  end
  s:query("UPDATE evm_fills SET rebroadcasts = $2 WHERE id = $1 AND reap_lease_owner = $3", row.id, n, owner)
  M.note(s, row, owner, "sending it again was refused: " .. errors.text(serr))
end

-- watch(s, row, owner, url, latest): one look at a fill still sent
-- (a row of M.WATCH_SQL; latest: the chain's count for its sender).
function M.watch(s, row, owner, url, latest)
  local ok, bytes = pcall(qtg.crypto.unhex, row.signed_raw_tx)
  if not ok or "0x" .. qtg.crypto.keccak256_hex(bytes) ~= row.tx_hash then
    qtg.log.error("a fill's stored bytes do not hash to its tx_hash", { fill_id = row.id })
    return M.note(s, row, owner, "IMPOSSIBLE: the stored bytes do not hash to " .. row.tx_hash
      .. ": the row cannot say what was signed")
  end
  local receipt, rerr = rpc.get_transaction_receipt(url, row.tx_hash)
  if receipt == nil then return M.note(s, row, owner, "eth_getTransactionReceipt: " .. errors.text(rerr)) end
  if receipt then return mined(s, row, owner, url, receipt) end
  if row.nonce < latest then return used(s, row, owner, url, latest) end
  return pending(s, row, owner, url, latest)
end

return M
