-- qtg.api.idempotency: Idempotency-Key on mutating requests (the IETF
-- httpapi draft's rules, as Stripe applies them):
--   first request with a key   -> runs; its response (errors included, but
--                                 not a 5xx) is stored for the key
--   same key, same request     -> the stored response, with
--                                 Idempotent-Replayed: true
--   same key, another request  -> 422 idempotency_mismatch
--   same key while the first is still running -> 409 idempotency_in_flight
--   no key where the route requires one (POST /v3/requests) -> 400
-- Keys are per client (the token's name): two clients never see each
-- other's responses.  "Same request" is the method, the path and the
-- canonical JSON of the body (so spacing and key order do not matter).  A
-- first request that died without an answer (its row still has no status
-- after MG_API_REQUEST_TIMEOUT_SECONDS twice over) is taken over by the
-- next repeat.  A 5xx answer is not stored: the key is freed for a retry.
local qtg = require "qtg"
local canon = require "qtg.canon_json"
local problem = require "qtg.api.problem"

local M = {}

M.MAX_KEY = 200

local CLAIM_SQL = [[
INSERT INTO api_idempotency_keys (client, idempotency_key, method, path, request_hash)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (client, idempotency_key) DO UPDATE
   SET method = EXCLUDED.method, path = EXCLUDED.path, request_hash = EXCLUDED.request_hash,
       created_at = clock_timestamp()
 WHERE api_idempotency_keys.status IS NULL
   AND api_idempotency_keys.created_at < clock_timestamp() - $6::float8 * interval '1 second'
RETURNING client]]

function M.request_hash(method, path, body)
  return qtg.crypto.sha256_hex(method .. " " .. path .. "\n" .. (body and canon.encode(body) or ""))
end

function M.check_key(key)
  if #key < 1 or #key > M.MAX_KEY or not key:match("^[%w%-_%.:~+/=@]+$") then
    problem.raise("bad_request", "Idempotency-Key must be 1 to %d characters of letters, digits and -_.:~+/=@", M.MAX_KEY)
  end
  return key
end

-- wrap(s, principal, route, req, body, call) -> status, headers, body
function M.wrap(s, principal, route, req, body, call)
  local key = req.headers["idempotency-key"]
  if key == nil then
    if route.requires_idempotency_key then
      problem.raise("missing_idempotency_key", "%s %s requires an Idempotency-Key header", route.method, route.path)
    end
    return call()
  end
  M.check_key(key)
  local hash = M.request_hash(req.method, req.path, body)
  local claimed = s:query(CLAIM_SQL, principal.name, key, req.method, req.path, hash,
    qtg.settings.api_request_timeout_seconds * 2)[1]
  if not claimed then
    local row = s:query([[
      SELECT request_hash, status, response_body, content_type FROM api_idempotency_keys
       WHERE client = $1 AND idempotency_key = $2]], principal.name, key)[1]
    if not row then problem.raise("conflict", "Idempotency-Key %s changed hands; retry", key) end
    if row.request_hash ~= hash then
      problem.raise("idempotency_mismatch",
        "Idempotency-Key %s was used for a different request (method, path or body)", key)
    end
    if row.status == nil or row.status == qtg.db.NULL then
      problem.raise_with("idempotency_in_flight", { retry_after = 1 },
        "the first request with Idempotency-Key %s is still running; retry later", key)
    end
    return row.status, { ["Content-Type"] = row.content_type, ["Idempotent-Replayed"] = "true" },
      row.response_body
  end
  local ok, status, headers, text = pcall(call)
  if not ok then
    if problem.known(status) and problem.KINDS[status.kind][1] < 500 then
      local st, h, b = problem.response(status)
      status, headers, text = st, h, b
    else
      s:query("DELETE FROM api_idempotency_keys WHERE client = $1 AND idempotency_key = $2", principal.name, key)
      error(status, 0)
    end
  end
  if status >= 500 then
    s:query("DELETE FROM api_idempotency_keys WHERE client = $1 AND idempotency_key = $2", principal.name, key)
  else
    s:query([[
      UPDATE api_idempotency_keys SET status = $3, response_body = $4, content_type = $5,
             completed_at = clock_timestamp()
       WHERE client = $1 AND idempotency_key = $2]], principal.name, key, status, text,
      headers["Content-Type"] or "application/json")
  end
  return status, headers, text
end

return M
