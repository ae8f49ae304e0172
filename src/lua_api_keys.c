/* lua_api_keys.c -- qtg.api_keys: each API client's own callback signing
 * key, derived so that no per-client secret is ever stored:
 *
 *   client key(key_id) = lowercase hex of HMAC-SHA256(secret,
 *                          "qtg api client callback key\n" || key_id)
 *
 * key_id is "<scheme>.<client name>.<generation>" (lua/qtg/api/clients.lua),
 * and the scheme says which secret:
 *   m  the clients' own secret, MG_CALLBACK_CLIENT_KEY_FILE: the receivers
 *      of operator callbacks, which hold the host key, cannot compute it,
 *      and rotating the host key leaves it as it is;
 *   c  the host's callback key (MG_CALLBACK_KEY_FILE), as before that
 *      setting: every holder of the host key can compute such a key.
 * A client gets new keys in the scheme the process has (scheme()); a row
 * keeps the key id it was written with.  The client receives the 64 hex
 * characters once (qtgd tokens) and verifies callbacks with them as the key
 * bytes, exactly as a receiver of the host key does (tools/callback-verify).
 * A receiver knowing its own key learns nothing about another client's
 * (HMAC is a PRF).  No secret reaches Lua.
 *
 *   qtg.api_keys.client_key(key_id)        -> hex key, or nil, err (no_key)
 *   qtg.api_keys.sign(key_id, message)     -> hex HMAC-SHA256(client key, message)
 *   qtg.api_keys.scheme()                  -> "m" with the clients' secret, else "c"
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
  if (idlen == 0 || idlen > 64) luaL_argerror(L, 1, "a key id is 1 to 64 characters");
  int own = idlen > 2 && key_id[0] == 'm' && key_id[1] == '.';
  if (own ? !qtg_keys_has_client_key(k) : !qtg_keys_has_callback_key(k)) {
    lua_pushnil(L);
    qtg_push_error(L, "no_key", own ? "key %s derives from the API clients' secret: set MG_CALLBACK_CLIENT_KEY_FILE"
                                    : "no callback key is configured (set MG_CALLBACK_KEY_FILE)", key_id);
    return 2;
  }
  char label[sizeof qtg_api_key_label + 64];
  memcpy(label, qtg_api_key_label, sizeof qtg_api_key_label - 1);
  memcpy(label + sizeof qtg_api_key_label - 1, key_id, idlen);
  uint8_t out[QTG_SHA256_LEN];
  size_t n = sizeof qtg_api_key_label - 1 + idlen;
  if ((own ? qtg_keys_client_hmac(k, label, n, out) : qtg_keys_callback_hmac(k, label, n, out)) != 0)
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

static int qtg_api_keys_scheme(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  lua_pushstring(L, qtg_keys_has_client_key(h ? h->keys : NULL) ? "m" : "c");
  return 1;
}

int luaopen_qtg_api_keys(lua_State *L) {
  static const luaL_Reg fns[] = {
      {"client_key", qtg_api_keys_client_key},
      {"sign", qtg_api_keys_sign},
      {"scheme", qtg_api_keys_scheme},
      {NULL, NULL},
  };
  lua_createtable(L, 0, 3);
  luaL_register(L, NULL, fns);
  return 1;
}
