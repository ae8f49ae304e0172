-- 0130_changed_row_guard.sql -- a write that carries its transaction's
-- commit refuses, by itself, to change no row (docs/performance.md, "The
-- last write with the commit").
--
-- A node change checks the row it wrote before its transaction commits
-- ("changed no row": a stale or tampered id, qtg.nodes).  When the write is
-- sent with the commit in one round trip (qtg.db's commit_batch), that check
-- would come after the commit; so the statement ends in a guard that calls
-- this function with the count of the rows it changed, and a count below
-- one raises: the statement fails, the commit with it, and nothing of the
-- transaction is written.
CREATE FUNCTION qtg_changed_row(changed bigint, what text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
  IF changed IS NULL OR changed < 1 THEN
    RAISE EXCEPTION 'the change of % changed no row', what
      USING ERRCODE = 'no_data_found';
  END IF;
  RETURN true;
END $$;
