-- resolve_timeout_spec: qtg.api_net.resolve(host[, seconds]) has a
-- deadline of its own and holds no thread (src/lua_api_net.c: c-ares on the
-- host's loop).  With a DNS server that never answers, a resolver takes
-- timeout x attempts x servers (here 5 s x 2): before the deadline the task
-- waited all of it -- at every callback delivery to the name and at the
-- API's check of a callback_url (lua/qtg/api/ssrf.lua) -- and with glibc's
-- getaddrinfo on libuv's thread pool each such lookup held a thread that
-- long, so a few dead names made every other lookup queue and the host's
-- close wait.
--
-- Played for real: a child `qtgd exec` runs in mount and network
-- namespaces of its own (`unshare --mount --net`, root only), where
-- /etc/resolv.conf is a private bind mount naming 127.0.0.77 (`options
-- timeout:5 attempts:2`) and a UDP socket on 127.0.0.77:53 (python3) reads
-- the queries and answers none.  The machine's own resolv.conf and port 53
-- are left alone.  The child asks, and writes what it saw:
--   * a lookup with a deadline of 1 s: {kind="timeout"} after about 1 s
--     (the old code waited the resolver's 10 s and said "dns");
--   * localhost (/etc/hosts, no DNS) with no deadline given: its address;
--   * the API's check of a callback_url and a delivery's guard, given short
--     deadlines: the refusal a name without an answer gets, naming the
--     timeout; the check's default bound cut to half the API request's
--     timeout ("forbidden_address: ..." for the delivery: a failed attempt,
--     retried);
--   * a batch's guards of four such names (callbacks.guard_all): all at
--     once, so about one deadline for the batch, not four;
--   * a console command waiting in a lookup, interrupted by its operator
--     (the child serves a console on a Unix socket the spec reaches from
--     outside the namespace): the wait is abandoned at once, and the
--     command raises "interrupted" when resumed;
--   * a lookup while five others wait on the same dead server: it times
--     out at its own deadline all the same;
--   * two lookups still pending when the child's host closes: dropped,
--     their memory freed, and the close waits for no resolver (the child
--     exits 0 within a few seconds; on the ASan build its leak check at
--     exit would fail it).
-- The API's check of a callback_url waits outside any database session; a
-- name the stand-in answers late ("slow-...", 2.5 s) shows a token revoked
-- during that wait refused before the request is written.
-- The memory of a lookup is freed once in every order (answer first,
-- deadline first, interrupt first, host close first) -- the ASan pass of
-- this spec checks it.  In this process: the validation of `seconds`.
local qtg = require "qtg"
local cjson = require "cjson"

local common, dir
local q

-- The DNS server that never answers, but for names starting "slow-": those
-- it answers after SLOW_ANSWER_SECONDS, 1.1.1.1 (a public address) for an
-- A question and no address for any other.  Arguments: the ready file, the file it appends
-- one line per query to.  In a new network namespace lo is down: it brings
-- it up first (SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP; no iproute2
-- needed).  It ends by itself after 5 minutes.
local BLACK_HOLE = [=[
import fcntl, os, socket, struct, sys, time
ready, log = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0)))[1]
fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))
s.close()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("127.0.0.77", 53))
u.settimeout(0.05)
SLOW_ANSWER_SECONDS = 2.5
def question(data):
    i = 12
    labels = []
    while data[i] != 0:
        labels.append(data[i + 1:i + 1 + data[i]].decode("ascii", "replace"))
        i += 1 + data[i]
    return ".".join(labels), data[i + 1:i + 3], i + 5
def answer(data):
    name, qtype, end = question(data)
    ans = b""
    if qtype == b"\x00\x01":
        ans = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04\x01\x01\x01\x01"
    return data[:2] + b"\x81\x80\x00\x01" + struct.pack(">H", 1 if ans else 0) + b"\x00\x00\x00\x00" \
        + data[12:end] + ans
with open(ready + ".tmp", "w") as f:
    f.write("%d\n" % os.getpid())
os.rename(ready + ".tmp", ready)
end = time.monotonic() + 300
due = []
while time.monotonic() < end:
    now = time.monotonic()
    for at, data, peer in [d for d in due if d[0] <= now]:
        u.sendto(answer(data), peer)
    due = [d for d in due if d[0] > now]
    try:
        data, peer = u.recvfrom(4096)
    except socket.timeout:
        continue
    with open(log, "a") as f:
        f.write("%d bytes from %s\n" % (len(data), peer[0]))
    try:
        if question(data)[0].startswith("slow-"):
            due.append((time.monotonic() + SLOW_ANSWER_SECONDS, data, peer))
    except IndexError:
        pass
]=]

-- Runs inside the namespaces: the black hole, the bind mount, the child.
-- Arguments: the directory, the qtgd binary, the child's script and its
-- result file (in the directory).
local RUN = [=[
dir=$1; bin=$2; script=$3; result=$4
python3 "$dir/hole.py" "$dir/hole.ready" "$dir/queries" >"$dir/hole.log" 2>&1 & hole=$!
i=0
while [ ! -e "$dir/hole.ready" ]; do
  if ! kill -0 "$hole" 2>/dev/null || [ "$i" -ge 400 ]; then
    echo "the DNS stand-in did not start:"; cat "$dir/hole.log"; kill "$hole" 2>/dev/null; exit 97
  fi
  i=$((i + 1)); sleep 0.05
done
if ! mount --bind "$dir/resolv.conf" /etc/resolv.conf; then kill "$hole"; exit 98; fi
"$bin" exec "$dir/$script" "$dir/$result"; rc=$?
kill "$hole"
exit "$rc"
]=]

-- The child: `qtgd exec child.lua RESULT_FILE`; writes its observations as
-- JSON (by rename), exits 0 once it wrote them.  In the middle it serves
-- the console (MG_RUN_DIR/console.sock) until the file RESULT_FILE.go
-- exists.
-- What each child script starts with: its arguments (the result file),
-- the result's writer (by rename, so the spec never reads half of it) and
-- the spec's go signal (the file RESULT_FILE.go).
local CHILD_LIB = [=[
local out = ...
local qtg = require "qtg"
local cjson = require "cjson"
local function write_result(res)
  local f = assert(io.open(out .. ".tmp", "w"))
  f:write(cjson.encode(res))
  f:close()
  assert(os.rename(out .. ".tmp", out))
end
local function go()
  local f = io.open(out .. ".go")
  if f then f:close() end
  return f ~= nil
end
]=]

local CHILD = CHILD_LIB .. [=[
local ssrf = require "qtg.api.ssrf"
local callbacks = require "qtg.callbacks"
local NAME = "resolve-timeout.example"
local res = {}

local function timed(fn, ...)
  local t0 = qtg.monotonic()
  local a, b = fn(...)
  return qtg.monotonic() - t0, a, b
end

local function lookup(name, seconds)
  local elapsed, addrs, err = timed(qtg.api_net.resolve, name, seconds)
  return { elapsed = elapsed, addrs = addrs or cjson.null,
           kind = err and err.kind or cjson.null, message = err and err.message or cjson.null }
end

-- the resolver's own give-up is 10 s away: the deadline comes first
res.timeout = lookup(NAME, 1)
-- /etc/hosts answers at once, with the default deadline
res.hosts = lookup("localhost")
-- the API's check at creation, with its bound made short
ssrf.CHECK_RESOLVE_SECONDS = 1
local elapsed, ok, why = timed(ssrf.check, "https://" .. NAME .. "/cb")
res.check = { elapsed = elapsed, ok = ok or cjson.null, why = why or cjson.null }
-- the same name again: not asked again while its lookup may still hold a
-- thread in the resolver (ssrf.STALLED_SECONDS)
elapsed, ok, why = timed(ssrf.check, "https://" .. NAME .. "/again")
res.check_again = { elapsed = elapsed, ok = ok or cjson.null, why = why or cjson.null }
-- at its default bound, cut to half the API request's timeout (3 s here)
ssrf.CHECK_RESOLVE_SECONDS = 10
elapsed, ok, why = timed(ssrf.check, "https://api-bound.example/api-bound")
res.check_api_bound = { elapsed = elapsed, ok = ok or cjson.null, why = why or cjson.null }
-- a delivery's guard, given the delivery's timeout
local pin, outcome
elapsed, pin, outcome = timed(callbacks.guard, "https://guard.example:8443/cb", 0.5)
res.guard = { elapsed = elapsed, pin = pin or cjson.null, outcome = outcome or cjson.null }
-- a batch's guards run at once: four names that never answer cost the
-- batch one deadline, not four
local urls = {}
for i = 1, 4 do urls[i] = "https://batch-" .. i .. ".example/cb" end
local guarded
elapsed, guarded = timed(callbacks.guard_all, urls, 1)
res.batch = { elapsed = elapsed, errors = {} }
for i, url in ipairs(urls) do res.batch.errors[i] = guarded[url].refused.error end
-- the console, for the spec to interrupt a command waiting in a lookup
qtg.console_server.start()
local deadline = qtg.monotonic() + 120
while not go() and qtg.monotonic() < deadline do qtg.sleep(0.05) end
-- Four abandoned lookups are still unanswered in the resolver; a fifth is
-- still waiting when the host closes.
qtg.spawn(function() qtg.api_net.resolve("running-at-close.example", 60) end)
-- beside them: its deadline holds all the same
res.queued = lookup("queued.example", 0.5)
-- another still waiting when the host closes
qtg.spawn(function() qtg.api_net.resolve("queued-at-close.example", 60) end)

write_result(res)
return 0
]=]

-- The database's host name never answers either: the pool's connect looks
-- it up in libuv's thread pool (src/qtg_pg.c), so the loop goes on while
-- the lookup waits.  Writes {gap=, acquire={elapsed=, err=}}: the longest
-- gap between 50 ms sleeps of a task that ran while another waited for
-- its session.  With SPEC_HOG=N, N lookups of names that never answer are
-- abandoned first (with getaddrinfo each held a pool thread in the
-- resolver; with c-ares, nothing), and what is timed is a lookup of
-- localhost (from /etc/hosts) instead.
local DB_CHILD = CHILD_LIB .. [=[
local res, done = {}, false
for i = 1, tonumber(os.getenv("SPEC_HOG") or "0") do
  qtg.spawn(function() qtg.api_net.resolve("hog-" .. i .. ".example", 0.2) end)
end
qtg.spawn(function()
  qtg.sleep(0.3)   -- the other task is sleeping by then, the lookups abandoned
  local t0 = qtg.monotonic()
  local ok, err
  if os.getenv("SPEC_HOG") then
    local addrs, e = qtg.api_net.resolve("localhost", 5)
    ok, err = addrs ~= nil, e
  else
    ok, err = pcall(qtg.db.acquire)
  end
  res.acquire = { elapsed = qtg.monotonic() - t0, ok = ok,
                  err = not ok and (type(err) == "table" and tostring(err.message) or tostring(err)) or cjson.null }
  done = true
end)
local last, gap, deadline = qtg.monotonic(), 0, qtg.monotonic() + 40
while not done and qtg.monotonic() < deadline do
  qtg.sleep(0.05)
  local now = qtg.monotonic()
  if now - last > gap then gap = now - last end
  last = now
end
res.gap = gap
write_result(res)
return 0
]=]

-- The API on a Unix socket (the spec reaches it from outside the
-- namespace), with a pool of two sessions, while a task plays a worker: it
-- takes a session every 50 ms and notes the longest wait.  Serves until
-- RESULT_FILE.go exists, then writes {longest=, acquires=}.
local API_CHILD = CHILD_LIB .. [=[
qtg.api_server.start("unix:" .. out .. ".sock")
local longest, acquires = 0, 0
local deadline = qtg.monotonic() + 120
while not go() and qtg.monotonic() < deadline do
  local t0 = qtg.monotonic()
  qtg.db.with_session(function(s) s:query("SELECT 1") end)
  local waited = qtg.monotonic() - t0
  if waited > longest then longest = waited end
  acquires = acquires + 1
  qtg.sleep(0.05)
end
write_result({ longest = longest, acquires = acquires })
return 0
]=]

-- A console client (the frames of src/qtg_console.h): sends the command
-- argv[2], interrupts it once its first output line came, prints every
-- frame ("<type> <text>": the hello, outputs, the final one) until the
-- command's final one.
local CONSOLE_CLIENT = [=[
import socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(60)
s.connect(sys.argv[1])
def send(t, body):
    body = body.encode()
    s.sendall(struct.pack(">I", len(body) + 1) + t.encode() + body)
buf = b""
def frame():
    global buf
    while True:
        if len(buf) >= 4:
            n = struct.unpack(">I", buf[:4])[0]
            if len(buf) >= 4 + n:
                t, body = chr(buf[4]), buf[5:4 + n].decode("utf-8", "replace")
                buf = buf[4 + n:]
                return t, body
        chunk = s.recv(65536)
        if not chunk:
            sys.exit("the console closed")
        buf += chunk
send("e", sys.argv[2])
while True:
    t, body = frame()
    print(t, body.rstrip("\n").replace("\n", " | "), flush=True)
    if t == "o":
        send("i", "")
    if t in "rxmk":
        break
]=]

local function has(list, value)
  for _, v in ipairs(type(list) == "table" and list or {}) do
    if v == value then return true end
  end
  return false
end

-- namespaces(files) -> true | nil, why: the black hole, RUN, resolv.conf and
-- files ({name = text}) written in dir for a child to run in namespaces of
-- its own, or why that cannot be done here.
local function namespaces(files)
  if io.popen("id -u"):read("*l") ~= "0" then
    return nil, "needs root: the DNS server that never answers is played in namespaces of its own (unshare)"
  end
  local probe, prc = common.sh("unshare --mount --net true")
  if prc ~= 0 then return nil, "unshare --mount --net is not permitted here: " .. probe end
  common.write(dir .. "/hole.py", BLACK_HOLE)
  common.write(dir .. "/run.sh", RUN)
  common.write(dir .. "/resolv.conf", "nameserver 127.0.0.77\noptions timeout:5 attempts:2\n")
  for name, text in pairs(files) do common.write(dir .. "/" .. name, text) end
  os.remove(dir .. "/hole.ready")
  return true
end

-- api_child(result, env) -> h, the API's socket | nil, why: API_CHILD run
-- in namespaces of its own with env, writing dir/RESULT, once its API
-- answers on dir/RESULT.sock.
local function api_child(result, env)
  local usable, why = namespaces({ ["api_child.lua"] = API_CHILD })
  if not usable then return nil, why end
  local sock = dir .. "/" .. result .. ".sock"
  local h = common.spawn(dir .. "/" .. result .. ".child", env,
    ("unshare --mount --net sh %s %s %s api_child.lua %s"):format(q(dir .. "/run.sh"), q(dir),
      q(common.bin()), q(result)))
  common.wait_for(function() return os.execute("test -S " .. q(sock)) == 0 or not common.alive(h) end, 60,
    function() return "the child's API (log: " .. tostring(common.read(h.log)) .. ")" end)
  return h, sock
end

describe("qtg.api_net.resolve's deadline", function()
  setup(function()
    common = require "spec.lua.support.common"
    q = common.quote
    dir = common.tmpdir("qtg-resolve-spec")
  end)
  teardown(function()
    if dir then
      common.write(dir .. "/result.json.go", "")   -- a child left waiting goes on and ends
      os.execute("rm -rf " .. q(dir))
    end
  end)

  it("refuses a deadline that is not a number in (0, 600] with a usage error", function()
    for _, bad in ipairs({ 0, -1, 601, 1e9, 0 / 0, math.huge, -math.huge, "5", true, {} }) do
      local ok, err = pcall(qtg.api_net.resolve, "localhost", bad)
      assert.is_false(ok, tostring(bad))
      assert.equal("usage", type(err) == "table" and err.kind, tostring(bad) .. ": " .. tostring(err))
      assert.truthy(tostring(err.message):find("qtg.api_net.resolve: seconds must be", 1, true), err.message)
    end
    local ok, err = pcall(qtg.api_net.resolve, "localhost", 601)
    assert.is_false(ok)
    assert.equal("qtg.api_net.resolve: seconds must be > 0 and <= 600", err.message)
    ok, err = pcall(qtg.api_net.resolve, "localhost", "5")
    assert.is_false(ok)
    assert.equal("qtg.api_net.resolve: seconds must be a number, not a string", err.message)
    -- the upper bound, a fraction and nil (the default, 10 s) are deadlines
    for _, good in ipairs({ 600, 2.5 }) do
      local addrs, e = qtg.api_net.resolve("localhost", good)
      assert.is_nil(e, tostring(good))
      assert.truthy(has(addrs, "127.0.0.1") or has(addrs, "::1"), tostring(good))
    end
    local addrs = assert(qtg.api_net.resolve("localhost", nil))
    assert.truthy(has(addrs, "127.0.0.1") or has(addrs, "::1"))
  end)

  it("gives up at the deadline when the DNS server never answers, not at the resolver's 10 s", function()
    local usable, why = namespaces({ ["child.lua"] = CHILD, ["console.py"] = CONSOLE_CLIENT })
    if not usable then
      pending(why)
      return
    end
    os.execute("mkdir -m 700 " .. q(dir .. "/run"))
    local env = common.base_env({ MG_API_CALLBACK_ALLOW_PRIVATE = "false",
                                  MG_CONSOLE_ENABLED = "true", MG_RUN_DIR = dir .. "/run",
                                  MG_API_REQUEST_TIMEOUT_SECONDS = "3" })
    local h = common.spawn(dir .. "/child", env,
      ("unshare --mount --net sh %s %s %s child.lua result.json"):format(q(dir .. "/run.sh"), q(dir), q(common.bin())))
    -- an operator interrupts a console command waiting in a lookup
    local sock = dir .. "/run/console.sock"
    common.wait_for(function() return os.execute("test -S " .. q(sock)) == 0 or not common.alive(h) end, 60,
      function() return "the child's console (log: " .. tostring(common.read(h.log)) .. ")" end)
    local t0 = qtg.monotonic()
    local said, crc = common.sh(("python3 %s %s %s"):format(q(dir .. "/console.py"), q(sock),
      q("print('asking') local a, e = qtg.api_net.resolve('interrupted.example', 60) return a, e.kind, e.message")))
    local interrupt_took = qtg.monotonic() - t0
    common.write(dir .. "/result.json.go", "")
    -- the host's close drops the two lookups still waiting: nothing waits
    -- for the resolver's 10 s (with glibc's threads, the exit joined them)
    local go_at = qtg.monotonic()
    local rc = common.exit_code(h, 90)
    local exit_took = qtg.monotonic() - go_at
    local log = tostring(common.read(h.log))
    assert.equal(0, rc, "child exit " .. tostring(rc) .. "; log: " .. log)
    assert.truthy(exit_took < 5, "the child took " .. exit_took .. " s to exit")
    local text = common.read(dir .. "/result.json")
    assert.truthy(text, "no result; log: " .. log)
    local res = cjson.decode(text)

    -- the lookups reached the stand-in, which never answered
    assert.truthy((common.read(dir .. "/queries") or ""):find("from 127.0.0.1", 1, true), "no query seen")
    -- the machine's own resolv.conf is untouched
    assert.is_falsy((common.read("/etc/resolv.conf") or ""):find("127.0.0.77", 1, true))

    -- the wait is abandoned at once (not after the resolver's 10 s nor the
    -- lookup's 60), and the console's command raises once resumed
    assert.equal(0, crc, said)
    assert.truthy(said:find("\no asking\nx interrupted: stopped by the operator\n", 1, true), said)
    assert.truthy(interrupt_took < 5, "took " .. interrupt_took .. " s")

    local t = res.timeout
    assert.equal("timeout", t.kind, tostring(t.message))
    assert.equal("name lookup of resolve-timeout.example took longer than 1 s", t.message)
    assert.truthy(t.elapsed >= 0.9 and t.elapsed < 5, "took " .. t.elapsed .. " s")

    assert.equal(cjson.null, res.hosts.kind, tostring(res.hosts.message))
    assert.truthy(has(res.hosts.addrs, "127.0.0.1"), cjson.encode(res.hosts))
    assert.truthy(res.hosts.elapsed < 5, "took " .. res.hosts.elapsed .. " s")

    -- the API refuses the callback_url as a name that does not resolve, naming the timeout
    assert.equal(cjson.null, res.check.ok)
    assert.equal("resolve-timeout.example does not resolve (name lookup of resolve-timeout.example "
      .. "took longer than 1 s)", res.check.why)
    assert.truthy(res.check.elapsed < 5, "took " .. res.check.elapsed .. " s")
    -- asked again at once: refused without a lookup, saying why
    assert.equal(cjson.null, res.check_again.ok)
    assert.truthy(res.check_again.why:find("^resolve%-timeout%.example does not resolve %(name lookup of "
      .. "resolve%-timeout%.example took longer than 1 s %d+ s ago; not asked again for %d+ s%)$"), res.check_again.why)
    assert.truthy(res.check_again.elapsed < 0.2, "took " .. res.check_again.elapsed .. " s")
    -- the check's own 10 s would outlast the API request's 3 s (a 503 and
    -- no reason): it gives up at half of them
    assert.equal(cjson.null, res.check_api_bound.ok)
    assert.equal("api-bound.example does not resolve (name lookup of api-bound.example "
      .. "took longer than 1.5 s)", res.check_api_bound.why)
    assert.truthy(res.check_api_bound.elapsed >= 1.4 and res.check_api_bound.elapsed < 5,
      "took " .. res.check_api_bound.elapsed .. " s")

    -- a delivery's attempt fails (then retried, per docs/callbacks.md)
    local out = res.guard.outcome
    assert.equal(cjson.null, res.guard.pin)
    assert.is_false(out.delivered)
    assert.equal("forbidden_address: guard.example does not resolve (name lookup of "
      .. "guard.example took longer than 0.5 s)", out.error)
    assert.truthy(res.guard.elapsed < 5, "took " .. res.guard.elapsed .. " s")

    -- a batch of four such names: each refused, together in about one
    -- deadline (one after another, they took four)
    for i, e in ipairs(res.batch.errors) do
      assert.equal(("forbidden_address: batch-%d.example does not resolve (name lookup of batch-%d.example "
        .. "took longer than 1 s)"):format(i, i), e)
    end
    assert.truthy(res.batch.elapsed >= 0.9 and res.batch.elapsed < 3, "took " .. res.batch.elapsed .. " s")

    assert.equal("timeout", res.queued.kind, tostring(res.queued.message))
    assert.equal("name lookup of queued.example took longer than 0.5 s", res.queued.message)
    assert.truthy(res.queued.elapsed >= 0.4 and res.queued.elapsed < 5, "took " .. res.queued.elapsed .. " s")
  end)

  -- libpq looks the database's host name up with a blocking getaddrinfo;
  -- on the loop, a DNS server that does not answer stopped the whole
  -- daemon for the resolver's 10 s at every connect (on the tree before:
  -- a 10 s gap between the other task's 50 ms sleeps)
  it("keeps the loop going while the database's host name does not resolve, and lookups free", function()
    local usable, why = namespaces({ ["db_child.lua"] = DB_CHILD })
    if not usable then
      pending(why)
      return
    end
    local env = common.base_env({ MG_DATABASE_URL = "postgresql://qtg@db.resolve-timeout.example:5432/qtg" })
    local h = common.spawn(dir .. "/db_child", env,
      ("unshare --mount --net sh %s %s %s db_child.lua db_result.json"):format(q(dir .. "/run.sh"), q(dir),
        q(common.bin())))
    local rc = common.exit_code(h, 90)
    local log = tostring(common.read(h.log))
    assert.equal(0, rc, "child exit " .. tostring(rc) .. "; log: " .. log)
    local res = cjson.decode((assert(common.read(dir .. "/db_result.json"), "no result; log: " .. log)))
    -- the acquire fails once the resolver gives up, naming the host
    assert.is_false(res.acquire.ok)
    assert.truthy(res.acquire.err:find("db.resolve-timeout.example", 1, true), res.acquire.err)
    assert.truthy(res.acquire.elapsed >= 5, "took " .. res.acquire.elapsed .. " s")
    -- and meanwhile the loop ran the other task every 50 ms or so
    assert.truthy(res.gap < 1, "the loop stopped for " .. res.gap .. " s")

    -- twenty abandoned lookups of names that never answer are still in the
    -- resolver; a lookup of a name that answers does not wait behind them,
    -- and the child's exit does not wait for them.  The lookups hold no
    -- thread (c-ares on the loop): with glibc's getaddrinfo on libuv's pool
    -- (half of it for lookups: 1 thread of the 2 given here), the healthy
    -- lookup passed its 5 s deadline and the exit joined a thread still in
    -- the resolver.
    os.remove(dir .. "/hole.ready")
    os.remove(dir .. "/queries")
    env = common.base_env({ SPEC_HOG = "20", UV_THREADPOOL_SIZE = "2" })
    local t0 = qtg.monotonic()
    h = common.spawn(dir .. "/db_child_hog", env,
      ("unshare --mount --net sh %s %s %s db_child.lua db_hog.json"):format(q(dir .. "/run.sh"), q(dir),
        q(common.bin())))
    rc = common.exit_code(h, 90)
    local child_took = qtg.monotonic() - t0
    log = tostring(common.read(h.log))
    assert.equal(0, rc, "child exit " .. tostring(rc) .. "; log: " .. log)
    res = cjson.decode((assert(common.read(dir .. "/db_hog.json"), "no result; log: " .. log)))
    assert.is_true(res.acquire.ok, tostring(res.acquire.err))
    assert.truthy(res.acquire.elapsed < 1, "the lookup waited " .. res.acquire.elapsed .. " s")
    assert.truthy(child_took < 8, "the child took " .. child_took .. " s")
    -- the twenty reached the server: they were asked, and not answered
    local asked = select(2, (common.read(dir .. "/queries") or ""):gsub("\n", "\n"))
    assert.truthy(asked >= 20, "the server saw " .. asked .. " queries")
  end)

  -- An API client's callback_url is resolved at creation, for up to half
  -- the API request's timeout.  The database session the request had taken
  -- (for its token) was held through that wait: a client sending a few
  -- creations whose names never answer took every session of the pool
  -- (MG_DB_POOL_SIZE), and the workers waited.  The lookup now runs
  -- between two sessions (qtg.api's run_outside).
  it("holds no database session while the API looks up a callback_url's name", function()
    local api = require "spec.lua.support.api"
    local token = api.token("read,operate")
    local out = dir .. "/api_result.json"
    local h, sock = api_child("api_result.json", common.base_env({ MG_DB_POOL_SIZE = "2",
      MG_API_CALLBACK_ALLOW_PRIVATE = "false", MG_API_REQUEST_TIMEOUT_SECONDS = "8" }))
    if not h then
      pending(sock)
      return
    end
    local function curl(method, path, body, key, file)
      local words = { "curl -s -o", q(file), "-w '%{http_code}' --max-time 30 --unix-socket", q(sock),
                      "-X", method, "-H", q("Authorization: Bearer " .. token) }
      if body then
        words[#words + 1] = "-H 'Content-Type: application/json' -H " .. q("Idempotency-Key: " .. key)
        words[#words + 1] = "--data-binary " .. q(body)
      end
      words[#words + 1] = q("http://qtg" .. path)
      return table.concat(words, " ")
    end
    -- four creations whose callback names never answer, at once
    local jobs = {}
    for i = 1, 4 do
      local body = cjson.encode({ template_key = "otc_settlement_manual", intent = api.OTC_INTENT,
                                  callback_url = ("https://hold-%d.example/cb"):format(i) })
      jobs[i] = curl("POST", "/v3/requests", body, common.uid("hold", 4), dir .. "/create-" .. i .. ".json")
        .. " > " .. q(dir .. "/create-" .. i .. ".code")
    end
    os.execute("(" .. table.concat(jobs, " & ") .. " & wait) >/dev/null 2>&1 &")
    qtg.sleep(1.5)
    -- meanwhile a read of the API answers (it needs a session)
    local t0 = qtg.monotonic()
    local code = common.sh(curl("GET", "/v3/requests", nil, nil, dir .. "/list.json"))
    local list_took = qtg.monotonic() - t0
    -- the creations end, each refused for its name, naming the timeout
    common.wait_for(function()
      for i = 1, 4 do
        if (common.read(dir .. "/create-" .. i .. ".code") or "") == "" then return false end
      end
      return true
    end, 60, function() return "the four creations' answers" end)
    common.write(out .. ".go", "")
    local rc = common.exit_code(h, 60)
    local log = tostring(common.read(h.log))
    assert.equal(0, rc, "child exit " .. tostring(rc) .. "; log: " .. log)
    for i = 1, 4 do
      assert.equal("422", common.read(dir .. "/create-" .. i .. ".code"))
      local doc = cjson.decode(common.read(dir .. "/create-" .. i .. ".json"))
      assert.equal(("bad callback_url: hold-%d.example does not resolve (name lookup of hold-%d.example took "
        .. "longer than 4 s)"):format(i, i), doc.detail)
    end
    assert.equal("200", code, tostring(common.read(dir .. "/list.json")))
    assert.truthy(list_took < 2, "the read waited " .. list_took .. " s for a session")
    local res = cjson.decode((assert(common.read(out), "no result; log: " .. log)))
    assert.truthy(res.acquires > 20, "the worker took " .. res.acquires .. " sessions")
    assert.truthy(res.longest < 1, "the worker waited " .. res.longest .. " s for a session")
  end)

  -- The creation's name lookup takes the stand-in's 2.5 s: a token revoked
  -- one second into it is refused before the request is written, and its
  -- Idempotency-Key freed; a token left alone creates the request.
  it("refuses a creation whose token was revoked while its callback_url's name was looked up", function()
    local api = require "spec.lua.support.api"
    api.load_templates()
    local kept = api.token("read,operate")
    local revoked, revoked_name = api.token("read,operate")
    local out = dir .. "/api_revoke.json"
    local h, sock = api_child("api_revoke.json", common.base_env({ MG_API_CALLBACK_ALLOW_PRIVATE = "false",
      MG_API_REQUEST_TIMEOUT_SECONDS = "20" }))
    if not h then
      pending(sock)
      return
    end
    local keys = { kept = common.uid("kept", 4), revoked = common.uid("revoked", 4) }
    local jobs = {}
    for which, token in pairs({ kept = kept, revoked = revoked }) do
      local body = cjson.encode({ template_key = "otc_settlement_manual", intent = api.OTC_INTENT,
                                  callback_url = ("https://slow-%s.example/cb"):format(which) })
      jobs[#jobs + 1] = table.concat({ "curl -s -o", q(dir .. "/" .. which .. ".json"), "-w '%{http_code}'",
        "--max-time 30 --unix-socket", q(sock), "-X POST -H", q("Authorization: Bearer " .. token),
        "-H 'Content-Type: application/json' -H", q("Idempotency-Key: " .. keys[which]),
        "--data-binary", q(body), q("http://qtg/v3/requests"), ">", q(dir .. "/" .. which .. ".code") }, " ")
    end
    local t0 = qtg.monotonic()
    os.execute("(" .. table.concat(jobs, " & ") .. " & wait) >/dev/null 2>&1 &")
    qtg.sleep(1)
    local rc, said = api.tokens_cli({ "revoke", revoked_name })
    assert.equal(0, rc, said)
    local revoked_after = qtg.monotonic() - t0
    common.wait_for(function()
      return (common.read(dir .. "/kept.code") or "") ~= "" and (common.read(dir .. "/revoked.code") or "") ~= ""
    end, 60, function() return "the two creations' answers" end)
    local took = qtg.monotonic() - t0
    common.write(out .. ".go", "")
    local code = common.exit_code(h, 60)
    assert.equal(0, code, "child exit " .. tostring(code) .. "; log: " .. tostring(common.read(h.log)))
    assert.truthy(revoked_after < 2.4, "the revocation came " .. revoked_after .. " s in, after the lookup")
    assert.truthy(took >= 2.4, "the lookup took " .. took .. " s, not the stand-in's 2.5: "
      .. tostring(common.read(dir .. "/kept.json")))
    -- the token left alone: created
    assert.equal("201", common.read(dir .. "/kept.code"), tostring(common.read(dir .. "/kept.json")))
    local doc = cjson.decode(common.read(dir .. "/kept.json"))
    assert.equal("https://slow-kept.example/cb", doc.callback_url)
    -- the revoked one: refused, nothing written, the key freed
    assert.equal("401", common.read(dir .. "/revoked.code"), tostring(common.read(dir .. "/revoked.json")))
    doc = cjson.decode(common.read(dir .. "/revoked.json"))
    assert.equal("the API token was revoked", doc.detail)
    local rows = common.query([[SELECT count(*)::int AS n FROM movement_requests WHERE callback_url = $1]],
      "https://slow-revoked.example/cb")
    assert.equal(0, rows[1].n)
    rows = common.query([[SELECT count(*)::int AS n FROM api_idempotency_keys WHERE idempotency_key = $1]],
      keys.revoked)
    assert.equal(0, rows[1].n)
    rows = common.query([[SELECT count(*)::int AS n FROM movement_requests WHERE callback_url = $1]],
      "https://slow-kept.example/cb")
    assert.equal(1, rows[1].n)
  end)

end)
