-- Templates: the shipped templates compile and load into plan versions, a
-- new version only when the content changes, and every kind of invalid
-- template is refused naming the file and the node, with nothing written.
local qtg = require "qtg"
local cjson = require "cjson"
local templates = require "qtg.templates"
local common = require "spec.lua.support.common"

local sup, s, tmp

local function write(dir, name, doc)
  local f = assert(io.open(dir .. "/" .. name, "wb"))
  f:write(type(doc) == "string" and doc or cjson.encode(doc))
  f:close()
end

local function mktemp()
  local p = io.popen("mktemp -d")
  local d = p:read("*l")
  p:close()
  return d
end

local function versions(key)
  return s:query([[SELECT pv.* FROM plan_versions pv JOIN movement_templates t ON t.id = pv.template_id
                    WHERE t.template_key = $1 ORDER BY version]], key)
end

local function base(key)
  return {
    template_key = key, name = "spec template",
    intent = { required = { "asset", "amount" } },
    nodes = {
      { key = "withdraw", kind = "action", action_type = "withdrawal", config = { network = "ETH" },
        timeout_policy = { observe_seconds = 600 } },
      { key = "status", kind = "observe", action_type = "cex_withdrawal_status",
        config = { withdrawal_id = "$ref:withdraw.withdrawal_id" } },
    },
    edges = { { from = "withdraw", to = "status" } },
  }
end

describe("templates", function()
  setup(function()
    sup = require("spec.lua.support.engine")
    s = qtg.db.acquire()
  end)
  teardown(function()
    s:release()
    if tmp then os.execute("rm -rf " .. common.quote(tmp)) end
  end)
  before_each(function() tmp = mktemp() end)

  it("loads the shipped templates, and reloading changes nothing", function()
    local dir = sup.repo_root() .. "/templates"
    local first = assert(templates.load_dir(s, dir))
    local keys = {}
    for _, r in ipairs(first) do keys[#keys + 1] = r.template_key end
    assert.same({ "cctp_bridge", "cex_withdrawal_to_wallet", "dual_venue_funding", "evm_transfer", "otc_settlement_manual" }, keys)
    local again = assert(templates.load_dir(s, dir))
    for i, r in ipairs(again) do
      assert.is_false(r.created)
      assert.equal(first[i].plan_version_id, r.plan_version_id)
    end
    -- the join template's edges are stored as written
    local edges = s:query([[
      SELECT f.node_key || '>' || t.node_key AS e FROM plan_edges e
        JOIN plan_nodes f ON f.id = e.from_node_id JOIN plan_nodes t ON t.id = e.to_node_id
       WHERE e.plan_version_id = $1 ORDER BY 1]], again[3].plan_version_id)
    local list = {}
    for _, r in ipairs(edges) do list[#list + 1] = r.e end
    assert.same({ "primary_status>destination_receive", "primary_withdraw>primary_status",
      "secondary_status>destination_receive", "secondary_withdraw>secondary_status" }, list)
    local manual = s:query([[SELECT count(*)::int AS n FROM plan_nodes WHERE plan_version_id = $1
                              AND action_type LIKE 'manual\_%']], again[5].plan_version_id)[1].n
    assert.equal(1, manual)
  end)

  it("makes a new version only when the content changes", function()
    local key = "spec_tpl_" .. sup.uid("v"):gsub("-", "_")
    local doc = base(key)
    write(tmp, "t.json", doc)
    local r1 = assert(templates.load_dir(s, tmp))[1]
    assert.is_true(r1.created)
    assert.equal(1, r1.version)
    local r2 = assert(templates.load_dir(s, tmp))[1]
    assert.is_false(r2.created)
    -- the same content written differently (key order, spacing) is the same content
    write(tmp, "t.json", "  " .. cjson.encode(doc) .. "\n")
    assert.is_false(assert(templates.load_dir(s, tmp))[1].created)
    -- timeout_policy only: a new version, same graph and compiled plan hashes
    doc.nodes[1].timeout_policy.observe_seconds = 900
    write(tmp, "t.json", doc)
    local r3 = assert(templates.load_dir(s, tmp))[1]
    assert.is_true(r3.created)
    assert.equal(2, r3.version)
    -- a config change: a new compiled plan hash, the same graph hash
    doc.nodes[1].config.network = "ARB"
    write(tmp, "t.json", doc)
    assert.equal(3, assert(templates.load_dir(s, tmp))[1].version)
    local v = versions(key)
    assert.equal(3, #v)
    assert.equal(v[1].compiled_plan_hash, v[2].compiled_plan_hash)
    assert.are_not.equal(v[2].compiled_plan_hash, v[3].compiled_plan_hash)
    assert.equal(v[1].graph_hash, v[3].graph_hash)
    assert.are_not.equal(v[1].content_hash, v[2].content_hash)
    -- a new request uses the latest version
    sup.park_others(s)
    local req = sup.create(s, key)
    assert.equal(v[3].id, req.plan_version_id)
    assert.equal(v[3].compiled_plan_hash, req.compiled_plan_hash)
  end)

  local invalid = {
    { "unknown node in an edge", function(d) d.edges[1].to = "nowhere" end,
      'edge #1: unknown node "nowhere"' },
    { "a cycle", function(d) d.edges[2] = { from = "status", to = "withdraw" } end,
      "the edges form a cycle" },
    { "an unknown action type", function(d) d.nodes[2].action_type = "teleport" end,
      'node status: unknown action type "teleport"' },
    { "an unknown executor", function(d) d.nodes[1].executor = "carrier_pigeon" end,
      'node withdraw: unknown executor "carrier_pigeon"' },
    { "a malformed $ref", function(d) d.nodes[2].config.withdrawal_id = "$ref:withdraw" end,
      "node status: config.withdrawal_id: malformed $ref" },
    { "a $ref to an unknown node", function(d) d.nodes[2].config.withdrawal_id = "$ref:ghost.id" end,
      'node status: config.withdrawal_id: $ref:ghost.id refers to unknown node "ghost"' },
    { "a $ref to a node that runs later", function(d) d.nodes[1].config.x = "$ref:status.tx_hash" end,
      'node withdraw: config.x: $ref:status.tx_hash refers to node "status", which does not run before' },
    { "a $ref below the top level", function(d) d.nodes[2].config.deep = { id = "$ref:withdraw.id" } end,
      "node status: config.deep.id: $ref:withdraw.id is below the top level" },
    { "a missing node field", function(d) d.nodes[1].kind = nil end,
      'node withdraw: missing field "kind"' },
    { "a missing node key", function(d) d.nodes[2].key = nil end,
      'node #2: missing field "key"' },
    { "a missing name", function(d) d.name = nil end, 'missing field "name"' },
    { "no nodes", function(d) d.nodes = {}; d.edges = {} end, 'missing field "nodes"' },
    { "a duplicate node key", function(d) d.nodes[2].key = "withdraw"; d.edges = {} end,
      "node withdraw: duplicate node key" },
    { "an unknown field", function(d) d.nodes[1].colour = "red" end,
      'node withdraw: unknown field "colour"' },
    { "a bad sim block", function(d) d.nodes[1].config.sim = { observes = "many" } end,
      "node withdraw: config: sim.observes must be a number" },
    { "a bad timeout policy", function(d) d.nodes[1].timeout_policy = { observe_seconds = -1 } end,
      "node withdraw: timeout_policy.observe_seconds must be a positive number" },
    { "an unknown intent type", function(d) d.intent.types = { amount = "money" } end,
      'intent: field "amount" has unknown type "money"' },
    -- the intent's field names are what approvers read: keys only
    { "a required intent field in look-alike letters", function(d) d.intent.required = { "asset", "\208\176mount" } end,
      'intent: required field "\208\176mount" must match [a-z][a-z0-9_]*' },
    { "a typed intent field that is not a key", function(d) d.intent.types = { Amount = "decimal" } end,
      'intent: typed field "Amount" must match [a-z][a-z0-9_]*' },
    { "a bound an intent type does not take", function(d)
        d.intent.types = { amount = { type = "decimal", min = 1 } } end,
      'intent: field "amount": "decimal" takes no "min"' },
    { "a fractional decimal scale", function(d)
        d.intent.types = { amount = { type = "decimal", scale = 1.5 } } end,
      'intent: field "amount": "scale" must be an integer' },
    { "integer bounds the wrong way round", function(d)
        d.intent.types = { n = { type = "integer", min = 5, max = 1 } } end,
      'intent: field "n": "min" is above "max"' },
    { "a negative max_amount", function(d) d.risk_controls = { max_amount = "-5" } end,
      '"risk_controls.max_amount" must be a non-negative decimal string' },
    { "a max_amount as a JSON float", function(d) d.risk_controls = { max_amount = 100.5 } end,
      '"risk_controls.max_amount" must be a non-negative decimal string' },
    { "a 400-digit min_amount", function(d) d.risk_controls = { min_amount = string.rep("9", 400) } end,
      '"risk_controls.min_amount" must be a non-negative decimal string' },
    { "a fee in wei with decimals", function(d) d.risk_controls = { max_fee_per_gas_wei = "1.5" } end,
      '"risk_controls.max_fee_per_gas_wei" must be a non-negative integer in a decimal string' },
    { "a max_fee_usd of 1e3", function(d) d.risk_controls = { max_fee_usd = "1e3" } end,
      '"risk_controls.max_fee_usd" must be a non-negative decimal string' },
    { "a negative gas_limit", function(d) d.risk_controls = { gas_limit = -1 } end,
      '"risk_controls.gas_limit" must be a non-negative integer' },
    { "a fractional max_pending_nonces", function(d) d.risk_controls = { max_pending_nonces = 2.5 } end,
      '"risk_controls.max_pending_nonces" must be a non-negative integer' },
    { "more nodes than the limit", function(d)
        d.nodes, d.edges = {}, {}
        for i = 1, templates.MAX_NODES + 1 do
          d.nodes[i] = { key = "n" .. i, kind = "manual", action_type = "manual_confirmation" }
        end
      end, (templates.MAX_NODES + 1) .. " nodes: a template has at most " .. templates.MAX_NODES },
  }
  for _, case in ipairs(invalid) do
    it("refuses " .. case[1] .. ", naming the file and the node, and writes nothing", function()
      local key = "spec_bad_" .. sup.uid("t"):gsub("-", "_")
      local good = base(key .. "_ok")
      write(tmp, "a_good.json", good)
      local doc = base(key)
      case[2](doc)
      write(tmp, "b_bad.json", doc)
      local res, errors = templates.load_dir(s, tmp)
      assert.is_nil(res)
      local all = table.concat(errors, "\n")
      assert.matches(tmp .. "/b_bad.json: " .. case[3], all, 1, true)
      assert.equal(0, #versions(key))
      assert.equal(0, #versions(key .. "_ok")) -- all or nothing
    end)
  end

  it("refuses a file that is not JSON and a duplicate template_key", function()
    write(tmp, "a.json", "{ not json")
    local _, errors = templates.load_dir(s, tmp)
    assert.matches("a.json: not valid JSON", errors[1], 1, true)
    os.remove(tmp .. "/a.json")
    write(tmp, "a.json", base("spec_dup"))
    write(tmp, "b.json", base("spec_dup"))
    _, errors = templates.load_dir(s, tmp)
    assert.matches('b.json: template_key "spec_dup" is also defined in', errors[1], 1, true)
  end)

  it("refuses a duplicate key anywhere in the file, also spelled with an escape", function()
    local key = "spec_dupkey_" .. sup.uid("t"):gsub("-", "_")
    local text = cjson.encode(base(key))
    -- the same key twice at the top, and inside a node's config
    write(tmp, "a.json", text:gsub('^{', '{"name":"shown to the reviewer",', 1))
    local _, errors = templates.load_dir(s, tmp)
    assert.matches('a.json: not valid JSON: duplicate key "name" in $', errors[1], 1, true)
    write(tmp, "a.json", (text:gsub('"network":"ETH"', '"network":"ETH","netw\\u006frk":"ARB"', 1)))
    _, errors = templates.load_dir(s, tmp)
    assert.matches('duplicate key "network" in $.nodes[].config', errors[1], 1, true)
    assert.equal(0, #versions(key))
  end)

  it("compiles a template at the node limit, a chain with $refs, in linear passes", function()
    local d = base("spec_long_chain")
    d.nodes, d.edges = {}, {}
    for i = 1, templates.MAX_NODES do
      d.nodes[i] = i == 1 and { key = "n1", kind = "action", action_type = "withdrawal", config = { network = "ETH" } }
        or { key = "n" .. i, kind = "observe", action_type = "cex_withdrawal_status",
             config = { withdrawal_id = "$ref:n" .. (i - 1) .. ".x" } }
      if i > 1 then d.edges[#d.edges + 1] = { from = "n" .. (i - 1), to = "n" .. i } end
    end
    local c, errs = templates.validate_and_compile(d, "long.json")
    assert.is_nil(errs)
    assert.equal(templates.MAX_NODES, #c.nodes)
  end)

  it("qtgd templates load exits 1 with the errors on stderr, 0 when it loads", function()
    local bad = base("spec_cli_bad")
    bad.edges[1].from = "nowhere"
    write(tmp, "bad.json", bad)
    local function run()
      local p = io.popen(string.format("MG_CONSOLE_ENABLED=false %s templates load %s 2>&1; echo \"rc=$?\"",
        common.quote(sup.qtgd_bin()), common.quote(tmp)))
      local out = p:read("*a")
      p:close()
      return out
    end
    local out = run()
    assert.matches("rc=1", out, 1, true)
    assert.matches("bad.json: edge #1: unknown node \"nowhere\"", out, 1, true)
    write(tmp, "bad.json", base("spec_cli_good"))
    out = run()
    assert.matches("rc=0", out, 1, true)
    assert.matches("spec_cli_good: version", out, 1, true)
  end)
end)
