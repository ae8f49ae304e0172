-- qtg.api.ssrf: where an API client's callback_url may point.  The callback
-- dispatcher POSTs from inside the operator's network, so a client could
-- aim it at the metadata service, the database, or the loopback console.
-- Refused (unless MG_API_CALLBACK_ALLOW_PRIVATE, which the demo and tests
-- set): loopback, private (RFC 1918, fc00::/7), link-local (169.254/16,
-- fe80::/10, which holds the cloud metadata address), unspecified, CGNAT
-- (100.64/10), multicast/reserved, IPv6 forms embedding a refused IPv4
-- address (mapped, compatible, NAT64), and the names localhost and
-- *.localhost, *.internal, metadata.google.internal.
--
-- Checked twice, by one function (pin): when the client creates the
-- request (check, which also refuses numeric spellings other than dotted
-- decimal), and again at each delivery (qtg.callbacks), since the name's
-- answer may have changed since (DNS rebinding).  pin reads the host as
-- curl will (qtg.http.target: 2130706433 and 0177.0.0.1 are 127.0.0.1),
-- resolves it (qtg.api_net.resolve, yields), refuses when any address is
-- refused, and returns the addresses, which the delivery pins
-- (qtg.http.request's pin: curl connects to one of them, looks up nothing).
local qtg = require "qtg"

local M = {}

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

local function v4_refused(a, b)
  if a == 0 then return "an unspecified address" end
  if a == 127 then return "a loopback address" end
  if a == 10 or (a == 172 and b >= 16 and b <= 31) or (a == 192 and b == 168) then return "a private address" end
  if a == 169 and b == 254 then return "a link-local (metadata) address" end
  if a == 100 and b >= 64 and b <= 127 then return "a shared (CGNAT) address" end
  if a >= 224 then return "a multicast or reserved address" end
  return nil
end

-- An IPv6 address as inet_ntop writes it (lower case, "::" compressed,
-- a trailing embedded IPv4 address in dotted form).
local function v6_refused(h)
  h = h:lower()
  if h == "::" then return "an unspecified address" end
  if h == "::1" then return "a loopback address" end
  local embedded = h:match("^::ffff:(%d+%.%d+%.%d+%.%d+)$")   -- mapped
    or h:match("^::(%d+%.%d+%.%d+%.%d+)$")                     -- compatible
    or h:match("^64:ff9b::(%d+%.%d+%.%d+%.%d+)$")              -- NAT64
  if embedded then
    local a, b = ipv4(embedded)
    if a then return v4_refused(a, b) end
  end
  if h:match("^f[cd]") then return "a private (unique local) address" end
  if h:match("^fe[89ab]") then return "a link-local address" end
  if h:match("^ff") then return "a multicast address" end
  return nil
end

local NAMES = { localhost = true, ["metadata.google.internal"] = true, ["metadata"] = true }

-- Why a numeric address (as qtg.api_net.resolve returns them) is refused, or nil.
function M.address_refused(addr)
  if addr:find(":", 1, true) then return v6_refused(addr) end
  local a, b = ipv4(addr)
  if not a then return "an address that is not numeric" end
  return v4_refused(a, b)
end

local function refusal(host, reason)
  return ("%s points at %s; callbacks go to public addresses only (MG_API_CALLBACK_ALLOW_PRIVATE)")
    :format(host, reason)
end

-- pin(url) -> addresses | nil, why (yields).  The addresses curl may
-- connect to for url, each checked; with MG_API_CALLBACK_ALLOW_PRIVATE
-- nothing is refused, but the addresses are still resolved and returned.
function M.pin(url)
  local host, port = qtg.http.target(url)
  if not host then return nil, "no host curl can read in the URL (" .. tostring(port.message) .. ")" end
  local allow = qtg.settings.api_callback_allow_private
  local name = host:lower():gsub("%.$", "")
  if not allow and (NAMES[name] or name:match("%.localhost$") or name:match("%.internal$")) then
    return nil, refusal(name, "a local name")
  end
  local addrs, err = qtg.api_net.resolve(host)
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
  addrs, why = M.pin(url)
  if not addrs then return nil, why end
  return true
end

return M
