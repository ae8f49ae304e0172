-- 0050_evm_transfer.sql -- the evm_transfer executor's books (issue 10;
-- docs/evm.md).
--
-- 1. evm_nonce_reservation rows are written by the executor on its OWN
--    database session, committed before anything is signed or broadcast, so
--    that they survive the dispatcher's transaction being lost (a crash
--    between eth_sendRawTransaction and the dispatcher's commit leaves the
--    node READY, and the re-dispatch must find the signed bytes again).  The
--    dispatcher holds the node row FOR UPDATE for its whole transaction; a
--    foreign key from the reservation to movement_request_nodes would make
--    that own-session INSERT take FOR KEY SHARE on the same node row and wait
--    for the dispatcher, which waits for the INSERT: a deadlock PostgreSQL
--    cannot see (the waits meet in one Lua task).  So the reservation keeps
--    request_node_id as a plain uuid, like sim_ledger does.
ALTER TABLE evm_nonce_reservation
  DROP CONSTRAINT IF EXISTS evm_nonce_reservation_request_node_id_fkey;

-- 2. What was signed for a reservation: the transaction's fields (the input
--    of qtg.evm.eip1559), the unsigned payload and its signing hash (the
--    allowed_payload_hash of the SignRequest), and what the chain said about
--    it in the end.  One row per reservation; rewritten only while the
--    reservation is unsigned (a released nonce re-reserved for another node
--    starts afresh), frozen once the reservation holds signed bytes.
--
--    A row goes with its reservation (ON DELETE CASCADE: tests and an
--    operator's cleanup of a reset devnet delete reservations).
--
--    outcome: NULL while undecided;
--      mined       mined with receipt status 1 (the transfer happened)
--      reverted    mined with status 0 (nonce and gas used, no value moved)
--      nonce_taken the chain used the nonce for another transaction: these
--                  bytes can never be mined
--      rejected    the RPC refused the bytes (e.g. insufficient funds); a
--                  retry of the node rebroadcasts the same bytes
CREATE TABLE evm_transfer_tx (
  reservation_id   bigint PRIMARY KEY REFERENCES evm_nonce_reservation(id) ON DELETE CASCADE,
  request_node_id  uuid NOT NULL,
  attempt_no       int NOT NULL CHECK (attempt_no >= 1),
  chain_id         bigint NOT NULL CHECK (chain_id > 0),
  from_address     text NOT NULL CHECK (from_address ~ '^0x[0-9a-f]{40}$'),
  to_address       text CHECK (to_address ~ '^0x[0-9a-f]{40}$'),
  value_wei        numeric(78, 0) CHECK (value_wei >= 0),
  fields           jsonb,
  payload          text CHECK (payload ~ '^0x02([0-9a-f]{2})+$'),
  payload_hash     text CHECK (payload_hash ~ '^0x[0-9a-f]{64}$'),
  outcome          text CHECK (outcome IN ('mined', 'reverted', 'nonce_taken', 'rejected')),
  outcome_detail   text,
  receipt_block    bigint,
  created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  CHECK ((payload IS NULL) = (payload_hash IS NULL))
);
CREATE INDEX evm_transfer_tx_node ON evm_transfer_tx (request_node_id, reservation_id DESC);

-- The transaction of a signed reservation never changes under it.
CREATE FUNCTION qtg_check_evm_transfer_tx() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF (NEW.fields, NEW.payload, NEW.payload_hash, NEW.chain_id, NEW.from_address)
       IS DISTINCT FROM (OLD.fields, OLD.payload, OLD.payload_hash, OLD.chain_id, OLD.from_address)
     AND EXISTS (SELECT 1 FROM evm_nonce_reservation
                  WHERE id = OLD.reservation_id AND signed_raw_tx IS NOT NULL) THEN
    RAISE EXCEPTION 'the transaction of signed reservation % is frozen', OLD.reservation_id
      USING ERRCODE = 'check_violation';
  END IF;
  NEW.updated_at := clock_timestamp();
  RETURN NEW;
END $$;
CREATE TRIGGER evm_transfer_tx_guard BEFORE UPDATE ON evm_transfer_tx
  FOR EACH ROW EXECUTE FUNCTION qtg_check_evm_transfer_tx();
