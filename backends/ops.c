/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The dispatch wrappers of the channel op table (tpb.h): every caller goes through them, and a
 * channel that lacks an op gets -EOPNOTSUPP here instead of a NULL call, as rdma-core's
 * provider wrappers do. They hold no state; contexts and endpoints carry their op table.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include "tpb.h"

int tpb_ctx_new(int idx, const struct tpb_config *cfg, const struct tpb_engine *engine,
		struct tpb_ctx **ret)
{
	size_t n;
	const struct tpb_channel_info *ch = tpb_registry_list(&n);

	if (idx < 0 || (size_t)idx >= n || !ch[idx].ops->ctx_new)
		return -EOPNOTSUPP;
	if (!ch[idx].viable)
		return -ENODEV;
	return ch[idx].ops->ctx_new(ch[idx].ops, cfg, engine, ret);
}

void tpb_ctx_free(struct tpb_ctx *ctx)
{
	if (ctx && ctx->ops->ctx_free)
		ctx->ops->ctx_free(ctx);
}

int tpb_ep_open(struct tpb_ctx *ctx, const struct tpb_peer *peer, struct tpb_ep **ret)
{
	return ctx->ops->ep_open ? ctx->ops->ep_open(ctx, peer, ret) : -EOPNOTSUPP;
}

void tpb_ep_close(struct tpb_ep *ep)
{
	if (ep && ep->ctx->ops->ep_close)
		ep->ctx->ops->ep_close(ep);
}

int tpb_prepare(struct tpb_ep *ep, struct tpb_op *op, void *offer, size_t *offer_len)
{
	const struct tpb_channel_ops *o = ep->ctx->ops;

	if (!o->prepare)
		return -EOPNOTSUPP;
	op->channel = ep->ctx->idx;
	return o->prepare(ep, op, offer, offer_len);
}

size_t tpb_offer_max(struct tpb_ep *ep, size_t n_xfers)
{
	const struct tpb_channel_ops *o = ep->ctx->ops;

	return o->offer_max ? o->offer_max(n_xfers) : 0;
}

int tpb_ep_query(struct tpb_ep *ep, struct tpb_ep_info *ret)
{
	const struct tpb_channel_ops *o = ep->ctx->ops;

	return o->ep_query ? o->ep_query(ep, ret) : -EOPNOTSUPP;
}

int tpb_ep_msg(struct tpb_ep *ep, const void *msg)
{
	const struct tpb_channel_ops *o = ep->ctx->ops;

	return o->ep_msg ? o->ep_msg(ep, msg) : -EOPNOTSUPP;
}

void tpb_release(struct tpb_op *op)
{
	const struct tpb_channel_ops *o = op->prep_ops;

	if (o && o->release)
		o->release(op);
	op->prep_ops = NULL;
	op->prep = NULL;
}

int tpb_start(struct tpb_ep *ep, struct tpb_op *op)
{
	const struct tpb_channel_ops *o = ep->ctx->ops;

	if (!o->start)
		return -EOPNOTSUPP;
	if (!op->done)
		return -EINVAL;
	if (op->offer && op->offer_len > tpb_offer_max(ep, op->n_xfers)) {
		snprintf(op->why, sizeof(op->why), "offer of %zu bytes, more than %s takes for %zu "
			 "transfers (%zu)", op->offer_len, o->name, op->n_xfers,
			 tpb_offer_max(ep, op->n_xfers));
		return -EPROTO;
	}
	op->channel = ep->ctx->idx;
	return o->start(ep, op);
}

int tpb_recv_expect(struct tpb_ep *ep, struct tpb_op *op, uint64_t bytes, int status,
		    const char *why)
{
	const struct tpb_channel_ops *o = ep->ctx->ops;

	return o->recv_expect ? o->recv_expect(ep, op, bytes, status, why) : -EOPNOTSUPP;
}

int tpb_recv_progress(struct tpb_ep *ep, struct tpb_op *op, uint64_t *ret_bytes)
{
	const struct tpb_channel_ops *o = ep->ctx->ops;

	return o->recv_progress ? o->recv_progress(ep, op, ret_bytes) : -EOPNOTSUPP;
}

int tpb_recv_stalled(struct tpb_ep *ep, struct tpb_op *op, const char *why)
{
	const struct tpb_channel_ops *o = ep->ctx->ops;

	return o->recv_stalled ? o->recv_stalled(ep, op, why) : -EOPNOTSUPP;
}

int tpb_cancel(struct tpb_ep *ep, struct tpb_op *op)
{
	const struct tpb_channel_ops *o = ep->ctx->ops;

	return o->cancel ? o->cancel(ep, op) : -EOPNOTSUPP;
}

int tpb_forget(struct tpb_ctx *ctx, const struct tpb_mem *m, uint64_t len)
{
	return ctx->ops->forget ? ctx->ops->forget(ctx, m, len) : -EOPNOTSUPP;
}

int tpb_event_fd(struct tpb_ctx *ctx)
{
	return ctx->ops->event_fd ? ctx->ops->event_fd(ctx) : -EOPNOTSUPP;
}

int tpb_progress(struct tpb_ctx *ctx)
{
	return ctx->ops->progress ? ctx->ops->progress(ctx) : -EOPNOTSUPP;
}
