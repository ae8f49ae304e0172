/* lua_crypto.c -- qtg.crypto: hashes, MACs, randomness, hex and a
 * constant-time compare for policy code.
 *
 * hmac_callback signs with the callback key held by C (qtg_keys.c); the
 * key itself is never reachable from Lua.  hmac_sha256_hex takes its key
 * from the caller and exists for receivers and tests.
 *
 * Malformed input to a pure conversion (unhex of odd-length or non-hex
 * text) raises {kind="invalid"}; a missing host-held key is an operational
 * condition and comes back as nil, err.
 */
#include <stdlib.h>
#include <string.h>

#include "qtg_crypto.h"
#include "qtg_host.h"
#include "qtg_keys.h"
#include "qtg_lua_path.h"

enum { QTG_LUA_RANDOM_MAX = 1 << 20 };

/* Scratch space is a userdata, so a memory error cannot leak it. */
static void qtg_lua_push_hex(lua_State *L, const uint8_t *bytes, size_t len) {
  char *out = lua_newuserdata(L, 2 * len + 1);
  qtg_hex_encode(bytes, len, out);
  lua_pushlstring(L, out, 2 * len);
  lua_remove(L, -2);
}

static int qtg_lua_sha256(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  uint8_t out[QTG_SHA256_LEN];
  if (qtg_sha256(s, len, out) != 0) return luaL_error(L, "qtg.crypto.sha256 failed");
  lua_pushlstring(L, (const char *)out, sizeof out);
  return 1;
}

static int qtg_lua_sha256_hex(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  uint8_t out[QTG_SHA256_LEN];
  if (qtg_sha256(s, len, out) != 0) return luaL_error(L, "qtg.crypto.sha256 failed");
  qtg_lua_push_hex(L, out, sizeof out);
  return 1;
}

static int qtg_lua_keccak256(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  uint8_t out[QTG_KECCAK256_LEN];
  qtg_keccak256(s, len, out);
  lua_pushlstring(L, (const char *)out, sizeof out);
  return 1;
}

static int qtg_lua_keccak256_hex(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  uint8_t out[QTG_KECCAK256_LEN];
  qtg_keccak256(s, len, out);
  qtg_lua_push_hex(L, out, sizeof out);
  return 1;
}

static int qtg_lua_hmac_sha256_hex(lua_State *L) {
  size_t klen, mlen;
  const char *key = luaL_checklstring(L, 1, &klen);
  const char *msg = luaL_checklstring(L, 2, &mlen);
  uint8_t out[QTG_SHA256_LEN];
  if (qtg_hmac_sha256(key, klen, msg, mlen, out) != 0)
    return luaL_error(L, "qtg.crypto.hmac_sha256_hex failed");
  qtg_lua_push_hex(L, out, sizeof out);
  return 1;
}

static int qtg_lua_hmac_callback(lua_State *L) {
  size_t mlen;
  const char *msg = luaL_checklstring(L, 1, &mlen);
  qtg_host *h = qtg_host_from_lua(L);
  const qtg_keys *k = h != NULL ? h->keys : NULL;
  uint8_t out[QTG_SHA256_LEN];
  if (!qtg_keys_has_callback_key(k)) {
    lua_pushnil(L);
    qtg_push_error(L, "no_key",
                   "no callback key is configured (set MG_CALLBACK_KEY_FILE)");
    return 2;
  }
  if (qtg_keys_callback_hmac(k, msg, mlen, out) != 0)
    return luaL_error(L, "qtg.crypto.hmac_callback failed");
  qtg_lua_push_hex(L, out, sizeof out);
  return 1;
}

/* qtg.crypto.keys_error(): why a key file did not load under `qtgd check`
 * (which reports it), or nil. */
static int qtg_lua_keys_error(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  if (h == NULL || h->settings == NULL || h->settings->keys_error[0] == '\0') return 0;
  lua_pushstring(L, h->settings->keys_error);
  return 1;
}

/* qtg.crypto.lua_path_error(): why MG_LUA_PATH may not be trusted, under
 * `qtgd check`, or nil. */
static int qtg_lua_lua_path_error(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  if (h == NULL || h->settings == NULL || h->settings->lua_path_error[0] == '\0') return 0;
  lua_pushstring(L, h->settings->lua_path_error);
  return 1;
}

/* qtg.crypto.lua_path_check(): the check of MG_LUA_PATH run again now
 * (the reload runs it first): nil, or why it may not be trusted. */
static int qtg_lua_lua_path_check(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  const char *over = h != NULL && h->settings != NULL ? qtg_settings_str(h->settings, QTG_S_LUA_PATH) : "";
  char err[512];
  if (over[0] == '\0' || qtg_lua_path_check(over, err, sizeof err) == 0) return 0;
  lua_pushstring(L, err);
  return 1;
}

static int qtg_lua_callback_key_id(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  lua_pushstring(L, qtg_keys_callback_key_id(h != NULL ? h->keys : NULL));
  return 1;
}

static int qtg_lua_random_bytes(lua_State *L) {
  lua_Number n = luaL_checknumber(L, 1);
  size_t len;
  uint8_t *buf;
  if (!(n >= 0 && n <= QTG_LUA_RANDOM_MAX) || n != (lua_Number)(size_t)n)
    return luaL_argerror(L, 1, "want an integer from 0 to 1048576");
  len = (size_t)n;
  buf = lua_newuserdata(L, len > 0 ? len : 1);
  if (qtg_random_bytes(buf, len) != 0)
    return luaL_error(L, "qtg.crypto.random_bytes: the random generator failed");
  lua_pushlstring(L, (const char *)buf, len);
  qtg_wipe(buf, len);
  return 1;
}

static int qtg_lua_nonce(lua_State *L) {
  char out[QTG_NONCE_LEN + 1];
  if (qtg_nonce(out) != 0)
    return luaL_error(L, "qtg.crypto.nonce: the random generator failed");
  lua_pushstring(L, out);
  return 1;
}

static int qtg_lua_hex(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  qtg_lua_push_hex(L, (const uint8_t *)s, len);
  return 1;
}

static int qtg_lua_unhex(lua_State *L) {
  size_t len, outlen;
  const char *s = luaL_checklstring(L, 1, &len);
  uint8_t *out;
  /* Decode into a userdata so an error raised below cannot leak it. */
  if (len >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    s += 2;
    len -= 2;
  }
  if (len % 2 != 0) return qtg_raise(L, "invalid", "unhex: odd number of hex digits");
  outlen = len / 2;
  out = lua_newuserdata(L, outlen > 0 ? outlen : 1);
  if (qtg_hex_decode(s, len, out) != 0)
    return qtg_raise(L, "invalid", "unhex: not a hex digit");
  lua_pushlstring(L, (const char *)out, outlen);
  return 1;
}

static int qtg_lua_constant_time_equal(lua_State *L) {
  size_t alen, blen;
  const char *a = luaL_checklstring(L, 1, &alen);
  const char *b = luaL_checklstring(L, 2, &blen);
  lua_pushboolean(L, qtg_constant_time_equal(a, alen, b, blen));
  return 1;
}

int luaopen_qtg_crypto(lua_State *L) {
  static const luaL_Reg fns[] = {
      {"sha256", qtg_lua_sha256},
      {"sha256_hex", qtg_lua_sha256_hex},
      {"keccak256", qtg_lua_keccak256},
      {"keccak256_hex", qtg_lua_keccak256_hex},
      {"hmac_sha256_hex", qtg_lua_hmac_sha256_hex},
      {"hmac_callback", qtg_lua_hmac_callback},
      {"callback_key_id", qtg_lua_callback_key_id},
      {"keys_error", qtg_lua_keys_error},
      {"lua_path_error", qtg_lua_lua_path_error},
      {"lua_path_check", qtg_lua_lua_path_check},
      {"random_bytes", qtg_lua_random_bytes},
      {"nonce", qtg_lua_nonce},
      {"hex", qtg_lua_hex},
      {"unhex", qtg_lua_unhex},
      {"constant_time_equal", qtg_lua_constant_time_equal},
      {NULL, NULL},
  };
  lua_createtable(L, 0, 12);
  luaL_register(L, NULL, fns);
  return 1;
}
