/* qtg_log.c -- JSON-lines logger (see qtg_log.h).
 *
 * The level is the one piece of process-wide state: a process has one
 * stderr, and every host instance in it writes to the same stream. */
#include "qtg_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static qtg_log_level qtg_log_threshold = QTG_LOG_INFO;

static const char *const qtg_log_names[] = {"debug", "info", "warn", "error"};

int qtg_log_level_parse(const char *name) {
  for (int i = 0; i < 4; i++)
    if (strcmp(name, qtg_log_names[i]) == 0) return i;
  if (strcmp(name, "warning") == 0) return QTG_LOG_WARN;
  return -1;
}

void qtg_log_set_level(qtg_log_level level) { qtg_log_threshold = level; }
qtg_log_level qtg_log_get_level(void) { return qtg_log_threshold; }
const char *qtg_log_level_name(qtg_log_level level) { return qtg_log_names[level]; }

size_t qtg_json_quote(char *buf, size_t cap, const char *s, size_t len) {
  size_t n = 0;
#define PUT(c) do { if (n < cap) buf[n] = (c); n++; } while (0)
  PUT('"');
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    switch (c) {
    case '"': PUT('\\'); PUT('"'); break;
    case '\\': PUT('\\'); PUT('\\'); break;
    case '\n': PUT('\\'); PUT('n'); break;
    case '\r': PUT('\\'); PUT('r'); break;
    case '\t': PUT('\\'); PUT('t'); break;
    default:
      if (c < 0x20 || c == 0x7f) {
        char esc[8];
        snprintf(esc, sizeof esc, "\\u%04x", c);
        for (int k = 0; esc[k]; k++) PUT(esc[k]);
      } else {
        PUT((char)c);
      }
    }
  }
  PUT('"');
#undef PUT
  return n;
}

/* A log line is built in a fixed buffer; a message too long for it is cut,
 * which keeps logging allocation-free and bounded. */
#define QTG_LOG_LINE_MAX 8192

static size_t qtg_log_append(char *line, size_t off, const char *s, size_t len) {
  if (off >= QTG_LOG_LINE_MAX) return off;
  size_t room = QTG_LOG_LINE_MAX - off;
  size_t n = len < room ? len : room;
  memcpy(line + off, s, n);
  return off + n;
}

/* Quote s (len bytes) into line at off, ending before limit.  When the whole
 * does not fit, the longest prefix that does is written, cut before a UTF-8
 * continuation byte and followed by "...", so the line stays one valid JSON
 * object (a line cut mid-string was not: found by fuzz/fuzz_json.c).  *cut
 * is set then.  Returns the new offset (off when not even that fits). */
static size_t qtg_log_put_string(char *line, size_t off, size_t limit, const char *s, size_t len,
                                 int *cut) {
  size_t need = qtg_json_quote(NULL, 0, s, len);
  if (off + need <= limit) {
    qtg_json_quote(line + off, need, s, len);
    return off + need;
  }
  *cut = 1;
  if (off + 5 > limit) return off;              /* not even "..." */
  size_t lo = 0, hi = len;                       /* longest prefix whose quote + 3 fits */
  while (lo < hi) {
    size_t mid = lo + (hi - lo + 1) / 2;
    if (qtg_json_quote(NULL, 0, s, mid) + 3 <= limit - off) lo = mid;
    else hi = mid - 1;
  }
  while (lo > 0 && ((unsigned char)s[lo] & 0xC0) == 0x80) lo--;
  size_t n = qtg_json_quote(line + off, limit - off, s, lo);
  off += n - 1;                                  /* over the closing quote */
  memcpy(line + off, "...\"", 4);
  return off + 4;
}

void qtg_log_fields(qtg_log_level level, const char *msg, const char *const *fields) {
  if (level < qtg_log_threshold) return;
  char line[QTG_LOG_LINE_MAX + 2];
  char ts[64];
  struct timeval tv;
  struct tm tm;
  gettimeofday(&tv, NULL);
  gmtime_r(&tv.tv_sec, &tm);
  size_t tl = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(ts + tl, sizeof ts - tl, ".%06ldZ", (long)tv.tv_usec);

  /* limit: the closing brace and the newline go after it */
  const size_t limit = QTG_LOG_LINE_MAX;
  int cut = 0;
  size_t off = 0;
  off = qtg_log_append(line, off, "{\"time\":\"", 9);
  off = qtg_log_append(line, off, ts, strlen(ts));
  off = qtg_log_append(line, off, "\",\"level\":\"", 11);
  off = qtg_log_append(line, off, qtg_log_names[level], strlen(qtg_log_names[level]));
  off = qtg_log_append(line, off, "\",\"msg\":", 8);
  if (!msg) msg = "";
  off = qtg_log_put_string(line, off, limit, msg, strlen(msg), &cut);
  for (int i = 0; !cut && fields && fields[i] && fields[i + 1]; i += 2) {
    size_t klen = strlen(fields[i]);
    size_t kneed = qtg_json_quote(NULL, 0, fields[i], klen);
    if (off + 1 + kneed + 1 + 5 > limit) break;  /* no room for the pair: drop the rest */
    line[off++] = ',';
    off += qtg_json_quote(line + off, kneed, fields[i], klen);
    line[off++] = ':';
    off = qtg_log_put_string(line, off, limit, fields[i + 1], strlen(fields[i + 1]), &cut);
  }
  line[off++] = '}';
  line[off++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, off);
  (void)w;
}

void qtg_logf(qtg_log_level level, const char *key, const char *val, const char *fmt, ...) {
  if (level < qtg_log_threshold) return;
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *fields[3] = {key, val, NULL};
  qtg_log_fields(level, msg, key && val ? fields : NULL);
}
