-- qtg.audit: checking and copying the hash-chained audit trail
-- (sql/0100_audit_chain.sql; docs/security.md, "Tamper evidence").
--   verify(s, since_id) -> report      walk every chain, find the first broken link
--   export(s, since_id, write)         every row as one JSON line, in id order
-- and, each in a module of its own, what `qtgd audit verify` checks too:
--   qtg.audit_against.compare          every row of an earlier export still in
--                                      the database as exported
--   qtg.audit_states.check_states      every node and request in the state its
--                                      audited changes lead to
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
local NULL = require("cjson").null

local M = {}

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
