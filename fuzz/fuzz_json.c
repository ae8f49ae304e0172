/* fuzz_json.c -- the `json` target: JSON at the process's boundary.
 *
 * Input byte 0 picks the part, the rest is the text:
 *   2 mod 4  syntax: qtg.canon_json.syntax_error (the strict check `qtgd
 *         audit verify --against` makes of every export line) never raises,
 *         names a byte within the text when it refuses, and every text it
 *         passes a strict cjson (no hex, NaN or Infinity; depth past the
 *         input's) reads too: it passes nothing that is not JSON.
 *   other even  decode: cjson.decode (what qtg.db does to every json/jsonb value
 *         and what policies do to provider and receiver bodies) of the
 *         bytes, then qtg.canon_json on the result, as the engine does before
 *         it writes: a value canon_json encodes must decode to the same
 *         canonical text again, and canon_json.storable never raises.
 *   odd   log: the text split at 0x1f into a message and field pairs, written
 *         by the JSON-lines logger (qtg_log_fields) to a memory file: the
 *         output is exactly one line of valid UTF-8, it decodes as one JSON
 *         object, and when it was not cut to the line limit its msg and
 *         fields read back equal to the input made valid UTF-8
 *         (canon_json.text_repaired: U+FFFD for each byte that starts no
 *         character).  qtg_json_quote is also run into buffers of every
 *         small size: it never writes past the capacity and always returns
 *         the full length.
 * The Lua state is plain LuaJIT with the packaged lua/ and Debian's cjson,
 * JIT off as in the host. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>

#include "qtg_fuzz.h"
#include "qtg_log.h"

static lua_State *fuzz_L;
static int fuzz_decode_ref = LUA_NOREF, fuzz_log_ref = LUA_NOREF, fuzz_syntax_ref = LUA_NOREF;

static const char fuzz_json_lua[] =
    "local cjson = require 'cjson'\n"
    "local canon = require 'qtg.canon_json'\n"
    "local function decode_check(text)\n"
    "  local ok, v = pcall(cjson.decode, text)\n"
    "  if not ok then return nil end\n"
    "  local kok, dup, where = pcall(canon.duplicate_key, text)\n"
    "  if not kok then return 'canon.duplicate_key raised: ' .. tostring(dup) end\n"
    "  if dup ~= nil and (type(dup) ~= 'string' or type(where) ~= 'string') then\n"
    "    return 'canon.duplicate_key answered a non-string'\n"
    "  end\n"
    "  local sok, serr = pcall(canon.storable, v)\n"
    "  if not sok then return 'canon.storable raised: ' .. tostring(serr) end\n"
    "  local eok, enc = pcall(canon.encode, v)\n"
    "  if not eok then\n"
    "    if type(enc) ~= 'string' then return 'canon.encode raised a non-string' end\n"
    "    return nil\n"
    "  end\n"
    "  local dok, v2 = pcall(cjson.decode, enc)\n"
    "  if not dok then return 'canonical text does not decode: ' .. enc:sub(1, 200) end\n"
    "  if canon.encode(v2) ~= enc then return 'canonical text is not stable: ' .. enc:sub(1, 200) end\n"
    "  if canon.duplicate_key(enc) ~= nil then return 'a duplicate key in canonical text: ' .. enc:sub(1, 200) end\n"
    "  return nil\n"
    "end\n"
    "local function log_check(line, msg, fields, cut)\n"
    "  local n = select(2, line:gsub('\\n', ''))\n"
    "  if n ~= 1 or line:sub(-2) ~= '}\\n' then return 'not exactly one line ending in }' end\n"
    "  if not canon.text_ok(line) then return 'not valid UTF-8: ' .. line:sub(1, 300) end\n"
    "  local ok, t = pcall(cjson.decode, line)\n"
    "  if not ok or type(t) ~= 'table' then return 'not one JSON object: ' .. tostring(t) .. ': ' .. line:sub(1, 300) end\n"
    "  if type(t.time) ~= 'string' or type(t.level) ~= 'string' or type(t.msg) ~= 'string' then\n"
    "    return 'time, level or msg missing'\n"
    "  end\n"
    "  if cut then return nil end\n"
    "  local fix = canon.text_repaired\n"
    "  local want = { msg = fix(msg) }  -- a repeated name: the last one wins\n"
    "  for i = 1, #fields, 2 do want[fix(fields[i])] = fix(fields[i + 1]) end\n"
    "  for k, v in pairs(want) do\n"
    "    if k ~= 'time' and k ~= 'level' and t[k] ~= v then return 'field ' .. k .. ' changed' end\n"
    "  end\n"
    "  return nil\n"
    "end\n"
    "local strict = cjson.new()\n"
    "strict.decode_invalid_numbers(false)\n"
    "strict.decode_max_depth(100000)\n"
    "local function syntax_check(text)\n"
    "  local ok, why = pcall(canon.syntax_error, text)\n"
    "  if not ok then return 'syntax_error raised: ' .. tostring(why) end\n"
    "  if why ~= nil then\n"
    "    local at = type(why) == 'string' and tonumber(why:match('^byte (%d+): .'))\n"
    "    if not at or at < 1 or at > #text + 1 then return 'not byte N within the text: ' .. tostring(why) end\n"
    "    return nil\n"
    "  end\n"
    "  local dok, err = pcall(strict.decode, text)\n"
    "  if not dok then return 'passed a text strict cjson refuses: ' .. tostring(err) end\n"
    "  return nil\n"
    "end\n"
    "return decode_check, log_check, syntax_check\n";

static void fuzz_json_close(void) {
  if (fuzz_L) lua_close(fuzz_L);
  fuzz_L = NULL;
}

static lua_State *fuzz_json_state(void) {
  if (fuzz_L) return fuzz_L;
  lua_State *L = luaL_newstate();
  if (!L) abort();
  luaL_openlibs(L);
  luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
  lua_getglobal(L, "package");
  lua_pushfstring(L, "%s/lua/?.lua;/usr/share/lua/5.1/?.lua", qtg_fuzz_root());
  lua_setfield(L, -2, "path");
  lua_pushliteral(L, QTG_LUA_CMODULE_DIR "/?.so");   /* CMakeLists.txt: the build's multiarch dir */
  lua_setfield(L, -2, "cpath");
  lua_pop(L, 1);
  if (luaL_loadbuffer(L, fuzz_json_lua, sizeof fuzz_json_lua - 1, "=fuzz_json") != 0 ||
      lua_pcall(L, 0, 3, 0) != 0) {
    fprintf(stderr, "fuzz json: %s\n", lua_tostring(L, -1));
    abort();
  }
  fuzz_syntax_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  fuzz_log_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  fuzz_decode_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  fuzz_L = L;
  atexit(fuzz_json_close);
  return L;
}

/* Runs the check *ref names (set when the state is made, so read after it)
 * on the text: 0, or -1 with what failed. */
static int fuzz_json_check(const int *ref, const char *what, const char *text, size_t len) {
  lua_State *L = fuzz_json_state();
  lua_rawgeti(L, LUA_REGISTRYINDEX, *ref);
  lua_pushlstring(L, text, len);
  if (lua_pcall(L, 1, 1, 0) != 0) {
    fprintf(stderr, "json %s: the check raised: %s\n", what, lua_tostring(L, -1));
    lua_pop(L, 1);
    return -1;
  }
  int rc = 0;
  if (!lua_isnil(L, -1)) {
    fprintf(stderr, "json %s: %s\n", what, lua_tostring(L, -1));
    rc = -1;
  }
  lua_pop(L, 1);
  return rc;
}

/* qtg_json_quote into every small capacity: bounded writes, full length. */
static int fuzz_json_quote_caps(const char *s, size_t len) {
  size_t full = qtg_json_quote(NULL, 0, s, len);
  size_t top = full < 64 ? full + 1 : 64;
  for (size_t cap = 0; cap <= top; cap++) {
    char *buf = malloc(cap ? cap : 1);
    if (!buf) abort();
    if (qtg_json_quote(buf, cap, s, len) != full) {
      fprintf(stderr, "json quote: the length depends on the capacity\n");
      free(buf);
      return -1;
    }
    free(buf);
  }
  return 0;
}

static int fuzz_json_log(const char *text, size_t len) {
  enum { MAXF = 16 };
  char *parts[1 + 2 * MAXF];
  int n = 0;
  const char *p = text, *end = text + len;
  while (n < 1 + 2 * MAXF) {
    const char *sep = memchr(p, 0x1f, (size_t)(end - p));
    const char *pe = sep ? sep : end;
    parts[n] = strndup(p, (size_t)(pe - p)); /* C strings: cut at a NUL */
    if (!parts[n]) abort();
    n++;
    if (!sep) break;
    p = sep + 1;
  }
  int nf = (n - 1) / 2;
  const char *fields[2 * MAXF + 1];
  for (int i = 0; i < 2 * nf; i++) fields[i] = parts[1 + i];
  fields[2 * nf] = NULL;

  int rc = fuzz_json_quote_caps(parts[0], strlen(parts[0]));

  int mfd = memfd_create("qtg-fuzz-log", 0);
  int saved = dup(STDERR_FILENO);
  if (mfd < 0 || saved < 0) abort();
  qtg_log_level old = qtg_log_get_level();
  qtg_log_set_level(QTG_LOG_DEBUG);
  dup2(mfd, STDERR_FILENO);
  qtg_log_fields(QTG_LOG_WARN, parts[0], fields);
  dup2(saved, STDERR_FILENO);
  close(saved);
  qtg_log_set_level(old);
  off_t size = lseek(mfd, 0, SEEK_END);
  char *line = malloc((size_t)size + 1);
  if (!line) abort();
  if (pread(mfd, line, (size_t)size, 0) != size) abort();
  close(mfd);

  lua_State *L = fuzz_json_state();
  lua_rawgeti(L, LUA_REGISTRYINDEX, fuzz_log_ref);
  lua_pushlstring(L, line, (size_t)size);
  lua_pushstring(L, parts[0]);
  lua_createtable(L, 2 * nf, 0);
  for (int i = 0; i < 2 * nf; i++) {
    lua_pushstring(L, fields[i]);
    lua_rawseti(L, -2, i + 1);
  }
  /* the line's full length, uncut: near QTG_LOG_LINE_MAX (8192) it may be cut */
  size_t full = 80 + qtg_json_quote(NULL, 0, parts[0], strlen(parts[0]));
  for (int i = 0; i < 2 * nf; i++) full += 1 + qtg_json_quote(NULL, 0, fields[i], strlen(fields[i]));
  lua_pushboolean(L, full >= 8000);
  if (lua_pcall(L, 4, 1, 0) != 0 || !lua_isnil(L, -1)) {
    fprintf(stderr, "json log: %s\n", lua_tostring(L, -1));
    rc = -1;
  }
  lua_pop(L, 1);
  free(line);
  for (int i = 0; i < n; i++) free(parts[i]);
  return rc;
}

int qtg_fuzz_json(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  const char *text = (const char *)data + 1;
  if (data[0] % 4 == 2) return fuzz_json_check(&fuzz_syntax_ref, "syntax", text, size - 1);
  if (data[0] % 2 == 0) return fuzz_json_check(&fuzz_decode_ref, "decode", text, size - 1);
  return fuzz_json_log(text, size - 1);
}
