-- qtgd audit verify [--since ID] [--against FILE] [--approvers FILE]
--        | export [--since ID]
--   verify  walk every audit chain and report the first broken link; with
--           --against, compare every row of FILE (an earlier export; `-`:
--           standard input) with the database and report the first
--           difference; then compare every node's and request's state
--           with its last audited state change and report each that
--           differs; with --approvers (an enrolment file, as the signer's
--           MG_SIGNER_APPROVERS), report each request past its approval
--           without the signed approvals that enrolment asks
--           (qtg.audit_approvals); and list each signer grant whose
--           transfer did not complete and whose bytes the daemon's rows
--           do not show mined, dead or in flight (qtg.audit_grants).
--           Exit 0 when everything holds, 1 when
--           anything does not, 2 when a FILE cannot be read or is not an
--           export or an enrolment
--   export  every audit_events row (with id > ID) as one JSON line on
--           stdout, in id order, hashes included, for off-site storage
local audit = require "qtg.audit"

local M = {}

-- Unaudited states listed per kind (all are counted).
M.LIST_LIMIT = 20

local function usage()
  io.stderr:write("usage: qtgd audit verify [--since ID] [--against FILE] [--approvers FILE] | export [--since ID]\n")
  return 2
end

-- The options: name -> {field, check(value) -> parsed or nil, commands
-- that take it}.
local OPTIONS = {
  ["--since"] = { "since", function(v)
    if v:match("^%d+$") and #v <= 18 then return tonumber(v) end
  end, { verify = true, export = true } },
  ["--against"] = { "against", function(v) if v ~= "" then return v end end, { verify = true } },
  ["--approvers"] = { "approvers", function(v) if v ~= "" then return v end end, { verify = true } },
}

local function parse(args)
  local opts = {}
  local i = 2
  while args[i] do
    local o = OPTIONS[args[i]]
    local v = o and args[i + 1] and o[2](args[i + 1])
    if v == nil or not o[3][args[1]] or opts[o[1]] ~= nil then return nil end
    opts[o[1]] = v
    i = i + 2
  end
  return opts
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

local function say(fmt, ...) io.stdout:write(string.format(fmt, ...), "\n") end

-- A chain's name as read from an export, its control characters shown as
-- `?`: a file's bytes never drive the terminal.
local function printable(v) return (tostring(v):gsub("%c", "?")) end

-- The three checks' reports, each printed as its lines; -> ok.
local function print_chain(r)
  if r.ok then
    say("audit verify: ok, %d rows checked, every chain holds", r.checked)
    return true
  end
  local b = r.broken
  say("audit verify: BROKEN at %s (chain %q, place %s): %s",
    b.id and ("row " .. tostring(b.id)) or "the chain's end", b.network_class, tostring(b.chain_seq), b.meaning)
  return false
end

-- What an export that cannot be compared is told as (exit 2).
local EXPORT_ERRORS = {
  bad_export = "qtgd audit verify: %s is not an audit export: %s",
  unreadable_export = "qtgd audit verify: cannot read the export %s: %s",
}

local function print_against(r, file)
  if r.unusable then
    -- every complete line before it was compared; a difference there is said too
    io.stderr:write(string.format(EXPORT_ERRORS[r.unusable.kind], file, tostring(r.unusable.message)), "\n")
    say("audit verify: %d rows of %s compared before line %s, which ends the comparison", r.compared, file,
      tostring(r.unusable.line or "?"))
    if not r.difference then return false end
  end
  if r.ok then
    say("audit verify: ok, %d rows of %s compared%s, each still in the database as exported", r.compared,
      file, r.skipped > 0 and string.format(" (%d below --since passed over)", r.skipped) or "")
    return true
  end
  local d = r.difference
  say("audit verify: DIFFERS from %s at line %d: row %s (chain %q, place %s): %s (%s)", file, d.line,
    tostring(d.id), printable(d.network_class), tostring(d.chain_seq), printable(d.meaning), d.problem)
  return false
end

local function print_states(r)
  if r.ok then
    say("audit verify: ok, %d nodes and %d requests are in the state their last audit row names",
      r.checked.node, r.checked.request)
    return true
  end
  say("audit verify: UNAUDITED STATE: %d of %d nodes and %d of %d requests are not in the state their "
    .. "last audit row names, or their audit rows skip a change (up to %d of each listed, the most "
    .. "recently updated first):",
    r.mismatched.node, r.checked.node, r.mismatched.request, r.checked.request, M.LIST_LIMIT)
  for _, m in ipairs(r.mismatches) do
    local which = m.kind == "node"
      and string.format("node %s (%s of request %s)", m.id, tostring(m.node_key), m.request_id)
      or string.format("request %s", m.id)
    local last
    if m.audited == nil then
      last = m.kind == "node" and "no audit row changed its state (it would be BLOCKED)"
        or "no audit row names its state"
    else
      last = string.format("its last audit row (%s) says %s", m.event_id
        and "row " .. tostring(m.event_id) or "outbox row " .. tostring(m.outbox_id) .. ", not yet promoted",
        m.audited)
    end
    say("  %s is %s; %s", which, m.state, last)
    local g = m.gap
    if g then
      local row = g.event_id and "row " .. tostring(g.event_id) or "outbox row " .. tostring(g.outbox_id)
      say("    a change without its audit row: %s (%s) %s", row, tostring(g.action), g.before
        and string.format("starts from %s, but the row before it left it %s", tostring(g.from_state), g.before)
        or string.format("is its first and starts from %s: not where it was created (a request's first "
          .. "row is request.create, a node's starts from BLOCKED)", tostring(g.from_state)))
    end
  end
  return false
end

local function print_approvals(r, file)
  if r.ok then
    say("audit verify: ok, %d requests past their approval carry the signed approvals %s asks",
      r.checked, file)
    return true
  end
  say("audit verify: APPROVED WITHOUT SIGNATURES: %d of %d requests past their approval lack what %s "
    .. "asks (up to %d listed):", r.short, r.checked, file, M.LIST_LIMIT)
  for _, m in ipairs(r.list) do
    say("  request %s (%s, class %s): %s", m.id, m.state, printable(m.network_class), table.concat(m.problems, "; "))
  end
  return false
end

local function print_grants(r)
  if r.ok then
    say("audit verify: ok, each of the signer's %d grants is settled or in flight on its own bytes", r.checked)
    return true
  end
  say("audit verify: SIGNED TRANSFERS NOT SETTLED: %d of the signer's %d grants are for transfers that did "
    .. "not complete and whose bytes the daemon's rows do not show mined, dead or in flight (up to %d listed): "
    .. "if the chain has not used the nonce, those bytes can still be mined; look it up, and fill the nonce "
    .. "(the console's fill_nonce(chain_id, sender, nonce)) before approving the payment again (docs/evm.md):",
    r.open, r.checked, M.LIST_LIMIT)
  for _, g in ipairs(r.list) do
    say("  grant %s: node %s of request %s (%s): nonce %s of %s on chain %s, payload %s, granted %s; %s",
      tostring(g.id), tostring(g.node_id), tostring(g.request_id), g.node_state, tostring(g.nonce),
      tostring(g.address), tostring(g.chain_id), tostring(g.payload_hash), tostring(g.granted_at), g.held)
  end
  return false
end

-- The export to compare with, open: FILE or standard input (`-`).
local function open_export(path)
  if path == "-" then return io.stdin, "standard input" end
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  return f, path
end

local commands = {}

function commands.verify(opts)
  local f, name
  if opts.against then
    f, name = open_export(opts.against)
    if not f then
      io.stderr:write("qtgd audit verify: cannot read the export: ", tostring(name), "\n")
      return 2
    end
  end
  local enrolment
  if opts.approvers then
    local err
    enrolment, err = require("qtg").approvers.load(opts.approvers)
    if not enrolment then
      if f and f ~= io.stdin then f:close() end
      io.stderr:write("qtgd audit verify: cannot use the enrolment: ", tostring(err), "\n")
      return 2
    end
  end
  local ok, res = pcall(with_session, function(s)
    local chain = audit.verify(s, opts.since)
    local against = f and require("qtg.audit_against").compare(s, f, opts.since)
    return { chain = chain, against = against, states = require("qtg.audit_states").check_states(s, M.LIST_LIMIT),
             approvals = enrolment and require("qtg.audit_approvals").check(s, enrolment, M.LIST_LIMIT),
             grants = require("qtg.audit_grants").check(s, M.LIST_LIMIT) }
  end)
  if f and f ~= io.stdin then f:close() end
  if not ok then error(res, 0) end
  local good = print_chain(res.chain)
  if res.against then good = print_against(res.against, name) and good end
  good = print_states(res.states) and good
  if res.approvals then good = print_approvals(res.approvals, opts.approvers) and good end
  good = print_grants(res.grants) and good
  if res.against and res.against.unusable then return 2 end
  return good and 0 or 1
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
  local opts = cmd and parse(args)
  if not cmd or not opts then return usage() end
  return cmd(opts)
end

return M
