/* qtg_crypto.c -- hashes, HMAC, hex, randomness and constant-time compare
 * over byte buffers.  See qtg_crypto.h for why this layer exists.
 *
 * Keccak-256 is built here as a sponge over nettle's sha3_permute because
 * the OpenSSL we build against (3.0) has no Keccak-256 and SHA3-256 pads
 * differently (0x06 instead of 0x01), so it gives a different digest.
 */
#include "qtg_crypto.h"

#include <stdlib.h>
#include <string.h>

#include <nettle/sha3.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

/* Keccak-256: capacity 512 bits, so the rate is (1600 - 512) / 8 bytes. */
enum { KECCAK256_RATE = 136 };

/* XOR one rate-sized block into the state.  Lanes are little-endian 64-bit
 * words; composing them byte by byte keeps this right on any host order. */
static void qtg_keccak_absorb_block(struct sha3_state *st, const uint8_t *b) {
  for (size_t i = 0; i < KECCAK256_RATE; i++)
    st->a[i / 8] ^= (uint64_t)b[i] << (8 * (i % 8));
}

/* The sponge shared by Keccak-256 and SHA3-256: they differ only in the
 * first padding byte (0x01 for the original Keccak, 0x06 for FIPS 202). */
static void qtg_sponge256(const void *data, size_t len, uint8_t pad,
                          uint8_t out[QTG_KECCAK256_LEN]) {
  struct sha3_state st;
  uint8_t block[KECCAK256_RATE];
  const uint8_t *p = data;

  memset(&st, 0, sizeof st);
  while (len >= KECCAK256_RATE) {
    qtg_keccak_absorb_block(&st, p);
    sha3_permute(&st);
    p += KECCAK256_RATE;
    len -= KECCAK256_RATE;
  }
  /* Last (possibly empty) partial block: the pad byte after the message,
   * 0x80 in the last byte of the block (they combine when only one byte is
   * left). */
  memset(block, 0, sizeof block);
  if (len > 0) memcpy(block, p, len);
  block[len] ^= pad;
  block[KECCAK256_RATE - 1] ^= 0x80;
  qtg_keccak_absorb_block(&st, block);
  sha3_permute(&st);
  for (size_t i = 0; i < QTG_KECCAK256_LEN; i++)
    out[i] = (uint8_t)(st.a[i / 8] >> (8 * (i % 8)));
  /* The state and block held the message, which may be secret. */
  qtg_wipe(&st, sizeof st);
  qtg_wipe(block, sizeof block);
}

void qtg_keccak256(const void *data, size_t len,
                   uint8_t out[QTG_KECCAK256_LEN]) {
  qtg_sponge256(data, len, 0x01, out);
}

void qtg_sha3_256(const void *data, size_t len, uint8_t out[QTG_KECCAK256_LEN]) {
  qtg_sponge256(data, len, 0x06, out);
}

int qtg_sha256(const void *data, size_t len, uint8_t out[QTG_SHA256_LEN]) {
  unsigned int outlen = 0;
  if (EVP_Digest(data, len, out, &outlen, EVP_sha256(), NULL) != 1) return -1;
  return outlen == QTG_SHA256_LEN ? 0 : -1;
}

int qtg_hmac_sha256(const void *key, size_t keylen, const void *msg,
                    size_t msglen, uint8_t out[QTG_SHA256_LEN]) {
  unsigned int outlen = 0;
  /* HMAC() treats a NULL key as "reuse the previous one" in some versions;
   * an empty key must still be a valid (empty) key. */
  static const uint8_t empty = 0;
  if (key == NULL || keylen == 0) key = &empty;
  if (keylen > (size_t)INT32_MAX) return -1;
  if (HMAC(EVP_sha256(), key, (int)keylen, msg, msglen, out, &outlen) == NULL)
    return -1;
  return outlen == QTG_SHA256_LEN ? 0 : -1;
}

int qtg_random_bytes(void *out, size_t len) {
  uint8_t *p = out;
  /* RAND_bytes takes an int; feed large requests in chunks. */
  while (len > 0) {
    int n = len > (1u << 20) ? (1 << 20) : (int)len;
    if (RAND_bytes(p, n) != 1) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

int qtg_nonce(char out[QTG_NONCE_LEN + 1]) {
  static const char alphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  uint8_t raw[QTG_NONCE_BYTES + 2];   /* padded to a multiple of 3 */
  size_t o = 0;

  memset(raw, 0, sizeof raw);
  if (qtg_random_bytes(raw, QTG_NONCE_BYTES) != 0) return -1;
  /* base64url without padding: 16 bytes -> 22 characters. */
  for (size_t i = 0; i < QTG_NONCE_BYTES; i += 3) {
    uint32_t v = (uint32_t)raw[i] << 16 | (uint32_t)raw[i + 1] << 8 | raw[i + 2];
    for (int k = 0; k < 4 && o < QTG_NONCE_LEN; k++)
      out[o++] = alphabet[(v >> (18 - 6 * k)) & 63];
  }
  out[QTG_NONCE_LEN] = '\0';
  qtg_wipe(raw, sizeof raw);
  return 0;
}

void qtg_hex_encode(const uint8_t *in, size_t len, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < len; i++) {
    out[2 * i] = digits[in[i] >> 4];
    out[2 * i + 1] = digits[in[i] & 15];
  }
  out[2 * len] = '\0';
}

static int qtg_hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int qtg_hex_decode(const char *in, size_t inlen, uint8_t *out) {
  if (inlen % 2 != 0) return -1;
  for (size_t i = 0; i < inlen / 2; i++) {
    int hi = qtg_hex_digit(in[2 * i]), lo = qtg_hex_digit(in[2 * i + 1]);
    if (hi < 0 || lo < 0) return -1;
    out[i] = (uint8_t)(hi << 4 | lo);
  }
  return 0;
}

int qtg_hex_decode_alloc(const char *in, size_t inlen, int allow_prefix,
                         uint8_t **out, size_t *outlen) {
  uint8_t *buf;
  if (allow_prefix && inlen >= 2 && in[0] == '0' && (in[1] == 'x' || in[1] == 'X')) {
    in += 2;
    inlen -= 2;
  }
  if (inlen % 2 != 0) return -1;
  buf = malloc(inlen / 2 + 1);
  if (buf == NULL) return -2;
  if (qtg_hex_decode(in, inlen, buf) != 0) {
    qtg_wipe(buf, inlen / 2 + 1);
    free(buf);
    return -1;
  }
  *out = buf;
  *outlen = inlen / 2;
  return 0;
}

int qtg_constant_time_equal(const void *a, size_t alen, const void *b,
                            size_t blen) {
  /* A length difference is not secret (the attacker chose one of them);
   * the bytes are. */
  if (alen != blen) return 0;
  if (alen == 0) return 1;
  return CRYPTO_memcmp(a, b, alen) == 0;
}

void qtg_wipe(void *p, size_t len) {
  if (p != NULL && len > 0) OPENSSL_cleanse(p, len);
}
