/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The asynchronous op table of a same-host channel (TPB_SYNC_OPS in tpb.h): the channel keeps
 * its synchronous kernel (its copy op) and this adapter gives it a context, endpoints to this
 * host only, start, cancel, an event fd and progress. start() hands the op to the engine the
 * daemon supplied (its copy threads, which run the kernel and call tpb_sync_engine_done()), or,
 * without one, runs the kernel at once; either way the completion is pushed under the context's
 * lock to its completion queue (cq.h), whose eventfd turns readable, and the op's done callback
 * runs later, from tpb_progress() on
 * the thread that calls it (the loop). It does not choose channels (registry.c), nor run
 * threads of its own (the engine's).
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../tpb.h"
#include "cq.h"

#define SYNC_BOUNCE_BYTES (256u << 10) /* process-to-process CMA without an engine */

/* An op of at most this many bytes, all of them in the daemon's own mappings, runs inside
 * start() even with an engine (sync_inline()). */
#define SYNC_INLINE_MAX (64u << 10)

enum op_state { OP_IDLE = 0, OP_RUNNING, OP_DONE };

struct sync_ctx {
	struct tpb_ctx base;
	struct tpb_engine engine;
	bool has_engine;
	struct tpb_cq cq;     /* completions waiting for progress */
	pthread_mutex_t lock; /* guards the fields below and the ops' @state */
	unsigned pending;     /* started ops not yet delivered */
	unsigned eps;
	struct tpb_scratch scratch; /* kernels run inside start() (no engine) */
};

struct sync_ep {
	struct tpb_ep base;
	struct tpb_op *pending; /* started, not delivered (loop thread only) */
	unsigned n_pending;
	bool closing;
	bool delivering; /* inside one of its ops' done callbacks: closing must not free it */
};

static struct sync_ctx *ctx_of(struct tpb_ctx *c)
{
	return (struct sync_ctx *)c;
}

int tpb_sync_ctx_new(const struct tpb_channel_ops *self, const struct tpb_config *cfg,
		     const struct tpb_engine *engine, struct tpb_ctx **ret)
{
	struct sync_ctx *c;
	int r;

	if (!self->copy)
		return -EOPNOTSUPP; /* nothing to run */
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->base.ops = self;
	c->base.idx = tpb_index(self->name);
	r = tpb_cq_init(&c->cq);
	if (r < 0) {
		free(c);
		return r;
	}
	pthread_mutex_init(&c->lock, NULL);
	if (engine) {
		c->engine = *engine;
		c->has_engine = true;
	}
	*ret = &c->base;
	return 0;
}

void tpb_sync_ctx_free(struct tpb_ctx *ctx)
{
	struct sync_ctx *c = ctx_of(ctx);

	/* Completions still owed run first: wait for the engine's kernels to finish. */
	for (;;) {
		struct pollfd pfd = { .fd = tpb_cq_event_fd(&c->cq), .events = POLLIN };
		unsigned pending;

		pthread_mutex_lock(&c->lock);
		pending = c->pending;
		pthread_mutex_unlock(&c->lock);
		if (!pending)
			break;
		if (tpb_sync_progress(ctx) == 0)
			(void)poll(&pfd, 1, -1);
	}
	tpb_cq_done(&c->cq);
	tpb_cuda_scratch_done(&c->scratch);
	free(c->scratch.bounce);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

int tpb_sync_ep_open(struct tpb_ctx *ctx, const struct tpb_peer *peer, struct tpb_ep **ret)
{
	struct sync_ep *e;

	if (peer)
		return -EOPNOTSUPP; /* a same-host channel reaches no other host */
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->base.ctx = ctx;
	ctx_of(ctx)->eps++;
	*ret = &e->base;
	return 0;
}

static void ep_free(struct sync_ep *e)
{
	ctx_of(e->base.ctx)->eps--;
	free(e);
}

void tpb_sync_ep_close(struct tpb_ep *ep)
{
	struct sync_ep *e = (struct sync_ep *)ep;
	struct sync_ctx *c = ctx_of(ep->ctx);

	e->closing = true;
	if (!e->n_pending && !e->delivering) {
		ep_free(e);
		return;
	}
	pthread_mutex_lock(&c->lock);
	for (struct tpb_op *op = e->pending; op; op = op->next_pending)
		op->canceled = true;
	pthread_mutex_unlock(&c->lock);
}

/* Runs @op's kernel on the calling thread (no engine). */
static void run_inline(struct sync_ctx *c, struct tpb_op *op)
{
	uint64_t bytes = 0;
	int r = 0;

	if (!c->scratch.bounce && (c->scratch.bounce = malloc(SYNC_BOUNCE_BYTES)))
		c->scratch.bounce_len = SYNC_BOUNCE_BYTES;
	c->scratch.why[0] = '\0';
	for (size_t i = 0; i < op->n_xfers && r == 0; i++) {
		r = c->base.ops->copy(&op->xfers[i], &c->scratch);
		bytes += r == 0 ? op->xfers[i].len : 0;
	}
	tpb_sync_engine_done(op, r, r == 0 ? bytes : 0, r < 0 ? c->scratch.why : NULL);
}

/*
 * Whether @op runs inside start() though the context has an engine: every transfer between
 * the daemon's own mappings (shared buffers: memcpy), at most SYNC_INLINE_MAX bytes in all. The
 * copy then costs less than the two hand-offs it spares (to a copy thread, and its completion
 * back to the loop), which on a loaded host are each a wake-up on another CPU. Never memory of
 * a process (CMA, which a client can make slow, e.g. with userfaultfd, and which would then
 * hold the loop) nor of a GPU.
 */
static bool sync_inline(const struct tpb_op *op)
{
	uint64_t bytes = 0;

	for (size_t i = 0; i < op->n_xfers; i++) {
		const struct tpb_xfer *x = &op->xfers[i];

		if (x->src.loc != TPB_LOC_LOCAL || x->dst.loc != TPB_LOC_LOCAL)
			return false;
		bytes += x->len;
		if (bytes > SYNC_INLINE_MAX)
			return false;
	}
	return op->n_xfers > 0;
}

int tpb_sync_start(struct tpb_ep *ep, struct tpb_op *op)
{
	struct sync_ep *e = (struct sync_ep *)ep;
	struct sync_ctx *c = ctx_of(ep->ctx);
	int r;

	if (e->closing)
		return -ESHUTDOWN;
	op->ep = ep;
	op->state = OP_RUNNING;
	op->canceled = false;
	op->status = 0;
	op->bytes = 0;
	op->why[0] = '\0';
	tpu_list_init(&op->cq_node);
	pthread_mutex_lock(&c->lock);
	c->pending++;
	pthread_mutex_unlock(&c->lock);
	op->next_pending = e->pending;
	e->pending = op;
	e->n_pending++;
	if (!c->has_engine || sync_inline(op)) {
		run_inline(c, op);
		return 0;
	}
	r = c->engine.submit(c->engine.arg, c->base.idx, op);
	if (r < 0) { /* not taken: undo, no callback */
		e->pending = op->next_pending;
		e->n_pending--;
		pthread_mutex_lock(&c->lock);
		c->pending--;
		op->state = OP_IDLE;
		pthread_mutex_unlock(&c->lock);
	}
	return r;
}

int tpb_sync_cancel(struct tpb_ep *ep, struct tpb_op *op)
{
	struct sync_ctx *c = ctx_of(ep->ctx);
	int r = -ENOENT;

	pthread_mutex_lock(&c->lock);
	if (op->ep == ep && op->state != OP_IDLE) {
		op->canceled = true; /* reported once the kernel has let go of the memory */
		r = 0;
	}
	pthread_mutex_unlock(&c->lock);
	return r;
}

void tpb_sync_engine_done(struct tpb_op *op, int status, uint64_t bytes, const char *why)
{
	struct sync_ctx *c = ctx_of(op->ep->ctx);

	pthread_mutex_lock(&c->lock);
	op->status = status;
	op->bytes = status == 0 ? bytes : 0;
	snprintf(op->why, sizeof(op->why), "%s", why && status < 0 ? why : "");
	op->state = OP_DONE;
	tpb_cq_push(&c->cq, &op->cq_node);
	pthread_mutex_unlock(&c->lock);
}

int tpb_sync_event_fd(struct tpb_ctx *ctx)
{
	return tpb_cq_event_fd(&ctx_of(ctx)->cq);
}

/* Unlinks @op from its endpoint's started list (loop thread). */
static void ep_unlink(struct sync_ep *e, struct tpb_op *op)
{
	for (struct tpb_op **pp = &e->pending; *pp; pp = &(*pp)->next_pending) {
		if (*pp == op) {
			*pp = op->next_pending;
			e->n_pending--;
			return;
		}
	}
}

int tpb_sync_progress(struct tpb_ctx *ctx)
{
	struct sync_ctx *c = ctx_of(ctx);
	struct tpu_list batch, *node;
	struct tpb_op *op;
	int n = 0;

	/* Deliver what is queued now; what a callback starts waits for the next call. */
	tpb_cq_ack(&c->cq);
	tpu_list_init(&batch);
	pthread_mutex_lock(&c->lock);
	while ((node = tpb_cq_pop(&c->cq)))
		tpu_list_insert_tail(&batch, node);
	tpu_list_for_each(op, &batch, cq_node) {
		op->state = OP_IDLE;
		c->pending--;
		if (op->canceled) {
			op->status = -ECANCELED;
			op->bytes = 0;
		}
	}
	pthread_mutex_unlock(&c->lock);
	while ((op = tpu_list_first(&batch, struct tpb_op, cq_node))) {
		struct sync_ep *e = (struct sync_ep *)op->ep;

		tpu_list_remove(&op->cq_node);
		ep_unlink(e, op);
		e->delivering = true;
		op->done(op); /* may start, cancel or close: @op is the caller's again */
		e->delivering = false;
		n++;
		if (e->closing && !e->n_pending)
			ep_free(e);
	}
	return n;
}
