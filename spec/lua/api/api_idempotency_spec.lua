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
local qtg = require "qtg"
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

  -- A key's stored answer used to be kept for good, and a create naming a
  -- template by a megabyte of text stored that megabyte back in its "not
  -- loaded": a client of scope own filled the table at its rate limit (a
  -- review, session 42).
  it("keeps a key's answer a day, deleting older ones as answers are stored, and stores no client's megabyte", function()
    local old = common.uid("o", 4)
    local first = create(d1, old)
    assert.equal(201, first.status, first.body)
    rows([[UPDATE api_idempotency_keys SET created_at = now() - interval '25 hours'
            WHERE client = $1 AND idempotency_key = $2]], operator_name, old)
    local kept = common.uid("k", 4)
    assert.equal(201, create(d1, kept).status)
    assert.same({}, rows("SELECT 1 FROM api_idempotency_keys WHERE client = $1 AND idempotency_key = $2",
      operator_name, old))
    assert.equal(1, #rows("SELECT 1 FROM api_idempotency_keys WHERE client = $1 AND idempotency_key = $2",
      operator_name, kept))
    -- the repeat of a create past the retention finds its request
    local again = create(d1, old)
    assert.equal(200, again.status, again.body)
    assert.equal(first.json.id, again.json.id)
    -- a template key no template can have: refused as such, not echoed
    for _, bad in ipairs({ string.rep("t", 200000), "Otc", "otc-settlement", "1otc", "otc\0x" }) do
      local key = common.uid("b", 4)
      local r = api.call(d1, "POST", "/v3/requests", { token = operator, key = key,
        json = { template_key = bad, intent = api.OTC_INTENT } })
      -- (a NUL is refused with the body, before the route: 400)
      assert.truthy((r.status == 422 and r.json.kind == "invalid_input")
        or (r.status == 400 and r.json.kind == "bad_request"), r.body:sub(1, 300))
      assert.truthy(#r.body < 1000, "the answer repeats the key: " .. #r.body .. " bytes")
      local stored = rows([[SELECT length(response_body) AS n FROM api_idempotency_keys
                             WHERE client = $1 AND idempotency_key = $2]], operator_name, key)[1]
      assert.truthy(stored == nil or stored.n < 1000, "stored " .. tostring(stored and stored.n) .. " bytes")
    end
    -- any detail is cut at problem.MAX_DETAIL bytes, and stays UTF-8
    local problem = require "qtg.api.problem"
    local _, doc = problem.document({ kind = "not_found", message = "x" .. string.rep("\195\169", 5000) })
    -- "x" and 1,023 whole characters (2,047 bytes), U+FFFD for the one the
    -- cut split, and "..."
    assert.equal(problem.MAX_DETAIL - 1 + 3 + 3, #doc.detail)
    assert.equal("\239\191\189...", doc.detail:sub(-6))
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

  -- A request whose failure took its session (a lost connection, the
  -- request timeout) answered 503 "retry", and its key could not be freed
  -- on that session: the retry met 409 idempotency_in_flight for twice the
  -- request timeout.  The key is freed on a session of its own.
  it("frees the key of a request whose session was lost, so the retry runs at once", function()
    local idem = require "qtg.api.idempotency"
    local principal = { name = common.uid("lost", 4) }
    local key = common.uid("k", 4)
    local req = { method = "POST", path = "/v3/requests", headers = { ["idempotency-key"] = key } }
    local s = qtg.db.acquire()
    local claim = idem.begin(s, principal, { method = "POST", path = "/v3/requests" }, req, { amount = "1" })
    assert.equal(key, claim.key)
    local function held()
      return #rows("SELECT 1 FROM api_idempotency_keys WHERE client = $1 AND idempotency_key = $2",
        principal.name, key)
    end
    assert.equal(1, held())
    local pid = s:query("SELECT pg_backend_pid() AS pid")[1].pid
    rows("SELECT pg_terminate_backend($1::int)", pid)
    local ok, err = pcall(idem.finish, s, claim, function() return s:query("SELECT 1") end)
    s:release()
    assert.is_false(ok)
    assert.equal("connection", err.kind)   -- the failure is raised as it was
    assert.equal(0, held())
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
