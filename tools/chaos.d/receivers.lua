-- Scenario "receivers": callback receivers that answer 500, hang, trickle
-- bytes, close mid-response, or answer huge bodies (8 MiB, once with 200
-- and once with 503), next to a healthy one, while 4 processes work.  The
-- rows of the faulty receivers follow the retry schedule (attempt k waits
-- 2^min(k,6) s) to dlq after MG_CALLBACK_MAX_ATTEMPTS (3 here); the healthy
-- receiver's rows (and the huge 200's) are delivered, at their pace; the
-- engine's own work completes on time; and no process's loop is blocked:
-- every process's heartbeats stay fresh throughout.
local qtg = require "qtg"
local M = {}

function M.run(lib)
  local N = lib.ci and 80 or 400
  local t0 = qtg.monotonic()
  lib.load_workload()
  local rx = {
    ok = lib.start_receiver("ok", "ok"),
    ["500"] = lib.start_receiver("r500", "500"),
    hang = lib.start_receiver("hang", "hang", { args = { "--hang-seconds", "60" } }),
    trickle = lib.start_receiver("trickle", "slow", { args = { "--trickle-interval", "0.5" } }),
    close = lib.start_receiver("close", "close"),
    huge200 = lib.start_receiver("huge200", "huge", { args = { "--huge-bytes", "8388608" } }),
    huge503 = lib.start_receiver("huge503", "huge", { args = { "--huge-bytes", "8388608", "--status", "503" } }),
  }
  local order = { "ok", "500", "ok", "hang", "ok", "trickle", "ok", "close", "huge200", "huge503" }
  local faulty = { ["500"] = true, hang = true, trickle = true, close = true, huge503 = true }
  local url_kind = {}
  for name, h in pairs(rx) do url_kind[h.url] = name end
  local max_attempts, timeout = 3, 2
  lib.start_daemons(4, { MG_CALLBACK_MAX_ATTEMPTS = tostring(max_attempts),
                         MG_CALLBACK_TIMEOUT_SECONDS = tostring(timeout) })
  lib.log("receivers: 4 processes, %d requests over %d receivers", N, #order)
  local stale_samples, samples = 0, 0
  local function watch()
    -- every process's liveness is flushed every 5 s by its audit promoter;
    -- a blocked loop would let it go stale
    local rows = lib.query([[SELECT process_id, extract(epoch FROM now() - max(updated_at))::float8 AS age
                               FROM worker_heartbeats WHERE network_class = $1 GROUP BY 1]],
      qtg.settings.network_class)
    samples = samples + 1
    for _, row in ipairs(rows) do
      local alive = false
      for _, h in pairs(lib.daemons) do
        if row.process_id:match(":" .. h.pid .. "$") then alive = true end
      end
      if alive and row.age > 20 then
        stale_samples = stale_samples + 1
        lib.fail("heartbeats of %s are %.1f s old: its loop is blocked", row.process_id, row.age)
      end
    end
  end
  -- A steady stream, not a burst: the callback dispatchers' capacity is
  -- 4 processes x 4 lanes, and a lane on a hanging receiver is held for the
  -- timeout, so faulty receivers take much of it; above that rate the
  -- backlog grows without bound (docs/reliability.md, "Findings": before
  -- the lanes of one receiver each, a pass of the 5 oldest rows lasted as
  -- long as its slowest POST, whoever's rows the others were).
  -- QTG_CHAOS_RX_PACE=0 creates them in a burst (the form that found the
  -- head-of-line blocking; docs/reliability.md).
  local pace = tonumber(os.getenv("QTG_CHAOS_RX_PACE") or "") or (lib.ci and 0.4 or 0.8)
  for i = 1, N do
    lib.create_request(i, rx[order[(i - 1) % #order + 1]].url)
    if i % 10 == 0 then watch() end
    qtg.sleep(pace)
  end
  local last_watch = qtg.monotonic()
  if not lib.settle(lib.ci and 300 or 900, function()
    if qtg.monotonic() - last_watch > 5 then watch(); last_watch = qtg.monotonic() end
  end) then
    lib.fail("not settled before the deadline")
  end
  lib.drain_audit(30)
  local r = lib.check{
    receivers = { rx.ok, rx.huge200 }, max_resubmits = 0,
    dlq_ok = function(c) return faulty[url_kind[c.callback_url]] end,
  }
  -- the faulty receivers' rows: dlq after max_attempts, on schedule
  -- (max_attempts is each row's own, stored when it was written: the
  -- driver's rows have the default 5, the daemons' rows 3)
  local rows = lib.query([[SELECT id, callback_url, status, attempts, max_attempts FROM movement_callback_outbox]])
  local dlq, off_schedule, delivered_faulty = 0, 0, 0
  for _, c in ipairs(rows) do
    local kind = url_kind[c.callback_url]
    if faulty[kind] then
      if c.status == "dlq" and c.attempts == c.max_attempts then dlq = dlq + 1
      else delivered_faulty = delivered_faulty + 1 end
    end
  end
  local att = lib.query([[
    SELECT a.outbox_id, a.attempt_no, extract(epoch FROM a.attempted_at)::float8 AS at,
           extract(epoch FROM a.next_attempt_at)::float8 AS next, a.outcome, a.duration_ms,
           c.callback_url
      FROM movement_callback_attempts a JOIN movement_callback_outbox c ON c.id = a.outbox_id
     ORDER BY a.outbox_id, a.attempt_no]])
  local prev = {}
  local hang_ms = {}
  for _, a in ipairs(att) do
    local kind = url_kind[a.callback_url]
    if faulty[kind] then
      if a.outcome == "retry" then
        local want = 2 ^ math.min(a.attempt_no, 6)
        if math.abs((a.next - a.at) - want) > 0.5 then off_schedule = off_schedule + 1 end
      end
      local p = prev[a.outbox_id]
      if p and a.at < p.next - 0.05 then off_schedule = off_schedule + 1 end
      prev[a.outbox_id] = a
      if kind == "hang" or kind == "trickle" then hang_ms[#hang_ms + 1] = a.duration_ms end
    end
  end
  if delivered_faulty > 0 then lib.fail("%d rows of faulty receivers not in dlq after their max_attempts", delivered_faulty) end
  if off_schedule > 0 then lib.fail("%d attempts off the retry schedule", off_schedule) end
  for _, ms in ipairs(hang_ms) do
    if ms > (timeout + 3) * 1000 then lib.fail("an attempt to a hanging receiver took %d ms (timeout %d s)", ms, timeout) break end
  end
  -- the healthy receiver's pace: time from the row's creation to delivery
  local pace = lib.query([[
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM delivered_at - created_at))::float8 AS p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM delivered_at - created_at))::float8 AS p95,
           max(extract(epoch FROM delivered_at - created_at))::float8 AS top
      FROM movement_callback_outbox WHERE callback_url = $1 AND status = 'delivered']], rx.ok.url)[1]
  if not pace.p95 then lib.fail("no delivery to the healthy receiver") end
  -- the callback dispatchers' pace: a process whose loop were blocked, or
  -- whose pass were stuck, would go longer than a pass can take (timeout +
  -- interval + 3 s) without a pass while plenty of rows were due and
  -- unclaimed.  Each attempt k of a row was due at the row's creation (k = 1)
  -- or at attempt k-1's next_attempt_at; it waited until it was made.
  local waits = lib.query([[
    SELECT extract(epoch FROM coalesce(lag(a.next_attempt_at) OVER (PARTITION BY a.outbox_id ORDER BY a.attempt_no),
                                       c.created_at))::float8 AS due,
           extract(epoch FROM a.attempted_at)::float8 - a.duration_ms / 1000.0 AS made
      FROM movement_callback_attempts a JOIN movement_callback_outbox c ON c.id = a.outbox_id]])
  local function backlog(t)
    local n = 0
    for _, w in ipairs(waits) do if w.due <= t and w.made > t then n = n + 1 end end
    return n
  end
  local gaps = lib.query([[
    WITH passes AS (SELECT DISTINCT process_id, attempted_at FROM movement_callback_attempts),
         g AS (SELECT process_id, extract(epoch FROM lag(attempted_at) OVER w)::float8 AS prev,
                      extract(epoch FROM attempted_at)::float8 AS at
                 FROM passes WINDOW w AS (PARTITION BY process_id ORDER BY attempted_at))
    SELECT process_id, prev, at FROM g WHERE prev IS NOT NULL ORDER BY process_id, at]])
  local allowed = timeout + 0.5 + 3
  local worst_gap, stalls, processes = 0, 0, {}
  for _, g in ipairs(gaps) do
    processes[g.process_id] = true
    local gap = g.at - g.prev
    if gap > allowed then
      -- more due rows than the 4 x 5 that can be in flight: some were free
      local b = backlog(g.prev + allowed)
      if b > 20 then
        stalls = stalls + 1
        if gap > worst_gap then worst_gap = gap end
        lib.fail("%s made no callback pass for %.1f s while %d rows were due", g.process_id, gap, b)
      end
    end
  end
  local nproc = 0
  for _ in pairs(processes) do nproc = nproc + 1 end
  gaps = { n = nproc }
  if gaps.n < 4 then lib.fail("only %d processes made callback passes", gaps.n) end
  lib.stop_daemons_cleanly()
  lib.check_nothing_left("after SIGTERM")
  r.processes = 4
  r.faults = #att - lib.scalar("SELECT count(*)::int FROM movement_callback_attempts WHERE outcome = 'delivered'")
  r.dlq_rows = dlq
  r.off_schedule = off_schedule
  r.heartbeat_samples, r.stale_samples = samples, stale_samples
  r.stalls = stalls
  r.ok_delivery_p50 = pace.p50 and math.floor(pace.p50 * 10 + 0.5) / 10
  r.ok_delivery_p95 = pace.p95 and math.floor(pace.p95 * 10 + 0.5) / 10
  r.seconds = math.floor(qtg.monotonic() - t0)
  return lib.result("receivers", r)
end

return M
