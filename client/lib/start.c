/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Starting a context: tp_context_new(). Reads the options (and $TPIPD_RING_BYTES,
 * $TPIPD_SPIN_US), connects to the daemon's socket, says Hello and waits for the HelloReply
 * with a deadline (taking the daemon's limits from it), offers a control ring (RingSetup) and
 * waits for the answer, then starts the io thread. Everything here runs on the caller's thread
 * before the io thread exists. Decoding daemon frames, the io thread itself and teardown (also
 * of a context whose start failed) are context.c's.
 */
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include "internal.h"

/* Connects ctx->fd to @path. Return: 0 or -errno (the caller words the error). */
static int context_connect_path(struct tp_context *ctx, const char *path)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };

	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path); /* fits: tpu_socket_candidates */
	if (ctx->fd < 0)
		ctx->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (ctx->fd < 0)
		return -errno;
	if (connect(ctx->fd, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
		int r = -errno;

		ctx->fd = tpu_close(ctx->fd);
		return r;
	}
	return 0;
}

/*
 * Finds the daemon: the one socket asked for, or the per-user socket and then the system's
 * (tpu_socket_candidates()). A per-user socket that is missing or that nobody listens on is
 * fallen back from; the error names every path tried and why it failed.
 */
static int context_connect(struct tp_context *ctx, const char *socket_path)
{
	struct tpu_socket_list l;
	char tried[2 * 160] = "";
	size_t len = 0;
	int r;

	r = tpu_socket_candidates(socket_path, &l);
	if (r < 0)
		return tpc_error(r, "cannot resolve the daemon socket path: %s", tp_strerror(r));
	for (unsigned i = 0; i < l.n; i++) {
		r = context_connect_path(ctx, l.path[i]);
		if (r == 0 || l.fixed)
			break;
		len += (size_t)snprintf(tried + len, sizeof(tried) - len, "%s%s (%s)",
					i ? ", " : "", l.path[i],
					r == -ENOENT ? "no such file" : strerror(-r));
		if (r != -ENOENT && r != -ECONNREFUSED)
			break; /* a socket that is there but refuses us: not a missing daemon */
	}
	if (r < 0 && l.fixed)
		return tpc_error(r, "cannot connect to tpipd at %s: %s", l.path[0], strerror(-r));
	if (r < 0)
		return tpc_error(r, "no daemon socket: tried %s%s; start tpipd or set TPIPD_SOCKET",
				 l.n == 1 ? "($XDG_RUNTIME_DIR is not set) " : "", tried);
	ctx->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (ctx->efd < 0)
		return tpc_error(-errno, "eventfd: %s", tp_strerror(-errno));
	return tpu_fd_nonblock(ctx->fd);
}

/* Makes the control ring offered by RingSetup. Return: its fd, or -errno (stay on the socket). */
static int context_ring_new(struct tp_context *ctx, const struct tp_context_options *o)
{
	uint32_t size = o->ring_bytes ? o->ring_bytes : TPU_RING_DEFAULT;
	int fd, r;

	if (o->flags & TP_CONTEXT_NO_RING)
		return -EBADF;
	r = tpu_ring_create(size, &fd, &ctx->ring_map);
	if (r < 0)
		return r; /* no memfd here: stay on the socket */
	ctx->ring_size = size;
	tpu_ring_init(ctx->ring_map, size, true, &ctx->ring_tx, &ctx->ring_rx);
	return fd;
}

static int context_send_hello(struct tp_context *ctx, const struct tp_context_options *o)
{
	Tpw__V1__Hello h = TPW__V1__HELLO__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	bool no_cma = o->flags & TP_CONTEXT_NO_CMA;
	int r;

	if (getrandom(&ctx->probe, sizeof(ctx->probe), GRND_NONBLOCK) != sizeof(ctx->probe))
		ctx->probe = tpu_now_ns() ^ ((uint64_t)getpid() << 32);
	h.major = TPW_PROTO_MAJOR;
	h.minor = TPW_PROTO_MINOR;
	h.role = TPW__V1__ROLE__ROLE_CLIENT;
	h.name = ctx->name;
	h.cma_probe_addr = no_cma ? 0 : (uint64_t)(uintptr_t)&ctx->probe;
	h.cma_probe_value = ctx->probe;
	/* used only on control rings, which carry its fd beside them; none with a limit of 0 */
	h.pipe_ring = ctx->pring_max > 0;
	h.pipe_ring_addr = h.pipe_ring; /* no-CMA writes through an offered ring, ring_only reads */
	h.group_arena_fd = true; /* takes, checks and maps a group's sealed arena memfd */
	m.body_case = TPW__V1__CLIENT_MSG__BODY_HELLO;
	m.hello = &h;
	pthread_mutex_lock(&ctx->send_lock);
	r = tpc_wire_send(ctx, &m, NULL, 0, -EBADF);
	pthread_mutex_unlock(&ctx->send_lock);
	return r < 0 ? tpc_error(r, "cannot send Hello: %s", tp_strerror(r)) : 0;
}

/* Waits for one whole frame with a deadline (before the io thread exists). */
static int context_wait_frame(struct tp_context *ctx, uint64_t deadline_ns, struct tpw_hdr *ret)
{
	struct pollfd pfd = { .fd = ctx->fd, .events = POLLIN };
	int r;

	while ((r = tpc_wire_peek(ctx, ret)) == 0) {
		uint64_t now = tpu_now_ns();

		if (now >= deadline_ns)
			return tpc_error(-ETIMEDOUT, "tp_context_new: no answer from the daemon "
					 "within %d ms (tp_context_options.reply_timeout_ms)",
					 ctx->reply_ms);
		r = poll(&pfd, 1, (int)((deadline_ns - now) / 1000000 + 1));
		if (r < 0 && errno != EINTR)
			return tpc_error(-errno, "poll: %s", tp_strerror(-errno));
		r = tpc_wire_fill(ctx);
		if (r < 0 && r != -EAGAIN)
			return tpc_error(r, "%s before HelloReply", TPC_CONN_LOST);
	}
	return r < 0 ? tpc_error(r, "bad frame header from the daemon") : 0;
}

static void context_set_limits(struct tp_context *ctx, const Tpw__V1__Limits *l, size_t eager)
{
	struct tpc_limits *lim = &ctx->lim;

	*lim = (struct tpc_limits){
		.frame_max = TPW_DEFAULT_FRAME_MAX,
		.inline_max = TPW_DEFAULT_INLINE_MAX,
		.segments_max = TPW_DEFAULT_SEGMENTS_MAX,
		.message_bytes_max = TPW_DEFAULT_MESSAGE_BYTES_MAX,
		.metadata_max = TPW_DEFAULT_METADATA_MAX,
	};
	if (l) {
		lim->frame_max = l->frame_max ? TPU_MIN(l->frame_max, TPW_FRAME_MAX_HARD) : lim->frame_max;
		lim->inline_max = l->inline_max ? l->inline_max : lim->inline_max;
		lim->segments_max = l->segments_max ? l->segments_max : lim->segments_max;
		if (l->message_bytes_max)
			lim->message_bytes_max = l->message_bytes_max;
		lim->metadata_max = l->metadata_max ? l->metadata_max : lim->metadata_max;
		lim->buffers_max = l->buffers_max;
		lim->buffer_bytes_max = l->buffer_bytes_max;
		lim->pipes_max = l->pipes_max;
		/* The write window, bounded: a daemon that announces more than it takes only
		 * gets writes refused, as without flow control. */
		lim->win_msgs = TPU_MIN(l->pipe_queue_max, TPC_WIN_MSGS_MAX);
		lim->win_bytes = l->pipe_queue_bytes;
		lim->bcast_pipes_max = TPU_MIN(l->bcast_pipes_max, TPW_BCAST_TARGETS_MAX);
	}
	lim->inline_max = TPU_MIN(lim->inline_max, lim->frame_max);
	ctx->eager_max = TPU_MIN(eager ? eager : TPC_EAGER_DEFAULT, (size_t)lim->inline_max);
}

/*
 * Offers the daemon a control ring (RingSetup, the frame after Hello) and waits for its answer.
 * Return: 0 (on the ring, or on the socket if it was refused or cannot be made), or -errno if
 * the session itself failed.
 */
static int context_ring_setup(struct tp_context *ctx, const struct tp_context_options *o)
{
	Tpw__V1__RingSetup rs = TPW__V1__RING_SETUP__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	_cleanup_close_ int fd = -EBADF;
	Tpw__V1__DaemonMsg *dm;
	struct tpw_hdr h;
	char why[160];
	int r;

	fd = context_ring_new(ctx, o); /* ring_bytes was checked by tp_context_new() */
	if (fd < 0)
		return 0;
	rs.req_id = 1;
	rs.ring_bytes = ctx->ring_size;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_RING_SETUP;
	m.ring_setup = &rs;
	pthread_mutex_lock(&ctx->send_lock);
	r = tpc_wire_send(ctx, &m, NULL, 0, fd);
	pthread_mutex_unlock(&ctx->send_lock);
	if (r < 0)
		return tpc_error(r, "cannot send RingSetup: %s", tp_strerror(r));
	r = context_wait_frame(ctx, tpu_now_ns() + (uint64_t)ctx->reply_ms * 1000000ull, &h);
	if (r < 0)
		return r;
	r = tpc_context_decode(&h, ctx->rbuf + ctx->rpos + TPW_HDR_SIZE, &dm, why, sizeof(why));
	if (r < 0)
		return tpc_error(-EPROTO, "bad answer to RingSetup: %s", why);
	tpc_wire_consume(ctx, &h);
	if (dm->body_case != TPW__V1__DAEMON_MSG__BODY_REPLY || dm->reply->req_id != rs.req_id) {
		r = tpc_error(-EPROTO, "daemon answered RingSetup with message type %d",
			      (int)dm->body_case);
	} else if (dm->reply->status == TPW__V1__STATUS__STATUS_OK) {
		ctx->ring = true; /* every later frame goes through the rings */
		/* Four eager messages in flight must fit the ring, or the writer waits for
		 * room with every message (a small ring set by the caller). */
		if (!o->eager_max)
			ctx->eager_max = TPU_MIN(ctx->eager_max, (size_t)ctx->ring_size / 8);
	} else {
		tpc_context_ring_free(ctx); /* refused (the daemon logs why): stay on the socket */
	}
	tpw_daemon_msg_free(dm);
	return r;
}

static int context_hello(struct tp_context *ctx, const struct tp_context_options *o)
{
	Tpw__V1__DaemonMsg *m;
	const Tpw__V1__HelloReply *hr;
	struct tpw_hdr h;
	char why[160];
	int r;

	r = context_send_hello(ctx, o);
	/* A daemon that refuses the session (a session limit) says why and closes at once,
	 * maybe before our Hello went out: its answer is still there to read. */
	if (r == 0 || r == -EPIPE || r == -ECONNRESET)
		r = context_wait_frame(ctx, tpu_now_ns() + (uint64_t)ctx->reply_ms * 1000000ull, &h);
	if (r < 0)
		return r;
	r = tpc_context_decode(&h, ctx->rbuf + ctx->rpos + TPW_HDR_SIZE, &m, why, sizeof(why));
	if (r < 0)
		return tpc_error(-EPROTO, "bad HelloReply: %s", why);
	tpc_wire_consume(ctx, &h);
	hr = m->hello_reply;
	if (m->body_case != TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY)
		r = tpc_error(-EPROTO, "daemon answered Hello with message type %d",
			      (int)m->body_case);
	else if (hr->status != TPW__V1__STATUS__STATUS_OK || hr->major != TPW_PROTO_MAJOR)
		r = tpc_error(hr->status == TPW__V1__STATUS__STATUS_OK ? -EPROTONOSUPPORT
								       : tpw_status_to_errno(hr->status),
			      "daemon refused the session: %s (daemon protocol %u.%u)",
			      hr->message && *hr->message ? hr->message : tpw_status_name(hr->status),
			      hr->major, hr->minor);
	if (r == 0) {
		ctx->session_id = hr->session_id;
		ctx->cma_ok = hr->cma_ok && !(o->flags & TP_CONTEXT_NO_CMA);
		ctx->close_acks = hr->minor >= TPW_MINOR_CLOSE_ACK;
		ctx->daemon_minor = hr->minor;
		context_set_limits(ctx, hr->limits, o->eager_max);
		ctx->flow = hr->minor >= TPW_MINOR_FLOW && ctx->lim.win_msgs;
		if (hr->minor >= TPW_MINOR_RING)
			r = context_ring_setup(ctx, o);
	}
	tpw_daemon_msg_free(m);
	return r;
}

static char *context_default_name(void)
{
	char comm[64] = "", *name;
	FILE *f = fopen("/proc/self/comm", "re");

	if (f) {
		if (!fgets(comm, sizeof(comm), f))
			comm[0] = '\0';
		fclose(f);
	}
	comm[strcspn(comm, "\n")] = '\0';
	if (asprintf(&name, "%s:%d", *comm ? comm : program_invocation_short_name,
		     (int)getpid()) < 0)
		return NULL;
	return name;
}

static struct tp_context *context_alloc(void)
{
	struct tp_context *ctx = calloc(1, sizeof(*ctx));
	pthread_condattr_t ca;

	if (!ctx)
		return NULL;
	ctx->fd = ctx->efd = -EBADF;
	pthread_mutex_init(&ctx->send_lock, NULL);
	pthread_mutex_init(&ctx->lock, NULL);
	pthread_mutex_init(&ctx->rx_lock, NULL);
	pthread_mutex_init(&ctx->cuda_lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&ctx->cond, &ca);
	pthread_condattr_destroy(&ca);
	tpu_list_init(&ctx->all_pipes);
	tpu_list_init(&ctx->listeners);
	tpu_list_init(&ctx->groups);
	tpu_list_init(&ctx->done);
	tpu_list_init(&ctx->stage_pool);
	tpu_list_init(&ctx->chans);
	tpu_list_init(&ctx->prings);
	return ctx;
}

/*
 * Fills ring_bytes and spin_us left at 0 from $TPIPD_RING_BYTES and $TPIPD_SPIN_US ("0" turns
 * the ring or the spinning off). Return: 0 or -EINVAL for an unparsable value.
 */
static int context_env_options(struct tp_context_options *o)
{
	const char *e;
	uint64_t v;

	e = getenv("TPIPD_RING_BYTES");
	if (e && *e && !o->ring_bytes && !(o->flags & TP_CONTEXT_NO_RING)) {
		if (tpu_parse_size(e, &v) < 0 || v > UINT32_MAX)
			return tpc_error(-EINVAL, "TPIPD_RING_BYTES=%s: not a size", e);
		if (v == 0)
			o->flags |= TP_CONTEXT_NO_RING;
		o->ring_bytes = (uint32_t)v;
	}
	e = getenv("TPIPD_SPIN_US");
	if (e && *e && !o->spin_us && !(o->flags & TP_CONTEXT_NO_SPIN)) {
		if (tpu_parse_size(e, &v) < 0 || v > TPC_SPIN_MAX_US)
			return tpc_error(-EINVAL, "TPIPD_SPIN_US=%s: not 0..%u", e, TPC_SPIN_MAX_US);
		if (v == 0)
			o->flags |= TP_CONTEXT_NO_SPIN;
		o->spin_us = (uint32_t)v;
	}
	return 0;
}

TP_EXPORT int tp_context_new(const struct tp_context_options *opts, struct tp_context **ret)
{
	struct tp_context_options o = { .size = sizeof(o) };
	struct tp_context *ctx;
	int r;

	if (!ret)
		return tpc_error(-EINVAL, "no place for the context");
	if (opts) {
		if (opts->size == 0)
			return tpc_error(-EINVAL, "tp_context_options.size is not set");
		memcpy(&o, opts, TPU_MIN(opts->size, sizeof(o)));
	}
	r = context_env_options(&o);
	if (r < 0)
		return r;
	if (o.ring_bytes && !(o.flags & TP_CONTEXT_NO_RING) && !tpu_ring_size_ok(o.ring_bytes))
		return tpc_error(-EINVAL, "ring_bytes %u: a power of two from %u to %u", o.ring_bytes,
				 TPU_RING_MIN, TPU_RING_MAX);
	if (o.spin_us > TPC_SPIN_MAX_US)
		return tpc_error(-EINVAL, "spin_us %u: at most %u", o.spin_us, TPC_SPIN_MAX_US);
	if (o.name && (!*o.name || strlen(o.name) > TPW_NAME_MAX))
		return tpc_error(-EINVAL, "context name must be 1..%d bytes", TPW_NAME_MAX);
	ctx = context_alloc();
	if (!ctx)
		return tpc_error(-ENOMEM, "out of memory");
	ctx->reply_ms = o.reply_timeout_ms && o.reply_timeout_ms <= INT32_MAX
				? (int)o.reply_timeout_ms
				: TPC_REPLY_TIMEOUT_MS;
	ctx->spin_ns = o.flags & TP_CONTEXT_NO_SPIN
			       ? 0
			       : (uint64_t)(o.spin_us ? o.spin_us : TPC_SPIN_DEFAULT_US) * 1000;
	ctx->name = o.name ? strdup(o.name) : context_default_name();
	r = ctx->name ? 0 : tpc_error(-ENOMEM, "out of memory");
	if (r == 0)
		r = tpc_pring_env(ctx);
	if (r == 0)
		r = context_connect(ctx, o.socket_path);
	if (r == 0)
		r = context_hello(ctx, &o);
	if (r == 0)
		r = tpc_context_start_thread(ctx);
	if (r < 0) {
		char saved[TPC_ERRMSG_MAX];

		snprintf(saved, sizeof(saved), "%s", tp_last_error());
		tp_context_free(ctx);
		return tpc_error_msg(r, saved);
	}
	*ret = ctx;
	return 0;
}
