-- The console's guard (src/qtg_console_session.c): a console command that
-- never gives the loop back is ended by an interrupt, by its client going
-- away, by MG_CONSOLE_BUSY_LIMIT_SECONDS and by SIGTERM, whatever it does
-- to resist (pcall around the loop, the loop inside coroutine.wrap, in an
-- error handler, as the error handler itself, or in a task it spawns);
-- what it held is given back and the daemon serves on.  Also the command
-- queue's bookkeeping when a queued command finishes without yielding
-- between two that wait (a use-after-free before: the ASan pass of this
-- spec, and fuzz/corpus/console, catch it).
-- A real `qtgd run` on the test database, driven by a raw client (python3)
-- speaking the frame format of src/qtg_console.h.
local common = require "spec.lua.support.common"
local sup -- spec/lua/support/host.lua
local q = common.quote

local PCALL_LOOP = "while true do pcall(function() while true do end end) end"
-- Each prints a line (an 'o' frame reaches the client at once, even while
-- the loop is held) before it starts to spin.
local RUNAWAYS = {
  { "a pcall loop", PCALL_LOOP },
  { "a pcall loop inside coroutine.wrap", "coroutine.wrap(function() " .. PCALL_LOOP .. " end)()" },
  { "coroutine.resume in a loop",
    "while true do coroutine.resume(coroutine.create(function() while true do end end)) end" },
  { "an error handler that gives up", "while true do xpcall(function() while true do end end, "
    .. "function(e) return e end) end" },
  { "an error handler that never returns",
    "xpcall(function() error('x') end, function(e) while true do end end)" },
  { "a pcall loop in a task it spawns", "qtg.spawn(function() " .. PCALL_LOOP .. " end) return 'spawned'" },
}

-- The raw client.  Arguments: the socket, then steps: "e<code>" / "i" /
-- "c<text>" queue a frame; "@o" sends what is queued and waits for an output
-- frame; "@sleepS" sends what is queued and sleeps S seconds; "@close"
-- sends and closes at once.  Then it sends the rest and
-- prints every output ("o <text>") and final frame ("<type> <text>", new
-- lines as " | ") until as many finals came as 'e'/'c' frames were sent, or
-- the server closes.
local RAW_CLIENT = [[
import socket, struct, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(120)
s.connect(sys.argv[1])
buf, pending, commands, finals = b"", [], 0, 0
def frames():
    global buf
    while True:
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
            n = struct.unpack(">I", buf[:4])[0]
            t, body = chr(buf[4]), buf[5:4 + n].decode("utf-8", "replace")
            buf = buf[4 + n:]
            yield t, body
        chunk = s.recv(65536)
        if not chunk:
            return
        buf += chunk
reader = frames()
def send():
    s.sendall(b"".join(struct.pack(">I", len(b) + 1) + t.encode() + b for t, b in pending))
    pending.clear()
def show(t, body):
    global finals
    if t in "orxmk":
        print(t, body.rstrip("\n").replace("\n", " | "), flush=True)
    if t in "rxmk":
        finals += 1
for step in sys.argv[2:]:
    if step == "@o":
        send()
        for t, body in reader:
            show(t, body)
            if t == "o":
                break
    elif step.startswith("@sleep"):
        send()
        time.sleep(float(step[6:]))
    elif step == "@close":
        send()
        s.close()
        sys.exit(0)
    else:
        if step[0] in "ec":
            commands += 1
        pending.append((step[0], step[1:].encode()))
send()
if finals < commands:
    for t, body in reader:
        show(t, body)
        if finals >= commands:
            break
]]

describe("console guard", function()
  local tmp, h, sock, client

  setup(function()
    sup = require "spec.lua.support.host"
    tmp = sup.tmpdir()
    os.execute("mkdir -p " .. q(tmp .. "/run") .. " && chmod 700 " .. q(tmp .. "/run"))
    sock = tmp .. "/run/console.sock"
    client = tmp .. "/raw_client.py"
    sup.write(client, RAW_CLIENT)
    h = sup.start(sup.base_env({ MG_CONSOLE_ENABLED = "true", MG_RUN_DIR = tmp .. "/run",
                                 MG_NETWORK_CLASS = "guard-spec", MG_CONSOLE_BUSY_LIMIT_SECONDS = "4",
                                 -- the busy guard leaves console commands to this guard
                                 MG_TASK_BUSY_LIMIT_SECONDS = "1",
                                 MG_SHUTDOWN_GRACE_SECONDS = "10" }), { "run" })
    assert(sup.eventually(function() return os.execute("test -S " .. q(sock)) == 0 end, 30),
      sup.read(h.log))
  end)
  teardown(function()
    sup.stop_all()
    os.execute("rm -rf " .. q(tmp))
  end)

  -- raw_on(socket, steps...) -> its output lines (waits for it to end);
  -- raw(steps...): on the spec's daemon.
  local function raw_on(path, ...)
    local args = { "python3", q(client), q(path) }
    for _, s in ipairs({ ... }) do args[#args + 1] = q(s) end
    local rc, out = sup.run({}, args)
    assert.equals(0, rc, out)
    return out
  end
  local function raw(...) return raw_on(sock, ...) end

  -- raw_bg(steps...) -> its output file; the client runs in the background.
  local n = 0
  local function raw_bg(...)
    n = n + 1
    local out = ("%s/raw-%d.out"):format(tmp, n)
    local args = { "python3", q(client), q(sock) }
    for _, s in ipairs({ ... }) do args[#args + 1] = q(s) end
    common.background(table.concat(args, " "), out)
    return out
  end

  local function eval(code)
    return raw("e" .. code):match("^(.-)\n?$")
  end

  -- The daemon still answers at once, and only the asking session is left.
  local function serves_on()
    assert.is_truthy(sup.eventually(function()
      return eval("=#qtg.console_server.sessions()") == "r 1"
    end, 30), "a session was left behind")
  end

  for _, case in ipairs(RUNAWAYS) do
    it("an interrupt ends " .. case[1] .. "; the daemon serves on", function()
      local out = raw("eprint('spinning') " .. case[2], "@o", "i")
      assert.matches("o spinning\nx interrupted: stopped by the operator", out, 1, true)
      serves_on()
    end)
  end

  -- print() wrote a client's text raw: an escape sequence in an intent's
  -- asset moved the approver's cursor up and erased the line there.
  it("print() writes control characters escaped, tabs and newlines kept", function()
    local out = raw([[eprint("ETH\27[1A\27[2KX", "b\tc\194\155d") print("two\nlines")]])
    assert.truthy(out:find("o ETH\\x1b[1A\\x1b[2KX\tb\tc\\u009bd\n", 1, true), out)
    assert.is_nil(out:find("\27", 1, true), out)
    assert.truthy(out:find("o two | lines", 1, true), out)
  end)

  it("xpcall in console code still answers as xpcall (values kept, the handler's result on an error)", function()
    assert.equal("r 4", eval("=select('#', xpcall(function(a) return a, nil, 3 end, error, 1))"))
    assert.equal('r "handled: boom"',
      eval("=select(2, xpcall(function() error('boom', 0) end, function(e) return 'handled: ' .. e end))"))
  end)

  -- qtg.executors answers a call the busy guard stopped without making it
  -- again; an operator's interrupt of a call made from the console (here
  -- one waiting, not holding the loop) is no such stop (a review, session
  -- 38: it was taken for one, and the node's observe answered so).
  it("an executor call interrupted from the console is not taken for a busy stop", function()
    local ctx = "{ request_node_id = '11111111-1111-1111-1111-111111111111', attempt_no = 1 }"
    local out = raw("eprint('calling') return require('qtg.executors').call({ observe = function() "
      .. "while true do qtg.sleep(0.05) end end }, 'observe', " .. ctx .. ")", "@o", "i")
    assert.matches("o calling\nx interrupted: stopped by the operator", out, 1, true)
    local after = raw("ecollectgarbage() collectgarbage() return #require('qtg.busy_stops').keys()")
    assert.matches("r 0", after, 1, true)
    local again = raw("ereturn (require('qtg.executors').call({ observe = function() return { status = 'OBSERVING' } end }, "
      .. "'observe', " .. ctx .. ")).status")
    assert.matches('r "OBSERVING"', again, 1, true)
  end)

  it("a client that goes away ends its runaway command", function()
    raw("eprint('spinning') " .. PCALL_LOOP, "@o", "@close")
    serves_on()
  end)

  it("a command holding the loop past MG_CONSOLE_BUSY_LIMIT_SECONDS is ended, pcall or not", function()
    local out = raw("e" .. PCALL_LOOP)
    assert.matches("x interrupted: the command held the loop longer than MG_CONSOLE_BUSY_LIMIT_SECONDS",
      out, 1, true)
    serves_on()
  end)

  it("a task a command spawned that spins after the command ended is held to the busy limit too", function()
    local out = raw("eqtg.spawn(function() qtg.sleep(0.2) " .. PCALL_LOOP .. " end) return 'spawned'")
    assert.equals('r "spawned"\n', out)
    assert.is_truthy(sup.eventually(function()
      return sup.read(h.log):find("stopping a task a console command spawned", 1, true)
    end, 60), sup.read(h.log))
    serves_on()
  end)

  it("a command that yields now and then is not held to the limit, and still stops on an interrupt", function()
    local out = raw("eprint('sleeping') while true do pcall(qtg.sleep, 0.05) end", "@o", "i")
    assert.matches("x interrupted: stopped by the operator", out, 1, true)
  end)

  -- qtg.join had no way to stop waiting: a command joining a long task
  -- kept its console session until that task ended.
  it("an interrupt ends a command waiting in qtg.join; the joined task runs on", function()
    local t0 = require("qtg").monotonic()
    local out = raw("eprint('joining') qtg.join(qtg.spawn(function() qtg.sleep(60) end))", "@o", "i")
    local took = require("qtg").monotonic() - t0
    assert.matches("o joining\nx interrupted: stopped by the operator", out, 1, true)
    -- at once, not when the joined task's 60 s sleep ends
    assert.is_true(took < 30, ("the interrupt took %.1f s"):format(took))
    assert.equals("r 1", eval("=(function() local ok, v = qtg.join(qtg.spawn(function() return 1 end)) "
      .. "assert(ok) return v end)()"))
    serves_on()
  end)

  it("gives back the database session and the transaction the command held", function()
    local code = "qtg.db.with_session(function(s) s:transaction(function() "
      .. "s:query('SELECT 1') print('in a transaction') " .. PCALL_LOOP .. " end) end)"
    local out = raw("e" .. code, "@o", "i")
    assert.matches("x interrupted: stopped by the operator", out, 1, true)
    assert.is_truthy(sup.eventually(function()
      return eval("=sql([[SELECT count(*) AS n FROM pg_stat_activity WHERE state = 'idle in transaction' "
        .. "AND datname = current_database()]])[1].n") == "r 0"
    end, 30), "a transaction was left open")
  end)

  it("a worker's tick is never hit by a command's interrupt", function()
    raw("eprint('spinning') " .. PCALL_LOOP, "@o", "i")
    raw("eprint('sleeping') while true do pcall(qtg.sleep, 0.01) end", "@o", "i")
    local errs = eval("=(function() local n = 0 for _, w in ipairs(qtg.runtime.workers()) do "
      .. "n = n + w.errors_total end return n end)()")
    assert.equals("r 0", errs)
  end)

  it("a command that finishes at once between two that wait keeps the queue's bookkeeping", function()
    -- the first interrupt ends the first sleep; the second must reach the
    -- third command, not the (freed) second.  The middle one is a
    -- completion, which finishes without yielding (an evaluation yields
    -- at least once: its audit row is written before it runs).
    local out = raw("eqtg.sleep(0.05)", "cqtg.slee", "eqtg.sleep(30)", "i", "i")
    assert.equals("x interrupted: stopped by the operator\nk qtg.sleep\nx interrupted: stopped by the operator\n", out)
    serves_on()
  end)

  -- The command drops its session without releasing it (until the
  -- collector finds it, nothing does):
  -- the interrupt itself shuts the connection down (qtg_pg_forget), and the
  -- server process, which looks at its client every second while a
  -- statement runs, ends the wait.  Before, it waited as long as the lock
  -- was held elsewhere, its own locks held too.
  it("an interrupted query waiting on a lock ends on the server, though nothing released its session", function()
    local holder = require("qtg").db.acquire()
    holder:begin()
    holder:query("SELECT pg_advisory_xact_lock(771177)")
    local me = holder:pid()
    local ok, err = pcall(function()
      local out = raw("eguard_s = qtg.db.acquire() print('waiting') "
        .. "guard_s:query('SELECT pg_advisory_xact_lock(771177)')", "@o", "@sleep1", "i")
      assert.matches("o waiting\nx interrupted: stopped by the operator", out, 1, true)
      assert.is_truthy(sup.eventually(function() return common.waiting_on(me) == 0 end, 8),
        "the interrupted query's server process still waits on the lock")
    end)
    holder:rollback()
    holder:release()
    assert(ok, err)
    -- the session is the collector's now (a command's globals do not outlive it)
    assert.equals("r true", eval("=(function() collectgarbage() collectgarbage() return true end)()"))
    serves_on()
  end)

  -- A console reload ran in the command's task: the guard's stop cut it
  -- between loading the new modules and putting the old ones back, so the
  -- new ones stayed in force without a log line or an audit row.  It runs in
  -- a task of its own now, which the busy guard stops as it stops SIGHUP's.
  it("a reload whose module never finishes loading fails whole: the old code runs on, logged and audited", function()
    local dir = tmp .. "/reload"
    local run = dir .. "/run"
    os.execute("mkdir -p " .. q(dir .. "/lua/qtg/workers") .. " " .. q(run) .. " && chmod 700 " .. q(run)
      .. " && chmod 755 " .. q(dir) .. " " .. q(dir .. "/lua") .. " " .. q(dir .. "/lua/qtg") .. " "
      .. q(dir .. "/lua/qtg/workers"))
    local d = sup.start(sup.base_env({ MG_CONSOLE_ENABLED = "true", MG_RUN_DIR = run,
                                       MG_LUA_PATH = dir .. "/lua", MG_NETWORK_CLASS = "guard-reload",
                                       MG_CONSOLE_BUSY_LIMIT_SECONDS = "2", MG_TASK_BUSY_LIMIT_SECONDS = "1" }),
      { "run" })
    local dsock = run .. "/console.sock"
    assert(sup.eventually(function() return os.execute("test -S " .. q(dsock)) == 0 end, 30), sup.read(d.log))
    local function deval(code) return raw_on(dsock, "e" .. code):match("^(.-)\n?$") end
    -- the operator installs a new policy module and a worker module that spins while it loads
    sup.write(dir .. "/lua/qtg/observe_intervals.lua",
      "local M = dofile(" .. string.format("%q", sup.root .. "/lua/qtg/observe_intervals.lua") .. ") M.SPEC_NEW = true return M")
    sup.write(dir .. "/lua/qtg/workers/template_proposal_expiration.lua", "while true do end")
    os.execute("chmod 644 " .. q(dir .. "/lua/qtg/observe_intervals.lua") .. " "
      .. q(dir .. "/lua/qtg/workers/template_proposal_expiration.lua"))
    local audits = "=sql([[SELECT count(*)::int AS n FROM (SELECT action FROM audit_outbox UNION ALL "
      .. "SELECT action FROM audit_events) a WHERE action = 'policy.reload']])[1].n"
    local before = tonumber(deval(audits):match("r (%d+)"))
    local out = deval("return reload()")
    assert.matches("^x ", out)
    assert.is_nil(out:find("interrupted", 1, true), out)
    assert.equals("r nil", deval("=require('qtg.observe_intervals').SPEC_NEW"))
    assert.is_truthy(sup.eventually(function()
      return sup.read(d.log):find("policy reload failed; the old code keeps running", 1, true)
    end, 30), sup.read(d.log))
    assert.equals("r " .. (before + 1), deval(audits))
    assert.equals(0, sup.stop(d, 60), sup.read(d.log))
  end)

  -- A chunk whose console.eval audit row could not be written ran anyway,
  -- unrecorded, with a warning in the log only.
  it("a chunk whose audit record cannot be written is not run, and says why", function()
    sup.with_session(function(s)
      s:exec([[CREATE FUNCTION spec_refuse_console_audit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.action = 'console.eval' AND NEW.detail->>'code' LIKE '%spec_unrecorded = 42%' THEN
            RAISE EXCEPTION 'spec: the audit insert is refused';
          END IF;
          RETURN NEW;
        END $$]])
      s:exec("CREATE TRIGGER spec_refuse_console_audit BEFORE INSERT ON audit_outbox "
        .. "FOR EACH ROW EXECUTE FUNCTION spec_refuse_console_audit()")
    end)
    local ok, err = pcall(function()
      -- the chunk's effect is on the process's qtg table, which every session sees
      local out = eval("qtg.spec_unrecorded = 42 return 'ran'")
      assert.matches("^x not run: its audit record cannot be written %(.*spec: the audit insert is refused", out)
      assert.equals("r nil", eval("=qtg.spec_unrecorded"))
      assert.is_truthy(sup.eventually(function()
        return sup.read(h.log):find("console chunk refused: its audit record cannot be written", 1, true)
      end, 30), sup.read(h.log))
    end)
    sup.with_session(function(s)
      s:exec("DROP TRIGGER spec_refuse_console_audit ON audit_outbox")
      s:exec("DROP FUNCTION spec_refuse_console_audit()")
    end)
    assert(ok, err)
    -- with the record written again, the same chunk runs
    assert.equals([[r "ran"]], eval("qtg.spec_unrecorded = 42 return 'ran'"))
    assert.equals("r 42", eval("=qtg.spec_unrecorded"))
    eval("qtg.spec_unrecorded = nil")
  end)

  -- A session collected while a task waited for one handed its connection
  -- over inside the collector, running the waiting task there: the daemon
  -- died (SIGSEGV in LuaJIT) when an operator interrupted a command holding
  -- every session.  And a console holding them in its variables kept them
  -- after it disconnected, while every other console chunk was refused for
  -- want of a session for its audit row.
  it("a command holding every session gives them back when interrupted or its console goes; the daemon serves on", function()
    local dir = tmp .. "/pool"
    os.execute("mkdir -p " .. q(dir) .. " && chmod 700 " .. q(dir))
    local d = sup.start(sup.base_env({ MG_CONSOLE_ENABLED = "true", MG_RUN_DIR = dir, MG_NETWORK_CLASS = "guard-pool",
                                       MG_DB_POOL_SIZE = "2", MG_DB_ACQUIRE_TIMEOUT_SECONDS = "2" }), { "run" })
    local dsock = dir .. "/console.sock"
    assert(sup.eventually(function() return os.execute("test -S " .. q(dsock)) == 0 end, 30), sup.read(d.log))
    local function draw(...) return raw_on(dsock, ...) end
    local function in_use_settles()
      return sup.eventually(function()
        return draw("e=qtg.db.stats().in_use"):match("^r ([01])\n?$")
      end, 30)
    end
    -- interrupted while the workers wait for a session
    local out = draw("elocal a, b = qtg.db.acquire(), qtg.db.acquire() print('holding') qtg.sleep(60)", "@o", "@sleep1", "i")
    assert.matches("o holding\nx interrupted: stopped by the operator", out, 1, true)
    assert.is_truthy(in_use_settles(), sup.read(d.log))
    -- kept in a console's variables: other consoles are refused, and get the daemon back when it goes
    local held = tmp .. "/pool-held.out"
    local args = { "python3", q(client), q(dsock), q("es1, s2 = qtg.db.acquire(), qtg.db.acquire() print('held')"),
                   q("@o"), q("@sleep120") }
    local holder = common.background(table.concat(args, " "), held)
    assert.is_truthy(sup.eventually(function() return (sup.read(held) or ""):find("o held", 1, true) end, 30),
      sup.read(held))
    out = draw("e=1")
    -- the holding console disconnects once the refusal is seen, however long that took
    os.execute("kill " .. holder)
    assert.matches("^x not run: its audit record cannot be written %(timeout: no database session", out)
    assert.matches("interrupt or disconnect it", out, 1, true)
    assert.is_truthy(in_use_settles(), sup.read(d.log))
    assert.equals("r 2", draw("e=1 + 1"):match("^(.-)\n?$"))
    -- kept where other code still reaches them (a function left in qtg, a
    -- task the command spawned, still running): given back when it goes all the same
    local kept = tmp .. "/pool-kept.out"
    holder = common.background(table.concat({ "python3", q(client), q(dsock),
      q("elocal s1 = qtg.db.acquire() qtg.spec_kept = function() return s1 end "
        .. "qtg.spawn(function() qtg.spec_spawned = qtg.db.acquire() qtg.sleep(60) end) "
        .. "while not qtg.spec_spawned do qtg.sleep(0.05) end print('kept')"),
      q("@o"), q("@sleep120") }, " "), kept)
    assert.is_truthy(sup.eventually(function() return (sup.read(kept) or ""):find("o kept", 1, true) end, 30),
      sup.read(kept))
    os.execute("kill " .. holder)
    assert.is_truthy(in_use_settles(), sup.read(d.log))
    assert.is_truthy(sup.eventually(function()
      return sup.read(d.log):find("console: gave back 2 database sessions the closed console", 1, true)
    end, 30), sup.read(d.log))
    -- what still reaches them holds a released session
    assert.matches("^r false\t\"[^\n]*session already released\"$",
      draw("elocal ok, err = pcall(function() return qtg.spec_kept():query('SELECT 1') end) "
        .. "return ok, tostring(err)"):match("^(.-)\n?$"))
    assert.equals("r 2", draw("eqtg.spec_kept, qtg.spec_spawned = nil, nil return 1 + 1"):match("^(.-)\n?$"))
    local code = sup.stop(d, 60)
    local log = sup.read(d.log)
    assert.equals(0, code, log)
    assert.is_nil(log:find("Sanitizer", 1, true), log)
  end)

  -- The console's guard and its SIGTERM stop are a count hook, and console
  -- code can take it off: such a command held the loop for good, SIGTERM
  -- unserved.  The busy guard aborts it at 2.5 console limits.
  it("a command that takes its guard's hook off is ended with the process at 2.5 limits, naming why", function()
    local run = tmp .. "/unhooked"
    os.execute("mkdir -p " .. q(run) .. " && chmod 700 " .. q(run))
    local d = sup.start(sup.base_env({ MG_CONSOLE_ENABLED = "true", MG_RUN_DIR = run,
                                       MG_NETWORK_CLASS = "guard-unhooked",
                                       MG_CONSOLE_BUSY_LIMIT_SECONDS = "1", MG_TASK_BUSY_LIMIT_SECONDS = "1" }),
      { "run" })
    local dsock = run .. "/console.sock"
    assert(sup.eventually(function() return os.execute("test -S " .. q(dsock)) == 0 end, 30), sup.read(d.log))
    common.background(table.concat({ "python3", q(client), q(dsock), q("edebug.sethook() while true do end") }, " "),
      tmp .. "/unhooked.out")
    local rc = sup.wait_exit(d, 30)
    local log = sup.read(d.log)
    assert.equals(134, rc, log) -- SIGABRT: the service manager restarts it
    assert.matches('a console command has held the loop [%d.]+ s, 2.5 times MG_CONSOLE_BUSY_LIMIT_SECONDS, and its '
      .. 'guard could not stop it', log)
  end)

  it("SIGTERM during a runaway command stops the daemon within its grace period", function()
    local out = raw_bg("eprint('spinning') " .. PCALL_LOOP)
    assert.is_truthy(sup.eventually(function() return (sup.read(out) or ""):find("o spinning", 1, true) end, 30))
    assert.equals(0, sup.stop(h, 60), sup.read(h.log))
    assert.is_truthy(sup.eventually(function()
      return (sup.read(out) or ""):find("x interrupted: the daemon is stopping (SIGTERM)", 1, true)
    end, 10), sup.read(out))
    assert.is_nil(sup.read(h.log):match("grace period over"))
  end)
end)
