-- qtg.observe_affinity: with several processes, an observer leaves for a
-- moment the requests another process has just made due, and takes them
-- once they have been due GRACE seconds (docs/performance.md, "Each
-- process observes what it submitted").  The selection on its own, then
-- the observer's real passes over real rows, with "another process" being
-- a dispatch this process's set has forgotten.
local qtg = require "qtg"
local affinity = require "qtg.observe_affinity"

-- a snapshot's group: one row per due node of request `rid`
local function group(rid, ...)
  local g = {}
  for i, due_for in ipairs({ ... }) do g[i] = { id = rid .. "-" .. i, request_id = rid, due_for = due_for } end
  return g
end

local function ids(groups)
  local out = {}
  for i, g in ipairs(groups) do out[i] = g[1].request_id end
  return out
end

describe("observe affinity: the selection", function()
  before_each(function() affinity.reset() end)
  after_each(function() affinity.reset() end)

  it("walks every request while no claim has missed", function()
    local walk, later = affinity.select({ group("r1", 0.01), group("r2", 0.2), group("r3", 3) })
    assert.same({ "r1", "r2", "r3" }, ids(walk))
    assert.is_nil(later)
    assert.is_false(affinity.stats().contended)
  end)

  it("after a miss, leaves another process's fresh request and says when to look again", function()
    affinity.note("r1", "SUBMITTED")
    affinity.note("r4", "OBSERVING")
    affinity.missed(true)
    assert.is_true(affinity.stats().contended)
    local walk, later = affinity.select({
      group("r1", 0.01),          -- made due here: walked
      group("r2", 0.1, 0.05),     -- another's, fresh: left
      group("r3", 0.2, affinity.GRACE + 0.1), -- one node due long enough: walked
      group("r4", 0.3),           -- made due here
      group("r5", 0.3),           -- another's, fresh: left
    })
    assert.same({ "r1", "r3", "r4" }, ids(walk))
    -- the first left out (r5, due 0.3 s) may be taken GRACE - 0.3 s from now
    assert.near(affinity.GRACE - 0.3, later, 1e-9)
    -- the requests walked are forgotten: a second look at r1, fresh, leaves it
    assert.equal(0, affinity.stats().mine)
    walk = affinity.select({ group("r1", 0.01) })
    assert.same({}, ids(walk))
  end)

  it("a miss without wake-ups leaves nothing to anyone", function()
    affinity.missed(false)
    assert.is_false(affinity.stats().contended)
    local walk, later = affinity.select({ group("r1", 0.01) })
    assert.same({ "r1" }, ids(walk))
    assert.is_nil(later)
  end)

  it("notes only writes that make a node due", function()
    for _, st in ipairs({ "READY", "COMPLETED", "FAILED", "UNKNOWN", "BLOCKED" }) do
      affinity.note("r-" .. st, st)
    end
    affinity.note(nil, "SUBMITTED")
    assert.equal(0, affinity.stats().mine)
    affinity.note("r1", "SUBMITTED")
    affinity.note("r1", "OBSERVING")
    assert.equal(1, affinity.stats().mine)
  end)

  it("keeps at most MAX_MINE requests: past that the set starts again", function()
    for i = 1, affinity.MAX_MINE do affinity.note("r" .. i, "SUBMITTED") end
    assert.equal(affinity.MAX_MINE, affinity.stats().mine)
    affinity.note("one-more", "SUBMITTED")
    assert.equal(1, affinity.stats().mine)
  end)

  it("a row without a due age counts as fresh, and is looked at again within GRACE", function()
    affinity.missed(true)
    local walk, later = affinity.select({
      { { id = "n1", request_id = "r1", due_for = qtg.db.NULL } },
      { { id = "n2", request_id = "r2", due_for = -5 } },
    })
    assert.same({}, ids(walk))
    assert.equal(affinity.GRACE, later)
  end)
end)

describe("observe affinity: the observer's passes", function()
  local sup, s
  local T = "spec_observe_affinity"

  setup(function()
    sup = require("spec.lua.support.engine")
    s = qtg.db.acquire()
    sup.load_doc(s, sup.doc(T, { { "a", "action", "withdrawal", { sim = { observes = 1, retry_after_seconds = 0 } } } }))
  end)
  teardown(function()
    affinity.reset()
    s:release()
  end)
  before_each(function()
    sup.park_others(s)
    affinity.reset()
  end)

  it("leaves another process's fresh node for GRACE, then observes it", function()
    -- a grace longer than any stall of a loaded machine between the
    -- dispatch and the pass (the shipped one is 0.5 s)
    local grace = affinity.GRACE
    affinity.GRACE = 3
    local ok, err = pcall(function()
      local other = sup.create_approved(s, T)
      assert.equal(1, sup.tick("node_dispatcher"))
      assert.equal("SUBMITTED", sup.nodes(s, other.id).a.node_state)
      affinity.reset()        -- as if another process had dispatched it
      affinity.missed(true)   -- and this one had missed a claim since
      assert.equal(0, sup.tick("node_observer"))
      assert.equal("SUBMITTED", sup.nodes(s, other.id).a.node_state)
      assert.equal(0, sup.nodes(s, other.id).a.observe_count)
      qtg.sleep(affinity.GRACE)
      assert.equal(1, sup.tick("node_observer"))
      local n = sup.nodes(s, other.id).a
      assert.equal("COMPLETED", n.node_state)
      assert.equal(1, n.observe_count)
    end)
    affinity.GRACE = grace
    assert(ok, err)
  end)

  it("observes at once what this process dispatched, contended or not", function()
    affinity.missed(true)
    local mine = sup.create_approved(s, T)
    assert.equal(1, sup.tick("node_dispatcher"))
    assert.equal(1, affinity.stats().mine)
    assert.equal(1, sup.tick("node_observer"))
    assert.equal("COMPLETED", sup.nodes(s, mine.id).a.node_state)
    assert.equal(0, affinity.stats().mine)
  end)

  it("observes everything at once when no claim has missed", function()
    local other = sup.create_approved(s, T)
    assert.equal(1, sup.tick("node_dispatcher"))
    affinity.reset()
    assert.equal(1, sup.tick("node_observer"))
    assert.equal("COMPLETED", sup.nodes(s, other.id).a.node_state)
  end)
end)
