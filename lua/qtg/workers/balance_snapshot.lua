-- qtg.workers.balance_snapshot (spec section 7; MG_BALANCE_SNAPSHOT_ENABLED,
-- sidecar): one append-only snapshot per venue of the fetcher registry
-- (qtg.balances.FETCHERS; the default is the Gateway API's unified USDC
-- balance as venue_key "gateway") per pass, then retention cleanup.
--
-- Several processes: each venue's fetch runs under a transaction-scoped
-- advisory try-lock on (network class, venue), and is skipped when a
-- snapshot of that venue was written less than half an interval ago, so
-- processes started together store one snapshot per interval, not one each.
-- The advisory lock is held across the fetch (bounded by
-- MG_PROVIDER_TIMEOUT_SECONDS); nothing else ever waits on it (try-lock).
-- A fetch that fails is stored as an error snapshot (the reason is visible
-- in the console's balances()) and the pass goes on.  A venue whose pass
-- raises all the same (a write the database refused) is rolled back and
-- logged, and the other venues and the retention still run.
--
-- Retention: snapshots of this class older than
-- MG_BALANCE_SNAPSHOT_RETENTION_SECONDS are deleted, RETENTION_BATCH per pass.
local qtg = require("qtg")
local canon = require("qtg.canon_json")
local balances = require("qtg.balances")
local heartbeats = require("qtg.heartbeats")

local M = {}

M.RETENTION_BATCH = 5000

M.LOCK_SQL = [[SELECT pg_try_advisory_xact_lock(hashtext('qtg.balance_snapshot'), hashtext($1 || '/' || $2)) AS got]]
M.RECENT_SQL = [[
SELECT EXISTS (SELECT 1 FROM balance_snapshots
                WHERE network_class = $1 AND venue_key = $2 AND source = 'worker'
                  AND captured_at > clock_timestamp() - make_interval(secs => $3)) AS recent]]
-- The batch in a MATERIALIZED CTE, computed once (as every batch of a DML
-- statement here: see audit_outbox_promoter.PROMOTE_SQL).
M.RETENTION_SQL = [[
WITH picked AS MATERIALIZED (
  SELECT id FROM balance_snapshots
   WHERE network_class = $1 AND captured_at < now() - make_interval(secs => $2)
   ORDER BY captured_at LIMIT $3
)
DELETE FROM balance_snapshots b USING picked p WHERE b.id = p.id]]

local function one_venue(s, fetcher, settings)
  return s:transaction(function()
    if not s:query(M.LOCK_SQL, settings.network_class, fetcher.venue_key)[1].got then return 0 end
    local gap = settings.balance_snapshot_interval_seconds * 0.5
    if s:query(M.RECENT_SQL, settings.network_class, fetcher.venue_key, gap)[1].recent then return 0 end
    return balances.snapshot(s, fetcher, "worker", heartbeats.process_id())
  end)
end

function M.tick(s)
  local settings = qtg.settings
  local written = 0
  for _, fetcher in ipairs(balances.FETCHERS) do
    local ok, n = pcall(one_venue, s, fetcher, settings)
    if ok then
      written = written + n
    else
      qtg.log.error("balance snapshot not stored", { worker = "balance_snapshot", venue_key = fetcher.venue_key,
        error = canon.excerpt(n, 500) })
    end
  end
  local _, deleted = s:query(M.RETENTION_SQL, settings.network_class,
    settings.balance_snapshot_retention_seconds, M.RETENTION_BATCH)
  if (deleted or 0) > 0 then
    qtg.log.info("balance snapshots past retention deleted", { worker = "balance_snapshot", deleted = deleted })
  end
  return written + (deleted or 0)
end

return M
