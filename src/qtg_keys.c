/* qtg_keys.c -- loads the callback HMAC key and the signer keys from files
 * (or MG_CALLBACK_KEY), checks file permissions and key validity, and
 * performs the few operations that need the key bytes.  See qtg_keys.h.
 *
 * Every buffer that ever held key bytes is wiped (OPENSSL_cleanse) before
 * it is freed or goes out of scope.  Error messages name the setting, the
 * file and the key name; they never include file contents.
 */
#include "qtg_keys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qtg_crypto.h"

typedef struct {
  char name[QTG_KEY_NAME_MAX + 1];
  uint8_t seckey[QTG_SECKEY_LEN];
  uint8_t address[QTG_ADDRESS_LEN];
} qtg_signer_key;

struct qtg_keys {
  uint8_t *callback_key;       /* NULL when none is configured */
  size_t callback_key_len;
  char callback_key_id[QTG_KEY_NAME_MAX + 1];
  uint8_t client_key[32];      /* MG_CALLBACK_CLIENT_KEY_FILE, when has_client_key */
  int has_client_key;
  qtg_signer_key *signers;
  size_t nsigners;
  secp256k1_context *ctx;
  long refused_owner;          /* signer key files owned by this uid are refused; -1: none */
};

/* A signer key file: optional 0x, 64 hex digits, optional newline. */
enum { QTG_SIGNER_FILE_MAX = 2 + 64 + 2 };

static int qtg_keys_is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
}

static int qtg_keys_valid_name(const char *s, size_t len) {
  if (len == 0 || len > QTG_KEY_NAME_MAX) return 0;
  for (size_t i = 0; i < len; i++)
    if (!qtg_keys_is_name_char(s[i])) return 0;
  return 1;
}

/* Read a whole key file into buf (at most cap bytes) after checking that it
 * is a regular file that group and others can neither read nor write, and
 * not owned by refused_owner (>= 0: the daemon's uid, for the signer's
 * keys).  Mode and owner are checked on the open descriptor, so a symlink
 * (as in mounted secrets) is judged by its target and the check cannot race
 * the read. */
static int qtg_keys_read_file(const char *setting, const char *path,
                              uint8_t *buf, size_t cap, size_t *len,
                              long refused_owner, char *err, size_t errlen) {
  struct stat st;
  size_t got = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    snprintf(err, errlen, "%s: cannot open key file %s: %s", setting, path,
             strerror(errno));
    return -1;
  }
  if (fstat(fd, &st) != 0) {
    snprintf(err, errlen, "%s: cannot stat key file %s: %s", setting, path,
             strerror(errno));
    close(fd);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "%s: key file %s is not a regular file", setting, path);
    close(fd);
    return -1;
  }
  if (refused_owner >= 0 && (long)st.st_uid == refused_owner) {
    snprintf(err, errlen,
             "%s: key file %s is owned by uid %ld, the daemon's (MG_SIGNER_ALLOWED_UID), "
             "which can read it; give it to the signer's user",
             setting, path, refused_owner);
    close(fd);
    return -1;
  }
  if ((st.st_mode & 077) != 0) {
    snprintf(err, errlen,
             "%s: key file %s has mode %04o: group/other may access it; "
             "make it 0600 or stricter (chmod 600 %s)",
             setting, path, (unsigned)(st.st_mode & 07777), path);
    close(fd);
    return -1;
  }
  for (;;) {
    /* Read one byte past cap so an oversized file is noticed. */
    uint8_t extra;
    ssize_t n = got < cap ? read(fd, buf + got, cap - got) : read(fd, &extra, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      snprintf(err, errlen, "%s: cannot read key file %s: %s", setting, path,
               strerror(errno));
      close(fd);
      qtg_wipe(buf, cap);
      return -1;
    }
    if (n == 0) break;
    if (got == cap) {
      qtg_wipe(&extra, 1);
      snprintf(err, errlen, "%s: key file %s is larger than %zu bytes", setting,
               path, cap);
      close(fd);
      qtg_wipe(buf, cap);
      return -1;
    }
    got += (size_t)n;
  }
  close(fd);
  *len = got;
  return 0;
}

/* Drop one trailing "\n" or "\r\n" (editors add one). */
static size_t qtg_keys_strip_newline(const uint8_t *buf, size_t len) {
  if (len > 0 && buf[len - 1] == '\n') {
    len--;
    if (len > 0 && buf[len - 1] == '\r') len--;
  }
  return len;
}

static int qtg_keys_set_callback_key(qtg_keys *k, const uint8_t *key,
                                     size_t len) {
  k->callback_key = malloc(len);
  if (k->callback_key == NULL) return -1;
  memcpy(k->callback_key, key, len);
  k->callback_key_len = len;
  return 0;
}

static int qtg_keys_load_callback(qtg_keys *k, const qtg_keys_config *cfg,
                                  char *err, size_t errlen) {
  const char *file = cfg->callback_key_file, *inline_key = cfg->callback_key;
  const char *id = cfg->callback_key_id;
  int has_file = file != NULL && file[0] != '\0';
  int has_inline = inline_key != NULL && inline_key[0] != '\0';

  if (id == NULL || id[0] == '\0') id = "k1";
  /* The id travels in a header: keep it to a safe token. */
  if (!qtg_keys_valid_name(id, strlen(id))) {
    snprintf(err, errlen,
             "MG_CALLBACK_KEY_ID must be 1-%d characters of [A-Za-z0-9_.-]",
             QTG_KEY_NAME_MAX);
    return -1;
  }
  memcpy(k->callback_key_id, id, strlen(id) + 1);

  if (has_file && has_inline) {
    snprintf(err, errlen,
             "MG_CALLBACK_KEY_FILE and MG_CALLBACK_KEY are both set; set only "
             "one, so which key signs callbacks is never ambiguous");
    return -1;
  }
  if (has_file) {
    uint8_t buf[QTG_CALLBACK_KEY_MAX];
    size_t len = 0;
    int rc;
    if (qtg_keys_read_file("MG_CALLBACK_KEY_FILE", file, buf, sizeof buf, &len, -1,
                           err, errlen) != 0)
      return -1;
    len = qtg_keys_strip_newline(buf, len);
    if (len == 0) {
      snprintf(err, errlen, "MG_CALLBACK_KEY_FILE: key file %s is empty", file);
      qtg_wipe(buf, sizeof buf);
      return -1;
    }
    if (len < QTG_CALLBACK_KEY_MIN) {
      snprintf(err, errlen, "MG_CALLBACK_KEY_FILE: the key in %s is %zu bytes; a callback key must be at "
               "least %d (head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' makes one)", file, len,
               QTG_CALLBACK_KEY_MIN);
      qtg_wipe(buf, sizeof buf);
      return -1;
    }
    rc = qtg_keys_set_callback_key(k, buf, len);
    qtg_wipe(buf, sizeof buf);
    if (rc != 0) {
      snprintf(err, errlen, "MG_CALLBACK_KEY_FILE: out of memory");
      return -1;
    }
    return 0;
  }
  if (has_inline) {
    size_t len = strlen(inline_key);
    if (len > QTG_CALLBACK_KEY_MAX) {
      snprintf(err, errlen, "MG_CALLBACK_KEY is longer than %d bytes",
               QTG_CALLBACK_KEY_MAX);
      return -1;
    }
    if (len < QTG_CALLBACK_KEY_MIN) {
      snprintf(err, errlen, "MG_CALLBACK_KEY is %zu bytes; a callback key must be at least %d "
               "(better in a file: MG_CALLBACK_KEY_FILE)", len, QTG_CALLBACK_KEY_MIN);
      return -1;
    }
    if (qtg_keys_set_callback_key(k, (const uint8_t *)inline_key, len) != 0) {
      snprintf(err, errlen, "MG_CALLBACK_KEY: out of memory");
      return -1;
    }
  }
  return 0;
}

/* A 32-byte secret from a key file of its own: 64 hex digits, optionally
 * 0x-prefixed and followed by one newline (signer keys, approver keys). */
static int qtg_keys_read_secret_file(const char *setting, const char *path, uint8_t out[32],
                                     long refused_owner, char *err, size_t errlen) {
  uint8_t buf[QTG_SIGNER_FILE_MAX];
  size_t len = 0;
  const char *hex;
  int ok;

  if (qtg_keys_read_file(setting, path, buf, sizeof buf, &len, refused_owner, err, errlen) != 0)
    return -1;
  len = qtg_keys_strip_newline(buf, len);
  hex = (const char *)buf;
  if (len >= 2 && hex[0] == '0' && (hex[1] == 'x' || hex[1] == 'X')) {
    hex += 2;
    len -= 2;
  }
  ok = len == 64 && qtg_hex_decode(hex, len, out) == 0;
  qtg_wipe(buf, sizeof buf);
  if (!ok) {
    snprintf(err, errlen,
             "%s: key file %s must hold 64 hex digits, optionally 0x-prefixed and "
             "followed by one newline",
             setting, path);
    return -1;
  }
  return 0;
}

int qtg_keys_read_secret(const char *setting, const char *path, uint8_t out[32], char *err,
                         size_t errlen) {
  return qtg_keys_read_secret_file(setting, path, out, -1, err, errlen);
}

/* Load one signer key file into key->seckey and derive its address. */
static int qtg_keys_load_signer_file(qtg_keys *k, qtg_signer_key *key,
                                     const char *path, char *err,
                                     size_t errlen) {
  char setting[QTG_KEY_NAME_MAX + 32];
  snprintf(setting, sizeof setting, "MG_SIGNER_KEYS (key %s)", key->name);
  if (qtg_keys_read_secret_file(setting, path, key->seckey, k->refused_owner, err, errlen) != 0)
    return -1;
  if (!qtg_signer_seckey_valid(k->ctx, key->seckey)) {
    snprintf(err, errlen,
             "MG_SIGNER_KEYS: key file %s (key %s) is not a valid secp256k1 "
             "private key (zero or not below the curve order)",
             path, key->name);
    return -1;
  }
  if (qtg_signer_address_of(k->ctx, key->seckey, key->address) != 0) {
    snprintf(err, errlen, "MG_SIGNER_KEYS: cannot derive the address of key %s",
             key->name);
    return -1;
  }
  return 0;
}

/* Parse "name=/path[,name=/path...]" (blanks around items are ignored, an
 * empty item is skipped) and load each file. */
static int qtg_keys_load_signers(qtg_keys *k, const char *spec, char *err,
                                 size_t errlen) {
  const char *p = spec;
  size_t cap = 1;

  if (spec == NULL || spec[0] == '\0') return 0;
  for (const char *q = spec; *q; q++)
    if (*q == ',') cap++;
  k->signers = calloc(cap, sizeof *k->signers);
  if (k->signers == NULL) {
    snprintf(err, errlen, "MG_SIGNER_KEYS: out of memory");
    return -1;
  }
  while (*p) {
    const char *end = strchr(p, ',');
    const char *item_end = end ? end : p + strlen(p);
    const char *eq, *name_end, *path_start;
    char path[4096];
    qtg_signer_key *key;
    size_t name_len, path_len;

    while (p < item_end && (*p == ' ' || *p == '\t')) p++;
    while (item_end > p && (item_end[-1] == ' ' || item_end[-1] == '\t')) item_end--;
    if (p == item_end) goto next;

    eq = memchr(p, '=', (size_t)(item_end - p));
    if (eq == NULL) {
      snprintf(err, errlen, "MG_SIGNER_KEYS: item %.*s is not name=/path",
               (int)(item_end - p), p);
      return -1;
    }
    name_end = eq;
    while (name_end > p && (name_end[-1] == ' ' || name_end[-1] == '\t')) name_end--;
    path_start = eq + 1;
    while (path_start < item_end && (*path_start == ' ' || *path_start == '\t'))
      path_start++;
    name_len = (size_t)(name_end - p);
    path_len = (size_t)(item_end - path_start);
    if (!qtg_keys_valid_name(p, name_len)) {
      snprintf(err, errlen,
               "MG_SIGNER_KEYS: key name %.*s must be 1-%d characters of "
               "[A-Za-z0-9_.-]",
               (int)name_len, p, QTG_KEY_NAME_MAX);
      return -1;
    }
    if (path_len == 0 || path_len >= sizeof path) {
      snprintf(err, errlen, "MG_SIGNER_KEYS: key %.*s has no usable file path",
               (int)name_len, p);
      return -1;
    }
    for (size_t i = 0; i < k->nsigners; i++) {
      if (strlen(k->signers[i].name) == name_len &&
          memcmp(k->signers[i].name, p, name_len) == 0) {
        snprintf(err, errlen, "MG_SIGNER_KEYS: key name %.*s appears twice",
                 (int)name_len, p);
        return -1;
      }
    }
    key = &k->signers[k->nsigners];
    memcpy(key->name, p, name_len);
    key->name[name_len] = '\0';
    memcpy(path, path_start, path_len);
    path[path_len] = '\0';
    /* Count it before loading so a failure still wipes its buffer. */
    k->nsigners++;
    if (qtg_keys_load_signer_file(k, key, path, err, errlen) != 0) return -1;
  next:
    if (end == NULL) break;
    p = end + 1;
  }
  return 0;
}

int qtg_keys_load(const qtg_keys_config *cfg, qtg_keys **out, char *err,
                  size_t errlen) {
  qtg_keys *k = calloc(1, sizeof *k);
  *out = NULL;
  if (k == NULL) {
    snprintf(err, errlen, "keys: out of memory");
    return -1;
  }
  k->refused_owner = cfg->refuse_signer_key_owner ? cfg->signer_key_refused_uid : -1;
  k->ctx = qtg_signer_context_new();
  if (k->ctx == NULL) {
    snprintf(err, errlen, "keys: cannot create a randomized secp256k1 context");
    qtg_keys_free(k);
    return -1;
  }
  if (cfg->client_key_file != NULL && cfg->client_key_file[0] != '\0') {
    if (qtg_keys_read_secret_file("MG_CALLBACK_CLIENT_KEY_FILE", cfg->client_key_file, k->client_key, -1, err,
                                  errlen) != 0) {
      qtg_keys_free(k);
      return -1;
    }
    k->has_client_key = 1;
  }
  if (qtg_keys_load_callback(k, cfg, err, errlen) != 0 ||
      qtg_keys_load_signers(k, cfg->signer_keys, err, errlen) != 0) {
    qtg_keys_free(k);
    return -1;
  }
  *out = k;
  return 0;
}

void qtg_keys_free(qtg_keys *k) {
  if (k == NULL) return;
  if (k->callback_key != NULL) {
    qtg_wipe(k->callback_key, k->callback_key_len);
    free(k->callback_key);
  }
  if (k->signers != NULL) {
    qtg_wipe(k->signers, k->nsigners * sizeof *k->signers);
    free(k->signers);
  }
  qtg_signer_context_free(k->ctx);
  qtg_wipe(k, sizeof *k);
  free(k);
}

int qtg_keys_open(qtg_host *h, char *err, size_t errlen) {
  qtg_keys_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.callback_key_file = qtg_settings_str(h->settings, QTG_S_CALLBACK_KEY_FILE);
  cfg.callback_key = qtg_settings_str(h->settings, QTG_S_CALLBACK_KEY);
  cfg.callback_key_id = qtg_settings_str(h->settings, QTG_S_CALLBACK_KEY_ID);
  cfg.client_key_file = qtg_settings_str(h->settings, QTG_S_CALLBACK_CLIENT_KEY_FILE);
  /* MG_SIGNER_KEYS is `qtgd signer`'s (qtg_signerd.c): this process never
   * loads a signer key, whatever its environment says. */
  cfg.signer_keys = NULL;
  if (qtg_keys_load(&cfg, &h->keys, err, errlen) == 0) return 0;
  if (!h->settings->report_only) return -1;
  snprintf(h->settings->keys_error, sizeof h->settings->keys_error, "%s", err);
  h->keys = NULL;
  return 0;
}

void qtg_keys_close(qtg_host *h) {
  qtg_keys_free(h->keys);
  h->keys = NULL;
}

int qtg_keys_has_callback_key(const qtg_keys *k) {
  return k != NULL && k->callback_key != NULL;
}

const char *qtg_keys_callback_key_id(const qtg_keys *k) {
  return k != NULL ? k->callback_key_id : "k1";
}

int qtg_keys_callback_hmac(const qtg_keys *k, const void *msg, size_t len,
                           uint8_t out[32]) {
  if (!qtg_keys_has_callback_key(k)) return -1;
  return qtg_hmac_sha256(k->callback_key, k->callback_key_len, msg, len, out);
}

int qtg_keys_has_client_key(const qtg_keys *k) {
  return k != NULL && k->has_client_key;
}

int qtg_keys_client_hmac(const qtg_keys *k, const void *msg, size_t len, uint8_t out[32]) {
  if (!qtg_keys_has_client_key(k)) return -1;
  return qtg_hmac_sha256(k->client_key, sizeof k->client_key, msg, len, out);
}

size_t qtg_keys_signer_count(const qtg_keys *k) {
  return k != NULL ? k->nsigners : 0;
}

const char *qtg_keys_signer_name(const qtg_keys *k, size_t i) {
  return k != NULL && i < k->nsigners ? k->signers[i].name : NULL;
}

static const qtg_signer_key *qtg_keys_find(const qtg_keys *k, const char *name) {
  if (k == NULL || name == NULL) return NULL;
  for (size_t i = 0; i < k->nsigners; i++)
    if (strcmp(k->signers[i].name, name) == 0) return &k->signers[i];
  return NULL;
}

int qtg_keys_signer_address(const qtg_keys *k, const char *name,
                            uint8_t addr[QTG_ADDRESS_LEN]) {
  const qtg_signer_key *key = qtg_keys_find(k, name);
  if (key == NULL) return -1;
  memcpy(addr, key->address, QTG_ADDRESS_LEN);
  return 0;
}

qtg_signer_code qtg_keys_sign_hash(const qtg_keys *k, const char *name,
                                   const uint8_t hash[32], qtg_signature *sig) {
  const qtg_signer_key *key = qtg_keys_find(k, name);
  if (key == NULL) return QTG_SIGNER_NOT_FOUND;
  if (qtg_signer_sign_hash(k->ctx, key->seckey, hash, sig) != 0)
    return QTG_SIGNER_INTERNAL;
  return QTG_SIGNER_OK;
}

const secp256k1_context *qtg_keys_context(const qtg_keys *k) {
  return k != NULL ? k->ctx : secp256k1_context_static;
}
