/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_latency: same-host round-trip latency through tpipd between two processes, compared
 * with a raw Unix socketpair ping-pong of the same user bytes between two processes, measured in
 * the same run. Cases: (a) 8 B metadata only, (b) 8 B metadata + one 64 B payload, (c) 8 B
 * metadata + one 64 B CPU tensor. The parent forks both pongers before any process creates a
 * context, warms both up, then alternates blocks of raw and tpipd round trips (write, then
 * descriptor + read of the reply) so both series see the same background load. It prints median,
 * p90, p99 and min in microseconds and the ratio tpipd/raw; figures only, never a verdict.
 * Across two daemons (bench/run_xhost.sh): the ponger attaches to another daemon (-r) and the
 * parent connects to it by address (-a tpip://HOST:PORT/), and the raw baseline becomes a TCP
 * ping-pong over HOST (-x), optionally with both pongers in another network namespace (-N).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include "bench_common.h"

/* Owner-only from this host, and open to pipes from every peer daemon (cross-host runs). */
static const struct tp_listen_options remote_any = {
	.size = sizeof(remote_any), .access = TP_ACCESS_OWNER, .remote = TP_REMOTE_ANY_PEER,
};

#define LAT_TIMEOUT_MS 10000
#define LAT_PENDING_MAX 64 /* writes whose completion has not arrived yet */
#define LAT_DATA_MAX 64

struct lat_case {
	char key;
	const char *name;
	size_t payload_len;
	size_t tensor_len;
};

static const struct lat_case lat_cases[] = {
	{ 'a', "meta8", 0, 0 },
	{ 'b', "meta8+payload64", 64, 0 },
	{ 'c', "meta8+tensor64", 0, 64 },
};

struct lat_opts {
	long iters;
	long warmup;
	long block; /* round trips per alternation between raw and tpipd */
	const char *socket_path;
	const char *ponger_socket; /* the pongers' daemon (NULL: socket_path) */
	const char *addr_prefix;   /* the parent connects to this + listener name */
	const char *row_prefix;	   /* before every row's case name */
	const char *tcp_host;	   /* raw baseline over TCP on this address, not a socketpair */
	const char *netns;	   /* the pongers' network namespace (NULL: this one) */
	const char *which;
};

/* What a forked ponger needs to know. */
struct lat_run {
	const struct lat_opts *o;
	const struct lat_case *c;
	char listener[64];
	int fd;	     /* raw baseline: the child's end of the socketpair */
	int peer_fd; /* the parent's end, which the child closes */
};

/* The parent's side of the two ping-pongs of one case, run side by side. */
struct lat_pair {
	pid_t raw_pid, tp_pid;
	int raw_fd;
	struct tp_context *ctx;
	struct tp_pipe *p;
	struct bench_counter pending; /* tpipd writes not completed */
	uint64_t raw_seq, tp_seq;
};

static char lat_sbuf[LAT_DATA_MAX];
static char lat_rbuf[LAT_DATA_MAX];

static size_t lat_case_bytes(const struct lat_case *c)
{
	return sizeof(uint64_t) + c->payload_len + c->tensor_len;
}

/* ---- raw baseline: socketpair, or TCP ------------------------------------------------------ */

/* The TCP ponger's start: listen on o->tcp_host, say the port, accept the parent. */
static int raw_tcp_accept(struct lat_run *run, int ready_fd)
{
	int lfd, port, r = 0;

	if (run->o->netns)
		r = bench_netns_enter(run->o->netns);
	if (r == 0)
		r = bench_tcp_listen(run->o->tcp_host, &lfd, &port);
	if (r < 0)
		fprintf(stderr, "bench_latency: raw pong: listen on %s: %s\n", run->o->tcp_host,
			strerror(-r));
	bench_ready_send(ready_fd, r < 0 ? r : port);
	if (r < 0)
		return r;
	r = bench_tcp_accept(lfd, &run->fd);
	close(lfd);
	return r;
}

static int raw_pong(void *arg, int ready_fd)
{
	struct lat_run *run = arg;
	size_t n = lat_case_bytes(run->c);
	long total = run->o->warmup + run->o->iters;
	char buf[sizeof(uint64_t) + 2 * LAT_DATA_MAX];

	if (run->o->tcp_host) {
		int r = raw_tcp_accept(run, ready_fd);

		if (r < 0)
			return r;
	} else {
		close(run->peer_fd); /* so that the parent closing its end reads as EOF here */
	}
	for (long i = 0; i < total; i++) {
		int r = bench_read_full(run->fd, buf, n);

		if (r == 0)
			r = bench_write_full(run->fd, buf, n);
		if (r == -EPIPE)
			return 0; /* the parent gave up early and says why */
		if (r < 0) {
			fprintf(stderr, "bench_latency: raw pong: %s\n", strerror(-r));
			return r;
		}
	}
	return 0;
}

/* Forks the TCP ponger and connects to it; the parent keeps its socket in @st->raw_fd. */
static int raw_tcp_start(struct lat_run *run, struct lat_pair *st)
{
	int ready_fd, port, r;

	r = bench_spawn(raw_pong, run, &st->raw_pid, &ready_fd);
	if (r < 0)
		return r;
	port = bench_ready_wait(ready_fd, LAT_TIMEOUT_MS);
	close(ready_fd);
	if (port <= 0)
		return port < 0 ? port : -EPROTO;
	r = bench_tcp_connect(run->o->tcp_host, port, &st->raw_fd);
	if (r < 0)
		fprintf(stderr, "bench_latency: raw ping: connect to %s port %d: %s\n",
			run->o->tcp_host, port, strerror(-r));
	return r;
}

/* Forks the raw ponger; the parent keeps one end of a socketpair in @st->raw_fd. */
static int raw_start(struct lat_run *run, struct lat_pair *st)
{
	int sv[2], ready_fd, r;

	if (run->o->tcp_host)
		return raw_tcp_start(run, st);
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return -errno;
	run->fd = sv[1];
	run->peer_fd = sv[0];
	r = bench_spawn(raw_pong, run, &st->raw_pid, &ready_fd);
	close(sv[1]);
	if (r < 0) {
		close(sv[0]);
		return r;
	}
	close(ready_fd);
	st->raw_fd = sv[0];
	return 0;
}

/* @count raw round trips; each one's time in microseconds goes to @samples unless NULL. */
static int raw_rounds(struct lat_pair *st, const struct lat_case *c, long count, double *samples)
{
	char buf[sizeof(uint64_t) + 2 * LAT_DATA_MAX] = { 0 };
	size_t n = lat_case_bytes(c);
	int r = 0;

	for (long i = 0; i < count && r == 0; i++) {
		uint64_t t0 = bench_now_ns();

		memcpy(buf, &st->raw_seq, sizeof(st->raw_seq));
		st->raw_seq++;
		r = bench_write_full(st->raw_fd, buf, n);
		if (r == 0)
			r = bench_read_full(st->raw_fd, buf, n);
		if (samples)
			samples[i] = (double)(bench_now_ns() - t0) / 1e3;
	}
	if (r < 0)
		fprintf(stderr, "bench_latency: raw ping: %s\n", strerror(-r));
	return r;
}

/* ---- tpipd ping-pong ------------------------------------------------------------------------- */

/* Writes one message of shape @c with @seq as metadata; completion decrements @pending. */
static int lat_send(struct tp_pipe *p, const struct lat_case *c, uint64_t seq,
		    struct bench_counter *pending)
{
	struct tp_payload pl = { .data = lat_sbuf, .length = c->payload_len };
	struct tp_tensor t = {
		.device = { TP_DEVICE_CPU, 0 }, .data = lat_sbuf, .length = c->tensor_len };
	struct tp_message m = {
		.metadata = &seq,
		.metadata_len = sizeof(seq),
		.payloads = c->payload_len ? &pl : NULL,
		.n_payloads = c->payload_len ? 1 : 0,
		.tensors = c->tensor_len ? &t : NULL,
		.n_tensors = c->tensor_len ? 1 : 0,
	};
	int r;

	bench_counter_add(pending, 1, 0);
	r = tp_pipe_write(p, &m, bench_on_done_dec, pending);
	if (r < 0) {
		bench_counter_add(pending, -1, 0);
		fprintf(stderr, "bench_latency: tp_pipe_write: %s (%s)\n", tp_strerror(r),
			tp_last_error());
		return r;
	}
	return bench_counter_wait_le(pending, LAT_PENDING_MAX);
}

static bool lat_desc_matches(const struct tp_descriptor *d, const struct lat_case *c,
			     uint64_t seq)
{
	uint64_t got;

	if (d->metadata_len != sizeof(got))
		return false;
	memcpy(&got, d->metadata, sizeof(got));
	if (got != seq || d->n_payloads != (c->payload_len ? 1u : 0u) ||
	    d->n_tensors != (c->tensor_len ? 1u : 0u))
		return false;
	if (d->n_payloads && d->payloads[0].length != c->payload_len)
		return false;
	return !d->n_tensors || d->tensors[0].length == c->tensor_len;
}

/* Receives message @seq of shape @c into lat_rbuf. */
static int lat_recv(struct tp_pipe *p, const struct lat_case *c, uint64_t seq)
{
	struct tp_slot ps = { .device = { TP_DEVICE_CPU, 0 }, .data = lat_rbuf };
	struct tp_slot ts = ps;
	struct tp_allocation a = {
		.payloads = c->payload_len ? &ps : NULL,
		.n_payloads = c->payload_len ? 1 : 0,
		.tensors = c->tensor_len ? &ts : NULL,
		.n_tensors = c->tensor_len ? 1 : 0,
	};
	struct tp_descriptor *d;
	int r;

	r = tp_pipe_read_descriptor_sync(p, LAT_TIMEOUT_MS, &d);
	if (r < 0) {
		fprintf(stderr, "bench_latency: read_descriptor %llu: %s (%s)\n",
			(unsigned long long)seq, tp_strerror(r), tp_last_error());
		return r;
	}
	if (!lat_desc_matches(d, c, seq)) {
		fprintf(stderr, "bench_latency: message %llu: unexpected descriptor shape\n",
			(unsigned long long)seq);
		tp_descriptor_free(d);
		return -EBADMSG;
	}
	r = tp_pipe_read_sync(p, d, &a);
	if (r < 0)
		fprintf(stderr, "bench_latency: read %llu: %s (%s)\n", (unsigned long long)seq,
			tp_strerror(r), tp_last_error());
	return r;
}

static int lat_pong_loop(struct tp_pipe *p, const struct lat_run *run)
{
	long total = run->o->warmup + run->o->iters;
	struct bench_counter pending;
	int r = 0;

	bench_counter_init(&pending);
	for (long i = 0; i < total && r == 0; i++) {
		r = lat_recv(p, run->c, (uint64_t)i);
		if (r == 0)
			r = lat_send(p, run->c, (uint64_t)i, &pending);
	}
	if (r == 0)
		r = bench_counter_wait_le(&pending, 0);
	tp_pipe_close(p);
	bench_counter_done(&pending);
	return r;
}

static int lat_pong(void *arg, int ready_fd)
{
	struct lat_run *run = arg;
	struct tp_context *ctx = NULL;
	struct tp_listener *l = NULL;
	const char *sock = run->o->ponger_socket ? run->o->ponger_socket : run->o->socket_path;
	struct tp_pipe *p = NULL;
	int r = 0;

	if (run->o->netns)
		r = bench_netns_enter(run->o->netns);
	if (r == 0)
		r = bench_context_open(sock, 0, &ctx);
	if (r == 0) {
		r = tp_listen(ctx, run->listener, &remote_any, &l);
		if (r < 0)
			fprintf(stderr, "bench_latency: tp_listen %s: %s (%s)\n", run->listener,
				tp_strerror(r), tp_last_error());
	}
	bench_ready_send(ready_fd, r);
	if (r == 0) {
		r = tp_listener_accept_sync(l, LAT_TIMEOUT_MS, &p);
		if (r < 0)
			fprintf(stderr, "bench_latency: accept: %s (%s)\n", tp_strerror(r),
				tp_last_error());
	}
	if (r == 0)
		r = lat_pong_loop(p, run);
	tp_listener_close(l);
	tp_context_free(ctx);
	return r;
}

/* @count tpipd round trips; each one's time in microseconds goes to @samples unless NULL. */
static int tp_rounds(struct lat_pair *st, const struct lat_case *c, long count, double *samples)
{
	int r = 0;

	for (long i = 0; i < count && r == 0; i++) {
		uint64_t t0 = bench_now_ns();

		r = lat_send(st->p, c, st->tp_seq, &st->pending);
		if (r == 0)
			r = lat_recv(st->p, c, st->tp_seq);
		st->tp_seq++;
		if (samples)
			samples[i] = (double)(bench_now_ns() - t0) / 1e3;
	}
	return r;
}

/* Forks the tpipd ponger, then creates this process's context and connects to it. */
static int tp_start(struct lat_run *run, struct lat_pair *st)
{
	char addr[256];
	int ready_fd, r;

	snprintf(run->listener, sizeof(run->listener), "bench-lat-%d-%c", (int)getpid(),
		 run->c->key);
	r = bench_spawn(lat_pong, run, &st->tp_pid, &ready_fd);
	if (r < 0)
		return r;
	r = bench_ready_wait(ready_fd, LAT_TIMEOUT_MS);
	close(ready_fd);
	if (r == 0)
		r = bench_context_open(run->o->socket_path, 0, &st->ctx);
	snprintf(addr, sizeof(addr), "%s%s", run->o->addr_prefix, run->listener);
	if (r == 0)
		r = tp_connect(st->ctx, addr, &st->p);
	if (r == 0)
		r = tp_pipe_wait_connected(st->p, LAT_TIMEOUT_MS);
	if (r < 0 && st->p)
		fprintf(stderr, "bench_latency: connect %s: %s (%s)\n", addr, tp_strerror(r),
			tp_last_error());
	return r;
}

/* Waits for outstanding writes, closes everything and reaps both pongers. */
static int lat_stop(struct lat_pair *st, int r)
{
	if (r == 0 && st->p)
		r = bench_counter_wait_le(&st->pending, 0);
	tp_pipe_close(st->p);
	tp_context_free(st->ctx);
	if (st->raw_fd >= 0)
		close(st->raw_fd);
	if (st->raw_pid > 0 && bench_reap(st->raw_pid, "raw ponger") < 0 && r == 0)
		r = -ECHILD;
	if (st->tp_pid > 0 && bench_reap(st->tp_pid, "ponger") < 0 && r == 0)
		r = -ECHILD;
	return r;
}

/*
 * Both ping-pongs run side by side: after both warm up, blocks of round trips alternate between
 * raw and tpipd, so that a change in background load hits both series alike.
 */
static int lat_measure(struct lat_run *run, double *s_raw, double *s_tp)
{
	const struct lat_opts *o = run->o;
	struct lat_pair st = { .raw_fd = -1 };
	int r;

	bench_counter_init(&st.pending);
	r = raw_start(run, &st);
	if (r == 0)
		r = tp_start(run, &st);
	if (r == 0)
		r = raw_rounds(&st, run->c, o->warmup, NULL);
	if (r == 0)
		r = tp_rounds(&st, run->c, o->warmup, NULL);
	for (long done = 0; done < o->iters && r == 0;) {
		long b = o->iters - done < o->block ? o->iters - done : o->block;

		r = raw_rounds(&st, run->c, b, s_raw + done);
		if (r == 0)
			r = tp_rounds(&st, run->c, b, s_tp + done);
		done += b;
	}
	r = lat_stop(&st, r);
	bench_counter_done(&st.pending);
	return r;
}

/* ---- driver ---------------------------------------------------------------------------------- */

static void lat_print(const struct lat_opts *o, const struct lat_case *c, struct bench_stats *tp,
		      struct bench_stats *raw)
{
	char name[128], size[32], res[96], base[64], ratio[48];

	snprintf(name, sizeof(name), "%slatency rtt %s", o->row_prefix, c->name);
	bench_fmt_size(lat_case_bytes(c), size, sizeof(size));
	snprintf(res, sizeof(res), "med %.1f p90 %.1f p99 %.1f min %.1f us", tp->median, tp->p90,
		 tp->p99, tp->min);
	snprintf(base, sizeof(base), "raw%s med %.1f p99 %.1f us", o->tcp_host ? " tcp" : "",
		 raw->median, raw->p99);
	snprintf(ratio, sizeof(ratio), "%.2f (p99 %.2f)", tp->median / raw->median,
		 tp->p99 / raw->p99);
	bench_row(name, size, res, base, ratio);
}

static int lat_run_case(const struct lat_opts *o, const struct lat_case *c)
{
	struct lat_run run = { .o = o, .c = c, .fd = -1, .peer_fd = -1 };
	struct bench_stats st_raw, st_tp;
	double *s_raw = calloc((size_t)o->iters, sizeof(double));
	double *s_tp = calloc((size_t)o->iters, sizeof(double));
	int r = -ENOMEM;

	if (s_raw && s_tp)
		r = lat_measure(&run, s_raw, s_tp);
	if (r == 0) {
		bench_stats_compute(s_raw, (size_t)o->iters, &st_raw);
		bench_stats_compute(s_tp, (size_t)o->iters, &st_tp);
		lat_print(o, c, &st_tp, &st_raw);
	} else {
		char name[128];

		snprintf(name, sizeof(name), "%slatency rtt %s", o->row_prefix, c->name);
		bench_row(name, "-", "error (see stderr)", "-", "-");
	}
	free(s_raw);
	free(s_tp);
	return r;
}

static void usage(void)
{
	printf("usage: bench_latency [-n ITERS] [-w WARMUP] [-b BLOCK] [-c CASES] [-S SOCKET]\n"
	       "                     [-r SOCKET] [-a PREFIX] [-x HOST] [-N NETNS] [-P PREFIX] [-t]\n"
	       "  -n ITERS   timed round trips per case, for tpipd and for raw (default 20000)\n"
	       "  -w WARMUP  untimed round trips first (default ITERS/10, at least 100)\n"
	       "  -b BLOCK   round trips per alternation between raw and tpipd (default 1000)\n"
	       "  -c CASES   any of a (8 B metadata), b (+64 B payload), c (+64 B CPU tensor);\n"
	       "             default abc\n"
	       "  -S SOCKET  tpipd socket (default: $TPIPD_SOCKET, then the library's rules)\n"
	       "  -r SOCKET  the ponger's tpipd socket, when it is another daemon (default: -S)\n"
	       "  -a PREFIX  connect to PREFIX + listener name, e.g. tpip://127.0.0.1:7421/\n"
	       "  -x HOST    raw baseline: TCP ping-pong over numeric address HOST (the ponger\n"
	       "             listens there), instead of a Unix socketpair\n"
	       "  -N NETNS   both pongers run in this network namespace (name or path)\n"
	       "  -P PREFIX  put PREFIX before every row's case name (e.g. \"xhost \")\n"
	       "  -t         tab-separated rows, no header (for bench/run.sh)\n");
}

static int parse_args(int argc, char **argv, struct lat_opts *o)
{
	int opt;

	*o = (struct lat_opts){ .iters = 20000, .warmup = -1, .block = 1000, .which = "abc",
				.addr_prefix = "", .row_prefix = "" };
	while ((opt = getopt(argc, argv, "n:w:b:c:S:r:a:x:N:P:th")) != -1) {
		switch (opt) {
		case 'n': o->iters = strtol(optarg, NULL, 10); break;
		case 'b': o->block = strtol(optarg, NULL, 10); break;
		case 'w': o->warmup = strtol(optarg, NULL, 10); break;
		case 'c': o->which = optarg; break;
		case 'S': o->socket_path = optarg; break;
		case 'r': o->ponger_socket = optarg; break;
		case 'a': o->addr_prefix = optarg; break;
		case 'x': o->tcp_host = optarg; break;
		case 'N': o->netns = optarg; break;
		case 'P': o->row_prefix = optarg; break;
		case 't': bench_tsv = true; break;
		case 'h': usage(); exit(0);
		default: usage(); return -EINVAL;
		}
	}
	if (o->iters <= 0 || o->block <= 0 || optind != argc) {
		usage();
		return -EINVAL;
	}
	if (o->warmup < 0)
		o->warmup = o->iters / 10 < 100 ? 100 : o->iters / 10;
	return 0;
}

int main(int argc, char **argv)
{
	struct lat_opts o;
	int failed = 0;

	if (parse_args(argc, argv, &o) < 0)
		return 2;
	bench_table_header("round-trip latency, tpipd vs raw socketpair (ratio = tpipd/raw)");
	/* After a failure (no daemon, daemon gone) the next cases would only fail the same way. */
	for (size_t i = 0; i < sizeof(lat_cases) / sizeof(lat_cases[0]) && !failed; i++)
		if (strchr(o.which, lat_cases[i].key) && lat_run_case(&o, &lat_cases[i]) < 0)
			failed++;
	return failed ? 1 : 0;
}
