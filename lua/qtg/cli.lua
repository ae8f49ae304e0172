-- qtg.cli: the commands qtgd hands to Lua.  C (src/main.c) checks the
-- command name and starts the host; this table says which module runs it.
-- Each command module exports run(args) -> exit code.
local M = {}

local commands = {
  run = "qtg.main",
  migrate = "qtg.cli.migrate",
  exec = "qtg.cli.exec",
  templates = "qtg.cli.templates",
  check = "qtg.cli.check",
  audit = "qtg.cli.audit",
  tokens = "qtg.cli.tokens",
  operators = "qtg.cli.operators",
}

-- unbound(s): lift the pooled sessions' statement and lock bounds
-- (MG_DB_STATEMENT_TIMEOUT_SECONDS, MG_DB_LOCK_TIMEOUT_SECONDS) on s, for a
-- command whose one statement may rightly run long (a migration, the audit
-- trail's walk), and the process's slow-statement lines with them
-- (MG_DB_SLOW_WARN_SECONDS: a long walk is no stall).  The SET runs under
-- the bound it lifts: one the server cancelled (57014: a tiny bound on a
-- loaded machine) is sent again.
function M.unbound(s)
  require("qtg").db.slow_watch_off()
  for try = 1, 5 do
    local ok, err = pcall(s.exec, s, "SET statement_timeout = 0; SET lock_timeout = 0")
    if ok then return end
    if try == 5 or type(err) ~= "table" or err.sqlstate ~= "57014" then error(err, 0) end
  end
end

function M.main(cmd, args)
  local name = commands[cmd]
  if not name then
    io.stderr:write("qtgd: no Lua module handles the command '", tostring(cmd), "'\n")
    return 2
  end
  local ok, mod = pcall(require, name)
  if not ok then
    io.stderr:write("qtgd ", cmd, ": cannot load ", name, ": ", tostring(mod), "\n")
    return 1
  end
  return mod.run(args)
end

return M
