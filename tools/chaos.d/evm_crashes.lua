-- Scenario "evm-crashes": evm_transfer requests on a real anvil chain, each
-- signed by a real `qtgd signer` process, while the signer and the 2 qtgd
-- processes are killed with SIGKILL and restarted: the signer at random
-- moments, the daemons at random moments and at an exact point through the
-- chaos overrides ("broadcast", override/qtg/executors/evm_transfer.lua:
-- the transaction is sent and the node's new state not yet committed).
--
-- Exactly once, on the rows and on the chain: every request COMPLETED with
-- its three nodes, each on its first attempt; each destination (one fresh
-- address per request, one distinct amount each) holds exactly its amount;
-- the sender's nonce moved by exactly the number of requests, one consumed
-- reservation per transfer node on contiguous nonces, its bytes mined in a
-- block; signer_events holds no refusal and a grant of each mined
-- transfer's bytes, and grants of other bytes (the node's nonce rebuilt with
-- new fees after a kill lost a signature before it was stored) no more than
-- there were kills; the audit outbox is promoted and SIGTERM leaves
-- nothing behind.
local qtg = require "qtg"
local cjson = require "cjson"
local templates = require "qtg.templates"
local requests = require "qtg.requests"
local evm_tx = require "qtg.evm_tx"
local common = require "spec.lua.support.common"

local M = {}

local CHAIN = 31337
local TEMPLATE = "chaos_evm_transfer"

local rpc = common.rpc

-- anvil (tools/anvil installs it from npm) on a free port, a block a second
-- so confirmations grow; returns its handle with url, address and key of
-- its account 0.
local function start_anvil(lib)
  local h = common.start_anvil(lib.work .. "/anvil", { chain_id = CHAIN, accounts = 1, block_time = 1 })
  lib.started[#lib.started + 1] = h
  assert(h.address and h.key, "no account in anvil's log: " .. (lib.read(h.log) or ""):sub(-500))
  return h
end

-- `qtgd signer` holding the anvil account's key as evm_hot, once it listens.
local function start_signer(lib, env)
  local h = lib.start("signer", env, common.quote(lib.bin) .. " signer")
  common.wait_log(h, '"signer: listening"', 30, "qtgd signer to listen")
  return h
end

local function load_template(lib)
  local doc = cjson.decode(assert(lib.read(lib.root .. "/templates/evm_transfer.json")))
  doc.template_key = TEMPLATE
  doc.name = doc.name .. " (chaos)"
  doc.nodes[3].config.confirmations = 2
  local c, errs = templates.validate_and_compile(doc, "chaos:" .. TEMPLATE)
  assert(c, errs and table.concat(errs, "\n"))
  lib.with_retry(function(s)
    s:begin()
    templates.store(s, c)
    s:commit()
  end)
end

-- Request i (i < 1000): a fresh destination and an amount of its own,
-- (1000 + i) * 10^12 wei, written as ETH ("0.001007" for i = 7).
local function create(lib, i)
  local dest = "0x" .. qtg.crypto.hex(qtg.crypto.random_bytes(20))
  local amount = string.format("0.%06d", 1000 + i)
  local key = string.format("chaos-evm-%05d", i)
  local id = lib.with_retry(function(s)
    local req = requests.create(s, { template_key = TEMPLATE, idempotency_key = key,
      intent = { asset = "ETH", amount = amount, destination = dest, chain_id = CHAIN } }, lib.INITIATOR)
    if req.request_state == "PENDING_APPROVAL" then req = requests.approve(s, req.id, lib.ACTOR) end
    return req.id
  end)
  return { id = id, key = key, dest = dest, amount = amount, wei = tostring(1000 + i) .. string.rep("0", 12) }
end

local function count_kills(lib)
  local n = 0
  for _ in (lib.read(lib.tokens .. "/kills.log") or ""):gmatch("broadcast [^\n]*\n") do n = n + 1 end
  return n
end

local function not_done(lib, recs)
  local states = {}
  for _, r in ipairs(lib.query([[SELECT idempotency_key, request_state FROM movement_requests
                                 WHERE network_class = $1]], qtg.settings.network_class)) do
    states[r.idempotency_key] = r.request_state
  end
  local n, by = 0, {}
  for _, rec in ipairs(recs) do
    local st = states[rec.key]
    if st ~= "COMPLETED" then
      n = n + 1
      by[tostring(st)] = (by[tostring(st)] or 0) + 1
    end
  end
  return n, by
end

function M.run(lib)
  local N = lib.ci and 24 or 100
  local want = lib.ci and { daemon = 4, signer = 4, broadcast = 3 } or { daemon = 12, signer = 12, broadcast = 8 }
  local interval = lib.ci and 2.5 or 3   -- kills spread over the transfers' own time
  local t0 = qtg.monotonic()
  local anvil = start_anvil(lib)
  local key_path = lib.work .. "/evm_hot.key"
  lib.write(key_path, anvil.key .. "\n", "600")
  local socket = lib.work .. "/signer.sock"
  local signer_env = { MG_DATABASE_URL = os.getenv("MG_DATABASE_URL"), QTG_ROOT = lib.root,
    MG_NETWORK_CLASS = qtg.settings.network_class, MG_LOG_LEVEL = "info",
    MG_SIGNER_KEYS = "evm_hot=" .. key_path, MG_SIGNER_SOCKET = socket,
    MG_SIGNER_TRUST_APPROVAL_ROWS = "true" }   -- the scenario approves unsigned
  local extra = { MG_SIGNER_SOCKET = socket, MG_EVM_RPC_URLS = CHAIN .. "=" .. anvil.url,
                  MG_NODE_DISPATCH_INTERVAL_SECONDS = "0.3", MG_NODE_OBSERVE_INTERVAL_SECONDS = "0.3" }
  load_template(lib)
  local nonce0 = tonumber(rpc(anvil.url, "eth_getTransactionCount", { anvil.address, "latest" }):sub(3), 16)
  local signer = start_signer(lib, signer_env)
  lib.start_daemons(2, extra)
  lib.log("evm-crashes: anvil %s, a signer and 2 processes, %d transfers from %s; kills: %d signer, "
    .. "%d daemon at random, %d after a broadcast", anvil.url, N, anvil.address, want.signer, want.daemon,
    want.broadcast)

  local recs, kills, restarts = {}, { signer = 0, daemon = 0 }, 0
  local last = { kill = qtg.monotonic(), broadcast = 0 }
  local turn = 0
  local function restart_dead()
    restarts = restarts + lib.restart_dead(extra)
    if not lib.alive(signer) then
      signer = start_signer(lib, signer_env)
      restarts = restarts + 1
    end
  end
  local deadline = qtg.monotonic() + (lib.ci and 120 or 600)
  while qtg.monotonic() < deadline do
    restart_dead()
    local now = qtg.monotonic()
    local broadcast = count_kills(lib)
    local armed = lib.exists(lib.tokens .. "/broadcast.token")
    if broadcast < want.broadcast and not armed and now - last.broadcast > interval then
      lib.write(lib.tokens .. "/broadcast.token", "armed\n")
      last.broadcast = now
    end
    if now - last.kill > interval / 2 and (kills.signer < want.signer or kills.daemon < want.daemon) then
      turn = turn + 1
      if (turn % 2 == 1 and kills.signer < want.signer) or kills.daemon >= want.daemon then
        if lib.signal(signer, "KILL") then kills.signer = kills.signer + 1 end
      else
        local alive = {}
        for i, h in pairs(lib.daemons) do if lib.alive(h) then alive[#alive + 1] = i end end
        if #alive > 0 and lib.signal(lib.daemons[alive[lib.random(1, #alive)]], "KILL") then
          kills.daemon = kills.daemon + 1
        end
      end
      last.kill = now
    end
    for _ = 1, 2 do
      if #recs < N then recs[#recs + 1] = create(lib, #recs + 1) end
    end
    if #recs >= N and kills.signer >= want.signer and kills.daemon >= want.daemon
        and count_kills(lib) >= want.broadcast then break end
    qtg.sleep(0.25)
  end
  os.remove(lib.tokens .. "/broadcast.token")
  local broadcast = count_kills(lib)
  lib.log("evm-crashes: %d requests, %d signer kills, %d daemon kills, %d after a broadcast, %d restarts; settling",
    #recs, kills.signer, kills.daemon, broadcast, restarts)

  local seen = 0
  local settled = common.poll(function()
    restart_dead()
    local n, by = not_done(lib, recs)
    if n == 0 then return true end
    if qtg.monotonic() - seen > 10 then
      local parts = {}
      for k, v in pairs(by) do parts[#parts + 1] = k .. "=" .. v end
      lib.log("settling: %d requests not COMPLETED (%s)", n, table.concat(parts, " "))
      seen = qtg.monotonic()
    end
  end, lib.ci and 120 or 600, 0.5)
  if not settled then lib.fail("not every request COMPLETED before the deadline") end
  lib.drain_audit(30)

  local r = { requests = #recs, processes = 3 }
  local total_kills = kills.signer + kills.daemon + broadcast
  if kills.signer < want.signer then lib.fail("only %d signer kills", kills.signer) end
  if kills.daemon < want.daemon then lib.fail("only %d daemon kills", kills.daemon) end
  if broadcast < want.broadcast then lib.fail("only %d kills after a broadcast", broadcast) end

  -- 1. rows: one request per key, COMPLETED, every node on its first attempt
  local class = qtg.settings.network_class
  r.lost = #recs - lib.scalar([[SELECT count(*)::int FROM movement_requests
    WHERE network_class = $1 AND request_state = 'COMPLETED']], class)
  if lib.scalar("SELECT count(*)::int FROM movement_requests WHERE network_class = $1", class) ~= #recs then
    lib.fail("the database holds another number of requests than the %d created", #recs)
  end
  if r.lost ~= 0 then lib.fail("%d requests not COMPLETED", r.lost) end
  local nodes = lib.query([[SELECT n.node_key, n.node_state, n.attempt_no FROM movement_request_nodes n
    JOIN movement_requests q ON q.id = n.request_id WHERE q.network_class = $1]], class)
  if #nodes ~= 3 * #recs then lib.fail("%d nodes for %d requests", #nodes, #recs) end
  r.second_attempts = 0
  for _, n in ipairs(nodes) do
    if n.node_state ~= "COMPLETED" then lib.fail("node %s is %s", n.node_key, n.node_state) end
    if n.attempt_no > 1 then r.second_attempts = r.second_attempts + 1 end
  end
  if r.second_attempts > 0 then lib.fail("%d nodes on a second attempt", r.second_attempts) end

  -- 2. the chain: each amount arrived once, and nothing else was sent
  r.duplicated, r.effects_lost = 0, 0
  for _, rec in ipairs(recs) do
    local got = evm_tx.hex_to_dec(rpc(anvil.url, "eth_getBalance", { rec.dest, "latest" }))
    if got ~= rec.wei then
      if got == "0" then r.effects_lost = r.effects_lost + 1 else r.duplicated = r.duplicated + 1 end
      lib.fail("%s: %s wei arrived at %s, %s approved", rec.key, got, rec.dest, rec.wei)
    end
  end
  local nonce = tonumber(rpc(anvil.url, "eth_getTransactionCount", { anvil.address, "latest" }):sub(3), 16)
  r.transactions = nonce - nonce0
  if r.transactions ~= #recs then
    lib.fail("the sender sent %d transactions for %d transfers", r.transactions, #recs)
  end

  -- 3. reservations: one consumed per transfer node, nonces contiguous, mined
  local res = lib.query([[SELECT v.nonce, v.status, v.tx_hash, v.request_node_id
    FROM evm_nonce_reservation v JOIN movement_request_nodes n ON n.id = v.request_node_id
    JOIN movement_requests q ON q.id = n.request_id
    WHERE q.network_class = $1 AND v.status <> 'released' ORDER BY v.nonce]], class)
  local per_node = {}
  for i, v in ipairs(res) do
    if v.status ~= "consumed" then lib.fail("reservation of nonce %d is %s", v.nonce, v.status) end
    if v.nonce ~= nonce0 + i - 1 then lib.fail("nonce %d where %d comes next", v.nonce, nonce0 + i - 1) end
    per_node[v.request_node_id] = (per_node[v.request_node_id] or 0) + 1
    local receipt = rpc(anvil.url, "eth_getTransactionReceipt", { v.tx_hash })
    if receipt == cjson.null or receipt.status ~= "0x1" then lib.fail("tx %s is not mined", tostring(v.tx_hash)) end
  end
  if #res ~= #recs then lib.fail("%d live reservations for %d transfers", #res, #recs) end
  for node, n in pairs(per_node) do
    if n > 1 then lib.fail("node %s holds %d reservations", node, n) end
  end

  -- 4. signer_events: no refusal; every mined transfer was granted; a grant
  -- of other bytes than those the node finally reserved (the same nonce
  -- rebuilt with new fees, after a kill lost the signature before it was
  -- stored) happens only after a kill, and never reached the chain (the
  -- sender's nonce count above holds only the reserved ones)
  local ev = lib.query([[
    SELECT e.decision, e.code, e.request_node_id, e.payload_hash,
           EXISTS (SELECT 1 FROM evm_nonce_reservation v WHERE v.request_node_id = e.request_node_id
                      AND v.payload_hash = e.payload_hash AND v.status = 'consumed') AS reserved
      FROM signer_events e JOIN movement_requests q ON q.id = e.request_id
     WHERE q.network_class = $1]], class)
  r.signer_grants, r.signer_refusals, r.signer_rebuilt = 0, 0, 0
  local granted_nodes = {}
  for _, e in ipairs(ev) do
    if e.decision == "granted" then
      r.signer_grants = r.signer_grants + 1
      if e.reserved then granted_nodes[e.request_node_id] = true else r.signer_rebuilt = r.signer_rebuilt + 1 end
    else
      r.signer_refusals = r.signer_refusals + 1
      lib.fail("the signer refused node %s: %s", tostring(e.request_node_id), e.code)
    end
  end
  for node in pairs(per_node) do
    if not granted_nodes[node] then lib.fail("transfer node %s mined without its grant in signer_events", node) end
  end
  if r.signer_rebuilt > total_kills then
    lib.fail("%d grants of bytes the nodes did not keep, for %d kills", r.signer_rebuilt, total_kills)
  end
  if r.signer_grants > #recs + total_kills then
    lib.fail("%d grants for %d transfers and %d kills", r.signer_grants, #recs, total_kills)
  end

  -- 5. audit promoted; SIGTERM stops everyone cleanly and leaves nothing behind
  lib.check_audit(r)
  lib.stop_daemons_cleanly()
  lib.signal(signer, "TERM")
  local src = lib.wait_exit(signer, 30)
  if src ~= 0 then lib.fail("qtgd signer: SIGTERM gave exit code %s", tostring(src)) end
  lib.check_nothing_left("after SIGTERM")
  -- the daemons met the signer down (a kill came while transfers waited to be signed)
  r.signer_unavailable_seen = tonumber(lib.sh("cat " .. common.quote(lib.work) .. "/qtgd*.log | grep -c signer_unavailable")
    :match("%d+")) or 0
  if r.signer_unavailable_seen == 0 then lib.fail("no daemon ever met the signer down") end
  r.faults = total_kills
  r.kills_signer, r.kills_daemon, r.kills_broadcast, r.restarts = kills.signer, kills.daemon, broadcast, restarts
  r.seconds = math.floor(qtg.monotonic() - t0)
  return lib.result("evm-crashes", r)
end

return M
