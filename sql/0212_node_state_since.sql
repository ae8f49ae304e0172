-- 0212_node_state_since.sql -- when a node entered its state, and how many
-- of its observations in a row ended UNKNOWN (docs/data-model.md, "How
-- long a node has been stuck").
--
-- updated_at moves at every write, and recovery writes an UNKNOWN node it
-- cannot settle at each of its passes (STILL_UNKNOWN, or the error of a
-- recover() that raised): a node stuck for a day read as a minute old, and
-- an alert on its age never fired.  state_since moves only when node_state
-- changes (the transition trigger sets it), so it says how long the node
-- has been where it is.
--
-- A node whose observe() raises (or answers garbage, or UNKNOWN) while its
-- provider has it in flight went UNKNOWN, recovery found it in flight and
-- put it back to SUBMITTED, and the next observation put it back to
-- UNKNOWN: every minute, for good, with no state lasting long enough to be
-- seen.  unknown_observations counts the observations in a row that ended
-- UNKNOWN (0 after any other answer, and at a retry); recovery backs the
-- next observation of such a node off by it, and /metrics counts the nodes
-- at 3 or more (qtg_nodes_repeatedly_unknown).

ALTER TABLE movement_request_nodes
  ADD COLUMN state_since timestamptz,
  ADD COLUMN unknown_observations int NOT NULL DEFAULT 0 CHECK (unknown_observations >= 0);
ALTER TABLE movement_request_nodes ALTER COLUMN state_since SET DEFAULT clock_timestamp();

-- Rows written before this migration keep state_since NULL until their
-- next change of state (readers take updated_at for it: the best there
-- is).  No row is rewritten here: an UPDATE of the live nodes would queue
-- their deferred triggers, and the table could not be altered after it in
-- the same transaction on a database with work in flight.

CREATE OR REPLACE FUNCTION qtg_check_node_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.node_state IS DISTINCT FROM OLD.node_state THEN
    IF NOT EXISTS (
         SELECT 1 FROM node_state_transitions
          WHERE from_state = OLD.node_state AND to_state = NEW.node_state) THEN
      RAISE EXCEPTION 'illegal node transition % -> % (node %)',
        OLD.node_state, NEW.node_state, OLD.id
        USING ERRCODE = 'check_violation';
    END IF;
    NEW.state_since := clock_timestamp();
  END IF;
  NEW.updated_at := clock_timestamp();
  RETURN NEW;
END $$;
