/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpipd entry point: configuration (file + flags), logging, the daemon's life cycle and the
 * exit status (0 clean stop, 1 runtime failure, 2 bad configuration).
 */
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include "config.h"
#include "daemon.h"
#include "log.h"
#include "notify.h"

/* Raises the soft RLIMIT_NOFILE to the hard one, as a server that polls (never select()) may:
 * the soft default of a shell (1024) would leave nothing of the derived kept-fds-max once the
 * fds for sessions, pidfds and links are set aside (tpd_config_fd_reserve()), and the daemon
 * would take no client's fd to keep (channel items copied, never mapped; no CUDA dma-buf). A
 * service's LimitNOFILE sets both. Return: the soft limit before, for the log. */
static rlim_t raise_nofile(void)
{
	struct rlimit rl;
	rlim_t was;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 0;
	was = rl.rlim_cur;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl); /* the soft one stays as it was */
	}
	return was;
}

/* Keeps freed heap memory for the next frames instead of handing it back to the kernel at once.
 * Every frame that carries inline bytes (up to 64 KiB of a message, more across hosts) passes
 * through buffers allocated for it and freed once sent. With glibc's default trim threshold
 * (128 KiB until a large block is freed) freeing them trimmed the heap, and the next frame's
 * buffer faulted its pages in again: a seventh of a daemon's time when 60 KiB messages crossed
 * a peer link. Up to 4 MiB of free heap now stays; blocks from 4 MiB are mapped on their own
 * and unmapped when freed. A malloc setting in GLIBC_TUNABLES wins. */
static void tune_malloc(void)
{
	const char *t = getenv("GLIBC_TUNABLES");

	if (t && strstr(t, "glibc.malloc."))
		return;
	(void)mallopt(M_MMAP_THRESHOLD, 4 << 20);
	(void)mallopt(M_TRIM_THRESHOLD, 4 << 20);
}

int main(int argc, char **argv)
{
	struct tpd_daemon *d = NULL;
	struct tpd_config cfg;
	char err[512] = "";
	struct rlimit rl;
	rlim_t nofile0;
	int r;

	tune_malloc();
	nofile0 = raise_nofile();
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
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != nofile0)
		tpu_log_info("RLIMIT_NOFILE raised from %llu to its hard limit %llu",
			     (unsigned long long)nofile0, (unsigned long long)rl.rlim_cur);
	if (!cfg.kept_fds_cap)
		tpu_log_warn("RLIMIT_NOFILE leaves no fds to keep for clients once %llu are set "
			     "aside for sessions, peer links and rings: channel items are copied, "
			     "never mapped, and no CUDA dma-buf is taken (raise LimitNOFILE, or "
			     "lower sessions-max)",
			     (unsigned long long)tpd_config_fd_reserve(&cfg));
	else
		tpu_log_info("keeps at most %u fds of clients' buffers, %u per uid (%s)",
			     cfg.kept_fds_cap, cfg.kept_fds_per_uid,
			     cfg.kept_fds_max ? "kept-fds-max" : "derived from RLIMIT_NOFILE");
	r = tpd_daemon_new(&cfg, &d);
	if (r < 0) {
		tpu_log_err("cannot start: %s", strerror(-r));
		return 1;
	}
	r = tpd_daemon_run(d);
	tpd_daemon_free(d);
	return r < 0 ? 1 : 0;
}
