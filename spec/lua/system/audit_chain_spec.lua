-- The hash-chained audit trail (sql/0100_audit_chain.sql, lua/qtg/audit.lua,
-- `qtgd audit`) and the console's audited SQL (sql() read-only, sql_write()).
--
-- Tampering is done as the owner role can: triggers disabled, a row edited
-- or deleted, inside a transaction that verify runs in and that is rolled
-- back afterwards, so the history other specs see stays whole.
local qtg = require "qtg"
local cjson = require "cjson"
local support = require "spec.lua.support.host"
local audit = require "qtg.audit"
local promoter = require "qtg.workers.audit_outbox_promoter"

local sup -- spec/lua/support/engine.lua, loaded in setup
local s

local function history(n)
  local ids = {}
  for i = 1, n do
    local req = sup.create(s, "spec_audit_chain", { intent = { asset = "USDC", amount = tostring(i) } })
    ids[#ids + 1] = req.id
  end
  repeat until promoter.promote(s, 500) == 0
  return ids
end

-- Run fn(s) in a transaction with the audit triggers off, then verify in the
-- same transaction and roll everything back.
local function tampered(fn)
  s:begin()
  s:exec("ALTER TABLE audit_events DISABLE TRIGGER USER")
  local ok, err = pcall(fn, s)
  s:exec("ALTER TABLE audit_events ENABLE TRIGGER USER")
  local report = ok and audit.verify(s) or nil
  s:rollback()
  assert(ok, err)
  return report
end

local function last_rows(n)
  return s:query("SELECT * FROM audit_events ORDER BY id DESC LIMIT $1", n)
end

describe("the audit chain", function()
  setup(function()
    sup = require "spec.lua.support.engine"
    s = qtg.db.acquire()
    sup.load_doc(s, sup.doc("spec_audit_chain", { { "a", "action", "withdrawal", { sim = { observes = 0 } } } }))
    history(5)
  end)
  teardown(function() s:release() end)

  it("chains every promoted row to the one before it, and verify passes on a real history", function()
    history(3)
    local rows = s:query([[SELECT network_class, chain_seq, prev_hash, row_hash,
                                  qtg_audit_row_text(e) AS text FROM audit_events e
                            ORDER BY network_class, chain_seq]])
    assert.is_true(#rows >= 8)
    local by_class = {}
    for _, r in ipairs(rows) do
      local before = by_class[r.network_class]
      assert.equals(before and before.chain_seq + 1 or 1, r.chain_seq)
      assert.equals(before and before.row_hash or string.rep("0", 64), r.prev_hash)
      -- the hash is sha256(prev_hash || row text), recomputed here in Lua
      assert.equals(qtg.crypto.sha256_hex(r.prev_hash .. r.text), r.row_hash)
      by_class[r.network_class] = r
    end
    local report = audit.verify(s)
    assert.is_true(report.ok, report.broken and report.broken.meaning)
    assert.is_true(report.checked >= 8)
  end)

  it("declares the row text STABLE, as its body is, so that the chain trigger inlines it", function()
    local row = s:query([[SELECT provolatile FROM pg_proc
                           WHERE oid = 'qtg_audit_row_text(audit_events)'::regprocedure]])[1]
    assert.equals("s", row.provolatile)
  end)

  it("puts each promoted row in its request's chain, and looks the class up for an insert naming none", function()
    local ids = history(2)
    local rows = s:query([[SELECT e.network_class, r.network_class AS request_class
                             FROM audit_events e JOIN movement_requests r ON r.id = e.request_id
                            WHERE e.request_id = ANY ($1::uuid[])]], "{" .. table.concat(ids, ",") .. "}")
    assert.is_true(#rows >= 2)
    for _, r in ipairs(rows) do assert.equals(r.request_class, r.network_class) end
    -- the owner's plain insert names no class: the chain trigger finds it
    s:begin()
    s:query([[INSERT INTO audit_events (outbox_id, actor, action, entity_type, entity_id,
                                        request_id, detail, created_at, promoted_at)
              VALUES (-4343, 'system:spec', 'spec.chain.plain', 'spec', 'x', $1::uuid, '{}',
                      now(), now())]], ids[1])
    local row = s:query("SELECT network_class FROM audit_events WHERE outbox_id = -4343")[1]
    local report = audit.verify(s)
    s:rollback()
    assert.equals(qtg.settings.network_class, row.network_class)
    assert.is_true(report.ok, report.broken and report.broken.meaning)
  end)

  it("stays whole across statements, savepoints and rollbacks of one transaction", function()
    local function outbox_rows(n, tag)
      for i = 1, n do
        s:query([[INSERT INTO audit_outbox (actor, action, entity_type, entity_id, detail)
                  VALUES ('system:spec', $1, 'spec', $2, '{}')]], tag, tostring(i))
      end
    end
    s:begin()
    outbox_rows(3, "spec.chain.tx")
    assert.equals(3, promoter.promote(s, 500))
    s:savepoint("sp")
    outbox_rows(2, "spec.chain.sp")
    assert.equals(2, promoter.promote(s, 500))
    s:rollback_to("sp")
    outbox_rows(4, "spec.chain.tx2")
    assert.equals(4, promoter.promote(s, 500))
    s:commit()
    s:begin()
    outbox_rows(1, "spec.chain.rolled")
    assert.equals(1, promoter.promote(s, 500))
    s:rollback()
    history(1)
    assert.equals(0, s:query("SELECT count(*)::int AS n FROM audit_events WHERE action IN ($1, $2)",
      "spec.chain.sp", "spec.chain.rolled")[1].n)
    local report = audit.verify(s)
    assert.is_true(report.ok, report.broken and report.broken.meaning)
    local head = s:query("SELECT chain_seq FROM audit_chain_heads WHERE network_class = ''")[1]
    assert.equals(s:query([[SELECT max(chain_seq) AS m FROM audit_events
                             WHERE network_class = '']])[1].m, head.chain_seq)
  end)

  it("records what a request asked for in its create row (intent, amount, callback URL)", function()
    local req = sup.create(s, "spec_audit_chain", { intent = { asset = "USDC", amount = "123.45" } })
    local row = s:query([[SELECT detail FROM audit_outbox WHERE request_id = $1::uuid
                           AND action = 'request.create']], req.id)[1]
    assert.equals("123.45", row.detail.intent.amount)
    assert.equals("USDC", row.detail.intent.asset)
    assert.equals(req.callback_url, row.detail.callback_url)
  end)

  it("finds a row edited by the owner role", function()
    history(2)
    local victim = last_rows(3)[3]
    local report = tampered(function(t)
      t:query([[UPDATE audit_events SET detail = detail || '{"amount": "20"}'::jsonb
                 WHERE id = $1]], victim.id)
    end)
    assert.is_false(report.ok)
    assert.equals(victim.id, report.broken.id)
    assert.equals("edited", report.broken.problem)
  end)

  it("finds an edit that also rewrote the row's own hash, at the next link", function()
    history(2)
    local rows = last_rows(3)
    local victim = rows[3]
    local report = tampered(function(t)
      t:query([[UPDATE audit_events e SET actor = 'console:0',
                  row_hash = encode(sha256(convert_to(e.prev_hash ||
                    qtg_audit_row_text(ROW(e.id, e.outbox_id, 'console:0', e.action, e.entity_type,
                      e.entity_id, e.request_id, e.detail, e.created_at, e.promoted_at,
                      e.network_class, e.chain_seq, e.prev_hash, e.row_hash)::audit_events),
                    'UTF8')), 'hex')
                 WHERE id = $1]], victim.id)
    end)
    assert.is_false(report.ok)
    assert.equals("bad_link", report.broken.problem)
    assert.equals(victim.network_class, report.broken.network_class)
    assert.equals(victim.chain_seq + 1, report.broken.chain_seq)
  end)

  it("finds a deleted row, and a deleted tail", function()
    history(3)
    local rows = last_rows(3)
    local report = tampered(function(t)
      t:query("DELETE FROM audit_events WHERE id = $1", rows[2].id)
    end)
    assert.is_false(report.ok)
    assert.equals("missing_before", report.broken.problem)
    assert.equals(rows[1].id, report.broken.id)

    report = tampered(function(t)
      t:query("DELETE FROM audit_events WHERE id = $1", rows[1].id)
    end)
    assert.is_false(report.ok)
    assert.equals("missing_tail", report.broken.problem)
    assert.equals(rows[1].network_class, report.broken.network_class)
  end)

  it("refuses a row inserted around the chain trigger", function()
    s:begin()
    s:exec("SET LOCAL session_replication_role = replica")
    local ok, err = pcall(s.query, s, [[
      INSERT INTO audit_events (outbox_id, actor, action, entity_type, entity_id, detail, created_at)
      VALUES (-424242, 'operator:mallory', 'request.approve', 'movement_request', 'x', '{}',
              now() - interval '400 days')]])
    s:rollback()
    assert.is_false(ok)
    assert.equals("23502", err.sqlstate) -- not_null_violation: no place in a chain
  end)

  it("is checked and exported by qtgd audit", function()
    history(1)
    -- a whole trail's walk is not held to a worker's statement bound
    local env = support.base_env({ MG_DB_STATEMENT_TIMEOUT_SECONDS = "0.001" })
    local rc, out = support.run(env, { support.bin, "audit", "verify" })
    assert.equals(0, rc, out)
    assert.matches("audit verify: ok, %d+ rows checked", out)

    local first = s:query("SELECT min(id) AS id, count(*)::int AS n FROM audit_events")[1]
    rc, out = support.run(env, { support.bin, "audit", "export", "--since", tostring(first.id) })
    assert.equals(0, rc, out)
    local n = 0
    for line in out:gmatch("[^\n]+") do
      local row = cjson.decode(line)
      assert.matches("^%x+$", row.row_hash)
      assert.is_true(row.id > first.id)
      n = n + 1
    end
    assert.equals(first.n - 1, n)

    for _, bad in ipairs({ { "audit" }, { "audit", "bogus" }, { "audit", "verify", "--since" },
                           { "audit", "verify", "--since", "-1" }, { "audit", "export", "x" } }) do
      local args = { support.bin }
      for _, a in ipairs(bad) do args[#args + 1] = a end
      rc, out = support.run(env, args)
      assert.equals(2, rc, table.concat(bad, " "))
      assert.matches("usage: qtgd audit", out)
    end
  end)

  it("makes qtgd audit verify exit 1 and name the row when the chain is broken", function()
    history(1)
    local victim = last_rows(1)[1]
    -- committed this time, for the other process to see; repaired below
    s:exec("ALTER TABLE audit_events DISABLE TRIGGER audit_events_no_update")
    s:query("UPDATE audit_events SET action = 'request.nothing' WHERE id = $1", victim.id)
    local rc, out = support.run(support.base_env(), { support.bin, "audit", "verify" })
    s:query("UPDATE audit_events SET action = $2 WHERE id = $1", victim.id, victim.action)
    s:exec("ALTER TABLE audit_events ENABLE TRIGGER audit_events_no_update")
    assert.equals(1, rc, out)
    assert.matches("BROKEN at row " .. victim.id, out, 1, true)
    assert.is_true(audit.verify(s).ok)
  end)
end)

describe("the console's SQL", function()
  local cmds
  setup(function()
    s = qtg.db.acquire()
    cmds = require("qtg.console.commands").bind({ actor = "console:spec-sql", print = function() end })
  end)
  teardown(function() s:release() end)

  local function audited(action)
    repeat until promoter.promote(s, 500) == 0
    return s:query([[SELECT actor, detail FROM audit_events WHERE action = $1
                      ORDER BY id DESC LIMIT 1]], action)[1]
  end

  it("sql() reads, refuses a write, and is audited with the operator", function()
    local rows = cmds.sql("SELECT $1::int + 1 AS n", 41)
    assert.equals(42, rows[1].n)
    local row = audited("console.sql")
    assert.equals("console:spec-sql", row.actor)
    assert.equals("SELECT $1::int + 1 AS n", row.detail.query)
    assert.same({ "41" }, row.detail.params)

    s:exec("CREATE TABLE IF NOT EXISTS spec_console_sql (v text); TRUNCATE spec_console_sql")
    local ok, err = pcall(cmds.sql, "INSERT INTO spec_console_sql VALUES ('x')")
    assert.is_false(ok)
    assert.equals("25006", err.sqlstate) -- read_only_sql_transaction
    assert.equals(0, s:query("SELECT count(*)::int AS n FROM spec_console_sql")[1].n)
    -- the attempt is on the record too
    assert.equals("INSERT INTO spec_console_sql VALUES ('x')", audited("console.sql").detail.query)
  end)

  -- A read-only transaction can still change its session: a pooled
  -- connection kept a session advisory lock (or settings, or a PREPARE
  -- under the pool's statement names) for whichever task took it next.
  it("sql() and sql_write() leave no session state on a pooled connection", function()
    local pool_before = qtg.db.stats().open
    cmds.sql("SELECT pg_advisory_lock(771188), set_config('lock_timeout', '0', false)")
    cmds.sql_write("SELECT pg_advisory_lock(771189)")
    assert.is_truthy(require("spec.lua.support.common").poll(function()
      return s:query([[SELECT count(*)::int AS n FROM pg_locks
                        WHERE locktype = 'advisory' AND objid IN (771188, 771189)]])[1].n == 0
    end, 10), "a console statement's advisory lock outlived it")
    -- every connection of the pool still has the pool's bounds (held at
    -- once, so that each is a different one)
    assert.is_true(qtg.db.stats().open <= pool_before + 1)
    local held = {}
    for i = 1, math.max(1, qtg.db.stats().open - 1) do held[i] = qtg.db.acquire() end
    for _, k in ipairs(held) do
      local v = k:query("SELECT current_setting('lock_timeout') AS v")[1].v
      k:release()
      assert.equals("1min", v)
    end
  end)

  it("sql_write() writes, and its audit row commits with the change or not at all", function()
    s:exec("CREATE TABLE IF NOT EXISTS spec_console_sql (v text); TRUNCATE spec_console_sql")
    cmds.sql_write("INSERT INTO spec_console_sql VALUES ($1)", "y")
    assert.equals(1, s:query("SELECT count(*)::int AS n FROM spec_console_sql WHERE v = 'y'")[1].n)
    local row = audited("console.sql_write")
    assert.equals("console:spec-sql", row.actor)
    assert.same({ "y" }, row.detail.params)

    local before = s:query([[SELECT count(*)::int AS n FROM audit_outbox WHERE action = 'console.sql_write']])[1].n
    local ok = pcall(cmds.sql_write, "INSERT INTO spec_console_sql VALUES (1/0)")
    assert.is_false(ok)
    assert.equals(before, s:query([[SELECT count(*)::int AS n FROM audit_outbox
                                     WHERE action = 'console.sql_write']])[1].n)
  end)

  it("audits every evaluated console chunk before it runs, with the operator, even one that is not text", function()
    local console = require "qtg.console"
    local session = { id = 424242, uid = 0, pid = 1 }
    local who = require("qtg.principals").console(s, 0).actor
    local kind, text = console.handle(session, "e", "spec_chunk_marker = 41 return spec_chunk_marker + 1")
    assert.equals("r", kind, text)
    assert.matches("42", text)
    local row = audited("console.eval")
    assert.equals(who, row.actor)
    assert.equals("spec_chunk_marker = 41 return spec_chunk_marker + 1", row.detail.code)
    -- a chunk PostgreSQL could not store as text is kept as hex, never dropped
    local sneaky = "local _ = '\0' return 'hidden'"
    console.handle(session, "e", sneaky)
    row = audited("console.eval")
    assert.is_nil(row.detail.code)
    assert.equals(qtg.crypto.hex(sneaky), row.detail.code_hex)
    assert.equals(#sneaky, row.detail.bytes)
    assert.equals(qtg.crypto.sha256_hex(sneaky), row.detail.sha256)
    -- a chunk padded past what the row keeps (the review's 4 KiB of
    -- comments in front) is kept whole up to 64 KiB, and pinned whole by
    -- its digest past that
    local padded = string.rep("-- padding\n", 400) .. "spec_padded = 1 return 'ran'"
    console.handle(session, "e", padded)
    row = audited("console.eval")
    assert.equals(padded, row.detail.code)
    assert.equals(qtg.crypto.sha256_hex(padded), row.detail.sha256)
    local huge = string.rep("-- padding\n", 7000) .. "spec_huge = 1 return 'ran'"
    console.handle(session, "e", huge)
    row = audited("console.eval")
    assert.equals(65536, #row.detail.code)
    assert.equals(#huge, row.detail.bytes)
    assert.equals(qtg.crypto.sha256_hex(huge), row.detail.sha256)
  end)

  it("refuses a query that is not text", function()
    local ok, err = pcall(cmds.sql, 42)
    assert.is_false(ok)
    assert.matches("query must be a string", tostring(err.message or err))
  end)
end)
