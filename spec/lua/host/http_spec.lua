-- qtg.http.request's answer (src/lua_http.c, src/qtg_http_call.c): a
-- response's headers as a peer can shape them.  Every peer qtg calls (a
-- callback receiver, a venue, an EVM RPC endpoint) can answer with many
-- header lines; the answer is read inside the loop, so reading it must
-- stay cheap whatever they hold.  The peers are tools/fake-receiver
-- processes on 127.0.0.1.
local qtg = require "qtg"

local common = require "spec.lua.support.common"

describe("qtg.http.request's headers", function()
  local dir, receivers = nil, {}

  setup(function() dir = common.tmpdir("qtg-http") end)
  teardown(function()
    for _, h in ipairs(receivers) do common.stop(h, 5) end
    os.execute("rm -rf " .. common.quote(dir))
  end)

  local function receiver(name, args)
    local h = common.start_receiver(dir, name, { mode = "headers", args = args })
    receivers[#receivers + 1] = h
    return h
  end

  local function post(h)
    return qtg.http.request{ method = "POST", url = h.url, body = "{}", timeout = 30 }
  end

  -- (the receiver adds Content-Type and Content-Length: 256 lines in all)
  it("joins the values of a repeated header with ', ', in the order they came", function()
    local h = receiver("repeats", { "--header-lines", "254" })
    local resp, err = post(h)
    assert.is_nil(err)
    assert.equals(200, resp.status)
    local want = {}
    for k = 1, 254 do want[k] = "v" .. k end
    assert.equals(table.concat(want, ", "), resp.headers["x-rep"])
    assert.equals("application/json", resp.headers["content-type"])
    assert.equals("{}", resp.body)
  end)

  it("joins each repeated name's values apart when names take turns", function()
    local h = receiver("turns", { "--header-lines", "7", "--header-name", "X-Rep,X-Other,X-Rep,Set-Cookie" })
    local resp = assert(post(h))
    assert.same({ "v1, v3, v5, v7", "v2, v6", "v4" },
      { resp.headers["x-rep"], resp.headers["x-other"], resp.headers["set-cookie"] })
  end)

  it("refuses a response of more than 256 header lines as a bad response", function()
    local h = receiver("too-many", { "--header-lines", "255" })
    local resp, err = post(h)
    assert.is_nil(resp)
    assert.equals("http", err.kind)
    assert.truthy(err.message:find("bad response: more than 256 header lines", 1, true), err.message)
  end)

  -- The attack: 50,000 one-letter lines fit under the 256 KiB header
  -- limit.  Joined as each arrived, the values were copied over and over
  -- (a third of a second of held loop for one such answer, 22 s for a
  -- callback batch's 25); now the 257th line refuses the response.
  it("refuses 50,000 repeated one-letter lines under the header byte limit, and answers the next call", function()
    local h = receiver("flood", { "--header-lines", "50000", "--header-name", "a", "--header-value", "x" })
    local resp, err = post(h)
    assert.is_nil(resp)
    assert.truthy(err.message:find("more than 256 header lines", 1, true), err.message)
    local ok = receiver("after", { "--header-lines", "3" })
    local again = assert(post(ok))
    assert.equals("v1, v2, v3", again.headers["x-rep"])
  end)
end)
