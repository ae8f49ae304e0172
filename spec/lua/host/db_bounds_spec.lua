-- db_bounds_spec: no statement and no lock wait holds a pooled session for
-- good (src/qtg_pg.c, QTG_PG_BOUNDS_OPTIONS).
--   * MG_DB_LOCK_TIMEOUT_SECONDS: a statement waiting on a row another
--     session holds (an operator's open transaction) fails with 55P03, and
--     its transaction rolls back, letting go of what it locked before;
--   * MG_DB_STATEMENT_TIMEOUT_SECONDS: a statement still running fails
--     with 57014;
--   * 0 switches either off; migrations and `qtgd audit` lift them;
--   * an interrupted task's session is shut down at once (qtg_pg_forget),
--     and its server process, which checks its client every second while
--     a statement runs, ends the statement and its transaction.  Played
--     through the API: a cancel waiting on a request row the spec holds
--     runs past MG_API_REQUEST_TIMEOUT_SECONDS and is answered 503; on the
--     tree before, its server process kept waiting (and kept its locks)
--     for as long as the spec held the row.
local qtg = require "qtg"

local common, support, api

-- The child's script: lock and statement bounds as the child's settings
-- make them (MG_DB_LOCK_TIMEOUT_SECONDS=1, MG_DB_STATEMENT_TIMEOUT_SECONDS=2).
local CHILD = [[
local qtg = require("qtg")
local db = qtg.db
local tbl = assert(os.getenv("BOUNDS_TABLE"))
local function outcome(fn)
  local t0 = qtg.monotonic()
  local ok, err = pcall(fn)
  return ok, type(err) == "table" and (err.sqlstate or err.kind) or tostring(err),
         string.format("%.1f", qtg.monotonic() - t0)
end
print("settings", db.with_session(function(s)
  local r = s:query("SELECT current_setting('lock_timeout') AS l, current_setting('statement_timeout') AS st")[1]
  return r.l, r.st
end))
-- the operator's open transaction holds row 1
local holder = db.acquire()
holder:begin()
holder:query("SELECT n FROM " .. tbl .. " WHERE id = 1 FOR UPDATE")
-- a worker-like transaction: row 2 first, then row 1
local s = db.acquire()
print("lock", outcome(function()
  s:begin()
  s:query("UPDATE " .. tbl .. " SET n = n + 1 WHERE id = 2")
  s:query("UPDATE " .. tbl .. " SET n = n + 1 WHERE id = 1")
end))
pcall(s.rollback, s)
s:release()
-- row 2 was let go of and not changed
print("row2", db.with_session(function(k)
  return k:query("SELECT n FROM " .. tbl .. " WHERE id = 2 FOR UPDATE NOWAIT")[1].n
end))
holder:rollback()
holder:release()
print("statement", outcome(function()
  db.with_session(function(k) k:query("SELECT pg_sleep(10)") end)
end))
print("then", db.with_session(function(k) return k:query("SELECT 41 + 1 AS x")[1].x end))
]]

local function run_child(dir, tbl, env)
  support.write(dir .. "/bounds.lua", CHILD)
  local e = support.base_env(env)
  e.BOUNDS_TABLE = tbl
  return support.run(e, { "timeout", "60", support.bin, "exec", dir .. "/bounds.lua" })
end

describe("database session bounds", function()
  local tbl
  setup(function()
    common = require "spec.lua.support.common"
    support = require "spec.lua.support.host"
    api = require "spec.lua.support.api"
    tbl = common.scratch_table("bounds", 2)
  end)
  teardown(function()
    common.query("DROP TABLE IF EXISTS " .. tbl)
    support.stop_all()
  end)

  it("ends a lock wait after MG_DB_LOCK_TIMEOUT_SECONDS and a statement after MG_DB_STATEMENT_TIMEOUT_SECONDS", function()
    local dir = support.tmpdir()
    local rc, out = run_child(dir, tbl, { MG_DB_LOCK_TIMEOUT_SECONDS = "1", MG_DB_STATEMENT_TIMEOUT_SECONDS = "2" })
    os.execute("rm -rf " .. common.quote(dir))
    assert.equals(0, rc, out)
    assert.is_nil(out:find("Sanitizer", 1, true), out)
    assert.matches("settings\t1s\t2s", out, 1, true)
    local l_ok, l_state, l_took = out:match("lock\t(%a+)\t(%w+)\t([%d.]+)")
    assert.equals("false", l_ok, out)
    assert.equals("55P03", l_state, out)
    assert.is_true(tonumber(l_took) >= 0.9 and tonumber(l_took) < 10, out)
    assert.matches("row2\t0", out, 1, true)
    local s_ok, s_state, s_took = out:match("statement\t(%a+)\t(%w+)\t([%d.]+)")
    assert.equals("false", s_ok, out)
    assert.equals("57014", s_state, out)
    assert.is_true(tonumber(s_took) >= 1.9 and tonumber(s_took) < 10, out)
    assert.matches("then\t42", out, 1, true)
  end)

  it("has the defaults 60 s and 300 s, and 0 switches a bound off", function()
    local dir = support.tmpdir()
    support.write(dir .. "/show.lua", [[
local db = require("qtg").db
print("settings", db.with_session(function(s)
  local r = s:query("SELECT current_setting('lock_timeout') AS l, current_setting('statement_timeout') AS st, "
                 .. "current_setting('client_connection_check_interval') AS c")[1]
  return r.l, r.st, r.c
end))
]])
    local env = support.base_env()
    env.MG_DB_LOCK_TIMEOUT_SECONDS, env.MG_DB_STATEMENT_TIMEOUT_SECONDS = nil, nil
    local rc, out = support.run(env, { support.bin, "exec", dir .. "/show.lua" })
    assert.equals(0, rc, out)
    assert.matches("settings\t1min\t5min\t1s", out, 1, true)
    env.MG_DB_LOCK_TIMEOUT_SECONDS, env.MG_DB_STATEMENT_TIMEOUT_SECONDS = "0", "0"
    rc, out = support.run(env, { support.bin, "exec", dir .. "/show.lua" })
    assert.equals(0, rc, out)
    assert.matches("settings\t0\t0\t1s", out, 1, true)
    -- a value below a millisecond is a millisecond, not "no bound": a
    -- statement of 50 ms is cancelled (the settings' own read may finish
    -- within the millisecond)
    support.write(dir .. "/sleep.lua", [[
print("slept", require("qtg").db.with_session(function(s) return s:query("SELECT pg_sleep(0.05) AS x")[1].x end))
]])
    env.MG_DB_STATEMENT_TIMEOUT_SECONDS = "0.0001"
    rc, out = support.run(env, { support.bin, "exec", dir .. "/sleep.lua" })
    assert.equals(1, rc, out)
    assert.matches("canceling statement due to statement timeout", out, 1, true)
    -- refused outright: a negative bound
    env.MG_DB_STATEMENT_TIMEOUT_SECONDS = "-1"
    rc, out = support.run(env, { support.bin, "exec", dir .. "/show.lua" })
    assert.is_not.equals(0, rc, out)
    assert.matches("MG_DB_STATEMENT_TIMEOUT_SECONDS", out, 1, true)
    os.execute("rm -rf " .. common.quote(dir))
  end)

  it("ends the statement of an interrupted API request on the server, letting go of its locks", function()
    local d = api.start({ MG_API_REQUEST_TIMEOUT_SECONDS = "1", MG_DB_LOCK_TIMEOUT_SECONDS = "0",
                          MG_WORKERS_ENABLED = "false" })
    local operator = api.token("read,operate")
    local r = api.call(d, "POST", "/v3/requests", { token = operator, key = common.uid("k", 6),
      json = { template_key = "otc_settlement_manual", intent = api.OTC_INTENT } })
    assert.equal(201, r.status, r.body)
    local id = r.json.id
    -- the spec's open transaction holds the request's row
    local holder = qtg.db.acquire()
    holder:begin()
    holder:query("SELECT id FROM movement_requests WHERE id = $1 FOR UPDATE", id)
    local me = holder:pid()
    local ok, err = pcall(function()
      r = api.call(d, "POST", "/v3/requests/" .. id .. "/cancel",
        { token = operator, json = { reason = "bounds" }, key = common.uid("k", 6) })
      assert.equal(503, r.status, r.body)
      assert.equal("timeout", r.json.kind)
      -- the server process that waited on the row goes within a few seconds,
      -- while the spec still holds it
      local gone = common.poll(function() return common.waiting_on(me) == 0 end, 8)
      assert.is_truthy(gone, "the interrupted request's server process still waits on the spec's lock")
    end)
    holder:rollback()
    holder:release()
    assert(ok, err)
    -- logged as what it is, a request stopped at its deadline, at warn: not
    -- as a handler's failure "interrupted by the operator" (a review,
    -- session 38: no operator did anything)
    local log = common.wait_log(d.h, '[^\n]*"msg":"api request interrupted at its deadline or at shutdown"[^\n]*', 5,
      "the interrupted request's log line")
    assert.truthy(log:find('"level":"warn"', 1, true), log)
    assert.truthy(log:find('"route":"/v3/requests/{id}/cancel"', 1, true), log)
    local text = require("spec.lua.support.host").read(d.h.log) or ""
    assert.is_nil(text:find("api handler failed", 1, true), text)
    assert.is_nil(text:find("by the operator", 1, true), text)
    -- the request was not cancelled by the interrupted call, and can be now
    assert.equal("PENDING_APPROVAL",
      common.query("SELECT request_state FROM movement_requests WHERE id = $1", id)[1].request_state)
    r = api.call(d, "POST", "/v3/requests/" .. id .. "/cancel",
      { token = operator, json = { reason = "bounds" }, key = common.uid("k", 6) })
    assert.equal(200, r.status, r.body)
    api.stop(d)
  end)
end)
