-- Callback delivery (docs/callbacks.md): the signing and
-- retry policy as pure functions, then real deliveries: child qtgd processes
-- run callback_dispatcher against real HTTP receivers on 127.0.0.1
-- (tools/fake-receiver, python3), and the receivers' requests are verified
-- with implementations written apart from the sender's code (the Python
-- helper tools/callback-verify, and the documented formula computed here).
local qtg = require "qtg"
local common = require "spec.lua.support.common"
local cjson = require "cjson"
local callbacks = require "qtg.callbacks"
local dispatcher = require "qtg.workers.callback_dispatcher"

local sup -- spec/lua/support/sidecar.lua, loaded in setup
local KEY = "spec-callback-key-" .. string.rep("q", 24)

-- Rows of the outbox for requests of network class `class`, by id.
local function outbox_rows(s, class)
  return s:query([[SELECT c.*, c.delivered_at IS NOT NULL AS is_delivered
                     FROM movement_callback_outbox c
                     JOIN movement_requests r ON r.id = c.request_id
                    WHERE r.network_class = $1 ORDER BY c.id]], class)
end

local function attempts_of(s, outbox_id)
  return s:query([[SELECT attempt_no, outcome, http_status, error, duration_ms, process_id,
                          extract(epoch from next_attempt_at - attempted_at)::float8 AS step
                     FROM movement_callback_attempts WHERE outbox_id = $1
                    ORDER BY attempt_no]], outbox_id)
end

-- The child process environment for network class `class`.
local function child_env(class, key_path, extra)
  local env = { MG_NETWORK_CLASS = class, MG_CALLBACK_KEY_ID = "k1",
                MG_CALLBACK_TIMEOUT_SECONDS = "1" }
  if key_path then env.MG_CALLBACK_KEY_FILE = key_path end
  for k, v in pairs(extra or {}) do env[k] = v end
  return env
end

describe("callback policy", function()
  it("signs the documented vector: HMAC-SHA256 over ts\\nnonce\\nsha256_hex(body), lowercase hex", function()
    local body = '{"id":"req_1","status":"completed"}'
    assert.equals("35e88809634a59b5412958118a60784b90d819ea4a78d6e158cb0f9a63de8903",
      qtg.crypto.sha256_hex(body))
    local msg = callbacks.signed_message(1700000000, "n_01HZX", body)
    assert.equals("1700000000\nn_01HZX\n35e88809634a59b5412958118a60784b90d819ea4a78d6e158cb0f9a63de8903", msg)
    assert.equals("16f3027b27be7bc137eaccb898c05e6c987789ea4f0ffb2bacf0815ad5d069a2",
      qtg.crypto.hmac_sha256_hex("qtg-test-secret-0123456789abcdef", msg))
  end)

  it("backs off 2^min(attempts, 6) seconds and refuses a bad attempt count", function()
    local got = {}
    for a = 1, 9 do got[a] = callbacks.backoff_seconds(a) end
    assert.same({ 2, 4, 8, 16, 32, 64, 64, 64, 64 }, got)
    for _, bad in ipairs({ 0, -1, 1.5, "1", false }) do
      assert.has_error(function() callbacks.backoff_seconds(bad) end)
    end
    assert.equals(30, callbacks.retry_horizon(5))
    assert.equals(62, callbacks.retry_horizon(6))
    assert.equals(126, callbacks.retry_horizon(7))
    assert.equals(318, callbacks.retry_horizon(10))
    assert.equals(0, callbacks.retry_horizon(1))
  end)

  it("decides delivered, retry and dlq from the attempt count and the row's limit", function()
    local fail = { delivered = false, error = "x" }
    assert.same({ status = "pending", attempts = 1, outcome = "retry", backoff_seconds = 2 },
      callbacks.after_attempt({ attempts = 0 }, fail, 5))
    assert.same({ status = "pending", attempts = 4, outcome = "retry", backoff_seconds = 16 },
      callbacks.after_attempt({ attempts = 3 }, fail, 5))
    assert.same({ status = "dlq", attempts = 5, outcome = "dlq" },
      callbacks.after_attempt({ attempts = 4 }, fail, 5))
    assert.same({ status = "delivered", attempts = 5, outcome = "delivered" },
      callbacks.after_attempt({ attempts = 4 }, { delivered = true, status = 200 }, 5))
    assert.same({ status = "dlq", attempts = 1, outcome = "dlq" },
      callbacks.after_attempt({ attempts = 0 }, fail, 1))
  end)

  it("counts only a 2xx as delivered", function()
    for _, st in ipairs({ 200, 201, 204, 299 }) do
      assert.is_true(callbacks.outcome({ status = st, body = "" }).delivered)
    end
    for _, st in ipairs({ 100, 199, 300, 302, 400, 401, 410, 500, 503 }) do
      local o = callbacks.outcome({ status = st, body = "nope" })
      assert.is_false(o.delivered)
      assert.equals(st, o.status)
      assert.matches("^http " .. st .. ": nope$", o.error)
    end
    local t = callbacks.outcome(nil, { kind = "timeout", message = "after 1 s" })
    assert.is_false(t.delivered)
    assert.equals("timeout: after 1 s", t.error)
    assert.is_true(callbacks.outcome(nil, { kind = "too_large", status = 200, message = "m" }).delivered)
    assert.is_false(callbacks.outcome(nil, { kind = "too_large", status = 500, message = "m" }).delivered)
    assert.is_false(callbacks.outcome(nil, { kind = "too_large", message = "m" }).delivered)
    -- a receiver's long or binary answer is clipped and cleaned in last_error
    local long = callbacks.outcome({ status = 500, body = string.rep("\1x", 2000) })
    assert.is_true(#long.error <= callbacks.MAX_ERROR_BYTES + 3)
    assert.is_nil(long.error:find("[%z\1-\31]"))
  end)

  it("accepts only absolute http(s) callback URLs with a host", function()
    for _, url in ipairs({ "http://127.0.0.1:8080/cb", "https://example.com/cb?x=1&y=2",
                           "http://[::1]:9/x", "HTTPS://Example.COM", "http://a-b.c.d/p#f" }) do
      assert.is_true(callbacks.check_url(url), url)
    end
    local bad = { [""] = "no callback_url", ["ftp://host/x"] = "not http or https",
      ["http://"] = "no host", ["http:///x"] = "no host", ["example.com/x"] = "not an absolute URL",
      ["http://exa mple.com/"] = "whitespace", ["http://host/\n"] = "control",
      ["http://user:pw@host/"] = "credentials", ["http://host:0/"] = "port",
      ["http://host:70000/"] = "port", ["http://host:abc/"] = "port", ["http://ho$t/"] = "host is invalid",
      ["javascript:alert(1)"] = "not an absolute URL",
      ["http://h/" .. string.rep("a", 2100)] = "longer than" }
    for url, why in pairs(bad) do
      local ok, err = callbacks.check_url(url)
      assert.is_nil(ok, url)
      assert.matches(why, err, 1, true)
    end
    assert.is_nil(callbacks.check_url(nil))
    assert.is_nil(callbacks.check_url(42))
  end)

  it("accepts only a JSON object as payload", function()
    for _, p in ipairs({ '{"a":1}', ' {"a":[1,2],"b":{"c":null}}', "{}" }) do
      assert.is_true(callbacks.check_payload(p), p)
    end
    local bad = { "", "nope", "[1,2]", "1", '"s"', "NaN", '{"a":NaN}', '{"a":1', '{"a":0x10}',
                  '{"a":Infinity}', "null", "true" }
    for _, p in ipairs(bad) do
      local ok, err = callbacks.check_payload(p)
      assert.is_nil(ok, p)
      assert.is_string(err)
    end
    assert.is_nil(callbacks.check_payload('{"a":"' .. string.rep("x", callbacks.MAX_PAYLOAD_BYTES) .. '"}'))
    assert.is_nil(callbacks.check_payload(nil))
    assert.is_nil(callbacks.check_payload(string.rep("[", 200) .. string.rep("]", 200)))
  end)

  it("accepts only delimiter-safe stamps", function()
    assert.is_true(callbacks.check_stamp(1700000000, "kM9RZWj5jjd5B7lJGgtriA"))
    assert.is_true(callbacks.check_stamp(1, "abcdefgh"))
    for _, case in ipairs({ { 0, "abcdefgh" }, { -5, "abcdefgh" }, { 1.5, "abcdefgh" },
        { "1700000000", "abcdefgh" }, { 1700000000, "abc\ndefgh" }, { 1700000000, "abcdefg" },
        { 1700000000, string.rep("a", 129) }, { 1700000000, "abcd efgh" },
        { 1700000000, "abcd.efgh" }, { 1700000000, nil } }) do
      assert.is_nil(callbacks.check_stamp(case[1], case[2]), tostring(case[1]) .. "/" .. tostring(case[2]))
    end
  end)
end)

describe("callback delivery to real receivers", function()
  local s, dir, key_path, T

  setup(function()
    sup = require "spec.lua.support.sidecar"
    s = qtg.db.acquire()
    dir = sup.tmpdir()
    key_path = sup.key_file(dir, "k1", KEY)
    T = sup.template(s, "spec_callbacks")
  end)
  teardown(function()
    if s:in_transaction() then s:rollback() end
    s:release()
    sup.cleanup()
  end)

  it("delivers signed callbacks that verify with the Python helper and with the documented formula", function()
    local class = sup.uid("cb-ok")
    local rcv = sup.start_receiver(dir, "ok", { mode = "ok", keys = { k1 = key_path } })
    for _ = 1, 3 do sup.request(s, T, class, rcv.url) end
    local before = outbox_rows(s, class)
    assert.equals(3, #before)

    local child = sup.start_child(dir, "ok-child", child_env(class, key_path),
      { "callback_dispatcher", "30", "drain" })
    sup.wait_child(child)

    local got = sup.received(rcv)
    assert.equals(3, #got)
    local by_nonce = {}
    for _, e in ipairs(got) do
      -- verified by the receiver with tools/callback-verify (Python)
      assert.is_true(e.verdict.ok, cjson.encode(e.verdict))
      assert.equals("k1", e.verdict.key_id)
      -- and here, from the documented formula with the key we wrote
      local ts, nonce = sup.header(e, "X-QTG-Callback-Timestamp"), sup.header(e, "X-QTG-Callback-Nonce")
      local expect = qtg.crypto.hmac_sha256_hex(KEY,
        ts .. "\n" .. nonce .. "\n" .. qtg.crypto.sha256_hex(e.body))
      assert.equals(expect, sup.header(e, "X-QTG-Callback-Signature"))
      assert.equals("v3", sup.header(e, "X-QTG-Callback-Signature-Version"))
      assert.equals("k1", sup.header(e, "X-QTG-Callback-Key-Id"))
      assert.equals("application/json", sup.header(e, "Content-Type"))
      assert.equals("POST", e.method)
      by_nonce[nonce] = e
    end
    for _, row in ipairs(outbox_rows(s, class)) do
      local e = by_nonce[row.callback_nonce]
      assert.is_table(e, "no request carried nonce " .. row.callback_nonce)
      assert.equals(row.payload, e.body) -- the body is the payload, byte for byte
      assert.equals(string.format("%d", row.callback_timestamp), sup.header(e, "X-QTG-Callback-Timestamp"))
      assert.equals("delivered", row.status)
      assert.equals(1, row.attempts)
      assert.is_true(row.is_delivered)
      assert.equals(200, row.last_status)
      assert.equals(qtg.db.NULL, row.last_error)
      local att = attempts_of(s, row.id)
      assert.equals(1, #att)
      assert.equals("delivered", att[1].outcome)
      assert.equals(200, att[1].http_status)
      assert.equals(qtg.db.NULL, att[1].step)
    end
  end)

  it("has a helper that rejects a tampered body, a wrong key, a replayed nonce and a stale timestamp", function()
    local class = sup.uid("cb-verify")
    local rcv = sup.start_receiver(dir, "verify", { mode = "ok", keys = { k1 = key_path } })
    sup.request(s, T, class, rcv.url)
    sup.wait_child(sup.start_child(dir, "verify-child", child_env(class, key_path),
      { "callback_dispatcher", "30", "drain" }))
    local e = sup.received(rcv)[1]
    assert.is_table(e)
    local hfile, bfile = dir .. "/v.headers", dir .. "/v.body"
    sup.write_file(hfile, cjson.encode(e.headers))
    sup.write_file(bfile, e.body)
    local other = sup.key_file(dir, "other", "not-the-key")
    local nonces = dir .. "/nonces.sqlite"
    local function verify(args, body_path, headers_path)
      local cmd = table.concat({ common.quote(sup.root() .. "/tools/callback-verify"), args,
        "--headers", common.quote(headers_path or hfile), "--body", common.quote(body_path or bfile) }, " ")
      local p = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
      local out = p:read("*a")
      p:close()
      local rc = tonumber(out:match("rc=(%d+)%s*$"))
      local res = cjson.decode(out:match("^(%b{})"))
      return res, rc
    end
    local k1 = "--key-file " .. common.quote("k1=" .. key_path)
    local res, rc = verify(k1 .. " --nonce-db " .. common.quote(nonces))
    assert.equals(0, rc)
    assert.is_true(res.ok)
    res, rc = verify(k1 .. " --nonce-db " .. common.quote(nonces))
    assert.equals(1, rc)
    assert.equals("replayed_nonce", res.reason)
    -- the same delivery sent again 400 s later with a new timestamp (its
    -- first attempt's outcome was never recorded): still the same nonce
    local later = tonumber(sup.header(e, "X-QTG-Callback-Timestamp")) + 400
    local again = {}
    for k, v in pairs(e.headers) do again[k] = v end
    for k in pairs(again) do
      if k:lower() == "x-qtg-callback-timestamp" then again[k] = string.format("%d", later) end
      if k:lower() == "x-qtg-callback-signature" then
        again[k] = qtg.crypto.hmac_sha256_hex(KEY, callbacks.signed_message(later, sup.header(e, "X-QTG-Callback-Nonce"), e.body))
      end
    end
    local restamped = dir .. "/restamped.headers"
    sup.write_file(restamped, cjson.encode(again))
    res, rc = verify(k1 .. " --nonce-db " .. common.quote(nonces) .. " --now " .. later, nil, restamped)
    assert.equals(1, rc)
    assert.equals("replayed_nonce", res.reason)
    -- tampered body: one byte more
    local tampered = dir .. "/tampered.body"
    sup.write_file(tampered, e.body .. " ")
    res, rc = verify(k1, tampered)
    assert.equals(1, rc)
    assert.equals("signature_mismatch", res.reason)
    -- wrong key under the right id
    res = verify("--key-file " .. common.quote("k1=" .. other))
    assert.equals("signature_mismatch", res.reason)
    -- a key id the receiver does not have
    res = verify("--key-file " .. common.quote("k2=" .. key_path))
    assert.equals("unknown_key_id", res.reason)
    -- rotation overlap: both keys held, the header picks the right one
    res = verify("--key-file " .. common.quote("k2=" .. other) .. " " .. k1)
    assert.is_true(res.ok)
    -- stale and future timestamps
    local ts = tonumber(sup.header(e, "X-QTG-Callback-Timestamp"))
    res = verify(k1 .. " --tolerance 300 --now " .. (ts + 301))
    assert.equals("stale_timestamp", res.reason)
    res = verify(k1 .. " --now " .. (ts - 61))
    assert.equals("future_timestamp", res.reason)
    -- a downgraded version is refused even with a valid signature
    local h = {}
    for k, v in pairs(e.headers) do h[k] = v end
    for k in pairs(h) do
      if k:lower() == "x-qtg-callback-signature-version" then h[k] = "v2" end
    end
    local h2 = dir .. "/v2.headers"
    sup.write_file(h2, cjson.encode(h))
    res = verify(k1, nil, h2)
    assert.equals("bad_version", res.reason)
    -- usage errors exit 2
    local _, rc2 = (function()
      local p = io.popen(common.quote(sup.root() .. "/tools/callback-verify") .. " --headers x 2>&1; echo \"rc=$?\"")
      local out = p:read("*a")
      p:close()
      return out, tonumber(out:match("rc=(%d+)%s*$"))
    end)()
    assert.equals(2, rc2)
  end)

  it("retries a 500, a timeout and a refused connection after 2, 4, 8, 16 s and dead-letters the fifth failure, with one timestamp and nonce", function()
    local class = sup.uid("cb-fail")
    local r500 = sup.start_receiver(dir, "r500", { mode = "500" })
    local hang = sup.start_receiver(dir, "hang", { mode = "hang", args = { "--hang-seconds", "30" } })
    local refuse = sup.start_receiver(dir, "refuse", { mode = "refuse" })
    local req = {}
    for _, r in ipairs({ r500, hang, refuse }) do
      req[r] = sup.request(s, T, class, r.url)
    end
    local stamp = {}
    for _, row in ipairs(outbox_rows(s, class)) do
      stamp[row.request_id] = { ts = row.callback_timestamp, nonce = row.callback_nonce }
      assert.equals(5, row.max_attempts)
    end

    sup.wait_child(sup.start_child(dir, "fail-child", child_env(class, key_path),
      { "callback_dispatcher", "90", "ff" }), 120)

    local want_error = { [r500] = "^http 500: ", [hang] = "^timeout: ", [refuse] = "^refused: " }
    for _, r in ipairs({ r500, hang, refuse }) do
      local row = s:query("SELECT * FROM movement_callback_outbox WHERE request_id = $1::uuid",
        req[r].id)[1]
      assert.equals("dlq", row.status)
      assert.equals(5, row.attempts)
      assert.matches(want_error[r], row.last_error)
      -- the stamp is the first attempt's (taken then, not before the row was
      -- written: the row's default is the database's now() rounded to the
      -- second, the attempt's the clock's whole seconds, hence the 1 s) and
      -- the nonce the row's; neither changed on a retry (checked below on
      -- what the receivers saw)
      assert.is_true(row.callback_timestamp >= stamp[row.request_id].ts - 1,
        ("stamp %d, written %d"):format(row.callback_timestamp, stamp[row.request_id].ts))
      stamp[row.request_id].ts = row.callback_timestamp
      assert.equals(stamp[row.request_id].nonce, row.callback_nonce)
      local att = attempts_of(s, row.id)
      assert.equals(5, #att)
      local outcomes, steps = {}, {}
      for i, a in ipairs(att) do
        assert.equals(i, a.attempt_no)
        outcomes[i] = a.outcome
        steps[i] = a.step ~= qtg.db.NULL and a.step or "none"
        assert.matches(want_error[r], a.error)
        assert.is_true(a.duration_ms <= 2500, "an attempt is bounded by the 1 s timeout")
      end
      assert.same({ "retry", "retry", "retry", "retry", "dlq" }, outcomes)
      assert.same({ 2, 4, 8, 16, "none" }, steps)
    end
    -- what the receivers saw: five attempts, each with the same stamp and signature
    for _, r in ipairs({ r500, hang }) do
      local got = sup.received(r)
      assert.equals(5, #got)
      local st = stamp[req[r].id]
      for _, e in ipairs(got) do
        assert.equals(string.format("%d", st.ts), sup.header(e, "X-QTG-Callback-Timestamp"))
        assert.equals(st.nonce, sup.header(e, "X-QTG-Callback-Nonce"))
        assert.equals(sup.header(got[1], "X-QTG-Callback-Signature"), sup.header(e, "X-QTG-Callback-Signature"))
      end
    end
    assert.equals(0, #sup.received(refuse))
    assert.equals(500, s:query("SELECT last_status FROM movement_callback_outbox WHERE request_id = $1::uuid",
      req[r500].id)[1].last_status)
  end)

  -- A receiver's error body is outside text: bytes that are no UTF-8, or a
  -- character the 500-byte cut splits, were written into last_error, which
  -- PostgreSQL refused; the outcome write failed every pass and the oldest
  -- due row, claimed first, held every other callback of the class.
  it("records a receiver's error body that is no UTF-8 repaired, and the class's other callbacks go out", function()
    local class = sup.uid("cb-utf8")
    local split_body = string.rep("a", 489) .. "\195\169" .. string.rep("b", 20)   -- "http 500: " .. this: 500 bytes end in the middle of é
    local bad = sup.start_receiver(dir, "r-bytes", { mode = "500", args = { "--error-body", "fcfcfcfcfe41c328" } })
    local split = sup.start_receiver(dir, "r-split", { mode = "500",
      args = { "--error-body", (split_body:gsub(".", function(c) return string.format("%02x", c:byte()) end)) } })
    local good = sup.start_receiver(dir, "r-good", { keys = { k1 = key_path } })
    local req_bad = sup.request(s, T, class, bad.url)
    local req_split = sup.request(s, T, class, split.url)
    local req_good = sup.request(s, T, class, good.url)
    sup.wait_child(sup.start_child(dir, "utf8-child", child_env(class, key_path),
      { "callback_dispatcher", "90", "ff" }), 120)
    for _, req in ipairs({ req_bad, req_split }) do
      local row = s:query("SELECT * FROM movement_callback_outbox WHERE request_id = $1::uuid", req.id)[1]
      assert.same({ "dlq", 5 }, { row.status, row.attempts })
      assert.is_true(require("qtg.canon_json").text_ok(row.last_error), row.last_error)
      assert.equals(5, #attempts_of(s, row.id))
    end
    local bad_row = s:query("SELECT last_error FROM movement_callback_outbox WHERE request_id = $1::uuid", req_bad.id)[1]
    assert.equals("http 500: \239\191\189\239\191\189\239\191\189\239\191\189\239\191\189A\239\191\189(",
      bad_row.last_error)
    local split_row = s:query("SELECT last_error FROM movement_callback_outbox WHERE request_id = $1::uuid", req_split.id)[1]
    assert.equals("http 500: " .. string.rep("a", 489) .. "\239\191\189...", split_row.last_error)
    -- the healthy receiver got its callbacks, signed and verified
    local rows = s:query("SELECT status FROM movement_callback_outbox WHERE request_id = $1::uuid", req_good.id)
    assert.is_true(#rows >= 1)
    for _, r in ipairs(rows) do assert.equals("delivered", r.status) end
    local got = sup.received(good)
    assert.equals(#rows, #got)
    for _, e in ipairs(got) do assert.is_true(e.verdict.ok, e.verdict.reason) end
  end)

  it("stamps a row with its first attempt's time, not the time it was written", function()
    -- as after a dispatcher outage: rows written long ago (their default
    -- stamp, 20 minutes old, would be stale to a receiver with the usual
    -- 5-minute tolerance), delivered now
    local class = sup.uid("cb-late")
    local rcv = sup.start_receiver(dir, "late", { mode = "ok", keys = { k1 = key_path } })
    for _ = 1, 2 do sup.request(s, T, class, rcv.url) end
    s:query([[UPDATE movement_callback_outbox c SET callback_timestamp = callback_timestamp - 1200
                FROM movement_requests r WHERE r.id = c.request_id AND r.network_class = $1]], class)
    local before = {}
    for _, row in ipairs(outbox_rows(s, class)) do before[row.callback_nonce] = row.callback_timestamp end
    local started = os.time()
    sup.wait_child(sup.start_child(dir, "late-child", child_env(class, key_path),
      { "callback_dispatcher", "30", "drain" }))
    local got = sup.received(rcv)
    assert.equals(2, #got)
    for _, e in ipairs(got) do
      assert.is_true(e.verdict.ok, cjson.encode(e.verdict)) -- fresh to the receiver
      local ts = tonumber(sup.header(e, "X-QTG-Callback-Timestamp"))
      local nonce = sup.header(e, "X-QTG-Callback-Nonce")
      assert.is_true(ts >= started - 1 and ts > before[nonce] + 1000, ("sent stamp %d"):format(ts))
    end
    for _, row in ipairs(outbox_rows(s, class)) do
      assert.equals("delivered", row.status)
      -- the stored stamp is the one sent (a retry would send it again)
      local sent
      for _, e in ipairs(got) do
        if sup.header(e, "X-QTG-Callback-Nonce") == row.callback_nonce then sent = e end
      end
      assert.equals(string.format("%d", row.callback_timestamp), sup.header(sent, "X-QTG-Callback-Timestamp"))
    end
  end)

  it("a batch being written leaves its requests claimable by the node workers", function()
    -- the lane's footprint in the database, up to its commit: the claim,
    -- then the one write of the outcomes (with the first attempt's stamp)
    local class = sup.uid("cb-locks")
    local req = sup.request(s, T, class, "http://127.0.0.1:9/cb")
    local lane = qtg.db.acquire()
    local ok, err = pcall(function()
      lane:begin()
      local rows = callbacks.stamp_first_attempts(lane:query(dispatcher.CLAIM_SQL, class, dispatcher.BATCH, "{}"))
      assert.equals(1, #rows)
      assert.is_true(rows[1].stamped)
      lane:query(dispatcher.WRITE_SQL, unpack(dispatcher.write_args({
        { id = rows[1].id, status = "delivered", attempts = 1, attempted = true, outcome = "delivered",
          last_status = 200, duration_ms = 1, stamp = rows[1].callback_timestamp } }, "spec")))
      -- the node claims take the request FOR UPDATE ... SKIP LOCKED: a
      -- lock the lane held on it (FOR KEY SHARE, from a second UPDATE of a
      -- callback row re-checking its foreign key) would make them skip it
      local other = qtg.db.acquire()
      local got = other:query("SELECT id FROM movement_requests WHERE id = $1::uuid FOR UPDATE SKIP LOCKED", req.id)
      other:release()
      assert.equals(1, #got)
    end)
    pcall(lane.rollback, lane)
    lane:release()
    if not ok then error(err, 0) end
  end)

  it("delivers every callback exactly once with two processes", function()
    local class = sup.uid("cb-two")
    local rcv = sup.start_receiver(dir, "two", { mode = "ok", keys = { k1 = key_path },
                                                 args = { "--delay", "0.15" } })
    local N = 30
    for _ = 1, N do sup.request(s, T, class, rcv.url) end
    local env = child_env(class, key_path, { MG_CALLBACK_TIMEOUT_SECONDS = "10" })
    local a = sup.start_child(dir, "two-a", env, { "callback_dispatcher", "90", "drain" })
    local b = sup.start_child(dir, "two-b", env, { "callback_dispatcher", "90", "drain" })
    local ra, rb = sup.wait_child(a, 120), sup.wait_child(b, 120)
    assert.are_not.equal(ra.process_id, rb.process_id)

    local got = sup.received(rcv)
    assert.equals(N, #got)
    local seen = {}
    for _, e in ipairs(got) do
      local nonce = sup.header(e, "X-QTG-Callback-Nonce")
      assert.is_nil(seen[nonce], "nonce delivered twice: " .. tostring(nonce))
      seen[nonce] = true
      assert.is_true(e.verdict.ok)
    end
    local rows = outbox_rows(s, class)
    assert.equals(N, #rows)
    for _, row in ipairs(rows) do
      assert.equals("delivered", row.status)
      assert.equals(1, row.attempts)
      assert.is_true(seen[row.callback_nonce])
    end
    local per = s:query([[
      SELECT a.process_id, count(*)::int AS n, count(DISTINCT a.outbox_id)::int AS rows
        FROM movement_callback_attempts a
        JOIN movement_callback_outbox c ON c.id = a.outbox_id
        JOIN movement_requests r ON r.id = c.request_id
       WHERE r.network_class = $1 GROUP BY a.process_id ORDER BY a.process_id]], class)
    local total = 0
    for _, p in ipairs(per) do
      assert.equals(p.n, p.rows)
      assert.is_true(p.n > 0)
      total = total + p.n
    end
    assert.equals(N, total)
    assert.equals(2, #per, "both processes delivered a share")
  end)

  it("refuses unsent, to dlq with the reason, a non-JSON payload and invalid callback URLs", function()
    local class = sup.uid("cb-bad")
    local rcv = sup.start_receiver(dir, "bad", { mode = "ok", keys = { k1 = key_path } })
    local cases = {
      { payload = "not json {", why = "payload is not valid JSON" },
      { payload = "[1,2,3]", why = "payload is not a JSON object" },
      { url = "ftp://127.0.0.1:" .. rcv.port .. "/x", why = "is not http or https" },
      { url = "http://exa mple.com/x", why = "whitespace or control" },
      { url = "http:///x", why = "has no host" },
    }
    for _, c in ipairs(cases) do
      local r = sup.request(s, T, class, rcv.url)
      c.id = s:query([[UPDATE movement_callback_outbox
                          SET payload = coalesce($2, payload), callback_url = coalesce($3, callback_url)
                        WHERE request_id = $1::uuid RETURNING id]], r.id, c.payload, c.url)[1].id
    end
    sup.wait_child(sup.start_child(dir, "bad-child", child_env(class, key_path),
      { "callback_dispatcher", "30", "drain" }))
    for _, c in ipairs(cases) do
      local row = s:query("SELECT * FROM movement_callback_outbox WHERE id = $1", c.id)[1]
      assert.equals("dlq", row.status)
      assert.equals(0, row.attempts)
      assert.matches("refused unsent: ", row.last_error, 1, true)
      assert.matches(c.why, row.last_error, 1, true)
      assert.equals(0, #attempts_of(s, c.id))
    end
    assert.equals(0, #sup.received(rcv))
  end)

  it("bounds a slow, a cut and a never-closing answer by the timeout and retries them", function()
    local class = sup.uid("cb-body")
    local rcv = {
      slow = sup.start_receiver(dir, "slow", { mode = "slow", args = { "--trickle-interval", "0.4" } }),
      close = sup.start_receiver(dir, "close", { mode = "close" }),
      noclose = sup.start_receiver(dir, "noclose", { mode = "noclose", args = { "--hang-seconds", "30" } }),
      huge500 = sup.start_receiver(dir, "huge500", { mode = "huge",
                                                     args = { "--huge-bytes", "3000000", "--status", "500" } }),
    }
    local req = {}
    for name, r in pairs(rcv) do req[name] = sup.request(s, T, class, r.url) end
    sup.wait_child(sup.start_child(dir, "body-child", child_env(class, key_path),
      { "callback_dispatcher", "30", "once" }))
    for name, pattern in pairs({ slow = "^timeout: ", noclose = "^timeout: ", close = "^%a+: ",
                                 huge500 = "^too_large: " }) do
      local r = s:query("SELECT * FROM movement_callback_outbox WHERE request_id = $1::uuid",
        req[name].id)[1]
      assert.equals("pending", r.status, name)
      assert.equals(1, r.attempts, name)
      assert.matches(pattern, r.last_error)
      local att = attempts_of(s, r.id)
      assert.equals(1, #att)
      assert.equals(2, att[1].step)
      assert.is_true(att[1].duration_ms <= 2500, name .. " is bounded by the 1 s timeout")
      assert.equals(1, #sup.received(rcv[name]), name)
    end
    assert.is_nil(s:query("SELECT last_error FROM movement_callback_outbox WHERE request_id = $1::uuid",
      req.close.id)[1].last_error:match("^timeout"))
  end)

  -- Requests of `class` to each receiver of `order` (FIFO), one dispatcher
  -- pass in a child (callback timeout 4 s), then what it did: every row of
  -- the healthy receiver `ok` must be delivered and every other one still
  -- pending; returns the count of rows, the last healthy delivery, the
  -- hanging rows, those attempted, and the first attempt recorded on them.
  local function one_pass_with_a_hanging_receiver(class, name, order, ok)
    for _, r in ipairs(order) do sup.request(s, T, class, r.url) end
    sup.wait_child(sup.start_child(dir, name,
      child_env(class, key_path, { MG_CALLBACK_TIMEOUT_SECONDS = "4" }),
      { "callback_dispatcher", "30", "once" }))
    local rows = s:query([[
      SELECT c.callback_url, c.status, c.attempts,
             extract(epoch FROM c.delivered_at)::float8 AS delivered,
             (SELECT extract(epoch FROM min(a.attempted_at))::float8
                FROM movement_callback_attempts a WHERE a.outbox_id = c.id) AS first_attempt_done
        FROM movement_callback_outbox c JOIN movement_requests r ON r.id = c.request_id
       WHERE r.network_class = $1 ORDER BY c.id]], class)
    local o = { rows = #rows, last_ok = 0, hung = 0, tried = 0, first_hang_done = math.huge }
    for _, r in ipairs(rows) do
      if r.callback_url == ok.url then
        assert.equals("delivered", r.status)
        o.last_ok = math.max(o.last_ok, r.delivered)
      else
        assert.equals("pending", r.status)
        o.hung = o.hung + 1
        if r.attempts > 0 then
          o.tried = o.tried + 1
          o.first_hang_done = math.min(o.first_hang_done, r.first_attempt_done)
        end
      end
    end
    return o
  end

  it("a receiver that hangs holds one lane: the other receivers' callbacks go out meanwhile", function()
    local class = sup.uid("cb-lanes")
    local hang = sup.start_receiver(dir, "lanes-hang", { mode = "hang", args = { "--hang-seconds", "30" } })
    local ok = sup.start_receiver(dir, "lanes-ok", { mode = "ok", keys = { k1 = key_path } })
    -- FIFO order: a hanging row first, then healthy ones, a second hanging
    -- one, more healthy ones.  One transaction of five would hold the healthy
    -- rows of its batch until the hanging POST timed out.
    local order = { hang }
    for _ = 1, 6 do order[#order + 1] = ok end
    order[#order + 1] = hang
    for _ = 1, 6 do order[#order + 1] = ok end
    local o = one_pass_with_a_hanging_receiver(class, "lanes-child", order, ok)
    assert.equals(14, o.rows)
    -- both hanging rows went in one batch (one receiver), attempted once
    assert.equals(2, o.hung)
    assert.equals(2, o.tried)
    -- every healthy callback was delivered (committed) before the first
    -- hanging POST had even ended
    assert.is_true(o.last_ok < o.first_hang_done,
      ("last healthy delivery %.3f, first hanging attempt recorded %.3f"):format(o.last_ok, o.first_hang_done))
    assert.equals(12, #sup.received(ok))
  end)

  it("a receiver that hangs with a backlog holds one lane, not all of them", function()
    local class = sup.uid("cb-backlog")
    local hang = sup.start_receiver(dir, "backlog-hang", { mode = "hang", args = { "--hang-seconds", "30" } })
    local ok = sup.start_receiver(dir, "backlog-ok", { mode = "ok", keys = { k1 = key_path } })
    -- more hanging rows than all the lanes' batches hold, then healthy ones
    local n_hang = dispatcher.lanes() * dispatcher.BATCH + 1
    local order = {}
    for _ = 1, n_hang do order[#order + 1] = hang end
    for _ = 1, 6 do order[#order + 1] = ok end
    local o = one_pass_with_a_hanging_receiver(class, "backlog-child", order, ok)
    assert.equals(n_hang + 6, o.rows)
    assert.equals(n_hang, o.hung)
    -- one batch went to the hanging receiver; the other lanes served the
    -- healthy one, all of it before that batch's POSTs had timed out
    assert.equals(dispatcher.BATCH, o.tried)
    assert.is_true(o.last_ok < o.first_hang_done,
      ("last healthy delivery %.3f, first hanging attempt recorded %.3f"):format(o.last_ok, o.first_hang_done))
    assert.equals(6, #sup.received(ok))
  end)

  it("quotes receivers for the claim's skip list", function()
    assert.equals("{}", dispatcher.text_array({}))
    assert.equals([[{"http://a/x","http://b/\"q\"\\"}]],
      dispatcher.text_array({ "http://a/x", [[http://b/"q"\]] }))
    local back = s:query("SELECT ($1::text[])[2] AS v", dispatcher.text_array({ "a", [[b"\,{}]] }))[1].v
    assert.equals([[b"\,{}]], back)
  end)

  it("counts a 2xx whose answer is larger than it reads as delivered", function()
    local class = sup.uid("cb-huge")
    local rcv = sup.start_receiver(dir, "huge", { mode = "huge", args = { "--huge-bytes", "3000000" } })
    local r = sup.request(s, T, class, rcv.url)
    sup.wait_child(sup.start_child(dir, "huge-child", child_env(class, key_path),
      { "callback_dispatcher", "30", "once" }))
    local row = s:query("SELECT * FROM movement_callback_outbox WHERE request_id = $1::uuid", r.id)[1]
    -- needs qtg.http to report the status it saw with a too_large error (err.status)
    assert.equals("delivered", row.status, tostring(row.last_error))
    assert.equals(200, row.last_status)
    assert.equals(1, #sup.received(rcv))
  end)

  it("sends nothing and spends no attempt without a callback key", function()
    local class = sup.uid("cb-nokey")
    local rcv = sup.start_receiver(dir, "nokey", { mode = "ok" })
    local r = sup.request(s, T, class, rcv.url)
    local child = sup.start_child(dir, "nokey-child", child_env(class, nil),
      { "callback_dispatcher", "10", "once" })
    local ok, err = pcall(sup.wait_child, child, 60)
    assert.is_false(ok)
    assert.matches("MG_CALLBACK_KEY_FILE", tostring(err), 1, true)
    local row = s:query("SELECT * FROM movement_callback_outbox WHERE request_id = $1::uuid", r.id)[1]
    assert.equals("pending", row.status)
    assert.equals(0, row.attempts)
    assert.equals(0, #sup.received(rcv))
  end)

  it("redelivers a dead-lettered row as a new delivery with a fresh stamp, audited", function()
    local class = sup.uid("cb-redeliver")
    local r = sup.request(s, T, class, "http://127.0.0.1:9/never")
    local dead = s:query([[UPDATE movement_callback_outbox
                              SET status = 'dlq', attempts = 5, last_error = 'refused: spec'
                            WHERE request_id = $1::uuid RETURNING *]], r.id)[1]
    local new = callbacks.redeliver(s, dead.id, "console:spec")
    assert.equals("pending", new.status)
    assert.equals(0, new.attempts)
    assert.equals(dead.id, new.redelivery_of)
    assert.equals(dead.payload, new.payload)
    assert.equals(dead.callback_url, new.callback_url)
    assert.are_not.equal(dead.callback_nonce, new.callback_nonce)
    assert.is_true(new.callback_timestamp >= dead.callback_timestamp)
    assert.is_true(callbacks.check_stamp(new.callback_timestamp, new.callback_nonce))
    local audit = s:query([[SELECT * FROM audit_outbox WHERE action = 'callback.redeliver'
                             AND entity_id = $1]], tostring(new.id))
    assert.equals(1, #audit)
    assert.equals("console:spec", audit[1].actor)
    -- the dead row is untouched
    local again = s:query("SELECT * FROM movement_callback_outbox WHERE id = $1", dead.id)[1]
    assert.equals("dlq", again.status)
    assert.equals(5, again.attempts)
    -- one pending redelivery at a time; only dlq rows; an actor is required
    local twice = select(2, pcall(callbacks.redeliver, s, dead.id, "console:spec"))
    assert.equals("conflict", twice.kind)
    assert.matches(("row %d was already redelivered as row %d, which is still pending"):format(dead.id, new.id),
      tostring(twice), 1, true)
    assert.equals(1, tonumber(s:query("SELECT count(*) AS n FROM movement_callback_outbox WHERE redelivery_of = $1",
      dead.id)[1].n))
    -- delivered: said so, with when
    s:query("UPDATE movement_callback_outbox SET status = 'delivered', delivered_at = now() WHERE id = $1", new.id)
    assert.matches(("row %d was already redelivered as row %d, delivered at"):format(dead.id, new.id),
      tostring(select(2, pcall(callbacks.redeliver, s, dead.id, "console:spec"))), 1, true)
    -- dead-lettered too: a new redelivery is allowed
    s:query("UPDATE movement_callback_outbox SET status = 'dlq', delivered_at = NULL WHERE id = $1", new.id)
    local third = callbacks.redeliver(s, dead.id, "console:spec")
    assert.equals(dead.id, third.redelivery_of)
    assert.is_true(third.id > new.id)
    local live = select(2, pcall(callbacks.redeliver, s, third.id, "console:spec"))
    assert.equals("illegal_transition", live.kind)
    assert.matches("only dlq rows", tostring(live), 1, true)
    local none = select(2, pcall(callbacks.redeliver, s, -1, "console:spec"))
    assert.equals("not_found", none.kind)
    assert.matches("no callback row", tostring(none), 1, true)
    assert.has_error(function() callbacks.redeliver(s, dead.id, "") end)
    assert.is_false(s:in_transaction())
  end)
end)
