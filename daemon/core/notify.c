/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * sd_notify / sd_listen_fds / sd_watchdog_enabled wrappers. See notify.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include "log.h"
#include "notify.h"
#include "tpconfig.h"
#if HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#include <systemd/sd-journal.h>
#include <sys/uio.h>
#endif

static void notify(const char *state, const char *status)
{
#if HAVE_SYSTEMD
	if (status)
		sd_notifyf(0, "%s%sSTATUS=%s", state, *state ? "\n" : "", status);
	else
		sd_notify(0, state);
#endif
}

void tpd_notify_ready(const char *status)
{
	notify("READY=1", status);
}

void tpd_notify_reloading(void)
{
	notify("RELOADING=1", NULL);
}

void tpd_notify_stopping(const char *status)
{
	notify("STOPPING=1", status);
}

void tpd_notify_status(const char *status)
{
	notify("", status);
}

void tpd_notify_watchdog(void)
{
	notify("WATCHDOG=1", NULL);
}

bool tpd_notify_enabled(void)
{
#if HAVE_SYSTEMD
	const char *e = getenv("NOTIFY_SOCKET");

	return e && *e;
#else
	return false;
#endif
}

uint64_t tpd_notify_watchdog_usec(void)
{
#if HAVE_SYSTEMD
	uint64_t usec = 0;

	if (sd_watchdog_enabled(0, &usec) > 0)
		return usec;
#endif
	return 0;
}

int tpd_notify_listen_fd(void)
{
#if HAVE_SYSTEMD
	int n = sd_listen_fds(1);

	if (n <= 0)
		return -ENOENT;
	if (n != 1 || sd_is_socket_unix(SD_LISTEN_FDS_START, SOCK_STREAM, 1, NULL, 0) <= 0) {
		tpu_log_err("socket activation passed %d fds; expected one listening Unix stream "
			    "socket",
			    n);
		for (int i = 0; i < n; i++)
			tpu_close(SD_LISTEN_FDS_START + i);
		return -EINVAL;
	}
	return SD_LISTEN_FDS_START;
#else
	return -ENOENT;
#endif
}

bool tpd_notify_journal_stderr(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

#if HAVE_SYSTEMD
/* Sends each line to the journal with its priority and structured fields. */
static void journal_sink(enum tpu_log_level level, const char *const *fields, const char *msg)
{
	char m[1100], prio[16];
	struct iovec iov[16];
	size_t n = 0;

	snprintf(m, sizeof(m), "MESSAGE=%s", msg);
	snprintf(prio, sizeof(prio), "PRIORITY=%d", (int)level);
	iov[n++] = (struct iovec){ m, strlen(m) };
	iov[n++] = (struct iovec){ prio, strlen(prio) };
	iov[n++] = (struct iovec){ (void *)"SYSLOG_IDENTIFIER=tpipd", 23 };
	for (size_t i = 0; fields[i] && n < TPU_ARRAY_SIZE(iov); i++)
		iov[n++] = (struct iovec){ (void *)fields[i], strlen(fields[i]) };
	sd_journal_sendv(iov, (int)n);
}
#endif

void tpd_notify_use_journal(void)
{
#if HAVE_SYSTEMD
	if (tpd_notify_journal_stderr())
		tpu_log_set_sink(journal_sink);
#endif
}
