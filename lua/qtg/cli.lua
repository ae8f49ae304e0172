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
