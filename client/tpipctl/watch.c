/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpipctl watch: a live view of the daemon. Keeps one control connection open and, every
 * interval, asks for status and pipes and prints both through ctl_render_watch(): over the
 * previous screen on a terminal, as a stream of snapshots separated by blank lines otherwise.
 * Stops on SIGINT or SIGTERM, after the requested number of refreshes, or when the daemon goes
 * away. Opening the connection and the tables themselves are not done here.
 */
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "ctl.h"

#define CLEAR_SCREEN "\033[H\033[2J"

static volatile sig_atomic_t watch_stop;

struct watch {
	const struct ctl_watch_opts *w;
	const struct ctl_view *v;
	struct ctl_conn *c;
	FILE *out;
	bool tty;	    /* @out is a terminal: redraw the screen */
	uint64_t shown;	    /* snapshots printed */
	sigset_t wait_mask; /* signal mask while waiting: SIGINT and SIGTERM open */
};

static void watch_on_signal(int sig)
{
	watch_stop = 1;
}

/*
 * SIGINT and SIGTERM set watch_stop. They stay blocked except inside ppoll(), so a signal that
 * arrives while a refresh runs is seen before the next wait instead of being lost.
 */
static int signals_setup(struct watch *x, sigset_t *ret_old)
{
	struct sigaction sa = { .sa_handler = watch_on_signal };
	sigset_t set;

	sigemptyset(&sa.sa_mask);
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0)
		return -errno;
	if (sigprocmask(SIG_BLOCK, &set, ret_old) < 0)
		return -errno;
	x->wait_mask = *ret_old;
	sigdelset(&x->wait_mask, SIGINT);
	sigdelset(&x->wait_mask, SIGTERM);
	return 0;
}

/* Sleeps until @until_ns, a stop signal, or activity on the connection (the daemon closed it). */
static void watch_wait(const struct watch *x, uint64_t until_ns)
{
	struct pollfd p = { .fd = x->c->fd, .events = POLLIN };

	for (;;) {
		uint64_t now = tpu_now_ns(), left;
		struct timespec ts;
		int r;

		if (watch_stop || now >= until_ns)
			return;
		left = until_ns - now;
		ts.tv_sec = (time_t)(left / 1000000000ull);
		ts.tv_nsec = (long)(left % 1000000000ull);
		r = ppoll(&p, 1, &ts, &x->wait_mask);
		if (r > 0 || (r < 0 && errno != EINTR))
			return; /* readable or hung up: the next request finds out which */
	}
}

static void watch_header(const struct watch *x, FILE *m)
{
	char when[16] = "";
	time_t now = time(NULL);
	struct tm tm;

	if (localtime_r(&now, &tm))
		strftime(when, sizeof(when), "%H:%M:%S", &tm);
	fprintf(m, "tpipd at %s, every %g s, %s\n\n", x->c->path,
		(double)x->w->interval_ms / 1000.0, when);
}

/* Prints one snapshot in one write, so a terminal never shows half a screen. */
static int watch_show(struct watch *x, const Tpw__V1__CtlReply *st, const Tpw__V1__CtlReply *pp)
{
	_cleanup_free_ char *buf = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&buf, &len);
	int r;

	if (!m)
		return -ENOMEM;
	if (!x->v->json)
		watch_header(x, m);
	r = ctl_render_watch(st, pp, x->v, m);
	if (fclose(m) != 0 && r == 0)
		r = -ENOMEM;
	if (r < 0)
		return r;
	if (x->tty)
		fputs(CLEAR_SCREEN, x->out);
	else if (x->shown)
		fputc('\n', x->out);
	fwrite(buf, 1, len, x->out);
	x->shown++;
	if (fflush(x->out) != 0 || ferror(x->out))
		return errno ? -errno : -EIO;
	return 0;
}

static int watch_refresh(struct watch *x)
{
	Tpw__V1__DaemonMsg *st = NULL, *pp = NULL;
	int r;

	ctl_conn_set_timeout(x->c, x->w->timeout_ms);
	r = ctl_conn_request(x->c, TPW__V1__CTL_WHAT__CTL_STATUS, 0, &st);
	if (r == 0)
		r = ctl_conn_request(x->c, TPW__V1__CTL_WHAT__CTL_PIPES, 0, &pp);
	if (r == 0)
		r = watch_show(x, st->ctl_reply, pp->ctl_reply);
	tpw_daemon_msg_free(st);
	tpw_daemon_msg_free(pp);
	return r;
}

/* Puts @pre in front of @c->why, cutting its end if needed. */
static void why_prefix(struct ctl_conn *c, const char *pre)
{
	size_t p = strlen(pre), n = strnlen(c->why, sizeof(c->why) - 1 - p);

	memmove(c->why + p, c->why, n);
	memcpy(c->why, pre, p);
	c->why[p + n] = '\0';
}

int ctl_watch(struct ctl_conn *c, const struct ctl_watch_opts *w, const struct ctl_view *v,
	      FILE *out)
{
	struct watch x = { .w = w, .v = v, .c = c, .out = out, .tty = isatty(fileno(out)) };
	sigset_t old;
	int r;

	r = signals_setup(&x, &old);
	if (r < 0)
		return r;
	while (!watch_stop) {
		uint64_t start = tpu_now_ns();

		r = watch_refresh(&x);
		if (r < 0 || (w->count && x.shown >= w->count))
			break;
		watch_wait(&x, start + w->interval_ms * 1000000ull);
	}
	sigprocmask(SIG_SETMASK, &old, NULL);
	if (r < 0 && c->fail == CTL_FAIL_REACH)
		why_prefix(c, "lost the daemon: ");
	return r;
}
