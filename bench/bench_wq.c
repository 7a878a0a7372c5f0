/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_wq: the round trip of one work queue question (docs/queues.md, "Questions and answers as
 * messages"). The owner submits a question of SIZE bytes, a worker in another process takes it
 * and answers 8 bytes, the owner receives the answer; the time from submit to answer received,
 * ROUNDS times, after 3 unreported ones. MODE "bytes": tp_wq_submit() of private memory,
 * tp_wq_take() (the payload inline in the frames, copied through the daemon: SIZE at most the
 * daemon's --inline-max, so start it with --inline-max and --frame-max above SIZE);
 * MODE "msg": tp_wq_submit_msg() of a shared buffer (tp_buffer_alloc()), tp_wq_take_descriptor()
 * and tp_wq_read_msg() into the worker's shared buffer, the answer as a message too. Prints the
 * median, minimum and maximum in microseconds. Numbers, never pass/fail.
 *
 *   tpipd --socket S & TPIPD_SOCKET=S bench_wq MODE SIZE ROUNDS
 *
 * Across hosts (docs/queues.md "Across hosts"): with BENCH_WQ_AT=tpip://HOST:PORT (the peer
 * listener of the owner's daemon, TPIPD_SOCKET) and BENCH_WQ_WORKER_SOCKET (the socket of another
 * daemon peered with it), the owner's queue admits any peer and the worker is a client of that
 * other daemon, opening the queue as BENCH_WQ_AT/NAME: each question crosses the peer link to
 * the worker, each answer comes back over it.
 *
 * Built with -DBENCH_WQ_BYTES_ONLY it needs none of the message calls (to measure a build that
 * has none).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tpclient.h"

#define NAME "bench.wq"

static bool msg_mode;
static size_t size;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Takes one question and answers 8 bytes. Return: 0, -EPIPE once closed, or -errno. */
static int serve_one(struct tp_wq *q, void *slot)
{
	uint64_t id, v = 42;
	int r;

	if (!msg_mode) {
		void *data;
		size_t len;

		r = tp_wq_take(q, &id, &data, &len, -1);
		if (r < 0)
			return r;
		free(data);
		return tp_wq_reply(q, id, &v, sizeof(v));
	}
#ifndef BENCH_WQ_BYTES_ONLY
	struct tp_descriptor *d;
	struct tp_slot s = { .device = { TP_DEVICE_CPU, 0 }, .data = slot };
	struct tp_allocation a = { .payloads = &s, .n_payloads = 1 };
	struct tp_payload p = { .data = &v, .length = sizeof(v) };
	struct tp_message m = { .payloads = &p, .n_payloads = 1 };

	r = tp_wq_take_descriptor(q, &id, &d, -1);
	if (r == 0)
		r = tp_wq_read_msg(q, d, &a);
	if (r == 0)
		r = tp_wq_reply_msg(q, id, &m);
	return r;
#else
	(void)slot;
	return -EOPNOTSUPP;
#endif
}

static int worker(void)
{
	struct tp_context *ctx;
	struct tp_wq *q = NULL;
	void *slot = NULL;
	int r;

	const char *at = getenv("BENCH_WQ_AT"), *sock = getenv("BENCH_WQ_WORKER_SOCKET");
	char name[512];

	snprintf(name, sizeof(name), "%s%s%s", at ? at : "", at ? "/" : "", NAME);
	if (at && sock && setenv("TPIPD_SOCKET", sock, 1) < 0)
		return 1;
	if (tp_context_new(NULL, &ctx) < 0)
		return 1;
	for (int i = 0; i < 5000 && tp_wq_open(ctx, name, NULL, &q) < 0; i++)
		usleep(1000);
	if (!q || (msg_mode && tp_buffer_alloc(ctx, size, &slot) < 0))
		return 1;
	while ((r = serve_one(q, slot)) == 0)
		;
	tp_wq_release(q);
	tp_context_free(ctx);
	return r == -EPIPE ? 0 : 1;
}

/* Submits one question from @buf and receives its answer. */
static int round_trip(struct tp_wq *q, void *buf)
{
	uint64_t id, got, v;
	int r;

	if (!msg_mode) {
		void *data;
		size_t len;

		r = tp_wq_submit(q, buf, size, &id);
		if (r == 0)
			r = tp_wq_answer(q, &got, &data, &len, -1);
		if (r == 0)
			free(data);
		return r;
	}
#ifndef BENCH_WQ_BYTES_ONLY
	struct tp_descriptor *d;
	struct tp_payload p = { .data = buf, .length = size };
	struct tp_message m = { .payloads = &p, .n_payloads = 1 };
	struct tp_slot s = { .device = { TP_DEVICE_CPU, 0 }, .data = &v };
	struct tp_allocation a = { .payloads = &s, .n_payloads = 1 };

	r = tp_wq_submit_msg(q, &m, &id);
	if (r == 0)
		r = tp_wq_answer_descriptor(q, &got, &d, -1);
	if (r == 0)
		r = tp_wq_read_msg(q, d, &a);
	return r;
#else
	(void)v;
	return -EOPNOTSUPP;
#endif
}

int main(int argc, char **argv)
{
	struct tp_wq_options o = { .size = sizeof(o), .flags = TP_WQ_CREATE, .owner_uid = -1 };
	struct tp_context *ctx;
	struct tp_wq *q;
	uint64_t *t;
	void *buf;
	int rounds, status, r = 0;
	pid_t pid;

	if (argc != 4 || (strcmp(argv[1], "bytes") && strcmp(argv[1], "msg"))) {
		fprintf(stderr, "usage: %s bytes|msg SIZE ROUNDS\n", argv[0]);
		return 2;
	}
	msg_mode = strcmp(argv[1], "msg") == 0;
	if (getenv("BENCH_WQ_AT"))
		o.remote = TP_REMOTE_ANY_PEER;
	size = strtoull(argv[2], NULL, 0);
	rounds = atoi(argv[3]);
	if (!size || rounds < 1)
		return 2;
	pid = fork();
	if (pid == 0)
		_exit(worker());
	t = calloc((size_t)rounds, sizeof(*t));
	if (!t || tp_context_new(NULL, &ctx) < 0 || tp_wq_open(ctx, NAME, &o, &q) < 0) {
		fprintf(stderr, "bench_wq: %s\n", tp_last_error());
		return 1;
	}
	buf = NULL;
	if (msg_mode ? tp_buffer_alloc(ctx, size, &buf) < 0 : !(buf = malloc(size)))
		return 1;
	memset(buf, 0x5a, size);
	for (int i = -3; r == 0 && i < rounds; i++) {
		uint64_t t0 = now_ns();

		r = round_trip(q, buf);
		if (i >= 0)
			t[i] = now_ns() - t0;
	}
	if (r < 0)
		fprintf(stderr, "bench_wq: %s\n", tp_last_error());
	tp_wq_close(q);
	waitpid(pid, &status, 0);
	qsort(t, (size_t)rounds, sizeof(*t), cmp_u64);
	if (r == 0)
		printf("%s %zu bytes: round trip median %.1f us, min %.1f, max %.1f (%d rounds)\n",
		       argv[1], size, t[rounds / 2] / 1e3, t[0] / 1e3, t[rounds - 1] / 1e3, rounds);
	tp_wq_release(q);
	tp_context_free(ctx);
	free(t);
	return r < 0 || !WIFEXITED(status) || WEXITSTATUS(status) ? 1 : 0;
}
