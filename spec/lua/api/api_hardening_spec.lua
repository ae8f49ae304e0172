-- api_hardening_spec: the findings of the API's security review, each over
-- real HTTP (or a raw socket) against a running qtgd on 127.0.0.1:
--   * a JSON body with a key given twice, at any depth, is refused (400)
--     and nothing is written (cjson kept the last: "amount" 10 then
--     4000000 was stored as 4000000);
--   * a database outage is answered 503 with a fixed detail, never libpq's
--     text (socket path, host, port, role), which goes to the log;
--   * bad cursors and times are 400, not a 500 from PostgreSQL;
--   * a request with both Content-Length and Transfer-Encoding is refused
--     and its connection closed (request smuggling behind a proxy), and so
--     is one with Content-Length twice, a header name with whitespace before
--     its colon, a framing header continued on a second line (obs-fold), or
--     a Transfer-Encoding other than one 'chunked': one 400, nothing after;
--   * a path with an empty segment or a percent-encoding matches no route;
--   * slow clients: trickled headers and trickled bodies are cut off at
--     their deadlines, one address holds at most its share of connections.
local qtg = require "qtg"
local cjson = require "cjson"

local api, common, host
local d, operator, reader

local function rows(sql, ...) return common.query(sql, ...) end

local function count_requests(class)
  return rows("SELECT count(*) AS n FROM movement_requests WHERE network_class = $1", class)[1].n
end

local function hex(s)
  return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

local function expect_problem(status, kind, r, what)
  assert.equal(status, r.status, (what or "") .. " " .. r.body)
  assert.equal("application/problem+json", r.headers["content-type"], what)
  local doc = cjson.decode(r.body)
  assert.equal(kind, doc.kind, what)
  assert.equal(status, doc.status, what)
  return doc
end

-- The Python the raw-socket scripts share: read_all(s) -> what the daemon
-- sent on s until it closed the connection ("...TIMEOUT" appended after 5 s
-- of nothing), the socket closed.
local PY_READ_ALL = [[
import socket, sys
def read_all(s):
    got = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
    except socket.timeout:
        got += b"...TIMEOUT"
    except OSError:
        pass
    s.close()
    return got
]]

-- python_against(d, script[, input]) -> rc, output of a python3 script
-- run with the daemon's host and port as its arguments (input: its stdin)
local function python_against(daemon, script, input)
  local dir = host.tmpdir()
  host.write(dir .. "/client.py", script)
  local words = { "python3", common.quote(dir .. "/client.py") }
  words[3], words[4] = daemon.address:match("^(.-):(%d+)$")
  if input then
    host.write(dir .. "/in", input)
    words[5], words[6] = "<", common.quote(dir .. "/in")
  end
  local rc, out = host.run({}, words)
  os.execute("rm -rf " .. common.quote(dir))
  return rc, out
end

-- raw(d, bytes) -> everything the daemon sent back until it closed the
-- connection (or 5 s passed: then "...TIMEOUT" is appended)
local function raw(daemon, bytes)
  local rc, out = python_against(daemon, PY_READ_ALL .. [[
host, port = sys.argv[1], int(sys.argv[2])
data = sys.stdin.buffer.read()
s = socket.create_connection((host, port), timeout=5)
s.sendall(data)
sys.stdout.write(read_all(s).decode("latin-1"))
]], bytes)
  assert.equal(0, rc, out)
  return out
end

describe("HTTP API hardening", function()
  setup(function()
    api = require "spec.lua.support.api"
    common = require "spec.lua.support.common"
    host = require "spec.lua.support.host"
    d = api.start({ MG_WORKERS_ENABLED = "false" })
    operator = api.token("read,operate")
    reader = api.token("read")
  end)
  teardown(function()
    api.stop(d)
    host.stop_all()
  end)

  it("refuses a body with a key given twice, at any depth, and writes nothing", function()
    local before = count_requests(d.class)
    local intent = '"asset":"USDC","venue":"otc-desk","destination":"0x70997970c51812dc3a010c7d01b50e0d17dc79c8","destination_chain":"ethereum",'
      .. '"counterparty":"acme"'
    local bodies = {
      -- the review's case: the amount given twice inside the intent
      { '{"template_key":"otc_settlement_manual","intent":{"amount":"10","amount":"4000000",' .. intent .. '}}',
        '"amount"', "$.intent" },
      -- at the top
      { '{"template_key":"otc_settlement_manual","template_key":"otc_settlement_manual","intent":{"amount":"10",'
        .. intent .. '}}', '"template_key"', "$" },
      -- spelled differently, one key once unescaped
      { '{"template_key":"otc_settlement_manual","intent":{"amount":"10","\\u0061mount":"4000000",' .. intent .. '}}',
        '"amount"', "$.intent" },
      -- deeper: inside an object inside an array inside the intent
      { '{"template_key":"otc_settlement_manual","intent":{"amount":"10",' .. intent
        .. ',"legs":[{"x":1},{"y":1,"y":2}]}}', '"y"', "$.intent.legs[]" },
    }
    for _, b in ipairs(bodies) do
      local r = api.call(d, "POST", "/v3/requests", { token = operator, key = common.uid("k", 4),
        body = b[1], headers = { ["Content-Type"] = "application/json" } })
      local doc = expect_problem(400, "bad_request", r, b[1])
      assert.truthy(doc.detail:find("duplicate key " .. b[2], 1, true), doc.detail)
      assert.truthy(doc.detail:find(" in " .. b[3], 1, true), doc.detail)
    end
    -- the same body with one amount is accepted, with that amount
    local ok = api.call(d, "POST", "/v3/requests", { token = operator, key = common.uid("k", 4),
      body = '{"template_key":"otc_settlement_manual","intent":{"amount":"10",' .. intent .. '}}',
      headers = { ["Content-Type"] = "application/json" } })
    assert.equal(201, ok.status, ok.body)
    assert.equal(before + 1, count_requests(d.class))
    assert.equal("10", rows("SELECT intent->>'amount' AS a FROM movement_requests WHERE id = $1", ok.json.id)[1].a)
  end)

  -- cjson reads hex, a leading zero, NaN and raw tabs in strings, and
  -- rounds an integer past 2^53: 9223372036854775808 was stored as
  -- 9223372036854775800, 0x10 as 16 (a review, session 37).
  it("refuses a body that is not strict JSON, and a number of 2^53 or more, and writes nothing", function()
    local before = count_requests(d.class)
    local intent = '"amount":"10","asset":"USDC","venue":"otc-desk","destination":"0x70997970c51812dc3a010c7d01b50e0d17dc79c8",'
      .. '"destination_chain":"ethereum","counterparty":"acme"'
    local function body(params)
      return '{"template_key":"otc_settlement_manual","intent":{' .. intent .. '},"input_params":{"n":' .. params .. '}}'
    end
    for _, c in ipairs({
      { body("0x10"), "malformed JSON: byte " },
      { body("010"), "a number with a leading zero" },
      { body("NaN"), "malformed JSON: byte " },
      { body("+1"), "malformed JSON: byte " },
      { body("1."), "a '.' without digits after it" },
      { body('"a\tb"'), "a raw control character in a string" },
      { body("9223372036854775808"), "body.input_params.n is a number of 2^53 or more" },
      { body("9007199254740992"), "body.input_params.n is a number of 2^53 or more" },
      { body("-9007199254740992"), "body.input_params.n is a number of 2^53 or more" },
      { body("[1, 1e300]"), "body.input_params.n[2] is a number of 2^53 or more" },
    }) do
      local r = api.call(d, "POST", "/v3/requests", { token = operator, key = common.uid("k", 4),
        body = c[1], headers = { ["Content-Type"] = "application/json" } })
      local doc = expect_problem(400, "bad_request", r, c[1])
      assert.truthy(doc.detail:find(c[2], 1, true), c[1] .. ": " .. doc.detail)
    end
    assert.equal(before, count_requests(d.class))
    -- the largest integer a double holds exactly, and a fraction: taken as sent
    local ok = api.call(d, "POST", "/v3/requests", { token = operator, key = common.uid("k", 4),
      body = body("[9007199254740991, -9007199254740991, 0.5, 1e3]"), headers = { ["Content-Type"] = "application/json" } })
    assert.equal(201, ok.status, ok.body)
    assert.equal("[9007199254740991, -9007199254740991, 0.5, 1000]",
      rows("SELECT input_params->>'n' AS n FROM movement_requests WHERE id = $1", ok.json.id)[1].n)
  end)

  -- The review's attack: a body of 1,000 nested objects, each with one key
  -- of about 1 KB (1 MB, under MG_API_MAX_BODY_BYTES), from a token of
  -- scope own.  cjson took 1,000 levels and the duplicate-key check built
  -- each level's path text from the one above: 500 MB and 1.5 s of the
  -- loop for one request.  Bodies now stop at 64 levels (as deep as
  -- anything stored), and no check makes text per level.
  it("refuses a body nested past 64 levels, and a deep body of long keys costs the daemon no memory", function()
    local own = api.token("read,operate", { scope = "own" })
    local function nested(depth, key)
      return string.rep('{"' .. key .. '":', depth) .. "1" .. string.rep("}", depth)
    end
    local function vm_hwm_kb()
      local f = assert(io.open("/proc/" .. d.h.pid .. "/status"))
      local text = f:read("*a")
      f:close()
      return tonumber(text:match("VmHWM:%s*(%d+)"))
    end
    local before = vm_hwm_kb()
    local attack = nested(1000, string.rep("k", 1040))
    assert.truthy(#attack > 1000000 and #attack < 1048576, #attack)
    local r = api.call(d, "POST", "/v3/requests", { token = own, key = common.uid("k", 4), body = attack,
      headers = { ["Content-Type"] = "application/json" } })
    local grew = vm_hwm_kb() - before
    assert.truthy(grew < 64 * 1024, "the daemon's peak memory grew by " .. grew .. " kB")
    local doc = expect_problem(400, "bad_request", r, "the deep body")
    assert.truthy(doc.detail:find("too many nested", 1, true), doc.detail)
    -- 64 levels of the same keys: parsed, and refused for what it says
    r = api.call(d, "POST", "/v3/requests", { token = own, key = common.uid("k", 4),
      body = nested(64, string.rep("k", 1040)), headers = { ["Content-Type"] = "application/json" } })
    expect_problem(422, "unknown_field", r, "64 levels")
    -- 65 levels: malformed, however short the keys
    r = api.call(d, "POST", "/v3/requests", { token = own, key = common.uid("k", 4), body = nested(65, "a"),
      headers = { ["Content-Type"] = "application/json" } })
    doc = expect_problem(400, "bad_request", r, "65 levels")
    assert.truthy(doc.detail:find("too many nested", 1, true), doc.detail)
  end)

  -- The checks that name a path in a document make its text only for what
  -- they report: on the way down, each level's text copied the one above.
  it("finds a duplicate key or a bad string deep in long keys in memory linear in the text", function()
    local canon = require "qtg.canon_json"
    local function allocated_kb(fn)
      collectgarbage("collect")
      collectgarbage("stop")
      local before = collectgarbage("count")
      local a, b = fn()
      local used = collectgarbage("count") - before
      collectgarbage("restart")
      return used, a, b
    end
    local key = string.rep("k", 8192)
    -- 60 levels of 8 KB keys, the duplicate at the bottom: 0.5 MB of text
    local text = string.rep('{"' .. key .. '":', 60) .. '{"a":1,"a":2}' .. string.rep("}", 60)
    local used, dup, where = allocated_kb(function() return canon.duplicate_key(text) end)
    assert.equal("a", dup)
    assert.equal("$" .. string.rep("." .. key, 60), where)
    assert.truthy(used < 8 * 1024, "duplicate_key allocated " .. used .. " kB")
    -- the same depth as tables, 100 strings at the bottom, the last not UTF-8
    local doc = {}
    local at = doc
    for _ = 1, 60 do at[key] = {}; at = at[key] end
    for i = 1, 99 do at["s" .. i] = "fine" end
    at.z = "\255"
    local bad
    used, bad = allocated_kb(function() return canon.bad_text_path(doc, "body") end)
    assert.equal("body" .. string.rep("." .. key, 60) .. ".z", bad)
    assert.truthy(used < 8 * 1024, "bad_text_path allocated " .. used .. " kB")
  end)

  it("answers bad cursors and times with 400", function()
    local uuid = "00000000-0000-4000-8000-000000000000"
    local cases = {
      "/v3/requests?cursor=" .. hex("garbage|" .. uuid),
      "/v3/requests?cursor=" .. hex("2024-99-99 00:00:00+00|" .. uuid),
      "/v3/requests?cursor=" .. hex("2024-02-30|" .. uuid),
      "/v3/requests?cursor=" .. hex("2024-01-01 10:00:00+00|not-a-uuid"),
      "/v3/requests?created_after=2024-99-99",
      "/v3/requests?created_after=2023-02-29",
      "/v3/requests?created_before=2024-01-01T25:00:00Z",
      "/v3/requests?created_before=2024-01-01T10:00:00+99:00",
      "/v3/requests?created_after=0000-01-01",
      "/v3/approvals?cursor=" .. hex("garbage|" .. uuid),
      "/v3/callbacks?cursor=" .. hex("99999999999999999999999"),
      "/v3/callbacks?cursor=" .. hex("-1"),
      "/v3/callbacks?cursor=" .. hex("1e9"),
      "/v3/callbacks?cursor=" .. hex(""),
    }
    local approver = api.token("read,approve")
    for _, path in ipairs(cases) do
      local r = api.call(d, "GET", path, { token = path:match("^/v3/approvals") and approver or reader })
      expect_problem(400, "bad_request", r, path)
    end
    -- without a token, a bad or unknown parameter is 401 like any other
    -- request: its 400 names the route's parameters (a review, session 42)
    for _, path in ipairs({ cases[1], "/v3/requests?x=1", "/v3/callbacks?cursor=1&cursor=2" }) do
      local r = api.call(d, "GET", path, {})
      expect_problem(401, "unauthorized", r, path)
      assert.falsy(r.body:find("template_key", 1, true) or r.body:find("takes", 1, true), r.body)
    end
    local id = api.call(d, "POST", "/v3/requests", { token = operator, key = common.uid("k", 4),
      json = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT } }).json.id
    for _, c in ipairs({ "99999999999999999999999", "0x10", "1.5", "" }) do
      local path = "/v3/requests/" .. id .. "/events?cursor=" .. hex(c)
      expect_problem(400, "bad_request", api.call(d, "GET", path, { token = reader }), path)
    end
    -- good ones still work: times as RFC 3339 and as PostgreSQL writes them
    for _, path in ipairs({ "/v3/requests?created_after=2024-01-01", "/v3/requests?created_after=2024-02-29T10:00:00Z",
                            "/v3/requests?created_before=2999-01-01T00:00:00.123456%2B05:30",
                            "/v3/requests?cursor=" .. hex("2999-01-01 00:00:00.5+00|" .. uuid),
                            "/v3/callbacks?cursor=" .. hex("123"),
                            "/v3/requests/" .. id .. "/events?cursor=" .. hex("0") }) do
      local r = api.call(d, "GET", path, { token = reader })
      assert.equal(200, r.status, path .. " " .. r.body)
    end
  end)

  it("matches no route for a path with an empty segment or a percent-encoding", function()
    assert.equal(200, api.call(d, "GET", "/v3/me", { token = reader }).status)
    for _, path in ipairs({ "//v3///me", "/v3//me", "//v3/me", "/v3/me/", "/v3/%6de", "/%763/me", "/v3/m%65",
                            "/v3/requests/%30" }) do
      local r = api.call(d, "GET", path, { token = reader })
      expect_problem(404, "not_found", r, path)
    end
    -- over a raw socket too (curl would not send some of them as they are)
    local out = raw(d, "GET //v3///me HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " .. reader
      .. "\r\nConnection: close\r\n\r\n")
    assert.truthy(out:match("^HTTP/1%.1 404"), out)
  end)

  it("refuses a request with both Content-Length and Transfer-Encoding, and closes the connection", function()
    local before = count_requests(d.class)
    local smuggled = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    local out = raw(d, "POST /v3/requests HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " .. operator
      .. "\r\nContent-Type: application/json\r\nIdempotency-Key: " .. common.uid("k", 4)
      .. "\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" .. smuggled)
    assert.truthy(out:match("^HTTP/1%.1 400"), out)
    assert.truthy(out:find("Content-Length and Transfer-Encoding", 1, true), out)
    assert.falsy(out:find("TIMEOUT", 1, true), "the connection was left open: " .. out)
    -- one answer: the bytes after the chunked body were not served as a request
    local n = 0
    for _ in out:gmatch("HTTP/1%.1 %d%d%d") do n = n + 1 end
    assert.equal(1, n, out)
    assert.equal(before, count_requests(d.class))
    assert.equal(200, api.call(d, "GET", "/healthz").status)
  end)

  -- Each case is framed one way by libmicrohttpd (the first Content-Length,
  -- a name it does not recognise) and may be framed another way by a proxy;
  -- the bytes after the first framing carry a GET /healthz that must never
  -- be answered.  Without the check, the first case got a 401 and then the
  -- healthz 200 on one connection.
  it("refuses ambiguous framing (Content-Length twice, bad names, obs-fold, codings) with one 400", function()
    local smuggled = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    local body = "{}" .. smuggled
    local head = "POST /v3/requests HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " .. operator
      .. "\r\nContent-Type: application/json\r\n"
    local cases = {
      { "Content-Length: 2\r\nContent-Length: " .. #body .. "\r\n", "more than one Content-Length" },
      { "Content-Length: " .. #body .. "\r\nContent-Length: 2\r\n", "more than one Content-Length" },
      { "Content-Length: 2\r\nContent-Length: 2\r\n", "more than one Content-Length" },
      { "Content-Length: 2\r\ncontent-length: 2\r\n", "more than one Content-Length" },
      { "Content-Length: 2\r\nTransfer-Encoding : chunked\r\n", "not a token" },
      { "Content-Length: 2\r\nTransfer-Encoding\t: chunked\r\n", "not a token" },
      { "Content-Length : " .. #body .. "\r\n", "not a token" },
      { "Content-Length: 2\r\n " .. #body .. "\r\n", "continued on a second line" },
      { "Transfer-Encoding: chunked\r\n gzip\r\n", "continued on a second line" },
      { "Transfer-Encoding: gzip, chunked\r\n", "only 'chunked'" },
      { "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", "only 'chunked'" },
      -- a bare CR inside a value: a proxy splitting lines on it reads a
      -- Content-Length there, libmicrohttpd one value holding it
      { "X-A: a\rContent-Length: 2\r\nContent-Length: " .. #body .. "\r\n", "CR, LF or NUL" },
      { "X-A: a\rTransfer-Encoding: chunked\r\nContent-Length: " .. #body .. "\r\n", "CR, LF or NUL" },
    }
    local before = count_requests(d.class)
    local wrong = {}   -- every case is tried; the failures are reported together
    for _, c in ipairs(cases) do
      local out = raw(d, head .. "Idempotency-Key: " .. common.uid("k", 4) .. "\r\n" .. c[1] .. "\r\n" .. body)
      local n = 0
      for _ in out:gmatch("HTTP/1%.1 %d%d%d") do n = n + 1 end
      if not (out:match("^HTTP/1%.1 400") and out:find(c[2], 1, true) and n == 1
              and not out:find("TIMEOUT", 1, true) and not out:find('"status":"ok"', 1, true)) then
        local statuses = {}
        for st in out:gmatch("HTTP/1%.1 (%d%d%d)") do statuses[#statuses + 1] = st end
        wrong[#wrong + 1] = ("%s -> %s%s"):format(c[1]:gsub("\r\n", "|"), table.concat(statuses, ","),
          out:find("TIMEOUT", 1, true) and ",left open" or "")
      end
    end
    assert.equal("", table.concat(wrong, "\n"))
    -- A Content-Length that is not all digits: libmicrohttpd answers these
    -- 400 itself (its page, its headers twice), before qtgd's check; either
    -- way the connection ends and nothing after it is served.
    for _, v in ipairs({ "+2", "2 ", "2, 2", "-0", "0x2", "" }) do
      local out = raw(d, head .. "Content-Length: " .. v .. "\r\n\r\n" .. body)
      assert.truthy(out:match("^HTTP/1%.1 400"), v .. " -> " .. out)
      assert.falsy(out:find("TIMEOUT", 1, true), v .. " -> " .. out)
      assert.falsy(out:find('"status":"ok"', 1, true), v .. " -> " .. out)
    end
    assert.equal(before, count_requests(d.class))
    -- a Transfer-Encoding in an HTTP/1.0 request: faulty framing (RFC 9112
    -- 6.1), which libmicrohttpd read as chunked and served what followed
    local out = raw(d, "POST /v3/requests HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer " .. operator
      .. "\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n" .. smuggled)
    local answers = 0
    for _ in out:gmatch("HTTP/1%.[01] %d%d%d") do answers = answers + 1 end
    assert.truthy(out:match("^HTTP/1%.[01] 400"), out)
    assert.truthy(out:find("a Transfer-Encoding in a request of a version before HTTP/1.1 is refused", 1, true), out)
    assert.equal(1, answers, out)
    assert.falsy(out:find('"status":"ok"', 1, true), out)
    -- one Content-Length of digits, and one Transfer-Encoding: chunked, still work
    local ok = raw(d, "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    assert.truthy(ok:match("^HTTP/1%.1 200"), ok)
    ok = raw(d, "POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n")
    assert.truthy(ok:match("^HTTP/1%.1 405"), ok)
  end)
end)

describe("HTTP API with the database unreachable", function()
  local d2, proxy, dir
  setup(function()
    api = require "spec.lua.support.api"
    common = require "spec.lua.support.common"
    host = require "spec.lua.support.host"
    -- the daemon reaches PostgreSQL through a TCP proxy on 127.0.0.1, which
    -- the spec stops: the pool's sessions break and new ones are refused
    local url = assert(os.getenv("MG_DATABASE_URL"))
    local sockdir, port = url:match("[?&]host=([^&]+)"), url:match("[?&]port=(%d+)") or "5432"
    local target = sockdir and sockdir:sub(1, 1) == "/" and ("unix:" .. sockdir .. "/.s.PGSQL." .. port)
      or ((url:match("@([^:/?]+)") or "127.0.0.1") .. ":" .. (url:match("@[^:/?]+:(%d+)") or port))
    dir = host.tmpdir()
    proxy = common.start_forwarder(dir, target)
    local pport = proxy.port
    local db = url:match("^postgres[^/]*//[^/]*/([^?]+)") or "qtg"
    local user = url:match("^postgres[^/]*//([^@:/]+)[:@]") or "qtg"
    local via = ("postgresql://%s@127.0.0.1:%s/%s"):format(user, pport, db)
    d2 = api.start({ MG_WORKERS_ENABLED = "false", MG_DATABASE_URL = via })
  end)
  teardown(function()
    if proxy then common.stop_forwarder(proxy) end
    if d2 then host.stop(d2.h) end
    host.stop_all()
    if dir then os.execute("rm -rf " .. common.quote(dir)) end
  end)

  it("answers 503 with a fixed detail, never libpq's text, and logs the text", function()
    local tok = api.token("read")
    assert.equal(200, api.call(d2, "GET", "/v3/me", { token = tok }).status)
    common.stop_forwarder(proxy)
    local port = d2.env.MG_DATABASE_URL:match(":(%d+)/")
    local seen = {}
    -- the first calls meet broken sessions, the later ones a refused connect
    for i = 1, 4 do
      for _, c in ipairs({ { "/v3/me", nil }, { "/v3/requests", tok } }) do
        local r = api.call(d2, "GET", c[1], { token = c[2] })
        assert.equal(503, r.status, c[1] .. " " .. r.body)
        assert.equal("application/problem+json", r.headers["content-type"])
        local doc = cjson.decode(r.body)
        assert.truthy(doc.kind == "connection" or doc.kind == "timeout", r.body)
        assert.truthy(doc.detail == "the database is unreachable; retry later"
          or doc.detail == "a backend (the database or a provider) did not answer in time; retry later", r.body)
        for _, leak in ipairs({ port, "127.0.0.1", "PGSQL", "/tmp", "server", "qtg@", "role", "connection to" }) do
          assert.falsy(r.body:find(leak, 1, true), "the answer shows " .. leak .. ": " .. r.body)
        end
        seen[doc.kind] = true
      end
      if i == 1 then qtg.sleep(0.2) end
    end
    assert.truthy(seen.connection)
    -- the log has what libpq said
    local log = host.read(d2.h.log) or ""
    assert.truthy(log:find('"msg":"api database outage"', 1, true), log:sub(-2000))
  end)
end)

describe("HTTP API against slow clients (slowloris)", function()
  local d3
  setup(function()
    api = require "spec.lua.support.api"
    common = require "spec.lua.support.common"
    host = require "spec.lua.support.host"
    d3 = api.start({ MG_WORKERS_ENABLED = "false", MG_API_MAX_CONNECTIONS = "20",
                     MG_API_MAX_CONNECTIONS_PER_IP = "8", MG_API_HEADER_TIMEOUT_SECONDS = "1.5",
                     MG_API_BODY_TIMEOUT_SECONDS = "1.5", MG_API_IDLE_TIMEOUT_SECONDS = "60" })
  end)
  teardown(function()
    api.stop(d3)
    host.stop_all()
  end)

  it("holds at most MG_API_MAX_CONNECTIONS_PER_IP of one address, closes trickling headers at "
     .. "MG_API_HEADER_TIMEOUT_SECONDS, and serves another address meanwhile", function()
    -- 30 sockets from 127.0.0.1 trickle a header byte every 0.2 s (the idle
    -- timeout, 60 s, never fires); a client from 127.0.0.2 asks /healthz
    -- while they do
    local script = [[
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
socks = []
for i in range(30):
    s = socket.socket()
    s.settimeout(5)
    s.bind(("127.0.0.1", 0))
    s.connect((host, port))
    s.setblocking(False)
    socks.append(s)
head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
start = time.monotonic()
alive_at = {}
served = None
open_ = set(range(30))
i = 0
while time.monotonic() - start < 4.0:
    for k in list(open_):
        try:
            socks[k].send(head[i:i + 1])
            got = b""
            try:
                got = socks[k].recv(100)
                if got == b"":
                    raise ConnectionResetError()
            except BlockingIOError:
                pass
        except (ConnectionResetError, BrokenPipeError, OSError):
            open_.discard(k)
    t = round(time.monotonic() - start, 1)
    alive_at[t] = len(open_)
    if served is None and time.monotonic() - start > 0.6:
        c = socket.socket()
        c.settimeout(5)
        c.bind(("127.0.0.2", 0))
        c.connect((host, port))
        c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        try:
            served = c.recv(100).decode("latin-1").split("\r\n")[0] or "closed"
        except OSError as e:
            served = "error " + str(e)
        c.close()
    i += 1
    time.sleep(0.2)
early = [v for t, v in sorted(alive_at.items()) if 0.8 <= t <= 1.3]
print("early:%d" % (early[0] if early else -1))
print("late:%d" % len(open_))
print("served:%s" % served)
]]
    local rc, out = python_against(d3, script)
    assert.equal(0, rc, out)
    -- while trickling: no more than the per-address share held
    local early = tonumber(out:match("early:(%-?%d+)"))
    assert.truthy(early and early >= 0 and early <= 8, out)
    -- after the header deadline (1.5 s; the trickle lasted 4 s): none left
    assert.equal("0", out:match("late:(%d+)"), out)
    -- another address was served while they trickled
    assert.truthy(out:find("served:HTTP/1.1 200", 1, true), out)
    assert.equal(200, api.call(d3, "GET", "/healthz").status)
    -- a kept-alive connection is served again after a pause shorter than the deadline
    local r1 = api.call(d3, "GET", "/healthz")
    qtg.sleep(0.5)
    assert.equal(200, api.call(d3, "GET", "/healthz").status)
    assert.equal(200, r1.status)
  end)

  -- A client that opened connections, sent part of a request's headers and
  -- closed them left them in CLOSE-WAIT until the header deadline: its
  -- address was refused meanwhile, without it holding a connection (a
  -- review, session 37).  The deadlines here are 60 s, so only noticing the
  -- close serves the address again within the test's 10 s.
  it("lets go at once of a connection its client closed before its request was whole, and answers a whole one "
     .. "whose client closed its side after sending it", function()
    local d4 = api.start({ MG_WORKERS_ENABLED = "false", MG_API_MAX_CONNECTIONS_PER_IP = "8",
                           MG_API_HEADER_TIMEOUT_SECONDS = "60", MG_API_BODY_TIMEOUT_SECONDS = "60",
                           MG_API_IDLE_TIMEOUT_SECONDS = "60" })
    local script = PY_READ_ALL .. [[
import time
host, port = sys.argv[1], int(sys.argv[2])
def ask(data, half_close):
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(data)
    if half_close:
        s.shutdown(socket.SHUT_WR)
    return read_all(s).split(b"\r\n")[0].decode("latin-1") or "closed"
for i in range(3):
    for k in range(20):
        try:   # past the address's share, refused: the next round shows whether it lasts
            s = socket.create_connection((host, port), timeout=5)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Half: " if k % 2
                      else b"POST /v3/requests HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            s.close()
        except OSError:
            pass
    start, served = time.monotonic(), None
    while time.monotonic() - start < 10 and served is None:
        try:
            if ask(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", False) == "HTTP/1.1 200 OK":
                served = time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.1)
    print("round%d:%s" % (i, "never" if served is None else "served"))
answers = set()
for i in range(20):
    answers.add(ask(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", True))
    answers.add(ask(b"POST /v3/requests HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                    b"Connection: close\r\n\r\n{}", True))
print("half_closed:" + ",".join(sorted(answers)))
]]
    local rc, out = python_against(d4, script)
    api.stop(d4)
    assert.equal(0, rc, out)
    for i = 0, 2 do assert.truthy(out:find("round" .. i .. ":served", 1, true), out) end
    assert.truthy(out:find("half_closed:HTTP/1.1 200 OK,HTTP/1.1 401 Unauthorized\n", 1, true), out)
  end)

  -- A request line libmicrohttpd gives up on before its headers are whole
  -- (a 40 KB path and 600 query arguments overflow its 64 KiB connection
  -- memory) never reached the access handler, and libmicrohttpd reports
  -- the completion only of a request the handler saw: the record made for
  -- its request line was never freed, 40 KB a request, from any client
  -- without a token (a review, session 42: 15 MB -> 946 MB in 40 s).
  it("frees the record of a request line it gave up on, with no token, once the connection closes", function()
    local d5 = api.start({ MG_WORKERS_ENABLED = "false", MG_API_HEADER_TIMEOUT_SECONDS = "2" })
    local script = [[
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
req = (b"GET /" + b"a" * 40000 + b"?" + b"&".join(b"a%d=1" % i for i in range(600))
       + b" HTTP/1.1\r\nHost: x\r\n\r\n")
for i in range(20):
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(req)
    time.sleep(0.05)
    s.close()
print("sent")
]]
    local rc, out = python_against(d5, script)
    assert.equal(0, rc, out)
    local token = api.token("read")
    local function gauge(text, name) return tonumber(text:match("\n" .. name .. " (%d+)")) end
    local records, connections
    assert.truthy(common.wait_for(function()
      local r = api.call(d5, "GET", "/metrics", { token = token })
      assert.equal(200, r.status, r.body)
      records, connections = gauge(r.body, "qtg_api_request_records"), gauge(r.body, "qtg_api_connections_open")
      return connections == 1 and records == 1
    end, 20, function()
      return ("the 20 connections to close and their records to go: %s records, %s connections open")
        :format(tostring(records), tostring(connections))
    end))
    api.stop(d5)   -- and, under build-asan, no leak at exit
  end)

  it("closes a request whose body trickles in past MG_API_BODY_TIMEOUT_SECONDS", function()
    -- whole headers, then one body byte every 0.2 s of a declared 1,000
    -- (each byte restarts the idle timeout, 60 s); a body that arrives in
    -- time is served
    local script = [[
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
s = socket.create_connection((host, port), timeout=5)
s.sendall(b"POST /v3/requests HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          b"Content-Length: 1000\r\n\r\n")
s.setblocking(False)
start = time.monotonic()
closed = None
while time.monotonic() - start < 6.0 and closed is None:
    try:
        s.send(b" ")
        got = s.recv(100)
        if got == b"" or got.startswith(b"HTTP/1.1"):
            closed = time.monotonic() - start
    except BlockingIOError:
        pass
    except OSError:
        closed = time.monotonic() - start
    time.sleep(0.2)
print("closed_after:%s" % ("never" if closed is None else "%.1f" % closed))
]]
    local rc, out = python_against(d3, script)
    assert.equal(0, rc, out)
    local after = tonumber(out:match("closed_after:([%d.]+)"))
    assert.truthy(after and after >= 1.2 and after < 4.0, out)
    -- a whole body at once: answered (401 without a token), not cut
    local r = api.call(d3, "POST", "/v3/requests", { json = { template_key = "x" } })
    assert.equal(401, r.status, r.body)
  end)
end)
