-- 0001_core.sql -- the movement engine's core tables (issue 3).
-- Templates compile into plan versions (nodes + edges); a movement request is
-- an instance of one plan version, with one movement_request_nodes row per
-- plan node.  Every state column is a CHECKed enum, and every state change is
-- checked against the transition tables below by a trigger, so no writer
-- (Lua, console, psql) can move a row along an edge the engine does not know.
-- docs/data-model.md explains every table, state and transition.

-- ---------------------------------------------------------------- templates
CREATE TABLE movement_templates (
  id            bigserial PRIMARY KEY,
  template_key  text NOT NULL UNIQUE CHECK (template_key ~ '^[a-z][a-z0-9_]{0,62}$'),
  name          text NOT NULL,
  description   text NOT NULL DEFAULT '',
  created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE plan_versions (
  id                  bigserial PRIMARY KEY,
  template_id         bigint NOT NULL REFERENCES movement_templates(id),
  version             int NOT NULL CHECK (version > 0),
  graph_hash          text NOT NULL CHECK (graph_hash ~ '^[0-9a-f]{64}$'),
  compiled_plan_hash  text NOT NULL CHECK (compiled_plan_hash ~ '^[0-9a-f]{64}$'),
  content_hash        text NOT NULL CHECK (content_hash ~ '^[0-9a-f]{64}$'),
  intent_schema       jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(intent_schema) = 'object'),
  risk_controls       jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(risk_controls) = 'object'),
  source_file         text,
  created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
  UNIQUE (template_id, version)
);

CREATE TABLE plan_nodes (
  id               bigserial PRIMARY KEY,
  plan_version_id  bigint NOT NULL REFERENCES plan_versions(id),
  node_key         text NOT NULL CHECK (node_key ~ '^[a-z][a-z0-9_]{0,62}$'),
  node_kind        text NOT NULL CHECK (node_kind IN ('action', 'observe', 'manual')),
  action_type      text NOT NULL CHECK (action_type ~ '^[a-z][a-z0-9_]*$'),
  executor         text NOT NULL,
  config           jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(config) = 'object'),
  timeout_policy   jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(timeout_policy) = 'object'),
  ordinal          int NOT NULL,
  UNIQUE (plan_version_id, node_key),
  CHECK ((node_kind = 'manual') = (action_type LIKE 'manual\_%'))
);

CREATE TABLE plan_edges (
  plan_version_id  bigint NOT NULL REFERENCES plan_versions(id),
  from_node_id     bigint NOT NULL REFERENCES plan_nodes(id),
  to_node_id       bigint NOT NULL REFERENCES plan_nodes(id),
  PRIMARY KEY (from_node_id, to_node_id),
  CHECK (from_node_id <> to_node_id)
);
CREATE INDEX plan_edges_to ON plan_edges (to_node_id);

-- ------------------------------------------------------- states and edges
CREATE TABLE request_states (state text PRIMARY KEY, terminal boolean NOT NULL);
INSERT INTO request_states VALUES
  ('PENDING_APPROVAL', false), ('APPROVED', false), ('EXECUTING', false),
  ('WAITING_MANUAL_ACTION', false), ('MANUAL_INTERVENTION', false),
  ('COMPLETED', true), ('FAILED', false), ('REJECTED', true),
  ('CANCELLED', true), ('EXPIRED', true);

CREATE TABLE request_state_transitions (
  from_state text NOT NULL REFERENCES request_states(state),
  to_state   text NOT NULL REFERENCES request_states(state),
  PRIMARY KEY (from_state, to_state)
);
INSERT INTO request_state_transitions VALUES
  ('PENDING_APPROVAL', 'APPROVED'), ('PENDING_APPROVAL', 'REJECTED'),
  ('PENDING_APPROVAL', 'CANCELLED'), ('PENDING_APPROVAL', 'EXPIRED'),
  ('APPROVED', 'EXECUTING'), ('APPROVED', 'WAITING_MANUAL_ACTION'),
  ('APPROVED', 'CANCELLED'),
  ('EXECUTING', 'COMPLETED'), ('EXECUTING', 'FAILED'),
  ('EXECUTING', 'MANUAL_INTERVENTION'), ('EXECUTING', 'WAITING_MANUAL_ACTION'),
  ('EXECUTING', 'CANCELLED'),
  ('WAITING_MANUAL_ACTION', 'EXECUTING'), ('WAITING_MANUAL_ACTION', 'COMPLETED'),
  ('WAITING_MANUAL_ACTION', 'MANUAL_INTERVENTION'), ('WAITING_MANUAL_ACTION', 'FAILED'),
  ('WAITING_MANUAL_ACTION', 'CANCELLED'),
  ('MANUAL_INTERVENTION', 'EXECUTING'), ('MANUAL_INTERVENTION', 'CANCELLED'),
  ('FAILED', 'EXECUTING');

CREATE TABLE node_states (state text PRIMARY KEY, terminal boolean NOT NULL);
INSERT INTO node_states VALUES
  ('BLOCKED', false), ('READY', false), ('SUBMITTING', false),
  ('SUBMITTED', false), ('OBSERVING', false), ('COMPLETED', true),
  ('FAILED', false), ('UNKNOWN', false), ('SKIPPED', true), ('CANCELLED', true);

CREATE TABLE node_state_transitions (
  from_state text NOT NULL REFERENCES node_states(state),
  to_state   text NOT NULL REFERENCES node_states(state),
  PRIMARY KEY (from_state, to_state)
);
INSERT INTO node_state_transitions VALUES
  ('BLOCKED', 'READY'), ('BLOCKED', 'SKIPPED'), ('BLOCKED', 'CANCELLED'),
  ('READY', 'SUBMITTING'), ('READY', 'SUBMITTED'), ('READY', 'COMPLETED'),
  ('READY', 'FAILED'), ('READY', 'UNKNOWN'), ('READY', 'CANCELLED'),
  ('SUBMITTING', 'SUBMITTED'), ('SUBMITTING', 'COMPLETED'),
  ('SUBMITTING', 'FAILED'), ('SUBMITTING', 'UNKNOWN'),
  ('SUBMITTED', 'OBSERVING'), ('SUBMITTED', 'COMPLETED'),
  ('SUBMITTED', 'FAILED'), ('SUBMITTED', 'UNKNOWN'),
  ('OBSERVING', 'COMPLETED'), ('OBSERVING', 'FAILED'), ('OBSERVING', 'UNKNOWN'),
  ('UNKNOWN', 'SUBMITTED'), ('UNKNOWN', 'COMPLETED'), ('UNKNOWN', 'FAILED'),
  ('UNKNOWN', 'READY'),
  ('FAILED', 'READY');

-- ------------------------------------------------------------- requests
CREATE TABLE movement_requests (
  id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  network_class       text NOT NULL CHECK (network_class <> ''),
  template_key        text NOT NULL,
  plan_version_id     bigint NOT NULL REFERENCES plan_versions(id),
  compiled_plan_hash  text NOT NULL,
  request_state       text NOT NULL REFERENCES request_states(state),
  intent              jsonb NOT NULL CHECK (jsonb_typeof(intent) = 'object'),
  input_params        jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(input_params) = 'object'),
  current_frontier    jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(current_frontier) = 'array'),
  idempotency_key     text NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 200),
  callback_url        text CHECK (callback_url ~ '^https?://'),
  callback_sequence   int NOT NULL DEFAULT 0,
  expires_at          timestamptz,
  created_by          text NOT NULL,
  approved_by         text,
  approved_at         timestamptz,
  finished_at         timestamptz,
  last_error_code     text,
  created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
  UNIQUE (network_class, idempotency_key)
);

CREATE TABLE movement_request_nodes (
  id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  request_id       uuid NOT NULL REFERENCES movement_requests(id),
  plan_node_id     bigint NOT NULL REFERENCES plan_nodes(id),
  node_key         text NOT NULL,
  node_kind        text NOT NULL CHECK (node_kind IN ('action', 'observe', 'manual')),
  action_type      text NOT NULL,
  executor         text NOT NULL,
  node_state       text NOT NULL REFERENCES node_states(state),
  attempt_no       int NOT NULL DEFAULT 0 CHECK (attempt_no >= 0),
  idempotency_key  text,
  side_effect      boolean NOT NULL DEFAULT false,
  observe_count    int NOT NULL DEFAULT 0,
  next_observe_at  timestamptz,
  started_at       timestamptz,
  finished_at      timestamptz,
  resolved_config  jsonb,
  provider_refs    jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(provider_refs) = 'object'),
  artifacts        jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(artifacts) = 'array'),
  error_code       text,
  error_detail     text,
  created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  UNIQUE (request_id, node_key)
);

-- Transition guard: a state column may only move along a listed edge.
CREATE FUNCTION qtg_check_request_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.request_state IS DISTINCT FROM OLD.request_state AND NOT EXISTS (
       SELECT 1 FROM request_state_transitions
        WHERE from_state = OLD.request_state AND to_state = NEW.request_state) THEN
    RAISE EXCEPTION 'illegal request transition % -> % (request %)',
      OLD.request_state, NEW.request_state, OLD.id
      USING ERRCODE = 'check_violation';
  END IF;
  NEW.updated_at := clock_timestamp();
  RETURN NEW;
END $$;
CREATE TRIGGER movement_requests_transition BEFORE UPDATE ON movement_requests
  FOR EACH ROW EXECUTE FUNCTION qtg_check_request_transition();

CREATE FUNCTION qtg_check_node_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.node_state IS DISTINCT FROM OLD.node_state AND NOT EXISTS (
       SELECT 1 FROM node_state_transitions
        WHERE from_state = OLD.node_state AND to_state = NEW.node_state) THEN
    RAISE EXCEPTION 'illegal node transition % -> % (node %)',
      OLD.node_state, NEW.node_state, OLD.id
      USING ERRCODE = 'check_violation';
  END IF;
  NEW.updated_at := clock_timestamp();
  RETURN NEW;
END $$;
CREATE TRIGGER movement_request_nodes_transition BEFORE UPDATE ON movement_request_nodes
  FOR EACH ROW EXECUTE FUNCTION qtg_check_node_transition();

-- Claim indexes: one per claim predicate and order (spec "Ordering basis").
-- node_dispatcher: READY nodes of APPROVED/EXECUTING requests, FIFO by request.
CREATE INDEX movement_requests_dispatchable ON movement_requests (network_class, created_at)
  WHERE request_state IN ('APPROVED', 'EXECUTING');
CREATE INDEX movement_request_nodes_ready ON movement_request_nodes (request_id)
  WHERE node_state = 'READY';
-- node_observer: SUBMITTED/OBSERVING nodes of EXECUTING requests, FIFO by request.
CREATE INDEX movement_requests_executing ON movement_requests (network_class, created_at)
  WHERE request_state = 'EXECUTING';
CREATE INDEX movement_request_nodes_observable ON movement_request_nodes (request_id, next_observe_at)
  WHERE node_state IN ('SUBMITTED', 'OBSERVING');
-- node_recovery: UNKNOWN / SUBMITTING nodes, longest idle first.
CREATE INDEX movement_request_nodes_recoverable ON movement_request_nodes (updated_at)
  WHERE node_state IN ('UNKNOWN', 'SUBMITTING');
-- expiration_checker: PENDING_APPROVAL past expires_at.
CREATE INDEX movement_requests_pending_expiry ON movement_requests (expires_at)
  WHERE request_state = 'PENDING_APPROVAL';

-- ---------------------------------------------------------------- outboxes
CREATE TABLE movement_callback_outbox (
  id                  bigserial PRIMARY KEY,
  request_id          uuid NOT NULL REFERENCES movement_requests(id),
  event_type          text NOT NULL,
  payload             text NOT NULL,
  callback_url        text,
  status              text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'dlq')),
  attempts            int NOT NULL DEFAULT 0,
  max_attempts        int NOT NULL,
  next_attempt_at     timestamptz NOT NULL DEFAULT now(),
  callback_timestamp  bigint NOT NULL DEFAULT extract(epoch from now())::bigint,
  callback_nonce      text NOT NULL DEFAULT replace(gen_random_uuid()::text, '-', ''),
  last_error          text,
  last_status         int,
  delivered_at        timestamptz,
  created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX movement_callback_outbox_pending ON movement_callback_outbox (created_at)
  WHERE status = 'pending';
CREATE INDEX movement_callback_outbox_request ON movement_callback_outbox (request_id, id);

CREATE TABLE audit_outbox (
  id           bigserial PRIMARY KEY,
  actor        text NOT NULL,
  action       text NOT NULL,
  entity_type  text NOT NULL,
  entity_id    text NOT NULL,
  request_id   uuid,
  detail       jsonb NOT NULL DEFAULT '{}',
  created_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE audit_events (
  id           bigserial PRIMARY KEY,
  outbox_id    bigint UNIQUE NOT NULL,
  actor        text NOT NULL,
  action       text NOT NULL,
  entity_type  text NOT NULL,
  entity_id    text NOT NULL,
  request_id   uuid,
  detail       jsonb NOT NULL DEFAULT '{}',
  created_at   timestamptz NOT NULL,
  promoted_at  timestamptz DEFAULT clock_timestamp()
);
CREATE INDEX audit_events_request ON audit_events (request_id, id) WHERE request_id IS NOT NULL;

-- --------------------------------------------------------------- heartbeats
CREATE TABLE worker_heartbeats (
  network_class       text NOT NULL,
  worker_name         text NOT NULL,
  process_id          text NOT NULL,
  group_name          text NOT NULL,
  started_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
  last_tick_at        timestamptz,
  last_count          int,
  consecutive_errors  int NOT NULL DEFAULT 0,
  updated_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (network_class, worker_name, process_id)
);
