/* qtg_busy.c -- the busy guard: a task that holds the loop is stopped.
 *
 * Lua that never yields (a worker's tick, an API handler, a policy module
 * loading at a reload or at `qtgd check`) holds the one loop thread: no
 * I/O completes, no timer fires, SIGTERM is never seen, and the database
 * locks its transaction took stay taken.  The console guards its own
 * commands with a count hook (qtg_console_session.c); every other task runs
 * with no hook, at no cost, and this guard watches them from a thread:
 *
 *   - the scheduler marks when the outermost resume of a task starts and
 *     ends (qtg_busy_enter/leave: a clock read and relaxed atomic stores);
 *   - when one has lasted MG_TASK_BUSY_LIMIT_SECONDS, the thread sends the
 *     loop thread QTG_BUSY_SIGNAL, whose handler installs a count hook:
 *     lua_sethook may be called from a signal handler (PUC Lua's lua.c and
 *     LuaJIT's luajit.c stop a script on Ctrl-C so), and the compiler is
 *     off in qtgd (qtg_host.c), so the next Lua instruction calls it;
 *   - the hook logs the task and raises "busy" at every instruction of the
 *     coroutine running until it has ended (a pcall catches one raise; the
 *     instruction after it raises again), then puts back the hook it
 *     replaced; a strike half a limit later, if the resume still runs,
 *     does the same to the whole task (qtg_busy_pick);
 *   - a resume that lasts 2.5 limits is stuck where no Lua instruction
 *     runs (a C call that never returns, a pattern match that backtracks
 *     for ever): the thread writes why to stderr and aborts, so the
 *     service manager restarts the process, and the server ends its
 *     sessions and lets go of their locks.
 *
 * A console command's tasks (an owner) are left to the console's guard,
 * which is a count hook as well: console code can take it off
 * (debug.sethook()) or run where LuaJIT keeps hooks off (a __gc
 * finalizer), and then nothing else stops it, SIGTERM included (that stop
 * is the same hook).  So the abort applies to them too, at 2.5 times
 * MG_CONSOLE_BUSY_LIMIT_SECONDS, with no strike of this guard's before it.
 *
 * Process-wide by nature: a signal handler reaches its host through one
 * static pointer, so a process has one guard (a second start is refused). */
#include "qtg_busy.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "qtg_log.h"

/* Ignored by default, and nothing else in qtgd uses it. */
#define QTG_BUSY_SIGNAL SIGURG
/* A resume still holding the loop this many limits after it started is
 * aborted: the strikes at 1, 1.5 and 2 limits did not end it. */
#define QTG_BUSY_ABORT_AT 2.5

struct qtg_busy {
  qtg_host *h;
  uint64_t limit_ns;
  uint64_t console_abort_ns;      /* a console command's resume aborts the process here; 0: never */
  double limit_s;
  pthread_t loop_thread;
  uv_thread_t thread;
  uv_mutex_t lock;
  uv_cond_t cond;
  int stop;                       /* under lock */
  /* written by the loop thread, read by the guard's */
  _Atomic uint64_t since;         /* uv_hrtime() at the outermost resume's start; 0: none */
  _Atomic uint64_t generation;    /* counts outermost resumes */
  _Atomic int console;            /* that resume runs a console command's task */
  _Atomic(const char *) name;     /* its task's name, for the abort's line */
  _Atomic int hooked;             /* a strike's hook is installed */
  /* written by the guard's thread */
  _Atomic uint64_t fire;          /* the generation to strike */
  /* the loop thread's own (the handler and the hook run there) */
  int depth;                      /* nested resumes */
  int strikes;                    /* strikes in this outermost resume */
  uint64_t armed;                 /* the generation the hook was installed for */
  lua_State *target;              /* the coroutine it stops, once found ... */
  int target_ref;                 /* ... anchored here; LUA_NOREF: the whole task */
  qtg_task *target_task;          /* the task it runs in */
  qtg_task *stopped;              /* the last task stopped whole, until it ends */
  uint64_t target_since;          /* the struck resume's start (uv_hrtime()) */
  uint64_t stopped_since;         /* ... of the resume in which stopped was stopped */
  char where[256];                /* where the strike found it: "file:line" */
  lua_Hook saved_hook;            /* what the hook replaced */
  int saved_mask, saved_count;
};

static struct qtg_busy *qtg_busy_instance;

/* The strike is over (its coroutine or task ended, or there was nothing to
 * strike): the hook it replaced goes back. */
static void qtg_busy_unhook(struct qtg_busy *b) {
  if (!atomic_load_explicit(&b->hooked, memory_order_relaxed)) return;
  lua_State *L = b->h->L;
  if (b->target_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, b->target_ref);
  else if (b->target_task) {
    b->stopped = b->target_task;
    b->stopped_since = b->target_since;
  }
  b->target_ref = LUA_NOREF;
  b->target = NULL;
  b->target_task = NULL;
  lua_sethook(L, b->saved_hook, b->saved_mask, b->saved_count);
  atomic_store_explicit(&b->hooked, 0, memory_order_relaxed);
}

/* The first instruction after the signal: pick what to stop.  The first
 * strike stops the coroutine running now, so that the code that resumed
 * it (a reload putting the old modules back, a tick's clean-up) runs; a
 * later strike in the same resume stops the whole task. */
static int qtg_busy_pick(struct qtg_busy *b, lua_State *L, lua_Debug *ar) {
  qtg_host *h = b->h;
  if (atomic_load_explicit(&b->generation, memory_order_relaxed) != b->armed || !h->current ||
      qtg_task_owner(h->current) != 0)
    return 0;
  b->target_task = h->current;
  if (b->strikes == 1 && L != qtg_task_thread(h->current)) {
    lua_pushthread(L);
    b->target_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    b->target = L;
  } else {
    b->target = qtg_task_thread(h->current); /* the task anchors it until it ends */
  }
  char held[32], limit[32];
  char *where = b->where;
  snprintf(where, sizeof b->where, "?");
  uint64_t since = atomic_load_explicit(&b->since, memory_order_relaxed);
  b->target_since = since;
  snprintf(held, sizeof held, "%.1f", since ? (double)(uv_hrtime() - since) / 1e9 : 0.0);
  snprintf(limit, sizeof limit, "%g", b->limit_s);
  if (lua_getinfo(L, "Sl", ar)) snprintf(where, sizeof b->where, "%s:%d", ar->short_src, ar->currentline);
  const char *fields[] = {"task", qtg_task_name(h->current), "where", where, "held_seconds", held,
                          "limit_seconds", limit, "stopping", b->target == L && b->target_ref != LUA_NOREF
                          ? "the coroutine running" : "the task", NULL};
  qtg_log_fields(QTG_LOG_ERROR, "a task held the loop past MG_TASK_BUSY_LIMIT_SECONDS: stopping it", fields);
  return 1;
}

static void qtg_busy_hook(lua_State *L, lua_Debug *ar) {
  struct qtg_busy *b = qtg_busy_instance;
  if (!b) return;
  if (!b->target && !qtg_busy_pick(b, L, ar)) {
    qtg_busy_unhook(b);
    return;
  }
  int strike = b->target_ref != LUA_NOREF ? L == b->target : b->h->current == b->target_task;
  if (strike)
    qtg_raise(L, "busy", "%s: held the loop longer than MG_TASK_BUSY_LIMIT_SECONDS (%g s): stopped", b->where,
              b->limit_s);
  /* Another coroutine runs: the one that resumed the target coroutine,
   * once the target died of the error.  A task ends with its task
   * (qtg_busy_task_ended). */
  if (b->target_ref != LUA_NOREF && lua_status(b->target) > LUA_YIELD) qtg_busy_unhook(b);
}

static void qtg_busy_on_signal(int signum) {
  (void)signum;
  struct qtg_busy *b = qtg_busy_instance;
  if (!b || !b->h->L || atomic_load_explicit(&b->hooked, memory_order_relaxed)) return;
  uint64_t fire = atomic_load_explicit(&b->fire, memory_order_relaxed);
  if (fire == 0 || fire != atomic_load_explicit(&b->generation, memory_order_relaxed) ||
      atomic_load_explicit(&b->since, memory_order_relaxed) == 0)
    return;
  lua_State *L = b->h->L;
  b->saved_hook = lua_gethook(L);
  b->saved_mask = lua_gethookmask(L);
  b->saved_count = lua_gethookcount(L);
  b->armed = fire;
  b->target = NULL;
  b->target_task = NULL;
  b->target_ref = LUA_NOREF;
  b->strikes++;
  atomic_store_explicit(&b->hooked, 1, memory_order_relaxed);
  lua_sethook(L, qtg_busy_hook, LUA_MASKCOUNT, 1);
}

/* One JSON log line from the guard's thread (qtg_log is the loop's). */
static void qtg_busy_write(const char *msg, const char *task) {
  char line[512], when[40] = "";
  struct timespec ts = {0, 0};
  struct tm tm;
  if (clock_gettime(CLOCK_REALTIME, &ts) == 0 && gmtime_r(&ts.tv_sec, &tm))
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
  int n = snprintf(line, sizeof line, "{\"time\":\"%s.%06ldZ\",\"level\":\"error\",\"msg\":\"%s\"%s%s%s}\n",
                   when, (long)(ts.tv_nsec / 1000), msg, task ? ",\"task\":\"" : "", task ? task : "",
                   task ? "\"" : "");
  if (n <= 0) return;
  ssize_t w = write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
  (void)w; /* nothing more to do when stderr is gone */
}

/* A resume has held the loop QTG_BUSY_ABORT_AT limits, strikes or not: no
 * Lua instruction runs (a C call that does not return) or the code keeps
 * starting new coroutines.  Its task's name is read while that resume
 * still runs (since unchanged), so the task is still there. */
static void qtg_busy_abort(struct qtg_busy *b, uint64_t since, uint64_t held_ns, int console) {
  char task[64] = "", msg[200];
  const char *name = atomic_load_explicit(&b->name, memory_order_relaxed);
  if (name) {
    size_t i = 0;
    for (; i < sizeof task - 1 && name[i]; i++)
      task[i] = (name[i] == '"' || name[i] == '\\' || (unsigned char)name[i] < 0x20) ? '?' : name[i];
    task[i] = '\0';
  }
  if (atomic_load_explicit(&b->since, memory_order_relaxed) != since) return; /* it ended after all */
  if (console)
    snprintf(msg, sizeof msg, "a console command has held the loop %.1f s, %.1f times "
             "MG_CONSOLE_BUSY_LIMIT_SECONDS, and its guard could not stop it (its hook taken off, a finalizer, "
             "a C call that does not return?): aborting", (double)held_ns / 1e9, QTG_BUSY_ABORT_AT);
  else
    snprintf(msg, sizeof msg, "a task has held the loop %.1f s, %.1f times MG_TASK_BUSY_LIMIT_SECONDS, "
             "and could not be stopped (a C call that does not return?): aborting", (double)held_ns / 1e9,
             QTG_BUSY_ABORT_AT);
  qtg_busy_write(msg, name ? task : NULL);
  abort();
}

/* A wake of the guard's thread this much later than its tick means the
 * whole process did not run meanwhile. */
#define QTG_BUSY_FROZEN_NS 1000000000ull

/* The guard's thread: a strike when a resume has held the loop the limit,
 * another every half limit while it still does (the hook of the last one
 * gone), and the abort at QTG_BUSY_ABORT_AT limits.
 *
 * Time the process was frozen (SIGSTOP, a cgroup freezer, `docker pause`,
 * a paused VM) is not time the loop was held: every thread stood still,
 * and the monotonic clock ran on.  This thread wakes every tick, so a wake
 * QTG_BUSY_FROZEN_NS or more past its tick is such a freeze, and its
 * length is taken off the resume's time.  Without it a freeze of a limit
 * stopped the healthy task that happened to run (a reload, a callback
 * lane: sent again) and one of 2.5 limits aborted the process (a review,
 * session 43).  A C call that blocks still counts: this thread wakes on
 * time through it. */
static void qtg_busy_watch(void *arg) {
  struct qtg_busy *b = arg;
  uint64_t tick = b->limit_ns / 10, last_strike = 0;
  if (tick > 250000000ull) tick = 250000000ull;
  if (tick < 10000000ull) tick = 10000000ull;
  uint64_t abort_ns = (uint64_t)((double)b->limit_ns * QTG_BUSY_ABORT_AT);
  uint64_t last_wake = uv_hrtime(), frozen = 0, frozen_gen = 0;
  uv_mutex_lock(&b->lock);
  while (!b->stop) {
    (void)uv_cond_timedwait(&b->cond, &b->lock, tick); /* a timeout is the usual wake */
    if (b->stop) break;
    uint64_t now = uv_hrtime();
    uint64_t gap = now > last_wake ? now - last_wake : 0;
    last_wake = now;
    uint64_t gen = atomic_load_explicit(&b->generation, memory_order_relaxed);
    uint64_t since = atomic_load_explicit(&b->since, memory_order_relaxed);
    int console = atomic_load_explicit(&b->console, memory_order_relaxed);
    if (gen != atomic_load_explicit(&b->generation, memory_order_relaxed)) continue; /* changed under us */
    if (gen != frozen_gen) frozen = 0, frozen_gen = gen;
    if (gap >= tick + QTG_BUSY_FROZEN_NS) frozen += gap - tick;
    if (since == 0) continue;
    uint64_t held = now > since ? now - since : 0;
    held = held > frozen ? held - frozen : 0;
    if (console) {
      if (b->console_abort_ns && held >= b->console_abort_ns) qtg_busy_abort(b, since, held, 1);
    } else if (held >= abort_ns) {
      qtg_busy_abort(b, since, held, 0);
    } else if (held >= b->limit_ns && !atomic_load_explicit(&b->hooked, memory_order_relaxed) &&
               (last_strike < since || now - last_strike >= b->limit_ns / 2)) {
      last_strike = now;
      atomic_store_explicit(&b->fire, gen, memory_order_relaxed);
      if (pthread_kill(b->loop_thread, QTG_BUSY_SIGNAL) != 0) qtg_busy_write("busy guard: pthread_kill failed", NULL);
    }
  }
  uv_mutex_unlock(&b->lock);
}

int qtg_busy_start(qtg_host *h, double limit_seconds, double console_limit_seconds, char *err, size_t errlen) {
  h->busy = NULL;
  if (limit_seconds <= 0) return 0; /* 0: off */
  if (qtg_busy_instance) {
    snprintf(err, errlen, "busy guard: one per process");
    return -1;
  }
  struct qtg_busy *b = calloc(1, sizeof *b);
  if (!b) {
    snprintf(err, errlen, "busy guard: out of memory");
    return -1;
  }
  b->h = h;
  b->target_ref = LUA_NOREF;
  b->limit_s = limit_seconds;
  b->limit_ns = (uint64_t)(limit_seconds * 1e9);
  if (console_limit_seconds > 0)
    b->console_abort_ns = (uint64_t)(console_limit_seconds * 1e9 * QTG_BUSY_ABORT_AT);
  b->loop_thread = pthread_self();
  if (uv_mutex_init(&b->lock) != 0) {
    free(b);
    snprintf(err, errlen, "busy guard: cannot create its lock");
    return -1;
  }
  if (uv_cond_init(&b->cond) != 0) {
    uv_mutex_destroy(&b->lock);
    free(b);
    snprintf(err, errlen, "busy guard: cannot create its condition");
    return -1;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = qtg_busy_on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  qtg_busy_instance = b;
  if (sigaction(QTG_BUSY_SIGNAL, &sa, NULL) != 0) {
    snprintf(err, errlen, "busy guard: sigaction: %s", strerror(errno));
    qtg_busy_instance = NULL;
    uv_cond_destroy(&b->cond);
    uv_mutex_destroy(&b->lock);
    free(b);
    return -1;
  }
  int rc = uv_thread_create(&b->thread, qtg_busy_watch, b);
  if (rc != 0) {
    snprintf(err, errlen, "busy guard: cannot start its thread: %s", uv_strerror(rc));
    signal(QTG_BUSY_SIGNAL, SIG_IGN);
    qtg_busy_instance = NULL;
    uv_cond_destroy(&b->cond);
    uv_mutex_destroy(&b->lock);
    free(b);
    return -1;
  }
  h->busy = b;
  return 0;
}

void qtg_busy_stop(qtg_host *h) {
  struct qtg_busy *b = h->busy;
  if (!b) return;
  uv_mutex_lock(&b->lock);
  b->stop = 1;
  uv_cond_signal(&b->cond);
  uv_mutex_unlock(&b->lock);
  (void)uv_thread_join(&b->thread); /* it ends at its next wake, which stop makes now */
  signal(QTG_BUSY_SIGNAL, SIG_IGN);
  if (h->L) qtg_busy_unhook(b);
  qtg_busy_instance = NULL;
  uv_cond_destroy(&b->cond);
  uv_mutex_destroy(&b->lock);
  free(b);
  h->busy = NULL;
}

/* Whose code runs now: the task a resume runs, also when it is nested in
 * another task's resume (a task spawned and run at once): a console
 * command's task is left to the console's guard, an unowned one it
 * spawned is this guard's (qtg.spawn_unowned). */
static void qtg_busy_running(struct qtg_busy *b, qtg_task *t) {
  atomic_store_explicit(&b->console, qtg_task_owner(t) != 0, memory_order_relaxed);
  atomic_store_explicit(&b->name, qtg_task_name(t), memory_order_relaxed);
}

void qtg_busy_enter(struct qtg_busy *b, qtg_task *t) {
  if (!b) return;
  qtg_busy_running(b, t);
  if (b->depth++ > 0) return;
  b->strikes = 0;
  atomic_store_explicit(&b->generation, atomic_load_explicit(&b->generation, memory_order_relaxed) + 1,
                        memory_order_relaxed);
  atomic_store_explicit(&b->since, uv_hrtime(), memory_order_relaxed);
}

void qtg_busy_leave(struct qtg_busy *b) {
  if (!b) return;
  if (--b->depth > 0) {
    /* back in the task that resumed this one (qtg_task_run restores
     * h->current first) */
    if (b->h->current) qtg_busy_running(b, b->h->current);
    return;
  }
  atomic_store_explicit(&b->since, 0, memory_order_relaxed);
  qtg_busy_unhook(b); /* a strike whose hook never ran: the resume ended first */
}

int qtg_busy_task_ended(struct qtg_busy *b, qtg_task *t, uint64_t *resume_since) {
  *resume_since = 0;
  if (!b) return 0;
  if (atomic_load_explicit(&b->hooked, memory_order_relaxed) && b->target_task == t) qtg_busy_unhook(b);
  if (b->stopped != t) return 0;
  b->stopped = NULL;
  *resume_since = b->stopped_since;
  return 1;
}
