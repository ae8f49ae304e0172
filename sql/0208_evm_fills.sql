-- 0208_evm_fills.sql -- the fills qtg sent, watched until the chain settles
-- their nonce (docs/evm.md, "Filling a nonce").
--
-- A fill (lua/qtg/evm_fill.lua) is a transfer of nothing from a signer
-- key's address to itself, sent to void whatever else was signed at its
-- nonce.  It voids those bytes only once mined, and a pool may drop it (a
-- fill above the chain's count waits behind the nonces before it), so its
-- row is written with its bytes before they are sent, and evm_nonce_reaper
-- looks at every fill still 'sent': mined, sent again when the node has
-- lost it, or settled by what the chain did with the nonce.
--
-- status:
--   sent      signed and handed to the RPC (or its answer not known): watched
--   mined     the chain shows this fill mined at its nonce (final)
--   replaced  another fill at the same nonce was mined (final)
--   taken     the chain used the nonce for a transaction that is none of
--             qtg's fills there -- maybe the very bytes the fill was to void
--             (final; operators are alerted)
--   dropped   the RPC refused these bytes (at the first send, or at every
--             send again up to MG_EVM_NONCE_REAPER_MAX_REBROADCASTS): a new
--             fill_nonce is the way on (final)
-- A fill is born 'sent'; what was signed (bytes, hashes, fees, request,
-- actor, confirmations) never changes, and a settled row does not change
-- at all.  The rows are the runtime role's, like the reservations: their
-- 'mined' is the runtime's word, as a reservation's 'consumed' is, and
-- `qtgd audit verify` takes it only for the very payload a FILL_GRANTED in
-- the signer's log names (docs/evm.md, "Filling a nonce").
CREATE TABLE evm_fills (
  id                        bigserial PRIMARY KEY,
  chain_id                  bigint NOT NULL CHECK (chain_id > 0),
  address                   text NOT NULL CHECK (address ~ '^0x[0-9a-f]{40}$'),
  nonce                     bigint NOT NULL CHECK (nonce >= 0),
  tx_hash                   text NOT NULL CHECK (tx_hash ~ '^0x[0-9a-f]{64}$'),
  payload_hash              text NOT NULL CHECK (payload_hash ~ '^0x[0-9a-f]{64}$'),
  signed_raw_tx             text NOT NULL CHECK (signed_raw_tx ~ '^0x([0-9a-f]{2})+$'),
  max_fee_per_gas           numeric(78, 0) NOT NULL CHECK (max_fee_per_gas >= 0),
  max_priority_fee_per_gas  numeric(78, 0) NOT NULL CHECK (max_priority_fee_per_gas >= 0),
  request_id                uuid,
  actor                     text NOT NULL,
  confirmations             int NOT NULL DEFAULT 1 CHECK (confirmations >= 1),
  status                    text NOT NULL DEFAULT 'sent'
                            CHECK (status IN ('sent', 'mined', 'replaced', 'taken', 'dropped')),
  mined_block               bigint,
  rebroadcasts              int NOT NULL DEFAULT 0 CHECK (rebroadcasts >= 0),
  nonce_taken_since         timestamptz,
  nonce_taken_looks         int NOT NULL DEFAULT 0,
  last_error                text,
  last_checked_at           timestamptz,
  reap_lease_until          timestamptz,
  reap_lease_owner          text,
  created_at                timestamptz NOT NULL DEFAULT clock_timestamp(),
  settled_at                timestamptz,
  CHECK (status <> 'mined' OR mined_block IS NOT NULL),
  CHECK ((status = 'sent') = (settled_at IS NULL))
);

-- A fill is born sent; only a sent row changes, and what was signed never.
CREATE FUNCTION qtg_check_evm_fill() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    IF NEW.status <> 'sent' OR NEW.settled_at IS NOT NULL OR NEW.mined_block IS NOT NULL THEN
      RAISE EXCEPTION 'a fill is written sent, not %', NEW.status USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
  END IF;
  IF OLD.status <> 'sent' THEN
    RAISE EXCEPTION 'fill % is % already: it does not change', OLD.id, OLD.status
      USING ERRCODE = 'check_violation';
  END IF;
  IF (NEW.chain_id, NEW.address, NEW.nonce, NEW.tx_hash, NEW.payload_hash, NEW.signed_raw_tx, NEW.max_fee_per_gas,
      NEW.max_priority_fee_per_gas, NEW.request_id, NEW.actor, NEW.confirmations, NEW.created_at)
     IS DISTINCT FROM (OLD.chain_id, OLD.address, OLD.nonce, OLD.tx_hash, OLD.payload_hash, OLD.signed_raw_tx,
      OLD.max_fee_per_gas, OLD.max_priority_fee_per_gas, OLD.request_id, OLD.actor, OLD.confirmations, OLD.created_at) THEN
    RAISE EXCEPTION 'fill %: what was signed and by whom is write-once', OLD.id USING ERRCODE = 'check_violation';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER evm_fills_guard BEFORE INSERT OR UPDATE ON evm_fills
  FOR EACH ROW EXECUTE FUNCTION qtg_check_evm_fill();

-- the reaper's watch: fills still sent, least recently looked at first
CREATE INDEX evm_fills_sent ON evm_fills ((coalesce(last_checked_at, created_at)))
  WHERE status = 'sent';
-- one row watches a transaction: a fill signed again to the same bytes
-- (the same fees) while one is sent is that row, sent again; one dropped
-- before is a new row
CREATE UNIQUE INDEX evm_fills_sent_once ON evm_fills (tx_hash) WHERE status = 'sent';
-- the fills at a nonce (a fill's siblings; a grant's fill for audit verify)
CREATE INDEX evm_fills_at_nonce ON evm_fills (chain_id, address, nonce);
