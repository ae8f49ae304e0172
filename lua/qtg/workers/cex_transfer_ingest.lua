-- qtg.workers.cex_transfer_ingest (enabled by a non-empty
-- MG_CEX_TRANSFER_INGEST_VENUES_CSV, sidecar): for each venue of the CSV,
-- its adapter (qtg.venues) pulls transfer history page by page from the
-- venue's cursor, and the transfers are upserted into cex_transfers.
--
-- Per venue, one transaction: the venue's cex_ingest_cursors row is locked
-- FOR UPDATE SKIP LOCKED (a venue being ingested by another process is
-- skipped, never waited for; the lock is held across the venue's HTTP calls,
-- bounded by MG_PROVIDER_TIMEOUT_SECONDS per page, and nothing but this
-- worker touches the row), up to MAX_PAGES pages are fetched, each page's
-- transfers upserted and the cursor moved in the same transaction.
-- Idempotent: an upsert writes a row only when the venue changed something,
-- so the same page seen twice changes nothing.
-- Errors (an unknown venue, an unreachable or garbage-speaking venue API, a
-- page with an invalid transfer) are recorded on the venue's cursor row
-- (last_error, last_error_at, consecutive_failures); the cursor does not
-- move past anything not stored, and the other venues go on.  A venue's pass
-- that raises (the database refusing a write) is rolled back and recorded
-- the same way in a transaction of its own (M.tick).
local qtg = require("qtg")
local venues = require("qtg.venues")
local canon = require("qtg.canon_json")

local M = {}

M.MAX_PAGES = 10

M.ENSURE_SQL = [[
INSERT INTO cex_ingest_cursors (network_class, venue) VALUES ($1, $2)
ON CONFLICT (network_class, venue) DO NOTHING]]

M.LOCK_SQL = [[
SELECT * FROM cex_ingest_cursors WHERE network_class = $1 AND venue = $2 FOR UPDATE SKIP LOCKED]]

M.UPSERT_SQL = [[
INSERT INTO cex_transfers AS c (network_class, venue, venue_transfer_id, direction, asset, amount, fee,
  network, address, tx_hash, status, venue_time, raw)
SELECT $1, $2, t.id, t.direction, t.asset, t.amount::numeric, t.fee::numeric, t.network, t.address,
       t.tx_hash, t.status, t.time::timestamptz, t.raw
  FROM jsonb_to_recordset($3::jsonb) AS t(id text, direction text, asset text, amount text, fee text,
       network text, address text, tx_hash text, status text, time text, raw jsonb)
ON CONFLICT (network_class, venue, venue_transfer_id) DO UPDATE
   SET direction = EXCLUDED.direction, asset = EXCLUDED.asset, amount = EXCLUDED.amount,
       fee = EXCLUDED.fee, network = EXCLUDED.network, address = EXCLUDED.address,
       tx_hash = EXCLUDED.tx_hash, status = EXCLUDED.status, venue_time = EXCLUDED.venue_time,
       raw = EXCLUDED.raw, updated_at = clock_timestamp()
 WHERE (c.direction, c.asset, c.amount, c.fee, c.network, c.address, c.tx_hash, c.status, c.venue_time)
       IS DISTINCT FROM (EXCLUDED.direction, EXCLUDED.asset, EXCLUDED.amount, EXCLUDED.fee,
                         EXCLUDED.network, EXCLUDED.address, EXCLUDED.tx_hash, EXCLUDED.status,
                         EXCLUDED.venue_time)]]

M.ADVANCE_SQL = [[
UPDATE cex_ingest_cursors
   SET cursor = $3, last_success_at = clock_timestamp(), last_error = NULL, last_error_at = NULL,
       consecutive_failures = 0, transfers_seen = transfers_seen + $4, updated_at = clock_timestamp()
 WHERE network_class = $1 AND venue = $2]]

M.ERROR_SQL = [[
UPDATE cex_ingest_cursors
   SET last_error = $3, last_error_at = clock_timestamp(), consecutive_failures = consecutive_failures + 1,
       updated_at = clock_timestamp()
 WHERE network_class = $1 AND venue = $2]]

local function clip(s) return canon.excerpt(s, 500) end

-- The last version of each transfer id of a page (an upsert cannot touch
-- one row twice in a statement).
local function rows_of(page)
  local by_id, order = {}, {}
  for _, t in ipairs(page.transfers) do
    if not by_id[t.id] then order[#order + 1] = t.id end
    by_id[t.id] = t
  end
  local out = canon.array()
  for i, id in ipairs(order) do
    local t = by_id[id]
    out[i] = { id = t.id, direction = t.direction, asset = t.asset, amount = t.amount,
               fee = t.fee or qtg.db.NULL, network = t.network or qtg.db.NULL,
               address = t.address or qtg.db.NULL, tx_hash = t.tx_hash or qtg.db.NULL,
               status = t.status, time = t.time, raw = t.raw }
  end
  return out
end

local function ingest(s, class, venue, cur, settings)
  local adapter, why = venues.adapter(venue)
  if not adapter then
    s:query(M.ERROR_SQL, class, venue, clip(why))
    qtg.log.warn("cex ingest: unknown venue", { worker = "cex_transfer_ingest", venue = venue, error = why })
    return 0
  end
  local cursor = cur.cursor ~= qtg.db.NULL and cur.cursor or nil
  local changed = 0
  for _ = 1, M.MAX_PAGES do
    local ok, page, err = pcall(adapter.fetch_page, venue, cursor, settings)
    if not ok then page, err = nil, "adapter raised: " .. tostring(page) end
    if not page then
      s:query(M.ERROR_SQL, class, venue, clip(err))
      qtg.log.warn("cex ingest: page not stored", { worker = "cex_transfer_ingest", venue = venue,
        error = clip(err) })
      break
    end
    local rows = rows_of(page)
    if #rows > 0 then
      local _, n = s:query(M.UPSERT_SQL, class, venue, canon.encode(rows))
      changed = changed + (n or 0)
    end
    cursor = page.next_cursor or cursor
    s:query(M.ADVANCE_SQL, class, venue, cursor or qtg.db.NULL, #rows)
    if not page.has_more or not page.next_cursor then break end
  end
  return changed
end

local function locked_ingest(s, class, venue, settings)
  local cur = s:query(M.LOCK_SQL, class, venue)[1]
  if not cur then return 0 end -- another process is on it
  return ingest(s, class, venue, cur, settings)
end

local function pass(s, class, venue, settings)
  s:query(M.ENSURE_SQL, class, venue)
  return s:transaction(locked_ingest, s, class, venue, settings)
end

-- The venue's row locked again (SKIP LOCKED: if another process took the
-- venue since our rollback, its own pass records its outcome) and the error
-- written.
local function record(s, class, venue, msg)
  if s:query(M.LOCK_SQL, class, venue)[1] then s:query(M.ERROR_SQL, class, venue, msg) end
end

-- A venue's pass that raised (an upsert the database refused, a lost
-- connection): its transaction was rolled back with everything it wrote, so
-- the error goes on the cursor row in a transaction of its own.  Returns
-- nil when recorded, else the reason it could not be.
local function record_failure(s, class, venue, err)
  local msg = clip(err)
  qtg.log.error("cex ingest: venue pass failed", { worker = "cex_transfer_ingest", venue = venue, error = msg })
  if s:in_transaction() then pcall(s.rollback, s) end
  local ok, rerr = pcall(s.transaction, s, record, s, class, venue, msg)
  if ok then return nil end
  if s:in_transaction() then pcall(s.rollback, s) end
  return venue .. ": " .. msg .. " (not recorded: " .. clip(rerr) .. ")"
end

-- Each venue is isolated: one venue's failure is recorded on its cursor row
-- and the venues after it in the CSV still run.  The tick returns normally
-- when every failure is recorded there (a tick that raises counts as a
-- runtime error and backs off, which would delay the healthy venues for a
-- failure that is already visible); it raises, after all venues ran, only
-- when a failure could not be recorded.
function M.tick(s)
  local settings = qtg.settings
  local class = settings.network_class
  local changed, unrecorded = 0, {}
  for _, venue in ipairs(venues.parse_csv(settings.cex_transfer_ingest_venues_csv)) do
    local ok, n = pcall(pass, s, class, venue, settings)
    if ok then
      changed = changed + n
    else
      unrecorded[#unrecorded + 1] = record_failure(s, class, venue, n)
    end
  end
  if #unrecorded > 0 then
    error(string.format("cex_transfer_ingest: %d venue pass(es) failed and could not be recorded: %s",
      #unrecorded, table.concat(unrecorded, "; ")), 0)
  end
  return changed
end

return M
