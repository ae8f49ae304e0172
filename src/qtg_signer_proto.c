/* qtg_signer_proto.c -- the signer's request line, EIP-1559 decoding and
 * exact decimal amounts.  See qtg_signer_proto.h for the protocol. */
#include "qtg_signer_proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qtg_approvers.h"
#include "qtg_crypto.h"

static int qtg_hexdigit(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* Lowercase 8-4-4-4-12 hex. */
static int qtg_is_uuid(const char *s, size_t len) {
  if (len != QTG_SIGNER_UUID_LEN) return 0;
  for (size_t i = 0; i < len; i++) {
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (s[i] != '-') return 0;
    } else if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) {
      return 0;
    }
  }
  return 1;
}

static int qtg_is_key_name(const char *s, size_t len) {
  if (len == 0 || len > 64) return 0;
  for (size_t i = 0; i < len; i++) {
    char c = s[i];
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
          c == '_' || c == '.' || c == '-'))
      return 0;
  }
  return 1;
}

/* Split s into at most max tokens at single spaces; -1 on an empty token
 * (two spaces, leading or trailing space) or too many tokens. */
static int qtg_tokens(const char *s, size_t len, const char **tok, size_t *tlen, int max) {
  int n = 0;
  size_t start = 0;
  for (size_t i = 0; i <= len; i++) {
    if (i == len || s[i] == ' ') {
      if (i == start || n == max) return -1;
      tok[n] = s + start;
      tlen[n] = i - start;
      n++;
      start = i + 1;
    }
  }
  return n;
}

#define QTG_FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); return -1; } while (0)

/* The payload token p (pl bytes) into out->payload.  0, -1 (err filled)
 * or -2 (out of memory). */
static int qtg_payload_parse(const char *p, size_t pl, qtg_signer_line *out, char *err, size_t errlen) {
  if (pl < 4 || p[0] != '0' || p[1] != 'x' || (pl - 2) % 2 != 0)
    QTG_FAIL("payload must be 0x followed by an even number of hex digits");
  if ((pl - 2) / 2 > QTG_SIGNER_PAYLOAD_MAX) QTG_FAIL("payload too long");
  for (size_t i = 2; i < pl; i++)
    if (!qtg_hexdigit(p[i])) QTG_FAIL("payload must be 0x followed by an even number of hex digits");
  out->payload = malloc((pl - 2) / 2);
  if (out->payload == NULL) {
    snprintf(err, errlen, "out of memory");
    return -2;
  }
  if (qtg_hex_decode(p + 2, pl - 2, out->payload) != 0) {
    qtg_signer_line_free(out);
    QTG_FAIL("payload must be 0x followed by an even number of hex digits");
  }
  out->payload_len = (pl - 2) / 2;
  return 0;
}

/* FILL <key> 0x<payload> <principal> <signature|->: the tokens after the verb. */
static int qtg_fill_parse(const char **tok, const size_t *tl, int n, qtg_signer_line *out, char *err,
                          size_t errlen) {
  if (n != 5) QTG_FAIL("FILL takes key name, payload, principal and signature (or -)");
  if (!qtg_is_key_name(tok[1], tl[1])) QTG_FAIL("key name must be 1-64 of [A-Za-z0-9_.-]");
  if (!qtg_approvers_principal_ok(tok[3], tl[3])) QTG_FAIL("principal must be KIND:NAME, at most 128 bytes");
  int unsigned_fill = tl[4] == 1 && tok[4][0] == '-';
  if (!unsigned_fill) {
    if (tl[4] != 128) QTG_FAIL("signature must be 128 hex digits or -");
    for (size_t i = 0; i < tl[4]; i++)
      if (!qtg_hexdigit(tok[4][i])) QTG_FAIL("signature must be 128 hex digits or -");
  }
  int rc = qtg_payload_parse(tok[2], tl[2], out, err, errlen);
  if (rc != 0) return rc;
  out->verb = QTG_SIGNER_VERB_FILL;
  memcpy(out->key, tok[1], tl[1]);
  memcpy(out->principal, tok[3], tl[3]);
  for (size_t i = 0; !unsigned_fill && i < tl[4]; i++)   /* lowercase, as signatures are stored */
    out->signature[i] = (char)(tok[4][i] >= 'A' && tok[4][i] <= 'F' ? tok[4][i] - 'A' + 'a' : tok[4][i]);
  return 0;
}

int qtg_signer_line_parse(const char *s, size_t len, qtg_signer_line *out,
                          char *err, size_t errlen) {
  const char *tok[6];
  size_t tl[6];
  int n;
  memset(out, 0, sizeof *out);
  if (s == NULL || len == 0) QTG_FAIL("empty request");
  if (len > QTG_SIGNER_LINE_MAX) QTG_FAIL("request line too long");
  for (size_t i = 0; i < len; i++)
    if (s[i] < 0x20 || s[i] > 0x7e) QTG_FAIL("request holds a control or non-ASCII byte");
  n = qtg_tokens(s, len, tok, tl, 6);
  if (n < 1) QTG_FAIL("request words must be separated by single spaces");
  if (tl[0] == 4 && memcmp(tok[0], "KEYS", 4) == 0) {
    if (n != 1) QTG_FAIL("KEYS takes no argument");
    out->verb = QTG_SIGNER_VERB_KEYS;
    return 0;
  }
  if (tl[0] == 9 && memcmp(tok[0], "APPROVALS", 9) == 0) {
    if (n != 1) QTG_FAIL("APPROVALS takes no argument");
    out->verb = QTG_SIGNER_VERB_APPROVALS;
    return 0;
  }
  if (tl[0] == 7 && memcmp(tok[0], "ADDRESS", 7) == 0) {
    if (n != 2) QTG_FAIL("ADDRESS takes one key name");
    if (!qtg_is_key_name(tok[1], tl[1])) QTG_FAIL("key name must be 1-64 of [A-Za-z0-9_.-]");
    out->verb = QTG_SIGNER_VERB_ADDRESS;
    memcpy(out->key, tok[1], tl[1]);
    return 0;
  }
  if (tl[0] == 4 && memcmp(tok[0], "FILL", 4) == 0) return qtg_fill_parse(tok, tl, n, out, err, errlen);
  if (!(tl[0] == 4 && memcmp(tok[0], "SIGN", 4) == 0))
    QTG_FAIL("unknown verb (SIGN, FILL, ADDRESS, KEYS, APPROVALS)");
  if (n != 6) QTG_FAIL("SIGN takes request id, node id, attempt, key name and payload");
  if (!qtg_is_uuid(tok[1], tl[1])) QTG_FAIL("request id must be a lowercase uuid");
  if (!qtg_is_uuid(tok[2], tl[2])) QTG_FAIL("node id must be a lowercase uuid");
  if (tl[3] == 0 || tl[3] > 10 || tok[3][0] == '0') QTG_FAIL("attempt must be a decimal from 1");
  long long attempt = 0;
  for (size_t i = 0; i < tl[3]; i++) {
    if (tok[3][i] < '0' || tok[3][i] > '9') QTG_FAIL("attempt must be a decimal from 1");
    attempt = attempt * 10 + (tok[3][i] - '0');
  }
  if (attempt > 2147483647LL) QTG_FAIL("attempt out of range");
  if (!qtg_is_key_name(tok[4], tl[4])) QTG_FAIL("key name must be 1-64 of [A-Za-z0-9_.-]");
  int rc = qtg_payload_parse(tok[5], tl[5], out, err, errlen);
  if (rc != 0) return rc;
  out->verb = QTG_SIGNER_VERB_SIGN;
  memcpy(out->request_id, tok[1], tl[1]);
  memcpy(out->node_id, tok[2], tl[2]);
  out->attempt = (int)attempt;
  memcpy(out->key, tok[4], tl[4]);
  return 0;
}

void qtg_signer_line_free(qtg_signer_line *l) {
  free(l->payload);
  l->payload = NULL;
  l->payload_len = 0;
}

/* ---- RLP reading ------------------------------------------------------------ */

/* One item at p (len bytes available): its payload and total size.  Length
 * forms are not checked for minimality here: the caller re-encodes. */
static int qtg_rlp_item(const uint8_t *p, size_t len, int *is_list, const uint8_t **pl,
                        size_t *plen, size_t *used) {
  size_t hdr, n;
  if (len == 0) return -1;
  uint8_t b = p[0];
  if (b < 0x80) {
    *is_list = 0, *pl = p, *plen = 1, *used = 1;
    return 0;
  }
  if (b <= 0xb7) {
    *is_list = 0, hdr = 1, n = b - 0x80;
  } else if (b < 0xc0) {
    size_t ll = b - 0xb7;
    if (ll > 4 || len < 1 + ll) return -1;
    n = 0;
    for (size_t i = 0; i < ll; i++) n = (n << 8) | p[1 + i];
    *is_list = 0, hdr = 1 + ll;
  } else if (b <= 0xf7) {
    *is_list = 1, hdr = 1, n = b - 0xc0;
  } else {
    size_t ll = b - 0xf7;
    if (ll > 4 || len < 1 + ll) return -1;
    n = 0;
    for (size_t i = 0; i < ll; i++) n = (n << 8) | p[1 + i];
    *is_list = 1, hdr = 1 + ll;
  }
  if (n > len - hdr) return -1;
  *pl = p + hdr, *plen = n, *used = hdr + n;
  return 0;
}

static int qtg_rlp_uint(const uint8_t *pl, size_t n, qtg_u256 *out) {
  memset(out, 0, sizeof *out);
  if (n > 32) return -1;
  memcpy(out->be + 32 - n, pl, n);
  return 0;
}

int qtg_eip1559_decode(const uint8_t *bytes, size_t len, qtg_eip1559_tx *tx,
                       char *err, size_t errlen) {
  const uint8_t *pl, *ipl;
  size_t plen, used, iplen, iused;
  int is_list, ilist;
  qtg_u256 *ints[] = {&tx->chain_id, &tx->nonce, &tx->max_priority_fee_per_gas,
                      &tx->max_fee_per_gas, &tx->gas_limit};
  memset(tx, 0, sizeof *tx);
  if (len < 2 || bytes[0] != 0x02) QTG_FAIL("payload is not an EIP-1559 (type 2) transaction");
  if (qtg_rlp_item(bytes + 1, len - 1, &is_list, &pl, &plen, &used) != 0 || !is_list ||
      used != len - 1)
    QTG_FAIL("payload is not one RLP list after the type byte");
  for (int f = 0; f < 9; f++) {
    if (qtg_rlp_item(pl, plen, &ilist, &ipl, &iplen, &iused) != 0)
      QTG_FAIL("transaction field %d is not RLP", f + 1);
    if (f == 8) {
      if (!ilist) QTG_FAIL("access list is not a list");
      if (iplen != 0) QTG_FAIL("a non-empty access list is refused");
    } else if (ilist) {
      QTG_FAIL("transaction field %d is a list", f + 1);
    } else if (f < 5 || f == 6) {
      if (qtg_rlp_uint(ipl, iplen, f < 5 ? ints[f] : &tx->value) != 0)
        QTG_FAIL("transaction field %d exceeds 256 bits", f + 1);
    } else if (f == 5) {
      if (iplen != 20) QTG_FAIL("destination is not a 20-byte address");
      tx->has_to = 1;
      memcpy(tx->to, ipl, 20);
    } else {
      tx->data = ipl;
      tx->data_len = iplen;
    }
    pl += iused;
    plen -= iused;
  }
  if (plen != 0) QTG_FAIL("transaction has more than nine fields");
  /* Canonical form only: the fields re-encode to the very same bytes. */
  qtg_rlp_buf again;
  qtg_rlp_init(&again);
  int rc = qtg_eip1559_unsigned(tx, &again);
  int same = rc == 0 && !again.oom && again.len == len && memcmp(again.p, bytes, len) == 0;
  qtg_rlp_free(&again);
  if (!same) QTG_FAIL("payload is not in canonical RLP form");
  return 0;
}

/* ---- amounts -------------------------------------------------------------------- */

int qtg_amount_to_units(const char *amount, size_t len, int decimals, qtg_u256 *out) {
  char digits[160];
  size_t n = 0, i = 0, frac = 0;
  int dot = 0;
  memset(out, 0, sizeof *out);
  if (amount == NULL || len == 0 || decimals < 0 || decimals > 36) return -1;
  for (; i < len; i++) {
    char c = amount[i];
    if (c == '.') {
      if (dot || i == 0 || i + 1 == len) return -1;
      dot = 1;
    } else if (c >= '0' && c <= '9') {
      if (n + 1 >= sizeof digits) return -1;
      digits[n++] = c;
      if (dot) frac++;
    } else {
      return -1;
    }
  }
  if ((int)frac > decimals) return -1;
  for (size_t k = frac; k < (size_t)decimals; k++) {
    if (n + 1 >= sizeof digits) return -1;
    digits[n++] = '0';
  }
  return qtg_u256_parse(digits, n, out);
}

int qtg_u256_cmp(const qtg_u256 *a, const qtg_u256 *b) {
  int c = memcmp(a->be, b->be, 32);
  return c < 0 ? -1 : c > 0 ? 1 : 0;
}

int qtg_u256_mul_small(qtg_u256 *v, uint32_t k) {
  uint64_t carry = 0;
  for (int i = 31; i >= 0; i--) {
    uint64_t x = (uint64_t)v->be[i] * k + carry;
    v->be[i] = (uint8_t)(x & 0xff);
    carry = x >> 8;
  }
  return carry == 0 ? 0 : -1;
}

void qtg_u256_decimal(const qtg_u256 *v, char *out, size_t outlen) {
  uint8_t x[32];
  char rev[80];
  size_t n = 0;
  memcpy(x, v->be, 32);
  for (;;) {
    int nonzero = 0;
    unsigned rem = 0;
    for (int i = 0; i < 32; i++) {
      unsigned cur = (rem << 8) | x[i];
      x[i] = (uint8_t)(cur / 10);
      rem = cur % 10;
      if (x[i]) nonzero = 1;
    }
    rev[n++] = (char)('0' + rem);
    if (!nonzero) break;
  }
  if (outlen == 0) return;
  size_t k = 0;
  while (n > 0 && k + 1 < outlen) out[k++] = rev[--n];
  out[k] = '\0';
}

/* ---- MG_SIGNER_KEY_CLASSES ------------------------------------------------ */

static int qtg_signer_key_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '.' || c == '-';
}

static int qtg_signer_class_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

/* Walk spec's items; for each, call fn with its key and its classes (the
 * text after '=' up to the item's end).  Stops when fn returns non-zero and
 * returns that; 0 when every item was seen. */
typedef int (*qtg_signer_item_fn)(const char *key, size_t key_len, const char *classes,
                                  size_t classes_len, void *ud);

static int qtg_signer_classes_walk(const char *spec, qtg_signer_item_fn fn, void *ud) {
  const char *p = spec;
  while (*p) {
    const char *end = strchr(p, ',');
    if (end == NULL) end = p + strlen(p);
    const char *eq = memchr(p, '=', (size_t)(end - p));
    int rc = eq ? fn(p, (size_t)(eq - p), eq + 1, (size_t)(end - eq - 1), ud)
                : fn(p, (size_t)(end - p), NULL, 0, ud);
    if (rc != 0) return rc;
    p = *end ? end + 1 : end;
    if (*end && *p == '\0') return fn(p, 0, NULL, 0, ud);   /* a trailing comma */
  }
  return 0;
}

static int qtg_signer_item_valid(const char *key, size_t key_len, const char *classes,
                                 size_t classes_len, void *ud) {
  (void)ud;
  if (key_len == 0 || key_len > 64 || classes == NULL || classes_len == 0) return -1;
  for (size_t i = 0; i < key_len; i++)
    if (!qtg_signer_key_char(key[i])) return -1;
  size_t run = 0;
  for (size_t i = 0; i < classes_len; i++) {
    if (classes[i] == '|') {
      if (run == 0) return -1;
      run = 0;
    } else if (!qtg_signer_class_char(classes[i]) || ++run > 32) {
      return -1;
    }
  }
  return run == 0 ? -1 : 0;
}

int qtg_signer_classes_check(const char *spec, char *err, size_t errlen) {
  if (spec == NULL || *spec == '\0') return 0;
  if (qtg_signer_classes_walk(spec, qtg_signer_item_valid, NULL) == 0) return 0;
  snprintf(err, errlen,
           "MG_SIGNER_KEY_CLASSES: expected key=class|class,key=class (key names of "
           "[A-Za-z0-9_.-]{1,64}, classes of [a-z0-9_-]{1,32}, nothing empty)");
  return -1;
}

typedef struct {
  const char *key, *klass;
  size_t key_len, klass_len;
} qtg_signer_serves;

static int qtg_signer_item_serves(const char *key, size_t key_len, const char *classes,
                                  size_t classes_len, void *ud) {
  const qtg_signer_serves *q = ud;
  if (classes == NULL || key_len != q->key_len || memcmp(key, q->key, key_len) != 0) return 0;
  const char *c = classes, *end = classes + classes_len;
  while (c < end) {
    const char *bar = memchr(c, '|', (size_t)(end - c));
    const char *stop = bar ? bar : end;
    if ((size_t)(stop - c) == q->klass_len && memcmp(c, q->klass, q->klass_len) == 0) return 1;
    c = stop + 1;
  }
  return 0;
}

static int qtg_signer_item_names(const char *key, size_t key_len, const char *classes,
                                 size_t classes_len, void *ud) {
  const qtg_signer_serves *q = ud;
  (void)classes, (void)classes_len;
  return key_len == q->key_len && memcmp(key, q->key, key_len) == 0;
}

int qtg_signer_classes_name(const char *spec, const char *key) {
  if (spec == NULL || key == NULL) return 0;
  qtg_signer_serves q = {key, NULL, strlen(key), 0};
  return qtg_signer_classes_walk(spec, qtg_signer_item_names, &q) == 1;
}

int qtg_signer_key_serves_class(const char *spec, const char *key, const char *klass) {
  if (spec == NULL || *spec == '\0') return 1;
  if (key == NULL || klass == NULL || *klass == '\0') return 0;
  qtg_signer_serves q = {key, klass, strlen(key), strlen(klass)};
  return qtg_signer_classes_walk(spec, qtg_signer_item_serves, &q) == 1;
}
