/* lua_api_net.c -- qtg.api_net.resolve(host) (yields): the addresses a host
 * name resolves to, so the API can refuse a callback_url whose name points
 * into the operator's network (lua/qtg/api/ssrf.lua).  uv_getaddrinfo runs
 * on libuv's thread pool; the task waits without blocking the loop.
 *
 * Returns an array of numeric addresses ("10.0.0.5", "fe80::1"), or nil,
 * {kind="dns", message=}.  An interrupted task gets {kind="interrupted"}
 * at once; the lookup's late completion only frees its record.  Nothing
 * resumes a task once Lua is closed (h->L is NULL then).
 */
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include "qtg_host.h"

typedef struct {
  uv_getaddrinfo_t req;
  qtg_host *h;
  qtg_task *task;
  int abandoned;
} qtg_resolve_req;

static void qtg_resolve_done(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  qtg_resolve_req *r = req->data;
  if (r->abandoned || !r->h->L) {
    if (res) uv_freeaddrinfo(res);
    free(r);
    return;
  }
  qtg_task *t = r->task;
  lua_State *co = qtg_task_thread(t);
  qtg_task_set_cancel(t, NULL, NULL);
  if (status != 0) {
    lua_pushnil(co);
    qtg_push_error(co, "dns", "cannot resolve: %s", uv_strerror(status));
    free(r);
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
  free(r);
  qtg_task_resume(t, 1);
}

static void qtg_resolve_cancel(qtg_task *t, void *arg) {
  qtg_resolve_req *r = arg;
  r->abandoned = 1;                /* the pool's completion frees it */
  lua_State *co = qtg_task_thread(t);
  lua_pushnil(co);
  qtg_push_error(co, "interrupted", "name lookup interrupted");
  qtg_task_resume(t, 2);
}

static int qtg_api_net_resolve(lua_State *L) {
  size_t len;
  const char *host = luaL_checklstring(L, 1, &len);
  if (len == 0 || len > 253 || memchr(host, 0, len)) return luaL_argerror(L, 1, "a host name of 1 to 253 bytes");
  qtg_task *t = qtg_task_check(L);
  qtg_host *h = qtg_host_from_lua(L);
  qtg_resolve_req *r = calloc(1, sizeof *r);
  if (!r) return luaL_error(L, "qtg.api_net.resolve: out of memory");
  r->h = h;
  r->task = t;
  r->req.data = r;
  struct addrinfo hints;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = uv_getaddrinfo(h->loop, &r->req, qtg_resolve_done, host, NULL, &hints);
  if (rc != 0) {
    free(r);
    lua_pushnil(L);
    qtg_push_error(L, "dns", "cannot resolve: %s", uv_strerror(rc));
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
