/* lua_db.h -- internal to qtg.db (lua_db.c, lua_db_claim.c): the session
 * userdata and the conversions both files use, so the claim primitives
 * work on the session itself and not on a copy of its layout; and the one
 * call the console makes, giving back what a closed console's tasks held.
 */
#ifndef QTG_LUA_DB_H
#define QTG_LUA_DB_H

#include <libpq-fe.h>

#include "qtg_host.h"
#include "qtg_pg.h"

#define QTG_DB_SESSION "qtg.db.session"

/* The userdata behind a Lua session (metatable QTG_DB_SESSION): one
 * pooled connection, NULL once released.  While it holds one it is on the
 * host's list of held sessions (h->db_sessions), tagged with the owner of
 * the task that acquired it (qtg_task_owner: a console command's number). */
typedef struct qtg_db_session {
  qtg_pg_conn *conn;
  qtg_host *h;
  uint64_t owner;
  struct qtg_db_session *prev, *next;
} qtg_db_session;

/* Give back every held session whose owner satisfies owned(owner, arg), as
 * its release does (a statement in flight: the task waiting on it is
 * interrupted first); the Lua value is left released.  Returns how many. */
int qtg_db_give_back(qtg_host *h, int (*owned)(uint64_t owner, void *arg), void *arg);

/* The first member of every request lua_db.c and lua_db_claim.c hand the
 * pool as callback data: the pool frees a request whose callback will never
 * run through drop (host close), and a session's release finds through it
 * the task that waits on the session's statement. */
typedef struct {
  void (*drop)(void *self);
  qtg_host *h;
  qtg_task *task;
} qtg_db_pending;

/* Push a query's outcome: (rows, affected) for a result, (nil, err) for an
 * error result or message.  Returns the number of values pushed. */
int qtg_db_push_result(lua_State *L, PGresult *res, const char *err);

/* The Lua value at idx as the text of parameter $pnum (NULL for SQL NULL),
 * anchored on L at idx.  Raises, naming $pnum, on a value it cannot send. */
const char *qtg_db_param(lua_State *L, int idx, int pnum);

/* Push the table of qtg.db.claim's raw primitives (lua_db_claim.c). */
void qtg_db_claim_register(lua_State *L);

#endif
