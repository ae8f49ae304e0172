/* qtg_signer.h -- secp256k1 signing for EVM chains, and the checks a
 * SignRequest must pass before anything is signed.
 *
 * Why: the signer is the last gate before money moves.  It signs only a
 * payload hash that the approved plan allowed (signing_intent.
 * allowed_payload_hash) and that the payload it was shown really hashes to,
 * so a bug or a compromise in policy code cannot get an arbitrary hash
 * signed.  The functions here work on raw secret keys passed in by
 * qtg_keys.c, which owns them; nothing here stores a key.
 *
 * libsecp256k1 does the elliptic-curve work: RFC 6979 deterministic nonces
 * and low-S signatures (EIP-2), with the recovery id EVM needs.
 */
#ifndef QTG_SIGNER_H
#define QTG_SIGNER_H

#include <stddef.h>
#include <stdint.h>

#include <secp256k1.h>

enum {
  QTG_SECKEY_LEN = 32,
  QTG_ADDRESS_LEN = 20,
  QTG_ADDRESS_HEX_LEN = 42   /* "0x" + 40 hex digits */
};

typedef struct {
  uint8_t r[32];
  uint8_t s[32];
  int recid;                 /* 0 or 1 (EIP-1559 y_parity) */
} qtg_signature;

/* Why a SignRequest was refused; the names are the codes Lua sees. */
typedef enum {
  QTG_SIGNER_OK = 0,
  QTG_SIGNER_NOT_FOUND,              /* no key of that name is loaded */
  QTG_SIGNER_PAYLOAD_HASH_MISMATCH,  /* hash not allowed, or payload differs */
  QTG_SIGNER_BAD_REQUEST,            /* malformed request (hex, types) */
  QTG_SIGNER_INTERNAL                /* libsecp256k1 or memory failure */
} qtg_signer_code;

const char *qtg_signer_code_name(qtg_signer_code code);

/* A context for signing and verification, randomized against side
 * channels.  NULL when memory or randomness runs out. */
secp256k1_context *qtg_signer_context_new(void);
void qtg_signer_context_free(secp256k1_context *ctx);

/* 1 when seckey is a valid secp256k1 secret key (0 < k < n). */
int qtg_signer_seckey_valid(const secp256k1_context *ctx,
                            const uint8_t seckey[QTG_SECKEY_LEN]);

/* The EVM address of a key: keccak256 of the 64-byte uncompressed public
 * key (without its 0x04 prefix), last 20 bytes. */
int qtg_signer_address_of(const secp256k1_context *ctx,
                          const uint8_t seckey[QTG_SECKEY_LEN],
                          uint8_t addr[QTG_ADDRESS_LEN]);

/* Sign a 32-byte hash: deterministic (RFC 6979), low-S, with recovery id. */
int qtg_signer_sign_hash(const secp256k1_context *ctx,
                         const uint8_t seckey[QTG_SECKEY_LEN],
                         const uint8_t hash[32], qtg_signature *sig);

/* The address whose key made sig over hash; -1 when sig is invalid. */
int qtg_signer_recover(const secp256k1_context *ctx, const uint8_t hash[32],
                       const qtg_signature *sig, uint8_t addr[QTG_ADDRESS_LEN]);

/* "0x" + lowercase hex (out holds QTG_ADDRESS_HEX_LEN + 1 bytes). */
void qtg_signer_address_hex(const uint8_t addr[QTG_ADDRESS_LEN], char *out);

/* EIP-55 mixed-case checksum form of an address (out: 43 bytes). */
void qtg_signer_checksum_address(const uint8_t addr[QTG_ADDRESS_LEN],
                                 char *out);

/* Parse "0x" + 40 hex digits (any case; the checksum is not enforced).
 * Returns -1 on any other shape. */
int qtg_signer_parse_address(const char *s, size_t len,
                             uint8_t addr[QTG_ADDRESS_LEN]);

/* Parse "0x" + 64 hex digits into a 32-byte hash; -1 otherwise. */
int qtg_signer_parse_hash(const char *s, size_t len, uint8_t hash[32]);

/* The checks of a SignRequest, in order: payload_hash and allowed_payload_hash
 * are "0x" + 64 hex, payload is "0x" + even hex (BAD_REQUEST otherwise); the
 * two hashes are equal and keccak256(payload bytes) equals them
 * (PAYLOAD_HASH_MISMATCH otherwise).  On QTG_SIGNER_OK the hash to sign is
 * in hash_out.  Otherwise msg says what was wrong (it never quotes more than
 * the field name and what was expected). */
qtg_signer_code qtg_signer_check_request(const char *payload_hash,
                                         size_t payload_hash_len,
                                         const char *allowed_hash,
                                         size_t allowed_hash_len,
                                         const char *payload, size_t payload_len,
                                         uint8_t hash_out[32], char *msg,
                                         size_t msglen);

/* r || s || v as "0x" + 130 hex digits, v = recid (out: 133 bytes). */
void qtg_signer_signature_hex(const qtg_signature *sig, char *out);

#endif
