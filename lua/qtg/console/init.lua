-- qtg.console: the Lua side of the console server (src/qtg_console.c).
--
-- handle(session, kind, payload) runs in a host task for every 'e' (eval)
-- or 'c' (complete) frame and returns the final frame's type and text.
-- `session` is a table the C server made for the connection ({id, uid,
-- pid}); its environment lives in it, so each console has its own variables
-- (assignments never touch _G), its own operator commands bound to its
-- actor "console:<uid>", and print() that writes to that console only.
-- Name lookup in the environment: the session's variables, then the
-- commands, then _G (plus `qtg`, the host module).  The session table is
-- referenced by the C server until the connection ends, so a console's
-- variables live exactly as long as its connection.
local eval = require("qtg.console.eval")
local complete = require("qtg.console.complete")
local commands = require("qtg.console.commands")

local M = {}

-- print() writes control characters other than tab and newline escaped
-- (view.visible), as the console's tables do: text a client or a provider
-- wrote (an intent's asset in the signer's reading of a request) must not
-- move the operator's cursor or erase the lines being read.
local function printer(session)
  local server = require("qtg").console_server
  local visible = require("qtg.console.view").visible
  return function(...)
    local n = select("#", ...)
    local parts = {}
    for i = 1, n do parts[i] = tostring((select(i, ...))) end
    server.write(session.id, "o", visible(table.concat(parts, "\t"), true) .. "\n")
  end
end

-- xpcall as console code sees it: the handler runs once the error has
-- unwound to here.  LuaJIT runs a real xpcall's handler inside the raise,
-- where the guard's hook is off, so a handler that never returned could
-- not be stopped; here it runs under the guard like the rest of the
-- command.  (What a handler sees of the stack is the xpcall's caller.)
local function after_unwind(handler, ok, ...)
  if ok then return true, ... end
  return false, handler((...))
end

local function unwound_xpcall(f, handler, ...)
  return after_unwind(handler, pcall(f, ...))
end

-- The operator commands bound to the session's actor, over _G.
local function bound_commands(session)
  local out = printer(session)
  local cmds = commands.bind({ actor = "console:" .. tostring(session.uid), print = out })
  cmds.print = out
  cmds.qtg = require("qtg")
  cmds.xpcall = unwound_xpcall
  return setmetatable(cmds, { __index = _G })
end

-- env(session) -> the session's global environment, made on first use.
-- After a reload the session keeps its variables and gets the new commands.
function M.env(session)
  local env = rawget(session, "env")
  if env and rawget(session, "commands_module") == commands then return env end
  local cmds = bound_commands(session)
  if env then
    getmetatable(env).__index = cmds
  else
    env = setmetatable({}, { __index = cmds })
    session.env = env
  end
  session.commands_module = commands
  return env
end

-- Every evaluated chunk is on the record before it runs: an audit row
-- console.eval with the operator (the principal of the session's uid), the
-- code (the first CODE_LIMIT bytes; as hex when it is not text PostgreSQL
-- can store, so a NUL byte cannot hide a chunk), its size and the SHA-256
-- of all of it (so a chunk padded past the limit is still pinned: the
-- text an operator later shows for it must have that digest).  So every
-- chunk that wrote is audited, whatever it called.  When the row cannot be
-- written (the database down or slow, the pool exhausted, the insert
-- refused) the chunk is not run: a chunk may move money or change the
-- daemon by means of its own (a session later, a reload, a worker paused),
-- and nothing unrecorded runs in the custody daemon.  The operator is told
-- why, and the log has the chunk's size and digest.
local CODE_LIMIT = 65536

local function audit_chunk(session, code)
  local qtg = require("qtg")
  local canon = require("qtg.canon_json")
  local shown = #code > CODE_LIMIT and code:sub(1, CODE_LIMIT) or code
  local detail = { bytes = #code, pid = session.pid, sha256 = qtg.crypto.sha256_hex(code) }
  if canon.text_ok(shown) then detail.code = shown else detail.code_hex = qtg.crypto.hex(shown) end
  local ok, err = pcall(qtg.db.with_session, function(s)
    local p = require("qtg.principals").console(s, session.uid)
    s:transaction(function()
      require("qtg.outbox").audit(s, p.actor, "console.eval", "console", tostring(session.id), nil, detail)
    end)
  end)
  if not ok then
    local why = require("qtg.errors").text(err) or tostring(err)
    qtg.log.warn("console chunk refused: its audit record cannot be written", { uid = session.uid,
      bytes = detail.bytes, sha256 = detail.sha256, error = why })
    return nil, why
  end
  return true
end

function M.handle(session, kind, payload)
  if type(session) ~= "table" or type(payload) ~= "string" then
    return "x", "console: bad request from the server"
  end
  local env = M.env(session)
  if kind == "e" then
    local ok, why = audit_chunk(session, payload)
    if not ok then
      return "x", "not run: its audit record cannot be written (" .. why .. "); nothing runs in "
        .. "the console unrecorded.  If a console holds the pool's sessions (qtg.db.acquire() kept "
        .. "in a variable), interrupt or disconnect it; else try again when the database answers"
    end
    return eval.evaluate(payload, env)
  elseif kind == "c" then
    return "k", table.concat(complete.candidates(payload, env), "\n")
  end
  return "x", "console: unknown request kind " .. tostring(kind)
end

return M
