-- The README's settings table is the code's: between its settings:begin and
-- settings:end markers it must equal `qtgd settings --markdown` (generated
-- from src/qtg_settings_list.h) byte for byte.  When it does not, run
-- tools/readme-settings.
local qtg = require "qtg"

local sup -- spec/lua/support/host.lua

local q = require("spec.lua.support.common").quote

local function readme_table(text)
  local body = text:match("\n<!%-%- settings:begin %-%->\n(.-)<!%-%- settings:end %-%->\n")
  return body
end

describe("README settings table", function()
  setup(function() sup = require "spec.lua.support.host" end)

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

describe("docs/templates.md", function()
  setup(function() sup = require "spec.lua.support.host" end)

  it("lists every shipped template, and no other, in its shipped-templates table", function()
    local doc = assert(sup.read(sup.root .. "/docs/templates.md"), "no docs/templates.md")
    local section = doc:match("\n## Shipped templates\n(.-)\n## ") or doc:match("\n## Shipped templates\n(.*)$")
    assert.is_truthy(section, "docs/templates.md has no '## Shipped templates' section")
    local listed = {}
    for key in section:gmatch("\n| `([a-z][a-z0-9_]*)` |") do listed[key] = true end
    local cjson = require "cjson"
    local p = io.popen("ls " .. q(sup.root .. "/templates"))
    local shipped = {}
    for file in p:lines() do
      if file:match("%.json$") then
        local key = cjson.decode(sup.read(sup.root .. "/templates/" .. file)).template_key
        shipped[key] = true
        assert.is_true(listed[key] == true, key .. " (templates/" .. file .. ") is not in docs/templates.md")
      end
    end
    p:close()
    for key in pairs(listed) do assert.is_true(shipped[key] == true, key .. " is listed but not shipped") end
  end)
end)
