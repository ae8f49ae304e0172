-- qtg.signer prelude (src/lua_signer.c runs it with the signer table):
-- keys/address/health/sign over raw_call, parsing the signer's one-line
-- answers into values or structured errors.
local signer = ...
local raw = signer.raw_call
local function call(line)
  local answer, err = raw(line)
  if not answer then return nil, err end
  local ok = answer:match('^OK ?(.*)$')
  if ok then return ok end
  local code, reason = answer:match('^REFUSED ([A-Z0-9_]+) ?(.*)$')
  if code == 'SIGNER_DB_UNAVAILABLE' then
    return nil, setmetatable({ kind = 'signer_unavailable', code = code, message = reason }, signer.error_mt)
  end
  if code then return nil, setmetatable({ kind = 'signer', code = code, message = reason }, signer.error_mt) end
  return nil, setmetatable({ kind = 'signer_unavailable', message = 'the signer answered garbage' }, signer.error_mt)
end
local function bad(msg)
  return nil, setmetatable({ kind = 'signer', code = 'SIGNER_BAD_REQUEST', message = msg }, signer.error_mt)
end
local function key_ok(name) return type(name) == 'string' and #name <= 64 and name:match('^[A-Za-z0-9_.-]+$') ~= nil end
function signer.keys()
  local s, err = call('KEYS')
  local out = {}
  for w in (s or ''):gmatch('%S+') do out[#out + 1] = w end
  return out, err
end
-- approvals() -> how the signer counts approvals: {mode = "enrolled",
-- deployment =, digest =} (its enrolment's name and SHA-256), {mode =
-- "trusting-rows"} (MG_SIGNER_TRUST_APPROVAL_ROWS) or {mode = "none"} (no
-- key, nothing to sign); nil, err when it cannot be asked or its enrolment
-- broke at a reload (code APPROVERS_UNREADABLE).
function signer.approvals()
  local s, err = call('APPROVALS')
  if not s then return nil, err end
  local deployment, digest = s:match('^enrolled ([A-Za-z0-9_.-]+) (%x+)$')
  if deployment and #digest == 64 then return { mode = 'enrolled', deployment = deployment, digest = digest } end
  if s == 'trusting-rows' or s == 'none' then return { mode = s } end
  return nil, setmetatable({ kind = 'signer_unavailable', message = 'the signer answered garbage' }, signer.error_mt)
end
function signer.address(name)
  if not key_ok(name) then return bad('key name must be 1-64 of [A-Za-z0-9_.-]') end
  return call('ADDRESS ' .. name)
end
function signer.health(name)
  local a, err = signer.address(name)
  if a then return { ok = true, signer_address = a } end
  return { ok = false, error = tostring(err.message), code = err.code or 'SIGNER_UNAVAILABLE' }
end
-- A SIGN or FILL line's answer (OK's words): {signature=, r=, s=, recid=,
-- address=}, or nil, err when it is not a signature and an address.
local function signed(line)
  local s, err = call(line)
  if not s then return nil, err end
  local sig, addr = s:match('^(0x%x+) (0x%x+)$')
  if not sig or #sig ~= 132 then
    return nil, setmetatable({ kind = 'signer_unavailable', message = 'the signer answered garbage' }, signer.error_mt)
  end
  return { signature = sig, r = '0x' .. sig:sub(3, 66), s = '0x' .. sig:sub(67, 130),
           recid = tonumber(sig:sub(131, 132), 16), address = addr }
end
-- fill(name, {payload=, principal=, signature=}) -> {signature=, r=, s=,
-- recid=, address=}: a fill of a nonce (the signer checks the payload is a
-- transfer of nothing to the key's own address at a nonce it granted a
-- transfer at, and, with an enrolment, the person's signature).
function signer.fill(name, req)
  if not key_ok(name) then return bad('key name must be 1-64 of [A-Za-z0-9_.-]') end
  if type(req) ~= 'table' or type(req.payload) ~= 'string' then return bad('fill needs {payload=, principal=}') end
  local principal, sig = req.principal, req.signature
  if type(principal) ~= 'string' or not principal:match('^[a-z]+:[^%s,]+$') or #principal > 128 then
    return bad('fill needs the principal who asks (KIND:NAME)')
  end
  if sig ~= nil and (type(sig) ~= 'string' or not sig:match('^%x+$') or #sig ~= 128) then
    return bad('a fill signature is 128 hex digits')
  end
  return signed(string.format('FILL %s %s %s %s', name, req.payload, principal, sig or '-'))
end
function signer.sign(name, req)
  if not key_ok(name) then return bad('key name must be 1-64 of [A-Za-z0-9_.-]') end
  if type(req) ~= 'table' then return bad('sign_request must be a table') end
  local rid, nid, attempt, payload = req.request_id, req.request_node_id, req.attempt_no, req.payload
  if type(rid) ~= 'string' or type(nid) ~= 'string' then return bad('sign_request needs request_id and request_node_id') end
  if type(attempt) ~= 'number' or attempt < 1 or attempt ~= math.floor(attempt) then
    return bad('sign_request.attempt_no must be an integer from 1')
  end
  if type(payload) ~= 'string' then return bad('sign_request.payload must be 0x hex') end
  local r, err = signed(string.format('SIGN %s %s %d %s %s', rid:lower(), nid:lower(), attempt, name, payload))
  if r then r.payload_hash = req.payload_hash end
  return r, err
end
