-- qtg.workers.ccip_drift (spec section 14; MG_CCIP_ENABLED and a CCIP
-- sidecar client, MG_CCIP_SIDECAR_URL; sidecar group): poll the CCIP
-- sidecar for registry drift and record its findings.
--
--   GET {MG_CCIP_SIDECAR_URL}/v1/registry/drift
--   200 {"checked_at": "...", "lanes_checked": n,
--        "findings": [{"subject", "lane", "field", "expected", "observed",
--                      "severity": "info|warning|critical"}...]}
--
-- Each reported subject gets an open finding (announced once to operators);
-- an open ccip finding the sidecar no longer reports is resolved.  A poll
-- that fails (unreachable, error status, timeout, garbage, a malformed
-- finding) is recorded as a drift_checks row with ok = false and changes no
-- finding.  Several processes: an advisory try-lock per class and a skip
-- when a ccip check finished less than half an interval ago.
local qtg = require("qtg")
local cjson = require("cjson.safe")
local canon = require("qtg.canon_json")
local drift = require("qtg.drift")

local M = {}

M.PATH = "/v1/registry/drift"
M.MAX_BODY = 4 * 1024 * 1024
M.LOCK_SQL = [[SELECT pg_try_advisory_xact_lock(hashtext('qtg.ccip_drift'), hashtext($1)) AS got]]

local json = cjson.new()
json.decode_invalid_numbers(false)
json.decode_max_depth(32)

local SEVERITIES = { info = true, warning = true, critical = true }

-- A provider's field as stored text: a string of at most max bytes (500)
-- that PostgreSQL takes (canon.text_ok); nil for anything else.
local function text(v, max)
  return type(v) == "string" and #v <= (max or 500) and canon.text_ok(v) and v or nil
end

-- lanes_checked goes to an int column: absent is 0, anything but a whole
-- number in [0, 2^31) is a malformed report.
local function lanes_checked(v)
  if v == nil or v == cjson.null then return 0 end
  if type(v) ~= "number" or v < 0 or v >= 2 ^ 31 or v % 1 ~= 0 then return nil end
  return v
end

-- poll(settings) -> array of findings, lanes_checked; or nil, reason.
function M.poll(settings)
  local base = settings.ccip_sidecar_url
  local resp, err = qtg.http.request{
    url = base:gsub("/+$", "") .. M.PATH, headers = { Accept = "application/json" },
    timeout = settings.provider_timeout_seconds, connect_timeout = math.min(5, settings.provider_timeout_seconds),
    max_body = M.MAX_BODY,
  }
  if not resp then return nil, string.format("ccip sidecar: %s: %s", err.kind, err.message) end
  if resp.status ~= 200 then
    return nil, string.format("ccip sidecar: HTTP %d: %s", resp.status, canon.excerpt(resp.body or "", 120))
  end
  local doc = canon.decode(resp.body or "", json)
  if type(doc) ~= "table" or type(doc.findings) ~= "table" then
    return nil, "ccip sidecar: answer is not a drift report: " .. canon.excerpt(resp.body or "", 120)
  end
  local out = {}
  for i, f in ipairs(doc.findings) do
    if type(f) ~= "table" or not text(f.subject, 300) or f.subject == "" then
      return nil, string.format("ccip sidecar: findings[%d] has no subject (text of at most 300 bytes)", i)
    end
    local sev = f.severity == nil and "warning" or f.severity
    if not SEVERITIES[sev] then return nil, string.format("ccip sidecar: findings[%d] has severity %s", i, tostring(sev)) end
    out[i] = { subject = "ccip:" .. f.subject, severity = sev, expected = text(f.expected),
               observed = text(f.observed),
               detail = { lane = text(f.lane, 200), field = text(f.field, 200) } }
  end
  local lanes = lanes_checked(doc.lanes_checked)
  if not lanes then
    return nil, "ccip sidecar: lanes_checked is not a whole number in [0, 2^31): "
      .. canon.excerpt(cjson.encode(doc.lanes_checked), 40)
  end
  return out, lanes
end

function M.tick(s)
  local settings = qtg.settings
  local class = settings.network_class
  local started = qtg.now()
  return drift.pass(s, M.LOCK_SQL, class, "ccip", settings.ccip_drift_poll_interval_seconds, function()
    local findings, lanes = M.poll(settings)
    if not findings then
      drift.check(s, { class = class, source = "ccip", scope = "sidecar", ok = false, errors = { lanes },
        started_at = started })
      qtg.log.warn("ccip_drift: poll failed", { worker = "ccip_drift", error = lanes })
      return 0
    end
    local keep = {}
    for _, f in ipairs(findings) do
      drift.open(s, class, "ccip", f)
      keep[#keep + 1] = f.subject
    end
    drift.resolve_except(s, class, "ccip", keep)
    drift.check(s, { class = class, source = "ccip", scope = "sidecar", ok = true, checked = lanes,
      drifted = #findings, started_at = started })
    return #findings
  end)
end

return M
