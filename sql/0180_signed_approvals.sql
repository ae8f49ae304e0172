-- 0180_signed_approvals.sql -- approvals signed by the people who give them
-- (docs/approvals.md "Signed approvals", docs/security.md section 6).
--
-- The daemon's role writes request_approvals, so a row alone cannot prove
-- to the signer that a person approved.  An approver signs the request's
-- approval statement with an Ed25519 key of their own (`qtgd approver`),
-- the signature is stored with the vote, and `qtgd signer` with
-- MG_SIGNER_APPROVERS counts only votes whose signature verifies for a
-- person enrolled in its own file (src/qtg_approvers.h).
--
-- The statement (one line each, "\n" after every line):
--   qtg-approval-v1 / request ID / class CLASS / digest APPROVAL_DIGEST /
--   plan PLAN_DIGEST
-- where PLAN_DIGEST is the hex SHA-256 of qtg_approval_plan_document: the
-- plan version's risk controls and its nodes (key, kind, action, executor,
-- config), which decide where a request's money goes.  The plan version is
-- sealed once a request references it (0170), so the statement of a
-- request does not change while it waits.  The signer computes the same
-- statement from the rows with built-ins only, as it does the digest.
ALTER TABLE request_approvals
  ADD COLUMN signature text CHECK (signature ~ '^[0-9a-f]{128}$');

CREATE FUNCTION qtg_approval_plan_document(plan_version bigint) RETURNS jsonb
  LANGUAGE sql STABLE AS $$
  SELECT jsonb_build_object(
    'risk_controls', pv.risk_controls,
    'nodes', COALESCE((SELECT jsonb_agg(jsonb_build_object(
                 'node_key', pn.node_key, 'node_kind', pn.node_kind,
                 'action_type', pn.action_type, 'executor', pn.executor,
                 'config', pn.config) ORDER BY pn.node_key)
               FROM plan_nodes pn WHERE pn.plan_version_id = pv.id), '[]'::jsonb))
  FROM plan_versions pv WHERE pv.id = plan_version
$$;

CREATE FUNCTION qtg_approval_statement(r movement_requests) RETURNS text
  LANGUAGE sql STABLE AS $$
  SELECT 'qtg-approval-v1' || E'\n'
      || 'request ' || r.id::text || E'\n'
      || 'class ' || r.network_class || E'\n'
      || 'digest ' || qtg_approval_digest(r) || E'\n'
      || 'plan ' || encode(sha256(convert_to(
                      qtg_approval_plan_document(r.plan_version_id)::text, 'UTF8')), 'hex')
      || E'\n'
$$;
