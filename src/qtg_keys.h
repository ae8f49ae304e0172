/* qtg_keys.h -- the host's secrets: the callback HMAC key and the signer
 * keys, loaded once at start-up and held in C memory only.
 *
 * Why here and nowhere else: keys never enter Lua, logs or the console.
 * Lua asks for a MAC or a signature and gets the result back; the key bytes
 * stay in this module, are wiped on close, and no error message ever quotes
 * them.  Key files must not be readable or writable by group or others
 * (mode & 077 == 0), so a misconfigured deployment fails at start-up rather
 * than running with a leaked key.
 *
 * Settings: MG_CALLBACK_KEY_FILE or MG_CALLBACK_KEY (not both),
 * MG_CALLBACK_KEY_ID, MG_CALLBACK_CLIENT_KEY_FILE, MG_SIGNER_KEYS
 * "name=/path[,name=/path...]".
 */
#ifndef QTG_KEYS_H
#define QTG_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "qtg_host.h"
#include "qtg_signer.h"

typedef struct qtg_keys qtg_keys;

enum {
  QTG_KEY_NAME_MAX = 64,          /* signer key names: [A-Za-z0-9_.-]{1,64} */
  QTG_CALLBACK_KEY_MAX = 4096,    /* bytes in a callback key (file) */
  QTG_CALLBACK_KEY_MIN = 32       /* ... at least: HMAC-SHA-256's own length; a shorter
                                   * one can be guessed, and a forged "completed" callback is
                                   * what a receiver releases goods on */
};

/* Where the keys come from; any field may be NULL or "" (= not set). */
typedef struct {
  const char *callback_key_file;   /* MG_CALLBACK_KEY_FILE */
  const char *callback_key;        /* MG_CALLBACK_KEY */
  const char *callback_key_id;     /* MG_CALLBACK_KEY_ID */
  const char *signer_keys;         /* MG_SIGNER_KEYS */
  int refuse_signer_key_owner;     /* set: signer key files owned by signer_key_refused_uid */
  long signer_key_refused_uid;     /* (the daemon's uid, when not the signer's) are refused */
  const char *client_key_file;     /* MG_CALLBACK_CLIENT_KEY_FILE */
} qtg_keys_config;

/* Load every key the config names.  On error returns -1 with a message
 * naming the setting and the file (never the key bytes) and *out is NULL. */
int qtg_keys_load(const qtg_keys_config *cfg, qtg_keys **out, char *err,
                  size_t errlen);
/* Wipe and free; NULL is allowed. */
void qtg_keys_free(qtg_keys *k);

/* Read a 32-byte secret from its own key file (a regular file, mode 0600
 * or stricter: 64 hex digits, optional 0x and newline); the message names
 * setting and path, never the bytes.  The caller wipes out. */
int qtg_keys_read_secret(const char *setting, const char *path, uint8_t out[32], char *err,
                         size_t errlen);

/* Subsystem rows (qtg_modules.h): load from h->settings into h->keys. */
int qtg_keys_open(qtg_host *h, char *err, size_t errlen);
void qtg_keys_close(qtg_host *h);

/* Callback MAC.  1 when a callback key is configured. */
int qtg_keys_has_callback_key(const qtg_keys *k);
/* The key id (MG_CALLBACK_KEY_ID) published next to signatures. */
const char *qtg_keys_callback_key_id(const qtg_keys *k);
/* HMAC-SHA256 of msg under the callback key; -1 when no key is set. */
int qtg_keys_callback_hmac(const qtg_keys *k, const void *msg, size_t len,
                           uint8_t out[32]);
/* The API clients' own secret (MG_CALLBACK_CLIENT_KEY_FILE), which their
 * callback keys derive from instead of the callback key (lua_api_keys.c):
 * 1 when configured; the HMAC of msg under it, -1 when it is not. */
int qtg_keys_has_client_key(const qtg_keys *k);
int qtg_keys_client_hmac(const qtg_keys *k, const void *msg, size_t len, uint8_t out[32]);

/* Signer keys, in the order MG_SIGNER_KEYS lists them. */
size_t qtg_keys_signer_count(const qtg_keys *k);
const char *qtg_keys_signer_name(const qtg_keys *k, size_t i);
/* The address of key `name`; -1 when there is no such key. */
int qtg_keys_signer_address(const qtg_keys *k, const char *name,
                            uint8_t addr[QTG_ADDRESS_LEN]);
/* Sign a 32-byte hash with key `name`.  Returns QTG_SIGNER_OK,
 * QTG_SIGNER_NOT_FOUND or QTG_SIGNER_INTERNAL. */
qtg_signer_code qtg_keys_sign_hash(const qtg_keys *k, const char *name,
                                   const uint8_t hash[32], qtg_signature *sig);
/* The verification context (public operations only: recover). */
const secp256k1_context *qtg_keys_context(const qtg_keys *k);

#endif
