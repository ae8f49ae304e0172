-- console_run_dir_spec: the run directory is shared by the console's socket
-- and, when MG_API_LISTEN says unix:<run dir>/api.sock (docs/api.md), the
-- API's.  The daemon's group must reach the API there (the socket is 0660,
-- the directory 0750 as qtgd.service's RuntimeDirectoryMode makes it), and
-- must still not reach the console (0600 socket, SO_PEERCRED: root and the
-- daemon's uid only).  The console used to narrow the directory to 0700 at
-- start, which locked the group out of the API.  A running daemon is used;
-- the other uid is 65534 in the daemon's group (setpriv), so this needs root.
local common = require "spec.lua.support.common"
local host = require "spec.lua.support.host"

local q = common.quote

local ROOT = io.popen("id -u"):read("*l") == "0"
local GID = io.popen("id -g"):read("*l")

-- A client run as uid 65534 in group GID (no other groups): connects to the
-- Unix socket argv[1], sends argv[2] (if any), prints what comes back until
-- the server closes; or "CONNECT <errno>" when connect fails.
local CLIENT = [[
import socket, sys
c = socket.socket(socket.AF_UNIX)
c.settimeout(5)
try:
    c.connect(sys.argv[1])
except OSError as e:
    print("CONNECT %d" % e.errno)
    sys.exit(0)
got = b""
try:
    if sys.argv[2]:
        c.sendall(sys.argv[2].encode())
    while True:
        b = c.recv(65536)
        if not b:
            break
        got += b
except socket.timeout:
    got += b"...TIMEOUT"
except OSError as e:
    got += b"...ERRNO %d" % e.errno
sys.stdout.write(got.decode("latin-1"))
]]

local function mode_of(path)
  local p = io.popen("stat -c %a " .. q(path))
  local m = p:read("*l")
  p:close()
  return m
end

describe("the console's run directory", function()
  local dir, d, run

  -- as_group_member(path, bytes) -> what the client printed
  local function as_group_member(path, bytes)
    local p = io.popen(("setpriv --reuid=65534 --regid=%s --clear-groups /usr/bin/python3 %s %s %s 2>&1")
      :format(GID, q(dir .. "/client.py"), q(path), q(bytes)))
    local out = p:read("*a")
    p:close()
    return out
  end

  -- stop(h): SIGTERM; exit 0 and no sanitizer report in the log (build-asan)
  local function stop(h)
    local rc = host.stop(h)
    local log = host.read(h.log) or ""
    assert.falsy(log:match("[^\n]*Sanitizer[^\n]*") or log:match("[^\n]*runtime error[^\n]*"), log:sub(-2000))
    assert.equal(0, rc, log:sub(-2000))
  end

  -- start(mode, api) -> daemon handle, once the console (and the API) listen
  local function start(mode, api)
    run = dir .. "/run-" .. mode
    assert(os.execute(("mkdir %s && chgrp %s %s && chmod %s %s"):format(q(run), GID, q(run), mode, q(run))) == 0)
    local env = host.base_env({ MG_CONSOLE_ENABLED = "true", MG_RUN_DIR = run, MG_WORKERS_ENABLED = "false",
                                MG_NETWORK_CLASS = common.uid("rundir", 4),
                                MG_API_LISTEN = api and ("unix:" .. run .. "/api.sock") or nil })
    local h = host.start(env, { "run" })
    common.wait_log(h, '"msg":"console listening"', 30, "the console to listen")
    if api then common.wait_log(h, '"msg":"api listening"', 30, "the API to listen") end
    return h
  end

  setup(function()
    dir = host.tmpdir()
    assert(os.execute("chmod 755 " .. q(dir)) == 0)        -- uid 65534 may enter
    host.write(dir .. "/client.py", CLIENT)
  end)
  teardown(function()
    if d then host.stop(d) end
    host.stop_all()
    if dir then os.execute("rm -rf " .. q(dir)) end
  end)

  it("stays 0750: the daemon's group reaches the API's socket there, not the console", function()
    if not ROOT then
      pending("not root: cannot run a client as another uid in the daemon's group")
      return
    end
    d = start("750", true)
    -- the group member gets an HTTP answer from the API
    local out = as_group_member(run .. "/api.sock", "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert.truthy(out:match("^HTTP/1%.1 200"), "run directory mode " .. mode_of(run) .. ": " .. out)
    assert.truthy(out:find('{"status":"ok"}', 1, true), out)
    assert.equal("750", mode_of(run))
    assert.equal("660", mode_of(run .. "/api.sock"))
    assert.equal("600", mode_of(run .. "/console.sock"))
    -- and not the console: the 0600 socket keeps it out ...
    out = as_group_member(run .. "/console.sock", "")
    assert.truthy(out:match("^CONNECT 13"), "EACCES expected: " .. out)
    -- ... and with the socket's mode loosened, the peer uid check refuses it
    assert(os.execute("chmod 666 " .. q(run .. "/console.sock")) == 0)
    out = as_group_member(run .. "/console.sock", "")
    assert(os.execute("chmod 600 " .. q(run .. "/console.sock")) == 0)
    assert.truthy(out:find("refused: uid 65534 may not use this console", 1, true), out)
    local h = d
    d = nil
    stop(h)
  end)

  -- A run directory another uid owns (a name it made first under /tmp), or
  -- one whose parent another uid can write, was taken: that uid could put
  -- its own socket where root's `qtgd console` sends its commands.
  it("is refused when another uid owns it or can write its parent, naming the setting", function()
    if not ROOT then
      pending("not root: cannot make a directory another uid owns")
      return
    end
    local function refused(run_dir)
      local env = host.base_env({ MG_CONSOLE_ENABLED = "true", MG_RUN_DIR = run_dir, MG_WORKERS_ENABLED = "false",
                                  MG_NETWORK_CLASS = common.uid("rundir", 4) })
      local h = host.start(env, { "run" })
      local rc = host.wait_exit(h, 30)
      return rc, host.read(h.log) or ""
    end
    local theirs = dir .. "/theirs"
    assert(os.execute(("mkdir %s && chmod 700 %s && chown 65534 %s"):format(q(theirs), q(theirs), q(theirs))) == 0)
    local rc, log = refused(theirs)
    assert.are_not.equal(0, rc, log)
    assert.truthy(log:find("run directory " .. theirs .. " (MG_RUN_DIR) is owned by uid 65534, not by this user or root",
      1, true), log)
    local open = dir .. "/open"
    assert(os.execute(("mkdir -p %s/run && chmod 777 %s && chmod 700 %s/run"):format(q(open), q(open), q(open))) == 0)
    rc, log = refused(open .. "/run")
    assert.are_not.equal(0, rc, log)
    assert.truthy(log:find("its parent " .. open .. " is owned by uid 0 with mode 0777, so another user could put "
      .. "a directory of their own in its place", 1, true), log)
    assert.is_nil(io.open(open .. "/run/console.sock"), "no socket made")
  end)

  it("is narrowed to 0750 when it is open wider: no group write, nothing for others", function()
    d = start("777", false)
    assert.equal("750", mode_of(run))
    assert.equal("600", mode_of(run .. "/console.sock"))
    local h = d
    d = nil
    stop(h)
  end)
end)
