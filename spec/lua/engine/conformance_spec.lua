-- spec/lua/engine/conformance_spec.lua -- each switch of docs/conformance.md gives
-- the spec's behaviour back.  The switches' other halves (the behaviour
-- with the switch on) are shown in wakeups_spec and pacing_spec.
local qtg = require("qtg")

-- A copy of this process's settings with some changed.
local function settings_with(changes)
  local out = {}
  for _, row in ipairs(qtg.settings_list()) do
    local key = row.name:gsub("^MG_", ""):lower()
    local ok, v = pcall(function() return qtg.settings[key] end)
    if ok then out[key] = v end
  end
  for k, v in pairs(changes) do out[k] = v end
  return out
end

describe("conformance switches", function()
  local engine

  setup(function()
    engine = dofile(qtg.root .. "/spec/lua/support/engine.lua")
  end)

  describe("MG_WAKEUPS_ENABLED=false", function()
    it("gives the runtime the spec's loop: no draining, no wake-ups, the setting's interval", function()
      local registry = require("qtg.workers")
      local on = registry.registry(settings_with({ workers_enabled = true, wakeups_enabled = true }))
      local off = registry.registry(settings_with({ workers_enabled = true, wakeups_enabled = false }))
      local drains_on = 0
      for i, w in ipairs(off) do
        assert.is_false(w.drain, w.name)
        assert.is_false(w.wake, w.name)
        assert.equal(w.spec_interval, w.interval, w.name)
        if on[i].drain then drains_on = drains_on + 1 end
      end
      assert.equal(2, drains_on)   -- the control: on, the node dispatcher and observer drain
      -- and nothing is woken: the listener is started only with the switch on
      local wakeups = require("qtg.wakeups")
      assert.same({}, wakeups.wakeable(settings_with({ workers_enabled = true, wakeups_enabled = false })))
    end)

    it("makes a dispatcher tick one pass, one node, as the spec's; on, a tick drains up to 8", function()
      local dispatcher = require("qtg.workers.node_dispatcher")
      local off = dispatcher.passes(settings_with({ wakeups_enabled = false }))
      local on = dispatcher.passes(settings_with({ wakeups_enabled = true }))
      assert.equal(1, off)
      assert.equal(8, on)
      qtg.db.with_session(function(s)
        engine.park_others(s)
        engine.load_doc(s, engine.doc("spec_conf_passes", { { "a", "action", "withdrawal", { sim = { observes = 0 } } } }))
        local ids = {}
        for i = 1, 4 do ids[i] = engine.create_approved(s, "spec_conf_passes", { callback_url = false }).id end
        local function ready()
          local n = 0
          for _, id in ipairs(ids) do if engine.nodes(s, id).a.node_state == "READY" then n = n + 1 end end
          return n
        end
        assert.equal(1, engine.tick("node_dispatcher", off))
        assert.equal(3, ready())
        assert.equal(3, engine.tick("node_dispatcher", on)) -- the control
        assert.equal(0, ready())
      end)
    end)
  end)

  describe("MG_NODE_OBSERVE_MIN_INTERVAL_SECONDS=0", function()
    it("lets a retry hint of 0 make the node due at once, as in the spec", function()
      assert.equal(0, qtg.settings.node_observe_min_interval_seconds)
      qtg.db.with_session(function(s)
        engine.park_others(s)
        engine.load_doc(s, engine.doc("spec_conf_floor", {
          { "a", "action", "burn", { sim = { observes = 3, retry_after_seconds = 0 } } } }))
        local req = engine.create_approved(s, "spec_conf_floor", { callback_url = false })
        assert.equal(1, engine.tick("node_dispatcher"))
        assert.equal(1, engine.tick("node_observer"))
        local a = engine.nodes(s, req.id).a
        assert.equal("OBSERVING", a.node_state)
        assert.is_true(s:query("SELECT next_observe_at <= now() AS due FROM movement_request_nodes WHERE id = $1::uuid",
          a.id)[1].due)
        -- the next pass observes it again
        assert.equal(1, engine.tick("node_observer"))
        assert.equal(2, engine.nodes(s, req.id).a.observe_count)
        local intervals = require("qtg.observe_intervals")
        assert.equal(0, intervals.delay("burn", 0))
        assert.equal(600, intervals.delay("burn", 601))
      end)
    end)
  end)

  describe("an adapter without RATE_LIMITS", function()
    it("is never paced: its calls neither wait nor are put back", function()
      local pacing = require("qtg.pacing")
      local sim = require("qtg.executors.sim")
      assert.is_nil(sim.RATE_LIMITS)
      assert.is_nil(require("qtg.executors.manual").RATE_LIMITS)
      local before = pacing.stats()
      for _ = 1, 1000 do
        for _, call in ipairs({ "submit", "observe", "recover" }) do
          assert.is_true(pacing.take("sim", sim, call))
        end
      end
      assert.same(before, pacing.stats())
    end)
  end)
end)
