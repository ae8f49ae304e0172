/* qtg_console_session.c -- one console connection: its framing (wire
 * format in qtg_console.h), its commands as host tasks, its output, and the
 * guard that interrupts Lua that never yields.
 *
 * A session runs at most one command at a time: frames that arrive while
 * one runs are queued (an interrupt frame acts at once).  A command is a
 * host task running require("qtg.console").handle(session, kind, payload);
 * it yields on I/O like any worker tick, so a long query in one console
 * never stalls the workers or the other consoles.  The task returns the
 * final frame's type and text; output printed meanwhile is sent with
 * qtg.console_server.write.
 *
 * Lifetime: a session is freed when both its pipe is closed and its task
 * (if any) has finished.  A client that goes away mid-command gets its
 * command interrupted.  When the console closes (qtg_console.c) the Lua
 * references are dropped at once and the pipes' close callbacks free the C
 * memory later, without touching Lua.
 */
#include "qtg_console_session.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lua_db.h"
#include "qtg_log.h"

typedef struct {
  uv_write_t req;
  qtg_console_session *session;
  unsigned char bytes[];
} qtg_console_write;

typedef struct {
  uv_shutdown_t req;
} qtg_console_shutdown;

/* ---- sessions: output ---------------------------------------------------- */

static void qtg_console_parse(qtg_console_session *sess);

static void qtg_console_written(uv_write_t *req, int status) {
  qtg_console_write *w = (qtg_console_write *)req;
  qtg_console_session *sess = w->session;
  free(w);
  if (status < 0 && status != UV_ECANCELED && !sess->dropping)
    qtg_console_drop(sess, uv_strerror(status));
}

/* Queue one frame to the client.  Returns 0, or -1 when the session is gone
 * or the client stopped reading (the session is then dropped). */
int qtg_console_send(qtg_console_session *sess, int type, const char *data, size_t len) {
  if (sess->dropping) return -1;
  if (len + 1 > QTG_CONSOLE_MAX_FRAME_OUT) len = QTG_CONSOLE_MAX_FRAME_OUT - 1;
  if (uv_stream_get_write_queue_size((uv_stream_t *)&sess->pipe) > QTG_CONSOLE_MAX_UNSENT) {
    qtg_console_drop(sess, "client is not reading its output");
    return -1;
  }
  qtg_console_write *w = malloc(sizeof *w + 5 + len);
  if (!w) {
    qtg_console_drop(sess, "out of memory");
    return -1;
  }
  w->session = sess;
  qtg_console_frame_header(w->bytes, type, len);
  if (len) memcpy(w->bytes + 5, data, len);
  uv_buf_t buf = uv_buf_init((char *)w->bytes, (unsigned)(5 + len));
  int rc = uv_write(&w->req, (uv_stream_t *)&sess->pipe, &buf, 1, qtg_console_written);
  if (rc < 0) {
    free(w);
    qtg_console_drop(sess, uv_strerror(rc));
    return -1;
  }
  return 0;
}

static void qtg_console_sendf(qtg_console_session *sess, int type, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void qtg_console_sendf(qtg_console_session *sess, int type, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= sizeof msg) n = (int)sizeof msg - 1;
  qtg_console_send(sess, type, msg, (size_t)n);
}

/* ---- sessions: lifetime ------------------------------------------------- */

static void qtg_console_free_queue(qtg_console_session *sess) {
  while (sess->queue_head) {
    qtg_console_frame *f = sess->queue_head;
    sess->queue_head = f->next;
    free(f);
  }
  sess->queue_tail = NULL;
  sess->queued = 0;
}

void qtg_console_unlink(qtg_console_session *sess) {
  struct qtg_console *c = sess->console;
  if (!c) return;
  if (sess->prev) sess->prev->next = sess->next;
  if (sess->next) sess->next->prev = sess->prev;
  if (c->sessions == sess) c->sessions = sess->next;
  c->nsessions--;
  sess->console = NULL;
  sess->next = sess->prev = NULL;
}

/* A command's number, the owner of its task and of every task it spawns:
 * the session's id in the high half, so what a session's commands hold is
 * found by the id alone. */
static uint64_t qtg_console_command_number(const qtg_console_session *sess, uint64_t count) {
  return (sess->id << 32) | (count & 0xffffffffu);
}

static int qtg_console_owns(uint64_t owner, void *arg) {
  return owner && owner >> 32 == ((const qtg_console_session *)arg)->id;
}

/* Free the session once nothing refers to it any more.  Lua references are
 * dropped here only while the console is open; qtg_console_close drops them
 * itself, since close callbacks may run after the Lua state is gone.  The
 * database sessions its commands and their tasks acquired and still hold
 * go back to the pool now, whatever still reaches them (a function left in
 * `qtg`, a task still running): the pool is the workers' and every other
 * console's, and a console that is gone cannot give them back.  Its
 * variables are collected first, so what only they held goes back as a
 * release does. */
static void qtg_console_maybe_free(qtg_console_session *sess) {
  if (sess->pipe_open || sess->busy) return;
  if (sess->console && sess->table_ref != LUA_NOREF) {
    qtg_unref(sess->host->L, sess->table_ref);
    lua_gc(sess->host->L, LUA_GCCOLLECT, 0);
    int n = qtg_db_give_back(sess->host, qtg_console_owns, sess);
    if (n > 0)
      qtg_log_warn("console: gave back %d database session%s the closed console (uid %lu, pid %ld) "
                   "still held outside its variables", n, n == 1 ? "" : "s", sess->uid, sess->pid);
  }
  qtg_console_unlink(sess);
  qtg_console_free_queue(sess);
  free(sess->in);
  free(sess);
}

static void qtg_console_closed(uv_handle_t *handle) {
  qtg_console_session *sess = handle->data;
  sess->pipe_open = 0;
  qtg_console_maybe_free(sess);
}

static void qtg_console_shut(uv_shutdown_t *req, int status) {
  (void)status;
  qtg_console_session *sess = req->handle->data;
  free(req);
  if (!uv_is_closing((uv_handle_t *)&sess->pipe))
    uv_close((uv_handle_t *)&sess->pipe, qtg_console_closed);
}

/* Stop serving a session: no more reads or writes; a running command is
 * interrupted.  The pipe is shut down after queued output is flushed when
 * that output is small (a final message), else closed at once. */
void qtg_console_drop(qtg_console_session *sess, const char *why) {
  if (sess->dropping) return;
  sess->dropping = 1;
  if (why) {
    char id[32], uid[32];
    snprintf(id, sizeof id, "%llu", (unsigned long long)sess->id);
    snprintf(uid, sizeof uid, "%lu", sess->uid);
    const char *fields[] = {"session", id, "uid", uid, "reason", why, NULL};
    qtg_log_fields(QTG_LOG_INFO, "console session ended", fields);
  }
  uv_read_stop((uv_stream_t *)&sess->pipe);
  qtg_console_free_queue(sess);
  int flushed = sess->console && !sess->console->closing &&
                uv_stream_get_write_queue_size((uv_stream_t *)&sess->pipe) == 0;
  qtg_console_shutdown *sh = flushed ? malloc(sizeof *sh) : NULL;
  if (!sh || uv_shutdown(&sh->req, (uv_stream_t *)&sess->pipe, qtg_console_shut) < 0) {
    free(sh);
    if (!uv_is_closing((uv_handle_t *)&sess->pipe))
      uv_close((uv_handle_t *)&sess->pipe, qtg_console_closed);
  }
  qtg_console_stop(sess, "the console went away");
}

/* Send a fatal message and drop the session. */
static void qtg_console_refuse(qtg_console_session *sess, const char *msg) {
  qtg_console_send(sess, QTG_CONSOLE_FATAL, msg, strlen(msg));
  qtg_console_drop(sess, msg);
}

/* ---- the guard: ending Lua that never yields --------------------------------
 *
 * A command that computes without doing I/O never gives the loop back, so
 * its client's interrupt frame would never be read.  While a command runs,
 * a count hook looks at the client's socket itself (without blocking, at
 * most every GUARD_PERIOD) and ends the command when an interrupt frame or
 * the end of the connection is there, when the command held the loop for
 * MG_CONSOLE_BUSY_LIMIT_SECONDS, or when the daemon got SIGTERM/SIGINT (the loop must run the
 * shutdown).
 *
 * Ending is uncatchable: once a command must stop (sess->stop), the hook
 * runs at every VM instruction and raises "interrupted" at each, until the
 * command's task has ended.  A pcall catches one raise; the instruction
 * after it raises again, so every level of protection is unwound in turn.
 *
 * LuaJIT has one hook for the whole VM, called on whatever coroutine runs.
 * The hook finds the command by the running task (h->current), whose owner
 * is the command's number: code inside coroutine.wrap runs within that
 * task, and tasks the command spawns inherit its number, so neither
 * escapes; a worker's tick is no command's and is never hit.  Console
 * chunks run interpreted (the host keeps the JIT off), since compiled code
 * does not call hooks.  The hook is installed when the first command starts
 * and stays (every GUARD_COUNT instructions it costs a registry lookup):
 * a task a command spawned may run later, from the loop, and is held to
 * the busy limit and SIGTERM too (qtg_console_guard_orphan). */

static void qtg_console_guard_hook(lua_State *L, lua_Debug *ar);

static void qtg_console_set_hook(struct qtg_console *c, lua_State *L) {
  lua_sethook(L, qtg_console_guard_hook, LUA_MASKCOUNT,
              c->stopping || c->orphan_stopped ? 1 : QTG_CONSOLE_GUARD_COUNT);
}

static void qtg_console_look(qtg_console_session *sess) {
  uv_os_fd_t fd;
  if (sess->dropping || uv_fileno((uv_handle_t *)&sess->pipe, &fd) < 0) return;
  size_t need = sess->in_len + QTG_CONSOLE_READ_CHUNK;
  if (need > sess->in_cap) {
    unsigned char *p = realloc(sess->in, need);
    if (!p) return;
    sess->in = p;
    sess->in_cap = need;
  }
  ssize_t n = recv(fd, sess->in + sess->in_len, QTG_CONSOLE_READ_CHUNK, MSG_DONTWAIT);
  if (n > 0) {
    sess->in_len += (size_t)n;
    qtg_console_parse(sess);
  } else if (n == 0) {
    qtg_console_drop(sess, "client disconnected");
  }
}

void qtg_console_stop(qtg_console_session *sess, const char *why) {
  if (!sess->busy) return;
  if (!sess->stop) sess->stop = why;
  struct qtg_console *c = sess->console;
  if (c && !c->stopping) {
    c->stopping = 1;
    if (lua_gethook(c->host->L) == qtg_console_guard_hook) qtg_console_set_hook(c, c->host->L);
  }
  /* A command waiting for I/O abandons the wait; it raises once resumed. */
  if (sess->task && qtg_task_waiting(sess->task)) qtg_task_interrupt(sess->task);
}

/* The session whose command is running now, or NULL (a worker, or nothing). */
static qtg_console_session *qtg_console_running(struct qtg_console *c, qtg_host *h) {
  uint64_t owner = h->current ? qtg_task_owner(h->current) : 0;
  if (!owner) return NULL;
  for (qtg_console_session *s = c->sessions; s; s = s->next)
    if (s->busy && s->command == owner) return s;
  return NULL;
}

/* A task of a command that has ended (qtg.spawn'ed, woken later from the
 * loop): no session answers for it, but it is console code all the same,
 * held to the busy limit and to SIGTERM like a command. */
static void qtg_console_guard_orphan(struct qtg_console *c, qtg_host *h, lua_State *L) {
  uint64_t owner = h->current ? qtg_task_owner(h->current) : 0;
  int was = c->orphan_stopped;
  if (!owner) {
    if (was && c->orphan_iteration != c->iterations) c->orphan_stopped = 0;
  } else {
    uint64_t now = uv_hrtime();
    if (c->orphan_iteration != c->iterations || c->orphan_task != (void *)h->current) {
      c->orphan_iteration = c->iterations;
      c->orphan_task = h->current;
      c->orphan_start = now;
      c->orphan_stopped = 0;
    }
    if (!c->orphan_stopped && (qtg_host_stop_signal() || now - c->orphan_start > c->busy_limit_ns)) {
      c->orphan_stopped = 1;
      qtg_log_warn("console: stopping a task a console command spawned: it held the loop longer than "
                   "MG_CONSOLE_BUSY_LIMIT_SECONDS, or the daemon is stopping");
    }
  }
  if (was != c->orphan_stopped) qtg_console_set_hook(c, L);
  if (c->orphan_stopped && owner)
    qtg_raise(L, "interrupted", "a task spawned by a console command held the loop too long "
                                "(MG_CONSOLE_BUSY_LIMIT_SECONDS) or the daemon is stopping");
}

static void qtg_console_guard_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  qtg_host *h = qtg_host_from_lua(L);
  struct qtg_console *c = h ? h->console : NULL;
  if (!c) return;
  qtg_console_session *sess = qtg_console_running(c, h);
  if (!sess) {
    qtg_console_guard_orphan(c, h, L);
    return;
  }
  if (!sess->stop && qtg_host_stop_signal())
    qtg_console_stop(sess, qtg_host_stop_signal() == SIGTERM ? "the daemon is stopping (SIGTERM)"
                                                             : "the daemon is stopping (SIGINT)");
  if (!sess->stop) {
    uint64_t now = uv_hrtime();
    if (sess->seen_iteration != c->iterations) {   /* the loop ran since: a new burst */
      sess->seen_iteration = c->iterations;
      sess->burst_start = now;
    }
    if (now - sess->burst_start > c->busy_limit_ns) {
      qtg_console_stop(sess, "the command held the loop longer than MG_CONSOLE_BUSY_LIMIT_SECONDS "
                             "without giving it back (no worker, console or signal is served meanwhile)");
    } else if (now - sess->last_look >= QTG_CONSOLE_GUARD_PERIOD_NS) {
      sess->last_look = now;
      qtg_console_look(sess);                      /* may set sess->stop */
    }
  }
  if (!sess->stop) return;
  if (lua_gethookcount(L) != 1) qtg_console_set_hook(c, L);
  qtg_raise(L, "interrupted", "%s", sess->stop);
}

void qtg_console_guard(qtg_console_session *sess, lua_State *L) {
  qtg_host *h = sess->host;
  struct qtg_console *c = sess->console;
  if (!c || sess->task || !h->current || qtg_task_thread(h->current) != L) return;
  sess->task = h->current;
  sess->command = qtg_console_command_number(sess, ++c->next_command);
  qtg_task_set_owner(sess->task, sess->command);
  sess->last_look = sess->burst_start = uv_hrtime();
  sess->seen_iteration = c->iterations;
  if (lua_gethook(L) != qtg_console_guard_hook) qtg_console_set_hook(c, L);
  if (sess->stop) qtg_console_stop(sess, sess->stop);
}

/* The command ended: its number owns nothing any more, and the hook runs
 * at its usual pace again unless another command must stop. */
static void qtg_console_unguard(qtg_console_session *sess) {
  struct qtg_console *c = sess->console;
  sess->task = NULL;
  sess->command = 0;
  sess->stop = NULL;
  if (!c) return;
  int stopping = 0;
  for (qtg_console_session *s = c->sessions; s; s = s->next)
    if (s != sess && s->busy && s->stop) stopping = 1;
  if (c->stopping == stopping) return;
  c->stopping = stopping;
  lua_State *L = c->host->L;
  if (lua_gethook(L) == qtg_console_guard_hook) qtg_console_set_hook(c, L);
}

/* ---- commands ------------------------------------------------------------ */

static void qtg_console_run_next(qtg_console_session *sess);

/* The error of a failed command task as text (the Lua handler catches
 * errors itself, so this is only reached by an interrupt outside its
 * protection or a broken console module). */
static void qtg_console_push_failure(lua_State *T, const char **msg, size_t *len) {
  *msg = NULL;
  if (lua_type(T, -1) == LUA_TSTRING) {
    *msg = lua_tolstring(T, -1, len);
  } else if (lua_istable(T, -1)) {
    lua_getfield(T, -1, "message");
    if (lua_type(T, -1) == LUA_TSTRING) *msg = lua_tolstring(T, -1, len);
  }
  if (!*msg) {
    *msg = "command failed (error object is not a string)";
    *len = strlen(*msg);
  }
}

/* A command ended by the guard skipped its own clean-up code (a database
 * session's release, a transaction's rollback): what it held is garbage
 * now and is collected at once, so its __gc hands it back (the pool rolls
 * an open transaction back). */
static void qtg_console_collect(lua_State *T, qtg_host *h) {
  lua_settop(T, 0);
  lua_gc(h->L, LUA_GCCOLLECT, 0);
}

static void qtg_console_task_done(qtg_task *t, int ok, int nres, void *data) {
  qtg_console_session *sess = data;
  lua_State *T = qtg_task_thread(t);
  const char *stop = sess->stop;
  qtg_console_unguard(sess);
  sess->busy = 0;
  sess->last_active = uv_hrtime();
  if (sess->dropping) {
    if (stop) qtg_console_collect(T, sess->host);
    qtg_console_maybe_free(sess);
    return;
  }
  const char *text = NULL;
  size_t len = 0;
  int type = QTG_CONSOLE_ERROR;
  char stopped[256];
  if (stop) {
    int n = snprintf(stopped, sizeof stopped, "interrupted: %s", stop);
    text = stopped;
    len = n < 0 ? 0 : (size_t)n < sizeof stopped ? (size_t)n : sizeof stopped - 1;
  } else if (!ok) {
    qtg_console_push_failure(T, &text, &len);
  } else if (nres >= 1 && lua_type(T, -nres) == LUA_TSTRING) {
    size_t tl;
    const char *ts = lua_tolstring(T, -nres, &tl);
    if (tl == 1 && ts[0] && strchr("rxmk", ts[0])) {
      type = ts[0];
      if (nres >= 2 && lua_type(T, -nres + 1) == LUA_TSTRING)
        text = lua_tolstring(T, -nres + 1, &len);
    } else {
      text = "console handler returned an unknown frame type";
      len = strlen(text);
    }
  } else {
    text = "console handler returned no frame type";
    len = strlen(text);
  }
  qtg_console_send(sess, type, text ? text : "", text ? len : 0);
  if (stop) qtg_console_collect(T, sess->host);
  qtg_console_run_next(sess);
}

/* Start a task for one 'e' or 'c' frame. */
static void qtg_console_start(qtg_console_session *sess, int type, const char *data, size_t len) {
  struct qtg_console *c = sess->console;
  qtg_host *h = sess->host;
  lua_State *L = h->L;
  if (!c || c->handler_ref == LUA_NOREF) {
    qtg_console_refuse(sess, "the console is shutting down");
    return;
  }
  char kind[2] = {(char)type, 0};
  lua_rawgeti(L, LUA_REGISTRYINDEX, c->handler_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, sess->table_ref);
  lua_pushstring(L, kind);
  lua_pushlstring(L, data, len);
  sess->busy = 1;
  qtg_task *t = qtg_task_spawn(h, "console", 3, QTG_TASK_QUIET, qtg_console_task_done, sess);
  if (!t) {
    sess->busy = 0;
    qtg_console_sendf(sess, QTG_CONSOLE_ERROR, "cannot start the command: out of memory");
    return;
  }
  /* The task may have finished already, and the next queued command may
   * be running in its place: sess->task is set by the command itself (its
   * guard() call), never from t here. */
}

static void qtg_console_run_next(qtg_console_session *sess) {
  while (!sess->busy && !sess->dropping && sess->queue_head) {
    qtg_console_frame *f = sess->queue_head;
    sess->queue_head = f->next;
    if (!sess->queue_head) sess->queue_tail = NULL;
    sess->queued--;
    qtg_console_start(sess, f->type, f->data, f->len);
    free(f);
  }
}

static void qtg_console_enqueue(qtg_console_session *sess, int type, const unsigned char *data,
                                size_t len) {
  if (sess->queued >= QTG_CONSOLE_MAX_QUEUED) {
    qtg_console_refuse(sess, "too many commands queued behind the running one");
    return;
  }
  qtg_console_frame *f = malloc(sizeof *f + len);
  if (!f) {
    qtg_console_refuse(sess, "out of memory");
    return;
  }
  f->next = NULL;
  f->type = type;
  f->len = len;
  if (len) memcpy(f->data, data, len);
  if (sess->queue_tail)
    sess->queue_tail->next = f;
  else
    sess->queue_head = f;
  sess->queue_tail = f;
  sess->queued++;
}

/* ---- sessions: input ------------------------------------------------------ */

static void qtg_console_frame_in(qtg_console_session *sess, int type, const unsigned char *data,
                                 size_t len) {
  switch (type) {
  case QTG_CONSOLE_INTERRUPT:
    qtg_console_stop(sess, "stopped by the operator");   /* nothing runs: ignored */
    return;
  case QTG_CONSOLE_EVAL:
  case QTG_CONSOLE_COMPLETE:
    if (sess->busy || sess->queue_head) {
      qtg_console_enqueue(sess, type, data, len);
      return;
    }
    qtg_console_start(sess, type, (const char *)data, len);
    return;
  default: {
    char msg[96];
    snprintf(msg, sizeof msg, "protocol error: unknown frame type 0x%02x", (unsigned)type & 0xffu);
    qtg_console_refuse(sess, msg);
  }
  }
}

/* Cut complete frames off the input buffer.  A length beyond the limit is
 * refused as soon as its header arrives, before its body is buffered.  Each
 * frame is taken out of the buffer before it is acted on: acting may run a
 * command at once, whose guard hook may read and parse more input (nested),
 * so nothing here may hold a position in the buffer across that call. */
static void qtg_console_parse(qtg_console_session *sess) {
  while (!sess->dropping && sess->in_len >= 4) {
    const unsigned char *p = sess->in;
    uint32_t n = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
    if (n == 0) {
      qtg_console_refuse(sess, "protocol error: empty frame");
      break;
    }
    if (n > QTG_CONSOLE_MAX_FRAME_IN) {
      char msg[128];
      snprintf(msg, sizeof msg, "protocol error: frame of %lu bytes is over the limit of %u bytes",
               (unsigned long)n, QTG_CONSOLE_MAX_FRAME_IN);
      qtg_console_refuse(sess, msg);
      break;
    }
    if (sess->in_len < 4 + (size_t)n) break;
    int type = p[4];
    size_t len = n - 1;
    unsigned char *payload = malloc(len ? len : 1);
    if (!payload) {
      qtg_console_refuse(sess, "out of memory");
      break;
    }
    memcpy(payload, p + 5, len);
    memmove(sess->in, sess->in + 4 + n, sess->in_len - 4 - n);
    sess->in_len -= 4 + n;
    qtg_console_frame_in(sess, type, payload, len);
    free(payload);
  }
  if (sess->dropping) sess->in_len = 0;
}

static void qtg_console_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  qtg_console_session *sess = handle->data;
  size_t need = sess->in_len + QTG_CONSOLE_READ_CHUNK;
  if (need > sess->in_cap) {
    unsigned char *p = realloc(sess->in, need);
    if (!p) {
      *buf = uv_buf_init(NULL, 0); /* libuv reports UV_ENOBUFS */
      return;
    }
    sess->in = p;
    sess->in_cap = need;
  }
  *buf = uv_buf_init((char *)sess->in + sess->in_len, QTG_CONSOLE_READ_CHUNK);
}

static void qtg_console_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  (void)buf;
  qtg_console_session *sess = stream->data;
  if (nread == 0 || sess->dropping) return;
  if (nread < 0) {
    qtg_console_drop(sess, nread == UV_EOF ? "client disconnected" : uv_strerror((int)nread));
    return;
  }
  sess->in_len += (size_t)nread;
  sess->last_active = uv_hrtime();
  qtg_console_parse(sess);
}

/* ---- accepting ------------------------------------------------------------- */

static int qtg_console_new_table(lua_State *L, qtg_console_session *sess) {
  lua_createtable(L, 0, 4);
  lua_pushnumber(L, (lua_Number)sess->id);
  lua_setfield(L, -2, "id");
  lua_pushnumber(L, (lua_Number)sess->uid);
  lua_setfield(L, -2, "uid");
  lua_pushnumber(L, (lua_Number)sess->pid);
  lua_setfield(L, -2, "pid");
  return qtg_ref(L);
}

/* A session past QTG_CONSOLE_MAX_SESSIONS: the open session idle longest
 * (no command running, no input) is closed when it has been idle
 * MG_CONSOLE_IDLE_SECONDS, so clients that connect and never send (a
 * suspended `qtgd console`, a leaked socket) cannot keep the operators
 * out; without one the newcomer is refused with the open sessions' client
 * pids, to find them by.  0, or -1 with sess refused. */
static int qtg_console_make_room(struct qtg_console *c, qtg_console_session *sess) {
  int live = 0;
  qtg_console_session *idlest = NULL;
  for (qtg_console_session *s = c->sessions; s; s = s->next) {
    if (s->dropping) continue;
    live++;
    if (s != sess && !s->busy && (!idlest || s->last_active < idlest->last_active)) idlest = s;
  }
  if (live <= QTG_CONSOLE_MAX_SESSIONS) return 0;
  uint64_t now = uv_hrtime();
  if (idlest && now - idlest->last_active >= c->idle_ns) {
    char msg[160];
    snprintf(msg, sizeof msg, "closed: all %d console sessions were open and this one had been idle longest "
             "(%.0f s; MG_CONSOLE_IDLE_SECONDS)", QTG_CONSOLE_MAX_SESSIONS,
             (double)(now - idlest->last_active) / 1e9);
    qtg_log_warn("console: session %llu (pid %ld) %s", (unsigned long long)idlest->id, idlest->pid, msg);
    qtg_console_refuse(idlest, msg);
    return 0;
  }
  char msg[512];
  int n = snprintf(msg, sizeof msg, "refused: too many console sessions are open (%d, none idle "
                   "MG_CONSOLE_IDLE_SECONDS); their clients' pids:", QTG_CONSOLE_MAX_SESSIONS);
  for (qtg_console_session *s = c->sessions; s && n > 0 && (size_t)n < sizeof msg - 24; s = s->next) {
    if (s != sess && !s->dropping) n += snprintf(msg + n, sizeof msg - (size_t)n, " %ld", s->pid);
  }
  qtg_console_refuse(sess, msg);
  return -1;
}

void qtg_console_accept(uv_stream_t *server, int status) {
  struct qtg_console *c = server->data;
  qtg_host *h = c->host;
  if (status < 0) {
    qtg_log_warn("console: accept failed: %s", uv_strerror(status));
    return;
  }
  qtg_console_session *sess = calloc(1, sizeof *sess);
  if (!sess) {
    qtg_log_error("console: out of memory accepting a client");
    return;
  }
  sess->console = c;
  sess->host = h;
  sess->table_ref = LUA_NOREF;
  sess->id = ++c->next_id;
  sess->last_active = uv_hrtime();
  if (uv_pipe_init(h->loop, &sess->pipe, 0) < 0) {
    free(sess);
    return;
  }
  sess->pipe.data = sess;
  sess->pipe_open = 1;
  sess->next = c->sessions;
  if (c->sessions) c->sessions->prev = sess;
  c->sessions = sess;
  c->nsessions++;
  if (uv_accept(server, (uv_stream_t *)&sess->pipe) < 0) {
    qtg_console_drop(sess, "accept failed");
    return;
  }
  uv_os_fd_t fd;
  struct ucred cred;
  socklen_t clen = sizeof cred;
  if (uv_fileno((uv_handle_t *)&sess->pipe, &fd) < 0 ||
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || clen != sizeof cred) {
    qtg_console_refuse(sess, "refused: cannot read the peer's credentials");
    return;
  }
  sess->uid = (unsigned long)cred.uid;
  sess->pid = (long)cred.pid;
  uid_t self = geteuid();
  if (cred.uid != 0 && cred.uid != self) {
    char msg[160];
    snprintf(msg, sizeof msg, "refused: uid %lu may not use this console (only root and uid %lu)",
             (unsigned long)cred.uid, (unsigned long)self);
    qtg_log_warn("console: %s (pid %ld)", msg, (long)cred.pid);
    qtg_console_send(sess, QTG_CONSOLE_FATAL, msg, strlen(msg));
    qtg_console_drop(sess, NULL);
    return;
  }
  if (qtg_console_make_room(c, sess) != 0) return;
  sess->table_ref = qtg_console_new_table(h->L, sess);
  if (uv_read_start((uv_stream_t *)&sess->pipe, qtg_console_alloc, qtg_console_read) < 0) {
    qtg_console_drop(sess, "cannot read from the client");
    return;
  }
  char id[32], uid[32], pid[32];
  snprintf(id, sizeof id, "%llu", (unsigned long long)sess->id);
  snprintf(uid, sizeof uid, "%lu", sess->uid);
  snprintf(pid, sizeof pid, "%ld", sess->pid);
  qtg_log_fields(QTG_LOG_INFO, "console session started",
                 (const char *const[]){"session", id, "uid", uid, "pid", pid, NULL});
  qtg_console_sendf(sess, QTG_CONSOLE_HELLO, "qtgd %s (pid %ld), console session %s as uid %lu",
                    QTG_VERSION, (long)getpid(), id, sess->uid);
}

qtg_console_session *qtg_console_find(struct qtg_console *c, uint64_t id) {
  for (qtg_console_session *s = c->sessions; s; s = s->next)
    if (s->id == id) return s;
  return NULL;
}
