-- qtg.metrics: this process's counters and histograms, in the Prometheus
-- model (the /metrics route renders them after the table gauges).
--
--   metrics.count(name, labels[, n])       add n (1) to a counter
--   metrics.zero(name, labels)             make a counter's series at 0
--   metrics.observe(name, labels, value)   put a value in a histogram
--   metrics.render(out)                     append every family's lines
--   metrics.value(name, labels)             what a series holds (for specs)
--   metrics.epoch(ts)                       seconds since the epoch of a
--                                           timestamptz as qtg.db returns it
--
-- Families are declared once, in FAMILIES: name, type, help and the label
-- names; label values must be small enums (states, codes, route and worker
-- names), never ids.  The module is kept across reloads (qtg.reload's KEEP)
-- so a policy reload does not reset the counters.
--
-- A counter an alert watches for its first event exists at 0 from the
-- start (FAMILIES' `zero`, or metrics.zero by the module that knows the
-- label values): a series that first appears at 1 has no increase to
-- Prometheus, so the first refusal or busy stop would never alert.
local M = {}

M.BUCKETS = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10 }

M.FAMILIES = {
  qtg_http_requests_total = { type = "counter", help = "API requests answered by this process",
    labels = { "route", "method", "status" } },
  qtg_http_request_duration_seconds = { type = "histogram", help = "time to answer an API request",
    labels = { "route" } },
  qtg_signer_decisions_total = { type = "counter",
    help = "answers of the signer to this process's sign calls (granted, refused with its code, unavailable)",
    labels = { "outcome", "code" } },
  qtg_signer_refusals_total = { type = "counter",
    help = "sign calls of this process the signer refused (any code: qtg_signer_decisions_total has each)",
    labels = {}, zero = { {} } },
  qtg_http_server_errors_total = { type = "counter",
    help = "API requests this process answered with a 5xx status (any route: qtg_http_requests_total has each)",
    labels = {}, zero = { {} } },
  qtg_metrics_gauge_errors_total = { type = "counter",
    help = "collections of a /metrics table gauge whose statement failed (that gauge is left out of the answer)",
    labels = { "gauge" } },
  qtg_busy_stops_total = { type = "counter",
    help = "work on a node the busy guard stopped (an executor's call, dispatch, an outcome's write), by what it was",
    labels = { "what" } },
  qtg_approve_to_submitted_seconds = { type = "histogram",
    help = "from a request's approval to its first node's first submit (SUBMITTED), this process's dispatches",
    labels = {} },
}

local series = {}   -- name -> key -> {labels =, value = | buckets =, sum =, count =}

local function key_of(labels, names)
  local parts = {}
  for i, n in ipairs(names) do parts[i] = tostring(labels[n] or "") end
  return table.concat(parts, "\0")
end

local function slot(name, labels)
  local fam = M.FAMILIES[name]
  if not fam then error("qtg.metrics: no family " .. tostring(name), 3) end
  local t = series[name]
  if not t then t = {}; series[name] = t end
  local k = key_of(labels or {}, fam.labels)
  local s = t[k]
  if not s then
    s = { labels = labels or {}, value = 0, sum = 0, count = 0, buckets = {} }
    for i = 1, #M.BUCKETS do s.buckets[i] = 0 end
    t[k] = s
  end
  return s, fam
end

function M.count(name, labels, n)
  local s = slot(name, labels)
  s.value = s.value + (n or 1)
end

-- zero(name, labels): the series exists (at 0 unless counted already).
function M.zero(name, labels)
  slot(name, labels)
end

function M.observe(name, labels, value)
  local s = slot(name, labels)
  for i, le in ipairs(M.BUCKETS) do if value <= le then s.buckets[i] = s.buckets[i] + 1 end end
  s.sum = s.sum + value
  s.count = s.count + 1
end

-- value(name, labels) -> a counter's value, or a histogram's
-- {buckets =, sum =, count =}; nil when nothing was recorded there.
function M.value(name, labels)
  local fam = M.FAMILIES[name]
  local s = fam and series[name] and series[name][key_of(labels or {}, fam.labels)]
  if not s then return nil end
  if fam.type == "counter" then return s.value end
  return { buckets = s.buckets, sum = s.sum, count = s.count }
end

for name, fam in pairs(M.FAMILIES) do
  for _, labels in ipairs(fam.zero or {}) do M.zero(name, labels) end
end

local function esc(v)
  return (tostring(v):gsub("\\", "\\\\"):gsub("\n", "\\n"):gsub('"', '\\"'))
end

local function label_text(labels, names, extra)
  local parts = {}
  for _, n in ipairs(names) do parts[#parts + 1] = n .. '="' .. esc(labels[n] or "") .. '"' end
  if extra then parts[#parts + 1] = extra end
  return #parts > 0 and ("{" .. table.concat(parts, ",") .. "}") or ""
end

local function num(v)
  if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return string.format("%d", v) end
  return string.format("%.6g", v)
end
M.num = num

-- histogram_lines(out, name, labels, names, s): one histogram series; also
-- used for series kept elsewhere (the runtime's pass durations).
function M.histogram_lines(out, name, labels, names, s)
  for i, le in ipairs(M.BUCKETS) do
    out[#out + 1] = name .. "_bucket" .. label_text(labels, names, 'le="' .. tostring(le) .. '"') .. " "
      .. num(s.buckets[i])
  end
  out[#out + 1] = name .. "_bucket" .. label_text(labels, names, 'le="+Inf"') .. " " .. num(s.count)
  out[#out + 1] = name .. "_sum" .. label_text(labels, names) .. " " .. num(s.sum)
  out[#out + 1] = name .. "_count" .. label_text(labels, names) .. " " .. num(s.count)
end

function M.render(out)
  local names = {}
  for name in pairs(M.FAMILIES) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local fam = M.FAMILIES[name]
    out[#out + 1] = "# HELP " .. name .. " " .. fam.help
    out[#out + 1] = "# TYPE " .. name .. " " .. fam.type
    local keys = {}
    for k in pairs(series[name] or {}) do keys[#keys + 1] = k end
    table.sort(keys)
    for _, k in ipairs(keys) do
      local s = series[name][k]
      if fam.type == "counter" then
        out[#out + 1] = name .. label_text(s.labels, fam.labels) .. " " .. num(s.value)
      else
        M.histogram_lines(out, name, s.labels, fam.labels, s)
      end
    end
  end
  return out
end

-- epoch("2026-12-02T01:54:35.123456Z") -> seconds since the epoch: the one
-- form qtg.db hands a timestamptz in (UTC, RFC 3339); anything else is nil.
function M.epoch(ts)
  if type(ts) ~= "string" then return nil end
  local y, mo, d, h, mi, s, frac = ts:match("^(%d+)%-(%d%d)%-(%d%d)T(%d%d):(%d%d):(%d%d)(%.?%d*)Z$")
  if not y then return nil end
  y, mo, d = tonumber(y), tonumber(mo), tonumber(d)
  -- days from 1970-01-01 of a proleptic Gregorian date (civil-from-days inverse)
  if mo <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * (mo + (mo > 2 and -3 or 9)) + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  local days = era * 146097 + doe - 719468
  return days * 86400 + tonumber(h) * 3600 + tonumber(mi) * 60 + tonumber(s) + (tonumber("0" .. frac) or 0)
end

return M
