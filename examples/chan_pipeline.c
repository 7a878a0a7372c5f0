/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tp-chan-pipeline: torch-ipc's channel example in C (docs/channels.md). The first process
 * creates channels "ex.in" and "ex.out" and forks a worker; the worker reads numbers from
 * "ex.in", squares them into "ex.out" and, when "ex.in" is closed and drained, closes "ex.out"
 * (the cascade). The first process writes 1..10 in two batches, closes "ex.in" and prints what
 * comes out until "ex.out" is drained.
 *
 * Across two hosts (docs/channels.md, "Across hosts"): on host B run
 *     tp-chan-pipeline --serve
 * which creates both channels for other hosts to open (TP_REMOTE_ANY_PEER), prints "ready" and
 * runs the worker; then on host A run
 *     tp-chan-pipeline --remote tpip://B[:PORT]
 * which opens tpip://B/ex.in and tpip://B/ex.out through its own daemon, writes the numbers and
 * an item of 4 MiB (it crosses over the peer link's data connections; the worker answers with
 * its checksum), closes, and prints what comes out. Both daemons must peer (tpipd(8),
 * --peer-listen, and a shared --peer-key-file). Add --owner UID on A when B runs as another uid.
 *
 * The daemon socket follows the library's rules ($TPIPD_SOCKET, ...).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tpclient.h"

#define BIG (4u << 20) /* the large item of --remote */

/* A sum of @p's @len bytes, each weighted by its place (a large item's answer). */
static long checksum(const uint8_t *p, size_t len)
{
	uint64_t s = 0;

	for (size_t i = 0; i < len; i++)
		s += (uint64_t)p[i] * (i % 251 + 1);
	return (long)(s & 0x7fffffffffffffff);
}

/* Reads numbers from "ex.in" and writes their squares (a larger item: its checksum) into
 * "ex.out" until "ex.in" is closed and drained, then closes "ex.out". @ctx: the caller's context
 * (NULL: one made and freed here). */
static int worker_run(struct tp_context *ctx)
{
	struct tp_context *own = NULL;
	struct tp_chan *in, *out;
	void *item;
	size_t len;
	int r;

	if (!ctx && tp_context_new(NULL, &own) == 0)
		ctx = own;
	if (!ctx || tp_chan_open(ctx, "ex.in", NULL, &in) < 0 ||
	    tp_chan_open(ctx, "ex.out", NULL, &out) < 0) {
		fprintf(stderr, "worker: %s\n", tp_last_error());
		return 1;
	}
	while ((r = tp_chan_read(in, &item, &len, -1)) >= 0) {
		long v = 0;
		struct iovec iov = { .iov_base = &v, .iov_len = sizeof(v) };

		if (len == sizeof(v))
			memcpy(&v, item, sizeof(v));
		v = len == sizeof(v) ? v * v : checksum(item, len);
		free(item);
		if (tp_chan_write(out, &iov, 1, -1) < 0)
			break;
	}
	tp_chan_close(out); /* the cascade: our reader sees "drained" after the last square */
	tp_chan_release(in);
	tp_chan_release(out);
	tp_context_free(own);
	return r == -EPIPE ? 0 : 1;
}

static int worker(void)
{
	return worker_run(NULL);
}

/* --serve: the channels for other hosts, and the worker, in this process. */
static int serve(void)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .remote = TP_REMOTE_ANY_PEER };
	struct tp_context *ctx;
	struct tp_chan *in, *out;
	int r;

	if (tp_context_new(NULL, &ctx) < 0 || tp_chan_open(ctx, "ex.in", &o, &in) < 0 ||
	    tp_chan_open(ctx, "ex.out", &o, &out) < 0) {
		fprintf(stderr, "cannot create the channels: %s\n", tp_last_error());
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	r = worker_run(ctx); /* its own handles; ours keep the channels until it is done */
	tp_chan_release(in);
	tp_chan_release(out);
	tp_context_free(ctx);
	return r;
}

/* --remote tpip://HOST[:PORT]: the numbers and one large item into HOST's channels. */
static int remote(const char *host, long owner)
{
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = owner };
	char in_name[300], out_name[300];
	struct tp_context *ctx;
	struct tp_chan *in, *out;
	struct iovec iov[5];
	long vals[5], want;
	uint8_t *big = NULL;
	void *item;
	size_t len;
	int r;

	snprintf(in_name, sizeof(in_name), "%s/ex.in", host);
	snprintf(out_name, sizeof(out_name), "%s/ex.out", host);
	if (tp_context_new(NULL, &ctx) < 0 || tp_chan_open(ctx, in_name, &o, &in) < 0 ||
	    tp_chan_open(ctx, out_name, &o, &out) < 0) {
		fprintf(stderr, "cannot open %s: %s\n", host, tp_last_error());
		return 1;
	}
	for (int i = 0; i < 5; i++) {
		vals[i] = i + 1;
		iov[i] = (struct iovec){ .iov_base = &vals[i], .iov_len = sizeof(long) };
	}
	/* The large item from a shared buffer: the daemons move it without a copy of ours. */
	if (tp_buffer_alloc(ctx, BIG, (void **)&big) < 0) {
		fprintf(stderr, "shared buffer: %s\n", tp_last_error());
		return 1;
	}
	for (size_t i = 0; i < BIG; i++)
		big[i] = (uint8_t)(i * 7 + 3);
	want = checksum(big, BIG);
	if (tp_chan_write(in, iov, 5, -1) < 0 ||
	    tp_chan_write(in, &(struct iovec){ .iov_base = big, .iov_len = BIG }, 1, -1) < 0)
		fprintf(stderr, "write: %s\n", tp_last_error());
	tp_chan_close(in);
	while ((r = tp_chan_read(out, &item, &len, 30000)) >= 0) {
		long v;

		memcpy(&v, item, sizeof(v));
		free(item);
		if (v == want)
			printf("checksum of %u bytes: %ld (as sent)%s", BIG, v,
			       r == TP_CHAN_CLOSED ? " (closed)\n" : "\n");
		else
			printf("%ld%s", v, r == TP_CHAN_CLOSED ? " (closed)\n" : "\n");
	}
	printf(r == -EPIPE ? "drained\n" : "error: %s\n", tp_last_error());
	tp_buffer_free(ctx, big);
	tp_chan_release(in);
	tp_chan_release(out);
	tp_context_free(ctx);
	return r == -EPIPE ? 0 : 1;
}

int main(int argc, char **argv)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *ctx;
	struct tp_chan *in, *out;
	struct iovec iov[5];
	long vals[10];
	void *item;
	size_t len;
	pid_t pid;
	int r, st;

	if (argc == 2 && strcmp(argv[1], "--serve") == 0)
		return serve();
	if ((argc == 3 || argc == 5) && strcmp(argv[1], "--remote") == 0 &&
	    (argc == 3 || strcmp(argv[3], "--owner") == 0))
		return remote(argv[2], argc == 5 ? strtol(argv[4], NULL, 10) : -1);
	if (argc != 1) {
		fprintf(stderr, "usage: %s [--serve | --remote tpip://HOST[:PORT] [--owner UID]]\n",
			argv[0]);
		return 2;
	}
	if (tp_context_new(NULL, &ctx) < 0 || tp_chan_open(ctx, "ex.in", &o, &in) < 0 ||
	    tp_chan_open(ctx, "ex.out", &o, &out) < 0) {
		fprintf(stderr, "cannot open the channels: %s\n", tp_last_error());
		return 1;
	}
	pid = fork(); /* before any other thread of ours matters: the child makes its own context */
	if (pid == 0)
		_exit(worker());
	for (int b = 0; b < 2; b++) {
		for (int i = 0; i < 5; i++) {
			vals[b * 5 + i] = b * 5 + i + 1;
			iov[i].iov_base = &vals[b * 5 + i];
			iov[i].iov_len = sizeof(long);
		}
		if (tp_chan_write(in, iov, 5, -1) < 0)
			fprintf(stderr, "write: %s\n", tp_last_error());
	}
	tp_chan_close(in);
	while ((r = tp_chan_read(out, &item, &len, 10000)) >= 0) {
		long v;

		memcpy(&v, item, sizeof(v));
		free(item);
		printf("%ld%s", v, r == TP_CHAN_CLOSED ? " (closed)\n" : "\n");
	}
	printf(r == -EPIPE ? "drained\n" : "error: %s\n", tp_last_error());
	waitpid(pid, &st, 0);
	tp_chan_release(in);
	tp_chan_release(out);
	tp_context_free(ctx);
	return r == -EPIPE && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
