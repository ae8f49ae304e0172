-- qtg.drift: registry drift bookkeeping shared by verify_drift (on-chain
-- values against drift_baselines) and ccip_drift (what the CCIP sidecar
-- reports): baselines, checks, findings and the guard of a pass
-- (docs/conditional-workers.md sections 8 and 9).
--
-- A finding is open while a check sees a value other than the expected one
-- and is resolved by the first later check that sees the expected value (or,
-- for the sidecar, no longer reports it).  A check that could not judge a
-- subject (RPC error, timeout, malformed address, sidecar down) changes no
-- finding: it is recorded in drift_checks.errors.  Opening a finding writes
-- an operator notification (dedupe key per finding), so a drift is announced
-- once, however many checks see it.
local qtg = require("qtg")
local canon = require("qtg.canon_json")
local evm_rpc = require("qtg.evm_rpc")
local notify = require("qtg.notifications")
local outbox = require("qtg.outbox")

local M = {}

M.KINDS = { code_hash = true, call = true }

local function hex(v, what)
  if type(v) ~= "string" or not v:match("^0x%x*$") or #v % 2 ~= 0 then
    error(string.format("drift: %s must be 0x and an even number of hex digits, got %s", what, tostring(v)), 0)
  end
  return v:lower()
end

-- set_baseline(s, t, actor): add or replace the baseline (class, chain_id,
-- lane, name).  t = {chain_id, lane, name, kind = code_hash|call, address,
-- call_data (call), expected}.  Refuses malformed input with a clear error,
-- writes nothing then.  Audited.
function M.set_baseline(s, t, actor)
  if type(actor) ~= "string" or actor == "" then error("drift.set_baseline: actor is required", 2) end
  if type(t) ~= "table" then error("drift.set_baseline: want a table", 2) end
  local chain = tonumber(t.chain_id)
  if not chain or chain < 1 or chain % 1 ~= 0 then error("drift.set_baseline: chain_id must be a positive integer", 0) end
  if type(t.lane) ~= "string" or t.lane == "" then error("drift.set_baseline: lane is required", 0) end
  if type(t.name) ~= "string" or t.name == "" then error("drift.set_baseline: name is required", 0) end
  if not M.KINDS[t.kind] then error("drift.set_baseline: kind must be code_hash or call", 0) end
  local address, why = evm_rpc.check_address(t.address)
  if not address then error("drift.set_baseline: " .. why, 0) end
  local call_data = t.kind == "call" and hex(t.call_data, "call_data") or qtg.db.NULL
  local expected = hex(t.expected, "expected")
  if t.kind == "code_hash" and #expected ~= 66 then
    error("drift.set_baseline: a code_hash baseline expects keccak256 (0x and 64 hex digits)", 0)
  end
  return s:transaction(function()
    local r = s:query([[
      INSERT INTO drift_baselines (network_class, chain_id, lane, name, kind, address, call_data, expected, created_by)
      VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
      ON CONFLICT (network_class, chain_id, lane, name) DO UPDATE
         SET kind = EXCLUDED.kind, address = EXCLUDED.address, call_data = EXCLUDED.call_data,
             expected = EXCLUDED.expected, enabled = true, updated_at = clock_timestamp()
      RETURNING *]], qtg.settings.network_class, chain, t.lane, t.name, t.kind, address, call_data,
      expected, actor)[1]
    outbox.audit(s, actor, "drift.baseline.set", "drift_baselines", r.id, nil,
      { chain_id = chain, lane = t.lane, name = t.name, kind = t.kind, address = address, expected = expected })
    return r
  end)
end

M.OPEN_SQL = [[
INSERT INTO drift_findings AS f (network_class, source, subject, baseline_id, severity, expected, observed, detail)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::jsonb)
ON CONFLICT (network_class, source, subject) WHERE status = 'open' DO UPDATE
   SET observed = EXCLUDED.observed, expected = EXCLUDED.expected, detail = EXCLUDED.detail,
       severity = EXCLUDED.severity
 WHERE (f.observed, f.expected, f.severity) IS DISTINCT FROM (EXCLUDED.observed, EXCLUDED.expected, EXCLUDED.severity)
RETURNING id, (xmax = 0) AS inserted]]

-- A provider's text as stored: valid UTF-8 (canon.text_repaired) whatever
-- the caller checked, since PostgreSQL refuses anything else; nil stays nil.
local function stored(v)
  if v == nil or v == qtg.db.NULL then return v end
  return canon.text_repaired(tostring(v))
end

-- open(s, class, source, f): f = {subject, baseline_id, severity, expected,
-- observed, detail}.  Returns "opened", "changed" or nil (already open as is).
function M.open(s, class, source, f)
  f.subject, f.expected, f.observed = stored(f.subject), stored(f.expected), stored(f.observed)
  local r = s:query(M.OPEN_SQL, class, source, f.subject, f.baseline_id or qtg.db.NULL,
    f.severity or "warning", f.expected or qtg.db.NULL, f.observed or qtg.db.NULL,
    canon.encode(f.detail or {}))[1]
  if not r then return nil end
  if r.inserted then
    notify.surface(s, { worker = source == "ccip" and "ccip_drift" or "verify_drift",
      kind = "registry_drift", dedupe_key = "registry_drift:" .. r.id, entity_type = "drift_findings",
      entity_id = r.id, severity = f.severity or "warning",
      data = { source = source, subject = f.subject, expected = f.expected, observed = f.observed,
               detail = f.detail } })
    return "opened"
  end
  return "changed"
end

-- resolve(s, class, source, subjects): resolve the open findings of these
-- subjects.  Returns the number resolved.
function M.resolve(s, class, source, subjects)
  if #subjects == 0 then return 0 end
  local _, n = s:query([[
    UPDATE drift_findings SET status = 'resolved', resolved_at = clock_timestamp()
     WHERE network_class = $1 AND source = $2 AND status = 'open'
       AND subject = ANY(ARRAY(SELECT jsonb_array_elements_text($3::jsonb)))]],
    class, source, canon.encode(canon.array(subjects)))
  return n or 0
end

-- resolve_except(s, class, source, keep): resolve every open finding of the
-- source whose subject is not in keep (the sidecar no longer reports it).
function M.resolve_except(s, class, source, keep)
  local _, n = s:query([[
    UPDATE drift_findings SET status = 'resolved', resolved_at = clock_timestamp()
     WHERE network_class = $1 AND source = $2 AND status = 'open'
       AND NOT (subject = ANY(ARRAY(SELECT jsonb_array_elements_text($3::jsonb))))]],
    class, source, canon.encode(canon.array(keep)))
  return n or 0
end

-- check(s, t): one drift_checks row.  t = {class, source, scope, ok,
-- checked, drifted, errors (array of text), started_at (epoch seconds)}.
-- The errors quote nodes and providers: each is stored as valid text.
function M.check(s, t)
  local errors = canon.array()
  for i, e in ipairs(t.errors or {}) do errors[i] = stored(e) end
  s:query([[
    INSERT INTO drift_checks (network_class, source, scope, ok, checked, drifted, errors, process_id, started_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, to_timestamp($9))]],
    t.class, t.source, t.scope, t.ok, t.checked or 0, t.drifted or 0,
    canon.encode(errors), require("qtg.heartbeats").process_id(), t.started_at)
end

-- recent(s, class, source, seconds): a check of this source finished less
-- than `seconds` ago (another process just ran the pass).
function M.recent(s, class, source, seconds)
  return s:query([[SELECT EXISTS (SELECT 1 FROM drift_checks WHERE network_class = $1 AND source = $2
                     AND finished_at > clock_timestamp() - make_interval(secs => $3)) AS r]],
    class, source, seconds)[1].r
end

-- pass(s, lock_sql, class, source, interval, fn) -> fn()'s count, or 0: one
-- pass of a drift worker in its own transaction.  Several processes run one
-- pass per interval between them: the pass is skipped (0) when another holds
-- the transaction-scoped advisory try-lock (lock_sql, $1 = class, column
-- `got`) or a check of this source finished less than half an interval ago.
function M.pass(s, lock_sql, class, source, interval, fn)
  return s:transaction(function()
    if not s:query(lock_sql, class)[1].got then return 0 end
    if M.recent(s, class, source, interval * 0.5) then return 0 end
    return fn()
  end)
end

-- findings(s[, status]) -> the latest 200 findings of this class (console).
function M.findings(s, status)
  return s:query([[SELECT id, source, subject, status, severity, expected, observed, first_seen_at, resolved_at
                     FROM drift_findings WHERE network_class = $1 AND ($2::text IS NULL OR status = $2)
                    ORDER BY id DESC LIMIT 200]], qtg.settings.network_class, status or qtg.db.NULL)
end

return M
