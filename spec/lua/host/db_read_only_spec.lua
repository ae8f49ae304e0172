-- A server that turns read-only under a running daemon: the way a failover
-- runbook fences an old primary (default_transaction_read_only, reloaded,
-- reaches the sessions already open).  The pool kept a connection while it
-- worked, so every qtgd stayed on the fenced server for good, its workers
-- failing at every pass, while the new primary got no work, and /readyz
-- said ready.  Now the first statement refused with SQLSTATE 25006 closes
-- the pool's connections and the listener's (new ones go through
-- MG_DATABASE_URL, whose target_session_attrs=read-write passes such a
-- server over), and /readyz fails while the server takes no writes.  The
-- spec runs on a cluster of its own (it alters the whole cluster).
local qtg = require "qtg"
local common = require "spec.lua.support.common"

local q = common.quote

describe("a database server that turns read-only", function()
  local host, api, dir, url, d

  local function psql(...)
    local args = {}
    for i, sql in ipairs({ ... }) do args[i] = "-c " .. q(sql) end
    local out, rc = common.sh(("psql %s -v ON_ERROR_STOP=1 -Atq %s"):format(q(url), table.concat(args, " ")))
    assert(rc == 0, out)
    return out
  end

  local function qtgd_pids()
    local set = {}
    for pid in psql("SELECT pid FROM pg_stat_activity WHERE application_name = 'qtgd'"):gmatch("%d+") do
      set[pid] = true
    end
    return set
  end

  setup(function()
    host = require "spec.lua.support.host"
    api = require "spec.lua.support.api"
    dir = host.tmpdir()
    local out, rc = common.sh(q(host.root .. "/tools/pg") .. " --dir " .. q(dir .. "/pg") .. " --fast ensure")
    assert(rc == 0, out)
    url = out:match("(postgresql://%S+)%s*$")
    assert(url, out)
    local env = common.base_env({ MG_DATABASE_URL = url })
    local mrc, mout = host.run(env, { q(host.bin), "migrate" })
    assert(mrc == 0, mout)
  end)
  teardown(function()
    if d then pcall(api.stop, d) end
    common.sh(q(host.root .. "/tools/pg") .. " --dir " .. q(dir .. "/pg") .. " destroy")
    os.execute("rm -rf " .. q(dir))
  end)

  it("closes the daemon's connections to it, says so, fails /readyz, and goes on once it takes writes", function()
    d = api.start({ MG_DATABASE_URL = url })
    local reader = api.token("read", { class = d.class, env = { MG_DATABASE_URL = url } })
    local function database_check()
      local r = api.call(d, "GET", "/readyz", { token = reader })
      for _, c in ipairs(r.json and r.json.checks or {}) do
        if c.name == "database" then return r.status, c end
      end
      return r.status, nil
    end
    local status, c = database_check()
    assert.equal(200, status)
    assert.equal("ok", c.status)
    local before = common.wait_for(function()
      local p = qtgd_pids()
      return next(p) and p
    end, 10, "the daemon's sessions")

    psql("ALTER SYSTEM SET default_transaction_read_only = on", "SELECT pg_reload_conf()")
    local ok, err = pcall(function()
      common.wait_log(d.h, "is read%-only %(SQLSTATE 25006%): the pool closes its connections", 30,
        "the pool to find the server read-only")
      common.wait_log(d.h, "listener connection lost", 10, "the listener to reconnect")
      common.wait_for(function()
        local st, chk = database_check()
        return st == 503 and chk and chk.status == "failing" and chk.detail:find("read-only", 1, true)
      end, 10, "/readyz to fail on the read-only server")
    end)
    -- the spec's own session may write again whatever happened above
    psql("SET default_transaction_read_only = off", "ALTER SYSTEM RESET default_transaction_read_only",
      "SELECT pg_reload_conf()")
    assert(ok, err)

    -- none of the sessions open before it is left: each was closed, idle
    -- ones at once, the others at their release
    common.wait_for(function()
      for pid in pairs(qtgd_pids()) do
        if before[pid] then return false end
      end
      return true
    end, 30, "the sessions opened before to be closed")
    common.wait_for(function()
      local st, chk = database_check()
      return st == 200 and chk.status == "ok"
    end, 10, "/readyz to pass once the server takes writes")
    assert.truthy(next(qtgd_pids()), "the daemon has sessions again")
  end)
end)
