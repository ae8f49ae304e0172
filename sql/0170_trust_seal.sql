-- 0170_trust_seal.sql -- what the runtime role (qtg_runtime: any Lua in
-- `qtgd run`) can no longer change under an approval (docs/security.md
-- section 6, docs/approvals.md "The freeze").
--
-- 1. The request freeze (0070) looked only at the state a request was in,
--    so one UPDATE could move a request out of PENDING_APPROVAL and change
--    its intent, quorum or stored digest in the same statement.  Now a
--    frozen column changes only in an UPDATE that leaves the request in
--    PENDING_APPROVAL (before and after).  The approval path writes
--    approval_digest, approvals_required and approval_policy in statements
--    of their own while the request is still pending, and moves it to
--    APPROVED in a later one that names none of them (qtg.requests), so it
--    needs no exception.
-- 2. The signer reads the destination, chain and signer key from
--    plan_nodes.config and the fee caps from plan_versions.risk_controls,
--    but the digest covers only the stored compiled_plan_hash, and plan rows
--    were frozen only once a request on the version had left
--    PENDING_APPROVAL (plan_edges not at all): a plan node's destination
--    could change while a request waited for its approvers.  Now a plan
--    version is sealed as soon as any request references it, in any state:
--    its plan_versions row, plan_nodes and plan_edges refuse UPDATE and
--    DELETE, and no plan node or edge is added to it (an UPDATE that moves
--    a node or edge into or out of a sealed version is refused too).
--    Nothing updates plan rows at run time: a template change is a new
--    plan version (qtg.templates.store).  The seal takes the plan version's
--    row lock before it looks for a request, so it cannot miss one being
--    created concurrently (a request's foreign key takes a share lock on
--    the same row); movement_requests_plan_version keeps that look an
--    index probe.  The identity of a request's node (request_id,
--    plan_node_id, node_key, node_kind, action_type, executor) never
--    changes after it is inserted: the signer checks the node's executor
--    and action and reads the plan node it names.
-- 3. The static tables of the state machines (request_states,
--    request_state_transitions, node_states, node_state_transitions,
--    evm_nonce_transitions) are read-only for qtg_runtime: a new edge such
--    as COMPLETED -> READY would let a paid node be dispatched again.
--    qtg_grant_roles() (0102) is redefined with them in its read-only list
--    and run again here; `qtgd migrate` runs it after every migration.
--
-- Every refusal is SQLSTATE 55000 (object_not_in_prerequisite_state) with a
-- message naming the table or column, except the grants' 42501.  A
-- superuser can still disable triggers; the signer recomputes the approval
-- digest for that case, not the plan's content.

-- ------------------------------------------------------------ 1. the freeze
CREATE OR REPLACE FUNCTION qtg_refuse_frozen_request() RETURNS trigger
  LANGUAGE plpgsql AS $$
DECLARE
  col text;
  changed boolean;
BEGIN
  IF OLD.request_state = 'PENDING_APPROVAL' AND NEW.request_state = 'PENDING_APPROVAL' THEN
    RETURN NEW;
  END IF;
  FOREACH col IN ARRAY ARRAY['template_key', 'plan_version_id', 'compiled_plan_hash', 'intent',
      'input_params', 'network_class', 'callback_url', 'created_by', 'approval_digest',
      'approvals_required', 'approval_policy'] LOOP
    EXECUTE format('SELECT ($1).%1$I IS DISTINCT FROM ($2).%1$I', col) INTO changed USING OLD, NEW;
    IF changed AND OLD.request_state = 'PENDING_APPROVAL' THEN
      RAISE EXCEPTION 'movement_requests.% of request % is frozen: only an update that keeps the request in PENDING_APPROVAL may change it (this one moves it to %)',
        col, OLD.id, NEW.request_state
        USING ERRCODE = '55000', COLUMN = col, TABLE = 'movement_requests';
    ELSIF changed THEN
      RAISE EXCEPTION 'movement_requests.% of request % is frozen: the request left PENDING_APPROVAL (it is %)',
        col, OLD.id, OLD.request_state
        USING ERRCODE = '55000', COLUMN = col, TABLE = 'movement_requests';
    END IF;
  END LOOP;
  RETURN NEW;
END
$$;

-- ------------------------------------------------------- 2. the plan seal
CREATE INDEX movement_requests_plan_version ON movement_requests (plan_version_id);

-- qtg_refuse_sealed_plan_version(pv, tbl, op): raise when a request
-- references plan version pv, after taking pv's row lock.
CREATE FUNCTION qtg_refuse_sealed_plan_version(pv bigint, tbl text, op text) RETURNS void
  LANGUAGE plpgsql AS $$
DECLARE
  req uuid;
BEGIN
  IF pv IS NULL THEN RETURN; END IF;
  PERFORM 1 FROM plan_versions WHERE id = pv FOR UPDATE;
  SELECT id INTO req FROM movement_requests WHERE plan_version_id = pv LIMIT 1;
  IF req IS NOT NULL THEN
    RAISE EXCEPTION '% of plan version % is sealed: request % references it (% refused)',
      tbl, pv, req, op
      USING ERRCODE = '55000', TABLE = tbl;
  END IF;
END
$$;

-- The trigger of plan_versions, plan_nodes and plan_edges: every plan
-- version the row belongs to, before and after, and for an edge the
-- versions of the two nodes it joins.
CREATE FUNCTION qtg_refuse_sealed_plan() RETURNS trigger
  LANGUAGE plpgsql AS $$
DECLARE
  pv bigint;
  pvs bigint[] := '{}';
BEGIN
  IF TG_TABLE_NAME = 'plan_versions' THEN
    pvs := ARRAY[OLD.id];
  ELSE
    IF TG_OP <> 'INSERT' THEN pvs := pvs || OLD.plan_version_id; END IF;
    IF TG_OP <> 'DELETE' THEN pvs := pvs || NEW.plan_version_id; END IF;
    IF TG_TABLE_NAME = 'plan_edges' THEN
      IF TG_OP <> 'INSERT' THEN
        pvs := pvs || ARRAY(SELECT plan_version_id FROM plan_nodes
                             WHERE id IN (OLD.from_node_id, OLD.to_node_id));
      END IF;
      IF TG_OP <> 'DELETE' THEN
        pvs := pvs || ARRAY(SELECT plan_version_id FROM plan_nodes
                             WHERE id IN (NEW.from_node_id, NEW.to_node_id));
      END IF;
    END IF;
  END IF;
  FOR pv IN SELECT DISTINCT x FROM unnest(pvs) x ORDER BY x LOOP
    PERFORM qtg_refuse_sealed_plan_version(pv, TG_TABLE_NAME, TG_OP);
  END LOOP;
  IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
  RETURN NEW;
END
$$;

-- The seal covers what 0070's plan triggers covered, and more.
DROP TRIGGER plan_versions_frozen ON plan_versions;
DROP TRIGGER plan_nodes_frozen ON plan_nodes;
DROP FUNCTION qtg_refuse_frozen_plan();

CREATE TRIGGER plan_versions_sealed BEFORE UPDATE OR DELETE ON plan_versions
  FOR EACH ROW EXECUTE FUNCTION qtg_refuse_sealed_plan();
CREATE TRIGGER plan_nodes_sealed BEFORE INSERT OR UPDATE OR DELETE ON plan_nodes
  FOR EACH ROW EXECUTE FUNCTION qtg_refuse_sealed_plan();
CREATE TRIGGER plan_edges_sealed BEFORE INSERT OR UPDATE OR DELETE ON plan_edges
  FOR EACH ROW EXECUTE FUNCTION qtg_refuse_sealed_plan();

-- A request node's identity, fixed at insert.
CREATE FUNCTION qtg_refuse_node_identity_change() RETURNS trigger
  LANGUAGE plpgsql AS $$
DECLARE
  col text;
  changed boolean;
BEGIN
  FOREACH col IN ARRAY ARRAY['request_id', 'plan_node_id', 'node_key', 'node_kind',
      'action_type', 'executor'] LOOP
    EXECUTE format('SELECT ($1).%1$I IS DISTINCT FROM ($2).%1$I', col) INTO changed USING OLD, NEW;
    IF changed THEN
      RAISE EXCEPTION 'movement_request_nodes.% of node % is immutable: it names the plan node the node runs',
        col, OLD.id
        USING ERRCODE = '55000', COLUMN = col, TABLE = 'movement_request_nodes';
    END IF;
  END LOOP;
  RETURN NEW;
END
$$;

CREATE TRIGGER movement_request_nodes_identity
  BEFORE UPDATE OF request_id, plan_node_id, node_key, node_kind, action_type, executor
  ON movement_request_nodes FOR EACH ROW EXECUTE FUNCTION qtg_refuse_node_identity_change();

-- --------------------------------------------- 3. the runtime role's grants
-- As 0102, with the state machines' tables read-only.
CREATE OR REPLACE FUNCTION qtg_grant_roles() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  me pg_roles;
  t text;
  read_only text[] := ARRAY['audit_events', 'audit_chain_heads', 'schema_migrations',
                            'signer_events',
                            'request_states', 'request_state_transitions',
                            'node_states', 'node_state_transitions', 'evm_nonce_transitions'];
BEGIN
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
    IF t = ANY (read_only) THEN
      EXECUTE format('GRANT SELECT ON TABLE %I TO qtg_runtime', t);
    ELSIF t = 'audit_outbox' THEN
      EXECUTE format('GRANT SELECT, INSERT ON TABLE %I TO qtg_runtime', t);
    ELSE
      EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %I TO qtg_runtime', t);
    END IF;
  END LOOP;
  EXECUTE 'GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO qtg_runtime';
  EXECUTE 'GRANT EXECUTE ON FUNCTION qtg_audit_promote(int) TO qtg_runtime';
  RETURN 'granted';
END $$;
REVOKE ALL ON FUNCTION qtg_grant_roles() FROM PUBLIC;

SELECT qtg_grant_roles();
