-- 0205_plan_document_order.sql -- the plan document approvers sign says
-- in which order the steps run (docs/approvals.md "Signed approvals").
--
-- The plan document (0180) listed the plan's nodes and risk controls but
-- not its edges: two plans that differ only by a manual gate before a
-- transfer read the same to an approver, and hash the same.  Each node now
-- carries "after", the keys of the steps right before it (its incoming
-- plan_edges, sorted), so the plan digest covers the order and the
-- approver's tool can show it.  The statements change version with the
-- meaning of their plan line:
--   qtg-approval-v3   / deployment / request / class / digest / plan
--   qtg-initiation-v2 / the same facts
-- A signature of a version 2 approval statement (or a version 1
-- initiation statement) counts nowhere any more: version 2 came with
-- signed approvals in the same unreleased 0.2.0, and a vote given under it
-- on a development database no longer counts (fail closed; re-sign).
-- The signer computes the same document from the rows with built-ins only
-- (src/qtg_signerd.c).
CREATE OR REPLACE FUNCTION qtg_approval_plan_document(plan_version bigint) RETURNS jsonb
  LANGUAGE sql STABLE AS $$
  SELECT jsonb_build_object(
    'risk_controls', pv.risk_controls,
    'nodes', COALESCE((SELECT jsonb_agg(jsonb_build_object(
                 'node_key', pn.node_key, 'node_kind', pn.node_kind,
                 'action_type', pn.action_type, 'executor', pn.executor,
                 'config', pn.config,
                 'after', COALESCE((SELECT jsonb_agg(pf.node_key ORDER BY pf.node_key)
                                      FROM plan_edges e JOIN plan_nodes pf ON pf.id = e.from_node_id
                                     WHERE e.to_node_id = pn.id), '[]'::jsonb))
                 ORDER BY pn.node_key)
               FROM plan_nodes pn WHERE pn.plan_version_id = pv.id), '[]'::jsonb))
  FROM plan_versions pv WHERE pv.id = plan_version
$$;

CREATE OR REPLACE FUNCTION qtg_approval_statement(r movement_requests, deployment text) RETURNS text
  LANGUAGE sql STABLE AS $$
  SELECT 'qtg-approval-v3' || E'\n' || qtg_statement_facts(r, deployment)
$$;

CREATE OR REPLACE FUNCTION qtg_initiation_statement(r movement_requests, deployment text) RETURNS text
  LANGUAGE sql STABLE AS $$
  SELECT 'qtg-initiation-v2' || E'\n' || qtg_statement_facts(r, deployment)
$$;
