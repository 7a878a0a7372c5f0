/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Channel items as messages (issue 25 part msg; docs/channels.md, "Items as messages"): a
 * write's message descriptors checked (ChanOp.msgs) and charged, a held item answered by its
 * descriptor (ChanReply.msg_held) and a message read's take of the item its handle holds:
 * inline, into the reader's slots (one copy each, by chancopy.c, or over a peer link), or
 * dropped. The item itself is a byte item (chanitem.c) with its descriptor packed beside it;
 * when items move is chanio.c's. Everything runs on the daemon's loop thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chan_int.h"
#include "chancopy.h"
#include "core.h"
#include "peer.h"
#include "tpu.h"
#include "validate.h"

int tpd_chan_msg_write_check(struct tpd_chans *cs, const Tpw__V1__ChanOp *o,
			     uint64_t *ret_bytes, char *why, size_t wl)
{
	uint64_t bytes = 0;
	char sub[160];
	int r;

	if (!o->n_msgs)
		return 0;
	if (o->n_msgs != o->n_lengths)
		return tpu_why(-EINVAL, why, wl, "%zu message descriptors for %zu items",
			       o->n_msgs, o->n_lengths);
	for (size_t i = 0; i < o->n_msgs; i++) {
		r = tpd_chan_msg_desc_check(cs, o->msgs[i], o->lengths[i], sub, sizeof(sub));
		if (r < 0)
			return tpu_why(r, why, wl, "item %zu: %s", i, sub);
		/* bounded by the frame: no overflow */
		bytes += protobuf_c_message_get_packed_size(&o->msgs[i]->base);
	}
	*ret_bytes += bytes;
	return 0;
}

int tpd_chan_msg_desc_check(struct tpd_chans *cs, const Tpw__V1__Descriptor *m, uint64_t len,
			    char *why, size_t wl)
{
	return tpw_chan_msg_check(m, len, tpd_daemon_limits(cs->d), why, wl);
}

int tpd_chan_msg_item_desc(const struct chan_item *it, Tpw__V1__Descriptor **ret)
{
	Tpw__V1__Descriptor *d = NULL;

	if (it->desc && !(d = tpw__v1__descriptor__unpack(NULL, it->desc_len, it->desc)))
		return -ENOMEM;
	*ret = d;
	return 0;
}

void tpd_chan_msg_answer_held(const struct chan_handle *h, uint64_t req_id,
			      const struct chan_item *it)
{
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	Tpw__V1__Descriptor *d;

	if (tpd_chan_msg_item_desc(it, &d) < 0)
		return tpd_chan_answer(&h->who, req_id, -ENOMEM, "out of memory", h->id,
				       h->c->closed, NULL);
	r.req_id = req_id;
	r.status = tpw_status_from_errno(0);
	r.chan_id = h->id;
	r.closed = h->c->closed;
	r.held_len = it->len;
	r.msg_held = true;
	r.msg_desc = d;
	tpd_chan_reply_send(&h->who, &r, NULL, 0);
	if (d)
		tpw__v1__descriptor__free_unpacked(d, NULL);
}

/* Answers @h's take @req_id: done, with @it inline (NULL: dropped). */
static void answer_taken(const struct chan_handle *h, uint64_t req_id, const struct chan_item *it)
{
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	struct iovec tail = { 0 };
	uint64_t len = it ? it->len : 0;

	r.req_id = req_id;
	r.status = tpw_status_from_errno(0);
	r.chan_id = h->id;
	r.closed = h->c->closed;
	r.msg_taken = true;
	if (it) {
		r.n_lengths = 1;
		r.lengths = &len;
		tail.iov_base = (void *)tpd_chan_item_bytes(it);
		tail.iov_len = it->len;
	}
	tpd_chan_reply_send(&h->who, &r, &tail, it && it->len ? 1 : 0);
}

/* The held item @it of @h leaves its channel: answered inline (@keep) or dropped. */
static void take_now(struct chan_handle *h, uint64_t req_id, struct chan_item *it, bool keep)
{
	struct chan *c = h->c;

	h->held = NULL;
	answer_taken(h, req_id, keep ? it : NULL);
	tpd_chan_item_done(c, it);
	tpd_chan_io_serve(c); /* room for writers; a closed channel may be drained now */
}

int tpd_chan_msg_slots(struct tpd_session *s, Tpw__V1__Segment *const *segs, size_t n,
		       uint64_t len, struct tpb_xfer **ret, char *why, size_t wl)
{
	struct tpb_xfer *x;
	uint64_t total = 0;
	size_t k = 0;
	int r = 0;

	for (size_t i = 0; i < n; i++)
		total += segs[i]->length; /* validated: at most 1 TiB each */
	if (total != len)
		return tpu_why(-EINVAL, why, wl, "slots of %llu bytes for an item of %llu",
			       (unsigned long long)total, (unsigned long long)len);
	x = calloc(n ? n : 1, sizeof(*x));
	if (!x)
		return tpu_why(-ENOMEM, why, wl, "out of memory");
	for (; k < n && r == 0; k++) {
		r = tpd_chan_copy_resolve(s, segs[k], &x[k].dst, why, wl);
		x[k].len = segs[k]->length;
	}
	if (r < 0) {
		tpd_chan_msg_slots_put(x, k);
		return r;
	}
	*ret = x;
	return 0;
}

void tpd_chan_msg_slots_put(struct tpb_xfer *x, size_t n)
{
	for (size_t i = 0; x && i < n; i++)
		tpd_chan_copy_put(&x[i].dst);
	free(x);
}

/* The take of @h's held item @it into the reader's slots, @o's segments back to back (local
 * sessions; validated: each not empty, at most segments_max). Return: 0 (copying: answered
 * once done) or -errno (the reason in @why, the item still held). */
static int take_into_slots(struct chan_handle *h, const Tpw__V1__ChanOp *o, struct chan_item *it,
			   char *why, size_t wl)
{
	struct tpb_xfer *x;
	int r = tpd_chan_msg_slots(h->who.s, o->segments, o->n_segments, it->len, &x, why, wl);

	if (r < 0)
		return r;
	h->held = NULL; /* answered by the copy, or given back to the head on failure */
	tpd_chan_io_copy_out(h, o->req_id, it, x, o->n_segments, true);
	tpd_chan_msg_slots_put(x, o->n_segments); /* the copy holds its own references */
	return 0;
}

void tpd_chan_msg_take(struct tpd_chans *cs, struct chan_handle *h, const Tpw__V1__ChanOp *o)
{
	uint32_t inline_max = tpd_daemon_limits(cs->d)->inline_max;
	struct chan_item *it = h->held;
	struct tpb_xfer x = { 0 };
	char why[200];
	int r;

	if (!it)
		return tpd_chan_answer(&h->who, o->req_id, -ENOENT, "this handle holds no item "
				       "(read its descriptor first)", h->id, h->c->closed, NULL);
	if (o->msg_drop)
		return take_now(h, o->req_id, it, false);
	if (!o->n_segments && !o->xfer_id) {
		if (it->len > inline_max)
			return tpd_chan_answer_len(h, o->req_id, -EMSGSIZE, "the held item is above "
						   "the inline limit: name where it goes", it->len);
		/* a reader on another host takes a message inline: within that daemon's frames,
		 * whose limit may be below ours (a larger frame would fail the whole link) */
		if (h->who.pr && it->len > tpd_peer_chan_tail_max(h->who.pr))
			return tpd_chan_answer_len(h, o->req_id, -EMSGSIZE, "the held item is above "
						   "what crosses inline to the reader's host (its "
						   "frame-max less 64 KiB)", it->len);
		return take_now(h, o->req_id, it, true);
	}
	if (o->xfer_id) { /* a peer's: the forwarding daemon's receive (validated: peers only) */
		if (o->room < it->len)
			return tpd_chan_answer_len(h, o->req_id, -EMSGSIZE, "the held item does "
						   "not fit the read's room", it->len);
		x.dst = (struct tpb_mem){ .loc = TPB_LOC_REMOTE, .addr = o->xfer_id };
		x.len = it->len;
		h->held = NULL;
		(void)tpd_chan_io_copy_out(h, o->req_id, it, &x, 1, true);
		return;
	}
	r = take_into_slots(h, o, it, why, sizeof(why));
	if (r < 0)
		tpd_chan_answer(&h->who, o->req_id, r, why, h->id, h->c->closed, NULL);
}
