-- Fuzz: the reading of an audit export line (lua/qtg/audit_against.lua, members),
-- which `qtgd audit verify --against FILE` runs on every line of a file
-- from storage the database cannot reach.  It decodes the compared fields
-- of the line's object and steps over every other value without decoding
-- it (a row's detail may nest past any decoder's depth).  Properties, on
-- generated objects and on their mutations:
--   * it never raises: a table, or nil and why;
--   * on any text a strict cjson (no hex, NaN, Infinity or leading zeros)
--     reads as an object, it reads the same values for the fields asked
--     for, or refuses it for one asked for twice (which cjson passes
--     silently) or for what that cjson still reads and JSON is not: a raw
--     control character in a string, a '.' without digits after it ("1.",
--     "-.5");
--   * every text it reads, a strict cjson (no hex, NaN or Infinity, depth
--     past the detail's) reads too: it reads nothing that is not JSON;
--   * a detail nested thousands deep is stepped over.
-- Seed and scale: spec/lua/support/fuzz.lua (QTG_FUZZ_SEED, QTG_FUZZ_SCALE).
local cjson = require "cjson"
local against = require "qtg.audit_against"
local F = require "spec.lua.support.fuzz"

-- cjson as strict as it can be made: what members reads, this must read
local strict = cjson.new()
strict.decode_invalid_numbers(false)
strict.decode_max_depth(100000)


local ASKED = { id = true, network_class = true, chain_seq = true, row_hash = true }

local QUOTED = { '"', '\\"', 'x\\', '"}]', '\\\\"', '"]}{["', '\\u0022' }

-- A line as an export writes one, with generated values around the fields.
local function line_of(g)
  local row = g:object(3)
  if g:chance(0.8) then row.id = g:number() end
  if g:chance(0.8) then row.network_class = g:string() end
  if g:chance(0.8) then row.chain_seq = g:value(1) end
  if g:chance(0.8) then row.row_hash = g:chance(0.5) and string.rep("ab", 32) or g:value(2) end
  row.detail = g:value(4)
  -- strings whose quotes and backslashes the reader must step over
  if g:chance(0.5) then row.note = g:pick(QUOTED) .. g:string() .. g:pick(QUOTED) end
  if g:chance(0.3) then row.detail = { g:pick(QUOTED), { [g:pick(QUOTED)] = g:pick(QUOTED) } } end
  return F.encode(row) or "{}"
end

-- Bytes a mutation puts in: JSON's structure, escapes, and anything.
local PIECES = { "[", "]", "{", "}", '"', "\\", ",", ":", " ", "\\u0000", '\\"', "}}", "]]", "\0", "\255" }

local function mutate(g, text)
  for _ = 1, g:int(1, 4) do
    local k, at = g:int(1, 4), g:int(1, #text + 1)
    if k == 1 then text = text:sub(1, at - 1)
    elseif k == 2 then text = text:sub(1, at - 1) .. g:pick(PIECES) .. text:sub(at)
    elseif k == 3 then text = text:sub(1, at - 1) .. text:sub(at + g:int(1, 8))
    else text = text:sub(1, at - 1) .. g:bytes(g:int(1, 6)) .. text:sub(at) end
  end
  return text
end

-- What the members read agrees with cjson wherever cjson reads an object.
local function agrees(text)
  local ok, out, why = pcall(against.members, text, ASKED)
  if not ok then return false, "raised: " .. tostring(out) end
  if out == nil and type(why) ~= "string" then return false, "nil without a reason" end
  if out ~= nil then
    local sok, err = pcall(strict.decode, text)
    if not sok then return false, "read a text strict cjson refuses: " .. tostring(err) end
  end
  -- cjson reads a text as a C string: what follows a NUL byte is not read
  if text:find("\0", 1, true) then return true end
  local dok, row = pcall(strict.decode, text)
  if not dok or type(row) ~= "table" or text:match("^%s*%[") then return true end
  if out == nil then
    if why:match("is there twice$") then return true end
    local at = tonumber(why:match("%(byte (%d+): "))
    if why:match("a raw control character in a string%)$") and at and text:byte(at) < 32 then return true end
    if why:match("a '%.' without digits after it%)$") and at and text:sub(at, at) == "." then return true end
    if why:match("a value expected%)$") and at and text:sub(at, at + 1) == "-." then return true end
    return false, "refused an object cjson reads: " .. why
  end
  for k in pairs(ASKED) do
    if not F.deep_equal(out[k], row[k]) then
      return false, string.format("field %s: %s, cjson %s", k, F.show(out[k]), F.show(row[k]))
    end
  end
  return true
end

-- The digest of 300 generated objects as F.encode writes them.
local DIGEST_OF_GENERATED = [[
local F = require "spec.lua.support.fuzz"
local qtg = require "qtg"
local texts = {}
for i = 1, 300 do texts[i] = F.encode(F.gen(i):object(3)) or "-" end
return qtg.crypto.hex(qtg.crypto.sha256(table.concat(texts, "\n")))
]]

describe("fuzz: an audit export line's fields", function()
  it("generates the same line text in every process (one failing iteration replays alone)", function()
    local host = require "spec.lua.support.host"
    local common = require "spec.lua.support.common"
    local dir = host.tmpdir()
    host.write(dir .. "/child.lua", "print((function() " .. DIGEST_OF_GENERATED .. " end)())")
    local here = assert(load(DIGEST_OF_GENERATED))()
    for _ = 1, 2 do
      local rc, out = host.run(common.base_env({}), { common.quote(host.bin), "exec", common.quote(dir .. "/child.lua") })
      assert.equals(0, rc, out)
      assert.equals(here, out:match("^(%x+)\n"), out)
    end
    os.execute("rm -rf " .. common.quote(dir))
  end)

  it("reads generated lines as cjson does", function()
    F.check("audit.members/generated", 3000, function(g) return agrees(line_of(g)) end)
  end)

  it("never raises on mutated lines, and agrees with cjson on what it reads", function()
    F.check("audit.members/mutated", 5000, function(g) return agrees(mutate(g, line_of(g))) end)
  end)

  it("steps over a detail nested thousands deep", function()
    F.check("audit.members/deep", 60, function(g)
      local n = g:int(1000, 20000)
      local text = '{"id":7,"detail":' .. string.rep("[", n) .. string.rep("]", n)
        .. ',"network_class":"c","chain_seq":1,"row_hash":"' .. string.rep("0", 64) .. '"}'
      local out, why = against.members(text, ASKED)
      if not out then return false, why end
      return out.id == 7 and out.network_class == "c" and out.chain_seq == 1, F.show(out)
    end)
    -- unbalanced, it is refused, not read past
    local out, why = against.members('{"id":7,"detail":' .. string.rep("[", 3000) .. "}", ASKED)
    assert.is_nil(out)
    assert.is_string(why)
  end)

end)
