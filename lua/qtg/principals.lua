-- qtg.principals: who is acting.  A principal is a table
--   { actor = "operator:alice", kind = "operator" | "api_client" | "system",
--     name = "alice", roles = { "approve", "operate", ... } }
-- with roles from ROLES (read, operate, approve, admin).  Actor strings:
--   operator:<name>   a console user mapped from its uid (table operators)
--   api:<token name>  an API client (the HTTP API builds its principal)
--   system:<worker>   the daemon's own workers
--   policy:<rule>     the approval policy deciding by itself
--   console:<uid>     a console uid with no operator row: may read only
--                     (every role while no operator is enrolled at all)
--
-- The trust boundary is where a principal is built: the console session
-- (resolve_uid) and the API (from its token).  In-process Lua (workers, the
-- demo and bench drivers, specs) is already trusted with the database, so a
-- bare actor string passed to qtg.requests is taken as that caller's name
-- with every role (from_actor); the console never passes a string.
local M = {}

M.ROLES = { read = true, operate = true, approve = true, admin = true }
M.ALL_ROLES = { "read", "operate", "approve", "admin" }

local KINDS = { operator = "operator", api = "api_client", system = "system",
                policy = "system", console = "operator" }

local ACTOR = "^([a-z]+):([%w%._%-@]+)$"
local NAME = "^[a-z][a-z0-9_.-]*$"

local refuse = require("qtg.errors").raise

local function role_set(roles)
  local set = {}
  for _, r in ipairs(roles or {}) do set[r] = true end
  return set
end

-- is(p) -> true when p is a well-formed principal table.
function M.is(p)
  if type(p) ~= "table" or type(p.actor) ~= "string" or not p.actor:match(ACTOR) then return false end
  if type(p.roles) ~= "table" then return false end
  for _, r in ipairs(p.roles) do if not M.ROLES[r] then return false end end
  return true
end

-- from_actor(actor) -> the principal of an in-process caller's actor string.
function M.from_actor(actor)
  local prefix, name = type(actor) == "string" and actor:match(ACTOR)
  if not prefix then
    refuse("invalid_input", "actor must look like operator:<name>, system:<worker> or console:<uid>, got %s",
      tostring(actor))
  end
  return { actor = actor, kind = KINDS[prefix] or "system", name = name, roles = M.ALL_ROLES }
end

-- of(who) -> principal: a principal table as given (validated), or the
-- principal of an actor string.
function M.of(who)
  if type(who) == "table" then
    if not M.is(who) then
      refuse("invalid_input", "a principal needs actor (kind:name) and roles from read, operate, approve, admin")
    end
    return who
  end
  return M.from_actor(who)
end

function M.has_role(p, role)
  return role_set(p.roles)[role] == true
end

-- require_role(p, role, action): refuse unless p holds role.
function M.require_role(p, role, action)
  if not M.has_role(p, role) then
    refuse("forbidden", "%s may not %s: it needs the %s role (it has: %s)", p.actor, action, role,
      #p.roles > 0 and table.concat(p.roles, ", ") or "none")
  end
end

-- roles_of(text) -> the roles of a text[] column's text ("{read,approve}").
local function roles_of(text)
  local roles = {}
  for r in tostring(text):gmatch("[%a]+") do if M.ROLES[r] then roles[#roles + 1] = r end end
  return roles
end

local function operator_principal(row)
  return { actor = "operator:" .. row.name, kind = "operator", name = row.name, roles = roles_of(row.roles) }
end

-- resolve_uid(s, uid) -> the principal of a console uid: its operator, or
-- console:<uid> with the read role only.
function M.resolve_uid(s, uid)
  local row = s:query("SELECT name, roles::text AS roles FROM operators WHERE uid = $1", uid)[1]
  if row then return operator_principal(row) end
  return { actor = "console:" .. tostring(uid), kind = "operator", name = tostring(uid), roles = { "read" } }
end

-- console(s, uid) -> the principal of a console session's uid.  Until the
-- first operator is enrolled (a fresh install), a console uid acts as
-- console:<uid> with every role, so the first admin can enroll operators;
-- from then on it is resolve_uid's answer.
function M.console(s, uid)
  if not s:query("SELECT 1 FROM operators LIMIT 1")[1] then
    return { actor = "console:" .. tostring(uid), kind = "operator", name = tostring(uid), roles = M.ALL_ROLES }
  end
  return M.resolve_uid(s, uid)
end

-- operator(s, name) -> the principal of a named operator, or nil.
function M.operator(s, name)
  local row = s:query("SELECT name, roles::text AS roles FROM operators WHERE name = $1", name)[1]
  return row and operator_principal(row) or nil
end

-- ---- who an actor string is now -------------------------------------------
-- A vote is stored under its actor string; whether it still counts depends
-- on who that actor is when the quorum is counted.  By prefix:
--   operator:<name>  its operators row, with the row's roles (none: gone)
--   api:<name>       its live API token (not revoked, not expired), with
--                    the token's roles (none: gone)
--   console:<uid>    a numeric uid as the console resolves it now (every
--                    role while no operator is enrolled, its operator's
--                    roles, else read only); any other console:<word>, like
--                    system:<worker>, is an in-process caller: every role
--   policy:<rule>    never a voter
local function in_process(actor, name)
  return { actor = actor, kind = "system", name = name, roles = M.ALL_ROLES }
end

-- With lock, the rows are read FOR SHARE: a vote is checked and counted in
-- its approval's transaction, and a removal, a role change or a revocation
-- committing meanwhile waits for it (then applies to later votes), so no
-- vote counts for a voter already gone when it commits.  A reader (the
-- approval status a GET shows) takes no lock.
local function locked(sql, lock) return lock and sql .. " FOR SHARE" or sql end

-- since (a vote's created_at, or nil): a row made after it is another
-- principal under the same name, who did not cast that vote (a removed
-- operator added again, a revoked token's name given to a new token), so
-- for that vote the actor is gone.  `born` is NULL without since.
local BORN = "created_at <= $2::timestamptz AS born"
local function cast_it(row, since) return since == nil or row.born == true end

local CURRENT = {
  operator = function(s, _, name, lock, since)
    local row = s:query(locked("SELECT name, roles::text AS roles, " .. BORN .. " FROM operators WHERE name = $1",
      lock), name, since)[1]
    return row and cast_it(row, since) and operator_principal(row) or nil
  end,
  api = function(s, actor, name, lock, since)
    local row = s:query(locked("SELECT roles::text AS roles, " .. BORN .. [[ FROM api_tokens
                           WHERE name = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())]], lock),
      name, since)[1]
    return row and cast_it(row, since) and { actor = actor, kind = "api_client", name = name,
                                             roles = roles_of(row.roles) } or nil
  end,
  console = function(s, actor, uid, lock, since)
    if not (uid:match("^%d+$") and #uid <= 15) then return in_process(actor, uid) end
    local row = s:query(locked("SELECT name, roles::text AS roles, " .. BORN .. " FROM operators WHERE uid = $1",
      lock), tonumber(uid), since)[1]
    if row then return cast_it(row, since) and operator_principal(row) or nil end
    return M.console(s, tonumber(uid))
  end,
  system = function(_, actor, name) return in_process(actor, name) end,
}

-- current(s, actor[, lock[, since]]) -> the principal actor is now, or nil
-- when it is gone (a removed operator, a revoked or expired token, one
-- made after since under the same name) or never votes; lock: as a vote
-- counts it (its row FOR SHARE until the transaction ends).
function M.current(s, actor, lock, since)
  if type(actor) ~= "string" then return nil end
  local prefix, name = actor:match(ACTOR)
  local resolve = prefix and CURRENT[prefix]
  return resolve and resolve(s, actor, name, lock, since) or nil
end

-- current_votes(s, excluded, votes, holds[, lock]) -> the votes (rows with
-- a `principal` and their `created_at`) that count, in their order: each
-- by a principal that exists now and existed when it voted (current,
-- since the vote's time) and holds(principal) says may vote, one per
-- principal as it resolves now, never excluded's (the request's initiator,
-- a change's proposer: in any spelling that resolves to the same one).
-- lock: as current's.  A request's approvals and an address book change's
-- are counted by it.
function M.current_votes(s, excluded, votes, holds, lock)
  local seen = { [excluded] = true }
  local them = M.current(s, excluded, lock)
  if them then seen[them.actor] = true end
  local out = {}
  for _, v in ipairs(votes) do
    local now = not seen[v.principal] and M.current(s, v.principal, lock, assert(v.created_at, "a vote's created_at"))
    if now and not seen[now.actor] and holds(now) then
      seen[v.principal], seen[now.actor] = true, true
      out[#out + 1] = v
    end
  end
  return out
end

-- ---- the operators table (qtgd operators, console) ------------------------

local function check_roles(roles)
  if type(roles) ~= "table" or #roles == 0 then
    refuse("invalid_input", "roles must be a non-empty array of read, operate, approve, admin")
  end
  for _, r in ipairs(roles) do
    if not M.ROLES[r] then refuse("invalid_input", "unknown role %s (read, operate, approve, admin)", tostring(r)) end
  end
end

-- add(s, name, uid, roles, by) -> row; by must hold admin.
function M.add(s, name, uid, roles, by)
  by = M.of(by)
  M.require_role(by, "admin", "add operators")
  if type(name) ~= "string" or not name:match(NAME) or #name > 63 then
    refuse("invalid_input", "operator name must match [a-z][a-z0-9_.-]* (at most 63), got %s", tostring(name))
  end
  if uid ~= nil and (type(uid) ~= "number" or uid < 0 or uid ~= math.floor(uid)) then
    refuse("invalid_input", "uid must be an integer >= 0, got %s", tostring(uid))
  end
  check_roles(roles)
  local fn = function()
    local row = s:query([[
      INSERT INTO operators (name, uid, roles, created_by) VALUES ($1, $2, $3::text[], $4)
      ON CONFLICT DO NOTHING RETURNING name, uid, roles::text AS roles]],
      name, uid, "{" .. table.concat(roles, ",") .. "}", by.actor)[1]
    if not row then refuse("invalid_input", "operator %s or uid %s is already enrolled", name, tostring(uid)) end
    require("qtg.outbox").audit(s, by.actor, "operator.add", "operator", name, nil,
      { uid = uid, roles = roles })
    return row
  end
  if s:in_transaction() then return fn() end
  return s:transaction(fn)
end

function M.remove(s, name, by)
  by = M.of(by)
  M.require_role(by, "admin", "remove operators")
  local fn = function()
    local row = s:query("DELETE FROM operators WHERE name = $1 RETURNING name, uid, roles::text AS roles", name)[1]
    if not row then refuse("not_found", "no operator %s", tostring(name)) end
    require("qtg.outbox").audit(s, by.actor, "operator.remove", "operator", name, nil,
      { uid = row.uid, roles = row.roles })
    return row
  end
  if s:in_transaction() then return fn() end
  return s:transaction(fn)
end

function M.list(s)
  return s:query("SELECT name, uid, roles::text AS roles, created_by, created_at FROM operators ORDER BY name")
end

return M
