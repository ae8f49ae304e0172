-- spec/lua/host/wakeups_spec.lua -- NOTIFY wake-ups and draining
-- (lua/qtg/wakeups.lua, sql/0030_wakeups.sql, docs/performance.md).
--
-- Real PostgreSQL, real `qtgd run` processes.  No timing is asserted: a
-- worker that should be woken has an interval of minutes, and the specs wait
-- (bounded, polling) for what only a wake-up can do in that time.
local qtg = require("qtg")
local common = require "spec.lua.support.common"

describe("wake-ups", function()
  local support, engine, wakeups, registry

  local TEMPLATE = "wake_spec_one"

  local function load_template(s)
    engine.load_doc(s, engine.doc(TEMPLATE, {
      { "a", "action", "evm_transfer", { sim = { observes = 1, retry_after_seconds = 0 } } },
    }))
  end

  -- Create a request and approve it; with `silent`, the approving transaction
  -- runs with triggers off (session_replication_role = replica), so it sends
  -- no NOTIFY: the lost-notification case.
  local function approved_request(s, silent)
    local requests = require("qtg.requests")
    local req = engine.create(s, TEMPLATE, { callback_url = false })
    s:begin()
    if silent then s:query("SET LOCAL session_replication_role = replica") end
    requests.approve(s, req.id, engine.ACTOR)
    s:commit()
    return req
  end

  local function node_state(s, req)
    return s:query("SELECT node_state FROM movement_request_nodes WHERE request_id = $1::uuid",
      req.id)[1].node_state
  end

  local function listeners(s)
    return s:query([[SELECT pid FROM pg_stat_activity
                      WHERE application_name = 'qtgd' AND query LIKE 'LISTEN %qtg_wake%']])
  end

  -- A `qtgd run` of this network class with the given intervals; returns
  -- once its wake-up listener is up and its first passes are over.
  local function start_daemon(s, env)
    local base = {
      MG_NETWORK_CLASS = qtg.settings.network_class,
      MG_LOG_LEVEL = "warn",
      MG_EXPIRATION_CHECK_INTERVAL_SECONDS = "600",
      MG_EXECUTOR_HEALTH_INTERVAL_SECONDS = "600",
    }
    for k, v in pairs(env) do base[k] = v end
    local before = {}
    for _, l in ipairs(listeners(s)) do before[l.pid] = true end
    local h = support.start(support.base_env(base), { "run" })
    if base.MG_WAKEUPS_ENABLED ~= "false" then
      -- the listener of this daemon: the one LISTEN session that is new
      h.listener = support.eventually(function()
        for _, l in ipairs(listeners(s)) do
          if not before[l.pid] then return l.pid end
        end
      end, 20)
      assert.truthy(h.listener,
        "the daemon's wake-up listener did not come up:\n" .. tostring(support.read(h.log)))
    end
    -- its start-up passes (first ticks run at once) are over well before this
    qtg.sleep(1)
    return h
  end

  setup(function()
    support = dofile(qtg.root .. "/spec/lua/support/host.lua")
    engine = dofile(qtg.root .. "/spec/lua/support/engine.lua")
    wakeups = require("qtg.wakeups")
    registry = require("qtg.workers")
    qtg.db.with_session(function(s)
      load_template(s)
    end)
  end)

  before_each(function()
    qtg.db.with_session(engine.park_others)
  end)

  after_each(function()
    support.stop_all()
  end)

  it("parses payloads: a worker, optionally with the seconds until due", function()
    assert.same({ "node_dispatcher", 0 }, { wakeups.parse("node_dispatcher") })
    assert.same({ "node_observer", 4.5 }, { wakeups.parse("node_observer:4.5") })
    assert.is_nil(wakeups.parse("node_observer:soon"))
    assert.is_nil(wakeups.parse("; DROP TABLE x"))
    assert.is_nil(wakeups.parse(nil))
  end)

  it("is a policy switch: on, the covered workers drain and are woken; off, neither; both poll at the spec's intervals", function()
    local on = setmetatable({ workers_enabled = true, wakeups_enabled = true },
      { __index = qtg.settings })
    local off = setmetatable({ workers_enabled = true, wakeups_enabled = false },
      { __index = qtg.settings })
    local function by_name(list)
      local t = {}
      for _, w in ipairs(list) do t[w.name] = w end
      return t
    end
    local a, b = by_name(registry.registry(on)), by_name(registry.registry(off))
    assert.is_true(a.node_dispatcher.drain)
    assert.is_true(a.node_dispatcher.wake)
    for name, w in pairs(a) do
      assert.equal(w.spec_interval, w.interval, name .. " polls at the spec's interval with wake-ups on")
    end
    assert.equal(on.node_dispatch_interval_seconds, a.node_dispatcher.interval)
    assert.equal(on.callback_dispatch_interval_seconds, a.callback_dispatcher.interval)
    assert.is_false(b.node_dispatcher.drain)
    assert.is_false(b.node_dispatcher.wake)
    for name, w in pairs(b) do
      assert.equal(w.spec_interval, w.interval, name .. " keeps the spec's interval with wake-ups off")
    end
    assert.is_false(a.node_recovery.drain) -- not covered: plain polling
    assert.same({ node_dispatcher = true, node_observer = true, callback_dispatcher = true,
                  audit_outbox_promoter = true }, wakeups.wakeable(on))
  end)

  -- notified(fn) -> the qtg_wake payloads of what fn(s) commits, in order,
  -- and for each whether it was raised here (this process's own committed
  -- transaction, handed over by the host: sql/0150) or came as a NOTIFY:
  -- a handler in this process (the handler path of qtgd run), and sentinel
  -- NOTIFYs before and after fn, so what earlier transactions sent on has
  -- arrived before it starts, and every payload of fn's transactions has
  -- arrived when the last sentinel has (commit order).
  local function notified(fn)
    local got, here, ok, err = {}, {}, nil, nil
    qtg.db.listen("qtg_wake", function(payload, _, raised_here)
      if payload == nil then return end -- the listener's catch-up call after a reconnect
      got[#got + 1] = payload
      here[#got] = raised_here == true
    end)
    local function sentinel(word)
      qtg.db.with_session(function(s) s:query("SELECT pg_notify('qtg_wake', $1)", word) end)
      assert.truthy(support.eventually(function() return got[#got] == word end, 10),
        "the sentinel did not arrive: " .. table.concat(got, " | "))
    end
    ok, err = pcall(function()
      assert.truthy(support.eventually(function()
        return qtg.db.with_session(function(s) return #s:query([[
          SELECT 1 FROM pg_stat_activity WHERE query LIKE 'LISTEN %qtg_wake%'
             AND pid <> pg_backend_pid()]]) > 0 end)
      end, 10))
      sentinel("spec_start")
      for i = #got, 1, -1 do got[i], here[i] = nil, nil end
      qtg.db.with_session(fn)
      sentinel("spec_sentinel")
    end)
    qtg.db.unlisten("qtg_wake")
    if not ok then error(err, 0) end
    local last = #got
    got[last], here[last] = nil, nil
    return got, here
  end

  local function token_set(payload)
    local set = {}
    for _, t in ipairs(wakeups.tokens(payload)) do
      assert.is_nil(set[t], "token " .. t .. " twice in " .. payload)
      set[t] = true
    end
    return set
  end

  it("reads a payload as tokens; a malformed token is left out, the rest kept", function()
    assert.same({ "node_dispatcher", "node_observer:4.5", "callback_dispatcher" },
      wakeups.tokens("node_dispatcher node_observer:4.5  callback_dispatcher"))
    assert.same({}, wakeups.tokens(""))
    assert.same({}, wakeups.tokens(nil))
    local named = {}
    for _, t in ipairs(wakeups.tokens("node_dispatcher ;DROP node_observer:soon audit_outbox_promoter")) do
      local name = wakeups.parse(t)
      if name then named[#named + 1] = name end
    end
    assert.same({ "node_dispatcher", "audit_outbox_promoter" }, named)
  end)

  it("a transaction sends one NOTIFY naming every worker it woke: READY node, callback, audit rows", function()
    local req
    local got = notified(function(s)
      req = engine.create(s, TEMPLATE, { callback_url = "http://127.0.0.1:9/callback" })
    end)
    -- the approval: a node READY, a callback queued, audit rows, one transaction
    -- (this process has not started wake-ups: its sessions NOTIFY)
    local here
    got, here = notified(function(s) require("qtg.requests").approve(s, req.id, engine.ACTOR) end)
    assert.equal(1, #got, "payloads: " .. table.concat(got, " | "))
    assert.is_false(here[1], "a process without wake-ups NOTIFYs")
    assert.same({ node_dispatcher = true, callback_dispatcher = true, audit_outbox_promoter = true },
      token_set(got[1]))
    -- a node due in 30 s: its token carries the delay
    got = notified(function(s)
      s:query([[UPDATE movement_request_nodes SET node_state = 'SUBMITTED',
                       next_observe_at = clock_timestamp() + interval '30 seconds'
                 WHERE request_id = $1::uuid]], req.id)
    end)
    assert.equal(1, #got, "payloads: " .. table.concat(got, " | "))
    local name, delay = wakeups.parse(got[1])
    assert.equal("node_observer", name)
    assert.is_true(delay > 29 and delay <= 30.1, got[1])
  end)

  -- after_commit(fn): fn with this process's sessions handing their
  -- wake-ups to it after their commits, as a process that started wake-ups
  -- (qtg.wakeups.start) does; the sessions opened before are replaced.
  local function after_commit(fn)
    qtg.db.after_commit(true)
    local ok, err = pcall(fn)
    qtg.db.after_commit(false)
    if not ok then error(err, 0) end
  end

  local function notify_setting()
    return qtg.db.with_session(function(s)
      return s:query("SELECT coalesce(current_setting('qtg.notify', true), '') AS v")[1].v
    end)
  end

  it("switched on, a qtgd session's transaction NOTIFYs nothing: its wake-up comes to qtgd once it has committed, and not when it fails", function()
    local req
    notified(function(s) req = engine.create(s, TEMPLATE, { callback_url = false }) end)
    assert.equal("", notify_setting())
    after_commit(function()
      -- the sessions opened from now on carry the option that tells the triggers
      assert.equal("after_commit", notify_setting())
      local got, here = notified(function(s) require("qtg.requests").approve(s, req.id, engine.ACTOR) end)
      assert.equal(1, #got, "payloads: " .. table.concat(got, " | "))
      assert.is_true(here[1], "a qtgd session's wake-up comes to qtgd after its commit, not as a NOTIFY")
      assert.same({ node_dispatcher = true, audit_outbox_promoter = true }, token_set(got[1]))
      -- a pipeline transaction's (the workers' kind)
      got, here = notified(function(s)
        s:begin_pipeline()
        s:query([[UPDATE movement_request_nodes SET node_state = 'SUBMITTED', next_observe_at = now()
                   WHERE request_id = $1::uuid]], req.id)
        s:commit()
      end)
      assert.equal(1, #got, "payloads: " .. table.concat(got, " | "))
      assert.equal("node_observer", (wakeups.parse(got[1])))
      assert.same({ true }, here)
      -- raised (the deferred trigger run early), then the transaction fails,
      -- or is rolled back, or its pipeline fails: nothing is handed on
      local function submitted(s)
        s:query([[UPDATE movement_request_nodes SET node_state = 'SUBMITTED', next_observe_at = now()
                   WHERE request_id = $1::uuid]], req.id)
        s:exec("SET CONSTRAINTS ALL IMMEDIATE")
      end
      local endings = {
        failed = function(s)
          s:begin()
          submitted(s)
          assert.is_false(pcall(s.query, s, "SELECT 1 / 0"))
          s:rollback()
        end,
        rolled_back = function(s)
          s:begin()
          submitted(s)
          s:rollback()
        end,
        pipeline_failed = function(s)
          s:begin_pipeline()
          submitted(s)
          assert.is_false(pcall(s.query, s, "SELECT 1 / $1::int", "0"))
          s:rollback()
        end,
      }
      local handed_on = {}
      for name, ending in pairs(endings) do
        got = notified(ending)
        if #got > 0 then handed_on[#handed_on + 1] = name .. ": " .. table.concat(got, " | ") end
      end
      table.sort(handed_on)
      assert.same({}, handed_on)
      -- the control: the same transaction committed hands it on
      got = notified(function(s)
        s:begin()
        submitted(s)
        s:commit()
      end)
      assert.equal(1, #got)
      assert.equal("node_observer", (wakeups.parse(got[1])))
    end)
    -- switched off again: the sessions that carried the option are gone
    assert.equal("", notify_setting())
  end)

  it("switched on, a commit with statements sent ahead hands its wake-up on; the transaction ahead's comes with its end", function()
    local req
    notified(function(s) req = engine.create(s, TEMPLATE, { callback_url = false }) end)
    after_commit(function()
      notified(function(s) require("qtg.requests").approve(s, req.id, engine.ACTOR) end)
      local SUBMIT = [[UPDATE movement_request_nodes SET node_state = 'SUBMITTED', next_observe_at = now()
                        WHERE request_id = $1::uuid]]
      local function with_ahead(end_ahead)
        return function(s)
          s:begin_pipeline()
          s:query(SUBMIT, req.id) -- prepared on this connection, rolled back: no wake-up
          s:rollback()
          s:begin_pipeline()
          s:send_ahead({ SUBMIT, req.id })
          s:commit_batch({ SUBMIT, req.id })
          assert.truthy(s:take_ahead(), "the statement ahead was not sent")
          end_ahead(s)
        end
      end
      local got, here = notified(with_ahead(function(s) s:commit() end))
      assert.equal(2, #got, "payloads: " .. table.concat(got, " | "))
      for i = 1, 2 do
        assert.equal("node_observer", (wakeups.parse(got[i])))
        assert.is_true(here[i])
      end
      got = notified(with_ahead(function(s) s:rollback() end))
      assert.equal(1, #got, "payloads: " .. table.concat(got, " | "))
    end)
  end)

  it("switched on, a malformed after-commit NOTICE is dropped, and at most 16 are kept per transaction", function()
    after_commit(function()
      local got, here = notified(function(s)
        s:query([[DO $$ BEGIN
            RAISE NOTICE 'qtg_after_commit qtg_wake';       -- no space after the channel
            RAISE NOTICE 'qtg_after_commit  node_observer'; -- an empty channel
            FOR i IN 1..20 LOOP
              RAISE NOTICE 'qtg_after_commit qtg_wake spec_%', i;
            END LOOP;
          END $$]])
      end)
      assert.equal(16, #got, "payloads: " .. table.concat(got, " | "))
      for i = 1, 16 do
        assert.equal("spec_" .. i, got[i])
        assert.is_true(here[i])
      end
    end)
  end)

  it("switched on, another session (psql, a tool) NOTIFYs as before", function()
    local req
    notified(function(s) req = engine.create(s, TEMPLATE, { callback_url = false }) end)
    after_commit(function()
      local got, here = notified(function(s)
        s:exec("SET qtg.notify = ''")
        local ok, err = pcall(s.query, s, [[UPDATE movement_request_nodes SET node_state = 'READY'
                                             WHERE request_id = $1::uuid]], req.id)
        s:exec("RESET qtg.notify")
        assert(ok, err)
      end)
      assert.same({ "node_dispatcher" }, got)
      assert.same({ false }, here)
    end)
  end)

  it("a wake-up raised here for workers that do not run here is sent on as one NOTIFY", function()
    -- this process runs none of them (as `qtgd run` with MG_WORKERS_ENABLED=false)
    wakeups.start(setmetatable({ workers_enabled = false, wakeups_enabled = true }, { __index = qtg.settings }))
    local got, here = notified(function()
      wakeups.on_notify("node_dispatcher callback_dispatcher:2.5 not%a%worker", "qtg_wake", true)
    end)
    assert.same({ "node_dispatcher callback_dispatcher:2.5" }, got)
    assert.same({ false }, here)
    assert.equal(1, wakeups.stats().sent_on)
  end)

  it("a rolled-back savepoint takes its wake-ups with it", function()
    local req
    notified(function(s) req = engine.create(s, TEMPLATE, { callback_url = false }) end)
    local got = notified(function(s)
      s:begin()
      s:savepoint("undone")
      s:query([[UPDATE movement_request_nodes SET node_state = 'READY'
                 WHERE request_id = $1::uuid]], req.id)
      s:rollback_to("undone")
      s:query([[INSERT INTO audit_outbox (actor, action, entity_type, entity_id)
                VALUES ('system:spec', 'spec.wake', 'request', $1)]], req.id)
      s:commit()
    end)
    assert.same({ "audit_outbox_promoter" }, got)
    -- and a transaction that wakes no one sends nothing
    got = notified(function(s)
      s:query("UPDATE movement_requests SET updated_at = updated_at WHERE id = $1::uuid", req.id)
    end)
    assert.same({}, got)
  end)

  it("a manual node becoming READY does not wake the dispatcher, which never claims it", function()
    qtg.db.with_session(function(s)
      engine.load_doc(s, engine.doc("wake_spec_manual", {
        { "m", "manual", "manual_confirmation", { required_inputs = { "desk_reference" } } },
      }))
    end)
    local req
    notified(function(s)
      req = engine.create(s, "wake_spec_manual", { callback_url = "http://127.0.0.1:9/callback" })
    end)
    local got = notified(function(s) require("qtg.requests").approve(s, req.id, engine.ACTOR) end)
    assert.equal(1, #got, "payloads: " .. table.concat(got, " | "))
    local set = token_set(got[1])
    assert.is_nil(set.node_dispatcher, got[1])
    assert.is_true(set.callback_dispatcher, got[1])
    qtg.db.with_session(function(s)
      assert.equal("READY", node_state(s, req))
    end)
  end)

  it("a payload stays under PostgreSQL's 8000 bytes, and always names the workers woken now", function()
    local req = qtg.db.with_session(function(s) return approved_request(s, true) end)
    assert.truthy(req.id:match("^[%x%-]+$"))
    local got = notified(function(s)
      s:begin()
      -- 2,000 distinct due times for the observer, then a row for the promoter
      s:query(([[DO $$ BEGIN
          FOR i IN 1..2000 LOOP
            UPDATE movement_request_nodes SET node_state = 'SUBMITTED',
                   next_observe_at = clock_timestamp() + i * interval '1 second'
             WHERE request_id = '%s'::uuid;
          END LOOP;
        END $$]]):format(req.id))
      s:query([[INSERT INTO audit_outbox (actor, action, entity_type, entity_id)
                VALUES ('system:spec', 'spec.wake', 'request', $1)]], req.id)
      s:commit()
    end)
    assert.equal(1, #got, "payloads: " .. table.concat(got, " | "):sub(1, 300))
    assert.is_true(#got[1] < 8000, #got[1] .. " bytes")
    local set, observers = token_set(got[1]), 0
    for t in pairs(set) do
      if wakeups.parse(t) == "node_observer" then observers = observers + 1 end
    end
    assert.is_true(set.audit_outbox_promoter, "the token without a delay was left out")
    assert.is_true(observers > 100 and observers < 2000, observers .. " observer tokens")
  end)

  it("a NOTIFY wakes a sleeping dispatcher long before its interval", function()
    qtg.db.with_session(function(s)
      -- interval 300 s (the fallback polling): only the wake-up can dispatch in time
      start_daemon(s, { MG_NODE_DISPATCH_INTERVAL_SECONDS = "300",
                        MG_NODE_OBSERVE_INTERVAL_SECONDS = "300" })
      local req = approved_request(s, false)
      assert.truthy(support.eventually(function() return node_state(s, req) ~= "READY" end, 20),
        "the READY node was not dispatched after its NOTIFY")
      -- and the observer was woken at the node's due time the same way
      assert.truthy(support.eventually(function()
        return engine.request(s, req.id).request_state == "COMPLETED"
      end, 20), "the SUBMITTED node was not observed after its NOTIFY")
    end)
  end)

  it("without wake-ups (the control), the same dispatcher leaves the node READY", function()
    qtg.db.with_session(function(s)
      start_daemon(s, { MG_WAKEUPS_ENABLED = "false", MG_NODE_DISPATCH_INTERVAL_SECONDS = "300" })
      local req = approved_request(s, false)
      qtg.sleep(2)
      assert.equal("READY", node_state(s, req))
    end)
  end)

  it("a lost notification is covered by the fallback polling", function()
    qtg.db.with_session(function(s)
      -- interval 0.2 s: fallback polling at that interval; the approval sends no NOTIFY
      start_daemon(s, { MG_NODE_DISPATCH_INTERVAL_SECONDS = "0.2" })
      local req = approved_request(s, true)
      assert.truthy(support.eventually(function() return node_state(s, req) ~= "READY" end, 20),
        "polling did not pick up the silently readied node")
    end)
  end)

  it("a dropped listener is re-established and followed by one catch-up pass", function()
    qtg.db.with_session(function(s)
      local h = start_daemon(s, { MG_NODE_DISPATCH_INTERVAL_SECONDS = "300",
                                  MG_LOG_LEVEL = "info" })
      local old = h.listener
      assert.is_true(s:query("SELECT pg_terminate_backend($1) AS ok", old)[1].ok)
      -- readied with no NOTIFY while the listener is away: only the
      -- catch-up pass (or a poll in 300 s) can dispatch it
      local req = approved_request(s, true)
      assert.truthy(support.eventually(function() return node_state(s, req) ~= "READY" end, 20),
        "no catch-up pass after the listener came back:\n" .. tostring(support.read(h.log)))
      local again = support.eventually(function()
        for _, l in ipairs(listeners(s)) do
          if l.pid ~= old and s:query("SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND backend_start > now() - interval '1 minute'", l.pid)[1] then
            return true
          end
        end
      end, 10)
      assert.truthy(again, "the listener was not re-established")
      assert.truthy(support.read(h.log):find("catch-up pass", 1, true))
    end)
  end)

  it("a reload (SIGHUP) keeps the listener's state: a NOTIFY still wakes, and is counted", function()
    qtg.db.with_session(function(s)
      local dir = support.tmpdir()
      local sock = dir .. "/console.sock"
      local h = start_daemon(s, { MG_NODE_DISPATCH_INTERVAL_SECONDS = "300",
                                  MG_NODE_OBSERVE_INTERVAL_SECONDS = "300", MG_LOG_LEVEL = "info",
                                  MG_CONSOLE_ENABLED = "true", MG_CONSOLE_SOCKET = sock })
      local function notifies()
        local rc, out = support.run({}, { common.quote(support.bin), "console", "--socket",
          common.quote(sock), "-e", common.quote("return require('qtg.wakeups').stats().notifies") })
        assert.equals(0, rc, out)
        return tonumber(out:match("(%d+)%s*$"))
      end
      support.signal(h, "HUP")
      assert.truthy(support.eventually(function()
        return (support.read(h.log) or ""):find("policy reloaded", 1, true)
      end, 20), "no reload in the log:\n" .. tostring(support.read(h.log)))
      local before = notifies()
      local req = approved_request(s, false)
      assert.truthy(support.eventually(function() return node_state(s, req) ~= "READY" end, 20),
        "the READY node was not dispatched after its NOTIFY")
      -- the module the console sees after the reload is the listener's own
      assert.is_true(notifies() > before)
      os.execute("rm -rf " .. common.quote(dir))
    end)
  end)

  it("draining runs the dispatcher again at once, still one node per pass", function()
    local on = setmetatable({ workers_enabled = true, wakeups_enabled = true },
      { __index = qtg.settings })
    local row
    for _, w in ipairs(registry.registry(on)) do if w.name == "node_dispatcher" then row = w end end
    assert.is_true(row.drain)
    local reqs = {}
    qtg.db.with_session(function(s)
      for i = 1, 5 do reqs[i] = approved_request(s, true) end
    end)
    local function ready_count()
      return qtg.db.with_session(function(s)
        return s:query([[SELECT count(*)::int AS n FROM movement_request_nodes n
                           JOIN movement_requests r ON r.id = n.request_id
                          WHERE r.network_class = $1 AND n.node_state = 'READY']],
          qtg.settings.network_class)[1].n
      end)
    end
    local dispatcher = require("qtg.workers.node_dispatcher")
    local passes = {}
    -- interval 300 s: without draining, one node per 300 s
    qtg.runtime.start_worker{
      name = "spec_drain_dispatcher", group = "sidecar", interval = 300, jitter = 0,
      drain = row.drain,
      tick = function(s)
        local before = ready_count()
        local n = dispatcher.tick(s, 1)
        passes[#passes + 1] = { count = n, moved = before - ready_count() }
        return n
      end,
    }
    local ok, err = pcall(function()
      assert.truthy(support.eventually(function() return ready_count() == 0 end, 20),
        "draining did not dispatch the 5 nodes")
      assert.truthy(support.eventually(function() return #passes >= 6 end, 5))
    end)
    qtg.runtime.stop_worker("spec_drain_dispatcher")
    if not ok then error(err, 0) end
    local ones = 0
    for i, p in ipairs(passes) do
      assert.is_true(p.count <= 1, "pass " .. i .. " returned " .. p.count)
      assert.is_true(p.moved <= 1, "pass " .. i .. " moved " .. p.moved .. " nodes")
      if p.count == 1 then ones = ones + 1 end
    end
    assert.equal(5, ones)
    -- the pass after the last node found nothing: the worker went to sleep
    assert.equal(0, passes[#passes].count)
  end)
end)
