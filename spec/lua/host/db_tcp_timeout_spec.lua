-- db_tcp_timeout_spec: a PostgreSQL host that stops answering (a host down,
-- a network partition: no reset ever comes) costs qtgd about
-- MG_DB_TCP_TIMEOUT_SECONDS, not the kernel's retransmission limits (up to
-- 15 minutes, during which every task waiting on the database waits too).
-- src/qtg_pg.c gives libpq keepalives and tcp_user_timeout
-- (qtg_pg_tcp_params), before the URL's own values, which win.
--
-- Played for real, with iproute2 and root: two network namespaces of
-- their own (`unshare --net`), joined by a veth pair, 10.77.0.1 (the
-- child's side) and 10.77.0.2 (the far side).  On the far side a TCP relay
-- (python3, common.FORWARDER) forwards to this cluster's Unix socket (pathname sockets cross
-- network namespaces); a child `qtgd exec` reaches the database through
-- it, over TCP, with MG_DB_TCP_TIMEOUT_SECONDS=2.  Then the far side's end
-- of the pair drops every packet it would send (`tc qdisc add dev qb root
-- pfifo limit 0`: a queue of length 0): the child's packets arrive and
-- nothing comes back, which is what a vanished host looks like.  (A drop
-- on the child's own side would not do: the kernel does not count a
-- keepalive probe that never left as unanswered.)  The child writes what
-- it saw:
--   * a query sent after the drop fails in about 2 s, naming the lost
--     connection (on the tree before, it waited the kernel's limits: the
--     child was still waiting when the namespace's script gave up on it);
--   * an idle connection left in the pool is found dead by its keepalives
--     and dropped, with nothing sent on it;
--   * a new connection (its SYN) fails in about 2 s: the pool's acquire
--     raises "cannot connect";
--   * once the loopback carries packets again, a new session works;
--   * a URL that sets its own tcp_user_timeout (4000 ms) keeps it: the
--     query then fails in about 4 s (a second run, the query alone).
local qtg = require "qtg"
local cjson = require "cjson"

local common, dir
local q

-- Runs in the child's namespace: the far side's namespace (a process that
-- holds it), the veth pair, the relay there, the child, and the drop and
-- the lift of the far side's packets when the child asks (files in the
-- directory).  Arguments: the run's directory, the qtgd binary, the port,
-- the server's socket; relay.py and child.lua lie beside this script.  The
-- child gets 60 s: on the tree before it waits far longer, and that is the
-- failure.
local RUN = [=[
dir=$1; bin=$2; port=$3; target=$4; here=$(dirname "$0")
wait_file() {
  i=0
  while [ ! -e "$1" ]; do
    if [ "$i" -ge 1200 ]; then return 1; fi
    if [ -n "$2" ] && ! kill -0 "$2" 2>/dev/null; then return 1; fi
    i=$((i + 1)); sleep 0.05
  done
}
far() { nsenter --net="/proc/$holder/ns/net" "$@"; }
ip link set lo up || exit 96
unshare --net sh -c 'echo $$ >"$1/far.pid.tmp" && mv "$1/far.pid.tmp" "$1/far.pid" && exec sleep 300' sh "$dir" &
wait_file "$dir/far.pid" || exit 95
holder=$(cat "$dir/far.pid")
ip link add qa type veth peer name qb netns "$holder" || { kill "$holder"; exit 94; }
if ! { ip addr add 10.77.0.1/24 dev qa && ip link set qa up &&
       far ip addr add 10.77.0.2/24 dev qb && far ip link set qb up; }; then
  kill "$holder"; exit 93
fi
far timeout 180 python3 "$here/relay.py" "$port" "unix:$target" "$dir/relay.ready" 10.77.0.2 \
  >"$dir/relay.log" 2>&1 & relay=$!
if ! wait_file "$dir/relay.ready" "$relay"; then
  echo "the relay did not start:"; cat "$dir/relay.log"; kill "$relay" "$holder" 2>/dev/null; exit 97
fi
timeout 60 "$bin" exec "$here/child.lua" "$dir" & child=$!
if wait_file "$dir/drop" "$child"; then
  far tc qdisc add dev qb root pfifo limit 0 || echo "tc could not drop the far side's packets"
  touch "$dir/dropped"
  if wait_file "$dir/lift" "$child"; then
    far tc qdisc del dev qb root
    touch "$dir/lifted"
  fi
fi
wait "$child"; rc=$?
kill "$relay" "$holder" 2>/dev/null
exit "$rc"
]=]

-- The child: `qtgd exec child.lua DIR`; writes DIR/result.json (by rename)
-- and exits 0.  With SPEC_QUERY_ONLY set, the query into the drop alone.
local CHILD = [=[
local dir = ...
local query_only = os.getenv("SPEC_QUERY_ONLY") ~= nil
local qtg = require "qtg"
local cjson = require "cjson"
local res = {}

local function await(name)
  local deadline = qtg.monotonic() + 30
  while qtg.monotonic() < deadline do
    local f = io.open(dir .. "/" .. name)
    if f then f:close() return true end
    qtg.sleep(0.05)
  end
  error("no " .. name .. " file after 30 s")
end

local function touch(name)
  local f = assert(io.open(dir .. "/" .. name, "w"))
  f:close()
end

local function timed(fn, ...)
  local t0 = qtg.monotonic()
  local ok, err = pcall(fn, ...)
  return { elapsed = qtg.monotonic() - t0, ok = ok,
           err = not ok and (type(err) == "table" and tostring(err.message) or tostring(err)) or cjson.null }
end

-- two sessions over TCP through the relay; one stays idle in the pool
local busy = qtg.db.acquire()
local idle = qtg.db.acquire()
assert(busy:query("SELECT 1 AS one")[1].one == 1)
assert(idle:query("SELECT 1 AS one")[1].one == 1)
idle:release()
res.open_before = qtg.db.stats().open

touch("drop")
await("dropped")
-- a query sent into the drop
res.query = timed(busy.query, busy, "SELECT 2 AS two")
busy:release()
if query_only then
  local f = assert(io.open(dir .. "/result.json.tmp", "w"))
  f:write(cjson.encode(res))
  f:close()
  assert(os.rename(dir .. "/result.json.tmp", dir .. "/result.json"))
  return 0
end
-- the idle one: found dead without a word sent on it
local t0, deadline = qtg.monotonic(), qtg.monotonic() + 20
while qtg.db.stats().open > 0 and qtg.monotonic() < deadline do qtg.sleep(0.1) end
res.open_after, res.idle_dropped_after = qtg.db.stats().open, qtg.monotonic() - t0
-- a new connection's SYN into the drop
res.connect = timed(function() local s = qtg.db.acquire() s:release() end)

touch("lift")
await("lifted")
res.after = timed(function()
  local s = qtg.db.acquire()
  assert(s:query("SELECT 3 AS three")[1].three == 3)
  s:release()
end)

local f = assert(io.open(dir .. "/result.json.tmp", "w"))
f:write(cjson.encode(res))
f:close()
assert(os.rename(dir .. "/result.json.tmp", dir .. "/result.json"))
return 0
]=]

-- A server whose kernel accepts the connection and which then says
-- nothing (a stopped postmaster's full backlog, a paused pooler): TCP's
-- bounds never fire, since every packet is acknowledged, and libpq's
-- connect_timeout binds only its blocking connect.  The child's pool of
-- one takes three acquires at once; writes {ok=, err=, elapsed=} each.
local SILENT = [=[
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0)); s.listen(16)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(s.getsockname()[1]))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(120)
]=]

local SILENT_CHILD = [=[
local out = ...
local qtg = require "qtg"
local cjson = require "cjson"
local tasks = {}
for i = 1, 3 do
  tasks[i] = qtg.spawn(function()
    local t0 = qtg.monotonic()
    local ok, err = pcall(qtg.db.acquire)
    return { ok = ok, err = not ok and tostring(type(err) == "table" and err.message or err) or cjson.null,
             elapsed = qtg.monotonic() - t0 }
  end)
end
local res = {}
for i = 1, 3 do res[i] = select(2, qtg.join(tasks[i])) end
local f = assert(io.open(out .. ".tmp", "w"))
f:write(cjson.encode(res))
f:close()
assert(os.rename(out .. ".tmp", out))
return 0
]=]

describe("a database server that accepts and never answers", function()
  it("fails each waiting acquire after MG_DB_TCP_TIMEOUT_SECONDS", function()
    local c = require "spec.lua.support.common"
    local d = c.tmpdir("qtg-db-silent-spec")
    c.write(d .. "/silent.py", SILENT)
    c.write(d .. "/child.lua", SILENT_CHILD)
    os.execute(("python3 %s %s >/dev/null 2>&1 & echo $! > %s"):format(c.quote(d .. "/silent.py"),
      c.quote(d .. "/port"), c.quote(d .. "/silent.pid")))
    local port = c.wait_for(function() return c.read(d .. "/port") end, 20, "the silent server's port")
    local env = c.base_env({ MG_DATABASE_URL = ("postgresql://qtg@127.0.0.1:%s/qtg?connect_timeout=2"):format(port),
                             MG_DB_TCP_TIMEOUT_SECONDS = "2", MG_DB_POOL_SIZE = "1" })
    local h = c.spawn(d .. "/child", env, ("%s exec %s %s"):format(c.quote(c.bin()), c.quote(d .. "/child.lua"),
      c.quote(d .. "/result.json")))
    local rc = c.exit_code(h, 60)
    os.execute("kill $(cat " .. c.quote(d .. "/silent.pid") .. ") 2>/dev/null")
    local log = tostring(c.read(h.log))
    local text = c.read(d .. "/result.json")
    os.execute("rm -rf " .. c.quote(d))
    assert.equal(0, rc, "child exit " .. tostring(rc) .. "; log: " .. log)
    local res = cjson.decode((assert(text, "no result; log: " .. log)))
    for i = 1, 3 do
      assert.is_false(res[i].ok, "acquire " .. i)
      assert.truthy(res[i].err:find("cannot connect to PostgreSQL: no answer within 2 s (MG_DB_TCP_TIMEOUT_SECONDS)",
        1, true), res[i].err)
      -- one after another through the pool of one: each its own 2 s
      assert.truthy(res[i].elapsed >= 1.5 and res[i].elapsed < 3 * i + 5, "acquire " .. i .. ": " .. res[i].elapsed)
    end
  end)
end)

describe("a database host that stops answering", function()
  setup(function()
    common = require "spec.lua.support.common"
    q = common.quote
    dir = common.tmpdir("qtg-db-tcp-spec")
  end)
  teardown(function()
    if dir and not os.getenv("SPEC_KEEP") then os.execute("rm -rf " .. q(dir)) end
  end)

  it("costs MG_DB_TCP_TIMEOUT_SECONDS, not the kernel's retransmission limits", function()
    if io.popen("id -u"):read("*l") ~= "0" then
      pending("needs root: the dead host is played in a network namespace of its own (unshare)")
      return
    end
    local probe, prc = common.sh("unshare --net true && command -v tc && command -v nsenter")
    if prc ~= 0 then
      pending("unshare --net, tc (iproute2) or nsenter is not available here: " .. probe)
      return
    end
    local s = qtg.db.acquire()
    local db = s:query([[SELECT split_part(current_setting('unix_socket_directories'), ',', 1) AS sockdir,
                                current_setting('port') AS port, current_database() AS name,
                                current_user AS who]])[1]
    s:release()
    local target = ("%s/.s.PGSQL.%s"):format(db.sockdir:gsub("^%s+", ""), db.port)
    assert.equal(0, select(2, common.sh("test -S " .. q(target))), "no server socket at " .. target)
    common.write(dir .. "/relay.py", common.FORWARDER)
    common.write(dir .. "/run.sh", RUN)
    common.write(dir .. "/child.lua", CHILD)
    -- one run in a namespace of its own: what the child saw
    local function run(name, query, extra)
      local port = 20000 + math.random(0, 20000)
      local sub = dir .. "/" .. name
      os.execute("mkdir -p " .. q(sub))
      local env = common.base_env({
        MG_DATABASE_URL = ("postgresql://%s@10.77.0.2:%d/%s%s"):format(db.who, port, db.name, query),
        MG_DB_TCP_TIMEOUT_SECONDS = "2", MG_LOG_LEVEL = "warn" })
      for k, v in pairs(extra or {}) do env[k] = v end
      local t0 = qtg.monotonic()
      local h = common.spawn(sub .. "/child", env, ("unshare --net sh %s %s %s %d %s"):format(
        q(dir .. "/run.sh"), q(sub), q(common.bin()), port, q(target)))
      local rc = common.exit_code(h, 120)
      local took = qtg.monotonic() - t0
      local log = tostring(common.read(h.log))
      assert.equal(0, rc, name .. ": child exit " .. tostring(rc) .. " after " .. took .. " s; log: " .. log)
      return cjson.decode((assert(common.read(sub .. "/result.json"), name .. ": no result; log: " .. log)))
    end
    local res = run("setting", "")

    assert.equal(2, res.open_before)
    -- the query sent into the drop: about the 2 s, naming the lost connection
    assert.is_false(res.query.ok)
    assert.truthy(res.query.err:find("connection to PostgreSQL lost: could not receive data from server: "
      .. "Connection timed out", 1, true), res.query.err)
    assert.truthy(res.query.elapsed >= 1.5 and res.query.elapsed < 10, "took " .. res.query.elapsed .. " s")
    -- the SYN into the drop: the acquire fails in about the 2 s
    assert.is_false(res.connect.ok)
    assert.truthy(res.connect.err:find("cannot connect to PostgreSQL", 1, true), res.connect.err)
    assert.truthy(res.connect.elapsed >= 1.5 and res.connect.elapsed < 10, "took " .. res.connect.elapsed .. " s")
    -- the idle connection: dropped by its keepalives
    assert.equal(0, res.open_after)
    -- the packets back: a new session works
    assert.is_true(res.after.ok, tostring(res.after.err))

    -- the URL's own tcp_user_timeout wins over the setting's
    local own = run("url", "?tcp_user_timeout=4000", { SPEC_QUERY_ONLY = "1" })
    assert.is_false(own.query.ok)
    assert.truthy(own.query.elapsed >= 3.5 and own.query.elapsed < 12, "took " .. own.query.elapsed .. " s")
  end)
end)
