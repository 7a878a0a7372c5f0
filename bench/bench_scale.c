/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_scale: what many open pipes cost. The parent forks a listener process before either
 * creates a context, then connects pipes to it in steps up to each count of -N (default 1, 100,
 * 1000; the pipes of one step stay open for the next). Pipe 0 is connected and accepted before
 * any other, so both processes know which pipe is which. At each step, once the listener has
 * accepted every pipe, the parent (a) reads the daemon's VmRSS from /proc/PID/status and reports
 * its growth since before the first pipe, divided by the number of pipes, and (b) times 8 B
 * metadata round trips on pipe 0 while all the others are open (bench_latency's meta8 case:
 * write, then descriptor and read of the reply). The baseline of each latency row is the first
 * step's figure. Figures only, never a verdict.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"

/* Owner-only from this host, and open to pipes from every peer daemon (cross-host runs). */
static const struct tp_listen_options remote_any = {
	.size = sizeof(remote_any), .access = TP_ACCESS_OWNER, .remote = TP_REMOTE_ANY_PEER,
};

#define SCALE_TIMEOUT_MS 10000
#define SCALE_PENDING_MAX 64 /* writes whose completion has not arrived yet */
#define SCALE_STEPS_MAX 16

struct scale_opts {
	long steps[SCALE_STEPS_MAX]; /* pipe counts, ascending */
	size_t n_steps;
	long iters;
	long warmup;
	pid_t daemon_pid;
	const char *socket_path;
	pid_t parent;
	char listener[64];
};

/* Dies with the parent, so that an interrupted run leaves no listener behind. */
static void die_with_parent(pid_t parent)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(1);
}

/* VmRSS of @pid in bytes, from /proc/PID/status. */
static int read_rss(pid_t pid, long long *ret)
{
	char path[64], line[256];
	long long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f) {
		int r = -errno;

		fprintf(stderr, "bench_scale: cannot read %s: %s\n", path, strerror(-r));
		return r;
	}
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %lld", &kb) == 1)
			break;
	fclose(f);
	if (kb < 0) {
		fprintf(stderr, "bench_scale: no VmRSS in %s\n", path);
		return -EBADMSG;
	}
	*ret = kb * 1024;
	return 0;
}

/* ---- 8 B metadata ping-pong ------------------------------------------------------------------ */

static int meta8_send(struct tp_pipe *p, uint64_t seq, struct bench_counter *pending)
{
	struct tp_message m = { .metadata = &seq, .metadata_len = sizeof(seq) };
	int r;

	bench_counter_add(pending, 1, 0);
	r = tp_pipe_write(p, &m, bench_on_done_dec, pending);
	if (r < 0) {
		bench_counter_add(pending, -1, 0);
		fprintf(stderr, "bench_scale: tp_pipe_write: %s (%s)\n", tp_strerror(r),
			tp_last_error());
		return r;
	}
	return bench_counter_wait_le(pending, SCALE_PENDING_MAX);
}

static int meta8_recv(struct tp_pipe *p, uint64_t seq)
{
	struct tp_allocation a = { 0 };
	struct tp_descriptor *d;
	uint64_t got;
	int r;

	r = tp_pipe_read_descriptor_sync(p, SCALE_TIMEOUT_MS, &d);
	if (r < 0) {
		fprintf(stderr, "bench_scale: read_descriptor %llu: %s (%s)\n",
			(unsigned long long)seq, tp_strerror(r), tp_last_error());
		return r;
	}
	got = ~seq;
	if (d->metadata_len == sizeof(got))
		memcpy(&got, d->metadata, sizeof(got));
	if (got != seq || d->n_payloads || d->n_tensors) {
		fprintf(stderr, "bench_scale: message %llu: unexpected descriptor\n",
			(unsigned long long)seq);
		tp_descriptor_free(d);
		return -EBADMSG;
	}
	r = tp_pipe_read_sync(p, d, &a);
	if (r < 0)
		fprintf(stderr, "bench_scale: read %llu: %s (%s)\n", (unsigned long long)seq,
			tp_strerror(r), tp_last_error());
	return r;
}

/* ---- listener process ------------------------------------------------------------------------ */

/* Accepts pipes up to each step's count, acknowledges, then answers that step's round trips. */
static int listener_steps(const struct scale_opts *o, struct tp_listener *l, struct tp_pipe **pipes,
			  long *accepted, int ready_fd)
{
	struct bench_counter pending;
	uint64_t seq = 0;
	int r = 0;

	bench_counter_init(&pending);
	for (size_t s = 0; s < o->n_steps && r == 0; s++) {
		while (*accepted < o->steps[s] && r == 0) {
			r = tp_listener_accept_sync(l, SCALE_TIMEOUT_MS, &pipes[*accepted]);
			if (r < 0)
				fprintf(stderr, "bench_scale: accept %ld: %s (%s)\n", *accepted,
					tp_strerror(r), tp_last_error());
			else
				++*accepted;
		}
		bench_ready_send(ready_fd, r); /* all of this step's pipes are accepted */
		for (long i = 0; i < o->warmup + o->iters && r == 0; i++, seq++) {
			r = meta8_recv(pipes[0], seq);
			if (r == 0)
				r = meta8_send(pipes[0], seq, &pending);
		}
	}
	if (r == 0)
		r = bench_counter_wait_le(&pending, 0);
	bench_counter_done(&pending);
	return r;
}

static int listener_main(void *arg, int ready_fd)
{
	const struct scale_opts *o = arg;
	long max = o->steps[o->n_steps - 1], accepted = 0;
	struct tp_pipe **pipes = calloc((size_t)max, sizeof(*pipes));
	struct tp_context *ctx = NULL;
	struct tp_listener *l = NULL;
	int r = pipes ? 0 : -ENOMEM;

	die_with_parent(o->parent);
	if (r == 0)
		r = bench_context_open(o->socket_path, 0, &ctx);
	if (r == 0) {
		r = tp_listen(ctx, o->listener, &remote_any, &l);
		if (r < 0)
			fprintf(stderr, "bench_scale: tp_listen %s: %s (%s)\n", o->listener,
				tp_strerror(r), tp_last_error());
	}
	bench_ready_send(ready_fd, r);
	if (r == 0)
		r = listener_steps(o, l, pipes, &accepted, ready_fd);
	for (long i = 0; i < accepted; i++)
		tp_pipe_close(pipes[i]);
	tp_listener_close(l);
	tp_context_free(ctx);
	free(pipes);
	return r;
}

/* ---- connector (the parent) ------------------------------------------------------------------ */

struct scale_conn {
	struct tp_context *ctx;
	struct tp_pipe **pipes;
	long opened;
	struct bench_counter pending; /* writes on pipe 0 not completed */
	uint64_t seq;
};

/* Opens pipes up to @n and waits until the daemon has connected each one. */
static int open_pipes(const struct scale_opts *o, struct scale_conn *c, long n)
{
	long first = c->opened;
	int r = 0;

	while (c->opened < n && r == 0) {
		r = tp_connect(c->ctx, o->listener, &c->pipes[c->opened]);
		if (r < 0) {
			fprintf(stderr, "bench_scale: tp_connect %ld: %s (%s)\n", c->opened,
				tp_strerror(r), tp_last_error());
			break;
		}
		c->opened++;
		/* Pipe 0 alone first: the listener's first accept is then surely pipe 0. */
		if (c->opened == 1)
			r = tp_pipe_wait_connected(c->pipes[0], SCALE_TIMEOUT_MS);
	}
	for (long i = first; i < c->opened && r == 0; i++) {
		r = tp_pipe_wait_connected(c->pipes[i], SCALE_TIMEOUT_MS);
		if (r < 0)
			fprintf(stderr, "bench_scale: connect %ld: %s (%s)\n", i, tp_strerror(r),
				tp_last_error());
	}
	return r;
}

/* @count round trips on pipe 0; each one's time in microseconds goes to @samples unless NULL. */
static int rounds(struct scale_conn *c, long count, double *samples)
{
	int r = 0;

	for (long i = 0; i < count && r == 0; i++, c->seq++) {
		uint64_t t0 = bench_now_ns();

		r = meta8_send(c->pipes[0], c->seq, &c->pending);
		if (r == 0)
			r = meta8_recv(c->pipes[0], c->seq);
		if (samples)
			samples[i] = (double)(bench_now_ns() - t0) / 1e3;
	}
	return r;
}

struct scale_step {
	long pipes;
	long long rss_grown; /* bytes since before the first pipe */
	struct bench_stats rtt;
};

static void print_step(const struct scale_step *st, const struct scale_step *first,
		       long long rss0)
{
	char name[64], res[128], base[96], ratio[48], b1[32], b2[32];

	snprintf(name, sizeof(name), "scale rtt meta8 with %ld pipe%s", st->pipes,
		 st->pipes == 1 ? "" : "s");
	snprintf(res, sizeof(res), "med %.1f p90 %.1f p99 %.1f min %.1f us", st->rtt.median,
		 st->rtt.p90, st->rtt.p99, st->rtt.min);
	if (st == first) {
		bench_row(name, "8 B", res, "-", "-");
	} else {
		snprintf(base, sizeof(base), "%ld pipe%s med %.1f p99 %.1f us", first->pipes,
			 first->pipes == 1 ? "" : "s", first->rtt.median, first->rtt.p99);
		snprintf(ratio, sizeof(ratio), "%.2f (p99 %.2f)",
			 st->rtt.median / first->rtt.median, st->rtt.p99 / first->rtt.p99);
		bench_row(name, "8 B", res, base, ratio);
	}
	snprintf(name, sizeof(name), "scale daemon memory per pipe at %ld", st->pipes);
	snprintf(res, sizeof(res), "%.0f B per pipe (VmRSS %s%s)",
		 (double)st->rss_grown / (double)st->pipes, st->rss_grown < 0 ? "-" : "+",
		 bench_fmt_size((size_t)llabs(st->rss_grown), b1, sizeof(b1)));
	snprintf(base, sizeof(base), "VmRSS %s before",
		 bench_fmt_size((size_t)rss0, b2, sizeof(b2)));
	bench_row(name, "-", res, base, "-");
}

/* One step: open pipes up to its count, wait for the listener, read VmRSS, time round trips. */
static int run_step(const struct scale_opts *o, struct scale_conn *c, int ready_fd, long long rss0,
		    double *samples, struct scale_step *st)
{
	long long rss;
	int r;

	r = open_pipes(o, c, st->pipes);
	if (r == 0)
		r = bench_ready_wait(ready_fd, SCALE_TIMEOUT_MS);
	if (r == 0)
		r = read_rss(o->daemon_pid, &rss);
	if (r == 0)
		r = rounds(c, o->warmup, NULL);
	if (r == 0)
		r = rounds(c, o->iters, samples);
	if (r < 0)
		return r;
	st->rss_grown = rss - rss0;
	bench_stats_compute(samples, (size_t)o->iters, &st->rtt);
	return 0;
}

static int scale_run(struct scale_opts *o)
{
	struct scale_conn c = { 0 };
	struct scale_step steps[SCALE_STEPS_MAX];
	double *samples;
	long long rss0 = 0;
	pid_t pid = -1;
	int ready_fd = -1, r;

	r = read_rss(o->daemon_pid, &rss0); /* is it there at all? */
	if (r < 0)
		return r;
	samples = calloc((size_t)o->iters, sizeof(double));
	o->parent = getpid();
	snprintf(o->listener, sizeof(o->listener), "bench-scale-%d", (int)getpid());
	c.pipes = calloc((size_t)o->steps[o->n_steps - 1], sizeof(*c.pipes));
	bench_counter_init(&c.pending);
	if (!samples || !c.pipes)
		r = -ENOMEM;
	if (r == 0)
		r = bench_spawn(listener_main, o, &pid, &ready_fd);
	if (r == 0)
		r = bench_ready_wait(ready_fd, SCALE_TIMEOUT_MS);
	if (r == 0)
		r = bench_context_open(o->socket_path, 0, &c.ctx);
	if (r == 0)
		r = read_rss(o->daemon_pid, &rss0); /* both clients attached, no pipe yet */
	for (size_t s = 0; s < o->n_steps && r == 0; s++) {
		steps[s] = (struct scale_step){ .pipes = o->steps[s] };
		r = run_step(o, &c, ready_fd, rss0, samples, &steps[s]);
		if (r == 0)
			print_step(&steps[s], &steps[0], rss0);
	}
	if (r == 0 && c.opened)
		r = bench_counter_wait_le(&c.pending, 0);
	for (long i = 0; i < c.opened; i++)
		tp_pipe_close(c.pipes[i]);
	tp_context_free(c.ctx);
	if (ready_fd >= 0)
		close(ready_fd);
	if (r < 0 && pid > 0) {
		/* It may wait for pipes that will not come; the reason is already on stderr. */
		kill(pid, SIGKILL);
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
	} else if (pid > 0 && bench_reap(pid, "listener") < 0 && r == 0) {
		r = -ECHILD;
	}
	bench_counter_done(&c.pending);
	free(c.pipes);
	free(samples);
	return r;
}

/* ---- driver ---------------------------------------------------------------------------------- */

static void usage(void)
{
	printf("usage: bench_scale -p PID [-N COUNTS] [-n ITERS] [-w WARMUP] [-S SOCKET] [-t]\n"
	       "  -p PID     the daemon's pid (its /proc/PID/status VmRSS is read)\n"
	       "  -N COUNTS  comma-separated ascending pipe counts (default 1,100,1000)\n"
	       "  -n ITERS   timed round trips on pipe 0 per count (default 2000)\n"
	       "  -w WARMUP  untimed round trips first (default ITERS/10, at least 100)\n"
	       "  -S SOCKET  tpipd socket (default: $TPIPD_SOCKET, then the library's rules)\n"
	       "  -t         tab-separated rows, no header (for bench/run.sh)\n");
}

static int parse_steps(const char *s, struct scale_opts *o)
{
	char *end;

	o->n_steps = 0;
	for (;;) {
		long v = strtol(s, &end, 10);

		if (end == s || v <= 0 || o->n_steps == SCALE_STEPS_MAX ||
		    (o->n_steps && v <= o->steps[o->n_steps - 1]))
			return -EINVAL;
		o->steps[o->n_steps++] = v;
		if (*end == 0)
			return 0;
		if (*end != ',')
			return -EINVAL;
		s = end + 1;
	}
}

static int parse_args(int argc, char **argv, struct scale_opts *o)
{
	int opt;

	*o = (struct scale_opts){ .iters = 2000, .warmup = -1 };
	if (parse_steps("1,100,1000", o) < 0)
		return -EINVAL;
	while ((opt = getopt(argc, argv, "p:N:n:w:S:th")) != -1) {
		switch (opt) {
		case 'p': o->daemon_pid = (pid_t)strtol(optarg, NULL, 10); break;
		case 'N':
			if (parse_steps(optarg, o) < 0) {
				fprintf(stderr, "bench_scale: -N wants ascending counts > 0, "
						"e.g. 1,100,1000\n");
				return -EINVAL;
			}
			break;
		case 'n': o->iters = strtol(optarg, NULL, 10); break;
		case 'w': o->warmup = strtol(optarg, NULL, 10); break;
		case 'S': o->socket_path = optarg; break;
		case 't': bench_tsv = true; break;
		case 'h': usage(); exit(0);
		default: usage(); return -EINVAL;
		}
	}
	if (o->daemon_pid <= 0 || o->iters <= 0 || optind != argc) {
		usage();
		return -EINVAL;
	}
	if (o->warmup < 0)
		o->warmup = o->iters / 10 < 100 ? 100 : o->iters / 10;
	return 0;
}

int main(int argc, char **argv)
{
	struct scale_opts o;

	if (parse_args(argc, argv, &o) < 0)
		return 2;
	bench_table_header("many open pipes: latency on one, daemon memory per pipe");
	if (scale_run(&o) < 0) {
		char name[64];

		snprintf(name, sizeof(name), "scale rtt meta8 with %ld pipes",
			 o.steps[o.n_steps - 1]);
		bench_row(name, "-", "error (see stderr)", "-", "-");
		return 1;
	}
	return 0;
}
