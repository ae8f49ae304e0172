-- qtg.audit_grants: transfers the signer signed whose bytes may still be
-- mined though the daemon's rows no longer carry them (`qtgd audit verify`,
-- docs/evm.md "Before a transfer is approved again").
--
-- signer_events is the signer's own log (only the signer inserts, nobody
-- updates or deletes): each grant names the node, chain, sender, nonce and
-- payload it signed.  The reservation rows and node states are the
-- runtime role's: a compromised daemon can have a transfer signed at a
-- nonce ahead of the chain, keep the bytes, release or delete its
-- reservation and report the transfer FAILED; when the chain reaches that
-- nonce the bytes can still be mined, and a new approval of the same
-- payment would pay twice.  This lists every grant that is neither
--   * settled: its node COMPLETED, or the reservation at its nonce
--     consumed (the chain used the nonce), or its bytes known dead (another
--     transaction took the nonce: bytes_dead_at), or a fill mined at its
--     nonce (evm_fills, which evm_nonce_reaper settles; counted only for
--     the payload of a fill signer_events shows granted there), nor
--   * in flight: its node SUBMITTING, SUBMITTED, OBSERVING or UNKNOWN and
--     the reservation at its nonce holding this very payload (signed or
--     broadcast).
-- Settled and in flight are read from the runtime's rows: a runtime that
-- also forges a reservation consumed, its bytes dead, or a fill it had
-- signed (and never sent) mined hides the grant here (it stays in
-- signer_events); only the chain says for sure.
-- A listed grant is not proof of an attack (a daemon killed between the
-- grant and its write leaves one, and a FAILED transfer's surfaced bytes
-- are listed until the reaper's verdict): it is a signed transaction to
-- look up on the chain before its payment is approved again, or to void
-- by filling its nonce (qtg.evm_fill): a fill signed at its nonce is
-- named with it, with what the reaper has seen of it (sent, taken,
-- dropped).  A fill's own grant is no transfer and is not listed.  Grants are read a page at
-- a time in id order, each page one statement.
--   in_flight(g)     the grant's transfer is live on its own bytes
--   check(s, limit) -> { ok=, checked=, open=, list={ {id=, request_id=,
--                       node_id=, node_state=, chain_id=, address=, nonce=,
--                       payload_hash=, granted_at=, held=} ... } }
local M = {}

M.PAGE = 1000

local GRANTS_SQL = [[
SELECT e.id, e.request_id::text AS request_id, e.request_node_id::text AS node_id, e.chain_id,
       e.signer_address AS address, e.nonce, e.payload_hash, e.created_at::text AS granted_at,
       n.node_state, r.status AS reservation, r.payload_hash = e.payload_hash AS same_payload,
       r.bytes_dead_at IS NOT NULL AS dead,
       (SELECT max(f.id) FROM signer_events f
         WHERE f.decision = 'granted' AND f.nonce = e.nonce AND f.chain_id = e.chain_id
           AND f.signer_address = e.signer_address AND f.code = 'FILL_GRANTED') AS filled_by,
       (SELECT string_agg(x.status, ', ' ORDER BY x.id) FROM evm_fills x
         WHERE x.chain_id = e.chain_id AND x.address = lower(e.signer_address) AND x.nonce = e.nonce) AS fills,
       EXISTS (SELECT 1 FROM evm_fills x
                 JOIN signer_events f ON f.decision = 'granted' AND f.code = 'FILL_GRANTED'
                                     AND f.chain_id = x.chain_id AND lower(f.signer_address) = x.address
                                     AND f.nonce = x.nonce AND f.payload_hash = x.payload_hash
                WHERE x.chain_id = e.chain_id AND x.address = lower(e.signer_address) AND x.nonce = e.nonce
                  AND x.status = 'mined') AS fill_mined
  FROM signer_events e
  LEFT JOIN movement_request_nodes n ON n.id = e.request_node_id
  LEFT JOIN evm_nonce_reservation r
         ON r.chain_id = e.chain_id AND r.address = lower(e.signer_address) AND r.nonce = e.nonce
 WHERE e.decision = 'granted' AND e.nonce IS NOT NULL AND e.request_id IS NOT NULL AND e.id > $1
 ORDER BY e.id
 LIMIT $2]]

local IN_FLIGHT = { SUBMITTING = true, SUBMITTED = true, OBSERVING = true, UNKNOWN = true }
local HOLDING = { signed = true, broadcast = true }

local function text(v) return type(v) == "string" and v or nil end

-- in_flight(g): grant g's transfer is submitted (or unknown) and its
-- reservation holds this very payload, signed or broadcast: a live
-- payment (g: node_state, reservation, same_payload).
function M.in_flight(g)
  return IN_FLIGHT[g.node_state] == true and HOLDING[g.reservation] == true and g.same_payload == true
end

-- Whether grant g needs no look: settled, or in flight on its own bytes.
local function accounted(g)
  if g.node_state == "COMPLETED" or g.reservation == "consumed" or g.dead == true then return true end
  -- a fill row mined, for the very payload of a fill the signer's own log shows granted
  if g.fill_mined == true then return true end
  return M.in_flight(g)
end

-- What the daemon's rows say of the grant's bytes, in a few words.
local function held(g)
  local r = text(g.reservation)
  local fill = ""
  if type(g.filled_by) == "number" then
    fill = string.format("; a fill was signed at that nonce (signer event %d)", g.filled_by)
      .. (text(g.fills) and string.format(", qtg's fills there are %s", g.fills) or "")
      .. ": see that it was mined"
  end
  if not r then return "no reservation row at that nonce" .. fill end
  if g.same_payload ~= true then
    return string.format("the reservation row at that nonce is %s, for another payload%s", r, fill)
  end
  return string.format("the reservation row at that nonce is %s%s", r, fill)
end

function M.check(s, limit)
  local report = { ok = true, checked = 0, open = 0, list = {} }
  local after = 0
  repeat
    local rows = s:query(GRANTS_SQL, after, M.PAGE)
    for _, g in ipairs(rows) do
      report.checked = report.checked + 1
      if not accounted(g) then
        report.ok, report.open = false, report.open + 1
        if #report.list < limit then
          report.list[#report.list + 1] = { id = g.id, request_id = text(g.request_id), node_id = text(g.node_id),
            node_state = text(g.node_state) or "(no node)", chain_id = g.chain_id, address = text(g.address),
            nonce = g.nonce, payload_hash = text(g.payload_hash), granted_at = text(g.granted_at), held = held(g) }
        end
      end
      after = g.id
    end
  until #rows < M.PAGE
  return report
end

return M
