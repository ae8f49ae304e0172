-- api_boundary_spec: what a client without the right token, or with odd
-- bytes, can make the API do, over real HTTP against a running qtgd:
--   * a method of the client's own invention is counted as "other": a
--     label per method would grow /metrics and the daemon's memory
--     without bound, and needs no token;
--   * an error that repeats what the client sent (a path, a query name)
--     is still valid UTF-8 JSON;
--   * a role is held only when given by name: an admin-only token is not
--     also an operator or an approver, at the route and in the inbox.
local qtg = require "qtg"
local cjson = require "cjson"
local canon = require "qtg.canon_json"

local api, common, host
local d, admin_only, reader, operator

local function metrics()
  local r = api.call(d, "GET", "/metrics", { token = reader })
  assert.equal(200, r.status, r.body)
  return r.body
end

describe("HTTP API boundary", function()
  setup(function()
    api = require "spec.lua.support.api"
    common = require "spec.lua.support.common"
    host = require "spec.lua.support.host"
    d = api.start({ MG_WORKERS_ENABLED = "false" })
    admin_only = api.token("admin")
    reader = api.token("read")
    operator = api.token("read,operate")
  end)
  teardown(function()
    api.stop(d)
    host.stop_all()
  end)

  it("counts a method it does not know as other, however many a client invents", function()
    local invented = {}
    for i = 1, 5 do
      local m = "ZZ" .. common.uid("", 3):gsub("[^%a]", ""):upper() .. string.char(64 + i)
      invented[i] = m
      local r = api.call(d, m, "/anything-" .. i)
      assert.truthy(r.status >= 400 and r.status < 500, m .. " -> " .. r.status)
    end
    local r = api.call(d, "GET", "/no-such-route")
    assert.equal(404, r.status)
    local text = metrics()
    for _, m in ipairs(invented) do
      assert.falsy(text:find(m, 1, true), "a series labelled with the method " .. m)
    end
    local n = text:match('qtg_http_requests_total{route="unmatched",method="other",status="%d+"} (%d+)')
    assert.truthy(n and tonumber(n) >= 5, "no series for method other:\n" .. text:sub(1, 3000))
    assert.truthy(text:find('qtg_http_requests_total{route="unmatched",method="GET",status="404"}', 1, true))
  end)

  it("answers an error that repeats bytes that are not UTF-8 with valid UTF-8", function()
    for _, path in ipairs({ "/v3/%ff%fe", "/%c0%80/x", "/v3/requests?%ff=1" }) do
      local r = api.call(d, "GET", path, { token = reader })
      assert.truthy(r.status == 400 or r.status == 404, path .. " -> " .. r.status .. " " .. r.body)
      assert.equal("application/problem+json", r.headers["content-type"], path)
      assert.is_true(canon.text_ok(r.body), path .. ": the body is not valid UTF-8: " .. r.body)
      local doc = cjson.decode(r.body)
      assert.truthy(doc.detail:find("\239\191\189", 1, true), path .. ": " .. doc.detail)
    end
  end)

  it("gives an admin-only token the admin routes only", function()
    local key = common.uid("a", 4)
    local create = api.call(d, "POST", "/v3/requests", { token = admin_only, key = key,
      json = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT } })
    assert.equal(403, create.status, create.body)
    assert.truthy(create.json.detail:find("operate", 1, true), create.json.detail)
    assert.equal(403, api.call(d, "GET", "/v3/requests", { token = admin_only }).status)
    assert.equal(403, api.call(d, "GET", "/v3/approvals", { token = admin_only }).status)
    local made = api.call(d, "POST", "/v3/requests", { token = operator, key = common.uid("a", 4),
      json = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT } })
    assert.equal(201, made.status, made.body)
    local approve = api.call(d, "POST", "/v3/requests/" .. made.json.id .. "/approve", { token = admin_only })
    assert.equal(403, approve.status, approve.body)
    assert.truthy(approve.json.detail:find("approve", 1, true), approve.json.detail)
    assert.equal(0, common.query("SELECT count(*)::int AS n FROM request_approvals WHERE request_id = $1",
      made.json.id)[1].n)
    assert.equal(0, common.query("SELECT count(*)::int AS n FROM movement_requests WHERE idempotency_key LIKE $1",
      "%:" .. key)[1].n)
    -- what admin is for
    local r = api.call(d, "PUT", "/v3/signers/" .. common.uid("k", 3) .. "/expected-identity",
      { token = admin_only, json = { expected_signer_address = api.OTC_INTENT.destination } })
    assert.equal(200, r.status, r.body)
    -- /v3/me answers every token, and says what it holds
    local me = api.call(d, "GET", "/v3/me", { token = admin_only })
    assert.equal(200, me.status)
    assert.same({ "admin" }, me.json.roles)
  end)

  it("answers another network class's request as one that does not exist, naming no class", function()
    local approver = api.token("read,approve")
    local made = api.call(d, "POST", "/v3/requests", { token = operator, key = common.uid("c", 4),
      json = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT } })
    assert.equal(201, made.status, made.body)
    local id, elsewhere = made.json.id, "spec-hidden-" .. common.uid("", 4)
    local s = qtg.db.acquire()
    require("spec.lua.support.engine").move_class(s, id, elsewhere)
    s:release()
    for _, call in ipairs({ { "GET", "/v3/requests/" .. id, reader },
                            { "GET", "/v3/requests/" .. id .. "/events", reader },
                            { "POST", "/v3/requests/" .. id .. "/approve", approver, {} },
                            { "POST", "/v3/requests/" .. id .. "/cancel", operator, { reason = "spec" } } }) do
      local r = api.call(d, call[1], call[2], { token = call[3], json = call[4] })
      assert.equal(404, r.status, call[2] .. ": " .. r.body)
      assert.equal("request " .. id .. " does not exist", r.json.detail, call[2])
      assert.falsy(r.body:find(elsewhere, 1, true), call[2] .. " names the other class: " .. r.body)
    end
    -- the operator at the console is still told whose it is
    local ok, e = pcall(require("qtg.requests").get, qtg.db.acquire(), id)
    assert.is_false(ok)
    assert.truthy(tostring(e.message):find("belongs to network class " .. elsewhere, 1, true), tostring(e.message))
  end)
end)
