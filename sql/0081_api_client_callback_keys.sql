-- 0081_api_client_callback_keys.sql -- each API client signs its callbacks
-- with its own key (src/lua_api_keys.c derives it from the host's callback
-- key and the key id; nothing secret is stored here).
--
-- api_clients: the client's current key generation.  Its key id is
-- "c.<name>.<generation>"; rotating bumps the generation, and a receiver
-- keeps the old and the new key while rows signed with either are in flight.
CREATE TABLE api_clients (
  name                    text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,47}$'),
  callback_key_generation int NOT NULL DEFAULT 1 CHECK (callback_key_generation >= 1),
  created_at              timestamptz NOT NULL DEFAULT clock_timestamp(),
  rotated_at              timestamptz
);

-- The key id a callback row is signed with, fixed when the row is written:
-- the creating client's current key, or NULL (the host key) for requests
-- made by operators and workers.  A trigger, so that every writer of
-- callback rows (the outboxes, redelivery) gets it without knowing of it.
ALTER TABLE movement_callback_outbox ADD COLUMN signing_key_id text
  CHECK (signing_key_id ~ '^c\.[A-Za-z0-9._-]+\.[0-9]+$');

CREATE FUNCTION qtg_callback_signing_key() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.signing_key_id IS NULL THEN
    SELECT 'c.' || c.name || '.' || c.callback_key_generation INTO NEW.signing_key_id
      FROM movement_requests r JOIN api_clients c ON r.created_by = 'api:' || c.name
     WHERE r.id = NEW.request_id;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER movement_callback_outbox_signing_key BEFORE INSERT ON movement_callback_outbox
  FOR EACH ROW EXECUTE FUNCTION qtg_callback_signing_key();
