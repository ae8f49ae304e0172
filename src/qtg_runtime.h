/* qtg_runtime.h -- run_loop and the supervisor of worker groups.
 *
 * Each worker is a C struct with a libuv timer and a Lua tick function.
 * One pass ("tick") runs in its own task with a fresh database session,
 * exactly as the spec's run_loop: count returned, consecutive errors reset
 * on success, sleep interval +- jitter (floor 0.1 s), backoff
 * min(2^errors, 60) from the fifth consecutive error.  The core group fails
 * fast (a core worker that dies ends the process non-zero); a sidecar that
 * dies is logged and the rest go on. */
#ifndef QTG_RUNTIME_H
#define QTG_RUNTIME_H

#include "qtg_host.h"

#define QTG_RUNLOOP_MAX_CONSECUTIVE_ERRORS 5
#define QTG_RUNLOOP_MAX_BACKOFF_SECONDS 60.0
#define QTG_RUNLOOP_MIN_SLEEP_SECONDS 0.1
#define QTG_EXIT_CORE_FAILED 3

/* The sleep after a pass: u is uniform in [-1, 1]. Pure, for tests. */
double qtg_runloop_delay(int consecutive_errors, double interval, double jitter, double u);

/* Stop starting ticks; exit once in-flight ticks finish or the grace period
 * ends.  Idempotent. */
void qtg_runtime_shutdown(qtg_host *h, int exit_code, const char *why);
int qtg_runtime_running_ticks(qtg_host *h);

#endif
