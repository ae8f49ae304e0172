-- api_signed_approvals_spec: signed approvals as the daemon takes them
-- (lua/qtg/signed_approvals.lua, sql/0180), over real HTTP against a
-- running qtgd with MG_SIGNER_APPROVERS.  Keys are made and statements
-- signed with `qtgd approver`, as an approver would on their own machine.
--   * the inbox shows the statement with the texts it hashes, and a client
--     can check both hashes itself;
--   * every vote that would not count is refused and leaves no row: no
--     signature, a malformed one, another person's, the signature of a twin
--     request or of this request in another deployment, the initiator
--     under another principal, a principal nobody enrolled;
--   * the enrolment's quorum (2) holds where the policy asks 1, and the
--     daemon's count ignores a vote row forged as qtg_runtime;
--   * the initiator's person cannot attest the request's manual step under
--     another principal either, and a manual step is completed only with
--     the completing person's signature of its attestation statement.
--   * `qtgd approver sign --request ID` (the id from the approver's own
--     records) signs only that request's statement: a twin's (the same
--     digest, the same texts) is refused, as is another deployment or
--     class given with --deployment, --class; bad flags are usage errors,
--     and so is a sign without --request or --kind (required).  --kind
--     approval refuses the request's initiation statement (the same key
--     signs both).
-- `qtgd signer` applies the same rule to the same file: signerd_spec.
local api, common, host
local d, doc, keydir
local operator, alice, bob, ivan, mallory
local names = {}
local key = {}
local enrolment   -- enrolment([without]): (re)write the file, without one person

local function rows(sql, ...) return common.query(sql, ...) end
local NULL_TEXT = tostring(require("cjson").null)

local function create(amount)
  local intent = {}
  for k, v in pairs(api.OTC_INTENT) do intent[k] = v end
  intent.amount = amount
  local r = api.call(d, "POST", "/v3/requests", { token = operator, key = common.uid("k", 6),
    json = { template_key = "otc_settlement_manual", intent = intent } })
  assert.equal(201, r.status, r.body)
  return r.json.id
end

-- the enrolment's deployment (setup writes it), which statements name
local DEPLOYMENT = "spec-desk"

local function statement(id, deployment)
  return common.statement(id, deployment or DEPLOYMENT)
end

local function approve(id, token, signature)
  return api.check(doc, api.call(d, "POST", "/v3/requests/" .. id .. "/approve",
    { token = token, json = { comment = "signed spec", signature = signature } }),
    "POST", "/v3/requests/{id}/approve")
end

-- `qtgd approver sign WORDS...` (each word quoted here) with statement on
-- stdin: its exit code, its stdout (the signature alone) and its stderr.
local function sign_with(statement, words)
  local file = keydir .. "/confirm.statement"
  common.write(file, statement)
  local quoted = {}
  for i, w in ipairs(words) do quoted[i] = common.quote(w) end
  local rc, out = host.run({}, { "sh", "-c", common.quote(common.quote(host.bin) .. " approver sign "
    .. table.concat(quoted, " ") .. " < " .. common.quote(file) .. " 2>" .. common.quote(file .. ".err")) })
  return rc, out, common.read(file .. ".err")
end

local function votes(id)
  return rows("SELECT principal, signature FROM request_approvals WHERE request_id = $1::uuid ORDER BY id", id)
end

describe("signed approvals through the API", function()
  setup(function()
    api = require "spec.lua.support.api"
    common = require "spec.lua.support.common"
    host = require "spec.lua.support.host"
    keydir = host.tmpdir()
    local pub = {}
    for _, who in ipairs({ "alice", "bob", "ivan", "mallory" }) do
      key[who], pub[who] = host.approver_key(keydir, who)
      names[who] = common.uid(who, 4)
    end
    names.operator = common.uid("op", 4)
    -- ivan creates requests under the operator token and approves under his own
    local path = keydir .. "/approvers"
    enrolment = function(without)
      local lines = { "deployment " .. DEPLOYMENT }
      for _, p in ipairs({ { "alice", "api:" .. names.alice }, { "bob", "api:" .. names.bob },
                           { "ivan", "api:" .. names.operator .. ",api:" .. names.ivan } }) do
        if p[1] ~= without then lines[#lines + 1] = ("person %s %s %s"):format(p[1], pub[p[1]], p[2]) end
      end
      lines[#lines + 1] = "quorum * 2"
      host.write(path, table.concat(lines, "\n") .. "\n")
      os.execute("chmod 644 " .. common.quote(path))
    end
    enrolment()
    operator = api.every_class_token("read,operate", { name = names.operator })
    alice = api.every_class_token("read,approve,operate", { name = names.alice })
    bob = api.every_class_token("read,approve", { name = names.bob })
    ivan = api.every_class_token("read,approve,operate", { name = names.ivan })
    mallory = api.every_class_token("read,approve", { name = names.mallory })
    d = api.start({ MG_SIGNER_APPROVERS = path, MG_API_RATE_LIMIT_PER_SECOND = "1000",
                    MG_API_RATE_LIMIT_BURST = "1000" })
    doc = api.call(d, "GET", "/v3/openapi.json", { token = alice }).json
  end)

  teardown(function()
    api.stop(d)
    host.stop_all()
    if keydir then os.execute("rm -rf " .. common.quote(keydir)) end
  end)

  it("shows the statement with the texts it hashes, which a client can check", function()
    local id = create("31")
    local r = api.check(doc, api.call(d, "GET", "/v3/approvals?limit=200", { token = alice }),
      "GET", "/v3/approvals")
    assert.equal(200, r.status, r.body)
    local item
    for _, x in ipairs(r.json.items) do if x.id == id then item = x end end
    assert.truthy(item, "the request is in alice's inbox")
    assert.equal(statement(id), item.approval_statement)
    local crypto = require("qtg").crypto
    assert.equal(item.approval_statement:match("\ndigest (%x+)\n"), crypto.sha256_hex(item.approval_document_text))
    assert.equal(item.digest, crypto.sha256_hex(item.approval_document_text))
    assert.equal(item.approval_statement:match("\nplan (%x+)\n$"), crypto.sha256_hex(item.plan_document_text))
    assert.equal("31", require("cjson").decode(item.approval_document_text).intent.amount)
    assert.equal("qtg-approval-v3\ndeployment " .. DEPLOYMENT .. "\nrequest " .. id .. "\nclass " .. d.class .. "\n",
      item.approval_statement:match("^(.-\n.-\n.-\n.-\n)"))
    local detail = api.call(d, "GET", "/v3/requests/" .. id, { token = alice }).json
    assert.equal(item.approval_statement, detail.approval_statement)
    assert.is_true(detail.approval_policy.signed_approvals)
    -- `qtgd approver sign KEY DOCUMENT PLAN` signs only the texts the statement hashes
    local sig = host.approver_sign(key.alice, item.approval_statement, item.approval_document_text,
      item.plan_document_text)
    -- and what the approval lets qtg's signer sign: nothing in this plan;
    -- the inbox gives the same reading
    local shown = common.read(key.alice .. ".statement.err")
    assert.truthy(shown:find(item.signer_may_sign, 1, true), item.signer_may_sign .. "\nnot in\n" .. shown)
    assert.equal(host.approver_sign(key.alice, item.approval_statement), sig)   -- Ed25519 is deterministic
    assert.truthy(shown:find("what qtg's signer may sign under this statement", 1, true), shown)
    assert.truthy(shown:find("\n  node withdraw: [^\n]*: not signed by qtg's signer\n"), shown)
    assert.truthy(shown:find("\n  nothing: no node of this plan is one the signer signs\n", 1, true), shown)
    local no, why = host.approver_sign(key.alice, item.approval_statement, item.approval_document_text,
      item.plan_document_text .. " ")
    assert.is_nil(no)
    assert.truthy(why:find("not what the statement's plan line covers", 1, true), why)
    no, why = host.approver_sign(key.alice, item.approval_statement,
      item.approval_document_text:gsub('"31"', '"310"'), item.plan_document_text)
    assert.is_nil(no)
    assert.truthy(why:find("digest line", 1, true), why)
  end)

  -- What `qtgd approver sign KEY DOCUMENT PLAN` shows is what it signs:
  -- jsonb text escapes control characters but not the rest of Unicode, so a
  -- key spelled with a zero-width space looks like the real one.  It shows
  -- every character outside printable ASCII as a JSON escape.
  it("shows the texts it signs with every character outside ASCII escaped", function()
    local crypto = require("qtg").crypto
    local document = '{"intent": {"destination": "0x' .. string.rep("e", 40) .. '", "destination\226\128\139": "0x'
      .. string.rep("a", 40) .. '", "memo": "caf\195\169 \240\159\146\184"}}'
    local plan = '{"nodes": [], "risk_controls": {}}'
    local st = "qtg-approval-v3\ndeployment spec-desk\nrequest 0b6d1c2e-1111-4222-8333-944455556666\nclass spec\ndigest "
      .. crypto.sha256_hex(document) .. "\nplan " .. crypto.sha256_hex(plan) .. "\n"
    assert.truthy(host.approver_sign(key.alice, st, document, plan))
    local shown = common.read(key.alice .. ".statement.err")
    assert.truthy(shown:find('"destination\\u200b": "0x' .. string.rep("a", 40), 1, true), shown)
    assert.truthy(shown:find('"caf\\u00e9 \\ud83d\\udcb8"', 1, true), shown)
    assert.is_nil(shown:find("[\128-\255]"), shown)
  end)

  -- The hashes bind the texts, but an approver reading the intent's
  -- destination could miss a node whose own config pays another address:
  -- `qtgd approver sign KEY DOCUMENT PLAN` shows, by the signer's rules,
  -- what each node would pay, and what the signer would refuse.
  local function payments(document, plan)
    local crypto = require("qtg").crypto
    local st = "qtg-approval-v3\ndeployment spec-desk\nrequest 0b6d1c2e-1111-4222-8333-944455556666\nclass spec\n"
      .. "digest " .. crypto.sha256_hex(document) .. "\nplan " .. crypto.sha256_hex(plan) .. "\n"
    local sig, why = host.approver_sign(key.alice, st, document, plan)
    return sig, sig and common.read(key.alice .. ".statement.err") or why
  end
  local A, B = "0x" .. string.rep("a", 40), "0x" .. string.rep("b", 40)
  local function transfer(key_, config, after)
    return { node_key = key_, node_kind = "action", executor = "evm_transfer", action_type = "evm_transfer",
             config = config, after = after or {} }
  end
  local RISK = { max_amount = "25", max_fee_per_gas_wei = "200000000000",
                 max_priority_fee_per_gas_wei = "5000000000", gas_limit = 21000, allowed_chain_ids = { 31337 } }
  local function texts(intent, nodes, risk)
    local cjson = require "cjson"
    return cjson.encode({ template_key = "evm_transfer", intent = intent }),
           cjson.encode({ nodes = nodes, risk_controls = risk or RISK })
  end

  it("shows what each node lets the signer pay, a node's own destination flagged, before it signs", function()
    local intent = { asset = "eth", amount = "1.5", chain_id = 31337, destination = A }
    local sig, shown = payments(texts(intent, {
      transfer("pay", { signer_key = "evm_hot" }),
      transfer("pay_again", { signer_key = "evm_hot", destination = B }, { "pay" }),
      { node_key = "watch", executor = "evm_transfer", action_type = "destination_chain_receive_observe", config = {},
        after = { "pay", "pay_again" } },
      { node_key = "odd", executor = "manual", action_type = "manual_confirmation", config = {}, after = "pay" },
    }))
    assert.truthy(sig, shown)
    for _, line in ipairs({
      "  node pay: pays 1.5 ETH to " .. A .. " on chain 31337, signed with key evm_hot\n  node pay_again",
      "  node pay_again: pays 1.5 ETH to " .. B .. " on chain 31337, signed with key evm_hot\n"
        .. "    the node's own destination, not the intent's (" .. A .. ")\n"
        .. "    runs only after: pay (the daemon's word)\n",
      "  node watch: evm_transfer / destination_chain_receive_observe: not signed by qtg's signer\n"
        .. "    runs only after: pay (the daemon's word), pay_again (the daemon's word)\n",
      "  node odd: manual / manual_confirmation: not signed by qtg's signer\n"
        .. "    its steps before it are not listed (pay): read the plan text\n",
      "  in all: 2 transfers of 1.5 ETH each\n",
      "  within the plan's risk_controls: max_amount 25, max_fee_per_gas 200000000000 wei, "
        .. "max_priority_fee_per_gas 5000000000 wei, gas_limit 21000, allowed_chain_ids [31337]\n",
    }) do
      assert.truthy(shown:find(line, 1, true), line .. " in:\n" .. shown)
    end
  end)

  it("says which transfer the signer would refuse, and signs nothing it cannot read", function()
    local cases = {
      { { asset = "ETH", amount = "1", chain_id = 31337, destination = A },
        { destination = { ["$ref"] = "intent.destination" } }, "its destination is not a literal address" },
      { { asset = "USDC", amount = "1", chain_id = 31337, destination = A }, {},
        "only ETH is signed, and the intent moves USDC" },
      { { asset = "ETH", amount = "1e3", chain_id = 31337, destination = A }, {},
        "the amount is not a plain decimal string of at most 18 decimals" },
      -- a JSON number, small or past 2^53: the signer reads amounts from strings only
      { { asset = "ETH", amount = 2, chain_id = 31337, destination = A }, {},
        "the amount is not a plain decimal string of at most 18 decimals" },
      { { asset = "ETH", amount = 1e16, chain_id = 31337, destination = A }, {},
        "the amount is not a plain decimal string of at most 18 decimals" },
      { { asset = "ETH", amount = "1", chain_id = 31337, destination = A }, { chain_id = 1 },
        "chain 1 is not in the plan's allowed_chain_ids" },
      { { asset = "ETH", amount = "1", chain_id = 31337, destination = A .. "00" }, {},
        "its destination is not a literal address" },
      { { asset = "ETH", amount = "1", chain_id = 31337, destination = A }, { chain_id = "$ref:pay.chain_id" },
        "its chain_id is not a chain id (decimal digits from 1 to 2^53 - 1)" },
      -- the signer reads chain ids as decimal digits from 1 to 2^53 - 1, and
      -- every element of allowed_chain_ids as a JSON integer: nothing else
      { { asset = "ETH", amount = "1", chain_id = 31337, destination = A }, { chain_id = "0x7a69" },
        "its chain_id is not a chain id (decimal digits from 1 to 2^53 - 1)" },
      { { asset = "ETH", amount = "1", chain_id = 31337, destination = A }, { chain_id = "0" },
        "its chain_id is not a chain id (decimal digits from 1 to 2^53 - 1)" },
      { { asset = "ETH", amount = "1", chain_id = 31337, destination = A }, { chain_id = "9007199254740993" },
        "its chain_id is not a chain id (decimal digits from 1 to 2^53 - 1)" },
      { { asset = "ETH", amount = "1", chain_id = 1, destination = A }, {},
        "the plan's allowed_chain_ids holds 31337,1, which is no chain id, so it allows nothing",
        { allowed_chain_ids = { "31337,1" } } },
      { { asset = "ETH", amount = "1", chain_id = 31337, destination = A }, {},
        "the plan's allowed_chain_ids holds 1, which is no chain id, so it allows nothing",
        { allowed_chain_ids = { 31337, "1" } } },
      { { asset = "ETH", amount = "1", chain_id = 31337, destination = A }, {},
        "the plan's allowed_chain_ids holds (a number not shown exactly here: read it in the text), which is no chain id, so it allows nothing",
        { allowed_chain_ids = { 1.5, 31337 } } },
    }
    -- leading zeros are the same chain, to the signer as here
    local sig, shown = payments(texts({ asset = "ETH", amount = "1", chain_id = "031337", destination = A },
      { transfer("pay", {}) }))
    assert.truthy(shown:find("  node pay: pays 1 ETH to " .. A .. " on chain 031337", 1, true), shown)
    for _, c in ipairs(cases) do
      local risk
      if c[4] then
        risk = {}
        for k, v in pairs(RISK) do risk[k] = v end
        for k, v in pairs(c[4]) do risk[k] = v end
      end
      local sig, shown = payments(texts(c[1], { transfer("pay", c[2]) }, risk))
      assert.truthy(sig, shown)
      assert.truthy(shown:find("  node pay: refused by the signer: " .. c[3] .. "\n", 1, true), shown)
      assert.truthy(shown:find("  nothing: no node of this plan is one the signer signs", 1, true), shown)
    end
    -- texts that are what the statement hashes but no JSON objects
    for _, bad in ipairs({ { "not json", '{"nodes": []}', "the document is not a JSON object" },
                           { '{"intent": {}}', "[1, 2]", "the plan is not a JSON object" } }) do
      local sig, why = payments(bad[1], bad[2])
      assert.is_nil(sig)
      assert.truthy(why:find("qtgd approver: " .. bad[3] .. ": not signed", 1, true), why)
    end
  end)

  -- Two requests with the same intent have the same digest and the same
  -- plan: only the request line tells their statements apart.  With the id
  -- from the approver's own records (--request), a daemon that shows one
  -- request and hands over its twin's statement gets no signature, even
  -- when the texts the approver checks are right for both.
  it("signs only the request the approver names with --request and --kind, and checks --deployment and --class", function()
    local id, twin = create("34"), create("34")
    local st, twin_st = statement(id), statement(twin)
    assert.equal(st:match("\ndigest (%x+)\n"), twin_st:match("\ndigest (%x+)\n"))
    assert.equal(st:match("\nplan (%x+)\n"), twin_st:match("\nplan (%x+)\n"))
    local item
    for _, x in ipairs(api.call(d, "GET", "/v3/approvals?limit=200", { token = alice }).json.items) do
      if x.id == id then item = x end
    end
    assert.truthy(item, "the request is in alice's inbox")
    local document, plan = keydir .. "/confirm.document", keydir .. "/confirm.plan"
    host.write(document, item.approval_document_text)
    host.write(plan, item.plan_document_text)
    local signed = host.approver_sign(key.alice, st)
    -- the right id (and deployment, class), the flags anywhere after `sign`
    local rc, out, err = sign_with(st, { "--request", id, key.alice, document, "--class", d.class, plan,
      "--deployment", DEPLOYMENT, "--kind", "approval" })
    assert.equal(0, rc, err)
    assert.equal(signed .. "\n", out)
    assert.truthy(err:find("==> approval statement (confirmed; digest and plan checked against their texts) for request "
      .. id .. " (confirmed), class " .. d.class .. " (confirmed), deployment " .. DEPLOYMENT .. " (confirmed)\n", 1, true),
      err)
    -- and it verifies as before: the daemon takes it as alice's vote
    local r = approve(id, alice, signed)
    assert.equal(200, r.status, r.body)
    assert.is_true(r.json.approvals[1].signed)
    -- the twin's statement under this request's id: refused, though its
    -- digest and plan lines are what the texts hash
    rc, out, err = sign_with(twin_st, { key.alice, document, plan, "--request", id, "--kind", "approval" })
    assert.equal(1, rc, err)
    assert.equal("", out)
    assert.truthy(err:find("the statement's request line is not the one given with --request\n"
      .. "  statement: request " .. twin .. "\n  expected:  request " .. id .. "\n", 1, true), err)
    assert.truthy(err:find("not signed", 1, true), err)
    -- another deployment's statement, another class
    rc, out, err = sign_with(statement(id, "other-desk"), { key.alice, "--request", id, "--deployment", DEPLOYMENT,
      "--kind", "approval", "--unchecked" })
    assert.equal(1, rc, err)
    assert.equal("", out)
    assert.truthy(err:find("statement: deployment other-desk\n  expected:  deployment " .. DEPLOYMENT, 1, true), err)
    rc, out, err = sign_with(st, { key.alice, "--class", "other" .. d.class, "--request", id, "--kind", "approval",
      "--unchecked" })
    assert.equal(1, rc, err)
    assert.equal("", out)
    assert.truthy(err:find("statement's class line", 1, true), err)
    assert.truthy(err:find("expected:  class other" .. d.class, 1, true), err)
    assert.is_nil(err:find("statement's request line", 1, true), err)
    -- the maker's initiation statement has the same lines, checked alike
    local initiation = common.statement(id, DEPLOYMENT, "initiation")
    rc, out, err = sign_with(initiation, { key.alice, document, plan, "--request", id, "--kind", "initiation" })
    assert.equal(0, rc, err)
    assert.equal(host.approver_sign(key.alice, initiation) .. "\n", out)
    assert.truthy(err:find("==> initiation statement (confirmed; digest and plan checked against their texts) for request "
      .. id .. " (confirmed)", 1, true), err)
    rc, out, err = sign_with(initiation, { key.alice, "--request", twin, "--kind", "initiation", "--unchecked" })
    assert.equal(1, rc, err)
    assert.equal("", out)
    -- --kind: an approver who asks to sign an approval is not given the
    -- request's initiation to sign (the same key makes them its maker)
    rc, out, err = sign_with(initiation, { key.alice, "--kind", "approval", "--request", id, "--unchecked" })
    assert.equal(1, rc, err)
    assert.equal("", out)
    assert.truthy(err:find("this is an initiation statement, and --kind says approval", 1, true), err)
    -- without the texts only when told: then the last line says so
    rc, out, err = sign_with(st, { "--kind", "approval", key.alice, "--request", id, "--unchecked" })
    assert.equal(0, rc, err)
    assert.truthy(err:find("==> approval statement (confirmed; digest and plan NOT checked against any text) for request "
      .. id .. " (confirmed)", 1, true), err)
    rc, out, err = sign_with(st, { key.alice, "--kind", "initiation", "--request", id, "--unchecked" })
    assert.equal(1, rc, err)
    assert.equal("", out)
    assert.truthy(err:find("this is an approval statement, and --kind says initiation", 1, true), err)
    -- a manual step's attestation: signed only for the step named with
    -- --step, and only as an attestation
    local attestation = common.statement(id, DEPLOYMENT, "attestation", "desk_confirmation")
    rc, out, err = sign_with(attestation, { key.alice, "--request", id, "--kind", "attestation",
      "--step", "desk_confirmation" })
    assert.equal(0, rc, err)
    assert.equal(host.approver_sign(key.alice, attestation) .. "\n", out)
    assert.truthy(err:find("==> attestation statement (confirmed; digest and plan NOT checked against any text) for step "
      .. "desk_confirmation (confirmed), request " .. id .. " (confirmed)", 1, true), err)
    rc, out, err = sign_with(attestation, { key.alice, "--request", id, "--kind", "attestation", "--step", "withdraw" })
    assert.equal(1, rc, err)
    assert.equal("", out)
    assert.truthy(err:find("statement: step desk_confirmation\n  expected:  step withdraw\n", 1, true), err)
    rc, out, err = sign_with(attestation, { key.alice, "--request", id, "--kind", "approval", "--unchecked" })
    assert.equal(1, rc, err)
    assert.truthy(err:find("this is an attestation statement, and --kind says approval", 1, true), err)
    rc, out, err = sign_with(st, { key.alice, "--request", id, "--kind", "attestation", "--step", "desk_confirmation" })
    assert.equal(1, rc, err)
    assert.truthy(err:find("this is an approval statement, and --kind says attestation", 1, true), err)
    -- usage errors (exit 2, no signature): unknown flags, a missing value,
    -- a flag twice, a request id that is not a lowercase uuid
    for _, c in ipairs({
      { { "--bogus", key.alice }, "unknown option '--bogus'" },
      { { key.alice, "-r", id }, "unknown option '-r'" },
      { { key.alice, "--request=" .. id }, "unknown option" },
      { { key.alice, "--request" }, "a value is missing after '--request'" },
      { { key.alice, "--request", "--class", d.class }, "a value is missing after '--request'" },
      { { key.alice, "--request", id, "--request", id }, "given twice: '--request'" },
      { { key.alice, "--class", d.class, "--class", d.class }, "given twice: '--class'" },
      { { key.alice, "--request", id:upper() }, "--request takes a lowercase uuid" },
      { { key.alice, "--request", id:sub(1, 35) }, "--request takes a lowercase uuid" },
      { { key.alice, "--request", (id:gsub("-", "")) }, "--request takes a lowercase uuid" },
      { { key.alice, "--request", "{" .. id .. "}" }, "--request takes a lowercase uuid" },
      { { key.alice, "--deployment", "spec desk" }, "--deployment takes a name" },
      { { key.alice, "--class", "Main" }, "--class takes a network class" },
      { { key.alice, document, "--request", id }, "DOCUMENT needs its PLAN" },
      { { "--request", id }, "needs a key FILE" },
      { { key.alice, "--kind", "approvals" }, "--kind takes approval, initiation or attestation, not 'approvals'" },
      { { key.alice, "--kind" }, "a value is missing after '--kind'" },
      { { key.alice, "--kind", "approval", "--kind", "approval" }, "given twice: '--kind'" },
      -- a key never signs a request nobody named, nor a kind nobody asked
      { { key.alice, document, plan, "--kind", "approval" }, "sign needs --request UUID" },
      { { key.alice, "--request", id }, "sign needs --kind approval, initiation or attestation" },
      -- an attestation names its step, from the operator's own records
      { { key.alice, "--request", id, "--kind", "attestation" }, "an attestation needs --step KEY" },
      { { key.alice, "--request", id, "--kind", "approval", "--step", "desk_confirmation" },
        "--step is an attestation's" },
      { { key.alice, "--request", id, "--kind", "attestation", "--step", "Desk" }, "--step takes a plan node key" },
      { { key.alice, "--request", id, "--kind", "attestation", "--step", "a b" }, "--step takes a plan node key" },
      { { key.alice }, "sign needs --request UUID" },
      -- an approval or an initiation is signed against its texts, or --unchecked
      { { key.alice, "--request", id, "--kind", "approval" }, "an approval needs its DOCUMENT and PLAN texts" },
      { { key.alice, "--request", id, "--kind", "initiation" }, "an initiation needs its DOCUMENT and PLAN texts" },
      { { key.alice, document, plan, "--request", id, "--kind", "approval", "--unchecked" },
        "--unchecked is for signing without DOCUMENT and PLAN" },
      { { key.alice, "--request", id, "--kind", "approval", "--unchecked", "--unchecked" }, "given twice: '--unchecked'" },
    }) do
      rc, out, err = sign_with(st, c[1])
      assert.equal(2, rc, c[2] .. ": " .. err)
      assert.equal("", out, c[2])
      assert.truthy(err:find(c[2], 1, true), c[2] .. ": " .. err)
      assert.truthy(err:find("usage: qtgd approver", 1, true), err)
    end
    -- without --deployment and --class: signed, those lines shown unconfirmed
    rc, out, err = sign_with(st, { key.alice, document, plan, "--kind", "approval", "--request", id })
    assert.equal(0, rc, err)
    assert.equal(signed .. "\n", out)
    assert.truthy(err:find("==> approval statement (confirmed; digest and plan checked against their texts) for request "
      .. id .. " (confirmed), class " .. d.class .. ", deployment " .. DEPLOYMENT .. "\n", 1, true), err)
  end)

  it("refuses every vote that would not count, and takes a quorum of two signed ones", function()
    local id, twin = create("32"), create("32")
    local st = statement(id)
    local refusals = {
      { alice, nil, 403, "signature" },
      { alice, "xyz", 422, "128 lowercase hex" },
      { alice, string.upper(host.approver_sign(key.alice, st)), 422, "128 lowercase hex" },
      { alice, host.approver_sign(key.bob, st), 403, "signature" },
      { alice, host.approver_sign(key.alice, statement(twin)), 403, "signature" },
      -- her signature of this very request in another deployment she approves for
      { alice, host.approver_sign(key.alice, statement(id, "other-desk")), 403, "signature" },
      { ivan, host.approver_sign(key.ivan, st), 403, "four eyes" },
      { mallory, host.approver_sign(key.mallory, st), 403, "not enrolled" },
    }
    for i, c in ipairs(refusals) do
      local r = approve(id, c[1], c[2])
      assert.equal(c[3], r.status, i .. ": " .. r.body)
      assert.truthy(r.body:find(c[4], 1, true), i .. ": " .. r.body)
    end
    assert.same({}, votes(id))
    -- alice's signature counts; the policy asks one, the enrolment two
    local r = approve(id, alice, host.approver_sign(key.alice, st))
    assert.equal(200, r.status, r.body)
    assert.equal("PENDING_APPROVAL", r.json.request_state)
    assert.equal(2, r.json.approvals_required)
    assert.equal(1, r.json.approval_policy.still_needed)
    assert.is_true(r.json.approvals[1].signed)
    -- a vote forged as the daemon's role (bob's principal, a made-up
    -- signature) is not counted by the daemon either
    local s = require("qtg").db.acquire()
    s:begin()
    s:exec("SET LOCAL ROLE qtg_runtime")
    s:query([[INSERT INTO request_approvals (request_id, principal, decision, approval_digest, signature)
              SELECT id, $2, 'approve', approval_digest, $3 FROM movement_requests WHERE id = $1::uuid]],
      id, "api:" .. names.bob, string.rep("cd", 64))
    s:commit()
    s:release()
    local detail = api.call(d, "GET", "/v3/requests/" .. id, { token = alice }).json
    assert.equal(1, detail.approval_policy.still_needed)
    assert.equal("PENDING_APPROVAL", detail.request_state)
    -- bob's own signature, on the twin (his row for the first is taken):
    -- the twin needs two too
    r = approve(twin, bob, host.approver_sign(key.bob, statement(twin)))
    assert.equal(200, r.status, r.body)
    assert.equal("PENDING_APPROVAL", r.json.request_state)
    r = approve(twin, alice, host.approver_sign(key.alice, statement(twin)))
    assert.equal(200, r.status, r.body)
    assert.not_equal("PENDING_APPROVAL", r.json.request_state)
    assert.truthy(rows("SELECT approved_at FROM movement_requests WHERE id = $1::uuid", twin)[1].approved_at)
    for _, v in ipairs(votes(twin)) do assert.equal(128, #v.signature) end
    -- the initiator's person attesting the twin's manual step under his
    -- other principal: refused (four eyes), as his vote was
    local manual = common.wait_for(function()
      for _, n in ipairs(api.call(d, "GET", "/v3/requests/" .. twin, { token = alice }).json.nodes) do
        if n.node_kind == "manual" and n.node_state == "READY" then return n end
      end
    end, 60, "the twin's manual step to be READY")
    r = api.call(d, "POST", "/v3/nodes/" .. manual.id .. "/complete",
      { token = ivan, key = common.uid("k", 4), json = { input = { desk_reference = "D-9" } } })
    assert.equal(403, r.status, r.body)
    assert.truthy(r.body:find("four eyes", 1, true), r.body)
  end)

  -- Under signed approvals a manual step is an attestation a person signs
  -- (sql/0206): the signer takes no manual step the runtime completed by
  -- itself.  Every completion that would not carry a valid attestation is
  -- refused and leaves the step READY.
  it("completes a manual step only with its attestation signed by an enrolled person", function()
    local id = create("34")
    for _, who in ipairs({ { alice, "alice" }, { bob, "bob" } }) do
      local r = approve(id, who[1], host.approver_sign(key[who[2]], statement(id)))
      assert.equal(200, r.status, r.body)
    end
    local manual = common.wait_for(function()
      for _, n in ipairs(api.call(d, "GET", "/v3/requests/" .. id, { token = alice }).json.nodes) do
        if n.node_kind == "manual" and n.node_state == "READY" then return n end
      end
    end, 60, "the manual step to be READY")
    local function attestation(step)
      return rows("SELECT qtg_attestation_statement(r, $2, $3) AS t FROM movement_requests r WHERE id = $1::uuid",
        id, DEPLOYMENT, step)[1].t
    end
    local want = attestation(manual.node_key)
    assert.equal(want, manual.manual.attestation_statement)
    assert.equal(statement(id):gsub("^qtg%-approval%-v3", "qtg-attestation-v1") .. "step " .. manual.node_key
      .. "\n", want)
    local function complete(token, sig)
      return api.check(doc, api.call(d, "POST", "/v3/nodes/" .. manual.id .. "/complete",
        { token = token, key = common.uid("k", 4), json = { input = { desk_reference = "D-10" }, signature = sig } }),
        "POST", "/v3/nodes/{id}/complete")
    end
    local stranger = api.every_class_token("read,operate", { name = common.uid("stranger", 4) })
    for i, c in ipairs({
      { alice, nil, 403, "attestation statement" },
      { alice, "xyz", 422, "128 lowercase hex" },
      { alice, host.approver_sign(key.bob, want), 403, "attestation statement" },
      { alice, host.approver_sign(key.alice, statement(id)), 403, "attestation statement" },
      { alice, host.approver_sign(key.alice, attestation("withdraw")), 403, "attestation statement" },
      { ivan, host.approver_sign(key.ivan, want), 403, "four eyes" },
      { stranger, host.approver_sign(key.mallory, want), 403, "not enrolled as a person" },
    }) do
      local r = complete(c[1], c[2])
      assert.equal(c[3], r.status, i .. ": " .. r.body)
      assert.truthy(r.body:find(c[4], 1, true), i .. ": " .. r.body)
    end
    local row = rows("SELECT node_state, attested_by FROM movement_request_nodes WHERE id = $1::uuid", manual.id)[1]
    assert.equal("READY", row.node_state)
    assert.equal(NULL_TEXT, tostring(row.attested_by))
    local sig = host.approver_sign(key.alice, want)
    local r = complete(alice, sig)
    assert.equal(200, r.status, r.body)
    row = rows([[SELECT node_state, attested_by, attestation_signature FROM movement_request_nodes
                  WHERE id = $1::uuid]], manual.id)[1]
    assert.same({ "COMPLETED", "api:" .. names.alice, sig }, { row.node_state, row.attested_by, row.attestation_signature })
    local shown
    for _, n in ipairs(r.json.nodes) do if n.id == manual.id then shown = n end end
    assert.truthy(shown, "the completed step is in the answer")
    assert.equal("api:" .. names.alice, shown.manual.attested_by)
  end)

  -- Revoking an approver: the file without them and a reload (SIGHUP), no
  -- restart.  Their vote is refused from then on; a file the reload cannot
  -- take refuses every vote until it is fixed.
  it("takes a revocation at a reload, and refuses every vote while the file is unreadable", function()
    local function reload()
      local before = select(2, (host.read(d.h.log) or ""):gsub("policy reloaded", ""))
      assert.is_true(common.signal(d.h, "HUP"))
      common.wait_for(function()
        return select(2, (host.read(d.h.log) or ""):gsub("policy reloaded", "")) > before
      end, 30, "the daemon's reload")
    end
    local id = create("33")
    finally(function() enrolment(); reload() end)
    enrolment("bob")
    reload()
    local r = approve(id, bob, host.approver_sign(key.bob, statement(id)))
    assert.equal(403, r.status, r.body)
    assert.truthy(r.body:find("not enrolled", 1, true), r.body)
    host.write(keydir .. "/approvers", "person bob\n")
    reload()
    assert.truthy((host.read(d.h.log) or ""):find("the approvers' enrolment cannot be read", 1, true))
    r = approve(id, alice, host.approver_sign(key.alice, statement(id)))
    assert.equal(503, r.status, r.body)
    assert.same({}, votes(id))
    enrolment()
    reload()
    r = approve(id, alice, host.approver_sign(key.alice, statement(id)))
    assert.equal(200, r.status, r.body)
  end)

  -- 'initiation signed': the maker of each request signs it first.  A
  -- client system is enrolled as an initiator (its key signs the requests
  -- it makes; it never approves); a maker nobody enrolled makes nothing.
  it("takes approvals only once the request's enrolled maker signed it (initiation signed)", function()
    names.bot = common.uid("bot", 4)
    local bot_key, bot_pub = host.approver_key(keydir, "bot")
    local path = keydir .. "/approvers-initiation"
    host.write(path, table.concat({ "deployment " .. DEPLOYMENT, "initiation signed",
      "person alice " .. select(2, host.run({}, { common.quote(host.bin), "approver", "public",
        common.quote(key.alice) })):match("ed25519:%x+") .. " api:" .. names.alice,
      "initiator bot " .. bot_pub .. " api:" .. names.bot, "quorum * 1", "" }, "\n"))
    os.execute("chmod 644 " .. common.quote(path))
    local bot = api.every_class_token("read,operate", { name = names.bot })
    local other = api.start({ MG_SIGNER_APPROVERS = path, MG_API_RATE_LIMIT_PER_SECOND = "1000",
                              MG_API_RATE_LIMIT_BURST = "1000" })
    local ok, err = pcall(function()
      local function call(token, method, route, json)
        return api.check(doc, api.call(other, method, route:gsub("{id}", json and json.id or ""),
          { token = token, key = method == "POST" and common.uid("k", 6) or nil, json = json and json.body }),
          method, route)
      end
      local body = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT }
      -- a maker nobody enrolled
      local r = call(operator, "POST", "/v3/requests", { body = body })
      assert.equal(403, r.status, r.body)
      assert.truthy(r.body:find("not enrolled as a person or an initiator", 1, true), r.body)
      r = call(bot, "POST", "/v3/requests", { body = body })
      assert.equal(201, r.status, r.body)
      local id = r.json.id
      assert.is_false(r.json.initiated)
      local initiation = r.json.initiation_statement
      assert.equal("qtg-initiation-v2\ndeployment " .. DEPLOYMENT .. "\nrequest " .. id .. "\n",
        initiation:match("^(.-\n.-\n.-\n)"))
      assert.equal(r.json.approval_statement:gsub("^[^\n]*", ""), (initiation:gsub("^[^\n]*", "")))
      -- not initiated: no approval taken, not in the inbox
      r = call(alice, "POST", "/v3/requests/{id}/approve",
        { id = id, body = { signature = host.approver_sign(key.alice, r.json.approval_statement) } })
      assert.equal(409, r.status, r.body)
      assert.truthy(r.body:find("not initiated yet", 1, true), r.body)
      for _, item in ipairs(call(alice, "GET", "/v3/approvals").json.items) do assert.not_equal(id, item.id) end
      -- initiated by another client, with the approval statement's
      -- signature, with a malformed one: refused, nothing stored
      local good = host.approver_sign(bot_key, initiation)
      r = call(ivan, "POST", "/v3/requests/{id}/initiate", { id = id, body = { signature = good } })
      assert.equal(403, r.status, r.body)
      assert.truthy(r.body:find("only its maker", 1, true), r.body)
      r = call(bot, "POST", "/v3/requests/{id}/initiate",
        { id = id, body = { signature = host.approver_sign(bot_key, statement(id)) } })
      assert.equal(403, r.status, r.body)
      r = call(bot, "POST", "/v3/requests/{id}/initiate", { id = id, body = { signature = "abc" } })
      assert.equal(422, r.status, r.body)
      assert.equal(NULL_TEXT, tostring(rows("SELECT initiation_signature FROM movement_requests WHERE id = $1::uuid",
        id)[1].initiation_signature))
      -- the maker's own signature: initiated, once
      r = call(bot, "POST", "/v3/requests/{id}/initiate", { id = id, body = { signature = good } })
      assert.equal(200, r.status, r.body)
      assert.is_true(r.json.initiated)
      r = call(bot, "POST", "/v3/requests/{id}/initiate", { id = id, body = { signature = good } })
      assert.equal(409, r.status, r.body)
      -- now in alice's inbox, and her signed vote approves it
      local listed = false
      for _, item in ipairs(call(alice, "GET", "/v3/approvals").json.items) do listed = listed or item.id == id end
      assert.is_true(listed)
      r = call(alice, "POST", "/v3/requests/{id}/approve",
        { id = id, body = { signature = host.approver_sign(key.alice, statement(id)) } })
      assert.equal(200, r.status, r.body)
      assert.not_equal("PENDING_APPROVAL", r.json.request_state)
    end)
    api.stop(other)
    assert(ok, err)
  end)

  it("stops at start on an enrolment it cannot take, and creates nothing for a class without a quorum", function()
    local bad = keydir .. "/bad-approvers"
    -- a malformed line, a class twice, no deployment named (a statement
    -- signed here must say which deployment it is for)
    for _, text in ipairs({ "deployment spec-desk\nperson x\n", "deployment spec-desk\nquorum * 2\nquorum * 3\n",
                            "quorum * 2\n" }) do
      host.write(bad, text)
      os.execute("chmod 644 " .. common.quote(bad))
      local h = host.start(host.base_env({ MG_API_LISTEN = "127.0.0.1:0", MG_SIGNER_APPROVERS = bad,
        MG_NETWORK_CLASS = common.uid("api", 4) }), { "run" })
      assert.equal(1, host.wait_exit(h, 30), text)
      assert.truthy((host.read(h.log) or ""):find("MG_SIGNER_APPROVERS", 1, true), text)
      -- `qtgd check` says the same before a start
      local rc, out = host.run(host.base_env({ MG_SIGNER_APPROVERS = bad }), { common.quote(host.bin), "check" })
      assert.not_equal(0, rc, out)
      assert.truthy(out:find("FAIL[^\n]*MG_SIGNER_APPROVERS"), out)
    end
    local _, out = host.run(host.base_env({ MG_SIGNER_APPROVERS = keydir .. "/approvers",
      MG_NETWORK_CLASS = d.class }), { common.quote(host.bin), "check" })
    assert.truthy(out:find("signed approvals: 3 persons enrolled, quorum 2 for " .. d.class
      .. ", deployment " .. DEPLOYMENT, 1, true), out)
    -- the amount tiers that can raise this class's quorum are named; another class's are not
    local tiered = keydir .. "/approvers-tiered"
    host.write(tiered, host.read(keydir .. "/approvers") .. "quorum " .. d.class .. " 3 above 1 ETH\n"
      .. "quorum * 4 above 1000000 USDC\nquorum elsewhere 2\nquorum elsewhere 5 above 2 ETH\n")
    os.execute("chmod 644 " .. common.quote(tiered))
    _, out = host.run(host.base_env({ MG_SIGNER_APPROVERS = tiered, MG_NETWORK_CLASS = d.class }),
      { common.quote(host.bin), "check" })
    assert.truthy(out:find("signed approvals: 3 persons enrolled, quorum 2 for " .. d.class .. " (quorum 3 for more"
      .. " than 1 ETH on " .. d.class .. "; quorum 4 for more than 1000000 USDC on any class), deployment "
      .. DEPLOYMENT, 1, true), out)
    assert.is_falsy(out:find("on elsewhere", 1, true), out)
    host.write(bad, "deployment spec-desk\nquorum mainnet 2\n")
    local other = api.start({ MG_SIGNER_APPROVERS = bad })
    local ok, err = pcall(function()
      local r = api.call(other, "POST", "/v3/requests", { token = operator, key = common.uid("k", 6),
        json = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT } })
      assert.equal(403, r.status, r.body)
      assert.truthy(r.body:find("no quorum for network class " .. other.class, 1, true), r.body)
      assert.equal(0, rows("SELECT count(*)::int AS n FROM movement_requests WHERE network_class = $1",
        other.class)[1].n)
    end)
    api.stop(other)
    assert(ok, err)
  end)

  it("/readyz fails while the signer counts approvals otherwise than this daemon asks them", function()
    local evm = require "spec.lua.support.evm"
    local dir = host.tmpdir()
    local mine, edited = dir .. "/approvers", dir .. "/approvers-edited"
    local text = host.read(keydir .. "/approvers")
    host.write(mine, text)
    host.write(edited, text .. "# bob revoked here, but only the signer was reloaded\n")
    os.execute("chmod 644 " .. common.quote(mine) .. " " .. common.quote(edited))
    local socket = dir .. "/signer.sock"
    local sd = api.start({ MG_SIGNER_APPROVERS = mine, MG_SIGNER_SOCKET = socket, MG_SIGNER_TIMEOUT_SECONDS = "2" })
    local function signer_check() return api.readyz(sd, doc, alice, "signer") end
    local function with_signer(env, check)
      env.MG_SIGNER_SOCKET = socket
      local h = evm.start_signer(evm.run_env("unused", env))
      local ok, err = pcall(check)
      evm.host.stop(h)
      assert(ok, err)
    end
    local ok, err = pcall(function()
      -- the same file: ready
      with_signer({ MG_SIGNER_APPROVERS = mine }, function()
        local r, c = signer_check()
        assert.equal(200, r.status, r.body)
        assert.equal("ok", c.status)
        assert.truthy(c.detail:find("counting the enrolment of deployment " .. DEPLOYMENT, 1, true), c.detail)
      end)
      -- another text (one of the two reloaded after an edit): not ready
      with_signer({ MG_SIGNER_APPROVERS = edited }, function()
        local r, c = signer_check()
        assert.equal(503, r.status, r.body)
        assert.equal("failing", c.status)
        assert.truthy(c.detail:find("give both the same MG_SIGNER_APPROVERS file", 1, true), c.detail)
      end)
      -- a signer counting unsigned rows under a daemon that asks signatures: not ready
      with_signer({ MG_SIGNER_KEYS = "sa=" .. evm.key_file(dir, "sa", evm.DEV[1].key),
                    MG_SIGNER_TRUST_APPROVAL_ROWS = "true" }, function()
        local r, c = signer_check()
        assert.equal(503, r.status, r.body)
        assert.truthy(c.detail:find("the signer has no enrolment and counts the approval rows as written", 1, true),
          c.detail)
      end)
    end)
    api.stop(sd)
    os.execute("rm -rf " .. common.quote(dir))
    assert(ok, err)
  end)
end)
