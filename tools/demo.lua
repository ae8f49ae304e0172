-- tools/demo.lua -- the demo's driver, run by tools/demo as
--   qtgd exec tools/demo.lua --callback-url URL --record FILE --daemon-pid PID
--                            --daemon-log FILE --templates DIR [--evm-rpc URL]
--                            [--ids-file FILE] [--plain] [--timeout SECONDS]
-- while a `qtgd run` (the daemon, started by tools/demo) works the same
-- database and network class.  The driver plays the operator: it books the
-- destination the shipped templates' allow-lists need in the address book
-- (proposed and approved by admins), creates
-- and approves one movement per shipped template plus the demo's own
-- UNKNOWN case, completes the manual step when one waits for it, shows the
-- movements' progress live, and ends with a summary that it checks:
--   * every movement COMPLETED;
--   * the manual step was completed by the operator (this driver);
--   * the UNKNOWN node was seen UNKNOWN (audit trail) and recovered by
--     node_recovery, not by anyone's guess;
--   * every callback row was delivered, and the receiver verified every
--     delivery's v3 signature (tools/fake-receiver runs tools/callback-verify
--     on each request it gets and records the verdict);
--   * with --evm-rpc (evm_transfer is shipped): the ETH arrived, as the
--     local chain itself reports (eth_getBalance of a fresh destination).
-- Exit code 0 when all of that holds, 1 otherwise (with what is missing).
-- Shell quoting, files, polling, JSON-RPC and the receiver's record are
-- spec/lua/support/common.lua's (the tree, this file's path up to /tools/,
-- goes on package.path for it).
local qtg = require "qtg"
local cjson = require "cjson"
local ffi = require "ffi"
local requests = require "qtg.requests"
package.path = package.path .. ";" .. (debug.getinfo(1, "S").source:match("^@(.*)/tools/") or ".") .. "/?.lua"
local common = require "spec.lua.support.common"

pcall(ffi.cdef, [[
int isatty(int fd);
int kill(int pid, int sig);
]])

local ACTOR = "console:demo"

-- The HTTP API (tools/demo starts the daemon with MG_API_LISTEN and makes
-- two tokens): movements are created and approved through it; without it
-- (QTG_DEMO_API unset) the driver calls the lifecycle functions itself.
local API = os.getenv("QTG_DEMO_API") and {
  base = os.getenv("QTG_DEMO_API"),
  operator = os.getenv("QTG_DEMO_OPERATOR_TOKEN"),
  approver = os.getenv("QTG_DEMO_APPROVER_TOKEN"),
  second_approver = os.getenv("QTG_DEMO_SECOND_APPROVER_TOKEN"),
} or nil

local function api_call(method, path, token, body, key)
  local resp, err = qtg.http.request{ method = method, url = API.base .. path, timeout = 30,
    headers = { Authorization = "Bearer " .. token, ["Content-Type"] = body and "application/json" or nil,
                ["Idempotency-Key"] = key },
    body = body and require("qtg.canon_json").encode(body) or nil }
  if not resp then error("demo: " .. method .. " " .. path .. ": " .. tostring(err and err.message), 0) end
  if resp.status >= 300 then
    error(("demo: %s %s answered %d: %s"):format(method, path, resp.status, resp.body), 0)
  end
  return cjson.decode(resp.body)
end
-- Four eyes: the desk initiates, ACTOR approves (and a second approver when
-- the approval policy asks for two: the OTC sample is over its 100000 tier).
local INITIATOR = "operator:demo-desk"
-- (in-process names: an operator:<name> vote counts only while that
-- operator is enrolled, and the demo enrols nobody -- docs/approvals.md)
local SECOND = "console:demo-treasurer"
local DEST = "0x8ba1f109551bd432803012645ac136ddd64dba72"

-- The movement made for each template the demo knows.  A shipped template
-- that is not here gets an intent made from its schema (make_intent), so a
-- new template is in the demo from the day it ships -- and fails the demo
-- if it cannot run on the stand-ins.
local SAMPLES = {
  cex_withdrawal_to_wallet = { role = "a CEX withdrawal watched to finality",
    intent = { asset = "USDC", amount = "2500.00", venue = "binance", destination = DEST,
               destination_chain = "ethereum" } },
  cctp_bridge = { role = "burn, attestation, mint (CCTP)",
    intent = { asset = "USDC", amount = "10000", source_chain = "ethereum", destination_chain = "base",
               destination = DEST } },
  otc_settlement_manual = { role = "two approvers (from 100000), then the desk's confirmation (manual step)",
    intent = { asset = "USDT", amount = "150000", venue = "kraken", destination = DEST,
               destination_chain = "ethereum", counterparty = "desk-17" } },
  dual_venue_funding = { role = "two venues in parallel, then a join",
    intent = { asset = "USDC", amount = "40000", primary_venue = "binance", secondary_venue = "okx",
               destination = DEST } },
  evm_transfer = { role = "0.25 ETH on a local chain (anvil), signed by qtgd", evm = true,
    intent = { asset = "ETH", amount = "0.25", chain_id = 31337 } },
  cex_withdrawal_lost_ack = { role = "the venue's answer is lost: UNKNOWN, then recovered",
    intent = { asset = "USDC", amount = "750", venue = "coinbase", destination = DEST } },
}
local LOST_ACK = "cex_withdrawal_lost_ack"
local EVM_WEI = "0x3782dace9d90000" -- 0.25 ETH

-- An intent for a template the demo does not know, from its schema.
local function make_intent(schema)
  local values = { string = "demo", decimal = "100", integer = 1, evm_address = DEST, object = {} }
  local intent = {}
  for _, f in ipairs(schema.required or {}) do
    local t = (schema.types or {})[f] or "string"
    intent[f] = values[t] or "demo"
  end
  return intent
end

local TERMINAL = { COMPLETED = true, FAILED = true, REJECTED = true, CANCELLED = true, EXPIRED = true,
                   MANUAL_INTERVENTION = true }

-- ---- arguments -------------------------------------------------------------------

local function parse_args(argv)
  local opts = { timeout = 120, plain = false }
  local i = 1
  while i <= #argv do
    local a = argv[i]
    local function value()
      i = i + 1
      if argv[i] == nil or argv[i] == "" then error("demo: " .. a .. " needs a value", 0) end
      return argv[i]
    end
    if a == "--callback-url" then opts.callback_url = value()
    elseif a == "--record" then opts.record = value()
    elseif a == "--daemon-pid" then opts.daemon_pid = tonumber(value())
    elseif a == "--daemon-log" then opts.daemon_log = value()
    elseif a == "--timeout" then opts.timeout = tonumber(value())
    elseif a == "--ids-file" then opts.ids_file = value()
    elseif a == "--templates" then opts.templates = value()
    elseif a == "--evm-rpc" then opts.evm_rpc = value()
    elseif a == "--plain" then opts.plain = true
    else error("demo: unknown argument " .. a, 0) end
    i = i + 1
  end
  for _, k in ipairs({ "callback_url", "record", "daemon_pid", "templates" }) do
    if not opts[k] then error("demo: --" .. k:gsub("_", "-") .. " is required", 0) end
  end
  if not opts.timeout or opts.timeout <= 0 then error("demo: --timeout must be a positive number", 0) end
  if ffi.C.isatty(1) == 0 then opts.plain = true end
  return opts
end

-- ---- output ------------------------------------------------------------------------

local function out(...)
  io.stdout:write(...)
  io.stdout:flush()
end

local function fit(s, n)
  s = tostring(s)
  if #s > n then return s:sub(1, n - 1) .. "~" end
  return s .. string.rep(" ", n - #s)
end

local COLS = { { "request", 8 }, { "template", 24 }, { "state", 21 }, { "nodes", 5 },
               { "current frontier", 34 }, { "elapsed", 7 } }

local function row_text(cells)
  local parts = {}
  for i, c in ipairs(COLS) do parts[i] = fit(cells[i] or "", c[2]) end
  return (table.concat(parts, "  "):gsub("%s+$", ""))
end

local function header()
  local names, rules = {}, {}
  for i, c in ipairs(COLS) do
    names[i] = c[1]
    rules[i] = string.rep("-", c[2])
  end
  return { row_text(names), row_text(rules) }
end

local function frontier_text(f)
  if type(f) ~= "table" or #f == 0 then return "-" end
  return table.concat(f, ",")
end

local function cells_of(r)
  return { r.id:sub(1, 8), r.template_key, r.request_state, r.done .. "/" .. r.total,
           frontier_text(r.current_frontier), string.format("%.1fs", r.elapsed) }
end

-- A live view: on a terminal the table is redrawn in place under the event
-- lines; otherwise one line per change, so a log reads as a story.
local function new_view(plain, started)
  local v = { plain = plain, started = started, frame_lines = 0, last = {} }

  function v.clear()
    if not v.plain and v.frame_lines > 0 then
      out(string.format("\27[%dF\27[J", v.frame_lines))
      v.frame_lines = 0
    end
  end

  function v.event(text)
    v.clear()
    out(string.format("  [%5.1fs] %s\n", qtg.monotonic() - v.started, text))
  end

  function v.draw(rows)
    if v.plain then
      for _, r in ipairs(rows) do
        local key = r.request_state .. "|" .. frontier_text(r.current_frontier) .. "|" .. r.done
        if v.last[r.id] ~= key then
          v.last[r.id] = key
          out(string.format("  [%5.1fs] %s\n", qtg.monotonic() - v.started, row_text(cells_of(r))))
        end
      end
      return
    end
    v.clear()
    local lines = header()
    for _, r in ipairs(rows) do lines[#lines + 1] = row_text(cells_of(r)) end
    out(table.concat(lines, "\n"), "\n")
    v.frame_lines = #lines
  end

  function v.final(rows)
    v.clear()
    local lines = header()
    for _, r in ipairs(rows) do lines[#lines + 1] = row_text(cells_of(r)) end
    out(table.concat(lines, "\n"), "\n")
    v.frame_lines = 0
  end

  return v
end

-- ---- database views ------------------------------------------------------------------

local function with_session(fn, ...)
  return qtg.db.with_session(fn, ...)
end

-- ---- the address book ------------------------------------------------------------------
-- The shipped templates' allow-lists (docs/approvals.md, "risk_controls"):
-- cex_withdrawal_to_wallet pays only a destination in the address book,
-- otc_settlement_manual only its counterparty's wallet there (the entry's
-- label is the counterparty).  The demo books DEST as an operator would: one
-- admin proposes each entry, others approve it until the policy's
-- address_book quorum is met (qtg.address_book, the console's
-- propose_address / vote_address).  An entry already there is kept.
local BOOK = {
  { asset = "USDC", chain = "ethereum", address = DEST, label = "demo treasury wallet" },
  { asset = "USDT", chain = "ethereum", address = DEST, label = "desk-17" },
}
local BOOK_PROPOSER = "console:demo-custodian"
local BOOK_APPROVERS = { ACTOR, SECOND, "console:demo-auditor", "console:demo-controller" }

local function book_destinations()
  local book = require "qtg.address_book"
  with_session(function(s)
    for _, e in ipairs(BOOK) do
      local have = book.entry(s, e)
      if have and have.label ~= e.label then
        error(("demo: %s on %s is in the address book for %s as %q, not %q"):format(e.address, e.chain,
          e.asset, have.label, e.label), 0)
      elseif not have then
        -- a change an interrupted run left pending is approved, not proposed again
        local c = book.pending(s, e)
          or book.propose(s, { action = "add", asset = e.asset, chain = e.chain, address = e.address,
                               label = e.label }, BOOK_PROPOSER)
        for _, who in ipairs(BOOK_APPROVERS) do
          if c.state ~= "PENDING" then break end
          if who ~= c.proposed_by and not s:query([[SELECT 1 FROM address_book_votes
                                                      WHERE change_id = $1 AND principal = $2]], c.id, who)[1] then
            c = book.vote(s, c.id, who, "approve", "demo set-up")
          end
        end
        if c.state ~= "APPLIED" then
          error(("demo: address book change %d (%s for %s) is %s"):format(c.id, e.address, e.asset, c.state), 0)
        end
        out(string.format("   address book: %s on %s for %s as %q (change %d, proposed by %s, approved by %d)\n",
          e.address, e.chain, e.asset, e.label, c.id, BOOK_PROPOSER, c.approvals))
      end
    end
  end)
end

local SNAPSHOT_SQL = [[
SELECT r.id::text AS id, r.template_key, r.request_state, r.current_frontier,
       r.last_error_code,
       extract(epoch from coalesce(r.finished_at, clock_timestamp()) - r.created_at)::float8 AS elapsed,
       (SELECT count(*) FROM movement_request_nodes n WHERE n.request_id = r.id)::int AS total,
       (SELECT count(*) FROM movement_request_nodes n WHERE n.request_id = r.id
          AND n.node_state IN ('COMPLETED', 'SKIPPED'))::int AS done
  FROM movement_requests r
 WHERE r.id = ANY($1::uuid[])
 ORDER BY r.created_at, r.id]]

local function pg_array(ids)
  return "{" .. table.concat(ids, ",") .. "}"
end

local function snapshot(s, ids)
  return s:query(SNAPSHOT_SQL, pg_array(ids))
end

local function nodes_in(s, ids, states)
  return s:query([[
    SELECT n.id::text AS id, n.request_id::text AS request_id, n.node_key, n.node_state,
           n.action_type, n.error_code
      FROM movement_request_nodes n
     WHERE n.request_id = ANY($1::uuid[]) AND n.node_state = ANY($2::text[])
     ORDER BY n.request_id, n.node_key]], pg_array(ids), "{" .. table.concat(states, ",") .. "}")
end

-- The audit trail of a request, promoted or not yet.
local function audit_of(s, request_id)
  return s:query([[
    SELECT actor, action, detail, created_at FROM (
      SELECT actor, action, detail, created_at, outbox_id AS ord FROM audit_events WHERE request_id = $1::uuid
      UNION ALL
      SELECT actor, action, detail, created_at, id AS ord FROM audit_outbox WHERE request_id = $1::uuid) a
     ORDER BY ord]], request_id)
end

local function daemon_alive(pid)
  return ffi.C.kill(pid, 0) == 0
end

local function tail(path, n)
  local f = path and io.open(path, "r")
  if not f then return "" end
  local lines = {}
  for l in f:lines() do
    lines[#lines + 1] = l
    if #lines > n then table.remove(lines, 1) end
  end
  f:close()
  return table.concat(lines, "\n")
end

-- ---- the steps -----------------------------------------------------------------------

-- The shipped templates (template_key of each templates/*.json), in file
-- order, then the demo's own UNKNOWN case.
local function plan(opts)
  local keys = {}
  local p = io.popen("ls -1 -- " .. common.quote(opts.templates))
  for name in p:lines() do
    if name:match("%.json$") then
      local text = common.read(opts.templates .. "/" .. name)
      if not text then error("demo: cannot read " .. opts.templates .. "/" .. name, 0) end
      local ok, doc = pcall(cjson.decode, text)
      if not ok or type(doc) ~= "table" or type(doc.template_key) ~= "string" then
        error("demo: " .. opts.templates .. "/" .. name .. " is not a template", 0)
      end
      keys[#keys + 1] = doc.template_key
    end
  end
  p:close()
  if #keys == 0 then error("demo: no templates in " .. opts.templates, 0) end
  keys[#keys + 1] = LOST_ACK
  return keys
end

-- JSON-RPC to the demo's chain.
local rpc = common.rpc

-- The evm_transfer sample: a fresh destination, and the signer's address
-- (a key made for this run) funded on the local chain.
local function prepare_evm(opts, sample)
  if not opts.evm_rpc then error("demo: evm_transfer is shipped but no chain was given (--evm-rpc)", 0) end
  local sender, err = qtg.signer.address("evm_hot")
  if not sender then error("demo: the signer key evm_hot is not loaded: " .. tostring(err and err.message or err), 0) end
  rpc(opts.evm_rpc, "anvil_setBalance", { sender, "0x56bc75e2d63100000" }) -- 100 ETH
  local intent = {}
  for k, v in pairs(sample.intent) do intent[k] = v end
  intent.destination = "0x" .. qtg.crypto.hex(qtg.crypto.random_bytes(20))
  return intent, sender
end

local function create_all(opts, run_id)
  local made = {}
  for _, key in ipairs(plan(opts)) do
    local sample = SAMPLES[key]
    local intent, role, extra = nil, nil, nil
    if sample and sample.evm then
      intent, extra = prepare_evm(opts, sample)
      role = sample.role .. " from " .. extra:sub(1, 10) .. "..."
    elseif sample then
      intent, role = sample.intent, sample.role
    else
      local schema = with_session(function(s)
        return s:query([[SELECT pv.intent_schema FROM plan_versions pv JOIN movement_templates t
                          ON t.id = pv.template_id WHERE t.template_key = $1
                          ORDER BY pv.version DESC LIMIT 1]], key)[1]
      end)
      if not schema then error("demo: template " .. key .. " is not loaded", 0) end
      intent, role = make_intent(schema.intent_schema), "(no sample: an intent made from its schema)"
    end
    local req
    if API then
      -- as a treasury application would: one client creates, another approves
      local created = api_call("POST", "/v3/requests", API.operator, {
        template_key = key, intent = intent, input_params = { demo_run = run_id },
        callback_url = opts.callback_url .. "/" .. key,
      }, "demo-" .. run_id .. "-" .. key)
      req = api_call("POST", "/v3/requests/" .. created.id .. "/approve", API.approver, nil,
        "demo-" .. run_id .. "-" .. key .. "-approve")
      if req.request_state == "PENDING_APPROVAL" then
        out(string.format("   %s %s: approved once; the policy (rule %s) needs %d approvers: a second client approves\n",
          req.id:sub(1, 8), key, tostring(req.approval_policy.rule), req.approvals_required))
        req = api_call("POST", "/v3/requests/" .. created.id .. "/approve", API.second_approver, nil,
          "demo-" .. run_id .. "-" .. key .. "-approve-2")
      end
    else
      req = with_session(function(s)
        local r = requests.create(s, {
          template_key = key, intent = intent,
          idempotency_key = "demo-" .. run_id .. "-" .. key,
          input_params = { demo_run = run_id },
          callback_url = opts.callback_url .. "/" .. key,
        }, INITIATOR)
        r = requests.approve(s, r.id, ACTOR)
        if r.request_state == "PENDING_APPROVAL" then
          out(string.format("   %s %s: %s approved; the policy (rule %s) needs %d approvers: %s approves too\n",
            r.id:sub(1, 8), key, ACTOR, tostring(r.approval_policy and r.approval_policy.rule),
            r.approvals_required, SECOND))
          r = requests.approve(s, r.id, SECOND)
        end
        return r
      end)
    end
    made[#made + 1] = { id = req.id, template_key = key, role = role, intent = intent }
  end
  return made
end

-- Complete every manual step that waits, as the desk would.
local function complete_manual_steps(s, ids, view, done)
  for _, n in ipairs(nodes_in(s, ids, { "READY" })) do
    if n.action_type:match("^manual_") and not done[n.id] then
      local ref = "OTC-DEMO-" .. n.id:sub(1, 6):upper()
      local ok, err = pcall(requests.complete_manual_step, s, n.id, ACTOR, { desk_reference = ref })
      if ok then
        done[n.id] = ref
        view.event(string.format("%s %s: the desk confirmed; manual step completed (desk_reference=%s)",
          n.request_id:sub(1, 8), n.node_key, ref))
      elseif not tostring(err):match("illegal_transition") then
        error(err, 0)
      end
    end
  end
end

-- UNKNOWN nodes, and their recovery, from the audit trail (a node may be
-- UNKNOWN for less time than one look at the table takes).
local function note_unknowns(s, ids, view, seen)
  local rows = s:query([[
    SELECT request_id::text AS request_id, actor, action, detail, ord FROM (
      SELECT request_id, actor, action, detail, outbox_id AS ord FROM audit_events
       WHERE request_id = ANY($1::uuid[]) AND entity_type = 'movement_request_node'
      UNION ALL
      SELECT request_id, actor, action, detail, id AS ord FROM audit_outbox
       WHERE request_id = ANY($1::uuid[]) AND entity_type = 'movement_request_node') a
     WHERE action = 'node.unknown' OR detail->>'from_state' = 'UNKNOWN'
     ORDER BY ord]], pg_array(ids))
  for _, a in ipairs(rows) do
    local d = type(a.detail) == "table" and a.detail or {}
    local key = a.request_id .. "|" .. tostring(d.node_key) .. "|" .. a.action .. "|" .. tostring(d.attempt_no)
    if not seen[key] then
      seen[key] = true
      if a.action == "node.unknown" then
        view.event(string.format("%s %s is UNKNOWN (%s): did the venue act? node_recovery will ask it",
          a.request_id:sub(1, 8), tostring(d.node_key), tostring(d.error_code)))
      else
        view.event(string.format("%s %s recovered by %s: the venue has it (%s); observing resumes",
          a.request_id:sub(1, 8), tostring(d.node_key), a.actor, a.action:match("^node%.(.*)$"):upper()))
      end
    end
  end
end

local function watch(opts, made, view)
  local ids = {}
  for i, m in ipairs(made) do ids[i] = m.id end
  local manual_done, unknown_seen = {}, {}
  local rows
  local finished = common.poll(function()
    local all_terminal = true
    with_session(function(s)
      complete_manual_steps(s, ids, view, manual_done)
      note_unknowns(s, ids, view, unknown_seen)
      rows = snapshot(s, ids)
    end)
    for _, r in ipairs(rows) do
      if not TERMINAL[r.request_state] then all_terminal = false end
    end
    view.draw(rows)
    if all_terminal then return true end
    if not daemon_alive(opts.daemon_pid) then
      view.clear()
      error("the daemon (pid " .. opts.daemon_pid .. ") stopped; the end of its log:\n"
        .. tail(opts.daemon_log, 20), 0)
    end
  end, opts.timeout, 0.25)
  if not finished then
    view.final(rows)
    error(string.format("not every movement finished within %g s", opts.timeout), 0)
  end
  view.final(rows)
  return rows, manual_done
end

-- Wait until no callback of ours is pending; returns the outbox rows and
-- how many are still pending.
local function wait_callbacks(ids, timeout)
  local rows, pending
  common.poll(function()
    rows = with_session(function(s)
      return s:query([[SELECT request_id::text AS request_id, status, attempts, last_error, payload
                         FROM movement_callback_outbox WHERE request_id = ANY($1::uuid[])
                        ORDER BY request_id, id]], pg_array(ids))
    end)
    pending = 0
    for _, r in ipairs(rows) do if r.status == "pending" then pending = pending + 1 end end
    return pending == 0
  end, timeout, 0.2)
  return rows, pending
end

-- Per request: rows delivered, deliveries the receiver verified, problems.
local function verify_callbacks(opts, made, outbox_rows)
  local per = {}
  for _, m in ipairs(made) do per[m.id] = { rows = 0, delivered = 0, verified = 0, rejected = 0, seqs = {} } end
  local problems = {}
  for _, r in ipairs(outbox_rows) do
    local p = per[r.request_id]
    p.rows = p.rows + 1
    if r.status == "delivered" then p.delivered = p.delivered + 1
    else problems[#problems + 1] = string.format("callback of %s is %s (%s)", r.request_id:sub(1, 8),
      r.status, tostring(r.last_error)) end
  end
  for _, e in ipairs(common.records(opts.record)) do
    local ok, body = pcall(cjson.decode, e.body or "")
    local p = ok and type(body) == "table" and per[body.request_id]
    if p then
      if e.verdict and e.verdict.ok then
        p.verified = p.verified + 1
        p.seqs[#p.seqs + 1] = body.sequence
      elseif e.verdict and e.verdict.reason == "replayed_nonce" then
        -- the same delivery retried: already counted once
      else
        p.rejected = p.rejected + 1
        problems[#problems + 1] = string.format("the receiver rejected a callback of %s: %s",
          body.request_id:sub(1, 8), e.verdict and tostring(e.verdict.reason) or "no verdict (no key?)")
      end
    end
  end
  for _, m in ipairs(made) do
    local p = per[m.id]
    table.sort(p.seqs)
    for i, sq in ipairs(p.seqs) do
      if sq ~= i then
        problems[#problems + 1] = string.format("callbacks of %s: sequence %s where %d was expected",
          m.id:sub(1, 8), tostring(sq), i)
        break
      end
    end
    if p.rows == 0 then problems[#problems + 1] = "no callback was written for " .. m.id:sub(1, 8) end
    if p.verified ~= p.delivered then
      problems[#problems + 1] = string.format("%s: %d callbacks delivered but %d verified by the receiver",
        m.id:sub(1, 8), p.delivered, p.verified)
    end
  end
  return per, problems
end

-- The UNKNOWN story of a request, from its audit trail.
local function unknown_story(request_id)
  local trail = with_session(audit_of, request_id)
  local steps, went_unknown, recovered_by = {}, nil, nil
  for _, a in ipairs(trail) do
    local d = type(a.detail) == "table" and a.detail or {}
    local state = a.action:match("^node%.(.+)$")
    if state and d.node_key then
      if state == "unknown" and not went_unknown then went_unknown = d end
      if went_unknown and d.from_state == "UNKNOWN" and d.node_key == went_unknown.node_key then
        recovered_by = a.actor
      end
      steps[#steps + 1] = { node_key = d.node_key, state = state:upper() }
    end
  end
  local mine = {}
  for _, st in ipairs(steps) do
    if went_unknown and st.node_key == went_unknown.node_key then mine[#mine + 1] = st.state end
  end
  return went_unknown, recovered_by, mine
end

-- ---- main -----------------------------------------------------------------------------

local function run(argv)
  local opts = parse_args(argv)
  local started = qtg.monotonic()
  local run_id = os.date("!%Y%m%dT%H%M%S") .. "-" .. qtg.crypto.hex(qtg.crypto.random_bytes(3))
  out(string.format("== creating and approving the sample movements (network class %s, %s)\n",
    qtg.settings.network_class, API and ("through the HTTP API at " .. API.base)
      or ("initiator " .. INITIATOR .. ", approver " .. ACTOR)))
  book_destinations()
  local made = create_all(opts, run_id)
  if opts.ids_file then
    local lines = {}
    for _, m in ipairs(made) do lines[#lines + 1] = m.id .. " " .. m.template_key .. "\n" end
    common.write(opts.ids_file, table.concat(lines))
  end
  for _, m in ipairs(made) do
    out(string.format("   %s  %-24s  %s\n", m.id:sub(1, 8), m.template_key, m.role))
  end
  out("== progress (the daemon's workers move them; this driver only watches, and plays the desk)\n")
  local view = new_view(opts.plain, started)
  local rows, manual_done = watch(opts, made, view)

  local ids = {}
  for i, m in ipairs(made) do ids[i] = m.id end
  local outbox_rows, pending = wait_callbacks(ids, 30)
  local per, problems = verify_callbacks(opts, made, outbox_rows)
  if pending > 0 then problems[#problems + 1] = pending .. " callbacks still pending after 30 s" end

  local by_id = {}
  for _, r in ipairs(rows) do by_id[r.id] = r end
  for _, m in ipairs(made) do
    local r = by_id[m.id]
    if r.request_state ~= "COMPLETED" then
      problems[#problems + 1] = string.format("%s (%s) ended %s (%s)", m.id:sub(1, 8), m.template_key,
        r.request_state, tostring(r.last_error_code))
    end
  end
  local manual_count = 0
  for _ in pairs(manual_done) do manual_count = manual_count + 1 end
  if manual_count == 0 then problems[#problems + 1] = "no manual step was completed" end

  local lost, evm
  for _, m in ipairs(made) do
    if m.template_key == LOST_ACK then lost = m end
    if SAMPLES[m.template_key] and SAMPLES[m.template_key].evm then evm = m end
  end
  local evm_note
  if evm and by_id[evm.id].request_state == "COMPLETED" then
    -- the chain itself says the funds arrived
    local bal = rpc(opts.evm_rpc, "eth_getBalance", { evm.intent.destination, "latest" })
    if bal ~= EVM_WEI then
      problems[#problems + 1] = ("evm_transfer: the destination holds %s wei on the chain, not %s")
        :format(tostring(bal), EVM_WEI)
    else
      evm_note = ("0.25 ETH arrived at %s on chain 31337 (eth_getBalance)"):format(evm.intent.destination)
    end
  end
  local went_unknown, recovered_by, steps = unknown_story(lost.id)
  if not went_unknown then
    problems[#problems + 1] = "the lost-acknowledgement movement never went UNKNOWN"
  elseif recovered_by ~= "system:node_recovery" then
    problems[#problems + 1] = "the UNKNOWN node was not recovered by node_recovery (by "
      .. tostring(recovered_by) .. ")"
  end

  out("\n== summary\n")
  local total_cb, total_verified = 0, 0
  for _, m in ipairs(made) do
    local r, p = by_id[m.id], per[m.id]
    total_cb, total_verified = total_cb + p.delivered, total_verified + p.verified
    out(string.format("   %s  %-24s  %-10s %5.1fs  callbacks: %d delivered, %d verified\n", m.id:sub(1, 8),
      m.template_key, r.request_state, r.elapsed, p.delivered, p.verified))
  end
  out(string.format("   manual step: %s\n", manual_count > 0
    and ("completed by " .. ACTOR .. " (" .. manual_count .. ")") or "none"))
  if went_unknown then
    out(string.format("   UNKNOWN: %s %s went UNKNOWN (%s), recovered by %s: %s\n", lost.id:sub(1, 8),
      went_unknown.node_key, tostring(went_unknown.error_code), tostring(recovered_by),
      table.concat(steps, " -> ")))
  end
  if evm_note then out("   EVM: ", evm_note, "\n") end
  out(string.format("   callbacks: %d delivered to %s, %d verified (v3 HMAC signature, timestamp, nonce)\n",
    total_cb, opts.callback_url, total_verified))
  if #problems > 0 then
    out("\n== the demo did NOT end as it should:\n")
    for _, p in ipairs(problems) do out("   - ", p, "\n") end
    return 1
  end
  out(string.format("\n== all %d movements COMPLETED; every callback delivered and verified (%.1fs)\n",
    #made, qtg.monotonic() - started))
  return 0
end

local ok, res = pcall(run, { ... })
if not ok then
  io.stderr:write("\ndemo: ", tostring(type(res) == "table" and (res.message or res.kind) or res), "\n")
  return 1
end
return res
