/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mpt channel: tensors between hosts, cut into chunks striped over the N data connections of a
 * peer link (stripe.c runs the threads). It reads a shared buffer or a client's memory (CMA) on
 * the sending host and writes straight into the reader's allocation on the other. It never
 * serves a same-host pair, so it has no copy op. This file is its asynchronous op table (tpb.h):
 * a context per daemon with one completion queue, an endpoint per peer link over the link's
 * stripe (which the link owns: it adds the connections and frees it), start for a send (every
 * xfer's destination TPB_LOC_REMOTE) or a receive (every source TPB_LOC_REMOTE) named by the
 * op's xfer_id, cancel, and the event fd and progress call that deliver completions. A stripe
 * transfer ends on the loop thread (tpb_stripe_progress(), polled by the link's owner); its op
 * is then queued here and its done callback runs from this context's tpb_progress(). It does
 * not choose channels (registry.c) nor run threads (the stripe's). cuda_basic's row
 * (backends/cuda_basic/) names the same endpoint entries on a second head of this context
 * (tpb_mpt_cuda_basic_ctx()): its transfers are stripe transfers whose CUDA segments the stripe
 * threads stage. The client CUDA mappings of an op are busy from its start and go idle on the
 * CUDA layer's worker (closed there unless a session holds them) when the stripe ended it,
 * before its completion is delivered: the client is never told its transfer ended while the
 * daemon still maps the memory (it may free it at once; a close after that is a stale one).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include "../base/cq.h"
#include "log.h"
#include "mpt.h"
#include "stripe.h"

#define MPT_IDLE_WAIT_MS 10000 /* at exit, for the CUDA layer's worker to idle the ops' mappings */

struct mpt_ctx {
	struct tpb_ctx base;
	struct tpb_ctx cb_base; /* cuda_basic's head: its endpoints ride the same stripes */
	struct tpb_cq cq; /* ended ops waiting for progress (struct mpt_op.cq_node) */
	unsigned pending; /* started ops not yet delivered */
	unsigned idling;  /* of them, ended and waiting for their CUDA mappings to go idle */
};

struct mpt_ep {
	struct tpb_ep base;
	struct tpb_stripe *st;
	struct tpu_list ops; /* started, not yet delivered (struct mpt_op.ep_node) */
	bool closing;
	unsigned delivering; /* inside its ops' done callbacks (nested progress too): kept */
};

/* One started op: the stripe transfer that carries it. Loop thread only. */
struct mpt_op {
	struct tpb_stripe_xfer x;
	struct tpb_op *op;
	struct mpt_ep *ep;
	struct tpu_list ep_node;
	struct tpu_list cq_node;
	bool recv;
	bool ended; /* the stripe is done with it (its memory is no longer touched) */
	bool idling; /* its CUDA mappings are going idle: the worker pushes it onto @cq */
	struct tpb_cq *cq; /* its context's */
	struct tpb_cuda_map **maps; /* its client CUDA mappings (references), busy until ended */
	size_t n_maps;
	struct tpb_stripe_seg segs[];
};

static int mpt_probe(const struct tpb_config *cfg, char *why, size_t why_len)
{
	return 1; /* TCP is always there */
}

static struct mpt_ctx *ctx_of(struct tpb_ctx *c)
{
	if (c->ops == &tpb_cuda_basic_ops)
		return tpu_container_of(c, struct mpt_ctx, cb_base);
	return (struct mpt_ctx *)c;
}

struct tpb_ctx *tpb_mpt_cuda_basic_ctx(struct tpb_ctx *mpt)
{
	return mpt && mpt->ops == &tpb_mpt_ops ? &ctx_of(mpt)->cb_base : NULL;
}

static int mpt_ctx_new(const struct tpb_channel_ops *self, const struct tpb_config *cfg,
		       const struct tpb_engine *engine, struct tpb_ctx **ret)
{
	struct mpt_ctx *c = calloc(1, sizeof(*c));
	int r;

	if (!c)
		return -ENOMEM;
	c->base.ops = self;
	c->base.idx = tpb_index(self->name);
	c->cb_base.ops = &tpb_cuda_basic_ops;
	c->cb_base.idx = tpb_index(tpb_cuda_basic_ops.name);
	r = tpb_cq_init(&c->cq);
	if (r < 0) {
		free(c);
		return r;
	}
	*ret = &c->base;
	return 0;
}

static int mpt_progress(struct tpb_ctx *ctx);

static void mpt_ctx_free(struct tpb_ctx *ctx)
{
	struct mpt_ctx *c = ctx_of(ctx);

	/* Every endpoint is closed and every stripe it ran on is freed or done with its ops:
	 * whatever is still owed is queued here, or will be by the CUDA layer's worker once
	 * their mappings are idle (waited for, up to MPT_IDLE_WAIT_MS: the worker pushes onto
	 * @c->cq, so a context it still owes is left allocated rather than freed under it). */
	while (c->pending) {
		struct pollfd p = { .fd = tpb_cq_event_fd(&c->cq), .events = POLLIN };

		if (mpt_progress(ctx) > 0)
			continue;
		if (!c->idling || poll(&p, 1, MPT_IDLE_WAIT_MS) <= 0)
			break;
	}
	if (c->idling) {
		tpu_log_warn("mpt: %u transfers' CUDA mappings still closing at exit, "
			     "their context is left allocated", c->idling);
		return;
	}
	tpb_cq_done(&c->cq);
	free(c);
}

int tpb_mpt_ep_open(struct tpb_ctx *ctx, const struct tpb_peer *peer, struct tpb_ep **ret)
{
	struct mpt_ep *e;

	if (!peer || !peer->stripe)
		return -EOPNOTSUPP; /* another host only, over its link's data connections */
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->base.ctx = ctx;
	e->base.peer = peer;
	e->st = peer->stripe;
	tpu_list_init(&e->ops);
	*ret = &e->base;
	return 0;
}

/* Asks the stripe to stop @mo (a no-op once the stripe has ended it). */
static void op_stop(struct mpt_op *mo)
{
	if (mo->ended)
		return;
	if (mo->recv)
		tpb_stripe_recv_cancel(mo->ep->st, &mo->x);
	else
		tpb_stripe_send_cancel(mo->ep->st, &mo->x);
}

void tpb_mpt_ep_close(struct tpb_ep *ep)
{
	struct mpt_ep *e = (struct mpt_ep *)ep;
	struct mpt_op *mo;

	e->closing = true;
	if (tpu_list_empty(&e->ops) && !e->delivering) {
		free(e);
		return;
	}
	tpu_list_for_each(mo, &e->ops, ep_node)
		op_stop(mo);
}

/* The CUDA layer's worker made @arg's mappings idle: its op goes to its context's queue. */
static void op_on_idle(void *arg)
{
	struct mpt_op *mo = arg;

	tpb_cq_push(mo->cq, &mo->cq_node);
}

/* The stripe ended @x (loop thread, from tpb_stripe_progress() or tpb_stripe_free()): queue
 * its op for this context's progress, once its CUDA mappings are idle. */
static void op_on_stripe_done(struct tpb_stripe_xfer *x)
{
	struct mpt_op *mo = x->arg;
	struct tpb_op *op = mo->op;

	mo->ended = true;
	op->status = x->status;
	op->bytes = x->bytes;
	snprintf(op->why, sizeof(op->why), "%s", x->status < 0 ? x->why : "");
	if (!mo->n_maps) {
		tpb_cq_push(mo->cq, &mo->cq_node);
		return;
	}
	mo->idling = true;
	ctx_of(mo->ep->base.ctx)->idling++;
	tpb_cuda_maps_idle_then(mo->maps, mo->n_maps, op_on_idle, mo); /* the close may block */
}

/* Marks the client CUDA mappings of @mo's segments busy (taking references). Return: 0, -ENOMEM. */
static int op_busy(struct mpt_op *mo)
{
	size_t n = 0;

	for (size_t i = 0; i < mo->x.n_segs; i++)
		n += mo->segs[i].mem.loc == TPB_LOC_CUDA ? 2 : 0;
	if (!n)
		return 0;
	mo->maps = calloc(n, sizeof(*mo->maps));
	if (!mo->maps)
		return -ENOMEM;
	for (size_t i = 0; i < mo->x.n_segs; i++) {
		const struct tpb_mem *m = &mo->segs[i].mem;

		if (m->loc != TPB_LOC_CUDA || !mo->segs[i].len)
			continue;
		if (m->cuda)
			mo->maps[mo->n_maps++] = tpb_cuda_map_ref(m->cuda);
		if (m->event)
			mo->maps[mo->n_maps++] = tpb_cuda_map_ref(m->event);
	}
	tpb_cuda_maps_busy(mo->maps, mo->n_maps);
	return 0;
}

/* Drops @mo's references to its mappings (idle already, or never busy) and frees @mo. */
static void op_free(struct mpt_op *mo)
{
	for (size_t i = 0; i < mo->n_maps; i++)
		tpb_cuda_map_unref(mo->maps[i]);
	free(mo->maps);
	free(mo);
}

/* @op's direction: 1 receive, 0 send, -EINVAL for a mix or an xfer without a remote side. */
static int op_direction(const struct tpb_op *op)
{
	int dir = -1;

	for (size_t i = 0; i < op->n_xfers; i++) {
		const struct tpb_xfer *x = &op->xfers[i];
		bool recv = x->src.loc == TPB_LOC_REMOTE;

		if (recv == (x->dst.loc == TPB_LOC_REMOTE) || (dir >= 0 && dir != recv))
			return -EINVAL;
		dir = recv;
	}
	return dir < 0 ? 0 : dir; /* nothing to move: ends at once, later, either way */
}

int tpb_mpt_start(struct tpb_ep *ep, struct tpb_op *op)
{
	struct mpt_ep *e = (struct mpt_ep *)ep;
	int dir = op_direction(op), r;
	struct mpt_op *mo;

	if (e->closing)
		return -ESHUTDOWN;
	if (dir < 0)
		return dir;
	mo = calloc(1, sizeof(*mo) + op->n_xfers * sizeof(mo->segs[0]));
	if (!mo)
		return -ENOMEM;
	for (size_t i = 0; i < op->n_xfers; i++) {
		const struct tpb_xfer *x = &op->xfers[i];

		mo->segs[i].mem = dir ? x->dst : x->src;
		mo->segs[i].len = x->len;
	}
	mo->op = op;
	mo->ep = e;
	mo->recv = dir;
	mo->x.xfer_id = op->xfer_id;
	mo->x.segs = mo->segs;
	mo->x.n_segs = op->n_xfers;
	mo->x.done = op_on_stripe_done;
	mo->x.arg = mo;
	mo->cq = &ctx_of(ep->ctx)->cq;
	tpu_list_init(&mo->cq_node);
	r = op_busy(mo);
	if (r == 0)
		r = dir ? tpb_stripe_recv(e->st, &mo->x) : tpb_stripe_send(e->st, &mo->x);
	if (r < 0) {
		if (mo->n_maps) /* on the worker: one may be open, and the close may block */
			tpb_cuda_idle_put(tpb_cuda_maps_idle_bg(mo->maps, mo->n_maps));
		op_free(mo);
		return r;
	}
	op->ep = ep;
	op->canceled = false;
	op->status = 0;
	op->bytes = 0;
	op->why[0] = '\0';
	tpu_list_insert_tail(&e->ops, &mo->ep_node);
	ctx_of(ep->ctx)->pending++;
	return 0;
}

/* The started op @op of @e, or NULL. */
static struct mpt_op *op_find(struct mpt_ep *e, const struct tpb_op *op)
{
	struct mpt_op *mo;

	tpu_list_for_each(mo, &e->ops, ep_node)
		if (mo->op == op)
			return mo;
	return NULL;
}

int tpb_mpt_cancel(struct tpb_ep *ep, struct tpb_op *op)
{
	struct mpt_op *mo = op_find((struct mpt_ep *)ep, op);

	if (!mo || mo->ended)
		return -ENOENT; /* ended already: its outcome stands */
	op->canceled = true;
	op_stop(mo);
	return 0;
}

int tpb_mpt_recv_expect(struct tpb_ep *ep, struct tpb_op *op, uint64_t bytes, int status,
			const char *why)
{
	struct mpt_op *mo;

	if (ep->ctx->ops != &tpb_mpt_ops && ep->ctx->ops != &tpb_cuda_basic_ops)
		return -EOPNOTSUPP;
	mo = op_find((struct mpt_ep *)ep, op);
	if (!mo || !mo->recv)
		return -ENOENT;
	if (!mo->ended)
		tpb_stripe_recv_expect(mo->ep->st, &mo->x, bytes, status, why);
	return 0;
}

/* The pending receive @op of @ep (mpt or cuda_basic, which runs on mpt's stripe), or NULL. */
static struct mpt_op *recv_find(struct tpb_ep *ep, struct tpb_op *op)
{
	struct mpt_op *mo;

	if (ep->ctx->ops != &tpb_mpt_ops && ep->ctx->ops != &tpb_cuda_basic_ops)
		return NULL;
	mo = op_find((struct mpt_ep *)ep, op);
	return mo && mo->recv ? mo : NULL;
}

int tpb_mpt_recv_progress(struct tpb_ep *ep, struct tpb_op *op, uint64_t *ret_bytes)
{
	struct mpt_op *mo = recv_find(ep, op);

	if (!mo)
		return -ENOENT;
	*ret_bytes = tpb_stripe_recv_progress(&mo->x);
	return 0;
}

int tpb_mpt_recv_stalled(struct tpb_ep *ep, struct tpb_op *op, const char *why)
{
	struct mpt_op *mo = recv_find(ep, op);

	if (!mo)
		return -ENOENT;
	if (!mo->ended)
		tpb_stripe_recv_stalled(mo->ep->st, &mo->x, why);
	return 0;
}

static int mpt_event_fd(struct tpb_ctx *ctx)
{
	return tpb_cq_event_fd(&ctx_of(ctx)->cq);
}

static int mpt_progress(struct tpb_ctx *ctx)
{
	struct mpt_ctx *c = ctx_of(ctx);
	struct tpu_list *n;
	int ran = 0;

	tpb_cq_ack(&c->cq);
	while ((n = tpb_cq_pop(&c->cq))) {
		struct mpt_op *mo = tpu_container_of(n, struct mpt_op, cq_node);
		struct mpt_ep *e = mo->ep;
		struct tpb_op *op = mo->op;

		tpu_list_remove(&mo->ep_node);
		c->idling -= mo->idling;
		op_free(mo);
		c->pending--;
		e->delivering++;
		op->done(op); /* may start, cancel or close: @op is the caller's again */
		e->delivering--;
		ran++;
		if (e->closing && tpu_list_empty(&e->ops) && !e->delivering)
			free(e);
	}
	return ran;
}

const struct tpb_channel_ops tpb_mpt_ops = {
	.name = "mpt",
	.caps = TPB_CAP_HOST_MEM | TPB_CAP_CROSS_HOST | TPB_CAP_SRC_LOCAL | TPB_CAP_SRC_PROCESS | TPB_CAP_DST_LOCAL |
		TPB_CAP_DST_PROCESS,
	.probe = mpt_probe,
	.copy = NULL,
	.ctx_new = mpt_ctx_new,
	.ctx_free = mpt_ctx_free,
	.ep_open = tpb_mpt_ep_open,
	.ep_close = tpb_mpt_ep_close,
	.start = tpb_mpt_start,
	.cancel = tpb_mpt_cancel,
	.recv_expect = tpb_mpt_recv_expect,
	.recv_progress = tpb_mpt_recv_progress,
	.recv_stalled = tpb_mpt_recv_stalled,
	.event_fd = mpt_event_fd,
	.progress = mpt_progress,
};
