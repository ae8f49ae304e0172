-- tools/chaos.d/hook.lua -- the kill switch of the chaos overrides
-- (override/qtg/...): a process dies by SIGKILL at an exact point of its
-- work when the chaos driver has armed a token for that point.
--
-- Armed: the file $QTG_CHAOS_TOKENS/<point>.token exists.  The first process
-- to reach the point renames it (rename is atomic, so exactly one process
-- takes each token), appends "<point> <detail> <pid>" to
-- $QTG_CHAOS_TOKENS/kills.log, and kills itself with SIGKILL: no Lua,
-- C or PostgreSQL clean-up runs, exactly as if the machine lost the
-- process there.  Without QTG_CHAOS_TOKENS nothing ever fires.
local ffi = require "ffi"
local qtg = require "qtg"

ffi.cdef [[ int kill(int pid, int sig); ]]

local M = {}

local dir = os.getenv("QTG_CHAOS_TOKENS")

function M.maybe_die(point, detail)
  if not dir or dir == "" then return end
  local pid = qtg.pid()
  local taken = string.format("%s/%s.taken.%d.%d", dir, point, pid, math.floor(qtg.now() * 1000))
  if not os.rename(dir .. "/" .. point .. ".token", taken) then return end
  local f = io.open(dir .. "/kills.log", "a")
  if f then
    f:write(point, " ", tostring(detail), " ", tostring(pid), "\n")
    f:close()
  end
  ffi.C.kill(pid, 9)
end

return M
