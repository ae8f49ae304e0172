-- EVM JSON-RPC (qtg.evm_rpc) and evm_nonce_reaper against a real local
-- chain (anvil, tools/anvil), with the JSON-RPC stand-in of
-- tools/fake-providers only for what a real node never does (garbage, an
-- error status, a hang).  Transactions are signed by anvil's unlocked dev
-- accounts (eth_signTransaction), so the reaper sees real signed bytes,
-- real mined nonces and real refusals.
local qtg = require "qtg"
local cjson = require "cjson"

local sup -- spec/lua/support/conditional.lua
local rpc -- qtg.evm_rpc

local CHAIN = 31337

local function hexq(n) return string.format("0x%x", n) end

-- A signed EIP-1559 transfer from a dev account (not sent): raw, hash.
local function sign(url, from, nonce, value)
  local raw = sup.rpc(url, "eth_signTransaction", { {
    from = from, to = "0x000000000000000000000000000000000000dead", value = value or "0x1",
    nonce = hexq(nonce), gas = "0x5208", maxFeePerGas = "0x77359400", maxPriorityFeePerGas = "0x1",
    chainId = hexq(CHAIN) } })
  return raw, "0x" .. qtg.crypto.keccak256_hex(qtg.crypto.unhex(raw))
end

local function send(url, raw) return sup.rpc(url, "eth_sendRawTransaction", { raw }) end

local function reservation(t)
  return sup.query([[
    INSERT INTO evm_nonce_reservation (chain_id, address, nonce, status, request_node_id, payload_hash,
      signed_raw_tx, tx_hash, reserved_at, updated_at)
    VALUES ($1, $2, $3, $4, $5::uuid, $6, $7, $8, now() - make_interval(secs => $9), now() - make_interval(secs => $9))
    RETURNING id]], t.chain or CHAIN, t.address, t.nonce, t.status or "reserved", t.node or qtg.db.NULL,
    t.raw and ("0x" .. string.rep("ab", 32)) or qtg.db.NULL, t.raw or qtg.db.NULL, t.hash or qtg.db.NULL,
    t.age or 3600)[1].id
end

local function row(id)
  return sup.query("SELECT * FROM evm_nonce_reservation WHERE id = $1", id)[1]
end

local function snapshot(ids)
  local out = {}
  for i, id in ipairs(ids) do
    local r = row(id)
    out[i] = { r.status, r.rebroadcasts, r.last_error, r.surfaced_reason, r.consumed_block, r.updated_at }
  end
  return out
end

describe("qtg.evm_rpc", function()
  local chain, prov, dir
  setup(function()
    sup = require "spec.lua.support.conditional"
    rpc = require "qtg.evm_rpc"
    dir = sup.tmpdir()
    chain = sup.start_anvil()
    prov = sup.start_providers(dir)
  end)
  teardown(function() sup.stop_all() end)

  it("speaks to a real node: chain id, block number, counts, code, call, unknown hashes", function()
    assert.equals(CHAIN, rpc.chain_id(chain.url))
    assert.is_number(rpc.block_number(chain.url))
    assert.equals(0, rpc.get_transaction_count(chain.url, sup.DEV[3].address, "latest"))
    assert.equals("0x", rpc.get_code(chain.url, sup.DEV[3].address))
    assert.equals("0x", rpc.call(chain.url, { to = sup.DEV[3].address, data = "0x" }))
    local nothing = "0x" .. string.rep("11", 32)
    assert.is_false(rpc.get_transaction_by_hash(chain.url, nothing))
    assert.is_false(rpc.get_transaction_receipt(chain.url, nothing))
    local raw, hash = sign(chain.url, sup.DEV[3].address, 0)
    assert.equals(hash, rpc.send_raw_transaction(chain.url, raw))
    local rc = sup.wait_for(function() return rpc.get_transaction_receipt(chain.url, hash) end, 10, "the receipt")
    assert.equals("0x1", rc.status)
    assert.equals(0, rpc.quantity(rpc.get_transaction_by_hash(chain.url, hash).nonce))
    assert.equals(1, rpc.get_transaction_count(chain.url, (sup.DEV[3].address:upper():gsub("^0X", "0x"))))
    -- the same bytes again: the node says so, and that is recognised
    local again, err = rpc.send_raw_transaction(chain.url, raw)
    assert.is_nil(again)
    assert.equals("rpc", err.kind)
    assert.is_true(rpc.is_nonce_too_low(err) or rpc.is_already_known(err), tostring(err))
  end)

  it("returns node errors, garbage, error statuses and timeouts as structured values", function()
    local _, err = rpc.send_raw_transaction(chain.url, "0x02dead")
    assert.equals("rpc", err.kind)
    assert.is_number(err.code)
    local url = prov.url .. "/rpc"
    local _, e1 = rpc.request(url, "eth_nosuchmethod", {})
    assert.equals("rpc", e1.kind)
    assert.equals(-32601, e1.code)
    prov.control({ service = "rpc", mode = "garbage" })
    local _, e2 = rpc.chain_id(url)
    assert.equals("garbage", e2.kind)
    prov.control({ service = "rpc", mode = "error", status = 503 })
    local _, e3 = rpc.chain_id(url)
    assert.equals("status", e3.kind)
    assert.equals(503, e3.status)
    prov.control({ service = "rpc", mode = "hang" })
    local _, e4 = rpc.chain_id(url, { timeout = 0.3 })
    assert.equals("timeout", e4.kind)
    prov.control({ service = "rpc", mode = "ok", state = { rpc_chain_id = 5 } })
    assert.equals(5, rpc.chain_id(url))
    local _, e5 = rpc.chain_id("http://127.0.0.1:9/")
    assert.equals("refused", e5.kind)
    assert.matches("evm_rpc refused %(eth_chainId%)", tostring(e5))
  end)

  it("refuses malformed addresses, hashes and raw bytes before any I/O", function()
    local before = prov.stats().requests.rpc
    local url = prov.url .. "/rpc"
    for _, bad in ipairs({ "0x123", "f39fd6e51aad88f6f4ce6ab8827279cfffb92266", "0xg39fd6e51aad88f6f4ce6ab8827279cfffb92266",
                           "0xF39fd6e51aad88f6f4ce6ab8827279cfffb92266", 42 }) do
      local v, err = rpc.get_transaction_count(url, bad)
      assert.is_nil(v)
      assert.equals("invalid", err.kind, tostring(bad))
    end
    assert.equals("0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266",
      rpc.check_address("0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266")) -- EIP-55
    assert.equals("invalid", select(2, rpc.get_transaction_receipt(url, "0x1234")).kind)
    assert.equals("invalid", select(2, rpc.send_raw_transaction(url, "0x0")).kind)
    assert.equals("invalid", select(2, rpc.get_transaction_count(url, sup.DEV[1].address, "soon")).kind)
    assert.equals(before, prov.stats().requests.rpc)
  end)

  it("parses MG_EVM_RPC_URLS and refuses malformed entries", function()
    local eps = rpc.endpoints("1=https://a.example/x, 31337=http://127.0.0.1:8545")
    assert.equals("https://a.example/x", eps[1])
    assert.equals("http://127.0.0.1:8545", eps[31337])
    assert.matches("not chain_id=", select(2, rpc.endpoints("mainnet=http://x")))
    assert.matches("twice", select(2, rpc.endpoints("1=http://a,1=http://b")))
  end)
end)

describe("evm_nonce_reaper", function()
  local chain, prov, dir, s, req_id, node_id
  local A, B
  setup(function()
    sup = require "spec.lua.support.conditional"
    dir = sup.tmpdir()
    chain = sup.start_anvil()
    prov = sup.start_providers(dir, { rpc_chain_id = 31338 })
    A, B = sup.DEV[1].address, sup.DEV[2].address
    s = qtg.db.acquire()
    -- rows of the chain ids this spec's chains take, left by an earlier run
    -- of it or by another spec's chain (system/demo_spec's is 31337 too):
    -- their chains are gone, and the reaper, asked about these ids, would
    -- settle them beside this spec's own (its transfers go with them)
    s:query("DELETE FROM evm_nonce_reservation WHERE chain_id IN (1, 999, 31337, 31338)")
    local side = require "spec.lua.support.sidecar"
    local T = side.template(s, "spec_nonce_" .. sup.uid("t"):gsub("-", "_"))
    local r = side.request(s, T, qtg.settings.network_class, "http://127.0.0.1:9/cb")
    req_id = r.id
    node_id = s:query("SELECT id FROM movement_request_nodes WHERE request_id = $1::uuid", req_id)[1].id
  end)
  teardown(function()
    s:release()
    sup.stop_all()
  end)

  local function over(extra)
    local t = { evm_rpc_urls = CHAIN .. "=" .. chain.url, evm_nonce_reaper_age_seconds = 60 }
    for k, v in pairs(extra or {}) do t[k] = v end
    return t
  end

  it("settles every kind of stale reservation against the chain, once", function()
    -- The chain: A's nonces 0 and 1 are mined (nonce 1 by another payload
    -- than the one reserved), nonce 2 is signed but the node never got it;
    -- B's nonce 0 was used outside qtg.
    local raw0, h0 = sign(chain.url, A, 0)
    send(chain.url, raw0)
    local raw1a, h1a = sign(chain.url, A, 1, "0x1")
    local raw1b = sign(chain.url, A, 1, "0x2")
    send(chain.url, raw1b)
    local raw2, h2 = sign(chain.url, A, 2)
    sup.rpc(chain.url, "eth_sendTransaction", { { from = B, to = A, value = "0x1" } })
    local rawb1, hb1 = sign(chain.url, B, 1, "0xffffffffffffffffffffffffffffffffffff") -- more than B has

    local consumed = reservation{ address = A, nonce = 0, status = "signed", raw = raw0, hash = h0 }
    local replaced = reservation{ address = A, nonce = 1, status = "broadcast", raw = raw1a, hash = h1a, node = node_id }
    local lost = reservation{ address = A, nonce = 2, status = "broadcast", raw = raw2, hash = h2 }
    local unsigned = reservation{ address = A, nonce = 10 }
    local external = reservation{ address = B, nonce = 0 }
    local refused = reservation{ address = B, nonce = 1, status = "signed", raw = rawb1, hash = hb1 }
    local fresh = reservation{ address = A, nonce = 20, age = 1 }
    local elsewhere = reservation{ chain = 999, address = A, nonce = 0 }
    local ids = { consumed, replaced, lost, unsigned, external, refused, fresh, elsewhere }

    -- The "nonce taken" verdict at the first look here (confirm 0 s); the
    -- next case holds it over time, as the default does.
    -- Mining on demand from here, so the rebroadcast waits in the pool.
    sup.rpc(chain.url, "evm_setAutomine", { false })
    local n = sup.tick("evm_nonce_reaper", over{ evm_nonce_reaper_max_rebroadcasts = 1, evm_nonce_taken_confirm_seconds = 0 })
    assert.equals(6, n)

    local r = row(consumed)
    assert.equals("consumed", r.status)
    assert.is_number(r.consumed_block)
    r = row(replaced)
    assert.equals("surfaced", r.status)
    assert.matches("another transaction", r.surfaced_reason)
    assert.equals(raw1a, r.signed_raw_tx, "the signed bytes stay with their nonce")
    r = row(lost)
    assert.equals("broadcast", r.status)
    assert.equals(1, r.rebroadcasts)
    assert.matches("waiting for them to be mined", r.last_error)
    -- the node got the very same bytes: they are mined under our hash
    assert.equals(h2, sup.rpc(chain.url, "eth_getTransactionByHash", { h2 }).hash)
    sup.rpc(chain.url, "evm_mine", {})
    sup.rpc(chain.url, "evm_setAutomine", { true })
    sup.wait_for(function() return sup.rpc(chain.url, "eth_getTransactionReceipt", { h2 }) ~= cjson.null end,
      10, "the rebroadcast transaction to be mined")
    assert.equals(3, rpc.get_transaction_count(chain.url, A))
    assert.equals("released", row(unsigned).status)
    r = row(external)
    assert.equals("surfaced", r.status)
    assert.matches("outside qtg", r.surfaced_reason)
    r = row(refused)
    assert.equals("surfaced", r.status)
    assert.matches("rebroadcast refused 1 times", r.surfaced_reason)
    assert.matches("[Ii]nsufficient funds", r.last_error)
    assert.equals("reserved", row(fresh).status)
    assert.equals(qtg.db.NULL, row(fresh).last_checked_at)
    assert.equals("reserved", row(elsewhere).status)
    for _, id in ipairs(ids) do assert.equals(qtg.db.NULL, row(id).reap_lease_owner) end

    -- operators hear about the three surfaced ones, once each; the request
    -- of the replaced nonce gets its request_attention callback
    local notes = sup.query([[SELECT dedupe_key, kind, severity FROM notification_outbox
                               WHERE dedupe_key = ANY(ARRAY(SELECT 'nonce_reservation_surfaced:' || x
                                                              FROM unnest($1::bigint[]) x))]],
      "{" .. table.concat({ replaced, external, refused }, ",") .. "}")
    assert.equals(3, #notes)
    for _, nrow in ipairs(notes) do assert.equals("critical", nrow.severity) end
    local cb = sup.query([[SELECT payload FROM movement_callback_outbox
                            WHERE request_id = $1::uuid AND event_type = 'request_attention']], req_id)
    assert.equals(1, #cb)
    local body = cjson.decode(cb[1].payload)
    assert.equals("nonce_reservation_surfaced", body.data.reason)
    assert.equals(tostring(replaced), body.data.entity_id)
    local audits = sup.query([[SELECT action, count(*)::int AS n FROM audit_outbox
                                WHERE entity_type = 'evm_nonce_reservation'
                                  AND entity_id = ANY(ARRAY(SELECT x::text FROM unnest($1::bigint[]) x))
                                GROUP BY action ORDER BY action]],
      "{" .. table.concat(ids, ",") .. "}")
    local by = {}
    for _, a in ipairs(audits) do by[a.action] = a.n end
    assert.same({ ["nonce_reservation.consumed"] = 1, ["nonce_reservation.released"] = 1,
                  nonce_reservation_surfaced = 3 }, by)

    -- the next pass sees it mined; the one after that changes nothing more
    assert.equals(1, sup.tick("evm_nonce_reaper", over{ evm_nonce_reaper_max_rebroadcasts = 1, evm_nonce_taken_confirm_seconds = 0 }))
    r = row(lost)
    assert.equals("consumed", r.status)
    assert.equals(qtg.db.NULL, r.last_error)
    assert.equals(raw2, r.signed_raw_tx)
    local before = snapshot(ids)
    assert.equals(0, sup.tick("evm_nonce_reaper", over{ evm_nonce_reaper_max_rebroadcasts = 1, evm_nonce_taken_confirm_seconds = 0 }))
    assert.same(before, snapshot(ids))
  end)

  it("surfaces a nonce another transaction took only once that has held over three looks; a free nonce ends the run", function()
    local E = sup.DEV[4].address
    local k = rpc.get_transaction_count(chain.url, E)
    local raw, hash = sign(chain.url, E, k, "0x1")
    sup.rpc(chain.url, "eth_sendTransaction", { { from = E, to = A, value = "0x2", nonce = hexq(k) } })
    sup.wait_for(function() return rpc.get_transaction_count(chain.url, E) == k + 1 end, 10, "the other transaction")
    local lost = reservation{ address = E, nonce = k, status = "broadcast", raw = raw, hash = hash }
    local function pass() return sup.tick("evm_nonce_reaper", over{ evm_nonce_taken_confirm_seconds = 2 }) end
    -- the first two looks do not decide, whatever the time between them
    for look = 1, 2 do
      pass()
      local r = row(lost)
      assert.equals("broadcast", r.status)
      assert.equals(look, r.nonce_taken_looks)
      assert.matches(("seen %d times? over %%d s; final once seen 3 times over 2 s"):format(look), r.last_error)
      assert.equals(qtg.db.NULL, r.reap_lease_owner)
    end
    local since = row(lost).nonce_taken_since
    sup.wait_for(function()
      return sup.query("SELECT now() - $1::timestamptz > interval '2 s' AS ok", since)[1].ok
    end, 10, "the window to pass")
    pass()
    local r = row(lost)
    assert.equals("surfaced", r.status)
    assert.equals(3, r.nonce_taken_looks)
    assert.matches("will never be mined %(seen 3 times over 2 s%)", r.surfaced_reason)
    assert.equals(raw, r.signed_raw_tx, "the signed bytes stay with their nonce")
    -- a run on a row whose nonce the chain has not used (a lagging node's
    -- earlier answers) ends at the next look
    local raw2, hash2 = sign(chain.url, E, k + 1, "0x3")
    local free = reservation{ address = E, nonce = k + 1, status = "broadcast", raw = raw2, hash = hash2 }
    sup.query([[UPDATE evm_nonce_reservation SET nonce_taken_since = now() - interval '1 hour', nonce_taken_looks = 2
                 WHERE id = $1]], free)
    sup.rpc(chain.url, "evm_setAutomine", { false })
    local ok, err = pcall(pass)
    sup.rpc(chain.url, "evm_setAutomine", { true })
    assert(ok, err)
    r = row(free)
    assert.equals("broadcast", r.status)
    assert.equals(0, r.nonce_taken_looks)
    assert.equals(qtg.db.NULL, r.nonce_taken_since)
    sup.wait_for(function() return rpc.get_transaction_count(chain.url, E) == k + 2 end, 10, "the rebroadcast")
    sup.query("DELETE FROM evm_nonce_reservation WHERE id = ANY($1::bigint[])", "{" .. lost .. "," .. free .. "}")
  end)

  it("watches a surfaced row's signed bytes: mined after all -> consumed and operators alerted; dead for good -> no more looks", function()
    local E = sup.DEV[4].address
    local k = rpc.get_transaction_count(chain.url, E)
    -- two transfers reported FAILED: one whose bytes an RPC refused (its
    -- nonce still free), one whose nonce another transaction took
    local raw1, h1 = sign(chain.url, E, k, "0x5")
    local raw2, h2 = sign(chain.url, E, k + 1, "0x6")
    local refused = reservation{ address = E, nonce = k, status = "signed", raw = raw1, hash = h1, node = node_id }
    local taken = reservation{ address = E, nonce = k + 1, status = "signed", raw = raw2, hash = h2 }
    for _, id in ipairs({ refused, taken }) do
      sup.query([[UPDATE evm_nonce_reservation SET status = 'surfaced', surfaced_reason = 'spec: reported FAILED',
                         last_checked_at = now() - interval '1 hour' WHERE id = $1]], id)
    end
    local watch = over{ evm_nonce_reaper_age_seconds = 1, evm_nonce_taken_confirm_seconds = 1 }
    local function pass() return sup.tick("evm_nonce_reaper", watch) end
    local function later() sup.wait_for(function()
      return sup.query("SELECT bool_and(last_checked_at < now() - interval '1.1 s') AS ok FROM evm_nonce_reservation "
        .. "WHERE id = ANY($1::bigint[]) AND bytes_dead_at IS NULL AND status = 'surfaced'",
        "{" .. refused .. "," .. taken .. "}")[1].ok ~= false
    end, 10, "the rows to be untouched for the age") end
    -- first look: both nonces free, both watched, nothing changes but the
    -- note (other surfaced rows of this spec are watched too: the
    -- assertions are on these two)
    assert.is_true(pass() >= 2)
    for _, id in ipairs({ refused, taken }) do
      local r = row(id)
      assert.equals("surfaced", r.status)
      assert.matches("can still be mined by whoever holds them", r.last_error)
      assert.truthy(r.last_error:find(("fill_nonce(%d, '%s', %d)"):format(r.chain_id, r.address, r.nonce), 1, true),
        r.last_error)
      assert.equals(qtg.db.NULL, r.reap_lease_owner)
    end
    -- whoever held the refused bytes has them mined; another transaction
    -- takes the next nonce
    sup.rpc(chain.url, "evm_setAutomine", { false })
    send(chain.url, raw1)
    sup.rpc(chain.url, "eth_sendTransaction", { { from = E, to = A, value = "0x7", nonce = hexq(k + 1) } })
    sup.rpc(chain.url, "evm_mine", {})
    sup.rpc(chain.url, "evm_setAutomine", { true })
    assert.equals(k + 2, rpc.get_transaction_count(chain.url, E))
    later()
    pass()
    local r = row(refused)
    assert.equals("consumed", r.status)
    assert.is_number(r.consumed_block)
    assert.matches("mined after its transfer was reported FAILED %(the value moved%)", r.surfaced_reason)
    local note = sup.query([[SELECT severity FROM notification_outbox WHERE dedupe_key = $1]],
      "surfaced_transaction_mined:" .. refused)
    assert.equals(1, #note)
    assert.equals("critical", note[1].severity)
    local cb = sup.query([[SELECT payload FROM movement_callback_outbox
                            WHERE request_id = $1::uuid AND event_type = 'request_attention'
                            ORDER BY created_at DESC LIMIT 1]], req_id)
    assert.equals("surfaced_transaction_mined", cjson.decode(cb[1].payload).data.reason)
    -- the taken one: a run of looks, dead once it has held
    r = row(taken)
    assert.equals("surfaced", r.status)
    assert.equals(1, r.nonce_taken_looks)
    for _ = 1, 2 do later(); pass() end
    sup.wait_for(function() later(); pass(); return row(taken).bytes_dead_at ~= qtg.db.NULL end, 20, "the verdict to hold")
    r = row(taken)
    assert.is_true(r.nonce_taken_looks >= 3)
    assert.matches("these bytes can never be mined", r.last_error)
    -- neither is looked at again
    local seen = { row(refused).last_checked_at, row(taken).last_checked_at }
    later()
    pass()
    assert.same(seen, { row(refused).last_checked_at, row(taken).last_checked_at })
    sup.query("DELETE FROM evm_nonce_reservation WHERE id = ANY($1::bigint[])", "{" .. refused .. "," .. taken .. "}")
  end)

  it("never lets a signed nonce go back to the pool, nor its bytes change (database guard)", function()
    local raw, hash = sign(chain.url, A, 50)
    local id = reservation{ address = A, nonce = 50, status = "signed", raw = raw, hash = hash, age = 1 }
    local ok, err = pcall(sup.query, "UPDATE evm_nonce_reservation SET status = 'released' WHERE id = $1", id)
    assert.is_false(ok)
    assert.equals("23514", err.sqlstate)
    ok, err = pcall(sup.query, "UPDATE evm_nonce_reservation SET signed_raw_tx = $2 WHERE id = $1", id, "0x02ab")
    assert.is_false(ok)
    assert.matches("write%-once", err.message)
    ok, err = pcall(reservation, { address = "0xZZ39fd6e51aad88f6f4ce6ab8827279cfffb92266", nonce = 1 })
    assert.is_false(ok)
    assert.equals("23514", err.sqlstate)
    assert.matches("evm_nonce_reservation_address_check", err.constraint or err.message)
    sup.query("DELETE FROM evm_nonce_reservation WHERE id = $1", id)
  end)

  it("records garbage, error statuses and timeouts from the node on the rows and goes on", function()
    local url = prov.url .. "/rpc"
    local ids = { reservation{ chain = 31338, address = A, nonce = 1 },
                  reservation{ chain = 31338, address = A, nonce = 2 } }
    local settings = { evm_rpc_urls = "31338=" .. url, evm_nonce_reaper_age_seconds = 60,
                       evm_rpc_timeout_seconds = 1.5 }
    for _, case in ipairs({ { mode = "garbage", want = "garbage" }, { mode = "error", want = "status" },
                            { mode = "hang", want = "timeout" } }) do
      prov.control({ service = "rpc", mode = case.mode })
      assert.equals(2, sup.tick("evm_nonce_reaper", settings))
      for _, id in ipairs(ids) do
        local r = row(id)
        assert.equals("reserved", r.status)
        assert.matches(case.want, r.last_error)
        assert.equals(qtg.db.NULL, r.reap_lease_owner, "the lease is dropped for the next pass")
      end
    end
    prov.control({ service = "rpc", mode = "ok" })
    assert.equals(2, sup.tick("evm_nonce_reaper", settings))
    for _, id in ipairs(ids) do assert.equals("released", row(id).status) end
  end)

  -- A node's error is any bytes: a 502 page whose bullet straddles byte
  -- 200 (where evm_rpc cuts a body), latin-1, 0xff and NUL.  It is noted on
  -- that chain's rows, and the rows of the other chains are reconciled.
  it("notes a node's error whatever its bytes, and reconciles the other chains' rows", function()
    local page = "<html><title>502 Bad Gateway</title>" .. string.rep(" ", 162) .. "\226\128\162 caf\233 \255\0</html>"
    prov.control({ service = "rpc", mode = "raw", status = 502, body_hex = qtg.crypto.hex(page) })
    local bad = reservation{ chain = 31338, address = A, nonce = 5001 }
    local good = reservation{ chain = CHAIN, address = A, nonce = 5001 }
    local ok, n = pcall(sup.tick, "evm_nonce_reaper", { evm_rpc_urls = CHAIN .. "=" .. chain.url .. ",31338="
      .. prov.url .. "/rpc", evm_nonce_reaper_age_seconds = 60 })
    prov.control({ service = "rpc", mode = "ok" })
    assert.is_true(ok, tostring(n))
    assert.equals(2, n)
    local r = row(bad)
    assert.equals("reserved", r.status)
    assert.matches("eth_chainId: .*HTTP 502: <html>.*\239\191\189%.%.%.$", r.last_error)
    assert.equals("released", row(good).status)
    sup.query("DELETE FROM evm_nonce_reservation WHERE id = ANY($1::bigint[])", "{" .. bad .. "," .. good .. "}")
  end)

  it("a row whose reconciliation raises keeps its lease, and the other rows are reconciled", function()
    local outbox = require("qtg.outbox")
    local audit, raised = outbox.audit, false
    outbox.audit = function(x, ...)
      if not raised then
        raised = true
        x:query("SELECT 1 / 0") -- a write the database refuses
      end
      return audit(x, ...)
    end
    local ids = { reservation{ chain = CHAIN, address = A, nonce = 5002 },
                  reservation{ chain = CHAIN, address = A, nonce = 5003 } }
    local ok, n = pcall(sup.tick, "evm_nonce_reaper", over())
    outbox.audit = audit
    assert.is_true(ok, tostring(n))
    assert.equals(2, n)
    local r1, r2 = row(ids[1]), row(ids[2])
    assert.equals("reserved", r1.status)
    assert.is_not.equals(qtg.db.NULL, r1.reap_lease_owner, "left to its lease")
    assert.equals("released", r2.status)
    sup.query("DELETE FROM evm_nonce_reservation WHERE id = ANY($1::bigint[])", "{" .. ids[1] .. "," .. ids[2] .. "}")
  end)

  -- A quantity with a leading zero, a receipt status that is neither 0x0
  -- nor 0x1: a node's garbage, noted on the row and looked at again, not
  -- an impossible state that stops the process at every start.
  it("notes an unreadable answer about a mined transaction and goes on; a readable one settles it", function()
    local url = prov.url .. "/rpc"
    local raw, hash = sign(chain.url, A, 77)
    local id = reservation{ chain = 31338, address = A, nonce = 77, status = "signed", raw = raw, hash = hash }
    local settings = { evm_rpc_urls = "31338=" .. url, evm_nonce_reaper_age_seconds = 60 }
    local receipt = { transactionHash = hash, blockNumber = "0x10", status = "0x1" }
    for _, bad in ipairs({ { nonce = "0x04d" }, { from = "from-nowhere" }, { status = "0x01" } }) do
      local r = { transactionHash = hash, blockNumber = "0x10", status = bad.status or "0x1" }
      prov.control({ state = { rpc_results = { eth_getTransactionReceipt = r, eth_getTransactionByHash =
        { hash = hash, from = bad.from or A, nonce = bad.nonce or "0x4d" } } } })
      assert.equals(1, sup.tick("evm_nonce_reaper", settings))
      local got = row(id)
      assert.equals("signed", got.status)
      assert.matches("^unreadable answer for " .. hash, got.last_error)
      assert.equals(qtg.db.NULL, got.reap_lease_owner)
      sup.query("UPDATE evm_nonce_reservation SET updated_at = now() - interval '1 hour' WHERE id = $1", id)
    end
    prov.control({ state = { rpc_results = { eth_getTransactionReceipt = receipt, eth_getTransactionByHash =
      { hash = hash, from = A, nonce = "0x4d" } } } })
    assert.equals(1, sup.tick("evm_nonce_reaper", settings))
    assert.equals("consumed", row(id).status)
    assert.equals(16, row(id).consumed_block)
    prov.control({ state = { rpc_results = {} } })
    sup.query("DELETE FROM evm_nonce_reservation WHERE id = $1", id)
  end)

  it("treats an endpoint that answers another chain id as fatal", function()
    local id = reservation{ chain = 1, address = A, nonce = 7 }
    local ok, err = pcall(sup.tick, "evm_nonce_reaper", { evm_rpc_urls = "1=" .. chain.url,
      evm_nonce_reaper_age_seconds = 60 })
    assert.is_false(ok)
    assert.is_true(err.fatal)
    assert.matches("answers eth_chainId 31337", tostring(err))
    assert.equals("reserved", row(id).status)
    assert.matches("^IMPOSSIBLE", row(id).last_error)
    sup.query("DELETE FROM evm_nonce_reservation WHERE id = $1", id)
  end)

  it("two processes at once settle each stale reservation exactly once", function()
    local C = sup.DEV[3].address
    local ids = {}
    for i = 1, 8 do ids[i] = reservation{ address = C, nonce = 100 + i } end
    -- the surfaced rows the cases before left are watched once untouched
    -- for the age: just looked at, they are not this case's
    sup.query("UPDATE evm_nonce_reservation SET last_checked_at = now() WHERE status = 'surfaced'")
    local go = dir .. "/go-nonce"
    local env = sup.base_env{ MG_EVM_RPC_URLS = CHAIN .. "=" .. chain.url, MG_EVM_NONCE_REAPER_AGE_SECONDS = "60" }
    local c1 = sup.start_child(dir, "nonce1", env, "evm_nonce_reaper", 2, go)
    local c2 = sup.start_child(dir, "nonce2", env, "evm_nonce_reaper", 2, go)
    sup.write(go, "go")
    local r1, r2 = sup.wait_child(c1), sup.wait_child(c2)
    assert.is_true(r1.ok, r1.error)
    assert.is_true(r2.ok, r2.error)
    assert.equals(8, r1.items + r2.items)
    for _, id in ipairs(ids) do assert.equals("released", row(id).status) end
    local n = sup.query([[SELECT count(*)::int AS n FROM audit_outbox WHERE action = 'nonce_reservation.released'
                           AND entity_id = ANY(ARRAY(SELECT x::text FROM unnest($1::bigint[]) x))]],
      "{" .. table.concat(ids, ",") .. "}")[1].n
    assert.equals(8, n)
  end)

  it("an impossible reservation stops a running qtgd (core group), with the reason on the row", function()
    local D = sup.DEV[3].address
    local raw = sign(chain.url, D, 300)
    local id = reservation{ address = D, nonce = 300, status = "signed", raw = raw,
                            hash = "0x" .. string.rep("cd", 32) }
    local h = sup.start_run(dir, "fatal", sup.base_env{ MG_NETWORK_CLASS = sup.uid("nonce-fatal"),
      MG_EVM_RPC_URLS = CHAIN .. "=" .. chain.url, MG_EVM_NONCE_REAPER_AGE_SECONDS = "60",
      MG_EVM_NONCE_REAPER_INTERVAL_SECONDS = "0.2", MG_WAKEUPS_ENABLED = "false" })
    assert.equals(3, sup.exit_code(h, 30))
    local log = sup.read(h.log)
    assert.matches("core worker died", log)
    assert.matches("hashes to", log)
    local r = row(id)
    assert.equals("signed", r.status)
    assert.matches("^IMPOSSIBLE: signed_raw_tx hashes to", r.last_error)
    sup.query("DELETE FROM evm_nonce_reservation WHERE id = $1", id)
  end)
end)
