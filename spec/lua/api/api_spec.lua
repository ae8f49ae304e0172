-- api_spec: the HTTP API end to end, over real HTTP (libcurl) against a
-- running qtgd on 127.0.0.1: authentication and roles, Idempotency-Key,
-- problem+json for each error kind with nothing written, the lifecycle
-- routes, keyset pagination while rows are inserted, the read routes,
-- /healthz /readyz /metrics, and every response validated against
-- /v3/openapi.json.  Rate limits and callback_url refusals run on a second
-- daemon with tight settings.
local qtg = require "qtg"
local cjson = require "cjson"

local api, common, host
local d, doc
local admin, reader, operator, approver

local function rows(sql, ...) return common.query(sql, ...) end

local function count_requests(class)
  return rows("SELECT count(*) AS n FROM movement_requests WHERE network_class = $1", class)[1].n
end

local function create(token, key, body, opts)
  opts = opts or {}
  return api.call(d, "POST", "/v3/requests", { token = token, key = key,
    json = body or { template_key = "otc_settlement_manual", intent = api.OTC_INTENT } })
end

describe("HTTP API", function()
  setup(function()
    api = require "spec.lua.support.api"
    common = require "spec.lua.support.common"
    host = require "spec.lua.support.host"
    d = api.start({ MG_NODE_DISPATCH_INTERVAL_SECONDS = "0.2", MG_NODE_OBSERVE_INTERVAL_SECONDS = "0.2" })
    admin = api.token("admin")
    reader = api.token("read")
    operator = api.token("read,operate")
    approver = api.token("read,approve")
    doc = api.call(d, "GET", "/v3/openapi.json", { token = reader }).json
  end)
  teardown(function()
    api.stop(d)
    host.stop_all()
  end)

  describe("authentication", function()
    it("serves /healthz without a token and nothing else", function()
      local r = api.check(doc, api.call(d, "GET", "/healthz"), "GET", "/healthz")
      assert.equal(200, r.status)
      assert.equal("ok", r.json.status)
      for _, path in ipairs({ "/readyz", "/metrics", "/v3/requests", "/v3/openapi.json", "/v3/workers",
                              "/v3/templates", "/v3/balances", "/v3/signers", "/v3/callbacks" }) do
        local x = api.call(d, "GET", path)
        assert.equal(401, x.status, path)
        assert.equal("application/problem+json", x.headers["content-type"])
        assert.equal("unauthorized", x.json.kind)
        assert.truthy(x.headers["www-authenticate"]:match("^Bearer"))
      end
    end)

    it("refuses a malformed header, an unknown token, a revoked and an expired one", function()
      local bad = api.call(d, "GET", "/v3/requests", { headers = { Authorization = "Basic dXNlcjpwdw==" } })
      assert.equal(401, bad.status)
      assert.truthy(bad.json.detail:match("Bearer"))
      local unknown = api.call(d, "GET", "/v3/requests", { token = "qtg_" .. string.rep("A", 43) })
      assert.equal(401, unknown.status)
      assert.truthy(unknown.json.detail:match("not known"))

      local tok, name = api.token("read")
      assert.equal(200, api.call(d, "GET", "/v3/requests", { token = tok }).status)
      local rc, out = api.tokens_cli({ "revoke", name })
      assert.equal(0, rc, out)
      local revoked = api.call(d, "GET", "/v3/requests", { token = tok })
      assert.equal(401, revoked.status)
      assert.truthy(revoked.json.detail:match("revoked"))

      local short = api.token("read", { expires_in = "1s" })
      common.wait_for(function()
        return api.call(d, "GET", "/v3/requests", { token = short }).status == 401
      end, 10, "the token to expire")
      local expired = api.call(d, "GET", "/v3/requests", { token = short })
      assert.truthy(expired.json.detail:match("expired"))
    end)

    it("requires the route's role", function()
      local r = create(reader, common.uid("k", 4))
      assert.equal(403, r.status)
      assert.equal("forbidden", r.json.kind)
      assert.truthy(r.json.detail:match("operate"))
      local created = create(operator, common.uid("k", 4))
      assert.equal(201, created.status, created.body)
      local id = created.json.id
      -- an operator may not approve; an approver may not cancel; admin may do anything
      assert.equal(403, api.call(d, "POST", "/v3/requests/" .. id .. "/approve", { token = operator }).status)
      assert.equal(403, api.call(d, "POST", "/v3/requests/" .. id .. "/cancel",
        { token = approver, json = { reason = "x" } }).status)
      assert.equal(403, api.call(d, "PUT", "/v3/signers/k1/expected-identity",
        { token = operator, json = { expected_signer_address = api.OTC_INTENT.destination } }).status)
      assert.equal(0, rows("SELECT count(*) AS n FROM request_approvals WHERE request_id = $1::uuid", id)[1].n)
    end)
  end)

  describe("qtgd tokens", function()
    it("prints the token once, alone on the last line, and stores only its hash", function()
      local tok, name, out = api.token("read,approve", { expires_in = "2h" })
      local _, first = out:find(tok, 1, true)
      assert.truthy(first)
      assert.falsy(out:find(tok, first + 1, true))
      local row = rows("SELECT * FROM api_tokens WHERE name = $1", name)[1]
      assert.equal(qtg.crypto.sha256_hex(tok), row.token_hash)
      for k, v in pairs(row) do
        assert.falsy(tostring(v):find(tok, 1, true), "column " .. k .. " holds the token")
      end
      assert.equal("{read,approve}", row.roles)
      assert.equal(d.class, row.network_class)
      assert.truthy(out:find("network class " .. d.class, 1, true), out)
      local rc, list = api.tokens_cli({ "list" })
      assert.equal(0, rc)
      assert.truthy(list:find(name, 1, true))
      assert.truthy(list:match("\n" .. name:gsub("%p", "%%%0") .. " +live +%S+ +read,approve +class +" .. d.class:gsub("%p", "%%%0") .. " "), list)
      assert.falsy(list:find(tok, 1, true))
      assert.truthy(rows([[SELECT 1 FROM audit_outbox WHERE action = 'api_token.create' AND detail->>'name' = $1
        UNION ALL SELECT 1 FROM audit_events WHERE action = 'api_token.create' AND detail->>'name' = $1]], name)[1])
    end)

    it("refuses unknown roles, bad names, a duplicate live name and revoking nothing", function()
      local rc, out = api.tokens_cli({ "create", "--name", "x1", "--roles", "read,root" })
      assert.equal(2, rc)
      assert.truthy(out:match("unknown role"))
      rc = api.tokens_cli({ "create", "--name", "bad name", "--roles", "read" })
      assert.equal(2, rc)
      rc = api.tokens_cli({ "create", "--roles", "read" })
      assert.equal(2, rc)
      local _, name = api.token("read")
      rc, out = api.tokens_cli({ "create", "--name", name, "--roles", "read" })
      assert.equal(1, rc)
      assert.truthy(out:match("exists"))
      rc = api.tokens_cli({ "revoke", "no-such-" .. name })
      assert.equal(1, rc)
      -- a class as MG_NETWORK_CLASS takes one, or nothing is made
      for _, bad in ipairs({ "Main Net", "", string.rep("c", 33), "a;b", "mainnet\n" }) do
        rc, out = api.tokens_cli({ "create", "--name", common.uid("cl", 4), "--roles", "read", "--class", bad })
        assert.equal(2, rc, bad)
        assert.truthy(out:find("--class: a network class is 1 to 32 characters", 1, true), out)
      end
      -- without --class: the class of the shell's MG_NETWORK_CLASS
      local _, plain = api.token("read", { class = false, env = { MG_NETWORK_CLASS = "elsewhere" } })
      assert.equal("elsewhere", rows("SELECT network_class FROM api_tokens WHERE name = $1", plain)[1].network_class)
    end)
  end)

  describe("POST /v3/requests and Idempotency-Key", function()
    it("creates with 201 and Location, and replays the first response for the same key and body", function()
      local key = common.uid("k", 6)
      local first = api.check(doc, create(operator, key), "POST", "/v3/requests")
      assert.equal(201, first.status, first.body)
      assert.equal("/v3/requests/" .. first.json.id, first.headers["location"])
      assert.equal("PENDING_APPROVAL", first.json.request_state)
      assert.truthy(first.json.created_by:match("^api:"))
      -- same key, same body (other spacing and key order): the stored first response
      local again = api.call(d, "POST", "/v3/requests", { token = operator, key = key,
        json = '{ "intent": ' .. cjson.encode(api.OTC_INTENT) .. ', "template_key": "otc_settlement_manual" }' })
      assert.equal(201, again.status)
      assert.equal("true", again.headers["idempotent-replayed"])
      assert.equal(first.body, again.body)
      -- same key, another body: 422, nothing new
      local before = count_requests(d.class)
      local other = api.call(d, "POST", "/v3/requests", { token = operator, key = key,
        json = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT, input_params = { x = 1 } } })
      assert.equal(422, other.status)
      assert.equal("idempotency_mismatch", other.json.kind)
      assert.equal(before, count_requests(d.class))
      -- another client's same key is its own
      local mine = create(api.token("read,operate"), key)
      assert.equal(201, mine.status)
      assert.not_equal(first.json.id, mine.json.id)
    end)

    it("refuses a missing key with 400 and a key still in flight with 409", function()
      local r = api.call(d, "POST", "/v3/requests", { token = operator,
        json = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT } })
      assert.equal(400, r.status)
      assert.equal("missing_idempotency_key", r.json.kind)
      local bad = create(operator, "has space")
      assert.equal(400, bad.status)
      -- the first request of a key is running (its row has no answer yet)
      local key = common.uid("k", 6)
      local _, name = nil, nil
      local tok, tname = api.token("operate")
      name = tname
      local body = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT }
      local idem = require "qtg.api.idempotency"
      rows([[INSERT INTO api_idempotency_keys (client, network_class, idempotency_key, method, path, request_hash)
             VALUES ($1, $2, $3, 'POST', '/v3/requests', $4)]], name, d.class, key,
        idem.request_hash("POST", "/v3/requests", body))
      local busy = api.call(d, "POST", "/v3/requests", { token = tok, key = key, json = body })
      assert.equal(409, busy.status, busy.body)
      assert.equal("idempotency_in_flight", busy.json.kind)
      assert.equal("1", busy.headers["retry-after"])
      assert.equal(0, rows("SELECT count(*) AS n FROM movement_requests WHERE idempotency_key = $1",
        "api:" .. name .. ":" .. key)[1].n)
    end)

    it("two processes creating with one key at once make one request", function()
      local key = common.uid("race", 6)
      local dir = host.tmpdir()
      local body = cjson.encode({ template_key = "otc_settlement_manual", intent = api.OTC_INTENT })
      local pids = {}
      for i = 1, 4 do
        pids[i] = common.background("sh -c " .. common.quote(("curl -s -o %s/out%d -w '%%{http_code}' -X POST -H %s -H %s -H %s --data-binary %s %s/v3/requests > %s/code%d")
          :format(dir, i, common.quote("Authorization: Bearer " .. operator), common.quote("Idempotency-Key: " .. key),
            common.quote("Content-Type: application/json"), common.quote(body), d.base, dir, i)), dir .. "/log" .. i)
      end
      local codes, ids = {}, {}
      for i = 1, 4 do
        local code = common.wait_for(function()
          local t = host.read(dir .. "/code" .. i)
          return t and t:match("^%d%d%d$") and t
        end, 30, "curl " .. i)
        codes[#codes + 1] = code
        if code == "201" then ids[cjson.decode(host.read(dir .. "/out" .. i)).id] = true end
        assert.truthy(code == "201" or code == "409", code)
      end
      local n = 0
      for _ in pairs(ids) do n = n + 1 end
      assert.equal(1, n, table.concat(codes, ","))
      local made = rows("SELECT count(*) AS n FROM movement_requests WHERE idempotency_key LIKE $1", "%:" .. key)[1].n
      assert.equal(1, made)
      os.execute("rm -rf " .. common.quote(dir))
    end)
  end)

  describe("problem+json for bad input, with nothing written", function()
    it("answers each error kind with its status and writes nothing", function()
      local before = count_requests(d.class)
      local function expect(status, kind, r)
        assert.equal(status, r.status, r.body)
        assert.equal("application/problem+json", r.headers["content-type"])
        assert.equal(kind, r.json.kind)
        assert.equal(status, r.json.status)
        assert.truthy(#r.json.detail > 0)
        api.check(doc, r, "POST", "/v3/requests")
      end
      local function post(opts)
        opts.token = operator
        opts.key = opts.key or common.uid("k", 4)
        return api.call(d, "POST", "/v3/requests", opts)
      end
      expect(400, "bad_request", post({ body = "{not json", headers = { ["Content-Type"] = "application/json" } }))
      expect(400, "bad_request", post({ json = "[1,2]" }))
      expect(400, "bad_request", post({ json = "\"text\"" }))
      expect(415, "unsupported_media_type", post({ body = "{}", headers = { ["Content-Type"] = "text/plain" } }))
      expect(422, "unknown_field", post({ json = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT,
                                                    amount_override = "1" } }))
      expect(422, "invalid_input", post({ json = { template_key = 5, intent = api.OTC_INTENT } }))
      expect(422, "invalid_input", post({ json = { intent = api.OTC_INTENT } }))
      expect(422, "invalid_intent", post({ json = { template_key = "otc_settlement_manual", intent = { asset = "USDC" } } }))
      -- a second "amount" and "destination" in look-alike letters (Cyrillic а, ѕ): they stood on the
      -- approver's card beside the real ones, the same to the eye
      for _, name in ipairs({ "\208\176mount", "de\209\149tination", "amount\226\128\139", "Amount" }) do
        local lookalike = {}
        for k, v in pairs(api.OTC_INTENT) do lookalike[k] = v end
        lookalike[name] = "0.01"
        local r = post({ json = { template_key = "otc_settlement_manual", intent = lookalike } })
        expect(422, "invalid_intent", r)
        assert.truthy(r.json.detail:find("intent field name", 1, true), r.json.detail)
      end
      expect(404, "not_found", post({ json = { template_key = "no_such_template", intent = {} } }))
      expect(400, "bad_request", post({ body = "{\"template_key\":\"a\\u0000\",\"intent\":{}}",
                                        headers = { ["Content-Type"] = "application/json" } }))
      expect(400, "bad_request", post({ body = "{\"template_key\":\"otc_settlement_manual\",\"intent\":{\"k\\u0000\":1}}",
                                        headers = { ["Content-Type"] = "application/json" } }))
      -- over the body cap: declared, and streamed without a length
      local big = string.rep("x", 1048577)
      local r = post({ body = big, headers = { ["Content-Type"] = "application/json" } })
      assert.equal(413, r.status)
      assert.equal("too_large", r.json.kind)
      r = post({ body = big, headers = { ["Content-Type"] = "application/json", ["Transfer-Encoding"] = "chunked" } })
      assert.equal(413, r.status)
      assert.equal("too_large", r.json.kind)
      assert.equal(before, count_requests(d.class))
    end)

    -- One client must not be able to hold the daemon's one loop, or its
    -- memory, with what it stores: a request is at most 64 KiB of intent
    -- and of input_params, and a page of the listing ends past 1 MiB.
    it("bounds what one request stores and what one page of the listing carries", function()
      local function with_memo(n)
        local intent = {}
        for k, v in pairs(api.OTC_INTENT) do intent[k] = v end
        intent.memo = string.rep("m", n)
        return intent
      end
      local before = count_requests(d.class)
      local r = create(operator, common.uid("big", 4), { template_key = "otc_settlement_manual", intent = with_memo(70000) })
      assert.equal(422, r.status, r.body:sub(1, 300))
      assert.equal("invalid_intent", r.json.kind)
      assert.truthy(r.json.detail:match("^intent is %d+ bytes as JSON, more than 65536"), r.json.detail)
      r = create(operator, common.uid("big", 4), { template_key = "otc_settlement_manual", intent = api.OTC_INTENT,
                                                   input_params = { notes = string.rep("n", 70000) } })
      assert.equal(422, r.status, r.body:sub(1, 300))
      assert.equal("invalid_input", r.json.kind)
      assert.truthy(r.json.detail:match("^input_params is %d+ bytes as JSON, more than 65536"), r.json.detail)
      assert.equal(before, count_requests(d.class))
      -- 20 requests of 60 KB: a page of 50 holds what fits in 1 MiB (at least
      -- one), and its cursor leads to the rest, each request listed once
      local mine = api.token("read,operate", { scope = "own" })
      local made = {}
      for _ = 1, 20 do
        local c = create(mine, common.uid("fat", 4), { template_key = "otc_settlement_manual", intent = with_memo(60000) })
        assert.equal(201, c.status, c.body:sub(1, 300))
        made[c.json.id] = true
      end
      -- walk(route, token, slack) -> the ids listed (each once), the pages:
      -- every page within 1 MiB plus one item's documents (slack)
      local function walk(route, token, slack)
        local seen, pages, path = {}, 0, route .. "?limit=50"
        repeat
          local page = api.call(d, "GET", path, { token = token })
          assert.equal(200, page.status, page.body:sub(1, 300))
          assert.truthy(#page.body <= 1048576 + slack, #page.body)
          assert.truthy(#page.json.items >= 1)
          pages = pages + 1
          for _, item in ipairs(page.json.items) do
            assert.is_nil(seen[item.id], item.id)
            seen[item.id] = true
          end
          local cursor = page.json.next_cursor
          path = cursor ~= cjson.null and route .. "?limit=50&cursor=" .. cursor or nil
        until not path
        return seen, pages
      end
      local seen, pages = walk("/v3/requests", mine, 65536 * 2)
      assert.same(made, seen)
      assert.truthy(pages >= 2, pages)
      -- the approvals inbox likewise (its items carry the approval texts)
      seen, pages = walk("/v3/approvals", approver, 65536 * 6)
      for id in pairs(made) do assert.truthy(seen[id], id) end
      assert.truthy(pages >= 2, pages)
    end)

    it("answers unknown routes, methods and query parameters", function()
      local r = api.call(d, "GET", "/v3/nothing", { token = reader })
      assert.equal(404, r.status)
      assert.equal("not_found", r.json.kind)
      r = api.call(d, "DELETE", "/v3/requests", { token = reader })
      assert.equal(405, r.status)
      assert.truthy(r.headers["allow"]:find("GET", 1, true))
      assert.truthy(r.headers["allow"]:find("POST", 1, true))
      r = api.check(doc, api.call(d, "GET", "/v3/requests?colour=red", { token = reader }), "GET", "/v3/requests")
      assert.equal(400, r.status)
      r = api.call(d, "GET", "/v3/requests?limit=1&limit=2", { token = reader })
      assert.equal(400, r.status)
      r = api.call(d, "GET", "/v3/requests?limit=201", { token = reader })
      assert.equal(400, r.status)
      r = api.call(d, "GET", "/v3/requests?cursor=zz", { token = reader })
      assert.equal(400, r.status)
      r = api.call(d, "GET", "/v3/requests?state=NOPE", { token = reader })
      assert.equal(400, r.status)
      r = api.check(doc, api.call(d, "GET", "/v3/requests/not-a-uuid", { token = reader }), "GET", "/v3/requests/{id}")
      assert.equal(404, r.status)
      r = api.call(d, "GET", "/v3/requests/00000000-0000-4000-8000-000000000000", { token = reader })
      assert.equal(404, r.status)
      assert.equal("not_found", r.json.kind)
    end)
  end)

  describe("the lifecycle routes", function()
    local function new_request()
      local r = create(operator, common.uid("k", 6))
      assert.equal(201, r.status, r.body)
      return r.json.id
    end

    it("approves as the token's principal, and refuses a second approve with the allowed states", function()
      local id = new_request()
      local r = api.check(doc, api.call(d, "POST", "/v3/requests/" .. id .. "/approve",
        { token = approver, json = { comment = "looks right" } }), "POST", "/v3/requests/{id}/approve")
      assert.equal(200, r.status, r.body)
      assert.truthy(r.json.request_state == "APPROVED" or r.json.request_state == "EXECUTING")
      assert.equal(1, #r.json.approvals)
      assert.truthy(r.json.approvals[1].principal:match("^api:"))
      local again = api.check(doc, api.call(d, "POST", "/v3/requests/" .. id .. "/approve", { token = approver }),
        "POST", "/v3/requests/{id}/approve")
      assert.equal(409, again.status)
      assert.equal("illegal_transition", again.json.kind)
      assert.same({ "PENDING_APPROVAL" }, again.json.allowed_states)
      -- the audit trail names the API client
      local ev = api.check(doc, api.call(d, "GET", "/v3/requests/" .. id .. "/events", { token = reader }),
        "GET", "/v3/requests/{id}/events")
      local actions = {}
      for _, e in ipairs(ev.json.items) do actions[e.action] = e.actor end
      assert.truthy(actions["request.create"]:match("^api:"))
      assert.truthy(actions["request.approve"]:match("^api:"))
    end)

    it("rejects with a reason (required) and cancels with a reason (required)", function()
      local id = new_request()
      local r = api.call(d, "POST", "/v3/requests/" .. id .. "/reject", { token = approver, json = {} })
      assert.equal(422, r.status)
      r = api.call(d, "POST", "/v3/requests/" .. id .. "/reject", { token = approver, json = { reason = "   " } })
      assert.equal(422, r.status)
      r = api.check(doc, api.call(d, "POST", "/v3/requests/" .. id .. "/reject",
        { token = approver, json = { reason = "wrong desk" } }), "POST", "/v3/requests/{id}/reject")
      assert.equal(200, r.status)
      assert.equal("REJECTED", r.json.request_state)
      local id2 = new_request()
      r = api.call(d, "POST", "/v3/requests/" .. id2 .. "/cancel", { token = operator })
      assert.equal(400, r.status)
      r = api.check(doc, api.call(d, "POST", "/v3/requests/" .. id2 .. "/cancel",
        { token = operator, json = { reason = "not needed" } }), "POST", "/v3/requests/{id}/cancel")
      assert.equal(200, r.status)
      assert.equal("CANCELLED", r.json.request_state)
      r = api.call(d, "POST", "/v3/requests/" .. id2 .. "/resume", { token = operator })
      assert.equal(409, r.status)
      assert.same({ "MANUAL_INTERVENTION", "FAILED" }, r.json.allowed_states)
      -- beside an UNKNOWN node: only with the client's word that the provider was asked
      local id3 = new_request()
      qtg.db.with_session(function(x)   -- as if its submit had been lost (the transition guard off)
        common.unfrozen(x, "UPDATE movement_request_nodes SET node_state = 'UNKNOWN' WHERE request_id = $1::uuid "
          .. "AND node_key = 'withdraw'", id3)
      end)
      r = api.call(d, "POST", "/v3/requests/" .. id3 .. "/cancel", { token = operator, json = { reason = "stuck" } })
      assert.equal(409, r.status, r.body)
      assert.truthy(r.json.detail:find("node withdraw is UNKNOWN", 1, true), r.body)
      r = api.call(d, "POST", "/v3/requests/" .. id3 .. "/cancel",
        { token = operator, json = { reason = "stuck", reconciled = "yes" } })
      assert.equal(422, r.status, r.body)
      r = api.check(doc, api.call(d, "POST", "/v3/requests/" .. id3 .. "/cancel",
        { token = operator, json = { reason = "the venue shows no withdrawal", reconciled = true } }),
        "POST", "/v3/requests/{id}/cancel")
      assert.equal(200, r.status, r.body)
      assert.equal("CANCELLED", r.json.request_state)
    end)

    it("runs a movement to its manual step and completes it through /v3/nodes/{id}/complete", function()
      local id = new_request()
      assert.equal(200, api.call(d, "POST", "/v3/requests/" .. id .. "/approve", { token = approver }).status)
      local manual = common.wait_for(function()
        local r = api.call(d, "GET", "/v3/requests/" .. id, { token = reader })
        for _, n in ipairs(r.json.nodes) do
          if n.node_key == "desk_confirmation" and n.node_state == "READY" then return n end
        end
        return nil, r.json.request_state
      end, 60, "the manual step to be READY")
      local retry = api.call(d, "POST", "/v3/nodes/" .. manual.id .. "/retry", { token = operator })
      assert.equal(409, retry.status)
      local desk = api.token("read,operate")
      local missing = api.call(d, "POST", "/v3/nodes/" .. manual.id .. "/complete",
        { token = desk, json = { input = {} } })
      assert.equal(422, missing.status)
      assert.truthy(missing.json.detail:match("desk_reference"))
      -- the initiator attesting its own request's step: refused (four eyes)
      local own = api.call(d, "POST", "/v3/nodes/" .. manual.id .. "/complete",
        { token = operator, key = common.uid("k", 4), json = { input = { desk_reference = "D-1" } } })
      assert.equal(403, own.status, own.body)
      assert.truthy(own.json.detail:find("four eyes", 1, true), own.body)
      local done = api.check(doc, api.call(d, "POST", "/v3/nodes/" .. manual.id .. "/complete",
        { token = desk, key = common.uid("k", 4), json = { input = { desk_reference = "D-1" } } }),
        "POST", "/v3/nodes/{id}/complete")
      assert.equal(200, done.status, done.body)
      common.wait_for(function()
        local r = api.call(d, "GET", "/v3/requests/" .. id, { token = reader })
        return r.json.request_state == "COMPLETED", r.json.request_state
      end, 30, "the request to complete")
      -- each node says whether it moved money, as the database has it
      local seen = api.check(doc, api.call(d, "GET", "/v3/requests/" .. id, { token = reader }),
        "GET", "/v3/requests/{id}")
      local stored = {}
      for _, r in ipairs(rows("SELECT node_key, side_effect FROM movement_request_nodes WHERE request_id = $1::uuid",
        id)) do stored[r.node_key] = r.side_effect end
      for _, n in ipairs(seen.json.nodes) do assert.equal(stored[n.node_key], n.side_effect, n.node_key) end
      local unknown = api.call(d, "POST", "/v3/nodes/00000000-0000-4000-8000-000000000000/retry", { token = operator })
      assert.equal(404, unknown.status)
      -- another class's node is a node that does not exist: its request's id is not told
      assert.not_equal(d.class, qtg.settings.network_class)
      local other = qtg.db.with_session(function(s)
        return require("qtg.requests").create(s, { template_key = "otc_settlement_manual", intent = api.OTC_INTENT,
          idempotency_key = common.uid("other", 4) }, "system:spec")
      end)
      local node_id = rows("SELECT id::text AS id FROM movement_request_nodes WHERE request_id = $1::uuid LIMIT 1",
        other.id)[1].id
      for _, action in ipairs({ "retry", "complete" }) do
        local r = api.call(d, "POST", "/v3/nodes/" .. node_id .. "/" .. action, { token = operator,
          key = common.uid("k", 4), json = action == "complete" and { input = { desk_reference = "D-2" } } or nil })
        assert.equal(404, r.status, r.body)
        assert.equal("node " .. node_id .. " does not exist", r.json.detail)
        assert.falsy(r.body:find(other.id, 1, true), r.body)
      end
    end)
  end)

  describe("GET /v3/requests", function()
    it("pages by cursor without gaps or repeats while rows are inserted", function()
      local initial = {}
      for _ = 1, 7 do
        local r = create(operator, common.uid("p", 6))
        initial[r.json.id] = true
      end
      local seen, cursor, pages = {}, nil, 0
      repeat
        local path = "/v3/requests?limit=3&template_key=otc_settlement_manual" .. (cursor and ("&cursor=" .. cursor) or "")
        local r = api.check(doc, api.call(d, "GET", path, { token = reader }), "GET", "/v3/requests")
        assert.equal(200, r.status, r.body)
        assert.truthy(#r.json.items <= 3)
        for _, item in ipairs(r.json.items) do
          assert.is_nil(seen[item.id], "repeated " .. item.id)
          seen[item.id] = true
        end
        -- a new request lands between pages
        create(operator, common.uid("p", 6))
        cursor = r.json.next_cursor ~= cjson.null and r.json.next_cursor or nil
        pages = pages + 1
      until not cursor or pages > 50
      for id in pairs(initial) do assert.truthy(seen[id], "gap: " .. id) end
    end)

    it("filters by state and creation time", function()
      local r = api.call(d, "GET", "/v3/requests?state=rejected", { token = reader })
      assert.equal(200, r.status)
      for _, item in ipairs(r.json.items) do assert.equal("REJECTED", item.request_state) end
      r = api.call(d, "GET", "/v3/requests?created_after=2999-01-01T00:00:00Z", { token = reader })
      assert.equal(0, #r.json.items)
      r = api.call(d, "GET", "/v3/requests?created_after=yesterday", { token = reader })
      assert.equal(400, r.status)
    end)
  end)

  describe("the other routes", function()
    it("answers the read routes with documented shapes", function()
      for _, p in ipairs({ "/v3/workers", "/v3/templates", "/v3/balances", "/v3/signers", "/v3/callbacks" }) do
        local r = api.check(doc, api.call(d, "GET", p, { token = reader }), "GET", p)
        assert.equal(200, r.status, p .. " " .. r.body)
      end
      local w = api.call(d, "GET", "/v3/workers", { token = reader }).json.items
      assert.truthy(#w > 0)
      -- a fresh read calls the venue and writes a snapshot: operate only
      local r = api.call(d, "GET", "/v3/balances?fresh=true&venue_key=nowhere", { token = reader })
      assert.equal(403, r.status, r.body)
      assert.truthy(r.json.detail:find("operate role that fresh=true requires", 1, true), r.body)
      r = api.call(d, "GET", "/v3/balances?fresh=true&venue_key=nowhere", { token = operator })
      assert.equal(404, r.status, r.body)
      r = api.call(d, "GET", "/v3/balances?fresh=maybe", { token = reader })
      assert.equal(400, r.status)
    end)

    -- A venue's or an RPC's URL often carries its key (https://x/v3/KEY,
    -- ?api_key=); error text quotes it, and any read token read it whole.
    it("cuts every URL in a worker's and a venue's error to its endpoint; the journal keeps it whole", function()
      local dir = host.tmpdir()
      host.write(dir .. "/qtg/workers/init.lua", [[
local M = {}
function M.registry() return {
  { name = "leaky", group = "core", module = "spec_leaky", interval = 0.2, jitter = 0, enabled = true } } end
return M]])
      host.write(dir .. "/spec_leaky.lua", [[
local M = {}
function M.tick() error("GET https://venue.example/v1/KEYSECRET42/balances?api_key=abc failed: http 401", 0) end
return M]])
      local dl = api.start({ MG_LUA_PATH = dir })
      local reader = api.token("read", { class = dl.class })
      local ok, err = pcall(function()
        local seen = host.eventually(function()
          for _, w in ipairs(api.call(dl, "GET", "/v3/workers", { token = reader }).json.items) do
            if w.name == "leaky" and w.last_error ~= cjson.null then return w.last_error end
          end
        end, 30)
        assert.equals("GET https://venue.example/... failed: http 401", seen)
        assert.truthy(host.read(dl.h.log):find("KEYSECRET42", 1, true), "the journal keeps the text whole")
        rows([[INSERT INTO balance_snapshots (network_class, venue_key, asset, ok, error, source, process_id)
               VALUES ($1, 'leaky-venue', '*', false, $2, 'worker', 'spec')]], dl.class,
             "fetch from https://user:pw@venue.example:8443/v1/KEYSECRET42 refused (token=abc)")
        local b = api.check(doc, api.call(dl, "GET", "/v3/balances", { token = reader }), "GET", "/v3/balances")
        assert.equals(200, b.status, b.body)
        assert.equals("fetch from https://venue.example:8443/... refused (token=***)", b.json.items[1].last_error)
        assert.is_nil(b.body:find("KEYSECRET42", 1, true), b.body)
      end)
      api.stop(dl)
      os.execute("rm -rf " .. common.quote(dir))
      assert(ok, err)
    end)

    it("sets a signer's expected identity as admin only, audited", function()
      local key = common.uid("signer", 3)
      local r = api.check(doc, api.call(d, "PUT", "/v3/signers/" .. key .. "/expected-identity",
        { token = admin, json = { expected_signer_address = api.OTC_INTENT.destination } }),
        "PUT", "/v3/signers/{signer_key}/expected-identity")
      assert.equal(200, r.status, r.body)
      assert.equal(key, r.json.signer_key)
      local bad = api.call(d, "PUT", "/v3/signers/" .. key .. "/expected-identity",
        { token = admin, json = { expected_signer_address = "0x12" } })
      assert.equal(422, bad.status)
    end)

    it("lists dead-lettered callbacks, redelivers one, and counts a bulk redelivery first", function()
      local r = api.call(d, "POST", "/v3/requests", { token = operator, key = common.uid("k", 4),
        json = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT,
                 callback_url = "http://127.0.0.1:9/hook" } })
      assert.equal(201, r.status, r.body)
      -- the dispatcher dead-letters after its attempts; here the row is put there directly
      local cb = rows([[UPDATE movement_callback_outbox SET status = 'dlq', attempts = max_attempts,
                          last_error = 'refused' WHERE request_id = $1::uuid RETURNING id]], r.json.id)[1]
      local list = api.check(doc, api.call(d, "GET", "/v3/callbacks?status=dlq", { token = reader }),
        "GET", "/v3/callbacks")
      local found = false
      for _, item in ipairs(list.json.items) do if item.id == cb.id then found = true end end
      assert.truthy(found)
      local dry = api.check(doc, api.call(d, "POST", "/v3/callbacks/redeliver",
        { token = operator, json = { request_id = r.json.id } }), "POST", "/v3/callbacks/redeliver")
      assert.equal(200, dry.status, dry.body)
      assert.is_true(dry.json.dry_run)
      assert.equal(1, dry.json.count)
      assert.equal(0, rows("SELECT count(*) AS n FROM movement_callback_outbox WHERE redelivery_of = $1", cb.id)[1].n)
      local one = api.check(doc, api.call(d, "POST", "/v3/callbacks/" .. cb.id .. "/redeliver", { token = operator }),
        "POST", "/v3/callbacks/{id}/redeliver")
      assert.equal(201, one.status, one.body)
      assert.equal(cb.id, one.json.redelivery_of)
      local twice = api.call(d, "POST", "/v3/callbacks/" .. one.json.id .. "/redeliver", { token = operator })
      assert.equal(409, twice.status)
      -- the dead row again while its copy is still pending: a conflict
      -- naming the copy, not a server error
      local again = api.check(doc, api.call(d, "POST", "/v3/callbacks/" .. cb.id .. "/redeliver", { token = operator }),
        "POST", "/v3/callbacks/{id}/redeliver")
      assert.equal(409, again.status, again.body)
      assert.equal("conflict", again.json.kind)
      assert.matches("already redelivered as row " .. one.json.id .. ", which is still pending", again.json.detail, 1, true)
      assert.equal(404, api.call(d, "POST", "/v3/callbacks/999999999/redeliver", { token = operator }).status)
      assert.equal(1, rows("SELECT count(*) AS n FROM movement_callback_outbox WHERE redelivery_of = $1", cb.id)[1].n)
    end)
  end)

  describe("health and metrics", function()
    it("/readyz reports each check", function()
      local r = api.check(doc, api.call(d, "GET", "/readyz", { token = reader }), "GET", "/readyz")
      assert.equal(200, r.status, r.body)
      local by = {}
      for _, c in ipairs(r.json.checks) do by[c.name] = c.status end
      assert.same({ database = "ok", migrations = "ok", core_workers = "ok", signer = "not_configured" }, by)
    end)

    it("/readyz fails while the configured signer cannot be asked, and passes once it answers", function()
      local evm = require "spec.lua.support.evm"
      local dir = common.tmpdir("qtg-readyz")
      local socket = dir .. "/signer.sock"
      local sd = api.start({ MG_SIGNER_SOCKET = socket, MG_SIGNER_TIMEOUT_SECONDS = "2" })
      local reader = api.token("read", { class = sd.class })
      local function signer_check() return api.readyz(sd, doc, reader, "signer") end
      local ok, err = pcall(function()
        local r, c = signer_check()
        assert.equal(503, r.status, r.body)
        assert.is_false(r.json.ready)
        assert.equal("failing", c.status)
        assert.truthy(c.detail:find(socket, 1, true), c.detail)
        -- said once
        assert.falsy(c.detail:find("cannot be asked.*cannot be asked"), c.detail)
        local signer = evm.start_signer(evm.run_env("unused", { MG_SIGNER_SOCKET = socket }))
        r, c = signer_check()
        assert.equal(200, r.status, r.body)
        assert.equal("ok", c.status)
        assert.truthy(c.detail:find("with 0 keys", 1, true), c.detail)
        evm.host.stop(signer)
        r, c = signer_check()
        assert.equal(503, r.status, r.body)
        assert.equal("failing", c.status)
      end)
      api.stop(sd)
      os.execute("rm -rf " .. common.quote(dir))
      assert(ok, err)
    end)

    it("/metrics is Prometheus text with the table gauges and the HTTP counters", function()
      create(operator, common.uid("m", 4))
      local r = common.wait_for(function()
        local x = api.call(d, "GET", "/metrics", { token = reader })
        return x.body:find('qtg_requests{state="PENDING_APPROVAL"}', 1, true) and x
      end, 10, "the collector to see a pending request")
      assert.equal(200, r.status)
      assert.truthy(r.headers["content-type"]:match("^text/plain"))
      assert.truthy(r.body:find("# TYPE qtg_requests gauge", 1, true))
      assert.truthy(r.body:match('qtg_http_requests_total{route="create_request",method="POST",status="201"} %d+'))
      assert.truthy(r.body:find('qtg_http_request_duration_seconds_bucket{route="healthz",le="+Inf"}', 1, true)
        or r.body:find("qtg_http_request_duration_seconds_bucket", 1, true))
      assert.truthy(r.body:find("qtg_build_info{", 1, true))
      -- every sample line is "name{labels} value" with a metric name of the allowed characters
      for line in r.body:gmatch("[^\n]+") do
        if not line:match("^#") then
          assert.truthy(line:match("^[a-zA-Z_:][a-zA-Z0-9_:]*{?[^}]*}? [%d%.e+-]+$"), line)
        end
      end
      -- labels hold no ids
      assert.falsy(r.body:match("%x%x%x%x%x%x%x%x%-%x%x%x%x%-"))
    end)

    -- What the example alerts of docs/operations.md read.  A counter that
    -- first appears at 1 has no increase to Prometheus (the first signer
    -- refusal or busy stop never alerted); a worker failing every pass backs
    -- off to one error a minute, under any error-rate rule.
    it("/metrics has the alerted counters at 0 from the start and each worker's state and failures in a row", function()
      local body = api.call(d, "GET", "/metrics", { token = reader }).body
      for _, line in ipairs({ "qtg_signer_refusals_total 0", "qtg_http_server_errors_total 0",
                              'qtg_busy_stops_total{what="dispatch"} 0', 'qtg_busy_stops_total{what="observation"} 0',
                              'qtg_busy_stops_total{what="submit"} 0' }) do
        assert.truthy(body:find("\n" .. line .. "\n", 1, true), line)
      end
      assert.truthy(body:find('\nqtg_worker_state{worker="node_dispatcher",group="core",state="', 1, true), body)
      assert.truthy(body:find('\nqtg_worker_consecutive_errors{worker="node_dispatcher"} 0\n', 1, true), body)
      local age = tonumber(body:match('\nqtg_worker_last_pass_age_seconds{worker="node_dispatcher"} ([%d%.e+-]+)'))
      assert.truthy(age and age >= 0 and age < 60, body)
    end)

    -- A dead letter an operator redelivered is answered: counted, the
    -- alert on dead letters never cleared after the first.
    it("/metrics counts the dead letters nobody redelivered", function()
      local req = create(operator, common.uid("dlq", 4)).json
      local function dlq()
        local x = api.call(d, "GET", "/metrics", { token = reader }).body
        return tonumber(x:match('\nqtg_callbacks{status="dlq"} (%d+)')) or 0
      end
      local function dead_row()
        return rows([[INSERT INTO movement_callback_outbox (request_id, event_type, payload, status, attempts, max_attempts)
                      VALUES ($1::uuid, 'request_created', '{}', 'dlq', 5, 5) RETURNING id]], req.id)[1].id
      end
      local base = dlq()
      local first, second = dead_row(), dead_row()
      assert.is_true(common.wait_for(function() return dlq() == base + 2 end, 10, "two dead letters counted"))
      rows([[INSERT INTO movement_callback_outbox (request_id, event_type, payload, status, attempts, max_attempts,
                                                   delivered_at, redelivery_of)
             SELECT request_id, event_type, payload, 'delivered', 1, 5, now(), id FROM movement_callback_outbox
              WHERE id = $1]], first)
      assert.is_true(common.wait_for(function() return dlq() == base + 1 end, 10, "the redelivered one not counted"))
      assert.is_number(second)
    end)

    -- A gauge whose statement failed was left out of a 200 answer without a
    -- word, and the short answer was cached: an alert on it went quiet.
    it("/metrics logs and counts a gauge whose statement failed, and asks again at the next scrape", function()
      local ld = api.start({ MG_DB_LOCK_TIMEOUT_SECONDS = "1" })
      local lreader = api.token("read", { class = ld.class })
      local ok, err = pcall(function()
        local lock = qtg.db.acquire()
        lock:begin()
        lock:exec("LOCK TABLE audit_outbox IN ACCESS EXCLUSIVE MODE")
        local r = api.call(ld, "GET", "/metrics", { token = lreader })
        lock:rollback()
        lock:release()
        assert.equal(200, r.status)
        assert.falsy(r.body:find("\nqtg_audit_outbox_lag_seconds ", 1, true), r.body)
        assert.truthy(r.body:find('\nqtg_metrics_gauge_errors_total{gauge="qtg_audit_outbox_lag_seconds"} 1\n', 1, true),
          r.body)
        assert.truthy(r.body:find("\nqtg_requests", 1, true) or r.body:find("# TYPE qtg_requests gauge", 1, true))
        common.wait_log(ld.h, "a /metrics gauge's statement failed", 10, "the failed gauge logged")
        -- not cached: the next scrape, within the cache's 2 s, has it again
        r = api.call(ld, "GET", "/metrics", { token = lreader })
        assert.truthy(r.body:find("\nqtg_audit_outbox_lag_seconds ", 1, true), r.body)
      end)
      api.stop(ld)
      assert(ok, err)
    end)

    it("/metrics has each worker's pass durations and the approve -> SUBMITTED latency", function()
      local req = create(operator, common.uid("lat", 4)).json
      local second = api.token("read,approve")
      local r = api.call(d, "POST", "/v3/requests/" .. req.id .. "/approve", { token = approver,
        key = common.uid("a", 4) })
      assert.equal(200, r.status, r.body)
      if r.json.request_state == "PENDING_APPROVAL" then
        r = api.call(d, "POST", "/v3/requests/" .. req.id .. "/approve", { token = second, key = common.uid("a", 4) })
        assert.equal(200, r.status, r.body)
      end
      local body = common.wait_for(function()
        local x = api.call(d, "GET", "/metrics", { token = reader }).body
        local n = tonumber(x:match("\nqtg_approve_to_submitted_seconds_count (%d+)"))
        return n and n >= 1 and x
      end, 30, "a submitted node counted from its approval")
      assert.truthy(body:find("# TYPE qtg_approve_to_submitted_seconds histogram", 1, true))
      assert.truthy(body:find('qtg_approve_to_submitted_seconds_bucket{le="+Inf"}', 1, true))
      local sum = tonumber(body:match("\nqtg_approve_to_submitted_seconds_sum ([%d%.e+-]+)"))
      assert.truthy(sum and sum >= 0 and sum < 30, body)
      local passes = tonumber(body:match('qtg_worker_pass_duration_seconds_count{worker="node_dispatcher"} (%d+)'))
      assert.truthy(passes and passes >= 1, body)
      -- buckets are cumulative: +Inf holds every pass
      local inf = tonumber(body:match('qtg_worker_pass_duration_seconds_bucket{worker="node_dispatcher",le="%+Inf"} (%d+)'))
      assert.equal(passes, inf)
      -- the runtime's bucket bounds are qtg.metrics' (C and Lua name them apart)
      local les = {}
      for le in body:gmatch('qtg_worker_pass_duration_seconds_bucket{worker="node_dispatcher",le="([%d%.]+)"}') do
        les[#les + 1] = tonumber(le)
      end
      assert.same(require("qtg.metrics").BUCKETS, les)
      assert.truthy(body:find("# TYPE qtg_signer_decisions_total counter", 1, true))
    end)
  end)

  describe("/v3/openapi.json", function()
    it("documents every route and no other", function()
      local routes = require "qtg.api.routes"
      local expected = {}
      for _, r in ipairs(routes.LIST) do
        expected[r.method:lower() .. " " .. r.path] = true
        local op = doc.paths[r.path] and doc.paths[r.path][r.method:lower()]
        assert.truthy(op, "undocumented route " .. r.method .. " " .. r.path)
        assert.equal(r.name, op.operationId)
        if not r.public then assert.truthy(op.responses["401"]) end
        if r.requires_idempotency_key then
          local has = false
          for _, p in ipairs(op.parameters) do
            if p.name == "Idempotency-Key" and p.required then has = true end
          end
          assert.truthy(has)
        end
      end
      for path, ops in pairs(doc.paths) do
        for method in pairs(ops) do
          assert.truthy(expected[method .. " " .. path], "documented but not routed: " .. method .. " " .. path)
        end
      end
      assert.equal("3.1.0", doc.openapi)
    end)
  end)
end)

describe("HTTP API limits", function()
  local d2, tok
  setup(function()
    api = require "spec.lua.support.api"
    common = require "spec.lua.support.common"
    host = require "spec.lua.support.host"
    d2 = api.start({ MG_API_RATE_LIMIT_BURST = "3", MG_API_RATE_LIMIT_PER_SECOND = "0.05",
                     MG_API_MAX_CONNECTIONS = "3",
                     MG_API_CALLBACK_ALLOW_PRIVATE = "false", MG_WORKERS_ENABLED = "false" })
    tok = api.token("read,operate")
  end)
  teardown(function()
    api.stop(d2)
    host.stop_all()
  end)

  it("refuses callback_url hosts on loopback, private, link-local and metadata addresses", function()
    local refused = { "http://127.0.0.1/hook", "http://10.1.2.3/hook", "http://192.168.0.10:8080/h",
      "http://172.16.5.5/h", "http://169.254.169.254/latest/meta-data", "http://[::1]/h", "http://[fd00::1]/h",
      "http://[fe80::1]/h", "http://localhost/h", "http://api.localhost/h", "http://0x7f000001/h",
      "http://2130706433/h", "http://100.64.0.1/h", "http://0.0.0.0/h", "http://[::ffff:127.0.0.1]/h",
      "http://metadata.google.internal/computeMetadata/v1/" }
    local before = count_requests(d2.class)
    local other = api.token("operate")   -- a fresh rate-limit bucket for these calls
    for i, url in ipairs(refused) do
      local t = i <= 3 and other or api.token("operate")
      local r = api.call(d2, "POST", "/v3/requests", { token = t, key = common.uid("s", 4),
        json = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT, callback_url = url } })
      assert.equal(422, r.status, url .. " " .. r.body)
      assert.truthy(r.json.detail:match("callback_url"), r.body)
    end
    assert.equal(before, count_requests(d2.class))
  end)

  it("resolves callback_url names and refuses one that leads to a refused address, or nowhere", function()
    local p = io.popen("hostname")
    local name = p:read("*l")
    p:close()
    local g = io.popen("getent hosts " .. common.quote(name))
    local addr = (g:read("*l") or ""):match("^(%S+)")
    g:close()
    local cases = { { "http://no-such-host.invalid/h", "does not resolve" } }
    -- this machine's own name resolves to a loopback or private address here
    if addr and (addr:match("^127%.") or addr:match("^10%.") or addr:match("^192%.168%.") or addr:match("^172%.")) then
      cases[#cases + 1] = { "http://" .. name .. "/h", "resolving to " .. addr }
    end
    for _, c in ipairs(cases) do
      local r = api.call(d2, "POST", "/v3/requests", { token = api.token("operate"), key = common.uid("s", 4),
        json = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT, callback_url = c[1] } })
      assert.equal(422, r.status, c[1] .. " " .. r.body)
      assert.truthy(r.json.detail:find(c[2], 1, true), r.body)
    end
  end)

  it("answers 429 with Retry-After once a token is over its rate", function()
    local statuses = {}
    local last
    for i = 1, 5 do
      last = api.call(d2, "GET", "/v3/requests", { token = tok })
      statuses[i] = last.status
    end
    assert.same({ 200, 200, 200, 429, 429 }, statuses)
    assert.equal("rate_limited", last.json.kind)
    assert.truthy(tonumber(last.headers["retry-after"]) >= 1)
    -- another token is not limited by this one's use
    assert.equal(200, api.call(d2, "GET", "/v3/requests", { token = api.token("read") }).status)
  end)

  it("holds at most MG_API_MAX_CONNECTIONS connections and serves again once they close", function()
    local script = [[
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
held = [socket.create_connection((host, port), timeout=5) for _ in range(3)]
time.sleep(0.3)
extra = socket.create_connection((host, port), timeout=5)
extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
try:
    got = extra.recv(100)
except (ConnectionResetError, socket.timeout):
    got = b""
print("extra:" + ("closed" if got == b"" else got.decode("latin-1").split("\r\n")[0]))
held[0].sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
print("held:" + held[0].recv(100).decode("latin-1").split("\r\n")[0])
for s in held + [extra]:
    s.close()
]]
    local dir = host.tmpdir()
    host.write(dir .. "/conns.py", script)
    local h, port = d2.address:match("^(.-):(%d+)$")
    local rc, out = host.run({}, { "python3", common.quote(dir .. "/conns.py"), h, port })
    assert.equal(0, rc, out)
    assert.truthy(out:find("extra:closed", 1, true), out)
    assert.truthy(out:find("held:HTTP/1.1 200", 1, true), out)
    common.wait_for(function() return api.call(d2, "GET", "/healthz").status == 200 end, 10, "the API to serve again")
    os.execute("rm -rf " .. common.quote(dir))
  end)
end)

describe("HTTP API deadlines and shutdown", function()
  local d3, tok, sup, dir
  setup(function()
    api = require "spec.lua.support.api"
    common = require "spec.lua.support.common"
    host = require "spec.lua.support.host"
    sup = require "spec.lua.support.sidecar"
    dir = sup.tmpdir()
    -- a Gateway API that never answers: a fresh balance read waits on it
    local hang = sup.start_receiver(dir, "hang", { mode = "hang", args = { "--hang-seconds", "60" } })
    d3 = api.start({ MG_GATEWAY_API_URL = hang.url, MG_PROVIDER_TIMEOUT_SECONDS = "30",
                     MG_GATEWAY_DEPOSITORS = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8",
                     MG_API_REQUEST_TIMEOUT_SECONDS = "1", MG_WORKERS_ENABLED = "false" })
    tok = api.token("read,operate")
  end)
  teardown(function()
    host.stop_all()
    sup.cleanup()
  end)

  it("answers 503 when a handler runs past MG_API_REQUEST_TIMEOUT_SECONDS, and keeps serving", function()
    local before = common.query("SELECT count(*) AS n FROM balance_snapshots WHERE network_class = $1 AND ok",
      d3.class)[1].n
    local r = api.call(d3, "GET", "/v3/balances?fresh=true&venue_key=gateway", { token = tok })
    assert.equal(503, r.status, r.body)
    assert.equal("timeout", r.json.kind)
    assert.equal(200, api.call(d3, "GET", "/healthz").status)
    assert.equal(200, api.call(d3, "GET", "/v3/requests", { token = tok }).status)
    -- the interrupted read recorded no balance (the balances module may log
    -- the failed fetch itself, as a row with ok = false)
    assert.equal(before, common.query("SELECT count(*) AS n FROM balance_snapshots WHERE network_class = $1 AND ok",
      d3.class)[1].n)
    -- another fresh read at once starts no fetch (one every
    -- balances.FRESH_MIN_SECONDS): the latest snapshot, at once, not a 503
    r = api.call(d3, "GET", "/v3/balances?fresh=true&venue_key=gateway", { token = tok })
    assert.equal(200, r.status, r.body)
  end)

  it("shuts down cleanly with a request in flight", function()
    qtg.sleep(require("qtg.balances").FRESH_MIN_SECONDS)   -- the last fetch's start is that far back
    local task = qtg.spawn(function()
      return qtg.http.request{ url = d3.base .. "/v3/balances?fresh=true&venue_key=gateway", timeout = 20,
                               headers = { Authorization = "Bearer " .. tok } }
    end)
    qtg.sleep(0.3)
    api.stop(d3)   -- exit 0, no sanitizer report
    local ok, resp = qtg.join(task)
    assert.is_true(ok)
    -- the client got an answer (503) or a closed connection, never a hang
    if resp then assert.equal(503, resp.status) end
  end)
end)
