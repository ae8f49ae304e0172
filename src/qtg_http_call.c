/* qtg_http_call.c -- one HTTP request as a libcurl easy handle: checks
 * the request (URL scheme, method, header injection), sets the safe
 * options, collects the response (headers with lower-case names, a body
 * within its limit) and turns curl's result into a kind and a message.
 *
 * qtg_http.c drives these handles on the loop; nothing here knows about
 * libuv or the multi handle.
 */
#include "qtg_http_call.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qtg_crypto.h"

/* The pinned set's connect-to name: this many bytes of its SHA-256, in
 * hex, under a domain that resolves nowhere (RFC 6761). */
#define QTG_HTTP_PIN_NAME_BYTES 16
#define QTG_HTTP_PIN_DOMAIN ".pin.qtg.invalid"

const char *qtg_http_kind_name(qtg_http_kind kind) {
  switch (kind) {
    case QTG_HTTP_OK: return "ok";
    case QTG_HTTP_TIMEOUT: return "timeout";
    case QTG_HTTP_REFUSED: return "refused";
    case QTG_HTTP_TLS: return "tls";
    case QTG_HTTP_TOO_LARGE: return "too_large";
    case QTG_HTTP_DNS: return "dns";
    case QTG_HTTP_INVALID: return "invalid";
    case QTG_HTTP_CLOSED: return "closed";
    case QTG_HTTP_ERROR: return "http";
    case QTG_HTTP_CANCELLED: return "cancelled";
  }
  return "http";
}

/* ---- response collection -------------------------------------------------- */

static size_t qtg_http_write_cb(char *ptr, size_t size, size_t nmemb,
                                void *userdata) {
  qtg_http_call *c = userdata;
  size_t n = size * nmemb;
  if (n > c->max_body || c->body_len > c->max_body - n) {
    c->too_large = 1;
    c->too_large_what = "response body";
    c->too_large_limit = c->max_body;
    return 0;                        /* curl aborts with CURLE_WRITE_ERROR */
  }
  if (c->body_len + n + 1 > c->body_cap) {
    size_t cap = c->body_cap ? c->body_cap : 16384;
    char *p;
    while (cap < c->body_len + n + 1) cap *= 2;
    p = realloc(c->body, cap);
    if (p == NULL) return 0;
    c->body = p;
    c->body_cap = cap;
  }
  memcpy(c->body + c->body_len, ptr, n);
  c->body_len += n;
  c->body[c->body_len] = '\0';
  return n;
}

static void qtg_http_reset_headers(qtg_http_call *c) {
  for (size_t i = 0; i < c->nheaders; i++) {
    free((char *)c->headers[i].name);
    free((char *)c->headers[i].value);
  }
  c->nheaders = 0;
}

static char *qtg_http_strndup_trim(const char *s, size_t n) {
  char *out;
  while (n > 0 && (*s == ' ' || *s == '\t')) s++, n--;
  while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' ||
                   s[n - 1] == '\n'))
    n--;
  out = malloc(n + 1);
  if (out == NULL) return NULL;
  memcpy(out, s, n);
  out[n] = '\0';
  return out;
}

static int qtg_http_is_tchar(char ch);

/* "HTTP/" 1*DIGIT ["." 1*DIGIT] SP 3DIGIT [SP reason] CRLF, as RFC 9112
 * writes it (curl also accepts "HTTP/2 200").  curl parses looser lines (a
 * long digit run gives status -1); a status that is not three digits is not
 * an answer a policy can act on, so the response is refused. */
static int qtg_http_status_line_ok(const char *line, size_t n) {
  size_t i = 5, d;
  for (d = 0; i < n && isdigit((unsigned char)line[i]); i++) d++;
  if (d != 1) return 0;
  if (i < n && line[i] == '.') {
    i++;
    for (d = 0; i < n && isdigit((unsigned char)line[i]); i++) d++;
    if (d != 1) return 0;
  }
  if (i >= n || line[i] != ' ') return 0;
  i++;
  for (d = 0; i < n && isdigit((unsigned char)line[i]); i++) d++;
  if (d != 3) return 0;
  return i == n || line[i] == ' ' || line[i] == '\r' || line[i] == '\n';
}

/* curl hands header lines one at a time, including each response's status
 * line (a new one after a 100 Continue or a followed redirect: the headers
 * kept are the final response's). */
static size_t qtg_http_header_cb(char *line, size_t size, size_t nitems,
                                 void *userdata) {
  qtg_http_call *c = userdata;
  size_t n = size * nitems;
  const char *colon;
  char *name, *value;

  c->header_bytes += n;
  if (c->header_bytes > QTG_HTTP_MAX_HEADER_BYTES) {
    c->too_large = 1;
    c->too_large_what = "response headers";
    c->too_large_limit = QTG_HTTP_MAX_HEADER_BYTES;
    return 0;
  }
  if (n >= 5 && memcmp(line, "HTTP/", 5) == 0) {
    if (!qtg_http_status_line_ok(line, n)) {
      c->bad_response = "malformed status line";
      return 0;
    }
    qtg_http_reset_headers(c);
    c->header_bytes = n;
    return n;
  }
  colon = memchr(line, ':', n);
  if (colon == NULL || colon == line) return n;     /* blank or folded line */
  for (const char *p = line; p < colon; p++) {
    if (!qtg_http_is_tchar(*p)) {
      c->bad_response = "header name is not a token";
      return 0;
    }
  }
  _Static_assert(QTG_HTTP_MAX_HEADER_LINES == 256, "the refusal names the limit");
  if (c->nheaders == QTG_HTTP_MAX_HEADER_LINES) {
    c->bad_response = "more than 256 header lines";
    return 0;
  }
  if (c->nheaders == c->headers_cap) {
    size_t cap = c->headers_cap ? c->headers_cap * 2 : 16;
    qtg_http_header *p = realloc(c->headers, cap * sizeof *p);
    if (p == NULL) return 0;
    c->headers = p;
    c->headers_cap = cap;
  }
  name = qtg_http_strndup_trim(line, (size_t)(colon - line));
  value = qtg_http_strndup_trim(colon + 1, n - (size_t)(colon - line) - 1);
  if (name == NULL || value == NULL) {
    free(name);
    free(value);
    return 0;
  }
  for (char *p = name; *p; p++) *p = (char)tolower((unsigned char)*p);
  c->headers[c->nheaders].name = name;
  c->headers[c->nheaders].value = value;
  c->nheaders++;
  return n;
}

/* ---- validation ---------------------------------------------------------- */

static int qtg_http_is_tchar(char ch) {
  return isalnum((unsigned char)ch) || (ch != '\0' && strchr("!#$%&'*+-.^_`|~", ch));
}

/* Letters only, sent upper-case (methods are case-sensitive and every
 * standard one is upper-case; "post" is a typo, not a new method). */
static int qtg_http_normalize_method(const char *m, char out[17]) {
  size_t n = strlen(m);
  if (n == 0 || n > 16) return 0;
  for (size_t i = 0; i < n; i++) {
    if (!isalpha((unsigned char)m[i])) return 0;
    out[i] = (char)toupper((unsigned char)m[i]);
  }
  out[n] = '\0';
  return 1;
}

/* Only http and https with a host; curl's own parser decides the rest.
 * On success *shown is a malloc'd copy of the URL without user:password,
 * for error messages (which callers log). */
static int qtg_http_valid_url(const char *url, char **shown, char *err,
                              size_t errlen) {
  CURLU *u = curl_url();
  char *scheme = NULL, *host = NULL, *redacted = NULL;
  int ok = 0;
  CURLUcode rc;
  *shown = NULL;
  if (u == NULL) {
    snprintf(err, errlen, "out of memory");
    return 0;
  }
  rc = curl_url_set(u, CURLUPART_URL, url, 0);
  if (rc != CURLUE_OK) {
    snprintf(err, errlen, "invalid URL: %s", curl_url_strerror(rc));
  } else if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
             (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0)) {
    snprintf(err, errlen, "invalid URL: only http and https are allowed");
  } else if (curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
             host[0] == '\0') {
    snprintf(err, errlen, "invalid URL: no host");
  } else if (curl_url_set(u, CURLUPART_USER, NULL, 0) != CURLUE_OK ||
             curl_url_set(u, CURLUPART_PASSWORD, NULL, 0) != CURLUE_OK ||
             curl_url_get(u, CURLUPART_URL, &redacted, 0) != CURLUE_OK ||
             (*shown = strdup(redacted)) == NULL) {
    snprintf(err, errlen, "out of memory");
  } else {
    ok = 1;
  }
  curl_free(scheme);
  curl_free(host);
  curl_free(redacted);
  curl_url_cleanup(u);
  return ok;
}

void qtg_http_redact_url(const char *url, char *out, size_t outlen) {
  char *shown = NULL, err[8];
  if (outlen == 0) return;
  out[0] = '\0';
  if (url != NULL && qtg_http_valid_url(url, &shown, err, sizeof err)) {
    snprintf(out, outlen, "%s", shown);
    free(shown);
  }
}

int qtg_http_url_target(const char *url, char *host, size_t hostlen,
                        long *port, char *err, size_t errlen) {
  CURLU *u = curl_url();
  char *scheme = NULL, *h = NULL, *p = NULL;
  int rc = -1;
  if (u == NULL) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  if (curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK ||
      curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
      (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0)) {
    snprintf(err, errlen, "not an http or https URL");
  } else if (curl_url_get(u, CURLUPART_HOST, &h, 0) != CURLUE_OK || h[0] == '\0') {
    snprintf(err, errlen, "no host in the URL");
  } else if (curl_url_get(u, CURLUPART_PORT, &p, CURLU_DEFAULT_PORT) != CURLUE_OK) {
    snprintf(err, errlen, "no port for the URL");
  } else {
    size_t n = strlen(h);
    const char *start = h;
    if (n >= 2 && h[0] == '[' && h[n - 1] == ']') start++, n -= 2;
    /* a zone id ("fe80::1%25eth0") is not an address to pin or check */
    if (n >= hostlen || memchr(start, '%', n) != NULL) {
      snprintf(err, errlen, "host too long or with a zone id");
    } else {
      memcpy(host, start, n);
      host[n] = '\0';
      *port = strtol(p, NULL, 10);
      rc = 0;
    }
  }
  curl_free(scheme);
  curl_free(h);
  curl_free(p);
  curl_url_cleanup(u);
  return rc;
}

/* One numeric address, as bytes (family, 4 or 16 of them). */
static int qtg_http_parse_addr(const char *s, int *family, unsigned char out[16]) {
  if (inet_pton(AF_INET, s, out) == 1) {
    *family = AF_INET;
    return 1;
  }
  if (inet_pton(AF_INET6, s, out) == 1) {
    *family = AF_INET6;
    return 1;
  }
  return 0;
}

/* The pin of qtg_http_start (qtg_http.h): a host that is an address must
 * be one of the pinned ones.  A name is connected, by CURLOPT_CONNECT_TO,
 * to a name of the pinned set's own, "<32 hex>.pin.qtg.invalid" (the
 * SHA-256 of the host, port and addresses), whose only answer is the
 * addresses (CURLOPT_RESOLVE, in a DNS cache of this call's own); the
 * host's own name gets the same answer, so a spelling the connect-to entry
 * did not match still connects to a pinned address.  libcurl reuses a
 * connection only for a transfer with the same host, port and connect-to
 * name, so a pinned call reuses only a connection made to the same checked
 * addresses (a callback batch of five to one receiver: one connection, one
 * TLS handshake), and never one made without the pin; the ".invalid"
 * name resolves nowhere else. */
static int qtg_http_pin(qtg_http_call *c, const qtg_http_request *req,
                        char *err, size_t errlen) {
  char host[256], addrs[QTG_HTTP_MAX_PIN * (INET6_ADDRSTRLEN + 3)];
  char entry[256 + 16 + sizeof addrs], line[256 + 16 + 64 + 16];
  char name[2 * QTG_HTTP_PIN_NAME_BYTES + sizeof QTG_HTTP_PIN_DOMAIN];
  unsigned char want[16], got[16];
  uint8_t digest[QTG_SHA256_LEN];
  int want_family = 0, family = 0;
  long port;
  size_t len = 0;
  struct curl_slist *l;
  if (req->follow_redirects) {
    snprintf(err, errlen, "a pinned request does not follow redirects");
    return -1;
  }
  if (req->npin > QTG_HTTP_MAX_PIN) {
    snprintf(err, errlen, "more than %d pinned addresses", (int)QTG_HTTP_MAX_PIN);
    return -1;
  }
  if (qtg_http_url_target(req->url, host, sizeof host, &port, err, errlen) != 0) return -1;
  for (size_t i = 0; i < req->npin; i++) {
    if (req->pin[i] == NULL || !qtg_http_parse_addr(req->pin[i], &family, got)) {
      snprintf(err, errlen, "pinned address %s is not a numeric address",
               req->pin[i] != NULL ? req->pin[i] : "(null)");
      return -1;
    }
  }
  if (qtg_http_parse_addr(host, &want_family, want)) {
    for (size_t i = 0; i < req->npin; i++) {
      qtg_http_parse_addr(req->pin[i], &family, got);
      if (family == want_family &&
          memcmp(got, want, family == AF_INET ? 4 : 16) == 0)
        return 0;
    }
    snprintf(err, errlen, "the URL's address %s is not a pinned address", host);
    return -1;
  }
  if (req->npin == 0) {
    snprintf(err, errlen, "no address to pin %s to", host);
    return -1;
  }
  for (size_t i = 0; i < req->npin && len < sizeof addrs; i++) {
    int v6 = strchr(req->pin[i], ':') != NULL;
    len += (size_t)snprintf(addrs + len, sizeof addrs - len, "%s%s%s%s",
                            i > 0 ? "," : "", v6 ? "[" : "", req->pin[i], v6 ? "]" : "");
  }
  if (len >= sizeof addrs) {
    snprintf(err, errlen, "pinned addresses too long");
    return -1;
  }
  len = (size_t)snprintf(entry, sizeof entry, "%s:%ld:%s", host, port, addrs);
  if (len >= sizeof entry || qtg_sha256(entry, len, digest) != 0) {
    snprintf(err, errlen, "cannot name the pinned addresses");
    return -1;
  }
  for (size_t i = 0; i < QTG_HTTP_PIN_NAME_BYTES; i++)
    snprintf(name + 2 * i, 3, "%02x", digest[i]);
  snprintf(name + 2 * QTG_HTTP_PIN_NAME_BYTES, sizeof QTG_HTTP_PIN_DOMAIN, "%s",
           QTG_HTTP_PIN_DOMAIN);
  /* the host's own answer: entry as it is */
  if ((c->resolve = curl_slist_append(NULL, entry)) == NULL) goto oom;
  snprintf(entry, sizeof entry, "%s:%ld:%s", name, port, addrs);
  if ((l = curl_slist_append(c->resolve, entry)) == NULL) goto oom;
  c->resolve = l;
  snprintf(line, sizeof line, "%s:%ld:%s:%ld", host, port, name, port);
  if ((c->connect_to = curl_slist_append(NULL, line)) == NULL ||
      (c->pin_name = strdup(name)) == NULL || (c->pin_host = strdup(host)) == NULL)
    goto oom;
  c->dns = curl_share_init();
  if (c->dns == NULL ||
      curl_share_setopt(c->dns, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS) != CURLSHE_OK ||
      curl_easy_setopt(c->easy, CURLOPT_SHARE, c->dns) != CURLE_OK ||
      curl_easy_setopt(c->easy, CURLOPT_RESOLVE, c->resolve) != CURLE_OK ||
      curl_easy_setopt(c->easy, CURLOPT_CONNECT_TO, c->connect_to) != CURLE_OK)
    goto oom;
  return 0;
oom:
  snprintf(err, errlen, "cannot pin the address (out of memory?)");
  return -1;
}

/* "Name: value" with a token name and no CR, LF or NUL in the value.  An
 * empty value is sent as "Name;" (curl's way; "Name:" would remove the
 * header). */
static int qtg_http_add_header(qtg_http_call *c, const char *line, char *err,
                               size_t errlen) {
  const char *colon = strchr(line, ':');
  const char *v;
  struct curl_slist *l;
  char *tmp = NULL;

  if (colon == NULL || colon == line) {
    snprintf(err, errlen, "invalid header line (want \"Name: value\")");
    return -1;
  }
  for (const char *p = line; p < colon; p++) {
    if (!qtg_http_is_tchar(*p)) {
      snprintf(err, errlen, "invalid header name %.*s", (int)(colon - line), line);
      return -1;
    }
  }
  for (v = colon + 1; *v; v++) {
    if (*v == '\r' || *v == '\n') {
      snprintf(err, errlen, "header %.*s: value contains CR or LF",
               (int)(colon - line), line);
      return -1;
    }
  }
  for (v = colon + 1; *v == ' ' || *v == '\t'; v++) {
  }
  if (*v == '\0') {
    size_t n = (size_t)(colon - line);
    tmp = malloc(n + 2);
    if (tmp == NULL) {
      snprintf(err, errlen, "out of memory");
      return -1;
    }
    memcpy(tmp, line, n);
    tmp[n] = ';';
    tmp[n + 1] = '\0';
    line = tmp;
  }
  l = curl_slist_append(c->req_headers, line);
  free(tmp);
  if (l == NULL) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  c->req_headers = l;
  return 0;
}

static int qtg_http_has_header(const qtg_http_request *req, const char *name) {
  size_t n = strlen(name);
  for (size_t i = 0; i < req->nheaders; i++)
    if (strncasecmp(req->headers[i], name, n) == 0 && req->headers[i][n] == ':')
      return 1;
  return 0;
}

static int qtg_http_suppress_default(qtg_http_call *c,
                                     const qtg_http_request *req,
                                     const char *name, char *err,
                                     size_t errlen) {
  char line[64];
  struct curl_slist *l;
  if (qtg_http_has_header(req, name)) return 0;
  snprintf(line, sizeof line, "%s:", name);
  l = curl_slist_append(c->req_headers, line);
  if (l == NULL) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  c->req_headers = l;
  return 0;
}

/* ---- building and judging ------------------------------------------------ */

static long qtg_http_ms(double seconds, double def) {
  double s = seconds > 0 ? seconds : def;
  double ms = ceil(s * 1000.0);
  return ms > 2147483647.0 ? 2147483647L : (long)ms;
}

#define QTG_SETOPT(easy, opt, val) \
  do { if (curl_easy_setopt(easy, opt, val) != CURLE_OK) goto setopt_failed; } while (0)

qtg_http_call *qtg_http_call_new(const qtg_http_request *req, qtg_http_kind *kind,
                                char *err, size_t errlen) {
  char method[17];
  char *shown = NULL;
  qtg_http_call *c;
  CURL *e;

  *kind = QTG_HTTP_INVALID;
  if (req->url == NULL) {
    snprintf(err, errlen, "invalid URL: none given");
    return NULL;
  }
  if (!qtg_http_normalize_method(req->method != NULL ? req->method : "GET", method)) {
    snprintf(err, errlen, "invalid method (want letters only, e.g. GET)");
    return NULL;
  }
  if (!qtg_http_valid_url(req->url, &shown, err, errlen)) return NULL;
  *kind = QTG_HTTP_ERROR;
  c = calloc(1, sizeof *c);
  if (c == NULL || (c->easy = curl_easy_init()) == NULL) {
    snprintf(err, errlen, "out of memory");
    free(shown);
    if (c != NULL) qtg_http_call_free(c);
    return NULL;
  }
  c->url = shown;
  c->max_body = req->max_body > 0 ? req->max_body : QTG_HTTP_DEFAULT_MAX_BODY;
  for (size_t i = 0; i < req->nheaders; i++) {
    if (qtg_http_add_header(c, req->headers[i], err, errlen) != 0) {
      *kind = QTG_HTTP_INVALID;
      qtg_http_call_free(c);
      return NULL;
    }
  }
  /* Headers curl would add on its own, removed ("Name:" with no value)
   * unless the caller set them: "Expect: 100-continue" makes curl wait up
   * to a second before sending a large body to peers that never answer
   * it, and a body would otherwise be labelled as a urlencoded form. */
  if (qtg_http_suppress_default(c, req, "Expect", err, errlen) != 0 ||
      qtg_http_suppress_default(c, req, "Content-Type", err, errlen) != 0) {
    qtg_http_call_free(c);
    return NULL;
  }

  e = c->easy;
  QTG_SETOPT(e, CURLOPT_PRIVATE, c);
  QTG_SETOPT(e, CURLOPT_URL, req->url);   /* curl copies it */
  QTG_SETOPT(e, CURLOPT_PROTOCOLS_STR, "http,https");
  QTG_SETOPT(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  QTG_SETOPT(e, CURLOPT_NOSIGNAL, 1L);
  QTG_SETOPT(e, CURLOPT_ERRORBUFFER, c->errbuf);
  QTG_SETOPT(e, CURLOPT_TIMEOUT_MS, qtg_http_ms(req->timeout, QTG_HTTP_DEFAULT_TIMEOUT));
  QTG_SETOPT(e, CURLOPT_CONNECTTIMEOUT_MS,
             qtg_http_ms(req->connect_timeout, QTG_HTTP_DEFAULT_CONNECT_TIMEOUT));
  QTG_SETOPT(e, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)c->max_body);
  QTG_SETOPT(e, CURLOPT_FOLLOWLOCATION, req->follow_redirects ? 1L : 0L);
  QTG_SETOPT(e, CURLOPT_MAXREDIRS, (long)QTG_HTTP_MAX_REDIRECTS);
  QTG_SETOPT(e, CURLOPT_SSL_VERIFYPEER, req->verify_tls ? 1L : 0L);
  QTG_SETOPT(e, CURLOPT_SSL_VERIFYHOST, req->verify_tls ? 2L : 0L);
  QTG_SETOPT(e, CURLOPT_WRITEFUNCTION, qtg_http_write_cb);
  QTG_SETOPT(e, CURLOPT_WRITEDATA, c);
  QTG_SETOPT(e, CURLOPT_HEADERFUNCTION, qtg_http_header_cb);
  QTG_SETOPT(e, CURLOPT_HEADERDATA, c);
  QTG_SETOPT(e, CURLOPT_HTTPHEADER, c->req_headers);
  if (strcmp(method, "HEAD") == 0) {
    QTG_SETOPT(e, CURLOPT_NOBODY, 1L);
  } else if (strcmp(method, "GET") != 0 || req->body != NULL) {
    if (req->body != NULL || strcmp(method, "POST") == 0) {
      QTG_SETOPT(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
      QTG_SETOPT(e, CURLOPT_COPYPOSTFIELDS, req->body != NULL ? req->body : "");
    }
    if (strcmp(method, "POST") != 0) QTG_SETOPT(e, CURLOPT_CUSTOMREQUEST, method);
  }
  if (req->pin != NULL && qtg_http_pin(c, req, err, errlen) != 0) {
    *kind = QTG_HTTP_INVALID;
    qtg_http_call_free(c);
    return NULL;
  }
  return c;

setopt_failed:
  snprintf(err, errlen, "libcurl refused an option (is it built with http/https?)");
  qtg_http_call_free(c);
  return NULL;
}

void qtg_http_call_free(qtg_http_call *c) {
  if (c->easy != NULL) curl_easy_cleanup(c->easy);
  if (c->dns != NULL) curl_share_cleanup(c->dns);   /* after its one user */
  curl_slist_free_all(c->resolve);
  curl_slist_free_all(c->connect_to);
  free(c->pin_name);
  free(c->pin_host);
  curl_slist_free_all(c->req_headers);
  for (size_t i = 0; i < c->nheaders; i++) {
    free((char *)c->headers[i].name);
    free((char *)c->headers[i].value);
  }
  free(c->headers);
  free(c->body);
  free(c->url);
  free(c);
}

static qtg_http_kind qtg_http_call_classify(CURLcode rc, const qtg_http_call *c) {
  switch (rc) {
    case CURLE_OK: return QTG_HTTP_OK;
    case CURLE_OPERATION_TIMEDOUT: return QTG_HTTP_TIMEOUT;
    case CURLE_COULDNT_CONNECT: return QTG_HTTP_REFUSED;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY: return QTG_HTTP_DNS;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_SHUTDOWN_FAILED:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
    case CURLE_SSL_ENGINE_INITFAILED:
    case CURLE_USE_SSL_FAILED: return QTG_HTTP_TLS;
    case CURLE_FILESIZE_EXCEEDED: return QTG_HTTP_TOO_LARGE;
    case CURLE_WRITE_ERROR:
      return c->too_large ? QTG_HTTP_TOO_LARGE : QTG_HTTP_ERROR;
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL: return QTG_HTTP_INVALID;
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR: return QTG_HTTP_CLOSED;
    default:
      /* A header callback that refused more bytes aborts with its own
       * code in some curl versions. */
      return c->too_large ? QTG_HTTP_TOO_LARGE : QTG_HTTP_ERROR;
  }
}


/* curl's message for a pinned call names the connect-to name where it
 * connected ("Failed to connect to <hex>.pin.qtg.invalid port 443"); the
 * message says the URL's host instead, as for any other call. */
static void qtg_http_curl_message(const qtg_http_call *c, const char *text,
                                  char *message, size_t msglen) {
  const char *at = c->pin_name != NULL ? strstr(text, c->pin_name) : NULL;
  if (at == NULL) {
    snprintf(message, msglen, "%s", text);
    return;
  }
  snprintf(message, msglen, "%.*s%s (pinned)%s", (int)(at - text), text, c->pin_host,
           at + strlen(c->pin_name));
}

qtg_http_kind qtg_http_call_outcome(const qtg_http_call *c, CURLcode rc,
                                    char *message, size_t msglen) {
  qtg_http_kind kind = qtg_http_call_classify(rc, c);
  if (c->bad_response != NULL && rc != CURLE_OK) {
    kind = QTG_HTTP_ERROR;
    snprintf(message, msglen, "bad response: %s", c->bad_response);
  } else if (kind == QTG_HTTP_TOO_LARGE && c->too_large_what != NULL) {
    snprintf(message, msglen, "%s larger than %zu bytes", c->too_large_what,
             c->too_large_limit);
  } else if (kind == QTG_HTTP_TOO_LARGE) {
    /* CURLE_FILESIZE_EXCEEDED: the announced Content-Length was too big. */
    snprintf(message, msglen, "response body larger than %zu bytes", c->max_body);
  } else if (rc != CURLE_OK) {
    qtg_http_curl_message(c, c->errbuf[0] ? c->errbuf : curl_easy_strerror(rc), message, msglen);
  } else if (msglen > 0) {
    message[0] = '\0';
  }
  return kind;
}
