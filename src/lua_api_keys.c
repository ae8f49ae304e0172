/* lua_api_keys.c -- qtg.api_keys: each API client's own callback signing
 * key, derived from the host's callback key so that no per-client secret is
 * ever stored:
 *
 *   client key(key_id) = lowercase hex of HMAC-SHA256(callback key,
 *                          "qtg api client callback key\n" || key_id)
 *
 * key_id is "c.<client name>.<generation>" (lua/qtg/api/clients.lua).  The
 * client receives the 64 hex characters once (qtgd tokens) and verifies
 * callbacks with them as the key bytes, exactly as a receiver of the host
 * key does (tools/callback-verify).  A receiver knowing its own key learns
 * nothing about another client's (HMAC is a PRF), so no client can forge
 * another's callbacks; a holder of the host key (a receiver of operator
 * callbacks) can derive them all (docs/callbacks.md, "Not yet separated").
 * The host key never reaches Lua.
 *
 *   qtg.api_keys.client_key(key_id)        -> hex key, or nil, err (no_key)
 *   qtg.api_keys.sign(key_id, message)     -> hex HMAC-SHA256(client key, message)
 */
#include <string.h>

#include "qtg_crypto.h"
#include "qtg_host.h"
#include "qtg_keys.h"

static const char qtg_api_key_label[] = "qtg api client callback key\n";

static void qtg_api_keys_hex(const uint8_t *b, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[b[i] >> 4];
    out[2 * i + 1] = digits[b[i] & 15];
  }
  out[2 * n] = 0;
}

/* Derive the client key into hex[65]; returns 0, or pushes nil, err and
 * returns 2 (the number of results to return). */
static int qtg_api_keys_derive(lua_State *L, const char *key_id, size_t idlen, char hex[65]) {
  qtg_host *h = qtg_host_from_lua(L);
  const qtg_keys *k = h ? h->keys : NULL;
  if (!qtg_keys_has_callback_key(k)) {
    lua_pushnil(L);
    qtg_push_error(L, "no_key", "no callback key is configured (set MG_CALLBACK_KEY_FILE)");
    return 2;
  }
  if (idlen == 0 || idlen > 64) luaL_argerror(L, 1, "a key id is 1 to 64 characters");
  char label[sizeof qtg_api_key_label + 64];
  memcpy(label, qtg_api_key_label, sizeof qtg_api_key_label - 1);
  memcpy(label + sizeof qtg_api_key_label - 1, key_id, idlen);
  uint8_t out[QTG_SHA256_LEN];
  if (qtg_keys_callback_hmac(k, label, sizeof qtg_api_key_label - 1 + idlen, out) != 0)
    luaL_error(L, "qtg.api_keys: HMAC failed");
  qtg_api_keys_hex(out, sizeof out, hex);
  memset(out, 0, sizeof out);
  return 0;
}

static int qtg_api_keys_client_key(lua_State *L) {
  size_t idlen;
  const char *id = luaL_checklstring(L, 1, &idlen);
  char hex[65];
  int n = qtg_api_keys_derive(L, id, idlen, hex);
  if (n) return n;
  lua_pushlstring(L, hex, 64);
  memset(hex, 0, sizeof hex);
  return 1;
}

static int qtg_api_keys_sign(lua_State *L) {
  size_t idlen, mlen;
  const char *id = luaL_checklstring(L, 1, &idlen);
  const char *msg = luaL_checklstring(L, 2, &mlen);
  char hex[65], sig[65];
  int n = qtg_api_keys_derive(L, id, idlen, hex);
  if (n) return n;
  uint8_t out[QTG_SHA256_LEN];
  int rc = qtg_hmac_sha256(hex, 64, msg, mlen, out);
  memset(hex, 0, sizeof hex);
  if (rc != 0) return luaL_error(L, "qtg.api_keys.sign: HMAC failed");
  qtg_api_keys_hex(out, sizeof out, sig);
  lua_pushlstring(L, sig, 64);
  return 1;
}

int luaopen_qtg_api_keys(lua_State *L) {
  static const luaL_Reg fns[] = {
      {"client_key", qtg_api_keys_client_key},
      {"sign", qtg_api_keys_sign},
      {NULL, NULL},
  };
  lua_createtable(L, 0, 2);
  luaL_register(L, NULL, fns);
  return 1;
}
