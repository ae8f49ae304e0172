-- api_db_share_spec: the API's requests hold at most their share of the
-- database pool (MG_API_DB_SESSIONS), against a running qtgd on 127.0.0.1:
--   * requests that each wait on the database (here: on a lock of
--     api_tokens the spec holds, so every token lookup waits) hold that
--     many sessions and no more, whatever their number and whether their
--     token is good or not, and the workers move a request to COMPLETED
--     meanwhile: without the share the requests took every session and
--     the workers waited behind them until the lock went (a flood of
--     unauthenticated requests, each a token lookup, did the same);
--   * a session of the share that breaks (its server process terminated)
--     gives its place to the next request waiting, so the share is never
--     used up by connections that are gone;
--   * /metrics shows the sessions each holds and the acquires waiting;
--   * an acquire of the share that is in use waits for it, and no
--     connection is opened for it: under a role the server allows two
--     connections, both taken, it was failed by the refused connect while
--     the pool had room, or connects were opened and refused one after
--     another until the share's session came back (api_db_share_child.lua).
local qtg = require "qtg"

local api, common, engine
local d, reader

local CHAIN = "spec_api_share_chain"

-- the requests' server processes waiting on the lock pid holds
local function waiting(pid)
  return common.query([[SELECT array_agg(pid ORDER BY pid)::text AS pids, count(*)::int AS n
                          FROM pg_stat_activity
                         WHERE application_name = 'qtgd' AND $1 = ANY(pg_blocking_pids(pid))]], pid)[1]
end

local function metric(body, name, holder)
  return tonumber(body:match(name .. '{holder="' .. holder .. '"} (%d+)'))
end

describe("the API's share of the database pool", function()
  setup(function()
    api = require "spec.lua.support.api"
    common = require "spec.lua.support.common"
    engine = require "spec.lua.support.engine"
    d = api.start({ MG_DB_POOL_SIZE = "4", MG_API_DB_SESSIONS = "2",
                    MG_NODE_DISPATCH_INTERVAL_SECONDS = "0.2", MG_NODE_OBSERVE_INTERVAL_SECONDS = "0.2" })
    reader = api.token("read")
    qtg.db.with_session(function(s)
      engine.load_doc(s, engine.doc(CHAIN, {
        { "a", "action", "withdrawal", { sim = { observes = 0, side_effect = true } } },
        { "b", "observe", "cex_withdrawal_status", { sim = { observes = 1, retry_after_seconds = 0 } } },
      }, { { "a", "b" } }))
    end)
  end)
  teardown(function()
    api.stop(d)
    require("spec.lua.support.host").stop_all()
  end)

  it("holds at most its share while its requests wait on the database, and the workers move nodes meanwhile",
    function()
      local locker = qtg.db.acquire()
      local pid = locker:query("SELECT pg_backend_pid() AS pid")[1].pid
      locker:begin()
      locker:query("LOCK TABLE api_tokens IN ACCESS EXCLUSIVE MODE")
      -- eight requests, half with a token nobody issued, half with a good one
      local tasks = {}
      for i = 1, 8 do
        local token = i % 2 == 0 and reader or ("qtg_nobody_issued_this_" .. i)
        tasks[i] = qtg.spawn(function()
          return api.call(d, "GET", "/v3/requests", { token = token, timeout = 60 }).status
        end)
      end
      common.wait_for(function()
        local w = waiting(pid)
        return w.n >= 2, w.n
      end, 20, "two requests to wait on the lock")
      local first = waiting(pid)
      -- the workers take a request to COMPLETED while those wait
      local req = qtg.db.with_session(function(s)
        return engine.create_approved(s, CHAIN, { network_class = d.class })
      end)
      common.wait_for(function()
        local st = common.query("SELECT request_state FROM movement_requests WHERE id = $1::uuid", req.id)[1]
        return st.request_state == "COMPLETED", st.request_state
      end, 30, "the request to complete while the API's requests wait")
      assert.equal(2, waiting(pid).n, "the API holds its share and no more")
      -- a session of the share that breaks gives its place to a waiting request
      common.query("SELECT pg_terminate_backend($1)", tonumber(first.pids:match("%d+")))
      common.wait_for(function()
        local w = waiting(pid)
        return w.n == 2 and w.pids ~= first.pids, w.pids
      end, 20, "another request to take the broken session's place")
      locker:rollback()
      locker:release()
      local statuses = {}
      for i, t in ipairs(tasks) do
        local ok, status = qtg.join(t)
        assert.is_true(ok, tostring(status))
        statuses[i] = status
      end
      -- the good tokens are served, the others refused; the terminated one's
      -- request answered as an outage
      local served, refused, outage = 0, 0, 0
      for i, st in ipairs(statuses) do
        if st == 503 then outage = outage + 1
        elseif i % 2 == 0 then assert.equal(200, st, "request " .. i) served = served + 1
        else assert.equal(401, st, "request " .. i) refused = refused + 1 end
      end
      assert.equal(1, outage, table.concat(statuses, ","))
      assert.equal(7, served + refused)
      -- /metrics: nothing held or waiting once they are answered
      local body = api.call(d, "GET", "/metrics", { token = reader }).body
      assert.equal(0, metric(body, "qtg_db_acquires_waiting", "api"), body)
      assert.equal(1, metric(body, "qtg_db_sessions_in_use", "api"), body) -- its own
    end)

  it("opens no connection for an acquire the share holds back: it waits for the share's session", function()
    local role = "spec_share_" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
    common.query("CREATE ROLE " .. role .. " LOGIN CONNECTION LIMIT 2")
    local url = common.database_url(common.query("SELECT current_database() AS d")[1].d)
      :gsub("^(%a[%w+.-]*://)[^@/]*@", "%1" .. role .. "@")
    local dir = require("spec.lua.support.host").tmpdir()
    local child = common.start_script(dir, "share", common.base_env({ MG_DATABASE_URL = url, MG_DB_POOL_SIZE = "4",
      MG_API_DB_SESSIONS = "1" }), "api/api_db_share_child.lua", {})
    local r = common.wait_result(child, 30)
    common.query("DROP ROLE " .. role)
    os.execute("rm -rf " .. common.quote(dir))
    assert.is_true(r.ok, r.error)
    assert.is_nil(r.err)
    assert.is_true(r.waited, "the acquire was answered before the share's session came back")
    assert.equal(2, r.max_open, "a connection was opened for the acquire the share held back")
    assert.equal(r.share_pid, r.got_pid, "it took the share's session back")
  end)

  it("refuses an acquire of a share that does not exist", function()
    local ok, err = pcall(qtg.db.acquire, "workers")
    assert.is_false(ok)
    assert.truthy(tostring(err):find("unknown share workers", 1, true), tostring(err))
  end)
end)
