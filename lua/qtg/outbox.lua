-- qtg.outbox: the two outboxes every state change writes in its own
-- transaction: the request's callback (movement_callback_outbox, delivered by
-- the callback_dispatcher) and the audit record (audit_outbox, promoted into
-- audit_events by the audit_outbox_promoter).
--
-- One write path.  write(s, change, args, t) runs a writer's change (one
-- data-modifying statement RETURNING the changed row) and the outbox rows
-- that go with it in ONE statement: the change is the CTE `w`, and the
-- fragments below read the changed row from `w`, their parameters numbered
-- after the change's own.  enqueue_callback and audit are write() with a
-- change of their own (the callback_sequence bump) or none.
--
-- Callbacks: a request without a callback_url gets no callback rows (there
-- is nowhere to deliver them; its history is in the audit trail).  Each row's
-- payload is the exact JSON body that will be POSTed and signed:
--   {"event_type", "request_id", "request_state", "current_frontier",
--    "occurred_at", "sequence", "data"}
-- request_state and current_frontier are read from the row as the change
-- left it; sequence is the request's callback_sequence, bumped by the change
-- (BUMP) under the request's row lock, so a request's callbacks are
-- numbered 1, 2, 3 in the order their transactions committed.
local canon = require "qtg.canon_json"

local M = {}

-- Event types, for documentation and for checks in callers.
M.EVENTS = {
  request_created = true, request_approved = true, request_rejected = true,
  request_cancelled = true, request_expired = true, request_executing = true,
  frontier_advanced = true, request_attention = true, request_completed = true,
  request_failed = true, request_resumed = true, node_retried = true,
  manual_step_completed = true,
}

-- The SET clause a change of movement_requests carries when a callback is
-- written with it.
M.BUMP = "callback_sequence = callback_sequence + (callback_url IS NOT NULL)::int"

-- The callback row of the changed request row `w`; parameters: event type,
-- data (jsonb), max_attempts.
local CALLBACK_SQL = [[
INSERT INTO movement_callback_outbox (request_id, event_type, payload, callback_url, max_attempts)
SELECT w.id, $%d::text,
       jsonb_build_object(
         'event_type', $%d::text,
         'request_id', w.id,
         'request_state', w.request_state,
         'current_frontier', w.current_frontier,
         'occurred_at', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
         'sequence', w.callback_sequence,
         'data', $%d::jsonb)::text,
       w.callback_url, $%d::int
  FROM w WHERE w.callback_url IS NOT NULL]]

-- The audit row: six column expressions, and the row source (`w`) when they
-- read the changed row.
local AUDIT_SQL = "INSERT INTO audit_outbox (actor, action, entity_type, entity_id, request_id, detail) "
  .. "SELECT %s, %s, %s, %s, %s, %s"

-- The columns of a node change's audit row, read from the changed row
-- `src`: the action is node.<new state>, the detail {node_key, from_state,
-- attempt_no[, error_code]} of the row as written.  actor and from_state are
-- SQL expressions.
local function node_audit_cols(src, actor, from_state)
  return { actor, "'node.' || lower(" .. src .. ".node_state)", "'movement_request_node'",
           src .. ".id::text", src .. ".request_id",
           "jsonb_strip_nulls(jsonb_build_object('node_key', " .. src .. ".node_key, 'from_state', "
             .. from_state .. ", 'attempt_no', " .. src .. ".attempt_no, 'error_code', "
             .. src .. ".error_code))" }
end

-- node_audit_sql(src, actor, from_state) -> the INSERT of one node-change
-- audit row per row of `src` (a CTE of changed node rows), as write() makes
-- it for t.audit.of = "node"; for a statement that changes nodes in a CTE of
-- its own (qtg.nodes.advance_after_completion).
function M.node_audit_sql(src, actor, from_state)
  return AUDIT_SQL:format(unpack(node_audit_cols(src, actor, from_state))) .. " FROM " .. src
end

-- The three shapes of an audit row, by t.audit.of: each gives the column
-- expressions (parameters from n + 1 on), the parameter values and their
-- count (a value may be nil: SQL NULL).
local AUDIT_OF = {
  -- given in full: {actor, action, entity_type, entity_id, request_id, detail}
  [false] = function(a, n)
    return { "$" .. (n + 1), "$" .. (n + 2), "$" .. (n + 3), "$" .. (n + 4), "$" .. (n + 5) .. "::uuid",
             "$" .. (n + 6) .. "::jsonb" },
      { a.actor, a.action, a.entity_type, tostring(a.entity_id), a.request_id, canon.encode(a.detail or {}) }, 6
  end,
  -- the changed request: {actor, action, detail}
  request = function(a, n)
    return { "$" .. (n + 1), "$" .. (n + 2), "'movement_request'", "w.id::text", "w.id", "$" .. (n + 3) .. "::jsonb" },
      { a.actor, a.action, canon.encode(a.detail or {}) }, 3
  end,
  -- the changed node: {actor, from_state}; the action is node.<new state>,
  -- the detail {node_key, from_state, attempt_no[, error_code]} of the row
  -- as written
  node = function(a, n)
    return node_audit_cols("w", "$" .. (n + 1), "$" .. (n + 2) .. "::text"), { a.actor, a.from_state }, 2
  end,
}

function M.max_attempts()
  local ok, qtg = pcall(require, "qtg")
  local n = ok and qtg.settings and qtg.settings.callback_max_attempts
  return tonumber(n) or 5
end

-- check_event(event_type[, level]): raise unless event_type is one of
-- M.EVENTS.  level as for error(), from the caller.
function M.check_event(event_type, level)
  if not M.EVENTS[event_type] then
    error("outbox.enqueue_callback: unknown event type " .. tostring(event_type), (level or 1) + 1)
  end
end

local ACTOR_PATTERN = "^[a-z]+:[%w%._%-@]+$"

-- check_actor(actor[, level]): raise unless actor is "system:<worker>",
-- "console:<uid>" or "api:<client>".
function M.check_actor(actor, level)
  if type(actor) ~= "string" or not actor:match(ACTOR_PATTERN) then
    error("outbox.audit: actor must look like system:<worker> or console:<uid>, got "
      .. tostring(actor), (level or 1) + 1)
  end
end

-- write(s, change, args, t[, level]) -> the change's first returned row (nil
-- when it changed none; without a change, nil).
--   change  one data-modifying statement ending in RETURNING *, its
--           parameters $1..$#args = args; nil for an audit row alone
--   t.callback = {event =, data =}: the request's callback; the change
--           returns the movement_requests row, with BUMP in its SET
--   t.audit = {of = nil | "request" | "node", actor =, ...}: see AUDIT_OF
--   t.also = {{sql =, values =[, returns =][, last =]}, ...}: more CTEs of
--           the same statement ("name AS (...), ..."), each numbering its
--           parameters $1.. in its own values; their rows are written in the
--           order given, before the callback and audit rows (`last`: after
--           them).  `returns` names a CTE of the piece whose one row comes
--           back as row[returns] (a "*name" column: qtg.db), NULL columns
--           if it changed none.
--   t.commit = "<what>" ("node <key> <id>"): the statement ends its
--           pipeline transaction: it is sent with the commit in one round
--           trip (s:commit_batch), and it refuses by itself to change no
--           row (the change, and the piece that `returns`): a guard calls
--           qtg_changed_row (sql/0130) with their count, which raises "the
--           change of <what> changed no row", so nothing commits that the
--           caller's check of the returned row would have rolled back.
-- The callback row and an audit of the changed row are written for each row
-- the change returns (none when it returns none); an audit row given in
-- full is written once.
--
-- The order of the rows: the CTEs the final SELECT does not read run to
-- completion at the end of the statement, the last in the WITH list first
-- (PostgreSQL's ExecPostprocessPlan), so the pieces are listed in reverse,
-- after the callback and audit parts (before them when `last`).  Audit ids
-- then follow the order of the changes (engine_pipeline_spec.lua, "node
-- changes in the request's statement", fails if PostgreSQL changes this).
local function shift(sql, by)
  if by == 0 then return sql end
  return (sql:gsub("%$(%d+)", function(d) return "$" .. (tonumber(d) + by) end))
end

function M.write(s, change, args, t, level)
  level = (level or 1) + 1
  local all, n = {}, args and #args or 0
  for i = 1, n do all[i] = args[i] end
  local parts = {}
  local cb, au, also = t and t.callback, t and t.audit, t and t.also
  local pieces, lasts, returns = {}, {}, nil
  if also and #also > 0 then
    if not change then error("outbox.write: more CTEs need a change", level) end
    for _, piece in ipairs(also) do
      local into = piece.last and lasts or pieces
      into[#into + 1] = shift(piece.sql, n)
      for i = 1, #piece.values do all[n + i] = piece.values[i] end
      n = n + #piece.values
      if piece.returns then
        if returns then error("outbox.write: only one piece returns a row", level) end
        returns = piece.returns
      end
    end
  end
  if cb then
    M.check_event(cb.event, level)
    if not change then error("outbox.write: a callback needs the change of its request", level) end
    all[n + 1], all[n + 2], all[n + 3] = cb.event, canon.encode(cb.data or {}), M.max_attempts()
    parts[#parts + 1] = CALLBACK_SQL:format(n + 1, n + 1, n + 2, n + 3)
    n = n + 3
  end
  if au then
    M.check_actor(au.actor, level)
    local shape = AUDIT_OF[au.of or false]
    if not shape then error("outbox.write: unknown audit shape " .. tostring(au.of), level) end
    if au.of and not change then error("outbox.write: an audit of the changed row needs the change", level) end
    local cols, values, count = shape(au, n)
    for i = 1, count do all[n + i] = values[i] end
    parts[#parts + 1] = AUDIT_SQL:format(unpack(cols)) .. (au.of and " FROM w" or "")
    n = n + count
  end
  local commit = t and t.commit
  local sql
  if not change then
    if not au then error("outbox.write: nothing to write", level) end
    if commit then error("outbox.write: a commit needs a change", level) end
    sql = parts[1]
  elseif #parts == 0 and #pieces == 0 and #lasts == 0 and not commit then
    sql = change
  else
    local ctes = { "WITH w AS (" .. change .. ")" }
    for i = #lasts, 1, -1 do ctes[#ctes + 1] = lasts[i] end
    for i, p in ipairs(parts) do ctes[#ctes + 1] = ("o%d AS (%s)"):format(i, p) end
    for i = #pieces, 1, -1 do ctes[#ctes + 1] = pieces[i] end
    local rows = returns and ('w.*, NULL AS "*%s", %s.*'):format(returns, returns) or (commit and "w.*" or "*")
    local from = returns and ("(w LEFT JOIN %s ON true)"):format(returns) or "w"
    if commit then
      if type(commit) ~= "string" then error("outbox.write: t.commit must name the change", level) end
      all[n + 1] = commit
      n = n + 1
      -- the guard is the preserved side of the join: it runs even when
      -- the change returns no row, and raises then
      local count = returns and ("least((SELECT count(*) FROM w), (SELECT count(*) FROM %s))"):format(returns)
        or "(SELECT count(*) FROM w)"
      from = ("(SELECT qtg_changed_row(%s, $%d)) AS guard(ok) LEFT JOIN %s ON guard.ok"):format(count, n, from)
    end
    sql = table.concat(ctes, ",\n") .. "\nSELECT " .. rows .. " FROM " .. from
  end
  if commit then return s:commit_batch({ sql, unpack(all, 1, n) })[1] end
  return s:query(sql, unpack(all, 1, n))[1]
end

-- The change of enqueue_callback: the request's next callback number.
local BUMP_SQL = [[
UPDATE movement_requests SET callback_sequence = callback_sequence + 1
 WHERE id = $1::uuid AND callback_url IS NOT NULL
RETURNING *]]

-- enqueue_callback(s, request_row, event_type, data[, audit]) -> the request
-- row as bumped, or nil (the request has no callback_url).  Call it inside
-- the transaction that made the change, after the change.  audit: an audit
-- row given in full, written in the same statement (also without a
-- callback_url).
function M.enqueue_callback(s, request_row, event_type, data, audit)
  M.check_event(event_type, 2)
  return M.write(s, BUMP_SQL, { request_row.id },
    { callback = { event = event_type, data = data }, audit = audit }, 2)
end

-- audit(s, actor, action, entity_type, entity_id, request_id, detail)
-- actor: "system:<worker>", "console:<uid>" or "api:<client>".
function M.audit(s, actor, action, entity_type, entity_id, request_id, detail)
  M.write(s, nil, nil, { audit = { actor = actor, action = action, entity_type = entity_type,
    entity_id = entity_id, request_id = request_id, detail = detail } }, 2)
end

return M
