-- qtg.errors: the one error shape of qtg's Lua, and its one rendering.
--
-- An error is the table qtg.error(kind, message, fields) builds, the same
-- the host raises ({kind=, message=, ...fields} with a __tostring): kind
-- says what failed (the API maps it to an HTTP status, qtg.api.problem),
-- message says it to a person, fields carry the rest (code, sqlstate,
-- url...).  The rule (docs/host-api.md, "Errors"): database and other
-- transactional calls raise; network I/O and executor calls return nil,
-- err; input validators answer nil, reason.
--   raise(kind, fmt, ...)               error(qtg.error(kind, fmt:format(...)), 0)
--   raise_with(kind, fields, fmt, ...)  the same, with fields
--   text(e)                             one line for any raised value
local qtg = require "qtg"

local M = {}

M.new = qtg.error

function M.raise(kind, fmt, ...)
  error(qtg.error(kind, string.format(fmt, ...)), 0)
end

function M.raise_with(kind, fields, fmt, ...)
  error(qtg.error(kind, string.format(fmt, ...), fields), 0)
end

-- text(e) -> what went wrong: a table with a __tostring as it renders
-- itself (qtg errors: "kind: message"), another with a message as "kind:
-- message" (a sqlstate added, a detail on the next line), anything else as
-- tostring (nil when it is no table with a message and `strict`).  Fields are read raw: any table may be raised, and one
-- whose __index raises on a missing key (qtg.settings) must still be
-- described, not fail again.
function M.text(e, strict)
  if type(e) == "table" then
    local mt = getmetatable(e)
    if mt and mt.__tostring then
      local ok, s = pcall(tostring, e)
      if ok then return s end
    end
    local message, kind, sqlstate, detail =
      rawget(e, "message"), rawget(e, "kind"), rawget(e, "sqlstate"), rawget(e, "detail")
    if message ~= nil then
      local s = tostring(message)
      if kind ~= nil then s = tostring(kind) .. ": " .. s end
      if sqlstate ~= nil and sqlstate ~= "" then s = s .. " (sqlstate " .. tostring(sqlstate) .. ")" end
      if type(detail) == "string" and detail ~= "" then s = s .. "\n" .. detail end
      return s
    end
    if strict then return nil end
  end
  if e == nil then return "nil" end
  return tostring(e)
end

return M
