-- qtgd audit verify [--since ID] | export [--since ID]
--   verify  walk every audit chain and report the first broken link;
--           exit 0 when every chain holds, 1 when one is broken
--   export  every audit_events row (with id > ID) as one JSON line on
--           stdout, in id order, hashes included, for off-site storage
local audit = require "qtg.audit"

local M = {}

local function usage()
  io.stderr:write("usage: qtgd audit verify [--since ID] | export [--since ID]\n")
  return 2
end

local function parse(args)
  local since
  local i = 2
  while args[i] do
    if args[i] == "--since" and args[i + 1] and args[i + 1]:match("^%d+$") and #args[i + 1] <= 18 then
      since = tonumber(args[i + 1]); i = i + 2
    else
      return nil
    end
  end
  return { since = since }
end

-- one session for fn(s), whatever happens closed after: a whole trail's
-- walk may take longer than a worker's statement is allowed
-- (MG_DB_STATEMENT_TIMEOUT_SECONDS), so this session has no bound, and its
-- connection goes to no one else
local function with_session(fn)
  return require("qtg").db.with_discarded_session(function(s)
    require("qtg.cli").unbound(s)
    return fn(s)
  end)
end

local commands = {}

function commands.verify(opts)
  local report = with_session(function(s) return audit.verify(s, opts.since) end)
  if report.ok then
    io.stdout:write(string.format("audit verify: ok, %d rows checked, every chain holds\n",
      report.checked))
    return 0
  end
  local b = report.broken
  io.stdout:write(string.format(
    "audit verify: BROKEN at %s (chain %q, place %s): %s\n",
    b.id and ("row " .. tostring(b.id)) or "the chain's end", b.network_class,
    tostring(b.chain_seq), b.meaning))
  return 1
end

function commands.export(opts)
  with_session(function(s)
    return audit.export(s, opts.since, function(line) io.stdout:write(line, "\n") end)
  end)
  io.stdout:flush()
  return 0
end

function M.run(args)
  args = args or {}
  if args[1] == "audit" then args = { select(2, unpack(args)) } end
  local cmd = commands[args[1] or ""]
  local opts = parse(args)
  if not cmd or not opts then return usage() end
  return cmd(opts)
end

return M
