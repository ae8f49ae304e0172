-- qtgd operators add NAME UID ROLES | remove NAME | list
--   add     map console uid UID to operator NAME with ROLES (comma-separated:
--           read, operate, approve, admin)
--   remove  remove operator NAME
--   list    the operators
-- Run by whoever holds the database credentials on the host (as root
-- installs the package); audited as system:qtgd-operators.
local M = {}

local ACTOR = "system:qtgd-operators"

local function usage()
  io.stderr:write("usage: qtgd operators add NAME UID ROLES | remove NAME | list\n")
  return 2
end

-- one pooled session for fn(s), released whatever happens
local function with_session(fn) return require("qtg").db.with_session(fn) end

local commands = {}

function commands.add(name, uid, roles, extra)
  if not name or not uid or not roles or extra then return usage() end
  local n = tonumber(uid)
  if not n or not uid:match("^%d+$") then
    io.stderr:write("qtgd operators: UID must be a non-negative integer, got ", uid, "\n")
    return 2
  end
  local list = {}
  for r in roles:gmatch("[^,]+") do list[#list + 1] = r end
  local row = with_session(function(s) return require("qtg.principals").add(s, name, n, list, ACTOR) end)
  io.stdout:write(string.format("operator %s: uid %s, roles %s\n", row.name, tostring(row.uid), row.roles))
  return 0
end

function commands.remove(name, extra)
  if not name or extra then return usage() end
  with_session(function(s) return require("qtg.principals").remove(s, name, ACTOR) end)
  io.stdout:write("operator ", name, " removed\n")
  return 0
end

function commands.list(extra)
  if extra then return usage() end
  local rows = with_session(function(s) return require("qtg.principals").list(s) end)
  for _, r in ipairs(rows) do
    io.stdout:write(string.format("%-24s uid %-8s %s\n", r.name, tostring(r.uid), r.roles))
  end
  return 0
end

function M.run(args)
  args = args or {}
  local i = args[1] == "operators" and 2 or 1
  local cmd = commands[args[i] or ""]
  if not cmd then return usage() end
  local ok, rc = pcall(cmd, unpack(args, i + 1))
  if not ok then
    io.stderr:write("qtgd operators: ", tostring(rc), "\n")
    return 1
  end
  return rc
end

return M
