-- api_ownership_spec: tokens of scope own (qtg.api.ownership, sql/0191)
-- over real HTTP against a running qtgd.  Two client systems share one
-- network class; each holds a read,operate token of scope own.  Everything
-- a client could try on the other's request is tried, and refused as "does
-- not exist" with nothing changed: reading it, its events, cancelling it,
-- retrying or completing its nodes, redelivering its callbacks (one by
-- one and in bulk), finding it in a list.  Its own requests it reaches as
-- a class token does; the routes about the whole class are refused; and
-- a token of scope own is never an approver or an admin.
local api, common, host
local d, doc
local alpha, beta, ops
local names = {}
local ids = {}

local function rows(sql, ...) return common.query(sql, ...) end

local function create(token, amount)
  local intent = {}
  for k, v in pairs(api.OTC_INTENT) do intent[k] = v end
  intent.amount = amount
  local r = api.call(d, "POST", "/v3/requests", { token = token, key = common.uid("k", 6),
    json = { template_key = "otc_settlement_manual", intent = intent, callback_url = "http://127.0.0.1:9/hook" } })
  assert.equal(201, r.status, r.body)
  return r.json.id
end

-- the request's callback rows, dead-lettered: their ids, the first first
local function dead_letter(id)
  local list = {}
  for _, r in ipairs(rows([[UPDATE movement_callback_outbox SET status = 'dlq', attempts = max_attempts,
                              last_error = 'connection refused (ownership spec)'
                             WHERE request_id = $1::uuid RETURNING id]], id)) do list[#list + 1] = r.id end
  table.sort(list)
  assert(#list > 0, "no callback row for " .. id)
  return list
end

local function state(id)
  return rows("SELECT request_state FROM movement_requests WHERE id = $1::uuid", id)[1].request_state
end

local function call(token, method, path, json)
  local opts = { token = token, json = json }
  if method ~= "GET" then opts.key = common.uid("k", 6) end
  return api.call(d, method, path, opts)
end

describe("tokens of scope own", function()
  setup(function()
    api = require "spec.lua.support.api"
    common = require "spec.lua.support.common"
    host = require "spec.lua.support.host"
    local class = common.uid("api", 4)   -- the tokens are made before their daemon starts
    alpha, names.alpha = api.token("read,operate", { scope = "own", class = class })
    beta, names.beta = api.token("read,operate", { scope = "own", class = class })
    ops = api.token("read,operate", { class = class })
    d = api.start({ MG_NETWORK_CLASS = class, MG_API_RATE_LIMIT_PER_SECOND = "1000", MG_API_RATE_LIMIT_BURST = "1000" })
    doc = api.call(d, "GET", "/v3/openapi.json", { token = ops }).json
    ids.a = create(alpha, "41")
    ids.b = create(beta, "42")
    ids.a_callbacks = dead_letter(ids.a)
    ids.b_callbacks = dead_letter(ids.b)
    ids.a_callback = ids.a_callbacks[1]
    ids.a_node = rows("SELECT id FROM movement_request_nodes WHERE request_id = $1::uuid ORDER BY node_key LIMIT 1",
      ids.a)[1].id
  end)

  teardown(function()
    api.stop(d)
    host.stop_all()
  end)

  it("refuses an approver's or an admin's role, and an unknown scope, at creation", function()
    for _, c in ipairs({ { "read,approve", "own", "read and operate only" }, { "admin", "own", "read and operate only" },
                         { "read", "tenant", "class or own" } }) do
      local rc, out = api.tokens_cli({ "create", "--name", common.uid("bad", 4), "--roles", c[1], "--scope", c[2] })
      assert.equal(2, rc, out)
      assert.truthy(out:find(c[3], 1, true), out)
    end
    -- nor can a row of that kind be written (the table's own check)
    local ok, err = pcall(rows, [[INSERT INTO api_tokens (name, token_prefix, token_hash, roles, created_by, scope)
                                  VALUES ('sneaky', 'qtg_x', repeat('0', 64), '{approve}', 'spec', 'own')]])
    assert.is_false(ok)
    assert.truthy(tostring(err):find("api_tokens_own_scope_roles", 1, true), tostring(err))
    local me = api.check(doc, call(beta, "GET", "/v3/me"), "GET", "/v3/me")
    assert.equal("own", me.json.scope)
    assert.equal("class", call(ops, "GET", "/v3/me").json.scope)
  end)

  it("answers every route on another client's request as if it did not exist, and changes nothing", function()
    local tries = {
      { "GET", "/v3/requests/" .. ids.a },
      { "GET", "/v3/requests/" .. ids.a .. "/events" },
      { "POST", "/v3/requests/" .. ids.a .. "/cancel", { reason = "not mine" } },
      { "POST", "/v3/requests/" .. ids.a .. "/resume", {} },
      { "POST", "/v3/nodes/" .. ids.a_node .. "/retry", {} },
      { "POST", "/v3/nodes/" .. ids.a_node .. "/complete", { input = {} } },
      { "POST", "/v3/callbacks/" .. ids.a_callback .. "/redeliver", {} },
      -- spellings of the same ids
      { "GET", "/v3/requests/" .. ids.a:upper() },
      { "GET", "/v3/requests/not-a-uuid" },
      { "POST", "/v3/callbacks/0" .. ids.a_callback .. "/redeliver", {} },
      { "POST", "/v3/callbacks/99999999999999999999/redeliver", {} },
    }
    for _, t in ipairs(tries) do
      local r = call(beta, t[1], t[2], t[3])
      assert.equal(404, r.status, t[2] .. ": " .. r.body)
      assert.truthy(r.body:find("does not exist", 1, true), t[2] .. ": " .. r.body)
      assert.is_nil(r.body:find(names.alpha, 1, true), t[2] .. " names the other client: " .. r.body)
    end
    assert.equal("PENDING_APPROVAL", state(ids.a))
    assert.equal(0, rows("SELECT count(*)::int AS n FROM movement_callback_outbox WHERE redelivery_of = $1",
      ids.a_callback)[1].n)
    -- a request that does not exist reads the same
    local none = call(beta, "GET", "/v3/requests/00000000-0000-4000-8000-000000000000")
    assert.equal(404, none.status)
    assert.equal(none.json.title, call(beta, "GET", "/v3/requests/" .. ids.a).json.title)
  end)

  it("lists and redelivers only its own", function()
    local function listed(token, path)
      local seen = {}
      for _, item in ipairs(call(token, "GET", path).json.items) do seen[item.request_id or item.id] = true end
      return seen
    end
    local mine = listed(beta, "/v3/requests?limit=200")
    assert.is_true(mine[ids.b])
    assert.is_nil(mine[ids.a])
    local all = listed(ops, "/v3/requests?limit=200")
    assert.is_true(all[ids.a] and all[ids.b])
    -- its callbacks only, in the dead-letter list and in bulk
    local cbs = listed(beta, "/v3/callbacks?status=dlq&limit=200")
    assert.is_true(cbs[ids.b])
    assert.is_nil(cbs[ids.a])
    local dry = call(beta, "POST", "/v3/callbacks/redeliver", { request_id = ids.a })
    assert.equal(200, dry.status, dry.body)
    assert.equal(0, dry.json.count)
    local bulk = call(beta, "POST", "/v3/callbacks/redeliver", { dry_run = false })
    assert.equal(200, bulk.status, bulk.body)
    assert.equal(#ids.b_callbacks, bulk.json.count)
    local function redelivered(list)
      return rows([[SELECT count(*)::int AS n FROM movement_callback_outbox WHERE redelivery_of = ANY($1::bigint[])]],
        "{" .. table.concat(list, ",") .. "}")[1].n
    end
    assert.equal(#ids.b_callbacks, redelivered(ids.b_callbacks))
    assert.equal(0, redelivered(ids.a_callbacks))
  end)

  it("reaches its own request as a class token does", function()
    local r = api.check(doc, call(alpha, "GET", "/v3/requests/" .. ids.a), "GET", "/v3/requests/{id}")
    assert.equal(200, r.status, r.body)
    assert.equal(200, call(alpha, "GET", "/v3/requests/" .. ids.a .. "/events").status)
    assert.equal(200, call(ops, "GET", "/v3/requests/" .. ids.a).status)
    assert.equal(200, call(alpha, "GET", "/v3/templates").status)
    r = call(alpha, "POST", "/v3/requests/" .. ids.a .. "/cancel", { reason = "mine, not needed" })
    assert.equal(200, r.status, r.body)
    assert.equal("CANCELLED", state(ids.a))
  end)

  it("is refused the routes about the whole network class", function()
    for _, path in ipairs({ "/v3/balances", "/v3/signers", "/v3/workers", "/v3/heartbeats", "/readyz", "/metrics" }) do
      local r = call(beta, "GET", path)
      assert.equal(403, r.status, path .. ": " .. r.body)
      assert.truthy(r.body:find("scope own", 1, true), path .. ": " .. r.body)
      assert.not_equal(403, call(ops, "GET", path).status, path)
    end
  end)
end)
