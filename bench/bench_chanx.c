/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_chanx: items per second and GB/s of large channel items across hosts (issue 25 part
 * xhost; docs/channels.md "Large items across hosts"). A reader on daemon B creates channel
 * "bx" (any peer may open it; capacity 4 items) and reads items with tp_chan_read_into(); a
 * writer process on daemon A opens tpip://B/bx and writes N items of SIZE bytes, from a shared
 * buffer (MEM "shm") or private memory ("priv"; the reader's allocation is the same kind). The
 * clock runs from the first item read to the last. Numbers, never pass/fail.
 *
 * Usage: bench_chanx SOCKET_A SOCKET_B tpip://B[:PORT] SIZE N shm|priv|pack
 * (two daemons that peer: --peer-listen, a shared --peer-key-file; B with --chan-bytes-max of
 * at least 4 x SIZE). docs/benchmarks.md has a run.
 *
 * "pack": the other way round, for items that ride inline: a writer on B writes private items
 * into "bx" (capacity 256 items) in batches of up to 64 (1 MiB at most), and a reader on A
 * opens tpip://B/bx and reads them with tp_chan_read_many_into() (up to 64 an answer, packed
 * into a private buffer of 1 MiB): several items a peer round trip where both daemons take
 * packed reads across hosts, one an answer before.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tpclient.h"

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static struct tp_context *ctx_at(const char *sock)
{
	struct tp_context_options co = { .size = sizeof(co), .socket_path = sock };
	struct tp_context *ctx = NULL;

	if (tp_context_new(&co, &ctx) < 0) {
		fprintf(stderr, "%s: %s\n", sock, tp_last_error());
		exit(1);
	}
	return ctx;
}

static void *mem(struct tp_context *ctx, size_t len, bool shm)
{
	void *p = NULL;

	if (shm ? tp_buffer_alloc(ctx, len, &p) < 0 : !(p = malloc(len))) {
		fprintf(stderr, "no memory for %zu bytes: %s\n", len, tp_last_error());
		exit(1);
	}
	return p;
}

static int writer(const char *sock, const char *addr, size_t len, int n, bool shm)
{
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = (long)getuid() };
	struct tp_context *ctx = ctx_at(sock);
	char name[300];
	struct tp_chan *ch;
	void *buf;

	snprintf(name, sizeof(name), "%s/bx", addr);
	if (tp_chan_open(ctx, name, &o, &ch) < 0) {
		fprintf(stderr, "open %s: %s\n", name, tp_last_error());
		return 1;
	}
	buf = mem(ctx, len, shm);
	memset(buf, 7, len);
	for (int i = 0; i < n; i++) {
		struct iovec it = { buf, len };

		if (tp_chan_write(ch, &it, 1, -1) < 0) {
			fprintf(stderr, "write: %s\n", tp_last_error());
			return 1;
		}
	}
	tp_chan_release(ch);
	tp_context_free(ctx);
	return 0;
}

/* "pack": a writer of @n items of @len on B (socket @sock), batches of up to 64 within 1 MiB. */
static int writer_local(const char *sock, size_t len, int n)
{
	struct tp_context *ctx = ctx_at(sock);
	size_t batch = len >= (1u << 20) ? 1 : (1u << 20) / len < 64 ? (1u << 20) / len : 64;
	struct iovec it[64];
	struct tp_chan *ch;
	void *buf = mem(ctx, len, false);

	if (tp_chan_open(ctx, "bx", NULL, &ch) < 0) {
		fprintf(stderr, "open bx: %s\n", tp_last_error());
		return 1;
	}
	memset(buf, 7, len);
	for (size_t i = 0; i < batch; i++)
		it[i] = (struct iovec){ buf, len };
	for (int i = 0; i < n; i += (int)batch) {
		size_t k = (size_t)(n - i) < batch ? (size_t)(n - i) : batch;

		if (tp_chan_write(ch, it, k, -1) < 0) {
			fprintf(stderr, "write: %s\n", tp_last_error());
			return 1;
		}
	}
	tp_chan_release(ch);
	tp_context_free(ctx);
	return 0;
}

/* "pack": @n items of @len written on B (@sock_b), read from A (@sock_a) through @addr/bx with
 * tp_chan_read_many_into(). Return: the exit status. */
static int run_pack(const char *sock_a, const char *sock_b, const char *addr, size_t len, int n)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .remote = TP_REMOTE_ANY_PEER, .capacity_items = 256 };
	struct tp_context *cb = ctx_at(sock_b), *ca;
	struct tp_chan *hold, *ch;
	struct tp_chan_item items[64];
	size_t room = 1u << 20, k, first = 0;
	unsigned calls = 0;
	double t0 = 0, dt;
	char name[300];
	void *dst;
	pid_t pid;
	int st;

	if (tp_chan_open(cb, "bx", &o, &hold) < 0) {
		fprintf(stderr, "create bx: %s\n", tp_last_error());
		return 1;
	}
	ca = ctx_at(sock_a);
	snprintf(name, sizeof(name), "%s/bx", addr);
	if (tp_chan_open(ca, name, NULL, &ch) < 0) {
		fprintf(stderr, "open %s: %s\n", name, tp_last_error());
		return 1;
	}
	pid = fork();
	if (pid == 0)
		_exit(writer_local(sock_b, len, n));
	dst = mem(ca, room, false);
	for (int i = 0; i < n; i += (int)k, calls++) {
		if (tp_chan_read_many_into(ch, dst, room, items, 64, &k, -1) < 0) {
			fprintf(stderr, "read: %s\n", tp_last_error());
			return 1;
		}
		if (calls == 0) { /* the clock runs from the first answer */
			t0 = now_s();
			first = k;
		}
	}
	dt = now_s() - t0;
	n -= (int)first;
	waitpid(pid, &st, 0);
	printf("%zu bytes x %d (pack): %.1f items/s %.3f GB/s, %.1f items a read\n", len, n,
	       n / dt, (double)len * n / dt / 1e9, calls > 1 ? (double)n / (calls - 1) : 0.0);
	tp_chan_release(ch);
	tp_chan_release(hold);
	tp_context_free(ca);
	tp_context_free(cb);
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .remote = TP_REMOTE_ANY_PEER };
	struct tp_context *ctx;
	struct tp_chan *ch;
	double t0 = 0, dt;
	size_t len, got;
	int n, st;
	bool shm;
	void *dst;
	pid_t pid;

	if (argc != 7) {
		fprintf(stderr, "usage: %s SOCKET_A SOCKET_B tpip://B[:PORT] SIZE N "
			"shm|priv|pack\n", argv[0]);
		return 2;
	}
	len = strtoul(argv[4], NULL, 0);
	n = atoi(argv[5]);
	shm = strcmp(argv[6], "shm") == 0;
	if (!len || n < 2)
		return 2;
	if (strcmp(argv[6], "pack") == 0)
		return len > (1u << 20) ? 2 : run_pack(argv[1], argv[2], argv[3], len, n);
	o.capacity_bytes = 4 * len;
	ctx = ctx_at(argv[2]);
	if (tp_chan_open(ctx, "bx", &o, &ch) < 0) {
		fprintf(stderr, "create bx: %s\n", tp_last_error());
		return 1;
	}
	pid = fork();
	if (pid == 0)
		_exit(writer(argv[1], argv[3], len, n, shm));
	dst = mem(ctx, len, shm);
	for (int i = 0; i < n; i++) {
		if (tp_chan_read_into(ch, dst, len, &got, -1) < 0) {
			fprintf(stderr, "read: %s\n", tp_last_error());
			return 1;
		}
		if (i == 0)
			t0 = now_s();
	}
	dt = now_s() - t0;
	waitpid(pid, &st, 0);
	printf("%zu bytes x %d (%s): %.1f items/s %.2f GB/s\n", len, n - 1, shm ? "shm" : "priv",
	       (n - 1) / dt, (double)len * (n - 1) / dt / 1e9);
	tp_chan_release(ch);
	tp_context_free(ctx);
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
