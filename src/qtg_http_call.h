/* qtg_http_call.h -- one request's easy handle and what it collects.
 * Internal to the http subsystem (qtg_http.c drives the handles on the
 * loop; qtg_http_call.c builds them and judges their outcome).
 */
#ifndef QTG_HTTP_CALL_H
#define QTG_HTTP_CALL_H

#include <stddef.h>

#include <curl/curl.h>

#include "qtg_http.h"

struct qtg_http_call {
  qtg_http *http;                /* set by qtg_http_start */
  CURL *easy;
  struct curl_slist *req_headers;
  struct curl_slist *resolve;    /* the pin's CURLOPT_RESOLVE entries */
  struct curl_slist *connect_to; /* the pin's CURLOPT_CONNECT_TO entry */
  char *pin_name, *pin_host;     /* the pin's connect-to name, for the URL's host */
  CURLSH *dns;                   /* the pinned call's own DNS cache */
  qtg_http_done_cb cb;
  void *data;
  char *url;                     /* as requested, without user:password */
  size_t max_body;
  int too_large;                 /* set by the write/header callbacks */
  const char *too_large_what;    /* "response body" or "response headers" */
  size_t too_large_limit;
  const char *bad_response;      /* why the header callback refused the answer */
  char *body;                    /* response body (NUL-terminated) */
  size_t body_len, body_cap;
  qtg_http_header *headers;      /* of the current response */
  size_t nheaders, headers_cap, header_bytes;
  qtg_http_call *prev, *next;    /* the in-flight list of qtg_http.c */
  char errbuf[CURL_ERROR_SIZE];
};

/* Check req and build its easy handle (CURLOPT_PRIVATE = the call).
 * NULL on a refused request (*kind = QTG_HTTP_INVALID) or on resources
 * (*kind = QTG_HTTP_ERROR), with a message in err. */
qtg_http_call *qtg_http_call_new(const qtg_http_request *req,
                                 qtg_http_kind *kind, char *err,
                                 size_t errlen);
void qtg_http_call_free(qtg_http_call *c);

/* How a finished transfer ended, and why in words (message). */
qtg_http_kind qtg_http_call_outcome(const qtg_http_call *c, CURLcode rc,
                                    char *message, size_t msglen);

#endif
