/* test_console.c -- the operator console end to end: a real `qtgd run` on a
 * real PostgreSQL, driven through its Unix socket by `qtgd console -e`,
 * by piped standard input, and by a raw client speaking the frame format
 * (qtg_console.h) for what a well-behaved client never sends.
 *
 * What it shows: eval through the socket (values, printing, errors with
 * tracebacks, incomplete chunks, piped input); the worker commands on a
 * running daemon's workers (pause, tick, resume, audited as console:<uid>);
 * live reload (a
 * changed interval, an added and a removed worker, a syntax error and a
 * load-time error that leave the old code running with file and line, a
 * reload while a tick runs, SIGHUP); the uid check (a throwaway user made
 * with useradd, the client run with runuser); two consoles at once and a
 * long query while the workers keep ticking; bad input (garbage, an
 * oversized frame, an unknown frame, a client that disconnects mid-command,
 * a command that errors); interrupts; the client's messages when no daemon
 * runs; MG_CONSOLE_ENABLED=false.  The request, lifecycle and signer
 * commands are called in process by spec/lua/console/console_lifecycle_spec.lua.
 *
 * Needs QTG_BIN (the qtgd binary) and QTG_ROOT; the database is
 * MG_DATABASE_URL, else `tools/pg --dir <root>/var/test-console-pg --fast
 * ensure`.  The daemon runs with its own MG_RUN_DIR and an override policy
 * directory (MG_LUA_PATH) holding a probe worker that records its passes in
 * the table console_probe_ticks.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "qtg_console.h"
#include "qtg_console_session.h"
#include "qtg_test.h"

static qtg_test_counts tc;

#define TEST_USER "qtg-console-test"

typedef struct {
  const char *bin, *root;
  char tmp[PATH_MAX];
  char run_dir[PATH_MAX + 16];
  char sock[PATH_MAX + 32];
  char over[PATH_MAX + 16];
  char log[PATH_MAX + 16];
  char db_url[1024];
  pid_t daemon;
  PGconn *pg;
} fixture;

/* ---- small helpers ----------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static int write_file(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int write_file(const char *path, const char *fmt, ...) {
  char tmp[PATH_MAX + 8];
  snprintf(tmp, sizeof tmp, "%s.new", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return -1;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  if (fclose(f) != 0) return -1;
  return rename(tmp, path);   /* atomic: a reload never sees half a file */
}

static int contains(const char *hay, const char *needle) {
  return hay && needle && strstr(hay, needle) != NULL;
}

#define CHECK_HAS(hay, needle)                                                        \
  do {                                                                                \
    if (contains((hay), (needle))) {                                                  \
      tc.passed++;                                                                    \
    } else {                                                                          \
      tc.failed++;                                                                    \
      fprintf(stderr, "%s:%d: expected to find \"%s\" in:\n%s\n", __FILE__, __LINE__, \
              (needle), (hay) ? (hay) : "(null)");                                    \
    }                                                                                 \
  } while (0)

#define CHECK_LACKS(hay, needle)                                                          \
  do {                                                                                    \
    if (!contains((hay), (needle))) {                                                     \
      tc.passed++;                                                                        \
    } else {                                                                              \
      tc.failed++;                                                                        \
      fprintf(stderr, "%s:%d: did not expect \"%s\" in:\n%s\n", __FILE__, __LINE__,       \
              (needle), (hay));                                                           \
    }                                                                                     \
  } while (0)

/* ---- processes --------------------------------------------------------------- */

typedef struct {
  int status;      /* exit status, or 128+signal, or -1 */
  char *out, *err;
} result;

static void result_free(result *r) {
  free(r->out);
  free(r->err);
  r->out = r->err = NULL;
}

static void append(char **buf, size_t *len, const char *data, size_t n) {
  char *p = realloc(*buf, *len + n + 1);
  if (!p) return;
  memcpy(p + *len, data, n);
  *len += n;
  p[*len] = 0;
  *buf = p;
}

/* Run argv with stdin from `input` (NULL: /dev/null), capture stdout and
 * stderr; kill it after timeout seconds. */
static result run(const char *input, double timeout, char *const argv[]) {
  result r = {.status = -1};
  int in[2], out[2], err[2];
  size_t olen = 0, elen = 0;
  if (pipe(in) != 0 || pipe(out) != 0 || pipe(err) != 0) return r;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    close(in[1]);
    close(out[0]);
    close(err[0]);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  close(err[1]);
  if (input) {
    size_t n = strlen(input), off = 0;
    signal(SIGPIPE, SIG_IGN);
    while (off < n) {
      ssize_t w = write(in[1], input + off, n - off);
      if (w <= 0) break;
      off += (size_t)w;
    }
  }
  close(in[1]);
  append(&r.out, &olen, "", 0);
  append(&r.err, &elen, "", 0);
  double deadline = now_s() + timeout;
  int open_fds = 2;
  while (open_fds > 0) {
    struct pollfd p[2] = {{.fd = out[0], .events = POLLIN}, {.fd = err[0], .events = POLLIN}};
    int left = (int)((deadline - now_s()) * 1000);
    if (left <= 0) {
      kill(pid, SIGKILL);
      fprintf(stderr, "timeout running %s\n", argv[0]);
      break;
    }
    if (poll(p, 2, left) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; i++) {
      if (p[i].fd >= 0 && (p[i].revents & (POLLIN | POLLHUP))) {
        char buf[4096];
        ssize_t n = read(p[i].fd, buf, sizeof buf);
        if (n <= 0) {
          close(i == 0 ? out[0] : err[0]);
          if (i == 0) out[0] = -1; else err[0] = -1;
          open_fds--;
        } else if (i == 0) {
          append(&r.out, &olen, buf, (size_t)n);
        } else {
          append(&r.err, &elen, buf, (size_t)n);
        }
      }
    }
    if (out[0] < 0 && err[0] < 0) break;
    /* poll ignores negative fds: keep the array consistent */
  }
  if (out[0] >= 0) close(out[0]);
  if (err[0] >= 0) close(err[0]);
  int st;
  if (waitpid(pid, &st, 0) == pid)
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

/* `qtgd console --socket SOCK -e CODE` */
static result console_e(fixture *f, const char *code) {
  char *const argv[] = {(char *)f->bin, "console", "--socket", f->sock, "-e", (char *)code, NULL};
  return run(NULL, 60, argv);
}

/* Run code; check it succeeded; return its stdout (caller frees). */
static char *console_ok(fixture *f, const char *code, int line) {
  result r = console_e(f, code);
  if (r.status != 0) {
    tc.failed++;
    fprintf(stderr, "%s:%d: console -e '%s' exited %d\nstdout: %s\nstderr: %s\n", __FILE__, line, code,
            r.status, r.out, r.err);
  } else {
    tc.passed++;
  }
  free(r.err);
  return r.out;
}
#define CONSOLE_OK(f, code) console_ok((f), (code), __LINE__)

/* ---- database ---------------------------------------------------------------- */

static int pg_ok(fixture *f, const char *sql) {
  PGresult *res = PQexec(f->pg, sql);
  int ok = PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK;
  if (!ok) fprintf(stderr, "SQL failed: %s\n%s", sql, PQerrorMessage(f->pg));
  PQclear(res);
  return ok;
}

/* First column of the first row, as a malloc'd string ("" for NULL). */
static char *pg_str(fixture *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *pg_str(fixture *f, const char *fmt, ...) {
  char sql[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sql, sizeof sql, fmt, ap);
  va_end(ap);
  PGresult *res = PQexec(f->pg, sql);
  char *out = NULL;
  if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) > 0)
    out = strdup(PQgetvalue(res, 0, 0));
  else if (PQresultStatus(res) != PGRES_TUPLES_OK)
    fprintf(stderr, "SQL failed: %s\n%s", sql, PQerrorMessage(f->pg));
  PQclear(res);
  return out;
}

static long pg_long(fixture *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static long pg_long(fixture *f, const char *fmt, ...) {
  char sql[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sql, sizeof sql, fmt, ap);
  va_end(ap);
  char *s = pg_str(f, "%s", sql);
  long v = s ? strtol(s, NULL, 10) : -1;
  free(s);
  return v;
}

/* Audit rows (outbox, or already promoted) matching a condition. */
static long audit_count(fixture *f, const char *actor, const char *action, const char *entity_id) {
  return pg_long(f,
                 "SELECT count(*) FROM (SELECT id FROM audit_outbox WHERE actor = '%s' AND action = '%s' "
                 "AND entity_id = '%s' UNION SELECT outbox_id FROM audit_events WHERE actor = '%s' AND "
                 "action = '%s' AND entity_id = '%s') x",
                 actor, action, entity_id, actor, action, entity_id);
}

/* Wait until a SQL count reaches at least `want`. */
static long wait_count(fixture *f, long want, double timeout, const char *sql) {
  double deadline = now_s() + timeout;
  long v;
  do {
    v = pg_long(f, "%s", sql);
    if (v >= want) return v;
    sleep_s(0.1);
  } while (now_s() < deadline);
  return v;
}

/* ---- the raw client ------------------------------------------------------------- */

static int raw_connect(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

static int raw_write(int fd, const void *data, size_t len) {
  const char *p = data;
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n <= 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static int raw_send(int fd, int type, const char *data) {
  unsigned char hdr[5];
  size_t len = data ? strlen(data) : 0;
  qtg_console_frame_header(hdr, type, len);
  if (raw_write(fd, hdr, 5) != 0) return -1;
  return len ? raw_write(fd, data, len) : 0;
}

static int raw_read(int fd, void *buf, size_t len, double deadline) {
  char *p = buf;
  while (len) {
    int left = (int)((deadline - now_s()) * 1000);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (left <= 0 || poll(&pfd, 1, left) <= 0) return -1;
    ssize_t n = read(fd, p, len);
    if (n <= 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Next frame: type and payload (malloc'd, NUL-terminated); -1 on close or
 * timeout. */
static int raw_frame(int fd, int *type, char **data, double timeout) {
  double deadline = now_s() + timeout;
  unsigned char hdr[5];
  *data = NULL;
  if (raw_read(fd, hdr, 5, deadline) != 0) return -1;
  uint32_t n = ((uint32_t)hdr[0] << 24) | ((uint32_t)hdr[1] << 16) | ((uint32_t)hdr[2] << 8) | hdr[3];
  if (n < 1 || n > QTG_CONSOLE_MAX_FRAME_OUT) return -1;
  *type = hdr[4];
  *data = calloc(1, n);
  if (!*data) return -1;
  if (n > 1 && raw_read(fd, *data, n - 1, deadline) != 0) {
    free(*data);
    *data = NULL;
    return -1;
  }
  return 0;
}

/* The final frame of a request (output frames are collected into *out). */
static int raw_final(int fd, int *type, char **data, char **out, double timeout) {
  size_t olen = 0;
  if (out) *out = NULL;
  for (;;) {
    if (raw_frame(fd, type, data, timeout) != 0) return -1;
    if (*type != QTG_CONSOLE_OUTPUT) return 0;
    if (out) append(out, &olen, *data, strlen(*data));
    free(*data);
  }
}

/* Connect and read the hello frame. */
static int raw_session(fixture *f) {
  int fd = raw_connect(f->sock);
  if (fd < 0) return -1;
  int type;
  char *data;
  if (raw_frame(fd, &type, &data, 10) != 0 || type != QTG_CONSOLE_HELLO) {
    free(data);
    close(fd);
    return -1;
  }
  free(data);
  return fd;
}

/* True when the peer closed the connection (EOF within timeout). */
static int raw_closed(int fd, double timeout) {
  double deadline = now_s() + timeout;
  char buf[256];
  for (;;) {
    int left = (int)((deadline - now_s()) * 1000);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (left <= 0 || poll(&pfd, 1, left) <= 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf);
    if (n == 0) return 1;
    if (n < 0) return errno == ECONNRESET;
  }
}

/* ---- the daemon -------------------------------------------------------------------- */

static const char probe_fmt[] =
    "-- console test probe worker (%s)\n"
    "local qtg = require('qtg')\n"
    "local M = { VERSION = '%s' }\n"
    "function M.tick(s)\n"
    "  local id = s:query('INSERT INTO console_probe_ticks (version) VALUES ($1) RETURNING id',\n"
    "                     M.VERSION)[1].id\n"
    "  qtg.sleep(%g)\n"
    "  s:query('UPDATE console_probe_ticks SET finished_at = clock_timestamp() WHERE id = $1', id)\n"
    "  return 1\n"
    "end\n"
    "%s\n"
    "return M\n";

static int write_probe(fixture *f, const char *version, double sleep, const char *extra) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/qtg/console_probe.lua", f->over);
  return write_file(path, probe_fmt, version, version, sleep, extra ? extra : "");
}

static const char registry_fmt[] =
    "-- console test registry: the packaged one plus the probe worker(s)\n"
    "local qtg = require('qtg')\n"
    "local base = assert(loadfile(qtg.root .. '/lua/qtg/workers/init.lua'))()\n"
    "local M = { rows = base.rows }\n"
    "function M.registry(settings)\n"
    "  local out = base.registry(settings)\n"
    "  out[#out + 1] = { name = 'console_probe', group = 'sidecar', module = 'qtg.console_probe',\n"
    "                    interval = %g, jitter = 0, enabled = true }\n"
    "  %s\n"
    "  return out\n"
    "end\n"
    "return M\n";

static int write_registry(fixture *f, double interval, const char *extra) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/qtg/workers/init.lua", f->over);
  return write_file(path, registry_fmt, interval, extra ? extra : "");
}

/* The operator's override of the observe intervals: the packaged policy
 * with protocol_observe changed. */
static int write_observe_intervals(fixture *f, double protocol_observe) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/qtg/observe_intervals.lua", f->over);
  return write_file(path,
                    "-- console test override of the observe intervals\n"
                    "local qtg = require('qtg')\n"
                    "local M = assert(loadfile(qtg.root .. '/lua/qtg/observe_intervals.lua'))()\n"
                    "M.DEFAULT_OBSERVE_INTERVALS.protocol_observe = %g\n"
                    "return M\n", protocol_observe);
}

static const char observe_template[] =
    "{\n"
    "  \"template_key\": \"console_observe_probe\",\n"
    "  \"name\": \"console test: one long observation\",\n"
    "  \"intent\": {\"required\": [\"amount\"], \"types\": {\"amount\": \"decimal\"}},\n"
    "  \"nodes\": [{\"key\": \"watch\", \"kind\": \"observe\", \"action_type\": \"protocol_observe\",\n"
    "             \"config\": {\"sim\": {\"observes\": 100000}}}],\n"
    "  \"edges\": []\n"
    "}\n";

static pid_t start_daemon(fixture *f, const char *run_dir, const char *log, int console_enabled) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    setenv("MG_DATABASE_URL", f->db_url, 1);
    setenv("MG_RUN_DIR", run_dir, 1);
    setenv("MG_LUA_PATH", f->over, 1);
    setenv("MG_CONSOLE_ENABLED", console_enabled ? "true" : "false", 1);
    setenv("MG_NODE_DISPATCH_INTERVAL_SECONDS", "0.5", 1);
    setenv("MG_NODE_OBSERVE_INTERVAL_SECONDS", "0.5", 1);
    /* Polling at 0.5 s is enough here; NOTIFY wake-ups are tested on their
     * own (and their pending timers at exit are not this test's subject). */
    setenv("MG_WAKEUPS_ENABLED", "false", 1);
    setenv("MG_CONSOLE_IDLE_SECONDS", "2", 1);
    unsetenv("MG_CONSOLE_SOCKET");
    execl(f->bin, f->bin, "run", (char *)NULL);
    _exit(127);
  }
  return pid;
}

static int wait_for_socket(const char *path, pid_t pid, double timeout) {
  double deadline = now_s() + timeout;
  while (now_s() < deadline) {
    int fd = raw_connect(path);
    if (fd >= 0) {
      close(fd);
      return 0;
    }
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) return -1;
    sleep_s(0.1);
  }
  return -1;
}

static int stop_daemon(pid_t pid, double timeout) {
  int st;
  kill(pid, SIGTERM);
  double deadline = now_s() + timeout;
  while (now_s() < deadline) {
    if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    sleep_s(0.1);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  return -1;
}

static void dump_log(const char *log) {
  FILE *fp = fopen(log, "r");
  if (!fp) return;
  char line[2048];
  fprintf(stderr, "---- %s ----\n", log);
  while (fgets(line, sizeof line, fp)) fputs(line, stderr);
  fclose(fp);
}

/* ---- tests ------------------------------------------------------------------------ */

static void test_no_daemon(fixture *f) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/nothing.sock", f->tmp);
  char *const a1[] = {(char *)f->bin, "console", "--socket", path, "-e", "1", NULL};
  result r = run(NULL, 20, a1);
  CHECK(&tc, r.status == 2);
  CHECK_HAS(r.err, "no console socket at");
  CHECK_HAS(r.err, "is qtgd running?");
  result_free(&r);

  /* a socket file with nobody listening: what a killed daemon leaves */
  snprintf(path, sizeof path, "%s/stale.sock", f->tmp);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  CHECK(&tc, strlen(path) < sizeof sa.sun_path);
  memcpy(sa.sun_path, path, strlen(path) < sizeof sa.sun_path ? strlen(path) : 0);
  CHECK(&tc, fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
  close(fd);
  char *const a2[] = {(char *)f->bin, "console", "--socket", path, "-e", "1", NULL};
  r = run(NULL, 20, a2);
  CHECK(&tc, r.status == 2);
  CHECK_HAS(r.err, "refused the connection");
  CHECK_HAS(r.err, "not running");
  result_free(&r);

  char *const a3[] = {(char *)f->bin, "console", "--bogus", NULL};
  r = run(NULL, 20, a3);
  CHECK(&tc, r.status == 2);
  CHECK_HAS(r.err, "unknown or incomplete option '--bogus'");
  result_free(&r);

  char *const a4[] = {(char *)f->bin, "console", "-e", NULL};
  r = run(NULL, 20, a4);
  CHECK(&tc, r.status == 2);
  result_free(&r);
}

static void test_socket_modes(fixture *f) {
  struct stat st;
  CHECK(&tc, stat(f->run_dir, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
  CHECK(&tc, lstat(f->sock, &st) == 0 && S_ISSOCK(st.st_mode) && (st.st_mode & 0777) == 0600);
}

static void test_eval(fixture *f) {
  char *out = CONSOLE_OK(f, "=1 + 1");
  CHECK_STR(&tc, out, "2\n");
  free(out);

  char *const a1[] = {(char *)f->bin, "console", "--socket", f->sock,
                      "-e", "x = {b = 2, a = {1, 2}, s = 'q'}", "-e", "x", NULL};
  result r = run(NULL, 30, a1);
  CHECK(&tc, r.status == 0);
  CHECK_STR(&tc, r.out, "{ a = { 1, 2 }, b = 2, s = \"q\" }\n");
  result_free(&r);

  out = CONSOLE_OK(f, "local t = {name = 'n'}; t.self = t; return t");
  CHECK_STR(&tc, out, "{ name = \"n\", self = <cycle: root> }\n");
  free(out);

  out = CONSOLE_OK(f, "print('hello', 42)");
  CHECK_STR(&tc, out, "hello\t42\n");
  free(out);

  /* a fresh session does not see another session's variables */
  out = CONSOLE_OK(f, "=x");
  CHECK_STR(&tc, out, "nil\n");
  free(out);

  r = console_e(f, "local function inner() error('boom') end\ninner()");
  CHECK(&tc, r.status == 1);
  CHECK_HAS(r.err, "console:1: boom");
  CHECK_HAS(r.err, "stack traceback");
  CHECK_LACKS(r.err, "qtg/console/eval.lua");
  result_free(&r);

  char *const a2[] = {(char *)f->bin, "console", "--socket", f->sock,
                      "-e", "error('first')", "-e", "print('second')", NULL};
  r = run(NULL, 30, a2);
  CHECK(&tc, r.status == 1);
  CHECK_HAS(r.err, "first");
  CHECK_LACKS(r.out, "second");
  result_free(&r);

  r = console_e(f, "x = = 1");
  CHECK(&tc, r.status == 1);
  CHECK_HAS(r.err, "console:1:");
  result_free(&r);

  r = console_e(f, "for i = 1, 2 do");
  CHECK(&tc, r.status == 1);
  CHECK_HAS(r.err, "incomplete Lua in -e");
  result_free(&r);

  /* piped standard input: multi-line chunks, values of expressions */
  char *const a3[] = {(char *)f->bin, "console", "--socket", f->sock, NULL};
  r = run("x = 1\nfor i = 1, 2 do\n  print(i)\nend\n=x + 1\n\nfunction f(a)\n  return a * 2\nend\nf(21)\n",
          30, a3);
  CHECK(&tc, r.status == 0);
  CHECK_STR(&tc, r.out, "1\n2\n2\n42\n");
  result_free(&r);

  r = run("print('a')\nerror('stop here')\nprint('b')\n", 30, a3);
  CHECK(&tc, r.status == 1);
  CHECK_HAS(r.out, "a\n");
  CHECK_LACKS(r.out, "b\n");
  CHECK_HAS(r.err, "stop here");
  result_free(&r);

  r = run("for i = 1, 2 do\n  print(i)\n", 30, a3);
  CHECK(&tc, r.status == 1);
  CHECK_HAS(r.err, "input ended inside an incomplete chunk");
  result_free(&r);

  /* the default socket comes from MG_RUN_DIR, as the daemon's does */
  char env_run[PATH_MAX + 32];
  snprintf(env_run, sizeof env_run, "MG_RUN_DIR=%s", f->run_dir);
  char *const a4[] = {"env", "-u", "MG_CONSOLE_SOCKET", env_run, (char *)f->bin, "console", "-e", "=6 * 7", NULL};
  r = run(NULL, 30, a4);
  CHECK(&tc, r.status == 0);
  CHECK_STR(&tc, r.out, "42\n");
  result_free(&r);
}

static long probe_ticks(fixture *f) {
  return pg_long(f, "SELECT count(*) FROM console_probe_ticks");
}

static void test_worker_commands(fixture *f) {
  char *out = CONSOLE_OK(f, "help()");
  const char *names[] = {"workers()", "pause(name)", "resume_worker(name)", "tick(name)", "req(id)",
                         "requests{", "create{", "approve(id)", "reject(id, reason)", "cancel(id, reason[, {reconciled = true}])",
                         "resume(id)", "retry(node_id)", "complete_manual(node_id, artifacts[, signature])", "dlq()",
                         "redeliver(callback_id)", "signers()", "set_expected_signer(key, address)",
                         "balances()", "settings()", "reload()", NULL};
  for (int i = 0; names[i]; i++) CHECK_HAS(out, names[i]);
  free(out);

  out = CONSOLE_OK(f, "workers()");
  CHECK_HAS(out, "name");
  CHECK_HAS(out, "last tick");
  CHECK_HAS(out, "next run");
  CHECK_HAS(out, "console_probe");
  CHECK_HAS(out, "audit_outbox_promoter");
  CHECK_HAS(out, "sidecar");
  free(out);

  /* the data behind the view can be used as data */
  out = CONSOLE_OK(f, "for _, w in ipairs(workers()) do if w.name == 'console_probe' then return w.group end end");
  CHECK_STR(&tc, out, "\"sidecar\"\n");
  free(out);

  long before_audit = audit_count(f, "console:0", "worker.pause", "console_probe");
  out = CONSOLE_OK(f, "pause('console_probe')");
  CHECK_STR(&tc, out, "paused console_probe\n");
  free(out);
  CHECK(&tc, audit_count(f, "console:0", "worker.pause", "console_probe") == before_audit + 1);
  sleep_s(0.6);                           /* a pass running at pause time ends */
  long paused_at = probe_ticks(f);
  sleep_s(1.5);
  CHECK(&tc, probe_ticks(f) == paused_at);
  out = CONSOLE_OK(f, "for _, w in ipairs(workers()) do if w.name == 'console_probe' then return w.state end end");
  CHECK_STR(&tc, out, "\"paused\"\n");
  free(out);

  /* one pass on demand, even while paused */
  out = CONSOLE_OK(f, "tick('console_probe')");
  CHECK_HAS(out, "console_probe: pass done in");
  CHECK_HAS(out, "1 item");
  free(out);
  CHECK(&tc, probe_ticks(f) == paused_at + 1);
  CHECK(&tc, audit_count(f, "console:0", "worker.tick", "console_probe") >= 1);

  out = CONSOLE_OK(f, "resume_worker('console_probe')");
  CHECK_STR(&tc, out, "resumed console_probe\n");
  free(out);
  CHECK(&tc, audit_count(f, "console:0", "worker.resume", "console_probe") >= 1);
  CHECK(&tc, wait_count(f, paused_at + 3, 10, "SELECT count(*) FROM console_probe_ticks") >= paused_at + 3);

  result r = console_e(f, "pause('no_such_worker')");
  CHECK(&tc, r.status == 1);
  CHECK_HAS(r.err, "no worker named \"no_such_worker\"");
  result_free(&r);
  r = console_e(f, "tick(42)");
  CHECK(&tc, r.status == 1);
  CHECK_HAS(r.err, "worker name must be a non-empty string");
  result_free(&r);

  out = CONSOLE_OK(f, "settings()");
  CHECK_HAS(out, "MG_CONSOLE_ENABLED");
  CHECK_HAS(out, f->run_dir);
  CHECK_LACKS(out, "h4-pg");
  CHECK_LACKS(out, f->db_url);
  free(out);
}

/* The value of `=EXPR` when it is a string: the text between the quotes. */
static char *console_string(fixture *f, const char *code, int line) {
  char *out = console_ok(f, code, line);
  if (!out) return NULL;
  size_t n = strlen(out);
  if (n >= 3 && out[0] == '"' && out[n - 2] == '"' && out[n - 1] == '\n') {
    memmove(out, out + 1, n - 3);
    out[n - 3] = 0;
    return out;
  }
  fprintf(stderr, "%s:%d: not a string: %s\n", __FILE__, line, out);
  tc.failed++;
  free(out);
  return NULL;
}
#define CONSOLE_STRING(f, code) console_string((f), (code), __LINE__)

/* A changed observe interval in an override script shows in the next
 * next_observe_at after reload(). */
static void test_observe_interval_reload(fixture *f) {
  char code[512], sql[512];
  snprintf(code, sizeof code,
           "=create{template_key = 'console_observe_probe', idempotency_key = 'console-observe-%ld', "
           "intent = {amount = '1'}}.id", (long)getpid());
  char *id = CONSOLE_STRING(f, code);
  CHECK(&tc, id != NULL);
  if (!id) return;
  /* four eyes: initiated by someone else than this console's approver */
  CHECK(&tc, pg_long(f, "WITH u AS (UPDATE movement_requests SET created_by = 'operator:desk' "
                        "WHERE id = '%s' RETURNING 1) SELECT count(*) FROM u", id) == 1);
  snprintf(code, sizeof code, "approve('%s')", id);
  free(CONSOLE_OK(f, code));
  char *node = pg_str(f, "SELECT id FROM movement_request_nodes WHERE request_id = '%s'", id);
  CHECK(&tc, node != NULL);
  if (!node) {
    free(id);
    return;
  }
  snprintf(sql, sizeof sql, "SELECT observe_count FROM movement_request_nodes WHERE id = '%s'", node);
  long seen = wait_count(f, 1, 30, sql);
  CHECK(&tc, seen >= 1);
  /* the interval the daemon started with (the override says 3 s) */
  char *gap = pg_str(f, "SELECT round(extract(epoch FROM next_observe_at - updated_at)::numeric, 1) "
                        "FROM movement_request_nodes WHERE id = '%s'", node);
  CHECK_STR(&tc, gap, "3.0");
  free(gap);
  CHECK(&tc, write_observe_intervals(f, 7) == 0);
  char *out = CONSOLE_OK(f, "reload()");
  CHECK_HAS(out, "reloaded");
  free(out);
  seen = pg_long(f, "%s", sql);
  CHECK(&tc, wait_count(f, seen + 1, 30, sql) >= seen + 1);   /* the next observation */
  gap = pg_str(f, "SELECT round(extract(epoch FROM next_observe_at - updated_at)::numeric, 1) "
                  "FROM movement_request_nodes WHERE id = '%s'", node);
  CHECK_STR(&tc, gap, "7.0");
  free(gap);
  snprintf(code, sizeof code, "cancel('%s', 'test over')", id);
  result r = console_e(f, code);                /* refused: the node is in flight */
  CHECK(&tc, r.status == 1);
  CHECK_HAS(r.err, "in flight");
  result_free(&r);
  free(node);
  free(id);
}

/* Expect a fatal frame whose text contains `want`, then the close. */
static void expect_fatal(int fd, const char *want, int line) {
  int type = 0;
  char *data = NULL;
  int got = raw_frame(fd, &type, &data, 10) == 0;
  if (got && type == QTG_CONSOLE_FATAL && contains(data, want)) {
    tc.passed++;
  } else {
    tc.failed++;
    fprintf(stderr, "%s:%d: wanted a fatal frame with \"%s\", got %s type %c: %s\n", __FILE__, line, want,
            got ? "a frame" : "nothing", type ? type : '?', data ? data : "");
  }
  free(data);
  CHECK(&tc, raw_closed(fd, 10));
}

static void test_bad_input(fixture *f) {
  int fd = raw_session(f);
  CHECK(&tc, fd >= 0);
  CHECK(&tc, raw_write(fd, "GET / HTTP/1.0\r\n\r\n", 18) == 0);
  expect_fatal(fd, "over the limit", __LINE__);
  close(fd);

  /* an oversized frame is refused from its header, before its body */
  fd = raw_session(f);
  unsigned char hdr[5];
  qtg_console_frame_header(hdr, QTG_CONSOLE_EVAL, QTG_CONSOLE_MAX_FRAME_IN);
  CHECK(&tc, raw_write(fd, hdr, 5) == 0);
  expect_fatal(fd, "over the limit of 1048576 bytes", __LINE__);
  close(fd);

  /* the largest allowed frame is served */
  fd = raw_session(f);
  size_t n = QTG_CONSOLE_MAX_FRAME_IN - 1;
  char *big = malloc(n + 1);
  CHECK(&tc, big != NULL);
  if (big) {
    memset(big, 'x', n);
    memcpy(big, "--", 2);
    big[n] = 0;
    CHECK(&tc, raw_send(fd, QTG_CONSOLE_EVAL, big) == 0);
    int type;
    char *data;
    CHECK(&tc, raw_final(fd, &type, &data, NULL, 20) == 0 && type == QTG_CONSOLE_RESULT);
    free(data);
    free(big);
  }
  close(fd);

  fd = raw_session(f);
  CHECK(&tc, raw_write(fd, "\0\0\0\0", 4) == 0);
  expect_fatal(fd, "empty frame", __LINE__);
  close(fd);

  fd = raw_session(f);
  CHECK(&tc, raw_send(fd, 'z', "?") == 0);
  expect_fatal(fd, "unknown frame type 0x7a", __LINE__);
  close(fd);

  /* a frame cut in the middle, then the client leaves */
  fd = raw_session(f);
  CHECK(&tc, raw_write(fd, "\0\0\0\x10" "e" "ret", 8) == 0);
  close(fd);

  /* errors, binary junk and incomplete chunks leave the session usable;
   * frames sent back to back run in order */
  fd = raw_session(f);
  int type;
  char *data, *out;
  CHECK(&tc, raw_send(fd, QTG_CONSOLE_EVAL, "error('x1')") == 0);
  CHECK(&tc, raw_final(fd, &type, &data, NULL, 10) == 0 && type == QTG_CONSOLE_ERROR && contains(data, "x1"));
  free(data);
  CHECK(&tc, raw_send(fd, QTG_CONSOLE_EVAL, "\x01\x02\xff\xfe") == 0);
  CHECK(&tc, raw_final(fd, &type, &data, NULL, 10) == 0 && type == QTG_CONSOLE_ERROR);
  free(data);
  CHECK(&tc, raw_send(fd, QTG_CONSOLE_EVAL, "for i = 1, 2 do") == 0);
  CHECK(&tc, raw_final(fd, &type, &data, NULL, 10) == 0 && type == QTG_CONSOLE_MORE);
  free(data);
  CHECK(&tc, raw_send(fd, QTG_CONSOLE_EVAL, "qtg.sleep(0.3) print('first') return 'a'") == 0);
  CHECK(&tc, raw_send(fd, QTG_CONSOLE_EVAL, "='b'") == 0);
  CHECK(&tc, raw_final(fd, &type, &data, &out, 10) == 0 && type == QTG_CONSOLE_RESULT);
  CHECK_STR(&tc, data, "\"a\"");
  CHECK_STR(&tc, out, "first\n");
  free(data);
  free(out);
  CHECK(&tc, raw_final(fd, &type, &data, NULL, 10) == 0 && type == QTG_CONSOLE_RESULT);
  CHECK_STR(&tc, data, "\"b\"");
  free(data);
  CHECK(&tc, raw_send(fd, QTG_CONSOLE_COMPLETE, "qtg.runtime.tick_") == 0);
  CHECK(&tc, raw_final(fd, &type, &data, NULL, 10) == 0 && type == QTG_CONSOLE_COMPLETIONS);
  CHECK_STR(&tc, data, "qtg.runtime.tick_now");
  free(data);
  CHECK(&tc, raw_send(fd, QTG_CONSOLE_COMPLETE, "resume") == 0);
  CHECK(&tc, raw_final(fd, &type, &data, NULL, 10) == 0 && type == QTG_CONSOLE_COMPLETIONS);
  CHECK_STR(&tc, data, "resume\nresume_worker");
  free(data);
  close(fd);

  /* a client that disconnects mid-command: the command is interrupted */
  CHECK(&tc, pg_ok(f, "DELETE FROM console_probe_marks"));
  fd = raw_session(f);
  CHECK(&tc, raw_send(fd, QTG_CONSOLE_EVAL,
                      "qtg.sleep(1.5) sql_write(\"INSERT INTO console_probe_marks VALUES ('disconnect')\")") == 0);
  sleep_s(0.3);
  close(fd);
  sleep_s(2.5);
  CHECK(&tc, pg_long(f, "SELECT count(*) FROM console_probe_marks") == 0);
  char *s = CONSOLE_OK(f, "=#qtg.console_server.sessions()");
  CHECK_STR(&tc, s, "1\n");
  free(s);
  s = CONSOLE_OK(f, "=1");
  CHECK_STR(&tc, s, "1\n");
  free(s);
}

static void test_interrupt(fixture *f) {
  int fd = raw_session(f);
  int type;
  char *data;
  CHECK(&tc, raw_send(fd, QTG_CONSOLE_EVAL, "while true do end") == 0);
  sleep_s(0.3);
  CHECK(&tc, raw_send(fd, QTG_CONSOLE_INTERRUPT, NULL) == 0);
  CHECK(&tc, raw_final(fd, &type, &data, NULL, 10) == 0 && type == QTG_CONSOLE_ERROR &&
                 contains(data, "interrupted"));
  free(data);
  double t0 = now_s();
  CHECK(&tc, raw_send(fd, QTG_CONSOLE_EVAL, "qtg.sleep(60)") == 0);
  sleep_s(0.2);
  CHECK(&tc, raw_send(fd, QTG_CONSOLE_INTERRUPT, NULL) == 0);
  CHECK(&tc, raw_final(fd, &type, &data, NULL, 10) == 0 && type == QTG_CONSOLE_ERROR &&
                 contains(data, "interrupted"));
  CHECK(&tc, now_s() - t0 < 5);
  free(data);
  /* an interrupt with nothing running is ignored */
  CHECK(&tc, raw_send(fd, QTG_CONSOLE_INTERRUPT, NULL) == 0);
  CHECK(&tc, raw_send(fd, QTG_CONSOLE_EVAL, "=7") == 0);
  CHECK(&tc, raw_final(fd, &type, &data, NULL, 10) == 0 && type == QTG_CONSOLE_RESULT);
  CHECK_STR(&tc, data, "7");
  free(data);
  close(fd);

  /* the client turns Ctrl-C (SIGINT) into an interrupt frame */
  char *const argv[] = {"timeout", "--preserve-status", "-s", "INT", "1", (char *)f->bin, "console",
                        "--socket", f->sock, "-e", "while true do end", NULL};
  result r = run(NULL, 30, argv);
  CHECK(&tc, r.status == 1);
  CHECK_HAS(r.err, "interrupted");
  result_free(&r);
}

static void test_concurrency(fixture *f) {
  long before = probe_ticks(f);
  int slow = raw_session(f);
  CHECK(&tc, slow >= 0);
  CHECK(&tc, raw_send(slow, QTG_CONSOLE_EVAL, "sql('SELECT pg_sleep(3)') return 'slow'") == 0);
  sleep_s(0.2);
  double t0 = now_s();
  char *out = CONSOLE_OK(f, "=1 + 1");       /* a second console, at the same time */
  CHECK_STR(&tc, out, "2\n");
  free(out);
  CHECK(&tc, now_s() - t0 < 2.5);
  int type;
  char *data;
  CHECK(&tc, raw_final(slow, &type, &data, NULL, 20) == 0 && type == QTG_CONSOLE_RESULT);
  CHECK_STR(&tc, data, "\"slow\"");
  free(data);
  CHECK(&tc, now_s() - t0 >= 2.5);
  /* the workers kept ticking during the 3 s query (one pass per ~0.5 s) */
  CHECK(&tc, probe_ticks(f) >= before + 3);
  close(slow);
}

/* Sessions past QTG_CONSOLE_MAX_SESSIONS: clients that connect and never
 * send kept operators out for as long as they stayed (a review, session
 * 38).  The newcomer is refused, naming the open sessions' client pids,
 * while none has been idle MG_CONSOLE_IDLE_SECONDS (2 s here); after that
 * the session idle longest is closed to let it in. */
static void test_idle_sessions(fixture *f) {
  int fds[QTG_CONSOLE_MAX_SESSIONS];
  int opened = 0;
  for (int i = 0; i < QTG_CONSOLE_MAX_SESSIONS; i++) {
    fds[i] = raw_session(f);
    if (fds[i] >= 0) opened++;
  }
  CHECK(&tc, opened == QTG_CONSOLE_MAX_SESSIONS);
  /* all fresh: the next one is refused, with their pids (this process's) */
  int extra = raw_connect(f->sock);
  int type = 0;
  char *data = NULL;
  CHECK(&tc, extra >= 0 && raw_frame(extra, &type, &data, 10) == 0 && type == QTG_CONSOLE_FATAL);
  char pid[32];
  snprintf(pid, sizeof pid, " %ld", (long)getpid());
  CHECK(&tc, data && strstr(data, "refused: too many console sessions are open") && strstr(data, pid));
  free(data);
  if (extra >= 0) close(extra);
  /* once they have been idle 2 s, a newcomer is served; one of them is closed */
  sleep_s(2.3);
  char *out = CONSOLE_OK(f, "=1 + 1");
  CHECK_STR(&tc, out, "2\n");
  free(out);
  int closed = 0;
  for (int i = 0; i < QTG_CONSOLE_MAX_SESSIONS; i++) {
    if (fds[i] < 0) continue;
    struct pollfd pfd = {.fd = fds[i], .events = POLLIN};
    if (poll(&pfd, 1, 0) == 1 && raw_frame(fds[i], &type, &data, 1) == 0) {
      CHECK(&tc, type == QTG_CONSOLE_FATAL && strstr(data, "had been idle longest"));
      free(data);
      closed++;
    }
  }
  CHECK(&tc, closed == 1);
  for (int i = 0; i < QTG_CONSOLE_MAX_SESSIONS; i++)
    if (fds[i] >= 0) close(fds[i]);
}

static void test_other_uid(fixture *f) {
  if (geteuid() != 0) {
    fprintf(stderr, "note: not root: the other-uid test needs useradd and runuser; skipped\n");
    return;
  }
  char *const add[] = {"useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER, NULL};
  result r = run(NULL, 30, add);
  CHECK(&tc, r.status == 0 || r.status == 9);   /* 9: the user exists already */
  result_free(&r);
  struct passwd *pw = getpwnam(TEST_USER);
  CHECK(&tc, pw != NULL);
  if (!pw) return;
  char uid_msg[96];
  snprintf(uid_msg, sizeof uid_msg, "refused: uid %lu may not use this console", (unsigned long)pw->pw_uid);

  /* The user runs a copy of qtgd in the test's directory: the checkout
   * itself may sit where that user cannot enter (e.g. under /root). */
  char copy[PATH_MAX + 32], root_env[PATH_MAX + 32];
  snprintf(copy, sizeof copy, "%s/qtgd-copy", f->tmp);
  snprintf(root_env, sizeof root_env, "QTG_ROOT=%s", f->tmp);
  char *const cp[] = {"cp", (char *)f->bin, copy, NULL};
  r = run(NULL, 30, cp);
  CHECK(&tc, r.status == 0 && chmod(copy, 0755) == 0);
  result_free(&r);
  char *const as_user[] = {"runuser", "-u", TEST_USER, "--", "env", root_env, copy, "console", "--socket",
                           f->sock, "-e", "=1", NULL};
  /* the 0700 directory and the 0600 socket keep it out */
  r = run(NULL, 30, as_user);
  CHECK(&tc, r.status == 2);
  CHECK_HAS(r.err, "permission denied");
  result_free(&r);
  /* with the file modes loosened, SO_PEERCRED still refuses the uid */
  CHECK(&tc, chmod(f->run_dir, 0755) == 0 && chmod(f->sock, 0666) == 0);
  r = run(NULL, 30, as_user);
  CHECK(&tc, r.status == 2);
  CHECK_HAS(r.err, uid_msg);
  CHECK_LACKS(r.out, "1");
  result_free(&r);
  CHECK(&tc, chmod(f->run_dir, 0700) == 0 && chmod(f->sock, 0600) == 0);
  char *out = CONSOLE_OK(f, "=1");                /* root is still served */
  CHECK_STR(&tc, out, "1\n");
  free(out);
}

static char *probe_worker_field(fixture *f, const char *field) {
  char code[256];
  snprintf(code, sizeof code,
           "for _, w in ipairs(qtg.runtime.workers()) do if w.name == 'console_probe' then return w.%s end end",
           field);
  return CONSOLE_OK(f, code);
}

static long latest_probe_id(fixture *f) {
  return pg_long(f, "SELECT coalesce(max(id), 0) FROM console_probe_ticks");
}

static void test_reload(fixture *f) {
  /* a changed interval applies from the next sleep */
  CHECK(&tc, write_registry(f, 0.4, NULL) == 0);
  char *out = CONSOLE_OK(f, "reload()");
  CHECK_HAS(out, "reloaded");
  CHECK_HAS(out, "interval of console_probe: 0.3s -> 0.4s");
  free(out);
  out = probe_worker_field(f, "interval");
  CHECK_STR(&tc, out, "0.4\n");
  free(out);
  CHECK(&tc, audit_count(f, "console:0", "policy.reload", "lua") >= 1);

  /* a worker added to the registry starts; removed, it stops */
  CHECK(&tc, write_registry(f, 0.4,
                            "out[#out + 1] = { name = 'console_probe2', group = 'sidecar', "
                            "module = 'qtg.console_probe', interval = 0.5, jitter = 0, enabled = true }") == 0);
  out = CONSOLE_OK(f, "reload()");
  CHECK_HAS(out, "started: console_probe2");
  free(out);
  out = CONSOLE_OK(f, "workers()");
  CHECK_HAS(out, "console_probe2");
  free(out);
  CHECK(&tc, write_registry(f, 0.4, NULL) == 0);
  out = CONSOLE_OK(f, "reload()");
  CHECK_HAS(out, "stopped: console_probe2");
  free(out);
  out = CONSOLE_OK(f, "workers()");
  CHECK_LACKS(out, "console_probe2");
  free(out);

  /* a reload while a tick runs: that tick finishes on the old code */
  CHECK(&tc, write_probe(f, "v2", 3.0, NULL) == 0);
  out = CONSOLE_OK(f, "reload()");
  free(out);
  long running = 0;
  double deadline = now_s() + 10;
  while (now_s() < deadline && running <= 0) {
    running = pg_long(f, "SELECT coalesce(max(id), 0) FROM console_probe_ticks WHERE version = 'v2' "
                         "AND finished_at IS NULL");
    if (running <= 0) sleep_s(0.1);
  }
  CHECK(&tc, running > 0);
  CHECK(&tc, write_probe(f, "v3", 0.1, NULL) == 0);
  out = CONSOLE_OK(f, "reload()");
  CHECK_HAS(out, "reloaded");
  free(out);
  CHECK(&tc, pg_long(f, "SELECT count(*) FROM console_probe_ticks WHERE id = %ld AND finished_at IS NULL",
                     running) == 1);                    /* still running after the swap */
  char sql[256];
  snprintf(sql, sizeof sql, "SELECT count(*) FROM console_probe_ticks WHERE id = %ld AND finished_at IS NOT NULL",
           running);
  CHECK(&tc, wait_count(f, 1, 10, sql) == 1);          /* ... and finished, not interrupted */
  snprintf(sql, sizeof sql, "SELECT count(*) FROM console_probe_ticks WHERE id > %ld AND version = 'v3'", running);
  CHECK(&tc, wait_count(f, 2, 10, sql) >= 2);          /* the next passes run the new code */
  CHECK(&tc, pg_long(f, "SELECT count(*) FROM console_probe_ticks WHERE id > %ld AND version <> 'v3'",
                     running) == 0);

  /* a syntax error: refused with file and line, the old code keeps running */
  CHECK(&tc, write_probe(f, "v4", 0.1, "local broken = = 1") == 0);
  result r = console_e(f, "reload()");
  CHECK(&tc, r.status == 1);
  CHECK_HAS(r.err, "reload failed; the old code keeps running");
  CHECK_HAS(r.err, "qtg/console_probe.lua:11:");
  result_free(&r);
  long mark = latest_probe_id(f);
  snprintf(sql, sizeof sql, "SELECT count(*) FROM console_probe_ticks WHERE id > %ld", mark);
  CHECK(&tc, wait_count(f, 2, 10, sql) >= 2);
  CHECK(&tc, pg_long(f, "SELECT count(*) FROM console_probe_ticks WHERE id > %ld AND version <> 'v3'",
                     mark) == 0);

  /* a script that raises while loading: the same */
  CHECK(&tc, write_probe(f, "v5", 0.1, "error('load-time failure in the probe')") == 0);
  r = console_e(f, "reload()");
  CHECK(&tc, r.status == 1);
  CHECK_HAS(r.err, "load-time failure in the probe");
  CHECK_HAS(r.err, "console_probe.lua:11");
  result_free(&r);
  out = CONSOLE_OK(f, "=require('qtg.console_probe').VERSION");
  CHECK_STR(&tc, out, "\"v3\"\n");
  free(out);
  mark = latest_probe_id(f);
  snprintf(sql, sizeof sql, "SELECT count(*) FROM console_probe_ticks WHERE id > %ld", mark);
  CHECK(&tc, wait_count(f, 2, 10, sql) >= 2);
  CHECK(&tc, pg_long(f, "SELECT count(*) FROM console_probe_ticks WHERE id > %ld AND version <> 'v3'",
                     mark) == 0);
  /* a broken registry is refused too */
  CHECK(&tc, write_registry(f, -1, NULL) == 0);
  r = console_e(f, "reload()");
  CHECK(&tc, r.status == 1);
  CHECK_HAS(r.err, "interval must be a number > 0");
  result_free(&r);
  CHECK(&tc, write_registry(f, 0.4, NULL) == 0);

  /* SIGHUP reloads too, audited as system:sighup */
  long hup_before = audit_count(f, "system:sighup", "policy.reload", "lua");
  CHECK(&tc, write_probe(f, "v6", 0.1, NULL) == 0);
  mark = latest_probe_id(f);
  CHECK(&tc, kill(f->daemon, SIGHUP) == 0);
  snprintf(sql, sizeof sql, "SELECT count(*) FROM console_probe_ticks WHERE id > %ld AND version = 'v6'", mark);
  CHECK(&tc, wait_count(f, 1, 10, sql) >= 1);
  snprintf(sql, sizeof sql,
           "SELECT count(*) FROM (SELECT id FROM audit_outbox WHERE actor = 'system:sighup' AND action = "
           "'policy.reload' UNION SELECT outbox_id FROM audit_events WHERE actor = 'system:sighup' AND "
           "action = 'policy.reload') x");
  CHECK(&tc, wait_count(f, hup_before + 1, 10, sql) >= hup_before + 1);
}

static void test_console_disabled(fixture *f) {
  char run_dir[PATH_MAX + 16], log[PATH_MAX + 16], sock[PATH_MAX + 32];
  snprintf(run_dir, sizeof run_dir, "%s/run2", f->tmp);
  snprintf(log, sizeof log, "%s/daemon2.log", f->tmp);
  snprintf(sock, sizeof sock, "%s/console.sock", run_dir);
  pid_t pid = start_daemon(f, run_dir, log, 0);
  CHECK(&tc, pid > 0);
  sleep_s(2.5);
  CHECK(&tc, kill(pid, 0) == 0);                      /* running ... */
  struct stat st;
  CHECK(&tc, stat(sock, &st) != 0);                   /* ... without a console */
  char *const argv[] = {(char *)f->bin, "console", "--socket", sock, "-e", "1", NULL};
  result r = run(NULL, 20, argv);
  CHECK(&tc, r.status == 2);
  CHECK_HAS(r.err, "no console socket");
  result_free(&r);
  int rc = stop_daemon(pid, 30);
  CHECK(&tc, rc == 0);
  if (rc != 0) dump_log(log);
}

/* ---- setup ------------------------------------------------------------------------ */

static int setup(fixture *f) {
  f->bin = getenv("QTG_BIN");
  f->root = getenv("QTG_ROOT");
  if (!f->bin || !f->root) {
    fprintf(stderr, "QTG_BIN and QTG_ROOT must be set (ctest sets them)\n");
    return -1;
  }
  const char *url = getenv("MG_DATABASE_URL");
  if (url && url[0]) {
    snprintf(f->db_url, sizeof f->db_url, "%s", url);
  } else {
    char cmd[PATH_MAX * 2];
    snprintf(cmd, sizeof cmd, "'%s/tools/pg' --dir '%s/var/test-console-pg' --fast ensure", f->root, f->root);
    FILE *p = popen(cmd, "r");
    if (!p || !fgets(f->db_url, sizeof f->db_url, p)) {
      if (p) pclose(p);
      fprintf(stderr, "cannot start a database with tools/pg\n");
      return -1;
    }
    if (pclose(p) != 0) return -1;
    f->db_url[strcspn(f->db_url, "\r\n")] = 0;
  }
  snprintf(f->tmp, sizeof f->tmp, "/tmp/qtg-console-XXXXXX");
  if (!mkdtemp(f->tmp)) return -1;
  chmod(f->tmp, 0755);                 /* the other-uid test's user may enter */
  snprintf(f->run_dir, sizeof f->run_dir, "%s/run", f->tmp);
  snprintf(f->sock, sizeof f->sock, "%s/console.sock", f->run_dir);
  snprintf(f->over, sizeof f->over, "%s/lua", f->tmp);
  snprintf(f->log, sizeof f->log, "%s/daemon.log", f->tmp);
  char dir[PATH_MAX + 32];
  snprintf(dir, sizeof dir, "%s/qtg/workers", f->over);
  char *const mk[] = {"mkdir", "-p", dir, NULL};
  result r = run(NULL, 10, mk);
  int ok = r.status == 0;
  result_free(&r);
  if (!ok) return -1;

  setenv("MG_DATABASE_URL", f->db_url, 1);
  char *const migrate[] = {(char *)f->bin, "migrate", NULL};
  r = run(NULL, 120, migrate);
  ok = r.status == 0;
  if (!ok) fprintf(stderr, "qtgd migrate failed:\n%s%s", r.out, r.err);
  result_free(&r);
  if (!ok) return -1;

  char tpl_dir[PATH_MAX + 32], tpl[PATH_MAX + 64];
  snprintf(tpl_dir, sizeof tpl_dir, "%s/templates", f->tmp);
  snprintf(tpl, sizeof tpl, "%s/console_observe_probe.json", tpl_dir);
  if (mkdir(tpl_dir, 0755) != 0 || write_file(tpl, "%s", observe_template) != 0) return -1;
  char *const load[] = {(char *)f->bin, "templates", "load", tpl_dir, NULL};
  r = run(NULL, 60, load);
  ok = r.status == 0;
  if (!ok) fprintf(stderr, "qtgd templates load failed:\n%s%s", r.out, r.err);
  result_free(&r);
  if (!ok) return -1;

  f->pg = PQconnectdb(f->db_url);
  if (PQstatus(f->pg) != CONNECTION_OK) {
    fprintf(stderr, "cannot connect to %s: %s", f->db_url, PQerrorMessage(f->pg));
    return -1;
  }
  PQsetNoticeProcessor(f->pg, NULL, NULL);
  if (!pg_ok(f, "DROP TABLE IF EXISTS console_probe_ticks, console_probe_marks") ||
      !pg_ok(f, "CREATE TABLE console_probe_ticks (id bigserial PRIMARY KEY, version text NOT NULL, "
                "started_at timestamptz NOT NULL DEFAULT clock_timestamp(), finished_at timestamptz)") ||
      !pg_ok(f, "CREATE TABLE console_probe_marks (what text)"))
    return -1;
  if (write_probe(f, "v1", 0.2, NULL) != 0 || write_registry(f, 0.3, NULL) != 0 ||
      write_observe_intervals(f, 3) != 0)
    return -1;
  return 0;
}

int main(void) {
  fixture f;
  memset(&f, 0, sizeof f);
  signal(SIGPIPE, SIG_IGN);
  if (setup(&f) != 0) {
    fprintf(stderr, "setup failed\n");
    return 1;
  }
  test_no_daemon(&f);
  f.daemon = start_daemon(&f, f.run_dir, f.log, 1);
  if (wait_for_socket(f.sock, f.daemon, 30) != 0) {
    fprintf(stderr, "the daemon did not open its console socket\n");
    dump_log(f.log);
    stop_daemon(f.daemon, 5);
    return 1;
  }
  CHECK(&tc, wait_count(&f, 1, 10, "SELECT count(*) FROM console_probe_ticks") >= 1);
  test_socket_modes(&f);
  test_eval(&f);
  test_worker_commands(&f);
  test_bad_input(&f);
  test_interrupt(&f);
  test_concurrency(&f);
  test_idle_sessions(&f);
  test_other_uid(&f);
  test_reload(&f);
  test_observe_interval_reload(&f);
  test_console_disabled(&f);

  int rc = stop_daemon(f.daemon, 30);
  CHECK(&tc, rc == 0);
  struct stat st;
  CHECK(&tc, lstat(f.sock, &st) != 0);                 /* the socket is removed at exit */
  if (tc.failed) dump_log(f.log);
  PQfinish(f.pg);
  char *const rm[] = {"rm", "-rf", f.tmp, NULL};
  result r = run(NULL, 30, rm);
  result_free(&r);
  return qtg_test_finish(&tc);
}
