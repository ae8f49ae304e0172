/* qtg_console.c -- the console server's socket and its place in the host:
 * where the socket lives, binding it safely (0600 in a run directory of at
 * most 0750, stale sockets cleared, a live one refused), the subsystem's
 * open/close, and the Lua module qtg.console_server (start, stop, write,
 * sessions, guard).  One connection's life is in qtg_console_session.c; the
 * wire format is in qtg_console.h and docs/console.md.
 *
 * Who reaches the console: root and the daemon's own uid.  Three things
 * hold it: the socket file is 0600 (connect needs write on it), every
 * peer's uid is read with SO_PEERCRED and any other is refused
 * (qtg_console_accept), and no one else may write in its directory (a
 * root-owned sticky one aside), so no one can put their own socket in its
 * place.  The run directory is not narrowed below 0750 (qtgd.service's
 * RuntimeDirectoryMode): the API's Unix socket may live there too
 * (MG_API_LISTEN=unix:/run/qtg/api.sock, 0660), and the daemon's group
 * must reach it.  Search on the directory gives the group nothing of the
 * console: its socket's mode and the uid check keep it out.  A directory
 * qtgd makes itself is made 0700; give it 0750 to share it with the API.
 *
 * qtg_console_close runs while Lua still exists: it drops every Lua
 * reference at once; the handles' close callbacks free the C memory later
 * without touching Lua.
 */
#include "qtg_console_session.h"

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
#include "qtg_prelude.h"

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
    else if (root_dir && strcmp(root_dir, QTG_INSTALL_DATADIR) == 0)
      n = snprintf(buf, max, "%s/console.sock", QTG_PACKAGED_RUN_DIR);   /* qtgd.service's */
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

/* ---- binding the socket ----------------------------------------------------- */

/* dir's parent is ours or root's and writable by no one else (a root-owned
 * sticky one aside: nobody can rename what is not theirs in it). */
static int qtg_console_check_parent(const char *dir, const char *what, const char *setting, char *err,
                                    size_t errlen) {
  char parent[sizeof(((struct sockaddr_un *)0)->sun_path)];
  snprintf(parent, sizeof parent, "%s", dir);
  char *slash = strrchr(parent, '/');
  if (!slash) snprintf(parent, sizeof parent, ".");
  else if (slash == parent) slash[1] = '\0';
  else *slash = '\0';
  struct stat st;
  if (stat(parent, &st) != 0) {
    snprintf(err, errlen, "cannot stat %s, the parent of the %s %s: %s", parent, what, dir, strerror(errno));
    return -1;
  }
  int sticky_root = st.st_uid == 0 && (st.st_mode & S_ISVTX);
  if ((st.st_uid != geteuid() && st.st_uid != 0) ||
      ((st.st_mode & (S_IWGRP | S_IWOTH)) && !sticky_root)) {
    snprintf(err, errlen, "%s %s (%s): its parent %s is owned by uid %lu with mode %04o, so another user "
             "could put a directory of their own in its place; use a directory whose parents only this "
             "user or root can write", what, dir, setting, parent, (unsigned long)st.st_uid,
             (unsigned)(st.st_mode & 07777));
    return -1;
  }
  return 0;
}

/* Create missing directories of path's parent (0700 for the ones we make)
 * and, when it is the run directory, narrow it to at most 0750 (see the
 * header comment). */
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
  /* The socket's directory must be ours or root's, and so must its parent,
   * writable by no one else (a root-owned sticky one, /tmp, aside): else
   * another user could replace the socket, or the directory, with one of
   * their own and take the commands a console client sends (the client
   * trusts the owner of a directory only that owner can write).  The run
   * directory is held to it too: its default signer socket lives there. */
  const char *what = is_run_dir ? "run directory" : "console directory";
  const char *setting = is_run_dir ? "MG_RUN_DIR" : "MG_CONSOLE_SOCKET";
  if (st.st_uid != geteuid() && st.st_uid != 0) {
    snprintf(err, errlen, "%s %s (%s) is owned by uid %lu, not by this user or root: its owner could "
             "replace the sockets in it", what, dir, setting, (unsigned long)st.st_uid);
    return -1;
  }
  if (qtg_console_check_parent(dir, what, setting, err, errlen) != 0) return -1;
  if (!is_run_dir && (st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_uid == 0 && (st.st_mode & S_ISVTX))) {
    snprintf(err, errlen, "console directory %s (MG_CONSOLE_SOCKET) is writable by others (mode %04o): "
             "another user could replace the socket; use a directory only this user can write",
             dir, (unsigned)(st.st_mode & 07777));
    return -1;
  }
  /* The run directory: group write (anyone of the group could replace the
   * socket) and every bit for others are taken away when it is ours, and
   * refused when it is not; group read and search stay, for the API's
   * socket beside ours.  A set-group-ID bit stays too: it gives that socket
   * the directory's group. */
  if (is_run_dir && (st.st_mode & 027)) {
    if (st.st_uid != geteuid()) {
      snprintf(err, errlen, "run directory %s is writable by its group or open to others, and not "
               "ours to restrict (mode %03o)",
               dir, (unsigned)(st.st_mode & 0777));
      return -1;
    }
    mode_t narrowed = st.st_mode & (S_ISGID | 0750);
    if (chmod(dir, narrowed) != 0) {
      snprintf(err, errlen, "cannot make %s mode %04o: %s", dir, (unsigned)narrowed, strerror(errno));
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
    if (free_it && sess->busy) {
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
  c->busy_limit_ns = (uint64_t)(qtg_settings_num(h->settings, QTG_S_CONSOLE_BUSY_LIMIT_SECONDS) * 1e9);
  c->idle_ns = (uint64_t)(qtg_settings_num(h->settings, QTG_S_CONSOLE_IDLE_SECONDS) * 1e9);
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
  if (qtg_prelude_load(L, QTG_PRELUDE_console) != 0)
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
  if (sess && sess->busy) qtg_console_guard(sess, L);
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
