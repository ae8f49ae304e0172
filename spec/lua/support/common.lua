-- spec/lua/support/common.lua -- what the spec support modules share
-- (conditional_, sidecar_, engine_, host_ and evm_support, and the child
-- scripts conditional_child and sidecar_child): shell quoting, the tree and
-- the qtgd binary, files, temporary directories, unique ids, polling until
-- a deadline, one worker tick and one query on a fresh session, processes
-- started in the background (qtgd children and their result files, `qtgd
-- run` with its exit code, stand-in servers and their port files) and
-- JSON-RPC to a dev chain.  Waiting always polls with qtg.sleep, so the
-- host's loop never blocks.  Does no I/O while it loads (a spec requires it
-- from inside its blocks: `require` cannot yield).
local qtg = require "qtg"
local cjson = require "cjson"
local canon = require "qtg.canon_json"

local M = {}

-- ---- the shell, the tree, the binary --------------------------------------------

-- quote(s) -> s as one single-quoted shell word.
local function quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
M.quote = quote

-- The tree qtgd runs from: $QTG_ROOT, else the host's own root.
local function root()
  local r = os.getenv("QTG_ROOT")
  if r and r ~= "" then return r end
  return qtg.root
end
M.root = root

-- The qtgd binary for child processes: $QTG_BIN, else the running one (the
-- parent of the shell io.popen starts).
local function bin()
  local b = os.getenv("QTG_BIN")
  if b and b ~= "" then return b end
  local p = io.popen("readlink -f /proc/$PPID/exe")
  local path = p:read("*l")
  p:close()
  return path
end
M.bin = bin

-- ---- files, temporary directories, ids --------------------------------------------

-- read(path) -> the file's bytes, or nil when it cannot be opened.
local function read(path)
  local f = io.open(path, "rb")
  if f then
    local data = f:read("*a")
    f:close()
    return data
  end
  return nil
end
M.read = read

-- write(path, data[, mode]): replace the file; mode ("600") is chmod'ed.
local function write(path, data, mode)
  local f, err = io.open(path, "wb")
  if not f then error("cannot write " .. path .. ": " .. tostring(err), 2) end
  f:write(data)
  f:close()
  if mode and os.execute("chmod " .. mode .. " " .. quote(path)) ~= 0 then
    error("cannot chmod " .. mode .. " " .. path, 2)
  end
end
M.write = write

-- tmpdir(name[, keep]) -> a fresh directory /tmp/NAME.XXXXXX, appended to
-- the list keep when given (for remove_dirs at teardown).
local function tmpdir(name, keep)
  local p = io.popen("mktemp -d " .. quote("/tmp/" .. name .. ".XXXXXX"))
  local dir = p:read("*l")
  p:close()
  if not dir or dir == "" then error("mktemp -d /tmp/" .. name .. ".XXXXXX gave no directory", 2) end
  if keep then keep[#keep + 1] = dir end
  return dir
end
M.tmpdir = tmpdir

-- remove_dirs(list): rm -rf every directory in list and empty it.
local function remove_dirs(list)
  for i = #list, 1, -1 do
    os.execute("rm -rf " .. quote(list[i]))
    list[i] = nil
  end
end
M.remove_dirs = remove_dirs

-- kill_pids(list): SIGTERM every process id in list and empty it.
local function kill_pids(list)
  for i = #list, 1, -1 do
    os.execute("kill " .. list[i] .. " 2>/dev/null")
    list[i] = nil
  end
end
M.kill_pids = kill_pids

-- uid(prefix, bytes) -> "PREFIX-<2*bytes random hex digits>".
local function uid(prefix, bytes)
  return prefix .. "-" .. qtg.crypto.hex(qtg.crypto.random_bytes(bytes))
end
M.uid = uid

-- ---- waiting ----------------------------------------------------------------------------

-- poll(fn, seconds, step) -> fn's first truthy value, or nil once `seconds`
-- (default 20) have passed; fn is called every `step` seconds (0.05).
local function poll(fn, seconds, step)
  local deadline = qtg.monotonic() + (seconds or 20)
  while true do
    local v = fn()
    if v then return v end
    if qtg.monotonic() > deadline then return nil end
    qtg.sleep(step or 0.05)
  end
end
M.poll = poll

-- wait_for(fn, seconds, what, step) -> fn's first truthy value; like poll,
-- but a timeout raises an error naming `what` (a string, or a function
-- called then, for a description of the state at that time) and what was
-- seen: the second value fn returned last, when it gave one.
local function wait_for(fn, seconds, what, step)
  seconds = seconds or 20
  local seen
  local v = poll(function()
    local value, state = fn()
    seen = state
    return value
  end, seconds, step)
  if v then return v end
  if type(what) == "function" then what = what() end
  error(("timed out after %s s waiting for %s%s"):format(seconds, tostring(what or "a condition"),
    seen ~= nil and ("; last seen: " .. tostring(seen)) or ""), 2)
end
M.wait_for = wait_for

-- wait_port_file(path, seconds, what[, log]) -> port, pid: waits for a
-- stand-in server's "PORT[ PID]" file; on timeout the error shows the log.
local function wait_port_file(path, seconds, what, log)
  local text = wait_for(function() return read(path) end, seconds, function()
    return tostring(what) .. " to write " .. path .. (log and (" (log " .. log .. ": "
      .. tostring(read(log)) .. ")") or "")
  end)
  local port, pid = text:match("^(%d+)%s*(%d*)")
  if not port then error("no port in " .. path .. ": " .. text, 2) end
  return tonumber(port), pid ~= "" and pid or nil
end
M.wait_port_file = wait_port_file

-- ---- the database -------------------------------------------------------------------

-- tick(worker) -> the count of one tick of qtg.workers.WORKER on a fresh
-- session, as the runtime runs it (an open transaction is rolled back).
local function tick(worker)
  local w = require("qtg.workers." .. worker)
  local s = qtg.db.acquire()
  local ok, n = pcall(w.tick, s)
  if s:in_transaction() then s:rollback() end
  s:release()
  if not ok then error(n, 0) end
  return n
end
M.tick = tick

-- query(sql, ...) -> rows, n on a session of its own (released on error).
local function session_query(s, sql, ...) return s:query(sql, ...) end
local function query(sql, ...)
  return qtg.db.with_session(session_query, sql, ...)
end
M.query = query

-- unfrozen(s, sql, ...): one statement with triggers off (a superuser's
-- session_replication_role = replica), for a spec moving a request that
-- left PENDING_APPROVAL to another network class: the freeze trigger
-- (sql/0070) refuses that to everyone else.
function M.unfrozen(s, sql, ...)
  s:query("SET session_replication_role = replica")
  local ok, res = pcall(s.query, s, sql, ...)
  s:query("RESET session_replication_role")
  if not ok then error(res, 0) end
  return res
end

-- ---- processes ---------------------------------------------------------------------------

-- base_env(extra) -> the environment of a child qtgd: this database, no
-- console, info logs; extra overrides.
function M.base_env(extra)
  local env = { MG_DATABASE_URL = os.getenv("MG_DATABASE_URL"), MG_CONSOLE_ENABLED = "false",
                MG_LOG_LEVEL = "info" }
  for k, v in pairs(extra or {}) do env[k] = v end
  return env
end

-- env_words(env) -> "K='v' ..." (sorted by name), for `env`.
local function env_words(env)
  local names = {}
  for k in pairs(env or {}) do names[#names + 1] = k end
  table.sort(names)
  for i, k in ipairs(names) do names[i] = k .. "=" .. quote(env[k]) end
  return table.concat(names, " ")
end
M.env_words = env_words

-- background(cmd, log) -> pid: runs the shell command cmd in the background
-- (stdin /dev/null, stdout and stderr to log).
local function background(cmd, log)
  local p = io.popen(cmd .. " </dev/null >" .. quote(log) .. " 2>&1 & echo $!")
  local pid = tonumber(p:read("*l"))
  p:close()
  if not pid then error("cannot start in the background: " .. cmd, 2) end
  return pid
end
M.background = background

-- start_script(dir, name, env, script, args) -> {out=, log=}: a child
-- `qtgd exec spec/lua/SCRIPT ARGS... DIR/NAME.result` in the background,
-- with env (and MG_CONSOLE_ENABLED=false) and its output in DIR/NAME.log.
-- The script writes its result file by rename (see child_main).
function M.start_script(dir, name, env, script, args)
  local child = { out = dir .. "/" .. name .. ".result", log = dir .. "/" .. name .. ".log" }
  local e = {}
  for k, v in pairs(env or {}) do e[k] = v end
  e.MG_CONSOLE_ENABLED = "false"
  local words = { "env", env_words(e), quote(bin()), "exec", quote(root() .. "/spec/lua/" .. script) }
  for _, a in ipairs(args) do words[#words + 1] = quote(a) end
  words[#words + 1] = quote(child.out)
  local line = table.concat(words, " ") .. " </dev/null >" .. quote(child.log) .. " 2>&1 &"
  if os.execute(line) ~= 0 then error("cannot start " .. line, 2) end
  return child
end

-- wait_result(child, seconds) -> the decoded result of a start_script child.
function M.wait_result(child, seconds)
  local text = wait_for(function() return read(child.out) end, seconds, function()
    return "child " .. child.out .. " (log: " .. tostring(read(child.log)) .. ")"
  end)
  return cjson.decode(text)
end

-- child_main(run, out) -> exit code: the end of a child script.  Writes
-- run()'s table, or {ok=false, error=} when it raised, to `out` by rename
-- (the parent never reads half a file).
function M.child_main(run, out)
  local ok, res = pcall(run)
  if not ok then res = { ok = false, error = tostring(res) } end
  write(out .. ".tmp", canon.encode(res))
  assert(os.rename(out .. ".tmp", out))
  return ok and 0 or 1
end

-- start_qtgd(h, env, args, qtgd, seconds) -> h: `QTGD ARGS...` (shell
-- words) with env in the background, its output in h.log and its exit code
-- written to h.rcfile.  Sets h.subshell, and h.pid once the qtgd process
-- shows up (nil if it did not within `seconds`: it may have exited).
function M.start_qtgd(h, env, args, qtgd, seconds)
  local cmd = ("(env %s %s %s >%s 2>&1; echo $? >%s) </dev/null >/dev/null 2>&1 & echo $!"):format(
    env_words(env), quote(qtgd), table.concat(args, " "), quote(h.log), quote(h.rcfile))
  local p = io.popen("sh -c " .. quote(cmd))
  h.subshell = tonumber(p:read("*l"))
  p:close()
  if not h.subshell then error("cannot start " .. cmd, 2) end
  -- the qtgd process is the subshell's child
  h.pid = poll(function()
    local g = io.popen("pgrep -P " .. h.subshell .. " -f qtgd")
    local pid = tonumber(g:read("*l") or "")
    g:close()
    return pid
  end, seconds)
  return h
end

-- exit_code(h, seconds) -> the exit code of a start_qtgd process, or nil
-- if it has not exited within `seconds` (default 30).
function M.exit_code(h, seconds)
  return poll(function()
    local t = read(h.rcfile)
    return t and tonumber(t:match("%d+"))
  end, seconds or 30)
end

-- ---- a dev chain (anvil) ----------------------------------------------------------------

-- The dev accounts of anvil's default mnemonic ("test test ... junk"); their
-- keys are public (dev only).
M.DEV = {
  { address = "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266", key = "ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80" },
  { address = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8", key = "59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d" },
  { address = "0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc", key = "5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a" },
  { address = "0x90f79bf6eb2c4f870365e785982e1f101e93b906", key = "7c852118294e51e653712a81e05800f419141751be58f605c371e15141b007a6" },
  { address = "0x15d34aaf54267db7d7c367839aaf71a00a2c6a65", key = "47e179ec197488593b187f80a00eb0da91f1b9d0b13f8733639f19c30a34926a" },
  { address = "0x9965507d1a55bcc2695c58ba16fb37d819b0a4dc", key = "8b3a350cf5c34c9194ca85829a2df0ec3153be0318b5e2d3348e872092edffba" },
}

-- rpc(url, method, params) -> result; raises on any error.
function M.rpc(url, method, params)
  local parts = {}
  for i, v in ipairs(params or {}) do parts[i] = cjson.encode(v) end
  local body = string.format('{"jsonrpc":"2.0","id":1,"method":"%s","params":[%s]}', method,
    table.concat(parts, ","))
  local resp, err = qtg.http.request{ method = "POST", url = url, body = body, timeout = 10,
    headers = { ["Content-Type"] = "application/json" } }
  if not resp then error("rpc " .. method .. " to " .. url .. ": " .. tostring(err), 2) end
  local doc = cjson.decode(resp.body)
  if doc.error then error("rpc " .. method .. ": " .. cjson.encode(doc.error), 2) end
  return doc.result
end

return M
