/* qtg_signer.c -- secp256k1 signing, recovery, EVM addresses (EIP-55) and
 * the SignRequest checks.  See qtg_signer.h for why the checks live in C.
 */
#include "qtg_signer.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <secp256k1_recovery.h>

#include "qtg_crypto.h"

const char *qtg_signer_code_name(qtg_signer_code code) {
  switch (code) {
    case QTG_SIGNER_OK: return "OK";
    case QTG_SIGNER_NOT_FOUND: return "SIGNER_NOT_FOUND";
    case QTG_SIGNER_PAYLOAD_HASH_MISMATCH: return "SIGNER_PAYLOAD_HASH_MISMATCH";
    case QTG_SIGNER_BAD_REQUEST: return "SIGNER_BAD_REQUEST";
    case QTG_SIGNER_INTERNAL: return "SIGNER_INTERNAL";
  }
  return "SIGNER_INTERNAL";
}

secp256k1_context *qtg_signer_context_new(void) {
  uint8_t seed[32];
  secp256k1_context *ctx = secp256k1_context_create(SECP256K1_CONTEXT_NONE);
  if (ctx == NULL) return NULL;
  /* Randomization blinds the signing computations against timing and
   * power side channels; refuse to run without it. */
  if (qtg_random_bytes(seed, sizeof seed) != 0 ||
      !secp256k1_context_randomize(ctx, seed)) {
    secp256k1_context_destroy(ctx);
    qtg_wipe(seed, sizeof seed);
    return NULL;
  }
  qtg_wipe(seed, sizeof seed);
  return ctx;
}

void qtg_signer_context_free(secp256k1_context *ctx) {
  if (ctx != NULL) secp256k1_context_destroy(ctx);
}

int qtg_signer_seckey_valid(const secp256k1_context *ctx,
                            const uint8_t seckey[QTG_SECKEY_LEN]) {
  return secp256k1_ec_seckey_verify(ctx, seckey) == 1;
}

/* keccak256 of the 64-byte uncompressed point, last 20 bytes. */
static int qtg_signer_address_of_pubkey(const secp256k1_context *ctx,
                                        const secp256k1_pubkey *pub,
                                        uint8_t addr[QTG_ADDRESS_LEN]) {
  uint8_t ser[65], hash[32];
  size_t serlen = sizeof ser;
  if (!secp256k1_ec_pubkey_serialize(ctx, ser, &serlen, pub,
                                     SECP256K1_EC_UNCOMPRESSED) ||
      serlen != 65 || ser[0] != 0x04)
    return -1;
  qtg_keccak256(ser + 1, 64, hash);
  memcpy(addr, hash + 12, QTG_ADDRESS_LEN);
  return 0;
}

int qtg_signer_address_of(const secp256k1_context *ctx,
                          const uint8_t seckey[QTG_SECKEY_LEN],
                          uint8_t addr[QTG_ADDRESS_LEN]) {
  secp256k1_pubkey pub;
  if (!secp256k1_ec_pubkey_create(ctx, &pub, seckey)) return -1;
  return qtg_signer_address_of_pubkey(ctx, &pub, addr);
}

int qtg_signer_sign_hash(const secp256k1_context *ctx,
                         const uint8_t seckey[QTG_SECKEY_LEN],
                         const uint8_t hash[32], qtg_signature *sig) {
  secp256k1_ecdsa_recoverable_signature rs;
  uint8_t compact[64];
  int recid = -1;
  /* NULL nonce function = secp256k1_nonce_function_rfc6979. */
  if (!secp256k1_ecdsa_sign_recoverable(ctx, &rs, hash, seckey, NULL, NULL))
    return -1;
  if (!secp256k1_ecdsa_recoverable_signature_serialize_compact(ctx, compact,
                                                               &recid, &rs) ||
      recid < 0 || recid > 3)
    return -1;
  memcpy(sig->r, compact, 32);
  memcpy(sig->s, compact + 32, 32);
  sig->recid = recid;
  return 0;
}

int qtg_signer_recover(const secp256k1_context *ctx, const uint8_t hash[32],
                       const qtg_signature *sig, uint8_t addr[QTG_ADDRESS_LEN]) {
  secp256k1_ecdsa_recoverable_signature rs;
  secp256k1_pubkey pub;
  uint8_t compact[64];
  if (sig->recid < 0 || sig->recid > 3) return -1;
  memcpy(compact, sig->r, 32);
  memcpy(compact + 32, sig->s, 32);
  if (!secp256k1_ecdsa_recoverable_signature_parse_compact(ctx, &rs, compact,
                                                           sig->recid))
    return -1;
  if (!secp256k1_ecdsa_recover(ctx, &pub, &rs, hash)) return -1;
  return qtg_signer_address_of_pubkey(ctx, &pub, addr);
}

void qtg_signer_address_hex(const uint8_t addr[QTG_ADDRESS_LEN], char *out) {
  out[0] = '0';
  out[1] = 'x';
  qtg_hex_encode(addr, QTG_ADDRESS_LEN, out + 2);
}

void qtg_signer_checksum_address(const uint8_t addr[QTG_ADDRESS_LEN],
                                 char *out) {
  uint8_t hash[32];
  qtg_signer_address_hex(addr, out);
  /* EIP-55: hash the 40 lowercase hex characters; a letter is upper case
   * when the matching nibble of the hash is 8 or more. */
  qtg_keccak256(out + 2, 40, hash);
  for (int i = 0; i < 40; i++) {
    int nibble = (i % 2 == 0) ? hash[i / 2] >> 4 : hash[i / 2] & 15;
    char *c = &out[2 + i];
    if (*c >= 'a' && *c <= 'f' && nibble >= 8) *c = (char)toupper((unsigned char)*c);
  }
}

/* "0x" + exactly 2*n hex digits into out[n]. */
static int qtg_signer_parse_fixed_hex(const char *s, size_t len, uint8_t *out,
                                      size_t n) {
  if (s == NULL || len != 2 + 2 * n || s[0] != '0' || (s[1] != 'x' && s[1] != 'X'))
    return -1;
  return qtg_hex_decode(s + 2, 2 * n, out);
}

int qtg_signer_parse_address(const char *s, size_t len,
                             uint8_t addr[QTG_ADDRESS_LEN]) {
  return qtg_signer_parse_fixed_hex(s, len, addr, QTG_ADDRESS_LEN);
}

int qtg_signer_parse_hash(const char *s, size_t len, uint8_t hash[32]) {
  return qtg_signer_parse_fixed_hex(s, len, hash, 32);
}

qtg_signer_code qtg_signer_check_request(const char *payload_hash,
                                         size_t payload_hash_len,
                                         const char *allowed_hash,
                                         size_t allowed_hash_len,
                                         const char *payload, size_t payload_len,
                                         uint8_t hash_out[32], char *msg,
                                         size_t msglen) {
  uint8_t want[32], allowed[32], got[32];
  uint8_t *bytes = NULL;
  size_t nbytes = 0;
  int rc;

  if (qtg_signer_parse_hash(payload_hash, payload_hash_len, want) != 0) {
    snprintf(msg, msglen, "payload_hash must be 0x followed by 64 hex digits");
    return QTG_SIGNER_BAD_REQUEST;
  }
  if (qtg_signer_parse_hash(allowed_hash, allowed_hash_len, allowed) != 0) {
    snprintf(msg, msglen,
             "signing_intent.allowed_payload_hash must be 0x followed by 64 hex digits");
    return QTG_SIGNER_BAD_REQUEST;
  }
  if (payload == NULL || payload_len < 2 || payload[0] != '0' ||
      (payload[1] != 'x' && payload[1] != 'X')) {
    snprintf(msg, msglen, "payload must be 0x followed by an even number of hex digits");
    return QTG_SIGNER_BAD_REQUEST;
  }
  rc = qtg_hex_decode_alloc(payload + 2, payload_len - 2, 0, &bytes, &nbytes);
  if (rc == -2) {
    snprintf(msg, msglen, "out of memory decoding payload");
    return QTG_SIGNER_INTERNAL;
  }
  if (rc != 0) {
    snprintf(msg, msglen, "payload must be 0x followed by an even number of hex digits");
    return QTG_SIGNER_BAD_REQUEST;
  }
  qtg_keccak256(bytes, nbytes, got);
  free(bytes);
  if (memcmp(want, allowed, 32) != 0) {
    snprintf(msg, msglen, "payload_hash is not the signing intent's allowed_payload_hash");
    return QTG_SIGNER_PAYLOAD_HASH_MISMATCH;
  }
  if (memcmp(want, got, 32) != 0) {
    snprintf(msg, msglen, "keccak256(payload) does not equal payload_hash");
    return QTG_SIGNER_PAYLOAD_HASH_MISMATCH;
  }
  memcpy(hash_out, want, 32);
  if (msglen > 0) msg[0] = '\0';
  return QTG_SIGNER_OK;
}

void qtg_signer_signature_hex(const qtg_signature *sig, char *out) {
  uint8_t raw[65];
  memcpy(raw, sig->r, 32);
  memcpy(raw + 32, sig->s, 32);
  raw[64] = (uint8_t)sig->recid;
  out[0] = '0';
  out[1] = 'x';
  qtg_hex_encode(raw, sizeof raw, out + 2);
}
