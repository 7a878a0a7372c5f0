/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_fan: a server broadcasts one message to 4 readers with tp_set_broadcast(), fanned out
 * by the daemon (TP_FANOUT_DAEMON: one request, private memory read once by the daemon) and by
 * the library (TP_FANOUT_LIBRARY: a write per pipe, private memory staged once by the library),
 * against writing the same message to the 4 pipes one by one (tp_pipe_write_sync() per pipe),
 * for 64 KiB, 1 MiB and 16 MiB, from a shared buffer and from private memory, in alternating
 * rounds of the same run. With -r SOCKET -a tpip://HOST:PORT/bench-fan the readers are clients of
 * a second daemon (SOCKET) behind a peer link: the daemon's fan-out crosses it once per
 * broadcast, the others once per reader. Prints messages per second of the whole
 * fan-out and the GB/s delivered (size x readers). The daemon is the one of $TPIPD_SOCKET (or
 * the library's default); bench/run.sh is not needed: start a tpipd and run
 * `bench_fan [-n ITERS]`. Numbers only, never pass/fail.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "bench_common.h"
#include "tpclient.h"

#define READERS 4
#define BIG ((size_t)16 << 20)

static const size_t sizes[] = { (size_t)64 << 10, (size_t)1 << 20, BIG };
static unsigned iters = 50;
/* -r SOCKET -a ADDRESS: the readers are clients of another daemon and connect to ADDRESS
 * (tpip://HOST:PORT/bench-fan): every delivery crosses a peer link. */
static const char *reader_sock, *reader_addr;

static const char *sock_path(void)
{
	return getenv("TPIPD_SOCKET");
}

/* A reader: connects to "bench-fan" and reads every message it is sent until the pipe ends. */
static int reader_main(void *arg, int ready_fd)
{
	struct tp_context *ctx = NULL;
	struct tp_pipe *p = NULL;
	uint8_t *buf = malloc(BIG);
	int r;

	(void)arg;
	r = bench_context_open(reader_sock ? reader_sock : sock_path(), 0, &ctx);
	if (r == 0)
		r = tp_connect(ctx, reader_addr ? reader_addr : "bench-fan", &p);
	if (r == 0)
		r = tp_pipe_wait_connected(p, 10000);
	bench_ready_send(ready_fd, r);
	while (r == 0 && buf) {
		struct tp_descriptor *d = NULL;
		struct tp_slot slot = { .data = buf };
		struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };

		if (tp_pipe_read_descriptor_sync(p, -1, &d) < 0)
			break; /* the server closed: done */
		r = tp_pipe_read_sync(p, d, &a);
	}
	free(buf);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return r;
}

static int one_by_one(struct tp_pipe_set *s, const struct tp_message *m)
{
	for (unsigned i = 0; i < tp_set_size(s); i++) {
		int r = tp_pipe_write_sync(tp_set_pipe(s, i), m);

		if (r < 0)
			return r;
	}
	return 0;
}

/* @iters broadcasts of @m fanned out as @how (-1: each pipe written one by one). Return: seconds,
 * or < 0 on error. */
static double time_mode(struct tp_pipe_set *s, const struct tp_message *m, int how,
			unsigned iters_)
{
	uint64_t t0 = bench_now_ns();
	int r = 0;

	if (how >= 0 && tp_set_set_fanout(s, (enum tp_fanout)how) < 0)
		return -1;
	for (unsigned i = 0; i < iters_ && r >= 0; i++)
		r = how < 0 ? one_by_one(s, m)
			    : (tp_set_broadcast(s, m, -1, NULL, 0) == READERS ? 0 : -EIO);
	return r < 0 ? -1 : (double)(bench_now_ns() - t0) / 1e9;
}

static void row(const char *what, const char *from, const char *sz, size_t size, double t,
		double t_base)
{
	char name[96], res[64], base[64], ratio[32];

	snprintf(name, sizeof(name), "%s to %d readers, %s", what, READERS, from);
	if (t < 0 || t_base < 0) {
		bench_row(name, sz, "error", "-", "-");
		return;
	}
	snprintf(res, sizeof(res), "%.1f msg/s %.2f GB/s", iters / t,
		 (double)size * READERS * iters / t / 1e9);
	snprintf(base, sizeof(base), "%.1f msg/s %.2f GB/s", iters / t_base,
		 (double)size * READERS * iters / t_base / 1e9);
	snprintf(ratio, sizeof(ratio), "%.2fx", t_base / t);
	bench_row(name, sz, res, base, ratio);
}

/* The daemon's fan-out, the library's and one write per pipe, in alternating rounds (timings on
 * a shared machine drift: each mode sees the same stretches of it). */
static void run_case(struct tp_pipe_set *s, void *src, size_t size, const char *from)
{
	struct tp_payload pl = { .data = src, .length = size };
	struct tp_message m = { .payloads = &pl, .n_payloads = 1 };
	static const int modes[3] = { TP_FANOUT_DAEMON, TP_FANOUT_LIBRARY, -1 };
	unsigned rounds = iters >= 5 ? 5 : 1;
	double t[3] = { 0, 0, 0 };
	char sz[32];

	for (unsigned k = 0; k < rounds; k++)
		for (unsigned i = 0; i < 3; i++) {
			double x = t[i] < 0 ? -1 : time_mode(s, &m, modes[i], iters / rounds);
			t[i] = x < 0 ? -1 : t[i] + x;
		}
	iters = iters / rounds * rounds;
	bench_fmt_size(size, sz, sizeof(sz));
	row("daemon fan-out", from, sz, size, t[0], t[2]);
	row("library fan-out", from, sz, size, t[1], t[2]);
}

/* The server: listens, reports ready, waits for the readers, runs the cases. */
static int server_main(void *arg, int ready_fd)
{
	struct tp_context *ctx = NULL;
	struct tp_listener *l = NULL;
	struct tp_pipe_set *s = NULL;
	void *shm = NULL, *priv = malloc(BIG);
	int r;

	(void)arg;
	struct tp_listen_options lo = { .size = sizeof(lo), .remote = TP_REMOTE_ANY_PEER };

	r = bench_context_open(sock_path(), 0, &ctx);
	if (r == 0)
		r = tp_listen(ctx, "bench-fan", reader_addr ? &lo : NULL, &l);
	bench_ready_send(ready_fd, r);
	if (r == 0)
		r = tp_set_new(ctx, READERS, &s);
	if (r == 0)
		r = tp_set_wait_pipes(s, l, READERS, 20000);
	if (r == 0)
		r = tp_buffer_alloc(ctx, BIG, &shm);
	if (r < 0 || !priv) {
		fprintf(stderr, "bench_fan: set-up: %d %s\n", r, tp_last_error());
		return -EIO;
	}
	memset(shm, 0x5a, BIG);
	memset(priv, 0xa5, BIG);
	bench_table_header("server fan-out to 4 readers, by the daemon and by the library "
			   "(baseline: the same message written to each pipe one by one)");
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		run_case(s, shm, sizes[k], "shared buffer");
		run_case(s, priv, sizes[k], "private memory");
	}
	tp_set_free(s); /* closes the pipes: the readers end */
	tp_buffer_free(ctx, shm);
	free(priv);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

int main(int argc, char **argv)
{
	pid_t srv, pids[READERS] = { 0 };
	int opt, fd, r;

	while ((opt = getopt(argc, argv, "n:r:a:")) != -1) {
		if (opt == 'r') {
			reader_sock = optarg;
		} else if (opt == 'a') {
			reader_addr = optarg;
		} else if (opt != 'n' || atoi(optarg) <= 0) {
			fprintf(stderr,
				"usage: bench_fan [-n ITERS] [-r READER_SOCKET -a ADDRESS]\n");
			return 2;
		} else {
			iters = (unsigned)atoi(optarg);
		}
	}
	/* this process opens no context: every side is a child */
	if (bench_spawn(server_main, NULL, &srv, &fd) < 0)
		return 1;
	r = bench_ready_wait(fd, 10000);
	close(fd);
	for (unsigned i = 0; r == 0 && i < READERS; i++) {
		if (bench_spawn(reader_main, NULL, &pids[i], &fd) < 0)
			return 1;
		r = bench_ready_wait(fd, 10000);
		close(fd);
	}
	r = bench_reap(srv, "server") || r;
	for (unsigned i = 0; i < READERS; i++)
		if (pids[i] > 0)
			r = bench_reap(pids[i], "reader") || r;
	return r ? 1 : 0;
}
