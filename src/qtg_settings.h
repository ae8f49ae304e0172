/* qtg_settings.h -- the MG_* settings: parsed once from the environment,
 * typed, validated, and exposed read-only to Lua as `qtg.settings`.
 *
 * The list of settings lives in qtg_settings_list.h (one X-macro row per
 * setting) so that the parser, the Lua view, `qtgd settings` and the README's
 * table all come from one place and cannot drift.
 */
#ifndef QTG_SETTINGS_H
#define QTG_SETTINGS_H

#include <stddef.h>

typedef enum {
  QTG_SET_BOOL,   /* true/false/1/0/yes/no/on/off */
  QTG_SET_INT,    /* integer within [min, max] */
  QTG_SET_NUM,    /* decimal number within [min, max] */
  QTG_SET_STR,    /* any string */
  QTG_SET_SECRET  /* a string never shown to Lua, logs or the console */
} qtg_setting_type;

typedef struct {
  const char *name;        /* MG_... */
  qtg_setting_type type;
  const char *def;         /* default, as text ("" = empty) */
  double min, max;         /* bounds for INT and NUM */
  const char *help;        /* one line for the operator */
} qtg_setting_def;

typedef struct {
  int set;                 /* came from the environment */
  int b;                   /* BOOL */
  double n;                /* INT, NUM */
  char *s;                 /* STR, SECRET (owned) */
} qtg_setting_value;

enum {
#define QTG_SETTING(id, name, type, def, min, max, help) QTG_S_##id,
#include "qtg_settings_list.h"
#undef QTG_SETTING
  QTG_S__COUNT
};

typedef struct qtg_settings {
  qtg_setting_value v[QTG_S__COUNT];
  /* Set by `qtgd check` before the host starts: a key file that does not
   * load (unreadable, too open, malformed) or an MG_LUA_PATH that may not be
   * trusted is kept here for check's report instead of stopping the host,
   * which would leave no table (the override is then not searched). */
  int report_only;
  char keys_error[512];
  char lua_path_error[512];
} qtg_settings;

extern const qtg_setting_def qtg_setting_defs[QTG_S__COUNT];

/* Parse from a getenv-like lookup.  On an invalid value returns -1 and
 * writes a message naming the variable and the accepted form into err. */
typedef const char *(*qtg_env_lookup)(const char *name, void *ud);
int qtg_settings_load(qtg_settings *s, qtg_env_lookup get, void *ud,
                      char *err, size_t errlen);
void qtg_settings_free(qtg_settings *s);

int qtg_settings_bool(const qtg_settings *s, int id);
double qtg_settings_num(const qtg_settings *s, int id);
const char *qtg_settings_str(const qtg_settings *s, int id);

/* n as people write it: 31536000, 0.01 (never 3.1536e+07). */
void qtg_settings_format_number(double n, char *buf, size_t cap);

/* Print the settings table as Markdown (for the README) to stdout. */
void qtg_settings_print_markdown(void);

#endif
