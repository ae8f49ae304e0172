-- Helpers of the engine specs (spec/lua/engine_*_spec.lua): templates,
-- requests and ticks of the core workers in this process.  Required from
-- inside a spec's blocks, never at load time.  What every support module
-- does alike is in spec/lua/support/common.lua.
local qtg = require "qtg"
local templates = require "qtg.templates"
local requests = require "qtg.requests"
local common = require "spec.lua.support.common"

local M = {}

M.ACTOR = "console:spec"
-- The initiator of the specs' requests: never the approver (four eyes).
M.INITIATOR = "console:spec-initiator"

function M.uid(prefix) return common.uid(prefix or "k", 8) end

-- refused(kind, fn, ...) -> the error fn raised: it must raise, with that
-- kind and a message.
function M.refused(kind, fn, ...)
  local ok, err = pcall(fn, ...)
  assert(not ok, "expected a refusal")
  assert(type(err) == "table" and err.kind == kind,
    ("expected a refusal of kind %s, got %s"):format(kind, type(err) == "table" and tostring(err.kind) .. ": "
      .. tostring(err.message) or tostring(err)))
  assert(type(err.message) == "string", "a refusal without a message")
  return err
end

-- with_policy(policy, fn): run fn with `policy` as the loaded approval
-- policy (as a reload swaps the module), then put the shipped one back.
function M.with_policy(policy, fn)
  local name = "qtg.policies.approval"
  local old = package.loaded[name]
  package.loaded[name] = policy
  local ok, err = pcall(fn)
  package.loaded[name] = old
  require("qtg.approvals").policy()
  if not ok then error(err, 0) end
end

-- Move every request of this process's network class out of the way, so a
-- spec's ticks only see the requests it made.
function M.park_others(s)
  common.unfrozen(s, [[UPDATE movement_requests SET network_class = 'parked-' || network_class
             WHERE network_class = $1]], qtg.settings.network_class)
end

function M.load_doc(s, doc)
  local c, errs = templates.validate_and_compile(doc, "spec:" .. doc.template_key)
  assert(c, errs and table.concat(errs, "\n"))
  s:begin()
  local r = templates.store(s, c)
  s:commit()
  return r
end

-- A template doc from a compact description:
-- nodes = { {key, kind, action_type, config}, ... }, edges = { {"a","b"}, ... }
function M.doc(key, nodes, edges, extra)
  local d = { template_key = key, name = key, nodes = {}, edges = {},
              intent = { required = { "asset", "amount" } } }
  for i, n in ipairs(nodes) do
    d.nodes[i] = { key = n[1], kind = n[2], action_type = n[3], config = n[4] or {},
                   timeout_policy = n[5], executor = n.executor }
  end
  for i, e in ipairs(edges or {}) do d.edges[i] = { from = e[1], to = e[2] } end
  for k, v in pairs(extra or {}) do d[k] = v end
  return d
end

-- insert_requests(s, class, n, template_key, prefix, states[, every]): n
-- requests of the template's newest version in class (idempotency keys
-- prefix-1 .. prefix-n, each created a second after the one before) and
-- their nodes, written straight to the tables in s's open transaction (the
-- plans and gauges specs load history this way).  states: SQL expressions
-- of the request's state (of g, its number, and e.every), of each node's
-- state (of r.request_state and pn.node_key) and of its next_observe_at
-- (NULL when not given).
function M.insert_requests(s, class, n, template_key, prefix, states, every)
  s:query([[
    WITH pv AS (
      SELECT pv.id, pv.compiled_plan_hash FROM plan_versions pv
        JOIN movement_templates t ON t.id = pv.template_id
       WHERE t.template_key = $3 ORDER BY pv.version DESC LIMIT 1),
    r AS (
      INSERT INTO movement_requests (network_class, template_key, plan_version_id,
             compiled_plan_hash, request_state, intent, idempotency_key, created_by,
             callback_url, created_at)
      SELECT $1, $3, pv.id, pv.compiled_plan_hash, ]] .. states.request .. [[,
             '{}', $4 || '-' || g, 'spec', 'http://127.0.0.1:9/cb',
             clock_timestamp() - make_interval(secs => $2 - g)
        FROM pv, generate_series(1, $2::int) g, (SELECT $5::int AS every) e
      RETURNING id, plan_version_id, request_state, idempotency_key)
    INSERT INTO movement_request_nodes (request_id, plan_node_id, node_key, node_kind,
           action_type, executor, node_state, next_observe_at)
    SELECT r.id, pn.id, pn.node_key, pn.node_kind, pn.action_type, pn.executor,
           ]] .. states.node .. [[, ]] .. (states.next_observe_at or "NULL::timestamptz") .. [[

      FROM r JOIN plan_nodes pn ON pn.plan_version_id = r.plan_version_id]], class, n, template_key, prefix,
    every or 0)
end

M.INTENT = { asset = "USDC", amount = "100.00" }

function M.create(s, template_key, opts)
  opts = opts or {}
  return requests.create(s, {
    template_key = template_key,
    intent = opts.intent or M.INTENT,
    idempotency_key = opts.idempotency_key or M.uid("idem"),
    callback_url = opts.callback_url == nil and "http://127.0.0.1:9/callback" or opts.callback_url or nil,
    input_params = opts.input_params,
    network_class = opts.network_class,
  }, M.INITIATOR)
end

-- approve(s, id) -> request: approved by ACTOR, and by SECOND_APPROVER too
-- when the approval policy asks two (amounts from 100000).
M.SECOND_APPROVER = "console:spec-second-approver"
function M.approve(s, id)
  local req = requests.approve(s, id, M.ACTOR)
  if req.request_state == "PENDING_APPROVAL" then req = requests.approve(s, id, M.SECOND_APPROVER) end
  return req
end

-- move_class(s, id, class): the request as if made and approved by a
-- deployment of `class`, its approval digest and votes recomputed (with the
-- freeze triggers off for these statements: common.unfrozen), in one
-- transaction: a daemon of `class` never sees the request moved with its
-- votes still for the old digest (its signer would refuse it).
function M.move_class(s, id, class)
  local function move()
    common.unfrozen(s, "UPDATE movement_requests SET network_class = $2 WHERE id = $1::uuid", id, class)
    common.unfrozen(s, [[UPDATE movement_requests r SET approval_digest = qtg_approval_digest(r)
               WHERE id = $1::uuid AND approval_digest IS NOT NULL]], id)
    common.unfrozen(s, [[UPDATE request_approvals a SET approval_digest = r.approval_digest
                FROM movement_requests r WHERE r.id = a.request_id AND a.request_id = $1::uuid]], id)
  end
  if s:in_transaction() then move() else s:transaction(move) end
end

function M.create_approved(s, template_key, opts)
  local own = {}
  for k, v in pairs(opts or {}) do own[k] = v end
  own.network_class = nil
  local req = M.create(s, template_key, own)
  req = M.approve(s, req.id)
  if opts and opts.network_class then
    -- as if another deployment had made and approved it: the approval
    -- digest covers the network class (the signer recomputes it)
    M.move_class(s, req.id, opts.network_class)
    req.network_class = opts.network_class
  end
  return req
end

function M.nodes(s, request_id)
  local out = {}
  for _, n in ipairs(s:query("SELECT * FROM movement_request_nodes WHERE request_id = $1::uuid",
      request_id)) do
    out[n.node_key] = n
  end
  return out
end

function M.request(s, id)
  return s:query("SELECT * FROM movement_requests WHERE id = $1::uuid", id)[1]
end

-- One tick of a worker module on a fresh session, as the runtime runs it.
M.tick = common.tick
M.unfrozen = common.unfrozen

-- Tick the core workers until done(s) is true or `seconds` pass.
function M.drive(s, done, seconds, workers)
  workers = workers or { "node_dispatcher", "node_observer", "node_recovery" }
  local deadline = qtg.monotonic() + (seconds or 20)
  while qtg.monotonic() < deadline do
    if done(s) then return true end
    local n = 0
    for _, w in ipairs(workers) do n = n + M.tick(w) end
    if n == 0 then qtg.sleep(0.05) end
  end
  return done(s)
end

function M.state_is(req_id, want)
  return function(s) return M.request(s, req_id).request_state == want end
end

function M.callbacks(s, request_id)
  local rows = s:query([[SELECT id, event_type, payload FROM movement_callback_outbox
                          WHERE request_id = $1::uuid ORDER BY id]], request_id)
  for _, r in ipairs(rows) do r.body = require("cjson").decode(r.payload) end
  return rows
end

function M.audit(s, request_id)
  return s:query("SELECT * FROM audit_outbox WHERE request_id = $1::uuid ORDER BY id", request_id)
end

-- The path of the running qtgd binary (for child processes).
M.qtgd_bin = common.bin

-- The repository root (where lua/, spec/ and templates/ are).
function M.repo_root()
  local here = debug.getinfo(1, "S").source:match("^@(.*)$") or ""
  local root = here:match("^(.*)/spec/lua/support/[^/]*$")
  if root then return root end
  local p = io.popen("pwd")
  local cwd = p:read("*l")
  p:close()
  return cwd
end

return M
