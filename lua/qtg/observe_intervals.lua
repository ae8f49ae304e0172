-- qtg.observe_intervals: how long the observer waits before it observes a
-- node again (spec section 2, DEFAULT_OBSERVE_INTERVALS).  An executor's
-- retry_after_seconds wins over the table, clamped to MAX_BACKOFF_SECONDS.
--
-- The floor: whatever the hint, a node is observed again no sooner than
-- MG_NODE_OBSERVE_MIN_INTERVAL_SECONDS (default 1) after it was observed (or
-- submitted, or recovered): an executor answering retry_after_seconds = 0
-- is observed once a second, not in a loop as fast as wake-ups and draining
-- allow.  0 restores the spec (the hint alone decides).
local M = {}

M.DEFAULT_OBSERVE_INTERVALS = {
  cex_withdrawal_status = 5,
  cex_deposit_status = 10,
  destination_chain_receive_observe = 10,
  destination_chain_finality_observe = 15,
  protocol_observe = 15,
  cctp_attestation = 15,
  cctp_mint_status = 5,
  ccip_delivery = 60,
  debridge_fulfillment = 30,
}
M.OTHER = 10
M.MAX_BACKOFF_SECONDS = 600

function M.default_for(action_type)
  return M.DEFAULT_OBSERVE_INTERVALS[action_type] or M.OTHER
end

-- delay(action_type, retry_after_seconds) -> seconds until the next observe.
-- retry_after_seconds: nil, or a number >= 0 (validated by the executor
-- result checker); it wins and is clamped to MAX_BACKOFF_SECONDS.
function M.delay(action_type, retry_after_seconds)
  local d
  if type(retry_after_seconds) == "number" then
    d = math.min(math.max(retry_after_seconds, 0), M.MAX_BACKOFF_SECONDS)
  else
    d = M.default_for(action_type)
  end
  return math.max(d, M.floor())
end

-- after_unknowns(action_type, n) -> the least seconds until a node that
-- recovery found in flight is observed again, after its last n
-- observations in a row ended UNKNOWN (sql/0212).  One such observation is
-- a passing fault: 0 (the recover answer's hint stands).  From the second
-- the action's interval, doubled for each one past the second, clamped to
-- MAX_BACKOFF_SECONDS (10, 20, 40 ... 600 s for an action of the default
-- interval): an observe() that fails every time then costs a few writes an
-- hour, not two a minute.
function M.after_unknowns(action_type, n)
  n = tonumber(n) or 0
  if n < 2 then return 0 end
  local d = math.min(M.default_for(action_type) * 2 ^ math.min(n - 2, 30), M.MAX_BACKOFF_SECONDS)
  return math.max(d, M.floor())
end

-- floor() -> MG_NODE_OBSERVE_MIN_INTERVAL_SECONDS (0 when unset).
function M.floor()
  local ok, settings = pcall(function() return require("qtg").settings end)
  local f = ok and settings and tonumber(settings.node_observe_min_interval_seconds) or 0
  return math.min(math.max(f, 0), M.MAX_BACKOFF_SECONDS)
end

return M
