-- 0207_signer_fills.sql -- the grants at a nonce, found by it.
--
-- The signer fills a nonce (a transfer of nothing from a key's address to
-- itself: docs/evm.md "Filling a nonce") only where its log shows a
-- transfer granted, and `qtgd audit verify` names the fill signed at the
-- nonce of each grant it lists as not settled.  Both look grants up by
-- chain, sender and nonce; a fill's own row (code FILL_GRANTED) names no
-- request, so it never stands for a transfer.
CREATE INDEX signer_events_at_nonce ON signer_events (chain_id, signer_address, nonce)
  WHERE decision = 'granted' AND nonce IS NOT NULL;
