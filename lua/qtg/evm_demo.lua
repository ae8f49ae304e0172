-- qtg.evm_demo: the demo's evm_transfer on a local chain (tools/demo;
-- docs/evm.md "In the demo").  A local anvil's defaults: chain 31337;
-- account 0 pays account 1.  The key of account 0 (public, printed by anvil
-- itself; dev chains only) goes into a 0600 file named by
-- MG_SIGNER_KEYS=evm_hot=FILE: keys never enter Lua, not even this one.
local qtg = require "qtg"
local evm_transfer = require "qtg.executors.evm_transfer"

local M = {}

M.DEMO = {
  chain_id = 31337,
  signer_key = "evm_hot",     -- the shipped template's node config
  destination = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
  amount = "1.5",
}

-- ready() -> true, or nil + reason: this process can run the demo's
-- transfer (the signer key is loaded and the chain's endpoint answers with
-- chain 31337).  Call it from a host task (qtgd exec).
function M.ready()
  local d = M.DEMO
  if not qtg.signer.address(d.signer_key) then
    return nil, "signer key " .. d.signer_key .. " is not loaded (MG_SIGNER_KEYS)"
  end
  local url, err = evm_transfer.connect(d.chain_id)
  if not url then return nil, err.code .. ": " .. err.message end
  return true
end

-- request(s, actor[, opts]) -> the request: an evm_transfer of
-- opts.amount (1.5) ETH to opts.destination (anvil's account 1), created
-- by the demo itself (system:evm-demo) and approved by `actor` (four eyes:
-- the initiator never approves) in this process's network class.
function M.request(s, actor, opts)
  opts = opts or {}
  local requests = require "qtg.requests"
  local req = requests.create(s, {
    template_key = opts.template_key or "evm_transfer",
    intent = { asset = "ETH", amount = opts.amount or M.DEMO.amount,
               destination = opts.destination or M.DEMO.destination,
               chain_id = opts.chain_id or M.DEMO.chain_id },
    idempotency_key = opts.idempotency_key or ("demo-evm-" .. qtg.crypto.nonce()),
    callback_url = opts.callback_url,
  }, "system:evm-demo")
  return requests.approve(s, req.id, actor)
end

return M
