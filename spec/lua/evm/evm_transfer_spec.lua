-- The evm_transfer executor against a real chain: an anvil started here
-- (the binary tools/anvil installs from npm) with its own chain id, real
-- `qtgd run` processes holding real signer keys (0600 files), real
-- PostgreSQL.  Every assertion reads rows and the chain.
--   * a transfer signed by qtg is accepted and moves exactly the amount;
--   * 20 transfers from one sender through two processes: all COMPLETED,
--     nonces contiguous, no gap, no reuse, each transaction mined once;
--   * a crash between eth_sendRawTransaction and the dispatcher's commit
--     (a chaos override in MG_LUA_PATH kills the process there): after a
--     restart the node completes with the same transaction, no second one;
--   * a lost answer (submit raises after sending) and a lost request (the
--     bytes never reached the node): UNKNOWN, then node_recovery decides
--     from the chain (finds the transaction, or sends the same bytes again);
--   * an RPC that goes down while a transaction is pending: UNKNOWN, and
--     settled from the chain when the RPC is back;
--   * the same bytes sent twice while pending: the node's "already known"
--     answer is looked up by hash, SUBMITTED with that hash, not FAILED;
--   * a dropped transaction whose rebroadcast the RPC refuses: recover keeps
--     it UNKNOWN with its side effect (the bytes may still be mined), never
--     FAILED, and settles it from the chain once the rebroadcast goes out;
--   * bad inputs: a reverted transaction, an RPC that is down, an RPC that
--     answers garbage, a wrong chain id, an unfunded sender (then funded and
--     retried by the operator), a malformed and a mis-checksummed
--     destination, an amount above the template's cap, books that disagree
--     with the chain (a reset chain), a signer key the signer does not hold.
local qtg = require "qtg"
local cjson = require "cjson"
local common = require "spec.lua.support.common"

local CHAIN = 31411        -- this spec's chain: its reservations are its own
local AMOUNT, AMOUNT_WEI = "0.25", "250000000000000000"
local ACTOR = "console:spec"

local engine = require "spec.lua.support.engine"
local sup, s, dir, anvil, keys_env
local DEV

-- The chaos override: the packaged executor, with evm_rpc.send_raw_transaction
-- wrapped once (QTG_EVM_CHAOS: kill = SIGKILL right after the node answered;
-- raise = raise after the node answered; drop = never send, answer a timeout;
-- dup = send the bytes, then send them again and return the second answer,
-- as after a lost answer and a retry).
local CHAOS = [[
local qtg = require "qtg"
local rpc = require "qtg.evm_rpc"
local real = dofile(qtg.root .. "/lua/qtg/executors/evm_transfer.lua")
local mode = os.getenv("QTG_EVM_CHAOS")
local send = rpc.send_raw_transaction
local fired = false
rpc.send_raw_transaction = function(url, raw, opts)
  if fired then return send(url, raw, opts) end
  fired = true
  qtg.log.warn("chaos: " .. tostring(mode), {})
  if mode == "drop" then return rpc.fail("timeout", "chaos: the request never reached the node") end
  local h, err = send(url, raw, opts)
  if mode == "dup" then
    local h2, err2 = send(url, raw, opts)
    qtg.log.warn("chaos second send answered: " .. tostring(h2 or err2), { first = tostring(h or err) })
    return h2, err2
  end
  if mode == "kill" then
    os.execute("kill -KILL " .. qtg.pid())
    while true do end
  end
  if mode == "raise" then error("chaos: lost the answer of eth_sendRawTransaction", 0) end
  return h, err
end
return real
]]

local function new_class() return "evmspec-" .. qtg.crypto.hex(qtg.crypto.random_bytes(4)) end

local function transfer_node(id) return sup.nodes(s, id).transfer end

local function env_for(class, urls, extra)
  local env = sup.run_env(class, { MG_SIGNER_KEYS = keys_env, MG_EVM_RPC_URLS = urls })
  for k, v in pairs(extra or {}) do env[k] = v end
  return env
end

local function intent(dest, amount, chain)
  return { asset = "ETH", amount = amount or AMOUNT, destination = dest, chain_id = chain or CHAIN }
end

local function audit_actions(node_id)
  local out = {}
  for _, r in ipairs(s:query([[
      SELECT action, detail, id FROM audit_outbox WHERE entity_id = $1
      UNION ALL SELECT action, detail, outbox_id FROM audit_events WHERE entity_id = $1
      ORDER BY 3]], node_id)) do
    out[#out + 1] = r
  end
  return out
end

local function stop(h)
  local rc = sup.host.stop(h, 30)
  assert.equal(0, rc, "qtgd did not stop cleanly; log " .. h.log)
end

-- the transfer node of request id once ok(node) holds
local function node_when(id, ok, what)
  return sup.wait_for(function()
    local n = transfer_node(id)
    return ok(n) and n
  end, 30, what)
end

local function in_flight(n) return n.node_state == "SUBMITTED" or n.node_state == "OBSERVING" end

-- retry_in(class, request_id, node_id): an operator of `class` retries the
-- node (qtg.requests acts on this process's network class only: the
-- request visits it for the retry, then goes back)
local function retry_in(class, request_id, node_id)
  sup.engine.unfrozen(s, "UPDATE movement_requests SET network_class = $2 WHERE id = $1::uuid",
    request_id, qtg.settings.network_class)
  local ok, err = pcall(require("qtg.requests").retry, s, node_id, ACTOR)
  engine.move_class(s, request_id, class)
  assert(ok, tostring(err))
end

-- fn() with anvil mining no blocks (transactions stay pending); blocks
-- come again, and cleanup() runs, afterwards whatever fn did
local function without_blocks(fn, cleanup)
  sup.rpc(anvil.url, "evm_setIntervalMining", { 0 })
  local ok, err = pcall(fn)
  pcall(sup.rpc, anvil.url, "evm_setIntervalMining", { 1 })
  if cleanup then pcall(cleanup) end
  assert(ok, err)
end

-- start_chaos(mode, dev[, extra]) -> qtgd run with the chaos override in
-- `mode` for a new class, the class, the sender DEV[dev], a fresh
-- destination, the sender's nonce before
local function start_chaos(mode, dev, extra)
  local class = new_class()
  local chaos = dir .. "/chaos-" .. mode
  sup.host.write(chaos .. "/qtg/executors/evm_transfer.lua", CHAOS)
  local env = { MG_LUA_PATH = chaos, QTG_EVM_CHAOS = mode }
  for k, v in pairs(extra or {}) do env[k] = v end
  local sender = DEV[dev].address
  local n0 = sup.nonce(anvil.url, sender)
  return sup.start_run(env_for(class, CHAIN .. "=" .. anvil.url, env)), class, sender, sup.random_address(), n0
end

-- blocks come again; the request completes with tx_hash, mined once: one
-- reservation, the recipient paid once, the sender's nonce n0 + 1
local function completes_once(h, req, tx_hash, dest, sender, n0)
  sup.rpc(anvil.url, "evm_setIntervalMining", { 1 })
  sup.wait_states(s, { req.id }, { COMPLETED = true, FAILED = true, MANUAL_INTERVENTION = true }, 60, { h })
  assert.equal("COMPLETED", sup.request(s, req.id).request_state, sup.detail(s, req.id))
  local node = transfer_node(req.id)
  assert.equal(tx_hash, node.provider_refs.tx_hash)
  assert.equal(1, #sup.reservations(s, node.id))
  assert.equal(AMOUNT_WEI, sup.balance(anvil.url, dest))
  assert.equal(n0 + 1, sup.nonce(anvil.url, sender))
end

describe("evm_transfer on a real anvil chain", function()
  setup(function()
    sup = require "spec.lua.support.evm"
    DEV = sup.DEV
    s, dir, anvil = sup.fresh_chain(CHAIN)
    local k = {}
    for i, name in ipairs({ "main", "crash", "errs", "rec", "poor", "stale", "flaky", "taken" }) do
      local dev = ({ stale = 5, flaky = 6, taken = 7 })[name] or i
      local hex = name == "poor" and sup.random_key() or DEV[dev].key
      k[#k + 1] = name .. "=" .. sup.key_file(dir, name, hex)
    end
    keys_env = table.concat(k, ",")
    local rc = { allowed_chain_ids = { CHAIN, 5, 7, 8 }, max_amount = "5" }
    for _, name in ipairs({ "main", "crash", "errs", "rec", "poor", "stale", "flaky", "taken" }) do
      sup.engine.load_doc(s, sup.template("evm_t_" .. name, name, rc))
    end
    -- a key the signer does not hold (not in keys_env)
    sup.engine.load_doc(s, sup.template("evm_t_nokey", "nokey", rc))
  end)

  teardown(function() sup.done(s, dir) end)

  after_each(function() sup.host.stop_all() end)

  it("moves exactly the amount with a transaction signed by qtg", function()
    local class = new_class()
    local h = sup.start_run(env_for(class, CHAIN .. "=" .. anvil.url))
    local sender = DEV[1].address
    local dest = sup.random_address()
    local n0 = sup.nonce(anvil.url, sender)
    assert.equal("0", sup.balance(anvil.url, dest))
    -- the demo's hook makes the request; the intent carries the EIP-55
    -- form of the destination: honoured, not refused
    local req = require("qtg.evm_demo").request(s, ACTOR, {
      template_key = "evm_t_main", chain_id = CHAIN, amount = AMOUNT,
      destination = qtg.signer.checksum_address(dest) })
    assert.equal("APPROVED", req.request_state)
    engine.move_class(s, req.id, class)
    sup.wait_states(s, { req.id }, { COMPLETED = true, FAILED = true, MANUAL_INTERVENTION = true }, 60, { h })
    assert.equal("COMPLETED", sup.request(s, req.id).request_state, sup.detail(s, req.id))

    assert.equal(AMOUNT_WEI, sup.balance(anvil.url, dest))
    assert.equal(n0 + 1, sup.nonce(anvil.url, sender))
    local nodes = sup.nodes(s, req.id)
    local refs = nodes.transfer.provider_refs
    local r = sup.receipt(anvil.url, refs.tx_hash)
    assert.equal("0x1", r.status)
    assert.equal(dest, r.to)
    assert.equal(sender, r.from)
    assert.equal(refs.block_number, tonumber(r.blockNumber:sub(3), 16))
    local tx = sup.rpc(anvil.url, "eth_getTransactionByHash", { refs.tx_hash })
    assert.equal("0x2", tx.type)                       -- EIP-1559
    assert.equal(n0, tonumber(tx.nonce:sub(3), 16))
    local res = sup.reservations(s, nodes.transfer.id)
    assert.equal(1, #res)
    assert.equal("consumed", res[1].status)
    assert.equal("mined", res[1].outcome)
    assert.equal(n0, res[1].nonce)
    assert.equal(refs.tx_hash, res[1].tx_hash)
    -- the bytes qtg kept are the bytes the chain mined
    assert.equal(refs.tx_hash, "0x" .. qtg.crypto.keccak256_hex(qtg.crypto.unhex(res[1].signed_raw_tx)))
    assert.is_true(nodes.destination_finality.provider_refs.confirmations >= 3)
    assert.equal(refs.block_number, nodes.destination_receive.provider_refs.received_block)
    stop(h)
  end)

  it("sends 20 transfers from one sender through two processes: contiguous nonces, each mined once", function()
    local N = 20
    local class = new_class()
    local env = env_for(class, CHAIN .. "=" .. anvil.url)
    local h1, h2 = sup.start_run(env), sup.start_run(env_for(class, CHAIN .. "=" .. anvil.url))
    local sender = DEV[1].address
    local n0 = sup.nonce(anvil.url, sender)
    local ids, dests = {}, {}
    for i = 1, N do
      dests[i] = sup.random_address()
      ids[i] = sup.create(s, "evm_t_main", class, intent(dests[i], "0.0" .. (i % 9 + 1))).id
    end
    sup.wait_states(s, ids, { COMPLETED = true, FAILED = true, MANUAL_INTERVENTION = true }, 180, { h1, h2 })
    for _, id in ipairs(ids) do
      assert.equal("COMPLETED", sup.request(s, id).request_state, sup.detail(s, id))
    end
    stop(h1)
    stop(h2)

    -- the books: one reservation per transfer node, nonces n0 .. n0+N-1
    local rows = s:query([[
      SELECT r.nonce, r.status, r.tx_hash, r.request_node_id::text AS node_id, t.outcome
        FROM evm_nonce_reservation r JOIN evm_transfer_tx t ON t.reservation_id = r.id
        JOIN movement_request_nodes n ON n.id = r.request_node_id
        JOIN movement_requests q ON q.id = n.request_id
       WHERE q.network_class = $1 ORDER BY r.nonce]], class)
    assert.equal(N, #rows)
    local hashes, nodes_seen = {}, {}
    for i, r in ipairs(rows) do
      assert.equal(n0 + i - 1, r.nonce)                -- contiguous: no gap, no reuse
      assert.equal("consumed", r.status)
      assert.equal("mined", r.outcome)
      assert.is_nil(hashes[r.tx_hash])
      assert.is_nil(nodes_seen[r.node_id])
      hashes[r.tx_hash], nodes_seen[r.node_id] = true, true
    end
    -- the chain: exactly N more transactions from the sender, each of ours
    -- mined at its reserved nonce, and each recipient paid exactly once
    assert.equal(n0 + N, sup.nonce(anvil.url, sender))
    for _, r in ipairs(rows) do
      local tx = sup.rpc(anvil.url, "eth_getTransactionByHash", { r.tx_hash })
      assert.equal(r.nonce, tonumber(tx.nonce:sub(3), 16))
      assert.equal(sender, tx.from)
      assert.equal("0x1", sup.receipt(anvil.url, r.tx_hash).status)
    end
    for i, d in ipairs(dests) do
      assert.equal(require("qtg.evm_tx").to_wei("0.0" .. (i % 9 + 1)), sup.balance(anvil.url, d))
    end
    -- both processes broadcast some of them
    assert.is_true(sup.log_count(h1, "evm transaction broadcast") > 0, "process 1 sent nothing")
    assert.is_true(sup.log_count(h2, "evm transaction broadcast") > 0, "process 2 sent nothing")
    assert.equal(N, sup.log_count(h1, "evm transaction broadcast") + sup.log_count(h2, "evm transaction broadcast"))
  end)

  it("recovers a node from the chain after a crash between eth_sendRawTransaction and the commit", function()
    local a, class, sender, dest, n0 = start_chaos("kill", 2)
    local req = sup.create(s, "evm_t_crash", class, intent(dest))
    local rc = sup.host.wait_exit(a, 30)
    assert.equal(137, rc, "the chaos override did not kill qtgd; log " .. a.log)
    assert.equal(1, sup.log_count(a, "chaos: kill"))

    -- the dispatcher's transaction is lost: the node is READY, attempt 0;
    -- the reservation kept the signed bytes; the chain has the transfer
    local node = transfer_node(req.id)
    assert.equal("READY", node.node_state)
    assert.equal(0, node.attempt_no)
    local res = sup.reservations(s, node.id)
    assert.equal(1, #res)
    assert.equal("signed", res[1].status)
    local tx_hash = res[1].tx_hash
    sup.wait_for(function() return sup.receipt(anvil.url, tx_hash) end, 20, "the transaction to be mined")
    assert.equal(AMOUNT_WEI, sup.balance(anvil.url, dest))

    -- restart (no chaos): the re-dispatch finds the signed bytes, the node
    -- answers "nonce too low", the lookup by hash finds it mined
    local b = sup.start_run(env_for(class, CHAIN .. "=" .. anvil.url))
    sup.wait_states(s, { req.id }, { COMPLETED = true, FAILED = true, MANUAL_INTERVENTION = true }, 60, { b })
    assert.equal("COMPLETED", sup.request(s, req.id).request_state, sup.detail(s, req.id))
    node = transfer_node(req.id)
    assert.equal(1, node.attempt_no)
    assert.equal(tx_hash, node.provider_refs.tx_hash)
    res = sup.reservations(s, node.id)
    assert.equal(1, #res)
    assert.equal(tx_hash, res[1].tx_hash)
    assert.equal("consumed", res[1].status)
    -- no second transfer
    assert.equal(AMOUNT_WEI, sup.balance(anvil.url, dest))
    assert.equal(n0 + 1, sup.nonce(anvil.url, sender))
    assert.equal(0, sup.log_count(b, "evm nonce reserved"))   -- no new nonce was taken
    stop(b)
  end)

  it("after a crash, a re-dispatch whose send of the stored bytes is refused is UNKNOWN (they may be out), never FAILED", function()
    local a, class, sender, dest, n0 = start_chaos("kill", 2, { MG_EVM_NONCE_REAPER_ENABLED = "false" })
    local funds = sup.rpc(anvil.url, "eth_getBalance", { sender, "latest" })
    local b
    without_blocks(function()
      local req = sup.create(s, "evm_t_crash", class, intent(dest))
      assert.equal(137, sup.host.wait_exit(a, 30), "the chaos override did not kill qtgd; log " .. a.log)
      local node = transfer_node(req.id)
      assert.equal("READY", node.node_state)
      local tx_hash = sup.reservations(s, node.id)[1].tx_hash
      -- the bytes went out before the crash; then this node forgets them and
      -- would refuse them again (the sender cannot pay the gas now), while
      -- another mempool may still hold them
      sup.rpc(anvil.url, "anvil_dropTransaction", { tx_hash })
      sup.rpc(anvil.url, "anvil_setBalance", { sender, "0x0" })
      b = sup.start_run(env_for(class, CHAIN .. "=" .. anvil.url, { MG_EVM_NONCE_REAPER_ENABLED = "false" }))
      node = node_when(req.id, function(n) return n.attempt_no >= 1 and n.node_state ~= "SUBMITTING" end,
        "the re-dispatch")
      assert.equal("UNKNOWN", node.node_state, sup.detail(s, req.id))
      assert.equal("EVM_REBROADCAST_REFUSED", node.error_code)
      assert.is_true(node.side_effect)
      assert.equal(tx_hash, node.provider_refs.tx_hash)
      assert.are_not.equal("FAILED", sup.request(s, req.id).request_state)
      local res = sup.reservations(s, node.id)
      assert.equal(1, #res)
      assert.are_not.equal("surfaced", res[1].status)
      -- the cause goes away; the operator resumes if the request waits for one
      sup.rpc(anvil.url, "anvil_setBalance", { sender, funds })
      if sup.request(s, req.id).request_state == "MANUAL_INTERVENTION" then
        require("qtg.requests").resume(s, req.id, "console:spec")
      end
      completes_once(b, req, tx_hash, dest, sender, n0)
    end, function() sup.rpc(anvil.url, "anvil_setBalance", { sender, funds }) end)
    stop(b)
  end)

  -- Bytes sent before a crash are on the chain; the re-dispatch must not
  -- FAIL the node on anything that is no verdict on them: an RPC it cannot
  -- reach (preflight and prepare asked it before looking for the bytes), or
  -- a reservation another process's reaper settled meanwhile (the signer
  -- refuses to sign a settled reservation again).  Both FAILED the node with
  -- no side effect on the tree before, with the money moved.
  it("after a crash, a re-dispatch sends the stored bytes as they are: an RPC down or a settled reservation never FAILs it", function()
    -- the RPC unreachable at the re-dispatch
    local a, class, sender, dest, n0 = start_chaos("kill", 2, { MG_EVM_NONCE_REAPER_ENABLED = "false" })
    local req = sup.create(s, "evm_t_crash", class, intent(dest))
    assert.equal(137, sup.host.wait_exit(a, 30), "the chaos override did not kill qtgd; log " .. a.log)
    local node = transfer_node(req.id)
    local tx_hash = sup.reservations(s, node.id)[1].tx_hash
    sup.wait_for(function() return sup.receipt(anvil.url, tx_hash) end, 20, "the transaction to be mined")
    local b = sup.start_run(env_for(class, CHAIN .. "=http://127.0.0.1:9", { MG_EVM_NONCE_REAPER_ENABLED = "false" }))
    node = node_when(req.id, function(n) return n.attempt_no >= 1 and n.node_state ~= "SUBMITTING" end,
      "the re-dispatch")
    assert.equal("UNKNOWN", node.node_state, sup.detail(s, req.id))
    assert.is_true(node.side_effect)
    assert.equal(tx_hash, node.provider_refs.tx_hash)
    assert.are_not.equal("FAILED", sup.request(s, req.id).request_state)
    assert.equal(0, sup.log_count(b, "evm nonce reserved"))
    stop(b)
    local c = sup.start_run(env_for(class, CHAIN .. "=" .. anvil.url, { MG_EVM_NONCE_REAPER_ENABLED = "false" }))
    if sup.request(s, req.id).request_state == "MANUAL_INTERVENTION" then
      require("qtg.requests").resume(s, req.id, "console:spec")
    end
    completes_once(c, req, tx_hash, dest, sender, n0)
    stop(c)

    -- the reservation settled (consumed) by another class's reaper first
    a, class, sender, dest, n0 = start_chaos("kill", 2, { MG_EVM_NONCE_REAPER_ENABLED = "false" })
    req = sup.create(s, "evm_t_crash", class, intent(dest))
    assert.equal(137, sup.host.wait_exit(a, 30), "the chaos override did not kill qtgd; log " .. a.log)
    node = transfer_node(req.id)
    tx_hash = sup.reservations(s, node.id)[1].tx_hash
    sup.wait_for(function() return sup.receipt(anvil.url, tx_hash) end, 20, "the transaction to be mined")
    local other = sup.start_run(env_for(new_class(), CHAIN .. "=" .. anvil.url, {
      MG_EVM_NONCE_REAPER_AGE_SECONDS = "1", MG_EVM_NONCE_REAPER_INTERVAL_SECONDS = "1" }))
    sup.wait_for(function() return sup.reservations(s, node.id)[1].status == "consumed" end, 40,
      "another class's reaper to settle the reservation")
    stop(other)
    assert.equal("READY", transfer_node(req.id).node_state)
    -- its bytes are on the chain: a cancel now would close the request
    -- with the money moved and nothing in qtg saying so
    local ok, err = require("spec.lua.support.conditional").with_settings({ network_class = class }, pcall,
      require("qtg.requests").cancel, s, req.id, "console:spec", "changed my mind")
    assert.is_false(ok)
    assert.matches("node transfer is READY and its executor's records hold a submit", tostring(err.message), 1, true)
    local d = sup.start_run(env_for(class, CHAIN .. "=" .. anvil.url, { MG_EVM_NONCE_REAPER_ENABLED = "false" }))
    completes_once(d, req, tx_hash, dest, sender, n0)
    assert.equal(0, sup.log_count(d, "signing refused"))
    stop(d)
  end)

  for _, case in ipairs({
    { mode = "raise", code = "EXECUTOR_ERROR", how = "the answer of eth_sendRawTransaction is lost" },
    { mode = "drop", code = "EVM_BROADCAST_OUTCOME_UNKNOWN", how = "the bytes never reached the node" },
  }) do
    it("settles an UNKNOWN node from the chain when " .. case.how, function()
      local h, class, sender, dest, n0 = start_chaos(case.mode, 4)
      local req = sup.create(s, "evm_t_rec", class, intent(dest))
      sup.wait_states(s, { req.id }, { COMPLETED = true, FAILED = true, MANUAL_INTERVENTION = true }, 60, { h })
      assert.equal("COMPLETED", sup.request(s, req.id).request_state, sup.detail(s, req.id))
      local node = transfer_node(req.id)
      -- the path: UNKNOWN (submit's doubt), then node_recovery decided
      local path, unknown_code = {}, nil
      for _, a in ipairs(audit_actions(node.id)) do
        path[#path + 1] = a.action
        if a.action == "node.unknown" then unknown_code = a.detail.error_code end
      end
      assert.equal(case.code, unknown_code, cjson.encode(path))
      assert.equal(1, sup.log_count(h, "chaos: " .. case.mode))
      local res = sup.reservations(s, node.id)
      assert.equal(1, #res)
      assert.equal("consumed", res[1].status)
      assert.equal(res[1].tx_hash, node.provider_refs.tx_hash)
      assert.equal(AMOUNT_WEI, sup.balance(anvil.url, dest))
      assert.equal(n0 + 1, sup.nonce(anvil.url, sender))
      stop(h)
    end)
  end

  it("keeps a transaction in flight when the RPC goes down, and settles it from the chain when it is back", function()
    local class = new_class()
    local fwd = sup.start_forwarder(anvil.port)
    local sender, dest = DEV[6].address, sup.random_address()
    local n0 = sup.nonce(anvil.url, sender)
    local h = sup.start_run(env_for(class, CHAIN .. "=" .. fwd.url))
    -- no blocks for now: the transaction stays pending
    without_blocks(function()
      local req = sup.create(s, "evm_t_flaky", class, intent(dest))
      local node = node_when(req.id, in_flight, "the transfer to be broadcast")
      local tx_hash = node.provider_refs.tx_hash
      assert.equal("broadcast", sup.reservations(s, node.id)[1].status)
      assert.is_nil(sup.receipt(anvil.url, tx_hash))
      -- the endpoint goes down: the observer cannot tell, the node is UNKNOWN
      -- (not FAILED: the transaction may still be mined)
      sup.stop_forwarder(fwd)
      node = node_when(req.id, function(n) return n.node_state == "UNKNOWN" end, "the node to become UNKNOWN")
      assert.equal("EVM_RPC_UNREACHABLE", node.error_code)
      assert.equal("EXECUTING", sup.request(s, req.id).request_state)
      -- it comes back, blocks come again: recovery asks the chain, it completes
      sup.start_forwarder(anvil.port, fwd.port)
      completes_once(h, req, tx_hash, dest, sender, n0)
    end)
    stop(h)
  end)

  it("looks up the same bytes sent twice while pending ('already known'): SUBMITTED, not FAILED", function()
    local h, class, sender, dest, n0 = start_chaos("dup", 4, { MG_EVM_NONCE_REAPER_ENABLED = "false" })
    -- no blocks for now: the first copy waits in the pool when the second comes
    without_blocks(function()
      local req = sup.create(s, "evm_t_rec", class, intent(dest))
      local node = node_when(req.id, function(n)
        return in_flight(n) or n.node_state == "FAILED" or n.node_state == "UNKNOWN"
      end, "the transfer to be broadcast")
      assert.is_true(in_flight(node), sup.detail(s, req.id))
      assert.is_true(node.side_effect)
      -- the second send was answered "already known" (anvil's wording) ...
      assert.equal(1, sup.log_count(h, "chaos second send answered: "))
      assert.equal(1, sup.log_count(h, "transaction already imported"), "log " .. h.log)
      -- ... and the node carries the hash of the bytes it kept, still pending
      local res = sup.reservations(s, node.id)
      assert.equal(1, #res)
      assert.equal("broadcast", res[1].status)
      assert.equal(res[1].tx_hash, node.provider_refs.tx_hash)
      assert.equal(res[1].tx_hash, "0x" .. qtg.crypto.keccak256_hex(qtg.crypto.unhex(res[1].signed_raw_tx)))
      assert.is_nil(sup.receipt(anvil.url, res[1].tx_hash))
      -- mined once: one transfer, one nonce
      completes_once(h, req, res[1].tx_hash, dest, sender, n0)
    end)
    stop(h)
  end)

  it("keeps a dropped transaction whose rebroadcast is refused UNKNOWN (it may still be mined), never FAILED", function()
    local class = new_class()
    local fwd = sup.start_forwarder(anvil.port)
    local sender, dest = DEV[6].address, sup.random_address()
    local n0 = sup.nonce(anvil.url, sender)
    local funds = sup.rpc(anvil.url, "eth_getBalance", { sender, "latest" })
    local h = sup.start_run(env_for(class, CHAIN .. "=" .. fwd.url, { MG_EVM_NONCE_REAPER_ENABLED = "false" }))
    without_blocks(function()
      local req = sup.create(s, "evm_t_flaky", class, intent(dest))
      local tx_hash = node_when(req.id, in_flight, "the transfer to be broadcast").provider_refs.tx_hash
      -- the endpoint goes down: UNKNOWN, so node_recovery (recover) is what
      -- looks next
      sup.stop_forwarder(fwd)
      assert.equal("EVM_RPC_UNREACHABLE", node_when(req.id, function(n) return n.node_state == "UNKNOWN" end,
        "the node to become UNKNOWN").error_code)
      -- meanwhile the node forgets the transaction (evicted from its pool,
      -- as a restarted or load-balanced node does) and will refuse the same
      -- bytes again (the sender cannot pay the gas now): other mempools may
      -- still hold them, so nothing here proves they will never be mined
      sup.rpc(anvil.url, "anvil_dropTransaction", { tx_hash })
      assert.equal(cjson.null, sup.rpc(anvil.url, "eth_getTransactionByHash", { tx_hash }))
      sup.rpc(anvil.url, "anvil_setBalance", { sender, "0x0" })
      sup.start_forwarder(anvil.port, fwd.port)
      local node = node_when(req.id, function(n)
        return n.error_code == "EVM_REBROADCAST_REFUSED" or n.node_state ~= "UNKNOWN"
      end, "recover to try the same bytes again")
      assert.equal("UNKNOWN", node.node_state, sup.detail(s, req.id))
      assert.equal("EVM_REBROADCAST_REFUSED", node.error_code)
      assert.matches("Insufficient funds", node.error_detail)
      assert.is_true(node.side_effect)
      assert.equal(tx_hash, node.provider_refs.tx_hash)
      assert.equal("EXECUTING", sup.request(s, req.id).request_state)
      -- the reservation keeps its bytes and its status (not surfaced as
      -- refused): the same bytes are the only thing this nonce may carry
      local res = sup.reservations(s, node.id)
      assert.equal(1, #res)
      assert.equal("broadcast", res[1].status)
      assert.equal(qtg.db.NULL, res[1].outcome)
      assert.matches("refused to rebroadcast", res[1].last_error)
      -- the next pass of node_recovery asks again: still UNKNOWN while the
      -- chain cannot tell
      local seen = node.updated_at
      node = node_when(req.id, function(n) return n.updated_at ~= seen end, "node_recovery to look again")
      assert.equal("UNKNOWN", node.node_state, sup.detail(s, req.id))
      assert.equal("EVM_REBROADCAST_REFUSED", node.error_code)
      -- the cause goes away: recovery sends the same bytes, the chain mines them
      sup.rpc(anvil.url, "anvil_setBalance", { sender, funds })
      completes_once(h, req, tx_hash, dest, sender, n0)
    end, function() sup.rpc(anvil.url, "anvil_setBalance", { sender, funds }) end)
    stop(h)
  end)

  -- take(sender, nonce): another transaction from sender takes `nonce`
  -- (anvil signs it for the impersonated sender), mined in a block of its own
  local function take(sender, nonce)
    sup.rpc(anvil.url, "anvil_impersonateAccount", { sender })
    local other = sup.rpc(anvil.url, "eth_sendTransaction", { { from = sender, to = sup.random_address(),
      value = "0x1", nonce = string.format("0x%x", nonce) } })
    sup.rpc(anvil.url, "anvil_stopImpersonatingAccount", { sender })
    sup.rpc(anvil.url, "evm_mine", {})
    assert.equal("0x1", sup.receipt(anvil.url, other).status)
    assert.equal(nonce + 1, sup.nonce(anvil.url, sender))
    return other
  end

  local function taken_run(node_id)
    return s:query([[SELECT r.status, r.nonce_taken_looks AS looks, r.nonce_taken_since, t.outcome, r.surfaced_reason,
                            extract(epoch FROM n.updated_at - r.nonce_taken_since)::float8 AS held
                       FROM evm_nonce_reservation r JOIN evm_transfer_tx t ON t.reservation_id = r.id
                       JOIN movement_request_nodes n ON n.id = r.request_node_id
                      WHERE r.request_node_id = $1::uuid]], node_id)[1]
  end

  it("fails a transfer whose nonce another transaction took only once that has held (MG_EVM_NONCE_TAKEN_CONFIRM_SECONDS)", function()
    local class, sender, dest = new_class(), DEV[7].address, sup.random_address()
    local h = sup.start_run(env_for(class, CHAIN .. "=" .. anvil.url, {
      MG_EVM_NONCE_REAPER_ENABLED = "false", MG_EVM_NONCE_TAKEN_CONFIRM_SECONDS = "4" }))
    local n0 = sup.nonce(anvil.url, sender)
    without_blocks(function()
      local req = sup.create(s, "evm_t_taken", class, intent(dest))
      local node = node_when(req.id, in_flight, "the transfer to be broadcast")
      local tx_hash = node.provider_refs.tx_hash
      -- the node forgets ours, and another transaction takes its nonce
      sup.rpc(anvil.url, "anvil_dropTransaction", { tx_hash })
      take(sender, n0)
      -- the first looks do not decide: the node waits, its side effect kept
      node = node_when(req.id, function(n) return n.error_code == "EVM_NONCE_TAKEN_UNCONFIRMED" or n.node_state == "FAILED" end,
        "the observer to read the nonce as taken")
      assert.are_not.equal("FAILED", node.node_state, sup.detail(s, req.id))
      assert.is_true(node.side_effect)
      assert.matches("final once seen 3 times over 4 s", node.error_detail, 1, true)
      assert.equal("broadcast", taken_run(node.id).status)
      -- once it has held for 4 s over 3 looks or more: FAILED, surfaced
      sup.wait_states(s, { req.id }, { COMPLETED = true, FAILED = true, MANUAL_INTERVENTION = true }, 60, { h })
      node = transfer_node(req.id)
      assert.equal("FAILED", node.node_state, sup.detail(s, req.id))
      assert.equal("EVM_NONCE_TAKEN", node.error_code)
      local run = taken_run(node.id)
      assert.equal("surfaced", run.status)
      assert.equal("nonce_taken", run.outcome)
      assert.is_true(run.looks >= 3, "looks " .. run.looks)
      assert.is_true(run.held >= 4, "held " .. run.held)
      assert.matches("can never be mined", run.surfaced_reason)
      assert.equal("0", sup.balance(anvil.url, dest))   -- nothing moved to the destination
    end)
    stop(h)
  end)

  it("completes a transfer the RPC read as taken when the chain shows it again (a reorg), never FAILED", function()
    local class, sender, dest = new_class(), DEV[7].address, sup.random_address()
    local h = sup.start_run(env_for(class, CHAIN .. "=" .. anvil.url, { MG_EVM_NONCE_REAPER_ENABLED = "false" }))
    local n0 = sup.nonce(anvil.url, sender)
    without_blocks(function()
      local req = sup.create(s, "evm_t_taken", class, intent(dest))
      local node = node_when(req.id, in_flight, "the transfer to be broadcast")
      local tx_hash = node.provider_refs.tx_hash
      -- the chain as it was, with ours pending
      local snap = sup.rpc(anvil.url, "evm_snapshot", {})
      sup.rpc(anvil.url, "anvil_dropTransaction", { tx_hash })
      take(sender, n0)
      -- read as taken over several looks (the default 300 s window): the
      -- node waits, the reservation keeps its bytes and its status
      sup.wait_for(function() return (taken_run(node.id).looks or 0) >= 3 end, 30, "three looks at the taken nonce")
      node = transfer_node(req.id)
      assert.equal("EVM_NONCE_TAKEN_UNCONFIRMED", node.error_code, sup.detail(s, req.id))
      assert.are_not.equal("FAILED", node.node_state)
      assert.equal("broadcast", taken_run(node.id).status)
      -- the other transaction goes with a reorg: the nonce is free again,
      -- the run of looks ends, the same bytes go out and are mined
      sup.rpc(anvil.url, "evm_revert", { snap })
      assert.equal(n0, sup.nonce(anvil.url, sender))
      completes_once(h, req, tx_hash, dest, sender, n0)
      local run = taken_run(transfer_node(req.id).id)
      assert.equal(0, run.looks)
      assert.equal(qtg.db.NULL, run.nonce_taken_since)
      local path = {}
      for _, a in ipairs(audit_actions(node.id)) do path[#path + 1] = a.action end
      assert.is_nil(table.concat(path, " "):find("node.failed", 1, true), table.concat(path, " "))
      assert.equal("node.completed", path[#path])
    end)
    stop(h)
  end)

  it("refuses a transfer that would wait for ever behind a surfaced nonce the chain never used (EVM_NONCE_GAP)", function()
    local class, sender, dest = new_class(), DEV[7].address, sup.random_address()
    local n0 = sup.nonce(anvil.url, sender)
    -- the books as a first send the RPC refused leaves them (EVM_TX_REJECTED):
    -- the nonce surfaced with its bytes, unused on the chain
    local gap = s:query([[INSERT INTO evm_nonce_reservation (chain_id, address, nonce, status, payload_hash,
                                       signed_raw_tx, tx_hash, surfaced_reason)
                          VALUES ($1, $2, $3, 'surfaced', $4, '0x02aa', $5, 'spec: the RPC refused the bytes')
                          RETURNING id]], CHAIN, sender, n0, "0x" .. string.rep("e", 64),
      "0x" .. qtg.crypto.hex(qtg.crypto.random_bytes(32)))[1].id
    local h = sup.start_run(env_for(class, CHAIN .. "=" .. anvil.url, { MG_EVM_NONCE_REAPER_ENABLED = "false" }))
    local req = sup.create(s, "evm_t_taken", class, intent(dest))
    sup.wait_states(s, { req.id }, { COMPLETED = true, FAILED = true, MANUAL_INTERVENTION = true }, 60, { h })
    local node = transfer_node(req.id)
    assert.equal("FAILED", node.node_state, sup.detail(s, req.id))
    assert.equal("PREFLIGHT_REJECTED", node.error_code)
    assert.equal("EVM_NONCE_GAP", node.error_detail:match("^([A-Z_]+):"), node.error_detail)
    assert.truthy(node.error_detail:find("nonce " .. n0 .. " of " .. sender, 1, true), node.error_detail)
    assert.truthy(node.error_detail:find(("fill_nonce(%d, '%s', %d)"):format(CHAIN, sender, n0), 1, true),
      node.error_detail)
    assert.equal(0, #sup.reservations(s, node.id), "nothing reserved behind the gap")
    assert.equal(n0, sup.nonce(anvil.url, sender))
    -- the operator fills the nonce; the retry goes out at the next one
    take(sender, n0)
    retry_in(class, req.id, node.id)
    sup.wait_states(s, { req.id }, { COMPLETED = true, FAILED = true, MANUAL_INTERVENTION = true }, 60, { h })
    assert.equal("COMPLETED", sup.request(s, req.id).request_state, sup.detail(s, req.id))
    assert.equal(n0 + 1, sup.reservations(s, transfer_node(req.id).id)[1].nonce)
    assert.equal(AMOUNT_WEI, sup.balance(anvil.url, dest))
    stop(h)
    s:query("DELETE FROM evm_nonce_reservation WHERE id = $1", gap)
  end)

  it("gives each bad input a clear code and a state an operator can act on", function()
    local class = new_class()
    local garbage = sup.start_garbage_server()
    local urls = table.concat({ CHAIN .. "=" .. anvil.url, "5=" .. anvil.url, "7=http://127.0.0.1:1",
                                "8=" .. garbage }, ",")
    local h = sup.start_run(env_for(class, urls, { MG_EVM_NONCE_REAPER_ENABLED = "false" }))
    local errs_sender = DEV[3].address
    local n0 = sup.nonce(anvil.url, errs_sender)

    -- a destination whose code reverts every call: the transfer is mined, reverted
    local reverter = sup.random_address()
    sup.rpc(anvil.url, "anvil_setCode", { reverter, "0x60006000fd" })   -- PUSH1 0 PUSH1 0 REVERT

    -- flip the case of one letter: a typo the EIP-55 checksum catches. The typo must leave the
    -- address mixed-case: an all-lower or all-upper address carries no checksum and is accepted,
    -- so draw addresses until the flip keeps both cases (a random one fails that now and then).
    local good, bad_sum
    repeat
      good = sup.random_address()
      local mixed = qtg.signer.checksum_address(good)
      local i = mixed:find("%a", 3)
      if i then
        local c = mixed:sub(i, i)
        bad_sum = mixed:sub(1, i - 1) .. (c:upper() == c and c:lower() or c:upper()) .. mixed:sub(i + 1)
      end
    until i and bad_sum:sub(3):find("%u") and bad_sum:sub(3):find("%l")

    -- books that say a nonce above the chain's count was mined (a reset chain)
    s:query([[INSERT INTO evm_nonce_reservation (chain_id, address, nonce, status, payload_hash,
                                                  signed_raw_tx, tx_hash)
              VALUES ($1, $2, $3 + 5, 'consumed', '0x' || repeat('ab', 32), '0x02abcd', '0x' || repeat('cd', 32))]],
      CHAIN, DEV[5].address, sup.nonce(anvil.url, DEV[5].address))

    local cases = {
      revert = { "evm_t_errs", intent(reverter) },
      down = { "evm_t_errs", intent(good, AMOUNT, 7), "EVM_RPC_UNREACHABLE" },
      garbage = { "evm_t_errs", intent(good, AMOUNT, 8), "EVM_RPC_BAD_RESPONSE" },
      wrong_chain = { "evm_t_errs", intent(good, AMOUNT, 5), "EVM_CHAIN_ID_MISMATCH" },
      unfunded = { "evm_t_poor", intent(good), "EVM_INSUFFICIENT_FUNDS" },
      checksum = { "evm_t_errs", intent(bad_sum), "EVM_BAD_DESTINATION" },
      over_cap = { "evm_t_errs", intent(good, "5"), "EVM_AMOUNT_ABOVE_CAP", raise_to = "6" },
      books = { "evm_t_stale", intent(good), "EVM_NONCE_BOOKS_MISMATCH" },
      no_key = { "evm_t_nokey", intent(good), "EVM_SIGNER_NOT_LOADED" },
    }
    local ids, all = {}, {}
    for name, c in pairs(cases) do
      if c.raise_to then
        -- the engine refuses an amount over max_amount at create and approval
        -- (qtg.risk_controls): the executor's own cap is shown on a frozen
        -- intent a superuser raised past them (triggers off)
        local r = sup.engine.create(s, c[1], { intent = c[2], callback_url = false })
        require("qtg.requests").approve(s, r.id, sup.engine.ACTOR)
        sup.engine.unfrozen(s, [[UPDATE movement_requests SET network_class = $3,
            intent = jsonb_set(intent, '{amount}', to_jsonb($2::text)) WHERE id = $1::uuid]], r.id, c.raise_to, class)
        ids[name] = r.id
      else
        ids[name] = sup.create(s, c[1], class, c[2]).id
      end
      all[#all + 1] = ids[name]
    end
    -- a malformed destination never becomes a request
    local ok, err = pcall(sup.create, s, "evm_t_errs", class, intent("0x12345"))
    assert.is_false(ok)
    assert.equal("invalid_intent", err.kind)

    sup.wait_states(s, all, { COMPLETED = true, FAILED = true, MANUAL_INTERVENTION = true }, 60, { h })
    for name, c in pairs(cases) do
      local req = sup.request(s, ids[name])
      local node = transfer_node(ids[name])
      assert.equal("FAILED", req.request_state, name .. ": " .. sup.detail(s, ids[name]))
      assert.equal("FAILED", node.node_state, name)
      if c[3] then
        -- refused before anything was reserved or signed
        assert.equal("PREFLIGHT_REJECTED", node.error_code, name)
        assert.equal(c[3], node.error_detail:match("^([A-Z_]+):"), name .. ": " .. node.error_detail)
        assert.equal(0, #sup.reservations(s, node.id), name)
        assert.equal("PREFLIGHT_REJECTED", req.last_error_code, name)
      end
    end

    -- the reverted one: mined with status 0, its nonce used, nothing received
    local node = transfer_node(ids.revert)
    assert.equal("EVM_TX_REVERTED", node.error_code)
    local res = sup.reservations(s, node.id)
    assert.equal(1, #res)
    assert.equal("consumed", res[1].status)
    assert.equal("reverted", res[1].outcome)
    assert.equal("0x0", sup.receipt(anvil.url, res[1].tx_hash).status)
    assert.equal("0", sup.balance(anvil.url, reverter))
    assert.equal(n0 + 1, sup.nonce(anvil.url, errs_sender))

    -- health: the executor reports each endpoint's reachability and chain id
    local hrow = sup.wait_for(function()
      return s:query([[SELECT * FROM component_health WHERE network_class = $1
                        AND component_kind = 'executor' AND component_name = 'evm_transfer']], class)[1]
    end, 20, "executor_health to write evm_transfer's health")
    assert.equal("degraded", hrow.health_state)
    local text = hrow.detail.detail
    assert.truthy(text:find("chain " .. CHAIN .. " ok", 1, true), text)
    assert.truthy(text:find("chain 5: EVM_CHAIN_ID_MISMATCH", 1, true), text)
    assert.truthy(text:find("chain 7: EVM_RPC_UNREACHABLE", 1, true), text)
    assert.truthy(text:find("chain 8: EVM_RPC_BAD_RESPONSE", 1, true), text)

    -- the operator funds the sender and retries the node: it completes
    local poor = transfer_node(ids.unfunded)
    local poor_addr = poor.error_detail:match("(0x%x+) holds")
    assert.truthy(poor_addr, poor.error_detail)
    sup.rpc(anvil.url, "anvil_setBalance", { poor_addr, "0x8ac7230489e80000" })   -- 10 ETH
    retry_in(class, ids.unfunded, poor.id)
    sup.wait_states(s, { ids.unfunded }, { COMPLETED = true, FAILED = true, MANUAL_INTERVENTION = true }, 60, { h })
    assert.equal("COMPLETED", sup.request(s, ids.unfunded).request_state, sup.detail(s, ids.unfunded))
    assert.equal(2, transfer_node(ids.unfunded).attempt_no)
    stop(h)
  end)
end)
