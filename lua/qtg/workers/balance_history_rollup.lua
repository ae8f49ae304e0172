-- qtg.workers.balance_history_rollup (MG_BALANCE_HISTORY_ENABLED,
-- sidecar): roll the successful balance snapshots up into hourly and daily
-- history rows (open, close, min, max, samples), idempotently.
--
-- Each pass recomputes, from the snapshots, every whole hour and day bucket
-- that has snapshots in the look-back window (rounded down to a bucket
-- start) and is still complete in the table (its start is later than the
-- retention cut-off, so retention has not deleted part of it), and upserts
-- them.  A bucket whose figures did not change is not written (ON CONFLICT
-- ... WHERE the values differ), so a second pass over the same snapshots
-- changes nothing and returns 0.  Buckets older than the window keep their
-- history after their snapshots are deleted.  Two processes: a
-- transaction-scoped advisory try-lock per network class; the one that does
-- not get it skips the pass.
local qtg = require("qtg")

local M = {}

M.GRANULARITIES = {
  { name = "hour", lookback_seconds = 48 * 3600 },
  { name = "day", lookback_seconds = 8 * 86400 },
}

M.LOCK_SQL = [[SELECT pg_try_advisory_xact_lock(hashtext('qtg.balance_history'), hashtext($1)) AS got]]

-- $1 class, $2 granularity ('hour'|'day'), $3 look-back seconds, $4 retention seconds.
-- Both bounds of the window are bucket starts (UTC): the look-back is
-- rounded down to its bucket, so the bucket at its edge is recomputed from
-- all of its snapshots (a window starting mid-bucket would upsert the edge
-- bucket from its later part only, shrinking it on every pass); the
-- retention bound is the first bucket that retention has not started to
-- delete.
M.ROLLUP_SQL = [[
WITH b AS (
  SELECT venue_key, asset, date_trunc($2, captured_at, 'UTC') AS bucket_start,
         (array_agg(amount ORDER BY captured_at, id))[1] AS open_amount,
         (array_agg(amount ORDER BY captured_at DESC, id DESC))[1] AS close_amount,
         min(amount) AS min_amount, max(amount) AS max_amount, count(*)::int AS samples,
         min(captured_at) AS first_at, max(captured_at) AS last_at
    FROM balance_snapshots
   WHERE network_class = $1 AND ok
     AND captured_at >= greatest(date_trunc($2, now() - make_interval(secs => $3), 'UTC'),
                                 date_trunc($2, now() - make_interval(secs => $4), 'UTC')
                                   + ('1 ' || $2)::interval)
   GROUP BY 1, 2, 3
)
INSERT INTO balance_history AS h (network_class, venue_key, asset, granularity, bucket_start,
  open_amount, close_amount, min_amount, max_amount, samples, first_at, last_at)
SELECT $1, venue_key, asset, $2, bucket_start, open_amount, close_amount, min_amount, max_amount,
       samples, first_at, last_at
  FROM b
ON CONFLICT (network_class, venue_key, asset, granularity, bucket_start) DO UPDATE
   SET open_amount = EXCLUDED.open_amount, close_amount = EXCLUDED.close_amount,
       min_amount = EXCLUDED.min_amount, max_amount = EXCLUDED.max_amount,
       samples = EXCLUDED.samples, first_at = EXCLUDED.first_at, last_at = EXCLUDED.last_at,
       updated_at = clock_timestamp()
 WHERE (h.open_amount, h.close_amount, h.min_amount, h.max_amount, h.samples, h.first_at, h.last_at)
       IS DISTINCT FROM (EXCLUDED.open_amount, EXCLUDED.close_amount, EXCLUDED.min_amount,
                         EXCLUDED.max_amount, EXCLUDED.samples, EXCLUDED.first_at, EXCLUDED.last_at)]]

function M.tick(s)
  local settings = qtg.settings
  return s:transaction(function()
    if not s:query(M.LOCK_SQL, settings.network_class)[1].got then return 0 end
    local changed = 0
    for _, g in ipairs(M.GRANULARITIES) do
      local _, n = s:query(M.ROLLUP_SQL, settings.network_class, g.name, g.lookback_seconds,
        settings.balance_snapshot_retention_seconds)
      changed = changed + (n or 0)
    end
    return changed
  end)
end

return M
