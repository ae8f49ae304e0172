-- The conditional workers that surface things to operators:
-- ccip_stranded_reaper, capital_transfer_followup and notification_dispatcher
-- (the operators' webhook: tools/fake-providers, a real HTTP server, with
-- the callbacks' signature, schedule and dead-letter queue).  Real
-- PostgreSQL; concurrency with two child qtgd processes released together.
local qtg = require "qtg"
local cjson = require "cjson"

local sup -- spec/lua/support/conditional.lua
local side -- spec/lua/support/sidecar.lua

local KEY = "notify-spec-secret-0123456789abcdef"

local function count(sql, ...) return sup.query(sql, ...)[1].n end

-- A movement request of class `class`, moved along allowed edges to `state`.
local PATHS = {
  PENDING_APPROVAL = {}, EXECUTING = { "APPROVED", "EXECUTING" },
  COMPLETED = { "APPROVED", "EXECUTING", "COMPLETED" }, CANCELLED = { "CANCELLED" },
  MANUAL_INTERVENTION = { "APPROVED", "EXECUTING", "MANUAL_INTERVENTION" },
}
local function movement(s, T, class, state)
  local r = sup.with_settings({ network_class = class }, side.request, s, T, class, "http://127.0.0.1:9/cb")
  for _, st in ipairs(PATHS[state]) do
    s:query("UPDATE movement_requests SET request_state = $2 WHERE id = $1::uuid", r.id, st)
  end
  return r.id
end

describe("ccip_stranded_reaper", function()
  local s, s2, dir, T
  setup(function()
    sup = require "spec.lua.support.conditional"
    side = require "spec.lua.support.sidecar"
    s, s2 = qtg.db.acquire(), qtg.db.acquire()
    dir = sup.tmpdir()
    T = side.template(s, "spec_ccip_" .. sup.uid("t"):gsub("-", "_"))
  end)
  teardown(function()
    for _, x in ipairs({ s, s2 }) do
      if x:in_transaction() then x:rollback() end
      x:release()
    end
    sup.stop_all()
  end)

  local function intent(class, status, age, request_id)
    return s:query([[
      INSERT INTO ccip_send_intent (network_class, request_id, source_chain_selector, dest_chain_selector,
        status, message_id, created_at)
      VALUES ($1, $2::uuid, 5009297550715157269, 4949039107694359620, $3, $4, now() - make_interval(secs => $5))
      RETURNING id]], class, request_id or qtg.db.NULL, status,
      "0x" .. qtg.crypto.keccak256_hex(qtg.crypto.random_bytes(8)), age)[1].id
  end
  local function status(id) return s:query("SELECT status FROM ccip_send_intent WHERE id = $1::uuid", id)[1].status end

  it("strands unresolved intents past the age, surfaces them once, and leaves the rest", function()
    local class = sup.uid("ccip")
    local req = movement(s, T, class, "EXECUTING")
    local old_pending = intent(class, "pending", 7200, req)
    local old_sent = intent(class, "sent", 4000)
    local young = intent(class, "pending", 60)
    local delivered = intent(class, "delivered", 9000)
    local foreign = intent(sup.uid("ccip-other"), "pending", 9000)
    local over = { network_class = class, ccip_stranded_age_seconds = 3600 }
    assert.equals(2, sup.tick("ccip_stranded_reaper", over))
    assert.equals("stranded", status(old_pending))
    assert.equals("stranded", status(old_sent))
    assert.equals("pending", status(young))
    assert.equals("delivered", status(delivered))
    assert.equals("pending", status(foreign))
    local r = s:query("SELECT * FROM ccip_send_intent WHERE id = $1::uuid", old_sent)[1]
    assert.matches("unresolved %(sent%) for more than 3600 s", r.stranded_reason)
    local notes = s:query([[SELECT * FROM notification_outbox WHERE network_class = $1 ORDER BY id]], class)
    assert.equals(2, #notes)
    assert.equals("ccip_intent_stranded", notes[1].kind)
    assert.equals("critical", notes[1].severity)
    local cb = s:query([[SELECT payload FROM movement_callback_outbox WHERE request_id = $1::uuid
                          AND event_type = 'request_attention']], req)
    assert.equals(1, #cb)
    assert.equals("ccip_intent_stranded", cjson.decode(cb[1].payload).data.reason)
    assert.equals(2, count([[SELECT count(*)::int AS n FROM audit_outbox WHERE action = 'ccip_intent_stranded'
                              AND entity_id = ANY(ARRAY[$1, $2])]], old_pending, old_sent))
    -- again: nothing more
    assert.equals(0, sup.tick("ccip_stranded_reaper", over))
    assert.equals(2, count("SELECT count(*)::int AS n FROM notification_outbox WHERE network_class = $1", class))
    -- an operator settles one
    require("qtg.workers.ccip_stranded_reaper").resolve(s, old_sent, "console:spec", "manually executed")
    assert.equals("resolved", status(old_sent))
    assert.has_error(function()
      require("qtg.workers.ccip_stranded_reaper").resolve(s, young, "console:spec")
    end, "ccip_stranded_reaper.resolve: intent " .. young .. " is not stranded")
  end)

  it("skips an intent locked elsewhere instead of waiting", function()
    local class = sup.uid("ccip-lock")
    local a, b = intent(class, "pending", 7200), intent(class, "pending", 7200)
    s2:begin()
    s2:query("SELECT 1 FROM ccip_send_intent WHERE id = $1::uuid FOR UPDATE", a)
    assert.equals(1, sup.tick("ccip_stranded_reaper", { network_class = class, ccip_stranded_age_seconds = 3600 }))
    assert.equals("pending", status(a))
    assert.equals("stranded", status(b))
    s2:rollback()
    assert.equals(1, sup.tick("ccip_stranded_reaper", { network_class = class, ccip_stranded_age_seconds = 3600 }))
  end)

  it("two processes at once strand each intent exactly once", function()
    local class = sup.uid("ccip-two")
    for _ = 1, 120 do intent(class, "pending", 7200) end
    local go = dir .. "/go-ccip"
    local env = sup.base_env{ MG_NETWORK_CLASS = class, MG_CCIP_STRANDED_AGE_SECONDS = "3600" }
    local c1 = sup.start_child(dir, "ccip1", env, "ccip_stranded_reaper", 3, go)
    local c2 = sup.start_child(dir, "ccip2", env, "ccip_stranded_reaper", 3, go)
    sup.write(go, "go")
    local r1, r2 = sup.wait_child(c1), sup.wait_child(c2)
    assert.is_true(r1.ok, r1.error)
    assert.is_true(r2.ok, r2.error)
    assert.equals(120, r1.items + r2.items)
    assert.equals(120, count([[SELECT count(*)::int AS n FROM ccip_send_intent WHERE network_class = $1
                                AND status = 'stranded']], class))
    assert.equals(120, count("SELECT count(*)::int AS n FROM notification_outbox WHERE network_class = $1", class))
  end)
end)

describe("capital_transfer_followup", function()
  local s, dir, T
  setup(function()
    sup = require "spec.lua.support.conditional"
    side = require "spec.lua.support.sidecar"
    s = qtg.db.acquire()
    dir = sup.tmpdir()
    T = side.template(s, "spec_ctf_" .. sup.uid("t"):gsub("-", "_"))
  end)
  teardown(function()
    s:release()
    sup.stop_all()
  end)

  local function transfer(class, req, idle, followups)
    return s:query([[
      INSERT INTO capital_transfer_requests (network_class, from_venue, to_venue, asset, amount,
        movement_request_id, followups, created_by, updated_at)
      VALUES ($1, 'binance', 'gateway', 'USDC', 250000.5, $2::uuid, $3, 'console:spec',
              now() - make_interval(secs => $4))
      RETURNING id]], class, req or qtg.db.NULL, followups or 0, idle)[1].id
  end
  local function get(id) return s:query("SELECT * FROM capital_transfer_requests WHERE id = $1::uuid", id)[1] end

  it("advances stale transfers from their movement, surfaces the rest once, then leaves them", function()
    local class = sup.uid("ctf")
    local over = { network_class = class, capital_transfer_stale_seconds = 600 }
    local done_req = movement(s, T, class, "COMPLETED")
    local cancelled_req = movement(s, T, class, "CANCELLED")
    local running_req = movement(s, T, class, "EXECUTING")
    local stuck_req = movement(s, T, class, "MANUAL_INTERVENTION")
    local completed = transfer(class, done_req, 900)
    local failed = transfer(class, cancelled_req, 900)
    local running = transfer(class, running_req, 900)
    local overdue = transfer(class, running_req, 900, 3)
    local stuck = transfer(class, stuck_req, 900)
    local orphan = transfer(class, nil, 900)
    local recent = transfer(class, nil, 10)
    assert.equals(6, sup.tick("capital_transfer_followup", over))
    local t = get(completed)
    assert.equals("completed", t.status)
    assert.are_not.equal(qtg.db.NULL, t.settled_at)
    assert.equals("failed", get(failed).status)
    assert.equals("movement request CANCELLED", get(failed).status_reason)
    t = get(running)
    assert.equals("pending", t.status)
    assert.equals(1, t.followups)
    assert.equals("surfaced", get(overdue).status)
    assert.matches("still EXECUTING after 3 follow%-ups", get(overdue).status_reason)
    assert.equals("surfaced", get(stuck).status)
    assert.equals("surfaced", get(orphan).status)
    assert.equals("no movement request carries this transfer", get(orphan).status_reason)
    assert.equals("pending", get(recent).status)
    assert.equals(0, get(recent).followups)
    assert.equals(3, count([[SELECT count(*)::int AS n FROM notification_outbox WHERE network_class = $1
                              AND kind = 'capital_transfer_surfaced']], class))
    assert.equals(1, count([[SELECT count(*)::int AS n FROM movement_callback_outbox WHERE request_id = $1::uuid
                              AND event_type = 'request_attention']], stuck_req))
    -- a second pass changes nothing: the followed-up one is fresh again
    assert.equals(0, sup.tick("capital_transfer_followup", over))
    assert.equals(1, get(running).followups)
    -- the stuck movement is finished by an operator: its transfer advances
    s:query("UPDATE movement_requests SET request_state = 'CANCELLED' WHERE id = $1::uuid", stuck_req)
    assert.equals(1, sup.tick("capital_transfer_followup", over))
    assert.equals("failed", get(stuck).status)
    assert.equals(3, count([[SELECT count(*)::int AS n FROM notification_outbox WHERE network_class = $1]], class))
  end)

  it("two processes at once follow each transfer up exactly once", function()
    local class = sup.uid("ctf-two")
    for _ = 1, 50 do transfer(class, nil, 900) end
    local go = dir .. "/go-ctf"
    local env = sup.base_env{ MG_NETWORK_CLASS = class, MG_CAPITAL_TRANSFER_STALE_SECONDS = "600" }
    local c1 = sup.start_child(dir, "ctf1", env, "capital_transfer_followup", 3, go)
    local c2 = sup.start_child(dir, "ctf2", env, "capital_transfer_followup", 3, go)
    sup.write(go, "go")
    local r1, r2 = sup.wait_child(c1), sup.wait_child(c2)
    assert.is_true(r1.ok and r2.ok, tostring(r1.error or r2.error))
    assert.equals(50, r1.items + r2.items)
    assert.equals(50, count([[SELECT count(*)::int AS n FROM capital_transfer_requests WHERE network_class = $1
                               AND status = 'surfaced' AND followups = 1]], class))
    assert.equals(50, count("SELECT count(*)::int AS n FROM notification_outbox WHERE network_class = $1", class))
  end)
end)

describe("notification_dispatcher", function()
  local s, dir, prov
  setup(function()
    sup = require "spec.lua.support.conditional"
    s = qtg.db.acquire()
    dir = sup.tmpdir()
    prov = sup.start_providers(dir)
  end)
  teardown(function()
    s:release()
    sup.stop_all()
  end)

  local notify = function() return require("qtg.notifications") end

  local function enqueue(class, n, max_attempts)
    return sup.with_settings({ network_class = class, notify_max_attempts = max_attempts or 5 }, function()
      local ids = {}
      for i = 1, n do ids[i] = notify().enqueue(s, "spec_note", class .. ":" .. i, { i = i }, "info").id end
      return ids
    end)
  end

  local function env(class, extra)
    local e = sup.base_env{ MG_NETWORK_CLASS = class, MG_CALLBACK_KEY = KEY,
      MG_NOTIFY_WEBHOOK_URL = prov.url .. "/webhook/" .. class, MG_NOTIFY_TIMEOUT_SECONDS = "1.5" }
    for k, v in pairs(extra or {}) do e[k] = v end
    return e
  end

  local function run(class, ticks, extra)
    local r = sup.wait_child(sup.start_child(dir, sup.uid("nd"), env(class, extra), "notification_dispatcher",
      ticks or 1, "-"))
    assert.is_true(r.ok, r.error)
    return r
  end

  local function received(class)
    local out = {}
    for _, e in ipairs(prov.received("webhook")) do
      if e.path == "/webhook/" .. class then out[#out + 1] = e end
    end
    return out
  end

  local function note(id) return s:query("SELECT * FROM notification_outbox WHERE id = $1", id)[1] end

  it("enqueues idempotently by dedupe key", function()
    local class = sup.uid("nd-idem")
    enqueue(class, 1)
    local again = sup.with_settings({ network_class = class }, function()
      return notify().enqueue(s, "spec_note", class .. ":1", { i = 99 })
    end)
    assert.is_nil(again)
    assert.equals(1, count("SELECT count(*)::int AS n FROM notification_outbox WHERE network_class = $1", class))
    assert.has_error(function() notify().enqueue(s, "Bad Kind", "k", {}) end)
  end)

  it("delivers signed notifications to the webhook, once", function()
    local class = sup.uid("nd-ok")
    local ids = enqueue(class, 3)
    assert.equals(3, run(class).items)
    local got = received(class)
    assert.equals(3, #got)
    for _, e in ipairs(got) do
      local h = {}
      for k, v in pairs(e.headers) do h[k:lower()] = v end
      assert.equals("v3", h["x-qtg-callback-signature-version"])
      local msg = h["x-qtg-callback-timestamp"] .. "\n" .. h["x-qtg-callback-nonce"] .. "\n"
        .. qtg.crypto.sha256_hex(e.body)
      assert.equals(qtg.crypto.hmac_sha256_hex(KEY, msg), h["x-qtg-callback-signature"])
      local body = cjson.decode(e.body)
      assert.equals("spec_note", body.kind)
      assert.equals(class, body.network_class)
    end
    for _, id in ipairs(ids) do assert.equals("delivered", note(id).status) end
    assert.equals(0, run(class).items)
    assert.equals(3, #received(class))
  end)

  it("stamps a notification with its first attempt's time, not the time it was written", function()
    local class = sup.uid("nd-late")
    local id = enqueue(class, 1)[1]
    s:query("UPDATE notification_outbox SET callback_timestamp = callback_timestamp - 1200 WHERE id = $1", id)
    local written = note(id).callback_timestamp
    local started = os.time()
    assert.equals(1, run(class).items)
    local got = received(class)
    assert.equals(1, #got)
    local h = {}
    for k, v in pairs(got[1].headers) do h[k:lower()] = v end
    local sent = tonumber(h["x-qtg-callback-timestamp"])
    assert.is_true(sent >= started - 1 and sent > written + 1000, "sent stamp " .. tostring(sent))
    assert.equals(sent, note(id).callback_timestamp) -- kept for its retries
  end)

  it("retries on error status and timeout with the callbacks' schedule, then dead-letters", function()
    local class = sup.uid("nd-fail")
    local id = enqueue(class, 1, 3)[1]
    prov.control({ service = "webhook", mode = "error", status = 503 })
    run(class)
    local n = note(id)
    assert.equals("pending", n.status)
    assert.equals(1, n.attempts)
    assert.equals(503, n.last_status)
    local gap = count([[SELECT round(extract(epoch from next_attempt_at - last_attempt_at))::int AS n
                          FROM notification_outbox WHERE id = $1]], id)
    assert.equals(2, gap) -- 2^min(1, 6)
    assert.equals(0, run(class).items, "not due before its backoff")
    s:query("UPDATE notification_outbox SET next_attempt_at = now() WHERE id = $1", id)
    prov.control({ service = "webhook", mode = "hang" })
    run(class)
    n = note(id)
    assert.equals(2, n.attempts)
    assert.matches("^timeout", n.last_error)
    assert.equals(4, count([[SELECT round(extract(epoch from next_attempt_at - last_attempt_at))::int AS n
                               FROM notification_outbox WHERE id = $1]], id))
    s:query("UPDATE notification_outbox SET next_attempt_at = now() WHERE id = $1", id)
    prov.control({ service = "webhook", mode = "error", status = 500 })
    run(class)
    n = note(id)
    assert.equals("dlq", n.status)
    assert.equals(3, n.attempts)
    prov.control({ service = "webhook", mode = "ok" })
    assert.equals(0, run(class).items)
  end)

  it("without a usable webhook URL records an error, claims nothing and spends no attempt", function()
    local class = sup.uid("nd-nourl")
    local id = enqueue(class, 1)[1]
    local ok, err = pcall(sup.tick, "notification_dispatcher", { network_class = class, notify_webhook_url = "" })
    assert.is_false(ok)
    assert.matches("MG_NOTIFY_WEBHOOK_URL is unusable", tostring(err))
    assert.equals(0, note(id).attempts)
    assert.equals("pending", note(id).status)
  end)

  it("two processes at once deliver each notification exactly once", function()
    local class = sup.uid("nd-two")
    prov.control({ service = "webhook", mode = "slow", state = { delay = 0.2 } })
    enqueue(class, 12)
    local go = dir .. "/go-nd"
    -- a generous timeout: on a loaded machine a 0.5 s POST may time out
    -- before the receiver has even read it, and be retried later
    local e = env(class, { MG_NOTIFY_TIMEOUT_SECONDS = "10" })
    local c1 = sup.start_child(dir, "nd1", e, "notification_dispatcher", 4, go)
    local c2 = sup.start_child(dir, "nd2", e, "notification_dispatcher", 4, go)
    sup.write(go, "go")
    local r1, r2 = sup.wait_child(c1), sup.wait_child(c2)
    prov.control({ service = "webhook", mode = "ok" })
    assert.is_true(r1.ok and r2.ok, tostring(r1.error or r2.error))
    assert.equals(12, r1.items + r2.items)
    assert.equals(12, count([[SELECT count(*)::int AS n FROM notification_outbox WHERE network_class = $1
                               AND status = 'delivered' AND attempts = 1]], class))
    local got, nonces = received(class), {}
    assert.equals(12, #got)
    for _, e in ipairs(got) do
      local nonce = e.headers["X-QTG-Callback-Nonce"] or e.headers["x-qtg-callback-nonce"]
      assert.is_nil(nonces[nonce], "delivered twice")
      nonces[nonce] = true
    end
  end)
end)
