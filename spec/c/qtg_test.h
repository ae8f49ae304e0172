/* qtg_test.h -- the smallest test harness that reports clearly: CHECK
 * records a failure with file and line and goes on; QTG_TEST_MAIN prints
 * "N passed, N failed" and exits non-zero on any failure. */
#ifndef QTG_TEST_H
#define QTG_TEST_H

#include <stdio.h>
#include <string.h>

typedef struct {
  int passed, failed;
} qtg_test_counts;

#define CHECK(counts, cond)                                                    \
  do {                                                                         \
    if (cond) {                                                                \
      (counts)->passed++;                                                      \
    } else {                                                                   \
      (counts)->failed++;                                                      \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                          \
  } while (0)

#define CHECK_STR(counts, got, want)                                                     \
  do {                                                                                   \
    const char *g_ = (got), *w_ = (want);                                                \
    if (g_ && w_ && strcmp(g_, w_) == 0) {                                               \
      (counts)->passed++;                                                                \
    } else {                                                                             \
      (counts)->failed++;                                                                \
      fprintf(stderr, "%s:%d: got \"%s\", want \"%s\"\n", __FILE__, __LINE__, g_ ? g_ : "(null)", \
              w_ ? w_ : "(null)");                                                       \
    }                                                                                    \
  } while (0)

static inline int qtg_test_finish(const qtg_test_counts *c) {
  printf("%d passed, %d failed\n", c->passed, c->failed);
  return c->failed ? 1 : 0;
}

#endif
