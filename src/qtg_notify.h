/* qtg_notify.h -- sd_notify without libsystemd (see qtg_notify.c). */
#ifndef QTG_NOTIFY_H
#define QTG_NOTIFY_H

#include <stddef.h>

/* Send msg (len bytes, e.g. "READY=1") to $NOTIFY_SOCKET.  Returns 1 when
 * sent, 0 when NOTIFY_SOCKET is unset (a no-op), -1 with a message in err. */
int qtg_notify_send(const char *msg, size_t len, char *err, size_t errlen);

#endif
