-- 0011_template_proposals.sql -- proposed template changes awaiting review
-- (issue 4, spec section 8; docs/callbacks.md "Template proposals").
--
-- A proposal carries a whole template definition (the JSON a file in
-- templates/ holds).  It is PENDING until a reviewer other than the proposer
-- approves it (the definition is then loaded as a new plan version, whose id
-- is recorded) or rejects it, or until expires_at passes and
-- template_proposal_expiration moves it to EXPIRED.  Every decision is
-- final: a state only leaves PENDING, and the trigger below refuses any other
-- edge, whoever writes.

CREATE TABLE template_proposals (
  id               bigserial PRIMARY KEY,
  template_key     text NOT NULL CHECK (template_key ~ '^[a-z][a-z0-9_]{0,62}$'),
  definition       jsonb NOT NULL CHECK (jsonb_typeof(definition) = 'object'),
  content_hash     text NOT NULL CHECK (content_hash ~ '^[0-9a-f]{64}$'),
  base_plan_version_id bigint REFERENCES plan_versions(id),
  proposal_state   text NOT NULL DEFAULT 'PENDING'
                   CHECK (proposal_state IN ('PENDING', 'APPROVED', 'REJECTED', 'EXPIRED')),
  proposed_by      text NOT NULL CHECK (proposed_by <> ''),
  reason           text NOT NULL DEFAULT '',
  expires_at       timestamptz NOT NULL,
  decided_at       timestamptz,
  decided_by       text,
  decision_note    text,
  plan_version_id  bigint REFERENCES plan_versions(id),
  created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  CHECK ((proposal_state = 'PENDING') = (decided_at IS NULL)),
  CHECK ((proposal_state = 'APPROVED') = (plan_version_id IS NOT NULL)),
  CHECK ((proposal_state IN ('APPROVED', 'REJECTED')) = (decided_by IS NOT NULL)),
  CHECK (decided_by IS NULL OR decided_by <> proposed_by)
);

-- template_proposal_expiration: PENDING past expires_at.
CREATE INDEX template_proposals_pending_expiry ON template_proposals (expires_at)
  WHERE proposal_state = 'PENDING';
-- The same definition cannot be pending twice for one template.
CREATE UNIQUE INDEX template_proposals_one_pending
  ON template_proposals (template_key, content_hash) WHERE proposal_state = 'PENDING';

CREATE FUNCTION qtg_check_proposal_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.proposal_state IS DISTINCT FROM OLD.proposal_state
     AND OLD.proposal_state <> 'PENDING' THEN
    RAISE EXCEPTION 'illegal proposal transition % -> % (proposal %)',
      OLD.proposal_state, NEW.proposal_state, OLD.id
      USING ERRCODE = 'check_violation';
  END IF;
  IF OLD.proposal_state <> 'PENDING' AND (NEW.definition IS DISTINCT FROM OLD.definition
     OR NEW.template_key IS DISTINCT FROM OLD.template_key) THEN
    RAISE EXCEPTION 'proposal % is % and cannot change', OLD.id, OLD.proposal_state
      USING ERRCODE = 'check_violation';
  END IF;
  NEW.updated_at := clock_timestamp();
  RETURN NEW;
END $$;
CREATE TRIGGER template_proposals_transition BEFORE UPDATE ON template_proposals
  FOR EACH ROW EXECUTE FUNCTION qtg_check_proposal_transition();
