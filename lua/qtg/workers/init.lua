-- qtg.workers: the registry of supervised workers, built from the settings
-- exactly as the spec's tables say (name, group, flag, interval).  One
-- readable table; the runtime (C) runs whatever `registry` returns.
--
-- Jitter: the spec's run_loop takes a jitter argument (default 0); we use
-- 10 % of each interval so several qtgd processes do not poll in lockstep.
--
-- Wake-ups and draining (MG_WAKEUPS_ENABLED, on by default;
-- docs/performance.md): a row's `drain = true` makes its worker run again at
-- once after a pass that found work (the dispatcher still claims one node per
-- pass), and `wake = true` says a NOTIFY (sql/0030_wakeups.sql, handled by
-- qtg.wakeups) wakes it.  Polling stays at the spec's intervals either way:
-- it is the fallback for a lost notification, so a lost one costs at most
-- one interval of latency, never work.  With wake-ups off, neither applies.
local M = {}

local function csv_nonempty(s)
  return s ~= nil and s:match("%S") ~= nil
end

-- Each row: name, group, module, interval setting, enabled(settings) ->
-- bool, and needs(settings) -> nil or the reason the worker is skipped
-- (an external client that is not configured).
local rows = {
  -- always-on, core group
  {name = "node_dispatcher", group = "core", interval = "node_dispatch_interval_seconds",
   drain = true, wake = true},
  {name = "node_observer", group = "core", interval = "node_observe_interval_seconds",
   drain = true, wake = true},
  {name = "node_recovery", group = "core", interval = "node_recovery_interval_seconds"},
  -- always-on, sidecar group
  -- not drained: its wake-ups are gathered (qtg.wakeups.GATHER) so a pass
  -- finds full batches; a pass cut short by its budget wakes it again
  {name = "callback_dispatcher", group = "sidecar", interval = "callback_dispatch_interval_seconds",
   wake = true},
  {name = "expiration_checker", group = "sidecar", interval = "expiration_check_interval_seconds"},
  {name = "template_proposal_expiration", group = "sidecar",
   interval = "template_proposal_expiration_interval_seconds"},
  {name = "executor_health", group = "sidecar", interval = "executor_health_interval_seconds"},
  -- not drained: notified by nearly every transaction, its wake-ups are
  -- gathered instead (qtg.wakeups.GATHER), a full batch per pass
  {name = "audit_outbox_promoter", group = "sidecar", interval = "audit_outbox_promoter_interval_seconds",
   wake = true},
  -- conditional, core group
  {name = "evm_nonce_reaper", group = "core", interval = "evm_nonce_reaper_interval_seconds",
   flag = "evm_nonce_reaper_enabled",
   -- parsed as the reaper parses it: a value it cannot use would make
   -- every tick raise, so it is skipped like an unset one
   needs = function(s)
     if not csv_nonempty(s.evm_rpc_urls) then return "no EVM RPC endpoints (MG_EVM_RPC_URLS)" end
     local _, why, n = require("qtg.evm_rpc").endpoints(s.evm_rpc_urls)
     if why then return "malformed EVM RPC endpoints (" .. why .. ")" end
     if n == 0 then return "no EVM RPC endpoints (MG_EVM_RPC_URLS)" end
   end},
  {name = "ccip_stranded_reaper", group = "core", interval = "ccip_stranded_reaper_interval_seconds",
   flag = "ccip_stranded_reaper_enabled"},
  -- conditional, sidecar group
  {name = "capital_transfer_followup", group = "sidecar",
   interval = "capital_transfer_followup_interval_seconds", flag = "capital_transfer_followup_enabled"},
  {name = "notification_dispatcher", group = "sidecar", interval = "notify_interval_seconds",
   flag = "notify_enabled",
   needs = function(s)
     if not csv_nonempty(s.notify_webhook_url) then return "no notification webhook (MG_NOTIFY_WEBHOOK_URL)" end
   end},
  {name = "balance_history_rollup", group = "sidecar", interval = "balance_history_interval_seconds",
   flag = "balance_history_enabled"},
  {name = "cex_transfer_ingest", group = "sidecar", interval = "cex_transfer_ingest_interval_seconds",
   enabled = function(s) return csv_nonempty(s.cex_transfer_ingest_venues_csv) end},
  {name = "balance_snapshot", group = "sidecar", interval = "balance_snapshot_interval_seconds",
   flag = "balance_snapshot_enabled"},
  {name = "ccip_drift", group = "sidecar", interval = "ccip_drift_poll_interval_seconds",
   flag = "ccip_enabled",
   needs = function(s)
     if not csv_nonempty(s.ccip_sidecar_url) then return "no CCIP sidecar client (MG_CCIP_SIDECAR_URL)" end
   end},
  {name = "verify_drift", group = "sidecar", interval = "verify_drift_interval_seconds",
   flag = "verify_drift_enabled"},
}

M.rows = rows

-- registry(settings) -> array of {name, group, module, interval, jitter,
-- enabled, skip_reason, drain, wake, spec_interval}.  With
-- MG_WORKERS_ENABLED=false nothing is enabled.  interval is the one the
-- runtime uses: the setting (spec_interval, kept for the console's view),
-- with or without wake-ups.
function M.registry(settings)
  local out = {}
  for i, row in ipairs(rows) do
    local enabled = settings.workers_enabled
    if enabled and row.flag then enabled = settings[row.flag] end
    if enabled and row.enabled then enabled = row.enabled(settings) end
    local skip
    if enabled and row.needs then skip = row.needs(settings) end
    local spec_interval = settings[row.interval]
    local wakeups = settings.wakeups_enabled == true
    local interval = spec_interval
    out[i] = {
      name = row.name,
      group = row.group,
      module = "qtg.workers." .. row.name,
      interval = interval,
      jitter = interval * 0.1,
      enabled = enabled and skip == nil,
      skip_reason = skip,
      drain = wakeups and row.drain == true,
      wake = wakeups and row.wake ~= nil,
      spec_interval = spec_interval,
    }
  end
  return out
end

return M
