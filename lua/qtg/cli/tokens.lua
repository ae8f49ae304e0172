-- qtgd tokens: API tokens (lua/qtg/api/tokens.lua).
--   qtgd tokens create --name NAME --roles read,operate,approve,admin [--expires-in DURATION]
--   qtgd tokens list
--   qtgd tokens revoke NAME
-- create prints what it made, then the token alone on the last line: it is
-- shown this once and stored only as a hash.  DURATION: seconds, or a number
-- with s, m, h or d.  Audited as operator:<user> of the shell.
local qtg = require "qtg"
local tokens = require "qtg.api.tokens"

local M = {}

local function usage(msg)
  io.stderr:write("qtgd tokens: ", msg, "\n",
    "usage: qtgd tokens create --name NAME --roles read,operate,approve,admin [--expires-in 30d]\n",
    "       qtgd tokens list\n       qtgd tokens revoke NAME\n")
  return 2
end

local UNITS = { s = 1, m = 60, h = 3600, d = 86400 }

local function duration(text)
  local n, unit = tostring(text):match("^(%d+)([smhd]?)$")
  if not n or tonumber(n) == 0 then return nil end
  return tonumber(n) * (UNITS[unit] or 1)
end

local function whoami()
  local user = os.getenv("SUDO_USER") or os.getenv("USER") or os.getenv("LOGNAME") or "unknown"
  user = user:gsub("[^%w%._%-@]", "_")
  return "operator:" .. user
end

local function opts(args, from)
  local o, i = {}, from
  while i <= #args do
    local k = args[i]
    local name = k:match("^%-%-([%w%-]+)$")
    if not name or args[i + 1] == nil then return nil, "unexpected argument " .. k end
    o[name] = args[i + 1]
    i = i + 2
  end
  return o
end

local function db_error(e)
  if type(e) == "table" and e.sqlstate == "42P01" then
    return "the api_tokens table is missing: run `qtgd migrate`"
  end
  return tostring(type(e) == "table" and (e.message or e.kind) or e)
end

local COMMANDS = {}

function COMMANDS.create(args)
  local o, err = opts(args, 2)
  if not o then return usage(err) end
  for k in pairs(o) do
    if k ~= "name" and k ~= "roles" and k ~= "expires-in" then return usage("unknown option --" .. k) end
  end
  local ok, why = tokens.check_name(o.name)
  if not o.name then return usage("--name is required") end
  if not ok then return usage(why) end
  local roles, rwhy = tokens.parse_roles(o.roles)
  if not roles then return usage(rwhy) end
  local expires
  if o["expires-in"] then
    expires = duration(o["expires-in"])
    if not expires then return usage("--expires-in takes seconds or a number with s, m, h or d") end
  end
  local cok, secret, row = pcall(qtg.db.with_session, function(s)
    return s:transaction(function()
      return tokens.create(s, { name = o.name, roles = roles, expires_in_seconds = expires, created_by = whoami() })
    end)
  end)
  if not cok then
    io.stderr:write("qtgd tokens create: ", db_error(secret), "\n")
    return 1
  end
  io.stdout:write(("token %s created: roles %s, expires %s\n"):format(row.name, table.concat(roles, ","),
    row.expires_at ~= qtg.db.NULL and tostring(row.expires_at) or "never"))
  io.stdout:write("it is shown once; keep it now (qtg stores only its hash):\n")
  io.stdout:write(secret, "\n")
  return 0
end

function COMMANDS.list(args)
  if #args > 1 then return usage("list takes no arguments") end
  local ok, rows = pcall(qtg.db.with_session, tokens.list)
  if not ok then
    io.stderr:write("qtgd tokens list: ", db_error(rows), "\n")
    return 1
  end
  io.stdout:write(("%-24s %-8s %-12s %-28s %-28s %s\n"):format("NAME", "STATUS", "PREFIX", "ROLES", "EXPIRES", "CREATED BY"))
  for _, r in ipairs(rows) do
    io.stdout:write(("%-24s %-8s %-12s %-28s %-28s %s\n"):format(r.name, r.status, r.token_prefix, r.roles,
      r.expires_at ~= qtg.db.NULL and tostring(r.expires_at) or "never", r.created_by))
  end
  return 0
end

function COMMANDS.revoke(args)
  if #args ~= 2 then return usage("revoke takes one token name") end
  local ok, n = pcall(qtg.db.with_session, tokens.revoke, args[2], whoami())
  if not ok then
    io.stderr:write("qtgd tokens revoke: ", db_error(n), "\n")
    return 1
  end
  if n == 0 then
    io.stderr:write("qtgd tokens revoke: no live token named ", args[2], "\n")
    return 1
  end
  io.stdout:write("token ", args[2], " revoked\n")
  return 0
end

function M.run(args)
  local cmd = COMMANDS[args[1] or ""]
  if not cmd then return usage("a subcommand is required: create, list or revoke") end
  return cmd(args)
end

return M
