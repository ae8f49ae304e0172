/* qtg_approver_payments.c -- what an approval lets qtg's signer sign.
 *
 * `qtgd approver sign KEY DOCUMENT PLAN` shows it before it signs, so an
 * approver reads "node transfer: pays 1.5 ETH to 0x... on chain 1" and not
 * only the JSON the hashes cover: a node whose own config pays somewhere
 * else than the intent's destination says so.  The reading is
 * src/prelude/approver.lua, the signer's rules (src/qtg_signerd.c) over the
 * two texts, called as the daemon calls it (qtg.approvers.describe,
 * lua_approvers.c) in a plain LuaJIT state of its own with Debian's cjson,
 * the JIT off as in the host: the approver's machine needs no database and
 * no daemon.
 */
#include "qtg_approver_payments.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <luajit.h>
#include <lualib.h>

#include "qtg_modules_decl.h"

static char *qtg_approver_payments_run(lua_State *L, const char *document, size_t document_len,
                                       const char *plan, size_t plan_len, char *err, size_t errlen) {
  lua_getglobal(L, "package");
  lua_pushliteral(L, QTG_LUA_CMODULE_DIR "/?.so");
  lua_setfield(L, -2, "cpath");
  lua_pop(L, 1);
  lua_pushcfunction(L, luaopen_qtg_approvers);
  if (lua_pcall(L, 0, 1, 0) != 0) {
    snprintf(err, errlen, "cannot read the texts: %s", lua_tostring(L, -1));
    return NULL;
  }
  lua_getfield(L, -1, "describe");
  lua_pushlstring(L, document, document_len);
  lua_pushlstring(L, plan, plan_len);
  if (lua_pcall(L, 2, 2, 0) != 0) {
    snprintf(err, errlen, "cannot read the texts: %s", lua_tostring(L, -1));
    return NULL;
  }
  if (!lua_isstring(L, -2)) {
    snprintf(err, errlen, "%s", lua_isstring(L, -1) ? lua_tostring(L, -1) : "cannot read the texts");
    return NULL;
  }
  size_t len;
  const char *text = lua_tolstring(L, -2, &len);
  char *copy = malloc(len + 1);
  if (copy == NULL) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  memcpy(copy, text, len + 1);
  return copy;
}

char *qtg_approver_payments(const char *document, size_t document_len, const char *plan, size_t plan_len,
                            char *err, size_t errlen) {
  lua_State *L = luaL_newstate();
  if (L == NULL) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  luaL_openlibs(L);
  luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
  char *text = qtg_approver_payments_run(L, document, document_len, plan, plan_len, err, errlen);
  lua_close(L);
  return text;
}
