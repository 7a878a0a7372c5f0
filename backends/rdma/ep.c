/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A peer link's RDMA state as an endpoint of the channel op table (tpb.h): tpb_start() on it
 * RDMA-writes an op's sources into the regions of the reader's offer, carried as bytes
 * (tpb_rdma_offer_encode() writes them), through tpb_rdma_send(); tpb_cancel() stops it; the
 * completion comes back as the op's done callback from tpb_progress(). On the reading side
 * tpb_prepare() registers an op's destination (tpb_rdma_recv_new()) and completes, once the
 * reader's CUDA events fired, with the encoded offer; tpb_release() deregisters it; a receive
 * started on it (every source remote) waits for the sender's word (tpb_recv_expect()), counts
 * the bytes received, and completes. tpb_ep_open() with the link's callbacks starts the link's
 * set-up (tpb_ep_msg() takes the peer's steps, tpb_ep_query() says how far it got) and
 * tpb_ep_close() ends it. The set-up and the writes themselves are link.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tpconfig.h"
#include "rdma_int.h"
#include "tpb.h"

#if HAVE_RDMA

/* A send started by tpb_start(): the op, and what tpb_rdma_send() borrows until it ends. */
struct op_send {
	struct tpu_list node; /* in the link's op_sends */
	struct tpb_op *op;
	struct tpb_rdma_xfer x;
	struct tpb_rdma_seg *segs;
	struct tpb_rdma_region *regions;
};

struct tpb_ep *tpb_rdma_link_ep(struct tpb_rdma_link *l)
{
	return l ? &l->ep : NULL;
}

static struct tpb_rdma_link *link_of(struct tpb_ep *ep)
{
	if (ep->ctx->ops == &tpb_cuda_gdr_ops)
		return tpu_container_of(ep, struct tpb_rdma_link, gdr_ep);
	return tpu_container_of(ep, struct tpb_rdma_link, ep);
}

/* @l's endpoint on @ctx: rdma's or cuda_gdr's head of the same context. */
static struct tpb_ep *ep_on(struct tpb_rdma_link *l, const struct tpb_ctx *ctx)
{
	return ctx == &l->g->gdr_base ? &l->gdr_ep : &l->ep;
}

/* The TPB_RDMA_* bits of the channel names @peer offers. */
static unsigned peer_offers(const struct tpb_peer *peer)
{
	unsigned bits = 0;

	for (size_t i = 0; i < peer->n_offers; i++) {
		if (strcmp(peer->offers[i], "rdma") == 0)
			bits |= TPB_RDMA_HOST;
		else if (strcmp(peer->offers[i], "cuda_gdr") == 0)
			bits |= TPB_RDMA_CUDA;
	}
	return bits;
}

int tpb_rdma_ep_open(struct tpb_ctx *ctx, const struct tpb_peer *peer, struct tpb_ep **ret)
{
	struct tpb_rdma *g = tpb_rdma_of(ctx);
	struct tpb_rdma_link *l;

	if (!g || !peer)
		return -EOPNOTSUPP; /* between hosts only */
	tpu_list_for_each(l, &g->links, node) {
		if (l->link == peer->link) {
			l->ep_refs += l->ep_owned;
			*ret = ep_on(l, ctx);
			return 0;
		}
	}
	if (!peer->link_ops)
		return -EOPNOTSUPP; /* the two daemons set up no RDMA on this link */
	/* The links of one context share their callbacks: the first endpoint's become the
	 * context's (unless its configuration brought some). */
	if (!g->cfg.link_ops)
		g->cfg.link_ops = peer->link_ops;
	else if (g->cfg.link_ops != peer->link_ops)
		return -EINVAL;
	l = tpb_rdma_link_new(g, peer->link, peer_offers(peer));
	if (!l)
		return -EOPNOTSUPP; /* nothing offered in common (or out of memory) */
	l->ep_owned = true;
	l->ep_refs = 1;
	*ret = ep_on(l, ctx);
	return 0;
}

void tpb_rdma_ep_close(struct tpb_ep *ep)
{
	struct tpb_rdma_link *l = link_of(ep);

	/* A link tpb_rdma_link_new() made is its caller's: tpb_rdma_link_free(). */
	if (l->ep_owned && --l->ep_refs == 0)
		tpb_rdma_link_free(l);
}

int tpb_rdma_ep_query(struct tpb_ep *ep, struct tpb_ep_info *ret)
{
	struct tpb_rdma_link *l = link_of(ep);

	ret->ready = tpb_rdma_link_ready(l);
	ret->state = tpb_rdma_link_state(l);
	tpb_rdma_link_bytes(l, &ret->sent, &ret->received);
	ret->reg_client_dmabuf = l->reg_by[RDMA_REG_CLIENT_DMABUF];
	ret->reg_dmabuf = l->reg_by[RDMA_REG_DMABUF];
	ret->reg_addr = l->reg_by[RDMA_REG_ADDR];
	return 0;
}

int tpb_rdma_ep_msg(struct tpb_ep *ep, const void *msg)
{
	tpb_rdma_link_on_msg(link_of(ep), msg);
	return 0;
}

/* A receive started by tpb_start() (every source remote): it waits for the sender's word
 * (tpb_recv_expect()), a cancel or the link's end, then completes from tpb_progress(). */
struct op_wait {
	struct tpu_list node; /* in the link's op_recvs */
	struct tpb_op *op;
	struct rdma_timer timer; /* armed once it ended: delivers the completion */
	uint64_t total;		 /* the bytes of its xfers */
	bool ended;
	struct tpb_cuda_idle *idle; /* the reader's mappings going idle: delivered after */
	struct tpb_rdma *g;
};

static void op_wait_deliver(struct rdma_timer *t)
{
	struct op_wait *ow = tpu_container_of(t, struct op_wait, timer);
	struct tpb_op *op = ow->op;

	tpb_cuda_idle_put(ow->idle);
	tpu_list_remove(&ow->node);
	free(ow);
	op->done(op); /* @op is its owner's again */
}

/* Delivers @ow once the reader's mappings went idle (polled). */
static void op_wait_on_timer(struct rdma_timer *t)
{
	struct op_wait *ow = tpu_container_of(t, struct op_wait, timer);

	if (!tpb_cuda_idle_done(ow->idle)) {
		tpb_rdma_timer_in_us(ow->g, &ow->timer, 50);
		return;
	}
	op_wait_deliver(t);
}

/* @ow ends with @status (@why: NULL or its reason), delivered from the next progress. */
static void op_wait_end(struct tpb_rdma_link *l, struct op_wait *ow, int status, uint64_t bytes,
			const char *why)
{
	struct tpb_op *op = ow->op;

	ow->ended = true;
	op->status = status;
	op->bytes = status == 0 ? bytes : 0;
	snprintf(op->why, sizeof(op->why), "%s", status < 0 && why ? why : "");
	tpb_rdma_timer_in_us(l->g, &ow->timer, 0);
}

static int recv_start(struct tpb_rdma_link *l, struct tpb_ep *ep, struct tpb_op *op)
{
	struct op_wait *ow = calloc(1, sizeof(*ow));

	if (!ow)
		return -ENOMEM;
	ow->op = op;
	ow->g = l->g;
	ow->timer.fn = op_wait_on_timer;
	for (size_t i = 0; i < op->n_xfers; i++)
		ow->total += op->xfers[i].len;
	op->ep = ep;
	op->status = 0;
	op->bytes = 0;
	op->canceled = false;
	tpu_list_insert_tail(&l->op_recvs, &ow->node);
	return 0;
}

/* The writes into the offer of @op->prepared completed: GPU-bound ones made visible to the
 * reader's GPU work before the receive ends (tpb_rdma_recv_flush()). */
static int prepared_flush(const struct tpb_op *op, char *why, size_t wl);

/* The receive into @op->prepared ended: tpb_rdma_recv_end() of its registration. */
static struct tpb_cuda_idle *prepared_end(const struct tpb_op *op);

static struct op_wait *recv_find(struct tpb_rdma_link *l, const struct tpb_op *op)
{
	struct op_wait *ow;

	tpu_list_for_each(ow, &l->op_recvs, node)
		if (ow->op == op && !ow->ended)
			return ow;
	return NULL;
}

int tpb_rdma_ep_recv_expect(struct tpb_ep *ep, struct tpb_op *op, uint64_t bytes, int status,
			    const char *why)
{
	struct tpb_rdma_link *l = link_of(ep);
	struct op_wait *ow = recv_find(l, op);
	char msg[160];

	if (!ow)
		return -ENOENT;
	if (status == 0 && bytes != ow->total) {
		snprintf(msg, sizeof(msg), "peer RDMA-wrote %llu of %llu bytes",
			 (unsigned long long)bytes, (unsigned long long)ow->total);
		status = -EPROTO;
		why = msg;
	}
	if (status == 0) {
		int r = prepared_flush(op, msg, sizeof(msg));

		if (r < 0) {
			status = r;
			why = msg;
		}
	}
	if (status == 0)
		tpb_rdma_link_received(l, bytes);
	/* its registration goes, and the reader's mappings go idle before the reader is told */
	ow->idle = prepared_end(op);
	op_wait_end(l, ow, status, bytes, why);
	return 0;
}

void tpb_rdma_ep_flush(struct tpb_rdma_link *l)
{
	while (!tpu_list_empty(&l->op_recvs)) {
		struct op_wait *ow = tpu_container_of(l->op_recvs.next, struct op_wait, node);

		if (!ow->ended)
			op_wait_end(l, ow, -ECONNRESET, 0, "peer link closed");
		tpb_rdma_timer_stop(&ow->timer);
		op_wait_deliver(&ow->timer);
	}
}

size_t tpb_rdma_offer_max(size_t n_xfers)
{
	return tpb_rdma_offer_size(n_xfers);
}

/* Was CUDA memory, with bytes, on this side of @op (the sources, or the destinations)? */
static bool op_local_cuda(const struct tpb_op *op, bool dst)
{
	for (size_t i = 0; i < op->n_xfers; i++)
		if (op->xfers[i].len && (dst ? op->xfers[i].dst : op->xfers[i].src).loc ==
						TPB_LOC_CUDA)
			return true;
	return false;
}

static void op_send_free(struct op_send *os)
{
	free(os->segs);
	free(os->regions);
	free(os);
}

static void op_send_done(struct tpb_rdma_xfer *x)
{
	struct op_send *os = x->arg;
	struct tpb_op *op = os->op;

	tpu_list_remove(&os->node);
	op->status = x->status;
	op->bytes = x->status == 0 ? x->bytes : 0;
	snprintf(op->why, sizeof(op->why), "%s", x->status < 0 ? x->why : "");
	op->canceled = false;
	op_send_free(os);
	op->done(op); /* @op is its owner's again */
}

int tpb_rdma_ep_start(struct tpb_ep *ep, struct tpb_op *op)
{
	struct tpb_rdma_link *l = link_of(ep);
	struct op_send *os;
	struct tpb_rdma_offer of;
	bool recv = !op->offer && op->n_xfers;
	int r;

	op->why[0] = '\0';
	for (size_t i = 0; i < op->n_xfers; i++)
		recv &= op->xfers[i].src.loc == TPB_LOC_REMOTE;
	if (recv)
		return recv_start(l, ep, op);
	os = calloc(1, sizeof(*os));
	if (!os)
		return -ENOMEM;
	os->op = op;
	os->segs = calloc(op->n_xfers ? op->n_xfers : 1, sizeof(*os->segs));
	r = os->segs ? tpb_rdma_offer_decode(op->offer, op->offer_len, &os->regions, &of, op->why,
					     sizeof(op->why))
		     : -ENOMEM;
	for (size_t i = 0; r == 0 && i < op->n_xfers; i++)
		os->segs[i] = (struct tpb_rdma_seg){ .mem = op->xfers[i].src,
						     .len = op->xfers[i].len,
						     .buf = op->xfers[i].src.buf };
	os->x = (struct tpb_rdma_xfer){ .segs = os->segs, .n_segs = op->n_xfers,
					.done = op_send_done, .arg = os };
	if (r == 0)
		r = tpb_rdma_send(l, &os->x, &of, op->why, sizeof(op->why));
	if (r < 0) {
		op_send_free(os);
		return r;
	}
	op->ep = ep;
	op->status = 0;
	op->bytes = 0;
	op->channel = tpb_index(tpb_rdma_channel(op_local_cuda(op, false), &of, false));
	tpu_list_insert_tail(&l->op_sends, &os->node);
	return 0;
}

/* A receive prepared by tpb_prepare(): its destination's registration (tpb_rdma_recv_new(),
 * which borrows @segs) and, until the reader's CUDA events fired, where its offer goes. */
struct op_recv {
	struct tpb_op *op;
	struct tpb_rdma_recv *rv;
	struct tpb_rdma_seg *segs;
	void *offer;
	size_t offer_max;
};

static void op_recv_free(struct op_recv *orv)
{
	if (!orv)
		return;
	tpb_rdma_recv_free(orv->rv);
	free(orv->segs);
	free(orv);
}

/* The registration is ready (@err 0: the offer goes into the caller's buffer) or failed. */
static void op_recv_ready(void *arg, int err, const char *why)
{
	struct op_recv *orv = arg;
	struct tpb_op *op = orv->op;
	struct tpb_rdma_offer of;
	int r = err;

	if (r == 0) {
		tpb_rdma_recv_offer(orv->rv, &of);
		r = tpb_rdma_offer_encode(&of, orv->offer, orv->offer_max);
		why = "RDMA offer larger than its buffer";
	}
	op->status = r < 0 ? r : 0;
	op->offer = r < 0 ? NULL : orv->offer;
	op->offer_len = r < 0 ? 0 : (size_t)r;
	snprintf(op->why, sizeof(op->why), "%s", r < 0 && why ? why : "");
	if (r < 0) {
		op->prep_ops = NULL;
		op->prep = NULL;
		op_recv_free(orv);
	}
	op->done(op); /* @op is its owner's again (the registration stays, if made) */
}

int tpb_rdma_ep_prepare(struct tpb_ep *ep, struct tpb_op *op, void *offer, size_t *offer_len)
{
	struct tpb_rdma_link *l = link_of(ep);
	struct op_recv *orv;
	bool src_cuda = false;
	int r;

	op->why[0] = '\0';
	if (!op->done)
		return -EINVAL;
	if (*offer_len < tpb_rdma_offer_size(op->n_xfers))
		return -ENOBUFS;
	orv = calloc(1, sizeof(*orv));
	if (!orv || !(orv->segs = calloc(op->n_xfers ? op->n_xfers : 1, sizeof(*orv->segs)))) {
		free(orv);
		return -ENOMEM;
	}
	for (size_t i = 0; i < op->n_xfers; i++) {
		const struct tpb_xfer *x = &op->xfers[i];

		orv->segs[i] = (struct tpb_rdma_seg){ .mem = x->dst, .len = x->len,
						      .buf = x->dst.buf };
		src_cuda |= x->src.loc == TPB_LOC_REMOTE && x->src.remote == TPB_LOC_CUDA;
	}
	orv->op = op;
	orv->offer = offer;
	orv->offer_max = *offer_len;
	r = tpb_rdma_recv_new(l, orv->segs, op->n_xfers, src_cuda, op_recv_ready, orv, &orv->rv,
			      op->why, sizeof(op->why));
	if (r < 0) {
		op_recv_free(orv);
		return r;
	}
	op->ep = ep;
	op->prep_ops = ep->ctx->ops;
	op->prep = orv;
	op->channel = tpb_index(tpb_rdma_channel(op_local_cuda(op, true), NULL, src_cuda));
	return -EINPROGRESS; /* op_recv_ready() follows, from tpb_progress() */
}

void tpb_rdma_op_release(struct tpb_op *op)
{
	op_recv_free(op->prep);
}

static int prepared_flush(const struct tpb_op *op, char *why, size_t wl)
{
	const struct tpb_op *p = op->prepared;
	struct op_recv *orv = p && (p->prep_ops == &tpb_rdma_ops ||
				    p->prep_ops == &tpb_cuda_gdr_ops) ? p->prep : NULL;

	return orv ? tpb_rdma_recv_flush(orv->rv, why, wl) : 0;
}

static struct tpb_cuda_idle *prepared_end(const struct tpb_op *op)
{
	const struct tpb_op *p = op->prepared;
	struct op_recv *orv = p && (p->prep_ops == &tpb_rdma_ops ||
				    p->prep_ops == &tpb_cuda_gdr_ops) ? p->prep : NULL;

	return orv ? tpb_rdma_recv_end(orv->rv) : NULL;
}

int tpb_rdma_ep_cancel(struct tpb_ep *ep, struct tpb_op *op)
{
	struct tpb_rdma_link *l = link_of(ep);
	struct op_wait *ow = recv_find(l, op);
	struct op_send *os;

	if (ow) {
		op->canceled = true;
		op_wait_end(l, ow, -ECANCELED, 0, "canceled");
		return 0;
	}
	tpu_list_for_each(os, &l->op_sends, node) {
		if (os->op == op) {
			op->canceled = true;
			tpb_rdma_send_cancel(l, &os->x);
			return 0;
		}
	}
	return -ENOENT;
}

#else /* !HAVE_RDMA */

struct tpb_ep *tpb_rdma_link_ep(struct tpb_rdma_link *l)
{
	return NULL;
}

int tpb_rdma_ep_open(struct tpb_ctx *ctx, const struct tpb_peer *peer, struct tpb_ep **ret)
{
	return -EOPNOTSUPP;
}

void tpb_rdma_ep_close(struct tpb_ep *ep)
{
}

int tpb_rdma_ep_query(struct tpb_ep *ep, struct tpb_ep_info *ret)
{
	return -EOPNOTSUPP;
}

int tpb_rdma_ep_msg(struct tpb_ep *ep, const void *msg)
{
	return -EOPNOTSUPP;
}

int tpb_rdma_ep_recv_expect(struct tpb_ep *ep, struct tpb_op *op, uint64_t bytes, int status,
			    const char *why)
{
	return -ENOENT;
}

size_t tpb_rdma_offer_max(size_t n_xfers)
{
	return tpb_rdma_offer_size(n_xfers);
}

int tpb_rdma_ep_start(struct tpb_ep *ep, struct tpb_op *op)
{
	snprintf(op->why, sizeof(op->why), "tpipd was built without RDMA or CUDA support");
	return -EOPNOTSUPP;
}

int tpb_rdma_ep_cancel(struct tpb_ep *ep, struct tpb_op *op)
{
	return -ENOENT;
}

int tpb_rdma_ep_prepare(struct tpb_ep *ep, struct tpb_op *op, void *offer, size_t *offer_len)
{
	snprintf(op->why, sizeof(op->why), "tpipd was built without RDMA or CUDA support");
	return -EOPNOTSUPP;
}

void tpb_rdma_op_release(struct tpb_op *op)
{
}

#endif

size_t tpb_rdma_offer_size(size_t n)
{
	return TPB_RDMA_OFFER_HDR + n * TPB_RDMA_OFFER_REGION;
}

static void put_le(uint8_t *p, uint64_t v, unsigned bytes)
{
	for (unsigned i = 0; i < bytes; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

int tpb_rdma_offer_encode(const struct tpb_rdma_offer *of, void *buf, size_t len)
{
	uint8_t *p = buf;

	if (of->n > UINT32_MAX || len < tpb_rdma_offer_size(of->n))
		return -ENOBUFS;
	put_le(p, of->port, 4);
	put_le(p + 4, of->n, 4);
	for (size_t i = 0; i < of->n; i++) {
		uint8_t *r = p + TPB_RDMA_OFFER_HDR + i * TPB_RDMA_OFFER_REGION;

		put_le(r, of->regions[i].addr, 8);
		put_le(r + 8, of->regions[i].length, 8);
		put_le(r + 16, of->regions[i].rkey, 4);
		put_le(r + 20, of->regions[i].cuda ? 1 : 0, 4);
	}
	return (int)tpb_rdma_offer_size(of->n);
}

static uint64_t get_le(const uint8_t *p, unsigned bytes)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < bytes; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

int tpb_rdma_offer_decode(const void *buf, size_t len, struct tpb_rdma_region **ret_regions,
			  struct tpb_rdma_offer *ret, char *why, size_t wl)
{
	const uint8_t *p = buf;
	struct tpb_rdma_region *regions;
	size_t n;

	if (!p || len < TPB_RDMA_OFFER_HDR) {
		snprintf(why, wl, "the reader's daemon offered no RDMA region");
		return -EOPNOTSUPP;
	}
	n = get_le(p + 4, 4);
	if (len != tpb_rdma_offer_size(n)) {
		snprintf(why, wl, "RDMA offer of %zu bytes for %zu regions", len, n);
		return -EPROTO;
	}
	regions = calloc(n ? n : 1, sizeof(*regions));
	if (!regions)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const uint8_t *r = p + TPB_RDMA_OFFER_HDR + i * TPB_RDMA_OFFER_REGION;

		regions[i] = (struct tpb_rdma_region){ .addr = get_le(r, 8),
						       .length = get_le(r + 8, 8),
						       .rkey = (uint32_t)get_le(r + 16, 4),
						       .cuda = get_le(r + 20, 4) & 1 };
	}
	*ret = (struct tpb_rdma_offer){ .port = (uint32_t)get_le(p, 4), .n = n,
					.regions = regions };
	*ret_regions = regions;
	return 0;
}
