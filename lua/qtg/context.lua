-- qtg.context: what executors and the signer are handed, from the rows the
-- workers loaded (pure): the ExecutionContext of preflight/prepare/submit
-- (build) and the SignRequest (sign_request), exactly as spec section 1
-- lists them, and the context of observe() and recover() (observe_context).
local canon = require "qtg.canon_json"
local ref = require "qtg.ref"

local M = {}

M.PROTOCOL_VERSION = "1.0"

local NULL = require("cjson").null

local function present(x)
  if x == NULL then return nil end
  return x
end

-- The submit idempotency key of one attempt of one node.  Deterministic, so a
-- resubmission of the same attempt after a crash carries the same key and the
-- provider deduplicates it; a retry (attempt_no + 1) gets a new key, unless
-- the attempt before it ended before its submit or left the node UNKNOWN
-- (M.key_of, qtg.requests.retry).
function M.idempotency_key(request_node_id, attempt_no)
  return string.format("qtg:%s:%d", request_node_id, attempt_no)
end

-- key_of(node, attempt_no) -> the idempotency key a submit of this attempt
-- carries: the one an earlier attempt that ended before its submit would
-- have carried (sql/0211: that attempt may have replayed a dispatch whose
-- transaction was lost after the provider acted, with that key) or the
-- one an operator's retry of an UNKNOWN node handed on (qtg.requests.retry:
-- its last submit may have acted), else the attempt's own.
function M.key_of(node, attempt_no)
  return present(node.carried_idempotency_key) or M.idempotency_key(node.id, attempt_no)
end

local function by_key(a, b) return a.node_key < b.node_key end

-- Direct predecessors of node_key that are COMPLETED, sorted by node_key.
function M.completed_predecessors(nodes_by_key, pred_keys)
  local out = {}
  for _, k in ipairs(pred_keys or {}) do
    local n = nodes_by_key[k]
    if n and n.node_state == "COMPLETED" then out[#out + 1] = n end
  end
  table.sort(out, by_key)
  return out
end

-- Flat merge of the predecessors' provider_refs.  Predecessors are merged in
-- node_key order, so on a key present in two of them the later node_key wins.
function M.provider_context(preds)
  local out = {}
  for _, n in ipairs(preds) do
    if type(n.provider_refs) == "table" then
      for k, v in pairs(n.provider_refs) do out[k] = canon.copy(v) end
    end
  end
  return out
end

-- The predecessors' artifacts, concatenated in node_key order; each artifact
-- is a copy with `node_key` set to the node that produced it.
function M.prior_artifacts(preds)
  local out = canon.array()
  for _, n in ipairs(preds) do
    if type(n.artifacts) == "table" then
      for _, a in ipairs(n.artifacts) do
        local c = canon.copy(a)
        if type(c) == "table" then c.node_key = c.node_key or n.node_key end
        out[#out + 1] = c
      end
    end
  end
  return out
end

-- build{request=, node=, plan_node=, plan_version=, nodes=, pred_keys=}
--   request:      movement_requests row
--   node:         the movement_request_nodes row being dispatched
--   plan_node:    its plan_nodes row (config, timeout_policy, node_kind)
--   plan_version: {version=, risk_controls=, template_key=}
--   nodes:        every movement_request_nodes row of the request
--   pred_keys:    node keys of the node's direct predecessors
-- Raises the qtg.ref error (code CONFIG_REF_UNRESOLVED) on a bad $ref.
function M.build(a)
  local by = {}
  for _, n in ipairs(a.nodes) do by[n.node_key] = n end
  local preds = M.completed_predecessors(by, a.pred_keys)
  local node_config, bindings = ref.resolve(a.plan_node.config, ref.ref_map(a.nodes))
  return {
    protocol_version = M.PROTOCOL_VERSION,
    request_id = tostring(a.request.id),
    request_node_id = tostring(a.node.id),
    compiled_plan_hash = a.request.compiled_plan_hash,
    template_key = a.plan_version.template_key,
    template_version = a.plan_version.version,
    node_key = a.node.node_key,
    node_kind = a.plan_node.node_kind,
    action_type = a.plan_node.action_type,
    attempt_no = a.node.attempt_no + 1,
    intent = canon.copy(a.request.intent),
    input_params = canon.copy(a.request.input_params),
    resolved_bindings = bindings,
    risk_controls = canon.copy(a.plan_version.risk_controls),
    prior_artifacts = M.prior_artifacts(preds),
    node_config = node_config,
    provider_context = M.provider_context(preds),
    timeout_policy = canon.copy(a.plan_node.timeout_policy),
  }
end


-- observe_context(request, node) -> the context observe() and recover() receive
-- (the node as it is: attempt_no is the attempt being observed).
function M.observe_context(request, node)
  return {
    request_id = tostring(request.id),
    request_node_id = tostring(node.id),
    node_key = node.node_key,
    node_kind = node.node_kind,
    action_type = node.action_type,
    node_state = node.node_state,
    attempt_no = node.attempt_no,
    idempotency_key = present(node.idempotency_key),
    provider_refs = canon.copy(node.provider_refs),
    node_config = canon.copy(present(node.resolved_config) or {}),
    intent = canon.copy(request.intent),
    input_params = canon.copy(request.input_params),
    observe_count = node.observe_count,
    started_at = present(node.started_at),
  }
end

local function str(v, default)
  if v == nil or v == NULL then return default end
  return tostring(v)
end

-- The SignRequest for a prepared action (spec section 1).  The destination is
-- node_config.destination when the node names one, else intent.destination.
function M.sign_request(ctx, prepared)
  local destination = ctx.node_config.destination
  if destination == nil then destination = ctx.intent.destination end
  return {
    protocol_version = M.PROTOCOL_VERSION,
    request_id = ctx.request_id,
    request_node_id = ctx.request_node_id,
    attempt_no = ctx.attempt_no,
    signing_intent = {
      action = prepared.action_type or ctx.action_type,
      asset = str(ctx.intent.asset, ""),
      amount = str(ctx.intent.amount, ""),
      destination = str(destination, ""),
      max_fee_usd = nil,
      chain_family = str(ctx.input_params.chain_family, "evm"),
      allowed_payload_hash = prepared.payload_hash,
    },
    payload_format = prepared.payload_format,
    payload = prepared.payload or "",
    payload_hash = prepared.payload_hash,
    metadata = ctx.input_params,
  }
end

return M
