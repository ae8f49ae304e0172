-- The node_dispatcher's per-candidate claim with several sessions: a READY
-- node whose request row is locked elsewhere is skipped, a later candidate is
-- claimed, and no lock is left on the skipped node (pgrowlocks and a NOWAIT
-- probe from a third session).  Two concurrent claimers never get one node.
local qtg = require "qtg"
local dispatcher = require "qtg.workers.node_dispatcher"

local sup
local T = "spec_claim_one"
-- three parallel nodes: one kept in flight, one that fails at submit, one left READY
local STOPPING = "spec_claim_stopping"

-- one tick of the dispatcher with its passes as the runtime runs it
local function common_tick() return sup.tick("node_dispatcher", dispatcher.PASSES_PER_TICK) end

local function claim(s)
  return qtg.db.claim.one(s, {
    candidates_sql = dispatcher.CANDIDATES_SQL,
    claim_sql = dispatcher.CLAIM_SQL,
    args = { qtg.settings.network_class, "[]" },  -- no executor paced out
    max_misses = dispatcher.MAX_MISSES,
  })
end

-- Another session holds the request's row lock (until its rollback).
local function hold_request(s, id)
  s:begin()
  s:query("SELECT id FROM movement_requests WHERE id = $1::uuid FOR UPDATE", id)
end

-- Row locks on movement_request_nodes: node id -> locking xids ("{n,...}").
local function node_row_locks(s)
  local out = {}
  for _, r in ipairs(s:query([[
      SELECT n.id::text AS id, l.xids::text AS xids
        FROM pgrowlocks('movement_request_nodes') l
        JOIN movement_request_nodes n ON n.ctid = l.locked_row]])) do
    out[r.id] = r.xids
  end
  return out
end

-- s counting its round trips (the session calls that wait for the
-- server) and the commits that carried a claim ahead
local ROUND_TRIPS = { query = true, exec = true, batch = true, commit_batch = true, commit = true, rollback = true }
local function counting(s)
  local methods = getmetatable(s).__index
  local real, counts = {}, { trips = 0, ahead = 0 }
  for k in pairs(ROUND_TRIPS) do
    real[k] = methods[k]
    methods[k] = function(self, ...)
      if self == s then counts.trips = counts.trips + 1 end
      return real[k](self, ...)
    end
  end
  local raw_ahead = methods.raw_batch_commit_ahead
  methods.raw_batch_commit_ahead = function(self, ...)
    local r = { raw_ahead(self, ...) }
    if self == s and r[1] then counts.ahead = counts.ahead + 1 end
    return unpack(r, 1, table.maxn(r))
  end
  return counts, function()
    for k, f in pairs(real) do methods[k] = f end
    methods.raw_batch_commit_ahead = raw_ahead
  end
end


-- two_at_once(ticks, tick) -> the sum of what tick() returns, called
-- `ticks` times in each of two tasks run at once
local function two_at_once(ticks, tick)
  local tasks = {}
  for i = 1, 2 do
    tasks[i] = qtg.spawn(function()
      local mine = 0
      for _ = 1, ticks do mine = mine + tick() end
      return mine
    end)
  end
  local total = 0
  for i = 1, 2 do
    local ok, got = qtg.join(tasks[i])
    assert.is_true(ok, tostring(got))
    total = total + got
  end
  return total
end

describe("per-candidate claim", function()
  local s1, s2, s3
  setup(function()
    sup = require("spec.lua.support.engine")
    s1, s2, s3 = qtg.db.acquire(), qtg.db.acquire(), qtg.db.acquire()
    s3:query("CREATE EXTENSION IF NOT EXISTS pgrowlocks")
    sup.load_doc(s3, sup.doc(T, { { "a", "action", "withdrawal", { sim = { observes = 0 } } } }))
    sup.load_doc(s3, sup.doc(STOPPING, {
      { "a_slow", "action", "withdrawal", { sim = { observes = 1000, retry_after_seconds = 600 } } },
      { "b_fail", "action", "withdrawal", { sim = { fail = "submit" } } },
      { "c_ready", "action", "withdrawal", { sim = { observes = 0 } } },
    }))
  end)
  teardown(function()
    for _, s in ipairs({ s1, s2, s3 }) do
      if s:in_transaction() then s:rollback() end
      s:release()
    end
  end)
  before_each(function() sup.park_others(s3) end)
  after_each(function()
    for _, s in ipairs({ s1, s2, s3 }) do
      if s:in_transaction() then s:rollback() end
    end
  end)

  it("skips a node whose request is locked, claims a later one, and keeps no lock on the skipped node", function()
    local older = sup.create_approved(s3, T)
    local newer = sup.create_approved(s3, T)
    local older_node = sup.nodes(s3, older.id).a
    local newer_node = sup.nodes(s3, newer.id).a

    hold_request(s2, older.id)

    s1:begin()
    local row = claim(s1)
    assert.is_not_nil(row)
    assert.equal(newer_node.id, row.node_id)     -- FIFO would give older: it was skipped

    local locks = node_row_locks(s3)
    assert.is_nil(locks[older_node.id], "the skipped node must carry no row lock")
    assert.is_string(locks[newer_node.id], "the claimed node is row-locked")
    -- a third session can lock the skipped node at once
    s3:begin()
    local probe = s3:query([[SELECT id FROM movement_request_nodes WHERE id = $1::uuid
                              FOR UPDATE NOWAIT]], older_node.id)
    assert.equal(1, #probe)
    s3:rollback()
    -- while the claimed node is held by s1
    s3:begin()
    local ok, err = pcall(s3.query, s3, [[SELECT id FROM movement_request_nodes WHERE id = $1::uuid
                                            FOR UPDATE NOWAIT]], newer_node.id)
    assert.is_false(ok)
    assert.equal("55P03", err.sqlstate)
    s3:rollback()
    -- and nobody waits on anything
    local waiting = s3:query("SELECT count(*)::int AS n FROM pg_locks WHERE NOT granted")[1].n
    assert.equal(0, waiting)

    s1:rollback()
    s2:rollback()
  end)

  it("the dispatcher's one-statement claim skips a node whose request is locked and leaves no lock on it", function()
    local older = sup.create_approved(s3, T)
    local newer = sup.create_approved(s3, T)
    local older_node = sup.nodes(s3, older.id).a
    local newer_node = sup.nodes(s3, newer.id).a

    hold_request(s2, older.id)

    local row = dispatcher.claim_one(s1, qtg.settings.network_class)
    assert.is_not_nil(row)
    assert.is_true(s1:in_transaction())
    assert.equal(newer_node.id, row.node_id)     -- FIFO would give older: it was skipped
    assert.equal(newer.id, row.request_id)
    assert.is_nil(row.candidate_id)

    local locks = node_row_locks(s3)
    assert.is_nil(locks[older_node.id], "the skipped node must carry no row lock")
    assert.is_string(locks[newer_node.id], "the claimed node is row-locked")
    s3:begin()
    assert.equal(1, #s3:query([[SELECT id FROM movement_request_nodes WHERE id = $1::uuid
                                 FOR UPDATE NOWAIT]], older_node.id))
    s3:rollback()
    s1:rollback()
    -- only the locked one left: a miss, then nothing, and no transaction open
    sup.tick("node_dispatcher")
    assert.is_nil(dispatcher.claim_one(s1, qtg.settings.network_class))
    assert.is_false(s1:in_transaction())
    assert.is_nil(node_row_locks(s3)[older_node.id])
    s2:rollback()
    row = dispatcher.claim_one(s1, qtg.settings.network_class)
    assert.equal(older_node.id, row.node_id)
    s1:rollback()
  end)

  -- A review (session 38): the stopping test was applied above the
  -- LATERAL's lock, so the claim locked an older stopping request's READY
  -- node, passed the request over, and kept that lock through the claimed
  -- node's whole dispatch (the provider's submit included), as the spec's
  -- claim path forbids.
  it("the one-statement claim keeps no lock on the READY node of a stopping request it passes over", function()
    local old = sup.create_approved(s3, STOPPING)
    for _ = 1, 3 do sup.tick("node_dispatcher") end
    local n = sup.nodes(s3, old.id)
    assert.equal("SUBMITTED", n.a_slow.node_state)
    assert.equal("FAILED", n.b_fail.node_state)
    assert.equal("READY", n.c_ready.node_state)
    assert.equal("EXECUTING", sup.request(s3, old.id).request_state) -- held while a_slow settles
    local new = sup.create_approved(s3, T)
    local new_node = sup.nodes(s3, new.id).a
    local row = dispatcher.claim_one(s1, qtg.settings.network_class)
    assert.equal(new_node.id, row.node_id)
    local locks = node_row_locks(s3)
    assert.is_string(locks[new_node.id], "the claimed node is row-locked")
    assert.is_nil(locks[n.c_ready.id], "the passed-over node must carry no row lock")
    s3:begin()
    assert.equal(1, #s3:query([[SELECT id FROM movement_request_nodes WHERE id = $1::uuid
                                 FOR UPDATE NOWAIT]], n.c_ready.id))
    s3:rollback()
    s1:rollback()
  end)

  it("the one-statement claim passes over a node another dispatcher holds: the next one, not a miss", function()
    local older = sup.create_approved(s3, T)
    local newer = sup.create_approved(s3, T)
    local older_node = sup.nodes(s3, older.id).a
    local newer_node = sup.nodes(s3, newer.id).a
    local class = qtg.settings.network_class
    local held = dispatcher.claim_one(s1, class)  -- the first dispatcher holds the FIFO head
    assert.equal(older_node.id, held.node_id)
    s2:begin_pipeline()
    local rows = s2:query(dispatcher.CLAIM_ONE_SQL, "{}", class, "[]")
    assert.equal(1, #rows)
    assert.equal(newer_node.id, rows[1].candidate_id)
    assert.equal(newer_node.id, rows[1].node_id)
    assert.equal(newer.id, rows[1].request_id)
    s2:rollback()
    s1:rollback()
  end)

  it("dispatches FIFO by request created_at, one node per tick", function()
    local ids = {}
    for i = 1, 3 do ids[i] = sup.create_approved(s3, T).id end
    for i = 1, 3 do
      assert.equal(1, sup.tick("node_dispatcher"))
      for j = 1, 3 do
        local want = j <= i and "COMPLETED" or "READY"
        assert.equal(want, sup.nodes(s3, ids[j]).a.node_state)
      end
    end
    assert.equal(0, sup.tick("node_dispatcher"))
  end)

  it("a tick dispatches the later node while the older request is locked, then the older one", function()
    local older = sup.create_approved(s3, T)
    local newer = sup.create_approved(s3, T)
    hold_request(s2, older.id)
    assert.equal(1, sup.tick("node_dispatcher"))
    assert.equal("COMPLETED", sup.nodes(s3, newer.id).a.node_state)
    assert.equal("READY", sup.nodes(s3, older.id).a.node_state)
    assert.equal(0, sup.tick("node_dispatcher"))  -- the only candidate is still locked
    s2:rollback()
    assert.equal(1, sup.tick("node_dispatcher"))
    assert.equal("COMPLETED", sup.nodes(s3, older.id).a.node_state)
  end)

  it("the observer skips a node whose request is locked and observes the next one", function()
    sup.load_doc(s3, sup.doc("spec_claim_observe", {
      { "a", "action", "withdrawal", { sim = { observes = 1, retry_after_seconds = 0 } } } }))
    local older = sup.create_approved(s3, "spec_claim_observe")
    local newer = sup.create_approved(s3, "spec_claim_observe")
    sup.tick("node_dispatcher")
    sup.tick("node_dispatcher")
    assert.equal("SUBMITTED", sup.nodes(s3, older.id).a.node_state)
    hold_request(s2, older.id)
    assert.equal(1, sup.tick("node_observer"))
    assert.equal("SUBMITTED", sup.nodes(s3, older.id).a.node_state)
    assert.equal("COMPLETED", sup.nodes(s3, newer.id).a.node_state)
    s2:rollback()
    assert.equal(1, sup.tick("node_observer"))
    assert.equal("COMPLETED", sup.nodes(s3, older.id).a.node_state)
  end)

  it("an observer pass that has observed a node ends its walk at a miss; the next pass goes on", function()
    sup.load_doc(s3, sup.doc("spec_claim_observe", {
      { "a", "action", "withdrawal", { sim = { observes = 1, retry_after_seconds = 0 } } } }))
    local r = {}
    for i = 1, 3 do r[i] = sup.create_approved(s3, "spec_claim_observe") end
    for _ = 1, 3 do assert.equal(1, sup.tick("node_dispatcher")) end
    -- one lane, and the walk starts at the oldest request (FIFO)
    local observer = require("qtg.workers.node_observer")
    local random_bytes, lanes = qtg.crypto.random_bytes, observer.MAX_LANES
    qtg.crypto.random_bytes = function(n) return ("\0"):rep(n) end
    observer.MAX_LANES = 1
    local ok, err = pcall(function()
      hold_request(s2, r[2].id)
      -- r1 observed, r2 missed: the walk ends before r3
      assert.equal(1, sup.tick("node_observer"))
      assert.equal("COMPLETED", sup.nodes(s3, r[1].id).a.node_state)
      assert.equal("SUBMITTED", sup.nodes(s3, r[2].id).a.node_state)
      assert.equal("SUBMITTED", sup.nodes(s3, r[3].id).a.node_state)
      -- a pass that has observed nothing walks past its miss: r2 missed, r3 observed
      assert.equal(1, sup.tick("node_observer"))
      assert.equal("SUBMITTED", sup.nodes(s3, r[2].id).a.node_state)
      assert.equal("COMPLETED", sup.nodes(s3, r[3].id).a.node_state)
      s2:rollback()
      assert.equal(1, sup.tick("node_observer"))
      assert.equal("COMPLETED", sup.nodes(s3, r[2].id).a.node_state)
    end)
    qtg.crypto.random_bytes, observer.MAX_LANES = random_bytes, lanes
    if s2:in_transaction() then s2:rollback() end
    assert(ok, err)
  end)

  it("two sessions claiming at once get different nodes", function()
    local ids = {}
    for i = 1, 6 do ids[i] = sup.create_approved(s3, T).id end
    local got = {}
    local tasks = {}
    for i = 1, 3 do
      tasks[i] = qtg.spawn(function()
        local s = qtg.db.acquire()
        local mine = {}
        for _ = 1, 2 do
          s:begin()
          local row = claim(s)
          if row then
            mine[#mine + 1] = row.node_id
            qtg.sleep(0.05)  -- hold the locks while the others claim
            s:query("UPDATE movement_request_nodes SET node_state = 'SUBMITTED' WHERE id = $1::uuid", row.node_id)
          end
          s:commit()
        end
        s:release()
        return mine
      end)
    end
    for i = 1, 3 do
      local ok, mine = qtg.join(tasks[i])
      assert.is_true(ok, tostring(mine))
      for _, id in ipairs(mine) do
        assert.is_nil(got[id], "node claimed twice: " .. id)
        got[id] = true
      end
    end
    local n = 0
    for _ in pairs(got) do n = n + 1 end
    assert.equal(6, n)
  end)

  describe("the claimed request's nodes with the claim", function()
    local nodes_db = require "qtg.nodes"

    local function ids_and_states(rows)
      local out = {}
      for i, n in ipairs(rows) do out[i] = n.id .. ":" .. n.node_state .. ":" .. n.request_id end
      return out
    end

    -- s, counting its NODES_SQL statements
    local function counting(s)
      local n = 0
      local proxy = setmetatable({}, { __index = function(_, k)
        local f = s[k]
        return function(_, sql, ...)
          if k == "query" and sql == nodes_db.NODES_SQL then n = n + 1 end
          return f(s, sql, ...)
        end
      end })
      return proxy, function() return n end
    end

    local was
    before_each(function() was = dispatcher.draining end)
    after_each(function() dispatcher.draining = was end)

    it("come in the claim's round trip while the dispatcher drains; an idle pass's claim goes alone", function()
      local older = sup.create_approved(s3, T)
      sup.create_approved(s3, T)
      local class = qtg.settings.network_class
      dispatcher.draining = false
      local row, nodes = dispatcher.claim_one(s1, class)
      assert.equal(older.id, row.request_id)
      assert.is_nil(nodes)
      assert.is_true(dispatcher.draining) -- it found a node: the next claim brings the nodes
      s1:rollback()
      for _ = 1, 2 do -- the first prepares the statements, the second sends them together
        row, nodes = dispatcher.claim_one(s1, class)
        assert.equal(older.id, row.request_id)
        assert.same(ids_and_states(s3:query(nodes_db.NODES_SQL, older.id)), ids_and_states(nodes))
        s1:rollback()
      end
    end)

    it("after a miss, the nodes are the claimed request's, not the missed one's", function()
      local older = sup.create_approved(s3, T)
      local newer = sup.create_approved(s3, T)
      hold_request(s2, older.id)
      dispatcher.draining = true
      local row, nodes = dispatcher.claim_one(s1, qtg.settings.network_class)
      assert.equal(newer.id, row.request_id)
      assert.is_true(#nodes > 0)
      for _, n in ipairs(nodes) do assert.equal(newer.id, n.request_id) end
      s1:rollback()
      s2:rollback()
    end)

    it("the observer's claim brings them too; a missed claim reads none", function()
      local observer = require "qtg.workers.node_observer"
      local key = T .. "_observed"
      sup.load_doc(s3, sup.doc(key, { { "a", "action", "withdrawal", { sim = { observes = 3 } } } }))
      local req = sup.create_approved(s3, key)
      assert.equal(1, sup.tick("node_dispatcher"))
      local a = sup.nodes(s3, req.id).a
      assert.equal("SUBMITTED", a.node_state)
      s3:query("UPDATE movement_request_nodes SET next_observe_at = now() - interval '1 second' WHERE id = $1::uuid",
        a.id) -- due now
      local class = qtg.settings.network_class
      for _ = 1, 2 do -- the first prepares the statements, the second sends them together
        s1:begin_pipeline()
        local rows, nodes = s1:batch({ observer.CLAIM_SQL, a.id, class, req.id }, { nodes_db.CLAIMED_NODES_SQL })
        assert.equal(a.id, rows[1].node_id)
        assert.same(ids_and_states(s3:query(nodes_db.NODES_SQL, req.id)), ids_and_states(nodes))
        s1:rollback()
      end
      -- the request held elsewhere: the claim misses and no nodes are read
      hold_request(s2, req.id)
      s1:begin_pipeline()
      local rows, nodes = s1:batch({ observer.CLAIM_SQL, a.id, class, req.id }, { nodes_db.CLAIMED_NODES_SQL })
      assert.same({}, rows)
      assert.same({}, nodes)
      s1:rollback()
      s2:rollback()
    end)

    it("claimed() uses them when they are the claimed request's, and reads them itself otherwise", function()
      local older = sup.create_approved(s3, T)
      local newer = sup.create_approved(s3, T)
      dispatcher.draining = true
      local row, nodes = dispatcher.claim_one(s1, qtg.settings.network_class)
      assert.equal(older.id, row.request_id)
      local proxy, reads = counting(s1)
      local g, node = nodes_db.claimed(proxy, row, nodes)
      assert.equal(0, reads())
      assert.equal(row.node_id, node.id)
      -- another request's nodes (a batch gone wrong, a tampered setting) or none: read again
      local foreign = s3:query(nodes_db.NODES_SQL, newer.id)
      for _, given in ipairs({ foreign, {} }) do
        local before = reads()
        g, node = nodes_db.claimed(proxy, row, given)
        assert.equal(before + 1, reads())
        assert.equal(row.node_id, node.id)
        for _, n in ipairs(g.nodes) do assert.equal(older.id, n.request_id) end
      end
      s1:rollback()
    end)
  end)

  describe("a tick of several passes (the claim sent ahead with the commit)", function()
    -- tick(passes) -> the tick's count and its counts on s1
    local function tick(passes)
      local counts, restore = counting(s1)
      local ok, n = pcall(dispatcher.tick, s1, passes)
      restore()
      assert(ok, n)
      return n, counts
    end

    local was
    before_each(function()
      was = dispatcher.draining
      -- s1's connection prepares the statements, the process caches the plan
      for _ = 1, 3 do sup.create_approved(s3, T) end
      local total = 0
      for _ = 1, 4 do total = total + dispatcher.tick(s1, 3) end
      assert.equal(3, total)
    end)
    after_each(function() dispatcher.draining = was end)

    it("dispatches FIFO, each node's claim sent with the last one's commit: no round trip of its own", function()
      local ids = {}
      for i = 1, 3 do ids[i] = sup.create_approved(s3, T).id end
      dispatcher.draining = false
      local n, counts = tick()
      assert.equal(3, n)
      -- the first claim alone and its request's nodes read after it (2);
      -- each pass's request write (EXECUTING with the node's COMPLETED) and
      -- its completion with the commit and the next claim (2 each); the
      -- last claim ahead found nothing and ends its transaction (1).  One
      -- pass at a time, each later pass's claim is a round trip more.
      assert.equal(9, counts.trips)
      assert.equal(3, counts.ahead)
      assert.is_false(s1:in_transaction())
      local started = {}
      for i = 1, 3 do
        local a = sup.nodes(s3, ids[i]).a
        assert.equal("COMPLETED", a.node_state)
        assert.equal(1, a.attempt_no)
        started[i] = s3:query("SELECT extract(epoch FROM started_at)::float8 AS t FROM movement_request_nodes WHERE id = $1::uuid", a.id)[1].t
      end
      assert.is_true(started[1] < started[2] and started[2] < started[3], "not FIFO")
      -- one provider call each
      for i = 1, 3 do
        local a = sup.nodes(s3, ids[i]).a
        assert.equal(1, s3:query("SELECT count(*)::int AS n FROM sim_ledger WHERE request_node_id = $1::uuid", a.id)[1].n)
      end
    end)

    it("the claim ahead runs after the commit: it sees the node it follows dispatched, and a successor it readied", function()
      local ids = {}
      for i = 1, 2 do ids[i] = sup.create_approved(s3, T).id end
      -- the claim ahead is the transaction after the commit, so its snapshot
      -- has the first node COMPLETED and claims the second, never the first
      local n = tick(2)
      assert.equal(2, n)
      for i = 1, 2 do assert.equal("COMPLETED", sup.nodes(s3, ids[i]).a.node_state) end
      assert.equal(2, s3:query([[SELECT count(*)::int AS n FROM sim_ledger l
        JOIN movement_request_nodes n ON n.id = l.request_node_id
       WHERE n.request_id = ANY ($1::uuid[])]], "{" .. table.concat(ids, ",") .. "}")[1].n)
      -- a -> b, b readied by a's commit: the claim sent with that commit
      -- finds b READY, which a claim run before the commit could not
      local chain = T .. "_chain"
      sup.load_doc(s3, sup.doc(chain, { { "a", "action", "withdrawal", { sim = { observes = 0 } } },
                                        { "b", "action", "withdrawal", { sim = { observes = 0 } } } },
        { { "a", "b" } }))
      sup.create_approved(s3, chain)
      assert.equal(2, tick(2)) -- the plan read and the statements prepared on s1
      local req = sup.create_approved(s3, chain)
      local counts
      n, counts = tick(2)
      assert.equal(2, n)
      assert.equal(1, counts.ahead)
      assert.equal("COMPLETED", sup.nodes(s3, req.id).b.node_state)
    end)

    it("the last pass of a tick sends no claim ahead: nothing is left claimed", function()
      local ids = {}
      for i = 1, 3 do ids[i] = sup.create_approved(s3, T).id end
      local n, counts = tick(2)
      assert.equal(2, n)
      assert.equal(1, counts.ahead)
      assert.is_false(s1:in_transaction())
      assert.equal("READY", sup.nodes(s3, ids[3]).a.node_state)
      assert.same({}, node_row_locks(s3))
      assert.equal(1, sup.tick("node_dispatcher"))
      assert.equal("COMPLETED", sup.nodes(s3, ids[3]).a.node_state)
    end)

    it("a claim ahead that misses (its request locked elsewhere) goes on to the next candidate", function()
      local ids = {}
      for i = 1, 3 do ids[i] = sup.create_approved(s3, T).id end
      hold_request(s2, ids[2])
      local n = tick()
      assert.equal(2, n)
      assert.equal("COMPLETED", sup.nodes(s3, ids[1]).a.node_state)
      assert.equal("READY", sup.nodes(s3, ids[2]).a.node_state)
      assert.equal("COMPLETED", sup.nodes(s3, ids[3]).a.node_state)
      assert.is_nil(node_row_locks(s3)[sup.nodes(s3, ids[2]).a.id]) -- no lock kept on the missed node
      s2:rollback()
      assert.equal(1, tick())
      assert.equal("COMPLETED", sup.nodes(s3, ids[2]).a.node_state)
    end)

    it("two dispatchers ticking at once dispatch every node once", function()
      local ids = {}
      for i = 1, 8 do ids[i] = sup.create_approved(s3, T).id end
      assert.equal(8, two_at_once(10, common_tick))
      for i = 1, 8 do
        local a = sup.nodes(s3, ids[i]).a
        assert.equal("COMPLETED", a.node_state)
        assert.equal(1, a.attempt_no)
        assert.equal(1, s3:query("SELECT count(*)::int AS n FROM sim_ledger WHERE request_node_id = $1::uuid", a.id)[1].n)
      end
    end)
  end)
  describe("an observer pass (each next claim sent with the last observation's commit)", function()
    local observer = require "qtg.workers.node_observer"
    local pacing = require "qtg.pacing"
    local executors = require "qtg.executors"
    local O = "spec_claim_observe_ahead"
    local lanes

    -- one observer pass on s1, one lane, the walk from the oldest request
    local function pass()
      local counts, restore = counting(s1)
      local random_bytes = qtg.crypto.random_bytes
      qtg.crypto.random_bytes = function(n) return ("\0"):rep(n) end
      local ok, n = pcall(observer.tick, s1)
      qtg.crypto.random_bytes = random_bytes
      restore()
      assert(ok, n)
      return n, counts
    end

    -- n requests with one node, dispatched: SUBMITTED, due
    local function submitted(n)
      local ids = {}
      for i = 1, n do ids[i] = sup.create_approved(s3, O).id end
      for _ = 1, n do assert.equal(1, sup.tick("node_dispatcher")) end
      for i = 1, n do assert.equal("SUBMITTED", sup.nodes(s3, ids[i]).a.node_state) end
      return ids
    end

    -- a pass that observes the first of ids and no other, the claim of the
    -- second sent ahead, and leaves no transaction and no lock
    local function pass_observing_the_first(ids)
      local n, counts = pass()
      assert.equal(1, n)
      assert.equal(1, counts.ahead)
      assert.is_false(s1:in_transaction())
      assert.same({}, node_row_locks(s3))
      for i, id in ipairs(ids) do assert.equal(i == 1 and 1 or 0, sup.nodes(s3, id).a.observe_count) end
    end

    setup(function()
      sup.load_doc(s3, sup.doc(O, { { "a", "action", "withdrawal", { sim = { observes = 2, retry_after_seconds = 0 } } } }))
    end)
    before_each(function()
      lanes, observer.MAX_LANES = observer.MAX_LANES, 1
      -- s1's connection prepares the statements
      submitted(2)
      assert.equal(2, pass())
      sup.park_others(s3)
    end)
    after_each(function()
      observer.MAX_LANES = lanes
      executors.get("sim").RATE_LIMITS = nil
      pacing.reset()
    end)

    it("observes each due node once, each later claim sent with the last commit", function()
      local ids = submitted(3)
      local n, counts = pass()
      assert.equal(3, n)
      -- the snapshot (1), the first claim with its request's nodes (1), each
      -- observation's write with its commit (3), the second and third
      -- carrying the next claim; without it, two round trips more
      assert.equal(5, counts.trips)
      assert.equal(2, counts.ahead)
      assert.is_false(s1:in_transaction())
      assert.same({}, node_row_locks(s3))
      for i = 1, 3 do
        local a = sup.nodes(s3, ids[i]).a
        assert.equal("OBSERVING", a.node_state)
        assert.equal(1, a.observe_count)
      end
    end)

    it("a claim ahead that misses ends the walk and its transaction; the next pass goes on", function()
      local ids = submitted(3)
      hold_request(s2, ids[2])
      pass_observing_the_first(ids)
      s2:rollback()
      -- the next pass: the first node's second observation is due too
      assert.equal(3, pass())
      for i = 1, 3 do assert.equal(i == 1 and 2 or 1, sup.nodes(s3, ids[i]).a.observe_count) end
    end)

    it("a claim ahead is paced once it has claimed: over the limit, the node is put back, not observed", function()
      local ids = submitted(3)
      -- one observe now, the next in 100 s; nothing waits in place
      executors.get("sim").RATE_LIMITS = { observe = { per_second = 0.01, burst = 1 }, max_hold_seconds = 0 }
      pacing.reset()
      pass_observing_the_first(ids)
      for i = 2, 3 do
        local a = sup.nodes(s3, ids[i]).a
        assert.equal("SUBMITTED", a.node_state)
        local later = s3:query([[SELECT next_observe_at > now() + interval '60 seconds' AS later
                                   FROM movement_request_nodes WHERE id = $1::uuid]], a.id)[1].later
        assert.is_true(later, "node " .. i .. " not put back")
      end
      assert.equal(0, pass()) -- none due
    end)

    it("two observers at once, with their lanes, observe every node once", function()
      observer.MAX_LANES = lanes
      local ids = submitted(8)
      -- observes = 2: each node is observed twice, the second completes it
      assert.equal(16, two_at_once(6, function() return qtg.db.with_session(observer.tick) end))
      for i = 1, 8 do
        local a = sup.nodes(s3, ids[i]).a
        assert.equal("COMPLETED", a.node_state)
        assert.equal(2, a.observe_count)
      end
      assert.same({}, node_row_locks(s3))
    end)
  end)
end)
