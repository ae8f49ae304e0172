-- qtg.redact (lua/qtg/redact.lua): what leaves through the API keeps a
-- URL's endpoint and no key, whatever the text around it.
local redact = require "qtg.redact"

describe("qtg.redact", function()
  it("cuts each URL in a text to its endpoint and masks secret pairs and bearer tokens", function()
    local cases = {
      { "POST https://mainnet.example/v3/KEY: timeout", "POST https://mainnet.example/... timeout" },
      { "connect to http://user:pw@10.0.0.1:8545 refused", "connect to http://10.0.0.1:8545/... refused" },
      { "GET https://api.venue.example/v1/balances?api_key=abc&x=1 failed: 401",
        "GET https://api.venue.example/... failed: 401" },
      { "(see https://a.example/p)", "(see https://a.example/...)" },
      { "http://127.0.0.1:8545 answered chain 1", "http://127.0.0.1:8545 answered chain 1" },
      { "postgresql://qtg:pw@db/qtg is down", "postgresql://db/... is down" },
      { "host=db password=hunter2 user=qtg", "host=db password=*** user=qtg" },
      { "refused: API_KEY: abc123, Token=xyz", "refused: API_KEY: ***, Token=***" },
      { "Authorization: Bearer abc.def-ghi= rejected", "Authorization: Bearer *** rejected" },
      -- a key's name and an idempotency key are not secrets
      { "unknown key: hot-1", "unknown key: hot-1" },
      { "idempotency_key=abc reused", "idempotency_key=abc reused" },
      { "no URL at all", "no URL at all" },
    }
    for _, c in ipairs(cases) do assert.equals(c[2], redact.text(c[1]), c[1]) end
    assert.is_nil(redact.text(nil))
  end)

  it("gives an endpoint as scheme://host[:port] and a database URL without its password", function()
    assert.equals("https://mainnet.example", redact.endpoint("https://user:secret@mainnet.example/v3/KEY"))
    assert.equals("http://127.0.0.1:8545", redact.endpoint("http://127.0.0.1:8545"))
    assert.equals("?", redact.endpoint("ftp://x/KEY"))
    assert.equals("postgresql://qtg:***@db.example:5432/qtg",
      redact.database_url("postgresql://qtg:s3cret@db.example:5432/qtg"))
  end)

  it("never lets a URL's path through, in any text around it", function()
    -- random text around a URL whose path is a marker
    math.randomseed(20261205)
    local alphabet = " \t\n:/?#@&=\"'()<>,;abcXYZ019%.-_~"
    local function noise(n)
      local t = {}
      for i = 1, n do
        local k = math.random(#alphabet)
        t[i] = alphabet:sub(k, k)
      end
      return table.concat(t)
    end
    for _ = 1, 2000 do
      local s = noise(math.random(0, 12)) .. "https://h.example/SECRETPATH" .. noise(math.random(0, 12))
      local out = redact.text(s)
      assert.is_nil(out:find("SECRETPATH", 1, true), s .. " -> " .. out)
    end
  end)
end)
