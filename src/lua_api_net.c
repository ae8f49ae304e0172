/* lua_api_net.c -- qtg.api_net.resolve(host[, seconds]) (yields): the
 * addresses a host name resolves to, so the API can refuse a callback_url
 * whose name points into the operator's network (lua/qtg/api/ssrf.lua).
 * uv_getaddrinfo runs on libuv's thread pool; the task waits without
 * blocking the loop, for `seconds` at most (a number > 0 and <= 600;
 * default QTG_RESOLVE_DEFAULT_SECONDS, 10).  glibc's resolver has no
 * deadline of its own a caller can give: with a DNS server that does not
 * answer it takes timeout x attempts x servers (5 s x 2 x each server by
 * default), tens of seconds.
 *
 * Returns an array of numeric addresses ("10.0.0.5", "fe80::1"), or nil,
 * err: {kind="dns", message=} when the name does not resolve,
 * {kind="timeout", message="name lookup of HOST took longer than N s"}
 * when the deadline passed first, {kind="interrupted"} when the task was
 * interrupted.  A host that is not a name of 1 to 253 bytes raises a
 * Lua argument error; seconds that are not a number in (0, 600] raise
 * {kind="usage"}.
 *
 * One record per lookup holds the pool request and the deadline's timer.
 * The first of four ends the task's wait: the pool's completion, the
 * timer, an interrupt (cancel), the host's close (qtg_api_net_close, a
 * subsystem row in qtg_modules.h: its pending lookups are dropped, no task
 * resumed).  That end unlists the record (h->resolves), stops and closes
 * the timer and, unless it is the completion, asks the pool to drop the
 * lookup if it has not started (uv_cancel; one already running goes on in
 * its thread until getaddrinfo returns).  The record is freed once both
 * the pool's completion (which always comes, UV_EAI_CANCELED when
 * dropped) and the timer's close callback have run, in whichever order:
 * a late completion only frees its answer and, the timer being closed,
 * the record.  Nothing resumes a task once the host closes.
 */
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include "qtg_host.h"
#include "qtg_modules_decl.h"

#define QTG_RESOLVE_DEFAULT_SECONDS 10.0
#define QTG_RESOLVE_MAX_SECONDS 600.0
#define QTG_RESOLVE_HOST_MAX 253

typedef struct qtg_resolve_req {
  uv_getaddrinfo_t req;
  uv_timer_t timer;
  qtg_host *h;
  qtg_task *task;               /* waiting on this lookup; NULL once its wait ended */
  double seconds;
  int looked_up;                /* the pool's completion ran */
  int timer_closed;             /* the timer's close callback ran */
  struct qtg_resolve_req *prev, *next; /* on h->resolves while task waits */
  char host[QTG_RESOLVE_HOST_MAX + 1];
} qtg_resolve_req;

/* Freed when neither the pool nor the loop holds it any more. */
static void qtg_resolve_release(qtg_resolve_req *r) {
  if (r->looked_up && r->timer_closed) free(r);
}

static void qtg_resolve_timer_closed(uv_handle_t *handle) {
  qtg_resolve_req *r = handle->data;
  r->timer_closed = 1;
  qtg_resolve_release(r);
}

/* The task's wait is over (called once per lookup): unlist the record and
 * close its timer.  The memory goes in qtg_resolve_release. */
static void qtg_resolve_end(qtg_resolve_req *r) {
  if (r->prev) r->prev->next = r->next;
  else r->h->resolves = r->next;
  if (r->next) r->next->prev = r->prev;
  r->prev = r->next = NULL;
  r->task = NULL;
  uv_timer_stop(&r->timer);
  uv_close((uv_handle_t *)&r->timer, qtg_resolve_timer_closed);
}

/* Ends the wait before the pool's completion: the lookup is dropped when it
 * has not started; UV_EBUSY (running, or done and its completion queued)
 * is expected, and its completion then frees what is left. */
static void qtg_resolve_abandon(qtg_resolve_req *r) {
  (void)uv_cancel((uv_req_t *)&r->req);
  qtg_resolve_end(r);
}

/* Subsystem row (qtg_modules.h): nothing to open. */
int qtg_api_net_open(qtg_host *h, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  h->resolves = NULL;
  return 0;
}

/* At host close, after the API, the console and the runtime closed (their
 * interrupts may still have ended waits the usual way) and before the Lua
 * state goes: drop every pending lookup, resuming no one, so no
 * completion ever sees a task again.  The host runs the loop afterwards:
 * the timers' close callbacks and the pool's completions run then and
 * free the records (the loop waits for a lookup still running in the
 * pool until getaddrinfo returns). */
void qtg_api_net_close(qtg_host *h) {
  while (h->resolves) {
    qtg_resolve_req *r = h->resolves;
    qtg_task_set_cancel(r->task, NULL, NULL);
    qtg_resolve_abandon(r);
  }
}

static void qtg_resolve_done(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  qtg_resolve_req *r = req->data;
  qtg_task *t = r->task;
  r->looked_up = 1;
  if (t == NULL) {                 /* timed out, interrupted or host closed */
    if (res) uv_freeaddrinfo(res);
    qtg_resolve_release(r);
    return;
  }
  qtg_resolve_end(r);              /* r stays until the timer's close callback */
  qtg_task_set_cancel(t, NULL, NULL);
  lua_State *co = qtg_task_thread(t);
  if (status != 0) {
    if (res) uv_freeaddrinfo(res);
    lua_pushnil(co);
    qtg_push_error(co, "dns", "cannot resolve: %s", uv_strerror(status));
    qtg_task_resume(t, 2);
    return;
  }
  lua_newtable(co);
  int i = 0;
  for (struct addrinfo *a = res; a; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN];
    const void *src = NULL;
    if (a->ai_family == AF_INET) src = &((struct sockaddr_in *)a->ai_addr)->sin_addr;
    else if (a->ai_family == AF_INET6) src = &((struct sockaddr_in6 *)a->ai_addr)->sin6_addr;
    if (src && inet_ntop(a->ai_family, src, buf, sizeof buf)) {
      lua_pushstring(co, buf);
      lua_rawseti(co, -2, ++i);
    }
  }
  uv_freeaddrinfo(res);
  qtg_task_resume(t, 1);
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
  qtg_resolve_abandon(r);          /* the pool's late completion frees r */
  qtg_task_resume(t, 2);
}

static void qtg_resolve_cancel(qtg_task *t, void *arg) {
  qtg_resolve_req *r = arg;
  qtg_resolve_abandon(r);          /* the pool's late completion frees r */
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
  r->task = t;
  r->seconds = seconds;
  memcpy(r->host, host, len);
  r->host[len] = '\0';
  r->req.data = r;
  if (uv_timer_init(h->loop, &r->timer) != 0) {
    free(r);
    return luaL_error(L, "qtg.api_net.resolve: cannot create a timer");
  }
  r->timer.data = r;
  struct addrinfo hints;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = uv_getaddrinfo(h->loop, &r->req, qtg_resolve_done, r->host, NULL, &hints);
  if (rc != 0) {
    r->looked_up = 1;              /* no completion will come */
    uv_close((uv_handle_t *)&r->timer, qtg_resolve_timer_closed);
    lua_pushnil(L);
    qtg_push_error(L, "dns", "cannot resolve: %s", uv_strerror(rc));
    return 2;
  }
  r->next = h->resolves;
  if (r->next) r->next->prev = r;
  h->resolves = r;
  /* The loop's cached time is as old as this task's run: refresh it, or
   * the deadline would come early by that much. */
  uv_update_time(h->loop);
  uint64_t ms = (uint64_t)(seconds * 1000.0 + 0.5);
  if (ms == 0) ms = 1;
  if (uv_timer_start(&r->timer, qtg_resolve_timed_out, ms, 0) != 0) {
    lua_pushnil(L);
    qtg_push_error(L, "dns", "cannot resolve %s: cannot start the lookup's timer", r->host);
    qtg_resolve_abandon(r);        /* the completion frees r; t never waited */
    return 2;
  }
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
