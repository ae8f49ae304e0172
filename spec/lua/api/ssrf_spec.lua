-- ssrf_spec: qtg.api.ssrf.address_refused on every form of address the
-- resolver (inet_ntop) or a client may write: IPv4 ranges, IPv6 ranges,
-- and each IPv6 form embedding an IPv4 address, judged as that address.
-- NAT64 as inet_ntop writes it (64:ff9b::a00:1, hex) was never matched
-- before (only the dotted form was), nor were ::ffff:0:a.b.c.d, 6to4,
-- fec0::/10, 198.18.0.0/15 and 192.0.0.0/24.
local ssrf = require "qtg.api.ssrf"

local function refused(addr) return ssrf.address_refused(addr) end

describe("qtg.api.ssrf.address_refused", function()
  it("refuses the IPv4 ranges that are not public", function()
    for _, a in ipairs({ "0.0.0.0", "0.1.2.3", "127.0.0.1", "127.255.255.254", "10.0.0.1", "172.16.0.1",
                         "172.31.255.255", "192.168.1.1", "169.254.169.254", "100.64.0.1", "100.127.255.255",
                         "192.0.0.1", "192.0.0.170", "198.18.0.1", "198.19.255.255", "224.0.0.1",
                         "239.255.255.250", "240.0.0.1", "255.255.255.255" }) do
      assert.truthy(refused(a), a)
    end
    for _, a in ipairs({ "8.8.8.8", "1.1.1.1", "172.15.255.255", "172.32.0.1", "100.63.255.255", "100.128.0.1",
                         "192.0.1.1", "198.17.255.255", "198.20.0.1", "169.253.0.1", "223.255.255.255" }) do
      assert.is_nil(refused(a), a)
    end
    assert.truthy(refused("not-an-address"))
    assert.truthy(refused("010.0.0.1"))
  end)

  it("refuses the IPv6 ranges that are not public", function()
    for _, a in ipairs({ "::", "::1", "0:0:0:0:0:0:0:1", "fc00::1", "fd12:3456::1", "fe80::1", "fe80::1%eth0",
                         "febf::1", "fec0::1", "feff::1", "ff02::1", "FF05::2", "64:ff9b:1::1",
                         "64:ff9b:1:ffff::8.8.8.8" }) do
      assert.truthy(refused(a), a)
    end
    for _, a in ipairs({ "2001:4860:4860::8888", "2606:4700::1111", "2a00:1450::1", "64:ff9b::808:808",
                         "64:ff9b::8.8.8.8", "2002:808:808::1", "::ffff:8.8.8.8", "::ffff:0:8.8.8.8" }) do
      assert.is_nil(refused(a), a)
    end
  end)

  it("judges the IPv4 address an IPv6 address embeds, in every spelling", function()
    local cases = {
      -- mapped ::ffff:0:0/96
      { "::ffff:127.0.0.1", "loopback" }, { "::ffff:7f00:1", "loopback" }, { "::FFFF:a00:1", "private" },
      { "0:0:0:0:0:ffff:a9fe:a9fe", "link%-local" }, { "::ffff:169.254.169.254", "link%-local" },
      -- SIIT ::ffff:0:0:0/96
      { "::ffff:0:127.0.0.1", "loopback" }, { "::ffff:0:a00:1", "private" }, { "::ffff:0:c0a8:101", "private" },
      -- compatible ::/96
      { "::127.0.0.1", "loopback" }, { "::a00:1", "private" },
      -- NAT64 64:ff9b::/96, as inet_ntop writes it (hex) and dotted
      { "64:ff9b::a00:1", "private" }, { "64:ff9b::7f00:1", "loopback" }, { "64:ff9b::a9fe:a9fe", "link%-local" },
      { "64:ff9b::10.0.0.1", "private" }, { "64:ff9b:0:0:0:0:c612:1", "benchmarking" },
      -- local-use NAT64 64:ff9b:1::/48: refused whole
      { "64:ff9b:1::a00:1", "local%-use NAT64" },
      -- 6to4 2002::/16 (the IPv4 address in bits 16-47)
      { "2002:7f00:1::", "loopback" }, { "2002:a00:1::1", "private" }, { "2002:a9fe:a9fe::", "link%-local" },
      { "2002:c000:1::", "IETF" },
      -- Teredo 2001::/32 (the client, inverted, in the last 32 bits)
      { "2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback" },   -- client 127.0.0.1
      { "2001::f5ff:fffe", "private" },                           -- client 10.0.0.1
    }
    for _, c in ipairs(cases) do
      local why = refused(c[1])
      assert.truthy(why, c[1])
      assert.truthy(why:match(c[2]), c[1] .. ": " .. tostring(why))
    end
    assert.is_nil(refused("2001::f7f7:f7f7"))                       -- Teredo client 8.8.8.8
  end)

  it("parses IPv6 text into 16 bytes, and refuses what is not an address", function()
    assert.same({ 0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 1 }, ssrf.parse_v6("64:ff9b::a00:1"))
    assert.same(ssrf.parse_v6("64:ff9b::a00:1"), ssrf.parse_v6("64:FF9B:0000:0:0:0:10.0.0.1"))
    assert.same({ 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1 }, ssrf.parse_v6("::1"))
    assert.same({ 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }, ssrf.parse_v6("1::"))
    for _, bad in ipairs({ ":::", "1:2:3:4:5:6:7:8:9", "1::2::3", "12345::", "::g", "1:2:3:4:5:6:7", "::1.2.3",
                           "::256.0.0.1", "1.2.3.4", "::01.2.3.4", "", ":", "1:2:3:4:5:6:7:8::" }) do
      assert.is_nil(ssrf.parse_v6(bad), bad)
      assert.truthy(refused(bad:find(":", 1, true) and bad or (bad .. ":x")), bad)
    end
  end)
end)

describe("qtg.api.ssrf.pin", function()
  it("checks every address a name resolves to and pins at most what qtg.http takes", function()
    local qtg = require "qtg"
    local real = qtg.api_net.resolve
    local many = {}
    for i = 1, qtg.http.MAX_PIN + 4 do many[i] = "198.51.100." .. i end
    local ok, err = pcall(function()
      -- a stand-in resolver: a name of more addresses than a pin takes
      qtg.api_net.resolve = function() return many end
      local addrs = assert(ssrf.pin("https://many.example.org/hook"))
      assert.equals(qtg.http.MAX_PIN, #addrs)
      for i = 1, #addrs do assert.equals(many[i], addrs[i]) end
      -- qtg.http.request takes the pin (it refuses one longer)
      local resp, e = qtg.http.request{ url = "http://many.example.org:9/", pin = addrs, timeout = 1 }
      assert.truthy(resp or e.kind ~= "usage", e and e.message)
      -- one refused address anywhere in the answer refuses the name
      many[#many] = "10.0.0.1"
      local none, why = ssrf.pin("https://many.example.org/hook")
      assert.is_nil(none)
      assert.truthy(why:find("10.0.0.1", 1, true), why)
    end)
    qtg.api_net.resolve = real
    assert(ok, err)
  end)
end)
