-- risk_controls that say where money may go, enforced on every destination
-- a plan pays (docs/approvals.md, "risk_controls" and "The address book"):
--   * destination_allowlist_required: refused at create when a destination
--     is not in the address book, and at approval when its entry was
--     removed since (the shipped cex_withdrawal_to_wallet included);
--   * counterparty_allowlist_required: the book is the counterparty
--     register (the entry's label is the counterparty);
--   * max_fee_usd: refused when a template loads (nothing can enforce it);
--   * a plan paying two destinations (a_pay: the intent's, z_fee: a fixed
--     one) is in the book only when both are: destination_in, velocity
--     per_destination and allowed_destinations reason over both.
local qtg = require "qtg"
local cjson = require "cjson"
local requests = require "qtg.requests"
local approvals = require "qtg.approvals"
local risk = require "qtg.risk_controls"
local templates = require "qtg.templates"
local common = require "spec.lua.support.common"
local P = approvals

local sup, s, book

local DAL = "spec_rc_dest_allowlist"       -- sim withdrawal, destination_allowlist_required
local CPL = "spec_rc_counterparty"         -- sim withdrawal, counterparty_allowlist_required
local TWO = "spec_rc_two_nodes"            -- a_pay (the intent's destination), z_fee (FEE)
local TWO_DAL = "spec_rc_two_nodes_dal"    -- TWO with destination_allowlist_required
local TWO_LIST = "spec_rc_two_nodes_list"  -- TWO with allowed_destinations = { IN }
local ONE = "spec_rc_one"                  -- a sim withdrawal to the intent's destination

local function addr(tag) return "0x" .. string.rep(tag, 20) end
local IN, OUT, FEE = addr("a7"), addr("b8"), addr("c9")
local DEAD = "0x000000000000000000000000000000000000dEaD"

local function create(template, intent) return sup.create(s, template, { intent = intent }) end

local function shipped(key)
  local text = assert(common.read(common.root() .. "/templates/" .. key .. ".json"))
  return sup.load_doc(s, cjson.decode(text))
end

local BOOK_RULES = { rules = {
  { name = "known", match = { destination_in = "address_book" }, action = P.require{ approvals = 1, roles = { "approve" } } },
  { name = "unknown", match = { destination_not_in = "address_book" }, action = P.require{ approvals = 3, roles = { "approve" } } } } }

local function evm_nodes()
  return { { "a_pay", "action", "evm_transfer", { signer_key = "evm_hot", chain_id = 1 }, executor = "evm_transfer" },
           { "z_fee", "action", "evm_transfer", { signer_key = "evm_hot", chain_id = 1, destination = FEE },
             executor = "evm_transfer" } }
end

describe("risk_controls enforced on every paid destination", function()
  setup(function()
    sup = require("spec.lua.support.engine")
    book = require("spec.lua.support.book")
    s = qtg.db.acquire()
    local withdrawal = { { "a", "action", "withdrawal", { sim = { observes = 0 } } } }
    sup.load_doc(s, sup.doc(DAL, withdrawal, nil, { risk_controls = { destination_allowlist_required = true } }))
    sup.load_doc(s, sup.doc(CPL, withdrawal, nil, { risk_controls = { counterparty_allowlist_required = true } }))
    sup.load_doc(s, sup.doc(ONE, withdrawal))
    sup.load_doc(s, sup.doc(TWO, evm_nodes(), { { "a_pay", "z_fee" } }))
    sup.load_doc(s, sup.doc(TWO_DAL, evm_nodes(), { { "a_pay", "z_fee" } },
      { risk_controls = { destination_allowlist_required = true } }))
    sup.load_doc(s, sup.doc(TWO_LIST, evm_nodes(), { { "a_pay", "z_fee" } },
      { risk_controls = { allowed_destinations = { IN } } }))
    for _, asset in ipairs({ "USDC", "USDT", "ETH" }) do
      for _, chain in ipairs({ "ethereum", "1" }) do
        book.ensure(s, { asset = asset, chain = chain, address = IN, label = "desk-in" })
        book.ensure(s, { asset = asset, chain = chain, address = FEE, label = "fee wallet" })
      end
    end
  end)
  teardown(function() s:release() end)
  before_each(function() sup.park_others(s) end)

  describe("destination_allowlist_required", function()
    it("refuses at create a destination not in the book, naming the key and the address", function()
      local e = sup.refused("invalid_intent", create, DAL,
        { asset = "USDC", amount = "5", destination = OUT, destination_chain = "ethereum" })
      assert.matches("risk_controls.destination_allowlist_required refuses", e.message, 1, true)
      assert.matches(OUT, e.message, 1, true)
      -- in the book on another chain only: not in the book
      sup.refused("invalid_intent", create, DAL, { asset = "USDC", amount = "5", destination = IN, destination_chain = "base" })
      -- no chain named: in no book
      e = sup.refused("invalid_intent", create, DAL, { asset = "USDC", amount = "5", destination = IN })
      assert.matches("names no chain", e.message, 1, true)
      -- no destination at all
      e = sup.refused("invalid_intent", create, DAL, { asset = "USDC", amount = "5", destination_chain = "ethereum" })
      assert.matches("names no destination", e.message, 1, true)
      -- in the book (any spelling of the address and the asset)
      local r = create(DAL, { asset = "usdc", amount = "5", destination = IN:upper():gsub("^0X", "0x"),
                              destination_chain = "ethereum" })
      assert.equal("PENDING_APPROVAL", r.request_state)
    end)

    it("refuses at approval once the entry was removed since create; approves once it is back", function()
      local entry = { asset = "USDT", chain = "ethereum", address = addr("d1"), label = "short-lived" }
      book.ensure(s, entry)
      local r = create(DAL, { asset = "USDT", amount = "5", destination = entry.address, destination_chain = "ethereum" })
      book.remove(s, entry)
      local e = sup.refused("invalid_intent", requests.approve, s, r.id, sup.ACTOR)
      assert.matches("risk_controls.destination_allowlist_required refuses", e.message, 1, true)
      assert.matches(entry.address, e.message, 1, true)
      assert.equal("PENDING_APPROVAL", sup.request(s, r.id).request_state)
      assert.equal(0, #s:query("SELECT 1 FROM request_approvals WHERE request_id = $1::uuid", r.id))
      book.ensure(s, entry)
      assert.equal("APPROVED", sup.approve(s, r.id).request_state)
    end)

    it("the shipped cex_withdrawal_to_wallet refuses a destination outside the book (the reproduction)", function()
      shipped("cex_withdrawal_to_wallet")
      local e = sup.refused("invalid_intent", create, "cex_withdrawal_to_wallet",
        { asset = "USDC", amount = "100", venue = "binance", destination = DEAD, destination_chain = "ethereum" })
      assert.matches("risk_controls.destination_allowlist_required refuses: destination " .. DEAD, e.message, 1, true)
      local r = create("cex_withdrawal_to_wallet",
        { asset = "USDC", amount = "100", venue = "binance", destination = IN, destination_chain = "ethereum" })
      assert.equal("APPROVED", sup.approve(s, r.id).request_state)
    end)

    it("checks every destination the plan pays: a fixed fee destination outside the book is refused", function()
      local fee2 = addr("e2")
      local doc = sup.doc("spec_rc_two_nodes_dal2", {
        { "a_pay", "action", "evm_transfer", { signer_key = "evm_hot", chain_id = 1 }, executor = "evm_transfer" },
        { "z_fee", "action", "evm_transfer", { signer_key = "evm_hot", chain_id = 1, destination = fee2 }, executor = "evm_transfer" } },
        { { "a_pay", "z_fee" } }, { risk_controls = { destination_allowlist_required = true } })
      sup.load_doc(s, doc)
      local e = sup.refused("invalid_intent", create, "spec_rc_two_nodes_dal2", { asset = "ETH", amount = "1", destination = IN })
      assert.matches(fee2, e.message, 1, true)
      -- both in the book: created; the intent's destination outside it: refused
      assert.equal("PENDING_APPROVAL", create(TWO_DAL, { asset = "ETH", amount = "1", destination = IN }).request_state)
      e = sup.refused("invalid_intent", create, TWO_DAL, { asset = "ETH", amount = "1", destination = OUT })
      assert.matches(OUT, e.message, 1, true)
    end)
  end)

  describe("counterparty_allowlist_required", function()
    it("needs the destination in the book under the counterparty's name", function()
      local ok = { asset = "USDC", amount = "5", destination = IN, destination_chain = "ethereum", counterparty = "desk-in" }
      assert.equal("PENDING_APPROVAL", create(CPL, ok).request_state)
      local function refusal(over, text)
        local intent = {}
        for k, v in pairs(ok) do intent[k] = v end
        for k, v in pairs(over) do intent[k] = v end
        if over.counterparty == false then intent.counterparty = nil end
        local e = sup.refused("invalid_intent", create, CPL, intent)
        assert.matches("risk_controls.counterparty_allowlist_required refuses", e.message, 1, true)
        assert.matches(text, e.message, 1, true)
      end
      refusal({ counterparty = "desk-other" }, "not as counterparty desk-other")     -- another's wallet
      refusal({ destination = OUT }, OUT .. " is not in the address book")           -- nobody's
      refusal({ counterparty = false }, "names no counterparty")
      refusal({ destination_chain = "base" }, "is not in the address book")
    end)

    it("the shipped otc_settlement_manual names its chain and checks its counterparty", function()
      shipped("otc_settlement_manual")
      local intent = { asset = "USDT", amount = "10", venue = "kraken", destination = IN,
                       destination_chain = "ethereum", counterparty = "desk-in" }
      assert.equal("PENDING_APPROVAL", create("otc_settlement_manual", intent).request_state)
      intent.counterparty = "desk-17"
      sup.refused("invalid_intent", create, "otc_settlement_manual", intent)
      intent.counterparty, intent.destination_chain = "desk-in", nil
      sup.refused("invalid_intent", create, "otc_settlement_manual", intent)
    end)
  end)

  describe("max_fee_usd", function()
    it("refuses a template that sets it when it loads: qtg has no USD price source", function()
      local doc = sup.doc("spec_rc_fee_usd", { { "a", "action", "withdrawal", {} } }, nil,
        { risk_controls = { max_fee_usd = "25" } })
      local c, errs = templates.validate_and_compile(doc, "spec:fee_usd")
      assert.is_nil(c)
      assert.matches('"risk_controls.max_fee_usd" is not enforced', table.concat(errs, "\n"), 1, true)
      -- a plan version stored before this refusal refuses every request
      local ok, why = risk.check({ max_fee_usd = "25" }, { asset = "USDC", amount = "1" })
      assert.is_nil(ok)
      assert.matches("risk_controls.max_fee_usd refuses", why, 1, true)
      -- the shipped templates load (cctp_bridge no longer sets it)
      for _, key in ipairs({ "cctp_bridge", "cex_withdrawal_to_wallet", "otc_settlement_manual" }) do shipped(key) end
    end)
  end)

  describe("without the plan", function()
    it("fails closed: a destination key checked without a session refuses", function()
      local ok, why = risk.check({ allowed_destinations = { IN } }, { asset = "USDC", amount = "1", destination = IN })
      assert.is_nil(ok)
      assert.matches("no session", why, 1, true)
      ok = risk.check({ destination_allowlist_required = false, max_amount = "10" }, { asset = "USDC", amount = "1" })
      assert.is_true(ok)
    end)
  end)

  describe("a plan paying two destinations", function()
    it("destination_in holds only when every paid destination is in the book", function()
      sup.with_policy(BOOK_RULES, function()
        -- a_pay pays OUT (not in the book), z_fee pays FEE (in it): the weaker rule is not granted
        local r = create(TWO, { asset = "ETH", amount = "1", destination = OUT })
        assert.equal(3, r.approvals_required)
        assert.equal("unknown", r.approval_policy.rule)
        assert.same({ OUT, FEE }, r.approval_policy.inputs.destinations)
        -- both in it
        r = create(TWO, { asset = "ETH", amount = "1", destination = IN })
        assert.equal(1, r.approvals_required)
        assert.same({ "desk-in", "fee wallet" }, r.approval_policy.inputs.address_labels)
      end)
    end)

    it("allowed_destinations: a fixed second destination outside the list is refused", function()
      local e = sup.refused("invalid_intent", create, TWO_LIST, { asset = "ETH", amount = "1", destination = IN })
      assert.matches("risk_controls.allowed_destinations refuses: destination " .. FEE, e.message, 1, true)
    end)

    it("velocity per_destination sums what each paid destination received", function()
      local asset = "VD" .. sup.uid("a"):upper():gsub("[^%w]", "")
      sup.with_policy({ rules = {
        { name = "per_dest_cap", match = { velocity = { window_seconds = 86400, over = "1000", per_destination = true } },
          action = P.block{ reason = "over 1000 a day to one destination" } },
        { name = "rest", match = {}, action = P.require{ approvals = 1, roles = { "approve" } } } } }, function()
        -- r1 pays X and FEE 600 each
        local r1 = create(TWO, { asset = asset, amount = "600", destination = addr("11") })
        assert.equal("APPROVED", sup.approve(s, r1.id).request_state)
        -- another destination, but FEE again: FEE would receive 1200
        local e = sup.refused("invalid_intent", create, TWO, { asset = asset, amount = "600", destination = addr("22") })
        assert.matches("per_dest_cap", e.message, 1, true)
        -- a one-destination plan paying FEE: FEE received 600 through r1's fee node
        sup.refused("invalid_intent", create, ONE, { asset = asset, amount = "600", destination = FEE })
        -- ... and paying X: X received 600 as r1's intent destination
        sup.refused("invalid_intent", create, ONE, { asset = asset, amount = "600", destination = addr("11") })
        -- a destination nobody paid: allowed, and the inputs show the largest sum
        local r = create(ONE, { asset = asset, amount = "600", destination = addr("33") })
        assert.equal("rest", r.approval_policy.rule)
        assert.equal("0", r.approval_policy.inputs.velocity.per_dest_cap.approved_in_window)
        r = create(ONE, { asset = asset, amount = "400", destination = FEE })
        assert.equal("600", r.approval_policy.inputs.velocity.per_dest_cap.approved_in_window)
      end)
    end)
  end)
end)
