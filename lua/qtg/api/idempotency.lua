-- qtg.api.idempotency: Idempotency-Key on mutating requests (the IETF
-- httpapi draft's rules, as Stripe applies them):
--   first request with a key   -> runs; its response (errors included, but
--                                 not a 5xx) is stored for the key
--   same key, same request     -> the stored response, with
--                                 Idempotent-Replayed: true
--   same key, another request  -> 422 idempotency_mismatch
--   same key while the first is still running -> 409 idempotency_in_flight
--   no key where the route requires one (POST /v3/requests) -> 400
-- Keys are per client (the token's name) and network class (this
-- daemon's): two clients never see each other's responses, and a daemon
-- of another class never answers with this class's.  "Same request" is
-- the method, the path and the canonical JSON of the body (so spacing and
-- key order do not matter); a replayed 201 keeps its Location.  A
-- first request that died without an answer (its row still has no status
-- after MG_API_REQUEST_TIMEOUT_SECONDS twice over) is taken over by the
-- next repeat of the same request; another request under its key is 422,
-- since the first may have committed.  A 5xx answer is not stored: the key is freed for a retry.
-- Refusals before the route runs (authentication, role, rate limit,
-- ownership, a malformed body) are not stored either: nothing was done.
-- A key is kept MG_API_IDEMPOTENCY_RETENTION_SECONDS (a day) from its
-- first request: each answer stored deletes up to PURGE_BATCH keys older
-- than that, of any client, so the table holds about a day of keys
-- however many a client sends.  A repeat after that runs again: a create
-- finds its request by the request's own key, an action is refused by the
-- state it left.
local qtg = require "qtg"
local canon = require "qtg.canon_json"
local problem = require "qtg.api.problem"

local M = {}

M.MAX_KEY = 200

local CLAIM_SQL = [[
INSERT INTO api_idempotency_keys (client, network_class, idempotency_key, method, path, request_hash)
VALUES ($1, $7, $2, $3, $4, $5)
ON CONFLICT (client, network_class, idempotency_key) DO UPDATE
   SET method = EXCLUDED.method, path = EXCLUDED.path, request_hash = EXCLUDED.request_hash,
       created_at = clock_timestamp()
 WHERE api_idempotency_keys.status IS NULL
   AND api_idempotency_keys.created_at < clock_timestamp() - $6::float8 * interval '1 second'
   AND api_idempotency_keys.request_hash = EXCLUDED.request_hash
RETURNING client]]

M.PURGE_BATCH = 16

-- $1 retention seconds, $2 batch: the oldest keys past the retention, by
-- the created_at index.
M.PURGE_SQL = [[
DELETE FROM api_idempotency_keys
 WHERE ctid = ANY (ARRAY(SELECT ctid FROM api_idempotency_keys
                          WHERE created_at < clock_timestamp() - $1::float8 * interval '1 second'
                          ORDER BY created_at LIMIT $2))]]

-- purge(s): one batch of keys past the retention deleted; a failure is
-- logged, never the answer's.
function M.purge(s)
  if s:in_transaction() then return end
  local ok, err = pcall(s.query, s, M.PURGE_SQL, qtg.settings.api_idempotency_retention_seconds, M.PURGE_BATCH)
  if not ok then
    qtg.log.warn("idempotency keys past their retention not deleted", { error = canon.excerpt(err, 300) })
  end
end

function M.request_hash(method, path, body)
  return qtg.crypto.sha256_hex(method .. " " .. path .. "\n" .. (body and canon.encode(body) or ""))
end

function M.check_key(key)
  if #key < 1 or #key > M.MAX_KEY or not key:match("^[%w%-_%.:~+/=@]+$") then
    problem.raise("bad_request", "Idempotency-Key must be 1 to %d characters of letters, digits and -_.:~+/=@", M.MAX_KEY)
  end
  return key
end

-- begin(s, principal, route, req, body) -> nil (no key: the route runs
-- as it is) | {replay = {status, headers, body}} (the stored answer) |
-- the key's claim, for finish.  Raises the refusals (a missing or bad key,
-- another request under it, its first request still running).
function M.begin(s, principal, route, req, body)
  local key = req.headers["idempotency-key"]
  if key == nil then
    if route.requires_idempotency_key then
      problem.raise("missing_idempotency_key", "%s %s requires an Idempotency-Key header", route.method, route.path)
    end
    return nil
  end
  M.check_key(key)
  local hash = M.request_hash(req.method, req.path, body)
  local class = qtg.settings.network_class
  local claimed = s:query(CLAIM_SQL, principal.name, key, req.method, req.path, hash,
    qtg.settings.api_request_timeout_seconds * 2, class)[1]
  if not claimed then
    local row = s:query([[
      SELECT request_hash, status, response_body, content_type, location FROM api_idempotency_keys
       WHERE client = $1 AND network_class = $2 AND idempotency_key = $3]], principal.name, class, key)[1]
    if not row then problem.raise("conflict", "Idempotency-Key %s changed hands; retry", key) end
    if row.request_hash ~= hash then
      problem.raise("idempotency_mismatch",
        "Idempotency-Key %s was used for a different request (method, path or body)", key)
    end
    if row.status == nil or row.status == qtg.db.NULL then
      problem.raise_with("idempotency_in_flight", { retry_after = 1 },
        "the first request with Idempotency-Key %s is still running; retry later", key)
    end
    local headers = { ["Content-Type"] = row.content_type, ["Idempotent-Replayed"] = "true" }
    if row.location ~= nil and row.location ~= qtg.db.NULL then headers.Location = row.location end
    return { replay = { row.status, headers, row.response_body } }
  end
  return { client = principal.name, class = class, key = key }
end

-- finish(s, claim, call) -> status, headers, body: call's answer, stored
-- for the claimed key (a 4xx refusal it raises included); a 5xx or any
-- other failure frees the key instead (and is raised again).
function M.finish(s, claim, call)
  local function forget() M.release(s, claim) end
  local ok, status, headers, text = pcall(call)
  if not ok then
    if problem.known(status) and problem.KINDS[status.kind][1] < 500 then
      local st, h, b = problem.response(status)
      status, headers, text = st, h, b
    else
      -- the key is freed for a retry; when the failure took the session
      -- with it (the request interrupted at its deadline, a lost
      -- connection), on a session of its own: the answer said "retry",
      -- and the retry met 409 idempotency_in_flight for twice the request
      -- timeout (a review, session 43).  Freeing it early is safe: a
      -- repeated create finds its request by the request's own key, a
      -- repeated action is refused by the state the first one left.  Only
      -- when that fails too is the claim taken over after twice the
      -- request timeout (above).  The failure is raised as it was.
      if not pcall(forget) then
        local freed, err = pcall(qtg.db.with_session, function(fresh) M.release(fresh, claim) end)
        if not freed then
          qtg.log.warn("an Idempotency-Key could not be freed after its request failed",
            { key = claim.key, error = require("qtg.errors").text(err) })
        end
      end
      error(status, 0)
    end
  end
  if status >= 500 then
    forget()
  else
    s:query([[
      UPDATE api_idempotency_keys SET status = $4, response_body = $5, content_type = $6, location = $7,
             completed_at = clock_timestamp()
       WHERE client = $1 AND network_class = $2 AND idempotency_key = $3]], claim.client, claim.class, claim.key,
      status, text, headers["Content-Type"] or "application/json", headers.Location)
    M.purge(s)
  end
  return status, headers, text
end

-- release(s, claim): the claimed key freed, nothing stored for it (the
-- request was refused before its route ran).
function M.release(s, claim)
  s:query("DELETE FROM api_idempotency_keys WHERE client = $1 AND network_class = $2 AND idempotency_key = $3",
    claim.client, claim.class, claim.key)
end

-- wrap(s, principal, route, req, body, call) -> status, headers, body:
-- begin and finish on one session.
function M.wrap(s, principal, route, req, body, call)
  local claim = M.begin(s, principal, route, req, body)
  if claim == nil then return call() end
  if claim.replay then return unpack(claim.replay, 1, 3) end
  return M.finish(s, claim, call)
end

return M
