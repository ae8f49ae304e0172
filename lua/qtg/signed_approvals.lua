-- qtg.signed_approvals: approvals signed by the people who give them
-- (docs/approvals.md "Signed approvals").
--
-- With MG_SIGNER_APPROVERS set (the signer's enrolment file, readable by
-- the daemon too), a vote counts only when it carries the Ed25519
-- signature of the request's approval statement (sql/0180) by the
-- enrolled person its principal belongs to; each person counts once, the
-- initiator's person never, and a request needs at least the enrolment's
-- quorum for its network class.  `qtgd signer` applies the same rule to
-- the same file and decides; this copy refuses early a vote that would
-- not count and waits for the quorum the signer will ask.
--   enrolment()                     -> the enrolment, or nil when unset
--   deployment()                    -> the enrolment's deployment name, or nil
--   statement(s, id)                -> the request's approval statement (nil: no enrolment)
--   check_signature(sig)            -> sig, or raises invalid_input
--   check_vote(s, req, actor, sig)  -> raises unless the vote will count
--   floor(s, req)                   -> the approvals the signer will ask of req at
--                                      least: the enrolment's quorum for its class,
--                                      raised by the tiers for its asset and amount
--   count(s, req, votes)            -> the votes that count (one per person)
--   signed(e, statement, created_by, votes) -> the same, of enrolment e and a
--                                      statement already read (qtgd audit verify)
--   same_person(a, b)               -> true when two principals are one enrolled person
--   initiation_required()           -> true when the enrolment says 'initiation signed'
--   initiation_statement(s, id)     -> what the request's maker signs (nil: not required)
--   check_maker(actor)              -> raises unless actor may make requests here
--   check_initiation(s, req, actor, sig) -> raises unless sig is the maker's
--   initiated(s, req[, statement])  -> true when the stored maker's signature verifies
--                                      (statement: its initiation statement, if read already)
--   attestation_statement(s, id, step) -> what the person completing manual step
--                                      `step` (its node key) signs (nil: no enrolment)
--   check_attestation(s, req, step, actor, sig) -> true when the attestation is to be
--                                      stored (an enrolment is set and sig is actor's),
--                                      nil without an enrolment; raises otherwise
-- With 'initiation signed' the maker of each request (an enrolled person,
-- or an enrolled initiator: a client system's key) signs its initiation
-- statement before anyone may approve it, and the signer signs nothing of
-- a request whose maker did not: created_by, which the daemon's role
-- writes, is then backed by a key (sql/0192).
local qtg = require "qtg"
local errors = require "qtg.errors"

local M = {}

local loaded = { path = nil, enrolment = nil }

function M.enrolment()
  local path = qtg.settings.signer_approvers
  if type(path) ~= "string" or path == "" then return nil end
  if loaded.path ~= path then
    local e, err = qtg.approvers.load(path)
    if not e then errors.raise("unavailable", "signed approvals: %s", err) end
    loaded.path, loaded.enrolment = path, e
  end
  return loaded.enrolment
end


-- The deployment every statement names (the enrolment's), or nil: with no
-- enrolment nothing is signed by approvers, and there is no statement.
function M.deployment()
  local e = M.enrolment()
  return e and e:deployment() or nil
end

function M.statement(s, id)
  local deployment = M.deployment()
  if not deployment then return nil end
  return s:query("SELECT qtg_approval_statement(r, $2) AS t FROM movement_requests r WHERE id = $1::uuid",
    id, deployment)[1].t
end

function M.initiation_required()
  local e = M.enrolment()
  return e ~= nil and e:initiation_signed()
end

function M.initiation_statement(s, id)
  if not M.initiation_required() then return nil end
  return s:query("SELECT qtg_initiation_statement(r, $2) AS t FROM movement_requests r WHERE id = $1::uuid",
    id, M.deployment())[1].t
end

function M.check_maker(actor)
  local e = M.enrolment()
  if e and e:initiation_signed() and not e:initiator(actor) then
    errors.raise("forbidden", "%s is not enrolled as a person or an initiator (MG_SIGNER_APPROVERS: "
      .. "initiation signed): the requests it makes could never be signed for", actor)
  end
end

function M.check_initiation(s, req, actor, sig)
  local e = M.enrolment()
  if not (e and e:initiation_signed()) then
    errors.raise("illegal_transition", "request %s needs no initiation (MG_SIGNER_APPROVERS does not say "
      .. "'initiation signed')", req.id)
  end
  if actor ~= req.created_by then
    errors.raise("forbidden", "%s did not make request %s: only its maker %s signs its initiation",
      actor, req.id, tostring(req.created_by))
  end
  if sig == nil or not e:verify_initiation(actor, M.initiation_statement(s, req.id), sig) then
    errors.raise("forbidden", "%s: the initiation needs %s's signature of request %s's initiation statement "
      .. "(initiation_statement; qtgd approver sign)", actor, tostring(e:initiator(actor)), req.id)
  end
end

function M.initiated(s, req, statement)
  local e = M.enrolment()
  if not (e and e:initiation_signed()) then return true end
  local sig = req.initiation_signature
  return type(sig) == "string"
    and e:verify_initiation(req.created_by, statement or M.initiation_statement(s, req.id), sig)
end

-- With an enrolment, a manual step's completion is signed too: the
-- signer signs a transfer only when every manual step before it in the
-- plan carries a person's attestation (sql/0206, STEP_NOT_ATTESTED).
function M.attestation_statement(s, id, step)
  local deployment = M.deployment()
  if not deployment then return nil end
  return s:query("SELECT qtg_attestation_statement(r, $2, $3) AS t FROM movement_requests r WHERE id = $1::uuid",
    id, deployment, step)[1].t
end

function M.check_attestation(s, req, step, actor, sig)
  local e = M.enrolment()
  if not e then return nil end
  local person = e:person(actor)
  if not person then
    errors.raise("forbidden", "%s is not enrolled as a person (MG_SIGNER_APPROVERS): under signed approvals "
      .. "a manual step is completed by a person who signs its attestation", actor)
  end
  if sig == nil or not e:verify(actor, M.attestation_statement(s, req.id, step), sig) then
    errors.raise("forbidden", "%s: completing manual step %s needs %s's signature of its attestation statement "
      .. "(manual.attestation_statement; qtgd approver sign --kind attestation --step %s)", actor, step, person, step)
  end
  return true
end

function M.check_signature(sig)
  if sig == nil then return nil end
  if type(sig) ~= "string" or #sig ~= 128 or not sig:match("^[0-9a-f]+$") then
    errors.raise("invalid_input", "signature must be 128 lowercase hex digits (qtgd approver sign)")
  end
  return sig
end

-- The intent's asset and amount as the signer reads them (upper(intent->>
-- 'asset'), intent->>'amount'): of the stored row, or of req.intent_json
-- (the text a new request's row will hold).
-- The plan's nodes the signer signs a transfer of the intent's amount for,
-- as qtgd signer counts them (src/qtg_signerd.c).
local TRANSFERS = require("qtg.approvals").PAYING_SQL

-- The intent's asset and amount (text, nil when absent) and the plan's
-- transfers: at creation from req.intent_json and req.plan_version_id,
-- later from the request's row.
local function intent_facts(s, req)
  local row
  if req.intent_json then
    row = s:query("SELECT upper($1::jsonb->>'asset') AS asset, $1::jsonb->>'amount' AS amount, "
      .. TRANSFERS:format("$2::bigint") .. " AS transfers", req.intent_json, req.plan_version_id)[1]
  else
    row = s:query("SELECT upper(r.intent->>'asset') AS asset, r.intent->>'amount' AS amount, "
      .. TRANSFERS:format("r.plan_version_id") .. " AS transfers FROM movement_requests r WHERE r.id = $1::uuid",
      req.id)[1]
  end
  if not row then return nil, nil, 1 end
  return type(row.asset) == "string" and row.asset or nil, type(row.amount) == "string" and row.amount or nil,
    math.min(row.transfers, 1000000)
end

-- floor(s, req): req = { id=, network_class= [, intent_json=,
-- plan_version_id=] }; the count qtgd signer asks (qtg_approvers_quorum_for,
-- one rule for both: the tiers judge the intent's amount times the plan's
-- transfers), and why.
function M.floor(s, req)
  local e = M.enrolment()
  if not e then return 0 end
  if e:quorum(req.network_class) == nil then
    errors.raise("forbidden", "request %s: MG_SIGNER_APPROVERS names no quorum for network class %s: "
      .. "the signer signs nothing of it", req.id, tostring(req.network_class))
  end
  local n, why = e:quorum_for(req.network_class, intent_facts(s, req))
  if n == nil then
    errors.raise("forbidden", "request %s: %s: the signer signs nothing of it", req.id, why)
  end
  return n, why
end

function M.check_vote(s, req, actor, sig)
  local e = M.enrolment()
  if not e then return end
  local person = e:person(actor)
  if not person then
    errors.raise("forbidden", "%s is not enrolled as an approver (MG_SIGNER_APPROVERS): its vote "
      .. "would not count", actor)
  end
  if person == e:person(req.created_by) then
    errors.raise("forbidden", "%s is %s, who created request %s (four eyes)", actor, person, req.id)
  end
  if sig == nil or not e:verify(actor, M.statement(s, req.id), sig) then
    errors.raise("forbidden", "%s: the vote needs %s's signature of request %s's approval statement "
      .. "(approval_statement; qtgd approver sign)", actor, person, req.id)
  end
end

function M.same_person(a, b)
  local e = M.enrolment()
  local person = e and e:person(a)
  return person ~= nil and person == e:person(b)
end

-- signed(e, statement, created_by, votes) -> the votes of enrolment e that
-- count, as qtgd signer counts them: the first whose signature of the
-- statement verifies of each enrolled person, never the person of
-- created_by.  votes: rows {principal=, signature=, ...}.
function M.signed(e, statement, created_by, votes)
  local seen, list = {}, {}
  local initiator = e:person(created_by)
  if initiator then seen[initiator] = true end
  for _, v in ipairs(votes) do
    local person = e:person(v.principal)
    local sig = v.signature
    if person and not seen[person] and type(sig) == "string" and e:verify(v.principal, statement, sig) then
      seen[person] = true
      list[#list + 1] = v
    end
  end
  return list
end

-- votes: rows {principal=, signature=, ...} already judged for the digest
-- and the roles; keep the first that verifies of each enrolled person.
function M.count(s, req, votes)
  local e = M.enrolment()
  if not e then return votes end
  return M.signed(e, M.statement(s, req.id), req.created_by, votes)
end

return M
