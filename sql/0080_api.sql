-- 0080_api.sql -- the HTTP API's own tables: its clients' tokens and the
-- stored first responses of Idempotency-Key requests.
--
-- api_tokens: a token is shown once at creation and stored only as its
-- SHA-256 (token_hash); a lookup by hash needs no constant-time compare, as
-- the token has 256 bits of entropy.  token_prefix (the first characters)
-- lets an operator tell tokens apart in `qtgd tokens list`.  A name is the
-- client's principal ("api:<name>") and is unique among tokens not revoked.
CREATE TABLE api_tokens (
  id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  name          text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,47}$'),
  token_prefix  text NOT NULL,
  token_hash    text NOT NULL UNIQUE CHECK (token_hash ~ '^[0-9a-f]{64}$'),
  roles         text[] NOT NULL CHECK (roles <@ ARRAY['read', 'operate', 'approve', 'admin']
                                       AND cardinality(roles) > 0),
  created_by    text NOT NULL,
  created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
  expires_at    timestamptz,
  revoked_at    timestamptz,
  revoked_by    text
);
CREATE UNIQUE INDEX api_tokens_live_name ON api_tokens (name) WHERE revoked_at IS NULL;

-- api_idempotency_keys: one row per (client, key).  status NULL: the first
-- request is still running (a repeat gets 409); once it ends, its status and
-- body are stored and a repeat with the same request_hash gets them back.
CREATE TABLE api_idempotency_keys (
  client           text NOT NULL,
  idempotency_key  text NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 200),
  method           text NOT NULL,
  path             text NOT NULL,
  request_hash     text NOT NULL,
  status           int,
  response_body    text,
  content_type     text,
  created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
  completed_at     timestamptz,
  PRIMARY KEY (client, idempotency_key)
);
CREATE INDEX api_idempotency_keys_age ON api_idempotency_keys (created_at);

-- Keyset pagination of GET /v3/requests: newest first within a class.
CREATE INDEX movement_requests_listing ON movement_requests (network_class, created_at DESC, id DESC);
