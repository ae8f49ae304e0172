-- The README's settings table is the code's: between its settings:begin and
-- settings:end markers it must equal `qtgd settings --markdown` (generated
-- from src/qtg_settings_list.h) byte for byte.  When it does not, run
-- tools/readme-settings.
local qtg = require "qtg"

local sup -- spec/lua/host_support.lua

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function readme_table(text)
  local body = text:match("\n<!%-%- settings:begin %-%->\n(.-)<!%-%- settings:end %-%->\n")
  return body
end

describe("README settings table", function()
  setup(function() sup = require "spec.lua.host_support" end)

  it("equals `qtgd settings --markdown`", function()
    local readme = assert(sup.read(sup.root .. "/README.md"), "no README.md")
    local table_text = readme_table(readme)
    assert.is_truthy(table_text, "README.md has no <!-- settings:begin --> ... <!-- settings:end --> block")
    local p = io.popen(q(sup.bin) .. " settings --markdown")
    local generated = p:read("*a")
    p:close()
    assert.is_true(#generated > 100, generated)
    assert.equals(generated, table_text,
      "README.md's settings table differs from `qtgd settings --markdown`: run tools/readme-settings")
  end)

  it("lists every setting of this qtgd, once", function()
    local table_text = readme_table(sup.read(sup.root .. "/README.md")) or ""
    local seen, n = {}, 0
    for name in table_text:gmatch("\n| `(MG_[A-Z0-9_]+)` |") do
      assert.is_nil(seen[name], name .. " twice")
      seen[name] = true
      n = n + 1
    end
    local rows = qtg.settings_list()
    assert.equals(#rows, n)
    for _, r in ipairs(rows) do assert.is_true(seen[r.name], r.name .. " is missing") end
  end)
end)
