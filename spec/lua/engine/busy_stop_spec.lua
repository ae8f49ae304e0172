-- busy_stop_spec: an executor call the busy guard stops is answered with its
-- error from then on, so its node is recorded and the daemon is held once,
-- against a running `qtgd run` whose sim adapter (an MG_LUA_PATH override)
-- computes for ever in the call a node's config names (spin):
--   * a submit that never yields: the node goes UNKNOWN, then recovery's
--     (the provider never saw it: FAILED, SUBMIT_NOT_FOUND), the loop is
--     held once, and the requests behind it complete meanwhile.  Before,
--     the stopped dispatch rolled back, the node stayed READY at the FIFO
--     head and was claimed again at the next pass, the loop held for the
--     limit each time and nothing behind it dispatched (a review, session
--     38: 0 of 3 requests in 100 s);
--   * a preflight that never yields: the node is FAILED, EXECUTOR_ERROR,
--     its detail naming the busy guard, after one stop;
--   * an observe that never yields: the node goes UNKNOWN after one stop.
local qtg = require "qtg"

local common, engine, host

local SPIN = "spec_busy_spin_"
-- the line qtg.executors writes once for each call it answers as stopped
local STOPPED = "executor call stopped by the busy guard"

-- The override: the packaged sim, each call first spinning when the node's
-- config asks for that call.
local OVERRIDE = [[
local qtg = require "qtg"
local real = dofile(qtg.root .. "/lua/qtg/executors/sim.lua")
local M = {}
for k, v in pairs(real) do M[k] = v end
for _, name in ipairs({ "preflight", "prepare", "submit", "observe", "recover" }) do
  M[name] = function(ctx, ...)
    local c = type(ctx) == "table" and type(ctx.node_config) == "table" and ctx.node_config or {}
    if c.spin == name then
      local x = 0
      while true do x = x + 1 end
    end
    return real[name](ctx, ...)
  end
end
return M
]]

local function node_of(id)
  return common.query([[SELECT node_state, error_code, error_detail, attempt_no FROM movement_request_nodes
                         WHERE request_id = $1::uuid]], id)[1]
end

local function states(ids)
  local out = {}
  for i, id in ipairs(ids) do
    out[i] = common.query("SELECT request_state FROM movement_requests WHERE id = $1::uuid", id)[1].request_state
  end
  return out
end

-- stopped(node_id) -> the lines saying its calls are answered as stopped,
-- once there is one (its lines may reach the file after the rows they led
-- to are visible)
local stopped

describe("an executor call the busy guard stops", function()
  local d, class, dir
  setup(function()
    common = require "spec.lua.support.common"
    engine = require "spec.lua.support.engine"
    host = require "spec.lua.support.host"
    dir = host.tmpdir()
    os.execute("mkdir -p " .. common.quote(dir .. "/qtg/executors") .. " && chmod -R 755 " .. common.quote(dir))
    host.write(dir .. "/qtg/executors/sim.lua", OVERRIDE)
    qtg.db.with_session(function(s)
      for _, call in ipairs({ "submit", "preflight", "observe" }) do
        local sim = { observes = 1, retry_after_seconds = 0 }
        engine.load_doc(s, engine.doc(SPIN .. call, { { "a", "action", "withdrawal", { sim = sim, spin = call } } }))
      end
      engine.load_doc(s, engine.doc(SPIN .. "plain", { { "a", "action", "withdrawal", { sim = { observes = 1,
        retry_after_seconds = 0 } } } }))
    end)
    class = common.uid("busy", 4)
    d = host.start(host.base_env({ MG_LUA_PATH = dir, MG_NETWORK_CLASS = class, MG_TASK_BUSY_LIMIT_SECONDS = "1",
      MG_NODE_DISPATCH_INTERVAL_SECONDS = "0.2", MG_NODE_OBSERVE_INTERVAL_SECONDS = "0.2",
      MG_NODE_RECOVERY_INTERVAL_SECONDS = "0.5" }), { "run" })
    common.wait_log(d, '"msg":"qtgd running"', 30, "the daemon to run")
  end)
  teardown(function()
    if d then assert.equal(0, host.stop(d, 20)) end
    os.execute("rm -rf " .. common.quote(dir))
  end)

  stopped = function(id)
    local n
    common.wait_for(function()
      n = 0
      for line in (host.read(d.log) or ""):gmatch("[^\n]+") do
        if line:find(STOPPED, 1, true) and line:find(id, 1, true) then n = n + 1 end
      end
      return n > 0, n
    end, 10, function() return "the stop of " .. id .. " in the log: " .. (host.read(d.log) or ""):sub(-6000) end)
    return n
  end

  local function make(template)
    return qtg.db.with_session(function(s)
      return engine.create_approved(s, template, { network_class = class, callback_url = false }).id
    end)
  end

  it("in submit: the node goes UNKNOWN after one stop, and the requests behind it complete", function()
    local poison = make(SPIN .. "submit")
    local behind = {}
    for i = 1, 3 do behind[i] = make(SPIN .. "plain") end
    common.wait_for(function()
      local st = states(behind)
      return st[1] == "COMPLETED" and st[2] == "COMPLETED" and st[3] == "COMPLETED", table.concat(st, ",")
    end, 30, "the requests behind the stopped one to complete")
    common.wait_for(function()
      local n = node_of(poison)
      return n.node_state ~= "READY" and n.node_state ~= "UNKNOWN", n.node_state
    end, 30, "the stopped node to be recorded and recovered")
    local n = node_of(poison)
    assert.equal("FAILED", n.node_state)
    assert.equal(1, n.attempt_no)
    -- its UNKNOWN was recorded with the busy guard's words
    local line
    common.wait_for(function()
      local text = host.read(d.log) or ""
      local id = poison:gsub("%-", "%%-")
      line = text:match('[^\n]*"msg":"node UNKNOWN"[^\n]*' .. id .. '[^\n]*')
        or text:match('[^\n]*' .. id .. '[^\n]*"msg":"node UNKNOWN"[^\n]*')
      return line ~= nil
    end, 10, "the node's UNKNOWN in the log")
    assert.truthy(line:find("submit held the loop past MG_TASK_BUSY_LIMIT_SECONDS and was stopped by the busy guard",
      1, true), line)
    -- stopped once: answered from then on, never dispatched again
    assert.equal(1, stopped(common.query("SELECT id::text AS id FROM movement_request_nodes WHERE request_id = $1::uuid",
      poison)[1].id))
  end)

  it("in preflight: the node is FAILED with EXECUTOR_ERROR after one stop", function()
    local poison = make(SPIN .. "preflight")
    local behind = make(SPIN .. "plain")
    common.wait_for(function()
      return node_of(poison).node_state == "FAILED" and states({ behind })[1] == "COMPLETED", node_of(poison).node_state
    end, 30, "the stopped node to fail and the one behind it to complete")
    local n = node_of(poison)
    assert.equal("EXECUTOR_ERROR", n.error_code)
    assert.equal("preflight held the loop past MG_TASK_BUSY_LIMIT_SECONDS and was stopped by the busy guard "
      .. "(not called again at this attempt until a reload)", n.error_detail)
    assert.equal(1, stopped(common.query("SELECT id::text AS id FROM movement_request_nodes WHERE request_id = $1::uuid",
      poison)[1].id))
  end)

  it("in observe: the node goes UNKNOWN after one stop", function()
    local poison = make(SPIN .. "observe")
    common.wait_for(function()
      local n = node_of(poison)
      return n.node_state ~= "SUBMITTED" and n.node_state ~= "READY" and n.node_state ~= "OBSERVING", n.node_state
    end, 30, "the stopped node to leave observation")
    common.wait_for(function()
      return (host.read(d.log) or ""):find("observe held the loop past MG_TASK_BUSY_LIMIT_SECONDS and was stopped "
        .. "by the busy guard", 1, true) ~= nil
    end, 10, "the node's UNKNOWN in the log")
    -- a few passes later still one stop for it
    qtg.sleep(2)
    assert.equal(1, stopped(common.query("SELECT id::text AS id FROM movement_request_nodes WHERE request_id = $1::uuid",
      poison)[1].id))
  end)
end)
