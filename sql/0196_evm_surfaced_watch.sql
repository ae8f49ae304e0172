-- 0196_evm_surfaced_watch.sql -- the evm_nonce_reaper keeps watching a
-- surfaced reservation's signed bytes until the chain has used its nonce
-- for another transaction for good (docs/conditional-workers.md, docs/evm.md
-- "Surfaced bytes are watched").
--
-- A surfaced reservation with signed bytes belongs to a transfer reported
-- FAILED (EVM_TX_REJECTED: an RPC refused the bytes; EVM_NONCE_TAKEN).  The
-- bytes were handed to an RPC, so while their nonce is free anyone holding
-- them can still have them mined, and a transfer reported FAILED would then
-- have moved money with nobody told.  The reaper now looks at such rows
-- every MG_EVM_NONCE_REAPER_AGE_SECONDS: mined -> consumed with a critical
-- notification; the nonce used by another transaction, as that verdict
-- holds (qtg.evm_nonces.look_taken) -> bytes_dead_at, and no more looks.
ALTER TABLE evm_nonce_reservation ADD COLUMN bytes_dead_at timestamptz;

CREATE INDEX evm_nonce_reservation_watched ON evm_nonce_reservation ((coalesce(last_checked_at, updated_at)))
  WHERE status = 'surfaced' AND signed_raw_tx IS NOT NULL AND bytes_dead_at IS NULL;
