/* lua_signer.c -- qtg.signer: EVM signing with keys held by C.
 *
 *   keys()                   names of the loaded signer keys
 *   address(name)            lowercase 0x address, or nil, err
 *   checksum_address(addr)   EIP-55 form (raises {kind="invalid"} on bad input)
 *   health(name)             {ok=true, signer_address=} or {ok=false, error=, code=}
 *   sign(name, sign_request) {signature=, r=, s=, recid=, address=} or nil, err
 *   recover(hash, signature) the address that signed hash, or nil, err
 *
 * sign() refuses with err = {kind="signer", code=...} unless the request's
 * payload_hash equals signing_intent.allowed_payload_hash and the payload
 * bytes hash (keccak256) to it; see qtg_signer_check_request.  The key
 * bytes never leave qtg_keys.c.
 */
#include <string.h>

#include "qtg_crypto.h"
#include "qtg_host.h"
#include "qtg_keys.h"
#include "qtg_signer.h"

static const qtg_keys *qtg_lua_keys(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  return h != NULL ? h->keys : NULL;
}

/* nil, {kind="signer", code=, message=[, key=]} */
static int qtg_lua_signer_refuse(lua_State *L, qtg_signer_code code,
                                 const char *name, const char *message) {
  lua_pushnil(L);
  qtg_push_error(L, "signer", "%s", message);
  lua_pushstring(L, qtg_signer_code_name(code));
  lua_setfield(L, -2, "code");
  if (name != NULL) {
    lua_pushstring(L, name);
    lua_setfield(L, -2, "key");
  }
  return 2;
}

static int qtg_lua_signer_keys(lua_State *L) {
  const qtg_keys *k = qtg_lua_keys(L);
  size_t n = qtg_keys_signer_count(k);
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_pushstring(L, qtg_keys_signer_name(k, i));
    lua_rawseti(L, -2, (int)i + 1);
  }
  return 1;
}

static int qtg_lua_signer_address(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  uint8_t addr[QTG_ADDRESS_LEN];
  char hex[QTG_ADDRESS_HEX_LEN + 1];
  if (qtg_keys_signer_address(qtg_lua_keys(L), name, addr) != 0)
    return qtg_lua_signer_refuse(L, QTG_SIGNER_NOT_FOUND, name, "no signer key of that name");
  qtg_signer_address_hex(addr, hex);
  lua_pushstring(L, hex);
  return 1;
}

static int qtg_lua_signer_checksum_address(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  uint8_t addr[QTG_ADDRESS_LEN];
  char out[QTG_ADDRESS_HEX_LEN + 1];
  if (qtg_signer_parse_address(s, len, addr) != 0)
    return qtg_raise(L, "invalid", "checksum_address: want 0x followed by 40 hex digits");
  qtg_signer_checksum_address(addr, out);
  lua_pushstring(L, out);
  return 1;
}

/* A key is healthy when a signature it makes recovers to its address. */
static int qtg_lua_signer_health(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  const qtg_keys *k = qtg_lua_keys(L);
  static const char probe[] = "qtg signer health probe";
  uint8_t addr[QTG_ADDRESS_LEN], got[QTG_ADDRESS_LEN], hash[32];
  char hex[QTG_ADDRESS_HEX_LEN + 1];
  qtg_signature sig;
  qtg_signer_code code;
  const char *why = NULL;

  lua_createtable(L, 0, 3);
  if (qtg_keys_signer_address(k, name, addr) != 0) {
    code = QTG_SIGNER_NOT_FOUND;
    why = "no signer key of that name";
  } else {
    qtg_keccak256(probe, sizeof probe - 1, hash);
    code = qtg_keys_sign_hash(k, name, hash, &sig);
    if (code != QTG_SIGNER_OK) {
      why = "signing the probe failed";
    } else if (qtg_signer_recover(qtg_keys_context(k), hash, &sig, got) != 0 ||
               memcmp(got, addr, sizeof addr) != 0) {
      code = QTG_SIGNER_INTERNAL;
      why = "the probe signature does not recover to the key's address";
    }
  }
  lua_pushboolean(L, why == NULL);
  lua_setfield(L, -2, "ok");
  if (why == NULL) {
    qtg_signer_address_hex(addr, hex);
    lua_pushstring(L, hex);
    lua_setfield(L, -2, "signer_address");
  } else {
    lua_pushstring(L, why);
    lua_setfield(L, -2, "error");
    lua_pushstring(L, qtg_signer_code_name(code));
    lua_setfield(L, -2, "code");
  }
  return 1;
}

/* t[field] as a string (or NULL when it is not one). */
static const char *qtg_lua_signer_field(lua_State *L, int t, const char *field,
                                        size_t *len) {
  const char *s;
  lua_getfield(L, t, field);
  s = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, len) : NULL;
  lua_pop(L, 1);   /* the table still references the string */
  return s;
}

static void qtg_lua_push_hex_field(lua_State *L, const char *field,
                                   const uint8_t *bytes, size_t len) {
  char hex[2 + 2 * 32 + 1];
  hex[0] = '0';
  hex[1] = 'x';
  qtg_hex_encode(bytes, len, hex + 2);
  lua_pushstring(L, hex);
  lua_setfield(L, -2, field);
}

static int qtg_lua_signer_sign(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  const qtg_keys *k = qtg_lua_keys(L);
  const char *payload_hash, *allowed, *payload;
  size_t payload_hash_len = 0, allowed_len = 0, payload_len = 0;
  uint8_t hash[32], addr[QTG_ADDRESS_LEN];
  char msg[256], sighex[2 + 130 + 1], addrhex[QTG_ADDRESS_HEX_LEN + 1];
  qtg_signature sig;
  qtg_signer_code code;

  if (qtg_keys_signer_address(k, name, addr) != 0)
    return qtg_lua_signer_refuse(L, QTG_SIGNER_NOT_FOUND, name, "no signer key of that name");
  if (!lua_istable(L, 2))
    return qtg_lua_signer_refuse(L, QTG_SIGNER_BAD_REQUEST, name,
                                 "sign_request must be a table");
  payload_hash = qtg_lua_signer_field(L, 2, "payload_hash", &payload_hash_len);
  payload = qtg_lua_signer_field(L, 2, "payload", &payload_len);
  lua_getfield(L, 2, "signing_intent");
  if (!lua_istable(L, -1))
    return qtg_lua_signer_refuse(L, QTG_SIGNER_BAD_REQUEST, name,
                                 "sign_request.signing_intent must be a table");
  allowed = qtg_lua_signer_field(L, lua_gettop(L), "allowed_payload_hash", &allowed_len);
  /* Keccak-256 and secp256k1 are the EVM's; refuse other chain families
   * rather than sign something their chain would read differently. */
  lua_getfield(L, -1, "chain_family");
  if (!lua_isnil(L, -1) &&
      (lua_type(L, -1) != LUA_TSTRING || strcmp(lua_tostring(L, -1), "evm") != 0))
    return qtg_lua_signer_refuse(L, QTG_SIGNER_BAD_REQUEST, name,
                                 "signing_intent.chain_family must be \"evm\"");
  lua_pop(L, 2);

  code = qtg_signer_check_request(payload_hash, payload_hash_len, allowed, allowed_len,
                                  payload, payload_len, hash, msg, sizeof msg);
  if (code != QTG_SIGNER_OK) return qtg_lua_signer_refuse(L, code, name, msg);
  code = qtg_keys_sign_hash(k, name, hash, &sig);
  if (code != QTG_SIGNER_OK)
    return qtg_lua_signer_refuse(L, code, name, "signing failed");

  lua_createtable(L, 0, 6);
  qtg_signer_signature_hex(&sig, sighex);
  lua_pushstring(L, sighex);
  lua_setfield(L, -2, "signature");
  qtg_lua_push_hex_field(L, "r", sig.r, 32);
  qtg_lua_push_hex_field(L, "s", sig.s, 32);
  qtg_lua_push_hex_field(L, "payload_hash", hash, 32);
  lua_pushinteger(L, sig.recid);
  lua_setfield(L, -2, "recid");
  qtg_signer_address_hex(addr, addrhex);
  lua_pushstring(L, addrhex);
  lua_setfield(L, -2, "address");
  return 1;
}

/* recover(hash, signature): hash "0x"+64 hex; signature "0x"+130 hex with
 * v = 0/1 (recid) or 27/28 (legacy). */
static int qtg_lua_signer_recover(lua_State *L) {
  size_t hlen, slen;
  const char *hs = luaL_checklstring(L, 1, &hlen);
  const char *ss = luaL_checklstring(L, 2, &slen);
  uint8_t hash[32], raw[65], addr[QTG_ADDRESS_LEN];
  char hex[QTG_ADDRESS_HEX_LEN + 1];
  qtg_signature sig;

  if (qtg_signer_parse_hash(hs, hlen, hash) != 0)
    return qtg_lua_signer_refuse(L, QTG_SIGNER_BAD_REQUEST, NULL,
                                 "hash must be 0x followed by 64 hex digits");
  if (slen != 2 + 130 || ss[0] != '0' || (ss[1] != 'x' && ss[1] != 'X') ||
      qtg_hex_decode(ss + 2, 130, raw) != 0)
    return qtg_lua_signer_refuse(L, QTG_SIGNER_BAD_REQUEST, NULL,
                                 "signature must be 0x followed by 130 hex digits");
  memcpy(sig.r, raw, 32);
  memcpy(sig.s, raw + 32, 32);
  sig.recid = raw[64] >= 27 ? raw[64] - 27 : raw[64];
  if (sig.recid > 1 ||
      qtg_signer_recover(qtg_keys_context(qtg_lua_keys(L)), hash, &sig, addr) != 0)
    return qtg_lua_signer_refuse(L, QTG_SIGNER_BAD_REQUEST, NULL,
                                 "signature does not recover to any key");
  qtg_signer_address_hex(addr, hex);
  lua_pushstring(L, hex);
  return 1;
}

int luaopen_qtg_signer(lua_State *L) {
  static const luaL_Reg fns[] = {
      {"keys", qtg_lua_signer_keys},
      {"address", qtg_lua_signer_address},
      {"checksum_address", qtg_lua_signer_checksum_address},
      {"health", qtg_lua_signer_health},
      {"sign", qtg_lua_signer_sign},
      {"recover", qtg_lua_signer_recover},
      {NULL, NULL},
  };
  lua_createtable(L, 0, 6);
  luaL_register(L, NULL, fns);
  return 1;
}
