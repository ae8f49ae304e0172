-- qtg.evm_nonces: nonce reservations (evm_nonce_reservation, sql/0020) and
-- the signed-bytes bookkeeping of the evm_transfer executor (evm_transfer_tx,
-- sql/0050), for the executor and the evm_nonce_reaper.  docs/evm.md.
--
-- Every write here runs on its OWN session and commits before the caller
-- goes on (M.with_tx), never in the dispatcher's transaction: a reservation,
-- and the signed bytes stored before a broadcast, must survive that
-- transaction being lost (a crash between eth_sendRawTransaction and the
-- dispatcher's commit puts the node back to READY; the re-dispatch finds the
-- signed bytes here and sends the same transaction again).
--
-- Allocation is serialised per (chain_id, address) by a transaction-level
-- advisory lock (M.lock), taken only for a few statements, never across an
-- RPC call; it touches no movement row, so it can never wait for a
-- dispatcher's node lock.  The rule:
--   1. a node keeps its reservation: an unsigned one is rebuilt (new fees,
--      same nonce); a signed one is reused as it is (same bytes) unless its
--      transaction is dead (mined and reverted, or its nonce was taken by
--      another transaction) -- a nonce whose bytes may have been broadcast
--      is never given another payload;
--   2. otherwise unsigned reservations of nodes that ended (FAILED,
--      CANCELLED) are released, and the lowest released nonce at or above
--      the chain's count is taken again;
--   3. otherwise max(highest reserved + 1, chain's "latest" count).
local qtg = require "qtg"
local canon = require "qtg.canon_json"

local M = {}

local NULL = qtg.db.NULL

M.LOCK_PREFIX = "qtg.evm_nonce:"

-- Outcomes after which a reservation's bytes can never move funds: a new
-- attempt of its node takes a new nonce.
M.DEAD = { reverted = true, nonce_taken = true }

local function v(x) if x == NULL then return nil end return x end
M.value = v

function M.lock_key(chain_id, address)
  return string.format("%s%d:%s", M.LOCK_PREFIX, chain_id, address)
end

-- lock(s, chain_id, address): in s's open transaction, until it ends.  Only
-- allocation (M.reserve) takes it.  The reaper does not: it claims rows FOR
-- UPDATE SKIP LOCKED with a lease and writes each outcome compare-and-set on
-- the status and lease it read (evm_nonce_reaper SETTLE_SQL): a row an
-- executor moved meanwhile is left alone, and an executor's own writes are
-- guarded the same way (store_signed only on a 'reserved' unsigned row, so
-- a row the reaper released is never signed).
function M.lock(s, chain_id, address)
  s:query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", M.lock_key(chain_id, address))
end

-- with_tx(fn) -> fn(s)'s results (up to three: qtg.db.with_session's), on a
-- fresh session in its own committed transaction (rolled back and re-raised
-- on error; the session is released either way).
function M.with_tx(fn)
  return qtg.db.with_session(function(s) return s:transaction(fn, s) end)
end

M.ROW_SQL = [[
SELECT r.id, r.chain_id, r.address, r.nonce, r.status, r.request_node_id::text AS request_node_id,
       r.payload_hash, r.signed_raw_tx, r.tx_hash, r.consumed_block, r.surfaced_reason,
       r.last_error, r.reserved_at, r.updated_at, r.nonce_taken_since, r.nonce_taken_looks,
       t.attempt_no, t.from_address, t.to_address, t.value_wei::text AS value_wei, t.fields,
       t.payload, t.outcome, t.outcome_detail, t.receipt_block
  FROM evm_nonce_reservation r
  LEFT JOIN evm_transfer_tx t ON t.reservation_id = r.id
]]

local function row_of(rows)
  local r = rows[1]
  if not r then return nil end
  for k, x in pairs(r) do if x == NULL then r[k] = nil end end
  return r
end

-- The node's latest reservation that is not released (nil if none).
function M.for_node(s, node_id)
  return row_of(s:query(M.ROW_SQL .. [[
     WHERE r.request_node_id = $1::uuid AND r.status <> 'released'
     ORDER BY r.id DESC LIMIT 1]], node_id))
end

function M.by_tx_hash(s, tx_hash)
  return row_of(s:query(M.ROW_SQL .. " WHERE r.tx_hash = $1", tx_hash))
end

function M.by_id(s, id)
  return row_of(s:query(M.ROW_SQL .. " WHERE r.id = $1", id))
end

-- fill_at(s, row) -> the newest fill of qtg's (evm_fills) sent, mined or
-- dropped at the row's chain, sender and nonce, {id=, tx_hash=, status=},
-- or nil.  Such a fill was asked for to void the bytes there (the kept
-- bytes of a grant, or a live transfer cancelled with `cancel = true`):
-- they are not sent, by the node's executor nor by the reaper.  A dropped
-- fill counts too: the operator's cancel stands until the nonce is filled
-- again or the chain settles it.
M.FILL_AT_SQL = [[
SELECT id, tx_hash, status FROM evm_fills
 WHERE chain_id = $1 AND address = $2 AND nonce = $3 AND status IN ('sent', 'mined', 'dropped')
 ORDER BY id DESC LIMIT 1]]

function M.fill_at(s, row)
  return s:query(M.FILL_AT_SQL, row.chain_id, row.address, row.nonce)[1]
end

-- read_fill_at(row): fill_at on a fresh session (the executor's look
-- before it sends bytes).
function M.read_fill_at(row)
  return M.read(function(s) return M.fill_at(s, row) end)
end

-- reusable(row) -> true when a new dispatch of the row's node must send
-- exactly these signed bytes again.
function M.reusable_signed(row)
  return row ~= nil and row.signed_raw_tx ~= nil and not M.DEAD[row.outcome or ""]
end

-- backlog(s, chain_id, address, latest_count) -> {n=, lowest=, top=}: the
-- sender's unsettled reservations at or above the chain's count (later
-- nonces wait behind every one of them), the lowest of them, and the next
-- nonce the books would give (max + 1 over all rows; -1 for none), and
-- how many rows the books call mined at or above the chain's count (none on
-- a live chain: a reset devnet, or another chain under this id), and the
-- lowest surfaced row at or above the count (`gap`, -1 for none): a nonce
-- nothing in qtg will send again, which every later nonce waits behind.
function M.backlog(s, chain_id, address, latest_count)
  return s:query([[
    SELECT count(*) FILTER (WHERE nonce >= $3
                              AND status IN ('reserved', 'signed', 'broadcast', 'surfaced'))::int AS n,
           COALESCE(min(nonce) FILTER (WHERE nonce >= $3
                              AND status IN ('reserved', 'signed', 'broadcast', 'surfaced')), -1)::int8 AS lowest,
           COALESCE(max(nonce) + 1, -1)::int8 AS top,
           count(*) FILTER (WHERE nonce >= $3 AND status = 'consumed')::int AS ahead,
           COALESCE(min(nonce) FILTER (WHERE nonce >= $3 AND status = 'consumed'), -1)::int8 AS ahead_nonce,
           COALESCE(min(nonce) FILTER (WHERE nonce >= $3 AND status = 'surfaced'), -1)::int8 AS gap
      FROM evm_nonce_reservation
     WHERE chain_id = $1 AND address = $2]],
    chain_id, address, latest_count)[1]
end

M.RELEASE_ABANDONED_SQL = [[
UPDATE evm_nonce_reservation r
   SET status = 'released',
       last_error = 'released by evm_transfer: node ' || n.node_state || ' before anything was signed'
  FROM movement_request_nodes n
 WHERE n.id = r.request_node_id
   AND r.chain_id = $1 AND r.address = $2 AND r.nonce >= $3
   AND r.status = 'reserved' AND r.signed_raw_tx IS NULL
   AND n.node_state IN ('FAILED', 'CANCELLED')]]

M.TAKE_RELEASED_SQL = [[
UPDATE evm_nonce_reservation
   SET status = 'reserved', request_node_id = $4::uuid, payload_hash = NULL,
       reserved_at = clock_timestamp(), last_error = NULL, surfaced_reason = NULL,
       reap_lease_until = NULL, reap_lease_owner = NULL
 WHERE id = (SELECT id FROM evm_nonce_reservation
              WHERE chain_id = $1 AND address = $2 AND nonce >= $3 AND status = 'released'
              ORDER BY nonce LIMIT 1)
RETURNING id, nonce]]

M.INSERT_SQL = [[
INSERT INTO evm_nonce_reservation (chain_id, address, nonce, status, request_node_id)
VALUES ($1, $2, $3, 'reserved', $4::uuid)
RETURNING id, nonce]]

M.TX_UPSERT_SQL = [[
INSERT INTO evm_transfer_tx (reservation_id, request_node_id, attempt_no, chain_id, from_address,
                             to_address, value_wei, fields, payload, payload_hash)
VALUES ($1, $2::uuid, $3, $4, $5, $6, $7::numeric, $8::jsonb, $9, $10)
ON CONFLICT (reservation_id) DO UPDATE
   SET request_node_id = EXCLUDED.request_node_id, attempt_no = EXCLUDED.attempt_no,
       chain_id = EXCLUDED.chain_id, from_address = EXCLUDED.from_address,
       to_address = EXCLUDED.to_address, value_wei = EXCLUDED.value_wei,
       fields = EXCLUDED.fields, payload = EXCLUDED.payload, payload_hash = EXCLUDED.payload_hash,
       outcome = NULL, outcome_detail = NULL, receipt_block = NULL]]

-- reserve(a, build) -> row, how
--   a = {chain_id=, address= (lowercase), request_node_id=, attempt_no=,
--        latest_count= (eth_getTransactionCount "latest", read before)}
--   build(nonce) -> {fields=, payload=, payload_hash=, to=, value_wei=}: the
--        unsigned transaction for that nonce (pure; no I/O under the lock)
-- how: "signed" (the node's signed bytes, to send again), "rebuilt" (the
-- node's unsigned reservation, new fees) or "new".
function M.reserve(a, build)
  return M.with_tx(function(s)
    M.lock(s, a.chain_id, a.address)
    local cur = M.for_node(s, a.request_node_id)
    if cur and (cur.chain_id ~= a.chain_id or cur.address ~= a.address) then
      error(string.format("node %s already holds nonce reservation %d on chain %d for %s",
        a.request_node_id, cur.id, cur.chain_id, cur.address), 0)
    end
    if M.reusable_signed(cur) then return cur, "signed" end
    local id, nonce, how
    if cur and cur.status == "reserved" and cur.signed_raw_tx == nil then
      id, nonce, how = cur.id, cur.nonce, "rebuilt"
    else
      s:query(M.RELEASE_ABANDONED_SQL, a.chain_id, a.address, a.latest_count)
      local row = s:query(M.TAKE_RELEASED_SQL, a.chain_id, a.address, a.latest_count,
        a.request_node_id)[1]
      if not row then
        local top = s:query([[SELECT COALESCE(max(nonce) + 1, 0)::int8 AS n FROM evm_nonce_reservation
                               WHERE chain_id = $1 AND address = $2]], a.chain_id, a.address)[1].n
        row = s:query(M.INSERT_SQL, a.chain_id, a.address, math.max(top, a.latest_count),
          a.request_node_id)[1]
      end
      id, nonce, how = row.id, row.nonce, "new"
    end
    local tx = build(nonce)
    s:query([[UPDATE evm_nonce_reservation SET payload_hash = $2, request_node_id = $3::uuid
               WHERE id = $1 AND status = 'reserved']], id, tx.payload_hash, a.request_node_id)
    s:query(M.TX_UPSERT_SQL, id, a.request_node_id, a.attempt_no, a.chain_id, a.address,
      tx.to, tx.value_wei, tx.fields, tx.payload, tx.payload_hash)
    return M.by_id(s, id), how
  end)
end

-- store_signed(id, node_id, raw, tx_hash) -> row, nil, first; or nil +
-- reason.  Before any broadcast: the bytes are kept with the reservation
-- (write-once).  first is true when this call stored them, false when they
-- were stored before (a re-dispatch after a crash: they may have been sent
-- already).  A reservation that is no longer this node's unsigned one
-- (released by the reaper meanwhile) is refused: nothing may be sent then.
function M.store_signed(id, node_id, raw, tx_hash)
  return M.with_tx(function(s)
    local _, n = s:query([[
      UPDATE evm_nonce_reservation
         SET status = 'signed', signed_raw_tx = $2, tx_hash = $3, last_error = NULL
       WHERE id = $1 AND request_node_id = $4::uuid AND status = 'reserved'
         AND signed_raw_tx IS NULL]], id, raw, tx_hash, node_id)
    local row = M.by_id(s, id)
    if n == 1 then return row, nil, true end
    if row and row.tx_hash == tx_hash and row.request_node_id == node_id then return row, nil, false end
    return nil, string.format("nonce reservation %s is %s%s: not this node's unsigned reservation any more",
      tostring(id), row and row.status or "gone", row and row.tx_hash and (" with tx " .. row.tx_hash) or "")
  end)
end

function M.mark_broadcast(id)
  M.with_tx(function(s)
    s:query([[UPDATE evm_nonce_reservation SET status = 'broadcast', last_error = NULL,
                     last_checked_at = clock_timestamp()
               WHERE id = $1 AND status = 'signed']], id)
    s:query([[UPDATE evm_transfer_tx SET outcome = NULL, outcome_detail = NULL
               WHERE reservation_id = $1 AND outcome = 'rejected']], id)
  end)
end

-- mark_mined(id, block, succeeded): the chain mined the reservation's own
-- transaction (its nonce is used whatever the receipt's status).
function M.mark_mined(id, block, succeeded)
  M.with_tx(function(s)
    s:query([[UPDATE evm_nonce_reservation SET status = 'consumed', consumed_block = $2,
                     last_checked_at = clock_timestamp(), nonce_taken_since = NULL, nonce_taken_looks = 0
               WHERE id = $1 AND status IN ('signed', 'broadcast', 'surfaced')]], id, block)
    s:query([[UPDATE evm_transfer_tx SET outcome = $2, receipt_block = $3, outcome_detail = NULL
               WHERE reservation_id = $1]], id, succeeded and "mined" or "reverted", block)
  end)
end

-- surface(id, reason, outcome): operators decide (the reaper leaves it);
-- outcome "nonce_taken" or "rejected" (sql/0050).  The reason often quotes
-- a node's error: it is stored as valid text (canon.text_repaired), or the
-- write would fail and the refusal go unrecorded.
function M.surface(id, reason, outcome)
  reason = canon.text_repaired(tostring(reason))
  M.with_tx(function(s)
    s:query([[UPDATE evm_nonce_reservation SET status = 'surfaced', surfaced_reason = $2,
                     last_checked_at = clock_timestamp()
               WHERE id = $1 AND status IN ('reserved', 'signed', 'broadcast')]], id, reason)
    s:query([[UPDATE evm_nonce_reservation SET surfaced_reason = $2, last_checked_at = clock_timestamp()
               WHERE id = $1 AND status = 'surfaced']], id, reason)
    s:query([[UPDATE evm_transfer_tx SET outcome = $2, outcome_detail = $3
               WHERE reservation_id = $1]], id, outcome, reason)
  end)
end

-- release(id) -> true if released: only a reservation that never held
-- signed bytes.
function M.release(id, why)
  return M.with_tx(function(s)
    local _, n = s:query([[UPDATE evm_nonce_reservation SET status = 'released', last_error = $2
                            WHERE id = $1 AND status = 'reserved' AND signed_raw_tx IS NULL]],
      id, why or "released by evm_transfer")
    return n == 1
  end)
end

-- ---- the "nonce taken" verdict ------------------------------------------------
-- An RPC says a signed transaction's nonce was taken by another one when it
-- has no receipt and no transaction for the hash while the sender's count
-- has passed the nonce.  A lagging or load-balanced node says the same of a
-- transaction mined a moment ago, so the verdict is final only once it has
-- held for MG_EVM_NONCE_TAKEN_CONFIRM_SECONDS over at least TAKEN_LOOKS
-- looks in a row (0 seconds: at the first look).  The executor's observe
-- and recover and the evm_nonce_reaper all decide here (docs/evm.md).

M.TAKEN_LOOKS = 3

M.LOOK_TAKEN_SQL = [[
UPDATE evm_nonce_reservation
   SET nonce_taken_since = coalesce(nonce_taken_since, clock_timestamp()),
       nonce_taken_looks = nonce_taken_looks + 1, last_checked_at = clock_timestamp()
 WHERE id = $1
RETURNING nonce_taken_looks AS looks,
          extract(epoch FROM clock_timestamp() - nonce_taken_since)::float8 AS seconds]]

M.CLEAR_TAKEN_SQL = [[
UPDATE evm_nonce_reservation SET nonce_taken_since = NULL, nonce_taken_looks = 0
 WHERE id = $1 AND nonce_taken_since IS NOT NULL]]

-- taken_verdict(looks, seconds[, confirm_seconds]) -> final, how: pure;
-- how says what was seen ("seen 2 times over 41 s; final once ...").
function M.taken_verdict(looks, seconds, confirm)
  confirm = confirm or qtg.settings.evm_nonce_taken_confirm_seconds
  local seen = string.format("seen %d time%s over %d s", looks, looks == 1 and "" or "s", math.floor(seconds))
  if confirm == 0 or (looks >= M.TAKEN_LOOKS and seconds >= confirm) then return true, seen end
  return false, string.format("%s; final once seen %d times over %d s (MG_EVM_NONCE_TAKEN_CONFIRM_SECONDS)",
    seen, M.TAKEN_LOOKS, confirm)
end

-- look_taken(id[, s]) -> final, how: record one "taken" look (on s, in
-- the caller's transaction, or on an own committed one) and judge the run.
function M.look_taken(id, s)
  local function look(x)
    local r = x:query(M.LOOK_TAKEN_SQL, id)[1]
    if not r then error("evm_nonces.look_taken: no reservation " .. tostring(id), 0) end
    return r
  end
  local r = s and look(s) or M.with_tx(look)
  return M.taken_verdict(r.looks, r.seconds)
end

-- clear_taken(row[, s]): a look that found the transaction, or the nonce
-- free, ends the run (a no-op for a row with none).
function M.clear_taken(row, s)
  if row.nonce_taken_since == nil or row.nonce_taken_since == NULL then return end
  if s then return s:query(M.CLEAR_TAKEN_SQL, row.id) end
  M.with_tx(function(x) x:query(M.CLEAR_TAKEN_SQL, row.id) end)
end

-- note(id, text): the row's last_error, stored as valid text (see surface).
function M.note(id, text)
  text = canon.text_repaired(tostring(text))
  M.with_tx(function(s)
    s:query([[UPDATE evm_nonce_reservation SET last_error = $2, last_checked_at = clock_timestamp()
               WHERE id = $1]], id, text)
  end)
end

-- Read-only helpers on a fresh session (no transaction).
function M.read(fn)
  local s = qtg.db.acquire()
  local ok, res = pcall(fn, s)
  s:release()
  if not ok then error(res, 0) end
  return res
end

-- leased(arm) -> the claim of one arm of evm_nonce_reaper: the rows of
-- arm.table (default evm_nonce_reservation) its arm.where picks ($1 age in
-- seconds, $2 chain ids), in arm.order, at most $3, leased for $4 seconds
-- to owner $5, FOR UPDATE SKIP LOCKED; it returns arm.returning (the row
-- is r).  No lock is held across the RPC calls that follow: the lease
-- keeps other processes off the rows.
function M.leased(arm)
  return [[
WITH c AS (
  SELECT id FROM ]] .. (arm.table or "evm_nonce_reservation") .. [[

   WHERE ]] .. arm.where .. [[

     AND chain_id = ANY($2::bigint[])
     AND (reap_lease_until IS NULL OR reap_lease_until < now())
   ORDER BY ]] .. arm.order .. [[, id ASC
   LIMIT $3
   FOR UPDATE SKIP LOCKED)
UPDATE ]] .. (arm.table or "evm_nonce_reservation") .. [[ r
   SET reap_lease_until = now() + make_interval(secs => $4), reap_lease_owner = $5
  FROM c
 WHERE r.id = c.id
RETURNING ]] .. arm.returning
end

return M
