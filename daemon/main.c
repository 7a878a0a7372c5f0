/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpipd entry point: configuration, logging, the daemon's life cycle and the exit status.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include "config.h"
#include "daemon.h"
#include "log.h"

int main(int argc, char **argv)
{
	struct tpd_daemon *d = NULL;
	struct tpd_config cfg;
	int r;

	tpd_config_defaults(&cfg);
	r = tpd_config_parse_args(&cfg, argc, argv);
	if (r != 0)
		return r > 0 ? 0 : 2;
	tpu_log_set_level(cfg.log_level);
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
