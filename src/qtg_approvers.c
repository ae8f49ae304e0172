/* qtg_approvers.c -- the signer's enrolment of approvers, their statement,
 * and Ed25519 over OpenSSL.  See qtg_approvers.h for the formats and why.
 *
 * The parser reads whole lines, splits them on blanks, and refuses anything
 * it does not know (an unknown word, a missing or extra field, a duplicate
 * person, principal, key or class): an enrolment the signer misreads would
 * count the wrong people.
 */
#include "qtg_approvers.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "qtg_crypto.h"
#include "qtg_rlp.h"
#include "qtg_signer_proto.h"

enum { QTG_APPROVERS_MAX = 1024, QTG_APPROVERS_LINE_MAX = 4096, QTG_APPROVERS_FILE_MAX = 1 << 20,
       QTG_CLASS_MAX = 32, QTG_FIELDS_MAX = 6, QTG_TIERS_MAX = 256, QTG_TIER_ASSET_MAX = 16,
       QTG_TIER_AMOUNT_MAX = 96, QTG_TIER_DECIMALS = 18 };

/* An enrolled key: a person (approves; may initiate too) or an
 * initiator (a client system that signs the requests it creates and
 * never counts as an approver). */
typedef struct {
  char name[QTG_APPROVER_NAME_MAX + 1];
  uint8_t pub[QTG_APPROVER_PUBLIC_LEN];
  char **principals;
  size_t nprincipals;
  int approves;
} qtg_person;

typedef struct {
  char klass[QTG_CLASS_MAX + 1];    /* "*" for every class not named */
  int n;
} qtg_quorum;

/* quorum CLASS|* N above AMOUNT ASSET: n for a request of klass (any, for
 * "*") moving more than `above` of asset. */
typedef struct {
  char klass[QTG_CLASS_MAX + 1];
  int n;
  char asset[QTG_TIER_ASSET_MAX + 1];      /* upper case */
  char amount[QTG_TIER_AMOUNT_MAX + 1];    /* as written, for messages */
  qtg_u256 above;                          /* AMOUNT in units of 10^-18 */
  int line;
} qtg_tier;

struct qtg_approvers {
  char deployment[QTG_APPROVER_NAME_MAX + 1];   /* "" until its line is read */
  int initiation_signed;                        /* 'initiation signed' */
  qtg_person *people;
  size_t npeople;
  qtg_quorum *quorums;
  size_t nquorums;
  qtg_tier *tiers;
  size_t ntiers;
  char digest[2 * QTG_SHA256_LEN + 1];          /* sha256 of the file's bytes, hex */
};

/* The y of every point of small order on edwards25519 (1, 2, 4 or 8:
 * the identity, (0,-1), (+-sqrt(-1),0) and the four of order 8), and the
 * non-canonical y + p of 0 and 1, as libsodium lists them; a public key is
 * one of them whatever its sign bit.  A signature "of" such a key is forged
 * without any secret (R the identity and S 0 verifies for the identity key
 * and any message), so such a key is refused. */
static const uint8_t qtg_small_order_y[7][32] = {
    {0x00},
    {0x01},
    {0x26, 0xe8, 0x95, 0x8f, 0xc2, 0xb2, 0x27, 0xb0, 0x45, 0xc3, 0xf4, 0x89, 0xf2, 0xef, 0x98, 0xf0,
     0xd5, 0xdf, 0xac, 0x05, 0xd3, 0xc6, 0x33, 0x39, 0xb1, 0x38, 0x02, 0x88, 0x6d, 0x53, 0xfc, 0x05},
    {0xc7, 0x17, 0x6a, 0x70, 0x3d, 0x4d, 0xd8, 0x4f, 0xba, 0x3c, 0x0b, 0x76, 0x0d, 0x10, 0x67, 0x0f,
     0x2a, 0x20, 0x53, 0xfa, 0x2c, 0x39, 0xcc, 0xc6, 0x4e, 0xc7, 0xfd, 0x77, 0x92, 0xac, 0x03, 0x7a},
    {0xec, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
     0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f},
    {0xed, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
     0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f},
    {0xee, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
     0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f},
};

static int qtg_is_small_order(const uint8_t pub[QTG_APPROVER_PUBLIC_LEN]) {
  for (size_t i = 0; i < sizeof qtg_small_order_y / sizeof qtg_small_order_y[0]; i++)
    if (memcmp(pub, qtg_small_order_y[i], 31) == 0 && (pub[31] & 0x7f) == qtg_small_order_y[i][31])
      return 1;
  return 0;
}

static int qtg_is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '.' || c == '-';
}

static int qtg_is_name(const char *s, size_t len) {
  if (len == 0 || len > QTG_APPROVER_NAME_MAX) return 0;
  for (size_t i = 0; i < len; i++)
    if (!qtg_is_name_char(s[i])) return 0;
  return 1;
}

static int qtg_is_class(const char *s, size_t len) {
  if (len == 0 || len > QTG_CLASS_MAX) return 0;
  for (size_t i = 0; i < len; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-'))
      return 0;
  return 1;
}

static int qtg_is_lower_hex(const char *s, size_t len) {
  for (size_t i = 0; i < len; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
  return 1;
}

static int qtg_is_uuid(const char *s) {
  if (strlen(s) != 36) return 0;
  for (int i = 0; i < 36; i++) {
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (s[i] != '-') return 0;
    } else if (!qtg_is_lower_hex(s + i, 1)) {
      return 0;
    }
  }
  return 1;
}

int qtg_approvers_principal_ok(const char *s, size_t len) {
  size_t i = 0;
  if (len == 0 || len > QTG_APPROVER_PRINCIPAL_MAX) return 0;
  while (i < len && s[i] >= 'a' && s[i] <= 'z') i++;
  if (i == 0 || i + 1 >= len || s[i] != ':') return 0;
  for (i++; i < len; i++)
    if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 0x7f || s[i] == ',') return 0;
  return 1;
}

void qtg_approvers_free(qtg_approvers *a) {
  if (a == NULL) return;
  for (size_t i = 0; i < a->npeople; i++) {
    for (size_t j = 0; j < a->people[i].nprincipals; j++) free(a->people[i].principals[j]);
    free(a->people[i].principals);
  }
  free(a->people);
  free(a->quorums);
  free(a->tiers);
  free(a);
}

size_t qtg_approvers_count(const qtg_approvers *a) { return a ? a->npeople : 0; }

const char *qtg_approvers_deployment(const qtg_approvers *a) { return a ? a->deployment : NULL; }

const char *qtg_approvers_digest(const qtg_approvers *a) { return a ? a->digest : NULL; }

const char *qtg_approvers_person_name(const qtg_approvers *a, int person) {
  return a && person >= 0 && (size_t)person < a->npeople ? a->people[person].name : NULL;
}

int qtg_approvers_initiator_of(const qtg_approvers *a, const char *principal) {
  if (a == NULL || principal == NULL) return -1;
  for (size_t i = 0; i < a->npeople; i++)
    for (size_t j = 0; j < a->people[i].nprincipals; j++)
      if (strcmp(a->people[i].principals[j], principal) == 0) return (int)i;
  return -1;
}

int qtg_approvers_person_of(const qtg_approvers *a, const char *principal) {
  int who = qtg_approvers_initiator_of(a, principal);
  return who >= 0 && a->people[who].approves ? who : -1;
}

size_t qtg_approvers_count_persons(const qtg_approvers *a) {
  size_t n = 0;
  for (size_t i = 0; a != NULL && i < a->npeople; i++) n += a->people[i].approves ? 1 : 0;
  return n;
}

int qtg_approvers_initiation_signed(const qtg_approvers *a) { return a ? a->initiation_signed : 0; }

/* 1 when klass has a quorum line of its own (not "*"'s). */
static int qtg_approvers_quorum_of_own(const qtg_approvers *a, const char *klass) {
  for (size_t i = 0; a != NULL && klass != NULL && i < a->nquorums; i++)
    if (strcmp(a->quorums[i].klass, klass) == 0) return 1;
  return 0;
}

int qtg_approvers_quorum(const qtg_approvers *a, const char *klass) {
  int any = -1;
  if (a == NULL || klass == NULL) return -1;
  for (size_t i = 0; i < a->nquorums; i++) {
    if (strcmp(a->quorums[i].klass, klass) == 0) return a->quorums[i].n;
    if (strcmp(a->quorums[i].klass, "*") == 0) any = a->quorums[i].n;
  }
  return any;
}

/* The lowest and highest of the base quorum lines alone. */
static void qtg_base_range(const qtg_approvers *a, int *lowest, int *highest) {
  *lowest = *highest = -1;
  for (size_t i = 0; a != NULL && i < a->nquorums; i++) {
    int n = a->quorums[i].n;
    if (i == 0 || n < *lowest) *lowest = n;
    if (i == 0 || n > *highest) *highest = n;
  }
}

size_t qtg_approvers_quorum_range(const qtg_approvers *a, int *lowest, int *highest) {
  qtg_base_range(a, lowest, highest);
  for (size_t i = 0; a != NULL && i < a->ntiers; i++)
    if (a->tiers[i].n > *highest) *highest = a->tiers[i].n;
  return a != NULL ? a->nquorums + a->ntiers : 0;
}

static int qtg_ascii_caseeq(const char *x, const char *y) {
  for (; *x && *y; x++, y++) {
    char cx = *x >= 'a' && *x <= 'z' ? (char)(*x - 32) : *x;
    char cy = *y >= 'a' && *y <= 'z' ? (char)(*y - 32) : *y;
    if (cx != cy) return 0;
  }
  return *x == *y;
}

/* Whether tier t can apply to a request of klass moving asset (its amount
 * aside): its class is klass or "*", its asset the same, any case. */
static int qtg_tier_could_apply(const qtg_tier *t, const char *klass, const char *asset) {
  return asset != NULL && (strcmp(t->klass, "*") == 0 || strcmp(t->klass, klass) == 0) &&
         qtg_ascii_caseeq(t->asset, asset);
}

/* "quorum 3 for more than 100 ETH on mainnet" (on any class, for "*") */
static void qtg_tier_describe(const qtg_tier *t, char *out, size_t outlen) {
  int star = strcmp(t->klass, "*") == 0;
  snprintf(out, outlen, "quorum %d for more than %s %s on %s", t->n, t->amount, t->asset,
           star ? "any class" : t->klass);
}

size_t qtg_approvers_tiers_of(const qtg_approvers *a, const char *klass, char *out, size_t outlen) {
  size_t count = 0, used = 0;
  if (outlen > 0) out[0] = '\0';
  for (size_t i = 0; a != NULL && klass != NULL && i < a->ntiers; i++) {
    const qtg_tier *t = &a->tiers[i];
    char one[200];
    if (strcmp(t->klass, "*") != 0 && strcmp(t->klass, klass) != 0) continue;
    qtg_tier_describe(t, one, sizeof one);
    if (used < outlen) {
      int n = snprintf(out + used, outlen - used, "%s%s", count > 0 ? "; " : "", one);
      used = n < 0 ? outlen : used + (size_t)n;
    }
    count++;
  }
  return count;
}

int qtg_approvers_quorum_for(const qtg_approvers *a, const char *klass, const char *asset,
                             const char *amount, uint32_t transfers, char *why, size_t whylen) {
  const qtg_tier *by = NULL;
  qtg_u256 units = {{0}};
  int parsed = 0;   /* 1: amount read into units, -1: it does not parse */
  int need = qtg_approvers_quorum(a, klass);
  if (need < 0) {
    snprintf(why, whylen, "MG_SIGNER_APPROVERS names no quorum for network class %s (nor *)",
             klass ? klass : "?");
    return -1;
  }
  for (size_t i = 0; i < a->ntiers; i++) {
    const qtg_tier *t = &a->tiers[i];
    if (!qtg_tier_could_apply(t, klass, asset)) continue;
    if (parsed == 0) {
      parsed = amount != NULL &&
               qtg_amount_to_units(amount, strlen(amount), QTG_TIER_DECIMALS, &units) == 0 ? 1 : -1;
      /* a total of 2^256 or more is above every tier */
      if (parsed == 1 && transfers > 1 && qtg_u256_mul_small(&units, transfers) != 0)
        memset(units.be, 0xff, sizeof units.be);
    }
    if (parsed < 0) {
      char tier[200];
      qtg_tier_describe(t, tier, sizeof tier);
      snprintf(why, whylen, "the request's amount is not a plain decimal string of at most %d decimals, "
               "and MG_SIGNER_APPROVERS has %s", QTG_TIER_DECIMALS, tier);
      return -1;
    }
    if (qtg_u256_cmp(&units, &t->above) > 0 && t->n > need) {
      need = t->n;
      by = t;
    }
  }
  if (by != NULL && transfers > 1) {
    char tier[200];
    qtg_tier_describe(by, tier, sizeof tier);
    snprintf(why, whylen, "%s (the plan pays %s %s %u times)", tier, amount, by->asset, (unsigned)transfers);
  } else if (by != NULL) {
    qtg_tier_describe(by, why, whylen);
  } else snprintf(why, whylen, "quorum %d for %s", need,
                qtg_approvers_quorum_of_own(a, klass) ? klass : "*");
  return need;
}

/* The most a request of klass needs just above tier t's amount of its
 * asset: klass's base quorum n, or a tier of klass or "*" for that asset
 * from an amount no higher than t's. */
static int qtg_level_above(const qtg_approvers *a, const char *klass, int n, const qtg_tier *t) {
  for (size_t i = 0; i < a->ntiers; i++) {
    const qtg_tier *u = &a->tiers[i];
    if (u->n > n && qtg_tier_could_apply(u, klass, t->asset) && qtg_u256_cmp(&u->above, &t->above) <= 0)
      n = u->n;
  }
  return n;
}

int qtg_approvers_uneven(const qtg_approvers *a, char *why, size_t whylen) {
  int lowest, highest;
  char low[96], high[96];
  if (a == NULL) return 0;
  qtg_base_range(a, &lowest, &highest);
  if (lowest != highest) {
    qtg_approvers_classes_at(a, lowest, low, sizeof low);
    qtg_approvers_classes_at(a, highest, high, sizeof high);
    snprintf(why, whylen, "asks %d approvals for %s but %d for %s", highest, high, lowest, low);
    return 1;
  }
  for (size_t i = 0; i < a->ntiers; i++) {
    const qtg_tier *t = &a->tiers[i];
    if (strcmp(t->klass, "*") == 0) continue;   /* the same for every class */
    for (size_t j = 0; j < a->nquorums; j++) {
      const qtg_quorum *q = &a->quorums[j];
      if (strcmp(q->klass, t->klass) == 0) continue;
      int other = qtg_level_above(a, q->klass, q->n, t);
      if (other >= t->n) continue;
      snprintf(why, whylen, "asks %d approvals for more than %s %s on %s (line %d) but %d for %s",
               t->n, t->amount, t->asset, t->klass, t->line, other, q->klass);
      return 1;
    }
  }
  return 0;
}

size_t qtg_approvers_classes_at(const qtg_approvers *a, int quorum, char *out, size_t outlen) {
  size_t n = 0, used = 0;
  if (outlen > 0) out[0] = '\0';
  for (size_t i = 0; a != NULL && i < a->nquorums; i++) {
    if (a->quorums[i].n != quorum) continue;
    if (outlen > used) {
      int w = snprintf(out + used, outlen - used, "%s%s", n ? "," : "", a->quorums[i].klass);
      used = w < 0 || (size_t)w >= outlen - used ? outlen : used + (size_t)w;
    }
    n++;
  }
  return n;
}

/* The array items of n elements of `size` bytes grown by one, the copy of
 * item, for the caller to store with n + 1; NULL with "out of memory" in
 * err (items untouched) when it cannot grow. */
static void *qtg_append(void *items, size_t n, size_t size, const void *item, char *err, size_t errlen) {
  char *grown = realloc(items, (n + 1) * size);
  if (grown == NULL) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  memcpy(grown + n * size, item, size);
  return grown;
}

/* Add "P1,P2,..." to person p; -1 with err on a bad or taken principal. */
static int qtg_add_principals(qtg_approvers *a, qtg_person *p, const char *list, size_t len,
                              int line, char *err, size_t errlen) {
  size_t start = 0;
  while (start <= len) {
    size_t end = start;
    while (end < len && list[end] != ',') end++;
    if (!qtg_approvers_principal_ok(list + start, end - start)) {
      snprintf(err, errlen, "line %d: '%.*s' is not a principal (KIND:NAME, e.g. operator:alice)",
               line, (int)(end - start > 140 ? 140 : end - start), list + start);
      return -1;
    }
    char *one = strndup(list + start, end - start);
    if (one == NULL) {
      snprintf(err, errlen, "out of memory");
      return -1;
    }
    if (qtg_approvers_initiator_of(a, one) >= 0) {   /* p is in a already */
      snprintf(err, errlen, "line %d: principal %s is enrolled twice", line, one);
      free(one);
      return -1;
    }
    char **grown = qtg_append(p->principals, p->nprincipals, sizeof one, &one, err, errlen);
    if (grown == NULL) {
      free(one);
      return -1;
    }
    p->principals = grown;
    p->nprincipals++;
    start = end + 1;
  }
  return 0;
}

/* person NAME ed25519:HEX PRINCIPALS (approves), or
 * initiator NAME ed25519:HEX PRINCIPALS (signs its own requests only) */
static int qtg_parse_person(qtg_approvers *a, char **f, size_t *fl, int line, int approves,
                            char *err, size_t errlen) {
  const char *what = approves ? "person" : "initiator";
  if (a->npeople == QTG_APPROVERS_MAX) {
    snprintf(err, errlen, "line %d: more than %d persons and initiators", line, QTG_APPROVERS_MAX);
    return -1;
  }
  if (fl[1] > QTG_APPROVER_NAME_MAX) {
    snprintf(err, errlen, "line %d: a %s's name has at most %d characters", line, what,
             QTG_APPROVER_NAME_MAX);
    return -1;
  }
  for (size_t i = 0; i < fl[1]; i++)
    if (!qtg_is_name_char(f[1][i])) {
      snprintf(err, errlen, "line %d: a %s's name is [A-Za-z0-9_.-]", line, what);
      return -1;
    }
  qtg_person p;
  memset(&p, 0, sizeof p);
  memcpy(p.name, f[1], fl[1]);
  p.approves = approves;
  if (fl[2] != 8 + 2 * QTG_APPROVER_PUBLIC_LEN || strncmp(f[2], "ed25519:", 8) != 0 ||
      !qtg_is_lower_hex(f[2] + 8, 2 * QTG_APPROVER_PUBLIC_LEN) ||
      qtg_hex_decode(f[2] + 8, 2 * QTG_APPROVER_PUBLIC_LEN, p.pub) != 0) {
    snprintf(err, errlen, "line %d: %s %s: the key is ed25519: and 64 lowercase hex digits",
             line, what, p.name);
    return -1;
  }
  if (qtg_is_small_order(p.pub)) {
    snprintf(err, errlen, "line %d: %s %s: the key is a point of small order, whose "
             "signatures anyone can forge: not a key from qtgd approver key", line, what, p.name);
    return -1;
  }
  for (size_t i = 0; i < a->npeople; i++) {
    if (strcmp(a->people[i].name, p.name) == 0) {
      snprintf(err, errlen, "line %d: %s %s is enrolled twice", line, what, p.name);
      return -1;
    }
    if (memcmp(a->people[i].pub, p.pub, sizeof p.pub) == 0) {
      snprintf(err, errlen, "line %d: %s %s has the key of %s", line, what, p.name,
               a->people[i].name);
      return -1;
    }
  }
  qtg_person *people = qtg_append(a->people, a->npeople, sizeof p, &p, err, errlen);
  if (people == NULL) return -1;
  a->people = people;
  a->npeople++;
  return qtg_add_principals(a, &a->people[a->npeople - 1], f[3], fl[3], line, err, errlen);
}

/* The CLASS|* and N of a quorum line into klass and *n. */
static int qtg_parse_quorum_head(char **f, size_t *fl, int line, char klass[QTG_CLASS_MAX + 1],
                                 int *n, char *err, size_t errlen) {
  if (!(fl[1] == 1 && f[1][0] == '*') && !qtg_is_class(f[1], fl[1])) {
    snprintf(err, errlen, "line %d: quorum's class is [a-z0-9_-]{1,32} or *", line);
    return -1;
  }
  memcpy(klass, f[1], fl[1]);
  klass[fl[1]] = '\0';
  *n = 0;
  for (size_t i = 0; i < fl[2]; i++) {
    if (f[2][i] < '0' || f[2][i] > '9' || fl[2] > 3) {
      *n = -1;
      break;
    }
    *n = *n * 10 + (f[2][i] - '0');
  }
  if (*n < 0 || *n > QTG_APPROVER_QUORUM_MAX) {
    snprintf(err, errlen, "line %d: quorum for %s is a whole number from 0 to %d", line, klass,
             QTG_APPROVER_QUORUM_MAX);
    return -1;
  }
  return 0;
}

/* quorum CLASS|* N */
static int qtg_parse_quorum_base(qtg_approvers *a, const char *klass, int n, int line, char *err,
                                 size_t errlen) {
  qtg_quorum q;
  memset(&q, 0, sizeof q);
  snprintf(q.klass, sizeof q.klass, "%s", klass);
  q.n = n;
  for (size_t i = 0; i < a->nquorums; i++)
    if (strcmp(a->quorums[i].klass, q.klass) == 0) {
      snprintf(err, errlen, "line %d: quorum for %s is given twice", line, q.klass);
      return -1;
    }
  qtg_quorum *quorums = qtg_append(a->quorums, a->nquorums, sizeof q, &q, err, errlen);
  if (quorums == NULL) return -1;
  a->quorums = quorums;
  a->nquorums++;
  return 0;
}

/* A tier's AMOUNT ASSET (f[4], f[5]) into t. */
static int qtg_parse_tier_amount(qtg_tier *t, char **f, size_t *fl, int line, char *err,
                                 size_t errlen) {
  if (fl[4] > QTG_TIER_AMOUNT_MAX ||
      qtg_amount_to_units(f[4], fl[4], QTG_TIER_DECIMALS, &t->above) != 0) {
    snprintf(err, errlen, "line %d: a tier's amount is a plain decimal (digits, one '.' between "
             "digits at most, at most %d decimals, no sign or exponent)", line, QTG_TIER_DECIMALS);
    return -1;
  }
  memcpy(t->amount, f[4], fl[4]);
  t->amount[fl[4]] = '\0';
  if (fl[5] == 5 && qtg_ascii_caseeq(f[5], "above")) {
    snprintf(err, errlen, "line %d: 'above' is given twice (quorum CLASS|* N above AMOUNT ASSET)", line);
    return -1;
  }
  int ok = fl[5] >= 1 && fl[5] <= QTG_TIER_ASSET_MAX;
  for (size_t i = 0; ok && i < fl[5]; i++) {
    char c = f[5][i];
    ok = (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
    t->asset[i] = c >= 'a' && c <= 'z' ? (char)(c - 32) : c;
  }
  if (!ok) {
    snprintf(err, errlen, "line %d: a tier's asset is [A-Za-z0-9]{1,%d}", line, QTG_TIER_ASSET_MAX);
    return -1;
  }
  t->asset[fl[5]] = '\0';
  return 0;
}

/* quorum CLASS|* N above AMOUNT ASSET */
static int qtg_parse_quorum_tier(qtg_approvers *a, char **f, size_t *fl, const char *klass, int n,
                                 int line, char *err, size_t errlen) {
  qtg_tier t;
  memset(&t, 0, sizeof t);
  snprintf(t.klass, sizeof t.klass, "%s", klass);
  t.n = n;
  t.line = line;
  if (qtg_parse_tier_amount(&t, f, fl, line, err, errlen) != 0) return -1;
  if (a->ntiers == QTG_TIERS_MAX) {
    snprintf(err, errlen, "line %d: more than %d quorum tiers", line, QTG_TIERS_MAX);
    return -1;
  }
  for (size_t i = 0; i < a->ntiers; i++) {
    const qtg_tier *u = &a->tiers[i];
    if (strcmp(u->klass, t.klass) == 0 && strcmp(u->asset, t.asset) == 0 &&
        qtg_u256_cmp(&u->above, &t.above) == 0) {
      snprintf(err, errlen, "line %d: the quorum for more than %s %s on %s is given twice (line %d)",
               line, t.amount, t.asset, t.klass, u->line);
      return -1;
    }
  }
  qtg_tier *tiers = qtg_append(a->tiers, a->ntiers, sizeof t, &t, err, errlen);
  if (tiers == NULL) return -1;
  a->tiers = tiers;
  a->ntiers++;
  return 0;
}

/* quorum CLASS|* N, or quorum CLASS|* N above AMOUNT ASSET (n fields) */
static int qtg_parse_quorum(qtg_approvers *a, char **f, size_t *fl, size_t n, int line, char *err,
                            size_t errlen) {
  char klass[QTG_CLASS_MAX + 1];
  int quorum;
  int above = n >= 4 && fl[3] == 5 && strncmp(f[3], "above", 5) == 0;
  if (n == 3 || (above && n == 6)) {
    if (qtg_parse_quorum_head(f, fl, line, klass, &quorum, err, errlen) != 0) return -1;
    return n == 3 ? qtg_parse_quorum_base(a, klass, quorum, line, err, errlen)
                  : qtg_parse_quorum_tier(a, f, fl, klass, quorum, line, err, errlen);
  }
  if (!above)
    snprintf(err, errlen, "line %d: a quorum line is 'quorum CLASS|* N' or 'quorum CLASS|* N above "
             "AMOUNT ASSET'", line);
  else
    snprintf(err, errlen, "line %d: a tier names its %s ('quorum CLASS|* N above AMOUNT ASSET')",
             line, n == 4 ? "amount and asset" : "asset");
  return -1;
}

/* Every tier's class has a quorum (its own or "*"): a tier raises a class
 * that is signed for, never makes one signed for.  A tier of "*" raises
 * every class with a quorum, whether or not there is a `quorum *` line. */
static int qtg_check_tiers(const qtg_approvers *a, char *err, size_t errlen) {
  for (size_t i = 0; i < a->ntiers; i++) {
    const qtg_tier *t = &a->tiers[i];
    if (strcmp(t->klass, "*") == 0 || qtg_approvers_quorum(a, t->klass) >= 0) continue;
    snprintf(err, errlen, "line %d: a tier for %s, which has no quorum line (nor *): give it its "
             "base quorum ('quorum %s N')", t->line, t->klass, t->klass);
    return -1;
  }
  return 0;
}

/* deployment NAME: once; every statement signed for this deployment names
 * it, so a signature given in another deployment does not count here. */
static int qtg_parse_deployment(qtg_approvers *a, char **f, size_t *fl, int line, char *err,
                                size_t errlen) {
  if (a->deployment[0] != '\0') {
    snprintf(err, errlen, "line %d: the deployment is named twice", line);
    return -1;
  }
  if (!qtg_is_name(f[1], fl[1])) {
    snprintf(err, errlen, "line %d: a deployment's name is [A-Za-z0-9_.-]{1,%d}", line,
             QTG_APPROVER_NAME_MAX);
    return -1;
  }
  memcpy(a->deployment, f[1], fl[1]);
  a->deployment[fl[1]] = '\0';
  return 0;
}

/* One line (without its newline, NUL-terminated in place). */
static int qtg_parse_line(qtg_approvers *a, char *s, int line, char *err, size_t errlen) {
  char *f[QTG_FIELDS_MAX];
  size_t fl[QTG_FIELDS_MAX], n = 0;
  /* a comment starts at a '#' that begins the line or follows a blank; a
   * '#' inside a field is a typo ("api:al#ice"), refused below */
  for (char *h = s; (h = strchr(h, '#')) != NULL; h++)
    if (h == s || h[-1] == ' ' || h[-1] == '\t') {
      *h = '\0';
      break;
    }
  for (char *p = s; *p;) {
    while (*p == ' ' || *p == '\t' || *p == '\r') p++;
    if (*p == '\0') break;
    if (n == QTG_FIELDS_MAX) {
      snprintf(err, errlen, "line %d: too many fields", line);
      return -1;
    }
    f[n] = p;
    while (*p && *p != ' ' && *p != '\t' && *p != '\r') p++;
    fl[n] = (size_t)(p - f[n]);
    n++;
  }
  if (n == 0) return 0;
  for (const char *p = s; *p; p++)
    if ((unsigned char)*p < ' ' && *p != '\t' && *p != '\r') {
      snprintf(err, errlen, "line %d: a control character", line);
      return -1;
    }
  if (strchr(s, '#') != NULL) {
    snprintf(err, errlen, "line %d: '#' inside a field (a comment starts at a '#' after a blank)", line);
    return -1;
  }
  if (fl[0] == 6 && strncmp(f[0], "person", 6) == 0 && n == 4)
    return qtg_parse_person(a, f, fl, line, 1, err, errlen);
  if (fl[0] == 9 && strncmp(f[0], "initiator", 9) == 0 && n == 4)
    return qtg_parse_person(a, f, fl, line, 0, err, errlen);
  if (fl[0] == 10 && strncmp(f[0], "initiation", 10) == 0 && n == 2 && fl[1] == 6 &&
      strncmp(f[1], "signed", 6) == 0) {
    if (a->initiation_signed) {
      snprintf(err, errlen, "line %d: 'initiation signed' is given twice", line);
      return -1;
    }
    a->initiation_signed = 1;
    return 0;
  }
  if (fl[0] == 6 && strncmp(f[0], "quorum", 6) == 0 && n >= 3)
    return qtg_parse_quorum(a, f, fl, n, line, err, errlen);
  if (fl[0] == 10 && strncmp(f[0], "deployment", 10) == 0 && n == 2)
    return qtg_parse_deployment(a, f, fl, line, err, errlen);
  snprintf(err, errlen,
           "line %d: expected 'deployment NAME', 'person NAME ed25519:HEX PRINCIPAL[,...]', "
           "'initiator NAME ed25519:HEX PRINCIPAL[,...]', 'initiation signed', 'quorum CLASS|* N' "
           "or 'quorum CLASS|* N above AMOUNT ASSET'",
           line);
  return -1;
}

int qtg_approvers_parse(const char *text, size_t len, qtg_approvers **out, char *err,
                        size_t errlen) {
  *out = NULL;
  if (memchr(text, '\0', len) != NULL) {
    snprintf(err, errlen, "the enrolment holds a NUL byte");
    return -1;
  }
  qtg_approvers *a = calloc(1, sizeof *a);
  char *buf = malloc(QTG_APPROVERS_LINE_MAX + 1);
  if (a == NULL || buf == NULL) {
    free(a);
    free(buf);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  int line = 0;
  for (size_t start = 0; start < len;) {
    const char *nl = memchr(text + start, '\n', len - start);
    size_t end = nl ? (size_t)(nl - text) : len;
    line++;
    if (end - start > QTG_APPROVERS_LINE_MAX) {
      snprintf(err, errlen, "line %d: longer than %d bytes", line, QTG_APPROVERS_LINE_MAX);
      goto fail;
    }
    memcpy(buf, text + start, end - start);
    buf[end - start] = '\0';
    if (qtg_parse_line(a, buf, line, err, errlen) != 0) goto fail;
    start = end + 1;
  }
  free(buf);
  if (a->deployment[0] == '\0') {
    snprintf(err, errlen, "no deployment line: name this deployment ('deployment NAME'); every "
                          "approval statement names it, so a signature given to another "
                          "deployment does not count here");
    qtg_approvers_free(a);
    return -1;
  }
  if (a->nquorums == 0) {
    snprintf(err, errlen, "no quorum line: name the approvals each network class needs "
                          "('quorum CLASS N' or 'quorum * N')");
    qtg_approvers_free(a);
    return -1;
  }
  if (qtg_check_tiers(a, err, errlen) != 0) {
    qtg_approvers_free(a);
    return -1;
  }
  uint8_t sum[QTG_SHA256_LEN];
  if (qtg_sha256(text, len, sum) != 0) {
    snprintf(err, errlen, "cannot hash the enrolment");
    qtg_approvers_free(a);
    return -1;
  }
  qtg_hex_encode(sum, sizeof sum, a->digest);
  *out = a;
  return 0;
fail:
  free(buf);
  qtg_approvers_free(a);
  return -1;
}

/* Whether the directory dir, and each one above it, is safe to hold the
 * enrolment: not owned by writer_uid (>= 0) and writable by its owner
 * alone (a sticky directory excepted, where no one else can rename or
 * remove the file).  Whoever may write a directory on the way can put
 * another file in the enrolment's place, such as an older enrolment that
 * still counts a revoked approver, which the checks of the file itself
 * would pass.  dir is absolute and passes through no link (lstat: a link
 * on the way is refused).  0, or -1 and err. */
static int qtg_approvers_dirs_ok(const char *dir, long writer_uid, char *err, size_t errlen) {
  char at[PATH_MAX];
  if (snprintf(at, sizeof at, "%s", dir) >= (int)sizeof at) {
    snprintf(err, errlen, "MG_SIGNER_APPROVERS: the path %s is too long", dir);
    return -1;
  }
  for (;;) {
    struct stat st;
    if (lstat(at, &st) != 0) {
      snprintf(err, errlen, "MG_SIGNER_APPROVERS: cannot look at the directory %s: %s", at, strerror(errno));
      return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
      snprintf(err, errlen, "MG_SIGNER_APPROVERS: %s is not a directory (a link on the enrolment's path "
               "is refused: whoever may change it chooses the file)", at);
      return -1;
    }
    if (writer_uid >= 0 && (long)st.st_uid == writer_uid) {
      snprintf(err, errlen, "MG_SIGNER_APPROVERS: the directory %s is owned by uid %ld, the daemon's "
               "(MG_SIGNER_ALLOWED_UID), which could put another file in the enrolment's place; "
               "make it root's", at, writer_uid);
      return -1;
    }
    if ((st.st_mode & 022) != 0 && (st.st_mode & S_ISVTX) == 0) {
      snprintf(err, errlen, "MG_SIGNER_APPROVERS: the directory %s has mode %04o: group or others "
               "could put another file in the enrolment's place; make it 0755 or stricter",
               at, (unsigned)(st.st_mode & 07777));
      return -1;
    }
    char *slash = strrchr(at, '/');
    if (slash == NULL || strcmp(at, "/") == 0) return 0;
    if (slash == at) slash[1] = '\0';
    else *slash = '\0';
  }
}

/* The signer's checks of the enrolment's path (the file fd, already
 * checked itself): an absolute path with no link, '.' or '..' on the way
 * (each would be resolved in a directory the walk does not see), in
 * directories that only their owner may write, none the daemon's, and
 * still naming the file that was opened (no swap between the open and the
 * checks). */
static int qtg_approvers_path_ok(int fd, const char *path, long writer_uid, char *err, size_t errlen) {
  char real[PATH_MAX];
  if (realpath(path, real) == NULL) {
    snprintf(err, errlen, "MG_SIGNER_APPROVERS: cannot resolve %s: %s", path, strerror(errno));
    return -1;
  }
  if (path[0] != '/' || strcmp(real, path) != 0) {
    snprintf(err, errlen, "MG_SIGNER_APPROVERS: give the enrolment as an absolute path with no link, '.' "
             "or '..' on the way (%s is %s): a link is resolved in a directory whoever owns it may change",
             path, real);
    return -1;
  }
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", real);
  char *last = strrchr(dir, '/');
  if (last == dir) last[1] = '\0';
  else *last = '\0';
  if (qtg_approvers_dirs_ok(dir, writer_uid, err, errlen) != 0) return -1;
  struct stat opened, named;
  if (fstat(fd, &opened) != 0 || lstat(path, &named) != 0 || opened.st_dev != named.st_dev ||
      opened.st_ino != named.st_ino) {
    snprintf(err, errlen, "MG_SIGNER_APPROVERS: %s changed while it was read; read it again", path);
    return -1;
  }
  return 0;
}

static int qtg_approvers_load_checked(const char *path, long writer_uid, int check_path, qtg_approvers **out,
                                      char *err, size_t errlen);

int qtg_approvers_load(const char *path, qtg_approvers **out, char *err, size_t errlen) {
  return qtg_approvers_load_checked(path, -1, 0, out, err, errlen);
}

int qtg_approvers_load_guarded(const char *path, long writer_uid, qtg_approvers **out, char *err,
                               size_t errlen) {
  return qtg_approvers_load_checked(path, writer_uid, 1, out, err, errlen);
}

static int qtg_approvers_load_checked(const char *path, long writer_uid, int check_path, qtg_approvers **out,
                                      char *err, size_t errlen) {
  struct stat st;
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    snprintf(err, errlen, "MG_SIGNER_APPROVERS: cannot open %s: %s", path, strerror(errno));
    return -1;
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > QTG_APPROVERS_FILE_MAX) {
    snprintf(err, errlen, "MG_SIGNER_APPROVERS: %s is not a regular file of at most %d bytes",
             path, QTG_APPROVERS_FILE_MAX);
    close(fd);
    return -1;
  }
  if (writer_uid >= 0 && (long)st.st_uid == writer_uid) {
    snprintf(err, errlen, "MG_SIGNER_APPROVERS: %s is owned by uid %ld, the daemon's "
             "(MG_SIGNER_ALLOWED_UID), which could rewrite who approves; make it root's",
             path, writer_uid);
    close(fd);
    return -1;
  }
  if ((st.st_mode & 022) != 0) {
    snprintf(err, errlen, "MG_SIGNER_APPROVERS: %s has mode %04o: group or others may change "
             "who approves; make it 0644 or stricter", path, (unsigned)(st.st_mode & 07777));
    close(fd);
    return -1;
  }
  if (check_path && qtg_approvers_path_ok(fd, path, writer_uid, err, errlen) != 0) {
    close(fd);
    return -1;
  }
  char *text = malloc((size_t)st.st_size + 1);
  size_t got = 0;
  if (text == NULL) {
    close(fd);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  while (got < (size_t)st.st_size) {
    ssize_t n = read(fd, text + got, (size_t)st.st_size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  close(fd);
  if (got != (size_t)st.st_size) {
    free(text);
    snprintf(err, errlen, "MG_SIGNER_APPROVERS: cannot read %s", path);
    return -1;
  }
  char why[400];
  int rc = qtg_approvers_parse(text, got, out, why, sizeof why);
  free(text);
  if (rc != 0) snprintf(err, errlen, "MG_SIGNER_APPROVERS: %s: %s", path, why);
  return rc;
}

int qtg_approvers_verify(const qtg_approvers *a, int person, const char *msg, size_t len,
                         const char *sig_hex) {
  uint8_t sig[QTG_APPROVER_SIGNATURE_LEN];
  if (a == NULL || person < 0 || (size_t)person >= a->npeople || sig_hex == NULL ||
      strlen(sig_hex) != 2 * sizeof sig || !qtg_is_lower_hex(sig_hex, 2 * sizeof sig) ||
      qtg_hex_decode(sig_hex, 2 * sizeof sig, sig) != 0)
    return 0;
  EVP_PKEY *key = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, a->people[person].pub,
                                              QTG_APPROVER_PUBLIC_LEN);
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  int ok = key != NULL && ctx != NULL && EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, key) == 1 &&
           EVP_DigestVerify(ctx, sig, sizeof sig, (const unsigned char *)msg, len) == 1;
  EVP_MD_CTX_free(ctx);
  EVP_PKEY_free(key);
  return ok ? 1 : 0;
}

static const char *const qtg_statement_header[] = {"qtg-approval-v3", "qtg-initiation-v2",
                                                   "qtg-attestation-v1"};

/* A plan node's key, as plan_nodes' CHECK has it: [a-z][a-z0-9_]{0,62}. */
static int qtg_is_step(const char *s) {
  size_t len = strlen(s);
  if (len == 0 || len > 63 || s[0] < 'a' || s[0] > 'z') return 0;
  for (size_t i = 1; i < len; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_')) return 0;
  return 1;
}

/* Any kind's statement: the facts, and for an attestation its step line. */
static int qtg_statement_write(char *out, size_t outlen, qtg_statement_kind kind, const char *deployment,
                               const char *request, const char *klass, const char *digest,
                               const char *plan, const char *step) {
  if (kind < QTG_STATEMENT_APPROVAL || kind > QTG_STATEMENT_ATTESTATION || deployment == NULL ||
      request == NULL || klass == NULL || digest == NULL || plan == NULL ||
      (kind == QTG_STATEMENT_ATTESTATION) != (step != NULL) || (step != NULL && !qtg_is_step(step)) ||
      !qtg_is_name(deployment, strlen(deployment)) || !qtg_is_uuid(request) ||
      !qtg_is_class(klass, strlen(klass)) || strlen(digest) != 64 || !qtg_is_lower_hex(digest, 64) ||
      strlen(plan) != 64 || !qtg_is_lower_hex(plan, 64))
    return -1;
  int n = snprintf(out, outlen, "%s\ndeployment %s\nrequest %s\nclass %s\ndigest %s\nplan %s\n%s%s%s",
                   qtg_statement_header[kind], deployment, request, klass, digest, plan,
                   step != NULL ? "step " : "", step != NULL ? step : "", step != NULL ? "\n" : "");
  return n > 0 && (size_t)n < outlen ? 0 : -1;
}

int qtg_request_statement(char *out, size_t outlen, qtg_statement_kind kind, const char *deployment,
                          const char *request, const char *klass, const char *digest,
                          const char *plan) {
  if (kind == QTG_STATEMENT_ATTESTATION) return -1;
  return qtg_statement_write(out, outlen, kind, deployment, request, klass, digest, plan, NULL);
}

int qtg_attestation_statement(char *out, size_t outlen, const char *deployment, const char *request,
                              const char *klass, const char *digest, const char *plan, const char *step) {
  if (step == NULL) return -1;
  return qtg_statement_write(out, outlen, QTG_STATEMENT_ATTESTATION, deployment, request, klass, digest,
                             plan, step);
}

/* A decimal without a leading zero (0 itself allowed when zero_ok), at
 * most 18 digits: below 2^63, as PostgreSQL's bigint holds it. */
static int qtg_is_decimal(const char *s, int zero_ok) {
  size_t len = strlen(s);
  if (len == 0 || len > 18 || (s[0] == '0' && (len > 1 || !zero_ok))) return 0;
  for (size_t i = 0; i < len; i++)
    if (s[i] < '0' || s[i] > '9') return 0;
  return 1;
}

int qtg_fill_statement(char *out, size_t outlen, const char *deployment, const char *chain,
                       const char *sender, const char *nonce) {
  if (deployment == NULL || chain == NULL || sender == NULL || nonce == NULL ||
      !qtg_is_name(deployment, strlen(deployment)) || !qtg_is_decimal(chain, 0) ||
      !qtg_is_decimal(nonce, 1) || strlen(sender) != 42 || sender[0] != '0' || sender[1] != 'x' ||
      !qtg_is_lower_hex(sender + 2, 40))
    return -1;
  int n = snprintf(out, outlen, "qtg-fill-v1\ndeployment %s\nchain %s\nsender %s\nnonce %s\n", deployment,
                   chain, sender, nonce);
  return n > 0 && (size_t)n < outlen ? 0 : -1;
}

int qtg_request_statement_check(const char *text, size_t len) {
  char deployment[QTG_APPROVER_NAME_MAX + 1], req[37], klass[QTG_CLASS_MAX + 1], digest[65],
      plan[65], step[64], again[QTG_APPROVAL_STATEMENT_MAX];
  const char *p = text, *end = text + len;
  const char *prefix[] = {"\ndeployment ", "\nrequest ", "\nclass ", "\ndigest ", "\nplan ", "\nstep "};
  char *dst[] = {deployment, req, klass, digest, plan, step};
  size_t cap[] = {sizeof deployment, sizeof req, sizeof klass, sizeof digest, sizeof plan, sizeof step};
  if (len >= sizeof again || memchr(text, '\0', len) != NULL) return -1;
  int kind = -1;
  for (int k = QTG_STATEMENT_APPROVAL; k <= QTG_STATEMENT_ATTESTATION; k++) {
    size_t hl = strlen(qtg_statement_header[k]);
    if (len > hl && memcmp(text, qtg_statement_header[k], hl) == 0 && text[hl] == '\n') {
      kind = k;
      p = text + hl;
    }
  }
  if (kind < 0) return -1;
  int lines = kind == QTG_STATEMENT_ATTESTATION ? 6 : 5;
  for (int i = 0; i < lines; i++) {
    size_t pl = strlen(prefix[i]);
    if ((size_t)(end - p) < pl || memcmp(p, prefix[i], pl) != 0) return -1;
    p += pl;
    const char *stop = memchr(p, '\n', (size_t)(end - p));
    if (stop == NULL || (size_t)(stop - p) >= cap[i]) return -1;
    memcpy(dst[i], p, (size_t)(stop - p));
    dst[i][stop - p] = '\0';
    p = stop;
  }
  /* the one form: rebuilt from its facts, it is byte for byte the same */
  if (qtg_statement_write(again, sizeof again, (qtg_statement_kind)kind, deployment, req, klass, digest, plan,
                          kind == QTG_STATEMENT_ATTESTATION ? step : NULL) != 0)
    return -1;
  return strlen(again) == len && memcmp(again, text, len) == 0 ? kind : -1;
}

int qtg_approver_public_key(const uint8_t secret[QTG_APPROVER_SECRET_LEN],
                            uint8_t pub[QTG_APPROVER_PUBLIC_LEN]) {
  size_t n = QTG_APPROVER_PUBLIC_LEN;
  EVP_PKEY *key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, secret,
                                               QTG_APPROVER_SECRET_LEN);
  int ok = key != NULL && EVP_PKEY_get_raw_public_key(key, pub, &n) == 1 &&
           n == QTG_APPROVER_PUBLIC_LEN;
  EVP_PKEY_free(key);
  return ok ? 0 : -1;
}

int qtg_approver_sign(const uint8_t secret[QTG_APPROVER_SECRET_LEN], const char *msg,
                      size_t len, uint8_t sig[QTG_APPROVER_SIGNATURE_LEN]) {
  size_t n = QTG_APPROVER_SIGNATURE_LEN;
  EVP_PKEY *key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, secret,
                                               QTG_APPROVER_SECRET_LEN);
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  int ok = key != NULL && ctx != NULL && EVP_DigestSignInit(ctx, NULL, NULL, NULL, key) == 1 &&
           EVP_DigestSign(ctx, sig, &n, (const unsigned char *)msg, len) == 1 &&
           n == QTG_APPROVER_SIGNATURE_LEN;
  EVP_MD_CTX_free(ctx);
  EVP_PKEY_free(key);
  return ok ? 0 : -1;
}
