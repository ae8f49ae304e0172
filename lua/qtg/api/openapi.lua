-- qtg.api.openapi: the OpenAPI 3.1 document of the API, built from the
-- route table (qtg.api.routes) and the schemas below, so a route cannot
-- exist without its entry.  spec/lua/api/api_spec.lua checks that the
-- document and the routes agree and validates the specs' responses against
-- these schemas.
local canon = require "qtg.canon_json"

local M = {}

local A = canon.array

local function nullable(t) return A{ t, "null" } end
local STR, NSTR = { type = "string" }, { type = nullable("string") }
local INT = { type = "integer" }
local OBJ = { type = "object" }

local function ref(name) return { ["$ref"] = "#/components/schemas/" .. name } end
local function page(item)
  return { type = "object", required = A{ "items", "next_cursor" },
           properties = { items = { type = "array", items = item }, next_cursor = NSTR } }
end

M.SCHEMAS = {
  Problem = { type = "object", required = A{ "type", "title", "status", "detail", "kind" },
    properties = { type = STR, title = STR, status = INT, detail = STR, kind = STR,
                   allowed_states = { type = "array", items = STR }, retry_after = INT } },
  Health = { type = "object", required = A{ "status" }, properties = { status = STR } },
  Ready = { type = "object", required = A{ "ready", "checks" }, properties = {
    ready = { type = "boolean" },
    checks = { type = "array", items = { type = "object", required = A{ "name", "status", "detail" },
      properties = { name = STR, status = { type = "string", enum = A{ "ok", "failing", "not_configured" } },
                     detail = STR } } } } },
  Node = { type = "object", required = A{ "id", "node_key", "node_kind", "action_type", "node_state", "attempt_no" },
    properties = { id = STR, node_key = STR, node_kind = STR, action_type = STR, executor = STR,
                   node_state = STR, attempt_no = INT, observe_count = INT, provider_refs = OBJ, error_code = NSTR,
                   error_detail = NSTR, started_at = NSTR, finished_at = NSTR, next_observe_at = NSTR,
                   updated_at = STR, side_effect = { type = "boolean" }, state_since = NSTR,
                   unknown_observations = INT,
                   manual = { type = "object", required = A{ "instructions", "required_inputs",
                                                             "attestation_statement", "attested_by" },
                     properties = { instructions = NSTR, required_inputs = { type = "array", items = STR },
                                    attestation_statement = NSTR, attested_by = NSTR } } } },
  Request = { type = "object",
    required = A{ "id", "template_key", "request_state", "network_class", "intent", "current_frontier",
                  "created_by", "created_at" },
    properties = { id = STR, template_key = STR, request_state = STR, network_class = STR, intent = OBJ,
                   input_params = OBJ, current_frontier = { type = "array", items = STR },
                   idempotency_key = STR, callback_url = NSTR, created_by = STR, approved_by = NSTR,
                   approved_at = NSTR, created_at = STR, updated_at = STR, expires_at = NSTR,
                   finished_at = NSTR, last_error_code = NSTR, approvals_required = INT,
                   approval_digest = NSTR } },
  RequestDetail = { allOf = A{ ref("Request"), { type = "object",
    required = A{ "nodes", "edges", "approvals", "approval_policy", "errors", "approval_statement",
                  "initiation_statement", "initiated" },
    properties = { nodes = { type = "array", items = ref("Node") },
                   edges = { type = "array", items = { type = "object", required = A{ "from", "to" },
                     properties = { from = STR, to = STR } } },
                   approval_policy = { type = "object", required = A{ "still_needed" },
                     properties = { rule = NSTR, roles = { type = "array", items = STR },
                                    still_needed = INT, error = NSTR,
                                    signed_approvals = { type = "boolean" } } },
                   approval_statement = NSTR, initiation_statement = NSTR, initiated = { type = "boolean" },
                   approvals = { type = "array", items = { type = "object",
                     required = A{ "principal", "decision", "created_at" },
                     properties = { principal = STR, decision = STR, comment = NSTR, created_at = STR,
                                    signed = { type = "boolean" } } } },
                   errors = { type = "array", items = { type = "object",
                     required = A{ "node_key", "error_code" },
                     properties = { node_key = STR, node_id = STR, error_code = STR, error_detail = NSTR } } } } } } },
  RequestPage = page(ref("Request")),
  EventPage = page({ type = "object", required = A{ "id", "actor", "action", "created_at" },
    properties = { id = INT, actor = STR, action = STR, entity_type = STR, entity_id = STR, detail = OBJ,
                   created_at = STR } }),
  CallbackPage = page({ type = "object", required = A{ "id", "request_id", "event_type", "status", "attempts" },
    properties = { id = INT, request_id = STR, event_type = STR, status = STR, attempts = INT,
                   last_status = { type = nullable("integer") }, last_error = NSTR, created_at = STR,
                   updated_at = STR, redelivered_as = { type = nullable("integer") } } }),
  Me = { type = "object", required = A{ "actor", "kind", "name", "roles", "network_class", "scope" },
    properties = { actor = STR, kind = STR, name = STR, roles = { type = "array", items = STR },
                   network_class = STR, scope = { type = "string", enum = A{ "class", "own" } } } },
  ApprovalPage = page({ type = "object",
    required = A{ "id", "template_key", "created_by", "created_at", "approvals", "approvals_required",
                  "approval_document", "digest", "roles", "approval_statement", "approval_document_text",
                  "plan_document_text", "signer_may_sign" },
    properties = { id = STR, template_key = STR, created_by = STR, created_at = STR, expires_at = NSTR,
                   approvals = INT, approvals_required = INT, rule = NSTR,
                   roles = { type = "array", items = STR },
                   approval_document = { type = "object", required = A{ "template_key", "intent", "network_class" },
                     properties = { template_key = STR, intent = OBJ, network_class = STR,
                                    compiled_plan_hash = STR } },
                   digest = STR, approved_digest = NSTR, approval_statement = NSTR,
                   approval_document_text = STR, plan_document_text = STR, signer_may_sign = NSTR } }),
  HeartbeatList = { type = "object", required = A{ "items", "stale_after_seconds" },
    properties = { stale_after_seconds = INT, items = { type = "array", items = { type = "object",
      required = A{ "worker_name", "process_id", "group_name", "updated_at", "stale" },
      properties = { worker_name = STR, process_id = STR, group_name = STR, started_at = STR,
                     last_tick_at = NSTR, last_count = { type = nullable("integer") },
                     consecutive_errors = INT, updated_at = STR, stale = { type = "boolean" } } } } } },
  ItemList = { type = "object", required = A{ "items" }, properties = { items = { type = "array" } } },
  Signer = { type = "object", required = A{ "signer_key", "posture" }, properties = { signer_key = STR, posture = STR } },
  Redelivery = { type = "object", required = A{ "id", "redelivery_of" }, properties = { id = INT, redelivery_of = INT } },
  BulkRedelivery = { type = "object", required = A{ "dry_run", "count", "capped", "cap" },
    properties = { dry_run = { type = "boolean" }, count = INT, capped = { type = "boolean" }, cap = INT,
                   redelivered = { type = "array", items = INT } } },
}

local function body_schema(body)
  local props, required = {}, A()
  for name, def in pairs(body.fields) do
    props[name] = def.type == "any" and {} or { type = def.type }
    if def.required then required[#required + 1] = name end
  end
  table.sort(required)
  local s = { type = "object", additionalProperties = false, properties = props }
  if #required > 0 then s.required = required end
  return s
end

local function problem_response(desc)
  return { description = desc, content = { ["application/problem+json"] = { schema = ref("Problem") } } }
end

function M.document()
  local routes = require "qtg.api.routes"
  local paths = {}
  for _, r in ipairs(routes.LIST) do
    local params = A()
    for p in r.path:gmatch("{([%w_]+)}") do
      params[#params + 1] = { name = p, ["in"] = "path", required = true, schema = STR }
    end
    local qnames = {}
    for q in pairs(r.query or {}) do qnames[#qnames + 1] = q end
    table.sort(qnames)
    for _, q in ipairs(qnames) do
      local def = r.query[q]
      params[#params + 1] = { name = q, ["in"] = "query", required = false, schema = { type = def.type },
                              description = def.description }
    end
    if r.mutating then
      params[#params + 1] = { name = "Idempotency-Key", ["in"] = "header",
                              required = r.requires_idempotency_key and true or false, schema = STR }
    end
    local ok = { description = r.summary }
    if r.response == "text" then
      ok.content = { ["text/plain"] = { schema = STR } }
    elseif r.response == "any" then
      ok.content = { ["application/json"] = { schema = OBJ } }
    else
      ok.content = { ["application/json"] = { schema = ref(r.response) } }
    end
    local responses = { ["200"] = ok, ["400"] = problem_response("bad request") }
    if r.method == "POST" and (r.name == "create_request" or r.name == "redeliver_callback") then
      responses["201"] = ok
    end
    if not r.public then
      responses["401"] = problem_response("no, unknown, revoked or expired token")
      responses["403"] = problem_response("the token lacks the route's role")
      responses["429"] = problem_response("over the token's rate limit")
    end
    if r.path:find("{", 1, true) or r.name == "create_request" or r.name == "balances" then
      responses["404"] = problem_response("no such resource (request, node, template, venue...)")
    end
    if r.mutating then
      responses["409"] = problem_response("illegal transition, or the same Idempotency-Key still in flight")
      responses["422"] = problem_response("invalid input, or an Idempotency-Key reused for another request")
    end
    if r.body then
      responses["413"] = problem_response("the body is over MG_API_MAX_BODY_BYTES")
      responses["415"] = problem_response("the body is not application/json")
      responses["422"] = responses["422"] or problem_response("invalid input or an unknown field")
    end
    responses["500"] = problem_response("internal error (details in the daemon's log)")
    if r.name ~= "readyz" then responses["503"] = problem_response("the request ran past its deadline, or the database is unreachable") end
    if r.name == "readyz" then
      responses["503"] = { description = "not ready", content = { ["application/json"] = { schema = ref("Ready") } } }
    end
    local op = { operationId = r.name, summary = r.summary, responses = responses,
                 ["x-qtg-role"] = r.role or "public" }
    if #params > 0 then op.parameters = params end
    if r.body then
      op.requestBody = { required = not r.body.optional,
                         content = { ["application/json"] = { schema = body_schema(r.body) } } }
    end
    if not r.public then op.security = A{ { bearer = A() } } else op.security = A() end
    paths[r.path] = paths[r.path] or {}
    paths[r.path][r.method:lower()] = op
  end
  return {
    openapi = "3.1.0",
    info = { title = "qtg API", version = "3" },
    paths = paths,
    components = { schemas = M.SCHEMAS,
                   securitySchemes = { bearer = { type = "http", scheme = "bearer" } } },
  }
end

return M
