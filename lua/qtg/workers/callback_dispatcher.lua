-- qtg.workers.callback_dispatcher (spec section 4): POST due callbacks of
-- the outbox, signed (qtg.callbacks), and record what happened.
--
-- One pass runs lanes at once (up to 5, at most half the session pool),
-- each on its own session, started when a batch is full or slow; a lane
-- repeats:
--   1. claim a batch: the oldest pending row whose next_attempt_at is due,
--      of this process's network class, and up to BATCH - 1 more due rows
--      of the same receiver (callback_url), oldest first, FOR UPDATE OF the
--      outbox rows SKIP LOCKED;
--      (each row with its request's created_by, request_created_by: an API
--      client's URL is checked again, qtg.callbacks.from_api_client);
--   2. refuse unsent what can never be delivered (a payload that is not a
--      JSON object, an invalid URL, a malformed stamp): dlq with last_error;
--   3. POST the others concurrently, each bounded by
--      MG_CALLBACK_TIMEOUT_SECONDS;
--   4. write every outcome and one movement_callback_attempts row per POST
--      in one statement, and commit;
-- until nothing is due of a receiver not yet done in this pass (a receiver
-- whose batch came back short is done: rows queued for it later wake a
-- later pass, gathered so that batches are full), the pass has run for one
-- timeout (PASS_BUDGET: the pass then wakes the worker again), or the
-- process is stopping.  Why lanes of one receiver each, and not the
-- spec's one batch of the five oldest rows: that batch lasts as long as its
-- slowest POST, so a receiver that hangs held up every other receiver's
-- callbacks (tools/chaos receivers found healthy rows going stale that way,
-- docs/reliability.md).  Now a hanging receiver holds the lanes that carry
-- its own rows; the others keep delivering.  A batch of one receiver's rows
-- costs the statements of the spec's batch, so throughput is kept.
-- The row locks are held across the POSTs on purpose (the spec's pickup is
-- the locked SELECT, then the send): another process skips a row while it
-- is being delivered, so a fault-free callback is delivered once.  The hold
-- is bounded by the timeout.  If this process dies after a POST but before
-- the commit, the row is sent again later: delivery is at least once, and
-- the nonce is the receiver's idempotency key.
local qtg = require("qtg")
local callbacks = require("qtg.callbacks")
local heartbeats = require("qtg.heartbeats")

local M = {}

M.BATCH = 5          -- rows per lane batch, all to one receiver (the spec's 5)
M.MAX_LANES = 5      -- batches in flight at once per process
M.PASS_BUDGET = 1    -- lanes claim new rows for this many timeouts per pass
M.SLOW_BATCH_SECONDS = 0.25 -- a batch still sending after this starts another lane

-- The oldest due row decides the receiver; the batch is up to $2 due rows
-- of that receiver (the head included: its lock is this transaction's own),
-- oldest first.  A NULL callback_url batches with NULLs (refused unsent).
-- $3 (text[]) names receivers the head skips: those this pass is already
-- sending to and has not seen answer within SLOW_BATCH_SECONDS, and those
-- done for this pass ('' names the rows without a URL) (see tick).  The
-- skip-list is tested on coalesce(callback_url, ''), an expression without
-- statistics: on the column itself, with one receiver holding every row,
-- the planner estimated that no row passes and its generic plan read and
-- sorted every pending row instead of walking the index in order.
M.CLAIM_SQL = [[
WITH head AS (
  SELECT c.callback_url
    FROM movement_callback_outbox c
    JOIN movement_requests r ON r.id = c.request_id
   WHERE c.status = 'pending'
     AND c.next_attempt_at <= now()
     AND r.network_class = $1
     AND coalesce(c.callback_url, '') <> ALL ($3::text[])
   ORDER BY c.created_at ASC, c.id ASC
   LIMIT 1
   FOR UPDATE OF c SKIP LOCKED
)
SELECT c.*, r.created_by AS request_created_by
  FROM movement_callback_outbox c
  JOIN movement_requests r ON r.id = c.request_id
  JOIN head ON c.callback_url IS NOT DISTINCT FROM head.callback_url
 WHERE c.status = 'pending'
   AND c.next_attempt_at <= now()
   AND r.network_class = $1
 ORDER BY c.created_at ASC, c.id ASC
 LIMIT $2
 FOR UPDATE OF c SKIP LOCKED]]

-- Whether a row is due that nobody is sending, asked before a transaction
-- is opened (idle passes and a lane's last look: one statement).  Run on
-- its own, the statement's lock ends with it; SKIP LOCKED makes rows that
-- other lanes or processes are sending not count.  The ORDER BY is not for
-- the answer: it makes the (generic) plan walk the partial index of pending
-- rows instead of scanning the delivered history for a row that is not
-- there (without it, a probe took 3-6 ms at 3,000 delivered rows).
M.PROBE_SQL = [[
SELECT 1
  FROM movement_callback_outbox c
  JOIN movement_requests r ON r.id = c.request_id
 WHERE c.status = 'pending'
   AND c.next_attempt_at <= now()
   AND r.network_class = $1
 ORDER BY c.created_at ASC
 LIMIT 1
 FOR UPDATE OF c SKIP LOCKED]]

-- $1: the ids of the rows written (bigint[]); $2: array of {id, status,
-- attempts, backoff_seconds?, last_error?, last_status?, attempted,
-- outcome?, duration_ms?, stamp?} (qtg.callbacks send_batch's writes;
-- stamp: a first attempt's timestamp); $3: process id.  The rows are found
-- by `c.id = ANY ($1)`, an index condition on the primary key whatever the
-- planner guesses of the JSON's row count (joined to the JSON alone, the
-- generic plan hash-joined it against a sequential scan of the outbox).
M.WRITE_SQL = [[
WITH o AS (
  SELECT * FROM jsonb_to_recordset($2::jsonb) AS o(
    id bigint, status text, attempts int, backoff_seconds double precision,
    last_error text, last_status int, attempted boolean, outcome text, duration_ms int,
    stamp bigint)
), t AS (SELECT clock_timestamp() AS at),
upd AS (
  UPDATE movement_callback_outbox c
     SET status = o.status,
         callback_timestamp = coalesce(o.stamp, c.callback_timestamp),
         attempts = o.attempts,
         last_error = o.last_error,
         last_status = o.last_status,
         next_attempt_at = CASE WHEN o.backoff_seconds IS NULL THEN c.next_attempt_at
                                ELSE t.at + make_interval(secs => o.backoff_seconds) END,
         last_attempt_at = CASE WHEN o.attempted THEN t.at ELSE c.last_attempt_at END,
         delivered_at = CASE WHEN o.status = 'delivered' THEN t.at ELSE c.delivered_at END,
         updated_at = t.at
    FROM o, t
   WHERE c.id = ANY ($1::bigint[]) AND c.id = o.id
  RETURNING c.id, c.attempts, c.next_attempt_at, o.attempted, o.outcome, o.last_status,
            o.last_error, o.duration_ms, t.at
)
INSERT INTO movement_callback_attempts
  (outbox_id, attempt_no, attempted_at, outcome, http_status, error, duration_ms,
   next_attempt_at, process_id)
SELECT id, attempts, at, outcome, last_status, last_error, duration_ms,
       CASE WHEN outcome = 'retry' THEN next_attempt_at END, $3
  FROM upd WHERE attempted]]

-- The arguments of WRITE_SQL for send_batch's writes.
function M.write_args(writes, process_id)
  local ids, json = callbacks.write_args(writes)
  return { ids, json, process_id }
end

-- Why a row can never be sent, or nil.
local function refusal(row)
  local ok, why = callbacks.check_url(row.callback_url)
  if not ok then return why end
  ok, why = callbacks.check_payload(row.payload)
  if not ok then return why end
  ok, why = callbacks.check_stamp(row.callback_timestamp, row.callback_nonce)
  if not ok then return why end
  return nil
end

local function url_of(row) return row.callback_url end

local function attempted(row, out, nxt)
  local log = out.delivered and qtg.log.info or qtg.log.warn
  log(out.delivered and "callback delivered" or "callback attempt failed", {
    worker = "callback_dispatcher", request_id = row.request_id, outbox_id = row.id,
    attempt = nxt.attempts, status = nxt.status, http_status = out.status, error = out.error,
  })
end

-- Decide, send and record a claimed batch, ending the lane's transaction:
-- qtg.callbacks.send_batch, then every outcome and attempt row written in
-- one statement, sent with the commit.  A missing callback key raises
-- before anything is sent: the lane rolls back and no attempt is spent.
local function handle(ls, rows, timeout)
  local writes = callbacks.send_batch(rows, { refusal = refusal, url = url_of, timeout = timeout,
                                              attempted = attempted })
  for i, w in ipairs(writes) do
    if not w.attempted then
      qtg.log.warn("callback refused unsent", {
        worker = "callback_dispatcher", request_id = rows[i].request_id, outbox_id = rows[i].id,
        error = w.last_error,
      })
    end
  end
  -- the outcomes are the transaction's only write: sent with its commit
  -- (one round trip for both; a failure rolls back the claim with them)
  ls:commit_batch({ M.WRITE_SQL, unpack(M.write_args(writes, heartbeats.process_id())) })
end

-- Lanes per pass: MAX_LANES, but at most half the session pool, so the
-- other workers keep sessions while receivers are slow.
-- (pool: a pool size other than this process's, for tools/chaos's bounds.)
function M.lanes(pool)
  pool = pool or tonumber(qtg.settings.db_pool_size) or 8
  return math.max(1, math.min(M.MAX_LANES, math.floor(pool / 2)))
end

-- A PostgreSQL text[] literal of strings (every element quoted).
local function text_array(list)
  local parts = {}
  for i, v in ipairs(list) do parts[i] = '"' .. (v:gsub('[\\"]', '\\%0')) .. '"' end
  return "{" .. table.concat(parts, ",") .. "}"
end
M.text_array = text_array

local function stopping()
  local rt = qtg.runtime
  return rt ~= nil and rt.stopping ~= nil and rt.stopping()
end

-- After a pass that found nothing, the next probes first (see PROBE_SQL); a
-- draining run goes straight to the claims.
local last_pass_empty = false

function M.tick(s)
  local settings = qtg.settings
  local class = settings.network_class
  if last_pass_empty and #s:query(M.PROBE_SQL, class) == 0 then return 0 end
  local timeout = settings.callback_timeout_seconds
  -- a lane claims no new row after this: a pass lasts at most about twice
  -- the timeout, so the worker's heartbeat stays fresh and a stop is quick
  local deadline = qtg.monotonic() + timeout * M.PASS_BUDGET
  -- lanes: lanes running now.  sending[url]: batches of that receiver in
  -- flight; fast[url]: its last batch in this pass was sent within
  -- SLOW_BATCH_SECONDS.
  local pass = { rows = 0, err = nil, lanes = 1, sending = {}, fast = {}, done = {} }
  local max_lanes = M.lanes()
  local tasks = {}
  local run
  -- Lanes start as they are needed: a lane whose batch is full (a backlog)
  -- or still sending after SLOW_BATCH_SECONDS (a slow receiver) starts the
  -- next one (up to max_lanes), which looks for more while it sends.  With
  -- fast receivers and no backlog one lane does the work, at the spec's
  -- statements per batch.  A lane's look after a short batch (and a new
  -- lane's first) is the claim of one row with the pass's skip-list run
  -- on its own, outside a transaction (its lock ends with it), so the last
  -- look of each lane costs one statement.
  -- A new lane skips the receivers already being sent to that have not
  -- proven fast in this pass: a receiver that hangs holds one lane however
  -- many of its rows are due (without this, its backlog filled every lane,
  -- a full batch after another), while a fast one with a backlog gets more
  -- lanes once its first batch has come back quickly.
  local function start_lane()
    if pass.closed or pass.lanes >= max_lanes or pass.err ~= nil then return end
    pass.lanes = pass.lanes + 1
    tasks[#tasks + 1] = qtg.spawn(function()
      local ls = qtg.db.acquire()
      run(ls, true)
      ls:release()
      pass.lanes = pass.lanes - 1
    end)
  end
  -- receivers the head skips: those being sent to and not proven fast,
  -- and those done for this pass ("" is the NULL URL's rows, see CLAIM_SQL)
  local function skipped()
    local list = {}
    for url, n in pairs(pass.sending) do
      if n > 0 and not pass.fast[url] and not pass.done[url] then list[#list + 1] = url end
    end
    for url in pairs(pass.done) do list[#list + 1] = url end
    return text_array(list)
  end
  local function lane(ls, probe)
    while pass.err == nil and qtg.monotonic() < deadline and not stopping() do
      if probe and #ls:query(M.CLAIM_SQL, class, 1, skipped()) == 0 then return end
      ls:begin_pipeline()
      local rows = callbacks.stamp_first_attempts(ls:query(M.CLAIM_SQL, class, M.BATCH, skipped()))
      if #rows == 0 then
        ls:commit()
        return
      end
      local url = type(rows[1].callback_url) == "string" and rows[1].callback_url or nil
      if url then pass.sending[url] = (pass.sending[url] or 0) + 1 end
      local started = qtg.monotonic()
      -- after a full batch (a backlog) the next claim comes straight away;
      -- after a short one the receiver is done for this pass: the pass's
      -- later claims skip it (rows queued for it meanwhile wake a later,
      -- gathered pass, so batches are full instead of chasing each row as
      -- it commits) and go on with the other receivers' due rows
      local short = #rows < M.BATCH
      if short then pass.done[url or ""] = true end
      probe = short
      local sent = false
      if #rows >= M.BATCH then
        start_lane()
      elseif pass.lanes < max_lanes then
        qtg.spawn(function()          -- not joined: it only looks at `sent`
          qtg.sleep(M.SLOW_BATCH_SECONDS)
          if not sent then start_lane() end
        end)
      end
      local ok, err = pcall(handle, ls, rows, timeout)
      sent = true
      if url then
        pass.sending[url] = pass.sending[url] - 1
        pass.fast[url] = qtg.monotonic() - started < M.SLOW_BATCH_SECONDS or nil
      end
      if not ok then error(err, 0) end
      pass.rows = pass.rows + #rows
      if short then pass.short = true end
    end
    -- the budget or a stop ended the lane with rows perhaps still due
    pass.cut = true
  end
  run = function(ls, probe)
    local ok, err = pcall(lane, ls, probe)
    if not ok then
      pcall(ls.rollback, ls)
      if pass.err == nil then pass.err = err end
    end
  end
  run(s, false)
  -- lanes may start lanes while they are joined: join until none is left
  local i = 1
  while i <= #tasks do
    local ok, err = qtg.join(tasks[i])
    if not ok and pass.err == nil then pass.err = err end
    i = i + 1
  end
  pass.closed = true -- a slow-batch watcher that wakes now starts nothing
  last_pass_empty = pass.rows == 0 and pass.err == nil
  if pass.err ~= nil then error(pass.err, 0) end
  if not stopping() then
    if pass.cut then
      require("qtg.wakeups").wake_in("callback_dispatcher", 0)
    elseif pass.short then
      -- rows of other receivers, or queued meanwhile, are due within one
      -- gathering slot: the next pass probes first (one statement)
      last_pass_empty = true
      local wakeups = require("qtg.wakeups")
      wakeups.wake_in("callback_dispatcher", wakeups.GATHER.callback_dispatcher)
    end
  end
  return pass.rows
end

return M
