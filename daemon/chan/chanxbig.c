/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Large channel items and work queue messages across hosts (chanx_int.h; issue 25 part xhost,
 * peer minor >= 6, queues >= 11). The forwarding side: a client's items by reference resolved in
 * its own memory and sent once the hosting daemon admitted the WRITE (SUBMIT, REPLY), a READ's
 * (message read's) allocation receiving the item before the answer comes, and the answers of
 * both; the hosting side's sends and receives for chan.c and wqmsg.c. The bytes
 * move over the link's data connections (chanstream.c). Not responsible for the ops themselves
 * (chanx.c) nor for the channel (chan.c). Everything runs on the daemon's loop thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chancopy.h"
#include "chanstream.h"
#include "chanx_int.h"
#include "config.h"
#include "core.h"
#include "peer.h"
#include "session.h"
#include "validate.h"

static void xs_on_done(void *arg, int status, const char *why);

void tpd_chanx_big_put(struct xlarge *lg)
{
	for (size_t i = 0; lg && i < lg->n; i++)
		tpd_chan_copy_put(&lg->mem[i]);
	if (lg) {
		free(lg->mem);
		free(lg->len);
		*lg = (struct xlarge){ 0 };
	}
}

int tpd_chanx_big_read_start(struct tpd_chanx *x, struct xop *xo, struct xlarge *lg)
{
	struct xstream *xs = calloc(1, sizeof(*xs));
	int r;

	if (!xs) {
		tpd_chanx_big_put(lg);
		return -ENOMEM;
	}
	*xs = (struct xstream){ .xo = xo, .x = x, .pr = xo->pr };
	r = tpd_chan_stream_recv(xo->pr, lg->mem, lg->len, 1, xs_on_done, xs, &xs->xfer_id,
				 &xs->cs);
	xo->room = lg->len[0];
	free(lg->mem); /* the references are the transfer's now (also on failure) */
	free(lg->len);
	*lg = (struct xlarge){ 0 };
	if (r < 0) {
		free(xs);
		return r;
	}
	xo->xs = xs;
	return 0;
}

int tpd_chanx_big_segs(struct tpd_session *s, Tpw__V1__Segment *const *segs, size_t n, bool read,
		       struct xlarge *lg, protobuf_c_boolean *streamed, char *why, size_t wl)
{
	int r = 0;

	*lg = (struct xlarge){ .read = read, .mem = calloc(n ? n : 1, sizeof(*lg->mem)),
			       .len = calloc(n ? n : 1, sizeof(*lg->len)) };
	if (!lg->mem || !lg->len) {
		tpd_chanx_big_put(lg);
		snprintf(why, wl, "out of memory");
		return -ENOMEM;
	}
	for (size_t i = 0; r == 0 && i < n; i++) {
		const Tpw__V1__Segment *g = segs[i];

		if (g->loc_case == TPW__V1__SEGMENT__LOC_INLINE_OFF)
			continue;
		r = tpd_chan_copy_resolve(s, g, &lg->mem[lg->n], why, wl);
		if (r == 0) {
			lg->len[lg->n++] = g->length;
			if (streamed)
				streamed[i] = true;
		}
	}
	if (r < 0)
		tpd_chanx_big_put(lg);
	return r;
}

int tpd_chanx_big_get(struct tpd_session *s, const Tpw__V1__ChanOp *o, struct xlarge *lg,
		      protobuf_c_boolean **ret_streamed, char *why, size_t wl)
{
	bool read = o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	size_t n = read ? 1 : o->n_segments;
	protobuf_c_boolean *streamed = read ? NULL : calloc(n, sizeof(*streamed));
	int r;

	if (!read && !streamed) {
		snprintf(why, wl, "out of memory");
		return -ENOMEM;
	}
	r = tpd_chanx_big_segs(s, o->segments, o->n_segments, read, lg, streamed, why, wl);
	if (r < 0) {
		free(streamed);
		return r;
	}
	*ret_streamed = streamed;
	return 0;
}

/* READ @xo's item was copied into the client's allocation and its answer came: tell the client
 * (an error if the transfer failed: the item is lost then) and forget @xo. */
static void read_copied(struct xop *xo)
{
	Tpw__V1__ChanReply a = TPW__V1__CHAN_REPLY__INIT;
	Tpw__V1__WqReply w = TPW__V1__WQ_REPLY__INIT;
	uint64_t len = xo->got_len;

	if (xo->kind == X_WQ) {
		w.req_id = xo->req_id;
		w.wq_id = xo->local_id;
		w.closed = xo->got_closed;
		w.status = tpw_status_from_errno(xo->recv_err);
		w.message = xo->recv_err < 0 ? xo->recv_why : (char *)"";
		w.question_id = xo->got_qid;
		w.msg_copied = xo->recv_err == 0;
		if (xo->s)
			tpd_chanx_to_client_wq(xo->s, &w);
		return tpd_chanx_xop_free(xo);
	}
	a.req_id = xo->req_id;
	a.chan_id = xo->local_id;
	a.closed = xo->got_closed;
	a.status = tpw_status_from_errno(xo->recv_err);
	if (xo->recv_err < 0) {
		a.message = xo->recv_why;
	} else {
		a.n_lengths = 1;
		a.lengths = &len;
		a.copied = true;
		a.msg_taken = xo->got_msg;
	}
	if (xo->s)
		tpd_chanx_to_client(xo->s, &a, NULL);
	tpd_chanx_xop_free(xo);
}

/* Tells the hosting daemon of @pr that the items of its receive @xfer_id do not come (@err, @why):
 * that receive ends, and the WRITE it belongs to fails there, leaving no item. */
static void send_xfer_end(struct tpd_peer *pr, uint64_t xfer_id, int err, const char *why)
{
	Tpw__V1__PeerXferEnd xe = TPW__V1__PEER_XFER_END__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	if (!tpd_peer_is_up(pr))
		return; /* its receive ends with the link */
	xe.xfer_id = xfer_id;
	xe.status = tpw_status_from_errno(err);
	xe.message = (char *)(why ? why : "");
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_XFER_END;
	m.chan_xfer_end = &xe;
	tpd_peer_send(pr, &m, NULL, 0);
}

/* A large item's transfer ended (@arg: its struct xstream). A send that stopped early tells the
 * hosting daemon, whose receive then ends with its status; a READ's receive waits for its answer
 * (or answers with it, if it came first). */
static void xs_on_done(void *arg, int status, const char *why)
{
	struct xstream *xs = arg;
	struct xop *xo = xs->xo;

	if (xo)
		xo->xs = NULL;
	if (xs->send && status < 0)
		send_xfer_end(xs->pr, xs->xfer_id, status, why);
	if (xo && !xs->send) {
		xo->recvd = true;
		xo->recv_err = status;
		snprintf(xo->recv_why, sizeof(xo->recv_why), "%s host %s: the item did not "
			 "arrive whole: %s", xo->kind == X_WQ ? "work queue" : "channel",
			 tpd_peer_name(xs->pr), why ? why : "");
		if (xo->got)
			read_copied(xo);
	}
	free(xs);
}

/* The hosting daemon admitted WRITE @xo's batch: send its items by reference under @xfer_id.
 * Return: 0, or -errno (the client is answered with it). */
static int write_go(struct tpd_chanx *x, struct xop *xo, uint64_t xfer_id)
{
	struct xstream *xs = calloc(1, sizeof(*xs));
	int r;

	if (!xs)
		return -ENOMEM;
	*xs = (struct xstream){ .xo = xo, .x = x, .pr = xo->pr, .xfer_id = xfer_id, .send = true };
	r = tpd_chan_stream_send(xo->pr, xfer_id, xo->out_mem, xo->out_len, xo->n_out, xs_on_done,
				 xs, &xs->cs);
	free(xo->out_mem); /* the references are the transfer's now (also on failure) */
	free(xo->out_len);
	xo->out_mem = NULL;
	xo->out_len = NULL;
	xo->n_out = 0;
	if (r < 0) {
		free(xs);
		return r;
	}
	xo->xs = xs;
	return 0;
}

bool tpd_chanx_big_reply(struct tpd_chanx *x, struct xop *xo, struct tpd_peer *pr,
			 const struct xbig_ans *r)
{
	const char *what = xo && xo->kind == X_WQ ? "work queue" : "channel";
	int err;

	if (!xo && r->xfer_id) /* its writer is gone: the hosting daemon waits for nothing */
		send_xfer_end(pr, r->xfer_id, -ECANCELED, "the writer is gone");
	if (!xo)
		return false;
	if (r->xfer_id) { /* validated: no item */
		err = xo->n_out && r->ok ? write_go(x, xo, r->xfer_id) : -EPROTO;
		if (err == 0)
			return true; /* the op's answer follows once the items arrived */
		/* The hosting daemon waits for bytes that never come: its receive ends now. */
		send_xfer_end(pr, r->xfer_id, err, strerror(-err));
		tpd_chanx_refuse(xo->kind, xo->s, xo->req_id, xo->local_id, err, "%s host %s: "
				 "cannot send the items: %s", what, tpd_peer_name(pr),
				 strerror(-err));
		tpd_chanx_xop_free(xo);
		return true;
	}
	if (r->copied) {
		if (!xo->xs && !xo->recvd) { /* no receive of ours: a lie */
			tpd_chanx_refuse(xo->kind, xo->s, xo->req_id, xo->local_id, -EPROTO,
					 "%s host %s answered with an item it had nowhere to copy",
					 what, tpd_peer_name(pr));
			tpd_chanx_xop_free(xo);
			return true;
		}
		/* A queue's read names exactly its item's bytes (the descriptor's length). */
		if (r->len > xo->room || (xo->kind == X_WQ && r->len != xo->room)) {
			tpd_chanx_refuse(xo->kind, xo->s, xo->req_id, xo->local_id, -EPROTO,
					 "%s host %s answered with an item of %llu bytes for a "
					 "read's room of %llu", what, tpd_peer_name(pr),
					 (unsigned long long)r->len, (unsigned long long)xo->room);
			tpd_chanx_xop_free(xo);
			return true;
		}
		if (xo->xs)
			tpd_chan_stream_shorten(xo->xs->cs, r->len);
		xo->got = true;
		xo->got_len = r->len;
		xo->got_closed = r->closed;
		xo->got_msg = r->msg;
		xo->got_qid = r->qid;
		if (xo->recvd)
			read_copied(xo);
		return true; /* else once the bytes are in */
	}
	if (xo->xs && !xo->xs->send) { /* a read answered otherwise: nothing comes in */
		tpd_chan_stream_cancel(xo->xs->cs);
		xo->xs->xo = NULL;
		xo->xs = NULL;
	}
	return false;
}

/* ---- the hosting side ---------------------------------------------------------------------- */

int tpd_chanx_big_admit_bytes(struct tpd_daemon *d, const struct tpd_peer *pr, uint64_t bytes,
			      char *why, size_t wl)
{
	uint64_t max = tpd_daemon_cfg(d)->chan_peer_bytes_max, now;

	if (!bytes)
		return 0;
	now = tpd_chan_stream_recv_bytes(pr);
	if (now <= max && bytes <= max - now)
		return 0;
	snprintf(why, wl, "%llu item bytes of this peer would be arriving on %.60s, above "
		 "chan-peer-bytes-max %llu", (unsigned long long)(now + bytes),
		 tpd_peers_hostname(d), (unsigned long long)max);
	return -ENOBUFS;
}

int tpd_chanx_big_admit(struct tpd_daemon *d, const struct tpd_peer *pr, const Tpw__V1__ChanOp *o,
			char *why, size_t wl)
{
	uint64_t bytes = 0;

	for (size_t i = 0; i < o->n_streamed; i++) /* validated: no overflow */
		bytes += o->streamed[i] ? o->lengths[i] : 0;
	return tpd_chanx_big_admit_bytes(d, pr, bytes, why, wl);
}

int tpd_chanx_big_recv(struct tpd_daemon *d, struct tpd_peer *pr, const struct tpb_xfer *x,
		       size_t n, tpd_chan_copy_done_fn done, void *arg, uint64_t *ret_xfer_id)
{
	_cleanup_free_ struct tpb_mem *mem = calloc(n ? n : 1, sizeof(*mem));
	_cleanup_free_ uint64_t *len = calloc(n ? n : 1, sizeof(*len));
	struct tpd_chan_stream *cs;
	int rc;

	if (!mem || !len)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) { /* the daemon's own memory: no reference to take */
		mem[i] = x[i].dst;
		len[i] = x[i].len;
	}
	rc = tpd_chan_stream_recv(pr, mem, len, n, done, arg, ret_xfer_id, &cs);
	if (rc < 0)
		return rc;
	/* A sender that stops while its link stays up: the reserved room comes back. */
	tpd_chan_stream_deadline(cs, tpd_daemon_base(d), tpd_daemon_cfg(d)->peer_timeout_ms);
	return 0;
}

int tpd_chanx_big_copy_in(struct tpd_daemon *d, struct tpd_peer *pr, uint64_t req_id,
			  uint64_t chan_id, const struct tpb_xfer *x, size_t n,
			  tpd_chan_copy_done_fn done, void *arg)
{
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	uint64_t id;
	int rc = tpd_chanx_big_recv(d, pr, x, n, done, arg, &id);

	if (rc < 0)
		return rc;
	r.req_id = req_id;
	r.status = tpw_status_from_errno(0);
	r.chan_id = chan_id;
	r.xfer_id = id;
	tpd_chanx_reply(pr, &r, NULL, 0);
	return 0;
}

int tpd_chanx_big_copy_out(struct tpd_peer *pr, const struct tpb_xfer *x,
			   tpd_chan_copy_done_fn done, void *arg)
{
	struct tpb_mem src = x->src; /* the stream takes references of its own (a lent item's
				      * buffer stays the item's too) */

	if (src.buf)
		src.buf = tpb_buffer_ref(src.buf);
	if (src.proc)
		src.proc = tpb_proc_ref(src.proc);
	return tpd_chan_stream_send(pr, x->dst.addr, &src, &x->len, 1, done, arg, NULL);
}
