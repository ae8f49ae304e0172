/* lua_approvers.c -- qtg.approvers: the enrolment of approvers
 * (MG_SIGNER_APPROVERS, qtg_approvers.h) for the daemon's own approval
 * policy, so the daemon counts a signed approval exactly as the signer
 * will: the same parser, the same statement, the same Ed25519 check.
 *
 *   qtg.approvers.load(path) -> enrolment | nil, err
 *   e:person(principal)      -> the person's name | nil
 *   e:quorum(class)          -> the class's quorum | nil (none named)
 *   e:quorum_for(class, asset, amount[, transfers]) -> n, why | nil, why:
 *                               what the signer asks of such a request (its
 *                               class's quorum raised by the tiers that
 *                               hold: qtg_approvers_quorum_for; asset and
 *                               amount the intent's text, nil when absent;
 *                               transfers the plan's evm_transfer nodes,
 *                               an integer 0-1000000, default 1)
 *   e:tiers(class)           -> the amount tiers that can raise class's
 *                               quorum, described and joined by "; " | nil
 *                               (none)
 *   qtg.approvers.describe(document_text, plan_text) -> text | nil, why:
 *                               what the texts let the signer sign
 *   e:verify(principal, statement, signature_hex) -> true | false
 *   e:verify_initiation(principal, statement, signature_hex) -> true | false
 *                               (principal's person or initiator signed it)
 *   e:initiator(principal)   -> the person's or initiator's name | nil
 *   e:initiation_signed()    -> true when requests need their maker's signature
 *   e:count()                -> number of persons (approvers)
 *   e:deployment()           -> the deployment every statement names
 *   e:digest()               -> the SHA-256 of the file's text (64 hex)
 *   qtg.approvers.statement_ok(text) -> true when text is one statement
 *
 * The daemon's copy only decides early (refusing a vote that will not
 * count, waiting for the quorum the signer will ask); the signer's copy
 * is the one that decides what is signed.
 */
#include <lauxlib.h>
#include <lua.h>

#include "qtg_approvers.h"
#include "qtg_host.h"
#include "qtg_prelude.h"

static const char qtg_enrolment_meta[] = "qtg.approvers.enrolment";

static qtg_approvers *qtg_check_enrolment(lua_State *L) {
  qtg_approvers **a = luaL_checkudata(L, 1, qtg_enrolment_meta);
  if (*a == NULL) luaL_error(L, "qtg.approvers: the enrolment was freed");
  return *a;
}

static int qtg_lua_approvers_load(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  char err[512];
  qtg_approvers **slot = lua_newuserdata(L, sizeof *slot);
  *slot = NULL;
  luaL_getmetatable(L, qtg_enrolment_meta);
  lua_setmetatable(L, -2);
  if (qtg_approvers_load(path, slot, err, sizeof err) != 0) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
  }
  return 1;
}

static int qtg_lua_enrolment_person(lua_State *L) {
  qtg_approvers *a = qtg_check_enrolment(L);
  int who = qtg_approvers_person_of(a, luaL_checkstring(L, 2));
  if (who < 0) lua_pushnil(L);
  else lua_pushstring(L, qtg_approvers_person_name(a, who));
  return 1;
}

static int qtg_lua_enrolment_quorum(lua_State *L) {
  int n = qtg_approvers_quorum(qtg_check_enrolment(L), luaL_checkstring(L, 2));
  if (n < 0) lua_pushnil(L);
  else lua_pushinteger(L, n);
  return 1;
}

/* A string argument, or NULL when it is absent or not a string (a SQL NULL). */
static const char *qtg_opt_text(lua_State *L, int i) {
  return lua_type(L, i) == LUA_TSTRING ? lua_tostring(L, i) : NULL;
}

static int qtg_lua_enrolment_quorum_for(lua_State *L) {
  qtg_approvers *a = qtg_check_enrolment(L);
  char why[300];
  lua_Number transfers = luaL_optnumber(L, 5, 1);
  if (!(transfers >= 0 && transfers <= 1000000) || transfers != (lua_Number)(uint32_t)transfers)
    return luaL_argerror(L, 5, "transfers must be an integer from 0 to 1000000");
  int n = qtg_approvers_quorum_for(a, luaL_checkstring(L, 2), qtg_opt_text(L, 3), qtg_opt_text(L, 4),
                                   (uint32_t)transfers, why, sizeof why);
  if (n < 0) lua_pushnil(L);
  else lua_pushinteger(L, n);
  lua_pushstring(L, why);
  return 2;
}

static int qtg_lua_enrolment_tiers(lua_State *L) {
  qtg_approvers *a = qtg_check_enrolment(L);
  char text[2048];
  if (qtg_approvers_tiers_of(a, luaL_checkstring(L, 2), text, sizeof text) == 0) lua_pushnil(L);
  else lua_pushstring(L, text);
  return 1;
}

/* e:verify / e:verify_initiation: whether the entry `lookup` finds for
 * the principal (its person; its person or initiator) signed statement. */
static int qtg_lua_verify_by(lua_State *L, int (*lookup)(const qtg_approvers *, const char *)) {
  qtg_approvers *a = qtg_check_enrolment(L);
  size_t len;
  const char *principal = luaL_checkstring(L, 2);
  const char *statement = luaL_checklstring(L, 3, &len);
  const char *sig = luaL_checkstring(L, 4);
  int who = lookup(a, principal);
  lua_pushboolean(L, who >= 0 && qtg_approvers_verify(a, who, statement, len, sig));
  return 1;
}

static int qtg_lua_enrolment_verify(lua_State *L) {
  return qtg_lua_verify_by(L, qtg_approvers_person_of);
}

static int qtg_lua_enrolment_verify_initiation(lua_State *L) {
  return qtg_lua_verify_by(L, qtg_approvers_initiator_of);
}

static int qtg_lua_enrolment_initiator(lua_State *L) {
  qtg_approvers *a = qtg_check_enrolment(L);
  int who = qtg_approvers_initiator_of(a, luaL_checkstring(L, 2));
  if (who < 0) lua_pushnil(L);
  else lua_pushstring(L, qtg_approvers_person_name(a, who));
  return 1;
}

static int qtg_lua_enrolment_initiation_signed(lua_State *L) {
  lua_pushboolean(L, qtg_approvers_initiation_signed(qtg_check_enrolment(L)));
  return 1;
}

static int qtg_lua_enrolment_count(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)qtg_approvers_count_persons(qtg_check_enrolment(L)));
  return 1;
}

static int qtg_lua_enrolment_deployment(lua_State *L) {
  lua_pushstring(L, qtg_approvers_deployment(qtg_check_enrolment(L)));
  return 1;
}

static int qtg_lua_enrolment_digest(lua_State *L) {
  lua_pushstring(L, qtg_approvers_digest(qtg_check_enrolment(L)));
  return 1;
}

static int qtg_lua_enrolment_gc(lua_State *L) {
  qtg_approvers **a = luaL_checkudata(L, 1, qtg_enrolment_meta);
  qtg_approvers_free(*a);
  *a = NULL;
  return 0;
}

static int qtg_lua_statement_ok(lua_State *L) {
  size_t len;
  const char *text = luaL_checklstring(L, 1, &len);
  lua_pushboolean(L, qtg_request_statement_check(text, len) >= 0);
  return 1;
}

/* qtg.approvers.describe(document_text, plan_text) -> text | nil, why: what
 * an approval with these texts lets qtg's signer sign, by the signer's
 * rules, as `qtgd approver sign` shows it (src/prelude/approver.lua; the
 * web console's Approvals page shows it too).  The chunk is loaded once per
 * Lua state, on first use (it requires cjson). */
static const char qtg_describe_key = 'd';

static int qtg_lua_approvers_describe(lua_State *L) {
  luaL_checkstring(L, 1);
  luaL_checkstring(L, 2);
  lua_settop(L, 2);
  lua_pushlightuserdata(L, (void *)&qtg_describe_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    if (qtg_prelude_load(L, QTG_PRELUDE_approver) != 0) return lua_error(L);
    lua_call(L, 0, 1);
    lua_pushlightuserdata(L, (void *)&qtg_describe_key);
    lua_pushvalue(L, -2);
    lua_rawset(L, LUA_REGISTRYINDEX);
  }
  lua_insert(L, 1);
  lua_call(L, 2, 2);
  return 2;
}

int luaopen_qtg_approvers(lua_State *L) {
  static const luaL_Reg methods[] = {
      {"person", qtg_lua_enrolment_person},
      {"quorum", qtg_lua_enrolment_quorum},
      {"quorum_for", qtg_lua_enrolment_quorum_for},
      {"tiers", qtg_lua_enrolment_tiers},
      {"verify", qtg_lua_enrolment_verify},
      {"verify_initiation", qtg_lua_enrolment_verify_initiation},
      {"initiator", qtg_lua_enrolment_initiator},
      {"initiation_signed", qtg_lua_enrolment_initiation_signed},
      {"count", qtg_lua_enrolment_count},
      {"deployment", qtg_lua_enrolment_deployment},
      {"digest", qtg_lua_enrolment_digest},
      {NULL, NULL},
  };
  static const luaL_Reg fns[] = {
      {"load", qtg_lua_approvers_load},
      {"statement_ok", qtg_lua_statement_ok},
      {"describe", qtg_lua_approvers_describe},
      {NULL, NULL},
  };
  if (luaL_newmetatable(L, qtg_enrolment_meta)) {
    lua_createtable(L, 0, 10);
    luaL_register(L, NULL, methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, qtg_lua_enrolment_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_pop(L, 1);
  lua_createtable(L, 0, 3);
  luaL_register(L, NULL, fns);
  return 1;
}
