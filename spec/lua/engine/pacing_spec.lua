-- spec/lua/engine/pacing_spec.lua -- calls to providers are paced (lua/qtg/pacing.lua,
-- docs/pacing.md): the observe floor, adapters' rate limits shared by two
-- processes, an observer pass over the due nodes of one request, recovery's
-- batch as a cap, the approval TTL, and `tick`'s exit code in the console.
--
-- Real PostgreSQL, real `qtgd run` processes; rates are measured from the
-- sim provider's own access log (sim_calls, stamped by the database clock).
-- The assertions are the bounds the limits guarantee by construction (a
-- call recorded after the last one plus the floor; at most burst + rate x w
-- calls in any w seconds), never how fast something went.
local qtg = require("qtg")
local cjson = require("cjson")
local common = require "spec.lua.support.common"

local support, engine
local q

-- An operator's override of the sim adapter (MG_LUA_PATH): the packaged
-- module, with its access log on and the given RATE_LIMITS.
local function sim_override(dir, limits)
  support.write(dir .. "/qtg/executors/sim.lua", ([[
local qtg = require "qtg"
local sim = dofile(qtg.root .. "/lua/qtg/executors/sim.lua")
sim.CALL_LOG = true
sim.RATE_LIMITS = %s
return sim
]]):format(limits or "nil"))
end

-- A `qtgd run` of this network class.
local function start_daemon(env)
  local base = {
    MG_NETWORK_CLASS = qtg.settings.network_class,
    MG_LOG_LEVEL = "warn",
    MG_NODE_DISPATCH_INTERVAL_SECONDS = "0.05",
    MG_NODE_OBSERVE_INTERVAL_SECONDS = "0.05",
    MG_NODE_RECOVERY_INTERVAL_SECONDS = "600",
    MG_CALLBACK_DISPATCH_INTERVAL_SECONDS = "600",
    MG_EXPIRATION_CHECK_INTERVAL_SECONDS = "600",
    MG_EXECUTOR_HEALTH_INTERVAL_SECONDS = "600",
    MG_TEMPLATE_PROPOSAL_EXPIRATION_INTERVAL_SECONDS = "600",
  }
  for k, v in pairs(env) do base[k] = v end
  return support.start(support.base_env(base), { "run" })
end

local function all_completed(s, ids)
  local n = s:query([[SELECT count(*)::int AS n FROM movement_requests
                       WHERE id = ANY ($1::uuid[]) AND request_state = 'COMPLETED']],
    "{" .. table.concat(ids, ",") .. "}")[1].n
  return n == #ids
end

-- The sim's log of calls for the nodes of these requests: {call, key, caller, t}.
local function calls_of(s, ids)
  return s:query([[
    SELECT c.call, c.idempotency_key AS key, c.caller, extract(epoch FROM c.at)::float8 AS t
      FROM sim_calls c
      JOIN movement_request_nodes n ON n.idempotency_key = c.idempotency_key
     WHERE n.request_id = ANY ($1::uuid[])
     ORDER BY c.at, c.id]], "{" .. table.concat(ids, ",") .. "}")
end

local function approved(s, template, n)
  local requests = require("qtg.requests")
  local ids = {}
  for i = 1, n do
    local req = engine.create(s, template, { callback_url = false })
    requests.approve(s, req.id, engine.ACTOR)
    ids[i] = req.id
  end
  return ids
end

describe("provider pacing", function()
  local dir

  setup(function()
    support = dofile(qtg.root .. "/spec/lua/support/host.lua")
    engine = dofile(qtg.root .. "/spec/lua/support/engine.lua")
    q = common.quote
    dir = support.tmpdir()
  end)

  teardown(function()
    support.stop_all()
    if dir then os.execute("rm -rf " .. q(dir)) end
  end)

  after_each(function()
    for _, h in ipairs(support.started) do
      if not (support.read(h.rcfile) or ""):match("%d") then support.stop(h, 30) end
    end
  end)

  describe("qtg.pacing buckets", function()
    local pacing = require("qtg.pacing")

    it("reads an adapter's declaration, and ignores what is not a limit", function()
      local a = { RATE_LIMITS = { observe = { per_second = 4, burst = 3 }, submit = { per_second = 0 },
                                  recover = "fast", shared = true, max_hold_seconds = 0.2 } }
      local l = pacing.limit_of(a, "observe")
      assert.equal(0.25, l.interval)
      assert.equal(0.5, l.tolerance)
      assert.is_true(l.shared)
      assert.equal(0.2, l.max_hold)
      assert.is_nil(pacing.limit_of(a, "submit"))
      assert.is_nil(pacing.limit_of(a, "recover"))
      assert.is_nil(pacing.limit_of({}, "observe"))
      assert.is_nil(pacing.limit_of({ RATE_LIMITS = { observe = { per_second = -1 } } }, "observe"))
      assert.is_nil(pacing.limit_of({ RATE_LIMITS = { observe = { per_second = 0 / 0 } } }, "observe"))
    end)

    it("refuses a declaration the workers could not use, naming the field", function()
      assert.is_true(pacing.check_declaration(nil))
      assert.is_true(pacing.check_declaration({ observe = { per_second = 2, burst = 5 }, shared = true }))
      local bad = {
        { "fast", "must be a table" },
        { { observe = "5/s" }, "RATE_LIMITS.observe must be a table" },
        { { observe = { per_second = "5" } }, "RATE_LIMITS.observe.per_second must be a number > 0" },
        { { observe = { per_second = 0 } }, "per_second must be a number > 0" },
        { { observe = { per_second = 1 / 0 } }, "per_second must be a number > 0" },
        { { submit = { per_second = 1, burst = 0.5 } }, "RATE_LIMITS.submit.burst must be a number >= 1" },
        { { submit = { per_second = 1, shared = "yes" } }, "RATE_LIMITS.submit.shared must be a boolean" },
        { { submit = { per_second = 1, per_minute = 3 } }, "unknown field per_minute" },
        { { sumbit = { per_second = 1 } }, "unknown field sumbit" },
        { { max_hold_seconds = -1 }, "max_hold_seconds must be >= 0" },
      }
      for _, case in ipairs(bad) do
        local ok, why = pacing.check_declaration(case[1])
        assert.is_nil(ok)
        assert.truthy(why:find(case[2], 1, true), why)
      end
    end)

    it("`qtgd check` fails an adapter whose RATE_LIMITS are malformed", function()
      local over = dir .. "/bad_limits"
      sim_override(over, '{ observe = { per_second = "10" } }')
      local rc, out = support.run({ MG_LUA_PATH = over, MG_CONSOLE_ENABLED = "false" }, { q(support.bin), "check" })
      assert.equal(1, rc, out)
      assert.matches("FAIL%s+policies%s+qtg%.executors%.sim: RATE_LIMITS%.observe%.per_second must be a number > 0", out)
    end)

    it("lets a burst through, then defers a call that would wait longer than the hold", function()
      pacing.reset()
      -- one call a minute, two at once: the third would wait about a minute
      local a = { RATE_LIMITS = { observe = { per_second = 1 / 60, burst = 2 } } }
      local name = "spec_local_" .. engine.uid()
      assert.is_true(pacing.take(name, a, "observe"))
      assert.is_true(pacing.take(name, a, "observe"))
      local go, wait = pacing.take(name, a, "observe")
      assert.is_false(go)
      assert.is_true(wait > 30 and wait <= 60, tostring(wait))
      -- another call of the same adapter has its own bucket
      assert.is_true(pacing.take(name, { RATE_LIMITS = a.RATE_LIMITS }, "submit"))
    end)

    it("shares a bucket through the database: a second session sees the first's calls", function()
      local a = { RATE_LIMITS = { recover = { per_second = 1 / 60, burst = 1, shared = true } } }
      local name = "spec_shared_" .. engine.uid()
      assert.is_true(pacing.take(name, a, "recover"))
      local go, wait = pacing.take(name, a, "recover")
      assert.is_false(go)
      assert.is_true(wait > 30 and wait <= 60, tostring(wait))
      qtg.db.with_session(function(s)
        local row = s:query("SELECT tat > now() + interval '30 seconds' AS ahead FROM provider_pacing WHERE bucket = $1",
          name .. ":recover")[1]
        assert.is_true(row.ahead)
      end)
    end)

    it("waits a short wait in place instead of deferring", function()
      local a = { RATE_LIMITS = { observe = { per_second = 20, burst = 1, max_hold_seconds = 5 } } }
      local name = "spec_hold_" .. engine.uid()
      for _ = 1, 5 do assert.is_true(pacing.take(name, a, "observe")) end
    end)
  end)

  it("a dispatcher over an executor's submit limit leaves the node READY and dispatches another executor's", function()
    local executors = require("qtg.executors")
    local pacing = require("qtg.pacing")
    local d = require("qtg.workers.node_dispatcher")
    local sim = require("qtg.executors.sim")
    -- a second provider: the sim's code under another name, not limited
    package.loaded["spec.pacing_sim_b"] = setmetatable({ RATE_LIMITS = false }, { __index = sim })
    executors.ADAPTERS.spec_sim_b = "spec.pacing_sim_b"
    local ok, err = pcall(function()
      qtg.db.with_session(function(s)
        engine.park_others(s)
        engine.load_doc(s, engine.doc("spec_pace_submit_a", {
          { "a", "action", "burn", { sim = { observes = 1 } } } }))
        local b = engine.doc("spec_pace_submit_b", { { "a", "action", "burn", { sim = { observes = 1 } } } })
        b.nodes[1].executor = "spec_sim_b"
        engine.load_doc(s, b)
        local a1 = approved(s, "spec_pace_submit_a", 1)[1]
        local a2 = approved(s, "spec_pace_submit_a", 1)[1]
        local b1 = approved(s, "spec_pace_submit_b", 1)[1]
        -- one submit a minute for the sim, in this process
        pacing.reset()
        sim.RATE_LIMITS = { submit = { per_second = 1 / 60, burst = 1 } }
        assert.equal(1, engine.tick("node_dispatcher"))
        assert.equal("SUBMITTED", engine.nodes(s, a1).a.node_state)
        -- a2 is first in FIFO order but its provider is spent: b1 goes instead
        assert.equal(1, engine.tick("node_dispatcher"))
        assert.equal("SUBMITTED", engine.nodes(s, b1).a.node_state)
        assert.equal(0, engine.tick("node_dispatcher"))
        local n = engine.nodes(s, a2).a
        assert.equal("READY", n.node_state)
        assert.equal(0, n.attempt_no)
        assert.equal(qtg.db.NULL, n.error_code)
        assert.is_true(pacing.stats().deferred >= 1)
        assert.truthy(d.paced_until.sim)
        -- once the limit allows again, a2 goes
        sim.RATE_LIMITS = nil
        for k in pairs(d.paced_until) do d.paced_until[k] = nil end
        assert.equal(1, engine.tick("node_dispatcher"))
        assert.equal("SUBMITTED", engine.nodes(s, a2).a.node_state)
      end)
    end)
    sim.RATE_LIMITS = nil
    for k in pairs(d.paced_until) do d.paced_until[k] = nil end
    executors.ADAPTERS.spec_sim_b = nil
    package.loaded["spec.pacing_sim_b"] = nil
    pacing.reset()
    assert(ok, err)
  end)

  it("an executor answering retry_after 0 is observed at most once per floor", function()
    local over = dir .. "/floor"
    sim_override(over, nil)
    local ids
    qtg.db.with_session(function(s)
      engine.park_others(s)
      engine.load_doc(s, engine.doc("spec_pace_floor", {
        { "a", "action", "burn", { sim = { observes = 4, retry_after_seconds = 0 } } },
      }))
      ids = approved(s, "spec_pace_floor", 3)
    end)
    local h = start_daemon({ MG_LUA_PATH = over, MG_NODE_OBSERVE_MIN_INTERVAL_SECONDS = "1" })
    qtg.db.with_session(function(s)
      assert.truthy(support.eventually(function() return all_completed(s, ids) end, 60),
        "not completed:\n" .. tostring(support.read(h.log)))
      local by_key = {}
      for _, c in ipairs(calls_of(s, ids)) do
        by_key[c.key] = by_key[c.key] or {}
        table.insert(by_key[c.key], c)
      end
      local keys = 0
      for key, list in pairs(by_key) do
        keys = keys + 1
        assert.equal("submit", list[1].call)
        assert.equal(5, #list, key)   -- one submit, four observes, nothing more
        for i = 2, #list do
          assert.equal("observe", list[i].call)
          assert.is_true(list[i].t - list[i - 1].t >= 1,
            ("%s: call %d came %.3f s after the one before"):format(key, i, list[i].t - list[i - 1].t))
        end
      end
      assert.equal(3, keys)
      for _, id in ipairs(ids) do
        assert.equal(4, engine.nodes(s, id).a.observe_count)
      end
    end)
  end)

  it("a rate-limited adapter under load from two processes stays within its limit", function()
    local RATE, BURST = 8, 2
    local over = dir .. "/limited"
    sim_override(over, ("{ observe = { per_second = %d, burst = %d }, submit = { per_second = %d, burst = %d },"
      .. " shared = true }"):format(RATE, BURST, RATE, BURST))
    local ids
    qtg.db.with_session(function(s)
      engine.park_others(s)
      engine.load_doc(s, engine.doc("spec_pace_load", {
        { "a", "action", "burn", { sim = { observes = 3, retry_after_seconds = 0 } } },
      }))
      ids = approved(s, "spec_pace_load", 24)
    end)
    -- the floor off: every node asks to be observed at once, all the time
    local env = { MG_LUA_PATH = over, MG_NODE_OBSERVE_MIN_INTERVAL_SECONDS = "0" }
    local h1, h2 = start_daemon(env), start_daemon(env)
    qtg.db.with_session(function(s)
      assert.truthy(support.eventually(function() return all_completed(s, ids) end, 120),
        "not completed:\n" .. tostring(support.read(h1.log)) .. tostring(support.read(h2.log)))
      -- nothing failed for pacing: every node completed at its first attempt
      local bad = s:query([[SELECT count(*)::int AS n FROM movement_request_nodes
                             WHERE request_id = ANY ($1::uuid[])
                               AND (node_state <> 'COMPLETED' OR attempt_no <> 1)]],
        "{" .. table.concat(ids, ",") .. "}")[1].n
      assert.equal(0, bad)
      local calls = calls_of(s, ids)
      for _, call in ipairs({ "submit", "observe" }) do
        local t, callers = {}, {}
        for _, c in ipairs(calls) do
          if c.call == call then
            t[#t + 1] = c.t
            callers[c.caller] = true
          end
        end
        assert.equal(call == "submit" and 24 or 72, #t)
        local n_callers = 0
        for _ in pairs(callers) do n_callers = n_callers + 1 end
        assert.equal(2, n_callers, call .. ": both processes called the provider")
        -- in any window of w seconds, at most burst + rate x w calls, give
        -- or take a quarter of a second between a call's slot and its
        -- arrival at the provider (without the limit the 72 observes come
        -- in well under a second)
        for _, w in ipairs({ 1, 2 }) do
          local max_in, j = 0, 1
          for i = 1, #t do
            while t[j] < t[i] - w do j = j + 1 end
            max_in = math.max(max_in, i - j + 1)
          end
          io.stderr:write(("pacing_spec: %s, at most %d calls in %d s\n"):format(call, max_in, w))
          assert.is_true(max_in <= BURST + RATE * (w + 0.25),
            ("%s: %d calls within %d s (limit %d/s, burst %d)"):format(call, max_in, w, RATE, BURST))
        end
      end
      local buckets = s:query([[SELECT bucket FROM provider_pacing WHERE bucket IN ('sim:submit', 'sim:observe')
                                 ORDER BY bucket]])
      assert.equal(2, #buckets)
    end)
  end)

  it("observes twelve due nodes of one request in one pass", function()
    qtg.db.with_session(function(s)
      engine.park_others(s)
      local nodes = {}
      for i = 1, 12 do
        nodes[i] = { ("n%02d"):format(i), "action", "burn", { sim = { observes = 2, retry_after_seconds = 0 } } }
      end
      engine.load_doc(s, engine.doc("spec_pace_twelve", nodes))
      local id = approved(s, "spec_pace_twelve", 1)[1]
      for _ = 1, 12 do assert.equal(1, engine.tick("node_dispatcher")) end
      assert.equal(10, qtg.settings.node_observe_batch_size)
      assert.equal(12, engine.tick("node_observer"))
      for key, n in pairs(engine.nodes(s, id)) do
        assert.equal(1, n.observe_count, key)
        assert.equal("OBSERVING", n.node_state, key)
      end
      assert.equal(12, engine.tick("node_observer"))
      assert.equal("COMPLETED", engine.request(s, id).request_state)
    end)
  end)

  it("keeps each observation under its own lock of node and request", function()
    qtg.db.with_session(function(s)
      engine.park_others(s)
      engine.load_doc(s, engine.doc("spec_pace_locked", {
        { "a", "action", "burn", { sim = { observes = 2, retry_after_seconds = 0 } } },
        { "b", "action", "burn", { sim = { observes = 2, retry_after_seconds = 0 } } },
      }))
      local id = approved(s, "spec_pace_locked", 1)[1]
      assert.equal(1, engine.tick("node_dispatcher"))
      assert.equal(1, engine.tick("node_dispatcher"))
      -- another session holds the request: the pass claims nothing of it
      local other = qtg.db.acquire()
      other:begin()
      other:query("SELECT 1 FROM movement_requests WHERE id = $1::uuid FOR UPDATE", id)
      local ok, n = pcall(engine.tick, "node_observer")
      other:rollback()
      other:release()
      assert.is_true(ok, tostring(n))
      assert.equal(0, n)
      for _, node in pairs(engine.nodes(s, id)) do assert.equal(0, node.observe_count) end
      assert.equal(2, engine.tick("node_observer"))
    end)
  end)

  describe("recovery's batch", function()
    local LANES = { ccip = "ccip_send", stargate = "stargate_send", cex = "withdrawal", other = "burn" }

    -- One UNKNOWN node per recovery arm; returns arm -> request id.
    local function unknown_per_arm(s)
      engine.park_others(s)
      local out = {}
      for arm, action in pairs(LANES) do
        local key = "spec_pace_rec_" .. arm
        engine.load_doc(s, engine.doc(key, {
          { "a", "action", action, { sim = { unknown = "submit", observes = 1 } } },
        }))
        out[arm] = approved(s, key, 1)[1]
      end
      for _ = 1, 4 do assert.equal(1, engine.tick("node_dispatcher")) end
      for arm, id in pairs(out) do assert.equal("UNKNOWN", engine.nodes(s, id).a.node_state, arm) end
      return out
    end

    local function recovery_pass(batch)
      local rc, out = support.run({ MG_NETWORK_CLASS = qtg.settings.network_class, MG_CONSOLE_ENABLED = "false",
                                    MG_NODE_RECOVERY_BATCH_SIZE = tostring(batch), MG_LOG_LEVEL = "error" },
        { q(support.bin), "exec", q(qtg.root .. "/spec/lua/engine/engine_tick.lua"), "node_recovery" })
      assert.equal(0, rc, out)
      return tonumber(out:match("(%d+)%s*$"))
    end

    it("caps the total: with 3 the first three arms take one node each and the last gets none", function()
      qtg.db.with_session(function(s)
        local ids = unknown_per_arm(s)
        assert.equal(3, recovery_pass(3))
        for _, arm in ipairs({ "ccip", "stargate", "cex" }) do
          assert.equal("SUBMITTED", engine.nodes(s, ids[arm]).a.node_state, arm)
        end
        assert.equal("UNKNOWN", engine.nodes(s, ids.other).a.node_state)
        -- a second pass with the same batch still starves the last arm
        assert.equal(0, recovery_pass(3))
        assert.equal("UNKNOWN", engine.nodes(s, ids.other).a.node_state)
        -- with 4, every arm takes one
        assert.equal(1, recovery_pass(4))
        assert.equal("SUBMITTED", engine.nodes(s, ids.other).a.node_state)
      end)
    end)

    it("splits as the spec says from 4 on", function()
      local r = require("qtg.workers.node_recovery")
      assert.same({ 1, 1, 1, 0 }, r.arm_sizes(3))
      assert.same({ 1, 0, 0, 0 }, r.arm_sizes(1))
      assert.same({ 1, 1, 1, 1 }, r.arm_sizes(4))
      assert.same({ 2, 2, 2, 2 }, r.arm_sizes(10))
      assert.same({ 4, 4, 4, 4 }, r.arm_sizes(16))
    end)

    it("`qtgd check` warns below 4, naming the arms that starve", function()
      local function check(batch)
        return support.run({ MG_NODE_RECOVERY_BATCH_SIZE = tostring(batch), MG_CONSOLE_ENABLED = "false" },
          { q(support.bin), "check" })
      end
      local rc, out = check(3)
      assert.equal(0, rc, out)    -- a warning, not a failure
      assert.matches("warn%s+settings%s+MG_NODE_RECOVERY_BATCH_SIZE=3 is below 4", out)
      assert.matches("later arms %(other%)", out)
      rc, out = check(2)
      assert.matches("later arms %(cex, other%)", out)
      rc, out = check(4)
      assert.equal(0, rc, out)
      assert.is_nil(out:find("MG_NODE_RECOVERY_BATCH_SIZE", 1, true), out)
    end)
  end)

  it("measures the approval TTL from created_at exactly", function()
    qtg.db.with_session(function(s)
      engine.load_doc(s, engine.doc("spec_pace_ttl", { { "a", "action", "burn", {} } }))
      local req = engine.create(s, "spec_pace_ttl", { callback_url = false })
      local row = s:query([[SELECT extract(epoch FROM expires_at - created_at)::float8 AS ttl
                              FROM movement_requests WHERE id = $1::uuid]], req.id)[1]
      assert.equal(qtg.settings.approval_ttl_seconds, row.ttl)
    end)
  end)

  it("`qtgd console -e 'tick(...)'` exits 0 when the pass worked and 1 when it failed", function()
    local sock = dir .. "/run/console.sock"
    os.execute("mkdir -p " .. q(dir .. "/run") .. " && chmod 700 " .. q(dir .. "/run"))
    local h = start_daemon({ MG_CONSOLE_ENABLED = "true", MG_CONSOLE_SOCKET = sock,
                             MG_EXPIRATION_CHECK_INTERVAL_SECONDS = "600" })
    local function console(code)
      return support.run({}, { q(support.bin), "console", "--socket", q(sock), "-e", q(code) })
    end
    assert.truthy(support.eventually(function() return console("return 1") == 0 end, 60, 0.1),
      "the console did not answer:\n" .. tostring(support.read(h.log)))
    local rc, out = console('tick("expiration_checker")')
    assert.equal(0, rc, out)
    assert.matches("expiration_checker: pass done", out, 1, true)
    -- a pass that raises
    rc, out = console('qtg.runtime.set_tick("expiration_checker", function() error("spec: boom", 0) end)')
    assert.equal(0, rc, out)
    rc, out = console('tick("expiration_checker")')
    assert.equal(1, rc, out)
    assert.matches("pass failed", out, 1, true)
    assert.matches("spec: boom", out, 1, true)
    -- a script stops at the failed tick
    rc, out = console('tick("expiration_checker"); print("went" .. "-on")')
    assert.equal(1, rc, out)
    assert.is_nil(out:find("went-on", 1, true), out)
    -- a pass that does not finish in the time asked
    rc, out = console('qtg.runtime.set_tick("expiration_checker", function() qtg.sleep(5) return 0 end)')
    assert.equal(0, rc, out)
    rc, out = console('tick("expiration_checker", 0.2)')
    assert.equal(1, rc, out)
    assert.matches("not finished", out, 1, true)
  end)
end)
