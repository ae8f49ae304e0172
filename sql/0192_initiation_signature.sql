-- 0192_initiation_signature.sql -- the maker of a request signs it
-- (docs/approvals.md "Signed approvals", "The maker's signature").
--
-- created_by is a column the daemon's role writes, so "the initiator never
-- approves" held against the daemon's code only: whoever writes the rows
-- could name another maker and approve his own request.  With `initiation
-- signed` in the enrolment, the maker (an enrolled person, or an enrolled
-- initiator: a client system's key) signs the request's initiation
-- statement, the approval statement's facts under another first line:
--   qtg-initiation-v1 / deployment NAME / request ID / class CLASS /
--   digest APPROVAL_DIGEST / plan PLAN_DIGEST
-- and the signer signs only for a request whose created_by belongs to the
-- key that signed it.  The two statements share their facts
-- (qtg_statement_facts); a signature of one is never one of the other.
ALTER TABLE movement_requests
  ADD COLUMN initiation_signature text CHECK (initiation_signature ~ '^[0-9a-f]{128}$');

CREATE FUNCTION qtg_statement_facts(r movement_requests, deployment text) RETURNS text
  LANGUAGE sql STABLE AS $$
  SELECT 'deployment ' || deployment || E'\n'
      || 'request ' || r.id::text || E'\n'
      || 'class ' || r.network_class || E'\n'
      || 'digest ' || qtg_approval_digest(r) || E'\n'
      || 'plan ' || encode(sha256(convert_to(
                      qtg_approval_plan_document(r.plan_version_id)::text, 'UTF8')), 'hex')
      || E'\n'
$$;

CREATE OR REPLACE FUNCTION qtg_approval_statement(r movement_requests, deployment text) RETURNS text
  LANGUAGE sql STABLE AS $$
  SELECT 'qtg-approval-v2' || E'\n' || qtg_statement_facts(r, deployment)
$$;

CREATE FUNCTION qtg_initiation_statement(r movement_requests, deployment text) RETURNS text
  LANGUAGE sql STABLE AS $$
  SELECT 'qtg-initiation-v1' || E'\n' || qtg_statement_facts(r, deployment)
$$;
