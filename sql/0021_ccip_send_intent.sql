-- 0021_ccip_send_intent.sql -- CCIP send intents (issue 5; written by the
-- CCIP executor before its ccipSend, reaped by ccip_stranded_reaper;
-- docs/conditional-workers.md section 2).
--
-- status: pending (intent recorded, not yet sent), sent (source transaction
-- known), delivered / failed (resolved by the observer), stranded (aged past
-- MG_CCIP_STRANDED_AGE_SECONDS unresolved: surfaced to operators with a
-- request_attention callback), resolved (an operator settled a stranded one).
CREATE TABLE ccip_send_intent (
  id                     uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  network_class          text NOT NULL CHECK (network_class <> ''),
  request_id             uuid REFERENCES movement_requests(id),
  request_node_id        uuid REFERENCES movement_request_nodes(id),
  source_chain_selector  numeric(20, 0) NOT NULL CHECK (source_chain_selector >= 0),
  dest_chain_selector    numeric(20, 0) NOT NULL CHECK (dest_chain_selector >= 0),
  sender                 text,
  receiver               text,
  token                  text,
  amount                 numeric,
  source_tx_hash         text CHECK (source_tx_hash ~ '^0x[0-9a-f]{64}$'),
  message_id             text CHECK (message_id ~ '^0x[0-9a-f]{64}$'),
  status                 text NOT NULL DEFAULT 'pending'
                         CHECK (status IN ('pending', 'sent', 'delivered', 'failed', 'stranded', 'resolved')),
  stranded_at            timestamptz,
  stranded_reason        text,
  resolved_by            text,
  created_at             timestamptz NOT NULL DEFAULT clock_timestamp(),
  updated_at             timestamptz NOT NULL DEFAULT clock_timestamp(),
  CHECK ((status = 'stranded') <= (stranded_at IS NOT NULL))
);

-- ccip_stranded_reaper's claim: unresolved intents of a class, oldest first.
CREATE INDEX ccip_send_intent_unresolved ON ccip_send_intent (network_class, created_at)
  WHERE status IN ('pending', 'sent');
CREATE INDEX ccip_send_intent_request ON ccip_send_intent (request_id) WHERE request_id IS NOT NULL;
