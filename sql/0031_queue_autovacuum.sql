-- 0031_queue_autovacuum.sql -- vacuum the work tables by how much changes,
-- not by how big they are (issue 8; docs/performance.md, "Growth").
--
-- The claims read partial indexes (0001_core.sql) whose predicates exclude
-- finished rows, but a row that leaves a predicate (a request that
-- completes, a callback that is delivered) leaves a dead entry at the head
-- of the index until VACUUM removes it, and every claim steps over it.
-- PostgreSQL's default triggers autovacuum at 20 % of a table's rows dead:
-- with 100,000 finished requests in the table that is 20,000 dead rows,
-- so the claims slow down as history grows.  A fixed threshold keeps the
-- heads of the claim indexes clean whatever the size of the history.
ALTER TABLE movement_requests SET (
  autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000,
  autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE movement_request_nodes SET (
  autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000,
  autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE movement_callback_outbox SET (
  autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000,
  autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE audit_outbox SET (
  autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000,
  autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 10000);
