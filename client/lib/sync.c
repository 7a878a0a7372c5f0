/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Blocking convenience calls built on the asynchronous ones: each starts the operation with a
 * callback that fills a waiter on the caller's stack and waits for it. A wait that times out
 * takes its operation back if it is still pending, so no callback can touch the waiter after
 * the call returns: a descriptor request or accept at once (the library holds it), a write or
 * read through tp_cancel() and a wait for its callback (the daemon says when its memory is
 * free). They refuse to run on the library thread (-EDEADLK).
 */
#include <stdio.h>
#include <string.h>
#include "internal.h"

struct sync_waiter {
	pthread_mutex_t m;
	pthread_cond_t c;
	bool done;
	int status;
	char msg[TPC_ERRMSG_MAX];
	struct tp_descriptor *desc;
	struct tp_pipe *pipe;
	struct tp_context *ctx; /* whose spin budget applies; NULL: never spin */
};

static void sync_init(struct sync_waiter *w, struct tp_context *ctx)
{
	pthread_condattr_t ca;

	memset(w, 0, sizeof(*w));
	w->ctx = ctx;
	pthread_mutex_init(&w->m, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&w->c, &ca);
	pthread_condattr_destroy(&ca);
}

static void sync_done(struct sync_waiter *w)
{
	pthread_cond_destroy(&w->c);
	pthread_mutex_destroy(&w->m);
}

static void sync_signal(struct sync_waiter *w, int status, const char *errmsg)
{
	pthread_mutex_lock(&w->m);
	w->status = status;
	if (status < 0)
		snprintf(w->msg, sizeof(w->msg), "%s", errmsg ? errmsg : tp_strerror(status));
	__atomic_store_n(&w->done, true, __ATOMIC_RELEASE);
	pthread_cond_signal(&w->c);
	pthread_mutex_unlock(&w->m);
}

static void sync_on_done(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	sync_signal(arg, status, errmsg);
}

static void sync_on_desc(void *arg, struct tp_pipe *p, int status, const char *errmsg,
			 struct tp_descriptor *d)
{
	struct sync_waiter *w = arg;

	pthread_mutex_lock(&w->m);
	w->desc = d;
	pthread_mutex_unlock(&w->m);
	sync_signal(w, status, errmsg);
}

static void sync_on_accept(void *arg, struct tp_listener *l, int status, const char *errmsg,
			   struct tp_pipe *pipe)
{
	struct sync_waiter *w = arg;

	pthread_mutex_lock(&w->m);
	w->pipe = pipe;
	pthread_mutex_unlock(&w->m);
	sync_signal(w, status, errmsg);
}

/* Waits for the callback. Return: true if it ran, false on timeout. */
static bool sync_wait(struct sync_waiter *w, int timeout_ms)
{
	struct timespec ts;
	bool done;

	/* An answer that comes within the spin budget costs no sleep and no wake-up. */
	if (w->ctx && w->ctx->spin_ns && timeout_ms != 0 && tpc_spin_until(w->ctx, &w->done, w)) {
		pthread_mutex_lock(&w->m); /* the callback may still hold it */
		pthread_mutex_unlock(&w->m);
		return true;
	}
	if (timeout_ms >= 0)
		tpc_deadline(&ts, timeout_ms);
	pthread_mutex_lock(&w->m);
	while (!w->done) {
		if (timeout_ms < 0)
			pthread_cond_wait(&w->c, &w->m);
		else if (pthread_cond_timedwait(&w->c, &w->m, &ts) == ETIMEDOUT)
			break;
	}
	done = w->done;
	pthread_mutex_unlock(&w->m);
	return done;
}

/*
 * Waits up to @timeout_ms; on timeout cancels @op if it is still pending. Holding w->m while
 * looking at @op is safe: its callback needs w->m before the op can be freed.
 */
static int sync_wait_or_cancel(struct tp_context *ctx, struct sync_waiter *w, struct tpc_op *op,
			       int timeout_ms)
{
	bool canceled = false;

	if (sync_wait(w, timeout_ms))
		return w->status;
	pthread_mutex_lock(&ctx->lock);
	pthread_mutex_lock(&w->m);
	if (!w->done && op->pending) {
		tpc_op_cancel_locked(ctx, op);
		canceled = true;
	}
	pthread_mutex_unlock(&w->m);
	pthread_mutex_unlock(&ctx->lock);
	if (canceled)
		return -ETIMEDOUT;
	sync_wait(w, -1); /* already completed: its callback is on its way */
	return w->status;
}

/*
 * Waits up to @timeout_ms for write or read @id; then cancels it and waits for its callback,
 * which the daemon sends once no copy uses the operation's memory. Return: its status, or
 * -ETIMEDOUT if the cancel stopped it; the thread's error message is set.
 */
static int sync_wait_transfer(struct tp_context *ctx, struct sync_waiter *w, uint64_t id,
			      int timeout_ms, const char *what)
{
	int c;

	if (!sync_wait(w, timeout_ms)) {
		/* -ENOENT: it completed meanwhile; -EOPNOTSUPP: an older daemon, it runs on. */
		c = tp_cancel(ctx, id);
		sync_wait(w, -1);
		if (c == 0 && w->status == -ECANCELED)
			return tpc_error(-ETIMEDOUT, "%s did not complete within %d ms; cancelled",
					 what, timeout_ms);
	}
	if (w->status < 0)
		tpc_error_msg(w->status, w->msg);
	return w->status;
}

TP_EXPORT int tp_pipe_write_sync_timeout(struct tp_pipe *p, const struct tp_message *msg,
					 int timeout_ms)
{
	struct sync_waiter w;
	uint64_t id = 0;
	int r;

	if (!p)
		return tpc_error(-EINVAL, "no pipe");
	if (tpc_context_on_io_thread(p->ctx))
		return tpc_error(-EDEADLK, "tp_pipe_write_sync() called from a callback");
	sync_init(&w, p->ctx);
	r = tpc_pipe_write(p, msg, sync_on_done, &w, &id);
	if (r == 0)
		r = sync_wait_transfer(p->ctx, &w, id, timeout_ms, "the write");
	sync_done(&w);
	return r;
}

TP_EXPORT int tp_pipe_write_sync(struct tp_pipe *p, const struct tp_message *msg)
{
	return tp_pipe_write_sync_timeout(p, msg, -1);
}

/* A timed wait's outcome as the call's result, with the thread's error message set. */
static int sync_result(int r, const struct sync_waiter *w, int timeout_ms, const char *what)
{
	if (r == -ETIMEDOUT && !w->done)
		tpc_error(r, "no %s within %d ms", what, timeout_ms);
	else if (r < 0)
		tpc_error_msg(r, w->msg);
	return r;
}

TP_EXPORT int tp_pipe_read_descriptor_sync(struct tp_pipe *p, int timeout_ms,
					   struct tp_descriptor **ret)
{
	struct sync_waiter w;
	struct tpc_op *op;
	int r;

	if (!p || !ret)
		return tpc_error(-EINVAL, "missing pipe or result pointer");
	if (tpc_context_on_io_thread(p->ctx))
		return tpc_error(-EDEADLK, "tp_pipe_read_descriptor_sync() called from a callback");
	sync_init(&w, p->ctx);
	r = tpc_read_descriptor_start(p, sync_on_desc, &w, &op, NULL);
	if (r == 0) {
		r = sync_result(sync_wait_or_cancel(p->ctx, &w, op, timeout_ms), &w, timeout_ms,
				"message");
		if (r == 0)
			*ret = w.desc;
	}
	sync_done(&w);
	return r;
}

TP_EXPORT int tp_pipe_read_sync_timeout(struct tp_pipe *p, struct tp_descriptor *d,
					const struct tp_allocation *alloc, int timeout_ms)
{
	struct sync_waiter w;
	bool done_here = false;
	uint64_t id = 0;
	int r;

	if (p && tpc_context_on_io_thread(p->ctx)) {
		tp_descriptor_free(d);
		return tpc_error(-EDEADLK, "tp_pipe_read_sync() called from a callback");
	}
	sync_init(&w, p ? p->ctx : NULL);
	r = tpc_pipe_read(p, d, alloc, sync_on_done, &w, &done_here, &id);
	if (r == 0 && !done_here)
		r = sync_wait_transfer(p->ctx, &w, id, timeout_ms, "the read");
	sync_done(&w);
	return r;
}

TP_EXPORT int tp_pipe_read_sync(struct tp_pipe *p, struct tp_descriptor *d,
				const struct tp_allocation *alloc)
{
	return tp_pipe_read_sync_timeout(p, d, alloc, -1);
}

TP_EXPORT int tp_listener_accept_sync(struct tp_listener *l, int timeout_ms, struct tp_pipe **ret)
{
	struct sync_waiter w;
	struct tpc_op *op;
	int r;

	if (!l || !ret)
		return tpc_error(-EINVAL, "missing listener or result pointer");
	if (tpc_context_on_io_thread(l->ctx))
		return tpc_error(-EDEADLK, "tp_listener_accept_sync() called from a callback");
	sync_init(&w, l->ctx);
	r = tpc_listener_accept_start(l, sync_on_accept, &w, &op, NULL);
	if (r == 0) {
		r = sync_result(sync_wait_or_cancel(l->ctx, &w, op, timeout_ms), &w, timeout_ms,
				"connection");
		if (r == 0)
			*ret = w.pipe;
	}
	sync_done(&w);
	return r;
}
