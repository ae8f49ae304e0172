/* fuzz_http.c -- the `http` target: whatever bytes a provider or callback
 * receiver answers, handed to Lua by qtg.http.request (src/qtg_http*.c,
 * src/lua_http.c) in a real host.
 *
 * A TCP server on 127.0.0.1 runs on the host's own loop; for each input it
 * answers the next request with the input's bytes (byte 0 aside), as they
 * are, then closes.  Byte 0: bits 0-1 pick max_body (default, 16, 1024,
 * 65536); bit 2 makes the request a POST with a body; bit 3 sends the
 * answer in two writes with the loop running between them.
 *
 * Properties, checked in Lua on what the request returns: either a response
 * {status = integer 0..999, headers = table of lower-case string names to
 * string values, body = string no longer than max_body}, on which
 * cjson.decode (in pcall) may run as a policy would; or nil and an error
 * {kind = one of the documented kinds, message = string}.  Never a raise,
 * never a hang (10 s), no crash or leak. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qtg_fuzz.h"
#include "qtg_host.h"

typedef struct fuzz_conn {
  uv_tcp_t tcp;
  uv_write_t wr;
  uv_shutdown_t sh;
  char in[16384];
  size_t in_len;
  int responded, closing;
  char *out;
  size_t out_len, half;
  struct fuzz_conn *next;
} fuzz_conn;

static struct {
  uv_tcp_t listener;
  int port, ready;
  const uint8_t *answer;
  size_t answer_len;
  int split, post;
  fuzz_conn *conns;
} fuzz_srv;

static const char fuzz_http_lua[] =
    "local qtg = require 'qtg'\n"
    "local cjson = require 'cjson'\n"
    "local KINDS = { invalid = true, dns = true, refused = true, timeout = true, tls = true,\n"
    "  too_large = true, closed = true, http = true, interrupted = true, error = true }\n"
    "local url, max_body, post = ...\n"
    "local r, e = qtg.http.request{ url = url, method = post and 'POST' or 'GET',\n"
    "  body = post and '{\"a\":1}' or nil, timeout = 5, connect_timeout = 2, max_body = max_body }\n"
    "if r then\n"
    "  if type(r.status) ~= 'number' or r.status ~= math.floor(r.status) or r.status < 0\n"
    "     or r.status > 999 then return 'bad status ' .. tostring(r.status) end\n"
    "  if type(r.headers) ~= 'table' then return 'headers are not a table' end\n"
    "  for k, v in pairs(r.headers) do\n"
    "    if type(k) ~= 'string' or type(v) ~= 'string' then return 'a header is not strings' end\n"
    "    if k ~= k:lower() then return 'header name not lower-case: ' .. k end\n"
    "  end\n"
    "  if type(r.body) ~= 'string' then return 'body is not a string' end\n"
    "  if #r.body > (max_body or 8388608) then return 'body over max_body: ' .. #r.body end\n"
    "  pcall(cjson.decode, r.body)\n"
    "  return 'ok'\n"
    "end\n"
    "if r ~= nil or type(e) ~= 'table' or not KINDS[e.kind] or type(e.message) ~= 'string' then\n"
    "  return 'bad error: ' .. tostring(type(e) == 'table' and e.kind or e)\n"
    "end\n"
    "return 'ok'\n";

static void fuzz_conn_closed(uv_handle_t *h) {
  fuzz_conn *c = h->data;
  fuzz_conn **pp = &fuzz_srv.conns;
  while (*pp && *pp != c) pp = &(*pp)->next;
  if (*pp) *pp = c->next;
  free(c->out);
  free(c);
}

static void fuzz_conn_close(fuzz_conn *c) {
  if (c->closing) return;
  c->closing = 1;
  uv_close((uv_handle_t *)&c->tcp, fuzz_conn_closed);
}

static void fuzz_conn_shut(uv_shutdown_t *req, int status) {
  (void)status;
  fuzz_conn_close(req->data);
}

static void fuzz_conn_written(uv_write_t *req, int status);

static void fuzz_conn_write(fuzz_conn *c, size_t from, size_t to) {
  uv_buf_t b = uv_buf_init(c->out + from, (unsigned)(to - from));
  c->wr.data = c;
  if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &b, 1, fuzz_conn_written) != 0) fuzz_conn_close(c);
}

static void fuzz_conn_written(uv_write_t *req, int status) {
  fuzz_conn *c = req->data;
  if (status < 0 || c->closing) {
    fuzz_conn_close(c);
    return;
  }
  if (c->half && c->half < c->out_len) {
    size_t from = c->half;
    c->half = 0;
    fuzz_conn_write(c, from, c->out_len);
    return;
  }
  c->sh.data = c;
  if (uv_shutdown(&c->sh, (uv_stream_t *)&c->tcp, fuzz_conn_shut) != 0) fuzz_conn_close(c);
}

static void fuzz_conn_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  fuzz_conn *c = h->data;
  size_t room = sizeof c->in - c->in_len;
  if (room == 0) { /* read and forget */
    c->in_len = sizeof c->in / 2;
    room = sizeof c->in - c->in_len;
  }
  *buf = uv_buf_init(c->in + c->in_len, (unsigned)room);
}

static void fuzz_conn_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  (void)buf;
  fuzz_conn *c = s->data;
  if (n < 0) {
    fuzz_conn_close(c);
    return;
  }
  c->in_len += (size_t)n;
  if (c->responded) return;
  const char *mark = fuzz_srv.post ? "{\"a\":1}" : "\r\n\r\n";
  if (!memmem(c->in, c->in_len, mark, strlen(mark)) && c->in_len < sizeof c->in) return;
  c->responded = 1;
  c->out_len = fuzz_srv.answer_len;
  c->out = malloc(c->out_len ? c->out_len : 1);
  if (!c->out) abort();
  if (c->out_len) memcpy(c->out, fuzz_srv.answer, c->out_len);
  c->half = fuzz_srv.split ? c->out_len / 2 : 0;
  fuzz_conn_write(c, 0, c->half ? c->half : c->out_len);
}

static void fuzz_srv_accept(uv_stream_t *server, int status) {
  if (status < 0) return;
  fuzz_conn *c = calloc(1, sizeof *c);
  if (!c) abort();
  uv_tcp_init(server->loop, &c->tcp);
  c->tcp.data = c;
  c->next = fuzz_srv.conns;
  fuzz_srv.conns = c;
  if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0 ||
      uv_read_start((uv_stream_t *)&c->tcp, fuzz_conn_alloc, fuzz_conn_read) != 0)
    fuzz_conn_close(c);
}

static void fuzz_srv_listener_closed(uv_handle_t *h) { (void)h; }

/* Runs before the host closes (registered after it, so called first). */
static void fuzz_srv_close(void) {
  if (!fuzz_srv.ready) return;
  qtg_host *h = qtg_fuzz_host();
  fuzz_srv.ready = 0;
  for (fuzz_conn *c = fuzz_srv.conns; c; c = c->next) fuzz_conn_close(c);
  uv_close((uv_handle_t *)&fuzz_srv.listener, fuzz_srv_listener_closed);
  for (int i = 0; i < 100 && (fuzz_srv.conns || uv_is_active((uv_handle_t *)&fuzz_srv.listener)); i++)
    uv_run(h->loop, UV_RUN_NOWAIT);
  uv_run(h->loop, UV_RUN_NOWAIT);
}

static int fuzz_srv_start(qtg_host *h) {
  struct sockaddr_in addr;
  struct sockaddr_storage bound;
  int len = sizeof bound;
  if (fuzz_srv.ready) return 0;
  uv_tcp_init(h->loop, &fuzz_srv.listener);
  uv_ip4_addr("127.0.0.1", 0, &addr);
  if (uv_tcp_bind(&fuzz_srv.listener, (const struct sockaddr *)&addr, 0) != 0 ||
      uv_listen((uv_stream_t *)&fuzz_srv.listener, 64, fuzz_srv_accept) != 0 ||
      uv_tcp_getsockname(&fuzz_srv.listener, (struct sockaddr *)&bound, &len) != 0)
    return -1;
  fuzz_srv.port = ntohs(((struct sockaddr_in *)&bound)->sin_port);
  fuzz_srv.ready = 1;
  atexit(fuzz_srv_close);
  return 0;
}

typedef struct {
  int done, ok;
  char result[256];
} fuzz_task_state;

static void fuzz_task_done(qtg_task *t, int ok, int nres, void *data) {
  fuzz_task_state *st = data;
  lua_State *co = qtg_task_thread(t);
  st->done = 1;
  st->ok = ok;
  st->result[0] = '\0';
  if (nres >= 1 && lua_isstring(co, -nres))
    snprintf(st->result, sizeof st->result, "%s", lua_tostring(co, -nres));
  else if (!ok && lua_isstring(co, -1))
    snprintf(st->result, sizeof st->result, "%s", lua_tostring(co, -1));
}

int qtg_fuzz_http(const uint8_t *data, size_t size) {
  static const int max_bodies[] = {0, 16, 1024, 65536};
  if (size == 0) return 0;
  qtg_host *h = qtg_fuzz_host();
  if (fuzz_srv_start(h) != 0) {
    fprintf(stderr, "http: cannot start the test server\n");
    return -1;
  }
  int max_body = max_bodies[data[0] & 3];
  fuzz_srv.post = (data[0] >> 2) & 1;
  fuzz_srv.split = (data[0] >> 3) & 1;
  fuzz_srv.answer = data + 1;
  fuzz_srv.answer_len = size - 1;

  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/fuzz", fuzz_srv.port);
  fuzz_task_state st;
  memset(&st, 0, sizeof st);
  if (luaL_loadbuffer(h->L, fuzz_http_lua, sizeof fuzz_http_lua - 1, "=fuzz_http") != 0) {
    fprintf(stderr, "http: %s\n", lua_tostring(h->L, -1));
    lua_pop(h->L, 1);
    return -1;
  }
  lua_pushstring(h->L, url);
  if (max_body) lua_pushinteger(h->L, max_body);
  else lua_pushnil(h->L);
  lua_pushboolean(h->L, fuzz_srv.post);
  qtg_task_spawn(h, "fuzz_http", 3, QTG_TASK_QUIET, fuzz_task_done, &st);
  uint64_t deadline = uv_hrtime() + 10000000000ull;
  while (!st.done && uv_hrtime() < deadline) uv_run(h->loop, UV_RUN_ONCE);
  if (!st.done) {
    fprintf(stderr, "http: no answer in Lua after 10 s\n");
    return -1;
  }
  /* let the server side finish its connection */
  for (int i = 0; i < 50 && fuzz_srv.conns; i++) uv_run(h->loop, UV_RUN_NOWAIT);
  if (!st.ok || strcmp(st.result, "ok") != 0) {
    fprintf(stderr, "http: %s\n", st.result[0] ? st.result : "the request raised");
    return -1;
  }
  return 0;
}
