/* qtg_modules_decl.h -- prototypes of every row in qtg_modules.h, generated
 * from the rows so the list and the declarations cannot drift. */
#ifndef QTG_MODULES_DECL_H
#define QTG_MODULES_DECL_H

#include <stddef.h>
#include "qtg_host.h"

#define QTG_SUBSYSTEM(name, open, close, phase) \
  int open(qtg_host *h, char *err, size_t errlen); \
  void close(qtg_host *h);
#define QTG_LUA_MODULE(field, opener) int opener(lua_State *L);
#include "qtg_modules.h"
#undef QTG_SUBSYSTEM
#undef QTG_LUA_MODULE

/* Builds the `qtg` table (package.loaded.qtg) from the module rows. */
int qtg_core_register(qtg_host *h);
/* Frees what the core bindings still hold (pending sleeps) at host close. */
void qtg_core_close(qtg_host *h);
/* Compiles the run_loop trampoline once `qtg` exists. */
int qtg_runtime_ready(qtg_host *h);

#endif
