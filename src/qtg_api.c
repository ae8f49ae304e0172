/* qtg_api.c -- the HTTP API's server: libmicrohttpd in external-epoll mode
 * on the host's libuv loop, each request run as a host task.
 *
 * Why this shape: the C host owns I/O, Lua owns policy.  libmicrohttpd
 * parses HTTP (no hand-written parser); it runs without threads of its own:
 * one uv_poll_t watches its epoll fd, one uv_timer_t follows MHD_get_timeout,
 * and MHD_run is called on each event.  Once a request's headers and body
 * are in, the Lua handler (require('qtg.api').handle(req)) starts as a task;
 * when the task yields (on the database) the connection is suspended, and
 * the task's end resumes it with the answer.
 *
 * Limits enforced here, before Lua sees anything: the body cap
 * (MG_API_MAX_BODY_BYTES: a body past it is discarded as it streams in and
 * answered 413; a declared Content-Length over eight times it is answered
 * 413 before any of it is read),
 * the connection limit (MG_API_MAX_CONNECTIONS) and its share for one IP
 * address (MG_API_MAX_CONNECTIONS_PER_IP), the idle timeout of a
 * connection (MG_API_IDLE_TIMEOUT_SECONDS), a deadline for a whole
 * request's headers (MG_API_HEADER_TIMEOUT_SECONDS: the idle timeout
 * restarts with every byte, so a client trickling its headers would hold a
 * connection for ever) and one for its body once the headers are in
 * (MG_API_BODY_TIMEOUT_SECONDS, for the same reason), and a deadline for a request
 * whose handler is still running (MG_API_REQUEST_TIMEOUT_SECONDS: 503, the
 * task is interrupted, which rolls back its open transaction).
 *
 * Also refused here, 400 and the connection closed, is any framing a
 * proxy in front could read otherwise than libmicrohttpd (request
 * smuggling): both Content-Length and Transfer-Encoding, Content-Length
 * twice or not all digits, Transfer-Encoding twice, not just chunked or in
 * a request before HTTP/1.1, a header name that is not a token
 * (`Transfer-Encoding : chunked`), and a framing header continued on a
 * second line (qtg_api_framing_refusal).
 * The request line's path is passed as sent (raw_path, from the
 * URI log callback) beside libmicrohttpd's decoded one; the router matches
 * the raw one (lua/qtg/api/routes.lua).
 *
 * MG_API_LISTEN is a comma list of unix:PATH and HOST:PORT; one MHD daemon
 * serves each entry (libmicrohttpd listens on one socket per daemon).  The
 * sockets are bound here and handed over (MHD_OPTION_LISTEN_SOCKET), so a
 * port 0 gets a real port that addresses() reports.
 *
 * Lifetimes: a request record is held by MHD (until its completion
 * notice) and by its task (until the task ends); it is freed when both let
 * go.  Nothing resumes a task once the subsystem is closing (the host closes
 * this before Lua and runs no I/O in between), so close drops the tasks'
 * holds.
 */
#include "qtg_api.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <microhttpd.h>

#include "qtg_log.h"
#include "qtg_modules_decl.h"
#include "qtg_prelude.h"

#define QTG_API_MAX_LISTENERS 8

typedef struct qtg_api_listener qtg_api_listener;
typedef struct qtg_api_req qtg_api_req;
typedef struct qtg_api_conn qtg_api_conn;

/* What a connection owes, and since when (`since`): a request's headers
 * (from its accept or its last answer; the sweep closes it past
 * MG_API_HEADER_TIMEOUT_SECONDS), or the rest of a request's body (from its
 * headers; past MG_API_BODY_TIMEOUT_SECONDS), or nothing (its request runs
 * or is answered). */
enum { QTG_OWES_NOTHING = 0, QTG_OWES_HEADERS, QTG_OWES_BODY };

/* A connection (MHD_OPTION_NOTIFY_CONNECTION's socket context).
 * `unseen`: the record qtg_api_uri made for its current request while the
 * access handler has not seen it.  libmicrohttpd reports a request's
 * completion only once the handler has seen it, so a request it gives up
 * on before that (a request line and headers larger than its memory pool)
 * would leave the record with nobody to free it: the connection frees it
 * at its next request line or when it closes. */
struct qtg_api_conn {
  qtg_api_listener *l;
  struct MHD_Connection *conn;
  double since;
  int owes, cut;
  qtg_api_req *unseen;
  qtg_api_conn *prev, *next;
};

enum { QTG_REQ_BODY = 0, QTG_REQ_RUNNING, QTG_REQ_READY, QTG_REQ_ANSWERED };

struct qtg_api_req {
  qtg_api_listener *l;
  struct MHD_Connection *conn;  /* NULL once MHD reported completion */
  int refs;                     /* MHD's hold + the running task's hold */
  int phase;
  int suspended;
  int too_large;
  int started;                  /* the access handler has seen the request */
  int close;                    /* answer with Connection: close */
  char *raw_path;               /* the request line's path as sent (not decoded) */
  char *body;
  size_t len, cap;
  double deadline;              /* monotonic seconds, while RUNNING */
  qtg_task *task;
  int status;
  char *answer;                 /* response body */
  size_t answer_len;
  char **headers;               /* name, value, name, value... */
  int nheaders;
  qtg_api_req *prev, *next;     /* api->running, while the task runs */
};

struct qtg_api_listener {
  struct qtg_api *api;
  struct MHD_Daemon *d;
  uv_poll_t poll;
  uv_timer_t timer;
  int handles;                  /* open uv handles (freed when 0 after close) */
  int is_unix;
  char address[160];            /* as reported: unix:/path or host:port */
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

struct qtg_api {
  uv_timer_t sweep;             /* first: its close callback frees the struct */
  qtg_host *host;
  qtg_api_listener *listeners[QTG_API_MAX_LISTENERS];
  int nlisteners;
  int handler_ref;
  qtg_api_req *running;
  qtg_api_conn *conns;          /* every open connection */
  int sweep_open;
  size_t max_body;
  double request_timeout, header_timeout, body_timeout;
  unsigned max_connections, max_per_ip, idle_timeout;
  uint64_t served, refused_too_large, timed_out, cut_slow;
  size_t records;               /* request records alive (stats(): a leak shows) */
};

static void qtg_api_schedule(qtg_api_listener *l);

/* ---- request records ------------------------------------------------------ */

static void qtg_api_req_free_answer(qtg_api_req *r) {
  for (int i = 0; i < r->nheaders; i++) free(r->headers[i]);
  free(r->headers);
  free(r->answer);
  r->headers = NULL;
  r->nheaders = 0;
  r->answer = NULL;
}

/* A new request record (one reference: MHD's), counted while it lives. */
static qtg_api_req *qtg_api_req_new(qtg_api_listener *l, struct MHD_Connection *conn) {
  qtg_api_req *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  r->l = l;
  r->conn = conn;
  r->refs = 1;
  l->api->records++;
  return r;
}

static void qtg_api_req_unref(qtg_api_req *r) {
  if (--r->refs > 0) return;
  r->l->api->records--;
  qtg_api_req_free_answer(r);
  free(r->raw_path);
  free(r->body);
  free(r);
}

static void qtg_api_unlink_running(qtg_api_req *r) {
  struct qtg_api *api = r->l->api;
  if (r->prev) r->prev->next = r->next;
  else if (api->running == r) api->running = r->next;
  if (r->next) r->next->prev = r->prev;
  r->prev = r->next = NULL;
}

/* A canned problem+json answer (limits and failures decided in C). */
static void qtg_api_set_problem(qtg_api_req *r, int status, const char *kind, const char *title,
                                const char *detail) {
  char buf[768], q[512];
  qtg_api_req_free_answer(r);
  size_t qn = qtg_json_quote(q, sizeof q - 1, detail, strlen(detail));
  q[qn < sizeof q ? qn : sizeof q - 1] = 0;   /* details are short: never cut */
  int n = snprintf(buf, sizeof buf,
                   "{\"type\":\"urn:qtg:problem:%s\",\"title\":\"%s\",\"status\":%d,\"detail\":%s,\"kind\":\"%s\"}",
                   kind, title, status, q, kind);
  if (n < 0 || (size_t)n >= sizeof buf) n = 0;
  r->status = status;
  r->answer = malloc((size_t)n + 1);
  if (r->answer) {
    memcpy(r->answer, buf, (size_t)n);
    r->answer_len = (size_t)n;
  } else {
    r->answer_len = 0;
  }
  r->headers = calloc(2, sizeof *r->headers);
  if (r->headers) {
    r->headers[0] = strdup("Content-Type");
    r->headers[1] = strdup("application/problem+json");
    if (r->headers[0] && r->headers[1]) r->nheaders = 2;
    else { free(r->headers[0]); free(r->headers[1]); }
  }
  r->phase = QTG_REQ_READY;
}

/* The body is handed to MHD (MUST_FREE), not copied: a large answer is
 * held once, by MHD, only as long as it is being sent. */
static enum MHD_Result qtg_api_queue(qtg_api_req *r) {
  struct MHD_Response *resp =
      r->answer ? MHD_create_response_from_buffer(r->answer_len, r->answer, MHD_RESPMEM_MUST_FREE)
                : MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
  if (!resp) return MHD_NO;
  r->answer = NULL;
  r->answer_len = 0;
  for (int i = 0; i + 1 < r->nheaders; i += 2)
    if (MHD_add_response_header(resp, r->headers[i], r->headers[i + 1]) != MHD_YES)
      qtg_log_warn("api: response header %s refused", r->headers[i]);
  if (r->close && MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close") != MHD_YES) {
    /* the connection must not carry another request: no answer at all then */
    MHD_destroy_response(resp);
    return MHD_NO;
  }
  enum MHD_Result rc = MHD_queue_response(r->conn, (unsigned)r->status, resp);
  MHD_destroy_response(resp);
  r->phase = QTG_REQ_ANSWERED;
  r->l->api->served++;
  return rc;
}

/* The answer is ready while MHD holds the connection suspended: resume it
 * and let MHD call the access handler again (which queues the answer). */
static void qtg_api_wake(qtg_api_req *r) {
  if (r->suspended && r->conn) {
    r->suspended = 0;
    MHD_resume_connection(r->conn);
    qtg_api_schedule(r->l);
  }
}

/* ---- the task ----------------------------------------------------------- */

/* Copy the handler's answer (status, headers table, body) off its thread. */
static void qtg_api_take_answer(qtg_api_req *r, lua_State *co, int nres) {
  int base = lua_gettop(co) - nres + 1;
  int status = nres >= 1 ? (int)lua_tointeger(co, base) : 0;
  if (status < 100 || status > 599) {
    qtg_api_set_problem(r, 500, "internal", "Internal Server Error", "the handler returned no status");
    return;
  }
  qtg_api_req_free_answer(r);
  r->status = status;
  if (nres >= 2 && lua_istable(co, base + 1)) {
    int n = 0;
    lua_pushnil(co);
    while (lua_next(co, base + 1)) {
      n++;
      lua_pop(co, 1);
    }
    r->headers = calloc((size_t)n * 2 + 1, sizeof *r->headers);
    if (r->headers) {
      lua_pushnil(co);
      while (lua_next(co, base + 1)) {
        if (lua_type(co, -2) == LUA_TSTRING && lua_type(co, -1) == LUA_TSTRING) {
          char *k = strdup(lua_tostring(co, -2)), *v = strdup(lua_tostring(co, -1));
          if (k && v) {
            r->headers[r->nheaders++] = k;
            r->headers[r->nheaders++] = v;
          } else {
            free(k);
            free(v);
          }
        }
        lua_pop(co, 1);
      }
    }
  }
  size_t len = 0;
  const char *body = nres >= 3 ? lua_tolstring(co, base + 2, &len) : NULL;
  if (body && len) {
    r->answer = malloc(len);
    if (!r->answer) {
      qtg_api_set_problem(r, 500, "internal", "Internal Server Error", "out of memory");
      return;
    }
    memcpy(r->answer, body, len);
    r->answer_len = len;
  }
  r->phase = QTG_REQ_READY;
}

static void qtg_api_task_done(qtg_task *t, int ok, int nres, void *data) {
  qtg_api_req *r = data;
  lua_State *co = qtg_task_thread(t);
  r->task = NULL;
  qtg_api_unlink_running(r);
  if (r->phase == QTG_REQ_RUNNING) {
    if (ok) qtg_api_take_answer(r, co, nres);
    else qtg_api_set_problem(r, 500, "internal", "Internal Server Error", "the request handler failed; see the log");
    qtg_api_wake(r);
  }
  qtg_api_req_unref(r);
}

static enum MHD_Result qtg_api_push_value(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  lua_State *L = cls;
  (void)kind;
  if (!key) return MHD_YES;
  char name[128];
  size_t n = strlen(key);
  if (n >= sizeof name) return MHD_YES;   /* longer names matter to no route */
  for (size_t i = 0; i <= n; i++) name[i] = (char)((key[i] >= 'A' && key[i] <= 'Z') ? key[i] + 32 : key[i]);
  lua_getfield(L, -1, name);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lua_pushstring(L, value ? value : "");
  } else {
    /* a repeated header joins with ", " (RFC 9110 5.3) */
    lua_pushliteral(L, ", ");
    lua_pushstring(L, value ? value : "");
    lua_concat(L, 3);
  }
  lua_setfield(L, -2, name);
  return MHD_YES;
}

/* Query arguments keep their case; a repeated one is recorded in dups. */
static enum MHD_Result qtg_api_push_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
  lua_State *L = cls;   /* stack: ..., query, dups */
  (void)kind;
  if (!key) return MHD_YES;
  lua_getfield(L, -2, key);
  int seen = !lua_isnil(L, -1);
  lua_pop(L, 1);
  if (seen) {
    lua_pushboolean(L, 1);
    lua_setfield(L, -2, key);
    return MHD_YES;
  }
  lua_pushstring(L, value ? value : "");
  lua_setfield(L, -3, key);
  return MHD_YES;
}

static void qtg_api_start_task(qtg_api_req *r, const char *url, const char *method) {
  struct qtg_api *api = r->l->api;
  lua_State *L = api->host->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, api->handler_ref);
  lua_createtable(L, 0, 8);
  lua_pushstring(L, method);
  lua_setfield(L, -2, "method");
  lua_pushstring(L, url);
  lua_setfield(L, -2, "path");
  lua_pushstring(L, r->raw_path ? r->raw_path : url);
  lua_setfield(L, -2, "raw_path");
  lua_pushlstring(L, r->body ? r->body : "", r->len);
  lua_setfield(L, -2, "body");
  lua_pushstring(L, r->l->address);
  lua_setfield(L, -2, "listener");
  lua_newtable(L);
  MHD_get_connection_values(r->conn, MHD_HEADER_KIND, qtg_api_push_value, L);
  lua_setfield(L, -2, "headers");
  lua_newtable(L);
  lua_newtable(L);
  MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, qtg_api_push_arg, L);
  lua_setfield(L, -3, "query_repeated");
  lua_setfield(L, -2, "query");
  free(r->body);
  r->body = NULL;
  r->phase = QTG_REQ_RUNNING;
  r->refs++;
  r->deadline = (double)uv_now(api->host->loop) / 1000.0 + api->request_timeout;
  r->next = api->running;
  if (api->running) api->running->prev = r;
  api->running = r;
  r->task = qtg_task_spawn(api->host, "api", 1, QTG_TASK_QUIET, qtg_api_task_done, r);
  if (!r->task && r->phase == QTG_REQ_RUNNING) {
    /* out of memory before the task began: no done callback will come */
    qtg_api_unlink_running(r);
    r->refs--;
    qtg_api_set_problem(r, 503, "unavailable", "Service Unavailable", "out of memory");
  }
}

/* ---- MHD callbacks ---------------------------------------------------- */

static double qtg_api_now(struct qtg_api *api) { return (double)uv_now(api->host->loop) / 1000.0; }

static qtg_api_conn *qtg_api_conn_of(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return info ? (qtg_api_conn *)info->socket_context : NULL;
}

/* MHD_OPTION_NOTIFY_CONNECTION: a connection opened or closed. */
static void qtg_api_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                               enum MHD_ConnectionNotificationCode toe) {
  qtg_api_listener *l = cls;
  struct qtg_api *api = l->api;
  qtg_api_conn *c = *socket_context;
  if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
    c = calloc(1, sizeof *c);
    if (!c) return;   /* not swept: the idle timeout still applies */
    c->l = l;
    c->conn = conn;
    c->since = qtg_api_now(api);
    c->owes = QTG_OWES_HEADERS;
    c->next = api->conns;
    if (api->conns) api->conns->prev = c;
    api->conns = c;
    *socket_context = c;
  } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED && c) {
    if (c->unseen) qtg_api_req_unref(c->unseen);
    if (c->prev) c->prev->next = c->next;
    else if (api->conns == c) api->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    *socket_context = NULL;
    free(c);
  }
}

/* MHD_OPTION_URI_LOG_CALLBACK: called once per request with the request
 * line's URI as sent, before libmicrohttpd decodes it; the request record
 * is made here to keep its path (req.raw_path: the router matches it, so
 * /v3/%6de is not /v3/me).  MHD hands the record to the access handler as
 * *con_cls and to qtg_api_completed.  NULL (out of memory): the access
 * handler makes a record without a raw path and answers 503. */
static void *qtg_api_uri(void *cls, const char *uri, struct MHD_Connection *conn) {
  qtg_api_listener *l = cls;
  qtg_api_conn *c = qtg_api_conn_of(conn);
  if (c && c->unseen) {         /* the last request was given up unseen */
    qtg_api_req_unref(c->unseen);
    c->unseen = NULL;
  }
  qtg_api_req *r = qtg_api_req_new(l, conn);
  if (!r) return NULL;
  if (!uri) uri = "";
  size_t n = strcspn(uri, "?");
  r->raw_path = malloc(n + 1);
  if (!r->raw_path) {
    qtg_api_req_unref(r);
    return NULL;
  }
  memcpy(r->raw_path, uri, n);
  r->raw_path[n] = 0;
  if (c) c->unseen = r;
  return r;
}

/* ---- framing ---------------------------------------------------------- */

/* What a request's headers say about where its body ends, counted over
 * every header: MHD_lookup_connection_value finds only the first of a
 * name, and libmicrohttpd frames the body by that first one. */
typedef struct {
  unsigned lengths;             /* Content-Length headers */
  unsigned codings;             /* Transfer-Encoding headers */
  int bad_length;               /* a Content-Length that is not all digits */
  int bad_coding;               /* a Transfer-Encoding that is not just chunked */
  int bad_name;                 /* a name that is not a token */
  int bad_value;                /* a value holding CR, LF or NUL */
  int run_on;                   /* a name that starts as a framing one and runs on */
} qtg_api_framing;

/* A byte of a token (RFC 9110 5.6.2), which a field name must be. */
static int qtg_api_tchar(unsigned char ch) {
  if ((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')) return 1;
  return ch != 0 && strchr("!#$%&'*+-.^_`|~", ch) != NULL;
}

/* s (n bytes) is want, in any case. */
static int qtg_api_is(const char *s, size_t n, const char *want) {
  size_t w = strlen(want);
  return n == w && strncasecmp(s, want, w) == 0;
}

/* s (n bytes) starts with want, in any case, and goes on. */
static int qtg_api_runs_on(const char *s, size_t n, const char *want) {
  size_t w = strlen(want);
  return n > w && strncasecmp(s, want, w) == 0;
}

static int qtg_api_all_digits(const char *s, size_t n) {
  if (!s || n == 0) return 0;
  for (size_t i = 0; i < n; i++)
    if (s[i] < '0' || s[i] > '9') return 0;
  return 1;
}

/* MHD_get_connection_values_n's iterator: counts one header into the
 * qtg_api_framing at cls.  A name that runs on past a framing one is how
 * libmicrohttpd 0.9.75 keeps a header continued on a second line
 * (obs-fold): `Content-Length: 2` then ` 40` reaches us as
 * `Content-Length40: 2`, which it does not frame by and a proxy may read
 * as a length. */
static enum MHD_Result qtg_api_count_framing(void *cls, enum MHD_ValueKind kind, const char *key,
                                             size_t key_size, const char *value, size_t value_size) {
  qtg_api_framing *f = cls;
  (void)kind;
  for (size_t i = 0; i < key_size; i++)
    if (!qtg_api_tchar((unsigned char)key[i])) f->bad_name = 1;
  /* a bare CR libmicrohttpd keeps inside a value is a line end to a proxy
   * that splits on it (RFC 9112 2.2): what follows would be a header
   * there and a value here */
  for (size_t i = 0; value != NULL && i < value_size; i++)
    if (value[i] == '\r' || value[i] == '\n' || value[i] == '\0') f->bad_value = 1;
  if (qtg_api_is(key, key_size, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
    f->lengths++;
    if (!qtg_api_all_digits(value, value_size)) f->bad_length = 1;
  } else if (qtg_api_is(key, key_size, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
    f->codings++;
    if (!value || !qtg_api_is(value, value_size, "chunked")) f->bad_coding = 1;
  } else if (qtg_api_runs_on(key, key_size, MHD_HTTP_HEADER_CONTENT_LENGTH) ||
             qtg_api_runs_on(key, key_size, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
    f->run_on = 1;
  }
  return MHD_YES;
}

/* Why a request's framing is refused, or NULL.  qtgd takes a body framed
 * by one Content-Length of digits or by one Transfer-Encoding: chunked, or
 * no body; anything else (RFC 9112 6.1, 6.3) a proxy in front may frame
 * otherwise than libmicrohttpd, which takes the first Content-Length and
 * ignores a name it does not know, and the rest of the bytes would be
 * served as another request (request smuggling). */
static const char *qtg_api_framing_refusal(struct MHD_Connection *conn, const char *version) {
  qtg_api_framing f;
  memset(&f, 0, sizeof f);
  if (MHD_get_connection_values_n(conn, MHD_HEADER_KIND, qtg_api_count_framing, &f) < 0)
    return "the request's headers cannot be read";
  if (f.bad_name)
    return "a header name that is not a token (whitespace before the colon, a control byte) is refused";
  if (f.bad_value) return "a header value holding a CR, LF or NUL byte is refused";
  if (f.run_on)
    return "a Content-Length or Transfer-Encoding continued on a second line (obs-fold), or a header "
           "name that runs on past one, is refused";
  if (f.lengths && f.codings)
    return "a request with both Content-Length and Transfer-Encoding is refused";
  if (f.lengths > 1) return "a request with more than one Content-Length is refused";
  if (f.bad_length) return "a Content-Length that is not all digits is refused";
  if (f.codings > 1 || f.bad_coding)
    return "a Transfer-Encoding is refused unless it is given once and is only 'chunked'";
  /* HTTP/1.0 has no transfer codings: such a request's framing is faulty
   * (RFC 9112 6.1), and a proxy of that version frames it by the close */
  if (f.codings && (version == NULL || strcmp(version, MHD_HTTP_VERSION_1_1) != 0))
    return "a Transfer-Encoding in a request of a version before HTTP/1.1 is refused";
  return NULL;
}

static enum MHD_Result qtg_api_access(void *cls, struct MHD_Connection *conn, const char *url,
                                      const char *method, const char *version,
                                      const char *upload_data, size_t *upload_data_size,
                                      void **con_cls) {
  qtg_api_listener *l = cls;
  struct qtg_api *api = l->api;
  qtg_api_req *r = *con_cls;
  if (!r) {
    r = qtg_api_req_new(l, conn);
    if (!r) return MHD_NO;
    *con_cls = r;
  }
  if (!r->started) {
    r->started = 1;
    r->conn = conn;
    qtg_api_conn *c = qtg_api_conn_of(conn);
    if (c && c->unseen == r) c->unseen = NULL;   /* its completion frees it now */
    if (c) {                    /* the headers are in; the body is owed from now */
      c->owes = QTG_OWES_BODY;
      c->since = qtg_api_now(api);
    }
    if (!r->raw_path) {
      r->close = 1;
      qtg_api_set_problem(r, 503, "unavailable", "Service Unavailable", "out of memory");
      return qtg_api_queue(r);
    }
    /* Framing a proxy may read otherwise (qtg_api_framing_refusal): refused
     * before any body is read, and the connection closed, so nothing after
     * these headers is taken for another request. */
    const char *why = qtg_api_framing_refusal(conn, version);
    if (why) {
      r->close = 1;
      qtg_api_set_problem(r, 400, "bad_request", "Bad Request", why);
      return qtg_api_queue(r);
    }
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    /* A declared body over the cap is refused before it is read when it is
     * absurdly large; a modestly large one is read and discarded, so the
     * client, still sending, gets the 413 instead of a reset connection. */
    if (cl) {
      char *end = NULL;
      errno = 0;
      unsigned long long n = strtoull(cl, &end, 10);
      if (errno || end == cl || *end || n > api->max_body) r->too_large = 1;
      if (errno || end == cl || *end || n / 8 > api->max_body) {
        api->refused_too_large++;
        char msg[128];
        snprintf(msg, sizeof msg, "the body is larger than %zu bytes (MG_API_MAX_BODY_BYTES)", api->max_body);
        qtg_api_set_problem(r, 413, "too_large", "Content Too Large", msg);
        return qtg_api_queue(r);
      }
    }
    return MHD_YES;
  }
  if (r->phase == QTG_REQ_BODY && *upload_data_size > 0) {
    size_t n = *upload_data_size;
    *upload_data_size = 0;
    if (r->too_large) return MHD_YES;       /* discard the rest */
    if (n > api->max_body - r->len) {
      r->too_large = 1;
      free(r->body);
      r->body = NULL;
      r->len = r->cap = 0;
      return MHD_YES;
    }
    if (r->len + n > r->cap) {
      size_t cap = r->cap ? r->cap : 1024;
      while (cap < r->len + n) cap *= 2;
      if (cap > api->max_body) cap = api->max_body;
      char *b = realloc(r->body, cap);
      if (!b) return MHD_NO;
      r->body = b;
      r->cap = cap;
    }
    memcpy(r->body + r->len, upload_data, n);
    r->len += n;
    return MHD_YES;
  }
  if (r->phase == QTG_REQ_BODY) {
    qtg_api_conn *c = qtg_api_conn_of(conn);
    if (c) c->owes = QTG_OWES_NOTHING;   /* the whole request is in */
    if (r->too_large) {
      api->refused_too_large++;
      char msg[128];
      snprintf(msg, sizeof msg, "the body is larger than %zu bytes (MG_API_MAX_BODY_BYTES)", api->max_body);
      qtg_api_set_problem(r, 413, "too_large", "Content Too Large", msg);
      return qtg_api_queue(r);
    }
    qtg_api_start_task(r, url, method);
  }
  if (r->phase == QTG_REQ_READY) return qtg_api_queue(r);
  if (r->phase == QTG_REQ_RUNNING && !r->suspended) {
    r->suspended = 1;
    MHD_suspend_connection(conn);
  }
  return MHD_YES;
}

static void qtg_api_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                              enum MHD_RequestTerminationCode toe) {
  qtg_api_req *r = *con_cls;
  qtg_api_listener *l = cls;
  (void)toe;
  qtg_api_conn *c = conn ? qtg_api_conn_of(conn) : NULL;
  if (c) {                      /* the next request's headers are owed from now */
    c->owes = QTG_OWES_HEADERS;
    c->since = qtg_api_now(l->api);
    if (r && c->unseen == r) c->unseen = NULL;
  }
  if (!r) return;
  *con_cls = NULL;
  r->conn = NULL;
  qtg_api_req_unref(r);
}

static void qtg_api_mhd_log(void *cls, const char *fmt, va_list ap) {
  char buf[512];
  (void)cls;
  vsnprintf(buf, sizeof buf, fmt, ap);
  buf[strcspn(buf, "\n")] = 0;
  qtg_logf(QTG_LOG_DEBUG, "component", "api", "libmicrohttpd: %s", buf);
}

/* ---- the loop ----------------------------------------------------------- */

static void qtg_api_on_timer(uv_timer_t *t);

/* Run MHD, then arm the timer from its next timeout. */
static void qtg_api_run(qtg_api_listener *l) {
  if (!l->d) return;
  MHD_run(l->d);
  MHD_UNSIGNED_LONG_LONG ms = 0;
  if (MHD_get_timeout(l->d, &ms) == MHD_YES) {
    if (ms > 3600 * 1000) ms = 3600 * 1000;
    uv_timer_start(&l->timer, qtg_api_on_timer, (uint64_t)ms, 0);
  } else {
    uv_timer_stop(&l->timer);
  }
}

static void qtg_api_on_timer(uv_timer_t *t) { qtg_api_run(t->data); }

static void qtg_api_on_poll(uv_poll_t *p, int status, int events) {
  (void)status;
  (void)events;
  qtg_api_run(p->data);
}

/* Run MHD soon, from the loop (never from inside MHD's own callbacks). */
static void qtg_api_schedule(qtg_api_listener *l) {
  if (l->d) uv_timer_start(&l->timer, qtg_api_on_timer, 0, 0);
}

/* Whether the peer of fd has closed its side with nothing left unread: a
 * request it owes can then never arrive. */
static int qtg_api_peer_gone(int fd) {
  char byte;
  return recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* Shut down the connections that owe a request's headers or body past
 * their deadline, and those whose client closed its side without sending
 * them (libmicrohttpd then reads the end and closes the connection
 * itself): by itself it notices such a close only at the idle timeout,
 * and until then the socket counts against its address's share
 * (MG_API_MAX_CONNECTIONS_PER_IP), so a client that opens and drops
 * half-sent requests keeps its address refused without holding one
 * connection itself. */
static void qtg_api_sweep_slow(struct qtg_api *api, double now) {
  for (qtg_api_conn *c = api->conns; c; c = c->next) {
    if (c->owes == QTG_OWES_NOTHING || c->cut) continue;
    double limit = c->owes == QTG_OWES_HEADERS ? api->header_timeout : api->body_timeout;
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!info) continue;
    int slow = now - c->since >= limit;
    if (!slow && !qtg_api_peer_gone(info->connect_fd)) continue;
    c->cut = 1;
    if (slow) api->cut_slow++;
    if (shutdown(info->connect_fd, SHUT_RDWR) != 0)
      qtg_logf(QTG_LOG_DEBUG, "component", "api", "shutdown of a connection that owes a request: %s",
               strerror(errno));
    qtg_api_schedule(c->l);
  }
}

/* Deadlines of requests whose handler still runs, and of headers and bodies. */
static void qtg_api_sweep(uv_timer_t *t) {
  struct qtg_api *api = t->data;
  double now = qtg_api_now(api);
  qtg_api_sweep_slow(api, now);
  qtg_api_req *r = api->running;
  while (r) {
    qtg_api_req *next = r->next;
    if (r->phase == QTG_REQ_RUNNING && now >= r->deadline) {
      api->timed_out++;
      qtg_api_set_problem(r, 503, "timeout", "Service Unavailable",
                          "the request did not finish in time (MG_API_REQUEST_TIMEOUT_SECONDS); "
                          "its changes were rolled back unless a later read shows them");
      qtg_api_wake(r);
      if (r->task) qtg_task_interrupt(r->task);   /* its end only drops its hold */
      next = api->running;                        /* the list may have changed */
    }
    r = next;
  }
}

/* ---- listening ------------------------------------------------------------ */

static int qtg_api_bind_unix(qtg_api_listener *l, const char *path, char *err, size_t errlen) {
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof sa.sun_path) {
    snprintf(err, errlen, "MG_API_LISTEN: unix socket path too long: %s", path);
    return -1;
  }
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  struct stat st;
  if (lstat(path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      snprintf(err, errlen, "MG_API_LISTEN: %s exists and is not a socket; not touching it", path);
      return -1;
    }
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) {
      snprintf(err, errlen, "socket: %s", strerror(errno));
      return -1;
    }
    int rc = connect(probe, (struct sockaddr *)&sa, sizeof sa);
    close(probe);
    if (rc == 0) {
      snprintf(err, errlen, "MG_API_LISTEN: %s is in use by another process", path);
      return -1;
    }
    if (unlink(path) != 0) {
      snprintf(err, errlen, "cannot remove the stale API socket %s: %s", path, strerror(errno));
      return -1;
    }
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    return -1;
  }
  mode_t old = umask(0117);     /* born 0660: owner and group may call it */
  int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
  umask(old);
  if (rc != 0 || listen(fd, 128) != 0) {
    snprintf(err, errlen, "cannot listen on unix:%s: %s", path, strerror(errno));
    close(fd);
    return -1;
  }
  l->is_unix = 1;
  snprintf(l->path, sizeof l->path, "%s", path);
  snprintf(l->address, sizeof l->address, "unix:%s", path);
  return fd;
}

static int qtg_api_bind_tcp(qtg_api_listener *l, const char *entry, char *err, size_t errlen) {
  char host[128];
  const char *colon = strrchr(entry, ':');
  if (!colon || colon == entry || !colon[1] || (size_t)(colon - entry) >= sizeof host) {
    snprintf(err, errlen, "MG_API_LISTEN: '%s' is neither unix:PATH nor HOST:PORT", entry);
    return -1;
  }
  memcpy(host, entry, (size_t)(colon - entry));
  host[colon - entry] = 0;
  if (host[0] == '[' && host[strlen(host) - 1] == ']') {
    memmove(host, host + 1, strlen(host));
    host[strlen(host) - 1] = 0;
  }
  /* 0-65535 in at most 5 digits: getaddrinfo keeps a larger number's low
   * 16 bits (74016 listened on 8480, somewhere nobody expected the API) */
  const char *port = colon + 1;
  unsigned long value = 0;
  size_t digits = 0;
  for (const char *p = port; *p; p++, digits++) {
    if (*p < '0' || *p > '9' || digits >= 5) {
      snprintf(err, errlen, "MG_API_LISTEN: bad port in '%s' (a number from 0 to 65535)", entry);
      return -1;
    }
    value = value * 10 + (unsigned long)(*p - '0');
  }
  if (value > 65535) {
    snprintf(err, errlen, "MG_API_LISTEN: bad port in '%s' (a number from 0 to 65535)", entry);
    return -1;
  }
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  int gai = getaddrinfo(host, port, &hints, &res);
  if (gai != 0 || !res) {
    snprintf(err, errlen, "MG_API_LISTEN: cannot resolve '%s': %s", entry, gai_strerror(gai));
    if (res) freeaddrinfo(res);
    return -1;
  }
  int fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, res->ai_protocol);
  if (fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    freeaddrinfo(res);
    return -1;
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 128) != 0) {
    snprintf(err, errlen, "cannot listen on %s: %s", entry, strerror(errno));
    freeaddrinfo(res);
    close(fd);
    return -1;
  }
  freeaddrinfo(res);
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  char hbuf[NI_MAXHOST], pbuf[NI_MAXSERV];
  if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
      getnameinfo((struct sockaddr *)&ss, sl, hbuf, sizeof hbuf, pbuf, sizeof pbuf,
                  NI_NUMERICHOST | NI_NUMERICSERV) == 0)
    snprintf(l->address, sizeof l->address, ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", hbuf, pbuf);
  else
    snprintf(l->address, sizeof l->address, "%s", entry);
  return fd;
}

static void qtg_api_handle_closed(uv_handle_t *h) {
  qtg_api_listener *l = h->data;
  if (--l->handles == 0) free(l);
}

static void qtg_api_listener_close(qtg_api_listener *l) {
  /* Every record still waiting on a task is answered and let go: nothing
   * resumes a task from here on (see the header comment). */
  struct qtg_api *api = l->api;
  qtg_api_req *r = api->running;
  while (r) {
    qtg_api_req *next = r->next;
    if (r->l == l) {
      qtg_api_unlink_running(r);
      r->task = NULL;
      if (r->phase == QTG_REQ_RUNNING)
        qtg_api_set_problem(r, 503, "unavailable", "Service Unavailable", "qtgd is shutting down");
      if (r->suspended && r->conn) {
        r->suspended = 0;
        MHD_resume_connection(r->conn);
      }
      qtg_api_req_unref(r);
    }
    r = next;
  }
  if (l->handles) {
    uv_close((uv_handle_t *)&l->poll, qtg_api_handle_closed);
    uv_close((uv_handle_t *)&l->timer, qtg_api_handle_closed);
  }
  if (l->d) {
    MHD_run(l->d);               /* queue the answers just set */
    MHD_stop_daemon(l->d);       /* closes the listening socket */
    l->d = NULL;
  }
  if (l->is_unix) unlink(l->path);
  if (!l->handles) free(l);
}

static int qtg_api_listen_one(struct qtg_api *api, const char *entry, char *err, size_t errlen) {
  if (api->nlisteners >= QTG_API_MAX_LISTENERS) {
    snprintf(err, errlen, "MG_API_LISTEN: at most %d entries", QTG_API_MAX_LISTENERS);
    return -1;
  }
  qtg_api_listener *l = calloc(1, sizeof *l);
  if (!l) {
    snprintf(err, errlen, "api: out of memory");
    return -1;
  }
  l->api = api;
  int fd = strncmp(entry, "unix:", 5) == 0 ? qtg_api_bind_unix(l, entry + 5, err, errlen)
                                            : qtg_api_bind_tcp(l, entry, err, errlen);
  if (fd < 0) {
    free(l);
    return -1;
  }
  l->d = MHD_start_daemon(
      MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, 0, NULL, NULL, qtg_api_access, l,
      MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
      MHD_OPTION_CONNECTION_LIMIT, api->max_connections,
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, api->max_per_ip,
      MHD_OPTION_NOTIFY_CONNECTION, qtg_api_connection, l,
      MHD_OPTION_CONNECTION_TIMEOUT, api->idle_timeout,
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
      MHD_OPTION_NOTIFY_COMPLETED, qtg_api_completed, l,
      MHD_OPTION_URI_LOG_CALLBACK, qtg_api_uri, l,
      MHD_OPTION_EXTERNAL_LOGGER, qtg_api_mhd_log, l,
      MHD_OPTION_END);
  if (!l->d) {
    snprintf(err, errlen, "libmicrohttpd could not start on %s", l->address);
    close(fd);
    if (l->is_unix) unlink(l->path);
    free(l);
    return -1;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(l->d, MHD_DAEMON_INFO_EPOLL_FD);
  if (!info || uv_poll_init(api->host->loop, &l->poll, info->epoll_fd) != 0) {
    snprintf(err, errlen, "api: cannot watch libmicrohttpd's epoll fd");
    MHD_stop_daemon(l->d);
    if (l->is_unix) unlink(l->path);
    free(l);
    return -1;
  }
  uv_timer_init(api->host->loop, &l->timer);
  l->poll.data = l->timer.data = l;
  l->handles = 2;
  uv_poll_start(&l->poll, UV_READABLE, qtg_api_on_poll);
  api->listeners[api->nlisteners++] = l;
  qtg_api_run(l);
  return 0;
}

/* ---- subsystem ------------------------------------------------------------ */

int qtg_api_open(qtg_host *h, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  h->api = NULL;
  struct qtg_api *api = calloc(1, sizeof *api);
  if (!api) {
    snprintf(err, errlen, "api: out of memory");
    return -1;
  }
  api->host = h;
  api->handler_ref = LUA_NOREF;
  api->max_body = (size_t)qtg_settings_num(h->settings, QTG_S_API_MAX_BODY_BYTES);
  api->request_timeout = qtg_settings_num(h->settings, QTG_S_API_REQUEST_TIMEOUT_SECONDS);
  api->max_connections = (unsigned)qtg_settings_num(h->settings, QTG_S_API_MAX_CONNECTIONS);
  api->idle_timeout = (unsigned)qtg_settings_num(h->settings, QTG_S_API_IDLE_TIMEOUT_SECONDS);
  api->max_per_ip = (unsigned)qtg_settings_num(h->settings, QTG_S_API_MAX_CONNECTIONS_PER_IP);
  api->header_timeout = qtg_settings_num(h->settings, QTG_S_API_HEADER_TIMEOUT_SECONDS);
  api->body_timeout = qtg_settings_num(h->settings, QTG_S_API_BODY_TIMEOUT_SECONDS);
  h->api = api;
  return 0;
}

static void qtg_api_stop_all(struct qtg_api *api) {
  for (int i = 0; i < api->nlisteners; i++) qtg_api_listener_close(api->listeners[i]);
  api->nlisteners = 0;
  if (api->sweep_open) {
    api->sweep_open = 0;
    uv_close((uv_handle_t *)&api->sweep, (uv_close_cb)free);
  }
}

void qtg_api_close(qtg_host *h) {
  struct qtg_api *api = h->api;
  if (!api) return;
  h->api = NULL;
  int sweep = api->sweep_open;
  qtg_api_stop_all(api);
  if (api->handler_ref != LUA_NOREF && h->L) qtg_unref(h->L, api->handler_ref);
  /* the sweep timer is the first member freed by its close callback: the
   * struct goes with it */
  if (!sweep) free(api);
}

/* ---- the Lua module qtg.api_server ----------------------------------------- */

static struct qtg_api *qtg_api_check(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  if (!h || !h->api) qtg_raise(L, "usage", "the API server is not available in this process");
  return h->api;
}

static void qtg_api_push_addresses(lua_State *L, struct qtg_api *api) {
  lua_createtable(L, api->nlisteners, 0);
  for (int i = 0; i < api->nlisteners; i++) {
    lua_pushstring(L, api->listeners[i]->address);
    lua_rawseti(L, -2, i + 1);
  }
}

/* start(listen) -> array of addresses.  listen: MG_API_LISTEN's text. */
static int qtg_api_lua_start(lua_State *L) {
  struct qtg_api *api = qtg_api_check(L);
  const char *spec = luaL_checkstring(L, 1);
  char err[512] = "";
  if (api->nlisteners) return qtg_raise(L, "usage", "the API server is already listening");
  lua_getglobal(L, "require");
  lua_pushliteral(L, "qtg.api");
  if (lua_pcall(L, 1, 1, 0) != 0) return qtg_raise(L, "api", "cannot load qtg.api: %s", lua_tostring(L, -1));
  lua_pop(L, 1);
  if (qtg_prelude_load(L, QTG_PRELUDE_api) != 0)
    return qtg_raise(L, "api", "%s", lua_tostring(L, -1));
  if (api->handler_ref == LUA_NOREF) api->handler_ref = qtg_ref(L);
  else lua_pop(L, 1);
  char *copy = strdup(spec);
  if (!copy) return qtg_raise(L, "api", "out of memory");
  int rc = 0;
  for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ') tok++;
    char *end = tok + strlen(tok);
    while (end > tok && end[-1] == ' ') *--end = 0;
    if (!*tok) continue;
    if ((rc = qtg_api_listen_one(api, tok, err, sizeof err)) != 0) break;
  }
  free(copy);
  if (rc != 0) {
    for (int i = 0; i < api->nlisteners; i++) qtg_api_listener_close(api->listeners[i]);
    api->nlisteners = 0;
    return qtg_raise(L, "api", "%s", err);
  }
  if (!api->sweep_open && api->nlisteners) {
    uv_timer_init(api->host->loop, &api->sweep);
    api->sweep.data = api;
    api->sweep_open = 1;
    uv_timer_start(&api->sweep, qtg_api_sweep, 250, 250);
    uv_unref((uv_handle_t *)&api->sweep);
  }
  for (int i = 0; i < api->nlisteners; i++)
    qtg_log_fields(QTG_LOG_INFO, "api listening",
                   (const char *const[]){"address", api->listeners[i]->address, NULL});
  qtg_api_push_addresses(L, api);
  return 1;
}

static int qtg_api_lua_addresses(lua_State *L) {
  qtg_api_push_addresses(L, qtg_api_check(L));
  return 1;
}

/* stats() -> {listeners=, running=, served=, refused_too_large=, timed_out=,
 * cut_slow=, connections=, records=}: records counts the request records
 * alive (running, being answered, or made for a request line whose headers
 * are still coming), connections the open connections. */
static int qtg_api_lua_stats(lua_State *L) {
  struct qtg_api *api = qtg_api_check(L);
  int running = 0, connections = 0;
  for (qtg_api_req *r = api->running; r; r = r->next) running++;
  for (qtg_api_conn *c = api->conns; c; c = c->next) connections++;
  lua_createtable(L, 0, 8);
  lua_pushinteger(L, connections);
  lua_setfield(L, -2, "connections");
  lua_pushnumber(L, (lua_Number)api->records);
  lua_setfield(L, -2, "records");
  lua_pushinteger(L, api->nlisteners);
  lua_setfield(L, -2, "listeners");
  lua_pushinteger(L, running);
  lua_setfield(L, -2, "running");
  lua_pushnumber(L, (lua_Number)api->served);
  lua_setfield(L, -2, "served");
  lua_pushnumber(L, (lua_Number)api->refused_too_large);
  lua_setfield(L, -2, "refused_too_large");
  lua_pushnumber(L, (lua_Number)api->timed_out);
  lua_setfield(L, -2, "timed_out");
  lua_pushnumber(L, (lua_Number)api->cut_slow);
  lua_setfield(L, -2, "cut_slow");
  return 1;
}

static const luaL_Reg qtg_api_funcs[] = {
    {"start", qtg_api_lua_start},
    {"addresses", qtg_api_lua_addresses},
    {"stats", qtg_api_lua_stats},
    {NULL, NULL},
};

int luaopen_qtg_api_server(lua_State *L) {
  lua_newtable(L);
  luaL_register(L, NULL, qtg_api_funcs);
  return 1;
}
