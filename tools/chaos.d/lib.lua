-- tools/chaos.d/lib.lua -- what every chaos scenario shares: daemons and
-- receivers started and stopped by pid, database access that survives a
-- PostgreSQL restart, the workload (variants of the shipped templates with
-- sim outcomes, and the state each request must end in), and the checks on
-- the rows, the sim ledger and the receivers' records.
--
-- Runs inside `qtgd exec` (tools/chaos.d/run.lua, which puts the tree on
-- package.path), so it uses the real bindings; shell quoting, files,
-- processes and receivers are spec/lua/support/common.lua's.  Environment
-- (set by tools/chaos): MG_DATABASE_URL, MG_NETWORK_CLASS, QTG_BIN,
-- QTG_ROOT, QTG_CHAOS_WORK (this scenario's directory), QTG_CHAOS_CI=1 for
-- the short form, QTG_PG_DIR (the cluster, for restarts).
local qtg = require "qtg"
local cjson = require "cjson"
local templates = require "qtg.templates"
local requests = require "qtg.requests"
local common = require "spec.lua.support.common"

local M = {}

M.root = common.root()
M.bin = os.getenv("QTG_BIN") or (M.root .. "/build/qtgd")
M.work = assert(os.getenv("QTG_CHAOS_WORK"), "QTG_CHAOS_WORK is not set (run tools/chaos)")
M.ci = os.getenv("QTG_CHAOS_CI") == "1"
M.pg_dir = os.getenv("QTG_PG_DIR")
M.ACTOR = "console:chaos"
M.INITIATOR = "console:chaos-initiator" -- four eyes: never the approver
M.failures = {}
M.started = {}      -- every process started here (common.spawn handles)

M.sh, M.read, M.write, M.exists = common.sh, common.read, common.write, common.exists

function M.log(fmt, ...)
  io.stdout:write(os.date("!%H:%M:%S "), string.format(fmt, ...), "\n")
  io.stdout:flush()
end

function M.fail(fmt, ...)
  local msg = string.format(fmt, ...)
  M.failures[#M.failures + 1] = msg
  M.log("FAIL: %s", msg)
end

-- A deterministic generator for the workload (seed: QTG_CHAOS_SEED).
local seed = tonumber(os.getenv("QTG_CHAOS_SEED") or "") or 20261130
function M.random(a, b)
  seed = (seed * 1103515245 + 12345) % 2147483648
  return a + math.floor(seed / 2147483648 * (b - a + 1))
end

-- ------------------------------------------------------------ database
-- One session of the driver's own, re-acquired after a lost connection;
-- every call retries connection failures for up to `patience` seconds.
local sess
local function session()
  if not sess then sess = qtg.db.acquire() end
  return sess
end

local function drop_session()
  if sess then pcall(sess.release, sess) end
  sess = nil
end

local function is_connection_error(e)
  return type(e) == "table" and (e.kind == "connection" or (e.sqlstate and e.sqlstate:match("^08")))
    or (type(e) == "string" and (e:match("connection") or e:match("server closed")))
end

function M.with_retry(fn, patience)
  local deadline = qtg.monotonic() + (patience or 180)
  while true do
    local ok, a, b = pcall(function()
      local s = session()
      return fn(s)
    end)
    if ok then return a, b end
    if sess and sess:in_transaction() then pcall(sess.rollback, sess) end
    if not is_connection_error(a) and not (type(a) == "table" and a.kind == "sql" and
        (a.sqlstate == "57P01" or a.sqlstate == "57P03")) then
      error(a, 0)
    end
    drop_session()
    if qtg.monotonic() > deadline then error(a, 0) end
    qtg.sleep(0.5)
  end
end

function M.query(sql, ...)
  local args = { n = select("#", ...), ... }
  return M.with_retry(function(s) return s:query(sql, unpack(args, 1, args.n)) end)
end

function M.scalar(sql, ...)
  local row = M.query(sql, ...)[1]
  if not row then return nil end
  local _, v = next(row)
  return v
end

function M.release()
  drop_session()
end

-- ------------------------------------------------------------ processes
-- start(name, env, cmd) -> h: common.spawn of the shell command cmd as
-- <work>/<name>.<n> (its .log, .pid and .rc: tools/chaos stops by those
-- pid files whatever happens here).
local counters = {}
function M.start(name, env, cmd)
  counters[name] = (counters[name] or 0) + 1
  local h = common.spawn(string.format("%s/%s.%d", M.work, name, counters[name]), env, cmd)
  h.name, h.n = name, counters[name]
  M.started[#M.started + 1] = h
  return h
end

M.rc, M.alive, M.signal, M.wait_exit = common.rc, common.alive, common.signal, common.exit_code

-- Kill every process started here that is still running (by pid).
function M.stop_all(sig)
  for _, h in ipairs(M.started) do M.signal(h, sig or "KILL") end
  for _, h in ipairs(M.started) do M.wait_exit(h, 10) end
end

-- ------------------------------------------------------------ daemons
M.key_file = M.work .. "/callback.key"
M.tokens = M.work .. "/tokens"
os.execute("mkdir -p " .. common.quote(M.tokens))
if not M.exists(M.key_file) then
  M.write(M.key_file, qtg.crypto.hex(qtg.crypto.random_bytes(32)) .. "\n", "600")
end

function M.daemon_env(extra)
  local env = {
    MG_DATABASE_URL = os.getenv("MG_DATABASE_URL"),
    MG_NETWORK_CLASS = qtg.settings.network_class,
    QTG_ROOT = M.root,
    MG_CONSOLE_ENABLED = "false",
    MG_LOG_LEVEL = "info",
    MG_LUA_PATH = M.root .. "/tools/chaos.d/override",
    MG_CALLBACK_KEY_FILE = M.key_file,
    MG_CALLBACK_KEY_ID = "k1",
    MG_NODE_DISPATCH_INTERVAL_SECONDS = "0.5",
    MG_NODE_OBSERVE_INTERVAL_SECONDS = "0.5",
    MG_NODE_RECOVERY_INTERVAL_SECONDS = "1",
    MG_CALLBACK_DISPATCH_INTERVAL_SECONDS = "0.5",
    MG_CALLBACK_TIMEOUT_SECONDS = "5",
    MG_SHUTDOWN_GRACE_SECONDS = "10",
    MG_APPROVAL_TTL_SECONDS = "86400",
    MG_DB_POOL_SIZE = "6",
    MG_EVM_NONCE_REAPER_ENABLED = "false",
    MG_CCIP_STRANDED_REAPER_ENABLED = "false",
    MG_BALANCE_HISTORY_ENABLED = "false",
    QTG_CHAOS_TOKENS = M.tokens,
  }
  for k, v in pairs(extra or {}) do env[k] = v end
  return env
end

M.daemons = {}

-- Callback rows one process can have in flight (POSTed, not yet committed):
-- what a kill or a cut connection can make a receiver get twice.
function M.callbacks_in_flight()
  local cbd = require "qtg.workers.callback_dispatcher"
  return cbd.lanes(tonumber(M.daemon_env().MG_DB_POOL_SIZE)) * cbd.BATCH
end

function M.start_daemon(i, extra)
  local h = M.start("qtgd" .. i, M.daemon_env(extra), common.quote(M.bin) .. " run")
  h.index = i
  M.daemons[i] = h
  return h
end

function M.start_daemons(n, extra)
  for i = 1, n do M.start_daemon(i, extra) end
end

-- Restart each daemon that is no longer running; returns how many.
function M.restart_dead(extra)
  local n = 0
  for i, h in pairs(M.daemons) do
    if not M.alive(h) then
      M.start_daemon(i, extra)
      n = n + 1
    end
  end
  return n
end

-- SIGTERM every daemon; returns {index = {rc, seconds}}.
function M.stop_daemons(timeout)
  local t0 = qtg.monotonic()
  for _, h in pairs(M.daemons) do M.signal(h, "TERM") end
  local out = {}
  for i, h in pairs(M.daemons) do
    local rc = M.wait_exit(h, timeout or 30)
    out[i] = { rc = rc, seconds = qtg.monotonic() - t0 }
    if rc == nil then M.signal(h, "KILL") end
  end
  return out
end

-- stop_daemons_cleanly(): stop_daemons(30), and a failure for each daemon
-- whose SIGTERM did not end in exit code 0.
function M.stop_daemons_cleanly()
  for i, s in pairs(M.stop_daemons(30)) do
    if s.rc ~= 0 then M.fail("qtgd%d: SIGTERM gave exit code %s", i, tostring(s.rc)) end
  end
end

-- ------------------------------------------------------------ receivers
-- A tools/fake-receiver on 127.0.0.1 in MODE, verifying signatures
-- (common.start_receiver: <work>/<name>.log, .jsonl, ...); opts.args: a
-- list of further arguments.
function M.start_receiver(name, mode, opts)
  local h = common.start_receiver(M.work, name, { mode = mode, keys = { k1 = M.key_file },
                                                  args = opts and opts.args })
  M.started[#M.started + 1] = h
  return h
end

-- The receiver's record: array of entries (seq, headers, body_sha256, verdict).
function M.records(h) return common.records(h.record) end

-- ------------------------------------------------------------ workload
-- Variants of the shipped templates.  Each row: template, variant, a
-- function that edits the decoded template, and the state every request of
-- it must end in.  Chosen so that the expected state does not depend on
-- timing (a failure only where no other branch can be in flight).
local function sim_of(doc, key)
  for _, n in ipairs(doc.nodes) do
    if n.key == key then
      n.config = n.config or {}
      n.config.sim = n.config.sim or {}
      return n.config.sim
    end
  end
  error("no node " .. key)
end

M.SHIPPED = {
  cex_withdrawal_to_wallet = { first = "withdraw", last = "destination_finality" },
  cctp_bridge = { first = "burn", last = "mint_status" },
  dual_venue_funding = { join = "destination_receive" },
  otc_settlement_manual = { first = "withdraw", manual = "desk_confirmation" },
}

M.VARIANTS = {
  { name = "ok", weight = 40, expect = "COMPLETED", edit = function() end },
  { name = "fail_submit", weight = 10, expect = "FAILED", only = "first",
    edit = function(doc, t) sim_of(doc, t.first).fail = "submit" end },
  { name = "fail_late", weight = 10, expect = "MANUAL_INTERVENTION",
    edit = function(doc, t) sim_of(doc, t.last or t.join or "withdrawal_status").fail = "observe" end },
  { name = "unknown_submit", weight = 15, expect = "COMPLETED", only = "first",
    edit = function(doc, t) sim_of(doc, t.first).unknown = "submit" end },
  { name = "unknown_observe", weight = 15, expect = "COMPLETED", only = "first",
    edit = function(doc, t) sim_of(doc, t.first).unknown_at_observe = 1 end },
  { name = "retry_after", weight = 10, expect = "COMPLETED",
    edit = function(doc, t)
      local s = sim_of(doc, t.first or "primary_withdraw")
      s.retry_after_seconds, s.observes = 2, 2
    end },
}

local INTENT_VALUES = {
  asset = "USDC", amount = "1250.50", venue = "binance", destination = "0x" .. string.rep("ab", 20),
  destination_chain = "base", source_chain = "ethereum", primary_venue = "binance",
  secondary_venue = "okx", counterparty = "desk-7",
}

M.kinds = {}   -- every (template, variant) loaded: {key, template, variant, expect, intent}

-- Load every variant as its own template (chaos_<template>__<variant>).
-- The destination is booked first, as the shipped templates' allow-lists
-- need (docs/approvals.md, "risk_controls"): under desk-7's name, the
-- OTC settlement's counterparty.
function M.load_workload()
  local book = require "spec.lua.support.book"
  for _, asset in ipairs({ "USDC", "USDT" }) do
    M.with_retry(function(s)
      book.ensure(s, { asset = asset, chain = INTENT_VALUES.destination_chain,
                       address = INTENT_VALUES.destination, label = INTENT_VALUES.counterparty })
    end)
  end
  for template, t in pairs(M.SHIPPED) do
    local text = assert(M.read(M.root .. "/templates/" .. template .. ".json"))
    for _, v in ipairs(M.VARIANTS) do
      if not (v.only == "first" and not t.first) then
        local doc = cjson.decode(text)
        doc.template_key = "chaos_" .. template .. "__" .. v.name
        doc.name = doc.name .. " (chaos: " .. v.name .. ")"
        v.edit(doc, t)
        local c, errs = templates.validate_and_compile(doc, "chaos:" .. doc.template_key)
        assert(c, errs and table.concat(errs, "\n"))
        M.with_retry(function(s)
          s:begin()
          templates.store(s, c)
          s:commit()
        end)
        local intent = {}
        for _, f in ipairs(doc.intent.required) do intent[f] = INTENT_VALUES[f] or "x" end
        local expect = v.expect
        if t.manual and expect == "COMPLETED" then expect = "WAITING_MANUAL_ACTION" end
        M.kinds[#M.kinds + 1] = { key = doc.template_key, template = template, variant = v.name,
                                  expect = expect, intent = intent, weight = v.weight,
                                  manual = t.manual }
      end
    end
  end
  table.sort(M.kinds, function(a, b) return a.key < b.key end)
  M.total_weight = 0
  for _, k in ipairs(M.kinds) do M.total_weight = M.total_weight + k.weight end
end

function M.pick_kind()
  local r = M.random(1, M.total_weight)
  for _, k in ipairs(M.kinds) do
    r = r - k.weight
    if r <= 0 then return k end
  end
  return M.kinds[#M.kinds]
end

M.created = {}      -- idempotency key -> {id, kind, expect}
M.order = {}

-- Create and approve request i (idempotent: the key is fixed, so a retry
-- after a lost connection finds the first one).
function M.create_request(i, callback_url, kind)
  kind = kind or M.pick_kind()
  local key = string.format("chaos-%06d", i)
  local id = M.with_retry(function(s)
    local req = requests.create(s, { template_key = kind.key, intent = kind.intent,
                                     idempotency_key = key, callback_url = callback_url }, M.INITIATOR)
    if req.request_state == "PENDING_APPROVAL" then
      req = requests.approve(s, req.id, M.ACTOR)
    end
    return req.id
  end)
  local rec = { id = id, key = key, kind = kind, expect = kind.expect, callback_url = callback_url }
  M.created[key] = rec
  M.order[#M.order + 1] = rec
  return rec
end

-- Operators complete every other WAITING_MANUAL_ACTION manual step.
function M.operate_manual_steps()
  local rows = M.query([[
    SELECT r.id, r.idempotency_key, n.id AS node_id FROM movement_requests r
      JOIN movement_request_nodes n ON n.request_id = r.id
     WHERE r.request_state = 'WAITING_MANUAL_ACTION' AND n.node_state = 'READY'
       AND n.action_type LIKE 'manual\_%' AND r.network_class = $1]], qtg.settings.network_class)
  local n = 0
  for _, row in ipairs(rows) do
    local rec = M.created[row.idempotency_key]
    local num = tonumber(row.idempotency_key:match("(%d+)$")) or 0
    if rec and num % 2 == 0 then
      M.with_retry(function(s)
        local ok, err = pcall(requests.complete_manual_step, s, row.node_id, M.ACTOR,
          { desk_reference = "chaos-" .. num })
        if not ok and not (type(err) == "table" and err.kind == "illegal_transition") then error(err, 0) end
      end)
      rec.expect = "COMPLETED"
      n = n + 1
    end
  end
  return n
end

-- Requests not (yet) in the state they must end in.
function M.pending()
  local states = {}
  for _, r in ipairs(M.query("SELECT idempotency_key, request_state FROM movement_requests WHERE network_class = $1",
      qtg.settings.network_class)) do
    states[r.idempotency_key] = r.request_state
  end
  local n, by = 0, {}
  for _, rec in ipairs(M.order) do
    local st = states[rec.key]
    if st ~= rec.expect then
      n = n + 1
      local k = rec.kind.variant .. ":" .. tostring(st) .. "->" .. rec.expect
      by[k] = (by[k] or 0) + 1
    end
  end
  return n, by
end

function M.callbacks_pending()
  return M.scalar([[SELECT count(*)::int FROM movement_callback_outbox c
                     JOIN movement_requests r ON r.id = c.request_id
                    WHERE c.status = 'pending' AND r.network_class = $1]], qtg.settings.network_class)
end

-- ------------------------------------------------------------ outages
-- pids_of_daemons() -> {index = pid}: what carried_on compares against.
function M.pids_of_daemons()
  local pids = {}
  for i, h in pairs(M.daemons) do pids[i] = h.pid end
  return pids
end

-- wait_progress(what, seconds) -> the seconds from now to the first node
-- change committed after now (tenths); -1 and a failure when none comes in
-- time.  M.scalar retries a lost connection, so this also waits for the
-- database to be back.
function M.wait_progress(what, seconds)
  local t1 = qtg.monotonic()
  local mark = M.scalar("SELECT now()")
  local moved = common.poll(function()
    return M.scalar([[SELECT count(*)::int FROM movement_request_nodes
                       WHERE updated_at > $1::timestamptz]], mark) > 0
  end, seconds, 0.25)
  if moved then return math.floor((qtg.monotonic() - t1) * 10 + 0.5) / 10 end
  M.fail("no progress within %d s after %s", seconds, what)
  return -1
end

-- carried_on(pids): every daemon still runs with the pid it started with
-- (an outage must not have made any of them exit).
function M.carried_on(pids)
  for i, h in pairs(M.daemons) do
    if not M.alive(h) or h.pid ~= pids[i] then
      M.fail("qtgd%d did not carry on (rc %s)", i, tostring(M.rc(h)))
    end
  end
end

-- drain_audit(seconds): wait until the audit outbox is promoted.
function M.drain_audit(seconds)
  return common.poll(function()
    return M.scalar("SELECT count(*)::int FROM audit_outbox") == 0
  end, seconds or 30, 1) or false
end

-- Wait until every request is where it must be (operating manual steps on
-- the way) and every callback row is out of `pending`; progress every 10 s.
function M.settle(deadline_seconds, tick)
  local last = 0
  return common.poll(function()
    if tick then tick() end
    M.operate_manual_steps()
    local n, by = M.pending()
    local cb = M.callbacks_pending()
    if n == 0 and cb == 0 then return true end
    if qtg.monotonic() - last > 10 then
      local parts = {}
      for k, v in pairs(by) do parts[#parts + 1] = k .. "=" .. v end
      table.sort(parts)
      M.log("settling: %d requests not yet final (%s), %d callbacks pending", n,
        table.concat(parts, " "):sub(1, 300), cb)
      last = qtg.monotonic()
    end
  end, deadline_seconds, 1) or false
end

-- ------------------------------------------------------------ checks
-- The end-of-scenario checks.  Returns a table of numbers for the results
-- table; every violation is also recorded with M.fail.
function M.check(opts)
  opts = opts or {}
  local class = qtg.settings.network_class
  local r = {}

  -- 1. requests: every one created exists once, in the state it must be in
  local rows = M.query([[SELECT id, idempotency_key, request_state FROM movement_requests
                          WHERE network_class = $1]], class)
  local by_key = {}
  for _, row in ipairs(rows) do by_key[row.idempotency_key] = row end
  r.requests = #M.order
  r.lost, r.wrong_state = 0, 0
  local wrong = {}
  for _, rec in ipairs(M.order) do
    local row = by_key[rec.key]
    if not row or row.id ~= rec.id then
      r.lost = r.lost + 1
    elseif row.request_state ~= rec.expect then
      r.wrong_state = r.wrong_state + 1
      wrong[#wrong + 1] = rec.key .. " " .. rec.kind.key .. " " .. row.request_state .. " (want " .. rec.expect .. ")"
    end
  end
  if #rows ~= #M.order then M.fail("%d requests in the database, %d created", #rows, #M.order) end
  if r.lost > 0 then M.fail("%d requests lost", r.lost) end
  if r.wrong_state > 0 then
    M.fail("%d requests not in the state they must end in: %s", r.wrong_state,
      table.concat(wrong, "; "):sub(1, 1500))
  end

  -- 2. the nodes justify each request's state
  local bad = M.query([[
    SELECT r.idempotency_key, r.request_state,
           string_agg(n.node_key || '=' || n.node_state || CASE WHEN n.side_effect THEN '*' ELSE '' END, ',' ORDER BY n.node_key) AS nodes
      FROM movement_requests r JOIN movement_request_nodes n ON n.request_id = r.id
     WHERE r.network_class = $1
     GROUP BY r.id
    HAVING NOT CASE r.request_state
      WHEN 'COMPLETED' THEN bool_and(n.node_state IN ('COMPLETED', 'SKIPPED'))
      WHEN 'FAILED' THEN bool_or(n.node_state = 'FAILED')
                     AND NOT bool_or(n.node_state = 'COMPLETED' AND n.side_effect)
                     AND NOT bool_or(n.node_state IN ('SUBMITTING', 'SUBMITTED', 'OBSERVING'))
      WHEN 'MANUAL_INTERVENTION' THEN bool_or(n.node_state IN ('FAILED', 'UNKNOWN'))
                     AND bool_or(n.node_state = 'COMPLETED' AND n.side_effect)
                     AND NOT bool_or(n.node_state IN ('SUBMITTING', 'SUBMITTED', 'OBSERVING'))
      WHEN 'WAITING_MANUAL_ACTION' THEN bool_or(n.node_state = 'READY' AND n.action_type LIKE 'manual\_%')
                     AND NOT bool_or(n.node_state IN ('SUBMITTING', 'SUBMITTED', 'OBSERVING'))
      ELSE false END
     LIMIT 20]], class)
  r.unjustified = #bad
  for _, b in ipairs(bad) do
    M.fail("request %s is %s but its nodes are %s", b.idempotency_key, b.request_state, b.nodes)
  end

  -- 3. side effects: one ledger row per (node, attempt), under the key of
  -- that attempt; every node past submit has its row; no second attempt
  local dup = M.query([[SELECT request_node_id, attempt_no, count(*)::int AS n FROM sim_ledger
                         GROUP BY 1, 2 HAVING count(*) > 1]])
  r.duplicated = #dup
  if #dup > 0 then M.fail("%d (node, attempt) pairs have more than one ledger row", #dup) end
  local wrong_key = M.scalar([[SELECT count(*)::int FROM sim_ledger l
      WHERE l.idempotency_key <> 'qtg:' || l.request_node_id || ':' || l.attempt_no]])
  if wrong_key > 0 then M.fail("%d ledger rows under a key that is not their attempt's", wrong_key) end
  local missing = M.query([[
    SELECT n.id, n.node_key, n.node_state FROM movement_request_nodes n
      JOIN movement_requests r ON r.id = n.request_id
     WHERE r.network_class = $1 AND n.executor = 'sim'
       AND n.node_state IN ('SUBMITTED', 'OBSERVING', 'COMPLETED', 'UNKNOWN')
       AND NOT EXISTS (SELECT 1 FROM sim_ledger l WHERE l.request_node_id = n.id
                          AND l.attempt_no = n.attempt_no)]], class)
  r.effects_lost = #missing
  if #missing > 0 then M.fail("%d nodes past submit without their ledger row", #missing) end
  local orphan = M.scalar([[SELECT count(*)::int FROM sim_ledger l
      LEFT JOIN movement_request_nodes n ON n.id = l.request_node_id
     WHERE n.id IS NULL OR l.attempt_no <> n.attempt_no]])
  if orphan > 0 then M.fail("%d ledger rows of an attempt the node does not have", orphan) end
  r.second_attempts = M.scalar([[SELECT count(*)::int FROM movement_request_nodes WHERE attempt_no > 1]])
  if r.second_attempts > 0 then M.fail("%d nodes on a second attempt (nothing here retries)", r.second_attempts) end
  local ledger = M.query([[SELECT count(*)::int AS rows, coalesce(sum(submit_count - 1), 0)::int AS resubmits,
                                   count(*) FILTER (WHERE side_effect)::int AS effects FROM sim_ledger]])[1]
  r.ledger_rows, r.resubmits_absorbed, r.side_effects = ledger.rows, ledger.resubmits, ledger.effects
  if opts.max_resubmits and r.resubmits_absorbed > opts.max_resubmits then
    M.fail("%d resubmissions, at most %d expected", r.resubmits_absorbed, opts.max_resubmits)
  end

  -- 4. callbacks: numbered 1..n per request, every row delivered (or dlq
  -- where the scenario expects it), every delivered nonce received
  local gaps = M.scalar([[
    SELECT count(*)::int FROM (
      SELECT request_id, count(*) AS n, max((payload::jsonb ->> 'sequence')::int) AS top,
             count(DISTINCT (payload::jsonb ->> 'sequence')) AS distinct_seq
        FROM movement_callback_outbox WHERE redelivery_of IS NULL GROUP BY request_id) x
     WHERE n <> top OR distinct_seq <> n]])
  if gaps > 0 then M.fail("%d requests whose callback sequence has a gap or a repeat", gaps) end
  local outbox = M.query([[
    SELECT c.callback_nonce, c.status, c.callback_url, c.attempts, c.max_attempts
      FROM movement_callback_outbox c JOIN movement_requests r ON r.id = c.request_id
     WHERE r.network_class = $1]], class)
  r.callbacks = #outbox
  r.callbacks_lost, r.callbacks_duplicated = 0, 0
  local received = {}
  for _, rh in ipairs(opts.receivers or {}) do
    for _, e in ipairs(M.records(rh)) do
      local nonce = common.header(e, "X-QTG-Callback-Nonce")
      if nonce then
        local seen = received[nonce]
        if seen then
          seen.n = seen.n + 1
          if seen.sha ~= e.body_sha256 then M.fail("nonce %s received with two different bodies", nonce) end
        else
          received[nonce] = { n = 1, sha = e.body_sha256, ok = e.verdict and e.verdict.ok }
        end
        if e.verdict and not e.verdict.ok and e.verdict.reason ~= "replayed_nonce" then
          M.fail("receiver refused a callback: %s", tostring(e.verdict.reason))
        end
      end
    end
  end
  local undelivered = 0
  for _, c in ipairs(outbox) do
    local must = not opts.dlq_ok or not opts.dlq_ok(c)
    if must then
      if c.status ~= "delivered" then undelivered = undelivered + 1 end
      if not received[c.callback_nonce] then r.callbacks_lost = r.callbacks_lost + 1 end
    end
    local rec = received[c.callback_nonce]
    if rec and rec.n > 1 then r.callbacks_duplicated = r.callbacks_duplicated + (rec.n - 1) end
  end
  if undelivered > 0 then M.fail("%d callback rows not delivered", undelivered) end
  if r.callbacks_lost > 0 then M.fail("%d callbacks never reached their receiver", r.callbacks_lost) end
  if opts.max_callback_dups and r.callbacks_duplicated > opts.max_callback_dups then
    M.fail("%d callbacks received twice, at most %d expected", r.callbacks_duplicated, opts.max_callback_dups)
  end

  -- 5. audit
  M.check_audit(r)
  return r
end

-- check_audit(r): everything promoted, in order, once; the chain holds, and
-- every state change of a node or a request, through every kill, has its
-- row (qtgd audit verify's checks).
function M.check_audit(r)
  r.audit_pending = M.scalar("SELECT count(*)::int FROM audit_outbox")
  if r.audit_pending > 0 then M.fail("%d audit rows never promoted", r.audit_pending) end
  r.audit_events = M.scalar("SELECT count(*)::int FROM audit_events")
  local audit = require "qtg.audit"
  local chain = M.with_retry(function(s) return audit.verify(s) end)
  if not chain.ok then M.fail("the audit chain is broken: %s", chain.broken.meaning) end
  local states = M.with_retry(function(s) return require("qtg.audit_states").check_states(s, 5) end)
  r.audit_unaudited_states = states.count
  if not states.ok then
    local m = states.mismatches[1]
    M.fail("%d nodes or requests changed without their audit row (first: %s %s is %s, audited %s%s)",
      states.count, m.kind, m.id, m.state, tostring(m.audited),
      m.gap and (", a change from " .. tostring(m.gap.before) .. " to " .. tostring(m.gap.from_state)
        .. " without its row") or "")
  end
  return r
end

-- After every daemon stopped: no session, transaction or lock of theirs.
function M.check_nothing_left(what)
  local others, locks, open_tx
  if common.poll(function()
    local row = M.query([[
      SELECT (SELECT count(*) FROM pg_stat_activity
               WHERE datname = current_database() AND pid <> pg_backend_pid()
                 AND backend_type = 'client backend')::int AS others,
             (SELECT count(*) FROM pg_stat_activity
               WHERE datname = current_database() AND pid <> pg_backend_pid()
                 AND xact_start IS NOT NULL)::int AS open_tx,
             (SELECT count(*) FROM pg_locks l
               WHERE l.pid <> pg_backend_pid() AND l.locktype IN ('relation', 'tuple', 'transactionid', 'advisory')
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))::int AS locks]])[1]
    others, locks, open_tx = row.others, row.locks, row.open_tx
    return others == 0 and locks == 0 and open_tx == 0
  end, 15, 0.25) then
    return 0
  end
  M.fail("%s: %d sessions, %d open transactions, %d locks left behind", what, others, open_tx, locks)
  return others + locks + open_tx
end

-- Transactions open at this moment in other sessions, and for how long.
function M.open_transactions()
  return M.query([[SELECT pid, state, extract(epoch FROM now() - xact_start)::float8 AS age
                     FROM pg_stat_activity WHERE datname = current_database()
                      AND pid <> pg_backend_pid() AND xact_start IS NOT NULL]])
end

-- The result line tools/chaos collects (and prints as a table).
function M.result(scenario, numbers, extra)
  local out = { scenario = scenario, pass = #M.failures == 0, failures = M.failures, ci = M.ci }
  for k, v in pairs(numbers or {}) do out[k] = v end
  for k, v in pairs(extra or {}) do out[k] = v end
  M.write(M.work .. "/result.json", cjson.encode(out) .. "\n")
  io.stdout:write("RESULT ", cjson.encode(out), "\n")
  io.stdout:flush()
  return out.pass and 0 or 1
end

return M
