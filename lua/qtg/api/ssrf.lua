-- qtg.api.ssrf: where an API client's callback_url may point.  The callback
-- dispatcher POSTs from inside the operator's network, so a client could
-- aim it at the metadata service, the database, or the loopback console.
-- Refused (unless MG_API_CALLBACK_ALLOW_PRIVATE, which the demo and tests
-- set): loopback, private (RFC 1918, fc00::/7), link-local (169.254/16,
-- fe80::/10, which holds the cloud metadata address), unspecified, CGNAT
-- (100.64/10), multicast/reserved, and the names localhost and *.localhost,
-- *.internal, metadata.google.internal.
--
-- A literal address is checked as it is; a host name is resolved
-- (qtg.api_net.resolve, yields) and refused when any of its addresses is.
-- The dispatcher resolves the name again at delivery: pinning the address
-- checked here with CURLOPT_RESOLVE (so a name cannot answer a public
-- address now and a private one then) is not done yet: see docs/api.md.
local qtg = require "qtg"

local M = {}

local function ipv4(host)
  local a, b, c, d = host:match("^(%d+)%.(%d+)%.(%d+)%.(%d+)$")
  if not a then return nil end
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

local function v6_refused(h)
  h = h:lower()
  if h == "::" then return "an unspecified address" end
  if h == "::1" then return "a loopback address" end
  local mapped = h:match("^::ffff:(%d+%.%d+%.%d+%.%d+)$")
  if mapped then
    local a, b = ipv4(mapped)
    if a then return v4_refused(a, b) end
  end
  if h:match("^f[cd]") then return "a private (unique local) address" end
  if h:match("^fe[89ab]") then return "a link-local address" end
  if h:match("^ff") then return "a multicast address" end
  return nil
end

local NAMES = { localhost = true, ["metadata.google.internal"] = true, ["metadata"] = true }

-- check(url) -> true | nil, why
function M.check(url)
  local ok, why = require("qtg.callbacks").check_url(url)
  if not ok then return nil, why end
  if qtg.settings.api_callback_allow_private then return true end
  local authority = url:match("^[%a][%w+.-]*://([^/?#]*)")
  if not authority then return nil, "no host in the URL" end
  authority = authority:gsub("^.*@", "")
  local host = authority:match("^%[([^%]]+)%]") or authority:match("^([^:]+)") or ""
  host = host:lower():gsub("%.$", "")
  if host == "" then return nil, "no host in the URL" end
  local reason
  if host:find(":", 1, true) then reason = v6_refused(host)
  else
    local a, b = ipv4(host)
    if a then reason = v4_refused(a, b)
    elseif host:match("^[%d.]+$") or host:match("^0x") then reason = "an address in a form other than dotted decimal"
    elseif NAMES[host] or host:match("%.localhost$") or host:match("%.internal$") then reason = "a local name"
    else
      local addrs, err = qtg.api_net.resolve(host)
      if not addrs then return nil, ("%s does not resolve (%s)"):format(host, tostring(err and err.message)) end
      for _, a in ipairs(addrs) do
        local why
        if a:find(":", 1, true) then why = v6_refused(a)
        else
          local x, y = ipv4(a)
          why = x and v4_refused(x, y)
        end
        if why then reason = ("a name resolving to %s, %s"):format(a, why) break end
      end
    end
  end
  if reason then
    return nil, ("%s points at %s; callbacks go to public addresses only (MG_API_CALLBACK_ALLOW_PRIVATE)")
      :format(host, reason)
  end
  return true
end

return M
