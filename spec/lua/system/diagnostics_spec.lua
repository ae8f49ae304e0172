-- Saying what went wrong: the log lines (typed JSON values, the text
-- format, repeated warnings counted, a warn line for every node going
-- FAILED/UNKNOWN and every request going FAILED/MANUAL_INTERVENTION), the
-- command line (usage without a command, help for every command, every
-- invalid setting at once, numbers as people write them), `qtgd run`
-- warning about unknown MG_* names and `qtgd check` reporting a key file
-- that does not load as a FAIL line.  Real qtgd child processes and a real
-- database.
local qtg = require "qtg"
local cjson = require "cjson"
local ffi = require "ffi"

pcall(ffi.cdef, [[
int dup(int fd);
int dup2(int oldfd, int newfd);
int close(int fd);
int open(const char *path, int flags, int mode);
]])

local sup -- spec/lua/support/host.lua
local common = require "spec.lua.support.common"
local q = common.quote

-- Everything this process writes on stderr while fn runs.
local function capture_stderr(fn)
  local path = os.tmpname()
  local O_WRONLY, O_CREAT, O_TRUNC = 1, 64, 512
  local fd = ffi.C.open(path, O_WRONLY + O_CREAT + O_TRUNC, 384)
  assert(fd >= 0, "cannot open " .. path)
  io.stderr:flush()
  local saved = ffi.C.dup(2)
  ffi.C.dup2(fd, 2)
  ffi.C.close(fd)
  local ok, err = pcall(fn)
  ffi.C.dup2(saved, 2)
  ffi.C.close(saved)
  local f = assert(io.open(path, "rb"))
  local text = f:read("*a")
  f:close()
  os.remove(path)
  assert(ok, err)
  return text
end

local function json_lines(text)
  local out = {}
  for line in text:gmatch("[^\n]+") do
    local ok, v = pcall(cjson.decode, line)
    if ok and type(v) == "table" then out[#out + 1] = v end
  end
  return out
end

local function exec(env, script)
  local dir = sup.tmpdir()
  sup.write(dir .. "/s.lua", script)
  local rc, out = sup.run(sup.base_env(env), { q(sup.bin), "exec", q(dir .. "/s.lua") })
  os.execute("rm -rf " .. q(dir))
  return rc, out
end

describe("logs", function()
  setup(function() sup = require "spec.lua.support.host" end)
  teardown(function() sup.stop_all() end)

  it("writes numbers and booleans as JSON numbers and booleans", function()
    local rc, out = exec({ MG_LOG_FORMAT = "json" }, [[
local qtg = require "qtg"
qtg.log.warn("typed", { n = 42, f = 0.5, big = 31536000, yes = true, no = false,
  s = "42", inf = math.huge, t = {} })
return 0]])
    assert.equal(0, rc, out)
    local line
    for _, l in ipairs(json_lines(out)) do if l.msg == "typed" then line = l end end
    assert.is_table(line, out)
    assert.equal(42, line.n)
    assert.equal(0.5, line.f)
    assert.equal(31536000, line.big)
    assert.is_true(line.yes)
    assert.is_false(line.no)
    assert.equal("42", line.s)      -- a string stays a string
    assert.equal("inf", line.inf)   -- not a JSON number: quoted
    assert.equal("table", line.t)
    assert.matches('"big":31536000[,}]', out)
  end)

  it("writes the text format with MG_LOG_FORMAT=text, one line per event", function()
    local rc, out = exec({ MG_LOG_FORMAT = "text" }, [[
local qtg = require "qtg"
qtg.log.warn("something odd", { worker = "node_observer", n = 3, why = "two words\nand a line" })
return 0]])
    assert.equal(0, rc, out)
    local line = out:match("[^\n]*something odd[^\n]*")
    assert.is_truthy(line, out)
    assert.matches("^%d%d%d%d%-%d%d%-%d%dT[%d:.]+Z WARN  something odd ", line)
    assert.matches(" worker=node_observer", line, 1, true)
    assert.matches(" n=3", line, 1, true)
    assert.matches(' why="two words\\nand a line"', line, 1, true)
    assert.is_nil(out:find("{\"time\"", 1, true), out)
  end)

  it("is JSON when stderr is not a terminal and MG_LOG_FORMAT is unset", function()
    local rc, out = exec({}, [[require("qtg").log.warn("plain pipe") return 0]])
    assert.equal(0, rc, out)
    assert.matches('"msg":"plain pipe"', out, 1, true)
  end)

  it("is text when stderr is a terminal and MG_LOG_FORMAT is unset", function()
    local dir = sup.tmpdir()
    sup.write(dir .. "/s.lua", [[require("qtg").log.warn("on a tty") return 0]])
    -- script(1) gives the child a pseudo-terminal
    local cmd = ("env %s script -qec %s /dev/null"):format(
      common.env_words(sup.base_env({})),
      q(q(sup.bin) .. " exec " .. q(dir .. "/s.lua")))
    local p = io.popen(cmd .. " 2>&1")
    local out = p:read("*a")
    p:close()
    os.execute("rm -rf " .. q(dir))
    assert.matches("WARN  on a tty", out, 1, true)
  end)

  it("counts repeated identical warnings instead of writing each", function()
    local rc, out = exec({ MG_LOG_FORMAT = "json" }, [[
local qtg = require "qtg"
qtg.log.repeat_window(1)
for _ = 1, 5 do qtg.log.warn("listener connection lost; reconnecting in 1 s") end
qtg.log.warn("another warning")
qtg.sleep(1.2)
qtg.log.warn("listener connection lost; reconnecting in 1 s")
return 0]])
    assert.equal(0, rc, out)
    local seen = {}
    for _, l in ipairs(json_lines(out)) do
      if l.msg:match("^listener") then seen[#seen + 1] = l end
    end
    assert.equal(2, #seen, out)
    assert.is_nil(seen[1].repeated)
    assert.equal(4, seen[2].repeated)
    assert.matches("another warning", out, 1, true)
  end)

  describe("a warn line for each node and request in trouble", function()
    local esup, s
    setup(function()
      esup = require "spec.lua.support.engine"
      s = qtg.db.acquire()
    end)
    teardown(function() s:release() end)
    before_each(function() esup.park_others(s) end)

    local function find(lines, msg, id_field, id)
      for _, l in ipairs(lines) do
        if l.msg == msg and l[id_field] == id then return l end
      end
    end

    it("node FAILED and request FAILED, with the error code and ids", function()
      local key = "spec_diag_fail_" .. esup.uid("t"):gsub("-", "_")
      esup.load_doc(s, esup.doc(key, { { "a", "action", "withdrawal", { sim = { fail = "submit" } } } }))
      local req
      local text = capture_stderr(function()
        req = esup.create_approved(s, key)
        assert.is_true(esup.drive(s, esup.state_is(req.id, "FAILED"), 10))
      end)
      local lines = json_lines(text)
      local node = esup.nodes(s, req.id).a
      local nl = find(lines, "node FAILED", "node_id", node.id)
      assert.is_table(nl, text)
      assert.equal("warn", nl.level)
      assert.equal(req.id, nl.request_id)
      assert.equal("a", nl.node_key)
      assert.equal(node.error_code, nl.error_code)
      assert.is_string(nl.error_code)
      assert.equal(1, nl.attempt_no)
      local rl = find(lines, "request FAILED", "request_id", req.id)
      assert.is_table(rl, text)
      assert.equal("warn", rl.level)
      assert.equal(node.error_code, rl.error_code)
      assert.equal("EXECUTING", rl.from_state)
    end)

    it("node UNKNOWN and request MANUAL_INTERVENTION after a side effect", function()
      local key = "spec_diag_mi_" .. esup.uid("t"):gsub("-", "_")
      esup.load_doc(s, esup.doc(key, {
        { "a", "action", "withdrawal", { sim = { observes = 0, side_effect = true } } },
        { "b", "action", "withdrawal", { sim = { unknown = "submit" } } },
      }, { { "a", "b" } }))
      local req
      local text = capture_stderr(function()
        req = esup.create_approved(s, key)
        assert.is_true(esup.drive(s, esup.state_is(req.id, "MANUAL_INTERVENTION"), 20,
          { "node_dispatcher", "node_observer" }))
      end)
      local lines = json_lines(text)
      local b = esup.nodes(s, req.id).b
      local nl = find(lines, "node UNKNOWN", "node_id", b.id)
      assert.is_table(nl, text)
      assert.equal(req.id, nl.request_id)
      assert.equal(b.error_code, nl.error_code)
      local rl = find(lines, "request MANUAL_INTERVENTION", "request_id", req.id)
      assert.is_table(rl, text)
      assert.equal(b.error_code, rl.error_code)
    end)
  end)
end)

describe("qtgd's command line", function()
  setup(function() sup = require "spec.lua.support.host" end)
  teardown(function() sup.stop_all() end)

  local COMMANDS = { "run", "migrate", "exec", "templates", "check", "console", "settings", "version", "help", "approver", "signer" }

  it("prints its usage and exits 2 without a command, instead of starting a daemon", function()
    local rc, out = sup.run(sup.base_env({}), { q(sup.bin) })
    assert.equal(2, rc, out)
    assert.matches("usage: qtgd COMMAND", out, 1, true)
    assert.is_nil(out:find("qtgd running", 1, true), out)
  end)

  it("has `qtgd help COMMAND` and `qtgd COMMAND --help` for every command", function()
    for _, c in ipairs(COMMANDS) do
      local rc, out = sup.run(sup.base_env({}), { q(sup.bin), "help", c })
      assert.equal(0, rc, c .. ": " .. out)
      assert.matches("usage: qtgd " .. c, out, 1, true)
      for _, flag in ipairs({ "--help", "-h" }) do
        local rc2, out2 = sup.run(sup.base_env({}), { q(sup.bin), c, flag })
        assert.equal(0, rc2, c .. " " .. flag .. ": " .. out2)
        assert.equal(out, out2)
      end
    end
    local rc, out = sup.run(sup.base_env({}), { q(sup.bin), "help", "frobnicate" })
    assert.equal(2, rc, out)
    assert.matches("unknown command 'frobnicate'", out, 1, true)
  end)

  it("`qtgd approver` keeps an approver's key to itself and signs approval statements only", function()
    local dir = require("spec.lua.support.host").tmpdir()
    local key = dir .. "/k"
    local function approver(args, stdin)
      local words = { q(sup.bin), "approver" }
      for _, a in ipairs(args) do words[#words + 1] = q(a) end
      if stdin then
        local f = dir .. "/stdin"
        local h = assert(io.open(f, "w")); h:write(stdin); h:close()
        words[#words + 1] = "< " .. q(f)
      end
      return sup.run({}, words)
    end
    local rc, out = approver({ "key", key })
    assert.equal(0, rc, out)
    local pub = out:match("ed25519:(%x+)")
    assert.equal(64, #pub)
    assert.matches("ed25519:" .. pub, select(2, approver({ "public", key })), 1, true)
    -- a second key over the first: refused, the first kept
    rc, out = approver({ "key", key })
    assert.equal(1, rc, out)
    assert.matches("File exists", out, 1, true)
    assert.matches("ed25519:" .. pub, select(2, approver({ "public", key })), 1, true)
    -- anything but one statement is not signed
    local st = "qtg-approval-v3\ndeployment desk-1\nrequest 0b6d1c2e-1111-4222-8333-944455556666\nclass mainnet\ndigest "
      .. string.rep("a", 64) .. "\nplan " .. string.rep("b", 64) .. "\n"
    local sign = { "sign", key, "--request", "0b6d1c2e-1111-4222-8333-944455556666", "--kind", "approval", "--unchecked" }
    for _, bad in ipairs({ "", "hello", st .. "x", st:gsub("mainnet", "Mainnet"), st:sub(1, -2),
                           (st:gsub("request ", "request  ")), (st:gsub("deployment desk%-1\n", "")),
                           (st:gsub("v3", "v2")), (st:gsub("v3", "v1")) }) do
      rc, out = approver(sign, bad)
      assert.equal(1, rc, out)
      assert.is_nil(out:match("%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x"
        .. "%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x"), out)
    end
    rc, out = approver(sign, st)
    assert.equal(0, rc, out)
    -- a key file others may read: refused; usage errors exit 2
    os.execute("chmod 644 " .. q(key))
    rc, out = approver(sign, st)
    assert.equal(1, rc, out)
    assert.matches("0644", out, 1, true)
    for _, args in ipairs({ {}, { "sign" }, { "frob", key }, { "sign", key, "only-one" }, { "key", key, "x", "y" },
                            { "sign", key },
                            -- an approval without its texts, unless --unchecked
                            { "sign", key, "--request", "0b6d1c2e-1111-4222-8333-944455556666", "--kind", "approval" } }) do
      rc, out = approver(args)
      assert.equal(2, rc, table.concat(args, " ") .. ": " .. out)
    end
    os.execute("rm -rf " .. q(dir))
  end)

  it("reports every invalid setting, with numbers as people write them", function()
    local rc, out = sup.run(sup.base_env({ MG_DB_POOL_SIZE = "0", MG_APPROVAL_TTL_SECONDS = "-1",
      MG_LOG_FORMAT = "xml", MG_NETWORK_CLASS = "Bad Class", MG_WORKERS_ENABLED = "maybe" }),
      { q(sup.bin), "check" })
    assert.equal(2, rc, out)
    assert.matches('MG_DB_POOL_SIZE="0" is invalid: expected an integer between 1 and 256', out, 1, true)
    assert.matches('MG_APPROVAL_TTL_SECONDS="-1" is invalid: expected an integer between 1 and 31536000',
      out, 1, true)
    assert.matches('MG_LOG_FORMAT="xml" is invalid: expected json or text', out, 1, true)
    assert.matches('MG_NETWORK_CLASS="Bad Class" is invalid', out, 1, true)
    assert.matches('MG_WORKERS_ENABLED="maybe" is invalid', out, 1, true)
    assert.is_nil(out:find("e+0", 1, true), out)
    rc, out = sup.run(sup.base_env({ MG_NODE_DISPATCH_INTERVAL_SECONDS = "0" }), { q(sup.bin), "check" })
    assert.equal(2, rc, out)
    assert.matches("expected a number between 0.01 and 86400", out, 1, true)
  end)

  it("`qtgd run` warns about an MG_* name that is not a setting, suggesting one", function()
    local p = sup.start(sup.base_env({ MG_WORKERS_ENABLED = "false", MG_CONSOLE_ENABLED = "false",
      MG_NODE_DISPATCH_INTERVAL = "1", MG_LOG_FORMAT = "json" }), { "run" })
    assert.is_truthy(sup.eventually(function()
      return (sup.read(p.log) or ""):find("qtgd running", 1, true)
    end, 20), sup.read(p.log))
    local log = sup.read(p.log)
    local found
    for _, l in ipairs(json_lines(log)) do
      if l.setting == "MG_NODE_DISPATCH_INTERVAL" then found = l end
    end
    assert.is_table(found, log)
    assert.equal("warn", found.level)
    assert.equal("MG_NODE_DISPATCH_INTERVAL_SECONDS", found.suggestion)
    assert.matches("is not a qtg setting", found.msg, 1, true)
    assert.equal(0, sup.stop(p, 30))
  end)

  describe("`qtgd check` and key files", function()
    local dir
    before_each(function() dir = sup.tmpdir() end)
    after_each(function() os.execute("rm -rf " .. q(dir)) end)

    local function check_line(env)
      local rc, out = sup.run(sup.base_env(env), { q(sup.bin), "check" })
      local line
      for l in out:gmatch("[^\n]+") do
        if l:match("^FAIL%s+settings%s") then line = l end
      end
      return rc, out, line
    end

    it("reports a key file that is too open as a FAIL line in its table", function()
      local f = dir .. "/callback.key"
      sup.write(f, string.rep("ab", 32) .. "\n")
      os.execute("chmod 644 " .. q(f))
      local rc, out, line = check_line({ MG_CALLBACK_KEY_FILE = f })
      assert.equal(1, rc, out)
      assert.is_truthy(line, out)
      assert.matches(f, line, 1, true)
      assert.matches("chmod 600", line, 1, true)
      assert.matches("qtgd check: FAILED", out, 1, true)
      assert.is_nil(out:find('{"time"', 1, true), out)  -- not a bare JSON log line
    end)

    it("reports a key file that cannot be read as a FAIL line in its table", function()
      local rc, out, line = check_line({ MG_CALLBACK_KEY_FILE = dir .. "/missing.key" })
      assert.equal(1, rc, out)
      assert.is_truthy(line, out)
      assert.matches(dir .. "/missing.key", line, 1, true)
      assert.matches("ok%s+database", out)  -- the other checks still ran
    end)
  end)

  describe("MG_LUA_PATH ownership and modes (as sshd's StrictModes)", function()
    local dir
    before_each(function()
      dir = sup.tmpdir()
      sup.write(dir .. "/override/qtg/spec_probe.lua", "return 1\n")
    end)
    after_each(function() os.execute("rm -rf " .. q(dir)) end)

    local function run_exec(lua_path)
      sup.write(dir .. "/s.lua", "return 0\n")
      return sup.run(sup.base_env({ MG_LUA_PATH = lua_path }), { q(sup.bin), "exec", q(dir .. "/s.lua") })
    end

    it("loads from a directory only its owner can write", function()
      local rc, out = run_exec(dir .. "/override")
      assert.equal(0, rc, out)
    end)

    it("refuses a directory anyone may write, naming it", function()
      os.execute("chmod 777 " .. q(dir .. "/override"))
      local rc, out = run_exec(dir .. "/override")
      assert.equal(1, rc, out)
      assert.matches(dir .. "/override is writable by anyone (mode 0777)", out, 1, true)
    end)

    it("refuses a group-writable script below it and a group-writable parent", function()
      os.execute("chmod 664 " .. q(dir .. "/override/qtg/spec_probe.lua"))
      local rc, out = run_exec(dir .. "/override")
      assert.equal(1, rc, out)
      assert.matches(dir .. "/override/qtg/spec_probe.lua is writable by its group", out, 1, true)
      os.execute("chmod 644 " .. q(dir .. "/override/qtg/spec_probe.lua"))
      os.execute("chmod 775 " .. q(dir))
      rc, out = run_exec(dir .. "/override")
      assert.equal(1, rc, out)
      assert.matches(dir .. " is writable by its group", out, 1, true)
    end)

    it("refuses a link to nothing (its target may be created later by anyone)", function()
      os.execute("ln -s " .. q(dir .. "/nowhere.lua") .. " " .. q(dir .. "/override/qtg/signers.lua"))
      local rc, out = run_exec(dir .. "/override")
      assert.equal(1, rc, out)
      assert.matches(dir .. "/override/qtg/signers.lua is a link to nothing", out, 1, true)
    end)

    -- Checked at start only, a tree made writable (or a link's target
    -- planted) after start was loaded by the first require of a module not
    -- loaded yet, and by a reload.
    it("checks again before loading a module from it, and at every reload", function()
      sup.write(dir .. "/later.lua", string.format([[
local over = %q
os.execute("mkdir -p " .. over .. "/qtg/planted && chmod 777 " .. over .. "/qtg/planted")
local f = assert(io.open(over .. "/qtg/planted/policy.lua", "w"))
f:write("return { allow_all = true }\n")
f:close()
print("require", pcall(require, "qtg.planted.policy"))
local report = require("qtg.reload").reload("system:spec")
print("reload", report.ok, report.errors[1] and report.errors[1].message)
os.execute("chmod 755 " .. over .. "/qtg/planted")
print("fixed", pcall(require, "qtg.planted.policy"))
]], dir .. "/override"))
      local rc, out = sup.run(sup.base_env({ MG_LUA_PATH = dir .. "/override" }), { q(sup.bin), "exec",
        q(dir .. "/later.lua") })
      assert.equal(0, rc, out)
      local planted = (dir .. "/override/qtg/planted is writable by anyone"):gsub("%p", "%%%0")
      assert.matches("require\tfalse\t[^\n]*module qtg.planted.policy: MG_LUA_PATH: " .. planted, out)
      assert.matches("reload\tfalse\tMG_LUA_PATH: " .. planted, out)
      assert.matches("fixed\ttrue\ttable", out)
    end)

    it("is a FAIL line in `qtgd check`", function()
      os.execute("chmod 757 " .. q(dir .. "/override/qtg"))
      local rc, out = sup.run(sup.base_env({ MG_LUA_PATH = dir .. "/override" }), { q(sup.bin), "check" })
      assert.equal(1, rc, out)
      assert.matches("FAIL%s+settings%s+MG_LUA_PATH: " .. dir:gsub("%p", "%%%0") .. "/override/qtg is writable by anyone", out)
    end)
  end)

  describe("the console socket's directory and peer", function()
    local dir
    before_each(function() dir = sup.tmpdir() end)
    after_each(function()
      sup.stop_all()
      os.execute("rm -rf " .. q(dir))
    end)

    it("an explicit MG_CONSOLE_SOCKET in a directory others may write stops qtgd run", function()
      os.execute("mkdir -m 777 " .. q(dir .. "/shared") .. " && chmod 777 " .. q(dir .. "/shared"))
      local p = sup.start(sup.base_env({ MG_CONSOLE_ENABLED = "true", MG_WORKERS_ENABLED = "false",
        MG_CONSOLE_SOCKET = dir .. "/shared/console.sock" }), { "run" })
      local rc = sup.wait_exit(p, 30)
      assert.is_truthy(rc and rc ~= 0, sup.read(p.log))
      assert.matches(dir .. "/shared (MG_CONSOLE_SOCKET) is writable by others (mode 0777)", sup.read(p.log), 1, true)
    end)

    -- The console client runs as root here; a listener run as `nobody`
    -- plays a socket another user planted.
    local function planted(sockdir, sock)
      local py = "import socket,time\ns=socket.socket(socket.AF_UNIX)\ns.bind(%q)\ns.listen(1)\n"
        .. "c,_=s.accept()\nc.sendall(b'x'*4)\ntime.sleep(3)\n"
      sup.write(dir .. "/plant.py", py:format(sock))
      os.execute(("chmod 755 %s && chmod 644 %s"):format(q(dir), q(dir .. "/plant.py")))
      common.background("setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 "
        .. q(dir .. "/plant.py"), "/dev/null")
      return sup.eventually(function()
        return io.open(sock, "rb") ~= nil or os.execute("test -S " .. q(sock)) == 0
      end, 10)
    end

    it("the console client refuses a socket served by another user in a shared directory", function()
      if io.popen("id -u"):read("*l") ~= "0" then pending("needs root to play another user") return end
      local shared = dir .. "/shared"
      os.execute("mkdir -m 1777 " .. q(shared) .. " && chmod 1777 " .. q(shared))
      assert.is_truthy(planted(shared, shared .. "/console.sock"))
      local rc, out = sup.run({}, { q(sup.bin), "console", "--socket", q(shared .. "/console.sock"), "-e", "'return 1'" })
      assert.are_not.equal(0, rc, out)
      assert.matches("refusing " .. shared .. "/console.sock: the process behind it runs as uid", out, 1, true)
    end)

    it("the console client accepts the owner of a directory only it may write", function()
      if io.popen("id -u"):read("*l") ~= "0" then pending("needs root to play another user") return end
      local own = dir .. "/own"
      os.execute("mkdir -m 700 " .. q(own) .. " && chown nobody " .. q(own))
      assert.is_truthy(planted(own, own .. "/console.sock"))
      local _, out = sup.run({}, { q(sup.bin), "console", "--socket", q(own .. "/console.sock"), "-e", "'return 1'" })
      assert.is_nil(out:find("refusing", 1, true), out)
    end)
  end)
end)
