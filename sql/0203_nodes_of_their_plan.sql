-- 0203_nodes_of_their_plan.sql -- a request's node is a step of its own
-- sealed plan, and the runtime role deletes neither requests nor nodes
-- (docs/security.md, "The audit trail" and "The signer").
--
-- The runtime role (qtg_runtime) could DELETE a request's node and INSERT
-- another in its place naming a step of ANOTHER plan version (any
-- plan_node_id), or a row whose executor and action differ from its plan
-- node's: the dispatcher ran what the row said, and the state check of
-- `qtgd audit verify` could not tell (the node's row came and went with no
-- audit row of its own).  Now:
--   * every node inserted names a plan node of its request's plan version,
--     and carries that plan node's node_key, node_kind, action_type and
--     executor (55000 otherwise); with UNIQUE (request_id, node_key), a
--     request has at most one node per step of its plan, and identity
--     columns never change after insert (0170);
--   * qtg_runtime has no DELETE on movement_requests nor on
--     movement_request_nodes (the engine never deletes either; retention is
--     the owner's work).
-- The table privileges move to qtg_runtime_privileges(table), so a later
-- change of them replaces that one small function, not qtg_grant_roles.

-- One check per INSERT statement, over the rows it inserted (a transition
-- table): the engine inserts a request's nodes in one statement, and a
-- per-row trigger doubled the cost of a node's insert.
CREATE FUNCTION qtg_refuse_node_off_plan() RETURNS trigger
  LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
DECLARE
  bad record;
BEGIN
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
CREATE TRIGGER movement_request_nodes_of_plan AFTER INSERT ON movement_request_nodes
  REFERENCING NEW TABLE AS inserted_nodes
  FOR EACH STATEMENT EXECUTE FUNCTION qtg_refuse_node_off_plan();

-- qtg_runtime_privileges(table) -> the privileges qtg_runtime has on it
-- ('' none).  Columns named where the privilege is on some columns only.
CREATE FUNCTION qtg_runtime_privileges(t text) RETURNS text
  LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, public, pg_temp AS $$
  SELECT CASE
    WHEN t IN ('audit_promoter_turn') THEN ''
    WHEN t IN ('audit_events', 'audit_chain_heads', 'schema_migrations', 'signer_events',
               'request_states', 'request_state_transitions',
               'node_states', 'node_state_transitions', 'evm_nonce_transitions') THEN 'SELECT'
    -- its content only: the id and the time are the database's
    WHEN t = 'audit_outbox' THEN
      'SELECT, INSERT (actor, action, entity_type, entity_id, request_id, detail)'
    WHEN t IN ('movement_requests', 'movement_request_nodes') THEN 'SELECT, INSERT, UPDATE'
    ELSE 'SELECT, INSERT, UPDATE, DELETE'
  END
$$;

CREATE OR REPLACE FUNCTION qtg_grant_roles() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  me pg_roles;
  t text;
  f regprocedure;
  privileges text;
  pinned text := 'search_path=pg_catalog, public, pg_temp';
BEGIN
  -- the search paths first: they need no role (0201)
  FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
             JOIN pg_namespace n ON n.oid = p.pronamespace
             JOIN pg_language l ON l.oid = p.prolang
            WHERE n.nspname = 'public' AND p.prokind = 'f'
              AND (l.lanname = 'plpgsql'
                   OR (l.lanname = 'sql' AND p.provolatile <> 'i'
                       AND p.proname NOT IN ('qtg_audit_row_text', 'qtg_wake_payload')))
              AND pg_has_role(current_user, p.proowner, 'USAGE')
              AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_proc'::regclass
                                 AND d.objid = p.oid AND d.deptype = 'e')
              AND NOT (pinned = ANY (coalesce(p.proconfig, '{}'))) LOOP
    EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, public, pg_temp', f);
  END LOOP;
  BEGIN
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
  EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE '% may not revoke TEMPORARY on database % from PUBLIC: an administrator should',
      current_user, current_database();
  END;
  SELECT * INTO me FROM pg_roles WHERE rolname = current_user;
  IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'qtg_runtime') THEN
    IF NOT (me.rolsuper OR me.rolcreaterole) THEN
      RAISE NOTICE 'qtg_runtime does not exist and % may not create roles: skipped', current_user;
      RETURN 'skipped: ' || current_user || ' may not create roles';
    END IF;
    CREATE ROLE qtg_runtime NOLOGIN;
  END IF;
  EXECUTE 'GRANT USAGE ON SCHEMA public TO qtg_runtime';
  FOR t IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') LOOP
    EXECUTE format('REVOKE ALL ON TABLE %I FROM qtg_runtime', t);
    privileges := qtg_runtime_privileges(t);
    IF privileges <> '' THEN
      EXECUTE format('GRANT %s ON TABLE %I TO qtg_runtime', privileges, t);
    END IF;
  END LOOP;
  EXECUTE 'GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO qtg_runtime';
  EXECUTE 'GRANT EXECUTE ON FUNCTION qtg_audit_promote(int) TO qtg_runtime';
  RETURN 'granted';
END $$;
REVOKE ALL ON FUNCTION qtg_grant_roles() FROM PUBLIC;

SELECT qtg_grant_roles();
