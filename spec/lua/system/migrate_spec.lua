-- `qtgd migrate` as an upgrade of a running deployment meets it: the
-- newest migration applies to a database holding work in flight.  The
-- database is migrated with every file but the newest, a child qtgd makes
-- requests in it, their nodes are put in each live state, and the full
-- directory is applied: the newest migration must go in without touching
-- the work.  A migration that rewrote the live nodes and altered the table
-- after it failed here ("pending trigger events": the rows' deferred
-- wake-up triggers were queued), which a fresh database never shows.
local qtg = require "qtg"
local common = require "spec.lua.support.common"

local q = common.quote

local CHILD = [[
local root = ...
package.path = root .. "/?.lua;" .. package.path
local qtg = require "qtg"
local sup = require "spec.lua.support.engine"
local s = qtg.db.acquire()
sup.load_doc(s, sup.doc("spec_migrate_live", { { "a", "action", "withdrawal", { sim = { observes = 1 } } } }))
for i = 1, 5 do
  local r = sup.create_approved(s, "spec_migrate_live", { intent = { asset = "USDC", amount = tostring(i) } })
  io.stdout:write("request=", r.id, "\n")
end
return 0]]

-- The path from READY to each live state, along the transition table.
local PATHS = { { "READY" }, { "SUBMITTING" }, { "SUBMITTED" }, { "SUBMITTED", "OBSERVING" }, { "UNKNOWN" } }

describe("qtgd migrate", function()
  local support, s, dir, db, url
  setup(function()
    support = require "spec.lua.support.host"
    s = qtg.db.acquire()
    dir = support.tmpdir()
  end)
  teardown(function()
    if db then support.drop_database(s, db) end
    s:release()
    os.execute("rm -rf " .. q(dir))
  end)

  it("applies the newest migration to a database with nodes in every live state", function()
    local files = {}
    for name in common.sh("ls " .. q(support.root .. "/sql")):gmatch("[^\n]+") do
      if name:match("^%d%d%d%d_.*%.sql$") then files[#files + 1] = name end
    end
    table.sort(files)
    assert.is_true(#files > 1)
    local newest = files[#files]
    os.execute("mkdir -p " .. q(dir .. "/older"))
    for i = 1, #files - 1 do
      os.execute(("cp %s %s"):format(q(support.root .. "/sql/" .. files[i]), q(dir .. "/older/")))
    end

    db = "qtg_migrate_" .. qtg.crypto.hex(qtg.crypto.random_bytes(4))
    s:exec("CREATE DATABASE " .. db)
    url = common.database_url(db)
    local env = common.base_env({ MG_DATABASE_URL = url })
    local rc, out = support.run(env, { q(support.bin), "migrate", q(dir .. "/older") })
    assert.equals(0, rc, out)
    common.write(dir .. "/child.lua", CHILD)
    rc, out = support.run(env, { q(support.bin), "exec", q(dir .. "/child.lua"), q(support.root) })
    assert.equals(0, rc, out)
    local ids = {}
    for id in out:gmatch("request=([%x%-]+)") do ids[#ids + 1] = id end
    assert.equals(#PATHS, #ids, out)

    local want = {}
    for i, path in ipairs(PATHS) do
      for _, st in ipairs(path) do
        if st ~= "READY" then
          common.psql(url, ("UPDATE movement_request_nodes SET node_state = '%s' WHERE request_id = '%s'")
            :format(st, ids[i]))
        end
      end
      want[ids[i]] = path[#path]
    end
    -- the requests EXECUTING, as a live system's are
    common.psql(url, "UPDATE movement_requests SET request_state = 'EXECUTING' WHERE request_state = 'APPROVED'")

    rc, out = support.run(env, { q(support.bin), "migrate" })
    assert.equals(0, rc, out)
    assert.matches("applied " .. newest, out, 1, true)
    assert.matches("1 applied, " .. (#files - 1) .. " already applied", out, 1, true)
    for line in common.psql(url, "SELECT request_id || '=' || node_state FROM movement_request_nodes"):gmatch("[^\n]+") do
      local id, st = line:match("^(.-)=(.*)$")
      assert.equals(want[id], st, line)
    end
  end)
end)
