-- qtg.workers.verify_drift (spec section 13; MG_VERIFY_DRIFT_ENABLED,
-- sidecar, every MG_VERIFY_DRIFT_INTERVAL_SECONDS = 6 h by default): compare
-- the on-chain registry values with the configured drift_baselines.
--
-- One pass:
--   * a transaction-scoped advisory try-lock per network class, and a skip
--     when a verify check finished less than half an interval ago: several
--     processes run one pass per interval between them;
--   * the enabled baselines of this class, grouped by chain; the chains run
--     in parallel (one task each);
--   * per chain: eth_chainId must match; then the chain's checks go through
--     MG_VERIFY_DRIFT_CONCURRENCY worker tasks (that many RPC calls in flight
--     at most), and each lane has MG_VERIFY_DRIFT_LANE_TIMEOUT_SECONDS from
--     its first call: a call gets what is left of it, and a check that
--     starts after the lane's deadline is an error without a call;
--   * a check is eth_getCode -> keccak256 for kind code_hash, or eth_call
--     for kind call; equal to `expected` -> its open finding is resolved;
--     different -> a finding is opened (and announced once); an error (no
--     endpoint, malformed address, timeout, garbage, error status) changes
--     no finding and is listed in the lane's drift_checks row;
--   * each lane's findings and check are written under a savepoint of the
--     pass's transaction: a lane whose write fails is rolled back alone and
--     recorded as a failed check, the other lanes' findings stand.
-- Returns the number of baselines checked.
local qtg = require("qtg")
local canon = require("qtg.canon_json")
local evm_rpc = require("qtg.evm_rpc")
local drift = require("qtg.drift")

local M = {}

M.LOCK_SQL = [[SELECT pg_try_advisory_xact_lock(hashtext('qtg.verify_drift'), hashtext($1)) AS got]]
M.BASELINES_SQL = [[
SELECT * FROM drift_baselines WHERE network_class = $1 AND enabled ORDER BY chain_id, lane, name, id]]

local function subject(b) return "baseline:" .. b.id end

-- Observe one baseline: observed value or nil, error text.
local function observe(url, b, timeout)
  local addr, why = evm_rpc.check_address(b.address)
  if not addr then return nil, why end
  if b.kind == "code_hash" then
    local code, err = evm_rpc.get_code(url, addr, "latest", { timeout = timeout })
    if not code then return nil, tostring(err) end
    return "0x" .. qtg.crypto.keccak256_hex(qtg.crypto.unhex(code))
  end
  local out, err = evm_rpc.call(url, { to = addr, data = b.call_data }, "latest", { timeout = timeout })
  if not out then return nil, tostring(err) end
  return out
end

-- Run every check of one chain; returns results[i] = {observed=|error=}.
local function run_chain(url, chain, list, settings)
  local results = {}
  local cid, cerr = evm_rpc.chain_id(url, { timeout = settings.verify_drift_lane_timeout_seconds })
  if cid ~= chain then
    local why = cid and string.format("the endpoint for chain %d answers eth_chainId %d", chain, cid)
      or ("eth_chainId: " .. tostring(cerr))
    for i in ipairs(list) do results[i] = { error = why } end
    return results
  end
  local lane_deadline = {}
  local next_i = 0
  local function worker()
    while true do
      next_i = next_i + 1
      local i = next_i
      local b = list[i]
      if not b then return end
      local now = qtg.monotonic()
      lane_deadline[b.lane] = lane_deadline[b.lane] or (now + settings.verify_drift_lane_timeout_seconds)
      local left = lane_deadline[b.lane] - now
      if left <= 0.05 then
        results[i] = { error = "lane timeout: no time left in the lane's "
          .. settings.verify_drift_lane_timeout_seconds .. " s" }
      else
        local ok, observed, err = pcall(observe, url, b, math.min(left, settings.evm_rpc_timeout_seconds))
        if not ok then observed, err = nil, "check raised: " .. tostring(observed) end
        results[i] = observed and { observed = observed } or { error = err }
      end
    end
  end
  local tasks = {}
  for k = 1, math.min(settings.verify_drift_concurrency, #list) do tasks[k] = qtg.spawn(worker) end
  for _, t in ipairs(tasks) do
    local ok, err = qtg.join(t)
    if not ok then error(err, 0) end
  end
  return results
end

M.LANE_SAVEPOINT = "verify_drift_lane"

-- One lane's writes: its findings opened, the ones seen as expected
-- resolved, its drift_checks row.
local function write_lane(s, class, key, lane, started)
  for _, f in ipairs(lane.open) do drift.open(s, class, "verify", f) end
  drift.resolve(s, class, "verify", lane.resolve)
  drift.check(s, { class = class, source = "verify", scope = key, ok = #lane.errors == 0,
    checked = lane.checked, drifted = lane.drifted, errors = lane.errors, started_at = started })
end

local function record(s, class, list, results, started)
  local lanes, order = {}, {}
  for i, b in ipairs(list) do
    local key = b.chain_id .. ":" .. b.lane
    if not lanes[key] then
      lanes[key] = { checked = 0, drifted = 0, errors = {}, resolve = {}, open = {} }
      order[#order + 1] = key
    end
    local lane, r = lanes[key], results[i]
    if r.error then
      lane.errors[#lane.errors + 1] = string.format("%s (%s): %s", b.name, subject(b), canon.excerpt(r.error, 300))
    else
      lane.checked = lane.checked + 1
      if r.observed == b.expected:lower() then
        lane.resolve[#lane.resolve + 1] = subject(b)
      else
        lane.drifted = lane.drifted + 1
        lane.open[#lane.open + 1] = { subject = subject(b), baseline_id = b.id, severity = "critical",
          expected = b.expected, observed = r.observed,
          detail = { chain_id = b.chain_id, lane = b.lane, name = b.name, kind = b.kind, address = b.address } }
      end
    end
  end
  for _, key in ipairs(order) do
    local lane = lanes[key]
    s:savepoint(M.LANE_SAVEPOINT)
    local ok, err = pcall(write_lane, s, class, key, lane, started)
    if ok then
      s:release_savepoint(M.LANE_SAVEPOINT)
    else
      s:rollback_to(M.LANE_SAVEPOINT)
      local why = "recording the lane failed: " .. canon.excerpt(err, 300)
      qtg.log.error("verify_drift: lane not recorded", { worker = "verify_drift", lane = key, error = why })
      lane.errors[#lane.errors + 1] = why
      drift.check(s, { class = class, source = "verify", scope = key, ok = false, checked = lane.checked,
        drifted = lane.drifted, errors = lane.errors, started_at = started })
    end
    if #lane.errors > 0 then
      qtg.log.warn("verify_drift: lane not fully checked", { worker = "verify_drift", lane = key,
        errors = #lane.errors, first_error = lane.errors[1] })
    end
  end
end

function M.tick(s)
  local settings = qtg.settings
  local class = settings.network_class
  local started = qtg.now()
  return drift.pass(s, M.LOCK_SQL, class, "verify", settings.verify_drift_interval_seconds, function()
    local baselines = s:query(M.BASELINES_SQL, class)
    if #baselines == 0 then return 0 end
    local eps, why = evm_rpc.endpoints(settings.evm_rpc_urls or "")
    eps = eps or {}
    local by_chain, chains = {}, {}
    for _, b in ipairs(baselines) do
      if not by_chain[b.chain_id] then
        by_chain[b.chain_id] = {}
        chains[#chains + 1] = b.chain_id
      end
      table.insert(by_chain[b.chain_id], b)
    end
    local tasks = {}
    for k, chain in ipairs(chains) do
      if eps[chain] then
        tasks[k] = qtg.spawn(run_chain, eps[chain], chain, by_chain[chain], settings)
      end
    end
    local list, results = {}, {}
    for k, chain in ipairs(chains) do
      local res
      if tasks[k] then
        local tok, r = qtg.join(tasks[k])
        if not tok then error(r, 0) end
        res = r
      else
        res = {}
        local reason = why and ("MG_EVM_RPC_URLS: " .. why) or ("no RPC endpoint for chain " .. chain
          .. " in MG_EVM_RPC_URLS")
        for i in ipairs(by_chain[chain]) do res[i] = { error = reason } end
      end
      for i, b in ipairs(by_chain[chain]) do
        list[#list + 1] = b
        results[#results + 1] = res[i]
      end
    end
    record(s, class, list, results, started)
    return #list
  end)
end

return M
