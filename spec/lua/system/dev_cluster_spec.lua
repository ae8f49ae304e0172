-- The development cluster (tools/pg) trusts local connections, so its
-- socket must be reachable by its own OS user alone: another local account
-- cannot connect.  Tried against the throwaway cluster of this test run
-- (QTG_PG_DIR), as the unprivileged `nobody`, next to a control that runs
-- the same psql as root.
local support = require "spec.lua.support.host"
local common = require "spec.lua.support.common"
local q = common.quote

local PSQL = "/usr/lib/postgresql/15/bin/psql"

local function sockdir()
  local dir = assert(os.getenv("QTG_PG_DIR"), "QTG_PG_DIR is not set (run through tools/test)")
  return (assert(support.read(dir .. "/sockdir"), "no sockdir file"):gsub("%s+$", ""))
end

local function psql(prefix)
  local cmd = string.format("cd / && %s %s -X -h %s -p 5432 -U qtg -d qtg -tAc 'SELECT 42' 2>&1; echo \"__rc=$?\"",
    prefix, PSQL, q(sockdir()))
  local p = io.popen(cmd)
  local out = p:read("*a")
  p:close()
  return tonumber(out:match("__rc=(%d+)")), out
end

describe("the development cluster", function()
  local root = io.popen("id -u"):read("*l") == "0"

  it("keeps its socket directory to its own OS user (mode 0700)", function()
    local p = io.popen("stat -c %a " .. q(sockdir()))
    local mode = p:read("*l")
    p:close()
    assert.equals("700", mode)
  end)

  it("refuses another local user, while its own user connects", function()
    if not root then
      pending("not root: cannot switch to another OS user here")
      return
    end
    local rc, out = psql("")
    assert.equals(0, rc, out)
    assert.matches("42", out)
    rc, out = psql("runuser -u nobody --")
    assert.is_not.equals(0, rc)
    assert.matches("Permission denied", out)
  end)
end)
