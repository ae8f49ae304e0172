/* qtg_prelude.h -- the Lua chunks the host runs itself: the wrappers that
 * raise over raw bindings (qtg, qtg.db, qtg.signer), the worker tick
 * trampoline, the console's and API's entry points, and `qtgd approver`'s
 * reading of the texts it signs (qtg_approver_payments.c).
 *
 * Each is a file src/prelude/NAME.lua, compiled into qtgd as the array
 * qtg_prelude_NAME by cmake/embed_lua.cmake at build time, so it is read,
 * edited and checked as Lua and never copied into C by hand.
 */
#ifndef QTG_PRELUDE_H
#define QTG_PRELUDE_H

#include <stddef.h>

#include <lua.h>

/* X(name, chunkname): the chunk name is what errors and tracebacks show. */
#define QTG_PRELUDES(X)            \
  X(core, "=qtg.prelude")          \
  X(db, "=qtg.db.prelude")         \
  X(run_loop, "=qtg.run_loop")     \
  X(console, "=console")           \
  X(signer, "=qtg.signer")         \
  X(api, "=api")                   \
  X(approver, "=qtg.approver")

typedef enum {
#define QTG_PRELUDE_ID(name, chunk) QTG_PRELUDE_##name,
  QTG_PRELUDES(QTG_PRELUDE_ID)
#undef QTG_PRELUDE_ID
} qtg_prelude_id;

/* luaL_loadbuffer of the prelude: 0 with the chunk on the stack, or
 * luaL_loadbuffer's error code with its message there. */
int qtg_prelude_load(lua_State *L, qtg_prelude_id id);

#endif
