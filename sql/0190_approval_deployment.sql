-- 0190_approval_deployment.sql -- the approval statement names the
-- deployment (docs/approvals.md "Signed approvals").
--
-- An approver may serve two deployments with one key.  A statement that
-- named only the request would let whoever writes the rows of the second
-- deployment copy a request (its id included) and the signatures given
-- for it in the first, and have the second deployment's signer count them.
-- The enrolment file now names its deployment (`deployment NAME`,
-- required), and the statement, version 2, carries it on its second line:
--   qtg-approval-v2 / deployment NAME / request ID / class CLASS /
--   digest APPROVAL_DIGEST / plan PLAN_DIGEST
-- The daemon passes the name from the same file the signer reads
-- (lua/qtg/signed_approvals.lua); with no enrolment there is no name and
-- the statement is NULL: nothing here is signed by approvers.  Version 1
-- is not accepted anywhere any more.
DROP FUNCTION qtg_approval_statement(movement_requests);

CREATE FUNCTION qtg_approval_statement(r movement_requests, deployment text) RETURNS text
  LANGUAGE sql STABLE AS $$
  SELECT 'qtg-approval-v2' || E'\n'
      || 'deployment ' || deployment || E'\n'
      || 'request ' || r.id::text || E'\n'
      || 'class ' || r.network_class || E'\n'
      || 'digest ' || qtg_approval_digest(r) || E'\n'
      || 'plan ' || encode(sha256(convert_to(
                      qtg_approval_plan_document(r.plan_version_id)::text, 'UTF8')), 'hex')
      || E'\n'
$$;
