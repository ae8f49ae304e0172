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
 * URL (MG_SIGNER_DATABASE_URL, else MG_DATABASE_URL); root_dir locates the
 * default run directory.  Returns the process exit code (0 after a signal,
 * 1 when it cannot start). */
int qtg_signerd_main(const qtg_settings *s, const char *db_url, const char *root_dir);

/* The socket path both sides use: MG_SIGNER_SOCKET, else <run dir>/signer.sock
 * (MG_RUN_DIR, $RUNTIME_DIRECTORY, or <root>/var/run).  0 or -1 with err. */
int qtg_signer_socket_path(const qtg_settings *s, const char *root_dir, char *buf,
                           size_t buflen, char *err, size_t errlen);

#endif
