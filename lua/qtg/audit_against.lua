-- qtg.audit_against: the audit trail against an earlier `qtgd audit
-- export` (qtgd audit verify --against FILE; docs/security.md, "Tamper
-- evidence").  The chain walk (qtg.audit.verify) finds a row edited or
-- deleted by someone who did not also rewrite every later hash and the
-- chain's head; this finds the rest, against a copy the database cannot
-- reach: the owner deleting a chain's newest rows and moving its head back,
-- or rewriting and re-hashing a whole chain.
--   compare(s, f, since_id) -> report  every row of the export (the open
--                                      file f) still in the database as exported
--   export_lines(f[, max])             the file's lines, a chunk at a time
--   members(text, wanted)              the compared fields of a line's object
local cjson = require "cjson"
local canon = require "qtg.canon_json"
local errors = require "qtg.errors"

local M = {}

local NULL = cjson.null

-- An export line is read in chunks, so memory is bounded by the longest
-- line, and a line longer than MAX_LINE is refused (a file without
-- newlines must not be read whole).  The bound is above what a row can
-- hold (a jsonb value is at most 255 MB, escaped in the line): the
-- runtime role writes audit rows' details, and one row of its own must not
-- make every later export unreadable.
M.MAX_LINE = 1024 * 1024 * 1024
M.CHUNK = 64 * 1024
-- Export rows looked up per statement (WHERE id = ANY ($1)).
M.COMPARE_BATCH = 1000

local function bad_export(line, fmt, ...)
  errors.raise_with("bad_export", { line = line }, "line %d: " .. fmt, line, ...)
end

-- export_lines(f[, max]) -> an iterator of (text, number) over the lines of
-- the open file f (a last line without a newline included, a trailing CR
-- dropped); raises a bad_export error for a line longer than max bytes, an
-- unreadable_export error when f cannot be read.
function M.export_lines(f, max)
  max = max or M.MAX_LINE
  local buf, pos, n = "", 1, 0
  local held, held_len = {}, 0 -- the current line's text from earlier chunks
  local function take(last)
    local text = #held > 0 and table.concat(held) .. last or last
    held, held_len = {}, 0
    n = n + 1
    if text:sub(-1) == "\r" then text = text:sub(1, -2) end
    return text, n
  end
  return function()
    while true do
      local nl = buf:find("\n", pos, true)
      if nl then
        local piece = buf:sub(pos, nl - 1)
        pos = nl + 1
        if held_len + #piece > max then bad_export(n + 1, "longer than %d bytes: not an audit export line", max) end
        return take(piece)
      end
      if pos <= #buf then
        held[#held + 1] = buf:sub(pos)
        held_len = held_len + #buf - pos + 1
        if held_len > max then bad_export(n + 1, "longer than %d bytes: not an audit export line", max) end
      end
      local chunk, err = f:read(M.CHUNK)
      if chunk == nil then
        if err then errors.raise_with("unreadable_export", { line = n + 1 }, "%s", tostring(err)) end
        buf, pos = "", 1
        if held_len > 0 then return take("") end
        return nil
      end
      buf, pos = chunk, 1
    end
  end
end

local function whole(v, least)
  return type(v) == "number" and v == math.floor(v) and v >= least and v < 2 ^ 53
end

-- The fields of an export line that are compared, and what each must be.
local FIELDS = {
  { "id", function(v) return whole(v, 1) end, "a whole number >= 1" },
  { "network_class", function(v) return type(v) == "string" and canon.text_ok(v) end,
    "a string of valid UTF-8 without NUL" },
  { "chain_seq", function(v) return whole(v, 1) end, "a whole number >= 1" },
  { "row_hash", function(v) return type(v) == "string" and #v == 64 and v:match("^[0-9a-f]+$") ~= nil end,
    "64 hex digits" },
}

-- ---- the members of a line's object, nested values stepped over ----------
-- Only the compared fields are decoded: a row's detail (written by the
-- runtime role) may nest deeper than a decoder allows, and is stepped over
-- by counting brackets outside strings, never decoded.  The whole line is
-- first checked to be JSON as RFC 8259 writes it, at any depth
-- (canon.syntax_error): a line cjson would read but a strict reader would
-- not (a raw tab in a string, 0x10 for a number, a broken value in a field
-- stepped over) is refused, not read one way here and another elsewhere.

local function skip_space(t, i) return t:find("[^ \t\r\n]", i) or #t + 1 end

-- the closing quote of the JSON string opening at i, or nil
local function string_end(t, i)
  local j = i + 1
  while true do
    local q = t:find('["\\]', j)
    if not q then return nil end
    if t:byte(q) == 34 then return q end
    j = q + 2 -- the escaped character
  end
end

-- the closing bracket of the array or object opening at i, or nil
local function nested_end(t, i)
  local depth, j = 0, i
  while true do
    local k = t:find('[][{}"]', j)
    if not k then return nil end
    local c = t:byte(k)
    if c == 34 then
      k = string_end(t, k)
      if not k then return nil end
    elseif c == 91 or c == 123 then
      depth = depth + 1
    else
      depth = depth - 1
      if depth == 0 then return k end
    end
    j = k + 1
  end
end

-- the last byte of the value at i, or nil
local function value_end(t, i)
  local c = t:byte(i)
  if c == 34 then return string_end(t, i) end
  if c == 91 or c == 123 then return nested_end(t, i) end
  local e = (t:find("[,}%s]", i) or #t + 1) - 1
  return e >= i and e or nil
end

-- members(text, wanted) -> {key = decoded value} of the members of the JSON
-- object `text` whose keys `wanted` names | nil, why (text that is not
-- strictly JSON, or a wanted key given twice)
function M.members(t, wanted)
  local i = skip_space(t, 1)
  if t:byte(i) ~= 123 then return nil, "not a JSON object" end
  local bad = canon.syntax_error(t)
  if bad then return nil, "not JSON (" .. bad .. ")" end
  local out = {}
  i = skip_space(t, i + 1)
  if t:byte(i) == 125 then
    if skip_space(t, i + 1) <= #t then return nil, "not JSON (text after the object)" end
    return out
  end
  while true do
    local ke = t:byte(i) == 34 and string_end(t, i)
    local okk, key = pcall(cjson.decode, ke and t:sub(i, ke) or "")
    if not okk or type(key) ~= "string" then return nil, "not JSON (a member's key expected)" end
    i = skip_space(t, ke + 1)
    if t:byte(i) ~= 58 then return nil, "not JSON (':' expected after a key)" end
    i = skip_space(t, i + 1)
    local ve = value_end(t, i)
    if not ve then return nil, "not JSON (a value expected)" end
    if wanted[key] then
      if out[key] ~= nil then return nil, "the field " .. key .. " is there twice" end
      local okv, v = pcall(cjson.decode, t:sub(i, ve))
      if not okv then return nil, "not JSON (the field " .. key .. ")" end
      out[key] = v
    end
    i = skip_space(t, ve + 1)
    local sep = t:byte(i)
    if sep == 125 then
      if skip_space(t, i + 1) <= #t then return nil, "not JSON (text after the object)" end
      return out
    end
    if sep ~= 44 then return nil, "not JSON (',' or '}' expected)" end
    i = skip_space(t, i + 1)
  end
end

local WANTED = { id = true, network_class = true, chain_seq = true, row_hash = true }

-- parse_line(text, n) -> {line, id, network_class, chain_seq, row_hash}
local function parse_line(text, n)
  if not text:find("%S") then bad_export(n, "empty") end
  local row, why = M.members(text, WANTED)
  if not row then bad_export(n, "%s", why) end
  local rec = { line = n }
  for _, f in ipairs(FIELDS) do
    local v = row[f[1]]
    if v == nil or v == NULL then bad_export(n, "the field %s is missing", f[1]) end
    if not f[2](v) then bad_export(n, "the field %s must be %s", f[1], f[3]) end
    rec[f[1]] = v
  end
  return rec
end

M.ROWS_SQL = [[
SELECT id, network_class, chain_seq, row_hash FROM audit_events WHERE id = ANY ($1::bigint[])]]

M.CHAIN_END_SQL = [[
SELECT (SELECT max(chain_seq) FROM audit_events WHERE network_class = $1) AS last_seq,
       (SELECT id FROM audit_events WHERE network_class = $1 AND chain_seq = $2) AS holder]]

-- difference(s, rec, row) -> nil when the database row is the export's,
-- else {line, id, network_class, chain_seq, problem, meaning}.
local function difference(s, rec, row)
  local d = { line = rec.line, id = rec.id, network_class = rec.network_class, chain_seq = rec.chain_seq }
  if row == nil then
    local c = s:query(M.CHAIN_END_SQL, rec.network_class, rec.chain_seq)[1]
    local last = c.last_seq ~= NULL and c.last_seq or 0
    if last < rec.chain_seq then
      d.problem = "chain_ends_earlier"
      d.meaning = string.format("the chain ends at place %d in the database, before this row of the export: "
        .. "its newest rows were deleted", last)
    else
      d.problem = "missing"
      d.meaning = "the row is not in the database (deleted)" .. (c.holder ~= NULL
        and string.format("; its place in the chain is row %s's now", tostring(c.holder)) or "")
    end
  elseif row.network_class ~= rec.network_class or row.chain_seq ~= rec.chain_seq then
    d.problem = "moved"
    d.meaning = string.format("in the database the row is at chain %q, place %s", row.network_class,
      tostring(row.chain_seq))
  elseif row.row_hash ~= rec.row_hash then
    d.problem = "changed"
    d.meaning = string.format("its row_hash is %s in the database, %s in the export: the row, or one "
      .. "before it in its chain, was rewritten", row.row_hash, rec.row_hash)
  else
    return nil
  end
  return d
end

-- compare_batch(s, batch) -> the first difference of the batch, or nil
local function compare_batch(s, batch)
  local ids = {}
  for i, rec in ipairs(batch) do ids[i] = string.format("%d", rec.id) end
  local found = {}
  for _, row in ipairs(s:query(M.ROWS_SQL, "{" .. table.concat(ids, ",") .. "}")) do found[row.id] = row end
  for _, rec in ipairs(batch) do
    local d = difference(s, rec, found[rec.id])
    if d then return d end
  end
  return nil
end

-- What ends the reading of an export: a line that is not an export row
-- (bad_export: a half-written last line, say) or a file that cannot be read.
local UNUSABLE = { bad_export = true, unreadable_export = true }

-- compare(s, f, since_id) -> {ok = bool, lines = n, compared = n, skipped
-- = n, difference = {line, id, network_class, chain_seq, problem, meaning}
-- or nil, unusable = {kind, line, message} or nil}: each row of the export read from the open file f must be in
-- the database with the same chain, place and row_hash, read in
-- COMPARE_BATCH lines at a time.  A row that is not there is `missing`, or
-- `chain_ends_earlier` when its chain now ends before its place (the tail
-- was cut); the first difference in the file's order is reported.  Rows
-- with an id below since_id are read and checked for form but not
-- compared (verify --since: the rows from ID on); rows of the database
-- that the export does not hold are not looked at.  A line that is not an
-- export row ends the reading (report.unusable, kind bad_export, naming
-- it; unreadable_export: the file cannot be read), after the complete
-- lines before it are compared.
function M.compare(s, f, since_id)
  local since = since_id or 0
  local report = { ok = true, lines = 0, compared = 0, skipped = 0 }
  local batch = {}
  local function flush()
    if #batch == 0 then return true end
    local d = compare_batch(s, batch)
    if d then report.ok, report.difference = false, d end
    report.compared = report.compared + #batch
    batch = {}
    return d == nil
  end
  local ok, err = pcall(function()
    for text, n in M.export_lines(f) do
      report.lines = n
      local rec = parse_line(text, n)
      if rec.id < since then
        report.skipped = report.skipped + 1
      else
        batch[#batch + 1] = rec
        if #batch >= M.COMPARE_BATCH and not flush() then return end
      end
    end
  end)
  if not ok and not (type(err) == "table" and UNUSABLE[err.kind]) then error(err, 0) end
  -- the complete lines before a bad one are compared all the same
  if report.ok then flush() end
  if not ok then
    report.ok = false
    report.unusable = { kind = err.kind, line = err.line, message = err.message }
  end
  return report
end

return M
