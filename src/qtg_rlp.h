/* qtg_rlp.h -- Ethereum's RLP encoding and the EIP-1559 transaction built
 * on it, as plain C over byte buffers.
 *
 * Why in C: the signer signs keccak256 of exact bytes, so the bytes must be
 * produced by one tested encoder, not assembled by string concatenation in
 * policy code.  Lua reaches this through qtg.evm (lua_evm.c).
 *
 * RLP (Ethereum yellow paper, appendix B): a byte string of length 1 below
 * 0x80 is itself; otherwise a length prefix (0x80+len, or 0xb7+len-of-len
 * then len for 56 bytes or more); a list is the concatenation of its items
 * with prefix 0xc0 / 0xf7 in the same way.  Integers are big-endian without
 * leading zeros (zero is the empty string, 0x80).
 */
#ifndef QTG_RLP_H
#define QTG_RLP_H

#include <stddef.h>
#include <stdint.h>

/* A growable output buffer.  Appending never fails visibly: on memory
 * exhaustion `oom` is set and later appends are ignored; check it once at
 * the end. */
typedef struct {
  uint8_t *p;
  size_t len, cap;
  int oom;
} qtg_rlp_buf;

void qtg_rlp_init(qtg_rlp_buf *b);
void qtg_rlp_free(qtg_rlp_buf *b);
void qtg_rlp_append_raw(qtg_rlp_buf *b, const void *data, size_t len);

/* One byte string item. */
void qtg_rlp_bytes(qtg_rlp_buf *b, const void *data, size_t len);
/* An unsigned integer given as big-endian bytes (leading zeros dropped). */
void qtg_rlp_uint_be(qtg_rlp_buf *b, const uint8_t *be, size_t len);
void qtg_rlp_u64(qtg_rlp_buf *b, uint64_t v);
/* A list whose items are already encoded, concatenated, in items. */
void qtg_rlp_list(qtg_rlp_buf *b, const uint8_t *items, size_t len);

/* A 256-bit unsigned integer, big-endian. */
typedef struct {
  uint8_t be[32];
} qtg_u256;

/* Parse a decimal ("43203529") or 0x-hex ("0xa4") string; -1 on anything
 * else, including a value of 2^256 or more. */
int qtg_u256_parse(const char *s, size_t len, qtg_u256 *out);

typedef struct {
  uint8_t address[20];
  const uint8_t (*storage_keys)[32];
  size_t nkeys;
} qtg_access_entry;

/* EIP-1559 (type 2) transaction fields. */
typedef struct {
  qtg_u256 chain_id, nonce, max_priority_fee_per_gas, max_fee_per_gas,
      gas_limit, value;
  int has_to;                     /* 0: contract creation (empty `to`) */
  uint8_t to[20];
  const uint8_t *data;
  size_t data_len;
  const qtg_access_entry *access_list;
  size_t access_list_len;
} qtg_eip1559_tx;

/* 0x02 || rlp([nine fields]): the bytes whose keccak256 is signed. */
int qtg_eip1559_unsigned(const qtg_eip1559_tx *tx, qtg_rlp_buf *out);
/* 0x02 || rlp([nine fields, y_parity, r, s]): the raw transaction. */
int qtg_eip1559_signed(const qtg_eip1559_tx *tx, int y_parity,
                       const uint8_t r[32], const uint8_t s[32],
                       qtg_rlp_buf *out);

#endif
