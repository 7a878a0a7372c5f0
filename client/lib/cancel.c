/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tp_cancel(): giving up on one pending operation of a context, named by the id its _ex start
 * call returned. Descriptor requests, accepts and writes or reads the library still holds
 * complete here with -ECANCELED; a write or read the daemon has is asked to stop with a Cancel
 * frame (protocol minor 5), and completes when the daemon says how it ended. Either way the
 * callback runs exactly once, on the library thread, and only then is the operation's memory
 * free. The blocking calls with a timeout (sync.c) give up through here.
 */
#include <inttypes.h>
#include "internal.h"

static int cancel_send(struct tp_context *ctx, uint64_t pipe_id, Tpw__V1__CancelKind kind,
		       uint64_t id)
{
	Tpw__V1__Cancel c = TPW__V1__CANCEL__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;

	c.pipe_id = pipe_id;
	c.kind = kind;
	c.id = id;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CANCEL;
	m.cancel = &c;
	return tpc_wire_send(ctx, &m, NULL, 0, -EBADF);
}

/*
 * Cancels a pending write or read; lock held. Return: 1 when a Cancel for (@ret_pipe,
 * @ret_kind, op->id) must be sent, 0 when nothing more is needed, -errno (message set).
 */
static int cancel_transfer_locked(struct tp_context *ctx, struct tpc_op *op, uint64_t *ret_pipe,
				  Tpw__V1__CancelKind *ret_kind)
{
	struct tp_pipe *p = op->pipe;
	bool write = op->kind == TPC_OP_WRITE;

	if (!op->sent) {
		/* Held by the library (never sent): it ends here, in its pipe's order. A held write
		 * leaves the flow-control FIFO now, so the pump never sends it. */
		if (write)
			tpu_list_remove(&op->hnode);
		tpc_op_ready_locked(ctx, write ? &p->writes : &p->reads, op, -ECANCELED,
				    "cancelled before it reached the daemon");
		return 0;
	}
	op->cancel_sent = true;
	if (!tpc_pipe_at_daemon(p))
		return 0; /* closing or lost: it completes with the pipe, as tp_pipe_close() says */
	if (ctx->daemon_minor < TPW_MINOR_CANCEL) {
		op->cancel_sent = false;
		return tpc_error(-EOPNOTSUPP,
				 "the daemon (protocol 1.%u) cannot cancel a %s it holds; "
				 "it needs 1.%u",
				 ctx->daemon_minor, write ? "write" : "read", TPW_MINOR_CANCEL);
	}
	*ret_pipe = p->id;
	*ret_kind = write ? TPW__V1__CANCEL_KIND__CANCEL_WRITE : TPW__V1__CANCEL_KIND__CANCEL_READ;
	return 1;
}

TP_EXPORT int tp_cancel(struct tp_context *ctx, uint64_t id)
{
	Tpw__V1__CancelKind kind = TPW__V1__CANCEL_KIND__CANCEL_UNSPECIFIED;
	uint64_t pipe_id = 0, op_id = 0;
	struct tpc_op *op;
	int r;

	if (!ctx)
		return tpc_error(-EINVAL, "no context");
	pthread_mutex_lock(&ctx->send_lock);
	pthread_mutex_lock(&ctx->lock);
	op = id ? tpc_map_get(&ctx->ops, id) : NULL;
	if (!op || !op->pending || op->ready) {
		r = tpc_error(-ENOENT, "no pending operation %" PRIu64 " (finished or unknown)",
			      id);
	} else if (op->cancel_sent) {
		r = tpc_error(-EALREADY, "operation %" PRIu64 " is already being cancelled", id);
	} else if (op->kind == TPC_OP_DESC || op->kind == TPC_OP_ACCEPT) {
		tpc_op_complete_locked(ctx, op, -ECANCELED, "cancelled (tp_cancel)");
		r = 0;
	} else {
		op_id = op->id;
		r = cancel_transfer_locked(ctx, op, &pipe_id, &kind);
	}
	pthread_mutex_unlock(&ctx->lock);
	/* send_lock held since the lookup: the Cancel follows the op's own frame. */
	if (r == 1) {
		cancel_send(ctx, pipe_id, kind, op_id); /* a failed send is connection loss */
		r = 0;
	}
	pthread_mutex_unlock(&ctx->send_lock);
	return r;
}
