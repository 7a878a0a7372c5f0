/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Frame I/O of a context's socket: packing and sending client frames (header and protobuf in
 * one buffer, data-tail pieces straight from the caller's memory, an fd by SCM_RIGHTS) and
 * buffering received bytes until a whole daemon frame is available. Interpreting frames is
 * context.c's job.
 *
 * Sending blocks: the socket is non-blocking (for the io thread), so when the kernel buffer is
 * full the sender waits in poll(POLLOUT) while holding send_lock. This is simple and correct as
 * long as the daemon keeps reading, which it always does; other threads keep running and the io
 * thread keeps reading (lock is never held while sending). A send that fails leaves the stream
 * unusable, so the socket is shut down and the io thread reports the connection as lost.
 *
 * With a control ring the frame bytes go into the shared client->daemon ring instead (in
 * pieces when the frame is larger than the free space, waiting on the ring's futex for room),
 * an fd goes ahead of its frame on the socket with one byte, and the daemon is woken by a
 * doorbell byte only when it sleeps. Received frames are copied out of the daemon->client ring,
 * one whole frame at a time while nothing is buffered; the data tail of a large one is left in
 * the ring (which only the daemon writes) until the frame was handled.
 */
#include <limits.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <syslog.h>
#include "internal.h"

#define RBUF_MIN (256u << 10)
#define RBUF_KEEP_MAX (8u << 20)
/* A daemon frame with a data tail of at least this many bytes (an eager descriptor's bytes),
 * whole and in one piece in the ring, is handled with its tail where it lies in the ring: one
 * copy fewer of those bytes (into the receive buffer) before they reach the descriptor. */
#define WIRE_TAIL_IN_RING_MIN (2u << 10)

static int wire_reserve(void **buf, size_t *cap, size_t need, size_t elem)
{
	size_t n = *cap ? *cap : 16;
	void *p;

	if (need <= *cap)
		return 0;
	while (n < need)
		n *= 2;
	p = realloc(*buf, n * elem);
	if (!p)
		return -ENOMEM;
	*buf = p;
	*cap = n;
	return 0;
}

/* Waits up to @timeout_ms for room on @fd. Return: 0, -ETIMEDOUT (the daemon stopped
 * reading: taken as hung), -errno. */
static int wire_wait_writable(int fd, int timeout_ms)
{
	struct pollfd pfd = { .fd = fd, .events = POLLOUT };
	uint64_t deadline = tpu_now_ns() + (uint64_t)timeout_ms * 1000000ull;

	for (;;) {
		uint64_t now = tpu_now_ns();
		int r;

		if (now >= deadline)
			return -ETIMEDOUT;
		r = poll(&pfd, 1, (int)((deadline - now) / 1000000 + 1));
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return -errno;
	}
}

/* Sends all of @iov (modified); the fd rides with the first byte. Waits for room at most
 * @timeout_ms at a time. */
static int wire_sendv(int sock, struct iovec *iov, size_t n, int fd, int timeout_ms)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} cm;

	while (n > 0) {
		struct msghdr mh = { .msg_iov = iov, .msg_iovlen = TPU_MIN(n, (size_t)IOV_MAX) };
		ssize_t k;

		if (fd >= 0) {
			memset(&cm, 0, sizeof(cm));
			mh.msg_control = cm.buf;
			mh.msg_controllen = sizeof(cm.buf);
			cm.h.cmsg_level = SOL_SOCKET;
			cm.h.cmsg_type = SCM_RIGHTS;
			cm.h.cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(&cm.h), &fd, sizeof(int));
		}
		k = sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (k < 0) {
			int r = -errno;
			if (r == -EINTR)
				continue;
			if (r != -EAGAIN)
				return r;
			r = wire_wait_writable(sock, timeout_ms);
			if (r < 0)
				return r;
			continue;
		}
		fd = -EBADF;
		while (n > 0 && (size_t)k >= iov->iov_len) {
			k -= (ssize_t)iov->iov_len;
			iov++;
			n--;
		}
		if (n > 0) {
			iov->iov_base = (char *)iov->iov_base + k;
			iov->iov_len -= (size_t)k;
		}
	}
	return 0;
}

void tpc_wire_doorbell(struct tp_context *ctx)
{
	static const uint8_t bell;

	(void)!send(ctx->fd, &bell, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* True if the daemon's end of the socket is gone. */
static bool wire_hung_up(int sock)
{
	struct pollfd pfd = { .fd = sock, .events = 0 };

	return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLHUP | POLLERR | POLLNVAL));
}

/* Writes all of @iov[0..@n) into the ring; the fd (if any) goes first, on the socket. */
static int wire_ring_sendv(struct tp_context *ctx, const struct iovec *iov, size_t n, int fd)
{
	size_t total = 0, done = 0;
	uint64_t deadline = 0;

	if (fd >= 0) {
		struct iovec one = { (void *)"", 1 };
		int r = wire_sendv(ctx->fd, &one, 1, fd, ctx->reply_ms);

		if (r < 0)
			return r;
	}
	for (size_t i = 0; i < n; i++)
		total += iov[i].iov_len;
	while (done < total) {
		ssize_t k = tpu_ring_put(&ctx->ring_tx, iov, n, done);
		uint32_t seq;

		if (k < 0)
			return (int)k;
		done += (size_t)k;
		if (k > 0 && tpu_ring_consumer_asleep(&ctx->ring_tx))
			tpc_wire_doorbell(ctx);
		if (done == total || k > 0 || tpu_ring_wait_space_prepare(&ctx->ring_tx, &seq))
			continue;
		/* Full: the daemon bumps the futex word when it has made room. */
		if (!deadline)
			deadline = tpu_now_ns() + (uint64_t)ctx->reply_ms * 1000000ull;
		else if (tpu_now_ns() >= deadline)
			return -ETIMEDOUT;
		tpu_ring_futex_wait(&ctx->ring_tx, seq, 100);
		if (wire_hung_up(ctx->fd))
			return -ECONNRESET;
	}
	return 0;
}

/* Sends the frame in siov[0..@n) (+ @fd); send_lock held. */
static int wire_send_frame(struct tp_context *ctx, size_t n, int fd)
{
	int r;

	if (ctx->ring)
		r = wire_ring_sendv(ctx, ctx->siov, n, fd);
	else
		r = wire_sendv(ctx->fd, ctx->siov, n, fd, ctx->reply_ms);
	if (r < 0) {
		/* A partial frame cannot be taken back: make the loss visible to the io thread. */
		shutdown(ctx->fd, SHUT_RDWR);
		tpc_context_log(ctx, LOG_ERR, "send failed: %s; closing the daemon connection",
				tp_strerror(r));
	}
	return r;
}

int tpc_wire_send(struct tp_context *ctx, Tpw__V1__ClientMsg *m, const struct iovec *data,
		  size_t n_data, int fd)
{
	size_t size = tpw_frame_size(&m->base), data_len = 0, n = 0;
	int r;

	for (size_t i = 0; i < n_data; i++)
		data_len += data[i].iov_len;
	if (data_len > UINT32_MAX)
		return -EMSGSIZE;
	r = wire_reserve((void **)&ctx->sbuf, &ctx->sbuf_cap, size, 1);
	if (r == 0)
		r = wire_reserve((void **)&ctx->siov, &ctx->siov_cap, n_data + 1, sizeof(struct iovec));
	if (r < 0)
		return r;
	size = tpw_frame_pack(&m->base, (uint32_t)data_len, fd >= 0 ? 1 : 0, ++ctx->seq, ctx->sbuf);
	ctx->siov[n++] = (struct iovec){ ctx->sbuf, size };
	for (size_t i = 0; i < n_data; i++)
		if (data[i].iov_len)
			ctx->siov[n++] = data[i];
	return wire_send_frame(ctx, n, fd);
}

int tpc_wire_send_packed(struct tp_context *ctx, const uint8_t *body, size_t body_len,
			 const struct iovec *data, size_t n_data)
{
	struct tpw_hdr h = { .magic = TPW_MAGIC, .version = TPW_WIRE_VERSION };
	size_t data_len = 0, n = 0;
	int r;

	for (size_t i = 0; i < n_data; i++)
		data_len += data[i].iov_len;
	if (data_len > UINT32_MAX || body_len > UINT32_MAX)
		return -EMSGSIZE;
	r = wire_reserve((void **)&ctx->sbuf, &ctx->sbuf_cap, TPW_HDR_SIZE, 1);
	if (r == 0)
		r = wire_reserve((void **)&ctx->siov, &ctx->siov_cap, n_data + 2, sizeof(struct iovec));
	if (r < 0)
		return r;
	h.msg_len = (uint32_t)body_len;
	h.data_len = (uint32_t)data_len;
	h.seq = ++ctx->seq;
	tpw_hdr_pack(&h, ctx->sbuf);
	ctx->siov[n++] = (struct iovec){ ctx->sbuf, TPW_HDR_SIZE };
	ctx->siov[n++] = (struct iovec){ (void *)body, body_len };
	for (size_t i = 0; i < n_data; i++)
		if (data[i].iov_len)
			ctx->siov[n++] = data[i];
	return wire_send_frame(ctx, n, -EBADF);
}

int tpc_wire_send_pipe_close(struct tp_context *ctx, uint64_t pipe_id)
{
	Tpw__V1__PipeClose pc = TPW__V1__PIPE_CLOSE__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;

	pc.pipe_id = pipe_id;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_PIPE_CLOSE;
	m.pipe_close = &pc;
	return tpc_wire_send(ctx, &m, NULL, 0, -EBADF);
}

int tpc_wire_send_session_end(struct tp_context *ctx)
{
	Tpw__V1__SessionEnd se = TPW__V1__SESSION_END__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;

	se.status = TPW__V1__STATUS__STATUS_CLOSED;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_SESSION_END;
	m.session_end = &se;
	return tpc_wire_send(ctx, &m, NULL, 0, -EBADF);
}

/* tpc_wire_fill() on the socket: an fd the daemon sends comes with the first byte of the frame
 * that announces it (GroupJoined.arena_fd) and waits in ctx->pring_fds for it. */
static int wire_fill_socket(struct tp_context *ctx)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(TPC_PRING_FDS_MAX * sizeof(int))];
	} cm;
	struct iovec iov = { ctx->rbuf + ctx->rlen, ctx->rcap - ctx->rlen };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t k;

	do {
		mh.msg_control = cm.b;
		mh.msg_controllen = sizeof(cm.b);
		k = recvmsg(ctx->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	} while (k < 0 && errno == EINTR);
	if (k < 0)
		return errno == EWOULDBLOCK ? -EAGAIN : -errno;
	tpc_context_keep_fds(ctx, &mh);
	if (k == 0)
		return -ECONNRESET;
	ctx->rlen += (size_t)k;
	return (int)k;
}

/*
 * How many bytes of the ring to copy next: up to the end of the frame that the receive buffer
 * begins, so that the next one starts with nothing buffered (tpc_wire_ring_take() may take it)
 * and no partial frame is moved to the front. @avail > 0: bytes readable. Return: > 0.
 */
static size_t wire_ring_want(struct tp_context *ctx, size_t avail)
{
	uint8_t hb[TPW_HDR_SIZE];
	size_t buffered = ctx->rlen - ctx->rpos, have = TPU_MIN(buffered, sizeof(hb)), total;
	struct tpw_hdr h;

	if (have + avail < sizeof(hb))
		return avail;
	memcpy(hb, ctx->rbuf + ctx->rpos, have);
	tpu_ring_look(&ctx->ring_rx, 0, hb + have, sizeof(hb) - have);
	if (tpw_hdr_parse(hb, TPW_FRAME_MAX_HARD, &h) < 0)
		return avail; /* tpc_wire_peek() fails it */
	total = TPW_HDR_SIZE + (size_t)h.msg_len + h.data_len;
	return total > buffered ? total - buffered : avail;
}

int tpc_wire_fill(struct tp_context *ctx)
{
	ssize_t k;

	if (ctx->rlen == 0 && ctx->rcap > RBUF_KEEP_MAX) {
		/* Give back the room a huge frame needed once. */
		free(ctx->rbuf);
		ctx->rbuf = NULL;
		ctx->rcap = 0;
	}
	if (ctx->rpos) {
		ctx->rlen -= ctx->rpos;
		memmove(ctx->rbuf, ctx->rbuf + ctx->rpos, ctx->rlen);
		ctx->rpos = 0;
	}
	if (ctx->rcap - ctx->rlen < RBUF_MIN / 4) {
		int r = wire_reserve((void **)&ctx->rbuf, &ctx->rcap,
				     TPU_MAX(ctx->rlen + RBUF_MIN / 4, RBUF_MIN), 1);
		if (r < 0)
			return r;
	}
	if (ctx->ring) {
		k = tpu_ring_avail(&ctx->ring_rx);
		if (k > 0)
			k = tpu_ring_get(&ctx->ring_rx, ctx->rbuf + ctx->rlen,
					 TPU_MIN(ctx->rcap - ctx->rlen, wire_ring_want(ctx, (size_t)k)));
		if (k <= 0)
			return k == 0 ? -EAGAIN : (int)k;
		ctx->rlen += (size_t)k;
		if (tpu_ring_producer_waiting(&ctx->ring_rx))
			tpc_wire_doorbell(ctx); /* the daemon holds output until there is room */
		return (int)k;
	}
	return wire_fill_socket(ctx);
}

int tpc_wire_ring_take(struct tp_context *ctx, struct tpw_hdr *ret, const uint8_t **ret_tail)
{
	uint8_t hb[TPW_HDR_SIZE];
	const uint8_t *tail = NULL;
	struct tpw_hdr h;
	size_t head, total, n;
	ssize_t avail;
	int r;

	if (!ctx->ring || ctx->rlen != ctx->rpos)
		return 0;
	avail = tpu_ring_avail(&ctx->ring_rx);
	if (avail < (ssize_t)TPW_HDR_SIZE)
		return avail < 0 ? (int)avail : 0;
	tpu_ring_look(&ctx->ring_rx, 0, hb, sizeof(hb));
	r = tpw_hdr_parse(hb, TPW_FRAME_MAX_HARD, &h);
	if (r < 0)
		return r;
	head = TPW_HDR_SIZE + (size_t)h.msg_len;
	total = head + h.data_len;
	if ((size_t)avail < total)
		return 0; /* not whole yet (or larger than the ring): tpc_wire_fill() takes it */
	if (h.data_len >= WIRE_TAIL_IN_RING_MIN)
		tail = tpu_ring_span(&ctx->ring_rx, head, h.data_len);
	n = tail ? head : total;
	r = wire_reserve((void **)&ctx->rbuf, &ctx->rcap, TPU_MAX(n, (size_t)RBUF_MIN), 1);
	if (r < 0)
		return r;
	if (tpu_ring_get(&ctx->ring_rx, ctx->rbuf, n) != (ssize_t)n)
		return -EPROTO; /* not reached: we are the only consumer and saw them readable */
	ctx->rpos = 0;
	ctx->rlen = n;
	*ret = h;
	*ret_tail = tail;
	return 1;
}

void tpc_wire_ring_done(struct tp_context *ctx, const struct tpw_hdr *h, const uint8_t *tail)
{
	if (tail)
		tpu_ring_release(&ctx->ring_rx, h->data_len);
	ctx->rpos = ctx->rlen = 0;
}

void tpc_wire_ring_room(struct tp_context *ctx)
{
	if (tpu_ring_producer_waiting(&ctx->ring_rx))
		tpc_wire_doorbell(ctx); /* the daemon holds output until there is room */
}

int tpc_wire_peek(struct tp_context *ctx, struct tpw_hdr *ret)
{
	struct tpw_hdr h;
	size_t total;
	int r;

	if (ctx->rlen - ctx->rpos < TPW_HDR_SIZE)
		return 0;
	r = tpw_hdr_parse(ctx->rbuf + ctx->rpos, TPW_FRAME_MAX_HARD, &h);
	if (r < 0)
		return r;
	total = TPW_HDR_SIZE + (size_t)h.msg_len + h.data_len;
	if (ctx->rlen - ctx->rpos < total) {
		/* Make room for the whole frame (after compaction) so the next reads complete it. */
		r = wire_reserve((void **)&ctx->rbuf, &ctx->rcap, total + RBUF_MIN / 4, 1);
		return r < 0 ? r : 0;
	}
	*ret = h;
	return 1;
}

void tpc_wire_consume(struct tp_context *ctx, const struct tpw_hdr *h)
{
	ctx->rpos += TPW_HDR_SIZE + (size_t)h->msg_len + h->data_len;
	if (ctx->rpos == ctx->rlen)
		ctx->rpos = ctx->rlen = 0;
}
