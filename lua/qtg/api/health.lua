-- qtg.api.health: /readyz's checks, one small function each (M.CHECKS), so
-- a new dependency adds a row.  Each returns status ("ok", "failing",
-- "not_configured") and a detail; the route answers 200 when none fails.
-- Details go out through qtg.redact (a URL keeps only its endpoint).
--
-- The signer check asks `qtgd signer` for its keys over the configured
-- socket (MG_SIGNER_SOCKET; unset: not_configured, which is not a failure).
local qtg = require "qtg"
local canon = require "qtg.canon_json"
local redact = require "qtg.redact"

local M = {}

M.MIGRATIONS_CACHE_SECONDS = 10
local migrations_cache -- {at=, status=, detail=}

-- A server that answers but is read-only (a fenced old primary, a standby
-- MG_DATABASE_URL led to) takes no work: not ready.
local function database(s)
  local r = s:query([[SELECT pg_is_in_recovery() AS standby,
                             current_setting('transaction_read_only') = 'on' AS read_only]])[1]
  if r.standby then return "failing", "reachable, but a standby (in recovery): it takes no writes" end
  if r.read_only then return "failing", "reachable, but read-only (default_transaction_read_only): it takes no writes" end
  return "ok", "reachable"
end

local function migrations(s)
  local now = qtg.monotonic()
  if migrations_cache and now - migrations_cache.at < M.MIGRATIONS_CACHE_SECONDS then
    return migrations_cache.status, migrations_cache.detail
  end
  local migrate = require "qtg.cli.migrate"
  local pending, changed = migrate.pending(s, migrate.dir())
  local status, detail = "ok", "current"
  if #pending > 0 then status, detail = "failing", "pending: " .. table.concat(pending, ", ")
  elseif #changed > 0 then status, detail = "failing", "edited after applying: " .. table.concat(changed, ", ") end
  migrations_cache = { at = now, status = status, detail = detail }
  return status, detail
end

local function core_workers()
  local bad = {}
  local n = 0
  for _, w in ipairs(qtg.runtime.workers()) do
    if w.group == "core" then
      n = n + 1
      if w.state == "dead" or w.state == "stopped" then bad[#bad + 1] = w.name .. " " .. w.state end
    end
  end
  if n == 0 then return "failing", "no core worker runs in this process" end
  if #bad > 0 then return "failing", table.concat(bad, ", ") end
  return "ok", n .. " core workers running"
end

-- Reachable: it answers within MG_SIGNER_TIMEOUT_SECONDS (a signer that
-- is down leaves EVM nodes READY rather than failing them, so this is where
-- an operator learns of it); and it counts approvals as this daemon asks
-- them: both read the same enrolment (its SHA-256), or neither has one.
-- A signer still counting a person this daemon's file revoked (one of the
-- two reloaded), or counting unsigned rows while this daemon asks for
-- signatures, fails the check.
local function approvals_disagree(mine, theirs)
  if theirs.mode == "enrolled" and mine and theirs.digest == mine:digest() then return nil end
  if theirs.mode ~= "enrolled" and not mine then return nil end
  local function say(who, e, mode)
    if e then return ("%s reads the enrolment of deployment %s (sha256 %s)"):format(who, e.deployment, e.digest:sub(1, 12)) end
    return ("%s has no enrolment%s"):format(who, mode == "trusting-rows" and " and counts the approval rows as written" or "")
  end
  return ("%s, %s: give both the same MG_SIGNER_APPROVERS file, then `systemctl reload qtg-signer qtgd`"):format(
    say("the signer", theirs.mode == "enrolled" and theirs, theirs.mode),
    say("this daemon", mine and { deployment = mine:deployment(), digest = mine:digest() }))
end

local function signer()
  local socket = qtg.settings.signer_socket
  if socket == nil or socket == "" then
    return "not_configured", "MG_SIGNER_SOCKET is not set, so readiness asks no signer (a signature, if one is "
      .. "asked for, goes to the default socket under the run directory); set it where this daemon signs"
  end
  -- an unreachable signer's message names the socket already; a refusal
  -- is the signer's own words
  local function why(e)
    if e.kind == "signer_unavailable" then return tostring(e.message) end
    return ("the signer at %s: %s"):format(socket, tostring(e.message))
  end
  local keys, err = qtg.signer.keys()
  if err then return "failing", why(err) end
  local theirs, aerr = qtg.signer.approvals()
  if not theirs then return "failing", why(aerr) end
  local ok, mine = pcall(require("qtg.signed_approvals").enrolment)
  if not ok then return "failing", tostring(type(mine) == "table" and mine.message or mine) end
  local why = approvals_disagree(mine, theirs)
  if why then return "failing", why end
  local how = theirs.mode == "enrolled" and ("the enrolment of deployment %s"):format(theirs.deployment)
    or theirs.mode == "trusting-rows" and "approval rows as written (MG_SIGNER_TRUST_APPROVAL_ROWS)" or "nothing (no key)"
  return "ok", ("answers at %s with %d key%s, counting %s"):format(socket, #keys, #keys == 1 and "" or "s", how)
end

M.CHECKS = {
  { name = "database", fn = database },
  { name = "migrations", fn = migrations },
  { name = "core_workers", fn = core_workers },
  { name = "signer", fn = signer },
}

function M.readyz(s)
  local checks, ready = canon.array(), true
  for _, c in ipairs(M.CHECKS) do
    local ok, status, detail = pcall(c.fn, s)
    if not ok then status, detail = "failing", tostring(type(status) == "table" and status.message or status) end
    if status == "failing" then ready = false end
    checks[#checks + 1] = { name = c.name, status = status, detail = redact.text(detail) }
  end
  return ready and 200 or 503, { ready = ready, checks = checks }
end

return M
