/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_hol: head-of-line blocking between the pipes of one writing context. One process
 * holds a writer context with two pipes, A and B, each to a reader context of its own (all
 * TP_CONTEXT_NO_CMA unless -c, so private memory is staged; separate readers, so that only
 * the writer's context is shared). A thread streams large private messages on pipe A (one at
 * a time, blocking writes) while another writes small messages on pipe B, one at a time; each
 * reader context has a thread reading. Prints the latency of B's blocking writes (call to
 * completion) alone, then with A streaming, and A's throughput meanwhile. Numbers only.
 *
 *   bench_hol [-S SOCKET] [-s A_SIZE] [-b B_SIZE] [-T SECONDS] [-c] [-t]
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "bench_common.h"

#define LISTENER "bench-hol"
#define B_MAX 200000

struct opts {
	const char *socket_path;
	size_t a_size, b_size;
	double secs;
	uint32_t flags;
};

struct hol {
	const struct opts *o;
	struct tp_context *wctx, *rctx[2];
	struct tp_pipe *w[2], *r[2];
	void *a_buf, *b_buf;
	volatile int stop_a; /* atomic */
	long a_msgs;
	int err;
};

static void usage(void)
{
	fprintf(stderr, "usage: bench_hol [-S SOCKET] [-s A_SIZE] [-b B_SIZE] [-T SECONDS] [-c] "
			"[-t]\n"
			"  -c  allow CMA (default: TP_CONTEXT_NO_CMA, private memory staged)\n");
}

static int one_payload_write(struct tp_pipe *p, void *buf, size_t len)
{
	struct tp_payload pl = { .data = buf, .length = len };
	struct tp_message m = { .payloads = &pl, .n_payloads = 1 };

	return tp_pipe_write_sync(p, &m);
}

struct reader {
	struct hol *h;
	int pipe;
	size_t len;
};

/* Reads messages on one pipe until it closes. */
static void *reader_main(void *arg)
{
	struct reader *rd = arg;
	void *buf = malloc(rd->len);

	while (buf) {
		struct tp_descriptor *d;
		struct tp_slot s = { .device = { TP_DEVICE_CPU, 0 }, .data = buf };
		struct tp_allocation a = { .payloads = &s, .n_payloads = 1 };

		if (tp_pipe_read_descriptor_sync(rd->h->r[rd->pipe], -1, &d) < 0)
			break;
		if (tp_pipe_read_sync(rd->h->r[rd->pipe], d, &a) < 0)
			break;
	}
	free(buf);
	return NULL;
}

static void *a_main(void *arg)
{
	struct hol *h = arg;

	while (!__atomic_load_n(&h->stop_a, __ATOMIC_ACQUIRE)) {
		int r = one_payload_write(h->w[0], h->a_buf, h->o->a_size);

		if (r < 0) {
			fprintf(stderr, "bench_hol: write on pipe A: %s\n", tp_last_error());
			h->err = r;
			break;
		}
		h->a_msgs++;
	}
	return NULL;
}

/* B's blocking writes for @secs; their latencies (ms) in @lat. Return: count, or -errno. */
static long b_run(struct hol *h, double secs, double *lat)
{
	uint64_t end = bench_now_ns() + (uint64_t)(secs * 1e9);
	long n = 0;

	while (n < B_MAX && bench_now_ns() < end) {
		uint64_t t0 = bench_now_ns();
		int r = one_payload_write(h->w[1], h->b_buf, h->o->b_size);

		if (r < 0) {
			fprintf(stderr, "bench_hol: write on pipe B: %s\n", tp_last_error());
			return r;
		}
		lat[n++] = (double)(bench_now_ns() - t0) / 1e6;
	}
	return n;
}

static void b_row(const char *name, const struct opts *o, double *lat, long n)
{
	struct bench_stats st;
	char size[32], res[96];

	bench_stats_compute(lat, (size_t)n, &st);
	snprintf(res, sizeof(res), "p50 %.3f ms, p99 %.3f ms, max %.3f ms", st.median, st.p99,
		 st.max);
	bench_row(name, bench_fmt_size(o->b_size, size, sizeof(size)), res, "", "");
}

static int hol_open(struct hol *h)
{
	struct tp_listener *l[2];
	char name[32];
	int r;

	r = bench_context_open(h->o->socket_path, h->o->flags, &h->wctx);
	for (int i = 0; r == 0 && i < 2; i++) {
		snprintf(name, sizeof(name), "%s-%d", LISTENER, i);
		r = bench_context_open(h->o->socket_path, h->o->flags, &h->rctx[i]);
		if (r == 0)
			r = tp_listen(h->rctx[i], name, NULL, &l[i]);
		if (r == 0)
			r = tp_connect(h->wctx, name, &h->w[i]);
		if (r == 0)
			r = tp_listener_accept_sync(l[i], 10000, &h->r[i]);
		if (r == 0)
			r = tp_pipe_wait_connected(h->w[i], 10000);
	}
	if (r < 0)
		fprintf(stderr, "bench_hol: setting up: %s\n", tp_last_error());
	return r;
}

int main(int argc, char **argv)
{
	struct opts o = { .a_size = 256u << 20, .b_size = 4096, .secs = 3,
			  .flags = TP_CONTEXT_NO_CMA };
	struct hol h = { .o = &o };
	struct reader ra = { &h, 0, 0 }, rb = { &h, 1, 0 };
	pthread_t ta, tra, trb;
	double *lat = calloc(B_MAX, sizeof(*lat));
	char size[32], res[64], name[96];
	uint64_t t0;
	long n;
	int opt;

	while ((opt = getopt(argc, argv, "S:s:b:T:cth")) != -1) {
		switch (opt) {
		case 'S': o.socket_path = optarg; break;
		case 's': if (bench_parse_size(optarg, &o.a_size) < 0) return 2; break;
		case 'b': if (bench_parse_size(optarg, &o.b_size) < 0) return 2; break;
		case 'T': o.secs = strtod(optarg, NULL); break;
		case 'c': o.flags = 0; break;
		case 't': bench_tsv = true; break;
		default: usage(); return opt == 'h' ? 0 : 2;
		}
	}
	h.a_buf = malloc(o.a_size);
	h.b_buf = malloc(o.b_size);
	if (!lat || !h.a_buf || !h.b_buf || o.secs <= 0 || hol_open(&h) < 0)
		return 1;
	memset(h.a_buf, 0x5a, o.a_size);
	memset(h.b_buf, 0xa5, o.b_size);
	ra.len = o.a_size;
	rb.len = o.b_size;
	pthread_create(&tra, NULL, reader_main, &ra);
	pthread_create(&trb, NULL, reader_main, &rb);
	bench_table_header(o.flags ? "pipe B's blocking writes while pipe A streams, same context "
				     "(private memory staged: TP_CONTEXT_NO_CMA)"
				   : "pipe B's blocking writes while pipe A streams, same context");
	n = b_run(&h, o.secs, lat);
	if (n <= 0)
		return 1;
	b_row("hol: B alone", &o, lat, n);
	t0 = bench_now_ns();
	pthread_create(&ta, NULL, a_main, &h);
	n = b_run(&h, o.secs, lat);
	__atomic_store_n(&h.stop_a, 1, __ATOMIC_RELEASE);
	pthread_join(ta, NULL);
	if (n <= 0 || h.err)
		return 1;
	snprintf(name, sizeof(name), "hol: B while A streams %s",
		 bench_fmt_size(o.a_size, size, sizeof(size)));
	b_row(name, &o, lat, n);
	snprintf(res, sizeof(res), "%.2f GB/s (%ld messages)",
		 (double)h.a_msgs * (double)o.a_size / (double)(bench_now_ns() - t0), h.a_msgs);
	bench_row("hol: A meanwhile", bench_fmt_size(o.a_size, size, sizeof(size)), res, "", "");
	for (int i = 0; i < 2; i++)
		tp_pipe_close(h.w[i]);
	pthread_join(tra, NULL);
	pthread_join(trb, NULL);
	tp_context_free(h.wctx);
	tp_context_free(h.rctx[0]);
	tp_context_free(h.rctx[1]);
	free(h.a_buf);
	free(h.b_buf);
	free(lat);
	return 0;
}
