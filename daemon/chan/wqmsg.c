/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Work queue questions and answers as messages (issue 25 part wqmsg; docs/queues.md, "Questions
 * and answers as messages"). A question or answer is a channel item (chan_int.h: its bytes, and
 * a message's descriptor packed beside it), checked, packed and copied with the channels' own
 * code (chanmsg.c, chanitem.c, chancopy.c): made from a frame's data tail, or copied in once
 * from the sender's shared buffer or memory (WqOp.segment) on the daemon's copy threads; read
 * inline or copied once into the reader's slots (WqOp.segments); an answer held for the owner
 * dropped. Leaves the queues' state, waits and deaths to wq.c. Runs on the daemon's loop thread;
 * copies complete there.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chan_int.h"
#include "chancopy.h"
#include "chanx.h"
#include "config.h"
#include "core.h"
#include "wq_int.h"

/* A copy of a handle's request: in (a submit's or reply's payload into @b, its room held in
 * @q, which stays meanwhile), or out (item @qid's body @b into a reader's slots; @held: the
 * owner's answer, which leaves its hold once copied). The handle is found again by id: it may
 * be gone by then. */
struct wq_copy {
	struct tpd_wqs *ws;
	struct wq *q; /* in only */
	uint64_t h_id, req_id, qid;
	struct wq_body *b;
	bool reply, held;
};

size_t tpd_wq_msg_body_len(const struct wq_body *b)
{
	return b->ci->len;
}

uint64_t tpd_wq_msg_body_charge(const struct wq_body *b)
{
	return tpd_chan_item_charge(b->ci);
}

bool tpd_wq_msg_body_msg(const struct wq_body *b)
{
	return b->ci->desc != NULL;
}

const uint8_t *tpd_wq_msg_body_bytes(const struct wq_body *b)
{
	return tpd_chan_item_bytes(b->ci);
}

int tpd_wq_msg_body_desc(const struct wq_body *b, Tpw__V1__Descriptor **ret)
{
	return tpd_chan_msg_item_desc(b->ci, ret);
}

void tpd_wq_msg_desc_free(Tpw__V1__Descriptor *d)
{
	if (d)
		tpw__v1__descriptor__free_unpacked(d, NULL);
}

void tpd_wq_msg_body_unref(struct wq_body *b)
{
	if (!b || --b->refs)
		return;
	tpd_chan_item_free(b->cs, b->ci);
	free(b);
}

int tpd_wq_msg_body_new(struct tpd_wqs *ws, const Tpw__V1__WqOp *o, const uint8_t *tail, size_t len,
		    struct wq_body **ret, char *why, size_t wl)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(ws->d);
	struct tpd_chans *cs = tpd_daemon_chans(ws->d);
	uint64_t n = o->segment	     ? o->segment->length /* validated: at most 1 TiB */
		     : o->stream_len ? o->stream_len
				     : len;
	struct wq_body *b;
	int r;

	if (o->msg_desc) {
		r = tpd_chan_msg_desc_check(cs, o->msg_desc, n, why, wl);
		if (r < 0)
			return r;
	}
	if (n > TPU_MAX(cfg->wq_bytes_max, cfg->wq_answer_bytes_max))
		return tpu_why(-ENOBUFS, why, wl, "a payload of %llu bytes is above the work "
			       "queue's wq-bytes-max and wq-answer-bytes-max",
			       (unsigned long long)n);
	b = calloc(1, sizeof(*b));
	if (b)
		b->ci = tpd_chan_item_new_copied(cs, n);
	if (!b || !b->ci) {
		free(b);
		return tpu_why(-ENOMEM, why, wl, "out of memory");
	}
	b->refs = 1;
	b->cs = cs;
	if (!o->segment && !o->stream_len && len)
		memcpy(b->ci->data, tail, len);
	if (o->msg_desc && tpd_chan_item_set_desc(b->ci, o->msg_desc) < 0) {
		tpd_wq_msg_body_unref(b);
		return tpu_why(-ENOMEM, why, wl, "out of memory");
	}
	*ret = b;
	return 0;
}

/* The question @qid that handle @h took, or NULL. */
static struct wq_item *question_of(struct wq *q, const struct wq_handle *h, uint64_t qid)
{
	struct wq_item *it;

	tpu_list_for_each(it, &q->taken, node)
		if (it->id == qid && it->taker == h)
			return it;
	return NULL;
}

/* The answer @qid the owner of @q holds, or NULL. */
static struct wq_item *held_of(struct wq *q, uint64_t qid)
{
	struct wq_item *it;

	tpu_list_for_each(it, &q->held, node)
		if (it->id == qid)
			return it;
	return NULL;
}

/* A held answer leaves @q: read or dropped. */
static void held_release(struct wq *q, struct wq_item *it)
{
	tpu_list_remove(&it->node);
	q->n_held--;
	q->answer_bytes -= tpd_wq_msg_body_charge(it->b);
	tpd_wq_item_free(it);
}

/* The copy in of @cp's payload is done (@status): its room in the queue given back, then, if
 * the queue and the handle are still there, the question queued or the question answered. */
static void copy_in_done(struct wq_copy *cp, struct wq_handle *h, int status, const char *why)
{
	struct wq *q = cp->q;
	struct wq_item *it = h && cp->reply ? question_of(q, h, cp->qid) : NULL;
	struct wq_ans a = { 0 };
	char msg[240];

	if (it && it->replying)
		it->replying = false;
	else
		it = NULL; /* requeued (its worker went) and perhaps taken again meanwhile */
	if (status < 0) {
		snprintf(msg, sizeof(msg), "cannot copy the payload in: %s", why ? why : "");
		return h ? tpd_wq_err(h, cp->req_id, status, msg) : (void)0;
	}
	if (!h)
		return;
	if (q->gone)
		return tpd_wq_err(h, cp->req_id, -EPIPE, "the work queue's owner is gone");
	if (cp->reply && !it)
		return tpd_wq_err(h, cp->req_id, -ENOENT, "this handle no longer holds the "
				  "question");
	cp->b->refs++; /* the item's; @cp's goes with @cp */
	if (cp->reply) {
		struct wq_item *ans = tpd_wq_item_new(cp->qid, cp->b);

		if (!ans)
			return tpd_wq_err(h, cp->req_id, -ENOMEM, "out of memory");
		tpd_wq_question_answered(q, it, ans);
		tpd_wq_err(h, cp->req_id, 0, NULL);
		return tpd_wq_serve(q);
	}
	it = tpd_wq_item_new(++q->next_qid, cp->b);
	if (!it)
		return tpd_wq_err(h, cp->req_id, -ENOMEM, "out of memory");
	tpu_list_insert_tail(&q->queued, &it->node);
	q->n_queued++;
	q->bytes += tpd_wq_msg_body_charge(it->b);
	a.qid = it->id;
	tpd_wq_send(h, &h->who, cp->req_id, &a);
	tpd_wq_serve(q);
}

static void copy_in_on_done(void *arg, int status, const char *why)
{
	struct wq_copy *cp = arg;
	struct wq *q = cp->q;
	struct wq_handle *h = tpd_wq_handle_by_id(cp->ws, cp->h_id);

	q->n_copies--;
	if (h)
		h->copies--;
	if (!q->gone && cp->reply)
		q->answer_bytes -= tpd_wq_msg_body_charge(cp->b);
	if (!q->gone && !cp->reply) {
		q->n_arriving--;
		q->bytes -= tpd_wq_msg_body_charge(cp->b);
	}
	copy_in_done(cp, h, status, why);
	tpd_wq_msg_body_unref(cp->b);
	free(cp);
	tpd_wq_maybe_free(q);
}

/* Starts the copy @cp of @o's payload into @x->dst: from the client's memory, or, for a
 * handle of a peer link (@o->stream_len), over the link's data connections once the far daemon
 * is told where to send it (WqReply.xfer_id). Return: 0 or -errno (@why says why). */
static int copy_in_start(struct tpd_wqs *ws, struct wq_handle *h, const Tpw__V1__WqOp *o,
			 struct tpb_xfer *x, struct wq_copy *cp, char *why, size_t wl)
{
	struct wq_ans a = { 0 };
	int r;

	if (!h->who.pr) {
		r = tpd_chan_copy_resolve(h->who.s, o->segment, &x->src, why, wl);
		if (r < 0)
			return r;
		r = tpd_chan_copy_start(ws->d, x, 1, copy_in_on_done, cp);
		tpd_chan_copy_put(&x->src); /* the copy holds its own reference */
		return r < 0 ? tpu_why(r, why, wl, "cannot copy the payload in") : 0;
	}
	/* A remote daemon's bytes: what one link has arriving is bounded (chan-peer-bytes-max). */
	r = tpd_chanx_big_admit_bytes(ws->d, h->who.pr, x->len, why, wl);
	if (r == 0)
		r = tpd_chanx_big_recv(ws->d, h->who.pr, x, 1, copy_in_on_done, cp, &a.xfer_id);
	if (r < 0)
		return r == -ENOBUFS ? r : tpu_why(r, why, wl, "cannot receive the payload over "
						   "the link's data connections");
	tpd_wq_send(h, &h->who, o->req_id, &a);
	return 0;
}

void tpd_wq_msg_copy_in(struct tpd_wqs *ws, struct wq_handle *h, const Tpw__V1__WqOp *o,
			struct wq_body *b, struct wq_item *question)
{
	struct tpb_xfer x = { .len = tpd_wq_msg_body_len(b) };
	struct wq *q = h->q;
	struct wq_copy *cp;
	char why[200];
	int r;

	if (h->copies >= WQ_COPIES_PER_HANDLE) {
		tpd_wq_msg_body_unref(b);
		return tpd_wq_err(h, o->req_id, -ENOBUFS, "64 copies of this handle are running");
	}
	cp = calloc(1, sizeof(*cp));
	r = cp ? 0 : tpu_why(-ENOMEM, why, sizeof(why), "out of memory");
	if (r == 0) {
		x.dst = (struct tpb_mem){ .loc = TPB_LOC_LOCAL,
					  .addr = (uint64_t)(uintptr_t)b->ci->data };
		*cp = (struct wq_copy){ .ws = ws, .q = q, .h_id = h->id, .req_id = o->req_id,
					.qid = question ? question->id : 0, .b = b,
					.reply = question != NULL };
		r = copy_in_start(ws, h, o, &x, cp, why, sizeof(why));
	}
	if (r < 0) {
		free(cp);
		tpd_wq_msg_body_unref(b);
		return tpd_wq_err(h, o->req_id, r, why);
	}
	q->n_copies++;
	h->copies++;
	if (question) {
		question->replying = true;
		q->answer_bytes += tpd_wq_msg_body_charge(b);
	} else {
		q->n_arriving++;
		q->bytes += tpd_wq_msg_body_charge(b);
	}
}

static void copy_out_on_done(void *arg, int status, const char *why)
{
	struct wq_copy *cp = arg;
	struct wq_handle *h = tpd_wq_handle_by_id(cp->ws, cp->h_id);
	struct wq_ans a = { .qid = cp->qid, .copied = true };
	struct wq_item *it;
	char msg[240];

	if (h && h->who.pr) /* sent over the link: the far daemon checks its bytes */
		a.copied_len = tpd_wq_msg_body_len(cp->b);

	if (h)
		h->copies--;
	if (h && status < 0) {
		snprintf(msg, sizeof(msg), "cannot copy the item into the read's slots: %s",
			 why ? why : "");
		tpd_wq_err(h, cp->req_id, status, msg);
	} else if (h) {
		it = cp->held ? held_of(h->q, cp->qid) : NULL;
		if (it)
			held_release(h->q, it);
		tpd_wq_send(h, &h->who, cp->req_id, &a);
	}
	tpd_wq_msg_body_unref(cp->b);
	free(cp);
}

/* Copies @it's bytes into the slots @o names (local clients only, validated) and answers
 * once done. */
static void read_into(struct tpd_wqs *ws, struct wq_handle *h, const Tpw__V1__WqOp *o,
		      struct wq_item *it, bool held)
{
	struct tpb_xfer *x;
	struct wq_copy *cp;
	char why[200];
	int r;

	if (h->copies >= WQ_COPIES_PER_HANDLE)
		return tpd_wq_err(h, o->req_id, -ENOBUFS, "64 copies of this handle are running");
	r = tpd_chan_msg_slots(h->who.s, o->segments, o->n_segments, tpd_wq_msg_body_len(it->b), &x,
			       why, sizeof(why));
	if (r < 0)
		return tpd_wq_err(h, o->req_id, r, why);
	tpd_chan_item_srcs(it->b->ci, x, o->n_segments);
	cp = calloc(1, sizeof(*cp));
	r = -ENOMEM;
	if (cp) {
		*cp = (struct wq_copy){ .ws = ws, .h_id = h->id, .req_id = o->req_id,
					.qid = it->id, .b = it->b, .held = held };
		r = tpd_chan_copy_start(ws->d, x, o->n_segments, copy_out_on_done, cp);
	}
	tpd_chan_msg_slots_put(x, o->n_segments); /* the copy holds its own references */
	if (r < 0) {
		free(cp);
		return tpd_wq_err(h, o->req_id, r, "cannot copy the item into the read's slots");
	}
	it->b->refs++;
	h->copies++;
}

/* Sends @it's bytes to the receive @o->xfer_id of the far daemon of @h (a peer link's handle,
 * peer minor >= 11) over the link's data connections and answers once sent (msg_copied, with
 * the bytes sent). */
static void read_remote(struct tpd_wqs *ws, struct wq_handle *h, const Tpw__V1__WqOp *o,
			struct wq_item *it, bool held)
{
	struct tpb_xfer x = { .len = tpd_wq_msg_body_len(it->b) };
	struct wq_copy *cp;
	char why[200];
	int r;

	if (h->copies >= WQ_COPIES_PER_HANDLE)
		return tpd_wq_err(h, o->req_id, -ENOBUFS, "64 copies of this handle are running");
	/* The far daemon takes exactly the item's bytes (the descriptor's length) and refuses
	 * any other count: a read naming more is refused here, before the item leaves. */
	if (x.len != o->room) {
		snprintf(why, sizeof(why), "an item of %zu bytes for a read's room of %llu: a read "
			 "from another host names exactly the message's bytes", (size_t)x.len,
			 (unsigned long long)o->room);
		return tpd_wq_err(h, o->req_id, x.len > o->room ? -EMSGSIZE : -EINVAL, why);
	}
	cp = calloc(1, sizeof(*cp));
	if (!cp)
		return tpd_wq_err(h, o->req_id, -ENOMEM, "out of memory");
	*cp = (struct wq_copy){ .ws = ws, .h_id = h->id, .req_id = o->req_id, .qid = it->id,
				.b = it->b, .held = held };
	x.src = (struct tpb_mem){ .loc = TPB_LOC_LOCAL,
				  .addr = (uint64_t)(uintptr_t)tpd_wq_msg_body_bytes(it->b) };
	x.dst = (struct tpb_mem){ .loc = TPB_LOC_REMOTE, .addr = o->xfer_id };
	r = tpd_chanx_big_copy_out(h->who.pr, &x, copy_out_on_done, cp);
	if (r < 0) {
		free(cp);
		return tpd_wq_err(h, o->req_id, r, "cannot send the item over the link's data "
				  "connections");
	}
	it->b->refs++;
	h->copies++;
}

void tpd_wq_msg_read(struct tpd_wqs *ws, struct wq_handle *h, const Tpw__V1__WqOp *o)
{
	bool held = o->op == TPW__V1__WQ_OP_KIND__WQ_OP_ANSWER;
	struct wq *q = h->q;
	struct wq_item *it = held ? held_of(q, o->question_id) : question_of(q, h, o->question_id);
	struct wq_ans a = { .it = it };
	size_t len;
	char why[240];

	if (held && q->owner != h)
		return tpd_wq_err(h, o->req_id, -EACCES, "only the work queue's owner reads "
				  "answers");
	if (!it || !it->b) {
		snprintf(why, sizeof(why), "this handle holds no %s %llu (take its descriptor "
			 "first)", held ? "answer to question" : "question",
			 (unsigned long long)o->question_id);
		return tpd_wq_err(h, o->req_id, -ENOENT, why);
	}
	if (o->n_segments)
		return read_into(ws, h, o, it, held);
	if (o->xfer_id && tpd_wq_msg_body_len(it->b))
		return read_remote(ws, h, o, it, held);
	len = tpd_wq_msg_body_len(it->b);
	if (len > tpd_daemon_limits(ws->d)->inline_max)
		return tpd_wq_err(h, o->req_id, -EMSGSIZE, "the item is above the inline limit: "
				  "name where it goes");
	if (!tpd_wq_fits_link(h, len, false, "the item", why, sizeof(why)))
		return tpd_wq_err(h, o->req_id, -EMSGSIZE, why);
	tpd_wq_send(h, &h->who, o->req_id, &a);
	if (held)
		held_release(q, it);
}

void tpd_wq_msg_drop(struct wq_handle *h, const Tpw__V1__WqOp *o)
{
	struct wq *q = h->q;
	struct wq_item *it;

	if (q->owner != h)
		return tpd_wq_err(h, o->req_id, -EACCES, "only the work queue's owner drops "
				  "answers");
	it = held_of(q, o->question_id);
	if (!it)
		return tpd_wq_err(h, o->req_id, -ENOENT, "the owner holds no such answer");
	held_release(q, it);
	tpd_wq_err(h, o->req_id, 0, NULL);
}
