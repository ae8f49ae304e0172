/* qtg_settings.c -- parse and validate the MG_* settings (see qtg_settings.h).
 *
 * Parsing happens once at start-up; a bad value stops qtgd with a message
 * naming the variable and the form it accepts, because a daemon that guesses
 * at a treasury operator's typo is worse than one that refuses to start. */
#include "qtg_settings.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const qtg_setting_def qtg_setting_defs[QTG_S__COUNT] = {
#define QTG_SETTING(id, name, type, def, min, max, help) {name, type, def, min, max, help},
#include "qtg_settings_list.h"
#undef QTG_SETTING
};

static int qtg_settings_parse_bool(const char *v, int *out) {
  static const char *const yes[] = {"true", "1", "yes", "on"};
  static const char *const no[] = {"false", "0", "no", "off"};
  for (int i = 0; i < 4; i++) {
    if (strcasecmp(v, yes[i]) == 0) { *out = 1; return 0; }
    if (strcasecmp(v, no[i]) == 0) { *out = 0; return 0; }
  }
  return -1;
}

static int qtg_settings_parse_num(const char *v, int integer, double *out) {
  char *end = NULL;
  errno = 0;
  while (*v == ' ' || *v == '\t') v++;
  if (*v == '\0') return -1;
  double d = strtod(v, &end);
  if (errno != 0 || end == v || !isfinite(d)) return -1;
  while (*end == ' ' || *end == '\t') end++;
  if (*end != '\0') return -1;
  if (integer && d != floor(d)) return -1;
  *out = d;
  return 0;
}

void qtg_settings_format_number(double n, char *buf, size_t cap) {
  if (n == floor(n) && fabs(n) < 1e15) snprintf(buf, cap, "%.0f", n);
  else snprintf(buf, cap, "%.15g", n);
}

static int qtg_settings_parse_one(const qtg_setting_def *d, const char *text,
                                  qtg_setting_value *v, char *err, size_t errlen) {
  switch (d->type) {
  case QTG_SET_BOOL:
    if (qtg_settings_parse_bool(text, &v->b) == 0) return 0;
    snprintf(err, errlen, "%s=\"%s\" is invalid: expected true or false (also 1/0, yes/no, on/off)",
             d->name, text);
    return -1;
  case QTG_SET_INT:
  case QTG_SET_NUM:
    if (qtg_settings_parse_num(text, d->type == QTG_SET_INT, &v->n) == 0 &&
        v->n >= d->min && v->n <= d->max)
      return 0;
    {
      char lo[32], hi[32];
      qtg_settings_format_number(d->min, lo, sizeof lo);
      qtg_settings_format_number(d->max, hi, sizeof hi);
      snprintf(err, errlen, "%s=\"%s\" is invalid: expected %s between %s and %s", d->name,
               text, d->type == QTG_SET_INT ? "an integer" : "a number", lo, hi);
    }
    return -1;
  case QTG_SET_STR:
  case QTG_SET_SECRET:
    v->s = strdup(text);
    if (!v->s) {
      snprintf(err, errlen, "%s: out of memory", d->name);
      return -1;
    }
    return 0;
  }
  return -1;
}

static int qtg_settings_check_log_level(const qtg_settings *s, char *err, size_t errlen) {
  const char *lvl = s->v[QTG_S_LOG_LEVEL].s;
  static const char *const ok[] = {"debug", "info", "warn", "warning", "error"};
  for (int i = 0; i < 5; i++)
    if (strcmp(lvl, ok[i]) == 0) return 0;
  snprintf(err, errlen, "MG_LOG_LEVEL=\"%s\" is invalid: expected debug, info, warn or error", lvl);
  return -1;
}

static int qtg_settings_check_log_format(const qtg_settings *s, char *err, size_t errlen) {
  const char *f = s->v[QTG_S_LOG_FORMAT].s;
  if (f[0] == '\0' || strcmp(f, "json") == 0 || strcmp(f, "text") == 0) return 0;
  snprintf(err, errlen, "MG_LOG_FORMAT=\"%s\" is invalid: expected json or text", f);
  return -1;
}

static int qtg_settings_check_network_class(const qtg_settings *s, char *err, size_t errlen) {
  const char *nc = s->v[QTG_S_NETWORK_CLASS].s;
  size_t n = strlen(nc);
  int ok = n > 0 && n <= 32;
  for (size_t i = 0; ok && i < n; i++)
    ok = (nc[i] >= 'a' && nc[i] <= 'z') || (nc[i] >= '0' && nc[i] <= '9') || nc[i] == '_' || nc[i] == '-';
  if (ok) return 0;
  snprintf(err, errlen, "MG_NETWORK_CLASS=\"%s\" is invalid: expected 1-32 characters of a-z, 0-9, _ or -", nc);
  return -1;
}

/* Append one finding to err (one line each), as far as it fits. */
static void qtg_settings_add_error(char *err, size_t errlen, size_t *used, const char *line) {
  if (errlen == 0 || *used >= errlen - 1) return;
  int n = snprintf(err + *used, errlen - *used, "%s%s", *used ? "\n" : "", line);
  if (n > 0) *used += (size_t)n < errlen - *used ? (size_t)n : errlen - *used - 1;
}

/* Every invalid setting is reported, one line each: an operator fixing a
 * unit file should not meet them one start at a time. */
int qtg_settings_load(qtg_settings *s, qtg_env_lookup get, void *ud, char *err, size_t errlen) {
  char one[512];
  size_t used = 0;
  int bad = 0;
  memset(s, 0, sizeof *s);
  if (errlen > 0) err[0] = '\0';
  for (int i = 0; i < QTG_S__COUNT; i++) {
    const qtg_setting_def *d = &qtg_setting_defs[i];
    const char *text = get(d->name, ud);
    s->v[i].set = text != NULL;
    if (!text) text = d->def;
    if (qtg_settings_parse_one(d, text, &s->v[i], one, sizeof one) != 0) {
      qtg_settings_add_error(err, errlen, &used, one);
      bad = 1;
      if (d->type == QTG_SET_STR || d->type == QTG_SET_SECRET) break; /* out of memory */
    }
  }
  if (s->v[QTG_S_LOG_FORMAT].s && qtg_settings_check_log_format(s, one, sizeof one) != 0) {
    qtg_settings_add_error(err, errlen, &used, one);
    bad = 1;
  }
  if (s->v[QTG_S_LOG_LEVEL].s && qtg_settings_check_log_level(s, one, sizeof one) != 0) {
    qtg_settings_add_error(err, errlen, &used, one);
    bad = 1;
  }
  if (s->v[QTG_S_NETWORK_CLASS].s && qtg_settings_check_network_class(s, one, sizeof one) != 0) {
    qtg_settings_add_error(err, errlen, &used, one);
    bad = 1;
  }
  if (bad) {
    qtg_settings_free(s);
    return -1;
  }
  return 0;
}

void qtg_settings_free(qtg_settings *s) {
  for (int i = 0; i < QTG_S__COUNT; i++) {
    if (s->v[i].s) {
      if (qtg_setting_defs[i].type == QTG_SET_SECRET) {
        volatile char *p = s->v[i].s;
        while (*p) *p++ = 0;
      }
      free(s->v[i].s);
      s->v[i].s = NULL;
    }
  }
}

int qtg_settings_bool(const qtg_settings *s, int id) { return s->v[id].b; }
double qtg_settings_num(const qtg_settings *s, int id) { return s->v[id].n; }
const char *qtg_settings_str(const qtg_settings *s, int id) { return s->v[id].s ? s->v[id].s : ""; }

void qtg_settings_print_markdown(void) {
  static const char *const type_names[] = {"bool", "integer", "number", "string", "secret"};
  printf("| setting | type | default | meaning |\n|---|---|---|---|\n");
  for (int i = 0; i < QTG_S__COUNT; i++) {
    const qtg_setting_def *d = &qtg_setting_defs[i];
    printf("| `%s` | %s | %s%s%s | %s |\n", d->name, type_names[d->type], d->def[0] ? "`" : "",
           d->def[0] ? d->def : "(empty)", d->def[0] ? "`" : "", d->help);
  }
}
