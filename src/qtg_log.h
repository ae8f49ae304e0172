/* qtg_log.h -- structured logs: one JSON object per line on stderr.
 *
 * Why one line of JSON: operators pipe qtgd's stderr into journald or a log
 * shipper; a line per event with typed fields (worker, request_id, node_id)
 * is greppable by people and parseable by machines.  Logging never fails the
 * caller: a write error is ignored, as there is nowhere better to report it.
 */
#ifndef QTG_LOG_H
#define QTG_LOG_H

#include <stddef.h>

typedef enum { QTG_LOG_DEBUG = 0, QTG_LOG_INFO, QTG_LOG_WARN, QTG_LOG_ERROR } qtg_log_level;

/* Returns -1 for an unknown name. */
int qtg_log_level_parse(const char *name);
void qtg_log_set_level(qtg_log_level level);
qtg_log_level qtg_log_get_level(void);
const char *qtg_log_level_name(qtg_log_level level);

/* fields: NULL-terminated key/value pairs of C strings. */
void qtg_log_fields(qtg_log_level level, const char *msg, const char *const *fields);
/* kinds: one character per pair ('s' string, 'n' number, 'b' boolean) or
 * NULL (all strings).  A number or boolean is written as a JSON number or
 * boolean when its text is one, else quoted. */
void qtg_log_fieldsk(qtg_log_level level, const char *msg, const char *const *fields,
                     const char *kinds);

/* The human format (MG_LOG_FORMAT=text, or a terminal on stderr). */
void qtg_log_set_text(int on);
int qtg_log_get_text(void);
/* Rate-limit repeated identical warnings and errors within a window of
 * seconds (0: off; `qtgd run` uses 60). */
void qtg_log_set_repeat_window(int seconds);
int qtg_log_get_repeat_window(void);
/* printf-style message, optional single field pair (key may be NULL). */
void qtg_logf(qtg_log_level level, const char *key, const char *val, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Append s to buf as a JSON string (with quotes), valid UTF-8 (each byte
 * that starts no valid sequence becomes U+FFFD); returns bytes it needs. */
size_t qtg_json_quote(char *buf, size_t cap, const char *s, size_t len);

#define qtg_log_info(...) qtg_logf(QTG_LOG_INFO, NULL, NULL, __VA_ARGS__)
#define qtg_log_warn(...) qtg_logf(QTG_LOG_WARN, NULL, NULL, __VA_ARGS__)
#define qtg_log_error(...) qtg_logf(QTG_LOG_ERROR, NULL, NULL, __VA_ARGS__)
#define qtg_log_debug(...) qtg_logf(QTG_LOG_DEBUG, NULL, NULL, __VA_ARGS__)

#endif
