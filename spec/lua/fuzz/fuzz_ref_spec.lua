-- Fuzz: $ref resolution (lua/qtg/ref.lua) on generated random inputs.
-- Whatever the expression, the config or the completed nodes' provider_refs
-- hold, resolution either gives the value an independent walk finds (a copy)
-- or raises the structured CONFIG_REF_UNRESOLVED error -- never another error.
-- Seed and scale: spec/lua/support/fuzz.lua (QTG_FUZZ_SEED, QTG_FUZZ_SCALE).
local cjson = require "cjson"
local ref = require "qtg.ref"
local F = require "spec.lua.support.fuzz"

local NULL = cjson.null

-- Independent of ref.lua's patterns: byte classes written out.
local function node_key_ok(s)
  if #s == 0 then return false end
  local b = s:byte(1)
  if not (b >= 97 and b <= 122) then return false end
  for i = 2, #s do
    b = s:byte(i)
    if not ((b >= 97 and b <= 122) or (b >= 48 and b <= 57) or b == 95) then return false end
  end
  return true
end

local function field_ok(s)
  if #s == 0 then return false end
  for i = 1, #s do
    local b = s:byte(i)
    if not ((b >= 97 and b <= 122) or (b >= 65 and b <= 90) or (b >= 48 and b <= 57)
            or b == 95 or b == 45) then return false end
  end
  return true
end

local function split_dots(s)
  local parts, start = {}, 1
  while true do
    local i = s:find(".", start, true)
    if not i then parts[#parts + 1] = s:sub(start); return parts end
    parts[#parts + 1] = s:sub(start, i - 1)
    start = i + 1
  end
end

-- The grammar, read independently: node, parts or nil.
local function grammar(expr)
  if type(expr) ~= "string" or expr:sub(1, 5) ~= "$ref:" then return nil end
  local parts = split_dots(expr:sub(6))
  local node = table.remove(parts, 1)
  if not node_key_ok(node) or #parts == 0 then return nil end
  for _, p in ipairs(parts) do if not field_ok(p) then return nil end end
  return node, parts
end

-- The oracle: what resolving expr against map must give.
-- Returns "ok", value | "unresolved".
local function oracle(expr, map)
  local node, parts = grammar(expr)
  if not node then return "unresolved" end
  local v = map[node]
  if v == nil then return "unresolved" end
  for _, p in ipairs(parts) do
    if type(v) ~= "table" then return "unresolved" end
    v = v[p]
    if v == nil or v == NULL then return "unresolved" end
  end
  return "ok", v
end

-- A random ref map and an expression that often points into it.
local function random_case(g)
  local map, nodes = {}, {}
  for _ = 1, g:int(0, 4) do
    local key = g:chance(0.8) and g:word() or g:string()
    map[key] = g:object(3)
    nodes[#nodes + 1] = key
  end
  local expr
  if #nodes > 0 and g:chance(0.7) then
    local node = g:pick(nodes)
    local path, v = {}, map[node]
    for _ = 1, g:int(1, 4) do
      local keys = {}
      if type(v) == "table" then for k in pairs(v) do keys[#keys + 1] = k end end
      table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
      local k = (#keys > 0 and g:chance(0.85)) and keys[g:int(1, #keys)] or g:word()
      path[#path + 1] = tostring(k)
      v = type(v) == "table" and v[k] or nil
      if type(v) ~= "table" and g:chance(0.7) then break end
    end
    expr = "$ref:" .. tostring(node) .. "." .. table.concat(path, ".")
  else
    expr = g:chance(0.5) and ("$ref:" .. g:string()) or g:string()
  end
  return map, expr
end

describe("fuzz: $ref resolution", function()
  it("runs on the interpreter: the host keeps LuaJIT's JIT compiler off", function()
    -- Debian 12's LuaJIT miscompiles recursive walks like ref.scan (wrong
    -- counts, hangs, segfaults; docs/reliability.md): qtg_host_init turns
    -- the JIT off, and this spec's scan property found it when it was on.
    assert.is_false((jit.status()))
    -- and Lua cannot turn it back on: under the units'
    -- MemoryDenyWriteExecute that would abort the daemon
    for _, args in ipairs({ {}, { function() end } }) do
      local ok, e = pcall(jit.on, unpack(args))
      assert.is_false(ok)
      assert.equal("usage", e.kind)
      assert.truthy(tostring(e.message):find("compiler stays off", 1, true), tostring(e.message))
    end
    assert.is_false((jit.status()))
  end)

  it("parse never raises and agrees with an independent reading of the grammar", function()
    F.check("ref.parse", 3000, function(g)
      local s = g:chance(0.6) and ("$ref:" .. g:string() .. (g:chance(0.5) and ("." .. g:string()) or ""))
        or g:string()
      local node, parts = ref.parse(s)
      local wnode = grammar(s)
      if node then
        if not wnode then return false, "accepted what the grammar refuses: " .. F.show(s) end
        if type(parts) ~= "table" or #parts == 0 then return false, "parts missing for " .. F.show(s) end
        if "$ref:" .. node .. "." .. table.concat(parts, ".") ~= s then
          return false, "parse does not round-trip " .. F.show(s)
        end
      else
        if wnode then return false, "refused a well-formed expression " .. F.show(s) end
        if type(parts) ~= "string" then return false, "no reason for refusing " .. F.show(s) end
      end
      return true
    end)
  end)

  it("lookup gives the oracle's value (a copy) or the structured CONFIG_REF_UNRESOLVED error", function()
    local resolved, refused = 0, 0
    F.check("ref.lookup", 3000, function(g)
      local map, expr = random_case(g)
      local want, wv = oracle(expr, map)
      local ok, got = pcall(ref.lookup, expr, map)
      if ok then
        if want ~= "ok" then return false, "resolved what must not resolve: " .. F.show(expr) .. " in " .. F.show(map) end
        if not F.deep_equal(got, wv) then return false, "wrong value for " .. F.show(expr) end
        if type(got) == "table" and got == wv then return false, "not a copy: " .. F.show(expr) end
        resolved = resolved + 1
      else
        if type(got) ~= "table" or got.code ~= ref.UNRESOLVED or type(got.message) ~= "string" then
          return false, "unstructured error " .. F.show(got) .. " for " .. F.show(expr)
        end
        if want == "ok" then return false, "refused a resolvable " .. F.show(expr) .. ": " .. got.message end
        refused = refused + 1
      end
      return true
    end)
    -- the generator must exercise both outcomes, or the property says little
    assert.is_true(resolved > 100, "resolved only " .. resolved)
    assert.is_true(refused > 100, "refused only " .. refused)
  end)

  it("resolve replaces top-level $refs only, copies the rest, and never touches its inputs", function()
    F.check("ref.resolve", 1500, function(g)
      local map, expr = random_case(g)
      local config = g:object(3)
      config[g:word() .. "_ref"] = expr
      if g:chance(0.3) then config.nested = { inner = expr, list = { expr } } end
      local before_config, before_map = cjson.encode(config), cjson.encode(map)
      local ok, out, bindings = pcall(ref.resolve, config, map)
      if cjson.encode(config) ~= before_config or cjson.encode(map) ~= before_map then
        return false, "resolve changed its inputs"
      end
      if not ok then
        if type(out) ~= "table" or out.code ~= ref.UNRESOLVED then
          return false, "unstructured error " .. F.show(out)
        end
        return true
      end
      for k, v in pairs(config) do
        if ref.is_ref(v) then
          local want, wv = oracle(v, map)
          if want ~= "ok" or not F.deep_equal(out[k], wv) or not F.deep_equal(bindings[v], wv) then
            return false, "top-level " .. F.show(k) .. " resolved wrong"
          end
        elseif not F.deep_equal(out[k], v) then
          return false, "non-ref value " .. F.show(k) .. " changed"
        end
      end
      for k in pairs(out) do if config[k] == nil then return false, "extra key " .. F.show(k) end end
      return true
    end)
  end)

  it("scan finds every $ref string at every depth, splitting top level from nested", function()
    F.check("ref.scan", 1500, function(g)
      local config = g:object(5)
      if g:chance(0.2) then config.deep = g:deep(g:int(50, 400), "$ref:withdraw.tx_hash") end
      local top_want, nested_want = 0, 0
      local function walk(v, depth)
        if type(v) == "string" and v:sub(1, 5) == "$ref:" then
          if depth == 1 then top_want = top_want + 1 else nested_want = nested_want + 1 end
        elseif type(v) == "table" then
          for _, x in pairs(v) do walk(x, depth + 1) end
        end
      end
      for _, v in pairs(config) do walk(v, 1) end
      local top, nested = ref.scan(config)
      if #top ~= top_want or #nested ~= nested_want then
        return false, string.format("scan found %d/%d, want %d/%d", #top, #nested, top_want, nested_want)
      end
      return true
    end)
  end)
end)
