/* lua_signer.c -- qtg.signer: the client of `qtgd signer`, and the public
 * EVM address helpers.
 *
 *   keys()                   names of the keys the signer holds ({}, err when down)
 *   approvals()              how it counts approvals: {mode = "enrolled",
 *                            deployment=, digest=} | {mode = "trusting-rows"}
 *                            | {mode = "none"}, or nil, err
 *   address(name)            lowercase 0x address, or nil, err
 *   health(name)             {ok=true, signer_address=} or {ok=false, error=, code=}
 *   sign(name, sign_request) {signature=, r=, s=, recid=, address=} or nil, err
 *   fill(name, {payload=, principal=, signature=})
 *                            the same, for a fill of a nonce (qtg.evm_fill)
 *   checksum_address(addr)   EIP-55 form (raises {kind="invalid"} on bad input)
 *   recover(hash, signature) the address that signed hash, or nil, err
 *   raw_call(line)           one protocol line to the signer -> its answer line
 *   socket_path()            the signer socket this process uses
 *
 * keys/address/health/sign ask the signer process over its Unix socket
 * (MG_SIGNER_SOCKET, protocol in qtg_signer_proto.h), one connection per
 * call, yielding the calling task until the one-line answer comes (never
 * blocking the loop).  err is {kind="signer", code=, message=} when the
 * signer refused, {kind="signer_unavailable", message=} when it could not
 * be asked (down, timed out, answered garbage, or cannot read its
 * database): the caller may try again later.  This process holds no
 * signer key.
 */
#include <string.h>

#include <stdlib.h>
#include <sys/un.h>

#include <uv.h>

#include "qtg_crypto.h"
#include "qtg_host.h"
#include "qtg_keys.h"
#include "qtg_modules_decl.h"
#include "qtg_prelude.h"
#include "qtg_signer.h"
#include "qtg_signer_proto.h"
#include "qtg_signerd.h"

enum { QTG_SIGNER_ANSWER_MAX = 1024 };

/* The client: where the signer listens, and the calls in flight (closed
 * without resuming anyone when the host closes). */
typedef struct qtg_signer_call qtg_signer_call;
struct qtg_signer_client {
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
  uint64_t timeout_ms;
  qtg_signer_call *calls;
};

struct qtg_signer_call {
  uv_pipe_t pipe;
  uv_connect_t connect;
  uv_write_t write;
  uv_timer_t timer;
  qtg_task *task;
  struct qtg_signer_client *client;
  char *line;                     /* the request, LF-terminated */
  size_t line_len;
  char answer[QTG_SIGNER_ANSWER_MAX];
  size_t answer_len;
  int done, open_handles;
  qtg_signer_call *prev, *next;
};

int qtg_signer_client_open(qtg_host *h, char *err, size_t errlen) {
  struct qtg_signer_client *c = calloc(1, sizeof *c);
  if (c == NULL) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  if (qtg_signer_socket_path(h->settings, h->root_dir, c->path, sizeof c->path, err, errlen) != 0) {
    free(c);
    return -1;
  }
  c->timeout_ms = (uint64_t)(qtg_settings_num(h->settings, QTG_S_SIGNER_TIMEOUT_SECONDS) * 1000.0);
  h->signer = c;
  return 0;
}

static void qtg_signer_call_closed(uv_handle_t *handle) {
  qtg_signer_call *call = handle->data;
  if (--call->open_handles == 0) {
    free(call->line);
    free(call);
  }
}

/* Unlist and close; the memory goes when both handles are closed. */
static void qtg_signer_call_end(qtg_signer_call *call) {
  struct qtg_signer_client *c = call->client;
  call->done = 1;
  if (call->prev) call->prev->next = call->next;
  else c->calls = call->next;
  if (call->next) call->next->prev = call->prev;
  uv_timer_stop(&call->timer);
  uv_close((uv_handle_t *)&call->timer, qtg_signer_call_closed);
  uv_close((uv_handle_t *)&call->pipe, qtg_signer_call_closed);
}

void qtg_signer_client_close(qtg_host *h) {
  struct qtg_signer_client *c = h->signer;
  if (c == NULL) return;
  while (c->calls) qtg_signer_call_end(c->calls);
  free(c);
  h->signer = NULL;
}

/* Resume the task with the answer line, or nil + {kind="signer_unavailable"}. */
static void qtg_signer_call_finish(qtg_signer_call *call, const char *why) {
  if (call->done) return;
  qtg_task *t = call->task;
  lua_State *co = qtg_task_thread(t);
  int n;
  if (why == NULL) {
    lua_pushlstring(co, call->answer, call->answer_len);
    n = 1;
  } else {
    lua_pushnil(co);
    qtg_push_error(co, "signer_unavailable", "the signer at %s cannot be asked: %s",
                   call->client->path, why);
    n = 2;
  }
  qtg_signer_call_end(call);
  qtg_task_set_cancel(t, NULL, NULL);
  qtg_task_resume(t, n);
}

static void qtg_signer_on_timeout(uv_timer_t *timer) {
  qtg_signer_call_finish(timer->data, "no answer in time (MG_SIGNER_TIMEOUT_SECONDS)");
}

static void qtg_signer_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf) {
  qtg_signer_call *call = handle->data;
  (void)suggested;
  buf->base = call->answer + call->answer_len;
  buf->len = sizeof call->answer - call->answer_len;
}

static void qtg_signer_on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  qtg_signer_call *call = stream->data;
  (void)buf;
  if (call->done) return;
  if (nread < 0) {
    qtg_signer_call_finish(call, nread == UV_EOF ? "it closed without an answer" : uv_strerror((int)nread));
    return;
  }
  call->answer_len += (size_t)nread;
  char *lf = memchr(call->answer, '\n', call->answer_len);
  if (lf) {
    call->answer_len = (size_t)(lf - call->answer);
    qtg_signer_call_finish(call, NULL);
  } else if (call->answer_len == sizeof call->answer) {
    qtg_signer_call_finish(call, "its answer is too long");
  }
}

static void qtg_signer_on_write(uv_write_t *req, int status) {
  qtg_signer_call *call = req->data;
  if (status < 0) qtg_signer_call_finish(call, uv_strerror(status));
}

static void qtg_signer_on_connect(uv_connect_t *req, int status) {
  qtg_signer_call *call = req->data;
  if (call->done) return;
  if (status < 0) {
    qtg_signer_call_finish(call, uv_strerror(status));
    return;
  }
  uv_buf_t b = uv_buf_init(call->line, (unsigned)call->line_len);
  call->write.data = call;
  int rc = uv_write(&call->write, (uv_stream_t *)&call->pipe, &b, 1, qtg_signer_on_write);
  if (rc == 0) rc = uv_read_start((uv_stream_t *)&call->pipe, qtg_signer_alloc, qtg_signer_on_read);
  if (rc != 0) qtg_signer_call_finish(call, uv_strerror(rc));
}

static void qtg_signer_call_cancel(qtg_task *t, void *arg) {
  qtg_signer_call *call = arg;
  (void)t;
  qtg_signer_call_finish(call, "interrupted");
}

/* socket_path() -> where this process asks the signer. */
static int qtg_lua_signer_socket_path(lua_State *L) {
  struct qtg_signer_client *c = qtg_host_from_lua(L)->signer;
  lua_pushstring(L, c != NULL ? c->path : "");
  return 1;
}

/* raw_call(line) -> answer line, or nil, err.  Yields. */
static int qtg_lua_signer_raw_call(lua_State *L) {
  size_t len;
  const char *line = luaL_checklstring(L, 1, &len);
  qtg_task *t = qtg_task_check(L);
  qtg_host *h = qtg_host_from_lua(L);
  struct qtg_signer_client *c = h->signer;
  if (c == NULL) return qtg_raise(L, "signer_unavailable", "the signer client is not open");
  if (len == 0 || len > QTG_SIGNER_LINE_MAX || memchr(line, '\n', len))
    return qtg_raise(L, "invalid", "signer request line must be 1-%d bytes without LF",
                     QTG_SIGNER_LINE_MAX);
  qtg_signer_call *call = calloc(1, sizeof *call);
  char *copy = malloc(len + 1);
  if (call == NULL || copy == NULL) {
    free(call);
    free(copy);
    return luaL_error(L, "qtg.signer: out of memory");
  }
  memcpy(copy, line, len);
  copy[len] = '\n';
  call->line = copy;
  call->line_len = len + 1;
  call->task = t;
  call->client = c;
  if (uv_pipe_init(h->loop, &call->pipe, 0) != 0) {
    free(copy);
    free(call);
    return luaL_error(L, "qtg.signer: cannot create a pipe");
  }
  call->pipe.data = call;
  call->open_handles = 1;
  if (uv_timer_init(h->loop, &call->timer) != 0) {
    call->done = 1;
    uv_close((uv_handle_t *)&call->pipe, qtg_signer_call_closed);
    return luaL_error(L, "qtg.signer: cannot create a timer");
  }
  call->timer.data = call;
  call->open_handles = 2;
  call->next = c->calls;
  if (call->next) call->next->prev = call;
  c->calls = call;
  call->connect.data = call;
  uv_pipe_connect(&call->connect, &call->pipe, c->path, qtg_signer_on_connect);
  uv_update_time(h->loop);
  uv_timer_start(&call->timer, qtg_signer_on_timeout, c->timeout_ms, 0);
  qtg_task_set_cancel(t, qtg_signer_call_cancel, call);
  lua_settop(L, 0);
  return qtg_task_yield(L);
}

/* nil, {kind="signer", code=, message=[, key=]} */
static int qtg_lua_signer_refuse(lua_State *L, qtg_signer_code code,
                                 const char *name, const char *message) {
  lua_pushnil(L);
  qtg_push_error(L, "signer", "%s", message);
  lua_pushstring(L, qtg_signer_code_name(code));
  lua_setfield(L, -2, "code");
  if (name != NULL) {
    lua_pushstring(L, name);
    lua_setfield(L, -2, "key");
  }
  return 2;
}

static int qtg_lua_signer_checksum_address(lua_State *L) {
  size_t len;
  const char *s = luaL_checklstring(L, 1, &len);
  uint8_t addr[QTG_ADDRESS_LEN];
  char out[QTG_ADDRESS_HEX_LEN + 1];
  if (qtg_signer_parse_address(s, len, addr) != 0)
    return qtg_raise(L, "invalid", "checksum_address: want 0x followed by 40 hex digits");
  qtg_signer_checksum_address(addr, out);
  lua_pushstring(L, out);
  return 1;
}

/* recover(hash, signature): hash "0x"+64 hex; signature "0x"+130 hex with
 * v = 0/1 (recid) or 27/28 (legacy). */
static int qtg_lua_signer_recover(lua_State *L) {
  size_t hlen, slen;
  const char *hs = luaL_checklstring(L, 1, &hlen);
  const char *ss = luaL_checklstring(L, 2, &slen);
  uint8_t hash[32], raw[65], addr[QTG_ADDRESS_LEN];
  char hex[QTG_ADDRESS_HEX_LEN + 1];
  qtg_signature sig;

  if (qtg_signer_parse_hash(hs, hlen, hash) != 0)
    return qtg_lua_signer_refuse(L, QTG_SIGNER_BAD_REQUEST, NULL,
                                 "hash must be 0x followed by 64 hex digits");
  if (slen != 2 + 130 || ss[0] != '0' || (ss[1] != 'x' && ss[1] != 'X') ||
      qtg_hex_decode(ss + 2, 130, raw) != 0)
    return qtg_lua_signer_refuse(L, QTG_SIGNER_BAD_REQUEST, NULL,
                                 "signature must be 0x followed by 130 hex digits");
  memcpy(sig.r, raw, 32);
  memcpy(sig.s, raw + 32, 32);
  sig.recid = raw[64] >= 27 ? raw[64] - 27 : raw[64];
  if (sig.recid > 1 ||
      qtg_signer_recover(qtg_keys_context(NULL), hash, &sig, addr) != 0)
    return qtg_lua_signer_refuse(L, QTG_SIGNER_BAD_REQUEST, NULL,
                                 "signature does not recover to any key");
  qtg_signer_address_hex(addr, hex);
  lua_pushstring(L, hex);
  return 1;
}

int luaopen_qtg_signer(lua_State *L) {
  static const luaL_Reg fns[] = {
      {"raw_call", qtg_lua_signer_raw_call},
      {"socket_path", qtg_lua_signer_socket_path},
      {"checksum_address", qtg_lua_signer_checksum_address},
      {"recover", qtg_lua_signer_recover},
      {NULL, NULL},
  };
  lua_createtable(L, 0, 8);
  luaL_register(L, NULL, fns);
  /* error_mt: the metatable of qtg errors (their tostring) */
  qtg_push_error(L, "signer", "probe");
  if (lua_getmetatable(L, -1)) lua_setfield(L, -3, "error_mt");
  lua_pop(L, 1);
  if (qtg_prelude_load(L, QTG_PRELUDE_signer) != 0)
    return lua_error(L);
  lua_pushvalue(L, -2);
  lua_call(L, 1, 0);
  return 1;
}
