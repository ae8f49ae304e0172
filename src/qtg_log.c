/* qtg_log.c -- JSON-lines logger (see qtg_log.h).
 *
 * The level, the format and the repeat table are the process-wide state: a
 * process has one stderr, and every host instance in it writes to the same
 * stream. */
#include "qtg_log.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static qtg_log_level qtg_log_threshold = QTG_LOG_INFO;
static int qtg_log_text;           /* 1: the human format */
static int qtg_log_repeat_window;  /* seconds; 0: no rate limit */

void qtg_log_set_text(int on) { qtg_log_text = on != 0; }
int qtg_log_get_text(void) { return qtg_log_text; }
void qtg_log_set_repeat_window(int seconds) { qtg_log_repeat_window = seconds > 0 ? seconds : 0; }
int qtg_log_get_repeat_window(void) { return qtg_log_repeat_window; }

/* Repeated identical warnings and errors (same level, message and fields):
 * the first is written, the same line again within QTG_LOG_REPEAT_WINDOW
 * seconds only counted, and the next one written after the window carries
 * "repeated": how many were left out (the daemon's window is 60 s).  A listener reconnecting every second
 * through an outage is then one line a minute.  Direct-mapped by hash: two
 * lines that share a slot only shorten each other's silence. */
#define QTG_LOG_REPEAT_SLOTS 64
static struct {
  uint64_t hash;
  int64_t since_ms;         /* CLOCK_MONOTONIC */
  unsigned long suppressed;
} qtg_log_repeats[QTG_LOG_REPEAT_SLOTS];

static uint64_t qtg_log_hash(uint64_t h, const char *s) {
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
  return (h ^ 0xff) * 1099511628211ULL;  /* separator: "ab","c" != "a","bc" */
}

/* 1: leave the line out; else *repeated is the count to report (0: none). */
static int qtg_log_suppress(qtg_log_level level, const char *msg, const char *const *fields,
                            unsigned long *repeated) {
  *repeated = 0;
  if (qtg_log_repeat_window == 0 || level < QTG_LOG_WARN) return 0;
  uint64_t h = qtg_log_hash(14695981039346656037ULL + (uint64_t)level, msg);
  for (int i = 0; fields && fields[i] && fields[i + 1]; i += 2)
    h = qtg_log_hash(qtg_log_hash(h, fields[i]), fields[i + 1]);
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  int64_t now_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
  size_t slot = (size_t)(h % QTG_LOG_REPEAT_SLOTS);
  if (qtg_log_repeats[slot].hash == h &&
      now_ms - qtg_log_repeats[slot].since_ms < (int64_t)qtg_log_repeat_window * 1000) {
    qtg_log_repeats[slot].suppressed++;
    return 1;
  }
  if (qtg_log_repeats[slot].hash == h) *repeated = qtg_log_repeats[slot].suppressed;
  qtg_log_repeats[slot].hash = h;
  qtg_log_repeats[slot].since_ms = now_ms;
  qtg_log_repeats[slot].suppressed = 0;
  return 0;
}

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

/* The length of the valid UTF-8 sequence at s[i] (i < len, s[i] >= 0x80),
 * or 0: no overlong form, no surrogate, nothing past U+10FFFF, none cut
 * by the end of s (the rules of lua/qtg/canon_json.lua's text_ok). */
static size_t qtg_utf8_len(const unsigned char *s, size_t i, size_t len) {
  unsigned char c = s[i];
  size_t n;
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c >= 0xE0 && c <= 0xEF) n = 3;
  else if (c >= 0xF0 && c <= 0xF4) n = 4;
  else return 0;
  if (len - i < n) return 0;
  unsigned char c2 = s[i + 1];
  if ((c == 0xE0 && c2 < 0xA0) || (c == 0xED && c2 > 0x9F) || (c == 0xF0 && c2 < 0x90) ||
      (c == 0xF4 && c2 > 0x8F))
    return 0;
  for (size_t k = 1; k < n; k++)
    if ((s[i + k] & 0xC0) != 0x80) return 0;
  return n;
}

/* Control bytes are escaped, and each byte that starts no valid UTF-8
 * sequence becomes U+FFFD: a log line is valid UTF-8 JSON whatever bytes a
 * peer's text (a body excerpt, an error message) carried. */
size_t qtg_json_quote(char *buf, size_t cap, const char *s, size_t len) {
  const unsigned char *u = (const unsigned char *)s;
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
      } else if (c < 0x80) {
        PUT((char)c);
      } else {
        size_t m = qtg_utf8_len(u, i, len);
        if (m == 0) {
          PUT((char)0xEF); PUT((char)0xBF); PUT((char)0xBD);
        } else {
          for (size_t k = 0; k < m; k++) PUT((char)u[i + k]);
          i += m - 1;
        }
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

/* A value of kind 'n' is written bare only when it is a JSON number (the
 * caller formats it); anything else is quoted, so a line always parses. */
static int qtg_log_is_json_number(const char *s) {
  const char *p = s;
  if (*p == '-') p++;
  if (*p == '0') p++;
  else if (*p >= '1' && *p <= '9') while (*p >= '0' && *p <= '9') p++;
  else return 0;
  if (*p == '.') {
    p++;
    if (!(*p >= '0' && *p <= '9')) return 0;
    while (*p >= '0' && *p <= '9') p++;
  }
  if (*p == 'e' || *p == 'E') {
    p++;
    if (*p == '+' || *p == '-') p++;
    if (!(*p >= '0' && *p <= '9')) return 0;
    while (*p >= '0' && *p <= '9') p++;
  }
  return *p == '\0' && p - s < 40;
}

static int qtg_log_bare(char kind, const char *v) {
  if (kind == 'n') return qtg_log_is_json_number(v);
  if (kind == 'b') return strcmp(v, "true") == 0 || strcmp(v, "false") == 0;
  return 0;
}

/* Text format: `TIME LEVEL msg key=value ...`; a value with a space, quote,
 * '=' or control character is written JSON-quoted, so a line stays one line. */
static int qtg_log_plain_ok(const char *s) {
  if (*s == '\0') return 0;
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c <= 0x20 || c == 0x7f || c == '"' || c == '=' || c == '\\') return 0;
  }
  return 1;
}

static void qtg_log_write_text(qtg_log_level level, const char *ts, const char *msg,
                               const char *const *fields, unsigned long repeated) {
  char line[QTG_LOG_LINE_MAX + 2];
  static const char *const upper[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};
  const size_t limit = QTG_LOG_LINE_MAX;
  int cut = 0;
  size_t off = 0;
  off = qtg_log_append(line, off, ts, strlen(ts));
  off = qtg_log_append(line, off, " ", 1);
  off = qtg_log_append(line, off, upper[level], 5);
  off = qtg_log_append(line, off, " ", 1);
  /* the message as it is, its control characters escaped */
  for (const char *p = msg; *p && off + 8 < limit; p++) {
    unsigned char c = (unsigned char)*p;
    if (c < 0x20 || c == 0x7f) off += (size_t)snprintf(line + off, 8, "\\x%02x", c);
    else line[off++] = (char)c;
  }
  for (int i = 0; fields && fields[i] && fields[i + 1] && !cut; i += 2) {
    size_t klen = strlen(fields[i]);
    if (off + klen + 8 > limit) break;
    line[off++] = ' ';
    off = qtg_log_append(line, off, fields[i], klen);
    line[off++] = '=';
    const char *v = fields[i + 1];
    if (qtg_log_plain_ok(v) && off + strlen(v) <= limit) off = qtg_log_append(line, off, v, strlen(v));
    else off = qtg_log_put_string(line, off, limit, v, strlen(v), &cut);
  }
  if (repeated > 0 && off + 32 < limit)
    off += (size_t)snprintf(line + off, 32, " repeated=%lu", repeated);
  line[off++] = '\n';
  ssize_t w = write(STDERR_FILENO, line, off);
  (void)w;
}

void qtg_log_fields(qtg_log_level level, const char *msg, const char *const *fields) {
  qtg_log_fieldsk(level, msg, fields, NULL);
}

void qtg_log_fieldsk(qtg_log_level level, const char *msg, const char *const *fields,
                     const char *kinds) {
  if (level < qtg_log_threshold) return;
  if (!msg) msg = "";
  unsigned long repeated;
  if (qtg_log_suppress(level, msg, fields, &repeated)) return;
  char line[QTG_LOG_LINE_MAX + 2];
  char ts[64];
  struct timeval tv;
  struct tm tm;
  gettimeofday(&tv, NULL);
  gmtime_r(&tv.tv_sec, &tm);
  size_t tl = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(ts + tl, sizeof ts - tl, ".%06ldZ", (long)tv.tv_usec);
  if (qtg_log_text) {
    qtg_log_write_text(level, ts, msg, fields, repeated);
    return;
  }

  /* limit: the closing brace and the newline go after it */
  const size_t limit = QTG_LOG_LINE_MAX;
  int cut = 0;
  size_t off = 0;
  off = qtg_log_append(line, off, "{\"time\":\"", 9);
  off = qtg_log_append(line, off, ts, strlen(ts));
  off = qtg_log_append(line, off, "\",\"level\":\"", 11);
  off = qtg_log_append(line, off, qtg_log_names[level], strlen(qtg_log_names[level]));
  off = qtg_log_append(line, off, "\",\"msg\":", 8);
  off = qtg_log_put_string(line, off, limit, msg, strlen(msg), &cut);
  for (int i = 0; !cut && fields && fields[i] && fields[i + 1]; i += 2) {
    size_t klen = strlen(fields[i]);
    size_t kneed = qtg_json_quote(NULL, 0, fields[i], klen);
    if (off + 1 + kneed + 1 + 5 > limit) break;  /* no room for the pair: drop the rest */
    line[off++] = ',';
    off += qtg_json_quote(line + off, kneed, fields[i], klen);
    line[off++] = ':';
    const char *v = fields[i + 1];
    size_t vlen = strlen(v);
    if (kinds && kinds[i / 2] && qtg_log_bare(kinds[i / 2], v) && off + vlen <= limit)
      off = qtg_log_append(line, off, v, vlen);
    else
      off = qtg_log_put_string(line, off, limit, v, vlen, &cut);
  }
  if (!cut && repeated > 0 && off + 32 < limit)
    off += (size_t)snprintf(line + off, 32, ",\"repeated\":%lu", repeated);
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
