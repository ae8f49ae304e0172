/* qtg_signerd.h -- `qtgd signer`: the process that alone holds the signer
 * keys and signs only what an approval allowed (docs/http-and-signing.md).
 *
 * Why a separate process: whoever runs Lua inside `qtgd run` (a policy
 * author, a console user) reaches its memory through FFI and `debug`; keys
 * in another process, under another uid, cannot be read from there, and that
 * process checks each payload against the rows itself before it signs.
 */
#ifndef QTG_SIGNERD_H
#define QTG_SIGNERD_H

#include "qtg_settings.h"

/* Run the signer until SIGTERM/SIGINT.  db_url is the resolved database
 * URL (MG_SIGNER_DATABASE_URL, else MG_DATABASE_URL; NULL or "" when
 * neither is set, which only a signer holding no key accepts, and then it
 * never connects); root_dir locates the default run directory.  Returns the process exit code (0 after a signal,
 * 1 when it cannot start). */
int qtg_signerd_main(const qtg_settings *s, const char *db_url, const char *root_dir);

/* Where a signer holding keys gets its database, said when it has none. */
#define QTG_SIGNERD_DATABASE_HINT                                                          \
  "A signer holding keys (MG_SIGNER_KEYS) reads the approval record from the database: "  \
  "set MG_SIGNER_DATABASE_URL (or MG_DATABASE_URL) to a PostgreSQL URL; the packaged "    \
  "signer reads /etc/qtg/signer.env."

/* 1 when `qtgd signer` needs a database: it is given keys (MG_SIGNER_KEYS).
 * A signer holding none has nothing to sign and starts without one. */
int qtg_signerd_needs_database(const qtg_settings *s);

/* The socket path both sides use: MG_SIGNER_SOCKET, else <run dir>/signer.sock
 * (MG_RUN_DIR, $RUNTIME_DIRECTORY, or <root>/var/run).  0 or -1 with err. */
int qtg_signer_socket_path(const qtg_settings *s, const char *root_dir, char *buf,
                           size_t buflen, char *err, size_t errlen);

#endif
