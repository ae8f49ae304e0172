/* lua_db.c -- qtg.db: PostgreSQL sessions for Lua (see docs/host-api.md).
 *
 * A session is a userdata holding one pooled connection.  Every call that
 * talks to the server yields the calling task; the pool's callback converts
 * the result on the main Lua state (a suspended coroutine must not run
 * code), moves it onto the task's stack and resumes the task.  Raw bindings
 * return (value) or (nil, err); thin Lua wrappers in src/prelude/db.lua
 * raise. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lua_db.h"
#include "qtg_log.h"
#include "qtg_prelude.h"

#define QTG_DB_MAX_PARAMS 64

/* Every piece of data lua_db hands the pool starts with a qtg_db_pending, so
 * the pool can free it at host close without knowing its type (qtg_claim
 * too). */
typedef struct {
  qtg_db_pending head; /* first (lua_db.h) */
  qtg_db_session *sess;
  int commit; /* a pipeline commit: one that did not commit is an error */
  int failed_commit; /* ... and one after a failed statement cannot */
  int ahead; /* a batch's statements after its commit (raw_batch_commit_ahead) */
  uv_timer_t *deadline; /* an acquire's MG_DB_ACQUIRE_TIMEOUT_SECONDS */
  int in_share; /* an acquire of the API's share (MG_API_DB_SESSIONS) */
} qtg_db_req;

static void qtg_db_timer_closed(uv_handle_t *handle) { free(handle); }

/* The request is over: its deadline (if any) stops and closes. */
static void qtg_db_req_free(qtg_db_req *q) {
  if (q->deadline) uv_close((uv_handle_t *)q->deadline, qtg_db_timer_closed);
  free(q);
}

/* The request's callback will never run (its connection was destroyed
 * while busy, or the pool freed): the task no longer waits on it. */
static void qtg_db_req_drop(void *self) {
  qtg_db_req *q = self;
  if (q->head.task) qtg_task_set_cancel(q->head.task, NULL, NULL);
  qtg_db_req_free(q);
}

static void qtg_db_drop(void *data) {
  qtg_db_pending *w = data;
  if (w->drop) w->drop(data);
}

static const char qtg_db_cjson_key = 'j';

/* ---- value conversion ---------------------------------------------------- */

static void qtg_db_push_cjson(lua_State *L, const char *fn) {
  lua_pushlightuserdata(L, (void *)&qtg_db_cjson_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  lua_getfield(L, -1, fn);
  lua_remove(L, -2);
}

/* OIDs from pg_type.h (stable across versions). */
enum {
  QTG_OID_BOOL = 16, QTG_OID_INT8 = 20, QTG_OID_INT2 = 21, QTG_OID_INT4 = 23, QTG_OID_OID = 26,
  QTG_OID_JSON = 114, QTG_OID_FLOAT4 = 700, QTG_OID_FLOAT8 = 701, QTG_OID_TIMESTAMP = 1114,
  QTG_OID_TIMESTAMPTZ = 1184, QTG_OID_JSONB = 3802
};

static void qtg_db_push_timestamp(lua_State *L, const char *v, size_t len) {
  /* "2026-11-30 03:34:35.123+00" -> "2026-11-30T03:34:35.123Z" */
  char buf[64];
  if (len >= sizeof buf - 2 || len < 19) {
    lua_pushlstring(L, v, len);
    return;
  }
  memcpy(buf, v, len);
  buf[len] = '\0';
  if (buf[10] == ' ') buf[10] = 'T';
  if (len > 3 && strcmp(buf + len - 3, "+00") == 0) {
    buf[len - 3] = 'Z';
    buf[len - 2] = '\0';
  }
  lua_pushstring(L, buf);
}

static void qtg_db_push_value(lua_State *L, PGresult *res, int row, int col, Oid type) {
  if (PQgetisnull(res, row, col)) {
    lua_pushlightuserdata(L, NULL);
    return;
  }
  const char *v = PQgetvalue(res, row, col);
  size_t len = (size_t)PQgetlength(res, row, col);
  switch (type) {
  case QTG_OID_BOOL:
    lua_pushboolean(L, v[0] == 't');
    return;
  case QTG_OID_INT2:
  case QTG_OID_INT4:
  case QTG_OID_OID:
  case QTG_OID_FLOAT4:
  case QTG_OID_FLOAT8:
    lua_pushnumber(L, strtod(v, NULL));
    return;
  case QTG_OID_INT8: {
    /* Exact as a number up to 2^53; beyond that a string keeps every digit. */
    long long x = strtoll(v, NULL, 10);
    if (llabs(x) <= (1LL << 53)) lua_pushnumber(L, (double)x);
    else lua_pushlstring(L, v, len);
    return;
  }
  case QTG_OID_JSON:
  case QTG_OID_JSONB:
    qtg_db_push_cjson(L, "decode");
    lua_pushlstring(L, v, len);
    lua_call(L, 1, 1); /* inside the converter's pcall */
    return;
  case QTG_OID_TIMESTAMP:
  case QTG_OID_TIMESTAMPTZ:
    qtg_db_push_timestamp(L, v, len);
    return;
  default:
    lua_pushlstring(L, v, len);
  }
}

/* pcall'd: (lightuserdata PGresult) -> rows, affected.  A column named
 * "*name" (its value unused) starts a nested row: the columns after it,
 * up to the next such column, land in row.name, so one statement can
 * return two tables' rows whose column names overlap ("SELECT w.*, NULL AS
 * \"*node\", n.* FROM w, n"), each converted by its type. */
static int qtg_db_convert(lua_State *L) {
  PGresult *res = lua_touserdata(L, 1);
  int nrows = PQntuples(res), ncols = PQnfields(res);
  lua_createtable(L, nrows, 0);
  for (int r = 0; r < nrows; r++) {
    lua_createtable(L, 0, ncols);
    int nested = 0;
    for (int c = 0; c < ncols; c++) {
      const char *name = PQfname(res, c);
      if (name[0] == '*' && name[1]) {
        if (nested) lua_pop(L, 1);
        lua_createtable(L, 0, ncols - c - 1);
        lua_pushvalue(L, -1);
        lua_setfield(L, -3, name + 1);
        nested = 1;
        continue;
      }
      qtg_db_push_value(L, res, r, c, PQftype(res, c));
      lua_setfield(L, -2, name);
    }
    if (nested) lua_pop(L, 1);
    lua_rawseti(L, -2, r + 1);
  }
  const char *aff = PQcmdTuples(res);
  lua_pushnumber(L, aff && aff[0] ? strtod(aff, NULL) : nrows);
  return 2;
}

/* Push {kind="sql", sqlstate=, message=, detail=, hint=, constraint=}. */
/* nil, err for a statement after a failed one in a pipeline transaction:
 * what the server says of a statement in an aborted transaction block. */
static int qtg_db_push_aborted(lua_State *L) {
  lua_pushnil(L);
  qtg_push_error(L, "sql", "current transaction is aborted, commands ignored until end of transaction block");
  lua_pushliteral(L, "25P02");
  lua_setfield(L, -2, "sqlstate");
  return 2;
}

static void qtg_db_push_sql_error(lua_State *L, PGresult *res) {
  const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
  qtg_push_error(L, "sql", "%s", msg ? msg : PQresultErrorMessage(res));
  static const struct { int code; const char *name; } fields[] = {
    {PG_DIAG_SQLSTATE, "sqlstate"}, {PG_DIAG_MESSAGE_DETAIL, "detail"},
    {PG_DIAG_MESSAGE_HINT, "hint"}, {PG_DIAG_CONSTRAINT_NAME, "constraint"},
    {PG_DIAG_TABLE_NAME, "table"}, {PG_DIAG_STATEMENT_POSITION, "position"},
  };
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    const char *v = PQresultErrorField(res, fields[i].code);
    if (v) {
      lua_pushstring(L, v);
      lua_setfield(L, -2, fields[i].name);
    }
  }
}

static void qtg_db_push_conn_error(lua_State *L, const char *err) {
  qtg_push_error(L, "connection", "%s", err);
  lua_pushliteral(L, "08006");
  lua_setfield(L, -2, "sqlstate");
}

/* Push (rows, affected) or (nil, err) for res onto L; returns 2. */
int qtg_db_push_result(lua_State *L, PGresult *res, const char *err) {
  if (err || !res) {
    lua_pushnil(L);
    qtg_db_push_conn_error(L, err ? err : "no result");
    return 2;
  }
  ExecStatusType st = PQresultStatus(res);
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK && st != PGRES_EMPTY_QUERY && st != PGRES_PIPELINE_SYNC) {
    lua_pushnil(L);
    qtg_db_push_sql_error(L, res);
    return 2;
  }
  lua_pushcfunction(L, qtg_db_convert);
  lua_pushlightuserdata(L, res);
  if (lua_pcall(L, 1, 2, 0) != 0) {
    const char *m = lua_tostring(L, -1);
    qtg_push_error(L, "decode", "cannot convert a result row: %s", m ? m : "?");
    lua_remove(L, -2);
    lua_pushnil(L);
    lua_insert(L, -2);
  }
  return 2;
}

/* ---- query ------------------------------------------------------------------ */

static void qtg_db_query_done(qtg_pg_conn *conn, PGresult *res, const char *err, void *data) {
  qtg_db_req *q = data;
  (void)conn;
  qtg_host *h = q->head.h;
  qtg_task *t = q->head.task;
  /* a block's COMMIT in an aborted block answers ROLLBACK, without an error */
  int failed_commit = q->commit && !err && res &&
                      (q->failed_commit || strcmp(PQcmdStatus(res), "ROLLBACK") == 0);
  free(q);
  qtg_task_set_cancel(t, NULL, NULL);
  int n;
  if (failed_commit) {
    lua_pushnil(h->L);
    qtg_push_error(h->L, "sql", "the transaction was rolled back at its commit: a statement in it failed");
    lua_pushliteral(h->L, "25P02");
    lua_setfield(h->L, -2, "sqlstate");
    n = 2;
  } else {
    n = qtg_db_push_result(h->L, res, err);
  }
  lua_xmove(h->L, qtg_task_thread(t), n);
  qtg_task_resume(t, n);
}

static void qtg_db_query_cancel(qtg_task *t, void *arg) {
  qtg_db_req *q = arg;
  qtg_pg_forget(q->sess->conn); /* the connection is discarded on release */
  free(q);
  lua_State *co = qtg_task_thread(t);
  lua_pushnil(co);
  qtg_push_error(co, "interrupted", "query interrupted");
  qtg_task_resume(t, 2);
}

static qtg_db_session *qtg_db_check_session(lua_State *L) {
  qtg_db_session *s = luaL_checkudata(L, 1, QTG_DB_SESSION);
  if (!s->conn) luaL_error(L, "qtg.db: session already released");
  if (qtg_pg_busy(s->conn)) luaL_error(L, "qtg.db: session is busy with another query (one query at a time per session)");
  return s;
}

/* A number inside a table parameter that cjson's 14 significant digits
 * would round (its text would read back as another number): 1 and *bad set,
 * or 0; -1 when the table nests deeper than QTG_DB_MAX_DEPTH (or refers to
 * itself), which aborts the walk.  Money must not change on its way to a
 * jsonb column: such a table is refused with an error, never written
 * rounded (amounts belong in strings). */
#define QTG_DB_MAX_DEPTH 64
static int qtg_db_table_rounds(lua_State *L, int idx, int depth, double *bad) {
  if (depth > QTG_DB_MAX_DEPTH) return -1;
  int found = 0;
  lua_pushnil(L);
  while (found == 0 && lua_next(L, idx) != 0) {
    if (lua_type(L, -1) == LUA_TNUMBER) {
      double d = lua_tonumber(L, -1);
      char buf[64];
      snprintf(buf, sizeof buf, "%.14g", d);
      if (isfinite(d) && strtod(buf, NULL) != d) {
        *bad = d;
        found = 1;
      }
    } else if (lua_type(L, -1) == LUA_TTABLE) {
      found = qtg_db_table_rounds(L, lua_gettop(L), depth + 1, bad);
    }
    lua_pop(L, 1);
  }
  if (found != 0) lua_pop(L, 1); /* the key lua_next left */
  return found;
}

/* Lua value at idx -> text parameter $pnum (lua_db.h). */
const char *qtg_db_param(lua_State *L, int idx, int pnum) {
  switch (lua_type(L, idx)) {
  case LUA_TNIL:
    return NULL;
  case LUA_TLIGHTUSERDATA:
    if (lua_touserdata(L, idx) == NULL) return NULL;
    break;
  case LUA_TBOOLEAN:
    return lua_toboolean(L, idx) ? "true" : "false";
  case LUA_TNUMBER: {
    double d = lua_tonumber(L, idx);
    if (!isfinite(d)) luaL_error(L, "qtg.db: parameter $%d is not a finite number", pnum);
    char buf[64];
    if (d == floor(d) && fabs(d) < 9.2e18) snprintf(buf, sizeof buf, "%lld", (long long)d);
    else snprintf(buf, sizeof buf, "%.17g", d);
    lua_pushstring(L, buf);
    lua_replace(L, idx);
    return lua_tostring(L, idx);
  }
  case LUA_TSTRING: {
    /* Sent as a C string: a NUL would silently cut the value (found by
     * spec/lua/fuzz/fuzz_templates_spec.lua); PostgreSQL text cannot hold one. */
    size_t len;
    const char *v = lua_tolstring(L, idx, &len);
    if (memchr(v, '\0', len))
      luaL_error(L, "qtg.db: parameter $%d contains a NUL byte (PostgreSQL text cannot hold one)", pnum);
    return v;
  }
  case LUA_TTABLE: {
    double bad = 0;
    luaL_checkstack(L, 2 * QTG_DB_MAX_DEPTH + 8, "qtg.db: table parameter too deep");
    int r = qtg_db_table_rounds(L, idx, 0, &bad);
    if (r < 0)
      luaL_error(L, "qtg.db: parameter $%d nests deeper than %d levels (or contains itself)", pnum,
                 QTG_DB_MAX_DEPTH);
    if (r > 0)
      luaL_error(L, "qtg.db: parameter $%d holds the number %.17g, which JSON at 14 significant digits "
                 "would round: pass it as a string (or encode the table with qtg.canon_json)", pnum, bad);
  }
    qtg_db_push_cjson(L, "encode");
    lua_pushvalue(L, idx);
    if (lua_pcall(L, 1, 1, 0) != 0)
      luaL_error(L, "qtg.db: parameter $%d cannot be encoded as JSON: %s", pnum, lua_tostring(L, -1));
    lua_replace(L, idx);
    return lua_tostring(L, idx);
  default:
    break;
  }
  luaL_error(L, "qtg.db: parameter $%d has unsupported type %s", pnum, luaL_typename(L, idx));
  return NULL;
}

/* A request for the calling task's answer from s (raises when out of
 * memory, before anything is sent). */
static qtg_db_req *qtg_db_req_new(lua_State *L, qtg_db_session *s) {
  qtg_task *t = qtg_task_check(L);
  qtg_db_req *q = calloc(1, sizeof *q);
  if (!q) luaL_error(L, "qtg.db: out of memory");
  q->head.drop = qtg_db_req_drop;
  q->head.h = s->h;
  q->head.task = t;
  q->sess = s;
  return q;
}

/* After a send (rc 0: sent): yield until q's callback resumes the task, or
 * return nil, err at once when nothing was sent. */
static int qtg_db_wait(lua_State *L, qtg_db_session *s, qtg_db_req *q, int rc, const char *why) {
  if (rc != 0) {
    free(q);
    lua_pushnil(L);
    qtg_db_push_conn_error(L, qtg_pg_broken(s->conn) ? "connection to PostgreSQL lost" : why);
    return 2;
  }
  qtg_task_set_cancel(q->head.task, qtg_db_query_cancel, q);
  return qtg_task_yield(L);
}

/* What a session sends: a statement (extended or simple protocol), or the
 * BEGIN and the end of a pipeline transaction. */
typedef enum { QTG_DB_QUERY, QTG_DB_EXEC, QTG_DB_PIPE_BLOCK, QTG_DB_PIPE_COMMIT, QTG_DB_PIPE_ROLLBACK } qtg_db_cmd;

static int qtg_db_send(lua_State *L, qtg_db_cmd cmd) {
  qtg_db_session *s = qtg_db_check_session(L);
  const char *sql = cmd <= QTG_DB_EXEC ? luaL_checkstring(L, 2) : NULL;
  int n = cmd <= QTG_DB_EXEC ? lua_gettop(L) - 2 : 0;
  if (n > QTG_DB_MAX_PARAMS) return luaL_error(L, "qtg.db: at most %d parameters", QTG_DB_MAX_PARAMS);
  if (cmd == QTG_DB_EXEC && n > 0) return luaL_error(L, "qtg.db: exec takes no parameters (use query)");
  if (cmd > QTG_DB_EXEC && !qtg_pg_pipelined(s->conn)) {
    lua_pushnil(L);
    qtg_push_error(L, "usage", "qtg.db: no pipeline transaction is open on this session");
    return 2;
  }
  /* s:begin() inside a pipeline transaction would open a block its end
   * does not know to commit */
  if (cmd <= QTG_DB_EXEC && qtg_pg_pipelined(s->conn) && strcmp(sql, "BEGIN") == 0) {
    lua_pushnil(L);
    qtg_push_error(L, "usage", "qtg.db: a pipeline transaction is open on this session");
    return 2;
  }
  /* a failed pipeline without a block is over (qtg_pg.h): only its end */
  if (cmd <= QTG_DB_PIPE_BLOCK && qtg_pg_pipeline_failed(s->conn) && qtg_pg_pipelined(s->conn) == 1)
    return qtg_db_push_aborted(L);
  const char *values[QTG_DB_MAX_PARAMS];
  for (int i = 0; i < n; i++) values[i] = qtg_db_param(L, i + 3, i + 1);
  qtg_db_req *q = qtg_db_req_new(L, s);
  int rc = -1;
  switch (cmd) {
  case QTG_DB_QUERY: rc = qtg_pg_query(s->conn, sql, n, values, 1, qtg_db_query_done, q); break;
  case QTG_DB_EXEC: rc = qtg_pg_exec(s->conn, sql, qtg_db_query_done, q); break;
  case QTG_DB_PIPE_BLOCK: rc = qtg_pg_pipeline_block(s->conn, qtg_db_query_done, q); break;
  case QTG_DB_PIPE_COMMIT:
    q->commit = 1;
    q->failed_commit = qtg_pg_pipeline_failed(s->conn);
    rc = qtg_pg_pipeline_end(s->conn, 1, qtg_db_query_done, q);
    break;
  case QTG_DB_PIPE_ROLLBACK: rc = qtg_pg_pipeline_end(s->conn, 0, qtg_db_query_done, q); break;
  }
  return qtg_db_wait(L, s, q, rc, "cannot send the query");
}

/* The first of res[from..to) that is not a statement's success, or -1. */
static int qtg_db_batch_failed(PGresult **res, int from, int to) {
  for (int i = from; i < to; i++) {
    ExecStatusType st = res[i] ? PQresultStatus(res[i]) : PGRES_FATAL_ERROR;
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) return i;
  }
  return -1;
}

/* Pushes the rows of res[from..to): their count, or -1 with (nil, err)
 * alone pushed when a row cannot be converted. */
static int qtg_db_batch_push_rows(lua_State *L, PGresult **res, int from, int to) {
  int top = lua_gettop(L);
  for (int i = from; i < to; i++) {
    qtg_db_push_result(L, res[i], NULL);
    if (lua_isnil(L, -2)) { /* that error alone */
      lua_insert(L, top + 1);
      lua_insert(L, top + 1);
      lua_settop(L, top + 2);
      return -1;
    }
    lua_pop(L, 1); /* the affected count */
  }
  return to - from;
}

/* A batch's results: the first statement's error that failed (those after
 * it answer "aborted", which says less), else each statement's rows in
 * order.  With statements ahead of a commit, the error is the committing
 * part's only; its rows are followed by a table of the rows of the
 * statements ahead, or by false and the first of their errors. */
static void qtg_db_batch_done(qtg_pg_conn *conn, PGresult **res, int n, const char *err, void *data) {
  qtg_db_req *q = data;
  (void)conn;
  qtg_host *h = q->head.h;
  qtg_task *t = q->head.task;
  int m = n - q->ahead;
  free(q);
  qtg_task_set_cancel(t, NULL, NULL);
  int bad = err ? -1 : qtg_db_batch_failed(res, 0, m);
  int nret;
  if (err || bad >= 0) {
    nret = qtg_db_push_result(h->L, err ? NULL : res[bad], err);
  } else {
    nret = qtg_db_batch_push_rows(h->L, res, 0, m);
    if (nret < 0) {
      nret = 2;
    } else if (m < n) {
      int bad_ahead = qtg_db_batch_failed(res, m, n);
      if (bad_ahead >= 0 || qtg_db_batch_push_rows(h->L, res, m, n) < 0) {
        if (bad_ahead >= 0) qtg_db_push_result(h->L, res[bad_ahead], NULL);
        lua_pushboolean(h->L, 0);
        lua_replace(h->L, -3);
      } else {
        lua_createtable(h->L, n - m, 0);
        lua_insert(h->L, -(n - m) - 1);
        for (int i = n - m; i >= 1; i--) lua_rawseti(h->L, -(i + 1), i);
        lua_pushnil(h->L);
      }
      nret += 2;
    }
  }
  lua_xmove(h->L, qtg_task_thread(t), nret);
  qtg_task_resume(t, nret);
}

/* raw_batch(session, {sql, v1, ...}, {sql, ...}, ...) -> rows1, rows2, ...
 * | nil, err | false (a statement is not prepared yet: nothing was sent).
 * Inside a pipeline transaction only (qtg_pg_query_batch); a table's
 * values run from index 2 to its length, qtg.db.NULL for SQL NULL.
 * raw_batch_commit: the same, and the Sync that commits in the same flush
 * (the transaction is over when it answers, committed or rolled back);
 * false also when the transaction is a block.
 * raw_batch_commit_ahead(session, k, ...): raw_batch_commit whose last k
 * statements go after the commit, as the next pipeline transaction's
 * first (qtg_pg_query_batch's ahead): -> the committed statements' rows,
 * then a table of those k statements' rows and nil, or false and their
 * error; the new transaction is open then (also when it answers nil, err:
 * the commit failed). */
static int qtg_db_batch(lua_State *L, int commit, int takes_ahead) {
  qtg_db_session *s = qtg_db_check_session(L);
  int ahead = takes_ahead ? (int)luaL_checkinteger(L, 2) : 0;
  int first = takes_ahead ? 3 : 2; /* the first statement's index */
  int n = lua_gettop(L) - first + 1;
  if (n < 1 || n > QTG_PG_BATCH_MAX) return luaL_error(L, "qtg.db: a batch takes 1 to %d statements", QTG_PG_BATCH_MAX);
  if (ahead < 0 || ahead >= n)
    return luaL_error(L, "qtg.db: %d of a batch's %d statements cannot go after its commit", ahead, n);
  if (!qtg_pg_pipelined(s->conn)) {
    lua_pushnil(L);
    qtg_push_error(L, "usage", "qtg.db: a batch needs a pipeline transaction on this session");
    return 2;
  }
  if (qtg_pg_pipeline_failed(s->conn)) return qtg_db_push_aborted(L);
  const char *sqls[QTG_PG_BATCH_MAX];
  int nparams[QTG_PG_BATCH_MAX];
  const char *values[QTG_PG_BATCH_MAX][QTG_DB_MAX_PARAMS];
  const char *const *vp[QTG_PG_BATCH_MAX];
  for (int i = 0; i < n; i++) {
    int ti = i + first;
    luaL_checktype(L, ti, LUA_TTABLE);
    int len = (int)lua_objlen(L, ti);
    if (len < 1) return luaL_error(L, "qtg.db: batch statement %d has no SQL", i + 1);
    if (len - 1 > QTG_DB_MAX_PARAMS) return luaL_error(L, "qtg.db: at most %d parameters", QTG_DB_MAX_PARAMS);
    luaL_checkstack(L, len + 8, "qtg.db: batch too large");
    lua_rawgeti(L, ti, 1);
    if (lua_type(L, -1) != LUA_TSTRING) return luaL_error(L, "qtg.db: batch statement %d's SQL is not a string", i + 1);
    sqls[i] = lua_tostring(L, -1); /* kept on the stack */
    nparams[i] = len - 1;
    for (int j = 0; j < nparams[i]; j++) {
      lua_rawgeti(L, ti, j + 2);
      values[i][j] = qtg_db_param(L, lua_gettop(L), j + 1);
    }
    vp[i] = values[i];
  }
  qtg_db_req *q = qtg_db_req_new(L, s);
  q->ahead = ahead;
  int rc = qtg_pg_query_batch(s->conn, n, sqls, nparams, vp, commit, ahead, qtg_db_batch_done, q);
  if (rc == 1) {
    free(q);
    lua_pushboolean(L, 0);
    return 1;
  }
  return qtg_db_wait(L, s, q, rc, "cannot send the batch");
}

static int qtg_db_raw_batch(lua_State *L) { return qtg_db_batch(L, 0, 0); }
static int qtg_db_raw_batch_commit(lua_State *L) { return qtg_db_batch(L, 1, 0); }
static int qtg_db_raw_batch_commit_ahead(lua_State *L) { return qtg_db_batch(L, 1, 1); }

static int qtg_db_raw_query(lua_State *L) { return qtg_db_send(L, QTG_DB_QUERY); }
static int qtg_db_raw_exec(lua_State *L) { return qtg_db_send(L, QTG_DB_EXEC); }
static int qtg_db_raw_pipeline_block(lua_State *L) { return qtg_db_send(L, QTG_DB_PIPE_BLOCK); }
static int qtg_db_raw_pipeline_commit(lua_State *L) { return qtg_db_send(L, QTG_DB_PIPE_COMMIT); }
static int qtg_db_raw_pipeline_rollback(lua_State *L) { return qtg_db_send(L, QTG_DB_PIPE_ROLLBACK); }

/* Opens a pipeline transaction: nothing is sent (qtg_pg.h). */
static int qtg_db_raw_pipeline_begin(lua_State *L) {
  qtg_db_session *s = qtg_db_check_session(L);
  if (qtg_pg_pipeline_begin(s->conn) != 0) {
    lua_pushnil(L);
    qtg_push_error(L, "usage", "qtg.db: a pipeline transaction needs a session with no transaction open");
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* "implicit" (open, no BEGIN sent), "block" (a BEGIN was sent) or nil. */
static int qtg_db_pipeline(lua_State *L) {
  qtg_db_session *s = luaL_checkudata(L, 1, QTG_DB_SESSION);
  int p = s->conn ? qtg_pg_pipelined(s->conn) : 0;
  if (p == 0) return 0;
  lua_pushstring(L, p == 1 ? "implicit" : "block");
  return 1;
}

/* ---- sessions -------------------------------------------------------------- */

/* Held sessions are listed on the host so a console that closes can give
 * back what its commands' tasks still hold (qtg_db_give_back), whatever
 * else still reaches their Lua values. */
static void qtg_db_held(qtg_db_session *s) {
  s->prev = NULL;
  s->next = s->h->db_sessions;
  if (s->next) s->next->prev = s;
  s->h->db_sessions = s;
}

static void qtg_db_unheld(qtg_db_session *s) {
  if (s->prev) s->prev->next = s->next;
  else if (s->h->db_sessions == s) s->h->db_sessions = s->next;
  if (s->next) s->next->prev = s->prev;
  s->prev = s->next = NULL;
}

static void qtg_db_push_session(lua_State *L, qtg_host *h, qtg_task *t, qtg_pg_conn *conn) {
  qtg_db_session *s = lua_newuserdata(L, sizeof *s);
  s->conn = conn;
  s->h = h;
  s->owner = t ? qtg_task_owner(t) : 0;
  qtg_db_held(s);
  luaL_getmetatable(L, QTG_DB_SESSION);
  lua_setmetatable(L, -2);
}

static void qtg_db_acquired(qtg_pg_conn *conn, const char *err, void *data) {
  qtg_db_req *q = data;
  qtg_host *h = q->head.h;
  qtg_task *t = q->head.task;
  qtg_db_req_free(q);
  qtg_task_set_cancel(t, NULL, NULL);
  lua_State *co = qtg_task_thread(t);
  if (!conn) {
    lua_pushnil(co);
    qtg_db_push_conn_error(co, err ? err : "cannot connect");
  } else {
    qtg_db_push_session(co, h, t, conn);
    lua_pushnil(co);
  }
  qtg_task_resume(t, 2);
}

static void qtg_db_acquire_cancel(qtg_task *t, void *arg) {
  qtg_db_req *q = arg;
  qtg_pg_acquire_cancel(q->head.h->pool, q);
  qtg_db_req_free(q);
  lua_State *co = qtg_task_thread(t);
  lua_pushnil(co);
  qtg_push_error(co, "interrupted", "waiting for a database session interrupted");
  qtg_task_resume(t, 2);
}

/* The API's share of the pool (MG_API_DB_SESSIONS; 0: half, rounded up). */
static int qtg_db_api_sessions(qtg_host *h) {
  int size = (int)qtg_settings_num(h->settings, QTG_S_DB_POOL_SIZE);
  int share = (int)qtg_settings_num(h->settings, QTG_S_API_DB_SESSIONS);
  return share > 0 ? share : (size + 1) / 2;
}

/* MG_DB_ACQUIRE_TIMEOUT_SECONDS passed with the task still waiting: every
 * session is held (tasks that each hold one and wait for another would
 * otherwise wait for good) or none could be opened. */
static void qtg_db_acquire_expired(uv_timer_t *timer) {
  qtg_db_req *q = timer->data;
  qtg_host *h = q->head.h;
  qtg_task *t = q->head.task;
  qtg_pg_acquire_cancel(h->pool, q);
  qtg_task_set_cancel(t, NULL, NULL);
  char msg[240];
  int share, share_in_use, share_waiting;
  qtg_pg_pool_share_stats(h->pool, &share, &share_in_use, &share_waiting);
  if (q->in_share)
    snprintf(msg, sizeof msg,
             "no database session within %g s (MG_DB_ACQUIRE_TIMEOUT_SECONDS; "
             "the API's share of the pool, %d (MG_API_DB_SESSIONS), all in use, or none could be opened)",
             qtg_settings_num(h->settings, QTG_S_DB_ACQUIRE_TIMEOUT_SECONDS), share);
  else
    snprintf(msg, sizeof msg,
             "no database session within %g s (MG_DB_ACQUIRE_TIMEOUT_SECONDS; "
             "a pool of %g: all in use, or none could be opened)",
             qtg_settings_num(h->settings, QTG_S_DB_ACQUIRE_TIMEOUT_SECONDS),
             qtg_settings_num(h->settings, QTG_S_DB_POOL_SIZE));
  qtg_db_req_free(q);
  lua_State *co = qtg_task_thread(t);
  lua_pushnil(co);
  qtg_push_error(co, "timeout", "%s", msg);
  qtg_task_resume(t, 2);
}

/* Arm q's deadline; 0 when none is set or it is armed. */
static int qtg_db_acquire_deadline(qtg_host *h, qtg_db_req *q) {
  double seconds = qtg_settings_num(h->settings, QTG_S_DB_ACQUIRE_TIMEOUT_SECONDS);
  if (!(seconds > 0)) return 0;
  q->deadline = malloc(sizeof *q->deadline);
  if (!q->deadline) return -1;
  if (uv_timer_init(h->loop, q->deadline) != 0) {
    free(q->deadline);
    q->deadline = NULL;
    return -1;
  }
  q->deadline->data = q;
  uv_update_time(h->loop);   /* the loop's time is as old as this task's run */
  return uv_timer_start(q->deadline, qtg_db_acquire_expired, (uint64_t)(seconds * 1000.0 + 0.5), 0) == 0 ? 0 : -1;
}

static int qtg_db_raw_acquire(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  qtg_task *t = qtg_task_check(L);
  qtg_db_req *q = calloc(1, sizeof *q);
  if (!q) return luaL_error(L, "qtg.db: out of memory");
  q->head.drop = qtg_db_req_drop;
  q->head.h = h;
  q->head.task = t;
  qtg_pg_conn *conn = NULL;
  q->in_share = lua_toboolean(L, 1);
  int rc = qtg_pg_acquire(h->pool, q->in_share, qtg_db_acquired, q, &conn);
  if (rc == 1) {
    free(q);
    qtg_db_push_session(L, h, t, conn);
    return 1;
  }
  if (rc < 0) {
    free(q);
    lua_pushnil(L);
    qtg_db_push_conn_error(L, qtg_pg_pool_last_error(h->pool));
    return 2;
  }
  if (qtg_db_acquire_deadline(h, q) != 0) {
    qtg_pg_acquire_cancel(h->pool, q);
    qtg_db_req_free(q);
    return luaL_error(L, "qtg.db: cannot start the acquire's deadline");
  }
  qtg_task_set_cancel(t, qtg_db_acquire_cancel, q);
  return qtg_task_yield(L);
}

/* A session let go of while a task waits on its statement (only another
 * task can release it then): that task's wait is interrupted first, so it
 * resumes with an "interrupted" error instead of waiting for an answer the
 * discarded connection never gives.  The interrupted task runs at once and
 * may release the session itself, hence the second look at s->conn. */
static void qtg_db_let_go(qtg_db_session *s, void (*how)(qtg_pg_conn *)) {
  if (s->conn && qtg_pg_busy(s->conn)) {
    qtg_db_pending *w = qtg_pg_waiting_data(s->conn);
    if (w && w->task) qtg_task_interrupt(w->task);
  }
  if (s->conn && s->h->pool) how(s->conn);
  if (s->conn) qtg_db_unheld(s);
  s->conn = NULL;
}

int qtg_db_give_back(qtg_host *h, int (*owned)(uint64_t owner, void *arg), void *arg) {
  int n = 0;
  /* from the head again after each: a release may run an interrupted task,
   * which may release (unlist) other sessions itself */
  for (;;) {
    qtg_db_session *s = h->db_sessions;
    while (s && !owned(s->owner, arg)) s = s->next;
    if (!s) return n;
    qtg_db_let_go(s, qtg_pg_release);
    n++;
  }
}

static int qtg_db_release(lua_State *L) {
  qtg_db_let_go(luaL_checkudata(L, 1, QTG_DB_SESSION), qtg_pg_release);
  return 0;
}

static int qtg_db_discard(lua_State *L) {
  qtg_db_let_go(luaL_checkudata(L, 1, QTG_DB_SESSION), qtg_pg_discard);
  return 0;
}

/* A session collected: nothing waits on it (a waiting task holds it) but at
 * host close, where no task may run again; there its connection is left to
 * the pool's end (after lua_close) rather than handed to a waiting acquire.
 * Otherwise it goes back on the loop's next turn: a finalizer runs inside
 * the collector, where a waiting acquire's task must not be resumed. */
static int qtg_db_session_gc(lua_State *L) {
  qtg_db_session *s = luaL_checkudata(L, 1, QTG_DB_SESSION);
  if (s->conn && s->h->pool && !s->h->closing) qtg_pg_release_later(s->conn);
  if (s->conn) qtg_db_unheld(s);
  s->conn = NULL;
  return 0;
}

static int qtg_db_in_transaction(lua_State *L) {
  qtg_db_session *s = luaL_checkudata(L, 1, QTG_DB_SESSION);
  lua_pushboolean(L, s->conn && qtg_pg_txn_status(s->conn) != PQTRANS_IDLE &&
                         qtg_pg_txn_status(s->conn) != PQTRANS_UNKNOWN);
  return 1;
}

static int qtg_db_pid(lua_State *L) {
  qtg_db_session *s = luaL_checkudata(L, 1, QTG_DB_SESSION);
  if (!s->conn) return 0;
  lua_pushinteger(L, qtg_pg_backend_pid(s->conn));
  return 1;
}

static int qtg_db_session_tostring(lua_State *L) {
  qtg_db_session *s = luaL_checkudata(L, 1, QTG_DB_SESSION);
  if (s->conn) lua_pushfstring(L, "qtg.db.session(pid %d)", qtg_pg_backend_pid(s->conn));
  else lua_pushliteral(L, "qtg.db.session(released)");
  return 1;
}

/* t[name] = n, t on the stack's top */
static void qtg_db_set_number(lua_State *L, const char *name, lua_Number n) {
  lua_pushnumber(L, n);
  lua_setfield(L, -2, name);
}

static int qtg_db_stats(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  int size, open, in_use, waiting;
  qtg_pg_pool_stats(h->pool, &size, &open, &in_use, &waiting);
  lua_createtable(L, 0, 10);
  qtg_db_set_number(L, "size", size);
  qtg_db_set_number(L, "open", open);
  qtg_db_set_number(L, "in_use", in_use);
  qtg_db_set_number(L, "waiting", waiting);
  /* the API's share of it (MG_API_DB_SESSIONS) */
  qtg_pg_pool_share_stats(h->pool, &size, &in_use, &waiting);
  qtg_db_set_number(L, "api_share", size);
  qtg_db_set_number(L, "api_in_use", in_use);
  qtg_db_set_number(L, "api_waiting", waiting);
  /* the slow-statement watch (MG_DB_SLOW_WARN_SECONDS) */
  int slow;
  uint64_t slow_total, oldest_ms;
  qtg_pg_pool_slow_stats(h->pool, &slow, &slow_total, &oldest_ms);
  qtg_db_set_number(L, "slow", slow);
  qtg_db_set_number(L, "slow_total", (lua_Number)slow_total);
  qtg_db_set_number(L, "oldest_seconds", (lua_Number)oldest_ms / 1000);
  return 1;
}

/* ---- LISTEN ------------------------------------------------------------------ */

static void qtg_db_notified(const char *channel, const char *payload, void *data) {
  qtg_host *h = data;
  lua_State *L = h->L;
  if (!L || h->listen_ref == LUA_NOREF) return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->listen_ref);
  lua_getfield(L, -1, channel);
  lua_remove(L, -2);
  if (!lua_isfunction(L, -1)) {
    lua_pop(L, 1);
    return;
  }
  if (payload) lua_pushstring(L, payload);
  else lua_pushnil(L);
  lua_pushstring(L, channel);
  char name[80];
  snprintf(name, sizeof name, "notify:%s", channel);
  qtg_task_spawn(h, name, 2, 0, NULL, NULL);
}

/* An after-commit notification of this process's own transaction
 * (qtg_pg_pool_on_commit): to this process's handler of the channel when it
 * has one, with a third argument, true (raised here: the handler sends on
 * what other processes need); else sent on as a NOTIFY (the prelude's
 * db.notify) for every listener. */
static const char qtg_db_notify_key = 0;

static void qtg_db_committed(const char *channel, const char *payload, void *data) {
  qtg_host *h = data;
  lua_State *L = h->L;
  if (!L) return;
  int handled = 0;
  if (h->listen_ref != LUA_NOREF) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, h->listen_ref);
    lua_getfield(L, -1, channel);
    lua_remove(L, -2);
    handled = lua_isfunction(L, -1);
    if (!handled) lua_pop(L, 1);
  }
  char name[80];
  if (handled) {
    lua_pushstring(L, payload);
    lua_pushstring(L, channel);
    lua_pushboolean(L, 1);
    snprintf(name, sizeof name, "notify:%s", channel);
    qtg_task_spawn(h, name, 3, 0, NULL, NULL);
    return;
  }
  lua_pushlightuserdata(L, (void *)&qtg_db_notify_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  if (!lua_isfunction(L, -1)) {
    lua_pop(L, 1);
    return;
  }
  lua_pushstring(L, channel);
  lua_pushstring(L, payload);
  snprintf(name, sizeof name, "notify-on:%s", channel);
  qtg_task_spawn(h, name, 2, 0, NULL, NULL);
}

/* qtg.db.after_commit(on): this process's sessions hand their wake-ups
 * to it after their commits (on) or NOTIFY in the transaction (off, the
 * default: what a process with no worker to wake wants). */
static int qtg_db_after_commit(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  if (!h->pool) return luaL_error(L, "qtg.db.after_commit: no pool");
  qtg_pg_pool_on_commit(h->pool, lua_toboolean(L, 1) ? qtg_db_committed : NULL, h);
  return 0;
}

static int qtg_db_listen(lua_State *L) {
  const char *channel = luaL_checkstring(L, 1);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  qtg_host *h = qtg_host_from_lua(L);
  if (h->listen_ref == LUA_NOREF) {
    lua_newtable(L);
    h->listen_ref = qtg_ref(L);
  }
  if (!h->listener &&
      qtg_pg_listener_new(h->loop, qtg_settings_str(h->settings, QTG_S_DATABASE_URL),
                          (int)qtg_settings_num(h->settings, QTG_S_DB_TCP_TIMEOUT_SECONDS), qtg_db_notified, h,
                          &h->listener) != 0)
    return luaL_error(L, "qtg.db.listen: cannot start the listener");
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->listen_ref);
  lua_pushvalue(L, 2);
  lua_setfield(L, -2, channel);
  lua_pop(L, 1);
  if (qtg_pg_listener_add(h->listener, channel) != 0) return luaL_error(L, "qtg.db.listen: out of memory");
  return 0;
}

static int qtg_db_unlisten(lua_State *L) {
  const char *channel = luaL_checkstring(L, 1);
  qtg_host *h = qtg_host_from_lua(L);
  if (h->listen_ref != LUA_NOREF) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, h->listen_ref);
    lua_pushnil(L);
    lua_setfield(L, -2, channel);
    lua_pop(L, 1);
  }
  if (h->listener) qtg_pg_listener_remove(h->listener, channel);
  return 0;
}

/* ---- subsystem --------------------------------------------------------------- */

/* A setting in seconds as PostgreSQL's milliseconds: 0 stays "no bound",
 * and a positive value under a millisecond is one, never 0. */
static int qtg_db_setting_ms(qtg_host *h, int id) {
  double ms = ceil(qtg_settings_num(h->settings, id) * 1000);
  return ms > 0 ? (int)ms : 0;
}

/* qtg.db.slow_watch_off(): no slow-statement lines from this process (a
 * command-line tool whose one statement may rightly run long). */
static int qtg_db_slow_watch_off(lua_State *L) {
  qtg_host *h = qtg_host_from_lua(L);
  if (h->pool) qtg_pg_pool_slow_off(h->pool);
  return 0;
}

/* The task waiting on a request the pool holds, for its slow-statement
 * lines: every request lua_db.c and lua_db_claim.c hand it starts with a
 * qtg_db_pending. */
static const char *qtg_db_describe(void *data) {
  qtg_db_pending *w = data;
  return w->task ? qtg_task_name(w->task) : NULL;
}

/* The pool found its server read-only (qtg_pg_pool_on_read_only): the
 * wake-up listener, on the same server, moves with it. */
static void qtg_db_read_only(void *data) {
  qtg_host *h = data;
  if (h->listener) qtg_pg_listener_reconnect(h->listener);
}

int qtg_pg_open(qtg_host *h, char *err, size_t errlen) {
  const char *url = qtg_settings_str(h->settings, QTG_S_DATABASE_URL);
  h->listen_ref = LUA_NOREF;
  if (!url[0]) {
    snprintf(err, errlen, "MG_DATABASE_URL is empty (qtgd resolves the embedded default before start-up)");
    return -1;
  }
  qtg_pg_pool_config cfg = {
    .size = (int)qtg_settings_num(h->settings, QTG_S_DB_POOL_SIZE),
    .tcp_timeout = (int)qtg_settings_num(h->settings, QTG_S_DB_TCP_TIMEOUT_SECONDS),
    .statement_timeout_ms = qtg_db_setting_ms(h, QTG_S_DB_STATEMENT_TIMEOUT_SECONDS),
    .lock_timeout_ms = qtg_db_setting_ms(h, QTG_S_DB_LOCK_TIMEOUT_SECONDS),
    .slow_warn_ms = qtg_db_setting_ms(h, QTG_S_DB_SLOW_WARN_SECONDS),
    .describe = qtg_db_describe,
    .share_size = qtg_db_api_sessions(h),
  };
  if (qtg_pg_pool_new(h->loop, url, &cfg, qtg_db_drop, &h->pool) != 0) {
    snprintf(err, errlen, "out of memory creating the PostgreSQL pool");
    return -1;
  }
  qtg_pg_pool_on_read_only(h->pool, qtg_db_read_only, h);
  return 0;
}

void qtg_pg_close(qtg_host *h) {
  qtg_pg_listener_free(h->listener);
  h->listener = NULL;
  qtg_pg_pool_free(h->pool);
  h->pool = NULL;
}

int luaopen_qtg_db(lua_State *L) {
  static const luaL_Reg session_methods[] = {
    {"raw_query", qtg_db_raw_query}, {"raw_exec", qtg_db_raw_exec}, {"raw_batch", qtg_db_raw_batch},
    {"raw_batch_commit", qtg_db_raw_batch_commit}, {"raw_batch_commit_ahead", qtg_db_raw_batch_commit_ahead},
    {"release", qtg_db_release},     {"discard", qtg_db_discard},
    {"in_transaction", qtg_db_in_transaction},
    {"pid", qtg_db_pid},             {"pipeline", qtg_db_pipeline},
    {"raw_pipeline_begin", qtg_db_raw_pipeline_begin}, {"raw_pipeline_block", qtg_db_raw_pipeline_block},
    {"raw_pipeline_commit", qtg_db_raw_pipeline_commit},
    {"raw_pipeline_rollback", qtg_db_raw_pipeline_rollback}, {NULL, NULL},
  };
  static const luaL_Reg db_funcs[] = {
    {"raw_acquire", qtg_db_raw_acquire}, {"stats", qtg_db_stats}, {"listen", qtg_db_listen},
    {"unlisten", qtg_db_unlisten},       {"after_commit", qtg_db_after_commit},
    {"slow_watch_off", qtg_db_slow_watch_off}, {NULL, NULL},
  };
  /* cjson for json/jsonb values and table parameters */
  lua_getglobal(L, "require");
  lua_pushliteral(L, "cjson");
  if (lua_pcall(L, 1, 1, 0) != 0) return luaL_error(L, "qtg.db needs lua-cjson: %s", lua_tostring(L, -1));
  lua_pushlightuserdata(L, (void *)&qtg_db_cjson_key);
  lua_insert(L, -2);
  lua_rawset(L, LUA_REGISTRYINDEX);

  lua_newtable(L); /* db */
  luaL_register(L, NULL, db_funcs);
  lua_pushlightuserdata(L, NULL);
  lua_setfield(L, -2, "NULL");
  qtg_db_claim_register(L);
  lua_setfield(L, -2, "claim");
  luaL_newmetatable(L, QTG_DB_SESSION);
  lua_pushcfunction(L, qtg_db_session_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, qtg_db_session_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_newtable(L); /* methods */
  luaL_register(L, NULL, session_methods);
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, "__index");
  /* stack: db, mt, methods */
  if (qtg_prelude_load(L, QTG_PRELUDE_db) != 0)
    return lua_error(L);
  lua_pushvalue(L, -4);
  lua_pushvalue(L, -3);
  lua_call(L, 2, 0);
  lua_pop(L, 2);
  /* the prelude's db.notify sends on after-commit notifications no handler here takes */
  lua_pushlightuserdata(L, (void *)&qtg_db_notify_key);
  lua_getfield(L, -2, "notify");
  lua_rawset(L, LUA_REGISTRYINDEX);
  return 1;
}
