-- spec/busted.lua -- run busted (Debian's lua-busted) inside qtgd, so specs
-- use the real C bindings:
--
--   build/qtgd exec spec/busted.lua [busted options] [spec files or dirs]
--
-- Why a wrapper and not /usr/bin/busted:
--   * the specs must run in a host task (queries, HTTP and sleeps yield to the
--     host's loop); `qtgd exec` runs this chunk in one.  busted runs every
--     spec file, describe, it and hook through xpcall and never in coroutines
--     of its own, and LuaJIT yields across xpcall, so test bodies -- and even
--     a spec file's top level -- may do I/O.  What cannot yield is `require`
--     (a C function): a module must do no I/O while it loads.
--   * busted's runner ends with os.exit, which would kill the host before it
--     shuts down (the sanitizer build checks for leaks at shutdown).  Here its
--     exit is turned into an error caught below, and the chunk returns the
--     exit code instead: 0 when everything passed, else 1.
--   * the last line printed is `N passed, N failed` (`, N skipped` when tests
--     are pending), counted here from busted's own events, so tools/test can
--     add up every runner's results.  Errors outside tests (a spec file that
--     does not load, a failing before_each or setup) count as failed.
--   * os.exit called by a spec becomes an error in that spec instead of
--     ending the whole run.
--
-- Output: busted's utfTerminal on a terminal, plainTerminal otherwise (both
-- print each failure with its message and location at the end); `-o TAP`
-- and the other busted handlers work too.  Without spec paths busted looks
-- in `spec`; tools/test passes `spec/lua`.

-- Debian's busted.  The host adds this path itself, and the C helpers' one
-- (lfs, luasystem, term: the multiarch directory of the machine that built
-- it, QTG_LUA_CMODULE_DIR); the Lua path is added here too (when missing)
-- so the runner also starts under a host built without it.
local function add_search_paths(field, entries)
  for _, entry in ipairs(entries) do
    if not package[field]:find(entry, 1, true) then
      package[field] = package[field] .. ";" .. entry
    end
  end
end
add_search_paths("path", { "/usr/share/lua/5.1/?.lua", "/usr/share/lua/5.1/?/init.lua" })

-- Spec helpers are required by their path from the repo root (e.g.
-- `require "spec.lua.support.host"`) wherever qtgd exec is started from:
-- put the repo root (this file's directory's parent) on the path.
local here = debug.getinfo(1, "S").source:match("^@(.*)$") or ""
local repo = here:match("^(.*)/spec/[^/]*$") or (here:match("^spec/[^/]*$") and ".")
if repo then add_search_paths("path", { repo .. "/?.lua", repo .. "/?/init.lua" }) end

local EXIT = {}   -- key marking the error raised in place of os.exit

-- An os.exit inside the run becomes this error (a table, so busted shows it).
local function exit_error(code)
  return setmetatable({ [EXIT] = true, code = code },
    { __tostring = function(e) return "os.exit(" .. tostring(e.code) .. ") called during the busted run" end })
end

local function exit_by_raising(code)
  if code == true or code == nil then code = 0 elseif code == false then code = 1 end
  error(exit_error(code), 0)
end

-- Counts from busted's events.  Each `it` ends once with its status; errors
-- and failures outside an `it` (file, describe, hooks, no spec found) are
-- counted separately.
local function new_counter()
  local c = { success = 0, failure = 0, error = 0, pending = 0, outside = 0 }
  function c.attach(busted)
    busted.subscribe({ "test", "end" }, function(_, _, status)
      c[status] = (c[status] or 0) + 1
      return nil, true
    end)
    local function outside(element)
      if element == nil or element.descriptor ~= "it" then c.outside = c.outside + 1 end
      return nil, true
    end
    busted.subscribe({ "error" }, outside)
    busted.subscribe({ "failure" }, outside)
  end
  function c.failed() return c.failure + c.error + c.outside end
  return c
end

-- With QTG_BUSTED_PROGRESS=FILE, FILE always says where the run is (spec
-- file, then the test running or the last one done), so that a run stopped
-- by a timeout tells which spec hung (tools/test prints it).
local function track_progress(busted, path)
  local function full_name(element)
    local parts = {}
    while element and element.descriptor ~= "file" and element.descriptor ~= "suite" do
      table.insert(parts, 1, element.name)
      element = busted.context.parent(element)
    end
    return table.concat(parts, " ")
  end
  local function note(text)
    local f = io.open(path, "w")
    if f then f:write(text, "\n"); f:close() end
  end
  local file = "?"
  busted.subscribe({ "file", "start" }, function(element)
    file = element.name
    note(file .. ": loading the file, or in its describe blocks")
    return nil, true
  end)
  busted.subscribe({ "test", "start" }, function(element)
    note(file .. ": in test '" .. full_name(element) .. "'")
    return nil, true
  end)
  busted.subscribe({ "test", "end" }, function(element)
    note(file .. ": after test '" .. full_name(element) .. "' (in hooks or between tests)")
    return nil, true
  end)
end

local function run(args)
  local counter = new_counter()
  local progress_file = os.getenv("QTG_BUSTED_PROGRESS")

  -- busted.runner keeps `require 'busted.compatibility'.exit` in a local
  -- when it loads, so replace it before loading the runner.
  local compat = require("busted.compatibility")
  local saved_compat_exit, saved_os_exit = compat.exit, os.exit
  compat.exit, os.exit = exit_by_raising, exit_by_raising

  -- The runner makes its busted instance with require 'busted.core'(); wrap
  -- that to subscribe the counter to it.
  local make_core = require("busted.core")
  package.loaded["busted.core"] = function(...)
    local busted = make_core(...)
    counter.attach(busted)
    if progress_file and progress_file ~= "" then track_progress(busted, progress_file) end
    return busted
  end

  _G.arg = args
  local ok, err = pcall(function()
    require("busted.runner")({ standalone = false })
  end)

  package.loaded["busted.core"] = make_core
  compat.exit, os.exit = saved_compat_exit, saved_os_exit

  local runner_code = 0
  if not ok then
    if type(err) == "table" and err[EXIT] then
      runner_code = tonumber(err.code) or 1
    else
      io.stderr:write("busted runner failed: ", tostring(err), "\n")
      runner_code = 1
    end
  end
  local failed = counter.failed()
  -- A non-zero exit with nothing counted (bad options, a crash of busted
  -- itself) is one failure, so the summary never reads as a success.
  if runner_code ~= 0 and failed == 0 then failed = 1 end

  io.stdout:write(string.format("%d passed, %d failed%s\n", counter.success, failed,
    counter.pending > 0 and string.format(", %d skipped", counter.pending) or ""))
  io.stdout:flush()
  return failed > 0 and 1 or 0
end

return run(arg or {})
