-- 0200_nodes_troubled_key.sql -- the FAILED and UNKNOWN nodes of a request,
-- by request (qtg.state.derive_request_state's hold and qtg.state.stopping,
-- qtg.workers.node_dispatcher).
--
-- A request bound for FAILED or MANUAL_INTERVENTION (a FAILED node, or an
-- UNKNOWN one beside a completed side effect) stays EXECUTING while another
-- of its nodes is still in flight, so that node is observed and recovered
-- to the end.  The dispatcher must start none of its READY nodes
-- meanwhile: its candidate walk asks, for each request it passes, whether
-- the request has such a node.  This index answers that from its leaf
-- alone for almost every request (no node row read) and holds FAILED and
-- UNKNOWN nodes only.
CREATE INDEX movement_request_nodes_troubled ON movement_request_nodes (request_id)
  WHERE node_state IN ('FAILED', 'UNKNOWN');
