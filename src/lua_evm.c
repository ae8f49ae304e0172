/* lua_evm.c -- qtg.evm: EVM transaction encoding for policy code.
 *
 *   qtg.evm.eip1559(fields)            -> {payload=, signing_hash=}
 *   qtg.evm.eip1559(fields, signature) -> also {raw=, tx_hash=, from=}
 *
 * fields: chain_id, nonce, max_priority_fee_per_gas, max_fee_per_gas,
 * gas_limit (integers: Lua numbers below 2^53, or decimal / 0x-hex strings
 * for anything larger such as wei amounts), to ("0x" + 40 hex; nil for a
 * contract creation), value (default 0), data ("0x" hex, default empty),
 * access_list (array of {address=, storage_keys={"0x"+64 hex...}}).
 * signature: the table qtg.signer.sign returns, or its "0x"+130 hex string
 * (v = 0/1, or 27/28).
 *
 * `payload` is what a SignRequest carries (0x02 || rlp of the nine fields)
 * and `signing_hash` its keccak256, so the signer's checks hold by
 * construction.  Malformed fields raise {kind="invalid"} naming the field.
 */
#include <string.h>

#include "qtg_crypto.h"
#include "qtg_host.h"
#include "qtg_keys.h"
#include "qtg_rlp.h"
#include "qtg_signer.h"

enum { QTG_EVM_MAX_ACCESS = 1024, QTG_EVM_MAX_KEYS = 4096 };

#define QTG_EVM_GUARD "qtg.evm.guard"

typedef struct {
  qtg_rlp_buf unsigned_tx, raw;
} qtg_evm_guard;

/* Integers: a non-negative integral number below 2^53, or a string. */
static void qtg_evm_u256(lua_State *L, int t, const char *field, int required,
                         qtg_u256 *out) {
  memset(out, 0, sizeof *out);
  lua_getfield(L, t, field);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    if (required) qtg_raise(L, "invalid", "eip1559: %s is required", field);
    return;
  }
  if (lua_type(L, -1) == LUA_TNUMBER) {
    double n = lua_tonumber(L, -1);
    uint64_t v;
    if (!(n >= 0 && n < 9007199254740992.0) || n != (double)(uint64_t)n)
      qtg_raise(L, "invalid",
                "eip1559: %s must be a non-negative integer below 2^53 "
                "(use a decimal string for larger values)", field);
    v = (uint64_t)n;
    for (int i = 0; i < 8; i++) out->be[24 + i] = (uint8_t)(v >> (8 * (7 - i)));
  } else if (lua_type(L, -1) == LUA_TSTRING) {
    size_t len;
    const char *s = lua_tolstring(L, -1, &len);
    if (qtg_u256_parse(s, len, out) != 0)
      qtg_raise(L, "invalid", "eip1559: %s must be a decimal or 0x-hex integer below 2^256",
                field);
  } else {
    qtg_raise(L, "invalid", "eip1559: %s must be an integer or a string", field);
  }
  lua_pop(L, 1);
}

/* "0x" + 2*n hex digits into out; raises naming the field. */
static void qtg_evm_fixed_hex(lua_State *L, int idx, const char *field, uint8_t *out,
                              size_t n) {
  size_t len;
  const char *s = lua_type(L, idx) == LUA_TSTRING ? lua_tolstring(L, idx, &len) : NULL;
  if (s == NULL || len != 2 + 2 * n || s[0] != '0' || (s[1] != 'x' && s[1] != 'X') ||
      qtg_hex_decode(s + 2, 2 * n, out) != 0)
    qtg_raise(L, "invalid", "eip1559: %s must be 0x followed by %d hex digits", field,
              (int)(2 * n));
}

/* Parse fields.access_list into userdata-backed arrays (collected by the
 * GC, so a raise part-way leaks nothing). */
static void qtg_evm_access_list(lua_State *L, int t, qtg_eip1559_tx *tx) {
  qtg_access_entry *entries;
  size_t n;
  lua_getfield(L, t, "access_list");
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return;
  }
  if (!lua_istable(L, -1)) qtg_raise(L, "invalid", "eip1559: access_list must be an array");
  n = lua_objlen(L, -1);
  if (n > QTG_EVM_MAX_ACCESS) qtg_raise(L, "invalid", "eip1559: access_list is too long");
  entries = lua_newuserdata(L, (n ? n : 1) * sizeof *entries);
  lua_insert(L, -2);                          /* keep it below the list */
  for (size_t i = 0; i < n; i++) {
    size_t nkeys;
    uint8_t (*keys)[32];
    if (!lua_checkstack(L, 8)) qtg_raise(L, "invalid", "eip1559: access_list is too long");
    lua_rawgeti(L, -1, (int)i + 1);
    if (!lua_istable(L, -1))
      qtg_raise(L, "invalid", "eip1559: access_list[%d] must be {address=, storage_keys=}",
                (int)i + 1);
    lua_getfield(L, -1, "address");
    qtg_evm_fixed_hex(L, -1, "access_list address", entries[i].address, 20);
    lua_pop(L, 1);
    lua_getfield(L, -1, "storage_keys");
    if (lua_isnil(L, -1)) {
      lua_pop(L, 1);
      lua_newtable(L);
    }
    if (!lua_istable(L, -1))
      qtg_raise(L, "invalid", "eip1559: access_list[%d].storage_keys must be an array",
                (int)i + 1);
    nkeys = lua_objlen(L, -1);
    if (nkeys > QTG_EVM_MAX_KEYS) qtg_raise(L, "invalid", "eip1559: too many storage keys");
    keys = lua_newuserdata(L, (nkeys ? nkeys : 1) * 32);
    /* Anchor the keys in the entry table's slot on the stack: replace the
     * entry (no longer needed) below the storage_keys array. */
    lua_replace(L, -3);                       /* ..., keys_ud, storage_keys */
    for (size_t k = 0; k < nkeys; k++) {
      lua_rawgeti(L, -1, (int)k + 1);
      qtg_evm_fixed_hex(L, -1, "storage key", keys[k], 32);
      lua_pop(L, 1);
    }
    lua_pop(L, 1);                            /* ..., list, keys_ud */
    lua_insert(L, -2);                        /* keys_ud stays below the list */
    entries[i].storage_keys = (const uint8_t (*)[32])keys;
    entries[i].nkeys = nkeys;
  }
  lua_pop(L, 1);                              /* the list; userdata remain */
  tx->access_list = entries;
  tx->access_list_len = n;
}

static void qtg_evm_push_hex(lua_State *L, const char *field, const uint8_t *p, size_t len) {
  char *hex = lua_newuserdata(L, 2 * len + 3);
  hex[0] = '0';
  hex[1] = 'x';
  qtg_hex_encode(p, len, hex + 2);
  lua_pushlstring(L, hex, 2 * len + 2);
  lua_remove(L, -2);
  lua_setfield(L, -2, field);
}

/* The 65 signature bytes from sign()'s table or its hex string. */
static void qtg_evm_signature(lua_State *L, int idx, qtg_signature *sig) {
  uint8_t raw[65];
  if (lua_istable(L, idx)) {
    lua_getfield(L, idx, "signature");
  } else {
    lua_pushvalue(L, idx);
  }
  qtg_evm_fixed_hex(L, -1, "signature", raw, 65);
  lua_pop(L, 1);
  memcpy(sig->r, raw, 32);
  memcpy(sig->s, raw + 32, 32);
  sig->recid = raw[64] >= 27 ? raw[64] - 27 : raw[64];
  if (sig->recid != 0 && sig->recid != 1)
    qtg_raise(L, "invalid", "eip1559: signature v must be 0, 1, 27 or 28");
}

static int qtg_lua_evm_eip1559(lua_State *L) {
  qtg_eip1559_tx tx;
  qtg_evm_guard *guard;
  uint8_t hash[32], txhash[32], from[QTG_ADDRESS_LEN];
  uint8_t *data = NULL;
  size_t data_len = 0;
  qtg_signature sig;
  int signed_tx = !lua_isnoneornil(L, 2);
  qtg_host *h = qtg_host_from_lua(L);
  char fromhex[QTG_ADDRESS_HEX_LEN + 1];

  luaL_checktype(L, 1, LUA_TTABLE);
  memset(&tx, 0, sizeof tx);
  qtg_evm_u256(L, 1, "chain_id", 1, &tx.chain_id);
  qtg_evm_u256(L, 1, "nonce", 1, &tx.nonce);
  qtg_evm_u256(L, 1, "max_priority_fee_per_gas", 1, &tx.max_priority_fee_per_gas);
  qtg_evm_u256(L, 1, "max_fee_per_gas", 1, &tx.max_fee_per_gas);
  qtg_evm_u256(L, 1, "gas_limit", 1, &tx.gas_limit);
  qtg_evm_u256(L, 1, "value", 0, &tx.value);
  lua_getfield(L, 1, "to");
  if (!lua_isnil(L, -1)) {
    qtg_evm_fixed_hex(L, -1, "to", tx.to, 20);
    tx.has_to = 1;
  }
  lua_pop(L, 1);
  lua_getfield(L, 1, "data");                 /* stays on the stack */
  if (!lua_isnil(L, -1)) {
    size_t len = 0;
    const char *s = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
    if (s == NULL || len < 2 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X') || len % 2 != 0)
      qtg_raise(L, "invalid", "eip1559: data must be 0x followed by an even number of hex digits");
    data_len = (len - 2) / 2;
    data = lua_newuserdata(L, data_len ? data_len : 1);
    if (qtg_hex_decode(s + 2, len - 2, data) != 0)
      qtg_raise(L, "invalid", "eip1559: data must be 0x followed by hex digits");
  }
  tx.data = data;
  tx.data_len = data_len;
  qtg_evm_access_list(L, 1, &tx);
  if (signed_tx) qtg_evm_signature(L, 2, &sig);

  /* The encodings live in C heap buffers owned by a userdata whose __gc
   * frees them, so a Lua error while the results are pushed cannot leak
   * them. */
  guard = lua_newuserdata(L, sizeof *guard);
  qtg_rlp_init(&guard->unsigned_tx);
  qtg_rlp_init(&guard->raw);
  luaL_getmetatable(L, QTG_EVM_GUARD);
  lua_setmetatable(L, -2);
  if (qtg_eip1559_unsigned(&tx, &guard->unsigned_tx) != 0 ||
      (signed_tx && qtg_eip1559_signed(&tx, sig.recid, sig.r, sig.s, &guard->raw) != 0))
    return luaL_error(L, "eip1559: out of memory");
  qtg_keccak256(guard->unsigned_tx.p, guard->unsigned_tx.len, hash);
  lua_createtable(L, 0, 5);
  qtg_evm_push_hex(L, "payload", guard->unsigned_tx.p, guard->unsigned_tx.len);
  qtg_evm_push_hex(L, "signing_hash", hash, 32);
  if (signed_tx) {
    qtg_keccak256(guard->raw.p, guard->raw.len, txhash);
    qtg_evm_push_hex(L, "raw", guard->raw.p, guard->raw.len);
    qtg_evm_push_hex(L, "tx_hash", txhash, 32);
    if (qtg_signer_recover(qtg_keys_context(h != NULL ? h->keys : NULL), hash, &sig, from) == 0) {
      qtg_signer_address_hex(from, fromhex);
      lua_pushstring(L, fromhex);
      lua_setfield(L, -2, "from");
    }
  }
  qtg_rlp_free(&guard->unsigned_tx);
  qtg_rlp_free(&guard->raw);
  return 1;
}

static int qtg_evm_guard_gc(lua_State *L) {
  qtg_evm_guard *guard = luaL_checkudata(L, 1, QTG_EVM_GUARD);
  qtg_rlp_free(&guard->unsigned_tx);
  qtg_rlp_free(&guard->raw);
  return 0;
}

int luaopen_qtg_evm(lua_State *L) {
  static const luaL_Reg fns[] = {
      {"eip1559", qtg_lua_evm_eip1559},
      {NULL, NULL},
  };
  luaL_newmetatable(L, QTG_EVM_GUARD);
  lua_pushcfunction(L, qtg_evm_guard_gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  lua_createtable(L, 0, 1);
  luaL_register(L, NULL, fns);
  return 1;
}
