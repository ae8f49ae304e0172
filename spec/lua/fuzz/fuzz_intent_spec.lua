-- Fuzz: intent validation (templates.validate_intent) and request creation
-- (requests.create) on generated random intents over the shipped templates.
-- validate_intent never raises and agrees with an independent reading of
-- the template's intent schema; create either stores the request with its
-- intent, input_params and idempotency key exactly as given (SQL-looking
-- strings included: parameters everywhere) or refuses with a documented
-- kind and writes nothing.  Seed and scale: spec/lua/support/fuzz.lua.
local qtg = require "qtg"
local cjson = require "cjson"
local canon = require "qtg.canon_json"
local templates = require "qtg.templates"
local F = require "spec.lua.support.fuzz"

local NULL = cjson.null
local SHIPPED = { "cctp_bridge", "cex_withdrawal_to_wallet", "dual_venue_funding", "otc_settlement_manual" }
local ACTOR = "console:fuzz"
local schemas = {}

-- A valid value of each intent type, and hostile near-misses.
local function valid_value(g, t)
  if t == "decimal" then return g:pick({ "125.50", "1", "0.000001", "250000", "00012.5" }) end
  if t == "evm_address" then return "0x" .. string.rep(g:pick({ "a", "B", "0", "9" }), 40) end
  if t == "integer" then return g:int(0, 1e6) end
  if t == "object" then return { note = g:pick(F.SQL) } end
  return g:chance(0.5) and g:pick(F.SQL) or g:word()
end

local NEAR = {
  decimal = { "0", "0.0", "-1", "1.", ".5", "1e5", "1,5", " 1", "1 ", "NaN", "0x10", "", "+1", "1.2.3",
              string.rep("9", 79), string.rep("9", 400), "1." .. string.rep("5", 19), string.rep("9", 78) },
  evm_address = { "0x", "0x" .. string.rep("g", 40), "0x" .. string.rep("a", 39), "0x" .. string.rep("a", 41),
                  string.rep("a", 42), "0X" .. string.rep("a", 40) },
  integer = { 1.5, -0.5, "1", 2^53, -2^53, 1e300 },
  object = { "{}", 1, true },
  string = { "", 1, false },
}

-- Fields the shipped templates' risk_controls limit (allowed_assets,
-- allowed_chain_ids): a valid intent stays inside them.
local WITHIN_LIMITS = {
  asset = function(g) return g:pick({ "USDC", "USDT" }) end,
  chain_id = function() return 31337 end,
}

local function valid_intent(g, schema)
  local intent = {}
  local types = schema.types or {}
  for _, f in ipairs(schema.required or {}) do
    intent[f] = WITHIN_LIMITS[f] and WITHIN_LIMITS[f](g) or valid_value(g, types[f] or "string")
  end
  return intent
end

local function mutate(g, intent, schema)
  local fields = {}
  for k in pairs(intent) do fields[#fields + 1] = k end
  table.sort(fields, function(a, b) return tostring(a) < tostring(b) end)
  local op = g:int(1, 9)
  local f = #fields > 0 and g:pick(fields) or "asset"
  local t = (schema.types or {})[f] or "string"
  if op == 1 then intent[f] = nil
  elseif op == 2 then intent[f] = g:value(2, { nonfinite = true })
  elseif op == 3 then intent[f] = g:pick(NEAR[t] or NEAR.string)
  elseif op == 4 then intent[f] = g:pick(F.SQL)
  elseif op == 5 then intent[g:chance(0.5) and g:word() or g:string()] = g:value(3)
  elseif op == 6 then intent[f] = NULL
  elseif op == 7 then intent[f] = g:deep(g:int(40, 80), "x")
  elseif op == 8 then intent[f] = g:number()
  else intent[f] = g:string() end
end

-- The independent reading: ok, or false + why.
local function oracle(schema, intent)
  if type(intent) ~= "table" then return false, "not a table" end
  -- field names: lower-case ASCII letters, digits and _, a letter first, 63 at most
  for k in pairs(intent) do
    if type(k) ~= "string" or #k == 0 or #k > 63 or k:find("[^a-z0-9_]") or not k:sub(1, 1):find("[a-z]") then
      return false, "field name"
    end
  end
  for _, f in ipairs(schema.required or {}) do
    local v = intent[f]
    if v == nil or v == NULL or v == "" then return false, "missing " .. f end
  end
  for f, t in pairs(schema.types or {}) do
    local v = intent[f]
    if v ~= nil and v ~= NULL then
      if t == "string" and not (type(v) == "string" and v ~= "") then return false, f end
      if t == "evm_address" and not (type(v) == "string" and #v == 42 and v:match("^0x[0-9a-fA-F]+$")) then
        return false, f
      end
      if t == "integer" and not (type(v) == "number" and v == math.floor(v) and math.abs(v) < 2^53) then
        return false, f
      end
      if t == "object" and type(v) ~= "table" then return false, f end
      if t == "decimal" then
        if type(v) == "string" then
          if not (v:match("^[0-9]+$") or v:match("^[0-9]+%.[0-9]+$")) or not v:match("[1-9]") then
            return false, f
          end
          local int, frac = v:match("^([0-9]+)%.?([0-9]*)$")
          if #int > 78 or #frac > 18 then return false, f end
        else -- a JSON number is refused: amounts are strings
          return false, f
        end
      end
    end
  end
  return true
end

describe("fuzz: intents", function()
  local s
  setup(function()
    s = qtg.db.acquire()
    for _, k in ipairs(SHIPPED) do
      local row = s:query([[SELECT pv.intent_schema FROM plan_versions pv
                              JOIN movement_templates t ON t.id = pv.template_id
                             WHERE t.template_key = $1 ORDER BY pv.version DESC LIMIT 1]], k)[1]
      if not row then
        local f = assert(io.open(qtg.root .. "/templates/" .. k .. ".json", "rb"))
        local c = assert(templates.decode_and_compile(f:read("*a"), k))
        f:close()
        s:begin(); templates.store(s, c); s:commit()
        row = { intent_schema = c.intent_schema }
      end
      schemas[k] = row.intent_schema
    end
  end)
  teardown(function()
    -- out of every later spec's way (they serve MG_NETWORK_CLASS only)
    s:query([[UPDATE movement_requests SET network_class = 'parked-' || network_class
               WHERE created_by = $1 AND network_class NOT LIKE 'parked-%']], ACTOR)
    s:release()
  end)

  it("validate_intent never raises and agrees with an independent reading of the schema", function()
    local accepted, refused = 0, 0
    F.check("intent.validate", 4000, function(g)
      local schema = schemas[g:pick(SHIPPED)]
      local intent = g:chance(0.03) and g:value(2) or valid_intent(g, schema)
      if type(intent) == "table" then for _ = 1, g:int(0, 3) do mutate(g, intent, schema) end end
      local ok, res, why = pcall(templates.validate_intent, schema, intent)
      if not ok then return false, "raised: " .. tostring(res) .. " on " .. F.show(intent) end
      local want, why_not = oracle(schema, intent)
      if res == true then
        if not want then return false, "accepted an invalid intent (" .. tostring(why_not) .. "): " .. F.show(intent) end
        if not canon.storable(intent) then return false, "accepted an unstorable intent " .. F.show(intent) end
        accepted = accepted + 1
      else
        if type(why) ~= "string" or why == "" then return false, "refused without a reason" end
        if want and canon.storable(intent) then
          return false, "refused a valid intent (" .. why .. "): " .. F.show(intent)
        end
        refused = refused + 1
      end
      return true
    end)
    assert.is_true(accepted > 500, "accepted only " .. accepted)
    assert.is_true(refused > 500, "refused only " .. refused)
  end)

  it("create stores hostile intents exactly, or refuses with a documented kind and writes nothing", function()
    local requests = require "qtg.requests"
    local kinds = { invalid_intent = true, invalid_input = true }
    local count = function()
      return s:query([[SELECT (SELECT count(*) FROM movement_requests)::int AS r,
                              (SELECT count(*) FROM movement_request_nodes)::int AS n,
                              (SELECT count(*) FROM plan_nodes)::int AS p]])[1]
    end
    local before = count()
    local created, refused = 0, 0
    F.check("intent.create", 150, function(g)
      local key = g:pick(SHIPPED)
      local intent = valid_intent(g, schemas[key])
      if g:chance(0.5) then mutate(g, intent, schemas[key]) end
      local idem = g:chance(0.5) and (g:pick(F.SQL) .. qtg.crypto.hex(qtg.crypto.random_bytes(4)))
        or ("fuzz-" .. qtg.crypto.hex(qtg.crypto.random_bytes(8)))
      local input_params = g:chance(0.2) and g:object(2) or { note = g:pick(F.SQL), [g:pick(F.SQL)] = 1 }
      local callback = g:chance(0.2) and g:pick({ "http://127.0.0.1:9/'; DROP TABLE x; --",
        "javascript:alert(1)", g:string() }) or g:pick({ false, "http://127.0.0.1:9/cb?q='--" })
      if not callback then callback = nil end
      local ok, req = pcall(requests.create, s, { template_key = key, intent = intent,
        idempotency_key = idem, input_params = input_params, callback_url = callback }, ACTOR)
      local rows = canon.text_ok(idem) and
        s:query("SELECT * FROM movement_requests WHERE idempotency_key = $1", idem) or {}
      if ok then
        if #rows ~= 1 then return false, "created but not stored once" end
        local row = rows[1]
        if not F.deep_equal(row.intent, intent) then
          return false, "intent changed: " .. F.show(intent) .. " -> " .. F.show(row.intent)
        end
        if not F.deep_equal(row.input_params, input_params) then return false, "input_params changed" end
        if row.id ~= req.id or row.request_state ~= "PENDING_APPROVAL" then return false, "wrong row" end
        created = created + 1
      else
        if type(req) ~= "table" or not kinds[req.kind] then
          return false, "undocumented refusal " .. F.show(req) .. " for intent " .. F.show(intent)
            .. " key " .. F.show(idem) .. " callback " .. F.show(callback)
        end
        if #rows ~= 0 then return false, "refused but written" end
        refused = refused + 1
      end
      if s:in_transaction() then return false, "left a transaction open" end
      return true
    end)
    local after = count()
    assert.equals(before.p, after.p)
    assert.equals(before.r + created, after.r)
    assert.is_true(created > 20 and refused > 20, created .. " created, " .. refused .. " refused")
    -- the tables the SQL-looking strings name are all still there
    for _, t in ipairs({ "movement_requests", "movement_request_nodes", "audit_events", "sim_ledger", "plan_nodes" }) do
      assert.equals(1, #s:query("SELECT 1 FROM pg_tables WHERE tablename = $1", t))
    end
  end)
end)
