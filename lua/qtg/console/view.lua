-- qtg.console.view: the operator commands' answers as readable text.
--
-- A command returns plain data (arrays of rows, records) so the operator can
-- keep and index it; these functions only attach a metatable whose
-- __pretty(self) renders that data as a column table or a key: value list,
-- which qtg.console.pretty uses when the console prints the result.
local pretty = require("qtg.console.pretty")

local M = {}

M.MAX_CELL = 60  -- characters of one cell before it is cut with "..."

local function null_value()
  local ok, cjson = pcall(require, "cjson")
  return ok and cjson.null or nil
end
local NULL = null_value()

-- A string from outside (a client's intent, a provider's error text) as
-- the terminal should show it: control characters (C0, DEL, and the C1
-- range U+0080-U+009F, which some terminals read as ESC sequences: U+009B
-- is ESC [) escaped as \xNN / \uNNNN.  Printed raw, an escape sequence
-- could hide or rewrite the rows after it on an approver's screen.
-- keep_lines: newlines and tabs stay (a record's multi-line value).
local function escape_control(c) return ("\\x%02x"):format(c:byte()) end
local function escape_c1(c) return ("\\u%04x"):format(c:byte()) end
function M.visible(s, keep_lines)
  s = s:gsub(keep_lines and "[%z\1-\8\11-\31\127]" or "%c", escape_control)
  return (s:gsub("\194([\128-\159])", escape_c1))
end
local visible = M.visible

-- One value as a single-line cell.
local function cell(v)
  if v == nil or (NULL ~= nil and v == NULL) then return "-" end
  local s
  if type(v) == "string" then
    s = v
  elseif type(v) == "table" and getmetatable(v) == nil then
    s = pretty.pretty(v):gsub("%s*\n%s*", " ")
  else
    s = pretty.pretty(v)
  end
  s = visible((s:gsub("[\r\n\t]", " ")))
  if #s > M.MAX_CELL then s = s:sub(1, M.MAX_CELL - 3) .. "..." end
  return s
end
M.cell = cell

-- Seconds since the epoch as "YYYY-MM-DD HH:MM:SS" (UTC) and "in 3.2s" /
-- "4.0s ago" relative to now.
function M.when(t, now)
  if type(t) ~= "number" then return nil end
  local rel = t - (now or os.time())
  local stamp = os.date("!%Y-%m-%d %H:%M:%S", math.floor(t))
  if rel >= 0 then return string.format("%s (in %.1fs)", stamp, rel) end
  return string.format("%s (%.1fs ago)", stamp, -rel)
end

local function render_rows(rows, columns, title)
  local width, lines = {}, {}
  for i, col in ipairs(columns) do width[i] = #col end
  local cells = {}
  for r, row in ipairs(rows) do
    cells[r] = {}
    for i, col in ipairs(columns) do
      local s = cell(row[col])
      cells[r][i] = s
      if #s > width[i] then width[i] = #s end
    end
  end
  local function line(values)
    local parts = {}
    for i, v in ipairs(values) do
      parts[i] = i == #values and v or v .. string.rep(" ", width[i] - #v)
    end
    return table.concat(parts, "  ")
  end
  if title then lines[#lines + 1] = title end
  lines[#lines + 1] = line(columns)
  local rule = {}
  for i in ipairs(columns) do rule[i] = string.rep("-", width[i]) end
  lines[#lines + 1] = line(rule)
  for r in ipairs(rows) do lines[#lines + 1] = line(cells[r]) end
  lines[#lines + 1] = string.format("(%d row%s)", #rows, #rows == 1 and "" or "s")
  return table.concat(lines, "\n")
end

-- rows(list, columns, title) -> list, shown as a column table.
function M.rows(list, columns, title)
  return setmetatable(list, {
    __pretty = function(self) return render_rows(self, columns, title) end,
  })
end

local function render_record(rec, order, title)
  local lines, width, seen, keys = {}, 0, {}, {}
  for _, k in ipairs(order or {}) do
    if rec[k] ~= nil then keys[#keys + 1] = k; seen[k] = true end
  end
  local rest = {}
  for k in pairs(rec) do
    if not seen[k] and type(k) == "string" then rest[#rest + 1] = k end
  end
  table.sort(rest)
  for _, k in ipairs(rest) do keys[#keys + 1] = k end
  for _, k in ipairs(keys) do if #k > width then width = #k end end
  if title then lines[#lines + 1] = title end
  for _, k in ipairs(keys) do
    local v = rec[k]
    local s
    if type(v) == "table" and getmetatable(v) and getmetatable(v).__pretty then
      s = "\n" .. pretty.pretty(v)
    elseif type(v) == "string" then
      s = visible(v, true)
    else
      s = pretty.pretty(v)
    end
    if NULL ~= nil and v == NULL then s = "-" end
    s = s:gsub("\n", "\n  ")
    lines[#lines + 1] = k .. ":" .. string.rep(" ", width - #k + 1) .. s
  end
  return table.concat(lines, "\n")
end

-- record(table, order, title) -> table, shown as "key: value" lines, the
-- keys in `order` first, then the others sorted.
function M.record(rec, order, title)
  return setmetatable(rec, {
    __pretty = function(self) return render_record(self, order, title) end,
  })
end

-- text(s) -> a value shown as s itself (no quotes).
function M.text(s)
  return setmetatable({ text = s }, { __pretty = function(self) return self.text end })
end

return M
