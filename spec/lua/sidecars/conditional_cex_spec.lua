-- cex_transfer_ingest: venue adapters (qtg.venues) pulling transfer history
-- from the venue connector stand-in (tools/fake-providers), upserting into
-- cex_transfers idempotently with a cursor per venue; unknown venues and a
-- misbehaving venue API are recorded errors.  Real PostgreSQL; two processes
-- released together for the concurrency.
local qtg = require "qtg"

local sup -- spec/lua/support/conditional.lua

local function transfer(i, status, extra)
  local t = { id = "tx-" .. i, direction = i % 2 == 0 and "deposit" or "withdrawal", asset = "USDC",
              amount = string.format("%d.%02d", 1000 + i, i % 100), fee = i % 2 == 0 and "0" or "1.5",
              network = "ethereum", address = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8",
              tx_hash = "0x" .. string.rep(string.format("%02x", i % 256), 32), status = status or "completed",
              time = string.format("2026-11-%02dT10:00:%02dZ", 1 + i % 28, i % 60) }
  for k, v in pairs(extra or {}) do t[k] = v end
  return t
end

local function feed(n, from)
  local out = {}
  for i = from or 1, n do out[#out + 1] = transfer(i) end
  return out
end

describe("cex_transfer_ingest", function()
  local dir, prov
  setup(function()
    sup = require "spec.lua.support.conditional"
    dir = sup.tmpdir()
    prov = sup.start_providers(dir)
  end)
  teardown(function() sup.stop_all() end)

  local function over(class, csv, extra)
    local t = { network_class = class, cex_api_url = prov.url, cex_transfer_ingest_venues_csv = csv,
                provider_timeout_seconds = 2 }
    for k, v in pairs(extra or {}) do t[k] = v end
    return t
  end
  local function rows(class, venue)
    return sup.query([[SELECT venue_transfer_id, status, amount::text AS amount, fee::text AS fee, updated_at
                         FROM cex_transfers WHERE network_class = $1 AND venue = $2 ORDER BY id]], class, venue)
  end
  local function cursor(class, venue)
    return sup.query("SELECT * FROM cex_ingest_cursors WHERE network_class = $1 AND venue = $2", class, venue)[1]
  end

  it("pulls every page of each venue, keeps a cursor per venue, and a second pass changes nothing", function()
    local class = sup.uid("cex")
    prov.control({ state = { cex_feeds = { binance = feed(230), okx = feed(3) } } })
    local n = sup.tick("cex_transfer_ingest", over(class, "binance, OKX"))
    assert.equals(233, n)
    local b = rows(class, "binance")
    assert.equals(230, #b)
    assert.equals("1001.01", b[1].amount)
    assert.equals("1.5", b[1].fee)
    assert.equals("c230", cursor(class, "binance").cursor)
    assert.equals(230, cursor(class, "binance").transfers_seen)
    assert.equals("c3", cursor(class, "okx").cursor)
    assert.equals(qtg.db.NULL, cursor(class, "okx").last_error)
    local pages = 0
    for _, e in ipairs(prov.received("cex")) do
      if e.path:match("^/v1/venues/binance/") and e.time then pages = pages + 1 end
    end
    assert.is_true(pages >= 3, "three pages of 100")
    assert.equals(0, sup.tick("cex_transfer_ingest", over(class, "binance,okx")))
    -- the same page replayed from the start changes nothing either
    sup.query("UPDATE cex_ingest_cursors SET cursor = NULL WHERE network_class = $1 AND venue = 'okx'", class)
    local before = rows(class, "okx")
    assert.equals(0, sup.tick("cex_transfer_ingest", over(class, "okx")))
    assert.same(before, rows(class, "okx"))
    -- a status change shows up again in the feed and updates that row only
    local fd = feed(3)
    fd[4] = transfer(2, "failed")
    prov.control({ state = { cex_feeds = { binance = feed(230), okx = fd } } })
    assert.equals(1, sup.tick("cex_transfer_ingest", over(class, "okx")))
    local o = rows(class, "okx")
    assert.equals(3, #o)
    assert.equals("failed", o[2].status)
    assert.equals("c4", cursor(class, "okx").cursor)
  end)

  it("records an unknown venue and a misbehaving venue API on the cursor, and goes on with the others", function()
    local class = sup.uid("cex-bad")
    prov.control({ state = { cex_feeds = { binance = feed(5), kraken = feed(2) } } })
    assert.equals(7, sup.tick("cex_transfer_ingest", over(class, "nosuchvenue,binance,kraken")))
    local c = cursor(class, "nosuchvenue")
    assert.matches('unknown venue "nosuchvenue"', c.last_error)
    assert.equals(1, c.consecutive_failures)
    assert.equals(5, #rows(class, "binance"))
    -- the connector does not serve coinbase here: its 404 is recorded
    sup.tick("cex_transfer_ingest", over(class, "coinbase"))
    assert.matches("HTTP 404", cursor(class, "coinbase").last_error)
    local cases = {
      { ctl = { service = "cex", mode = "garbage" }, want = "not a transfers page" },
      { ctl = { service = "cex", mode = "error", status = 500 }, want = "HTTP 500" },
      { ctl = { service = "cex", mode = "hang" }, want = "timeout" },
      { ctl = { service = "cex", mode = "ok", state = { cex_feeds = { binance = { transfer(9, "lost") } } } },
        want = "status is not pending" },
      { ctl = { service = "cex", mode = "ok", state = { cex_feeds = { binance = { transfer(9, nil, { amount = 12.5 }) } } } },
        want = "amount is not a decimal string" },
    }
    for i, k in ipairs(cases) do
      sup.query("UPDATE cex_ingest_cursors SET cursor = NULL WHERE network_class = $1 AND venue = 'binance'", class)
      prov.control(k.ctl)
      assert.equals(0, sup.tick("cex_transfer_ingest", over(class, "binance")))
      local cur = cursor(class, "binance")
      assert.matches(k.want, cur.last_error)
      assert.equals(i, cur.consecutive_failures)
      assert.equals(qtg.db.NULL, cur.cursor, "the cursor never moves past what was not stored")
      assert.equals(5, #rows(class, "binance"))
    end
    prov.control({ service = "cex", mode = "ok", state = { cex_feeds = { binance = feed(6) } } })
    assert.equals(1, sup.tick("cex_transfer_ingest", over(class, "binance")))
    assert.equals(0, cursor(class, "binance").consecutive_failures)
    assert.equals(qtg.db.NULL, cursor(class, "binance").last_error)
  end)

  -- A venue API's answer is any bytes: a character split at the 120-byte
  -- excerpt, latin-1, 0xff and NUL in a body or the next cursor.  The
  -- venue's own answer is what last_error says, not PostgreSQL's refusal.
  it("records what a venue API answered whatever its bytes, and refuses a next_cursor that is not text", function()
    local class = sup.uid("cex-bytes")
    local R = "\239\191\189" -- U+FFFD
    local cursor_refused = "next_cursor is not text (at most 1000 bytes of UTF-8, no NUL)"
    local cases = {
      { 500, string.rep("x", 119) .. "\195\169tail", "HTTP 500: " .. string.rep("x", 119) .. R .. "..." },
      { 500, "Erreur caf\233 \255\0 fin", "HTTP 500: Erreur caf" .. R .. " " .. R .. "  fin" },
      { 200, '{"transfers":[],"next_cursor":"c\255","has_more":false}', cursor_refused },
      { 200, '{"transfers":[],"next_cursor":"c\\u0000d","has_more":false}', cursor_refused },
    }
    for i, c in ipairs(cases) do
      prov.control({ service = "cex", mode = "raw", status = c[1], body_hex = qtg.crypto.hex(c[2]) })
      assert.equals(0, sup.tick("cex_transfer_ingest", over(class, "binance")))
      local cur = cursor(class, "binance")
      assert.equals(c[3], cur.last_error)
      assert.equals(i, cur.consecutive_failures)
      assert.equals(qtg.db.NULL, cur.cursor)
    end
    prov.control({ service = "cex", mode = "ok" })
  end)

  -- One pass over "bad,good": the tick returns normally with good's n
  -- transfers; bad's error is on its cursor, which did not move, and none of
  -- its page is stored.
  local function bad_then_good(class, bad, good, n, want)
    local ok, got = pcall(sup.tick, "cex_transfer_ingest", over(class, bad .. "," .. good))
    assert.is_true(ok, tostring(got))
    assert.equals(n, got)
    assert.equals(n, #rows(class, good))
    local c = cursor(class, bad)
    assert.matches(want, c.last_error)
    assert.equals(1, c.consecutive_failures)
    assert.equals(qtg.db.NULL, c.cursor, "the cursor never moves past what was not stored")
    assert.equals(0, #rows(class, bad), "nothing of the refused page is stored")
  end

  it("refuses a transfer with an impossible time or a NUL byte, records it, and the venues after it go on", function()
    local class = sup.uid("cex-strict")
    prov.control({ service = "cex", mode = "ok", state = { cex_feeds = {
      binance = { transfer(1), transfer(2, nil, { time = "2026-13-45T99:99:99Z" }) }, okx = feed(3),
      kraken = { transfer(1), transfer(2, nil, { network = "ether\0eum" }) }, bybit = feed(2) } } })
    bad_then_good(class, "binance", "okx", 3, "transfers%[2%]%.time")
    bad_then_good(class, "kraken", "bybit", 2, "transfers%[2%]%.network holds a NUL byte")
  end)

  it("normalize parses the time strictly and refuses NUL bytes and invalid UTF-8 anywhere", function()
    local normalize = require("qtg.venues.connector").normalize
    for _, good in ipairs({ "2026-11-01T10:00:00Z", "2024-02-29T23:59:59Z", "2000-02-29T00:00:00.123456Z",
                            "2026-12-31T00:00:00.5Z" }) do
      local t, why = normalize(transfer(1, nil, { time = good }), 1)
      assert.is_table(t, good .. ": " .. tostring(why))
    end
    for _, bad in ipairs({ "2026-13-45T99:99:99Z", "2026-00-10T10:00:00Z", "2026-02-29T10:00:00Z",
                           "2100-02-29T10:00:00Z", "2026-04-31T10:00:00Z", "2026-11-00T10:00:00Z",
                           "2026-11-01T24:00:00Z", "2026-11-01T10:60:00Z", "2026-11-01T10:00:60Z",
                           "0000-01-01T10:00:00Z", "2026-11-01T10:00:00.Z", "2026-11-01T10:00:00..1Z",
                           "2026-11-01T10:00:00+01:00", "2026-11-01 10:00:00Z" }) do
      local t, why = normalize(transfer(1, nil, { time = bad }), 1)
      assert.is_nil(t, bad)
      assert.matches("transfers%[1%]%.time", why)
    end
    for field, v in pairs({ address = "0x\0", tx_hash = "0x\255\254", id = "tx\0", extra = { note = "\192\128" } }) do
      local t, why = normalize(transfer(1, nil, { [field] = v }), 1)
      assert.is_nil(t, field)
      assert.matches("transfers%[1%]%." .. field .. ".* holds a NUL byte or is not valid UTF%-8", why)
    end
  end)

  it("a venue whose pass fails in SQL is rolled back, recorded on its cursor, and the others go on", function()
    local class = sup.uid("cex-sql")
    local venues = require("qtg.venues")
    -- an adapter that lets an impossible time through to the database
    package.loaded["spec.cex_raw_adapter"] = { fetch_page = function()
      local t = transfer(1, nil, { time = "2026-13-45T99:99:99Z" })
      t.raw = {}
      return { transfers = { t }, next_cursor = "r1", has_more = false }
    end }
    venues.register("rawvenue", "spec.cex_raw_adapter")
    prov.control({ service = "cex", mode = "ok", state = { cex_feeds = { okx = feed(3) } } })
    local ok, err = pcall(bad_then_good, class, "rawvenue", "okx", 3, "2026%-13%-45")
    venues.VENUES.rawvenue, package.loaded["spec.cex_raw_adapter"] = nil, nil
    assert(ok, err)
  end)

  it("two processes at once ingest each venue once", function()
    local class = sup.uid("cex-two")
    prov.control({ service = "cex", mode = "slow", state = { delay = 0.1,
      cex_feeds = { binance = feed(150), okx = feed(120), kraken = feed(40) } } })
    local go = dir .. "/go-cex"
    local env = sup.base_env{ MG_NETWORK_CLASS = class, MG_CEX_API_URL = prov.url,
      MG_CEX_TRANSFER_INGEST_VENUES_CSV = "binance,okx,kraken" }
    local c1 = sup.start_child(dir, "cex1", env, "cex_transfer_ingest", 2, go)
    local c2 = sup.start_child(dir, "cex2", env, "cex_transfer_ingest", 2, go)
    sup.write(go, "go")
    local r1, r2 = sup.wait_child(c1), sup.wait_child(c2)
    prov.control({ service = "cex", mode = "ok" })
    assert.is_true(r1.ok and r2.ok, tostring(r1.error or r2.error))
    assert.equals(310, r1.items + r2.items)
    assert.equals(310, sup.query("SELECT count(*)::int AS n FROM cex_transfers WHERE network_class = $1", class)[1].n)
    for venue, n in pairs({ binance = 150, okx = 120, kraken = 40 }) do
      local c = cursor(class, venue)
      assert.equals(n, c.transfers_seen, venue .. " ingested once")
      assert.equals("c" .. n, c.cursor)
    end
  end)
end)
