/* qtg_pg.c -- libpq connections driven by libuv (see qtg_pg.h).
 *
 * One struct qtg_pg_conn per server connection, in one of four states:
 * CONNECTING (PQconnectPoll steps), IDLE (watching for the server closing
 * on us, or NOTIFYs on the listener), BUSY (a command in flight: flush, then
 * consume results), BROKEN (waiting to be released and freed).
 * The pool hands IDLE connections to waiters in FIFO order and opens new
 * ones lazily up to its size.
 *
 * The connecting steps (PQconnectStartParams and each PQconnectPoll) run in
 * libuv's thread pool, one at a time per connection: libpq looks a host
 * name up with a blocking getaddrinfo inside them (at the start, and at
 * each next host of a multi-host URL), which on the loop would stop the
 * whole daemon for as long as a DNS server that does not answer takes.
 * A connection freed while a step runs is left to the step's completion. */
#include "qtg_pg.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "qtg_log.h"

typedef enum { QTG_PG_CONNECTING, QTG_PG_IDLE, QTG_PG_BUSY, QTG_PG_BROKEN } qtg_pg_state;
typedef enum { QTG_PG_STEP_RUN, QTG_PG_STEP_PREPARE, QTG_PG_STEP_DEALLOCATE, QTG_PG_STEP_SYNC } qtg_pg_step;

/* A pipeline transaction (qtg_pg_pipeline_begin): libpq's pipeline mode
 * with no Sync until its end, so the server runs its statements in one
 * transaction without a BEGIN; a BEGIN sent inside it (qtg_pg_pipeline_block,
 * for a SAVEPOINT) makes it a transaction block, which then ends with a
 * COMMIT or ROLLBACK before the Sync. */
typedef enum { QTG_PG_PIPE_OFF, QTG_PG_PIPE_IMPLICIT, QTG_PG_PIPE_BLOCK } qtg_pg_pipe;

/* Prepared statements per connection: a bounded cache, least recently used
 * out first (DEALLOCATEd on the server, one round trip more on that query
 * only).  Unbounded, a policy that builds SQL text from data left a backend
 * holding every statement it ever saw (20,000 of them: 131 MB). */
#define QTG_PG_MAX_STMTS 256

/* The first bytes of a command's SQL kept for the slow-statement watch:
 * copied when it is sent (its text may be gone by the time it is slow),
 * shown up to QTG_PG_SQL_SHOWN bytes with its white space folded. */
#define QTG_PG_SQL_HEAD 128
#define QTG_PG_SQL_SHOWN 100
/* A slow command's warnings come again each time its wait has doubled,
 * and at most this long apart. */
#define QTG_PG_SLOW_REPEAT_MAX_MS (10 * 60 * 1000)

typedef struct {
  uint32_t hash;
  char *sql;
  char name[24];
  uint64_t used;             /* c->stmt_clock when last run */
} qtg_pg_stmt;

/* A notification its transaction asked to be sent after it commits
 * (QTG_PG_AFTER_COMMIT below). */
typedef struct qtg_pg_after_commit {
  char *channel, *payload;
  struct qtg_pg_after_commit *next;
} qtg_pg_after_commit;

typedef struct qtg_pg_waiter {
  qtg_pg_acquire_cb cb;
  void *data;
  int in_share;              /* the share's acquire (qtg_pg_acquire) */
  struct qtg_pg_waiter *next;
} qtg_pg_waiter;

/* What a connecting step in the thread pool reads and writes: the
 * keywords PQconnectStartParams takes (with their own copies of the
 * values, since the pool or listener may be freed meanwhile), then the
 * status the step's PQconnectPoll returned. */
typedef struct {
  uv_work_t work;                     /* first: the step's uv_work_t is the struct */
  struct qtg_pg_conn *conn;
  const char *keys[QTG_PG_TCP_PARAMS + 4], *vals[QTG_PG_TCP_PARAMS + 4];
  qtg_pg_tcp_values tcp;
  char options[320];
  char *conninfo;
  PGconn *pg;                         /* the step's own while it runs */
  int running;                        /* in the thread pool now */
  PostgresPollingStatusType polled;
} qtg_pg_connecting;

struct qtg_pg_conn {
  qtg_pg_pool *pool;          /* NULL for the listener's connection */
  qtg_pg_listener *listener;  /* set for the listener's connection */
  uv_loop_t *loop;
  qtg_pg_connecting *connecting; /* while CONNECTING: the steps' state */
  int orphaned;               /* freed while a step runs: freed after it */
  uv_timer_t *deadline;       /* while CONNECTING: MG_DB_TCP_TIMEOUT_SECONDS (qtg_pg_connect_expired) */
  int deadline_s;
  PGconn *pg;
  uv_poll_t *poll;
  int fd, events;
  qtg_pg_state state;
  int in_use;
  /* the command in flight */
  qtg_pg_result_cb cb;
  void *data;
  int has_cb;
  PGresult *last;
  qtg_pg_step step;
  char *pending_sql;
  int pending_n;
  char **pending_values;
  int pending_stmt;
  /* prepared statements of this connection */
  qtg_pg_stmt *stmts;
  int nstmts, capstmts;
  uint64_t stmt_clock;       /* bumped by each use: the LRU order */
  unsigned long stmt_serial; /* names are never reused: qtg<serial> */
  char pending_name[24];
  /* the pipeline transaction, if one is open */
  qtg_pg_pipe pipe;
  int pipe_failed;           /* one of its statements failed: the server skips to the Sync */
  int pipe_nulls;            /* end-of-command markers read while waiting for the Sync */
  int pipe_syncs;            /* Syncs sent whose results are not read yet */
  /* a batch (qtg_pg_query_batch): its callback and its commands' results,
   * all but the last (which is `last`) */
  qtg_pg_batch_cb bcb;
  int batch_n;               /* commands in the batch; 0 when not a batch */
  int batch_ahead;           /* of them, sent after its committing Sync */
  int batch_done;            /* commands whose results are read */
  PGresult *batch_res[QTG_PG_BATCH_MAX];
  /* notifications raised by the open transaction, for after its commit */
  qtg_pg_after_commit *after_commit, **after_commit_tail;
  int after_commit_n;
  int after_commit_asked;    /* opened with QTG_PG_POOL_OPTIONS */
  unsigned read_only_epoch;  /* the pool's when opened (qtg_pg_read_only_seen) */
  int release_later;         /* qtg_pg_release_later: released on the next turn */
  int in_share;              /* held by the share's acquire */
  /* the command in flight, for the slow-statement watch (a pool's only) */
  uint64_t sent_ns;          /* uv_hrtime() when it was sent */
  uint64_t slow_next_ms;     /* its age at which the next warning is due */
  int slow_warned;           /* warnings written about it; 0: none yet */
  int slow_commit;           /* it ends its transaction with a commit */
  int slow_pid;              /* its server process, as of its send */
  int batch_idx[QTG_PG_BATCH_MAX]; /* a batch's prepared statements, in order */
  char slow_task[64];        /* the task waiting on it, as of its last warning */
  char slow_shown[QTG_PG_SQL_SHOWN + 8]; /* what its last warning named */
  int slow_shown_commit;     /* ... and whether that was a commit */
  int slow_shown_left;       /* ... and the statements not answered then */
  char sql_head[QTG_PG_SQL_HEAD]; /* its SQL's first bytes, no parameters */
  qtg_pg_conn *next; /* pool's list of all connections */
};

struct qtg_pg_pool {
  uv_loop_t *loop;
  char *conninfo;
  int tcp_timeout;          /* MG_DB_TCP_TIMEOUT_SECONDS (qtg_pg_tcp_params) */
  int statement_timeout_ms, lock_timeout_ms;
  int size, nconns, nconnecting, nidle, nwaiters, nin_use;
  int share_size, nshare_in_use; /* the share's bound, its connections in use */
  qtg_pg_conn *conns;
  qtg_pg_waiter *whead, *wtail;
  void (*drop)(void *data); /* frees the data of a callback never to be called */
  qtg_pg_notify_cb committed; /* gets the after-commit notifications */
  void *committed_data;
  char last_error[512];
  /* the slow-statement watch (qtg_pg_slow_check) */
  int slow_ms;                /* MG_DB_SLOW_WARN_SECONDS; 0: off */
  uv_timer_t *slow_timer;     /* NULL when off */
  uint64_t slow_total;        /* commands that went past slow_ms */
  uint64_t slow_period;       /* ms between the walks while one runs */
  int slow_off;               /* qtg_pg_pool_slow_off: a command-line tool's long statements */
  const char *(*describe)(void *data);
  /* releases deferred to the loop's next turn (qtg_pg_release_later) */
  uv_timer_t *later_timer;
  int nlater;
  /* a server that said it is read-only (qtg_pg_read_only_seen) */
  unsigned read_only_epoch;
  void (*read_only)(void *data);
  void *read_only_data;
};

struct qtg_pg_listener {
  uv_loop_t *loop;
  char *conninfo;
  int tcp_timeout;
  qtg_pg_conn *conn;
  uv_timer_t *retry;
  char **channels;
  int nchannels;
  int relisten; /* channels changed while a LISTEN was in flight */
  int connected_once;
  qtg_pg_notify_cb cb;
  void *data;
};

static void qtg_pg_on_poll(uv_poll_t *handle, int status, int events);
static void qtg_pg_conn_fail(qtg_pg_conn *c, const char *why);
static void qtg_pg_pool_conn_ready(qtg_pg_conn *c);
static void qtg_pg_listener_conn_ready(qtg_pg_listener *l);
static void qtg_pg_listener_conn_lost(qtg_pg_listener *l);
static void qtg_pg_listener_drain(qtg_pg_listener *l);

static uint32_t qtg_pg_hash(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

/* ---- connection plumbing ------------------------------------------------- */

static void qtg_pg_poll_closed(uv_handle_t *h) { free(h); }

/* The connect's deadline is over (connected, failed or freed). */
static void qtg_pg_deadline_stop(qtg_pg_conn *c) {
  if (c->deadline) {
    uv_close((uv_handle_t *)c->deadline, qtg_pg_poll_closed);
    c->deadline = NULL;
  }
}

static void qtg_pg_unwatch(qtg_pg_conn *c) {
  if (c->poll) {
    uv_close((uv_handle_t *)c->poll, qtg_pg_poll_closed);
    c->poll = NULL;
  }
  c->fd = -1;
  c->events = 0;
}

static int qtg_pg_watch(qtg_pg_conn *c, int events) {
  int fd = PQsocket(c->pg);
  if (fd < 0) return -1;
  if (c->poll && fd != c->fd) qtg_pg_unwatch(c); /* libpq may switch sockets while connecting */
  if (!c->poll) {
    c->poll = malloc(sizeof *c->poll);
    if (!c->poll) return -1;
    if (uv_poll_init_socket(c->loop, c->poll, fd) != 0) {
      free(c->poll);
      c->poll = NULL;
      return -1;
    }
    c->poll->data = c;
    c->fd = fd;
    c->events = 0;
  }
  if (c->events == events) return 0;
  c->events = events;
  return uv_poll_start(c->poll, events, qtg_pg_on_poll) == 0 ? 0 : -1;
}

static void qtg_pg_pending_free(qtg_pg_conn *c) {
  for (int i = 0; i < c->pending_n; i++) free(c->pending_values[i]);
  free(c->pending_values);
  free(c->pending_sql);
  c->pending_values = NULL;
  c->pending_sql = NULL;
  c->pending_n = 0;
}

/* Forget the open transaction's after-commit notifications (it rolled back,
 * failed, or its connection is gone); with deliver, hand each to the pool's
 * committed callback first (it committed).  The list is detached before
 * the callbacks run, which may use the pool. */
static void qtg_pg_after_commit_end(qtg_pg_conn *c, int deliver) {
  qtg_pg_after_commit *a = c->after_commit;
  qtg_pg_pool *p = c->pool;
  c->after_commit = NULL;
  c->after_commit_tail = &c->after_commit;
  c->after_commit_n = 0;
  while (a) {
    qtg_pg_after_commit *next = a->next;
    if (deliver && p && p->committed) p->committed(a->channel, a->payload, p->committed_data);
    free(a->channel);
    free(a->payload);
    free(a);
    a = next;
  }
}

/* ---- the slow-statement watch ------------------------------------------- */

/* A command of a watched pool is sent: its send time and its SQL's first
 * bytes, for a warning should it still be in flight past the threshold.
 * This is all a command costs the watch (no timer of its own): a monotonic
 * clock read, not the loop's cached time, which lags by however long the
 * sending task has run in this loop iteration. */
static void qtg_pg_slow_check(uv_timer_t *t);

static void qtg_pg_slow_arm(qtg_pg_conn *c, const char *sql, int commit) {
  qtg_pg_pool *p = c->pool;
  if (!p || !p->slow_timer || p->slow_off) return;
  while (*sql == ' ' || *sql == '\n' || *sql == '\t' || *sql == '\r') sql++;
  size_t n = strnlen(sql, sizeof c->sql_head - 1);
  memcpy(c->sql_head, sql, n);
  c->sql_head[n] = '\0';
  c->sent_ns = uv_hrtime();
  c->slow_warned = 0;
  c->slow_commit = commit;
  c->slow_pid = PQbackendPID(c->pg);
  /* the walk runs only while a command may be in flight */
  if (!uv_is_active((uv_handle_t *)p->slow_timer) &&
      uv_timer_start(p->slow_timer, qtg_pg_slow_check, p->slow_period, p->slow_period) != 0)
    qtg_log_warn("cannot start the slow-statement watch's timer");
}

static uint64_t qtg_pg_slow_age_ms(const qtg_pg_conn *c) { return (uv_hrtime() - c->sent_ns) / 1000000; }

/* len bytes of s without a multi-byte UTF-8 character cut at its end. */
static size_t qtg_pg_utf8_whole(const char *s, size_t len) {
  size_t i = len;
  while (i > 0 && len - i < 4 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) i--;
  if (i == 0) return len;
  unsigned char lead = (unsigned char)s[i - 1];
  size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return i - 1 + need <= len ? len : i - 1;
}

/* The command's SQL as the lines show it: one line, runs of white space
 * folded to one space, at most QTG_PG_SQL_SHOWN bytes and "..." when there
 * is more.  Parameters are never part of it: they may hold secrets. */
static void qtg_pg_sql_shown(const char *sql, int cut, char *out, size_t cap) {
  const char *p = sql;
  size_t o = 0;
  int space = 1; /* leading white space goes */
  for (; *p && o < QTG_PG_SQL_SHOWN && o + 4 < cap; p++) {
    int white = *p == ' ' || *p == '\n' || *p == '\t' || *p == '\r';
    if (white && !space) out[o++] = ' ';
    if (!white) out[o++] = *p;
    space = white;
  }
  while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
  int more = *p != '\0' || cut;
  if (more) o = qtg_pg_utf8_whole(out, o);
  while (o > 0 && out[o - 1] == ' ') o--;
  if (more) {
    memcpy(out + o, "...", 3);
    o += 3;
  }
  out[o] = '\0';
}

/* Key/value pairs and their kinds for qtg_log_fieldsk. */
#define QTG_PG_LOG_FIELDS 10
typedef struct {
  const char *kv[2 * QTG_PG_LOG_FIELDS + 1];
  char kinds[QTG_PG_LOG_FIELDS + 1];
  int n;
} qtg_pg_log_fields;

static void qtg_pg_field(qtg_pg_log_fields *f, const char *key, const char *val, char kind) {
  if (!val || f->n >= QTG_PG_LOG_FIELDS) return;
  f->kv[2 * f->n] = key;
  f->kv[2 * f->n + 1] = val;
  f->kinds[f->n++] = kind;
  f->kv[2 * f->n] = NULL;
  f->kinds[f->n] = '\0';
}

/* What c waits on: a command's SQL (its first bytes: *cut when there was
 * more), or, in a batch, its first statement not answered yet (*left: how
 * many are not), or its commit (the Sync after the statements before it:
 * *commit).  The server sends a pipeline's results at its Sync or when its
 * buffer fills, so a later statement may be the one waiting: the backend
 * pid's row in pg_stat_activity says which. */
static const char *qtg_pg_slow_current(const qtg_pg_conn *c, int *cut, int *commit, int *left) {
  *cut = 0;
  *commit = c->slow_commit;
  *left = 1;
  if (c->batch_n == 0) {
    *cut = strlen(c->sql_head) == sizeof c->sql_head - 1;
    return c->sql_head;
  }
  /* in the commit step each command before the Sync ends with a NULL */
  int k = c->step == QTG_PG_STEP_SYNC ? c->pipe_nulls : c->batch_done;
  *commit = c->step == QTG_PG_STEP_SYNC && k >= c->batch_n - c->batch_ahead;
  if (*commit) return "COMMIT";
  if (k >= c->batch_n) k = c->batch_n - 1;
  *left = c->batch_n - k;
  return c->stmts[c->batch_idx[k]].sql;
}

/* A warning names what c waits on now; its last line names what the last
 * warning named. */
static void qtg_pg_slow_name(qtg_pg_conn *c) {
  int cut;
  const char *current = qtg_pg_slow_current(c, &cut, &c->slow_shown_commit, &c->slow_shown_left);
  qtg_pg_sql_shown(current, cut, c->slow_shown, sizeof c->slow_shown);
  if (strncasecmp(c->slow_shown, "COMMIT", 6) == 0) c->slow_shown_commit = 1;
}

/* One line about a slow command: msg (its age in it), then the task that
 * waits on it, what it is (qtg_pg_slow_name: the first bytes of its SQL;
 * in a batch, the statements not answered; whether it is a commit), how
 * long it has waited and where it runs; outcome and sqlstate (may be NULL)
 * on its last line. */
static void qtg_pg_slow_log(const qtg_pg_conn *c, const char *verb, uint64_t age_ms, const char *outcome,
                            const char *sqlstate) {
  char msg[96], waited[32], pid[16], left[16];
  qtg_pg_log_fields f = {.n = 0};
  snprintf(msg, sizeof msg, "database statement %s after %.1f s", verb, (double)age_ms / 1000);
  snprintf(waited, sizeof waited, "%.1f", (double)age_ms / 1000);
  snprintf(pid, sizeof pid, "%d", c->slow_pid);
  snprintf(left, sizeof left, "%d", c->slow_shown_left);
  qtg_pg_field(&f, "task", c->slow_task[0] ? c->slow_task : NULL, 's');
  qtg_pg_field(&f, "statement", c->slow_shown, 's');
  if (c->slow_shown_left > 1) qtg_pg_field(&f, "statements", left, 'n');
  if (c->slow_shown_commit) qtg_pg_field(&f, "commit", "true", 'b');
  qtg_pg_field(&f, "waited_seconds", waited, 'n');
  qtg_pg_field(&f, "host", PQhost(c->pg), 's');
  qtg_pg_field(&f, "port", PQport(c->pg), 'n');
  qtg_pg_field(&f, "backend_pid", pid, 'n');
  qtg_pg_field(&f, "outcome", outcome, 's');
  qtg_pg_field(&f, "sqlstate", sqlstate, 's');
  qtg_log_fieldsk(QTG_LOG_WARN, msg, f.kv, f.kinds);
}

/* A warning about c, aged age ms; the next is due when its wait has
 * doubled, at most QTG_PG_SLOW_REPEAT_MAX_MS later.  Its task's name is
 * kept for its last line: an interrupted task no longer waits on it. */
static void qtg_pg_slow_warn(qtg_pg_pool *p, qtg_pg_conn *c, uint64_t age) {
  void *data = qtg_pg_waiting_data(c);
  const char *task = data && p->describe ? p->describe(data) : NULL;
  if (!c->slow_warned) p->slow_total++;
  if (task || !c->slow_warned) snprintf(c->slow_task, sizeof c->slow_task, "%s", task ? task : "");
  c->slow_warned++;
  c->slow_next_ms = age + (age < QTG_PG_SLOW_REPEAT_MAX_MS ? age : QTG_PG_SLOW_REPEAT_MAX_MS) + 1;
  qtg_pg_slow_name(c);
  qtg_pg_slow_log(c, "still running", age, NULL, NULL);
}

/* The pool's periodic walk: each command in flight past the threshold, or
 * past its next warning, gets one. */
static void qtg_pg_slow_check(uv_timer_t *t) {
  qtg_pg_pool *p = t->data;
  int busy = 0;
  for (qtg_pg_conn *c = p->conns; c; c = c->next) {
    if (c->state != QTG_PG_BUSY) continue;
    busy = 1;
    uint64_t age = qtg_pg_slow_age_ms(c);
    if (age >= (c->slow_warned ? c->slow_next_ms : (uint64_t)p->slow_ms)) qtg_pg_slow_warn(p, c, age);
  }
  if (!busy) uv_timer_stop(t); /* an idle daemon is not woken: the next command starts it */
}

/* A command that was warned about is over: its last line says how it
 * ended ("ok", "error" with its SQLSTATE, "connection lost", or
 * "abandoned": its task was interrupted or its connection discarded). */
static void qtg_pg_slow_end(qtg_pg_conn *c, const char *outcome, const char *sqlstate) {
  if (!c->slow_warned) return;
  qtg_pg_slow_log(c, "finished", qtg_pg_slow_age_ms(c), outcome, sqlstate);
  c->slow_warned = 0;
}

/* The outcome of a command whose results are in (n of them) or err. */
static void qtg_pg_slow_done(qtg_pg_conn *c, PGresult *const *res, int n, const char *err) {
  if (!c->slow_warned) return;
  if (!c->has_cb) {
    qtg_pg_slow_end(c, "abandoned", NULL);
    return;
  }
  if (err) {
    qtg_pg_slow_end(c, "connection lost", NULL);
    return;
  }
  for (int i = 0; i < n; i++) {
    if (res[i] && PQresultStatus(res[i]) == PGRES_FATAL_ERROR) {
      qtg_pg_slow_end(c, "error", PQresultErrorField(res[i], PG_DIAG_SQLSTATE));
      return;
    }
  }
  qtg_pg_slow_end(c, "ok", NULL);
}

/* A committing batch's statements sent ahead of its commit start when the
 * commit is in: the commit's watch ends (its last line, if it was warned
 * about) and theirs begins. */
static void qtg_pg_slow_rearm(qtg_pg_conn *c, int failed) {
  if (!c->pool || !c->pool->slow_timer || c->pool->slow_off) return;
  /* still in the commit step: the last line names the commit */
  qtg_pg_slow_end(c, failed ? "error" : "ok", NULL);
  c->sent_ns = uv_hrtime();
  c->slow_warned = 0;
  c->slow_commit = 0;
}

/* The walk runs every quarter of the threshold, between 50 ms and 1 s,
 * while a command may be in flight (qtg_pg_slow_arm starts it, a walk that
 * finds none stops it): a warning comes at most that late.  The timer does
 * not keep the loop alive. */
static int qtg_pg_slow_start(qtg_pg_pool *p) {
  uint64_t period = (uint64_t)p->slow_ms / 4;
  if (period < 50) period = 50;
  if (period > 1000) period = 1000;
  p->slow_period = period;
  p->slow_timer = malloc(sizeof *p->slow_timer);
  if (!p->slow_timer) return -1;
  if (uv_timer_init(p->loop, p->slow_timer) != 0) {
    free(p->slow_timer);
    p->slow_timer = NULL;
    return -1;
  }
  p->slow_timer->data = p;
  uv_unref((uv_handle_t *)p->slow_timer);
  return 0;
}

void qtg_pg_pool_slow_off(qtg_pg_pool *p) {
  p->slow_off = 1;
  if (p->slow_timer) uv_timer_stop(p->slow_timer);
  for (qtg_pg_conn *c = p->conns; c; c = c->next) c->slow_warned = 0;
}

void qtg_pg_pool_slow_stats(const qtg_pg_pool *p, int *slow, uint64_t *total, uint64_t *oldest_ms) {
  *slow = 0;
  *total = p->slow_total;
  *oldest_ms = 0;
  if (!p->slow_timer) return;
  for (const qtg_pg_conn *c = p->conns; c; c = c->next) {
    if (c->state != QTG_PG_BUSY) continue;
    uint64_t age = qtg_pg_slow_age_ms(c);
    if (c->slow_warned) (*slow)++;
    if (age > *oldest_ms) *oldest_ms = age;
  }
}

static void qtg_pg_conn_free(qtg_pg_conn *c) {
  qtg_pg_deadline_stop(c);
  if (c->connecting && c->connecting->running) {   /* the thread pool has the PGconn: later */
    qtg_pg_unwatch(c);
    c->orphaned = 1;
    c->pool = NULL;
    c->listener = NULL;
    c->has_cb = 0;
    return;
  }
  if (c->connecting) {
    free(c->connecting->conninfo);
    free(c->connecting);
    c->connecting = NULL;
  }
  qtg_pg_after_commit_end(c, 0);
  qtg_pg_unwatch(c);
  if (c->pg) PQfinish(c->pg);
  if (c->last) PQclear(c->last);
  for (int i = 0; i < c->batch_done; i++) PQclear(c->batch_res[i]);
  qtg_pg_pending_free(c);
  for (int i = 0; i < c->nstmts; i++) free(c->stmts[i].sql);
  free(c->stmts);
  free(c);
}

/* Unlink from the pool and free.  A command still in flight will never
 * call back: its data goes to the pool's drop (internal commands carry no
 * data). */
static void qtg_pg_conn_destroy(qtg_pg_conn *c) {
  qtg_pg_pool *p = c->pool;
  qtg_pg_slow_end(c, "abandoned", NULL);
  if (p && c->has_cb && c->data && p->drop) p->drop(c->data);
  c->has_cb = 0;
  if (p) {
    for (qtg_pg_conn **pp = &p->conns; *pp; pp = &(*pp)->next) {
      if (*pp == c) {
        *pp = c->next;
        break;
      }
    }
    p->nconns--;
    if (c->state == QTG_PG_CONNECTING) p->nconnecting--;
    if (c->state == QTG_PG_IDLE && !c->in_use) p->nidle--;
    if (c->in_use) p->nin_use--;
    if (c->in_use && c->in_share) p->nshare_in_use--;
  }
  qtg_pg_conn_free(c);
}

/* After-commit notifications.  A NOTIFY holds PostgreSQL's notification
 * lock (one per database) from the commit's start to its end, WAL flush
 * included, so transactions that notify cannot share a flush: on a durable
 * cluster they commit one flush at a time.  A session of a pool that has a
 * committed callback (qtg_pg_pool_on_commit) tells the server
 * (QTG_PG_POOL_OPTIONS) that it sends its notifications itself:
 * a trigger then raises a NOTICE "qtg_after_commit <channel> <payload>"
 * instead of NOTIFYing (sql/0150), the connection keeps it with its open
 * transaction, and the pool's committed callback gets it once that
 * transaction has committed; a transaction that fails or rolls back drops
 * it.  At most QTG_PG_AFTER_COMMIT_MAX are kept per transaction. */
#define QTG_PG_AFTER_COMMIT "qtg_after_commit "
#define QTG_PG_AFTER_COMMIT_MAX 16
#define QTG_PG_SESSION_OPTIONS "-c TimeZone=UTC -c DateStyle=ISO -c plan_cache_mode=force_generic_plan"
/* the notices reach the session whatever the database's defaults say */
#define QTG_PG_POOL_OPTIONS " -c qtg.notify=after_commit -c client_min_messages=notice"
/* A pool session's bounds: its statements and lock waits (the pool's
 * config), and how often a running statement's server process looks
 * whether the client is still there (ms): a session whose task was
 * interrupted is shut down (qtg_pg_forget), and its server process must
 * then end a statement that waits on a lock rather than hold the locks
 * its transaction took until that wait ends. */
#define QTG_PG_BOUNDS_OPTIONS " -c statement_timeout=%d -c lock_timeout=%d -c client_connection_check_interval=1000"

int qtg_pg_after_commit_parse(const char *msg, size_t *channel_len, const char **payload) {
  size_t prefix = strlen(QTG_PG_AFTER_COMMIT);
  if (strncmp(msg, QTG_PG_AFTER_COMMIT, prefix) != 0) return -1;
  const char *channel = msg + prefix;
  size_t n = strcspn(channel, " ");
  if (n == 0 || channel[n] != ' ') return -1;
  *channel_len = n;
  *payload = channel + n + 1;
  return 0;
}

static int qtg_pg_after_commit_add(qtg_pg_conn *c, const char *msg) {
  size_t n;
  const char *payload;
  if (qtg_pg_after_commit_parse(msg, &n, &payload) != 0 || c->after_commit_n >= QTG_PG_AFTER_COMMIT_MAX)
    return -1;
  qtg_pg_after_commit *a = calloc(1, sizeof *a);
  if (!a) return -1;
  a->channel = strndup(msg + strlen(QTG_PG_AFTER_COMMIT), n);
  a->payload = strdup(payload);
  if (!a->channel || !a->payload) {
    free(a->channel);
    free(a->payload);
    free(a);
    return -1;
  }
  if (!c->after_commit) c->after_commit_tail = &c->after_commit;
  *c->after_commit_tail = a;
  c->after_commit_tail = &a->next;
  c->after_commit_n++;
  return 0;
}

/* Server NOTICEs: an after-commit notification of a pool session is kept;
 * any other (e.g. "table does not exist, skipping") is a debug log, not a
 * stray line on stderr. */
static void qtg_pg_notice(void *arg, const PGresult *res) {
  qtg_pg_conn *c = arg;
  const char *primary = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
  const char *severity = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
  if (c->pool && primary && severity && strcmp(severity, "NOTICE") == 0 &&
      strncmp(primary, QTG_PG_AFTER_COMMIT, strlen(QTG_PG_AFTER_COMMIT)) == 0) {
    /* the prefix is ours: the rest must parse */
    if (qtg_pg_after_commit_add(c, primary) == 0) return;
    qtg_logf(QTG_LOG_WARN, "source", "postgresql",
             "an after-commit notification is dropped (malformed, out of memory, or more than %d in one transaction)",
             QTG_PG_AFTER_COMMIT_MAX);
    return;
  }
  char msg[512];
  snprintf(msg, sizeof msg, "%s", PQresultErrorMessage(res));
  msg[strcspn(msg, "\n")] = '\0';
  qtg_logf(QTG_LOG_DEBUG, "source", "postgresql", "%s", msg);
}

int qtg_pg_tcp_params(int tcp_timeout, qtg_pg_tcp_values *t, const char **keys, const char **vals) {
  if (tcp_timeout <= 0) return 0;
  snprintf(t->idle, sizeof t->idle, "%d", tcp_timeout / 3 > 0 ? tcp_timeout / 3 : 1);
  snprintf(t->interval, sizeof t->interval, "%d", tcp_timeout / 6 > 0 ? tcp_timeout / 6 : 1);
  snprintf(t->user_timeout, sizeof t->user_timeout, "%d", tcp_timeout * 1000);
  keys[0] = "keepalives", vals[0] = "1";
  keys[1] = "keepalives_idle", vals[1] = t->idle;
  keys[2] = "keepalives_interval", vals[2] = t->interval;
  keys[3] = "keepalives_count", vals[3] = "3";
  keys[4] = "tcp_user_timeout", vals[4] = t->user_timeout;
  return QTG_PG_TCP_PARAMS;
}

/* In the thread pool: the first step starts the connection, each next
 * one polls it.  Only the step's struct is touched here. */
static void qtg_pg_connect_work(uv_work_t *w) {
  qtg_pg_connecting *st = (qtg_pg_connecting *)w;
  if (st->pg == NULL) {
    st->pg = PQconnectStartParams(st->keys, st->vals, 1);
    /* as libpq asks: start by polling as if it said "writing" */
    st->polled = st->pg && PQstatus(st->pg) != CONNECTION_BAD ? PGRES_POLLING_WRITING : PGRES_POLLING_FAILED;
  } else {
    st->polled = PQconnectPoll(st->pg);
  }
}

static void qtg_pg_connect_done(uv_work_t *w, int status);

/* Run the next connecting step in the thread pool.  The socket's poll
 * handle is closed first, while its descriptor is still libpq's: the step
 * may close that descriptor, and the loop may then open another socket
 * with the same number, which a later stop or close of the old handle
 * would take out of epoll.  The step's completion watches anew. */
static int qtg_pg_connect_queue(qtg_pg_conn *c) {
  qtg_pg_connecting *st = c->connecting;
  qtg_pg_unwatch(c);
  st->pg = c->pg;
  st->running = 1;
  if (uv_queue_work(c->loop, &st->work, qtg_pg_connect_work, qtg_pg_connect_done) != 0) {
    st->running = 0;
    return -1;
  }
  return 0;
}

/* On the loop: what the step said. */
static void qtg_pg_connect_done(uv_work_t *w, int status) {
  qtg_pg_connecting *st = (qtg_pg_connecting *)w;
  qtg_pg_conn *c = st->conn;
  st->running = 0;
  c->pg = st->pg;
  if (c->orphaned) {
    qtg_pg_conn_free(c);
    return;
  }
  if (status != 0 || c->pg == NULL) {
    qtg_pg_conn_fail(c, c->pg ? PQerrorMessage(c->pg) : "out of memory");
    return;
  }
  switch (st->polled) {
  case PGRES_POLLING_READING:
    if (qtg_pg_watch(c, UV_READABLE) != 0) qtg_pg_conn_fail(c, "cannot watch the PostgreSQL socket");
    return;
  case PGRES_POLLING_WRITING:
    if (qtg_pg_watch(c, UV_WRITABLE) != 0) qtg_pg_conn_fail(c, "cannot watch the PostgreSQL socket");
    return;
  case PGRES_POLLING_OK:
    qtg_pg_deadline_stop(c);
    PQsetNoticeReceiver(c->pg, qtg_pg_notice, c);
    free(st->conninfo);
    free(st);
    c->connecting = NULL;
    if (PQsetnonblocking(c->pg, 1) != 0 || qtg_pg_watch(c, UV_READABLE) != 0) {
      qtg_pg_conn_fail(c, "cannot make the PostgreSQL connection non-blocking");
      return;
    }
    c->state = QTG_PG_IDLE;
    if (c->pool) {
      c->pool->nconnecting--;
      qtg_pg_pool_conn_ready(c);
    } else {
      qtg_pg_listener_conn_ready(c->listener);
    }
    return;
  default:
    qtg_pg_conn_fail(c, PQerrorMessage(c->pg));
    return;
  }
}

/* A connect that has not finished after MG_DB_TCP_TIMEOUT_SECONDS fails.
 * libpq's connect_timeout binds only its blocking connect, and TCP's own
 * bounds never fire while the peer's kernel acknowledges: a stopped
 * postmaster's full backlog, a paused pooler or proxy.  A step still
 * running in the thread pool is orphaned as when the pool is freed. */
static void qtg_pg_connect_expired(uv_timer_t *t) {
  qtg_pg_conn *c = t->data;
  char why[96];
  snprintf(why, sizeof why, "no answer within %d s (MG_DB_TCP_TIMEOUT_SECONDS)", c->deadline_s);
  qtg_pg_conn_fail(c, why);
}

static int qtg_pg_deadline_start(qtg_pg_conn *c, int seconds) {
  if (seconds <= 0) return 0;      /* 0: no bound, as for TCP */
  c->deadline = malloc(sizeof *c->deadline);
  if (!c->deadline) return -1;
  if (uv_timer_init(c->loop, c->deadline) != 0) {
    free(c->deadline);
    c->deadline = NULL;
    return -1;
  }
  c->deadline->data = c;
  c->deadline_s = seconds;
  if (uv_timer_start(c->deadline, qtg_pg_connect_expired, (uint64_t)seconds * 1000, 0) != 0) {
    qtg_pg_deadline_stop(c);
    return -1;
  }
  return 0;
}

static qtg_pg_conn *qtg_pg_conn_start(uv_loop_t *loop, const char *conninfo, qtg_pg_pool *pool,
                                      qtg_pg_listener *listener, char *err, size_t errlen) {
  qtg_pg_conn *c = calloc(1, sizeof *c);
  qtg_pg_connecting *st = calloc(1, sizeof *st);
  char *own = strdup(conninfo);
  if (!c || !st || !own) {
    snprintf(err, errlen, "out of memory");
    free(c);
    free(st);
    free(own);
    return NULL;
  }
  c->pool = pool;
  c->listener = listener;
  c->loop = loop;
  c->fd = -1;
  c->after_commit_tail = &c->after_commit;
  c->after_commit_asked = pool && pool->committed;
  c->read_only_epoch = pool ? pool->read_only_epoch : 0;
  /* UTC and ISO dates on every session, so time values read the same
   * whatever the server's defaults are.  Generic plans: every statement is
   * prepared once per connection and the claims' state predicates are
   * constants that match their partial indexes, so planning each execution
   * afresh costs PostgreSQL CPU and buys nothing (docs/performance.md).
   * The TCP bounds first, so that the URL's own values override them. */
  int n = qtg_pg_tcp_params(pool ? pool->tcp_timeout : listener->tcp_timeout, &st->tcp, st->keys, st->vals);
  st->conninfo = own;
  st->keys[n] = "dbname", st->vals[n++] = own;
  st->keys[n] = "application_name", st->vals[n++] = "qtgd";
  st->keys[n] = "options";
  if (pool)
    snprintf(st->options, sizeof st->options, "%s%s" QTG_PG_BOUNDS_OPTIONS, QTG_PG_SESSION_OPTIONS,
             c->after_commit_asked ? QTG_PG_POOL_OPTIONS : "", pool->statement_timeout_ms,
             pool->lock_timeout_ms);
  else
    snprintf(st->options, sizeof st->options, "%s", QTG_PG_SESSION_OPTIONS);
  st->vals[n++] = st->options;
  st->keys[n] = NULL, st->vals[n] = NULL;
  st->conn = c;
  c->connecting = st;
  c->state = QTG_PG_CONNECTING;
  if (qtg_pg_deadline_start(c, pool ? pool->tcp_timeout : listener->tcp_timeout) != 0 ||
      qtg_pg_connect_queue(c) != 0) {
    snprintf(err, errlen, "cannot queue the connection to PostgreSQL");
    qtg_pg_conn_free(c);
    return NULL;
  }
  return c;
}

/* A connection opened before its pool last heard "read-only" is closed
 * at its release, never handed out again. */
static int qtg_pg_stale(const qtg_pg_conn *c) {
  return c->pool && c->read_only_epoch != c->pool->read_only_epoch;
}

/* A statement failed with SQLSTATE 25006 (read_only_sql_transaction): the
 * server this connection reached is not a primary any more (fenced with
 * default_transaction_read_only, or a standby), and every connection the
 * pool holds may be on it.  A pooled connection is kept while it works, so
 * without this the daemon stayed on a fenced old primary for good, its
 * workers failing at every pass, while the new primary got no work.  The
 * pool's epoch moves on: its idle connections are closed now, those in use
 * at their release, and the next ones are opened through MG_DATABASE_URL
 * (whose target_session_attrs=read-write passes a read-only server over);
 * the owner is told (the wake-up listener reconnects the same way).  Only
 * a connection of the current epoch moves it, once. */
static void qtg_pg_read_only_seen(qtg_pg_conn *c, PGresult *const *res, int n) {
  qtg_pg_pool *p = c->pool;
  if (!p || qtg_pg_stale(c)) return;
  int seen = 0;
  for (int i = 0; i < n && !seen; i++) {
    const char *st = res[i] && PQresultStatus(res[i]) == PGRES_FATAL_ERROR
                         ? PQresultErrorField(res[i], PG_DIAG_SQLSTATE)
                         : NULL;
    seen = st && strcmp(st, "25006") == 0;
  }
  if (!seen) return;
  p->read_only_epoch++;
  qtg_log_warn("PostgreSQL %s:%s is read-only (SQLSTATE 25006): the pool closes its connections to it and opens "
               "new ones through MG_DATABASE_URL",
               PQhost(c->pg) ? PQhost(c->pg) : "?", PQport(c->pg) ? PQport(c->pg) : "?");
  qtg_pg_conn *next;
  for (qtg_pg_conn *o = p->conns; o; o = next) {
    next = o->next;
    if (o != c && o->state == QTG_PG_IDLE && !o->in_use) qtg_pg_conn_destroy(o);
  }
  if (p->read_only) p->read_only(p->read_only_data);
}

/* Hand the finished command's result to its owner.  The callback may use
 * or release the connection, so c is not touched after it. */
static void qtg_pg_deliver(qtg_pg_conn *c, const char *err) {
  PGresult *res = c->last;
  qtg_pg_result_cb cb = c->cb;
  void *data = c->data;
  int has_cb = c->has_cb;
  qtg_pg_batch_cb bcb = c->bcb;
  PGresult *all[QTG_PG_BATCH_MAX];
  int n = c->batch_done; /* < QTG_PG_BATCH_MAX: the last is res */
  memcpy(all, c->batch_res, (size_t)n * sizeof *all);
  all[n] = res;
  qtg_pg_slow_done(c, all, n + 1, err);
  if (!err) qtg_pg_read_only_seen(c, all, n + 1);
  c->last = NULL;
  c->has_cb = 0;
  c->cb = NULL;
  c->bcb = NULL;
  c->batch_n = c->batch_done = c->batch_ahead = 0;
  qtg_pg_pending_free(c);
  if (has_cb && bcb) bcb(c, all, n + 1, err, data);
  else if (has_cb && cb) cb(c, res, err, data);
  for (int i = 0; i <= n; i++)
    if (all[i]) PQclear(all[i]);
}

static int qtg_pg_flush(qtg_pg_conn *c) {
  int r = PQflush(c->pg);
  if (r < 0) return -1;
  return qtg_pg_watch(c, r == 1 ? (UV_READABLE | UV_WRITABLE) : UV_READABLE);
}

/* A command was queued: in a pipeline, ask the server to send its results
 * now (a Flush message: no Sync, the transaction stays open); then send. */
static int qtg_pg_sent(qtg_pg_conn *c) {
  if (c->pipe != QTG_PG_PIPE_OFF && !PQsendFlushRequest(c->pg)) return -1;
  return qtg_pg_flush(c);
}

/* A failed statement inside a transaction block leaves the block open (in
 * the aborted state, until ROLLBACK TO SAVEPOINT or ROLLBACK), but the
 * server skips every message until a Sync: send one first, which does not
 * end a block.  Without a block the Sync would end the failed transaction
 * and the next statement would run in a new one: refused (-1). */
static int qtg_pg_resync(qtg_pg_conn *c) {
  if (!c->pipe_failed) return 0;
  if (c->pipe != QTG_PG_PIPE_BLOCK || !PQpipelineSync(c->pg)) return -1;
  c->pipe_syncs++;
  c->pipe_failed = 0;
  return 0;
}

/* One statement without parameters on the extended protocol (allowed in
 * pipeline mode, where the simple protocol is not). */
static int qtg_pg_send_plain(qtg_pg_conn *c, const char *sql) {
  return PQsendQueryParams(c->pg, sql, 0, NULL, NULL, NULL, NULL, 0) ? 0 : -1;
}

static int qtg_pg_send_prepared(qtg_pg_conn *c, int idx) {
  c->step = QTG_PG_STEP_RUN;
  c->stmts[idx].used = ++c->stmt_clock;
  if (!PQsendQueryPrepared(c->pg, c->stmts[idx].name, c->pending_n,
                           (const char *const *)c->pending_values, NULL, NULL, 0))
    return -1;
  return qtg_pg_sent(c);
}

static int qtg_pg_stmt_add(qtg_pg_conn *c, const char *sql) {
  if (c->nstmts == c->capstmts) {
    int cap = c->capstmts ? c->capstmts * 2 : 16;
    qtg_pg_stmt *s = realloc(c->stmts, (size_t)cap * sizeof *s);
    if (!s) return -1;
    c->stmts = s;
    c->capstmts = cap;
  }
  qtg_pg_stmt *s = &c->stmts[c->nstmts];
  s->sql = strdup(sql);
  if (!s->sql) return -1;
  s->hash = qtg_pg_hash(sql);
  snprintf(s->name, sizeof s->name, "%s", c->pending_name);
  s->used = c->stmt_clock;
  return c->nstmts++;
}

/* Forget the least recently used statement; its name goes to out (for the
 * DEALLOCATE the caller sends). */
static void qtg_pg_stmt_evict(qtg_pg_conn *c, char *out, size_t cap) {
  int lru = 0;
  for (int i = 1; i < c->nstmts; i++)
    if (c->stmts[i].used < c->stmts[lru].used) lru = i;
  snprintf(out, cap, "%s", c->stmts[lru].name);
  free(c->stmts[lru].sql);
  c->stmts[lru] = c->stmts[--c->nstmts];
}

static int qtg_pg_send_prepare(qtg_pg_conn *c) {
  c->step = QTG_PG_STEP_PREPARE;
  if (!PQsendPrepare(c->pg, c->pending_name, c->pending_sql, c->pending_n, NULL)) return -1;
  return qtg_pg_sent(c);
}

static int qtg_pg_stmt_find(const qtg_pg_conn *c, const char *sql) {
  uint32_t h = qtg_pg_hash(sql);
  for (int i = 0; i < c->nstmts; i++)
    if (c->stmts[i].hash == h && strcmp(c->stmts[i].sql, sql) == 0) return i;
  return -1;
}

/* A command is over: did it end its transaction, and how?  After-commit
 * notifications are raised only as a transaction commits (deferred
 * triggers), so they are pending only here: handed on when the command
 * committed (a pipeline's Sync, a COMMIT, an autocommit statement), dropped
 * when it failed or rolled back, kept while the transaction stays open. */
static void qtg_pg_after_command(qtg_pg_conn *c, int failed) {
  if (!c->after_commit) return;
  int ended = c->step == QTG_PG_STEP_SYNC ||
              (c->pipe == QTG_PG_PIPE_OFF && PQtransactionStatus(c->pg) == PQTRANS_IDLE);
  if (PQtransactionStatus(c->pg) == PQTRANS_INERROR) failed = 1;
  if (c->last && PQresultStatus(c->last) != PGRES_FATAL_ERROR && strcmp(PQcmdStatus(c->last), "ROLLBACK") == 0)
    failed = 1;
  if (ended || failed) qtg_pg_after_commit_end(c, !failed);
}

static void qtg_pg_command_done(qtg_pg_conn *c) {
  int failed = c->pipe_failed ||
               (c->last && (PQresultStatus(c->last) == PGRES_FATAL_ERROR ||
                            PQresultStatus(c->last) == PGRES_PIPELINE_ABORTED));
  if (c->step == QTG_PG_STEP_SYNC) {
    /* the Sync ended the server's transaction: leave pipeline mode */
    if (!PQexitPipelineMode(c->pg)) {
      qtg_pg_conn_fail(c, PQerrorMessage(c->pg));
      return;
    }
    c->pipe = QTG_PG_PIPE_OFF;
    c->pipe_failed = 0;
  }
  if (c->step == QTG_PG_STEP_DEALLOCATE && !failed) {
    if (c->last) PQclear(c->last);
    c->last = NULL;
    if (qtg_pg_send_prepare(c) != 0) qtg_pg_conn_fail(c, "cannot send a PREPARE");
    return;
  }
  /* A DEALLOCATE that failed (its transaction is aborted) answers for the
   * statement: in a pipeline the server now skips every message until a
   * Sync, so a PREPARE sent after it would never be answered, and the
   * statement would have failed the same way.  The evicted statement stays
   * on the server under a name never used again. */
  if (c->step == QTG_PG_STEP_PREPARE) {
    if (c->last && PQresultStatus(c->last) == PGRES_COMMAND_OK) {
      PQclear(c->last);
      c->last = NULL;
      int idx = qtg_pg_stmt_add(c, c->pending_sql);
      if (idx < 0 || qtg_pg_send_prepared(c, idx) != 0) qtg_pg_conn_fail(c, "cannot send a prepared statement");
      return;
    }
    /* the PREPARE failed (e.g. a syntax error): deliver its error */
  }
  c->state = QTG_PG_IDLE;
  if (qtg_pg_watch(c, UV_READABLE) != 0) {
    qtg_pg_conn_fail(c, "cannot watch the PostgreSQL socket");
    return;
  }
  qtg_pg_after_command(c, failed);
  qtg_pg_deliver(c, NULL);
}

/* The committing Sync of a batch with statements ahead (qtg_pg_query_batch)
 * has answered: the commit is over.  Its results are the batch's first
 * n-ahead (a commit's error, read after them, takes the last one's place,
 * as for a batch that ends with its Sync); its after-commit notifications
 * are handed on or dropped; the statements ahead run in a new pipeline
 * transaction, whose results are read as a batch's.  -1 (the connection
 * failed) when the results are out of step with the statements. */
static int qtg_pg_ahead_begin(qtg_pg_conn *c, PGresult *sync) {
  int m = c->batch_n - c->batch_ahead;
  PGresult *commit_err = c->last;
  c->last = NULL;
  PQclear(sync);
  while (c->batch_done > m) {
    PGresult *extra = c->batch_res[--c->batch_done];
    if (!commit_err && PQresultStatus(extra) == PGRES_FATAL_ERROR) commit_err = extra;
    else PQclear(extra);
  }
  if (c->batch_done != m) {
    if (commit_err) PQclear(commit_err);
    qtg_pg_conn_fail(c, "pipeline out of step: a batch's results before its Sync");
    return -1;
  }
  int failed = c->pipe_failed || commit_err != NULL;
  if (commit_err) {
    PQclear(c->batch_res[m - 1]);
    c->batch_res[m - 1] = commit_err;
  }
  qtg_pg_after_commit_end(c, !failed);
  qtg_pg_slow_rearm(c, failed);
  c->pipe = QTG_PG_PIPE_IMPLICIT;
  c->pipe_failed = 0;
  c->pipe_nulls = 0;
  c->batch_ahead = 0;
  c->step = QTG_PG_STEP_RUN;
  return 0;
}

static void qtg_pg_consume(qtg_pg_conn *c) {
  if (!PQconsumeInput(c->pg)) {
    qtg_pg_conn_fail(c, PQerrorMessage(c->pg));
    return;
  }
  while (!PQisBusy(c->pg)) {
    PGresult *r = PQgetResult(c->pg);
    if (r && PQresultStatus(r) == PGRES_PIPELINE_SYNC) {
      /* no NULL follows a Sync's result; the last Sync of the end step
       * ends it, an earlier one only let the server read again */
      c->pipe_syncs--;
      if (c->step == QTG_PG_STEP_SYNC && c->pipe_syncs == 0 && c->batch_ahead > 0) {
        if (qtg_pg_ahead_begin(c, r) != 0) return;
        continue;
      }
      if (c->step == QTG_PG_STEP_SYNC && c->pipe_syncs == 0) {
        if (c->last) PQclear(r);
        else c->last = r;
        qtg_pg_command_done(c);
        return;
      }
      PQclear(r);
      continue;
    }
    if (c->step == QTG_PG_STEP_SYNC && !r) {
      /* each command before the Sync ends with a NULL; a committing
       * batch's commands but its last keep their results here */
      if (++c->pipe_nulls > 4 + c->batch_n) {
        qtg_pg_conn_fail(c, "pipeline out of step: no Sync result");
        return;
      }
      if (c->batch_done + 1 < c->batch_n) {
        c->batch_res[c->batch_done++] = c->last;
        c->last = NULL;
      }
      continue;
    }
    if (!r && c->batch_done + 1 < c->batch_n) {
      /* a batch command ended; its result is kept and the next one's read */
      c->batch_res[c->batch_done++] = c->last;
      c->last = NULL;
      continue;
    }
    if (!r) {
      qtg_pg_command_done(c);
      return;
    }
    if (c->pipe != QTG_PG_PIPE_OFF &&
        (PQresultStatus(r) == PGRES_FATAL_ERROR || PQresultStatus(r) == PGRES_PIPELINE_ABORTED))
      c->pipe_failed = 1;
    /* Keep the first error of a multi-statement command, else the last. */
    if (c->last && PQresultStatus(c->last) == PGRES_FATAL_ERROR) {
      PQclear(r);
    } else {
      if (c->last) PQclear(c->last);
      c->last = r;
    }
  }
}

static void qtg_pg_on_poll(uv_poll_t *handle, int status, int events) {
  qtg_pg_conn *c = handle->data;
  if (c->state == QTG_PG_CONNECTING) {
    /* the next step, whatever the poll says: libpq knows why a connect
     * failed ("Connection refused"); the poll's own error (often EBADF
     * after libpq closed the socket) does not */
    if (qtg_pg_connect_queue(c) != 0) qtg_pg_conn_fail(c, "cannot queue the connection to PostgreSQL");
    return;
  }
  if (status < 0) {
    /* libuv reports a socket error (POLLERR) as EBADF; libpq reads the
     * socket's own ("Connection timed out" from tcp_user_timeout) */
    const char *why = uv_strerror(status);
    if (!PQconsumeInput(c->pg) && PQerrorMessage(c->pg)[0]) why = PQerrorMessage(c->pg);
    qtg_pg_conn_fail(c, why);
    return;
  }
  switch (c->state) {
  case QTG_PG_CONNECTING:
    return;   /* above */
  case QTG_PG_IDLE:
    if (!PQconsumeInput(c->pg) || PQstatus(c->pg) == CONNECTION_BAD) {
      qtg_pg_conn_fail(c, PQerrorMessage(c->pg));
      return;
    }
    if (c->listener) qtg_pg_listener_drain(c->listener);
    return;
  case QTG_PG_BUSY:
    if (events & UV_WRITABLE) {
      if (qtg_pg_flush(c) != 0) {
        qtg_pg_conn_fail(c, PQerrorMessage(c->pg));
        return;
      }
    }
    if (events & UV_READABLE) qtg_pg_consume(c);
    return;
  case QTG_PG_BROKEN:
    qtg_pg_unwatch(c);
    return;
  }
}

static int qtg_pg_pool_grow(qtg_pg_pool *p);
static qtg_pg_waiter *qtg_pg_next_waiter(qtg_pg_pool *p);

/* Open connections for waiters no connect in flight will serve, up to the
 * pool's size; when none can be opened, fail them all with the pool's
 * last error. */
static void qtg_pg_pool_cover_waiters(qtg_pg_pool *p) {
  if (p->nwaiters > 0) (void)qtg_pg_pool_grow(p);   /* on failure, last_error says why */
  if (p->nconnecting > 0 || p->nconns > 0) return;
  while (p->whead) {
    qtg_pg_waiter *w = p->whead;
    p->whead = w->next;
    if (!p->whead) p->wtail = NULL;
    p->nwaiters--;
    w->cb(NULL, p->last_error, w->data);
    free(w);
  }
}

/* The connection is unusable: tell whoever waits on it. */
static void qtg_pg_conn_fail(qtg_pg_conn *c, const char *why) {
  char msg[512];
  snprintf(msg, sizeof msg, "%s: %s",
           c->state == QTG_PG_CONNECTING ? "cannot connect to PostgreSQL" : "connection to PostgreSQL lost",
           why && why[0] ? why : "unknown error");
  size_t n = strlen(msg);
  while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == ' ')) msg[--n] = '\0';
  qtg_pg_state was = c->state;
  qtg_pg_unwatch(c);
  qtg_pg_deadline_stop(c);
  if (c->listener) {
    c->state = QTG_PG_BROKEN;
    qtg_pg_listener_conn_lost(c->listener);
    return;
  }
  qtg_pg_pool *p = c->pool;
  if (was == QTG_PG_CONNECTING) {
    snprintf(p->last_error, sizeof p->last_error, "%s", msg);
    qtg_pg_conn_destroy(c);
    /* Fail the longest waiter a connection was opened for: the server
     * cannot be reached right now (not one waiting for the share's own). */
    qtg_pg_waiter *w = qtg_pg_next_waiter(p);
    if (w) {
      w->cb(NULL, p->last_error, w->data);
      free(w);
    }
    /* The others each get a connect of their own to wait on (and its
     * failure, if the server is still away); without one they waited
     * until an unrelated acquire grew the pool. */
    qtg_pg_pool_cover_waiters(p);
    return;
  }
  if (was == QTG_PG_IDLE && !c->in_use) {
    qtg_pg_conn_destroy(c);
    return;
  }
  c->state = QTG_PG_BROKEN;
  if (was == QTG_PG_BUSY) qtg_pg_deliver(c, msg);
}

/* ---- pool ------------------------------------------------------------------ */

int qtg_pg_pool_new(uv_loop_t *loop, const char *conninfo, const qtg_pg_pool_config *cfg,
                    void (*drop)(void *data), qtg_pg_pool **out) {
  qtg_pg_pool *p = calloc(1, sizeof *p);
  if (!p) return -1;
  p->loop = loop;
  p->tcp_timeout = cfg->tcp_timeout;
  p->statement_timeout_ms = cfg->statement_timeout_ms > 0 ? cfg->statement_timeout_ms : 0;
  p->lock_timeout_ms = cfg->lock_timeout_ms > 0 ? cfg->lock_timeout_ms : 0;
  p->drop = drop;
  p->size = cfg->size > 0 ? cfg->size : 1;
  /* the share leaves one connection at least to the rest, when there are two */
  int most = p->size > 1 ? p->size - 1 : 1;
  p->share_size = cfg->share_size > 0 && cfg->share_size < most ? cfg->share_size : most;
  p->slow_ms = cfg->slow_warn_ms > 0 ? cfg->slow_warn_ms : 0;
  p->describe = cfg->describe;
  p->conninfo = strdup(conninfo);
  p->later_timer = malloc(sizeof *p->later_timer);
  if (!p->conninfo || !p->later_timer || uv_timer_init(loop, p->later_timer) != 0) {
    free(p->later_timer);
    free(p->conninfo);
    free(p);
    return -1;
  }
  p->later_timer->data = p;
  if (p->slow_ms > 0 && qtg_pg_slow_start(p) != 0) {
    uv_close((uv_handle_t *)p->later_timer, qtg_pg_poll_closed);
    free(p->conninfo);
    free(p);
    return -1;
  }
  *out = p;
  return 0;
}

void qtg_pg_pool_on_commit(qtg_pg_pool *p, qtg_pg_notify_cb cb, void *data) {
  p->committed = cb;
  p->committed_data = data;
}

void qtg_pg_pool_on_read_only(qtg_pg_pool *p, void (*cb)(void *data), void *data) {
  p->read_only = cb;
  p->read_only_data = data;
}

void qtg_pg_pool_free(qtg_pg_pool *p) {
  if (!p) return;
  if (p->slow_timer) uv_close((uv_handle_t *)p->slow_timer, qtg_pg_poll_closed);
  uv_close((uv_handle_t *)p->later_timer, qtg_pg_poll_closed);
  while (p->conns) {
    qtg_pg_conn *c = p->conns;
    p->conns = c->next;
    qtg_pg_slow_end(c, "abandoned", NULL);
    if (c->has_cb && p->drop && c->data) p->drop(c->data); /* internal commands carry no data */
    qtg_pg_conn_free(c);
  }
  while (p->whead) {
    qtg_pg_waiter *w = p->whead;
    p->whead = w->next;
    if (p->drop && w->data) p->drop(w->data);
    free(w);
  }
  free(p->conninfo);
  free(p);
}

/* The waiters a connection would serve now: all but the share's past its
 * bound (those wait for one of the share's to come back, not for a new
 * connection, and a connect made for them would fail them when refused). */
static int qtg_pg_eligible_waiters(const qtg_pg_pool *p) {
  int plain = 0, share = 0;
  for (const qtg_pg_waiter *w = p->whead; w; w = w->next) {
    if (w->in_share) share++;
    else plain++;
  }
  int room = p->share_size - p->nshare_in_use;
  return plain + (share < room ? share : (room > 0 ? room : 0));
}

static int qtg_pg_pool_grow(qtg_pg_pool *p) {
  int wanted = qtg_pg_eligible_waiters(p);
  while (p->nconns < p->size && p->nconnecting < wanted) {
    qtg_pg_conn *c = qtg_pg_conn_start(p->loop, p->conninfo, p, NULL, p->last_error, sizeof p->last_error);
    if (!c) return -1;
    c->next = p->conns;
    p->conns = c;
    p->nconns++;
    p->nconnecting++;
  }
  return 0;
}

/* Mark c in use by an acquire (the share's when in_share). */
static void qtg_pg_hand_over(qtg_pg_pool *p, qtg_pg_conn *c, int in_share) {
  c->in_use = 1;
  c->in_share = in_share;
  p->nin_use++;
  if (in_share) p->nshare_in_use++;
}

/* The longest waiter that may have a connection now (the share's only
 * while it holds fewer than its bound), unlinked; NULL when none may. */
static qtg_pg_waiter *qtg_pg_next_waiter(qtg_pg_pool *p) {
  qtg_pg_waiter *prev = NULL;
  for (qtg_pg_waiter *w = p->whead; w; prev = w, w = w->next) {
    if (w->in_share && p->nshare_in_use >= p->share_size) continue;
    if (prev) prev->next = w->next;
    else p->whead = w->next;
    if (p->wtail == w) p->wtail = prev;
    p->nwaiters--;
    return w;
  }
  return NULL;
}

static void qtg_pg_pool_conn_ready(qtg_pg_conn *c) {
  qtg_pg_pool *p = c->pool;
  qtg_pg_waiter *w = qtg_pg_next_waiter(p);
  if (w) {
    qtg_pg_hand_over(p, c, w->in_share);
    w->cb(c, NULL, w->data);
    free(w);
    return;
  }
  p->nidle++;
}

/* Hand idle connections to the waiters that may have them now. */
static void qtg_pg_serve_idle(qtg_pg_pool *p) {
  for (qtg_pg_conn *c = p->conns; c && p->nidle > 0 && p->nwaiters > 0; c = c->next) {
    if (c->state != QTG_PG_IDLE || c->in_use) continue;
    qtg_pg_waiter *w = qtg_pg_next_waiter(p);
    if (!w) return;
    p->nidle--;
    qtg_pg_hand_over(p, c, w->in_share);
    w->cb(c, NULL, w->data);
    free(w);
    return; /* the waiter's task ran and may have changed the list: one at a time */
  }
}

int qtg_pg_acquire(qtg_pg_pool *p, int in_share, qtg_pg_acquire_cb cb, void *data, qtg_pg_conn **out) {
  *out = NULL;
  in_share = in_share ? 1 : 0;
  if (p->nidle > 0 && !(in_share && p->nshare_in_use >= p->share_size)) {
    qtg_pg_conn *next;
    for (qtg_pg_conn *c = p->conns; c; c = next) {
      next = c->next;
      if (c->state == QTG_PG_IDLE && !c->in_use) {
        /* A server restart leaves its goodbye in the socket before our
         * poll callback runs: read it now rather than hand out a corpse. */
        if (!PQconsumeInput(c->pg) || PQstatus(c->pg) == CONNECTION_BAD ||
            c->after_commit_asked != (p->committed != NULL) || qtg_pg_stale(c)) {
          qtg_pg_conn_destroy(c); /* or opened before after-commit notifications were switched */
          continue;
        }
        p->nidle--;
        qtg_pg_hand_over(p, c, in_share);
        *out = c;
        return 1;
      }
    }
  }
  qtg_pg_waiter *w = calloc(1, sizeof *w);
  if (!w) return -1;
  w->cb = cb;
  w->data = data;
  w->in_share = in_share;
  if (p->wtail) p->wtail->next = w;
  else p->whead = w;
  p->wtail = w;
  p->nwaiters++;
  if (qtg_pg_pool_grow(p) != 0 && p->nconnecting == 0 && p->nconns == 0) {
    qtg_pg_acquire_cancel(p, data);
    return -1;
  }
  return 0;
}

const char *qtg_pg_pool_last_error(const qtg_pg_pool *p) { return p->last_error; }

void qtg_pg_acquire_cancel(qtg_pg_pool *p, void *data) {
  qtg_pg_waiter *prev = NULL;
  for (qtg_pg_waiter *w = p->whead; w; prev = w, w = w->next) {
    if (w->data != data) continue;
    if (prev) prev->next = w->next;
    else p->whead = w->next;
    if (p->wtail == w) p->wtail = prev;
    p->nwaiters--;
    free(w);
    return;
  }
}

static void qtg_pg_release_after_rollback(qtg_pg_conn *c, PGresult *res, const char *err, void *data) {
  (void)data;
  if (err || !res || (PQresultStatus(res) != PGRES_COMMAND_OK && PQresultStatus(res) != PGRES_PIPELINE_SYNC)) {
    c->state = QTG_PG_BROKEN;
  }
  c->in_use = 1; /* still counted as in use until handed back below */
  qtg_pg_release(c);
}

void qtg_pg_release(qtg_pg_conn *c) {
  qtg_pg_pool *p = c->pool;
  if (!c->in_use) return;
  if (c->state == QTG_PG_BROKEN || c->state == QTG_PG_BUSY || PQstatus(c->pg) == CONNECTION_BAD ||
      qtg_pg_stale(c)) {
    int was_share = c->in_share;
    qtg_pg_conn_destroy(c);
    /* a waiter of the share may have room now, on an idle connection */
    if (was_share) qtg_pg_serve_idle(p);
    /* a waiter may need a new connection now */
    if (p->nwaiters > 0 && qtg_pg_pool_grow(p) != 0)
      qtg_log_warn("cannot open a PostgreSQL connection: %s", p->last_error);
    return;
  }
  if (c->pipe != QTG_PG_PIPE_OFF) {
    if (qtg_pg_pipeline_end(c, 0, qtg_pg_release_after_rollback, NULL) != 0) {
      c->state = QTG_PG_BROKEN;
      qtg_pg_release(c);
    }
    return;
  }
  if (PQtransactionStatus(c->pg) != PQTRANS_IDLE) {
    if (qtg_pg_exec(c, "ROLLBACK", qtg_pg_release_after_rollback, NULL) != 0) {
      c->state = QTG_PG_BROKEN;
      qtg_pg_release(c);
    }
    return;
  }
  if (c->after_commit_asked != (p->committed != NULL)) {
    c->state = QTG_PG_BROKEN; /* opened before after-commit notifications were switched */
    qtg_pg_release(c);
    return;
  }
  c->in_use = 0;
  p->nin_use--;
  if (c->in_share) p->nshare_in_use--;
  c->in_share = 0;
  qtg_pg_pool_conn_ready(c);
}

/* The deferred releases, one at a time from the list's head: a release
 * may hand the connection to a waiter whose task runs at once and changes
 * the list. */
static void qtg_pg_release_deferred(uv_timer_t *t) {
  qtg_pg_pool *p = t->data;
  while (p->nlater > 0) {
    qtg_pg_conn *c = p->conns;
    while (c && !c->release_later) c = c->next;
    if (!c) break;
    c->release_later = 0;
    p->nlater--;
    qtg_pg_release(c);
  }
  p->nlater = 0;
}

void qtg_pg_release_later(qtg_pg_conn *c) {
  qtg_pg_pool *p = c->pool;
  if (!c->in_use || c->release_later) return;
  c->release_later = 1;
  p->nlater++;
  if (uv_timer_start(p->later_timer, qtg_pg_release_deferred, 0, 0) != 0) {
    /* cannot happen for a started pool's timer; better late than never */
    qtg_log_warn("cannot defer a PostgreSQL connection's release: releasing it now");
    c->release_later = 0;
    p->nlater--;
    qtg_pg_release(c);
  }
}

void qtg_pg_discard(qtg_pg_conn *c) {
  if (!c->in_use) return;
  if (c->state == QTG_PG_IDLE) c->state = QTG_PG_BROKEN; /* release destroys a broken one */
  qtg_pg_release(c);
}

/* ---- commands ---------------------------------------------------------------- */

/* sql: what the slow-statement watch names the command by; commit: it
 * ends its transaction with a commit. */
static int qtg_pg_begin_command(qtg_pg_conn *c, qtg_pg_result_cb cb, void *data, const char *sql, int commit) {
  if (c->state != QTG_PG_IDLE) return -1;
  qtg_pg_slow_arm(c, sql, commit);
  c->state = QTG_PG_BUSY;
  c->cb = cb;
  c->data = data;
  c->has_cb = 1;
  c->step = QTG_PG_STEP_RUN;
  return 0;
}

int qtg_pg_query(qtg_pg_conn *c, const char *sql, int nparams, const char *const *values, int prepare,
                 qtg_pg_result_cb cb, void *data) {
  if (c->state != QTG_PG_IDLE || qtg_pg_resync(c) != 0) return -1;
  if (qtg_pg_begin_command(c, cb, data, sql, 0) != 0) return -1;
  int idx = prepare ? qtg_pg_stmt_find(c, sql) : -1;
  c->pending_n = nparams;
  if (nparams > 0) {
    c->pending_values = calloc((size_t)nparams, sizeof *c->pending_values);
    if (!c->pending_values) goto fail;
    for (int i = 0; i < nparams; i++) {
      if (values[i] && !(c->pending_values[i] = strdup(values[i]))) goto fail;
    }
  }
  if (idx >= 0) {
    if (qtg_pg_send_prepared(c, idx) != 0) goto fail;
    return 0;
  }
  if (prepare) {
    c->pending_sql = strdup(sql);
    if (!c->pending_sql) goto fail;
    snprintf(c->pending_name, sizeof c->pending_name, "qtg%lu", c->stmt_serial++);
    if (c->nstmts >= QTG_PG_MAX_STMTS) {
      char cmd[64] = "DEALLOCATE ";
      qtg_pg_stmt_evict(c, cmd + strlen(cmd), sizeof cmd - strlen(cmd));
      c->step = QTG_PG_STEP_DEALLOCATE;
      if (qtg_pg_send_plain(c, cmd) != 0) goto fail;
    } else {
      c->step = QTG_PG_STEP_PREPARE;
      if (!PQsendPrepare(c->pg, c->pending_name, sql, nparams, NULL)) goto fail;
    }
  } else if (!PQsendQueryParams(c->pg, sql, nparams, NULL, (const char *const *)c->pending_values, NULL,
                                NULL, 0)) {
    goto fail;
  }
  if (qtg_pg_sent(c) != 0) goto fail;
  return 0;
fail:
  qtg_pg_pending_free(c);
  c->has_cb = 0;
  c->state = PQstatus(c->pg) == CONNECTION_BAD ? QTG_PG_BROKEN : QTG_PG_IDLE;
  return -1;
}

int qtg_pg_exec(qtg_pg_conn *c, const char *sql, qtg_pg_result_cb cb, void *data) {
  if (c->state != QTG_PG_IDLE || qtg_pg_resync(c) != 0) return -1;
  if (qtg_pg_begin_command(c, cb, data, sql, 0) != 0) return -1;
  int sent = c->pipe != QTG_PG_PIPE_OFF ? qtg_pg_send_plain(c, sql) == 0 : PQsendQuery(c->pg, sql) == 1;
  if (!sent || qtg_pg_sent(c) != 0) {
    c->has_cb = 0;
    c->state = PQstatus(c->pg) == CONNECTION_BAD ? QTG_PG_BROKEN : QTG_PG_IDLE;
    return -1;
  }
  return 0;
}

int qtg_pg_query_batch(qtg_pg_conn *c, int n, const char *const *sqls, const int *nparams,
                       const char *const *const *values, int commit, int ahead, qtg_pg_batch_cb cb,
                       void *data) {
  if (n < 1 || n > QTG_PG_BATCH_MAX || ahead < 0 || ahead >= n || (ahead && !commit)) return -1;
  if (c->state != QTG_PG_IDLE || c->pipe == QTG_PG_PIPE_OFF || c->pipe_failed) return -1;
  if (commit && c->pipe != QTG_PG_PIPE_IMPLICIT) return 1;
  int idx[QTG_PG_BATCH_MAX];
  for (int i = 0; i < n; i++)
    if ((idx[i] = qtg_pg_stmt_find(c, sqls[i])) < 0) return 1;
  if (qtg_pg_begin_command(c, NULL, data, sqls[0], commit) != 0) return -1;
  memcpy(c->batch_idx, idx, (size_t)n * sizeof *idx);
  c->bcb = cb;
  c->batch_n = n;
  c->batch_ahead = ahead;
  c->batch_done = 0;
  /* The Sync ends the batch's statements and commits: their results are
   * read as an end step's (qtg_pg_consume), each command's kept at its
   * NULL; the statements ahead follow it, read as a batch's once the
   * Sync's result is in (qtg_pg_ahead_begin). */
  int sent = 1;
  for (int i = 0; sent && i < n; i++) {
    if (commit && i == n - ahead) {
      sent = PQpipelineSync(c->pg) == 1;
      if (sent) c->pipe_syncs++;
    }
    c->stmts[idx[i]].used = ++c->stmt_clock;
    /* a statement not queued leaves the queued ones in libpq's buffer,
     * unsent: the pipeline is out of step with the caller then */
    sent = sent && PQsendQueryPrepared(c->pg, c->stmts[idx[i]].name, nparams[i], values[i], NULL, NULL, 0);
  }
  if (commit) {
    c->step = QTG_PG_STEP_SYNC;
    c->pipe_nulls = 0;
  }
  if (sent && commit && !ahead) {
    sent = PQpipelineSync(c->pg) == 1;
    if (sent) c->pipe_syncs++;
    sent = sent && qtg_pg_flush(c) == 0;
  } else if (sent) {
    sent = qtg_pg_sent(c) == 0;
  }
  if (!sent) {
    c->has_cb = 0;
    c->bcb = NULL;
    c->batch_n = c->batch_ahead = 0;
    c->state = QTG_PG_BROKEN;
    return -1;
  }
  return 0;
}

/* ---- pipeline transactions ------------------------------------------------- */

int qtg_pg_pipeline_begin(qtg_pg_conn *c) {
  if (c->state != QTG_PG_IDLE || c->pipe != QTG_PG_PIPE_OFF || PQtransactionStatus(c->pg) != PQTRANS_IDLE)
    return -1;
  if (!PQenterPipelineMode(c->pg)) return -1;
  c->pipe = QTG_PG_PIPE_IMPLICIT;
  c->pipe_failed = 0;
  c->pipe_syncs = 0;
  return 0;
}

int qtg_pg_pipeline_block(qtg_pg_conn *c, qtg_pg_result_cb cb, void *data) {
  if (c->pipe != QTG_PG_PIPE_IMPLICIT || c->pipe_failed) return -1;
  if (qtg_pg_exec(c, "BEGIN", cb, data) != 0) return -1;
  c->pipe = QTG_PG_PIPE_BLOCK;
  return 0;
}

/* The statements that end the transaction go with the Sync in one flush: a
 * COMMIT (block) or nothing (implicit: the Sync commits); a ROLLBACK, after
 * a BEGIN when implicit (a ROLLBACK outside a block warns); nothing after a
 * failure (the server rolls back at the Sync).  The first error among them,
 * else the Sync's result, is delivered. */
int qtg_pg_pipeline_end(qtg_pg_conn *c, int commit, qtg_pg_result_cb cb, void *data) {
  if (c->pipe == QTG_PG_PIPE_OFF) return -1;
  if (qtg_pg_begin_command(c, cb, data, commit ? "COMMIT" : "ROLLBACK", commit) != 0) return -1;
  c->step = QTG_PG_STEP_SYNC;
  c->pipe_nulls = 0;
  int ok = qtg_pg_resync(c) == 0 || c->pipe == QTG_PG_PIPE_IMPLICIT;
  if (ok && !c->pipe_failed) {
    /* a failed block's COMMIT answers ROLLBACK (the caller knew it failed) */
    if (commit && c->pipe == QTG_PG_PIPE_BLOCK) ok = qtg_pg_send_plain(c, "COMMIT") == 0;
    if (!commit && c->pipe == QTG_PG_PIPE_IMPLICIT) ok = qtg_pg_send_plain(c, "BEGIN") == 0;
    if (ok && !commit) ok = qtg_pg_send_plain(c, "ROLLBACK") == 0;
  }
  if (ok) {
    ok = PQpipelineSync(c->pg) == 1;
    if (ok) c->pipe_syncs++;
  }
  if (!ok || qtg_pg_flush(c) != 0) {
    c->has_cb = 0;
    c->state = QTG_PG_BROKEN; /* the pipeline's state is unknown now */
    return -1;
  }
  return 0;
}

int qtg_pg_pipeline_failed(const qtg_pg_conn *c) { return c->pipe_failed; }
int qtg_pg_pipelined(const qtg_pg_conn *c) { return (int)c->pipe; }

void qtg_pg_forget(qtg_pg_conn *c) {
  c->has_cb = 0;
  c->cb = NULL;
  /* The end of the stream is read back as a lost connection (BROKEN). */
  int fd = c->pg ? PQsocket(c->pg) : -1;
  if (fd >= 0) (void)shutdown(fd, SHUT_RDWR);
}

void *qtg_pg_waiting_data(const qtg_pg_conn *c) { return c->has_cb ? c->data : NULL; }

int qtg_pg_busy(const qtg_pg_conn *c) { return c->state == QTG_PG_BUSY; }
int qtg_pg_broken(const qtg_pg_conn *c) { return c->state == QTG_PG_BROKEN; }
PGTransactionStatusType qtg_pg_txn_status(const qtg_pg_conn *c) {
  if (c->pipe != QTG_PG_PIPE_OFF) return c->pipe_failed ? PQTRANS_INERROR : PQTRANS_INTRANS;
  return PQtransactionStatus(c->pg);
}
int qtg_pg_backend_pid(const qtg_pg_conn *c) { return PQbackendPID(c->pg); }

void qtg_pg_pool_stats(const qtg_pg_pool *p, int *size, int *open, int *in_use, int *waiting) {
  *size = p->size;
  *open = p->nconns;
  *in_use = p->nin_use;
  *waiting = p->nwaiters;
}

void qtg_pg_pool_share_stats(const qtg_pg_pool *p, int *size, int *in_use, int *waiting) {
  *size = p->share_size;
  *in_use = p->nshare_in_use;
  *waiting = 0;
  for (const qtg_pg_waiter *w = p->whead; w; w = w->next) *waiting += w->in_share;
}

/* ---- listener ---------------------------------------------------------------- */

static void qtg_pg_listener_connect(qtg_pg_listener *l);

static void qtg_pg_listener_retry(uv_timer_t *t) { qtg_pg_listener_connect(t->data); }

static void qtg_pg_listener_schedule(qtg_pg_listener *l) {
  if (uv_timer_start(l->retry, qtg_pg_listener_retry, 1000, 0) != 0)
    qtg_log_error("listener: cannot arm the reconnect timer");
}

static void qtg_pg_listener_connect(qtg_pg_listener *l) {
  char err[256];
  l->conn = qtg_pg_conn_start(l->loop, l->conninfo, NULL, l, err, sizeof err);
  if (!l->conn) {
    qtg_log_warn("listener: %s; retrying in 1 s", err);
    qtg_pg_listener_schedule(l);
  }
}

static void qtg_pg_listener_send(qtg_pg_listener *l);

static void qtg_pg_listener_listened(qtg_pg_conn *c, PGresult *res, const char *err, void *data) {
  qtg_pg_listener *l = data;
  (void)c;
  if (err || !res || PQresultStatus(res) != PGRES_COMMAND_OK) {
    qtg_log_warn("listener: LISTEN failed: %s", err ? err : res ? PQresultErrorMessage(res) : "?");
    return;
  }
  if (l->relisten) {
    qtg_pg_listener_send(l);
    return;
  }
  qtg_pg_listener_drain(l);
  /* After a reconnect, NOTIFYs sent while we were away are lost: tell the
   * owners so they can poll once. */
  if (l->connected_once > 1)
    for (int i = 0; i < l->nchannels; i++) l->cb(l->channels[i], NULL, l->data);
}

static void qtg_pg_listener_send(qtg_pg_listener *l) {
  qtg_pg_conn *c = l->conn;
  if (!c || c->state != QTG_PG_IDLE) {
    l->relisten = 1;
    return;
  }
  l->relisten = 0;
  size_t cap = 32;
  for (int i = 0; i < l->nchannels; i++) cap += strlen(l->channels[i]) * 2 + 16;
  char *sql = malloc(cap);
  if (!sql) return;
  size_t off = 0;
  sql[0] = '\0';
  for (int i = 0; i < l->nchannels; i++) {
    char *id = PQescapeIdentifier(c->pg, l->channels[i], strlen(l->channels[i]));
    if (!id) continue;
    off += (size_t)snprintf(sql + off, cap - off, "LISTEN %s;", id);
    PQfreemem(id);
  }
  if (off == 0) snprintf(sql, cap, "SELECT 1");
  if (qtg_pg_exec(c, sql, qtg_pg_listener_listened, l) != 0) qtg_pg_conn_fail(c, PQerrorMessage(c->pg));
  free(sql);
}

static void qtg_pg_listener_conn_ready(qtg_pg_listener *l) {
  l->connected_once++;
  qtg_pg_listener_send(l);
}

static void qtg_pg_listener_conn_lost(qtg_pg_listener *l) {
  qtg_log_warn("listener connection lost; reconnecting in 1 s");
  qtg_pg_conn *c = l->conn;
  l->conn = NULL;
  if (c) {
    c->has_cb = 0;
    qtg_pg_conn_free(c);
  }
  qtg_pg_listener_schedule(l);
}

/* Notifications read together are delivered once per distinct channel and
 * payload.  PostgreSQL folds identical ones within a transaction; under
 * load the wake-up channel carries the same few payloads from many
 * transactions at once, and each delivery costs a task in Lua.  Up to
 * QTG_PG_FOLD distinct ones are held per read, in arrival order; a full
 * set is delivered before the next is held. */
#define QTG_PG_FOLD 32

static const char *qtg_pg_notify_payload(const PGnotify *n) { return n->extra ? n->extra : ""; }

static int qtg_pg_notify_same(const PGnotify *a, const PGnotify *b) {
  return strcmp(a->relname, b->relname) == 0 && strcmp(qtg_pg_notify_payload(a), qtg_pg_notify_payload(b)) == 0;
}

static void qtg_pg_listener_deliver(qtg_pg_listener *l, PGnotify **held, int *nheld) {
  for (int i = 0; i < *nheld; i++) {
    l->cb(held[i]->relname, qtg_pg_notify_payload(held[i]), l->data);
    PQfreemem(held[i]);
  }
  *nheld = 0;
}

static void qtg_pg_listener_drain(qtg_pg_listener *l) {
  PGnotify *held[QTG_PG_FOLD];
  int nheld = 0;
  PGnotify *n;
  while (l->conn && (n = PQnotifies(l->conn->pg)) != NULL) {
    int same = 0;
    for (int i = 0; i < nheld && !same; i++) same = qtg_pg_notify_same(held[i], n);
    if (same) {
      PQfreemem(n);
      continue;
    }
    if (nheld == QTG_PG_FOLD) qtg_pg_listener_deliver(l, held, &nheld);
    held[nheld++] = n;
  }
  qtg_pg_listener_deliver(l, held, &nheld);
}

int qtg_pg_listener_new(uv_loop_t *loop, const char *conninfo, int tcp_timeout, qtg_pg_notify_cb cb,
                        void *data, qtg_pg_listener **out) {
  qtg_pg_listener *l = calloc(1, sizeof *l);
  if (!l) return -1;
  l->loop = loop;
  l->tcp_timeout = tcp_timeout;
  l->cb = cb;
  l->data = data;
  l->conninfo = strdup(conninfo);
  l->retry = malloc(sizeof *l->retry);
  if (!l->conninfo || !l->retry || uv_timer_init(loop, l->retry) != 0) {
    free(l->conninfo);
    free(l->retry);
    free(l);
    return -1;
  }
  l->retry->data = l;
  qtg_pg_listener_connect(l);
  *out = l;
  return 0;
}

int qtg_pg_listener_add(qtg_pg_listener *l, const char *channel) {
  for (int i = 0; i < l->nchannels; i++)
    if (strcmp(l->channels[i], channel) == 0) return 0;
  char **ch = realloc(l->channels, (size_t)(l->nchannels + 1) * sizeof *ch);
  if (!ch) return -1;
  l->channels = ch;
  if (!(ch[l->nchannels] = strdup(channel))) return -1;
  l->nchannels++;
  qtg_pg_listener_send(l);
  return 0;
}

int qtg_pg_listener_remove(qtg_pg_listener *l, const char *channel) {
  for (int i = 0; i < l->nchannels; i++) {
    if (strcmp(l->channels[i], channel) != 0) continue;
    free(l->channels[i]);
    l->channels[i] = l->channels[--l->nchannels];
    /* UNLISTEN is not worth a round trip: stray NOTIFYs are dropped by the owner. */
    return 0;
  }
  return -1;
}

void qtg_pg_listener_reconnect(qtg_pg_listener *l) {
  if (l && l->conn) qtg_pg_conn_fail(l->conn, "its pool found the server read-only");
}

void qtg_pg_listener_free(qtg_pg_listener *l) {
  if (!l) return;
  if (l->conn) qtg_pg_conn_free(l->conn);
  uv_close((uv_handle_t *)l->retry, qtg_pg_poll_closed);
  for (int i = 0; i < l->nchannels; i++) free(l->channels[i]);
  free(l->channels);
  free(l->conninfo);
  free(l);
}
