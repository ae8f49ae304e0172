-- api_fuzz_spec: generated input at the API's boundary, over real HTTP
-- against a running qtgd (under ASan when tools/test runs build-asan):
-- paths, query strings, headers and bodies built from hostile pieces, with
-- and without a valid token, must always get an answer below 500 (4xx for
-- anything malformed) in problem+json, and never crash the daemon; then
-- raw bytes that are not HTTP at all (bad request lines, huge headers, NUL
-- bytes, truncated bodies) from a socket, after which the daemon still
-- serves /healthz.  QTG_FUZZ_SEED / QTG_FUZZ_SCALE as in fuzz_support.
local qtg = require "qtg"
local cjson = require "cjson"
local canon = require "qtg.canon_json"
local fuzz = require "spec.lua.support.fuzz"

local api, common, host
local d, token

local SEGMENTS = { "v3", "requests", "nodes", "callbacks", "signers", "balances", "approve", "reject",
  "cancel", "resume", "retry", "complete", "events", "redeliver", "expected-identity", "openapi.json",
  "00000000-0000-4000-8000-000000000000", "..", ".", "%00", "%2e%2e", "%ff", "a%20b", "' OR 1=1 --",
  "{id}", "healthz", "metrics", "readyz", string.rep("x", 300), "-1", "9999999999999999999999", "",
  "%6de", "me" }
local METHODS = { "GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD" }
local QUERY_NAMES = { "limit", "cursor", "state", "template_key", "created_after", "created_before", "fresh",
  "venue_key", "status", "amount_min", "x", "limit[]", "" }

local function hex(s) return (s:gsub(".", function(c) return string.format("%02x", c:byte()) end)) end

-- Values that once reached PostgreSQL unchecked (a 500): cursors that
-- decode to a bad time, a non-uuid or a number past bigint, impossible
-- dates.  Every one is sent as every query parameter's value, on every GET
-- route, before the generated requests; and the generator picks them too.
local UUID0 = "00000000-0000-4000-8000-000000000000"
local BAD_VALUES = { hex("garbage|" .. UUID0), hex("2024-99-99 00:00:00+00|" .. UUID0), hex("2024-01-01|x"),
  hex("99999999999999999999999"), hex("-1"), hex("1e400"), hex(""), hex("|"), "2024-99-99", "2023-02-29",
  "2024-01-01T24:61:00Z", "2024-01-01T10:00:00+99:00", "0000-01-01", "99999-01-01", "1e400",
  "99999999999999999999999", "-0", "NaN" }
local CONTENT_TYPES = { "application/json", "application/json; charset=utf-8", "text/plain",
  "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "", "application/JSON" }

local function urlenc(s)
  return (s:gsub("[^%w%-%._~]", function(c) return string.format("%%%02X", c:byte()) end))
end

local function gen_path(g)
  if g:chance(0.5) then
    local routes = require("qtg.api.routes").LIST
    local r = g:pick(routes)
    return (r.path:gsub("{[%w_]+}", function()
      return g:chance(0.5) and "00000000-0000-4000-8000-000000000000" or urlenc(g:pick(SEGMENTS))
    end)), r.method
  end
  local parts = {}
  for i = 1, g:int(0, 5) do parts[i] = g:chance(0.3) and urlenc(g:string():sub(1, 40)) or g:pick(SEGMENTS) end
  return "/" .. table.concat(parts, "/"), g:pick(METHODS)
end

local function gen_query(g)
  if g:chance(0.4) then return "" end
  local q = {}
  for i = 1, g:int(1, 4) do
    local v = g:chance(0.2) and g:pick(BAD_VALUES)
      or (g:chance(0.5) and tostring(g:int(-5, 300)) or g:string():sub(1, 80))
    q[i] = urlenc(g:pick(QUERY_NAMES)) .. "=" .. urlenc(v)
  end
  return "?" .. table.concat(q, "&")
end

local function gen_body(g)
  local k = g:int(1, 6)
  if k == 1 then return "" end
  if k == 2 then return g:bytes(g:int(1, 200)) end
  if k == 3 then return fuzz.encode({ template_key = g:chance(0.5) and "otc_settlement_manual" or g:string(),
                                       intent = g:value(3), callback_url = g:chance(0.3) and g:string() or nil }) or "{" end
  return fuzz.encode(g:value(4)) or "{"
end

describe("API boundary under generated input", function()
  setup(function()
    api = require "spec.lua.support.api"
    common = require "spec.lua.support.common"
    host = require "spec.lua.support.host"
    d = api.start({ MG_API_RATE_LIMIT_BURST = "100000", MG_WORKERS_ENABLED = "false",
                    MG_API_MAX_BODY_BYTES = "4096" })
    token = api.token("read,operate,approve,admin")
  end)
  teardown(function()
    api.stop(d)
    host.stop_all()
  end)

  it("answers the corpus of once-failing query values below 500, with a problem document", function()
    local id = api.call(d, "POST", "/v3/requests", { token = token, key = common.uid("f", 4),
      json = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT } }).json.id
    local n = 0
    for _, r in ipairs(require("qtg.api.routes").LIST) do
      if r.method == "GET" then
        local path = r.path:gsub("{id}", id)
        for name in pairs(r.query or {}) do
          for _, v in ipairs(BAD_VALUES) do
            local resp = api.call(d, "GET", path .. "?" .. name .. "=" .. v, { token = token })
            assert.truthy(resp.status < 500, path .. "?" .. name .. "=" .. v .. " -> " .. resp.status .. " " .. resp.body)
            if resp.status >= 400 then
              assert.equal("application/problem+json", resp.headers["content-type"], path)
            end
            n = n + 1
          end
        end
      end
    end
    assert.truthy(n > 100, n)
  end)

  it("answers every generated request below 500, malformed ones with a problem document", function()
    fuzz.check("api_http", 250, function(g)
      local path, method = gen_path(g)
      path = path .. gen_query(g)
      local headers = {}
      if g:chance(0.8) then headers.Authorization = "Bearer " .. token
      elseif g:chance(0.5) then headers.Authorization = g:pick({ "Bearer", "Bearer  ", "bearer x", "Basic Zm9v",
                                                                 "Bearer " .. string.rep("A", 5000) }) end
      local ct = g:pick(CONTENT_TYPES)
      if ct ~= "" then headers["Content-Type"] = ct end
      if g:chance(0.5) then headers["Idempotency-Key"] = g:chance(0.7) and common.uid("f", 4) or g:string():gsub("[%c]", ""):sub(1, 300) end
      if g:chance(0.2) then headers["X-" .. g:word()] = g:string():gsub("[%c]", ""):sub(1, 200) end
      local body = (method == "POST" or method == "PUT" or g:chance(0.1)) and gen_body(g) or nil
      local resp, err = qtg.http.request{ method = method, url = d.base .. path, headers = headers, body = body,
                                          timeout = 20 }
      if not resp then
        -- libcurl refuses to send some generated URLs or headers itself
        if err.kind == "invalid" then return true end
        return false, method .. " " .. path .. ": " .. tostring(err.message)
      end
      if resp.status >= 500 then return false, method .. " " .. path .. " -> " .. resp.status .. " " .. resp.body end
      if resp.status >= 400 and method ~= "HEAD" then
        if resp.headers["content-type"] ~= "application/problem+json" then
          return false, method .. " " .. path .. ": " .. resp.status .. " without problem+json"
        end
        local ok, doc = pcall(cjson.decode, resp.body)
        if not ok or doc.status ~= resp.status or type(doc.detail) ~= "string" then
          return false, "bad problem document " .. resp.body
        end
        if not canon.text_ok(resp.body) then
          return false, method .. " " .. path .. ": the problem document is not valid UTF-8"
        end
      end
      return true
    end)
    assert.equal(200, api.call(d, "GET", "/healthz").status)
  end)

  it("survives bytes that are not HTTP and still serves", function()
    local script = [[
import random, socket, sys
host, port, seed, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rnd = random.Random(seed)
pieces = [b"GET / HTTP/1.1\r\n", b"POST /v3/requests HTTP/1.1\r\n", b"\x00\x01\x02", b"\r\n\r\n",
          b"Content-Length: -1\r\n", b"Content-Length: 99999999999999999999\r\n", b"Transfer-Encoding: chunked\r\n",
          b"zz\r\n", b"Host: x\r\n", b"X: " + b"a" * 70000 + b"\r\n", b"GET /" + b"%" * 5000 + b" HTTP/1.1\r\n",
          b"\xff\xfe", b"HTTP/9.9\r\n", b"Authorization: Bearer \x00\r\n", b"0\r\n\r\n", b"{\"a\":"]
for i in range(n):
    s = socket.create_connection((host, port), timeout=5)
    try:
        data = b"".join(rnd.choice(pieces) for _ in range(rnd.randint(1, 8)))
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        try:
            while s.recv(65536):
                pass
        except Exception:
            pass
    except Exception:
        pass
    finally:
        s.close()
print("done")
]]
    local dir = host.tmpdir()
    host.write(dir .. "/junk.py", script)
    local h, port = d.address:match("^(.-):(%d+)$")
    local rc, out = host.run({}, { "python3", common.quote(dir .. "/junk.py"), h, port,
      tostring(fuzz.seed), tostring(math.floor(150 * fuzz.scale)) })
    assert.equal(0, rc, out)
    assert.truthy(out:find("done", 1, true))
    local r = api.call(d, "GET", "/healthz")
    assert.equal(200, r.status)
    assert.equal(200, api.call(d, "GET", "/v3/requests", { token = token }).status)
    os.execute("rm -rf " .. common.quote(dir))
  end)
end)
