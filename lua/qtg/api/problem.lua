-- qtg.api.problem: errors of the HTTP API as RFC 9457 problem+json.
--
-- Every refusal is a qtg error {kind=, message=, ...extra fields}
-- (qtg.errors); the kind decides the status (one table, KINDS), the message
-- becomes `detail`, and the extra fields go into the document as they are
-- (allowed_states, retry_after...).  qtg's lifecycle errors (qtg.requests'
-- refuse) have the same shape, so they map without translation.  An error
-- whose message is for operators only (another network class's name)
-- carries public_message, which the client gets instead.
local canon = require "qtg.canon_json"
local errors = require "qtg.errors"

local M = {}

-- The longest detail a problem document carries (bytes; "..." marks a cut).
M.MAX_DETAIL = 2048

-- kind -> status, title
M.KINDS = {
  bad_request            = { 400, "Bad Request" },
  usage                  = { 400, "Bad Request" },
  missing_idempotency_key = { 400, "Idempotency-Key Required" },
  unauthorized           = { 401, "Unauthorized" },
  forbidden              = { 403, "Forbidden" },
  not_found              = { 404, "Not Found" },
  method_not_allowed     = { 405, "Method Not Allowed" },
  illegal_transition     = { 409, "Illegal Transition" },
  idempotency_in_flight  = { 409, "Request In Flight" },
  conflict               = { 409, "Conflict" },
  too_large              = { 413, "Content Too Large" },
  unsupported_media_type = { 415, "Unsupported Media Type" },
  invalid_input          = { 422, "Invalid Input" },
  invalid_intent         = { 422, "Invalid Intent" },
  unknown_field          = { 422, "Unknown Field" },
  idempotency_mismatch   = { 422, "Idempotency-Key Reused" },
  rate_limited           = { 429, "Too Many Requests" },
  internal               = { 500, "Internal Server Error" },
  unavailable            = { 503, "Service Unavailable" },
  connection             = { 503, "Service Unavailable" },
  timeout                = { 503, "Service Unavailable" },
}

-- raise(kind, fmt, ...) / raise_with(kind, extra, fmt, ...): refuse the request.
M.raise = errors.raise
M.raise_with = errors.raise_with

-- Whether e is an error this module can show as it is (a known kind).
function M.known(e)
  return type(e) == "table" and type(e.kind) == "string" and M.KINDS[e.kind] ~= nil
end

local RESERVED = { kind = true, message = true, sqlstate = true, detail = true, constraint = true,
                   traceback = true, public_message = true }

-- document(e) -> status, document table
function M.document(e)
  local def = M.KINDS[e.kind] or M.KINDS.internal
  local doc = { type = "urn:qtg:problem:" .. (M.KINDS[e.kind] and e.kind or "internal"),
                title = def[2], status = def[1], kind = M.KINDS[e.kind] and e.kind or "internal",
                -- a detail may repeat what the client sent (a path, a
                -- header): the body stays valid UTF-8 whatever it was, and
                -- at most MAX_DETAIL bytes (it is stored with an
                -- idempotency key)
                detail = canon.excerpt(e.public_message or e.message or def[2], M.MAX_DETAIL) }
  for k, v in pairs(e) do
    if not RESERVED[k] and doc[k] == nil and type(k) == "string" then doc[k] = v end
  end
  -- illegal_transition: the states the action is allowed from, as a list
  if e.kind == "illegal_transition" and doc.allowed_states == nil then
    local allowed = tostring(e.message):match("allowed from ([%u_, ]+)")
    if allowed then
      local list = canon.array()
      for st in allowed:gmatch("[%u_]+") do list[#list + 1] = st end
      doc.allowed_states = list
    end
  end
  return def[1], doc
end

-- response(e) -> status, headers, body
function M.response(e, headers)
  local status, doc = M.document(e)
  local h = headers or {}
  h["Content-Type"] = "application/problem+json"
  if status == 401 then h["WWW-Authenticate"] = 'Bearer realm="qtg"' end
  if e.retry_after then h["Retry-After"] = tostring(e.retry_after) end
  return status, h, canon.encode(doc)
end

return M
