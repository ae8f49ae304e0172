/* qtg_rlp.c -- RLP encoding, 256-bit integer parsing and the EIP-1559
 * transaction encodings (unsigned for signing, signed for broadcast).  See
 * qtg_rlp.h for the rules.
 */
#include "qtg_rlp.h"

#include <stdlib.h>
#include <string.h>

void qtg_rlp_init(qtg_rlp_buf *b) { memset(b, 0, sizeof *b); }

void qtg_rlp_free(qtg_rlp_buf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

void qtg_rlp_append_raw(qtg_rlp_buf *b, const void *data, size_t len) {
  if (b->oom || len == 0) return;
  if (b->len + len > b->cap) {
    size_t cap = b->cap ? b->cap : 128;
    uint8_t *p;
    while (cap < b->len + len) cap *= 2;
    p = realloc(b->p, cap);
    if (p == NULL) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, data, len);
  b->len += len;
}

/* The prefix of a string (short_base 0x80) or list (0xc0) of len bytes. */
static void qtg_rlp_prefix(qtg_rlp_buf *b, uint8_t short_base, size_t len) {
  uint8_t hdr[9];
  if (len <= 55) {
    hdr[0] = (uint8_t)(short_base + len);
    qtg_rlp_append_raw(b, hdr, 1);
    return;
  }
  {
    uint8_t be[8];
    size_t n = 0;
    for (int i = 7; i >= 0; i--) be[7 - i] = (uint8_t)(len >> (8 * i));
    while (n < 7 && be[n] == 0) n++;
    hdr[0] = (uint8_t)(short_base + 55 + (8 - n));
    memcpy(hdr + 1, be + n, 8 - n);
    qtg_rlp_append_raw(b, hdr, 1 + (8 - n));
  }
}

void qtg_rlp_bytes(qtg_rlp_buf *b, const void *data, size_t len) {
  const uint8_t *p = data;
  if (len == 1 && p[0] < 0x80) {
    qtg_rlp_append_raw(b, p, 1);
    return;
  }
  qtg_rlp_prefix(b, 0x80, len);
  qtg_rlp_append_raw(b, p, len);
}

void qtg_rlp_uint_be(qtg_rlp_buf *b, const uint8_t *be, size_t len) {
  while (len > 0 && be[0] == 0) {
    be++;
    len--;
  }
  qtg_rlp_bytes(b, be, len);
}

void qtg_rlp_u64(qtg_rlp_buf *b, uint64_t v) {
  uint8_t be[8];
  for (int i = 0; i < 8; i++) be[i] = (uint8_t)(v >> (8 * (7 - i)));
  qtg_rlp_uint_be(b, be, sizeof be);
}

void qtg_rlp_list(qtg_rlp_buf *b, const uint8_t *items, size_t len) {
  qtg_rlp_prefix(b, 0xc0, len);
  qtg_rlp_append_raw(b, items, len);
}

/* ---- 256-bit integers --------------------------------------------------- */

/* out = out * mul + add; returns -1 on overflow past 256 bits. */
static int qtg_u256_muladd(qtg_u256 *v, unsigned mul, unsigned add) {
  unsigned carry = add;
  for (int i = 31; i >= 0; i--) {
    unsigned x = v->be[i] * mul + carry;
    v->be[i] = (uint8_t)(x & 0xff);
    carry = x >> 8;
  }
  return carry == 0 ? 0 : -1;
}

int qtg_u256_parse(const char *s, size_t len, qtg_u256 *out) {
  memset(out, 0, sizeof *out);
  if (s == NULL || len == 0) return -1;
  if (len > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    s += 2;
    len -= 2;
    if (len > 64) {
      /* Leading zeros are harmless; anything else overflows. */
      while (len > 64 && *s == '0') s++, len--;
      if (len > 64) return -1;
    }
    for (size_t i = 0; i < len; i++) {
      int d;
      char c = s[i];
      if (c >= '0' && c <= '9') d = c - '0';
      else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      else return -1;
      if (qtg_u256_muladd(out, 16, (unsigned)d) != 0) return -1;
    }
    return 0;
  }
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    if (qtg_u256_muladd(out, 10, (unsigned)(s[i] - '0')) != 0) return -1;
  }
  return 0;
}

/* ---- EIP-1559 ------------------------------------------------------------ */

static void qtg_rlp_access_list(qtg_rlp_buf *b, const qtg_eip1559_tx *tx) {
  qtg_rlp_buf all, entry, keys;
  qtg_rlp_init(&all);
  for (size_t i = 0; i < tx->access_list_len; i++) {
    const qtg_access_entry *e = &tx->access_list[i];
    qtg_rlp_init(&entry);
    qtg_rlp_init(&keys);
    for (size_t k = 0; k < e->nkeys; k++) qtg_rlp_bytes(&keys, e->storage_keys[k], 32);
    qtg_rlp_bytes(&entry, e->address, 20);
    qtg_rlp_list(&entry, keys.p, keys.len);
    if (keys.oom) entry.oom = 1;
    qtg_rlp_list(&all, entry.p, entry.len);
    if (entry.oom) all.oom = 1;
    qtg_rlp_free(&keys);
    qtg_rlp_free(&entry);
  }
  qtg_rlp_list(b, all.p, all.len);
  if (all.oom) b->oom = 1;
  qtg_rlp_free(&all);
}

static void qtg_eip1559_fields(qtg_rlp_buf *b, const qtg_eip1559_tx *tx) {
  qtg_rlp_uint_be(b, tx->chain_id.be, 32);
  qtg_rlp_uint_be(b, tx->nonce.be, 32);
  qtg_rlp_uint_be(b, tx->max_priority_fee_per_gas.be, 32);
  qtg_rlp_uint_be(b, tx->max_fee_per_gas.be, 32);
  qtg_rlp_uint_be(b, tx->gas_limit.be, 32);
  qtg_rlp_bytes(b, tx->to, tx->has_to ? 20 : 0);
  qtg_rlp_uint_be(b, tx->value.be, 32);
  qtg_rlp_bytes(b, tx->data, tx->data_len);
  qtg_rlp_access_list(b, tx);
}

/* 0x02 || rlp(list of what `fields` holds). */
static int qtg_eip1559_envelope(qtg_rlp_buf *fields, qtg_rlp_buf *out) {
  static const uint8_t type2 = 0x02;
  if (fields->oom) {
    qtg_rlp_free(fields);
    return -1;
  }
  qtg_rlp_append_raw(out, &type2, 1);
  qtg_rlp_list(out, fields->p, fields->len);
  qtg_rlp_free(fields);
  return out->oom ? -1 : 0;
}

int qtg_eip1559_unsigned(const qtg_eip1559_tx *tx, qtg_rlp_buf *out) {
  qtg_rlp_buf fields;
  qtg_rlp_init(&fields);
  qtg_eip1559_fields(&fields, tx);
  return qtg_eip1559_envelope(&fields, out);
}

int qtg_eip1559_signed(const qtg_eip1559_tx *tx, int y_parity,
                       const uint8_t r[32], const uint8_t s[32],
                       qtg_rlp_buf *out) {
  qtg_rlp_buf fields;
  if (y_parity != 0 && y_parity != 1) return -1;
  qtg_rlp_init(&fields);
  qtg_eip1559_fields(&fields, tx);
  qtg_rlp_u64(&fields, (uint64_t)y_parity);
  qtg_rlp_uint_be(&fields, r, 32);
  qtg_rlp_uint_be(&fields, s, 32);
  return qtg_eip1559_envelope(&fields, out);
}
