/* test_signer.c -- EVM signing: key -> address vectors, EIP-55, the EIP-155
 * worked example's r and s, recovery, the SignRequest checks, the signer
 * key files (good, malformed, loose permissions), qtg.signer from Lua
 * inside a real host, and the approvers' enrolment, statement and Ed25519
 * (RFC 8032's first vector).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qtg_approvers.h"
#include "qtg_crypto.h"
#include "qtg_keys.h"
#include "qtg_settings.h"
#include "qtg_signer.h"
#include "qtg_signer_proto.h"
#include "qtg_test.h"
#include "qtg_test_host.h"

static qtg_test_counts tc;
static char tmpdir[256];

#define ANVIL0 "ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"
#define KEY46 "4646464646464646464646464646464646464646464646464646464646464646"
#define KEY1 "0000000000000000000000000000000000000000000000000000000000000001"
/* EIP-155's worked example: the unsigned legacy transaction and its hash. */
#define EIP155_PAYLOAD \
  "0xec098504a817c800825208943535353535353535353535353535353535353535880de0b6b3a764000080018080"
#define EIP155_HASH "0xdaf5a779ae972f972197303d7b574746c7ef83eadac0f2791ad23db92e4c8e53"
#define EIP155_R "28ef61340bd939bc2195fe537567866003e1a15d3c71ff63e1590620aa636276"
#define EIP155_S "67cbe9d8997f761aecb703304b3800ccf555c9f3dc64214b297fb1966a3b6d83"

static void seckey_of(const char *hex, uint8_t out[32]) {
  if (qtg_hex_decode(hex, 64, out) != 0) exit(2);
}

static void test_addresses(secp256k1_context *ctx) {
  static const struct {
    const char *key, *checksummed;
  } vectors[] = {
      {ANVIL0, "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"},
      {KEY1, "0x7E5F4552091A69125d5DfCb7b8C2659029395Bdf"},
  };
  uint8_t sk[32], addr[20];
  char hex[43], cs[43];
  for (size_t i = 0; i < sizeof vectors / sizeof *vectors; i++) {
    seckey_of(vectors[i].key, sk);
    CHECK(&tc, qtg_signer_seckey_valid(ctx, sk));
    CHECK(&tc, qtg_signer_address_of(ctx, sk, addr) == 0);
    qtg_signer_checksum_address(addr, cs);
    CHECK_STR(&tc, cs, vectors[i].checksummed);
    qtg_signer_address_hex(addr, hex);
    for (char *p = cs; *p; p++) *p = (char)(*p >= 'A' && *p <= 'F' ? *p + 32 : *p);
    CHECK_STR(&tc, hex, cs);                /* address_hex is lowercase */
  }
  seckey_of(KEY46, sk);
  CHECK(&tc, qtg_signer_address_of(ctx, sk, addr) == 0);
  qtg_signer_address_hex(addr, hex);
  CHECK_STR(&tc, hex, "0x9d8a62f656a8d1615c1294fd71e9cfb3e4855a4f");

  /* EIP-55's own examples. */
  {
    static const char *const eip55[] = {
        "0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed", "0xfB6916095ca1df60bB79Ce92cE3Ea74c37c5d359",
        "0xdbF03B407c01E7cD3CBea99509d93f8DDDC8C6FB", "0xD1220A0cf47c7B9Be7A2E6BA89F429762e7b9aDb"};
    for (size_t i = 0; i < 4; i++) {
      CHECK(&tc, qtg_signer_parse_address(eip55[i], 42, addr) == 0);
      qtg_signer_checksum_address(addr, cs);
      CHECK_STR(&tc, cs, eip55[i]);
    }
  }
  CHECK(&tc, qtg_signer_parse_address("0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAe", 41, addr) == -1);
  CHECK(&tc, qtg_signer_parse_address("005aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed", 42, addr) == -1);
  CHECK(&tc, qtg_signer_parse_address("0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAeg", 42, addr) == -1);

  /* Zero and the curve order are not keys. */
  memset(sk, 0, 32);
  CHECK(&tc, !qtg_signer_seckey_valid(ctx, sk));
  seckey_of("fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141", sk);
  CHECK(&tc, !qtg_signer_seckey_valid(ctx, sk));
}

static void test_eip155_signature(secp256k1_context *ctx) {
  uint8_t sk[32], hash[32], want_hash[32], addr[20], got[20];
  uint8_t *payload = NULL;
  size_t plen = 0;
  char r[65], s[65], sighex[133];
  qtg_signature sig, again;
  /* secp256k1's n / 2: a low-S signature has s <= this. */
  static const uint8_t half_n[32] = {
      0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
      0x5d, 0x57, 0x6e, 0x73, 0x57, 0xa4, 0x50, 0x1d, 0xdf, 0xe9, 0x2f, 0x46, 0x68, 0x1b, 0x20, 0xa0};

  CHECK(&tc, qtg_hex_decode_alloc(EIP155_PAYLOAD, strlen(EIP155_PAYLOAD), 1, &payload, &plen) == 0);
  qtg_keccak256(payload, plen, hash);
  free(payload);
  CHECK(&tc, qtg_signer_parse_hash(EIP155_HASH, strlen(EIP155_HASH), want_hash) == 0);
  CHECK(&tc, memcmp(hash, want_hash, 32) == 0);

  seckey_of(KEY46, sk);
  CHECK(&tc, qtg_signer_sign_hash(ctx, sk, hash, &sig) == 0);
  qtg_hex_encode(sig.r, 32, r);
  qtg_hex_encode(sig.s, 32, s);
  CHECK_STR(&tc, r, EIP155_R);
  CHECK_STR(&tc, s, EIP155_S);
  CHECK(&tc, sig.recid == 0);                 /* v = 37 = 0 + 35 + 2 * chain 1 */
  CHECK(&tc, memcmp(sig.s, half_n, 32) <= 0);
  CHECK(&tc, qtg_signer_sign_hash(ctx, sk, hash, &again) == 0);   /* RFC 6979 */
  CHECK(&tc, memcmp(&sig, &again, sizeof sig) == 0);
  qtg_signer_signature_hex(&sig, sighex);
  CHECK(&tc, strlen(sighex) == 132 && strncmp(sighex, "0x" EIP155_R EIP155_S, 130) == 0 &&
                 strcmp(sighex + 130, "00") == 0);

  CHECK(&tc, qtg_signer_address_of(ctx, sk, addr) == 0);
  CHECK(&tc, qtg_signer_recover(ctx, hash, &sig, got) == 0 && memcmp(got, addr, 20) == 0);
  /* A different hash or a flipped recovery id recovers someone else. */
  hash[0] ^= 1;
  CHECK(&tc, qtg_signer_recover(ctx, hash, &sig, got) != 0 || memcmp(got, addr, 20) != 0);
  hash[0] ^= 1;
  sig.recid ^= 1;
  CHECK(&tc, qtg_signer_recover(ctx, hash, &sig, got) != 0 || memcmp(got, addr, 20) != 0);
  sig.recid = 7;
  CHECK(&tc, qtg_signer_recover(ctx, hash, &sig, got) == -1);
}

static qtg_signer_code check(const char *ph, const char *allowed, const char *payload) {
  uint8_t hash[32];
  char msg[256];
  return qtg_signer_check_request(ph, ph ? strlen(ph) : 0, allowed, allowed ? strlen(allowed) : 0,
                                  payload, payload ? strlen(payload) : 0, hash, msg, sizeof msg);
}

static void test_sign_request_checks(void) {
  const char *other = "0x0000000000000000000000000000000000000000000000000000000000000001";
  uint8_t hash[32];
  char msg[256];
  CHECK(&tc, qtg_signer_check_request(EIP155_HASH, strlen(EIP155_HASH), EIP155_HASH,
                                      strlen(EIP155_HASH), EIP155_PAYLOAD, strlen(EIP155_PAYLOAD),
                                      hash, msg, sizeof msg) == QTG_SIGNER_OK);
  CHECK(&tc, hash[0] == 0xda && hash[31] == 0x53);
  /* Upper-case hex is the same hash. */
  CHECK(&tc, check("0xDAF5A779AE972F972197303D7B574746C7EF83EADAC0F2791AD23DB92E4C8E53", EIP155_HASH,
                   EIP155_PAYLOAD) == QTG_SIGNER_OK);
  /* Not the allowed hash, or a payload that does not hash to it. */
  CHECK(&tc, check(EIP155_HASH, other, EIP155_PAYLOAD) == QTG_SIGNER_PAYLOAD_HASH_MISMATCH);
  CHECK(&tc, check(other, other, EIP155_PAYLOAD) == QTG_SIGNER_PAYLOAD_HASH_MISMATCH);
  CHECK(&tc, check(EIP155_HASH, EIP155_HASH, "0xec09") == QTG_SIGNER_PAYLOAD_HASH_MISMATCH);
  CHECK(&tc, check(EIP155_HASH, EIP155_HASH, "0x") == QTG_SIGNER_PAYLOAD_HASH_MISMATCH);
  /* Malformed fields. */
  CHECK(&tc, check(NULL, EIP155_HASH, EIP155_PAYLOAD) == QTG_SIGNER_BAD_REQUEST);
  CHECK(&tc, check(EIP155_HASH, NULL, EIP155_PAYLOAD) == QTG_SIGNER_BAD_REQUEST);
  CHECK(&tc, check(EIP155_HASH, EIP155_HASH, NULL) == QTG_SIGNER_BAD_REQUEST);
  CHECK(&tc, check(EIP155_HASH + 2, EIP155_HASH, EIP155_PAYLOAD) == QTG_SIGNER_BAD_REQUEST);
  CHECK(&tc, check("0xdaf5", "0xdaf5", EIP155_PAYLOAD) == QTG_SIGNER_BAD_REQUEST);
  CHECK(&tc, check("0xzaf5a779ae972f972197303d7b574746c7ef83eadac0f2791ad23db92e4c8e53", EIP155_HASH,
                   EIP155_PAYLOAD) == QTG_SIGNER_BAD_REQUEST);
  CHECK(&tc, check(EIP155_HASH, EIP155_HASH, EIP155_PAYLOAD + 2) == QTG_SIGNER_BAD_REQUEST);
  CHECK(&tc, check(EIP155_HASH, EIP155_HASH, "0xec0") == QTG_SIGNER_BAD_REQUEST);
  CHECK(&tc, check(EIP155_HASH, EIP155_HASH, "0xeg") == QTG_SIGNER_BAD_REQUEST);
  CHECK_STR(&tc, qtg_signer_code_name(QTG_SIGNER_PAYLOAD_HASH_MISMATCH), "SIGNER_PAYLOAD_HASH_MISMATCH");
  CHECK_STR(&tc, qtg_signer_code_name(QTG_SIGNER_NOT_FOUND), "SIGNER_NOT_FOUND");
  CHECK_STR(&tc, qtg_signer_code_name(QTG_SIGNER_BAD_REQUEST), "SIGNER_BAD_REQUEST");
}

/* ---- signer key files -------------------------------------------------------- */

static void write_file(const char *path, const char *content, mode_t mode) {
  FILE *f;
  unlink(path);
  f = fopen(path, "wb");
  if (f == NULL || fwrite(content, 1, strlen(content), f) != strlen(content) || fclose(f) != 0 ||
      chmod(path, mode) != 0) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
}

static char *key_path(const char *name) {
  static char paths[8][512];
  static int next;
  char *p = paths[next++ % 8];
  snprintf(p, 512, "%s/%s", tmpdir, name);
  return p;
}

static int load_signers(const char *spec, qtg_keys **k, char *err, size_t errlen) {
  qtg_keys_config cfg = {NULL, NULL, NULL, spec, 0, 0, NULL};
  err[0] = '\0';
  return qtg_keys_load(&cfg, k, err, errlen);
}

static void test_key_files(void) {
  char spec[2048], err[512];
  qtg_keys *k = NULL;
  uint8_t addr[20], hash[32];
  char hex[43];
  qtg_signature sig;
  const char *bad_contents[] = {
      ANVIL0 "00",                       /* too long */
      "ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff8",   /* 63 digits */
      "zc0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80",  /* not hex */
      " " ANVIL0,                        /* blank */
      "0000000000000000000000000000000000000000000000000000000000000000",  /* zero */
      "fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141",  /* = n */
      "",
  };

  write_file(key_path("anvil.key"), "0x" ANVIL0 "\n", 0600);
  write_file(key_path("one.key"), KEY1, 0400);
  write_file(key_path("k46.key"), "0X4646464646464646464646464646464646464646464646464646464646464646\r\n", 0600);
  snprintf(spec, sizeof spec, " hot=%s , cold-1 = %s,k46=%s,", key_path("anvil.key"),
           key_path("one.key"), key_path("k46.key"));
  CHECK(&tc, load_signers(spec, &k, err, sizeof err) == 0);
  if (k == NULL) {
    fprintf(stderr, "%s\n", err);
    return;
  }
  /* the signer refuses a key file the daemon's uid owns (here: ours) */
  {
    qtg_keys *owned = NULL;
    qtg_keys_config guarded = {NULL, NULL, NULL, spec, 1, (long)getuid(), NULL};
    err[0] = '\0';
    CHECK(&tc, qtg_keys_load(&guarded, &owned, err, sizeof err) == -1 && owned == NULL &&
                   strstr(err, "is owned by uid") != NULL);
    guarded.signer_key_refused_uid = (long)getuid() + 1;
    CHECK(&tc, qtg_keys_load(&guarded, &owned, err, sizeof err) == 0 && owned != NULL);
    qtg_keys_free(owned);
  }
  CHECK(&tc, qtg_keys_signer_count(k) == 3);
  CHECK_STR(&tc, qtg_keys_signer_name(k, 0), "hot");
  CHECK_STR(&tc, qtg_keys_signer_name(k, 1), "cold-1");
  CHECK_STR(&tc, qtg_keys_signer_name(k, 2), "k46");
  CHECK(&tc, qtg_keys_signer_name(k, 3) == NULL);
  CHECK(&tc, qtg_keys_signer_address(k, "hot", addr) == 0);
  qtg_signer_address_hex(addr, hex);
  CHECK_STR(&tc, hex, "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266");
  CHECK(&tc, qtg_keys_signer_address(k, "cold-1", addr) == 0);
  qtg_signer_address_hex(addr, hex);
  CHECK_STR(&tc, hex, "0x7e5f4552091a69125d5dfcb7b8c2659029395bdf");
  CHECK(&tc, qtg_keys_signer_address(k, "nope", addr) == -1);
  CHECK(&tc, qtg_signer_parse_hash(EIP155_HASH, strlen(EIP155_HASH), hash) == 0);
  CHECK(&tc, qtg_keys_sign_hash(k, "k46", hash, &sig) == QTG_SIGNER_OK);
  {
    char rhex[65];
    qtg_hex_encode(sig.r, 32, rhex);
    CHECK_STR(&tc, rhex, EIP155_R);
  }
  CHECK(&tc, qtg_keys_sign_hash(k, "nope", hash, &sig) == QTG_SIGNER_NOT_FOUND);
  CHECK(&tc, qtg_keys_sign_hash(k, NULL, hash, &sig) == QTG_SIGNER_NOT_FOUND);
  qtg_keys_free(k);

  /* No signer keys configured: fine, just none. */
  CHECK(&tc, load_signers("", &k, err, sizeof err) == 0 && qtg_keys_signer_count(k) == 0);
  qtg_keys_free(k);

  /* Each malformed file is refused, naming the setting, the file and the
   * key, never its content. */
  for (size_t i = 0; i < sizeof bad_contents / sizeof *bad_contents; i++) {
    write_file(key_path("bad.key"), bad_contents[i], 0600);
    snprintf(spec, sizeof spec, "good=%s,broken=%s", key_path("anvil.key"), key_path("bad.key"));
    CHECK(&tc, load_signers(spec, &k, err, sizeof err) == -1 && k == NULL);
    CHECK(&tc, strstr(err, "MG_SIGNER_KEYS") && strstr(err, key_path("bad.key")) &&
                   strstr(err, "broken"));
    CHECK(&tc, bad_contents[i][0] == '\0' || bad_contents[i][0] == ' ' ||
                   strstr(err, bad_contents[i]) == NULL);
    CHECK(&tc, strstr(err, ANVIL0) == NULL && strstr(err, "ac0974bec39a17e3") == NULL);
  }

  /* Loose permissions, a missing file. */
  write_file(key_path("loose.key"), ANVIL0, 0644);
  snprintf(spec, sizeof spec, "loose=%s", key_path("loose.key"));
  CHECK(&tc, load_signers(spec, &k, err, sizeof err) == -1);
  CHECK(&tc, strstr(err, "MG_SIGNER_KEYS") && strstr(err, key_path("loose.key")) && strstr(err, "0644"));
  CHECK(&tc, strstr(err, ANVIL0) == NULL);
  write_file(key_path("loose.key"), ANVIL0, 0660);
  CHECK(&tc, load_signers(spec, &k, err, sizeof err) == -1 && strstr(err, "0660"));
  snprintf(spec, sizeof spec, "gone=%s", key_path("missing.key"));
  CHECK(&tc, load_signers(spec, &k, err, sizeof err) == -1 && strstr(err, key_path("missing.key")) &&
                 strstr(err, "No such file"));

  /* Malformed MG_SIGNER_KEYS. */
  snprintf(spec, sizeof spec, "a=%s,a=%s", key_path("anvil.key"), key_path("one.key"));
  CHECK(&tc, load_signers(spec, &k, err, sizeof err) == -1 && strstr(err, "twice"));
  snprintf(spec, sizeof spec, "a b=%s", key_path("anvil.key"));
  CHECK(&tc, load_signers(spec, &k, err, sizeof err) == -1 && strstr(err, "key name"));
  snprintf(spec, sizeof spec, "=%s", key_path("anvil.key"));
  CHECK(&tc, load_signers(spec, &k, err, sizeof err) == -1 && strstr(err, "key name"));
  CHECK(&tc, load_signers("hot", &k, err, sizeof err) == -1 && strstr(err, "name=/path"));
  CHECK(&tc, load_signers("hot=", &k, err, sizeof err) == -1 && strstr(err, "path"));
}

/* ---- qtg.signer from Lua inside a real host ----------------------------------- */




static const char lua_signer_spec[] =
    "local qtg = require 'qtg'\n"
    "local signer = qtg.signer\n"
    "assert(signer.checksum_address('0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266') == '0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266')\n"
    "local ok, err = pcall(signer.checksum_address, '0x1234')\n"
    "assert(not ok and err.kind == 'invalid')\n"
    "local payload = '" EIP155_PAYLOAD "'\n"
    "local hash = '" EIP155_HASH "'\n"
    "local function request(over)\n"
    "  local r = {protocol_version = '1.0', request_id = 'r1', request_node_id = 'n1',\n"
    "    payload_format = 'evm_legacy_unsigned', payload = payload, payload_hash = hash,\n"
    "    signing_intent = {action = 'transfer', chain_family = 'evm', allowed_payload_hash = hash}}\n"
    "  for k, v in pairs(over or {}) do r[k] = v end\n"
    "  return r\n"
    "end\n"
    "-- the host holds no key: every key operation goes to qtgd signer, which\n"
    "-- is not running here: unavailable (retryable), never a refusal\n"
    "local sig, e = signer.sign('k46', request{attempt_no = 1,\n"
    "  request_id = '00000000-0000-0000-0000-000000000001', request_node_id = '00000000-0000-0000-0000-000000000002'})\n"
    "assert(sig == nil and e.kind == 'signer_unavailable', tostring(e and e.kind))\n"
    "local a, e1 = signer.address('k46')\n"
    "assert(a == nil and e1.kind == 'signer_unavailable')\n"
    "assert(#signer.keys() == 0)\n"
    "local hh = signer.health('k46')\n"
    "assert(hh.ok == false and hh.code == 'SIGNER_UNAVAILABLE')\n"
    "local r0, e0 = signer.sign('k46', request{attempt_no = 0})\n"
    "assert(r0 == nil and e0.code == 'SIGNER_BAD_REQUEST')\n"
    "local r1, e3 = signer.sign('bad name', request())\n"
    "assert(r1 == nil and e3.code == 'SIGNER_BAD_REQUEST')\n"
    "assert(signer.socket_path():match('signer.sock$'))\n"
    "local r2, e2 = signer.recover(hash, '0x1234')\n"
    "assert(r2 == nil and e2.code == 'SIGNER_BAD_REQUEST')\n"
    "-- no key bytes anywhere in the Lua state\n"
    "local needles = {'" ANVIL0 "', '" KEY46 "', string.rep('F', 32)}\n"
    "local found, visited = nil, {}\n"
    "local function walk(v)\n"
    "  local t = type(v)\n"
    "  if t == 'string' then\n"
    "    for _, n in ipairs(needles) do if v ~= n and v:lower():find(n:lower(), 1, true) then found = v end end\n"
    "    return\n"
    "  end\n"
    "  if (t ~= 'table' and t ~= 'function' and t ~= 'userdata' and t ~= 'thread') or visited[v] then return end\n"
    "  visited[v] = true\n"
    "  if t == 'table' and v ~= needles then for k, x in next, v do walk(k) walk(x) end end\n"
    "  if t == 'function' then\n"
    "    for i = 1, 255 do local n, x = debug.getupvalue(v, i) if not n then break end walk(x) end\n"
    "  end\n"
    "  local mt = debug.getmetatable(v) if mt then walk(mt) end\n"
    "end\n"
    "walk(debug.getregistry()) walk(_G)\n"
    "assert(not found, 'key material reachable from Lua')\n"
    "needles = {'checksum_addr'} visited = {} walk(debug.getregistry())\n"
    "assert(found, 'the walk cannot see qtg.signer')\n"
    "return 'done'\n";

static void test_lua(void) {
  char keys_env[1200], socket_env[320];
  /* a socket of its own, where nothing listens: a signer that another test
   * runs at the default path must not answer this one */
  const char *env[] = {"MG_DATABASE_URL=postgresql://127.0.0.1:1/unused",
                       "MG_CONSOLE_ENABLED=false", "MG_WORKERS_ENABLED=false",
                       "MG_LOG_LEVEL=error", keys_env, socket_env, NULL};
  const char *root = getenv("QTG_ROOT");
  qtg_settings s;
  qtg_host h;
  qtg_test_task_state st;
  char err[256] = "";

  write_file(key_path("lua-hot.key"), ANVIL0 "\n", 0600);
  write_file(key_path("lua-k46.key"), KEY46, 0600);
  snprintf(keys_env, sizeof keys_env, "MG_SIGNER_KEYS=hot=%s,k46=%s", key_path("lua-hot.key"),
           key_path("lua-k46.key"));
  snprintf(socket_env, sizeof socket_env, "MG_SIGNER_SOCKET=%s", key_path("signer.sock"));
  memset(&s, 0, sizeof s);
  if (qtg_settings_load(&s, qtg_test_env_lookup, env, err, sizeof err) != 0 ||
      qtg_host_init(&h, &s, root ? root : QTG_SOURCE_DIR) != 0) {
    fprintf(stderr, "cannot start a host: %s\n", err);
    tc.failed++;
    return;
  }
  memset(&st, 0, sizeof st);
  if (luaL_loadstring(h.L, lua_signer_spec) != 0) {
    fprintf(stderr, "lua: %s\n", lua_tostring(h.L, -1));
    tc.failed++;
  } else {
    qtg_task_spawn(&h, "test_signer", 0, 0, qtg_test_task_done, &st);
    while (!st.done && uv_run(h.loop, UV_RUN_ONCE)) {
    }
  }
  CHECK(&tc, st.done && st.ok);
  CHECK_STR(&tc, st.result, "done");
  qtg_host_close(&h);
  qtg_settings_free(&s);

  /* The host never opens MG_SIGNER_KEYS (qtgd signer does): a loose key
   * file does not concern it. */
  write_file(key_path("lua-k46.key"), KEY46, 0604);
  memset(&s, 0, sizeof s);
  CHECK(&tc, qtg_settings_load(&s, qtg_test_env_lookup, env, err, sizeof err) == 0);
  CHECK(&tc, qtg_host_init(&h, &s, root ? root : QTG_SOURCE_DIR) == 0);
  qtg_host_close(&h);
  qtg_settings_free(&s);
}

/* The signer's request line and payload decoding (qtg_signer_proto.c). */
#define U1 "00000000-0000-4000-8000-000000000001"
#define U2 "00000000-0000-4000-8000-000000000002"
#define TX "02f2827a6980843b9aca00852e90edd00082520894000000000000000000000000000000000000aaaa880de0b6b3a764000080c0"

static int parse(const char *line, qtg_signer_line *l) {
  char err[160];
  return qtg_signer_line_parse(line, strlen(line), l, err, sizeof err);
}

static void test_proto(void) {
  qtg_signer_line l;
  qtg_eip1559_tx tx;
  qtg_u256 v, w;
  char err[160], dec[80];
  CHECK(&tc, parse("SIGN " U1 " " U2 " 7 evm_hot 0x" TX, &l) == 0);
  CHECK(&tc, l.verb == QTG_SIGNER_VERB_SIGN && l.attempt == 7 && strcmp(l.key, "evm_hot") == 0);
  CHECK(&tc, strcmp(l.request_id, U1) == 0 && strcmp(l.node_id, U2) == 0 && l.payload_len == 52);
  CHECK(&tc, qtg_eip1559_decode(l.payload, l.payload_len, &tx, err, sizeof err) == 0);
  qtg_u256_decimal(&tx.value, dec, sizeof dec);
  CHECK_STR(&tc, dec, "1000000000000000000");
  qtg_u256_decimal(&tx.chain_id, dec, sizeof dec);
  CHECK_STR(&tc, dec, "31337");
  CHECK(&tc, tx.has_to && tx.to[18] == 0xaa && tx.data_len == 0);
  /* a non-canonical integer (leading zero byte) and trailing bytes: refused */
  l.payload[3] = 0x00;
  CHECK(&tc, qtg_eip1559_decode(l.payload, l.payload_len, &tx, err, sizeof err) == -1);
  qtg_signer_line_free(&l);
  static const char *const bad[] = {
      "", "KEYS ", "KEYS x", "ADDRESS", "ADDRESS a b", "ADDRESS bad/name", "sign " U1 " " U2 " 1 k 0x00",
      "SIGN " U1 " " U2 " 0 k 0x00", "SIGN " U1 " " U2 " 01 k 0x00", "SIGN " U1 " " U2 " 1 k 0x0",
      "SIGN " U1 " " U2 " 1 k 00", "SIGN " U1 " " U2 " 1 k 0x", "SIGN " U1 " " U2 " 99999999999 k 0x00",
      "SIGN " U1 "  " U2 " 1 k 0x00", "SIGN 00000000-0000-4000-8000-00000000000A " U2 " 1 k 0x00",
      "SIGN " U1 " " U2 " 1 k 0x00 extra", "SIGN " U1 " " U2 " 1 k 0x00\r", NULL};
  for (int i = 0; bad[i]; i++) {
    CHECK(&tc, parse(bad[i], &l) == -1);
  }
  CHECK(&tc, parse("KEYS", &l) == 0 && l.verb == QTG_SIGNER_VERB_KEYS);
  CHECK(&tc, parse("ADDRESS evm.hot-1", &l) == 0 && l.verb == QTG_SIGNER_VERB_ADDRESS);
  CHECK(&tc, parse("APPROVALS", &l) == 0 && l.verb == QTG_SIGNER_VERB_APPROVALS);
  CHECK(&tc, parse("APPROVALS x", &l) == -1 && parse("APPROVALS ", &l) == -1 && parse("APPROVAL", &l) == -1);
  /* FILL: key, payload, principal, a signature (lowercased) or "-" */
  {
    char sig128[129], line[512];
    memset(sig128, 'A', 128);
    sig128[128] = '\0';
    snprintf(line, sizeof line, "FILL evm_hot 0x" TX " operator:alice %s", sig128);
    CHECK(&tc, parse(line, &l) == 0 && l.verb == QTG_SIGNER_VERB_FILL && strcmp(l.key, "evm_hot") == 0 &&
                   strcmp(l.principal, "operator:alice") == 0 && l.payload_len == 52 && l.signature[0] == 'a' &&
                   strlen(l.signature) == 128);
    qtg_signer_line_free(&l);
    CHECK(&tc, parse("FILL evm_hot 0x" TX " console:0 -", &l) == 0 && l.signature[0] == '\0' &&
                   strcmp(l.principal, "console:0") == 0);
    qtg_signer_line_free(&l);
    const char *bad_fills[] = {"FILL evm_hot 0x" TX " operator:alice", "FILL evm_hot 0x" TX " alice -",
                               "FILL evm_hot 0x" TX " operator: -", "FILL evm_hot 0x" TX " :alice -",
                               "FILL evm_hot 0x" TX " operator:a,b -", "FILL evm_hot 0x" TX " operator:alice --",
                               "FILL evm_hot 0x" TX " operator:alice 00", "FILL evm_hot 0x0 operator:alice -",
                               "FILL bad/key 0x" TX " operator:alice -", "FILL 0x" TX " operator:alice -",
                               "FILL evm_hot 0x" TX " operator:alice - extra", NULL};
    for (int i = 0; bad_fills[i]; i++) CHECK(&tc, parse(bad_fills[i], &l) == -1);
    sig128[5] = 'g';
    snprintf(line, sizeof line, "FILL evm_hot 0x" TX " operator:alice %s", sig128);
    CHECK(&tc, parse(line, &l) == -1);
  }
  /* exact decimal amounts */
  CHECK(&tc, qtg_amount_to_units("0.25", 4, 18, &v) == 0);
  qtg_u256_decimal(&v, dec, sizeof dec);
  CHECK_STR(&tc, dec, "250000000000000000");
  CHECK(&tc, qtg_amount_to_units("1.000000000000000001", 20, 18, &w) == 0);
  qtg_u256_decimal(&w, dec, sizeof dec);
  CHECK_STR(&tc, dec, "1000000000000000001");
  CHECK(&tc, qtg_u256_cmp(&v, &w) < 0);
  /* MG_SIGNER_KEY_CLASSES */
  static const char *const good_classes[] = {"", "hot=mainnet", "hot=mainnet|base,dev.k-1=dev", NULL};
  for (int i = 0; good_classes[i]; i++)
    CHECK(&tc, qtg_signer_classes_check(good_classes[i], err, sizeof err) == 0);
  static const char *const bad_classes[] = {
      "hot", "hot=", "=mainnet", "hot=main net", "hot=Mainnet", "hot=a||b", "hot=a|", "hot=|a",
      "hot=a,", ",hot=a", "hot=a,,b=c", "h/t=a", "hot=a=b",
      "hot=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", NULL};
  for (int i = 0; bad_classes[i]; i++) {
    err[0] = '\0';
    CHECK(&tc, qtg_signer_classes_check(bad_classes[i], err, sizeof err) == -1 && err[0] != '\0');
  }
  const char *spec = "hot=mainnet|base,dev=dev";
  CHECK(&tc, qtg_signer_key_serves_class(spec, "hot", "mainnet") == 1);
  CHECK(&tc, qtg_signer_key_serves_class(spec, "hot", "base") == 1);
  CHECK(&tc, qtg_signer_key_serves_class(spec, "hot", "dev") == 0);
  CHECK(&tc, qtg_signer_key_serves_class(spec, "hot", "main") == 0);
  CHECK(&tc, qtg_signer_key_serves_class(spec, "hot", "mainnet2") == 0);
  CHECK(&tc, qtg_signer_key_serves_class(spec, "ho", "mainnet") == 0);
  CHECK(&tc, qtg_signer_key_serves_class(spec, "dev", "dev") == 1);
  CHECK(&tc, qtg_signer_key_serves_class(spec, "cold", "mainnet") == 0);
  CHECK(&tc, qtg_signer_key_serves_class(spec, "dev", "") == 0);
  CHECK(&tc, qtg_signer_key_serves_class("", "cold", "anything") == 1);
  CHECK(&tc, qtg_signer_classes_name(spec, "dev") == 1 && qtg_signer_classes_name(spec, "de") == 0);
  static const char *const bad_amounts[] = {"1.0000000000000000001", "-1", "1e18", ".5", "5.", "1..2", " 1", "0x10", NULL};
  for (int i = 0; bad_amounts[i]; i++)
    CHECK(&tc, qtg_amount_to_units(bad_amounts[i], strlen(bad_amounts[i]), 18, &v) == -1);
}

/* RFC 8032 section 7.1, TEST 1: the empty message. */
#define ED_SECRET "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"
#define ED_PUBLIC "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
#define ED_SIG \
  "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
#define ED_OTHER "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c"

/* the deployment line every enrolment needs, for the cases about others */
#define DEPLOY "deployment desk-1\n"

static qtg_approvers *enrolment(const char *text) {
  char err[512];
  qtg_approvers *a = NULL;
  if (qtg_approvers_parse(text, strlen(text), &a, err, sizeof err) != 0) {
    fprintf(stderr, "enrolment refused: %s\n", err);
    return NULL;
  }
  return a;
}

static void test_approvers(void) {
  uint8_t secret[32], pub[32], sig[64];
  char hex[129], err[512], st[QTG_APPROVAL_STATEMENT_MAX];
  seckey_of(ED_SECRET, secret);
  CHECK(&tc, qtg_approver_public_key(secret, pub) == 0);
  qtg_hex_encode(pub, 32, hex);
  CHECK_STR(&tc, hex, ED_PUBLIC);
  CHECK(&tc, qtg_approver_sign(secret, "", 0, sig) == 0);
  qtg_hex_encode(sig, 64, hex);
  CHECK_STR(&tc, hex, ED_SIG);

  qtg_approvers *a = enrolment(
      "# two people\n"
      "deployment treasury-eu.1  # which deployment this file serves\n"
      "person alice ed25519:" ED_PUBLIC " operator:alice,api:alice-bot  # her laptop too\n"
      "\n"
      "  person\tbob ed25519:" ED_OTHER " operator:bob\r\n"
      "quorum mainnet 2\nquorum * 1\n");
  CHECK(&tc, a != NULL);
  if (a == NULL) return;
  CHECK(&tc, qtg_approvers_count(a) == 2);
  int alice = qtg_approvers_person_of(a, "api:alice-bot");
  CHECK(&tc, alice >= 0 && qtg_approvers_person_of(a, "operator:alice") == alice);
  CHECK_STR(&tc, qtg_approvers_person_name(a, alice), "alice");
  CHECK_STR(&tc, qtg_approvers_person_name(a, qtg_approvers_person_of(a, "operator:bob")), "bob");
  CHECK(&tc, qtg_approvers_person_of(a, "operator:ali") == -1);
  CHECK(&tc, qtg_approvers_person_of(a, "operator:alicex") == -1);
  CHECK(&tc, qtg_approvers_person_of(a, "") == -1 && qtg_approvers_person_of(a, NULL) == -1);
  CHECK(&tc, qtg_approvers_quorum(a, "mainnet") == 2 && qtg_approvers_quorum(a, "dev") == 1);
  CHECK_STR(&tc, qtg_approvers_deployment(a), "treasury-eu.1");
  CHECK(&tc, qtg_approvers_initiation_signed(a) == 0 && qtg_approvers_count_persons(a) == 2);
  /* the vector verifies for alice only, and nothing altered does */
  CHECK(&tc, qtg_approvers_verify(a, alice, "", 0, ED_SIG) == 1);
  CHECK(&tc, qtg_approvers_verify(a, 1 - alice, "", 0, ED_SIG) == 0);
  CHECK(&tc, qtg_approvers_verify(a, alice, "x", 1, ED_SIG) == 0);
  char bent[129];
  snprintf(bent, sizeof bent, "%s", ED_SIG);
  bent[10] = bent[10] == '0' ? '1' : '0';
  CHECK(&tc, qtg_approvers_verify(a, alice, "", 0, bent) == 0);
  snprintf(bent, sizeof bent, "%s", ED_SIG);
  bent[0] = 'E';                                         /* upper case: not the one form */
  CHECK(&tc, qtg_approvers_verify(a, alice, "", 0, bent) == 0);
  CHECK(&tc, qtg_approvers_verify(a, alice, "", 0, "e556") == 0);
  CHECK(&tc, qtg_approvers_verify(a, -1, "", 0, ED_SIG) == 0 && qtg_approvers_verify(a, 7, "", 0, ED_SIG) == 0);
  qtg_approvers_free(a);
  a = enrolment(DEPLOY "quorum mainnet 0\n");
  CHECK(&tc, a != NULL && qtg_approvers_quorum(a, "mainnet") == 0 && qtg_approvers_quorum(a, "dev") == -1);
  qtg_approvers_free(a);
  /* the classes at a quorum (0, 1), for the signer's warnings at start */
  a = enrolment(DEPLOY "quorum mainnet 2\nquorum dev 0\nquorum * 0\n");
  CHECK(&tc, a != NULL && qtg_approvers_classes_at(a, 0, st, sizeof st) == 2);
  CHECK_STR(&tc, st, "dev,*");
  CHECK(&tc, qtg_approvers_classes_at(a, 0, st, 4) == 2 && strcmp(st, "dev") == 0);
  /* the range of its quorums: unbound keys need one quorum for all */
  int lowest = 7, highest = 7;
  CHECK(&tc, qtg_approvers_quorum_range(a, &lowest, &highest) == 3 && lowest == 0 && highest == 2);
  qtg_approvers_free(a);
  CHECK(&tc, qtg_approvers_quorum_range(NULL, &lowest, &highest) == 0 && lowest == -1 && highest == -1);
  a = enrolment(DEPLOY "quorum * 1\n");
  CHECK(&tc, a != NULL && qtg_approvers_quorum_range(a, &lowest, &highest) == 1 && lowest == 1 && highest == 1);
  /* the digest is the text's: the same file gives the same, any edit another */
  qtg_approvers *same = enrolment(DEPLOY "quorum * 1\n"), *other = enrolment(DEPLOY "quorum * 1\n\n");
  const char *dg = qtg_approvers_digest(a);
  CHECK(&tc, dg != NULL && strlen(dg) == 64 && strspn(dg, "0123456789abcdef") == 64);
  CHECK(&tc, same != NULL && other != NULL && strcmp(dg, qtg_approvers_digest(same)) == 0 &&
                 strcmp(dg, qtg_approvers_digest(other)) != 0);
  CHECK(&tc, qtg_approvers_digest(NULL) == NULL);
  qtg_approvers_free(same);
  qtg_approvers_free(other);
  CHECK(&tc, a != NULL && qtg_approvers_classes_at(a, 0, st, sizeof st) == 0 && st[0] == '\0');
  CHECK(&tc, a != NULL && qtg_approvers_classes_at(a, 1, st, sizeof st) == 1 && strcmp(st, "*") == 0);
  qtg_approvers_free(a);

  static const char *const bad[] = {
      "",                                                             /* no quorum */
      "# nothing\n",
      DEPLOY,                                                         /* no quorum */
      "quorum mainnet 2\n",                                           /* no deployment */
      "person alice ed25519:" ED_PUBLIC " operator:a\nquorum mainnet 2\n",
      DEPLOY "deployment desk-2\nquorum mainnet 2\n",                  /* named twice */
      DEPLOY "deployment desk-1\nquorum mainnet 2\n",
      "deployment desk/1\nquorum mainnet 2\n",                        /* not a name */
      "deployment\nquorum mainnet 2\n", "deployment a b\nquorum mainnet 2\n",
      "deployment aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\nquorum mainnet 2\n",
      /* a '#' inside a field is a typo, not a comment ("api:al" would be enrolled) */
      DEPLOY "quorum mainnet 2\nperson alice ed25519:" ED_PUBLIC " operator:a,api:al#ice\n",
      DEPLOY "quorum mainnet 2#\n", "deployment desk#1\nquorum mainnet 2\n",
      /* initiators: the key and the principals are one entry's, like a person's */
      DEPLOY "quorum mainnet 2\ninitiator bot ed25519:" ED_PUBLIC " api:bot\nperson alice ed25519:" ED_PUBLIC " operator:a\n",
      DEPLOY "quorum mainnet 2\ninitiator bot ed25519:" ED_OTHER " api:bot\nperson alice ed25519:" ED_PUBLIC " api:bot\n",
      DEPLOY "quorum mainnet 2\ninitiator alice ed25519:" ED_OTHER " api:bot\nperson alice ed25519:" ED_PUBLIC " operator:a\n",
      DEPLOY "quorum mainnet 2\ninitiator bot ed25519:" ED_OTHER "\n",
      DEPLOY "quorum mainnet 2\ninitiation signed\ninitiation signed\n",
      DEPLOY "quorum mainnet 2\ninitiation unsigned\n", DEPLOY "quorum mainnet 2\ninitiation\n",
      DEPLOY "quorum mainnet 2\nperson alice ed25519:" ED_PUBLIC "\n",       /* no principal */
      DEPLOY "quorum mainnet 2\nperson alice " ED_PUBLIC " operator:a\n",    /* no ed25519: */
      DEPLOY "quorum mainnet 2\nperson alice ed25519:D75A980182B10AB7D54BFED3C964073A0EE172F3DAA62325AF021A68F707511A operator:a\n",
      DEPLOY "quorum mainnet 2\nperson alice ed25519:d75a98 operator:a\n",
      DEPLOY "quorum mainnet 2\nperson al/ce ed25519:" ED_PUBLIC " operator:a\n",
      DEPLOY "quorum mainnet 2\nperson alice ed25519:" ED_PUBLIC " alice\n",
      DEPLOY "quorum mainnet 2\nperson alice ed25519:" ED_PUBLIC " operator:\n",
      DEPLOY "quorum mainnet 2\nperson alice ed25519:" ED_PUBLIC " :alice\n",
      DEPLOY "quorum mainnet 2\nperson alice ed25519:" ED_PUBLIC " operator:a,\n",
      DEPLOY "quorum mainnet 2\nperson alice ed25519:" ED_PUBLIC " operator:a,,api:b\n",
      DEPLOY "quorum mainnet 2\nperson alice ed25519:" ED_PUBLIC " Operator:a\n",
      DEPLOY "quorum mainnet 2\nperson alice ed25519:" ED_PUBLIC " operator:a extra\n",
      DEPLOY "quorum mainnet 2\nperson alice ed25519:" ED_PUBLIC " operator:a\nperson alice ed25519:" ED_OTHER " operator:b\n",
      DEPLOY "quorum mainnet 2\nperson alice ed25519:" ED_PUBLIC " operator:a\nperson bob ed25519:" ED_PUBLIC " operator:b\n",
      DEPLOY "quorum mainnet 2\nperson alice ed25519:" ED_PUBLIC " operator:a\nperson bob ed25519:" ED_OTHER " operator:a\n",
      DEPLOY "quorum mainnet 2\nperson alice ed25519:" ED_PUBLIC " operator:a,operator:a\n",
      DEPLOY "quorum mainnet 2\nquorum mainnet 3\n",
      DEPLOY "quorum mainnet 101\n", DEPLOY "quorum mainnet -1\n", DEPLOY "quorum mainnet 2x\n", DEPLOY "quorum mainnet\n",
      DEPLOY "quorum Mainnet 2\n", DEPLOY "quorum main net 2\n", DEPLOY "quorum ** 2\n", DEPLOY "quorum mainnet 0002\n",
      DEPLOY "quorum mainnet 2\napprover alice\n",
      DEPLOY "quorum mainnet 2\nperson alice ed25519:" ED_PUBLIC " operator:a\x01\n",
      DEPLOY "quorum mainnet 2\nperson aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa ed25519:" ED_PUBLIC " operator:a\n",
      NULL};
  for (int i = 0; bad[i]; i++) {
    err[0] = '\0';
    a = NULL;
    int rc = qtg_approvers_parse(bad[i], strlen(bad[i]), &a, err, sizeof err);
    CHECK(&tc, rc == -1 && a == NULL && err[0] != '\0');
    if (rc == 0) fprintf(stderr, "  accepted: %s\n", bad[i]);
  }
  /* a public key of small order (the identity, the points of order 2, 4
   * and 8, non-canonical spellings of them): the signature R = identity,
   * S = 0 verifies for the identity key whatever the message, and others
   * are forged as cheaply, so such a key is refused at enrolment */
  {
    static const char *const small[] = {
        "0100000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000080",
        "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
        "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
        "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        NULL};
    char text[300], forged[129];
    snprintf(forged, sizeof forged, "01%0126d", 0);
    for (int i = 0; small[i]; i++) {
      snprintf(text, sizeof text, DEPLOY "person eve ed25519:%s operator:eve\nquorum * 1\n", small[i]);
      a = NULL;
      int rc = qtg_approvers_parse(text, strlen(text), &a, err, sizeof err);
      CHECK(&tc, rc == -1 && a == NULL && strstr(err, "small order"));
      if (rc == 0) {
        fprintf(stderr, "  accepted the small-order key %s (forged signature verifies: %d)\n", small[i],
                qtg_approvers_verify(a, 0, "qtg-approval-v3\n", 16, forged));
        qtg_approvers_free(a);
      }
    }
  }
  static const char nul[] = "quorum mainnet 2\0\n";
  CHECK(&tc, qtg_approvers_parse(nul, sizeof nul - 1, &a, err, sizeof err) == -1);
  {
    size_t n = 5000;
    char *big = malloc(n + 32);
    if (big != NULL) {
      memset(big, ' ', n);
      snprintf(big + n, 32, "quorum mainnet 2\n");
      CHECK(&tc, qtg_approvers_parse(big, strlen(big), &a, err, sizeof err) == -1 && strstr(err, "longer"));
      free(big);
    }
  }

  /* the statement: one form, rebuilt byte for byte */
  const char *req = "0b6d1c2e-1111-4222-8333-944455556666";
  const char *d64 = "00000000000000000000000000000000000000000000000000000000000000aa";
  CHECK(&tc, qtg_request_statement(st, sizeof st, QTG_STATEMENT_APPROVAL, "desk-1", req, "mainnet", d64, d64) == 0);
  CHECK(&tc, qtg_request_statement_check(st, strlen(st)) == 0);
  CHECK(&tc, strncmp(st, "qtg-approval-v3\ndeployment desk-1\nrequest 0b6d1c2e-", 51) == 0 &&
                 st[strlen(st) - 1] == '\n');
  CHECK(&tc, qtg_request_statement_check(st, strlen(st) - 1) == -1);
  char longer[QTG_APPROVAL_STATEMENT_MAX + 8];
  snprintf(longer, sizeof longer, "%sx", st);
  CHECK(&tc, qtg_request_statement_check(longer, strlen(longer)) == -1);
  /* the longest facts fit */
  char widest[QTG_APPROVAL_STATEMENT_MAX];
  CHECK(&tc, qtg_request_statement(widest, sizeof widest, QTG_STATEMENT_APPROVAL,
                                    "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd", req,
                                    "cccccccccccccccccccccccccccccccc", d64, d64) == 0 &&
                 qtg_request_statement_check(widest, strlen(widest)) == 0);
  CHECK(&tc, qtg_request_statement(st, sizeof st, QTG_STATEMENT_APPROVAL, "desk-1", "0B6D1C2E-1111-4222-8333-944455556666", "mainnet", d64, d64) == -1);
  CHECK(&tc, qtg_request_statement(st, sizeof st, QTG_STATEMENT_APPROVAL, "desk-1", req, "Mainnet", d64, d64) == -1);
  CHECK(&tc, qtg_request_statement(st, sizeof st, QTG_STATEMENT_APPROVAL, "desk-1", req, "mainnet", "AA", d64) == -1);
  CHECK(&tc, qtg_request_statement(st, sizeof st, QTG_STATEMENT_APPROVAL, "desk-1", req, "mainnet", d64, NULL) == -1);
  CHECK(&tc, qtg_request_statement(st, sizeof st, QTG_STATEMENT_APPROVAL, "", req, "mainnet", d64, d64) == -1);
  CHECK(&tc, qtg_request_statement(st, sizeof st, QTG_STATEMENT_APPROVAL, NULL, req, "mainnet", d64, d64) == -1);
  CHECK(&tc, qtg_request_statement(st, sizeof st, QTG_STATEMENT_APPROVAL, "desk 1", req, "mainnet", d64, d64) == -1);
  CHECK(&tc, qtg_request_statement(st, 40, QTG_STATEMENT_APPROVAL, "desk-1", req, "mainnet", d64, d64) == -1);
  const char *swapped = "qtg-approval-v3\nrequest 0b6d1c2e-1111-4222-8333-944455556666\ndeployment desk-1\n";
  CHECK(&tc, qtg_request_statement_check(swapped, strlen(swapped)) == -1);
  /* the versions before sql/0205, whose plan line left the order out, are
   * no statement any more: the approver's tool signs neither */
  {
    char old[QTG_APPROVAL_STATEMENT_MAX];
    const char *before[] = {"qtg-approval-v2", "qtg-initiation-v1", "qtg-approval-v1"};
    CHECK(&tc, qtg_request_statement(st, sizeof st, QTG_STATEMENT_APPROVAL, "desk-1", req, "mainnet", d64,
                                     d64) == 0);
    for (int i = 0; i < 3; i++) {
      snprintf(old, sizeof old, "%s%s", before[i], strchr(st, '\n'));
      CHECK(&tc, qtg_request_statement_check(old, strlen(old)) == -1);
    }
  }
  /* the maker's statement: the same facts under its own first line; a
   * signature of one is never a signature of the other */
  {
    char init[QTG_APPROVAL_STATEMENT_MAX];
    CHECK(&tc, qtg_request_statement(st, sizeof st, QTG_STATEMENT_APPROVAL, "desk-1", req, "mainnet",
                                     d64, d64) == 0);
    CHECK(&tc, qtg_request_statement(init, sizeof init, QTG_STATEMENT_INITIATION, "desk-1", req, "mainnet",
                                     d64, d64) == 0);
    CHECK(&tc, strncmp(init, "qtg-initiation-v2\ndeployment desk-1\n", 36) == 0);
    CHECK(&tc, strcmp(strchr(init, '\n'), strchr(st, '\n')) == 0);
    CHECK(&tc, qtg_request_statement_check(init, strlen(init)) == QTG_STATEMENT_INITIATION);
    CHECK(&tc, qtg_request_statement_check(st, strlen(st)) == QTG_STATEMENT_APPROVAL);
    CHECK(&tc, qtg_request_statement(init, sizeof init, (qtg_statement_kind)2, "desk-1", req, "mainnet",
                                     d64, d64) == -1);
    const char *mixed = "qtg-initiation-v2\ndeployment desk-1\n";
    CHECK(&tc, qtg_request_statement_check(mixed, strlen(mixed)) == -1);
    a = enrolment(DEPLOY "initiation signed\nquorum * 2\n"
                  "person alice ed25519:" ED_PUBLIC " operator:alice\n"
                  "initiator treasury-bot ed25519:" ED_OTHER " api:treasury-bot,api:treasury-bot-2\n");
    CHECK(&tc, a != NULL);
    if (a != NULL) {
      CHECK(&tc, qtg_approvers_initiation_signed(a) == 1);
      CHECK(&tc, qtg_approvers_count(a) == 2 && qtg_approvers_count_persons(a) == 1);
      /* an initiator makes requests, never approves them */
      int bot = qtg_approvers_initiator_of(a, "api:treasury-bot-2");
      CHECK(&tc, bot >= 0 && qtg_approvers_person_of(a, "api:treasury-bot-2") == -1);
      CHECK_STR(&tc, qtg_approvers_person_name(a, bot), "treasury-bot");
      int alice = qtg_approvers_person_of(a, "operator:alice");
      CHECK(&tc, alice >= 0 && qtg_approvers_initiator_of(a, "operator:alice") == alice);
      CHECK(&tc, qtg_approver_sign(secret, init, strlen(init), sig) == 0);
      qtg_hex_encode(sig, 64, hex);
      CHECK(&tc, qtg_approvers_verify(a, alice, init, strlen(init), hex) == 1);
      CHECK(&tc, qtg_approvers_verify(a, alice, st, strlen(st), hex) == 0);
      CHECK(&tc, qtg_approvers_verify(a, bot, init, strlen(init), hex) == 0);
      qtg_approvers_free(a);
    }
  }
  /* a manual step's attestation: the facts, then the step; a signature of
   * it is one of no other statement, nor of another step's */
  {
    char att[QTG_APPROVAL_STATEMENT_MAX], gate2[QTG_APPROVAL_STATEMENT_MAX], cut[QTG_APPROVAL_STATEMENT_MAX];
    CHECK(&tc, qtg_request_statement(st, sizeof st, QTG_STATEMENT_APPROVAL, "desk-1", req, "mainnet", d64,
                                     d64) == 0);
    CHECK(&tc, qtg_attestation_statement(att, sizeof att, "desk-1", req, "mainnet", d64, d64, "gate") == 0);
    CHECK(&tc, strncmp(att, "qtg-attestation-v1\ndeployment desk-1\n", 37) == 0);
    CHECK(&tc, strlen(att) > 11 && strcmp(att + strlen(att) - 11, "\nstep gate\n") == 0);
    CHECK(&tc, qtg_request_statement_check(att, strlen(att)) == QTG_STATEMENT_ATTESTATION);
    CHECK(&tc, qtg_attestation_statement(gate2, sizeof gate2, "desk-1", req, "mainnet", d64, d64, "gate_2") == 0);
    /* the longest facts and step fit */
    char widest[QTG_APPROVAL_STATEMENT_MAX];
    CHECK(&tc, qtg_attestation_statement(widest, sizeof widest,
                                         "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd", req,
                                         "cccccccccccccccccccccccccccccccc", d64, d64,
                                         "s12345678901234567890123456789012345678901234567890123456789012") == 0 &&
                   qtg_request_statement_check(widest, strlen(widest)) == QTG_STATEMENT_ATTESTATION);
    /* a step no plan node key could be, a missing step, an approval with one */
    const char *bad_steps[] = {"", "Gate", "1gate", "gate\nplan x", "gate x", "ga-te",
                               "s1234567890123456789012345678901234567890123456789012345678901234", NULL};
    for (int i = 0; bad_steps[i]; i++)
      CHECK(&tc, qtg_attestation_statement(cut, sizeof cut, "desk-1", req, "mainnet", d64, d64, bad_steps[i]) == -1);
    CHECK(&tc, qtg_attestation_statement(cut, sizeof cut, "desk-1", req, "mainnet", d64, d64, NULL) == -1);
    CHECK(&tc, qtg_request_statement(cut, sizeof cut, QTG_STATEMENT_ATTESTATION, "desk-1", req, "mainnet", d64,
                                     d64) == -1);
    snprintf(cut, sizeof cut, "%.*s", (int)(strstr(att, "step ") - att), att);     /* without its step */
    CHECK(&tc, qtg_request_statement_check(cut, strlen(cut)) == -1);
    snprintf(cut, sizeof cut, "%sstep gate\n", st);                                /* an approval with one */
    CHECK(&tc, qtg_request_statement_check(cut, strlen(cut)) == -1);
    snprintf(cut, sizeof cut, "%sstep gate\n", att);                               /* a second step */
    CHECK(&tc, qtg_request_statement_check(cut, strlen(cut)) == -1);
    a = enrolment(DEPLOY "quorum * 1\nperson alice ed25519:" ED_PUBLIC " operator:alice\n");
    CHECK(&tc, a != NULL);
    if (a != NULL) {
      CHECK(&tc, qtg_approver_sign(secret, att, strlen(att), sig) == 0);
      qtg_hex_encode(sig, 64, hex);
      CHECK(&tc, qtg_approvers_verify(a, 0, att, strlen(att), hex) == 1);
      CHECK(&tc, qtg_approvers_verify(a, 0, gate2, strlen(gate2), hex) == 0);
      CHECK(&tc, qtg_approvers_verify(a, 0, st, strlen(st), hex) == 0);
      qtg_approvers_free(a);
    }
  }
  /* a fill: deployment, chain, sender, nonce; a signature of it verifies
   * for no other nonce, chain, sender or deployment, nor as an approval */
  {
    char fill[QTG_APPROVAL_STATEMENT_MAX], other[QTG_APPROVAL_STATEMENT_MAX];
    const char *from = "0x70997970c51812dc3a010c7d01b50e0d17dc79c8";
    CHECK(&tc, qtg_fill_statement(fill, sizeof fill, "desk-1", "31337", from, "7") == 0);
    CHECK_STR(&tc, fill, "qtg-fill-v1\ndeployment desk-1\nchain 31337\nsender "
                         "0x70997970c51812dc3a010c7d01b50e0d17dc79c8\nnonce 7\n");
    CHECK(&tc, qtg_request_statement_check(fill, strlen(fill)) == -1);
    CHECK(&tc, qtg_fill_statement(other, sizeof other, "desk-1", "31337", from, "0") == 0);
    const char *bad[][4] = {{"desk 1", "31337", from, "7"}, {"desk-1", "0", from, "7"},
                            {"desk-1", "031337", from, "7"}, {"desk-1", "31337", from, "07"},
                            {"desk-1", "31337", from, "-1"}, {"desk-1", "1234567890123456789", from, "7"},
                            {"desk-1", "31337", "0x70997970C51812dc3a010c7d01b50e0d17dc79c8", "7"},
                            {"desk-1", "31337", "70997970c51812dc3a010c7d01b50e0d17dc79c8", "7"},
                            {"desk-1", "31337", "0x70997970c51812dc3a010c7d01b50e0d17dc79c", "7"},
                            {"desk-1", "31337", from, "7\nnonce 8"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
      CHECK(&tc, qtg_fill_statement(other, sizeof other, bad[i][0], bad[i][1], bad[i][2], bad[i][3]) == -1);
    CHECK(&tc, qtg_fill_statement(other, 10, "desk-1", "31337", from, "7") == -1);
    a = enrolment(DEPLOY "quorum * 1\nperson alice ed25519:" ED_PUBLIC " operator:alice\n");
    CHECK(&tc, a != NULL);
    if (a != NULL) {
      CHECK(&tc, qtg_approver_sign(secret, fill, strlen(fill), sig) == 0);
      qtg_hex_encode(sig, 64, hex);
      CHECK(&tc, qtg_approvers_verify(a, 0, fill, strlen(fill), hex) == 1);
      const char *twins[][4] = {{"desk-1", "31337", from, "8"}, {"desk-1", "1", from, "7"},
                                {"desk-1", "31337", "0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc", "7"},
                                {"desk-2", "31337", from, "7"}};
      for (size_t i = 0; i < sizeof twins / sizeof twins[0]; i++) {
        CHECK(&tc, qtg_fill_statement(other, sizeof other, twins[i][0], twins[i][1], twins[i][2], twins[i][3]) == 0);
        CHECK(&tc, qtg_approvers_verify(a, 0, other, strlen(other), hex) == 0);
      }
      CHECK(&tc, qtg_approvers_principal_ok("operator:alice", 14) == 1 && qtg_approvers_principal_ok("alice", 5) == 0);
      qtg_approvers_free(a);
    }
  }
  /* version 1 (no deployment) is not a statement any more */
  const char *v1 = "qtg-approval-v1\nrequest 0b6d1c2e-1111-4222-8333-944455556666\nclass mainnet\n"
                   "digest 00000000000000000000000000000000000000000000000000000000000000aa\n"
                   "plan 00000000000000000000000000000000000000000000000000000000000000aa\n";
  CHECK(&tc, qtg_request_statement_check(v1, strlen(v1)) == -1);
  /* one approver, one key, two deployments: the signature given in one
   * does not verify for the same request's statement in the other */
  {
    char other[QTG_APPROVAL_STATEMENT_MAX];
    a = enrolment("deployment desk-2\nperson alice ed25519:" ED_PUBLIC " operator:alice\nquorum * 1\n");
    CHECK(&tc, a != NULL && qtg_request_statement(other, sizeof other, QTG_STATEMENT_APPROVAL, "desk-2", req, "mainnet", d64, d64) == 0);
    CHECK(&tc, qtg_approver_sign(secret, st, strlen(st), sig) == 0);
    qtg_hex_encode(sig, 64, hex);
    CHECK(&tc, a != NULL && qtg_approvers_verify(a, 0, st, strlen(st), hex) == 1);
    CHECK(&tc, a != NULL && qtg_approvers_verify(a, 0, other, strlen(other), hex) == 0);
    qtg_approvers_free(a);
  }
  CHECK(&tc, qtg_request_statement_check("", 0) == -1);

  /* the file: a regular file group and others cannot write */
  char path[400];
  snprintf(path, sizeof path, "%s/approvers", tmpdir);
  FILE *f = fopen(path, "w");
  CHECK(&tc, f != NULL);
  if (f == NULL) return;
  fprintf(f, DEPLOY "person alice ed25519:%s operator:alice\nquorum * 1\n", ED_PUBLIC);
  fclose(f);
  CHECK(&tc, chmod(path, 0644) == 0);
  CHECK(&tc, qtg_approvers_load(path, &a, err, sizeof err) == 0 && qtg_approvers_count(a) == 1);
  qtg_approvers_free(a);
  CHECK(&tc, chmod(path, 0664) == 0);
  CHECK(&tc, qtg_approvers_load(path, &a, err, sizeof err) == -1 && a == NULL && strstr(err, "0664"));
  CHECK(&tc, qtg_approvers_load(tmpdir, &a, err, sizeof err) == -1);
  /* owned by the daemon's uid (which could chmod and rewrite it): refused */
  CHECK(&tc, chmod(path, 0644) == 0);
  CHECK(&tc, qtg_approvers_load_guarded(path, (long)getuid(), &a, err, sizeof err) == -1 && a == NULL &&
                 strstr(err, "owned by uid"));
  CHECK(&tc, qtg_approvers_load_guarded(path, (long)getuid() + 1, &a, err, sizeof err) == 0);
  qtg_approvers_free(a);
  snprintf(path, sizeof path, "%s/no-such-file", tmpdir);
  CHECK(&tc, qtg_approvers_load(path, &a, err, sizeof err) == -1 && strstr(err, "MG_SIGNER_APPROVERS"));

  /* the signer's reading (load_guarded): the path and its directories.
   * Whoever may write a directory on the way, or change a link on it,
   * could put another file (an older enrolment) in its place */
  char dir[400], held[450], link[450];
  snprintf(dir, sizeof dir, "%s/conf", tmpdir);
  snprintf(held, sizeof held, "%s/approvers", dir);
  snprintf(link, sizeof link, "%s/approvers-link", tmpdir);
  CHECK(&tc, mkdir(dir, 0755) == 0 && chmod(dir, 0755) == 0);
  f = fopen(held, "w");
  CHECK(&tc, f != NULL);
  if (f == NULL) return;
  fprintf(f, DEPLOY "person alice ed25519:%s operator:alice\nquorum * 1\n", ED_PUBLIC);
  fclose(f);
  CHECK(&tc, chmod(held, 0644) == 0 && symlink(held, link) == 0);
  CHECK(&tc, qtg_approvers_load_guarded(held, -1, &a, err, sizeof err) == 0);
  qtg_approvers_free(a);
  /* a link, '.', '..' or a relative path: refused (resolved where the walk does not look) */
  char dotted[500];
  snprintf(dotted, sizeof dotted, "%s/./approvers", dir);
  CHECK(&tc, qtg_approvers_load_guarded(link, -1, &a, err, sizeof err) == -1 && a == NULL &&
                 strstr(err, "no link"));
  CHECK(&tc, qtg_approvers_load_guarded(dotted, -1, &a, err, sizeof err) == -1 && strstr(err, "no link"));
  CHECK(&tc, qtg_approvers_load_guarded("approvers-relative", -1, &a, err, sizeof err) == -1);
  /* the daemon's and the audit tool's reading takes the link (the file's own checks) */
  CHECK(&tc, qtg_approvers_load(link, &a, err, sizeof err) == 0);
  qtg_approvers_free(a);
  /* the file's directory writable by its group: refused */
  CHECK(&tc, chmod(dir, 0775) == 0);
  CHECK(&tc, qtg_approvers_load_guarded(held, -1, &a, err, sizeof err) == -1 && a == NULL &&
                 strstr(err, "the directory") && strstr(err, "0775"));
  /* sticky, as /tmp is: no one else can rename or remove the file there */
  CHECK(&tc, chmod(dir, 01777) == 0);
  CHECK(&tc, qtg_approvers_load_guarded(held, -1, &a, err, sizeof err) == 0);
  qtg_approvers_free(a);
  CHECK(&tc, chmod(dir, 0755) == 0);
  /* a directory further up the path others may write: refused */
  CHECK(&tc, chmod(tmpdir, 0777) == 0);
  CHECK(&tc, qtg_approvers_load_guarded(held, -1, &a, err, sizeof err) == -1 && a == NULL && strstr(err, "0777"));
  CHECK(&tc, chmod(tmpdir, 0700) == 0);
  /* a directory owned by the daemon's uid: refused although the file is not its */
  if (geteuid() == 0) {
    CHECK(&tc, chown(held, (uid_t)getuid() + 1, (gid_t)-1) == 0);
    CHECK(&tc, qtg_approvers_load_guarded(held, (long)getuid(), &a, err, sizeof err) == -1 && a == NULL &&
                   strstr(err, "the directory") && strstr(err, "owned by uid"));
    CHECK(&tc, chown(held, (uid_t)getuid(), (gid_t)-1) == 0);
  }
  CHECK(&tc, unlink(link) == 0 && unlink(held) == 0 && rmdir(dir) == 0);
}

/* quorum CLASS|* N above AMOUNT ASSET: the count qtg_approvers_quorum_for
 * gives (the one rule of the signer and the daemon), a malformed tier
 * refused with its line, and what unbound keys make of a class's tier. */
static int quorum_for(const qtg_approvers *a, const char *klass, const char *asset,
                      const char *amount, char *why, size_t whylen) {
  return qtg_approvers_quorum_for(a, klass, asset, amount, 1, why, whylen);
}

static void test_approver_tiers(void) {
  char why[300], err[512];
  int lowest, highest;
  qtg_approvers *a = enrolment(DEPLOY
      "quorum mainnet 2\n"
      "quorum * 1\n"
      "quorum mainnet 3 above 1 ETH   # a tier\n"
      "quorum mainnet 5 above 100.5 eth\n"
      "quorum * 4 above 0.000000000000000001 wbtc\n");
  CHECK(&tc, a != NULL);
  if (a == NULL) return;
  /* the base quorum stays the class's line */
  CHECK(&tc, qtg_approvers_quorum(a, "mainnet") == 2 && qtg_approvers_quorum(a, "dev") == 1);
  CHECK(&tc, quorum_for(a, "mainnet", "ETH", "0.5", why, sizeof why) == 2);
  CHECK_STR(&tc, why, "quorum 2 for mainnet");
  CHECK(&tc, quorum_for(a, "mainnet", "ETH", "1", why, sizeof why) == 2);           /* not above */
  CHECK(&tc, quorum_for(a, "mainnet", "ETH", "1.000000000000000000", why, sizeof why) == 2);
  CHECK(&tc, quorum_for(a, "mainnet", "ETH", "001", why, sizeof why) == 2);
  CHECK(&tc, quorum_for(a, "mainnet", "ETH", "1.000000000000000001", why, sizeof why) == 3);
  CHECK_STR(&tc, why, "quorum 3 for more than 1 ETH on mainnet");
  CHECK(&tc, quorum_for(a, "mainnet", "eth", "2", why, sizeof why) == 3);           /* any case */
  CHECK(&tc, quorum_for(a, "mainnet", "ETH", "100.5", why, sizeof why) == 3);
  CHECK(&tc, quorum_for(a, "mainnet", "ETH", "100.51", why, sizeof why) == 5);
  CHECK_STR(&tc, why, "quorum 5 for more than 100.5 ETH on mainnet");
  CHECK(&tc, quorum_for(a, "dev", "ETH", "1000", why, sizeof why) == 1);            /* another class */
  CHECK_STR(&tc, why, "quorum 1 for *");
  CHECK(&tc, quorum_for(a, "mainnet", "USDC", "1000", why, sizeof why) == 2);       /* another asset */
  CHECK(&tc, quorum_for(a, "mainnet", "ETHX", "1000", why, sizeof why) == 2);
  CHECK(&tc, quorum_for(a, "mainnet", NULL, "1000", why, sizeof why) == 2);
  CHECK(&tc, quorum_for(a, "dev", "WBTC", "0", why, sizeof why) == 1);
  CHECK(&tc, quorum_for(a, "dev", "WBTC", "0.000000000000000002", why, sizeof why) == 4);
  CHECK_STR(&tc, why, "quorum 4 for more than 0.000000000000000001 WBTC on any class");
  CHECK(&tc, quorum_for(a, "mainnet", "WBTC", "7", why, sizeof why) == 4);
  /* an amount that does not parse, where a tier could apply: refused (it
   * may be above); where none could, the base quorum */
  static const char *const unparsable[] = {"1e3", "-1", "+2", "2.", ".5", "1.0000000000000000001",
                                           "", " 2", "2 ", "0x10", "1,5", "NaN", NULL};
  for (int i = 0; unparsable[i]; i++) {
    why[0] = '\0';
    CHECK(&tc, quorum_for(a, "mainnet", "ETH", unparsable[i], why, sizeof why) == -1 &&
                   strstr(why, "not a plain decimal") && strstr(why, "more than 1 ETH on mainnet"));
    CHECK(&tc, quorum_for(a, "dev", "ETH", unparsable[i], why, sizeof why) == 1);
  }
  CHECK(&tc, quorum_for(a, "mainnet", "ETH", NULL, why, sizeof why) == -1);
  /* 10^60 ETH: beyond 2^256 units of 10^-18 */
  CHECK(&tc, quorum_for(a, "mainnet", "ETH", "1000000000000000000000000000000000000000000000000000000000000",
                        why, sizeof why) == -1);
  /* a plan that pays the amount several times is judged on the total */
  CHECK(&tc, qtg_approvers_quorum_for(a, "mainnet", "ETH", "0.6", 2, why, sizeof why) == 3);
  CHECK_STR(&tc, why, "quorum 3 for more than 1 ETH on mainnet (the plan pays 0.6 ETH 2 times)");
  CHECK(&tc, qtg_approvers_quorum_for(a, "mainnet", "ETH", "0.5", 2, why, sizeof why) == 2);   /* 1.0 */
  CHECK(&tc, qtg_approvers_quorum_for(a, "mainnet", "ETH", "0.6", 1, why, sizeof why) == 2);
  CHECK(&tc, qtg_approvers_quorum_for(a, "mainnet", "ETH", "0.6", 0, why, sizeof why) == 2);   /* as 1 */
  CHECK(&tc, qtg_approvers_quorum_for(a, "mainnet", "ETH", "33.5", 3, why, sizeof why) == 3);   /* 100.5 */
  CHECK(&tc, qtg_approvers_quorum_for(a, "mainnet", "ETH", "33.500000000000000001", 3, why, sizeof why) == 5);
  CHECK(&tc, qtg_approvers_quorum_for(a, "mainnet", "USDC", "1000", 7, why, sizeof why) == 2);
  /* a total past 2^256 units is above every tier, not wrapped below them */
  CHECK(&tc, qtg_approvers_quorum_for(a, "mainnet", "ETH", "100000000000000000000000000000000000000000000000000000000",
                                      1000000, why, sizeof why) == 5);
  {
    qtg_u256 v;
    char text[80];
    CHECK(&tc, qtg_u256_parse("123456789", 9, &v) == 0 && qtg_u256_mul_small(&v, 1000) == 0);
    qtg_u256_decimal(&v, text, sizeof text);
    CHECK_STR(&tc, text, "123456789000");
    memset(v.be, 0, sizeof v.be);
    v.be[0] = 0x80;                                   /* 2^255 */
    CHECK(&tc, qtg_u256_mul_small(&v, 2) == -1);
    memset(v.be, 0, sizeof v.be);
    v.be[0] = 0x7f;
    CHECK(&tc, qtg_u256_mul_small(&v, 2) == 0 && v.be[0] == 0xfe);
  }
  /* a class without a quorum */
  qtg_approvers *only = enrolment(DEPLOY "quorum mainnet 2\nquorum mainnet 3 above 1 ETH\n");
  CHECK(&tc, only != NULL && quorum_for(only, "dev", "ETH", "5", why, sizeof why) == -1 &&
                 strstr(why, "no quorum for network class dev"));
  CHECK(&tc, quorum_for(NULL, "dev", "ETH", "5", why, sizeof why) == -1);
  /* the range: tiers count in the highest, never in the lowest */
  CHECK(&tc, qtg_approvers_quorum_range(a, &lowest, &highest) == 5 && lowest == 1 && highest == 5);
  CHECK(&tc, qtg_approvers_classes_at(a, 5, why, sizeof why) == 0);
  /* with one class only, a tier of it is no difference between classes */
  CHECK(&tc, only != NULL && qtg_approvers_uneven(only, why, sizeof why) == 0);
  qtg_approvers_free(only);
  CHECK(&tc, qtg_approvers_uneven(a, why, sizeof why) == 1 && strstr(why, "but 1 for *"));
  qtg_approvers_free(a);

  /* under keys for every class: a class's tier another class does not
   * match at the same amounts is a difference; a tier of * is none */
  static const struct { const char *text; int uneven; const char *why; } unbound[] = {
      {"quorum * 2\nquorum * 3 above 1 ETH\n", 0, NULL},
      {"quorum mainnet 2\nquorum * 2\nquorum * 3 above 1 ETH\n", 0, NULL},
      {"quorum * 2\nquorum mainnet 3 above 1 ETH\n",
       1, "asks 3 approvals for more than 1 ETH on mainnet (line 3) but 2 for *"},
      {"quorum mainnet 2\nquorum * 2\nquorum mainnet 3 above 1 ETH\n", 1, "but 2 for *"},
      {"quorum mainnet 2\nquorum dev 2\nquorum mainnet 3 above 1 ETH\nquorum dev 3 above 1 ETH\n", 0, NULL},
      /* dev matches from a lower amount: no difference; from a higher one: one */
      {"quorum mainnet 2\nquorum dev 2\nquorum mainnet 3 above 1 ETH\nquorum dev 3 above 0.5 ETH\n",
       1, "asks 3 approvals for more than 0.5 ETH on dev (line 5) but 2 for mainnet"},
      {"quorum mainnet 2\nquorum dev 2\nquorum mainnet 3 above 0.5 ETH\nquorum dev 3 above 0.5 ETH\n", 0, NULL},
      {"quorum mainnet 2\nquorum dev 2\nquorum mainnet 3 above 1 ETH\nquorum dev 4 above 0.5 ETH\n"
       "quorum mainnet 4 above 0.5 ETH\n", 0, NULL},
      {"quorum mainnet 2\nquorum dev 2\nquorum mainnet 3 above 1 ETH\nquorum dev 3 above 1.5 ETH\n",
       1, "but 2 for dev"},
      {"quorum mainnet 2\nquorum dev 2\nquorum mainnet 3 above 1 ETH\nquorum dev 2 above 0.5 ETH\n",
       1, "but 2 for dev"},
      {"quorum mainnet 2\nquorum dev 2\nquorum mainnet 3 above 1 ETH\nquorum dev 3 above 1 USDC\n",
       1, "but 2 for dev"},
      {"quorum mainnet 2\nquorum dev 2\nquorum mainnet 3 above 1 ETH\nquorum * 4 above 1 ETH\n", 0, NULL},
      {"quorum mainnet 3\nquorum dev 3\nquorum mainnet 3 above 1 ETH\n", 0, NULL},    /* raises nothing */
      {"quorum mainnet 2\nquorum * 1\n", 1, "asks 2 approvals for mainnet but 1 for *"},
      {NULL, 0, NULL}};
  for (int i = 0; unbound[i].text; i++) {
    char text[400];
    snprintf(text, sizeof text, DEPLOY "%s", unbound[i].text);
    a = enrolment(text);
    why[0] = '\0';
    int got = a != NULL ? qtg_approvers_uneven(a, why, sizeof why) : -1;
    CHECK(&tc, got == unbound[i].uneven && (unbound[i].why == NULL || strstr(why, unbound[i].why)));
    if (got != unbound[i].uneven) fprintf(stderr, "  uneven %d (%s): %s\n", got, why, unbound[i].text);
    qtg_approvers_free(a);
  }

  /* malformed tiers: refused, naming their line (line 3: after DEPLOY and
   * the base quorum) */
  static const char *const bad[] = {
      "quorum mainnet 3 above 1\n",                                 /* no asset */
      "quorum mainnet 3 above\n",                                   /* no amount nor asset */
      "quorum mainnet 3 above 1e3 ETH\n",
      "quorum mainnet 3 above -1 ETH\n",
      "quorum mainnet 3 above +1 ETH\n",
      "quorum mainnet 3 above 1.0000000000000000001 ETH\n",        /* 19 decimals */
      "quorum mainnet 3 above 1. ETH\n",
      "quorum mainnet 3 above .5 ETH\n",
      "quorum mainnet 3 above 1.2.3 ETH\n",
      "quorum mainnet 3 above 0x10 ETH\n",
      "quorum mainnet 3 above 1 E-TH\n",                            /* not [A-Za-z0-9] */
      "quorum mainnet 3 above 1 ABCDEFGHIJKLMNOPQ\n",               /* 17 characters */
      "quorum mainnet 101 above 1 ETH\n",                           /* N out of 0..100 */
      "quorum mainnet -1 above 1 ETH\n",
      "quorum mainnet 2x above 1 ETH\n",
      "quorum mainnet 3 above above 1 ETH\n",                       /* above twice */
      "quorum mainnet 3 above 1 above\n",
      "quorum mainnet 3 above 1 ETH extra\n",                       /* extra words */
      "quorum mainnet 3 above 1 ETH extra words\n",
      "quorum mainnet 3 over 1 ETH\n",
      "quorum mainnet 3 ABOVE 1 ETH\n",
      "quorum mainnet 3 1 ETH\n",
      "quorum Mainnet 3 above 1 ETH\n",
      "quorum mainnet 3 above 1 ETH\nquorum mainnet 4 above 1.0 eth\n", /* given twice: line 4 */
      "quorum dev 3 above 1 ETH\n",                                 /* no quorum for dev nor * */
      "quorum mainnet 3 above 1000000000000000000000000000000000000000000000000000000000000000 ETH\n",
      NULL};
  for (int i = 0; bad[i]; i++) {
    char text[400], want[16];
    snprintf(text, sizeof text, DEPLOY "quorum mainnet 2\n%s", bad[i]);
    snprintf(want, sizeof want, "line %d:", strstr(bad[i], "\nquorum") ? 4 : 3);   /* the second line */
    err[0] = '\0';
    a = NULL;
    int rc = qtg_approvers_parse(text, strlen(text), &a, err, sizeof err);
    CHECK(&tc, rc == -1 && a == NULL && strncmp(err, want, strlen(want)) == 0);
    if (rc == 0 || strncmp(err, want, strlen(want)) != 0)
      fprintf(stderr, "  tier: %s -> %s\n", bad[i], rc ? err : "accepted");
    qtg_approvers_free(a);
  }
  /* a tier of * raises every class with a quorum, a `quorum *` line or not */
  a = enrolment(DEPLOY "quorum mainnet 2\nquorum dev 1\nquorum * 3 above 1 ETH\n");
  CHECK(&tc, a != NULL && quorum_for(a, "mainnet", "ETH", "2", why, sizeof why) == 3 &&
                 quorum_for(a, "dev", "ETH", "2", why, sizeof why) == 3 &&
                 quorum_for(a, "other", "ETH", "2", why, sizeof why) == -1);
  qtg_approvers_free(a);
  /* the tiers a class can meet, as `qtgd check` names them: its own and *'s */
  a = enrolment(DEPLOY "quorum mainnet 2\nquorum dev 1\nquorum * 3 above 1 ETH\n"
                       "quorum dev 4 above 10 ETH\n");
  {
    char list[200], tiny[12];
    CHECK(&tc, a != NULL && qtg_approvers_tiers_of(a, "dev", list, sizeof list) == 2);
    CHECK_STR(&tc, list, "quorum 3 for more than 1 ETH on any class; quorum 4 for more than 10 ETH on dev");
    CHECK(&tc, qtg_approvers_tiers_of(a, "mainnet", list, sizeof list) == 1);
    CHECK_STR(&tc, list, "quorum 3 for more than 1 ETH on any class");
    CHECK(&tc, qtg_approvers_tiers_of(a, "dev", tiny, sizeof tiny) == 2);
    CHECK_STR(&tc, tiny, "quorum 3 fo");   /* cut, terminated */
  }
  qtg_approvers_free(a);
  a = enrolment(DEPLOY "quorum mainnet 2\n");
  {
    char list[8] = "x";
    CHECK(&tc, a != NULL && qtg_approvers_tiers_of(a, "mainnet", list, sizeof list) == 0 && list[0] == '\0');
  }
  qtg_approvers_free(a);
  /* the limits: 0 and 100, 18 decimals, 16 characters, a tier before its base line */
  a = enrolment(DEPLOY "quorum mainnet 0 above 0 ETH\nquorum mainnet 100 above 0.123456789012345678 "
                       "ABCDEFGHIJKLMNOP\nquorum mainnet 1\n");
  CHECK(&tc, a != NULL && quorum_for(a, "mainnet", "abcdefghijklmnop", "1", why, sizeof why) == 100 &&
                 quorum_for(a, "mainnet", "ETH", "1", why, sizeof why) == 1);
  qtg_approvers_free(a);
}

int main(void) {
  secp256k1_context *ctx;
  snprintf(tmpdir, sizeof tmpdir, "%s/qtg-test-signer-XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (mkdtemp(tmpdir) == NULL) return 2;
  ctx = qtg_signer_context_new();
  if (ctx == NULL) return 2;
  test_addresses(ctx);
  test_eip155_signature(ctx);
  test_sign_request_checks();
  test_key_files();
  test_lua();
  test_proto();
  test_approvers();
  test_approver_tiers();
  qtg_signer_context_free(ctx);
  {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  }
  return qtg_test_finish(&tc);
}
