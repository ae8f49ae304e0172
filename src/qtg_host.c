/* qtg_host.c -- the host: loop, Lua state, subsystems, and the task
 * scheduler (see qtg_host.h for the contract bindings follow).
 *
 * A task is a Lua thread anchored in the registry plus a small C struct.
 * It runs until it yields inside a binding (waiting for I/O) or ends.
 * Nested resumes are fine (a task may spawn another that runs at once), so
 * h->current is saved and restored around every resume. */
#include "qtg_host.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <luajit.h>

#include "qtg_busy.h"
#include "qtg_log.h"
#include "qtg_lua_path.h"
#include "qtg_modules_decl.h"

struct qtg_task {
  qtg_host *h;
  lua_State *co;
  int co_ref;
  int flags;
  int waiting;
  int interrupted;
  qtg_task_done_cb done;
  void *data;
  void (*cancel)(qtg_task *, void *);
  void *cancel_arg;
  qtg_task *prev, *next; /* live tasks, so close can free the stragglers */
  qtg_task *ready_next;  /* queued by qtg_task_resume_later */
  int ready_nres;
  uint64_t owner;        /* qtg_task_set_owner; inherited at spawn */
  uint64_t serial;       /* this task's number in its host, from 1 */
  char name[64];
};

static const char qtg_host_key = 'h';

qtg_host *qtg_host_from_lua(lua_State *L) {
  lua_pushlightuserdata(L, (void *)&qtg_host_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  qtg_host *h = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return h;
}

int qtg_ref(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  int ref = luaL_ref(L, LUA_REGISTRYINDEX);
  if (ref != LUA_NOREF && ref != LUA_REFNIL && h) h->live_refs++;
  return ref;
}

void qtg_unref(lua_State *L, int ref) {
  if (ref == LUA_NOREF || ref == LUA_REFNIL) return;
  qtg_host *h = qtg_host_from_lua(L);
  luaL_unref(L, LUA_REGISTRYINDEX, ref);
  if (h) h->live_refs--;
}

/* ---- structured errors ------------------------------------------------ */

/* "[where ]kind[ (method)]: message[ [code N]]": where names the component
 * (evm_rpc), method the operation, a numeric code the protocol's error code
 * (JSON-RPC); an error without them reads "kind: message". */
static int qtg_error_tostring(lua_State *L) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_getfield(L, 1, "where");
  if (lua_type(L, -1) == LUA_TSTRING) {
    luaL_addvalue(&b);
    luaL_addchar(&b, ' ');
  } else {
    lua_pop(L, 1);
  }
  lua_getfield(L, 1, "kind");
  luaL_addstring(&b, lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "error");
  lua_pop(L, 1);
  lua_getfield(L, 1, "method");
  if (lua_type(L, -1) == LUA_TSTRING) {
    luaL_addstring(&b, " (");
    luaL_addvalue(&b);
    luaL_addchar(&b, ')');
  } else {
    lua_pop(L, 1);
  }
  luaL_addstring(&b, ": ");
  lua_getfield(L, 1, "message");
  if (lua_type(L, -1) == LUA_TSTRING || lua_type(L, -1) == LUA_TNUMBER) {
    luaL_addvalue(&b);
  } else {
    lua_pop(L, 1);
    luaL_addchar(&b, '?');
  }
  lua_getfield(L, 1, "code");
  if (lua_type(L, -1) == LUA_TNUMBER) {
    lua_pushfstring(L, " [code %s]", lua_tostring(L, -1));
    lua_remove(L, -2);
    luaL_addvalue(&b);
  } else {
    lua_pop(L, 1);
  }
  luaL_pushresult(&b);
  return 1;
}

static void qtg_error_setmeta(lua_State *L) {
  if (luaL_newmetatable(L, "qtg.error")) {
    lua_pushcfunction(L, qtg_error_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_setmetatable(L, -2);
}

void qtg_push_error_v(lua_State *L, const char *kind, const char *fmt, va_list ap) {
  lua_createtable(L, 0, 3);
  lua_pushstring(L, kind);
  lua_setfield(L, -2, "kind");
  lua_pushvfstring(L, fmt, ap);
  lua_setfield(L, -2, "message");
  qtg_error_setmeta(L);
}

/* qtg.error(kind, message[, fields]) -> the same error table the host
 * raises: {kind=, message=, ...fields}, kind and message winning over a
 * field of the same name. */
int qtg_lua_error_new(lua_State *L) {
  luaL_checkstring(L, 1);
  luaL_checkstring(L, 2);
  if (!lua_isnoneornil(L, 3)) luaL_checktype(L, 3, LUA_TTABLE);
  lua_createtable(L, 0, 4);
  if (lua_istable(L, 3)) {
    lua_pushnil(L);
    while (lua_next(L, 3) != 0) {
      lua_pushvalue(L, -2);
      lua_insert(L, -2);
      lua_rawset(L, -4);
    }
  }
  lua_pushvalue(L, 1);
  lua_setfield(L, -2, "kind");
  lua_pushvalue(L, 2);
  lua_setfield(L, -2, "message");
  qtg_error_setmeta(L);
  return 1;
}

void qtg_push_error(lua_State *L, const char *kind, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  qtg_push_error_v(L, kind, fmt, ap);
  va_end(ap);
}

int qtg_raise(lua_State *L, const char *kind, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  qtg_push_error_v(L, kind, fmt, ap);
  va_end(ap);
  return lua_error(L);
}

/* ---- tasks --------------------------------------------------------------- */

lua_State *qtg_task_thread(qtg_task *t) { return t->co; }
const char *qtg_task_name(qtg_task *t) { return t->name; }

qtg_task *qtg_task_check(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  qtg_task *t = h ? h->current : NULL;
  if (!t || t->co != L)
    luaL_error(L, "qtg: I/O outside a host task (not in a worker tick, console command, "
                  "exec script or qtg.spawn'ed function; or inside a plain Lua coroutine)");
  /* Refused before the operation starts: started, it would complete into
   * a task whose yield failed and which has ended (freed) since. */
  if (!lua_isyieldable(L))
    luaL_error(L, "qtg: I/O where Lua cannot wait for it (while a module loads in require or "
                  "dofile, in a table.sort comparator, in a metamethod or iterator called from C): "
                  "do it in a function called afterwards");
  return t;
}

int qtg_task_yield(lua_State *L) {
  qtg_task *t = qtg_task_check(L);
  t->waiting = 1;
  return lua_yield(L, 0);
}

static void qtg_task_free(qtg_task *t) {
  qtg_host *h = t->h;
  if (t->prev) t->prev->next = t->next;
  if (t->next) t->next->prev = t->prev;
  if (h->tasks == t) h->tasks = t->next;
  h->live_tasks--;
  free(t);
}

/* Turn the error on top of co into "message\ntraceback" for the log. */
static void qtg_task_log_error(qtg_task *t) {
  lua_State *co = t->co;
  const char *msg = NULL;
  if (luaL_callmeta(co, -1, "__tostring")) {
    msg = lua_tostring(co, -1);
  } else {
    lua_pushvalue(co, -1);
    msg = lua_tostring(co, -1);
  }
  luaL_traceback(co, co, msg ? msg : "(error object is not a string)", 0);
  const char *fields[] = {"task", t->name, "error", lua_tostring(co, -1), NULL};
  qtg_log_fields(QTG_LOG_ERROR, "task failed", fields);
  lua_pop(co, 2);
}

static void qtg_task_run(qtg_task *t, int nargs);

static void qtg_task_finish(qtg_task *t, int ok, int nres) {
  qtg_host *h = t->h;
  uint64_t resume_since = 0, serial = t->serial;
  int stopped = qtg_busy_task_ended(h->busy, t, &resume_since);
  if (!ok && !(t->flags & QTG_TASK_QUIET)) qtg_task_log_error(t);
  if (t->done) t->done(t, ok, nres, t->data);
  qtg_unref(h->L, t->co_ref);
  qtg_task_free(t);
  /* A task the busy guard stopped skipped its own clean-up (a session's
   * release, a rollback): what it held is garbage now, collected at once so
   * that its __gc hands it back. */
  if (stopped) {
    h->busy_collecting = serial;   /* finalizers may ask: qtg.busy_collecting() */
    h->busy_resume_since = resume_since;
    lua_gc(h->L, LUA_GCCOLLECT, 0);
    h->busy_collecting = 0;
    h->busy_resume_since = 0;
  }
  /* Tasks woken by this one's end (joiners) run only now, so they see it
   * gone: no nested resume observes a half-finished task. */
  while (h->ready) {
    qtg_task *r = h->ready;
    h->ready = r->ready_next;
    r->ready_next = NULL;
    r->waiting = 0;
    r->cancel = NULL;
    qtg_task_run(r, r->ready_nres);
  }
}

void qtg_task_resume_later(qtg_task *t, int nres) {
  qtg_host *h = t->h;
  t->ready_nres = nres;
  t->ready_next = NULL;
  qtg_task **pp = &h->ready;
  while (*pp) pp = &(*pp)->ready_next;
  *pp = t;
}

/* LuaJIT has one hook for the whole VM: the interrupt hook is installed
 * only for the resume of an interrupted task and puts back whatever hook
 * was there before (the console's guard) when it fires. */
static void qtg_task_interrupt_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  qtg_host *h = qtg_host_from_lua(L);
  qtg_task *t = h ? h->current : NULL;
  if (!t || t->co != L || !t->interrupted) return;
  t->interrupted = 0;
  lua_sethook(L, h->saved_hook, h->saved_hook_mask, h->saved_hook_count);
  qtg_raise(L, "interrupted", "interrupted");
}

static void qtg_task_run(qtg_task *t, int nargs) {
  qtg_host *h = t->h;
  qtg_task *prev = h->current;
  h->current = t;
  qtg_busy_enter(h->busy, t);
  int st = lua_resume(t->co, nargs);
  h->current = prev;
  qtg_busy_leave(h->busy);
  if (st == LUA_YIELD) {
    if (t->waiting) return;
    /* A yield that no host binding made would strand the task (Lua's
     * coroutine.yield of a task's own thread raises instead: see
     * qtg_host_guarded_yield; this is any other way to yield). */
    lua_settop(t->co, 0);
    qtg_push_error(t->co, "usage",
                   "coroutine.yield() outside a host binding in task '%s' (use qtg.sleep or I/O)",
                   t->name);
    qtg_task_finish(t, 0, 1);
    return;
  }
  if (st == 0) {
    qtg_task_finish(t, 1, lua_gettop(t->co));
    return;
  }
  qtg_task_finish(t, 0, 1);
}

qtg_task *qtg_task_spawn(qtg_host *h, const char *name, int nargs, int flags,
                         qtg_task_done_cb done, void *data) {
  lua_State *L = h->L;
  qtg_task *t = calloc(1, sizeof *t);
  if (!t) {
    lua_pop(L, nargs + 1);
    qtg_log_error("out of memory starting task %s", name);
    return NULL;
  }
  t->h = h;
  t->flags = flags;
  t->done = done;
  t->data = data;
  t->owner = (flags & QTG_TASK_UNOWNED) || !h->current ? 0 : h->current->owner;
  t->serial = ++h->task_serials;
  snprintf(t->name, sizeof t->name, "%s", name ? name : "task");
  t->co = lua_newthread(L);
  lua_insert(L, -(nargs + 2));           /* thread below fn and args */
  lua_xmove(L, t->co, nargs + 1);        /* fn, args onto the thread */
  t->co_ref = qtg_ref(L);                /* pops the thread */
  t->next = h->tasks;
  if (h->tasks) h->tasks->prev = t;
  h->tasks = t;
  h->live_tasks++;
  qtg_task_run(t, nargs);
  return t;
}

void qtg_task_resume(qtg_task *t, int nres) {
  t->waiting = 0;
  t->cancel = NULL;
  /* A finalizer run by lua_close (a session handing its connection to a
   * waiter) must not run a task's Lua in a state being torn down; the
   * task is freed after it. */
  if (t->h->closing) return;
  if (t->interrupted) {
    /* The hook fires at the task's first instructions; compiled traces do
     * not run hooks, so they are dropped first (rare: an operator's stop). */
    qtg_host *h = t->h;
    if (lua_gethook(t->co) != qtg_task_interrupt_hook) {
      h->saved_hook = lua_gethook(t->co);
      h->saved_hook_mask = lua_gethookmask(t->co);
      h->saved_hook_count = lua_gethookcount(t->co);
    }
    luaJIT_setmode(t->co, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_FLUSH);
    lua_sethook(t->co, qtg_task_interrupt_hook, LUA_MASKCOUNT, 1);
  }
  qtg_task_run(t, nres);
}

void qtg_task_set_cancel(qtg_task *t, void (*cancel)(qtg_task *, void *), void *arg) {
  t->cancel = cancel;
  t->cancel_arg = arg;
}

void qtg_task_interrupt(qtg_task *t) {
  if (t->waiting && t->cancel) {
    void (*cancel)(qtg_task *, void *) = t->cancel;
    t->cancel = NULL;
    cancel(t, t->cancel_arg);
    return;
  }
  /* A waiting task without a cancel hook raises when it is resumed.  (A
   * running task cannot be interrupted from here: the loop is single
   * threaded; the console's guard hook handles Lua that never yields.) */
  t->interrupted = 1;
}

int qtg_task_waiting(qtg_task *t) { return t->waiting; }

void qtg_task_set_owner(qtg_task *t, uint64_t owner) { t->owner = owner; }
uint64_t qtg_task_owner(qtg_task *t) { return t->owner; }
uint64_t qtg_task_serial(qtg_task *t) { return t->serial; }

/* Process-wide by nature: a signal is sent to the process, not to a host. */
static volatile sig_atomic_t qtg_stop_signal;

void qtg_host_note_stop_signal(int signum) { qtg_stop_signal = signum; }
int qtg_host_stop_signal(void) { return qtg_stop_signal; }

/* ---- host lifecycle ------------------------------------------------------ */

typedef struct {
  const char *name;
  int (*open)(qtg_host *, char *, size_t);
  void (*close)(qtg_host *);
  int phase;
} qtg_subsystem;

static const qtg_subsystem qtg_subsystems[] = {
#define QTG_SUBSYSTEM(name, open, close, phase) {#name, open, close, phase},
#include "qtg_modules.h"
#undef QTG_SUBSYSTEM
};
#define QTG_NSUBSYSTEMS (sizeof qtg_subsystems / sizeof qtg_subsystems[0])

/* jit.on() would undo the engine's LUAJIT_MODE_OFF below, and under the
 * units' MemoryDenyWriteExecute LuaJIT then aborts the whole process when
 * it first makes code ("runtime code generation failed").  A policy or a
 * console line that calls it gets this error instead. */
static int qtg_host_jit_on_refused(lua_State *L) {
  return qtg_raise(L, "usage", "jit.on: LuaJIT's compiler stays off in qtgd (the interpreter is the one "
                   "found correct, and the units forbid run-time code: MemoryDenyWriteExecute)");
}

/* coroutine.yield in the daemon.  The host's functions yield a task's own
 * thread from C, with what resumes it arranged; a Lua yield of that thread
 * reaches the scheduler with nothing to resume it, and the task had to end
 * (an adapter's observe that yielded so failed the observer's tick at
 * every pass, its node unrecorded).  It raises a usage error where it is
 * called instead, so the code around it (an executor's call under pcall)
 * sees an error of its own; a coroutine's yield inside a task
 * (coroutine.wrap) is Lua's. */
static int qtg_host_guarded_yield(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  if (h && h->current && qtg_task_thread(h->current) == L)
    return qtg_raise(L, "usage", "coroutine.yield() outside a host binding in task '%s' (use qtg.sleep or I/O)",
                     qtg_task_name(h->current));
  return lua_yield(L, lua_gettop(L));
}

/* Replace library.field (a standard library's function) with fn; nothing
 * when the library is not loaded. */
static void qtg_host_replace_library_function(lua_State *L, const char *library, const char *field,
                                              lua_CFunction fn) {
  lua_getglobal(L, library);
  if (lua_istable(L, -1)) {
    lua_pushcfunction(L, fn);
    lua_setfield(L, -2, field);
  }
  lua_pop(L, 1);
}

/* A searcher before Lua's file loader: a module that the loader would take
 * from the MG_LUA_PATH override (upvalue 1) is loaded only while the
 * directory still passes its check (qtg_lua_path.c).  Checked at start
 * only, a tree made writable or a file planted later was loaded by the
 * first require of a module not loaded yet (the approval policy, an
 * executor).  Returns nothing: the next searcher loads it. */
static int qtg_host_override_searcher(lua_State *L) {
  size_t olen;
  const char *over = lua_tolstring(L, lua_upvalueindex(1), &olen);
  luaL_checkstring(L, 1);
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "searchpath");
  if (!lua_isfunction(L, -1)) return 0;
  lua_pushvalue(L, 1);
  lua_getfield(L, -3, "path");
  lua_call(L, 2, 1);
  const char *file = lua_tostring(L, -1);
  if (file == NULL || strncmp(file, over, olen) != 0 || file[olen] != '/') return 0;
  char err[512];
  if (qtg_lua_path_check(over, err, sizeof err) != 0)
    return luaL_error(L, "module %s: %s", lua_tostring(L, 1), err);
  return 0;
}

/* Put the searcher at package.loaders[2], before Lua's file loader. */
static void qtg_host_add_override_searcher(lua_State *L, int package, const char *over) {
  lua_getfield(L, package, "loaders");
  if (!lua_istable(L, -1)) {
    lua_pop(L, 1);
    return;
  }
  int n = (int)lua_objlen(L, -1);
  for (int i = n; i >= 2; i--) {
    lua_rawgeti(L, -1, i);
    lua_rawseti(L, -2, i + 1);
  }
  lua_pushstring(L, over);
  lua_pushcclosure(L, qtg_host_override_searcher, 1);
  lua_rawseti(L, -2, 2);
  lua_pop(L, 1);
}

/* Module search path: the operator's override directory first, then the
 * packaged lua/, then Debian's Lua 5.1 directories (cjson, lfs, busted; the
 * C modules' directory is the build machine's multiarch one, from CMake). */
static void qtg_host_set_paths(qtg_host *h) {
  lua_State *L = h->L;
  const char *over = qtg_settings_str(h->settings, QTG_S_LUA_PATH);
  if (h->settings->lua_path_error[0]) over = "";
  lua_getglobal(L, "package");
  int top = lua_gettop(L);
  if (over[0]) lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;", over, over);
  lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua;", h->root_dir, h->root_dir);
  lua_pushliteral(L, "/usr/share/lua/5.1/?.lua;/usr/share/lua/5.1/?/init.lua;");
  lua_getfield(L, top, "path");
  lua_concat(L, lua_gettop(L) - top);
  lua_setfield(L, top, "path");
  lua_pushliteral(L, QTG_LUA_CMODULE_DIR "/?.so;");
  lua_getfield(L, top, "cpath");
  lua_concat(L, 2);
  lua_setfield(L, top, "cpath");
  if (over[0]) qtg_host_add_override_searcher(L, top, over);
  lua_pop(L, 1);
}

int qtg_host_init(qtg_host *h, qtg_settings *s, const char *root_dir) {
  char err[512] = "";
  memset(h, 0, sizeof *h);
  h->settings = s;
  h->root_dir = root_dir;
  h->loop = malloc(sizeof *h->loop);
  if (!h->loop || uv_loop_init(h->loop) != 0) {
    free(h->loop);
    h->loop = NULL;
    qtg_log_error("cannot initialise the event loop");
    return -1;
  }
  h->L = luaL_newstate();
  if (!h->L) {
    qtg_log_error("cannot create the Lua state (out of memory)");
    qtg_host_close(h);
    return -1;
  }
  luaL_openlibs(h->L);
  /* The JIT compiler stays off: Debian 12's LuaJIT (2.1.0~beta3+git20220320)
   * miscompiles recursive walks over nested tables -- wrong results (a
   * $ref scan that misses a nested $ref), hangs and segfaults, found by
   * spec/lua/fuzz/fuzz_ref_spec.lua and reproduced with plain `luajit`, gone
   * with -joff (docs/reliability.md).  Policies are I/O-bound; the
   * interpreter is correct, and measured no slower for the daemon: its Lua
   * runs in short steps between C calls, which traces do not cross
   * (docs/performance.md, "Where qtgd's CPU goes"). */
  luaJIT_setmode(h->L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
  qtg_host_replace_library_function(h->L, "jit", "on", qtg_host_jit_on_refused);
  qtg_host_replace_library_function(h->L, "coroutine", "yield", qtg_host_guarded_yield);
  lua_pushlightuserdata(h->L, (void *)&qtg_host_key);
  lua_pushlightuserdata(h->L, h);
  lua_rawset(h->L, LUA_REGISTRYINDEX);
  {
    const char *over = qtg_settings_str(h->settings, QTG_S_LUA_PATH);
    if (over[0] && qtg_lua_path_check(over, err, sizeof err) != 0) {
      if (!h->settings->report_only) {
        qtg_log_fields(QTG_LOG_ERROR, err, (const char *const[]){"setting", "MG_LUA_PATH", NULL});
        qtg_host_close(h);
        return -1;
      }
      snprintf(h->settings->lua_path_error, sizeof h->settings->lua_path_error, "%s", err);
    }
  }
  qtg_host_set_paths(h);
  for (size_t i = 0; i < QTG_NSUBSYSTEMS; i++) {
    if (qtg_subsystems[i].open(h, err, sizeof err) != 0) {
      qtg_log_fields(QTG_LOG_ERROR, err[0] ? err : "start-up failed",
                     (const char *const[]){"subsystem", qtg_subsystems[i].name, NULL});
      h->opened = (int)i;
      qtg_host_close(h);
      return -1;
    }
    h->opened = (int)i + 1;
  }
  if (qtg_core_register(h) != 0 || qtg_runtime_ready(h) != 0) {
    qtg_host_close(h);
    return -1;
  }
  return 0;
}

static void qtg_host_close_walk(uv_handle_t *handle, void *arg) {
  (void)arg;
  if (!uv_is_closing(handle)) uv_close(handle, NULL);
}

void qtg_host_close(qtg_host *h) {
  qtg_busy_stop(h);
  for (int i = h->opened - 1; i >= 0; i--)
    if (qtg_subsystems[i].phase == QTG_CLOSE_BEFORE_LUA) qtg_subsystems[i].close(h);
  qtg_core_close(h);
  if (h->signals_armed) {
    uv_close((uv_handle_t *)&h->sigterm, NULL);
    uv_close((uv_handle_t *)&h->sigint, NULL);
    uv_close((uv_handle_t *)&h->sighup, NULL);
    h->signals_armed = 0;
  }
  if (h->L) {
    h->closing = 1;
    lua_close(h->L);
    h->L = NULL;
  }
  for (int i = h->opened - 1; i >= 0; i--)
    if (qtg_subsystems[i].phase == QTG_CLOSE_AFTER_LUA) qtg_subsystems[i].close(h);
  h->opened = 0;
  while (h->tasks) qtg_task_free(h->tasks);
  if (h->loop) {
    uv_walk(h->loop, qtg_host_close_walk, NULL);
    uv_run(h->loop, UV_RUN_DEFAULT);
    if (uv_loop_close(h->loop) != 0) qtg_log_warn("event loop closed with handles still open");
    free(h->loop);
    h->loop = NULL;
  }
}

int qtg_host_run(qtg_host *h) {
  uv_run(h->loop, UV_RUN_DEFAULT);
  return h->exit_code;
}

void qtg_host_stop(qtg_host *h, int exit_code) {
  h->exit_code = exit_code;
  h->stopping = 1;
  uv_stop(h->loop);
}
