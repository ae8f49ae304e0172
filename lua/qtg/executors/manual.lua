-- qtg.executors.manual: manual_* steps.  The dispatcher never dispatches
-- them (M.dispatchable = false): a READY manual node waits for an operator,
-- the request shows WAITING_MANUAL_ACTION, and requests.complete_manual_step
-- calls M.complete to check what the operator supplied.
--
-- Node config: {"instructions": "...", "required_inputs": ["field", ...],
--               "side_effect": true|false}
local canon = require "qtg.canon_json"

local M = {}

M.dispatchable = false

local FIELDS = { instructions = "string", required_inputs = "table", side_effect = "boolean" }

function M.validate_config(config)
  for k, v in pairs(config) do
    if not FIELDS[k] then return nil, "manual step: unknown field " .. tostring(k) end
    if type(v) ~= FIELDS[k] then return nil, string.format("%s must be a %s", k, FIELDS[k]) end
  end
  for _, f in ipairs(config.required_inputs or {}) do
    if type(f) ~= "string" or f == "" then return nil, "required_inputs must name fields" end
  end
  return true
end

-- complete(config, input) -> {provider_refs=, artifacts=, side_effect=} | nil, message
function M.complete(config, input)
  if input ~= nil and type(input) ~= "table" then
    return nil, "operator input must be an object"
  end
  input = input or {}
  local missing = {}
  for _, f in ipairs(config.required_inputs or {}) do
    local v = input[f]
    if v == nil or v == "" or v == require("cjson").null then missing[#missing + 1] = f end
  end
  if #missing > 0 then
    return nil, "operator input is missing: " .. table.concat(missing, ", ")
  end
  local refs = {}
  for k, v in pairs(input) do
    if type(k) ~= "string" then return nil, "operator input keys must be strings" end
    refs[k] = canon.copy(v)
  end
  return { provider_refs = refs, side_effect = config.side_effect == true,
           artifacts = { { kind = "operator_input", fields = canon.copy(input) } } }
end

local function refuse(step)
  return function()
    error("manual steps are completed by an operator, never by " .. step, 0)
  end
end

M.preflight = refuse("preflight")
M.prepare = refuse("prepare")
M.submit = refuse("submit")

function M.observe()
  return { status = "UNKNOWN", error_code = "MANUAL_STEP_NOT_OBSERVABLE" }
end
M.recover = M.observe

function M.health()
  return { state = "healthy", detail = "manual: operator steps" }
end

return M
