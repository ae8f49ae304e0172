-- qtg.ref: `$ref:node_key.field` expressions in a plan node's config.
--
-- A top-level config value that is exactly "$ref:<node_key>.<field>[.<sub>...]"
-- is replaced, at dispatch time, by that field of <node_key>'s provider_refs.
-- The ref map is namespaced: one entry per COMPLETED node of the request,
-- keyed by node_key (every completed node, not only direct predecessors).
-- Values below the top level are never resolved (the template loader refuses
-- them; see M.nested_refs).  An unresolvable ref raises an error with
-- code = "CONFIG_REF_UNRESOLVED", which the dispatcher records on the node.
local qtg = require "qtg"
local canon = require "qtg.canon_json"

local M = {}

M.PREFIX = "$ref:"
M.UNRESOLVED = "CONFIG_REF_UNRESOLVED"

local NODE_PATTERN = "^[a-z][a-z0-9_]*$"
local FIELD_PATTERN = "^[A-Za-z0-9_%-]+$"

local function unresolved(ref, why)
  return qtg.error("config_ref_unresolved",
    string.format("%s: cannot resolve %s: %s", M.UNRESOLVED, ref, why), { code = M.UNRESOLVED, ref = ref })
end

function M.is_ref(v)
  return type(v) == "string" and v:sub(1, #M.PREFIX) == M.PREFIX
end

-- parse("$ref:withdraw.receipt.txid") -> "withdraw", {"receipt", "txid"}
-- or nil, reason for a malformed expression.
function M.parse(s)
  if not M.is_ref(s) then return nil, "not a $ref expression" end
  local body = s:sub(#M.PREFIX + 1)
  local parts = {}
  for part in (body .. "."):gmatch("([^.]*)%.") do parts[#parts + 1] = part end
  local node_key = table.remove(parts, 1)
  if not node_key or not node_key:match(NODE_PATTERN) then
    return nil, string.format("%q: node key must match [a-z][a-z0-9_]*", s)
  end
  if #parts == 0 then
    return nil, string.format("%q: expected $ref:node_key.field", s)
  end
  for _, p in ipairs(parts) do
    if not p:match(FIELD_PATTERN) then
      return nil, string.format("%q: bad field name %q", s, p)
    end
  end
  return node_key, parts
end

-- The namespaced ref map: node_key -> provider_refs, for COMPLETED nodes only.
function M.ref_map(nodes)
  local map = {}
  for _, n in ipairs(nodes) do
    if n.node_state == "COMPLETED" and type(n.provider_refs) == "table" then
      map[n.node_key] = n.provider_refs
    end
  end
  return map
end

local NULL = require("cjson").null  -- equal to qtg.db.NULL

local function is_null(v)
  return v == nil or v == NULL
end

-- Resolve one expression against the ref map; raises unresolved(...).
function M.lookup(expr, map)
  local node_key, path = M.parse(expr)
  if not node_key then error(unresolved(expr, path), 0) end
  local v = map[node_key]
  if v == nil then
    error(unresolved(expr, "node " .. node_key .. " is not a completed node of this request"), 0)
  end
  for i, field in ipairs(path) do
    if type(v) ~= "table" then
      error(unresolved(expr, "field " .. table.concat(path, ".", 1, i - 1) .. " is not an object"), 0)
    end
    v = v[field]
    if v == nil or is_null(v) then
      error(unresolved(expr, "node " .. node_key .. " has no field " .. table.concat(path, ".", 1, i)), 0)
    end
  end
  return canon.copy(v)
end

-- resolve(config, map) -> resolved config (a copy), bindings
-- bindings: expression -> resolved value (the ExecutionContext's
-- resolved_bindings).  Only top-level values are resolved.
function M.resolve(config, map)
  local out, bindings = {}, {}
  for k, v in pairs(config or {}) do
    if M.is_ref(v) then
      local value = M.lookup(v, map)
      out[k] = value
      bindings[v] = value
    else
      out[k] = canon.copy(v)
    end
  end
  return out, bindings
end

-- Every $ref expression in a config, with its path: for the template loader.
-- Returns top, nested: arrays of {path = "a.b", expr = "$ref:..."}.
function M.scan(config)
  local top, nested = {}, {}
  local function walk(v, path, depth)
    if M.is_ref(v) then
      local list = depth == 1 and top or nested
      list[#list + 1] = { path = path, expr = v }
    elseif type(v) == "table" then
      for k, x in pairs(v) do
        walk(x, path == "" and tostring(k) or (path .. "." .. tostring(k)), depth + 1)
      end
    end
  end
  for k, v in pairs(config or {}) do walk(v, tostring(k), 1) end
  local by_path = function(a, b) return a.path < b.path end
  table.sort(top, by_path)
  table.sort(nested, by_path)
  return top, nested
end

return M
