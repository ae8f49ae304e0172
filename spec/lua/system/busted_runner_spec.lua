-- busted_runner_spec: spec/busted.lua, the runner every spec goes through.
-- Each case runs a fixture (spec/fixtures/runner/) in a separate qtgd
-- (QTG_BIN, the binary under test: the sanitizer pass checks that it shuts
-- down cleanly too) and checks the exit code, the last line that tools/test
-- adds up, and that failures are printed with their messages.
-- tools/test sets both; by hand they default to this repo's build/qtgd.
local common = require "spec.lua.support.common"
local root = common.root()
local bin = os.getenv("QTG_BIN") or (root .. "/build/qtgd")


-- Run the runner in a child qtgd; returns exit code, output (stdout+stderr),
-- and the last non-empty line of stdout.
local function run_runner(...)
  local out = os.tmpname()
  local err = os.tmpname()
  -- (the outer run's progress file is its own: the child must not write it)
  local cmd = { "cd", common.quote(root), "&&", "env", "-u", "QTG_BUSTED_PROGRESS",
                common.quote(bin), "exec", "spec/busted.lua", "-o", "plainTerminal" }
  for _, a in ipairs({ ... }) do cmd[#cmd + 1] = common.quote(a) end
  local status = os.execute(table.concat(cmd, " ") .. " >" .. out .. " 2>" .. err)
  local function slurp(path)
    local f = assert(io.open(path, "rb"))
    local s = f:read("*a")
    f:close()
    os.remove(path)
    return s
  end
  local stdout, stderr = slurp(out), slurp(err)
  -- LuaJIT's os.execute returns the wait status of system(3)
  local code = type(status) == "number" and math.floor(status / 256) or (status and 0 or 1)
  local last
  for line in stdout:gmatch("[^\n]+") do last = line end
  return code, stdout .. stderr, last
end

local function fixture(name) return "spec/fixtures/runner/" .. name .. ".lua" end

describe("spec/busted.lua", function()
  it("exits 0 and counts the tests when all pass", function()
    local code, output, last = run_runner(fixture("passing"))
    assert.equal("2 passed, 0 failed", last, output)
    assert.equal(0, code, output)
  end)

  it("counts failures, errors and pending tests and prints why each failed", function()
    local code, output, last = run_runner(fixture("mixed"))
    assert.equal("1 passed, 3 failed, 1 skipped", last, output)
    assert.equal(1, code, output)
    assert.truthy(output:find("expected-value", 1, true), output)
    assert.truthy(output:find("sql error 23505: duplicate key", 1, true), output)
    assert.truthy(output:find("os.exit(0) called during the busted run", 1, true), output)
  end)

  it("counts an error in a hook as a failure", function()
    local code, output, last = run_runner(fixture("hooks"))
    assert.equal("0 passed, 1 failed", last, output)
    assert.equal(1, code, output)
    assert.truthy(output:find("hook exploded", 1, true), output)
  end)

  it("counts a spec file that does not compile as a failure", function()
    local code, output, last = run_runner(fixture("broken"))
    assert.equal("0 passed, 1 failed", last, output)
    assert.equal(1, code, output)
    assert.truthy(output:find("'end' expected", 1, true), output)
  end)

  it("fails when a spec path does not exist", function()
    local code, output, last = run_runner("spec/fixtures/runner/no_such_dir")
    assert.truthy(last and last:match("^0 passed, [1-9]%d* failed$"), output)
    assert.equal(1, code, output)
  end)

  it("fails on an unknown option instead of reporting success", function()
    local code, output, last = run_runner("--no-such-option", fixture("passing"))
    assert.equal("0 passed, 1 failed", last, output)
    assert.equal(1, code, output)
    assert.truthy(output:find("no-such-option", 1, true), output)
  end)

  it("runs specs in a host task: I/O at file level, in hooks and in tests", function()
    local code, output, last = run_runner(fixture("host_io"))
    assert.equal("3 passed, 0 failed", last, output)
    assert.equal(0, code, output)
  end)
end)
