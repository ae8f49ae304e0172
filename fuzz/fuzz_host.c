/* fuzz_host.c -- one real qtg host shared by the console and http fuzz
 * targets: made on first use (console enabled on a socket in a private
 * temporary directory, no database ever connected, workers off), closed at
 * exit so the leak checker sees a clean end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qtg_fuzz.h"
#include "qtg_host.h"
#include "qtg_log.h"
#include "qtg_settings.h"

static qtg_host fuzz_host;
static qtg_settings fuzz_settings;
static int fuzz_host_ready;
static char fuzz_dir[64];
static char fuzz_socket_env[128];

const char *qtg_fuzz_root(void) {
  const char *root = getenv("QTG_ROOT");
  return root && root[0] ? root : QTG_SOURCE_DIR;
}

static const char *fuzz_env(const char *name, void *ud) {
  (void)ud;
  static const char *const fixed[] = {
      "MG_DATABASE_URL=postgresql://127.0.0.1:1/unused", /* never connected */
      "MG_CONSOLE_ENABLED=true", "MG_WORKERS_ENABLED=false", "MG_LOG_LEVEL=error", NULL};
  size_t n = strlen(name);
  if (strcmp(name, "MG_CONSOLE_SOCKET") == 0) return fuzz_socket_env + strlen("MG_CONSOLE_SOCKET=");
  for (const char *const *e = fixed; *e; e++)
    if (strncmp(*e, name, n) == 0 && (*e)[n] == '=') return *e + n + 1;
  return NULL;
}

void qtg_fuzz_host_close(void) {
  if (!fuzz_host_ready) return;
  fuzz_host_ready = 0;
  qtg_host_close(&fuzz_host);
  qtg_settings_free(&fuzz_settings);
  char path[128];
  snprintf(path, sizeof path, "%s/console.sock", fuzz_dir);
  unlink(path);
  rmdir(fuzz_dir);
}

qtg_host *qtg_fuzz_host(void) {
  char err[512] = "";
  if (fuzz_host_ready) return &fuzz_host;
  snprintf(fuzz_dir, sizeof fuzz_dir, "/tmp/qtg-fuzz.XXXXXX");
  if (!mkdtemp(fuzz_dir)) {
    perror("qtg fuzz: mkdtemp");
    abort();
  }
  snprintf(fuzz_socket_env, sizeof fuzz_socket_env, "MG_CONSOLE_SOCKET=%s/console.sock", fuzz_dir);
  if (qtg_settings_load(&fuzz_settings, fuzz_env, NULL, err, sizeof err) != 0) {
    fprintf(stderr, "qtg fuzz: settings: %s\n", err);
    abort();
  }
  qtg_log_set_level(QTG_LOG_ERROR);
  if (qtg_host_init(&fuzz_host, &fuzz_settings, qtg_fuzz_root()) != 0) {
    fprintf(stderr, "qtg fuzz: cannot start a host\n");
    abort();
  }
  fuzz_host_ready = 1;
  atexit(qtg_fuzz_host_close);
  return &fuzz_host;
}
