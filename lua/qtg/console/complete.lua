-- qtg.console.complete: Tab completion against the live state.
--
-- The client sends the word before the cursor (identifiers joined by . or
-- :).  `abc` completes the session's globals (its own variables, the
-- operator commands, then _G); `a.b.c` walks a.b and completes its fields;
-- `a:c` completes only the methods of a.  Fields come from the value itself
-- and from the tables its metatable's __index chain offers, so methods of
-- database sessions and strings complete too.  Walking never calls a
-- function, not even an __index metamethod: completion runs no audit row
-- (qtg.console audits each evaluated chunk), so it must run no code.
local M = {}

M.MAX = 500  -- candidates returned at most

local function is_identifier(k)
  return type(k) == "string" and k:match("^[%a_][%w_]*$") ~= nil
end

-- Every string key reachable from v: its own (tables) and those of the
-- __index tables of its metatable chain.
local function keys_of(v, out, seen, depth)
  if depth > 8 then return end
  if type(v) == "table" then
    if seen[v] then return end
    seen[v] = true
    for k, val in next, v do
      if is_identifier(k) and out[k] == nil then out[k] = val end
    end
  end
  local mt = (type(v) == "table" or type(v) == "userdata" or type(v) == "string") and getmetatable(v)
  if type(mt) == "table" then
    local idx = rawget(mt, "__index")
    if type(idx) == "table" then keys_of(idx, out, seen, depth + 1) end
  end
end

-- v[k] as the walk sees it: a table's own field, else the field along the
-- __index tables of its metatable chain; an __index function is not called.
local function lookup(v, k, depth)
  depth = depth or 0
  if depth > 8 then return nil end
  if type(v) == "table" then
    local r = rawget(v, k)
    if r ~= nil then return r end
  elseif type(v) ~= "userdata" and type(v) ~= "string" then
    return nil
  end
  local mt = getmetatable(v)
  local idx = type(mt) == "table" and rawget(mt, "__index")
  if type(idx) == "table" then return lookup(idx, k, depth + 1) end
  return nil
end

-- candidates(word, env) -> sorted array of full completions of word.
function M.candidates(word, env)
  if type(word) ~= "string" or #word > 1000 then return {} end
  local path, sep, partial = word:match("^(.-)([%.:])([%w_]*)$")
  local base
  if path then
    if path == "" then return {} end
    base = env
    for part in (path .. "."):gmatch("(.-)[%.:]") do
      if not is_identifier(part) then return {} end
      base = lookup(base, part)
      if base == nil then return {} end
    end
  else
    if not word:match("^[%w_]*$") then return {} end
    base, partial, path, sep = env, word, "", ""
  end
  local found = {}
  keys_of(base, found, {}, 0)
  local out = {}
  for k, v in pairs(found) do
    if k:sub(1, #partial) == partial and (sep ~= ":" or type(v) == "function") then
      out[#out + 1] = path .. sep .. k
    end
  end
  table.sort(out)
  if #out > M.MAX then
    for i = #out, M.MAX + 1, -1 do out[i] = nil end
  end
  return out
end

return M
