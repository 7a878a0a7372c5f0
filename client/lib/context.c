/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The context: one session with the local tpipd, once started (start.c connects, says Hello and
 * offers the control ring). Runs the library's io thread, which reads daemon frames, validates
 * and dispatches them to the pipe, read, write, listener and buffer code, and runs completed
 * operations' callbacks in order. Also owns the request table (Reply matching), the done queue,
 * connection-loss handling and teardown. Building and sending requests is left to the objects
 * that make them.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <syslog.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include "internal.h"

static __thread const struct tp_context *io_thread_ctx;
/* The context whose frames this thread reads in tpc_context_help(), and whether an operation it
 * completed meanwhile found the done queue empty (the io thread was not told yet). */
static __thread const struct tp_context *help_ctx;
static __thread bool help_wake;

bool tpc_context_on_io_thread(const struct tp_context *ctx)
{
	return io_thread_ctx == ctx;
}

void tpc_context_wake(struct tp_context *ctx)
{
	uint64_t one = 1;

	/* A spinning io thread sees wake_seq move; only a sleeping one needs the eventfd. */
	__atomic_add_fetch(&ctx->wake_seq, 1, __ATOMIC_SEQ_CST);
	if (!__atomic_load_n(&ctx->io_sleeping, __ATOMIC_SEQ_CST))
		return;
	while (write(ctx->efd, &one, sizeof(one)) < 0 && errno == EINTR)
		;
}

/* ---- spinning ------------------------------------------------------------------------------ */

static __thread struct tpu_spin thread_spin;

struct spin_wait {
	struct tp_context *ctx;
	const bool *flag;
	const void *arg;
};

static bool spin_ready(void *arg)
{
	struct spin_wait *w = arg;

	if (__atomic_load_n(w->flag, __ATOMIC_ACQUIRE))
		return true;
	return w->arg && tpc_context_help(w->ctx, w->arg) &&
	       __atomic_load_n(w->flag, __ATOMIC_ACQUIRE);
}

/*
 * One poller of the daemon -> client ring per context. A thread in a blocking call that helps
 * (tpc_context_help()) reads the ring while it spins, so the io thread need not: it sleeps in
 * poll() without the ring's sleeping flag (context_ring_wait()) and is woken through the
 * eventfd only for a callback it must run. Five threads polling two CPUs (the daemon, and the
 * io thread and a blocked caller in each of two clients) yielded to each other about 7 times a
 * round trip.
 *
 * No lost wake-up: the io thread sets io_sleeping before it reads ring_pollers, a poller
 * decrements ring_pollers before it reads io_sleeping (both sequentially consistent), so
 * either the io thread sees no poller and sleeps with the flag set as ever, or the last poller
 * to stop sees it asleep and sets the flag for it, looking at the ring once more (and waking
 * it for what came meanwhile). A poller that starts withdraws the flag: frames it reads need
 * no doorbell.
 */
static void ring_poll_start(struct tp_context *ctx)
{
	__atomic_add_fetch(&ctx->ring_pollers, 1, __ATOMIC_SEQ_CST);
	tpu_ring_sleep_cancel(&ctx->ring_rx);
}

static void ring_poll_stop(struct tp_context *ctx)
{
	if (__atomic_sub_fetch(&ctx->ring_pollers, 1, __ATOMIC_SEQ_CST) != 0)
		return;
	if (__atomic_load_n(&ctx->io_sleeping, __ATOMIC_SEQ_CST) &&
	    tpu_ring_sleep_prepare(&ctx->ring_rx))
		tpc_context_wake(ctx);
}

bool tpc_spin_until(struct tp_context *ctx, const bool *flag, const void *arg)
{
	struct spin_wait w = { ctx, flag, arg };
	bool polls = arg && ctx->ring, r;

	if (thread_spin.max_ns != ctx->spin_ns)
		tpu_spin_init(&thread_spin, ctx->spin_ns);
	if (polls)
		ring_poll_start(ctx);
	r = tpu_spin_wait(&thread_spin, spin_ready, &w);
	if (polls)
		ring_poll_stop(ctx);
	return r;
}

/* ---- logging ------------------------------------------------------------------------------- */

static int env_log_level = -1; /* from TPIPD_LOG: a syslog level; -1 off */
static pthread_once_t env_log_once = PTHREAD_ONCE_INIT;

static void env_log_read(void)
{
	static const struct {
		const char *name;
		int level;
	} names[] = { { "debug", LOG_DEBUG }, { "info", LOG_INFO },	{ "notice", LOG_NOTICE },
		      { "warn", LOG_WARNING }, { "warning", LOG_WARNING }, { "err", LOG_ERR },
		      { "error", LOG_ERR } };
	const char *v = getenv("TPIPD_LOG");

	if (!v || !*v)
		return;
	env_log_level = LOG_WARNING; /* any other value: warnings and errors */
	for (size_t i = 0; i < TPU_ARRAY_SIZE(names); i++)
		if (strcasecmp(v, names[i].name) == 0)
			env_log_level = names[i].level;
}

static const char *level_name(int level)
{
	switch (level) {
	case LOG_DEBUG:
		return "debug";
	case LOG_INFO:
		return "info";
	case LOG_NOTICE:
		return "notice";
	case LOG_WARNING:
		return "warning";
	default:
		return "error";
	}
}

/* The TPIPD_LOG handler: one line on stderr, written at once so threads do not interleave. */
static void env_log_write(const char *ctx_name, int level, const char *line)
{
	char buf[768];
	int n = snprintf(buf, sizeof(buf), "tpclient[%d]: %s: %s: %s\n", (int)getpid(),
			 ctx_name ? ctx_name : "", level_name(level), line);

	if (n < 0)
		return;
	if ((size_t)n >= sizeof(buf)) {
		n = sizeof(buf) - 1;
		buf[n - 1] = '\n';
	}
	(void)!write(STDERR_FILENO, buf, (size_t)n);
}

void tpc_context_log(struct tp_context *ctx, int level, const char *fmt, ...)
{
	tp_log_fn fn = __atomic_load_n(&ctx->log_fn, __ATOMIC_ACQUIRE);
	void *arg = __atomic_load_n(&ctx->log_arg, __ATOMIC_ACQUIRE);
	char line[512];
	va_list ap;

	if (!fn) {
		pthread_once(&env_log_once, env_log_read);
		if (level > env_log_level)
			return; /* no handler and no TPIPD_LOG: the library stays silent */
	}
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (fn)
		fn(arg, level, line);
	else
		env_log_write(ctx->name, level, line);
}

void tpc_deadline(struct timespec *ts, int timeout_ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += timeout_ms / 1000;
	ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

/* ---- requests ------------------------------------------------------------------------------ */

int tpc_context_req_start_locked(struct tp_context *ctx, struct tpc_req *req, tpc_reply_fn fn)
{
	req->id = ++ctx->next_req_id;
	req->on_reply = fn;
	req->done = false;
	req->status = 0;
	req->msg[0] = '\0';
	return tpc_map_put(&ctx->reqs, req->id, req);
}

void tpc_context_req_done(struct tp_context *ctx, struct tpc_req *req, const Tpw__V1__Reply *r)
{
	if (r) {
		req->status = tpw_status_to_errno(r->status);
		req->result_id = r->id;
		snprintf(req->msg, sizeof(req->msg), "%s",
			 r->message && *r->message ? r->message : tp_strerror(req->status));
	} else {
		req->status = ctx->dead;
		snprintf(req->msg, sizeof(req->msg), "%s", ctx->dead_msg);
	}
	req->done = true;
	pthread_cond_broadcast(&ctx->cond);
}

int tpc_context_req_wait_locked(struct tp_context *ctx, struct tpc_req *req, int timeout_ms)
{
	struct timespec ts;

	tpc_deadline(&ts, timeout_ms);
	while (!req->done) {
		if (pthread_cond_timedwait(&ctx->cond, &ctx->lock, &ts) == ETIMEDOUT && !req->done) {
			tpc_map_del(&ctx->reqs, req->id);
			snprintf(req->msg, sizeof(req->msg),
				 "no answer from the daemon within %d ms "
				 "(tp_context_options.reply_timeout_ms)",
				 timeout_ms);
			return -ETIMEDOUT;
		}
	}
	return req->status;
}

int tpc_context_check_locked(struct tp_context *ctx)
{
	if (ctx->stopping)
		return tpc_error(-ECANCELED, "the context is being freed");
	if (ctx->dead)
		return tpc_error_msg(ctx->dead, ctx->dead_msg);
	return 0;
}

/* ---- operations ---------------------------------------------------------------------------- */

struct tpc_op *tpc_op_new(enum tpc_op_kind kind, size_t n_copies)
{
	struct tpc_op *op = calloc(1, sizeof(*op) + n_copies * sizeof(struct tpc_copy));

	if (!op)
		return NULL;
	tpu_list_init(&op->node);
	tpu_list_init(&op->hnode);
	op->kind = kind;
	op->copies = (struct tpc_copy *)(op + 1);
	return op;
}

void tpc_op_free(struct tpc_op *op)
{
	if (!op)
		return;
	tpc_cuda_events_put(op->cuda_events);
	tpc_cuda_shared_unref(op->cuda_shared);
	tpc_write_held_free(op->held);
	free(op->errmsg);
	free(op);
}

/* The result of @op is known: tp_cancel() no longer acts on it. Lock held. */
static void op_untrack_locked(struct tp_context *ctx, struct tpc_op *op)
{
	if (op->op_id)
		tpc_map_del(&ctx->ops, op->op_id);
}

int tpc_op_track_locked(struct tp_context *ctx, struct tpc_op *op, bool cancellable,
			uint64_t *ret_id)
{
	uint64_t id = ctx->next_op_id + 1;

	if (cancellable && tpc_map_put(&ctx->ops, id, op) < 0)
		return tpc_error(-ENOMEM, "out of memory");
	ctx->next_op_id = id;
	op->op_id = cancellable ? id : 0;
	if (ret_id)
		*ret_id = id;
	return 0;
}

void tpc_op_complete_locked(struct tp_context *ctx, struct tpc_op *op, int status, const char *msg)
{
	bool was_empty = tpu_list_empty(&ctx->done);

	op_untrack_locked(ctx, op);
	tpu_list_remove(&op->node);
	if (op->kind == TPC_OP_WRITE) /* a held write that never went: it never will */
		tpu_list_remove(&op->hnode);
	op->pending = false;
	op->status = status;
	if (status < 0 && !op->errmsg)
		op->errmsg = strdup(msg && *msg ? msg : tp_strerror(status));
	tpc_pring_op_done_locked(ctx, op);
	tpu_list_insert_tail(&ctx->done, &op->node);
	if (was_empty && help_ctx == ctx)
		help_wake = true; /* tpc_context_help() wakes the io thread if it leaves it work */
	else if (was_empty && !tpc_context_on_io_thread(ctx))
		tpc_context_wake(ctx);
}

void tpc_op_ready_locked(struct tp_context *ctx, struct tpu_list *list, struct tpc_op *op,
			 int status, const char *msg)
{
	op_untrack_locked(ctx, op);
	op->ready = true;
	op->status = status;
	if (status < 0 && !op->errmsg)
		op->errmsg = strdup(msg && *msg ? msg : tp_strerror(status));
	while ((op = tpu_list_first(list, struct tpc_op, node)) && op->ready)
		tpc_op_complete_locked(ctx, op, op->status, NULL);
}

void tpc_op_cancel_locked(struct tp_context *ctx, struct tpc_op *op)
{
	op_untrack_locked(ctx, op);
	tpu_list_remove(&op->node);
	if (op->kind == TPC_OP_WRITE)
		tpu_list_remove(&op->hnode);
	tpc_op_free(op);
}

/* Runs one completed op on the io thread, no lock held. */
static void context_run_op(struct tp_context *ctx, struct tpc_op *op)
{
	const char *msg = op->status < 0 ? (op->errmsg ? op->errmsg : tp_strerror(op->status)) : NULL;

	switch (op->kind) {
	case TPC_OP_WRITE:
		tpc_buffer_stage_put(ctx, TAKE_PTR(op->stage), op->status == 0);
		op->cb.done(op->arg, op->pipe, op->status, msg);
		break;
	case TPC_OP_READ:
		for (size_t i = 0; op->status == 0 && i < op->n_copies; i++) {
			struct tpc_copy *c = &op->copies[i];

			if (c->off == TPC_COPY_CMA)
				tpc_mem_written(c->dst, c->len);
			else
				memcpy(c->dst, (char *)op->stage->addr + c->off, c->len);
		}
		tpc_buffer_stage_put(ctx, TAKE_PTR(op->stage), op->status == 0);
		op->cb.done(op->arg, op->pipe, op->status, msg);
		break;
	case TPC_OP_DESC:
		op->cb.desc(op->arg, op->pipe, op->status, msg, op->desc ? &op->desc->pub : NULL);
		break;
	case TPC_OP_ACCEPT:
		op->cb.accept(op->arg, op->listener, op->status, msg, op->accepted);
		break;
	case TPC_OP_PIPE_FREE:
		pthread_mutex_lock(&ctx->lock);
		tpc_pipe_unref_locked(op->pipe);
		pthread_mutex_unlock(&ctx->lock);
		return; /* embedded in the pipe */
	case TPC_OP_LISTENER_FREE:
		pthread_mutex_lock(&ctx->lock);
		tpc_listener_free(op->listener);
		pthread_mutex_unlock(&ctx->lock);
		return; /* embedded in the listener */
	}
	tpc_op_free(op);
}

/* ---- connection loss ----------------------------------------------------------------------- */

static void context_fail_req(void *val, void *arg)
{
	struct tpc_req *req = val;

	req->on_reply(arg, req, NULL);
}

static void context_fail_pipe(void *val, void *arg)
{
	struct tp_context *ctx = arg;

	tpc_pipe_fail_locked(val, ctx->dead, ctx->dead_msg);
}

/* Fails everything pending on the context with @err; lock held. */
static void context_fail_all_locked(struct tp_context *ctx, int err, const char *msg)
{
	if (ctx->dead)
		return;
	ctx->dead = err;
	snprintf(ctx->dead_msg, sizeof(ctx->dead_msg), "%s", msg);
	tpc_map_drain(&ctx->reqs, context_fail_req, ctx);
	tpc_map_drain(&ctx->pipes, context_fail_pipe, ctx);
	tpc_listener_fail_all_locked(ctx, err, msg);
	tpc_group_fail_all_locked(ctx);
	pthread_cond_broadcast(&ctx->cond);
}

/* ---- receiving ----------------------------------------------------------------------------- */

static void context_rx_limits(struct tpw_limits *lim)
{
	/* The daemon is trusted to respect its own limits; only the frame bound matters here. */
	*lim = (struct tpw_limits){
		.frame_max = TPW_FRAME_MAX_HARD,
		.inline_max = TPW_FRAME_MAX_HARD,
		.segments_max = UINT32_MAX,
		.message_bytes_max = UINT64_MAX,
		.metadata_max = UINT32_MAX,
	};
}

int tpc_context_decode(const struct tpw_hdr *h, const uint8_t *body, Tpw__V1__DaemonMsg **ret,
		       char *why, size_t why_len)
{
	struct tpw_limits lim;
	Tpw__V1__DaemonMsg *m;
	int r;

	context_rx_limits(&lim);
	r = tpw_daemon_msg_unpack(body, h->msg_len, &m);
	if (r < 0) {
		snprintf(why, why_len, "undecodable frame %llu", (unsigned long long)h->seq);
		return r;
	}
	r = tpw_daemon_msg_validate(m, h, &lim, why, why_len);
	if (r < 0) {
		tpw_daemon_msg_free(m);
		return r;
	}
	*ret = m;
	return 0;
}

/* Handles one daemon message; lock held. Return: 0 or -EPROTO for a message out of place. */
static int context_handle_locked(struct tp_context *ctx, const Tpw__V1__DaemonMsg *m,
				 const uint8_t *tail, size_t tail_len, uint64_t *ret_reject,
				 bool *ret_pump)
{
	struct tpc_req *req;

	switch (m->body_case) {
	case TPW__V1__DAEMON_MSG__BODY_REPLY:
		req = tpc_map_del(&ctx->reqs, m->reply->req_id);
		if (req)
			req->on_reply(ctx, req, m->reply);
		return 0;
	case TPW__V1__DAEMON_MSG__BODY_ACCEPTED:
		tpc_listener_on_accepted(ctx, m->accepted, ret_reject);
		return 0;
	case TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR:
		tpc_read_on_descriptor(ctx, m->descriptor, tail, tail_len);
		return 0;
	case TPW__V1__DAEMON_MSG__BODY_WRITE_DONE:
		if (m->write_done->cma_off) /* the daemon refused our process: stage from now on */
			__atomic_store_n(&ctx->cma_ok, false, __ATOMIC_RELAXED);
		tpc_write_on_done(ctx, m->write_done);
		return 0;
	case TPW__V1__DAEMON_MSG__BODY_READ_DONE:
		if (m->read_done->cma_off)
			__atomic_store_n(&ctx->cma_ok, false, __ATOMIC_RELAXED);
		tpc_read_on_done(ctx, m->read_done);
		return 0;
	case TPW__V1__DAEMON_MSG__BODY_PIPE_CLOSED:
		tpc_pipe_on_closed(ctx, m->pipe_closed);
		return 0;
	case TPW__V1__DAEMON_MSG__BODY_CTL_REPLY:
		return 0; /* not asked for by a client context */
	case TPW__V1__DAEMON_MSG__BODY_FLOW_CREDIT:
		*ret_pump = tpc_write_on_credit(ctx, m->flow_credit);
		return 0;
	case TPW__V1__DAEMON_MSG__BODY_FLOW_RESUME:
		return ctx->flow ? 0 : -EPROTO; /* answered after the lock is dropped */
	case TPW__V1__DAEMON_MSG__BODY_RING_XFER:
		return ctx->ring ? 0 : -EPROTO; /* taken after the lock is dropped */
	case TPW__V1__DAEMON_MSG__BODY_GROUP_JOINED:
		tpc_group_on_joined(ctx, m->group_joined);
		return 0;
	case TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY:
		tpc_chan_on_reply(ctx, m->chan_reply, tail, tail_len);
		return 0;
	case TPW__V1__DAEMON_MSG__BODY_WQ_REPLY:
		tpc_wq_on_reply(ctx, m->wq_reply, tail, tail_len);
		return 0;
	case TPW__V1__DAEMON_MSG__BODY_SESSION_END: {
		/* The daemon ends this session and says why (tpipctl close-session). */
		const Tpw__V1__SessionEnd *se = m->session_end;
		int err = tpw_status_to_errno(se->status);

		if (err == 0)
			err = -ECONNRESET;
		tpc_context_log(ctx, LOG_WARNING, "the daemon ended the session: %s",
				se->message && *se->message ? se->message : tp_strerror(err));
		context_fail_all_locked(ctx, err,
					se->message && *se->message ? se->message : tp_strerror(err));
		return 0;
	}
	default:
		return -EPROTO;
	}
}

/* Handles the frame @h whose message is at @body and data tail at @tail (borrowed, valid for
 * the call only). */
static int context_dispatch(struct tp_context *ctx, const struct tpw_hdr *h, const uint8_t *body,
			    const uint8_t *tail, char *why, size_t why_len)
{
	Tpw__V1__DaemonMsg *m;
	uint64_t reject = 0;
	bool pump = false;
	int r;

	r = tpc_context_decode(h, body, &m, why, why_len);
	if (r < 0)
		return r;
	pthread_mutex_lock(&ctx->lock);
	r = context_handle_locked(ctx, m, tail, h->data_len, &reject, &pump);
	pthread_mutex_unlock(&ctx->lock);
	if (r < 0)
		snprintf(why, why_len, "unexpected message type %d", (int)m->body_case);
	if (pump) /* room came back: send the writes held for it, in order */
		tpc_write_pump(ctx, m->flow_credit->pipe_id);
	if (r == 0 && m->body_case == TPW__V1__DAEMON_MSG__BODY_FLOW_RESUME)
		tpc_write_resume(ctx, m->flow_resume->pipe_id);
	if (r == 0 && m->body_case == TPW__V1__DAEMON_MSG__BODY_RING_XFER)
		tpc_pring_on_xfer(ctx, m->ring_xfer);
	tpw_daemon_msg_free(m);
	if (reject) {
		/* An Accepted for a listener closed meanwhile: refuse the pipe. */
		pthread_mutex_lock(&ctx->send_lock);
		tpc_wire_send_pipe_close(ctx, reject);
		pthread_mutex_unlock(&ctx->send_lock);
	}
	return r;
}

/*
 * Handles up to CONTEXT_RING_FRAMES whole frames straight from the control ring, each copied
 * out on its own (a large data tail not at all: tpc_wire_ring_take()). Return: 0 or -errno
 * (+ @why).
 */
#define CONTEXT_RING_FRAMES 64
static int context_read_ring(struct tp_context *ctx, char *why, size_t why_len)
{
	int i, r = 0;

	for (i = 0; i < CONTEXT_RING_FRAMES; i++) {
		const uint8_t *tail, *body;
		struct tpw_hdr h;

		r = tpc_wire_ring_take(ctx, &h, &tail);
		if (r < 0)
			snprintf(why, why_len, "bad frame header (%s)", tp_strerror(r));
		if (r <= 0)
			break;
		body = ctx->rbuf + TPW_HDR_SIZE;
		r = context_dispatch(ctx, &h, body, tail ? tail : body + h.msg_len, why, why_len);
		tpc_wire_ring_done(ctx, &h, tail);
		if (r < 0)
			break;
	}
	if (i > 0)
		tpc_wire_ring_room(ctx); /* once for the frames taken, not once a frame */
	return r < 0 ? r : 0;
}

/* Reads what the socket has and dispatches every whole frame. Return: 0 or -errno (+ @why). */
static int context_read(struct tp_context *ctx, char *why, size_t why_len)
{
	struct tpw_hdr h;
	int r;

	r = context_read_ring(ctx, why, why_len);
	if (r < 0)
		return r;
	r = tpc_wire_fill(ctx);
	if (r == -EAGAIN)
		return 0;
	if (r < 0) {
		snprintf(why, why_len, "%s", r == -ECONNRESET ? "end of stream" : tp_strerror(r));
		return r;
	}
	while ((r = tpc_wire_peek(ctx, &h)) > 0) {
		const uint8_t *body = ctx->rbuf + ctx->rpos + TPW_HDR_SIZE;

		r = context_dispatch(ctx, &h, body, body + h.msg_len, why, why_len);
		if (r < 0)
			return r;
		tpc_wire_consume(ctx, &h);
	}
	if (r < 0)
		snprintf(why, why_len, "bad frame header (%s)", tp_strerror(r));
	return r;
}

/* The daemon connection is unusable (@why): fail everything. */
static void context_lost(struct tp_context *ctx, const char *why)
{
	char msg[TPC_ERRMSG_MAX];

	bool ended;

	snprintf(msg, sizeof(msg), "%s (%s)", TPC_CONN_LOST, why);
	/* The stream cannot be trusted any more: stop reading it. */
	shutdown(ctx->fd, SHUT_RDWR);
	pthread_mutex_lock(&ctx->lock);
	ended = ctx->dead != 0; /* SessionEnd said why, or tp_context_free() is closing it */
	context_fail_all_locked(ctx, -ECONNRESET, msg);
	pthread_mutex_unlock(&ctx->lock);
	if (!ended)
		tpc_context_log(ctx, LOG_ERR, "%s", msg);
}

static void context_on_readable(struct tp_context *ctx)
{
	char why[200] = "";
	int r;

	pthread_mutex_lock(&ctx->rx_lock);
	r = context_read(ctx, why, sizeof(why));
	pthread_mutex_unlock(&ctx->rx_lock);
	if (r < 0)
		context_lost(ctx, why);
}

bool tpc_context_help(struct tp_context *ctx, const void *arg)
{
	struct tpc_op *op;
	bool wake;

	if (!ctx->ring || tpu_ring_peek(&ctx->ring_rx) == 0)
		return false;
	help_wake = false;
	if (pthread_mutex_trylock(&ctx->rx_lock) == 0) {
		char why[200] = "";
		int r;

		help_ctx = ctx;
		r = ctx->dead ? 0 : context_read(ctx, why, sizeof(why));
		help_ctx = NULL;
		pthread_mutex_unlock(&ctx->rx_lock);
		if (r < 0)
			context_lost(ctx, why);
	}
	/* Our own completion, next in line with no callback running: take it here instead of
	 * waiting for the io thread to hand it over. The io thread is woken only if callbacks
	 * are left for it (not for the one we take: no wake-up on the way to our caller). */
	pthread_mutex_lock(&ctx->lock);
	op = tpu_list_first(&ctx->done, struct tpc_op, node);
	if (op && op->arg == arg && !ctx->running_op && !op->copying)
		tpu_list_remove(&op->node);
	else
		op = NULL;
	wake = help_wake && !tpu_list_empty(&ctx->done);
	pthread_mutex_unlock(&ctx->lock);
	if (wake)
		tpc_context_wake(ctx);
	if (op)
		context_run_op(ctx, op);
	return op != NULL;
}

void tpc_context_keep_fds(struct tp_context *ctx, struct msghdr *mh)
{
	for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
		size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		int *fds = (int *)CMSG_DATA(c);

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		for (size_t i = 0; i < n; i++) {
			if (ctx->n_pring_fds < TPC_PRING_FDS_MAX)
				ctx->pring_fds[ctx->n_pring_fds++] = fds[i];
			else
				close(fds[i]);
		}
	}
}

int tpc_context_drain_bells(struct tp_context *ctx)
{
	uint8_t bells[64];
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(TPC_PRING_FDS_MAX * sizeof(int))];
	} cm;

	for (;;) {
		struct iovec iov = { .iov_base = bells, .iov_len = sizeof(bells) };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
				     .msg_controllen = sizeof(cm.b) };
		ssize_t k = recvmsg(ctx->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

		if (k > 0) {
			bool fds = mh.msg_controllen != 0;

			tpc_context_keep_fds(ctx, &mh);
			/* A stream socket's read stops short only where the queue ran dry or after
			 * a message's fds: a short one without fds emptied it, no read to hear
			 * EAGAIN. Later bytes or the end make the socket readable again. */
			if ((size_t)k < sizeof(bells) && !fds)
				return 0;
			continue;
		}
		if (k < 0 && errno == EINTR)
			continue;
		return k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK) ? -ECONNRESET : 0;
	}
}

struct io_poll {
	struct tp_context *ctx;
	uint64_t wake_seq;
};

static bool io_ready(void *arg)
{
	struct io_poll *p = arg;

	return tpu_ring_peek(&p->ctx->ring_rx) != 0 ||
	       __atomic_load_n(&p->ctx->wake_seq, __ATOMIC_ACQUIRE) != p->wake_seq ||
	       __atomic_load_n(&p->ctx->ring_pollers, __ATOMIC_RELAXED) != 0;
}

static bool linger_ready(void *arg)
{
	struct io_poll *p = arg;

	return __atomic_load_n(&p->ctx->wake_seq, __ATOMIC_ACQUIRE) != p->wake_seq ||
	       __atomic_load_n(&p->ctx->ring_pollers, __ATOMIC_RELAXED) == 0;
}

/*
 * While a blocked caller polls the ring, the io thread runs only the callbacks that caller (or
 * another application thread) hands it, each through tpc_context_wake(): one eventfd write, one
 * wake-up of a sleeping thread and its poll() and read() a callback. A reader that gets its
 * descriptors in a blocking call and reads them asynchronously (an eager read completes inside
 * tp_pipe_read(), its callback is the io thread's) paid that for every message. So after such
 * work, the io thread lingers: it watches wake_seq for a while before it sleeps, and a waker
 * that finds io_sleeping clear only bumps wake_seq. It lingers only after such reads
 * (io_handed, set by read_eager()), which come at the pace of the reader's loop, not after
 * completions the polling caller found in the ring, which come at the daemon's: in a ping-pong
 * a round trip apart, and an io thread spinning through the round trip would take CPU from
 * the threads that make it (measured: a longer round trip on a busy machine). And only while that work keeps coming: for at most twice the time it last waited
 * for work, and not at all when that was longer than half the context's spin budget (never
 * when idle: the waits that end in a time-out or after a longer sleep are long). A linger that
 * comes to nothing costs at most that half budget, once at the end of a stream of messages.
 *
 * No lost wake-up: the linger is a spin before the ordinary sleep, with io_sleeping clear as
 * in any spin. A waker that bumps wake_seq while it lingers is seen by linger_ready(); one that
 * comes after it is seen by the check after io_sleeping is set (both sequentially consistent),
 * or, if it saw the flag set, its eventfd write ends the poll(). @seq was read under the
 * context lock after the done queue was emptied, and work is queued under that lock before
 * wake_seq moves, so nothing queued before @seq is missed. If the last poller stops meanwhile,
 * the linger ends and the io thread goes on as if none had polled (it spins on the ring, then
 * sets the ring's sleeping flag itself).
 */
static void context_ring_linger(struct tp_context *ctx, struct io_poll *p, bool handed,
				uint64_t last_wait_ns)
{
	uint64_t budget = 2 * last_wait_ns, start;

	if (!handed || budget > ctx->spin_ns || linger_ready(p))
		return;
	start = tpu_now_ns();
	if (tpu_spin_quiet(start))
		return;
	/* A long yield (a busy machine) ends the linger, but says nothing to the other waits of
	 * the process (tpu_spin_contended()): a linger is optional, theirs are not. */
	while (!tpu_spin_pause() && !linger_ready(p) && tpu_now_ns() - start < budget)
		;
}

/*
 * One wait of a ring context's io thread (lock not held): frames waiting in the ring are read
 * at once; else, while a blocked caller polls the ring (ring_poll_start()), it lingers after
 * recent work @handed to it (context_ring_linger()), then blocks in poll() on the eventfd and the socket (fds,
 * the end of the connection) with the ring's sleeping flag left to that caller; else it spins,
 * then sets the sleeping flags and blocks in poll() the same way (doorbells too). *@wait_ns: in,
 * how long the last wait lasted; out, how long this one did.
 */
static void context_ring_wait(struct tp_context *ctx, struct tpu_spin *spin, struct pollfd *pfd,
			      uint64_t seq, bool handed, int timeout_ms, uint64_t *wait_ns)
{
	struct io_poll p = { ctx, seq };
	uint64_t t0 = tpu_now_ns(), v;
	bool raced, lost = false, polled;
	int n = 0;

	context_ring_linger(ctx, &p, handed, *wait_ns);
	*wait_ns = UINT64_MAX / 4; /* a time-out or the end: long */
	if (tpu_spin_wait(spin, io_ready, &p) &&
	    (tpu_ring_peek(&ctx->ring_rx) != 0 ||
	     __atomic_load_n(&ctx->wake_seq, __ATOMIC_ACQUIRE) != seq)) {
		*wait_ns = tpu_now_ns() - t0;
		if (tpu_ring_peek(&ctx->ring_rx) != 0)
			context_on_readable(ctx);
		return;
	}
	__atomic_store_n(&ctx->io_sleeping, 1, __ATOMIC_SEQ_CST);
	polled = __atomic_load_n(&ctx->ring_pollers, __ATOMIC_SEQ_CST) != 0;
	raced = (!polled && tpu_ring_sleep_prepare(&ctx->ring_rx)) ||
		__atomic_load_n(&ctx->wake_seq, __ATOMIC_SEQ_CST) != p.wake_seq;
	if (!raced && (n = poll(pfd, 2, timeout_ms)) > 0 && pfd[0].revents &&
	    read(ctx->efd, &v, sizeof(v)) < 0)
		v = 0;
	__atomic_store_n(&ctx->io_sleeping, 0, __ATOMIC_SEQ_CST);
	tpu_ring_sleep_cancel(&ctx->ring_rx);
	if (raced || n > 0)
		*wait_ns = tpu_now_ns() - t0;
	if (!raced && !polled)
		tpu_spin_slept(spin, tpu_now_ns() - t0);
	if (!raced && pfd[1].revents) {
		pthread_mutex_lock(&ctx->rx_lock); /* the fd queue is the frame readers' */
		lost = tpc_context_drain_bells(ctx) < 0;
		pthread_mutex_unlock(&ctx->rx_lock);
	}
	if (lost) {
		/* Frames the daemon wrote before it went away still count. */
		while (tpu_ring_peek(&ctx->ring_rx) != 0) {
			char why[200] = "";
			int r;

			pthread_mutex_lock(&ctx->rx_lock);
			r = context_read(ctx, why, sizeof(why));
			pthread_mutex_unlock(&ctx->rx_lock);
			if (r < 0) {
				context_lost(ctx, why);
				return;
			}
		}
		context_lost(ctx, "end of stream");
		return;
	}
	context_on_readable(ctx);
}

static void *context_io_main(void *arg)
{
	struct tp_context *ctx = arg;
	struct pollfd pfd[2] = {
		{ .fd = ctx->efd, .events = POLLIN },
		{ .fd = ctx->fd, .events = POLLIN },
	};
	uint64_t v, wait_ns = UINT64_MAX / 4;
	struct tpu_spin spin;
	struct tpc_op *op;

	io_thread_ctx = ctx;
	tpu_spin_init(&spin, ctx->spin_ns);
	tpc_context_log(ctx, LOG_DEBUG, "session %llu of tpipd, control over the %s",
			(unsigned long long)ctx->session_id, ctx->ring ? "shared-memory ring" : "socket");
	pthread_mutex_lock(&ctx->lock);
	for (;;) {
		/* A write completed while its thread still copies into its staging buffer waits
		 * for the copy, and the callbacks behind it wait too (order); that thread wakes
		 * us. */
		while ((op = tpu_list_first(&ctx->done, struct tpc_op, node)) && !op->copying) {
			tpu_list_remove(&op->node);
			ctx->running_op = true;
			pthread_mutex_unlock(&ctx->lock);
			context_run_op(ctx, op);
			pthread_mutex_lock(&ctx->lock);
			ctx->running_op = false;
		}
		if (ctx->stop && !op)
			break;
		if (ctx->chan_back) { /* lent buffers the daemon's notices gave back */
			pthread_mutex_unlock(&ctx->lock);
			tpc_chan_back_run(ctx);
			pthread_mutex_lock(&ctx->lock);
		}
		/* While stopping, keep reading: the shutdown waits for close acknowledgements. */
		nfds_t n = ctx->dead ? 1 : 2;
		/* Work queued from now on bumps wake_seq (after taking the lock we hold). */
		uint64_t seq = __atomic_load_n(&ctx->wake_seq, __ATOMIC_SEQ_CST);
		bool handed = ctx->io_handed;
		/* Wake up to release idle staging buffers. */
		int tmo = tpc_buffer_pool_timeout_locked(ctx);
		int tmo_own = tpc_chan_own_timeout_locked(ctx);

		if (tmo_own >= 0 && (tmo < 0 || tmo_own < tmo))
			tmo = tmo_own;
		ctx->io_untimed = tmo < 0;
		ctx->io_handed = false;

		pthread_mutex_unlock(&ctx->lock);
		if (ctx->ring && n == 2) {
			context_ring_wait(ctx, &spin, pfd, seq, handed, tmo, &wait_ns);
		} else {
			__atomic_store_n(&ctx->io_sleeping, 1, __ATOMIC_SEQ_CST);
			if (__atomic_load_n(&ctx->wake_seq, __ATOMIC_SEQ_CST) == seq &&
			    poll(pfd, n, tmo) > 0) {
				if (pfd[0].revents && read(ctx->efd, &v, sizeof(v)) < 0)
					v = 0;
				if (n > 1 && pfd[1].revents)
					context_on_readable(ctx);
			}
			__atomic_store_n(&ctx->io_sleeping, 0, __ATOMIC_SEQ_CST);
		}
		if (tmo >= 0)
			tpc_buffer_pool_expire(ctx);
		if (tmo_own >= 0)
			tpc_chan_own_expire(ctx);
		pthread_mutex_lock(&ctx->lock);
	}
	pthread_mutex_unlock(&ctx->lock);
	return NULL;
}

int tpc_context_start_thread(struct tp_context *ctx)
{
	sigset_t all, old;
	int r;

	/* The io thread takes no signals: they belong to the application's threads. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	r = -pthread_create(&ctx->thread, NULL, context_io_main, ctx);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r < 0)
		return tpc_error(r, "cannot start the library thread: %s", tp_strerror(r));
	ctx->thread_started = true;
	return 0;
}

/* ---- teardown ------------------------------------------------------------------------------ */

/* How long tp_context_free() waits for the daemon to finish copies into or out of our memory. */
#define SHUTDOWN_DRAIN_MS 10000

/* Pipes closed by the user or by the shutdown whose acknowledgement is still due; lock held. */
static size_t context_closing_pipes(struct tp_context *ctx)
{
	size_t n = 0;

	for (size_t i = 0; i < ctx->pipes.cap; i++)
		if (ctx->pipes.keys[i] &&
		    ((struct tp_pipe *)ctx->pipes.vals[i])->state == TPC_PIPE_CLOSING)
			n++;
	return n;
}

/* True for a pipe whose pending writes or reads the daemon may be copying; lock held. */
static bool pipe_busy(struct tp_pipe *p)
{
	return tpc_pipe_at_daemon(p) && p->state != TPC_PIPE_FAILED &&
	       (!tpu_list_empty(&p->writes) || !tpu_list_empty(&p->reads));
}

/*
 * Collects the ids to close into a new array: listeners first (if @n_listeners, which receives
 * their count) and pipes, either the
 * busy ones (closed here like tp_pipe_close(), so they wait for the daemon's acknowledgement)
 * or all the others still at the daemon. Lock held. Return: count, or 0 on allocation failure.
 */
static size_t context_collect(struct tp_context *ctx, bool busy, size_t *n_listeners,
			      uint64_t **ret)
{
	struct tp_listener *l;
	size_t n = 0, cap = ctx->pipes.n + 1;
	uint64_t *ids;

	tpu_list_for_each(l, &ctx->listeners, link)
		cap++;
	ids = malloc(cap * sizeof(*ids));
	if (!ids)
		return 0;
	tpu_list_for_each(l, &ctx->listeners, link)
		if (n_listeners && !l->closed)
			ids[n++] = l->id;
	if (n_listeners)
		*n_listeners = n;
	for (size_t i = 0; i < ctx->pipes.cap && n < cap; i++) {
		struct tp_pipe *p = ctx->pipes.vals[i];
		if (!ctx->pipes.keys[i] || p->state == TPC_PIPE_CLOSING || pipe_busy(p) != busy)
			continue;
		if (busy)
			tpc_pipe_close_locked(p, true);
		ids[n++] = p->id;
	}
	*ret = ids;
	return n;
}

static void send_listener_close(struct tp_context *ctx, uint64_t id)
{
	Tpw__V1__ListenerClose lc = TPW__V1__LISTENER_CLOSE__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;

	lc.listener_id = id;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTENER_CLOSE;
	m.listener_close = &lc;
	tpc_wire_send(ctx, &m, NULL, 0, -EBADF);
}

/*
 * Cancels everything and tells the daemon which pipes and listeners close. Pipes with writes or
 * reads pending are closed first and their acknowledgements awaited (bounded): until then the
 * daemon may still copy from or into their memory, which the user frees after this returns.
 */
static void context_shutdown(struct tp_context *ctx)
{
	uint64_t *ids = NULL;
	struct timespec ts;
	size_t n = 0, n_listeners = 0;
	bool alive;

	pthread_mutex_lock(&ctx->send_lock);
	pthread_mutex_lock(&ctx->lock);
	ctx->stopping = true;
	if (!ctx->dead)
		n = context_collect(ctx, true, NULL, &ids);
	pthread_mutex_unlock(&ctx->lock);
	for (size_t i = 0; i < n; i++)
		tpc_wire_send_pipe_close(ctx, ids[i]);
	pthread_mutex_unlock(&ctx->send_lock);
	free(ids);
	ids = NULL;

	pthread_mutex_lock(&ctx->lock);
	tpc_deadline(&ts, SHUTDOWN_DRAIN_MS);
	while (!ctx->dead && context_closing_pipes(ctx))
		if (pthread_cond_timedwait(&ctx->cond, &ctx->lock, &ts) == ETIMEDOUT)
			break;
	pthread_mutex_unlock(&ctx->lock);

	pthread_mutex_lock(&ctx->send_lock);
	pthread_mutex_lock(&ctx->lock);
	alive = !ctx->dead;
	n = ctx->dead ? 0 : context_collect(ctx, false, &n_listeners, &ids);
	context_fail_all_locked(ctx, -ECANCELED, "canceled: the context is being freed");
	pthread_mutex_unlock(&ctx->lock);
	for (size_t i = 0; i < n; i++) {
		if (i < n_listeners)
			send_listener_close(ctx, ids[i]);
		else
			tpc_wire_send_pipe_close(ctx, ids[i]);
	}
	/* Last: the disconnect that follows is a clean close, not a dead client. */
	if (alive && ctx->daemon_minor >= TPW_MINOR_SESSION_END)
		tpc_wire_send_session_end(ctx);
	pthread_mutex_unlock(&ctx->send_lock);
	free(ids);
}

void tpc_context_ring_free(struct tp_context *ctx)
{
	if (ctx->ring_map)
		munmap(ctx->ring_map, tpu_ring_map_size(ctx->ring_size));
	ctx->ring_map = NULL;
	ctx->ring = false;
}

TP_EXPORT void tp_context_free(struct tp_context *ctx)
{
	if (!ctx)
		return;
	if (tpc_context_on_io_thread(ctx)) {
		/* Joining ourselves would hang: refuse (and leak) instead. */
		tpc_error(-EDEADLK, "tp_context_free() called from a callback");
		return;
	}
	tpc_context_log(ctx, LOG_DEBUG, "closing the context");
	if (ctx->thread_started) {
		context_shutdown(ctx);
		tpc_pring_free_all(ctx); /* their copies end, their ops may complete */
		pthread_mutex_lock(&ctx->lock);
		ctx->stop = true;
		pthread_mutex_unlock(&ctx->lock);
		tpc_context_wake(ctx);
		pthread_join(ctx->thread, NULL);
	}
	tpc_pipe_free_all(ctx); /* first: backlog pipes are linked into their listener */
	tpc_listener_free_all(ctx);
	tpc_read_desc_keep_free(ctx); /* after the pipes, whose descriptors go there */
	tpc_buffer_free_all(ctx);
	tpc_cuda_free(ctx); /* last: every operation and its events are back */
	tpc_map_done(&ctx->pipes);
	tpc_map_done(&ctx->reqs);
	tpc_map_done(&ctx->ops);
	tpu_close(ctx->fd);
	tpu_close(ctx->efd);
	tpc_context_ring_free(ctx);
	pthread_cond_destroy(&ctx->cond);
	pthread_mutex_destroy(&ctx->lock);
	pthread_mutex_destroy(&ctx->rx_lock);
	pthread_mutex_destroy(&ctx->send_lock);
	pthread_mutex_destroy(&ctx->cuda_lock);
	free(ctx->sbuf);
	free(ctx->siov);
	free(ctx->rbuf);
	free(ctx->name);
	free(ctx);
}

TP_EXPORT const char *tp_context_name(const struct tp_context *ctx)
{
	return ctx ? ctx->name : "";
}

TP_EXPORT const char *tp_context_transport(const struct tp_context *ctx)
{
	return ctx && ctx->ring ? "ring" : "unix";
}

TP_EXPORT bool tp_context_cma_ok(const struct tp_context *ctx)
{
	return ctx && __atomic_load_n(&ctx->cma_ok, __ATOMIC_RELAXED);
}

TP_EXPORT void tp_context_set_log(struct tp_context *ctx, tp_log_fn fn, void *arg)
{
	if (!ctx)
		return;
	__atomic_store_n(&ctx->log_fn, NULL, __ATOMIC_RELEASE);
	__atomic_store_n(&ctx->log_arg, arg, __ATOMIC_RELEASE);
	__atomic_store_n(&ctx->log_fn, fn, __ATOMIC_RELEASE);
}
