/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Pipes: connecting (client-chosen ids, Connect sent at once, Reply awaited lazily), their
 * lifetime (references held by the user's handle and by descriptors the user holds), local
 * close and the daemon's PipeClosed, which fail what is pending on a pipe. Moving messages is
 * write.c's and read.c's job; accepted pipes are created by listener.c.
 */
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include "internal.h"

#define ADDRESS_MAX 1024
#define PIPE_ID_CLIENT_MAX (1ull << 63)

struct tp_pipe *tpc_pipe_new(struct tp_context *ctx, uint64_t id)
{
	struct tp_pipe *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	p->ctx = ctx;
	p->id = id;
	p->refs = 1;
	p->state = TPC_PIPE_OPEN;
	p->remote_uid_status = -ENODATA;
	tpu_list_init(&p->writes);
	tpu_list_init(&p->reads);
	tpu_list_init(&p->desc_reqs);
	tpu_list_init(&p->descs);
	tpu_list_init(&p->held);
	tpu_list_init(&p->wheld);
	tpu_list_init(&p->backlog_link);
	tpu_list_init(&p->free_op.node);
	p->free_op.kind = TPC_OP_PIPE_FREE;
	p->free_op.pipe = p;
	tpu_list_insert_tail(&ctx->all_pipes, &p->ctx_link);
	return p;
}

static void pipe_free_descs(struct tpu_list *list)
{
	struct tpc_desc *d, *tmp;

	tpu_list_for_each_safe(d, tmp, list, node)
		tpc_read_desc_free(d);
	tpu_list_init(list);
}

static void pipe_free(struct tp_pipe *p)
{
	pipe_free_descs(&p->descs);
	pipe_free_descs(&p->held);
	tpu_list_remove(&p->ctx_link);
	tpu_list_remove(&p->backlog_link);
	free(p->remote_name);
	free(p->errmsg);
	free(p);
}

void tpc_pipe_unref_locked(struct tp_pipe *p)
{
	if (--p->refs == 0)
		pipe_free(p);
}

void tpc_pipe_free_all(struct tp_context *ctx)
{
	struct tp_pipe *p, *tmp;

	tpu_list_for_each_safe(p, tmp, &ctx->all_pipes, ctx_link)
		pipe_free(p);
}

bool tpc_pipe_at_daemon(const struct tp_pipe *p)
{
	return !p->user_closed && p->state != TPC_PIPE_CLOSED && !p->ctx->dead;
}

int tpc_pipe_check_locked(struct tp_pipe *p)
{
	int r = tpc_context_check_locked(p->ctx);

	if (r < 0)
		return r;
	if (p->state == TPC_PIPE_FAILED || p->state == TPC_PIPE_CLOSED ||
	    p->state == TPC_PIPE_CLOSING)
		return tpc_error_msg(p->err, p->errmsg);
	return 0;
}

static void pipe_set_err(struct tp_pipe *p, int err, const char *msg)
{
	if (p->err)
		return;
	p->err = err;
	p->errmsg = strdup(msg && *msg ? msg : tp_strerror(err));
}

static void pipe_fail_list(struct tp_context *ctx, struct tpu_list *list, int err, const char *msg)
{
	struct tpc_op *op;

	/* Ops whose result is known (an eager read waiting for its turn) keep it. */
	while ((op = tpu_list_first(list, struct tpc_op, node)))
		tpc_op_complete_locked(ctx, op, op->ready ? op->status : err, msg);
}

/* Forgets the id and the pending connect request; lock held. */
static void pipe_forget(struct tp_pipe *p)
{
	struct tp_context *ctx = p->ctx;

	if (tpc_map_get(&ctx->pipes, p->id) == p)
		tpc_map_del(&ctx->pipes, p->id);
	/* By identity, not by connect_status: a close marks a connect still unanswered as
	 * canceled first, and its request must not outlive the pipe it is embedded in. */
	if (p->connect_req.id && tpc_map_get(&ctx->reqs, p->connect_req.id) == &p->connect_req)
		tpc_map_del(&ctx->reqs, p->connect_req.id);
}

/*
 * The daemon confirmed a local close (or can no longer touch our memory): the writes and reads
 * still pending complete with -ECANCELED, then the user's reference goes. Lock held.
 */
static void pipe_finish_close(struct tp_pipe *p)
{
	struct tp_context *ctx = p->ctx;

	pipe_forget(p);
	p->state = TPC_PIPE_CLOSED;
	pipe_fail_list(ctx, &p->writes, p->err, p->errmsg);
	pipe_fail_list(ctx, &p->reads, p->err, p->errmsg);
	p->free_op.pending = true;
	tpc_op_complete_locked(ctx, &p->free_op, 0, NULL);
	pthread_cond_broadcast(&ctx->cond);
}

/*
 * A failed pipe can no longer move bytes: descriptors whose bytes came with them (eager) stay
 * readable, but from the first one whose bytes are still with the writer on, none could be read.
 * They are dropped, so read_descriptor fails with the pipe's error instead of handing out a
 * descriptor the caller would allocate for in vain. Lock held.
 */
static void pipe_drop_unreadable_descs(struct tp_pipe *p)
{
	struct tpc_desc *d, *tmp;
	bool drop = false;

	tpu_list_for_each_safe(d, tmp, &p->descs, node) {
		drop = drop || !d->eager;
		if (drop)
			tpc_read_desc_free(d);
	}
}

void tpc_pipe_fail_locked(struct tp_pipe *p, int err, const char *msg)
{
	struct tp_context *ctx = p->ctx;

	if (p->state == TPC_PIPE_CLOSING) {
		pipe_finish_close(p);
		return;
	}
	pipe_set_err(p, err, msg);
	pipe_forget(p);
	p->state = TPC_PIPE_CLOSED;
	if (p->connect_status == 1)
		p->connect_status = p->err;
	pipe_fail_list(ctx, &p->writes, p->err, p->errmsg);
	pipe_fail_list(ctx, &p->reads, p->err, p->errmsg);
	/* Eager descriptors already received stay readable; only calls beyond them fail. */
	pipe_drop_unreadable_descs(p);
	tpc_read_match_locked(p);
	pipe_fail_list(ctx, &p->desc_reqs, p->err, p->errmsg);
	pthread_cond_broadcast(&ctx->cond);
}

void tpc_pipe_on_closed(struct tp_context *ctx, const Tpw__V1__PipeClosed *m)
{
	struct tp_pipe *p = tpc_map_get(&ctx->pipes, m->pipe_id);
	int err = tpw_status_to_errno(m->status);
	const char *msg = m->message;

	tpc_pring_pipe_gone_locked(ctx, m->pipe_id);
	if (!p)
		return;
	if (p->state == TPC_PIPE_CLOSING) {
		pipe_finish_close(p); /* the daemon's acknowledgement of our PipeClose */
		return;
	}
	if (m->status == TPW__V1__STATUS__STATUS_OK || m->status == TPW__V1__STATUS__STATUS_UNSPECIFIED)
		err = -EPIPE;
	if (!msg || !*msg)
		msg = err == -EPIPE ? "the remote end closed the pipe" : NULL;
	if (p->state == TPC_PIPE_OPEN) /* a failed connect was logged with its reply */
		tpc_context_log(ctx, LOG_INFO, "pipe %llu: %s (%s)", (unsigned long long)p->id,
				tp_strerror(err), msg ? msg : "");
	tpc_pipe_fail_locked(p, err, msg);
}

bool tpc_pipe_close_locked(struct tp_pipe *p, bool user)
{
	struct tp_context *ctx = p->ctx;
	const char *msg = "canceled: the pipe was closed locally";
	bool send_close = tpc_pipe_at_daemon(p);

	p->user_closed = true;
	if (p->connect_status == 1)
		p->connect_status = -ECANCELED;
	/* Its ring copies stop now, by our own flag: the other end can write every word of the
	 * ring, the daemon's dead word included, and the daemon's answer to the close may wait
	 * behind a copy on the thread that reads it. */
	tpc_pring_pipe_gone_locked(ctx, p->id);
	pipe_set_err(p, -ECANCELED, msg);
	pipe_fail_list(ctx, &p->desc_reqs, -ECANCELED, msg);
	pipe_free_descs(&p->descs);
	if (send_close && user && ctx->close_acks) {
		/* The daemon may be copying from or into the memory of pending writes and reads;
		 * they complete once it confirms the close (tpc_pipe_on_closed). */
		p->state = TPC_PIPE_CLOSING;
		pthread_cond_broadcast(&ctx->cond);
		return true;
	}
	if (user) {
		pipe_finish_close(p);
		return send_close;
	}
	/* A pipe nobody accepted: no operation of the user can be pending on it. */
	pipe_forget(p);
	p->state = TPC_PIPE_CLOSED;
	pthread_cond_broadcast(&ctx->cond);
	return send_close;
}

TP_EXPORT void tp_pipe_close(struct tp_pipe *p)
{
	struct tp_context *ctx;
	uint64_t id;
	bool send_close;

	if (!p)
		return;
	ctx = p->ctx;
	id = p->id; /* @p may be gone once the lock is dropped */
	pthread_mutex_lock(&ctx->send_lock);
	pthread_mutex_lock(&ctx->lock);
	if (p->user_closed) {
		pthread_mutex_unlock(&ctx->lock);
		pthread_mutex_unlock(&ctx->send_lock);
		return;
	}
	/* The user's reference goes once the callbacks queued before it have run, after the
	 * daemon's acknowledgement if the close goes to the daemon. */
	send_close = tpc_pipe_close_locked(p, true);
	pthread_mutex_unlock(&ctx->lock);
	if (send_close)
		tpc_wire_send_pipe_close(ctx, id);
	pthread_mutex_unlock(&ctx->send_lock);
}

static void pipe_on_connect_reply(struct tp_context *ctx, struct tpc_req *req,
				  const Tpw__V1__Reply *r)
{
	struct tp_pipe *p = tpu_container_of(req, struct tp_pipe, connect_req);
	int status;

	if (!r || p->connect_status != 1)
		return; /* connection lost: the pipe fails with everything else */
	status = tpw_status_to_errno(r->status);
	p->connect_status = status;
	if (status == 0)
		tpc_context_log(ctx, LOG_DEBUG, "pipe %llu: connected to '%s'",
				(unsigned long long)p->id, r->remote_name ? r->remote_name : "");
	else
		tpc_context_log(ctx, LOG_INFO, "pipe %llu: connect failed: %s (%s)",
				(unsigned long long)p->id, tp_strerror(status),
				r->message ? r->message : "");
	if (status == 0) {
		p->remote_name = strdup(r->remote_name ? r->remote_name : "");
		if (r->owner_known) {
			p->remote_uid = (uid_t)r->owner_uid;
			p->remote_uid_status = r->owner_remote ? TP_UID_CLAIMED : 0;
		}
		if (p->state == TPC_PIPE_CONNECTING)
			p->state = TPC_PIPE_OPEN;
	} else {
		pipe_set_err(p, status, r->message);
		if (p->state == TPC_PIPE_CONNECTING)
			p->state = TPC_PIPE_FAILED;
	}
	pthread_cond_broadcast(&ctx->cond);
}

static int pipe_check_address(const char *address)
{
	size_t len = address ? strnlen(address, ADDRESS_MAX + 1) : 0;

	if (len == 0 || len > ADDRESS_MAX)
		return tpc_error(-EINVAL, "address must be 1..%d bytes", ADDRESS_MAX);
	if (strncmp(address, "tpip://", 7) == 0) {
		/* The syntax is checked here; the daemon decides whether it can reach the host. */
		char host[TPW_TPIP_HOST_MAX + 1], why[160];
		const char *name;
		uint16_t port;

		if (tpw_tpip_parse(address, 7420, host, &port, &name, why, sizeof(why)) < 0)
			return tpc_error(-EINVAL, "invalid address \"%.200s\" "
					 "(tpip://HOST[:PORT]/NAME): %s", address, why);
		return 0;
	}
	if (!tpw_name_valid(address))
		return tpc_error(-EINVAL, "invalid listener name \"%s\"", address);
	return 0;
}

static int pipe_connect_locked(struct tp_context *ctx, struct tp_pipe **ret)
{
	struct tp_pipe *p;
	int r = tpc_context_check_locked(ctx);

	if (r < 0)
		return r;
	if (ctx->lim.pipes_max && ctx->pipes.n >= ctx->lim.pipes_max)
		return tpc_error(-ENOBUFS, "over the daemon's limit of %u pipes (tpipd "
				 "--pipes-max)",
				 ctx->lim.pipes_max);
	if (ctx->next_pipe_id + 1 >= PIPE_ID_CLIENT_MAX)
		return tpc_error(-ENOBUFS, "pipe ids exhausted");
	p = tpc_pipe_new(ctx, ++ctx->next_pipe_id);
	if (!p)
		return tpc_error(-ENOMEM, "out of memory");
	p->state = TPC_PIPE_CONNECTING;
	p->connect_status = 1;
	r = tpc_map_put(&ctx->pipes, p->id, p);
	if (r == 0) {
		r = tpc_context_req_start_locked(ctx, &p->connect_req, pipe_on_connect_reply);
		if (r < 0)
			tpc_map_del(&ctx->pipes, p->id);
	}
	if (r < 0) {
		pipe_free(p);
		return tpc_error(r, "out of memory");
	}
	*ret = p;
	return 0;
}

TP_EXPORT int tp_connect(struct tp_context *ctx, const char *address, struct tp_pipe **ret)
{
	return tp_connect_ex(ctx, address, NULL, ret);
}

/* TP_CONNECT_EXPECT_PEER of @o into @c, or why not: only over tpip://, with a daemon that
 * enforces it (an older one would ignore the fields and connect to whoever answers). */
static int connect_expect_peer(struct tp_context *ctx, const char *address,
			       const struct tp_connect_options *o, Tpw__V1__Connect *c)
{
	int r;

	if (!address || strncmp(address, "tpip://", 7) != 0)
		return tpc_error(-EINVAL, "TP_CONNECT_EXPECT_PEER needs a tpip:// address");
	if (o->expect_remote != TP_REMOTE_ANY_PEER && o->expect_remote != TP_REMOTE_PEERS)
		return tpc_error(-EINVAL, "TP_CONNECT_EXPECT_PEER takes TP_REMOTE_ANY_PEER or "
				 "TP_REMOTE_PEERS, not %d", (int)o->expect_remote);
	if (o->expect_remote != TP_REMOTE_PEERS && o->n_expect_peers)
		return tpc_error(-EINVAL, "TP_REMOTE_PEERS takes 1..%u peer identities, and only "
				 "it takes any", TPW_REMOTE_PEERS_MAX);
	r = tpc_remote_wire(o->expect_remote, o->expect_peers, o->n_expect_peers,
			    &c->expect_remote, &c->expect_peers, &c->n_expect_peers);
	if (r < 0)
		return r;
	if (ctx->daemon_minor < TPW_MINOR_CONNECT_PEER)
		return tpc_error(-EOPNOTSUPP, "the daemon (protocol minor %u) cannot check which "
				 "peer daemon a pipe reaches (minor %u can): not connecting to %s",
				 ctx->daemon_minor, TPW_MINOR_CONNECT_PEER, address);
	return 0;
}

TP_EXPORT int tp_connect_ex(struct tp_context *ctx, const char *address,
			    const struct tp_connect_options *opts, struct tp_pipe **ret)
{
	struct tp_connect_options o = { .size = sizeof(o) };
	Tpw__V1__Connect c = TPW__V1__CONNECT__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	struct tp_pipe *p = NULL;
	int r;

	if (!ctx || !ret)
		return tpc_error(-EINVAL, "missing context or result pointer");
	if (opts) {
		if (opts->size == 0)
			return tpc_error(-EINVAL, "tp_connect_options.size is not set");
		memcpy(&o, opts, TPU_MIN(opts->size, sizeof(o)));
		if (o.flags & ~(unsigned)(TP_CONNECT_EXPECT_UID | TP_CONNECT_EXPECT_PEER))
			return tpc_error(-EINVAL, "unknown connect flags 0x%x", o.flags);
		if (opts->size < sizeof(o) && (o.flags & TP_CONNECT_EXPECT_PEER))
			return tpc_error(-EINVAL, "TP_CONNECT_EXPECT_PEER needs the whole "
					 "tp_connect_options");
	}
	if (o.flags & TP_CONNECT_EXPECT_PEER) {
		r = connect_expect_peer(ctx, address, &o, &c);
		if (r < 0)
			return r;
	}
	c.expect_uid_set = o.flags & TP_CONNECT_EXPECT_UID;
	c.expect_uid = (uint32_t)o.expect_uid;
	c.wait_ms = o.wait_ms;
	r = pipe_check_address(address);
	if (r < 0)
		return r;
	pthread_mutex_lock(&ctx->send_lock);
	pthread_mutex_lock(&ctx->lock);
	r = pipe_connect_locked(ctx, &p);
	pthread_mutex_unlock(&ctx->lock);
	if (r == 0) {
		c.req_id = p->connect_req.id;
		c.pipe_id = p->id;
		c.address = (char *)address;
		m.body_case = TPW__V1__CLIENT_MSG__BODY_CONNECT;
		m.connect = &c;
		/* A failed send surfaces as connection loss on the io thread. */
		tpc_wire_send(ctx, &m, NULL, 0, -EBADF);
	}
	pthread_mutex_unlock(&ctx->send_lock);
	if (r < 0)
		return r;
	*ret = p;
	return 0;
}

TP_EXPORT int tp_pipe_wait_connected(struct tp_pipe *p, int timeout_ms)
{
	struct tp_context *ctx;
	struct timespec ts;
	int r;

	if (!p)
		return tpc_error(-EINVAL, "no pipe");
	ctx = p->ctx;
	if (tpc_context_on_io_thread(ctx))
		return tpc_error(-EDEADLK, "tp_pipe_wait_connected() called from a callback");
	if (timeout_ms >= 0)
		tpc_deadline(&ts, timeout_ms);
	pthread_mutex_lock(&ctx->lock);
	while (p->connect_status == 1) {
		if (timeout_ms < 0)
			pthread_cond_wait(&ctx->cond, &ctx->lock);
		else if (pthread_cond_timedwait(&ctx->cond, &ctx->lock, &ts) == ETIMEDOUT)
			break;
	}
	r = p->connect_status;
	if (r == 1)
		r = tpc_error(-ETIMEDOUT, "connect still pending after %d ms", timeout_ms);
	else if (r < 0)
		tpc_error_msg(r, p->errmsg);
	pthread_mutex_unlock(&ctx->lock);
	return r;
}

TP_EXPORT int tp_pipe_remote_uid(struct tp_pipe *p, uid_t *ret)
{
	int r;

	if (!p || !ret)
		return tpc_error(-EINVAL, "missing pipe or result pointer");
	pthread_mutex_lock(&p->ctx->lock);
	r = p->connect_status == 1 ? -EINPROGRESS : p->remote_uid_status;
	if (r >= 0)
		*ret = p->remote_uid;
	pthread_mutex_unlock(&p->ctx->lock);
	if (r < 0)
		return tpc_error(r, "%s",
				 r == -EINPROGRESS ? "the connect is still pending"
						   : "the daemon did not name the other end's uid");
	return r;
}

TP_EXPORT const char *tp_pipe_remote_name(struct tp_pipe *p)
{
	const char *name;

	if (!p)
		return "";
	pthread_mutex_lock(&p->ctx->lock);
	name = p->remote_name ? p->remote_name : "";
	pthread_mutex_unlock(&p->ctx->lock);
	return name;
}
