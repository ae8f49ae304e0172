-- qtg.api.tokens: API clients' bearer tokens.
--
-- A token is "qtg_" followed by 43 characters of random base64url (256
-- bits); only its SHA-256 is stored (api_tokens.token_hash), so the table
-- leaking does not give anyone a usable token.  The token is shown once, at
-- creation.  A token's principal is
--   { actor = "api:<name>", kind = "api_client", name = <name>, roles = {...}, own = bool }
-- and its roles say which routes it may call (qtg.api.routes); own: the
-- token's scope is its own requests (qtg.api.ownership).  A token serves
-- one network class: a daemon of another class answers it 401 (a token
-- made before sql/0198 has none and serves every class).
local qtg = require "qtg"
local canon = require "qtg.canon_json"
local problem = require "qtg.api.problem"
local principals = require "qtg.principals"

local M = {}

M.ROLES = { "read", "operate", "approve", "admin" }
local ROLE_SET = { read = true, operate = true, approve = true, admin = true }
M.ROLE_SET = ROLE_SET
M.NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]*$"
M.MAX_NAME = 48
M.PREFIX_LEN = 10

local function new_secret()
  local raw = qtg.crypto.random_bytes(32)
  -- base64url without padding, from the bytes (43 characters)
  local alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
  local out, bits, nbits = {}, 0, 0
  for i = 1, #raw do
    bits = bits * 256 + raw:byte(i)
    nbits = nbits + 8
    while nbits >= 6 do
      nbits = nbits - 6
      local idx = math.floor(bits / 2 ^ nbits) % 64
      out[#out + 1] = alphabet:sub(idx + 1, idx + 1)
    end
    bits = bits % (2 ^ nbits)
  end
  if nbits > 0 then
    local idx = (bits * 2 ^ (6 - nbits)) % 64
    out[#out + 1] = alphabet:sub(idx + 1, idx + 1)
  end
  return "qtg_" .. table.concat(out)
end

function M.hash(token) return qtg.crypto.sha256_hex(token) end

-- parse_roles("read,approve") -> array, or nil, why
function M.parse_roles(text)
  if type(text) ~= "string" or text == "" then return nil, "roles are required (read, operate, approve, admin)" end
  local roles, seen = canon.array(), {}
  for r in (text .. ","):gmatch("([^,]*),") do
    r = r:match("^%s*(.-)%s*$")
    if not ROLE_SET[r] then return nil, ("unknown role %q (read, operate, approve, admin)"):format(r) end
    if not seen[r] then seen[r] = true; roles[#roles + 1] = r end
  end
  return roles
end

function M.check_name(name)
  if type(name) ~= "string" or #name > M.MAX_NAME or not name:match(M.NAME_PATTERN) then
    return nil, "a token name is 1 to 48 characters of letters, digits, . _ - (starting with a letter or digit)"
  end
  return true
end

-- The scopes of a token: its whole network class, or its own requests
-- (sql/0191), which read and operate only.
M.SCOPES = { class = true, own = true }
M.OWN_ROLES = { read = true, operate = true }

-- check_scope(scope, roles) -> true, or nil, why
function M.check_scope(scope, roles)
  if not M.SCOPES[scope] then return nil, "a token's scope is class or own" end
  if scope == "own" then
    for _, r in ipairs(roles) do
      if not M.OWN_ROLES[r] then
        return nil, ("a token of scope own holds read and operate only (not %s): approving needs other "
          .. "clients' requests, admin administers the whole class"):format(r)
      end
    end
  end
  return true
end

-- check_class(class) -> true, or nil, why: a network class as
-- MG_NETWORK_CLASS takes one (src/qtg_settings.c).
function M.check_class(class)
  if type(class) ~= "string" or #class > 32 or not class:match("^[a-z0-9_-]+$") then
    return nil, "a network class is 1 to 32 characters of a-z, 0-9, _ or -"
  end
  return true
end

-- create(s, {name=, roles=array, scope=, network_class=, expires_in_seconds=,
--            created_by=}) -> token text, row.  The token serves that one
-- network class (sql/0198).
function M.create(s, args)
  local ok, why = M.check_name(args.name)
  if not ok then problem.raise("invalid_input", "%s", why) end
  ok, why = M.check_class(args.network_class)
  if not ok then problem.raise("invalid_input", "%s", why) end
  local scope = args.scope or "class"
  ok, why = M.check_scope(scope, args.roles)
  if not ok then problem.raise("invalid_input", "%s", why) end
  local secret = new_secret()
  local rows = s:query([[
    INSERT INTO api_tokens (name, token_prefix, token_hash, roles, created_by, expires_at, scope, network_class)
    VALUES ($1, $2, $3, $4::text[], $5,
            CASE WHEN $6::float8 IS NULL THEN NULL ELSE clock_timestamp() + $6::float8 * interval '1 second' END,
            $7, $8)
    ON CONFLICT (name) WHERE revoked_at IS NULL DO NOTHING
    RETURNING id, name, token_prefix, roles, created_at, expires_at, scope, network_class]],
    args.name, secret:sub(1, M.PREFIX_LEN), M.hash(secret),
    "{" .. table.concat(args.roles, ",") .. "}", args.created_by, args.expires_in_seconds, scope,
    args.network_class)
  if not rows[1] then
    problem.raise("conflict", "a live token named %s exists; revoke it first", args.name)
  end
  require("qtg.api.clients").ensure(s, args.name)
  require("qtg.outbox").audit(s, args.created_by, "api_token.create", "api_token", rows[1].id, nil,
    { name = args.name, roles = args.roles, scope = scope, network_class = args.network_class,
      expires_at = rows[1].expires_at })
  return secret, rows[1]
end

function M.list(s)
  return s:query([[
    SELECT id, name, token_prefix, array_to_string(roles, ',') AS roles, scope, network_class, created_by, created_at,
           expires_at, revoked_at,
           CASE WHEN revoked_at IS NOT NULL THEN 'revoked'
                WHEN expires_at IS NOT NULL AND expires_at <= now() THEN 'expired'
                ELSE 'live' END AS status
      FROM api_tokens ORDER BY created_at, name]])
end

-- revoke(s, name, actor) -> number of tokens revoked (0 or 1)
function M.revoke(s, name, actor)
  return s:transaction(function()
    local rows = s:query([[
      UPDATE api_tokens SET revoked_at = clock_timestamp(), revoked_by = $2
       WHERE name = $1 AND revoked_at IS NULL RETURNING id]], name, actor)
    for _, r in ipairs(rows) do
      require("qtg.outbox").audit(s, actor, "api_token.revoke", "api_token", r.id, nil, { name = name })
    end
    return #rows
  end)
end

-- authenticate(s, header) -> principal, or raises unauthorized.
function M.authenticate(s, header)
  if type(header) ~= "string" or header == "" then
    problem.raise("unauthorized", "this endpoint needs an API token: Authorization: Bearer <token>")
  end
  local token = header:match("^[Bb][Ee][Aa][Rr][Ee][Rr] +([%w_%-%.~+/]+=*)%s*$")
  if not token then
    problem.raise("unauthorized", "the Authorization header is not 'Bearer <token>'")
  end
  local row = s:query([[
    SELECT id, name, roles, scope, revoked_at IS NOT NULL AS revoked,
           expires_at IS NOT NULL AND expires_at <= now() AS expired,
           network_class IS NOT NULL AND network_class <> $2 AS elsewhere
      FROM api_tokens WHERE token_hash = $1]], M.hash(token), qtg.settings.network_class)[1]
  if not row then problem.raise("unauthorized", "the API token is not known") end
  if row.revoked then problem.raise("unauthorized", "the API token was revoked") end
  if row.expired then problem.raise("unauthorized", "the API token has expired") end
  if row.elsewhere then
    problem.raise("unauthorized", "the API token serves another network class than this daemon's (%s)",
      qtg.settings.network_class)
  end
  local roles = {}
  for r in tostring(row.roles):gmatch("[%w_]+") do roles[#roles + 1] = r end
  return { actor = "api:" .. row.name, kind = "api_client", name = row.name, roles = roles,
           token_id = row.id, own = row.scope == "own" }
end

-- has_role(principal, role): role "any" is every valid token's; any other
-- role is held only when given by name, as the lifecycle functions check
-- it (qtg.principals): admin is not also operate or approve, so the route
-- and the action it calls never disagree, and a token made to administer
-- is not also one that moves money.
function M.has_role(principal, role)
  return role == "any" or principals.has_role(principal, role)
end

return M
