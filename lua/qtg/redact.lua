-- qtg.redact: secrets out of text that leaves the operator's own records.
--
-- Endpoints an operator configures (RPC URLs, venue URLs, the database URL)
-- often carry a key in their user part, path or query
-- (https://mainnet.example/v3/KEY), and error text quotes them.  The journal
-- and the console keep the text whole (they are the operator's); what the
-- API hands a token (a worker's last error, a balance fetch's error,
-- /readyz's details) and what the EVM adapter stores in a node's error goes
-- through here first.
local M = {}

-- The keys of key=value (or key: value) pairs whose value is a secret, in
-- any case: `password=` (libpq), `api_key=`, `token: ...`.  A bare `key` is
-- not one: "unknown key: hot-1" names a signer key, and must stay readable.
M.SECRET_KEYS = { "password", "passwd", "secret", "secret_key", "token", "access_token", "api_key",
                  "apikey", "access_key", "private_key", "signature" }

local function host_part(rest)
  return (rest:match("^([^/?#]*)"):gsub("^.*@", ""))
end

-- An http(s) endpoint as scheme://host[:port]; "?" for anything else.
function M.endpoint(url)
  local scheme, rest = tostring(url):match("^(https?://)(.*)$")
  if not scheme then return "?" end
  return scheme .. host_part(rest)
end

-- A database URL (or libpq key=value string) with its password masked;
-- the rest (host, port, database, user) is kept, since it says where.
function M.database_url(url)
  url = tostring(url or "")
  url = url:gsub("^(%a[%w+.-]*://[^:/@]*):[^@/]*@", "%1:***@")
  url = url:gsub("([?&]password=)[^&]*", "%1***")
  url = url:gsub("(password%s*=%s*)%S+", "%1***")
  return url
end

local function mask_pairs(s)
  for _, key in ipairs(M.SECRET_KEYS) do
    -- key=value / key: value, the key on a word boundary, any case
    local pat = "(%f[%w_]" .. key:gsub("%a", function(c) return "[" .. c:lower() .. c:upper() .. "]" end)
      .. "%s*[=:]%s*)([^%s&,;\"')]+)"
    s = s:gsub(pat, "%1***")
  end
  return (s:gsub("([Bb]earer%s+)[%w%-._~+/]+=*", "%1***"))
end

-- Free text (an error message) with every URL in it cut to its endpoint
-- (scheme://host[:port], "/..." when a path, query or user part was cut)
-- and the values of secret-looking key=value pairs and bearer tokens
-- masked.
function M.text(s)
  if s == nil then return nil end
  s = tostring(s):gsub("(%a[%w+.-]*://)([^%s\"'<>)]*)", function(scheme, rest)
    local host = host_part(rest)
    return scheme .. host .. ((#host < #rest) and "/..." or "")
  end)
  return mask_pairs(s)
end

return M
