-- qtg.api.clients: an API client's own callback signing key.  The key is
-- derived in C (qtg.api_keys) from the host's callback key and the key id
-- "c.<name>.<generation>"; api_clients holds only the generation.
-- Rotation, with both keys valid at the receiver meanwhile:
--   1. `qtgd tokens callback-key NAME --next` shows the next key: the
--      client adds it beside its current one;
--   2. `qtgd tokens rotate-callback-key NAME`: callbacks written from now on
--      are signed with the next key (rows already written keep theirs);
--   3. once its older rows are delivered, the client drops the old key.
local qtg = require "qtg"
local problem = require "qtg.api.problem"

local M = {}

function M.key_id(name, generation) return ("c.%s.%d"):format(name, generation) end

function M.ensure(s, name)
  s:query("INSERT INTO api_clients (name) VALUES ($1) ON CONFLICT (name) DO NOTHING", name)
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
  local id = M.key_id(name, row.callback_key_generation + (next_generation and 1 or 0))
  local key, err = qtg.api_keys.client_key(id)
  return id, key, err
end

-- rotate(s, name, actor) -> new key id
function M.rotate(s, name, actor)
  return s:transaction(function()
    get(s, name)
    local row = s:query([[
      UPDATE api_clients SET callback_key_generation = callback_key_generation + 1,
             rotated_at = clock_timestamp() WHERE name = $1 RETURNING *]], name)[1]
    local id = M.key_id(name, row.callback_key_generation)
    require("qtg.outbox").audit(s, actor, "api_client.rotate_callback_key", "api_client", name, nil,
      { key_id = id })
    return id
  end)
end

return M
