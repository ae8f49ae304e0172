-- console_spec: the Lua side of the operator console -- the pretty printer,
-- evaluation (bare expressions, =expr, incomplete chunks, errors with
-- tracebacks), completion, the column views, and the reload module's file
-- listing and failure reporting.  The request, lifecycle and signer
-- commands' database effects are console_lifecycle_spec's; the socket, the
-- worker commands and live reload in a running daemon are driven end to end
-- by spec/c/test_console.c.
local pretty = require("qtg.console.pretty")
local eval = require("qtg.console.eval")
local complete = require("qtg.console.complete")
local view = require("qtg.console.view")

describe("console pretty printer", function()
  local p = pretty.pretty

  it("prints scalars as Lua would read them", function()
    assert.equal("1", p(1))
    assert.equal("-3", p(-3))
    assert.equal("0.5", p(0.5))
    assert.equal("1e+300", p(1e300))
    assert.equal("inf", p(math.huge))
    assert.equal("nan", p(0 / 0))
    assert.equal("true", p(true))
    assert.equal("nil", p(nil))
    assert.equal('"a\\nb\\t\\"q\\"\\\\"', p('a\nb\t"q"\\'))
    assert.equal('"\\000\\027x"', p("\0\27x"))
  end)

  it("sorts keys: array part first, then numbers, then strings", function()
    assert.equal('{ 10, 20, [5] = "five", a = 1, b = 2, ["not id"] = 3 }',
      p({ 10, 20, b = 2, a = 1, [5] = "five", ["not id"] = 3 }))
    assert.equal("{}", p({}))
  end)

  it("nests and breaks long tables over lines", function()
    local t = { name = "node_dispatcher", group = "core", nested = { deep = { deeper = { 1, 2, 3 } } },
                text = string.rep("x", 60) }
    local s = p(t)
    assert.truthy(s:find("\n", 1, true))
    assert.truthy(s:find('  group = "core",', 1, true))
    assert.truthy(s:find("nested = { deep = { deeper = { 1, 2, 3 } } },", 1, true))
    assert.equal("}", s:sub(-1))
  end)

  it("marks cycles with the path they point back to", function()
    local t = { a = { b = {} } }
    t.a.b.up = t.a
    t.self = t
    local s = p(t)
    assert.truthy(s:find("self = <cycle: root>", 1, true), s)
    assert.truthy(s:find("up = <cycle: a>", 1, true), s)
    -- a table seen twice but not inside itself is shown twice
    local shared = { 1 }
    assert.equal("{ x = { 1 }, y = { 1 } }", p({ x = shared, y = shared }))
  end)

  it("bounds depth and width", function()
    local t = {}
    local cur = t
    for _ = 1, 40 do cur.next = {}; cur = cur.next end
    assert.truthy(p(t):find("{...}", 1, true))
    local big = {}
    for i = 1, pretty.MAX_ITEMS + 5 do big[i] = i end
    assert.truthy(p(big):find("... (5 more)", 1, true))
  end)

  it("uses __pretty and __tostring, and survives a failing one", function()
    assert.equal("custom", p(setmetatable({}, { __pretty = function() return "custom" end })))
    assert.equal("E!", p(setmetatable({}, { __tostring = function() return "E!" end })))
    local bad = p(setmetatable({}, { __pretty = function() error("boom") end }))
    assert.truthy(bad:find("__pretty failed", 1, true))
  end)

  it("shows functions with their source and the JSON null as NULL", function()
    assert.truthy(p(function() end):match("^<function: .*console_spec.lua:%d+>$"))
    assert.equal("<function: builtin>", p(print))
    assert.equal("NULL", p(require("cjson").null))
  end)
end)

describe("console eval", function()
  local function env() return setmetatable({}, { __index = _G }) end

  it("returns the values of bare expressions and =expr", function()
    assert.same({ "r", "3" }, { eval.evaluate("1 + 2", env()) })
    assert.same({ "r", '3\t"x"' }, { eval.evaluate("=1 + 2, 'x'", env()) })
    assert.same({ "r", "nil" }, { eval.evaluate("nothing_here", env()) })
  end)

  it("runs statements and keeps their globals in the session's environment", function()
    local e = env()
    assert.same({ "r", "" }, { eval.evaluate("x = 41", e) })
    assert.same({ "r", "42" }, { eval.evaluate("x + 1", e) })
    assert.is_nil(rawget(_G, "x"))
  end)

  it("says more input is needed for an incomplete chunk", function()
    for _, code in ipairs({ "for i = 1, 3 do", "function f()", "x = ", "t = {", "s = [[abc" }) do
      local kind, msg = eval.evaluate(code, env())
      assert.equal("m", kind, code)
      assert.truthy(msg:find("<eof>", 1, true))
    end
    assert.equal("r", (eval.evaluate("for i = 1, 3 do\nend", env())))
  end)

  it("reports syntax errors that are not just early ends", function()
    local kind, msg = eval.evaluate("x = = 1", env())
    assert.equal("x", kind)
    assert.truthy(msg:find("console:1:", 1, true), msg)
    assert.equal("x", (eval.evaluate("\0\1\2garbage", env())))
  end)

  it("reports runtime errors with the operator's traceback, not the console's", function()
    local kind, msg = eval.evaluate("local function inner() error('boom') end\ninner()", env())
    assert.equal("x", kind)
    assert.truthy(msg:find("console:1: boom", 1, true), msg)
    assert.truthy(msg:find("stack traceback", 1, true), msg)
    assert.truthy(msg:find("in function 'inner'", 1, true) or msg:find("console:1", 1, true), msg)
    assert.falsy(msg:find("qtg/console/eval.lua", 1, true), msg)
  end)

  it("describes structured errors as kind: message", function()
    local kind, msg = eval.evaluate("error({kind = 'refused', message = 'not PENDING_APPROVAL'})", env())
    assert.equal("x", kind)
    assert.truthy(msg:find("^refused: not PENDING_APPROVAL"), msg)
    assert.equal("sql: bad (sqlstate 42P01)",
      eval.describe({ kind = "sql", message = "bad", sqlstate = "42P01" }))
    assert.equal("nil", eval.describe(nil))
    -- a raised table whose __index raises on unknown keys is still described
    local e = env()
    e.qtg = require("qtg")
    local kind2, msg2 = eval.evaluate("error(qtg.settings)", e)
    assert.equal("x", kind2)
    assert.matches("^{", msg2) -- the table, pretty-printed
    assert.is_nil(msg2:find("no setting", 1, true), msg2)
    assert.equal("string", type(eval.describe(setmetatable({}, { __index = function(_, k) error("no " .. k) end }))))
  end)

  it("cuts a result that is too large", function()
    local saved = eval.MAX_RESULT
    eval.MAX_RESULT = 100
    local _, text = eval.evaluate("string.rep('y', 1000)", env())
    eval.MAX_RESULT = saved
    assert.truthy(#text < 200)
    assert.truthy(text:find("cut: 1002 bytes", 1, true), text)
  end)
end)

describe("console completion", function()
  local cmds = setmetatable({ workers = function() end, requests = function() end }, { __index = _G })
  local env = setmetatable({ my_var = { alpha = 1, beta = { gamma = true }, fn = function() end } },
    { __index = cmds })

  it("completes the session's names, the commands and _G", function()
    assert.same({ "my_var" }, complete.candidates("my_", env))
    assert.same({ "workers" }, complete.candidates("work", env))
    assert.same({ "require" }, complete.candidates("requi", env))
    assert.same({ "requests", "require" }, complete.candidates("re", env))
  end)

  it("completes fields along a dotted path, and methods after a colon", function()
    assert.same({ "my_var.alpha" }, complete.candidates("my_var.al", env))
    assert.same({ "my_var.alpha", "my_var.beta", "my_var.fn" }, complete.candidates("my_var.", env))
    assert.same({ "my_var.beta.gamma" }, complete.candidates("my_var.beta.", env))
    assert.same({ "my_var:fn" }, complete.candidates("my_var:", env))
    assert.same({ "string.format" }, complete.candidates("string.form", env))
  end)

  it("follows __index tables (methods of objects)", function()
    local obj = setmetatable({}, { __index = { query = function() end, release = function() end } })
    local e = setmetatable({ s = obj }, { __index = _G })
    assert.same({ "s:query" }, complete.candidates("s:q", e))
  end)

  it("returns nothing for paths that do not resolve or are not names", function()
    assert.same({}, complete.candidates("nope.x", env))
    assert.same({}, complete.candidates("my_var.alpha.x", env))
    assert.same({}, complete.candidates("a..b", env))
    assert.same({}, complete.candidates(".x", env))
    assert.same({}, complete.candidates("(x", env))
    assert.same({}, complete.candidates(string.rep("a", 5000), env))
  end)

  it("never raises on an __index that fails", function()
    local e = setmetatable({ bad = setmetatable({}, { __index = function() error("no") end }) },
      { __index = _G })
    assert.same({}, complete.candidates("bad.x.y", e))
  end)

  -- Completion writes no audit row, so it must run no code: an __index
  -- function an audited chunk planted ran at Tab (pausing a worker, say).
  it("never calls an __index function, on a table or a userdata", function()
    local calls = 0
    local function trap() calls = calls + 1 return { x = { y = 1 } } end
    local e = setmetatable({ trap = setmetatable({}, { __index = trap }),
                             u = newproxy(true) }, { __index = _G })
    getmetatable(e.u).__index = trap
    assert.same({}, complete.candidates("trap.x.", e))
    assert.same({}, complete.candidates("trap:", e))
    assert.same({}, complete.candidates("u.x.", e))
    assert.same({}, complete.candidates("u:", e))
    assert.equal(0, calls)
  end)
end)

describe("console views", function()
  it("renders rows as a column table", function()
    local rows = view.rows({ { name = "a", n = 1 }, { name = "bbb", n = require("cjson").null } }, { "name", "n" })
    local s = pretty.pretty(rows)
    assert.equal("name  n\n----  -\na     1\nbbb   -\n(2 rows)", s)
    assert.equal("a", rows[1].name)
  end)

  it("renders records with the given keys first", function()
    local s = pretty.pretty(view.record({ z = 1, id = "x", a = "y" }, { "id" }))
    assert.equal("id: x\na:  y\nz:  1", s)
  end)

  it("cuts long cells and flattens newlines", function()
    local s = view.cell(string.rep("q", 100) .. "\n")
    assert.equal(view.MAX_CELL, #s)
    assert.equal("...", s:sub(-3))
  end)

  -- An API client writes the intent an approver's inbox shows, a provider
  -- the error text a node shows: an ESC sequence printed raw could conceal
  -- or overwrite the rows after it (ESC[8m hides text, ESC[1A moves up).
  it("shows the control characters of a client's text escaped, never raw", function()
    local asset = "USDC\27[8m\27[1A\r\0\127\194\155x"
    local rows = pretty.pretty(view.rows({ { asset = asset, amount = "10" } }, { "asset", "amount" }))
    assert.is_nil(rows:find("[%z\1-\9\11-\31\127]"), rows)
    assert.is_nil(rows:find("\194\155", 1, true), rows)
    assert.truthy(rows:find("USDC\\x1b[8m\\x1b[1A \\x00\\x7f\\u009bx", 1, true), rows)
    local rec = pretty.pretty(view.record({ error_detail = "line one\nline\ttwo\27]0;owned\7" }))
    assert.is_nil(rec:find("[%z\1-\8\11-\31\127]"), rec)
    assert.equal("error_detail: line one\n  line\ttwo\\x1b]0;owned\\x07", rec)
    -- req(id) prints a request's intent with pretty.quote: the same text,
    -- C1 included, escaped as a Lua string it can be read back from
    local quoted = pretty.pretty({ intent = { asset = asset } })
    assert.is_nil(quoted:find("[%z\1-\9\11-\31\127]"), quoted)
    assert.is_nil(quoted:find("\194\155", 1, true), quoted)
    local text = pretty.quote(asset)
    assert.equal(asset, loadstring("return " .. text)())
  end)
end)

-- The reload module needs the host (qtg.settings, qtg.root): these run
-- inside qtgd (tools/test, spec/busted.lua); under a plain busted they are
-- reported as pending.
local has_host = pcall(require, "qtg") and type(package.loaded.qtg) == "table"
  and package.loaded.qtg.settings ~= nil
local describe_host = has_host and describe or pending

describe_host("reload (failures leave the old code)", function()
  local reload = require("qtg.reload")
  local root, saved_roots, saved_path

  local function write(rel, text)
    local path = root .. "/" .. rel
    os.execute("mkdir -p '" .. path:match("^(.*)/[^/]*$") .. "'")
    local f = assert(io.open(path, "w"))
    f:write(text)
    f:close()
  end

  local function snapshot()
    local copy = {}
    for k, v in pairs(package.loaded) do copy[k] = v end
    return copy
  end

  before_each(function()
    require("qtg.outbox")   -- the audit record of a reload loads it
    root = os.tmpname()
    os.remove(root)
    os.execute("mkdir -p '" .. root .. "'")
    saved_roots, saved_path = reload.roots, reload.policy_path
    local real = saved_roots()
    reload.roots = function()
      local r = { root }
      for _, x in ipairs(real) do r[#r + 1] = x end
      return r
    end
    reload.policy_path = function()
      local parts = {}
      for _, r in ipairs(reload.roots()) do
        parts[#parts + 1] = r .. "/?.lua"
        parts[#parts + 1] = r .. "/?/init.lua"
      end
      return table.concat(parts, ";")
    end
  end)

  after_each(function()
    reload.roots, reload.policy_path = saved_roots, saved_path
    package.loaded["qtg_spec_probe.mod"] = nil
    os.execute("rm -rf '" .. root .. "'")
  end)

  it("lists every module under a root, init.lua as its directory", function()
    write("qtg_spec_probe/mod.lua", "return {}")
    write("qtg_spec_probe/init.lua", "return {}")
    write("qtg_spec_probe/deep/er.lua", "return {}")
    write("qtg_spec_probe/notes.txt", "not lua")
    local names = {}
    for _, f in ipairs(reload.files(root)) do names[#names + 1] = f.name end
    table.sort(names)
    assert.same({ "qtg_spec_probe", "qtg_spec_probe.deep.er", "qtg_spec_probe.mod" }, names)
    assert.same({}, reload.files(root .. "/does-not-exist"))
  end)

  it("refuses a syntax error anywhere with its file and line, changing nothing", function()
    write("qtg_spec_probe/broken.lua", "local M = {}\nM.x = = 1\nreturn M\n")
    local before = snapshot()
    local report = reload.reload("spec")
    assert.is_false(report.ok)
    assert.equal(root .. "/qtg_spec_probe/broken.lua", report.errors[1].file)
    assert.equal(2, report.errors[1].line)
    assert.same(before, snapshot())
    local text = reload.describe(report).text
    assert.truthy(text:find("old code keeps running", 1, true))
    assert.truthy(text:find("broken.lua:2", 1, true))
  end)

  it("puts the old module back when the new one raises while loading", function()
    write("qtg_spec_probe/mod.lua", "return { version = 1 }")
    local old = dofile(root .. "/qtg_spec_probe/mod.lua")
    package.loaded["qtg_spec_probe.mod"] = old
    write("qtg_spec_probe/mod.lua", "local M = { version = 2 }\nerror('no good')\nreturn M\n")
    local before = snapshot()
    local report = reload.reload("spec")
    assert.is_false(report.ok)
    assert.equal("qtg_spec_probe.mod", report.errors[1].module)
    assert.equal(2, report.errors[1].line)
    assert.truthy(report.errors[1].message:find("no good", 1, true))
    assert.equal(old, package.loaded["qtg_spec_probe.mod"])
    assert.same(before, snapshot())
  end)

  it("names the failing file and line once, without the modules that only require it", function()
    write("qtg_spec_probe/base.lua", "local M = {}\nerror('base is broken')\nreturn M\n")
    write("qtg_spec_probe/user_a.lua", "return { base = require('qtg_spec_probe.base') }\n")
    write("qtg_spec_probe/user_b.lua", "return { base = require('qtg_spec_probe.base') }\n")
    for _, n in ipairs({ "base", "user_a", "user_b" }) do package.loaded["qtg_spec_probe." .. n] = { old = true } end
    local saved_path = package.path   -- as in the daemon: the override root is on require's path
    package.path = reload.policy_path() .. ";" .. package.path
    local report = reload.reload("spec")
    package.path = saved_path
    for _, n in ipairs({ "base", "user_a", "user_b" }) do package.loaded["qtg_spec_probe." .. n] = nil end
    assert.is_false(report.ok)
    assert.equal(1, #report.errors, reload.describe(report).text)
    assert.equal(root .. "/qtg_spec_probe/base.lua", report.errors[1].file)
    assert.equal(2, report.errors[1].line)
    local text = reload.describe(report).text
    assert.is_nil(text:find("loop or previous error", 1, true), text)
    assert.is_nil(text:find("user_b", 1, true), text)
  end)

  it("reports a core worker whose first pass on the new code fails; workers() shows its error", function()
    local qtg = require("qtg")
    local rt = qtg.runtime
    rt.start_worker{ name = "spec_reload_bad", group = "core", interval = 0.2,
                     tick = function() error("boom on the new code") end }
    rt.start_worker{ name = "spec_reload_good", group = "core", interval = 0.2, tick = function() return 0 end }
    local report = { ok = true, actor = "console:spec", modules = {}, started = {}, stopped = {},
                     updated = { "spec_reload_bad", "spec_reload_good" }, interval_changed = {},
                     errors = {}, failing = {}, unwatched = {} }
    local ok, err = pcall(reload.watch, report, 10)
    local rows = require("qtg.console.commands").bind({ actor = "console:spec" }).workers()
    rt.stop_worker("spec_reload_bad")
    rt.stop_worker("spec_reload_good")
    assert(ok, err)
    assert.equal(1, #report.failing)
    assert.equal("spec_reload_bad", report.failing[1].name)
    assert.matches("boom on the new code", report.failing[1].error, 1, true)
    local text = reload.describe(report).text
    assert.matches("FAILING: core worker spec_reload_bad failed its first pass on the new code", text, 1, true)
    assert.is_nil(text:find("spec_reload_good", 1, true), text)
    local shown = require("qtg.console.pretty").pretty(rows)
    assert.matches("last error", shown, 1, true)
    local bad_row
    for _, r in ipairs(rows) do if r.name == "spec_reload_bad" then bad_row = r end end
    assert.is_table(bad_row, shown)
    assert.matches("boom on the new code", bad_row["last error"], 1, true)
    assert.matches("boom on the new code", shown, 1, true)
  end)

  -- A registry entry start_worker refuses (a name of 64 characters) made
  -- the reload fail half-way through applying, with the new code in force;
  -- an interval set_interval took (1e300) stopped the worker's polling.
  for _, bad in ipairs({ { string.rep("w", 64), 5, "name must be a string of 1 to 63 characters" },
                         { "spec_far", 1e300, "interval must be a number > 0 and at most 31536000 seconds" } }) do
    it("refuses a worker registry the runtime would refuse: " .. bad[3], function()
      write("qtg/workers/init.lua", string.format([[
return { registry = function() return { { name = %q, group = "sidecar", interval = %s,
  module = "qtg_spec_probe.mod", enabled = true } } end }
]], bad[1], string.format("%.17g", bad[2])))
      write("qtg_spec_probe/mod.lua", "return { tick = function() return 0 end }\n")
      local before = snapshot()
      local report = reload.reload("spec")
      os.remove(root .. "/qtg/workers/init.lua")
      assert.is_false(report.ok)
      assert.matches(bad[3], reload.describe(report).text, 1, true)
      assert.same(before, snapshot())
    end)
  end

  -- A module a registry loads at its first use (an executor, a venue's
  -- adapter, the approval policy) was not loaded by a reload unless
  -- something had used it: one that raised while loading passed the reload
  -- and failed the first request that needed it.
  describe("the modules the registries load at first use", function()
    local FIRST_USE = { "qtg.executors", "qtg.executors.sim", "qtg.executors.manual",
                        "qtg.executors.evm_transfer", "qtg.venues", "qtg.venues.connector",
                        "qtg.approvals", "qtg.policies.approval" }
    local saved, saved_path

    -- as in the daemon: the override root is on require's path
    before_each(function()
      saved, saved_path = {}, package.path
      for _, n in ipairs(FIRST_USE) do saved[n] = package.loaded[n]; package.loaded[n] = nil end
      package.path = reload.policy_path() .. ";" .. package.path
    end)

    after_each(function()
      package.path = saved_path
      for _, n in ipairs(FIRST_USE) do package.loaded[n] = saved[n] end
    end)

    for _, case in ipairs({
      { "an executor", "qtg/executors/sim.lua", "local M = {}\nerror('the sim executor is broken')\nreturn M\n",
        "qtg.executors.sim", "the sim executor is broken" },
      { "a venue's adapter", "qtg/venues/connector.lua", "local M = {}\nerror('the connector is broken')\nreturn M\n",
        "qtg.venues.connector", "the connector is broken" },
      { "the approval policy", "qtg/policies/approval.lua", "return { rules = {} }\n",
        "qtg.policies.approval", "at least one rule" },
      -- a review (session 38): these passed the reload, and every node
      -- dispatched to the executor then FAILED with EXECUTOR_ERROR
      { "an executor that is not a table", "qtg/executors/sim.lua", "return 42\n",
        "qtg.executors.sim", "an executor module must return a table of its functions (got number)" },
      { "an executor whose submit is not a function", "qtg/executors/sim.lua", "return { submit = 'no' }\n",
        "qtg.executors.sim", "submit must be a function (got string)" },
      { "an executor with none of the calls", "qtg/executors/manual.lua", "return { probe = true }\n",
        "qtg.executors.manual", "an executor module needs one of preflight, prepare, submit, observe, recover, health" },
      -- health is a call too (the list the busy guard watches has no health:
      -- under one name, that list had replaced this one)
      { "an executor whose health is not a function", "qtg/executors/sim.lua",
        "return { submit = function() end, health = 'fine' }\n",
        "qtg.executors.sim", "health must be a function (got string)" },
      { "an executor whose rate limits are malformed", "qtg/executors/sim.lua",
        "return { submit = function() end, RATE_LIMITS = { submit = { per_second = 0 } } }\n",
        "qtg.executors.sim", "RATE_LIMITS.submit.per_second must be a number > 0" },
      { "a venue's adapter without fetch_page", "qtg/venues/connector.lua", "return { fetch = function() end }\n",
        "qtg.venues.connector", "a venue adapter module must return a table with fetch_page" },
    }) do
      it("refuses " .. case[1] .. " that fails to load, though nothing has loaded it yet", function()
        write(case[2], case[3])
        local before = snapshot()
        local report = reload.reload("spec")
        assert.is_false(report.ok, reload.describe(report).text)
        assert.equal(case[4], report.errors[1].module)
        assert.equal(root .. "/" .. case[2], report.errors[1].file)
        assert.matches(case[5], reload.describe(report).text, 1, true)
        assert.same(before, snapshot())
        assert.is_nil(package.loaded[case[4]])
      end)
    end

    it("refuses a registry that names a module by anything but its name", function()
      write("qtg/venues/init.lua", "return { VENUES = { binance = 42 }, names = function() return {} end }\n")
      local report = reload.reload("spec")
      assert.is_false(report.ok)
      assert.matches("qtg.venues.VENUES must name modules by their names, got a number",
        reload.describe(report).text, 1, true)
    end)

    local function executors_with(extra)
      write("qtg/executors/init.lua", "local M = dofile(" .. string.format("%q", require("qtg").root
        .. "/lua/qtg/executors/init.lua") .. ")\n" .. extra .. "\nreturn M\n")
    end

    it("refuses a registry that names a module nothing can load", function()
      executors_with("M.ADAPTERS.ghost = 'qtg.executors.ghost'")
      local report = reload.reload("spec")
      assert.is_false(report.ok)
      assert.matches("module 'qtg.executors.ghost' not found", reload.describe(report).text, 1, true)
    end)

    -- A registry may name a module require finds beyond the policy path
    -- (LUA_PATH, a C module); the reload refused every change while one did.
    it("loads a module require finds beyond the policy path, and refuses one that raises there", function()
      local ext = os.tmpname()
      os.remove(ext)
      os.execute("mkdir -p '" .. ext .. "'")
      local f = assert(io.open(ext .. "/qtg_spec_ext_venue.lua", "w"))
      f:write("return { fetch_page = function() end }\n")
      f:close()
      local saved = package.path
      package.path = package.path .. ";" .. ext .. "/?.lua"
      write("qtg/venues/init.lua", "local M = dofile(" .. string.format("%q", require("qtg").root
        .. "/lua/qtg/venues/init.lua") .. ")\nM.VENUES.spec_ext = 'qtg_spec_ext_venue'\nreturn M\n")
      local report = reload.reload("spec")
      for _, name in ipairs(report.started) do require("qtg").runtime.stop_worker(name) end
      local loaded = package.loaded["qtg_spec_ext_venue"]
      package.loaded["qtg_spec_ext_venue"] = nil
      f = assert(io.open(ext .. "/qtg_spec_ext_venue.lua", "w"))
      f:write("error('the outside venue is broken')\n")
      f:close()
      local broken = reload.reload("spec")
      package.path = saved
      package.loaded["qtg_spec_ext_venue"] = nil
      os.execute("rm -rf '" .. ext .. "'")
      assert.is_true(report.ok, reload.describe(report).text)
      assert.is_function(loaded.fetch_page)
      assert.is_false(broken.ok)
      assert.matches("the outside venue is broken", reload.describe(broken).text, 1, true)
    end)

    for _, case in ipairs({
      { "a table with a metatable", "M.ADAPTERS = setmetatable({}, { __index = M.ADAPTERS })",
        "qtg.executors.ADAPTERS must be a module name or a plain table of them, got table with a metatable" },
      { "nothing", "M.ADAPTERS = nil",
        "qtg.executors.ADAPTERS must be a module name or a plain table of them, got nil" },
    }) do
      it("refuses a registry whose modules are " .. case[1], function()
        executors_with(case[2])
        local report = reload.reload("spec")
        assert.is_false(report.ok)
        assert.matches(case[3], reload.describe(report).text, 1, true)
      end)
    end

    it("loads and keeps a good one, in force after the reload", function()
      write("qtg/executors/manual.lua", "return { probe = 'new manual', observe = function() end }\n")
      local report = reload.reload("spec")
      -- this process runs no workers: stop the ones the reload's registry started
      for _, name in ipairs(report.started) do require("qtg").runtime.stop_worker(name) end
      assert.is_true(report.ok, reload.describe(report).text)
      assert.equal("new manual", package.loaded["qtg.executors.manual"].probe)
      assert.truthy(require("qtg.executors").ADAPTERS.manual == "qtg.executors.manual")
      local named = {}
      for _, n in ipairs(report.modules) do named[n] = true end
      assert.is_true(named["qtg.executors.manual"] and named["qtg.policies.approval"] and named["qtg.venues.connector"])
    end)
  end)

  it("refuses a module that does I/O while it loads", function()
    write("qtg_spec_probe/mod.lua", "require('qtg').sleep(0)\nreturn { version = 3 }\n")
    package.loaded["qtg_spec_probe.mod"] = { version = 1 }
    local report = reload.reload("spec")
    assert.is_false(report.ok)
    assert.equal(1, package.loaded["qtg_spec_probe.mod"].version)
  end)
end)
