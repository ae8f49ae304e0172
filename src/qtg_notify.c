/* qtg_notify.c -- readiness for systemd without libsystemd: sd_notify is one
 * datagram to the Unix socket named by $NOTIFY_SOCKET ("/path", or "@name"
 * for the abstract namespace).  Without $NOTIFY_SOCKET it is a no-op, so the
 * same binary runs under systemd (Type=notify), in a terminal and in tests.
 *
 * Why here and not libsystemd: the protocol is stable and tiny, and one
 * fewer shared library keeps the package's dependencies to what qtgd
 * really uses.  The socket is opened and closed per message (a handful per
 * process lifetime: READY=1, RELOADING=1, STOPPING=1), so nothing is kept.
 *
 * Lua: qtg.systemd.notify(msg) -> true (sent) | false (no NOTIFY_SOCKET)
 *      | nil, {kind="notify", message=...};
 *      qtg.systemd.socket() -> the $NOTIFY_SOCKET value or nil;
 *      qtg.systemd.monotonic_usec() -> CLOCK_MONOTONIC in microseconds (the
 *      MONOTONIC_USEC= field systemd wants next to RELOADING=1).
 *
 * The watchdog (subsystem `watchdog`): when systemd set $WATCHDOG_USEC (the
 * unit's WatchdogSec=) for this process ($WATCHDOG_PID unset or ours), a
 * loop timer sends WATCHDOG=1 every half of it.  A timer fires only when
 * the loop turns, so a daemon stuck in Lua that never yields (or in a
 * blocking call) stops pinging and systemd restarts it; nothing is sent
 * from a thread or a signal, which would ping for a wedged loop. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "qtg_host.h"
#include "qtg_log.h"
#include "qtg_notify.h"

int qtg_notify_send(const char *msg, size_t len, char *err, size_t errlen) {
  const char *path = getenv("NOTIFY_SOCKET");
  if (!path || !path[0]) return 0;
  if (len == 0 || memchr(msg, '\0', len)) {
    snprintf(err, errlen, "a notify message must be non-empty text without NUL bytes");
    return -1;
  }
  if (path[0] != '/' && path[0] != '@') {
    snprintf(err, errlen, "NOTIFY_SOCKET=%s: only Unix socket paths (/...) and abstract names (@...) are supported",
             path);
    return -1;
  }
  struct sockaddr_un sa;
  size_t plen = strlen(path);
  if (plen >= sizeof sa.sun_path) {
    snprintf(err, errlen, "NOTIFY_SOCKET is too long (%zu bytes, at most %zu)", plen, sizeof sa.sun_path - 1);
    return -1;
  }
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  memcpy(sa.sun_path, path, plen);
  if (path[0] == '@') sa.sun_path[0] = '\0';
  socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + plen + (path[0] == '/' ? 1 : 0));
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(err, errlen, "cannot open a datagram socket: %s", strerror(errno));
    return -1;
  }
  ssize_t n;
  do {
    n = sendto(fd, msg, len, MSG_NOSIGNAL | MSG_DONTWAIT, (const struct sockaddr *)&sa, salen);
  } while (n < 0 && errno == EINTR);
  int saved = errno;
  if (close(fd) != 0 && n >= 0) {
    snprintf(err, errlen, "closing the notify socket: %s", strerror(errno));
    return -1;
  }
  if (n < 0) {
    snprintf(err, errlen, "cannot notify %s: %s", path, strerror(saved));
    return -1;
  }
  if ((size_t)n != len) {
    snprintf(err, errlen, "short notify datagram to %s (%zd of %zu bytes)", path, n, len);
    return -1;
  }
  return 1;
}

/* ---- the watchdog ------------------------------------------------------------ */

struct qtg_watchdog {
  uv_timer_t timer;
  int failing;                    /* the last ping failed (logged once) */
};

static void qtg_watchdog_ping(uv_timer_t *timer) {
  struct qtg_watchdog *w = timer->data;
  static const char ping[] = "WATCHDOG=1";
  char err[256];
  if (qtg_notify_send(ping, sizeof ping - 1, err, sizeof err) < 0) {
    if (!w->failing) qtg_log_error("sd_notify WATCHDOG=1: %s", err);
    w->failing = 1;
  } else {
    w->failing = 0;
  }
}

/* The watchdog interval in microseconds systemd asked this process for, or
 * 0 (none, not ours, or not a number). */
static unsigned long long qtg_watchdog_usec(void) {
  const char *usec = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
  if (!usec || !usec[0] || !getenv("NOTIFY_SOCKET")) return 0;
  if (pid && pid[0]) {
    char *end;
    errno = 0;
    long p = strtol(pid, &end, 10);
    if (errno || *end || p != (long)getpid()) return 0;
  }
  char *end;
  errno = 0;
  unsigned long long v = strtoull(usec, &end, 10);
  if (errno || *end || usec[0] == '-') return 0;
  return v;
}

int qtg_watchdog_open(qtg_host *h, char *err, size_t errlen) {
  h->watchdog = NULL;
  unsigned long long usec = qtg_watchdog_usec();
  if (usec == 0) return 0;
  struct qtg_watchdog *w = calloc(1, sizeof *w);
  if (!w || uv_timer_init(h->loop, &w->timer) != 0) {
    free(w);
    snprintf(err, errlen, "watchdog: cannot create its timer");
    return -1;
  }
  w->timer.data = w;
  uint64_t every = usec / 2000 ? usec / 2000 : 1;     /* half the interval, in ms */
  uv_timer_start(&w->timer, qtg_watchdog_ping, 0, every);
  uv_unref((uv_handle_t *)&w->timer);                  /* never keeps the loop alive */
  h->watchdog = w;
  return 0;
}

static void qtg_watchdog_closed(uv_handle_t *handle) { free(handle->data); }

void qtg_watchdog_close(qtg_host *h) {
  struct qtg_watchdog *w = h->watchdog;
  if (!w) return;
  h->watchdog = NULL;
  uv_close((uv_handle_t *)&w->timer, qtg_watchdog_closed);
}

/* ---- Lua ------------------------------------------------------------------ */

static int qtg_lua_systemd_notify(lua_State *L) {
  size_t len;
  const char *msg = luaL_checklstring(L, 1, &len);
  char err[256];
  int rc = qtg_notify_send(msg, len, err, sizeof err);
  if (rc < 0) {
    lua_pushnil(L);
    qtg_push_error(L, "notify", "%s", err);
    return 2;
  }
  lua_pushboolean(L, rc == 1);
  return 1;
}

static int qtg_lua_systemd_socket(lua_State *L) {
  const char *path = getenv("NOTIFY_SOCKET");
  if (path && path[0]) lua_pushstring(L, path);
  else lua_pushnil(L);
  return 1;
}

static int qtg_lua_systemd_monotonic_usec(lua_State *L) {
  struct timespec ts;
  if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) return qtg_raise(L, "notify", "clock_gettime: %s", strerror(errno));
  char buf[32];
  snprintf(buf, sizeof buf, "%lld", (long long)ts.tv_sec * 1000000LL + (long long)(ts.tv_nsec / 1000));
  lua_pushstring(L, buf); /* a string: exact, whatever the size */
  return 1;
}

int luaopen_qtg_systemd(lua_State *L) {
  static const luaL_Reg funcs[] = {
    {"notify", qtg_lua_systemd_notify},
    {"socket", qtg_lua_systemd_socket},
    {"monotonic_usec", qtg_lua_systemd_monotonic_usec},
    {NULL, NULL},
  };
  lua_newtable(L);
  luaL_register(L, NULL, funcs);
  return 1;
}
