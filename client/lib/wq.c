/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Work queues hosted by the daemon (tpclient.h, "work queues"; docs/queues.md). Responsible for
 * the tp_wq_* calls: each sends one WqOp and waits for its WqReply, whose data tail is the
 * question or answer of a take or answer read. Not responsible for the queue's state (the
 * daemon keeps it) nor for the connection (context.c, wire.c).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "internal.h"
#include "wq_int.h"

static void wq_req_on_reply(struct tp_context *ctx, struct tpc_req *req, const Tpw__V1__Reply *r)
{
	tpc_context_req_done(ctx, req, r);
	if (r && req->status == 0)
		req->status = -EPROTO;
}

void tpc_wq_on_reply(struct tp_context *ctx, const Tpw__V1__WqReply *m, const uint8_t *tail,
		     size_t tail_len)
{
	struct tpc_req *req = tpc_map_get(&ctx->reqs, m->req_id);
	struct wq_req *wr;

	if (!req || req->on_reply != wq_req_on_reply)
		return; /* the call gave up waiting, or not one of ours */
	tpc_map_del(&ctx->reqs, m->req_id);
	wr = (struct wq_req *)req;
	req->status = tpw_status_to_errno(m->status);
	snprintf(req->msg, sizeof(req->msg), "%s",
		 m->message && *m->message ? m->message : tp_strerror(req->status));
	wr->wq_id = m->wq_id;
	wr->qid = m->question_id;
	wr->owner = m->owner;
	wr->remote_refs = m->remote_refs;
	wr->idle = m->idle && req->status == -ENOENT;
	if (wr->idle)
		req->status = -ENOMSG;
	wr->answer_err = tpw_status_to_errno(m->answer_status);
	if (req->status == 0 && (m->msg_held || m->msg_copied || wr->scatter)) {
		int r = tpc_wq_msg_on_reply(ctx, wr, m, tail, tail_len);

		if (r < 0) {
			req->status = r;
			snprintf(req->msg, sizeof(req->msg), "%s", tp_last_error());
		}
	} else if (req->status == 0 && tail_len) {
		wr->data = malloc(tail_len);
		if (wr->data) {
			memcpy(wr->data, tail, tail_len);
			wr->len = tail_len;
		} else {
			req->status = -ENOMEM;
			snprintf(req->msg, sizeof(req->msg), "out of memory for a payload");
		}
	}
	req->done = true;
	pthread_cond_broadcast(&ctx->cond);
}

int tpc_wq_call(struct tp_context *ctx, Tpw__V1__WqOp *op, const void *data, size_t len,
		int wait_ms, struct wq_req *wr)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	struct iovec iov = { (void *)data, len };
	int r;

	pthread_mutex_lock(&ctx->lock);
	r = tpc_context_check_locked(ctx);
	if (r == 0 && tpc_context_req_start_locked(ctx, &wr->req, wq_req_on_reply) < 0)
		r = tpc_error(-ENOMEM, "out of memory");
	pthread_mutex_unlock(&ctx->lock);
	if (r < 0)
		return r;
	op->req_id = wr->req.id;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_WQ_OP;
	m.wq_op = op;
	pthread_mutex_lock(&ctx->send_lock);
	tpc_wire_send(ctx, &m, len ? &iov : NULL, len ? 1 : 0, -EBADF);
	pthread_mutex_unlock(&ctx->send_lock);
	pthread_mutex_lock(&ctx->lock);
	if (wait_ms < 0 || wait_ms > INT_MAX - ctx->reply_ms)
		wait_ms = INT_MAX - ctx->reply_ms;
	r = tpc_context_req_wait_locked(ctx, &wr->req, wait_ms + ctx->reply_ms);
	pthread_mutex_unlock(&ctx->lock);
	return r;
}

static int wq_options(const struct tp_wq_options *opts, Tpw__V1__WqOp *op)
{
	struct tp_wq_options o = { .size = sizeof(o), .owner_uid = -1 };
	struct tpc_access_wire aw;
	int r;

	if (opts) {
		if (opts->size == 0)
			return tpc_error(-EINVAL, "tp_wq_options.size is not set");
		memcpy(&o, opts, TPU_MIN(opts->size, sizeof(o)));
	}
	if (o.flags & ~(TP_WQ_CREATE | TP_WQ_EXCL | TP_WQ_AT_MOST_ONCE))
		return tpc_error(-EINVAL, "unknown work queue flags 0x%x", o.flags);
	r = tpc_access_wire((int)o.access, (long)o.gid, o.owner_uid, &aw);
	if (r < 0)
		return r;
	r = tpc_remote_wire((int)o.remote, o.remote_peers, o.n_remote_peers, &op->remote,
			    &op->remote_peers, &op->n_remote_peers);
	if (r < 0)
		return r;
	op->access = aw.access;
	op->gid = aw.gid;
	op->owner_set = aw.owner_set;
	op->owner_uid = aw.owner_uid;
	op->create = o.flags & TP_WQ_CREATE;
	op->exclusive = o.flags & TP_WQ_EXCL;
	op->at_most_once = o.flags & TP_WQ_AT_MOST_ONCE;
	return 0;
}

TP_EXPORT int tp_wq_open(struct tp_context *ctx, const char *name, const struct tp_wq_options *o,
			 struct tp_wq **ret)
{
	Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;
	struct wq_req wr = { 0 };
	struct tp_wq *q;
	int r;

	if (!ctx || !name || !ret)
		return tpc_error(-EINVAL, "tp_wq_open: NULL argument");
	if (!tpc_object_name_ok(name))
		return tpc_error(-EINVAL, "'%.64s' is not a work queue name (1 to 255 bytes of "
				 "[A-Za-z0-9._@:+-]) nor tpip://HOST[:PORT]/NAME", name);
	r = wq_options(o, &op);
	if (r < 0)
		return r;
	op.op = TPW__V1__WQ_OP_KIND__WQ_OP_OPEN;
	op.name = (char *)name;
	q = calloc(1, sizeof(*q));
	if (!q || !(q->name = strdup(name))) {
		free(q);
		return tpc_error(-ENOMEM, "out of memory");
	}
	r = tpc_wq_call(ctx, &op, NULL, 0, 0, &wr);
	if (r < 0) {
		free(q->name);
		free(q);
		return tpc_error(r, "cannot open work queue '%s': %s", name, wr.req.msg);
	}
	q->ctx = ctx;
	q->id = wr.wq_id;
	q->owner = wr.owner;
	q->remote = strncmp(name, "tpip://", 7) == 0;
	q->remote_refs = q->remote && wr.remote_refs;
	tpu_list_init(&q->descs);
	*ret = q;
	return 0;
}

TP_EXPORT bool tp_wq_is_owner(const struct tp_wq *q)
{
	return q && q->owner;
}

/* SUBMIT or REPLY: @len bytes at @data as the tail. */
static int wq_send_payload(struct tp_wq *q, Tpw__V1__WqOp *op, const void *data, size_t len,
			   struct wq_req *wr)
{
	int r;

	if (!q || !data || len == 0)
		return tpc_error(-EINVAL, "work queue payload: NULL or empty");
	if (len > q->ctx->lim.inline_max)
		return tpc_error(-EMSGSIZE, "a payload of %zu bytes exceeds the daemon's inline "
				 "limit %u", len, q->ctx->lim.inline_max);
	op->wq_id = q->id;
	r = tpc_wq_call(q->ctx, op, data, len, 0, wr);
	free(wr->data);
	if (r < 0)
		return tpc_error(r, "work queue '%s': %s", q->name, wr->req.msg);
	return 0;
}

TP_EXPORT int tp_wq_submit(struct tp_wq *q, const void *data, size_t len, uint64_t *ret_id)
{
	Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;
	struct wq_req wr = { 0 };
	int r;

	op.op = TPW__V1__WQ_OP_KIND__WQ_OP_SUBMIT;
	r = wq_send_payload(q, &op, data, len, &wr);
	if (r == 0 && ret_id)
		*ret_id = wr.qid;
	return r;
}

TP_EXPORT int tp_wq_reply(struct tp_wq *q, uint64_t id, const void *data, size_t len)
{
	Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;
	struct wq_req wr = { 0 };

	op.op = TPW__V1__WQ_OP_KIND__WQ_OP_REPLY;
	op.question_id = id;
	return wq_send_payload(q, &op, data, len, &wr);
}

/* TAKE or ANSWER: one payload back. */
static int wq_get(struct tp_wq *q, Tpw__V1__WqOpKind kind, uint64_t *ret_id, void **ret_data,
		  size_t *ret_len, int timeout_ms)
{
	Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;
	struct wq_req wr = { 0 };
	int r;

	if (!q || !ret_id || !ret_data || !ret_len)
		return tpc_error(-EINVAL, "work queue: NULL argument");
	op.op = kind;
	op.wq_id = q->id;
	op.timeout_ms = timeout_ms < 0 ? UINT32_MAX : (uint32_t)timeout_ms;
	r = tpc_wq_call(q->ctx, &op, NULL, 0, timeout_ms, &wr);
	if (r == -ETIMEDOUT && timeout_ms == 0 && wr.req.done)
		r = -EAGAIN;
	if (r < 0) {
		free(wr.data);
		return tpc_error(r, "work queue '%s': %s", q->name, wr.req.msg);
	}
	*ret_id = wr.qid;
	*ret_data = wr.data;
	*ret_len = wr.len;
	if (wr.answer_err < 0)
		return tpc_error(wr.answer_err, "work queue '%s': question %llu's worker died",
				 q->name, (unsigned long long)wr.qid);
	if (!wr.data)
		return tpc_error(-EPROTO, "work queue '%s': an answer without a payload", q->name);
	return 0;
}

TP_EXPORT int tp_wq_answer(struct tp_wq *q, uint64_t *ret_id, void **ret_data, size_t *ret_len,
			   int timeout_ms)
{
	return wq_get(q, TPW__V1__WQ_OP_KIND__WQ_OP_ANSWER, ret_id, ret_data, ret_len, timeout_ms);
}

TP_EXPORT int tp_wq_take(struct tp_wq *q, uint64_t *ret_id, void **ret_data, size_t *ret_len,
			 int timeout_ms)
{
	return wq_get(q, TPW__V1__WQ_OP_KIND__WQ_OP_TAKE, ret_id, ret_data, ret_len, timeout_ms);
}

static int wq_simple(struct tp_wq *q, Tpw__V1__WqOpKind kind, int timeout_ms, const char *what)
{
	Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;
	struct wq_req wr = { 0 };
	int r;

	op.op = kind;
	op.wq_id = q->id;
	op.timeout_ms = timeout_ms < 0 ? UINT32_MAX : (uint32_t)timeout_ms;
	r = tpc_wq_call(q->ctx, &op, NULL, 0, timeout_ms, &wr);
	if (r == -ETIMEDOUT && timeout_ms == 0 && wr.req.done)
		r = -EAGAIN;
	if (r < 0)
		return tpc_error(r, "cannot %s work queue '%s': %s", what, q->name, wr.req.msg);
	return 0;
}

TP_EXPORT int tp_wq_drain(struct tp_wq *q, int timeout_ms)
{
	if (!q)
		return tpc_error(-EINVAL, "tp_wq_drain: NULL queue");
	return wq_simple(q, TPW__V1__WQ_OP_KIND__WQ_OP_DRAIN, timeout_ms, "drain");
}

TP_EXPORT int tp_wq_close(struct tp_wq *q)
{
	if (!q)
		return tpc_error(-EINVAL, "tp_wq_close: NULL queue");
	return wq_simple(q, TPW__V1__WQ_OP_KIND__WQ_OP_CLOSE, 0, "close");
}

TP_EXPORT int tp_wq_release(struct tp_wq *q)
{
	int r;

	if (!q)
		return 0;
	r = wq_simple(q, TPW__V1__WQ_OP_KIND__WQ_OP_RELEASE, 0, "release");
	tpc_wq_msg_orphan(q);
	free(q->name);
	free(q);
	return r;
}
