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
-- line, and a line longer than MAX_LINE is refused: no writer of the trail
-- makes a row near that size (documents are bounded at 64 KiB), and a file
-- without newlines must not be read whole.
M.MAX_LINE = 64 * 1024 * 1024
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
  { "network_class", function(v) return type(v) == "string" end, "a string" },
  { "chain_seq", function(v) return whole(v, 1) end, "a whole number >= 1" },
  { "row_hash", function(v) return type(v) == "string" and #v == 64 and v:match("^[0-9a-f]+$") ~= nil end,
    "64 hex digits" },
}

-- parse_line(text, n) -> {line, id, network_class, chain_seq, row_hash}
local function parse_line(text, n)
  if not text:find("%S") then bad_export(n, "empty") end
  local ok, row = pcall(cjson.decode, text)
  if not ok then bad_export(n, "not JSON (%s)", tostring(row):sub(1, 200)) end
  if type(row) ~= "table" or row[1] ~= nil then bad_export(n, "not a JSON object") end
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

-- compare(s, f, since_id) -> {ok = bool, lines = n, compared = n, skipped
-- = n, difference = {line, id, network_class, chain_seq, problem, meaning}
-- or nil}: each row of the export read from the open file f must be in
-- the database with the same chain, place and row_hash, read in
-- COMPARE_BATCH lines at a time.  A row that is not there is `missing`, or
-- `chain_ends_earlier` when its chain now ends before its place (the tail
-- was cut); the first difference in the file's order is reported.  Rows
-- with an id below since_id are read and checked for form but not
-- compared (verify --since: the rows from ID on); rows of the database
-- that the export does not hold are not looked at.  A line that is not an
-- export row raises a bad_export error naming it (export_lines: and a file
-- that cannot be read, unreadable_export).
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
  for text, n in M.export_lines(f) do
    report.lines = n
    local rec = parse_line(text, n)
    if rec.id < since then
      report.skipped = report.skipped + 1
    else
      batch[#batch + 1] = rec
      if #batch >= M.COMPARE_BATCH and not flush() then return report end
    end
  end
  flush()
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
-- naming its state is a mismatch) and the columns the report shows.
M.STATE_CHECKS = {
  { kind = "node", table = "movement_request_nodes", column = "node_state",
    entity_type = "movement_request_node", initial = "'BLOCKED'",
    actions = "SELECT 'node.' || lower(state), state FROM node_states",
    shown = "x.request_id, x.node_key" },
  { kind = "request", table = "movement_requests", column = "request_state",
    entity_type = "movement_request", initial = "NULL::text",
    actions = "SELECT 'request.' || lower(state), state FROM request_states\n"
      .. "    UNION ALL SELECT * FROM unnest($2::text[], $3::text[])",
    shown = "x.id AS request_id, NULL::text AS node_key" },
}

-- One statement per kind, so its rows, the audit trail and the outbox rows
-- not yet promoted are read in one snapshot: a change and its outbox row
-- commit together, and a promotion moves a row from the outbox to the
-- trail in one statement, so a state is never seen without the row that
-- names it.  The latest row is the highest outbox id (the order the rows
-- were written; one sequence for both tables).  The trail is read once,
-- sorted by entity (DISTINCT ON): no index is needed, and none is added
-- to the promotion's inserts (docs/security.md).
local STATES_SQL = [[
WITH named(action, state) AS (
  %s
), trail AS (
  SELECT e.outbox_id AS seq, e.id AS event_id, e.entity_id, e.action
    FROM audit_events e WHERE e.entity_type = '%s'
  UNION ALL
  SELECT o.id, NULL, o.entity_id, o.action
    FROM audit_outbox o WHERE o.entity_type = '%s'
), last AS (
  SELECT DISTINCT ON (t.entity_id) t.entity_id, t.seq, t.event_id, n.state
    FROM trail t JOIN named n ON n.action = t.action
   ORDER BY t.entity_id, t.seq DESC
), judged AS (
  SELECT x.id, %s, x.%s AS state, x.updated_at, l.state AS audited, l.event_id, l.seq AS outbox_id,
         x.%s IS DISTINCT FROM coalesce(l.state, %s) AS mismatch
    FROM %s x LEFT JOIN last l ON l.entity_id = x.id::text
)
SELECT c.checked, c.mismatched, b.*
  FROM (SELECT count(*) AS checked, count(*) FILTER (WHERE mismatch) AS mismatched FROM judged) c
  LEFT JOIN LATERAL (SELECT * FROM judged WHERE mismatch ORDER BY updated_at DESC, id LIMIT $1) b ON true]]

for _, c in ipairs(M.STATE_CHECKS) do
  c.sql = STATES_SQL:format(c.actions, c.entity_type, c.entity_type, c.shown, c.column, c.column,
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
-- {{kind, id, request_id, node_key, state, audited, event_id, outbox_id},
-- ...}}: every node and request whose
-- current state is not the one its latest audited state change names
-- (audited nil: none names one), counted all, listed up to `limit` per
-- kind (default 20), the most recently updated first.  event_id is the
-- audit_events row, or nil while the row is still in audit_outbox
-- (outbox_id).
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
          audited = value(r.audited), event_id = value(r.event_id), outbox_id = value(r.outbox_id) }
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
