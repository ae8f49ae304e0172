-- qtg.signers: the signer roster (signer_roster, sql/0012) and the identity
-- posture derived when it is read (spec section 6).
--
-- Two addresses per signer key, two writers, never crossed:
--   expected_signer_address: set_expected_identity (the console's
--     enrollment, audited) is its only writer;
--   observed_signer_address: record_observations, called only by the
--     executor_health worker, is its only writer.  It stores a valid nonzero
--     health().signer_address in lowercase, refuses anything else (the
--     observation is then cleared: no evidence is better than bad evidence),
--     and clears it when the signer is no longer loaded in the runtime (the
--     row is then an orphan).
-- Posture, first rule that applies:
--   orphan      the row's signer is not loaded in the runtime
--   unobserved  no valid observation (health() absent, failing, or refused)
--   unenrolled  observed, but no expected identity was ever set
--   match       observed == expected
--   mismatch    observed ~= expected
-- This is registry evidence only: nothing here blocks signing (spec: movement-
-- time enforcement is a separate follow-up).
local qtg = require("qtg")
local canon = require("qtg.canon_json")

local M = {}

M.ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"
M.POSTURES = { "match", "mismatch", "unobserved", "unenrolled", "orphan" }

-- Canonical lowercase form of an EVM address, or nil + reason.
function M.canonical_address(addr)
  if type(addr) ~= "string" then return nil, "signer address is missing" end
  if not addr:match("^0[xX]%x+$") or #addr ~= 42 then
    return nil, "signer address is not 0x followed by 40 hex digits"
  end
  local lower = "0x" .. addr:sub(3):lower()
  if lower == M.ZERO_ADDRESS then return nil, "zero signer address refused" end
  return lower
end

function M.posture(row)
  if not row.runtime_present then return "orphan" end
  local observed, expected = row.observed_signer_address, row.expected_signer_address
  if observed == nil or observed == qtg.db.NULL then return "unobserved" end
  if expected == nil or expected == qtg.db.NULL then return "unenrolled" end
  return observed == expected and "match" or "mismatch"
end

-- The roster of a network class (default: this process's), each row with
-- its derived `posture`, ordered by signer key.
function M.roster(s, network_class)
  local rows = s:query([[
    SELECT * FROM signer_roster WHERE network_class = $1 ORDER BY signer_key]],
    network_class or qtg.settings.network_class)
  for _, row in ipairs(rows) do row.posture = M.posture(row) end
  return rows
end

-- Console: enroll the address a signer key is expected to have, for
-- network_class (default: this process's).  The row is created when the key
-- was never seen (it is an orphan until a process loads the key).  Audited
-- in the same transaction.  Returns the row with posture.
function M.set_expected_identity(s, signer_key, address, actor, network_class)
  if type(signer_key) ~= "string" or not signer_key:match("^[A-Za-z0-9_.-]+$") or #signer_key > 64 then
    error("signers.set_expected_identity: signer key must be 1-64 of [A-Za-z0-9_.-], got "
      .. tostring(signer_key), 2)
  end
  local expected, why = M.canonical_address(address)
  if not expected then error("signers.set_expected_identity: " .. why, 2) end
  if type(actor) ~= "string" or actor == "" then
    error("signers.set_expected_identity: actor (who enrolls) is required", 2)
  end
  local class = network_class or qtg.settings.network_class
  if type(class) ~= "string" or class == "" then
    error("signers.set_expected_identity: network class must be a non-empty string", 2)
  end
  local outbox = require("qtg.outbox")
  local res = s:transaction(function()
    local before = s:query([[SELECT expected_signer_address FROM signer_roster
                              WHERE network_class = $1 AND signer_key = $2 FOR UPDATE]],
      class, signer_key)[1]
    local row = s:query([[
      INSERT INTO signer_roster AS r (network_class, signer_key, expected_signer_address,
                                      expected_set_by, expected_set_at)
      VALUES ($1, $2, $3, $4, clock_timestamp())
      ON CONFLICT (network_class, signer_key) DO UPDATE
         SET expected_signer_address = EXCLUDED.expected_signer_address,
             expected_set_by = EXCLUDED.expected_set_by,
             expected_set_at = EXCLUDED.expected_set_at,
             updated_at = clock_timestamp()
      RETURNING *]], class, signer_key, expected, actor)[1]
    local previous = before and before.expected_signer_address or qtg.db.NULL
    outbox.audit(s, actor, "signer.expected_identity.set", "signer", class .. "/" .. signer_key,
      nil, { network_class = class, signer_key = signer_key, expected_signer_address = expected,
             previous_expected_signer_address = previous })
    return row
  end)
  res.posture = M.posture(res)
  return res
end

M.OBSERVE_SQL = [[
INSERT INTO signer_roster AS r (network_class, signer_key, observed_signer_address,
                                runtime_present, observed_at)
SELECT $1, o.signer_key, o.observed, true, clock_timestamp()
  FROM jsonb_to_recordset($2::jsonb) AS o(signer_key text, observed text)
ON CONFLICT (network_class, signer_key) DO UPDATE
   SET observed_signer_address = EXCLUDED.observed_signer_address,
       runtime_present = true,
       observed_at = EXCLUDED.observed_at,
       updated_at = clock_timestamp()]]

M.ORPHAN_SQL = [[
UPDATE signer_roster
   SET runtime_present = false, observed_signer_address = NULL, updated_at = clock_timestamp()
 WHERE network_class = $1
   AND NOT (signer_key = ANY (string_to_array($2, ',')))
   AND (runtime_present OR observed_signer_address IS NOT NULL)]]

-- executor_health only.  observations: array of {signer_key=, observed=
-- canonical address or nil}, one per signer loaded in this runtime; every
-- other row of the class becomes an orphan with its observation cleared.
-- Returns the number of rows orphaned by this call.
function M.record_observations(s, observations)
  local class = qtg.settings.network_class
  local names = {}
  for i, o in ipairs(observations) do
    if o.observed ~= nil and o.observed ~= qtg.db.NULL and M.canonical_address(o.observed) ~= o.observed then
      error("signers.record_observations: " .. tostring(o.observed)
        .. " is not a canonical nonzero address", 2)
    end
    names[i] = o.signer_key
  end
  if #observations > 0 then
    local list = {}
    for i, o in ipairs(observations) do
      list[i] = { signer_key = o.signer_key, observed = o.observed or qtg.db.NULL }
    end
    s:query(M.OBSERVE_SQL, class, canon.encode(list))
  end
  local _, orphaned = s:query(M.ORPHAN_SQL, class, table.concat(names, ","))
  return orphaned or 0
end

return M
