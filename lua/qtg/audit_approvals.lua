-- qtg.audit_approvals: did every request that went past its approval carry
-- the approvals an enrolment asks?  (`qtgd audit verify --approvers FILE`,
-- docs/security.md "The audit trail".)
--
-- The runtime role writes requests, votes and states: it can set a request
-- APPROVED by hand, with votes nobody signed.  `qtgd signer` then signs
-- nothing of it, but an executor that moves money with credentials the
-- daemon holds (an exchange's API key) never asks the signer.  This check
-- applies the signer's rule to every request past its approval, after the
-- fact, with an enrolment file the operator names (the signer's, not one
-- the daemon's uid can write):
--   * its approval digest is the one its columns give (qtg_approval_digest);
--   * no reject vote (for any digest, as the signer reads them);
--   * its network class is enrolled, and the signed approve votes for that
--     digest, counted as the signer counts them (qtg.signed_approvals.signed:
--     one per enrolled person whose signature of the request's approval
--     statement verifies, never the initiator's person), are at least the
--     larger of approvals_required and the enrolment's quorum for its class
--     and amount (its tiers);
--   * with `initiation signed`, its maker's signature of its initiation
--     statement verifies;
--   * every manual step it COMPLETED carries an attestation: the signature
--     of its attestation statement by an enrolled person, not its maker's
--     (the signer's STEP_NOT_ATTESTED, sql/0206).
-- A request is past its approval when it is APPROVED, EXECUTING,
-- WAITING_MANUAL_ACTION, COMPLETED, FAILED or MANUAL_INTERVENTION, has an
-- approved_at, or has a node that was
-- dispatched (attempt_no > 0): money may have moved for it.  Requests are
-- read a page at a time in id order, each page one statement.
--   check(s, e, limit) -> { ok=, checked=, short=, list={ {id=, state=,
--                           network_class=, problems={text...}}... } }
local cjson = require "cjson"
local signed = require "qtg.signed_approvals"
local approvals = require "qtg.approvals"

local M = {}

M.PAGE = 500

local PAST_APPROVAL_SQL = [[
SELECT r.id::text AS id, r.network_class, r.request_state, r.created_by, r.approvals_required,
       r.approval_digest IS NOT NULL AND r.approval_digest = qtg_approval_digest(r) AS digest_ok,
       qtg_approval_statement(r, $2) AS statement,
       CASE WHEN $4 THEN qtg_initiation_statement(r, $2) END AS initiation_statement,
       r.initiation_signature,
       upper(r.intent->>'asset') AS asset, r.intent->>'amount' AS amount,
       ]] .. approvals.PAYING_SQL:format("r.plan_version_id") .. [[ AS transfers,
       (SELECT coalesce(jsonb_agg(jsonb_build_object('principal', a.principal, 'decision', a.decision,
                                                     'signature', a.signature,
                                                     'this_digest', a.approval_digest = r.approval_digest)
                                  ORDER BY a.id), '[]')
          FROM request_approvals a WHERE a.request_id = r.id)::text AS votes,
       (SELECT coalesce(jsonb_agg(jsonb_build_object('step', n.node_key, 'by', n.attested_by,
                                                     'signature', n.attestation_signature,
                                                     'statement', qtg_attestation_statement(r, $2, n.node_key))
                                  ORDER BY n.node_key), '[]')
          FROM movement_request_nodes n JOIN plan_nodes pn ON pn.id = n.plan_node_id
         WHERE n.request_id = r.id AND n.node_state = 'COMPLETED'
           AND starts_with(pn.action_type, 'manual_'))::text AS attestations
  FROM movement_requests r
 WHERE r.id > $1::uuid
   AND (r.request_state IN ('APPROVED', 'EXECUTING', 'WAITING_MANUAL_ACTION', 'COMPLETED', 'FAILED',
                            'MANUAL_INTERVENTION')
        OR r.approved_at IS NOT NULL
        OR EXISTS (SELECT 1 FROM movement_request_nodes n WHERE n.request_id = r.id AND n.attempt_no > 0))
 ORDER BY r.id
 LIMIT $3]]

local function text(v) return type(v) == "string" and v or nil end

-- What is wrong with one request's approvals under enrolment e: a list of
-- sentences, empty when it holds.
local function problems_of(e, r)
  local out = {}
  if not r.digest_ok then
    out[#out + 1] = "its approval digest is not the one its columns give: no signature covers what it is"
  end
  local votes, approving = cjson.decode(r.votes), {}
  for _, v in ipairs(votes) do
    if v.decision == "reject" then
      out[#out + 1] = string.format("%s rejected it", tostring(v.principal))
    elseif v.decision == "approve" and v.this_digest == true then
      approving[#approving + 1] = { principal = v.principal, signature = text(v.signature) }
    end
  end
  local floor, why = e:quorum_for(r.network_class, text(r.asset), text(r.amount), math.min(r.transfers, 1000000))
  if floor == nil then
    out[#out + 1] = string.format("the enrolment asks nothing of it (%s): the signer signs nothing of it",
      tostring(why))
  else
    local need = math.max(floor, tonumber(r.approvals_required) or 0)
    local counted = #signed.signed(e, r.statement, r.created_by, approving)
    if counted < need then
      out[#out + 1] = string.format("%d signed approval%s of %d asked (%d approve vote%s recorded)",
        counted, counted == 1 and "" or "s", need, #approving, #approving == 1 and "" or "s")
    end
  end
  if e:initiation_signed() and not (text(r.initiation_signature)
      and e:verify_initiation(r.created_by, r.initiation_statement, r.initiation_signature)) then
    out[#out + 1] = string.format("its maker %s did not sign its initiation", tostring(r.created_by))
  end
  local maker = e:person(r.created_by)
  for _, a in ipairs(cjson.decode(r.attestations)) do
    local by, person = text(a.by), text(a.by) and e:person(a.by)
    local why
    if not by or not text(a.signature) then
      why = "was completed without a person's attestation"
    elseif not person then
      why = string.format("was attested by %s, who is no enrolled person", by)
    elseif person == maker then
      why = string.format("was attested by %s, who made the request", by)
    elseif not e:verify(by, a.statement, a.signature) then
      why = string.format("carries an attestation %s did not sign", by)
    end
    if why then out[#out + 1] = string.format("manual step %s %s", tostring(a.step), why) end
  end
  return out
end

function M.check(s, e, limit)
  local report = { ok = true, checked = 0, short = 0, list = {} }
  local after = "00000000-0000-0000-0000-000000000000"
  repeat
    local rows = s:query(PAST_APPROVAL_SQL, after, e:deployment(), M.PAGE, e:initiation_signed())
    for _, r in ipairs(rows) do
      report.checked = report.checked + 1
      local problems = problems_of(e, r)
      if #problems > 0 then
        report.ok, report.short = false, report.short + 1
        if #report.list < limit then
          report.list[#report.list + 1] = { id = r.id, state = r.request_state,
                                            network_class = r.network_class, problems = problems }
        end
      end
      after = r.id
    end
  until #rows < M.PAGE
  return report
end

return M
