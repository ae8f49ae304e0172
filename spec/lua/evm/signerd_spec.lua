-- `qtgd signer` (src/qtg_signerd.c): the separate process that alone holds
-- the keys and signs only what an approval allowed.  Real PostgreSQL (the
-- signer connects as role qtg_signer), a real anvil chain, real `qtgd run`
-- and `qtgd signer` processes; every assertion reads rows, the chain, or the
-- processes' memory.
--   * this spec's own process plays a console user / policy script: it asks
--     the signer directly (qtg.signer.sign) and every refusal case of the
--     checks is met with its code, each recorded in signer_events; the
--     exact approved transaction is granted (and recorded);
--   * the plan under a pending request: qtg_runtime changing the transfer
--     node's destination or the fee cap is refused (sql/0170), and after a
--     real approval the signer signs A at the template's caps only;
--   * one approved transfer, one nonce: two signers sharing the database,
--     held by the daemon's role on a table lock and let go at once, with a
--     SIGN each for one transfer at two nonces, grant it once; the lock
--     that makes it so, held by the daemon's role, delays a grant by the
--     statement timeout and no more; a grant recorded before sql/0171 (no
--     nonce) counts; an allowed_chain_ids that is not a list is refused;
--   * the tampering attack: an approved 0.25 ETH transfer to A rewritten
--     (triggers bypassed) to 20 ETH to B is refused by the signer (digest
--     mismatch), the node FAILED with SIGNING_REFUSED, nothing broadcast;
--   * the daemon's memory and environment hold no key bytes nor their hex
--     (the same scan finds them in the signer's memory);
--   * the signer down (kill -9): the node stays READY at its attempt, and
--     completes once a signer is back;
--   * a peer of another uid (nobody) is refused, even with the socket open;
--   * connections of the allowed uid that say nothing hold up no other
--     (the signer reads them all at once), and are cut off and logged;
--   * a signer holding no key starts without any database (a package's
--     first start); one holding a key and given no URL names the setting;
--   * signed approvals (MG_SIGNER_APPROVERS): every vote row a runtime-role
--     forger could write is not counted, the enrolment's quorum holds over
--     the request's, and end to end one signed vote where two are enrolled
--     moves nothing while two move the ETH;
--   * amount tiers (quorum CLASS N above AMOUNT ASSET): the signer asks a
--     tier's count of a request above it whatever approvals_required (forged
--     to 1 as qtg_runtime) says, never at or below the amount nor for
--     another asset, refuses an amount it cannot compare, judges a plan
--     that pays the amount twice on twice the amount, and refuses at start
--     a class's tier under keys bound to no class; the daemon keeps such a
--     request PENDING_APPROVAL until the tier's count.
local qtg = require "qtg"
local cjson = require "cjson"
local common = require "spec.lua.support.common"

local CHAIN = 31412
local AMOUNT, AMOUNT_WEI = "0.25", "250000000000000000"
local MAX_FEE, MAX_TIP = 200000000000, 5000000000

local sup, engine, s, dir, anvil, DEV

local function new_class() return "signspec-" .. qtg.crypto.hex(qtg.crypto.random_bytes(4)) end

local function intent(dest, amount)
  return { asset = "ETH", amount = amount or AMOUNT, destination = dest, chain_id = CHAIN }
end

local function events_of(request_id)
  return s:query([[SELECT * FROM signer_events WHERE request_id = $1::uuid ORDER BY id]], request_id)
end

-- A signer for env: the cases use nonce ranges of their own, far apart on
-- one chain and sender, so the bound on nonces ahead is far (unless env
-- sets it; false: the default, for the bound's own case).
local SPREAD = "100000"
local function start_signer(env)
  if env.MG_SIGNER_NONCE_AHEAD_MAX == nil then
    env.MG_SIGNER_NONCE_AHEAD_MAX = SPREAD
  elseif env.MG_SIGNER_NONCE_AHEAD_MAX == false then
    env.MG_SIGNER_NONCE_AHEAD_MAX = nil
  end
  return sup.start_signer(env)
end

-- the signer answering this process (its default socket) for the key files
local function start_local_signer(keys_env, extra)
  local env = sup.run_env("unused", { MG_SIGNER_KEYS = keys_env,
    MG_SIGNER_SOCKET = qtg.signer.socket_path() })
  for k, v in pairs(extra or {}) do env[k] = v end
  return start_signer(env)
end

-- the answer to each line, each asked on a connection of its own of the
-- allowed uid (this process's) at the socket sock
local function ask_raw(sock, lines)
  local client = [[/usr/bin/python3 -c 'import socket,sys
for line in sys.argv[2:]:
  c=socket.socket(socket.AF_UNIX); c.settimeout(20); c.connect(sys.argv[1])
  c.sendall(line.encode()+b"\n"); print(c.makefile().readline().strip()); c.close()' ]]
  local words = { common.quote(sock) }
  for _, l in ipairs(lines) do words[#words + 1] = common.quote(l) end
  local p = io.popen(client .. table.concat(words, " ") .. " 2>&1")
  local out = {}
  for l in p:lines() do out[#out + 1] = l end
  p:close()
  return out
end

-- an unsigned EIP-1559 transfer: fields over the approved ones
local function payload(over)
  local f = { chain_id = CHAIN, nonce = 0, to = nil, value = AMOUNT_WEI, gas_limit = 21000,
              max_fee_per_gas = tostring(MAX_FEE), max_priority_fee_per_gas = tostring(MAX_TIP),
              data = "0x" }
  for k, v in pairs(over) do f[k] = v end
  return qtg.evm.eip1559(f)
end

-- approve the request (as the engine does), move it to a class of its own
-- (no later spec's dispatcher, in the default class, meets its READY
-- transfer): the transfer node, READY
local function approved_transfer(request_id)
  engine.approve(s, request_id)
  engine.move_class(s, request_id, new_class())
  local node = engine.nodes(s, request_id).transfer
  assert.equal("READY", node.node_state)
  return node
end

-- ask signer key "sa" to sign payload p (from payload()) for a node's first attempt
local function ask_sa(request_id, node_id, p)
  return qtg.signer.sign("sa", { request_id = request_id, request_node_id = node_id, attempt_no = 1,
                                payload = p.payload, payload_hash = p.signing_hash })
end

local function reserve(node_id, address, nonce, payload_hash)
  s:query([[INSERT INTO evm_nonce_reservation (chain_id, address, nonce, request_node_id, payload_hash)
            VALUES ($1, $2, $3, $4::uuid, $5)]], CHAIN, address, nonce, node_id, payload_hash)
end

-- sql in a transaction of its own as the daemon's role (what a console user
-- or a policy script can do): ok, rows | false, err.  must_as_runtime
-- raises instead.
local function as_runtime(sql, ...)
  s:begin()
  local ok, res = pcall(function(...)
    s:query("SET LOCAL ROLE qtg_runtime")
    return s:query(sql, ...)
  end, ...)
  if ok then s:commit() else s:rollback() end
  return ok, res
end

local function must_as_runtime(sql, ...)
  local ok, res = as_runtime(sql, ...)
  assert(ok, type(res) == "table" and res.message or tostring(res))
  return res
end

-- the request moved to APPROVED as the daemon's role, whatever its votes;
-- its transfer node READY: the node
local function approved_as_runtime(request_id)
  must_as_runtime("UPDATE movement_requests SET request_state = 'APPROVED' WHERE id = $1::uuid", request_id)
  local node = require("spec.lua.support.engine").nodes(s, request_id).transfer
  if node.node_state ~= "READY" then
    must_as_runtime("UPDATE movement_request_nodes SET node_state = 'READY' WHERE id = $1::uuid", node.id)
  end
  return node
end

-- Approvers with keys of their own (`qtgd approver key`) in a fresh
-- directory, and their enrolment file: people = { {NAME, "PRINCIPAL,...",
-- initiator = true} } (the principals default to operator:NAME; an
-- initiator is enrolled as one: it signs its requests, never approves),
-- quorums = { CLASS = N }, lines: more lines ("initiation signed").
-- Returns { dir=, key = {NAME = key file}, path=, write = fn(quorums[, without]) }
-- (write rewrites the file with the same people, but the one named
-- `without`, and other quorums).  The
-- file names the deployment DEPLOYMENT, which statement() signs for.
local DEPLOYMENT = "spec-desk"
local function approvers(people, quorums, more)
  local e = { dir = sup.host.tmpdir(), key = {}, pub = {} }
  for _, p in ipairs(people) do e.key[p[1]], e.pub[p[1]] = sup.host.approver_key(e.dir, p[1]) end
  e.path = e.dir .. "/approvers"
  function e.write(q, without)
    local lines = { "# approvers (signerd_spec)", "deployment " .. DEPLOYMENT }
    for _, p in ipairs(people) do
      if p[1] ~= without then
        lines[#lines + 1] = ("%s %s %s %s"):format(p.initiator and "initiator" or "person", p[1], e.pub[p[1]],
          p[2] or ("operator:" .. p[1]))
      end
    end
    for _, l in ipairs(more or {}) do lines[#lines + 1] = l end
    for class, n in pairs(q) do lines[#lines + 1] = ("quorum %s %d"):format(class, n) end
    sup.host.write(e.path, table.concat(lines, "\n") .. "\n")
    os.execute("chmod 644 " .. common.quote(e.path))
    return e.path
  end
  e.write(quorums)
  return e
end

-- the request's statement for a deployment (DEPLOYMENT unless named)
local function statement(id, deployment)
  return common.statement(id, deployment or DEPLOYMENT)
end

-- the attestation statement of a request's manual step (sql/0206), and
-- one stored on its node as the daemon's role would
local function attestation(id, step) return common.statement(id, DEPLOYMENT, "attestation", step) end
local function attest(node_id, principal, signature)
  must_as_runtime([[UPDATE movement_request_nodes SET attested_by = $2, attestation_signature = $3
                     WHERE id = $1::uuid]], node_id, principal, signature)
end

-- a vote of principal for the request's stored digest, as the daemon's role
local function signed_vote(request_id, principal, signature)
  must_as_runtime([[INSERT INTO request_approvals (request_id, principal, decision, approval_digest, signature)
               SELECT id, $2, 'approve', approval_digest, $3 FROM movement_requests WHERE id = $1::uuid]],
    request_id, principal, signature)
end

describe("qtgd signer", function()
  setup(function()
    sup = require "spec.lua.support.evm"
    engine = require "spec.lua.support.engine"
    DEV = sup.DEV
    s, dir, anvil = sup.fresh_chain(CHAIN)
    local rc = { allowed_chain_ids = { CHAIN }, max_amount = "25" }
    engine.load_doc(s, sup.template("sign_t_a", "sa", rc))
    engine.load_doc(s, sup.template("sign_t_b", "sb", rc))
    -- a plan that pays the intent's amount twice (a second evm_transfer node)
    local twice = sup.template("sign_t_twice", "sa", rc)
    twice.nodes[#twice.nodes + 1] = { key = "transfer_again", kind = "action", action_type = "evm_transfer",
      executor = "evm_transfer", config = { signer_key = "sa", poll_seconds = 1 },
      timeout_policy = { submit_seconds = 60, observe_seconds = 1800 } }
    twice.edges[#twice.edges + 1] = { from = "transfer", to = "transfer_again" }
    engine.load_doc(s, twice)
  end)

  teardown(function()
    s:query("DELETE FROM signer_roster WHERE signer_key IN ('sa', 'sb')")
    sup.done(s, dir)
  end)

  after_each(function() sup.host.stop_all() end)

  it("refuses every payload that is not what was approved, and records each decision", function()
    local keys = "sa=" .. sup.key_file(dir, "sa", DEV[1].key)
    start_local_signer(keys)
    local class = new_class()
    local dest = sup.random_address()
    local req = sup.create(s, "sign_t_a", class, intent(dest))
    local nodes = engine.nodes(s, req.id)
    local node, observe = nodes.transfer, nodes.destination_receive
    assert.equal("READY", node.node_state)
    local from = DEV[1].address
    local good = payload({ to = dest })
    reserve(node.id, from, 0, good.signing_hash)
    local function ask(p, over)
      local r = { request_id = req.id, request_node_id = node.id, attempt_no = 1,
                  payload = p.payload, payload_hash = p.signing_hash }
      for k, v in pairs(over or {}) do r[k] = v end
      return qtg.signer.sign("sa", r)
    end
    local cases = {
      { "CHAIN_MISMATCH", payload({ to = dest, chain_id = 1 }) },
      { "DESTINATION_MISMATCH", payload({ to = sup.random_address() }) },
      { "VALUE_MISMATCH", payload({ to = dest, value = "20000000000000000000" }) },
      { "FEES_ABOVE_CAP", payload({ to = dest, max_fee_per_gas = tostring(MAX_FEE + 1) }) },
      { "FEES_ABOVE_CAP", payload({ to = dest, max_priority_fee_per_gas = tostring(MAX_TIP + 1) }) },
      { "FEES_ABOVE_CAP", payload({ to = dest, gas_limit = 21001 }) },
      { "DATA_NOT_ALLOWED", payload({ to = dest, data = "0xa9059cbb" }) },
      { "NONCE_NOT_RESERVED", payload({ to = dest, nonce = 7 }) },
      { "NODE_NOT_DISPATCHING", good, { attempt_no = 2 } },
      { "NODE_NOT_DISPATCHING", good, { request_node_id = observe.id } },
      { "PAYLOAD_NOT_EIP1559", { payload = "0x" .. qtg.crypto.hex("a script's own bytes"),
                                 signing_hash = "0x" .. qtg.crypto.keccak256_hex("a script's own bytes") } },
      { "SIGNER_NOT_FOUND", good, nil, "nokey" },
    }
    for i, c in ipairs(cases) do
      local r = { request_id = req.id, request_node_id = node.id, attempt_no = 1,
                  payload = c[2].payload, payload_hash = c[2].signing_hash }
      for k, v in pairs(c[3] or {}) do r[k] = v end
      local sig, err = qtg.signer.sign(c[4] or "sa", r)
      assert.is_nil(sig, "case " .. i)
      assert.equal("signer", err.kind, "case " .. i .. ": " .. tostring(err.message))
      assert.equal(c[1], err.code, "case " .. i .. ": " .. tostring(err.message))
    end
    -- the enrolled identity is another address: refused
    s:query([[INSERT INTO signer_roster (network_class, signer_key, expected_signer_address, expected_set_by, expected_set_at)
              VALUES ($1, 'sa', $2, 'spec', now())]], class, DEV[2].address)
    local sig, err = ask(good)
    assert.is_nil(sig)
    assert.equal("SIGNER_IDENTITY_MISMATCH", err.code, tostring(err.message))
    -- enrolled as itself: the exact approved transaction is granted
    s:query("UPDATE signer_roster SET expected_signer_address = $2 WHERE network_class = $1 AND signer_key = 'sa'",
      class, from)
    sig, err = ask(good)
    assert.truthy(sig, err and err.message)
    assert.equal(from, sig.address)
    assert.equal(from, qtg.signer.recover(good.signing_hash, sig.signature))
    local granted_digest = engine.request(s, req.id).approval_digest
    -- the amount as a JSON number of the very value paid, the digests made
    -- to match (triggers bypassed): refused, the signer reads amounts from
    -- strings only (no approver's tool shows a large number exactly)
    s:transaction(function()
      s:query("SET LOCAL session_replication_role = replica")
      s:query([[UPDATE movement_requests SET intent = intent || '{"amount": 0.25}' WHERE id = $1::uuid]], req.id)
      s:query("UPDATE movement_requests r SET approval_digest = qtg_approval_digest(r) WHERE id = $1::uuid", req.id)
      s:query([[UPDATE request_approvals a SET approval_digest = r.approval_digest FROM movement_requests r
                 WHERE r.id = a.request_id AND r.id = $1::uuid]], req.id)
    end)
    sig, err = ask(good)
    assert.is_nil(sig)
    assert.equal("VALUE_MISMATCH", err.code, tostring(err.message))
    assert.truthy(err.message:find("the approved amount is not a plain decimal string", 1, true), err.message)
    -- the request's rows changed after approval (triggers bypassed, as a
    -- superuser could): the digest no longer matches
    s:transaction(function()
      s:query("SET LOCAL session_replication_role = replica")
      s:query([[UPDATE movement_requests SET intent = intent || '{"amount": "20"}' WHERE id = $1::uuid]], req.id)
    end)
    sig, err = ask(good)
    assert.is_nil(sig)
    assert.equal("APPROVAL_DIGEST_MISMATCH", err.code, tostring(err.message))
    -- a request nobody approved
    local pending = engine.create(s, "sign_t_a", { intent = intent(dest), callback_url = false })
    sig, err = ask(good, { request_id = pending.id })
    assert.is_nil(sig)
    assert.equal("REQUEST_NOT_APPROVED", err.code, tostring(err.message))
    -- every decision is in signer_events, the payload hash and digest with it
    local ev = events_of(req.id)
    assert.equal(#cases + 4, #ev)
    local granted = 0
    for _, e in ipairs(ev) do
      if e.decision == "granted" then
        granted = granted + 1
        assert.equal(good.signing_hash, e.payload_hash)
        assert.equal(granted_digest, e.approval_digest)
      else
        assert.truthy(e.reason ~= "" and e.code ~= "GRANTED")
      end
    end
    assert.equal(1, granted)
    assert.equal(1, #events_of(pending.id))
    assert.equal("REQUEST_NOT_APPROVED", events_of(pending.id)[1].code)
  end)

  it("signs only the planned destination and fee caps: changing the plan under a pending request is refused as qtg_runtime", function()
    start_local_signer("sa=" .. sup.key_file(dir, "sa", DEV[1].key))
    local key = "sign_t_seal_" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
    local pv = engine.load_doc(s, sup.template(key, "sa", { allowed_chain_ids = { CHAIN }, max_amount = "25" }))
      .plan_version_id
    local a, b = sup.random_address(), sup.random_address()
    local req = engine.create(s, key, { intent = intent(a), callback_url = false })
    assert.equal("PENDING_APPROVAL", req.request_state)
    -- the attack, as the daemon's role while the approvers have not looked
    -- yet: pay B instead of A, and raise the fee cap
    for _, c in ipairs({
      { "plan_nodes", [[UPDATE plan_nodes SET config = config || jsonb_build_object('destination', $2::text)
                         WHERE plan_version_id = $1 AND node_key = 'transfer']], b },
      { "plan_versions", [[UPDATE plan_versions SET risk_controls = risk_controls
                            || jsonb_build_object('max_fee_per_gas_wei', $2::text) WHERE id = $1]],
        tostring(MAX_FEE * 100) },
    }) do
      local ok, err = as_runtime(c[2], pv, c[3])
      assert.is_false(ok, "the runtime role changed " .. c[1] .. " under a pending request")
      assert.equal("55000", err.sqlstate, tostring(err.message))
      assert.equal(string.format("%s of plan version %s is sealed: request %s references it (UPDATE refused)",
        c[1], pv, req.id), err.message)
    end
    -- a real approval; the signer signs A at the template's caps, and nothing else
    local node = approved_transfer(req.id)
    local good = payload({ to = a, nonce = 1 })
    reserve(node.id, DEV[1].address, 1, good.signing_hash)
    local function ask(p) return ask_sa(req.id, node.id, p) end
    local sig, err = ask(payload({ to = b, nonce = 1 }))
    assert.is_nil(sig)
    assert.equal("DESTINATION_MISMATCH", err.code, tostring(err.message))
    sig, err = ask(payload({ to = a, nonce = 1, max_fee_per_gas = tostring(MAX_FEE * 100) }))
    assert.is_nil(sig)
    assert.equal("FEES_ABOVE_CAP", err.code, tostring(err.message))
    sig, err = ask(good)
    assert.truthy(sig, err and err.message)
    assert.equal(DEV[1].address, qtg.signer.recover(good.signing_hash, sig.signature))
    local codes = {}
    for _, e in ipairs(events_of(req.id)) do codes[#codes + 1] = e.code end
    assert.same({ "DESTINATION_MISMATCH", "FEES_ABOVE_CAP", "GRANTED" }, codes)
  end)

  -- What `qtgd approver sign KEY DOCUMENT PLAN` tells an approver is what
  -- this signer then does: a plan node whose config pays B while the
  -- intent names A is described as paying B (flagged), and the signer pays
  -- B and refuses A.
  it("pays what qtgd approver sign described to the approver: a node's own destination, not the intent's", function()
    start_local_signer("sa=" .. sup.key_file(dir, "sa", DEV[1].key))
    local key = "sign_t_own_" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
    local a, b = sup.random_address(), sup.random_address()
    local t = sup.template(key, "sa", { allowed_chain_ids = { CHAIN }, max_amount = "25" })
    t.nodes[1].config.destination = b
    engine.load_doc(s, t)
    local req = engine.create(s, key, { intent = intent(a), callback_url = false })
    local texts = s:query([[SELECT qtg_approval_document(r)::text AS document,
                                   qtg_approval_plan_document(r.plan_version_id)::text AS plan
                              FROM movement_requests r WHERE id = $1::uuid]], req.id)[1]
    local approver = sup.host.approver_key(dir, "own-" .. qtg.crypto.hex(qtg.crypto.random_bytes(4)))
    assert.truthy(sup.host.approver_sign(approver, common.statement(req.id, DEPLOYMENT), texts.document, texts.plan))
    local shown = common.read(approver .. ".statement.err")
    assert.truthy(shown:find(("  node transfer: pays %s ETH to %s on chain %d, signed with key sa\n"
      .. "    the node's own destination, not the intent's (%s)\n"):format(AMOUNT, b, CHAIN, a), 1, true), shown)
    assert.truthy(shown:find("  node destination_receive: evm_transfer / destination_chain_receive_observe: "
      .. "not signed by qtg's signer\n", 1, true), shown)
    local node = approved_transfer(req.id)
    local to_b = payload({ to = b, nonce = 980 })
    reserve(node.id, DEV[1].address, 980, to_b.signing_hash)
    local sig, err = ask_sa(req.id, node.id, payload({ to = a, nonce = 980 }))
    assert.is_nil(sig)
    assert.equal("DESTINATION_MISMATCH", err.code, tostring(err.message))
    sig, err = ask_sa(req.id, node.id, to_b)
    assert.truthy(sig, err and err.message)
  end)

  -- The approval policy never counts the initiator; the signer, which
  -- reads the vote rows the runtime role writes, does not either.
  it("counts no vote of the request's initiator", function()
    start_local_signer("sa=" .. sup.key_file(dir, "sa", DEV[1].key))
    local dest = sup.random_address()
    local req = engine.create(s, "sign_t_a", { intent = intent(dest), callback_url = false })
    engine.move_class(s, req.id, new_class())
    -- the initiator's own vote, a quorum of one, then APPROVED
    must_as_runtime([[UPDATE movement_requests r SET approval_digest = qtg_approval_digest(r),
                        approvals_required = 1 WHERE id = $1::uuid]], req.id)
    must_as_runtime([[INSERT INTO request_approvals (request_id, principal, decision, approval_digest)
                 SELECT id, created_by, 'approve', approval_digest FROM movement_requests
                  WHERE id = $1::uuid]], req.id)
    local node = approved_as_runtime(req.id)
    local p = payload({ to = dest, nonce = 930 })
    reserve(node.id, DEV[1].address, 930, p.signing_hash)
    local sig, err = qtg.signer.sign("sa", { request_id = req.id, request_node_id = node.id,
      attempt_no = 1, payload = p.payload, payload_hash = p.signing_hash })
    assert.is_nil(sig)
    assert.equal("APPROVALS_INCOMPLETE", err.code, tostring(err.message))
    assert.truthy(err.message:find("0 of 1", 1, true), err.message)
  end)

  it("refuses a request rewritten after approval: nothing is broadcast", function()
    local class = new_class()
    local a, b = sup.random_address(), sup.random_address()
    local req = sup.create(s, "sign_t_b", class, intent(a))
    -- the attack: 0.25 ETH to A becomes 20 ETH to B, the triggers bypassed
    s:transaction(function()
      s:query("SET LOCAL session_replication_role = replica")
      s:query([[UPDATE movement_requests SET intent = intent || jsonb_build_object('amount', '20', 'destination', $2::text)
                 WHERE id = $1::uuid]], req.id, b)
    end)
    local keys = "sb=" .. sup.key_file(dir, "sb", DEV[2].key)
    local n0 = sup.nonce(anvil.url, DEV[2].address)
    local h = sup.start_run(sup.run_env(class, { MG_SIGNER_KEYS = keys, MG_EVM_RPC_URLS = CHAIN .. "=" .. anvil.url }))
    sup.wait_states(s, { req.id }, { COMPLETED = true, FAILED = true, MANUAL_INTERVENTION = true }, 60, { h })
    local n = engine.nodes(s, req.id).transfer
    assert.equal("FAILED", n.node_state)
    assert.equal("SIGNING_REFUSED", n.error_code)
    assert.truthy(n.error_detail:match("^APPROVAL_DIGEST_MISMATCH"), n.error_detail)
    assert.equal("0", sup.balance(anvil.url, b))
    assert.equal("0", sup.balance(anvil.url, a))
    assert.equal(n0, sup.nonce(anvil.url, DEV[2].address))
    local ev = events_of(req.id)
    assert.equal(1, #ev)
    assert.equal("refused", ev[1].decision)
    assert.equal("APPROVAL_DIGEST_MISMATCH", ev[1].code)
    assert.truthy(sup.log_count(h, "signing refused") >= 1)
  end)

  it("moves the ETH once two enrolled persons signed; one signature where the enrolment asks two moves nothing", function()
    local class = new_class()
    local a, b = sup.random_address(), sup.random_address()
    local e = approvers({ { "alice", "console:spec-alice" }, { "bob", "console:spec-bob" } }, { [class] = 2 })
    local key, path = e.key, e.path
    local requests = require "qtg.requests"
    -- this process has no enrolment: its approvals stand for a runtime that
    -- moves a request to APPROVED on one signed vote (the policy asks one)
    local function approved(dest, voters)
      local req = engine.create(s, "sign_t_b", { intent = intent(dest), callback_url = false })
      -- voted here (this process's class), signed as of `class`, then moved there
      local st = s:query([[SELECT qtg_approval_statement(jsonb_populate_record(r, jsonb_build_object(
                             'network_class', $2::text)), $3) AS t FROM movement_requests r WHERE id = $1::uuid]],
        req.id, class, DEPLOYMENT)[1].t
      -- the first vote approves it (the policy asks one); later ones are rows beside it
      local r = requests.approve(s, req.id, "console:spec-" .. voters[1], nil,
        sup.host.approver_sign(key[voters[1]], st))
      assert.equal("APPROVED", r.request_state)
      for i = 2, #voters do
        s:query([[INSERT INTO request_approvals (request_id, principal, decision, approval_digest, signature)
                  SELECT id, $2, 'approve', approval_digest, $3 FROM movement_requests WHERE id = $1::uuid]],
          req.id, "console:spec-" .. voters[i], sup.host.approver_sign(key[voters[i]], st))
      end
      engine.move_class(s, req.id, class)
      assert.equal(st, statement(req.id))
      return req
    end
    local one = approved(a, { "alice" })
    local two = approved(b, { "alice", "bob" })
    local n0 = sup.nonce(anvil.url, DEV[2].address)
    local h = sup.start_run(sup.run_env(class, { MG_SIGNER_KEYS = "sb=" .. sup.key_file(dir, "sb", DEV[2].key),
      MG_EVM_RPC_URLS = CHAIN .. "=" .. anvil.url, MG_SIGNER_APPROVERS = path }))
    sup.wait_states(s, { one.id, two.id }, { COMPLETED = true, FAILED = true, MANUAL_INTERVENTION = true }, 90, { h })
    local n = engine.nodes(s, one.id).transfer
    assert.equal("FAILED", n.node_state)
    assert.equal("SIGNING_REFUSED", n.error_code)
    assert.truthy(n.error_detail:find("1 of 2 enrolled approvers", 1, true), n.error_detail)
    assert.equal("0", sup.balance(anvil.url, a))
    assert.equal("COMPLETED", sup.request(s, two.id).request_state)
    assert.equal(AMOUNT_WEI, sup.balance(anvil.url, b))
    assert.equal(n0 + 1, sup.nonce(anvil.url, DEV[2].address))
    assert.truthy((sup.host.read(h.signer.log) or ""):find("2 approvers enrolled", 1, true))
    os.execute("rm -rf " .. common.quote(e.dir))
  end)

  -- every readable mapping of pid, as one string per region (nil when a
  -- region cannot be read); returns whether needle occurs, and bytes read
  local function memory_holds(pid, needles)
    local maps = assert(io.open("/proc/" .. pid .. "/maps"))
    local mem = assert(io.open("/proc/" .. pid .. "/mem", "rb"))
    local found, scanned = {}, 0
    for line in maps:lines() do
      local lo, hi, perms = line:match("^(%x+)-(%x+) (%S+)")
      local path = line:match("%s(%S+)$") or ""
      local start, stop = tonumber(lo, 16), tonumber(hi, 16)
      -- (regions of 1 GiB and more are a sanitizer's shadow memory, not heap)
      if perms:sub(1, 1) == "r" and path ~= "[vvar]" and path ~= "[vsyscall]" and stop - start < 2 ^ 30 then
        local pos, tail = start, ""
        while pos < stop do
          local n = math.min(1048576, stop - pos)
          if not mem:seek("set", pos) then break end
          local chunk = mem:read(n)
          if not chunk then break end
          scanned = scanned + #chunk
          local text = tail .. chunk
          for i, nd in ipairs(needles) do
            if not found[i] and text:find(nd, 1, true) then found[i] = true end
          end
          tail = chunk:sub(-128)
          pos = pos + n
        end
      end
    end
    maps:close()
    mem:close()
    return found, scanned
  end

  it("keeps every key out of qtgd run's memory and environment (the signer holds them)", function()
    local class = new_class()
    local dest = sup.random_address()
    local keys = "sb=" .. sup.key_file(dir, "sb", DEV[2].key)
    local h = sup.start_run(sup.run_env(class, { MG_SIGNER_KEYS = keys, MG_EVM_RPC_URLS = CHAIN .. "=" .. anvil.url }))
    -- a transfer completes first: the daemon has used the key (through the signer)
    local req = sup.create(s, "sign_t_b", class, intent(dest))
    sup.wait_states(s, { req.id }, { COMPLETED = true, FAILED = true, MANUAL_INTERVENTION = true }, 60, { h })
    assert.equal("COMPLETED", engine.request(s, req.id).request_state, sup.detail(s, req.id))
    local hex = DEV[2].key
    local raw = qtg.crypto.unhex and qtg.crypto.unhex(hex) or (hex:gsub("%x%x", function(x) return string.char(tonumber(x, 16)) end))
    local needles = { raw, hex, hex:upper() }
    local env = assert(io.open("/proc/" .. h.pid .. "/environ", "rb")):read("*a")
    local found, scanned = memory_holds(h.pid, needles)
    assert.truthy(scanned > 1000000, "scanned " .. scanned .. " bytes")
    assert.is_nil(found[1], "the daemon's memory holds the key bytes")
    assert.is_nil(found[2], "the daemon's memory holds the key hex")
    assert.is_nil(found[3], "the daemon's memory holds the key hex (upper case)")
    assert.truthy(#env > 0)
    assert.is_nil(env:find(hex, 1, true))
    assert.is_nil(env:find(hex:upper(), 1, true))
    assert.is_nil(env:find("MG_SIGNER_KEYS", 1, true))
    -- the same scan finds the key in the signer's memory: it looks right
    local sfound = memory_holds(h.signer.pid, { raw })
    assert.truthy(sfound[1], "the scan does not find the key where it is")
  end)

  it("leaves the node READY while the signer is down (kill -9), and completes once it is back", function()
    local class = new_class()
    local dest = sup.random_address()
    local keys = "sb=" .. sup.key_file(dir, "sb", DEV[2].key)
    local env = sup.run_env(class, { MG_SIGNER_KEYS = keys, MG_EVM_RPC_URLS = CHAIN .. "=" .. anvil.url })
    local h = sup.start_run(env)
    sup.host.signal(h.signer, "KILL")
    assert.truthy(sup.host.wait_exit(h.signer, 30))
    local req = sup.create(s, "sign_t_b", class, intent(dest))
    assert.truthy(sup.wait_for(function() return sup.log_count(h, "signer_unavailable") >= 2 end, 30,
      "the dispatcher meeting the signer down"))
    local n = engine.nodes(s, req.id).transfer
    assert.equal("READY", n.node_state)
    assert.equal(0, n.attempt_no)
    assert.equal(0, #events_of(req.id))
    -- a signer again, on the same socket, with the same keys
    local senv = {}
    for k, v in pairs(env) do senv[k] = v end
    senv.MG_SIGNER_KEYS = keys
    start_signer(senv)
    sup.wait_states(s, { req.id }, { COMPLETED = true, FAILED = true, MANUAL_INTERVENTION = true }, 60, { h })
    assert.equal("COMPLETED", engine.request(s, req.id).request_state, sup.detail(s, req.id))
    assert.equal(AMOUNT_WEI, sup.balance(anvil.url, dest))
  end)

  it("answers only its allowed uid: nobody is refused even when the socket is open to all", function()
    local sockdir = dir .. "/open"
    os.execute("mkdir -p " .. common.quote(sockdir) .. " && chmod 755 " .. common.quote(dir) .. " "
      .. common.quote(sockdir))
    local keys = "sa=" .. sup.key_file(dir, "sa", DEV[1].key)
    local env = sup.run_env("unused", { MG_SIGNER_KEYS = keys, MG_SIGNER_SOCKET = sockdir .. "/signer.sock" })
    start_signer(env)
    local mode = io.popen("stat -c %a " .. common.quote(sockdir .. "/signer.sock")):read("*l")
    assert.equal("600", mode)
    local client = [[/usr/bin/python3 -c 'import socket,sys
c=socket.socket(socket.AF_UNIX)
try:
  c.connect(sys.argv[1])
except OSError as e:
  print("CONNECT", e.errno); sys.exit(0)
try:
  c.sendall(b"KEYS\n")
except OSError:
  pass   # the refusal may be written, and the socket closed, before the line is sent
print(c.makefile().readline().strip())' ]]
    local function as_nobody()
      local p = io.popen("setpriv --reuid=nobody --regid=nogroup --clear-groups " .. client
        .. common.quote(sockdir .. "/signer.sock") .. " 2>&1")
      local out = p:read("*a")
      p:close()
      return out
    end
    local out = as_nobody()
    assert.truthy(out:match("CONNECT 13"), "0600 keeps nobody out: " .. out)
    os.execute("chmod 666 " .. common.quote(sockdir .. "/signer.sock"))
    out = as_nobody()
    assert.truthy(out:match("^REFUSED PEER_NOT_ALLOWED uid 65534"), out)
    local ev = s:query("SELECT * FROM signer_events WHERE peer_uid = 65534 ORDER BY id DESC LIMIT 1")[1]
    assert.equal("PEER_NOT_ALLOWED", ev.code)
    os.execute("chmod 700 " .. common.quote(dir))
  end)

  -- The daemon's role writes the nodes and reservations the signer reads:
  -- a node moved READY -> FAILED -> READY, or a second node row for the
  -- same plan node, each with a fresh reservation, asks to sign the
  -- approved transfer again at another nonce (both would be mined).  The
  -- signer's own log says it signed this transfer at a nonce already.
  it("signs one approved transfer at one nonce: a replacement yes, a second nonce never", function()
    start_local_signer("sa=" .. sup.key_file(dir, "sa", DEV[1].key))
    local dest = sup.random_address()
    local req = sup.create(s, "sign_t_a", new_class(), intent(dest))
    local node = engine.nodes(s, req.id).transfer
    local from = DEV[1].address
    local function sign(node_id, attempt, p)
      return qtg.signer.sign("sa", { request_id = req.id, request_node_id = node_id,
        attempt_no = attempt, payload = p.payload, payload_hash = p.signing_hash })
    end
    local first = payload({ to = dest, nonce = 910 })
    reserve(node.id, from, 910, first.signing_hash)
    assert.truthy(sign(node.id, 1, first))
    -- a replacement at the same nonce (a lower fee): granted
    local again = payload({ to = dest, nonce = 910, max_fee_per_gas = tostring(MAX_FEE - 1) })
    assert.truthy(as_runtime([[UPDATE evm_nonce_reservation SET payload_hash = $2
                                WHERE request_node_id = $1::uuid AND nonce = 910]], node.id, again.signing_hash))
    assert.truthy(sign(node.id, 1, again))
    -- the node failed and made ready again, a new nonce reserved: refused
    assert.truthy(as_runtime([[UPDATE movement_request_nodes SET node_state = 'FAILED', attempt_no = 1
                                WHERE id = $1::uuid]], node.id))
    assert.truthy(as_runtime("UPDATE movement_request_nodes SET node_state = 'READY' WHERE id = $1::uuid", node.id))
    local second = payload({ to = dest, nonce = 911 })
    reserve(node.id, from, 911, second.signing_hash)
    local sig, err = sign(node.id, 2, second)
    assert.is_nil(sig)
    assert.equal("ALREADY_SIGNED_ELSEWHERE", err.code, tostring(err.message))
    assert.truthy(err.message:find("nonce 910", 1, true), err.message)
    -- a second node row for the same plan node: refused by the database
    -- (sql/0203: a node carries its plan node's key) and, written past it by
    -- the owner, by the signer; never signed
    local again_sql = [[
      INSERT INTO movement_request_nodes (request_id, plan_node_id, node_key, node_kind, action_type,
             executor, node_state)
      SELECT request_id, plan_node_id, 'transfer_again', node_kind, action_type, executor, 'READY'
        FROM movement_request_nodes WHERE id = $1::uuid RETURNING id]]
    local ok, refusal = as_runtime(again_sql, node.id)
    assert.is_false(ok, "a second node row for one plan node was inserted")
    assert.equal("55000", refusal.sqlstate, tostring(refusal.message))
    local rows = common.unfrozen(s, again_sql, node.id)
    local third = payload({ to = dest, nonce = 912 })
    reserve(rows[1].id, from, 912, third.signing_hash)
    sig, err = sign(rows[1].id, 1, third)
    assert.is_nil(sig)
    assert.equal("ALREADY_SIGNED_ELSEWHERE", err.code, tostring(err.message))
    local granted = s:query([[SELECT nonce FROM signer_events WHERE request_id = $1::uuid
                               AND decision = 'granted' ORDER BY id]], req.id)
    assert.same({ 910, 910 }, { granted[1].nonce, granted[2].nonce })
    assert.equal(2, #granted)
  end)

  -- The daemon's role writes the reservations the signer grants: it can
  -- have a transfer signed at a nonce the chain is far from, keep the
  -- bytes and drop its rows, and broadcast them once the sender's nonce
  -- gets there.  The signer grants at most MG_SIGNER_NONCE_AHEAD_MAX (64 by
  -- default) above the highest nonce its own log shows granted to the
  -- sender on the chain, from -1 for a sender it never granted there: a
  -- fresh key here.
  it("signs a transfer at most MG_SIGNER_NONCE_AHEAD_MAX above the sender's highest grant", function()
    local h = start_local_signer("sa=" .. sup.key_file(dir, "sa", sup.random_key()),
      { MG_SIGNER_NONCE_AHEAD_MAX = false })
    assert.truthy(sup.host.read(h.log):find('"nonce_ahead_max":"64"', 1, true), sup.host.read(h.log))
    local answer = qtg.signer.raw_call("ADDRESS sa")
    local from = answer:match("^OK (0x%x+)$")
    assert.truthy(from, answer)
    local dest = sup.random_address()
    -- a transfer of its own at nonce n: the signer's answer
    local function sign_at(n, over)
      local req = sup.create(s, "sign_t_a", new_class(), intent(dest))
      local node = engine.nodes(s, req.id).transfer
      local f = { to = dest, nonce = n }
      for k, v in pairs(over or {}) do f[k] = v end
      local p = payload(f)
      reserve(node.id, from, n, p.signing_hash)
      return ask_sa(req.id, node.id, p)
    end
    -- the sender's first grant on the chain: at most 63
    local sig, err = sign_at(64)
    assert.is_nil(sig)
    assert.equal("NONCE_TOO_FAR_AHEAD", err.code, tostring(err.message))
    assert.truthy(err.message:find("nonce 64 is more than 64 above the highest nonce this signer granted", 1, true)
      and err.message:find("(none)", 1, true), err.message)
    assert.truthy(sign_at(63))
    -- then at most 64 above the highest grant
    assert.truthy(sign_at(127))
    sig, err = sign_at(192)
    assert.is_nil(sig)
    assert.equal("NONCE_TOO_FAR_AHEAD", err.code, tostring(err.message))
    assert.truthy(err.message:find("(127)", 1, true), err.message)
    -- a nonce below the highest grant (another transfer's, a replacement):
    -- granted
    assert.truthy(sign_at(100))
    -- the daemon's role cannot raise the highest grant: signer_events is
    -- the signer's own, and the refusals at 64 and 192 do not count
    local ok, refusal = as_runtime([[INSERT INTO signer_events (decision, code, reason, signer_address,
                                      chain_id, nonce) VALUES ('granted', 'GRANTED', 'forged', $1, $2, 1000)]],
      from, CHAIN)
    assert.is_false(ok, "the daemon's role wrote a grant")
    assert.equal("42501", refusal.sqlstate, tostring(refusal.message))
    sig, err = sign_at(200)
    assert.is_nil(sig)
    assert.equal("NONCE_TOO_FAR_AHEAD", err.code, tostring(err.message))
    local rows = s:query([[SELECT decision, code, nonce FROM signer_events WHERE signer_address = $1
                            AND chain_id = $2 ORDER BY id]], from, CHAIN)
    local seen = {}
    for _, r in ipairs(rows) do seen[#seen + 1] = r.decision .. " " .. r.code .. " " .. r.nonce end
    assert.same({ "refused NONCE_TOO_FAR_AHEAD 64", "granted GRANTED 63", "granted GRANTED 127",
                  "refused NONCE_TOO_FAR_AHEAD 192", "granted GRANTED 100", "refused NONCE_TOO_FAR_AHEAD 200" }, seen)
    -- MG_SIGNER_NONCE_AHEAD_MAX=0: no bound, said at start
    sup.host.stop_all()
    h = start_local_signer("sa=" .. sup.key_file(dir, "sa", sup.random_key()), { MG_SIGNER_NONCE_AHEAD_MAX = "0" })
    assert.truthy(sup.host.read(h.log):find("MG_SIGNER_NONCE_AHEAD_MAX=0: a transfer is signed at a nonce any distance",
      1, true), sup.host.read(h.log))
    from = qtg.signer.raw_call("ADDRESS sa"):match("^OK (0x%x+)$")
    assert.truthy(sign_at(5000))
  end)

  -- Two signers share one database (a qtgd host each, docs/operations.md
  -- section 4).  The daemon's role holds evm_nonce_reservation locked while
  -- one SIGN for the same approved transfer goes to each, at two nonces
  -- reserved for its node: both wait on their reservation read, and go on
  -- together once the lock is let go.  Each decides the earlier-grant check
  -- and records its decision in one transaction under an advisory lock on
  -- the request and plan node: one is granted, the other then reads that
  -- grant and is refused.  Which of the two reads first is the scheduler's
  -- choice: each of three rounds (a request each) is a fresh interleaving.
  it("signs one approved transfer at one nonce across two signers released at once", function()
    local keys = "sa=" .. sup.key_file(dir, "sa", DEV[1].key)
    local socks = { dir .. "/race-a.sock", dir .. "/race-b.sock" }
    for _, sock in ipairs(socks) do
      start_signer(sup.run_env("unused", { MG_SIGNER_KEYS = keys, MG_SIGNER_SOCKET = sock }))
    end
    -- one client process per signer: it writes the answer to a file
    local script = dir .. "/race.py"
    sup.host.write(script, [[
import socket, sys
c = socket.socket(socket.AF_UNIX); c.settimeout(20); c.connect(sys.argv[1])
c.sendall(sys.argv[2].encode() + b"\n")
line = c.makefile().readline().strip() or "EOF"
with open(sys.argv[3], "w") as f:
    f.write(line + "\n")
]])
    local waiting = [[SELECT count(*)::int AS n FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                       WHERE NOT l.granted AND l.relation = 'public.evm_nonce_reservation'::regclass
                         AND a.application_name = 'qtgd signer' AND a.datname = current_database()]]
    -- the two SIGNs sent while the daemon's role holds the table, then let
    -- go once both signers wait: their answers
    local function released_at_once(lines, outs)
      local lk = qtg.db.acquire()
      local ok, err = pcall(function()
        lk:begin()
        lk:query("SET LOCAL ROLE qtg_runtime")
        lk:query("LOCK TABLE evm_nonce_reservation IN ACCESS EXCLUSIVE MODE")
        for i, sock in ipairs(socks) do
          os.execute(("/usr/bin/python3 %s %s %s %s >%s 2>&1 &"):format(common.quote(script), common.quote(sock),
            common.quote(lines[i]), common.quote(outs[i]), common.quote(outs[i] .. ".err")))
        end
        -- both waiting, the first well inside its 5 s statement timeout
        -- (the clients start together; how long they take to start is the
        -- machine's, and is not bounded here)
        local first
        common.wait_for(function()
          local n = s:query(waiting)[1].n
          first = first or (n > 0 and qtg.monotonic()) or nil
          if first and qtg.monotonic() - first > 4 then
            error("the first signer waited 4 s on the lock and the second never came", 0)
          end
          return n == 2, n
        end, 60, "both signers waiting on evm_nonce_reservation", 0.02)
      end)
      if lk:in_transaction() then lk:rollback() end
      lk:release()
      assert(ok, type(err) == "table" and err.message or tostring(err))
      local answers = {}
      for i, out in ipairs(outs) do
        answers[i] = common.wait_for(function() return (sup.host.read(out) or ""):match("[^\n]+") end, 30,
          function() return "the answer of signer " .. i .. " (" .. tostring(sup.host.read(out .. ".err")) .. ")" end)
      end
      return answers
    end
    for round = 1, 3 do
      local dest = sup.random_address()
      local req = sup.create(s, "sign_t_a", new_class(), intent(dest))
      local node = engine.nodes(s, req.id).transfer
      local lines, outs = {}, {}
      for i = 1, 2 do
        local nonce = 1200 + 2 * round + i
        local p = payload({ to = dest, nonce = nonce })
        reserve(node.id, DEV[1].address, nonce, p.signing_hash)
        lines[i] = ("SIGN %s %s 1 sa %s"):format(req.id, node.id, p.payload)
        outs[i] = ("%s/race-%d-%d.out"):format(dir, round, i)
      end
      local answers = released_at_once(lines, outs)
      local all = "round " .. round .. ": " .. table.concat(answers, " | ")
      local granted = s:query([[SELECT nonce FROM signer_events WHERE request_id = $1::uuid
                                 AND decision = 'granted' ORDER BY id]], req.id)
      assert.equal(1, #granted, "one approval granted at " .. #granted .. " nonces, " .. all)
      local refused = s:query([[SELECT code, reason FROM signer_events WHERE request_id = $1::uuid
                                 AND decision = 'refused']], req.id)
      assert.equal(1, #refused, all)
      assert.equal("ALREADY_SIGNED_ELSEWHERE", refused[1].code)
      assert.truthy(refused[1].reason:find("nonce " .. granted[1].nonce .. " ", 1, true), refused[1].reason)
      table.sort(answers)
      assert.truthy(answers[1]:match("^OK 0x%x+ " .. DEV[1].address), all)
      assert.truthy(answers[2]:match("^REFUSED ALREADY_SIGNED_ELSEWHERE signed before at nonce "
        .. granted[1].nonce .. " "), all)
    end
  end)

  -- Advisory locks are anyone's: the daemon's role can take the one-nonce
  -- lock of a transfer.  The signer then waits its statement timeout,
  -- answers that it cannot read the database, records nothing and keeps no
  -- transaction open; once the lock is let go it grants.
  it("waits at most its statement timeout on a one-nonce lock held elsewhere, then grants once it is free", function()
    start_local_signer("sa=" .. sup.key_file(dir, "sa", DEV[1].key))
    local dest = sup.random_address()
    local req = sup.create(s, "sign_t_a", new_class(), intent(dest))
    local node = engine.nodes(s, req.id).transfer
    local p = payload({ to = dest, nonce = 1230 })
    reserve(node.id, DEV[1].address, 1230, p.signing_hash)
    local function sign()
      return qtg.signer.sign("sa", { request_id = req.id, request_node_id = node.id, attempt_no = 1,
        payload = p.payload, payload_hash = p.signing_hash })
    end
    local lk = qtg.db.acquire()
    local ok, sig, err = pcall(function()
      lk:begin()
      lk:query("SET LOCAL ROLE qtg_runtime")
      lk:query([[SELECT pg_advisory_xact_lock(hashtextextended('qtg.signer.grant:' || $1::text || '/'
                   || plan_node_id::text, 0)) FROM movement_request_nodes WHERE id = $2::uuid]], req.id, node.id)
      return sign()
    end)
    if lk:in_transaction() then lk:rollback() end
    lk:release()
    assert(ok, type(sig) == "table" and sig.message or tostring(sig))
    assert.is_nil(sig)
    assert.equal("SIGNER_DB_UNAVAILABLE", err.code, tostring(err.message))
    assert.equal(0, #events_of(req.id))
    local open = s:query([[SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = 'qtgd signer'
                             AND datname = current_database() AND state LIKE 'idle in transaction%']])[1].n
    assert.equal(0, open)
    sig, err = sign()
    assert.truthy(sig, err and err.code .. ": " .. tostring(err.message))
    assert.equal("granted", events_of(req.id)[1].decision)
  end)

  -- A grant recorded before sql/0171 names no plan node and no nonce.  Its
  -- plan node is its node row's, and it stands for a nonce the signer did
  -- not record: the transfer is refused at any other transaction, and
  -- only that very one (its payload, from its sender) is granted again.
  it("counts a grant recorded before sql/0171 as signed at a nonce not recorded", function()
    start_local_signer("sa=" .. sup.key_file(dir, "sa", DEV[1].key))
    local dest = sup.random_address()
    local req = sup.create(s, "sign_t_a", new_class(), intent(dest))
    local node = engine.nodes(s, req.id).transfer
    local from = DEV[1].address
    local function sign(p)
      return qtg.signer.sign("sa", { request_id = req.id, request_node_id = node.id, attempt_no = 1,
        payload = p.payload, payload_hash = p.signing_hash })
    end
    local then_signed = payload({ to = dest, nonce = 1210 })
    -- the row as the signer wrote it then, inserted as the table's owner
    s:query([[INSERT INTO signer_events (decision, code, reason, request_id, request_node_id, attempt_no,
                signer_key, signer_address, approval_digest, payload_hash, peer_uid, peer_pid)
              SELECT 'granted', 'GRANTED', 'the payload is what request ' || id || ' approved', id,
                     $2::uuid, 1, 'sa', $3, approval_digest, $4, 0, 0
                FROM movement_requests WHERE id = $1::uuid]], req.id, node.id, from, then_signed.signing_hash)
    local other = payload({ to = dest, nonce = 1211 })
    reserve(node.id, from, 1211, other.signing_hash)
    local sig, err = sign(other)
    assert.is_nil(sig)
    assert.equal("ALREADY_SIGNED_ELSEWHERE", err.code, tostring(err.message))
    assert.truthy(err.message:find("signed before at a nonce not recorded", 1, true), err.message)
    reserve(node.id, from, 1210, then_signed.signing_hash)
    sig, err = sign(then_signed)
    assert.truthy(sig, err and err.code .. ": " .. tostring(err.message))
    assert.equal(from, qtg.signer.recover(then_signed.signing_hash, sig.signature))
    local codes = {}
    for _, e in ipairs(events_of(req.id)) do codes[#codes + 1] = e.code .. (type(e.nonce) == "number" and ("@" .. e.nonce) or "") end
    assert.same({ "GRANTED", "ALREADY_SIGNED_ELSEWHERE@1211", "GRANTED@1210" }, codes)
  end)

  -- The template check refuses an allowed_chain_ids that is not a list; one
  -- rewritten so past the seal (a bare chain id, here the approved one) is
  -- refused by the signer too, not read as no list at all.
  it("refuses a plan whose allowed_chain_ids is not an array", function()
    local key = "sign_t_shape_" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
    local pv = engine.load_doc(s, sup.template(key, "sa", { allowed_chain_ids = { CHAIN }, max_amount = "25" }))
      .plan_version_id
    start_local_signer("sa=" .. sup.key_file(dir, "sa", DEV[1].key))
    local dest = sup.random_address()
    local req = sup.create(s, key, new_class(), intent(dest))
    s:transaction(function()
      s:query("SET LOCAL session_replication_role = replica")
      s:query([[UPDATE plan_versions SET risk_controls = jsonb_set(risk_controls, '{allowed_chain_ids}',
                  to_jsonb($2::bigint)) WHERE id = $1]], pv, CHAIN)
    end)
    local node = engine.nodes(s, req.id).transfer
    local good = payload({ to = dest, nonce = 1220 })
    reserve(node.id, DEV[1].address, 1220, good.signing_hash)
    local sig, err = qtg.signer.sign("sa", { request_id = req.id, request_node_id = node.id, attempt_no = 1,
      payload = good.payload, payload_hash = good.signing_hash })
    assert.is_nil(sig)
    assert.equal("CHAIN_NOT_ALLOWED", err.code, tostring(err.message))
    assert.equal("the template's allowed_chain_ids is a JSON number, not an array", err.message)
  end)

  -- The signer reads a chain id, an allowed_chain_ids element and a fee
  -- cap one way only, the way qtgd approver sign describes them to the
  -- approvers (src/prelude/approver.lua): a hex or out-of-range chain id, a
  -- list element that is no JSON integer (one string "31412,1" allowed
  -- chain 1), a hex cap, each written past the daemon's checks, is refused.
  it("reads chain ids, allowed_chain_ids and fee caps as the approvers' reading does, and refuses any other spelling", function()
    start_local_signer("sa=" .. sup.key_file(dir, "sa", DEV[1].key))
    local cases = {
      { "plan_nodes", "config", "chain_id", string.format('"0x%x"', CHAIN), CHAIN, "CHAIN_MISMATCH",
        "the approved request names no valid chain_id (decimal digits from 1 to 2^53 - 1)" },
      { "plan_nodes", "config", "chain_id", '"0"', CHAIN, "CHAIN_MISMATCH",
        "the approved request names no valid chain_id (decimal digits from 1 to 2^53 - 1)" },
      { "plan_nodes", "config", "chain_id", "9007199254740993", CHAIN, "CHAIN_MISMATCH",
        "the approved request names no valid chain_id (decimal digits from 1 to 2^53 - 1)" },
      { "plan_nodes", "config", "chain_id", "1", 1, "CHAIN_NOT_ALLOWED",
        "the template's allowed_chain_ids holds (not a number), which is no chain id (a JSON integer from 1 to 2^53 - 1)",
        string.format('["%d,1"]', CHAIN) },
      { "plan_nodes", "config", "chain_id", tostring(CHAIN), CHAIN, "CHAIN_NOT_ALLOWED",
        "the template's allowed_chain_ids holds 1.5, which is no chain id (a JSON integer from 1 to 2^53 - 1)",
        string.format("[%d, 1.5]", CHAIN) },
      { "plan_versions", "risk_controls", "max_fee_per_gas_wei", string.format('"0x%x"', MAX_FEE * 100), CHAIN,
        "FEES_ABOVE_CAP", string.format("the template's max_fee_per_gas_wei is no decimal integer: 0x%x", MAX_FEE * 100) },
      -- leading zeros name the same chain, to the reading as here: signed
      { "plan_nodes", "config", "chain_id", string.format('"0%d"', CHAIN), CHAIN, nil },
    }
    for i, c in ipairs(cases) do
      local key = "sign_t_spell_" .. i .. "_" .. qtg.crypto.hex(qtg.crypto.random_bytes(3))
      local pv = engine.load_doc(s, sup.template(key, "sa", { allowed_chain_ids = { CHAIN }, max_amount = "25" }))
        .plan_version_id
      local dest = sup.random_address()
      local req = sup.create(s, key, new_class(), intent(dest))
      s:transaction(function()
        s:query("SET LOCAL session_replication_role = replica")
        local where = c[1] == "plan_nodes" and "plan_version_id = $1 AND node_key = 'transfer'" or "id = $1"
        s:query(string.format("UPDATE %s SET %s = jsonb_set(%s, '{%s}', $2::jsonb) WHERE %s",
          c[1], c[2], c[2], c[3], where), pv, c[4])
        if c[8] then
          s:query([[UPDATE plan_versions SET risk_controls = jsonb_set(risk_controls, '{allowed_chain_ids}', $2::jsonb)
                     WHERE id = $1]], pv, c[8])
        end
      end)
      local node = engine.nodes(s, req.id).transfer
      local p = payload({ to = dest, nonce = 1300 + i, chain_id = c[5] })
      s:query([[INSERT INTO evm_nonce_reservation (chain_id, address, nonce, request_node_id, payload_hash)
                VALUES ($1, $2, $3, $4::uuid, $5)]], c[5], DEV[1].address, 1300 + i, node.id, p.signing_hash)
      local sig, err = ask_sa(req.id, node.id, p)
      if c[6] then
        assert.is_nil(sig, c[4])
        assert.equal(c[6], err.code, c[4] .. ": " .. tostring(err.message))
        assert.equal(c[7], err.message)
      else
        assert.truthy(sig, c[4] .. ": " .. tostring(err and err.message))
      end
    end
  end)

  -- The daemon's role writes request_approvals; with MG_SIGNER_APPROVERS the
  -- signer counts only votes signed by enrolled persons (src/qtg_approvers.h).
  -- Everything a runtime-role writer can forge is tried here, as qtg_runtime.
  it("counts only approvals signed by enrolled persons, at least the enrolment's quorum", function()
    local keys = "sa=" .. sup.key_file(dir, "sa", DEV[1].key)
    local class = new_class()
    local dest = sup.random_address()
    -- a request and its twin (the same intent: the same approval digest)
    local req = engine.create(s, "sign_t_a", { intent = intent(dest), callback_url = false })
    engine.move_class(s, req.id, class)
    local twin = engine.create(s, "sign_t_a", { intent = intent(dest), callback_url = false })
    engine.move_class(s, twin.id, class)
    local st = statement(req.id)
    assert.not_equal(st, statement(twin.id))
    assert.equal(s:query("SELECT qtg_approval_digest(r) AS d FROM movement_requests r WHERE id = $1::uuid",
      req.id)[1].d, statement(twin.id):match("digest (%x+)"))
    -- mallory signs too, but is not enrolled
    local e = approvers({ { "alice", "operator:alice,api:alice-bot" },
                          { "bob", "operator:bob,api:bob-laptop,console:bob" },
                          { "ivan", engine.INITIATOR .. ",operator:ivan" } }, { [class] = 2 })
    local key, kd = e.key, e.dir
    key.mallory = sup.host.approver_key(kd, "mallory")
    local function enrol(quorum_class) return e.write({ [quorum_class] = 2 }) end
    -- the quorum row says 1; the enrolment says 2 for this class
    must_as_runtime([[UPDATE movement_requests r SET approval_digest = qtg_approval_digest(r),
                        approvals_required = 1 WHERE id = $1::uuid]], req.id)
    local function vote(principal, signature) signed_vote(req.id, principal, signature) end
    -- ghosts: votes of nobody enrolled, an enrolled principal without a signature
    vote("operator:ghost1")
    vote("operator:ghost2", sup.host.approver_sign(key.mallory, st))
    vote("operator:alice")
    local node = approved_as_runtime(req.id)
    local p = payload({ to = dest, nonce = 940 })
    reserve(node.id, DEV[1].address, 940, p.signing_hash)
    local function sign()
      return qtg.signer.sign("sa", { request_id = req.id, request_node_id = node.id,
        attempt_no = 1, payload = p.payload, payload_hash = p.signing_hash })
    end
    local function refused(code, text)
      local sig, err = sign()
      assert.is_nil(sig)
      assert.equal(code, err.code, tostring(err.message))
      if text then assert.truthy(err.message:find(text, 1, true), err.message) end
    end
    -- an enrolment without this class: nothing of it is signed
    local h = start_local_signer(keys, { MG_SIGNER_APPROVERS = enrol("mainnet") })
    refused("QUORUM_NOT_ENROLLED", class)
    sup.host.stop(h)
    h = start_local_signer(keys, { MG_SIGNER_APPROVERS = enrol(class) })
    refused("APPROVALS_INCOMPLETE", "0 of 2 enrolled approvers")
    -- alice signs (under her second principal); the initiator's person signs
    -- under another principal of his; bob's signature of the twin; a forged one
    vote("api:alice-bot", sup.host.approver_sign(key.alice, st))
    vote("operator:ivan", sup.host.approver_sign(key.ivan, st))
    vote("api:bob-laptop", sup.host.approver_sign(key.bob, statement(twin.id)))
    vote("operator:carol", string.rep("ab", 64))
    -- bob's signature of this very request as another deployment's (one key,
    -- two deployments: copied from the other, with the request's id)
    vote("console:bob", sup.host.approver_sign(key.bob, statement(req.id, "other-desk")))
    refused("APPROVALS_INCOMPLETE", "1 of 2 enrolled approvers")
    -- bob's own signature of this request: the quorum of two distinct persons
    vote("operator:bob", sup.host.approver_sign(key.bob, st))
    assert.truthy(sign())
    -- bob is revoked: the file without him, and a reload (SIGHUP), not a
    -- restart; his signature stops counting at once
    local function reload(path)
      local before = sup.log_count(h, "signer: reload")
      assert.is_true(common.signal(h, "HUP"))
      common.wait_for(function() return sup.log_count(h, "signer: reload") > before end, 30, "the signer's reload")
      return path
    end
    reload(e.write({ [class] = 2 }, "bob"))
    refused("APPROVALS_INCOMPLETE", "1 of 2 enrolled approvers")
    -- a file it cannot take at a reload: nothing is signed (not the last
    -- good enrolment, which may count the person being revoked)
    sup.host.write(e.path, "person bob\n")
    reload()
    refused("APPROVERS_UNREADABLE", "could not be read at the last reload")
    assert.equal(1, sup.log_count(h, "nothing is signed until the file is fixed"))
    local how, herr = qtg.signer.approvals()   -- what /readyz asks: it says so too
    assert.is_nil(how)
    assert.equal("APPROVERS_UNREADABLE", herr.code)
    reload(e.write({ [class] = 2 }))
    assert.truthy(sign())
    assert.same({ mode = "enrolled", deployment = DEPLOYMENT, digest = qtg.crypto.sha256_hex(sup.host.read(e.path)) },
      qtg.signer.approvals())
    -- a file that asks fewer for other classes while this signer's keys sign
    -- for every class: a request moved to such a class would get the same
    -- key for fewer approvals; the reload fails closed, and mending it signs
    reload(e.write({ [class] = 2, ["*"] = 1 }))
    refused("APPROVERS_UNREADABLE", "could not be read at the last reload")
    assert.equal(1, sup.log_count(h, "but 1 for *, and with MG_SIGNER_KEY_CLASSES unset"))
    reload(e.write({ [class] = 2, ["*"] = 2 }))
    assert.truthy(sign())
    -- an enrolment group or others may write, or one it cannot read: the signer does not start
    for _, bad in ipairs({ "chmod 666", "printf 'person x\\n' >" }) do
      local path = enrol(class)
      os.execute(bad .. " " .. common.quote(path))
      local b = sup.host.start(sup.run_env("unused", { MG_SIGNER_KEYS = keys,
        MG_SIGNER_SOCKET = dir .. "/unused.sock", MG_SIGNER_APPROVERS = path }), { "signer" })
      assert.equal(1, sup.host.wait_exit(b, 30), bad)
      assert.truthy((sup.host.read(b.log) or ""):find("MG_SIGNER_APPROVERS", 1, true), bad)
    end
    -- a quorum of 1 starts, with a warning that the initiator is not in the
    -- statement (an enrolled approver writing the rows approves alone)
    local one = sup.host.start(sup.run_env("unused", { MG_SIGNER_KEYS = keys,
      MG_SIGNER_SOCKET = dir .. "/one.sock", MG_SIGNER_KEY_CLASSES = "sa=" .. class,
      MG_SIGNER_APPROVERS = e.write({ ["*"] = 1, [class] = 2 }) }), { "signer" })
    common.wait_for(function() return sup.log_count(one, "gives quorum 1 to *") == 1 end, 30,
      "the signer's warning about quorum 1")
    sup.host.stop(one)
    assert.equal(0, sup.log_count(h, "gives quorum 1"))
    os.execute("rm -rf " .. common.quote(kd))
  end)

  -- A revocation waited behind every line already queued: the runtime held
  -- a table lock so that each decision waited out the signer's statement
  -- timeout, and the lines decided after the reload was asked for still
  -- counted the revoked person.  It applies from the next decision now.
  it("applies a revocation from the next decision, though lines wait behind a lock the runtime holds", function()
    local class = new_class()
    local dest = sup.random_address()
    local req = engine.create(s, "sign_t_a", { intent = intent(dest), callback_url = false })
    engine.move_class(s, req.id, class)
    local e = approvers({ { "alice" }, { "bob" } }, { [class] = 2 })
    must_as_runtime([[UPDATE movement_requests r SET approval_digest = qtg_approval_digest(r)
                        WHERE id = $1::uuid]], req.id)
    local st = statement(req.id)
    signed_vote(req.id, "operator:alice", sup.host.approver_sign(e.key.alice, st))
    signed_vote(req.id, "operator:bob", sup.host.approver_sign(e.key.bob, st))
    local node = approved_as_runtime(req.id)
    local p = payload({ to = dest, nonce = 960 })
    reserve(node.id, DEV[1].address, 960, p.signing_hash)
    local h = start_local_signer("sa=" .. sup.key_file(dir, "sa", DEV[1].key), { MG_SIGNER_APPROVERS = e.path })
    -- the runtime holds movement_requests: the first decision waits on it
    local holder = qtg.db.acquire()
    holder:begin()
    holder:query("SET LOCAL ROLE qtg_runtime")
    holder:query("LOCK TABLE movement_requests IN ACCESS EXCLUSIVE MODE")
    local line = ("SIGN %s %s 1 sa %s"):format(req.id, node.id, p.payload)
    local out = dir .. "/queued.out"
    common.background(([[/usr/bin/python3 -c 'import socket,sys,time
cs=[]
for line in sys.argv[2:]:
  c=socket.socket(socket.AF_UNIX); c.settimeout(60); c.connect(sys.argv[1]); cs.append(c)
for c, line in zip(cs, sys.argv[2:]): c.sendall(line.encode()+b"\n")
for c in cs: print(c.makefile().readline().strip()[:60], flush=True)' %s %s %s]]):format(
      common.quote(qtg.signer.socket_path()), common.quote(line), common.quote(line)), out)
    local ok, err = pcall(function()
      -- the first line is being decided (waiting on the lock; the signer's
      -- statement timeout is 5 s), the second waits behind it
      common.wait_for(function() return common.waiting_on(holder:pid(), "qtgd signer") > 0 end, 30,
        "the signer to wait on the lock")
      -- bob is revoked while both lines wait: the file without him, and a reload
      e.write({ [class] = 2 }, "bob")
      assert.is_true(common.signal(h, "HUP"))
      qtg.sleep(0.5)
    end)
    holder:rollback()
    holder:release()
    assert(ok, err)
    common.wait_for(function() return select(2, (sup.host.read(out) or ""):gsub("\n", "")) >= 2 end, 30,
      "both answers")
    local answers = {}
    for l in sup.host.read(out):gmatch("[^\n]+") do answers[#answers + 1] = l end
    -- the line being decided when the reload was asked for ends on the old
    -- enrolment; the next one is decided on the new
    assert.matches("^OK ", answers[1])
    assert.matches("^REFUSED APPROVALS_INCOMPLETE", answers[2])
    assert.equal(1, sup.log_count(h, "signer: reload: the enrolment was read again"))
    sup.host.stop(h)
    os.execute("rm -rf " .. common.quote(e.dir))
  end)

  -- Amount tiers (`quorum CLASS N above AMOUNT ASSET`) are the signer's
  -- own: approvals_required is a row the daemon's role writes, so a
  -- policy that asks 3 above 1 ETH binds a compromised daemon only when
  -- the enrolment says it too.  Each request here is forged as qtg_runtime
  -- down to approvals_required = 1, then APPROVED with signed votes.
  it("asks a tier's count above its amount itself, whatever approvals_required says", function()
    local keys = "sa=" .. sup.key_file(dir, "sa", DEV[1].key)
    local class = new_class()
    local more = { ("quorum %s 3 above 1 ETH"):format(class) }
    local e = approvers({ { "alice" }, { "bob" }, { "carol" } }, { [class] = 1 }, more)
    local key = e.key
    local nonce = 1100
    -- a request of `amount` ETH (its intent's amount then rewritten to
    -- `written`, when given), forged down to one approval, with the signed
    -- votes of `voters`, APPROVED; the request, its sign() and vote(who)
    local function forged(amount, voters, written, template)
      local dest = sup.random_address()
      local req = engine.create(s, template or "sign_t_a", { intent = intent(dest, amount), callback_url = false })
      engine.move_class(s, req.id, class)
      if written then
        common.unfrozen(s, string.format([[UPDATE movement_requests SET intent = jsonb_set(intent, '{amount}',
                              to_jsonb($2::%s)) WHERE id = $1::uuid]], type(written) == "number" and "numeric" or "text"),
          req.id, written)
      end
      must_as_runtime([[UPDATE movement_requests r SET approval_digest = qtg_approval_digest(r),
                          approvals_required = 1 WHERE id = $1::uuid]], req.id)
      assert.equal(1, engine.request(s, req.id).approvals_required)
      local st = statement(req.id)
      local function vote(who) signed_vote(req.id, "operator:" .. who, sup.host.approver_sign(key[who], st)) end
      for _, who in ipairs(voters) do vote(who) end
      local node = approved_as_runtime(req.id)
      nonce = nonce + 1
      local wei = s:query("SELECT ($1::numeric * 1000000000000000000)::numeric(78,0)::text AS w",
        written or amount)[1].w
      local p = payload({ to = dest, nonce = nonce, value = wei })
      reserve(node.id, DEV[1].address, nonce, p.signing_hash)
      return req, function()
        return qtg.signer.sign("sa", { request_id = req.id, request_node_id = node.id,
          attempt_no = 1, payload = p.payload, payload_hash = p.signing_hash })
      end, vote
    end
    local function refused(sign, code, text)
      local sig, err = sign()
      assert.is_nil(sig, code)
      assert.equal(code, err.code, tostring(err.message))
      assert.truthy(err.message:find(text, 1, true), err.message)
    end
    local function last_event(req)
      local ev = events_of(req.id)
      return ev[#ev]
    end
    -- unbound keys: a tier of one class that no other class matches would
    -- hold for nothing (the daemon names the class); refused at start
    local star = approvers({ { "alice" } }, { ["*"] = 1 }, more)
    local refused_start = sup.host.start(sup.run_env("unused", { MG_SIGNER_KEYS = keys,
      MG_SIGNER_SOCKET = dir .. "/tier-unbound.sock", MG_SIGNER_APPROVERS = star.path }), { "signer" })
    assert.equal(1, sup.host.wait_exit(refused_start, 30))
    local log = sup.host.read(refused_start.log) or ""
    assert.truthy(log:find("asks 3 approvals for more than 1 ETH on " .. class, 1, true), log)
    os.execute("rm -rf " .. common.quote(star.dir))
    local h = start_local_signer(keys, { MG_SIGNER_APPROVERS = e.path })
    -- 2 ETH, two signatures: the tier's 3, not the row's 1
    local big, sign_big, vote_big = forged("2", { "alice", "bob" })
    local rule = "quorum 3 for more than 1 ETH on " .. class
    refused(sign_big, "APPROVALS_INCOMPLETE", "2 of 3 enrolled approvers")
    local ev = last_event(big)
    assert.same({ "refused", "APPROVALS_INCOMPLETE" }, { ev.decision, ev.code })
    assert.truthy(ev.reason:find(rule, 1, true), ev.reason)
    -- the third signature: signed
    vote_big("carol")
    local sig, err = sign_big()
    assert.truthy(sig, err and err.message)
    assert.same({ "granted", "GRANTED" }, { last_event(big).decision, last_event(big).code })
    -- 0.5 ETH and exactly 1 ETH (not above it): the base quorum, one signature
    for _, amount in ipairs({ "0.5", "1", "1.000000000000000000" }) do
      local req, sign = forged(amount, { "alice" })
      sig, err = sign()
      assert.truthy(sig, amount .. ": " .. tostring(err and err.message))
      assert.equal("granted", last_event(req).decision)
    end
    -- one wei above 1 ETH: the tier
    local edge, sign_edge = forged("1.000000000000000001", { "alice", "bob" })
    refused(sign_edge, "APPROVALS_INCOMPLETE", "2 of 3 enrolled approvers")
    assert.equal("refused", last_event(edge).decision)
    -- a plan that pays 0.6 ETH twice moves 1.2: the tier's count, though
    -- the intent's amount is under it (and 0.5 twice is not above 1)
    local twice, sign_twice, vote_twice = forged("0.6", { "alice", "bob" }, nil, "sign_t_twice")
    refused(sign_twice, "APPROVALS_INCOMPLETE", "2 of 3 enrolled approvers")
    assert.truthy(last_event(twice).reason:find(rule .. " (the plan pays 0.6 ETH 2 times)", 1, true),
      last_event(twice).reason)
    vote_twice("carol")
    sig, err = sign_twice()
    assert.truthy(sig, err and err.message)
    local half, sign_half = forged("0.5", { "alice" }, nil, "sign_t_twice")
    sig, err = sign_half()
    assert.truthy(sig, err and err.message)
    assert.equal("granted", last_event(half).decision)
    -- an amount the tier cannot be compared with: refused, whatever signed
    local odd, sign_odd = forged("2", { "alice", "bob", "carol" }, "2e0")
    refused(sign_odd, "APPROVALS_INCOMPLETE", "not a plain decimal")
    assert.truthy(last_event(odd).reason:find(rule, 1, true), last_event(odd).reason)
    -- an amount written as a JSON number (the daemon writes strings): read
    -- from strings only, so it is no amount the tier can judge either
    local num, sign_num = forged("2", { "alice", "bob", "carol" }, 2)
    refused(sign_num, "APPROVALS_INCOMPLETE", "the request's amount is not a plain decimal string")
    assert.equal("refused", last_event(num).decision)
    -- the template's max_amount (25) binds the signer too: an intent
    -- rewritten past it before the approvals (the daemon's own check is
    -- the runtime's) is refused, whatever signed; 25 itself is signed
    local capped, sign_capped = forged("20", { "alice", "bob", "carol" }, "25.000000000000000001")
    refused(sign_capped, "AMOUNT_ABOVE_CAP", "exceeds the template's max_amount 25")
    assert.equal("refused", last_event(capped).decision)
    local at_cap, sign_at_cap = forged("20", { "alice", "bob", "carol" }, "25")
    sig, err = sign_at_cap()
    assert.truthy(sig, err and err.message)
    assert.equal("granted", last_event(at_cap).decision)
    -- a tier for another asset leaves ETH alone (a reload, not a restart)
    more[1] = ("quorum %s 3 above 1 USDC"):format(class)
    local before = sup.log_count(h, "signer: reload")
    e.write({ [class] = 1 })
    assert.is_true(common.signal(h, "HUP"))
    common.wait_for(function() return sup.log_count(h, "signer: reload") > before end, 30, "the signer's reload")
    assert.equal(0, sup.log_count(h, "nothing is signed until"))
    local other, sign_other = forged("2", { "alice" })
    sig, err = sign_other()
    assert.truthy(sig, err and err.message)
    assert.equal("granted", last_event(other).decision)
    os.execute("rm -rf " .. common.quote(e.dir))
  end)

  -- The daemon asks the same count of the same file (qtg.approvers:
  -- quorum_for, the signer's C function): a request above a tier is not
  -- APPROVED before the signer would sign it.
  it("keeps a request above a tier PENDING_APPROVAL until the tier's count of signed votes", function()
    local requests = require "qtg.requests"
    local class = qtg.settings.network_class
    local e = approvers({ { "alice", "console:spec-tier-alice" }, { "bob", "console:spec-tier-bob" },
                          { "carol", "console:spec-tier-carol" } }, { [class] = 1 },
                        { ("quorum %s 3 above 1 eth"):format(class) })
    local old = qtg.settings.signer_approvers
    rawset(qtg.settings, "signer_approvers", e.path)
    local ok, why = pcall(function()
      local function approve(req, who)
        return requests.approve(s, req.id, "console:spec-tier-" .. who, nil,
          sup.host.approver_sign(e.key[who], statement(req.id)))
      end
      local big = engine.create(s, "sign_t_a", { intent = intent(sup.random_address(), "2"), callback_url = false })
      assert.equal(3, big.approvals_required)    -- the policy asks 1; the tier 3
      assert.equal("PENDING_APPROVAL", approve(big, "alice").request_state)
      assert.equal("PENDING_APPROVAL", approve(big, "bob").request_state)
      assert.equal(1, requests.approval_status(s, big.id).still_needed)
      assert.equal("APPROVED", approve(big, "carol").request_state)
      -- at the tier's amount, and of another asset: the base quorum
      local small = engine.create(s, "sign_t_a", { intent = intent(sup.random_address(), "1"), callback_url = false })
      assert.equal(1, small.approvals_required)
      -- 0.6 ETH paid twice by the plan: the tier, as the signer counts it
      local twice = engine.create(s, "sign_t_twice", { intent = intent(sup.random_address(), "0.6"),
                                                       callback_url = false })
      assert.equal(3, twice.approvals_required)
      assert.equal("PENDING_APPROVAL", approve(twice, "alice").request_state)
      assert.equal("PENDING_APPROVAL", approve(twice, "bob").request_state)
      assert.equal("APPROVED", approve(twice, "carol").request_state)
      assert.equal(1, engine.create(s, "sign_t_twice", { intent = intent(sup.random_address(), "0.5"),
                                                         callback_url = false }).approvals_required)
      assert.equal("APPROVED", approve(small, "alice").request_state)
      local usdc = intent(sup.random_address(), "2")
      usdc.asset = "USDC"
      local other = engine.create(s, "sign_t_a", { intent = usdc, callback_url = false })
      assert.equal(1, other.approvals_required)
      -- a row forged down to 1 while it waits: the next vote asks the tier again
      local again = engine.create(s, "sign_t_a", { intent = intent(sup.random_address(), "5"), callback_url = false })
      must_as_runtime("UPDATE movement_requests SET approvals_required = 1 WHERE id = $1::uuid", again.id)
      local r = approve(again, "alice")
      assert.same({ "PENDING_APPROVAL", 3 }, { r.request_state, r.approvals_required })
    end)
    rawset(qtg.settings, "signer_approvers", old)
    os.execute("rm -rf " .. common.quote(e.dir))
    assert(ok, why)
  end)

  -- What a plan node does is in the plan digest the approvers signed (its
  -- kind, action, executor and config); a request node row is the
  -- runtime's, and one can be inserted for any plan node.  A plan node the
  -- approvers signed as a manual step is not signed as a transfer because a
  -- node row inserted for it says evm_transfer.
  it("signs a transfer only for a plan node the approvers signed as one, whatever a node row says", function()
    local keys = "sa=" .. sup.key_file(dir, "sa", DEV[1].key)
    local class = new_class()
    local a, b = sup.random_address(), sup.random_address()
    -- the plan: the transfer to the intent's destination, and a manual step
    -- (the runtime wrote b and key sa into its config before any request
    -- used the version; the approvers read it as a note on a manual step)
    local tkey = "sign_t_decoy_" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
    local doc = sup.template(tkey, "sa", { allowed_chain_ids = { CHAIN }, max_amount = "25" })
    doc.nodes[#doc.nodes + 1] = { key = "payout", kind = "manual", action_type = "manual_confirmation",
      executor = "manual", config = { instructions = "the vendor is paid by hand" } }
    local pv = engine.load_doc(s, doc).plan_version_id
    must_as_runtime([[UPDATE plan_nodes SET config = config || jsonb_build_object('signer_key', 'sa',
                   'destination', $2::text) WHERE plan_version_id = $1 AND node_key = 'payout']], pv, b)
    local req = engine.create(s, tkey, { intent = intent(a), callback_url = false })
    engine.move_class(s, req.id, class)
    local st = statement(req.id)
    -- two enrolled persons sign it: a quorum
    local e = approvers({ { "alice" }, { "bob" } }, { [class] = 2 })
    local key, kd, path = e.key, e.dir, e.path
    must_as_runtime([[UPDATE movement_requests r SET approval_digest = qtg_approval_digest(r) WHERE id = $1::uuid]],
      req.id)
    for _, name in ipairs({ "alice", "bob" }) do
      signed_vote(req.id, "operator:" .. name, sup.host.approver_sign(key[name], st))
    end
    must_as_runtime("UPDATE movement_requests SET request_state = 'APPROVED' WHERE id = $1::uuid", req.id)
    start_local_signer(keys, { MG_SIGNER_APPROVERS = path })
    local function sign(node_id, p)
      return qtg.signer.sign("sa", { request_id = req.id, request_node_id = node_id, attempt_no = 1,
        payload = p.payload, payload_hash = p.signing_hash })
    end
    -- the transfer they approved is signed
    local node = engine.nodes(s, req.id).transfer
    if node.node_state ~= "READY" then
      must_as_runtime("UPDATE movement_request_nodes SET node_state = 'READY' WHERE id = $1::uuid", node.id)
    end
    local good = payload({ to = a, nonce = 950 })
    reserve(node.id, DEV[1].address, 950, good.signing_hash)
    local sig, err = sign(node.id, good)
    assert.truthy(sig, err and err.message)
    -- a node row for the manual step that says evm_transfer: refused by the
    -- database (sql/0203) and, written past it by the owner, by the signer
    local decoy_sql = [[
      INSERT INTO movement_request_nodes (request_id, plan_node_id, node_key, node_kind, action_type,
             executor, node_state)
      SELECT request_id, plan_node_id, 'payout_now', 'action', 'evm_transfer', 'evm_transfer', 'READY'
        FROM movement_request_nodes WHERE request_id = $1::uuid AND node_key = 'payout' RETURNING id]]
    local inserted, refusal = as_runtime(decoy_sql, req.id)
    assert.is_false(inserted, "a node row unlike its plan node was inserted")
    assert.equal("55000", refusal.sqlstate, tostring(refusal.message))
    local decoy = common.unfrozen(s, decoy_sql, req.id)[1].id
    local bad = payload({ to = b, nonce = 951 })
    reserve(decoy, DEV[1].address, 951, bad.signing_hash)
    sig, err = sign(decoy, bad)
    assert.is_nil(sig, "a transfer to b was signed for the manual step the approvers signed")
    assert.equal("EXECUTOR_NOT_SIGNABLE", err.code, tostring(err.message))
    os.execute("rm -rf " .. common.quote(kd))
  end)

  -- The plan's order binds the signer: a transfer is signed only once every
  -- step right before it (the plan's edges, sealed with it) is COMPLETED or
  -- SKIPPED, as the engine readies a node.  The runtime writes node states:
  -- an adversarial review (session 32) made a transfer READY past an
  -- unfinished manual gate and had it signed and paid.
  it("signs a transfer only once the steps right before it in its plan are done", function()
    start_local_signer("sa=" .. sup.key_file(dir, "sa", DEV[1].key))
    local tkey = "sign_t_gated_" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
    local doc = sup.template(tkey, "sa", { allowed_chain_ids = { CHAIN }, max_amount = "25" })
    table.insert(doc.nodes, 1, { key = "gate", kind = "manual", action_type = "manual_confirmation",
      executor = "manual", config = { instructions = "the treasurer confirms the beneficiary" } })
    doc.edges[#doc.edges + 1] = { from = "gate", to = "transfer" }
    engine.load_doc(s, doc)
    local dest = sup.random_address()
    local req = sup.create(s, tkey, new_class(), intent(dest))
    local nodes = engine.nodes(s, req.id)
    assert.same({ "READY", "BLOCKED" }, { nodes.gate.node_state, nodes.transfer.node_state })
    -- the runtime makes the transfer READY past the gate, and the request
    -- EXECUTING (the engine has it WAITING_MANUAL_ACTION on the gate)
    must_as_runtime("UPDATE movement_request_nodes SET node_state = 'READY' WHERE id = $1::uuid", nodes.transfer.id)
    must_as_runtime("UPDATE movement_requests SET request_state = 'EXECUTING' WHERE id = $1::uuid", req.id)
    local p = payload({ to = dest, nonce = 975 })
    reserve(nodes.transfer.id, DEV[1].address, 975, p.signing_hash)
    local sig, err = ask_sa(req.id, nodes.transfer.id, p)
    assert.is_nil(sig, "a transfer was signed ahead of the manual gate before it")
    assert.equal("STEPS_BEFORE_NOT_DONE", err.code, tostring(err.message))
    assert.matches("not COMPLETED or SKIPPED: gate READY", err.message, 1, true)
    local ev = events_of(req.id)
    assert.equal("STEPS_BEFORE_NOT_DONE", ev[#ev].code)
    -- the gate done: the same transfer is signed
    must_as_runtime("UPDATE movement_request_nodes SET node_state = 'COMPLETED' WHERE id = $1::uuid", nodes.gate.id)
    sig, err = ask_sa(req.id, nodes.transfer.id, p)
    assert.truthy(sig, err and err.message)
  end)

  -- The plan document approvers sign names the steps right before each
  -- node ("after", sql/0205), so the statement's plan line covers the
  -- order.  Before, two plans that differed only by a manual gate before
  -- the transfer had the same document and the same plan line: approvers
  -- could neither see nor sign whether the gate came first.
  it("has approvers sign the plan's order: a signature of the plan without it counts for nothing", function()
    local function template(gated)
      local tkey = "sign_t_order_" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
      local doc = sup.template(tkey, "sa", { allowed_chain_ids = { CHAIN }, max_amount = "25" })
      table.insert(doc.nodes, 1, { key = "gate", kind = "manual", action_type = "manual_confirmation",
        executor = "manual", config = { instructions = "the treasurer confirms the beneficiary" } })
      if gated then doc.edges[#doc.edges + 1] = { from = "gate", to = "transfer" } end
      engine.load_doc(s, doc)
      return tkey
    end
    local class, dest = new_class(), sup.random_address()
    local gated = sup.create(s, template(true), class, intent(dest))
    local open = sup.create(s, template(false), class, intent(dest))
    -- each plan's document, and the digest of the same document without
    -- the order (the plan line before sql/0205)
    local function plan(id)
      local row = s:query([[
        SELECT q.d::text AS text,
               encode(sha256(convert_to(jsonb_build_object('risk_controls', q.d->'risk_controls', 'nodes',
                 (SELECT jsonb_agg(x.n - 'after' ORDER BY x.i)
                    FROM jsonb_array_elements(q.d->'nodes') WITH ORDINALITY x (n, i)))::text, 'UTF8')),
                 'hex') AS unordered,
               qtg_approval_document(r)::text AS document
          FROM movement_requests r, LATERAL (SELECT qtg_approval_plan_document(r.plan_version_id) AS d) q
         WHERE r.id = $1::uuid]], id)[1]
      local after = {}
      for _, n in ipairs(cjson.decode(row.text).nodes) do after[n.node_key] = table.concat(n.after, ",") end
      row.after = after
      return row
    end
    local g, o = plan(gated.id), plan(open.id)
    assert.same({ gate = "", transfer = "gate", destination_receive = "transfer",
                  destination_finality = "destination_receive" }, g.after)
    assert.same({ gate = "", transfer = "", destination_receive = "transfer",
                  destination_finality = "destination_receive" }, o.after)
    assert.equal(g.unordered, o.unordered)       -- what approvers signed before: the same for both
    local st = statement(gated.id)
    local line = st:match("\nplan (%x+)\n")
    assert.not_equal(line, statement(open.id):match("\nplan (%x+)\n"))
    assert.not_equal(g.unordered, line)
    -- the approver's tool shows the order it signs
    local e = approvers({ { "alice", "operator:alice,api:alice" }, { "bob", "operator:bob,api:bob" } },
      { [class] = 2 })
    assert.truthy(sup.host.approver_sign(e.key.alice, st, g.document, g.text))
    local shown = common.read(e.key.alice .. ".statement.err")
    assert.truthy(shown:find(("  node transfer: pays %s ETH to %s on chain %d, signed with key sa\n"
      .. "    signed only once an enrolled person (not the request's maker) has attested: gate\n"
      .. "    runs only after: gate (attested by a person)\n"):format(AMOUNT, dest, CHAIN), 1, true), shown)
    assert.truthy(sup.host.approver_sign(e.key.alice, statement(open.id), o.document, o.text))
    shown = common.read(e.key.alice .. ".statement.err")
    assert.truthy(shown:find(("  node transfer: pays %s ETH to %s on chain %d, signed with key sa\n"
      .. "    runs only after"):format(AMOUNT, dest, CHAIN), 1, true) == nil, shown)
    assert.truthy(shown:find("  node destination_receive: [^\n]*\n    runs only after: transfer %(the daemon's word%)\n"),
      shown)
    -- signatures of the gated request's statement with the plan line that
    -- leaves the order out do not count; of its statement, they do
    local unordered = st:gsub("\nplan %x+\n", "\nplan " .. g.unordered .. "\n")
    for _, name in ipairs({ "alice", "bob" }) do
      signed_vote(gated.id, "operator:" .. name, sup.host.approver_sign(e.key[name], unordered))
    end
    local nodes = engine.nodes(s, gated.id)
    must_as_runtime("UPDATE movement_request_nodes SET node_state = 'COMPLETED' WHERE id = $1::uuid", nodes.gate.id)
    must_as_runtime("UPDATE movement_request_nodes SET node_state = 'READY' WHERE id = $1::uuid", nodes.transfer.id)
    must_as_runtime("UPDATE movement_requests SET request_state = 'EXECUTING' WHERE id = $1::uuid", gated.id)
    local p = payload({ to = dest, nonce = 976 })
    reserve(nodes.transfer.id, DEV[1].address, 976, p.signing_hash)
    start_local_signer("sa=" .. sup.key_file(dir, "sa", DEV[1].key), { MG_SIGNER_APPROVERS = e.path })
    local sig, err = ask_sa(gated.id, nodes.transfer.id, p)
    assert.is_nil(sig, "signed on signatures of a plan line without the order")
    assert.equal("APPROVALS_INCOMPLETE", err.code, tostring(err.message))
    assert.matches("0 of 2 enrolled approvers", err.message, 1, true)
    for _, name in ipairs({ "alice", "bob" }) do
      signed_vote(gated.id, "api:" .. name, sup.host.approver_sign(e.key[name], st))
    end
    -- (the gate attested: "signs a transfer past manual steps only when ...")
    attest(nodes.gate.id, "operator:alice", sup.host.approver_sign(e.key.alice, attestation(gated.id, "gate")))
    sig, err = ask_sa(gated.id, nodes.transfer.id, p)
    assert.truthy(sig, err and err.message)
    os.execute("rm -rf " .. common.quote(e.dir))
  end)

  -- A manual step binds the signer only when a person signed that it is
  -- done (sql/0206): the runtime writes node states, and set a gate
  -- COMPLETED by itself to have the transfer after it signed (session 33's
  -- order check alone let it).  Every manual step before the transfer in
  -- the plan, not only the one right before it, needs an enrolled person's
  -- attestation, and never the maker's.
  it("signs a transfer past manual steps only when an enrolled person attested each", function()
    local tkey = "sign_t_attest_" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
    local doc = sup.template(tkey, "sa", { allowed_chain_ids = { CHAIN }, max_amount = "25" })
    for i, key in ipairs({ "desk", "gate" }) do
      table.insert(doc.nodes, i, { key = key, kind = "manual", action_type = "manual_confirmation",
        executor = "manual", config = { instructions = "confirm " .. key } })
    end
    doc.edges[#doc.edges + 1] = { from = "desk", to = "gate" }
    doc.edges[#doc.edges + 1] = { from = "gate", to = "transfer" }
    engine.load_doc(s, doc)
    local class, dest = new_class(), sup.random_address()
    local req = sup.create(s, tkey, class, intent(dest))
    local e = approvers({ { "alice" }, { "bob" }, { "ivan", engine.INITIATOR .. ",operator:ivan" } }, { [class] = 2 })
    local st = statement(req.id)
    for _, name in ipairs({ "alice", "bob" }) do
      signed_vote(req.id, "operator:" .. name, sup.host.approver_sign(e.key[name], st))
    end
    local nodes = engine.nodes(s, req.id)
    -- the runtime completes both manual steps and readies the transfer
    for _, key in ipairs({ "desk", "gate" }) do
      must_as_runtime("UPDATE movement_request_nodes SET node_state = 'READY' WHERE id = $1::uuid AND node_state = 'BLOCKED'",
        nodes[key].id)
      must_as_runtime("UPDATE movement_request_nodes SET node_state = 'COMPLETED' WHERE id = $1::uuid", nodes[key].id)
    end
    must_as_runtime("UPDATE movement_request_nodes SET node_state = 'READY' WHERE id = $1::uuid", nodes.transfer.id)
    must_as_runtime("UPDATE movement_requests SET request_state = 'EXECUTING' WHERE id = $1::uuid", req.id)
    local p = payload({ to = dest, nonce = 977 })
    reserve(nodes.transfer.id, DEV[1].address, 977, p.signing_hash)
    start_local_signer("sa=" .. sup.key_file(dir, "sa", DEV[1].key), { MG_SIGNER_APPROVERS = e.path })
    local function refused(why, text)
      local sig, err = ask_sa(req.id, nodes.transfer.id, p)
      assert.is_nil(sig, why)
      assert.equal("STEP_NOT_ATTESTED", err.code, why .. ": " .. tostring(err.message))
      assert.matches(text, err.message, 1, true)
    end
    refused("no attestation", "manual step desk before this one carries no attestation")
    local desk, gate = attestation(req.id, "desk"), attestation(req.id, "gate")
    assert.matches("^qtg%-attestation%-v1\n.*\nstep desk\n$", desk)
    -- the one right before it attested, the one before that not
    attest(nodes.gate.id, "operator:alice", sup.host.approver_sign(e.key.alice, gate))
    refused("the step two before unattested", "manual step desk before this one carries no attestation")
    -- the runtime's forgeries of desk's attestation: { attested_by, whose
    -- key signs, what it signs, why, the refusal }
    local not_alice = "alice did not sign the attestation of manual step desk"
    for _, f in ipairs({
      { "operator:mallory", "alice", desk, "an attester nobody enrolled",
        "attested by operator:mallory, who is no enrolled person" },
      { "operator:alice", "bob", desk, "another person's signature", not_alice },
      { "operator:alice", "alice", gate, "another step's attestation", not_alice },
      { "operator:alice", "alice", st, "the approval statement", not_alice },
      { "operator:ivan", "ivan", desk, "the maker's attestation", "attested by ivan, who made the request" },
    }) do
      attest(nodes.desk.id, f[1], sup.host.approver_sign(e.key[f[2]], f[3]))
      refused(f[4], f[5])
    end
    -- attested, but the runtime puts the step back: not done
    attest(nodes.desk.id, "operator:bob", sup.host.approver_sign(e.key.bob, desk))
    common.unfrozen(s, "UPDATE movement_request_nodes SET node_state = 'READY' WHERE id = $1::uuid", nodes.desk.id)
    refused("an attested step not COMPLETED", "manual step desk before this one is READY, not COMPLETED")
    common.unfrozen(s, "UPDATE movement_request_nodes SET node_state = 'COMPLETED' WHERE id = $1::uuid", nodes.desk.id)
    local sig, err = ask_sa(req.id, nodes.transfer.id, p)
    assert.truthy(sig, err and err.message)
    os.execute("rm -rf " .. common.quote(e.dir))
  end)

  -- A signature ahead of the chain: the runtime has a transfer signed,
  -- keeps the bytes, releases (or deletes) its reservation and fails the
  -- node; the bytes can be mined once the chain reaches their nonce.  The
  -- signer's own log still names the grant, and `qtgd audit verify` lists
  -- every grant whose transfer did not complete and whose bytes the
  -- daemon's rows do not show mined, dead or in flight (qtg.audit_grants).
  it("leaves a grant whose bytes the daemon's rows dropped on qtgd audit verify's list", function()
    start_local_signer("sa=" .. sup.key_file(dir, "sa", DEV[1].key))
    local dest = sup.random_address()
    local function granted(nonce)
      local req = engine.create(s, "sign_t_a", { intent = intent(dest), callback_url = false })
      local node = approved_transfer(req.id)
      local p = payload({ to = dest, nonce = nonce })
      reserve(node.id, DEV[1].address, nonce, p.signing_hash)
      local sig, err = ask_sa(req.id, node.id, p)
      assert.truthy(sig, err and err.message)
      return node, p
    end
    local function reservation(nonce) return "chain_id = " .. CHAIN .. " AND nonce = " .. nonce end
    -- released, the node FAILED: the attack
    local released, rp = granted(1985)
    must_as_runtime("UPDATE evm_nonce_reservation SET status = 'released' WHERE " .. reservation(1985))
    must_as_runtime("UPDATE movement_request_nodes SET node_state = 'FAILED' WHERE id = $1::uuid", released.id)
    -- the row deleted, the node left READY
    local deleted = granted(1986)
    must_as_runtime("DELETE FROM evm_nonce_reservation WHERE " .. reservation(1986))
    -- in flight on its own bytes, then completed: neither is listed
    local flying = granted(1987)
    must_as_runtime([[UPDATE evm_nonce_reservation SET status = 'signed', signed_raw_tx = '0x02aa',
                        tx_hash = $1 WHERE ]] .. reservation(1987), "0x" .. string.rep("ab", 32))
    for _, st in ipairs({ "SUBMITTING", "SUBMITTED" }) do
      must_as_runtime("UPDATE movement_request_nodes SET node_state = $2 WHERE id = $1::uuid", flying.id, st)
    end
    local done = granted(1988)
    must_as_runtime([[UPDATE evm_nonce_reservation SET status = 'signed', signed_raw_tx = '0x02bb',
                        tx_hash = $1 WHERE ]] .. reservation(1988), "0x" .. string.rep("cd", 32))
    for _, st in ipairs({ "SUBMITTING", "SUBMITTED", "COMPLETED" }) do
      must_as_runtime("UPDATE movement_request_nodes SET node_state = $2 WHERE id = $1::uuid", done.id, st)
    end
    local listed = {}
    for _, g in ipairs(require("qtg.audit_grants").check(s, 1000000).list) do listed[g.node_id] = g end
    assert.truthy(listed[released.id], "the released grant is listed")
    assert.equal("FAILED", listed[released.id].node_state)
    assert.equal(1985, tonumber(listed[released.id].nonce))
    assert.equal("the reservation row at that nonce is released", listed[released.id].held)
    assert.equal(rp.signing_hash, listed[released.id].payload_hash)
    assert.truthy(listed[deleted.id], "the deleted row's grant is listed")
    assert.equal("no reservation row at that nonce", listed[deleted.id].held)
    assert.is_nil(listed[flying.id], "a transfer in flight on its own bytes is not listed")
    assert.is_nil(listed[done.id], "a completed transfer is not listed")
    -- the command lists them (the oldest 20 of this shared database's) and exits 1
    local rc, out = sup.host.run(sup.host.base_env(), { common.quote(sup.host.bin), "audit", "verify" })
    assert.equal(1, rc, out)
    assert.truthy(out:find("SIGNED TRANSFERS NOT SETTLED", 1, true), out)
    assert.truthy(out:find("\n  grant %d+: node [%x%-]+ of request [%x%-]+ %(%u+%): nonce %d+ of 0x%x+ on chain "
      .. CHAIN .. ", payload 0x%x+, granted [^;]+; [^\n]+\n"), out)
  end)

  -- The signer recomputes the digest and the plan digest with built-ins,
  -- but a built-in named without its schema is looked up on the session's
  -- search_path, and an overload with exact argument types in public wins
  -- over pg_catalog's VARIADIC "any" jsonb_build_object.  Where the runtime
  -- may create in public (PostgreSQL 14's default, kept by a cluster
  -- upgraded from it; the owner role always may), it shadows the signer's
  -- jsonb_build_object: the intent changes under the approvers' statement,
  -- which still verifies.  The signer reads with search_path pg_catalog.
  it("recomputes the statement with pg_catalog's built-ins, not a look-alike on its search_path", function()
    local keys = "sa=" .. sup.key_file(dir, "sa", DEV[1].key)
    local class = new_class()
    local a, b = sup.random_address(), sup.random_address()
    local req = engine.create(s, "sign_t_a", { intent = intent(a), callback_url = false })
    engine.move_class(s, req.id, class)
    local st = statement(req.id)
    local digest = st:match("\ndigest (%x+)\n")
    local e = approvers({ { "alice" }, { "bob" } }, { [class] = 2 })
    local key, kd, path = e.key, e.dir, e.path
    -- alice and bob sign the statement of 0.25 ETH to a
    local sigs = { alice = sup.host.approver_sign(key.alice, st), bob = sup.host.approver_sign(key.bob, st) }
    finally(function()
      s:query([[DROP FUNCTION IF EXISTS public.jsonb_build_object(text, text, text, bigint, text, text,
                  text, jsonb, text, jsonb, text, text, text, text)]])
      s:query("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
      os.execute("rm -rf " .. common.quote(kd))
    end)
    s:query("GRANT CREATE ON SCHEMA public TO PUBLIC")      -- as on PostgreSQL 14
    -- the runtime's look-alike: the document of a whenever the intent pays b
    must_as_runtime(string.format([[
      CREATE FUNCTION public.jsonb_build_object(k1 text, v1 text, k2 text, v2 bigint, k3 text, v3 text,
          k4 text, v4 jsonb, k5 text, v5 jsonb, k6 text, v6 text, k7 text, v7 text) RETURNS jsonb
        LANGUAGE sql AS $f$
        SELECT pg_catalog.jsonb_build_object(k1, v1, k2, v2, k3, v3, k4,
          CASE WHEN v4->>'destination' = '%s' THEN v4 || '{"destination": "%s"}'::jsonb ELSE v4 END,
          k5, v5, k6, v6, k7, v7) $f$]], b, a))
    -- b instead of a while pending, the digest the approvers signed kept, their votes, APPROVED
    must_as_runtime([[UPDATE movement_requests SET intent = intent || jsonb_build_object('destination', $2::text),
                        approval_digest = $3 WHERE id = $1::uuid]], req.id, b, digest)
    for _, name in ipairs({ "alice", "bob" }) do
      must_as_runtime([[INSERT INTO request_approvals (request_id, principal, decision, approval_digest, signature)
                   VALUES ($1::uuid, $2, 'approve', $3, $4)]], req.id, "operator:" .. name, digest, sigs[name])
    end
    local node = approved_as_runtime(req.id)
    local p = payload({ to = b, nonce = 970 })
    reserve(node.id, DEV[1].address, 970, p.signing_hash)
    start_local_signer(keys, { MG_SIGNER_APPROVERS = path })
    local sig, err = qtg.signer.sign("sa", { request_id = req.id, request_node_id = node.id,
      attempt_no = 1, payload = p.payload, payload_hash = p.signing_hash })
    assert.is_nil(sig, "0.25 ETH to b was signed on the approvers' statement for a")
    assert.equal("APPROVAL_DIGEST_MISMATCH", err.code, tostring(err.message))
  end)

  -- Known gap (docs/security.md section 6, "What is not enforced"): the
  -- statement does not name the initiator, and created_by is the runtime's
  -- to write while the request is pending, so the signer's "never the
  -- initiator's person" binds the daemon's own code, not a runtime-role
  -- writer.  An enrolled approver who can run Lua in `qtgd run` rewrites
  -- created_by on his own request and his own signature counts: with a
  -- quorum of one, he moves the money alone.  Closing it needs the
  -- maker's own signature of the request: 'initiation signed' in the
  -- enrolment (the next spec); without it the gap stands, and this spec
  -- runs with QTG_SPEC_KNOWN_GAPS=1 and fails.
  it("counts no signature of the initiator's person when the runtime rewrites created_by (known gap)", function()
    if (os.getenv("QTG_SPEC_KNOWN_GAPS") or "") == "" then
      pending("known gap without initiation signed: created_by is the runtime's (QTG_SPEC_KNOWN_GAPS=1 runs it)")
      return
    end
    local keys = "sa=" .. sup.key_file(dir, "sa", DEV[1].key)
    local class = new_class()
    local dest = sup.random_address()
    -- ivan creates a request (as engine.INITIATOR, one of his principals)
    local req = engine.create(s, "sign_t_a", { intent = intent(dest), callback_url = false })
    engine.move_class(s, req.id, class)
    local e = approvers({ { "alice" }, { "ivan", engine.INITIATOR .. ",operator:ivan" } }, { [class] = 1 })
    local key, kd, path = e.key, e.dir, e.path
    -- as the runtime, while it is pending: another initiator, his own signed vote, APPROVED
    must_as_runtime([[UPDATE movement_requests r SET created_by = 'system:scheduler',
                        approval_digest = qtg_approval_digest(r) WHERE id = $1::uuid]], req.id)
    signed_vote(req.id, "operator:ivan", sup.host.approver_sign(key.ivan, statement(req.id)))
    local node = approved_as_runtime(req.id)
    local p = payload({ to = dest, nonce = 960 })
    reserve(node.id, DEV[1].address, 960, p.signing_hash)
    start_local_signer(keys, { MG_SIGNER_APPROVERS = path })
    local sig, err = qtg.signer.sign("sa", { request_id = req.id, request_node_id = node.id,
      attempt_no = 1, payload = p.payload, payload_hash = p.signing_hash })
    os.execute("rm -rf " .. common.quote(kd))
    assert.is_nil(sig, "the initiator's own signature moved the money alone")
    assert.equal("APPROVALS_INCOMPLETE", err.code, tostring(err.message))
  end)

  -- The gap above, closed: with 'initiation signed' the request's maker is
  -- known by a key.  created_by must belong to an enrolled person or
  -- initiator whose signature of the request's initiation statement is
  -- stored; a maker never counts as its own request's approver, and an
  -- initiator (a client system's key) never counts as anyone's.
  it("signs only for a request its enrolled maker signed (initiation signed), and never counts the maker", function()
    local keys = "sa=" .. sup.key_file(dir, "sa", DEV[1].key)
    local class = new_class()
    local e = approvers({ { "alice" }, { "ivan", engine.INITIATOR .. ",operator:ivan" },
                          { "treasury-bot", "api:treasury-bot", initiator = true } }, { [class] = 1 },
                        { "initiation signed" })
    local key, kd, path = e.key, e.dir, e.path
    local h = start_local_signer(keys, { MG_SIGNER_APPROVERS = path })
    local nonce = 980   -- 981..988, a range of its own
    -- a request ivan made, then as the runtime while it is pending: the
    -- maker named `maker`, the initiation signature by `init_key`, signed
    -- votes {principal, key}; APPROVED; then asked to sign
    local function try(maker, init_key, init_kind, votes)
      local dest = sup.random_address()
      local req = engine.create(s, "sign_t_a", { intent = intent(dest), callback_url = false })
      engine.move_class(s, req.id, class)
      local init = init_key and sup.host.approver_sign(key[init_key],
        common.statement(req.id, DEPLOYMENT, init_kind))
      must_as_runtime([[UPDATE movement_requests r SET created_by = $2, initiation_signature = $3,
                          approval_digest = qtg_approval_digest(r) WHERE id = $1::uuid]], req.id, maker, init)
      for _, v in ipairs(votes) do signed_vote(req.id, v[1], sup.host.approver_sign(key[v[2]], statement(req.id))) end
      local node = approved_as_runtime(req.id)
      nonce = nonce + 1
      local p = payload({ to = dest, nonce = nonce })
      reserve(node.id, DEV[1].address, nonce, p.signing_hash)
      return qtg.signer.sign("sa", { request_id = req.id, request_node_id = node.id,
        attempt_no = 1, payload = p.payload, payload_hash = p.signing_hash })
    end
    local function refused(code, text, ...)
      local sig, err = try(...)
      assert.is_nil(sig, code)
      assert.equal(code, err.code, tostring(err.message))
      if text then assert.truthy(err.message:find(text, 1, true), err.message) end
    end
    local ivan_votes = { { "operator:ivan", "ivan" } }
    -- ivan made it and approves it himself, another maker named in the row
    refused("INITIATOR_NOT_ENROLLED", "system:scheduler", "system:scheduler", nil, nil, ivan_votes)
    -- the bot named as the maker: without its signature, with ivan's
    -- signature of the initiation, with the bot's of the approval statement
    refused("INITIATION_UNSIGNED", "treasury-bot", "api:treasury-bot", nil, nil, ivan_votes)
    refused("INITIATION_UNSIGNED", nil, "api:treasury-bot", "ivan", "initiation", ivan_votes)
    refused("INITIATION_UNSIGNED", nil, "api:treasury-bot", "treasury-bot", "approval", ivan_votes)
    -- ivan as the maker, with his own signature: his approval never counts
    refused("APPROVALS_INCOMPLETE", "0 of 1 enrolled approvers", "operator:ivan", "ivan", "initiation", ivan_votes)
    -- an initiator approves nothing: the bot's signed vote on ivan's request
    refused("APPROVALS_INCOMPLETE", "0 of 1 enrolled approvers", "operator:ivan", "ivan", "initiation",
      { { "api:treasury-bot", "treasury-bot" } })
    -- the bot made it: its own approval counts for nothing; ivan's counts
    refused("APPROVALS_INCOMPLETE", "0 of 1 enrolled approvers", "api:treasury-bot", "treasury-bot", "initiation",
      { { "api:treasury-bot", "treasury-bot" } })
    local sig, err = try("api:treasury-bot", "treasury-bot", "initiation",
      { { "api:treasury-bot", "treasury-bot" }, { "operator:ivan", "ivan" } })
    assert.truthy(sig, err and err.message)
    assert.equal(1, sup.log_count(h, "of requests their enrolled maker signed"))
    os.execute("rm -rf " .. common.quote(kd))
  end)

  -- One signer serves every qtgd instance on its host; MG_SIGNER_KEY_CLASSES
  -- binds each key to the network classes it signs for, so a request of a
  -- class with laxer approval rules cannot get a mainnet key's signature.
  it("starts with keys only under an enrolment, or where trusting the approval rows is said", function()
    local keys = "sa=" .. sup.key_file(dir, "sa", DEV[1].key)
    local n = 0
    local function start(extra)
      n = n + 1
      local env = sup.run_env("unused", { MG_SIGNER_SOCKET = dir .. "/trust-" .. n .. ".sock" })
      for k, v in pairs(extra) do env[k] = v end
      return sup.host.start(env, { "signer" })
    end
    local function refused(extra, needle, why)
      local h = start(extra)
      assert.equal(1, sup.host.wait_exit(h, 30), why)
      local log = sup.host.read(h.log) or ""
      assert.truthy(log:find(needle, 1, true), why .. ": " .. log)
      assert.falsy(log:find('"signer: listening"', 1, true), why)
    end
    -- keys and no enrolment (the file forgotten, the line dropped from a
    -- unit): whoever writes the runtime's rows would approve; refused
    refused({ MG_SIGNER_KEYS = keys }, "MG_SIGNER_APPROVERS is not set", "keys alone")
    refused({ MG_SIGNER_KEYS = keys, MG_SIGNER_TRUST_APPROVAL_ROWS = "false" },
      "MG_SIGNER_APPROVERS is not set", "keys, trust said false")
    -- an enrolment and the trust flag: a contradiction, refused
    local e = approvers({ { "alice" }, { "bob" } }, { ["*"] = 2 })
    refused({ MG_SIGNER_KEYS = keys, MG_SIGNER_APPROVERS = e.path, MG_SIGNER_TRUST_APPROVAL_ROWS = "true" },
      "are both set", "both")
    -- keys for every class (MG_SIGNER_KEY_CLASSES unset) under quorums that
    -- differ by class: the lowest would hold for all; refused.  Bound, it starts.
    local mixed = approvers({ { "alice" }, { "bob" } }, { mainnet = 2, ["*"] = 1 })
    refused({ MG_SIGNER_KEYS = keys, MG_SIGNER_APPROVERS = mixed.path },
      "asks 2 approvals for mainnet but 1 for *", "unbound keys, mixed quorums")
    local bound = start({ MG_SIGNER_KEYS = keys, MG_SIGNER_APPROVERS = mixed.path,
      MG_SIGNER_KEY_CLASSES = "sa=mainnet" })
    common.wait_log(bound, '"signer: listening"', 30, "the bound signer listening")
    os.execute("rm -rf " .. common.quote(mixed.dir))
    -- no key: nothing to sign, it starts (a package's first start)
    local none = start({})
    common.wait_log(none, '"signer: listening"', 30, "the keyless signer listening")
    assert.equal(0, sup.log_count(none, "MG_SIGNER_TRUST_APPROVAL_ROWS=true"))
    -- said: it starts, and says at start what it trusts
    local trusting = start({ MG_SIGNER_KEYS = keys, MG_SIGNER_TRUST_APPROVAL_ROWS = "true" })
    common.wait_log(trusting, '"signer: listening"', 30, "the trusting signer listening")
    assert.equal(1, sup.log_count(trusting, "MG_SIGNER_TRUST_APPROVAL_ROWS=true: approvals count"))
    -- an enrolment alone: it starts
    local enrolled = start({ MG_SIGNER_KEYS = keys, MG_SIGNER_APPROVERS = e.path })
    common.wait_log(enrolled, '"signer: listening"', 30, "the enrolled signer listening")
    os.execute("rm -rf " .. common.quote(e.dir))
  end)

  it("signs with a key only for the network classes MG_SIGNER_KEY_CLASSES gives it", function()
    local keys = "sa=" .. sup.key_file(dir, "sa", DEV[1].key)
    local class = new_class()
    local dest = sup.random_address()
    local req = sup.create(s, "sign_t_a", class, intent(dest))
    local node = engine.nodes(s, req.id).transfer
    local p = payload({ to = dest, nonce = 920 })
    reserve(node.id, DEV[1].address, 920, p.signing_hash)
    local function sign()
      return qtg.signer.sign("sa", { request_id = req.id, request_node_id = node.id,
        attempt_no = 1, payload = p.payload, payload_hash = p.signing_hash })
    end
    -- bound to another class, and a key the setting does not name: refused
    for _, spec in ipairs({ "sa=mainnet", "sb=" .. class }) do
      local h = start_local_signer(keys, { MG_SIGNER_KEY_CLASSES = spec })
      local sig, err = sign()
      assert.is_nil(sig, spec)
      assert.equal("KEY_NOT_FOR_CLASS", err.code, spec .. ": " .. tostring(err.message))
      sup.host.stop(h)
    end
    -- a malformed setting: the signer does not start, and says which setting
    local bad = sup.host.start(sup.run_env("unused", { MG_SIGNER_KEYS = keys,
      MG_SIGNER_SOCKET = qtg.signer.socket_path(), MG_SIGNER_KEY_CLASSES = "sa=" .. class .. "|" }),
      { "signer" })
    assert.equal(1, sup.host.wait_exit(bad, 30))
    assert.truthy((sup.host.read(bad.log) or ""):find("MG_SIGNER_KEY_CLASSES", 1, true))
    -- bound to this class among others: granted
    start_local_signer(keys, { MG_SIGNER_KEY_CLASSES = "sa=mainnet|" .. class .. ",sb=dev" })
    assert.truthy(sign())
  end)

  -- A template may allow many chains: the signer reads the whole list (a
  -- list cut at a fixed size would drop the approved chain at its end, or
  -- keep a cut-off id that happens to match).
  it("reads a long allowed_chain_ids list whole", function()
    local allowed = {}
    for i = 1, 300 do allowed[i] = 1000000 + i end
    allowed[#allowed + 1] = CHAIN
    engine.load_doc(s, sup.template("sign_t_long", "sa", { allowed_chain_ids = allowed, max_amount = "25" }))
    start_local_signer("sa=" .. sup.key_file(dir, "sa", DEV[1].key))
    local dest = sup.random_address()
    local req = sup.create(s, "sign_t_long", new_class(), intent(dest))
    local node = engine.nodes(s, req.id).transfer
    local good = payload({ to = dest, nonce = 900 })
    reserve(node.id, DEV[1].address, 900, good.signing_hash)
    local sig, err = qtg.signer.sign("sa", { request_id = req.id, request_node_id = node.id,
      attempt_no = 1, payload = good.payload, payload_hash = good.signing_hash })
    assert.truthy(sig, err and err.code .. ": " .. tostring(err.message))
    assert.equal("granted", events_of(req.id)[1].decision)
  end)

  -- The allowed uid sends a byte a second and never a newline: each byte
  -- would renew a per-read timeout forever, and the signer serves one
  -- connection at a time, so the whole line has one deadline.
  it("cuts off a peer that trickles its request, then answers the next one", function()
    local keys = "sa=" .. sup.key_file(dir, "sa", DEV[1].key)
    start_local_signer(keys)
    local trickle = [[/usr/bin/python3 -c 'import socket,sys,time,select
c=socket.socket(socket.AF_UNIX); c.connect(sys.argv[1]); t0=time.monotonic()
while time.monotonic()-t0 < 20:
  try:
    c.send(b"K")
  except OSError:
    print("CLOSED", round(time.monotonic()-t0, 1)); sys.exit(0)
  r,_,_=select.select([c],[],[],1.0)
  if r and c.recv(100)==b"":
    print("CLOSED", round(time.monotonic()-t0, 1)); sys.exit(0)
print("OPEN")' ]]
    local p = io.popen(trickle .. common.quote(qtg.signer.socket_path()) .. " 2>&1")
    local out = p:read("*a")
    p:close()
    local after = tonumber(out:match("^CLOSED ([%d%.]+)"))
    assert.truthy(after, "the trickling peer was never cut off: " .. out)
    assert.is_true(after < 15, out)
    assert.same({ "sa" }, qtg.signer.keys())
  end)

  -- One signer serves every qtgd on its host, and any Lua running as the
  -- daemon's uid can connect to it.  Before, it served one connection at a
  -- time, each for up to 5 s: six silent connections held KEYS for 30 s,
  -- and went unlogged.  It reads every accepted connection at once (up to
  -- 64, the oldest cut off beyond), decides each whole line as it comes,
  -- cuts the silent ones off at their deadline, and logs the cut-offs,
  -- counted, one line a second at most.
  it("answers while connections of the allowed uid stay silent, and logs those it cuts off", function()
    local h = start_local_signer("sa=" .. sup.key_file(dir, "sa", DEV[1].key))
    local sock = qtg.signer.socket_path()
    local dest = sup.random_address()
    local req = sup.create(s, "sign_t_a", new_class(), intent(dest))
    local node = engine.nodes(s, req.id).transfer
    local good = payload({ to = dest, nonce = 990 })
    reserve(node.id, DEV[1].address, 990, good.signing_hash)
    -- n silent connections, then KEYS on another; the silent ones are held
    -- until the signer closes them.  Both outcomes are written to a file.
    local script = dir .. "/silent.py"
    sup.host.write(script, [[
import select, socket, sys, time
path, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def say(text):
    with open(out, "a") as f:
        f.write(text + "\n")
silent = []
for _ in range(n):
    c = socket.socket(socket.AF_UNIX)
    c.connect(path)
    silent.append(c)
time.sleep(0.3)
k = socket.socket(socket.AF_UNIX)
k.settimeout(25)
k.connect(path)
k.sendall(b"KEYS\n")
try:
    line = k.makefile().readline().strip() or "EOF"
except OSError:
    line = "NO ANSWER in 25 s"
closed = len(select.select(silent, [], [], 0)[0])
say("ANSWER %s|%d of %d silent open" % (line, n - closed, n))
left, t0 = list(silent), time.monotonic()
while left and time.monotonic() - t0 < 30:
    for c in select.select(left, [], [], 1.0)[0]:
        try:
            data = c.recv(100)
        except OSError:
            data = b""
        if not data:
            left.remove(c)
say("CLOSED %d of %d" % (n - len(left), n))
]])
    local function silent(n, tag)
      local out = dir .. "/silent-" .. tag .. ".out"
      os.remove(out)
      os.execute(("/usr/bin/python3 %s %s %d %s >%s 2>&1 &"):format(common.quote(script), common.quote(sock), n,
        common.quote(out), common.quote(out .. ".err")))
      return out, common.wait_for(function()
        local text = sup.host.read(out)
        return text and text:match("ANSWER ([^\n]*)"), sup.host.read(out .. ".err")
      end, 40, "the KEYS answer beside " .. n .. " silent connections")
    end
    -- the cut-off log lines: how many, and the counts they give
    local function cuts()
      local lines, count, evicted = 0, 0, 0
      for line in (sup.host.read(h.log) or ""):gmatch("[^\n]+") do
        if line:find("signer: cut off connections", 1, true) then
          local ok, e = pcall(cjson.decode, line)
          if ok then
            lines, count, evicted = lines + 1, count + tonumber(e.count), evicted + tonumber(e.evicted)
          end
        end
      end
      return lines, count, evicted
    end
    -- eight silent connections: KEYS is answered while all eight are open
    local out, answer = silent(8, "a")
    assert.equal("OK sa|8 of 8 silent open", answer)
    -- and a SIGN on a connection of its own is granted, still while they are
    local sig, err = qtg.signer.sign("sa", { request_id = req.id, request_node_id = node.id, attempt_no = 1,
      payload = good.payload, payload_hash = good.signing_hash })
    assert.truthy(sig, err and err.code .. ": " .. tostring(err.message))
    assert.is_nil((sup.host.read(out) or ""):find("CLOSED", 1, true), "the silent ones were closed first")
    assert.equal("granted", events_of(req.id)[1].decision)
    -- then they are cut off at their deadline, and the log says so, counted
    common.wait_for(function() return (sup.host.read(out) or ""):match("CLOSED 8 of 8") end, 40,
      "the silent connections cut off", 0.2)
    common.wait_for(function() return select(2, cuts()) == 8 end, 10, "8 cut-offs in the log")
    assert.equal(0, select(3, cuts()))
    local before = cuts()
    -- a flood of 150 (more than the 64 read at once): KEYS is still
    -- answered (the oldest silent ones make room), and every cut-off is
    -- logged, in a few lines (one a second at most), not one each
    out, answer = silent(150, "b")
    assert.truthy(answer:find("^OK sa|"), answer)
    common.wait_for(function() return (sup.host.read(out) or ""):match("CLOSED 150 of 150") end, 40,
      "the flood cut off", 0.2)
    common.wait_for(function()
      local _, count = cuts()
      return count == 158, count
    end, 10, "158 cut-offs in the log")
    local lines, _, evicted = cuts()
    assert.is_true(evicted >= 150 - 64, "evicted: " .. evicted)
    assert.is_true(lines - before <= 10, (lines - before) .. " log lines for 150 cut-offs")
    assert.same({ "sa" }, qtg.signer.keys())
  end)

  -- A package's first start: signer.env ships without a database URL and
  -- without keys, and qtgd.service wants the signer (its /readyz asks it).
  -- Holding no key it has nothing to read: it starts without a database,
  -- answers KEYS and APPROVALS, refuses SIGN.  Holding one and given no
  -- URL, it does not start, and says which setting, where.
  it("starts without a database when it holds no key; with a key and no URL it names the setting", function()
    -- no database anywhere: no URL, a root without tools/pg (no embedded
    -- cluster to start), libpq's own defaults pointing at nothing
    local root = sup.host.tmpdir()
    local function env(extra)
      local e = { MG_DATABASE_URL = "", MG_SIGNER_DATABASE_URL = "", QTG_ROOT = root, QTG_PG_DIR = root .. "/pg",
        PGHOST = root .. "/no-pg", PGPORT = "1", PGDATABASE = "none", MG_LOG_LEVEL = "info",
        MG_CONSOLE_ENABLED = "false" }
      for k, v in pairs(extra) do e[k] = v end
      return e
    end
    local sock = dir .. "/nodb.sock"
    local h = sup.host.start(env({ MG_SIGNER_SOCKET = sock }), { "signer" })
    common.wait_log(h, '"signer: listening"', 30, "the keyless signer listening without a database")
    local p = payload({ to = sup.random_address() })
    local uuid = "00000000-0000-4000-8000-000000000001"
    assert.same({ "OK", "OK none", "REFUSED SIGNER_NOT_FOUND no signer key sa is loaded" },
      ask_raw(sock, { "KEYS", "APPROVALS", ("SIGN %s %s 1 sa %s"):format(uuid, uuid, p.payload) }))
    assert.equal(1, sup.log_count(h, "SIGNER_NOT_FOUND"))   -- its log is its record
    assert.equal(1, sup.log_count(h, "does not connect to the database"))
    assert.equal(0, sup.log_count(h, "cannot connect"), sup.host.read(h.log))
    assert.is_true(os.execute("test -e " .. common.quote(root .. "/pg")) ~= 0, "no embedded cluster was made")
    assert.is_true(common.alive(h), "the keyless signer is still running")
    -- enrolled, it says its enrolment (what /readyz compares with its own)
    local e = approvers({ { "alice" }, { "bob" } }, { ["*"] = 2 })
    local enrolled = sup.host.start(env({ MG_SIGNER_SOCKET = dir .. "/nodb-e.sock", MG_SIGNER_APPROVERS = e.path }),
      { "signer" })
    common.wait_log(enrolled, '"signer: listening"', 30, "the keyless enrolled signer listening")
    assert.same({ "OK enrolled " .. DEPLOYMENT .. " " .. qtg.crypto.sha256_hex(sup.host.read(e.path)) },
      ask_raw(dir .. "/nodb-e.sock", { "APPROVALS" }))
    -- a key and no URL: refused at start, naming the setting and the file
    local keyed = sup.host.start(env({ MG_SIGNER_SOCKET = dir .. "/nodb-k.sock", MG_SIGNER_TRUST_APPROVAL_ROWS = "true",
      MG_SIGNER_KEYS = "sa=" .. sup.key_file(dir, "sa", DEV[1].key) }), { "signer" })
    assert.equal(1, sup.host.wait_exit(keyed, 30))
    local log = sup.host.read(keyed.log) or ""
    assert.truthy(log:find("MG_SIGNER_DATABASE_URL", 1, true), log)
    assert.truthy(log:find("/etc/qtg/signer.env", 1, true), log)
    assert.falsy(log:find("/etc/qtg/qtg.env", 1, true), log)
    assert.falsy(log:find('"signer: listening"', 1, true), log)
    os.execute("rm -rf " .. common.quote(root) .. " " .. common.quote(e.dir))
  end)
end)
