/* qtg_signer_proto.h -- the signer's wire protocol and the pure checks the
 * signer process (qtg_signerd.c) applies to what it is asked to sign.
 *
 * Why a line protocol with fixed tokens: the signer is the last gate before
 * money moves, so its parser is small, strict and fuzzed (fuzz/fuzz_signer.c).
 * One request per connection, one line each way (LF-terminated, single
 * spaces, nothing optional):
 *
 *   SIGN <request uuid> <node uuid> <attempt> <key name> 0x<payload hex>
 *   FILL <key name> 0x<payload hex> <principal> <signature hex|->
 *   ADDRESS <key name>
 *   KEYS
 *   APPROVALS
 *
 * answered by
 *
 *   OK <words...>                 SIGN, FILL: 0x<r s v hex> 0x<address>
 *                                 ADDRESS: 0x<address>; KEYS: the names
 *                                 APPROVALS: how approvals are checked:
 *                                 "enrolled <deployment> <sha256 of the
 *                                 enrolment>", "trusting-rows" or "none"
 *   REFUSED <CODE> <reason text>
 *
 * uuids are lowercase 8-4-4-4-12 hex, attempt a decimal 1..2147483647
 * without leading zeros, key names [A-Za-z0-9_.-]{1,64}, the payload 0x +
 * lowercase or uppercase hex of 1..QTG_SIGNER_PAYLOAD_MAX bytes.  FILL (a
 * 0-value transfer of the key's address to itself, at a nonce the signer
 * granted a transfer at: docs/evm.md, "Filling a nonce") names who asks (a
 * principal, qtg_approvers_principal_ok) and carries that person's Ed25519
 * signature of the fill statement (128 hex digits), or "-" for none (a
 * signer without an enrolment does not ask for one).  Anything else is
 * refused as SIGNER_BAD_REQUEST before any database or key is touched.
 *
 * The payload is an unsigned EIP-1559 transaction (0x02 || rlp of nine
 * fields); qtg_eip1559_decode reads it and refuses every non-canonical form
 * (it re-encodes the fields and compares the bytes).
 */
#ifndef QTG_SIGNER_PROTO_H
#define QTG_SIGNER_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "qtg_rlp.h"

enum {
  QTG_SIGNER_PAYLOAD_MAX = 2048,                 /* bytes of an unsigned tx */
  QTG_SIGNER_LINE_MAX = 4 * 1024 + 256,          /* one request line */
  QTG_SIGNER_UUID_LEN = 36
};

typedef enum {
  QTG_SIGNER_VERB_SIGN,
  QTG_SIGNER_VERB_ADDRESS,
  QTG_SIGNER_VERB_KEYS,
  QTG_SIGNER_VERB_APPROVALS,
  QTG_SIGNER_VERB_FILL
} qtg_signer_verb;

typedef struct {
  qtg_signer_verb verb;
  char request_id[QTG_SIGNER_UUID_LEN + 1];
  char node_id[QTG_SIGNER_UUID_LEN + 1];
  int attempt;
  char key[65];
  uint8_t *payload;          /* malloc'd (SIGN, FILL); qtg_signer_line_free */
  size_t payload_len;
  char principal[129];       /* FILL: who asks */
  char signature[129];       /* FILL: 128 hex, or "" for "-" */
} qtg_signer_line;

/* Parse one request line (without its LF).  0 on success; -1 with a reason
 * in err (never quoting the input); -2 when memory runs out. */
int qtg_signer_line_parse(const char *s, size_t len, qtg_signer_line *out,
                          char *err, size_t errlen);
void qtg_signer_line_free(qtg_signer_line *l);

/* Decode an unsigned EIP-1559 payload into tx (data points into bytes;
 * the access list must be empty).  0, or -1 with a reason in err. */
int qtg_eip1559_decode(const uint8_t *bytes, size_t len, qtg_eip1559_tx *tx,
                       char *err, size_t errlen);

/* "1.5" with `decimals` decimals -> base units, exactly.  A plain decimal
 * (digits, optionally '.' and digits), no sign, no exponent, no more
 * fractional digits than decimals.  0 or -1. */
int qtg_amount_to_units(const char *amount, size_t len, int decimals, qtg_u256 *out);

/* MG_SIGNER_KEY_CLASSES: which network classes each signer key signs for,
 * "key=class|class,key=class" (key names as in the protocol, classes as
 * MG_NETWORK_CLASS: [a-z0-9_-]{1,32}).  qtg_signer_classes_check: 0 when
 * spec is well formed (the empty spec is: it binds nothing), or -1 with a
 * reason that never quotes spec.  qtg_signer_key_serves_class: 1 when a
 * well-formed spec lets key sign for a request of class klass, else 0; the
 * empty spec lets every key sign for every class, a key the spec does not
 * name signs for none. */
int qtg_signer_classes_check(const char *spec, char *err, size_t errlen);
int qtg_signer_key_serves_class(const char *spec, const char *key, const char *klass);
/* 1 when spec has an item for key (whatever its classes), else 0. */
int qtg_signer_classes_name(const char *spec, const char *key);

/* -1, 0, 1 as a < b, a == b, a > b. */
int qtg_u256_cmp(const qtg_u256 *a, const qtg_u256 *b);

/* v = v * k; -1 (v then undefined) when the product is 2^256 or more. */
int qtg_u256_mul_small(qtg_u256 *v, uint32_t k);
/* Decimal text of v (out: at least 79 bytes). */
void qtg_u256_decimal(const qtg_u256 *v, char *out, size_t outlen);

#endif
