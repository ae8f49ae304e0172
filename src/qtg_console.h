/* qtg_console.h -- the operator console: a Unix socket inside qtgd that runs
 * each operator input as a Lua task in the live state, and its wire format.
 *
 * Why a socket and not a TCP port: only people who can already log in to
 * the host as root or as the daemon's user may attach (the socket is 0600
 * in a 0700 directory, and the peer's uid is checked with SO_PEERCRED).
 *
 * The wire format (both directions) is a stream of frames:
 *
 *   4 bytes  length N of what follows, unsigned big-endian, N >= 1
 *   1 byte   frame type
 *   N-1      payload bytes
 *
 * client -> server: 'e' evaluate payload (Lua), 'c' complete payload (the
 *   word before the cursor), 'i' interrupt the running command (no payload).
 * server -> client: 'h' hello banner, 'o' output printed by the command,
 *   and exactly one final frame per 'e'/'c': 'r' result text, 'x' error text
 *   (message and traceback), 'm' more input needed (incomplete chunk), 'k'
 *   completions (one per line); 'f' fatal (refused peer, malformed or
 *   oversized frame), after which the server closes the connection.
 * docs/console.md is the operator's description of the same.
 *
 * The server is started from Lua (qtg.console_server.start(), called by the
 * daemon's entry when MG_CONSOLE_ENABLED) and never by qtg_console_open, so
 * that `qtgd migrate` or `qtgd console` itself never bind the socket.
 */
#ifndef QTG_CONSOLE_H
#define QTG_CONSOLE_H

#include <stddef.h>
#include <stdint.h>

#include "qtg_settings.h"

/* Largest frame (type + payload) a client may send, and the largest the
 * server sends (bigger results are cut by the Lua side before that). */
#define QTG_CONSOLE_MAX_FRAME_IN (1u << 20)
#define QTG_CONSOLE_MAX_FRAME_OUT (16u << 20)

/* Frame types. */
enum {
  QTG_CONSOLE_EVAL = 'e',
  QTG_CONSOLE_COMPLETE = 'c',
  QTG_CONSOLE_INTERRUPT = 'i',
  QTG_CONSOLE_HELLO = 'h',
  QTG_CONSOLE_OUTPUT = 'o',
  QTG_CONSOLE_RESULT = 'r',
  QTG_CONSOLE_ERROR = 'x',
  QTG_CONSOLE_MORE = 'm',
  QTG_CONSOLE_COMPLETIONS = 'k',
  QTG_CONSOLE_FATAL = 'f'
};

/* The packaged qtgd.service's runtime directory (RuntimeDirectory=qtg). */
#define QTG_PACKAGED_RUN_DIR "/run/qtg"

/* Where the socket lives: MG_CONSOLE_SOCKET, else <run dir>/console.sock,
 * the run dir being MG_RUN_DIR, else $RUNTIME_DIRECTORY (systemd), else
 * QTG_PACKAGED_RUN_DIR for the packaged qtgd (root_dir is the installed
 * data dir: a shell's `qtgd console` finds the service's socket), else
 * <root_dir>/var/run.  Writes the path into buf; returns 0, or -1 with a
 * message in err when the path does not fit a Unix socket address.
 * *is_run_dir is set to 1 when the socket's directory is the run dir (the
 * server then makes that directory 0700). */
int qtg_console_socket_path(const qtg_settings *s, const char *root_dir, char *buf,
                            size_t buflen, int *is_run_dir, char *err, size_t errlen);

/* Write one frame header (5 bytes) for a payload of len bytes. */
void qtg_console_frame_header(unsigned char hdr[5], int type, size_t len);

#endif
