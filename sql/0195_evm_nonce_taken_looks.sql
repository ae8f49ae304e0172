-- 0195_evm_nonce_taken_looks.sql -- "nonce taken" is a verdict that must
-- hold over time before a transfer is FAILED (docs/evm.md "Nonce taken").
--
-- The verdict is read from an RPC's answers: no receipt and no transaction
-- for the signed hash, while the sender's count has passed its nonce.  A
-- load-balanced endpoint whose lookups reach a lagging node gives the same
-- answers for a transaction that was mined a moment ago; failing the node
-- on the first such look calls FAILED a transfer whose money moved.  The
-- executor and the evm_nonce_reaper now record each look here and decide
-- only once the verdict has held for MG_EVM_NONCE_TAKEN_CONFIRM_SECONDS
-- over at least three looks (qtg.evm_nonces.look_taken); any look that
-- finds the transaction, or finds the nonce free, clears them.
--
--   nonce_taken_since  when the current run of "taken" looks began (NULL:
--                      no run)
--   nonce_taken_looks  how many looks in that run
ALTER TABLE evm_nonce_reservation
  ADD COLUMN nonce_taken_since timestamptz,
  ADD COLUMN nonce_taken_looks int NOT NULL DEFAULT 0 CHECK (nonce_taken_looks >= 0),
  ADD CONSTRAINT evm_nonce_reservation_taken_run
    CHECK ((nonce_taken_since IS NULL) = (nonce_taken_looks = 0));
