-- qtgd templates load DIR | check DIR | list
--   load   validate every DIR/*.json and compile them into plan versions (a new
--          version only when a template's content changed); all or nothing:
--          one invalid file refuses the whole directory.  Exit 0, or 1.
--   check  validate only (no database writes).
--   list   the loaded templates and their latest versions.
local M = {}

local function usage()
  io.stderr:write("usage: qtgd templates load DIR | check DIR | list\n")
  return 2
end

local function print_errors(errors)
  for _, e in ipairs(errors) do io.stderr:write("qtgd templates: ", e, "\n") end
  io.stderr:write(string.format("qtgd templates: refused (%d error%s); nothing was written\n",
    #errors, #errors == 1 and "" or "s"))
end

-- one pooled session for fn(s), released whatever happens
local function with_session(fn) return require("qtg").db.with_session(fn) end

local commands = {}

function commands.load(dir)
  if not dir then return usage() end
  local templates = require "qtg.templates"
  local results, errors = with_session(function(s) return templates.load_dir(s, dir) end)
  if not results then print_errors(errors); return 1 end
  for _, r in ipairs(results) do
    io.stdout:write(string.format("%s: version %d (%s)\n", r.template_key, r.version,
      r.created and "new" or "unchanged"))
  end
  return 0
end

function commands.check(dir)
  if not dir then return usage() end
  local templates = require "qtg.templates"
  local compiled, errors = templates.compile_dir(dir)
  if not compiled then print_errors(errors); return 1 end
  for _, c in ipairs(compiled) do
    io.stdout:write(string.format("%s: ok (%d nodes, compiled plan %s)\n", c.template_key,
      #c.nodes, c.compiled_plan_hash:sub(1, 12)))
  end
  return 0
end

function commands.list()
  local rows = with_session(function(s)
    return s:query([[
      SELECT DISTINCT ON (t.template_key) t.template_key, pv.version, pv.compiled_plan_hash,
             pv.created_at, (SELECT count(*) FROM plan_nodes WHERE plan_version_id = pv.id) AS nodes
        FROM movement_templates t JOIN plan_versions pv ON pv.template_id = t.id
       ORDER BY t.template_key, pv.version DESC]])
  end)
  for _, r in ipairs(rows) do
    io.stdout:write(string.format("%-32s v%-4d %2d nodes  %s  %s\n", r.template_key, r.version,
      r.nodes, r.compiled_plan_hash:sub(1, 12), r.created_at))
  end
  return 0
end

function M.run(args)
  args = args or {}
  local i = 1
  if args[1] == "templates" then i = 2 end
  local cmd = commands[args[i]]
  if not cmd then return usage() end
  local ok, res = pcall(cmd, args[i + 1])
  if not ok then
    io.stderr:write("qtgd templates: ", type(res) == "table" and tostring(res.message) or tostring(res), "\n")
    return 1
  end
  return res
end

return M
