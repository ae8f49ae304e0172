-- 0070_approval_freeze.sql -- an approved request cannot be changed
-- (docs/approvals.md, docs/security.md).
--
-- Once a request has left PENDING_APPROVAL, the columns its approval digest
-- covers (qtg_approval_document) and the approval record itself are frozen:
-- an UPDATE that changes one of them is refused with an error naming the
-- column (SQLSTATE 55000, object_not_in_prerequisite_state).  The plan
-- version and plan nodes such a request references are frozen too (no
-- UPDATE, no DELETE).  A superuser can still disable the triggers; the
-- separate signer recomputes the digest from the rows for that case.
CREATE FUNCTION qtg_refuse_frozen_request() RETURNS trigger
  LANGUAGE plpgsql AS $$
DECLARE
  col text;
  changed boolean;
BEGIN
  IF OLD.request_state = 'PENDING_APPROVAL' THEN
    RETURN NEW;
  END IF;
  FOREACH col IN ARRAY ARRAY['template_key', 'plan_version_id', 'compiled_plan_hash', 'intent',
      'input_params', 'network_class', 'callback_url', 'created_by', 'approval_digest',
      'approvals_required', 'approval_policy'] LOOP
    EXECUTE format('SELECT ($1).%1$I IS DISTINCT FROM ($2).%1$I', col) INTO changed USING OLD, NEW;
    IF changed THEN
      RAISE EXCEPTION 'movement_requests.% of request % is frozen: the request left PENDING_APPROVAL (it is %)',
        col, OLD.id, OLD.request_state
        USING ERRCODE = '55000', COLUMN = col, TABLE = 'movement_requests';
    END IF;
  END LOOP;
  RETURN NEW;
END
$$;

CREATE TRIGGER movement_requests_frozen
  BEFORE UPDATE OF template_key, plan_version_id, compiled_plan_hash, intent, input_params,
    network_class, callback_url, created_by, approval_digest, approvals_required, approval_policy
  ON movement_requests FOR EACH ROW EXECUTE FUNCTION qtg_refuse_frozen_request();

-- plan_versions / plan_nodes: refused while a request past PENDING_APPROVAL
-- references the version.
CREATE FUNCTION qtg_refuse_frozen_plan() RETURNS trigger
  LANGUAGE plpgsql AS $$
DECLARE
  pv bigint;
  req uuid;
BEGIN
  IF TG_TABLE_NAME = 'plan_versions' THEN pv := OLD.id; ELSE pv := OLD.plan_version_id; END IF;
  SELECT id INTO req FROM movement_requests
   WHERE plan_version_id = pv AND request_state <> 'PENDING_APPROVAL' LIMIT 1;
  IF req IS NOT NULL THEN
    RAISE EXCEPTION '% of plan version % is frozen: request % approved it (% refused)',
      TG_TABLE_NAME, pv, req, TG_OP
      USING ERRCODE = '55000', TABLE = TG_TABLE_NAME;
  END IF;
  IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
  RETURN NEW;
END
$$;

CREATE TRIGGER plan_versions_frozen BEFORE UPDATE OR DELETE ON plan_versions
  FOR EACH ROW EXECUTE FUNCTION qtg_refuse_frozen_plan();
CREATE TRIGGER plan_nodes_frozen BEFORE UPDATE OR DELETE ON plan_nodes
  FOR EACH ROW EXECUTE FUNCTION qtg_refuse_frozen_plan();

-- A decision, once given, is never edited or removed.
CREATE FUNCTION qtg_refuse_approval_change() RETURNS trigger
  LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'request_approvals is append-only (% refused)', TG_OP USING ERRCODE = '55000';
END
$$;

CREATE TRIGGER request_approvals_append_only BEFORE UPDATE OR DELETE ON request_approvals
  FOR EACH ROW EXECUTE FUNCTION qtg_refuse_approval_change();
