-- qtg.executors: the executor interface, the registry, and the checks every
-- executor answer passes before the engine believes it.
--
-- An adapter is a module (one table of plain functions):
--   preflight(ctx)            -> {ok = true} | {ok = false, error_code =, error_detail =}
--   prepare(ctx)              -> {payload_format =, payload =, payload_hash =,
--                                 action_type =, signer_key =}   (signer_key: sign it)
--   submit(ctx, submission)   -> result   submission = {idempotency_key =,
--                                 prepared =, signature =}
--   observe(octx)             -> result
--   recover(octx)             -> result
--   health()                  -> {state = "healthy"|"degraded"|"down", detail =}
--   sent_before(octx)         -> true | false   (optional) whether the
--                                 executor's own records hold a submit of
--                                 this node under octx.idempotency_key (the
--                                 key its next attempt carries): a dispatch
--                                 lost after the provider acted leaves the
--                                 node READY, and a cancel asks this first
--                                 (qtg.requests.cancel); raise when it
--                                 cannot tell
-- A submit that answers is taken to have reached the provider with its key
-- (qtg.context.key_of): a check that can refuse before asking the
-- provider belongs in preflight or prepare.
-- An adapter may declare its provider's limits, RATE_LIMITS = {submit =, observe =,
-- recover = {per_second =, burst =}, shared =, max_hold_seconds =}, which
-- the workers keep to (qtg.pacing, docs/pacing.md).
-- ctx is the ExecutionContext (qtg.context.build); octx is the observe
-- context the observer and recovery build (qtg.context.observe_context).  A result is
--   {status =, provider_refs = {...}, artifacts = {...}, side_effect = bool,
--    retry_after_seconds = n, error_code =, error_detail =}
-- with the statuses allowed per call in M.STATUSES.  Anything else (a raise,
-- a non-table, a wrong type) is caught by M.call and recorded as
-- EXECUTOR_ERROR / EXECUTOR_BAD_RESPONSE; see docs/data-model.md.
-- An executor's failure is one qtg error, M.error(code, detail): kind
-- "executor", code the node's error code, message its error detail.
local qtg = require "qtg"
local canon = require "qtg.canon_json"
local busy_stops = require "qtg.busy_stops"
local errors = require "qtg.errors"

local M = {}

-- executor name -> adapter module.  Add a row to add an adapter.
M.ADAPTERS = {
  sim = "qtg.executors.sim",
  manual = "qtg.executors.manual",
  evm_transfer = "qtg.executors.evm_transfer",
}

-- action type -> default executor name (a template node may name another
-- executor with "executor").  Add a row to support an action type.
M.ACTION_TYPES = {
  withdrawal = "sim",
  cex_withdrawal_status = "sim",
  cex_deposit_status = "sim",
  destination_chain_receive_observe = "sim",
  destination_chain_finality_observe = "sim",
  protocol_observe = "sim",
  burn = "sim",
  cctp_attestation = "sim",
  mint = "sim",
  cctp_mint_status = "sim",
  ccip_send = "sim",
  ccip_delivery = "sim",
  stargate_send = "sim",
  debridge_fulfillment = "sim",
  evm_transfer = "sim",
  manual_approval = "manual",
  manual_confirmation = "manual",
  manual_transfer = "manual",
}

-- Statuses each call may answer with, and the node state each leads to.
M.STATUSES = {
  submit = { SUBMITTED = "SUBMITTED", SUBMITTING = "SUBMITTING", COMPLETED = "COMPLETED",
             FAILED = "FAILED", UNKNOWN = "UNKNOWN" },
  observe = { OBSERVING = "OBSERVING", COMPLETED = "COMPLETED", FAILED = "FAILED",
              UNKNOWN = "UNKNOWN" },
  recover = { SUBMITTED = "SUBMITTED", COMPLETED = "COMPLETED", FAILED = "FAILED",
              UNKNOWN = "UNKNOWN" },
}

M.ERROR = "EXECUTOR_ERROR"
M.BAD_RESPONSE = "EXECUTOR_BAD_RESPONSE"
M.NOT_REGISTERED = "EXECUTOR_NOT_REGISTERED"
M.KIND = "executor"

-- error(code, detail) -> the qtg error of an executor's failure: the node
-- records code as error_code and the message as error_detail.
function M.error(code, detail)
  return qtg.error(M.KIND, canon.text_repaired(tostring(detail)), { code = code })
end

-- is_error(e): e is an executor's failure (M.error).
function M.is_error(e)
  return type(e) == "table" and rawget(e, "kind") == M.KIND and type(rawget(e, "code")) == "string"
end

function M.default_executor(action_type)
  return M.ACTION_TYPES[action_type]
end

function M.known_executor(name)
  return M.ADAPTERS[name] ~= nil
end

-- get(name) -> adapter table, or nil + message.
-- executor name -> the setting listing the network classes it may run on
-- (stand-in executors must never "complete" a movement on a real network).
M.RESTRICTED = { sim = "sim_network_classes" }

-- allowed(name, class) -> true, or nil + reason.  The setting is a comma
-- list of class names; NAME* matches a prefix, * every class.
function M.allowed(name, class)
  local setting = M.RESTRICTED[name]
  if not setting then return true end
  local list = require("qtg").settings[setting] or ""
  for item in list:gmatch("[^,%s]+") do
    if item == "*" or item == class then return true end
    local prefix = item:match("^(.*)%*$")
    if prefix and class:sub(1, #prefix) == prefix then return true end
  end
  return nil, string.format("executor %s does not run on network class %s (MG_%s=%s)", name,
    tostring(class), setting:upper(), list)
end

-- stand_in_here(class) -> a sentence when a stand-in executor may run on
-- the daemon's own network class (its nodes complete with no money moved:
-- on a class that moves real money, clients' callbacks would say
-- "completed" for nothing), else nil.  Said at warn at start, by `qtgd
-- check`, and in the policy.start audit row: one line of qtg.env
-- (MG_SIM_NETWORK_CLASSES=*) is enough to turn it on.
function M.stand_in_here(class)
  local out = {}
  for name, setting in pairs(M.RESTRICTED) do
    if M.allowed(name, class) then
      out[#out + 1] = ("the stand-in executor %s may run on this network class %s (MG_%s=%s): its nodes "
        .. "complete with no money moved"):format(name, tostring(class), setting:upper(),
        tostring(require("qtg").settings[setting]))
    end
  end
  table.sort(out)
  return out[1] and table.concat(out, "; ") or nil
end

-- validate(adapter) -> list of errors (empty: usable): what reload and
-- `qtgd check` ask of an adapter module before any node needs it.  A table
-- with at least one of the calls, each call present a function, its
-- RATE_LIMITS well formed (qtg.pacing).  A module that is not (a `return
-- 42`, a `submit` that is a string) would fail every node dispatched to it.
M.ADAPTER_CALLS = { "preflight", "prepare", "submit", "observe", "recover", "health" }

-- adapter[name] as a call reads it (through __index: an adapter may
-- extend another), nil when that lookup raises
local function field(adapter, name)
  local ok, v = pcall(function() return adapter[name] end)
  return ok and v or nil
end

function M.validate(adapter)
  if type(adapter) ~= "table" then
    return { "an executor module must return a table of its functions (got " .. type(adapter) .. ")" }
  end
  local errs, any = {}, false
  for _, fname in ipairs(M.ADAPTER_CALLS) do
    local f = field(adapter, fname)
    if f ~= nil then
      any = true
      if type(f) ~= "function" then errs[#errs + 1] = fname .. " must be a function (got " .. type(f) .. ")" end
    end
  end
  if not any then errs[#errs + 1] = "an executor module needs one of " .. table.concat(M.ADAPTER_CALLS, ", ") end
  local sent = field(adapter, "sent_before")
  if sent ~= nil and type(sent) ~= "function" then
    errs[#errs + 1] = "sent_before must be a function (got " .. type(sent) .. ")"
  end
  local ok, why = require("qtg.pacing").check_declaration(field(adapter, "RATE_LIMITS"))
  if not ok then errs[#errs + 1] = why end
  return errs
end

function M.get(name)
  local modname = M.ADAPTERS[name]
  if not modname then return nil, "no executor named " .. tostring(name) end
  local ok, mod = pcall(require, modname)
  if not ok then return nil, "executor " .. name .. " failed to load: " .. tostring(mod) end
  return mod
end

-- Field checks of an answer: field -> predicate(value) -> ok.
local function optional(t)
  return function(v) return v == nil or type(v) == t end
end

local function encodable(v)
  return (pcall(canon.encode, v))
end

-- provider_refs and artifacts are stored as jsonb: text PostgreSQL refuses
-- (not UTF-8, a NUL) would fail the node's write and roll the attempt back,
-- and the node would be claimed first again on every pass.
local function storable(v)
  return encodable(v) and canon.bad_text_path(v, "v") == nil
end

local function is_object(v)
  if v == nil then return true end
  if type(v) ~= "table" then return false end
  for k in pairs(v) do if type(k) ~= "string" then return false end end
  return storable(v)
end

local function is_array(v)
  if v == nil then return true end
  if type(v) ~= "table" then return false end
  local n = 0
  for _ in pairs(v) do n = n + 1 end
  return n == #v and storable(v)
end

local function non_negative(v)
  return v == nil or (type(v) == "number" and v >= 0 and v == v and v < math.huge)
end

local RESULT_FIELDS = {
  provider_refs = is_object,
  artifacts = is_array,
  side_effect = optional("boolean"),
  retry_after_seconds = non_negative,
  error_code = optional("string"),
  error_detail = optional("string"),
}

local SHAPES = {
  preflight = { ok = function(v) return type(v) == "boolean" end,
                error_code = optional("string"), error_detail = optional("string") },
  prepare = { payload_format = function(v) return type(v) == "string" end,
              payload = optional("string"), payload_hash = optional("string"),
              action_type = optional("string"), signer_key = optional("string") },
  health = { state = function(v) return v == "healthy" or v == "degraded" or v == "down" end,
             detail = optional("string") },
}
for call in pairs(M.STATUSES) do SHAPES[call] = RESULT_FIELDS end

-- check(call, answer) -> answer, or nil + reason (a bad response).
function M.check(call, answer)
  if type(answer) ~= "table" then
    return nil, string.format("%s returned a %s, not a table", call, type(answer))
  end
  local statuses = M.STATUSES[call]
  if statuses and not statuses[answer.status] then
    return nil, string.format("%s returned status %s (expected one of %s)", call,
      tostring(answer.status), M.status_list(call))
  end
  for field, ok in pairs(SHAPES[call]) do
    if not ok(answer[field]) then
      return nil, string.format("%s returned a bad %s (%s)", call, field, type(answer[field]))
    end
  end
  if call == "prepare" and answer.signer_key and not answer.payload_hash then
    return nil, "prepare asks for signing without a payload_hash"
  end
  -- a provider's error text (a health detail often quotes a node's), cut
  -- at a byte count or not UTF-8 at all, is kept as valid text (U+FFFD)
  -- rather than failing the node's or the component's write
  for _, field in ipairs({ "error_code", "error_detail", "detail" }) do
    if type(answer[field]) == "string" then answer[field] = canon.text_repaired(answer[field]) end
  end
  return answer
end

function M.status_list(call)
  local out = {}
  for s in pairs(M.STATUSES[call]) do out[#out + 1] = s end
  table.sort(out)
  return table.concat(out, ", ")
end

-- A raised value as the error detail: an executor's own refusal
-- (M.error raised) reads "CODE: detail", anything else as errors.text.
local function raised_text(e)
  if M.is_error(e) then return e.code .. ": " .. e.message end
  return errors.text(e)
end

-- sent_before(adapter, octx) -> true | false, or nil + reason when the
-- adapter cannot tell (it raised, or answered something else): false for
-- an adapter that keeps no such records (no sent_before).
function M.sent_before(adapter, octx)
  local f = field(adapter, "sent_before")
  if f == nil then return false end
  local ok, answer = pcall(f, octx)
  if not ok then return nil, "sent_before raised: " .. raised_text(answer) end
  if type(answer) ~= "boolean" then
    return nil, "sent_before returned a " .. type(answer) .. ", not a boolean"
  end
  return answer
end

-- ---- calls the busy guard stopped
-- Each call of a node's context is watched (qtg.busy_stops, key "node
-- id:attempt:call"): a call the busy guard stopped is, from then on,
-- answered at that attempt with the error it raised, without running the
-- adapter, so the node is recorded as after any raise there (preflight,
-- prepare: FAILED; submit, observe: UNKNOWN, for recovery; recover: left
-- UNKNOWN).  Without it the stopped dispatch rolled back, the node stayed
-- READY at the FIFO head and was claimed and stopped again at every pass
-- (a review, session 38: one adapter looping on one request's data held
-- the daemon 30 s in every 30 s).
M.CALLS = { "preflight", "prepare", "submit", "observe", "recover" }

-- Every `what` the busy guard can count exists at 0 from the start (an
-- alert on the first stop: qtg.metrics): the engine's own and each call.
do
  local metrics = require "qtg.metrics"
  for what in pairs(busy_stops.EFFECTS) do metrics.zero("qtg_busy_stops_total", { what = what }) end
  for _, what in ipairs(M.CALLS) do metrics.zero("qtg_busy_stops_total", { what = what }) end
end
M.STOPPED_LINE = "executor call stopped by the busy guard: its node is answered so from now on"

local function stop_key(fname, ctx)
  if type(ctx) ~= "table" or ctx.request_node_id == nil then return nil end
  return busy_stops.key(ctx.request_node_id, ctx.attempt_no, fname)
end

-- was_stopped(ctx, fname): the busy guard stopped this node's call fname
-- at ctx's attempt (it is answered so, without running the adapter)
function M.was_stopped(ctx, fname)
  local key = stop_key(fname, ctx)
  return key ~= nil and busy_stops.stopped(key)
end

-- call(adapter, fname, ...) -> answer | nil, err (M.error)
-- Runs one adapter function, catching a raise (EXECUTOR_ERROR), a missing
-- function (EXECUTOR_ERROR) and a malformed answer (EXECUTOR_BAD_RESPONSE);
-- a call the busy guard stopped before is answered with its error (above).
function M.call(adapter, fname, ...)
  local f = adapter[fname]
  if type(f) ~= "function" then
    return nil, M.error(M.ERROR, "executor has no " .. fname .. "()")
  end
  local key = stop_key(fname, (...))
  if key and busy_stops.stopped(key) then
    return nil, M.error(M.ERROR, string.format("%s held the loop past MG_TASK_BUSY_LIMIT_SECONDS and was stopped "
      .. "by the busy guard (not called again at this attempt until a reload)", fname))
  end
  -- the answer's check is part of the call: it reads what the adapter
  -- returned (a metatable of its own included), so a stop or a raise there
  -- is the call's
  local w, finish
  if key then w, finish = busy_stops.watch(key, M.STOPPED_LINE) end
  local ok, answer = pcall(f, ...)
  local read, checked, why = true, nil, nil
  if ok then read, checked, why = pcall(M.check, fname, answer) end
  if finish then finish(w) end
  if not ok then
    -- the signer could not be asked: not the executor's failure, and not
    -- final; the dispatcher rolls the attempt back (node stays READY)
    if type(answer) == "table" and answer.kind == "signer_unavailable" then error(answer, 0) end
    return nil, M.error(M.ERROR, string.format("%s raised: %s", fname, raised_text(answer)))
  end
  if not read then
    return nil, M.error(M.BAD_RESPONSE, string.format("%s answered what cannot be read: %s", fname, errors.text(checked)))
  end
  if not checked then return nil, M.error(M.BAD_RESPONSE, why) end
  return checked
end

return M
