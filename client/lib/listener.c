/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Listeners: registering a name with the daemon (waiting for its Reply), matching the daemon's
 * Accepted events FIFO with accept calls (pipes wait in a backlog when no call is pending), and
 * closing. The pipes themselves are pipe.c's.
 */
#include <stdio.h>
#include <string.h>
#include "internal.h"

void tpc_listener_free(struct tp_listener *l)
{
	if (!l)
		return;
	tpu_list_remove(&l->link);
	free(l->name);
	free(l);
}

void tpc_listener_free_all(struct tp_context *ctx)
{
	struct tp_listener *l, *tmp;

	tpu_list_for_each_safe(l, tmp, &ctx->listeners, link)
		tpc_listener_free(l);
}

static void listener_fail_accepts(struct tp_context *ctx, struct tp_listener *l, int err,
				  const char *msg)
{
	struct tpc_op *op;

	while ((op = tpu_list_first(&l->accepts, struct tpc_op, node)))
		tpc_op_complete_locked(ctx, op, err, msg);
}

void tpc_listener_fail_all_locked(struct tp_context *ctx, int err, const char *msg)
{
	struct tp_listener *l;

	tpu_list_for_each(l, &ctx->listeners, link) {
		if (l->closed)
			continue;
		l->closed = true;
		l->err = err;
		listener_fail_accepts(ctx, l, err, msg);
	}
}

static struct tp_listener *listener_find_locked(struct tp_context *ctx, uint64_t id)
{
	struct tp_listener *l;

	tpu_list_for_each(l, &ctx->listeners, link)
		if (l->id == id && !l->closed)
			return l;
	return NULL;
}

void tpc_listener_on_accepted(struct tp_context *ctx, const Tpw__V1__Accepted *m,
			      uint64_t *ret_reject)
{
	struct tp_listener *l = listener_find_locked(ctx, m->listener_id);
	struct tp_pipe *p = NULL;
	struct tpc_op *op;

	if (l && !tpc_map_get(&ctx->pipes, m->pipe_id))
		p = tpc_pipe_new(ctx, m->pipe_id);
	if (p && (tpc_map_put(&ctx->pipes, p->id, p) < 0 ||
		  !(p->remote_name = strdup(m->remote_name ? m->remote_name : "")))) {
		if (tpc_map_get(&ctx->pipes, p->id) == p)
			tpc_map_del(&ctx->pipes, p->id);
		tpc_pipe_unref_locked(p);
		p = NULL;
	}
	if (!p) {
		*ret_reject = m->pipe_id;
		return;
	}
	p->remote_uid = (uid_t)m->remote_uid;
	p->remote_uid_status = m->remote_host ? TP_UID_CLAIMED : 0;
	op = tpu_list_first(&l->accepts, struct tpc_op, node);
	if (op) {
		op->accepted = p;
		tpc_op_complete_locked(ctx, op, 0, NULL);
	} else {
		tpu_list_insert_tail(&l->backlog, &p->backlog_link);
	}
}

int tpc_listener_accept_start(struct tp_listener *l, tp_accept_fn cb, void *arg,
			      struct tpc_op **ret_op, uint64_t *ret_id)
{
	struct tp_context *ctx;
	struct tp_pipe *p;
	struct tpc_op *op;
	int r;

	if (!l || !cb)
		return tpc_error(-EINVAL, "missing listener or callback");
	ctx = l->ctx;
	op = tpc_op_new(TPC_OP_ACCEPT, 0);
	if (!op)
		return tpc_error(-ENOMEM, "out of memory");
	op->cb.accept = cb;
	op->arg = arg;
	op->listener = l;
	pthread_mutex_lock(&ctx->lock);
	r = tpc_context_check_locked(ctx);
	if (r == 0 && l->closed)
		r = tpc_error(l->err ? l->err : -ECANCELED, "the listener is closed");
	if (r == 0)
		r = tpc_op_track_locked(ctx, op, true, ret_id);
	if (r == 0) {
		op->pending = true;
		tpu_list_insert_tail(&l->accepts, &op->node);
		if (ret_op)
			*ret_op = op;
		p = tpu_list_first(&l->backlog, struct tp_pipe, backlog_link);
		if (p) {
			tpu_list_remove(&p->backlog_link);
			op->accepted = p;
			tpc_op_complete_locked(ctx, op, 0, NULL);
		}
	}
	pthread_mutex_unlock(&ctx->lock);
	if (r < 0)
		tpc_op_free(op);
	return r;
}

TP_EXPORT int tp_listener_accept(struct tp_listener *l, tp_accept_fn cb, void *arg)
{
	return tpc_listener_accept_start(l, cb, arg, NULL, NULL);
}

TP_EXPORT int tp_listener_accept_ex(struct tp_listener *l, tp_accept_fn cb, void *arg,
				    uint64_t *ret_op)
{
	uint64_t id = 0;
	int r = tpc_listener_accept_start(l, cb, arg, NULL, &id);

	if (r == 0 && ret_op)
		*ret_op = id;
	return r;
}

TP_EXPORT const char *tp_listener_name(const struct tp_listener *l)
{
	return l ? l->name : "";
}

static void listener_on_reply(struct tp_context *ctx, struct tpc_req *req,
			      const Tpw__V1__Reply *r)
{
	struct tp_listener *l = tpu_container_of(req, struct tp_listener, req);

	tpc_context_req_done(ctx, req, r);
	/* Filed here, under the lock, so that an Accepted right behind the Reply finds it. */
	if (req->status == 0) {
		l->id = req->result_id;
		tpu_list_insert_tail(&ctx->listeners, &l->link);
	}
}

/* Options' remote access into @ls (which borrows the peer names). */
static int listener_remote(const struct tp_listen_options *o, Tpw__V1__Listen *ls)
{
	switch (o->remote) {
	case TP_REMOTE_NONE:
		ls->remote = TPW__V1__REMOTE_ACCESS__REMOTE_NONE;
		return 0;
	case TP_REMOTE_ANY_PEER:
		ls->remote = TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER;
		return 0;
	case TP_REMOTE_PEERS:
		break;
	default:
		return tpc_error(-EINVAL, "unknown remote access %d", (int)o->remote);
	}
	if (!o->remote_peers || o->n_remote_peers == 0 || o->n_remote_peers > TPW_REMOTE_PEERS_MAX)
		return tpc_error(-EINVAL, "TP_REMOTE_PEERS takes 1..%u peer identities",
				 TPW_REMOTE_PEERS_MAX);
	for (size_t i = 0; i < o->n_remote_peers; i++) {
		const char *n = o->remote_peers[i];
		if (!n || !*n || strnlen(n, TPW_NAME_MAX + 1) > TPW_NAME_MAX)
			return tpc_error(-EINVAL, "remote peer %zu: 1..%d bytes", i, TPW_NAME_MAX);
	}
	ls->remote = TPW__V1__REMOTE_ACCESS__REMOTE_PEERS;
	ls->remote_peers = (char **)o->remote_peers;
	ls->n_remote_peers = o->n_remote_peers;
	return 0;
}

static int listener_access(const struct tp_listen_options *opts, Tpw__V1__Listen *ls)
{
	struct tp_listen_options o = { .size = sizeof(o), .access = TP_ACCESS_OWNER };

	if (opts) {
		if (opts->size == 0)
			return tpc_error(-EINVAL, "tp_listen_options.size is not set");
		memcpy(&o, opts, TPU_MIN(opts->size, sizeof(o)));
	}
	switch (o.access) {
	case TP_ACCESS_OWNER:
		ls->access = TPW__V1__ACCESS__ACCESS_OWNER;
		break;
	case TP_ACCESS_GROUP:
		ls->access = TPW__V1__ACCESS__ACCESS_GROUP;
		ls->gid = (uint32_t)o.gid;
		break;
	case TP_ACCESS_ANYONE:
		ls->access = TPW__V1__ACCESS__ACCESS_ANYONE;
		break;
	default:
		return tpc_error(-EINVAL, "unknown access mode %d", (int)o.access);
	}
	return listener_remote(&o, ls);
}

static struct tp_listener *listener_new(struct tp_context *ctx, const char *name)
{
	struct tp_listener *l = calloc(1, sizeof(*l));

	if (!l)
		return NULL;
	l->ctx = ctx;
	l->name = strdup(name);
	tpu_list_init(&l->link);
	tpu_list_init(&l->accepts);
	tpu_list_init(&l->backlog);
	tpu_list_init(&l->free_op.node);
	l->free_op.kind = TPC_OP_LISTENER_FREE;
	l->free_op.listener = l;
	if (!l->name) {
		free(l);
		return NULL;
	}
	return l;
}

/* Sends Listen and waits for the Reply. */
static int listener_register(struct tp_listener *l, Tpw__V1__Listen *ls)
{
	struct tp_context *ctx = l->ctx;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	int r;

	pthread_mutex_lock(&ctx->send_lock);
	pthread_mutex_lock(&ctx->lock);
	r = tpc_context_check_locked(ctx);
	if (r == 0 && tpc_context_req_start_locked(ctx, &l->req, listener_on_reply) < 0)
		r = tpc_error(-ENOMEM, "out of memory");
	pthread_mutex_unlock(&ctx->lock);
	if (r == 0) {
		ls->req_id = l->req.id;
		ls->name = l->name;
		m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTEN;
		m.listen = ls;
		tpc_wire_send(ctx, &m, NULL, 0, -EBADF);
	}
	pthread_mutex_unlock(&ctx->send_lock);
	if (r < 0)
		return r;
	pthread_mutex_lock(&ctx->lock);
	r = tpc_context_req_wait_locked(ctx, &l->req, ctx->reply_ms);
	pthread_mutex_unlock(&ctx->lock);
	if (r < 0)
		tpc_error(r, "cannot listen on \"%s\": %s", l->name, l->req.msg);
	return r;
}

TP_EXPORT int tp_listen(struct tp_context *ctx, const char *name,
			const struct tp_listen_options *opts, struct tp_listener **ret)
{
	Tpw__V1__Listen ls = TPW__V1__LISTEN__INIT;
	struct tp_listener *l;
	int r;

	if (!ctx || !ret)
		return tpc_error(-EINVAL, "missing context or result pointer");
	if (!tpw_name_valid(name))
		return tpc_error(-EINVAL, "invalid listener name (1..%d bytes of [A-Za-z0-9._@:+-])",
				 TPW_NAME_MAX);
	r = listener_access(opts, &ls);
	if (r < 0)
		return r;
	if (tpc_context_on_io_thread(ctx))
		return tpc_error(-EDEADLK, "tp_listen() called from a callback");
	l = listener_new(ctx, name);
	if (!l)
		return tpc_error(-ENOMEM, "out of memory");
	r = listener_register(l, &ls);
	if (r < 0) {
		tpc_listener_free(l);
		return r;
	}
	*ret = l;
	return 0;
}

/* Closes up to @max pipes nobody accepted; collects their ids for PipeClose. Lock held. */
static size_t listener_drop_backlog(struct tp_listener *l, uint64_t *ids, size_t max)
{
	struct tp_pipe *p;
	size_t n = 0;

	while (n < max && (p = tpu_list_first(&l->backlog, struct tp_pipe, backlog_link))) {
		tpu_list_remove(&p->backlog_link);
		if (tpc_pipe_close_locked(p, false))
			ids[n++] = p->id;
		tpc_pipe_unref_locked(p);
	}
	return n;
}

/* Refuses the backlog in batches; send_lock held, lock not held. */
static void listener_refuse_backlog(struct tp_listener *l)
{
	struct tp_context *ctx = l->ctx;
	uint64_t ids[64];
	size_t n;

	do {
		pthread_mutex_lock(&ctx->lock);
		n = listener_drop_backlog(l, ids, TPU_ARRAY_SIZE(ids));
		pthread_mutex_unlock(&ctx->lock);
		for (size_t i = 0; i < n; i++)
			tpc_wire_send_pipe_close(ctx, ids[i]);
	} while (n == TPU_ARRAY_SIZE(ids));
}

TP_EXPORT void tp_listener_close(struct tp_listener *l)
{
	Tpw__V1__ListenerClose lc = TPW__V1__LISTENER_CLOSE__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	struct tp_context *ctx;
	bool send_close, again;

	if (!l)
		return;
	ctx = l->ctx;
	pthread_mutex_lock(&ctx->send_lock);
	pthread_mutex_lock(&ctx->lock);
	again = l->user_closed;
	send_close = !l->closed && !ctx->dead;
	l->user_closed = true;
	l->closed = true;
	l->err = -ECANCELED;
	if (!again)
		listener_fail_accepts(ctx, l, -ECANCELED, "canceled: the listener was closed");
	pthread_mutex_unlock(&ctx->lock);
	if (again) {
		pthread_mutex_unlock(&ctx->send_lock);
		return;
	}
	if (send_close) {
		lc.listener_id = l->id;
		m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTENER_CLOSE;
		m.listener_close = &lc;
		tpc_wire_send(ctx, &m, NULL, 0, -EBADF);
	}
	listener_refuse_backlog(l);
	/* Freed on the io thread once the callbacks queued before it have run. */
	pthread_mutex_lock(&ctx->lock);
	l->free_op.pending = true;
	tpc_op_complete_locked(ctx, &l->free_op, 0, NULL);
	pthread_mutex_unlock(&ctx->lock);
	pthread_mutex_unlock(&ctx->send_lock);
}
