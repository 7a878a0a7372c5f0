/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_chanx: items per second and GB/s of large channel items across hosts (issue 25 part
 * xhost; docs/channels.md "Large items across hosts"). A reader on daemon B creates channel
 * "bx" (any peer may open it; capacity 4 items) and reads items with tp_chan_read_into(); a
 * writer process on daemon A opens tpip://B/bx and writes N items of SIZE bytes, from a shared
 * buffer (MEM "shm") or private memory ("priv"; the reader's allocation is the same kind). The
 * clock runs from the first item read to the last. Numbers, never pass/fail.
 *
 * Usage: bench_chanx SOCKET_A SOCKET_B tpip://B[:PORT] SIZE N shm|priv
 * (two daemons that peer: --peer-listen, a shared --peer-key-file; B with --chan-bytes-max of
 * at least 4 x SIZE). docs/benchmarks.md has a run.
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
		fprintf(stderr, "usage: %s SOCKET_A SOCKET_B tpip://B[:PORT] SIZE N shm|priv\n",
			argv[0]);
		return 2;
	}
	len = strtoul(argv[4], NULL, 0);
	n = atoi(argv[5]);
	shm = strcmp(argv[6], "shm") == 0;
	if (!len || n < 2)
		return 2;
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
