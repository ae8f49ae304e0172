/* qtg_http.c -- libcurl multi driven by the host's libuv loop.  See
 * qtg_http.h for the contract; this file is the glue:
 *
 *   curl socket callback  -> one uv_poll_t per socket (started, changed,
 *                            stopped and closed as curl asks)
 *   curl timer callback   -> the one uv_timer_t of the subsystem
 *   poll / timer events   -> curl_multi_socket_action, then
 *                            curl_multi_info_read for finished transfers
 *
 * A finished transfer is classified (timeout, refused, tls, ...) and handed
 * to its callback outside any curl callback, so the callback may start new
 * requests.  No state is global: each host has its own multi handle, and
 * curl_global_init/cleanup are reference-counted by libcurl itself.
 */
#include "qtg_http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "qtg_http_call.h"

typedef struct qtg_http_socket qtg_http_socket;

struct qtg_http {
  uv_loop_t *loop;
  CURLM *multi;
  uv_timer_t timer;
  qtg_http_call *calls;          /* in flight */
  qtg_http_socket *sockets;      /* polled for curl */
  size_t ncalls;
  int open_handles;              /* uv handles not yet closed */
  int closing;
};

struct qtg_http_socket {
  uv_poll_t poll;
  curl_socket_t fd;
  qtg_http *http;
  qtg_http_socket *prev, *next;
  int closing;
};

/* ---- handles ------------------------------------------------------------ */

static void qtg_http_maybe_free(qtg_http *http) {
  if (http->closing && http->open_handles == 0) free(http);
}

static void qtg_http_timer_closed(uv_handle_t *handle) {
  qtg_http *http = handle->data;
  http->open_handles--;
  qtg_http_maybe_free(http);
}

static void qtg_http_socket_closed(uv_handle_t *handle) {
  qtg_http_socket *s = handle->data;
  qtg_http *http = s->http;
  free(s);
  http->open_handles--;
  qtg_http_maybe_free(http);
}

static void qtg_http_socket_close(qtg_http_socket *s) {
  qtg_http *http = s->http;
  if (s->closing) return;
  s->closing = 1;
  if (s->prev) s->prev->next = s->next;
  if (s->next) s->next->prev = s->prev;
  if (http->sockets == s) http->sockets = s->next;
  uv_poll_stop(&s->poll);
  uv_close((uv_handle_t *)&s->poll, qtg_http_socket_closed);
}

/* ---- completions ---------------------------------------------------------- */

static void qtg_http_call_unlink(qtg_http_call *c) {
  qtg_http *http = c->http;
  if (c->prev) c->prev->next = c->next;
  if (c->next) c->next->prev = c->prev;
  if (http->calls == c) http->calls = c->next;
  c->prev = c->next = NULL;
  http->ncalls--;
}

/* Hand a finished call to its owner, then free it.  The call is already
 * out of the multi handle and the in-flight list. */
static void qtg_http_call_finish(qtg_http_call *c, qtg_http_kind kind,
                                 int curl_code, const char *message) {
  qtg_http_response res;
  long status = 0;
  memset(&res, 0, sizeof res);
  res.kind = kind;
  res.url = c->url;
  res.curl_code = curl_code;
  res.message = message != NULL ? message : "";
  /* The status is known whenever headers arrived, also when the body was
   * then refused (too_large) or cut short: callers may need it. */
  if (curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &status) != CURLE_OK)
    status = 0;
  res.status = status;
  if (kind == QTG_HTTP_OK) {
    res.headers = c->headers;
    res.nheaders = c->nheaders;
    res.body = c->body != NULL ? c->body : "";
    res.body_len = c->body_len;
  }
  c->cb(&res, c->data);
  qtg_http_call_free(c);
}

static void qtg_http_check_done(qtg_http *http) {
  CURLMsg *msg;
  int left;
  while (!http->closing && (msg = curl_multi_info_read(http->multi, &left))) {
    qtg_http_call *c = NULL;
    CURLcode rc;
    char message[CURL_ERROR_SIZE + 128];
    qtg_http_kind kind;

    if (msg->msg != CURLMSG_DONE) continue;
    rc = msg->data.result;
    if (curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&c) !=
            CURLE_OK || c == NULL)
      continue;
    curl_multi_remove_handle(http->multi, c->easy);
    qtg_http_call_unlink(c);
    kind = qtg_http_call_outcome(c, rc, message, sizeof message);
    qtg_http_call_finish(c, kind, (int)rc, message);
  }
}

/* ---- curl -> libuv -------------------------------------------------------- */

static void qtg_http_on_poll(uv_poll_t *poll, int status, int events) {
  qtg_http_socket *s = poll->data;
  qtg_http *http = s->http;
  int flags = 0, running = 0;
  if (status < 0) flags = CURL_CSELECT_ERR;
  if (events & UV_READABLE) flags |= CURL_CSELECT_IN;
  if (events & UV_WRITABLE) flags |= CURL_CSELECT_OUT;
  curl_multi_socket_action(http->multi, s->fd, flags, &running);
  qtg_http_check_done(http);
}

static void qtg_http_on_timer(uv_timer_t *timer) {
  qtg_http *http = timer->data;
  int running = 0;
  curl_multi_socket_action(http->multi, CURL_SOCKET_TIMEOUT, 0, &running);
  qtg_http_check_done(http);
}

static int qtg_http_socket_cb(CURL *easy, curl_socket_t fd, int what,
                              void *userp, void *socketp) {
  qtg_http *http = userp;
  qtg_http_socket *s = socketp;
  int events = 0;
  (void)easy;

  /* A socket closed by qtg_http_close is already unwatched; curl may still
   * report it while its multi handle is cleaned up. */
  if (s != NULL && s->closing) return 0;
  if (what == CURL_POLL_REMOVE) {
    if (s != NULL) {
      curl_multi_assign(http->multi, fd, NULL);
      qtg_http_socket_close(s);
    }
    return 0;
  }
  if (s == NULL) {
    if (http->closing) return -1;
    s = calloc(1, sizeof *s);
    if (s == NULL) return -1;
    s->fd = fd;
    s->http = http;
    if (uv_poll_init_socket(http->loop, &s->poll, fd) != 0) {
      free(s);
      return -1;
    }
    s->poll.data = s;
    http->open_handles++;
    s->next = http->sockets;
    if (http->sockets) http->sockets->prev = s;
    http->sockets = s;
    if (curl_multi_assign(http->multi, fd, s) != CURLM_OK) {
      qtg_http_socket_close(s);
      return -1;
    }
  }
  if (what == CURL_POLL_IN || what == CURL_POLL_INOUT) events |= UV_READABLE;
  if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT) events |= UV_WRITABLE;
  if (uv_poll_start(&s->poll, events, qtg_http_on_poll) != 0) return -1;
  return 0;
}

static int qtg_http_timer_cb(CURLM *multi, long timeout_ms, void *userp) {
  qtg_http *http = userp;
  (void)multi;
  if (http->closing) return 0;
  if (timeout_ms < 0) {
    uv_timer_stop(&http->timer);
    return 0;
  }
  /* Never act from inside curl: even a 0 ms timeout fires from the loop. */
  return uv_timer_start(&http->timer, qtg_http_on_timer, (uint64_t)timeout_ms, 0) == 0
             ? 0
             : -1;
}

/* ---- requests ------------------------------------------------------------ */

int qtg_http_start(qtg_http *http, const qtg_http_request *req,
                   qtg_http_done_cb cb, void *data, qtg_http_call **call,
                   qtg_http_kind *kind, char *err, size_t errlen) {
  qtg_http_call *c;

  *kind = QTG_HTTP_ERROR;
  if (call != NULL) *call = NULL;
  if (http == NULL || http->closing) {
    snprintf(err, errlen, "http is closed");
    return -1;
  }
  c = qtg_http_call_new(req, kind, err, errlen);
  if (c == NULL) return -1;
  c->http = http;
  c->cb = cb;
  c->data = data;
  if (curl_multi_add_handle(http->multi, c->easy) != CURLM_OK) {
    *kind = QTG_HTTP_ERROR;
    snprintf(err, errlen, "cannot add the request to the transfer queue");
    qtg_http_call_free(c);
    return -1;
  }
  c->next = http->calls;
  if (http->calls) http->calls->prev = c;
  http->calls = c;
  http->ncalls++;
  if (call != NULL) *call = c;
  return 0;
}

void qtg_http_abort(qtg_http_call *c) {
  qtg_http *http = c->http;
  curl_multi_remove_handle(http->multi, c->easy);
  qtg_http_call_unlink(c);
  qtg_http_call_free(c);
}

size_t qtg_http_in_flight(const qtg_http *http) {
  return http != NULL ? http->ncalls : 0;
}

/* ---- subsystem ------------------------------------------------------------- */

int qtg_http_open(qtg_host *h, char *err, size_t errlen) {
  qtg_http *http;
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    snprintf(err, errlen, "http: curl_global_init failed");
    return -1;
  }
  http = calloc(1, sizeof *http);
  if (http == NULL) {
    snprintf(err, errlen, "http: out of memory");
    curl_global_cleanup();
    return -1;
  }
  http->loop = h->loop;
  http->multi = curl_multi_init();
  if (http->multi == NULL || uv_timer_init(h->loop, &http->timer) != 0) {
    snprintf(err, errlen, "http: cannot create the transfer queue");
    if (http->multi) curl_multi_cleanup(http->multi);
    free(http);
    curl_global_cleanup();
    return -1;
  }
  http->timer.data = http;
  http->open_handles = 1;
  if (curl_multi_setopt(http->multi, CURLMOPT_SOCKETFUNCTION, qtg_http_socket_cb) != CURLM_OK ||
      curl_multi_setopt(http->multi, CURLMOPT_SOCKETDATA, http) != CURLM_OK ||
      curl_multi_setopt(http->multi, CURLMOPT_TIMERFUNCTION, qtg_http_timer_cb) != CURLM_OK ||
      curl_multi_setopt(http->multi, CURLMOPT_TIMERDATA, http) != CURLM_OK ||
      curl_multi_setopt(http->multi, CURLMOPT_MAXCONNECTS,
                        (long)QTG_HTTP_MAX_IDLE_CONNECTIONS) != CURLM_OK) {
    snprintf(err, errlen, "http: libcurl refused the multi options");
    curl_multi_cleanup(http->multi);
    http->multi = NULL;
    http->closing = 1;
    uv_close((uv_handle_t *)&http->timer, qtg_http_timer_closed);
    curl_global_cleanup();
    return -1;
  }
  h->http = http;
  return 0;
}

void qtg_http_close(qtg_host *h) {
  qtg_http *http = h->http;
  if (http == NULL) return;
  h->http = NULL;
  /* Owners hear "cancelled" (so their callbacks may free what they hold);
   * starts from inside those callbacks are refused. */
  http->closing = 1;
  while (http->calls != NULL) {
    qtg_http_call *c = http->calls;
    curl_multi_remove_handle(http->multi, c->easy);
    qtg_http_call_unlink(c);
    qtg_http_call_finish(c, QTG_HTTP_CANCELLED, 0, "http closed with the request in flight");
  }
  /* Stop watching before curl closes the sockets under the polls. */
  while (http->sockets != NULL) qtg_http_socket_close(http->sockets);
  curl_multi_cleanup(http->multi);
  http->multi = NULL;
  uv_timer_stop(&http->timer);
  uv_close((uv_handle_t *)&http->timer, qtg_http_timer_closed);
  curl_global_cleanup();
}
