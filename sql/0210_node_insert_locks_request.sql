-- 0210_node_insert_locks_request.sql -- a node's insert and a change of
-- its request's plan version wait for each other (docs/security.md,
-- section 6; an adversarial review, session 37).
--
-- sql/0203 checks an inserted node against its request's plan version and
-- sql/0209 refuses to change the plan version of a request that has
-- nodes.  Each reads the other's table, and the two writes took row locks
-- that do not conflict (the node's foreign key takes KEY SHARE on the
-- request, the plan change NO KEY UPDATE): two runtime sessions, one
-- inserting a node of plan version Z while the other moved the request
-- from Z to Y, each committed without seeing the other, in either order,
-- and left a request of Y holding a node of Z's step.  Now the node check
-- first locks the nodes' requests FOR SHARE, which conflicts with the plan
-- change's lock: whichever comes second waits for the first to commit,
-- then its check (a statement of its own, so a snapshot taken after the
-- wait at READ COMMITTED, which sql/0209 requires of both) sees it and
-- refuses (55000).  The engine inserts a request's nodes in the
-- transaction that inserted the request, so it waits for nobody.

CREATE OR REPLACE FUNCTION qtg_refuse_node_off_plan() RETURNS trigger
  LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  bad record;
BEGIN
  PERFORM 1 FROM movement_requests
    WHERE id IN (SELECT request_id FROM inserted_nodes)
    ORDER BY id FOR SHARE;
  SELECT n.request_id, n.plan_node_id, n.node_key, n.node_kind, n.action_type, n.executor,
         r.plan_version_id AS version, pn.plan_version_id AS step_version,
         pn.node_key AS step_key, pn.node_kind AS step_kind, pn.action_type AS step_action,
         pn.executor AS step_executor
    INTO bad
    FROM inserted_nodes n
    LEFT JOIN movement_requests r ON r.id = n.request_id
    LEFT JOIN plan_nodes pn ON pn.id = n.plan_node_id
   WHERE pn.plan_version_id IS DISTINCT FROM r.plan_version_id
      OR (n.node_key, n.node_kind, n.action_type, n.executor)
           IS DISTINCT FROM (pn.node_key, pn.node_kind, pn.action_type, pn.executor)
   LIMIT 1;
  IF NOT FOUND THEN RETURN NULL; END IF;
  IF bad.step_version IS DISTINCT FROM bad.version THEN
    RAISE EXCEPTION 'movement_request_nodes: plan node % is not a step of plan version % (request %)',
      bad.plan_node_id, bad.version, bad.request_id
      USING ERRCODE = '55000', TABLE = 'movement_request_nodes';
  END IF;
  RAISE EXCEPTION 'movement_request_nodes: a node of plan node % is (%, %, %, %), not (%, %, %, %)',
    bad.plan_node_id, bad.step_key, bad.step_kind, bad.step_action, bad.step_executor,
    bad.node_key, bad.node_kind, bad.action_type, bad.executor
    USING ERRCODE = '55000', TABLE = 'movement_request_nodes';
END $$;
