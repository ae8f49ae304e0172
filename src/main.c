/* main.c -- qtgd's command line: parse the command, load the settings,
 * resolve the database (the embedded default when MG_DATABASE_URL is unset),
 * start the host and hand the command to Lua (lua/qtg/cli.lua).
 *
 * Exit codes: 0 success, 1 command failed, 2 usage or invalid settings,
 * 3 a core worker died (the service manager restarts us). */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <luajit.h>

#include "qtg_busy.h"
#include "qtg_host.h"
#include "qtg_log.h"
#include "qtg_runtime.h"
#include "qtg_console_client.h"
#include "qtg_signerd.h"
#include "qtg_approver.h"

typedef struct {
  const char *name;
  const char *args;
  const char *help;
  int needs_db;
  int max_args; /* -1: the command parses its own arguments */
} qtg_command;

static const qtg_command qtg_commands[] = {
  {"run", "", "run the daemon: workers, console, wake-ups", 1, 0},
  {"migrate", "[DIR]", "apply sql/NNNN_*.sql (or DIR's) in order, each once, in a transaction", 1, 1},
  {"exec", "FILE [ARGS...]", "run a Lua script inside the host (it may query); exits with what it returns", 1, -1},
  {"templates", "load|check DIR | list", "validate and compile movement templates into plan versions", 1, -1},
  {"operators", "add NAME UID ROLES | remove NAME | list",
   "map console uids to named operators and their roles (read,operate,approve,admin)", 1, -1},
  {"check", "[--templates DIR] [--strict] [--quiet]",
   "validate settings, database, migrations, templates and policy scripts", 1, -1},
  {"audit", "verify [--since ID] [--against FILE] | export [--since ID]",
   "check the hash-chained audit trail (against an earlier export) and the states it records, "
   "or write it as JSON lines", 1, -1},
  {"tokens", "create|list|revoke ...", "API tokens: create --name N --roles read,operate,approve,admin", 1, -1},
  {"signer", "", "run the signer: holds MG_SIGNER_KEYS, signs only what was approved", 1, 0},
  {"approver", "key|public FILE | sign FILE [DOCUMENT PLAN] [--request UUID] [--deployment NAME] [--class NAME] [--kind K]"
               " | sign-fill FILE --deployment NAME --chain ID --sender ADDRESS --nonce N",
   "an approver's own Ed25519 key: make it, print its public key, sign a statement on stdin or a fill", 0, -1},
  {"console", "[-e CODE] [--socket PATH]", "attach a Lua console to the running daemon", 0, -1},
  {"settings", "[--markdown]", "print every MG_* setting with its value and default", 0, 1},
  {"version", "", "print the version", 0, 0},
  {"help", "[COMMAND]", "print this help, or one command's", 0, 1},
};
#define QTG_NCOMMANDS (sizeof qtg_commands / sizeof qtg_commands[0])

static void qtg_usage(FILE *out) {
  fprintf(out, "usage: qtgd COMMAND [ARGS...]\n\ncommands:\n");
  for (size_t i = 0; i < QTG_NCOMMANDS; i++) {
    char left[64];
    snprintf(left, sizeof left, "%s %s", qtg_commands[i].name, qtg_commands[i].args);
    if (strlen(left) > 34) fprintf(out, "  %s\n  %-34s %s\n", left, "", qtg_commands[i].help);
    else fprintf(out, "  %-34s %s\n", left, qtg_commands[i].help);
  }
  fprintf(out, "\nSettings come from MG_* environment variables (qtgd settings lists them).\n"
               "Without MG_DATABASE_URL, qtgd uses the private cluster under the repo (tools/pg).\n");
}

static const qtg_command *qtg_find_command(const char *name) {
  for (size_t i = 0; i < QTG_NCOMMANDS; i++)
    if (strcmp(qtg_commands[i].name, name) == 0) return &qtg_commands[i];
  return NULL;
}

/* `qtgd help COMMAND` and `qtgd COMMAND --help`. */
static void qtg_command_usage(FILE *out, const qtg_command *c) {
  fprintf(out, "usage: qtgd %s%s%s\n\n%s\n", c->name, c->args[0] ? " " : "", c->args, c->help);
  if (c->needs_db)
    fprintf(out, "\nIt connects to MG_DATABASE_URL (unset: the private cluster of tools/pg).\n");
  fprintf(out, "Settings come from MG_* environment variables (qtgd settings lists them).\n");
}

static int qtg_is_help_flag(const char *a) {
  return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0;
}

/* Arguments of a command that takes a fixed few (max_args >= 0; the others
 * parse their own): an option it does not know, or one argument too many,
 * is refused (exit 2) instead of being ignored -- `qtgd run --bogus` must
 * not start a daemon the operator did not mean to start. */
static int qtg_check_args(const qtg_command *c, int nargs, char **args) {
  if (c->max_args < 0) return 0;
  for (int i = 0; i < nargs; i++) {
    if (args[i][0] != '-') continue;
    if (strcmp(c->name, "settings") == 0 && strcmp(args[i], "--markdown") == 0) continue;
    if (strcmp(c->name, "help") == 0) continue;
    fprintf(stderr, "qtgd %s: unknown option '%s'\n\n", c->name, args[i]);
    return -1;
  }
  if (nargs > c->max_args) {
    fprintf(stderr, "qtgd %s: unexpected argument '%s'\n\n", c->name, args[c->max_args]);
    return -1;
  }
  return 0;
}

static const char *qtg_env(const char *name, void *ud) {
  (void)ud;
  return getenv(name);
}

static int qtg_is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Where lua/, sql/ and templates/ are: $QTG_ROOT, else the source tree this
 * binary was built in (build/qtgd -> ..), else the packaged data dir. */
static int qtg_find_root(char *out, size_t cap) {
  char probe[PATH_MAX + 32];
  const char *env = getenv("QTG_ROOT");
  if (env && env[0]) {
    snprintf(out, cap, "%s", env);
    return 0;
  }
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = '\0';
      snprintf(probe, sizeof probe, "%s/../lua/qtg/cli.lua", exe);
      if (qtg_is_file(probe)) {
        char *real = realpath(exe, NULL);
        if (real) {
          snprintf(out, cap, "%s", real);
          free(real);
          char *s2 = strrchr(out, '/');
          if (s2) *s2 = '\0';
          return 0;
        }
      }
    }
  }
  snprintf(probe, sizeof probe, "%s/lua/qtg/cli.lua", QTG_INSTALL_DATADIR);
  if (qtg_is_file(probe)) {
    snprintf(out, cap, "%s", QTG_INSTALL_DATADIR);
    return 0;
  }
  snprintf(probe, sizeof probe, "%s/lua/qtg/cli.lua", QTG_SOURCE_DIR);
  if (qtg_is_file(probe)) {
    snprintf(out, cap, "%s", QTG_SOURCE_DIR);
    return 0;
  }
  return -1;
}

/* The embedded default: `tools/pg ensure` starts the private cluster if
 * needed and prints its URL.  hint says where the setting goes. */
static int qtg_resolve_database(qtg_settings *s, const char *root, const char *hint) {
  if (qtg_settings_str(s, QTG_S_DATABASE_URL)[0]) return 0;
  char tool[PATH_MAX + 16];
  snprintf(tool, sizeof tool, "%s/tools/pg", root);
  if (access(tool, X_OK) != 0) {
    fprintf(stderr, "qtgd: MG_DATABASE_URL is not set and there is no embedded cluster tool (%s).\n%s\n",
            tool, hint);
    return -1;
  }
  char cmd[PATH_MAX + 64];
  snprintf(cmd, sizeof cmd, "'%s' ensure", tool);
  FILE *p = popen(cmd, "r");
  if (!p) {
    fprintf(stderr, "qtgd: cannot run %s\n", tool);
    return -1;
  }
  char url[1024] = "";
  char *got = fgets(url, sizeof url, p);
  int rc = pclose(p);
  if (!got || rc != 0) {
    fprintf(stderr, "qtgd: the embedded PostgreSQL did not start (%s ensure failed); see its log under var/pg\n",
            tool);
    return -1;
  }
  url[strcspn(url, "\r\n")] = '\0';
  char *copy = strdup(url);
  if (!copy) return -1;
  free(s->v[QTG_S_DATABASE_URL].s);
  s->v[QTG_S_DATABASE_URL].s = copy;
  return 0;
}

static void qtg_on_signal(uv_signal_t *sig, int signum) {
  qtg_host *h = sig->data;
  if (signum == SIGHUP) {
    /* Reload runs as a task: policy modules are compiled, then swapped. */
    lua_State *L = h->L;
    lua_getglobal(L, "require");
    lua_pushliteral(L, "qtg.main");
    if (lua_pcall(L, 1, 1, 0) != 0) {
      qtg_log_error("SIGHUP: %s", lua_tostring(L, -1));
      lua_pop(L, 1);
      return;
    }
    lua_getfield(L, -1, "on_sighup");
    lua_remove(L, -2);
    if (!lua_isfunction(L, -1)) {
      lua_pop(L, 1);
      return;
    }
    qtg_task_spawn(h, "sighup", 0, 0, NULL, NULL);
    return;
  }
  qtg_runtime_shutdown(h, 0, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* libuv's handler only queues a signal for the loop, which a console
 * command that never yields holds.  In front of it, the stop signals are
 * also noted at once (qtg_host_note_stop_signal), so the console's guard
 * ends such a command and the loop runs the shutdown within its grace
 * period.  libuv's handler is then called as before. */
static struct sigaction qtg_uv_sigterm, qtg_uv_sigint;

static void qtg_note_stop_signal(int signum, siginfo_t *info, void *uctx) {
  qtg_host_note_stop_signal(signum);
  const struct sigaction *uv = signum == SIGTERM ? &qtg_uv_sigterm : &qtg_uv_sigint;
  if (uv->sa_flags & SA_SIGINFO) uv->sa_sigaction(signum, info, uctx);
  else if (uv->sa_handler != SIG_DFL && uv->sa_handler != SIG_IGN) uv->sa_handler(signum);
}

static int qtg_chain_stop_signal(int signum, struct sigaction *uv) {
  struct sigaction sa;
  if (sigaction(signum, NULL, uv) != 0) return -1;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = qtg_note_stop_signal;
  sa.sa_mask = uv->sa_mask;
  sa.sa_flags = SA_SIGINFO | (uv->sa_flags & SA_RESTART);
  return sigaction(signum, &sa, NULL);
}

static int qtg_arm_signals(qtg_host *h) {
  uv_signal_t *sigs[] = {&h->sigterm, &h->sigint, &h->sighup};
  int nums[] = {SIGTERM, SIGINT, SIGHUP};
  for (int i = 0; i < 3; i++) {
    if (uv_signal_init(h->loop, sigs[i]) != 0) return -1;
    sigs[i]->data = h;
    if (uv_signal_start(sigs[i], qtg_on_signal, nums[i]) != 0) return -1;
  }
  h->signals_armed = 1;
  if (qtg_chain_stop_signal(SIGTERM, &qtg_uv_sigterm) != 0 ||
      qtg_chain_stop_signal(SIGINT, &qtg_uv_sigint) != 0)
    return -1;
  return 0;
}

typedef struct {
  int exit_code;
  int finished;
  int daemon;
} qtg_main_state;

/* The command's task ended: its return value is the exit code, unless the
 * command started workers (run), in which case the loop keeps going. */
static void qtg_command_done(qtg_task *t, int ok, int nres, void *data) {
  qtg_main_state *ms = data;
  lua_State *co = qtg_task_thread(t);
  ms->finished = 1;
  if (!ok) {
    ms->exit_code = 1;
  } else if (nres > 0 && lua_isnumber(co, -nres)) {
    ms->exit_code = (int)lua_tointeger(co, -nres);
  } else if (nres > 0 && lua_toboolean(co, -nres) == 0 && !lua_isnil(co, -nres)) {
    ms->exit_code = 1;
  } else {
    ms->exit_code = 0;
  }
  qtg_host *h = qtg_host_from_lua(co);
  if (!ms->daemon && qtg_runtime_running_ticks(h) == 0) qtg_host_stop(h, ms->exit_code);
  else if (!ms->daemon || ms->exit_code != 0) qtg_runtime_shutdown(h, ms->exit_code, "command finished");
}

static int qtg_run_command(const char *root, qtg_settings *s, const char *cmd, int argc, char **argv) {
  qtg_host h;
  if (qtg_host_init(&h, s, root) != 0) return 1;
  qtg_main_state ms = {0, 0, strcmp(cmd, "run") == 0};
  if (ms.daemon && qtg_arm_signals(&h) != 0) {
    qtg_log_error("cannot install signal handlers");
    qtg_host_close(&h);
    return 1;
  }
  /* The daemon, and the check that loads its policies before it starts
   * (ExecStartPre): Lua that never yields must not hold either for good. */
  if (ms.daemon || strcmp(cmd, "check") == 0) {
    char err[256];
    if (qtg_busy_start(&h, qtg_settings_num(s, QTG_S_TASK_BUSY_LIMIT_SECONDS),
                       qtg_settings_num(s, QTG_S_CONSOLE_BUSY_LIMIT_SECONDS), err, sizeof err) != 0) {
      qtg_log_error("%s", err);
      qtg_host_close(&h);
      return 1;
    }
  }
  lua_State *L = h.L;
  lua_getglobal(L, "require");
  lua_pushliteral(L, "qtg.cli");
  if (lua_pcall(L, 1, 1, 0) != 0) {
    qtg_log_error("cannot load the command line module: %s", lua_tostring(L, -1));
    qtg_host_close(&h);
    return 1;
  }
  lua_getfield(L, -1, "main");
  lua_remove(L, -2);
  lua_pushstring(L, cmd);
  lua_createtable(L, argc, 0);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i + 1);
  }
  qtg_task_spawn(&h, cmd, 2, 0, qtg_command_done, &ms);
  int code = qtg_host_run(&h);
  if (!ms.daemon && ms.finished) code = ms.exit_code;
  qtg_host_close(&h);
  return code;
}

int main(int argc, char **argv) {
  const char *cmd = NULL;
  int argi = 1;
  /* libuv's thread pool runs the database's connecting steps (src/qtg_pg.c),
   * each holding its thread through libpq's blocking name lookup: with
   * libuv's default of 4 threads, a pool reconnecting to a host name whose
   * DNS server never answers left nothing for the rest.  The operator's
   * UV_THREADPOOL_SIZE wins; libuv reads it when the pool first starts. */
  if (getenv("UV_THREADPOOL_SIZE") == NULL && setenv("UV_THREADPOOL_SIZE", "16", 0) != 0) {
    perror("qtgd: setenv UV_THREADPOOL_SIZE");
    return 1;
  }
  if (argc < 2) {
    /* No command: usage, not a daemon nobody asked for. */
    qtg_usage(stderr);
    return 2;
  }
  {
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) cmd = "help";
    else if (strcmp(argv[1], "--version") == 0) cmd = "version";
    else if (argv[1][0] == '-') {
      fprintf(stderr, "qtgd: unknown option '%s'\n\n", argv[1]);
      qtg_usage(stderr);
      return 2;
    } else cmd = argv[1];
    argi = 2;
  }
  const qtg_command *c = qtg_find_command(cmd);
  if (!c) {
    fprintf(stderr, "qtgd: unknown command '%s'\n\n", cmd);
    qtg_usage(stderr);
    return 2;
  }
  if (argc > argi && qtg_is_help_flag(argv[argi])) {
    qtg_command_usage(stdout, c);
    return 0;
  }
  if (qtg_check_args(c, argc - argi, argv + argi) != 0) {
    qtg_command_usage(stderr, c);
    return 2;
  }
  if (strcmp(cmd, "help") == 0) {
    if (argc > argi) {
      const qtg_command *about = qtg_find_command(argv[argi]);
      if (!about) {
        fprintf(stderr, "qtgd help: unknown command '%s'\n\n", argv[argi]);
        qtg_usage(stderr);
        return 2;
      }
      qtg_command_usage(stdout, about);
      return 0;
    }
    qtg_usage(stdout);
    return 0;
  }
  if (strcmp(cmd, "version") == 0) {
    printf("qtgd %s (%s)\n", QTG_VERSION, LUAJIT_VERSION);
    return 0;
  }
  if (strcmp(cmd, "approver") == 0) return qtg_approver_main(argc - argi, argv + argi);
  if (strcmp(cmd, "settings") == 0 && argc > argi && strcmp(argv[argi], "--markdown") == 0) {
    qtg_settings_print_markdown();
    return 0;
  }

  qtg_settings s;
  char err[4096];
  if (qtg_settings_load(&s, qtg_env, NULL, err, sizeof err) != 0) {
    for (char *line = err, *nl; line && *line; line = nl ? nl + 1 : NULL) {
      nl = strchr(line, '\n');
      if (nl) *nl = '\0';
      fprintf(stderr, "qtgd: %s\n", line);
    }
    return 2;
  }
  qtg_log_set_level((qtg_log_level)qtg_log_level_parse(qtg_settings_str(&s, QTG_S_LOG_LEVEL)));
  {
    const char *fmt = qtg_settings_str(&s, QTG_S_LOG_FORMAT);
    qtg_log_set_text(fmt[0] ? strcmp(fmt, "text") == 0 : isatty(STDERR_FILENO));
  }
  s.report_only = strcmp(cmd, "check") == 0;
  qtg_log_set_repeat_window(strcmp(cmd, "run") == 0 ? 60 : 0);
  if (strcmp(cmd, "settings") == 0) {
    for (int i = 0; i < QTG_S__COUNT; i++) {
      const qtg_setting_def *d = &qtg_setting_defs[i];
      const char *v = d->type == QTG_SET_SECRET ? (s.v[i].s && s.v[i].s[0] ? "(set, hidden)" : "(unset)")
                                                : getenv(d->name) ? getenv(d->name) : d->def;
      printf("%-48s %s%s\n", d->name, v, s.v[i].set ? "" : "  (default)");
    }
    qtg_settings_free(&s);
    return 0;
  }
  char root[PATH_MAX];
  if (qtg_find_root(root, sizeof root) != 0) {
    fprintf(stderr, "qtgd: cannot find the policy scripts (lua/qtg); set QTG_ROOT\n");
    qtg_settings_free(&s);
    return 1;
  }
  if (strcmp(cmd, "console") == 0) {
    int rc = qtg_console_client_main(argc - argi + 1, argv + argi - 1, &s, root);
    qtg_settings_free(&s);
    return rc;
  }
  signal(SIGPIPE, SIG_IGN);
  /* the signer: its own URL, or none at all when it holds no key */
  int signer = strcmp(cmd, "signer") == 0;
  int own_db = signer && (qtg_settings_str(&s, QTG_S_SIGNER_DATABASE_URL)[0] || !qtg_signerd_needs_database(&s));
  const char *hint = signer ? QTG_SIGNERD_DATABASE_HINT
                            : "Set MG_DATABASE_URL to a PostgreSQL URL (the packaged daemon reads /etc/qtg/qtg.env).";
  if (c->needs_db && !own_db && qtg_resolve_database(&s, root, hint) != 0) {
    qtg_settings_free(&s);
    return 1;
  }
  if (strcmp(cmd, "signer") == 0) {
    const char *url = qtg_settings_str(&s, QTG_S_SIGNER_DATABASE_URL);
    int rc = qtg_signerd_main(&s, url[0] ? url : qtg_settings_str(&s, QTG_S_DATABASE_URL), root);
    qtg_settings_free(&s);
    return rc;
  }
  int rc = qtg_run_command(root, &s, cmd, argc - argi, argv + argi);
  qtg_settings_free(&s);
  return rc;
}
