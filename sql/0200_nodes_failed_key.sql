-- 0200_nodes_failed_key.sql -- the FAILED nodes of a request, by request
-- (qtg.state.derive_request_state's hold, qtg.workers.node_dispatcher).
--
-- A request with a FAILED node stays EXECUTING while another of its nodes
-- is still in flight or UNKNOWN, so that node is observed and recovered
-- to the end before the request is FAILED or MANUAL_INTERVENTION.  The
-- dispatcher must start none of its READY nodes meanwhile: its candidate
-- walk asks, for each request it passes, whether the request has a FAILED
-- node.  This index answers that from its leaf alone (no node row read)
-- and holds FAILED nodes only.
CREATE INDEX movement_request_nodes_failed ON movement_request_nodes (request_id)
  WHERE node_state = 'FAILED';
