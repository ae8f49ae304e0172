-- 0193_api_idempotency_scope.sql -- an Idempotency-Key is the client's
-- within one network class, and its replay carries the Location header
-- (docs/api.md "Idempotency").
--
-- Tokens are not tied to a class and several classes share one database:
-- keyed by (client, key) alone, a key a client used against one class's
-- daemon was answered by another class's daemon with the first class's
-- stored response, and nothing was created there.  The replay of a 201
-- lost its Location header, which docs/api.md promises.
--
-- The console's and the API's keys are stored in movement_requests as
-- "api:<token name>:<key>" (a token name has at most 48 characters, a key
-- 200): the column's limit rises from 200 to 256 so every key the API
-- accepts fits.
ALTER TABLE api_idempotency_keys
  ADD COLUMN network_class text NOT NULL DEFAULT '',
  ADD COLUMN location text,
  DROP CONSTRAINT api_idempotency_keys_pkey,
  ADD PRIMARY KEY (client, network_class, idempotency_key);

ALTER TABLE movement_requests
  DROP CONSTRAINT movement_requests_idempotency_key_check,
  ADD CONSTRAINT movement_requests_idempotency_key_check
    CHECK (length(idempotency_key) BETWEEN 1 AND 256);
