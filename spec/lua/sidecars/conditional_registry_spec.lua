-- The nine conditional workers' registration: for every
-- flag on and off, the worker is (or is not) registered, in the spec's
-- group, with its interval setting and the spec's default; workers disabled
-- altogether run none; a worker whose external client is not configured is
-- skipped with a warning and the process still starts; a conditional core
-- worker dying stops the process, a conditional sidecar dying does not.
local qtg = require "qtg"
local common = require "spec.lua.support.common"

local sup -- spec/lua/support/conditional.lua

-- The spec's table (runtime-workers.md, "9 conditional" and the summary).
local SPEC = {
  { name = "evm_nonce_reaper", group = "core", flag = "MG_EVM_NONCE_REAPER_ENABLED", default_on = true,
    interval = "MG_EVM_NONCE_REAPER_INTERVAL_SECONDS", default_interval = 60,
    needs = { MG_EVM_RPC_URLS = "31337=http://127.0.0.1:9" } },
  { name = "ccip_stranded_reaper", group = "core", flag = "MG_CCIP_STRANDED_REAPER_ENABLED", default_on = true,
    interval = "MG_CCIP_STRANDED_REAPER_INTERVAL_SECONDS", default_interval = 60 },
  { name = "capital_transfer_followup", group = "sidecar", flag = "MG_CAPITAL_TRANSFER_FOLLOWUP_ENABLED",
    default_on = false, interval = "MG_CAPITAL_TRANSFER_FOLLOWUP_INTERVAL_SECONDS", default_interval = 60 },
  { name = "notification_dispatcher", group = "sidecar", flag = "MG_NOTIFY_ENABLED", default_on = false,
    interval = "MG_NOTIFY_INTERVAL_SECONDS", needs = { MG_NOTIFY_WEBHOOK_URL = "http://127.0.0.1:9/hook" } },
  { name = "balance_history_rollup", group = "sidecar", flag = "MG_BALANCE_HISTORY_ENABLED", default_on = true,
    interval = "MG_BALANCE_HISTORY_INTERVAL_SECONDS" },
  { name = "cex_transfer_ingest", group = "sidecar", csv = "MG_CEX_TRANSFER_INGEST_VENUES_CSV",
    interval = "MG_CEX_TRANSFER_INGEST_INTERVAL_SECONDS" },
  { name = "balance_snapshot", group = "sidecar", flag = "MG_BALANCE_SNAPSHOT_ENABLED", default_on = false,
    interval = "MG_BALANCE_SNAPSHOT_INTERVAL_SECONDS", default_interval = 30 },
  { name = "ccip_drift", group = "sidecar", flag = "MG_CCIP_ENABLED", default_on = false,
    interval = "MG_CCIP_DRIFT_POLL_INTERVAL_SECONDS", needs = { MG_CCIP_SIDECAR_URL = "http://127.0.0.1:9" } },
  { name = "verify_drift", group = "sidecar", flag = "MG_VERIFY_DRIFT_ENABLED", default_on = false,
    interval = "MG_VERIFY_DRIFT_INTERVAL_SECONDS", default_interval = 21600 },
}

local function key(env_name) return env_name:gsub("^MG_", ""):lower() end

-- Settings as the host parses them (qtg.settings), overlaid with env-style overrides.
local function settings(over)
  local t = {}
  for k, v in pairs(over) do
    if v == "true" then v = true elseif v == "false" then v = false elseif tonumber(v) and not k:match("URL") then
      v = tonumber(v)
    end
    t[key(k)] = v
  end
  return setmetatable(t, { __index = qtg.settings })
end

local function entry(reg, name)
  for _, w in ipairs(reg) do if w.name == name then return w end end
end

local function default_of(env_name)
  for _, r in ipairs(qtg.settings_list()) do
    if r.name == env_name then return r.default end
  end
  error("no setting " .. env_name)
end

describe("conditional worker registration", function()
  local registry = require("qtg.workers").registry

  for _, w in ipairs(SPEC) do
    it(w.name .. ": on and off, its group and its interval", function()
      local on = { MG_WORKERS_ENABLED = "true", [w.interval] = "7.5" }
      local off = { MG_WORKERS_ENABLED = "true", [w.interval] = "7.5" }
      if w.flag then
        on[w.flag], off[w.flag] = "true", "false"
        assert.equals(w.default_on and "true" or "false", default_of(w.flag))
      else
        on[w.csv], off[w.csv] = "binance,okx", "  "
        assert.equals("", default_of(w.csv))
      end
      for k, v in pairs(w.needs or {}) do on[k], off[k] = v, v end
      if w.default_interval then assert.equals(tostring(w.default_interval), default_of(w.interval)) end
      local e = entry(registry(settings(on)), w.name)
      assert.is_true(e.enabled)
      assert.is_nil(e.skip_reason)
      assert.equals(w.group, e.group)
      assert.equals(7.5, e.interval)
      assert.equals("qtg.workers." .. w.name, e.module)
      assert.is_truthy(package.searchpath(e.module, package.path), "the module exists in this build")
      local d = entry(registry(settings(off)), w.name)
      assert.is_falsy(d.enabled)
      -- the default interval is what the worker gets when the setting is unset
      local dflt = entry(registry(settings({ MG_WORKERS_ENABLED = "true" })), w.name)
      assert.equals(tonumber(default_of(w.interval)), dflt.interval)
    end)
  end

  it("MG_WORKERS_ENABLED=false runs none of them, flags on or not", function()
    local over = { MG_WORKERS_ENABLED = "false", MG_CEX_TRANSFER_INGEST_VENUES_CSV = "binance" }
    for _, w in ipairs(SPEC) do
      if w.flag then over[w.flag] = "true" end
      for k, v in pairs(w.needs or {}) do over[k] = v end
    end
    for _, e in ipairs(registry(settings(over))) do assert.is_falsy(e.enabled, e.name) end
  end)

  it("skips the nonce reaper without RPC endpoints and ccip_drift without a sidecar, with a reason", function()
    local reg = registry(settings({ MG_WORKERS_ENABLED = "true", MG_EVM_NONCE_REAPER_ENABLED = "true",
      MG_EVM_RPC_URLS = "", MG_CCIP_ENABLED = "true", MG_CCIP_SIDECAR_URL = "" }))
    assert.is_falsy(entry(reg, "evm_nonce_reaper").enabled)
    assert.matches("MG_EVM_RPC_URLS", entry(reg, "evm_nonce_reaper").skip_reason)
    assert.is_falsy(entry(reg, "ccip_drift").enabled)
    assert.matches("MG_CCIP_SIDECAR_URL", entry(reg, "ccip_drift").skip_reason)
  end)

  it("skips the nonce reaper with a malformed MG_EVM_RPC_URLS, naming why, as the reaper parses it", function()
    local function reaper(urls)
      return entry(registry(settings({ MG_WORKERS_ENABLED = "true", MG_EVM_NONCE_REAPER_ENABLED = "true",
        MG_EVM_RPC_URLS = urls })), "evm_nonce_reaper")
    end
    for urls, want in pairs({
      ["foo"] = 'entry "foo" is not chain_id=http%(s%)://url',
      ["31337=ftp://127.0.0.1:9"] = "is not chain_id=http",
      ["0=http://127.0.0.1:9"] = "chain id must be positive",
      ["1=http://127.0.0.1:9,1=http://127.0.0.1:10"] = "chain 1 is listed twice",
      [" , "] = "no EVM RPC endpoints",
    }) do
      local e = reaper(urls)
      assert.is_falsy(e.enabled, urls)
      assert.matches("MG_EVM_RPC_URLS", e.skip_reason)
      assert.matches(want, e.skip_reason)
    end
    local e = reaper(" 1=http://127.0.0.1:9 , 31337=https://rpc.example ")
    assert.is_true(e.enabled)
    assert.is_nil(e.skip_reason)
  end)
end)

describe("conditional workers in a running qtgd", function()
  local dir
  setup(function()
    sup = require "spec.lua.support.conditional"
    dir = sup.tmpdir()
  end)
  teardown(function() sup.stop_all() end)

  local function heartbeat_groups(class)
    local out = {}
    for _, r in ipairs(sup.query([[SELECT worker_name, group_name FROM worker_heartbeats
                                    WHERE network_class = $1]], class)) do
      out[r.worker_name] = r.group_name
    end
    return out
  end

  it("starts every enabled conditional worker in its group and skips the unconfigured with a warning", function()
    local class = sup.uid("reg-run")
    local h = sup.start_run(dir, "all", sup.base_env{
      MG_NETWORK_CLASS = class, MG_EVM_NONCE_REAPER_ENABLED = "true", MG_EVM_RPC_URLS = "",
      MG_CCIP_STRANDED_REAPER_ENABLED = "true", MG_CAPITAL_TRANSFER_FOLLOWUP_ENABLED = "true",
      MG_NOTIFY_ENABLED = "true", MG_NOTIFY_WEBHOOK_URL = "http://127.0.0.1:9/webhook",
      MG_BALANCE_HISTORY_ENABLED = "true", MG_CEX_TRANSFER_INGEST_VENUES_CSV = "binance",
      MG_CEX_API_URL = "http://127.0.0.1:9", MG_BALANCE_SNAPSHOT_ENABLED = "true",
      MG_CCIP_ENABLED = "true", MG_CCIP_SIDECAR_URL = "", MG_VERIFY_DRIFT_ENABLED = "true",
      MG_WAKEUPS_ENABLED = "false",
    })
    local groups = sup.wait_for(function()
      local g = heartbeat_groups(class)
      return g.verify_drift and g
    end, 20, "heartbeats of " .. class)
    for _, w in ipairs(SPEC) do
      if w.name == "evm_nonce_reaper" or w.name == "ccip_drift" then
        assert.is_nil(groups[w.name], w.name .. " must be skipped")
      else
        assert.equals(w.group, groups[w.name], w.name)
      end
    end
    local log = sup.read(h.log)
    assert.matches('"msg":"worker skipped: no EVM RPC endpoints %(MG_EVM_RPC_URLS%)"', log)
    assert.matches('"msg":"worker skipped: no CCIP sidecar client %(MG_CCIP_SIDECAR_URL%)"', log)
    assert.is_nil(log:match("worker not available in this build"))
    assert.is_nil(sup.read(h.rcfile), "the process still runs")
    assert.equals(0, sup.stop_run(h))
  end)

  it("with MG_WORKERS_ENABLED=false starts none of them", function()
    local class = sup.uid("reg-none")
    local h = sup.start_run(dir, "none", sup.base_env{ MG_NETWORK_CLASS = class, MG_WORKERS_ENABLED = "false",
      MG_CAPITAL_TRANSFER_FOLLOWUP_ENABLED = "true", MG_VERIFY_DRIFT_ENABLED = "true" })
    sup.wait_for(function() return (sup.read(h.log) or ""):match("qtgd running") end, 20, "qtgd running")
    local line = sup.read(h.log):match('[^\n]*"msg":"qtgd running"[^\n]*')
    assert.matches('"workers":0[,}]', line)
    assert.same({}, heartbeat_groups(class))
    assert.equals(0, sup.stop_run(h))
  end)

  -- An operator override of one worker module (MG_LUA_PATH) that dies: the
  -- registry and the supervision are the real ones.
  local function override(worker)
    local d = sup.tmpdir()
    os.execute("mkdir -p " .. common.quote(d .. "/qtg/workers"))
    sup.write(d .. "/qtg/workers/" .. worker .. ".lua", [[
local qtg = require("qtg")
local M = {}
function M.tick(s) qtg.fatal("]] .. worker .. [[ meets an impossible state") end
return M
]])
    return d
  end

  it("a conditional core worker dying (ccip_stranded_reaper) stops the process non-zero", function()
    local class = sup.uid("reg-core")
    local h = sup.start_run(dir, "core-dies", sup.base_env{ MG_NETWORK_CLASS = class,
      MG_LUA_PATH = override("ccip_stranded_reaper"), MG_CCIP_STRANDED_REAPER_INTERVAL_SECONDS = "0.2" })
    assert.equals(3, sup.exit_code(h, 30))
    local log = sup.read(h.log)
    assert.matches("core worker died", log)
    assert.matches("ccip_stranded_reaper meets an impossible state", log)
  end)

  it("a conditional sidecar dying (balance_snapshot) leaves the process and the others running", function()
    local class = sup.uid("reg-side")
    local h = sup.start_run(dir, "side-dies", sup.base_env{ MG_NETWORK_CLASS = class,
      MG_LUA_PATH = override("balance_snapshot"), MG_BALANCE_SNAPSHOT_ENABLED = "true",
      MG_BALANCE_SNAPSHOT_INTERVAL_SECONDS = "0.2", MG_CCIP_STRANDED_REAPER_INTERVAL_SECONDS = "0.2" })
    sup.wait_for(function() return (sup.read(h.log) or ""):match("sidecar worker died") end, 20, "the sidecar to die")
    assert.matches("balance_snapshot meets an impossible state", sup.read(h.log))
    -- the core reaper goes on ticking: its heartbeat keeps moving
    local function reaper_tick()
      local r = sup.query([[SELECT extract(epoch from last_tick_at)::float8 AS t FROM worker_heartbeats
                             WHERE network_class = $1 AND worker_name = 'ccip_stranded_reaper']], class)[1]
      return r and r.t ~= qtg.db.NULL and r.t or nil
    end
    local t1 = sup.wait_for(reaper_tick, 20, "a reaper heartbeat")
    sup.wait_for(function() local t = reaper_tick() return t and t > t1 end, 20, "the reaper to tick again")
    assert.is_nil(sup.read(h.rcfile), "still running")
    assert.equals(0, sup.stop_run(h))
  end)
end)
