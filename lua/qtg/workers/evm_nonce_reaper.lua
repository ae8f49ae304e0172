-- qtg.workers.evm_nonce_reaper (spec section 10; MG_EVM_NONCE_REAPER_ENABLED,
-- core group): reconcile stale evm_nonce_reservation rows with the chain so
-- that a worker that died mid-broadcast never strands a nonce, and never
-- lets a nonce whose signed bytes may be out there carry another payload.
--
-- One pass:
--   1. claim (one short transaction) up to BATCH unsettled rows (reserved,
--      signed, broadcast) untouched for MG_EVM_NONCE_REAPER_AGE_SECONDS, of
--      the chains this process has an endpoint for, longest idle first, FOR
--      UPDATE SKIP LOCKED, and up to BATCH surfaced rows with signed bytes
--      not yet dead (the watched arm, below) untouched as long; stamp a
--      lease on them: no lock is held across the RPC calls, and another
--      process skips leased rows;
--   2. per chain: eth_chainId must be the row's chain id (a mismatch is an
--      impossible state: fatal); per address one eth_getTransactionCount
--      (address, "latest") -- never "pending", which a load-balanced RPC
--      answers from whichever node it hits;
--   3. per row, decide (docs/conditional-workers.md section 1):
--      reserved,  nonce >= latest            -> released
--      reserved,  nonce <  latest            -> surfaced (used outside qtg)
--      signed/broadcast, its hash mined       -> consumed
--      signed/broadcast, nonce < latest, its hash not mined
--                                            -> surfaced (another tx won),
--             once that has held over MG_EVM_NONCE_TAKEN_CONFIRM_SECONDS
--             (qtg.evm_nonces.look_taken; a lagging node reads the same)
--      signed/broadcast, not mined, node knows the hash -> broadcast, wait
--      signed/broadcast, node does not know it -> rebroadcast the SAME bytes
--             (never new ones); after MG_EVM_NONCE_REAPER_MAX_REBROADCASTS
--             refusals -> surfaced; a fill of qtg's sent, mined or dropped
--             at the nonce (qtg.evm_nonces.fill_at) -> noted, never sent again
--      stored bytes that do not hash to the stored tx_hash, a mined tx whose
--      sender or nonce differ from the row, a node that answers another hash
--      for our bytes -> impossible: the row's last_error is written, then
--      qtg.fatal (the core group stops the process).  An answer it cannot
--      read (a quantity with a leading zero, a receipt status other than
--      0x0/0x1) is the node's garbage: noted, looked at again.
--      surfaced with signed bytes, untouched for the same age (watched:
--             their transfer was reported FAILED, but whoever holds the
--             bytes can still have them mined while the nonce is free)
--             mined -> consumed, operators alerted (surfaced_transaction_mined);
--             nonce free -> noted, looked at again; nonce used by another
--             transaction, as that verdict holds -> bytes_dead_at, not
--             looked at again
--   4. each outcome is written in its own transaction, compare-and-set on
--      the status and lease read at the claim (an executor that moved the
--      row meanwhile wins), with an audit row; surfaced rows also get an
--      operator notification and the request's request_attention callback.
-- A third arm claims the fills still sent (evm_fills, untouched for the
-- same age) and hands each to qtg.evm_fill.watch: mined, sent again,
-- replaced, taken (operators alerted) or dropped.
-- An RPC failure (timeout, error status, garbage) is written to the row's
-- last_error and the lease is dropped: the row is tried again next pass.
-- Each row is isolated: a row whose reconciliation raises (a write the
-- database refused) is logged and keeps its lease until it expires, and the
-- other rows, of every chain, are reconciled all the same; an impossible
-- state (qtg.fatal) still stops the pass.
local qtg = require("qtg")
local canon = require("qtg.canon_json")
local evm_rpc = require("qtg.evm_rpc")
local nonces = require("qtg.evm_nonces")
local outbox = require("qtg.outbox")
local notify = require("qtg.notifications")
local heartbeats = require("qtg.heartbeats")
local fills = require("qtg.evm_fill")

local M = {}

M.BATCH = 10
M.WORKER = "evm_nonce_reaper"

-- leased(arm): an arm's claim over the reservations, with their request's id.
local function leased(arm)
  arm.returning = "r.*, (SELECT n.request_id FROM movement_request_nodes n WHERE n.id = r.request_node_id) AS request_id"
  return nonces.leased(arm)
end

-- The stale arm: unsettled rows untouched for the age, longest idle first.
M.CLAIM_SQL = leased{
  where = "status IN ('reserved', 'signed', 'broadcast') AND updated_at < now() - make_interval(secs => $1)",
  order = "updated_at ASC" }

-- The watched arm: surfaced rows whose signed bytes may still be mined
-- (their nonce not used for good by another transaction: bytes_dead_at),
-- looked at again once untouched for the same age, least recently first
-- (the expression of sql/0196's partial index).
M.WATCH_SQL = leased{
  where = "status = 'surfaced' AND signed_raw_tx IS NOT NULL AND bytes_dead_at IS NULL"
    .. " AND coalesce(last_checked_at, updated_at) < now() - make_interval(secs => $1)",
  order = "coalesce(last_checked_at, updated_at) ASC" }

M.DEAD_SQL = [[
UPDATE evm_nonce_reservation
   SET bytes_dead_at = clock_timestamp(), last_error = $2, last_checked_at = clock_timestamp(),
       reap_lease_until = NULL, reap_lease_owner = NULL
 WHERE id = $1 AND status = 'surfaced' AND reap_lease_owner = $3]]

-- Compare-and-set: only while the row is as claimed and still ours.
M.SETTLE_SQL = [[
UPDATE evm_nonce_reservation
   SET status = $3, surfaced_reason = coalesce($4, surfaced_reason), consumed_block = coalesce($5, consumed_block),
       rebroadcasts = $6, last_error = $7, last_checked_at = clock_timestamp(),
       reap_lease_until = NULL, reap_lease_owner = NULL
 WHERE id = $1 AND status = $2 AND reap_lease_owner = $8
RETURNING id]]

M.NOTE_SQL = [[
UPDATE evm_nonce_reservation
   SET last_error = $2, last_checked_at = clock_timestamp(), reap_lease_until = NULL, reap_lease_owner = NULL
 WHERE id = $1 AND reap_lease_owner = $3]]

local function log_fields(row, extra)
  local f = { worker = M.WORKER, chain_id = row.chain_id, address = row.address, nonce = row.nonce }
  f[row.kind == "fill" and "fill_id" or "reservation_id"] = row.id
  for k, v in pairs(extra or {}) do f[k] = v end
  return f
end

local function clip(s) return canon.excerpt(s, 500) end

-- Write an error note on the row and drop the lease (own transaction).
local function note(s, row, owner, message)
  if row.kind == "fill" then return fills.note(s, row, owner, message) end
  s:query(M.NOTE_SQL, row.id, clip(message), owner)
  qtg.log.warn("nonce reservation not settled", log_fields(row, { error = clip(message) }))
end

-- Impossible: record it on the row, then stop the core group.
local function impossible(s, row, owner, message)
  local msg = "IMPOSSIBLE: " .. message
  pcall(note, s, row, owner, msg)
  qtg.log.error("nonce reservation in an impossible state", log_fields(row, { error = msg }))
  qtg.fatal(string.format("evm_nonce_reaper: %s %s (chain %s, %s nonce %s): %s",
    row.kind == "fill" and "fill" or "reservation", tostring(row.id), tostring(row.chain_id), row.address, tostring(row.nonce), message))
end

-- The changes operators hear of (a critical notification and the request's
-- request_attention callback) instead of an audit row alone: a row
-- surfaced, and a surfaced row's bytes mined after all (its transfer was
-- reported FAILED and moved money).
local ALERTS = {
  [">surfaced"] = "nonce_reservation_surfaced",
  ["surfaced>consumed"] = "surfaced_transaction_mined",
}

-- settle(s, row, owner, to, t): the status change, its audit row or (ALERTS)
-- the operators' notification and callback; one transaction.
local function settle(s, row, owner, to, t)
  t = t or {}
  s:transaction(function()
    local hit = s:query(M.SETTLE_SQL, row.id, row.status, to, t.reason, t.block,
      t.rebroadcasts or row.rebroadcasts, t.error and clip(t.error) or qtg.db.NULL, owner)[1]
    if not hit then return end
    local detail = { chain_id = row.chain_id, address = row.address, nonce = row.nonce,
                     from_status = row.status, to_status = to, tx_hash = row.tx_hash,
                     reason = t.reason, block = t.block, latest_nonce = t.latest }
    local request_id = row.request_id ~= qtg.db.NULL and row.request_id or nil
    local kind = ALERTS[row.status .. ">" .. to] or ALERTS[">" .. to]
    if row.status == "surfaced" then
      -- the transfer was reported FAILED: its record says what the chain did
      s:query([[UPDATE evm_transfer_tx SET outcome = $2, receipt_block = $3, outcome_detail = $4
                 WHERE reservation_id = $1]], row.id, t.reverted and "reverted" or "mined", t.block, t.reason)
    end
    if kind then
      notify.surface(s, { worker = M.WORKER, kind = kind, dedupe_key = kind .. ":" .. tostring(row.id),
        entity_type = "evm_nonce_reservation", entity_id = row.id, request_id = request_id,
        data = detail, severity = "critical" })
    else
      outbox.audit(s, "system:" .. M.WORKER, "nonce_reservation." .. to, "evm_nonce_reservation",
        tostring(row.id), request_id, detail)
    end
  end)
  local log = to == "surfaced" and qtg.log.warn or qtg.log.info
  log("nonce reservation " .. to, log_fields(row, { from = row.status, reason = t.reason }))
end

local function hex_eq(a, b)
  return type(a) == "string" and type(b) == "string" and a:lower() == b:lower()
end

-- The stored bytes must hash to the stored hash: anything else means the
-- record cannot be trusted to say what was signed.
local function check_record(row)
  if row.signed_raw_tx == qtg.db.NULL then return true end
  local ok, bytes = pcall(qtg.crypto.unhex, row.signed_raw_tx)
  if not ok then return nil, "signed_raw_tx is not hex" end
  local h = "0x" .. qtg.crypto.keccak256_hex(bytes)
  if not hex_eq(h, row.tx_hash) then
    return nil, string.format("signed_raw_tx hashes to %s, not to the stored tx_hash %s", h, row.tx_hash)
  end
  return true
end

-- Our hash is mined: check it is this row's nonce from this address.
local function mined(s, row, owner, url, receipt, latest)
  local tx, err = evm_rpc.get_transaction_by_hash(url, row.tx_hash)
  if tx == nil then return note(s, row, owner, "eth_getTransactionByHash: " .. tostring(err)) end
  if tx == false then
    return note(s, row, owner, "the node has a receipt for " .. row.tx_hash .. " but not the transaction")
  end
  -- an answer it cannot read is the node's garbage, not an impossible
  -- state: noted, and looked at again
  local tx_nonce = evm_rpc.quantity(tx.nonce)
  if tx_nonce == nil or not tx.from:match("^0x%x+$") or (receipt.status ~= "0x1" and receipt.status ~= "0x0") then
    return note(s, row, owner, string.format("unreadable answer for %s: from %s, nonce %s, receipt status %s",
      row.tx_hash, tx.from:sub(1, 60), tx.nonce:sub(1, 30), tostring(receipt.status):sub(1, 30)))
  end
  if tx.from:lower() ~= row.address or tx_nonce ~= row.nonce then
    return impossible(s, row, owner, string.format(
      "mined transaction %s is from %s with nonce %s, the reservation is %s nonce %s",
      row.tx_hash, tx.from, tostring(tx.nonce), row.address, tostring(row.nonce)))
  end
  local reverted = receipt.status ~= "0x1"
  local reason = reverted and "mined but reverted (the nonce is used all the same)" or nil
  if row.status == "surfaced" then
    reason = string.format("%s was mined after its transfer was reported FAILED%s: reconcile the request by hand",
      row.tx_hash, reverted and " (reverted: no value moved, gas paid)" or " (the value moved)")
  end
  settle(s, row, owner, "consumed", { block = evm_rpc.quantity(receipt.blockNumber), latest = latest,
    reason = reason, reverted = reverted })
end

-- taken_held(s, row, owner, latest) -> what, how once the row's nonce has
-- read as taken (the chain's count past it, no receipt for its hash) long
-- enough (qtg.evm_nonces.look_taken); before that the look is noted on the
-- row (lease dropped) and nil returned.  The stale and watched arms share it.
local function taken_held(s, row, owner, latest)
  local final, how = nonces.look_taken(row.id, s)
  local what = string.format("the chain's count (%d) has passed nonce %d and the node has no receipt for %s",
    latest, row.nonce, row.tx_hash)
  if not final then
    note(s, row, owner, what .. ": " .. how)
    return nil
  end
  return what, how
end

-- A surfaced row's signed bytes (docs/evm.md "Surfaced bytes are watched"):
-- while their nonce is free anyone holding them can have them mined, so
-- they are looked at until the chain has used the nonce for another
-- transaction and that verdict holds (qtg.evm_nonces.look_taken).
local function watch(s, row, owner, url, latest)
  local receipt, rerr = evm_rpc.get_transaction_receipt(url, row.tx_hash)
  if receipt == nil then return note(s, row, owner, "eth_getTransactionReceipt: " .. tostring(rerr)) end
  if receipt then return mined(s, row, owner, url, receipt, latest) end
  if row.nonce >= latest then
    nonces.clear_taken(row, s)
    local sent = nonces.fill_at(s, row)
    if sent and sent.status == "dropped" then sent = nil end
    local way = sent and string.format("a fill is %s there (fill %d, %s), watched until mined", sent.status, sent.id,
      sent.tx_hash)
      or string.format("fill the nonce (at the console: fill_nonce(%d, '%s', %d); docs/evm.md)", row.chain_id,
        row.address, row.nonce)
    return note(s, row, owner, string.format("surfaced, and nonce %d is still free: the signed bytes of %s can "
      .. "still be mined by whoever holds them; %s", row.nonce, row.tx_hash, way))
  end
  local what, how = taken_held(s, row, owner, latest)
  if not what then return end
  s:query(M.DEAD_SQL, row.id, clip(what .. ": these bytes can never be mined (" .. how .. ")"), owner)
  qtg.log.info("surfaced reservation's bytes dead", log_fields(row, { how = how }))
end

local function reconcile_signed(s, row, owner, url, latest)
  local receipt, rerr = evm_rpc.get_transaction_receipt(url, row.tx_hash)
  if receipt == nil then return note(s, row, owner, "eth_getTransactionReceipt: " .. tostring(rerr)) end
  if receipt then return mined(s, row, owner, url, receipt, latest) end
  if row.nonce < latest then
    local what, how = taken_held(s, row, owner, latest)
    if not what then return end
    return settle(s, row, owner, "surfaced", { latest = latest,
      reason = "the chain used this nonce for another transaction; " .. row.tx_hash .. " will never be mined ("
        .. how .. ")" })
  end
  nonces.clear_taken(row, s)
  local known, kerr = evm_rpc.get_transaction_by_hash(url, row.tx_hash)
  if known == nil then return note(s, row, owner, "eth_getTransactionByHash: " .. tostring(kerr)) end
  if known then
    if row.status == "signed" then return settle(s, row, owner, "broadcast", { latest = latest }) end
    return note(s, row, owner, "still pending in the node's pool")
  end
  -- Unknown to the node: send the very same bytes again, unless a fill of
  -- qtg's was sent at their nonce to void them (qtg.evm_fill).
  local f = nonces.fill_at(s, row)
  if f then
    return note(s, row, owner, string.format("a fill is %s at nonce %d (fill %d, %s) to void these bytes: "
      .. "they are not sent again", f.status, row.nonce, f.id, f.tx_hash))
  end
  local hash, serr = evm_rpc.send_raw_transaction(url, row.signed_raw_tx)
  if hash and not hex_eq(hash, row.tx_hash) then
    return impossible(s, row, owner, "the node answered hash " .. hash .. " for bytes that hash to " .. row.tx_hash)
  end
  if hash or evm_rpc.is_already_known(serr) then
    local again = evm_rpc.get_transaction_receipt(url, row.tx_hash)
    if again then return mined(s, row, owner, url, again, latest) end
    if row.status == "broadcast" then
      s:query("UPDATE evm_nonce_reservation SET rebroadcasts = rebroadcasts + 1 WHERE id = $1 AND reap_lease_owner = $2",
        row.id, owner)
      return note(s, row, owner, "rebroadcast the same bytes; waiting for them to be mined")
    end
    return settle(s, row, owner, "broadcast", { latest = latest, rebroadcasts = row.rebroadcasts + 1,
      reason = nil })
  end
  if evm_rpc.is_nonce_too_low(serr) then
    return note(s, row, owner, "rebroadcast: " .. tostring(serr) .. " (settled next pass)")
  end
  if serr.kind ~= "rpc" then return note(s, row, owner, "rebroadcast: " .. tostring(serr)) end
  local n = row.rebroadcasts + 1
  if n >= qtg.settings.evm_nonce_reaper_max_rebroadcasts then
    return settle(s, row, owner, "surfaced", { rebroadcasts = n, latest = latest, error = tostring(serr),
      reason = "rebroadcast refused " .. n .. " times: " .. clip(serr.message) })
  end
  s:query("UPDATE evm_nonce_reservation SET rebroadcasts = $2 WHERE id = $1 AND reap_lease_owner = $3",
    row.id, n, owner)
  return note(s, row, owner, "rebroadcast refused: " .. tostring(serr))
end

local function reconcile(s, row, owner, url, latest)
  if row.kind == "fill" then return fills.watch(s, row, owner, url, latest) end
  local ok, why = check_record(row)
  if not ok then return impossible(s, row, owner, why) end
  if row.status == "surfaced" then return watch(s, row, owner, url, latest) end
  if row.status == "reserved" then
    if row.nonce >= latest then return settle(s, row, owner, "released", { latest = latest }) end
    return settle(s, row, owner, "surfaced", { latest = latest,
      reason = "never signed by qtg, but the chain has used this nonce (latest count "
        .. latest .. "): the address is used outside qtg" })
  end
  return reconcile_signed(s, row, owner, url, latest)
end

-- isolated(s, row, fn, ...): fn(...) for one row; a raise other than
-- qtg.fatal is logged and the pass goes on with the next row.
local function isolated(s, row, fn, ...)
  local ok, err = pcall(fn, ...)
  if ok then return end
  if type(err) == "table" and err.fatal then error(err, 0) end
  if s:in_transaction() then pcall(s.rollback, s) end
  qtg.log.error("nonce reservation not reconciled", log_fields(row, { error = clip(err) }))
end

-- The arms, in the order a pass claims and reconciles them.
M.ARMS = { M.CLAIM_SQL, M.WATCH_SQL, fills.WATCH_SQL }

-- claim(...) -> the stale rows, the watched ones, then the fills still
-- sent (each arm BATCH at most), leased in one short transaction.
local function claim(s, settings, chains, owner)
  local lease = #M.ARMS * M.BATCH * 5 * settings.evm_rpc_timeout_seconds + 30
  local list = "{" .. table.concat(chains, ",") .. "}"
  return s:transaction(function()
    local rows = {}
    for _, sql in ipairs(M.ARMS) do
      for _, r in ipairs(s:query(sql, settings.evm_nonce_reaper_age_seconds, list, M.BATCH, lease, owner)) do
        rows[#rows + 1] = r
      end
    end
    return rows
  end)
end

function M.tick(s)
  local settings = qtg.settings
  local eps, why = evm_rpc.endpoints(settings.evm_rpc_urls)
  if not eps then error("evm_nonce_reaper: " .. why, 0) end
  local chains = {}
  for id in pairs(eps) do chains[#chains + 1] = string.format("%d", id) end
  if #chains == 0 then error("evm_nonce_reaper: MG_EVM_RPC_URLS names no endpoint", 0) end
  local owner = heartbeats.process_id() .. "/" .. qtg.crypto.nonce()
  local rows = claim(s, settings, chains, owner)
  local by_chain = {}
  for _, row in ipairs(rows) do
    by_chain[row.chain_id] = by_chain[row.chain_id] or {}
    table.insert(by_chain[row.chain_id], row)
  end
  for chain, list in pairs(by_chain) do
    local url = eps[chain]
    local cid, cerr = evm_rpc.chain_id(url)
    if cid == nil then
      for _, row in ipairs(list) do isolated(s, row, note, s, row, owner, "eth_chainId: " .. tostring(cerr)) end
    elseif cid ~= chain then
      impossible(s, list[1], owner, string.format("the endpoint for chain %d answers eth_chainId %d", chain, cid))
    else
      local counts = {}
      for _, row in ipairs(list) do
        local latest = counts[row.address]
        if latest == nil then
          local n, err = evm_rpc.get_transaction_count(url, row.address, "latest")
          counts[row.address] = n or false
          latest = n or false
          if not n then counts[row.address .. ":err"] = tostring(err) end
        end
        if latest == false then
          isolated(s, row, note, s, row, owner, "eth_getTransactionCount: " .. counts[row.address .. ":err"])
        else
          isolated(s, row, reconcile, s, row, owner, url, latest)
        end
      end
    end
  end
  return #rows
end

return M
