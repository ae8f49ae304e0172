/* qtg_console_client.c -- `qtgd console`: the operator's side of the console
 * socket (wire format in qtg_console.h).
 *
 * Interactive when standard input is a terminal: libedit with history
 * (~/.qtg_console_history, 0600), a continuation prompt while the server
 * says a chunk is incomplete, and Tab completion answered by the server
 * (which sees the live state).  Otherwise it runs each -e CODE, or the Lua
 * read from standard input, and stops at the first error with status 1.
 *
 * Ctrl-C is read from a signalfd (SIGINT stays blocked), so there is no
 * signal handler and no global flag: while a command runs it sends an
 * interrupt frame; at the prompt it drops the line being typed.
 */
#include "qtg_console_client.h"

#include <errno.h>
#include <histedit.h>
#include <limits.h>
#include <locale.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <wchar.h>

#include "qtg_console.h"

enum { QTG_CLIENT_OK = 0, QTG_CLIENT_FAILED = 1, QTG_CLIENT_BROKEN = 2, QTG_CLIENT_SIGINT = 130 };

typedef struct {
  int fd;                /* the console socket */
  int sigfd;             /* SIGINT as a file descriptor */
  int interactive;
  int sigint;            /* Ctrl-C seen at the prompt */
  int continuing;        /* the chunk so far is incomplete */
  EditLine *el;
  History *hist;
  char history_path[PATH_MAX];
} qtg_client;

typedef struct {
  int type;
  char *data;            /* NUL-terminated copy of the payload */
  size_t len;
} qtg_client_frame;

/* ---- connection ---------------------------------------------------------- */

/* Before anything is sent (commands may carry secrets an operator types),
 * the process behind the socket must be root, this user, or the owner of
 * the socket's directory when only that owner can write there (the
 * daemon's run directory): a socket another user slipped into a shared
 * directory is refused. */
static int qtg_client_check_peer(int fd, const char *path) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    fprintf(stderr, "qtgd console: cannot read the peer credentials of %s: %s\n", path, strerror(errno));
    return -1;
  }
  if (cred.uid == 0 || cred.uid == geteuid()) return 0;
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash == NULL) snprintf(dir, sizeof dir, ".");
  else if (slash == dir) slash[1] = '\0';
  else *slash = '\0';
  struct stat st;
  if (stat(dir, &st) == 0 && st.st_uid == cred.uid && !(st.st_mode & (S_IWGRP | S_IWOTH))) return 0;
  fprintf(stderr,
          "qtgd console: refusing %s: the process behind it runs as uid %lu, which is neither root, "
          "this user, nor the owner of %s (a socket planted by another user?)\n",
          path, (unsigned long)cred.uid, dir);
  return -1;
}

static int qtg_client_connect(qtg_client *c, const char *path) {
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof sa.sun_path) {
    fprintf(stderr, "qtgd console: socket path too long: %s\n", path);
    return -1;
  }
  memcpy(sa.sun_path, path, strlen(path) + 1);
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd < 0) {
    fprintf(stderr, "qtgd console: socket: %s\n", strerror(errno));
    return -1;
  }
  if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
    if (qtg_client_check_peer(c->fd, path) == 0) return 0;
    close(c->fd);
    c->fd = -1;
    return -1;
  }
  int e = errno;
  if (e == ENOENT)
    fprintf(stderr,
            "qtgd console: no console socket at %s: is qtgd running? (`qtgd run` creates it "
            "when MG_CONSOLE_ENABLED is true; give --socket, or the same MG_CONSOLE_SOCKET / "
            "MG_RUN_DIR as the daemon)\n", path);
  else if (e == ECONNREFUSED)
    fprintf(stderr,
            "qtgd console: %s refused the connection: qtgd is not running (the socket is left "
            "over from an earlier run)\n", path);
  else if (e == EACCES || e == EPERM)
    fprintf(stderr,
            "qtgd console: permission denied on %s: run as root or as the daemon's user\n", path);
  else
    fprintf(stderr, "qtgd console: cannot connect to %s: %s\n", path, strerror(e));
  close(c->fd);
  c->fd = -1;
  return -1;
}

/* Wait until fd is readable.  A Ctrl-C meanwhile sends an interrupt frame
 * when `running` (a command is executing), else returns 1 with c->sigint. */
static int qtg_client_send_frame(qtg_client *c, int type, const char *data, size_t len);

static int qtg_client_wait(qtg_client *c, int fd, int running) {
  for (;;) {
    struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = c->sigfd, .events = POLLIN}};
    int n = poll(p, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (p[1].revents & POLLIN) {
      struct signalfd_siginfo si;
      if (read(c->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (!running) {
          c->sigint = 1;
          return 1;
        }
        if (qtg_client_send_frame(c, QTG_CONSOLE_INTERRUPT, NULL, 0) != 0) return -1;
        if (c->interactive) fputs(" (interrupt sent)\n", stderr);
      }
    }
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) return 0;
  }
}

static int qtg_client_write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static int qtg_client_send_frame(qtg_client *c, int type, const char *data, size_t len) {
  unsigned char hdr[5];
  if (len + 1 > QTG_CONSOLE_MAX_FRAME_IN) {
    fprintf(stderr, "qtgd console: input of %zu bytes is over the console's limit of %u\n", len,
            QTG_CONSOLE_MAX_FRAME_IN - 1);
    return 1;
  }
  qtg_console_frame_header(hdr, type, len);
  if (qtg_client_write_all(c->fd, hdr, sizeof hdr) != 0 ||
      (len && qtg_client_write_all(c->fd, data, len) != 0)) {
    fprintf(stderr, "qtgd console: lost the connection to qtgd: %s\n", strerror(errno));
    return -1;
  }
  return 0;
}

/* Read exactly len bytes; `running` as for qtg_client_wait. */
static int qtg_client_read_all(qtg_client *c, void *buf, size_t len, int running) {
  char *p = buf;
  while (len > 0) {
    int w = qtg_client_wait(c, c->fd, running);
    if (w != 0) return -1;
    ssize_t n = read(c->fd, p, len);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return -1;
    }
    if (n == 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static int qtg_client_read_frame(qtg_client *c, qtg_client_frame *f, int running) {
  unsigned char hdr[4];
  f->data = NULL;
  if (qtg_client_read_all(c, hdr, 4, running) != 0) goto lost;
  uint32_t n = ((uint32_t)hdr[0] << 24) | ((uint32_t)hdr[1] << 16) | ((uint32_t)hdr[2] << 8) | hdr[3];
  if (n == 0 || n > QTG_CONSOLE_MAX_FRAME_OUT) {
    fprintf(stderr, "qtgd console: protocol error: frame of %lu bytes from qtgd\n",
            (unsigned long)n);
    return -1;
  }
  unsigned char type;
  if (qtg_client_read_all(c, &type, 1, running) != 0) goto lost;
  f->type = type;
  f->len = n - 1;
  f->data = malloc(f->len + 1);
  if (!f->data) {
    fprintf(stderr, "qtgd console: out of memory\n");
    return -1;
  }
  if (f->len && qtg_client_read_all(c, f->data, f->len, running) != 0) {
    free(f->data);
    f->data = NULL;
    goto lost;
  }
  f->data[f->len] = 0;
  return 0;
lost:
  fprintf(stderr, "qtgd console: the connection to qtgd was closed\n");
  return -1;
}

/* ---- running one chunk -------------------------------------------------- */

static void qtg_client_print(FILE *out, const char *s, size_t len) {
  if (!len) return;
  fwrite(s, 1, len, out);
  if (s[len - 1] != '\n') fputc('\n', out);
  fflush(out);
}

/* Send 'e' and print what comes back.  Returns 0 (ok), 1 (error), 2
 * (incomplete: *more_msg gets the parser's message), -1 (connection gone). */
static int qtg_client_eval(qtg_client *c, const char *code, size_t len, char **more_msg) {
  int rc = qtg_client_send_frame(c, QTG_CONSOLE_EVAL, code, len);
  if (rc != 0) return rc;
  for (;;) {
    qtg_client_frame f;
    if (qtg_client_read_frame(c, &f, 1) != 0) return -1;
    switch (f.type) {
    case QTG_CONSOLE_OUTPUT:
      fwrite(f.data, 1, f.len, stdout);
      fflush(stdout);
      break;
    case QTG_CONSOLE_RESULT:
      qtg_client_print(stdout, f.data, f.len);
      free(f.data);
      return 0;
    case QTG_CONSOLE_ERROR:
      fflush(stdout);
      qtg_client_print(stderr, f.data, f.len);
      free(f.data);
      return 1;
    case QTG_CONSOLE_MORE:
      if (more_msg) {
        *more_msg = f.data;
      } else {
        free(f.data);
      }
      return 2;
    case QTG_CONSOLE_FATAL:
      fprintf(stderr, "qtgd console: %s\n", f.data);
      free(f.data);
      return -1;
    default:
      break; /* hello or completions: not expected here; ignore */
    }
    free(f.data);
  }
}

/* ---- non-interactive --------------------------------------------------- */

static int qtg_client_run_strings(qtg_client *c, char **codes, int n) {
  for (int i = 0; i < n; i++) {
    char *more = NULL;
    int rc = qtg_client_eval(c, codes[i], strlen(codes[i]), &more);
    if (rc == 2) {
      fprintf(stderr, "qtgd console: incomplete Lua in -e: %s\n", more ? more : "");
      free(more);
      return QTG_CLIENT_FAILED;
    }
    if (rc < 0) return QTG_CLIENT_BROKEN;
    if (rc == 1) return QTG_CLIENT_FAILED;
  }
  return QTG_CLIENT_OK;
}

/* Append the next line of standard input (with its newline, if any) to
 * *chunk.  Reads the descriptor directly (no stdio buffer, so waiting on it
 * together with Ctrl-C is exact).  Returns 1 (a line), 0 (end of input),
 * -1 (error), 2 (Ctrl-C). */
typedef struct {
  char buf[65536];
  size_t start, end;
  int eof;
} qtg_client_input;

static int qtg_client_next_line(qtg_client *c, qtg_client_input *in, char **chunk, size_t *clen) {
  for (;;) {
    char *nl = memchr(in->buf + in->start, '\n', in->end - in->start);
    size_t take = nl ? (size_t)(nl - (in->buf + in->start)) + 1
                     : (in->eof || in->end - in->start == sizeof in->buf ? in->end - in->start : 0);
    if (take) {
      char *grown = realloc(*chunk, *clen + take + 1);
      if (!grown) return -1;
      *chunk = grown;
      memcpy(*chunk + *clen, in->buf + in->start, take);
      *clen += take;
      (*chunk)[*clen] = 0;
      in->start += take;
      if (nl || in->eof) return 1;
      continue;                       /* a line longer than the buffer */
    }
    if (in->eof) return 0;
    if (in->start > 0) {
      memmove(in->buf, in->buf + in->start, in->end - in->start);
      in->end -= in->start;
      in->start = 0;
    }
    int w = qtg_client_wait(c, STDIN_FILENO, 0);
    if (w == 1) return 2;
    if (w < 0) return -1;
    ssize_t n = read(STDIN_FILENO, in->buf + in->end, sizeof in->buf - in->end);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return -1;
    }
    if (n == 0) in->eof = 1;
    in->end += (size_t)n;
  }
}

/* Lua on a pipe: lines are gathered until they form a complete chunk. */
static int qtg_client_run_stdin(qtg_client *c) {
  char *chunk = NULL, *more = NULL;
  size_t clen = 0;
  int status = QTG_CLIENT_OK;
  qtg_client_input *in = calloc(1, sizeof *in);
  if (!in) {
    fprintf(stderr, "qtgd console: out of memory\n");
    return QTG_CLIENT_BROKEN;
  }
  for (;;) {
    int r = qtg_client_next_line(c, in, &chunk, &clen);
    if (r == 0) break;
    if (r == 2) {
      status = QTG_CLIENT_SIGINT;
      break;
    }
    if (r < 0) {
      fprintf(stderr, "qtgd console: cannot read standard input: %s\n", strerror(errno));
      status = QTG_CLIENT_BROKEN;
      break;
    }
    free(more);
    more = NULL;
    int rc = qtg_client_eval(c, chunk, clen, &more);
    if (rc < 0) {
      status = QTG_CLIENT_BROKEN;
      break;
    }
    if (rc == 1) {
      status = QTG_CLIENT_FAILED;
      break;
    }
    if (rc == 0) clen = 0;
  }
  if (status == QTG_CLIENT_OK && clen > 0) {
    fprintf(stderr, "qtgd console: input ended inside an incomplete chunk: %s\n",
            more ? more : "");
    status = QTG_CLIENT_FAILED;
  }
  free(more);
  free(chunk);
  free(in);
  return status;
}

/* ---- interactive ---------------------------------------------------------- */

static char *qtg_client_prompt(EditLine *el) {
  qtg_client *c = NULL;
  el_get(el, EL_CLIENTDATA, &c);
  return (char *)(c && c->continuing ? "  ... " : "qtg> ");
}

/* libedit's character reader, waiting on the terminal and on Ctrl-C. */
static int qtg_client_getc(EditLine *el, wchar_t *wc) {
  qtg_client *c = NULL;
  el_get(el, EL_CLIENTDATA, &c);
  mbstate_t st;
  memset(&st, 0, sizeof st);
  for (;;) {
    int w = qtg_client_wait(c, STDIN_FILENO, 0);
    if (w == 1) {
      errno = EINTR;
      return -1;
    }
    if (w < 0) return -1;
    char ch;
    ssize_t n = read(STDIN_FILENO, &ch, 1);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return (int)n;
    size_t r = mbrtowc(wc, &ch, 1, &st);
    if (r == (size_t)-2) continue;              /* more bytes of this character */
    if (r == (size_t)-1) {                      /* invalid: pass the byte through */
      memset(&st, 0, sizeof st);
      *wc = (wchar_t)(unsigned char)ch;
    }
    return 1;
  }
}

static size_t qtg_client_common_prefix(char **v, size_t n) {
  size_t len = strlen(v[0]);
  for (size_t i = 1; i < n; i++) {
    size_t j = 0;
    while (j < len && v[i][j] == v[0][j]) j++;
    len = j;
  }
  return len;
}

/* Tab: ask the server for the completions of the word before the cursor. */
static unsigned char qtg_client_complete(EditLine *el, int ch) {
  (void)ch;
  qtg_client *c = NULL;
  el_get(el, EL_CLIENTDATA, &c);
  const LineInfo *li = el_line(el);
  const char *start = li->cursor;
  while (start > li->buffer) {
    char p = start[-1];
    if (!(p == '_' || p == '.' || p == ':' || (p >= '0' && p <= '9') || (p >= 'a' && p <= 'z') ||
          (p >= 'A' && p <= 'Z')))
      break;
    start--;
  }
  size_t wlen = (size_t)(li->cursor - start);
  if (qtg_client_send_frame(c, QTG_CONSOLE_COMPLETE, start, wlen) != 0) return CC_ERROR;
  qtg_client_frame f;
  do {
    if (qtg_client_read_frame(c, &f, 1) != 0) return CC_EOF;
    if (f.type != QTG_CONSOLE_COMPLETIONS) free(f.data);
  } while (f.type != QTG_CONSOLE_COMPLETIONS && f.type != QTG_CONSOLE_ERROR &&
           f.type != QTG_CONSOLE_FATAL);
  if (f.type != QTG_CONSOLE_COMPLETIONS) return CC_REFRESH_BEEP;
  size_t n = 0;
  for (size_t i = 0; i < f.len; i++)
    if (f.data[i] == '\n') n++;
  if (f.len && f.data[f.len - 1] != '\n') n++;
  unsigned char rc = CC_REFRESH_BEEP;
  char **v = n ? calloc(n, sizeof *v) : NULL;
  if (n && v) {
    size_t k = 0;
    char *save = NULL;
    for (char *tok = strtok_r(f.data, "\n", &save); tok && k < n; tok = strtok_r(NULL, "\n", &save))
      v[k++] = tok;
    n = k;
    size_t common = n ? qtg_client_common_prefix(v, n) : 0;
    if (n && common > wlen) {
      char saved = v[0][common];
      v[0][common] = 0;
      rc = el_insertstr(el, v[0] + wlen) == 0 ? CC_REFRESH : CC_ERROR;
      v[0][common] = saved;
    } else if (n > 1) {
      fputc('\n', stdout);
      for (size_t i = 0; i < n; i++) fprintf(stdout, "%s%s", v[i], i + 1 < n ? "  " : "\n");
      fflush(stdout);
      rc = CC_REDISPLAY;
    }
  }
  free(v);
  free(f.data);
  return rc;
}

static int qtg_client_editor_open(qtg_client *c, const char *argv0) {
  HistEvent ev;
  c->el = el_init(argv0, stdin, stdout, stderr);
  c->hist = history_init();
  if (!c->el || !c->hist) {
    fprintf(stderr, "qtgd console: cannot start the line editor\n");
    return -1;
  }
  history(c->hist, &ev, H_SETSIZE, 1000);
  history(c->hist, &ev, H_SETUNIQUE, 1);
  const char *home = getenv("HOME");
  if (home && home[0]) {
    int n = snprintf(c->history_path, sizeof c->history_path, "%s/.qtg_console_history", home);
    if (n < 0 || (size_t)n >= sizeof c->history_path) c->history_path[0] = 0;
    if (c->history_path[0]) history(c->hist, &ev, H_LOAD, c->history_path);
  }
  el_set(c->el, EL_CLIENTDATA, c);
  el_set(c->el, EL_EDITOR, "emacs");
  el_set(c->el, EL_SIGNAL, 1);
  el_set(c->el, EL_PROMPT, qtg_client_prompt);
  el_set(c->el, EL_HIST, history, c->hist);
  el_set(c->el, EL_GETCFN, qtg_client_getc);
  /* The wide call: the narrow el_set(EL_ADDFN) copies both strings and
   * never frees them (a leak at every exit, which the ASan pass of
   * console_client_spec reports); el_wset keeps these static ones. */
  el_wset(c->el, EL_ADDFN, L"qtg-complete", L"complete from the live state", qtg_client_complete);
  el_set(c->el, EL_BIND, "^I", "qtg-complete", NULL);
  el_source(c->el, NULL); /* ~/.editrc, if the operator has one */
  return 0;
}

static void qtg_client_editor_close(qtg_client *c) {
  HistEvent ev;
  if (c->hist && c->history_path[0]) {
    mode_t old = umask(077);
    if (history(c->hist, &ev, H_SAVE, c->history_path) >= 0) chmod(c->history_path, 0600);
    umask(old);
  }
  if (c->el) el_end(c->el);
  if (c->hist) history_end(c->hist);
  c->el = NULL;
  c->hist = NULL;
}

static int qtg_client_interactive(qtg_client *c, const char *argv0) {
  if (qtg_client_editor_open(c, argv0) != 0) {
    qtg_client_editor_close(c);
    return QTG_CLIENT_BROKEN;
  }
  fputs("Type help() for the operator commands; Ctrl-C interrupts, Ctrl-D leaves.\n", stdout);
  char *chunk = NULL;
  size_t clen = 0;
  int status = QTG_CLIENT_OK;
  for (;;) {
    int count = 0;
    c->sigint = 0;
    const char *line = el_gets(c->el, &count);
    if (!line) {
      if (c->sigint) {                  /* Ctrl-C at the prompt: drop the input */
        fputs("^C\n", stdout);
        clen = 0;
        c->continuing = 0;
        continue;
      }
      fputc('\n', stdout);
      break;                            /* Ctrl-D */
    }
    size_t n = strlen(line);
    char *grown = realloc(chunk, clen + n + 1);
    if (!grown) {
      fprintf(stderr, "qtgd console: out of memory\n");
      status = QTG_CLIENT_BROKEN;
      break;
    }
    chunk = grown;
    memcpy(chunk + clen, line, n);
    clen += n;
    chunk[clen] = 0;
    int blank = 1;
    for (size_t i = 0; i < clen; i++)
      if (chunk[i] != ' ' && chunk[i] != '\t' && chunk[i] != '\n') blank = 0;
    if (blank) {
      clen = 0;
      continue;
    }
    int rc = qtg_client_eval(c, chunk, clen, NULL);
    if (rc < 0) {
      status = QTG_CLIENT_BROKEN;
      break;
    }
    c->continuing = rc == 2;
    if (rc != 2) {
      HistEvent ev;
      if (chunk[clen - 1] == '\n') chunk[clen - 1] = 0;
      history(c->hist, &ev, H_ENTER, chunk);
      clen = 0;
    }
  }
  free(chunk);
  qtg_client_editor_close(c);
  return status;
}

/* ---- main --------------------------------------------------------------- */

static void qtg_client_usage(FILE *out) {
  fputs("usage: qtgd console [-e CODE]... [--socket PATH] [-q]\n"
        "  Attach to the running qtgd's operator console.\n"
        "  -e CODE        run CODE (Lua) and exit; repeatable; stops at the first error\n"
        "  --socket PATH  console socket (default: MG_CONSOLE_SOCKET, else <run dir>/console.sock)\n"
        "  -q             no banner\n"
        "  Without -e and with standard input not a terminal, runs the Lua read from it.\n"
        "  Exit status: 0 ok, 1 a command failed, 2 usage or connection error, 130 interrupted.\n",
        out);
}

int qtg_console_client_main(int argc, char **argv, qtg_settings *s, const char *root_dir) {
  qtg_client c = {.fd = -1, .sigfd = -1};
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
  const char *socket_path = NULL;
  char **codes = calloc((size_t)(argc > 0 ? argc : 1), sizeof *codes);
  int ncodes = 0, quiet = 0, status = QTG_CLIENT_BROKEN;
  sigset_t mask, oldmask;
  int masked = 0;
  if (!codes) {
    fprintf(stderr, "qtgd console: out of memory\n");
    return QTG_CLIENT_BROKEN;
  }
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-e") && i + 1 < argc) {
      codes[ncodes++] = argv[++i];
    } else if ((!strcmp(a, "--socket") || !strcmp(a, "-s")) && i + 1 < argc) {
      socket_path = argv[++i];
    } else if (!strncmp(a, "--socket=", 9)) {
      socket_path = a + 9;
    } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
      quiet = 1;
    } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      qtg_client_usage(stdout);
      free(codes);
      return QTG_CLIENT_OK;
    } else {
      fprintf(stderr, "qtgd console: unknown or incomplete option '%s'\n", a);
      qtg_client_usage(stderr);
      free(codes);
      return QTG_CLIENT_BROKEN;
    }
  }
  if (!socket_path) {
    char err[256];
    int is_run_dir;
    if (qtg_console_socket_path(s, root_dir, path, sizeof path, &is_run_dir, err, sizeof err) != 0) {
      fprintf(stderr, "qtgd console: %s\n", err);
      free(codes);
      return QTG_CLIENT_BROKEN;
    }
    socket_path = path;
  }
  setlocale(LC_CTYPE, "");
  c.interactive = ncodes == 0 && isatty(STDIN_FILENO);
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  if (sigprocmask(SIG_BLOCK, &mask, &oldmask) != 0 ||
      (masked = 1, c.sigfd = signalfd(-1, &mask, SFD_CLOEXEC)) < 0) {
    fprintf(stderr, "qtgd console: cannot watch Ctrl-C: %s\n", strerror(errno));
    goto out;
  }
  if (qtg_client_connect(&c, socket_path) != 0) goto out;
  qtg_client_frame hello;
  if (qtg_client_read_frame(&c, &hello, 0) != 0) goto out;
  if (hello.type == QTG_CONSOLE_FATAL) {
    fprintf(stderr, "qtgd console: %s\n", hello.data);
    free(hello.data);
    goto out;
  }
  if (hello.type != QTG_CONSOLE_HELLO) {
    fprintf(stderr, "qtgd console: protocol error: %s did not greet as a qtgd console\n",
            socket_path);
    free(hello.data);
    goto out;
  }
  if (c.interactive && !quiet) printf("%s\n", hello.data);
  free(hello.data);
  if (ncodes)
    status = qtg_client_run_strings(&c, codes, ncodes);
  else if (c.interactive)
    status = qtg_client_interactive(&c, argc > 0 ? argv[0] : "qtgd");
  else
    status = qtg_client_run_stdin(&c);
out:
  if (c.fd >= 0) close(c.fd);
  if (c.sigfd >= 0) close(c.sigfd);
  if (masked) sigprocmask(SIG_SETMASK, &oldmask, NULL);
  free(codes);
  return status;
}
