/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_throughput: one-way throughput through tpipd for one CPU tensor per message, between a
 * writer (this process) and a reader it forks before either creates a context. Memory kinds:
 * shared buffers on both sides (tp_buffer_alloc), private memory on both sides (malloc, reached
 * by CMA), and private memory with TP_CONTEXT_NO_CMA (staged through shared buffers). The writer
 * keeps a few writes in flight; the reader reads into a ring of slots and returns credits, so
 * eager messages cannot pile up in the daemon. A phase ends when the reader has read the message
 * flagged last and says so; the figure is bytes over that wall time. The baseline, measured in
 * the same run right before each phase, is single-thread memcpy of the same size between warm,
 * pre-faulted buffers; the 4 KiB message rate is compared with a raw socketpair stream of the same
 * bytes. With -r and -a the reader attaches to another daemon and the writer connects to it by
 * address (tpip://HOST:PORT/NAME), which measures a pipe across two daemons (bench/run_xhost.sh);
 * -B then drops the same-host baselines, which that script replaces with its own, and -x HOST
 * makes the baseline of each size row N raw TCP streams doing the same memory work
 * (bench_rawtcp.c). It prints figures only; it never judges them.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"
#include "bench_tput.h"

static const struct kind kinds[] = {
	{ "shm", "shm->shm", 0, true },
	{ "cma", "private->private", 0, false },
	{ "staging", "private->private no-cma", TP_CONTEXT_NO_CMA, false },
};

/* ---- baselines ------------------------------------------------------------------------------- */

#define MEMCPY_TRIALS 5

/* One trial: copies @src to @dst at least twice and for at least @min_s; returns bytes/ns. */
static double memcpy_trial(void *dst, const void *src, size_t size, double min_s)
{
	uint64_t t0 = bench_now_ns(), el;
	long reps = 0;

	do {
		memcpy(dst, src, size);
		__asm__ __volatile__("" : : "r"(dst), "r"(src) : "memory");
		reps++;
		el = bench_now_ns() - t0;
	} while (reps < 2 || (double)el < min_s * 1e9);
	return (double)reps * (double)size / (double)el;
}

/*
 * Single-thread memcpy bandwidth between two warm, pre-faulted buffers of @size bytes, in GB/s
 * (1e9 bytes): the best of MEMCPY_TRIALS trials sharing @min_s, so that a burst of background
 * load lowers the baseline less (which can only make the ratio look worse for tpipd).
 */
static double memcpy_gbps(size_t size, double min_s)
{
	void *src, *dst;
	double best = 0;

	if (posix_memalign(&src, 4096, size))
		return 0;
	if (posix_memalign(&dst, 4096, size)) {
		free(src);
		return 0;
	}
	memset(src, 0x5a, size);
	memset(dst, 0, size);
	memcpy(dst, src, size);
	for (int i = 0; i < MEMCPY_TRIALS; i++) {
		double bw = memcpy_trial(dst, src, size, min_s / MEMCPY_TRIALS);

		best = bw > best ? bw : best;
	}
	free(src);
	free(dst);
	return best;
}

struct raw_sink {
	int fd;
	int peer_fd; /* the writer's end, closed in the child */
	size_t size;
};

/* Reads tagged records of a fixed size; acks each record flagged last with one byte. */
static int raw_sink_run(void *arg, int ready_fd)
{
	struct raw_sink *s = arg;
	size_t n = sizeof(struct tag) + s->size;
	char *buf = malloc(n);
	struct tag t;
	int r = buf ? 0 : -ENOMEM;

	close(s->peer_fd); /* so that the writer closing its end reads as EOF here */
	while (r == 0) {
		r = bench_read_full(s->fd, buf, n);
		if (r < 0)
			break;
		memcpy(&t, buf, sizeof(t));
		if (t.type == TAG_QUIT)
			break;
		if (t.flags & TAG_LAST)
			r = bench_write_full(s->fd, "k", 1);
	}
	free(buf);
	return r;
}

/* Sends records until @min_s and @min_msgs are reached; returns the messages sent. */
static long raw_stream(int fd, char *buf, size_t n, double min_s, long min_msgs, uint64_t *ret_ns)
{
	struct tag t = { .magic = TAG_MAGIC, .type = TAG_DATA };
	uint64_t t0 = bench_now_ns();
	char ack;

	for (long i = 0;; i++) {
		bool last = i + 1 >= min_msgs && (double)(bench_now_ns() - t0) >= min_s * 1e9;

		t.seq = (uint64_t)i;
		t.flags = last ? TAG_LAST : 0;
		memcpy(buf, &t, sizeof(t));
		if (bench_write_full(fd, buf, n) < 0)
			return -EPIPE;
		if (last) {
			if (bench_read_full(fd, &ack, 1) < 0)
				return -EPIPE;
			*ret_ns = bench_now_ns() - t0;
			return i + 1;
		}
	}
}

/* Message rate of a raw Unix socketpair stream of (tag + @size) byte records, in msg/s. */
static double raw_rate(size_t size, double min_s)
{
	size_t n = sizeof(struct tag) + size;
	struct tag q = { .magic = TAG_MAGIC, .type = TAG_QUIT };
	struct raw_sink sink = { .size = size };
	char *buf = calloc(1, n);
	uint64_t ns = 0;
	long cnt = -1;
	int sv[2], ready_fd;
	pid_t pid;

	if (!buf || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
		free(buf);
		return 0;
	}
	sink.fd = sv[1];
	sink.peer_fd = sv[0];
	if (bench_spawn(raw_sink_run, &sink, &pid, &ready_fd) == 0) {
		close(ready_fd);
		close(sv[1]);
		sv[1] = -1;
		if (raw_stream(sv[0], buf, n, 0, 1000, &ns) > 0)
			cnt = raw_stream(sv[0], buf, n, min_s, 1000, &ns);
		memcpy(buf, &q, sizeof(q));
		(void)bench_write_full(sv[0], buf, n);
		bench_reap(pid, "raw sink");
	}
	close(sv[0]);
	if (sv[1] >= 0)
		close(sv[1]);
	free(buf);
	return cnt > 0 ? (double)cnt * 1e9 / (double)ns : 0;
}

/* ---- writer ---------------------------------------------------------------------------------- */

struct wstate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	long inflight;
	uint64_t phase;
	long credited; /* messages of this phase the reader has read, from its credits */
	bool done;
	uint64_t done_ns;
	bool closing;
	int err;
	struct tp_context *ctx;
	struct tp_pipe *p;
};

static void w_fail(struct wstate *ws, int err, const char *what, const char *msg)
{
	pthread_mutex_lock(&ws->mu);
	if (!ws->closing && ws->err == 0) {
		fprintf(stderr, "bench_throughput: %s: %s (%s)\n", what, tp_strerror(err),
			msg ? msg : "");
		ws->err = err;
	}
	pthread_cond_broadcast(&ws->cv);
	pthread_mutex_unlock(&ws->mu);
}

static void w_on_write(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	struct wstate *ws = arg;

	pthread_mutex_lock(&ws->mu);
	ws->inflight--;
	pthread_cond_broadcast(&ws->cv);
	pthread_mutex_unlock(&ws->mu);
	if (status < 0)
		w_fail(ws, status, "write", errmsg);
}

static void w_on_ctl_read(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	if (status < 0)
		w_fail(arg, status, "credit read", errmsg);
}

static int w_arm(struct wstate *ws);

/* A credit or done message from the reader: note it, consume it, wait for the next. */
static void w_on_desc(void *arg, struct tp_pipe *p, int status, const char *errmsg,
		      struct tp_descriptor *d)
{
	struct wstate *ws = arg;
	struct tp_allocation none = { 0 };
	struct tag t = { 0 };
	int r;

	if (status < 0) {
		w_fail(ws, status, "credit descriptor", errmsg);
		return;
	}
	if (d->metadata_len == sizeof(t))
		memcpy(&t, d->metadata, sizeof(t));
	pthread_mutex_lock(&ws->mu);
	if (t.phase == ws->phase && t.type == TAG_CREDIT && (long)t.seq > ws->credited)
		ws->credited = (long)t.seq;
	if (t.phase == ws->phase && t.type == TAG_DONE) {
		ws->done = true;
		ws->done_ns = bench_now_ns();
	}
	pthread_cond_broadcast(&ws->cv);
	pthread_mutex_unlock(&ws->mu);
	r = tp_pipe_read(p, d, &none, w_on_ctl_read, ws);
	if (r < 0)
		w_fail(ws, r, "credit read", tp_last_error());
	else
		w_arm(ws);
}

static int w_arm(struct wstate *ws)
{
	int r = tp_pipe_read_descriptor(ws->p, w_on_desc, ws);

	if (r < 0)
		w_fail(ws, r, "read_descriptor", tp_last_error());
	return r;
}

/* Waits until a message @seq may be sent (or, with @seq < 0, until the phase is done). */
static int w_wait(struct wstate *ws, int inflight, long window, long seq)
{
	int r;

	pthread_mutex_lock(&ws->mu);
	for (;;) {
		if (ws->err)
			break;
		if (seq < 0 && ws->done && ws->inflight == 0)
			break;
		if (seq >= 0 && ws->inflight < inflight && seq - ws->credited < window)
			break;
		pthread_cond_wait(&ws->cv, &ws->mu);
	}
	r = ws->err;
	pthread_mutex_unlock(&ws->mu);
	return r;
}

static int w_send(struct wstate *ws, enum tag_type type, void *src, size_t size, long seq,
		  bool last)
{
	struct tag t = { .magic = TAG_MAGIC, .type = type, .flags = last ? TAG_LAST : 0,
			 .phase = ws->phase, .seq = (uint64_t)seq };
	struct tp_tensor tensor = { .device = { TP_DEVICE_CPU, 0 }, .data = src, .length = size };
	struct tp_message m = { .metadata = &t, .metadata_len = sizeof(t),
				.tensors = src ? &tensor : NULL, .n_tensors = src ? 1 : 0 };
	int r;

	pthread_mutex_lock(&ws->mu);
	ws->inflight++;
	pthread_mutex_unlock(&ws->mu);
	r = tp_pipe_write(ws->p, &m, w_on_write, ws);
	if (r < 0) {
		pthread_mutex_lock(&ws->mu);
		ws->inflight--;
		pthread_mutex_unlock(&ws->mu);
		w_fail(ws, r, "tp_pipe_write", tp_last_error());
	}
	return r;
}

struct phase_result {
	long msgs;
	double secs;
};

/*
 * One phase: send messages of @size from @src, at most @inflight uncompleted writes and
 * o->window unread messages, until @min_s seconds and @min_msgs messages; the last is flagged
 * and the phase ends when the reader says it has read it.
 */
static int w_phase(struct wstate *ws, const struct opts *o, void *src, size_t size, int inflight,
		   double min_s, long min_msgs, struct phase_result *ret)
{
	uint64_t t0;
	long seq;
	int r;

	pthread_mutex_lock(&ws->mu);
	ws->phase++;
	ws->credited = 0;
	ws->done = false;
	pthread_mutex_unlock(&ws->mu);
	t0 = bench_now_ns();
	for (seq = 0;; seq++) {
		bool last;

		r = w_wait(ws, inflight, o->window, seq);
		if (r < 0)
			return r;
		last = seq + 1 >= min_msgs && (double)(bench_now_ns() - t0) >= min_s * 1e9;
		r = w_send(ws, TAG_DATA, src, size, seq, last);
		if (r < 0)
			return r;
		if (last)
			break;
	}
	r = w_wait(ws, inflight, o->window, -1);
	if (r < 0)
		return r;
	ret->msgs = seq + 1;
	ret->secs = (double)(ws->done_ns - t0) / 1e9;
	return 0;
}

/* Warm-up phase (untimed) then the timed phase, with the writer's source of the kind's memory. */
static int w_measure(struct wstate *ws, const struct opts *o, bool shm, size_t size,
		     int inflight, struct phase_result *ret)
{
	long warm = (long)((64u << 20) / size);
	struct phase_result wr;
	void *src = NULL;
	int r;

	if (warm < 2L * inflight)
		warm = 2L * inflight;
	if (warm > 2000)
		warm = 2000;
	r = bench_tput_buf_get(ws->ctx, shm, size, &src);
	if (r < 0)
		return r;
	r = w_phase(ws, o, src, size, inflight, 0, warm, &wr);
	if (r == 0)
		r = w_phase(ws, o, src, size, inflight, o->min_s, o->min_msgs, ret);
	bench_tput_buf_put(ws->ctx, shm, src);
	return r;
}

/* ---- driver ---------------------------------------------------------------------------------- */

/* An error row; @size 0: the kind could not start at all (@name is then the kind's label). */
static void row_error(const struct opts *o, const char *name, size_t size)
{
	char sz[32] = "-", full[192];

	if (size)
		bench_fmt_size(size, sz, sizeof(sz));
	else
		snprintf(full, sizeof(full), "%stput %s", o->row_prefix, name);
	bench_row(size ? name : full, sz, "error (see stderr)", "-", "-");
}

/* The baseline and ratio columns: "@what @fig @unit" and @res / @fig, or "-" without baselines. */
static void fmt_baseline(const struct opts *o, const char *what, double fig, const char *unit,
			 double res, char *base, size_t base_len, char *ratio, size_t ratio_len)
{
	if (!o->baselines) {
		snprintf(base, base_len, "-");
		snprintf(ratio, ratio_len, "-");
		return;
	}
	snprintf(base, base_len, "%s %.*f %s", what, fig >= 1000 ? 0 : 2, fig, unit);
	snprintf(ratio, ratio_len, "%.3f", fig > 0 ? res / fig : 0);
}

/* The raw TCP baseline's columns ("-" where it failed: the reason went to stderr). */
static void fmt_raw_tcp(const struct opts *o, double fig, double res, char *base, size_t base_len,
			char *ratio, size_t ratio_len)
{
	if (fig <= 0) {
		snprintf(base, base_len, "raw tcp x%d: failed", o->streams);
		snprintf(ratio, ratio_len, "-");
		return;
	}
	snprintf(base, base_len, "raw tcp x%d %.2f GB/s", o->streams, fig);
	snprintf(ratio, ratio_len, "%.3f", res / fig);
}

static int run_tput(struct wstate *ws, const struct opts *o, const struct kind *k,
		    const char *label, size_t size)
{
	char name[160], sz[32], res[96], base[64], ratio[24];
	struct phase_result pr;
	double mc = 0, gbps;
	int r;

	snprintf(name, sizeof(name), "%stput %s k=%d", o->row_prefix, label, o->inflight);
	if (o->tcp_host)
		mc = bench_rawtcp_gbps(o, size);
	else if (o->baselines)
		mc = memcpy_gbps(size, o->min_s < 0.25 ? o->min_s : 0.25);
	r = w_measure(ws, o, k->shm, size, o->inflight, &pr);
	if (r < 0) {
		row_error(o, name, size);
		return r;
	}
	gbps = (double)pr.msgs * (double)size / pr.secs / 1e9;
	snprintf(res, sizeof(res), "%.2f GB/s (%ld msgs, %.2f s)", gbps, pr.msgs, pr.secs);
	if (o->tcp_host)
		fmt_raw_tcp(o, mc, gbps, base, sizeof(base), ratio, sizeof(ratio));
	else
		fmt_baseline(o, "memcpy", mc, "GB/s", gbps, base, sizeof(base), ratio,
			     sizeof(ratio));
	bench_row(name, bench_fmt_size(size, sz, sizeof(sz)), res, base, ratio);
	return 0;
}

static int run_rate(struct wstate *ws, const struct opts *o, const struct kind *k,
		    const char *label)
{
	char name[160], sz[32], res[96], base[48], ratio[24];
	struct phase_result pr;
	double raw = 0, rate;
	int r;

	snprintf(name, sizeof(name), "%srate %s k=%d", o->row_prefix, label, RATE_INFLIGHT);
	if (o->baselines)
		raw = raw_rate(RATE_SIZE, o->min_s);
	r = w_measure(ws, o, k->shm, RATE_SIZE, RATE_INFLIGHT, &pr);
	if (r < 0) {
		row_error(o, name, RATE_SIZE);
		return r;
	}
	rate = (double)pr.msgs / pr.secs;
	snprintf(res, sizeof(res), "%.0f msg/s (%ld msgs, %.2f s)", rate, pr.msgs, pr.secs);
	fmt_baseline(o, "raw socketpair", raw, "msg/s", rate, base, sizeof(base), ratio,
		     sizeof(ratio));
	bench_row(name, bench_fmt_size(RATE_SIZE, sz, sizeof(sz)), res, base, ratio);
	return 0;
}

/* Connects to the forked reader of kind @k and runs every size, then the rate case. */
static int run_kind_phases(struct wstate *ws, const struct opts *o, const struct kind *k)
{
	char label[64];
	int r = 0;

	snprintf(label, sizeof(label), "%s%s", k->label,
		 !k->shm && !(k->ctx_flags & TP_CONTEXT_NO_CMA) && !tp_context_cma_ok(ws->ctx) ?
			 " (CMA refused: staged)" : "");
	for (size_t i = 0; i < o->n_sizes && r == 0; i++)
		r = run_tput(ws, o, k, label, o->sizes[i]);
	if (r == 0 && o->rate)
		r = run_rate(ws, o, k, label);
	if (r == 0) {
		pthread_mutex_lock(&ws->mu);
		ws->closing = true;
		pthread_mutex_unlock(&ws->mu);
		r = w_send(ws, TAG_QUIT, NULL, 0, 0, false);
		if (r == 0)
			r = w_wait(ws, 1, o->window, 0);
	}
	return r;
}

/* Connects to the reader's @listener, through o->addr_prefix when the reader is elsewhere. */
static int w_connect(struct wstate *ws, const struct opts *o, const struct kind *k,
		     const char *listener)
{
	char addr[256];
	int r = bench_context_open(o->socket_path, k->ctx_flags, &ws->ctx);

	snprintf(addr, sizeof(addr), "%s%s", o->addr_prefix, listener);
	if (r == 0)
		r = tp_connect(ws->ctx, addr, &ws->p);
	if (r == 0)
		r = tp_pipe_wait_connected(ws->p, TP_TIMEOUT_MS);
	if (r < 0 && ws->p)
		fprintf(stderr, "bench_throughput: connect %s: %s (%s)\n", addr, tp_strerror(r),
			tp_last_error());
	if (r == 0)
		r = w_arm(ws);
	return r;
}

static int run_kind(const struct opts *o, const struct kind *k)
{
	struct bench_tput_reader_arg ra = { .o = o, .k = k };
	struct wstate ws = { 0 };
	int ready_fd, r;
	pid_t pid;

	snprintf(ra.listener, sizeof(ra.listener), "bench-tput-%d-%s", (int)getpid(), k->key);
	pthread_mutex_init(&ws.mu, NULL);
	pthread_cond_init(&ws.cv, NULL);
	r = bench_spawn(bench_tput_reader_run, &ra, &pid, &ready_fd);
	if (r < 0)
		return r;
	r = bench_ready_wait(ready_fd, TP_TIMEOUT_MS);
	close(ready_fd);
	if (r == 0)
		r = w_connect(&ws, o, k, ra.listener);
	if (r == 0)
		r = run_kind_phases(&ws, o, k);
	else
		row_error(o, k->label, 0);
	pthread_mutex_lock(&ws.mu);
	ws.closing = true;
	pthread_mutex_unlock(&ws.mu);
	tp_pipe_close(ws.p);
	tp_context_free(ws.ctx);
	if (bench_reap(pid, "reader") < 0 && r == 0)
		r = -ECHILD;
	pthread_cond_destroy(&ws.cv);
	pthread_mutex_destroy(&ws.mu);
	return r;
}

static void usage(void)
{
	printf("usage: bench_throughput [-s SIZES] [-K KINDS] [-k N] [-T SECONDS] [-m MSGS]\n"
	       "                        [-D WINDOW] [-R] [-B] [-S SOCKET] [-r SOCKET] [-a PREFIX]\n"
	       "                        [-P PREFIX] [-x HOST [-N NETNS] [-C STREAMS] [-W BYTES]]\n"
	       "                        [-t]\n"
	       "  -s SIZES    comma list, K/M/G suffixes (default 4K,64K,1M,16M,64M,256M)\n"
	       "  -K KINDS    comma list of shm, cma, staging (default all)\n"
	       "  -k N        writes in flight (default 4, at most %d)\n"
	       "  -T SECONDS  minimum timed duration per size (default 0.5)\n"
	       "  -m MSGS     minimum timed messages per size (default 8)\n"
	       "  -D WINDOW   messages the reader may lag before the writer waits (default 64)\n"
	       "  -R          skip the 4 KiB message-rate case\n"
	       "  -B          no baselines (memcpy, raw socketpair): those columns say -\n"
	       "  -S SOCKET   tpipd socket (default: $TPIPD_SOCKET, then the library's rules)\n"
	       "  -r SOCKET   the reader's tpipd socket, when it is another daemon (default: -S)\n"
	       "  -a PREFIX   the writer connects to PREFIX + listener name, e.g.\n"
	       "              tpip://127.0.0.1:7421/ for a reader on another daemon (default: \"\")\n"
	       "  -P PREFIX   put PREFIX before every row's case name (e.g. \"xhost \")\n"
	       "  -x HOST     baseline of the size rows: STREAMS raw TCP connections to a\n"
	       "              receiver listening on numeric address HOST carry the same\n"
	       "              messages between as many distinct slots (instead of memcpy)\n"
	       "  -N NETNS    that receiver runs in this network namespace (name or path)\n"
	       "  -C STREAMS  its TCP connections (default 4, at most %d)\n"
	       "  -W BYTES    its bytes per write(), K/M suffixes (default 60K, tpipd's\n"
	       "              --peer-send-size; 0: each connection's slice in one write)\n"
	       "  -t          tab-separated rows, no header (for bench/run.sh)\n", SLOTS_MAX,
	       RAW_STREAMS_MAX);
}

static int parse_sizes(const char *arg, struct opts *o)
{
	char *dup = strdup(arg), *save = NULL, *tok;
	int r = dup ? 0 : -ENOMEM;

	o->n_sizes = 0;
	for (tok = dup ? strtok_r(dup, ",", &save) : NULL; tok && r == 0;
	     tok = strtok_r(NULL, ",", &save)) {
		if (o->n_sizes == SIZES_MAX)
			r = -E2BIG;
		else
			r = bench_parse_size(tok, &o->sizes[o->n_sizes++]);
	}
	free(dup);
	return r == 0 && o->n_sizes == 0 ? -EINVAL : r;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	int opt, r = 0;

	*o = (struct opts){ .kinds = "shm,cma,staging", .inflight = 4, .min_s = 0.5,
			    .min_msgs = 8, .window = 64, .rate = true, .baselines = true,
			    .addr_prefix = "", .row_prefix = "", .streams = 4,
			    .write_size = 60 << 10 };
	parse_sizes("4K,64K,1M,16M,64M,256M", o);
	while ((opt = getopt(argc, argv, "s:K:k:T:m:D:RBS:r:a:P:x:N:C:W:th")) != -1 && r == 0) {
		switch (opt) {
		case 's': r = parse_sizes(optarg, o); break;
		case 'K': o->kinds = optarg; break;
		case 'k': o->inflight = atoi(optarg); break;
		case 'T': o->min_s = strtod(optarg, NULL); break;
		case 'm': o->min_msgs = strtol(optarg, NULL, 10); break;
		case 'D': o->window = strtol(optarg, NULL, 10); break;
		case 'R': o->rate = false; break;
		case 'B': o->baselines = false; break;
		case 'S': o->socket_path = optarg; break;
		case 'r': o->reader_socket = optarg; break;
		case 'a': o->addr_prefix = optarg; break;
		case 'P': o->row_prefix = optarg; break;
		case 'x': o->tcp_host = optarg; break;
		case 'N': o->netns = optarg; break;
		case 'C': o->streams = atoi(optarg); break;
		case 'W': r = bench_parse_size(optarg, &o->write_size); break;
		case 't': bench_tsv = true; break;
		case 'h': usage(); exit(0);
		default: r = -EINVAL; break;
		}
	}
	if (r == 0 && (o->inflight < 1 || o->inflight > SLOTS_MAX || o->min_s < 0 ||
		       o->min_msgs < 1 || o->window < 1 || o->streams < 1 ||
		       o->streams > RAW_STREAMS_MAX || optind != argc))
		r = -EINVAL;
	if (r < 0)
		usage();
	return r;
}

int main(int argc, char **argv)
{
	struct opts o;
	int failed = 0;

	if (parse_args(argc, argv, &o) < 0)
		return 2;
	bench_table_header("one-way throughput, one CPU tensor per message "
			   "(ratio = tpipd/memcpy, rate: tpipd/raw socketpair)");
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
		if (bench_list_has(o.kinds, kinds[i].key) && run_kind(&o, &kinds[i]) < 0)
			failed++;
	return failed ? 1 : 0;
}

