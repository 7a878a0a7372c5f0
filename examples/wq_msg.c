/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tp-wq-msg: work queue questions and answers as messages (docs/queues.md, "Questions and
 * answers as messages"). The owner creates work queue "ex.wqmsg" and submits 4 questions, each
 * a message: metadata "scale=K" and one tensor of 1M float32 (4 MiB, above the inline limit of
 * byte payloads) in a shared buffer, which the daemon copies in once. Two workers in other
 * processes take each question by its descriptor, read the tensor into a shared buffer of their
 * own (the daemon's copy lands there directly), and answer with a message: metadata "sum" and
 * the scaled sum as one 8-byte payload. The owner drains the queue, closes it and prints every
 * answer with its question's id, reading each into its own memory.
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
#define N_FLOATS (1u << 20)

static int worker(void)
{
	struct tp_context *ctx;
	struct tp_descriptor *d;
	struct tp_wq *q;
	float *slot;
	uint64_t id;
	int r;

	if (tp_context_new(NULL, &ctx) < 0 || tp_wq_open(ctx, "ex.wqmsg", NULL, &q) < 0 ||
	    tp_buffer_alloc(ctx, N_FLOATS * sizeof(float), (void **)&slot) < 0) {
		fprintf(stderr, "worker: %s\n", tp_last_error());
		return 1;
	}
	while ((r = tp_wq_take_descriptor(q, &id, &d, -1)) == 0) {
		struct tp_slot s = { .device = { TP_DEVICE_CPU, 0 }, .data = slot };
		struct tp_allocation a = { .tensors = &s, .n_tensors = 1 };
		double sum = 0, k = 0;
		char meta[32] = "";

		if (d->n_tensors != 1 || d->tensors[0].length > N_FLOATS * sizeof(float) ||
		    d->n_payloads || d->metadata_len >= sizeof(meta)) {
			fprintf(stderr, "worker: question %llu is not one of ours\n",
				(unsigned long long)id);
			tp_wq_descriptor_free(d);
			break;
		}
		memcpy(meta, d->metadata, d->metadata_len);
		sscanf(meta, "scale=%lf", &k);
		size_t n = d->tensors[0].length / sizeof(float);

		if (tp_wq_read_msg(q, d, &a) < 0) { /* takes @d */
			fprintf(stderr, "worker: %s\n", tp_last_error());
			break;
		}
		for (size_t i = 0; i < n; i++)
			sum += slot[i];
		sum *= k;

		struct tp_payload p = { .data = &sum, .length = sizeof(sum) };
		struct tp_message m = { .metadata = "sum", .metadata_len = 3, .payloads = &p,
					.n_payloads = 1 };

		if (tp_wq_reply_msg(q, id, &m) < 0) {
			fprintf(stderr, "worker: %s\n", tp_last_error());
			break;
		}
	}
	tp_wq_release(q);
	tp_context_free(ctx);
	return r == -EPIPE ? 0 : 1; /* -EPIPE: closed, nothing left */
}

/* Receives every answer and prints it. Return: the number of failures. */
static int answers(struct tp_wq *q)
{
	struct tp_descriptor *d;
	int fail = 0;
	uint64_t id;

	while (tp_wq_answer_descriptor(q, &id, &d, 0) == 0) {
		double sum = 0;
		struct tp_slot s = { .device = { TP_DEVICE_CPU, 0 }, .data = &sum };
		struct tp_allocation a = { .payloads = &s, .n_payloads = 1 };

		if (d->n_payloads != 1 || d->payloads[0].length != sizeof(sum) || d->n_tensors) {
			tp_wq_descriptor_free(d);
			fail++;
			continue;
		}
		if (tp_wq_read_msg(q, d, &a) < 0)
			fail = fprintf(stderr, "answer: %s\n", tp_last_error());
		else
			printf("question %llu: %.0f\n", (unsigned long long)id, sum);
	}
	return fail;
}

int main(void)
{
	struct tp_wq_options o = { .size = sizeof(o), .flags = TP_WQ_CREATE, .owner_uid = -1 };
	struct tp_context *ctx;
	struct tp_wq *q;
	int status, fail = 0;
	float *x;
	uint64_t id;

	if (tp_context_new(NULL, &ctx) < 0 || tp_wq_open(ctx, "ex.wqmsg", &o, &q) < 0 ||
	    tp_buffer_alloc(ctx, N_FLOATS * sizeof(float), (void **)&x) < 0) {
		fprintf(stderr, "tp-wq-msg: %s\n", tp_last_error());
		return 1;
	}
	for (size_t i = 0; i < N_FLOATS; i++)
		x[i] = 1.0f;
	for (int k = 1; k <= 4; k++) {
		char meta[16];
		struct tp_tensor t = { .device = { TP_DEVICE_CPU, 0 }, .data = x,
				       .length = N_FLOATS * sizeof(float) };
		struct tp_message m = { .metadata = meta, .tensors = &t, .n_tensors = 1 };

		m.metadata_len = (size_t)snprintf(meta, sizeof(meta), "scale=%d", k);
		/* The daemon has copied the tensor when this returns: @x may change. */
		if (tp_wq_submit_msg(q, &m, &id) < 0)
			fail = fprintf(stderr, "submit: %s\n", tp_last_error());
	}
	for (int i = 0; i < N_WORKERS; i++) {
		pid_t pid = fork(); /* before any backend: the library does not use CUDA here */

		if (pid == 0)
			_exit(worker());
	}
	if (tp_wq_drain(q, -1) < 0 || tp_wq_close(q) < 0)
		fail = fprintf(stderr, "drain: %s\n", tp_last_error());
	fail |= answers(q);
	while (wait(&status) > 0)
		fail |= !WIFEXITED(status) || WEXITSTATUS(status);
	tp_wq_release(q);
	tp_context_free(ctx);
	return fail ? 1 : 0;
}
