/* lua_db_claim.c -- the row-claim primitives, written once in C and used by
 * the policies (docs/host-api.md, "Claim primitives").
 *
 *   qtg.db.claim.one(s, {candidates_sql=, claim_sql=, args={...}, max_misses=})
 *     Walk unlocked FIFO candidates one at a time: candidates_sql gets
 *     $1 = the text[] of ids already tried, then args as $2...; it returns
 *     at most one row with an `id` column.  Each candidate is claimed by
 *     claim_sql ($1 = the id, then args) under SAVEPOINT qtg_claim: a miss
 *     rolls the savepoint back (so a partial lock taken on the node before
 *     SKIP LOCKED rejected its request is released) and excludes the id; a
 *     hit keeps the locks in the caller's open transaction.  A hit does not
 *     RELEASE the savepoint: the caller's COMMIT or ROLLBACK ends it, and
 *     the RELEASE would be one more round trip per claimed node.
 *     Each claim (a miss's ROLLBACK TO keeps its savepoint too) nests one
 *     more subtransaction until then: the workers claim one node per
 *     transaction, so that stays shallow; a caller that claims many in one
 *     transaction should commit between them.
 *     Returns the claimed row, or nil when nothing is left.
 *   qtg.db.claim.try(s, claim_sql, id, ...)
 *     The same savepoint dance for one known id (the observer's per-id
 *     re-select).  Returns the row or nil.
 *
 * Both require an open transaction on s (savepoints need one).  Errors are
 * raised as the session's query errors are. */
#include <stdlib.h>
#include <string.h>

#include "lua_db.h"

#define QTG_CLAIM_MAX_ARGS 16

typedef enum {
  QTG_CLAIM_CANDIDATES, QTG_CLAIM_SAVEPOINT, QTG_CLAIM_SELECT, QTG_CLAIM_ROLLBACK_TO
} qtg_claim_step;

typedef struct {
  qtg_db_pending head; /* first: the pool frees it at host close (lua_db.h) */
  qtg_pg_conn *conn;
  qtg_claim_step step;
  int misses, max_misses;
  char *candidates_sql, *claim_sql;
  int nargs;
  char *args[QTG_CLAIM_MAX_ARGS];
  char *excluded;  /* "{id,id}" text[] literal */
  char *candidate;
  PGresult *hit;
} qtg_claim;

static void qtg_claim_free(qtg_claim *c);
/* The claim's callback will never run: see qtg_db_req_drop. */
static void qtg_claim_drop(void *self) {
  qtg_claim *c = self;
  if (c->head.task) qtg_task_set_cancel(c->head.task, NULL, NULL);
  qtg_claim_free(c);
}

static void qtg_claim_free(qtg_claim *c) {
  free(c->candidates_sql);
  free(c->claim_sql);
  for (int i = 0; i < c->nargs; i++) free(c->args[i]);
  free(c->excluded);
  free(c->candidate);
  if (c->hit) PQclear(c->hit);
  free(c);
}

/* Resume the task with (row) / (nil) / (nil, err). */
static void qtg_claim_finish(qtg_claim *c, PGresult *err_res, const char *err) {
  qtg_host *h = c->head.h;
  qtg_task *t = c->head.task;
  lua_State *L = h->L;
  int n;
  qtg_task_set_cancel(t, NULL, NULL);
  if (err || err_res) {
    n = qtg_db_push_result(L, err_res, err); /* nil, err */
  } else if (c->hit) {
    qtg_db_push_result(L, c->hit, NULL); /* rows, affected */
    lua_pop(L, 1);
    lua_rawgeti(L, -1, 1);
    lua_remove(L, -2);
    n = 1;
  } else {
    lua_pushnil(L);
    n = 1;
  }
  qtg_claim_free(c);
  lua_xmove(L, qtg_task_thread(t), n);
  qtg_task_resume(t, n);
}

static void qtg_claim_next(qtg_claim *c);

static int qtg_claim_ok(PGresult *res) {
  ExecStatusType st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
  return st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK;
}

static int qtg_claim_exclude(qtg_claim *c) {
  size_t old = c->excluded ? strlen(c->excluded) : 2;
  size_t need = old + strlen(c->candidate) + 4;
  char *e = malloc(need);
  if (!e) return -1;
  if (!c->excluded || strcmp(c->excluded, "{}") == 0) snprintf(e, need, "{%s}", c->candidate);
  else snprintf(e, need, "%.*s,%s}", (int)(old - 1), c->excluded, c->candidate);
  free(c->excluded);
  c->excluded = e;
  return 0;
}

static void qtg_claim_step_done(qtg_pg_conn *conn, PGresult *res, const char *err, void *data) {
  qtg_claim *c = data;
  (void)conn;
  if (err || !qtg_claim_ok(res)) {
    qtg_claim_finish(c, res, err);
    return;
  }
  switch (c->step) {
  case QTG_CLAIM_CANDIDATES: {
    if (PQntuples(res) == 0) {
      qtg_claim_finish(c, NULL, NULL);
      return;
    }
    int col = PQfnumber(res, "id");
    free(c->candidate);
    c->candidate = strdup(PQgetvalue(res, 0, col >= 0 ? col : 0));
    if (!c->candidate) {
      qtg_claim_finish(c, NULL, "out of memory");
      return;
    }
    c->step = QTG_CLAIM_SAVEPOINT;
    break;
  }
  case QTG_CLAIM_SAVEPOINT:
    c->step = QTG_CLAIM_SELECT;
    break;
  case QTG_CLAIM_SELECT:
    if (PQntuples(res) > 0) {
      /* the result is cleared by the pool after this callback: copy it */
      c->hit = PQcopyResult(res, PG_COPYRES_ATTRS | PG_COPYRES_TUPLES);
      if (!c->hit) {
        qtg_claim_finish(c, NULL, "out of memory");
        return;
      }
      qtg_claim_finish(c, NULL, NULL);
      return;
    } else {
      c->step = QTG_CLAIM_ROLLBACK_TO;
    }
    break;
  case QTG_CLAIM_ROLLBACK_TO:
    c->misses++;
    if (!c->candidates_sql || c->misses >= c->max_misses || qtg_claim_exclude(c) != 0) {
      qtg_claim_finish(c, NULL, NULL);
      return;
    }
    c->step = QTG_CLAIM_CANDIDATES;
    break;
  }
  qtg_claim_next(c);
}

/* Send the statement of c's step; qtg_pg_query's rc (not 0: nothing sent,
 * no completion will come). */
static int qtg_claim_send(qtg_claim *c) {
  const char *values[QTG_CLAIM_MAX_ARGS + 1];
  int rc;
  switch (c->step) {
  case QTG_CLAIM_CANDIDATES:
    values[0] = c->excluded ? c->excluded : "{}";
    for (int i = 0; i < c->nargs; i++) values[i + 1] = c->args[i];
    rc = qtg_pg_query(c->conn, c->candidates_sql, c->nargs + 1, values, 1, qtg_claim_step_done, c);
    break;
  case QTG_CLAIM_SAVEPOINT:
    rc = qtg_pg_query(c->conn, "SAVEPOINT qtg_claim", 0, NULL, 1, qtg_claim_step_done, c);
    break;
  case QTG_CLAIM_SELECT:
    values[0] = c->candidate;
    for (int i = 0; i < c->nargs; i++) values[i + 1] = c->args[i];
    rc = qtg_pg_query(c->conn, c->claim_sql, c->nargs + 1, values, 1, qtg_claim_step_done, c);
    break;
  default:
    rc = qtg_pg_query(c->conn, "ROLLBACK TO SAVEPOINT qtg_claim", 0, NULL, 1, qtg_claim_step_done, c);
    break;
  }
  return rc;
}

/* The next step, from a completion: the task is waiting, and a statement
 * that cannot be sent ends its wait. */
static void qtg_claim_next(qtg_claim *c) {
  if (qtg_claim_send(c) != 0) qtg_claim_finish(c, NULL, "cannot send a claim statement (connection lost?)");
}

static void qtg_claim_cancel(qtg_task *t, void *arg) {
  qtg_claim *c = arg;
  qtg_pg_forget(c->conn);
  qtg_claim_free(c);
  lua_State *co = qtg_task_thread(t);
  lua_pushnil(co);
  qtg_push_error(co, "interrupted", "claim interrupted");
  qtg_task_resume(t, 2);
}

static qtg_claim *qtg_claim_new(lua_State *L, qtg_db_session *s) {
  if (!s->conn) luaL_error(L, "qtg.db.claim: session already released");
  if (qtg_pg_busy(s->conn)) luaL_error(L, "qtg.db.claim: session is busy");
  if (qtg_pg_txn_status(s->conn) == PQTRANS_IDLE)
    luaL_error(L, "qtg.db.claim: needs an open transaction (call s:begin() first)");
  if (qtg_pg_pipelined(s->conn) == 1) /* its SAVEPOINT needs a transaction block */
    luaL_error(L, "qtg.db.claim: needs s:begin(), not a pipeline transaction without a savepoint");
  qtg_claim *c = calloc(1, sizeof *c);
  if (!c) luaL_error(L, "qtg.db.claim: out of memory");
  c->head.drop = qtg_claim_drop;
  c->head.h = s->h;
  c->conn = s->conn;
  return c;
}

/* Keep a copy of a parameter already converted by qtg_db_param (which may
 * raise: every parameter is converted before the claim is allocated, so a
 * refused one leaks nothing). */
static int qtg_claim_add_arg(qtg_claim *c, const char *v) {
  if (c->nargs >= QTG_CLAIM_MAX_ARGS) return -1;
  if (v && !(c->args[c->nargs] = strdup(v))) return -1;
  c->nargs++;
  return 0;
}

/* The first step, from the task itself: a statement that cannot be sent
 * (the session's connection was lost while it waited elsewhere) is
 * answered here, nil and a connection error, without a yield -- finished
 * as from a completion, it resumed the running task and freed it. */
static int qtg_claim_start(lua_State *L, qtg_claim *c) {
  c->head.task = qtg_task_check(L);
  if (qtg_claim_send(c) != 0) {
    int broken = qtg_pg_broken(c->conn);
    qtg_claim_free(c);
    return qtg_db_push_result(L, NULL, broken ? "connection to PostgreSQL lost"
                                              : "cannot send a claim statement");
  }
  qtg_task_set_cancel(c->head.task, qtg_claim_cancel, c);
  return qtg_task_yield(L);
}

static int qtg_lua_claim_one(lua_State *L) {
  qtg_db_session *s = luaL_checkudata(L, 1, QTG_DB_SESSION);
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_getfield(L, 2, "candidates_sql");
  const char *cand = luaL_checkstring(L, -1);
  lua_getfield(L, 2, "claim_sql");
  const char *claim = luaL_checkstring(L, -1);
  lua_getfield(L, 2, "max_misses");
  int max_misses = (int)luaL_optinteger(L, -1, 50);
  lua_getfield(L, 2, "args");
  int args_idx = lua_gettop(L);
  /* args are $2... of both statements; converted (and refused) first */
  int n = lua_istable(L, args_idx) ? (int)lua_objlen(L, args_idx) : 0;
  if (n > QTG_CLAIM_MAX_ARGS) return luaL_error(L, "qtg.db.claim: at most %d args", QTG_CLAIM_MAX_ARGS);
  luaL_checkstack(L, n + 4, "qtg.db.claim: too many args");
  const char *vals[QTG_CLAIM_MAX_ARGS];
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, args_idx, i);
    vals[i - 1] = qtg_db_param(L, lua_gettop(L), i + 1);
  }
  qtg_claim *c = qtg_claim_new(L, s);
  c->max_misses = max_misses > 0 ? max_misses : 1;
  c->candidates_sql = strdup(cand);
  c->claim_sql = strdup(claim);
  int bad = !c->candidates_sql || !c->claim_sql;
  for (int i = 0; i < n && !bad; i++) bad = qtg_claim_add_arg(c, vals[i]) != 0;
  if (bad) {
    qtg_claim_free(c);
    return luaL_error(L, "qtg.db.claim: out of memory");
  }
  c->step = QTG_CLAIM_CANDIDATES;
  return qtg_claim_start(L, c);
}

static int qtg_lua_claim_try(lua_State *L) {
  qtg_db_session *s = luaL_checkudata(L, 1, QTG_DB_SESSION);
  const char *claim = luaL_checkstring(L, 2);
  luaL_checkany(L, 3);
  int top = lua_gettop(L);
  if (top - 3 > QTG_CLAIM_MAX_ARGS) return luaL_error(L, "qtg.db.claim: at most %d args", QTG_CLAIM_MAX_ARGS);
  /* the id is $1, the args $2...; converted (and refused) first */
  const char *id = qtg_db_param(L, 3, 1);
  if (!id) return luaL_error(L, "qtg.db.claim.try: the id must not be nil");
  const char *vals[QTG_CLAIM_MAX_ARGS];
  for (int i = 4; i <= top; i++) vals[i - 4] = qtg_db_param(L, i, i - 2);
  qtg_claim *c = qtg_claim_new(L, s);
  c->claim_sql = strdup(claim);
  c->candidate = strdup(id);
  int bad = !c->claim_sql || !c->candidate;
  for (int i = 4; i <= top && !bad; i++) bad = qtg_claim_add_arg(c, vals[i - 4]) != 0;
  if (bad) {
    qtg_claim_free(c);
    return luaL_error(L, "qtg.db.claim: out of memory");
  }
  c->step = QTG_CLAIM_SAVEPOINT;
  return qtg_claim_start(L, c);
}

void qtg_db_claim_register(lua_State *L) {
  static const luaL_Reg funcs[] = {{"raw_one", qtg_lua_claim_one}, {"raw_try", qtg_lua_claim_try}, {NULL, NULL}};
  lua_newtable(L);
  luaL_register(L, NULL, funcs);
}
