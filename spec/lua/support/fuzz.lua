-- spec/lua/support/fuzz.lua -- generated random inputs for the fuzz specs
-- (spec/lua/fuzz_*_spec.lua): a seeded generator of hostile JSON-ish
-- values, and a loop that runs a property over many of them and reports the
-- seed, the iteration and the input of the first failure.
--
-- The seed is QTG_FUZZ_SEED when set (to replay a failure), else a fixed
-- default, so a plain run is deterministic; QTG_FUZZ_SCALE multiplies every
-- iteration count (e.g. 20 for a longer hunt).  Nothing here does I/O while
-- the module loads.
local bit = require "bit"
local canon = require "qtg.canon_json"

local M = {}

M.DEFAULT_SEED = 20261130
M.seed = tonumber(os.getenv("QTG_FUZZ_SEED") or "") or M.DEFAULT_SEED
M.scale = tonumber(os.getenv("QTG_FUZZ_SCALE") or "") or 1

-- ------------------------------------------------------------ generator
-- xorshift32: independent of math.random, so other specs cannot disturb it.
local Gen = {}
Gen.__index = Gen

function M.gen(seed)
  local x = bit.tobit(seed ~= 0 and seed or 0x9e3779b9)
  return setmetatable({ x = x }, Gen)
end

function Gen:u32()
  local x = self.x
  x = bit.bxor(x, bit.lshift(x, 13))
  x = bit.bxor(x, bit.rshift(x, 17))
  x = bit.bxor(x, bit.lshift(x, 5))
  self.x = x
  return x % 4294967296
end

-- int(a, b): uniform in [a, b].
function Gen:int(a, b)
  return a + self:u32() % (b - a + 1)
end

function Gen:chance(p)
  return self:u32() / 4294967296 < p
end

function Gen:pick(list)
  return list[self:int(1, #list)]
end

-- Strings that look like SQL (they must stay inert: stored and read back
-- byte for byte, never executed).
M.SQL = {
  "'; DROP TABLE movement_requests; --",
  "\"; DROP TABLE audit_events; --",
  "x' OR '1'='1",
  "1; DELETE FROM movement_request_nodes WHERE true; --",
  "$1",
  "$$; TRUNCATE sim_ledger; $$",
  "'); UPDATE movement_requests SET request_state = 'COMPLETED'; --",
  "\\'; SELECT pg_sleep(10); --",
  "E'\\x27'",
  "%s%s%s%n",
  "U&'\\0027'",
  "/* */ UNION SELECT * FROM pg_authid --",
  "NULL",
  "\0'; DROP TABLE plan_nodes; --",
}

local WORDS = { "asset", "amount", "USDC", "withdraw", "status", "tx_hash", "destination",
                "network", "sim", "observes", "venue", "a", "b", "x1", "_", "node", "id" }

local ODD = {
  "", " ", "\t", "\n", "\r\n", "\0", "\1\2\3", "\127", "\255\254", "\192\128", "\237\160\128",
  "é", "𝄞", "\226\128\174", "﻿", "../../etc/passwd", "%", "%%", "\\", "\"", "'", "`",
  "0x", "0x" .. string.rep("a", 40), "-0", "1e309", "NaN", "Infinity", "1.", ".5", "00.10",
  "  12.5", "12.5 ", "1,000.00", "+3", "0", "0.0", "125.50", "1e5",
  "$ref:", "$ref:.", "$ref:withdraw", "$ref:withdraw.", "$ref:withdraw.tx_hash",
  "$ref:Withdraw.x", "$ref:withdraw..x", "$ref:withdraw.a-b.c_d", "$ref:w.x.y.z",
  "$REF:withdraw.x", " $ref:withdraw.x", "$ref:withdraw.tx hash", "$ref:1abc.x",
}

function Gen:word()
  return self:pick(WORDS)
end

function Gen:bytes(n)
  local t = {}
  for i = 1, n do t[i] = string.char(self:int(0, 255)) end
  return table.concat(t)
end

function Gen:string()
  local k = self:int(1, 10)
  if k == 1 then return self:pick(M.SQL) end
  if k == 2 then return self:pick(ODD) end
  if k == 3 then return self:bytes(self:int(0, 24)) end
  if k == 4 then return self:word() .. "_" .. self:int(0, 99) end
  if k == 5 then return "$ref:" .. self:word() .. "." .. self:word() end
  if k == 6 then return string.rep(self:pick({ "a", "'", "\\", "é", "$" }), self:int(60, 5000)) end
  if k == 7 then return self:pick(M.SQL) .. self:pick(ODD) .. self:word() end
  return self:word()
end

function Gen:number()
  local k = self:int(1, 9)
  if k == 1 then return self:int(0, 1000) end
  if k == 2 then return -self:int(0, 1000) end
  if k == 3 then return self:int(0, 100000) / 100 end
  if k == 4 then return 2 ^ 53 + self:int(0, 3) end
  if k == 5 then return self:pick({ 1e308, -1e308, 5e-324, 0.1, 1e20, 1e-7 }) end
  if k == 6 then return -0.0 end
  if k == 7 then return self:int(1, 1e9) end
  return self:int(0, 12)
end

-- value(depth, opts): a random JSON-like Lua value.  opts.nonfinite adds
-- inf and nan (only a Lua caller, e.g. the console, can hand those in).
function Gen:value(depth, opts)
  depth = depth or 3
  local k = self:int(1, depth > 0 and 9 or 6)
  if k == 1 then return require("cjson").null end
  if k == 2 then return self:chance(0.5) end
  if k == 3 then
    if opts and opts.nonfinite and self:chance(0.1) then
      return self:pick({ math.huge, -math.huge, 0 / 0 })
    end
    return self:number()
  end
  if k <= 6 then return self:string() end
  if k <= 7 then return self:array(depth - 1, opts) end
  return self:object(depth - 1, opts)
end

function Gen:array(depth, opts)
  local t = {}
  for i = 1, self:int(0, 4) do t[i] = self:value(depth, opts) end
  return t
end

function Gen:object(depth, opts)
  local t = {}
  for _ = 1, self:int(0, 5) do
    t[self:chance(0.7) and self:word() or self:string()] = self:value(depth, opts)
  end
  return t
end

-- A table nested n levels deep (arrays and objects alternating).
function Gen:deep(n, leaf)
  local v = leaf
  for i = 1, n do
    if i % 2 == 0 then v = { v } else v = { k = v } end
  end
  return v
end

-- ------------------------------------------------------------- helpers
-- A printable form of any value, for failure messages (bounded).
function M.show(v, limit)
  limit = limit or 2000
  local seen = {}
  local function go(x, depth)
    local t = type(x)
    if t == "string" then return string.format("%q", #x > 200 and (x:sub(1, 200) .. "...") or x) end
    if t ~= "table" then return tostring(x) end
    if seen[x] or depth > 12 then return "{...}" end
    seen[x] = true
    local parts = {}
    for k, y in pairs(x) do
      parts[#parts + 1] = "[" .. go(k, depth + 1) .. "]=" .. go(y, depth + 1)
      if #parts > 40 then parts[#parts + 1] = "..."; break end
    end
    seen[x] = nil
    return "{" .. table.concat(parts, ",") .. "}"
  end
  local s = go(v, 0)
  if #s > limit then s = s:sub(1, limit) .. "..." end
  return s
end

-- encode(v): v as JSON text with its object keys sorted (qtg.canon_json),
-- so a text made from a generated value is the same in every process
-- (cjson writes keys in the table's order, which is not); nil when v holds
-- what JSON cannot (NaN, infinity, a key that is not a string, nesting past
-- 64).
function M.encode(v)
  local ok, text = pcall(canon.encode, v)
  return ok and text or nil
end

-- deep_equal(a, b): same JSON value (numbers by value, NaN equal to NaN).
function M.deep_equal(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) == "number" then return a == b or (a ~= a and b ~= b) end
  if type(a) ~= "table" then return a == b end
  for k, v in pairs(a) do
    if not M.deep_equal(v, b[k]) then return false end
  end
  for k in pairs(b) do
    if a[k] == nil then return false end
  end
  return true
end

-- check(name, n, fn): run fn(gen, i) for i = 1..n*scale with one generator
-- per iteration (seeded from the run's seed, the name and i, so one failing
-- iteration replays alone).  fn returns true, or false/nil plus a message;
-- a raise is a failure too.  The first failure raises with the seed, the
-- iteration and the message.  Returns the number of iterations run.
function M.check(name, n, fn)
  local total = math.floor(n * M.scale)
  local h = 0
  for i = 1, #name do h = (h * 31 + name:byte(i)) % 2147483647 end
  for i = 1, total do
    local g = M.gen(bit.tobit((M.seed * 1000003 + h * 7919 + i) % 4294967296))
    local trace
    local ok, res, msg = xpcall(fn, function(e) trace = debug.traceback("", 2); return e end, g, i)
    if not ok or not res then
      local why = not ok and ("raised: " .. (type(res) == "table" and
        (tostring(res.message or "") .. " " .. M.show(res)) or tostring(res))) or tostring(msg)
      error(string.format("%s: iteration %d failed (QTG_FUZZ_SEED=%d): %s%s",
        name, i, M.seed, why, trace and ("\n" .. trace:sub(1, 1500)) or ""), 0)
    end
  end
  return total
end

return M
