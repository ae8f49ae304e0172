-- qtg.api.ui: the web console's static files under /ui/ (docs/operations.md,
-- "The web console").  The files are plain HTML, CSS and JavaScript modules
-- from <root>/ui (/usr/share/qtg/ui in the package); they hold no data, so
-- they are served without a token: every datum the pages show comes from
-- the authenticated API.
--
-- Path safety is by construction, not by cleaning: a path is served only
-- when each of its segments matches SEGMENT (letters, digits, _ and -, then
-- at most one dot and a known extension), so "..", ".", hidden files,
-- backslashes, NUL and percent-encodings that decode to any of them never
-- name a file; only the extensions of TYPES are served.  libmicrohttpd
-- decodes the URL before it reaches here, so the check sees what the file
-- system would.
--
-- Every answer carries a strict Content-Security-Policy (scripts, styles
-- and images from this origin only, no inline script or style, no framing),
-- X-Frame-Options: DENY and no-referrer.
local qtg = require "qtg"

local M = {}

M.PREFIX = "/ui"
M.MAX_DEPTH = 4

M.TYPES = {
  html = "text/html; charset=utf-8",
  css = "text/css; charset=utf-8",
  js = "text/javascript; charset=utf-8",
  svg = "image/svg+xml",
  png = "image/png",
  ico = "image/x-icon",
  json = "application/json",
}

local SEGMENT = "^[%w_%-]+%.?[%w]*$"

M.CSP = table.concat({
  "default-src 'none'", "script-src 'self'", "style-src 'self'", "img-src 'self' data:",
  "connect-src 'self'", "font-src 'self'", "base-uri 'none'", "form-action 'none'",
  "frame-ancestors 'none'",
}, "; ")

local function security_headers(h)
  h["Content-Security-Policy"] = M.CSP
  h["X-Frame-Options"] = "DENY"
  h["X-Content-Type-Options"] = "nosniff"
  h["Referrer-Policy"] = "no-referrer"
  h["Cross-Origin-Opener-Policy"] = "same-origin"
  h["Cache-Control"] = "no-cache"
  return h
end

function M.dir()
  return qtg.root .. "/ui"
end

-- is_ui(path): does this path belong to the console (and not the API)?
function M.is_ui(path)
  return path == M.PREFIX or (type(path) == "string" and path:sub(1, #M.PREFIX + 1) == M.PREFIX .. "/")
end

-- resolve(path) -> relative file name, content type | nil: the file a /ui/
-- path names, or nil when the path is not one this module serves.
function M.resolve(path)
  local rest = path:sub(#M.PREFIX + 2)
  if rest == "" then rest = "index.html" end
  if #rest > 200 then return nil end
  local segs = {}
  for seg in (rest .. "/"):gmatch("([^/]*)/") do
    if not seg:match(SEGMENT) then return nil end
    segs[#segs + 1] = seg
  end
  if #segs > M.MAX_DEPTH then return nil end
  local ext = segs[#segs]:match("%.(%w+)$")
  local ctype = ext and M.TYPES[ext]
  if not ctype then return nil end
  return table.concat(segs, "/"), ctype
end

local function answer(status, ctype, body, extra)
  local h = security_headers({ ["Content-Type"] = ctype })
  for k, v in pairs(extra or {}) do h[k] = v end
  return status, h, body
end

local function not_found(path)
  return answer(404, "text/plain; charset=utf-8", "no console file " .. path .. "\n")
end

-- serve(req) -> status, headers, body
function M.serve(req)
  local path = req.path
  if req.method ~= "GET" and req.method ~= "HEAD" then
    return answer(405, "text/plain; charset=utf-8", "the console's files are read with GET\n",
      { Allow = "GET, HEAD" })
  end
  if path == M.PREFIX then
    return answer(308, "text/plain; charset=utf-8", "see /ui/\n", { Location = M.PREFIX .. "/" })
  end
  local rel, ctype = M.resolve(path)
  if not rel then return not_found(path) end
  local f = io.open(M.dir() .. "/" .. rel, "rb")
  if not f then return not_found(path) end
  local body, err = f:read("*a")
  f:close()
  -- a directory opens but does not read
  if not body then
    if err and not err:match("Is a directory") then
      qtg.log.warn("ui: cannot read a console file", { file = rel, error = tostring(err) })
    end
    return not_found(path)
  end
  return answer(200, ctype, req.method == "HEAD" and "" or body)
end

return M
