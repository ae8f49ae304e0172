/* test_evm.c -- RLP and EIP-1559 encoding byte for byte against published
 * vectors (the RLP examples, EIP-155's signing data, ethereumjs's EIP-1559
 * vector), then qtg.evm + qtg.signer from Lua inside a real host: encode,
 * sign through a SignRequest, assemble the raw transaction.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qtg_crypto.h"
#include "qtg_host.h"
#include "qtg_keys.h"
#include "qtg_rlp.h"
#include "qtg_settings.h"
#include "qtg_signer.h"
#include "qtg_test.h"
#include "qtg_test_host.h"

static qtg_test_counts tc;

/* ethereumjs-monorepo packages/tx/test/json/eip1559.json, entry 1. */
#define V1559_KEY "8f2a55949038a9610f50fb23b5883af3b4ecb3c3bb792cbcefbd1542c692be63"
#define V1559_RAW                                                                   \
  "02f870821e8e8203338301284d8301d97c828ae094000000000000000000000000000000000000aaaa" \
  "8402933bc980c080a0d067f2167008c59219652f91cbf8788dbca5f771f6e91e2b7657e85b78b472e0" \
  "a01d305af9fe81fdba43f0dfcd400ed24dcace0a7e30d4e85701dcaaf484cd079e"

/* Hex of a buffer into a static string (tests only). */
static const char *hex_of(const uint8_t *p, size_t len) {
  static char out[4096];
  if (2 * len + 1 > sizeof out) return "(too long)";
  qtg_hex_encode(p, len, out);
  return out;
}

static void test_rlp_examples(void) {
  qtg_rlp_buf b, items;
  static const char lorem[] = "Lorem ipsum dolor sit amet, consectetur adipisicing elit";

  qtg_rlp_init(&b);
  qtg_rlp_bytes(&b, "dog", 3);
  CHECK_STR(&tc, hex_of(b.p, b.len), "83646f67");
  qtg_rlp_free(&b);

  qtg_rlp_init(&items);
  qtg_rlp_bytes(&items, "cat", 3);
  qtg_rlp_bytes(&items, "dog", 3);
  qtg_rlp_list(&b, items.p, items.len);
  CHECK_STR(&tc, hex_of(b.p, b.len), "c88363617483646f67");
  qtg_rlp_free(&items);
  qtg_rlp_free(&b);

  qtg_rlp_bytes(&b, "", 0);
  qtg_rlp_list(&b, NULL, 0);
  qtg_rlp_u64(&b, 0);
  qtg_rlp_u64(&b, 15);
  qtg_rlp_u64(&b, 1024);
  qtg_rlp_bytes(&b, "\x7f", 1);
  qtg_rlp_bytes(&b, "\x80", 1);
  CHECK_STR(&tc, hex_of(b.p, b.len), "80c0800f8204007f8180");
  qtg_rlp_free(&b);

  /* 56 bytes: the first length that needs a length-of-length. */
  CHECK(&tc, strlen(lorem) == 56);
  qtg_rlp_bytes(&b, lorem, 56);
  CHECK(&tc, b.len == 58 && b.p[0] == 0xb8 && b.p[1] == 0x38 && memcmp(b.p + 2, lorem, 56) == 0);
  qtg_rlp_free(&b);
  {
    static uint8_t big[1024];
    qtg_rlp_bytes(&b, big, sizeof big);
    CHECK(&tc, b.len == 1027 && b.p[0] == 0xb9 && b.p[1] == 0x04 && b.p[2] == 0x00);
    qtg_rlp_free(&b);
  }
  CHECK(&tc, !b.oom);
}

static void test_u256(void) {
  qtg_u256 v;
  CHECK(&tc, qtg_u256_parse("0", 1, &v) == 0 && strcmp(hex_of(v.be, 32), "0000000000000000000000000000000000000000000000000000000000000000") == 0);
  CHECK(&tc, qtg_u256_parse("1000000000000000000", 19, &v) == 0);
  CHECK_STR(&tc, hex_of(v.be + 24, 8), "0de0b6b3a7640000");
  CHECK(&tc, qtg_u256_parse("0x0DE0b6b3a7640000", 18, &v) == 0);
  CHECK_STR(&tc, hex_of(v.be + 24, 8), "0de0b6b3a7640000");
  {
    const char *max = "115792089237316195423570985008687907853269984665640564039457584007913129639935";
    const char *over = "115792089237316195423570985008687907853269984665640564039457584007913129639936";
    CHECK(&tc, qtg_u256_parse(max, strlen(max), &v) == 0 && v.be[0] == 0xff && v.be[31] == 0xff);
    CHECK(&tc, qtg_u256_parse(over, strlen(over), &v) == -1);
  }
  {
    /* 66 hex digits: fine with leading zeros, an overflow without. */
    const char *padded = "0x000000000000000000000000000000000000000000000000000000000000000001";
    const char *over = "0x010000000000000000000000000000000000000000000000000000000000000000";
    CHECK(&tc, strlen(padded) == 68 && strlen(over) == 68);
    CHECK(&tc, qtg_u256_parse(padded, strlen(padded), &v) == 0 && v.be[31] == 1 && v.be[0] == 0);
    CHECK(&tc, qtg_u256_parse(over, strlen(over), &v) == -1);
  }
  {
    const char *bad[] = {"", "-1", "1.5", "0x", "0xg1", " 1", "1e3", "0b1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
      CHECK(&tc, qtg_u256_parse(bad[i], strlen(bad[i]), &v) == -1);
  }
}

/* EIP-155's legacy signing data is an RLP list of nine items: the encoder
 * must reproduce it from the transaction's values. */
static void test_eip155_signing_data(void) {
  qtg_rlp_buf items, b;
  qtg_u256 gwei20, wei;
  uint8_t to[20];
  memset(to, 0x35, sizeof to);
  CHECK(&tc, qtg_u256_parse("20000000000", 11, &gwei20) == 0);
  CHECK(&tc, qtg_u256_parse("1000000000000000000", 19, &wei) == 0);
  qtg_rlp_init(&items);
  qtg_rlp_init(&b);
  qtg_rlp_u64(&items, 9);
  qtg_rlp_uint_be(&items, gwei20.be, 32);
  qtg_rlp_u64(&items, 21000);
  qtg_rlp_bytes(&items, to, 20);
  qtg_rlp_uint_be(&items, wei.be, 32);
  qtg_rlp_bytes(&items, "", 0);
  qtg_rlp_u64(&items, 1);
  qtg_rlp_u64(&items, 0);
  qtg_rlp_u64(&items, 0);
  qtg_rlp_list(&b, items.p, items.len);
  CHECK_STR(&tc, hex_of(b.p, b.len),
            "ec098504a817c800825208943535353535353535353535353535353535353535880de0b6b3a764000080018080");
  qtg_rlp_free(&items);
  qtg_rlp_free(&b);
}

static void vector_tx(qtg_eip1559_tx *tx) {
  memset(tx, 0, sizeof *tx);
  qtg_u256_parse("7822", 4, &tx->chain_id);
  qtg_u256_parse("819", 3, &tx->nonce);
  qtg_u256_parse("75853", 5, &tx->max_priority_fee_per_gas);
  qtg_u256_parse("121212", 6, &tx->max_fee_per_gas);
  qtg_u256_parse("35552", 5, &tx->gas_limit);
  qtg_u256_parse("43203529", 8, &tx->value);
  tx->has_to = 1;
  tx->to[18] = 0xaa;
  tx->to[19] = 0xaa;
}

static void test_eip1559_vector(void) {
  qtg_eip1559_tx tx;
  qtg_rlp_buf u, raw;
  uint8_t sk[32], hash[32], addr[20], got[20];
  qtg_signature sig;
  secp256k1_context *ctx = qtg_signer_context_new();

  CHECK(&tc, ctx != NULL);
  if (ctx == NULL) return;
  vector_tx(&tx);
  qtg_rlp_init(&u);
  qtg_rlp_init(&raw);
  CHECK(&tc, qtg_eip1559_unsigned(&tx, &u) == 0);
  CHECK(&tc, u.len > 1 && u.p[0] == 0x02);
  qtg_keccak256(u.p, u.len, hash);
  CHECK(&tc, qtg_hex_decode(V1559_KEY, 64, sk) == 0);
  CHECK(&tc, qtg_signer_sign_hash(ctx, sk, hash, &sig) == 0);
  CHECK(&tc, qtg_eip1559_signed(&tx, sig.recid, sig.r, sig.s, &raw) == 0);
  CHECK_STR(&tc, hex_of(raw.p, raw.len), V1559_RAW);
  /* The sender recovered from the signature is the key's address. */
  CHECK(&tc, qtg_signer_address_of(ctx, sk, addr) == 0);
  CHECK(&tc, qtg_signer_recover(ctx, hash, &sig, got) == 0 && memcmp(addr, got, 20) == 0);
  CHECK(&tc, qtg_eip1559_signed(&tx, 2, sig.r, sig.s, &raw) == -1);
  qtg_rlp_free(&u);
  qtg_rlp_free(&raw);
  qtg_signer_context_free(ctx);
}

/* An access list with one address and one key crosses the 55-byte list
 * boundary: [[addr(21 bytes encoded), [key(33)] (34)] (55 -> f7)] (56 -> f838). */
static void test_access_list_encoding(void) {
  qtg_eip1559_tx tx;
  qtg_rlp_buf u;
  static const uint8_t keys[1][32] = {{0}};
  qtg_access_entry e;
  const char *hex, *at;
  memset(&e, 0, sizeof e);
  e.address[19] = 1;
  e.storage_keys = keys;
  e.nkeys = 1;
  vector_tx(&tx);
  tx.access_list = &e;
  tx.access_list_len = 1;
  qtg_rlp_init(&u);
  CHECK(&tc, qtg_eip1559_unsigned(&tx, &u) == 0);
  hex = hex_of(u.p, u.len);
  at = strstr(hex, "f838f794");
  CHECK(&tc, at != NULL);
  if (at != NULL)
    CHECK_STR(&tc, at,
              "f838f7940000000000000000000000000000000000000001e1a0"
              "0000000000000000000000000000000000000000000000000000000000000000");
  qtg_rlp_free(&u);
}

/* ---- qtg.evm + qtg.signer from Lua inside a real host --------------------- */




static const char lua_evm_spec[] =
    "local qtg = require 'qtg'\n"
    "local evm, signer, crypto = qtg.evm, qtg.signer, qtg.crypto\n"
    "local fields = {chain_id = 7822, nonce = 819, max_priority_fee_per_gas = 75853,\n"
    "  max_fee_per_gas = '121212', gas_limit = '0x8ae0', value = '43203529',\n"
    "  to = '0x000000000000000000000000000000000000aaaa', data = '0x', access_list = {}}\n"
    "local tx = evm.eip1559(fields)\n"
    "assert(tx.signing_hash == '0x' .. crypto.keccak256_hex(crypto.unhex(tx.payload)))\n"
    "assert(tx.raw == nil)\n"
    "local sig = test_sign(tx.signing_hash)\n"
    "local signed = evm.eip1559(fields, sig)\n"
    "assert(signed.raw == '0x" V1559_RAW "', signed.raw)\n"
    "assert(signed.tx_hash == '0x' .. crypto.keccak256_hex(crypto.unhex(signed.raw)))\n"
    "assert(signed.from == test_address)\n"
    "assert(evm.eip1559(fields, sig.signature).raw == signed.raw, 'hex signature accepted')\n"
    "-- a fee bump is a different signing hash: the old approval does not cover it\n"
    "local bumped = {} for k, v in pairs(fields) do bumped[k] = v end\n"
    "bumped.max_fee_per_gas = 133334\n"
    "local b = evm.eip1559(bumped)\n"
    "assert(b.signing_hash ~= tx.signing_hash)\n"
    "assert(signer.recover(b.signing_hash, sig.signature) ~= test_address)\n"
    "-- contract creation: no `to`\n"
    "local c = fields.to fields.to = nil\n"
    "assert(evm.eip1559(fields).payload ~= tx.payload) fields.to = c\n"
    "local function bad(over, sig_)\n"
    "  local f = {} for k, v in pairs(fields) do f[k] = v end\n"
    "  for k, v in pairs(over) do f[k] = v end\n"
    "  if over.drop then f[over.drop] = nil; f.drop = nil end\n"
    "  local ok, err = pcall(evm.eip1559, f, sig_)\n"
    "  assert(not ok and err.kind == 'invalid', 'accepted a bad transaction')\n"
    "end\n"
    "bad{drop = 'chain_id'}\n"
    "bad{nonce = -1}\n"
    "bad{nonce = 1.5}\n"
    "bad{value = 2^53}\n"
    "bad{value = '-5'}\n"
    "bad{value = {}}\n"
    "bad{to = '0x1234'}\n"
    "bad{to = 5}\n"
    "bad{data = '0x123'}\n"
    "bad{data = 'abcd'}\n"
    "bad{access_list = 'x'}\n"
    "bad{access_list = {{address = '0x01'}}}\n"
    "bad{access_list = {{address = fields.to, storage_keys = {'0x00'}}}}\n"
    "bad({}, '0x1234')\n"
    "bad({}, sig.signature:sub(1, 130) .. '05')\n"
    "assert(not pcall(evm.eip1559, 'x'))\n"
    "return 'done'\n";

/* The host holds no signer key (qtgd signer does): this test signs in C
 * with the vector's key and hands Lua the signature, as the signer would. */
static qtg_keys *test_keys;

static int test_sign(lua_State *L) {
  uint8_t hash[32];
  qtg_signature sig;
  char hex[2 + 130 + 1];
  const char *h = luaL_checkstring(L, 1);
  if (qtg_signer_parse_hash(h, strlen(h), hash) != 0 ||
      qtg_keys_sign_hash(test_keys, "treasury", hash, &sig) != QTG_SIGNER_OK)
    return luaL_error(L, "test_sign failed");
  qtg_signer_signature_hex(&sig, hex);
  lua_createtable(L, 0, 2);
  lua_pushstring(L, hex);
  lua_setfield(L, -2, "signature");
  lua_pushinteger(L, sig.recid);
  lua_setfield(L, -2, "recid");
  return 1;
}

static void test_lua(void) {
  char dir[256], keyfile[300], keys_env[400];
  const char *env[] = {"MG_DATABASE_URL=postgresql://127.0.0.1:1/unused",
                       "MG_CONSOLE_ENABLED=false", "MG_WORKERS_ENABLED=false",
                       "MG_LOG_LEVEL=error", keys_env, NULL};
  const char *root = getenv("QTG_ROOT");
  qtg_settings s;
  qtg_host h;
  qtg_test_task_state st;
  char err[256] = "";
  FILE *f;

  snprintf(dir, sizeof dir, "%s/qtg-test-evm-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (mkdtemp(dir) == NULL) {
    tc.failed++;
    return;
  }
  snprintf(keyfile, sizeof keyfile, "%s/treasury.key", dir);
  f = fopen(keyfile, "w");
  if (f == NULL || fputs("0x" V1559_KEY "\n", f) < 0 || fclose(f) != 0 || chmod(keyfile, 0600) != 0) {
    tc.failed++;
    return;
  }
  snprintf(keys_env, sizeof keys_env, "MG_SIGNER_KEYS=treasury=%s", keyfile);
  memset(&s, 0, sizeof s);
  memset(&st, 0, sizeof st);
  if (qtg_settings_load(&s, qtg_test_env_lookup, env, err, sizeof err) != 0 ||
      qtg_host_init(&h, &s, root ? root : QTG_SOURCE_DIR) != 0) {
    fprintf(stderr, "cannot start a host: %s\n", err);
    tc.failed++;
  } else {
    qtg_keys_config kc = {NULL, NULL, NULL, keys_env + strlen("MG_SIGNER_KEYS="), 0, 0, NULL};
    uint8_t addr[20];
    char addrhex[43];
    if (qtg_keys_load(&kc, &test_keys, err, sizeof err) != 0 ||
        qtg_keys_signer_address(test_keys, "treasury", addr) != 0) {
      fprintf(stderr, "keys: %s\n", err);
      tc.failed++;
    }
    qtg_signer_address_hex(addr, addrhex);
    lua_pushstring(h.L, addrhex);
    lua_setglobal(h.L, "test_address");
    lua_pushcfunction(h.L, test_sign);
    lua_setglobal(h.L, "test_sign");
    if (luaL_loadstring(h.L, lua_evm_spec) != 0) {
      fprintf(stderr, "lua: %s\n", lua_tostring(h.L, -1));
      tc.failed++;
    } else {
      qtg_task_spawn(&h, "test_evm", 0, 0, qtg_test_task_done, &st);
      while (!st.done && uv_run(h.loop, UV_RUN_ONCE)) {
      }
    }
    CHECK(&tc, st.done && st.ok);
    CHECK_STR(&tc, st.result, "done");
    qtg_host_close(&h);
    qtg_keys_free(test_keys);
    test_keys = NULL;
  }
  qtg_settings_free(&s);
  unlink(keyfile);
  rmdir(dir);
}

int main(void) {
  test_rlp_examples();
  test_u256();
  test_eip155_signing_data();
  test_eip1559_vector();
  test_access_list_encoding();
  test_lua();
  return qtg_test_finish(&tc);
}
