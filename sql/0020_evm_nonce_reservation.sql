-- 0020_evm_nonce_reservation.sql -- EVM nonce reservations (issue 5; the
-- evm_transfer executor of issue 10 writes them, evm_nonce_reaper reconciles
-- the stale ones with the chain; docs/conditional-workers.md section 1).
--
-- One row per (chain_id, address, nonce): the nonce is reserved in the
-- database BEFORE anything is signed, and the signed bytes are stored BEFORE
-- they are broadcast, so a process that dies at any point leaves a row that
-- says how far it got.
--
-- status:
--   reserved   nonce taken, nothing signed yet
--   signed     signed_raw_tx / tx_hash stored; it may or may not have reached
--              an RPC node (the writer dies between the two)
--   broadcast  an RPC node accepted the bytes
--   consumed   the chain shows tx_hash mined at this nonce (final)
--   released   never signed, and the chain has not used the nonce: free for
--              the next reservation (the executor re-reserves the row by
--              UPDATE released -> reserved; the unique key stays)
--   surfaced   the reaper cannot settle it safely; operators decide
--              (surfaced_reason); a surfaced row with signed bytes is never
--              released, only consumed
-- Signed bytes once stored never change and never leave the row: a nonce
-- whose bytes may have been broadcast is never reused for another payload
-- (enforced below, not only by the code).
CREATE TABLE evm_nonce_reservation (
  id                bigserial PRIMARY KEY,
  chain_id          bigint NOT NULL CHECK (chain_id > 0),
  address           text NOT NULL CHECK (address ~ '^0x[0-9a-f]{40}$'),
  nonce             bigint NOT NULL CHECK (nonce >= 0),
  status            text NOT NULL DEFAULT 'reserved'
                    CHECK (status IN ('reserved', 'signed', 'broadcast', 'consumed', 'released', 'surfaced')),
  request_node_id   uuid REFERENCES movement_request_nodes(id),
  payload_hash      text CHECK (payload_hash ~ '^0x[0-9a-f]{64}$'),
  signed_raw_tx     text CHECK (signed_raw_tx ~ '^0x([0-9a-f]{2})+$'),
  tx_hash           text CHECK (tx_hash ~ '^0x[0-9a-f]{64}$'),
  consumed_block    bigint,
  surfaced_reason   text,
  rebroadcasts      int NOT NULL DEFAULT 0 CHECK (rebroadcasts >= 0),
  last_error        text,
  last_checked_at   timestamptz,
  reap_lease_until  timestamptz,
  reap_lease_owner  text,
  reserved_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
  UNIQUE (chain_id, address, nonce),
  CHECK (status NOT IN ('signed', 'broadcast', 'consumed')
         OR (signed_raw_tx IS NOT NULL AND tx_hash IS NOT NULL AND payload_hash IS NOT NULL)),
  CHECK ((signed_raw_tx IS NULL) = (tx_hash IS NULL)),
  CHECK (status <> 'surfaced' OR surfaced_reason IS NOT NULL),
  CHECK (status <> 'released' OR signed_raw_tx IS NULL)
);

CREATE TABLE evm_nonce_transitions (
  from_status text NOT NULL,
  to_status   text NOT NULL,
  PRIMARY KEY (from_status, to_status)
);
INSERT INTO evm_nonce_transitions VALUES
  ('reserved', 'signed'), ('reserved', 'released'), ('reserved', 'surfaced'),
  ('signed', 'broadcast'), ('signed', 'consumed'), ('signed', 'surfaced'),
  ('broadcast', 'consumed'), ('broadcast', 'surfaced'),
  ('released', 'reserved'),
  ('surfaced', 'consumed');

-- Allowed edges only; signed bytes and their hash are write-once; a row
-- going back to 'reserved' from 'released' starts a fresh reservation.
CREATE FUNCTION qtg_check_nonce_reservation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.status IS DISTINCT FROM OLD.status AND NOT EXISTS (
       SELECT 1 FROM evm_nonce_transitions
        WHERE from_status = OLD.status AND to_status = NEW.status) THEN
    RAISE EXCEPTION 'illegal nonce reservation transition % -> % (reservation %)',
      OLD.status, NEW.status, OLD.id USING ERRCODE = 'check_violation';
  END IF;
  IF OLD.signed_raw_tx IS NOT NULL AND (NEW.signed_raw_tx IS DISTINCT FROM OLD.signed_raw_tx
       OR NEW.tx_hash IS DISTINCT FROM OLD.tx_hash
       OR NEW.payload_hash IS DISTINCT FROM OLD.payload_hash) THEN
    RAISE EXCEPTION 'signed bytes of nonce reservation % are write-once', OLD.id
      USING ERRCODE = 'check_violation';
  END IF;
  IF (NEW.chain_id, NEW.address, NEW.nonce) IS DISTINCT FROM (OLD.chain_id, OLD.address, OLD.nonce) THEN
    RAISE EXCEPTION 'the nonce of reservation % cannot change', OLD.id USING ERRCODE = 'check_violation';
  END IF;
  IF NEW.status IS DISTINCT FROM OLD.status THEN
    NEW.updated_at := clock_timestamp();
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER evm_nonce_reservation_guard BEFORE UPDATE ON evm_nonce_reservation
  FOR EACH ROW EXECUTE FUNCTION qtg_check_nonce_reservation();

-- evm_nonce_reaper's claim: unsettled rows, longest idle first.
CREATE INDEX evm_nonce_reservation_unsettled ON evm_nonce_reservation (updated_at)
  WHERE status IN ('reserved', 'signed', 'broadcast');
-- the executor's next nonce: released rows of an address, lowest first.
CREATE INDEX evm_nonce_reservation_released ON evm_nonce_reservation (chain_id, address, nonce)
  WHERE status = 'released';
CREATE INDEX evm_nonce_reservation_node ON evm_nonce_reservation (request_node_id)
  WHERE request_node_id IS NOT NULL;
