/* lua_core.c -- the `qtg` module: time, sleep, tasks (spawn/join), fatal
 * errors, the read-only settings view, and the assembly of the submodules
 * listed in qtg_modules.h into one table (package.loaded.qtg). */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "qtg_host.h"
#include "qtg_log.h"
#include "qtg_modules_decl.h"
#include "qtg_prelude.h"

/* ---- time and sleep ------------------------------------------------------ */

static int qtg_lua_now(lua_State *L) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  lua_pushnumber(L, (double)tv.tv_sec + (double)tv.tv_usec / 1e6);
  return 1;
}

static int qtg_lua_monotonic(lua_State *L) {
  lua_pushnumber(L, (double)uv_hrtime() / 1e9);
  return 1;
}

/* busy_collecting() -> the serial of the task the busy guard stopped and
 * the monotonic time (qtg.monotonic) its stopped resume began, while the
 * host collects what that task held (qtg_task_finish); false otherwise.
 * A finalizer running then tells whether its object went with that task,
 * and how long it had held the loop (qtg.busy_stops' watch). */
static int qtg_lua_busy_collecting(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  if (h == NULL || h->busy_collecting == 0) {
    lua_pushboolean(L, 0);
    return 1;
  }
  lua_pushnumber(L, (lua_Number)h->busy_collecting);
  lua_pushnumber(L, (double)h->busy_resume_since / 1e9);
  return 2;
}

/* task_serial() -> the running task's serial (from 1), 0 outside a task */
static int qtg_lua_task_serial(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  lua_pushnumber(L, h != NULL && h->current ? (lua_Number)qtg_task_serial(h->current) : 0);
  return 1;
}

/* Pending sleeps are listed on the host so host close can free them (a
 * sleeper still waiting at shutdown is never resumed). */
typedef struct qtg_sleep_req {
  uv_timer_t timer;
  qtg_task *task;
  qtg_host *h;
  struct qtg_sleep_req *prev, *next;
} qtg_sleep_req;

static void qtg_sleep_closed(uv_handle_t *handle) { free(handle->data); }

static void qtg_sleep_unlist(qtg_sleep_req *r) {
  if (r->prev) r->prev->next = r->next;
  else r->h->sleeps = r->next;
  if (r->next) r->next->prev = r->prev;
  uv_close((uv_handle_t *)&r->timer, qtg_sleep_closed);
}

void qtg_core_close(qtg_host *h) {
  while (h->sleeps) qtg_sleep_unlist(h->sleeps);
}

static void qtg_sleep_fired(uv_timer_t *timer) {
  qtg_sleep_req *r = timer->data;
  qtg_task *t = r->task;
  qtg_sleep_unlist(r);
  qtg_task_resume(t, 0);
}

static void qtg_sleep_cancel(qtg_task *t, void *arg) {
  qtg_sleep_req *r = arg;
  uv_timer_stop(&r->timer);
  qtg_sleep_unlist(r);
  /* raw_sleep returns the error; the Lua wrapper qtg.sleep raises it. */
  qtg_push_error(qtg_task_thread(t), "interrupted", "sleep interrupted");
  qtg_task_resume(t, 1);
}

static int qtg_lua_sleep(lua_State *L) {
  double s = luaL_checknumber(L, 1);
  if (!(s >= 0) || s > 1e7) return luaL_argerror(L, 1, "seconds must be between 0 and 1e7");
  qtg_task *t = qtg_task_check(L);
  qtg_host *h = qtg_host_from_lua(L);
  qtg_sleep_req *r = calloc(1, sizeof *r);
  if (!r) return luaL_error(L, "qtg.sleep: out of memory");
  r->task = t;
  r->h = h;
  if (uv_timer_init(h->loop, &r->timer) != 0) {
    free(r);
    return luaL_error(L, "qtg.sleep: cannot create a timer");
  }
  r->timer.data = r;
  r->next = h->sleeps;
  if (r->next) r->next->prev = r;
  h->sleeps = r;
  uint64_t ms = (uint64_t)llround(s * 1000.0);
  /* The loop's cached time is as old as this task's run: refresh it, or
   * the sleep would end early by that much. */
  uv_update_time(h->loop);
  if (uv_timer_start(&r->timer, qtg_sleep_fired, ms, 0) != 0) {
    qtg_sleep_unlist(r);
    return luaL_error(L, "qtg.sleep: cannot start a timer");
  }
  qtg_task_set_cancel(t, qtg_sleep_cancel, r);
  lua_settop(L, 0);
  return qtg_task_yield(L);
}

/* ---- spawn / join ---------------------------------------------------------- */

typedef struct {
  qtg_task *joiner;     /* task waiting in join, or NULL */
  int finished, ok;
  int results_ref;      /* table {n=, ...} of results or {err} */
  int anchor_ref;       /* keeps this userdata alive until joined/done */
  char name[96];
} qtg_task_handle;

static void qtg_spawned_done(qtg_task *t, int ok, int nres, void *data) {
  qtg_task_handle *th = data;
  lua_State *co = qtg_task_thread(t);
  qtg_host *h = qtg_host_from_lua(co);
  lua_State *L = h->L;
  lua_createtable(L, nres, 1);
  int base = lua_gettop(co) - nres + 1;
  for (int i = 0; i < nres; i++) {
    lua_pushvalue(co, base + i);
    lua_xmove(co, L, 1);
    lua_rawseti(L, -2, i + 1);
  }
  lua_pushinteger(L, nres);
  lua_setfield(L, -2, "n");
  lua_pushboolean(L, ok);
  lua_setfield(L, -2, "ok");
  th->results_ref = qtg_ref(L);
  th->finished = 1;
  th->ok = ok;
  qtg_task *joiner = th->joiner;
  int anchor = th->anchor_ref;
  th->anchor_ref = LUA_NOREF;
  if (joiner) {
    th->joiner = NULL;
    qtg_task_set_cancel(joiner, NULL, NULL);
    lua_State *jco = qtg_task_thread(joiner);
    lua_rawgeti(jco, LUA_REGISTRYINDEX, th->results_ref);
    /* the joiner's continuation unpacks the table */
    qtg_unref(L, anchor); /* joiner's stack holds the handle */
    qtg_task_resume_later(joiner, 1);
    return;
  }
  qtg_unref(L, anchor);
}

static int qtg_spawn_with(lua_State *L, int flags) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  qtg_host *h = qtg_host_from_lua(L);
  int nargs = lua_gettop(L) - 1;
  qtg_task_handle *th = lua_newuserdata(L, sizeof *th);
  memset(th, 0, sizeof *th);
  th->results_ref = LUA_NOREF;
  luaL_getmetatable(L, "qtg.task");
  lua_setmetatable(L, -2);
  lua_pushvalue(L, -1);
  th->anchor_ref = qtg_ref(L);
  lua_Debug ar;
  const char *where = "spawn";
  if (lua_getstack(L, 1, &ar) && lua_getinfo(L, "Sl", &ar)) where = ar.short_src;
  snprintf(th->name, sizeof th->name, "spawn:%s", where);
  /* Move fn + args to the main state for qtg_task_spawn. */
  lua_State *M = h->L;
  for (int i = 1; i <= nargs + 1; i++) lua_pushvalue(L, i);
  lua_xmove(L, M, nargs + 1);
  qtg_task_spawn(h, th->name, nargs, flags, qtg_spawned_done, th);
  return 1; /* the handle */
}

static int qtg_lua_spawn(lua_State *L) { return qtg_spawn_with(L, 0); }

/* spawn_unowned(fn, ...): as spawn, but the task belongs to no console
 * command, so stopping the command (Ctrl-C, its busy limit, the client
 * gone) stops only the command's wait in join, never the task: for work
 * that must not be cut half-way (a reload puts the old modules back when
 * it fails).  The busy guard and SIGTERM still stop it. */
static int qtg_lua_spawn_unowned(lua_State *L) { return qtg_spawn_with(L, QTG_TASK_UNOWNED); }

/* A joiner interrupted (Ctrl-C on the console command that joins) stops
 * waiting at once with an "interrupted" error; the joined task runs on. */
static void qtg_join_cancel(qtg_task *joiner, void *arg) {
  qtg_task_handle *th = arg;
  th->joiner = NULL;
  lua_State *co = qtg_task_thread(joiner);
  lua_pushnil(co);
  qtg_push_error(co, "interrupted", "join of task '%s' interrupted", th->name);
  qtg_task_resume(joiner, 2);
}

/* raw_join returns the results table {ok=, n=, ...}, or nil and an error
 * when interrupted; the Lua wrapper qtg.join unpacks it (a yielded binding
 * cannot return several values computed after the yield without a
 * continuation, which LuaJIT lacks). */
static int qtg_lua_join(lua_State *L) {
  qtg_task_handle *th = luaL_checkudata(L, 1, "qtg.task");
  if (th->finished) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, th->results_ref);
    return 1;
  }
  if (th->joiner) return luaL_error(L, "qtg.join: task is already being joined");
  qtg_task *t = qtg_task_check(L);
  th->joiner = t;
  lua_settop(L, 1);
  qtg_task_set_cancel(t, qtg_join_cancel, th);
  return qtg_task_yield(L);
}

static int qtg_task_handle_gc(lua_State *L) {
  qtg_task_handle *th = luaL_checkudata(L, 1, "qtg.task");
  if (th->results_ref != LUA_NOREF) qtg_unref(L, th->results_ref);
  th->results_ref = LUA_NOREF;
  return 0;
}

static int qtg_task_handle_done(lua_State *L) {
  qtg_task_handle *th = luaL_checkudata(L, 1, "qtg.task");
  lua_pushboolean(L, th->finished);
  return 1;
}

/* ---- fatal, refs, settings ---------------------------------------------- */

static int qtg_lua_fatal(lua_State *L) {
  const char *msg = luaL_checkstring(L, 1);
  qtg_push_error(L, "fatal", "%s", msg);
  lua_pushboolean(L, 1);
  lua_setfield(L, -2, "fatal");
  return lua_error(L);
}

static int qtg_lua_pid(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)getpid());
  return 1;
}

static int qtg_lua_process_id(lua_State *L) {
  char host[256];
  if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "unknown");
  host[sizeof host - 1] = '\0';
  lua_pushfstring(L, "%s:%d", host, (int)getpid());
  return 1;
}

static int qtg_lua_refs(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  lua_createtable(L, 0, 2);
  lua_pushinteger(L, h->live_refs);
  lua_setfield(L, -2, "refs");
  lua_pushinteger(L, h->live_tasks);
  lua_setfield(L, -2, "tasks");
  return 1;
}

static void qtg_lower_name(char *out, size_t cap, const char *name) {
  if (strncmp(name, "MG_", 3) == 0) name += 3;
  size_t i = 0;
  for (; name[i] && i + 1 < cap; i++) out[i] = (char)tolower((unsigned char)name[i]);
  out[i] = '\0';
}

static void qtg_push_setting(lua_State *L, const qtg_settings *s, int i) {
  const qtg_setting_def *d = &qtg_setting_defs[i];
  switch (d->type) {
  case QTG_SET_BOOL: lua_pushboolean(L, s->v[i].b); break;
  case QTG_SET_INT:
  case QTG_SET_NUM: lua_pushnumber(L, s->v[i].n); break;
  case QTG_SET_STR: lua_pushstring(L, s->v[i].s ? s->v[i].s : ""); break;
  case QTG_SET_SECRET: lua_pushboolean(L, s->v[i].s && s->v[i].s[0]); break;
  }
}

static int qtg_settings_readonly(lua_State *L) {
  return luaL_error(L, "qtg.settings is read-only (settings come from MG_* variables at start-up)");
}

static int qtg_settings_missing(lua_State *L) {
  return luaL_error(L, "qtg.settings has no setting '%s'", luaL_checkstring(L, 2));
}

/* qtg.settings: a proxy over a table of values.  Secrets appear only as
 * booleans (configured or not), so no key text ever reaches Lua. */
static void qtg_push_settings(lua_State *L, const qtg_settings *s) {
  char key[96];
  lua_newtable(L);                      /* proxy */
  lua_createtable(L, 0, 2);             /* metatable */
  lua_createtable(L, 0, QTG_S__COUNT);  /* values */
  for (int i = 0; i < QTG_S__COUNT; i++) {
    qtg_lower_name(key, sizeof key, qtg_setting_defs[i].name);
    if (qtg_setting_defs[i].type == QTG_SET_SECRET) strncat(key, "_configured", sizeof key - strlen(key) - 1);
    qtg_push_setting(L, s, i);
    lua_setfield(L, -2, key);
  }
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, qtg_settings_missing);
  lua_setfield(L, -2, "__index");
  lua_setmetatable(L, -2);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, qtg_settings_readonly);
  lua_setfield(L, -2, "__newindex");
  lua_pushliteral(L, "read-only");
  lua_setfield(L, -2, "__metatable");
  lua_setmetatable(L, -2);
}

/* qtg.settings_list(): {name=, value=, default=, set=, help=, type=} rows. */
static int qtg_lua_settings_list(lua_State *L) {
  static const char *const type_names[] = {"bool", "integer", "number", "string", "secret"};
  qtg_host *h = qtg_host_from_lua(L);
  lua_createtable(L, QTG_S__COUNT, 0);
  for (int i = 0; i < QTG_S__COUNT; i++) {
    const qtg_setting_def *d = &qtg_setting_defs[i];
    lua_createtable(L, 0, 6);
    lua_pushstring(L, d->name);
    lua_setfield(L, -2, "name");
    lua_pushstring(L, type_names[d->type]);
    lua_setfield(L, -2, "type");
    if (d->type == QTG_SET_SECRET) {
      lua_pushstring(L, h->settings->v[i].s && h->settings->v[i].s[0] ? "(set, hidden)" : "(unset)");
    } else {
      qtg_push_setting(L, h->settings, i);
    }
    lua_setfield(L, -2, "value");
    lua_pushstring(L, d->type == QTG_SET_SECRET ? "" : d->def);
    lua_setfield(L, -2, "default");
    lua_pushboolean(L, h->settings->v[i].set);
    lua_setfield(L, -2, "set");
    lua_pushstring(L, d->help);
    lua_setfield(L, -2, "help");
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

typedef struct {
  const char *field;
  lua_CFunction open;
} qtg_lua_module;

static const qtg_lua_module qtg_lua_modules[] = {
#define QTG_LUA_MODULE(field, opener) {field, opener},
#include "qtg_modules.h"
#undef QTG_LUA_MODULE
};

static const luaL_Reg qtg_core_funcs[] = {
  {"now", qtg_lua_now},
  {"monotonic", qtg_lua_monotonic},
  {"busy_collecting", qtg_lua_busy_collecting},
  {"task_serial", qtg_lua_task_serial},
  {"raw_sleep", qtg_lua_sleep},
  {"spawn", qtg_lua_spawn},
  {"spawn_unowned", qtg_lua_spawn_unowned},
  {"raw_join", qtg_lua_join},
  {"fatal", qtg_lua_fatal},
  {"error", qtg_lua_error_new},
  {"refs", qtg_lua_refs},
  {"pid", qtg_lua_pid},
  {"process_id", qtg_lua_process_id},
  {"settings_list", qtg_lua_settings_list},
  {NULL, NULL},
};

int qtg_core_register(qtg_host *h) {
  lua_State *L = h->L;
  luaL_newmetatable(L, "qtg.task");
  lua_pushcfunction(L, qtg_task_handle_gc);
  lua_setfield(L, -2, "__gc");
  lua_createtable(L, 0, 2);
  lua_pushcfunction(L, qtg_task_handle_done);
  lua_setfield(L, -2, "done");
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);

  lua_newtable(L);
  luaL_register(L, NULL, qtg_core_funcs);
  qtg_push_settings(L, h->settings);
  lua_setfield(L, -2, "settings");
  lua_pushstring(L, h->root_dir);
  lua_setfield(L, -2, "root");
  lua_pushstring(L, QTG_VERSION);
  lua_setfield(L, -2, "version");
  for (size_t i = 0; i < sizeof qtg_lua_modules / sizeof qtg_lua_modules[0]; i++) {
    lua_pushcfunction(L, qtg_lua_modules[i].open);
    if (lua_pcall(L, 0, 1, 0) != 0) {
      qtg_log_error("cannot open qtg.%s: %s", qtg_lua_modules[i].field, lua_tostring(L, -1));
      lua_pop(L, 2);
      return -1;
    }
    lua_setfield(L, -2, qtg_lua_modules[i].field);
  }
  if (qtg_prelude_load(L, QTG_PRELUDE_core) != 0) {
    qtg_log_error("qtg prelude: %s", lua_tostring(L, -1));
    lua_pop(L, 2);
    return -1;
  }
  lua_pushvalue(L, -2);
  if (lua_pcall(L, 1, 0, 0) != 0) {
    qtg_log_error("qtg prelude: %s", lua_tostring(L, -1));
    lua_pop(L, 2);
    return -1;
  }
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "loaded");
  lua_pushvalue(L, -3);
  lua_setfield(L, -2, "qtg");
  lua_pop(L, 3);
  return 0;
}
