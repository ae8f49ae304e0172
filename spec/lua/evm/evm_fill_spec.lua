-- Filling a nonce (lua/qtg/evm_fill.lua, the signer's FILL in
-- src/qtg_signerd.c, `qtgd approver sign-fill`): a transfer of nothing from
-- a signer key's address to itself, at a nonce the signer granted a
-- transfer at, so that the transfer's bytes are never mined.  A real anvil,
-- a real `qtgd signer` holding the key, real PostgreSQL.
--   * a grant whose bytes the daemon kept (never sent): the fill is signed
--     and mined, moves nothing, and the kept bytes are refused by the chain
--     afterwards; the signer's log and the audit trail say who filled, and
--     `qtgd audit verify` names the fill beside the grant it lists;
--   * what the signer refuses, asked directly as a console user could: a
--     nonce it granted nothing at, a payload that pays another address or
--     moves value or carries data or more gas, fees above the plan's caps,
--     a key it does not hold; a nonce the chain used already is refused
--     before the signer is asked;
--   * a transfer in flight on its own bytes is filled (cancelled) only with
--     cancel = true; a fill above the chain's count is sent queued behind
--     the nonces before it, said so, and mined once they are;
--   * evm_nonce_reaper watches every fill sent (evm_fills): mined once its
--     block has the plan's confirmations (the grant settled for `qtgd
--     audit verify`; a row born mined is refused, and one made mined for a
--     payload the signer filled nowhere settles nothing), sent again when
--     the pool lost it, replaced by a later fill that outbids it, taken
--     when the kept bytes are mined instead (a critical notification, at
--     once when they are the bytes the daemon holds), outbid in the pool
--     (a critical notification, never a drop), dropped when the RPC
--     refuses the bytes themselves; a settled row never changes;
--   * with an enrolment: no signature, another person's, a stranger's
--     principal, an initiator's, a signature of another nonce or another
--     deployment: each refused (FILL_NOT_SIGNED); the one `qtgd approver
--     sign-fill` made for this nonce, relayed by that person at the
--     console (fill_nonce), fills it.
local qtg = require "qtg"
local common = require "spec.lua.support.common"

local CHAIN = 31413
local AMOUNT = "0.25"
local MAX_FEE, MAX_TIP = 200000000000, 5000000000
local DEPLOYMENT = "fill-desk"

local sup, engine, cond, s, dir, anvil, DEV

local function new_class() return "fillspec-" .. qtg.crypto.hex(qtg.crypto.random_bytes(4)) end

-- an unsigned EIP-1559 transaction: a transfer of AMOUNT to `to` unless over says otherwise
local function fields(over)
  local f = { chain_id = CHAIN, nonce = 0, value = "250000000000000000", gas_limit = 21000,
              max_fee_per_gas = tostring(MAX_FEE), max_priority_fee_per_gas = tostring(MAX_TIP), data = "0x" }
  for k, v in pairs(over) do f[k] = v end
  return f
end

-- the signer on this process's socket holding key `name` = DEV[i]'s
local function start_signer(name, i, extra)
  local env = sup.run_env("unused", { MG_SIGNER_KEYS = name .. "=" .. sup.key_file(dir, name, DEV[i].key),
                                      MG_SIGNER_SOCKET = qtg.signer.socket_path() })
  for k, v in pairs(extra or {}) do env[k] = v end
  return sup.start_signer(env)
end

-- A transfer of request template `tpl` granted at the sender's nonce
-- `ahead` past the chain's count (default 0) and never sent, at the caps
-- unless `fees` says otherwise: {from=, nonce=, raw= (the kept bytes),
-- dest=, request=, class=, node=, payload=}.
local function kept_grant(tpl, key, i, ahead, fees)
  local from, dest, class = DEV[i].address, sup.random_address(), new_class()
  local req = sup.create(s, tpl, class, { asset = "ETH", amount = AMOUNT, destination = dest, chain_id = CHAIN })
  local node = engine.nodes(s, req.id).transfer
  local nonce = sup.nonce(anvil.url, from) + (ahead or 0)
  local over = { to = dest, nonce = nonce }
  for k, v in pairs(fees or {}) do over[k] = v end
  local f = fields(over)
  local tx = qtg.evm.eip1559(f)
  s:query([[INSERT INTO evm_nonce_reservation (chain_id, address, nonce, request_node_id, payload_hash)
            VALUES ($1, $2, $3, $4::uuid, $5)]], CHAIN, from, nonce, node.id, tx.signing_hash)
  local sig, err = qtg.signer.sign(key, { request_id = req.id, request_node_id = node.id, attempt_no = 1,
                                          payload = tx.payload, payload_hash = tx.signing_hash })
  assert(sig, err and err.message)
  return { from = from, nonce = nonce, raw = qtg.evm.eip1559(f, sig).raw, dest = dest, request = req.id,
           class = class, node = node.id, payload = tx }
end

-- the fill through qtg.evm_fill, as a daemon of `class` with this spec's chain configured
local function fill(class, args, who)
  return cond.with_settings({ evm_rpc_urls = CHAIN .. "=" .. anvil.url, network_class = class },
    require("qtg.evm_fill").fill, args, who or "operator:spec")
end

-- one pass of evm_nonce_reaper on this spec's chain, every row due at once
local function reaper_pass(over)
  local t = { evm_rpc_urls = CHAIN .. "=" .. anvil.url, evm_nonce_reaper_age_seconds = 0,
              evm_nonce_taken_confirm_seconds = 0 }
  for k, v in pairs(over or {}) do t[k] = v end
  return cond.tick("evm_nonce_reaper", t)
end

-- the plan's confirmations (3, the finality node's) past a fill's block
local function confirm() sup.rpc(anvil.url, "anvil_mine", { "0x2" }) end

local function fill_row(hash)
  return s:query("SELECT * FROM evm_fills WHERE tx_hash = $1 ORDER BY id DESC LIMIT 1", hash)[1]
end

-- the grants `qtgd audit verify` lists for sender `from` on this chain
local function listed_for(from)
  local out = {}
  for _, g in ipairs(require("qtg.audit_grants").check(s, 100000).list) do
    if g.address == from and g.chain_id == CHAIN then out[#out + 1] = g end
  end
  return out
end

local function refused(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "not refused")
  return err
end

-- the fill a signer is asked for directly: {code=} of its refusal, or the signature
local function ask_fill(key, f, principal, signature)
  local tx = qtg.evm.eip1559(f)
  local sig, err = qtg.signer.fill(key, { payload = tx.payload, principal = principal or "operator:spec",
                                          signature = signature })
  return sig, err
end

-- the sender's nonce `nonce` used by a transfer of nothing from outside
-- qtg (anvil impersonates the sender): what waits behind it can be mined
local function use_nonce(from, nonce)
  sup.rpc(anvil.url, "anvil_impersonateAccount", { from })
  sup.rpc(anvil.url, "eth_sendTransaction", { { from = from, to = from, value = "0x0",
                                                nonce = string.format("0x%x", nonce) } })
  sup.rpc(anvil.url, "anvil_stopImpersonatingAccount", { from })
end

-- wait until the signed bytes `raw` are mined
local function mined_raw(raw, what)
  local hash = "0x" .. qtg.crypto.keccak256_hex(qtg.crypto.unhex(raw:sub(3)))
  sup.wait_for(function() return sup.receipt(anvil.url, hash) end, 30, what)
end

local function mined_fill(r, from, nonce)
  local receipt = sup.wait_for(function() return sup.receipt(anvil.url, r.tx_hash) end, 30, "the fill mined")
  assert.equal("0x1", receipt.status)
  local tx = sup.rpc(anvil.url, "eth_getTransactionByHash", { r.tx_hash })
  assert.equal(from, tx.from:lower())
  assert.equal(from, tx.to:lower())
  assert.equal("0x0", tx.value)
  assert.equal(nonce, tonumber(tx.nonce:sub(3), 16))
  assert.equal(nonce + 1, sup.nonce(anvil.url, from))
end

describe("filling a nonce", function()
  setup(function()
    sup = require "spec.lua.support.evm"
    engine = require "spec.lua.support.engine"
    cond = require "spec.lua.support.conditional"
    DEV = sup.DEV
    s, dir, anvil = sup.fresh_chain(CHAIN)
    local rc = { allowed_chain_ids = { CHAIN }, max_amount = "25" }
    engine.load_doc(s, sup.template("fill_t_a", "fa", rc))
    engine.load_doc(s, sup.template("fill_t_b", "fb", rc))
    engine.load_doc(s, sup.template("fill_t_c", "fc", rc))
  end)

  teardown(function() sup.done(s, dir) end)

  after_each(function() sup.host.stop_all() end)

  it("fills a granted nonce whose bytes were kept: nothing moves, and the kept bytes are never mined", function()
    start_signer("fa", 1)
    local g = kept_grant("fill_t_a", "fa", 1)
    local from, n = g.from, g.nonce
    local logged_before = s:query("SELECT coalesce(max(id), 0) AS id FROM signer_events")[1].id
    -- what the signer refuses, asked as a console user could
    local cases = {
      { "NONCE_NOT_GRANTED", fields({ to = from, value = "0", nonce = n + 1 }) },
      { "NONCE_NOT_GRANTED", fields({ to = from, value = "0", nonce = n, chain_id = CHAIN + 1 }) },
      { "FILL_NOT_SELF", fields({ to = g.dest, value = "0", nonce = n }) },
      { "FILL_NOT_SELF", fields({ to = from, value = "1", nonce = n }) },
      { "DATA_NOT_ALLOWED", fields({ to = from, value = "0", nonce = n, data = "0xa9059cbb" }) },
      { "FEES_ABOVE_CAP", fields({ to = from, value = "0", nonce = n, gas_limit = 21001 }) },
      { "FEES_ABOVE_CAP", fields({ to = from, value = "0", nonce = n, max_fee_per_gas = tostring(MAX_FEE + 1) }) },
      { "FEES_ABOVE_CAP", fields({ to = from, value = "0", nonce = n,
                                   max_priority_fee_per_gas = tostring(MAX_TIP + 1) }) },
      { "SIGNER_NOT_FOUND", fields({ to = from, value = "0", nonce = n }), "nokey" },
    }
    for i, c in ipairs(cases) do
      local sig, err = ask_fill(c[3] or "fa", c[2])
      assert.is_nil(sig, "case " .. i)
      assert.equal(c[1], err.code, "case " .. i .. ": " .. tostring(err.message))
    end
    -- a bad principal or signature never reaches a decision
    local _, err = qtg.signer.fill("fa", { payload = qtg.evm.eip1559(fields({ to = from, value = "0" })).payload,
                                           principal = "nobody" })
    assert.equal("SIGNER_BAD_REQUEST", err.code)
    -- bad input to the fill itself
    assert.equal("usage", refused(fill, g.class, { chain_id = 0, sender = from, nonce = n }).kind)
    assert.equal("usage", refused(fill, g.class, { chain_id = CHAIN, sender = "0x1234", nonce = n }).kind)
    assert.equal("usage", refused(fill, g.class, { chain_id = CHAIN, sender = from, nonce = -1 }).kind)
    assert.equal("usage", refused(fill, g.class, { chain_id = CHAIN, sender = from, nonce = n, signature = "zz" }).kind)
    local e = refused(fill, g.class, { chain_id = CHAIN, sender = from, nonce = n + 1 })
    assert.equal("not_found", e.kind, tostring(e.message))
    assert.equal(n, sup.nonce(anvil.url, from), "nothing was sent")
    -- the fill: signed, sent, mined; a transfer of nothing to itself
    -- a daemon of another class does not fill this class's nonces
    e = refused(fill, new_class(), { chain_id = CHAIN, sender = from, nonce = n })
    assert.equal("forbidden", e.kind, tostring(e.message))
    assert.truthy(e.message:find("is of network class " .. g.class, 1, true), e.message)
    local r = fill(g.class, { chain_id = CHAIN, sender = from:upper():gsub("^0X", "0x"), nonce = n })
    assert.is_true(r.sent)
    -- no fees of the transfer are on the daemon's rows: the kept bytes may
    -- bid the caps, so the fill does
    assert.equal(tostring(MAX_FEE), r.max_fee_per_gas)
    assert.equal(tostring(MAX_TIP), r.max_priority_fee_per_gas)
    assert.equal(g.request, r.request_id)
    mined_fill(r, from, n)
    -- the kept bytes can never be mined now; the destination got nothing
    local h, serr = require("qtg.evm_rpc").send_raw_transaction(anvil.url, g.raw)
    assert.is_nil(h)
    assert.is_true(require("qtg.evm_rpc").is_nonce_too_low(serr), tostring(serr and serr.message))
    assert.equal("0", sup.balance(anvil.url, g.dest))
    -- the transfer itself is never signed at the filled nonce again (its
    -- node made READY and its reservation written again, as the runtime
    -- can), whatever its fee: it would outbid the fill
    s:query("DELETE FROM evm_nonce_reservation WHERE request_node_id = $1::uuid", g.node)
    s:query([[INSERT INTO evm_nonce_reservation (chain_id, address, nonce, request_node_id, payload_hash)
              VALUES ($1, $2, $3, $4::uuid, $5)]], CHAIN, from, n, g.node, g.payload.signing_hash)
    local again, aerr = qtg.signer.sign("fa", { request_id = g.request, request_node_id = g.node, attempt_no = 1,
                                               payload = g.payload.payload, payload_hash = g.payload.signing_hash })
    assert.is_nil(again)
    assert.equal("NONCE_FILLED", aerr.code, tostring(aerr.message))
    -- the signer's log: the fill, with no request (it stands for no transfer)
    local ev = s:query([[SELECT * FROM signer_events WHERE code = 'FILL_GRANTED' AND chain_id = $1
                          AND signer_address = $2 AND nonce = $3]], CHAIN, from, n)
    assert.equal(1, #ev)
    assert.equal(qtg.db.NULL, ev[1].request_id)
    assert.truthy(ev[1].reason:find("for operator:spec", 1, true), ev[1].reason)
    local refusals = s:query([[SELECT count(*)::int AS n FROM signer_events WHERE decision = 'refused'
                                AND signer_address = $1 AND code IN ('NONCE_NOT_GRANTED', 'FILL_NOT_SELF',
                                'DATA_NOT_ALLOWED', 'FEES_ABOVE_CAP') AND id > $2]], from, logged_before)[1].n
    assert.equal(#cases - 1, refusals)
    -- the audit trail: who filled which nonce, with the transaction
    local a = s:query([[SELECT actor, detail, request_id::text FROM audit_outbox WHERE action = 'evm.fill'
                         AND entity_id = $1]], CHAIN .. "/" .. from .. "/" .. n)
    assert.equal(1, #a)
    assert.equal("operator:spec", a[1].actor)
    assert.equal(r.tx_hash, a[1].detail.tx_hash)
    assert.equal(g.request, a[1].request_id)
    -- `qtgd audit verify` still lists the kept grant (the chain has the last
    -- word) and names the fill signed at its nonce; the fill is no transfer
    local listed = listed_for(from)
    assert.equal(1, #listed)
    assert.equal(g.request, listed[1].request_id)
    assert.truthy(listed[1].held:find("a fill was signed at that nonce (signer event " .. ev[1].id
      .. "), qtg's fills there are sent", 1, true), listed[1].held)
    -- the nonce is used: a second fill is refused before the signer is asked
    e = refused(fill, g.class, { chain_id = CHAIN, sender = from, nonce = n })
    assert.equal("illegal_transition", e.kind)
    assert.truthy(e.message:find("used already", 1, true), e.message)
    -- the fill's row, written with its bytes before the send, is watched:
    -- the reaper sees it mined once its block has the plan's confirmations,
    -- and the grant is settled
    local row = fill_row(r.tx_hash)
    assert.equal("sent", row.status)
    assert.equal(r.fill_id, row.id)
    assert.equal("operator:spec", row.actor)
    assert.equal(g.request, row.request_id)
    assert.equal(3, row.confirmations)
    assert.equal(ev[1].payload_hash, row.payload_hash)
    reaper_pass()
    row = fill_row(r.tx_hash)
    assert.equal("sent", row.status)
    assert.truthy(row.last_error:find(": 1 of 3 confirmations", 1, true), row.last_error)
    assert.equal(1, #listed_for(from))
    -- a fill row the runtime writes: born mined is refused; made mined for a
    -- payload the signer filled nowhere, it settles nothing
    local ok, ierr = pcall(s.query, s, [[INSERT INTO evm_fills (chain_id, address, nonce, tx_hash, payload_hash,
        signed_raw_tx, max_fee_per_gas, max_priority_fee_per_gas, actor, status, mined_block, settled_at)
      VALUES ($1, $2, $3, $4, $4, '0x00', 1, 1, 'operator:forger', 'mined', 1, now())]], CHAIN, from, n,
      "0x" .. string.rep("ab", 32))
    assert.is_false(ok)
    assert.truthy(tostring(ierr):find("a fill is written sent", 1, true), tostring(ierr))
    local forged = s:query([[INSERT INTO evm_fills (chain_id, address, nonce, tx_hash, payload_hash, signed_raw_tx,
        max_fee_per_gas, max_priority_fee_per_gas, actor) VALUES ($1, $2, $3, $4, $4, '0x00', 1, 1, 'operator:forger')
      RETURNING id]], CHAIN, from, n, "0x" .. string.rep("ab", 32))[1].id
    s:query("UPDATE evm_fills SET status = 'mined', mined_block = 1, settled_at = now() WHERE id = $1", forged)
    assert.equal(1, #listed_for(from))
    confirm()
    reaper_pass()
    row = fill_row(r.tx_hash)
    assert.equal("mined", row.status, tostring(row.last_error))
    assert.is_true(row.mined_block > 0)
    assert.equal(1, #s:query([[SELECT 1 FROM audit_outbox WHERE action = 'evm.fill_mined' AND entity_id = $1]],
      CHAIN .. "/" .. from .. "/" .. n))
    assert.equal(0, #listed_for(from))
    -- what was signed, and a settled status, never change
    for _, sql in ipairs({ "UPDATE evm_fills SET status = 'sent', settled_at = NULL WHERE id = $1",
                           "UPDATE evm_fills SET tx_hash = '0x' || repeat('cd', 32) WHERE id = $1",
                           "UPDATE evm_fills SET actor = 'operator:other' WHERE id = $1",
                           "UPDATE evm_fills SET mined_block = mined_block + 1 WHERE id = $1" }) do
      local ok, err = pcall(s.query, s, sql, row.id)
      assert.is_false(ok, sql)
      assert.truthy(tostring(err):find("fill " .. row.id, 1, true), tostring(err))
    end
  end)

  it("cancels a live transfer only when asked to, and sends a fill above the chain's count queued, saying so", function()
    start_signer("fc", 3)
    local low = { max_fee_per_gas = "3000000000", max_priority_fee_per_gas = "1000000000" }
    local g = kept_grant("fill_t_c", "fc", 3, 1, low)
    local from, n = g.from, g.nonce
    -- the transfer in flight on its own bytes (signed, its node submitting):
    -- a fill would cancel a live payment, and is refused unless asked to
    s:query([[UPDATE evm_nonce_reservation SET status = 'signed', signed_raw_tx = $2, tx_hash = $3
               WHERE request_node_id = $1::uuid]], g.node, g.raw,
      "0x" .. qtg.crypto.keccak256_hex(qtg.crypto.unhex(g.raw:sub(3))))
    s:query("UPDATE movement_request_nodes SET node_state = 'SUBMITTING' WHERE id = $1::uuid", g.node)
    s:query([[INSERT INTO evm_transfer_tx (reservation_id, request_node_id, attempt_no, chain_id, from_address, fields)
              SELECT id, request_node_id, 1, chain_id, address, $2::jsonb FROM evm_nonce_reservation
               WHERE request_node_id = $1::uuid]], g.node, require("cjson").encode(low))
    local e = refused(fill, g.class, { chain_id = CHAIN, sender = from, nonce = n })
    assert.equal("illegal_transition", e.kind)
    assert.truthy(e.message:find("would cancel a live payment", 1, true), e.message)
    assert.equal("usage", refused(fill, g.class, { chain_id = CHAIN, sender = from, nonce = n, cancel = "yes" }).kind)
    local r = fill(g.class, { chain_id = CHAIN, sender = from, nonce = n, cancel = true })
    assert.is_true(r.sent)
    assert.equal(1, r.queued_behind)
    -- a quarter over the transfer's stored fees (or the market's, if higher)
    assert.is_true(tonumber(r.max_fee_per_gas) >= 3750000000, r.max_fee_per_gas)
    assert.is_true(tonumber(r.max_priority_fee_per_gas) >= 1250000000, r.max_priority_fee_per_gas)
    -- its bytes are in the audit row, to send again should a pool drop it
    local a = s:query([[SELECT detail FROM audit_outbox WHERE action = 'evm.fill' AND entity_id = $1]],
      CHAIN .. "/" .. from .. "/" .. n)[1]
    assert.equal(r.tx_hash, "0x" .. qtg.crypto.keccak256_hex(qtg.crypto.unhex(a.detail.raw:sub(3))))
    assert.equal(n - 1, a.detail.chain_count)
    sup.rpc(anvil.url, "evm_mine", {})
    assert.is_nil(sup.receipt(anvil.url, r.tx_hash), "mined before the nonce before it")
    -- the cancelled transfer's reservation surfaced, as its FAILED report
    -- leaves it: the reaper watches its bytes (and never sends them again)
    s:query([[UPDATE evm_nonce_reservation SET status = 'surfaced', surfaced_reason = 'spec: cancelled by a fill'
               WHERE request_node_id = $1::uuid]], g.node)
    -- the pool loses the fill: the reaper sends the same bytes again
    local rpc = require "qtg.evm_rpc"
    sup.rpc(anvil.url, "anvil_dropAllTransactions", {})
    assert.is_false(rpc.get_transaction_by_hash(anvil.url, r.tx_hash))
    reaper_pass()
    local row = fill_row(r.tx_hash)
    assert.equal("sent", row.status)
    assert.equal(1, row.rebroadcasts)
    assert.truthy(row.last_error:find("sent again, the same bytes (behind 1 nonces", 1, true), row.last_error)
    assert.truthy(rpc.get_transaction_by_hash(anvil.url, r.tx_hash), "in the pool again")
    local watched = s:query("SELECT last_error FROM evm_nonce_reservation WHERE request_node_id = $1::uuid", g.node)[1]
    assert.truthy(watched.last_error:find(("a fill is sent there (fill %d, %s)"):format(row.id, r.tx_hash), 1, true),
      watched.last_error)
    -- a second fill at the nonce outbids the first by a quarter, within the caps
    local r2 = fill(g.class, { chain_id = CHAIN, sender = from, nonce = n, cancel = true })
    assert.is_true(r2.sent)
    assert.is_true(tonumber(r2.max_fee_per_gas) >= math.ceil(tonumber(r.max_fee_per_gas) * 1.25))
    assert.is_true(tonumber(r2.max_priority_fee_per_gas) >= math.ceil(tonumber(r.max_priority_fee_per_gas) * 1.25))
    -- the nonce before it used: the second fill is mined, and the kept bytes never can be
    use_nonce(from, n - 1)
    mined_fill(r2, from, n)
    assert.is_nil((rpc.send_raw_transaction(anvil.url, g.raw)))
    assert.equal("0", sup.balance(anvil.url, g.dest))
    -- the reaper: the second mined, the first replaced by it
    confirm()
    reaper_pass()
    assert.equal("mined", fill_row(r2.tx_hash).status)
    row = fill_row(r.tx_hash)
    assert.equal("replaced", row.status)
    assert.truthy(row.last_error:find("fill " .. r2.tx_hash .. " was mined at this nonce", 1, true), row.last_error)
  end)

  -- A transfer cancelled with cancel = true is still in flight on its own
  -- bytes: its node's observation and recovery, and the reaper, find them
  -- gone from the pool (the fill replaced them there, or a pool lost both)
  -- and would send them again, racing the fill for the nonce.  None does
  -- once a fill of qtg's is sent at their nonce.
  it("sends a cancelled transfer's bytes no more once a fill is sent at their nonce", function()
    start_signer("fc", 3)
    local rpc = require "qtg.evm_rpc"
    local ex = require "qtg.executors.evm_transfer"
    local low = { max_fee_per_gas = "3000000000", max_priority_fee_per_gas = "1000000000" }
    local g = kept_grant("fill_t_c", "fc", 3, 1, low)
    local from, n = g.from, g.nonce
    local hash = "0x" .. qtg.crypto.keccak256_hex(qtg.crypto.unhex(g.raw:sub(3)))
    s:query([[UPDATE evm_nonce_reservation SET status = 'signed', signed_raw_tx = $2, tx_hash = $3
               WHERE request_node_id = $1::uuid]], g.node, g.raw, hash)
    s:query("UPDATE evm_nonce_reservation SET status = 'broadcast' WHERE request_node_id = $1::uuid", g.node)
    s:query("UPDATE movement_request_nodes SET node_state = 'SUBMITTED' WHERE id = $1::uuid", g.node)
    s:query([[INSERT INTO evm_transfer_tx (reservation_id, request_node_id, attempt_no, chain_id, from_address, fields)
              SELECT id, request_node_id, 1, chain_id, address, $2::jsonb FROM evm_nonce_reservation
               WHERE request_node_id = $1::uuid]], g.node, require("cjson").encode(low))
    assert.equal(hash, (rpc.send_raw_transaction(anvil.url, g.raw)))
    local r = fill(g.class, { chain_id = CHAIN, sender = from, nonce = n, cancel = true })
    assert.is_true(r.sent)
    sup.rpc(anvil.url, "anvil_dropAllTransactions", {})
    local octx = { action_type = ex.TRANSFER, request_node_id = g.node, node_config = {} }
    local settings = { evm_rpc_urls = CHAIN .. "=" .. anvil.url }
    local fill_id = fill_row(r.tx_hash).id
    for _, look in ipairs({ "observe", "recover" }) do
      local a = cond.with_settings(settings, ex[look], octx)
      assert.equal("UNKNOWN", a.status, look)
      assert.equal("EVM_NONCE_FILLED", a.error_code, look)
      assert.truthy(a.error_detail:find(("fill %d (%s, sent)"):format(fill_id, r.tx_hash), 1, true), a.error_detail)
      assert.is_false(rpc.get_transaction_by_hash(anvil.url, hash), look .. " sent the cancelled transfer again")
    end
    reaper_pass()
    assert.is_false(rpc.get_transaction_by_hash(anvil.url, hash), "the reaper sent the cancelled transfer again")
    local res = s:query("SELECT status, last_error FROM evm_nonce_reservation WHERE request_node_id = $1::uuid",
      g.node)[1]
    assert.equal("broadcast", res.status)
    assert.truthy(res.last_error:find(("a fill is sent at nonce %d (fill %d, %s) to void these bytes: they are not "
      .. "sent again"):format(n, fill_id, r.tx_hash), 1, true), res.last_error)
    -- the fill is sent again by the reaper, and mined once the nonce before
    -- it is used; the transfer never is
    assert.truthy(rpc.get_transaction_by_hash(anvil.url, r.tx_hash), "the fill in the pool again")
    use_nonce(from, n - 1)
    mined_fill(r, from, n)
    assert.equal("0", sup.balance(anvil.url, g.dest))
  end)

  -- A fill asked for while the transfer's dispatch is still open (its node
  -- READY, so not in flight: no `cancel = true` is needed) comes before the
  -- transfer's first send; and a fill the reaper dropped (the RPC refused
  -- it) still stands for the operator's intent.  Neither lets the
  -- transfer's bytes out.
  it("sends no transfer's bytes at a nonce a fill was sent at first, nor after the fill is dropped", function()
    start_signer("fc", 3)
    local rpc = require "qtg.evm_rpc"
    local ex = require "qtg.executors.evm_transfer"
    local nonces = require "qtg.evm_nonces"
    local g = kept_grant("fill_t_c", "fc", 3, 1)
    local from, n = g.from, g.nonce
    local hash = "0x" .. qtg.crypto.keccak256_hex(qtg.crypto.unhex(g.raw:sub(3)))
    local r = fill(g.class, { chain_id = CHAIN, sender = from, nonce = n })
    assert.is_true(r.sent)
    -- the dispatch stores the signed bytes, then sends them: not sent
    s:query([[UPDATE evm_nonce_reservation SET status = 'signed', signed_raw_tx = $2, tx_hash = $3
               WHERE request_node_id = $1::uuid]], g.node, g.raw, hash)
    local row = nonces.read(function(x) return nonces.for_node(x, g.node) end)
    local st, err = cond.with_settings({ evm_rpc_urls = CHAIN .. "=" .. anvil.url }, ex.broadcast, anvil.url, row)
    assert.equal("unknown", st)
    assert.equal("EVM_NONCE_FILLED", err.code, tostring(err.message))
    assert.is_false(rpc.get_transaction_by_hash(anvil.url, hash), "the first send went out beside the fill")
    -- the fill dropped, as the reaper settles one the RPC keeps refusing:
    -- recovery still leaves the bytes unsent
    local fill_id = fill_row(r.tx_hash).id
    s:query([[UPDATE evm_fills SET status = 'dropped', settled_at = clock_timestamp() WHERE id = $1]], fill_id)
    sup.rpc(anvil.url, "anvil_dropAllTransactions", {})
    local a = cond.with_settings({ evm_rpc_urls = CHAIN .. "=" .. anvil.url }, ex.recover,
      { action_type = ex.TRANSFER, request_node_id = g.node, node_config = {} })
    assert.equal("UNKNOWN", a.status)
    assert.equal("EVM_NONCE_FILLED", a.error_code)
    assert.truthy(a.error_detail:find(("fill %d (%s, dropped)"):format(fill_id, r.tx_hash), 1, true), a.error_detail)
    assert.is_false(rpc.get_transaction_by_hash(anvil.url, hash), "recovery sent the bytes after the fill dropped")
  end)

  it("alerts the operators when the chain uses a filled nonce for another transaction", function()
    start_signer("fa", 1)
    local g = kept_grant("fill_t_a", "fa", 1, 1)
    local from, n = g.from, g.nonce
    local r = fill(g.class, { chain_id = CHAIN, sender = from, nonce = n })
    assert.equal(1, r.queued_behind)
    -- the pool loses the fill, and the kept bytes are sent instead, then mined
    local rpc = require "qtg.evm_rpc"
    sup.rpc(anvil.url, "anvil_dropAllTransactions", {})
    assert.is_false(rpc.get_transaction_by_hash(anvil.url, r.tx_hash))
    assert.truthy(rpc.send_raw_transaction(anvil.url, g.raw))
    use_nonce(from, n - 1)
    mined_raw(g.raw, "the kept bytes mined")
    -- the verdict waits for the look to hold; then it is final, and loud
    reaper_pass({ evm_nonce_taken_confirm_seconds = 3600 })
    local row = fill_row(r.tx_hash)
    assert.equal("sent", row.status)
    assert.truthy(row.last_error:find("no fill of qtg's at it was mined", 1, true), row.last_error)
    reaper_pass()
    row = fill_row(r.tx_hash)
    assert.equal("taken", row.status)
    assert.truthy(row.last_error:find("maybe the very bytes the fill was to void", 1, true), row.last_error)
    local note = s:query([[SELECT severity, payload FROM notification_outbox WHERE kind = 'fill_nonce_taken'
                            AND dedupe_key = $1]], "fill_nonce_taken:" .. row.id)
    assert.equal(1, #note)
    assert.equal("critical", note[1].severity)
    assert.equal(1, #s:query([[SELECT 1 FROM audit_outbox WHERE action = 'fill_nonce_taken'
                                AND request_id = $1::uuid]], g.request))
    -- the grant is still listed: its bytes were mined, not voided
    local listed = listed_for(from)
    assert.equal(1, #listed)
    assert.truthy(listed[1].held:find("qtg's fills there are taken", 1, true), listed[1].held)
    -- the transfer's bytes the daemon holds mined in the fill's place: said
    -- at the first look, with no hold (the receipt is the proof)
    local g2 = kept_grant("fill_t_a", "fa", 1, 1)
    local hash2 = "0x" .. qtg.crypto.keccak256_hex(qtg.crypto.unhex(g2.raw:sub(3)))
    s:query([[UPDATE evm_nonce_reservation SET status = 'signed', signed_raw_tx = $2, tx_hash = $3
               WHERE request_node_id = $1::uuid]], g2.node, g2.raw, hash2)
    local r2 = fill(g2.class, { chain_id = CHAIN, sender = from, nonce = g2.nonce })
    sup.rpc(anvil.url, "anvil_dropAllTransactions", {})
    assert.truthy(rpc.send_raw_transaction(anvil.url, g2.raw))
    use_nonce(from, g2.nonce - 1)
    mined_raw(g2.raw, "the transfer's bytes mined")
    reaper_pass({ evm_nonce_taken_confirm_seconds = 3600 })
    row = fill_row(r2.tx_hash)
    assert.equal("taken", row.status)
    assert.truthy(row.last_error:find("the transfer's own bytes " .. hash2 .. " were mined", 1, true), row.last_error)
    assert.equal("250000000000000000", sup.balance(anvil.url, g2.dest), "the payment moved")
  end)

  it("drops a fill the RPC refuses, at its first send or at every send again", function()
    start_signer("fa", 1)
    local g = kept_grant("fill_t_a", "fa", 1)
    local from, n = g.from, g.nonce
    local funds = sup.rpc(anvil.url, "eth_getBalance", { from, "latest" })
    -- no funds for gas: refused at the first send
    sup.rpc(anvil.url, "anvil_setBalance", { from, "0x0" })
    local e = refused(fill, g.class, { chain_id = CHAIN, sender = from, nonce = n })
    assert.equal("unavailable", e.kind)
    assert.truthy(e.message:find("the RPC refused it", 1, true), e.message)
    local rows = s:query("SELECT * FROM evm_fills WHERE chain_id = $1 AND address = $2 AND nonce = $3", CHAIN, from, n)
    assert.equal(1, #rows)
    assert.equal("dropped", rows[1].status)
    assert.truthy(rows[1].last_error:find("refused at its first send", 1, true), rows[1].last_error)
    -- funded: a new fill is sent; the pool loses it, the funds go, and
    -- every send again is refused: dropped after the reaper's limit
    sup.rpc(anvil.url, "anvil_setBalance", { from, funds })
    local r = fill(g.class, { chain_id = CHAIN, sender = from, nonce = n })
    assert.is_true(r.sent)
    sup.rpc(anvil.url, "anvil_dropAllTransactions", {})
    sup.rpc(anvil.url, "anvil_setBalance", { from, "0x0" })
    reaper_pass({ evm_nonce_reaper_max_rebroadcasts = 2 })
    local row = fill_row(r.tx_hash)
    assert.equal("sent", row.status)
    assert.equal(1, row.rebroadcasts)
    assert.truthy(row.last_error:find("sending it again was refused", 1, true), row.last_error)
    -- the same bytes asked again (the caps both times) are that row: its
    -- refusal here does not drop the row the reaper watches
    e = refused(fill, g.class, { chain_id = CHAIN, sender = from, nonce = n })
    assert.truthy(e.message:find("the RPC refused it", 1, true), e.message)
    local again = fill_row(r.tx_hash)
    assert.equal(row.id, again.id)
    assert.equal("sent", again.status)
    reaper_pass({ evm_nonce_reaper_max_rebroadcasts = 2 })
    row = fill_row(r.tx_hash)
    assert.equal("dropped", row.status)
    assert.truthy(row.last_error:find("refused it 2 times", 1, true), row.last_error)
    assert.equal(2, #s:query("SELECT 1 FROM audit_outbox WHERE action = 'evm.fill_dropped' AND entity_id = $1",
      CHAIN .. "/" .. from .. "/" .. n))
    -- funded again, the next fill goes through
    sup.rpc(anvil.url, "anvil_setBalance", { from, funds })
    mined_fill(fill(g.class, { chain_id = CHAIN, sender = from, nonce = n }), from, n)
  end)

  it("alerts the operators when other bytes hold a fill's nonce in the pool, and never drops it for that", function()
    start_signer("fa", 1)
    local g = kept_grant("fill_t_a", "fa", 1, 1)
    local from, n = g.from, g.nonce
    local rpc = require "qtg.evm_rpc"
    -- someone pools the kept bytes (at the caps) before the fill: the fill
    -- cannot outbid them, and its send's outcome is not a refusal
    assert.truthy(rpc.send_raw_transaction(anvil.url, g.raw))
    local e = refused(fill, g.class, { chain_id = CHAIN, sender = from, nonce = n })
    assert.equal("unavailable", e.kind)
    assert.truthy(e.message:find("is not known", 1, true), e.message)
    local row = s:query([[SELECT * FROM evm_fills WHERE chain_id = $1 AND address = $2 AND nonce = $3]],
      CHAIN, from, n)[1]
    assert.equal("sent", row.status)
    for _ = 1, 3 do reaper_pass({ evm_nonce_reaper_max_rebroadcasts = 1 }) end
    row = fill_row(row.tx_hash)
    assert.equal("sent", row.status)
    assert.equal(0, row.rebroadcasts)
    assert.truthy(row.last_error:find("other bytes hold nonce " .. n .. " in the node's pool", 1, true),
      row.last_error)
    local note = s:query("SELECT severity FROM notification_outbox WHERE kind = 'fill_outbid' AND dedupe_key = $1",
      "fill_outbid:" .. row.id)
    assert.equal(1, #note)
    assert.equal("critical", note[1].severity)
    -- the nonce before it used: the kept bytes are mined, and the fill is taken
    use_nonce(from, n - 1)
    mined_raw(g.raw, "the kept bytes mined")
    reaper_pass()
    assert.equal("taken", fill_row(row.tx_hash).status)
  end)

  it("with an enrolment, fills only for an enrolled person's signature of that very fill", function()
    -- the grant, under a signer counting the rows (sup.start_signer's default)
    local first = start_signer("fb", 2)
    local g = kept_grant("fill_t_b", "fb", 2)
    local from, n = g.from, g.nonce
    sup.host.stop(first, 30)
    -- the same key under an enrolment: alice and bob persons, ini an initiator
    local keys, pubs, lines = {}, {}, { "deployment " .. DEPLOYMENT, "quorum * 1" }
    for _, p in ipairs({ { "alice", "person" }, { "bob", "person" }, { "ini", "initiator" } }) do
      keys[p[1]], pubs[p[1]] = sup.host.approver_key(dir, p[1])
      lines[#lines + 1] = ("%s %s %s operator:%s"):format(p[2], p[1], pubs[p[1]], p[1])
    end
    local path = dir .. "/approvers"
    sup.host.write(path, table.concat(lines, "\n") .. "\n")
    os.execute("chmod 644 " .. common.quote(path))
    start_signer("fb", 2, { MG_SIGNER_APPROVERS = path })
    local function sign_fill(who, over)
      local a = { deployment = DEPLOYMENT, chain = tostring(CHAIN), sender = from, nonce = tostring(n) }
      for k, v in pairs(over or {}) do a[k] = v end
      local q = common.quote
      -- its stdout alone (stderr shows the approver what is signed)
      local rc, out = sup.host.run({}, { "sh", "-c", q(table.concat({ q(sup.host.bin), "approver", "sign-fill",
        q(keys[who]), "--deployment", q(a.deployment), "--chain", q(a.chain), "--sender", q(a.sender), "--nonce",
        q(a.nonce), "2>/dev/null" }, " ")) })
      return rc, out:match("^(%x+)\n$")
    end
    local _, alice = sign_fill("alice")
    assert.equal(128, #alice)
    local _, other_nonce = sign_fill("alice", { nonce = tostring(n + 1) })
    local _, other_desk = sign_fill("alice", { deployment = "another-desk" })
    local _, other_chain = sign_fill("alice", { chain = "1" })
    local _, ini = sign_fill("ini")
    local f = fields({ to = from, value = "0", nonce = n })
    for i, c in ipairs({
      { "operator:alice", nil },              -- no signature
      { "operator:bob", alice },              -- another person's
      { "operator:mallory", alice },          -- no enrolled person's principal
      { "operator:ini", ini },                -- an initiator signs requests, never fills
      { "operator:alice", other_nonce },      -- another nonce's statement
      { "operator:alice", other_desk },       -- another deployment's
      { "operator:alice", other_chain },      -- another chain's
    }) do
      local sig, err = ask_fill("fb", f, c[1], c[2])
      assert.is_nil(sig, "case " .. i)
      assert.equal("FILL_NOT_SIGNED", err.code, "case " .. i .. ": " .. tostring(err.message))
    end
    assert.equal(n, sup.nonce(anvil.url, from))
    -- the tool refuses what is not a fill, and signs nothing then
    local typo = qtg.signer.checksum_address(from)
    typo = typo:sub(1, 2) .. typo:sub(3):gsub("%a", function(c) return c == c:upper() and c:lower() or c:upper() end)
    for _, over in ipairs({ { nonce = "07" }, { chain = "0" }, { sender = "0x1234" }, { deployment = "a b" },
                            { deployment = "--chain" }, { sender = typo } }) do
      local rc, sig = sign_fill("alice", over)
      assert.equal(2, rc)
      assert.is_nil(sig)
    end
    local rc, out = sup.host.run({}, { common.quote(sup.host.bin), "approver", "sign-fill", common.quote(keys.alice),
      "--chain", tostring(CHAIN), "--sender", from, "--nonce", tostring(n), "2>&1" })
    assert.equal(2, rc)
    assert.truthy(out:find("sign-fill needs '--deployment'", 1, true), out)
    -- alice, an operator with the operate role at the console, relays her
    -- own signature of this fill: filled
    local uid = 910000 + math.random(1, 9999)
    require("qtg.principals").add(s, "alice", uid, { "read", "operate" }, "system:spec")
    local cmds = require("qtg.console.commands").bind({ actor = "console:" .. uid, print = function() end })
    local ok, r = pcall(cond.with_settings, { evm_rpc_urls = CHAIN .. "=" .. anvil.url, network_class = g.class },
      cmds.fill_nonce, CHAIN, from, n, alice:upper())
    s:query("DELETE FROM operators WHERE uid = $1", uid)
    assert(ok, tostring(r))
    assert.equal("operator:alice", s:query([[SELECT actor FROM audit_outbox WHERE action = 'evm.fill'
                                               AND entity_id = $1]], CHAIN .. "/" .. from .. "/" .. n)[1].actor)
    mined_fill(r, from, n)
    assert.equal("0", sup.balance(anvil.url, g.dest))
    local ev = s:query([[SELECT reason FROM signer_events WHERE code = 'FILL_GRANTED' AND signer_address = $1]], from)
    assert.equal(1, #ev)
    assert.truthy(ev[1].reason:find("operator:alice (signed)", 1, true), ev[1].reason)
  end)
end)
