-- spec/lua/support/common.lua -- what the spec support modules share
-- (conditional_, sidecar_, engine_, host_ and evm_support, and the child
-- scripts conditional_child and sidecar_child), and the tools that drive
-- qtgd from inside it (tools/chaos.d, tools/bench.d/bench.lua, tools/demo.lua,
-- tools/package-smoke.lua): shell quoting and commands, the tree and the
-- qtgd binary, files, temporary directories, unique ids, polling until a
-- deadline, one worker tick and one query on a fresh session, processes
-- started in the background (by pid, with their exit codes; qtgd children
-- and their result files; stand-in servers and their port files; callback
-- receivers and their records) and JSON-RPC to a dev chain.  Waiting always
-- polls with qtg.sleep, so the host's loop never blocks.  Does no I/O while
-- it loads (a spec requires it from inside its blocks: `require` cannot
-- yield).  A tool finds it by putting the tree (its own path up to
-- /tools/) on package.path.
local qtg = require "qtg"
local cjson = require "cjson"
local canon = require "qtg.canon_json"

local M = {}

-- ---- the shell, the tree, the binary --------------------------------------------

-- quote(s) -> s as one single-quoted shell word.
local function quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
M.quote = quote

-- sh(cmd) -> stdout and stderr of the shell command, its exit code.
local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"__rc=$?\"")
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("__rc=(%d+)%s*$"))
  return (out:gsub("__rc=%d+%s*$", "")), rc
end
M.sh = sh

-- The tree qtgd runs from: $QTG_ROOT, else the host's own root.
local function root()
  local r = os.getenv("QTG_ROOT")
  if r and r ~= "" then return r end
  return qtg.root
end
M.root = root

-- The qtgd binary for child processes: $QTG_BIN, else the running one (the
-- parent of the shell io.popen starts).
local function bin()
  local b = os.getenv("QTG_BIN")
  if b and b ~= "" then return b end
  local p = io.popen("readlink -f /proc/$PPID/exe")
  local path = p:read("*l")
  p:close()
  return path
end
M.bin = bin

-- ---- files, temporary directories, ids --------------------------------------------

-- read(path) -> the file's bytes, or nil when it cannot be opened.
local function read(path)
  local f = io.open(path, "rb")
  if f then
    local data = f:read("*a")
    f:close()
    return data
  end
  return nil
end
M.read = read

-- exists(path) -> true when the file can be opened (without reading it).
local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end
M.exists = exists

-- write(path, data[, mode]): replace the file; mode ("600") is chmod'ed.
local function write(path, data, mode)
  local f, err = io.open(path, "wb")
  if not f then error("cannot write " .. path .. ": " .. tostring(err), 2) end
  f:write(data)
  f:close()
  if mode and os.execute("chmod " .. mode .. " " .. quote(path)) ~= 0 then
    error("cannot chmod " .. mode .. " " .. path, 2)
  end
end
M.write = write

-- tmpdir(name[, keep]) -> a fresh directory /tmp/NAME.XXXXXX, appended to
-- the list keep when given (for remove_dirs at teardown).
local function tmpdir(name, keep)
  local p = io.popen("mktemp -d " .. quote("/tmp/" .. name .. ".XXXXXX"))
  local dir = p:read("*l")
  p:close()
  if not dir or dir == "" then error("mktemp -d /tmp/" .. name .. ".XXXXXX gave no directory", 2) end
  if keep then keep[#keep + 1] = dir end
  return dir
end
M.tmpdir = tmpdir

-- remove_dirs(list): rm -rf every directory in list and empty it.
local function remove_dirs(list)
  for i = #list, 1, -1 do
    os.execute("rm -rf " .. quote(list[i]))
    list[i] = nil
  end
end
M.remove_dirs = remove_dirs

-- kill_pids(list): SIGTERM every process id in list and empty it.
local function kill_pids(list)
  for i = #list, 1, -1 do
    os.execute("kill " .. list[i] .. " 2>/dev/null")
    list[i] = nil
  end
end
M.kill_pids = kill_pids

-- uid(prefix, bytes) -> "PREFIX-<2*bytes random hex digits>".
local function uid(prefix, bytes)
  return prefix .. "-" .. qtg.crypto.hex(qtg.crypto.random_bytes(bytes))
end
M.uid = uid

-- scratch_table(prefix, rows) -> the name of a new table (id int PRIMARY
-- KEY, n int) holding rows 1..rows with n = 0, for a spec to lock and write;
-- drop it with DROP TABLE.
function M.scratch_table(prefix, rows)
  local name = prefix .. "_" .. uid("t", 6):lower():gsub("[^%w_]", "_")
  M.query("CREATE TABLE " .. name .. " (id int PRIMARY KEY, n int NOT NULL)")
  M.query("INSERT INTO " .. name .. " SELECT g, 0 FROM generate_series(1, $1::int) g", rows)
  return name
end

-- ---- waiting ----------------------------------------------------------------------------

-- poll(fn, seconds, step) -> fn's first truthy value, or nil once `seconds`
-- (default 20) have passed; fn is called every `step` seconds (0.05).
local function poll(fn, seconds, step)
  local deadline = qtg.monotonic() + (seconds or 20)
  while true do
    local v = fn()
    if v then return v end
    if qtg.monotonic() > deadline then return nil end
    qtg.sleep(step or 0.05)
  end
end
M.poll = poll

-- wait_for(fn, seconds, what, step) -> fn's first truthy value; like poll,
-- but a timeout raises an error naming `what` (a string, or a function
-- called then, for a description of the state at that time) and what was
-- seen: the second value fn returned last, when it gave one.
local function wait_for(fn, seconds, what, step)
  seconds = seconds or 20
  local seen
  local v = poll(function()
    local value, state = fn()
    seen = state
    return value
  end, seconds, step)
  if v then return v end
  if type(what) == "function" then what = what() end
  error(("timed out after %s s waiting for %s%s"):format(seconds, tostring(what or "a condition"),
    seen ~= nil and ("; last seen: " .. tostring(seen)) or ""), 2)
end
M.wait_for = wait_for

-- wait_port_file(path, seconds, what[, log]) -> port, pid: waits for a
-- stand-in server's "PORT[ PID]" file; on timeout the error shows the log.
local function wait_port_file(path, seconds, what, log)
  local text = wait_for(function() return read(path) end, seconds, function()
    return tostring(what) .. " to write " .. path .. (log and (" (log " .. log .. ": "
      .. tostring(read(log)) .. ")") or "")
  end)
  local port, pid = text:match("^(%d+)%s*(%d*)")
  if not port then error("no port in " .. path .. ": " .. text, 2) end
  return tonumber(port), pid ~= "" and pid or nil
end
M.wait_port_file = wait_port_file

-- ---- the database -------------------------------------------------------------------

-- tick(worker[, passes]) -> the count of one tick of qtg.workers.WORKER on
-- a fresh session, as the runtime runs it (an open transaction is rolled
-- back).  A tick that runs several passes (the dispatcher's) runs `passes`
-- of them, one unless given: the specs assert pass by pass.
local function tick(worker, passes)
  local w = require("qtg.workers." .. worker)
  local s = qtg.db.acquire()
  local ok, n = pcall(w.tick, s, passes or 1)
  if s:in_transaction() then s:rollback() end
  s:release()
  if not ok then error(n, 0) end
  return n
end
M.tick = tick

-- query(sql, ...) -> rows, n on a session of its own (released on error).
local function session_query(s, sql, ...) return s:query(sql, ...) end
local function query(sql, ...)
  return qtg.db.with_session(session_query, sql, ...)
end
M.query = query

-- database_url(dbname) -> MG_DATABASE_URL naming another database on the
-- same cluster (a scratch database a spec creates and drops).
function M.database_url(dbname)
  local url = assert(os.getenv("MG_DATABASE_URL"), "MG_DATABASE_URL is not set")
  local head, _, tail = url:match("^(%a[%w+.-]*://[^/]*/)([^?]*)(.*)$")
  assert(head, "cannot find the database name in MG_DATABASE_URL")
  return head .. dbname .. tail
end

-- waiting_on(pid[, application]) -> how many server processes of qtgd's
-- (or of that application_name: "qtgd signer") wait on a lock the server
-- process pid holds.
function M.waiting_on(pid, application)
  return query([[SELECT count(*)::int AS n FROM pg_stat_activity
                  WHERE application_name = $2 AND $1 = ANY(pg_blocking_pids(pid))]], pid, application or "qtgd")[1].n
end

-- statement(id, deployment[, kind[, step]]) -> the text a key signs for
-- request id in that deployment: its approval statement, with kind
-- "initiation" its maker's, with kind "attestation" the one that its
-- manual step `step` is done (sql/0190, sql/0192, sql/0206).
function M.statement(id, deployment, kind, step)
  kind = kind or "approval"
  if kind == "attestation" then
    assert(step, "an attestation names its step")
    return query("SELECT qtg_attestation_statement(r, $2, $3) AS t FROM movement_requests r WHERE id = $1::uuid",
      id, deployment, step)[1].t
  end
  local fn = assert(({ approval = "qtg_approval_statement", initiation = "qtg_initiation_statement" })[kind],
    "kind is approval, initiation or attestation")
  return query("SELECT " .. fn .. "(r, $2) AS t FROM movement_requests r WHERE id = $1::uuid", id, deployment)[1].t
end

-- psql(url, sql) -> what psql printed (unaligned, tuples only): one
-- statement on another database, or as another role, through psql; raises
-- with psql's message when it fails.
function M.psql(url, sql)
  local out, rc = M.sh(("psql %s -v ON_ERROR_STOP=1 -Atqc %s"):format(M.quote(url), M.quote(sql)))
  assert(rc == 0, out)
  return out
end

-- unfrozen(s, sql, ...): one statement with triggers off (a superuser's
-- session_replication_role = replica), for a spec moving a request that
-- left PENDING_APPROVAL to another network class (the freeze trigger,
-- sql/0070, refuses that to everyone else), or writing a row the guards
-- refuse to attack a check further on (the signer's).
function M.unfrozen(s, sql, ...)
  s:query("SET session_replication_role = replica")
  local ok, res = pcall(s.query, s, sql, ...)
  s:query("RESET session_replication_role")
  if not ok then error(res, 0) end
  return res
end

-- ---- processes ---------------------------------------------------------------------------

-- base_env(extra) -> the environment of a child qtgd: this database, no
-- console, info logs; extra overrides.
function M.base_env(extra)
  local env = { MG_DATABASE_URL = os.getenv("MG_DATABASE_URL"), MG_CONSOLE_ENABLED = "false",
                MG_LOG_LEVEL = "info" }
  for k, v in pairs(extra or {}) do env[k] = v end
  return env
end

-- env_words(env) -> "K='v' ..." (sorted by name), for `env`.
local function env_words(env)
  local names = {}
  for k in pairs(env or {}) do names[#names + 1] = k end
  table.sort(names)
  for i, k in ipairs(names) do names[i] = k .. "=" .. quote(env[k]) end
  return table.concat(names, " ")
end
M.env_words = env_words

-- background(cmd, log) -> pid: runs the shell command cmd in the background
-- (stdin /dev/null, stdout and stderr to log).
local function background(cmd, log)
  local p = io.popen(cmd .. " </dev/null >" .. quote(log) .. " 2>&1 & echo $!")
  local pid = tonumber(p:read("*l"))
  p:close()
  if not pid then error("cannot start in the background: " .. cmd, 2) end
  return pid
end
M.background = background

-- A TCP forwarder LHOST:LPORT (LPORT 0: any; LHOST, the optional fourth
-- argument, 127.0.0.1 when absent) -> TARGET ("host:port", or "unix:/path"
-- for a Unix socket), one pipe per connection; it writes the port it
-- listens on to PORTFILE (by rename).  A spec stops it to cut a daemon off
-- from what it talks to (an RPC endpoint, the database), and starts it
-- again on the same port.
local FORWARDER = [=[
import os, socket, sys, threading
lport, target, portfile = int(sys.argv[1]), sys.argv[2], sys.argv[3]
lhost = sys.argv[4] if len(sys.argv) > 4 else "127.0.0.1"
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((lhost, lport))
srv.listen(64)
with open(portfile + ".tmp", "w") as f:
    f.write("%d" % srv.getsockname()[1])
os.rename(portfile + ".tmp", portfile)
def connect():
    if target.startswith("unix:"):
        u = socket.socket(socket.AF_UNIX)
        u.connect(target[5:])
        return u
    h, _, p = target.rpartition(":")
    return socket.create_connection((h, int(p)))
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    finally:
        for x in (a, b):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
while True:
    c, _ = srv.accept()
    try:
        u = connect()
    except OSError:
        c.close()
        continue
    threading.Thread(target=pipe, args=(c, u), daemon=True).start()
    threading.Thread(target=pipe, args=(u, c), daemon=True).start()
]=]

M.FORWARDER = FORWARDER

-- start_forwarder(dir, target[, port]) -> {port=, pid=}: FORWARDER to
-- target (a port number: 127.0.0.1; else as FORWARDER takes it), its files
-- in dir; stop it with stop_forwarder.
function M.start_forwarder(dir, target, port)
  write(dir .. "/fwd.py", FORWARDER)
  if type(target) == "number" then target = "127.0.0.1:" .. target end
  local portfile, log = dir .. "/fwd.port", dir .. "/fwd.log"
  os.remove(portfile)
  local pid = background(("python3 %s %d %s %s"):format(quote(dir .. "/fwd.py"), port or 0,
    quote(target), quote(portfile)), log)
  return { port = wait_port_file(portfile, 20, "the forwarder", log), pid = pid }
end

-- stop_forwarder(f): kill it and wait until it is gone.
function M.stop_forwarder(f)
  os.execute("kill " .. f.pid .. " 2>/dev/null")
  wait_for(function() return os.execute("kill -0 " .. f.pid .. " 2>/dev/null") ~= 0 end, 10,
    "the forwarder to stop")
end

-- start_script(dir, name, env, script, args) -> {out=, log=, pid=}: a child
-- `qtgd exec spec/lua/SCRIPT ARGS... DIR/NAME.result` in the background,
-- with env (and MG_CONSOLE_ENABLED=false) and its output in DIR/NAME.log.
-- The script writes its result file by rename (see child_main).
function M.start_script(dir, name, env, script, args)
  local child = { out = dir .. "/" .. name .. ".result", log = dir .. "/" .. name .. ".log" }
  local e = {}
  for k, v in pairs(env or {}) do e[k] = v end
  e.MG_CONSOLE_ENABLED = "false"
  local words = { "env", env_words(e), quote(bin()), "exec", quote(root() .. "/spec/lua/" .. script) }
  for _, a in ipairs(args) do words[#words + 1] = quote(a) end
  words[#words + 1] = quote(child.out)
  child.pid = background(table.concat(words, " "), child.log)
  return child
end

-- wait_result(child, seconds) -> the decoded result of a start_script child.
function M.wait_result(child, seconds)
  local text = wait_for(function() return read(child.out) end, seconds, function()
    return "child " .. child.out .. " (log: " .. tostring(read(child.log)) .. ")"
  end)
  return cjson.decode(text)
end

-- gated_transaction(gate, hold, fn) -> ok, res: a child's racing write.
-- Waits for the gate file (so racing children start together), runs fn(s)
-- in a transaction of its own session and, when it did not raise, holds the
-- transaction open `hold` seconds before committing (so the racers
-- overlap); rolls back when it raised.
function M.gated_transaction(gate, hold, fn)
  wait_for(function() return read(gate) end, 30)
  local s = qtg.db.acquire()
  s:begin()
  local ok, res = pcall(fn, s)
  if ok then
    qtg.sleep(tonumber(hold))
    s:commit()
  else
    s:rollback()
  end
  s:release()
  return ok, res
end

-- child_main(run, out) -> exit code: the end of a child script.  Writes
-- run()'s table, or {ok=false, error=} when it raised, to `out` by rename
-- (the parent never reads half a file).
function M.child_main(run, out)
  local ok, res = pcall(run)
  if not ok then res = { ok = false, error = tostring(res) } end
  write(out .. ".tmp", canon.encode(res))
  assert(os.rename(out .. ".tmp", out))
  return ok and 0 or 1
end

-- spawn(base, env, cmd) -> h: the shell command cmd (its words quoted by
-- the caller) with env added, in the background, stdin /dev/null: its
-- output in BASE.log, its pid in BASE.pid and, once it ends, its exit code
-- in BASE.rc (written by the subshell that waits for it: 128+N for signal
-- N).  `env` execs cmd, so h.pid is the command's own process.
-- h = {base, log, pidfile, rcfile, pid, started (qtg.monotonic)}.
local function spawn(base, env, cmd)
  local h = { base = base, log = base .. ".log", pidfile = base .. ".pid", rcfile = base .. ".rc",
              started = qtg.monotonic() }
  os.remove(h.pidfile)
  os.remove(h.rcfile)
  local line = ("( env %s %s >%s 2>&1 </dev/null & c=$!; echo $c >%s; wait $c; echo $? >%s ) >/dev/null 2>&1 </dev/null &")
    :format(env_words(env), cmd, quote(h.log), quote(h.pidfile), quote(h.rcfile))
  if os.execute("sh -c " .. quote(line)) ~= 0 then error("cannot start " .. cmd, 2) end
  h.pid = tonumber(wait_for(function()
    local t = read(h.pidfile)
    return t and t:match("^(%d+)\n")
  end, 10, "the pid of " .. cmd))
  return h
end
M.spawn = spawn

-- rc(h) -> the exit code of a spawned process, nil while it runs.
local function rc(h)
  local t = read(h.rcfile)
  return t and tonumber(t:match("^(%d+)\n"))
end
M.rc = rc

-- alive(h) -> true while a spawned process has not exited.
function M.alive(h) return rc(h) == nil end

-- exit_code(h, seconds) -> the exit code of a spawned process, or nil if it
-- has not exited within `seconds` (default 30).
local function exit_code(h, seconds)
  return poll(function() return rc(h) end, seconds or 30)
end
M.exit_code = exit_code

-- signal(h, sig) -> true when SIG ("TERM", "KILL", ...) was delivered to a
-- spawned process; never to one that exited (its pid may be another's now)
-- nor to a pid <= 1 (`kill -1` would signal every process of this user).
local function signal(h, sig)
  local pid = tonumber(h.pid)
  if not pid or pid <= 1 or rc(h) ~= nil then return false end
  return os.execute(("kill -%s %d 2>/dev/null"):format(sig, pid)) == 0
end
M.signal = signal

-- stop(h, seconds) -> the exit code of a spawned process after SIGTERM, or
-- nil when it did not exit within `seconds` (default 30; it is then killed
-- with SIGKILL).
function M.stop(h, seconds)
  signal(h, "TERM")
  local code = exit_code(h, seconds)
  if code == nil then signal(h, "KILL") end
  return code
end

-- wait_log(h, pattern, seconds, what) -> the first capture (else the match)
-- of the Lua pattern in a spawned process's log, once it is there; raises
-- naming `what`, with the end of the log, when the process exits first or
-- `seconds` pass.
local function wait_log(h, pattern, seconds, what)
  local function log_end() return "log " .. h.log .. ": " .. (read(h.log) or ""):sub(-1500) end
  local found
  wait_for(function()
    found = (read(h.log) or ""):match(pattern)
    return found or rc(h) ~= nil
  end, seconds, function() return tostring(what) .. " (" .. log_end() .. ")" end)
  if found then return found end
  error(("%s: the process exited with %s first (%s)"):format(tostring(what), tostring(rc(h)), log_end()), 2)
end
M.wait_log = wait_log

-- ---- callback receivers -------------------------------------------------------------

-- start_receiver(dir, name, opts) -> h: tools/fake-receiver spawned as
-- DIR/NAME (its log DIR/NAME.log), once it has written its port file;
-- h.port, h.record (opts.record, else DIR/NAME.jsonl) and h.url
-- (http://HOST:PORT/callbacks/NAME) added.  opts: mode ("ok"), keys
-- ({id = path}: verify signatures), bind (127.0.0.1 unless given), args (a
-- list of further words, quoted here).
function M.start_receiver(dir, name, opts)
  opts = opts or {}
  local record = opts.record or (dir .. "/" .. name .. ".jsonl")
  local portfile = dir .. "/" .. name .. ".port"
  os.remove(portfile)
  local words = { quote(root() .. "/tools/fake-receiver"), "--mode", quote(opts.mode or "ok"),
                  "--record", quote(record), "--port-file", quote(portfile) }
  local ids = {}
  for id in pairs(opts.keys or {}) do ids[#ids + 1] = id end
  table.sort(ids)
  for _, id in ipairs(ids) do
    words[#words + 1] = "--key-file " .. quote(id .. "=" .. opts.keys[id])
  end
  if opts.bind then words[#words + 1] = "--bind " .. quote(opts.bind) end
  for _, a in ipairs(opts.args or {}) do words[#words + 1] = quote(a) end
  local h = spawn(dir .. "/" .. name, {}, table.concat(words, " "))
  h.port = wait_port_file(portfile, 30, "receiver " .. name, h.log)
  h.record = record
  local host = opts.bind and (opts.bind:find(":", 1, true) and "[" .. opts.bind .. "]" or opts.bind)
    or "127.0.0.1"
  h.url = "http://" .. host .. ":" .. h.port .. "/callbacks/" .. name
  return h
end

-- records(path) -> the requests a receiver recorded (one JSON object a
-- line), in arrival order; a last line not yet complete is left for later.
function M.records(path)
  local out = {}
  for line in (read(path) or ""):gmatch("([^\n]*)\n") do
    if line ~= "" then
      local ok, e = pcall(cjson.decode, line)
      if not ok then error("bad line in the receiver's record " .. path .. ": " .. line:sub(1, 200), 2) end
      out[#out + 1] = e
    end
  end
  return out
end

-- header(entry, name) -> the value of header NAME (any case) in a recorded
-- request, or nil.
function M.header(entry, name)
  name = name:lower()
  for k, v in pairs(entry.headers or {}) do
    if k:lower() == name then return v end
  end
  return nil
end

-- ---- a dev chain (anvil) ----------------------------------------------------------------

-- anvil_bin() -> the anvil binary: `tools/anvil path` installs
-- @foundry-rs/anvil from npm the first time; raises when it gives none.
function M.anvil_bin()
  local out = sh(quote(root() .. "/tools/anvil") .. " path")
  local path = out:match("([^\n]*anvil)%s*$")
  if not (path and exists(path)) then error("tools/anvil path did not give an anvil binary:\n" .. out, 2) end
  return path
end

-- start_anvil(base, opts) -> h: anvil spawned as BASE (common.spawn) on
-- 127.0.0.1, on a free port it picks itself (--port 0), once it listens;
-- h.port, h.url, and h.address (lower case) and h.key (hex) of its account
-- 0 added.  opts: chain_id (31337), accounts (10), block_time (interval
-- mining: blocks keep coming, so confirmations grow without traffic).
function M.start_anvil(base, opts)
  opts = opts or {}
  local words = { quote(M.anvil_bin()), "--host", "127.0.0.1", "--port", "0",
                  "--chain-id", tostring(opts.chain_id or 31337), "--accounts", tostring(opts.accounts or 10),
                  "--balance", "10000" }
  if opts.block_time then words[#words + 1] = "--block-time " .. tostring(opts.block_time) end
  local h = spawn(base, {}, table.concat(words, " "))
  h.port = tonumber(wait_log(h, "Listening on 127%.0%.0%.1:(%d+)", 20, "anvil to listen"))
  h.url = "http://127.0.0.1:" .. h.port
  local log = read(h.log)
  local address = log:match("Available Accounts%s*=*%s*%(0%) (0x%x+)")
  h.address, h.key = address and address:lower(), log:match("Private Keys%s*=*%s*%(0%) 0x(%x+)")
  return h
end

-- The dev accounts of anvil's default mnemonic ("test test ... junk"); their
-- keys are public (dev only).
M.DEV = {
  { address = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266", key = "ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80" },
  { address = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8", key = "59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d" },
  { address = "0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc", key = "5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a" },
  { address = "0x90f79bf6eb2c4f870365e785982e1f101e93b906", key = "7c852118294e51e653712a81e05800f419141751be58f605c371e15141b007a6" },
  { address = "0x15d34aaf54267db7d7c367839aaf71a00a2c6a65", key = "47e179ec197488593b187f80a00eb0da91f1b9d0b13f8733639f19c30a34926a" },
  { address = "0x9965507d1a55bcc2695c58ba16fb37d819b0a4dc", key = "8b3a350cf5c34c9194ca85829a2df0ec3153be0318b5e2d3348e872092edffba" },
  { address = "0x976ea74026e726554db657fa54763abd0c3a0aa9", key = "92db14e403b83dfe3df233f83dfa3a0d7096f21ca9b0d6d6b8d88b2b4ec1564e" },
}

-- rpc(url, method, params) -> result; raises on any error.
function M.rpc(url, method, params)
  local parts = {}
  for i, v in ipairs(params or {}) do parts[i] = cjson.encode(v) end
  local body = string.format('{"jsonrpc":"2.0","id":1,"method":"%s","params":[%s]}', method,
    table.concat(parts, ","))
  local resp, err = qtg.http.request{ method = "POST", url = url, body = body, timeout = 10,
    headers = { ["Content-Type"] = "application/json" } }
  if not resp then error("rpc " .. method .. " to " .. url .. ": " .. tostring(err and err.message or err), 2) end
  local ok, doc = pcall(cjson.decode, resp.body)
  if not ok or type(doc) ~= "table" then
    error("rpc " .. method .. " to " .. url .. " answered " .. resp.body:sub(1, 200), 2)
  end
  if doc.error then error("rpc " .. method .. ": " .. cjson.encode(doc.error), 2) end
  return doc.result
end

return M
