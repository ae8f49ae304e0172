/* qtg_console_session.h -- inside the console server: the server's and a
 * session's state, shared by qtg_console.c (the socket, the subsystem, the
 * Lua module) and qtg_console_session.c (one connection: framing, commands
 * as tasks, output, the guard that interrupts busy Lua).  Not for other
 * files: qtg_console.h is the console's public face. */
#ifndef QTG_CONSOLE_SESSION_H
#define QTG_CONSOLE_SESSION_H

#include <stdint.h>
#include <sys/un.h>

#include "qtg_console.h"
#include "qtg_host.h"

/* How many consoles may be attached at once, how much queued input one may
 * hold, and how much unsent output before the server gives up on it. */
#define QTG_CONSOLE_MAX_SESSIONS 32
#define QTG_CONSOLE_MAX_QUEUED 64
#define QTG_CONSOLE_MAX_UNSENT (64u << 20)
#define QTG_CONSOLE_READ_CHUNK 65536
/* The guard hook runs every GUARD_COUNT VM instructions of any Lua code
 * while a console command runs (every instruction while one must stop),
 * and looks at the client's socket at most every GUARD_PERIOD_NS. */
#define QTG_CONSOLE_GUARD_COUNT 10000
#define QTG_CONSOLE_GUARD_PERIOD_NS 50000000ull
/* A command that runs Lua MG_CONSOLE_BUSY_LIMIT_SECONDS without giving the
 * loop back (no I/O, no sleep) is ended: meanwhile no worker, console or
 * signal is served.  A prepare handle counts the loop's iterations, so the
 * guard knows when the command last let the loop run. */

typedef struct qtg_console_session qtg_console_session;

typedef struct qtg_console_frame {
  struct qtg_console_frame *next;
  int type;
  size_t len;
  char data[];
} qtg_console_frame;

struct qtg_console_session {
  struct qtg_console *console;    /* NULL once the console is closed */
  qtg_host *host;
  uv_pipe_t pipe;
  uint64_t id;
  unsigned long uid;
  long pid;
  unsigned char *in;              /* bytes received, not yet framed */
  size_t in_len, in_cap;
  qtg_console_frame *queue_head, *queue_tail;
  int queued;
  qtg_task *task;                 /* the running command (set by guard()), or NULL */
  int busy;                       /* a command runs (set before spawn) */
  uint64_t command;               /* its number: the owner of its tasks */
  const char *stop;               /* why it must end: the guard raises this at
                                   * every hook call until its task ends */
  uint64_t last_look;             /* uv_hrtime of the guard's last look */
  uint64_t seen_iteration;        /* loop iteration the guard last saw */
  uint64_t burst_start;           /* when the command last got the CPU */
  uint64_t last_active;           /* uv_hrtime of its last input or command's end */
  int table_ref;                  /* Lua table handed to every command */
  int pipe_open;                  /* close callback not yet run */
  int dropping;                   /* no more input or output */
  qtg_console_session *next, *prev;
};

struct qtg_console {
  qtg_host *host;
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
  int is_run_dir;
  uv_pipe_t server;
  uv_prepare_t prepare;           /* counts loop iterations for the guard */
  uint64_t iterations;
  int prepare_open;
  int listening;                  /* server handle initialised */
  int server_closing;             /* its close callback has not run yet */
  int closing;                    /* qtg_console_close is running */
  int free_on_close;              /* free this struct in the close callback */
  int bound;                      /* we created the socket file */
  int handler_ref;                /* the Lua trampoline */
  uint64_t next_id;
  uint64_t next_command;          /* command numbers (task owners), from 1 */
  int stopping;                   /* some command has `stop` set: hook every instruction */
  uint64_t busy_limit_ns;         /* MG_CONSOLE_BUSY_LIMIT_SECONDS */
  uint64_t idle_ns;               /* MG_CONSOLE_IDLE_SECONDS */
  /* A task a command spawned that outlived it (an orphan): the guard holds
   * it to the busy limit too, within one loop iteration (a stopped orphan
   * cannot yield, so it ends before the loop turns again). */
  void *orphan_task;              /* the orphan running now (compared, never used) */
  uint64_t orphan_iteration, orphan_start;
  int orphan_stopped;
  int nsessions;
  qtg_console_session *sessions;
};

/* A new client on the listening socket (uv_connection_cb). */
void qtg_console_accept(uv_stream_t *server, int status);
/* Stop serving a session (see qtg_console_session.c); why is logged. */
void qtg_console_drop(qtg_console_session *sess, const char *why);
/* Detach a session from its console (it may outlive the console). */
void qtg_console_unlink(qtg_console_session *sess);
/* Queue one frame; 0, or -1 when the session is gone (then dropped). */
int qtg_console_send(qtg_console_session *sess, int type, const char *data, size_t len);
qtg_console_session *qtg_console_find(struct qtg_console *c, uint64_t id);
/* Arm the guard hook for the command whose task runs now (see "the
 * guard"); called first by the command, on its own thread L. */
void qtg_console_guard(qtg_console_session *sess, lua_State *L);
/* Make the running command end (uncatchably) with `why`, a static string. */
void qtg_console_stop(qtg_console_session *sess, const char *why);

#endif
