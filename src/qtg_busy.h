/* qtg_busy.h -- the busy guard: a task that holds the loop is stopped
 * (see qtg_busy.c).  Started by `qtgd run` and `qtgd check` with
 * MG_TASK_BUSY_LIMIT_SECONDS; the task scheduler (qtg_host.c) tells it when
 * a resume starts and ends and when a task ends. */
#ifndef QTG_BUSY_H
#define QTG_BUSY_H

#include "qtg_host.h"

/* 0, or -1 with a message (a second guard in one process, no thread).
 * console_limit_seconds: MG_CONSOLE_BUSY_LIMIT_SECONDS (0: off), whose 2.5
 * times aborts a console command's resume that its own guard did not stop. */
int qtg_busy_start(qtg_host *h, double limit_seconds, double console_limit_seconds, char *err, size_t errlen);
/* Stops the guard's thread and puts back any hook it set; h->busy NULL. */
void qtg_busy_stop(qtg_host *h);

/* The scheduler's marks (no-ops while h->busy is NULL). */
void qtg_busy_enter(struct qtg_busy *b, qtg_task *t);
void qtg_busy_leave(struct qtg_busy *b);
/* 1 when t was being stopped: its strike is over, and what it held is
 * garbage once its coroutine is let go of (the caller collects it);
 * *resume_since: when the resume it was stopped in began (uv_hrtime()),
 * 0 when it was not stopped. */
int qtg_busy_task_ended(struct qtg_busy *b, qtg_task *t, uint64_t *resume_since);

#endif
