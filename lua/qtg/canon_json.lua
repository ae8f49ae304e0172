-- qtg.canon_json: canonical JSON text (sorted object keys, exact integers).
-- Used for hashes (graph hash, compiled plan hash) and for every jsonb value
-- the engine writes, because cjson cannot tell an empty array from an empty
-- object: mark arrays with M.array(t) (a decoded JSON array of length > 0 is
-- recognised by its keys 1..n).
local M = {}

local array_mt = { __name = "qtg.canon_json.array" }

function M.array(t)
  return setmetatable(t or {}, array_mt)
end

function M.is_array(t)
  if getmetatable(t) == array_mt then return true end
  local n = #t
  if n == 0 then return false end
  local count = 0
  for _ in pairs(t) do count = count + 1 end
  return count == n
end

local escapes = {
  ['"'] = '\\"', ['\\'] = '\\\\', ['\b'] = '\\b', ['\f'] = '\\f',
  ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t',
}

local NEEDS_ESCAPE = '[%c"\\]'

local function escape(c)
  return escapes[c] or string.format("\\u%04x", c:byte())
end

-- Most strings (keys, ids, states) need no escape: they are quoted as they
-- are, without gsub's pass and its copy.
local function encode_string(s)
  if s:find(NEEDS_ESCAPE) then s = s:gsub(NEEDS_ESCAPE, escape) end
  return '"' .. s .. '"'
end

local function encode_number(n)
  if n ~= n or n == math.huge or n == -math.huge then
    error("canon_json: cannot encode " .. tostring(n), 0)
  end
  if n == math.floor(n) and math.abs(n) < 2^53 then
    return string.format("%d", n)
  end
  return string.format("%.17g", n)
end

local encode

local function encode_table(t, depth)
  if depth > 64 then error("canon_json: nesting deeper than 64", 0) end
  local parts = {}
  if M.is_array(t) then
    for i = 1, #t do parts[i] = encode(t[i], depth + 1) end
    return "[" .. table.concat(parts, ",") .. "]"
  end
  local keys = {}
  for k in pairs(t) do
    if type(k) ~= "string" then
      error("canon_json: object key of type " .. type(k), 0)
    end
    keys[#keys + 1] = k
  end
  table.sort(keys)
  for i, k in ipairs(keys) do
    parts[i] = encode_string(k) .. ":" .. encode(t[k], depth + 1)
  end
  return "{" .. table.concat(parts, ",") .. "}"
end

local encoders = {
  ["nil"] = function() return "null" end,
  boolean = function(v) return v and "true" or "false" end,
  number = encode_number,
  string = encode_string,
  table = encode_table,
  -- cjson.null / qtg.db.NULL are lightuserdata NULL pointers
  userdata = function() return "null" end,
}

encode = function(v, depth)
  local f = encoders[type(v)]
  if not f then error("canon_json: cannot encode a " .. type(v), 0) end
  return f(v, depth or 0)
end

function M.encode(v)
  return encode(v, 0)
end

-- The length of the valid UTF-8 character at s[i], or nil: no NUL, no
-- overlong form, no surrogate, nothing past U+10FFFF.
local function char_len(s, i, n)
  local c = s:byte(i)
  if c == 0 then return nil end
  if c < 0x80 then return 1 end
  local len
  if c >= 0xC2 and c <= 0xDF then len = 2
  elseif c >= 0xE0 and c <= 0xEF then len = 3
  elseif c >= 0xF0 and c <= 0xF4 then len = 4
  else return nil end
  if i + len - 1 > n then return nil end
  local c2 = s:byte(i + 1)
  if (c == 0xE0 and c2 < 0xA0) or (c == 0xED and c2 > 0x9F)
      or (c == 0xF0 and c2 < 0x90) or (c == 0xF4 and c2 > 0x8F) then
    return nil
  end
  for j = i + 1, i + len - 1 do
    local b = s:byte(j)
    if b < 0x80 or b > 0xBF then return nil end
  end
  return len
end

-- text_ok(s): s can be stored as PostgreSQL text or inside jsonb: valid
-- UTF-8 (no overlong forms, surrogates or code points past U+10FFFF) and no
-- NUL byte (text cannot hold one, jsonb refuses \u0000).
function M.text_ok(s)
  if not s:find("[%z\128-\255]") then return true end
  local i, n = 1, #s
  while i <= n do
    local len = char_len(s, i, n)
    if not len then return false end
    i = i + len
  end
  return true
end

-- text_repaired(s) -> s when M.text_ok(s), else s with each byte that
-- starts no valid character (a NUL included) replaced by U+FFFD: for
-- messages that repeat what a client sent (a path, a header), which must
-- stay valid JSON text.
function M.text_repaired(s)
  if M.text_ok(s) then return s end
  local out, i, n = {}, 1, #s
  while i <= n do
    local len = char_len(s, i, n)
    if len then out[#out + 1] = s:sub(i, i + len - 1); i = i + len
    else out[#out + 1] = "\239\191\189"; i = i + 1 end
  end
  return table.concat(out)
end

-- excerpt(v, max) -> a peer's text made storable: tostring(v) with its
-- control bytes blanked, cut at max bytes ("..." marks a cut) and made
-- valid UTF-8 (M.text_repaired).  Bodies and error messages of HTTP peers,
-- RPC nodes and providers go through it before they are logged or written:
-- PostgreSQL refuses text that is not UTF-8 or holds a NUL, and a cut at a
-- byte count can split a character even in an honest peer's answer.
function M.excerpt(v, max)
  local s = tostring(v):gsub("[%z\1-\31\127]", " ")
  local long = #s > max
  if long then s = s:sub(1, max) end
  s = M.text_repaired(s)
  return long and s .. "..." or s
end

-- The steps from v to its first string, value or key, that fails
-- M.text_ok, last step first; nil when none does.  The path's text is made
-- only for what is found: made at every level on the way down, a document
-- of long keys nested deep cost memory of its depth squared.
-- The steps down to the first value or key of v that is_bad says is bad,
-- innermost first; nil when none is.
local function bad_steps(v, is_bad)
  if type(v) ~= "table" then return is_bad(v) and {} or nil end
  for k, x in pairs(v) do
    if type(k) == "string" and is_bad(k) then return { " (a key)" } end
    local steps = bad_steps(x, is_bad)
    if steps then
      steps[#steps + 1] = type(k) == "number" and ("[" .. k .. "]") or ("." .. tostring(k))
      return steps
    end
  end
  return nil
end

local function bad_path(v, path, is_bad)
  local steps = bad_steps(v, is_bad)
  if not steps then return nil end
  local out = { path }
  for i = #steps, 1, -1 do out[#out + 1] = steps[i] end
  return table.concat(out)
end

local function bad_text(v) return type(v) == "string" and not M.text_ok(v) end
local function inexact(v) return type(v) == "number" and (v >= 2 ^ 53 or v <= -2 ^ 53) end

-- bad_text_path(v, path) -> where in v (path, then ".key" / "[i]" steps)
-- the first string, value or key, fails M.text_ok; nil when none does.
-- Call it on an encodable value (M.encode bounds the depth).
function M.bad_text_path(v, path) return bad_path(v, path, bad_text) end

-- inexact_number_path(v, path) -> where in v the first number of 2^53 or
-- more in size is (a double, cjson's and JavaScript's number, holds such
-- an integer only to about 16 digits: it was rounded when the text was
-- read), or nil.  Call it on an encodable value.
function M.inexact_number_path(v, path) return bad_path(v, path, inexact) end

-- storable(v[, name]) -> true | nil, reason: v can be written to a jsonb
-- column -- M.encode accepts it (finite numbers, string keys, at most 64
-- levels) and every string in it, keys included, passes M.text_ok (the
-- reason names where, from `name`, default "value").  Found by the fuzz
-- specs: without it such values raised deep inside a write.
function M.storable(v, name)
  local ok, err = pcall(M.encode, v)
  if not ok then return nil, tostring(err) end
  local bad = M.bad_text_path(v, name or "value")
  if bad then return nil, bad .. " holds a NUL byte or is not valid UTF-8" end
  return true
end

-- A deep copy that keeps array marks (and marks decoded arrays).
function M.copy(v)
  if type(v) ~= "table" then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = M.copy(x) end
  if M.is_array(v) then setmetatable(out, array_mt) end
  return out
end

-- duplicate_key(text) -> key, path | nil: the first object key that appears
-- twice in one object of the JSON text, keys compared after unescaping
-- ("a" and "\u0061" are one key), and the path of that object.  cjson
-- keeps the last of two equal keys, PostgreSQL's jsonb too, while a reviewer
-- reading the text may see the first: a document with one is refused.  Call
-- it on text a decoder already accepted (it does not check the syntax).
-- One pass, linear in the text (a key set per open object).
local find, byte, sub = string.find, string.byte, string.sub
local B_QUOTE, B_BSLASH, B_LBRACE, B_RBRACE = 34, 92, 123, 125
local B_LBRACKET, B_RBRACKET, B_COMMA, B_COLON = 91, 93, 44, 58

local function unescape(raw)
  if not find(raw, "\\", 1, true) then return raw end
  local ok, v = pcall(require("cjson").decode, '"' .. raw .. '"')
  return ok and v or raw
end

-- The path of the object open at depth: "$", then ".key" or "[]" for each
-- level in steps (made only for a duplicate found: made at every level, a
-- document of long keys nested deep cost memory of its depth squared).
local function path_of(steps, depth)
  return "$" .. table.concat(steps, "", 2, depth)
end

function M.duplicate_key(text)
  local stack, steps, depth = {}, {}, 0
  local expect_key, last_key = false, nil
  local i = 1
  while true do
    local p = find(text, '[{}%[%]",:]', i)
    if not p then return nil end
    local c = byte(text, p)
    if c == B_QUOTE then
      local q = p + 1
      local e
      while true do
        e = find(text, '["\\]', q)
        if not e then return nil end
        if byte(text, e) == B_BSLASH then q = e + 2 else break end
      end
      local top = stack[depth]
      if top and expect_key then
        local key = unescape(sub(text, p + 1, e - 1))
        if top[key] then return key, path_of(steps, depth) end
        top[key] = true
        last_key = key
      end
      i = e + 1
    else
      if c == B_LBRACE or c == B_LBRACKET then
        local parent = stack[depth]
        local step = depth == 0 and "" or (parent and ("." .. tostring(last_key)) or "[]")
        depth = depth + 1
        stack[depth] = c == B_LBRACE and {} or false
        steps[depth] = step
        expect_key = c == B_LBRACE
      elseif c == B_RBRACE or c == B_RBRACKET then
        stack[depth], steps[depth] = nil, nil
        depth = depth - 1
        expect_key = false
      elseif c == B_COMMA then
        expect_key = stack[depth] and true or false
      else
        expect_key = false
      end
      i = p + 1
    end
  end
end

-- ---- strict syntax ---------------------------------------------------------
-- syntax_error(text) -> nil when text is one JSON value as RFC 8259 writes
-- it (strings without raw control characters and with only its escapes, a
-- low surrogate escape after each high one and nowhere else, numbers
-- without hex, a leading '+', a leading zero or a bare '.', no NaN or
-- Infinity, nothing after the value), else "byte N: what".  Any depth: the
-- open containers are a stack of bytes, not a recursion.  cjson reads more
-- than this (raw tabs in strings, and hex or NaN unless told not to), and
-- refuses depth past its limit: a reader that must refuse every text that
-- is not JSON, and read one nested deeper than cjson allows, checks here
-- first (qtg.audit_against).
local B_SPACE_SET = "[^ \t\r\n]"
local ESCAPE_OK = { [34] = true, [92] = true, [47] = true, [98] = true,
  [102] = true, [110] = true, [114] = true, [116] = true }

local function skip_space(t, i) return find(t, B_SPACE_SET, i) or #t + 1 end

-- the closing quote of the string opening at i | nil, why, the byte at fault
local function strict_string_end(t, i)
  local j, low_due = i + 1, false
  while true do
    local k = find(t, '[%z\1-\31"\\]', j)
    if not k then return nil, "a string without its closing quote", i end
    local c = byte(t, k)
    local unit -- the UTF-16 unit of a \u escape
    if c == B_BSLASH then
      local e = byte(t, k + 1)
      if e == 117 then
        local hex = find(t, "^%x%x%x%x", k + 2) and sub(t, k + 2, k + 5)
        if not hex then return nil, "\\u without four hex digits", k end
        unit = tonumber(hex, 16)
        j = k + 6
      elseif e and ESCAPE_OK[e] then
        j = k + 2
      else
        return nil, "an escape JSON does not have", k
      end
    elseif c ~= B_QUOTE then
      return nil, "a raw control character in a string", k
    end
    local is_low = unit and unit >= 0xDC00 and unit <= 0xDFFF
    if low_due ~= (is_low or false) then
      return nil, low_due and "a high surrogate escape without its low one"
        or "a low surrogate escape without its high one", k
    end
    low_due = unit ~= nil and unit >= 0xD800 and unit <= 0xDBFF
    if c == B_QUOTE then return k end
    if low_due and sub(t, j, j + 1) ~= "\\u" then
      return nil, "a high surrogate escape without its low one", k
    end
  end
end

-- the last byte of the number, literal or string at i | nil, why, the byte
-- at fault
local function strict_scalar_end(t, i)
  local c = byte(t, i)
  if c == B_QUOTE then return strict_string_end(t, i) end
  for _, word in ipairs({ "true", "false", "null" }) do
    if sub(t, i, i + #word - 1) == word then return i + #word - 1 end
  end
  local _, e = find(t, "^%-?%d+", i)
  if not e then return nil, "a value expected", i end
  local digits = c == 45 and i + 1 or i
  if e > digits and byte(t, digits) == 48 then return nil, "a number with a leading zero", i end
  local _, f = find(t, "^%.%d+", e + 1)
  if f then e = f elseif byte(t, e + 1) == 46 then return nil, "a '.' without digits after it", e + 1 end
  local _, x = find(t, "^[eE][+-]?%d+", e + 1)
  if x then e = x elseif find(t, "^[eE]", e + 1) then return nil, "an exponent without digits", e + 1 end
  return e
end

function M.syntax_error(t)
  local open, depth = {}, 0 -- the open containers' closing bytes
  local i = skip_space(t, 1)
  local want = "value"      -- or "key", or "next" (after a value)
  while true do
    local c = byte(t, i)
    if want == "next" then
      if depth == 0 then
        if i <= #t then return "byte " .. i .. ": text after the value" end
        return nil
      end
      if c == B_COMMA then
        want = open[depth] == B_RBRACE and "key" or "value"
        i = skip_space(t, i + 1)
      elseif c == open[depth] then
        open[depth], depth = nil, depth - 1
        i = skip_space(t, i + 1)
      else
        return "byte " .. i .. ": ',' or '" .. string.char(open[depth]) .. "' expected"
      end
    elseif want == "key" then
      local e, why, at
      if c == B_QUOTE then e, why, at = strict_string_end(t, i) end
      if not e then return "byte " .. (at or i) .. ": " .. (why or "a key expected") end
      i = skip_space(t, e + 1)
      if byte(t, i) ~= B_COLON then return "byte " .. i .. ": ':' expected after a key" end
      want, i = "value", skip_space(t, i + 1)
    elseif c == B_LBRACE or c == B_LBRACKET then
      local close = c == B_LBRACE and B_RBRACE or B_RBRACKET
      i = skip_space(t, i + 1)
      if byte(t, i) == close then
        want, i = "next", skip_space(t, i + 1)
      else
        depth = depth + 1
        open[depth] = close
        want = close == B_RBRACE and "key" or "value"
      end
    else
      if not c then return "byte " .. i .. ": a value expected, the text ended" end
      local e, why, at = strict_scalar_end(t, i)
      if not e then return "byte " .. at .. ": " .. why end
      want, i = "next", skip_space(t, e + 1)
    end
  end
end

-- decode(text[, decoder]) -> value | nil, message: the decoder's (default
-- cjson's) decode in pcall, then M.duplicate_key: one place for "JSON qtg
-- reads".
function M.decode(text, decoder)
  decoder = decoder or require("cjson")
  local ok, v, err = pcall(decoder.decode, text)
  if not ok then return nil, tostring(v) end
  if v == nil then return nil, tostring(err) end   -- a cjson.safe decoder
  local dup, where = M.duplicate_key(text)
  if dup then return nil, string.format("duplicate key %q in %s", dup, where) end
  return v
end

return M
