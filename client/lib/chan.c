/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Channels hosted by the daemon (tpclient.h, "channels"; docs/channels.md). Responsible for
 * the tp_chan_* calls: each sends one ChanOp and waits for its ChanReply, whose data tail is the
 * item of a read. Not responsible for the channel's state (the daemon keeps it) nor for the
 * connection (context.c, wire.c).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "internal.h"

struct tp_chan {
	struct tp_context *ctx;
	uint64_t id;
	char *name;
};

struct chan_req {
	struct tpc_req req; /* first: the reply handler finds the chan_req from it */
	uint8_t *item;
	size_t len;
	bool closed;
	uint64_t chan_id;
};

/* The map's handler for a request answered by ChanReply: only a lost connection (@r NULL)
 * reaches it through the map; a Reply naming the id fails the call too. */
static void chan_req_on_reply(struct tp_context *ctx, struct tpc_req *req,
			      const Tpw__V1__Reply *r)
{
	tpc_context_req_done(ctx, req, r);
	if (r && req->status == 0)
		req->status = -EPROTO;
}

void tpc_chan_on_reply(struct tp_context *ctx, const Tpw__V1__ChanReply *m, const uint8_t *tail,
		       size_t tail_len)
{
	struct tpc_req *req = tpc_map_get(&ctx->reqs, m->req_id);
	struct chan_req *cr;

	if (!req || req->on_reply != chan_req_on_reply)
		return; /* the call gave up waiting, or not one of ours */
	tpc_map_del(&ctx->reqs, m->req_id);
	cr = (struct chan_req *)req;
	req->status = tpw_status_to_errno(m->status);
	snprintf(req->msg, sizeof(req->msg), "%s",
		 m->message && *m->message ? m->message : tp_strerror(req->status));
	cr->closed = m->closed;
	cr->chan_id = m->chan_id;
	if (req->status == 0 && m->n_lengths == 1) {
		cr->item = malloc(tail_len ? tail_len : 1);
		if (cr->item) {
			memcpy(cr->item, tail, tail_len);
			cr->len = tail_len;
		} else {
			req->status = -ENOMEM;
			snprintf(req->msg, sizeof(req->msg), "out of memory for an item");
		}
	}
	req->done = true;
	pthread_cond_broadcast(&ctx->cond);
}

/* Sends @op (its req_id filled here) with @items as the data tail and waits up to @wait_ms plus
 * the reply timeout for the answer in @cr. Return: the daemon's status or -errno. */
static int chan_call(struct tp_context *ctx, Tpw__V1__ChanOp *op, const struct iovec *items,
		     size_t n, int wait_ms, struct chan_req *cr)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	int r;

	pthread_mutex_lock(&ctx->lock);
	r = tpc_context_check_locked(ctx);
	if (r == 0 && tpc_context_req_start_locked(ctx, &cr->req, chan_req_on_reply) < 0)
		r = tpc_error(-ENOMEM, "out of memory");
	pthread_mutex_unlock(&ctx->lock);
	if (r < 0)
		return r;
	op->req_id = cr->req.id;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = op;
	pthread_mutex_lock(&ctx->send_lock);
	tpc_wire_send(ctx, &m, items, n, -EBADF); /* failure: connection loss fails the request */
	pthread_mutex_unlock(&ctx->send_lock);
	pthread_mutex_lock(&ctx->lock);
	if (wait_ms < 0 || wait_ms > INT_MAX - ctx->reply_ms)
		wait_ms = INT_MAX - ctx->reply_ms;
	r = tpc_context_req_wait_locked(ctx, &cr->req, wait_ms + ctx->reply_ms);
	pthread_mutex_unlock(&ctx->lock);
	return r;
}

static int chan_options(const struct tp_chan_options *opts, Tpw__V1__ChanOp *op)
{
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = -1 };

	if (opts) {
		if (opts->size == 0)
			return tpc_error(-EINVAL, "tp_chan_options.size is not set");
		memcpy(&o, opts, TPU_MIN(opts->size, sizeof(o)));
	}
	if (o.flags & ~(TP_CHAN_CREATE | TP_CHAN_EXCL | TP_CHAN_PERSISTENT))
		return tpc_error(-EINVAL, "unknown channel flags 0x%x", o.flags);
	switch (o.access) {
	case TP_ACCESS_OWNER:
		op->access = TPW__V1__ACCESS__ACCESS_OWNER;
		break;
	case TP_ACCESS_GROUP:
		op->access = TPW__V1__ACCESS__ACCESS_GROUP;
		op->gid = (uint32_t)o.gid;
		break;
	case TP_ACCESS_ANYONE:
		op->access = TPW__V1__ACCESS__ACCESS_ANYONE;
		break;
	default:
		return tpc_error(-EINVAL, "unknown access mode %d", (int)o.access);
	}
	if (o.owner_uid < -1 || o.owner_uid > (long)UINT32_MAX - 1)
		return tpc_error(-EINVAL, "owner uid %ld", o.owner_uid);
	op->create = o.flags & TP_CHAN_CREATE;
	op->exclusive = o.flags & TP_CHAN_EXCL;
	op->persistent = o.flags & TP_CHAN_PERSISTENT;
	op->capacity_items = o.capacity_items;
	op->capacity_bytes = o.capacity_bytes;
	op->owner_set = o.owner_uid >= 0;
	op->owner_uid = op->owner_set ? (uint32_t)o.owner_uid : 0;
	return 0;
}

TP_EXPORT int tp_chan_open(struct tp_context *ctx, const char *name,
			   const struct tp_chan_options *o, struct tp_chan **ret)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct chan_req cr = { 0 };
	struct tp_chan *ch;
	int r;

	if (!ctx || !name || !ret)
		return tpc_error(-EINVAL, "tp_chan_open: NULL argument");
	if (!tpw_name_valid(name))
		return tpc_error(-EINVAL, "'%.64s' is not a channel name (1 to 255 bytes of "
				 "[A-Za-z0-9._@:+-])", name);
	r = chan_options(o, &op);
	if (r < 0)
		return r;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = (char *)name;
	ch = calloc(1, sizeof(*ch));
	if (!ch || !(ch->name = strdup(name))) {
		free(ch);
		return tpc_error(-ENOMEM, "out of memory");
	}
	r = chan_call(ctx, &op, NULL, 0, 0, &cr);
	if (r < 0) {
		free(ch->name);
		free(ch);
		return tpc_error(r, "cannot open channel '%s': %s", name, cr.req.msg);
	}
	ch->ctx = ctx;
	ch->id = cr.chan_id;
	*ret = ch;
	return 0;
}

TP_EXPORT int tp_chan_write(struct tp_chan *ch, const struct iovec *items, size_t n,
			    int timeout_ms)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct chan_req cr = { 0 };
	_cleanup_free_ uint64_t *lens = NULL;
	uint64_t total = 0;
	int r;

	if (!ch || !items || n == 0)
		return tpc_error(-EINVAL, "tp_chan_write: no item");
	if (n > ch->ctx->lim.segments_max)
		return tpc_error(-EMSGSIZE, "a batch of %zu items exceeds the daemon's %u", n,
				 ch->ctx->lim.segments_max);
	lens = calloc(n, sizeof(*lens));
	if (!lens)
		return tpc_error(-ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		if (items[i].iov_len == 0 || (!items[i].iov_base))
			return tpc_error(-EINVAL, "item %zu is empty", i);
		lens[i] = items[i].iov_len;
		total += lens[i];
		if (total > ch->ctx->lim.inline_max)
			return tpc_error(-EMSGSIZE, "a batch of more than %u bytes (the daemon's "
					 "inline limit)", ch->ctx->lim.inline_max);
	}
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	op.chan_id = ch->id;
	op.n_lengths = n;
	op.lengths = lens;
	op.timeout_ms = timeout_ms < 0 ? UINT32_MAX : (uint32_t)timeout_ms;
	r = chan_call(ch->ctx, &op, items, n, timeout_ms, &cr);
	if (r < 0)
		return tpc_error(r, "channel '%s': %s", ch->name, cr.req.msg);
	return 0;
}

TP_EXPORT int tp_chan_read(struct tp_chan *ch, void **ret_item, size_t *ret_len, int timeout_ms)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct chan_req cr = { 0 };
	int r;

	if (!ch || !ret_item || !ret_len)
		return tpc_error(-EINVAL, "tp_chan_read: NULL argument");
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = ch->id;
	op.timeout_ms = timeout_ms < 0 ? UINT32_MAX : (uint32_t)timeout_ms;
	r = chan_call(ch->ctx, &op, NULL, 0, timeout_ms, &cr);
	if (r == -ETIMEDOUT && timeout_ms == 0 && cr.req.done)
		r = -EAGAIN;
	if (r < 0) {
		free(cr.item);
		return tpc_error(r, "channel '%s': %s", ch->name, cr.req.msg);
	}
	if (!cr.item)
		return tpc_error(-EPROTO, "channel '%s': an answer without an item", ch->name);
	*ret_item = cr.item;
	*ret_len = cr.len;
	return cr.closed ? TP_CHAN_CLOSED : 0;
}

static int chan_simple(struct tp_chan *ch, Tpw__V1__ChanOpKind kind, const char *what)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct chan_req cr = { 0 };
	int r;

	op.op = kind;
	op.chan_id = ch->id;
	r = chan_call(ch->ctx, &op, NULL, 0, 0, &cr);
	if (r < 0)
		return tpc_error(r, "cannot %s channel '%s': %s", what, ch->name, cr.req.msg);
	return 0;
}

TP_EXPORT int tp_chan_close(struct tp_chan *ch)
{
	if (!ch)
		return tpc_error(-EINVAL, "tp_chan_close: NULL channel");
	return chan_simple(ch, TPW__V1__CHAN_OP_KIND__CHAN_OP_CLOSE, "close");
}

TP_EXPORT int tp_chan_release(struct tp_chan *ch)
{
	int r;

	if (!ch)
		return 0;
	r = chan_simple(ch, TPW__V1__CHAN_OP_KIND__CHAN_OP_RELEASE, "release");
	free(ch->name);
	free(ch);
	return r;
}

TP_EXPORT int tp_chan_unlink(struct tp_context *ctx, const char *name, long owner_uid)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct chan_req cr = { 0 };
	int r;

	if (!ctx || !name || !tpw_name_valid(name))
		return tpc_error(-EINVAL, "tp_chan_unlink: not a channel name");
	if (owner_uid < -1 || owner_uid > (long)UINT32_MAX - 1)
		return tpc_error(-EINVAL, "owner uid %ld", owner_uid);
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK;
	op.name = (char *)name;
	op.owner_set = owner_uid >= 0;
	op.owner_uid = op.owner_set ? (uint32_t)owner_uid : 0;
	r = chan_call(ctx, &op, NULL, 0, 0, &cr);
	if (r < 0)
		return tpc_error(r, "cannot unlink channel '%s': %s", name, cr.req.msg);
	return 0;
}
