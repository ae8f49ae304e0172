-- tools/package-smoke.lua -- one movement through the installed qtgd, run by
-- tools/package-smoke as
--   /usr/bin/qtgd exec tools/package-smoke.lua --callback-url URL --record FILE
--                                             [--timeout SECONDS]
-- while the installed daemon (`qtgd run` as the qtg user) works the same
-- database.  Creates and approves a cex_withdrawal_to_wallet movement with a
-- callback URL (the receiver verifies every signature), waits until it is
-- COMPLETED and every callback is delivered, and checks the receiver's
-- verdicts.  Prints one line per fact; exit 0 when all hold, else 1.
-- Polling and the receiver's record are spec/lua/support/common.lua's: the
-- tree, this file's path up to /tools/, goes at the end of package.path, so
-- every qtg module still comes from the installed package.
local qtg = require "qtg"
local cjson = require "cjson"
local requests = require "qtg.requests"
package.path = package.path .. ";" .. (debug.getinfo(1, "S").source:match("^@(.*)/tools/") or ".") .. "/?.lua"
local common = require "spec.lua.support.common"

local function parse(argv)
  local opts = { timeout = 60 }
  local i = 1
  while i <= #argv do
    local a, v = argv[i], argv[i + 1]
    if a == "--callback-url" and v then opts.callback_url = v
    elseif a == "--record" and v then opts.record = v
    elseif a == "--timeout" and tonumber(v) then opts.timeout = tonumber(v)
    else error("package-smoke.lua: bad argument " .. tostring(a), 0) end
    i = i + 2
  end
  if not opts.callback_url or not opts.record then
    error("package-smoke.lua: --callback-url and --record are required", 0)
  end
  return opts
end

local function say(fmt, ...) io.stdout:write(string.format(fmt, ...), "\n") io.stdout:flush() end

local function run(argv)
  local opts = parse(argv)
  say("policies from %s (package.path starts %s)", qtg.root, package.path:sub(1, 40))
  if qtg.root ~= "/usr/share/qtg" then error("this is not the installed qtgd: its root is " .. qtg.root, 0) end
  local key = "pkg-smoke-" .. qtg.crypto.hex(qtg.crypto.random_bytes(6))
  local req = qtg.db.with_session(function(s)
    -- the template pays only a destination in the address book
    -- (destination_allowlist_required): booked by admins first
    require("spec.lua.support.book").ensure(s, { asset = "USDC", chain = "ethereum",
      address = "0x8ba1f109551bd432803012645ac136ddd64dba72" })
    local r = requests.create(s, {
      template_key = "cex_withdrawal_to_wallet", idempotency_key = key,
      intent = { asset = "USDC", amount = "125.50", venue = "binance", destination_chain = "ethereum",
                 destination = "0x8ba1f109551bd432803012645ac136ddd64dba72" },
      callback_url = opts.callback_url,
    }, "console:package-smoke-initiator")
    return requests.approve(s, r.id, "console:package-smoke")
  end)
  say("created and approved %s (cex_withdrawal_to_wallet)", req.id)
  local final = common.wait_for(function()
    local r = qtg.db.with_session(function(s)
      return s:query("SELECT request_state, last_error_code FROM movement_requests WHERE id = $1::uuid", req.id)[1]
    end)
    if r.request_state ~= "APPROVED" and r.request_state ~= "EXECUTING" then return r end
  end, opts.timeout, "the movement to finish", 0.2)
  if final.request_state ~= "COMPLETED" then
    error(("the movement ended %s (%s)"):format(final.request_state, tostring(final.last_error_code)), 0)
  end
  say("movement %s COMPLETED", req.id)
  local rows = common.wait_for(function()
    local rs = qtg.db.with_session(function(s)
      return s:query("SELECT status, callback_nonce FROM movement_callback_outbox WHERE request_id = $1::uuid", req.id)
    end)
    for _, r in ipairs(rs) do if r.status == "pending" then return nil end end
    return rs
  end, 30, "its callbacks to be delivered", 0.2)
  local nonces = {}
  for _, r in ipairs(rows) do
    if r.status ~= "delivered" then error("a callback ended " .. r.status, 0) end
    nonces[r.callback_nonce] = true
  end
  local verified = 0
  for _, e in ipairs(common.records(opts.record)) do
    local body = cjson.decode(e.body)
    if body.request_id == req.id then
      if not (e.verdict and e.verdict.ok) then
        error("the receiver rejected a callback: " .. tostring(e.verdict and e.verdict.reason), 0)
      end
      if not nonces[common.header(e, "X-QTG-Callback-Nonce")] then
        error("the receiver got a callback the outbox does not know", 0)
      end
      verified = verified + 1
    end
  end
  if #rows == 0 or verified ~= #rows then
    error(("%d callbacks delivered but %d verified by the receiver"):format(#rows, verified), 0)
  end
  say("callbacks: %d delivered, %d verified by the receiver", #rows, verified)
  return 0
end

local ok, res = pcall(run, { ... })
if not ok then
  io.stderr:write("package-smoke.lua: ", tostring(res), "\n")
  return 1
end
return res
