-- console_client_spec: the interactive side of `qtgd console`
-- (src/qtg_console_client.c, docs/console.md "Attaching"): on a terminal the
-- client edits lines with libedit, completes with Tab from the daemon's live
-- state, shows a continuation prompt for an incomplete chunk, sends an
-- interrupt on Ctrl-C while a command runs and drops the line on Ctrl-C at
-- the prompt, leaves with status 0 on Ctrl-D and keeps its history in
-- ~/.qtg_console_history (mode 0600).
--
-- A real `qtgd run` with its console on a socket in a temporary directory;
-- spec/lua/console/console_pty.py types into `qtgd console` in a pseudo-terminal
-- (two sessions, HOME a temporary directory, umask 022) and writes what it
-- saw after each step, the exit codes and the history file as JSON.  Every
-- wait is bounded and polls; nothing sleeps a fixed time.  The evaluation
-- itself (pretty printer, completion candidates) is console_spec's.
local cjson = require "cjson"
local common = require "spec.lua.support.common"

local support = require "spec.lua.support.host"
local q = common.quote

local CTRL_C, CTRL_D, CTRL_P, TAB = "\3", "\4", "\16", "\t"
local PROMPT = [[qtg> \Z]]         -- the primary prompt, last on the screen
local MORE = [[  \.\.\. \Z]]      -- the continuation prompt

-- The typed sessions: {name, text to type, a Python regex (re.M) that ends
-- the step once it matches the screen text of what the step read}.  The
-- driver types once libedit has the terminal in its editing mode; `tty =
-- "cooked"` is for Ctrl-C while a command runs (libedit has handed the
-- terminal back).
local function step(name, send, expect, tty)
  return { name = name, send = send, expect = expect, tty = tty }
end
local SESSIONS = {
  {
    step("banner", nil, PROMPT),
    -- Tab completes a field (the one candidate) and a global (the command)
    step("complete_field", "type(qtg.runtime.tick_" .. TAB, [[tick_now\Z]]),
    step("complete_field_run", ")\n", PROMPT),
    step("complete_global", "type(wor" .. TAB, [[type\(workers\Z]]),
    step("complete_global_run", ")\n", PROMPT),
    -- several candidates with no longer common prefix: listed, line kept
    step("complete_list", "qtg.runtime.s" .. TAB, [[^qtg> qtg\.runtime\.s\Z]]),
    -- Ctrl-C at the prompt drops the line: `=1+1` alone is evaluated
    step("prompt_ctrl_c", CTRL_C, PROMPT),
    step("expr", "=1+1\n", PROMPT),
    -- an incomplete chunk continues; the whole loop runs once it is complete
    step("loop_head", "for i = 1, 3 do\n", MORE),
    step("loop_body", "print('row ' .. i * 10)\n", MORE),
    step("loop_end", "end\n", PROMPT),
    -- Ctrl-C at the continuation prompt drops the chunk typed so far
    step("chunk_head", "for i = 1, 2 do\n", MORE),
    step("chunk_typed", "print('dropped')", [[dropped'\)\Z]]),
    step("chunk_ctrl_c", CTRL_C, PROMPT),
    step("after_drop", "=40+2\n", PROMPT),
    -- Ctrl-C interrupts a command computing in Lua ...
    step("busy", "print('spinning') while true do end\n", [[^spinning$]]),
    step("busy_ctrl_c", CTRL_C, PROMPT, "cooked"),
    step("after_busy", "=7*8\n", PROMPT),
    -- ... and one waiting (a sleep far over the driver's deadline)
    step("sleep", "print('sleeping') qtg.sleep(600)\n", [[^sleeping$]]),
    step("sleep_ctrl_c", CTRL_C, PROMPT, "cooked"),
    step("after_sleep", "=9*9\n", PROMPT),
    { name = "ctrl_d", send = CTRL_D, eof = true },
  },
  {
    -- a new session loads the history: Ctrl-P recalls the last command
    step("banner", nil, PROMPT),
    step("recall", CTRL_P, [[^qtg> =9\*9\Z]]),
    step("recall_run", "\n", PROMPT),
    { name = "ctrl_d", send = CTRL_D, eof = true },
  },
}

describe("qtgd console on a terminal", function()
  local dir, daemon, result
  local steps = {}            -- "session.step" -> what was seen

  local function seen(key)
    local s = steps[key]
    assert(s, "no step " .. key .. " in the driver's result")
    return s.text
  end

  -- the screen lines of a step
  local function lines(key)
    local out = {}
    for l in (seen(key) .. "\n"):gmatch("(.-)\n") do out[#out + 1] = l end
    return out
  end

  local function has_line(key, want)
    for _, l in ipairs(lines(key)) do if l == want then return true end end
    return false
  end

  setup(function()
    dir = support.tmpdir()
    local sock = dir .. "/run/console.sock"
    os.execute("mkdir -p " .. q(dir .. "/home") .. " " .. q(dir .. "/run") .. " && chmod 700 " .. q(dir .. "/run"))
    daemon = support.start(support.base_env{
      MG_CONSOLE_ENABLED = "true", MG_CONSOLE_SOCKET = sock, MG_LOG_LEVEL = "warn",
      MG_WORKERS_ENABLED = "false",
    }, { "run" })
    local up = support.eventually(function()
      return support.run({}, { q(support.bin), "console", "--socket", q(sock), "-e", q("return 1") }) == 0
    end, 60, 0.1)
    assert(up, "the console socket did not answer within 60 s:\n" .. tostring(support.read(daemon.log)))

    local out = dir .. "/result.json"
    local rc, text = support.run({}, { "python3", q(support.root .. "/spec/lua/console/console_pty.py"),
      "--bin", q(support.bin), "--socket", q(sock), "--home", q(dir .. "/home"), "--out", q(out),
      "--timeout", "20", q(cjson.encode(SESSIONS)) })
    local json = support.read(out)
    assert(rc == 0 and json, ("console_pty.py failed (exit %s): %s\ndaemon log:\n%s"):format(
      tostring(rc), text, tostring(support.read(daemon.log))))
    result = cjson.decode(json)
    for i, session in ipairs(result.sessions) do
      for _, s in ipairs(session.steps) do steps[i .. "." .. s.name] = s end
    end
  end)

  teardown(function()
    if daemon then support.stop(daemon, 30) end
    support.stop_all()
    if dir then os.execute("rm -rf " .. q(dir)) end
  end)

  it("greets with the daemon's banner and the primary prompt", function()
    assert.truthy(seen("1.banner"):find("^qtgd [^\n]* console session %d+ as uid %d+\n"), seen("1.banner"))
    assert.truthy(seen("1.banner"):find("Ctrl%-D leaves%.\nqtg> $"), seen("1.banner"))
  end)

  it("Tab completes a table field and a global, into the line that is run", function()
    -- the redrawn line holds the completion, and the completed name is what ran
    assert.equals("qtg> type(qtg.runtime.tick_now", seen("1.complete_field"))
    assert.is_true(has_line("1.complete_field_run", '"function"'), seen("1.complete_field_run"))
    assert.equals("qtg> type(workers", seen("1.complete_global"))
    assert.is_true(has_line("1.complete_global_run", '"function"'), seen("1.complete_global_run"))
  end)

  it("Tab lists the candidates when they share no longer prefix, and keeps the line", function()
    assert.is_true(has_line("1.complete_list", "qtg.runtime.set_interval  qtg.runtime.set_tick  "
      .. "qtg.runtime.shutdown  qtg.runtime.start_worker  qtg.runtime.stop_worker  qtg.runtime.stopping"),
      seen("1.complete_list"))
  end)

  -- the line editor's Ctrl-C (the terminal does not echo one in its editing
  -- mode) and the primary prompt again; then `expr` alone is evaluated
  local function line_dropped(ctrl_c, after, expr, value)
    assert.truthy(seen(ctrl_c):find("^%^C\nqtg> $"), seen(ctrl_c))
    assert.same({ expr, value, "qtg> " }, lines(after))
  end

  it("Ctrl-C at the prompt drops the line typed", function()
    -- `qtg.runtime.s` is gone: `=1+1` alone was evaluated
    line_dropped("1.prompt_ctrl_c", "1.expr", "=1+1", "2")
  end)

  it("Ctrl-C at the continuation prompt drops the chunk and returns to the primary prompt", function()
    line_dropped("1.chunk_ctrl_c", "1.after_drop", "=40+2", "42")
  end)

  it("an incomplete chunk continues at the `  ... ` prompt and runs whole", function()
    assert.same({ "for i = 1, 3 do", "  ... " }, lines("1.loop_head"))
    -- nothing ran before the chunk was complete
    assert.same({ "print('row ' .. i * 10)", "  ... " }, lines("1.loop_body"))
    assert.same({ "end", "row 10", "row 20", "row 30", "qtg> " }, lines("1.loop_end"))
  end)

  -- Ctrl-C while a command runs: the client says it sent the interrupt, the
  -- command fails with `interrupted: WHY`, and the next command works
  for _, case in ipairs({
    { "computing in Lua", "busy", "stopped by the operator", "=7*8", "56" },
    { "waiting in qtg.sleep", "sleep", "stopped by the operator", "=9*9", "81" },
  }) do
    local what, name, why, expr, value = unpack(case)
    it("Ctrl-C interrupts a command " .. what .. "; the session goes on", function()
      local t = seen("1." .. name .. "_ctrl_c")
      assert.truthy(t:find("(interrupt sent)\ninterrupted: " .. why .. "\n", 1, true), t)
      assert.same({ expr, value, "qtg> " }, lines("1.after_" .. name))
    end)
  end

  it("Ctrl-D at an empty prompt leaves with status 0", function()
    -- what the client wrote after the Ctrl-D (under the sanitizer build, a
    -- leak report and status 1 would be there)
    for i = 1, 2 do
      local s = result.sessions[i]
      assert.equals(0, s.exit_code, ("session %d: signal %s, after Ctrl-D: %s"):format(i,
        s.signal == cjson.null and "none" or tostring(s.signal), s.steps[#s.steps].text))
      -- nothing but the end of the line (and the terminal's ^D)
      assert.equals("\n", (s.steps[#s.steps].text:gsub("%^D", "")))
    end
  end)

  it("keeps the commands in ~/.qtg_console_history, mode 0600 under umask 022, for the next session", function()
    local h = result.history
    assert.is_true(h.exists, cjson.encode(h))
    assert.equals("600", h.mode)
    -- every command run, in order, as typed after completion; multi-line
    -- chunks as one entry; what Ctrl-C dropped is not there
    assert.same({
      "type(qtg.runtime.tick_now)",
      "type(workers)",
      "=1+1",
      "for i = 1, 3 do\nprint('row ' .. i * 10)\nend",
      "=40+2",
      "print('spinning') while true do end",
      "=7*8",
      "print('sleeping') qtg.sleep(600)",
      "=9*9",
    }, h.entries)
    -- the second session recalled the last command and ran it
    assert.same({ "", "81", "qtg> " }, lines("2.recall_run"))
  end)
end)
