-- The hash-chained audit trail (sql/0100_audit_chain.sql, lua/qtg/audit.lua,
-- `qtgd audit`) and the console's audited SQL (sql() read-only, sql_write()).
--
-- Tampering is done as the owner role can: triggers disabled, a row edited
-- or deleted, inside a transaction that verify runs in and that is rolled
-- back afterwards, so the history other specs see stays whole.  What the
-- runtime role can do (a node's or a request's state changed without its
-- audit row) is done as qtg_runtime the same way.  The command's exit codes
-- are checked on a database of their own (other specs change states without
-- audit rows on purpose, so the shared one never verifies whole).
local qtg = require "qtg"
local cjson = require "cjson"
local support = require "spec.lua.support.host"
local common = require "spec.lua.support.common"
local audit = require "qtg.audit"
local against = require "qtg.audit_against"
local audit_states = require "qtg.audit_states"
local promoter = require "qtg.workers.audit_outbox_promoter"

local sup -- spec/lua/support/engine.lua, loaded in setup
local s
local q = common.quote

local function history(n)
  local ids = {}
  for i = 1, n do
    local req = sup.create(s, "spec_audit_chain", { intent = { asset = "USDC", amount = tostring(i) } })
    ids[#ids + 1] = req.id
  end
  repeat until promoter.promote(s, 500) == 0
  return ids
end

-- Run fn(s) in a transaction with the audit triggers off, then check(s)
-- (verify, unless given) in the same transaction and roll everything back.
local function tampered(fn, check)
  s:begin()
  s:exec("ALTER TABLE audit_events DISABLE TRIGGER USER")
  local ok, err = pcall(fn, s)
  s:exec("ALTER TABLE audit_events ENABLE TRIGGER USER")
  local report
  if ok then ok, err = pcall(function() report = (check or audit.verify)(s) end) end
  s:rollback()
  assert(ok, err)
  return report
end

-- What the owner can do with the triggers off, as SQL run in a tampering
-- transaction (`spec.chain` names the chain): cut a chain's newest `n`
-- rows and move its head back onto the row left last; rewrite a chain
-- from its first row (an actor changed) and re-hash every row and the
-- head, so that the chain verifies again.
local CUT_TAIL = [[
DELETE FROM audit_events WHERE network_class = current_setting('spec.chain')
   AND chain_seq > (SELECT max(chain_seq) - %d FROM audit_events WHERE network_class = current_setting('spec.chain'));
UPDATE audit_chain_heads h SET chain_seq = e.chain_seq, row_hash = e.row_hash
  FROM (SELECT chain_seq, row_hash FROM audit_events WHERE network_class = current_setting('spec.chain')
         ORDER BY chain_seq DESC LIMIT 1) e
 WHERE h.network_class = current_setting('spec.chain')]]
local REHASH = [[
DO $$
DECLARE
  e audit_events;
  prev text := repeat('0', 64);
  cls text := current_setting('spec.chain');
BEGIN
  UPDATE audit_events SET actor = 'console:0' WHERE network_class = cls AND chain_seq = 1;
  FOR e IN SELECT * FROM audit_events WHERE network_class = cls ORDER BY chain_seq LOOP
    e.prev_hash := prev;
    e.row_hash := encode(sha256(convert_to(prev || qtg_audit_row_text(e), 'UTF8')), 'hex');
    UPDATE audit_events SET prev_hash = e.prev_hash, row_hash = e.row_hash WHERE id = e.id;
    prev := e.row_hash;
  END LOOP;
  UPDATE audit_chain_heads SET row_hash = prev WHERE network_class = cls;
END $$]]

local function on_chain(class, sql)
  return function(t)
    t:query("SELECT set_config('spec.chain', $1, true)", class)
    t:exec(sql)
  end
end

-- The trail from since_id on (audit.export) in a file; -> its path, its
-- rows decoded.
local function export_file(dir, name, since_id)
  local lines, rows = {}, {}
  audit.export(s, since_id, function(line) lines[#lines + 1] = line end)
  for i, l in ipairs(lines) do rows[i] = cjson.decode(l) end
  local path = dir .. "/" .. name
  common.write(path, #lines > 0 and table.concat(lines, "\n") .. "\n" or "")
  return path, rows
end

-- compare(s, path[, since]) -> against.compare's report for the file at path.
local function compare(t, path, since)
  local f = assert(io.open(path, "rb"))
  local ok, res = pcall(against.compare, t, f, since)
  f:close()
  if not ok then error(res, 0) end
  return res
end

-- mismatched(report, ids) -> the report's mismatches whose row is one of ids
local function mismatched(report, ids)
  local want, out = {}, {}
  for _, id in ipairs(ids) do want[id] = true end
  for _, m in ipairs(report.mismatches) do if want[m.id] then out[#out + 1] = m end end
  return out
end

local function last_rows(n)
  return s:query("SELECT * FROM audit_events ORDER BY id DESC LIMIT $1", n)
end

-- The id before the trail's n-th newest row (its oldest, when it has fewer).
local function before_last(n)
  local rows = last_rows(n)
  return rows[#rows].id - 1
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

  it("is exported by qtgd audit, and refuses bad arguments", function()
    history(1)
    -- a whole trail's copy is not held to a worker's statement bound
    local env = support.base_env({ MG_DB_STATEMENT_TIMEOUT_SECONDS = "0.001" })
    local rc, out
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
                           { "audit", "verify", "--since", "-1" }, { "audit", "export", "x" },
                           { "audit", "verify", "--against" }, { "audit", "verify", "--against", "''" },
                           { "audit", "export", "--against", "/dev/null" },
                           { "audit", "verify", "--against", "/dev/null", "--against", "/dev/null" },
                           { "audit", "verify", "--since", "1", "--since", "2" } }) do
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

  describe("against an earlier export", function()
    local dir
    setup(function() dir = support.tmpdir() end)
    teardown(function() os.execute("rm -rf " .. q(dir)) end)

    it("holds on the live trail, and passes over the rows below --since", function()
      history(2)
      local path, rows = export_file(dir, "live.jsonl", before_last(40))
      local k = #rows
      assert.is_true(k > 10)
      local report = compare(s, path)
      assert.is_true(report.ok, report.difference and report.difference.meaning)
      assert.same({ lines = k, compared = k, skipped = 0 }, { lines = report.lines, compared = report.compared,
        skipped = report.skipped })
      report = compare(s, path, rows[k - 9].id)
      assert.is_true(report.ok)
      assert.equals(10, report.compared)
      assert.equals(k - 10, report.skipped)
      -- rows promoted since the export are not in it, and need not be
      history(1)
      assert.is_true(compare(s, path).ok)
    end)

    it("finds a chain whose newest rows the owner cut, its head moved back, which verify alone passes", function()
      history(3)
      local class = last_rows(1)[1].network_class
      local path, rows = export_file(dir, "cut.jsonl", before_last(30))
      local gone = {}
      for _, r in ipairs(s:query([[SELECT id, chain_seq FROM audit_events WHERE network_class = $1
                                    ORDER BY chain_seq DESC LIMIT 2]], class)) do gone[#gone + 1] = r end
      local verified = tampered(on_chain(class, CUT_TAIL:format(2)))
      assert.is_true(verified.ok, verified.broken and verified.broken.meaning)
      local report = tampered(on_chain(class, CUT_TAIL:format(2)), function(t) return compare(t, path) end)
      assert.is_false(report.ok)
      local d = report.difference
      local line
      for i, r in ipairs(rows) do if r.id == gone[2].id then line = i end end
      assert.same({ line = line, id = gone[2].id, network_class = class, chain_seq = gone[2].chain_seq,
                    problem = "chain_ends_earlier" },
                  { line = d.line, id = d.id, network_class = d.network_class, chain_seq = d.chain_seq,
                    problem = d.problem })
      assert.equals(string.format("the chain ends at place %d in the database, before this row of the export: "
        .. "its newest rows were deleted", gone[2].chain_seq - 1), d.meaning)
      -- the cut rows' places taken again by new rows (the id sequence
      -- moved back too): not the exported rows
      report = tampered(function(t)
        on_chain(class, CUT_TAIL:format(2))(t)
        t:exec("ALTER TABLE audit_events ENABLE TRIGGER USER")
        t:query([[INSERT INTO audit_outbox (actor, action, entity_type, entity_id, request_id, detail)
                  SELECT 'system:spec', 'spec.refill', 'spec', g::text, $1::uuid, '{}'
                    FROM generate_series(1, 3) g]], rows[#rows].request_id)
        promoter.promote(t, 500)
      end, function(t) return compare(t, path) end)
      assert.is_false(report.ok)
      assert.equals(gone[2].id, report.difference.id)
      assert.equals("missing", report.difference.problem)
      assert.matches("^the row is not in the database %(deleted%); its place in the chain is row %d+'s now$",
        report.difference.meaning)
    end)

    it("finds a chain the owner rewrote and re-hashed whole, which verify alone passes", function()
      history(2)
      local class = last_rows(1)[1].network_class
      local path, rows = export_file(dir, "rehashed.jsonl", before_last(30))
      local verified = tampered(on_chain(class, REHASH))
      assert.is_true(verified.ok, verified.broken and verified.broken.meaning)
      local report = tampered(on_chain(class, REHASH), function(t) return compare(t, path) end)
      assert.is_false(report.ok)
      local first
      for i, r in ipairs(rows) do if r.network_class == class then first = first or i end end
      local d = report.difference
      assert.equals(first, d.line)
      assert.equals(rows[first].id, d.id)
      assert.equals("changed", d.problem)
      assert.matches("its row_hash is %x+ in the database, " .. rows[first].row_hash .. " in the export", d.meaning)
    end)

    it("finds that an export is of another chain, or of another database", function()
      history(1)
      local _, rows = export_file(dir, "mine.jsonl", before_last(5))
      local function written(name, change)
        local lines = {}
        for i, r in ipairs(rows) do
          local copy = cjson.decode(cjson.encode(r))
          change(copy, i)
          lines[i] = cjson.encode(copy)
        end
        common.write(dir .. "/" .. name, table.concat(lines, "\n") .. "\n")
        return compare(s, dir .. "/" .. name)
      end
      -- the rows of another chain
      local report = written("elsewhere.jsonl", function(r) r.network_class = "spec-elsewhere" end)
      assert.is_false(report.ok)
      assert.same({ 1, rows[1].id, "moved" }, { report.difference.line, report.difference.id,
                                                report.difference.problem })
      assert.equals(string.format("in the database the row is at chain %q, place %d", rows[1].network_class,
        rows[1].chain_seq), report.difference.meaning)
      -- the same ids and places, hashed in another database's history
      report = written("another.jsonl", function(r, i) r.row_hash = qtg.crypto.sha256_hex("another database " .. i) end)
      assert.is_false(report.ok)
      assert.same({ 1, "changed" }, { report.difference.line, report.difference.problem })
      -- ids this database never had
      report = written("far.jsonl", function(r, i) r.id = 10 ^ 12 + i end)
      assert.is_false(report.ok)
      assert.same({ 1, 10 ^ 12 + 1 }, { report.difference.line, report.difference.id })
    end)

    it("refuses a file that is not an export, naming the line, and reads an empty one as nothing to compare", function()
      history(1)
      local path = export_file(dir, "good.jsonl", before_last(3))
      local good = common.read(path)
      local first = good:match("^[^\n]+")
      local row = cjson.decode(first)
      local function with(field, v)
        local r = cjson.decode(first)
        r[field] = v
        return cjson.encode(r)
      end
      local function without(field) return with(field, nil) end
      local cases = {
        { "garbage\n", 1, "not a JSON object" },
        { good .. "not json {\n", 4, "not a JSON object" },
        { good .. "\n" .. first .. "\n", 4, "empty" },
        { "[1, 2]\n", 1, "not a JSON object" },
        { "null\n", 1, "not a JSON object" },
        { "42\n", 1, "not a JSON object" },
        { "{}\n", 1, "the field id is missing" },
        { without("row_hash") .. "\n", 1, "the field row_hash is missing" },
        { without("network_class") .. "\n", 1, "the field network_class is missing" },
        { without("chain_seq") .. "\n", 1, "the field chain_seq is missing" },
        { with("row_hash", cjson.null) .. "\n", 1, "the field row_hash is missing" },
        { with("id", tostring(row.id)) .. "\n", 1, "the field id must be a whole number >= 1" },
        { with("id", row.id + 0.5) .. "\n", 1, "the field id must be a whole number >= 1" },
        { with("id", -row.id) .. "\n", 1, "the field id must be a whole number >= 1" },
        { (with("id", 1):gsub('"id":1', '"id":1e400')) .. "\n", 1, "the field id must be a whole number >= 1" },
        { with("chain_seq", 0) .. "\n", 1, "the field chain_seq must be a whole number >= 1" },
        { with("network_class", 7) .. "\n", 1, "the field network_class must be a string of valid UTF-8 without NUL" },
        { with("network_class", "a\0b") .. "\n", 1, "the field network_class must be a string of valid UTF-8 without NUL" },
        { (with("network_class", "ZZ"):gsub("ZZ", "\255")) .. "\n", 1, "the field network_class must be a string of valid UTF-8 without NUL" },
        { first .. " trailing\n", 1, "not JSON (byte " .. (#first + 2) .. ": text after the value)" },
        -- what cjson reads but JSON is not, in a compared field or one stepped over
        { (first:gsub('"id":%d+', '"id":0x' .. string.format("%x", row.id))) .. "\n", 1, "not JSON (byte " },
        { (first:gsub("^{", '{"detail_x":0x10,')) .. "\n", 1, "not JSON (byte 14: ',' or '}' expected)" },
        { (first:gsub("^{", '{"detail_x":[1,,2],')) .. "\n", 1, "not JSON (byte 16: a value expected)" },
        { (first:gsub("^{", '{"detail_x":"a\tb",')) .. "\n", 1, "not JSON (byte 15: a raw control character in a string)" },
        { (first:gsub("^{", '{"detail_x":"\\q",')) .. "\n", 1, "not JSON (byte 14: an escape JSON does not have)" },
        { (first:gsub("^{", '{"detail_x":007,')) .. "\n", 1, "not JSON (byte 13: a number with a leading zero)" },
        { (first:gsub("^{", '{"detail_x":NaN,')) .. "\n", 1, "not JSON (byte 13: a value expected)" },
        { (first:gsub("^{", '{"detail_x":"\\ud800",')) .. "\n", 1, "not JSON (byte 14: a high surrogate escape without its low one)" },
        { (first:gsub("^{", '{"id":1,')) .. "\n", 1, "the field id is there twice" },
        { with("row_hash", row.row_hash:sub(2)) .. "\n", 1, "the field row_hash must be 64 hex digits" },
        { with("row_hash", row.row_hash:upper()) .. "\n", 1, "the field row_hash must be 64 hex digits" },
        { with("row_hash", { row.row_hash }) .. "\n", 1, "the field row_hash must be 64 hex digits" },
        { string.rep("[", 5000) .. "\n", 1, "not a JSON object" },
        { "\0\1\2\n", 1, "not a JSON object" },
      }
      for i, c in ipairs(cases) do
        common.write(dir .. "/bad.jsonl", c[1])
        local report = compare(s, dir .. "/bad.jsonl")
        assert.is_false(report.ok, "case " .. i .. " passed")
        local err = report.unusable
        assert.is_table(err, "case " .. i)
        assert.equals("bad_export", err.kind, "case " .. i .. ": " .. tostring(err.message))
        assert.equals(c[2], err.line, "case " .. i)
        assert.matches("line " .. c[2] .. ": " .. c[3], err.message, 1, true)
        -- the complete lines before it were compared
        assert.equals(c[2] - 1, report.compared, "case " .. i)
      end
      -- a detail nested past any decoder's depth (the runtime role writes
      -- details) is stepped over, not decoded
      local deep = cjson.decode(first)
      deep.detail = "DEEP"
      common.write(dir .. "/deep.jsonl", (cjson.encode(deep):gsub('"DEEP"', string.rep("[", 100000)
        .. string.rep("]", 100000))) .. "\n")
      local deep_report = compare(s, dir .. "/deep.jsonl")
      assert.is_nil(deep_report.unusable)
      assert.is_true(deep_report.ok)
      -- a line longer than the bound is refused, read a chunk at a time
      -- (never whole); a real row that spans many chunks is compared
      local max = against.MAX_LINE
      against.MAX_LINE = 3 * against.CHUNK
      local ok, err = pcall(function()
        common.write(dir .. "/long.jsonl", first .. "\n" .. string.rep("x", 10 * against.CHUNK))
        local long = compare(s, dir .. "/long.jsonl")
        assert.is_false(long.ok)
        assert.equals("line 2: longer than " .. against.MAX_LINE .. " bytes: not an audit export line",
          long.unusable.message)
        assert.equals(1, long.compared)
        local padded = cjson.decode(first)
        padded.detail = { padding = string.rep("y", 2 * against.CHUNK + 17) }
        common.write(dir .. "/padded.jsonl", cjson.encode(padded) .. "\r\n" .. first)
        local report = compare(s, dir .. "/padded.jsonl")
        assert.is_true(report.ok)
        assert.equals(2, report.lines)
      end)
      against.MAX_LINE = max
      assert(ok, err)
      -- an empty file: nothing to compare
      common.write(dir .. "/empty.jsonl", "")
      local report = compare(s, dir .. "/empty.jsonl")
      assert.is_true(report.ok)
      assert.equals(0, report.compared)
    end)
  end)
end)

describe("the states against the audit trail", function()
  local requests, ids
  local CHAIN, MANUAL, UNKNOWN, FAIL = "spec_audit_st_chain", "spec_audit_st_manual", "spec_audit_st_unknown",
    "spec_audit_st_fail"

  -- every node and request of the requests `list`
  local function rows_of(list)
    local out = {}
    for _, id in ipairs(list) do
      out[#out + 1] = id
      for _, n in ipairs(s:query("SELECT id FROM movement_request_nodes WHERE request_id = $1::uuid", id)) do
        out[#out + 1] = n.id
      end
    end
    return out
  end

  local function done(id, states)
    return function(x)
      local st = sup.request(x, id).request_state
      for _, want in ipairs(states) do if st == want then return true end end
      return false
    end
  end

  setup(function()
    sup = require "spec.lua.support.engine"
    requests = require "qtg.requests"
    s = qtg.db.acquire()
    sup.load_doc(s, sup.doc(CHAIN, {
      { "a", "action", "withdrawal", { sim = { observes = 0, side_effect = true } } },
      { "b", "observe", "cex_withdrawal_status", { sim = { observes = 2, retry_after_seconds = 0 } } },
    }, { { "a", "b" } }))
    sup.load_doc(s, sup.doc(MANUAL, {
      { "a", "action", "withdrawal", { sim = { observes = 0 } } },
      { "m", "manual", "manual_confirmation", { required_inputs = { "desk_reference" } } },
    }, { { "a", "m" } }))
    sup.load_doc(s, sup.doc(UNKNOWN, {
      { "a", "action", "withdrawal", { sim = { observes = 0, side_effect = true } } },
      { "b", "observe", "cex_withdrawal_status", { sim = { unknown_at_observe = 1, retry_after_seconds = 0 } } },
    }, { { "a", "b" } }))
    sup.load_doc(s, sup.doc(FAIL, { { "a", "action", "withdrawal", { sim = { fail = "submit" } } } }))
    sup.park_others(s)
    ids = {}
  end)
  teardown(function() s:release() end)

  it("names no node or request the engine moved, while their audit rows wait for promotion and after", function()
    local function made(req) ids[#ids + 1] = req.id return req end
    -- run to completion, through SUBMITTED and OBSERVING
    local done_req = made(sup.create_approved(s, CHAIN))
    -- a quorum of two: the first vote (request.approval) names no state
    made(sup.create_approved(s, CHAIN, { intent = { asset = "USDC", amount = "150000.00" } }))
    -- a manual step, completed by another operator
    local manual = made(sup.create_approved(s, MANUAL))
    -- UNKNOWN after a side effect: MANUAL_INTERVENTION, resumed
    local unknown = made(sup.create_approved(s, UNKNOWN))
    -- FAILED, retried, FAILED again
    local failing = made(sup.create_approved(s, FAIL))
    -- rejected, cancelled, expired
    local rejected = made(sup.create(s, CHAIN))
    local cancelled = made(sup.create_approved(s, CHAIN))
    local expired = made(sup.create(s, CHAIN))
    requests.reject(s, rejected.id, sup.ACTOR, "spec")
    requests.cancel(s, cancelled.id, sup.ACTOR, "spec")
    s:query("UPDATE movement_requests SET expires_at = now() - interval '1 second' WHERE id = $1::uuid", expired.id)
    sup.tick("expiration_checker")
    assert.equals("EXPIRED", sup.request(s, expired.id).request_state)
    assert.is_true(sup.drive(s, function(x)
      return done(done_req.id, { "COMPLETED" })(x) and done(manual.id, { "WAITING_MANUAL_ACTION" })(x)
        and done(unknown.id, { "MANUAL_INTERVENTION" })(x) and done(failing.id, { "FAILED" })(x)
    end, 30))
    requests.complete_manual_step(s, sup.nodes(s, manual.id).m.id, sup.ACTOR, { desk_reference = "DESK-1" })
    requests.resume(s, unknown.id, sup.ACTOR)
    requests.retry(s, sup.nodes(s, failing.id).a.id, sup.ACTOR)
    assert.is_true(sup.drive(s, done(failing.id, { "FAILED" }), 20))
    assert.is_true(sup.drive(s, done(unknown.id, { "COMPLETED", "MANUAL_INTERVENTION" }), 20))
    local pending = s:query("SELECT count(*)::int AS n FROM audit_outbox WHERE request_id = ANY ($1::uuid[])",
      "{" .. table.concat(ids, ",") .. "}")[1].n
    assert.is_true(pending > 20, "the audit rows are still to promote")
    local report = audit_states.check_states(s, 100000)
    assert.same({}, mismatched(report, rows_of(ids)))
    repeat until promoter.promote(s, 500) == 0
    report = audit_states.check_states(s, 100000)
    assert.same({}, mismatched(report, rows_of(ids)))
    assert.is_true(report.checked.node >= 2 * #ids and report.checked.request >= #ids)
  end)

  it("names a node and a request the runtime role moved without an audit row", function()
    local req = sup.create_approved(s, CHAIN)
    local node = sup.nodes(s, req.id).a
    local other = sup.create(s, CHAIN)
    local blocked = sup.nodes(s, other.id).a
    repeat until promoter.promote(s, 500) == 0
    local last = s:query([[SELECT id, outbox_id FROM audit_events WHERE entity_id = $1 ORDER BY id DESC LIMIT 1]],
      node.id)[1]
    local last_req = s:query([[SELECT id FROM audit_events WHERE entity_id = $1 AND action = 'request.approve']],
      req.id)[1]
    s:begin()
    s:exec("SET LOCAL ROLE qtg_runtime")
    s:query("UPDATE movement_request_nodes SET node_state = 'COMPLETED' WHERE id = $1::uuid", node.id)
    s:query("UPDATE movement_request_nodes SET node_state = 'CANCELLED' WHERE id = $1::uuid", blocked.id)
    s:query("UPDATE movement_requests SET request_state = 'CANCELLED' WHERE id = $1::uuid", req.id)
    s:exec("RESET ROLE")
    local ok, report = pcall(audit_states.check_states, s, 100000)
    local ok1, one = pcall(audit_states.check_states, s, 1)
    s:rollback()
    assert(ok, report)
    assert(ok1, one)
    assert.is_false(report.ok)
    local found = mismatched(report, { node.id, blocked.id, req.id })
    table.sort(found, function(a, b) return a.id < b.id end)
    local want = {
      { kind = "node", id = node.id, request_id = req.id, node_key = "a", state = "COMPLETED", audited = "READY",
        event_id = last.id, outbox_id = last.outbox_id },
      { kind = "node", id = blocked.id, request_id = other.id, node_key = "a", state = "CANCELLED" },
      { kind = "request", id = req.id, request_id = req.id, state = "CANCELLED", audited = "APPROVED",
        event_id = last_req.id, outbox_id = s:query("SELECT outbox_id FROM audit_events WHERE id = $1",
          last_req.id)[1].outbox_id },
    }
    table.sort(want, function(a, b) return a.id < b.id end)
    assert.same(want, found)
    -- every one is counted, up to `limit` of each kind listed: the most
    -- recently updated first
    assert.equals(report.count, one.count)
    assert.is_true(one.mismatched.node >= 2 and one.mismatched.request >= 1)
    assert.equals(2, #one.mismatches)
    assert.equals(report.checked.node, one.checked.node)
  end)

  -- A change made without its row, then followed by the engine's own rows:
  -- the state at the end was audited, the step to it was not.  A request
  -- nobody approved ran to COMPLETED, and verify passed.
  it("names a request set APPROVED by hand and then run by the engine, and a node retried by hand", function()
    local req = sup.create(s, CHAIN)
    local failing = sup.create_approved(s, FAIL)
    assert.is_true(sup.drive(s, done(failing.id, { "FAILED" }), 20))
    local a = sup.nodes(s, failing.id).a
    s:begin()
    s:exec("SET LOCAL ROLE qtg_runtime")
    s:query("UPDATE movement_requests SET request_state = 'APPROVED' WHERE id = $1::uuid", req.id)
    s:query("UPDATE movement_request_nodes SET node_state = 'READY' WHERE request_id = $1::uuid AND node_key = 'a'",
      req.id)
    s:query("UPDATE movement_requests SET request_state = 'EXECUTING', finished_at = NULL WHERE id = $1::uuid",
      failing.id)
    s:query("UPDATE movement_request_nodes SET node_state = 'READY' WHERE id = $1::uuid", a.id)
    s:exec("RESET ROLE")
    s:commit()
    assert.is_true(sup.drive(s, function(x)
      return done(req.id, { "COMPLETED" })(x) and done(failing.id, { "FAILED" })(x)
    end, 30))
    assert.equals(2, sup.nodes(s, failing.id).a.attempt_no)      -- submitted again, with no retry row
    local report = audit_states.check_states(s, 100000)
    local by_id = {}
    for _, m in ipairs(mismatched(report, rows_of({ req.id, failing.id }))) do by_id[m.id] = m end
    -- each ends in the state its last row names: only the gap gives them away
    local r = assert(by_id[req.id], "the request set APPROVED by hand is not named")
    assert.equals(r.state, r.audited)
    assert.same({ "request.executing", "APPROVED", "PENDING_APPROVAL" }, { r.gap.action, r.gap.from_state, r.gap.before })
    local n = assert(by_id[sup.nodes(s, req.id).a.id], "its node, made READY by hand, is not named")
    assert.is_nil(n.gap.before)                 -- its first row does not leave BLOCKED
    assert.equals("READY", n.gap.from_state)
    local f = assert(by_id[failing.id], "the request put back to EXECUTING by hand is not named")
    assert.same({ "FAILED", "EXECUTING" }, { f.gap.before, f.gap.from_state })
    local fa = assert(by_id[a.id], "the node put back to READY by hand is not named")
    assert.same({ "FAILED", "READY" }, { fa.gap.before, fa.gap.from_state })
  end)

  -- A request the runtime role wrote in whole, APPROVED with READY nodes:
  -- no row of its creation, and the engine ran it.
  it("names a request inserted by hand, whose first audit row is not its creation", function()
    local req = sup.create(s, CHAIN)
    s:begin()
    s:exec("SET LOCAL ROLE qtg_runtime")
    local ghost = s:query([[INSERT INTO movement_requests SELECT (jsonb_populate_record(r, jsonb_build_object(
        'id', gen_random_uuid(), 'idempotency_key', 'ghost-' || r.id, 'request_state', 'APPROVED'))).*
        FROM movement_requests r WHERE r.id = $1::uuid RETURNING id::text]], req.id)[1].id
    s:query([[INSERT INTO movement_request_nodes SELECT (jsonb_populate_record(n, jsonb_build_object(
        'id', gen_random_uuid(), 'request_id', $2::uuid, 'node_state', CASE n.node_key WHEN 'a' THEN 'READY'
        ELSE 'BLOCKED' END))).* FROM movement_request_nodes n WHERE n.request_id = $1::uuid]], req.id, ghost)
    s:exec("RESET ROLE")
    s:commit()
    assert.is_true(sup.drive(s, done(ghost, { "COMPLETED" }), 30))
    local m = mismatched(audit_states.check_states(s, 100000), { ghost })[1]
    assert.is_table(m, "the request inserted by hand is not named")
    assert.equals("COMPLETED", m.state)
    assert.is_nil(m.gap.before)
    assert.equals("request.executing", m.gap.action)
  end)

  it("compares a change whose audit row is not promoted yet with that row", function()
    local req = sup.create_approved(s, CHAIN)
    local node = sup.nodes(s, req.id).a
    local row = s:query([[SELECT id FROM audit_outbox WHERE entity_id = $1 AND action = 'node.ready']], node.id)[1]
    assert.is_truthy(row, "the node's READY row waits in the outbox")
    assert.same({}, mismatched(audit_states.check_states(s, 100000), { node.id, req.id }))
    s:begin()
    s:exec("SET LOCAL ROLE qtg_runtime")
    s:query("UPDATE movement_request_nodes SET node_state = 'SUBMITTED' WHERE id = $1::uuid", node.id)
    s:exec("RESET ROLE")
    local ok, report = pcall(audit_states.check_states, s, 100000)
    s:rollback()
    assert(ok, report)
    assert.same({ { kind = "node", id = node.id, request_id = req.id, node_key = "a", state = "SUBMITTED",
                    audited = "READY", outbox_id = row.id } }, mismatched(report, { node.id, req.id }))
    repeat until promoter.promote(s, 500) == 0
  end)
end)

-- `qtgd audit verify` on a database of its own, with a history the engine
-- wrote (a child qtgd), tampered with as the owner and as the runtime role
-- by psql and committed, as a real attacker would leave it.
describe("qtgd audit verify, on a database of its own", function()
  local db, url, dir
  local CHILD = [[
local root = ...
package.path = root .. "/?.lua;" .. package.path
local qtg = require "qtg"
local sup = require "spec.lua.support.engine"
local outbox = require "qtg.outbox"
local promoter = require "qtg.workers.audit_outbox_promoter"
local s = qtg.db.acquire()
sup.load_doc(s, sup.doc("spec_audit_own", { { "a", "action", "withdrawal", { sim = { observes = 1 } } } }))
local ids = {}
for i = 1, 3 do ids[i] = sup.create_approved(s, "spec_audit_own", { intent = { asset = "USDC", amount = tostring(i) } }).id end
assert(sup.drive(s, function(x)
  for _, id in ipairs(ids) do if sup.request(x, id).request_state ~= "COMPLETED" then return false end end
  return true
end, 30), "the requests did not complete")
local waiting = sup.create(s, "spec_audit_own")
-- the newest rows of the chain of rows about no request
for i = 1, 3 do outbox.audit(s, "system:spec", "spec.note", "spec", tostring(i), nil, {}) end
repeat until promoter.promote(s, 500) == 0
io.stdout:write("waiting=", waiting.id, "\n")
return 0]]

  local function psql(sql) return common.psql(url, sql) end
  local function audit_cmd(...)
    local args = { q(support.bin), "audit", ... }
    return support.run(support.base_env({ MG_DATABASE_URL = url, MG_DB_STATEMENT_TIMEOUT_SECONDS = "0.001" }), args)
  end
  local function export(name)
    local path = dir .. "/" .. name
    -- stdout alone into the file: what the command says on stderr stays in `out`
    local rc, out = support.run(support.base_env({ MG_DATABASE_URL = url }),
      { "sh", "-c", q(q(support.bin) .. " audit export >" .. q(path)) })
    assert(rc == 0, out)
    return path
  end
  -- the line of the export at path holding row id
  local function line_of(path, id)
    local n = 0
    for l in io.lines(path) do
      n = n + 1
      if cjson.decode(l).id == id then return n end
    end
  end

  local waiting
  setup(function()
    s = qtg.db.acquire()
    dir = support.tmpdir()
    local out
    url, db, out = support.own_database(s, "qtg_audit", dir, CHILD)
    waiting = out:match("waiting=([%x%-]+)")
  end)
  teardown(function()
    support.drop_database(s, db)
    s:release()
    os.execute("rm -rf " .. q(dir))
  end)

  it("holds on the engine's history, and compares it with its export", function()
    -- a whole trail's walk is not held to a worker's statement bound
    local rc, out = audit_cmd("verify")
    assert.equals(0, rc, out)
    assert.matches("audit verify: ok, %d+ rows checked, every chain holds\n", out)
    assert.matches("audit verify: ok, 4 nodes and 4 requests are in the state their last audit row names\n", out)
    local e1 = export("e1.jsonl")
    local n = tonumber(psql("SELECT count(*) FROM audit_events"):match("%d+"))
    rc, out = audit_cmd("verify", "--against", q(e1))
    assert.equals(0, rc, out)
    assert.matches(("audit verify: ok, %d rows of %s compared, each still in the database as exported\n")
      :format(n, e1), out, 1, true)
    local since = tonumber(psql("SELECT id FROM audit_events ORDER BY id OFFSET 3 LIMIT 1"):match("%d+"))
    rc, out = audit_cmd("verify", "--since", tostring(since), "--against", q(e1))
    assert.equals(0, rc, out)
    assert.matches(("audit verify: ok, %d rows of %s compared (3 below --since passed over)"):format(n - 3, e1),
      out, 1, true)
    rc, out = support.run(support.base_env({ MG_DATABASE_URL = url }),
      { q(support.bin), "audit", "verify", "--against", "-", "<" .. q(e1) })
    assert.equals(0, rc, out)
    assert.matches(("%d rows of standard input compared"):format(n), out, 1, true)
  end)

  it("exits 1 against an export when the owner cut a chain's tail and moved its head back; verify alone passes", function()
    local e1 = export("before-cut.jsonl")
    local gone = psql("SELECT id || ' ' || chain_seq FROM audit_events WHERE network_class = '' "
      .. "ORDER BY chain_seq DESC OFFSET 1 LIMIT 1")
    local id, place = gone:match("^(%d+) (%d+)")
    psql("SELECT set_config('spec.chain', '', false); ALTER TABLE audit_events DISABLE TRIGGER USER; "
      .. CUT_TAIL:format(2) .. "; ALTER TABLE audit_events ENABLE TRIGGER USER")
    local rc, out = audit_cmd("verify")
    assert.equals(0, rc, out)
    rc, out = audit_cmd("verify", "--against", q(e1))
    assert.equals(1, rc, out)
    assert.matches("audit verify: ok, %d+ rows checked, every chain holds\n", out)
    assert.matches(("audit verify: DIFFERS from %s at line %d: row %s (chain \"\", place %s): the chain ends at "
      .. "place %d in the database, before this row of the export: its newest rows were deleted "
      .. "(chain_ends_earlier)\n"):format(e1, line_of(e1, tonumber(id)), id, place, tonumber(place) - 1), out, 1, true)
  end)

  it("exits 1 against an export when the owner rewrote and re-hashed a whole chain; verify alone passes", function()
    local e2 = export("before-rehash.jsonl")
    local class = psql("SELECT network_class FROM movement_requests LIMIT 1"):match("^(%S+)")
    local first = psql(("SELECT id FROM audit_events WHERE network_class = '%s' AND chain_seq = 1"):format(class))
      :match("%d+")
    psql(("SELECT set_config('spec.chain', '%s', false); ALTER TABLE audit_events DISABLE TRIGGER USER; "):format(class)
      .. REHASH .. "; ALTER TABLE audit_events ENABLE TRIGGER USER")
    local rc, out = audit_cmd("verify")
    assert.equals(0, rc, out)
    rc, out = audit_cmd("verify", "--against", q(e2))
    assert.equals(1, rc, out)
    assert.matches(("audit verify: DIFFERS from %s at line %d: row %s (chain %q, place 1): its row_hash is "):format(
      e2, line_of(e2, tonumber(first)), first, class), out, 1, true)
    assert.matches("was rewritten (changed)\n", out, 1, true)
  end)

  it("exits 1 against another database's export, 2 for a file that is not an export or cannot be read", function()
    local path = dir .. "/shared.jsonl"
    local f = assert(io.open(path, "wb"))
    audit.export(s, nil, function(line) f:write(line, "\n") end)
    f:close()
    local rc, out = audit_cmd("verify", "--against", q(path))
    assert.equals(1, rc, out)
    assert.matches(("audit verify: DIFFERS from %s at line 1: row "):format(path), out, 1, true)
    for _, c in ipairs({
      { "garbage.jsonl", "not json\n", "qtgd audit verify: %s is not an audit export: line 1: not a JSON object" },
      { "missing.jsonl", '{"id": 1, "network_class": "", "chain_seq": 1}\n',
        "qtgd audit verify: %s is not an audit export: line 1: the field row_hash is missing" },
    }) do
      common.write(dir .. "/" .. c[1], c[2])
      rc, out = audit_cmd("verify", "--against", q(dir .. "/" .. c[1]))
      assert.equals(2, rc, out)
      assert.matches(c[3]:format(dir .. "/" .. c[1]), out, 1, true)
      -- the other checks are still said; the comparison says where it ended
      assert.matches("compared before line 1, which ends the comparison", out, 1, true)
      assert.matches("every chain holds", out, 1, true)
      assert.not_matches("each still in the database as exported", out, 1, true)
    end
    rc, out = audit_cmd("verify", "--against", q(dir .. "/no-such-file"))
    assert.equals(2, rc, out)
    assert.matches("qtgd audit verify: cannot read the export: " .. dir .. "/no-such-file: No such file", out, 1, true)
    rc, out = audit_cmd("verify", "--against", q(dir))
    assert.equals(2, rc, out)
    assert.matches("qtgd audit verify: cannot read the export " .. dir .. ": Is a directory", out, 1, true)
    common.write(dir .. "/empty.jsonl", "")
    rc, out = audit_cmd("verify", "--against", q(dir .. "/empty.jsonl"))
    assert.equals(0, rc, out)
    assert.matches("audit verify: ok, 0 rows of " .. dir .. "/empty.jsonl compared", out, 1, true)
  end)

  it("exits 1 naming the node and the request the runtime role moved without an audit row", function()
    local node = psql(("SELECT id FROM movement_request_nodes WHERE request_id = '%s'"):format(waiting)):match("%S+")
    psql(("SET ROLE qtg_runtime; UPDATE movement_request_nodes SET node_state = 'CANCELLED' WHERE id = '%s'; "
      .. "UPDATE movement_requests SET request_state = 'CANCELLED' WHERE id = '%s'"):format(node, waiting))
    local rc, out = audit_cmd("verify")
    assert.equals(1, rc, out)
    assert.matches("audit verify: ok, %d+ rows checked, every chain holds\n", out)
    assert.matches("audit verify: UNAUDITED STATE: 1 of 4 nodes and 1 of 4 requests are not in the state their "
      .. "last audit row names", out, 1, true)
    assert.matches(("\n  node %s (a of request %s) is CANCELLED; no audit row changed its state (it would be "
      .. "BLOCKED)\n"):format(node, waiting), out, 1, true)
    local create = psql(("SELECT id FROM audit_events WHERE entity_id = '%s' AND action = 'request.create'"):format(
      waiting)):match("%d+")
    assert.matches(("\n  request %s is CANCELLED; its last audit row (row %s) says PENDING_APPROVAL\n"):format(
      waiting, create), out, 1, true)
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
