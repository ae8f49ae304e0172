-- tools/bench.d/bench.lua -- the driver of tools/bench, run inside the host:
--   qtgd exec tools/bench.d/bench.lua [--ci] [--json PATH] [--n N] ...
-- (tools/bench starts the throwaway cluster, migrates, loads the bench
-- templates and runs this).  docs/performance.md says what each figure is.
--
-- Phases, in this order, each in one run so that ratios compare like with like:
--   raw         pgbench: claim + node update + audit and callback outbox
--               inserts, the statements of a node transition, at 1, 2, 4, 8
--               clients (three scripts cycling nodes READY -> SUBMITTED ->
--               UNKNOWN -> READY through the dispatcher's, observer's and
--               recovery's claim shapes), committed as qtgd commits (no
--               NOTIFY in the transaction: B.RAW_OPTIONS);
--   idle        one qtgd with every always-on worker at its default
--               interval: statements reaching PostgreSQL per second
--               (pg_stat_statements), CPU and RSS, over --idle seconds;
--   throughput  burn-down of N bench_chain3 requests (3 sim nodes, each
--               completing on its first observation): created and approved
--               first, then timed from starting the daemons until every
--               request is COMPLETED and every callback delivered to a local
--               receiver; with 1 and with 2 qtgd processes;
--   latency     idle daemon, bench_one requests approved one at a time:
--               approve (its commit, seen by the client) -> first node's
--               started_at (set by the UPDATE that makes it SUBMITTED), and
--               -> the request's finished_at (COMPLETED), all on the one
--               machine clock;
--   growth      the 2-process burn-down again with --growth finished
--               requests (cloned from the finished ones) in the tables.
-- Every phase checks its own outcome (all COMPLETED, all delivered): a
-- failed check makes the bench exit 1.  No timing is ever asserted.
-- Shell quoting, files, processes and polling are
-- spec/lua/support/common.lua's (the tree, this file's path up to /tools/,
-- goes on package.path for it).
local qtg = require "qtg"
local cjson = require "cjson"
local requests = require "qtg.requests"
package.path = package.path .. ";" .. (debug.getinfo(1, "S").source:match("^@(.*)/tools/") or ".") .. "/?.lua"
local common = require "spec.lua.support.common"

local B = {}

local function fmt(v, f)
  if v == nil then return "-" end
  return string.format(f or "%.1f", v)
end

B.ACTOR = "console:bench"
B.INITIATOR = "console:bench-initiator" -- four eyes: never the approver
B.CLASS = "bench"
B.RAW_CLASS = "bench-raw"

-- ------------------------------------------------------------ options
B.FULL = { n = 5000, latency = 200, idle = 60, growth = 100000, raw_seconds = 5,
           raw_pool = 3000, clients = { 1, 2, 4, 8 }, procs = { 1, 2 },
           timeout = 900 }
B.CI = { n = 200, latency = 20, idle = 5, growth = 2000, raw_seconds = 1,
         raw_pool = 500, clients = { 1, 2, 4, 8 }, procs = { 1, 2 },
         timeout = 300 }

function B.parse_args(argv)
  local o = { ci = false, fast = false }
  local i = 1
  local numeric = { ["--n"] = "n", ["--latency"] = "latency", ["--idle"] = "idle",
                    ["--growth"] = "growth", ["--raw-seconds"] = "raw_seconds",
                    ["--timeout"] = "timeout" }
  while i <= #argv do
    local a = argv[i]
    if a == "--ci" then o.ci = true
    elseif a == "--fast" then o.fast = true
    elseif a == "--json" then o.json = argv[i + 1]; i = i + 1
    elseif a == "--only" then o.only = argv[i + 1]; i = i + 1
    elseif numeric[a] then
      o[numeric[a]] = tonumber(argv[i + 1]) or error("bench: " .. a .. " needs a number", 0)
      i = i + 1
    else
      error("bench: unknown argument " .. tostring(a), 0)
    end
    i = i + 1
  end
  local base = o.ci and B.CI or B.FULL
  for k, v in pairs(base) do if o[k] == nil then o[k] = v end end
  return o
end

-- ------------------------------------------------------------ shell and /proc
B.sh = common.sh
local read_file = common.read

-- {rss_kb, hwm_kb, cpu_s} of a live process, or nil.
function B.proc(pid)
  local status = read_file("/proc/" .. pid .. "/status")
  local stat = read_file("/proc/" .. pid .. "/stat")
  if not status or not stat then return nil end
  local rest = stat:match("^%d+ %b() (.*)$")
  local f = {}
  for w in rest:gmatch("%S+") do f[#f + 1] = w end
  -- after "pid (comm)": state=1 ... utime=12 stime=13, and of its
  -- children that exited and were waited for cutime=14 cstime=15 (1-based
  -- in rest)
  return { rss_kb = tonumber(status:match("VmRSS:%s*(%d+)")),
           hwm_kb = tonumber(status:match("VmHWM:%s*(%d+)")),
           cpu_s = (tonumber(f[12]) + tonumber(f[13])) / B.clk_tck,
           exited_children_cpu_s = (tonumber(f[14]) + tonumber(f[15])) / B.clk_tck }
end

-- CPU seconds used so far by the cluster's server processes: the
-- postmaster, its children alive now, and the ones that exited (the
-- postmaster waits for each, so their time moves into its children's
-- time: an autovacuum worker that ran during a burn-down is counted).
function B.pg_cpu()
  local dir = os.getenv("QTG_BENCH_PGDIR")
  local txt = dir and read_file(dir .. "/data/postmaster.pid")
  local pm = txt and tonumber(txt:match("^(%d+)"))
  if not pm then return nil end
  local p = B.proc(pm)
  if not p then return nil end
  local total = p.cpu_s + p.exited_children_cpu_s
  local kids = B.sh("pgrep -P " .. pm)
  for pid in kids:gmatch("%d+") do
    local k = B.proc(pid)
    if k then total = total + k.cpu_s end
  end
  return total
end

-- ------------------------------------------------------------ database
function B.q(sql, ...)
  local s = qtg.db.acquire()
  local ok, rows, n = pcall(s.query, s, sql, ...)
  s:release()
  if not ok then error(rows, 2) end
  return rows, n
end

function B.exec(sql)
  local s = qtg.db.acquire()
  -- the bench's own upkeep (VACUUM of a grown database) is not a worker's
  -- statement: no MG_DB_STATEMENT_TIMEOUT_SECONDS
  local ok, err = pcall(function()
    s:exec("SET statement_timeout = 0")
    s:exec(sql)
    s:exec("RESET statement_timeout")
  end)
  s:release()
  if not ok then error(err, 2) end
end

-- ------------------------------------------------------------ daemons
B.daemons = {}

function B.start_daemon(tag, extra_env)
  local env = {
    MG_DATABASE_URL = os.getenv("MG_DATABASE_URL"),
    MG_NETWORK_CLASS = B.CLASS,
    MG_CONSOLE_ENABLED = "false",
    MG_RUN_DIR = B.dir,
    MG_CALLBACK_KEY = "qtg-bench-callback-key-0123456789ab",
    MG_LOG_LEVEL = "warn",
  }
  for k, v in pairs(extra_env or {}) do env[k] = v end
  local d = common.spawn(B.dir .. "/" .. tag, env, common.quote(B.bin) .. " run")
  d.tag = tag
  B.daemons[#B.daemons + 1] = d
  return d
end

-- Stop with SIGTERM (KILL after 30 s); returns its last /proc figures.
function B.stop_daemon(d)
  if d.stopped then return d.last end
  d.last = B.proc(d.pid)
  common.stop(d, 30)
  d.stopped = true
  return d.last
end

function B.stop_all()
  for _, d in ipairs(B.daemons) do
    if not d.stopped then pcall(B.stop_daemon, d) end
  end
end

-- Wait until every listed daemon LISTENs (its wake-up listener is up):
-- the session that ran LISTEN shows it as its last query.
function B.wait_ready(n, timeout)
  return common.poll(function()
    return B.q([[SELECT count(*)::int AS n FROM pg_stat_activity
                  WHERE application_name = 'qtgd' AND query LIKE 'LISTEN %']])[1].n >= n
  end, timeout or 20, 0.02) or false
end

-- ------------------------------------------------------------ receiver
function B.start_receiver()
  local port_file, count_file = B.dir .. "/receiver.port", B.dir .. "/receiver.count"
  os.remove(port_file)
  local h = common.spawn(B.dir .. "/receiver", {}, ("python3 %s %s %s"):format(
    common.quote(B.root .. "/tools/bench.d/receiver.py"), common.quote(port_file), common.quote(count_file)))
  h.port = common.wait_port_file(port_file, 10, "the callback receiver", h.log)
  h.count_file = count_file
  B.receiver = h
  B.callback_url = ("http://127.0.0.1:%d/callback"):format(B.receiver.port)
end

function B.stop_receiver()
  if not B.receiver then return end
  common.stop(B.receiver, 10)
  B.receiver = nil
end

-- ------------------------------------------------------------ statistics
function B.percentile(sorted, p)
  if #sorted == 0 then return nil end
  local k = math.max(1, math.ceil(p / 100 * #sorted))
  return sorted[k]
end

function B.summary(values)
  local s = {}
  for i, v in ipairs(values) do s[i] = v end
  table.sort(s)
  return { n = #s, p50 = B.percentile(s, 50), p99 = B.percentile(s, 99), max = s[#s] }
end

-- ------------------------------------------------------------ requests
-- Create and approve n requests of a template (the real lifecycle code, one
-- transaction each), with ids; returns the ids.
function B.create(template_key, n, prefix, approve)
  local ids = {}
  local s = qtg.db.acquire()
  local ok, err = pcall(function()
    for i = 1, n do
      local req = requests.create(s, {
        template_key = template_key, intent = { asset = "USDC", amount = "1.00" },
        idempotency_key = ("%s-%d"):format(prefix, i), callback_url = B.callback_url,
      }, B.INITIATOR)
      if approve then requests.approve(s, req.id, B.ACTOR) end
      ids[i] = req.id
    end
  end)
  s:release()
  if not ok then error(err, 0) end
  return ids
end

-- Requests of the bench class still moving, and callbacks still pending.
function B.backlog()
  local r = B.q([[
    SELECT (SELECT count(*)::int FROM movement_requests
             WHERE network_class = $1 AND request_state IN ('APPROVED', 'EXECUTING')) AS moving,
           (SELECT count(*)::int FROM movement_callback_outbox WHERE status = 'pending') AS pending
      /* bench-probe */]],
    B.CLASS)[1]
  return r.moving, r.pending
end

function B.check_done(ids, label)
  local r = B.q([[
    SELECT count(*) FILTER (WHERE r.request_state = 'COMPLETED')::int AS completed,
           count(*)::int AS total
      FROM movement_requests r WHERE r.id = ANY ($1::uuid[])]], "{" .. table.concat(ids, ",") .. "}")[1]
  local c = B.q([[
    SELECT count(*) FILTER (WHERE c.status = 'delivered')::int AS delivered, count(*)::int AS total
      FROM movement_callback_outbox c WHERE c.request_id = ANY ($1::uuid[])]],
    "{" .. table.concat(ids, ",") .. "}")[1]
  local ok = r.completed == #ids and c.delivered == c.total
  if not ok then
    B.failures[#B.failures + 1] = ("%s: %d/%d requests COMPLETED, %d/%d callbacks delivered"):format(
      label, r.completed, #ids, c.delivered, c.total)
  end
  return { completed = r.completed, requests = #ids, callbacks = c.total, delivered = c.delivered, ok = ok }
end

-- ------------------------------------------------------------ pg_stat_statements
function B.stmt_snapshot()
  local rows = B.q([[
    SELECT queryid::text AS id, calls::float8 AS calls,
           total_exec_time + total_plan_time AS ms, query
      FROM pg_stat_statements
     WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%pg_stat_activity%'
       AND query NOT LIKE '%bench-probe%']])
  local by = {}
  for _, r in ipairs(rows) do by[r.id] = r end
  return by
end

-- Statements between two snapshots, heaviest first: {calls, ms, query}.
function B.stmt_delta(a, b)
  local out, calls, ms = {}, 0, 0
  for id, r in pairs(b) do
    local dc = r.calls - (a[id] and a[id].calls or 0)
    local dm = r.ms - (a[id] and a[id].ms or 0)
    if dc > 0 then
      out[#out + 1] = { calls = dc, ms = dm, query = r.query:gsub("%s+", " "):sub(1, 160) }
      calls, ms = calls + dc, ms + dm
    end
  end
  table.sort(out, function(x, y) return x.ms > y.ms end)
  return out, calls, ms
end

-- ------------------------------------------------------------ raw limit (pgbench)
-- The sessions commit as qtgd's do (sql/0150): they hand their wake-up on
-- after the commit instead of NOTIFYing in it (here the NOTICE is not even
-- sent: pgbench would print one per transaction), so the transactions
-- share WAL flushes as qtgd's may.
B.RAW_OPTIONS = "-c qtg.notify=after_commit -c client_min_messages=warning"
-- One script (pgbench 15 mixes up prepared statements across several -f
-- scripts): each transaction picks one of three node transitions at random,
-- so the pool of nodes in each state random-walks around its start.
B.RAW_SCRIPT = [[
\set k random(1, 3)
BEGIN;
\if :k = 1
SELECT n.id AS node_id, n.request_id AS request_id
  FROM movement_request_nodes n JOIN movement_requests r ON r.id = n.request_id
 WHERE n.node_state = 'READY' AND r.request_state IN ('APPROVED', 'EXECUTING')
   AND r.network_class = 'bench-raw'
 ORDER BY r.created_at, n.node_key LIMIT 1
   FOR UPDATE OF n, r SKIP LOCKED \gset
UPDATE movement_request_nodes SET node_state = 'SUBMITTED', attempt_no = attempt_no + 1,
       started_at = clock_timestamp(), next_observe_at = clock_timestamp() WHERE id = :node_id::uuid;
\elif :k = 2
SELECT n.id AS node_id, n.request_id AS request_id
  FROM movement_request_nodes n JOIN movement_requests r ON r.id = n.request_id
 WHERE n.node_state IN ('SUBMITTED', 'OBSERVING') AND r.request_state = 'EXECUTING'
   AND r.network_class = 'bench-raw'
   AND (n.next_observe_at IS NULL OR n.next_observe_at <= now())
 ORDER BY r.created_at LIMIT 1
   FOR UPDATE OF n, r SKIP LOCKED \gset
UPDATE movement_request_nodes SET node_state = 'UNKNOWN', observe_count = observe_count + 1,
       next_observe_at = NULL WHERE id = :node_id::uuid;
\else
SELECT n.id AS node_id, n.request_id AS request_id
  FROM movement_request_nodes n
 WHERE n.node_state IN ('UNKNOWN', 'SUBMITTING')
 ORDER BY n.updated_at LIMIT 1
   FOR UPDATE OF n SKIP LOCKED \gset
UPDATE movement_request_nodes SET node_state = 'READY' WHERE id = :node_id::uuid;
\endif
INSERT INTO audit_outbox (actor, action, entity_type, entity_id, request_id, detail)
VALUES ('system' || chr(58) || 'bench', 'node.transition', 'movement_request_node', :node_id::text, :request_id::uuid, '{}');
INSERT INTO movement_callback_outbox (request_id, event_type, payload, max_attempts)
VALUES (:request_id::uuid, 'bench', '{}', 5);
END;
]]

function B.raw_seed(pool)
  B.q([[
    WITH pv AS (
      SELECT pv.id, pv.compiled_plan_hash FROM plan_versions pv
        JOIN movement_templates t ON t.id = pv.template_id
       WHERE t.template_key = 'bench_chain3' ORDER BY pv.version DESC LIMIT 1),
    r AS (
      INSERT INTO movement_requests (network_class, template_key, plan_version_id,
             compiled_plan_hash, request_state, intent, idempotency_key, created_by)
      SELECT $1, 'bench_chain3', pv.id, pv.compiled_plan_hash, 'EXECUTING', '{}',
             'raw-' || g, 'bench'
        FROM pv, generate_series(1, $2::int) g
      RETURNING id, plan_version_id)
    INSERT INTO movement_request_nodes (request_id, plan_node_id, node_key, node_kind,
           action_type, executor, node_state, next_observe_at)
    SELECT r.id, pn.id, pn.node_key, pn.node_kind, pn.action_type, pn.executor,
           CASE pn.node_key WHEN 'a' THEN 'READY' WHEN 'b' THEN 'SUBMITTED' ELSE 'UNKNOWN' END,
           clock_timestamp()
      FROM r JOIN plan_nodes pn ON pn.plan_version_id = r.plan_version_id]], B.RAW_CLASS, pool)
  B.exec("VACUUM ANALYZE movement_requests, movement_request_nodes")
end

function B.raw_cleanup()
  -- audit rows leave the outbox only by promotion (sql/0040): promote them
  local promote = require("qtg.workers.audit_outbox_promoter").PROMOTE_SQL
  repeat local n = B.q(promote, 5000)[1].promoted until n == 0
  -- The raw rows are the bench's own and nothing references them; with
  -- foreign-key checks off (session_replication_role = replica, this
  -- session only) deleting them does not scan the whole outbox once per
  -- row for redelivery_of (whose only index is partial).
  local s = qtg.db.acquire()
  local ok, err = pcall(function()
    s:begin()
    s:query("SET LOCAL session_replication_role = replica")
    s:query([[CREATE TEMP TABLE bench_raw_ids ON COMMIT DROP AS
              SELECT id FROM movement_requests WHERE network_class = $1]], B.RAW_CLASS)
    s:query("DELETE FROM movement_callback_outbox WHERE request_id IN (SELECT id FROM bench_raw_ids)")
    s:query("DELETE FROM movement_request_nodes WHERE request_id IN (SELECT id FROM bench_raw_ids)")
    s:query("DELETE FROM movement_requests WHERE id IN (SELECT id FROM bench_raw_ids)")
    s:commit()
  end)
  if not ok then pcall(s.rollback, s) end
  s:release()
  if not ok then error(err, 0) end
  B.exec("VACUUM ANALYZE movement_requests, movement_request_nodes, movement_callback_outbox, audit_outbox")
end

-- raw_tps(o, clients, seconds, label): pgbench at each of `clients` for
-- `seconds` on a freshly seeded pool; returns the TPS by client count
-- ({["1"] = tps, ...}) and PostgreSQL's CPU per transaction in ms (every
-- server process's, from /proc around each pgbench run): what PostgreSQL
-- spends on one node transition alone, the unit a node's CPU is read in.
function B.raw_tps(o, clients, seconds, label)
  B.raw_seed(o.raw_pool)
  local path = B.dir .. "/raw.sql"
  common.write(path, B.RAW_SCRIPT)
  local tps_by, pg_ms_by = {}, {}
  for _, c in ipairs(clients) do
    local cmd = ("PGOPTIONS=%s %s -n -M prepared -c %d -j %d -T %d %s %s"):format(
      common.quote(B.RAW_OPTIONS), common.quote(B.pgbench), c, math.min(c, 2), seconds, "-f " .. common.quote(path),
      common.quote(os.getenv("MG_DATABASE_URL")))
    local pg0 = B.pg_cpu()
    local text, rc = B.sh(cmd)
    qtg.sleep(0.3) -- pgbench's backends have exited: their time is the postmaster's once reaped
    local pg1 = B.pg_cpu()
    local tps = tonumber(text:match("tps = ([%d%.]+) %(without initial connection time%)"))
    local done = tonumber(text:match("number of transactions actually processed: (%d+)"))
    if rc ~= 0 or not tps then
      B.failures[#B.failures + 1] = ("raw: pgbench at %d clients failed (rc %s): %s"):format(
        c, tostring(rc), text:sub(-400))
    end
    tps_by[tostring(c)] = tps
    if pg0 and pg1 and done and done > 0 then pg_ms_by[tostring(c)] = 1000 * (pg1 - pg0) / done end
    B.say(("raw%s: %d client(s): %s TPS, PostgreSQL CPU %s ms per transaction"):format(label or "", c,
      tostring(tps and math.floor(tps + 0.5)), fmt(pg_ms_by[tostring(c)], "%.3f")))
  end
  B.raw_cleanup()
  return tps_by, pg_ms_by
end

function B.phase_raw(o)
  local tps, pg_ms = B.raw_tps(o, o.clients, o.raw_seconds)
  return { seconds = o.raw_seconds, pool = o.raw_pool, tps = tps, postgres_ms_per_transaction = pg_ms }
end

-- ------------------------------------------------------------ idle
-- The server log of the bench cluster, and the statements qtgd ran in it
-- between two byte offsets: every "execute" (extended protocol: BEGIN and
-- COMMIT included, which pg_stat_statements does not count when they are
-- prepared) and "statement:" (simple protocol) line logged with
-- log_min_duration_statement = 0 for application qtgd.
function B.server_log()
  local dir = os.getenv("QTG_BENCH_PGDIR")
  return dir and (dir .. "/log/postgresql.log")
end

local function file_size(path)
  local f = path and io.open(path, "r")
  if not f then return nil end
  local n = f:seek("end")
  f:close()
  return n
end

function B.logged_statements(path, from, to)
  local f = io.open(path, "r")
  if not f then return nil end
  f:seek("set", from)
  local text = f:read(to - from) or ""
  f:close()
  local n, by = 0, {}
  for line in text:gmatch("[^\n]+") do
    if line:find(" qtgd ", 1, true) then
      local what = line:match("duration: [%d%.]+ ms  execute [^:]*: (.*)$")
        or line:match("duration: [%d%.]+ ms  statement: (.*)$")
      if what and not what:find("pg_stat", 1, true) and not what:find("queryid", 1, true)
         and not what:find("bench-probe", 1, true) then
        n = n + 1
        local key = what:gsub("%s+", " "):sub(1, 60)
        by[key] = (by[key] or 0) + 1
      end
    end
  end
  return n, by
end

-- Every statement into the server log (on), or back to the default (off).
function B.log_statements(on)
  if not B.server_log() then return end
  if on then
    B.exec("ALTER SYSTEM SET log_min_duration_statement = 0")
    B.exec("ALTER SYSTEM SET log_line_prefix = '%m [%p] %a '")
  else
    B.exec("ALTER SYSTEM RESET log_min_duration_statement")
    B.exec("ALTER SYSTEM RESET log_line_prefix")
  end
  B.q("SELECT pg_reload_conf()")
end

function B.phase_idle(o)
  local log = B.server_log()
  B.log_statements(true)
  local d = B.start_daemon("idle")
  assert(B.wait_ready(1), "bench: the idle daemon did not start listening")
  qtg.sleep(3)  -- start-up work (heartbeat seed, first passes) is not idle cost
  local a, p0, t0, l0 = B.stmt_snapshot(), B.proc(d.pid), qtg.monotonic(), file_size(log)
  qtg.sleep(o.idle)
  local b, p1, t1, l1 = B.stmt_snapshot(), B.proc(d.pid), qtg.monotonic(), file_size(log)
  B.stop_daemon(d)
  local logged, by_stmt
  B.log_statements(false)
  if log and l0 and l1 then logged, by_stmt = B.logged_statements(log, l0, l1) end
  local list, calls = B.stmt_delta(a, b)
  local secs = t1 - t0
  local top = {}
  table.sort(list, function(x, y) return x.calls > y.calls end)
  for i = 1, math.min(12, #list) do top[i] = list[i] end
  return {
    seconds = secs, pgss_statements = calls, pgss_statements_per_s = calls / secs,
    statements = logged or calls, statements_per_s = (logged or calls) / secs,
    counted_by = logged and "server log (every statement)" or "pg_stat_statements",
    logged_by_statement = by_stmt,
    cpu_s = p1.cpu_s - p0.cpu_s, cpu_pct = 100 * (p1.cpu_s - p0.cpu_s) / secs,
    rss_kb = p1.rss_kb, hwm_kb = p1.hwm_kb, top = top,
  }
end

-- ------------------------------------------------------------ counters
-- Transactions of the database (pg_stat_database), WAL activity
-- (pg_stat_wal: wal_sync counts the WAL flushes that reached the disk, 0 on
-- a --fast cluster), the WAL insert position, and the sim provider's own
-- ledger writes (one autocommit statement per submit and per observe, on
-- its own session: not the engine's commits), and the rows every table
-- had inserted, updated (how many of them HOT: no index entry written) and
-- deleted.
function B.counters()
  return B.q([[
    SELECT d.xact_commit::float8 AS xact_commit, d.xact_rollback::float8 AS xact_rollback,
           w.wal_records::float8 AS wal_records, w.wal_bytes::float8 AS wal_bytes,
           w.wal_write::float8 AS wal_write, w.wal_sync::float8 AS wal_sync,
           pg_current_wal_insert_lsn()::text AS lsn,
           (SELECT coalesce(sum(submit_count + observe_count), 0)::float8 FROM sim_ledger) AS sim_writes,
           (SELECT jsonb_object_agg(t.relname, jsonb_build_object(
                     'inserts', t.n_tup_ins, 'updates', t.n_tup_upd, 'hot', t.n_tup_hot_upd,
                     'deletes', t.n_tup_del))
              FROM pg_stat_user_tables t) AS tables
      FROM pg_stat_database d, pg_stat_wal w
     WHERE d.datname = current_database() /* bench-probe */]])[1]
end

-- Make every session of this process's pool flush its table counters now:
-- a backend sends them at most once a second, or after 10 s idle, so the
-- rows the bench itself wrote just before a burn-down (the raw phase's
-- clean-up, the requests created) would otherwise land in its window.
function B.flush_stats()
  local held = {}
  for i = 1, tonumber(qtg.settings.db_pool_size) or 8 do
    held[i] = qtg.db.acquire()
    held[i]:query("SELECT pg_stat_force_next_flush() /* bench-probe */")
  end
  for _, s in ipairs(held) do s:release() end
  qtg.sleep(0.1)
end

-- Commit records in the WAL between two positions (pg_waldump --stats):
-- the transactions that wrote something, whoever ran them.  nil when the
-- segments are gone (a checkpoint recycled them) or pg_waldump fails.
function B.wal_commits(from, to)
  local dir = os.getenv("QTG_BENCH_PGDIR")
  if not dir then return nil end
  local text, rc = B.sh(("%s -p %s -s %s -e %s --stats=record"):format(
    common.quote(B.pgbin .. "/pg_waldump"), common.quote(dir .. "/data/pg_wal"), from, to))
  if rc ~= 0 then return nil end
  local n = 0
  for c in text:gmatch("\nTransaction/COMMIT%s+(%d+)") do n = n + tonumber(c) end
  for c in text:gmatch("\nTransaction/COMMIT_PREPARED%s+(%d+)") do n = n + tonumber(c) end
  return n
end

-- Per-node figures of a burn-down from the counters before (a) and after (b).
function B.per_node(a, b, nodes)
  local d = function(k) return b[k] - a[k] end
  local r = {
    xact_commit = d("xact_commit"), xact_rollback = d("xact_rollback"),
    wal_records = d("wal_records"), wal_bytes = d("wal_bytes"),
    wal_write = d("wal_write"), wal_sync = d("wal_sync"), sim_writes = d("sim_writes"),
    wal_commits = B.wal_commits(a.lsn, b.lsn),
  }
  -- the rows each table wrote per node (inserted, updated, deleted: each a
  -- heap tuple and, unless a HOT update, an entry in every index), and
  -- their sum without the sim provider's ledger (the venue's books)
  r.hot_updates, r.row_writes = {}, {}
  local all, sim = 0, 0
  for name, t in pairs(b.tables or {}) do
    local t0 = (a.tables or {})[name] or { inserts = 0, updates = 0, hot = 0, deletes = 0 }
    local updates = t.updates - t0.updates
    r.hot_updates[name] = { updates_per_node = updates / nodes,
                            hot_share = updates > 0 and (t.hot - t0.hot) / updates or nil }
    local w = { inserts = (t.inserts - t0.inserts) / nodes, updates = updates / nodes,
                deletes = (t.deletes - t0.deletes) / nodes }
    w.total = w.inserts + w.updates + w.deletes
    if w.total > 0 then
      r.row_writes[name] = w
      all = all + w.total
      if name == "sim_ledger" then sim = w.total end
    end
  end
  r.row_writes_per_node, r.engine_row_writes_per_node = all, all - sim
  r.commits_per_node = r.xact_commit / nodes
  r.wal_flushes_per_node = r.wal_sync / nodes
  if r.wal_commits then
    r.write_commits_per_node = r.wal_commits / nodes
    r.engine_write_commits_per_node = (r.wal_commits - r.sim_writes) / nodes
  end
  return r
end

-- ------------------------------------------------------------ throughput
-- burn_down(o, label, procs, prefix, n, counted): n bench_chain3 requests
-- burnt down by procs daemons.  A counted burn-down logs every statement
-- (the statements per node, from the server log); a timed one logs nothing
-- and gives nodes/s, CPU, commits, WAL flushes, the ratio to the raw limit
-- measured around it and the half-way plans.  Logging every statement costs
-- PostgreSQL about a quarter of its CPU per node in this workload, so a
-- logged run's timings are not production's.
function B.burn_down(o, label, procs, prefix, n, counted)
  B.say(("%s: creating and approving %d requests"):format(label, n))
  local ids = B.create("bench_chain3", n, prefix, true)
  -- The machine may be shared: the raw limit is measured again right before
  -- and right after this burn-down, and the ratio taken against their mean.
  local raw_before, raw_pg_before
  if not counted then
    local tps, pg_ms = B.raw_tps(o, { 8 }, o.raw_seconds, " (before " .. label .. ")")
    raw_before, raw_pg_before = tps["8"], pg_ms["8"]
  end
  B.exec("ANALYZE movement_requests, movement_request_nodes, movement_callback_outbox")
  local log = counted and B.server_log() or nil
  if counted then B.log_statements(true) end
  local l0 = file_size(log)
  B.flush_stats()
  local c0 = B.counters()
  local snap = B.stmt_snapshot()
  local pg0 = B.pg_cpu()
  local rc0 = B.receiver and B.proc(B.receiver.pid)
  local t0 = qtg.monotonic()
  local ds = {}
  for i = 1, procs do ds[i] = B.start_daemon(("%s-%d"):format(prefix, i)) end
  local moving, pending
  local peak = 0
  local plans
  -- every 0.2 s: the poll itself costs the database, not too often
  common.poll(function()
    moving, pending = B.backlog()
    if not counted and not plans and moving > 0 and moving <= n / 2 then
      plans = B.explain(label .. ", half-way") -- the claims as they run under load
    end
    for _, d in ipairs(ds) do
      local p = B.proc(d.pid)
      if p and p.hwm_kb > peak then peak = p.hwm_kb end
    end
    return moving == 0 and pending == 0
  end, t0 + o.timeout - qtg.monotonic(), 0.2)
  local elapsed = qtg.monotonic() - t0
  local pg1 = B.pg_cpu()
  local rc1 = B.receiver and B.proc(B.receiver.pid)
  local after = B.stmt_snapshot()
  local hwm, qcpu = 0, 0
  for _, d in ipairs(ds) do
    local last = B.stop_daemon(d)
    if last and last.hwm_kb > hwm then hwm = last.hwm_kb end
    if last then qcpu = qcpu + last.cpu_s end
  end
  -- the daemons' backends have exited, so their statistics are flushed
  qtg.sleep(0.5)
  local c1 = B.counters()
  local l1 = file_size(log)
  if counted then B.log_statements(false) end
  local logged, by_stmt
  if log and l0 and l1 then logged, by_stmt = B.logged_statements(log, l0, l1) end
  local raw_after, raw_pg_after
  if not counted then
    local tps, pg_ms = B.raw_tps(o, { 8 }, o.raw_seconds, " (after " .. label .. ")")
    raw_after, raw_pg_after = tps["8"], pg_ms["8"]
  end
  local check = B.check_done(ids, label)
  local list, calls, ms = B.stmt_delta(snap, after)
  local top = {}
  for i = 1, math.min(40, #list) do top[i] = list[i] end
  local nodes = 3 * n
  local top_logged = {}
  for k, v in pairs(by_stmt or {}) do top_logged[#top_logged + 1] = { statement = k, per_node = v / nodes } end
  table.sort(top_logged, function(x, y) return x.per_node > y.per_node end)
  for i = #top_logged, 26, -1 do top_logged[i] = nil end
  local r = {
    processes = procs, requests = n, nodes = nodes, seconds = elapsed, counted = counted,
    nodes_per_s = nodes / elapsed, requests_per_s = n / elapsed,
    statements = logged or calls, statements_per_node = (logged or calls) / nodes, db_exec_ms = ms,
    counted_by = logged and "server log (every statement)" or "pg_stat_statements",
    pgss_statements_per_node = calls / nodes, logged_per_node = top_logged,
    counters = B.per_node(c0, c1, nodes),
    peak_rss_kb = math.max(hwm, peak), check = check, top = top,
    timed_out = moving ~= 0 or pending ~= 0,
    raw8_before = raw_before, raw8_after = raw_after, plans = plans,
    raw8_mean = raw_before and raw_after and (raw_before + raw_after) / 2 or nil,
    cpu = { qtgd_s = qcpu, postgres_s = pg0 and pg1 and (pg1 - pg0) or nil,
            receiver_s = rc0 and rc1 and (rc1.cpu_s - rc0.cpu_s) or nil,
            machine_s = elapsed * B.cores },
  }
  if r.raw8_mean then r.ratio_vs_raw8 = r.nodes_per_s / r.raw8_mean end
  r.cpu.qtgd_ms_per_node = 1000 * qcpu / nodes
  r.cpu.postgres_ms_per_node = r.cpu.postgres_s and 1000 * r.cpu.postgres_s / nodes or nil
  -- PostgreSQL's CPU per node in raw transactions (the mean of the raw runs
  -- around this burn-down): how many node transitions' worth a node costs
  if raw_pg_before and raw_pg_after and r.cpu.postgres_ms_per_node then
    r.cpu.raw8_postgres_ms_per_transaction = (raw_pg_before + raw_pg_after) / 2
    r.cpu.postgres_per_node_in_raw_transactions =
      r.cpu.postgres_ms_per_node / r.cpu.raw8_postgres_ms_per_transaction
  end
  local k = r.counters
  B.say(("%s per node: %.1f statements (" .. r.counted_by .. "), %.2f commits (%s write, %s without the sim's), %.2f WAL flushes, CPU ms: postgres %s, qtgd %.2f"):format(
    label, r.statements_per_node, k.commits_per_node, fmt(k.write_commits_per_node, "%.2f"),
    fmt(k.engine_write_commits_per_node, "%.2f"), k.wal_flushes_per_node,
    fmt(r.cpu.postgres_ms_per_node, "%.2f"), r.cpu.qtgd_ms_per_node))
  B.say(("%s: %d nodes in %.2f s = %.0f nodes/s (%d processes), %.1f statements/node; CPU s: qtgd %.1f, postgres %s, receiver %s of %.1f; raw8 %s/%s TPS, ratio %s"):format(
    label, nodes, elapsed, r.nodes_per_s, procs, r.statements_per_node, qcpu,
    fmt(r.cpu.postgres_s), fmt(r.cpu.receiver_s), r.cpu.machine_s, fmt(raw_before, "%.0f"),
    fmt(raw_after, "%.0f"), fmt(r.ratio_vs_raw8, "%.3f")))
  return r
end

-- The requests of a counted burn-down: a quarter of --n, at least 50
-- (statements per node do not depend on the backlog's size).
function B.counted_n(o)
  return math.max(50, math.floor(o.n / 4))
end

-- throughput(o, label, procs, prefix): a counted burn-down, then a timed
-- one; the timed one's result, with the counted one's statements.
function B.throughput(o, label, procs, prefix)
  local c = B.burn_down(o, label .. " (counted)", procs, prefix .. "c", B.counted_n(o), true)
  local r = B.burn_down(o, label, procs, prefix, o.n, false)
  r.pgss_statements_per_node_timed = r.pgss_statements_per_node
  for _, k in ipairs({ "statements_per_node", "counted_by", "pgss_statements_per_node", "logged_per_node" }) do
    r[k] = c[k]
  end
  r.statements = nil
  r.counted_run = { requests = c.requests, seconds = c.seconds, nodes_per_s = c.nodes_per_s,
                    statements = c.statements, cpu = c.cpu, counters = c.counters, check = c.check }
  return r
end

-- ------------------------------------------------------------ latency
function B.phase_latency(o)
  local ids = B.create("bench_one", o.latency, "lat", false)
  local d = B.start_daemon("latency")
  assert(B.wait_ready(1), "bench: the latency daemon did not start listening")
  qtg.sleep(1)
  local submitted, completed = {}, {}
  local s = qtg.db.acquire()
  local ok, err = pcall(function()
    for i, id in ipairs(ids) do
      qtg.sleep(0.05)  -- idle between requests: workers asleep again
      requests.approve(s, id, B.ACTOR)
      local t0 = qtg.now()  -- approved: its transaction has committed
      local row
      common.poll(function()
        row = s:query([[
          SELECT r.request_state,
                 extract(epoch FROM r.finished_at)::float8 AS finished,
                 (SELECT extract(epoch FROM min(n.started_at))::float8
                    FROM movement_request_nodes n WHERE n.request_id = r.id) AS started
            FROM movement_requests r WHERE r.id = $1::uuid /* bench-probe */]], id)[1]
        return row.request_state == "COMPLETED"
      end, 30, 0.002)
      if row.request_state == "COMPLETED" then
        submitted[#submitted + 1] = (row.started - t0) * 1000
        completed[#completed + 1] = (row.finished - t0) * 1000
      else
        B.failures[#B.failures + 1] = ("latency: request %d (%s) is %s after 30 s"):format(
          i, id, row.request_state)
      end
    end
  end)
  s:release()
  local last = B.stop_daemon(d)
  if not ok then error(err, 0) end
  return { requests = #ids, approve_to_submitted_ms = B.summary(submitted),
           approve_to_completed_ms = B.summary(completed), hwm_kb = last and last.hwm_kb }
end

-- ------------------------------------------------------------ growth
-- Clone the finished bench requests (requests, nodes, callback rows, audit
-- events) until `target` finished requests are in the tables.
function B.seed_finished(target)
  local have = B.q([[SELECT count(*)::int AS n FROM movement_requests
                      WHERE network_class = $1 AND request_state = 'COMPLETED']], B.CLASS)[1].n
  if have == 0 then error("bench: no finished request to clone", 0) end
  local copies = math.ceil(math.max(0, target - have) / have)
  if copies == 0 then return have end
  local s = qtg.db.acquire()
  local ok, err = pcall(function()
    s:begin()
    s:exec("SET LOCAL statement_timeout = 0")   -- a large clone is not a worker's statement
    s:query([[CREATE TEMP TABLE bench_map ON COMMIT DROP AS
              SELECT r.id AS old, g, gen_random_uuid() AS new
                FROM movement_requests r, generate_series(1, $2::int) g
               WHERE r.network_class = $1 AND r.request_state = 'COMPLETED'
                 AND r.idempotency_key NOT LIKE 'grown-%']], B.CLASS, copies)
    s:query([[
      INSERT INTO movement_requests (id, network_class, template_key, plan_version_id,
             compiled_plan_hash, request_state, intent, input_params, current_frontier,
             idempotency_key, callback_url, callback_sequence, expires_at, created_by,
             approved_by, approved_at, finished_at, last_error_code, created_at, updated_at)
      SELECT m.new, r.network_class, r.template_key, r.plan_version_id, r.compiled_plan_hash,
             r.request_state, r.intent, r.input_params, r.current_frontier,
             'grown-' || m.g || '-' || r.idempotency_key, r.callback_url, r.callback_sequence,
             r.expires_at, r.created_by, r.approved_by, r.approved_at, r.finished_at,
             r.last_error_code, r.created_at - make_interval(days => m.g), r.updated_at
        FROM bench_map m JOIN movement_requests r ON r.id = m.old]])
    s:query([[
      INSERT INTO movement_request_nodes (request_id, plan_node_id, node_key, node_kind,
             action_type, executor, node_state, attempt_no, idempotency_key, side_effect,
             observe_count, next_observe_at, started_at, finished_at, resolved_config,
             provider_refs, artifacts, error_code, error_detail, created_at, updated_at)
      SELECT m.new, n.plan_node_id, n.node_key, n.node_kind, n.action_type, n.executor,
             n.node_state, n.attempt_no, n.idempotency_key, n.side_effect, n.observe_count,
             n.next_observe_at, n.started_at, n.finished_at, n.resolved_config,
             n.provider_refs, n.artifacts, n.error_code, n.error_detail, n.created_at, n.updated_at
        FROM bench_map m JOIN movement_request_nodes n ON n.request_id = m.old]])
    s:query([[
      INSERT INTO movement_callback_outbox (request_id, event_type, payload, callback_url,
             status, attempts, max_attempts, next_attempt_at, callback_timestamp,
             last_status, delivered_at, last_attempt_at, created_at, updated_at)
      SELECT m.new, c.event_type, c.payload, c.callback_url, c.status, c.attempts,
             c.max_attempts, c.next_attempt_at, c.callback_timestamp, c.last_status,
             c.delivered_at, c.last_attempt_at, c.created_at, c.updated_at
        FROM bench_map m JOIN movement_callback_outbox c ON c.request_id = m.old]])
    s:query([[
      INSERT INTO audit_events (outbox_id, actor, action, entity_type, entity_id, request_id,
             detail, created_at, promoted_at)
      SELECT -row_number() OVER () - coalesce((SELECT -min(outbox_id) FROM audit_events
                                                WHERE outbox_id < 0), 0),
             e.actor, e.action, e.entity_type, e.entity_id, m.new, e.detail, e.created_at,
             e.promoted_at
        FROM bench_map m JOIN audit_events e ON e.request_id = m.old]])
    s:commit()
  end)
  if not ok then
    pcall(s.rollback, s)
    s:release()
    error(err, 0)
  end
  s:release()
  B.exec("VACUUM ANALYZE")
  return B.q([[SELECT count(*)::int AS n FROM movement_requests
                WHERE network_class = $1 AND request_state = 'COMPLETED']], B.CLASS)[1].n
end

-- ------------------------------------------------------------ plans
-- The GENERIC plan of every hot statement (qtg.hot_statements: PREPARE
-- under plan_cache_mode = force_generic_plan, then EXPLAIN (ANALYZE,
-- BUFFERS) EXECUTE), as the daemons run them, with the arguments a pass
-- uses and real row ids of this run (the outcome write's are delivered
-- rows, which no lane holds); inside a transaction rolled back (the claims
-- lock nothing after, the writes leave nothing).
function B.explain(label)
  local hot = require("qtg.hot_statements")
  local s = qtg.db.acquire()
  local ok, out = pcall(function()
    local node = s:query([[SELECT n.id, n.request_id FROM movement_request_nodes n
                            JOIN movement_requests r ON r.id = n.request_id
                           WHERE r.network_class = $1 AND n.node_state = 'READY'
                           LIMIT 1 /* bench-probe */]], B.CLASS)[1]
    local cb = s:query([[SELECT string_agg(id::text, ',') AS ids FROM (
                           SELECT id FROM movement_callback_outbox WHERE status = 'delivered'
                            ORDER BY id DESC LIMIT 5) x /* bench-probe */]])[1]
    local ids = {}
    for id in tostring(cb.ids or ""):gmatch("%d+") do ids[#ids + 1] = tonumber(id) end
    return hot.explain_all(s, { class = B.CLASS, node_id = node and node.id,
                                request_id = node and node.request_id, outbox_ids = ids,
                                notification_ids = {}, process_id = "bench" }, true)
  end)
  s:release()
  if not ok then error(out, 0) end
  for _, e in ipairs(out) do
    e.shared_hit = e.buffers
    B.say(("plan %s, %s: %s ms, %s buffers%s"):format(label, e.name, fmt(e.ms, "%.3f"),
      tostring(e.buffers), #e.seq_scans > 0 and (", Seq Scan on " .. table.concat(e.seq_scans, ", ")) or ""))
  end
  return out
end

-- ------------------------------------------------------------ output
-- ------------------------------------------------------------ api phase
-- The HTTP API on an idle daemon (workers off, so only the API and the
-- database work): create+approve through HTTP by 1 and 8 concurrent clients
-- (requests/s, p50/p99 of one create+approve), GET /v3/requests/{id} p99,
-- and in the same run the same create+approve through the lifecycle
-- functions the console calls (one transaction each, in this process), so
-- the API's own cost is a ratio.
function B.phase_api(o)
  local n = o.ci and 40 or 400
  local d = B.start_daemon("api", { MG_API_LISTEN = "127.0.0.1:0", MG_WORKERS_ENABLED = "false", MG_LOG_LEVEL = "info",
    MG_API_RATE_LIMIT_BURST = "1000000", MG_API_RATE_LIMIT_PER_SECOND = "100000" })
  local address = common.wait_log(d, '"msg":"api listening","address":"([^"]+)"', 30, "bench: the API to listen")
  local base = "http://" .. address
  local function token(name, roles)
    B.sh(("%s tokens revoke %s"):format(common.quote(B.bin), name))
    local out = B.sh(("%s tokens create --name %s --roles %s --class %s"):format(common.quote(B.bin), name, roles,
      B.CLASS))
    return (out:match("(qtg_[%w_-]+)%s*$"))
  end
  local creator, approver = token("bench-desk", "read,operate"), token("bench-approver", "read,approve")
  assert(creator and approver, "bench: cannot create API tokens")
  local run = qtg.crypto.hex(qtg.crypto.random_bytes(4))
  local function call(method, path, tok, body, key)
    local resp, err = qtg.http.request{ method = method, url = base .. path, timeout = 30, body = body,
      headers = { Authorization = "Bearer " .. tok, ["Content-Type"] = body and "application/json" or nil,
                  ["Idempotency-Key"] = key } }
    if not resp or resp.status >= 300 then
      error(("bench: %s %s: %s"):format(method, path, resp and (resp.status .. " " .. resp.body) or tostring(err.message)), 0)
    end
    return resp
  end
  local body = cjson.encode({ template_key = "bench_one", intent = { asset = "USDC", amount = "1.00" } })
  local function create_approve(tag, i)
    local t0 = qtg.monotonic()
    local r = call("POST", "/v3/requests", creator, body, ("%s-%s-%d"):format(run, tag, i))
    local id = cjson.decode(r.body).id
    call("POST", "/v3/requests/" .. id .. "/approve", approver)
    return (qtg.monotonic() - t0) * 1000, id
  end
  local R = { requests = n }
  local ids = {}
  for _, clients in ipairs({ 1, 8 }) do
    local lat, tasks = {}, {}
    local t0 = qtg.monotonic()
    for c = 1, clients do
      tasks[c] = qtg.spawn(function()
        for i = c, n, clients do
          local ms, id = create_approve("c" .. clients, i)
          lat[#lat + 1] = ms
          ids[#ids + 1] = id
        end
      end)
    end
    for c = 1, clients do
      local ok, err = qtg.join(tasks[c])
      if not ok then error(err, 0) end
    end
    local secs = qtg.monotonic() - t0
    R["clients_" .. clients] = { per_s = n / secs, ms = B.summary(lat) }
  end
  local gets = {}
  for i = 1, n do
    local t0 = qtg.monotonic()
    call("GET", "/v3/requests/" .. ids[(i - 1) % #ids + 1], creator)
    gets[i] = (qtg.monotonic() - t0) * 1000
  end
  R.get_ms = B.summary(gets)
  -- the same create+approve without HTTP, one at a time
  local direct = {}
  local s = qtg.db.acquire()
  local ok, err = pcall(function()
    for i = 1, n do
      local t0 = qtg.monotonic()
      local req = requests.create(s, { template_key = "bench_one", intent = { asset = "USDC", amount = "1.00" },
        idempotency_key = ("%s-direct-%d"):format(run, i) }, B.ACTOR)
      requests.approve(s, req.id, "console:bench-approver")
      direct[i] = (qtg.monotonic() - t0) * 1000
    end
  end)
  s:release()
  if not ok then error(err, 0) end
  R.direct_ms = B.summary(direct)
  R.api_vs_direct_p50 = R.clients_1.ms.p50 / R.direct_ms.p50
  B.stop_daemon(d)
  return R
end

function B.say(msg)
  io.stderr:write("bench: ", msg, "\n")
  io.stderr:flush()
end


function B.print_table(R)
  local out = {}
  local function line(k, v, target) out[#out + 1] = string.format("  %-44s %14s   %s", k, v, target or "") end
  out[#out + 1] = string.format("qtg bench (%s mode, %s cluster: fsync %s, synchronous_commit %s, commit_delay %s) %s, %d cores",
    R.mode, R.durable and "durable" or "fast", R.cluster.fsync, R.cluster.synchronous_commit,
    R.cluster.commit_delay, R.date, R.cores)
  if R.raw then
    out[#out + 1] = "raw limit (pgbench: claim + node update + 2 outbox inserts)"
    for _, c in ipairs(R.options.clients) do
      line(("TPS at %d client(s)"):format(c), fmt(R.raw.tps[tostring(c)], "%.0f"),
        ("PostgreSQL CPU %s ms per transaction"):format(
          fmt((R.raw.postgres_ms_per_transaction or {})[tostring(c)], "%.3f")))
    end
  end
  if R.throughput then
    out[#out + 1] = ("throughput (burn-down of %d bench_chain3 requests)"):format(R.options.n)
    for _, t in ipairs(R.throughput) do
      line(("nodes/s, %d process(es)"):format(t.processes), fmt(t.nodes_per_s, "%.0f"),
        ("%.2f s, %.1f statements/node"):format(t.seconds, t.statements_per_node))
      line(("  / raw TPS at 8 clients around it (%s)"):format(fmt(t.raw8_mean, "%.0f")),
        fmt(t.ratio_vs_raw8, "%.3f"), t.processes == 2 and "target >= 0.5 (aim 0.8)" or "target >= 0.35")
      local k = t.counters
      line("  statements per node (server log, counted run)", fmt(t.statements_per_node, "%.1f"),
        t.processes == 2 and "target <= 14" or "target <= 12")
      if t.counted_run then
        line("  nodes/s of the counted run (statements logged)", fmt(t.counted_run.nodes_per_s, "%.0f"),
          ("%d requests"):format(t.counted_run.requests))
      end
      line("  commits / write commits (without the sim's) per node",
        ("%s / %s"):format(fmt(k.commits_per_node, "%.2f"), fmt(k.engine_write_commits_per_node, "%.2f")),
        "target write <= 3.5")
      line("  WAL flushes per node", fmt(k.wal_flushes_per_node, "%.2f"))
      local hot = k.hot_updates or {}
      local req, nod = hot.movement_requests or {}, hot.movement_request_nodes or {}
      line("  updates per node (HOT share): requests / nodes",
        ("%s (%s) / %s (%s)"):format(fmt(req.updates_per_node, "%.2f"), fmt(req.hot_share, "%.2f"),
          fmt(nod.updates_per_node, "%.2f"), fmt(nod.hot_share, "%.2f")))
      local largest = {}
      for name, w in pairs(k.row_writes or {}) do
        if name ~= "sim_ledger" then largest[#largest + 1] = { name = name, w = w } end
      end
      table.sort(largest, function(x, y) return x.w.total > y.w.total end)
      local parts = {}
      for i = 1, math.min(4, #largest) do
        parts[i] = ("%s %.1f"):format(largest[i].name, largest[i].w.total)
      end
      line("  row writes per node (without the sim's)", fmt(k.engine_row_writes_per_node, "%.1f"),
        table.concat(parts, ", "))
      line("  CPU per node, ms: postgres / qtgd",
        ("%s / %s"):format(fmt(t.cpu.postgres_ms_per_node, "%.2f"), fmt(t.cpu.qtgd_ms_per_node, "%.2f")),
        "target <= 1.0 each")
      line("  PostgreSQL CPU per node in raw transactions",
        fmt(t.cpu.postgres_per_node_in_raw_transactions, "%.2f"),
        ("raw: %s ms each at 8 clients"):format(fmt(t.cpu.raw8_postgres_ms_per_transaction, "%.3f")))
    end
    if R.ratios and R.ratios.throughput2_vs_raw8 then
      line("nodes/s (2 proc) / raw TPS (8 clients, raw phase)", fmt(R.ratios.throughput2_vs_raw8, "%.3f"))
    end
  end
  if R.latency then
    local a, c = R.latency.approve_to_submitted_ms, R.latency.approve_to_completed_ms
    out[#out + 1] = ("latency (idle daemon, %d single requests), ms"):format(R.latency.requests)
    line("approve -> first node SUBMITTED p50/p99/max",
      ("%s/%s/%s"):format(fmt(a.p50), fmt(a.p99), fmt(a.max)), "target p50 <= 2.5, p99 <= 6")
    line("approve -> COMPLETED (1 node) p50/p99/max",
      ("%s/%s/%s"):format(fmt(c.p50), fmt(c.p99), fmt(c.max)), "target p50 <= 30")
  end
  if R.api then
    local a = R.api
    out[#out + 1] = ("HTTP API (idle daemon, workers off, %d create+approve per run), ms"):format(a.requests)
    for _, c in ipairs({ 1, 8 }) do
      local x = a["clients_" .. c]
      line(("create+approve, %d client(s): per s, p50/p99"):format(c),
        ("%s %s/%s"):format(fmt(x.per_s, "%.0f"), fmt(x.ms.p50), fmt(x.ms.p99)))
    end
    line("GET /v3/requests/{id} p50/p99", ("%s/%s"):format(fmt(a.get_ms.p50), fmt(a.get_ms.p99)), "target p99 <= 10")
    line("create+approve without HTTP p50/p99", ("%s/%s"):format(fmt(a.direct_ms.p50), fmt(a.direct_ms.p99)))
    line("API / without HTTP (p50, 1 client)", fmt(a.api_vs_direct_p50, "%.2f"), "target <= 1.5")
  end
  if R.idle then
    out[#out + 1] = ("idle (one qtgd, default intervals, %.0f s)"):format(R.idle.seconds)
    line("statements/s reaching PostgreSQL", fmt(R.idle.statements_per_s, "%.2f"), "target <= 2.5")
    line("CPU, % of one core", fmt(R.idle.cpu_pct, "%.2f"), "target <= 1")
  end
  out[#out + 1] = "memory"
  if R.idle then line("RSS idle (peak), MB", fmt(R.idle.hwm_kb / 1024), "target <= 24") end
  if R.throughput then
    local m = 0
    for _, t in ipairs(R.throughput) do m = math.max(m, t.peak_rss_kb or 0) end
    if R.growth then m = math.max(m, R.growth.peak_rss_kb or 0) end
    line("RSS during burn-down (peak), MB", fmt(m / 1024), "target <= 64")
  end
  if R.growth then
    out[#out + 1] = ("growth (%d finished requests in the tables)"):format(R.growth.finished_before)
    line("nodes/s, 2 processes", fmt(R.growth.nodes_per_s, "%.0f"),
      ("%.2f s, %.1f statements/node"):format(R.growth.seconds, R.growth.statements_per_node))
    line(("  / raw TPS at 8 clients around it (%s)"):format(fmt(R.growth.raw8_mean, "%.0f")),
      fmt(R.growth.ratio_vs_raw8, "%.3f"))
    if R.ratios.growth_ratio_vs_empty_ratio then
      line("growth / empty-table, each against its raw", fmt(R.ratios.growth_ratio_vs_empty_ratio, "%.3f"),
        "target >= 0.90")
    end
    if R.ratios.growth_vs_empty then
      line("growth / empty-table nodes/s", fmt(R.ratios.growth_vs_empty, "%.3f"), "target >= 0.90")
    end
  end
  local t2
  for _, t in ipairs(R.throughput or {}) do if t.processes == 2 then t2 = t end end
  if t2 and t2.plans then
    out[#out + 1] = "hot statements half-way through the 2-process burn-downs, generic plans, EXPLAIN ANALYZE ms (empty / growth)"
    for i, e in ipairs(t2.plans) do
      local g = R.growth and R.growth.plans and R.growth.plans[i]
      line(e.name, ("%s / %s"):format(fmt(e.ms, "%.3f"), fmt(g and g.ms, "%.3f")),
        ("buffers %s / %s%s"):format(tostring(e.shared_hit), tostring(g and g.shared_hit),
          #e.seq_scans > 0 and ("  SEQ SCAN on " .. table.concat(e.seq_scans, ", ")) or ""))
    end
  end
  if #R.failures > 0 then
    out[#out + 1] = "FAILED CHECKS:"
    for _, f in ipairs(R.failures) do out[#out + 1] = "  " .. f end
  end
  io.stdout:write(table.concat(out, "\n"), "\n")
  io.stdout:flush()
end

-- ------------------------------------------------------------ main
function B.main(argv)
  local o = B.parse_args(argv)
  B.root = common.root()
  B.bin = os.getenv("QTG_BIN") or (qtg.root .. "/build/qtgd")
  B.pgbin = "/usr/lib/postgresql/15/bin"
  B.pgbench = os.getenv("PGBENCH") or (B.pgbin .. "/pgbench")
  B.dir = common.tmpdir("qtg-bench")
  B.failures = {}
  local tck = B.sh("getconf CLK_TCK")
  B.clk_tck = tonumber(tck:match("%d+")) or 100
  B.cores = tonumber((B.sh("nproc"):match("%d+"))) or 1
  local R = { mode = o.ci and "ci" or "full", durable = not o.fast, date = os.date("!%Y-%m-%dT%H:%M:%SZ"),
              cores = tonumber((B.sh("nproc"):match("%d+"))) or 0, options = o,
              failures = B.failures, ratios = {} }
  B.exec("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
  -- diagnostics: QTG_BENCH_SQL runs first (e.g. "ALTER SYSTEM SET
  -- pg_stat_statements.track_planning = on; SELECT pg_reload_conf()")
  local pre = os.getenv("QTG_BENCH_SQL")
  if pre and pre ~= "" then
    for stmt in pre:gmatch("[^;]+") do
      if stmt:match("%S") then B.exec(stmt) end
    end
    R.setup_sql = pre
  end
  -- the cluster's settings as the daemons see them (after QTG_BENCH_SQL)
  R.cluster = B.q([[SELECT current_setting('fsync') AS fsync,
                           current_setting('synchronous_commit') AS synchronous_commit,
                           current_setting('full_page_writes') AS full_page_writes,
                           current_setting('commit_delay') AS commit_delay,
                           current_setting('commit_siblings') AS commit_siblings,
                           current_setting('shared_buffers') AS shared_buffers]])[1]
  local want = function(p) return o.only == nil or o.only:find(p, 1, true) ~= nil end
  local ok, err = pcall(function()
    if want("raw") then R.raw = B.phase_raw(o) end
    B.start_receiver()
    if want("idle") then
      B.say("idle: " .. o.idle .. " s")
      R.idle = B.phase_idle(o)
    end
    if want("throughput") or want("growth") then
      R.throughput = {}
      for _, p in ipairs(o.procs) do
        R.throughput[#R.throughput + 1] = B.throughput(o, ("throughput %dp"):format(p), p, ("tp%d"):format(p))
      end
    end
    if want("latency") then
      B.say("latency: " .. o.latency .. " requests")
      R.latency = B.phase_latency(o)
    end
    if want("api") then
      B.say("api: create+approve over HTTP at 1 and 8 clients, GET p99, the same without HTTP")
      R.api = B.phase_api(o)
    end
    if want("growth") then
      B.say(("growth: cloning finished requests up to %d"):format(o.growth))
      local have = B.seed_finished(o.growth)
      local g = B.throughput(o, "growth 2p", 2, "gr")
      g.finished_before = have
      R.growth = g
    end
  end)
  B.stop_all()
  B.stop_receiver()
  if not ok then
    B.failures[#B.failures + 1] = "bench aborted: " .. tostring(type(err) == "table" and (err.message or cjson.encode(err)) or err)
  end
  if R.raw and R.throughput then
    local raw8 = R.raw.tps["8"]
    for _, t in ipairs(R.throughput) do
      if t.processes == 2 and raw8 then R.ratios.throughput2_vs_raw8 = t.nodes_per_s / raw8 end
      if t.processes == 1 and raw8 then R.ratios.throughput1_vs_raw8 = t.nodes_per_s / raw8 end
    end
  end
  if R.growth and R.throughput then
    for _, t in ipairs(R.throughput) do
      if t.processes == 2 then
        R.ratios.growth_vs_empty = R.growth.nodes_per_s / t.nodes_per_s
        if R.growth.ratio_vs_raw8 and t.ratio_vs_raw8 then
          R.ratios.growth_ratio_vs_empty_ratio = R.growth.ratio_vs_raw8 / t.ratio_vs_raw8
        end
      end
    end
  end
  B.print_table(R)
  if o.json then
    common.write(o.json, cjson.encode(R) .. "\n")
    B.say("JSON written to " .. o.json)
  end
  B.sh("rm -rf " .. common.quote(B.dir))
  return #B.failures == 0 and 0 or 1
end

return B.main(arg or { ... })
