/* qtg_prelude.c -- load the host's own Lua chunks (qtg_prelude.h) from the
 * arrays cmake/embed_lua.cmake generates from src/prelude/NAME.lua.
 */
#include "qtg_prelude.h"

#include <lauxlib.h>

#define QTG_PRELUDE_EXTERN(name, chunk) \
  extern const char qtg_prelude_##name[];  \
  extern const size_t qtg_prelude_##name##_len;
QTG_PRELUDES(QTG_PRELUDE_EXTERN)
#undef QTG_PRELUDE_EXTERN

static const struct {
  const char *text;
  const size_t *len;
  const char *chunk;
} qtg_preludes[] = {
#define QTG_PRELUDE_ROW(name, chunk) {qtg_prelude_##name, &qtg_prelude_##name##_len, chunk},
    QTG_PRELUDES(QTG_PRELUDE_ROW)
#undef QTG_PRELUDE_ROW
};

int qtg_prelude_load(lua_State *L, qtg_prelude_id id) {
  return luaL_loadbuffer(L, qtg_preludes[id].text, *qtg_preludes[id].len, qtg_preludes[id].chunk);
}
