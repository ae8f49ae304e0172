-- api_callback_pin_spec: an API client's callback_url is checked again at
-- each delivery, and the POST goes to exactly the address checked.
--
-- A name whose DNS answer changes between the request's creation and a
-- delivery (DNS rebinding) is what this guards against.  The spec plays it
-- with real processes and sockets: the requests are created by a daemon
-- that allows private hosts (as a name resolving to a public address would
-- pass), then delivered by a daemon that does not (the "answer" is now a
-- loopback address): every form of a loopback or private host is refused
-- at delivery, with the error recorded on the row and its attempt, and no
-- receiver is reached.  A daemon that allows them then delivers the same
-- rows.  The pin itself (qtg.http.request's pin: CURLOPT_RESOLVE in the
-- call's own DNS cache) is shown in this process: a name that resolves
-- nowhere reaches the pinned address, and nothing else.
local qtg = require "qtg"

local api, sup, common, host
local dir, env, key_path, v4, v6, redirect

local function rows_of(ids)
  return common.query([[SELECT c.id, c.request_id, c.callback_url, c.status, c.attempts, c.last_error
                          FROM movement_callback_outbox c WHERE c.request_id = ANY ($1::uuid[])
                         ORDER BY c.id]], "{" .. table.concat(ids, ",") .. "}")
end

-- {path = POSTs received} of a receiver, for paths starting with prefix
local function paths(rcv, prefix)
  local out = {}
  for _, e in ipairs(sup.received(rcv)) do
    if e.path:sub(1, #prefix) == prefix then out[e.path] = (out[e.path] or 0) + 1 end
  end
  return out
end

describe("callback delivery of API clients' URLs", function()
  setup(function()
    api = require "spec.lua.support.api"
    sup = require "spec.lua.support.sidecar"
    common = require "spec.lua.support.common"
    host = require "spec.lua.support.host"
    dir = sup.tmpdir()
    key_path = sup.key_file(dir, "host", "pin-spec-host-callback-key-0123456789")
    env = { MG_CALLBACK_KEY_FILE = key_path, MG_CALLBACK_KEY_ID = "k1",
            MG_CALLBACK_DISPATCH_INTERVAL_SECONDS = "0.2" }
    v4 = sup.start_receiver(dir, "v4", { mode = "ok" })
    v6 = sup.start_receiver(dir, "v6", { mode = "ok", bind = "::1" })
    redirect = sup.start_receiver(dir, "redirect", { mode = "redirect",
      args = { "--location", "http://127.0.0.1:" .. v4.port .. "/followed" } })
  end)
  teardown(function()
    host.stop_all()
    sup.cleanup()
  end)

  it("connects a pinned request to the pinned address only, and reads hosts as curl does", function()
    local base = ":" .. v4.port .. "/pin/"
    -- the name resolves nowhere: unpinned, it fails; pinned, it reaches 127.0.0.1
    local r, err = qtg.http.request{ method = "POST", url = "http://pin-spec.invalid" .. base .. "a", body = "{}" }
    assert.is_nil(r)
    assert.equal("dns", err.kind)
    r, err = qtg.http.request{ method = "POST", url = "http://pin-spec.invalid" .. base .. "b", body = "{}",
                               pin = { "127.0.0.1" } }
    assert.equal(200, r and r.status, err and err.message)
    -- a URL holding an address must name a pinned one
    r, err = qtg.http.request{ method = "POST", url = "http://127.0.0.1" .. base .. "c", body = "{}",
                               pin = { "10.0.0.1" } }
    assert.is_nil(r)
    assert.equal("invalid", err.kind)
    assert.truthy(err.message:find("not a pinned address", 1, true), err.message)
    -- pinned elsewhere than where the receiver listens: refused, not redirected to it
    r, err = qtg.http.request{ method = "POST", url = "http://localhost" .. base .. "d", body = "{}", pin = { "::1" } }
    assert.is_nil(r)
    assert.equal("refused", err.kind)
    -- a pin never follows a redirect, and holds numeric addresses only
    for _, bad in ipairs({ { pin = { "127.0.0.1" }, follow_redirects = true }, { pin = { "localhost" } } }) do
      bad.url, bad.method, bad.body = "http://localhost" .. base .. "e", "POST", "{}"
      r, err = qtg.http.request(bad)
      assert.is_nil(r)
      assert.equal("invalid", err.kind)
    end
    assert.same({ ["/pin/b"] = 1 }, paths(v4, "/pin/"))
    -- the host curl connects to, whatever the spelling
    local cases = { { "http://2130706433/", "127.0.0.1", 80 }, { "http://0177.0.0.1:8080/", "127.0.0.1", 8080 },
      { "http://0x7f.1/", "127.0.0.1", 80 }, { "https://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1", 443 },
      { "http://LocalHost./", "LocalHost.", 80 } }
    for _, c in ipairs(cases) do
      local h, port = qtg.http.target(c[1])
      assert.equal(c[2], h, c[1])
      assert.equal(c[3], port, c[1])
    end
    assert.is_nil((qtg.http.target("ftp://x/")))
  end)

  it("refuses at delivery a callback host that leads to a loopback or private address, records why, "
     .. "and delivers once private hosts are allowed", function()
    -- 1. created while private hosts are allowed, nothing delivered yet
    local a = api.start({ MG_API_CALLBACK_ALLOW_PRIVATE = "true", MG_WORKERS_ENABLED = "false",
                          MG_CALLBACK_KEY_FILE = key_path, MG_CALLBACK_KEY_ID = "k1" })
    local tok = api.token("read,operate", { env = env })
    local p4, p6 = v4.port, v6.port
    local urls = {
      localhost = "http://localhost:" .. p4 .. "/callbacks/localhost",
      loopback = "http://127.0.0.1:" .. p4 .. "/callbacks/loopback",
      v6 = "http://[::1]:" .. p6 .. "/callbacks/v6",
      mapped = "http://[::ffff:127.0.0.1]:" .. p4 .. "/callbacks/mapped",
      decimal = "http://2130706433:" .. p4 .. "/callbacks/decimal",
      octal = "http://0177.0.0.1:" .. p4 .. "/callbacks/octal",
      private = "http://10.255.255.1:" .. p4 .. "/callbacks/private",
      redirect = redirect.url,
    }
    local ids, id_of = {}, {}
    for name, url in pairs(urls) do
      local r = api.call(a, "POST", "/v3/requests", { token = tok, key = common.uid("k", 4),
        json = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT, callback_url = url } })
      assert.equal(201, r.status, r.body)
      ids[#ids + 1], id_of[name] = r.json.id, r.json.id
    end
    api.stop(a)
    local created = rows_of(ids)
    assert.equal(#ids, #created)
    for _, row in ipairs(created) do assert.equal("pending", row.status) end

    -- 2. delivered by a daemon that refuses private hosts: every row refused
    local extra = { MG_NETWORK_CLASS = a.class, MG_API_CALLBACK_ALLOW_PRIVATE = "false" }
    for k, v in pairs(env) do extra[k] = v end
    local b = api.start(extra)
    local refused = common.wait_for(function()
      local rows = rows_of(ids)
      for _, row in ipairs(rows) do
        if row.attempts < 1 then return nil, row.callback_url .. " not attempted" end
      end
      return rows
    end, 60, "every row's first attempt")
    api.stop(b)
    for _, row in ipairs(refused) do
      assert.equal("pending", row.status)                         -- a failed attempt, retried later
      assert.truthy(row.last_error:match("^forbidden_address: "), row.callback_url .. ": " .. row.last_error)
      assert.truthy(row.last_error:find("public addresses only", 1, true), row.last_error)
    end
    local attempts = common.query([[SELECT a.error FROM movement_callback_attempts a
      JOIN movement_callback_outbox c ON c.id = a.outbox_id WHERE c.request_id = ANY ($1::uuid[])]],
      "{" .. table.concat(ids, ",") .. "}")
    assert.truthy(#attempts >= #ids)
    for _, at in ipairs(attempts) do assert.truthy(at.error:match("^forbidden_address: "), at.error) end
    assert.same({}, paths(v4, "/callbacks/"))
    assert.same({}, paths(v6, "/"))
    assert.same({}, paths(redirect, "/"))

    -- 3. allowed: the same rows are delivered (10.255.255.1 is not tried:
    -- nothing listens there)
    common.query("UPDATE movement_callback_outbox SET status = 'dlq' WHERE request_id = $1", id_of.private)
    extra.MG_API_CALLBACK_ALLOW_PRIVATE = "true"
    local c = api.start(extra)
    common.wait_for(function()
      for _, row in ipairs(rows_of(ids)) do
        if row.request_id ~= id_of.private and row.request_id ~= id_of.redirect and row.status ~= "delivered" then
          return nil, row.callback_url .. " " .. row.status .. " " .. tostring(row.last_error)
        end
      end
      return true
    end, 60, "the allowed rows to be delivered")
    -- the redirect is answered, never followed
    local red = common.wait_for(function()
      local row = common.query([[SELECT last_error FROM movement_callback_outbox
                                  WHERE request_id = $1 AND attempts >= 2]], id_of.redirect)[1]
      return row and row.last_error ~= qtg.db.NULL and row.last_error:match("^http 302") and row
    end, 60, "the redirect's answer")
    assert.truthy(red)
    api.stop(c)
    assert.same({ ["/callbacks/localhost"] = 1, ["/callbacks/loopback"] = 1, ["/callbacks/mapped"] = 1,
                  ["/callbacks/decimal"] = 1, ["/callbacks/octal"] = 1 }, paths(v4, "/callbacks/"))
    assert.same({ ["/callbacks/v6"] = 1 }, paths(v6, "/"))
    assert.truthy((paths(redirect, "/")["/callbacks/redirect"] or 0) >= 1)
    assert.same({}, paths(v4, "/followed"))
  end)

  it("checks at delivery the URL of a request an API client made even when the client has no api_clients row "
     .. "(its rows are signed with the host key)", function()
    -- created while private hosts are allowed, by a client whose
    -- api_clients row is gone (as for clients made before per-client keys):
    -- the trigger leaves signing_key_id NULL
    local a = api.start({ MG_API_CALLBACK_ALLOW_PRIVATE = "true", MG_WORKERS_ENABLED = "false",
                          MG_CALLBACK_KEY_FILE = key_path, MG_CALLBACK_KEY_ID = "k1" })
    local tok, name = api.token("read,operate", { env = env })
    common.query("DELETE FROM api_clients WHERE name = $1", name)
    local r = api.call(a, "POST", "/v3/requests", { token = tok, key = common.uid("k", 4),
      json = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT,
               callback_url = "http://127.0.0.1:" .. v4.port .. "/callbacks/keyless" } })
    assert.equal(201, r.status, r.body)
    api.stop(a)
    local created = common.query([[SELECT c.signing_key_id, q.created_by FROM movement_callback_outbox c
      JOIN movement_requests q ON q.id = c.request_id WHERE c.request_id = $1]], r.json.id)
    assert.truthy(#created >= 1)
    for _, row in ipairs(created) do
      assert.equal(qtg.db.NULL, row.signing_key_id)
      assert.equal("api:" .. name, row.created_by)
    end
    -- delivered by a daemon that refuses private hosts: refused, never sent
    local extra = { MG_NETWORK_CLASS = a.class, MG_API_CALLBACK_ALLOW_PRIVATE = "false" }
    for k, v in pairs(env) do extra[k] = v end
    local b = api.start(extra)
    local rows = common.wait_for(function()
      local got = rows_of({ r.json.id })
      for _, row in ipairs(got) do
        if row.attempts < 1 and row.status ~= "delivered" then return nil, "not attempted" end
      end
      return got
    end, 60, "the row's first attempt")
    api.stop(b)
    for _, row in ipairs(rows) do
      assert.equal("pending", row.status)
      assert.truthy(tostring(row.last_error):match("^forbidden_address: "), tostring(row.last_error))
    end
    assert.same({}, paths(v4, "/callbacks/keyless"))
  end)
end)
