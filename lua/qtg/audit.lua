-- qtg.audit: checking and copying the hash-chained audit trail
-- (sql/0100_audit_chain.sql; docs/security.md, "Tamper evidence").
--   verify(s, since_id) -> report      walk every chain, find the first broken link
--   compare(s, f, since_id) -> report  every row of an earlier export (the open
--                                      file f) still in the database as exported
--   check_states(s, limit) -> report   every node and request in the state its
--                                      last audited state change names
--   export(s, since_id, write)         every row as one JSON line, in id order
--
-- verify recomputes each row's hash with its own copy of the row text's
-- expression (ROW_TEXT below), never by calling qtg_audit_row_text: a role
-- able to replace that function must not be able to change what is checked.
-- A spec proves the copy and the function agree on a real history.
--
-- What each catches: verify, a row edited or deleted by someone who did not
-- also rewrite every later hash and the chain's head; compare, the rest
-- (the owner deleting a chain's newest rows and moving its head back, or
-- rewriting and re-hashing a whole chain), against a copy the database
-- cannot reach; check_states, a node or request whose state was changed
-- without its audit row (the runtime role may UPDATE those tables).
local cjson = require "cjson"
local canon = require "qtg.canon_json"
local errors = require "qtg.errors"

local M = {}

local NULL = cjson.null

local ROW_TEXT = [[
  jsonb_build_object(
    'id', e.id, 'outbox_id', e.outbox_id, 'actor', e.actor, 'action', e.action,
    'entity_type', e.entity_type, 'entity_id', e.entity_id, 'request_id', e.request_id,
    'detail', e.detail,
    'created_us', (extract(epoch FROM e.created_at) * 1000000)::bigint,
    'promoted_us', (extract(epoch FROM e.promoted_at) * 1000000)::bigint,
    'network_class', e.network_class, 'chain_seq', e.chain_seq)::text]]

-- Every row from since_id on (all rows when nil) is checked against its own
-- hash and the row before it in its chain; the window sees the whole chain,
-- so the first row after since_id is linked to its predecessor too.
M.VERIFY_SQL = [[
WITH chain AS (
  SELECT e.id, e.network_class, e.chain_seq, e.prev_hash, e.row_hash,
         CASE WHEN e.id >= $1 THEN
           encode(sha256(convert_to(e.prev_hash || ]] .. ROW_TEXT .. [[, 'UTF8')), 'hex')
         END AS recomputed,
         lag(e.chain_seq) OVER w AS before_seq,
         lag(e.row_hash) OVER w AS before_hash
    FROM audit_events e
  WINDOW w AS (PARTITION BY e.network_class ORDER BY e.chain_seq)
), judged AS (
  SELECT id, network_class, chain_seq,
         CASE
           WHEN recomputed <> row_hash THEN 'edited'
           WHEN before_seq IS NULL AND chain_seq <> 1 THEN 'missing_before'
           WHEN before_seq + 1 <> chain_seq THEN 'missing_before'
           WHEN before_seq IS NULL AND prev_hash <> repeat('0', 64) THEN 'bad_link'
           WHEN before_hash <> prev_hash THEN 'bad_link'
         END AS problem
    FROM chain
   WHERE id >= $1
)
SELECT j.*, (SELECT count(*) FROM judged) AS checked
  FROM judged j
 ORDER BY (j.problem IS NOT NULL) DESC, j.id LIMIT 1]]

-- A chain whose last rows were deleted ends before its head says it does.
M.HEADS_SQL = [[
SELECT h.network_class, h.chain_seq AS head_seq, h.row_hash AS head_hash,
       e.chain_seq AS last_seq, e.row_hash AS last_hash
  FROM audit_chain_heads h
  LEFT JOIN LATERAL (SELECT chain_seq, row_hash FROM audit_events
                      WHERE network_class = h.network_class
                      ORDER BY chain_seq DESC LIMIT 1) e ON true
 WHERE e.chain_seq IS DISTINCT FROM h.chain_seq OR e.row_hash IS DISTINCT FROM h.row_hash
 ORDER BY h.network_class LIMIT 1]]

local MEANING = {
  edited = "its content no longer hashes to its row_hash (the row was changed)",
  missing_before = "rows before it in its chain are missing (deleted)",
  bad_link = "its prev_hash is not the row_hash of the row before it",
}

-- verify(s, since_id) -> {ok = bool, checked = n, broken = {id, network_class,
-- chain_seq, problem, meaning} or nil}
function M.verify(s, since_id)
  local since = since_id or 0
  local rows = s:query(M.VERIFY_SQL, since)
  local r = rows[1]
  local report = { ok = true, checked = r and tonumber(r.checked) or 0 }
  if r and r.problem ~= nil and r.problem ~= NULL then
    report.ok = false
    report.broken = { id = r.id, network_class = r.network_class, chain_seq = r.chain_seq,
                      problem = r.problem, meaning = MEANING[r.problem] }
    return report
  end
  local h = s:query(M.HEADS_SQL)[1]
  if h then
    report.ok = false
    report.broken = { network_class = h.network_class, chain_seq = h.head_seq,
                      problem = "missing_tail",
                      meaning = string.format("the chain's head is row %s but its last row is %s",
                        tostring(h.head_seq), tostring(h.last_seq)) }
  end
  return report
end

-- ------------------------------------------------------ against an export
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
-- by counting brackets outside strings, never decoded.

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
-- object `text` whose keys `wanted` names | nil, why
function M.members(t, wanted)
  local i = skip_space(t, 1)
  if t:byte(i) ~= 123 then return nil, "not a JSON object" end
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

-- ------------------------------------------------- states against the trail
-- Each state change of a node or a request writes its audit row in the
-- same statement (qtg.outbox.write): a node's action is node.<state>
-- (qtg.outbox), a request's request.<state> (qtg.nodes.set_request_state)
-- or one of these, which name a request state too.  Other actions about a
-- request (request.approval: a vote short of the quorum, request.initiate,
-- request.approval_refused) and node.retry change no state and are passed
-- over.
M.REQUEST_ACTIONS = {
  ["request.create"] = "PENDING_APPROVAL",
  ["request.approve"] = "APPROVED",
  ["request.reject"] = "REJECTED",
  ["request.cancel"] = "CANCELLED",
  ["request.expire"] = "EXPIRED",
  ["request.resume"] = "EXECUTING",
}

-- What is checked, per kind of row: its table and state column, the audit
-- rows' entity_type, the actions that name a state (action, state rows;
-- $2, $3: REQUEST_ACTIONS as two arrays), the state a row has before any
-- audited change (nodes are created BLOCKED with their request, whose
-- request.create row is the only one written; a request without a row
-- naming its state is a mismatch), what its first audited change must be
-- (a node's leaves BLOCKED; a request's is its creation) and the columns
-- the report shows.
M.STATE_CHECKS = {
  { kind = "node", table = "movement_request_nodes", column = "node_state",
    entity_type = "movement_request_node", initial = "'BLOCKED'",
    first = "t.from_state = 'BLOCKED'",
    actions = "SELECT 'node.' || lower(state), state FROM node_states",
    shown = "x.request_id, x.node_key" },
  { kind = "request", table = "movement_requests", column = "request_state",
    entity_type = "movement_request", initial = "NULL::text",
    first = "t.action = 'request.create'",
    actions = "SELECT 'request.' || lower(state), state FROM request_states\n"
      .. "    UNION ALL SELECT * FROM unnest($2::text[], $3::text[])",
    shown = "x.id AS request_id, NULL::text AS node_key" },
}

-- One statement per kind, so its rows, the audit trail and the outbox rows
-- not yet promoted are read in one snapshot: a change and its outbox row
-- commit together, and a promotion moves a row from the outbox to the
-- trail in one statement, so a state is never seen without the row that
-- names it.  The rows are in the order they were written (the outbox id:
-- one sequence for both tables).  Two things are judged per entity:
--   * its state now is the one its latest state-naming row names;
--   * each such row starts where the one before it (or the entity's
--     creation) left it: its from_state is the previous row's state, and
--     the first is the creation (a request's request.create) or leaves the
--     state it was created in (a node's, BLOCKED).  So a change made
--     without its row shows even after the engine has written more rows on
--     top of it (a request set APPROVED by hand, then run by the engine).
-- The trail is read once, sorted by entity and order (one sort serves the
-- window and the DISTINCT ON): no index is needed, and none is added to
-- the promotion's inserts (docs/security.md).
local STATES_SQL = [[
WITH named(action, state) AS (
  %s
), trail AS (
  SELECT e.outbox_id AS seq, e.id AS event_id, e.entity_id, e.action, e.detail->>'from_state' AS from_state
    FROM audit_events e WHERE e.entity_type = '%s'
  UNION ALL
  SELECT o.id, NULL, o.entity_id, o.action, o.detail->>'from_state'
    FROM audit_outbox o WHERE o.entity_type = '%s'
), steps AS (
  SELECT t.entity_id, t.seq, t.event_id, t.action, t.from_state, n.state,
         lag(n.state) OVER (PARTITION BY t.entity_id ORDER BY t.seq) AS before,
         row_number() OVER (PARTITION BY t.entity_id ORDER BY t.seq) = 1 AS first_row,
         max(t.seq) OVER (PARTITION BY t.entity_id) AS last_seq
    FROM trail t JOIN named n ON n.action = t.action
), last AS (
  SELECT entity_id, seq, event_id, state FROM steps WHERE seq = last_seq
), gaps AS (
  SELECT DISTINCT ON (entity_id) entity_id, seq AS gap_seq, event_id AS gap_event, action AS gap_action,
         from_state AS gap_from, before AS gap_before
    FROM steps t
   WHERE CASE WHEN first_row THEN NOT coalesce(%s, false) ELSE from_state IS DISTINCT FROM before END
   ORDER BY entity_id, seq
), judged AS (
  SELECT x.id, %s, x.%s AS state, x.updated_at, l.state AS audited, l.event_id, l.seq AS outbox_id,
         g.gap_seq, g.gap_event, g.gap_action, g.gap_from, g.gap_before,
         (x.%s IS DISTINCT FROM coalesce(l.state, %s) OR g.entity_id IS NOT NULL) AS mismatch
    FROM %s x LEFT JOIN last l ON l.entity_id = x.id::text LEFT JOIN gaps g ON g.entity_id = x.id::text
)
SELECT c.checked, c.mismatched, b.*
  FROM (SELECT count(*) AS checked, count(*) FILTER (WHERE mismatch) AS mismatched FROM judged) c
  LEFT JOIN LATERAL (SELECT * FROM judged WHERE mismatch ORDER BY updated_at DESC, id LIMIT $1) b ON true]]

for _, c in ipairs(M.STATE_CHECKS) do
  c.sql = STATES_SQL:format(c.actions, c.entity_type, c.entity_type, c.first, c.shown, c.column, c.column,
    c.initial, c.table)
end

local function request_action_arrays()
  local names = {}
  for action in pairs(M.REQUEST_ACTIONS) do names[#names + 1] = action end
  table.sort(names)
  local states = {}
  for i, action in ipairs(names) do states[i] = M.REQUEST_ACTIONS[action] end
  return "{" .. table.concat(names, ",") .. "}", "{" .. table.concat(states, ",") .. "}"
end

local function value(v) if v == NULL then return nil end return v end

-- check_states(s[, limit]) -> {ok = bool, checked = {node = n, request =
-- n}, mismatched = {node = n, request = n}, count = n, mismatches =
-- {{kind, id, request_id, node_key, state, audited, event_id, outbox_id,
-- gap}, ...}}: every node and request whose current state is not the one
-- its latest audited state change names (audited nil: none names one), or
-- whose audited changes skip one (gap = {outbox_id, event_id, action,
-- from_state, before}: the first row that does not start where the one
-- before it left the entity, before nil: its first row is not its
-- creation), counted all, listed up to `limit` per kind (default 20), the
-- most recently updated first.  event_id is the audit_events row, or nil
-- while the row is still in audit_outbox (outbox_id).
function M.check_states(s, limit)
  limit = limit or 20
  local names, states = request_action_arrays()
  local report = { ok = true, checked = {}, mismatched = {}, count = 0, mismatches = {} }
  for _, c in ipairs(M.STATE_CHECKS) do
    local rows = c.kind == "request" and s:query(c.sql, limit, names, states) or s:query(c.sql, limit)
    local head = rows[1]
    report.checked[c.kind], report.mismatched[c.kind] = tonumber(head.checked), tonumber(head.mismatched)
    report.count = report.count + report.mismatched[c.kind]
    for _, r in ipairs(rows) do
      if r.id ~= NULL then
        report.mismatches[#report.mismatches + 1] = { kind = c.kind, id = r.id,
          request_id = r.request_id, node_key = value(r.node_key), state = r.state,
          audited = value(r.audited), event_id = value(r.event_id), outbox_id = value(r.outbox_id),
          gap = value(r.gap_seq) and { outbox_id = r.gap_seq, event_id = value(r.gap_event),
            action = r.gap_action, from_state = value(r.gap_from), before = value(r.gap_before) } or nil }
      end
    end
  end
  report.ok = report.count == 0
  return report
end

-- ---------------------------------------------------------------- export
M.EXPORT_SQL = [[
SELECT e.id, row_to_json(e)::text AS line FROM audit_events e
 WHERE e.id > $1 ORDER BY e.id LIMIT $2]]

-- export(s, since_id, write): write(line) for every row with id > since_id
-- (all when nil), in pages of 1000; -> rows written.
function M.export(s, since_id, write)
  local after, n = since_id or 0, 0
  while true do
    local rows = s:query(M.EXPORT_SQL, after, 1000)
    for _, r in ipairs(rows) do write(r.line); after = r.id end
    n = n + #rows
    if #rows < 1000 then return n end
  end
end

return M
