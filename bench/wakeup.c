/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * wakeup: what one blocking wake-up costs on this machine, the unit in which same-host
 * message latency is paid. Two threads play ping-pong over two eventfds with blocking reads:
 * once with the two threads pinned to different CPUs (sched_setaffinity), once with both pinned
 * to the same CPU. The main thread is the pinger in both pairs and stays on the first CPU;
 * after a warm-up, blocks of round trips alternate between the two pairs so that background
 * load hits both series alike. One-way wake-up latency is half a round trip; it prints median,
 * p90, p99 and min in microseconds and the ratio cross-CPU / same-CPU. It needs no daemon and
 * measures nothing of tpipd; figures only, never a verdict.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "bench_common.h"

struct wk_opts {
	long iters;
	long warmup;
	long block;
};

/* One ping-pong pair: the main thread pings, a pinned thread pongs. */
struct wk_pair {
	int ping_fd; /* main -> pong thread */
	int pong_fd; /* pong thread -> main */
	int cpu;     /* where the pong thread runs */
	atomic_bool stop;
	pthread_t thread;
	bool started;
	int err;
};

static int pin_self(int cpu)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return sched_setaffinity(0, sizeof(set), &set) < 0 ? -errno : 0;
}

static void *pong_main(void *arg)
{
	struct wk_pair *p = arg;
	uint64_t v = 1;

	p->err = pin_self(p->cpu);
	if (p->err < 0)
		return NULL;
	for (;;) {
		if (read(p->ping_fd, &v, sizeof(v)) != sizeof(v)) {
			p->err = -errno;
			break;
		}
		if (atomic_load(&p->stop))
			break;
		v = 1;
		if (write(p->pong_fd, &v, sizeof(v)) != sizeof(v)) {
			p->err = -errno;
			break;
		}
	}
	return NULL;
}

static int pair_start(struct wk_pair *p, int cpu)
{
	int r;

	*p = (struct wk_pair){ .ping_fd = -EBADF, .pong_fd = -EBADF, .cpu = cpu };
	p->ping_fd = eventfd(0, EFD_CLOEXEC);
	p->pong_fd = eventfd(0, EFD_CLOEXEC);
	if (p->ping_fd < 0 || p->pong_fd < 0)
		return -errno;
	r = -pthread_create(&p->thread, NULL, pong_main, p);
	p->started = r == 0;
	return r;
}

static void pair_stop(struct wk_pair *p)
{
	uint64_t v = 1;

	if (p->started) {
		atomic_store(&p->stop, true);
		if (write(p->ping_fd, &v, sizeof(v)) == sizeof(v))
			pthread_join(p->thread, NULL);
		else
			pthread_detach(p->thread); /* cannot happen with a counter this small */
	}
	if (p->ping_fd >= 0)
		close(p->ping_fd);
	if (p->pong_fd >= 0)
		close(p->pong_fd);
}

/* @count round trips; each one's one-way time (half the round trip, in us) goes to @samples. */
static int pair_rounds(struct wk_pair *p, long count, double *samples)
{
	uint64_t v;

	for (long i = 0; i < count; i++) {
		uint64_t t0 = bench_now_ns();

		v = 1;
		if (write(p->ping_fd, &v, sizeof(v)) != sizeof(v) ||
		    read(p->pong_fd, &v, sizeof(v)) != sizeof(v)) {
			fprintf(stderr, "wakeup: ping on cpu %d: %s\n", p->cpu, strerror(errno));
			return -errno;
		}
		if (samples)
			samples[i] = (double)(bench_now_ns() - t0) / 2e3;
	}
	return 0;
}

/* Picks the first two CPUs this process may run on; @ret_b is -1 if there is only one. */
static int pick_cpus(int *ret_a, int *ret_b)
{
	cpu_set_t set;
	int found = 0;

	if (sched_getaffinity(0, sizeof(set), &set) < 0)
		return -errno;
	*ret_a = *ret_b = -1;
	for (int c = 0; c < CPU_SETSIZE && found < 2; c++) {
		if (!CPU_ISSET(c, &set))
			continue;
		if (found++ == 0)
			*ret_a = c;
		else
			*ret_b = c;
	}
	return found ? 0 : -ENODEV;
}

static void print_row(const char *name, const struct bench_stats *st, const char *base,
		      const char *ratio)
{
	char res[96];

	snprintf(res, sizeof(res), "med %.2f p90 %.2f p99 %.2f min %.2f us", st->median, st->p90,
		 st->p99, st->min);
	bench_row(name, "8 B", res, base, ratio);
}

/* Runs both pairs (or only @same when @cross is NULL), alternating blocks after a warm-up. */
static int measure(const struct wk_opts *o, struct wk_pair *same, struct wk_pair *cross,
		   double *s_same, double *s_cross)
{
	int r = pair_rounds(same, o->warmup, NULL);

	if (r == 0 && cross)
		r = pair_rounds(cross, o->warmup, NULL);
	for (long done = 0; done < o->iters && r == 0;) {
		long b = o->iters - done < o->block ? o->iters - done : o->block;

		r = pair_rounds(same, b, s_same + done);
		if (r == 0 && cross)
			r = pair_rounds(cross, b, s_cross + done);
		done += b;
	}
	return r;
}

static void report(const struct wk_opts *o, int a, int b, double *s_same, double *s_cross)
{
	char name[64], base[64], ratio[32];
	struct bench_stats st_same, st_cross;

	bench_stats_compute(s_same, (size_t)o->iters, &st_same);
	snprintf(name, sizeof(name), "wakeup eventfd cpu%d<->cpu%d", a, a);
	print_row(name, &st_same, "-", "-");
	if (b < 0) {
		bench_row("wakeup eventfd cross-CPU", "-", "skipped: fewer than 2 CPUs usable", "-",
			  "-");
		return;
	}
	snprintf(name, sizeof(name), "wakeup eventfd cpu%d<->cpu%d", a, b);
	bench_stats_compute(s_cross, (size_t)o->iters, &st_cross);
	snprintf(base, sizeof(base), "same CPU med %.2f p99 %.2f us", st_same.median, st_same.p99);
	snprintf(ratio, sizeof(ratio), "%.2f (p99 %.2f)", st_cross.median / st_same.median,
		 st_cross.p99 / st_same.p99);
	print_row(name, &st_cross, base, ratio);
}

static int run(const struct wk_opts *o)
{
	struct wk_pair same = { .ping_fd = -EBADF, .pong_fd = -EBADF };
	struct wk_pair cross = { .ping_fd = -EBADF, .pong_fd = -EBADF };
	double *s_same = calloc((size_t)o->iters, sizeof(double));
	double *s_cross = calloc((size_t)o->iters, sizeof(double));
	int a = -1, b = -1, r;

	r = s_same && s_cross ? pick_cpus(&a, &b) : -ENOMEM;
	if (r == 0 && b < 0)
		fprintf(stderr, "wakeup: only one CPU usable; cross-CPU case skipped\n");
	if (r == 0)
		r = pin_self(a);
	if (r == 0)
		r = pair_start(&same, a);
	if (r == 0 && b >= 0)
		r = pair_start(&cross, b);
	if (r == 0)
		r = measure(o, &same, b >= 0 ? &cross : NULL, s_same, s_cross);
	pair_stop(&same);
	pair_stop(&cross);
	if (r == 0 && (same.err || cross.err))
		r = same.err ? same.err : cross.err;
	if (r == 0)
		report(o, a, b, s_same, s_cross);
	else
		fprintf(stderr, "wakeup: %s\n", strerror(-r));
	free(s_same);
	free(s_cross);
	return r;
}

static void usage(void)
{
	printf("usage: wakeup [-n ITERS] [-w WARMUP] [-b BLOCK] [-t]\n"
	       "  -n ITERS   timed round trips per pair (default 100000)\n"
	       "  -w WARMUP  untimed round trips first (default ITERS/10, at least 100)\n"
	       "  -b BLOCK   round trips per alternation between the two pairs (default 1000)\n"
	       "  -t         tab-separated rows, no header (for bench/run.sh)\n");
}

int main(int argc, char **argv)
{
	struct wk_opts o = { .iters = 100000, .warmup = -1, .block = 1000 };
	int opt;

	while ((opt = getopt(argc, argv, "n:w:b:th")) != -1) {
		switch (opt) {
		case 'n': o.iters = strtol(optarg, NULL, 10); break;
		case 'w': o.warmup = strtol(optarg, NULL, 10); break;
		case 'b': o.block = strtol(optarg, NULL, 10); break;
		case 't': bench_tsv = true; break;
		case 'h': usage(); return 0;
		default: usage(); return 2;
		}
	}
	if (o.iters <= 0 || o.block <= 0 || optind != argc) {
		usage();
		return 2;
	}
	if (o.warmup < 0)
		o.warmup = o.iters / 10 < 100 ? 100 : o.iters / 10;
	bench_table_header("one-way blocking wake-up over eventfds, cross-CPU vs same CPU "
			   "(ratio = cross/same)");
	return run(&o) < 0 ? 1 : 0;
}
