-- The console's request commands (lua/qtg/console/commands.lua) on the test
-- database: req() with the short ids the demo prints, a manual step's
-- instructions and required inputs, the reason of a rejection or a
-- cancellation; help() naming the states each lifecycle command accepts.
local qtg = require "qtg"
local pretty = require "qtg.console.pretty"
local common = require "spec.lua.support.common"

local sup, s, cmds
local MANUAL = "spec_cc_manual"

local function fails(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return type(err) == "table" and err or { message = tostring(err) }
end

describe("console request commands", function()
  setup(function()
    sup = require("spec.lua.support.engine")
    s = qtg.db.acquire()
    sup.load_doc(s, sup.doc(MANUAL, {
      { "m", "manual", "manual_confirmation", { instructions = "Call the desk; note their reference.",
                                                required_inputs = { "desk_reference", "desk_name" } } },
    }))
    cmds = require("qtg.console.commands").bind({ actor = "console:spec", print = function() end })
  end)
  teardown(function() s:release() end)

  it("req() takes the first 8 hex digits the demo prints, and says when they name nothing or too little", function()
    local req = sup.create(s, MANUAL)
    local r = cmds.req(req.id:sub(1, 8))
    assert.equals(req.id, r.id)
    assert.equals(req.id, cmds.req(req.id:upper()).id)
    assert.equals(req.id, cmds.req(req.id:sub(1, 13)).id)   -- with its dash
    local e = fails(cmds.req, "ffffffff-ffff")
    assert.equals("not_found", e.kind)
    assert.matches("no request id of network class", e.message, 1, true)
    e = fails(cmds.req, req.id:sub(1, 5))
    assert.equals("usage", e.kind)
    assert.matches("first 6 or more hex digits", e.message, 1, true)
    e = fails(cmds.req, "not-an-id")
    assert.equals("usage", e.kind)
    -- the other request commands take short ids too
    local shown = cmds.reject(req.id:sub(1, 8), "desk closed")
    assert.equals("REJECTED", shown.request_state)
  end)

  it("req() of a full id of another network class's request says not_found, not the request", function()
    local req = sup.create(s, MANUAL)
    sup.move_class(s, req.id, "spec-other-class")
    local e = fails(cmds.req, req.id)
    assert.equals("not_found", e.kind)
    assert.matches("belongs to network class spec-other-class", e.message, 1, true)
  end)

  it("req() says which of two requests a shared prefix could mean", function()
    local a, b = sup.create(s, MANUAL), sup.create(s, MANUAL)
    -- the shortest prefix the two share is ambiguous unless it is long enough to tell them apart
    local n = 0
    while a.id:sub(1, n + 1) == b.id:sub(1, n + 1) do n = n + 1 end
    if n >= 6 then
      local e = fails(cmds.req, a.id:sub(1, n))
      assert.matches("ambiguous", e.message, 1, true)
    end
    assert.equals(a.id, cmds.req(a.id:sub(1, math.max(n + 1, 6))).id)
  end)

  it("req() shows a manual step's instructions and required inputs", function()
    local req = sup.create_approved(s, MANUAL)
    local m = sup.nodes(s, req.id).m
    local r = cmds.req(req.id)
    assert.is_table(r.manual_steps)
    local line = r.manual_steps[1]
    assert.matches("m (" .. m.node_state .. ", node " .. m.id .. "): Call the desk; note their reference.", line, 1, true)
    assert.matches("complete_manual(node_id, {desk_reference=, desk_name=})", line, 1, true)
    assert.matches("Call the desk", pretty.pretty(r), 1, true)
  end)

  it("req() shows who rejected or cancelled a request, and why", function()
    local rejected = sup.create(s, MANUAL)
    cmds.reject(rejected.id, "wrong desk")
    assert.equals("rejected by console:spec: wrong desk", cmds.req(rejected.id).reason)
    local cancelled = sup.create_approved(s, MANUAL)
    cmds.cancel(cancelled.id, "client withdrew")
    assert.equals("cancelled by console:spec: client withdrew", cmds.req(cancelled.id).reason)
    assert.is_nil(cmds.req(sup.create(s, MANUAL).id).reason)
  end)

  it("help() names the states each lifecycle command accepts", function()
    local text = cmds.help().text
    for _, want in ipairs({
      "approve%(id%)%s+PENDING_APPROVAL", "reject%(id, reason%)%s+PENDING_APPROVAL %-> REJECTED",
      "cancel%(id, reason%[, {reconciled = true}%]%)%s+PENDING_APPROVAL, APPROVED, EXECUTING, WAITING_MANUAL_ACTION or MANUAL_INTERVENTION",
      "resume%(id%)%s+MANUAL_INTERVENTION %-> EXECUTING; refused while a node is FAILED",
      "FAILED %-> EXECUTING while a node is in flight",
      "retry%(node_id%)%s+a FAILED or UNKNOWN node", "complete_manual%(node_id, artifacts%[, signature%]%)%s+a READY manual step",
      "redeliver%(callback_id%)%s+a dlq callback row",
    }) do
      assert.matches(want, text)
    end
    -- what help says cancel accepts is what the state machine allows
    local state = require "qtg.state"
    for from in pairs(state.REQUEST_TRANSITIONS) do
      local said = (text:match("cancel%(id, reason%[, {reconciled = true}%]%)%s+([^\n]*)"):match("^(.-)%->") .. " ")
        :find(from .. "[ ,]") ~= nil
      assert.equals(state.request_can(from, "CANCELLED"), said, from)
    end
  end)
end)

describe("qtgd console of the packaged qtgd", function()
  it("looks for the packaged service's socket, /run/qtg/console.sock, without MG_RUN_DIR", function()
    local hsup = require "spec.lua.support.host"
    local cache = hsup.read(hsup.bin:match("^(.*)/[^/]*$") .. "/CMakeCache.txt") or ""
    local prefix = cache:match("\nCMAKE_INSTALL_PREFIX:PATH=([^\n]*)")
    assert.is_truthy(prefix, "no CMakeCache.txt next to " .. hsup.bin)
    -- the packaged binary's root is <prefix>/share/qtg (QTG_ROOT stands in for it)
    local rc, out = hsup.run({}, { "env -u MG_RUN_DIR -u MG_CONSOLE_SOCKET -u RUNTIME_DIRECTORY",
      "QTG_ROOT=" .. common.quote(prefix .. "/share/qtg"), common.quote(hsup.bin), "console", "-e", "1" })
    assert.matches("/run/qtg/console.sock", out, 1, true)
    -- a source tree keeps its own var/run
    local _, dev = hsup.run({}, { "env -u MG_RUN_DIR -u MG_CONSOLE_SOCKET -u RUNTIME_DIRECTORY",
      "QTG_ROOT=/nonexistent-qtg-root", common.quote(hsup.bin), "console", "-e", "1" })
    assert.matches("/nonexistent-qtg-root/var/run/console.sock", dev, 1, true)
    assert.is_number(rc)
  end)
end)
