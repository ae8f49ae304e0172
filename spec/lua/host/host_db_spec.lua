-- The qtg.db binding against a real PostgreSQL: typed values, errors,
-- concurrency on the pool, savepoints and locks, SKIP LOCKED, LISTEN, and a
-- server restart under a running host.
local qtg = require("qtg")
local common = require "spec.lua.support.common"
local db = qtg.db
local support = require("spec.lua.support.host")

describe("qtg.db", function()
  it("returns typed values and the NULL sentinel", function()
    local rows = support.query([[SELECT 1::int AS i, 9007199254740993::bigint AS big, 2.50::numeric AS num,
      true AS b, '{"k":[1,2,null]}'::jsonb AS j, NULL::text AS n, 'x' AS s,
      timestamptz '2026-01-02 03:04:05.5+00' AS t, $1::jsonb AS param]], {a = 1})
    local r = rows[1]
    assert.are.equal(1, r.i)
    assert.are.equal("9007199254740993", r.big) -- beyond 2^53 stays exact as text
    assert.are.equal("2.50", r.num)
    assert.is_true(r.b)
    assert.are.equal(2, r.j.k[2])
    assert.are.equal(db.NULL, r.j.k[3])
    assert.are.equal(db.NULL, r.n)
    assert.are.equal("x", r.s)
    assert.are.equal("2026-01-02T03:04:05.5Z", r.t)
    assert.are.equal(1, r.param.a)
  end)

  it("nests the columns after a *name column in row.name, each typed", function()
    local rows = support.query([[SELECT 1::int AS id, 'a' AS label, NULL AS "*inner", 2::int AS id,
      timestamptz '2026-01-02 03:04:05+00' AS at, '{"k":1}'::jsonb AS j, NULL::text AS gone,
      NULL AS "*second", true AS b, NULL AS "*", 3 AS after
      FROM generate_series(1, 2)]])
    assert.are.equal(2, #rows)
    for _, r in ipairs(rows) do
      assert.are.equal(1, r.id)
      assert.are.equal("a", r.label)
      assert.are.equal(2, r.inner.id)
      assert.are.equal("2026-01-02T03:04:05Z", r.inner.at)
      assert.are.equal(1, r.inner.j.k)
      assert.are.equal(db.NULL, r.inner.gone)
      assert.is_nil(r.inner.b) -- the next marker closes the first nested row
      assert.is_true(r.second.b)
      -- a column named "*" alone is an ordinary column of the current row
      assert.are.equal(db.NULL, r.second["*"])
      assert.are.equal(3, r.second.after)
      assert.is_nil(r.after)
    end
    assert.are_not.equal(rows[1].inner, rows[2].inner) -- one table per row
  end)

  it("raises SQL errors as structured values and the session stays usable", function()
    local s = db.acquire()
    local ok, err = pcall(s.query, s, "SELEC 1")
    assert.is_false(ok)
    assert.are.equal("sql", err.kind)
    assert.are.equal("42601", err.sqlstate)
    assert.matches("syntax error", tostring(err))
    assert.are.equal(3, s:query("SELECT 3 AS v")[1].v)
    local ok2, err2 = pcall(s.query, s, "SELECT $1::int", "not a number")
    assert.is_false(ok2)
    assert.are.equal("22P02", err2.sqlstate)
    s:release()
  end)

  it("keeps at most 256 prepared statements per connection, least recently used out", function()
    local s = db.acquire()
    local function n_prepared()
      return s:query("SELECT count(*)::int AS n FROM pg_prepared_statements")[1].n
    end
    local hot = "SELECT $1::int + 0 AS v"
    assert.are.equal(7, s:query(hot, 7)[1].v)
    for i = 1, 600 do
      assert.are.equal(i, s:query("SELECT $1::int AS v, " .. i .. " AS distinct_text", i)[1].v)
      if i % 50 == 0 then assert.are.equal(i, s:query(hot, i)[1].v) end -- stays recent
    end
    local n = n_prepared()
    assert.is_true(n <= 256 + 1, "prepared statements on the server: " .. n)
    assert.is_true(n >= 200, "the cache still works: " .. n)
    -- the recently used one was kept, an evicted one is prepared again
    local before = n_prepared()
    assert.are.equal(8, s:query(hot, 8)[1].v)
    assert.are.equal(before, n_prepared())
    assert.are.equal(1, s:query("SELECT $1::int AS v, 1 AS distinct_text", 1)[1].v)
    -- in an aborted transaction the error is the caller's, and the session recovers
    s:begin()
    pcall(s.query, s, "SELEC 1")
    local ok, err = pcall(s.query, s, "SELECT $1::int AS v, 'fresh' AS distinct_text", 1)
    assert.is_false(ok)
    assert.are.equal("25P02", err.sqlstate)
    s:rollback()
    assert.are.equal(2, s:query("SELECT $1::int AS v, 'fresh' AS distinct_text", 2)[1].v)
    assert.is_true(n_prepared() <= 256 + 1)
    s:release()
  end)

  it("refuses unusable parameters before sending anything", function()
    local s = db.acquire()
    assert.has_error(function() s:query("SELECT $1", function() end) end)
    assert.has_error(function() s:query("SELECT $1::float8", 0 / 0) end)
    assert.are.equal(1, s:query("SELECT 1 AS v")[1].v)
    s:release()
  end)

  it("s:transaction commits and returns fn's results, or rolls back and raises fn's error", function()
    local s = db.acquire()
    s:query("CREATE TEMP TABLE spec_tx (v int)")
    local a, b = s:transaction(function(x)
      s:query("INSERT INTO spec_tx VALUES ($1)", x)
      return "done", x
    end, 7)
    assert.same({ "done", 7 }, { a, b })
    local ok, err = pcall(s.transaction, s, function()
      s:query("INSERT INTO spec_tx VALUES (8)")
      error({ kind = "spec", message = "changed my mind" })
    end)
    assert.is_false(ok)
    assert.same({ kind = "spec", message = "changed my mind" }, err)
    assert.is_false(s:in_transaction())
    -- a failing statement inside: rolled back too, and the session works on
    ok = pcall(s.transaction, s, function() s:query("INSERT INTO spec_tx VALUES ('x')") end)
    assert.is_false(ok)
    local rows = s:query("SELECT v FROM spec_tx ORDER BY v")
    assert.equal(1, #rows)
    assert.equal(7, rows[1].v)
    s:release()
  end)

  it("writes numbers in table parameters exactly or refuses them, never rounded", function()
    local s = db.acquire()
    -- what 14 significant digits keep goes through as it is
    local row = s:query([[SELECT ($1::jsonb)->>'a' AS a, ($1::jsonb)->'n'->>0 AS n0,
                                 ($1::jsonb)->'n'->>1 AS n1]],
      { a = 0.25, n = { 1e20, 12345678901234 } })[1]
    assert.equal("0.25", row.a)
    assert.equal(1e20, tonumber(row.n0))
    assert.equal("12345678901234", row.n1)
    -- money with more digits than that, at any depth, is refused with a clear error
    for _, v in ipairs({ { amount = 123456789.123456 }, { legs = { { wei = 2 ^ 53 + 2 } } },
                         { 1 / 3 } }) do
      local ok, err = pcall(s.query, s, "SELECT $1::jsonb AS j", v)
      assert.is_false(ok)
      assert.matches("parameter $1 holds the number .* would round: pass it as a string", tostring(err))
    end
    -- a table that nests too deep, or contains itself, is refused quickly
    local deep = {}
    local t = deep
    for _ = 1, 70 do t.next = {}; t = t.next end
    local cyclic = {}
    cyclic[1] = cyclic
    cyclic[2] = cyclic
    for _, v in ipairs({ deep, cyclic }) do
      local ok, err = pcall(s.query, s, "SELECT $1::jsonb AS j", v)
      assert.is_false(ok)
      assert.matches("parameter $1 nests deeper than 64 levels", tostring(err), 1, true)
    end
    -- the session is still usable, and the same values as strings are exact
    local j = s:query("SELECT ($1::jsonb)->>'amount' AS v", { amount = "123456789.123456" })[1].v
    assert.equal("123456789.123456", j)
    s:release()
  end)

  it("gives 200 concurrent tasks their own results on a pool of 8", function()
    local handles = {}
    for i = 1, 200 do
      handles[i] = qtg.spawn(function(n)
        local s = db.acquire()
        local r = s:query("SELECT $1::int * 3 AS v, pg_backend_pid() AS pid FROM pg_sleep(0.002)", n)
        s:release()
        return r[1].v, r[1].pid
      end, i)
    end
    local pids, wrong = {}, 0
    for i = 1, 200 do
      local ok, v, pid = qtg.join(handles[i])
      if not ok or v ~= i * 3 then wrong = wrong + 1 end
      pids[pid or 0] = true
    end
    local distinct = 0
    for _ in pairs(pids) do distinct = distinct + 1 end
    assert.are.equal(0, wrong)
    assert.is_true(distinct <= 8, "at most 8 connections, saw " .. distinct)
    assert.are.equal(8, db.stats().size)
    assert.is_true(db.stats().open <= 8)
  end)

  it("a savepoint rollback releases the locks taken inside it and keeps the outer ones", function()
    support.query("DROP TABLE IF EXISTS spec_locks")
    support.query("CREATE TABLE spec_locks (id int PRIMARY KEY)")
    support.query("INSERT INTO spec_locks VALUES (1), (2)")
    local s = db.acquire()
    s:begin()
    s:query("SELECT * FROM spec_locks WHERE id = 1 FOR UPDATE")
    s:savepoint("inner")
    s:query("SELECT * FROM spec_locks WHERE id = 2 FOR UPDATE")
    local function locked(id)
      local o = db.acquire()
      o:begin()
      local r = o:query("SELECT id FROM spec_locks WHERE id = $1 FOR UPDATE SKIP LOCKED", id)
      o:rollback()
      o:release()
      return #r == 0
    end
    local function tuple_locks()
      return #s:query([[SELECT 1 FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'transactionid']])
    end
    assert.is_true(locked(1))
    assert.is_true(locked(2))
    local before = tuple_locks()
    s:rollback_to("inner")
    assert.is_true(locked(1), "outer lock kept")
    assert.is_false(locked(2), "inner lock released")
    assert.is_true(tuple_locks() < before, "the subtransaction's lock entry is gone from pg_locks")
    s:rollback()
    s:release()
  end)

  it("FOR UPDATE SKIP LOCKED between two sessions never hands out a row twice", function()
    support.query("DROP TABLE IF EXISTS spec_jobs")
    support.query("CREATE TABLE spec_jobs (id int PRIMARY KEY)")
    support.query("INSERT INTO spec_jobs SELECT g FROM generate_series(1, 10) g")
    local a, b = db.acquire(), db.acquire()
    a:begin()
    b:begin()
    local ra = a:query("SELECT id FROM spec_jobs ORDER BY id LIMIT 3 FOR UPDATE SKIP LOCKED")
    local rb = b:query("SELECT id FROM spec_jobs ORDER BY id LIMIT 3 FOR UPDATE SKIP LOCKED")
    assert.are.same({1, 2, 3}, {ra[1].id, ra[2].id, ra[3].id})
    assert.are.same({4, 5, 6}, {rb[1].id, rb[2].id, rb[3].id})
    a:rollback()
    b:rollback()
    a:release()
    b:release()
  end)

  it("claim.one skips a candidate whose request is locked and keeps no lock on it", function()
    support.query("DROP TABLE IF EXISTS spec_cn")
    support.query("DROP TABLE IF EXISTS spec_cr")
    support.query("CREATE TABLE spec_cr (id int PRIMARY KEY, created_at int)")
    support.query("CREATE TABLE spec_cn (id int PRIMARY KEY, req int REFERENCES spec_cr, state text)")
    support.query("INSERT INTO spec_cr VALUES (1, 1), (2, 2)")
    support.query("INSERT INTO spec_cn VALUES (10, 1, 'READY'), (20, 2, 'READY')")
    local holder = db.acquire()
    holder:begin()
    holder:query("SELECT * FROM spec_cr WHERE id = 1 FOR UPDATE")
    local s = db.acquire()
    s:begin()
    local row = db.claim.one(s, {
      candidates_sql = [[SELECT n.id FROM spec_cn n JOIN spec_cr r ON r.id = n.req
        WHERE n.state = $2 AND NOT (n.id::text = ANY($1::text[])) ORDER BY r.created_at LIMIT 1]],
      claim_sql = [[SELECT n.* FROM spec_cn n JOIN spec_cr r ON r.id = n.req
        WHERE n.id = $1::int AND n.state = $2 FOR UPDATE OF n, r SKIP LOCKED]],
      args = {"READY"},
    })
    assert.are.equal(20, row.id)
    -- node 10 was partially locked during the miss; the savepoint rollback freed it
    local probe = db.acquire()
    probe:begin()
    assert.are.equal(1, #probe:query("SELECT id FROM spec_cn WHERE id = 10 FOR UPDATE NOWAIT"))
    probe:rollback()
    probe:release()
    -- the hit stays locked in s's transaction
    assert.is_nil(db.claim.try(holder, "SELECT * FROM spec_cn WHERE id = $1::int FOR UPDATE SKIP LOCKED", 20))
    s:rollback()
    holder:rollback()
    s:release()
    holder:release()
  end)

  it("claim needs an open transaction and reports SQL errors", function()
    local s = db.acquire()
    assert.has_error(function() db.claim.try(s, "SELECT 1 WHERE $1::int = 1", 1) end)
    s:begin()
    local ok, err = pcall(db.claim.try, s, "SELECT * FROM no_such_table WHERE id = $1", 1)
    assert.is_false(ok)
    assert.are.equal("42P01", err.sqlstate)
    s:rollback()
    s:begin()
    -- a parameter the host cannot send is refused before anything is sent,
    -- named by its number in the statement, and the transaction goes on
    ok, err = pcall(db.claim.try, s, "SELECT $1::int AS id WHERE $2::text IS NOT NULL", 1, "a\0b")
    assert.is_false(ok)
    assert.matches("parameter $2 contains a NUL byte", tostring(err), 1, true)
    ok, err = pcall(db.claim.one, s, { candidates_sql = "SELECT 1 AS id WHERE $2::jsonb IS NOT NULL",
                                       claim_sql = "SELECT $1::int AS id", args = { { 1 / 3 } } })
    assert.is_false(ok)
    assert.matches("parameter $2 holds the number", tostring(err), 1, true)
    ok, err = pcall(db.claim.try, s, "SELECT $1::int AS id", nil)
    assert.is_false(ok)
    assert.matches("the id must not be nil", tostring(err), 1, true)
    assert.are.equal(1, db.claim.try(s, "SELECT $1::int AS id", 1).id)
    s:rollback()
    s:release()
  end)

  it("leaks no registry references or tasks across queries, spawns and errors", function()
    local function settle()
      collectgarbage()
      collectgarbage()
      return qtg.refs()
    end
    local before = settle()
    for round = 1, 3 do
      local hs = {}
      for i = 1, 50 do
        hs[i] = qtg.spawn(function(n)
          local s = db.acquire()
          local r = s:query("SELECT $1::int AS v", n)
          pcall(s.query, s, "SELEC broken")
          s:release()
          if n % 7 == 0 then error("planned") end
          return r[1].v
        end, i + round)
      end
      for i = 1, 50 do qtg.join(hs[i]) end
    end
    local after = settle()
    assert.are.equal(before.tasks, after.tasks)
    assert.are.equal(before.refs, after.refs)
  end)

  -- A session's connection lost while its task waited elsewhere (here a
  -- sleep; a restart, pg_terminate_backend, a timeout in production): the
  -- claim's first statement cannot be sent.  It was answered as from a
  -- completion, resuming the running task: the daemon crashed (139).  In
  -- a child, so a regression fails this case, not the whole run.
  it("answers a claim on a session whose connection was lost with a connection error", function()
    local dir = support.tmpdir()
    support.write(dir .. "/lost.lua", [[
local qtg = require("qtg")
local db = qtg.db
local claims = {
  try = function(s) return db.claim.try(s, "SELECT $1::int AS id", 1) end,
  one = function(s) return db.claim.one(s, { candidates_sql = "SELECT 1 AS id WHERE NOT (1 = ANY($1::int[]))",
                                             claim_sql = "SELECT $1::int AS id" }) end,
}
for _, which in ipairs({ "try", "one" }) do
  local s = db.acquire()
  s:begin()
  local pid = s:query("SELECT pg_backend_pid() AS pid")[1].pid
  db.with_session(function(k) k:query("SELECT pg_terminate_backend($1)", pid) end)
  qtg.sleep(0.5)   -- the loop reads the server's goodbye and marks the connection lost
  local ok, err = pcall(claims[which], s)
  print(which, ok, type(err) == "table" and err.kind or tostring(err),
        type(err) == "table" and err.message or "")
  s:release()
end
print("then", db.with_session(function(k) return k:query("SELECT 41 + 1 AS x")[1].x end))
]])
    local rc, out = support.run(support.base_env(), { support.bin, "exec", dir .. "/lost.lua" })
    os.execute("rm -rf " .. common.quote(dir))
    assert.equals(0, rc, out)
    assert.is_nil(out:find("Sanitizer", 1, true), out)
    assert.matches("try\tfalse\tconnection\tconnection to PostgreSQL lost", out, 1, true)
    assert.matches("one\tfalse\tconnection\tconnection to PostgreSQL lost", out, 1, true)
    assert.matches("then\t42", out, 1, true)
  end)

  -- Tasks that each hold a session and wait for another (a tick's nested
  -- acquire: the sim's ledger, shared pacing, the nonce reservations) took
  -- the whole pool and waited for good, the loop turning on, so no
  -- watchdog saw it.  MG_DB_ACQUIRE_TIMEOUT_SECONDS ends such a wait.
  it("gives up an acquire after MG_DB_ACQUIRE_TIMEOUT_SECONDS, so tasks holding the pool do not wait for good", function()
    local dir = support.tmpdir()
    support.write(dir .. "/nested.lua", [[
local qtg = require("qtg")
local db = qtg.db
local function nested(name)
  return qtg.spawn(function()
    local s = db.acquire()
    qtg.sleep(0.2)              -- both hold their session now
    local t0 = qtg.monotonic()
    local ok, err = pcall(db.acquire)
    s:release()
    print(name, ok, type(err) == "table" and err.kind or tostring(err),
          type(err) == "table" and err.message or "", string.format("%.1f", qtg.monotonic() - t0))
  end)
end
local a, b = nested("a"), nested("b")
qtg.join(a)
qtg.join(b)
print("then", db.with_session(function(k) return k:query("SELECT 41 + 1 AS x")[1].x end))
]])
    local rc, out = support.run(support.base_env({ MG_DB_POOL_SIZE = "2", MG_DB_ACQUIRE_TIMEOUT_SECONDS = "1" }),
      { "timeout", "60", support.bin, "exec", dir .. "/nested.lua" })   -- 124: still waiting
    os.execute("rm -rf " .. common.quote(dir))
    assert.equals(0, rc, out)
    -- the first to wait gives up and lets its session go; the other then
    -- gets it, and both go on
    local a = out:match("\n?(a\t[^\n]*)")
    assert.truthy(a, out)
    assert.matches("a\tfalse\ttimeout\tno database session within 1 s (MG_DB_ACQUIRE_TIMEOUT_SECONDS; "
      .. "a pool of 2: all in use, or none could be opened)", a, 1, true)
    local took = tonumber(a:match("\t([%d.]+)$"))
    assert.truthy(took >= 0.9 and took < 10, a)
    assert.truthy(out:find("\nb\ttrue\t", 1, true) or out:find("^b\ttrue\t"), out)
    assert.matches("then\t42", out, 1, true)
  end)

  it("frees a query and a claim still waiting on the server when the host closes", function()
    -- `qtgd exec` ends while two tasks wait on PostgreSQL: their sessions
    -- are collected by lua_close with a command in flight.  Under the
    -- sanitizer build (tools/test's second pass) a leaked request is an
    -- error report here.
    local dir = support.tmpdir()
    support.write(dir .. "/inflight.lua", [[
local qtg = require("qtg")
qtg.spawn(function()
  local s = qtg.db.acquire()
  s:query("SELECT pg_sleep(3)")
end)
qtg.spawn(function()
  local s = qtg.db.acquire()
  s:begin()
  qtg.db.claim.one(s, { candidates_sql = "SELECT '1' AS id, pg_sleep(3) WHERE NOT ('1' = ANY($1::text[]))",
                        claim_sql = "SELECT $1 AS id" })
end)
qtg.sleep(0.3)
print("main done, " .. qtg.db.stats().in_use .. " sessions busy")
]])
    local rc, out = support.run(support.base_env(), { support.bin, "exec", dir .. "/inflight.lua" })
    os.execute("rm -rf " .. common.quote(dir))
    assert.is_nil(out:find("Sanitizer", 1, true), out)
    assert.matches("main done, 2 sessions busy", out, 1, true)
    assert.equals(0, rc, out)
  end)

  -- A session let go of by another task while a task waited on its
  -- statement: its connection was destroyed and the waiting task never
  -- resumed (it, and whatever it held, stayed for good).  Now the waiter is
  -- interrupted first.  In a child, so a regression (a hang) fails this
  -- case through the timeout.
  it("interrupts a task waiting on a session that another task releases or discards", function()
    local dir = support.tmpdir()
    support.write(dir .. "/released.lua", [[
local qtg = require("qtg")
local db = qtg.db
local function kind(err) return type(err) == "table" and err.kind or tostring(err) end
local waits = {
  query = function(s) s:query("SELECT pg_sleep(20)") end,
  claim = function(s)
    s:begin()
    db.claim.one(s, { candidates_sql = "SELECT '1' AS id, pg_sleep(20) WHERE NOT ('1' = ANY($1::text[]))",
                      claim_sql = "SELECT $1 AS id" })
  end,
  -- the waiter lets the session go itself when its wait is interrupted
  query_then_release = function(s)
    local ok, err = pcall(s.query, s, "SELECT pg_sleep(20)")
    s:release()
    if not ok then error(err, 0) end
  end,
}
for _, case in ipairs({ { "query", "release" }, { "claim", "release" }, { "query", "discard" },
                        { "query_then_release", "release" } }) do
  local which, how = case[1], case[2]
  local s = db.acquire()
  local pid = s:pid()
  local line
  local h = qtg.spawn(function()
    local t0 = qtg.monotonic()
    local ok, err = pcall(waits[which], s)
    line = string.format("%s %s: %s %s %.1f", which, how, tostring(ok), kind(err), qtg.monotonic() - t0)
  end)
  qtg.sleep(0.3)
  s[how](s)
  qtg.join(h)
  local gone = false
  for _ = 1, 50 do
    gone = db.with_session(function(k)
      return k:query("SELECT count(*) AS n FROM pg_stat_activity WHERE pid = $1", pid)[1].n == 0
    end)
    if gone then break end
    qtg.sleep(0.1)
  end
  print(line, "server process gone: " .. tostring(gone), "in use: " .. db.stats().in_use)
end
print("then", db.with_session(function(k) return k:query("SELECT 41 + 1 AS x")[1].x end))
]])
    local rc, out = support.run(support.base_env(), { "timeout", "60", support.bin, "exec", dir .. "/released.lua" })
    os.execute("rm -rf " .. common.quote(dir))
    assert.equals(0, rc, out)
    assert.is_nil(out:find("Sanitizer", 1, true), out)
    for _, case in ipairs({ "query release", "claim release", "query discard", "query_then_release release" }) do
      local line = out:match(case:gsub("%p", "%%%0") .. ": [^\n]*")
      assert.truthy(line, out)
      local took = tonumber(line:match("interrupted ([%d.]+)"))
      assert.truthy(line:find(": false interrupted ", 1, true) and took and took < 5, line)
      assert.matches("server process gone: true\tin use: 0", line, 1, true)
    end
    assert.matches("then\t42", out, 1, true)
  end)

  -- lua_close collects a session still held: its release handed the
  -- connection to a task waiting to acquire one, which then ran its Lua in
  -- the state being torn down.
  it("runs no task while the host closes, though a collected session could serve a waiting acquire", function()
    local dir = support.tmpdir()
    support.write(dir .. "/close.lua", [[
local qtg = require("qtg")
qtg.spawn(function()
  local s = qtg.db.acquire()
  s:query("SELECT 1")
  qtg.sleep(30)                 -- holds the pool's one session while the host closes
end)
qtg.spawn(function()
  local s = qtg.db.acquire()    -- waits for that session
  print("the waiter ran during the close")
  s:query("SELECT 1")
end)
qtg.sleep(0.3)
print("main done, waiting: " .. qtg.db.stats().waiting)
]])
    local rc, out = support.run(support.base_env({ MG_DB_POOL_SIZE = "1" }),
      { "timeout", "60", support.bin, "exec", dir .. "/close.lua" })
    os.execute("rm -rf " .. common.quote(dir))
    assert.equals(0, rc, out)
    assert.is_nil(out:find("Sanitizer", 1, true), out)
    assert.matches("main done, waiting: 1", out, 1, true)
    assert.is_nil(out:find("the waiter ran", 1, true), out)
  end)

  it("LISTEN delivers a NOTIFY to a Lua callback", function()
    local got = {}
    db.listen("spec_channel", function(payload, channel)
      got[#got + 1] = {payload = payload, channel = channel}
    end)
    local ok = support.eventually(function()
      support.query("SELECT pg_notify('spec_channel', 'hello')")
      return #got > 0 and got[#got].payload == "hello"
    end, 10, 0.1)
    db.unlisten("spec_channel")
    assert.is_truthy(ok)
    assert.are.equal("spec_channel", got[1].channel)
  end)

  -- listen_blocked(channel, payloads) -> the payloads delivered for a NOTIFY
  -- of each, every one its own transaction, sent by psql while this
  -- process's loop is blocked (a blocking os.execute): they reach the
  -- listener together.  The listening backend sends a committed
  -- notification when its signal is served, which can be after psql has
  -- exited, so the loop stays blocked a second longer: every notification
  -- is in the socket before the loop reads it.
  local function listen_blocked(channel, payloads)
    local got = {}
    db.listen(channel, function(payload) got[#got + 1] = payload end)
    assert.is_truthy(support.eventually(function()
      support.query("SELECT pg_notify($1, 'probe')", channel)
      return #got > 0
    end, 10, 0.1))
    qtg.sleep(0.3)
    local from = #got
    local psql = "psql -qX " .. common.quote(os.getenv("MG_DATABASE_URL"))
    for _, payload in ipairs(payloads) do
      psql = psql .. " -c " .. common.quote("NOTIFY " .. channel .. ", '" .. payload .. "'")
    end
    local ok = os.execute(psql .. " && sleep 1")
    qtg.sleep(0.3)
    db.unlisten(channel)
    assert.is_truthy(ok == 0 or ok == true, "psql failed")
    local after = {}
    for i = from + 1, #got do
      if got[i] ~= "probe" then after[#after + 1] = got[i] end -- a late probe
    end
    return after
  end

  it("notifications read together are delivered once per channel and payload, in arrival order", function()
    assert.same({ "a", "b" }, listen_blocked("spec_fold", { "a", "b", "a", "a", "b" }))
  end)

  it("more distinct notifications read together than the fold holds are all delivered, in order", function()
    local payloads = {}
    for i = 1, 45 do payloads[i] = "p" .. i end
    assert.same(payloads, listen_blocked("spec_fold_many", payloads))
  end)

  it("survives a server restart: in-flight calls fail clearly, later calls succeed", function()
    local pgdir = os.getenv("QTG_PG_DIR")
    assert.is_truthy(pgdir, "QTG_PG_DIR names the throwaway cluster")
    local notified = {}
    db.listen("spec_restart", function(payload) notified[#notified + 1] = payload or "(reconnected)" end)
    support.eventually(function()
      support.query("SELECT pg_notify('spec_restart', 'before')")
      return #notified > 0
    end, 10, 0.1)
    local inflight = qtg.spawn(function()
      local s = db.acquire()
      local ok, err = pcall(s.query, s, "SELECT pg_sleep(30)")
      s:release()
      return ok, err
    end)
    -- a batch in flight too (its statements prepared by a first one)
    local SLEEP, ONE = "SELECT pg_sleep($1::float8)", "SELECT 1 AS one"
    local batched = qtg.spawn(function()
      local s = db.acquire()
      s:begin_pipeline()
      s:batch({ SLEEP, 0 }, { ONE })
      local bok, berr = pcall(s.batch, s, { SLEEP, 30 }, { ONE })
      s:release()
      return bok, berr
    end)
    qtg.sleep(0.2)
    local rc, out = support.run({}, {support.root .. "/tools/pg", "--dir", pgdir, "restart"})
    assert.are.equal(0, rc, out)
    local _, ok, err = qtg.join(inflight)
    assert.is_false(ok)
    assert.is_truthy(err.kind == "connection" or err.sqlstate == "57P01", tostring(err))
    _, ok, err = qtg.join(batched)
    assert.is_false(ok)
    assert.is_truthy(err.kind == "connection" or err.sqlstate == "57P01", tostring(err))
    local v = support.eventually(function()
      local ok2, rows = pcall(support.query, "SELECT 42 AS v")
      return ok2 and rows[1].v
    end, 20, 0.2)
    assert.are.equal(42, v)
    local s = db.acquire()
    s:begin_pipeline()
    local a, b = s:batch({ SLEEP, 0 }, { ONE })
    assert.are.same({ { pg_sleep = "" } }, a)
    assert.are.same({ { one = 1 } }, b)
    s:commit()
    s:release()
    -- the listener came back and asked its owner to catch up
    assert.is_truthy(support.eventually(function()
      for _, p in ipairs(notified) do if p == "(reconnected)" then return true end end
    end, 20, 0.2))
    db.unlisten("spec_restart")
  end)
end)
