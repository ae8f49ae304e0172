/* fuzz_pg.c -- the `pg` target: what PostgreSQL sends qtgd outside a
 * result, the after-commit notification a pool session's trigger raises as
 * a NOTICE (qtg_pg_after_commit_parse, src/qtg_pg.c).
 *
 * The input up to its first NUL byte is the NOTICE's message, as libpq
 * hands it over.  Properties: it is taken exactly when it starts with
 * "qtg_after_commit ", then a channel of at least one byte up to the next
 * space, then that space; the channel and the payload given back are those
 * bytes, and the payload is the rest of the message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qtg_fuzz.h"
#include "qtg_pg.h"

static const char fuzz_pg_prefix[] = "qtg_after_commit ";

/* The same reading, written the long way: -1, or the channel's length. */
static long fuzz_pg_expected(const char *msg) {
  size_t plen = sizeof fuzz_pg_prefix - 1;
  for (size_t i = 0; i < plen; i++)
    if (msg[i] != fuzz_pg_prefix[i]) return -1;
  size_t n = 0;
  while (msg[plen + n] != '\0' && msg[plen + n] != ' ') n++;
  if (n == 0 || msg[plen + n] != ' ') return -1;
  return (long)n;
}

int qtg_fuzz_pg(const uint8_t *data, size_t size) {
  char *msg = malloc(size + 1);
  if (!msg) return 0;
  memcpy(msg, data, size);
  msg[size] = '\0';
  size_t channel_len = 0;
  const char *payload = NULL;
  int rc = qtg_pg_after_commit_parse(msg, &channel_len, &payload);
  long want = fuzz_pg_expected(msg);
  int bad = 0;
  if ((rc == 0) != (want >= 0)) {
    fprintf(stderr, "pg: parse answered %d where the message %s one\n", rc, want >= 0 ? "is" : "is not");
    bad = 1;
  } else if (rc == 0) {
    size_t plen = sizeof fuzz_pg_prefix - 1;
    if (channel_len != (size_t)want || payload != msg + plen + channel_len + 1 ||
        strlen(payload) != strlen(msg) - plen - channel_len - 1) {
      fprintf(stderr, "pg: channel or payload out of place (channel %zu bytes, expected %ld)\n", channel_len, want);
      bad = 1;
    }
  }
  free(msg);
  return bad ? -1 : 0;
}
