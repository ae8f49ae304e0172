-- The example alert rules (packaging/qtg-alerts.yml, docs/operations.md
-- section 9) under Prometheus' own rule tests: promtool checks them and runs
-- spec/prometheus/qtg-alerts.test.yml, which shows each rule firing on the
-- condition it names (and quiet beside it).  Every rule has a test there,
-- and every qtg metric a rule reads is one a running qtgd's /metrics
-- declares: a misspelt name is a rule that never fires.  A review
-- (session 43) found four of the rules silent: a quantile above the
-- histogram's last bound, an error rate a backed-off worker never reaches,
-- counters first seen at 1, a dead letter counted after its redelivery.
local common = require "spec.lua.support.common"

local q = common.quote

local RULES = common.root() .. "/packaging/qtg-alerts.yml"
local TESTS = common.root() .. "/spec/prometheus/qtg-alerts.test.yml"

local function promtool(args)
  local out, rc = common.sh("promtool " .. args .. " 2>&1")
  return rc, out
end

local function alert_names(text)
  local names = {}
  for name in text:gmatch("%- alert: (%w+)") do names[#names + 1] = name end
  return names
end

describe("the example alert rules", function()
  it("pass promtool's check, and each fires in its rule test on what it names", function()
    local rc, out = promtool("check rules " .. q(RULES))
    assert.equal(0, rc, out)
    rc, out = promtool("test rules " .. q(TESTS))
    assert.equal(0, rc, out)
    assert.matches("SUCCESS", out, 1, true)
  end)

  it("each rule has a test that expects it to fire", function()
    local tests = common.read(TESTS)
    local names = alert_names(common.read(RULES))
    assert.is_true(#names >= 20, #names .. " rules")
    for _, name in ipairs(names) do
      assert.truthy(tests:find("alertname: " .. name .. "\n    exp_alerts: %[{exp_labels"), name .. " never fires in a test")
    end
  end)

  it("reads only metrics a running qtgd's /metrics declares", function()
    local api = require "spec.lua.support.api"
    local d = api.start()
    local ok, err = pcall(function()
      local reader = api.token("read", { class = d.class })
      local body = api.call(d, "GET", "/metrics", { token = reader }).body
      local declared = {}
      for name, kind in body:gmatch("# TYPE ([%w_:]+) (%a+)") do
        declared[name] = true
        if kind == "histogram" then
          for _, suffix in ipairs({ "_bucket", "_count", "_sum" }) do declared[name .. suffix] = true end
        end
      end
      assert.truthy(declared.qtg_requests, body)
      local used = 0
      for name in common.read(RULES):gmatch("(qtg_[%w_]+)") do
        used = used + 1
        assert.truthy(declared[name], name .. " is not on /metrics")
      end
      assert.is_true(used >= 20, used .. " metric references")
    end)
    api.stop(d)
    assert(ok, err)
  end)
end)
