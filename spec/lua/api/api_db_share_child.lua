-- api_db_share_child: run by api_db_share_spec as `qtgd exec` under a
-- role allowed two connections, MG_DB_POOL_SIZE=4, MG_API_DB_SESSIONS=1:
-- one session of the share and one other take both connections, then a
-- second acquire of the share waits.  The pool has room for two more
-- connections, but that acquire may not have one (the share is in use):
-- it must wait for the share's session, not open a connection (which the
-- role's limit refuses, failing it or, connect after refused connect,
-- storming the server).  Writes {waited =, got_pid =, share_pid =, err =,
-- max_open =} to its last argument.
local qtg = require "qtg"
local common = require "spec.lua.support.common"

local out = arg[#arg]

return common.child_main(function()
  local share = qtg.db.acquire("api")
  local share_pid = share:query("SELECT pg_backend_pid() AS pid")[1].pid
  local other = qtg.db.acquire()
  other:query("SELECT 1")
  local got_pid, err, done = nil, nil, false
  local t = qtg.spawn(function()
    local ok, s = pcall(qtg.db.acquire, "api")
    if ok then
      got_pid = s:query("SELECT pg_backend_pid() AS pid")[1].pid
      s:release()
    else
      err = require("qtg.errors").text(s)
    end
    done = true
  end)
  -- the pool's connections, open or opening, every 10 ms for a second
  local max_open = 0
  for _ = 1, 100 do
    max_open = math.max(max_open, qtg.db.stats().open)
    qtg.sleep(0.01)
  end
  local waited = not done
  share:release()
  qtg.join(t)
  other:release()
  return { ok = true, waited = waited, got_pid = got_pid, share_pid = share_pid, err = err, max_open = max_open }
end, out)
