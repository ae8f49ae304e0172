-- qtg.api.ssrf: where an API client's callback_url may point.  The callback
-- dispatcher POSTs from inside the operator's network, so a client could
-- aim it at the metadata service, the database, or the loopback console.
-- Refused (unless MG_API_CALLBACK_ALLOW_PRIVATE, which the demo and tests
-- set): loopback, private (RFC 1918, fc00::/7), link-local (169.254/16,
-- fe80::/10, which holds the cloud metadata address), site-local
-- (fec0::/10), unspecified, CGNAT (100.64/10), IETF protocol assignments
-- (192.0.0.0/24), benchmarking (198.18.0.0/15), multicast/reserved, the
-- local-use NAT64 prefix 64:ff9b:1::/48 (RFC 8215) whole, IPv6 forms
-- embedding a refused IPv4 address, and the names localhost and
-- *.localhost, *.internal, metadata.google.internal.  An IPv6 address is
-- parsed into its 16 bytes (any spelling: "::" anywhere, a trailing dotted
-- quad, hex in either case) and the IPv4 address it embeds is judged as
-- IPv4: mapped ::ffff:0:0/96, SIIT ::ffff:0:0:0/96, compatible ::/96,
-- NAT64 64:ff9b::/96, 6to4 2002::/16 (bits 16-47) and Teredo 2001::/32
-- (the client, bits 96-127 inverted).  inet_ntop writes a NAT64 address
-- in hex (64:ff9b::a00:1), which a match on the dotted form never saw.
--
-- Checked twice, by one function (pin): when the client creates the
-- request (check, which also refuses numeric spellings other than dotted
-- decimal), and again at each delivery (qtg.callbacks), since the name's
-- answer may have changed since (DNS rebinding).  pin reads the host as
-- curl will (qtg.http.target: 2130706433 and 0177.0.0.1 are 127.0.0.1),
-- resolves it (qtg.api_net.resolve, yields), refuses when any address is
-- refused, and returns the addresses, which the delivery pins
-- (qtg.http.request's pin: curl connects to one of them, looks up nothing).
-- The lookup has a deadline (glibc's resolver has none a caller can give:
-- a DNS server that does not answer holds it for tens of seconds): the
-- delivery's timeout (MG_CALLBACK_TIMEOUT_SECONDS) at delivery,
-- CHECK_RESOLVE_SECONDS at creation, or half the API request's own
-- timeout (MG_API_REQUEST_TIMEOUT_SECONDS) when that is shorter, so that
-- the client gets the refusal rather than a 503.  A lookup past it does
-- not resolve, like a name without an answer: the attempt fails
-- (retried), the creation is refused.
local qtg = require "qtg"

local M = {}

-- Seconds the name lookup of check (at the request's creation) may take
-- at most (check_seconds).
M.CHECK_RESOLVE_SECONDS = 10

-- A name whose lookup timed out is not asked again for STALLED_SECONDS:
-- pin answers at once that it does not resolve, so the retries of one dead
-- receiver do not each wait out the deadline again (nor send the dead
-- server more queries).  At most STALLED_MAX names are kept (past it the
-- list starts afresh).
M.STALLED_SECONDS = 30
M.STALLED_MAX = 1024
local stalled, nstalled = {}, 0

-- check_seconds() -> the deadline of check's lookup: CHECK_RESOLVE_SECONDS,
-- or half the API request's timeout when that is shorter (the other half
-- is left to the rest of the request).
function M.check_seconds()
  return math.min(M.CHECK_RESOLVE_SECONDS, qtg.settings.api_request_timeout_seconds / 2)
end

-- Dotted decimal only: four numbers 0-255 without leading zeros (which
-- some parsers, curl's among them, read as octal).
local function ipv4(host)
  local a, b, c, d = host:match("^(%d+)%.(%d+)%.(%d+)%.(%d+)$")
  if not a then return nil end
  for _, part in ipairs({ a, b, c, d }) do
    if #part > 1 and part:sub(1, 1) == "0" then return nil end
  end
  a, b, c, d = tonumber(a), tonumber(b), tonumber(c), tonumber(d)
  if a > 255 or b > 255 or c > 255 or d > 255 then return nil end
  return a, b, c, d
end

local function v4_refused(a, b, c)
  if a == 0 then return "an unspecified address" end
  if a == 127 then return "a loopback address" end
  if a == 10 or (a == 172 and b >= 16 and b <= 31) or (a == 192 and b == 168) then return "a private address" end
  if a == 169 and b == 254 then return "a link-local (metadata) address" end
  if a == 100 and b >= 64 and b <= 127 then return "a shared (CGNAT) address" end
  if a == 192 and b == 0 and c == 0 then return "an IETF protocol assignment address (192.0.0.0/24)" end
  if a == 198 and (b == 18 or b == 19) then return "a benchmarking address (198.18.0.0/15)" end
  if a >= 224 then return "a multicast or reserved address" end
  return nil
end

-- parse_v6(text) -> array of 16 bytes | nil: an IPv6 address in any
-- textual form RFC 4291 allows (a zone "%eth0" is dropped).
local function parse_v6(text)
  text = text:gsub("%%.*$", "")
  if #text < 2 or #text > 45 or not text:match("^[%x:.]+$") then return nil end
  local groups = {}
  local tail4
  local v4 = text:match(":(%d+%.%d+%.%d+%.%d+)$")
  if v4 then
    local a, b, c, d = ipv4(v4)
    if not a then return nil end
    tail4 = { a * 256 + b, c * 256 + d }
    text = text:sub(1, #text - #v4)
    if text:sub(-2) ~= "::" then text = text:sub(1, -2) end   -- "x:" before the quad, keep "::"
  elseif text:find(".", 1, true) then
    return nil
  end
  local function split(part)
    local out = {}
    if part == "" then return out end
    for g in (part .. ":"):gmatch("([^:]*):") do
      if not g:match("^%x%x?%x?%x?$") then return nil end
      out[#out + 1] = tonumber(g, 16)
    end
    return out
  end
  local head, rest = text:match("^(.-)::(.*)$")
  local left, right
  if head then
    if rest:find("::", 1, true) then return nil end
    left, right = split(head), split(rest)
    if not left or not right then return nil end
  else
    left, right = split(text), {}
    if not left then return nil end
  end
  if tail4 then right[#right + 1] = tail4[1]; right[#right + 1] = tail4[2] end
  local fill = 8 - #left - #right
  if (head and fill < 1) or (not head and fill ~= 0) then return nil end
  for _, g in ipairs(left) do groups[#groups + 1] = g end
  for _ = 1, fill do groups[#groups + 1] = 0 end
  for _, g in ipairs(right) do groups[#groups + 1] = g end
  local bytes = {}
  for i, g in ipairs(groups) do
    bytes[2 * i - 1], bytes[2 * i] = math.floor(g / 256), g % 256
  end
  return bytes
end
M.parse_v6 = parse_v6

local function zero(bytes, from, to)
  for i = from, to do if bytes[i] ~= 0 then return false end end
  return true
end

-- The refusal of the IPv4 address bytes[i..i+3] (xor: 255 for Teredo's
-- inverted client address), named as embedded in the IPv6 address.
local function embedded_refused(bytes, i, what, xor)
  local q = {}
  for k = 0, 3 do q[k + 1] = xor and (255 - bytes[i + k]) or bytes[i + k] end
  local why = v4_refused(q[1], q[2], q[3])
  if why then return ("%s (%s embedding %d.%d.%d.%d)"):format(why, what, q[1], q[2], q[3], q[4]) end
  return nil
end

local function v6_refused(h)
  local b = parse_v6(h)
  if not b then return "an address that is not numeric" end
  if zero(b, 1, 15) and b[16] == 0 then return "an unspecified address" end
  if zero(b, 1, 15) and b[16] == 1 then return "a loopback address" end
  if zero(b, 1, 10) and b[11] == 255 and b[12] == 255 then return embedded_refused(b, 13, "IPv4-mapped") end
  if zero(b, 1, 8) and b[9] == 255 and b[10] == 255 and zero(b, 11, 12) then
    return embedded_refused(b, 13, "IPv4-translated (SIIT)")
  end
  if zero(b, 1, 12) then return embedded_refused(b, 13, "IPv4-compatible") end
  if b[1] == 0 and b[2] == 0x64 and b[3] == 0xff and b[4] == 0x9b then
    if zero(b, 5, 12) then return embedded_refused(b, 13, "NAT64") end
    -- local use (RFC 8215): the operator's own translator, whatever the
    -- IPv4 address inside (its place depends on the prefix length)
    if b[5] == 0 and b[6] == 1 then return "a local-use NAT64 address (64:ff9b:1::/48)" end
  end
  if b[1] == 0x20 and b[2] == 0x02 then return embedded_refused(b, 3, "6to4") end
  if b[1] == 0x20 and b[2] == 0x01 and b[3] == 0 and b[4] == 0 then
    return embedded_refused(b, 13, "Teredo", true)
  end
  if b[1] >= 0xfc and b[1] <= 0xfd then return "a private (unique local) address" end
  if b[1] == 0xfe and b[2] >= 0x80 and b[2] <= 0xbf then return "a link-local address" end
  if b[1] == 0xfe and b[2] >= 0xc0 then return "a site-local address (fec0::/10)" end
  if b[1] == 0xff then return "a multicast address" end
  return nil
end

local NAMES = { localhost = true, ["metadata.google.internal"] = true, ["metadata"] = true }

-- Why a numeric address (as qtg.api_net.resolve returns them) is refused, or nil.
function M.address_refused(addr)
  if addr:find(":", 1, true) then return v6_refused(addr) end
  local a, b, c = ipv4(addr)
  if not a then return "an address that is not numeric" end
  return v4_refused(a, b, c)
end

local function refusal(host, reason)
  return ("%s points at %s; callbacks go to public addresses only (MG_API_CALLBACK_ALLOW_PRIVATE)")
    :format(host, reason)
end

-- pin(url[, seconds]) -> addresses | nil, why (yields).  The addresses
-- curl may connect to for url, each checked; with
-- MG_API_CALLBACK_ALLOW_PRIVATE nothing is refused, but the addresses are
-- still resolved and returned.  Every address a name resolves to is
-- checked, and the first qtg.http.MAX_PIN of them are pinned: a name of
-- more would otherwise be refused by qtg.http.request at every attempt.
-- seconds: how long the name lookup may take (qtg.api_net.resolve's
-- default, 10, when nil); one that takes longer does not resolve, why
-- naming the timeout.
function M.pin(url, seconds)
  local host, port = qtg.http.target(url)
  if not host then return nil, "no host curl can read in the URL (" .. tostring(port.message) .. ")" end
  local allow = qtg.settings.api_callback_allow_private
  local name = host:lower():gsub("%.$", "")
  if not allow and (NAMES[name] or name:match("%.localhost$") or name:match("%.internal$")) then
    return nil, refusal(name, "a local name")
  end
  local now = qtg.monotonic()
  local seen = stalled[name]
  if seen and now < seen.till then
    return nil, ("%s does not resolve (%s %.0f s ago; not asked again for %.0f s)"):format(host, seen.why,
      now - seen.at, seen.till - now)
  end
  local addrs, err = qtg.api_net.resolve(host, seconds)
  if err and err.kind == "timeout" then
    if nstalled >= M.STALLED_MAX then stalled, nstalled = {}, 0 end
    if not stalled[name] then nstalled = nstalled + 1 end
    stalled[name] = { at = now, till = qtg.monotonic() + M.STALLED_SECONDS, why = err.message }
  end
  if not addrs or #addrs == 0 then
    return nil, ("%s does not resolve (%s)"):format(host, tostring(err and err.message or "no address"))
  end
  if not allow then
    for _, a in ipairs(addrs) do
      local why = M.address_refused(a)
      if why then
        return nil, refusal(name, a == host and why or ("a name resolving to %s, %s"):format(a, why))
      end
    end
  end
  if #addrs > qtg.http.MAX_PIN then
    local first = {}
    for i = 1, qtg.http.MAX_PIN do first[i] = addrs[i] end
    addrs = first
  end
  return addrs
end

-- check(url) -> true | nil, why: a callback_url an API client may give.
function M.check(url)
  local ok, why = require("qtg.callbacks").check_url(url)
  if not ok then return nil, why end
  if qtg.settings.api_callback_allow_private then return true end
  local authority = url:match("^[%a][%w+.-]*://([^/?#]*)")
  local host = authority and (authority:match("^%[([^%]]+)%]") or authority:match("^([^:]+)")) or ""
  if not host:find(":", 1, true) and not ipv4(host)
     and (host:match("^[%d.]+$") or host:lower():match("^0x")) then
    return nil, refusal(host, "an address in a form other than dotted decimal")
  end
  local addrs
  addrs, why = M.pin(url, M.check_seconds())
  if not addrs then return nil, why end
  return true
end

return M
