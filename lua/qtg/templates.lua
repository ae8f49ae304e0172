-- qtg.templates: movement templates (templates/*.json) -> plan versions.
--
-- validate_and_compile(doc, file) checks one decoded template and compiles it
-- (nodes, edges, graph hash, compiled plan hash, content hash); store(s, c)
-- writes a new plan version only when the content hash differs from the
-- template's latest version; load_dir(s, dir) does both for a directory, all
-- or nothing.  The format is documented in docs/templates.md.
local canon = require "qtg.canon_json"
local ref = require "qtg.ref"
local lfs = require "lfs"
local executors = require "qtg.executors"
local state = require "qtg.state"

local M = {}

local NULL = require("cjson").null
local KEY_PATTERN = "^[a-z][a-z0-9_]*$"
local MAX_KEY = 63

M.NODE_KINDS = { action = true, observe = true, manual = true }

M.TEMPLATE_FIELDS = {
  template_key = true, name = true, description = true, intent = true,
  risk_controls = true, nodes = true, edges = true,
}
M.NODE_FIELDS = {
  key = true, kind = true, action_type = true, executor = true, config = true,
  timeout_policy = true,
}
M.EDGE_FIELDS = { from = true, to = true }
M.INTENT_FIELDS = { required = true, types = true }
M.TIMEOUT_FIELDS = { observe_seconds = true, submit_seconds = true }

-- Intent field types: name -> predicate(value, spec) -> ok, and what it
-- means.  A field's type is a name ("decimal") or an object naming it with
-- its bounds: {"type": "decimal", "scale": 6}, {"type": "integer", "min": 1,
-- "max": 100}.  spec is that object (or {type = name}).
M.DECIMAL_MAX_INTEGER_DIGITS = 78   -- a uint256 has 78 decimal digits
M.DECIMAL_DEFAULT_SCALE = 18
M.INTEGER_LIMIT = 2^53 - 1          -- a larger JSON number is not exact
M.INTENT_TYPES = {
  string = { check = function(v) return type(v) == "string" and v ~= "" end,
             says = "a non-empty string" },
  -- A string only: a JSON number has already lost what a double cannot
  -- hold, and its text depends on the encoder (1e14 vs 99999999999999).
  decimal = { check = function(v, spec)
                if type(v) ~= "string" then return false end
                local int, frac = v:match("^(%d+)%.?(%d*)$")
                if not int or v:sub(-1) == "." then return false end
                if #int > M.DECIMAL_MAX_INTEGER_DIGITS then return false end
                if #frac > (spec.scale or M.DECIMAL_DEFAULT_SCALE) then return false end
                return (int .. frac):find("[1-9]") ~= nil
              end,
              bounds = { scale = true },
              says = function(spec)
                return string.format("a positive decimal string such as \"125.50\" with at most %d "
                  .. "integer digits and %d decimals (not a JSON number: amounts go in strings, "
                  .. "a number can lose digits)", M.DECIMAL_MAX_INTEGER_DIGITS,
                  spec.scale or M.DECIMAL_DEFAULT_SCALE)
              end },
  integer = { check = function(v, spec)
                return type(v) == "number" and v == math.floor(v)
                  and v >= (spec.min or -M.INTEGER_LIMIT) and v <= (spec.max or M.INTEGER_LIMIT)
              end,
              bounds = { min = true, max = true },
              says = function(spec)
                return string.format("an integer from %s to %s",
                  M.number_text(spec.min or -M.INTEGER_LIMIT), M.number_text(spec.max or M.INTEGER_LIMIT))
              end },
  evm_address = { check = function(v) return type(v) == "string" and v:match("^0x%x+$") ~= nil and #v == 42 end,
                  says = "an EVM address (0x + 40 hex digits)" },
  object = { check = function(v) return type(v) == "table" end, says = "a JSON object" },
}

-- number_text(n): n as people write it (integers in full, no exponent).
function M.number_text(n)
  if n == math.floor(n) and math.abs(n) < 2^63 then return string.format("%d", n) end
  return (string.format("%.17g", n))
end

-- type_spec(t) -> spec | nil, why: a field's declared type as a table.
local function type_spec(t)
  if type(t) == "string" then
    return M.INTENT_TYPES[t] and { type = t } or nil, "unknown type"
  end
  if type(t) ~= "table" or type(t.type) ~= "string" or not M.INTENT_TYPES[t.type] then
    return nil, "unknown type"
  end
  local known = M.INTENT_TYPES[t.type].bounds or {}
  for k, v in pairs(t) do
    if k ~= "type" then
      if not known[k] then return nil, string.format("%q takes no %q", t.type, tostring(k)) end
      if type(v) ~= "number" or v ~= math.floor(v) or math.abs(v) > M.INTEGER_LIMIT then
        return nil, string.format("%q must be an integer", k)
      end
    end
  end
  if t.scale and (t.scale < 0 or t.scale > 78) then return nil, "\"scale\" must be 0 to 78" end
  if t.min and t.max and t.min > t.max then return nil, "\"min\" is above \"max\"" end
  return t
end

M.MAX_NODES = 256
M.MAX_EDGES = 1024


local function is_object(v)
  if type(v) ~= "table" then return false end
  if getmetatable(v) ~= nil and canon.is_array(v) then return false end
  for k in pairs(v) do if type(k) ~= "string" then return false end end
  return true
end

local function is_array(v)
  if type(v) ~= "table" then return false end
  local n = 0
  for _ in pairs(v) do n = n + 1 end
  return n == #v
end

local function sorted_keys(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = tostring(k) end
  table.sort(out)
  return out
end

-- ------------------------------------------------------------- validation
local function checker(file)
  local errors = {}
  local function add(where, fmt, ...)
    errors[#errors + 1] = string.format("%s: %s%s", file, where and (where .. ": ") or "",
      string.format(fmt, ...))
  end
  return errors, add
end

local function check_unknown_fields(t, allowed, where, add)
  for _, k in ipairs(sorted_keys(t)) do
    if not allowed[k] then add(where, "unknown field %q", k) end
  end
end

-- is_key(v): v is a key as templates and their nodes name them.
function M.is_key(v)
  return type(v) == "string" and #v <= MAX_KEY and v:match(KEY_PATTERN) ~= nil
end

local function check_key(v, what, where, add)
  if type(v) ~= "string" then
    add(where, "missing field %q (a string)", what)
    return false
  end
  if not M.is_key(v) then
    add(where, "%s %q must match [a-z][a-z0-9_]* (at most %d characters)", what, v, MAX_KEY)
    return false
  end
  return true
end

local function check_intent(intent, add)
  if intent == nil then return { required = canon.array(), types = {} } end
  if not is_object(intent) then add(nil, "\"intent\" must be an object"); return nil end
  check_unknown_fields(intent, M.INTENT_FIELDS, "intent", add)
  local required = intent.required or canon.array()
  if not is_array(required) then add("intent", "\"required\" must be an array of field names") end
  local types = intent.types or {}
  if not is_object(types) then add("intent", "\"types\" must be an object"); types = {} end
  for _, f in ipairs(is_array(required) and required or {}) do
    if type(f) ~= "string" or f == "" then add("intent", "required field names must be strings")
    else check_key(f, "required field", "intent", add) end
  end
  for _, f in ipairs(sorted_keys(types)) do
    check_key(f, "typed field", "intent", add)
    local spec, why = type_spec(types[f])
    if not spec and why == "unknown type" then
      add("intent", "field %q has unknown type %q (known: %s)", f,
        type(types[f]) == "table" and tostring(types[f].type) or tostring(types[f]),
        table.concat(sorted_keys(M.INTENT_TYPES), ", "))
    elseif not spec then
      add("intent", "field %q: %s", f, why)
    end
  end
  local out = { required = canon.array(canon.copy(is_array(required) and required or {})),
                types = canon.copy(types) }
  local ok, why = canon.storable({ intent = out })
  if not ok then add("intent", "cannot be stored: %s", why) end
  return out
end

local function check_timeout_policy(tp, where, add)
  if tp == nil then return {} end
  if not is_object(tp) then add(where, "\"timeout_policy\" must be an object"); return {} end
  check_unknown_fields(tp, M.TIMEOUT_FIELDS, where .. ": timeout_policy", add)
  for _, f in ipairs(sorted_keys(M.TIMEOUT_FIELDS)) do
    local v = tp[f]
    if v ~= nil and (type(v) ~= "number" or not (v > 0) or v == math.huge) then
      add(where, "timeout_policy.%s must be a positive number of seconds", f)
    end
  end
  return canon.copy(tp)
end

local function check_node(n, i, add, seen)
  local where = string.format("node #%d", i)
  if not is_object(n) then add(where, "must be an object"); return nil end
  if check_key(n.key, "key", where, add) then
    where = "node " .. n.key
    if seen[n.key] then add(where, "duplicate node key") end
    seen[n.key] = true
  end
  check_unknown_fields(n, M.NODE_FIELDS, where, add)
  if type(n.kind) ~= "string" then
    add(where, "missing field \"kind\" (one of action, observe, manual)")
  elseif not M.NODE_KINDS[n.kind] then
    add(where, "unknown kind %q (one of action, observe, manual)", n.kind)
  end
  local executor
  if type(n.action_type) ~= "string" then
    add(where, "missing field \"action_type\"")
  elseif not executors.ACTION_TYPES[n.action_type] then
    add(where, "unknown action type %q", n.action_type)
  else
    executor = n.executor or executors.default_executor(n.action_type)
    if type(executor) ~= "string" or not executors.known_executor(executor) then
      add(where, "unknown executor %q", tostring(n.executor))
      executor = nil
    end
    if n.kind and M.NODE_KINDS[n.kind] and (n.kind == "manual") ~= state.is_manual(n.action_type) then
      add(where, "kind \"manual\" goes with a manual_* action type and only with one")
    end
  end
  local config = n.config
  if config == nil then config = {} end
  if not is_object(config) then add(where, "\"config\" must be an object"); config = {} end
  -- as deep as it is hashed: content_doc.nodes[i].config
  local storable, why_not = canon.storable({ nodes = canon.array({ { config = config } }) })
  if not storable then add(where, "config cannot be stored: %s", why_not); config = {} end
  local timeout_policy = check_timeout_policy(n.timeout_policy, where, add)
  if executor then
    local adapter, why = executors.get(executor)
    if not adapter then
      add(where, "%s", why)
    elseif type(adapter.validate_config) == "function" then
      local ok, err = adapter.validate_config(config, n.action_type)
      if not ok then add(where, "config: %s", tostring(err)) end
    end
  end
  return {
    key = n.key, kind = n.kind, action_type = n.action_type, executor = executor,
    config = canon.copy(config), timeout_policy = timeout_policy, ordinal = i,
  }
end

-- Kahn's algorithm; returns nil or a cycle as a list of keys.
local function find_cycle(keys, graph)
  local indeg = {}
  for _, k in ipairs(keys) do indeg[k] = #(graph.preds[k] or {}) end
  local queue, seen, head = {}, 0, 1
  for _, k in ipairs(keys) do if indeg[k] == 0 then queue[#queue + 1] = k end end
  while head <= #queue do
    local k = queue[head]
    head = head + 1
    seen = seen + 1
    for _, s in ipairs(graph.succs[k] or {}) do
      indeg[s] = indeg[s] - 1
      if indeg[s] == 0 then queue[#queue + 1] = s end
    end
  end
  if seen == #keys then return nil end
  -- walk back along unfinished predecessors from any node left in a cycle
  local start
  for _, k in ipairs(keys) do if indeg[k] > 0 then start = k; break end end
  -- a duplicate node key (already an error) makes the counts differ
  -- without a cycle
  if not start then return nil end
  local path, at, pos = {}, start, {}
  while not pos[at] do
    pos[at] = #path + 1
    path[#path + 1] = at
    for _, p in ipairs(graph.preds[at] or {}) do
      if indeg[p] > 0 then at = p; break end
    end
  end
  local cycle = {}
  for i = #path, pos[at], -1 do cycle[#cycle + 1] = path[i] end
  cycle[#cycle + 1] = cycle[1]
  return cycle
end

local function ancestors(graph, key)
  local out, stack = {}, { key }
  while #stack > 0 do
    local k = table.remove(stack)
    for _, p in ipairs(graph.preds[k] or {}) do
      if not out[p] then out[p] = true; stack[#stack + 1] = p end
    end
  end
  return out
end

local function check_refs(nodes, node_set, graph, has_cycle, add)
  for _, n in ipairs(nodes) do
    local where = "node " .. tostring(n.key)
    local top, nested = ref.scan(n.config)
    for _, r in ipairs(nested) do
      add(where, "config.%s: %s is below the top level of config (only top-level values may be $ref)",
        r.path, r.expr)
    end
    local up = (not has_cycle and #top > 0) and ancestors(graph, n.key) or {}
    for _, r in ipairs(top) do
      local node_key, path = ref.parse(r.expr)
      if not node_key then
        add(where, "config.%s: malformed $ref %s", r.path, path)
      elseif not node_set[node_key] then
        add(where, "config.%s: %s refers to unknown node %q", r.path, r.expr, node_key)
      elseif not has_cycle and not up[node_key] then
        add(where, "config.%s: %s refers to node %q, which does not run before %s",
          r.path, r.expr, node_key, n.key)
      end
    end
  end
end

local function hash_of(hash, v)
  return hash(canon.encode(v))
end

local function default_hash()
  local qtg = require "qtg"
  return qtg.crypto.sha256_hex
end

-- validate_and_compile(doc, file, hash) -> compiled | nil, {errors}
-- hash: function(string) -> 64 hex chars (default qtg.crypto.sha256_hex).
function M.validate_and_compile(doc, file, hash)
  file = file or "template"
  local errors, add = checker(file)
  if not is_object(doc) then
    add(nil, "a template must be a JSON object")
    return nil, errors
  end
  check_unknown_fields(doc, M.TEMPLATE_FIELDS, nil, add)
  check_key(doc.template_key, "template_key", nil, add)
  if type(doc.name) ~= "string" or doc.name == "" then add(nil, "missing field \"name\" (a string)") end
  if doc.description ~= nil and type(doc.description) ~= "string" then
    add(nil, "\"description\" must be a string")
  end
  for _, f in ipairs({ "name", "description" }) do
    if type(doc[f]) == "string" and not canon.text_ok(doc[f]) then
      add(nil, "\"%s\" holds a NUL byte or is not valid UTF-8", f)
    end
  end
  local intent = check_intent(doc.intent, add)
  local risk_controls = doc.risk_controls or {}
  if not is_object(risk_controls) then add(nil, "\"risk_controls\" must be an object"); risk_controls = {} end
  local rc_ok, rc_why = canon.storable({ risk_controls = risk_controls })
  if not rc_ok then add(nil, "\"risk_controls\" cannot be stored: %s", rc_why); risk_controls = {} end
  for _, e in ipairs(require("qtg.risk_controls").validate(risk_controls)) do add(nil, "%s", e) end

  local nodes, node_set = {}, {}
  if type(doc.nodes) ~= "table" or not is_array(doc.nodes) or #doc.nodes == 0 then
    add(nil, "missing field \"nodes\" (a non-empty array)")
  elseif #doc.nodes > M.MAX_NODES then
    add(nil, "%d nodes: a template has at most %d", #doc.nodes, M.MAX_NODES)
    return nil, errors
  elseif type(doc.edges) == "table" and #doc.edges > M.MAX_EDGES then
    add(nil, "%d edges: a template has at most %d", #doc.edges, M.MAX_EDGES)
    return nil, errors
  else
    for i, n in ipairs(doc.nodes) do
      local c = check_node(n, i, add, node_set)
      if c then nodes[#nodes + 1] = c end
    end
  end

  local edges, seen_edge = {}, {}
  local raw_edges = doc.edges
  if raw_edges == nil then raw_edges = {} end
  if not is_array(raw_edges) then add(nil, "\"edges\" must be an array"); raw_edges = {} end
  for i, e in ipairs(raw_edges) do
    local where = string.format("edge #%d", i)
    if not is_object(e) then
      add(where, "must be an object {\"from\": ..., \"to\": ...}")
    else
      check_unknown_fields(e, M.EDGE_FIELDS, where, add)
      local ok = true
      for _, f in ipairs({ "from", "to" }) do
        if type(e[f]) ~= "string" then
          add(where, "missing field %q (a node key)", f); ok = false
        elseif not node_set[e[f]] then
          add(where, "unknown node %q in \"%s\"", e[f], f); ok = false
        end
      end
      if ok and e.from == e.to then add(where, "node %q points to itself", e.from); ok = false end
      local id = ok and (e.from .. "->" .. e.to)
      if ok and seen_edge[id] then add(where, "duplicate edge %s", id); ok = false end
      if ok then
        seen_edge[id] = true
        edges[#edges + 1] = { from_key = e.from, to_key = e.to }
      end
    end
  end

  local keys = {}
  for _, n in ipairs(nodes) do if n.key then keys[#keys + 1] = n.key end end
  local graph = state.graph(edges)
  local cycle = find_cycle(keys, graph)
  if cycle then add(nil, "the edges form a cycle: %s", table.concat(cycle, " -> ")) end
  check_refs(nodes, node_set, graph, cycle ~= nil, add)

  if #errors > 0 then return nil, errors end

  hash = hash or default_hash()
  table.sort(edges, function(a, b)
    if a.from_key ~= b.from_key then return a.from_key < b.from_key end
    return a.to_key < b.to_key
  end)
  local by_key = {}
  for _, n in ipairs(nodes) do by_key[#by_key + 1] = n end
  table.sort(by_key, function(a, b) return a.key < b.key end)

  local graph_doc = { nodes = canon.array(), edges = canon.array() }
  local plan_doc = { nodes = canon.array() }
  local content_doc = { nodes = canon.array() }
  for _, n in ipairs(by_key) do
    graph_doc.nodes[#graph_doc.nodes + 1] = { key = n.key, kind = n.kind,
      action_type = n.action_type, executor = n.executor }
    plan_doc.nodes[#plan_doc.nodes + 1] = { key = n.key, config = n.config }
    content_doc.nodes[#content_doc.nodes + 1] = { key = n.key, config = n.config,
      timeout_policy = n.timeout_policy, ordinal = n.ordinal }
  end
  for _, e in ipairs(edges) do
    graph_doc.edges[#graph_doc.edges + 1] = canon.array({ e.from_key, e.to_key })
  end
  local graph_hash = hash_of(hash, graph_doc)
  plan_doc.template_key = doc.template_key
  plan_doc.graph_hash = graph_hash
  plan_doc.intent = intent
  plan_doc.risk_controls = risk_controls
  local compiled_plan_hash = hash_of(hash, plan_doc)
  content_doc.compiled_plan_hash = compiled_plan_hash
  content_doc.name = doc.name
  content_doc.description = doc.description or ""
  local content_hash = hash_of(hash, content_doc)

  return {
    template_key = doc.template_key,
    name = doc.name,
    description = doc.description or "",
    intent_schema = intent,
    risk_controls = canon.copy(risk_controls),
    nodes = nodes,
    edges = edges,
    graph_hash = graph_hash,
    compiled_plan_hash = compiled_plan_hash,
    content_hash = content_hash,
    source_file = file,
  }
end

-- decode_and_compile(text, file, hash): JSON text -> compiled | nil, errors
function M.decode_and_compile(text, file, hash)
  local doc, err = canon.decode(text)
  if doc == nil then
    return nil, { string.format("%s: not valid JSON: %s", file, tostring(err)) }
  end
  return M.validate_and_compile(doc, file, hash)
end

-- --------------------------------------------------------------- storage
-- store(s, compiled) -> {template_key=, version=, created=bool}
-- Runs inside the caller's transaction.
function M.store(s, c)
  local t = s:query([[
    INSERT INTO movement_templates (template_key, name, description)
    VALUES ($1, $2, $3)
    ON CONFLICT (template_key) DO UPDATE
      SET name = EXCLUDED.name, description = EXCLUDED.description,
          updated_at = clock_timestamp()
    RETURNING id]], c.template_key, c.name, c.description)[1]
  s:query("SELECT id FROM movement_templates WHERE id = $1 FOR UPDATE", t.id)
  local latest = s:query([[
    SELECT id, version, content_hash FROM plan_versions
     WHERE template_id = $1 ORDER BY version DESC LIMIT 1]], t.id)[1]
  if latest and latest.content_hash == c.content_hash then
    return { template_key = c.template_key, version = latest.version, created = false,
             plan_version_id = latest.id }
  end
  local version = latest and (latest.version + 1) or 1
  local pv = s:query([[
    INSERT INTO plan_versions (template_id, version, graph_hash, compiled_plan_hash,
                               content_hash, intent_schema, risk_controls, source_file)
    VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb, $8)
    RETURNING id]], t.id, version, c.graph_hash, c.compiled_plan_hash, c.content_hash,
    canon.encode(c.intent_schema), canon.encode(c.risk_controls), c.source_file)[1]
  local ids = {}
  for _, n in ipairs(c.nodes) do
    ids[n.key] = s:query([[
      INSERT INTO plan_nodes (plan_version_id, node_key, node_kind, action_type, executor,
                              config, timeout_policy, ordinal)
      VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb, $8) RETURNING id]],
      pv.id, n.key, n.kind, n.action_type, n.executor, canon.encode(n.config),
      canon.encode(n.timeout_policy), n.ordinal)[1].id
  end
  for _, e in ipairs(c.edges) do
    s:query("INSERT INTO plan_edges (plan_version_id, from_node_id, to_node_id) VALUES ($1, $2, $3)",
      pv.id, ids[e.from_key], ids[e.to_key])
  end
  return { template_key = c.template_key, version = version, created = true,
           plan_version_id = pv.id }
end

-- ------------------------------------------------------------- directory
-- The *.json files of a directory, sorted.
function M.list_dir(dir)
  if lfs.attributes(dir, "mode") ~= "directory" then
    return nil, dir .. ": not a directory"
  end
  local ok, iter, d = pcall(lfs.dir, dir)
  if not ok then return nil, dir .. ": cannot read: " .. tostring(iter) end
  local files = {}
  for name in iter, d do
    if name:match("%.json$") then files[#files + 1] = dir .. "/" .. name end
  end
  table.sort(files)
  return files
end

-- compile_dir(dir, hash) -> compiled list | nil, errors
function M.compile_dir(dir, hash)
  local files, why = M.list_dir(dir)
  if not files then return nil, { why } end
  if #files == 0 then return nil, { dir .. ": no *.json template files" } end
  local out, errors, keys = {}, {}, {}
  for _, file in ipairs(files) do
    local f, err = io.open(file, "rb")
    if not f then
      errors[#errors + 1] = file .. ": cannot read: " .. tostring(err)
    else
      local text = f:read("*a")
      f:close()
      local c, errs = M.decode_and_compile(text, file, hash)
      if c then
        if keys[c.template_key] then
          errors[#errors + 1] = string.format("%s: template_key %q is also defined in %s",
            file, c.template_key, keys[c.template_key])
        else
          keys[c.template_key] = file
          out[#out + 1] = c
        end
      else
        for _, e in ipairs(errs) do errors[#errors + 1] = e end
      end
    end
  end
  if #errors > 0 then return nil, errors end
  return out
end

-- load_dir(s, dir) -> results | nil, errors.  All files are validated first;
-- one invalid file refuses the whole directory and nothing is written.
function M.load_dir(s, dir, hash)
  local compiled, errors = M.compile_dir(dir, hash)
  if not compiled then return nil, errors end
  return s:transaction(function()
    local results = {}
    for _, c in ipairs(compiled) do results[#results + 1] = M.store(s, c) end
    return results
  end)
end

-- --------------------------------------------------------------- intents
-- A key shown in a refusal: bytes other than a key's escaped.
local function shown_key(k)
  return (tostring(k):sub(1, 80):gsub("[^%w_]", function(c) return string.format("\\x%02x", c:byte()) end))
end

-- The intent is what approvers read (the approval document, the web
-- console's cards): its field names are keys ([a-z][a-z0-9_]*), so none
-- can pass for another on an approver's screen (a Cyrillic "а" in
-- "аmount" stood as a second "intent.amount" beside the real one; a
-- control character).  Fields a template does not declare stay allowed:
-- approval policies and risk controls read some (a destination, a chain).
local function check_intent_keys(intent)
  for _, k in ipairs(sorted_keys(intent)) do
    if not M.is_key(k) then
      return nil, string.format("intent field name \"%s\" must match [a-z][a-z0-9_]* (at most %d characters)",
        shown_key(k), MAX_KEY)
    end
  end
  return true
end

-- validate_intent(schema, intent) -> true | nil, message
function M.validate_intent(schema, intent)
  if type(intent) ~= "table" or canon.is_array(intent) and next(intent) ~= nil then
    return nil, "intent must be a JSON object"
  end
  local storable, why_not = canon.storable(intent)
  if not storable then return nil, "intent cannot be stored: " .. why_not end
  local keys_ok, keys_why = check_intent_keys(intent)
  if not keys_ok then return nil, keys_why end
  local missing = {}
  for _, f in ipairs(schema.required or {}) do
    local v = intent[f]
    if v == nil or v == NULL or v == "" then missing[#missing + 1] = f end
  end
  if #missing > 0 then
    return nil, "intent is missing required field(s): " .. table.concat(missing, ", ")
  end
  for _, f in ipairs(sorted_keys(schema.types or {})) do
    local v = intent[f]
    local spec = type_spec(schema.types[f])
    local t = spec and M.INTENT_TYPES[spec.type]
    if v ~= nil and v ~= NULL and t and not t.check(v, spec) then
      return nil, string.format("intent field %q must be %s", f,
        type(t.says) == "function" and t.says(spec) or t.says)
    end
  end
  return true
end

return M
