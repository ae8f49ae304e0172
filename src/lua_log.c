/* lua_log.c -- qtg.log.{debug,info,warn,error}(msg, fields): Lua's side of
 * the JSON-lines logger.  Fields are a flat table; numbers and booleans are
 * written as JSON numbers and booleans (a non-finite number as a string),
 * anything else as a string (tables by __tostring or type name) so a log
 * call can never raise on odd input. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "qtg_host.h"
#include "qtg_log.h"

#define QTG_LOG_MAX_FIELDS 24

static int qtg_lua_log_at(lua_State *L, qtg_log_level level) {
  if (level < qtg_log_get_level()) return 0;
  const char *msg = luaL_optstring(L, 1, "");
  const char *fields[QTG_LOG_MAX_FIELDS * 2 + 1];
  char kinds[QTG_LOG_MAX_FIELDS + 1];
  int n = 0;
  lua_settop(L, 2);
  lua_newtable(L); /* 3: anchors the field strings while we log */
  if (lua_istable(L, 2)) {
    lua_pushnil(L);
    while (lua_next(L, 2) != 0) {
      if (lua_type(L, -2) == LUA_TSTRING && n < QTG_LOG_MAX_FIELDS * 2) {
        int t = lua_type(L, -1);
        lua_pushvalue(L, -2);
        lua_rawseti(L, 3, ++n);
        kinds[n / 2] = t == LUA_TBOOLEAN ? 'b' : t == LUA_TNUMBER ? 'n' : 's';
        if (t == LUA_TNUMBER) {
          char num[64];
          double d = lua_tonumber(L, -1);
          if (!isfinite(d)) snprintf(num, sizeof num, "%s", isnan(d) ? "nan" : d > 0 ? "inf" : "-inf");
          else if (d == floor(d) && fabs(d) < 9.2e18) snprintf(num, sizeof num, "%.0f", d);
          else snprintf(num, sizeof num, "%.17g", d);
          lua_pushstring(L, num);
        } else if (t == LUA_TSTRING) {
          lua_pushstring(L, lua_tostring(L, -1));
        } else if (t == LUA_TBOOLEAN) {
          lua_pushstring(L, lua_toboolean(L, -1) ? "true" : "false");
        } else if (luaL_callmeta(L, -1, "__tostring")) {
          if (!lua_isstring(L, -1)) {
            lua_pop(L, 1);
            lua_pushstring(L, lua_typename(L, t));
          }
        } else {
          lua_pushstring(L, lua_typename(L, t));
        }
        lua_rawseti(L, 3, ++n);
      }
      lua_pop(L, 1);
    }
  }
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, 3, i);
    fields[i - 1] = lua_tostring(L, -1);
    lua_pop(L, 1); /* still referenced by table 3 */
  }
  fields[n] = NULL;
  kinds[n / 2] = '\0';
  qtg_log_fieldsk(level, msg, fields, kinds);
  return 0;
}

static int qtg_lua_log_debug(lua_State *L) { return qtg_lua_log_at(L, QTG_LOG_DEBUG); }
static int qtg_lua_log_info(lua_State *L) { return qtg_lua_log_at(L, QTG_LOG_INFO); }
static int qtg_lua_log_warn(lua_State *L) { return qtg_lua_log_at(L, QTG_LOG_WARN); }
static int qtg_lua_log_error(lua_State *L) { return qtg_lua_log_at(L, QTG_LOG_ERROR); }

static int qtg_lua_log_level(lua_State *L) {
  if (lua_gettop(L) >= 1) {
    int lvl = qtg_log_level_parse(luaL_checkstring(L, 1));
    if (lvl < 0) return luaL_argerror(L, 1, "expected debug, info, warn or error");
    qtg_log_set_level((qtg_log_level)lvl);
  }
  lua_pushstring(L, qtg_log_level_name(qtg_log_get_level()));
  return 1;
}

/* qtg.log.repeat_window([seconds]) -> seconds: the window in which a
 * repeated identical warning is only counted (0: every line written). */
static int qtg_lua_log_repeat_window(lua_State *L) {
  if (lua_gettop(L) >= 1) {
    lua_Number n = luaL_checknumber(L, 1);
    if (!(n >= 0 && n <= 86400)) return luaL_argerror(L, 1, "expected 0 to 86400 seconds");
    qtg_log_set_repeat_window((int)n);
  }
  lua_pushinteger(L, qtg_log_get_repeat_window());
  return 1;
}

/* qtg.log.format() -> "json" | "text" */
static int qtg_lua_log_format(lua_State *L) {
  lua_pushstring(L, qtg_log_get_text() ? "text" : "json");
  return 1;
}

int luaopen_qtg_log(lua_State *L) {
  static const luaL_Reg funcs[] = {
    {"debug", qtg_lua_log_debug}, {"info", qtg_lua_log_info},
    {"warn", qtg_lua_log_warn},   {"error", qtg_lua_log_error},
    {"level", qtg_lua_log_level}, {"repeat_window", qtg_lua_log_repeat_window},
    {"format", qtg_lua_log_format}, {NULL, NULL},
  };
  lua_newtable(L);
  luaL_register(L, NULL, funcs);
  return 1;
}
