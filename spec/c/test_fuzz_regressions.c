/* test_fuzz_regressions.c -- replay every input of fuzz/corpus/<target>/
 * through the same entry points libFuzzer drives (fuzz/qtg_fuzz.h): the
 * seeds, and every crash, hang or property violation a fuzzer ever found,
 * kept as a regression case once fixed (docs/reliability.md).  Runs in the
 * plain and the sanitizer builds, without clang: the targets' sources are
 * compiled into this test directly, so no CMake change is needed for it.
 * A target whose corpus directory is missing or empty is a failure. */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../fuzz/fuzz_host.c"
#include "../../fuzz/fuzz_settings.c"
#include "../../fuzz/fuzz_json.c"
#include "../../fuzz/fuzz_console.c"
#include "../../fuzz/fuzz_http.c"
#include "../../fuzz/fuzz_signer.c"
#include "../../fuzz/fuzz_pg.c"
#include "../../fuzz/fuzz_approver.c"
#include "qtg_test.h"

static qtg_test_counts tc;

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void replay(const char *target, int (*fn)(const uint8_t *, size_t)) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/fuzz/corpus/%s", qtg_fuzz_root(), target);
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "%s: cannot open the corpus %s\n", target, dir);
    tc.failed++;
    return;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      names = realloc(names, cap * sizeof *names);
      if (!names) abort();
    }
    names[n++] = strdup(e->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof *names, by_name);
  CHECK(&tc, n > 0);
  for (size_t i = 0; i < n; i++) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    FILE *f = fopen(path, "rb");
    uint8_t *buf = NULL;
    size_t len = 0;
    if (f) {
      fseek(f, 0, SEEK_END);
      long sz = ftell(f);
      fseek(f, 0, SEEK_SET);
      buf = malloc(sz > 0 ? (size_t)sz : 1);
      if (!buf) abort();
      len = sz > 0 ? fread(buf, 1, (size_t)sz, f) : 0;
      fclose(f);
    }
    int rc = f ? fn(buf, len) : -1;
    if (rc != 0) fprintf(stderr, "%s: %s failed\n", target, path);
    CHECK(&tc, rc == 0);
    free(buf);
    free(names[i]);
  }
  free(names);
  printf("%s: %zu inputs replayed\n", target, n);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  replay("settings", qtg_fuzz_settings);
  replay("json", qtg_fuzz_json);
  replay("console", qtg_fuzz_console);
  replay("http", qtg_fuzz_http);
  replay("signer", qtg_fuzz_signer);
  replay("pg", qtg_fuzz_pg);
  replay("approver", qtg_fuzz_approver);
  return qtg_test_finish(&tc);
}
