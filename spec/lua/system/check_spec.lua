-- `qtgd check` (lua/qtg/cli/check.lua): a healthy deployment passes, and each
-- broken case fails with a message that names what is wrong -- a setting
-- that does not parse, a misspelt setting, a database that is down, an
-- unapplied or edited migration, a broken template, a broken policy script.
-- Each case runs the real `qtgd check` as a child process against real
-- PostgreSQL: the test runner's database, or a scratch database made here
-- (and dropped afterwards) for the migration cases.
local qtg = require "qtg"
local cjson = require "cjson"

local sup -- spec/lua/support/host.lua

local common = require "spec.lua.support.common"
local q = common.quote

-- Run `qtgd check ARGS` with the base environment plus `env`.
-- (under `timeout 120`: a check that never ends fails its case, not the run)
local function check(env, args)
  local e = sup.base_env(env)
  local rc, out = sup.run(e, { "timeout", "120", q(sup.bin), "check", args or "" })
  return rc, out
end

local function line_of(out, level, area)
  for line in out:gmatch("[^\n]+") do
    if line:match("^" .. level:gsub("%p", "%%%0") .. "%s+" .. area .. "%s") then return line end
  end
end

local function lines_of(out, level, area)
  local found = {}
  for line in out:gmatch("[^\n]+") do
    if line:match("^" .. level .. "%s+" .. area .. "%s") then found[#found + 1] = line end
  end
  return found
end

local tmp, tdir

local function template_doc(key)
  return {
    template_key = key, name = "check spec template",
    intent = { required = { "asset", "amount" } },
    nodes = {
      { key = "withdraw", kind = "action", action_type = "withdrawal",
        config = { sim = { observes = 0 } } },
      { key = "status", kind = "observe", action_type = "cex_withdrawal_status",
        config = { withdrawal_id = "$ref:withdraw.withdrawal_id" } },
    },
    edges = { { from = "withdraw", to = "status" } },
  }
end

describe("qtgd check", function()
  local key
  setup(function()
    sup = require "spec.lua.support.host"
    tmp = sup.tmpdir()
    tdir = tmp .. "/templates"
    key = "check_spec_" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
    sup.write(tdir .. "/" .. key .. ".json", cjson.encode(template_doc(key)))
    -- load it, so the healthy case has its templates current
    local rc, out = sup.run(sup.base_env(), { q(sup.bin), "templates", "load", q(tdir) })
    assert.equals(0, rc, out)
  end)
  teardown(function()
    sup.stop_all()
    if tmp then os.execute("rm -rf " .. q(tmp)) end
  end)

  it("passes on a healthy deployment, with one ok line per area", function()
    local rc, out = check({}, "--templates " .. q(tdir))
    assert.equals(0, rc, out)
    for _, area in ipairs({ "settings", "database", "migrations", "templates", "policies" }) do
      assert.is_truthy(line_of(out, "ok", area), "no ok line for " .. area .. " in:\n" .. out)
    end
    assert.matches("1 template valid in " .. tdir, out, 1, true)
    assert.is_nil(line_of(out, "warn", "templates"), out) -- loaded and current
    assert.matches("qtgd check: ok", out, 1, true)
    assert.is_nil(out:find("FAIL", 1, true), out)
  end)

  -- The observer sweeps EXECUTING requests only: a request in another state
  -- with a node in flight (FAILED beside a sibling in flight before the
  -- engine held such requests EXECUTING, or a row changed by hand) has a
  -- payment out that nothing watches.
  it("warns about nodes in flight whose request is not EXECUTING, naming the requests", function()
    local eng = require "spec.lua.support.engine"
    local class = "check-flight-" .. qtg.crypto.hex(qtg.crypto.random_bytes(3))
    local id = sup.with_session(function(s)
      local req = eng.create_approved(s, key, { network_class = class })
      s:query("UPDATE movement_requests SET request_state = 'EXECUTING' WHERE id = $1::uuid", req.id)
      s:query([[UPDATE movement_request_nodes SET node_state = 'SUBMITTED'
                WHERE request_id = $1::uuid AND node_key = 'withdraw']], req.id)
      s:query("UPDATE movement_requests SET request_state = 'FAILED' WHERE id = $1::uuid", req.id)
      return req.id
    end)
    local rc, out = check({ MG_NETWORK_CLASS = class }, "--templates " .. q(tdir))
    assert.equals(0, rc, out)
    local l = line_of(out, "warn", "in flight")
    assert.is_truthy(l, out)
    assert.matches("nodes in flight that nothing observes, their requests not EXECUTING: " .. id
      .. " (FAILED; withdraw SUBMITTED): `resume` it: the observer watches the node, nothing is submitted again",
      l, 1, true)
    rc, out = check({ MG_NETWORK_CLASS = class }, "--strict --templates " .. q(tdir))
    assert.equals(1, rc, out)
    -- another class's deployment does not see them; an EXECUTING request's are observed
    rc, out = check({ MG_NETWORK_CLASS = class .. "-other" }, "--templates " .. q(tdir))
    assert.is_truthy(line_of(out, "ok", "in flight"), out)
    sup.with_session(function(s)
      s:query("UPDATE movement_requests SET request_state = 'EXECUTING' WHERE id = $1::uuid", id)
    end)
    rc, out = check({ MG_NETWORK_CLASS = class }, "--templates " .. q(tdir))
    assert.is_truthy(line_of(out, "ok", "in flight"), out)
    sup.with_session(function(s)
      s:query("UPDATE movement_request_nodes SET node_state = 'FAILED' WHERE request_id = $1::uuid"
        .. " AND node_key = 'withdraw'", id)
      s:query("UPDATE movement_requests SET request_state = 'FAILED' WHERE id = $1::uuid", id)
    end)
  end)

  it("refuses a setting that does not parse, naming it (qtgd exits 2 before any check)", function()
    local rc, out = check({ MG_NODE_OBSERVE_INTERVAL_SECONDS = "soon" })
    assert.equals(2, rc, out)
    assert.matches('MG_NODE_OBSERVE_INTERVAL_SECONDS="soon" is invalid', out, 1, true)
    rc, out = check({ MG_DB_POOL_SIZE = "0" })
    assert.equals(2, rc, out)
    assert.matches("MG_DB_POOL_SIZE", out, 1, true)
  end)

  it("fails on a misspelt MG_ variable, suggesting the setting", function()
    local rc, out = check({ MG_NODE_DISPATCH_INTERVAL = "1" }, "--templates " .. q(tdir))
    assert.equals(1, rc, out)
    local l = line_of(out, "FAIL", "settings")
    assert.is_truthy(l, out)
    assert.matches("MG_NODE_DISPATCH_INTERVAL is not a qtg setting (did you mean MG_NODE_DISPATCH_INTERVAL_SECONDS?)",
      l, 1, true)
    assert.matches("qtgd check: FAILED (1 failure", out, 1, true)
  end)

  it("fails on directories that do not exist and a console socket it cannot create", function()
    sup.write(tmp .. "/a-file", "not a directory\n")
    local rc, out = check({ MG_LUA_PATH = tmp .. "/no-such-dir", MG_CONSOLE_ENABLED = "true",
                            MG_RUN_DIR = tmp .. "/a-file/run" }, "--templates " .. q(tdir))
    assert.equals(1, rc, out)
    local fails = lines_of(out, "FAIL", "settings")
    assert.equals(2, #fails, out)
    assert.matches("MG_LUA_PATH=" .. tmp .. "/no-such-dir is not a directory", out, 1, true)
    assert.matches("the console socket " .. tmp .. "/a-file/run/console.sock (from MG_RUN_DIR) cannot be created: "
      .. tmp .. "/a-file is not a directory", out, 1, true)
  end)

  it("fails when the database is down, and says the migrations were not checked", function()
    local rc, out = check({ MG_DATABASE_URL = "postgresql://qtg:hunter2@/qtg?host=" .. tmp .. "/no-server&port=5432" },
      "--templates " .. q(tdir))
    assert.equals(1, rc, out)
    local l = line_of(out, "FAIL", "database")
    assert.is_truthy(l, out)
    assert.matches("cannot connect to PostgreSQL (MG_DATABASE_URL=postgresql://qtg:***@/qtg?host=", l, 1, true)
    assert.is_nil(out:find("hunter2", 1, true), "the password leaked:\n" .. out)
    assert.matches(tmp .. "/no-server", l, 1, true) -- libpq's own reason, with the socket path
    assert.matches("not checked: no database", line_of(out, "FAIL", "migrations"), 1, true)
    -- what does not need the database is still checked
    assert.is_truthy(line_of(out, "ok", "templates"), out)
    assert.is_truthy(line_of(out, "ok", "policies"), out)
  end)

  it("gives up on a database that accepts the connection and never answers, after MG_CHECK_TIMEOUT_SECONDS", function()
    -- a real TCP listener on 127.0.0.1 that never accepts: the kernel
    -- completes the handshake, libpq waits for an answer that never comes
    local portfile = tmp .. "/silent.port"
    local pid = common.background(("python3 -c %s %s"):format(q([[
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(5)
open(sys.argv[1] + ".tmp", "w").write(str(s.getsockname()[1]))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)]]), q(portfile)), "/dev/null")
    local port = sup.eventually(function() return sup.read(portfile) end, 20)
    assert.is_truthy(port, "the silent listener did not start")
    local t0 = qtg.monotonic()
    local rc, out = check({ MG_DATABASE_URL = "postgresql://qtg@127.0.0.1:" .. port .. "/qtg",
                            MG_CHECK_TIMEOUT_SECONDS = "1" }, "--templates " .. q(tdir))
    local took = qtg.monotonic() - t0
    os.execute("kill " .. pid .. " 2>/dev/null")
    assert.equals(1, rc, out)
    assert.matches("no answer within 1 s (MG_CHECK_TIMEOUT_SECONDS)", line_of(out, "FAIL", "database"), 1, true)
    assert.is_true(took < 15, "qtgd check took " .. took .. " s")
  end)

  describe("migrations (on a scratch database)", function()
    local s, db, url
    setup(function()
      s = qtg.db.acquire()
      db = "qtg_check_" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
      s:exec("CREATE DATABASE " .. db)
      url = common.database_url(db)
    end)
    teardown(function()
      s:exec("DROP DATABASE IF EXISTS " .. db .. " WITH (FORCE)")
      s:release()
    end)

    it("fails before `qtgd migrate`, passes after, and fails again when one is missing or edited", function()
      local rc, out = check({ MG_DATABASE_URL = url }, "--templates " .. q(tdir))
      assert.equals(1, rc, out)
      local l = line_of(out, "FAIL", "migrations")
      assert.matches("migrations not applied (0001_core.sql", l, 1, true)
      assert.matches("run `qtgd migrate`", l, 1, true)

      -- migrations are not held to the workers' statement and lock bounds
      local mrc, mout = sup.run({ MG_DATABASE_URL = url, MG_CONSOLE_ENABLED = "false",
                                  MG_DB_STATEMENT_TIMEOUT_SECONDS = "0.001", MG_DB_LOCK_TIMEOUT_SECONDS = "0.001" },
                                { q(sup.bin), "migrate" })
      assert.equals(0, mrc, mout)
      rc, out = check({ MG_DATABASE_URL = url }, "--templates " .. q(tdir))
      assert.equals(0, rc, out)
      assert.matches("none pending", line_of(out, "ok", "migrations"), 1, true)
      -- a template not loaded in this database is a warning, not a failure
      assert.matches("not loaded: " .. key, line_of(out, "warn", "templates"), 1, true)
      rc, out = check({ MG_DATABASE_URL = url }, "--strict --templates " .. q(tdir))
      assert.equals(1, rc, out)

      -- API clients on keys any receiver of operator callbacks could compute
      local function psql(sql)
        local pipe = io.popen(("psql %s -At -c %s 2>&1"):format(q(url), q(sql)))
        local text = pipe:read("*a")
        pipe:close()
        return text
      end
      assert.is_nil(line_of(out, "warn", "api clients"), out) -- no client, nothing to say
      psql("INSERT INTO api_clients (name) VALUES ('desk-a'), ('desk-b')")
      rc, out = check({ MG_DATABASE_URL = url }, "--templates " .. q(tdir))
      assert.equals(0, rc, out)
      assert.matches("MG_CALLBACK_CLIENT_KEY_FILE is not set: the callback keys of 2 API clients",
        line_of(out, "warn", "api clients"), 1, true)
      local secret = tmp .. "/client.key"
      sup.write(secret, qtg.crypto.hex(qtg.crypto.random_bytes(32)) .. "\n")
      os.execute("chmod 600 " .. q(secret))
      rc, out = check({ MG_DATABASE_URL = url, MG_CALLBACK_CLIENT_KEY_FILE = secret }, "--templates " .. q(tdir))
      assert.equals(0, rc, out)
      assert.matches("2 API clients are still on a key derived from the callback key (c. key ids: desk-a, desk-b)",
        line_of(out, "warn", "api clients"), 1, true)
      psql("UPDATE api_clients SET key_scheme = 'm'")
      rc, out = check({ MG_DATABASE_URL = url, MG_CALLBACK_CLIENT_KEY_FILE = secret }, "--templates " .. q(tdir))
      assert.equals(0, rc, out)
      assert.matches("2 API clients, each on its own callback key", line_of(out, "ok", "api clients"), 1, true)
      psql("DELETE FROM api_clients")

      -- forget the last migration: it is reported by name
      local last
      local files = {}
      local p = io.popen("ls " .. q(sup.root .. "/sql"))
      for f in p:lines() do if f:match("%.sql$") then files[#files + 1] = f end end
      p:close()
      table.sort(files)
      last = files[#files]
      local probe = io.popen(("psql %s -At -c %s 2>&1"):format(q(url),
        q("DELETE FROM schema_migrations WHERE version = '" .. last .. "' RETURNING version")))
      local deleted = probe:read("*a")
      probe:close()
      assert.matches(last, deleted, 1, true)
      rc, out = check({ MG_DATABASE_URL = url }, "--templates " .. q(tdir))
      assert.equals(1, rc, out)
      assert.matches("1 migration not applied (" .. last .. ")", line_of(out, "FAIL", "migrations"), 1, true)

      -- an applied file whose checksum no longer matches
      probe = io.popen(("psql %s -At -c %s 2>&1"):format(q(url),
        q("INSERT INTO schema_migrations (version, checksum) VALUES ('" .. last .. "', 'edited') RETURNING version")))
      probe:read("*a")
      probe:close()
      rc, out = check({ MG_DATABASE_URL = url }, "--templates " .. q(tdir))
      assert.equals(1, rc, out)
      assert.matches("1 file changed after being applied: " .. last, line_of(out, "FAIL", "migrations"), 1, true)
    end)
  end)

  it("fails on a broken template, naming the file and the node", function()
    local bad = tmp .. "/bad-templates"
    local doc = template_doc("check_spec_broken")
    doc.edges = { { from = "withdraw", to = "nowhere" } }
    sup.write(bad .. "/broken.json", cjson.encode(doc))
    sup.write(bad .. "/garbled.json", "{ not json")
    sup.write(bad .. "/fine.json", cjson.encode(template_doc("check_spec_fine")))
    local rc, out = check({}, "--templates " .. q(bad))
    assert.equals(1, rc, out)
    local fails = table.concat(lines_of(out, "FAIL", "templates"), "\n")
    assert.matches(bad .. '/broken.json: edge #1: unknown node "nowhere"', fails, 1, true)
    assert.matches(bad .. "/garbled.json: not valid JSON", fails, 1, true)
    assert.is_nil(fails:find("fine.json", 1, true), out)
    assert.is_nil(line_of(out, "ok", "templates"), out)
    -- MG_TEMPLATES_DIR is the default directory
    rc, out = check({ MG_TEMPLATES_DIR = bad })
    assert.equals(1, rc, out)
    assert.matches(bad .. "/garbled.json: not valid JSON", out, 1, true)
    rc, out = check({}, "--templates " .. q(tmp .. "/empty-nothing"))
    assert.equals(1, rc, out)
    assert.matches("not a directory", line_of(out, "FAIL", "templates"), 1, true)
  end)

  it("fails on a policy script that does not compile, with its file and line", function()
    local over = tmp .. "/lua-syntax"
    sup.write(over .. "/qtg/workers/node_dispatcher.lua", "local M = {}\nfunction M.tick(s)\n  return 1 +\nend\nreturn M\n")
    local rc, out = check({ MG_LUA_PATH = over }, "--templates " .. q(tdir))
    assert.equals(1, rc, out)
    local l = line_of(out, "FAIL", "policies")
    assert.is_truthy(l, out)
    assert.matches(over .. "/qtg/workers/node_dispatcher.lua:4:", l, 1, true)
  end)

  -- ExecStartPre runs qtgd check: a policy that loops while it loads held
  -- it (and the unit's start) for good before.
  it("fails on a policy script that never finishes loading, after MG_TASK_BUSY_LIMIT_SECONDS, naming it", function()
    local over = tmp .. "/lua-spin"
    sup.write(over .. "/qtg/executors/sim.lua", "while true do pcall(function() while true do end end) end\n")
    local t0 = qtg.monotonic()
    local rc, out = check({ MG_LUA_PATH = over, MG_TASK_BUSY_LIMIT_SECONDS = "1" }, "--templates " .. q(tdir))
    assert.equals(1, rc, out)
    assert.is_true(qtg.monotonic() - t0 < 20, out)
    assert.matches('"msg":"a task held the loop past MG_TASK_BUSY_LIMIT_SECONDS: stopping it","task":"check",'
      .. '"where":"' .. over .. '/qtg/executors/sim.lua:1"', out, 1, true)
    assert.matches("busy: " .. over .. "/qtg/executors/sim.lua:1: held the loop longer than "
      .. "MG_TASK_BUSY_LIMIT_SECONDS (1 s): stopped", out, 1, true)
  end)

  it("fails on a policy script that raises while loading, or a worker without tick", function()
    local over = tmp .. "/lua-raise"
    sup.write(over .. "/qtg/executors/sim.lua", "error('sim adapter: missing venue table')\n")
    sup.write(over .. "/qtg/workers/node_observer.lua", "return { tock = function() return 0 end }\n")
    local rc, out = check({ MG_LUA_PATH = over }, "--templates " .. q(tdir))
    assert.equals(1, rc, out)
    local fails = table.concat(lines_of(out, "FAIL", "policies"), "\n")
    assert.matches("qtg.executors.sim: ", fails, 1, true)
    assert.matches("missing venue table", fails, 1, true)
    assert.matches("qtg.workers.node_observer (" .. over .. "/qtg/workers/node_observer.lua) must return a table with tick(session)",
      fails, 1, true)
    -- a working override is reported as such
    local good = tmp .. "/lua-good"
    local src = sup.read(sup.root .. "/lua/qtg/workers/node_recovery.lua")
    sup.write(good .. "/qtg/workers/node_recovery.lua", src)
    rc, out = check({ MG_LUA_PATH = good }, "--templates " .. q(tdir))
    assert.equals(0, rc, out)
    assert.matches("1 override from " .. good .. ": qtg.workers.node_recovery", line_of(out, "ok", "policies"), 1, true)
  end)

  it("fails on an approval policy that does not load or has a malformed rule", function()
    local over = tmp .. "/lua-approval"
    sup.write(over .. "/qtg/policies/approval.lua", [[
local P = require "qtg.approvals"
return { rules = { { name = "tiers", match = { amount_over = "5" }, action = P.allow() },
                   { name = "none", match = {}, action = P.require{ approvals = 0, roles = { "approve" } } } } }
]])
    local rc, out = check({ MG_LUA_PATH = over }, "--templates " .. q(tdir))
    assert.equals(1, rc, out)
    local fails = table.concat(lines_of(out, "FAIL", "policies"), "\n")
    assert.matches("rule 1 (tiers): unknown match key amount_over", fails, 1, true)
    assert.matches("rule 2 (none): require needs approvals", fails, 1, true)
    local broken = tmp .. "/lua-approval-raise"
    sup.write(broken .. "/qtg/policies/approval.lua", "error('no rules yet')\n")
    rc, out = check({ MG_LUA_PATH = broken }, "--templates " .. q(tdir))
    assert.equals(1, rc, out)
    assert.matches("qtg.policies.approval: ", line_of(out, "FAIL", "policies"), 1, true)
    assert.matches("no rules yet", line_of(out, "FAIL", "policies"), 1, true)
  end)

  it("fails on a policy module that does I/O while it loads", function()
    local over = tmp .. "/lua-io"
    sup.write(over .. "/qtg/executors/manual.lua", "local qtg = require 'qtg'\nqtg.sleep(0.01)\nreturn {}\n")
    local rc, out = check({ MG_LUA_PATH = over }, "--templates " .. q(tdir))
    assert.equals(1, rc, out)
    assert.matches("qtg.executors.manual: ", line_of(out, "FAIL", "policies"), 1, true)
  end)

  it("fails on an executor module that is not an adapter, as a reload refuses it", function()
    local over = tmp .. "/lua-garbage"
    sup.write(over .. "/qtg/executors/sim.lua", "return { submit = 'no' }\n")
    local rc, out = check({ MG_LUA_PATH = over }, "--templates " .. q(tdir))
    assert.equals(1, rc, out)
    assert.matches("qtg.executors.sim: submit must be a function (got string)", line_of(out, "FAIL", "policies"), 1, true)
  end)

  it("refuses unknown arguments with its usage", function()
    local rc, out = check({}, "--frobnicate")
    assert.equals(2, rc, out)
    assert.matches("unknown argument: --frobnicate", out, 1, true)
    assert.matches("usage: qtgd check", out, 1, true)
    rc, out = check({}, "--templates")
    assert.equals(2, rc, out)
    assert.matches("--templates needs a directory", out, 1, true)
  end)
end)

describe("qtg.cli.check helpers", function()
  local check_mod = require "qtg.cli.check"

  it("redacts passwords from database URLs", function()
    assert.equals("postgresql://qtg:***@db.example:5432/qtg",
      check_mod.redact("postgresql://qtg:s3cret@db.example:5432/qtg"))
    assert.equals("postgresql://qtg@/qtg?host=/x&password=***",
      check_mod.redact("postgresql://qtg@/qtg?host=/x&password=hunter2"))
    assert.equals("host=db user=qtg password=***", check_mod.redact("host=db user=qtg password=hunter2"))
  end)

  it("suggests the nearest setting name, and none for something unrelated", function()
    local known = { "MG_NODE_DISPATCH_INTERVAL_SECONDS", "MG_LOG_LEVEL", "MG_DATABASE_URL" }
    assert.equals("MG_LOG_LEVEL", check_mod.suggest("MG_LOGLEVEL", known))
    assert.equals("MG_DATABASE_URL", check_mod.suggest("MG_DATABASE_URI", known))
    assert.is_nil(check_mod.suggest("MG_COMPLETELY_DIFFERENT_THING", known))
  end)
end)
