/* fuzz_console.c -- the `console` target: bytes on the console's Unix
 * socket, read by the real server (src/qtg_console*.c) in a real host.
 *
 * The Lua side of the console is replaced by a stand-in handler (installed
 * as package.loaded["qtg.console"] before the server starts), because what
 * an operator's Lua does is the operator's business; the framing, queueing,
 * interrupts, output frames, task ends and session ends are what is under
 * test.  The stand-in acts on a command's first byte: s sleeps 2 ms (so an
 * interrupt finds a waiting task), o writes an output frame, e raises a
 * string, t raises a table, z answers an unknown frame type, n answers
 * nothing, b runs a short busy loop, m asks for more input; a completion
 * ('c') answers 'k'; anything else answers 'r'.
 *
 * Input byte 0: bit 0 = close the write side right after sending (else wait
 * until every command was answered first); bits 1-3 = chunk size (1, 2, 3,
 * 7, 64, 512, 4096 or all at once; the loop runs between chunks).  The rest
 * is sent as is.
 *
 * Properties: the server's frames are well formed (known type, 1 <= length
 * <= QTG_CONSOLE_MAX_FRAME_OUT, the hello first); nothing follows a fatal
 * frame; at most one final frame ('r', 'x', 'm', 'k') per complete 'e'/'c'
 * frame sent before the first malformed one, exactly one each when no fatal
 * frame came and the client waited; a malformed frame gets a fatal frame;
 * the server closes after the client does, the session is freed and no task
 * is left; all within 10 s (else: a hang). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "qtg_console.h"
#include "qtg_console_session.h"
#include "qtg_fuzz.h"
#include "qtg_host.h"

static const char fuzz_console_lua[] =
    "local qtg = require 'qtg'\n"
    "package.loaded['qtg.console'] = { handle = function(session, kind, payload)\n"
    "  local c = payload:sub(1, 1)\n"
    "  if c == 's' then qtg.sleep(0.002) end\n"
    "  if c == 'o' then qtg.console_server.write(session.id, 'o', payload) end\n"
    "  if c == 'e' then error('fuzz: raised') end\n"
    "  if c == 't' then error({ kind = 'fuzz' }) end\n"
    "  if c == 'z' then return 'q', 'unknown' end\n"
    "  if c == 'n' then return end\n"
    "  if c == 'b' then local x = 0; for i = 1, 100000 do x = x + i end end\n"
    "  if kind == 'c' then return 'k', payload:sub(1, 32) end\n"
    "  if c == 'm' then return 'm', '' end\n"
    "  return 'r', payload:sub(1, 64)\n"
    "end }\n"
    "return qtg.console_server.start()\n";

static int fuzz_console_started;
static char fuzz_console_path[sizeof(((struct sockaddr_un *)0)->sun_path)];

static int fuzz_console_start(qtg_host *h) {
  if (fuzz_console_started) return 0;
  if (luaL_loadbuffer(h->L, fuzz_console_lua, sizeof fuzz_console_lua - 1, "=fuzz_console") != 0 ||
      lua_pcall(h->L, 0, 1, 0) != 0) {
    fprintf(stderr, "fuzz console: %s\n", lua_tostring(h->L, -1));
    return -1;
  }
  snprintf(fuzz_console_path, sizeof fuzz_console_path, "%s", lua_tostring(h->L, -1));
  lua_pop(h->L, 1);
  fuzz_console_started = 1;
  return 0;
}

typedef struct {
  unsigned char *buf;
  size_t len, cap;
  int frames, finals, fatal, after_fatal, bad, hello_first, eof;
} fuzz_reader;

static void fuzz_reader_parse(fuzz_reader *r) {
  while (r->len >= 4) {
    uint32_t n = ((uint32_t)r->buf[0] << 24) | ((uint32_t)r->buf[1] << 16) |
                 ((uint32_t)r->buf[2] << 8) | r->buf[3];
    if (n == 0 || n > QTG_CONSOLE_MAX_FRAME_OUT) {
      r->bad = 1;
      r->len = 0;
      return;
    }
    if (r->len < 4 + (size_t)n) return;
    int type = r->buf[4];
    if (r->frames == 0) r->hello_first = type == QTG_CONSOLE_HELLO;
    if (r->fatal) r->after_fatal = 1;
    switch (type) {
    case QTG_CONSOLE_RESULT: case QTG_CONSOLE_ERROR: case QTG_CONSOLE_MORE:
    case QTG_CONSOLE_COMPLETIONS: r->finals++; break;
    case QTG_CONSOLE_FATAL: r->fatal = 1; break;
    case QTG_CONSOLE_HELLO: case QTG_CONSOLE_OUTPUT: break;
    default: r->bad = 1;
    }
    r->frames++;
    memmove(r->buf, r->buf + 4 + n, r->len - 4 - n);
    r->len -= 4 + n;
  }
}

static void fuzz_reader_pull(fuzz_reader *r, int fd) {
  for (;;) {
    if (r->cap - r->len < 65536) {
      r->cap = r->cap ? r->cap * 2 : 131072;
      r->buf = realloc(r->buf, r->cap);
      if (!r->buf) abort();
    }
    ssize_t n = recv(fd, r->buf + r->len, r->cap - r->len, MSG_DONTWAIT);
    if (n > 0) {
      r->len += (size_t)n;
      fuzz_reader_parse(r);
      continue;
    }
    if (n == 0) r->eof = 1;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) r->eof = 1;
    return;
  }
}

/* What the server must make of the bytes: complete 'e'/'c' frames before the
 * first malformed frame, and whether there is a malformed one. */
static void fuzz_console_expect(const uint8_t *p, size_t len, int *commands, int *malformed) {
  *commands = 0;
  *malformed = 0;
  while (len >= 4) {
    uint32_t n = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
    if (n == 0 || n > QTG_CONSOLE_MAX_FRAME_IN) { *malformed = 1; return; }
    if (len < 4 + (size_t)n) return;
    int type = p[4];
    if (type == QTG_CONSOLE_EVAL || type == QTG_CONSOLE_COMPLETE) (*commands)++;
    else if (type != QTG_CONSOLE_INTERRUPT) { *malformed = 1; return; }
    p += 4 + n;
    len -= 4 + n;
  }
}

static void fuzz_console_spin(qtg_host *h) {
  if (uv_run(h->loop, UV_RUN_NOWAIT) == 0) usleep(50);
  else usleep(20);
}

int qtg_fuzz_console(const uint8_t *data, size_t size) {
  static const size_t chunks[] = {1, 2, 3, 7, 64, 512, 4096, (size_t)-1};
  if (size == 0) return 0;
  qtg_host *h = qtg_fuzz_host();
  if (fuzz_console_start(h) != 0) return -1;
  int abrupt = data[0] & 1;
  size_t chunk = chunks[(data[0] >> 1) & 7];
  const uint8_t *wire = data + 1;
  size_t wire_len = size - 1, sent = 0;
  int commands, malformed, rc = 0;
  fuzz_console_expect(wire, wire_len, &commands, &malformed);
  int base_tasks = h->live_tasks;

  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", fuzz_console_path);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    perror("fuzz console: connect");
    if (fd >= 0) close(fd);
    return -1;
  }
  fuzz_reader r;
  memset(&r, 0, sizeof r);
  uint64_t deadline = uv_hrtime() + 10000000000ull;
  int shut = 0;
  while (!r.eof) {
    if (uv_hrtime() > deadline) {
      fprintf(stderr, "console: no end after 10 s (sent %zu of %zu bytes, %d finals of %d)\n",
              sent, wire_len, r.finals, commands);
      rc = -1;
      break;
    }
    if (sent < wire_len && !r.fatal) {
      size_t n = wire_len - sent < chunk ? wire_len - sent : chunk;
      ssize_t w = send(fd, wire + sent, n, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w > 0) sent += (size_t)w;
      else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) sent = wire_len;
    }
    if (!shut && (sent == wire_len || r.fatal) &&
        (abrupt || r.fatal || r.finals >= commands)) {
      shutdown(fd, SHUT_WR);
      shut = 1;
    }
    fuzz_console_spin(h);
    fuzz_reader_pull(&r, fd);
  }
  close(fd);
  /* The session must go away and take its tasks with it. */
  while (rc == 0 && (h->console->nsessions > 0 || h->live_tasks > base_tasks)) {
    if (uv_hrtime() > deadline) {
      fprintf(stderr, "console: session or task left after the client closed (%d sessions, %d tasks)\n",
              h->console->nsessions, h->live_tasks - base_tasks);
      rc = -1;
      break;
    }
    fuzz_console_spin(h);
  }
  if (rc == 0) {
    const char *why = NULL;
    if (r.bad) why = "a malformed frame from the server";
    else if (!r.hello_first) why = "the first frame is not the hello";
    else if (r.after_fatal) why = "a frame after the fatal frame";
    else if (r.finals > commands) why = "more final frames than commands";
    else if (malformed && !r.fatal) why = "no fatal frame for a malformed frame";
    else if (!abrupt && !r.fatal && r.finals != commands) why = "a command without its final frame";
    if (why) {
      fprintf(stderr, "console: %s (%d commands, %d finals, fatal %d, malformed %d)\n", why,
              commands, r.finals, r.fatal, malformed);
      rc = -1;
    }
  }
  free(r.buf);
  return rc;
}
