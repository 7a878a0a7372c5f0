/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Channel items as messages (chan_int.h; docs/channels.md, "Items as messages"):
 * tp_chan_write_msgs() (a message as one item: its parts by reference when there is one,
 * gathered otherwise, CUDA tensors copied to host memory first, its descriptor beside it),
 * tp_chan_read_descriptor() (the held item's descriptor), tp_chan_read_msg() (the item into the
 * reader's slots: inline, scattered by the reply handler, or copied by the daemon into shared
 * buffers and staging) and tp_chan_descriptor_free() (the held item dropped). Leaves the requests
 * and their answers to chan.c, segments and staging buffers to chanwrite.c.
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

TP_EXPORT int tp_chan_read_descriptor(struct tp_chan *ch, struct tp_descriptor **ret,
				      int timeout_ms)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct chan_req cr = { 0 };
	struct tpc_msg_desc *d;
	int r;

	if (!ch || !ret)
		return tpc_error(-EINVAL, "tp_chan_read_descriptor: NULL argument");
	r = msg_minor(ch, "tp_chan_read_descriptor");
	if (r < 0)
		return r;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = ch->id;
	op.timeout_ms = timeout_ms < 0 ? UINT32_MAX : (uint32_t)timeout_ms;
	op.msg = true;
	r = tpc_chan_call(ch->ctx, &op, NULL, 0, timeout_ms, &cr);
	if (r == -ETIMEDOUT && timeout_ms == 0 && cr.req.done)
		r = -EAGAIN;
	if (r == 0 && !cr.desc)
		r = -EPROTO;
	if (r < 0) {
		free(cr.desc);
		return tpc_error(r, "channel '%s': %s", ch->name, r == -EPROTO && !cr.req.status ?
				 "an answer without a descriptor" : cr.req.msg);
	}
	d = (struct tpc_msg_desc *)cr.desc;
	d->ch = ch;
	pthread_mutex_lock(&ch->ctx->lock);
	tpu_list_insert_tail(&ch->descs, &d->node);
	pthread_mutex_unlock(&ch->ctx->lock);
	*ret = &d->pub;
	return cr.closed ? TP_CHAN_CLOSED : 0;
}

void tpc_chan_msg_orphan(struct tp_chan *ch)
{
	tpc_msgitem_desc_orphan(ch->ctx, &ch->descs);
}

/* Frees @cd, unfiled from its handle. */
static void desc_free(struct tpc_msg_desc *cd)
{
	tpc_msgitem_desc_free(cd->ch ? cd->ch->ctx : NULL, cd);
}

/* Sends @op (a take of @ch's held item) with @cr and waits for its answer. Return: its status. */
static int take_call(struct tp_chan *ch, Tpw__V1__ChanOp *op, struct chan_req *cr)
{
	op->op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op->chan_id = ch->id;
	op->msg = true;
	op->take_held = true;
	return tpc_chan_call(ch->ctx, op, NULL, 0, 0, cr);
}

/* The take inline: CPU slots written by the reply handler, CUDA ones from its host copy. */
static int take_inline(struct tp_chan *ch, struct tpc_msg_desc *cd, const struct tp_allocation *a)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct chan_req cr = { .scatter = a, .scatter_desc = &cd->pub };
	int r;

	if (cd->len && !(cr.host = malloc(cd->len)))
		return tpc_error(-ENOMEM, "out of memory");
	r = take_call(ch, &op, &cr);
	if (r == 0 && !cr.msg_taken)
		r = tpc_error(-EPROTO, "a take answered without the item");
	if (r == 0)
		r = tpc_msgitem_take_finish(ch->ctx, &cd->pub, a, NULL, cr.host, true);
	else
		r = tpc_error(r, "channel '%s': %s", ch->name, cr.req.msg);
	free(cr.host); /* an unanswered take's answer is dropped: nobody writes into it */
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
			bool stage)
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
		r = take_inline(ch, cd, a);
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
	bool small;
	int r;

	if (!ch || !cd || cd->ch != ch)
		return tpc_error(-EINVAL, "tp_chan_read_msg: no descriptor of this channel");
	r = tpc_msgitem_alloc_check(d, alloc);
	if (r < 0)
		return r;
	small = tpc_msgitem_small(ch->ctx, cd, alloc, !tpc_chan_fast(ch));
	if (small && cd->len > ch->ctx->lim.inline_max)
		r = tpc_error(-EOPNOTSUPP, "channel '%s': an item of %llu bytes above the inline "
			      "limit on a channel that takes items inline only", ch->name,
			      (unsigned long long)cd->len);
	else
		r = small ? take_inline(ch, cd, alloc) : take_planned(ch, cd, alloc, true);
	if (r == -EAGAIN)
		r = take_planned(ch, cd, alloc, false);
	if (r == -EAGAIN)
		r = tpc_error(-EIO, "channel '%s': the daemon refused a staging buffer", ch->name);
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
	desc_free(cd);
	if (!ch)
		return 0; /* its handle was released: the item went back to the channel */
	op.msg_drop = true;
	r = take_call(ch, &op, &cr);
	if (r < 0)
		return tpc_error(r, "channel '%s': cannot drop the held item: %s", ch->name,
				 cr.req.msg);
	return 0;
}
