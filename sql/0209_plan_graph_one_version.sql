-- 0209_plan_graph_one_version.sql -- a plan's graph is of one version, a
-- request's nodes stay of its version, and the seal is read from a fresh
-- snapshot (docs/security.md, section 6; an adversarial review, session 36).
--
-- The runtime role (qtg_runtime) got a transfer signed past a manual gate
-- the approvers had signed for, with no attestation:
--   * an edge could join nodes of two plan versions: an edge of version Y
--     from a non-manual node keyed `gate` of version Z to Y's transfer made
--     Y's plan document (which names a step's predecessors by key) read as
--     the honest "gate, then transfer", while the signer, following the
--     edge, found Z's node: no manual step, no attestation asked;
--   * a pending request's plan_version_id could change after its nodes
--     were inserted (sql/0203 checks a node when it is inserted), so the
--     request kept Z's `gate` node, SKIPPED, under version Y.
-- Now an edge and both its nodes are of one version (foreign keys on
-- (node, version)), and a request with nodes keeps its plan version.
--
-- The seal (sql/0170) and the node check (sql/0203) look rows up with a
-- plain SELECT, which under REPEATABLE READ or SERIALIZABLE reads the
-- transaction's snapshot: a session whose snapshot predates a request
-- changed the request's sealed plan.  Writes to the plan tables, and node
-- inserts, are refused unless the transaction is READ COMMITTED (each
-- statement sees every commit before it; qtg writes at that level).

DO $$
DECLARE
  n bigint;
BEGIN
  SELECT count(*) INTO n
    FROM plan_edges e
    JOIN plan_nodes a ON a.id = e.from_node_id
    JOIN plan_nodes b ON b.id = e.to_node_id
   WHERE a.plan_version_id <> e.plan_version_id OR b.plan_version_id <> e.plan_version_id;
  IF n > 0 THEN
    RAISE EXCEPTION '% plan edges join nodes of another plan version than their own; find them with: SELECT e.* FROM plan_edges e JOIN plan_nodes a ON a.id = e.from_node_id JOIN plan_nodes b ON b.id = e.to_node_id WHERE a.plan_version_id <> e.plan_version_id OR b.plan_version_id <> e.plan_version_id', n;
  END IF;
END $$;

ALTER TABLE plan_nodes ADD CONSTRAINT plan_nodes_id_version UNIQUE (id, plan_version_id);
ALTER TABLE plan_edges
  ADD CONSTRAINT plan_edges_from_same_version FOREIGN KEY (from_node_id, plan_version_id)
    REFERENCES plan_nodes (id, plan_version_id),
  ADD CONSTRAINT plan_edges_to_same_version FOREIGN KEY (to_node_id, plan_version_id)
    REFERENCES plan_nodes (id, plan_version_id);

-- A request with nodes keeps its plan version.
CREATE FUNCTION qtg_refuse_plan_change_with_nodes() RETURNS trigger
  LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM movement_request_nodes WHERE request_id = OLD.id) THEN
    RAISE EXCEPTION 'request % has nodes of plan version %: its plan version does not change', OLD.id,
      OLD.plan_version_id USING ERRCODE = '55000', TABLE = 'movement_requests';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER movement_requests_plan_kept BEFORE UPDATE OF plan_version_id ON movement_requests
  FOR EACH ROW WHEN (NEW.plan_version_id IS DISTINCT FROM OLD.plan_version_id)
  EXECUTE FUNCTION qtg_refuse_plan_change_with_nodes();

-- Writes whose checks read other tables' rows run READ COMMITTED.
CREATE FUNCTION qtg_refuse_stale_snapshot() RETURNS trigger
  LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION '% on % runs only at READ COMMITTED, not %: its checks must see every commit before it',
      TG_OP, TG_TABLE_NAME, current_setting('transaction_isolation')
      USING ERRCODE = '55000', TABLE = TG_TABLE_NAME;
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER plan_versions_read_committed BEFORE INSERT OR UPDATE OR DELETE ON plan_versions
  FOR EACH STATEMENT EXECUTE FUNCTION qtg_refuse_stale_snapshot();
CREATE TRIGGER plan_nodes_read_committed BEFORE INSERT OR UPDATE OR DELETE ON plan_nodes
  FOR EACH STATEMENT EXECUTE FUNCTION qtg_refuse_stale_snapshot();
CREATE TRIGGER plan_edges_read_committed BEFORE INSERT OR UPDATE OR DELETE ON plan_edges
  FOR EACH STATEMENT EXECUTE FUNCTION qtg_refuse_stale_snapshot();
CREATE TRIGGER movement_request_nodes_read_committed BEFORE INSERT ON movement_request_nodes
  FOR EACH STATEMENT EXECUTE FUNCTION qtg_refuse_stale_snapshot();
CREATE TRIGGER movement_requests_plan_read_committed BEFORE UPDATE OF plan_version_id ON movement_requests
  FOR EACH STATEMENT EXECUTE FUNCTION qtg_refuse_stale_snapshot();
