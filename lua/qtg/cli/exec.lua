-- qtgd exec FILE [ARGS...]: run a Lua chunk inside the host, in a task, so
-- it can query the database and call providers.  The chunk sees its
-- arguments as `...` and in the table `arg` (as lua(1) does, for tools such
-- as busted).  Exit code: the number the chunk returns (0 if none), or 1 if
-- it raises (the error is printed with a traceback).
local M = {}

function M.run(args)
  local file = args[1]
  if not file then
    io.stderr:write("usage: qtgd exec FILE [ARGS...]\n")
    return 2
  end
  local chunk, err = loadfile(file)
  if not chunk then
    io.stderr:write("qtgd exec: ", tostring(err), "\n")
    return 1
  end
  local rest = {}
  for i = 2, #args do rest[i - 1] = args[i] end
  rest[0] = file
  rawset(_G, "arg", rest)
  local ok, res = xpcall(chunk, function(e)
    return debug.traceback(tostring(e), 2)
  end, unpack(rest, 1, #rest))
  if not ok then
    io.stderr:write("qtgd exec: ", tostring(res), "\n")
    return 1
  end
  if type(res) == "number" then return res end
  if res == false then return 1 end
  return 0
end

return M
