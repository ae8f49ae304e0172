-- 0199_api_client_key_scheme.sql -- which secret an API client's callback
-- key derives from (src/lua_api_keys.c, docs/callbacks.md "The clients'
-- keys and the host key").
--
-- A client's key derived from the host's callback key only, which the
-- receivers of operator callbacks hold: each of them could compute any
-- client's key and sign a callback that client accepts, and rotating the
-- host key changed every client's key under the same key id.  With
-- MG_CALLBACK_CLIENT_KEY_FILE the keys derive from a secret of their own
-- (scheme 'm', key ids "m.<name>.<generation>").  api_clients.key_scheme is
-- the scheme of the client's current key: a client made while that setting
-- is there starts on 'm', and `qtgd tokens rotate-callback-key` moves one
-- onto it.  A callback row keeps the key id it was written with.
ALTER TABLE api_clients
  ADD COLUMN key_scheme text NOT NULL DEFAULT 'c' CHECK (key_scheme IN ('c', 'm'));

ALTER TABLE movement_callback_outbox DROP CONSTRAINT movement_callback_outbox_signing_key_id_check;
ALTER TABLE movement_callback_outbox ADD CONSTRAINT movement_callback_outbox_signing_key_id_check
  CHECK (signing_key_id ~ '^[cm]\.[A-Za-z0-9._-]+\.[0-9]+$');

CREATE OR REPLACE FUNCTION qtg_callback_signing_key() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.signing_key_id IS NULL THEN
    SELECT c.key_scheme || '.' || c.name || '.' || c.callback_key_generation INTO NEW.signing_key_id
      FROM movement_requests r JOIN api_clients c ON r.created_by = 'api:' || c.name
     WHERE r.id = NEW.request_id;
  END IF;
  RETURN NEW;
END $$;
