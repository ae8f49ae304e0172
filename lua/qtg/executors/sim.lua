-- qtg.executors.sim: an in-process stand-in provider.  What it answers for a
-- node comes from the node's config.sim block (docs/templates.md):
--   observes = k             the k-th observe answers COMPLETED (default 1;
--                            0: submit itself answers COMPLETED)
--   side_effect = bool       the submit moves funds (reported to the engine)
--   fail = "preflight"|"submit"|"observe"|"recover"   answer a failure there
--   unknown = "submit"       accept the submit, then answer UNKNOWN (ambiguous)
--   unknown_at_observe = n   answer UNKNOWN at the n-th observe, once
--   submitting = true        submit answers SUBMITTING (accepted, settling)
--   recover = "submitted"|"completed"   what recover answers when the ledger
--                            holds the submit (default "submitted"); without
--                            a ledger row recover answers FAILED SUBMIT_NOT_FOUND
--   retry_after_seconds = n  hint returned by submit and observe
--   refs = {...}             provider_refs returned on completion
--   raise = step             raise an error in that step (tests)
--   garbage = step           answer something malformed in that step (tests)
-- Every accepted submit is a row of sim_ledger keyed by the idempotency key,
-- written on the sim's own session (committed independently of the
-- dispatcher's transaction, as a real provider's books would be); the same key
-- twice is deduplicated (submit_count + 1).  Observe counts live in the same
-- row, as a provider's own state would; sent_before reads it by key.
-- The ledger's writes commit asynchronously (synchronous_commit off for
-- their statement, ASYNC below): the sim stands for a remote provider, whose
-- books cost that provider's disk, not a WAL flush of ours.  Nothing is lost
-- that the engine relied on: the node write that records the answer commits
-- after the ledger write and synchronously, and WAL is flushed in order, so
-- that commit makes the ledger row durable too.  A server crash between the
-- two loses both (the node is dispatched again, with the same idempotency
-- key: still one ledger row), as a provider's crash before it answered would.
--
-- Pacing (qtg.pacing): the sim declares no RATE_LIMITS, as it protects no
-- real provider; an operator's override of this module (MG_LUA_PATH) may
-- declare some.  With CALL_LOG on, the sim keeps an access log in sim_calls
-- (sql/0090_provider_pacing.sql): one row per submit, observe and recover it
-- receives, stamped by the database clock, naming the calling process; the
-- pacing specs measure call rates from it, on the provider's side.
local canon = require "qtg.canon_json"

local M = {}

M.RATE_LIMITS = nil
M.CALL_LOG = false

local STEPS = { preflight = true, prepare = true, submit = true, observe = true,
                recover = true, health = true }
local FIELDS = {
  observes = "number", side_effect = "boolean", fail = "string", unknown = "string",
  unknown_at_observe = "number", submitting = "boolean", recover = "string",
  retry_after_seconds = "number", refs = "table", raise = "string", garbage = "string",
  signer_key = "string",
}

local function qtg() return require "qtg" end

local function sim(cfg)
  local c = type(cfg) == "table" and cfg.sim or nil
  if type(c) ~= "table" then return {} end
  return c
end

-- Template loader hook: refuse a malformed sim block.
function M.validate_config(config)
  local c = config.sim
  if c == nil then return true end
  if type(c) ~= "table" then return nil, "sim must be an object" end
  for k, v in pairs(c) do
    if not FIELDS[k] then return nil, "sim: unknown field " .. tostring(k) end
    if type(v) ~= FIELDS[k] then return nil, string.format("sim.%s must be a %s", k, FIELDS[k]) end
  end
  for _, k in ipairs({ "fail", "raise", "garbage" }) do
    if c[k] and not STEPS[c[k]] then return nil, string.format("sim.%s: unknown step %q", k, c[k]) end
  end
  if c.unknown and c.unknown ~= "submit" then return nil, "sim.unknown must be \"submit\"" end
  if c.recover and c.recover ~= "submitted" and c.recover ~= "completed" then
    return nil, "sim.recover must be \"submitted\" or \"completed\""
  end
  if c.observes and (c.observes < 0 or c.observes ~= math.floor(c.observes)) then
    return nil, "sim.observes must be a whole number >= 0"
  end
  return true
end

local GARBAGE = {
  preflight = function() return "yes" end,
  prepare = function() return { payload_format = 42 } end,
  submit = function() return { status = "DONE-ish", provider_refs = "nope" } end,
  observe = function() return 17 end,
  recover = function() return { status = "SUBMITTED", retry_after_seconds = -5 } end,
  health = function() return { state = "fine" } end,
}

-- The test hooks: raise or answer garbage at a step.
local function hooks(c, step)
  if c.raise == step then error("sim: configured to raise in " .. step, 0) end
  if c.garbage == step then return true, GARBAGE[step]() end
  return false
end

-- A one-row relation whose reading makes the statement's transaction (an
-- autocommit statement's own) commit without waiting for its WAL flush.
local ASYNC = "(SELECT set_config('synchronous_commit', 'off', true)) AS asynchronous"

local function with_session(fn)
  local s = qtg().db.acquire()
  local ok, res = pcall(fn, s)
  s:release()
  if not ok then error(res, 0) end
  return res
end

local function log_call(call, key)
  if not M.CALL_LOG then return end
  with_session(function(s)
    s:query("INSERT INTO sim_calls (call, idempotency_key, caller) VALUES ($1, $2, $3)",
      call, key, qtg().process_id())
  end)
end

local function refs_for(c, key, action_type)
  local refs = { sim_key = key, tx_hash = "0x" .. qtg().crypto.sha256_hex(key),
                 [action_type .. "_id"] = "sim-" .. qtg().crypto.sha256_hex("id:" .. key):sub(1, 16) }
  for k, v in pairs(c.refs or {}) do refs[k] = canon.copy(v) end
  return refs
end

function M.preflight(ctx)
  local c = sim(ctx.node_config)
  local g, v = hooks(c, "preflight"); if g then return v end
  if c.fail == "preflight" then
    return { ok = false, error_code = "SIM_PREFLIGHT_REJECTED", error_detail = "sim: preflight refused" }
  end
  return { ok = true }
end

function M.prepare(ctx)
  local c = sim(ctx.node_config)
  local g, v = hooks(c, "prepare"); if g then return v end
  local payload = canon.encode({ action_type = ctx.action_type, node_config = ctx.node_config,
                                 request_node_id = ctx.request_node_id, attempt_no = ctx.attempt_no })
  local out = { payload_format = "json", payload = payload, action_type = ctx.action_type }
  if c.signer_key then
    -- a signable-looking payload: 0x-hex bytes and their keccak256.  The
    -- signer process signs only approved EIP-1559 transfers, so it refuses
    -- this (SIGNING_REFUSED): a sim node never gets anything signed
    out.payload_format = "hex"
    out.payload = "0x" .. qtg().crypto.hex(payload)
    out.payload_hash = "0x" .. qtg().crypto.keccak256_hex(payload)
    out.signer_key = c.signer_key
  else
    out.payload_hash = qtg().crypto.sha256_hex(payload)
  end
  return out
end

function M.submit(ctx, submission)
  local c = sim(ctx.node_config)
  local g, v = hooks(c, "submit"); if g then return v end
  if c.fail == "submit" then
    return { status = "FAILED", error_code = "SIM_SUBMIT_REJECTED", error_detail = "sim: submit refused" }
  end
  local key = submission.idempotency_key
  local side_effect = c.side_effect == true
  log_call("submit", key)
  with_session(function(s)
    s:query([[
      INSERT INTO sim_ledger (idempotency_key, request_node_id, attempt_no, action_type, side_effect)
      SELECT $1, $2::uuid, $3::int, $4::text, $5::boolean FROM ]] .. ASYNC .. [[
      ON CONFLICT (idempotency_key) DO UPDATE
        SET submit_count = sim_ledger.submit_count + 1, updated_at = clock_timestamp()]],
      key, ctx.request_node_id, ctx.attempt_no, ctx.action_type, side_effect)
  end)
  local refs = { sim_key = key }
  if c.unknown == "submit" then
    return { status = "UNKNOWN", error_code = "SUBMIT_OUTCOME_UNKNOWN",
             error_detail = "sim: connection lost after sending" }
  end
  if c.submitting then
    return { status = "SUBMITTING", provider_refs = refs, side_effect = side_effect }
  end
  if c.observes == 0 then
    return { status = "COMPLETED", provider_refs = refs_for(c, key, ctx.action_type),
             side_effect = side_effect,
             artifacts = { { kind = "sim_receipt", key = key } } }
  end
  return { status = "SUBMITTED", provider_refs = refs, side_effect = side_effect,
           retry_after_seconds = c.retry_after_seconds }
end

local function ledger_row(key)
  return with_session(function(s)
    return s:query("SELECT * FROM sim_ledger WHERE idempotency_key = $1", key)[1]
  end)
end

function M.observe(octx)
  local c = sim(octx.node_config)
  local g, v = hooks(c, "observe"); if g then return v end
  local key = octx.idempotency_key
  log_call("observe", key)
  local row = with_session(function(s)
    return s:query([[UPDATE sim_ledger SET observe_count = observe_count + 1,
                            updated_at = clock_timestamp()
                       FROM ]] .. ASYNC .. [[
                      WHERE idempotency_key = $1 RETURNING observe_count]], key or "")[1]
  end)
  if not row then
    return { status = "FAILED", error_code = "SUBMIT_NOT_FOUND",
             error_detail = "sim: no submission with key " .. tostring(key) }
  end
  local n = row.observe_count
  if c.unknown_at_observe == n then
    return { status = "UNKNOWN", error_code = "OBSERVE_OUTCOME_UNKNOWN",
             error_detail = "sim: provider status unavailable" }
  end
  if c.fail == "observe" then
    return { status = "FAILED", error_code = "SIM_OBSERVED_FAILURE", error_detail = "sim: provider reports failure" }
  end
  if n >= (c.observes or 1) then
    return { status = "COMPLETED", provider_refs = refs_for(c, key, octx.action_type),
             artifacts = { { kind = "sim_receipt", key = key, observes = n } } }
  end
  return { status = "OBSERVING", retry_after_seconds = c.retry_after_seconds }
end

function M.recover(octx)
  local c = sim(octx.node_config)
  local g, v = hooks(c, "recover"); if g then return v end
  log_call("recover", octx.idempotency_key)
  if c.fail == "recover" then
    return { status = "FAILED", error_code = "SIM_RECOVER_FAILED", error_detail = "sim: provider reports failure" }
  end
  local row = octx.idempotency_key and ledger_row(octx.idempotency_key)
  if not row then
    return { status = "FAILED", error_code = "SUBMIT_NOT_FOUND",
             error_detail = "sim: the provider never received " .. tostring(octx.idempotency_key) }
  end
  if c.recover == "completed" then
    return { status = "COMPLETED", provider_refs = refs_for(c, row.idempotency_key, octx.action_type),
             side_effect = row.side_effect }
  end
  return { status = "SUBMITTED", side_effect = row.side_effect, provider_refs = { sim_key = row.idempotency_key } }
end

-- sent_before(octx): the ledger holds a submit under the key (a dispatch
-- lost after the sim took it leaves the node READY).
function M.sent_before(octx)
  return ledger_row(octx.idempotency_key) ~= nil
end

function M.health()
  return { state = "healthy", detail = "sim: in-process" }
end

return M
