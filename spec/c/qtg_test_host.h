/* qtg_test_host.h -- what C tests need to run Lua inside a real host: a
 * settings lookup over a NULL-terminated "NAME=value" array, and a task
 * done-callback that records whether the task ended well and its first
 * result as a string. */
#ifndef QTG_TEST_HOST_H
#define QTG_TEST_HOST_H

#include <stdio.h>
#include <string.h>

#include "qtg_host.h"

static inline const char *qtg_test_env_lookup(const char *name, void *ud) {
  const char *const *env = ud;
  size_t n = strlen(name);
  for (; *env; env++)
    if (strncmp(*env, name, n) == 0 && (*env)[n] == '=') return *env + n + 1;
  return NULL;
}

typedef struct {
  int done, ok;
  char result[256];
} qtg_test_task_state;

static inline void qtg_test_task_done(qtg_task *t, int ok, int nres, void *data) {
  qtg_test_task_state *st = data;
  lua_State *co = qtg_task_thread(t);
  st->done = 1;
  st->ok = ok;
  st->result[0] = '\0';
  if (nres >= 1 && lua_isstring(co, -nres))
    snprintf(st->result, sizeof st->result, "%s", lua_tostring(co, -nres));
}

#endif
