-- 0160_observable_due_key.sql -- the observer's index on a request's nodes in
-- flight keys their due time, so a walk over EXECUTING requests tells a due
-- node from one not yet due without reading it (docs/performance.md,
-- "The claims and walks after a burst").
--
-- The observer's snapshot reads each EXECUTING request's in-flight nodes by
-- request id.  The due test, next_observe_at IS NULL OR next_observe_at <=
-- now(), is an OR that an index condition cannot carry, so every node in
-- flight was read from the heap to be tested.  coalesce(next_observe_at,
-- '-infinity') <= now() is the same test as one range on the index's second
-- column: the index answers it, and a pass that finds nothing due reads
-- the index alone for each request (2,000 requests in flight, none due: 2.6
-- ms a pass against 5.0).
CREATE INDEX movement_request_nodes_observable_due ON movement_request_nodes
  (request_id, (coalesce(next_observe_at, '-infinity'::timestamptz)))
  WHERE node_state IN ('SUBMITTED', 'OBSERVING');
DROP INDEX movement_request_nodes_observable;
ALTER INDEX movement_request_nodes_observable_due RENAME TO movement_request_nodes_observable;
