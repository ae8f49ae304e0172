/* qtg_runtime.c -- workers, run_loop and supervision (see qtg_runtime.h).
 *
 * A worker moves between SLEEPING (timer armed), RUNNING (a tick task is in
 * flight), PAUSED, STOPPED and DEAD.  Wake-ups, pauses and stops that arrive
 * while a tick runs are remembered and applied when it ends, so a running
 * tick is never cut short by the supervisor: shutdown waits for it (up to
 * MG_SHUTDOWN_GRACE_SECONDS) and host close then drops its connection, which
 * makes the server roll its transaction back. */
#include "qtg_runtime.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qtg_log.h"
#include "qtg_notify.h"
#include "qtg_prelude.h"

typedef enum { QTG_W_SLEEPING, QTG_W_RUNNING, QTG_W_PAUSED, QTG_W_STOPPED, QTG_W_DEAD } qtg_worker_state;
static const char *const qtg_worker_state_names[] = {"sleeping", "running", "paused", "stopped", "dead"};

#define QTG_DELAY_HISTORY 16

/* Upper bounds (seconds) of the pass-duration histogram's buckets: the same
 * as qtg.metrics.BUCKETS, which renders them (workers() hands both). */
static const double qtg_pass_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
#define QTG_PASS_BUCKETS (sizeof qtg_pass_buckets / sizeof qtg_pass_buckets[0])

typedef struct qtg_worker {
  struct qtg_runtime *rt;
  char name[64];
  int core;
  double interval, jitter, sleep_scale;
  int drain;                 /* run again at once after a pass that found work */
  int tick_ref;
  uv_timer_t *timer;
  qtg_worker_state state;
  int paused, stop_requested, wake_pending;
  int consecutive_errors;
  double ticks, errors_total, items_total, last_count;
  double last_tick_at, next_run_at, last_delay;
  double delays[QTG_DELAY_HISTORY];
  int ndelays;
  uint64_t pass_started_ns;  /* uv_hrtime() when the running pass began */
  double pass_sum, pass_count, pass_buckets[QTG_PASS_BUCKETS];
  char last_error[512];
  struct qtg_worker *next;
} qtg_worker;

struct qtg_runtime {
  qtg_host *h;
  qtg_worker *workers;
  int running_ticks;
  int stopping, exit_code;
  uv_timer_t *grace;
  uint64_t rng;
  int trampoline_ref;
};

double qtg_runloop_delay(int consecutive_errors, double interval, double jitter, double u) {
  if (consecutive_errors >= QTG_RUNLOOP_MAX_CONSECUTIVE_ERRORS) {
    double b = pow(2.0, consecutive_errors);
    return b < QTG_RUNLOOP_MAX_BACKOFF_SECONDS ? b : QTG_RUNLOOP_MAX_BACKOFF_SECONDS;
  }
  double d = interval + u * jitter;
  return d < QTG_RUNLOOP_MIN_SLEEP_SECONDS ? QTG_RUNLOOP_MIN_SLEEP_SECONDS : d;
}

static double qtg_runtime_uniform(struct qtg_runtime *rt) {
  /* xorshift64*: per-runtime state, no global RNG */
  rt->rng ^= rt->rng >> 12;
  rt->rng ^= rt->rng << 25;
  rt->rng ^= rt->rng >> 27;
  uint64_t x = rt->rng * 2685821657736338717ULL;
  return ((double)(x >> 11) / 9007199254740992.0) * 2.0 - 1.0;
}

static double qtg_wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The longest interval, jitter or first delay a worker may ask (a year):
 * with sleep_scale, its milliseconds stay far inside a uint64_t. */
#define QTG_WORKER_MAX_SECONDS 31536000

static void qtg_worker_start_tick(qtg_worker *w);
static void qtg_runtime_maybe_done(struct qtg_runtime *rt);

static void qtg_worker_timer_fired(uv_timer_t *t) { qtg_worker_start_tick(t->data); }

static void qtg_worker_arm(qtg_worker *w, double seconds) {
  w->state = QTG_W_SLEEPING;
  w->next_run_at = qtg_wall_now() + seconds;
  uint64_t ms = (uint64_t)llround(seconds * w->sleep_scale * 1000.0);
  uv_update_time(w->rt->h->loop); /* a tick may have run long since the loop woke */
  if (uv_timer_start(w->timer, qtg_worker_timer_fired, ms, 0) != 0) {
    qtg_logf(QTG_LOG_ERROR, "worker", w->name, "cannot arm the worker's timer");
    w->state = QTG_W_DEAD;
  }
}

static void qtg_timer_closed(uv_handle_t *h) { free(h); }

static void qtg_worker_free(qtg_worker *w) {
  qtg_host *h = w->rt->h;
  for (qtg_worker **pp = &w->rt->workers; *pp; pp = &(*pp)->next) {
    if (*pp == w) {
      *pp = w->next;
      break;
    }
  }
  uv_close((uv_handle_t *)w->timer, qtg_timer_closed);
  if (h->L) qtg_unref(h->L, w->tick_ref);
  free(w);
}

/* After a pass (or instead of one): decide what the worker does next. */
static void qtg_worker_after_pass(qtg_worker *w, double delay) {
  struct qtg_runtime *rt = w->rt;
  if (w->stop_requested) {
    qtg_logf(QTG_LOG_INFO, "worker", w->name, "worker stopped");
    qtg_worker_free(w);
    return;
  }
  if (rt->stopping) {
    w->state = QTG_W_STOPPED;
    return;
  }
  if (w->paused) {
    w->state = QTG_W_PAUSED;
    return;
  }
  if (w->wake_pending) {
    w->wake_pending = 0;
    delay = 0;
  }
  qtg_worker_arm(w, delay);
}

static void qtg_worker_record_delay(qtg_worker *w, double d) {
  w->last_delay = d;
  if (w->ndelays == QTG_DELAY_HISTORY) {
    memmove(w->delays, w->delays + 1, sizeof w->delays - sizeof w->delays[0]);
    w->ndelays--;
  }
  w->delays[w->ndelays++] = d;
}

static void qtg_worker_die(qtg_worker *w, const char *why) {
  struct qtg_runtime *rt = w->rt;
  w->state = QTG_W_DEAD;
  const char *fields[] = {"worker", w->name, "group", w->core ? "core" : "sidecar", "error", why, NULL};
  if (w->core) {
    qtg_log_fields(QTG_LOG_ERROR, "core worker died: stopping the process", fields);
    qtg_runtime_shutdown(rt->h, QTG_EXIT_CORE_FAILED, "core worker died");
  } else {
    qtg_log_fields(QTG_LOG_ERROR, "sidecar worker died; the others go on", fields);
  }
}

/* Error value on top of co: message for the record, and whether it is fatal. */
static int qtg_worker_describe_error(lua_State *co, int idx, char *out, size_t cap) {
  int fatal = 0;
  lua_pushvalue(co, idx);
  if (lua_istable(co, -1)) {
    lua_getfield(co, -1, "fatal");
    fatal = lua_toboolean(co, -1);
    lua_pop(co, 1);
  }
  if (luaL_callmeta(co, -1, "__tostring")) lua_replace(co, -2);
  const char *m = lua_tostring(co, -1);
  snprintf(out, cap, "%s", m ? m : "(error object is not a string)");
  lua_pop(co, 1);
  return fatal;
}

/* Task done: the trampoline returned (count) or raised ({err=, traceback=}). */
static void qtg_worker_tick_done(qtg_task *t, int ok, int nres, void *data) {
  qtg_worker *w = data;
  struct qtg_runtime *rt = w->rt;
  lua_State *co = qtg_task_thread(t);
  rt->running_ticks--;
  w->ticks++;
  w->last_tick_at = qtg_wall_now();
  double took = (double)(uv_hrtime() - w->pass_started_ns) / 1e9;
  for (size_t i = 0; i < QTG_PASS_BUCKETS; i++)
    if (took <= qtg_pass_buckets[i]) w->pass_buckets[i]++;
  w->pass_sum += took;
  w->pass_count++;
  if (ok) {
    double count = nres > 0 ? lua_tonumber(co, -nres) : 0;
    w->last_count = count;
    w->items_total += count;
    w->consecutive_errors = 0;
    double d = qtg_runloop_delay(0, w->interval, w->jitter, qtg_runtime_uniform(rt));
    if (w->drain && count > 0) d = 0;
    qtg_worker_record_delay(w, d);
    qtg_worker_after_pass(w, d);
  } else {
    char msg[sizeof w->last_error];
    int fatal = qtg_worker_describe_error(co, -1, msg, sizeof msg);
    const char *tb = NULL;
    if (lua_istable(co, -1)) {
      lua_getfield(co, -1, "traceback");
      tb = lua_tostring(co, -1);
      lua_pop(co, 1); /* still referenced by the error table */
    }
    snprintf(w->last_error, sizeof w->last_error, "%s", msg);
    w->errors_total++;
    w->consecutive_errors++;
    if (fatal) {
      qtg_worker_die(w, msg);
    } else {
      char errs[16];
      snprintf(errs, sizeof errs, "%d", w->consecutive_errors);
      const char *fields[] = {"worker", w->name, "error", msg, "consecutive_errors", errs,
                              tb ? "traceback" : NULL, tb, NULL};
      qtg_log_fields(QTG_LOG_ERROR, "tick failed", fields);
      double d = qtg_runloop_delay(w->consecutive_errors, w->interval, w->jitter, qtg_runtime_uniform(rt));
      qtg_worker_record_delay(w, d);
      qtg_worker_after_pass(w, d);
    }
  }
  qtg_runtime_maybe_done(rt);
}

static void qtg_worker_start_tick(qtg_worker *w) {
  struct qtg_runtime *rt = w->rt;
  qtg_host *h = rt->h;
  if (rt->stopping || w->state == QTG_W_RUNNING || w->state == QTG_W_DEAD) return;
  uv_timer_stop(w->timer);
  w->state = QTG_W_RUNNING;
  w->pass_started_ns = uv_hrtime();
  rt->running_ticks++;
  lua_State *L = h->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, rt->trampoline_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, w->tick_ref);
  lua_pushstring(L, w->name);
  qtg_task *t = qtg_task_spawn(h, w->name, 2, QTG_TASK_QUIET, qtg_worker_tick_done, w);
  if (!t) {
    rt->running_ticks--;
    qtg_worker_die(w, "cannot start a task (out of memory)");
  }
}

static void qtg_runtime_maybe_done(struct qtg_runtime *rt) {
  if (rt->stopping && rt->running_ticks == 0) {
    if (rt->grace) uv_timer_stop(rt->grace);
    qtg_logf(QTG_LOG_INFO, NULL, NULL, "all workers stopped");
    qtg_host_stop(rt->h, rt->exit_code);
  }
}

static void qtg_runtime_grace_expired(uv_timer_t *t) {
  struct qtg_runtime *rt = t->data;
  qtg_logf(QTG_LOG_WARN, NULL, NULL,
           "shutdown grace period over with %d tick(s) still running: their transactions are rolled back",
           rt->running_ticks);
  qtg_host_stop(rt->h, rt->exit_code);
}

void qtg_runtime_shutdown(qtg_host *h, int exit_code, const char *why) {
  struct qtg_runtime *rt = h->runtime;
  if (!rt) {
    qtg_host_stop(h, exit_code);
    return;
  }
  if (exit_code > rt->exit_code) rt->exit_code = exit_code;
  if (rt->stopping) return;
  rt->stopping = 1;
  /* Tell systemd the stop has begun (once), so `systemctl status` says so
   * during the grace period; a no-op without NOTIFY_SOCKET. */
  char nerr[256];
  static const char stopping[] = "STOPPING=1\nSTATUS=stopping: finishing running ticks";
  if (qtg_notify_send(stopping, sizeof stopping - 1, nerr, sizeof nerr) < 0)
    qtg_log_error("sd_notify STOPPING=1: %s", nerr);
  qtg_logf(QTG_LOG_INFO, "reason", why, "shutting down: no new ticks; waiting for %d running tick(s)",
           rt->running_ticks);
  for (qtg_worker *w = rt->workers; w; w = w->next) {
    if (w->state != QTG_W_RUNNING) {
      uv_timer_stop(w->timer);
      if (w->state != QTG_W_DEAD) w->state = QTG_W_STOPPED;
    }
  }
  if (rt->running_ticks == 0) {
    qtg_runtime_maybe_done(rt);
    return;
  }
  double grace = qtg_settings_num(h->settings, QTG_S_SHUTDOWN_GRACE_SECONDS);
  rt->grace = malloc(sizeof *rt->grace);
  if (!rt->grace || uv_timer_init(h->loop, rt->grace) != 0) {
    free(rt->grace);
    rt->grace = NULL;
    qtg_host_stop(h, rt->exit_code);
    return;
  }
  rt->grace->data = rt;
  uv_timer_start(rt->grace, qtg_runtime_grace_expired, (uint64_t)llround(grace * 1000.0), 0);
}

int qtg_runtime_running_ticks(qtg_host *h) { return h->runtime ? h->runtime->running_ticks : 0; }

/* ---- Lua bindings ------------------------------------------------------------ */

static struct qtg_runtime *qtg_rt(lua_State *L) { return qtg_host_from_lua(L)->runtime; }

static qtg_worker *qtg_worker_find(struct qtg_runtime *rt, const char *name) {
  for (qtg_worker *w = rt->workers; w; w = w->next)
    if (strcmp(w->name, name) == 0 && !w->stop_requested) return w;
  return NULL;
}

static qtg_worker *qtg_worker_check(lua_State *L, int idx) {
  const char *name = luaL_checkstring(L, idx);
  qtg_worker *w = qtg_worker_find(qtg_rt(L), name);
  if (!w) luaL_error(L, "no worker named '%s'", name);
  return w;
}

static double qtg_opt_field_num(lua_State *L, int idx, const char *k, double def) {
  lua_getfield(L, idx, k);
  double v = lua_isnil(L, -1) ? def : luaL_checknumber(L, -1);
  lua_pop(L, 1);
  return v;
}

/* start_worker{name=, group="core"|"sidecar", interval=, jitter=, tick=fn,
 *              drain=bool, first_delay=s, sleep_scale=x (tests only)} */
static int qtg_lua_start_worker(lua_State *L) {
  struct qtg_runtime *rt = qtg_rt(L);
  qtg_host *h = rt->h;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "name");
  const char *name = luaL_checkstring(L, -1);
  if (strlen(name) == 0 || strlen(name) >= sizeof(((qtg_worker *)0)->name))
    return luaL_error(L, "worker name must be 1-63 characters");
  if (qtg_worker_find(rt, name)) return luaL_error(L, "worker '%s' is already running", name);
  lua_getfield(L, 1, "group");
  const char *group = luaL_optstring(L, -1, "sidecar");
  if (strcmp(group, "core") != 0 && strcmp(group, "sidecar") != 0)
    return luaL_error(L, "worker '%s': group must be \"core\" or \"sidecar\", not \"%s\"", name, group);
  /* Each becomes a timer's milliseconds: a negative, infinite or NaN one
   * would wrap to a delay no tick ever reaches. */
  double interval = qtg_opt_field_num(L, 1, "interval", -1);
  if (!(interval > 0 && interval <= QTG_WORKER_MAX_SECONDS))
    return luaL_error(L, "worker '%s': interval must be a positive number of seconds (at most %d)", name,
                      QTG_WORKER_MAX_SECONDS);
  double jitter = qtg_opt_field_num(L, 1, "jitter", 0);
  if (!(jitter >= 0 && jitter <= QTG_WORKER_MAX_SECONDS))
    return luaL_error(L, "worker '%s': jitter must be 0 to %d seconds", name, QTG_WORKER_MAX_SECONDS);
  double scale = qtg_opt_field_num(L, 1, "sleep_scale", 1);
  if (!(scale > 0 && scale <= 1000)) return luaL_error(L, "worker '%s': sleep_scale must be > 0 and <= 1000", name);
  double first = qtg_opt_field_num(L, 1, "first_delay", 0);
  if (!(first >= 0 && first <= QTG_WORKER_MAX_SECONDS))
    return luaL_error(L, "worker '%s': first_delay must be 0 to %d seconds", name, QTG_WORKER_MAX_SECONDS);
  lua_getfield(L, 1, "drain");
  int drain = lua_toboolean(L, -1);
  lua_getfield(L, 1, "tick");
  if (!lua_isfunction(L, -1)) return luaL_error(L, "worker '%s': tick must be a function", name);
  if (rt->stopping) return luaL_error(L, "the runtime is shutting down");

  qtg_worker *w = calloc(1, sizeof *w);
  if (!w) return luaL_error(L, "out of memory");
  w->timer = malloc(sizeof *w->timer);
  if (!w->timer || uv_timer_init(h->loop, w->timer) != 0) {
    free(w->timer);
    free(w);
    return luaL_error(L, "cannot create a timer");
  }
  w->timer->data = w;
  w->rt = rt;
  snprintf(w->name, sizeof w->name, "%s", name);
  w->core = strcmp(group, "core") == 0;
  w->interval = interval;
  w->jitter = jitter;
  w->sleep_scale = scale > 0 ? scale : 1;
  w->drain = drain;
  lua_pushvalue(L, -1);
  w->tick_ref = qtg_ref(L);
  w->next = rt->workers;
  rt->workers = w;
  qtg_worker_arm(w, first);
  return 0;
}

static int qtg_lua_stop_worker(lua_State *L) {
  qtg_worker *w = qtg_worker_check(L, 1);
  if (w->state == QTG_W_RUNNING) {
    w->stop_requested = 1; /* removed when its tick ends */
  } else {
    uv_timer_stop(w->timer);
    qtg_worker_free(w);
  }
  return 0;
}

static int qtg_lua_set_tick(lua_State *L) {
  qtg_worker *w = qtg_worker_check(L, 1);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_pushvalue(L, 2);
  int ref = qtg_ref(L);
  qtg_unref(L, w->tick_ref);
  w->tick_ref = ref; /* a running tick keeps the function it started with */
  return 0;
}

static int qtg_lua_set_interval(lua_State *L) {
  qtg_worker *w = qtg_worker_check(L, 1);
  double interval = luaL_checknumber(L, 2);
  double jitter = luaL_optnumber(L, 3, w->jitter);
  /* the bounds start_worker holds them to: each becomes a timer's ms */
  if (!(interval > 0 && interval <= QTG_WORKER_MAX_SECONDS) || !(jitter >= 0 && jitter <= QTG_WORKER_MAX_SECONDS))
    return luaL_error(L, "interval must be > 0 and jitter >= 0, each at most %d seconds", QTG_WORKER_MAX_SECONDS);
  w->interval = interval;
  w->jitter = jitter;
  return 0;
}

static int qtg_lua_pause(lua_State *L) {
  qtg_worker *w = qtg_worker_check(L, 1);
  w->paused = 1;
  if (w->state == QTG_W_SLEEPING) {
    uv_timer_stop(w->timer);
    w->state = QTG_W_PAUSED;
  }
  return 0;
}

static int qtg_lua_resume(lua_State *L) {
  qtg_worker *w = qtg_worker_check(L, 1);
  w->paused = 0;
  if (w->state == QTG_W_PAUSED && !w->rt->stopping) qtg_worker_arm(w, 0);
  return 0;
}

/* wake(name): run now if sleeping; if running, run again right after. */
static int qtg_lua_wake(lua_State *L) {
  qtg_worker *w = qtg_worker_find(qtg_rt(L), luaL_checkstring(L, 1));
  if (!w) return 0; /* waking an absent worker is harmless (NOTIFY for a disabled worker) */
  if (w->state == QTG_W_SLEEPING) qtg_worker_arm(w, 0);
  else if (w->state == QTG_W_RUNNING) w->wake_pending = 1;
  lua_pushboolean(L, 1);
  return 1;
}

/* tick_now(name): one pass now, even if paused. */
static int qtg_lua_tick_now(lua_State *L) {
  qtg_worker *w = qtg_worker_check(L, 1);
  if (w->state == QTG_W_RUNNING) w->wake_pending = 1;
  else if (w->state == QTG_W_SLEEPING || w->state == QTG_W_PAUSED) qtg_worker_arm(w, 0);
  else return luaL_error(L, "worker '%s' is %s", w->name, qtg_worker_state_names[w->state]);
  return 0;
}

static void qtg_set_num(lua_State *L, const char *k, double v) {
  lua_pushnumber(L, v);
  lua_setfield(L, -2, k);
}

static int qtg_lua_workers(lua_State *L) {
  struct qtg_runtime *rt = qtg_rt(L);
  int n = 0;
  lua_newtable(L);
  for (qtg_worker *w = rt->workers; w; w = w->next) {
    if (w->stop_requested) continue;
    lua_newtable(L);
    lua_pushstring(L, w->name);
    lua_setfield(L, -2, "name");
    lua_pushstring(L, w->core ? "core" : "sidecar");
    lua_setfield(L, -2, "group");
    lua_pushstring(L, qtg_worker_state_names[w->state]);
    lua_setfield(L, -2, "state");
    qtg_set_num(L, "interval", w->interval);
    qtg_set_num(L, "jitter", w->jitter);
    qtg_set_num(L, "ticks", w->ticks);
    qtg_set_num(L, "last_count", w->last_count);
    qtg_set_num(L, "items_total", w->items_total);
    qtg_set_num(L, "errors_total", w->errors_total);
    qtg_set_num(L, "consecutive_errors", w->consecutive_errors);
    qtg_set_num(L, "last_delay", w->last_delay);
    if (w->last_tick_at > 0) qtg_set_num(L, "last_tick_at", w->last_tick_at);
    if (w->state == QTG_W_SLEEPING) qtg_set_num(L, "next_run_at", w->next_run_at);
    lua_pushboolean(L, w->paused);
    lua_setfield(L, -2, "paused");
    if (w->last_error[0]) {
      lua_pushstring(L, w->last_error);
      lua_setfield(L, -2, "last_error");
    }
    lua_createtable(L, w->ndelays, 0);
    for (int i = 0; i < w->ndelays; i++) {
      lua_pushnumber(L, w->delays[i]);
      lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "delays");
    /* pass_seconds = {le = {bounds}, buckets = {cumulative}, sum =, count =} */
    lua_createtable(L, 0, 4);
    lua_createtable(L, (int)QTG_PASS_BUCKETS, 0);
    for (size_t i = 0; i < QTG_PASS_BUCKETS; i++) {
      lua_pushnumber(L, qtg_pass_buckets[i]);
      lua_rawseti(L, -2, (int)i + 1);
    }
    lua_setfield(L, -2, "le");
    lua_createtable(L, (int)QTG_PASS_BUCKETS, 0);
    for (size_t i = 0; i < QTG_PASS_BUCKETS; i++) {
      lua_pushnumber(L, w->pass_buckets[i]);
      lua_rawseti(L, -2, (int)i + 1);
    }
    lua_setfield(L, -2, "buckets");
    qtg_set_num(L, "sum", w->pass_sum);
    qtg_set_num(L, "count", w->pass_count);
    lua_setfield(L, -2, "pass_seconds");
    lua_rawseti(L, -2, ++n);
  }
  return 1;
}

static int qtg_lua_shutdown(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  qtg_runtime_shutdown(h, (int)luaL_optinteger(L, 1, 0), luaL_optstring(L, 2, "requested"));
  return 0;
}

static int qtg_lua_delay_for(lua_State *L) {
  lua_pushnumber(L, qtg_runloop_delay((int)luaL_checkinteger(L, 1), luaL_checknumber(L, 2),
                                      luaL_optnumber(L, 3, 0), luaL_optnumber(L, 4, 0)));
  return 1;
}

static int qtg_lua_stopping(lua_State *L) {
  lua_pushboolean(L, qtg_rt(L)->stopping);
  return 1;
}

int luaopen_qtg_runtime(lua_State *L) {
  static const luaL_Reg funcs[] = {
    {"start_worker", qtg_lua_start_worker}, {"stop_worker", qtg_lua_stop_worker},
    {"set_tick", qtg_lua_set_tick},         {"set_interval", qtg_lua_set_interval},
    {"pause", qtg_lua_pause},               {"resume", qtg_lua_resume},
    {"wake", qtg_lua_wake},                 {"tick_now", qtg_lua_tick_now},
    {"workers", qtg_lua_workers},           {"shutdown", qtg_lua_shutdown},
    {"delay_for", qtg_lua_delay_for},       {"stopping", qtg_lua_stopping},
    {NULL, NULL},
  };
  lua_newtable(L);
  luaL_register(L, NULL, funcs);
  return 1;
}

/* The trampoline needs `qtg` loaded, so it is compiled on first use. */
static int qtg_runtime_trampoline_load(qtg_host *h) {
  struct qtg_runtime *rt = h->runtime;
  if (rt->trampoline_ref != LUA_NOREF) return 0;
  if (qtg_prelude_load(h->L, QTG_PRELUDE_run_loop) != 0 ||
      lua_pcall(h->L, 0, 1, 0) != 0) {
    qtg_log_error("run_loop trampoline: %s", lua_tostring(h->L, -1));
    lua_pop(h->L, 1);
    return -1;
  }
  rt->trampoline_ref = qtg_ref(h->L);
  return 0;
}

int qtg_runtime_open(qtg_host *h, char *err, size_t errlen) {
  struct qtg_runtime *rt = calloc(1, sizeof *rt);
  if (!rt) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  rt->h = h;
  rt->trampoline_ref = LUA_NOREF;
  rt->rng = uv_hrtime() ^ ((uint64_t)getpid() << 32) ^ 0x9E3779B97F4A7C15ULL;
  if (rt->rng == 0) rt->rng = 1;
  h->runtime = rt;
  return 0;
}

/* Called by lua_core once `qtg` is registered. */
int qtg_runtime_ready(qtg_host *h) { return qtg_runtime_trampoline_load(h); }

void qtg_runtime_close(qtg_host *h) {
  struct qtg_runtime *rt = h->runtime;
  if (!rt) return;
  while (rt->workers) qtg_worker_free(rt->workers);
  if (rt->grace) uv_close((uv_handle_t *)rt->grace, qtg_timer_closed);
  if (h->L) qtg_unref(h->L, rt->trampoline_ref);
  free(rt);
  h->runtime = NULL;
}
