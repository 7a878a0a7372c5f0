/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Channel items as messages (chan_int.h; docs/channels.md, "Items as messages"):
 * tp_chan_write_msgs() (a message as one item: its parts by reference when there is one,
 * gathered otherwise, CUDA tensors copied to host memory first, its descriptor beside it),
 * tp_chan_read_descriptor() (the held item's descriptor), tp_chan_read_msg() (the item into the
 * reader's slots: inline, scattered by the reply handler, or copied by the daemon into shared
 * buffers and staging) and tp_chan_descriptor_free() (the held item dropped); and what a call
 * that gave up waiting for the daemon leaves on the handle: a message read's late descriptor
 * (the daemon holds its item), a take's late item (the daemon no longer has it: read from here,
 * or written back at release). Leaves the requests and their answers to chan.c, segments and
 * staging buffers to chanwrite.c.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "chan_int.h"
#include "internal.h"
#include "msgitem.h"
#include "validate.h"

int tpc_chan_msg_on_held(struct tp_context *ctx, struct chan_req *cr,
			 const Tpw__V1__ChanReply *m)
{
	int r = tpc_msgitem_desc_check(ctx, m->msg_desc, m->held_len);

	if (r < 0)
		return r;
	free(cr->desc);
	cr->desc = (struct tp_descriptor *)tpc_msgitem_desc_new(m->msg_desc, m->held_len);
	return cr->desc ? 0 : tpc_error(-ENOMEM, "out of memory for a descriptor");
}

int tpc_chan_msg_on_taken(struct chan_req *cr, const Tpw__V1__ChanReply *m, const uint8_t *tail)
{
	const struct tp_descriptor *d = cr->scatter_desc;
	const struct tp_allocation *a = cr->scatter;

	if (cr->msg_take) { /* its caller gave up: the item's bytes kept for the handle */
		if (m->n_lengths != 1 || m->lengths[0] != ((struct tpc_msg_desc *)d)->len)
			return tpc_error(-EPROTO, "a message item answered with %llu bytes",
					 (unsigned long long)(m->n_lengths ? m->lengths[0] : 0));
		cr->host = malloc(m->lengths[0] ? m->lengths[0] : 1);
		if (!cr->host)
			return tpc_error(-ENOMEM, "out of memory for a late item");
		if (m->lengths[0]) /* (an empty item may come without a tail) */
			memcpy(cr->host, tail, m->lengths[0]);
		return 0;
	}
	if (!a || m->n_lengths != 1 || m->lengths[0] != ((struct tpc_msg_desc *)d)->len)
		return tpc_error(-EPROTO, "a message item answered with %llu bytes, not %llu",
				 (unsigned long long)(m->n_lengths ? m->lengths[0] : 0),
				 (unsigned long long)((struct tpc_msg_desc *)d)->len);
	tpc_msgitem_scatter(d, a, tail, cr->host);
	return 0;
}

/* ---- writing ------------------------------------------------------------------------------- */

TP_EXPORT int tp_chan_write_msgs(struct tp_chan *ch, const struct tp_message *msgs, size_t n,
				 int timeout_ms)
{
	struct tpc_msg_batch b = { 0 };
	size_t np = 0, nt = 0, kp = 0, kt = 0;
	uint64_t len;
	int r = 0;

	if (!ch || !msgs || n == 0)
		return tpc_error(-EINVAL, "tp_chan_write_msgs: no message");
	if (ch->ctx->daemon_minor < TPW_MINOR_CHAN_MSG)
		return tpc_error(-EOPNOTSUPP, "channel '%s': the daemon speaks protocol minor %u: "
				 "items are byte strings (minor %u takes messages)", ch->name,
				 ch->ctx->daemon_minor, TPW_MINOR_CHAN_MSG);
	if (n > ch->ctx->lim.segments_max)
		return tpc_error(-EMSGSIZE, "a batch of %zu items exceeds the daemon's %u", n,
				 ch->ctx->lim.segments_max);
	for (size_t k = 0; k < n && r == 0; k++) {
		r = tpc_msgitem_check(ch->ctx, &msgs[k], k, &len);
		np += msgs[k].n_payloads;
		nt += msgs[k].n_tensors;
	}
	if (r == 0)
		r = tpc_msgitem_batch_alloc(&b, n, np, nt);
	for (size_t k = 0; r == 0 && k < n; k++) {
		tpc_msgitem_wire(&msgs[k], &b.w[k], b.pd + kp, b.pp + kp, b.td + kt, b.tp + kt,
			 b.dev + 2 * kt);
		b.wp[k] = &b.w[k];
		kp += msgs[k].n_payloads;
		kt += msgs[k].n_tensors;
		tpc_msgitem_check(ch->ctx, &msgs[k], k, &len); /* checked above: its length */
		r = tpc_msgitem_gather(ch->ctx, &msgs[k], len, &b.items[k], &b.gather[k]);
	}
	if (r == 0)
		r = tpc_chan_write_items(ch, b.items, n, b.wp, timeout_ms);
	tpc_msgitem_batch_free(&b, n, r == -EINPROGRESS);
	return r;
}

/* ---- reading ------------------------------------------------------------------------------- */

static int msg_minor(struct tp_chan *ch, const char *what)
{
	if (ch->ctx->daemon_minor >= TPW_MINOR_CHAN_MSG)
		return 0;
	return tpc_error(-EOPNOTSUPP, "%s: channel '%s': the daemon speaks protocol minor %u "
			 "(minor %u reads messages)", what, ch->name, ch->ctx->daemon_minor,
			 TPW_MINOR_CHAN_MSG);
}

/* Frees message read or take @cr, the descriptor it holds and a take's kept bytes. */
static void msg_req_free(struct chan_req *cr)
{
	if (cr->desc)
		((struct tpc_msg_desc *)cr->desc)->magic = 0;
	free(cr->desc);
	cr->desc = NULL;
	free(cr->host);
	cr->host = NULL;
	tpc_chan_req_free(cr);
}

/* Whether @ch's caller holds a descriptor of an item the daemon holds for it (lock held). */
static bool descs_held_locked(struct tp_chan *ch)
{
	struct tpc_msg_desc *d;

	tpu_list_for_each(d, &ch->descs, node)
		if (!d->bytes)
			return true;
	return false;
}

/* The oldest take of @ch that gave up and holds its item, taken off the list (lock held).
 * Return: owned, or NULL. */
static struct chan_req *late_take_locked(struct tp_chan *ch)
{
	struct chan_req *cr;

	if (tpu_list_empty(&ch->late_takes))
		return NULL;
	cr = tpu_list_first(&ch->late_takes, struct chan_req, node);
	if (!cr->req.done)
		return NULL;
	tpu_list_remove(&cr->node);
	return cr;
}

/*
 * Every descriptor the daemon answers a handle's message read with describes the one item it
 * holds for the handle, until a take or a drop of it. A late answer is filed only when the
 * handle's caller has no descriptor of that item yet: none filed, none handed out and not yet
 * read or freed (tp_chan_read_msg() and tp_chan_descriptor_free() keep theirs filed until the
 * daemon answered them, so a late answer sent before a take never outlives it).
 */
void tpc_chan_msg_late_locked(struct chan_req *cr)
{
	struct tp_chan *ch = cr->ch;

	if (cr->msg_take) { /* stays filed, in order, with its bytes for the next read */
		if (cr->req.status == 0 && cr->msg_taken && cr->host)
			return;
		tpu_list_remove(&cr->node);
		return msg_req_free(cr); /* failed: the daemon kept the item (or it was lost) */
	}
	tpu_list_remove(&cr->node);
	if (cr->req.status == 0 && cr->desc && !ch->late_desc && !descs_held_locked(ch)) {
		ch->late_desc = cr;
		return;
	}
	msg_req_free(cr); /* failed, or the item described already */
}

/* @cr's descriptor filed on @ch and into *@ret, @cr freed (lock held). Return: 0 or
 * TP_CHAN_CLOSED. */
static int desc_hand_out_locked(struct tp_chan *ch, struct chan_req *cr,
				struct tp_descriptor **ret)
{
	struct tpc_msg_desc *d = (struct tpc_msg_desc *)cr->desc;
	bool closed = cr->closed;

	cr->desc = NULL;
	if (cr->msg_take) { /* the item's bytes go with the descriptor */
		d->bytes = cr->host;
		d->late = false;
		cr->host = NULL;
	}
	msg_req_free(cr);
	d->ch = ch;
	tpu_list_insert_tail(&ch->descs, &d->node);
	*ret = &d->pub;
	return closed ? TP_CHAN_CLOSED : 0;
}

/*
 * Waits for message read @cr (sent, owned) of @ch and decides the call's result (lock held):
 * its own answer, or the descriptor a late read brought (the same item: the other is dropped);
 * a read not answered yet is filed on ch->late_msg. Return: as tp_chan_read_descriptor(),
 * the reason in @why.
 */
static int desc_wait_locked(struct tp_chan *ch, struct chan_req *cr, int timeout_ms,
			    struct tp_descriptor **ret, char *why, size_t wl)
{
	struct chan_req *late, *take;
	int r = tpc_chan_wait_locked(ch->ctx, cr, timeout_ms, ch);

	if (r == -ETIMEDOUT && timeout_ms == 0 && cr->req.done)
		r = -EAGAIN;
	if (r == 0 && !cr->desc)
		r = -EPROTO;
	snprintf(why, wl, "%s", r == -EPROTO && !cr->req.status ?
		 "an answer without a descriptor" : cr->req.msg);
	if (!cr->req.done) { /* gave up, or a late read's descriptor or item came: filed */
		cr->ch = ch;
		tpu_list_insert_tail(&ch->late_msg, &cr->node);
	}
	take = late_take_locked(ch);
	if (take) { /* an item taken before the one the daemon holds now goes first */
		if (cr->req.done && r >= 0) { /* that one is kept for the next call */
			cr->ch = ch;
			tpu_list_insert_tail(&ch->late_msg, &cr->node);
			tpc_chan_msg_late_locked(cr);
		} else if (cr->req.done) {
			msg_req_free(cr);
		}
		return desc_hand_out_locked(ch, take, ret);
	}
	late = ch->late_desc;
	ch->late_desc = NULL;
	if (cr->req.done && r >= 0) {
		if (late)
			msg_req_free(late);
		return desc_hand_out_locked(ch, cr, ret);
	}
	if (cr->req.done)
		msg_req_free(cr);
	return late ? desc_hand_out_locked(ch, late, ret) : r;
}

TP_EXPORT int tp_chan_read_descriptor(struct tp_chan *ch, struct tp_descriptor **ret,
				      int timeout_ms)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct chan_req *cr;
	char why[sizeof(cr->req.msg)];
	int r;

	if (!ch || !ret)
		return tpc_error(-EINVAL, "tp_chan_read_descriptor: NULL argument");
	r = msg_minor(ch, "tp_chan_read_descriptor");
	if (r < 0)
		return r;
	pthread_mutex_lock(&ch->ctx->lock);
	cr = late_take_locked(ch); /* an item a take that gave up kept goes first */
	if (!cr) { /* then the descriptor a read that gave up brought */
		cr = ch->late_desc;
		ch->late_desc = NULL;
	}
	if (cr)
		r = desc_hand_out_locked(ch, cr, ret);
	pthread_mutex_unlock(&ch->ctx->lock);
	if (cr)
		return r;
	cr = calloc(1, sizeof(*cr));
	if (!cr)
		return tpc_error(-ENOMEM, "out of memory");
	cr->msg_read = true;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = ch->id;
	op.timeout_ms = timeout_ms < 0 ? UINT32_MAX : (uint32_t)timeout_ms;
	op.msg = true;
	r = tpc_chan_send(ch->ctx, &op, NULL, 0, cr);
	if (r < 0) {
		free(cr);
		return r;
	}
	pthread_mutex_lock(&ch->ctx->lock);
	r = desc_wait_locked(ch, cr, timeout_ms, ret, why, sizeof(why));
	pthread_mutex_unlock(&ch->ctx->lock);
	if (r < 0)
		return tpc_error(r, "channel '%s': %s", ch->name, why);
	return r;
}

void tpc_chan_msg_orphan(struct tp_chan *ch)
{
	struct tp_context *ctx = ch->ctx;
	struct chan_req *cr, *ctmp;

	tpc_msgitem_desc_orphan(ctx, &ch->descs);
	pthread_mutex_lock(&ctx->lock);
	/* the daemon gave the held item back to the channel, and canceled the waiting reads */
	tpu_list_for_each_safe(cr, ctmp, &ch->late_msg, node) {
		if (tpc_map_get(&ctx->reqs, cr->req.id) == &cr->req)
			tpc_map_del(&ctx->reqs, cr->req.id);
		tpu_list_remove(&cr->node);
		msg_req_free(cr);
	}
	if (ch->late_desc)
		msg_req_free(ch->late_desc);
	ch->late_desc = NULL;
	/* takes that gave up: given back (tpc_chan_msg_give_back()) or, answered now, lost */
	tpu_list_for_each_safe(cr, ctmp, &ch->late_takes, node) {
		if (tpc_map_get(&ctx->reqs, cr->req.id) == &cr->req)
			tpc_map_del(&ctx->reqs, cr->req.id);
		tpu_list_remove(&cr->node);
		msg_req_free(cr);
	}
	pthread_mutex_unlock(&ctx->lock);
}

bool tpc_chan_msg_kept_any(struct tp_chan *ch)
{
	struct tpc_msg_desc *d;
	bool any;

	pthread_mutex_lock(&ch->ctx->lock);
	any = !tpu_list_empty(&ch->late_takes);
	tpu_list_for_each(d, &ch->descs, node)
		any |= d->bytes != NULL;
	pthread_mutex_unlock(&ch->ctx->lock);
	return any;
}

/* What a give-back needs of @d, in a block of its own (free()): its length and packed wire
 * descriptor (the arrays stay empty). Return: owned, or NULL. */
static struct tp_descriptor *desc_copy_wire(const struct tpc_msg_desc *d)
{
	struct tpc_msg_desc *c = malloc(sizeof(*c) + d->wire_len);

	if (!c)
		return NULL;
	*c = (struct tpc_msg_desc){ .magic = TPC_MSG_DESC_MAGIC, .len = d->len,
				 .wire_len = d->wire_len };
	if (d->wire) {
		memcpy(c + 1, d->wire, d->wire_len);
		c->wire = (const uint8_t *)(c + 1);
	}
	tpu_list_init(&c->node);
	return &c->pub;
}

/* Writes item @bytes (@len) of descriptor @wire (packed; NULL: a byte item) to @via.
 * Return: 0 or -errno. */
static int give_back_one(struct tp_chan *via, const uint8_t *wire, size_t wire_len,
			 uint8_t *bytes, uint64_t len)
{
	struct iovec iov = { .iov_base = bytes, .iov_len = len };
	Tpw__V1__Descriptor *m, *mp[1];
	int r;

	if (!via)
		return -ENOENT;
	if (!wire)
		return tp_chan_write(via, &iov, 1, via->ctx->reply_ms);
	m = tpw__v1__descriptor__unpack(NULL, wire_len, wire);
	if (!m)
		return -ENOMEM;
	mp[0] = m;
	r = tpc_chan_write_items(via, &iov, 1, mp, via->ctx->reply_ms);
	tpw__v1__descriptor__free_unpacked(m, NULL);
	return r;
}

int tpc_chan_msg_give_back(struct tp_chan *ch, struct tp_chan *via)
{
	struct tpu_list kept = TPU_LIST_INIT(kept);
	struct tpc_msg_desc *d;
	struct chan_req *cr, *tmp;
	unsigned lost = 0;
	int r = 0, w;

	/* Descriptors handed out first (their takes were older), then the takes, in order; each
	 * descriptor's bytes move to a take of its own here. The caller of a descriptor of @ch
	 * must not use it while @ch is released. */
	pthread_mutex_lock(&ch->ctx->lock);
	tpu_list_for_each(d, &ch->descs, node) {
		if (!d->bytes || !(cr = calloc(1, sizeof(*cr))))
			continue; /* without memory, the descriptor keeps them: dropped */
		cr->desc = desc_copy_wire(d);
		cr->host = d->bytes;
		d->bytes = NULL;
		tpu_list_insert_tail(&kept, &cr->node);
	}
	while ((cr = late_take_locked(ch)))
		tpu_list_insert_tail(&kept, &cr->node);
	pthread_mutex_unlock(&ch->ctx->lock);
	tpu_list_for_each_safe(cr, tmp, &kept, node) {
		d = (struct tpc_msg_desc *)cr->desc;
		w = d ? give_back_one(via, d->wire, d->wire_len, cr->host, d->len) : -ENOMEM;
		lost += w < 0;
		r = r ? r : w;
		tpu_list_remove(&cr->node);
		msg_req_free(cr);
	}
	if (r < 0)
		return tpc_error(r, "%u message item(s) whose take gave up could not be given back "
				 "to channel '%s': %s", lost, ch->name, tp_strerror(r));
	return 0;
}

/* Frees @cd, unfiled from its handle. */
static void desc_free(struct tpc_msg_desc *cd)
{
	tpc_msgitem_desc_free(cd->ch ? cd->ch->ctx : NULL, cd);
}

/* @op as a take of @ch's held item. */
static void take_op(struct tp_chan *ch, Tpw__V1__ChanOp *op)
{
	op->op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op->chan_id = ch->id;
	op->msg = true;
	op->take_held = true;
}

/* Sends @op (a take of @ch's held item) with @cr and waits for its answer. Return: its status. */
static int take_call(struct tp_chan *ch, Tpw__V1__ChanOp *op, struct chan_req *cr)
{
	take_op(ch, op);
	return tpc_chan_call(ch->ctx, op, NULL, 0, 0, cr);
}

/* Files take @cr of @cd's item, whose caller gave up, on @ch: it owns @cd from now on, and
 * the reply handler keeps the item's bytes (lock held). */
static void take_file_late_locked(struct tp_chan *ch, struct chan_req *cr, struct tpc_msg_desc *cd)
{
	free(cr->host); /* the caller's CUDA bytes: its slots are not ours any more */
	cr->host = NULL;
	cr->scatter = NULL;
	cr->msg_take = true;
	cr->ch = ch;
	cr->desc = &cd->pub;
	tpu_list_remove(&cd->node);
	tpu_list_init(&cd->node);
	cd->late = true;
	tpu_list_insert_tail(&ch->late_takes, &cr->node);
}

/*
 * The take inline: CPU slots written by the reply handler, CUDA ones from its host copy. A
 * take that gives up waiting for the daemon is filed on @ch with @cd (*@ret_kept): the item
 * the daemon answers it with later goes to the handle's next tp_chan_read_descriptor().
 */
static int take_inline(struct tp_chan *ch, struct tpc_msg_desc *cd, const struct tp_allocation *a,
		       bool *ret_kept)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct tp_context *ctx = ch->ctx;
	struct chan_req *cr = calloc(1, sizeof(*cr));
	char why[sizeof(cr->req.msg)];
	int r;

	if (!cr || (cd->len && !(cr->host = malloc(cd->len)))) {
		free(cr);
		return tpc_error(-ENOMEM, "out of memory");
	}
	cr->scatter = a;
	cr->scatter_desc = &cd->pub;
	take_op(ch, &op);
	r = tpc_chan_send(ctx, &op, NULL, 0, cr);
	if (r < 0) {
		free(cr->host);
		free(cr);
		return r;
	}
	pthread_mutex_lock(&ctx->lock);
	r = tpc_chan_wait_locked(ctx, cr, 0, NULL);
	snprintf(why, sizeof(why), "%s", cr->req.msg);
	*ret_kept = !cr->req.done;
	if (*ret_kept)
		take_file_late_locked(ch, cr, cd);
	pthread_mutex_unlock(&ctx->lock);
	if (*ret_kept)
		return tpc_error(r, "channel '%s': %s (an item it answers later is kept for the "
				 "handle's next tp_chan_read_descriptor())", ch->name, why);
	if (r == 0 && !cr->msg_taken)
		r = tpc_error(-EPROTO, "a take answered without the item");
	if (r == 0)
		r = tpc_msgitem_take_finish(ctx, &cd->pub, a, NULL, cr->host, true);
	else
		r = tpc_error(r, "channel '%s': %s", ch->name, why);
	free(cr->host);
	free(cr);
	return r;
}

/* The take into the plan's segments: shared-buffer slots by the daemon, the others staged.
 * Return: 0, -EAGAIN (the daemon refused the staging buffer, as a write's: the item is still
 * held, take it without), or -errno. */
static int take_segs(struct tp_chan *ch, struct tpc_msg_desc *cd, const struct tp_allocation *a,
		     struct tpc_take_plan *pl)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct chan_req cr = { 0 };
	int r;

	op.n_segments = pl->n;
	op.segments = pl->segp;
	r = take_call(ch, &op, &cr);
	if (r == 0 && (!cr.msg_taken || cr.n || !cr.req.done))
		r = -EPROTO;
	if (r == 0)
		return tpc_msgitem_take_finish(ch->ctx, &cd->pub, a, pl->direct, pl->base, false);
	if (r == -ENOENT && tpc_chan_stage_refused(ch->ctx, pl->stage)) {
		tpc_buffer_stage_put(ch->ctx, pl->stage, false);
		pl->stage = NULL;
		r = -EAGAIN;
	}
	tpc_msgitem_plan_free(ch->ctx, pl, cr.req.done);
	*pl = (struct tpc_take_plan){ 0 };
	if (r == -EAGAIN)
		return r;
	return tpc_error(r, "channel '%s': %s", ch->name, r == -EPROTO && !cr.req.status ?
			 "a take answered without the item" : cr.req.msg);
}

/* The take of @cd's item into @a by a plan (@stage: with a staging buffer), or inline when the
 * plan has no destination for some part. Return: as take_segs(). */
static int take_planned(struct tp_chan *ch, struct tpc_msg_desc *cd, const struct tp_allocation *a,
			bool stage, bool *ret_kept)
{
	struct tpc_take_plan pl = { 0 };
	int r = tpc_msgitem_plan_make(ch->ctx, &cd->pub, a, ch->remote, stage, &pl);

	if (r == 0 && pl.n > 1 && ch->remote) /* cannot happen: all staged, merged */
		r = tpc_error(-EOPNOTSUPP, "several destinations across hosts");
	if (r == 1 && cd->len > ch->ctx->lim.inline_max)
		r = tpc_error(-EOPNOTSUPP, "channel '%s': an item of %llu bytes above the inline "
			      "limit, and neither a staging buffer nor CMA for the slots not in a "
			      "shared buffer", ch->name, (unsigned long long)cd->len);
	if (r == 1)
		r = take_inline(ch, cd, a, ret_kept);
	else if (r == 0)
		r = take_segs(ch, cd, a, &pl);
	if (pl.seg || pl.stage || pl.host)
		tpc_msgitem_plan_free(ch->ctx, &pl, true);
	return r;
}

TP_EXPORT int tp_chan_read_msg(struct tp_chan *ch, struct tp_descriptor *d,
			       const struct tp_allocation *alloc)
{
	struct tpc_msg_desc *cd = tpc_msgitem_desc_of(d);
	bool small, kept = false;
	int r;

	if (!ch || !cd || cd->ch != ch)
		return tpc_error(-EINVAL, "tp_chan_read_msg: no descriptor of this channel");
	r = tpc_msgitem_alloc_check(d, alloc);
	if (r < 0)
		return r;
	if (cd->bytes) { /* kept by a take that gave up: the daemon no longer has it */
		r = tpc_msgitem_take_finish(ch->ctx, d, alloc, NULL, cd->bytes, false);
		desc_free(cd);
		return r == -EINVAL ? -EIO : r;
	}
	small = tpc_msgitem_small(ch->ctx, cd, alloc, !tpc_chan_fast(ch));
	if (small && cd->len > ch->ctx->lim.inline_max)
		r = tpc_error(-EOPNOTSUPP, "channel '%s': an item of %llu bytes above the inline "
			      "limit on a channel that takes items inline only", ch->name,
			      (unsigned long long)cd->len);
	else
		r = small ? take_inline(ch, cd, alloc, &kept) :
			    take_planned(ch, cd, alloc, true, &kept);
	if (r == -EAGAIN)
		r = take_planned(ch, cd, alloc, false, &kept);
	if (r == -EAGAIN)
		r = tpc_error(-EIO, "channel '%s': the daemon refused a staging buffer", ch->name);
	if (r == -EINVAL) /* the daemon's, or a slot's: @d is taken all the same */
		r = -EIO;
	if (!kept) /* else the take that gave up owns it */
		desc_free(cd);
	return r;
}

TP_EXPORT int tp_chan_descriptor_free(struct tp_descriptor *d)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct tpc_msg_desc *cd = tpc_msgitem_desc_of(d);
	struct chan_req cr = { 0 };
	struct tp_chan *ch;
	int r;

	if (!cd || cd->qid)
		return d ? tpc_error(-EINVAL, "tp_chan_descriptor_free: not a channel's") : 0;
	ch = cd->ch;
	if (!ch || cd->bytes) {
		desc_free(cd);
		return 0; /* the item went back to the channel at the release, or only we had it */
	}
	op.msg_drop = true;
	r = take_call(ch, &op, &cr);
	desc_free(cd); /* filed until answered: tpc_chan_msg_late_locked() */
	if (r < 0)
		return tpc_error(r, "channel '%s': cannot drop the held item: %s", ch->name,
				 cr.req.msg);
	return 0;
}
