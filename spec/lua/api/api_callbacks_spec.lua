-- api_callbacks_spec: each API client's callbacks are signed with its own
-- key (derived from the host key, src/lua_api_keys.c), sent with its key id
-- in X-QTG-Callback-Key-Id, and verified by tools/callback-verify inside
-- real receivers (tools/fake-receiver): one client's key does not verify
-- another's callbacks, and rotation keeps the old and the new key valid at
-- the receiver while rows signed with either are delivered.
local qtg = require "qtg"
local cjson = require "cjson"

local api, sup, common, host
local d, dir, key_path
local KEY = "api-spec-host-callback-key-0123456789"

local function client(env)
  local tok, name, out = api.token("read,operate,approve", { env = env })
  local key_id, key = out:match("key id ([cm]%.[%w%._-]+%.%d+), key (%x+)")
  assert(key_id and #key == 64, out)
  return { token = tok, name = name, key_id = key_id, key = key }
end

local function create(c, url, daemon)
  local r = api.call(daemon or d, "POST", "/v3/requests", { token = c.token, key = common.uid("k", 4),
    json = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT, callback_url = url } })
  assert(r.status == 201, r.body)
  return r.json.id
end

local function deliveries(rcv, n)
  return common.wait_for(function()
    local got = sup.received(rcv)
    return #got >= n and got, #got
  end, 30, "callbacks at " .. rcv.url)
end

describe("callbacks of API clients", function()
  local env
  setup(function()
    api = require "spec.lua.support.api"
    sup = require "spec.lua.support.sidecar"
    common = require "spec.lua.support.common"
    host = require "spec.lua.support.host"
    dir = sup.tmpdir()
    key_path = sup.key_file(dir, "host", KEY)
    env = { MG_CALLBACK_KEY_FILE = key_path, MG_CALLBACK_KEY_ID = "k1" }
    d = api.start({ MG_CALLBACK_KEY_FILE = key_path, MG_CALLBACK_KEY_ID = "k1",
                    MG_CALLBACK_DISPATCH_INTERVAL_SECONDS = "0.2", MG_CALLBACK_MAX_ATTEMPTS = "1" })
  end)
  teardown(function()
    api.stop(d)
    host.stop_all()
    sup.cleanup()
  end)

  it("signs each client's callbacks with its own key, which verifies only its own", function()
    local a, b = client(env), client(env)
    assert.not_equal(a.key, b.key)
    assert.not_equal(KEY, a.key)
    local a_file = sup.key_file(dir, a.name, a.key)
    local b_file = sup.key_file(dir, b.name, b.key)
    local rcv_a = sup.start_receiver(dir, "a", { mode = "ok", keys = { [a.key_id] = a_file } })
    local rcv_b = sup.start_receiver(dir, "b", { mode = "ok", keys = { [b.key_id] = b_file } })
    -- B's key presented under A's key id: what B could do to forge A's callbacks
    local forged = sup.start_receiver(dir, "forged", { mode = "ok", keys = { [a.key_id] = b_file } })
    create(a, rcv_a.url)
    create(b, rcv_b.url)
    create(a, forged.url)
    local got_a, got_b, got_f = deliveries(rcv_a, 1), deliveries(rcv_b, 1), deliveries(forged, 1)
    assert.is_true(got_a[1].verdict.ok, cjson.encode(got_a[1].verdict))
    assert.equal(a.key_id, got_a[1].verdict.key_id)
    assert.equal(a.key_id, sup.header(got_a[1], "X-QTG-Callback-Key-Id"))
    assert.is_true(got_b[1].verdict.ok, cjson.encode(got_b[1].verdict))
    assert.equal(b.key_id, sup.header(got_b[1], "X-QTG-Callback-Key-Id"))
    assert.is_false(got_f[1].verdict.ok)
    assert.equal("signature_mismatch", got_f[1].verdict.reason)
    -- the v3 message is unchanged: HMAC(client key, ts \n nonce \n sha256(body))
    local e = got_a[1]
    local expect = qtg.crypto.hmac_sha256_hex(a.key, sup.header(e, "X-QTG-Callback-Timestamp") .. "\n"
      .. sup.header(e, "X-QTG-Callback-Nonce") .. "\n" .. qtg.crypto.sha256_hex(e.body))
    assert.equal(expect, sup.header(e, "X-QTG-Callback-Signature"))
    assert.equal("v3", sup.header(e, "X-QTG-Callback-Signature-Version"))
    -- nothing secret is stored: no column holds a client key
    for _, row in ipairs(common.query("SELECT * FROM api_clients WHERE name = $1", a.name)) do
      for k, v in pairs(row) do assert.falsy(tostring(v):find(a.key, 1, true), k) end
    end
  end)

  -- Derived from the host key, a client's key was computable by every
  -- holder of the host key (the receivers of operator callbacks), and a
  -- rotation of the host key changed it under the same id.
  it("derives the keys of clients made with MG_CALLBACK_CLIENT_KEY_FILE from that secret alone", function()
    local SECRET = string.rep("5a", 32)
    local secret_file = sup.key_file(dir, "clients", SECRET)
    local menv = { MG_CALLBACK_KEY_FILE = key_path, MG_CALLBACK_KEY_ID = "k1", MG_CALLBACK_CLIENT_KEY_FILE = secret_file }
    local legacy = client(env)   -- made before the clients' secret: scheme c
    local dm = api.start({ MG_CALLBACK_KEY_FILE = key_path, MG_CALLBACK_KEY_ID = "k1",
                           MG_CALLBACK_CLIENT_KEY_FILE = secret_file,
                           MG_CALLBACK_DISPATCH_INTERVAL_SECONDS = "0.2", MG_CALLBACK_MAX_ATTEMPTS = "1" })
    local ok, err = pcall(function()
      local m = client(menv)
      assert.equal("m." .. m.name .. ".1", m.key_id)
      local label = "qtg api client callback key\n" .. m.key_id
      local secret_bytes = SECRET:gsub("%x%x", function(h) return string.char(tonumber(h, 16)) end)
      assert.equal(qtg.crypto.hmac_sha256_hex(secret_bytes, label), m.key)
      -- what a holder of the host key computes for that id verifies nothing
      local forged_key = qtg.crypto.hmac_sha256_hex(KEY, label)
      assert.not_equal(forged_key, m.key)
      local rcv = sup.start_receiver(dir, "m-own", { mode = "ok", keys = { [m.key_id] = sup.key_file(dir, "m-own", m.key) } })
      local forged = sup.start_receiver(dir, "m-forged", { mode = "ok",
        keys = { [m.key_id] = sup.key_file(dir, "m-forged", forged_key) } })
      create(m, rcv.url, dm)
      create(m, forged.url, dm)
      local got, got_f = deliveries(rcv, 1), deliveries(forged, 1)
      assert.is_true(got[1].verdict.ok, cjson.encode(got[1].verdict))
      assert.equal(m.key_id, sup.header(got[1], "X-QTG-Callback-Key-Id"))
      assert.equal("signature_mismatch", got_f[1].verdict.reason)
      -- another host key: the same client key
      local other_host = sup.key_file(dir, "host-2", KEY .. "-rotated")
      local rc, out = api.tokens_cli({ "callback-key", m.name },
        { MG_CALLBACK_KEY_FILE = other_host, MG_CALLBACK_CLIENT_KEY_FILE = secret_file })
      assert.equal(0, rc, out)
      assert.truthy(out:find(m.key, 1, true), out)
      -- without the clients' secret, such a key is not made from the host key
      rc, out = api.tokens_cli({ "callback-key", m.name }, env)
      assert.falsy(out:find(forged_key, 1, true), out)
      assert.truthy(out:find("MG_CALLBACK_CLIENT_KEY_FILE", 1, true), out)
      -- a client made before moves onto the clients' secret at its rotation
      rc, out = api.tokens_cli({ "callback-key", legacy.name, "--next" }, menv)
      assert.equal(0, rc, out)
      assert.truthy(out:find("key id m." .. legacy.name .. ".2", 1, true), out)
      rc, out = api.tokens_cli({ "rotate-callback-key", legacy.name }, menv)
      assert.equal(0, rc, out)
      assert.equal("m", common.query("SELECT key_scheme FROM api_clients WHERE name = $1", legacy.name)[1].key_scheme)
      -- a bad secret file stops the process that would use it
      local bad = dir .. "/bad-clients.key"
      sup.write_file(bad, "not hex\n")
      os.execute("chmod 600 " .. common.quote(bad))
      rc, out = api.tokens_cli({ "callback-key", m.name }, { MG_CALLBACK_KEY_FILE = key_path, MG_CALLBACK_CLIENT_KEY_FILE = bad })
      assert.not_equal(0, rc, out)
      assert.truthy(out:find("MG_CALLBACK_CLIENT_KEY_FILE", 1, true), out)
    end)
    api.stop(dm)
    assert(ok, err)
  end)

  it("rotates with both keys valid at the receiver meanwhile", function()
    local a = client(env)
    local rc, out = api.tokens_cli({ "callback-key", a.name, "--next" }, env)
    assert.equal(0, rc, out)
    local next_id, next_key = out:match("key id (c%.[%w%._-]+%.%d+).-\n(%x+)")
    assert.equal("c." .. a.name .. ".2", next_id)
    local rcv = sup.start_receiver(dir, "rot", { mode = "ok", keys = {
      [a.key_id] = sup.key_file(dir, a.name .. "-1", a.key),
      [next_id] = sup.key_file(dir, a.name .. "-2", next_key) } })
    create(a, rcv.url)
    deliveries(rcv, 1)
    rc, out = api.tokens_cli({ "rotate-callback-key", a.name }, env)
    assert.equal(0, rc, out)
    create(a, rcv.url)
    local got = deliveries(rcv, 2)
    assert.equal(a.key_id, sup.header(got[1], "X-QTG-Callback-Key-Id"))
    assert.equal(next_id, sup.header(got[2], "X-QTG-Callback-Key-Id"))
    for _, e in ipairs(got) do assert.is_true(e.verdict.ok, cjson.encode(e.verdict)) end
    -- the rotation is audited
    assert.equal(1, #common.query([[SELECT 1 FROM audit_outbox WHERE action = 'api_client.rotate_callback_key'
      AND entity_id = $1 UNION ALL SELECT 1 FROM audit_events WHERE action = 'api_client.rotate_callback_key'
      AND entity_id = $1]], a.name))
  end)
end)
