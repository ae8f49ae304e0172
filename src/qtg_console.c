/* qtg_console.c -- the console server: the Unix socket, its sessions, the
 * framing, and one Lua task per operator input (see qtg_console.h for the
 * wire format and docs/console.md for the operator's view).
 *
 * Each accepted peer becomes a session.  A session runs at most one command
 * at a time: frames that arrive while one runs are queued (an interrupt
 * frame acts at once).  A command is a host task running
 * require("qtg.console").handle(session, kind, payload); it yields on I/O
 * like any worker tick, so a long query in one console never stalls the
 * workers or the other consoles.  The task returns the final frame's type
 * and text; output printed meanwhile is sent with qtg.console_server.write.
 *
 * Lifetime: a session is freed when both its pipe is closed and its task
 * (if any) has finished.  A client that goes away mid-command gets its
 * command interrupted.  qtg_console_close runs while Lua still exists: it
 * drops the Lua references at once and lets the pipes' close callbacks free
 * the C memory later, without touching Lua.
 */
#include "qtg_console.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "qtg_host.h"
#include "qtg_log.h"
#include "qtg_modules_decl.h"

/* How many consoles may be attached at once, how much queued input one may
 * hold, and how much unsent output before the server gives up on it. */
#define QTG_CONSOLE_MAX_SESSIONS 32
#define QTG_CONSOLE_MAX_QUEUED 64
#define QTG_CONSOLE_MAX_UNSENT (64u << 20)
#define QTG_CONSOLE_READ_CHUNK 65536
/* The guard hook runs every GUARD_COUNT VM instructions of any Lua code
 * while a console command runs, and looks at the client's socket at most
 * every GUARD_PERIOD_NS. */
#define QTG_CONSOLE_GUARD_COUNT 10000
#define QTG_CONSOLE_GUARD_PERIOD_NS 50000000ull
/* A command that runs Lua this long without giving the loop back (no I/O,
 * no sleep) is interrupted: meanwhile no worker, console or signal is
 * served.  A prepare handle counts the loop's iterations, so the guard
 * knows when the command last let the loop run. */
#define QTG_CONSOLE_MAX_BUSY_NS 30000000000ull

typedef struct qtg_console_session qtg_console_session;

typedef struct qtg_console_frame {
  struct qtg_console_frame *next;
  int type;
  size_t len;
  char data[];
} qtg_console_frame;

struct qtg_console_session {
  struct qtg_console *console;    /* NULL once the console is closed */
  qtg_host *host;
  uv_pipe_t pipe;
  uint64_t id;
  unsigned long uid;
  long pid;
  unsigned char *in;              /* bytes received, not yet framed */
  size_t in_len, in_cap;
  qtg_console_frame *queue_head, *queue_tail;
  int queued;
  qtg_task *task;                 /* the running command, or NULL */
  int busy;                       /* a command runs (set before spawn) */
  lua_State *thread;              /* its Lua thread, for the guard hook */
  int interrupt_pending;          /* the guard hook raises at its next look */
  uint64_t last_look;             /* uv_hrtime of the guard's last look */
  uint64_t seen_iteration;        /* loop iteration the guard last saw */
  uint64_t burst_start;           /* when the command last got the CPU */
  int table_ref;                  /* Lua table handed to every command */
  int pipe_open;                  /* close callback not yet run */
  int dropping;                   /* no more input or output */
  qtg_console_session *next, *prev;
};

struct qtg_console {
  qtg_host *host;
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
  int is_run_dir;
  uv_pipe_t server;
  uv_prepare_t prepare;           /* counts loop iterations for the guard */
  uint64_t iterations;
  int prepare_open;
  int listening;                  /* server handle initialised */
  int server_closing;             /* its close callback has not run yet */
  int closing;                    /* qtg_console_close is running */
  int free_on_close;              /* free this struct in the close callback */
  int bound;                      /* we created the socket file */
  int handler_ref;                /* the Lua trampoline */
  uint64_t next_id;
  int nsessions;
  qtg_console_session *sessions;
};

typedef struct {
  uv_write_t req;
  qtg_console_session *session;
  unsigned char bytes[];
} qtg_console_write;

typedef struct {
  uv_shutdown_t req;
} qtg_console_shutdown;

/* ---- paths ------------------------------------------------------------- */

int qtg_console_socket_path(const qtg_settings *s, const char *root_dir, char *buf,
                            size_t buflen, int *is_run_dir, char *err, size_t errlen) {
  const char *explicit_path = qtg_settings_str(s, QTG_S_CONSOLE_SOCKET);
  const char *run_dir = qtg_settings_str(s, QTG_S_RUN_DIR);
  const char *rt = getenv("RUNTIME_DIRECTORY");
  size_t max = sizeof(((struct sockaddr_un *)0)->sun_path);
  int n;
  if (max > buflen) max = buflen;
  *is_run_dir = 0;
  if (explicit_path && explicit_path[0]) {
    n = snprintf(buf, max, "%s", explicit_path);
  } else {
    *is_run_dir = 1;
    if (run_dir && run_dir[0])
      n = snprintf(buf, max, "%s/console.sock", run_dir);
    else if (rt && rt[0])
      n = snprintf(buf, max, "%s/console.sock", rt);
    else
      n = snprintf(buf, max, "%s/var/run/console.sock", root_dir ? root_dir : ".");
  }
  if (n < 0 || (size_t)n >= max) {
    snprintf(err, errlen,
             "console socket path is too long for a Unix socket (at most %zu bytes): "
             "set MG_CONSOLE_SOCKET or MG_RUN_DIR to a shorter path", max - 1);
    return -1;
  }
  return 0;
}

void qtg_console_frame_header(unsigned char hdr[5], int type, size_t len) {
  uint32_t n = (uint32_t)(len + 1);
  hdr[0] = (unsigned char)(n >> 24);
  hdr[1] = (unsigned char)(n >> 16);
  hdr[2] = (unsigned char)(n >> 8);
  hdr[3] = (unsigned char)n;
  hdr[4] = (unsigned char)type;
}

/* ---- sessions: output ---------------------------------------------------- */

static void qtg_console_drop(qtg_console_session *sess, const char *why);
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
static int qtg_console_send(qtg_console_session *sess, int type, const char *data, size_t len) {
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

static void qtg_console_unlink(qtg_console_session *sess) {
  struct qtg_console *c = sess->console;
  if (!c) return;
  if (sess->prev) sess->prev->next = sess->next;
  if (sess->next) sess->next->prev = sess->prev;
  if (c->sessions == sess) c->sessions = sess->next;
  c->nsessions--;
  sess->console = NULL;
  sess->next = sess->prev = NULL;
}

/* Free the session once nothing refers to it any more.  Lua references are
 * dropped here only while the console is open; qtg_console_close drops them
 * itself, since close callbacks may run after the Lua state is gone. */
static void qtg_console_maybe_free(qtg_console_session *sess) {
  if (sess->pipe_open || sess->busy) return;
  if (sess->console && sess->table_ref != LUA_NOREF) qtg_unref(sess->host->L, sess->table_ref);
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
static void qtg_console_drop(qtg_console_session *sess, const char *why) {
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
  if (sess->task && qtg_task_waiting(sess->task))
    qtg_task_interrupt(sess->task);
  else if (sess->busy)
    sess->interrupt_pending = 1;
}

/* Send a fatal message and drop the session. */
static void qtg_console_refuse(qtg_console_session *sess, const char *msg) {
  qtg_console_send(sess, QTG_CONSOLE_FATAL, msg, strlen(msg));
  qtg_console_drop(sess, msg);
}

/* ---- the guard: interrupting Lua that never yields ------------------------
 *
 * A command that computes without doing I/O never gives the loop back, so
 * its client's interrupt frame would never be read.  While a command runs,
 * a count hook looks at the client's socket itself (without blocking, at
 * most every GUARD_PERIOD) and raises "interrupted" when an interrupt frame
 * or the end of the connection is there.  Console chunks run interpreted
 * (qtg.console.eval turns the JIT off for them) since LuaJIT's compiled
 * code does not call hooks.  LuaJIT has one hook for the whole VM: it is
 * installed when a command starts and removed when the last one ends,
 * unless someone else's hook replaced it meanwhile. */

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

static void qtg_console_guard_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  qtg_host *h = qtg_host_from_lua(L);
  struct qtg_console *c = h ? h->console : NULL;
  if (!c) return;
  qtg_console_session *sess = c->sessions;
  while (sess && sess->thread != L) sess = sess->next;
  if (!sess) return;
  uint64_t now = uv_hrtime();
  if (sess->seen_iteration != c->iterations) {   /* the loop ran since: a new burst */
    sess->seen_iteration = c->iterations;
    sess->burst_start = now;
  }
  if (now - sess->burst_start > QTG_CONSOLE_MAX_BUSY_NS) {
    sess->burst_start = now;
    qtg_raise(L, "interrupted", "the command ran %d s without giving the loop back (no worker, "
              "console or signal is served meanwhile)", (int)(QTG_CONSOLE_MAX_BUSY_NS / 1000000000ull));
  }
  if (now - sess->last_look < QTG_CONSOLE_GUARD_PERIOD_NS) return;
  sess->last_look = now;
  qtg_console_look(sess);
  if (sess->interrupt_pending || sess->dropping) {
    sess->interrupt_pending = 0;
    qtg_raise(L, "interrupted", sess->dropping ? "the console went away" : "stopped by the operator");
  }
}

static void qtg_console_unguard(qtg_console_session *sess) {
  lua_State *T = sess->thread;
  sess->thread = NULL;
  struct qtg_console *c = sess->console;
  if (!T || !c) return;
  for (qtg_console_session *s = c->sessions; s; s = s->next)
    if (s->thread) return;                /* another command still runs */
  if (lua_gethook(T) == qtg_console_guard_hook) lua_sethook(T, NULL, 0, 0);
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

static void qtg_console_unguard(qtg_console_session *sess);

static void qtg_console_task_done(qtg_task *t, int ok, int nres, void *data) {
  qtg_console_session *sess = data;
  lua_State *T = qtg_task_thread(t);
  qtg_console_unguard(sess);
  sess->task = NULL;
  sess->busy = 0;
  sess->interrupt_pending = 0;
  if (sess->dropping) {
    qtg_console_maybe_free(sess);
    return;
  }
  const char *text = NULL;
  size_t len = 0;
  int type = QTG_CONSOLE_ERROR;
  if (!ok) {
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
  /* The task may already have finished (it ran until its first yield). */
  if (sess->busy) sess->task = t;
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
    if (!sess->busy) return;            /* nothing runs: ignored */
    if (sess->task && qtg_task_waiting(sess->task))
      qtg_task_interrupt(sess->task);   /* the host abandons the wait */
    else
      sess->interrupt_pending = 1;      /* running Lua: the guard hook raises */
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

static void qtg_console_accept(uv_stream_t *server, int status) {
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
  if (c->nsessions > QTG_CONSOLE_MAX_SESSIONS) {
    qtg_console_refuse(sess, "refused: too many console sessions are open");
    return;
  }
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

/* ---- binding the socket ----------------------------------------------------- */

/* Create missing directories of path's parent (0700 for the ones we make)
 * and, when it is the run directory, make that directory 0700. */
static int qtg_console_prepare_dir(const char *path, int is_run_dir, char *err, size_t errlen) {
  char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash) return 0;           /* relative name in the working directory */
  if (slash == dir) return 0;     /* in / */
  *slash = 0;
  for (char *p = dir + 1; ; p++) {
    if (*p == '/' || *p == 0) {
      char saved = *p;
      *p = 0;
      if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot create the console directory %s: %s", dir, strerror(errno));
        return -1;
      }
      *p = saved;
      if (!saved) break;
    }
  }
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "console directory %s is not a directory", dir);
    return -1;
  }
  if (is_run_dir && (st.st_mode & 077)) {
    if (st.st_uid != geteuid()) {
      snprintf(err, errlen, "run directory %s is open to others and not ours to restrict (mode %03o)",
               dir, (unsigned)(st.st_mode & 0777));
      return -1;
    }
    if (chmod(dir, 0700) != 0) {
      snprintf(err, errlen, "cannot make %s mode 0700: %s", dir, strerror(errno));
      return -1;
    }
  }
  return 0;
}

/* A socket file left by a daemon that died is removed; one that answers is
 * another live daemon's, and anything that is not a socket is left alone. */
static int qtg_console_clear_stale(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
  if (!S_ISSOCK(st.st_mode)) {
    snprintf(err, errlen, "%s exists and is not a socket; not touching it", path);
    return -1;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    return -1;
  }
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
  int e = errno;
  close(fd);
  if (rc == 0) {
    snprintf(err, errlen,
             "console socket %s is in use by another running qtgd; give this one its own "
             "MG_CONSOLE_SOCKET (or MG_RUN_DIR), or set MG_CONSOLE_ENABLED=false", path);
    return -1;
  }
  if (e != ECONNREFUSED) {
    snprintf(err, errlen, "cannot probe the old console socket %s: %s", path, strerror(e));
    return -1;
  }
  if (unlink(path) != 0) {
    snprintf(err, errlen, "cannot remove the stale console socket %s: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

static void qtg_console_iteration(uv_prepare_t *p) {
  struct qtg_console *c = p->data;
  c->iterations++;
}

static int qtg_console_listen(struct qtg_console *c, char *err, size_t errlen) {
  qtg_host *h = c->host;
  if (!c->prepare_open) {
    if (uv_prepare_init(h->loop, &c->prepare) != 0) {
      snprintf(err, errlen, "console: cannot create its loop watcher");
      return -1;
    }
    c->prepare.data = c;
    c->prepare_open = 1;
    uv_prepare_start(&c->prepare, qtg_console_iteration);
    uv_unref((uv_handle_t *)&c->prepare);   /* never keeps the loop alive */
  }
  if (qtg_console_prepare_dir(c->path, c->is_run_dir, err, errlen) != 0) return -1;
  if (qtg_console_clear_stale(c->path, err, errlen) != 0) return -1;
  int rc = uv_pipe_init(h->loop, &c->server, 0);
  if (rc < 0) {
    snprintf(err, errlen, "console: %s", uv_strerror(rc));
    return -1;
  }
  c->server.data = c;
  c->listening = 1;
  /* The socket is born 0600: the umask covers the window before chmod. */
  mode_t old = umask(0177);
  rc = uv_pipe_bind(&c->server, c->path);
  umask(old);
  if (rc < 0) {
    snprintf(err, errlen, "cannot bind the console socket %s: %s", c->path, uv_strerror(rc));
    return -1;
  }
  c->bound = 1;
  if (chmod(c->path, 0600) != 0) {
    snprintf(err, errlen, "cannot make %s mode 0600: %s", c->path, strerror(errno));
    return -1;
  }
  rc = uv_listen((uv_stream_t *)&c->server, 16, qtg_console_accept);
  if (rc < 0) {
    snprintf(err, errlen, "cannot listen on %s: %s", c->path, uv_strerror(rc));
    return -1;
  }
  return 0;
}

static void qtg_console_maybe_free_console(struct qtg_console *c) {
  if (c->free_on_close && !c->server_closing && !c->prepare_open) free(c);
}

static void qtg_console_server_closed(uv_handle_t *handle) {
  struct qtg_console *c = handle->data;
  c->server_closing = 0;
  qtg_console_maybe_free_console(c);
}

static void qtg_console_prepare_closed(uv_handle_t *handle) {
  struct qtg_console *c = handle->data;
  c->prepare_open = 0;
  qtg_console_maybe_free_console(c);
}

/* Stop listening and drop every session; with free_it (the subsystem's
 * close) the struct is freed too, once the listener's handle is closed. */
static void qtg_console_shutdown_all(struct qtg_console *c, int free_it) {
  lua_State *L = c->host->L;
  c->closing = free_it;
  while (c->sessions) {
    qtg_console_session *sess = c->sessions;
    if (sess->table_ref != LUA_NOREF && L) {
      qtg_unref(L, sess->table_ref);
      sess->table_ref = LUA_NOREF;
    }
    if (!sess->dropping) qtg_console_drop(sess, "console closed");
    qtg_console_unlink(sess);          /* the session outlives the console */
    if (free_it && sess->task) {
      /* Still running after the interrupt: Lua goes away next, so the
       * task will never report; forget it and let the close free us. */
      sess->task = NULL;
      sess->busy = 0;
    }
  }
  if (c->handler_ref != LUA_NOREF && L) {
    qtg_unref(L, c->handler_ref);
    c->handler_ref = LUA_NOREF;
  }
  if (c->bound) {
    unlink(c->path);
    c->bound = 0;
  }
  c->free_on_close = free_it;
  if (free_it && c->prepare_open && !uv_is_closing((uv_handle_t *)&c->prepare))
    uv_close((uv_handle_t *)&c->prepare, qtg_console_prepare_closed);
  if (c->listening) {
    c->listening = 0;
    c->server_closing = 1;
    uv_close((uv_handle_t *)&c->server, qtg_console_server_closed);
  } else {
    qtg_console_maybe_free_console(c);
  }
}

/* ---- subsystem ------------------------------------------------------------ */

int qtg_console_open(qtg_host *h, char *err, size_t errlen) {
  h->console = NULL;
  if (!qtg_settings_bool(h->settings, QTG_S_CONSOLE_ENABLED)) return 0;
  struct qtg_console *c = calloc(1, sizeof *c);
  if (!c) {
    snprintf(err, errlen, "console: out of memory");
    return -1;
  }
  c->host = h;
  c->handler_ref = LUA_NOREF;
  if (qtg_console_socket_path(h->settings, h->root_dir, c->path, sizeof c->path, &c->is_run_dir,
                              err, errlen) != 0) {
    free(c);
    return -1;
  }
  h->console = c;
  return 0;
}

void qtg_console_close(qtg_host *h) {
  struct qtg_console *c = h->console;
  if (!c) return;
  h->console = NULL;
  qtg_console_shutdown_all(c, 1);
}

/* ---- the Lua module qtg.console_server -------------------------------------- */

static struct qtg_console *qtg_console_check(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  if (!h || !h->console)
    qtg_raise(L, "usage", "the console is disabled (MG_CONSOLE_ENABLED=false) in this process");
  return h->console;
}

static const char qtg_console_trampoline[] =
    "local session, kind, payload = ...\n"
    "require('qtg').console_server.guard(session.id)\n"
    "return require('qtg.console').handle(session, kind, payload)\n";

/* start() -> socket path.  Binds and listens; raises on any failure. */
static int qtg_console_lua_start(lua_State *L) {
  struct qtg_console *c = qtg_console_check(L);
  char err[512] = "";
  if (c->listening) return qtg_raise(L, "usage", "the console is already listening on %s", c->path);
  if (c->server_closing)
    return qtg_raise(L, "usage", "the console is still closing; try again in a moment");
  /* Load the Lua side first: a broken console module fails here, loudly. */
  lua_getglobal(L, "require");
  lua_pushliteral(L, "qtg.console");
  if (lua_pcall(L, 1, 1, 0) != 0)
    return qtg_raise(L, "console", "cannot load qtg.console: %s", lua_tostring(L, -1));
  lua_pop(L, 1);
  if (luaL_loadbuffer(L, qtg_console_trampoline, sizeof qtg_console_trampoline - 1,
                      "=console") != 0)
    return qtg_raise(L, "console", "%s", lua_tostring(L, -1));
  c->handler_ref = qtg_ref(L);
  if (qtg_console_listen(c, err, sizeof err) != 0) {
    qtg_unref(L, c->handler_ref);
    c->handler_ref = LUA_NOREF;
    if (c->bound) unlink(c->path);
    c->bound = 0;
    if (c->listening) {
      c->listening = 0;
      c->server_closing = 1;
      uv_close((uv_handle_t *)&c->server, qtg_console_server_closed);
    }
    return qtg_raise(L, "console", "%s", err);
  }
  qtg_log_fields(QTG_LOG_INFO, "console listening", (const char *const[]){"socket", c->path, NULL});
  lua_pushstring(L, c->path);
  return 1;
}

/* stop(): stop listening and end every session (idempotent). */
static int qtg_console_lua_stop(lua_State *L) {
  struct qtg_console *c = qtg_console_check(L);
  qtg_console_shutdown_all(c, 0);
  return 0;
}

static qtg_console_session *qtg_console_find(struct qtg_console *c, uint64_t id) {
  for (qtg_console_session *s = c->sessions; s; s = s->next)
    if (s->id == id) return s;
  return NULL;
}

/* write(session_id, type, text) -> true, or false when the session is gone. */
static int qtg_console_lua_write(lua_State *L) {
  struct qtg_console *c = qtg_console_check(L);
  lua_Number id = luaL_checknumber(L, 1);
  size_t tl, len;
  const char *type = luaL_checklstring(L, 2, &tl);
  const char *text = luaL_checklstring(L, 3, &len);
  if (tl != 1 || type[0] != QTG_CONSOLE_OUTPUT)
    return luaL_argerror(L, 2, "only 'o' (output) frames may be written from Lua");
  qtg_console_session *sess = id > 0 ? qtg_console_find(c, (uint64_t)id) : NULL;
  int ok = sess && !sess->dropping;
  while (ok && len > 0) {
    size_t n = len < QTG_CONSOLE_MAX_FRAME_OUT - 1 ? len : QTG_CONSOLE_MAX_FRAME_OUT - 1;
    ok = qtg_console_send(sess, type[0], text, n) == 0;
    text += n;
    len -= n;
  }
  lua_pushboolean(L, ok);
  return 1;
}

/* sessions() -> array of {id, uid, pid, busy, queued}. */
static int qtg_console_lua_sessions(lua_State *L) {
  struct qtg_console *c = qtg_console_check(L);
  lua_newtable(L);
  int i = 0;
  for (qtg_console_session *s = c->sessions; s; s = s->next) {
    if (s->dropping) continue;
    lua_createtable(L, 0, 5);
    lua_pushnumber(L, (lua_Number)s->id);
    lua_setfield(L, -2, "id");
    lua_pushnumber(L, (lua_Number)s->uid);
    lua_setfield(L, -2, "uid");
    lua_pushnumber(L, (lua_Number)s->pid);
    lua_setfield(L, -2, "pid");
    lua_pushboolean(L, s->busy);
    lua_setfield(L, -2, "busy");
    lua_pushinteger(L, s->queued);
    lua_setfield(L, -2, "queued");
    lua_rawseti(L, -2, ++i);
  }
  return 1;
}

/* guard(session_id): called first by every command, on its own thread:
 * arms the guard hook for it (see "the guard" above). */
static int qtg_console_lua_guard(lua_State *L) {
  struct qtg_console *c = qtg_console_check(L);
  lua_Number id = luaL_checknumber(L, 1);
  qtg_console_session *sess = id > 0 ? qtg_console_find(c, (uint64_t)id) : NULL;
  if (!sess || !sess->busy) return 0;
  sess->thread = L;
  sess->last_look = sess->burst_start = uv_hrtime();
  sess->seen_iteration = c->iterations;
  if (lua_gethook(L) != qtg_console_guard_hook)
    lua_sethook(L, qtg_console_guard_hook, LUA_MASKCOUNT, QTG_CONSOLE_GUARD_COUNT);
  return 0;
}

/* path() -> the socket path (whether or not it is listening), listening. */
static int qtg_console_lua_path(lua_State *L) {
  struct qtg_console *c = qtg_console_check(L);
  lua_pushstring(L, c->path);
  lua_pushboolean(L, c->listening);
  return 2;
}

static int qtg_console_lua_enabled(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  lua_pushboolean(L, h && h->console);
  return 1;
}

static const luaL_Reg qtg_console_funcs[] = {
    {"start", qtg_console_lua_start},     {"stop", qtg_console_lua_stop},
    {"write", qtg_console_lua_write},     {"sessions", qtg_console_lua_sessions},
    {"path", qtg_console_lua_path},       {"enabled", qtg_console_lua_enabled},
    {"guard", qtg_console_lua_guard},
    {NULL, NULL},
};

int luaopen_qtg_console_server(lua_State *L) {
  lua_newtable(L);
  luaL_register(L, NULL, qtg_console_funcs);
  lua_pushinteger(L, QTG_CONSOLE_MAX_FRAME_IN);
  lua_setfield(L, -2, "max_frame_in");
  lua_pushinteger(L, QTG_CONSOLE_MAX_FRAME_OUT);
  lua_setfield(L, -2, "max_frame_out");
  return 1;
}
