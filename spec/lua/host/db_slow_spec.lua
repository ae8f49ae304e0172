-- db_slow_spec: a statement or commit that stays in flight past
-- MG_DB_SLOW_WARN_SECONDS is said (src/qtg_pg.c, the slow-statement watch).
-- PostgreSQL's own bounds leave gaps: statement_timeout does not bound a
-- commit waiting for a synchronous standby that is gone, and a lock held by
-- an operator's open transaction is waited on for MG_DB_LOCK_TIMEOUT_SECONDS.
-- Before the watch, the workers stopped making progress with no word.
-- Every stall here is real (no mock):
--   * a child `qtgd exec` whose statement waits on a row the spec holds
--     locked: warn lines at 0.5, 1 and 2 s (the threshold, then each time
--     the wait has doubled; not one per pass of the pool's timer), naming
--     the task, the statement's first bytes (never its parameters: a
--     secret-looking one is absent from the whole log), the time waited,
--     the server and the backend pid (which is the one PostgreSQL shows
--     waiting on the lock); qtg.db.stats() counts it; one line when it
--     finishes; statements that end in time get none;
--   * a lock wait ended by MG_DB_LOCK_TIMEOUT_SECONDS: the last line says
--     "error" and its SQLSTATE; a long statement shows its first 100 bytes
--     on one line, never a UTF-8 character cut in two;
--   * a statement whose task was interrupted (its session released by
--     another task): the last line says "abandoned", naming the task;
--   * 0 turns the watch off; a bad value stops qtgd, naming the variable;
--   * a `qtgd run` whose audit_outbox_promoter waits on a table the spec
--     locks: the worker is named, and /metrics shows the statement in
--     flight and counted, then no longer in flight;
--   * a commit waiting for a synchronous standby that does not exist, on a
--     throwaway cluster of the spec's own (tools/pg): named as a COMMIT.
local qtg = require "qtg"
local cjson = require "cjson"

local common, support, api

local SECRET = "hunter2-Secret-Param-7f3a"

-- The JSON log lines of a child's output whose msg is the watch's.
local function slow_lines(text)
  local out = {}
  for line in (text or ""):gmatch("[^\n]+") do
    if line:sub(1, 1) == "{" then
      local ok, t = pcall(cjson.decode, line)
      if ok and type(t.msg) == "string" and t.msg:match("^database statement ") then out[#out + 1] = t end
    end
  end
  return out
end

-- The lines of `lines` that say the statement is `what` ("still running",
-- "finished") after some time.
local function saying(lines, what)
  local out = {}
  for _, l in ipairs(lines) do
    if l.msg:match("^database statement " .. what .. " after [%d.]+ s$") then out[#out + 1] = l end
  end
  return out
end

local function still(lines) return saying(lines, "still running") end
local function finished(lines) return saying(lines, "finished") end

-- The server a URL names: its host parameter or its authority's host.
local function url_host(url)
  local h = url:match("[?&]host=([^&]+)")
  if h then return (h:gsub("%%(%x%x)", function(x) return string.char(tonumber(x, 16)) end)) end
  return url:match("^%a[%w+.-]*://[^@/]*@([^:/?]+)") or url:match("^%a[%w+.-]*://([^:/?@]+)")
end

-- The child: quick statements first (none may be named), then, with a
-- helper task printing qtg.db.stats() once the watch counts the stuck
-- statement and again at the end, an UPDATE of the row the spec holds,
-- carrying a secret-looking parameter (with SLOW_PAD, a comment of that
-- text inside it, and a line break).  With SLOW_RELEASE set, the helper
-- releases the stuck session that many seconds after the first warning,
-- which interrupts the task waiting on it (docs/host-api.md, s:release).
local CHILD = [[
io.stdout:setvbuf("line")
local qtg = require("qtg")
local cjson = require("cjson")
local db = qtg.db
local tbl, secret = assert(os.getenv("SLOW_TABLE")), assert(os.getenv("SLOW_SECRET"))
local release = tonumber(os.getenv("SLOW_RELEASE"))
db.with_session(function(s)
  s:query("SELECT 1 AS quick_one")
  s:query("SELECT pg_sleep(0.2) AS quick_two")
end)
print("quick done")
local s = db.acquire()
local seen = false
qtg.spawn(function()
  while not seen do
    local st = db.stats()
    if st.slow >= 1 then
      seen = true
      print("stats while stuck " .. cjson.encode(st))
      if release then
        qtg.sleep(release)
        s:release()
      end
    end
    qtg.sleep(0.05)
  end
end)
local sql = "UPDATE " .. tbl .. " SET n = n + 1 WHERE id = 1 AND $1::text <> ''"
if os.getenv("SLOW_PAD") then sql = sql:gsub(" SET ", " /* x" .. os.getenv("SLOW_PAD") .. " */\n   SET ") end
print("sql " .. sql:gsub("\n", "\\n"))
local ok, err = pcall(s.query, s, sql, secret)
seen = true
pcall(s.release, s)
print("update " .. tostring(ok) .. " " .. (ok and "-" or tostring(type(err) == "table" and (err.sqlstate or err.kind) or err)))
-- an abandoned statement ends when its connection's shutdown is read back
local deadline = qtg.monotonic() + 10
while db.stats().slow > 0 and qtg.monotonic() < deadline do qtg.sleep(0.05) end
print("stats after " .. cjson.encode(db.stats()))
]]

-- A child whose pipelined batch waits on the row the spec holds: the
-- batch's second statement (SELECT, then the UPDATE), or with SLOW_AHEAD
-- the UPDATE sent ahead of a commit that is in at once.  The statements are
-- prepared first (a batch of unprepared ones goes one by one).
local BATCH_CHILD = [[
io.stdout:setvbuf("line")
local qtg = require("qtg")
local upd = "UPDATE " .. assert(os.getenv("SLOW_TABLE")) .. " SET n = n + 1 WHERE id = 1 AND $1::text <> ''"
local s = qtg.db.acquire()
s:pipeline_transaction(function() s:query(upd, "x") s:query("SELECT $1::text AS a", "y") end)
print("prepared")
while not io.open(os.getenv("SLOW_GO")) do qtg.sleep(0.05) end
s:begin_pipeline()
if os.getenv("SLOW_AHEAD") then
  s:send_ahead({ upd, "ahead" })
  s:commit_batch({ "SELECT $1::text AS a", "first" })
  s:take_ahead()
  s:commit()
else
  s:commit_batch({ "SELECT $1::text AS a", "first" }, { upd, "second" })
end
s:release()
print("batch done")
]]

describe("the slow-statement watch (MG_DB_SLOW_WARN_SECONDS)", function()
  local tbl, dir
  setup(function()
    common = require "spec.lua.support.common"
    support = require "spec.lua.support.host"
    api = require "spec.lua.support.api"
    tbl = common.scratch_table("slow", 1)
    dir = support.tmpdir()
    support.write(dir .. "/child.lua", CHILD)
  end)
  teardown(function()
    common.query("DROP TABLE IF EXISTS " .. tbl)
    support.stop_all()
    os.execute("rm -rf " .. common.quote(dir))
  end)

  -- Start the child with the spec holding row 1; returns its handle.
  local function start_child(extra)
    local env = support.base_env({ MG_LOG_FORMAT = "json", SLOW_TABLE = tbl, SLOW_SECRET = SECRET })
    for k, v in pairs(extra or {}) do env[k] = v end
    return support.start(env, { "exec", dir .. "/child.lua" })
  end

  local function hold_row()
    local holder = qtg.db.acquire()
    holder:begin()
    holder:query("SELECT n FROM " .. tbl .. " WHERE id = 1 FOR UPDATE")
    return holder
  end

  local function let_go(holder)
    pcall(holder.rollback, holder)
    holder:release()
  end

  it("warns at the threshold and as the wait doubles, says how it ended, and counts it", function()
    local holder = hold_row()
    local h, log
    local ok, err = pcall(function()
      h = start_child({ MG_DB_SLOW_WARN_SECONDS = "0.5" })
      -- the first warning, then its backend: PostgreSQL shows it waiting on our lock
      local pid = tonumber(common.wait_log(h, '"msg":"database statement still running after [%d.]+ s"[^\n]-"backend_pid":(%d+)',
        20, "the first warning"))
      local r = common.query([[SELECT wait_event_type AS w, query AS q, $2 = ANY(pg_blocking_pids(pid)) AS mine
                                 FROM pg_stat_activity WHERE pid = $1]], pid, holder:pid())[1]
      assert.is_truthy(r, "no server process " .. pid)
      assert.equal("Lock", r.w)
      assert.is_true(r.mine)
      assert.matches("UPDATE " .. tbl, r.q, 1, true)
      -- the lines at 0.5, 1 and 2 s, then a pause: the next is due at 4 s
      common.wait_for(function() return #still(slow_lines(support.read(h.log))) >= 3 end, 20,
        "three warnings")
      qtg.sleep(0.8)
      log = support.read(h.log)
    end)
    let_go(holder)
    assert(ok, err)
    assert.equal(0, support.wait_exit(h, 30), support.read(h.log))
    local all = support.read(h.log)
    assert.is_nil(all:find("Sanitizer", 1, true), all)
    -- while the row was held: three warnings, not one per pass of the timer
    local warned = still(slow_lines(log))
    assert.equal(3, #warned, log)
    local w = {}
    for i, l in ipairs(warned) do
      w[i] = l.waited_seconds
      assert.equal("warn", l.level)
      assert.equal("exec", l.task)
      assert.equal("UPDATE " .. tbl .. " SET n = n + 1 WHERE id = 1 AND $1::text <> ''", l.statement)
      assert.equal(url_host(os.getenv("MG_DATABASE_URL")), l.host)
      assert.is_number(l.port)
      assert.is_number(l.backend_pid)
      assert.is_nil(l.commit)
      assert.matches(("after %.1f s"):format(l.waited_seconds), l.msg, 1, true)
    end
    -- not before they are due; how late depends on the machine's load
    assert.is_true(w[1] >= 0.5 and w[1] < 2, log)
    assert.is_true(w[2] >= 2 * w[1] - 0.01 and w[2] < 2 * w[1] + 1.5, log)
    assert.is_true(w[3] >= 2 * w[2] - 0.01 and w[3] < 2 * w[2] + 1.5, log)
    -- once the row was let go: one line, how long and how it ended
    local lines = slow_lines(all)
    local done = finished(lines)
    assert.equal(1, #done, all)
    assert.equal("ok", done[1].outcome)
    assert.equal("exec", done[1].task)
    assert.equal(warned[1].backend_pid, done[1].backend_pid)
    assert.is_true(done[1].waited_seconds >= w[3], all)
    assert.equal(4, #lines, all)
    -- statements that ended in time were never named, and no parameter is anywhere
    assert.is_nil(all:find("quick_", 1, true), all)
    assert.is_nil(all:find(SECRET, 1, true), all)
    assert.is_nil(all:find("hunter2", 1, true), all)
    -- the pool's numbers behind /metrics
    local stuck = cjson.decode((assert(all:match("stats while stuck (%b{})"), all)))
    assert.equal(1, stuck.slow)
    assert.equal(1, stuck.slow_total)
    assert.is_true(stuck.oldest_seconds >= 0.5, all)
    local after = cjson.decode((assert(all:match("stats after (%b{})"), all)))
    assert.same({ 0, 1, 0 }, { after.slow, after.slow_total, after.oldest_seconds })
    assert.matches("update true -", all, 1, true)
    assert.equal(1, common.query("SELECT n FROM " .. tbl .. " WHERE id = 1")[1].n)
  end)

  it("says a wait ended by MG_DB_LOCK_TIMEOUT_SECONDS ended in an error, and shows a long statement's start", function()
    local holder = hold_row()
    local h
    local ok, err = pcall(function()
      h = start_child({ MG_DB_SLOW_WARN_SECONDS = "0.5", MG_DB_LOCK_TIMEOUT_SECONDS = "1.5",
                        SLOW_PAD = string.rep("\195\169", 60) })
      assert.equal(0, support.wait_exit(h, 30), support.read(h.log))
    end)
    let_go(holder)
    assert(ok, err)
    local all = support.read(h.log)
    local lines = slow_lines(all)
    assert.equal(2, #still(lines), all)   -- 0.5 and 1 s
    local done = finished(lines)
    assert.equal(1, #done, all)
    assert.equal("error", done[1].outcome)
    assert.equal("55P03", done[1].sqlstate)
    assert.is_true(done[1].waited_seconds >= 1.4, all)
    assert.matches("update false 55P03", all, 1, true)
    assert.is_nil(all:find(SECRET, 1, true), all)
    -- a long statement: its first 100 bytes on one line, its white space
    -- folded, never a character cut in two (here one straddles byte 100)
    local sql = assert(all:match("\nsql ([^\n]+)"), all):gsub("\\n%s*", " ")
    local cut = 100
    while sql:byte(cut + 1) >= 0x80 and sql:byte(cut + 1) < 0xC0 do cut = cut - 1 end
    assert.is_true(cut < 100, sql)
    for _, l in ipairs(lines) do assert.equal(sql:sub(1, cut) .. "...", l.statement) end
  end)

  it("says a statement whose task was interrupted was abandoned, naming the task it had", function()
    local holder = hold_row()
    local h
    local ok, err = pcall(function()
      h = start_child({ MG_DB_SLOW_WARN_SECONDS = "0.5", SLOW_RELEASE = "0.3" })
      common.wait_log(h, '"msg":"database statement finished after [%d.]+ s"', 20, "the last line")
    end)
    let_go(holder)
    assert(ok, err)
    assert.equal(0, support.wait_exit(h, 30), support.read(h.log))
    local all = support.read(h.log)
    assert.matches("update false interrupted", all, 1, true)
    local lines = slow_lines(all)
    assert.equal(1, #still(lines), all)
    local done = finished(lines)
    assert.equal(1, #done, all)
    assert.equal("abandoned", done[1].outcome)
    assert.equal("exec", done[1].task)
    assert.is_true(done[1].waited_seconds >= 0.8 and done[1].waited_seconds < 5, all)
    local after = cjson.decode((assert(all:match("stats after (%b{})"), all)))
    assert.same({ 0, 1 }, { after.slow, after.slow_total })
    assert.is_nil(all:find(SECRET, 1, true), all)
  end)

  -- A statement sent ahead of a commit, stuck after the commit was in, was
  -- named as the commit's batch and called a commit; a committing batch
  -- stuck on a statement was called a commit too.  A batch is named by its
  -- first statement not answered yet: the server sends a pipeline's results
  -- at its Sync (or when its buffer fills), so which one waits is for
  -- pg_stat_activity to say (backend_pid).
  local UPD = "UPDATE %s SET n = n + 1 WHERE id = 1 AND $1::text <> ''"
  for _, case in ipairs({ { "a committing batch by its first statement not answered, not as a commit", {},
                            "SELECT $1::text AS a", 2 },
                          { "a statement sent ahead of a commit that is in by itself", { SLOW_AHEAD = "1" },
                            UPD, 1 } }) do
    it("names " .. case[1], function()
      support.write(dir .. "/batch_child.lua", BATCH_CHILD)
      local go = dir .. "/go-" .. common.uid("b", 4)
      local env = support.base_env({ MG_LOG_FORMAT = "json", SLOW_TABLE = tbl, SLOW_GO = go,
                                     MG_DB_SLOW_WARN_SECONDS = "0.5" })
      for k, v in pairs(case[2]) do env[k] = v end
      local h = support.start(env, { "exec", dir .. "/batch_child.lua" })
      common.wait_log(h, "prepared", 20, "the prepared statements")
      local holder = hold_row()
      local ok, err = pcall(function()
        support.write(go, "")
        common.wait_for(function() return #still(slow_lines(support.read(h.log))) >= 1 end, 20, "a warning")
      end)
      let_go(holder)
      assert(ok, err)
      assert.equal(0, support.wait_exit(h, 30), support.read(h.log))
      local all = support.read(h.log)
      assert.matches("batch done", all, 1, true)
      local lines = slow_lines(all)
      assert.is_true(#lines >= 2, all)
      for _, l in ipairs(lines) do
        assert.equal(case[3]:format(tbl), l.statement)
        assert.equal(case[4] > 1 and case[4] or nil, l.statements)
        assert.is_nil(l.commit, all)
      end
      assert.equal("ok", finished(lines)[1].outcome)
    end)
  end

  -- `qtgd audit verify` and `qtgd migrate` lift the statement bounds: a long
  -- walk of the trail is no stall, and their output is a report.
  it("says nothing for a command-line tool that lifts the statement bounds", function()
    local holder = qtg.db.acquire()
    holder:begin()
    holder:exec("LOCK TABLE audit_events IN ACCESS EXCLUSIVE MODE")
    local env = support.base_env({ MG_LOG_FORMAT = "json", MG_DB_SLOW_WARN_SECONDS = "0.2" })
    local h = support.start(env, { "audit", "verify" })
    local ok, err = pcall(function()
      common.wait_for(function() return common.waiting_on(holder:pid()) > 0 end, 20, "audit verify to wait")
      qtg.sleep(1)
    end)
    pcall(holder.rollback, holder)
    holder:release()
    assert(ok, err)
    support.wait_exit(h, 60)
    local all = support.read(h.log)
    assert.matches("audit verify:", all, 1, true)
    assert.same({}, slow_lines(all))
  end)

  it("is off at 0, 10 s by default, and refuses a bad value naming it", function()
    -- 0: a statement held 1.5 s gets no line and is not counted
    local holder = hold_row()
    local h
    local ok, err = pcall(function()
      h = start_child({ MG_DB_SLOW_WARN_SECONDS = "0" })
      common.wait_log(h, "quick done", 20, "the quick statements")
      common.wait_for(function() return common.waiting_on(holder:pid()) > 0 end, 10, "the child to wait on the row")
      qtg.sleep(1.5)
    end)
    let_go(holder)
    assert(ok, err)
    assert.equal(0, support.wait_exit(h, 30), support.read(h.log))
    local all = support.read(h.log)
    assert.same({}, slow_lines(all))
    local after = cjson.decode((assert(all:match("stats after (%b{})"), all)))
    assert.same({ 0, 0 }, { after.slow, after.slow_total })
    -- the default
    local env = support.base_env()
    env.MG_DB_SLOW_WARN_SECONDS = nil
    local rc, out = support.run(env, { support.bin, "settings" })
    assert.equal(0, rc, out)
    assert.matches("\nMG_DB_SLOW_WARN_SECONDS +10  %(default%)\n", out)
    -- refused: not a number, negative, past the bound, not finite, empty
    for _, bad in ipairs({ "soon", "-1", "86401", "1e999", "nan", "", "0.5s" }) do
      env.MG_DB_SLOW_WARN_SECONDS = bad
      rc, out = support.run(env, { support.bin, "exec", dir .. "/child.lua" })
      assert.equal(2, rc, bad .. ": " .. out)
      assert.matches('MG_DB_SLOW_WARN_SECONDS="' .. bad:gsub("%p", "%%%0") .. '" is invalid: expected a number between 0 and 86400', out)
      assert.is_nil(out:find("quick done", 1, true), out)
    end
  end)

  it("names the worker whose statement waits, and /metrics shows it in flight and counted", function()
    local d = api.start({ MG_DB_SLOW_WARN_SECONDS = "0.5", MG_AUDIT_OUTBOX_PROMOTER_INTERVAL_SECONDS = "0.2" })
    local reader = api.token("read")
    local function metric(body, name) return tonumber(body:match("\n" .. name .. " ([%d.e+-]+)")) end
    local function scrape() return api.call(d, "GET", "/metrics", { token = reader }).body end
    local before = scrape()
    assert.equal(0, metric(before, "qtg_db_slow_statements_in_flight"), before)
    assert.equal(0, metric(before, "qtg_db_slow_statements_total"), before)
    assert.truthy(before:find("# TYPE qtg_db_slow_statements_in_flight gauge", 1, true))
    assert.truthy(before:find("# TYPE qtg_db_slow_statements_total counter", 1, true))
    assert.truthy(before:find("# TYPE qtg_db_oldest_statement_seconds gauge", 1, true))
    -- the promoter's next pass waits on the table (its turn row, sql/0201)
    local holder = qtg.db.acquire()
    holder:begin()
    holder:query("LOCK TABLE audit_promoter_turn IN ACCESS EXCLUSIVE MODE")
    local body
    local ok, err = pcall(function()
      common.wait_log(d.h, '"msg":"database statement still running after [%d.]+ s","task":"audit_outbox_promoter"',
        20, "the promoter's warning")
      body = common.wait_for(function()
        local b = scrape()
        return metric(b, "qtg_db_slow_statements_in_flight") == 1 and b
      end, 10, "the gauge to show the stuck statement")
    end)
    let_go(holder)
    assert(ok, err)
    assert.equal(1, metric(body, "qtg_db_slow_statements_total"), body)
    assert.is_true(metric(body, "qtg_db_oldest_statement_seconds") >= 0.5, body)
    local w = still(slow_lines(support.read(d.h.log)))[1]
    assert.equal("SELECT qtg_audit_promote($1) AS promoted", w.statement)
    -- the pass goes on once the lock is gone: a last line, and nothing in flight
    common.wait_log(d.h, '"msg":"database statement finished after [%d.]+ s","task":"audit_outbox_promoter"[^\n]-"outcome":"ok"',
      20, "the promoter's statement to finish")
    body = common.wait_for(function()
      local b = scrape()
      return metric(b, "qtg_db_slow_statements_in_flight") == 0 and b
    end, 10, "the gauge to go back to 0")
    assert.equal(1, metric(body, "qtg_db_slow_statements_total"), body)
    api.stop(d)
  end)

  it("names a commit that waits for a synchronous standby that is gone", function()
    -- a throwaway cluster: its primary waits at every commit for a standby
    -- that does not exist (what a primary does after its standby died)
    local base = support.tmpdir()
    local pg = base .. "/pg"
    local tools_pg = common.quote(support.root .. "/tools/pg") .. " --dir " .. common.quote(pg)
    local out, rc = common.sh(tools_pg .. " --fast ensure")
    local url = out:match("(postgresql://%S+)")
    assert.is_truthy(rc == 0 and url, out)
    local function psql(sql) return common.psql(url, sql) end
    local h
    local ok, err = pcall(function()
      psql("CREATE TABLE paid (note text)")
      psql("ALTER SYSTEM SET synchronous_standby_names = 'qtg_standby_gone'")
      psql("ALTER SYSTEM SET synchronous_commit = 'on'")   -- --fast turned it off in qtg.conf
      psql("SELECT pg_reload_conf()")
      common.wait_for(function() return psql("SHOW synchronous_standby_names"):match("qtg_standby_gone") end, 10,
        "the primary to wait for its standby")
      support.write(base .. "/commit.lua", [[
local db = require("qtg").db
db.with_session(function(s)
  s:pipeline_transaction(function() s:query("INSERT INTO paid VALUES ($1)", os.getenv("SLOW_SECRET")) end)
end)
print("committed")
]])
      h = support.start({ MG_DATABASE_URL = url, MG_CONSOLE_ENABLED = "false", MG_LOG_LEVEL = "info",
                          MG_LOG_FORMAT = "json", MG_DB_SLOW_WARN_SECONDS = "0.5", SLOW_SECRET = SECRET },
                        { "exec", base .. "/commit.lua" })
      common.wait_log(h, '"msg":"database statement still running after [%d.]+ s"', 20, "the commit's warning")
      -- the standby's return (here: none wanted any more) lets the commit through
      psql("ALTER SYSTEM RESET synchronous_standby_names")
      psql("SELECT pg_reload_conf()")
      assert.equal(0, support.wait_exit(h, 30), support.read(h.log))
    end)
    local log = h and support.read(h.log) or ""
    common.sh(tools_pg .. " destroy")
    os.execute("rm -rf " .. common.quote(base))
    assert(ok, err)
    local lines = slow_lines(log)
    local w = still(lines)[1]
    assert.is_truthy(w, log)
    assert.equal("COMMIT", w.statement)
    assert.is_true(w.commit)
    assert.equal("exec", w.task)
    assert.equal(url_host(url), w.host)
    local done = finished(lines)
    assert.equal(1, #done, log)
    assert.equal("ok", done[1].outcome)
    assert.is_true(done[1].commit)
    assert.matches("committed", log, 1, true)
    assert.is_nil(log:find(SECRET, 1, true), log)
  end)
end)
