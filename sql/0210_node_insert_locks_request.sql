-- 0210_node_insert_locks_request.sql -- a node's insert and a change of
-- its request's plan version wait for each other (docs/security.md,
-- section 6; an adversarial review, session 37).
--
-- sql/0203 checks an inserted node against its request's plan version and
-- sql/0209 refuses to change the plan version of a request that has
-- nodes.  Each reads the other's table, and the two writes took row locks
-- that do not conflict (the node's foreign key takes KEY SHARE on the
-- request, the plan change NO KEY UPDATE): two runtime sessions, one
-- inserting a node of plan version Z while the other moved the request
-- from Z to Y, each committed without seeing the other, in either order,
-- and left a request of Y holding a node of Z's step.  Now a node's insert
-- first locks the nodes' requests FOR SHARE, which conflicts with the plan
-- change's lock: whichever comes second waits for the first to commit and
-- then sees it (at READ COMMITTED, which sql/0209 requires of both, the
-- next statement's snapshot is taken after the wait) and is refused
-- (55000).  The engine inserts a request's nodes in the transaction that
-- inserted the request, so it waits for nobody.
--
-- The lock is a statement trigger of its own, named to fire before the
-- check (PostgreSQL fires a table's triggers of one event in the order of
-- their names: ..._lock_requests before ..._of_plan).

CREATE FUNCTION qtg_lock_requests_of_nodes() RETURNS trigger
  LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
  PERFORM 1 FROM movement_requests
    WHERE id IN (SELECT request_id FROM inserted_nodes)
    ORDER BY id FOR SHARE;
  RETURN NULL;
END $$;
CREATE TRIGGER movement_request_nodes_lock_requests AFTER INSERT ON movement_request_nodes
  REFERENCING NEW TABLE AS inserted_nodes
  FOR EACH STATEMENT EXECUTE FUNCTION qtg_lock_requests_of_nodes();
