-- qtg.console.pretty: values as text for the operator's eyes.
--
-- Tables are shown nested with sorted keys (numbers, then strings, then the
-- rest), the array part first without its keys, short tables on one line.
-- A table met again inside itself is shown as <cycle: PATH> (PATH names the
-- enclosing table it refers back to, "root" for the value itself).  A table
-- whose metatable has __pretty(self) -> string shows that text (the operator
-- commands' tables use it); one with __tostring shows tostring(value).
-- Depth and width are bounded so a huge value cannot flood the console.
local M = {}

M.MAX_DEPTH = 12
M.MAX_ITEMS = 2000        -- entries shown per table
M.LINE_WIDTH = 78         -- a table fits on one line up to this width

local KEYWORDS = {}
for w in ([[and break do else elseif end false for function goto if in local nil not or
            repeat return then true until while]]):gmatch("%a+") do KEYWORDS[w] = true end

local TYPE_RANK = { number = 1, string = 2, boolean = 3 }

local function null_value()
  local ok, cjson = pcall(require, "cjson")
  return ok and cjson.null or nil
end
local NULL = null_value()

-- C0 controls and DEL as Lua escapes; the C1 range too (U+0080-U+009F,
-- UTF-8 \194\128-\194\159: U+009B is ESC [ to some terminals), which an
-- intent's strings can carry to an approver's screen.
local function quote(s)
  s = s:gsub('[%c"\\]', function(c)
    if c == "\n" then return "\\n" end
    if c == "\t" then return "\\t" end
    if c == "\r" then return "\\r" end
    if c == '"' then return '\\"' end
    if c == "\\" then return "\\\\" end
    return string.format("\\%03d", c:byte())
  end)
  s = s:gsub("\194([\128-\159])", function(c) return string.format("\\194\\%03d", c:byte()) end)
  return '"' .. s .. '"'
end
M.quote = quote

local function number_text(n)
  if n ~= n then return "nan" end
  if n == math.huge then return "inf" end
  if n == -math.huge then return "-inf" end
  if n == math.floor(n) and math.abs(n) < 2 ^ 53 then return string.format("%d", n) end
  local s = string.format("%.14g", n)
  if tonumber(s) ~= n then s = string.format("%.17g", n) end
  return s
end

local function key_before(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then
    local ra, rb = TYPE_RANK[ta] or 9, TYPE_RANK[tb] or 9
    if ra ~= rb then return ra < rb end
    return ta < tb
  end
  if ta == "number" or ta == "string" then return a < b end
  if ta == "boolean" then return (not a) and b end
  return tostring(a) < tostring(b)
end
M.key_before = key_before

local function function_text(f)
  local info = debug.getinfo(f, "S")
  if not info or info.what == "C" then return "<function: builtin>" end
  return string.format("<function: %s:%d>", info.short_src, info.linedefined)
end

local function key_text(k)
  if type(k) == "string" and k:match("^[%a_][%w_]*$") and not KEYWORDS[k] then return k end
  if type(k) == "string" then return "[" .. quote(k) .. "]" end
  if type(k) == "number" then return "[" .. number_text(k) .. "]" end
  return "[" .. tostring(k) .. "]"
end

local function child_path(path, k)
  local kt = key_text(k)
  if path == "root" then path = "" end
  if kt:sub(1, 1) == "[" then return path .. kt end
  return (path == "" and "" or path .. ".") .. kt
end

local render

-- The custom text of a value, if its metatable provides one.
local function custom_text(v)
  local mt = getmetatable(v)
  if type(mt) ~= "table" then return nil end
  local f = rawget(mt, "__pretty")
  if type(f) == "function" then
    local ok, s = pcall(f, v)
    if ok and type(s) == "string" then return s end
    return "<__pretty failed: " .. tostring(s) .. ">"
  end
  if rawget(mt, "__tostring") then
    local ok, s = pcall(tostring, v)
    return ok and tostring(s) or "<__tostring failed>"
  end
  return nil
end

local function render_table(t, indent, ancestors, path, depth)
  if ancestors[t] then return "<cycle: " .. ancestors[t] .. ">" end
  local custom = custom_text(t)
  if custom then return custom end
  if depth >= M.MAX_DEPTH then return "{...}" end
  ancestors[t] = path
  local n = 0
  while rawget(t, n + 1) ~= nil do n = n + 1 end
  local keys = {}
  for k in next, t do
    if not (type(k) == "number" and k >= 1 and k <= n and k == math.floor(k)) then
      keys[#keys + 1] = k
    end
  end
  table.sort(keys, key_before)
  local items, multiline, width = {}, false, 0
  local inner = indent .. "  "
  local total = n + #keys
  local shown = 0
  for i = 1, n do
    if shown >= M.MAX_ITEMS then break end
    local s = render(rawget(t, i), inner, ancestors, child_path(path, i), depth + 1)
    items[#items + 1] = s
    shown = shown + 1
  end
  for _, k in ipairs(keys) do
    if shown >= M.MAX_ITEMS then break end
    local s = key_text(k) .. " = " .. render(rawget(t, k), inner, ancestors, child_path(path, k), depth + 1)
    items[#items + 1] = s
    shown = shown + 1
  end
  if total > shown then items[#items + 1] = string.format("... (%d more)", total - shown) end
  ancestors[t] = nil
  if #items == 0 then return "{}" end
  for _, s in ipairs(items) do
    if s:find("\n", 1, true) then multiline = true end
    width = width + #s + 2
  end
  if not multiline and #indent + width + 2 <= M.LINE_WIDTH then
    return "{ " .. table.concat(items, ", ") .. " }"
  end
  return "{\n" .. inner .. table.concat(items, ",\n" .. inner) .. ",\n" .. indent .. "}"
end

function render(v, indent, ancestors, path, depth)
  local tv = type(v)
  if tv == "string" then return quote(v) end
  if tv == "number" then return number_text(v) end
  if tv == "nil" or tv == "boolean" then return tostring(v) end
  if tv == "table" then return render_table(v, indent, ancestors, path, depth) end
  if tv == "function" then return function_text(v) end
  if NULL ~= nil and v == NULL then return "NULL" end
  if tv == "userdata" then
    local custom = custom_text(v)
    if custom then return custom end
  end
  return "<" .. tostring(v) .. ">"
end

-- pretty(value) -> text
function M.pretty(v)
  return render(v, "", {}, "root", 0)
end

return M
