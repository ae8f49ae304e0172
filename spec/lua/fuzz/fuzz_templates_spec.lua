-- Fuzz: template compilation (lua/qtg/templates.lua) on generated inputs:
-- random mutations of the shipped templates, random JSON text, hostile
-- nesting.  The loader never raises: it compiles, or refuses with errors
-- naming the file.  What it compiles obeys every rule an independent check
-- knows (keys, kinds, executors, a DAG, $refs only at the top level and only
-- to ancestors), and SQL-looking strings in a template are stored and read
-- back byte for byte.  Seed and scale: spec/lua/support/fuzz.lua.
local qtg = require "qtg"
local cjson = require "cjson"
local canon = require "qtg.canon_json"
local templates = require "qtg.templates"
local executors = require "qtg.executors"
local F = require "spec.lua.support.fuzz"
local common = require "spec.lua.support.common"

local ROOT = qtg.root
local SHIPPED = { "cctp_bridge", "cex_withdrawal_to_wallet", "dual_venue_funding", "otc_settlement_manual" }
local texts = {}

local function read(path)
  local f = assert(io.open(path, "rb"))
  local t = f:read("*a")
  f:close()
  return t
end

local ACTION_TYPES = {}
for k in pairs(executors.ACTION_TYPES) do ACTION_TYPES[#ACTION_TYPES + 1] = k end
table.sort(ACTION_TYPES)

local function key_ok(s)
  return type(s) == "string" and #s >= 1 and #s <= 63 and s:match("^[a-z][a-z0-9_]*$") ~= nil
end

-- ---------------------------------------------------------- mutations
local function random_node(g, keys)
  local kinds = { "action", "observe", "manual", "ACTION", "", "pipe" }
  return {
    key = g:chance(0.8) and (g:word() .. "_" .. g:int(0, 9)) or g:string(),
    kind = g:pick(kinds),
    action_type = g:chance(0.85) and g:pick(ACTION_TYPES) or g:string(),
    config = g:chance(0.8) and { ref = "$ref:" .. tostring(keys[1] or "x") .. ".tx_hash" } or g:value(2),
  }
end

local function mutate(g, doc)
  local nodes = type(doc.nodes) == "table" and doc.nodes or nil
  local keys = {}
  for _, n in ipairs(nodes or {}) do if type(n) == "table" then keys[#keys + 1] = n.key end end
  local op = g:int(1, 22)
  if op == 1 then
    doc[g:pick({ "template_key", "name", "nodes", "edges", "intent", "risk_controls", "description" })] = nil
  elseif op == 2 then
    doc[g:pick({ "template_key", "name", "nodes", "edges", "intent", "risk_controls", "description" })] = g:value(2)
  elseif op == 3 then
    doc[g:string()] = g:value(1)
  elseif op == 4 then
    doc.name, doc.description = g:pick(F.SQL), g:pick(F.SQL) .. g:string()
  elseif op == 5 then
    doc.template_key = g:chance(0.5) and g:string() or (g:word() .. string.rep("x", g:int(50, 70)))
  elseif nodes and #nodes > 0 and op <= 14 then
    local n = nodes[g:int(1, #nodes)]
    if type(n) ~= "table" then return end
    if op == 6 then n[g:pick({ "key", "kind", "action_type", "executor", "config", "timeout_policy" })] = nil
    elseif op == 7 then n[g:pick({ "key", "kind", "action_type", "executor", "config", "timeout_policy" })] = g:value(2)
    elseif op == 8 then n.key = g:chance(0.5) and g:pick(keys) or g:string()
    elseif op == 9 then n.executor = g:pick({ "sim", "manual", "SIM", "none", "" })
    elseif op == 10 then
      n.config = type(n.config) == "table" and n.config or {}
      local expr = g:chance(0.6) and ("$ref:" .. tostring(g:pick(keys)) .. "." .. g:word()) or g:string()
      if g:chance(0.5) then n.config[g:word()] = expr
      else n.config[g:word()] = { inner = { expr } } end
    elseif op == 11 then
      n.config = type(n.config) == "table" and n.config or {}
      n.config.sim = g:chance(0.5) and g:object(2) or {
        observes = g:value(0), side_effect = g:value(0), fail = g:pick({ "submit", "observe", "nope", 3 }),
        retry_after_seconds = g:value(0), refs = g:value(1) }
    elseif op == 12 then
      n.config = type(n.config) == "table" and n.config or {}
      n.config.deep = g:deep(g:int(10, 120), g:chance(0.5) and "$ref:withdraw.tx_hash" or g:string())
    elseif op == 13 then
      n.timeout_policy = { observe_seconds = g:value(0), submit_seconds = g:value(0), [g:word()] = 1 }
    else
      n.kind, n.action_type = g:pick({ "manual", "action", "observe" }), g:pick(ACTION_TYPES)
    end
  elseif nodes and op == 15 then
    nodes[#nodes + 1] = canon.copy(nodes[g:int(1, math.max(1, #nodes))] or random_node(g, keys))
  elseif nodes and op == 16 then
    table.remove(nodes, g:int(1, math.max(1, #nodes)))
  elseif nodes and op == 17 then
    nodes[#nodes + 1] = random_node(g, keys)
  else
    doc.edges = type(doc.edges) == "table" and doc.edges or {}
    local e = doc.edges
    if op == 18 and #e > 0 then
      local x = e[g:int(1, #e)]
      if type(x) == "table" then x.from, x.to = x.to, x.from end          -- a cycle, often
    elseif op == 19 and #keys > 0 then
      local k = g:pick(keys)
      e[#e + 1] = { from = k, to = k }                                      -- a self-loop
    elseif op == 20 and #e > 0 then
      e[#e + 1] = canon.copy(e[g:int(1, #e)])                               -- a duplicate
    elseif op == 21 and #keys > 1 then
      e[#e + 1] = { from = g:pick(keys), to = g:pick(keys) }
    else
      e[#e + 1] = g:chance(0.5) and { from = g:string(), to = g:word() } or g:value(1)
    end
  end
end

-- ---------------------------------------------------- independent check
local function refs_of(v, depth, out)
  if type(v) == "string" and v:sub(1, 5) == "$ref:" then
    out[#out + 1] = { expr = v, depth = depth }
  elseif type(v) == "table" then
    for _, x in pairs(v) do refs_of(x, depth + 1, out) end
  end
  return out
end

local function check_compiled(c)
  if not key_ok(c.template_key) then return false, "bad template_key " .. F.show(c.template_key) end
  for _, h in ipairs({ c.graph_hash, c.compiled_plan_hash, c.content_hash }) do
    if type(h) ~= "string" or not h:match("^" .. string.rep("%x", 64) .. "$") then return false, "bad hash" end
  end
  if #c.nodes == 0 then return false, "no nodes" end
  local by, preds = {}, {}
  for _, n in ipairs(c.nodes) do
    if not key_ok(n.key) then return false, "bad node key " .. F.show(n.key) end
    if by[n.key] then return false, "duplicate node key " .. n.key end
    by[n.key] = n
    preds[n.key] = {}
    if not ({ action = true, observe = true, manual = true })[n.kind] then return false, "bad kind" end
    if not executors.ACTION_TYPES[n.action_type] then return false, "bad action type" end
    if not executors.ADAPTERS[n.executor] then return false, "bad executor" end
    if (n.kind == "manual") ~= (n.action_type:sub(1, 7) == "manual_") then return false, "manual rule broken" end
    if not pcall(canon.encode, n.config) then return false, "config not storable" end
  end
  local seen = {}
  for _, e in ipairs(c.edges) do
    if not by[e.from_key] or not by[e.to_key] then return false, "edge to an unknown node" end
    if e.from_key == e.to_key then return false, "self-loop" end
    local id = e.from_key .. ">" .. e.to_key
    if seen[id] then return false, "duplicate edge" end
    seen[id] = true
    table.insert(preds[e.to_key], e.from_key)
  end
  -- acyclic: repeatedly remove nodes without remaining predecessors
  local left, removed = {}, {}
  for k in pairs(by) do left[k] = true end
  local progress = true
  while progress do
    progress = false
    for k in pairs(left) do
      local ready = true
      for _, p in ipairs(preds[k]) do if not removed[p] then ready = false end end
      if ready then left[k] = nil; removed[k] = true; progress = true end
    end
  end
  if next(left) then return false, "cycle accepted" end
  local function ancestors(k, acc)
    for _, p in ipairs(preds[k]) do
      if not acc[p] then acc[p] = true; ancestors(p, acc) end
    end
    return acc
  end
  for _, n in ipairs(c.nodes) do
    local up = ancestors(n.key, {})
    for _, r in ipairs(refs_of(n.config, 0, {})) do
      if r.depth ~= 1 then return false, "nested $ref accepted in node " .. n.key end
      local target = r.expr:match("^%$ref:([a-z][a-z0-9_]*)%.")
      if not target or not up[target] then return false, "bad $ref accepted: " .. r.expr end
    end
  end
  return true
end

local function compile_never_raises(doc, file)
  local ok, c, errs = pcall(templates.validate_and_compile, doc, file)
  if not ok then return nil, "validate_and_compile raised: " .. tostring(type(c) == "table" and c.message or c) end
  if c then return c end
  if type(errs) ~= "table" or #errs == 0 then return nil, "refused without errors" end
  for _, e in ipairs(errs) do
    if type(e) ~= "string" or e:sub(1, #file + 1) ~= file .. ":" then
      return nil, "error does not name the file: " .. F.show(e)
    end
  end
  return false
end

describe("fuzz: template compilation", function()
  setup(function()
    for _, k in ipairs(SHIPPED) do texts[k] = read(ROOT .. "/templates/" .. k .. ".json") end
  end)

  it("mutated shipped templates compile to something valid or are refused with errors naming the file", function()
    local compiled, refused = 0, 0
    F.check("templates.mutate", 1500, function(g)
      local name = g:pick(SHIPPED)
      local doc = cjson.decode(texts[name])
      for _ = 1, g:int(1, 4) do mutate(g, doc) end
      local before = canon.copy(doc)
      local c, why = compile_never_raises(doc, "fuzz/" .. name .. ".json")
      if c == nil then return false, why end
      if not F.deep_equal(doc, before) then return false, "the loader changed its input" end
      if c then
        local ok, msg = check_compiled(c)
        if not ok then return false, msg .. " in " .. F.show(doc) end
        local again = templates.validate_and_compile(before, "again")
        if not again or again.content_hash ~= c.content_hash or again.compiled_plan_hash ~= c.compiled_plan_hash then
          return false, "compiling the same template twice gave different hashes"
        end
        compiled = compiled + 1
      else
        refused = refused + 1
      end
      return true
    end)
    assert.is_true(compiled > 100, "only " .. compiled .. " mutants compiled")
    assert.is_true(refused > 300, "only " .. refused .. " mutants refused")
  end)

  it("random and broken JSON text is refused, never raised on", function()
    F.check("templates.text", 1500, function(g)
      local k = g:int(1, 6)
      local text
      if k == 1 then text = g:bytes(g:int(0, 200))
      elseif k == 2 then local t = texts[g:pick(SHIPPED)]; text = t:sub(1, g:int(0, #t))
      elseif k == 3 then local n = g:int(1, 3000); text = string.rep("[", n) .. string.rep("]", n)
      elseif k == 4 then text = '{"template_key":"x","name":"n","nodes":[{"key":"a","kind":"action",'
        .. '"action_type":"withdrawal","config":{"v":' .. g:pick({ "NaN", "Infinity", "-Infinity", "1e999",
        "0x10", "nan", "inf", "1e-999", "-0" }) .. '}}]}'
      elseif k == 5 then text = cjson.encode(g:value(4))
      else local t = texts[g:pick(SHIPPED)]; local i = g:int(1, #t)
        text = t:sub(1, i - 1) .. g:bytes(g:int(1, 4)) .. t:sub(i + 1) end
      local ok, c, errs = pcall(templates.decode_and_compile, text, "fuzz.json")
      if not ok then return false, "raised: " .. tostring(type(c) == "table" and c.message or c) .. " on " .. F.show(text) end
      if c then
        local good, msg = check_compiled(c)
        if not good then return false, msg end
      elseif type(errs) ~= "table" or #errs == 0 then
        return false, "refused without errors"
      end
      return true
    end)
  end)

  it("qtgd templates check refuses a directory of mutants with FILE: messages and exit 1, never a crash", function()
    local support = require "spec.lua.support.host"
    local dir = support.tmpdir()
    local g = F.gen(F.seed)
    for i = 1, 30 do
      local doc = cjson.decode(texts[g:pick(SHIPPED)])
      for _ = 1, g:int(2, 5) do mutate(g, doc) end
      support.write(string.format("%s/m%02d.json", dir, i), cjson.encode(doc))
    end
    support.write(dir .. "/broken.json", '{"template_key": ')
    local rc, out = support.run({ MG_DATABASE_URL = os.getenv("MG_DATABASE_URL") },
      { common.quote(support.bin), "templates", "check", common.quote(dir) })
    os.execute("rm -rf " .. common.quote(dir))
    assert.equals(1, rc, out)
    assert.is_nil(out:find("traceback", 1, true), out)
    assert.truthy(out:find("broken.json: not valid JSON", 1, true), out)
    assert.truthy(out:find("refused %(%d+ errors?%); nothing was written"), out)
  end)

  it("text PostgreSQL cannot hold (a NUL byte, invalid UTF-8) is refused by the loader, not cut by the write", function()
    F.check("templates.text_ok", 300, function(g)
      local doc = cjson.decode(texts[g:pick(SHIPPED)])
      local bad = g:pick({ "\0", "a\0b", "\255", "\192\128", "\237\160\128", "x\244\144\128\128" })
      local where = g:int(1, 4)
      if where == 1 then doc.name = g:word() .. bad
      elseif where == 2 then doc.description = bad
      elseif where == 3 then doc.nodes[1].config[g:word()] = { deeper = bad }
      else doc.risk_controls[bad] = "1" end
      local c, errs = templates.validate_and_compile(doc, "bad.json")
      if c then return false, "accepted " .. F.show(bad) .. " at place " .. where end
      if not table.concat(errs, "\n"):find("NUL byte or is not valid UTF-8", 1, true) then
        return false, "unclear refusal: " .. table.concat(errs, "; ")
      end
      return true
    end)
  end)

  it("text_repaired makes any bytes text PostgreSQL stores, and leaves valid text as it is", function()
    local s = qtg.db.acquire()
    local ok, err = pcall(function()
      F.check("canon.text_repaired", 300, function(g)
        local raw = g:chance(0.3) and g:pick(F.SQL) or g:bytes(g:int(0, 40))
        local fixed = canon.text_repaired(raw)
        if not canon.text_ok(fixed) then return false, "not text: " .. F.show(fixed) end
        if canon.text_ok(raw) and fixed ~= raw then return false, "changed valid text " .. F.show(raw) end
        local back = s:query("SELECT ($1::text::jsonb #>> '{}') AS t", cjson.encode(fixed))[1].t
        if back ~= fixed then return false, "PostgreSQL read back " .. F.show(back) .. " for " .. F.show(fixed) end
        return true
      end)
    end)
    s:release()
    assert(ok, err)
  end)

  it("SQL-looking names, descriptions and config values are stored and read back byte for byte", function()
    local s = qtg.db.acquire()
    local before = s:query([[SELECT (SELECT count(*) FROM movement_templates)::int AS t,
                                    (SELECT count(*) FROM movement_requests)::int AS r,
                                    (SELECT count(*) FROM audit_events)::int AS a]])[1]
    local ok, err = pcall(function()
      local sql = {}
      for _, x in ipairs(F.SQL) do if canon.text_ok(x) then sql[#sql + 1] = x end end
      F.check("templates.sql", 60, function(g)
        local doc = cjson.decode(texts[g:pick(SHIPPED)])
        doc.template_key = "fuzz_" .. qtg.crypto.hex(qtg.crypto.random_bytes(6))
        doc.name = g:pick(sql)
        doc.description = g:pick(sql) .. " " .. g:pick(sql)
        local node = doc.nodes[g:int(1, #doc.nodes)]
        if node.kind == "manual" then node = doc.nodes[1] end -- a manual step's config is closed
        node.config.note = g:pick(sql)
        node.config[g:pick(sql)] = g:pick(sql)
        local c = assert(templates.validate_and_compile(doc, "sql.json"))
        s:begin()
        local r = templates.store(s, c)
        local t = s:query("SELECT name, description FROM movement_templates WHERE template_key = $1",
          doc.template_key)[1]
        local pn = s:query("SELECT config FROM plan_nodes WHERE plan_version_id = $1 AND node_key = $2",
          r.plan_version_id, node.key)[1]
        s:rollback()
        if t.name ~= doc.name or t.description ~= doc.description then return false, "name/description changed" end
        if not F.deep_equal(pn.config, node.config) then return false, "config changed: " .. F.show(pn.config) end
        return true
      end)
    end)
    if s:in_transaction() then s:rollback() end
    local after = s:query([[SELECT (SELECT count(*) FROM movement_templates)::int AS t,
                                   (SELECT count(*) FROM movement_requests)::int AS r,
                                   (SELECT count(*) FROM audit_events)::int AS a]])[1]
    s:release()
    assert(ok, err)
    assert.same(before, after)
  end)
end)
