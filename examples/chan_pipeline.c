/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tp-chan-pipeline: torch-ipc's channel example in C (docs/channels.md). The first process
 * creates channels "ex.in" and "ex.out" and forks a worker; the worker reads numbers from
 * "ex.in", squares them into "ex.out" and, when "ex.in" is closed and drained, closes "ex.out"
 * (the cascade). The first process writes 1..10 in two batches, closes "ex.in" and prints what
 * comes out until "ex.out" is drained.
 *
 * The daemon socket follows the library's rules ($TPIPD_SOCKET, ...).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tpclient.h"

static int worker(void)
{
	struct tp_context *ctx;
	struct tp_chan *in, *out;
	void *item;
	size_t len;
	int r;

	if (tp_context_new(NULL, &ctx) < 0 || tp_chan_open(ctx, "ex.in", NULL, &in) < 0 ||
	    tp_chan_open(ctx, "ex.out", NULL, &out) < 0) {
		fprintf(stderr, "worker: %s\n", tp_last_error());
		return 1;
	}
	while ((r = tp_chan_read(in, &item, &len, -1)) >= 0) {
		long v = 0;
		struct iovec iov = { .iov_base = &v, .iov_len = sizeof(v) };

		if (len == sizeof(v))
			memcpy(&v, item, sizeof(v));
		free(item);
		v *= v;
		if (tp_chan_write(out, &iov, 1, -1) < 0)
			break;
	}
	tp_chan_close(out); /* the cascade: our reader sees "drained" after the last square */
	tp_chan_release(in);
	tp_chan_release(out);
	tp_context_free(ctx);
	return r == -EPIPE ? 0 : 1;
}

int main(void)
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
