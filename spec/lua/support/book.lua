-- spec/lua/support/book.lua -- address book entries for specs, made the way
-- an operator makes them: a proposal by one admin approved by as many other
-- admins as the approval policy's address_book quorum asks (qtg.address_book),
-- never by writing the table.  The shipped templates' risk_controls need
-- them: cex_withdrawal_to_wallet (destination_allowlist_required) and
-- otc_settlement_manual (counterparty_allowlist_required: the entry's label
-- is the counterparty).  docs/approvals.md, "risk_controls".
--   ensure(s, {asset=, chain=, address=, label=}) -> the entry is in the book
--     with that label (added when missing; an entry with another label is
--     an error: the spec would test something else than it says); without a
--     label any entry will do (a new one is labelled "spec wallet")
--   remove(s, {asset=, chain=, address=}) -> the entry is no longer in the book
--   ensure_all(entries) / with its own session
--   for_intent(intent) -> the entry an intent of a shipped template needs
local qtg = require "qtg"
local book = require "qtg.address_book"

local M = {}

-- In-process actor strings act with every role (docs/approvals.md,
-- "Principals"); each vote is by a distinct admin other than the proposer.
M.PROPOSER = "system:spec-book-proposer"
local VOTERS = { "system:spec-book-admin-1", "system:spec-book-admin-2", "system:spec-book-admin-3",
                 "system:spec-book-admin-4", "system:spec-book-admin-5" }

local function decide(s, change)
  for _, v in ipairs(VOTERS) do
    if change.state ~= "PENDING" then break end
    change = book.vote(s, change.id, v, "approve", "spec set-up")
  end
  assert(change.state == "APPLIED", "address book change " .. tostring(change.id) .. " is " .. tostring(change.state))
  return change
end

function M.ensure(s, e)
  local have = book.entry(s, e)
  if have then
    assert(e.label == nil or have.label == e.label, string.format("%s on %s for %s is in the book as %s, not %s",
      e.address, e.chain, e.asset, tostring(have.label), tostring(e.label)))
    return
  end
  decide(s, book.propose(s, { action = "add", asset = e.asset, chain = e.chain, address = e.address,
                              label = e.label or "spec wallet" }, M.PROPOSER))
end

function M.remove(s, e)
  if not book.entry(s, e) then return end
  decide(s, book.propose(s, { action = "remove", asset = e.asset, chain = e.chain, address = e.address },
                         M.PROPOSER))
end

function M.ensure_all(entries)
  local s = qtg.db.acquire()
  local ok, err = pcall(function() for _, e in ipairs(entries) do M.ensure(s, e) end end)
  s:release()
  if not ok then error(err, 0) end
end

-- for_intent(intent) -> {asset=, chain=, address=, label=}: the intent's
-- destination on its destination_chain, labelled with its counterparty
-- when it names one.
function M.for_intent(intent)
  return { asset = intent.asset, chain = intent.destination_chain, address = intent.destination,
           label = intent.counterparty }
end

return M
