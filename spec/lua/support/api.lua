-- spec/lua/support/api.lua -- helpers for specs of the HTTP API: a running
-- qtgd with the API on a 127.0.0.1 port (its own network class, so lists
-- hold only the spec's rows), tokens made with `qtgd tokens create`, calls
-- over real HTTP (qtg.http, libcurl), and a small JSON Schema checker for
-- the OpenAPI document's schemas (type, required, properties,
-- additionalProperties, items, enum, allOf, $ref).
local qtg = require "qtg"
local cjson = require "cjson"
local host = require "spec.lua.support.host"
local common = require "spec.lua.support.common"

local M = {}

M.OTC_INTENT = { asset = "USDC", amount = "10", venue = "otc-desk",
                 destination = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8", destination_chain = "ethereum",
                 counterparty = "acme" }

local templates_loaded = false
local function load_templates()
  if templates_loaded then return end
  local rc, out = host.run(host.base_env(), { common.quote(host.bin), "templates", "load",
    common.quote(host.root .. "/templates") })
  assert(rc == 0, out)
  -- otc_settlement_manual's counterparty_allowlist_required: OTC_INTENT's
  -- destination is acme's, in the address book for both its assets
  local book = require "spec.lua.support.book"
  book.ensure_all({ book.for_intent(M.OTC_INTENT),
                    book.for_intent(setmetatable({ asset = "USDT" }, { __index = M.OTC_INTENT })) })
  templates_loaded = true
end
M.load_templates = load_templates

-- The daemons started and not yet stopped, in order: a token is made for
-- the class of the last (token()'s default).
local running = {}

-- start(extra_env) -> daemon {base=, address=, class=, h=}
function M.start(extra)
  load_templates()
  local class = common.uid("api", 4)
  local env = host.base_env({ MG_API_LISTEN = "127.0.0.1:0", MG_NETWORK_CLASS = class,
                              MG_API_CALLBACK_ALLOW_PRIVATE = "true" })
  for k, v in pairs(extra or {}) do env[k] = v end
  local h = host.start(env, { "run" })
  local address = common.wait_log(h, '"msg":"api listening","address":"(127%.0%.0%.1:%d+)"', 30,
    "the API to listen")
  local d = { h = h, class = env.MG_NETWORK_CLASS, address = address, base = "http://" .. address, env = env }
  running[#running + 1] = d
  return d
end

-- stop(d): SIGTERM; the daemon must exit 0 with no sanitizer report in its
-- log (under build-asan a leak or a memory error shows there).
function M.stop(d)
  if not d then return end
  for i = #running, 1, -1 do
    if running[i] == d then table.remove(running, i) end
  end
  local rc = host.stop(d.h)
  local log = host.read(d.h.log) or ""
  local report = log:match("[^\n]*Sanitizer[^\n]*") or log:match("[^\n]*runtime error[^\n]*")
  assert(not report, "qtgd's log has a sanitizer report: " .. tostring(report))
  assert(rc == 0, "qtgd exited with " .. tostring(rc) .. ": " .. log:sub(-2000))
end

-- token(roles, opts) -> token text, name; opts: name, expires_in, scope (own), env,
-- class (default: the class of the last daemon started and not stopped;
-- false: none given, the CLI's MG_NETWORK_CLASS)
function M.token(roles, opts)
  opts = opts or {}
  local name = opts.name or common.uid("tok", 4)
  local args = { common.quote(host.bin), "tokens", "create", "--name", name, "--roles", roles }
  if opts.expires_in then args[#args + 1] = "--expires-in"; args[#args + 1] = opts.expires_in end
  if opts.scope then args[#args + 1] = "--scope"; args[#args + 1] = opts.scope end
  -- a token serves one class: the daemon's it is for (the last started)
  local class = opts.class
  if class == nil then class = running[#running] and running[#running].class end
  if class then args[#args + 1] = "--class"; args[#args + 1] = class end
  local rc, out = host.run(host.base_env(opts.env), args)
  assert(rc == 0, out)
  local last = out:match("([^\n]+)\n?$")
  assert(last and last:match("^qtg_[%w_-]+$"), "the token is not alone on the last line: " .. out)
  return last, name, out
end

-- every_class_token(roles, opts) -> token text, name: a token serving every
-- network class, as one made before sql/0198 does (its class cleared).
function M.every_class_token(roles, opts)
  local tok, name = M.token(roles, opts)
  common.query("UPDATE api_tokens SET network_class = NULL WHERE name = $1 AND revoked_at IS NULL", name)
  return tok, name
end

function M.tokens_cli(args, env)
  local words = { common.quote(host.bin), "tokens" }
  for _, a in ipairs(args) do words[#words + 1] = common.quote(a) end
  return host.run(host.base_env(env), words)
end

-- call(d, method, path, opts) -> {status=, headers=, body=, json=}
-- opts: token, json (a table, sent as the body), body (raw), headers
function M.call(d, method, path, opts)
  opts = opts or {}
  local headers = {}
  if opts.token then headers["Authorization"] = "Bearer " .. opts.token end
  local body = opts.body
  if opts.json ~= nil then
    body = type(opts.json) == "string" and opts.json or cjson.encode(opts.json)
    headers["Content-Type"] = "application/json"
  end
  if opts.key then headers["Idempotency-Key"] = opts.key end
  for k, v in pairs(opts.headers or {}) do headers[k] = v end
  local resp, err = qtg.http.request{ method = method, url = d.base .. path, headers = headers, body = body,
                                      timeout = opts.timeout or 30 }
  assert(resp, "HTTP " .. method .. " " .. path .. ": " .. tostring(err and err.message))
  local ctype = resp.headers["content-type"] or ""
  if ctype:match("json") and resp.body ~= "" then
    local ok, doc = pcall(cjson.decode, resp.body)
    if ok then resp.json = doc end
  end
  return resp
end

-- ------------------------------------------------------------ JSON Schema
local function resolve(doc, schema)
  local r = schema["$ref"]
  if not r then return schema end
  local name = r:match("^#/components/schemas/(.+)$")
  return assert(doc.components.schemas[name], "no schema " .. r)
end

local function json_type(v)
  if v == cjson.null then return "null" end
  local t = type(v)
  if t == "number" then return v == math.floor(v) and "integer" or "number" end
  if t == "string" then return "string" end
  if t == "boolean" then return "boolean" end
  if t == "table" then
    if cjson.array_mt and getmetatable(v) == cjson.array_mt then return "array" end
    local n = 0
    for _ in pairs(v) do n = n + 1 end
    if n > 0 and #v == n then return "array" end
    return "object"  -- an empty table is either; accept both below
  end
  return t
end

local function type_ok(want, v)
  local got = json_type(v)
  local wants = type(want) == "table" and want or { want }
  for _, w in ipairs(wants) do
    if w == got or (w == "number" and got == "integer") then return true end
    if type(v) == "table" and next(v) == nil and (w == "array" or w == "object") then return true end
  end
  return false
end

-- validate(doc, schema, value, path) -> true | nil, why
function M.validate(doc, schema, value, path)
  path = path or "$"
  schema = resolve(doc, schema)
  if schema.allOf then
    for _, s in ipairs(schema.allOf) do
      local ok, why = M.validate(doc, s, value, path)
      if not ok then return nil, why end
    end
  end
  if schema.type and not type_ok(schema.type, value) then
    return nil, ("%s: expected %s, got %s"):format(path, cjson.encode(schema.type), json_type(value))
  end
  if schema.enum then
    local found = false
    for _, e in ipairs(schema.enum) do if e == value then found = true end end
    if not found then return nil, path .. ": not one of the enum" end
  end
  if type(value) == "table" then
    for _, r in ipairs(schema.required or {}) do
      if value[r] == nil then return nil, path .. ": missing required " .. r end
    end
    for k, s in pairs(schema.properties or {}) do
      if value[k] ~= nil then
        local ok, why = M.validate(doc, s, value[k], path .. "." .. k)
        if not ok then return nil, why end
      end
    end
    if schema.additionalProperties == false then
      for k in pairs(value) do
        if not (schema.properties or {})[k] then return nil, path .. ": unexpected property " .. tostring(k) end
      end
    end
    if schema.items and json_type(value) ~= "object" then
      for i, v in ipairs(value) do
        local ok, why = M.validate(doc, schema.items, v, path .. "[" .. i .. "]")
        if not ok then return nil, why end
      end
    end
  end
  return true
end

-- response_schema(doc, method, path_template, status) -> schema or nil
function M.response_schema(doc, method, template, status)
  local op = doc.paths[template] and doc.paths[template][method:lower()]
  if not op then return nil, "no operation " .. method .. " " .. template end
  local r = op.responses[tostring(status)]
  if not r then return nil, ("%s %s: status %d is not documented"):format(method, template, status) end
  local content = r.content or {}
  local c = content["application/json"] or content["application/problem+json"] or content["text/plain"]
  return c and c.schema
end

-- check(doc, resp, method, template): the response's status is documented
-- for the operation and its body validates against the schema.
function M.check(doc, resp, method, template)
  local schema, why = M.response_schema(doc, method, template, resp.status)
  assert(schema, why)
  local value = resp.json
  if value == nil then value = resp.body end
  local ok, err = M.validate(doc, schema, value)
  assert(ok, method .. " " .. template .. " " .. resp.status .. ": " .. tostring(err) .. "\n" .. resp.body)
  return resp
end

-- readyz(d, doc, token, name) -> the /readyz response (checked against the
-- document), and its check called name
function M.readyz(d, doc, token, name)
  local r = M.check(doc, M.call(d, "GET", "/readyz", { token = token }), "GET", "/readyz")
  for _, c in ipairs(r.json.checks) do
    if c.name == name then return r, c end
  end
  error("no " .. name .. " check in " .. r.body, 2)
end

return M
