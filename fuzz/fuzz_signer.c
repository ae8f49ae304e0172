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
 * a raw payload, so the decoder sees every byte string; a parsed FILL line
 * has a key name, a payload, a principal and a signature of 128 lowercase
 * hex digits or none; the input is read as
 * MG_SIGNER_KEY_CLASSES (qtg_signer_classes_check, key_serves_class), as
 * an MG_SIGNER_APPROVERS enrolment (qtg_approvers_parse; its tiered count,
 * qtg_approvers_quorum_for, qtg_approvers_tiers_of and qtg_approvers_uneven)
 * and as an approval statement (qtg_request_statement_check). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qtg_approvers.h"
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

/* The input as MG_SIGNER_KEY_CLASSES (up to its first NUL): a refused spec
 * has a reason (a fixed text: it cannot quote the spec); an accepted one answers 0 or 1 for any key and class, and
 * never lets a key sign for a class the spec does not spell out. */
static int fuzz_key_classes(const uint8_t *p, size_t n) {
  char *spec = malloc(n + 1), err[256];
  if (spec == NULL) return 0;
  memcpy(spec, p, n);
  spec[n] = '\0';
  int rc = 0;
  err[0] = '\0';
  if (qtg_signer_classes_check(spec, err, sizeof err) != 0) {
    if (err[0] == '\0') {
      fprintf(stderr, "signer: a refused MG_SIGNER_KEY_CLASSES has no reason\n");
      rc = -1;
    }
  } else if (spec[0] != '\0') {
    static const char *const keys[] = {"hot", "a", "", "hot=a"};
    static const char *const classes[] = {"mainnet", "a", "", "a|b", "a,b"};
    for (size_t k = 0; k < 4; k++)
      for (size_t c = 0; c < 5; c++) {
        int yes = qtg_signer_key_serves_class(spec, keys[k], classes[c]);
        if (yes != 0 && yes != 1) rc = -1;
        /* a yes names the key and the class, whole, in the spec */
        if (yes && (!qtg_signer_classes_name(spec, keys[k]) || strstr(spec, classes[c]) == NULL ||
                    classes[c][0] == '\0' || strchr(classes[c], '|') || strchr(classes[c], ','))) {
          fprintf(stderr, "signer: key %s signs for class %s the spec does not give it\n", keys[k],
                  classes[c]);
          rc = -1;
        }
      }
  }
  free(spec);
  return rc;
}

/* The input as an enrolment: refused with a reason, or accepted with its
 * persons findable by name, a quorum in range, a tiered count between the
 * base and the highest, and a deployment that a statement can name; and
 * as a statement:
 * accepted only in its one form (ending in a newline, short). */
static int fuzz_approvers(const uint8_t *p, size_t n) {
  qtg_approvers *a = NULL;
  char err[512];
  int rc = 0;
  err[0] = '\0';
  if (qtg_approvers_parse((const char *)p, n, &a, err, sizeof err) != 0) {
    if (a != NULL || err[0] == '\0') {
      fprintf(stderr, "signer: a refused enrolment has no reason or leaves a result\n");
      rc = -1;
    }
  } else {
    int q = qtg_approvers_quorum(a, "mainnet");
    if (q < -1 || q > QTG_APPROVER_QUORUM_MAX) rc = -1;
    /* every class's quorum lies in the file's range (what unbound keys need) */
    int lowest, highest;
    if (qtg_approvers_quorum_range(a, &lowest, &highest) == 0 || lowest < 0 || lowest > highest ||
        highest > QTG_APPROVER_QUORUM_MAX || (q != -1 && (q < lowest || q > highest)))
      rc = -1;
    /* a tiered count is at least the base, at most the file's highest,
     * or -1 (no quorum, an amount a tier cannot read) with a reason */
    static const char *const amounts[] = {"0", "1", "100.5", "100.500000000000000001", "1e3", NULL};
    char why[300];
    for (int i = 0; i < 6; i++) {
      why[0] = '\0';
      int t = qtg_approvers_quorum_for(a, "mainnet", "ETH", amounts[i], (uint32_t)i * 1000, why, sizeof why);
      if ((t == -1 && why[0] == '\0') || (t != -1 && (t < q || q < 0 || t > highest)))
        rc = -1;
    }
    /* the tiers named for a class: terminated in any buffer, and none for
     * a class whose quorum a tier can never raise */
    char listed[64];
    size_t tiers = qtg_approvers_tiers_of(a, "mainnet", listed, sizeof listed);
    if (strnlen(listed, sizeof listed) == sizeof listed || (tiers == 0 && listed[0] != '\0')) rc = -1;
    why[0] = '\0';
    int uneven = qtg_approvers_uneven(a, why, sizeof why);
    if (uneven != 0 && (uneven != 1 || why[0] == '\0')) rc = -1;
    for (size_t i = 0; i < qtg_approvers_count(a); i++)
      if (qtg_approvers_person_name(a, (int)i) == NULL) rc = -1;
    /* an accepted enrolment names a deployment a statement can carry */
    const char *d = qtg_approvers_deployment(a);
    char st[QTG_APPROVAL_STATEMENT_MAX];
    if (d == NULL || qtg_request_statement(st, sizeof st, QTG_STATEMENT_APPROVAL, d, "0b6d1c2e-1111-4222-8333-944455556666",
                                            "mainnet",
                                            "00000000000000000000000000000000000000000000000000000000000000aa",
                                            "00000000000000000000000000000000000000000000000000000000000000bb") != 0 ||
        qtg_request_statement_check(st, strlen(st)) != 0)
      rc = -1;
    if (qtg_approvers_verify(a, 0, (const char *)p, n, "00") != 0) rc = -1;
    if (rc != 0) fprintf(stderr, "signer: an accepted enrolment answers out of range\n");
    qtg_approvers_free(a);
  }
  if (qtg_request_statement_check((const char *)p, n) >= 0 &&
      (n == 0 || n >= QTG_APPROVAL_STATEMENT_MAX || p[n - 1] != '\n')) {
    fprintf(stderr, "signer: a statement out of its form was accepted\n");
    rc = -1;
  }
  return rc;
}

int qtg_fuzz_signer(const uint8_t *data, size_t size) {
  qtg_signer_line l;
  char err[160];
  if (fuzz_decode_roundtrip(data, size) != 0) return -1;
  if (fuzz_key_classes(data, size) != 0) return -1;
  if (fuzz_approvers(data, size) != 0) return -1;
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
  if (l.verb == QTG_SIGNER_VERB_FILL) {
    size_t sl = strlen(l.signature);
    int bad = l.payload_len == 0 || l.payload_len > QTG_SIGNER_PAYLOAD_MAX || strlen(l.key) == 0 ||
              strlen(l.key) > 64 || !qtg_approvers_principal_ok(l.principal, strlen(l.principal)) ||
              (sl != 0 && sl != 128);
    for (size_t i = 0; i < sl; i++)
      if (!((l.signature[i] >= '0' && l.signature[i] <= '9') || (l.signature[i] >= 'a' && l.signature[i] <= 'f')))
        bad = 1;
    if (bad) {
      fprintf(stderr, "signer: a FILL line was accepted with a field out of shape\n");
      qtg_signer_line_free(&l);
      return -1;
    }
    rc = fuzz_decode_roundtrip(l.payload, l.payload_len);
    qtg_signer_line_free(&l);
    return rc;
  }
  if ((l.verb == QTG_SIGNER_VERB_KEYS && size != 4) || (l.verb == QTG_SIGNER_VERB_APPROVALS && size != 9)) {
    fprintf(stderr, "signer: a KEYS or APPROVALS line was accepted with more than its verb\n");
    return -1;
  }
  if (l.verb == QTG_SIGNER_VERB_ADDRESS && (strlen(l.key) == 0 || strlen(l.key) > 64)) {
    fprintf(stderr, "signer: an ADDRESS line was accepted with a bad key name\n");
    return -1;
  }
  return 0;
}
