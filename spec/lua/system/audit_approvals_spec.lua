-- qtg.audit_approvals and `qtgd audit verify --approvers FILE`: every
-- request past its approval is checked against an enrolment as qtgd signer
-- would count it.  The runtime role can set a request APPROVED with votes
-- nobody signed, and an executor that moves money with the daemon's own
-- credentials never asks the signer: this is where such a request shows.
-- Each forged case is written as an attacker with the runtime's rows would
-- leave it; the real ones are signed by `qtgd approver sign`.
local qtg = require "qtg"
local support = require "spec.lua.support.host"
local common = require "spec.lua.support.common"
local audit_approvals = require "qtg.audit_approvals"

local q = common.quote
local DEPLOYMENT = "audit-approvals-spec"

-- An enrolment of persons (name -> key path) with quorums; its file's path.
local function enrolment(dir, people, quorums, more)
  local e = { key = {}, path = dir .. "/approvers" }
  local lines = { "deployment " .. DEPLOYMENT }
  for _, name in ipairs(people) do
    local path, pub = support.approver_key(dir, name)
    e.key[name] = path
    lines[#lines + 1] = ("person %s %s operator:%s"):format(name, pub, name)
  end
  for class, n in pairs(quorums) do lines[#lines + 1] = ("quorum %s %d"):format(class, n) end
  for _, l in ipairs(more or {}) do lines[#lines + 1] = l end
  common.write(e.path, table.concat(lines, "\n") .. "\n")
  os.execute("chmod 644 " .. q(e.path))
  return e
end

describe("qtg.audit_approvals", function()
  local s, sup, dir, e, key, class
  local function uid() return sup.uid():lower():gsub("[^a-z0-9]", "") end

  setup(function()
    sup = require "spec.lua.support.engine"
    s = qtg.db.acquire()
    dir = support.tmpdir()
    key = "spec_aa_" .. uid()
    sup.load_doc(s, sup.doc(key, { { "a", "action", "withdrawal", { sim = { observes = 0 } } } }))
    class = "aa-" .. uid()
    e = enrolment(dir, { "alice", "bob", "carol" }, { [class] = 2 })
  end)
  teardown(function()
    s:release()
    os.execute("rm -rf " .. q(dir))
  end)

  local function new_request(in_class)
    local id = sup.create(s, key, { callback_url = false }).id
    sup.move_class(s, id, in_class or class)
    s:query("UPDATE movement_requests r SET approval_digest = qtg_approval_digest(r) WHERE id = $1::uuid", id)
    return id
  end
  -- a vote as the runtime role writes one: signed by who's key, or not
  local function vote(id, who, signed, decision)
    local sig = signed and support.approver_sign(e.key[who], common.statement(id, DEPLOYMENT)) or nil
    s:query([[INSERT INTO request_approvals (request_id, principal, decision, approval_digest, signature)
              SELECT id, $2, $3, approval_digest, $4 FROM movement_requests WHERE id = $1::uuid]],
      id, "operator:" .. who, decision or "approve", sig)
  end
  local function approved(id)
    s:query("UPDATE movement_requests SET request_state = 'APPROVED', approved_at = now() WHERE id = $1::uuid", id)
    return id
  end
  -- alice's and bob's signed votes: the enrolment's quorum
  local function signed_by_two(id)
    vote(id, "alice", true)
    vote(id, "bob", true)
    return id
  end
  -- id -> its problems, for the requests of this spec
  local function problems(ids)
    local loaded = assert(qtg.approvers.load(e.path))
    local r = audit_approvals.check(s, loaded, 1000000)
    local mine, out = {}, {}
    for _, id in ipairs(ids) do mine[id] = true end
    for _, m in ipairs(r.list) do
      if mine[m.id] then out[m.id] = table.concat(m.problems, "; ") end
    end
    assert.is_true(r.checked >= #r.list)
    return out
  end

  it("passes a request two enrolled persons signed, and names each way a request past approval falls short", function()
    local good = approved(signed_by_two(new_request()))
    -- one real signature and a vote of a principal nobody enrolled
    local forged = new_request()
    vote(forged, "alice", true)
    vote(forged, "mallory", false)
    approved(forged)
    -- an enrolled person's vote without a signature
    local unsigned = new_request()
    vote(unsigned, "alice", true)
    vote(unsigned, "bob", false)
    approved(unsigned)
    -- two signatures, and a rejection
    local rejected = signed_by_two(new_request())
    vote(rejected, "carol", true, "reject")
    approved(rejected)
    -- a class the enrolment does not name
    local elsewhere = approved(signed_by_two(new_request(class .. "-other")))
    -- approvals_required above the enrolment's quorum (written while pending)
    local three = new_request()
    s:query("UPDATE movement_requests SET approvals_required = 3 WHERE id = $1::uuid", three)
    approved(signed_by_two(three))
    -- what was approved changed afterwards, past the freeze (the owner)
    local changed = approved(signed_by_two(new_request()))
    common.unfrozen(s, [[UPDATE movement_requests SET intent = jsonb_set(intent, '{amount}', '"900"')
                         WHERE id = $1::uuid]], changed)
    -- signed votes recorded for another digest (an earlier version of the request)
    local stale = approved(signed_by_two(new_request()))
    common.unfrozen(s, "UPDATE request_approvals SET approval_digest = repeat('0', 64) WHERE request_id = $1::uuid",
      stale)
    -- waiting on a manual step, its approved_at cleared: past its approval by its state
    local waiting = new_request()
    s:query("UPDATE movement_requests SET request_state = 'APPROVED' WHERE id = $1::uuid", waiting)
    s:query("UPDATE movement_requests SET request_state = 'WAITING_MANUAL_ACTION', approved_at = NULL "
      .. "WHERE id = $1::uuid", waiting)
    -- still pending, no vote: not past its approval
    local pending = new_request()
    -- still pending by its state, but a node of it was dispatched
    local dispatched = new_request()
    s:query("UPDATE movement_request_nodes SET attempt_no = 1 WHERE request_id = $1::uuid", dispatched)

    local p = problems({ good, forged, unsigned, rejected, elsewhere, three, changed, stale, waiting, pending, dispatched })
    assert.is_nil(p[good])
    assert.is_nil(p[pending])
    assert.equals("1 signed approval of 2 asked (2 approve votes recorded)", p[forged])
    assert.equals("1 signed approval of 2 asked (2 approve votes recorded)", p[unsigned])
    assert.equals("operator:carol rejected it", p[rejected])
    assert.matches("^the enrolment asks nothing of it %(.*" .. (class .. "-other"):gsub("%-", "%%-")
      .. ".*%): the signer signs nothing of it$", p[elsewhere])
    assert.equals("2 signed approvals of 3 asked (2 approve votes recorded)", p[three])
    -- the statement shows the intent too: the signatures no longer verify either
    assert.equals("its approval digest is not the one its columns give: no signature covers what it is; "
      .. "0 signed approvals of 2 asked (2 approve votes recorded)", p[changed])
    assert.equals("0 signed approvals of 2 asked (0 approve votes recorded)", p[dispatched])
    assert.equals("0 signed approvals of 2 asked (0 approve votes recorded)", p[stale])
    assert.equals("0 signed approvals of 2 asked (0 approve votes recorded)", p[waiting])
  end)

  it("never counts the initiator's person, nor one person twice", function()
    local id = new_request()
    s:query([[UPDATE movement_requests SET created_by = 'operator:alice' WHERE id = $1::uuid]], id)
    s:query("UPDATE movement_requests r SET approval_digest = qtg_approval_digest(r) WHERE id = $1::uuid", id)
    approved(signed_by_two(id))
    assert.equals("1 signed approval of 2 asked (2 approve votes recorded)", problems({ id })[id])
  end)

  -- A manual step completed with no attestation a person signed (the
  -- runtime set it COMPLETED itself), or with one that does not hold:
  -- the signer would not have signed past it (STEP_NOT_ATTESTED).
  it("names each manual step completed without an enrolled person's attestation", function()
    local gated = "spec_aa_gate_" .. uid()
    sup.load_doc(s, sup.doc(gated, { { "gate", "manual", "manual_confirmation" },
                                     { "a", "action", "withdrawal", { sim = { observes = 0 } } } },
                            { { "gate", "a" } }))
    local function completed(by, signer, step, maker)
      local id = sup.create(s, gated, { callback_url = false }).id
      sup.move_class(s, id, class)
      if maker then s:query("UPDATE movement_requests SET created_by = $2 WHERE id = $1::uuid", id, maker) end
      s:query("UPDATE movement_requests r SET approval_digest = qtg_approval_digest(r) WHERE id = $1::uuid", id)
      approved(signed_by_two(id))
      local sig
      if signer then
        local st = s:query("SELECT qtg_attestation_statement(r, $2, $3) AS t FROM movement_requests r WHERE id = $1::uuid",
          id, DEPLOYMENT, step or "gate")[1].t
        sig = support.approver_sign(e.key[signer], st)
      end
      s:query([[UPDATE movement_request_nodes SET node_state = 'READY'
                 WHERE request_id = $1::uuid AND node_key = 'gate' AND node_state = 'BLOCKED']], id)
      s:query([[UPDATE movement_request_nodes SET node_state = 'COMPLETED', attested_by = $2,
                       attestation_signature = $3 WHERE request_id = $1::uuid AND node_key = 'gate']],
        id, by and "operator:" .. by or nil, sig)
      return id
    end
    local good = completed("carol", "carol")
    local bare = completed(nil, nil)
    local stranger = completed("mallory", "carol")
    local forged = completed("carol", "alice")
    local other_step = completed("carol", "carol", "a")
    -- the maker attesting her own request's step
    local own = completed("carol", "carol", nil, "operator:carol")
    local p = problems({ good, bare, stranger, forged, other_step, own })
    assert.is_nil(p[good])
    assert.equals("manual step gate was completed without a person's attestation", p[bare])
    assert.equals("manual step gate was attested by operator:mallory, who is no enrolled person", p[stranger])
    assert.equals("manual step gate carries an attestation operator:carol did not sign", p[forged])
    assert.equals("manual step gate carries an attestation operator:carol did not sign", p[other_step])
    assert.equals("manual step gate was attested by operator:carol, who made the request", p[own])
  end)
end)

-- The command, on a database of its own: requests the engine approved
-- with unsigned votes, then signed for.
describe("qtgd audit verify --approvers", function()
  local s, db, url, dir
  local CHILD = [[
local root = ...
package.path = root .. "/?.lua;" .. package.path
local qtg = require "qtg"
local sup = require "spec.lua.support.engine"
local s = qtg.db.acquire()
sup.load_doc(s, sup.doc("spec_aa_own", { { "a", "action", "withdrawal", { sim = { observes = 0 } } } }))
for i = 1, 2 do
  local r = sup.create_approved(s, "spec_aa_own", { intent = { asset = "USDC", amount = tostring(i) } })
  io.stdout:write("request=", r.id, " class=", r.network_class, "\n")
end
sup.create(s, "spec_aa_own")
return 0]]

  local function psql(sql) return common.psql(url, sql) end
  local function verify(...)
    return support.run(support.base_env({ MG_DATABASE_URL = url }), { q(support.bin), "audit", "verify", ... })
  end

  local ids, e = {}, nil
  setup(function()
    s = qtg.db.acquire()
    dir = support.tmpdir()
    local out
    url, db, out = support.own_database(s, "qtg_aa", dir, CHILD)
    local class
    for id, c in out:gmatch("request=([%x%-]+) class=(%S+)") do ids[#ids + 1], class = id, c end
    assert.equals(2, #ids, out)
    e = enrolment(dir, { "alice", "bob" }, { [class] = 2 })
  end)
  teardown(function()
    support.drop_database(s, db)
    s:release()
    os.execute("rm -rf " .. q(dir))
  end)

  local function sign(id, who)
    -- psql ends the value with a newline of its own
    local st = psql(("SELECT qtg_approval_statement(r, '%s') FROM movement_requests r WHERE id = '%s'")
      :format(DEPLOYMENT, id)):gsub("\n$", "", 1)
    local sig = support.approver_sign(e.key[who], st)
    psql(([[INSERT INTO request_approvals (request_id, principal, decision, approval_digest, signature)
            SELECT id, 'operator:%s', 'approve', approval_digest, '%s' FROM movement_requests WHERE id = '%s']])
      :format(who, sig, id))
  end

  it("exits 1 naming each request approved without the signatures, and 0 once they are there", function()
    local rc, out = verify("--approvers", q(e.path))
    assert.equals(1, rc, out)
    assert.matches("audit verify: APPROVED WITHOUT SIGNATURES: 2 of 2 requests past their approval lack what "
      .. e.path .. " asks", out, 1, true)
    for _, id in ipairs(ids) do
      assert.matches("  request " .. id .. " (APPROVED, class ", out, 1, true)
    end
    assert.matches("0 signed approvals of 2 asked (1 approve vote recorded)", out, 1, true)
    -- the other checks still run and hold
    assert.matches("audit verify: ok, 3 nodes and 3 requests are in the state their last audit row names", out, 1, true)
    sign(ids[1], "alice")
    sign(ids[1], "bob")
    rc, out = verify("--approvers", q(e.path))
    assert.equals(1, rc, out)
    assert.matches("1 of 2 requests past their approval", out, 1, true)
    assert.is_nil(out:find(ids[1], 1, true), out)
    sign(ids[2], "alice")
    sign(ids[2], "bob")
    rc, out = verify("--approvers", q(e.path))
    assert.equals(0, rc, out)
    assert.matches("audit verify: ok, 2 requests past their approval carry the signed approvals "
      .. e.path .. " asks", out, 1, true)
  end)

  it("exits 2 on a file that is not an enrolment, or none", function()
    local bad = dir .. "/not-an-enrolment"
    common.write(bad, "person alice nonsense\n")
    os.execute("chmod 644 " .. q(bad))
    for _, path in ipairs({ bad, dir .. "/missing" }) do
      local rc, out = verify("--approvers", q(path))
      assert.equals(2, rc, out)
      assert.matches("qtgd audit verify: cannot use the enrolment: ", out, 1, true)
    end
    local rc, out = verify("--approvers")
    assert.equals(2, rc, out)
    assert.matches("usage: qtgd audit verify", out, 1, true)
  end)
end)
