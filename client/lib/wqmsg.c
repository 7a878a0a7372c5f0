/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Work queue questions and answers as messages (tpclient.h; docs/queues.md, "Questions and
 * answers as messages"): tp_wq_submit_msg() and tp_wq_reply_msg() (a message as one item, as a
 * channel's: inline when small, else by reference: from the caller's shared buffer, or staged,
 * or by CMA; across hosts too, the daemons streaming it), tp_wq_take_descriptor() and
 * tp_wq_answer_descriptor() (the item described), tp_wq_read_msg() (its bytes into the caller's
 * slots, one destination across hosts) and tp_wq_descriptor_free(). What messages share with
 * channel items is msgitem.c's; the requests are wq.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "chan_int.h"
#include "internal.h"
#include "msgitem.h"
#include "wq_int.h"

static int msg_minor(const struct tp_wq *q, const char *what)
{
	if (q->ctx->daemon_minor >= TPW_MINOR_WQ_MSG)
		return 0;
	return tpc_error(-EOPNOTSUPP, "%s: work queue '%s': the daemon speaks protocol minor %u "
			 "(minor %u takes messages)", what, q->name, q->ctx->daemon_minor,
			 TPW_MINOR_WQ_MSG);
}

int tpc_wq_msg_on_reply(struct tp_context *ctx, struct wq_req *wr, const Tpw__V1__WqReply *m,
			const uint8_t *tail, size_t tail_len)
{
	const struct tpc_msg_desc *d = (const struct tpc_msg_desc *)wr->scatter_desc;
	int r;

	if (m->msg_held) {
		r = tpc_msgitem_desc_check(ctx, m->msg_desc, m->msg_len);
		if (r < 0)
			return r;
		wr->msg_held = true;
		wr->desc = tpc_msgitem_desc_new(m->msg_desc, m->msg_len);
		return wr->desc ? 0 : tpc_error(-ENOMEM, "out of memory for a descriptor");
	}
	if (m->msg_copied) {
		wr->copied = true;
		return 0;
	}
	if (!d || tail_len != d->len)
		return tpc_error(-EPROTO, "a message read answered with %zu bytes, not %llu",
				 tail_len, (unsigned long long)(d ? d->len : 0));
	tpc_msgitem_scatter(wr->scatter_desc, wr->scatter, tail, wr->host);
	return 0;
}

/* ---- submitting and replying ---------------------------------------------------------------- */

/* Would @op with @len bytes inline make a frame above the daemon's frame-max? Return: 0 or
 * -EMSGSIZE (message set). */
static int frame_check(const struct tp_wq *q, Tpw__V1__WqOp *op, size_t len)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	size_t n = 16 + len; /* room for the req_id, still 0 here */

	m.body_case = TPW__V1__CLIENT_MSG__BODY_WQ_OP;
	m.wq_op = op;
	n += tpw_frame_size(&m.base);
	if (n > q->ctx->lim.frame_max)
		return tpc_error(-EMSGSIZE, "work queue '%s': a frame of %zu bytes exceeds the "
				 "daemon's limit of %u (tpipd --frame-max)", q->name, n,
				 q->ctx->lim.frame_max);
	return 0;
}

/* Sends @op with item @it inline. Return: the daemon's status or -errno. */
static int send_inline(struct tp_wq *q, Tpw__V1__WqOp *op, const struct iovec *it,
		       struct wq_req *wr)
{
	int r;

	if (it->iov_len > q->ctx->lim.inline_max)
		return tpc_error(-EMSGSIZE, "work queue '%s': a message of %zu bytes above the "
				 "daemon's inline limit %u%s", q->name, it->iov_len,
				 q->ctx->lim.inline_max, ", with neither a staging buffer nor CMA");
	r = frame_check(q, op, it->iov_len);
	if (r < 0)
		return r;
	return tpc_wq_call(q->ctx, op, it->iov_base, it->iov_len, 0, wr);
}

/*
 * Sends @op with item @it by reference: from the caller's shared buffer, else a staging buffer
 * of the context (@stage) it is copied into first, else by CMA, else inline.
 * Return: the daemon's status, -EAGAIN (the daemon refused the staging buffer: send again
 * without), or -errno.
 */
static int send_ref(struct tp_wq *q, Tpw__V1__WqOp *op, const struct iovec *it, bool stage,
		    struct wq_req *wr)
{
	struct tp_context *ctx = q->ctx;
	struct tpc_buf *b = NULL;
	Tpw__V1__Segment g;
	Tpw__V1__ShmRef ref;
	int r = tpc_chan_ref(ctx, it->iov_base, it->iov_len, false, &g, &ref);

	if (r < 0 && stage) {
		pthread_mutex_lock(&ctx->send_lock);
		if (tpc_buffer_stage_get(ctx, it->iov_len, &b) < 0)
			b = NULL;
		pthread_mutex_unlock(&ctx->send_lock);
	}
	if (r < 0 && b) {
		memcpy(b->addr, it->iov_base, it->iov_len);
		ref.buf_id = b->id;
		ref.gen = b->gen;
		ref.offset = 0;
		g.loc_case = TPW__V1__SEGMENT__LOC_SHM;
		g.shm = &ref;
		r = 0;
	}
	if (r < 0 && it->iov_len > ctx->lim.inline_max)
		r = tpc_chan_ref(ctx, it->iov_base, it->iov_len, true, &g, &ref);
	if (r < 0)
		return send_inline(q, op, it, wr);
	op->segment = &g;
	r = tpc_wq_call(ctx, op, NULL, 0, 0, wr);
	op->segment = NULL;
	if (r == -ENOENT && tpc_chan_stage_refused(ctx, b)) {
		tpc_buffer_stage_put(ctx, b, false);
		return -EAGAIN;
	}
	if (wr->req.done) /* else the daemon may still copy out of it: kept */
		tpc_buffer_stage_put(ctx, b, true);
	return r;
}

/* SUBMIT or REPLY (@op) of message @m. Return: 0 or -errno (message set). */
static int send_msg(struct tp_wq *q, Tpw__V1__WqOp *op, const struct tp_message *m,
		    struct wq_req *wr, const char *what)
{
	struct tpc_msg_batch b = { 0 };
	uint64_t len;
	int r;

	if (!q || !m)
		return tpc_error(-EINVAL, "%s: NULL argument", what);
	r = msg_minor(q, what);
	if (r == 0)
		r = tpc_msgitem_check(q->ctx, m, 0, &len);
	if (r == 0)
		r = tpc_msgitem_batch_alloc(&b, 1, m->n_payloads, m->n_tensors);
	if (r == 0) {
		tpc_msgitem_wire(m, &b.w[0], b.pd, b.pp, b.td, b.tp, b.dev);
		r = tpc_msgitem_gather(q->ctx, m, len, &b.items[0], &b.gather[0]);
	}
	op->wq_id = q ? q->id : 0;
	op->msg_desc = &b.w[0];
	/* A queue of another host whose daemon takes messages inline only: a larger one goes by
	 * reference all the same, for this daemon to refuse naming the far one's version. */
	if (r == 0 && (len <= TPW_CHAN_SHM_ITEM || (q->remote && !q->remote_refs &&
						    len <= q->ctx->lim.inline_max)))
		r = send_inline(q, op, &b.items[0], wr);
	else if (r == 0)
		r = send_ref(q, op, &b.items[0], true, wr);
	if (r == -EAGAIN)
		r = send_ref(q, op, &b.items[0], false, wr);
	/* a call that gave up may still be read by CMA: its gathered item is kept */
	tpc_msgitem_batch_free(&b, 1, r == -ETIMEDOUT && !wr->req.done);
	if (r < 0 && wr->req.done)
		return tpc_error(r, "%s: work queue '%s': %s", what, q->name, wr->req.msg);
	return r < 0 ? r : 0;
}

TP_EXPORT int tp_wq_submit_msg(struct tp_wq *q, const struct tp_message *m, uint64_t *ret_id)
{
	Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;
	struct wq_req wr = { 0 };
	int r;

	op.op = TPW__V1__WQ_OP_KIND__WQ_OP_SUBMIT;
	r = send_msg(q, &op, m, &wr, "tp_wq_submit_msg");
	if (r == 0 && ret_id)
		*ret_id = wr.qid;
	return r;
}

TP_EXPORT int tp_wq_reply_msg(struct tp_wq *q, uint64_t id, const struct tp_message *m)
{
	Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;
	struct wq_req wr = { 0 };

	op.op = TPW__V1__WQ_OP_KIND__WQ_OP_REPLY;
	op.question_id = id;
	return send_msg(q, &op, m, &wr, "tp_wq_reply_msg");
}

/* ---- taking and reading --------------------------------------------------------------------- */

/* TAKE or ANSWER (@kind) by descriptor. */
static int get_descriptor(struct tp_wq *q, Tpw__V1__WqOpKind kind, uint64_t *ret_id,
			  struct tp_descriptor **ret, int timeout_ms, const char *what)
{
	Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;
	struct wq_req wr = { 0 };
	struct tpc_msg_desc *d;
	int r;

	if (!q || !ret_id || !ret)
		return tpc_error(-EINVAL, "%s: NULL argument", what);
	r = msg_minor(q, what);
	if (r < 0)
		return r;
	op.op = kind;
	op.wq_id = q->id;
	op.msg = true;
	op.timeout_ms = timeout_ms < 0 ? UINT32_MAX : (uint32_t)timeout_ms;
	r = tpc_wq_call(q->ctx, &op, NULL, 0, timeout_ms, &wr);
	if (r == -ETIMEDOUT && timeout_ms == 0 && wr.req.done)
		r = -EAGAIN;
	if (r == 0 && wr.answer_err < 0) {
		*ret_id = wr.qid;
		*ret = NULL;
		free(wr.desc);
		return tpc_error(wr.answer_err, "work queue '%s': question %llu's worker died",
				 q->name, (unsigned long long)wr.qid);
	}
	if (r == 0 && !wr.desc)
		r = tpc_error(-EPROTO, "an answer without a descriptor");
	if (r < 0) {
		free(wr.desc);
		return tpc_error(r, "%s: work queue '%s': %s", what, q->name, wr.req.msg);
	}
	d = wr.desc;
	d->wq = q;
	d->qid = wr.qid;
	d->answer = kind == TPW__V1__WQ_OP_KIND__WQ_OP_ANSWER;
	pthread_mutex_lock(&q->ctx->lock);
	tpu_list_insert_tail(&q->descs, &d->node);
	pthread_mutex_unlock(&q->ctx->lock);
	*ret_id = wr.qid;
	*ret = &d->pub;
	return 0;
}

TP_EXPORT int tp_wq_take_descriptor(struct tp_wq *q, uint64_t *ret_id, struct tp_descriptor **ret,
				    int timeout_ms)
{
	return get_descriptor(q, TPW__V1__WQ_OP_KIND__WQ_OP_TAKE, ret_id, ret, timeout_ms,
			      "tp_wq_take_descriptor");
}

TP_EXPORT int tp_wq_answer_descriptor(struct tp_wq *q, uint64_t *ret_id,
				      struct tp_descriptor **ret, int timeout_ms)
{
	return get_descriptor(q, TPW__V1__WQ_OP_KIND__WQ_OP_ANSWER, ret_id, ret, timeout_ms,
			      "tp_wq_answer_descriptor");
}

void tpc_wq_msg_orphan(struct tp_wq *q)
{
	tpc_msgitem_desc_orphan(q->ctx, &q->descs);
}

/* Frees @d, unfiled from its handle. */
static void desc_free(struct tpc_msg_desc *d)
{
	tpc_msgitem_desc_free(d->wq ? d->wq->ctx : NULL, d);
}

/* Sends a read of @d's item (@op: its segments set, or none: inline) and waits for it. */
static int read_call(struct tp_wq *q, struct tpc_msg_desc *d, Tpw__V1__WqOp *op,
		     struct wq_req *wr)
{
	op->op = d->answer ? TPW__V1__WQ_OP_KIND__WQ_OP_ANSWER : TPW__V1__WQ_OP_KIND__WQ_OP_TAKE;
	op->wq_id = q->id;
	op->msg_read = true;
	op->question_id = d->qid;
	return tpc_wq_call(q->ctx, op, NULL, 0, 0, wr);
}

/* The read inline: CPU slots written by the reply handler, CUDA ones from its host copy. */
static int read_inline(struct tp_wq *q, struct tpc_msg_desc *d, const struct tp_allocation *a)
{
	Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;
	struct wq_req wr = { .scatter = a, .scatter_desc = &d->pub };
	int r;

	if (d->len && !(wr.host = malloc(d->len)))
		return tpc_error(-ENOMEM, "out of memory");
	r = read_call(q, d, &op, &wr);
	if (r == 0)
		r = tpc_msgitem_take_finish(q->ctx, &d->pub, a, NULL, wr.host, true);
	else
		r = tpc_error(r, "work queue '%s': %s", q->name, wr.req.msg);
	free(wr.host); /* an unanswered read's answer is dropped: nobody writes into it */
	free(wr.data);
	return r;
}

/* The read into a plan's segments (@stage: with a staging buffer), or inline when the plan has
 * no destination for some part. Return: 0, -EAGAIN (the daemon refused the staging buffer: read
 * again without), or -errno. */
static int read_planned(struct tp_wq *q, struct tpc_msg_desc *d, const struct tp_allocation *a,
			bool stage)
{
	Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;
	struct tpc_take_plan pl = { 0 };
	struct wq_req wr = { 0 };
	int r = tpc_msgitem_plan_make(q->ctx, &d->pub, a, false, stage, &pl);

	if (r == 0 && pl.n > 1 && q->remote) { /* one destination across hosts: all staged */
		tpc_msgitem_plan_free(q->ctx, &pl, true);
		pl = (struct tpc_take_plan){ 0 };
		r = tpc_msgitem_plan_make(q->ctx, &d->pub, a, true, stage, &pl);
	}

	if (r == 1 && d->len > q->ctx->lim.inline_max)
		r = tpc_error(-EOPNOTSUPP, "work queue '%s': an item of %llu bytes above the "
			      "inline limit, and neither a staging buffer nor CMA for the slots not "
			      "in a shared buffer", q->name, (unsigned long long)d->len);
	if (r == 1)
		r = read_inline(q, d, a);
	if (r != 0) {
		tpc_msgitem_plan_free(q->ctx, &pl, true);
		return r;
	}
	op.n_segments = pl.n;
	op.segments = pl.segp;
	r = read_call(q, d, &op, &wr);
	if (r == 0 && !wr.copied)
		r = tpc_error(-EPROTO, "a read answered without its copy");
	if (r == 0)
		r = tpc_msgitem_take_finish(q->ctx, &d->pub, a, pl.direct, pl.base, false);
	else if (r == -ENOENT && tpc_chan_stage_refused(q->ctx, pl.stage))
		r = -EAGAIN;
	else if (r != -EPROTO)
		r = tpc_error(r, "work queue '%s': %s", q->name, wr.req.msg);
	if (r == -EAGAIN) {
		tpc_buffer_stage_put(q->ctx, pl.stage, false);
		pl.stage = NULL;
	}
	free(wr.data);
	tpc_msgitem_plan_free(q->ctx, &pl, wr.req.done);
	return r;
}

TP_EXPORT int tp_wq_read_msg(struct tp_wq *q, struct tp_descriptor *desc,
			     const struct tp_allocation *alloc)
{
	struct tpc_msg_desc *d = tpc_msgitem_desc_of(desc);
	bool small;
	int r;

	if (!q || !d || !d->qid || d->wq != q)
		return tpc_error(-EINVAL, "tp_wq_read_msg: no descriptor of this work queue");
	r = tpc_msgitem_alloc_check(desc, alloc);
	if (r < 0)
		return r;
	/* As for sending: a larger item of a queue whose host streams none is asked for by
	 * reference all the same, and refused by this daemon naming that host's version. */
	small = tpc_msgitem_small(q->ctx, d, alloc, q->remote && !q->remote_refs &&
						    d->len <= q->ctx->lim.inline_max);
	r = small ? read_inline(q, d, alloc) : read_planned(q, d, alloc, true);
	if (r == -EAGAIN)
		r = read_planned(q, d, alloc, false);
	if (r == -EAGAIN)
		r = tpc_error(-EIO, "work queue '%s': the daemon refused a staging buffer",
			      q->name);
	if (r == -EINVAL) /* the daemon's, or a slot's: @d is taken all the same */
		r = -EIO;
	desc_free(d);
	return r;
}

TP_EXPORT int tp_wq_descriptor_free(struct tp_descriptor *desc)
{
	Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;
	struct tpc_msg_desc *d = tpc_msgitem_desc_of(desc);
	struct wq_req wr = { 0 };
	struct tp_wq *q;
	bool answer;
	int r;

	if (!d || !d->qid)
		return desc ? tpc_error(-EINVAL, "tp_wq_descriptor_free: not a work queue's") : 0;
	q = d->wq;
	answer = d->answer;
	op.question_id = d->qid;
	desc_free(d);
	if (!q || !answer)
		return 0; /* a question stays taken until replied to; a released handle's went */
	op.op = TPW__V1__WQ_OP_KIND__WQ_OP_ANSWER;
	op.wq_id = q->id;
	op.msg_drop = true;
	r = tpc_wq_call(q->ctx, &op, NULL, 0, 0, &wr);
	if (r < 0)
		return tpc_error(r, "work queue '%s': cannot drop the held answer: %s", q->name,
				 wr.req.msg);
	return 0;
}
