-- The signer roster (docs/callbacks.md section 5): the
-- expected identity set from the console, the observed identity written only
-- by executor_health from the signers' health(), and the posture derived
-- when the roster is read (match, mismatch, unobserved, unenrolled, orphan).
-- Real signer keys are held by `qtgd signer` processes beside child qtgd
-- processes, which ask them over the signer socket; the
-- answers a real signer cannot give (a zero address, a raise) are injected
-- in this process by swapping qtg.signer for the length of one tick.
local qtg = require "qtg"

local sup -- spec/lua/support/sidecar.lua
local signers = require "qtg.signers"

-- Well-known keys and their addresses (Anvil account 0; key 1; key 0x46 * 32).
local KEYS = {
  signer_a = { key = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80",
               address = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266" },
  signer_b = { key = string.rep("0", 63) .. "1", address = "0x7e5f4552091a69125d5dfcb7b8c2659029395bdf" },
  signer_c = { key = string.rep("46", 32), address = "0x9d8a62f656a8d1615c1294fd71e9cfb3e4855a4f" },
}
local ZERO = "0x0000000000000000000000000000000000000000"

local function by_key(rows)
  local out = {}
  for _, r in ipairs(rows) do out[r.signer_key] = r end
  return out
end

describe("signer identity", function()
  it("canonicalises addresses and refuses zero and malformed ones", function()
    assert.equals(KEYS.signer_a.address,
      signers.canonical_address("0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"))
    assert.equals(KEYS.signer_b.address, signers.canonical_address("0X7E5F4552091A69125D5DFCB7B8C2659029395BDF"))
    local bad = { [ZERO] = "zero", ["0X" .. string.rep("0", 40)] = "zero",
      ["0x1234"] = "40 hex", [KEYS.signer_a.address .. "00"] = "40 hex",
      ["f39fd6e51aad88f6f4ce6ab8827279cfffb9226600"] = "40 hex",
      ["0xg39fd6e51aad88f6f4ce6ab8827279cfffb92266"] = "40 hex", [""] = "40 hex" }
    for addr, why in pairs(bad) do
      local ok, err = signers.canonical_address(addr)
      assert.is_nil(ok, addr)
      assert.matches(why, err, 1, true)
    end
    assert.is_nil(signers.canonical_address(nil))
    assert.is_nil(signers.canonical_address(42))
  end)

  it("derives the posture from presence, observation and enrollment", function()
    local N = qtg.db.NULL
    local a, b = KEYS.signer_a.address, KEYS.signer_b.address
    local cases = {
      { { runtime_present = false, observed_signer_address = N, expected_signer_address = a }, "orphan" },
      { { runtime_present = false, observed_signer_address = N, expected_signer_address = N }, "orphan" },
      { { runtime_present = true, observed_signer_address = N, expected_signer_address = a }, "unobserved" },
      { { runtime_present = true, observed_signer_address = N, expected_signer_address = N }, "unobserved" },
      { { runtime_present = true, observed_signer_address = a, expected_signer_address = N }, "unenrolled" },
      { { runtime_present = true, observed_signer_address = a, expected_signer_address = a }, "match" },
      { { runtime_present = true, observed_signer_address = a, expected_signer_address = b }, "mismatch" },
    }
    for i, c in ipairs(cases) do assert.equals(c[2], signers.posture(c[1]), "case " .. i) end
  end)
end)

describe("signer roster", function()
  local s, dir, files

  setup(function()
    sup = require "spec.lua.support.sidecar"
    s = qtg.db.acquire()
    dir = sup.tmpdir()
    files = {}
    for name, k in pairs(KEYS) do
      files[name] = dir .. "/" .. name .. ".hex"
      sup.write_file(files[name], k.key .. "\n", "600")
    end
  end)
  teardown(function()
    if s:in_transaction() then s:rollback() end
    s:release()
    sup.cleanup()
  end)

  local function signer_keys(names)
    local parts = {}
    for i, n in ipairs(names) do parts[i] = n .. "=" .. files[n] end
    return table.concat(parts, ",")
  end

  -- one executor_health pass of a child qtgd whose signer (a `qtgd signer`
  -- beside it) holds the keys `names` (none: no signer runs at all)
  local function health_pass(name, class, names)
    local evm = require "spec.lua.support.evm"
    local socket = dir .. "/" .. name .. "-signer/signer.sock"
    local signer
    if #names > 0 then
      signer = evm.start_signer(evm.run_env(class, { MG_SIGNER_KEYS = signer_keys(names),
                                                      MG_SIGNER_SOCKET = socket }))
    end
    local rc = sup.wait_child(sup.start_child(dir, name,
      { MG_NETWORK_CLASS = class, MG_SIGNER_SOCKET = socket },
      { "executor_health", "30", "once" }), 120)
    if signer then evm.host.stop(signer, 30) end
    return rc
  end

  local function roster(class) return by_key(signers.roster(s, class)) end

  local function signer_health(class)
    return by_key(s:query([[SELECT component_name AS signer_key, * FROM component_health
                             WHERE network_class = $1 AND component_kind = 'signer']], class))
  end

  local function enroll(class, key, addr)
    return signers.set_expected_identity(s, key, addr, "console:spec", class)
  end

  it("observes the loaded signers and derives match, mismatch, unenrolled and orphan", function()
    local class = sup.uid("signers")
    enroll(class, "signer_a", "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266") -- its own address
    enroll(class, "signer_b", KEYS.signer_c.address)                         -- someone else's
    enroll(class, "signer_ghost", KEYS.signer_a.address)                     -- never loaded
    local enrolled = roster(class)
    assert.equals("orphan", enrolled.signer_a.posture) -- not observed by any process yet

    health_pass("hp1", class, { "signer_a", "signer_b", "signer_c" })
    local r = roster(class)
    assert.equals("match", r.signer_a.posture)
    assert.equals(KEYS.signer_a.address, r.signer_a.observed_signer_address)
    assert.equals("mismatch", r.signer_b.posture)
    assert.equals(KEYS.signer_b.address, r.signer_b.observed_signer_address)
    assert.equals("unenrolled", r.signer_c.posture)
    assert.equals(KEYS.signer_c.address, r.signer_c.observed_signer_address)
    assert.equals("orphan", r.signer_ghost.posture)
    -- executor_health never writes the expected identity
    for _, k in ipairs({ "signer_a", "signer_b", "signer_ghost" }) do
      assert.equals(enrolled[k].expected_signer_address, r[k].expected_signer_address)
      assert.equals(enrolled[k].expected_set_at, r[k].expected_set_at)
      assert.equals("console:spec", r[k].expected_set_by)
    end
    local h = signer_health(class)
    for _, k in ipairs({ "signer_a", "signer_b", "signer_c" }) do
      assert.equals("healthy", h[k].health_state)
    end

    -- signer_b and signer_c are no longer loaded: orphans, observations cleared
    health_pass("hp2", class, { "signer_a" })
    r = roster(class)
    assert.equals("match", r.signer_a.posture)
    for _, k in ipairs({ "signer_b", "signer_c" }) do
      assert.equals("orphan", r[k].posture)
      assert.is_false(r[k].runtime_present)
      assert.equals(qtg.db.NULL, r[k].observed_signer_address)
    end
    assert.equals(KEYS.signer_c.address, r.signer_b.expected_signer_address) -- enrollment kept
    h = signer_health(class)
    assert.equals("unknown", h.signer_b.health_state)
    assert.equals("no longer registered in this runtime", h.signer_b.last_error)

    -- loaded again: observed again
    health_pass("hp3", class, { "signer_a", "signer_b" })
    assert.equals("mismatch", roster(class).signer_b.posture)
    -- re-enrolled with its real address: match
    enroll(class, "signer_b", KEYS.signer_b.address)
    assert.equals("match", roster(class).signer_b.posture)
  end)

  it("refuses to enroll a zero or malformed address, a bad key name or no actor, writing nothing", function()
    local before = s:query("SELECT count(*)::int AS n FROM signer_roster")[1].n
    local audits = s:query([[SELECT count(*)::int AS n FROM audit_outbox
                              WHERE action = 'signer.expected_identity.set']])[1].n
    for _, c in ipairs({ { "signer_z", ZERO, "zero signer address refused" },
        { "signer_z", "0x1234", "40 hex" }, { "signer_z", nil, "missing" },
        { "bad key!", KEYS.signer_a.address, "signer key" }, { "", KEYS.signer_a.address, "signer key" },
        { "signer_z", KEYS.signer_a.address, "actor", "" } }) do
      local ok, err = pcall(signers.set_expected_identity, s, c[1], c[2], c[4] == nil and "console:spec" or c[4])
      assert.is_false(ok)
      assert.matches(c[3], tostring(err), 1, true)
    end
    assert.equals(before, s:query("SELECT count(*)::int AS n FROM signer_roster")[1].n)
    assert.equals(audits, s:query([[SELECT count(*)::int AS n FROM audit_outbox
                                     WHERE action = 'signer.expected_identity.set']])[1].n)
    -- the database refuses a zero or mixed-case address whoever writes
    for _, addr in ipairs({ ZERO, "0xF39FD6E51AAD88F6F4CE6AB8827279CFFFB92266" }) do
      assert.has_error(function()
        s:query([[INSERT INTO signer_roster (network_class, signer_key, observed_signer_address,
                                             runtime_present) VALUES ('spec-db', 'k', $1, true)]], addr)
      end)
    end
    -- an enrollment is audited
    local row = signers.set_expected_identity(s, "signer_audited", KEYS.signer_c.address, "console:spec")
    assert.equals(KEYS.signer_c.address, row.expected_signer_address)
    local a = s:query([[SELECT * FROM audit_outbox WHERE action = 'signer.expected_identity.set'
                         AND entity_id = $1]], qtg.settings.network_class .. "/signer_audited")
    assert.equals(1, #a)
    assert.equals(KEYS.signer_c.address, a[1].detail.expected_signer_address)
  end)

  it("refuses a zero address from health(), clearing the observation (unobserved), and records failing signers", function()
    local class = qtg.settings.network_class
    s:query("DELETE FROM signer_roster WHERE network_class = $1", class)
    local real = qtg.signer
    local answers = {
      z_zero = { ok = true, signer_address = KEYS.signer_a.address },
      z_down = { ok = false, error = "hsm offline", code = "INTERNAL" },
    }
    local fake = {
      keys = function() return { "z_zero", "z_down", "z_raises" } end,
      health = function(name)
        if name == "z_raises" then error("driver crashed") end
        return answers[name]
      end,
    }
    local function pass()
      qtg.signer = fake
      local ok, err = pcall(function()
        local s2 = qtg.db.acquire()
        local ok2, e2 = pcall(require("qtg.workers.executor_health").tick, s2)
        if s2:in_transaction() then s2:rollback() end
        s2:release()
        if not ok2 then error(e2, 0) end
      end)
      qtg.signer = real
      if not ok then error(err, 0) end
    end
    pass()
    local r = roster(class)
    assert.equals("unenrolled", r.z_zero.posture)
    assert.equals(KEYS.signer_a.address, r.z_zero.observed_signer_address)
    -- now it reports the zero address: refused, and the earlier observation is cleared
    answers.z_zero = { ok = true, signer_address = ZERO }
    pass()
    r = roster(class)
    assert.equals(qtg.db.NULL, r.z_zero.observed_signer_address)
    assert.equals("unobserved", r.z_zero.posture)
    assert.is_true(r.z_zero.runtime_present)
    local h = signer_health(class)
    assert.matches("zero signer address refused", h.z_zero.last_error, 1, true)
    assert.equals("zero signer address refused", h.z_zero.detail.identity_error)
    assert.equals("down", h.z_down.health_state)
    assert.matches("hsm offline", h.z_down.last_error, 1, true)
    assert.equals("unobserved", r.z_down.posture)
    assert.equals("down", h.z_raises.health_state)
    assert.matches("driver crashed", h.z_raises.last_error, 1, true)
    -- a signer binding without health(): unknown, nothing observed
    fake.health = nil
    pass()
    h = signer_health(class)
    assert.equals("unknown", h.z_down.health_state)
    assert.equals("unobserved", roster(class).z_down.posture)
    assert.equals(real, qtg.signer)
  end)
end)
