-- api_console_spec: what the web console needs from the daemon, over real
-- HTTP against a running qtgd: its static files under /ui/ (content types,
-- the CSP and framing headers, no token needed, and path traversal
-- attacked with raw requests that no client library normalises), and the
-- API routes it reads: GET /v3/me, the request filters, the approvals
-- inbox with its digest, the DAG's edges, workers and heartbeats.  Every
-- API answer is validated against /v3/openapi.json.
local cjson = require "cjson"

local api, common, host
local d, doc
local reader, operator, approver, approve_only

local function rows(sql, ...) return common.query(sql, ...) end

local function create(intent, token)
  local body = { template_key = "otc_settlement_manual", intent = intent }
  local r = api.call(d, "POST", "/v3/requests", { token = token or operator, key = common.uid("k", 6), json = body })
  assert.equal(201, r.status, r.body)
  return r.json.id
end

local function with(over)
  local t = {}
  for k, v in pairs(api.OTC_INTENT) do t[k] = v end
  for k, v in pairs(over) do t[k] = v end
  return t
end

local function ids(path, token)
  local r = api.check(doc, api.call(d, "GET", path, { token = token or reader }), "GET", "/v3/requests")
  assert.equal(200, r.status, r.body)
  local set = {}
  for _, item in ipairs(r.json.items) do set[item.id] = true end
  return set, r
end

-- raw(path) -> status line and body of "GET <path>" sent byte for byte.
local function raw(path)
  local dir = host.tmpdir()
  host.write(dir .. "/raw.py", [[
import os, socket, sys
host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = socket.create_connection((host, port), timeout=10)
s.sendall(b"GET " + os.fsencode(path) + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
sys.stdout.write(data.decode("latin-1"))
]])
  local h, port = d.address:match("^(.-):(%d+)$")
  local rc, out = host.run({}, { "python3", common.quote(dir .. "/raw.py"), h, port, common.quote(path) })
  os.execute("rm -rf " .. common.quote(dir))
  assert.equal(0, rc, out)
  local status = tonumber(out:match("^HTTP/1%.1 (%d%d%d)"))
  return status, out:match("\r\n\r\n(.*)$") or "", out
end

describe("the web console's needs", function()
  setup(function()
    api = require "spec.lua.support.api"
    common = require "spec.lua.support.common"
    host = require "spec.lua.support.host"
    d = api.start()
    reader = api.token("read")
    operator = api.token("read,operate")
    approver = api.token("read,approve")
    approve_only = api.token("approve")
    doc = api.call(d, "GET", "/v3/openapi.json", { token = reader }).json
  end)
  teardown(function()
    api.stop(d)
    host.stop_all()
  end)

  describe("static files under /ui/", function()
    it("serves the console without a token, with its content types and security headers", function()
      local cases = { { "/ui/", "text/html; charset=utf-8", "<!doctype html>" },
                      { "/ui/index.html", "text/html; charset=utf-8", "js/main.js" },
                      { "/ui/app.css", "text/css; charset=utf-8", "st-completed" },
                      { "/ui/js/main.js", "text/javascript; charset=utf-8", "import" },
                      { "/ui/favicon.svg", "image/svg+xml", "<svg" } }
      for _, c in ipairs(cases) do
        local r = api.call(d, "GET", c[1])
        assert.equal(200, r.status, c[1])
        assert.equal(c[2], r.headers["content-type"], c[1])
        assert.truthy(r.body:find(c[3], 1, true), c[1])
        local csp = r.headers["content-security-policy"]
        assert.truthy(csp and csp:find("script-src 'self'", 1, true), c[1])
        assert.truthy(csp:find("frame-ancestors 'none'", 1, true))
        assert.falsy(csp:find("unsafe", 1, true))
        assert.equal("DENY", r.headers["x-frame-options"])
        assert.equal("nosniff", r.headers["x-content-type-options"])
        assert.equal("no-referrer", r.headers["referrer-policy"])
      end
      local redirect = api.call(d, "GET", "/ui")
      assert.equal(308, redirect.status)
      assert.equal("/ui/", redirect.headers["location"])
      assert.equal(405, api.call(d, "POST", "/ui/index.html", { body = "x" }).status)
    end)

    it("has no inline script or style in its pages", function()
      local html = api.call(d, "GET", "/ui/").body
      for tag in html:gmatch("<script[^>]*>") do
        assert.truthy(tag:match('src="'), "inline script: " .. tag)
      end
      assert.falsy(html:find("<style", 1, true))
      assert.falsy(html:find(" style=", 1, true))
      assert.falsy(html:lower():find(" on%a+="))
    end)

    it("serves no file outside ui/, whatever the path says", function()
      -- /etc/passwd, the daemon's own Lua and the spec itself must stay unreadable
      local attacks = {
        "/ui/../../../../../../etc/passwd", "/ui/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/ui/..%2f..%2f..%2f..%2fetc%2fpasswd", "/ui/%252e%252e/%252e%252e/etc/passwd",
        "/ui/js/../../lua/qtg/api/ui.lua", "/ui/..%5c..%5clua%5cqtg%5capi%5cui.lua",
        "/ui/../spec/lua/api/api_console_spec.lua", "/ui//etc/passwd",
        "/ui/.git/config", "/ui/js/.%2e/.%2e/lua/qtg/api/ui.lua", "/ui/%2fetc%2fpasswd",
        "/ui/js", "/ui/js/", "/ui/index.lua", "/ui/" .. string.rep("a/", 300) .. "x.js",
        "/ui/\xc0\xae\xc0\xae/etc/passwd",
      }
      for _, path in ipairs(attacks) do
        local status, body = raw(path)
        assert.truthy(status == 404 or status == 400, path .. " answered " .. tostring(status))
        assert.falsy(body:find("root:", 1, true), path)
        assert.falsy(body:find("qtg.api.ui", 1, true), path)
        assert.falsy(body:find("api_console_spec", 1, true) and not body:find("no console file", 1, true), path)
      end
      -- the same server still serves the real file
      local status, body = raw("/ui/js/main.js")
      assert.equal(200, status)
      assert.truthy(body:find("import", 1, true))
      -- a decoded NUL ends the path where libmicrohttpd hands it over: what
      -- is served is the file before it, inside ui/, never the suffix
      local nul_status, nul_body = raw("/ui/js/main.js%00.html")
      assert.equal(200, nul_status)
      assert.equal(body, nul_body)
    end)

    it("leaves the API's own authentication alone", function()
      assert.equal(401, api.call(d, "GET", "/v3/requests").status)
      assert.equal(404, api.call(d, "GET", "/uix").status)
    end)
  end)

  describe("GET /v3/me", function()
    it("answers every valid token with its principal and roles, and no token with 401", function()
      for tok, roles in pairs({ [reader] = { "read" }, [operator] = { "read", "operate" },
                                [approve_only] = { "approve" } }) do
        local r = api.check(doc, api.call(d, "GET", "/v3/me", { token = tok }), "GET", "/v3/me")
        assert.equal(200, r.status, r.body)
        assert.same(roles, r.json.roles)
        assert.truthy(r.json.actor:match("^api:"))
        assert.equal(d.class, r.json.network_class)
      end
      assert.equal(401, api.call(d, "GET", "/v3/me").status)
      assert.equal(401, api.call(d, "GET", "/v3/me", { token = "qtg_" .. string.rep("B", 43) }).status)
    end)
  end)

  describe("GET /v3/requests filters", function()
    it("filters by asset, amount range, destination and error code", function()
      local dest = "0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc"
      -- acme's second wallet (otc_settlement_manual's counterparty_allowlist_required)
      require("spec.lua.support.book").ensure_all({ { asset = "USDC", chain = "ethereum", address = dest, label = "acme" } })
      local small = create(with{ amount = "5" })
      local big = create(with{ amount = "2500.50", destination = dest })
      local eth = create(with{ asset = "USDT", amount = "1.25" })
      local set = ids("/v3/requests?asset=USDC&amount_min=100")
      assert.truthy(set[big]); assert.falsy(set[small]); assert.falsy(set[eth])
      set = ids("/v3/requests?amount_max=10&asset=USDC")
      assert.truthy(set[small]); assert.falsy(set[big])
      set = ids("/v3/requests?amount_min=1&amount_max=2")
      assert.truthy(set[eth]); assert.falsy(set[small]); assert.falsy(set[big])
      -- destination compares without case
      set = ids("/v3/requests?destination=" .. dest:upper():gsub("^0X", "0x"))
      assert.truthy(set[big]); assert.falsy(set[small])
      -- an error code on a node finds its request
      rows([[UPDATE movement_request_nodes SET error_code = 'console_spec_code'
              WHERE request_id = $1::uuid AND node_key = (SELECT min(node_key) FROM movement_request_nodes
                                                            WHERE request_id = $1::uuid)]], small)
      set = ids("/v3/requests?error_code=console_spec_code")
      assert.truthy(set[small]); assert.falsy(set[big])
      for _, bad in ipairs({ "amount_min=ten", "amount_max=-1", "amount_min=1e9", "asset=",
                             "destination=" .. string.rep("a", 201) }) do
        local r = api.call(d, "GET", "/v3/requests?" .. bad, { token = reader })
        assert.equal(400, r.status, bad)
        assert.equal("bad_request", r.json.kind)
      end
    end)
  end)

  describe("GET /v3/approvals", function()
    it("lists what waits for this principal, with the approval document and its digest", function()
      local id = create(with{ amount = "42" })
      local r = api.check(doc, api.call(d, "GET", "/v3/approvals?limit=200", { token = approver }),
        "GET", "/v3/approvals")
      assert.equal(200, r.status, r.body)
      local item
      for _, it_ in ipairs(r.json.items) do if it_.id == id then item = it_ end end
      assert.truthy(item, "the new request is in the approver's inbox")
      local db = rows([[SELECT qtg_approval_digest(r) AS digest, qtg_approval_document(r)::text AS doc
                          FROM movement_requests r WHERE id = $1::uuid]], id)[1]
      assert.equal(db.digest, item.digest)
      assert.same(cjson.decode(db.doc), item.approval_document)
      assert.equal("42", item.approval_document.intent.amount)
      -- an approve-only token has an inbox too; a reader has none; the creator's own request is not in its inbox
      assert.equal(200, api.call(d, "GET", "/v3/approvals", { token = approve_only }).status)
      assert.equal(403, api.call(d, "GET", "/v3/approvals", { token = reader }).status)
      local both = api.token("read,operate,approve")
      local own = create(with{ amount = "43" }, both)
      local mine = api.call(d, "GET", "/v3/approvals?limit=200", { token = both }).json
      for _, x in ipairs(mine.items) do assert.not_equal(own, x.id) end
      -- once decided it leaves the inbox
      assert.equal(200, api.call(d, "POST", "/v3/requests/" .. id .. "/approve", { token = approver }).status)
      local after = api.call(d, "GET", "/v3/approvals?limit=200", { token = approver }).json
      for _, x in ipairs(after.items) do assert.not_equal(id, x.id) end
    end)

    it("pages by cursor", function()
      for i = 1, 3 do create(with{ amount = tostring(100 + i) }) end
      local seen, cursor, pages = {}, nil, 0
      repeat
        local r = api.check(doc, api.call(d, "GET", "/v3/approvals?limit=2" .. (cursor and ("&cursor=" .. cursor) or ""),
          { token = approve_only }), "GET", "/v3/approvals")
        assert.equal(200, r.status, r.body)
        assert.truthy(#r.json.items <= 2)
        for _, item in ipairs(r.json.items) do
          assert.is_nil(seen[item.id]); seen[item.id] = true
        end
        cursor = r.json.next_cursor ~= cjson.null and r.json.next_cursor or nil
        pages = pages + 1
      until not cursor or pages > 100
      local n = rows([[SELECT count(*)::int AS n FROM movement_requests WHERE network_class = $1
                         AND request_state = 'PENDING_APPROVAL']], d.class)[1].n
      local count = 0
      for _ in pairs(seen) do count = count + 1 end
      assert.equal(n, count)
      assert.truthy(pages >= 2)
    end)
  end)

  describe("what the detail and health pages read", function()
    it("gives the request's DAG edges as the plan has them, and what a manual step needs", function()
      local id = create(with{ amount = "7" })
      local r = api.check(doc, api.call(d, "GET", "/v3/requests/" .. id, { token = reader }),
        "GET", "/v3/requests/{id}")
      local want = rows([[
        SELECT fn.node_key AS f, tn.node_key AS t FROM movement_requests r
          JOIN plan_edges e ON e.plan_version_id = r.plan_version_id
          JOIN plan_nodes fn ON fn.id = e.from_node_id JOIN plan_nodes tn ON tn.id = e.to_node_id
         WHERE r.id = $1::uuid ORDER BY 1, 2]], id)
      assert.truthy(#want > 0)
      local got = {}
      for _, e in ipairs(r.json.edges) do got[#got + 1] = e.from .. ">" .. e.to end
      table.sort(got)
      local expect = {}
      for _, e in ipairs(want) do expect[#expect + 1] = e.f .. ">" .. e.t end
      assert.same(expect, got)
      -- a manual step says what completing it needs; other nodes have no such field
      for _, n in ipairs(r.json.nodes) do
        if n.node_kind == "manual" then
          assert.same({ "desk_reference" }, n.manual.required_inputs)
          assert.truthy(n.manual.instructions:find("OTC desk", 1, true))
        else
          assert.is_nil(n.manual)
        end
      end
    end)

    it("lists workers with their intervals and every process's heartbeats", function()
      local w = api.check(doc, api.call(d, "GET", "/v3/workers", { token = reader }), "GET", "/v3/workers").json
      assert.truthy(#w.items > 0)
      for _, x in ipairs(w.items) do
        assert.equal("number", type(x.interval))
        assert.equal("boolean", type(x.paused))
      end
      local hb = common.wait_for(function()
        local r = api.check(doc, api.call(d, "GET", "/v3/heartbeats", { token = reader }), "GET", "/v3/heartbeats")
        return #r.json.items > 0 and r.json
      end, 20, "heartbeat rows")
      local n = rows("SELECT count(*)::int AS n FROM worker_heartbeats WHERE network_class = $1", d.class)[1].n
      assert.equal(n, #hb.items)
      assert.is_false(hb.items[1].stale)
    end)
  end)
end)
