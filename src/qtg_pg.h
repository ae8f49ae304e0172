/* qtg_pg.h -- asynchronous PostgreSQL on the libuv loop: a pool of libpq
 * connections driven without blocking, and a listener connection for
 * LISTEN/NOTIFY.
 *
 * Why in C: libpq's non-blocking API needs socket readiness, which only the
 * loop owner can give.  Lua sees sessions (lua_db.c) built on this.
 *
 * Contract (libuv style): a function that returns an error never calls its
 * callback; one that returns 0 calls it exactly once, never synchronously. */
#ifndef QTG_PG_H
#define QTG_PG_H

#include <libpq-fe.h>
#include <uv.h>

typedef struct qtg_pg_pool qtg_pg_pool;
typedef struct qtg_pg_conn qtg_pg_conn;
typedef struct qtg_pg_listener qtg_pg_listener;

/* conn is NULL when err is set (the server cannot be reached). */
typedef void (*qtg_pg_acquire_cb)(qtg_pg_conn *conn, const char *err, void *data);
/* res is the last result of the command (cleared by the pool after the
 * callback returns); on a lost connection res is NULL and err is set.  A SQL
 * error comes as a res with PGRES_FATAL_ERROR status. */
typedef void (*qtg_pg_result_cb)(qtg_pg_conn *conn, PGresult *res, const char *err, void *data);
/* payload NULL: the listener (re)connected and LISTENs again: catch up. */
typedef void (*qtg_pg_notify_cb)(const char *channel, const char *payload, void *data);

/* Every session of a pool runs with UTC and ISO dates, generic plans,
 * cfg's statement_timeout and lock_timeout (so no statement and no lock
 * wait holds a session for good) and a check of the client's connection
 * every second while a statement runs (qtg_pg_forget relies on it).
 *
 * drop (may be NULL) frees the data of work whose callback will never be
 * called: a command in flight on a connection that is destroyed (released
 * while busy, e.g. its session collected at host close) and everything in
 * flight or queued when the pool is freed.  The pool keeps it so that no
 * path that discards a connection can leak its caller's data. */
typedef struct {
  int size;                 /* connections at most (MG_DB_POOL_SIZE) */
  int tcp_timeout;          /* seconds (MG_DB_TCP_TIMEOUT_SECONDS, qtg_pg_tcp_params) */
  int statement_timeout_ms; /* each session's statement_timeout; 0: none */
  int lock_timeout_ms;      /* each session's lock_timeout; 0: none */
  int slow_warn_ms;         /* the slow-statement watch (below); 0: off */
  int share_size;           /* connections the share holds at most (qtg_pg_acquire's
                             * in_share); 0, or size or more: size - 1 (1 for a
                             * pool of 1) */
  /* The name of the task waiting on a command's data (NULL: unknown), for
   * the watch's lines; may be NULL. */
  const char *(*describe)(void *data);
} qtg_pg_pool_config;

/* The slow-statement watch (MG_DB_SLOW_WARN_SECONDS): a command still in
 * flight slow_warn_ms after it was sent gets a warn line (its task, the
 * first bytes of its SQL and never its parameters, the time waited, the
 * server's host and port, its backend pid), again each time its wait has
 * doubled (at most 10 minutes apart), and a line when it ends ("finished
 * after N s").  Nothing bounds a commit waiting for a synchronous standby
 * that is gone, so this is where such a stall shows.  One periodic timer
 * per pool walks its connections; a command only stores its send time and
 * its SQL's first bytes.  *slow: commands in flight that were warned
 * about; *total: commands warned about since the pool started (each
 * counted once); *oldest_ms: how long the oldest command in flight has
 * run (0: none, or the watch is off). */
void qtg_pg_pool_slow_stats(const qtg_pg_pool *pool, int *slow, uint64_t *total, uint64_t *oldest_ms);
/* The watch off for good: a command-line tool whose statements may rightly
 * run long (a migration, the audit trail's walk). */
void qtg_pg_pool_slow_off(qtg_pg_pool *pool);

int qtg_pg_pool_new(uv_loop_t *loop, const char *conninfo, const qtg_pg_pool_config *cfg,
                    void (*drop)(void *data), qtg_pg_pool **out);
/* Notifications a pool session's transaction raised for after its commit
 * (a NOTICE "qtg_after_commit <channel> <payload>", sql/0150): cb gets each
 * once the transaction has committed, before its caller gets the commit's
 * result; none of a transaction that fails or rolls back.  The sessions
 * opened after it ask for these (a connection option); without it (cb
 * NULL: off again) they NOTIFY in the transaction as any client does.
 * Connections opened the other way are closed when next released or found
 * idle. */
void qtg_pg_pool_on_commit(qtg_pg_pool *pool, qtg_pg_notify_cb cb, void *data);
/* A statement of a pool session that fails with SQLSTATE 25006 (the
 * server is read-only: a fenced old primary, a standby) closes the pool's
 * connections (idle ones at once, the others at their release; new ones
 * are opened through the conninfo, whose target_session_attrs=read-write
 * passes such a server over) and calls cb(data) once for it. */
void qtg_pg_pool_on_read_only(qtg_pg_pool *pool, void (*cb)(void *data), void *data);
/* Parse such a NOTICE's message: 0 and the channel's length (it starts
 * after the prefix) and the payload (the rest, after one space); -1 when
 * msg is not one (no prefix, an empty channel, no space after it). */
int qtg_pg_after_commit_parse(const char *msg, size_t *channel_len, const char **payload);
/* Frees every connection; callbacks of in-flight work and of queued
 * acquires are NOT called: the pool's drop is called with each one's data. */
void qtg_pg_pool_free(qtg_pg_pool *pool);

/* Returns 1 and sets *out when a connection is free now (no callback);
 * 0 when queued (cb called later, in FIFO order of waiters); -1 on error.
 * in_share: the acquire is the share's (cfg.share_size), which holds at
 * most that many connections at once: beyond them it waits, and the
 * waiters behind it that are not the share's are served first, so work
 * outside the share (the workers) never waits behind more than share_size
 * of the share's sessions however many of its acquires queue (the API's
 * requests: docs/api.md). */
int qtg_pg_acquire(qtg_pg_pool *pool, int in_share, qtg_pg_acquire_cb cb, void *data, qtg_pg_conn **out);
/* Forget a queued acquire (its callback will not be called). */
void qtg_pg_acquire_cancel(qtg_pg_pool *pool, void *data);
/* Give a connection back; an open transaction is rolled back first and a
 * broken or busy connection is discarded. */
void qtg_pg_release(qtg_pg_conn *conn);
/* Give a connection back to be closed, not reused: for code that may have
 * changed its session's state (settings, advisory locks, prepared
 * statements under the pool's names), such as the console's SQL. */
void qtg_pg_discard(qtg_pg_conn *conn);
/* qtg_pg_release on the loop's next turn: for where no task may run (a
 * session's finalizer), since a release hands the connection to a waiting
 * acquire, whose task runs at once. */
void qtg_pg_release_later(qtg_pg_conn *conn);

/* Extended protocol; prepare=1 caches a prepared statement per connection
 * keyed by the SQL text.  Values are text (NULL = SQL NULL). */
int qtg_pg_query(qtg_pg_conn *conn, const char *sql, int nparams, const char *const *values,
                 int prepare, qtg_pg_result_cb cb, void *data);
/* A batch: n (1..QTG_PG_BATCH_MAX) prepared statements of an open pipeline transaction
 * sent in one flush, their results read together (one round trip for
 * all).  The callback gets the n results in order (a command after a
 * failed one answers PGRES_PIPELINE_ABORTED), or err.  commit=1 ends the
 * transaction with the batch: the Sync goes in the same flush, so the
 * statements and the commit are one round trip; a statement that fails
 * rolls the whole transaction back, and so does a commit that fails (its
 * error is then the last result).  Either way the pipeline transaction is
 * over when the callback runs.  Returns 1, sending nothing, when a
 * statement is not prepared on this connection yet (the caller runs them
 * one by one with qtg_pg_query, which prepares them, and then ends the
 * transaction), or, with commit=1, when the transaction is a block (its
 * COMMIT is a statement: the caller ends it with qtg_pg_pipeline_end);
 * -1 when not in a pipeline transaction, busy or failed, or the send
 * failed (then the connection is broken).
 * ahead (0..n-1, with commit=1 only): the last `ahead` statements go after
 * the Sync in the same flush, as the first statements of a new pipeline
 * transaction, so the server runs them once the batch has committed (the
 * next transaction's first round trip rides with this one's commit).  The
 * callback then gets all n results: the first n-ahead as a committing
 * batch's (a failed commit's error the last of them), the others the new
 * transaction's, which is open when the callback runs whether the commit
 * succeeded or not. */
#define QTG_PG_BATCH_MAX 4
typedef void (*qtg_pg_batch_cb)(qtg_pg_conn *conn, PGresult **res, int n, const char *err, void *data);
int qtg_pg_query_batch(qtg_pg_conn *conn, int n, const char *const *sqls, const int *nparams,
                       const char *const *const *values, int commit, int ahead, qtg_pg_batch_cb cb,
                       void *data);
/* Simple protocol: several statements, no parameters. */
int qtg_pg_exec(qtg_pg_conn *conn, const char *sql, qtg_pg_result_cb cb, void *data);
/* Pipeline transactions: the statements of one transaction sent in libpq's
 * pipeline mode with no Sync until its end, so the server runs them in one
 * transaction that needs no BEGIN and no COMMIT statement (the Sync commits
 * it): two statements and two round trips fewer per transaction.  Each
 * statement still waits for its own result (a Flush follows it).
 * begin: no round trip; -1 when the connection is busy or in a transaction.
 * block: sends a BEGIN, making it a transaction block (SAVEPOINT needs one);
 * then the end sends COMMIT or ROLLBACK before the Sync.
 * end: commit=1 commits (a failed one is rolled back by the server, and
 * the caller must treat it as failed: qtg_pg_pipeline_failed), commit=0
 * rolls back; the callback gets the first error or the Sync's result
 * (PGRES_PIPELINE_SYNC) or the COMMIT's/ROLLBACK's.  A statement that fails
 * inside marks the pipeline failed: the server skips what follows until the
 * Sync, so qtg_pg_query and qtg_pg_exec refuse (-1) until its end (the
 * caller reports "current transaction is aborted"). */
int qtg_pg_pipeline_begin(qtg_pg_conn *conn);
int qtg_pg_pipeline_block(qtg_pg_conn *conn, qtg_pg_result_cb cb, void *data);
int qtg_pg_pipeline_end(qtg_pg_conn *conn, int commit, qtg_pg_result_cb cb, void *data);
int qtg_pg_pipeline_failed(const qtg_pg_conn *conn);
/* 0 no pipeline transaction, 1 open without BEGIN, 2 turned into a block */
int qtg_pg_pipelined(const qtg_pg_conn *conn);
/* Forget the callback of an in-flight command (an interrupted task): the
 * connection is shut down at once, so its server process ends the
 * statement and the transaction (client_connection_check_interval) and
 * lets go of their locks, and it is discarded when released. */
void qtg_pg_forget(qtg_pg_conn *conn);
/* The data given with the command in flight (NULL: none, or forgotten). */
void *qtg_pg_waiting_data(const qtg_pg_conn *conn);

int qtg_pg_busy(const qtg_pg_conn *conn);
int qtg_pg_broken(const qtg_pg_conn *conn);
PGTransactionStatusType qtg_pg_txn_status(const qtg_pg_conn *conn);
int qtg_pg_backend_pid(const qtg_pg_conn *conn);
void qtg_pg_pool_stats(const qtg_pg_pool *pool, int *size, int *open, int *in_use, int *waiting);
/* The share's bound (cfg.share_size), its connections in use, its waiters. */
void qtg_pg_pool_share_stats(const qtg_pg_pool *pool, int *size, int *in_use, int *waiting);
/* Why the pool's last connection attempt failed ("" when none has). */
const char *qtg_pg_pool_last_error(const qtg_pg_pool *pool);

/* LISTEN/NOTIFY on a dedicated connection kept out of the pool, re-opened
 * (with its channels) after it drops. */
int qtg_pg_listener_new(uv_loop_t *loop, const char *conninfo, int tcp_timeout, qtg_pg_notify_cb cb,
                        void *data, qtg_pg_listener **out);

/* The libpq keywords that bound a TCP connection to a peer that stops
 * answering without a reset (a host down, a network partition): with
 * tcp_timeout seconds (MG_DB_TCP_TIMEOUT_SECONDS) > 0, keepalives from
 * tcp_timeout / 3 of silence and tcp_user_timeout = tcp_timeout, so a
 * command in flight, an idle connection and a connect (its SYN) each fail
 * after about tcp_timeout instead of the kernel's retransmission limits
 * (up to 15 minutes).  Written into keys/vals from index 0, with their
 * values in t; returns how many (0 when tcp_timeout <= 0).  Put them before
 * "dbname" with expand_dbname set: the URL's own values then win.  Unix
 * socket connections ignore them. */
enum { QTG_PG_TCP_PARAMS = 5 };
typedef struct {
  char idle[12], interval[12], user_timeout[16];
} qtg_pg_tcp_values;
int qtg_pg_tcp_params(int tcp_timeout, qtg_pg_tcp_values *t, const char **keys, const char **vals);
int qtg_pg_listener_add(qtg_pg_listener *l, const char *channel);
int qtg_pg_listener_remove(qtg_pg_listener *l, const char *channel);
/* Drop the listener's connection and open another in 1 s (its channels
 * listened again, each told of a catch-up: as after a lost connection). */
void qtg_pg_listener_reconnect(qtg_pg_listener *l);
void qtg_pg_listener_free(qtg_pg_listener *l);

#endif
