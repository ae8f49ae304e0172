-- balance_snapshot (the fetcher registry, the Gateway API's unified USDC
-- balance through tools/fake-providers, staleness at read time, retention)
-- and balance_history_rollup (hourly and daily history, idempotent).
-- Real PostgreSQL; two processes released together for the concurrency.
local qtg = require "qtg"
local cjson = require "cjson"

local sup -- spec/lua/support/conditional.lua

local DEP1 = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8"
local DEP2 = "0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc"

local function count(sql, ...) return sup.query(sql, ...)[1].n end

local function snapshots(class)
  return sup.query([[SELECT venue_key, asset, ok, amount::text AS amount, error, detail, source
                       FROM balance_snapshots WHERE network_class = $1 ORDER BY id]], class)
end

describe("balance_snapshot", function()
  local s, dir, prov
  setup(function()
    sup = require "spec.lua.support.conditional"
    s = qtg.db.acquire()
    dir = sup.tmpdir()
    prov = sup.start_providers(dir, { gateway_balances = {
      [DEP1] = { ["0"] = "100.25", ["6"] = "50.5" }, [DEP2] = { ["3"] = "0.000001" } } })
  end)
  teardown(function()
    s:release()
    sup.stop_all()
  end)

  local function over(class, extra)
    local t = { network_class = class, gateway_api_url = prov.url, gateway_depositors = DEP1 .. "," .. DEP2,
                balance_snapshot_interval_seconds = 0, provider_timeout_seconds = 2 }
    for k, v in pairs(extra or {}) do t[k] = v end
    return t
  end

  it("stores the unified Gateway USDC balance as one append-only gateway snapshot per pass", function()
    local class = sup.uid("bal")
    assert.equals(1, sup.tick("balance_snapshot", over(class)))
    local rows = snapshots(class)
    assert.equals(1, #rows)
    assert.equals("gateway", rows[1].venue_key)
    assert.equals("USDC", rows[1].asset)
    assert.equals("150.750001", rows[1].amount) -- summed exactly, over domains and depositors
    assert.equals(3, #rows[1].detail.domains)
    local req = prov.received("gateway")
    local body = cjson.decode(req[#req].body)
    assert.equals("USDC", body.token)
    assert.same({ { depositor = DEP1 }, { depositor = DEP2 } }, body.sources)
    local ok, err = pcall(sup.query, "UPDATE balance_snapshots SET amount = 0 WHERE network_class = $1", class)
    assert.is_false(ok)
    assert.matches("append%-only", err.message)
    -- another pass appends another snapshot with the new figure
    prov.control({ state = { gateway_balances = { [DEP1] = { ["0"] = "99" } } } })
    assert.equals(1, sup.tick("balance_snapshot", over(class)))
    rows = snapshots(class)
    assert.equals(2, #rows)
    assert.equals("99", rows[2].amount)
  end)

  it("judges staleness when read, and shows it in the console's balances()", function()
    local class = sup.uid("bal-stale")
    prov.control({ state = { gateway_balances = { [DEP1] = { ["0"] = "7.5" } } } })
    sup.tick("balance_snapshot", over(class))
    local balances = require "qtg.balances"
    local latest = sup.with_settings({ network_class = class }, balances.latest, s)
    assert.equals(1, #latest)
    assert.equals("7.5", latest[1].amount)
    assert.is_false(latest[1].stale)
    qtg.sleep(0.3)
    latest = sup.with_settings({ network_class = class, balance_stale_threshold_seconds = 0.2 }, balances.latest, s)
    assert.is_true(latest[1].stale)
    assert.is_true(latest[1].age_seconds >= 0.3)
    assert.equals(1, #snapshots(class), "staleness is never written")
    -- the console command reads the same
    local printed = {}
    local cmds = require("qtg.console.commands").bind({ actor = "console:spec",
      print = function(...) printed[#printed + 1] = table.concat({ ... }, "\t") end })
    local shown = sup.with_settings({ network_class = class, balance_stale_threshold_seconds = 0.2 }, cmds.balances)
    local text = type(shown) == "table" and cjson.encode(shown) or tostring(shown)
    assert.matches("gateway", text)
    assert.matches("7%.5", text)
    assert.matches("true", text)
  end)

  it("records garbage, an error status, a timeout and a malformed depositor as error snapshots and goes on", function()
    local class = sup.uid("bal-bad")
    prov.control({ state = { gateway_balances = { [DEP1] = { ["0"] = "10" } } } })
    sup.tick("balance_snapshot", over(class))
    local cases = {
      { ctl = { service = "gateway", mode = "garbage" }, want = "not a USDC balances object" },
      { ctl = { service = "gateway", mode = "error", status = 502 }, want = "HTTP 502" },
      { ctl = { service = "gateway", mode = "hang" }, want = "timeout" },
      { ctl = { service = "gateway", mode = "ok" }, extra = { gateway_depositors = "0x1234" },
        want = "malformed EVM address" },
      { ctl = { service = "gateway", mode = "ok", state = { gateway_balances = { [DEP1] = { ["0"] = "1e5" } } } },
        want = "lacks a decimal balance" },
    }
    for i, c in ipairs(cases) do
      prov.control(c.ctl)
      assert.equals(1, sup.tick("balance_snapshot", over(class, c.extra)))
      local rows = snapshots(class)
      assert.equals(i + 1, #rows)
      assert.is_false(rows[#rows].ok)
      assert.matches(c.want, rows[#rows].error)
      local latest = sup.with_settings({ network_class = class }, require("qtg.balances").latest, s)
      assert.equals("10", latest[1].amount, "the last good amount stays visible")
      assert.matches(c.want, latest[1].last_error)
    end
    prov.control({ service = "gateway", mode = "ok" })
  end)

  -- A provider's answer is any bytes: a character split at the 120-byte
  -- excerpt, latin-1, 0xff and NUL in a body or a depositor.
  it("records an error snapshot whatever bytes the gateway answers, and refuses a depositor that is not text", function()
    local class = sup.uid("bal-bytes")
    local R = "\239\191\189" -- U+FFFD
    local function page(depositor)
      return '{"token":"USDC","balances":[{"domain":0,"balance":"1","depositor":' .. depositor .. '}]}'
    end
    local no_dep = "gateway: balances[1] has no depositor text (at most 200 bytes of UTF-8, no NUL)"
    local cases = {
      { 500, string.rep("x", 119) .. "\226\128\162tail", "gateway: HTTP 500: " .. string.rep("x", 119) .. R .. "..." },
      { 500, "Erreur caf\233 \255\0 fin", "gateway: HTTP 500: Erreur caf" .. R .. " " .. R .. "  fin" },
      { 200, page('"0x\255"'), no_dep },
      { 200, page('"0x\\u0000"'), no_dep },
      { 200, page('{"a":1}'), no_dep },
      { 200, page('12'), no_dep },
    }
    for i, c in ipairs(cases) do
      prov.control({ service = "gateway", mode = "raw", status = c[1], body_hex = qtg.crypto.hex(c[2]) })
      assert.equals(1, sup.tick("balance_snapshot", over(class)))
      local rows = snapshots(class)
      assert.equals(i, #rows)
      assert.is_false(rows[i].ok)
      assert.equals(c[3], rows[i].error)
    end
    prov.control({ service = "gateway", mode = "ok" })
  end)

  it("stores the other venues and runs retention when one venue's write fails", function()
    local class = sup.uid("bal-iso")
    local balances = require("qtg.balances")
    local fetchers = balances.FETCHERS
    prov.control({ service = "gateway", mode = "ok", state = { gateway_balances = { [DEP1] = { ["0"] = "7" } } } })
    -- a fetcher whose amount PostgreSQL refuses: its venue's write raises
    balances.FETCHERS = { { venue_key = "broken", fetch = function() return { { asset = "USDC", amounts = { "x" } } } end },
                          fetchers[1] }
    s:query([[INSERT INTO balance_snapshots (network_class, venue_key, asset, ok, amount, captured_at)
              VALUES ($1, 'gateway', 'USDC', true, 1, now() - interval '30 days')]], class)
    local ok, n = pcall(sup.tick, "balance_snapshot", over(class, { gateway_depositors = DEP1 }))
    balances.FETCHERS = fetchers
    assert.is_true(ok, tostring(n))
    assert.equals(2, n) -- the gateway's snapshot, and the old one deleted
    local rows = snapshots(class)
    assert.same({ { "gateway", true, "7" } }, { { rows[1].venue_key, rows[1].ok, rows[1].amount } })
  end)

  it("two processes at once store one snapshot per interval, and retention deletes old ones", function()
    local class = sup.uid("bal-two")
    prov.control({ service = "gateway", mode = "slow", state = { delay = 0.3,
      gateway_balances = { [DEP1] = { ["0"] = "5" } } } })
    local go = dir .. "/go-bal"
    local env = sup.base_env{ MG_NETWORK_CLASS = class, MG_GATEWAY_API_URL = prov.url,
      MG_GATEWAY_DEPOSITORS = DEP1, MG_BALANCE_SNAPSHOT_INTERVAL_SECONDS = "60" }
    local c1 = sup.start_child(dir, "bal1", env, "balance_snapshot", 2, go)
    local c2 = sup.start_child(dir, "bal2", env, "balance_snapshot", 2, go)
    sup.write(go, "go")
    local r1, r2 = sup.wait_child(c1), sup.wait_child(c2)
    prov.control({ service = "gateway", mode = "ok" })
    assert.is_true(r1.ok and r2.ok, tostring(r1.error or r2.error))
    assert.equals(1, r1.items + r2.items)
    assert.equals(1, #snapshots(class))
    -- retention: rows older than the retention go, newer ones stay
    s:query([[INSERT INTO balance_snapshots (network_class, venue_key, asset, ok, amount, captured_at)
              SELECT $1, 'gateway', 'USDC', true, 1, now() - make_interval(days => d)
                FROM generate_series(8, 10) d]], class)
    assert.equals(3, sup.tick("balance_snapshot", { network_class = class, gateway_api_url = prov.url,
      gateway_depositors = DEP1, balance_snapshot_interval_seconds = 60,
      balance_snapshot_retention_seconds = 7 * 86400 }))
    assert.equals(1, #snapshots(class))
  end)
end)

describe("balance_history_rollup", function()
  local s, dir
  setup(function()
    sup = require "spec.lua.support.conditional"
    s = qtg.db.acquire()
    dir = sup.tmpdir()
  end)
  teardown(function()
    s:release()
    sup.stop_all()
  end)

  -- snapshots at (hours ago, minute, amount); ok = false rows are ignored
  local function put(class, list)
    for _, p in ipairs(list) do
      s:query([[INSERT INTO balance_snapshots (network_class, venue_key, asset, ok, amount, error, captured_at)
                VALUES ($1, 'gateway', 'USDC', $2, $3, $4,
                        date_trunc('hour', now()) - make_interval(hours => $5) + make_interval(mins => $6))]],
        class, p[3] ~= nil, p[3] or qtg.db.NULL, p[3] == nil and "down" or qtg.db.NULL, p[1], p[2])
    end
  end

  local function history(class, granularity)
    return sup.query([[SELECT bucket_start, open_amount::text AS o, close_amount::text AS c, min_amount::text AS lo,
                              max_amount::text AS hi, samples FROM balance_history
                        WHERE network_class = $1 AND granularity = $2 ORDER BY bucket_start]], class, granularity)
  end

  it("rolls snapshots up into hourly and daily rows, and a second pass changes nothing", function()
    local class = sup.uid("hist")
    put(class, { { 3, 10, 100 }, { 3, 40, 120 }, { 3, 50, nil }, { 2, 5, 90 }, { 2, 50, 95 }, { 2, 55, 80.5 } })
    local over = { network_class = class }
    local n = sup.tick("balance_history_rollup", over)
    local hours, days = history(class, "hour"), history(class, "day")
    assert.equals(#hours + #days, n)
    assert.equals(2, #hours)
    assert.same({ "100", "120", "100", "120", 2 }, { hours[1].o, hours[1].c, hours[1].lo, hours[1].hi, hours[1].samples })
    assert.same({ "90", "80.5", "80.5", "95", 3 }, { hours[2].o, hours[2].c, hours[2].lo, hours[2].hi, hours[2].samples })
    local samples = 0
    for _, d in ipairs(days) do samples = samples + d.samples end
    assert.equals(5, samples)
    assert.equals(0, sup.tick("balance_history_rollup", over))
    -- a late snapshot changes its hour and its day only
    put(class, { { 3, 45, 130 } })
    assert.equals(2, sup.tick("balance_history_rollup", over))
    hours = history(class, "hour")
    assert.same({ "100", "130", "100", "130", 3 }, { hours[1].o, hours[1].c, hours[1].lo, hours[1].hi, hours[1].samples })
    assert.equals(0, sup.tick("balance_history_rollup", over))
  end)

  -- The look-back starts at a bucket boundary: the bucket at its edge is
  -- recomputed from all of its snapshots, never from the part of it that is
  -- later than now() - look-back (which would shrink it on every pass).
  -- Snapshots are one a minute (hours) or one an hour (days) from a bucket
  -- before the edge one to a bucket after it; amount = the sample's index.
  local function edge_case(class, unit, step, n, edge_ago, over)
    local base = sup.query("SELECT date_trunc($1, now(), 'UTC')::text AS t", unit)[1].t
    local size = unit == "hour" and 3600 or 86400
    s:query([[INSERT INTO balance_snapshots (network_class, venue_key, asset, ok, amount, captured_at)
              SELECT $1, 'gateway', 'USDC', true, i,
                     $2::timestamptz - make_interval(secs => $3) + make_interval(secs => i * $4)
                FROM generate_series(0, $5 - 1) i]], class, base, (edge_ago + 1) * size, step, n)
    local function edge()
      return sup.query([[SELECT open_amount::text AS o, close_amount::text AS c, min_amount::text AS lo,
                                max_amount::text AS hi, samples FROM balance_history
                          WHERE network_class = $1 AND granularity = $2
                            AND bucket_start = $3::timestamptz - make_interval(secs => $4)]],
        class, unit, base, edge_ago * size)
    end
    assert.is_true(sup.tick("balance_history_rollup", over) > 0)
    local before = sup.query([[SELECT granularity, bucket_start, samples, updated_at FROM balance_history
                                WHERE network_class = $1 ORDER BY 1, 2]], class)
    assert.equals(0, sup.tick("balance_history_rollup", over), "a second pass changes nothing")
    assert.same(before, sup.query([[SELECT granularity, bucket_start, samples, updated_at FROM balance_history
                                     WHERE network_class = $1 ORDER BY 1, 2]], class))
    return edge()
  end

  it("recomputes the hour bucket at the 48 h edge from all of its snapshots", function()
    local class = sup.uid("hist-edge-h")
    -- one a minute over the hours 49, 48 (the edge) and 47 hours ago
    local rows = edge_case(class, "hour", 60, 180, 48, { network_class = class })
    assert.equals(1, #rows)
    assert.same({ "60", "119", "60", "119", 60 }, { rows[1].o, rows[1].c, rows[1].lo, rows[1].hi, rows[1].samples })
    local hours = history(class, "hour")
    assert.equals(2, #hours, "the edge hour and the next; the one before the edge is outside the window")
    assert.equals(60, hours[2].samples)
  end)

  it("recomputes the day bucket at the 8-day edge from all of its snapshots", function()
    local class = sup.uid("hist-edge-d")
    -- one an hour over the days 9, 8 (the edge) and 7 days ago; a retention
    -- longer than the look-back, so that the look-back is the edge
    local rows = edge_case(class, "day", 3600, 72, 8,
      { network_class = class, balance_snapshot_retention_seconds = 30 * 86400 })
    assert.equals(1, #rows)
    assert.same({ "24", "47", "24", "47", 24 }, { rows[1].o, rows[1].c, rows[1].lo, rows[1].hi, rows[1].samples })
    assert.equals(2, #history(class, "day"))
  end)

  it("two processes at once write each bucket once", function()
    local class = sup.uid("hist-two")
    put(class, { { 5, 1, 1 }, { 4, 1, 2 }, { 3, 1, 3 }, { 2, 1, 4 } })
    local go = dir .. "/go-hist"
    local env = sup.base_env{ MG_NETWORK_CLASS = class }
    local c1 = sup.start_child(dir, "hist1", env, "balance_history_rollup", 2, go)
    local c2 = sup.start_child(dir, "hist2", env, "balance_history_rollup", 2, go)
    sup.write(go, "go")
    local r1, r2 = sup.wait_child(c1), sup.wait_child(c2)
    assert.is_true(r1.ok and r2.ok, tostring(r1.error or r2.error))
    local buckets = count("SELECT count(*)::int AS n FROM balance_history WHERE network_class = $1", class)
    assert.equals(4 + #history(class, "day"), buckets)
    assert.equals(buckets, r1.items + r2.items)
  end)
end)
