/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tp-wq: torch-ipc's work queue example in C (docs/queues.md). The first process creates work
 * queue "ex.wq", submits the numbers 1..10 as questions and forks two workers; each worker takes
 * questions, answers each with its square and stops when the queue is closed. The owner drains
 * the queue (every question answered, taken ones included), closes it, prints each answer with
 * its question's id and waits for the workers.
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

#define N_WORKERS 2

static int worker(void)
{
	struct tp_context *ctx;
	struct tp_wq *q;
	uint64_t id;
	void *data;
	size_t len;
	int r;

	if (tp_context_new(NULL, &ctx) < 0 || tp_wq_open(ctx, "ex.wq", NULL, &q) < 0) {
		fprintf(stderr, "worker: %s\n", tp_last_error());
		return 1;
	}
	while ((r = tp_wq_take(q, &id, &data, &len, -1)) == 0) {
		long v = 0;

		if (len == sizeof(v))
			memcpy(&v, data, sizeof(v));
		free(data);
		v *= v;
		if (tp_wq_reply(q, id, &v, sizeof(v)) < 0) {
			fprintf(stderr, "worker: %s\n", tp_last_error());
			break;
		}
	}
	tp_wq_release(q);
	tp_context_free(ctx);
	return r == -EPIPE ? 0 : 1; /* -EPIPE: closed, nothing left */
}

int main(void)
{
	struct tp_wq_options o = { .size = sizeof(o), .flags = TP_WQ_CREATE, .owner_uid = -1 };
	struct tp_context *ctx;
	struct tp_wq *q;
	int status, fail = 0;
	uint64_t id;
	void *data;
	size_t len;

	if (tp_context_new(NULL, &ctx) < 0 || tp_wq_open(ctx, "ex.wq", &o, &q) < 0) {
		fprintf(stderr, "tp-wq: %s\n", tp_last_error());
		return 1;
	}
	for (long v = 1; v <= 10; v++)
		if (tp_wq_submit(q, &v, sizeof(v), &id) < 0)
			fail = fprintf(stderr, "submit: %s\n", tp_last_error());
	for (int i = 0; i < N_WORKERS; i++) {
		pid_t pid = fork(); /* before any backend: the library does not use CUDA here */

		if (pid == 0)
			_exit(worker());
	}
	if (tp_wq_drain(q, -1) < 0 || tp_wq_close(q) < 0)
		fail = fprintf(stderr, "drain: %s\n", tp_last_error());
	while (tp_wq_answer(q, &id, &data, &len, 0) == 0) {
		long v = 0;

		if (len == sizeof(v))
			memcpy(&v, data, sizeof(v));
		free(data);
		printf("question %llu: %ld\n", (unsigned long long)id, v);
	}
	while (wait(&status) > 0)
		fail |= !WIFEXITED(status) || WEXITSTATUS(status);
	tp_wq_release(q);
	tp_context_free(ctx);
	return fail ? 1 : 0;
}
