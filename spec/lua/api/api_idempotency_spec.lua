-- api_idempotency_spec: an Idempotency-Key is the client's within one
-- network class, and never hands back a request other than the one asked
-- for (docs/api.md "Idempotency-Key"), over real HTTP against two daemons
-- of two classes on one database, with a token serving both (one made
-- before sql/0198; a token made now serves one class, and the other
-- class's daemon refuses it):
--   * the same key and body sent to another class's daemon makes a request
--     there, instead of replaying the first class's answer;
--   * once the key's stored response is gone (a 5xx frees it; a first try
--     that died is taken over), a different body under the same key is 422
--     and the first request is neither returned nor changed;
--   * a replayed 201 carries its Location;
--   * every key the API accepts fits, whatever the token's name.
local cjson = require "cjson"

local api, common, host
local d1, d2, operator, operator_name

local function rows(sql, ...) return common.query(sql, ...) end

local function create(d, key, intent, token)
  return api.call(d, "POST", "/v3/requests", { token = token or operator, key = key,
    json = { template_key = "otc_settlement_manual", intent = intent or api.OTC_INTENT } })
end

local function with_amount(amount)
  local intent = {}
  for k, v in pairs(api.OTC_INTENT) do intent[k] = v end
  intent.amount = amount
  return intent
end

describe("HTTP API Idempotency-Key", function()
  setup(function()
    api = require "spec.lua.support.api"
    common = require "spec.lua.support.common"
    host = require "spec.lua.support.host"
    d1 = api.start({ MG_WORKERS_ENABLED = "false" })
    d2 = api.start({ MG_WORKERS_ENABLED = "false" })
    operator, operator_name = api.every_class_token("read,operate")
  end)
  teardown(function()
    api.stop(d1)
    api.stop(d2)
    host.stop_all()
  end)

  it("is the client's within one network class: another class's daemon makes its own request", function()
    local key = common.uid("x", 4)
    local first = create(d1, key)
    assert.equal(201, first.status, first.body)
    assert.equal(d1.class, first.json.network_class)
    local second = create(d2, key)
    assert.equal(201, second.status, second.body)
    assert.is_nil(second.headers["idempotent-replayed"])
    assert.equal(d2.class, second.json.network_class)
    assert.are_not.equal(first.json.id, second.json.id)
    local by_class = rows([[SELECT network_class, count(*)::int AS n FROM movement_requests
                             WHERE idempotency_key = $1 GROUP BY 1 ORDER BY 1]],
      "api:" .. operator_name .. ":" .. key)
    assert.equal(2, #by_class)
    for _, r in ipairs(by_class) do assert.equal(1, r.n) end
    -- and each daemon replays its own answer
    local again = create(d2, key)
    assert.equal(201, again.status)
    assert.equal("true", again.headers["idempotent-replayed"])
    assert.equal(second.json.id, cjson.decode(again.body).id)
    -- a token made now serves one class: the other daemon refuses it
    local one = api.token("read,operate", { class = d2.class })
    assert.equal(201, create(d2, common.uid("o", 4), nil, one).status)
    local refused = create(d1, common.uid("o", 4), nil, one)
    assert.equal(401, refused.status, refused.body)
    assert.equal("the API token serves another network class than this daemon's (" .. d1.class .. ")",
      refused.json.detail)
  end)

  it("replays a 201 with its Location", function()
    local key = common.uid("l", 4)
    local first = create(d1, key)
    assert.equal(201, first.status, first.body)
    assert.equal("/v3/requests/" .. first.json.id, first.headers["location"])
    local again = create(d1, key)
    assert.equal(201, again.status, again.body)
    assert.equal("true", again.headers["idempotent-replayed"])
    assert.equal(first.headers["location"], again.headers["location"])
  end)

  it("refuses a different request under a key whose stored response is gone, and changes nothing", function()
    local key = common.uid("g", 4)
    local first = create(d1, key, with_amount("10"))
    assert.equal(201, first.status, first.body)
    -- the state a first try that died leaves, past its take-over time
    -- (a 5xx deletes the row outright: the same case)
    rows([[UPDATE api_idempotency_keys SET status = NULL, created_at = now() - interval '1 hour'
            WHERE client = $1 AND idempotency_key = $2]], operator_name, key)
    local other = create(d1, key, with_amount("999999"))
    assert.equal(422, other.status, other.body)
    assert.equal("idempotency_mismatch", other.json.kind)
    assert.falsy(other.body:find(first.json.id, 1, true), "the refusal names the first request: " .. other.body)
    local r = rows("SELECT intent->>'amount' AS amount FROM movement_requests WHERE id = $1", first.json.id)[1]
    assert.equal("10", r.amount)
    assert.equal(1, rows("SELECT count(*)::int AS n FROM movement_requests WHERE idempotency_key = $1",
      "api:" .. operator_name .. ":" .. key)[1].n)
    -- the first body again, after the stored answer is gone again: the
    -- first request, not a second
    rows("DELETE FROM api_idempotency_keys WHERE client = $1 AND idempotency_key = $2", operator_name, key)
    local same = create(d1, key, with_amount("10"))
    assert.equal(200, same.status, same.body)
    assert.equal(first.json.id, same.json.id)
  end)

  -- The row a first try that died leaves (no status, past its take-over
  -- time) is taken over by a repeat of that request only: another path or
  -- body under the key ran in its place, although the first may have
  -- committed.
  it("lets only the same request take over a key whose first try died", function()
    local a = create(d1, common.uid("ta", 4), with_amount("11"))
    local b = create(d1, common.uid("tb", 4), with_amount("12"))
    assert.equal(201, a.status, a.body)
    assert.equal(201, b.status, b.body)
    local key = common.uid("t", 4)
    local function cancel(id, reason)
      return api.call(d1, "POST", "/v3/requests/" .. id .. "/cancel",
        { token = operator, key = key, json = { reason = reason } })
    end
    local first = cancel(a.json.id, "spec: the first")
    assert.equal(200, first.status, first.body)
    local function died()
      rows([[UPDATE api_idempotency_keys SET status = NULL, created_at = now() - interval '1 hour'
              WHERE client = $1 AND idempotency_key = $2]], operator_name, key)
    end
    died()
    local other = cancel(b.json.id, "spec: the first")
    assert.equal(422, other.status, other.body)
    assert.equal("idempotency_mismatch", other.json.kind)
    assert.equal("PENDING_APPROVAL",
      rows("SELECT request_state FROM movement_requests WHERE id = $1", b.json.id)[1].request_state)
    -- the same request again: taken over, run, and answered afresh
    local same = cancel(a.json.id, "spec: the first")
    assert.is_nil(same.headers["idempotent-replayed"], same.body)
    assert.truthy(same.status ~= 422, same.body)
    assert.equal("/v3/requests/" .. a.json.id .. "/cancel",
      rows("SELECT path FROM api_idempotency_keys WHERE client = $1 AND idempotency_key = $2",
        operator_name, key)[1].path)
  end)

  it("refuses, in the console's create too, a reused key for another maker or body", function()
    local requests = require "qtg.requests"
    local s = require("qtg").db.acquire()
    local ok, err = pcall(function()
      local key = common.uid("c", 4)
      local args = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT, idempotency_key = key }
      local req, created = requests.create(s, args, "operator:spec-maker")
      assert.is_true(created)
      local again, created2 = requests.create(s, args, "operator:spec-maker")
      assert.is_false(created2)
      assert.equal(req.id, again.id)
      for _, case in ipairs({
        { args = args, who = "operator:someone-else" },
        { args = { template_key = "otc_settlement_manual", intent = with_amount("11"), idempotency_key = key },
          who = "operator:spec-maker" },
        { args = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT, idempotency_key = key,
                   callback_url = "http://127.0.0.1:9/hook" }, who = "operator:spec-maker" },
      }) do
        local ok2, e = pcall(requests.create, s, case.args, case.who)
        assert.is_false(ok2)
        assert.equal("idempotency_mismatch", e.kind, tostring(e.message))
        assert.falsy(tostring(e.message):find(req.id, 1, true), e.message)
      end
    end)
    s:release()
    assert(ok, err)
  end)

  it("takes every key the API accepts, with a token name of the longest kind", function()
    local name = "t" .. common.uid("", 4) .. string.rep("n", 38)
    assert.equal(48, #name)
    local long_token = api.token("read,operate", { name = name, class = d1.class })
    local key = string.rep("k", 191) .. common.uid("", 4)
    assert.equal(200, #key)
    local r = create(d1, key, nil, long_token)
    assert.equal(201, r.status, r.body)
    local again = create(d1, key, nil, long_token)
    assert.equal("true", again.headers["idempotent-replayed"])
    assert.equal(r.json.id, cjson.decode(again.body).id)
    -- past 200 characters the API refuses the key itself, with its limit
    local over = create(d1, key .. "x", nil, long_token)
    assert.equal(400, over.status, over.body)
    assert.truthy(over.json.detail:find("1 to 200 characters", 1, true), over.json.detail)
  end)
end)
