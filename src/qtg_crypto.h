/* qtg_crypto.h -- the hashes, MACs, encodings and randomness the host needs,
 * as plain C functions over byte buffers (no Lua, no host state).
 *
 * Why a separate layer: the Lua bindings (lua_crypto.c), the signer
 * (qtg_signer.c) and the EVM encoder (lua_evm.c) all need the same few
 * primitives, and tests check them against published vectors without a
 * host.  SHA-256, HMAC and randomness come from OpenSSL; Keccak-256 (the
 * pre-standard SHA-3 padding that Ethereum uses, which OpenSSL 3.0 lacks)
 * is a sponge over nettle's sha3_permute.
 *
 * Every function that can fail returns 0 on success and -1 on failure.
 */
#ifndef QTG_CRYPTO_H
#define QTG_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

enum {
  QTG_SHA256_LEN = 32,
  QTG_KECCAK256_LEN = 32,
  QTG_NONCE_BYTES = 16,      /* 128 bits of randomness per nonce */
  QTG_NONCE_LEN = 22         /* base64url of 16 bytes, no padding */
};

/* SHA-256 of data into out[32]. */
int qtg_sha256(const void *data, size_t len, uint8_t out[QTG_SHA256_LEN]);

/* Keccak-256 (Ethereum's hash: rate 136 bytes, padding 0x01..0x80) of data
 * into out[32].  Never fails. */
void qtg_keccak256(const void *data, size_t len,
                   uint8_t out[QTG_KECCAK256_LEN]);

/* SHA3-256 (FIPS 202) over the same sponge.  Not used by the host; it
 * exists so tests can check the sponge against OpenSSL's SHA3-256 on
 * inputs of every length around the block size. */
void qtg_sha3_256(const void *data, size_t len, uint8_t out[QTG_KECCAK256_LEN]);

/* HMAC-SHA256(key, msg) into out[32]. */
int qtg_hmac_sha256(const void *key, size_t keylen, const void *msg,
                    size_t msglen, uint8_t out[QTG_SHA256_LEN]);

/* Cryptographically secure random bytes (OpenSSL's DRBG). */
int qtg_random_bytes(void *out, size_t len);

/* A fresh random token of QTG_NONCE_LEN characters from [A-Za-z0-9_-] into
 * out (which must hold QTG_NONCE_LEN + 1 bytes; NUL-terminated).  The fixed
 * character set means a nonce can never contain the "\n" that separates the
 * fields of a callback signature. */
int qtg_nonce(char out[QTG_NONCE_LEN + 1]);

/* Lowercase hex of len bytes into out (2*len characters + NUL). */
void qtg_hex_encode(const uint8_t *in, size_t len, char *out);

/* Decode exactly 2*outlen hex digits (either case) from in into out.
 * Returns -1 on a non-hex character. */
int qtg_hex_decode(const char *in, size_t inlen, uint8_t *out);

/* Length check and decode in one: in has inlen characters, an optional
 * "0x"/"0X" prefix when allow_prefix, then an even number of hex digits.
 * On success *outlen = decoded length and the bytes are in a malloc'd
 * buffer *out (at least one byte is allocated, so *out is never NULL on
 * success; the caller frees).  Returns -1 on odd length or a non-hex
 * character, -2 when memory runs out. */
int qtg_hex_decode_alloc(const char *in, size_t inlen, int allow_prefix,
                         uint8_t **out, size_t *outlen);

/* Constant-time comparison: 1 when equal (same length and bytes), 0
 * otherwise.  The time depends on the lengths only, never on the bytes. */
int qtg_constant_time_equal(const void *a, size_t alen, const void *b,
                            size_t blen);

/* Wipe a buffer in a way the compiler cannot remove (OPENSSL_cleanse). */
void qtg_wipe(void *p, size_t len);

#endif
