-- The pure parts of the evm_transfer executor: wei arithmetic, risk
-- controls, fee choice within the caps, the transaction's fields and their
-- EIP-1559 payload, the checks of a transfer's inputs and their error codes,
-- node config validation, error-code mapping and URL redaction.  The chain
-- itself is in spec/lua/evm/evm_transfer_spec.lua.
local qtg = require "qtg"
local evm_tx = require "qtg.evm_tx"
local exe = require "qtg.executors.evm_transfer"

local RC = { max_fee_per_gas_wei = "100000000000", max_priority_fee_per_gas_wei = "2000000000",
             gas_limit = 21000, max_amount = "10", allowed_chain_ids = { 31337 } }

describe("evm_tx: amounts", function()
  it("converts decimals to wei exactly, refusing what is not a wei amount", function()
    assert.equal("1500000000000000000", evm_tx.to_wei("1.5"))
    assert.equal("1", evm_tx.to_wei("0.000000000000000001"))
    assert.equal("123456789000000000000000000", evm_tx.to_wei("123456789"))
    assert.equal("100000000000000000", evm_tx.to_wei(0.1))
    for _, bad in ipairs({ "0", "0.0", "-1", "1e18", "1.", ".5", "0.0000000000000000001", "abc", "", {} }) do
      local w, why = evm_tx.to_wei(bad)
      assert.is_nil(w, tostring(bad))
      assert.is_string(why)
    end
    assert.equal("1.5", evm_tx.from_wei("1500000000000000000"))
    assert.equal("0.000000000000000001", evm_tx.from_wei("1"))
    assert.equal("10000", evm_tx.from_wei("10000000000000000000000"))
  end)

  it("adds, multiplies and compares integers beyond 2^53", function()
    assert.equal("20000000000000000000000", evm_tx.add("10000000000000000000000", "10000000000000000000000"))
    assert.equal("1000", evm_tx.add("999", "1"))
    assert.equal("2100000000000000", evm_tx.mul("21000", "100000000000"))
    assert.equal("121932631138079548321002895910841426739", evm_tx.mul("11111111111111111111", "10973936802427159349"))
    assert.equal("0", evm_tx.mul("0", "123"))
    assert.equal(-1, evm_tx.cmp("999", "1000"))
    assert.equal(1, evm_tx.cmp("1001", "1000"))
    assert.equal(0, evm_tx.cmp("1000", "1000"))
    assert.equal("10000000000000000000000", evm_tx.hex_to_dec("0x21e19e0c9bab2400000"))
    assert.equal("0", evm_tx.hex_to_dec("0x0"))
    assert.equal("115792089237316195423570985008687907853269984665640564039457584007913129639935",
      evm_tx.hex_to_dec("0x" .. string.rep("f", 64)))
    assert.is_nil(evm_tx.hex_to_dec("12"))
    assert.is_nil(evm_tx.hex_to_dec("0xzz"))
    assert.equal("21100000000000000000", evm_tx.max_cost(21000, 1000000000000000, "100000000000000000"))
  end)
end)

describe("evm_tx: risk controls and fees", function()
  it("requires explicit fee caps and checks every control", function()
    local c = assert(evm_tx.controls(RC))
    assert.equal(100000000000, c.max_fee_per_gas)
    assert.equal(2000000000, c.max_priority_fee_per_gas)
    assert.equal("10000000000000000000", c.max_amount_wei)
    assert.is_true(c.allowed_chain_ids[31337])
    assert.equal(64, c.max_pending)
    local function without(k, v)
      local t = {}
      for kk, vv in pairs(RC) do t[kk] = vv end
      t[k] = v
      return t
    end
    for _, bad in ipairs({
      without("max_fee_per_gas_wei", nil), without("max_fee_per_gas_wei", "0"),
      without("max_fee_per_gas_wei", "1e9"), without("max_priority_fee_per_gas_wei", nil),
      without("max_priority_fee_per_gas_wei", "200000000000"), without("gas_limit", 20000),
      without("max_amount", "-1"), without("allowed_chain_ids", { 0 }), without("allowed_chain_ids", "1"),
      without("max_pending_nonces", 0), "nope",
    }) do
      local ok, why = evm_tx.controls(bad)
      assert.is_nil(ok)
      assert.matches("risk_controls", why)
    end
  end)

  it("chooses tip and max fee from the node's data, within the caps", function()
    local c = assert(evm_tx.controls(RC))
    local f = assert(evm_tx.fees({ base_fee_next = 1000000000, suggested_tip = 1500000000, controls = c }))
    assert.equal(1500000000, f.max_priority_fee_per_gas)
    assert.equal(3500000000, f.max_fee_per_gas)          -- 2 * base + tip
    -- the tip is capped; without a suggestion the median reward is used
    f = assert(evm_tx.fees({ base_fee_next = 1000000000, suggested_tip = 9000000000, controls = c }))
    assert.equal(2000000000, f.max_priority_fee_per_gas)
    f = assert(evm_tx.fees({ base_fee_next = 10, rewards = { 5, 1, 3 }, controls = c }))
    assert.equal(3, f.max_priority_fee_per_gas)
    -- the max fee is capped while the next block stays affordable
    f = assert(evm_tx.fees({ base_fee_next = 60000000000, suggested_tip = 1000000000, controls = c }))
    assert.equal(100000000000, f.max_fee_per_gas)
    -- refused when the cap cannot pay the next block's base fee and the tip
    local ok, err = evm_tx.fees({ base_fee_next = 99500000000, suggested_tip = 1000000000, controls = c })
    assert.is_nil(ok)
    assert.equal("EVM_FEE_ABOVE_CAP", err.code)
    assert.matches("max_fee_per_gas_wei", err.message)
  end)

  it("reads eth_feeHistory answers and refuses malformed ones", function()
    local h = assert(evm_tx.fee_history({ baseFeePerGas = { "0x3b9aca00", "0x3b9aca01" },
                                         reward = { { "0x5" }, { "0x7" } } }))
    assert.equal(1000000001, h.base_fee_next)
    assert.same({ 5, 7 }, h.rewards)
    assert.is_nil(evm_tx.fee_history({}))
    assert.is_nil(evm_tx.fee_history({ baseFeePerGas = { "12" } }))
    assert.is_nil(evm_tx.fee_history({ baseFeePerGas = { "0x" .. string.rep("f", 20) } }))
  end)

  it("builds fields whose EIP-1559 payload hashes to the signing hash", function()
    local fields = evm_tx.fields({ chain_id = 31337, nonce = 7, to = "0x" .. string.rep("ab", 20),
      value_wei = "1500000000000000000", gas_limit = 21000,
      fees = { max_fee_per_gas = 3000000000, max_priority_fee_per_gas = 1000000000 } })
    local tx = qtg.evm.eip1559(fields)
    assert.matches("^0x02", tx.payload)
    assert.equal(tx.signing_hash, "0x" .. qtg.crypto.keccak256_hex(qtg.crypto.unhex(tx.payload)))
    -- the stored form (JSON) gives the same transaction back
    local again = qtg.evm.eip1559(require("cjson").decode(require("cjson").encode(fields)))
    assert.equal(tx.signing_hash, again.signing_hash)
    assert.equal(3, evm_tx.confirmations(10, 12))
    assert.equal(0, evm_tx.confirmations(10, 5))
  end)
end)

describe("evm_transfer executor: checks without a chain", function()
  local function ctx(intent, rc, cfg)
    return { action_type = "evm_transfer", request_node_id = "00000000-0000-0000-0000-000000000001",
             intent = intent, risk_controls = rc or RC, node_config = cfg or { signer_key = "nope" } }
  end
  local DEST = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"   -- EIP-55 form
  local function code(intent, rc, cfg)
    local p, err = exe.plan(ctx(intent, rc, cfg))
    assert.is_nil(p)
    assert.is_string(err.message)
    return err.code, err.message
  end

  it("refuses each bad input with its own code", function()
    local base = { asset = "ETH", amount = "1", destination = DEST, chain_id = 31337 }
    local function with(k, v)
      local t = {}
      for kk, vv in pairs(base) do t[kk] = vv end
      t[k] = v
      return t
    end
    assert.equal("EVM_UNSUPPORTED_ASSET", code(with("asset", "USDC")))
    assert.equal("EVM_BAD_INTENT", code(with("chain_id", "x")))
    assert.equal("EVM_BAD_INTENT", code(with("chain_id", 0)))
    assert.equal("EVM_CHAIN_NOT_ALLOWED", code(with("chain_id", 1)))
    assert.equal("EVM_RISK_CONTROLS_INVALID", code(base, { max_amount = "1" }))
    assert.equal("EVM_BAD_AMOUNT", code(with("amount", "0")))
    assert.equal("EVM_AMOUNT_ABOVE_CAP", code(with("amount", "10.000000000000000001")))
    assert.equal("EVM_BAD_DESTINATION", code(with("destination", "0x1234")))
    assert.equal("EVM_BAD_DESTINATION", code(with("destination", DEST:gsub("C8$", "c8"))))  -- checksum typo
    assert.equal("EVM_BAD_DESTINATION", code(with("destination", "0x" .. string.rep("0", 40))))
    -- all good but the signer: no `qtgd signer` runs for this spec, so the
    -- plan cannot learn the key's address and raises signer_unavailable
    -- (the dispatcher's tick rolls back: the node stays READY, retryable)
    local function unavailable(intent)
      local ok, e = pcall(exe.plan, ctx(intent))
      assert.is_false(ok)
      assert.equal("signer_unavailable", type(e) == "table" and e.kind or tostring(e))
    end
    unavailable(base)
    -- lowercase and uppercase hex carry no checksum and are accepted
    unavailable(with("destination", DEST:lower()))
    unavailable(with("destination", "0x" .. DEST:sub(3):upper()))
  end)

  it("validates node configs per action type", function()
    assert.is_true(exe.validate_config({ signer_key = "hot" }, "evm_transfer"))
    assert.is_true(exe.validate_config({ tx_hash = "$ref:transfer.tx_hash", chain_id = "$ref:transfer.chain_id",
                                         confirmations = 3 }, "destination_chain_finality_observe"))
    assert.is_true(exe.validate_config({ tx_hash = "$ref:t.tx_hash", verify_intent = true },
                                       "destination_chain_receive_observe"))
    for _, bad in ipairs({
      { {}, "evm_transfer" }, { { signer_key = "hot", gas = 1 }, "evm_transfer" },
      { { signer_key = 5 }, "evm_transfer" }, { { tx_hash = "$ref:t.tx_hash" }, "destination_chain_finality_observe" },
      { { tx_hash = "$ref:t.tx_hash", confirmations = 0 }, "destination_chain_finality_observe" },
      { { signer_key = "hot" }, "withdrawal" },
    }) do
      local ok, why = exe.validate_config(bad[1], bad[2])
      assert.is_nil(ok)
      assert.is_string(why)
    end
  end)

  it("maps RPC failures to codes and keeps credentials out of details", function()
    assert.equal("EVM_RPC_UNREACHABLE", exe.rpc_code({ kind = "refused" }))
    assert.equal("EVM_RPC_UNREACHABLE", exe.rpc_code({ kind = "timeout" }))
    assert.equal("EVM_RPC_BAD_RESPONSE", exe.rpc_code({ kind = "garbage" }))
    assert.equal("EVM_RPC_BAD_RESPONSE", exe.rpc_code({ kind = "status" }))
    assert.equal("EVM_RPC_ERROR", exe.rpc_code({ kind = "rpc" }))
    assert.equal("https://mainnet.example", exe.redact("https://user:secret@mainnet.example/v3/KEY"))
    assert.equal("http://127.0.0.1:8545", exe.redact("http://127.0.0.1:8545"))
    assert.equal("?", exe.redact("ftp://x"))
  end)

  it("tells the node answers that mean the same bytes are already known", function()
    -- submit and recover look these up by hash instead of failing the
    -- transfer (an "already known" taken as a refusal piled up retries at
    -- OpenZeppelin Defender when a provider reworded it)
    local rpc = require "qtg.evm_rpc"
    local function node_err(message) return { kind = "rpc", code = -32000, message = message } end
    for _, msg in ipairs({
      "transaction already imported",                          -- anvil
      "already known",                                         -- geth, erigon
      "AlreadyKnown",                                          -- nethermind
      "Known transaction: 0x1234",                             -- besu
      "ALREADY KNOWN",                                         -- any case
      "transaction already exists in the pool",
      "Transaction is already in the pool",
    }) do
      assert.is_true(rpc.is_already_known(node_err(msg)), msg)
      assert.is_false(rpc.is_nonce_too_low(node_err(msg)), msg)
    end
    for _, msg in ipairs({
      "nonce too low", "replacement transaction underpriced", "Insufficient funds for gas * price + value",
      "transaction underpriced", "known nonce gap",
    }) do
      assert.is_false(rpc.is_already_known(node_err(msg)), msg)
    end
    -- only a node's JSON-RPC error says so: the same words from a transport
    -- failure, or no error at all, are not an answer about the bytes
    assert.is_false(rpc.is_already_known({ kind = "timeout", message = "already known" }))
    assert.is_false(rpc.is_already_known(nil))
    assert.is_false(rpc.is_already_known("already known"))
    for _, msg in ipairs({ "nonce too low", "Nonce too low: next nonce 7, tx nonce 5", "OldNonce",
                           "transaction nonce is too low" }) do
      assert.is_true(rpc.is_nonce_too_low(node_err(msg)), msg)
      assert.is_false(rpc.is_already_known(node_err(msg)), msg)
    end
    -- the errors that refuse the bytes themselves, as the clients word them
    for _, msg in ipairs({
      "Insufficient funds for gas * price + value",                        -- anvil
      "insufficient funds for gas * price + value: balance 0, tx cost 1",  -- geth, erigon
      "InsufficientFunds, Account balance: 0, cumulative cost: 21000",     -- nethermind (older)
      "Upfront cost exceeds account balance",                              -- besu
      "intrinsic gas too low", "Intrinsic gas exceeds gas limit", "INTERNAL_ERROR: IntrinsicGas",
      "exceeds block gas limit", "invalid sender", "failed to recover sender",
      "transaction type not supported", "Invalid transaction type",
      "tx fee (1.20 ether) exceeds the configured cap (1.00 ether)", "Transaction fee cap exceeded",
      "Wrong chainId", "Incompatible EIP-155 transaction, signed for another chain",
      "transaction underpriced: gas tip cap 1, minimum needed 2",        -- geth (older): its minimum
      "transaction gas price below minimum: gas tip cap 1, minimum needed 2",  -- geth 1.15.9
      "Gas price below configured minimum gas price",
      "transaction priority fee below minimum required priority fee 2",  -- reth
    }) do
      assert.is_true(rpc.is_tx_refused(node_err(msg)), msg)
    end
    -- what can still be pooled or mined later, and what says nothing of the bytes
    for _, msg in ipairs({
      "replacement transaction underpriced", "Replacement transaction underpriced",
      "FEE_TOO_LOW: replacement transaction underpriced",
      "transaction underpriced",                      -- geth: a full pool
      "FeeTooLow, MaxFeePerGas too low",              -- nethermind (older): a full pool
      "nonce too high",                               -- a future nonce (geth's blob pool, a sequencer)
      "max fee per gas less than block base fee",     -- parked by a pool, sent again once the base fee falls
      "fee cap less than block base fee", "gas limit reached",
      "already known", "nonce too low", "rate limit exceeded", "daily request count exceeded",
      "internal error", "header not found", "invalid signature on JWT token", "",
    }) do
      assert.is_false(rpc.is_tx_refused(node_err(msg)), msg)
    end
    assert.is_false(rpc.is_tx_refused({ kind = "timeout", message = "insufficient funds" }))
    -- outbid: another transaction of the sender holds the nonce in the pool
    for _, msg in ipairs({ "replacement transaction underpriced", "FEE_TOO_LOW: replacement transaction underpriced",
                           "Replacement transaction under-priced", "ReplacementNotAllowed" }) do
      assert.is_true(rpc.is_outbid(node_err(msg)), msg)
      assert.is_false(rpc.is_tx_refused(node_err(msg)), msg)
    end
    for _, msg in ipairs({ "transaction underpriced", "nonce too low", "insufficient funds", "" }) do
      assert.is_false(rpc.is_outbid(node_err(msg)), msg)
    end
    assert.is_false(rpc.is_outbid({ kind = "timeout", message = "replacement transaction underpriced" }))
  end)

  it("refuses a chain without an endpoint (this process has none)", function()
    local url, err = exe.endpoint(31337)
    assert.is_nil(url)
    assert.equal("EVM_NO_RPC_ENDPOINT", err.code)
    local ok, why = require("qtg.evm_demo").ready()
    assert.is_nil(ok)
    assert.matches("evm_hot is not loaded", why)
    local h = exe.health()
    assert.equal("down", h.state)
    assert.matches("MG_EVM_RPC_URLS", h.detail)
  end)
end)

-- An RPC that lies cannot be made of anvil: these stand in for one, as a
-- provider that cannot be reached from here is stood in for.
-- stubs() -> stub(t, k, f), unstub(): stand-ins for RPC answers a real
-- node never gives; unstub puts every original back, last first.
local function stubs()
  local saved = {}
  local function stub(t, k, f) saved[#saved + 1] = { t, k, t[k] }; t[k] = f end
  local function unstub()
    for i = #saved, 1, -1 do local x = saved[i]; x[1][x[2]] = x[3] end
    saved = {}
  end
  return stub, unstub
end

describe("evm_transfer executor: an RPC that answers for another transaction", function()
  local rpc = require "qtg.evm_rpc"
  local nonces = require "qtg.evm_nonces"
  local OURS, OTHER = "0x" .. string.rep("a", 64), "0x" .. string.rep("b", 64)
  local row = { id = 7, chain_id = 31337, address = "0x" .. string.rep("1", 40), nonce = 5, tx_hash = OURS,
                signed_raw_tx = "0x02aa", to_address = "0x" .. string.rep("2", 40), value_wei = "1" }
  local stub, unstub = stubs()
  local calls = {}
  before_each(function()
    calls = {}
    stub(exe, "endpoint", function() return "http://rpc.invalid" end)
    stub(rpc, "chain_id", function() return 31337 end)
    stub(nonces, "read", function() return row end)
    stub(nonces, "read_fill_at", function() return nil end)
    for _, k in ipairs({ "mark_mined", "surface", "mark_broadcast", "note" }) do
      stub(nonces, k, function() calls[#calls + 1] = k end)
    end
  end)
  after_each(unstub)

  it("never takes a transaction of another hash as its own after 'already known' or 'nonce too low'", function()
    for _, message in ipairs({ "already known", "nonce too low" }) do
      stub(rpc, "send_raw_transaction", function() return rpc.fail("rpc", message) end)
      stub(rpc, "get_transaction_by_hash", function() return { hash = OTHER } end)
      local st, err = exe.broadcast("http://rpc.invalid", row, false)
      assert.equal("unknown", st, message)
      assert.equal("EVM_RPC_BAD_RESPONSE", err.code)
      assert.matches("answered the lookup of " .. OURS .. " with transaction " .. OTHER, err.message, 1, true)
      assert.same({}, calls)
      -- its own hash: sent
      stub(rpc, "get_transaction_by_hash", function() return { hash = OURS } end)
      assert.equal("sent", (exe.broadcast("http://rpc.invalid", row, false)))
      assert.same({ "mark_broadcast" }, calls)
      calls = {}
    end
  end)

  -- A refusal on the first send surfaces the nonce, and every later
  -- transfer of the sender waits for an operator to fill it
  -- (EVM_NONCE_GAP): only an error that refuses the bytes may do that.  A
  -- rate limit or an upstream error says nothing of them (a proxy may have
  -- passed them on): UNKNOWN, and recovery sends the same bytes again.
  it("fails a first send only on an error that refuses the bytes; a rate limit or upstream error is UNKNOWN", function()
    for _, c in ipairs({
      { "insufficient funds for gas * price + value", "failed", "EVM_TX_REJECTED", "surface" },
      { "intrinsic gas too low", "failed", "EVM_TX_REJECTED", "surface" },
      { "Upfront cost exceeds account balance", "failed", "EVM_TX_REJECTED", "surface" },
      { "max fee per gas less than block base fee", "unknown", "EVM_BROADCAST_OUTCOME_UNKNOWN", "note" },
      { "nonce too high", "unknown", "EVM_BROADCAST_OUTCOME_UNKNOWN", "note" },
      { "transaction underpriced", "unknown", "EVM_BROADCAST_OUTCOME_UNKNOWN", "note" },
      { "daily request count exceeded, request rate limited", "unknown", "EVM_BROADCAST_OUTCOME_UNKNOWN", "note" },
      { "internal error", "unknown", "EVM_BROADCAST_OUTCOME_UNKNOWN", "note" },
      { "upstream request timeout", "unknown", "EVM_BROADCAST_OUTCOME_UNKNOWN", "note" },
      { "replacement transaction underpriced", "unknown", "EVM_BROADCAST_OUTCOME_UNKNOWN", "note" },
    }) do
      calls = {}
      stub(rpc, "send_raw_transaction", function() return rpc.fail("rpc", c[1]) end)
      local st, err = exe.broadcast("http://rpc.invalid", row, false)
      assert.equal(c[2], st, c[1])
      assert.equal(c[3], err.code, c[1])
      assert.matches(c[1], err.message, 1, true)
      assert.same({ c[4] }, calls, c[1])
    end
  end)

  it("never completes a transfer on a receipt or a transaction of another hash", function()
    stub(rpc, "get_transaction_receipt", function()
      return { transactionHash = OTHER, blockNumber = "0x10", status = "0x1", blockHash = OTHER, gasUsed = "0x5208" }
    end)
    local a = exe.observe({ action_type = exe.TRANSFER, request_node_id = "n", provider_refs = { tx_hash = OURS } })
    assert.equal("UNKNOWN", a.status)
    assert.equal("EVM_RPC_BAD_RESPONSE", a.error_code)
    assert.matches("answered the lookup of " .. OURS, a.error_detail, 1, true)
    assert.same({}, calls)
    -- no receipt, and a "pending" transaction of another hash
    stub(rpc, "get_transaction_receipt", function() return false end)
    stub(rpc, "get_transaction_by_hash", function() return { hash = OTHER } end)
    a = exe.observe({ action_type = exe.TRANSFER, request_node_id = "n", provider_refs = { tx_hash = OURS } })
    assert.equal("UNKNOWN", a.status)
    assert.equal("EVM_RPC_BAD_RESPONSE", a.error_code)
    assert.same({}, calls)
    -- the receive and finality nodes: the same
    stub(rpc, "get_transaction_receipt", function()
      return { transactionHash = OTHER, blockNumber = "0x10", status = "0x1" }
    end)
    for _, action in ipairs({ exe.RECEIVE, exe.FINALITY }) do
      a = exe.observe({ action_type = action, request_node_id = "n", intent = {},
                        node_config = { tx_hash = OURS, chain_id = 31337, confirmations = 1 } })
      assert.equal("UNKNOWN", a.status, action)
      assert.equal("EVM_RPC_BAD_RESPONSE", a.error_code, action)
    end
  end)

  it("judges nothing against an endpoint that now serves another chain", function()
    stub(rpc, "chain_id", function() return 1 end)
    stub(rpc, "get_transaction_receipt", function() return false end)
    stub(rpc, "get_transaction_by_hash", function() return false end)
    stub(rpc, "get_transaction_count", function() return 99 end)   -- "taken", on the wrong chain
    for _, call in ipairs({ exe.observe, exe.recover }) do
      local a = call({ action_type = exe.TRANSFER, request_node_id = "n", provider_refs = { tx_hash = OURS } })
      assert.equal("UNKNOWN", a.status)
      assert.equal("EVM_CHAIN_ID_MISMATCH", a.error_code)
    end
    local a = exe.observe({ action_type = exe.FINALITY, request_node_id = "n", intent = {},
                            node_config = { tx_hash = OURS, chain_id = 31337, confirmations = 1 } })
    assert.equal("EVM_CHAIN_ID_MISMATCH", a.error_code)
    assert.same({}, calls)
  end)

  it("refuses quantities it cannot hold exactly and hex it would take too long to convert", function()
    assert.equal(2 ^ 53 - 1, rpc.quantity("0x1fffffffffffff"))
    assert.is_nil(rpc.quantity("0x20000000000000"))      -- 2^53
    assert.is_nil(rpc.quantity("0x20000000000001"))      -- rounds to 2^53 as a double
    assert.is_nil(rpc.quantity("0xffffffffffffff"))
    assert.equal(evm_tx.hex_to_dec("0x" .. string.rep("f", 64)),
      "115792089237316195423570985008687907853269984665640564039457584007913129639935")
    assert.is_nil(evm_tx.hex_to_dec("0x" .. string.rep("f", 65)))
    assert.is_nil(evm_tx.hex_to_dec("0x" .. string.rep("f", 4000000)))
  end)
end)

describe("evm_transfer executor: a nonce the RPC reads as taken", function()
  local rpc = require "qtg.evm_rpc"
  local nonces = require "qtg.evm_nonces"
  local HASH = "0x" .. string.rep("c", 64)
  local stub, unstub = stubs()
  local s, id
  setup(function()
    s = qtg.db.acquire()
    -- a broadcast reservation of its own address (no chain: the RPC answers
    -- below are the stand-in for a node that no longer finds the transaction)
    local address = "0x" .. qtg.crypto.hex(qtg.crypto.random_bytes(20))
    id = s:query([[INSERT INTO evm_nonce_reservation (chain_id, address, nonce, status, payload_hash, signed_raw_tx, tx_hash)
                   VALUES (31337, $1, 4, 'broadcast', $2, '0x02aa', $3) RETURNING id]],
      address, "0x" .. string.rep("d", 64), HASH)[1].id
  end)
  teardown(function()
    s:query("DELETE FROM evm_nonce_reservation WHERE id = $1", id)
    s:release()
  end)
  after_each(unstub)

  it("decides only after the window and three looks; 0 seconds decides at once", function()
    assert.is_false((nonces.taken_verdict(1, 0, 300)))
    assert.is_false((nonces.taken_verdict(2, 900, 300)))     -- long, but two looks only
    assert.is_false((nonces.taken_verdict(50, 299.9, 300)))  -- many looks, too soon
    assert.is_true((nonces.taken_verdict(3, 300, 300)))
    assert.is_true((nonces.taken_verdict(1, 0, 0)))
    local final, how = nonces.taken_verdict(2, 41.7, 300)
    assert.is_false(final)
    assert.equal("seen 2 times over 41 s; final once seen 3 times over 300 s (MG_EVM_NONCE_TAKEN_CONFIRM_SECONDS)", how)
  end)

  it("a re-sent transaction answered 'nonce too low' waits for the verdict; a free nonce ends the run", function()
    stub(rpc, "send_raw_transaction", function() return rpc.fail("rpc", "nonce too low") end)
    stub(rpc, "get_transaction_receipt", function() return false end)
    stub(rpc, "get_transaction_by_hash", function() return false end)
    stub(rpc, "get_transaction_count", function() return 9 end)
    local row = nonces.read(function(x) return nonces.by_id(x, id) end)
    for look = 1, 2 do
      local st, taken = exe.broadcast("http://rpc.invalid", row, true)
      assert.equal("taken", st)
      assert.equal(9, taken.count)
      local r = s:query("SELECT status, nonce_taken_looks FROM evm_nonce_reservation WHERE id = $1", id)[1]
      assert.equal("broadcast", r.status, "nothing is surfaced while bytes sent before may be out")
      assert.equal(look - 1, r.nonce_taken_looks, "broadcast leaves the look to its caller")
      -- its callers (settle, submit) record the look and judge it
      assert.is_false((nonces.look_taken(id)))
      assert.equal(look, s:query("SELECT nonce_taken_looks AS n FROM evm_nonce_reservation WHERE id = $1", id)[1].n)
    end
    -- a first send (bytes never out before) is judged at once
    local st, err = exe.broadcast("http://rpc.invalid", row, false)
    assert.equal("failed", st)
    assert.equal("EVM_NONCE_TAKEN", err.code)
    assert.equal("surfaced", s:query("SELECT status FROM evm_nonce_reservation WHERE id = $1", id)[1].status)
    -- the run ends at a look that finds the nonce free
    row = nonces.read(function(x) return nonces.by_id(x, id) end)
    assert.is_not_nil(row.nonce_taken_since)
    nonces.clear_taken(row)
    local r = s:query("SELECT nonce_taken_since, nonce_taken_looks FROM evm_nonce_reservation WHERE id = $1", id)[1]
    assert.equal(0, r.nonce_taken_looks)
    assert.equal(qtg.db.NULL, r.nonce_taken_since)
  end)
end)

-- A node's error is any bytes: a message cut at 300 bytes inside a
-- character, latin-1, 0xff and NUL, a 502 page split at byte 200.  Each is
-- valid text from evm_rpc on, and a refusal is recorded on the reservation.
describe("evm_transfer executor: a node's error that is not text", function()
  local canon = require "qtg.canon_json"
  local rpc = require "qtg.evm_rpc"
  local R = "\239\191\189" -- U+FFFD
  local s, prov, dir, sup
  setup(function()
    sup = require "spec.lua.support.conditional"
    s = qtg.db.acquire()
    dir = sup.tmpdir()
    prov = sup.start_providers(dir)
  end)
  teardown(function()
    s:release()
    sup.stop_all()
  end)

  local function answer(status, body)
    prov.control({ service = "rpc", mode = "raw", status = status, body_hex = qtg.crypto.hex(body) })
  end
  local function rpc_error(message)
    return '{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"' .. message .. '"}}'
  end
  local REFUSED = "insufficient funds for gas * price + value: "
  local SPLIT = REFUSED .. string.rep("x", 299 - #REFUSED) .. "\195\169 tail"

  it("makes every error message valid text at the source", function()
    local cases = {
      { 200, rpc_error(SPLIT), "rpc", REFUSED .. string.rep("x", 299 - #REFUSED) .. R .. "..." },
      { 200, rpc_error("insufficient funds caf\233 \255\\u0000 end"), "rpc", "insufficient funds caf" .. R .. " " .. R .. "  end" },
      { 502, "<html><title>502 Bad Gateway</title>" .. string.rep(" ", 162) .. "\226\128\162 down</html>", "status",
        "HTTP 502: <html><title>502 Bad Gateway</title>" .. string.rep(" ", 162) .. R .. R .. "..." },
      { 200, "<html>Erreur caf\233\0</html>", "garbage", "not a JSON-RPC 2.0 response: <html>Erreur caf" .. R .. " </html>" },
    }
    for _, c in ipairs(cases) do
      answer(c[1], c[2])
      local h, err = rpc.send_raw_transaction(prov.url .. "/rpc", "0x02aa")
      assert.is_nil(h)
      assert.equal(c[3], err.kind)
      assert.equal(c[4], err.message)
      assert.is_true(canon.text_ok(tostring(err)))
    end
    prov.control({ service = "rpc", mode = "ok" })
  end)

  -- a row of a chain no spec's reaper serves (31499): left signed or
  -- surfaced, a row of the sidecar specs' 31337 was settled by their
  -- reaper's pass minutes later, which counted it
  local function reservation()
    local address = "0x" .. qtg.crypto.hex(qtg.crypto.random_bytes(20))
    local row = s:query([[INSERT INTO evm_nonce_reservation (chain_id, address, nonce, status, payload_hash, signed_raw_tx, tx_hash)
                          VALUES (31499, $1, 4, 'signed', $2, '0x02aa', $3) RETURNING *]],
      address, "0x" .. string.rep("d", 64), "0x" .. qtg.crypto.keccak256_hex(qtg.crypto.unhex("0x02aa")))[1]
    row.to_address, row.value_wei = "0x" .. string.rep("2", 40), "1"
    return row
  end

  it("records a refusal cut inside a character: a first send FAILED and surfaced, a re-send noted", function()
    answer(200, rpc_error(SPLIT))
    local row = reservation()
    local st, err = exe.broadcast(prov.url .. "/rpc", row, false)
    assert.equal("failed", st)
    assert.equal("EVM_TX_REJECTED", err.code)
    local r = s:query("SELECT status, surfaced_reason FROM evm_nonce_reservation WHERE id = $1", row.id)[1]
    assert.equal("surfaced", r.status)
    assert.matches(R .. "...", r.surfaced_reason, 1, true)
    answer(200, rpc_error("insufficient funds \255\\u0000"))
    row = reservation()
    st, err = exe.broadcast(prov.url .. "/rpc", row, true)
    assert.equal("unknown", st)
    assert.equal("EVM_REBROADCAST_REFUSED", err.code)
    assert.matches("insufficient funds " .. R .. " ", s:query("SELECT last_error FROM evm_nonce_reservation WHERE id = $1",
      row.id)[1].last_error, 1, true)
    prov.control({ service = "rpc", mode = "ok" })
  end)
end)
