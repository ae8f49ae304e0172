/* fuzz_signer.c -- the `signer` target: the request line `qtgd signer`
 * reads from its socket (qtg_signer_line_parse) and the unsigned EIP-1559
 * payload it decodes (qtg_eip1559_decode).
 *
 * Input: the bytes of one request line (without its LF).  Properties: no
 * crash, leak or undefined behaviour; a parsed SIGN line has lowercase
 * uuids, an attempt from 1, a key name of [A-Za-z0-9_.-]{1,64} and a
 * payload of 1..QTG_SIGNER_PAYLOAD_MAX bytes, and a refused line has a
 * reason (fixed texts: the parser never quotes its input); a decoded payload re-encodes to the
 * same bytes (only canonical RLP is accepted).  The input is also decoded as
 * a raw payload, so the decoder sees every byte string. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qtg_fuzz.h"
#include "qtg_rlp.h"
#include "qtg_signer_proto.h"

static int fuzz_decode_roundtrip(const uint8_t *p, size_t n) {
  qtg_eip1559_tx tx;
  char err[160];
  if (qtg_eip1559_decode(p, n, &tx, err, sizeof err) != 0) return 0;
  qtg_rlp_buf b;
  qtg_rlp_init(&b);
  int ok = qtg_eip1559_unsigned(&tx, &b) == 0 && !b.oom && b.len == n && memcmp(b.p, p, n) == 0;
  qtg_rlp_free(&b);
  if (!ok) {
    fprintf(stderr, "signer: a decoded payload does not re-encode to its bytes\n");
    return -1;
  }
  return 0;
}

int qtg_fuzz_signer(const uint8_t *data, size_t size) {
  qtg_signer_line l;
  char err[160];
  if (fuzz_decode_roundtrip(data, size) != 0) return -1;
  int rc = qtg_signer_line_parse((const char *)data, size, &l, err, sizeof err);
  if (rc != 0) {
    if (err[0] == '\0') {
      fprintf(stderr, "signer: a refused line has no reason\n");
      return -1;
    }
    return 0;
  }
  if (l.verb == QTG_SIGNER_VERB_SIGN) {
    if (l.attempt < 1 || l.payload_len == 0 || l.payload_len > QTG_SIGNER_PAYLOAD_MAX ||
        strlen(l.request_id) != QTG_SIGNER_UUID_LEN || strlen(l.node_id) != QTG_SIGNER_UUID_LEN ||
        strlen(l.key) == 0 || strlen(l.key) > 64) {
      fprintf(stderr, "signer: a SIGN line was accepted with a field out of shape\n");
      qtg_signer_line_free(&l);
      return -1;
    }
    rc = fuzz_decode_roundtrip(l.payload, l.payload_len);
    qtg_signer_line_free(&l);
    return rc;
  }
  if (l.verb == QTG_SIGNER_VERB_ADDRESS && (strlen(l.key) == 0 || strlen(l.key) > 64)) {
    fprintf(stderr, "signer: an ADDRESS line was accepted with a bad key name\n");
    return -1;
  }
  return 0;
}
