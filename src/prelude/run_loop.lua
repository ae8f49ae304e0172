-- qtg.run_loop trampoline (src/qtg_runtime.c): returns the function that
-- runs one tick of a worker on a fresh session, keeps the traceback of an
-- error (and whether it is fatal), and checks that the tick returned a count.
local db = require('qtg').db
local traceback, xpcall, type, tonumber = debug.traceback, xpcall, type, tonumber
local function keep(e) return {err = e, traceback = traceback('', 2)} end
local mt = {__tostring = function(t) return tostring(t.err) end}
return function(tick, name)
  local s = db.acquire()
  local ok, res = xpcall(tick, keep, s)
  s:release()
  if not ok then
    local e = res.err
    res.fatal = type(e) == 'table' and e.fatal or nil
    error(setmetatable(res, mt), 0)
  end
  if res == nil then return 0 end
  local n = tonumber(res)
  if n == nil then error('tick of ' .. name .. ' returned ' .. type(res) .. ', not a count', 0) end
  return n
end
