-- qtgd tokens: API tokens (lua/qtg/api/tokens.lua).
--   qtgd tokens create --name NAME --roles read,operate,approve,admin [--expires-in DURATION] [--scope own]
--                      [--class CLASS]
--   qtgd tokens list
--   qtgd tokens revoke NAME
--   qtgd tokens callback-key NAME [--next]
--   qtgd tokens rotate-callback-key NAME
-- create prints what it made, then the token alone on the last line: it is
-- shown this once and stored only as a hash.  DURATION: seconds, or a number
-- with s, m, h or d.  A token serves one network class: --class, else this
-- process's MG_NETWORK_CLASS.  Audited as operator:<user> of the shell.
local qtg = require "qtg"
local tokens = require "qtg.api.tokens"
local clients = require "qtg.api.clients"

local M = {}

local function usage(msg)
  io.stderr:write("qtgd tokens: ", msg, "\n",
    "usage: qtgd tokens create --name NAME --roles read,operate,approve,admin [--expires-in 30d] [--scope own]\n",
    "                          [--class CLASS (default: MG_NETWORK_CLASS)]\n",
    "       qtgd tokens list\n       qtgd tokens revoke NAME\n",
    "       qtgd tokens callback-key NAME [--next]\n       qtgd tokens rotate-callback-key NAME\n")
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
    return "the API tables are missing: run `qtgd migrate`"
  end
  return require("qtg.errors").text(e)
end

local COMMANDS = {}

function COMMANDS.create(args)
  local o, err = opts(args, 2)
  if not o then return usage(err) end
  for k in pairs(o) do
    if k ~= "name" and k ~= "roles" and k ~= "expires-in" and k ~= "scope" and k ~= "class" then
      return usage("unknown option --" .. k)
    end
  end
  local ok, why = tokens.check_name(o.name)
  if not o.name then return usage("--name is required") end
  if not ok then return usage(why) end
  local roles, rwhy = tokens.parse_roles(o.roles)
  if not roles then return usage(rwhy) end
  local scope = o.scope or "class"
  local sok, swhy = tokens.check_scope(scope, roles)
  if not sok then return usage(swhy) end
  local class = o.class or qtg.settings.network_class
  local class_ok, class_why = tokens.check_class(class)
  if not class_ok then return usage("--class: " .. class_why) end
  local expires
  if o["expires-in"] then
    expires = duration(o["expires-in"])
    if not expires then return usage("--expires-in takes seconds or a number with s, m, h or d") end
  end
  local cok, secret, row = pcall(qtg.db.with_session, function(s)
    return s:transaction(function()
      return tokens.create(s, { name = o.name, roles = roles, scope = scope, network_class = class,
                                expires_in_seconds = expires, created_by = whoami() })
    end)
  end)
  if not cok then
    io.stderr:write("qtgd tokens create: ", db_error(secret), "\n")
    return 1
  end
  io.stdout:write(("token %s created: roles %s, scope %s, network class %s, expires %s\n"):format(row.name,
    table.concat(roles, ","), scope == "own" and "its own requests" or "the network class", class,
    row.expires_at ~= qtg.db.NULL and tostring(row.expires_at) or "never"))
  local kok, key_id, key, kerr = pcall(qtg.db.with_session, clients.key, row.name)
  if kok and key then
    io.stdout:write(("callbacks of this client's requests are signed with key id %s, key %s\n"):format(key_id, key))
  else
    io.stdout:write("no callback key is configured (MG_CALLBACK_KEY_FILE): this client's callbacks cannot be signed yet: ",
      tostring(kok and (kerr and kerr.message) or key_id), "\n")
  end
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
  local line = "%-24s %-8s %-12s %-28s %-6s %-16s %-28s %s\n"
  io.stdout:write(line:format("NAME", "STATUS", "PREFIX", "ROLES", "SCOPE", "CLASS", "EXPIRES", "CREATED BY"))
  for _, r in ipairs(rows) do
    io.stdout:write(line:format(r.name, r.status, r.token_prefix, r.roles, r.scope,
      r.network_class ~= qtg.db.NULL and r.network_class or "(every class)",
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

COMMANDS["callback-key"] = function(args)
  local name, flag = args[2], args[3]
  if not name or #args > 3 or (flag and flag ~= "--next") then return usage("callback-key NAME [--next]") end
  local ok, key_id, key, err = pcall(qtg.db.with_session, clients.key, name, flag == "--next")
  if not ok then
    io.stderr:write("qtgd tokens callback-key: ", db_error(key_id), "\n")
    return 1
  end
  if not key then
    io.stderr:write("qtgd tokens callback-key: ", tostring(err and err.message or err), "\n")
    return 1
  end
  io.stdout:write(("key id %s%s\n%s\n"):format(key_id, flag and " (next; not used until rotate-callback-key)" or "", key))
  return 0
end

COMMANDS["rotate-callback-key"] = function(args)
  if #args ~= 2 then return usage("rotate-callback-key NAME") end
  local ok, id = pcall(qtg.db.with_session, clients.rotate, args[2], whoami())
  if not ok then
    io.stderr:write("qtgd tokens rotate-callback-key: ", db_error(id), "\n")
    return 1
  end
  io.stdout:write("callbacks written from now on are signed with key id ", id, "\n")
  return 0
end

function M.run(args)
  local cmd = COMMANDS[args[1] or ""]
  if not cmd then return usage("a subcommand is required: create, list or revoke") end
  return cmd(args)
end

return M
