-- sd_notify without libsystemd (src/qtg_notify.c, qtg.systemd) and the
-- readiness protocol of `qtgd run` (lua/qtg/main.lua): READY=1 once the
-- workers run, RELOADING=1 (with MONOTONIC_USEC) then READY=1 around a
-- SIGHUP reload, whether the reload works or not; a no-op without
-- NOTIFY_SOCKET.  The "systemd" is tools/fake-notify-socket, a real Unix
-- datagram socket that records each message with the sender's pid as the
-- kernel reports it (SO_PASSCRED).
local qtg = require "qtg"
local cjson = require "cjson"
local ffi = require "ffi"

pcall(ffi.cdef, [[
int setenv(const char *name, const char *value, int overwrite);
int unsetenv(const char *name);
]])

local sup -- spec/lua/support/host.lua

local common = require "spec.lua.support.common"
local q = common.quote

local listeners = {}

-- Start tools/fake-notify-socket on `path`; returns the record file.
local function listen(dir, path)
  local record = dir .. "/notify-" .. #listeners .. ".jsonl"
  listeners[#listeners + 1] = common.background(("%s --socket %s --record %s"):format(
    q(sup.root .. "/tools/fake-notify-socket"), q(path), q(record)), record .. ".log")
  assert(sup.eventually(function() return sup.read(record) end, 20), "the notify socket did not start")
  return record
end

local function messages(record)
  local out = {}
  for line in (sup.read(record) or ""):gmatch("[^\n]+") do out[#out + 1] = cjson.decode(line) end
  return out
end

local function with_env(name, value, fn)
  local old = os.getenv(name)
  if value then ffi.C.setenv(name, value, 1) else ffi.C.unsetenv(name) end
  local ok, a, b = pcall(fn)
  if old then ffi.C.setenv(name, old, 1) else ffi.C.unsetenv(name) end
  if not ok then error(a, 0) end
  return a, b
end

describe("qtg.systemd.notify", function()
  local tmp
  setup(function()
    sup = require "spec.lua.support.host"
    tmp = sup.tmpdir()
  end)
  teardown(function()
    for _, pid in ipairs(listeners) do os.execute("kill " .. pid .. " 2>/dev/null") end
    listeners = {}
    os.execute("rm -rf " .. q(tmp))
  end)

  it("is a no-op without NOTIFY_SOCKET", function()
    with_env("NOTIFY_SOCKET", nil, function()
      assert.is_nil(qtg.systemd.socket())
      local ok, err = qtg.systemd.notify("READY=1")
      assert.is_false(ok)
      assert.is_nil(err)
    end)
  end)

  it("sends one datagram to a socket path, and to an abstract name", function()
    local path = tmp .. "/notify.sock"
    local record = listen(tmp, path)
    with_env("NOTIFY_SOCKET", path, function()
      assert.equals(path, qtg.systemd.socket())
      assert.is_true(qtg.systemd.notify("READY=1\nSTATUS=spec says hello"))
    end)
    local got = sup.eventually(function() return messages(record)[1] end, 10)
    assert.is_truthy(got)
    assert.equals("1", got.fields.READY)
    assert.equals("spec says hello", got.fields.STATUS)
    assert.equals(tonumber(sup.read("/proc/self/stat"):match("^(%d+)")), got.pid)

    local name = "@qtg-spec-" .. qtg.crypto.hex(qtg.crypto.random_bytes(6))
    local arecord = listen(tmp, name)
    with_env("NOTIFY_SOCKET", name, function()
      assert.is_true(qtg.systemd.notify("STOPPING=1"))
    end)
    local agot = sup.eventually(function() return messages(arecord)[1] end, 10)
    assert.is_truthy(agot)
    assert.equals("1", agot.fields.STOPPING)
  end)

  it("reports what went wrong, without raising", function()
    with_env("NOTIFY_SOCKET", tmp .. "/nobody-listens.sock", function()
      local ok, err = qtg.systemd.notify("READY=1")
      assert.is_nil(ok)
      assert.equals("notify", err.kind)
      assert.matches("cannot notify " .. tmp .. "/nobody-listens.sock: No such file or directory", err.message, 1, true)
    end)
    with_env("NOTIFY_SOCKET", "relative.sock", function()
      local ok, err = qtg.systemd.notify("READY=1")
      assert.is_nil(ok)
      assert.matches("only Unix socket paths", err.message, 1, true)
    end)
    with_env("NOTIFY_SOCKET", "/" .. string.rep("x", 200), function()
      local ok, err = qtg.systemd.notify("READY=1")
      assert.is_nil(ok)
      assert.matches("NOTIFY_SOCKET is too long", err.message, 1, true)
    end)
    with_env("NOTIFY_SOCKET", tmp .. "/x.sock", function()
      local ok, err = qtg.systemd.notify("")
      assert.is_nil(ok)
      assert.matches("non%-empty", err.message)
      ok, err = qtg.systemd.notify("READY=1\0junk")
      assert.is_nil(ok)
      assert.matches("without NUL", err.message, 1, true)
    end)
    assert.has_error(function() qtg.systemd.notify() end)
    assert.has_error(function() qtg.systemd.notify({}) end)
  end)

  it("gives CLOCK_MONOTONIC in microseconds, as qtg.monotonic counts", function()
    local a = tonumber(qtg.systemd.monotonic_usec())
    local m = qtg.monotonic() * 1e6
    local b = tonumber(qtg.systemd.monotonic_usec())
    assert.is_true(b >= a)
    assert.is_true(math.abs(m - a) < 1e6, ("monotonic_usec %d vs qtg.monotonic %d"):format(a, m))
  end)
end)

describe("qtgd run under a NOTIFY_SOCKET", function()
  local tmp
  setup(function()
    sup = require "spec.lua.support.host"
    tmp = sup.tmpdir()
  end)
  teardown(function()
    sup.stop_all()
    for _, pid in ipairs(listeners) do os.execute("kill " .. pid .. " 2>/dev/null") end
    listeners = {}
    os.execute("rm -rf " .. q(tmp))
  end)

  it("says READY=1 once its workers run, and RELOADING=1 then READY=1 around each SIGHUP", function()
    local path = tmp .. "/run-notify.sock"
    local record = listen(tmp, path)
    local over = tmp .. "/lua-override"
    os.execute("mkdir -p " .. q(over))
    local h = sup.start(sup.base_env({ NOTIFY_SOCKET = path, MG_LUA_PATH = over,
                                       MG_NETWORK_CLASS = "notify-spec" }), { "run" })
    local ready = sup.eventually(function()
      for _, m in ipairs(messages(record)) do if m.fields.READY == "1" then return m end end
    end, 30)
    assert.is_truthy(ready, sup.read(h.log))
    assert.equals(h.pid, ready.pid)
    -- sent after the workers started: the log already says so, and the
    -- status counts them
    assert.matches('"qtgd running"', sup.read(h.log), 1, true)
    local n = tonumber(ready.fields.STATUS:match("^(%d+) workers running$"))
    assert.is_truthy(n, ready.fields.STATUS)
    assert.equals(tonumber(sup.read(h.log):match('"msg":"qtgd running"[^\n]*"workers":(%d+)[,}]')), n)

    sup.signal(h, "HUP")
    local msgs = sup.eventually(function()
      local ms = messages(record)
      if #ms >= 3 then return ms end
    end, 30)
    assert.is_truthy(msgs, sup.read(h.log))
    assert.equals("1", msgs[2].fields.RELOADING)
    assert.matches("^%d+$", msgs[2].fields.MONOTONIC_USEC)
    assert.equals("1", msgs[3].fields.READY)
    assert.equals("policy reloaded", msgs[3].fields.STATUS)

    -- a broken script: the reload fails, the old code runs, and systemd
    -- still hears READY=1 (with the reason in STATUS)
    sup.write(over .. "/qtg/workers/node_recovery.lua", "return {\n")
    sup.signal(h, "HUP")
    msgs = sup.eventually(function()
      local ms = messages(record)
      if #ms >= 5 then return ms end
    end, 30)
    assert.is_truthy(msgs, sup.read(h.log))
    assert.equals("1", msgs[4].fields.RELOADING)
    assert.equals("1", msgs[5].fields.READY)
    assert.equals("policy reload failed; the old code keeps running", msgs[5].fields.STATUS)
    for _, m in ipairs(msgs) do assert.equals(h.pid, m.pid) end

    assert.equals(0, sup.stop(h, 60))
  end)
end)

describe("qtgd run under a systemd watchdog", function()
  local tmp
  setup(function()
    sup = require "spec.lua.support.host"
    tmp = sup.tmpdir()
  end)
  teardown(function()
    sup.stop_all()
    for _, pid in ipairs(listeners) do os.execute("kill " .. pid .. " 2>/dev/null") end
    listeners = {}
    os.execute("rm -rf " .. q(tmp))
  end)

  local function pings(record)
    local n = 0
    for _, m in ipairs(messages(record)) do if m.fields.WATCHDOG == "1" then n = n + 1 end end
    return n
  end

  it("pings WATCHDOG=1 while its loop turns, and not while a command holds it", function()
    local path = tmp .. "/wd-notify.sock"
    local record = listen(tmp, path)
    local run = tmp .. "/run"
    os.execute("mkdir -p " .. q(run) .. " && chmod 700 " .. q(run))
    local h = sup.start(sup.base_env({ NOTIFY_SOCKET = path, WATCHDOG_USEC = "400000",
                                       MG_CONSOLE_ENABLED = "true", MG_RUN_DIR = run,
                                       MG_NETWORK_CLASS = "notify-spec" }), { "run" })
    assert.is_truthy(sup.eventually(function() return pings(record) >= 3 end, 30), sup.read(h.log))
    for _, m in ipairs(messages(record)) do assert.equals(h.pid, m.pid) end

    -- a console command holds the loop: the pings stop while it does
    local out = tmp .. "/spin.out"
    local pid = common.background(("%s console --socket %s -e %s"):format(
      q(sup.bin), q(run .. "/console.sock"), q("qtg.log.info('spin begins') while true do end")), out)
    assert.is_truthy(sup.eventually(function() return sup.read(h.log):find("spin begins", 1, true) end, 30))
    local before = pings(record)
    os.execute("sleep 2")                      -- five intervals of 0.4 s
    assert.equals(before, pings(record))
    os.execute("kill -INT " .. pid)            -- Ctrl-C: the command ends, the loop turns again
    assert.is_truthy(sup.eventually(function() return pings(record) > before + 1 end, 30), sup.read(h.log))
    assert.equals(0, sup.stop(h, 60))
  end)

  it("sends nothing when WATCHDOG_PID names another process", function()
    local path = tmp .. "/wd2-notify.sock"
    local record = listen(tmp, path)
    local h = sup.start(sup.base_env({ NOTIFY_SOCKET = path, WATCHDOG_USEC = "200000", WATCHDOG_PID = "1",
                                       MG_NETWORK_CLASS = "notify-spec" }), { "run" })
    assert.is_truthy(sup.eventually(function()
      for _, m in ipairs(messages(record)) do if m.fields.READY == "1" then return true end end
    end, 30), sup.read(h.log))
    os.execute("sleep 1")
    assert.equals(0, pings(record))
    assert.equals(0, sup.stop(h, 60))
  end)
end)
