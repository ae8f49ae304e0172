/* lua_http.c -- qtg.http.request: the Lua face of qtg_http.
 *
 * request{method, url, headers, body, timeout, connect_timeout, max_body,
 * follow_redirects, verify_tls, pin} yields the calling task until the response
 * (or a classified failure) arrives, then returns
 *   {status=, headers={lowercase name = value}, body=}   or   nil, err
 * with err = {kind=, message=, url=[, curl_code=]}.  Wrong argument types
 * raise (a bug in the caller); everything about the peer or the URL comes
 * back as nil, err (data the caller must handle).  pin: an array of
 * numeric addresses the URL's host is connected at (qtg_http_start).
 *
 * target(url) -> host, port: where curl connects for url (its own reading
 * of the URL, qtg_http_url_target), or nil, err.
 *
 * A request still in flight when the host closes is never resumed: the
 * http subsystem closes after the Lua state (QTG_CLOSE_AFTER_LUA), so its
 * "cancelled" completion only frees memory.  An operator interrupt
 * (qtg_task_interrupt) aborts the transfer and resumes the task with
 * nil, {kind="interrupted"}.
 */
#include <stdlib.h>
#include <string.h>

#include "qtg_http.h"

enum { QTG_LUA_HTTP_MAX_HEADERS = 100 };

/* Lives from the start of a request until its task is resumed. */
typedef struct {
  qtg_task *task;
  qtg_http_call *call;
} qtg_lua_http_wait;

static void qtg_lua_http_push_error(lua_State *L, const char *kind,
                                    const char *message, const char *url,
                                    int curl_code, long status) {
  lua_pushnil(L);
  qtg_push_error(L, kind, "%s", message);
  if (status > 0) {
    lua_pushinteger(L, (lua_Integer)status);
    lua_setfield(L, -2, "status");
  }
  lua_pushstring(L, url != NULL ? url : "");
  lua_setfield(L, -2, "url");
  if (curl_code != 0) {
    lua_pushinteger(L, curl_code);
    lua_setfield(L, -2, "curl_code");
  }
}

/* {status=, headers=, body=}; repeated header names are joined with ", "
 * (RFC 9110 5.3), in the order received.  A name's first value goes
 * straight into the table; the values of a name that repeats are gathered
 * in a list (made only then) and joined once at the end, so the work is
 * linear in the headers' bytes: joining as each repeat arrived copied the
 * whole value so far every time, and a response of many repeats held the
 * loop. */
static void qtg_lua_http_push_headers(lua_State *L,
                                      const qtg_http_response *res) {
  int headers, lists = 0;
  lua_createtable(L, 0, (int)res->nheaders);
  headers = lua_gettop(L);
  for (size_t i = 0; i < res->nheaders; i++) {
    const char *name = res->headers[i].name;
    lua_getfield(L, headers, name);
    if (lua_isnil(L, -1)) {
      lua_pop(L, 1);
      lua_pushstring(L, res->headers[i].value);
      lua_setfield(L, headers, name);
      continue;
    }
    if (lists == 0) {                     /* the first repeat */
      lua_newtable(L);
      lua_insert(L, -2);                  /* lists below the first value */
      lists = lua_gettop(L) - 1;
    }
    lua_getfield(L, lists, name);         /* first value, list or nil */
    if (lua_isnil(L, -1)) {
      lua_pop(L, 1);
      lua_createtable(L, 4, 0);
      lua_pushvalue(L, -2);
      lua_rawseti(L, -2, 1);
      lua_pushvalue(L, -1);
      lua_setfield(L, lists, name);
    }
    lua_pushstring(L, res->headers[i].value);
    lua_rawseti(L, -2, (int)lua_objlen(L, -2) + 1);
    lua_pop(L, 2);                        /* the list and the first value */
  }
  if (lists == 0) return;
  lua_pushnil(L);
  while (lua_next(L, lists) != 0) {       /* name, list */
    int list = lua_gettop(L);
    int n = (int)lua_objlen(L, list);
    luaL_Buffer b;                        /* may use the stack above list */
    luaL_buffinit(L, &b);
    for (int k = 1; k <= n; k++) {
      if (k > 1) luaL_addlstring(&b, ", ", 2);
      lua_rawgeti(L, list, k);
      luaL_addvalue(&b);
    }
    luaL_pushresult(&b);                  /* name, list, value */
    lua_pushvalue(L, list - 1);
    lua_insert(L, -2);                    /* name, list, name, value */
    lua_rawset(L, headers);
    lua_pop(L, 1);                        /* name */
  }
  lua_remove(L, lists);
}

static void qtg_lua_http_push_response(lua_State *L,
                                       const qtg_http_response *res) {
  lua_createtable(L, 0, 3);
  lua_pushinteger(L, (lua_Integer)res->status);
  lua_setfield(L, -2, "status");
  qtg_lua_http_push_headers(L, res);
  lua_setfield(L, -2, "headers");
  lua_pushlstring(L, res->body, res->body_len);
  lua_setfield(L, -2, "body");
}

static void qtg_lua_http_done(const qtg_http_response *res, void *data) {
  qtg_lua_http_wait *w = data;
  qtg_task *t = w->task;
  lua_State *co;
  free(w);
  /* The host is closing and Lua is already gone: nothing to resume. */
  if (res->kind == QTG_HTTP_CANCELLED) return;
  qtg_task_set_cancel(t, NULL, NULL);
  co = qtg_task_thread(t);
  lua_settop(co, 0);
  if (!lua_checkstack(co, 32)) {   /* the headers' join buffer uses some */
    /* Cannot happen with an empty stack; keep the promise to resume. */
    qtg_task_resume(t, 0);
    return;
  }
  if (res->kind == QTG_HTTP_OK) {
    qtg_lua_http_push_response(co, res);
    qtg_task_resume(t, 1);
  } else {
    qtg_lua_http_push_error(co, qtg_http_kind_name(res->kind), res->message,
                            res->url, res->curl_code, res->status);
    qtg_task_resume(t, 2);
  }
}

static void qtg_lua_http_cancel(qtg_task *t, void *arg) {
  qtg_lua_http_wait *w = arg;
  lua_State *co = qtg_task_thread(t);
  qtg_http_abort(w->call);
  free(w);
  lua_settop(co, 0);
  lua_pushnil(co);
  qtg_push_error(co, "interrupted", "http request interrupted");
  qtg_task_resume(t, 2);
}

static double qtg_lua_http_opt_seconds(lua_State *L, const char *field) {
  double v;
  lua_getfield(L, 1, field);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return 0;
  }
  if (lua_type(L, -1) != LUA_TNUMBER)
    qtg_raise(L, "usage", "qtg.http.request: %s must be a number of seconds", field);
  v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  if (!(v > 0 && v <= 86400))
    qtg_raise(L, "usage", "qtg.http.request: %s must be > 0 and <= 86400", field);
  return v;
}

static int qtg_lua_http_opt_bool(lua_State *L, const char *field, int def) {
  int v;
  lua_getfield(L, 1, field);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return def;
  }
  if (!lua_isboolean(L, -1))
    qtg_raise(L, "usage", "qtg.http.request: %s must be a boolean", field);
  v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

/* Turn opts.headers into "Name: value" strings left on the stack, their
 * pointers in a userdata array (so nothing leaks if a later check raises). */
static const char **qtg_lua_http_headers(lua_State *L, size_t *n) {
  const char **lines;
  size_t count = 0;
  int tbl;
  *n = 0;
  lua_getfield(L, 1, "headers");
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return NULL;
  }
  if (!lua_istable(L, -1))
    qtg_raise(L, "usage", "qtg.http.request: headers must be a table of name = value");
  tbl = lua_gettop(L);
  lines = lua_newuserdata(L, QTG_LUA_HTTP_MAX_HEADERS * sizeof *lines);
  lua_pushnil(L);
  while (lua_next(L, tbl) != 0) {
    if (lua_type(L, -2) != LUA_TSTRING ||
        (lua_type(L, -1) != LUA_TSTRING && lua_type(L, -1) != LUA_TNUMBER))
      qtg_raise(L, "usage",
                "qtg.http.request: headers must map string names to string values");
    if (count == QTG_LUA_HTTP_MAX_HEADERS)
      qtg_raise(L, "usage", "qtg.http.request: more than %d headers",
                QTG_LUA_HTTP_MAX_HEADERS);
    if (!lua_checkstack(L, 4))
      qtg_raise(L, "usage", "qtg.http.request: too many headers");
    /* Stack: ..., key, value.  Build the line below the key so lua_next
     * still finds its key on top afterwards. */
    lua_pushvalue(L, -2);
    lua_pushliteral(L, ": ");
    lua_pushvalue(L, -3);
    lua_concat(L, 3);                 /* ..., key, value, line */
    lines[count++] = lua_tostring(L, -1);
    lua_insert(L, -3);                /* ..., line, key, value */
    lua_pop(L, 1);                    /* ..., line, key */
  }
  *n = count;
  return lines;
}

/* opts.pin as strings left on the stack, their pointers in a userdata
 * array; NULL when absent. */
static const char **qtg_lua_http_pin(lua_State *L, size_t *n) {
  const char **addrs;
  size_t count;
  *n = 0;
  lua_getfield(L, 1, "pin");
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return NULL;
  }
  if (!lua_istable(L, -1))
    qtg_raise(L, "usage", "qtg.http.request: pin must be an array of addresses");
  count = lua_objlen(L, -1);
  if (count > QTG_HTTP_MAX_PIN)
    qtg_raise(L, "usage", "qtg.http.request: more than %d pinned addresses",
              (int)QTG_HTTP_MAX_PIN);
  if (!lua_checkstack(L, (int)count + 4))
    qtg_raise(L, "usage", "qtg.http.request: too many pinned addresses");
  addrs = lua_newuserdata(L, (count > 0 ? count : 1) * sizeof *addrs);
  for (size_t i = 0; i < count; i++) {
    lua_rawgeti(L, -2, (int)i + 1);
    if (lua_type(L, -1) != LUA_TSTRING)
      qtg_raise(L, "usage", "qtg.http.request: pin must be an array of addresses");
    addrs[i] = lua_tostring(L, -1);
    lua_insert(L, -3);                /* kept below the table and the array */
  }
  *n = count;
  return addrs;
}

static int qtg_lua_http_target(lua_State *L) {
  char host[256], err[128];
  long port;
  const char *url = luaL_checkstring(L, 1);
  if (qtg_http_url_target(url, host, sizeof host, &port, err, sizeof err) != 0) {
    lua_pushnil(L);
    qtg_push_error(L, "invalid", "%s", err);
    return 2;
  }
  lua_pushstring(L, host);
  lua_pushinteger(L, (lua_Integer)port);
  return 2;
}

static int qtg_lua_http_request(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  qtg_http_request req;
  qtg_lua_http_wait *w;
  qtg_http_kind kind;
  qtg_task *t;
  char err[512];
  double max_body;

  luaL_checktype(L, 1, LUA_TTABLE);
  memset(&req, 0, sizeof req);

  lua_getfield(L, 1, "url");
  if (lua_type(L, -1) != LUA_TSTRING)
    qtg_raise(L, "usage", "qtg.http.request: url must be a string");
  req.url = lua_tostring(L, -1);      /* stays on the stack */

  lua_getfield(L, 1, "method");
  if (!lua_isnil(L, -1) && lua_type(L, -1) != LUA_TSTRING)
    qtg_raise(L, "usage", "qtg.http.request: method must be a string");
  req.method = lua_tostring(L, -1);   /* NULL when nil */

  lua_getfield(L, 1, "body");
  if (!lua_isnil(L, -1) && lua_type(L, -1) != LUA_TSTRING)
    qtg_raise(L, "usage", "qtg.http.request: body must be a string");
  req.body = lua_tolstring(L, -1, &req.body_len);

  req.timeout = qtg_lua_http_opt_seconds(L, "timeout");
  req.connect_timeout = qtg_lua_http_opt_seconds(L, "connect_timeout");
  lua_getfield(L, 1, "max_body");
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TNUMBER)
      qtg_raise(L, "usage", "qtg.http.request: max_body must be a number of bytes");
    max_body = lua_tonumber(L, -1);
    if (!(max_body >= 1 && max_body <= 1073741824.0))
      qtg_raise(L, "usage", "qtg.http.request: max_body must be between 1 and 2^30");
    req.max_body = (size_t)max_body;
  }
  lua_pop(L, 1);
  req.follow_redirects = qtg_lua_http_opt_bool(L, "follow_redirects", 0);
  req.verify_tls = qtg_lua_http_opt_bool(L, "verify_tls", 1);
  req.headers = qtg_lua_http_headers(L, &req.nheaders);
  req.pin = qtg_lua_http_pin(L, &req.npin);

  t = qtg_task_check(L);
  w = malloc(sizeof *w);
  if (w == NULL) return qtg_raise(L, "usage", "qtg.http.request: out of memory");
  w->task = t;
  if (qtg_http_start(h != NULL ? h->http : NULL, &req, qtg_lua_http_done, w,
                     &w->call, &kind, err, sizeof err) != 0) {
    char shown[2048];
    free(w);
    qtg_http_redact_url(req.url, shown, sizeof shown);
    qtg_lua_http_push_error(L, qtg_http_kind_name(kind), err, shown, 0, 0);
    return 2;
  }
  qtg_task_set_cancel(t, qtg_lua_http_cancel, w);
  return qtg_task_yield(L);
}

int luaopen_qtg_http(lua_State *L) {
  static const luaL_Reg fns[] = {
      {"request", qtg_lua_http_request},
      {"target", qtg_lua_http_target},
      {NULL, NULL},
  };
  lua_createtable(L, 0, 3);
  luaL_register(L, NULL, fns);
  lua_pushinteger(L, QTG_HTTP_MAX_PIN);   /* how many addresses request's pin takes */
  lua_setfield(L, -2, "MAX_PIN");
  return 1;
}
