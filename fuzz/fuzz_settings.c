/* fuzz_settings.c -- the `settings` target: MG_* settings from the
 * environment and the key files they name.
 *
 * Input: lines.  "NAME=VALUE" is an environment variable (at most 48);
 * "@D CONTENT" (D = 0..3) is the content of key file D, written 0600, and
 * "@D! CONTENT" the same written 0644 (refused by the loader); in values,
 * "@D" stands for that file's path.  The input is parsed as qtgd parses its
 * environment (qtg_settings_load), and when that succeeds the keys named
 * are loaded (qtg_keys_load) and used (an HMAC, a signature recovered).
 *
 * Properties: no crash, leak or undefined behaviour; no error message
 * quotes a secret (MG_CALLBACK_KEY's value or a key file's content) unless
 * the same text is also in a setting that is not secret; a loaded signer
 * key signs and its signature recovers to its address. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qtg_fuzz.h"
#include "qtg_keys.h"
#include "qtg_settings.h"
#include "qtg_signer.h"

#define FUZZ_MAX_ENV 48
#define FUZZ_NFILES 4

typedef struct {
  char *names[FUZZ_MAX_ENV];
  char *values[FUZZ_MAX_ENV];
  int n;
} fuzz_env_t;

static char fuzz_settings_dir[64];

static const char *fuzz_lookup(const char *name, void *ud) {
  fuzz_env_t *e = ud;
  for (int i = e->n - 1; i >= 0; i--)   /* the last one wins, as with env */
    if (strcmp(e->names[i], name) == 0) return e->values[i];
  return NULL;
}

static void fuzz_file_path(int d, char *out, size_t cap) {
  snprintf(out, cap, "%s/key%d", fuzz_settings_dir, d);
}

/* Replace every "@D" in s (length len) by file D's path; NUL-terminated. */
static char *fuzz_expand(const char *s, size_t len) {
  size_t cap = len * 48 + 1, o = 0;
  char *out = malloc(cap);
  if (!out) abort();
  for (size_t i = 0; i < len; i++) {
    if (s[i] == '@' && i + 1 < len && s[i + 1] >= '0' && s[i + 1] < '0' + FUZZ_NFILES) {
      char p[96];
      fuzz_file_path(s[i + 1] - '0', p, sizeof p);
      memcpy(out + o, p, strlen(p));
      o += strlen(p);
      i++;
    } else {
      out[o++] = s[i] ? s[i] : ' '; /* the environment cannot hold a NUL */
    }
  }
  out[o] = '\0';
  return out;
}

/* secret found in err, and in no non-secret setting? */
static int fuzz_leaks(const char *err, const char *secret, size_t slen, const fuzz_env_t *env,
                      const char *secret_name) {
  if (slen < 12 || !memmem(err, strlen(err), secret, slen)) return 0;
  for (int i = 0; i < env->n; i++) {
    if (secret_name && strcmp(env->names[i], secret_name) == 0) continue;
    if (memmem(env->values[i], strlen(env->values[i]), secret, slen)) return 0;
  }
  return 1;
}

static void fuzz_settings_cleanup(void) {
  for (int d = 0; d < FUZZ_NFILES; d++) {
    char p[96];
    fuzz_file_path(d, p, sizeof p);
    unlink(p);
  }
  rmdir(fuzz_settings_dir);
}

int qtg_fuzz_settings(const uint8_t *data, size_t size) {
  fuzz_env_t env = {.n = 0};
  char *files[FUZZ_NFILES] = {0};
  size_t file_len[FUZZ_NFILES] = {0};
  int rc = 0;

  if (!fuzz_settings_dir[0]) {
    snprintf(fuzz_settings_dir, sizeof fuzz_settings_dir, "/tmp/qtg-fuzz-settings.XXXXXX");
    if (!mkdtemp(fuzz_settings_dir)) abort();
    atexit(fuzz_settings_cleanup);
  }
  for (int d = 0; d < FUZZ_NFILES; d++) {
    char p[96];
    fuzz_file_path(d, p, sizeof p);
    unlink(p);
  }

  const char *s = (const char *)data, *end = s + size;
  while (s < end) {
    const char *nl = memchr(s, '\n', (size_t)(end - s));
    const char *le = nl ? nl : end;
    size_t len = (size_t)(le - s);
    if (len >= 3 && s[0] == '@' && s[1] >= '0' && s[1] < '0' + FUZZ_NFILES) {
      int d = s[1] - '0', open_mode = 0600;
      const char *c = s + 2;
      if (c < le && *c == '!') { open_mode = 0644; c++; }
      if (c < le && *c == ' ') c++;
      char p[96];
      fuzz_file_path(d, p, sizeof p);
      unlink(p);
      int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, open_mode);
      if (fd >= 0) {
        fchmod(fd, (mode_t)open_mode);
        ssize_t w = write(fd, c, (size_t)(le - c));
        (void)w;
        close(fd);
        free(files[d]);
        file_len[d] = (size_t)(le - c);
        files[d] = malloc(file_len[d] + 1);
        if (!files[d]) abort();
        memcpy(files[d], c, file_len[d]);
        files[d][file_len[d]] = '\0';
      }
    } else {
      const char *eq = memchr(s, '=', len);
      if (eq && eq > s && env.n < FUZZ_MAX_ENV) {
        env.names[env.n] = strndup(s, (size_t)(eq - s));
        env.values[env.n] = fuzz_expand(eq + 1, (size_t)(le - eq - 1));
        if (!env.names[env.n]) abort();
        env.n++;
      }
    }
    s = nl ? nl + 1 : end;
  }

  qtg_settings st;
  char err[1024] = "";
  if (qtg_settings_load(&st, fuzz_lookup, &env, err, sizeof err) != 0) {
    const char *key = fuzz_lookup("MG_CALLBACK_KEY", &env);
    if (key && fuzz_leaks(err, key, strlen(key), &env, "MG_CALLBACK_KEY")) {
      fprintf(stderr, "settings: an error quotes MG_CALLBACK_KEY: %s\n", err);
      rc = -1;
    }
    goto done;
  }

  qtg_keys_config cfg = {
      .callback_key_file = qtg_settings_str(&st, QTG_S_CALLBACK_KEY_FILE),
      .callback_key = qtg_settings_str(&st, QTG_S_CALLBACK_KEY),
      .callback_key_id = qtg_settings_str(&st, QTG_S_CALLBACK_KEY_ID),
      .signer_keys = qtg_settings_str(&st, QTG_S_SIGNER_KEYS),
  };
  qtg_keys *k = NULL;
  err[0] = '\0';
  if (qtg_keys_load(&cfg, &k, err, sizeof err) != 0) {
    if (k) {
      fprintf(stderr, "settings: qtg_keys_load failed but returned keys\n");
      rc = -1;
    }
    if (fuzz_leaks(err, cfg.callback_key, strlen(cfg.callback_key), &env, "MG_CALLBACK_KEY")) {
      fprintf(stderr, "settings: an error quotes MG_CALLBACK_KEY: %s\n", err);
      rc = -1;
    }
    for (int d = 0; d < FUZZ_NFILES; d++) {
      if (files[d] && !memchr(files[d], '/', file_len[d]) &&
          fuzz_leaks(err, files[d], file_len[d], &env, NULL)) {
        fprintf(stderr, "settings: an error quotes key file %d's content: %s\n", d, err);
        rc = -1;
      }
    }
  } else {
    uint8_t mac[32], hash[32], addr[QTG_ADDRESS_LEN], back[QTG_ADDRESS_LEN];
    if (qtg_keys_has_callback_key(k) && qtg_keys_callback_hmac(k, data, size, mac) != 0) {
      fprintf(stderr, "settings: a loaded callback key does not MAC\n");
      rc = -1;
    }
    memset(hash, 0x5a, sizeof hash);
    for (size_t i = 0; i < qtg_keys_signer_count(k); i++) {
      const char *name = qtg_keys_signer_name(k, i);
      qtg_signature sig;
      if (qtg_keys_signer_address(k, name, addr) != 0 ||
          qtg_keys_sign_hash(k, name, hash, &sig) != QTG_SIGNER_OK ||
          qtg_signer_recover(qtg_keys_context(k), hash, &sig, back) != 0 ||
          memcmp(addr, back, sizeof addr) != 0) {
        fprintf(stderr, "settings: signer key %s does not sign and recover\n", name);
        rc = -1;
      }
    }
    qtg_keys_free(k);
  }
  qtg_settings_free(&st);

done:
  for (int i = 0; i < env.n; i++) {
    free(env.names[i]);
    free(env.values[i]);
  }
  for (int d = 0; d < FUZZ_NFILES; d++) free(files[d]);
  return rc;
}
