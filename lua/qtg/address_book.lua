-- qtg.address_book: destinations per asset and chain, with a label, that
-- approval rules can require (match.destination_in = "address_book").  A
-- change (add or remove) takes effect only once a quorum of admins other
-- than its proposer approved it, each counted as it is when the quorum is
-- counted (a removed or demoted admin's vote no longer counts); any
-- rejection ends it.  Every step is
-- audited (entity address_book_change).  The quorum is the approval
-- policy's `address_book = { approvals = N }` (default 2).
-- An entry is keyed as requests are matched against it (qtg.approvals
-- book_entries): the asset and the chain canonical, as a change stores
-- them, and the address case-insensitively, as proposed; one address has
-- one entry and at most one pending change (sql/0197).
--   propose(s, {action=, asset=, chain=, address=, label=}, who) -> change
--   vote(s, change_id, who, "approve" | "reject"[, comment]) -> change
--   list(s) -> entries;  changes(s, {pending = true}) -> changes
--   entry(s, {asset=, chain=, address=}) -> the entry under that key, or nil
--   pending(s, {asset=, chain=, address=}) -> its pending change, or nil
local principals = require "qtg.principals"
local outbox = require "qtg.outbox"

local M = {}

M.DEFAULT_APPROVALS = 2

local refuse = require("qtg.errors").raise

-- The book's key in SQL, canonical on both sides ($1 asset, $2 chain, $3
-- address: a change written before sql/0197 may hold another spelling);
-- the functions are sql/0197's, which key the unique indexes.
local SAME_ENTRY = [[qtg_book_asset(asset) = qtg_book_asset($1::text) AND qtg_book_chain(chain) = qtg_book_chain($2::text)
  AND lower(address) = lower($3::text)]]

local function in_tx(s, fn)
  if s:in_transaction() then return fn() end
  return s:transaction(fn)
end

local function quorum()
  local ok, policy = pcall(function() return require("qtg.approvals").policy() end)
  local n = ok and type(policy.address_book) == "table" and policy.address_book.approvals
  if type(n) == "number" and n >= 1 and n == math.floor(n) then return n end
  return M.DEFAULT_APPROVALS
end

local function text(v, what, max)
  if type(v) ~= "string" or v == "" or #v > (max or 200) or not require("qtg.canon_json").text_ok(v) then
    refuse("invalid_input", "%s must be a non-empty string (at most %d characters, UTF-8)", what, max or 200)
  end
  return v
end

function M.propose(s, change, who)
  local p = principals.of(who)
  principals.require_role(p, "admin", "change the address book")
  if type(change) ~= "table" then refuse("invalid_input", "propose needs {action=, asset=, chain=, address=, label=}") end
  if change.action ~= "add" and change.action ~= "remove" then
    refuse("invalid_input", "action must be \"add\" or \"remove\"")
  end
  local asset = require("qtg.risk_controls").asset(text(change.asset, "asset", 32))
  local chain = require("qtg.approvals").chain(type(change.chain) == "string" and text(change.chain, "chain", 64) or change.chain)
  if type(chain) ~= "string" then
    refuse("invalid_input", "chain must be a chain id (an integer >= 0) or a name, got %s", tostring(change.chain))
  end
  local address = text(change.address, "address", 128)
  local label = change.action == "add" and text(change.label, "label") or nil
  return in_tx(s, function()
    local present = s:query("SELECT 1 FROM address_book WHERE " .. SAME_ENTRY, asset, chain, address)[1] ~= nil
    if change.action == "add" and present then refuse("illegal_transition", "%s on %s is already in the address book for %s", address, chain, asset) end
    if change.action == "remove" and not present then refuse("not_found", "%s on %s is not in the address book for %s", address, chain, asset) end
    local row = s:query([[
      INSERT INTO address_book_changes (action, asset, chain, address, label, approvals_required, proposed_by)
      VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING RETURNING *]],
      change.action, asset, chain, address, label, quorum(), p.actor)[1]
    if not row then refuse("illegal_transition", "a change of %s on %s for %s is already pending", address, chain, asset) end
    outbox.audit(s, p.actor, "address_book.propose", "address_book_change", row.id, nil,
      { action = row.action, asset = asset, chain = chain, address = address, label = label,
        approvals_required = row.approvals_required })
    return row
  end)
end

local function apply(s, c, actor)
  if c.action == "add" then
    s:query([[INSERT INTO address_book (asset, chain, address, label, change_id) VALUES ($1, $2, $3, $4, $5)]],
      c.asset, c.chain, c.address, c.label, c.id)
  else
    s:query("DELETE FROM address_book WHERE " .. SAME_ENTRY, c.asset, c.chain, c.address)
  end
  outbox.audit(s, actor, "address_book." .. c.action, "address_book_change", c.id, nil,
    { asset = c.asset, chain = c.chain, address = c.address, label = c.label })
end

-- approvals_now(s, c) -> the number of approvals of change c that count,
-- as a request's are (principals.current_votes): each by a principal that
-- still exists and holds admin now, one per principal, never the
-- proposer's.
local function is_admin(p) return principals.has_role(p, "admin") end

local function approvals_now(s, c)
  local votes = s:query([[SELECT principal, created_at FROM address_book_votes
                           WHERE change_id = $1 AND decision = 'approve' ORDER BY created_at, principal]], c.id)
  return #principals.current_votes(s, c.proposed_by, votes, is_admin, true)
end

function M.vote(s, id, who, decision, comment)
  local p = principals.of(who)
  principals.require_role(p, "admin", "approve address book changes")
  if decision ~= "approve" and decision ~= "reject" then refuse("invalid_input", "decision must be approve or reject") end
  if type(id) ~= "number" or id ~= math.floor(id) then refuse("not_found", "no address book change %s", tostring(id)) end
  return in_tx(s, function()
    local c = s:query("SELECT * FROM address_book_changes WHERE id = $1 FOR UPDATE", id)[1]
    if not c then refuse("not_found", "no address book change %s", tostring(id)) end
    if c.state ~= "PENDING" then refuse("illegal_transition", "address book change %d is %s", id, c.state) end
    if c.proposed_by == p.actor then
      refuse("forbidden", "%s proposed address book change %d and cannot approve it", p.actor, id)
    end
    local row = s:query([[INSERT INTO address_book_votes (change_id, principal, decision, comment)
                          VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING 1 AS x]],
      id, p.actor, decision, type(comment) == "string" and comment or nil)[1]
    if not row then refuse("illegal_transition", "%s already voted on address book change %d", p.actor, id) end
    outbox.audit(s, p.actor, "address_book.vote", "address_book_change", id, nil,
      { decision = decision, comment = comment })
    local n = approvals_now(s, c)
    local to
    if decision == "reject" then to = "REJECTED" elseif n >= c.approvals_required then to = "APPLIED" end
    if to then
      c = s:query("UPDATE address_book_changes SET state = $2, decided_at = now() WHERE id = $1 RETURNING *", id, to)[1]
      if to == "APPLIED" then apply(s, c, p.actor) end
    end
    c.approvals = n
    return c
  end)
end

function M.entry(s, e)
  return s:query("SELECT * FROM address_book WHERE " .. SAME_ENTRY, e.asset, tostring(e.chain), e.address)[1]
end

function M.pending(s, e)
  return s:query("SELECT * FROM address_book_changes WHERE state = 'PENDING' AND " .. SAME_ENTRY,
    e.asset, tostring(e.chain), e.address)[1]
end

function M.list(s)
  return s:query("SELECT asset, chain, address, label, change_id, added_at FROM address_book ORDER BY asset, chain, label")
end

function M.changes(s, opts)
  local pending = type(opts) == "table" and opts.pending
  return s:query([[SELECT c.*, (SELECT count(*)::int FROM address_book_votes v
                                 WHERE v.change_id = c.id AND v.decision = 'approve') AS approvals
                     FROM address_book_changes c WHERE NOT $1 OR c.state = 'PENDING' ORDER BY c.id]],
    pending and true or false)
end

return M
