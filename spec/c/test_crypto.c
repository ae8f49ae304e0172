/* test_crypto.c -- hashes, HMAC, hex, nonces and the callback key: the C
 * layer against published vectors and against OpenSSL, the key loader
 * against good and bad key files, and qtg.crypto from Lua inside a real
 * host (including a search of the whole Lua state for the key bytes).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "qtg_crypto.h"
#include "qtg_keys.h"
#include "qtg_settings.h"
#include "qtg_test.h"
#include "qtg_test_host.h"

static qtg_test_counts tc;
static char tmpdir[256];

static void hex_of(const uint8_t *b, size_t n, char *out) { qtg_hex_encode(b, n, out); }

static void test_vectors(void) {
  uint8_t d[32];
  char hex[65];

  qtg_keccak256("", 0, d);
  hex_of(d, 32, hex);
  CHECK_STR(&tc, hex, "c5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470");
  qtg_keccak256("abc", 3, d);
  hex_of(d, 32, hex);
  CHECK_STR(&tc, hex, "4e03657aea45a94fc7d47ba826c8d667c0d1e6e33a64a036ec44f58fa12d6c45");

  CHECK(&tc, qtg_sha256("abc", 3, d) == 0);
  hex_of(d, 32, hex);
  CHECK_STR(&tc, hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");

  /* RFC 4231 test case 2. */
  CHECK(&tc, qtg_hmac_sha256("Jefe", 4, "what do ya want for nothing?", 28, d) == 0);
  hex_of(d, 32, hex);
  CHECK_STR(&tc, hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  /* GitHub's webhook example. */
  CHECK(&tc, qtg_hmac_sha256("It's a Secret to Everybody", 26, "Hello, World!", 13, d) == 0);
  hex_of(d, 32, hex);
  CHECK_STR(&tc, hex, "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17");
}

/* The sponge is shared with SHA3-256, which OpenSSL has: agreeing with it
 * on every length across three block boundaries checks absorption and
 * padding, which the two short Keccak vectors alone cannot. */
static void test_sponge_against_openssl(void) {
  uint8_t msg[420], ours[32], theirs[32];
  unsigned int n = 0;
  int mismatches = 0;
  for (size_t i = 0; i < sizeof msg; i++) msg[i] = (uint8_t)(i * 7 + 3);
  for (size_t len = 0; len <= sizeof msg; len++) {
    qtg_sha3_256(msg, len, ours);
    if (EVP_Digest(msg, len, theirs, &n, EVP_sha3_256(), NULL) != 1 ||
        memcmp(ours, theirs, 32) != 0)
      mismatches++;
  }
  CHECK(&tc, mismatches == 0);
  /* And Keccak really differs from SHA3 (the padding byte). */
  qtg_keccak256(msg, 10, ours);
  qtg_sha3_256(msg, 10, theirs);
  CHECK(&tc, memcmp(ours, theirs, 32) != 0);
}

static void test_hex(void) {
  uint8_t out[4], *buf = NULL;
  size_t len = 0;
  char hex[9];
  hex_of((const uint8_t *)"\x00\xff\x10\xab", 4, hex);
  CHECK_STR(&tc, hex, "00ff10ab");
  CHECK(&tc, qtg_hex_decode("00FF10ab", 8, out) == 0 && memcmp(out, "\x00\xff\x10\xab", 4) == 0);
  CHECK(&tc, qtg_hex_decode("0g", 2, out) == -1);
  CHECK(&tc, qtg_hex_decode("abc", 3, out) == -1);
  CHECK(&tc, qtg_hex_decode_alloc("0xabcd", 6, 1, &buf, &len) == 0 && len == 2 &&
                 buf[0] == 0xab && buf[1] == 0xcd);
  free(buf);
  CHECK(&tc, qtg_hex_decode_alloc("0xabcd", 6, 0, &buf, &len) == -1);   /* 'x' */
  CHECK(&tc, qtg_hex_decode_alloc("0xabc", 5, 1, &buf, &len) == -1);    /* odd */
  CHECK(&tc, qtg_hex_decode_alloc("0x", 2, 1, &buf, &len) == 0 && len == 0);
  free(buf);
}

static void test_compare_and_random(void) {
  char a[QTG_NONCE_LEN + 1], b[QTG_NONCE_LEN + 1];
  uint8_t r1[32], r2[32];
  int bad_chars = 0, repeats = 0;

  CHECK(&tc, qtg_constant_time_equal("abc", 3, "abc", 3) == 1);
  CHECK(&tc, qtg_constant_time_equal("abc", 3, "abd", 3) == 0);
  CHECK(&tc, qtg_constant_time_equal("abc", 3, "abcd", 4) == 0);
  CHECK(&tc, qtg_constant_time_equal("", 0, "", 0) == 1);

  CHECK(&tc, qtg_random_bytes(r1, sizeof r1) == 0 && qtg_random_bytes(r2, sizeof r2) == 0);
  CHECK(&tc, memcmp(r1, r2, sizeof r1) != 0);
  CHECK(&tc, qtg_random_bytes(r1, 0) == 0);

  CHECK(&tc, qtg_nonce(a) == 0);
  for (int i = 0; i < 1000; i++) {
    CHECK(&tc, qtg_nonce(b) == 0);
    if (strlen(b) != QTG_NONCE_LEN) bad_chars++;
    for (const char *p = b; *p; p++)
      if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
            (*p >= '0' && *p <= '9') || *p == '-' || *p == '_'))
        bad_chars++;
    if (strcmp(a, b) == 0) repeats++;
  }
  CHECK(&tc, bad_chars == 0);
  CHECK(&tc, repeats == 0);
}

/* ---- the callback key ------------------------------------------------------- */

static void write_file(const char *path, const char *content, size_t len, mode_t mode) {
  FILE *f;
  unlink(path);                /* a previous 0400 file would refuse non-root */
  f = fopen(path, "wb");
  if (f == NULL || fwrite(content, 1, len, f) != len || fclose(f) != 0) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
  if (chmod(path, mode) != 0) exit(2);
}

static int load(const char *file, const char *inline_key, const char *id, qtg_keys **k,
                char *err, size_t errlen) {
  qtg_keys_config cfg = {file, inline_key, id, NULL, 0, 0, NULL};
  err[0] = '\0';
  return qtg_keys_load(&cfg, k, err, errlen);
}

static void test_callback_key(void) {
  char path[512], err[512], hex[65];
  uint8_t mac[32], want[32];
  qtg_keys *k = NULL;
  static const char secret[] = "qtg-test-secret-0123456789abcdef";
  /* The illustrative callback vector from the notes: "{ts}\n{nonce}\n{hex(sha256(body))}". */
  static const char body[] = "{\"id\":\"req_1\",\"status\":\"completed\"}";
  char msg[256];
  uint8_t bh[32];
  char bhex[65];

  CHECK(&tc, qtg_sha256(body, strlen(body), bh) == 0);
  hex_of(bh, 32, bhex);
  CHECK_STR(&tc, bhex, "35e88809634a59b5412958118a60784b90d819ea4a78d6e158cb0f9a63de8903");
  snprintf(msg, sizeof msg, "1700000000\nn_01HZX\n%s", bhex);

  /* 0600 with a trailing newline: loaded, newline stripped. */
  snprintf(path, sizeof path, "%s/callback.key", tmpdir);
  write_file(path, "qtg-test-secret-0123456789abcdef\n", 33, 0600);
  CHECK(&tc, load(path, NULL, "k7", &k, err, sizeof err) == 0);
  CHECK(&tc, qtg_keys_has_callback_key(k));
  CHECK_STR(&tc, qtg_keys_callback_key_id(k), "k7");
  CHECK(&tc, qtg_keys_callback_hmac(k, msg, strlen(msg), mac) == 0);
  hex_of(mac, 32, hex);
  CHECK_STR(&tc, hex, "16f3027b27be7bc137eaccb898c05e6c987789ea4f0ffb2bacf0815ad5d069a2");
  CHECK(&tc, qtg_hmac_sha256(secret, strlen(secret), msg, strlen(msg), want) == 0);
  CHECK(&tc, memcmp(mac, want, 32) == 0);
  qtg_keys_free(k);

  /* 0400 is fine too; only one newline is stripped. */
  write_file(path, "qtg-test-secret-0123456789abcdef\n\n", 34, 0400);
  CHECK(&tc, load(path, NULL, NULL, &k, err, sizeof err) == 0);
  CHECK_STR(&tc, qtg_keys_callback_key_id(k), "k1");   /* the default id */
  CHECK(&tc, qtg_keys_callback_hmac(k, msg, strlen(msg), mac) == 0);
  CHECK(&tc, memcmp(mac, want, 32) != 0);
  qtg_keys_free(k);

  /* Group- or world-accessible files are refused, naming file and mode. */
  write_file(path, "qtg-test-secret-0123456789abcdef\n", 33, 0644);
  CHECK(&tc, load(path, NULL, NULL, &k, err, sizeof err) == -1 && k == NULL);
  CHECK(&tc, strstr(err, "MG_CALLBACK_KEY_FILE") != NULL && strstr(err, path) != NULL &&
                 strstr(err, "0644") != NULL);
  CHECK(&tc, strstr(err, "qtg-test-secret-0123456789abcdef") == NULL);
  write_file(path, "qtg-test-secret-0123456789abcdef\n", 33, 0640);
  CHECK(&tc, load(path, NULL, NULL, &k, err, sizeof err) == -1 && strstr(err, "0640") != NULL);
  write_file(path, "qtg-test-secret-0123456789abcdef\n", 33, 0602);
  CHECK(&tc, load(path, NULL, NULL, &k, err, sizeof err) == -1 && strstr(err, "0602") != NULL);

  /* Shorter than 32 bytes, in a file or inline: refused, naming the setting
   * and the length, never the bytes. */
  write_file(path, "qtg-test-secret-0123456789abcde\n", 32, 0600);   /* 31 bytes */
  CHECK(&tc, load(path, NULL, NULL, &k, err, sizeof err) == -1 && k == NULL);
  CHECK(&tc, strstr(err, "MG_CALLBACK_KEY_FILE") != NULL && strstr(err, "31 bytes") != NULL &&
                 strstr(err, "at least 32") != NULL && strstr(err, "qtg-test-secret") == NULL);
  CHECK(&tc, load(NULL, "ab", NULL, &k, err, sizeof err) == -1 && k == NULL);
  CHECK(&tc, strstr(err, "MG_CALLBACK_KEY is 2 bytes") != NULL && strstr(err, "at least 32") != NULL);

  /* Missing, empty, a directory, too large. */
  snprintf(path, sizeof path, "%s/missing.key", tmpdir);
  CHECK(&tc, load(path, NULL, NULL, &k, err, sizeof err) == -1 &&
                 strstr(err, "MG_CALLBACK_KEY_FILE") && strstr(err, path));
  snprintf(path, sizeof path, "%s/empty.key", tmpdir);
  write_file(path, "\n", 1, 0600);
  CHECK(&tc, load(path, NULL, NULL, &k, err, sizeof err) == -1 && strstr(err, "empty"));
  CHECK(&tc, load(tmpdir, NULL, NULL, &k, err, sizeof err) == -1);
  {
    char *big = malloc(QTG_CALLBACK_KEY_MAX + 1);
    if (big == NULL) exit(2);
    memset(big, 'k', QTG_CALLBACK_KEY_MAX + 1);
    snprintf(path, sizeof path, "%s/big.key", tmpdir);
    write_file(path, big, QTG_CALLBACK_KEY_MAX + 1, 0600);
    CHECK(&tc, load(path, NULL, NULL, &k, err, sizeof err) == -1 && strstr(err, "larger"));
    write_file(path, big, QTG_CALLBACK_KEY_MAX, 0600);   /* exactly the limit */
    CHECK(&tc, load(path, NULL, NULL, &k, err, sizeof err) == 0);
    qtg_keys_free(k);
    free(big);
  }

  /* Inline key; both set is ambiguous; a header-unsafe id is refused. */
  CHECK(&tc, load(NULL, secret, NULL, &k, err, sizeof err) == 0);
  CHECK(&tc, qtg_keys_callback_hmac(k, msg, strlen(msg), mac) == 0 && memcmp(mac, want, 32) == 0);
  qtg_keys_free(k);
  snprintf(path, sizeof path, "%s/callback.key", tmpdir);
  write_file(path, "x", 1, 0600);
  CHECK(&tc, load(path, secret, NULL, &k, err, sizeof err) == -1 && strstr(err, "both"));
  CHECK(&tc, load(NULL, secret, "k1\r\nX-Evil: 1", &k, err, sizeof err) == -1 &&
                 strstr(err, "MG_CALLBACK_KEY_ID"));

  /* No key at all: fine at start-up, and a MAC is refused. */
  CHECK(&tc, load(NULL, NULL, NULL, &k, err, sizeof err) == 0);
  CHECK(&tc, !qtg_keys_has_callback_key(k));
  CHECK(&tc, qtg_keys_callback_hmac(k, "m", 1, mac) == -1);
  CHECK(&tc, !qtg_keys_has_client_key(k));
  CHECK(&tc, qtg_keys_client_hmac(k, "m", 1, mac) == -1);
  qtg_keys_free(k);
}

/* The API clients' secret (MG_CALLBACK_CLIENT_KEY_FILE): 64 hex digits in a
 * 0600 file, its MAC independent of the callback key; anything else is
 * refused at load, naming the setting. */
static void test_client_key(void) {
  char path[512], cpath[512], err[512], hex[65];
  uint8_t mac[32], want[32];
  qtg_keys *k = NULL;
  static const char secret_hex[] = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";
  uint8_t secret[32];
  memset(secret, 0x5a, sizeof secret);
  snprintf(path, sizeof path, "%s/host.key", tmpdir);
  write_file(path, "qtg-test-secret-0123456789abcdef\n", 33, 0600);
  snprintf(cpath, sizeof cpath, "%s/clients.key", tmpdir);
  write_file(cpath, secret_hex, 64, 0600);
  qtg_keys_config cfg = {path, NULL, NULL, NULL, 0, 0, cpath};
  CHECK(&tc, qtg_keys_load(&cfg, &k, err, sizeof err) == 0);
  CHECK(&tc, qtg_keys_has_client_key(k));
  CHECK(&tc, qtg_keys_client_hmac(k, "label", 5, mac) == 0);
  CHECK(&tc, qtg_hmac_sha256(secret, sizeof secret, "label", 5, want) == 0);
  CHECK(&tc, memcmp(mac, want, 32) == 0);
  CHECK(&tc, qtg_keys_callback_hmac(k, "label", 5, want) == 0);
  CHECK(&tc, memcmp(mac, want, 32) != 0);
  hex_of(mac, 32, hex);
  qtg_keys_free(k);
  k = NULL;
  /* malformed, too open, missing: refused, the message names the setting */
  write_file(cpath, "not hex at all\n", 15, 0600);
  CHECK(&tc, qtg_keys_load(&cfg, &k, err, sizeof err) == -1 && k == NULL &&
             strstr(err, "MG_CALLBACK_CLIENT_KEY_FILE") != NULL);
  write_file(cpath, secret_hex, 64, 0644);
  CHECK(&tc, qtg_keys_load(&cfg, &k, err, sizeof err) == -1 && k == NULL &&
             strstr(err, "MG_CALLBACK_CLIENT_KEY_FILE") != NULL);
  snprintf(cpath, sizeof cpath, "%s/no-such.key", tmpdir);
  CHECK(&tc, qtg_keys_load(&cfg, &k, err, sizeof err) == -1 && k == NULL &&
             strstr(err, "MG_CALLBACK_CLIENT_KEY_FILE") != NULL);
}

/* ---- qtg.crypto from Lua inside a real host --------------------------------- */




/* Run `code` as a host task to completion; returns what it returned (as a
 * string) in st. */
static void run_lua(qtg_host *h, const char *code, qtg_test_task_state *st) {
  memset(st, 0, sizeof *st);
  if (luaL_loadstring(h->L, code) != 0) {
    fprintf(stderr, "lua: %s\n", lua_tostring(h->L, -1));
    lua_pop(h->L, 1);
    return;
  }
  qtg_task_spawn(h, "test_crypto", 0, 0, qtg_test_task_done, st);
  while (!st->done && uv_run(h->loop, UV_RUN_ONCE)) {
  }
}

/* Lua: key_reachable(needle) walks every value reachable from the
 * registry and the globals (tables, upvalues, metatables, environments)
 * and says whether any string contains needle. */
#define LUA_KEY_WALKER                                                         \
  "local function key_reachable(needle)\n"                                     \
  "  local found, visited = false, {}\n"                                       \
  "  local function walk(v)\n"                                                 \
  "    local t = type(v)\n"                                                    \
  "    if t == 'string' then if v:find(needle, 1, true) then found = true end return end\n" \
  "    if (t ~= 'table' and t ~= 'function' and t ~= 'userdata' and t ~= 'thread') or visited[v] then return end\n" \
  "    visited[v] = true\n"                                                    \
  "    if t == 'table' then for k, x in next, v do walk(k) walk(x) end end\n"  \
  "    if t == 'function' then\n"                                              \
  "      for i = 1, 255 do local n, x = debug.getupvalue(v, i) if not n then break end walk(x) end\n" \
  "    end\n"                                                                  \
  "    local mt = debug.getmetatable(v) if mt then walk(mt) end\n"             \
  "    if t == 'function' or t == 'userdata' then local e = debug.getfenv(v) if e then walk(e) end end\n" \
  "  end\n"                                                                    \
  "  walk(debug.getregistry()) walk(_G)\n"                                     \
  "  assert(next(visited), 'walked nothing')\n"                               \
  "  return found\n"                                                           \
  "end\n"

static const char lua_crypto_spec[] =
    LUA_KEY_WALKER
    "local qtg = require 'qtg'\n"
    "local c = qtg.crypto\n"
    "assert(c.keccak256_hex('abc') == '4e03657aea45a94fc7d47ba826c8d667c0d1e6e33a64a036ec44f58fa12d6c45')\n"
    "assert(c.hex(c.keccak256('')) == 'c5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470')\n"
    "assert(c.sha256_hex('abc') == 'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad')\n"
    "assert(#c.sha256('abc') == 32 and c.hex(c.sha256('abc')) == c.sha256_hex('abc'))\n"
    "assert(c.hmac_sha256_hex('Jefe', 'what do ya want for nothing?') ==\n"
    "       '5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843')\n"
    "-- the callback MAC of the illustrative vector, under the key held by C\n"
    "local msg = '1700000000\\nn_01HZX\\n' .. c.sha256_hex('{\"id\":\"req_1\",\"status\":\"completed\"}')\n"
    "assert(c.hmac_callback(msg) == '16f3027b27be7bc137eaccb898c05e6c987789ea4f0ffb2bacf0815ad5d069a2')\n"
    "assert(c.callback_key_id() == 'k9')\n"
    "assert(c.hex('\\0\\255a') == '00ff61' and c.unhex('00FF61') == '\\0\\255a' and c.unhex('0x00ff61') == '\\0\\255a')\n"
    "assert(c.unhex('') == '')\n"
    "for _, bad in ipairs{'abc', 'zz', '0x1', 'g0'} do\n"
    "  local ok, err = pcall(c.unhex, bad)\n"
    "  assert(not ok and err.kind == 'invalid', 'unhex accepted ' .. bad)\n"
    "end\n"
    "assert(c.constant_time_equal('abc', 'abc') == true)\n"
    "assert(c.constant_time_equal('abc', 'abd') == false)\n"
    "assert(c.constant_time_equal('abc', 'ab') == false)\n"
    "assert(not pcall(c.constant_time_equal, 'a'))\n"
    "local seen = {}\n"
    "for i = 1, 200 do\n"
    "  local n = c.nonce()\n"
    "  assert(#n >= 22 and n:match('^[A-Za-z0-9_%-]+$') and not seen[n], n)\n"
    "  seen[n] = true\n"
    "end\n"
    "assert(#c.random_bytes(0) == 0 and #c.random_bytes(48) == 48)\n"
    "assert(c.random_bytes(16) ~= c.random_bytes(16))\n"
    "for _, bad in ipairs{-1, 1.5, 2^21, 'x'} do assert(not pcall(c.random_bytes, bad)) end\n"
    "assert(not pcall(c.sha256))\n"
    "assert(key_reachable('keccak256_hex'), 'the walk cannot see qtg.crypto')\n"
    "assert(not key_reachable('qtg-test-secret-0123456789abcdef'), 'callback key reachable from Lua')\n"
    "return 'done'\n";

static void test_lua(void) {
  char keyfile[512], envfile[600];
  const char *env[] = {"MG_DATABASE_URL=postgresql://127.0.0.1:1/unused",
                       "MG_CONSOLE_ENABLED=false", "MG_WORKERS_ENABLED=false",
                       "MG_LOG_LEVEL=error", "MG_CALLBACK_KEY_ID=k9", envfile, NULL};
  const char *root = getenv("QTG_ROOT");
  qtg_settings s;
  qtg_host h;
  qtg_test_task_state st;
  char err[256] = "";

  snprintf(keyfile, sizeof keyfile, "%s/lua-callback.key", tmpdir);
  write_file(keyfile, "qtg-test-secret-0123456789abcdef\n", 33, 0600);
  snprintf(envfile, sizeof envfile, "MG_CALLBACK_KEY_FILE=%s", keyfile);
  memset(&s, 0, sizeof s);
  if (qtg_settings_load(&s, qtg_test_env_lookup, env, err, sizeof err) != 0 ||
      qtg_host_init(&h, &s, root ? root : QTG_SOURCE_DIR) != 0) {
    fprintf(stderr, "cannot start a host: %s\n", err);
    tc.failed++;
    return;
  }
  run_lua(&h, lua_crypto_spec, &st);
  CHECK(&tc, st.done && st.ok);
  CHECK_STR(&tc, st.result, "done");
  qtg_host_close(&h);
  qtg_settings_free(&s);

  /* Without a key, hmac_callback answers nil, err. */
  env[5] = NULL;
  memset(&s, 0, sizeof s);
  if (qtg_settings_load(&s, qtg_test_env_lookup, env, err, sizeof err) != 0 ||
      qtg_host_init(&h, &s, root ? root : QTG_SOURCE_DIR) != 0) {
    tc.failed++;
    return;
  }
  run_lua(&h,
          "local r, e = require('qtg').crypto.hmac_callback('m')\n"
          "return r == nil and e.kind or 'got a MAC without a key'\n",
          &st);
  CHECK(&tc, st.done && st.ok);
  CHECK_STR(&tc, st.result, "no_key");
  qtg_host_close(&h);
  qtg_settings_free(&s);

  /* An inline MG_CALLBACK_KEY works and is not reachable from Lua either
   * (qtg.settings leaves secrets out). */
  env[5] = "MG_CALLBACK_KEY=inline-secret-7f3a-0123456789abcdef";
  memset(&s, 0, sizeof s);
  if (qtg_settings_load(&s, qtg_test_env_lookup, env, err, sizeof err) != 0 ||
      qtg_host_init(&h, &s, root ? root : QTG_SOURCE_DIR) != 0) {
    tc.failed++;
    return;
  }
  run_lua(&h,
          LUA_KEY_WALKER
          "local c = require('qtg').crypto\n"
          "assert(c.hmac_callback('m') == c.hmac_sha256_hex('inline-secret-7f3a-0123456789abcdef', 'm'))\n"
          "assert(not key_reachable('inline-secret-7f3a-0123456789abcdef'), 'inline key reachable from Lua')\n"
          "return 'done'\n",
          &st);
  CHECK(&tc, st.done && st.ok);
  CHECK_STR(&tc, st.result, "done");
  qtg_host_close(&h);
  qtg_settings_free(&s);

  /* A loose key file stops the host at start-up. */
  write_file(keyfile, "qtg-test-secret-0123456789abcdef\n", 33, 0644);
  env[5] = envfile;
  memset(&s, 0, sizeof s);
  CHECK(&tc, qtg_settings_load(&s, qtg_test_env_lookup, env, err, sizeof err) == 0);
  CHECK(&tc, qtg_host_init(&h, &s, root ? root : QTG_SOURCE_DIR) == -1);
  qtg_settings_free(&s);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "%s/qtg-test-crypto-XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (mkdtemp(tmpdir) == NULL) return 2;
  test_vectors();
  test_sponge_against_openssl();
  test_hex();
  test_compare_and_random();
  test_callback_key();
  test_client_key();
  test_lua();
  {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  }
  return qtg_test_finish(&tc);
}
