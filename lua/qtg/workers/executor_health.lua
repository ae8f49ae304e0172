-- qtg.workers.executor_health (spec section 6): call health() on every
-- registered executor adapter (qtg.executors.ADAPTERS) and every signer
-- loaded in this runtime (qtg.signer.keys()), persist the health states in
-- component_health, and record the signers' observed addresses in the
-- roster (qtg.signers.record_observations: this worker is its only caller).
--
-- The health calls run concurrently and outside any transaction (no lock is
-- held while a component answers); then one transaction writes everything.
-- States: the adapter's own healthy | degraded | down; a signer's ok ->
-- healthy, not ok -> down; down with last_error when health() raised or
-- answered garbage; unknown where there is no health().  A component no
-- longer registered keeps its row, set to unknown with last_error saying so.
-- All processes of one network class must load the same signers: a process
-- without a signer would mark it an orphan at its next pass.
local qtg = require("qtg")
local executors = require("qtg.executors")
local signers = require("qtg.signers")
local heartbeats = require("qtg.heartbeats")
local canon = require("qtg.canon_json")

local M = {}

M.WRITE_SQL = [[
INSERT INTO component_health AS h
  (network_class, component_kind, component_name, health_state, detail, last_error,
   checked_at, last_healthy_at, state_changed_at, process_id)
SELECT $1, c.kind, c.name, c.state, coalesce(c.detail, '{}'::jsonb), c.error,
       clock_timestamp(), CASE WHEN c.state = 'healthy' THEN clock_timestamp() END,
       clock_timestamp(), $2
  FROM jsonb_to_recordset($3::jsonb) AS c(kind text, name text, state text, detail jsonb,
                                          error text)
ON CONFLICT (network_class, component_kind, component_name) DO UPDATE
   SET health_state = EXCLUDED.health_state,
       detail = EXCLUDED.detail,
       last_error = EXCLUDED.last_error,
       checked_at = EXCLUDED.checked_at,
       last_healthy_at = coalesce(EXCLUDED.last_healthy_at, h.last_healthy_at),
       state_changed_at = CASE WHEN h.health_state = EXCLUDED.health_state
                               THEN h.state_changed_at ELSE EXCLUDED.state_changed_at END,
       process_id = EXCLUDED.process_id,
       updated_at = clock_timestamp()]]

-- Components ($2: "kind/name" list, comma-separated) that are gone.
M.GONE_SQL = [[
UPDATE component_health
   SET health_state = 'unknown', last_error = 'no longer registered in this runtime',
       state_changed_at = CASE WHEN health_state = 'unknown' THEN state_changed_at
                               ELSE clock_timestamp() END,
       checked_at = clock_timestamp(), updated_at = clock_timestamp()
 WHERE network_class = $1
   AND NOT ((component_kind || '/' || component_name) = ANY (string_to_array($2, ',')))
   AND (health_state <> 'unknown' OR last_error IS DISTINCT FROM 'no longer registered in this runtime')]]

local function sorted_keys(t)
  local out = {}
  for k in pairs(t) do out[#out + 1] = k end
  table.sort(out)
  return out
end

-- An error as one short line of valid text (a missing module's message
-- lists every path; a node's error can be any bytes).
local function text(v)
  if type(v) == "table" and v.message then v = v.message end
  return canon.excerpt(tostring(v):match("^[^\n]*"), 300)
end

-- storable(row) -> row, its detail and error made fit for the one write
-- of every component: a component whose answer PostgreSQL would refuse
-- is recorded down with the reason, and the others are recorded as they are.
local function storable(row)
  local ok, why = canon.storable(row, row.kind .. "/" .. row.name)
  if ok then return row end
  return { kind = row.kind, name = row.name, state = "down",
           error = text("health answer not storable: " .. why) }
end

-- One executor adapter -> {state, detail, error}.
local function check_executor(name)
  local adapter, why = executors.get(name)
  if not adapter then return { state = "down", error = text(why) } end
  if type(adapter.health) ~= "function" then return { state = "unknown" } end
  local answer, err = executors.call(adapter, "health")
  if not answer then return { state = "down", error = text(err.code .. ": " .. err.message) } end
  return { state = answer.state, detail = answer.detail and { detail = answer.detail } or nil }
end

-- One signer -> {state, detail, error, observed}.
local function check_signer(name)
  local health = qtg.signer.health
  if type(health) ~= "function" then return { state = "unknown" } end
  local ok, answer, err = pcall(health, name)
  if not ok then return { state = "down", error = "health raised: " .. text(answer) } end
  if type(answer) ~= "table" then
    return { state = "down", error = "health failed: " .. text(err or answer) }
  end
  local res = { state = answer.ok == true and "healthy" or "down", detail = {} }
  if answer.ok ~= true then
    res.error = "signer not ok: " .. text(answer.error or answer.code or "no reason given")
  end
  local observed, refused = signers.canonical_address(answer.signer_address)
  if observed then
    res.observed = observed
  else
    res.detail.identity_error = refused
    res.error = res.error and (res.error .. "; " .. refused) or refused
  end
  return res
end

-- Run fns concurrently; results[i] = fn(arg) or a "down" result on a raise.
local function run_all(jobs)
  local tasks, results = {}, {}
  for i, job in ipairs(jobs) do tasks[i] = qtg.spawn(job.fn, job.name) end
  for i, job in ipairs(jobs) do
    local ok, res = qtg.join(tasks[i])
    results[i] = ok and res or { state = "down", error = "health check raised: " .. text(res) }
    results[i].kind, results[i].name = job.kind, job.name
  end
  return results
end

function M.tick(s)
  local jobs = {}
  for _, name in ipairs(sorted_keys(executors.ADAPTERS)) do
    jobs[#jobs + 1] = { kind = "executor", name = name, fn = check_executor }
  end
  local keys, kerr = qtg.signer.keys()
  if kerr then
    -- the signer cannot be asked: its keys are the ones last seen, each
    -- checked (and found down) rather than forgotten as orphans
    qtg.log.warn("signer cannot be asked", { worker = "executor_health", error = tostring(kerr.message) })
    keys = {}
    for _, r in ipairs(s:query([[SELECT signer_key FROM signer_roster
                                  WHERE network_class = $1 AND runtime_present]], qtg.settings.network_class)) do
      keys[#keys + 1] = r.signer_key
    end
  end
  table.sort(keys)
  for _, name in ipairs(keys) do
    jobs[#jobs + 1] = { kind = "signer", name = name, fn = check_signer }
  end
  local results = run_all(jobs)

  local rows, present, observations = {}, {}, {}
  for i, r in ipairs(results) do
    rows[i] = storable({ kind = r.kind, name = r.name, state = r.state, error = r.error,
                         detail = (r.detail and next(r.detail)) and r.detail or nil })
    present[i] = r.kind .. "/" .. r.name
    if r.kind == "signer" then
      observations[#observations + 1] = { signer_key = r.name, observed = r.observed }
    end
    if r.state ~= "healthy" and r.state ~= "unknown" then
      qtg.log.warn("component not healthy", { worker = "executor_health", kind = r.kind,
                                              name = r.name, state = r.state, error = r.error })
    end
  end

  local class = qtg.settings.network_class
  -- one pipeline transaction (no BEGIN or COMMIT statement)
  s:pipeline_transaction(function()
    if #rows > 0 then s:query(M.WRITE_SQL, class, heartbeats.process_id(), canon.encode(rows)) end
    s:query(M.GONE_SQL, class, table.concat(present, ","))
    signers.record_observations(s, observations)
  end)
  return #rows
end

return M
