/* qtg_console_client.h -- `qtgd console`: attach to a running qtgd's console
 * socket, interactively (libedit line editing, history, Tab completion) or
 * for scripts (`-e CODE`, or Lua on a piped standard input).
 */
#ifndef QTG_CONSOLE_CLIENT_H
#define QTG_CONSOLE_CLIENT_H

#include "qtg_settings.h"

/* argv[0] is the subcommand's name ("console"); options follow:
 *   -e CODE        run CODE and exit (repeatable, run in order)
 *   --socket PATH  the console socket (default as the daemon computes it)
 *   -q             no banner
 * root_dir is the daemon's root (where lua/ lives): it names the default
 * run directory when neither MG_CONSOLE_SOCKET nor MG_RUN_DIR is set.
 * Returns the process exit status: 0 ok, 1 a command failed, 2 usage or
 * connection error (not running, refused, lost), 130 interrupted. */
int qtg_console_client_main(int argc, char **argv, qtg_settings *s, const char *root_dir);

#endif
