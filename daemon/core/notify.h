/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Service manager integration: readiness, status, reload and stop notifications, the watchdog
 * interval, and sockets passed by socket activation. With libsystemd these speak the systemd
 * protocols; built without it they report "not under a service manager" and do nothing, so the
 * daemon runs the same either way.
 */
#ifndef TPD_NOTIFY_H
#define TPD_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>
#include "tpu.h"

/* Sends "READY=1" with a STATUS= line. */
void tpd_notify_ready(const char *status);
/* Sends "RELOADING=1". */
void tpd_notify_reloading(void);
/* Sends "STOPPING=1" with a STATUS= line. */
void tpd_notify_stopping(const char *status);
/* Sends a STATUS= line. */
void tpd_notify_status(const char *status);
/* Sends "WATCHDOG=1". */
void tpd_notify_watchdog(void);

/* True if a service manager listens for notifications ($NOTIFY_SOCKET, with libsystemd). */
bool tpd_notify_enabled(void);

/* Watchdog interval the service manager expects, in microseconds; 0 if none. */
uint64_t tpd_notify_watchdog_usec(void);

/*
 * tpd_notify_listen_fd() - the control socket passed by socket activation.
 * Return: the fd (owned by the caller), -ENOENT if none was passed, -EINVAL if what was passed
 * is not exactly one listening Unix stream socket (logged).
 */
int tpd_notify_listen_fd(void);

/* True if stderr is connected to the journal. */
bool tpd_notify_journal_stderr(void);

/* If stderr is the journal, log there natively (with structured fields) from now on. */
void tpd_notify_use_journal(void);

#endif
