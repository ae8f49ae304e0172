-- qtg.console.eval: compile one operator input and run it, as text.
--
-- `=expr` and a bare expression return their values (the input is first
-- tried as `return <input>`, then as a statement).  A chunk that ends too
-- early (the parser's message ends in '<eof>') is reported as incomplete so
-- the client asks for the next line.  Errors come back as the message and a
-- traceback of the operator's own code (the console's frames are cut off).
local pretty = require("qtg.console.pretty")
local errors = require("qtg.errors")

local M = {}

local has_jit, jit = pcall(require, "jit")
local jit_off = has_jit and jit and jit.off or nil

M.CHUNK_NAME = "=console"
M.MAX_RESULT = 4 * 1024 * 1024   -- bytes of result text before it is cut

-- compile(code, env) -> fn | nil, message, incomplete
function M.compile(code, env)
  if type(code) ~= "string" then return nil, "input must be a string", false end
  local src = code
  if src:sub(1, 1) == "=" then src = "return " .. src:sub(2) end
  local fn = loadstring("return " .. src, M.CHUNK_NAME)
  local err
  if not fn then fn, err = loadstring(src, M.CHUNK_NAME) end
  if not fn then
    return nil, err, err:sub(-7) == "'<eof>'"
  end
  if env then setfenv(fn, env) end
  -- Interpreted, so the console's guard hook can interrupt a busy loop
  -- (compiled LuaJIT traces do not call hooks).
  if jit_off then jit_off(fn, true) end
  return fn
end

-- describe(err) -> what went wrong: qtg.errors.text, and any other table
-- raised pretty-printed.
function M.describe(e)
  local s = errors.text(e, true)
  if s then return s end
  local ok, p = pcall(pretty.pretty, e)
  return ok and p or tostring(e)
end

-- The traceback below the operator's code: everything from the console's
-- own machinery (this file, the xpcall) on is dropped.
local function trim_traceback(tb)
  local out = {}
  for line in tb:gmatch("[^\n]+") do
    if line:find("qtg/console/eval.lua", 1, true) or line:find("in function 'xpcall'", 1, true) then
      break
    end
    out[#out + 1] = line
  end
  if #out <= 1 then return "" end
  return table.concat(out, "\n")
end

local function on_error(e)
  return { err = e, traceback = trim_traceback(debug.traceback("", 2)) }
end

local function pack(...) return { n = select("#", ...), ... } end

-- format_results(packed) -> text: nothing for no values, else each value
-- pretty-printed: tab-separated when all fit one line, else one per line.
function M.format_results(res, first)
  first = first or 1
  if res.n < first then return "" end
  local parts, multi = {}, false
  for i = first, res.n do
    local ok, s = pcall(pretty.pretty, res[i])
    if not ok then s = "<cannot show value: " .. tostring(s) .. ">" end
    parts[#parts + 1] = s
    if s:find("\n", 1, true) then multi = true end
  end
  local text = table.concat(parts, multi and "\n" or "\t")
  if #text > M.MAX_RESULT then
    text = text:sub(1, M.MAX_RESULT) .. string.format("\n... (cut: %d bytes in all)", #text)
  end
  return text
end

-- run(fn) -> true, result text | false, error text (message + traceback)
function M.run(fn)
  local res = pack(xpcall(fn, on_error))
  if res[1] then return true, M.format_results(res, 2) end
  local e = res[2]
  local msg = M.describe(e.err)
  if e.traceback ~= "" then msg = msg .. "\n" .. e.traceback end
  return false, msg
end

-- evaluate(code, env) -> frame type, text: "r" result, "x" error, "m" more
function M.evaluate(code, env)
  local fn, err, incomplete = M.compile(code, env)
  if not fn then return incomplete and "m" or "x", err end
  local ok, text = M.run(fn)
  return ok and "r" or "x", text
end

return M
