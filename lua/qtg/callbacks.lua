-- qtg.callbacks: the policy of callback delivery (signature v3, headers,
-- what counts as delivered, the retry schedule, what is refused unsent) and
-- the console's redelivery of a dead-lettered row.  The worker that moves
-- rows is qtg.workers.callback_dispatcher; docs/callbacks.md is the
-- receiver's contract.
--
-- Signature v3: HMAC-SHA256 under the callback key (held by C; Lua only asks
-- for a MAC) over "{timestamp}\n{nonce}\n{sha256_hex(body)}", sent as 64
-- lowercase hex digits.  The timestamp is unix seconds in decimal digits, the
-- nonce 8-128 characters of [A-Za-z0-9_-]: neither can hold the "\n"
-- delimiter.  Both are fixed when the row is enqueued and sent unchanged on
-- every retry.
local qtg = require("qtg")
local cjson = require("cjson.safe")
local canon = require("qtg.canon_json")
local errors = require("qtg.errors")

local M = {}

M.SIGNATURE_VERSION = "v3"

-- Header names, exactly as the spec writes them (plus the key id).
M.HEADERS = {
  timestamp = "X-QTG-Callback-Timestamp",
  nonce = "X-QTG-Callback-Nonce",
  version = "X-QTG-Callback-Signature-Version",
  signature = "X-QTG-Callback-Signature",
  key_id = "X-QTG-Callback-Key-Id",
}

M.BACKOFF_BASE = 2           -- next_attempt_at = now + BASE ^ min(attempts, CAP)
M.BACKOFF_CAP_EXPONENT = 6   -- 2, 4, 8, 16, 32, then 64 s for every later attempt
M.MAX_PAYLOAD_BYTES = 1048576
M.MAX_RESPONSE_BYTES = 65536 -- the receiver's answer is read up to this, then dropped
M.MAX_URL_BYTES = 2048
M.MAX_ERROR_BYTES = 500
M.CONNECT_TIMEOUT_SECONDS = 5
M.NONCE_MIN, M.NONCE_MAX = 8, 128

local json = cjson.new()
json.decode_invalid_numbers(false) -- NaN, Infinity and hex are not JSON
json.decode_max_depth(64)

-- Seconds until the next attempt after `attempts` failed attempts (>= 1).
function M.backoff_seconds(attempts)
  if type(attempts) ~= "number" or attempts < 1 or attempts % 1 ~= 0 then
    error("callbacks.backoff_seconds: attempts must be an integer >= 1, got "
      .. tostring(attempts), 2)
  end
  return M.BACKOFF_BASE ^ math.min(attempts, M.BACKOFF_CAP_EXPONENT)
end

-- Seconds of backoff between the first and the last attempt of a row that
-- fails max_attempts times: 2+4+8+16 = 30 for the default 5.  Add, per
-- attempt, the delivery timeout and the dispatch interval for the longest
-- time a retry can carry the first attempt's timestamp (docs/callbacks.md).
function M.retry_horizon(max_attempts)
  local total = 0
  for a = 1, max_attempts - 1 do total = total + M.backoff_seconds(a) end
  return total
end

-- The bytes that are signed.
function M.signed_message(timestamp, nonce, body)
  return string.format("%d\n%s\n%s", timestamp, nonce, qtg.crypto.sha256_hex(body))
end

-- A timestamp and nonce that may go on the wire unchanged: nil, reason when not.
function M.check_stamp(timestamp, nonce)
  if type(timestamp) ~= "number" or timestamp <= 0 or timestamp % 1 ~= 0 then
    return nil, "callback_timestamp is not a positive integer"
  end
  if type(nonce) ~= "string" or #nonce < M.NONCE_MIN or #nonce > M.NONCE_MAX
     or nonce:find("[^A-Za-z0-9_%-]") then
    return nil, "callback_nonce is not 8-128 characters of [A-Za-z0-9_-]"
  end
  return true
end

-- A callback URL the dispatcher may POST to: http(s), a host, no
-- credentials, no whitespace or control characters, at most MAX_URL_BYTES.
function M.check_url(url)
  if type(url) ~= "string" or url == "" then return nil, "no callback_url" end
  if #url > M.MAX_URL_BYTES then return nil, "callback_url longer than " .. M.MAX_URL_BYTES end
  if url:find("[%z\1-\32\127]") then return nil, "callback_url holds whitespace or control characters" end
  local scheme, rest = url:match("^(%a[%w+.-]*)://(.*)$")
  if not scheme then return nil, "callback_url is not an absolute URL" end
  scheme = scheme:lower()
  if scheme ~= "http" and scheme ~= "https" then
    return nil, "callback_url scheme " .. scheme .. " is not http or https"
  end
  local authority = rest:match("^([^/?#]*)")
  if authority:find("@", 1, true) then return nil, "callback_url carries credentials" end
  local host, port = authority:match("^(%[[%x:.]+%])(.*)$")
  if not host then host, port = authority:match("^([^:]*)(.*)$") end
  if host == "" then return nil, "callback_url has no host" end
  if not host:match("^%[") and host:find("[^%w.-]") then return nil, "callback_url host is invalid" end
  if port ~= "" then
    local n = port:match("^:(%d+)$")
    if not n or tonumber(n) < 1 or tonumber(n) > 65535 then
      return nil, "callback_url port is invalid"
    end
  end
  return true
end

-- url with its scheme in lower case (schemes are case-insensitive, RFC 3986
-- 3.1): what is stored, so "HTTPS://..." passes the table's check as the
-- dispatcher would send it.
function M.normalize_url(url)
  return (url:gsub("^(%a[%w+.-]*)://", function(scheme) return scheme:lower() .. "://" end, 1))
end

-- The payload is the body byte for byte; it must be a JSON object.
function M.check_payload(payload)
  if type(payload) ~= "string" then return nil, "payload is not text" end
  if #payload > M.MAX_PAYLOAD_BYTES then
    return nil, "payload larger than " .. M.MAX_PAYLOAD_BYTES .. " bytes"
  end
  local value, err = canon.decode(payload, json)
  if value == nil then return nil, "payload is not valid JSON: " .. tostring(err) end
  if type(value) ~= "table" or not payload:match("^%s*{") then
    return nil, "payload is not a JSON object"
  end
  return true
end

-- Headers of one delivery; raises when no callback key is configured (a
-- deployment error: nothing is sent unsigned, and no attempt is spent).
-- key_id: an API client's own key (the row's signing_key_id, see
-- lua/qtg/api/clients.lua); nil: the host key (MG_CALLBACK_KEY_ID).
function M.headers(timestamp, nonce, body, key_id)
  local message = M.signed_message(timestamp, nonce, body)
  local signature, err
  if key_id ~= nil and key_id ~= qtg.db.NULL then
    signature, err = qtg.api_keys.sign(key_id, message)
  else
    key_id = qtg.crypto.callback_key_id()
    signature, err = qtg.crypto.hmac_callback(message)
  end
  if not signature then
    error("callbacks: cannot sign (" .. tostring(err and (err.message or err) or "no callback key")
      .. "); set MG_CALLBACK_KEY_FILE", 0)
  end
  return {
    ["Content-Type"] = "application/json",
    [M.HEADERS.timestamp] = string.format("%d", timestamp),
    [M.HEADERS.nonce] = nonce,
    [M.HEADERS.version] = M.SIGNATURE_VERSION,
    [M.HEADERS.signature] = signature,
    [M.HEADERS.key_id] = key_id,
  }
end

-- clip(s) -> a receiver's or a transport's error as last_error keeps it:
-- control bytes blanked, at most MAX_ERROR_BYTES, valid UTF-8 whatever the
-- receiver answered (a byte that starts no character, a character the cut
-- split, becomes U+FFFD): PostgreSQL refuses any other text, and the
-- outcome write that failed on it would leave the row due first for ever.
local function clip(s) return canon.excerpt(s, M.MAX_ERROR_BYTES) end
M.clip = clip

-- write_args(writes) -> the ids written (a bigint[] literal) and the
-- writes as JSON: the first two values of a dispatcher's outcome write.
-- Each last_error is made valid UTF-8 once more, the last guard before
-- PostgreSQL (clip made it so): text it refuses would fail the whole batch.
function M.write_args(writes)
  local ids = {}
  for i, w in ipairs(writes) do
    ids[i] = string.format("%d", w.id)
    if type(w.last_error) == "string" then w.last_error = canon.text_repaired(w.last_error) end
  end
  return "{" .. table.concat(ids, ",") .. "}", canon.encode(writes)
end

-- What one HTTP exchange means: {delivered=bool, status=n|nil, error=text|nil}.
-- Only a 2xx status is a delivery; the answer's body is never interpreted.
-- A 2xx whose body overflowed MAX_RESPONSE_BYTES was still accepted by the
-- receiver, so it is a delivery too.
function M.outcome(resp, err)
  if resp then
    local st = resp.status
    if type(st) == "number" and st >= 200 and st < 300 then
      return { delivered = true, status = st }
    end
    return { delivered = false, status = st,
             error = clip(string.format("http %s: %s", tostring(st), resp.body or "")) }
  end
  local kind = type(err) == "table" and err.kind or "error"
  local st = type(err) == "table" and tonumber(err.status) or nil
  if kind == "too_large" and st and st >= 200 and st < 300 then
    return { delivered = true, status = st }
  end
  local msg = type(err) == "table" and (err.message or "") or tostring(err)
  return { delivered = false, status = st, error = clip(kind .. ": " .. msg) }
end

-- What the row becomes after an attempt: the attempt's outcome row for the
-- dispatcher's write.  row: the outbox row; out: M.outcome(...);
-- max_attempts: the row's own limit.
function M.after_attempt(row, out, max_attempts)
  local attempts = row.attempts + 1
  if out.delivered then
    return { status = "delivered", attempts = attempts, outcome = "delivered" }
  end
  if attempts >= max_attempts then
    return { status = "dlq", attempts = attempts, outcome = "dlq" }
  end
  return { status = "pending", attempts = attempts, outcome = "retry",
           backoff_seconds = M.backoff_seconds(attempts) }
end

-- stamp_first_attempts(rows) -> rows: a claimed row never attempted gets
-- the time now as its stamp (`stamped` set; send_batch's write stores it
-- with the outcome, and retries keep it).  The timestamp a receiver judges
-- freshness by is the first attempt's, not the row's writing, which an
-- outage or a backlog may have left minutes behind.  Stored by the
-- dispatcher's one write, not by an UPDATE in the claim: a second UPDATE of
-- the row in the same transaction makes PostgreSQL check its foreign key
-- again, which takes FOR KEY SHARE on the request row until the commit --
-- and the node claims' FOR UPDATE ... SKIP LOCKED then skip that request
-- (an observer pass missed its node that way and waited for its fallback
-- interval, 5 s).
function M.stamp_first_attempts(rows)
  local now = math.floor(qtg.now())
  for _, row in ipairs(rows) do
    if row.attempts == 0 then
      row.callback_timestamp, row.stamped = now, true
    end
  end
  return rows
end

-- post(url, body, headers, timeout, pin) -> M.outcome(...) with
-- duration_ms: one signed POST as every sender makes it (no redirects, the
-- answer read up to MAX_RESPONSE_BYTES, connecting within
-- CONNECT_TIMEOUT_SECONDS; pin: the only addresses connected to, see
-- guard).
function M.post(url, body, headers, timeout, pin)
  local started = qtg.monotonic()
  local resp, err = qtg.http.request{
    method = "POST", url = url, headers = headers, body = body, timeout = timeout,
    connect_timeout = math.min(timeout, M.CONNECT_TIMEOUT_SECONDS),
    max_body = M.MAX_RESPONSE_BYTES, follow_redirects = false, pin = pin,
  }
  local out = M.outcome(resp, err)
  out.duration_ms = math.floor((qtg.monotonic() - started) * 1000 + 0.5)
  return out
end

-- A row of a request an API client made: its URL came from outside, so it
-- is checked again at delivery.  Decided by the request's origin, its
-- created_by "api:<client>" (the claim reads it as request_created_by), or
-- a client's signing key on the row.  Not by the key alone: a client
-- without an api_clients row has its rows signed with the host key
-- (signing_key_id NULL, sql/0081), and they would skip the check.
function M.from_api_client(row)
  if row.signing_key_id ~= nil and row.signing_key_id ~= qtg.db.NULL then return true end
  local origin = row.request_created_by
  return type(origin) == "string" and origin:sub(1, 4) == "api:"
end

-- guard(url, timeout) -> pin | nil, outcome (yields): the delivery-time
-- check of an API client's callback_url (qtg.api.ssrf.pin).  The name is
-- resolved now, within the delivery's timeout (a lookup that takes longer
-- is a failed attempt: "... does not resolve (name lookup of HOST took
-- longer than N s)"), and every address checked (refused unless
-- MG_API_CALLBACK_ALLOW_PRIVATE);
-- the POST is then pinned to those addresses, so curl connects to exactly
-- what was checked and never looks the name up again: a DNS answer that
-- changes between the check and the connection (rebinding) cannot lead
-- into the operator's network.  A refusal is a failed attempt (retried,
-- then dlq), since a name's answer may change back.
function M.guard(url, timeout)
  local ok, pin, why = pcall(require("qtg.api.ssrf").pin, url, timeout)
  if ok and pin then return pin end
  if not ok then why = tostring(pin) end
  return nil, { delivered = false, error = clip("forbidden_address: " .. why), duration_ms = 0 }
end

-- guard_all(urls, timeout) -> {url = {pin=} or {refused=outcome}} (yields):
-- M.guard of each distinct URL, all at once, so names that do not answer
-- cost a batch one timeout, not one each.
function M.guard_all(urls, timeout)
  local tasks, order = {}, {}
  for _, url in ipairs(urls) do
    if not tasks[url] then
      tasks[url] = qtg.spawn(M.guard, url, timeout)
      order[#order + 1] = url
    end
  end
  local by_url = {}
  for _, url in ipairs(order) do
    local ok, pin, refused = qtg.join(tasks[url])
    if not ok then
      pin, refused = nil, { delivered = false, error = clip("forbidden_address: " .. tostring(pin)), duration_ms = 0 }
    end
    by_url[url] = { pin = pin, refused = refused }
  end
  return by_url
end

-- send_batch(rows, t) -> writes: the middle of a delivery pass, shared by
-- the callback and the notification dispatchers.  A row t.refusal(row)
-- names a reason for is refused unsent (dlq, no attempt spent); the others
-- are signed and POSTed to t.url(row) concurrently, one task each, within
-- t.timeout, and t.attempted(row, out, next_state) is called for each
-- outcome (to log it).  writes[i] is row i's new state for the
-- dispatcher's write (`attempted` false for a refusal).  Every header is
-- made before anything is sent: a missing callback key raises with nothing
-- sent and no attempt spent.  The URLs of API clients' rows are guarded
-- (M.guard), once per URL in the batch, all at once (M.guard_all).
function M.send_batch(rows, t)
  local writes, headers = {}, {}
  for i, row in ipairs(rows) do
    local why = t.refusal(row)
    if why then
      writes[i] = { id = row.id, status = "dlq", attempts = row.attempts, attempted = false,
                    last_error = "refused unsent: " .. why }
    else
      headers[i] = M.headers(row.callback_timestamp, row.callback_nonce, row.payload, row.signing_key_id)
    end
  end
  local urls = {}
  for i, row in ipairs(rows) do
    if headers[i] and M.from_api_client(row) then urls[#urls + 1] = t.url(row) end
  end
  local by_url = M.guard_all(urls, t.timeout)
  local guards = {}   -- row i -> {pin=} or {refused=outcome}
  for i, row in ipairs(rows) do
    if headers[i] and M.from_api_client(row) then guards[i] = by_url[t.url(row)] end
  end
  local tasks = {}
  for i, row in ipairs(rows) do
    local g = guards[i] or {}
    if headers[i] and not g.refused then
      tasks[i] = qtg.spawn(M.post, t.url(row), row.payload, headers[i], t.timeout, g.pin)
    end
  end
  for i, row in ipairs(rows) do
    local refused = guards[i] and guards[i].refused
    if tasks[i] or refused then
      local ok, out = true, refused
      if tasks[i] then ok, out = qtg.join(tasks[i]) end
      if not ok then
        out = { delivered = false, error = clip("dispatcher: " .. tostring(out)), duration_ms = 0 }
      end
      local nxt = M.after_attempt(row, out, row.max_attempts)
      writes[i] = {
        id = row.id, status = nxt.status, attempts = nxt.attempts,
        backoff_seconds = nxt.backoff_seconds, outcome = nxt.outcome,
        last_error = out.error or qtg.db.NULL, last_status = out.status or qtg.db.NULL,
        attempted = true, duration_ms = out.duration_ms,
        stamp = row.stamped and row.callback_timestamp or nil,
      }
      t.attempted(row, out, nxt)
    end
  end
  return writes
end

-- Console: deliver a dead-lettered row again, as a new delivery: a new
-- outbox row with the same body and URL, a fresh timestamp and nonce,
-- attempts 0, redelivery_of = the dead row; audited in the same
-- transaction.  Returns the new row.  Raises when the row is not in dlq or
-- already has a pending redelivery.
-- A dead row whose latest redelivery is pending or delivered is refused
-- with that row's id and state; one whose redelivery died too may be
-- redelivered again.
function M.redeliver(s, outbox_id, actor)
  if type(actor) ~= "string" or actor == "" then
    error("callbacks.redeliver: actor (who asks) is required", 2)
  end
  local outbox = require("qtg.outbox")
  return s:transaction(function()
    local rows = s:query("SELECT * FROM movement_callback_outbox WHERE id = $1 FOR UPDATE", outbox_id)
    local dead = rows[1]
    if not dead then errors.raise("not_found", "callbacks.redeliver: no callback row %s", tostring(outbox_id)) end
    if dead.status ~= "dlq" then
      errors.raise("illegal_transition", "callbacks.redeliver: row %s is %s, only dlq rows are redelivered",
        tostring(outbox_id), dead.status)
    end
    -- A second redelivery says what became of the first (the dead row is
    -- locked, so two operators cannot both pass this check).
    local prev = s:query([[SELECT id, status, attempts, delivered_at FROM movement_callback_outbox
                            WHERE redelivery_of = $1 ORDER BY id DESC LIMIT 1]], dead.id)[1]
    if prev and prev.status == "pending" then
      errors.raise("conflict", "callbacks.redeliver: row %s was already redelivered as row %s, which is "
        .. "still pending (%d attempts so far); wait for it, or redeliver row %s once it is dead-lettered",
        tostring(dead.id), tostring(prev.id), prev.attempts, tostring(prev.id))
    elseif prev and prev.status == "delivered" then
      errors.raise("conflict", "callbacks.redeliver: row %s was already redelivered as row %s, delivered at %s",
        tostring(dead.id), tostring(prev.id), tostring(prev.delivered_at))
    end
    local new = s:query([[
      INSERT INTO movement_callback_outbox
        (request_id, event_type, payload, callback_url, max_attempts,
         callback_timestamp, callback_nonce, redelivery_of)
      VALUES ($1, $2, $3, $4, $5, extract(epoch from clock_timestamp())::bigint, $6, $7)
      RETURNING *]], dead.request_id, dead.event_type, dead.payload, dead.callback_url,
      qtg.settings.callback_max_attempts, qtg.crypto.nonce(), dead.id)[1]
    outbox.audit(s, actor, "callback.redeliver", "movement_callback_outbox", tostring(new.id),
      dead.request_id, { redelivery_of = dead.id, event_type = dead.event_type,
                         last_error = dead.last_error })
    return new
  end)
end

return M
