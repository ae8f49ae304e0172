-- qtg.proposals: proposed template changes awaiting review (template_proposals,
-- sql/0011), for the console.  Spec section 8; docs/callbacks.md.
--
--   propose(s, definition, actor, reason)  -> proposal row (PENDING)
--   approve(s, id, actor, note)            -> proposal row (APPROVED), with the
--                                             definition loaded as a new plan version
--   reject(s, id, actor, note)             -> proposal row (REJECTED)
--   list(s, state?)                        -> rows, newest first
--   expire_due(s, limit)                   -> rows moved to EXPIRED (the worker's pass)
--
-- definition: a template document (a table, or its JSON text), in the format
-- of templates/*.json (docs/templates.md).
-- Rules: the definition is validated (compiled without writing) when it is
-- proposed, so a broken template never waits for review, and a definition
-- identical to the template's latest plan version is refused; the review window
-- is MG_TEMPLATE_PROPOSAL_TTL_SECONDS; the reviewer must not be the
-- proposer (four eyes); a proposal is approved only while its window is open
-- and only if the template's latest plan version is still the one it was
-- proposed against (otherwise it would silently undo a newer version: propose
-- again); every decision is final and audited in its own transaction.
local qtg = require("qtg")
local canon = require("qtg.canon_json")
local outbox = require("qtg.outbox")

local M = {}

M.STATES = { "PENDING", "APPROVED", "REJECTED", "EXPIRED" }
M.EXPIRER = "system:template_proposal_expiration"
local templates = require("qtg.templates")

-- compiled template, or raises with every validation error.
local function compile(definition, source, fname)
  local c, errs
  if type(definition) == "string" then
    c, errs = templates.decode_and_compile(definition, source)
  elseif type(definition) == "table" then
    c, errs = templates.validate_and_compile(definition, source)
  else
    error(string.format("proposals.%s: definition must be a template (a table or JSON text), got %s",
      fname, type(definition)), 3)
  end
  if not c then
    error(string.format("proposals.%s: invalid template: %s", fname,
      table.concat(errs or { "unknown error" }, "; ")), 3)
  end
  return c
end

local function check_actor(actor, fname)
  if type(actor) ~= "string" or not actor:match("^[a-z]+:[%w%._%-@]+$") then
    error(string.format("proposals.%s: actor must look like console:<uid>, got %s", fname,
      tostring(actor)), 3)
  end
end

local function check_id(id, fname)
  if type(id) ~= "number" or id < 1 or id % 1 ~= 0 then
    error(string.format("proposals.%s: proposal id must be a positive integer, got %s", fname,
      tostring(id)), 3)
  end
end


local LATEST_VERSION_SQL = [[
SELECT pv.id, pv.version, pv.content_hash
  FROM plan_versions pv JOIN movement_templates t ON t.id = pv.template_id
 WHERE t.template_key = $1
 ORDER BY pv.version DESC
 LIMIT 1]]

function M.propose(s, definition, actor, reason)
  check_actor(actor, "propose")
  local c = compile(definition, "template_proposal", "propose")
  local text = type(definition) == "string" and definition or canon.encode(definition)
  return s:transaction(function()
    local base = s:query(LATEST_VERSION_SQL, c.template_key)[1]
    if base and base.content_hash == c.content_hash then
      error(string.format("proposals.propose: %s version %d already has this content",
        c.template_key, base.version), 0)
    end
    local ok, row = pcall(function()
      return s:query([[
        INSERT INTO template_proposals (template_key, definition, content_hash,
                                        base_plan_version_id, proposed_by, reason, expires_at)
        VALUES ($1, $2::jsonb, $3, $4, $5, $6, now() + make_interval(secs => $7))
        RETURNING *]], c.template_key, text, c.content_hash, base and base.id or nil, actor,
        reason or "", qtg.settings.template_proposal_ttl_seconds)[1]
    end)
    if not ok then
      if type(row) == "table" and row.sqlstate == "23505" then
        error("proposals.propose: the same definition of " .. c.template_key .. " is already pending", 0)
      end
      error(row, 0)
    end
    outbox.audit(s, actor, "template_proposal.proposed", "template_proposal", row.id, nil, {
      template_key = c.template_key, content_hash = c.content_hash,
      base_plan_version_id = row.base_plan_version_id, expires_at = row.expires_at,
      reason = reason or "",
    })
    return row
  end)
end

-- The pending proposal `id`, locked, still inside its window; raises otherwise.
local function lock_pending(s, id, fname)
  local row = s:query([[SELECT *, expires_at <= now() AS window_closed
                          FROM template_proposals WHERE id = $1 FOR UPDATE]], id)[1]
  if not row then error(string.format("proposals.%s: no proposal %d", fname, id), 0) end
  if row.proposal_state ~= "PENDING" then
    error(string.format("proposals.%s: proposal %d is %s", fname, id, row.proposal_state), 0)
  end
  if row.window_closed then
    error(string.format("proposals.%s: proposal %d's review window closed at %s", fname, id,
      row.expires_at), 0)
  end
  return row
end

local function check_reviewer(row, actor, fname)
  if row.proposed_by == actor then
    error(string.format("proposals.%s: %s proposed %d and cannot review it", fname, actor, row.id), 0)
  end
end

function M.approve(s, id, actor, note)
  check_actor(actor, "approve")
  check_id(id, "approve")
  return s:transaction(function()
    local row = lock_pending(s, id, "approve")
    check_reviewer(row, actor, "approve")
    local latest = s:query(LATEST_VERSION_SQL, row.template_key)[1]
    local base = row.base_plan_version_id
    if base == qtg.db.NULL then base = nil end
    if (latest and latest.id) ~= base then
      error(string.format("proposals.approve: %s changed since proposal %d (latest plan version %s,"
        .. " proposed against %s): propose again", row.template_key, id,
        latest and latest.id or "none", tostring(base or "none")), 0)
    end
    local text = s:query("SELECT definition::text AS t FROM template_proposals WHERE id = $1", id)[1].t
    local c = compile(text, "template_proposal:" .. id, "approve")
    local stored = templates.store(s, c)
    if not stored.created then
      error(string.format("proposals.approve: %s version %d already has this content",
        row.template_key, stored.version), 0)
    end
    local version = { id = stored.plan_version_id, version = stored.version }
    local done = s:query([[
      UPDATE template_proposals
         SET proposal_state = 'APPROVED', decided_at = clock_timestamp(), decided_by = $2,
             decision_note = $3, plan_version_id = $4
       WHERE id = $1 RETURNING *]], id, actor, note or "", version.id)[1]
    outbox.audit(s, actor, "template_proposal.approved", "template_proposal", id, nil, {
      template_key = row.template_key, plan_version_id = version.id, version = version.version,
      content_hash = row.content_hash, note = note or "",
    })
    return done
  end)
end

function M.reject(s, id, actor, note)
  check_actor(actor, "reject")
  check_id(id, "reject")
  return s:transaction(function()
    local row = lock_pending(s, id, "reject")
    check_reviewer(row, actor, "reject")
    local done = s:query([[
      UPDATE template_proposals
         SET proposal_state = 'REJECTED', decided_at = clock_timestamp(), decided_by = $2,
             decision_note = $3
       WHERE id = $1 RETURNING *]], id, actor, note or "")[1]
    outbox.audit(s, actor, "template_proposal.rejected", "template_proposal", id, nil, {
      template_key = row.template_key, note = note or "",
    })
    return done
  end)
end

function M.list(s, state)
  if state ~= nil then
    local known = false
    for _, st in ipairs(M.STATES) do known = known or st == state end
    if not known then error("proposals.list: unknown state " .. tostring(state), 2) end
  end
  return s:query([[SELECT id, template_key, proposal_state, proposed_by, reason, expires_at,
                          decided_at, decided_by, plan_version_id, content_hash, created_at
                     FROM template_proposals
                    WHERE $1::text IS NULL OR proposal_state = $1
                    ORDER BY id DESC LIMIT 200]], state)
end

-- The batch is picked in a MATERIALIZED CTE (computed once): an
-- `id IN (SELECT ... LIMIT $1 FOR UPDATE SKIP LOCKED)` may be rescanned per
-- row, each rescan skipping the rows already updated and taking more.
M.EXPIRE_SQL = [[
WITH picked AS MATERIALIZED (
  SELECT id FROM template_proposals
   WHERE proposal_state = 'PENDING' AND expires_at < now()
   ORDER BY expires_at, id
   LIMIT $1
   FOR UPDATE SKIP LOCKED
)
UPDATE template_proposals t
   SET proposal_state = 'EXPIRED', decided_at = clock_timestamp()
  FROM picked p
 WHERE t.id = p.id
RETURNING t.id, t.template_key, t.proposed_by, t.expires_at]]

-- One pass of the expiration worker, inside the caller's transaction: the
-- expired proposals, each audited.
function M.expire_due(s, limit)
  local rows = s:query(M.EXPIRE_SQL, limit)
  for _, row in ipairs(rows) do
    outbox.audit(s, M.EXPIRER, "template_proposal.expired", "template_proposal", row.id, nil, {
      template_key = row.template_key, proposed_by = row.proposed_by, expires_at = row.expires_at,
    })
  end
  return rows
end

return M
