/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Cross-host transfers of single messages, on the loop thread: the send (writer's daemon) or
 * receive (reader's daemon) of one rendezvous message over a peer link, through the link's
 * endpoints in the channel op table (tpb.h, tpd_peer_ep()): the data connections' (mpt), or,
 * where the selection picks a channel that writes into memory the reader prepared and offered
 * (rdma, cuda_gdr), that channel's, with the offer as opaque bytes (the peer part translates
 * them to and from PeerReadReq). It starts them, turns their completion into the message's
 * outcome (PeerXferEnd, ReadDone, the write's status) and cancels them. Which message goes
 * next and the pipe's lifetime are pipe.c's; the peer messages that drive a cross-host pipe
 * are xpipe.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <event2/event.h>
#include "copier.h"
#include "core.h"
#include "log.h"
#include "peer.h"
#include "pipe_int.h"
#include "stripe.h"

/*
 * The send (writer's daemon) or receive (reader's daemon) of one message over the link's
 * stripe. A send reads the writer's sources; a receive writes the reader's allocation and holds
 * references to its shared buffers. Either marks its message and writer end as copying until
 * its done callback, so that close acknowledgements wait for it.
 */
struct tpd_xh {
	struct tpb_stripe_xfer x;	/* the outcome (and, by rdma / cuda_gdr, the transfer) */
	struct tpb_stripe_seg *segs;
	struct tpb_op op;		/* the mpt channel's op (tpb.h), over @xfers */
	struct tpb_xfer *xfers;
	uint64_t start_ns;
	struct tpb_copy_job *holder; /* receive: buffer references of the destination */
	struct tpd_msg *m;
	struct tpd_peer *link;
	bool send;
	bool started;
	Tpw__V1__Status early; /* send: the reader finished (failed) before the send ended */
	char early_why[160];
	/* Into an offer (rdma, cuda_gdr), on the link's endpoint of channel @ch. Send: the
	 * reader's offer (from its PeerReadReq) and @rop started with it; gdr once the writes run.
	 * Receive: the op tpb_prepare() registered (its offer in @offer_bytes), @prepared while the
	 * registration holds, and @rop, the receive into it, which the sender's word ends
	 * (@expected: its outcome is the transfer's); gdr once the sender said it wrote. A receive
	 * completes once neither @op nor @rop is running. */
	struct tpd_peer_offer offer;
	int ch;
	struct tpb_op rop;
	struct tpb_xfer *rxfers;
	uint8_t *offer_bytes;
	uint64_t rdma_start_ns;
	struct tpb_op prep;
	bool prepared;
	bool gdr;
	bool expected;
	bool mpt_running;
	bool rop_running;
	bool to_stage; /* receive into the staging of a far daemon's broadcast (bcast.c) */
	struct event *idle; /* ... its deadline (xh_stage_deadline()), or NULL */
	uint64_t idle_bytes; /* ... the receive's own bytes at its last check */
	uint32_t idle_ms;
	bool sending; /* send: counted by tpd_peer_sending() while its op runs on the stripe */
	int gdr_status;
	uint64_t gdr_bytes;
	char gdr_why[160];
	char chan_why[200]; /* why the stripe (mpt) and not RDMA: for tpipctl pipes -v */
};

void tpd_xh_free(struct tpd_xh *xh)
{
	if (!xh)
		return;
	if (xh->idle)
		event_free(xh->idle);
	tpb_copier_job_free(xh->holder);
	tpb_release(&xh->prep);
	tpd_peer_rdma_offer_done(&xh->offer);
	free(xh->rxfers);
	free(xh->offer_bytes);
	free(xh->xfers);
	free(xh->segs);
	free(xh);
}

/* The channel of the link's data connections (mpt): every transfer runs an op there. */
static int xh_mpt(void)
{
	return tpb_index("mpt");
}

void tpd_xh_cancel(struct tpd_xh *xh)
{
	struct tpb_ep *ep;

	if (!xh->started || !xh->link)
		return;
	/* A broadcast's one transfer over the link (PeerBcast) serves the other pipes' readers
	 * too: an end of its own pipe leaving does not stop it by itself. The receive into the
	 * staging ends once no delivery needs it (tpd_bcast_unwanted()), after peer-timeout
	 * without bytes, or with the link; the send ends on its own, or with the link (the
	 * writer's close is acknowledged only once it no longer reads its memory). */
	if (xh->to_stage) {
		tpd_bcast_unwanted(xh->m);
		return;
	}
	if (xh->send && xh->m->xcarrier)
		return;
	if (xh->send && xh->gdr) {
		ep = tpd_peer_ep(xh->link, xh->ch);
		if (ep)
			(void)tpb_cancel(ep, &xh->rop);
		return;
	}
	/* A receive into an offer ends its @rop once this one has ended (xh_op_done()). */
	ep = tpd_peer_ep(xh->link, xh_mpt());
	if (ep)
		(void)tpb_cancel(ep, &xh->op); /* -ENOENT: it ended already */
}

/* The channel @xh counts under: mpt, or the offer's channel once the bytes went into the
 * offer (the one the channel named: rdma, or cuda_gdr with CUDA memory on a side). */
static int xh_channel(const struct tpd_xh *xh)
{
	int ch = xh->send ? xh->rop.channel : xh->prep.channel;

	return xh->gdr && ch >= 0 ? ch : xh_mpt();
}

/* Common end of a send or receive: flags, statistics, next message. */
static void xh_finish(struct tpd_msg *m, struct tpd_xh *xh)
{
	struct tpd_pipe *p = m->from->pipe;
	int ch = xh_channel(xh);

	if (xh->sending && xh->link)
		tpd_peer_sending(xh->link, false);
	m->xh = NULL;
	m->copying = false;
	m->from->copying--;
	p->jobs--;
	if (ch >= 0 && xh->x.status == 0)
		tpd_pipe_channel_note(p, xh->send ? "cross-host send" : "cross-host receive", ch,
				      xh->gdr		 ? "RDMA: the reader offered registered memory"
				      : xh->chan_why[0] ? xh->chan_why
							 : "striped over the peer link's data connections");
	if (ch >= 0) {
		p->channels |= 1u << ch;
		tpd_stats_record(tpd_daemon_stats(p->d), ch, xh->x.bytes, xh->x.ns, xh->x.status < 0);
	}
	for (size_t i = 0; i < xh->x.n_segs && !xh->gdr; i++)
		if (xh->segs[i].mem.loc == TPB_LOC_CUDA) /* staged through the stripe's buffers */
			p->channels |= 1u << tpb_index("cuda_basic");
	/* The reader's daemon knows both ends of each segment: CUDA pairs show as such. */
	for (size_t i = 0; i < xh->x.n_segs && !xh->send && xh->x.status == 0; i++) {
		enum tpb_loc src = m->src[i].remote_cuda ? TPB_LOC_CUDA : TPB_LOC_LOCAL;
		enum tpb_loc dst = xh->segs[i].mem.loc;
		bool cuda = src == TPB_LOC_CUDA || dst == TPB_LOC_CUDA;

		if (cuda && xh->segs[i].len)
			tpd_pipe_pair_record(p, src, dst, xh->gdr ? ch : tpb_index("cuda_basic"));
	}
	tpd_xh_free(xh);
}

static void xh_after(struct tpd_pipe_end *w)
{
	struct tpd_pipe *p = w->pipe;

	tpd_pipe_start_next_copy(w);
	tpd_pipe_end_owed_maybe(w);
	tpd_pipe_end_owed_maybe(tpd_pipe_end_peer(w));
	tpd_pipe_maybe_free(p);
}

void tpd_xh_abandon(struct tpd_msg *m, Tpw__V1__Status st, const char *why)
{
	struct tpd_xh *xh = m->xh;

	if (!xh || xh->started)
		return;
	if (xh->send)
		tpd_xh_tell_end(m->from->pipe, xh->x.xfer_id, st, why, 0, false);
	m->xh = NULL;
	tpd_xh_free(xh);
}

/* Tells the reader's daemon that transfer @xfer_id ended with @st (@why: NULL when OK). */
void tpd_xh_tell_end(struct tpd_pipe *p, uint64_t xfer_id, Tpw__V1__Status st, const char *why,
		     uint64_t bytes, bool rdma)
{
	Tpw__V1__PeerXferEnd xe = TPW__V1__PEER_XFER_END__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;

	xe.xfer_id = xfer_id;
	xe.status = st;
	xe.message = (char *)why;
	xe.bytes = bytes;
	xe.rdma = rdma;
	pm.body_case = TPW__V1__PEER_MSG__BODY_XFER_END;
	pm.xfer_end = &xe;
	tpd_xpipe_tell(p, &pm, NULL, 0);
}

static void xh_send_done(struct tpb_stripe_xfer *x)
{
	struct tpd_xh *xh = x->arg;
	struct tpd_msg *m = xh->m;
	struct tpd_pipe_end *w = m->from;
	Tpw__V1__Status st = tpw_status_from_errno(x->status);
	Tpw__V1__Status early;
	char why[160], early_why[160];

	if (xh->started)
		tpd_daemon_broker(w->pipe->d)->xh_running--;
	snprintf(why, sizeof(why), "%s", x->status < 0 ? x->why : "");
	if (tpd_pipe_end_dying(w)) {
		/* The writer was told its write was canceled and may reuse the memory. */
		st = tpd_pipe_end_gone_status(w);
		snprintf(why, sizeof(why), "%s during the transfer", tpd_pipe_gone_text(st));
	} else if (x->status < 0 && tpd_pipe_end_dying(tpd_pipe_end_peer(w))) {
		st = tpd_pipe_end_gone_status(tpd_pipe_end_peer(w));
		snprintf(why, sizeof(why), "%.150s", tpd_pipe_why(w->pipe, st));
	} else if (x->status == -ESRCH) {
		st = TPW__V1__STATUS__STATUS_PEER_DIED;
		snprintf(why, sizeof(why), "writer died during the transfer");
	}
	/* A send that put every chunk on the data connections needs no word: the receive
	 * completes on its bytes. A failed one says how far it got; an RDMA one says it wrote. */
	if (st != TPW__V1__STATUS__STATUS_OK || xh->gdr)
		tpd_xh_tell_end(w->pipe, x->xfer_id, st, why[0] ? why : NULL, x->bytes, xh->gdr);
	if (st != TPW__V1__STATUS__STATUS_OK)
		tpd_pipe_log(w->pipe, NULL, TPU_LOG_INFO, "message %llu: send failed: %s",
			     (unsigned long long)m->msg_id, why);
	early = xh->early;
	snprintf(early_why, sizeof(early_why), "%s", xh->early_why);
	xh_finish(m, xh); /* frees @xh */
	if (early)
		tpd_pipe_msg_consumed(m, early, early_why);
	else if (st != TPW__V1__STATUS__STATUS_OK)
		tpd_pipe_msg_consumed(m, st, why);
	/* else: the write completes when the reader's daemon says PeerConsumed. */
	xh_after(w);
}

static void xh_recv_done(struct tpb_stripe_xfer *x)
{
	struct tpd_xh *xh = x->arg;
	struct tpd_msg *m = xh->m;
	struct tpd_pipe_end *w = m->from, *r = tpd_pipe_end_peer(w);
	int status = x->status;
	char why[160];

	if (xh->started)
		tpd_daemon_broker(w->pipe->d)->xh_running--;
	snprintf(why, sizeof(why), "%s", status < 0 ? x->why : "");
	if (xh->gdr && (status == 0 || status == -ECANCELED)) {
		/* The sender RDMA-wrote the bytes; the stripe's registration was only dropped. */
		status = x->status = xh->gdr_status;
		x->bytes = status == 0 ? xh->gdr_bytes : 0;
		snprintf(why, sizeof(why), "%s", xh->gdr_why);
	}
	if (xh->link)
		tpd_peer_xfer_drop(xh->link, x->xfer_id);
	if ((status == 0 || status == -ECANCELED || status == -ECONNRESET) &&
	    tpd_pipe_end_dying(w)) {
		/* The writer's end went away: its bytes may be torn, never deliver them. */
		status = tpw_status_to_errno(tpd_pipe_end_gone_status(w));
		snprintf(why, sizeof(why), "%.120s during the transfer",
			 tpd_pipe_why(w->pipe, tpd_pipe_end_gone_status(w)));
	} else if (status == -ESRCH || (status < 0 && tpd_pipe_end_dying(r))) {
		status = -ECONNRESET;
		snprintf(why, sizeof(why), "reader died during the transfer");
	}
	if (status < 0)
		tpd_pipe_log(w->pipe, NULL, TPU_LOG_INFO, "message %llu: receive failed: %s",
			     (unsigned long long)m->msg_id, why);
	if (xh->to_stage) {
		/* the broadcast's one receive: its deliveries (this message's too) go on */
		xh_finish(m, xh);
		tpd_bcast_staged(m, status, why);
		xh_after(w);
		return;
	}
	xh_finish(m, xh);
	tpd_pipe_send_read_done(r, m->msg_id, tpw_status_from_errno(status),
				status < 0 ? why : NULL);
	tpd_pipe_msg_consumed(m, tpw_status_from_errno(status), status < 0 ? why : NULL);
	xh_after(w);
}

/* The mpt op of @xh ended (from the mpt context's tpb_progress(), on the loop): its outcome
 * becomes @xh->x's, as the stripe would have set it, and the send or receive completes. */
static void xh_op_done(struct tpb_op *op)
{
	struct tpd_xh *xh = op->arg;

	xh->x.status = op->status;
	xh->x.bytes = op->bytes;
	xh->x.ns = tpu_now_ns() - xh->start_ns;
	snprintf(xh->x.why, sizeof(xh->x.why), "%s", op->status < 0 ? op->why : "");
	xh->mpt_running = false;
	if (xh->rop_running) { /* the receive into the offer ends first */
		struct tpb_ep *ep = xh->link ? tpd_peer_ep(xh->link, xh->ch) : NULL;

		if (ep) /* else the link is going: closing its endpoint ends @rop */
			(void)tpb_cancel(ep, &xh->rop);
		return;
	}
	xh->x.done(&xh->x);
}

/* The receive into the offer ended (from tpb_progress() on the offer channel's context, or
 * inside the close of its endpoint): with the sender's word, its outcome is the transfer's;
 * the transfer completes once the data connections' op has ended too. */
static void xh_rop_done(struct tpb_op *op)
{
	struct tpd_xh *xh = op->arg;

	xh->rop_running = false;
	if (xh->expected) {
		xh->gdr_status = op->status;
		xh->gdr_bytes = op->bytes;
		snprintf(xh->gdr_why, sizeof(xh->gdr_why), "%s", op->why);
	}
	if (!xh->mpt_running)
		xh->x.done(&xh->x);
}

/* Starts @xh's segments on the link's mpt endpoint: a send to, or a receive from, the other
 * host. Return: 0 (xh_op_done() follows), or -errno with no callback (-ENOTCONN: the link is
 * going). */
static int xh_mpt_start(struct tpd_xh *xh)
{
	struct tpb_ep *ep = tpd_peer_ep(xh->link, xh_mpt());
	struct tpb_mem other = { .loc = TPB_LOC_REMOTE, .remote = TPB_LOC_LOCAL };
	int r;

	if (!ep)
		return -ENOTCONN;
	for (size_t i = 0; i < xh->x.n_segs; i++) {
		struct tpb_xfer *x = &xh->xfers[i];

		x->len = xh->segs[i].len;
		x->src = xh->send ? xh->segs[i].mem : other;
		x->dst = xh->send ? other : xh->segs[i].mem;
	}
	xh->op = (struct tpb_op){ .xfers = xh->xfers, .n_xfers = xh->x.n_segs,
				  .xfer_id = xh->x.xfer_id, .done = xh_op_done, .arg = xh };
	xh->start_ns = tpu_now_ns();
	r = tpb_start(ep, &xh->op);
	xh->mpt_running = r == 0;
	if (r == 0 && xh->send && !xh->sending) {
		xh->sending = true; /* the link watches that its chunks go */
		tpd_peer_sending(xh->link, true);
	}
	return r;
}

/* Receive: no offer after all (the registration goes; the receive into it ends). */
static void xh_unoffer(struct tpd_xh *xh)
{
	struct tpb_ep *ep = tpd_peer_ep(xh->link, xh->ch);

	tpb_release(&xh->prep);
	xh->prepared = false;
	if (xh->rop_running && ep)
		(void)tpb_cancel(ep, &xh->rop);
}

/*
 * Receive: asks the writer's daemon for the bytes, with the offer @offer (@len bytes, as the
 * channel wrote it; NULL: none). Runs at once without an offer, or once the offer is ready
 * (xh_prep_done()).
 */
static void xh_ask(struct tpd_xh *xh, const void *offer, size_t len)
{
	Tpw__V1__PeerReadReq rr = TPW__V1__PEER_READ_REQ__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	_cleanup_free_ void *store = NULL;
	struct tpd_pipe *p = xh->m->from->pipe;
	char why[160];

	rr.pipe_id = p->remote_id;
	rr.msg_id = xh->m->msg_id;
	rr.xfer_id = xh->x.xfer_id;
	rr.bcast = xh->to_stage;
	/* the offer, as the wire carries it */
	if (offer && tpd_peer_rdma_offer_out(offer, len, &rr, &store, why, sizeof(why)) < 0) {
		tpd_pipe_log(p, NULL, TPU_LOG_INFO, "message %llu: not over RDMA: %s",
			     (unsigned long long)xh->m->msg_id, why);
		xh_unoffer(xh);
	}
	pm.body_case = TPW__V1__PEER_MSG__BODY_READ_REQ;
	pm.read_req = &rr;
	tpd_xpipe_tell(p, &pm, NULL, 0);
}

/* The offer @xh prepared is ready (from tpb_progress(), on the loop), or could not be made
 * (registration gone): asks the writer's daemon for the bytes, with the offer or without. */
static void xh_prep_done(struct tpb_op *op)
{
	struct tpd_xh *xh = op->arg;

	if (op->status < 0) {
		tpd_pipe_log(xh->m->from->pipe, NULL, TPU_LOG_INFO,
			     "message %llu: not over RDMA: %s", (unsigned long long)xh->m->msg_id,
			     op->why);
		xh_unoffer(xh);
		xh_ask(xh, NULL, 0);
		return;
	}
	xh_ask(xh, op->offer, op->offer_len);
}

/*
 * Receive: registers @xh's destination on @ep (tpb_prepare()), against the writer's kind of
 * memory, and starts the receive into it (@rop, which the sender's word ends); the offer
 * follows from xh_prep_done().
 * Return: 0 (xh_prep_done() follows, or ran already), or -errno (no offer: ask without).
 */
static int xh_prepare(struct tpd_xh *xh, struct tpb_ep *ep)
{
	size_t n = xh->x.n_segs, len = tpb_offer_max(ep, n);
	int r;

	xh->rxfers = calloc(n ? n : 1, sizeof(*xh->rxfers));
	xh->offer_bytes = malloc(len ? len : 1);
	if (!xh->rxfers || !xh->offer_bytes)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		xh->rxfers[i].src.loc = TPB_LOC_REMOTE;
		xh->rxfers[i].src.remote = xh->m->src[i].remote_cuda ? TPB_LOC_CUDA
								     : TPB_LOC_LOCAL;
		xh->rxfers[i].dst = xh->segs[i].mem;
		xh->rxfers[i].dst.buf = xh->segs[i].buf;
		xh->rxfers[i].len = xh->segs[i].len;
	}
	xh->prep = (struct tpb_op){ .xfers = xh->rxfers, .n_xfers = n, .xfer_id = xh->x.xfer_id,
				    .done = xh_prep_done, .arg = xh };
	r = tpb_prepare(ep, &xh->prep, xh->offer_bytes, &len);
	if (r < 0 && r != -EINPROGRESS)
		return r;
	xh->rop = (struct tpb_op){ .xfers = xh->rxfers, .n_xfers = n, .xfer_id = xh->x.xfer_id,
				   .prepared = &xh->prep, .done = xh_rop_done, .arg = xh };
	if (tpb_start(ep, &xh->rop) < 0) {
		tpb_release(&xh->prep); /* a completion still owed never runs */
		return -EOPNOTSUPP;
	}
	xh->rop_running = true;
	xh->prepared = true;
	if (r == 0) { /* the offer at once */
		xh->prep.offer = xh->offer_bytes;
		xh->prep.offer_len = len;
		xh_prep_done(&xh->prep);
	}
	return 0;
}

/* The first endpoint of @link, of a channel that takes offers, that is ready; or NULL. */
static struct tpb_ep *xh_offer_ep(struct tpd_peer *link)
{
	for (int i = 0; i < TPB_CHANNELS_MAX; i++) {
		struct tpb_ep *ep = tpb_takes_offer(i) ? tpd_peer_ep(link, i) : NULL;
		struct tpb_ep_info info = { 0 };

		if (ep && tpb_ep_query(ep, &info) == 0 && info.ready)
			return ep;
	}
	return NULL;
}

/*
 * Does the channel selection (tpb_select_pair(), honouring [backends] priority) pick a channel
 * that moves the bytes into an offer (rdma, cuda_gdr: tpb_takes_offer()) for every segment of
 * @xh, this side's memory against the other host's? The other side's kind: on a send, what the
 * reader's offer registered; on a receive, the writer's tensor kind (a shared buffer is assumed
 * for CPU memory: the writer's daemon declines the offer for private memory). If so, @ret_ep
 * becomes the link's endpoint of the first segment's channel (NULL: none on this link; kept
 * for a message without segments) and @xh->ch its index; else @xh->chan_why says which
 * channel won and why.
 */
static bool xh_select_offered(struct tpd_xh *xh, struct tpb_ep **ret_ep)
{
	for (size_t i = 0; i < xh->x.n_segs; i++) {
		bool cuda = xh->send ? i < xh->offer.n && xh->offer.kinds[i] == TPB_LOC_CUDA
				     : xh->m->src[i].remote_cuda;
		struct tpb_mem other = { .loc = TPB_LOC_REMOTE,
					 .remote = cuda ? TPB_LOC_CUDA : TPB_LOC_LOCAL };
		const struct tpb_mem *mine = &xh->segs[i].mem;
		char why[160];
		int ch = xh->send ? tpb_select_pair(mine, &other, why, sizeof(why))
				  : tpb_select_pair(&other, mine, why, sizeof(why));

		if (ch >= 0 && tpb_takes_offer(ch)) {
			if (i == 0)
				*ret_ep = tpd_peer_ep(xh->link, ch);
			continue;
		}
		snprintf(xh->chan_why, sizeof(xh->chan_why), "striped over the peer link's data "
			 "connections: %.12s for segment %zu: %.100s",
			 ch >= 0 ? tpb_name(ch) : "none", i, why);
		return false;
	}
	xh->ch = *ret_ep ? (*ret_ep)->ctx->idx : -1;
	return true;
}

/*
 * An RDMA send that wrote nothing (its sources' registration failed once their mappings had
 * opened, off the loop): the message goes over the data connections instead, as when the
 * registration fails at once; the reader's daemon takes the bytes there (its receive into the
 * offer ends with them). Return: true (xh_op_done() follows), false (the send fails).
 */
static bool xh_gdr_fallback(struct tpd_xh *xh, const struct tpb_op *op)
{
	struct tpd_pipe_end *w = xh->m->from;

	if (op->status != -EOPNOTSUPP || xh->early || tpd_pipe_end_dying(w) ||
	    tpd_pipe_end_dying(tpd_pipe_end_peer(w)))
		return false;
	tpd_pipe_log(w->pipe, NULL, TPU_LOG_INFO, "message %llu: not over RDMA: %s",
		     (unsigned long long)xh->m->msg_id, op->why);
	snprintf(xh->chan_why, sizeof(xh->chan_why), "striped over the peer link's data "
		 "connections: not over RDMA: %.120s", op->why);
	xh->gdr = false;
	return xh_mpt_start(xh) == 0;
}

/* An RDMA send ended (from tpb_progress(), or inside the link's free): the transfer's outcome. */
static void xh_rdma_op_done(struct tpb_op *op)
{
	struct tpd_xh *xh = op->arg;

	if (xh_gdr_fallback(xh, op))
		return;
	xh->x.status = op->status;
	snprintf(xh->x.why, sizeof(xh->x.why), "%s", op->why);
	xh->x.bytes = op->bytes;
	xh->x.ns = tpu_now_ns() - xh->rdma_start_ns;
	xh_send_done(&xh->x);
}

/* The send's op for the offer's endpoint: the sources, and the reader's offer as its bytes.
 * Return: 0 or -ENOMEM. */
static int xh_offer_op(struct tpd_xh *xh)
{
	size_t n = xh->x.n_segs;

	xh->rxfers = calloc(n ? n : 1, sizeof(*xh->rxfers));
	if (!xh->rxfers)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		xh->rxfers[i].src = xh->segs[i].mem;
		xh->rxfers[i].src.buf = xh->segs[i].buf;
		xh->rxfers[i].dst.loc = TPB_LOC_REMOTE;
		xh->rxfers[i].dst.remote = i < xh->offer.n ? (enum tpb_loc)xh->offer.kinds[i]
							   : TPB_LOC_LOCAL;
		xh->rxfers[i].len = xh->segs[i].len;
	}
	xh->rop = (struct tpb_op){ .xfers = xh->rxfers, .n_xfers = n, .offer = xh->offer.bytes,
				   .offer_len = xh->offer.len, .done = xh_rdma_op_done, .arg = xh };
	return 0;
}

/* Send: RDMA-writes @xh if the reader offered it and this side can. Return: 0 or -errno. */
static int xh_send_gdr(struct tpd_xh *xh)
{
	struct tpd_pipe *p = xh->m->from->pipe;
	struct tpb_ep *ep = NULL;
	char why[160] = "";
	int r;

	if (!xh->offer.n) {
		snprintf(xh->chan_why, sizeof(xh->chan_why), "striped over the peer link's data "
			 "connections: the reader offered no RDMA target");
		return -EOPNOTSUPP;
	}
	if (!xh_select_offered(xh, &ep))
		return -EOPNOTSUPP; /* this daemon's priority puts the data connections first */
	if (!ep) {
		snprintf(why, sizeof(why), "RDMA is not set up on this link");
		r = -EOPNOTSUPP;
	} else if ((r = xh_offer_op(xh)) < 0) {
		snprintf(why, sizeof(why), "out of memory");
	} else {
		xh->rdma_start_ns = tpu_now_ns();
		r = tpb_start(ep, &xh->rop);
		snprintf(why, sizeof(why), "%s", r < 0 ? xh->rop.why : "");
	}
	if (r < 0)
		snprintf(xh->chan_why, sizeof(xh->chan_why), "striped over the peer link's data "
			 "connections: not over RDMA: %.120s", why);
	if (r < 0)
		tpd_pipe_log(p, NULL, r == -EPROTO ? TPU_LOG_WARNING : TPU_LOG_INFO,
			     "message %llu: not over RDMA: %s", (unsigned long long)xh->m->msg_id,
			     why);
	xh->gdr = r == 0;
	return r;
}

/* Receive: offers @xh's destination where the link and the selection allow. Return: true
 * (the ask follows from xh_prep_done()), false (ask without an offer). */
static bool xh_offer_recv(struct tpd_xh *xh)
{
	struct tpb_ep *ep = xh_offer_ep(xh->link);

	return ep && xh_select_offered(xh, &ep) && ep && xh_prepare(xh, ep) == 0;
}

/* The endpoint @xh's staging receive runs on, or NULL when it does not run. */
static struct tpb_ep *xh_stage_ep(struct tpd_xh *xh)
{
	if (!xh->to_stage || !xh->started || !xh->mpt_running || !xh->link)
		return NULL;
	return tpd_peer_ep(xh->link, xh_mpt());
}

void tpd_xh_stage_stop(struct tpd_xh *xh, int status, const char *why)
{
	struct tpb_ep *ep = xh_stage_ep(xh);

	if (ep) /* ends at once, or once the chunk a thread writes now is in */
		(void)tpb_recv_expect(ep, &xh->op, 0, status, why);
}

/* The bytes the staging receive took so far (its own, chunks arriving included), or @dflt when
 * it is not running. */
static uint64_t xh_stage_progress(struct tpd_xh *xh, uint64_t dflt)
{
	struct tpb_ep *ep = xh_stage_ep(xh);
	uint64_t b;

	return ep && tpb_recv_progress(ep, &xh->op, &b) == 0 ? b : dflt;
}

/* The staging receive's deadline came round: it fails with -ETIMEDOUT when no byte of it came
 * since the last check (another transfer's bytes, or chunks of none, do not count), and a data
 * connection the peer left in the middle of one of its chunks fails with it. */
static void xh_on_idle(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_xh *xh = arg;
	uint64_t now = xh_stage_progress(xh, xh->idle_bytes);
	struct tpb_ep *ep;
	char why[120];

	(void)fd;
	(void)what;
	if (now != xh->idle_bytes) {
		xh->idle_bytes = now;
		return;
	}
	event_del(xh->idle);
	snprintf(why, sizeof(why), "no byte of the broadcast came for %u ms (tpipd --peer-timeout)",
		 xh->idle_ms);
	tpd_pipe_log(xh->m->from->pipe, NULL, TPU_LOG_INFO, "message %llu: %s",
		     (unsigned long long)xh->m->msg_id, why);
	ep = xh_stage_ep(xh);
	if (!ep || tpb_recv_stalled(ep, &xh->op, why) < 0)
		tpd_xh_stage_stop(xh, -ETIMEDOUT, why);
}

/*
 * A staging receive serves no reader of its own that could cancel it: a sender that stalls
 * while its link stays alive must not hold the staging for ever. Checked every peer-timeout,
 * as a channel item's streamed receive (tpd_chan_stream_deadline()), by the receive's own bytes.
 * Without memory for the timer the receive runs without a deadline (the readers leaving still
 * end it).
 */
static void xh_stage_deadline(struct tpd_xh *xh, struct tpd_daemon *d)
{
	uint32_t ms = tpd_daemon_cfg(d)->peer_timeout_ms;
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (suseconds_t)(ms % 1000) * 1000 };
	struct tpb_stripe *st = tpd_peer_stripe(xh->link);

	if (!ms || !st)
		return;
	xh->idle = event_new(tpd_daemon_base(d), -1, EV_PERSIST, xh_on_idle, xh);
	if (xh->idle && tpd_timer_add(xh->idle, &tv) < 0) {
		event_free(xh->idle);
		xh->idle = NULL;
	}
	xh->idle_ms = ms;
	xh->idle_bytes = xh_stage_progress(xh, 0);
}

/* Starts @m's send or receive. Return: 0, or -errno when it failed at once and has completed. */
int tpd_xh_start(struct tpd_msg *m)
{
	struct tpd_xh *xh = m->xh;
	struct tpd_pipe_end *w = m->from;
	struct tpd_pipe *p = w->pipe;
	int r = -ENOTCONN;

	m->copying = true;
	w->copying++;
	p->jobs++;
	xh->link = p->link;
	xh->x.arg = xh;
	if (xh->link && xh->send) {
		xh->x.done = xh_send_done;
		r = xh_send_gdr(xh);
		if (r < 0)
			r = xh_mpt_start(xh);
	} else if (xh->link) {
		xh->x.done = xh_recv_done;
		xh->x.xfer_id = tpd_peer_xfer_add(xh->link, xh);
		xh->x.total = 0;
		for (size_t i = 0; i < xh->x.n_segs; i++)
			xh->x.total += xh->segs[i].len;
		r = xh->x.xfer_id ? xh_mpt_start(xh) : -ENOMEM;
		/* An offer only where the selection picks a channel that takes one for every
		 * segment and the link can carry it; else the bytes come over the data
		 * connections. */
		if (r == 0 && (xh->to_stage || !xh_offer_recv(xh))) {
			xh_ask(xh, NULL, 0); /* no offer: ask for the bytes at once */
		} else if (r < 0 && xh->x.xfer_id) {
			tpd_peer_xfer_drop(xh->link, xh->x.xfer_id);
		}
	}
	if (r == 0) {
		xh->started = true;
		tpd_daemon_broker(p->d)->xh_running++;
		if (xh->to_stage)
			xh_stage_deadline(xh, p->d);
		return 0;
	}
	/* Not started: the link is gone or going (its pipes learn why next). */
	r = r == -ENOTCONN ? -ECONNRESET : r;
	xh->x.status = r;
	snprintf(xh->x.why, sizeof(xh->x.why), "peer link down");
	xh->x.done(&xh->x); /* frees @xh */
	return r;
}

static struct tpd_xh *xh_new(struct tpd_msg *m, bool send)
{
	struct tpd_xh *xh = calloc(1, sizeof(*xh));

	if (!xh)
		return NULL;
	xh->segs = calloc(m->n_src ? m->n_src : 1, sizeof(*xh->segs));
	xh->xfers = calloc(m->n_src ? m->n_src : 1, sizeof(*xh->xfers));
	if (!xh->segs || !xh->xfers) {
		free(xh->segs);
		free(xh->xfers);
		free(xh);
		return NULL;
	}
	xh->m = m;
	xh->send = send;
	xh->ch = -1;
	xh->prep.channel = -1;
	xh->x.segs = xh->segs;
	xh->x.n_segs = m->n_src;
	return xh;
}

/* The reader's allocation @rd for message @m of a remote writer: a receive, started in turn. */
int tpd_xh_build_recv(struct tpd_msg *m, struct tpd_session *s, const Tpw__V1__Read *rd, char *why,
		      size_t wl)
{
	size_t n = rd->n_payloads + rd->n_tensors;
	struct tpd_xh *xh;

	if (n != m->n_src) {
		snprintf(why, wl, "allocation has %zu segments, message has %zu", n, m->n_src);
		return -EINVAL;
	}
	xh = xh_new(m, false);
	if (!xh || !(xh->holder = tpb_copier_job_new(1, n))) {
		tpd_xh_free(xh);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		struct tpd_msg_dst d;
		int r;

		if (m->src[i].len == 0)
			continue;
		r = tpd_msg_resolve_dst(s, tpd_msg_read_segment(rd, i), &m->src[i], xh->holder, &d,
					why, wl);
		if (r < 0) {
			tpd_xh_free(xh);
			return r;
		}
		xh->segs[i].mem = d.x.dst;
		xh->segs[i].len = d.x.len;
		xh->segs[i].buf = d.buf; /* the holder keeps it */
	}
	m->xh = xh;
	return 0;
}

int tpd_xh_build_recv_stage(struct tpd_msg *m, uint8_t *base, const uint64_t *off)
{
	struct tpd_xh *xh = xh_new(m, false);

	if (!xh)
		return -ENOMEM;
	for (size_t i = 0; i < m->n_src; i++) {
		xh->segs[i].mem = (struct tpb_mem){ .loc = TPB_LOC_LOCAL,
						    .addr = (uint64_t)(uintptr_t)(base + off[i]) };
		xh->segs[i].len = m->src[i].len;
	}
	xh->to_stage = true;
	m->xh = xh;
	return 0;
}

int tpd_xh_build_send(struct tpd_msg *m, const Tpw__V1__PeerReadReq *rr)
{
	struct tpd_xh *xh = xh_new(m, true);

	if (!xh)
		return -ENOMEM;
	for (size_t i = 0; i < m->n_src; i++) {
		xh->segs[i].mem = m->src[i].mem;
		xh->segs[i].len = m->src[i].len;
		xh->segs[i].buf = m->src[i].mem.loc == TPB_LOC_LOCAL ? m->src[i].buf : NULL;
	}
	xh->x.xfer_id = rr->xfer_id;
	/* The reader's offer, kept until the send starts; none without memory (the send then
	 * uses the stripe). */
	if (tpd_peer_rdma_offer_in(rr, &xh->offer) < 0)
		xh->offer = (struct tpd_peer_offer){ 0 };
	m->xh = xh;
	return 0;
}

void tpd_xh_stop_early(struct tpd_xh *xh, Tpw__V1__Status st, const char *why)
{
	xh->early = st;
	snprintf(xh->early_why, sizeof(xh->early_why), "%s", why ? why : "");
	tpd_xh_cancel(xh);
}

void tpd_xh_peer_xfer_end(struct tpd_peer *pr, void *arg, const Tpw__V1__PeerXferEnd *xe)
{
	struct tpd_xh *xh = arg;
	struct tpb_ep *ep = tpd_peer_ep(pr, xh_mpt()), *oep;
	int status = tpw_status_to_errno(xe->status);
	const char *why = xe->message ? xe->message : tpw_status_name(xe->status);

	if (!ep || !xh->started || !xh->mpt_running)
		return;
	if (xe->rdma) {
		/* The bytes went into the offer (only ever there): its receive ends on the word,
		 * and the stripe's is dropped. */
		xh->gdr = true;
		oep = tpd_peer_ep(pr, xh->ch);
		xh->expected = xh->prepared && xh->rop_running && oep &&
			       tpb_recv_expect(oep, &xh->rop, xe->bytes, status,
					       xe->status ? why : NULL) == 0;
		if (!xh->expected) {
			xh->gdr_status = -EPROTO;
			snprintf(xh->gdr_why, sizeof(xh->gdr_why),
				 "peer says it RDMA-wrote without an offer");
		}
		(void)tpb_cancel(ep, &xh->op);
		return;
	}
	(void)tpb_recv_expect(ep, &xh->op, xe->bytes, status, why);
}
