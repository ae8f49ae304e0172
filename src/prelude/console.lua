-- console trampoline (src/qtg_console.c): one console frame of a session,
-- guarded (time limit and interrupt) and handed to qtg.console.
local session, kind, payload = ...
require('qtg').console_server.guard(session.id)
return require('qtg.console').handle(session, kind, payload)
