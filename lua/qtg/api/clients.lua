-- qtg.api.clients: an API client's own callback signing key.  The key is
-- derived in C (qtg.api_keys) from a secret and the key id
-- "<scheme>.<name>.<generation>": scheme m from the clients' own secret
-- (MG_CALLBACK_CLIENT_KEY_FILE), c from the host's callback key (before that
-- setting; its every holder can compute such a key).  api_clients holds the
-- generation and the scheme of the client's current key; a client made
-- while the process has the clients' secret starts on m, and a rotation
-- moves the client onto the scheme the process has.
-- Rotation, with both keys valid at the receiver meanwhile:
--   1. `qtgd tokens callback-key NAME --next` shows the next key: the
--      client adds it beside its current one;
--   2. `qtgd tokens rotate-callback-key NAME`: callbacks written from now on
--      are signed with the next key (rows already written keep theirs);
--   3. once its older rows are delivered, the client drops the old key.
local qtg = require "qtg"
local problem = require "qtg.api.problem"

local M = {}

function M.key_id(scheme, name, generation) return ("%s.%s.%d"):format(scheme, name, generation) end

function M.ensure(s, name)
  s:query("INSERT INTO api_clients (name, key_scheme) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING", name,
    qtg.api_keys.scheme())
  return s:query("SELECT * FROM api_clients WHERE name = $1", name)[1]
end

local function get(s, name)
  local row = s:query("SELECT * FROM api_clients WHERE name = $1", name)[1]
  if not row then problem.raise("not_found", "no API client named %s", tostring(name)) end
  return row
end

-- key(s, name, next) -> key_id, hex key (or nil, err without a callback key)
function M.key(s, name, next_generation)
  local row = get(s, name)
  local id = next_generation and M.key_id(qtg.api_keys.scheme(), name, row.callback_key_generation + 1)
    or M.key_id(row.key_scheme, name, row.callback_key_generation)
  local key, err = qtg.api_keys.client_key(id)
  return id, key, err
end

-- rotate(s, name, actor) -> new key id
function M.rotate(s, name, actor)
  return s:transaction(function()
    get(s, name)
    local row = s:query([[
      UPDATE api_clients SET callback_key_generation = callback_key_generation + 1, key_scheme = $2,
             rotated_at = clock_timestamp() WHERE name = $1 RETURNING *]], name, qtg.api_keys.scheme())[1]
    local id = M.key_id(row.key_scheme, name, row.callback_key_generation)
    require("qtg.outbox").audit(s, actor, "api_client.rotate_callback_key", "api_client", name, nil,
      { key_id = id })
    return id
  end)
end

return M
