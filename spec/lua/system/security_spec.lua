-- Security (docs/security.md): key material never reaches a log line, the
-- console, `qtgd settings` or an error message, and the audit trail is
-- append-only from the application's side.
--
-- The log scan runs a real daemon at debug level with every secret it can
-- have -- a callback key file, a signer key file, a password in
-- MG_DATABASE_URL -- and makes it use them all: signed callbacks delivered
-- to a real receiver (tools/fake-receiver, which verifies the signatures),
-- a receiver that fails (error text in the logs), a `qtgd signer` holding
-- the signer key (the daemon never loads it) asked for a key it does not
-- hold (SIGNING_REFUSED) and for its health from the console, and
-- an operator console session that asks for the settings and raises.  Then
-- it starts qtgd with broken key files (mode 0644, garbage content) and
-- reads their errors.  Every line of everything qtgd wrote is scanned for
-- each secret, whole and in every 16-character piece, in lower and upper
-- case.
local qtg = require "qtg"
local cjson = require "cjson"

local support = require "spec.lua.support.host"
local common = require "spec.lua.support.common"
local sup     -- spec/lua/support/engine.lua, loaded in setup

local q = common.quote
-- A valid secp256k1 key (Hardhat's well-known test account 1), never a real one.
local SIGNER_KEY = "59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d"

local dir, class, template_key
local callback_key, db_password
local logs = {}           -- name -> text, everything qtgd printed
local receivers = {}      -- pid list to stop
local daemon

local function start_receiver(mode, key_file)
  local h = common.start_receiver(dir, "rx-" .. mode, { mode = mode, keys = { k1 = key_file } })
  receivers[#receivers + 1] = h.pid
  return h.url
end

-- Every 16-character piece of a secret (and the whole), both cases.
local function needles(secret)
  local out = { secret, secret:upper(), secret:lower() }
  for i = 1, #secret - 15 do
    local piece = secret:sub(i, i + 15)
    out[#out + 1] = piece
    out[#out + 1] = piece:upper()
    out[#out + 1] = piece:lower()
  end
  return out
end

local function find_leaks(text, secrets)
  local found = {}
  for name, secret in pairs(secrets) do
    for _, n in ipairs(needles(secret)) do
      local at = text:find(n, 1, true)
      if at then
        local line_start = text:sub(1, at):match(".*\n()") or 1
        local line = text:sub(line_start, (text:find("\n", at, true) or #text + 1) - 1)
        found[#found + 1] = name .. " in: " .. line:sub(1, 300)
        break
      end
    end
  end
  return found
end

describe("security", function()
  setup(function()
    sup = require "spec.lua.support.engine"
    dir = support.tmpdir()
    class = "sec-" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
    callback_key = qtg.crypto.hex(qtg.crypto.random_bytes(32))
    db_password = "pw-" .. qtg.crypto.hex(qtg.crypto.random_bytes(12))
    support.write(dir .. "/callback.key", callback_key .. "\n")
    support.write(dir .. "/ops.key", "0x" .. SIGNER_KEY .. "\n")
    os.execute("chmod 600 " .. q(dir .. "/callback.key") .. " " .. q(dir .. "/ops.key"))

    local ok_url = start_receiver("ok", dir .. "/callback.key")
    local bad_url = start_receiver("500", dir .. "/callback.key")

    -- a template whose nodes sign with the loaded key, and one with a key
    -- that is not loaded
    template_key = "sec_" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
    local s = qtg.db.acquire()
    sup.load_doc(s, sup.doc(template_key, {
      { "withdraw", "action", "withdrawal", { sim = { observes = 0, side_effect = true } } },
      { "status", "observe", "cex_withdrawal_status",
        { withdrawal_id = "$ref:withdraw.withdrawal_id", sim = { observes = 1, retry_after_seconds = 0.2 } } },
    }, { { "withdraw", "status" } }))
    local unsigned_key = template_key .. "_nokey"
    sup.load_doc(s, sup.doc(unsigned_key, {
      { "withdraw", "action", "withdrawal", { sim = { observes = 0, signer_key = "no_such_key" } } },
    }))
    local ids = {}
    for i = 1, 4 do
      ids[#ids + 1] = sup.create_approved(s, template_key,
        { network_class = class, callback_url = i % 2 == 0 and bad_url or ok_url }).id
    end
    ids[#ids + 1] = sup.create_approved(s, unsigned_key, { network_class = class, callback_url = ok_url }).id
    s:release()

    -- the daemon, with every secret, at debug level, console on
    local url = os.getenv("MG_DATABASE_URL")
    local with_password = url:gsub("^postgresql://([^@/]*)@", "postgresql://%1:" .. db_password .. "@", 1)
    assert(with_password ~= url, "cannot put a password in " .. url)
    local signer_env = support.base_env{
      MG_DATABASE_URL = with_password, MG_LOG_LEVEL = "debug",
      MG_SIGNER_KEYS = "ops=" .. dir .. "/ops.key", MG_SIGNER_SOCKET = dir .. "/signer/signer.sock",
      MG_SIGNER_TRUST_APPROVAL_ROWS = "true" }
    local signer = support.start(signer_env, { "signer" })
    support.eventually(function()
      return (support.read(signer.log) or ""):find('"signer: listening"', 1, true)
    end, 30, 0.1)
    daemon = support.start(support.base_env{
      MG_SIGNER_SOCKET = dir .. "/signer/signer.sock",
      MG_DATABASE_URL = with_password, MG_NETWORK_CLASS = class, MG_LOG_LEVEL = "debug",
      MG_CALLBACK_KEY_FILE = dir .. "/callback.key", MG_CALLBACK_KEY_ID = "k1",
      MG_SIGNER_KEYS = "ops=" .. dir .. "/ops.key",
      MG_CONSOLE_ENABLED = "true", MG_CONSOLE_SOCKET = dir .. "/run/console.sock",
      MG_NODE_DISPATCH_INTERVAL_SECONDS = "0.2", MG_NODE_OBSERVE_INTERVAL_SECONDS = "0.2",
      MG_CALLBACK_DISPATCH_INTERVAL_SECONDS = "0.2", MG_CALLBACK_TIMEOUT_SECONDS = "2",
      MG_CALLBACK_MAX_ATTEMPTS = "2", MG_EXECUTOR_HEALTH_INTERVAL_SECONDS = "0.5",
      MG_EVM_NONCE_REAPER_ENABLED = "false", MG_CCIP_STRANDED_REAPER_ENABLED = "false",
      MG_BALANCE_HISTORY_ENABLED = "false",
    }, { "run" })
    -- work until every request is done, every callback to the healthy
    -- receiver delivered, and the failing one tried twice per row
    local done = support.eventually(function()
      local r = support.query([[
        SELECT count(*) FILTER (WHERE r.request_state NOT IN ('COMPLETED', 'FAILED'))::int AS open,
               (SELECT count(*) FROM movement_callback_outbox c JOIN movement_requests r2 ON r2.id = c.request_id
                 WHERE r2.network_class = $1 AND c.status = 'pending'
                   AND (c.callback_url = $2 OR c.attempts < 2))::int AS pending
          FROM movement_requests r WHERE r.network_class = $1]], class, ok_url)[1]
      return r.open == 0 and r.pending == 0
    end, 90, 0.25)
    assert(done, "the daemon did not finish the work: " .. tostring(support.read(daemon.log)):sub(-2000))

    -- an operator console session that reads what it can and raises
    local console_out = {}
    for _, code in ipairs({
      "return 'configured', qtg.settings.callback_key_configured, qtg.settings.database_url_configured",
      "return qtg.settings.callback_key",
      "return qtg.settings.database_url",
      "return require('qtg').crypto.hmac_callback('probe')",
      "return require('qtg').signer.health('ops')",
      "error(qtg.settings)",
      "return qtg.runtime.workers()",
    }) do
      local rc, out = support.run({}, { q(support.bin), "console", "--socket", q(dir .. "/run/console.sock"),
                                        "-e", q(code) })
      console_out[#console_out + 1] = string.format("[rc %s] %s", tostring(rc), out)
    end
    logs.console = table.concat(console_out, "\n")
    logs.socket_modes = select(2, support.run({}, { "stat", "-c", "'%a %n'", q(dir .. "/run"), q(dir .. "/run/console.sock") }))

    assert.equals(0, support.stop(daemon, 30))
    logs.daemon = support.read(daemon.log)
    assert.equals(0, support.stop(signer, 30))
    logs.signer = support.read(signer.log)

    -- `qtgd settings` with every secret set
    local _, settings_out = support.run({ MG_DATABASE_URL = with_password, MG_CALLBACK_KEY = callback_key,
      MG_SIGNER_KEYS = "ops=" .. dir .. "/ops.key" }, { q(support.bin), "settings" })
    logs.settings = settings_out

    -- start-up refusals: a key file others may read, and garbage contents
    support.write(dir .. "/open.key", callback_key .. "\n")
    os.execute("chmod 644 " .. q(dir .. "/open.key"))
    support.write(dir .. "/garbage.key", "zz" .. callback_key:sub(3) .. "\n")
    os.execute("chmod 600 " .. q(dir .. "/garbage.key"))
    local refusals = {}
    for _, env in ipairs({
      { MG_CALLBACK_KEY_FILE = dir .. "/open.key" },
      { MG_SIGNER_KEYS = "ops=" .. dir .. "/open.key" },
      { MG_SIGNER_KEYS = "ops=" .. dir .. "/garbage.key" },
      { MG_CALLBACK_KEY_FILE = dir .. "/callback.key", MG_CALLBACK_KEY = callback_key },
    }) do
      env.MG_DATABASE_URL = with_password
      env.MG_NETWORK_CLASS = class
      env.MG_CONSOLE_ENABLED = "false"
      local rc, out = support.run(env, { q(support.bin), env.MG_SIGNER_KEYS and "signer" or "run" })
      refusals[#refusals + 1] = string.format("[rc %s] %s", tostring(rc), out)
    end
    logs.refusals = table.concat(refusals, "\n")
  end)

  teardown(function()
    support.stop_all()
    common.kill_pids(receivers)
    if dir then os.execute("rm -rf " .. q(dir)) end
  end)

  it("the daemon did the work that uses the keys (signed submits, signed callbacks, failures)", function()
    local rows = support.query([[
      SELECT n.node_state, coalesce(n.error_code, '-') AS error_code, count(*)::int AS n
        FROM movement_request_nodes n
        JOIN movement_requests r ON r.id = n.request_id WHERE r.network_class = $1
       GROUP BY 1, 2 ORDER BY 1, 2]], class)
    local seen = {}
    for _, r in ipairs(rows) do seen[r.node_state .. ":" .. tostring(r.error_code)] = r.n end
    assert.equals(8, seen["COMPLETED:-"], cjson.encode(rows))
    assert.equals(1, seen["FAILED:SIGNING_REFUSED"], cjson.encode(rows))
    -- the healthy receiver verified every signature it got
    local verified, refused = 0, 0
    for line in (support.read(dir .. "/rx-ok.jsonl") or ""):gmatch("[^\n]+") do
      local e = cjson.decode(line)
      if e.verdict and e.verdict.ok then verified = verified + 1 else refused = refused + 1 end
    end
    assert.is_true(verified >= 6, "verified " .. verified)
    assert.equals(0, refused)
    assert.truthy(logs.daemon:find("callback attempt failed", 1, true))
  end)

  it("no line qtgd wrote (logs, console, settings, start-up errors) holds key material", function()
    local secrets = { callback_key = callback_key, signer_key = SIGNER_KEY, db_password = db_password }
    local all = {}
    for name, text in pairs(logs) do
      assert.is_true(#text > 0, name .. " is empty")
      all[#all + 1] = "== " .. name .. "\n" .. text
    end
    local text = table.concat(all, "\n")
    -- the scan can fail: a line with the key in it is found
    assert.equals(1, #find_leaks("x\nsigned with " .. callback_key:sub(9, 40) .. " here\ny", secrets))
    assert.same({}, find_leaks(text, secrets))
    -- and the material the scan looked for was really used
    assert.truthy(logs.refusals:find("mode 0644", 1, true), logs.refusals)
    assert.truthy(logs.refusals:find("must hold 64 hex digits", 1, true), logs.refusals)
    assert.truthy(logs.refusals:find("both set", 1, true), logs.refusals)
    assert.truthy(logs.settings:find("(set, hidden)", 1, true), logs.settings)
  end)

  it("every log line of the daemon is one JSON object", function()
    local n = 0
    for line in logs.daemon:gmatch("[^\n]+") do
      n = n + 1
      local ok, v = pcall(cjson.decode, line)
      assert(ok and type(v) == "table" and v.level and v.msg, "not a JSON log line: " .. line:sub(1, 300))
    end
    assert.is_true(n > 50, "only " .. n .. " log lines")
  end)

  it("the console shows secrets only as *_configured flags, over a 0600 socket in a 0700 directory", function()
    -- the callback key came from a file: the inline MG_CALLBACK_KEY is unset
    assert.truthy(logs.console:find('"configured"%s+false%s+true'), logs.console)
    assert.truthy(logs.console:find("no setting 'callback_key'", 1, true), logs.console)
    assert.truthy(logs.console:find("no setting 'database_url'", 1, true), logs.console)
    assert.truthy(logs.socket_modes:match("700 [^\n]*/run\n"), logs.socket_modes)
    assert.truthy(logs.socket_modes:match("600 [^\n]*/console%.sock"), logs.socket_modes)
    assert.is_false((pcall(function() return qtg.settings.callback_key end)))
    assert.is_false((pcall(function() return qtg.settings.database_url end)))
    assert.equals("boolean", type(qtg.settings.database_url_configured))
  end)

  it("the audit trail is append-only: UPDATE, DELETE and TRUNCATE are refused; outbox rows leave only promoted", function()
    local s = qtg.db.acquire()
    local n = s:query("SELECT count(*)::int AS n FROM audit_events")[1].n
    assert.is_true(n > 0)
    for _, sql in ipairs({ "UPDATE audit_events SET actor = 'x' WHERE id = (SELECT min(id) FROM audit_events)",
                           "DELETE FROM audit_events WHERE id = (SELECT min(id) FROM audit_events)",
                           "TRUNCATE audit_events" }) do
      local ok, err = pcall(s.query, s, sql)
      assert.is_false(ok, sql)
      assert.equals("42501", err.sqlstate, sql)
      assert.truthy(err.message:find("append-only", 1, true))
    end
    s:begin()
    s:query([[INSERT INTO audit_outbox (actor, action, entity_type, entity_id)
              VALUES ('console:spec', 'spec.probe', 'spec', 'x')]])
    for _, sql in ipairs({ "UPDATE audit_outbox SET actor = 'x' WHERE action = 'spec.probe'",
                           "DELETE FROM audit_outbox WHERE action = 'spec.probe'" }) do
      s:savepoint("probe")
      local ok, err = pcall(s.query, s, sql)
      assert.is_false(ok, sql)
      assert.equals("42501", err.sqlstate, sql)
      s:rollback_to("probe")
    end
    s:rollback()
    assert.equals(n, s:query("SELECT count(*)::int AS n FROM audit_events")[1].n)
    s:release()
  end)
end)
