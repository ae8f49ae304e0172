/* lua_api_net.c -- qtg.api_net.resolve(host[, seconds]) (yields): the
 * addresses a host name resolves to, so the API can refuse a callback_url
 * whose name points into the operator's network (lua/qtg/api/ssrf.lua).
 * The lookup is c-ares's (ares_getaddrinfo: /etc/hosts, then DNS, as
 * resolv.conf and nsswitch.conf say), driven on the host's loop: its
 * sockets are polled by uv_poll handles and its retransmissions by a timer,
 * so a lookup holds no thread.  glibc's getaddrinfo, on libuv's thread
 * pool, held one until the resolver gave up (5 s x 2 attempts x each
 * server): a few names whose DNS never answers filled the pool's lookup
 * half, every other lookup queued behind them, and the host's close waited
 * for them.  The task waits for `seconds` at most (a number > 0 and <= 600;
 * default QTG_RESOLVE_DEFAULT_SECONDS, 10).
 *
 * Returns an array of numeric addresses ("10.0.0.5", "fe80::1"), or nil,
 * err: {kind="dns", message=} when the name does not resolve,
 * {kind="timeout", message="name lookup of HOST took longer than N s"}
 * when the deadline passed first, {kind="interrupted"} when the task was
 * interrupted.  A host that is not a name of 1 to 253 bytes raises a
 * Lua argument error; seconds that are not a number in (0, 600] raise
 * {kind="usage"}.
 *
 * One record per lookup holds its own c-ares channel (so each lookup reads
 * resolv.conf afresh and ends alone), the deadline's timer, c-ares's timer
 * and a poll handle per socket c-ares opens.  c-ares's answer only stores
 * the result in the record; the code that called into c-ares acts on it
 * once c-ares has returned (c-ares must not be destroyed from within its
 * own callbacks).  The first of four ends the task's wait: the answer, the
 * deadline, an interrupt (cancel), the host's close (qtg_api_net_close, a
 * subsystem row in qtg_modules.h: its pending lookups are dropped, no task
 * resumed).  That end unlists the record, destroys the channel (which
 * closes its sockets, through the socket-state callback their poll
 * handles) and closes the timers.  The record is freed once every handle's
 * close callback has run.  Nothing resumes a task once the host closes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <ares.h>

#include "qtg_host.h"
#include "qtg_modules_decl.h"

#define QTG_RESOLVE_DEFAULT_SECONDS 10.0
#define QTG_RESOLVE_MAX_SECONDS 600.0
#define QTG_RESOLVE_HOST_MAX 253
#define QTG_RESOLVE_NO_ANSWER (-1)

struct qtg_resolve_req;

/* A socket c-ares asked to have polled. */
typedef struct qtg_resolve_socket {
  uv_poll_t poll;
  ares_socket_t fd;
  struct qtg_resolve_req *r;
  struct qtg_resolve_socket *next;
} qtg_resolve_socket;

typedef struct qtg_resolve_req {
  ares_channel channel;          /* NULL once destroyed */
  uv_timer_t deadline;           /* the caller's bound on the wait */
  uv_timer_t retry;              /* c-ares's next timeout (ares_timeout) */
  qtg_resolve_socket *sockets;   /* polled for c-ares */
  int handles;                   /* timers and polls not yet closed */
  qtg_host *h;
  qtg_task *task;                /* waiting on this lookup; NULL once its wait ended */
  int listed;                    /* on h->resolves */
  int answered;                  /* c-ares's status, QTG_RESOLVE_NO_ANSWER until it came */
  struct ares_addrinfo *answer;  /* c-ares's result, freed at the end */
  double seconds;
  struct qtg_resolve_req *prev, *next;
  char host[QTG_RESOLVE_HOST_MAX + 1];
} qtg_resolve_req;

/* Freed when the channel is gone and every handle has closed. */
static void qtg_resolve_release(qtg_resolve_req *r) {
  if (r->channel == NULL && r->handles == 0) free(r);
}

static void qtg_resolve_timer_closed(uv_handle_t *handle) {
  qtg_resolve_req *r = handle->data;
  r->handles--;
  qtg_resolve_release(r);
}

static void qtg_resolve_socket_closed(uv_handle_t *handle) {
  qtg_resolve_socket *s = handle->data;
  qtg_resolve_req *r = s->r;
  free(s);
  r->handles--;
  qtg_resolve_release(r);
}

static void qtg_resolve_step(qtg_resolve_req *r);

static void qtg_resolve_socket_ready(uv_poll_t *poll, int status, int events) {
  qtg_resolve_socket *s = poll->data;
  qtg_resolve_req *r = s->r;
  /* An error on the socket: let c-ares read and write it to find out. */
  int all = status < 0;
  ares_socket_t rfd = (all || (events & UV_READABLE)) ? s->fd : ARES_SOCKET_BAD;
  ares_socket_t wfd = (all || (events & UV_WRITABLE)) ? s->fd : ARES_SOCKET_BAD;
  ares_process_fd(r->channel, rfd, wfd);
  qtg_resolve_step(r);
}

/* c-ares's socket-state callback: poll fd for what c-ares waits on, or stop
 * (readable and writable 0: c-ares closes it right after).  A socket that
 * cannot be polled leaves the lookup to its deadline. */
static void qtg_resolve_socket_state(void *data, ares_socket_t fd, int readable, int writable) {
  qtg_resolve_req *r = data;
  qtg_resolve_socket **at = &r->sockets;
  while (*at && (*at)->fd != fd) at = &(*at)->next;
  qtg_resolve_socket *s = *at;
  if (!readable && !writable) {
    if (s) {
      *at = s->next;
      uv_close((uv_handle_t *)&s->poll, qtg_resolve_socket_closed);
    }
    return;
  }
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s) return;
    if (uv_poll_init_socket(r->h->loop, &s->poll, fd) != 0) {
      free(s);
      return;
    }
    s->fd = fd;
    s->r = r;
    s->poll.data = s;
    s->next = r->sockets;
    r->sockets = s;
    r->handles++;
  }
  int events = (readable ? UV_READABLE : 0) | (writable ? UV_WRITABLE : 0);
  (void)uv_poll_start(&s->poll, events, qtg_resolve_socket_ready);
}

/* c-ares's answer (also ARES_EDESTRUCTION when the channel is destroyed
 * first): stored; acted on by whoever called into c-ares. */
static void qtg_resolve_answered(void *arg, int status, int timeouts, struct ares_addrinfo *res) {
  (void)timeouts;
  qtg_resolve_req *r = arg;
  r->answered = status;
  if (r->answer) ares_freeaddrinfo(r->answer);
  r->answer = res;
}

/* The task's wait is over (called once per lookup, never from inside
 * c-ares): unlist the record, destroy the channel, close the timers.  The
 * memory goes in qtg_resolve_release. */
static void qtg_resolve_end(qtg_resolve_req *r) {
  if (r->listed) {
    if (r->prev) r->prev->next = r->next;
    else r->h->resolves = r->next;
    if (r->next) r->next->prev = r->prev;
    r->prev = r->next = NULL;
    r->listed = 0;
  }
  r->task = NULL;
  ares_destroy(r->channel);        /* its sockets' polls close through the state callback */
  r->channel = NULL;
  if (r->answer) ares_freeaddrinfo(r->answer);
  r->answer = NULL;
  uv_close((uv_handle_t *)&r->deadline, qtg_resolve_timer_closed);
  uv_close((uv_handle_t *)&r->retry, qtg_resolve_timer_closed);
}

/* Pushes the lookup's result on L: the addresses (1 value) or nil, err (2). */
static int qtg_resolve_push_answer(lua_State *L, qtg_resolve_req *r) {
  if (r->answered != ARES_SUCCESS) {
    lua_pushnil(L);
    qtg_push_error(L, "dns", "cannot resolve: %s", ares_strerror(r->answered));
    return 2;
  }
  lua_newtable(L);
  int i = 0;
  for (struct ares_addrinfo_node *a = r->answer ? r->answer->nodes : NULL; a; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN];
    const void *src = NULL;
    if (a->ai_family == AF_INET) src = &((struct sockaddr_in *)a->ai_addr)->sin_addr;
    else if (a->ai_family == AF_INET6) src = &((struct sockaddr_in6 *)a->ai_addr)->sin6_addr;
    if (src && inet_ntop(a->ai_family, src, buf, sizeof buf)) {
      lua_pushstring(L, buf);
      lua_rawseti(L, -2, ++i);
    }
  }
  return 1;
}

/* After each call into c-ares: resume the task when the answer came, else
 * arm the timer for c-ares's next retransmission. */
static void qtg_resolve_retry_due(uv_timer_t *timer) {
  qtg_resolve_req *r = timer->data;
  ares_process_fd(r->channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
  qtg_resolve_step(r);
}

static void qtg_resolve_step(qtg_resolve_req *r) {
  if (r->answered == QTG_RESOLVE_NO_ANSWER) {
    struct timeval tv;
    if (ares_timeout(r->channel, NULL, &tv)) {
      uint64_t ms = (uint64_t)tv.tv_sec * 1000 + (uint64_t)(tv.tv_usec + 999) / 1000;
      (void)uv_timer_start(&r->retry, qtg_resolve_retry_due, ms, 0);
    } else {
      (void)uv_timer_stop(&r->retry);
    }
    return;
  }
  qtg_task *t = r->task;
  qtg_task_set_cancel(t, NULL, NULL);
  int n = qtg_resolve_push_answer(qtg_task_thread(t), r);
  qtg_resolve_end(r);
  qtg_task_resume(t, n);
}

/* Subsystem row (qtg_modules.h): c-ares's library state (reference counted
 * by c-ares, so a second host shares it). */
int qtg_api_net_open(qtg_host *h, char *err, size_t errlen) {
  h->resolves = NULL;
  int st = ares_library_init(ARES_LIB_INIT_ALL);
  if (st != ARES_SUCCESS) {
    snprintf(err, errlen, "c-ares: %s", ares_strerror(st));
    return -1;
  }
  return 0;
}

/* At host close, after the API, the console and the runtime closed (their
 * interrupts may still have ended waits the usual way) and before the Lua
 * state goes: drop every pending lookup, resuming no one.  The host runs
 * the loop afterwards: the handles' close callbacks run then and free the
 * records.  Nothing waits for a resolver. */
void qtg_api_net_close(qtg_host *h) {
  while (h->resolves) {
    qtg_resolve_req *r = h->resolves;
    qtg_task_set_cancel(r->task, NULL, NULL);
    qtg_resolve_end(r);
  }
  ares_library_cleanup();
}

static void qtg_resolve_timed_out(uv_timer_t *timer) {
  qtg_resolve_req *r = timer->data;
  qtg_task *t = r->task;
  char secs[32];
  snprintf(secs, sizeof secs, "%g", r->seconds);
  lua_State *co = qtg_task_thread(t);
  lua_pushnil(co);
  qtg_push_error(co, "timeout", "name lookup of %s took longer than %s s", r->host, secs);
  qtg_task_set_cancel(t, NULL, NULL);
  qtg_resolve_end(r);
  qtg_task_resume(t, 2);
}

static void qtg_resolve_cancel(qtg_task *t, void *arg) {
  qtg_resolve_req *r = arg;
  qtg_resolve_end(r);
  lua_State *co = qtg_task_thread(t);
  lua_pushnil(co);
  qtg_push_error(co, "interrupted", "name lookup interrupted");
  qtg_task_resume(t, 2);
}

static int qtg_api_net_resolve(lua_State *L) {
  size_t len;
  const char *host = luaL_checklstring(L, 1, &len);
  if (len == 0 || len > QTG_RESOLVE_HOST_MAX || memchr(host, 0, len))
    return luaL_argerror(L, 1, "a host name of 1 to 253 bytes");
  double seconds = QTG_RESOLVE_DEFAULT_SECONDS;
  if (!lua_isnoneornil(L, 2)) {
    if (lua_type(L, 2) != LUA_TNUMBER)
      return qtg_raise(L, "usage", "qtg.api_net.resolve: seconds must be a number, not a %s",
                       luaL_typename(L, 2));
    seconds = lua_tonumber(L, 2);
    if (!(seconds > 0 && seconds <= QTG_RESOLVE_MAX_SECONDS))
      return qtg_raise(L, "usage", "qtg.api_net.resolve: seconds must be > 0 and <= %d",
                       (int)QTG_RESOLVE_MAX_SECONDS);
  }
  qtg_task *t = qtg_task_check(L);
  qtg_host *h = qtg_host_from_lua(L);
  qtg_resolve_req *r = calloc(1, sizeof *r);
  if (!r) return luaL_error(L, "qtg.api_net.resolve: out of memory");
  r->h = h;
  r->seconds = seconds;
  r->answered = QTG_RESOLVE_NO_ANSWER;
  memcpy(r->host, host, len);
  r->host[len] = '\0';
  struct ares_options options;
  memset(&options, 0, sizeof options);
  options.sock_state_cb = qtg_resolve_socket_state;
  options.sock_state_cb_data = r;
  int st = ares_init_options(&r->channel, &options, ARES_OPT_SOCK_STATE_CB);
  if (st != ARES_SUCCESS) {
    free(r);
    lua_pushnil(L);
    qtg_push_error(L, "dns", "cannot resolve %s: cannot start a lookup: %s", host, ares_strerror(st));
    return 2;
  }
  if (uv_timer_init(h->loop, &r->deadline) != 0) {
    ares_destroy(r->channel);      /* no socket yet: no poll handle */
    free(r);
    return luaL_error(L, "qtg.api_net.resolve: cannot create a timer");
  }
  r->deadline.data = r;
  r->handles = 1;
  if (uv_timer_init(h->loop, &r->retry) != 0) {
    ares_destroy(r->channel);
    r->channel = NULL;
    uv_close((uv_handle_t *)&r->deadline, qtg_resolve_timer_closed);  /* frees r */
    return luaL_error(L, "qtg.api_net.resolve: cannot create a timer");
  }
  r->retry.data = r;
  r->handles = 2;
  struct ares_addrinfo_hints hints;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  ares_getaddrinfo(r->channel, r->host, NULL, &hints, qtg_resolve_answered, r);
  if (r->answered != QTG_RESOLVE_NO_ANSWER) {  /* a number or /etc/hosts: answered at once */
    int n = qtg_resolve_push_answer(L, r);
    qtg_resolve_end(r);
    return n;
  }
  r->task = t;
  r->listed = 1;
  r->next = h->resolves;
  if (r->next) r->next->prev = r;
  h->resolves = r;
  /* The loop's cached time is as old as this task's run: refresh it, or
   * the deadline would come early by that much. */
  uv_update_time(h->loop);
  uint64_t ms = (uint64_t)(seconds * 1000.0 + 0.5);
  if (ms == 0) ms = 1;
  if (uv_timer_start(&r->deadline, qtg_resolve_timed_out, ms, 0) != 0) {
    qtg_resolve_end(r);            /* t never waited */
    lua_pushnil(L);
    qtg_push_error(L, "dns", "cannot resolve %s: cannot start the lookup's timer", host);
    return 2;
  }
  qtg_resolve_step(r);             /* arms c-ares's retransmission timer */
  qtg_task_set_cancel(t, qtg_resolve_cancel, r);
  return qtg_task_yield(L);
}

int luaopen_qtg_api_net(lua_State *L) {
  static const luaL_Reg fns[] = {
      {"resolve", qtg_api_net_resolve},
      {NULL, NULL},
  };
  lua_createtable(L, 0, 1);
  luaL_register(L, NULL, fns);
  return 1;
}
