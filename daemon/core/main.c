/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpipd entry point: configuration (file + flags), logging, the daemon's life cycle and the
 * exit status (0 clean stop, 1 runtime failure, 2 bad configuration).
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include "config.h"
#include "daemon.h"
#include "log.h"
#include "notify.h"

int main(int argc, char **argv)
{
	struct tpd_daemon *d = NULL;
	struct tpd_config cfg;
	char err[512] = "";
	int r;

	tpd_config_defaults(&cfg);
	r = tpd_config_load(&cfg, argc, argv, err, sizeof(err));
	if (r > 0)
		return 0;
	if (r < 0) {
		fprintf(stderr, "tpipd: %s\n", err);
		return 2;
	}
	if (cfg.check_only) {
		tpd_config_dump(&cfg, stdout);
		return 0;
	}
	tpu_log_set_level(cfg.log_level);
	/* The journal stamps each line itself; a file or a terminal needs the time on the line. */
	tpu_log_set_timestamps(!tpd_notify_journal_stderr());
	tpd_notify_use_journal();
	signal(SIGPIPE, SIG_IGN);
	r = tpd_daemon_new(&cfg, &d);
	if (r < 0) {
		tpu_log_err("cannot start: %s", strerror(-r));
		return 1;
	}
	r = tpd_daemon_run(d);
	tpd_daemon_free(d);
	return r < 0 ? 1 : 0;
}
