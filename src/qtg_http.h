/* qtg_http.h -- outbound HTTP on the host's loop: libcurl's multi interface
 * with its sockets and timer handed to libuv.
 *
 * Why: workers call providers and callback receivers; a slow or dead peer
 * must never stall the loop (and with it every other worker).  Each request
 * is an easy handle on the host's one multi handle (so connections and DNS
 * results are reused across requests); curl tells us which sockets to watch
 * (CURLMOPT_SOCKETFUNCTION -> one uv_poll_t per socket) and when to wake
 * it (CURLMOPT_TIMERFUNCTION -> one uv_timer_t), and completions are read
 * with curl_multi_info_read.
 *
 * The contract (libuv's): qtg_http_start either returns -1 and never calls
 * the callback, or returns 0 and calls it exactly once -- with the response,
 * with a classified failure, or with QTG_HTTP_CANCELLED when the subsystem
 * closes first -- unless the caller abandons the call with qtg_http_abort,
 * after which the callback is never called.  The callback never runs
 * inside qtg_http_start.
 *
 * Safe defaults: TLS verification on, redirects not followed, only http and
 * https (also after redirects), a total and a connect timeout, a response
 * size limit.
 */
#ifndef QTG_HTTP_H
#define QTG_HTTP_H

#include <stddef.h>

#include "qtg_host.h"

typedef struct qtg_http qtg_http;
typedef struct qtg_http_call qtg_http_call;

/* How a request ended.  The names (qtg_http_kind_name) are what Lua sees
 * as err.kind. */
typedef enum {
  QTG_HTTP_OK = 0,       /* a response arrived (any status) */
  QTG_HTTP_TIMEOUT,      /* connect or total timeout */
  QTG_HTTP_REFUSED,      /* could not connect (refused, unreachable) */
  QTG_HTTP_TLS,          /* handshake or certificate verification failed */
  QTG_HTTP_TOO_LARGE,    /* body (or headers) above the limit */
  QTG_HTTP_DNS,          /* host name did not resolve */
  QTG_HTTP_INVALID,      /* bad URL, scheme, method or header */
  QTG_HTTP_CLOSED,       /* peer closed or reset the connection early */
  QTG_HTTP_ERROR,        /* any other transport or protocol failure */
  QTG_HTTP_CANCELLED     /* the subsystem closed while in flight */
} qtg_http_kind;

const char *qtg_http_kind_name(qtg_http_kind kind);

enum {
  QTG_HTTP_DEFAULT_MAX_BODY = 8 * 1024 * 1024,
  QTG_HTTP_MAX_HEADER_BYTES = 256 * 1024,
  /* Header lines of one response: a real one has a few dozen.  More is a
   * bad response, refused before anything reads them (each is a string and
   * a table field in Lua). */
  QTG_HTTP_MAX_HEADER_LINES = 256,
  QTG_HTTP_MAX_REDIRECTS = 5,
  QTG_HTTP_MAX_PIN = 16,
  /* Idle connections kept for reuse (CURLMOPT_MAXCONNECTS).  libcurl's
   * default is four per easy handle still added, so as the last transfer
   * of a batch ends the cache shrinks to four and closes the rest: a
   * callback batch of five reopened one connection (a TLS handshake, for
   * https) at every batch.  This covers the callback lanes' five batches
   * of five and the other workers' calls; a connection idle for longer
   * than libcurl's CURLOPT_MAXAGE_CONN (118 s) is closed at its next
   * use. */
  QTG_HTTP_MAX_IDLE_CONNECTIONS = 64
};
#define QTG_HTTP_DEFAULT_TIMEOUT 30.0
#define QTG_HTTP_DEFAULT_CONNECT_TIMEOUT 10.0

typedef struct {
  const char *method;            /* NULL = "GET"; letters, sent upper-case */
  const char *url;               /* http:// or https:// only */
  const char *const *headers;    /* "Name: value" lines */
  size_t nheaders;
  const char *body;              /* may be NULL; copied at start */
  size_t body_len;
  double timeout;                /* seconds, whole request; <= 0: default */
  double connect_timeout;        /* seconds; <= 0: default */
  size_t max_body;               /* bytes; 0: default */
  int follow_redirects;          /* 0: a 3xx is returned as is */
  int verify_tls;                /* 1 unless the caller says otherwise */
  const char *const *pin;        /* numeric addresses the URL's host is
                                    connected at, none looked up (see
                                    qtg_http_start); NULL: curl resolves */
  size_t npin;
} qtg_http_request;

typedef struct {
  const char *name;              /* lowercase */
  const char *value;             /* surrounding blanks trimmed */
} qtg_http_header;

/* Valid only during the callback. */
typedef struct {
  qtg_http_kind kind;
  const char *message;           /* "" on success; why, otherwise */
  const char *url;               /* the URL requested, minus user:password */
  int curl_code;                 /* CURLcode, 0 when not from curl */
  long status;                   /* HTTP status; 0 when no response header arrived */
  const qtg_http_header *headers;/* of the final response, in order */
  size_t nheaders;
  const char *body;
  size_t body_len;
} qtg_http_response;

typedef void (*qtg_http_done_cb)(const qtg_http_response *res, void *data);

/* Subsystem rows (qtg_modules.h).  close completes every call still in
 * flight with QTG_HTTP_CANCELLED, then closes its uv handles; the memory
 * is freed by their close callbacks when the loop next runs. */
int qtg_http_open(qtg_host *h, char *err, size_t errlen);
void qtg_http_close(qtg_host *h);

/* The host and port curl connects to for url, as its URL parser reads
 * them: the host normalised (an IPv4 address in any numeric form written
 * as dotted decimal, IPv6 without brackets), the port defaulted by the
 * scheme.  0, or -1 with a message in err (not an http/https URL with a
 * host). */
int qtg_http_url_target(const char *url, char *host, size_t hostlen,
                        long *port, char *err, size_t errlen);

/* Start a request.  With req->pin (up to QTG_HTTP_MAX_PIN addresses), the
 * connection goes to one of those addresses and nowhere else: for a host
 * name, CURLOPT_CONNECT_TO a name of the pinned set's own, resolved to the
 * addresses by CURLOPT_RESOLVE entries in a DNS cache of the call's own
 * (so the pin neither leaks into nor is raced by other calls); libcurl
 * reuses for it only a connection made under the same pin (one to the
 * same host, port and addresses).  A URL whose host is an address must
 * name one of the pinned addresses.  Callers check the addresses before
 * they pin them (lua/qtg/api/ssrf.lua).  On 0, *call (when call is
 * non-NULL) identifies it until the callback runs.  On -1, kind says why (QTG_HTTP_INVALID for a bad URL,
 * method or header; QTG_HTTP_ERROR for resources or a closed subsystem) and
 * err holds a message. */
int qtg_http_start(qtg_http *http, const qtg_http_request *req,
                   qtg_http_done_cb cb, void *data, qtg_http_call **call,
                   qtg_http_kind *kind, char *err, size_t errlen);

/* Abandon a call in flight: the transfer stops, the callback is never
 * called, the call's memory is freed. */
void qtg_http_abort(qtg_http_call *call);

/* The URL without user:password into out ("" when it does not parse as an
 * http/https URL, since then what to hide cannot be known). */
void qtg_http_redact_url(const char *url, char *out, size_t outlen);

/* Calls in flight (for tests and stats). */
size_t qtg_http_in_flight(const qtg_http *http);

#endif
