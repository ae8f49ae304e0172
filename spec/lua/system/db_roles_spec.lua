-- The runtime role (sql/0102_database_roles.sql): what the daemon's database
-- role may not do, each attempted and refused; that a real daemon logged in
-- as a member of qtg_runtime still moves a request to the end, audit
-- included; and what `qtgd check` says of the role it runs as.
local qtg = require "qtg"
local support = require "spec.lua.support.host"
local promoter = require "qtg.workers.audit_outbox_promoter"

local LOGIN = "spec_runtime_login"
local s

-- The URL of this database for another role (trust auth: no password).
local function url_as(role)
  local url = os.getenv("MG_DATABASE_URL")
  local out = url:gsub("^postgresql://[^@/]*@", "postgresql://" .. role .. "@", 1)
  assert(out ~= url, "cannot change the user of " .. url)
  return out
end

-- Run sql as qtg_runtime (SET ROLE: privileges are those of the role) in a
-- transaction that is rolled back whatever happens -> ok, err.
local function as_runtime(sql, ...)
  s:begin()
  s:exec("SET LOCAL ROLE qtg_runtime")
  local ok, err = pcall(s.query, s, sql, ...)
  s:rollback()
  return ok, err
end

describe("the runtime role", function()
  setup(function()
    s = qtg.db.acquire()
    s:exec(string.format([[DO $$ BEGIN
      IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '%s') THEN
        CREATE ROLE %s LOGIN IN ROLE qtg_runtime;
      END IF; END $$]], LOGIN, LOGIN))
    repeat until promoter.promote(s, 500) == 0
  end)
  teardown(function()
    support.stop_all()
    s:release()
  end)

  it("exists after qtgd migrate, owns nothing and is no superuser", function()
    local r = s:query([[SELECT rolsuper, rolcanlogin,
      (SELECT count(*)::int FROM pg_class WHERE relowner = 'qtg_runtime'::regrole) AS owned
      FROM pg_roles WHERE rolname = 'qtg_runtime']])[1]
    assert.is_false(r.rolsuper)
    assert.is_false(r.rolcanlogin)
    assert.equals(0, r.owned)
  end)

  local attacks = {
    { "insert a forged audit row", [[INSERT INTO audit_events (outbox_id, actor, action, entity_type,
        entity_id, detail, created_at) VALUES (-77, 'operator:mallory', 'request.approve',
        'movement_request', 'x', '{}', now() - interval '400 days')]] },
    { "update an audit row", "UPDATE audit_events SET actor = 'operator:mallory'" },
    { "delete audit rows", "DELETE FROM audit_events" },
    { "truncate the audit trail", "TRUNCATE audit_events" },
    { "move a chain's head", "UPDATE audit_chain_heads SET chain_seq = 0" },
    { "update an audit outbox row", "UPDATE audit_outbox SET actor = 'operator:mallory'" },
    { "delete audit outbox rows", "DELETE FROM audit_outbox" },
    { "disable the audit triggers", "ALTER TABLE audit_events DISABLE TRIGGER USER" },
    { "drop an audit trigger", "DROP TRIGGER audit_events_no_update ON audit_events" },
    { "alter a table", "ALTER TABLE movement_requests ADD COLUMN mallory text" },
    { "drop a table", "DROP TABLE movement_requests" },
    { "create a table", "CREATE TABLE public.mallory (x int)" },
    { "truncate the requests", "TRUNCATE movement_requests CASCADE" },
    { "replace the promotion function", [[CREATE OR REPLACE FUNCTION qtg_audit_promote(batch int)
        RETURNS int LANGUAGE sql AS 'SELECT 0']] },
    { "rewrite the migrations' record", "DELETE FROM schema_migrations" },
    { "grant itself more", "SELECT qtg_grant_roles()" },
  }
  for _, a in ipairs(attacks) do
    it("may not " .. a[1], function()
      local ok, err = as_runtime(a[2])
      assert.is_false(ok, a[1] .. " was allowed")
      assert.equals("42501", err.sqlstate, tostring(err.message)) -- insufficient_privilege
    end)
  end

  it("may do the engine's work: write requests and the outbox, promote audit rows", function()
    s:begin()
    s:exec("SET LOCAL ROLE qtg_runtime")
    s:query([[INSERT INTO audit_outbox (actor, action, entity_type, entity_id, detail)
              VALUES ('system:spec', 'spec.roles', 'spec', '1', '{}')]])
    assert.equals(1, promoter.promote(s, 500))
    local n = s:query("SELECT count(*)::int AS n FROM audit_events WHERE action = 'spec.roles'")[1].n
    s:rollback()
    assert.equals(1, n)
  end)

  it("runs a real daemon that moves a request to COMPLETED with its audit trail", function()
    local sup = require "spec.lua.support.engine"
    local class = "spec-roles-" .. sup.uid()
    local key = "spec_roles_" .. sup.uid():lower():gsub("[^a-z0-9]", "_")
    sup.load_doc(s, sup.doc(key, { { "a", "action", "withdrawal", { sim = { observes = 1 } } } }))
    local daemon = support.start(support.base_env{
      MG_DATABASE_URL = url_as(LOGIN), MG_NETWORK_CLASS = class,
      MG_NODE_DISPATCH_INTERVAL_SECONDS = "0.2", MG_NODE_OBSERVE_INTERVAL_SECONDS = "0.2",
      MG_EVM_NONCE_REAPER_ENABLED = "false", MG_CCIP_STRANDED_REAPER_ENABLED = "false",
      MG_BALANCE_HISTORY_ENABLED = "false",
    }, { "run" })
    -- the request is made in the daemon's class, as a second process would
    local old = qtg.settings.network_class
    local req
    local ok, err = pcall(function()
      rawset(qtg.settings, "network_class", class)
      req = sup.create_approved(s, key, { callback_url = false })
    end)
    rawset(qtg.settings, "network_class", old)
    assert(ok, err)
    local done = support.eventually(function()
      return sup.request(s, req.id).request_state == "COMPLETED"
        and s:query([[SELECT count(*)::int AS n FROM audit_outbox WHERE request_id = $1::uuid]],
          req.id)[1].n == 0
    end, 60, 0.2)
    assert(done, "not completed: " .. tostring(support.read(daemon.log)):sub(-2000))
    local actions = {}
    for _, r in ipairs(s:query([[SELECT action FROM audit_events WHERE request_id = $1::uuid
                                  ORDER BY chain_seq]], req.id)) do
      actions[#actions + 1] = r.action
    end
    assert.is_truthy(table.concat(actions, " "):find("request.completed", 1, true), table.concat(actions, " "))
    assert.is_true(require("qtg.audit").verify(s).ok)
    assert.equals(0, support.stop(daemon, 30))
    assert.is_nil(support.read(daemon.log):find("permission denied", 1, true), support.read(daemon.log))
  end)
end)

describe("qtgd check on the daemon's role", function()
  local function check(env)
    env.MG_SIM_NETWORK_CLASSES = "devnet,test*"
    return support.run(support.base_env(env), { support.bin, "check" })
  end
  local function line(out, level)
    return out:match("\n?(" .. level .. "%s+db role[^\n]*)")
  end

  it("is ok for a member of qtg_runtime that owns nothing", function()
    local rc, out = check({ MG_DATABASE_URL = url_as(LOGIN), MG_NETWORK_CLASS = "mainnet" })
    assert.is_truthy(line(out, "ok"), out)
    assert.matches(LOGIN .. " is a member of qtg_runtime and owns nothing", out, 1, true)
    assert.is_nil(line(out, "FAIL"), out)
    assert.is_number(rc)
  end)

  it("FAILs a superuser outside the development classes, and warns on them", function()
    local rc, out = check({ MG_NETWORK_CLASS = "mainnet" })
    assert.equals(1, rc, out)
    assert.matches("is a superuser: it can disable the audit trail's guards", line(out, "FAIL"), 1, true)
    rc, out = check({ MG_NETWORK_CLASS = "devnet" })
    assert.matches("a warning on the development class devnet", line(out, "warn") or "", 1, true)
    assert.is_nil(line(out, "FAIL"), out)
  end)

  it("FAILs a role that owns tables", function()
    s = qtg.db.acquire()
    s:exec([[DO $$ BEGIN
      IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'spec_owner_login') THEN
        CREATE ROLE spec_owner_login LOGIN;
      END IF; END $$]])
    s:exec("CREATE TABLE IF NOT EXISTS spec_owned_by_login (x int)")
    s:exec("ALTER TABLE spec_owned_by_login OWNER TO spec_owner_login")
    s:release()
    local rc, out = check({ MG_DATABASE_URL = url_as("spec_owner_login"), MG_NETWORK_CLASS = "mainnet" })
    assert.equals(1, rc, out)
    assert.matches("spec_owner_login owns 1 table: it can alter them", line(out, "FAIL"), 1, true)
  end)
end)
