/* qtg_host.h -- the host: one libuv loop, one LuaJIT state, and the scheduler
 * of Lua coroutines ("tasks") that every piece of policy code runs in.
 *
 * Why: qtg's C parts own I/O, Lua owns policy.  Any Lua code that may do I/O
 * runs inside a task.  A C binding that starts I/O calls qtg_task_current(),
 * starts the operation with a completion callback, and returns
 * qtg_task_yield(L).  The completion pushes its results onto the task's
 * thread (qtg_task_thread) and calls qtg_task_resume(task, nresults).
 * Exactly one completion resumes a waiting task.
 *
 * Rules every binding follows (libuv style):
 *   - a binding that fails before starting I/O raises (luaL_error) and does
 *     not yield; once it yields, its completion is called exactly once;
 *   - operational failures come back as values (nil, err) or as a raised
 *     structured error, as the binding documents;
 *   - registry references go through qtg_ref/qtg_unref so leaks are counted.
 */
#ifndef QTG_HOST_H
#define QTG_HOST_H

#include <stdarg.h>
#include <stdint.h>
#include <uv.h>
#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

#include "qtg_settings.h"

typedef struct qtg_host qtg_host;
typedef struct qtg_task qtg_task;
struct qtg_pg_pool;
struct qtg_pg_listener;
struct qtg_http;
struct qtg_runtime;
struct qtg_keys;
struct qtg_console;
struct qtg_api;
struct qtg_watchdog;
struct qtg_busy;
struct qtg_resolve_req;

/* Called once when a task ends.  ok=1: the task's function returned; its
 * results are on qtg_task_thread(t)'s stack (nres of them).  ok=0: it raised;
 * the error value is on top of that stack and has already been logged with a
 * traceback unless the task was created with QTG_TASK_QUIET. */
typedef void (*qtg_task_done_cb)(qtg_task *t, int ok, int nres, void *data);

enum {
  QTG_TASK_QUIET = 1,
  /* owner 0 whatever task spawns it: no console command's stop reaches it
   * (the busy guard and SIGTERM still do); qtg.spawn_unowned */
  QTG_TASK_UNOWNED = 2
};
enum { QTG_CLOSE_BEFORE_LUA = 0, QTG_CLOSE_AFTER_LUA = 1 };

struct qtg_host {
  uv_loop_t *loop;
  lua_State *L;
  qtg_settings *settings;
  struct qtg_pg_pool *pool;     /* the session pool (MG_DB_POOL_SIZE) */
  struct qtg_pg_listener *listener; /* LISTEN connection, opened on first use */
  int listen_ref;               /* table channel -> Lua handler */
  struct qtg_http *http;        /* libcurl multi on this loop */
  struct qtg_runtime *runtime;  /* workers and their supervisor */
  struct qtg_keys *keys;        /* secrets loaded by C; never reach Lua */
  struct qtg_signer_client *signer; /* client of `qtgd signer` (lua_signer.c) */
  struct qtg_console *console;  /* console server, when enabled */
  struct qtg_api *api;          /* HTTP API server (src/qtg_api.c) */
  struct qtg_watchdog *watchdog; /* systemd watchdog pings (qtg_notify.c) */
  struct qtg_busy *busy;        /* stops a task that holds the loop (qtg_busy.c) */
  uint64_t busy_collecting;     /* collecting what a task the busy guard stopped held: its serial; 0: not */
  uint64_t busy_resume_since;   /* ... and when the resume it was stopped in began (uv_hrtime()) */
  uint64_t task_serials;        /* the last task's serial (qtg_task_serial) */
  qtg_task *current;            /* task whose code is running now */
  qtg_task *tasks;              /* every live task (freed at close) */
  qtg_task *ready;              /* woken inside a task's end, run after it */
  lua_Hook saved_hook;          /* hook in place before an interrupt's */
  int saved_hook_mask, saved_hook_count;
  void *sleeps;                 /* pending qtg.sleep timers (lua_core.c) */
  void *db_sessions;            /* Lua sessions holding a connection (lua_db.c) */
  struct qtg_resolve_req *resolves; /* name lookups a task waits on
                                 * (lua_api_net.c; dropped at close) */
  int opened;                   /* subsystems opened so far */
  int stopping;                 /* qtg_host_stop was called */
  int closing;                  /* lua_close runs: no task runs again */
  int live_refs;                /* registry refs taken through qtg_ref */
  int live_tasks;               /* tasks started and not yet finished */
  int exit_code;                /* what qtgd exits with */
  const char *root_dir;         /* where lua/, sql/, templates/ live */
  uv_signal_t sigterm, sigint, sighup;
  int signals_armed;
};

/* Lifecycle. qtg_host_init creates the loop and the Lua state and opens the
 * `qtg` module; qtg_host_close frees everything it created. */
int qtg_host_init(qtg_host *h, qtg_settings *s, const char *root_dir);
void qtg_host_close(qtg_host *h);
qtg_host *qtg_host_from_lua(lua_State *L);

/* Counted registry references: value on top of L is popped and referenced. */
int qtg_ref(lua_State *L);
void qtg_unref(lua_State *L, int ref);

/* Start a task.  Stack of h->L on entry: [..., fn, arg1..argn]; all are
 * consumed.  The task runs at once until its first yield.  Returns NULL (and
 * logs) only when memory runs out.  `name` is used in logs. */
qtg_task *qtg_task_spawn(qtg_host *h, const char *name, int nargs, int flags,
                         qtg_task_done_cb done, void *data);

/* The task whose code is executing on L; raises a Lua error when L is not a
 * task's own thread (e.g. I/O inside a user coroutine, or in module load). */
qtg_task *qtg_task_check(lua_State *L);
lua_State *qtg_task_thread(qtg_task *t);
const char *qtg_task_name(qtg_task *t);
/* Yield the current task waiting for I/O: `return qtg_task_yield(L);` */
int qtg_task_yield(lua_State *L);
/* Resume a waiting task with nres values already pushed on its thread. */
void qtg_task_resume(qtg_task *t, int nres);
/* From inside a task's done callback: resume t once the ending task is
 * freed (used by join). */
void qtg_task_resume_later(qtg_task *t, int nres);
/* Ask a running task to stop: at its next instruction count check (or when
 * it is resumed) it raises "interrupted".  Used by the console. */
void qtg_task_interrupt(qtg_task *t);
/* While a task waits, a binding may register how to abandon the wait: on
 * interrupt the host calls cancel(t, arg), which must stop the I/O and
 * resume the task (typically with an "interrupted" error).  Cleared by the
 * binding (qtg_task_set_cancel(t, NULL, NULL)) before it resumes normally. */
void qtg_task_set_cancel(qtg_task *t, void (*cancel)(qtg_task *, void *), void *arg);
int qtg_task_waiting(qtg_task *t);
/* A task's owner: a number a subsystem tags its tasks with (0: none).  A
 * task inherits the owner of the task running when it is spawned, so what
 * a console command spawns and runs at once is still that command's. */
void qtg_task_set_owner(qtg_task *t, uint64_t owner);
uint64_t qtg_task_owner(qtg_task *t);
uint64_t qtg_task_serial(qtg_task *t);   /* its number in its host, from 1 */

/* SIGTERM/SIGINT seen by the process (0: none yet), noted by the signal
 * handler itself, before the loop turns: code that holds the loop (the
 * console's guard) polls it to give the loop back to the shutdown. */
void qtg_host_note_stop_signal(int signum);
int qtg_host_stop_signal(void);

/* Run the loop until qtg_host_stop or until nothing is left. */
int qtg_host_run(qtg_host *h);
void qtg_host_stop(qtg_host *h, int exit_code);

/* Push a structured error table {kind=, message=, ...} and raise it. */
int qtg_raise(lua_State *L, const char *kind, const char *fmt, ...);
/* Push a structured error table without raising. */
void qtg_push_error(lua_State *L, const char *kind, const char *fmt, ...);
void qtg_push_error_v(lua_State *L, const char *kind, const char *fmt, va_list ap);
/* qtg.error(kind, message[, fields]): the same table, built from Lua. */
int qtg_lua_error_new(lua_State *L);

#endif
