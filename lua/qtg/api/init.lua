-- qtg.api: the HTTP API's request handler.  The C server (src/qtg_api.c)
-- runs handle(req) as a host task for every request; this module decides
-- everything else, in this order:
--
--   /ui and /ui/... -> the web console's static files (qtg.api.ui)
--   route (qtg.api.routes: one table) -> 404 / 405
--   authentication (Bearer token, qtg.api.tokens) -> 401, role -> 403
--   the token's rate limit -> 429 with Retry-After
--   a token of scope own: its own requests only (qtg.api.ownership) -> 403/404
--   query parameters and JSON body checked against the route -> 400/415/422
--   Idempotency-Key (qtg.api.idempotency) on mutating requests
--   the route's handler, on one database session
--
-- and answers every refusal as problem+json (qtg.api.problem).  Counters
-- of requests by route and status feed /metrics (qtg.api.metrics).
local qtg = require "qtg"
-- The bodies' decoder: at most 64 levels, as many as a stored document may
-- have (canon.encode).  cjson's own limit, 1000, let a body nest deeper
-- than anything it could become, and every level costs the checks after
-- the decode.
local json = require("cjson.safe").new()
json.decode_max_depth(64)
local canon = require "qtg.canon_json"
local problem = require "qtg.api.problem"
local tokens = require "qtg.api.tokens"
local ownership = require "qtg.api.ownership"
local routes = require "qtg.api.routes"
local idempotency = require "qtg.api.idempotency"
local metrics = require "qtg.api.metrics"
local ui = require "qtg.api.ui"

local M = {}

local JSON = "application/json"

-- ---------------------------------------------------------------- rate limit
-- A token bucket per token (in this process): `burst` requests at once,
-- refilled at `rate` per second.
local buckets = {}

local function rate_limit(principal)
  local rate = qtg.settings.api_rate_limit_per_second
  local burst = qtg.settings.api_rate_limit_burst
  local now = qtg.monotonic()
  local b = buckets[principal.token_id]
  if not b then
    b = { level = burst, at = now }
    buckets[principal.token_id] = b
  end
  b.level = math.min(burst, b.level + (now - b.at) * rate)
  b.at = now
  if b.level < 1 then
    local wait = math.max(1, math.ceil((1 - b.level) / rate))
    problem.raise_with("rate_limited", { retry_after = wait },
      "token %s is over its rate limit (%g requests/s, burst %d); retry after %d s",
      principal.name, rate, burst, wait)
  end
  b.level = b.level - 1
end

-- ------------------------------------------------------------------ inputs
local function check_query(route, query, repeated)
  local allowed = route.query or {}
  for name in pairs(repeated or {}) do
    problem.raise("bad_request", "query parameter %s is given more than once", name)
  end
  for name, value in pairs(query) do
    local def = allowed[name]
    if not def then
      local names = {}
      for n in pairs(allowed) do names[#names + 1] = n end
      table.sort(names)
      problem.raise("bad_request", "unknown query parameter %s (this route takes: %s)", name,
        #names > 0 and table.concat(names, ", ") or "none")
    end
    if not canon.text_ok(value) then
      problem.raise("bad_request", "query parameter %s is not valid UTF-8 text", name)
    end
  end
end

local function media_type(h)
  return (h or ""):match("^%s*([^;%s]+)") or ""
end

local function parse_body(route, req)
  local body = req.body or ""
  if not route.body then
    if body ~= "" then problem.raise("bad_request", "%s %s takes no request body", route.method, route.path) end
    return nil
  end
  if body == "" then
    if route.body.optional then return {} end
    problem.raise("bad_request", "a JSON object body is required")
  end
  if media_type(req.headers["content-type"]):lower() ~= JSON then
    problem.raise("unsupported_media_type", "the body must be sent as Content-Type: application/json (got %s)",
      req.headers["content-type"] or "none")
  end
  if not canon.text_ok(body) then problem.raise("bad_request", "the body is not valid UTF-8") end
  -- canon.decode: cjson's decode, then a refusal of any object key given
  -- twice at any depth (cjson keeps the last, a reviewer reads the first)
  local doc, err = canon.decode(body, json)
  if doc == nil then
    err = tostring(err)
    if err:match("^duplicate key ") then problem.raise("bad_request", "the body has a %s", err) end
    problem.raise("bad_request", "malformed JSON: %s", err)
  end
  -- cjson reads more than JSON (hex and NaN, a leading zero or '+', raw
  -- control characters in strings): a body is refused unless it is JSON
  -- as RFC 8259 writes it
  local syntax = canon.syntax_error(body)
  if syntax then problem.raise("bad_request", "malformed JSON: %s", syntax) end
  if type(doc) ~= "table" or canon.is_array(doc) or (next(doc) == nil and body:match("^%s*%[")) then
    problem.raise("bad_request", "the body must be a JSON object")
  end
  -- cjson keeps \u0000 and decodes numbers past 2^53 inexactly: refuse what
  -- could not be stored or compared as sent
  local storable, why = canon.storable(doc, "body")
  if not storable then problem.raise("bad_request", "%s", why) end
  local inexact = canon.inexact_number_path(doc, "body")
  if inexact then
    problem.raise("bad_request", "%s is a number of 2^53 or more, which is not read exactly: send it as a string",
      inexact)
  end
  for k, v in pairs(doc) do
    local def = route.body.fields[k]
    if not def then
      local names = {}
      for n in pairs(route.body.fields) do names[#names + 1] = n end
      table.sort(names)
      problem.raise("unknown_field", "unknown field %s (allowed: %s)", tostring(k), table.concat(names, ", "))
    end
    local want = def.type
    local got = type(v)
    local ok = (want == "string" and got == "string") or (want == "object" and got == "table" and not canon.is_array(v))
      or (want == "boolean" and got == "boolean") or (want == "integer" and got == "number" and v == math.floor(v))
      or (want == "any")
    if not ok then problem.raise("invalid_input", "field %s must be a %s", k, want) end
  end
  for k, def in pairs(route.body.fields) do
    if def.required and doc[k] == nil then problem.raise("invalid_input", "field %s is required", k) end
  end
  return doc
end

-- ---------------------------------------------------------------- dispatch
local function encode(status, doc, headers)
  local h = headers or {}
  if h["Content-Type"] == nil then h["Content-Type"] = JSON end
  return status, h, type(doc) == "string" and doc or canon.encode(doc)
end

-- The token of req on session s, holding route's role: its principal, or
-- raises unauthorized or forbidden.
local function authorize(s, route, req)
  local principal = tokens.authenticate(s, req.headers.authorization)
  if not tokens.has_role(principal, route.role) then
    problem.raise("forbidden", "token %s lacks the %s role that %s %s requires", principal.name,
      route.role, route.method, route.path)
  end
  return principal
end

-- The checks every route passes on session s, in order: the token, its
-- role, its rate, the query, ownership, the body.  The query is checked
-- after the token: its refusal names the route's parameters, which only a
-- client the API serves may read.  Returns the handler's ctx.
local function admit(s, route, params, query, req)
  local principal = authorize(s, route, req)
  rate_limit(principal)
  check_query(route, query, req.query_repeated)
  ownership.check(s, route, params, principal)
  local body = parse_body(route, req)
  return { s = s, principal = principal, params = params, query = query, body = body,
           headers = req.headers, req = req }
end

-- A route's `outside(ctx)` is its work away from the database (a name
-- lookup, a venue's API), run between two sessions: the first admits the
-- request and claims its Idempotency-Key, the second runs the handler and
-- stores the answer.  A session held through such a wait (up to seconds,
-- for a name whose DNS server never answers) was the pool's: a client
-- looping on it left the workers none.  A refusal `outside` raises is the
-- request's answer, stored for its key like the handler's.  The token is
-- checked again in the second session, before the handler writes: one
-- revoked or expired during the wait is refused there (401, the key freed,
-- as for any refusal before the route runs), not honoured for seconds
-- after its revocation was committed.
local function run_outside(route, params, query, req)
  local ctx, replay = qtg.db.with_api_session(function(s)
    local ctx = admit(s, route, params, query, req)
    if route.mutating then
      local claim = idempotency.begin(s, ctx.principal, route, req, ctx.body)
      if claim and claim.replay then return nil, claim.replay end
      ctx.claim = claim
    end
    ctx.s = nil
    return ctx
  end)
  if not ctx then return unpack(replay, 1, 3) end
  local ok, err = pcall(route.outside, ctx)
  return qtg.db.with_api_session(function(s)
    ctx.s = s
    local still, refusal = pcall(authorize, s, route, req)
    if not still then
      if ctx.claim then idempotency.release(s, ctx.claim) end
      error(refusal, 0)
    end
    local function call()
      if not ok then error(err, 0) end
      return encode(route.handler(ctx))
    end
    if ctx.claim then return idempotency.finish(s, ctx.claim, call) end
    return call()
  end)
end

local function run_route(route, params, req)
  local query = req.query or {}
  if route.public then
    check_query(route, query, req.query_repeated)
    local status, doc, headers = route.handler({ params = params, query = query, req = req })
    return encode(status, doc, headers)
  end
  if route.outside then return run_outside(route, params, query, req) end
  return qtg.db.with_api_session(function(s)
    local ctx = admit(s, route, params, query, req)
    local function call() return encode(route.handler(ctx)) end
    if route.mutating then
      return idempotency.wrap(s, ctx.principal, route, req, ctx.body, call)
    end
    return call()
  end)
end

-- A handler's failure: a known kind is the client's problem (or a known
-- outage); anything else is logged and answered 500 without its text.
-- The database's own text (libpq's: socket path, host, port, role) is never
-- shown: an outage is answered with a fixed detail, and its text is logged.
local OUTAGE = {
  connection = "the database is unreachable; retry later",
  timeout = "a backend (the database or a provider) did not answer in time; retry later",
}

local function failure(e, route, req)
  -- the C server interrupts a request still running at its deadline
  -- (MG_API_REQUEST_TIMEOUT_SECONDS) or at shutdown, and has answered it
  -- 503 itself: a database or a provider that did not answer, not a fault
  if type(e) == "table" and e.kind == "interrupted" then
    qtg.log.warn("api request interrupted at its deadline or at shutdown", { route = route and route.path or "?",
      method = req.method, error = tostring(e.message) })
    return problem.response({ kind = "timeout", message = OUTAGE.timeout })
  end
  if type(e) == "table" and OUTAGE[e.kind] then
    qtg.log.warn("api database outage", { route = route and route.path or "?", method = req.method,
      kind = e.kind, error = tostring(e.message) })
    return problem.response({ kind = e.kind, message = OUTAGE[e.kind] })
  end
  if problem.known(e) then return problem.response(e) end
  if type(e) == "table" and e.kind == "sql" and e.sqlstate == "57014" then
    return problem.response({ kind = "timeout", message = "the database statement was cancelled" })
  end
  qtg.log.error("api handler failed", { route = route and route.path or "?", method = req.method,
    error = tostring(type(e) == "table" and (e.message or e.kind) or e) })
  return problem.response({ kind = "internal", message = "internal error; the daemon's log has the details" })
end

-- The metrics' method label: a client may send any token as its method,
-- and a label of each would grow /metrics and this process's memory
-- without bound.
local METHOD_LABELS = { GET = "GET", HEAD = "HEAD", POST = "POST", PUT = "PUT", PATCH = "PATCH",
                        DELETE = "DELETE", OPTIONS = "OPTIONS" }

-- handle(req) -> status, headers, body
function M.handle(req)
  local started = qtg.monotonic()
  req.headers = req.headers or {}
  -- the router matches the path as sent (raw_path, from qtg_api.c), never
  -- the decoded one: /v3/%6de is not /v3/me
  local route, params, allow = routes.match(req.method, req.raw_path or req.path)
  local status, headers, body
  if ui.is_ui(req.path) then
    -- the web console's static files (qtg.api.ui): no token, no database
    local ok, s, h, b = pcall(ui.serve, req)
    if ok then status, headers, body = s, h, b
    else status, headers, body = failure(s, nil, req) end
    route = { name = "ui" }
  elseif not route then
    if allow then
      status, headers, body = problem.response({ kind = "method_not_allowed", message =
        ("%s is not allowed on %s (allowed: %s)"):format(req.method, req.path, allow) }, { Allow = allow })
    else
      status, headers, body = problem.response({ kind = "not_found", message = "no route " .. tostring(req.path) })
    end
  else
    local ok, s, h, b = pcall(run_route, route, params, req)
    if ok then status, headers, body = s, h, b
    else status, headers, body = failure(s, route, req) end
  end
  headers["Cache-Control"] = headers["Cache-Control"] or "no-store"
  headers["X-Content-Type-Options"] = "nosniff"
  metrics.observe_http(route and route.name or "unmatched", METHOD_LABELS[req.method] or "other", status,
    qtg.monotonic() - started)
  return status, headers, body
end

return M
