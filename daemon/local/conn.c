/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One session's connection: the Unix socket or, once the client set them up, the two shared
 * control rings. See conn.h. Reading: recvmsg into a growing input buffer (the part beyond the
 * base size charged to the uid's quota), fds into a FIFO, then every complete frame (its header
 * checked here, the fds it announced taken from the FIFO) goes to the owner's on_frame
 * (struct tpd_conn_ops, set by session.c: sessmsg.c unpacks, validates and handles it); what
 * messages mean is not this file's business, nor who the client is or when the session ends
 * (session.c), and this file does not read struct tpd_session.
 * Writing: frames are sent at once when the output queue is empty, else queued with EV_WRITE
 * interest. Any protocol violation fails the owner (on_fail); the session is freed from its
 * close event, never from inside a call of this file.
 *
 * With a control ring (RingSetup, the frame after Hello), the same byte stream goes through the
 * two shared rings instead: input is copied out of the client->daemon ring into the input
 * buffer (so a frame cannot change once validated), output is copied into the daemon->client
 * ring, and the socket only carries doorbell bytes (wake-ups of a sleeping side), fds (sent by
 * the client just before the frame that announces them is written to the ring) and the end of
 * the session. The spin loop polls busy rings between events (local.c).
 */
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include "conn.h"
#include "core.h"
#include "frame.h"
#include "local.h"
#include "log.h"
#include "quota.h"

#define IN_MIN_FREE (64u << 10)
/* A Write's data tail of at least this many bytes (an eager message's payload), whole and in one
 * piece in the client's ring, goes on from there (to the reader's ring, or the daemon's copy of
 * a rendezvous message's inline parts) without a copy into the input buffer first. */
#define CONN_TAIL_IN_RING_MIN (2u << 10)
/* Frames (or pieces of one larger than the input buffer's room) one poll of a ring takes. */
#define RING_FRAMES_PER_POLL 64
#define ROUNDS_PER_WAKEUP 16

struct outbuf {
	struct tpu_list node;
	int fd; /* a socket session's fd for the frame's first byte (SCM_RIGHTS), owned */
	size_t len;
	size_t off;
	uint8_t data[];
};

/* The fds @c holds for its client are now @n_left of a kind of which @charged were charged as
 * parked fds: gives back the charges of those gone (closed, sent, or claimed by their frame). */
static void fds_uncharge(struct tpd_conn *c, unsigned *charged, unsigned n_left)
{
	for (; *charged > n_left; (*charged)--)
		tpd_quota_release_fd(tpd_daemon_quota(c->d), c->acct);
}

static void outbuf_free(struct tpd_conn *c, struct outbuf *o)
{
	if (o->fd >= 0) {
		c->outq_fds--;
		fds_uncharge(c, &c->outq_fds_charged, c->outq_fds);
	}
	tpu_close(o->fd);
	free(o);
}

static void conn_on_read(evutil_socket_t fd, short what, void *arg);
static void conn_on_write(evutil_socket_t fd, short what, void *arg);
static int flush_out(struct tpd_conn *c);
static void fail_output(struct tpd_conn *c, int r);
static void ring_take_side(struct tpd_conn *c);

/* Fails @c's owner (struct tpd_conn_ops.on_fail) with @fmt formatted, as tpd_session_fail()
 * formats it (512 bytes at most). */
static void _printf_(4, 5) conn_fail(struct tpd_conn *c, int level, Tpw__V1__Status status,
				     const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	c->ops->on_fail(c->owner, level, status, msg);
}

/* ---- fds held for the client --------------------------------------------------------------- */

/*
 * Charges to the uid the fds @c holds for its client beyond its handlers once a read or a send
 * is over: those received ahead of the frames that announce them, and duplicates queued towards
 * a client that has not read them. Each is a slot of the daemon's fd table outside
 * tpd_config_fd_reserve(), so they count as kept fds (tpd_quota_charge_parked_fd()); a frame
 * that arrives with its fds gives them to its handler in the same read, uncharged. Over the
 * uid's or the daemon's limit fails @c, logged at most once a second (anyone can provoke it).
 * Return: 0, or -EMFILE / -ENFILE once @c failed.
 */
static int fds_charge(struct tpd_conn *c)
{
	struct tpd_quota *q = tpd_daemon_quota(c->d);
	unsigned suppressed = 0;
	char why[200];
	int r;

	if (c->stopped || !c->acct)
		return 0; /* a failed connection's fds go with it, in tpd_conn_done() */
	while (c->fdq_charged < c->n_fdq || c->outq_fds_charged < c->outq_fds) {
		r = tpd_quota_charge_parked_fd(q, tpd_daemon_cfg(c->d), c->acct, why, sizeof(why));
		if (r < 0)
			goto refuse;
		if (c->fdq_charged < c->n_fdq)
			c->fdq_charged++;
		else
			c->outq_fds_charged++;
	}
	return 0;
refuse:
	if (!tpd_quota_ratelog_uid_ok(&q->parked_fds_log, c->acct->uid, 1, 8, 1000, &suppressed)) {
		conn_fail(c, TPU_LOG_DEBUG, TPW__V1__STATUS__STATUS_LIMIT,
			  "%u fds held for the client: %s", c->n_fdq + c->outq_fds, why);
		return r;
	}
	conn_fail(c, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_LIMIT,
		  "%u fds held for the client: %s (%u similar closes of this uid since its last "
		  "such line)",
		  c->n_fdq + c->outq_fds, why, suppressed);
	return r;
}

/* ---- buffering ----------------------------------------------------------------------------- */


/*
 * Resizes the input buffer to @cap bytes, the part beyond the base buffer charged to the uid's
 * quota. Return: 0, -EDQUOT or -ENOBUFS (per-uid or daemon-wide budget, reason in @why), or
 * -ENOMEM.
 */
static int in_resize(struct tpd_conn *c, size_t cap, char *why, size_t wl)
{
	size_t charge = cap > IN_MIN_FREE ? cap - IN_MIN_FREE : 0;
	uint8_t *nb;
	int r;

	if (charge > c->in_charged) {
		r = tpd_quota_charge_in(tpd_daemon_quota(c->d), tpd_daemon_cfg(c->d), c->acct,
					charge - c->in_charged, why, wl);
		if (r < 0)
			return r;
	}
	nb = realloc(c->in, cap);
	if (!nb) {
		if (charge > c->in_charged)
			tpd_quota_release_in(tpd_daemon_quota(c->d), c->acct, charge - c->in_charged);
		snprintf(why, wl, "out of memory for a %zu byte input buffer", cap);
		return -ENOMEM;
	}
	if (charge < c->in_charged)
		tpd_quota_release_in(tpd_daemon_quota(c->d), c->acct, c->in_charged - charge);
	c->in_charged = charge;
	c->in = nb;
	c->in_cap = cap;
	return 0;
}

/* The log of a budget hit with @r (-EDQUOT per uid, -ENOBUFS daemon-wide), or NULL. */
static struct tpd_ratelog_keys *budget_log(struct tpd_conn *c, int r)
{
	if (r != -EDQUOT && r != -ENOBUFS)
		return NULL;
	return &tpd_daemon_quota(c->d)->budget_log[r == -ENOBUFS];
}

/* May a budget hit of @c be logged: a line a second for each uid and kind, 8 for all uids. */
static bool budget_log_ok(struct tpd_conn *c, struct tpd_ratelog_keys *rl, unsigned *suppressed)
{
	return tpd_quota_ratelog_uid_ok(rl, c->acct ? c->acct->uid : (uid_t)-1, 1, 8, 1000,
					suppressed);
}

/* Fails @c whose input buffer could not grow (@r from in_resize()); budget hits are logged at
 * most once a second per kind and uid: a client can provoke them at will. */
static void in_resize_failed(struct tpd_conn *c, int r, const char *why)
{
	struct tpd_ratelog_keys *rl = budget_log(c, r);
	unsigned suppressed = 0;

	if (!rl) {
		conn_fail(c, TPU_LOG_ERR, TPW__V1__STATUS__STATUS_IO, "%s", why);
		return;
	}
	if (!budget_log_ok(c, rl, &suppressed)) {
		conn_fail(c, TPU_LOG_DEBUG, TPW__V1__STATUS__STATUS_LIMIT, "%s", why);
		return;
	}
	conn_fail(c, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_LIMIT,
		  "%s (%u similar closes of this uid since its last such line)", why, suppressed);
}

/* ---- output -------------------------------------------------------------------------------- */

/* Wakes the client if it sleeps on the ring (one doorbell byte; a full socket already holds
 * doorbells, so EAGAIN is fine). */
static void ring_doorbell(struct tpd_conn *c)
{
	static const uint8_t bell;

	(void)!send(c->fd, &bell, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* flush_out() for a ring session. Return: 0 or -EPROTO (the client broke the ring). */
static int ring_flush_out(struct tpd_conn *c)
{
	bool put = false;

	while (!tpu_list_empty(&c->outq)) {
		struct outbuf *o = tpu_list_first(&c->outq, struct outbuf, node);
		struct iovec iov = { o->data + o->off, o->len - o->off };
		ssize_t n = tpu_ring_put(&c->ring_tx, &iov, 1, 0);
		uint32_t seq;

		if (n < 0)
			return (int)n;
		if (n == 0) {
			/* Full: the client rings the doorbell once it has made room. */
			if (!tpu_ring_wait_space_prepare(&c->ring_tx, &seq))
				break;
			continue;
		}
		put = true;
		o->off += (size_t)n;
		c->outq_bytes -= (uint64_t)n;
		tpd_quota_release_out(tpd_daemon_quota(c->d), c->acct, (uint64_t)n);
		c->bytes_out += (uint64_t)n;
		if (o->off < o->len)
			continue;
		tpu_list_remove(&o->node);
		outbuf_free(c, o);
	}
	if (put && tpu_ring_consumer_asleep(&c->ring_tx))
		ring_doorbell(c);
	return 0;
}

/* Sends what is left of @o on @c's socket, its fd (if any) with the first byte. */
static ssize_t send_outbuf(struct tpd_conn *c, struct outbuf *o)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} cm = { 0 };
	struct iovec iov = { .iov_base = o->data + o->off, .iov_len = o->len - o->off };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	if (o->fd < 0 || o->off)
		return send(c->fd, iov.iov_base, iov.iov_len, MSG_DONTWAIT | MSG_NOSIGNAL);
	mh.msg_control = cm.b;
	mh.msg_controllen = sizeof(cm.b);
	cm.h.cmsg_level = SOL_SOCKET;
	cm.h.cmsg_type = SCM_RIGHTS;
	cm.h.cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(&cm.h), &o->fd, sizeof(int));
	n = sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
	if (n > 0) {
		o->fd = tpu_close(o->fd); /* the client's now (in flight) */
		c->outq_fds--;
		fds_uncharge(c, &c->outq_fds_charged, c->outq_fds);
	}
	return n;
}

/* Writes queued output. Return: 0 (all or some sent), -errno on a dead connection. */
static int flush_out(struct tpd_conn *c)
{
	if (c->ring)
		return ring_flush_out(c);
	while (!tpu_list_empty(&c->outq)) {
		struct outbuf *o = tpu_list_first(&c->outq, struct outbuf, node);
		ssize_t n = send_outbuf(c, o);

		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				return 0;
			return -errno;
		}
		o->off += (size_t)n;
		c->outq_bytes -= (uint64_t)n;
		tpd_quota_release_out(tpd_daemon_quota(c->d), c->acct, (uint64_t)n);
		c->bytes_out += (uint64_t)n;
		if (o->off < o->len)
			return 0;
		tpu_list_remove(&o->node);
		outbuf_free(c, o);
	}
	return 0;
}

static void update_write_interest(struct tpd_conn *c)
{
	if (tpu_list_empty(&c->outq) || c->ring)
		event_del(c->ev_write);
	else
		event_add(c->ev_write, NULL);
}

static void fail_output(struct tpd_conn *c, int r)
{
	if (r == -EPROTO)
		conn_fail(c, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
			  "control ring corrupted by the client (impossible read position)");
	else if (c->ops->ended_clean(c->owner) && (r == -EPIPE || r == -ECONNRESET))
		conn_fail(c, TPU_LOG_INFO, TPW__V1__STATUS__STATUS_CLOSED,
			  "client closed its context");
	else
		conn_fail(c, TPU_LOG_INFO, TPW__V1__STATUS__STATUS_PEER_DIED,
			  "send failed: %s", strerror(-r));
}

static void conn_on_write(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_conn *c = arg;
	int r = flush_out(c);

	if (r < 0) {
		fail_output(c, r);
		return;
	}
	update_write_interest(c);
}

/*
 * A ring session with nothing queued and room for the whole frame: pack it into the daemon's
 * scratch buffer (local.c) and copy it into the ring, with no allocation. Return: true if sent.
 */
static bool ring_send_direct(struct tpd_conn *c, Tpw__V1__DaemonMsg *m,
			     const struct iovec *tail, int n_tail, size_t len, size_t tail_len)
{
	struct iovec iov[1 + TPD_SEND_TAIL_MAX];
	ssize_t space = tpu_ring_space(&c->ring_tx), n;
	uint8_t *scratch;

	if (space < (ssize_t)len || n_tail > TPD_SEND_TAIL_MAX || !tpu_list_empty(&c->outq))
		return false;
	scratch = tpd_local_scratch(tpd_daemon_local(c->d), len - tail_len);
	if (!scratch)
		return false;
	iov[0].iov_base = scratch;
	iov[0].iov_len = tpw_frame_pack(&m->base, (uint32_t)tail_len, 0, ++c->seq_out,
					scratch);
	for (int i = 0; i < n_tail; i++)
		iov[1 + i] = tail[i];
	n = tpu_ring_put(&c->ring_tx, iov, 1 + (size_t)n_tail, 0);
	if (n != (ssize_t)len) { /* cannot happen: we checked the room and we are the producer */
		fail_output(c, -EPROTO);
		return true;
	}
	c->bytes_out += len;
	if (tpu_ring_consumer_asleep(&c->ring_tx))
		ring_doorbell(c);
	return true;
}

/* tpd_conn_send() with @fd (taken, also on failure; -EBADF: none) for the frame's first byte
 * on a socket session. */
static int conn_queue(struct tpd_conn *c, Tpw__V1__DaemonMsg *m, const struct iovec *tail,
		      int n_tail, int fd)
{
	_cleanup_close_ int fd_owned = fd;
	size_t tail_len = 0, len, off;
	struct outbuf *o;
	bool was_empty;
	char why[200];
	int r;

	if (c->stopped)
		return -EPIPE;
	for (int i = 0; i < n_tail; i++)
		tail_len += tail[i].iov_len;
	len = tpw_frame_size(&m->base) + tail_len;
	if (c->outq_bytes + len > tpd_daemon_cfg(c->d)->outq_max) {
		conn_fail(c, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
			  "client does not read: %llu bytes queued (limit %llu, tpipd "
			  "--client-queue-bytes)",
			  (unsigned long long)c->outq_bytes,
			  (unsigned long long)tpd_daemon_cfg(c->d)->outq_max);
		return -ENOBUFS;
	}
	if (fd_owned >= 0 && c->outq_fds >= TPD_CONN_OUT_FDS_MAX) {
		/* each one a slot of the daemon's fd table until the client reads its frame */
		conn_fail(c, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
			  "client does not read: %u fds queued for it (limit %u)", c->outq_fds,
			  TPD_CONN_OUT_FDS_MAX);
		return -ENOBUFS;
	}
	if (c->ring && fd_owned < 0 && ring_send_direct(c, m, tail, n_tail, len, tail_len))
		return c->stopped ? -EPROTO : 0;
	r = tpd_quota_charge_out(tpd_daemon_quota(c->d), tpd_daemon_cfg(c->d), c->acct, len, why,
				 sizeof(why));
	if (r < 0) {
		unsigned suppressed = 0;
		struct tpd_ratelog_keys *rl = budget_log(c, r);
		bool loud = rl && budget_log_ok(c, rl, &suppressed);

		conn_fail(c, loud ? TPU_LOG_WARNING : TPU_LOG_DEBUG,
			  TPW__V1__STATUS__STATUS_PEER_DIED,
			  "client does not read: %s (%u similar closes of this uid since its "
			  "last such line)", why, suppressed);
		return r;
	}
	o = malloc(sizeof(*o) + len);
	if (!o) {
		tpd_quota_release_out(tpd_daemon_quota(c->d), c->acct, len);
		conn_fail(c, TPU_LOG_ERR, TPW__V1__STATUS__STATUS_IO, "out of memory");
		return -ENOMEM;
	}
	off = tpw_frame_pack(&m->base, (uint32_t)tail_len, 0, ++c->seq_out, o->data);
	for (int i = 0; i < n_tail; i++) {
		if (tail[i].iov_len) /* an empty piece may have no base: memcpy(_, NULL, 0) is UB */
			memcpy(o->data + off, tail[i].iov_base, tail[i].iov_len);
		off += tail[i].iov_len;
	}
	o->fd = TAKE_FD(fd_owned);
	c->outq_fds += o->fd >= 0;
	o->len = len;
	o->off = 0;
	was_empty = tpu_list_empty(&c->outq);
	tpu_list_insert_tail(&c->outq, &o->node);
	c->outq_bytes += len;
	if (!was_empty)
		return o->fd >= 0 ? fds_charge(c) : 0;
	r = flush_out(c);
	if (r < 0) {
		fail_output(c, r);
		return r;
	}
	update_write_interest(c);
	return c->outq_fds ? fds_charge(c) : 0; /* an fd the client did not take yet */
}

int tpd_conn_send(struct tpd_conn *c, Tpw__V1__DaemonMsg *m, const struct iovec *tail,
		  int n_tail)
{
	return conn_queue(c, m, tail, n_tail, -EBADF);
}

int tpd_conn_send_with_fd(struct tpd_conn *c, Tpw__V1__DaemonMsg *m, int fd)
{
	int dup;
	int r;

	if (c->stopped)
		return -EPIPE;
	if (c->ring) {
		r = tpd_conn_send_fd(c, fd);
		return r < 0 ? r : tpd_conn_send(c, m, NULL, 0);
	}
	dup = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (dup < 0)
		return -errno;
	return conn_queue(c, m, NULL, 0, dup);
}

/* ---- input --------------------------------------------------------------------------------- */

/*
 * fds travel with the first bytes of the frame that announces them, so once every complete
 * frame is handled, the queue may only hold fds of the frame that starts the buffer.
 */
static void check_stray_fds(struct tpd_conn *c)
{
	struct tpw_hdr h;
	unsigned allowed = 0;

	if (c->stopped || !c->n_fdq || c->ring)
		return; /* ring: fds come ahead of their frames; the queue's size bounds them */
	if (c->in_len > 0 && c->in_len < TPW_HDR_SIZE)
		return; /* header not complete yet */
	if (c->in_len >= TPW_HDR_SIZE &&
	    tpw_hdr_parse(c->in, tpd_daemon_limits(c->d)->frame_max, &h) == 0)
		allowed = h.nfds;
	if (c->n_fdq > allowed)
		conn_fail(c, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
			  "%u fds received that no frame announced",
			  c->n_fdq - allowed);
}

/* Gives back an input buffer grown for a large frame once it holds little again and the frame
 * it has begun (@pending bytes, 0 if none) is small. */
static void in_shrink(struct tpd_conn *c, size_t pending)
{
	char why[200];

	if (c->stopped || c->in_cap <= 2 * IN_MIN_FREE || c->in_len > IN_MIN_FREE / 2 ||
	    pending > IN_MIN_FREE / 2)
		return;
	(void)in_resize(c, IN_MIN_FREE, why, sizeof(why)); /* shrinking cannot fail the budget */
}

/*
 * Takes the fds frame @h announces out of @c's fd queue: the first into @ret_fd (owned by the
 * caller), the others closed (no message takes more than one). Return: 0, or -EBADMSG after
 * failing @c (fewer fds than announced).
 */
static int claim_fds(struct tpd_conn *c, const struct tpw_hdr *h, int *ret_fd)
{

	if (h->nfds > c->n_fdq && c->ring)
		ring_take_side(c); /* the client sent them before writing this frame */
	if (h->nfds > c->n_fdq) {
		conn_fail(c, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
			  "frame %llu announces %u fds, %u received",
			  (unsigned long long)h->seq, h->nfds, c->n_fdq);
		return -EBADMSG;
	}
	*ret_fd = -EBADF;
	if (h->nfds) {
		*ret_fd = c->fdq[0];
		for (unsigned i = 1; i < h->nfds; i++)
			tpu_close(c->fdq[i]);
		memmove(c->fdq, c->fdq + h->nfds, (c->n_fdq - h->nfds) * sizeof(int));
		c->n_fdq -= h->nfds;
		/* the claimed fd is the handler's now: one that keeps it charges it again */
		fds_uncharge(c, &c->fdq_charged, c->n_fdq);
	}
	return 0;
}

/* Processes every complete frame in the input buffer. */
static void parse_frames(struct tpd_conn *c)
{
	bool was_ring = c->ring;
	size_t off = 0, pending = 0;

	while (!c->stopped && c->in_len - off >= TPW_HDR_SIZE) {
		struct tpw_hdr h;
		size_t need;
		int fd, r = tpw_hdr_parse(c->in + off, c->ops->frame_max(c->owner), &h);

		if (r < 0) {
			conn_fail(c, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
				  "bad frame header: %s", strerror(-r));
			return;
		}
		need = TPW_HDR_SIZE + (size_t)h.msg_len + h.data_len;
		if (c->in_len - off < need) {
			pending = need;
			if (need > c->in_cap) {
				char why[200];

				if (off) { /* make room at the front first */
					memmove(c->in, c->in + off, c->in_len - off);
					c->in_len -= off;
					off = 0;
				}
				r = in_resize(c, need + IN_MIN_FREE, why, sizeof(why));
				if (r < 0) {
					in_resize_failed(c, r, why);
					return;
				}
			}
			break;
		}
		c->bytes_in += need;
		if (claim_fds(c, &h, &fd) < 0 ||
		    c->ops->on_frame(c->owner, &h, c->in + off + TPW_HDR_SIZE,
				     c->in + off + TPW_HDR_SIZE + h.msg_len, false, fd) < 0)
			return;
		off += need;
		if (c->ring && !was_ring) {
			/* Switched to the rings: whatever followed RingSetup on the socket can only
			 * be doorbell and fd bytes (the client waits for the answer). */
			off = c->in_len;
			break;
		}
	}
	if (off) {
		memmove(c->in, c->in + off, c->in_len - off);
		c->in_len -= off;
	}
	in_shrink(c, pending);
	check_stray_fds(c);
}

/* Queues fds received with a recvmsg. Return: 0 or -EBADMSG (too many). */
static int take_fds(struct tpd_conn *c, struct msghdr *mh)
{
	int r = 0;

	for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
		size_t n;
		int *fds;

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		fds = (int *)CMSG_DATA(cm);
		for (size_t i = 0; i < n; i++) {
			if (c->n_fdq < TPU_ARRAY_SIZE(c->fdq))
				c->fdq[c->n_fdq++] = fds[i];
			else {
				tpu_close(fds[i]);
				r = -EBADMSG;
			}
		}
	}
	return r;
}

/* Keeps room in the input buffer for the next read. Return: 0 or -ENOMEM. */
static int in_reserve(struct tpd_conn *c)
{
	char why[200];
	int r;

	if (c->in_cap - c->in_len >= IN_MIN_FREE / 4)
		return 0;
	r = in_resize(c, c->in_cap + IN_MIN_FREE, why, sizeof(why));
	if (r < 0)
		in_resize_failed(c, r, why);
	return r;
}

/* One recvmsg into @buf, fds into the queue. Return: bytes read, 0 on EOF, -EAGAIN, -errno. */
static ssize_t recv_msg(struct tpd_conn *c, void *buf, size_t len)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * TPW_FDS_MAX * 2)];
		struct cmsghdr align;
	} cm;
	struct iovec iov = { buf, len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
			     .msg_controllen = sizeof(cm.buf) };
	ssize_t n;

	n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n < 0)
		return -errno;
	if (take_fds(c, &mh) < 0 || (mh.msg_flags & MSG_CTRUNC))
		return -EBADMSG;
	return n;
}

/* One recvmsg into the input buffer. Return: bytes read, 0 on EOF, -EAGAIN, or -errno. */
static ssize_t recv_some(struct tpd_conn *c)
{
	ssize_t n;

	if (in_reserve(c) < 0)
		return -ENOMEM;
	n = recv_msg(c, c->in + c->in_len, c->in_cap - c->in_len);
	if (n > 0)
		c->in_len += (size_t)n;
	return n;
}

/* ---- control ring -------------------------------------------------------------------------- */

/* Doorbell bytes one read of a ring session's socket takes. */
#define BELLS_PER_READ 64

/* One read of a ring session's socket: doorbell bytes (dropped) and fds. Return: as recv_msg. */
static ssize_t recv_side(struct tpd_conn *c)
{
	uint8_t bells[BELLS_PER_READ];

	return recv_msg(c, bells, sizeof(bells));
}

/* Takes the fds waiting on the socket of ring session @c into its fd queue (a ring client sends
 * them before it writes the frame that announces them); doorbell bytes are dropped. Too many or
 * truncated fds fail @c. */
static void ring_take_side(struct tpd_conn *c)
{
	for (int i = 0; i < ROUNDS_PER_WAKEUP; i++) {
		ssize_t n = recv_side(c);

		if (n == -EBADMSG)
			conn_fail(c, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
				  "receive failed: too many or truncated fds");
		if (n <= 0)
			break;
	}
}

/*
 * With nothing buffered, handles the next frame of the client->daemon ring if it is whole there
 * and its data tail is large and in one piece: header and message are copied out (and checked)
 * as usual, the tail is handed on where it lies (on_frame's @tail_shared) and released after.
 * Return: 1 if it handled one, 0 if not (the caller copies out as usual), -1 once @c failed.
 */
static int ring_take_in_place(struct tpd_conn *c)
{
	uint8_t hb[TPW_HDR_SIZE];
	const uint8_t *tail;
	struct tpw_hdr h;
	size_t head;
	ssize_t avail;
	int fd, r;

	if (c->in_len || (avail = tpu_ring_avail(&c->ring_rx)) < (ssize_t)TPW_HDR_SIZE)
		return 0; /* a corrupt position is found (and failed) by the copy out */
	tpu_ring_look(&c->ring_rx, 0, hb, sizeof(hb));
	if (tpw_hdr_parse(hb, c->ops->frame_max(c->owner), &h) < 0)
		return 0; /* the copy out fails it */
	head = TPW_HDR_SIZE + (size_t)h.msg_len;
	if (h.data_len < CONN_TAIL_IN_RING_MIN || head > c->in_cap ||
	    (size_t)avail < head + h.data_len ||
	    !(tail = tpu_ring_span(&c->ring_rx, head, h.data_len)))
		return 0;
	r = (int)tpu_ring_get(&c->ring_rx, c->in, head); /* header and message: our copy */
	if (r != (int)head) /* not reached: we are the only consumer and saw them readable */
		return 0;
	c->bytes_in += head + h.data_len;
	if (claim_fds(c, &h, &fd) < 0 ||
	    c->ops->on_frame(c->owner, &h, c->in + TPW_HDR_SIZE, tail, true, fd) < 0)
		return -1;
	if (c->stopped)
		return -1;
	tpu_ring_release(&c->ring_rx, h.data_len);
	tpu_ring_producer_waiting(&c->ring_rx); /* wakes a client blocked on a full ring */
	return 1;
}

/*
 * How many bytes of the ring to copy next: up to the end of the frame that the input buffer
 * begins (it holds at most the start of one: parse_frames() handled the whole ones before it),
 * so that the next frame starts with an empty buffer (ring_take_in_place() may take it) and no
 * partial frame is moved to the front. @avail > 0: bytes readable. Return: > 0.
 */
static size_t ring_want(struct tpd_conn *c, size_t avail)
{
	uint8_t hb[TPW_HDR_SIZE];
	struct tpw_hdr h;
	size_t have = TPU_MIN(c->in_len, sizeof(hb)), total;

	if (have + avail < sizeof(hb))
		return avail;
	memcpy(hb, c->in, have);
	tpu_ring_look(&c->ring_rx, 0, hb + have, sizeof(hb) - have);
	if (tpw_hdr_parse(hb, c->ops->frame_max(c->owner), &h) < 0)
		return avail; /* parse_frames() fails it */
	total = TPW_HDR_SIZE + (size_t)h.msg_len + h.data_len;
	return total > c->in_len ? total - c->in_len : avail;
}

/* Copies what the client->daemon ring holds into the input buffer and handles its frames, one
 * at a time. Return: true if bytes came. */
static bool ring_pull(struct tpd_conn *c)
{
	bool got = false;

	for (int i = 0; i < RING_FRAMES_PER_POLL && !c->stopped; i++) {
		ssize_t n, avail;
		int r = ring_take_in_place(c);

		if (r < 0)
			return true;
		if (r > 0) {
			got = true;
			continue;
		}

		if (in_reserve(c) < 0) {
			conn_fail(c, TPU_LOG_ERR, TPW__V1__STATUS__STATUS_IO,
				  "out of memory");
			break;
		}
		avail = tpu_ring_avail(&c->ring_rx);
		n = avail;
		if (avail > 0)
			n = tpu_ring_get(&c->ring_rx, c->in + c->in_len,
					 TPU_MIN(c->in_cap - c->in_len, ring_want(c, (size_t)avail)));
		if (n < 0)
			conn_fail(c, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
				  "control ring corrupted by the client (impossible write "
				  "position)");
		if (n <= 0)
			break;
		got = true;
		c->in_len += (size_t)n;
		tpu_ring_producer_waiting(&c->ring_rx); /* wakes a client blocked on a full ring */
		parse_frames(c);
	}
	return got;
}

bool tpd_conn_ring_poll(struct tpd_conn *c)
{
	uint64_t queued;
	bool moved;
	int r;

	if (!c->ring || c->stopped)
		return false;
	moved = ring_pull(c);
	(void)fds_charge(c); /* fds sent ahead of frames not in the ring yet */
	if (tpu_list_empty(&c->outq) || c->stopped)
		return moved;
	queued = c->outq_bytes;
	r = flush_out(c);
	if (r < 0)
		fail_output(c, r);
	return moved || c->outq_bytes != queued;
}

bool tpd_conn_ring_sleep(struct tpd_conn *c)
{
	return c->ring && !c->stopped && tpu_ring_sleep_prepare(&c->ring_rx);
}

void tpd_conn_ring_wake(struct tpd_conn *c)
{
	if (c->ring && !c->stopped)
		tpu_ring_sleep_cancel(&c->ring_rx);
}

/* Fails @c after a read that returned @n: 0 (the end) or -errno (not EAGAIN or EINTR). */
static void fail_read(struct tpd_conn *c, ssize_t n)
{
	if (n == 0 || n == -ECONNRESET) {
		/* A client that exits with frames still unread resets the connection: the same
		 * ordinary end as a clean close. Frames already in its ring still count. */
		if (c->ring)
			ring_pull(c);
		if (c->ops->ended_clean(c->owner))
			conn_fail(c, TPU_LOG_INFO, TPW__V1__STATUS__STATUS_CLOSED,
				  "client closed its context");
		else
			conn_fail(c, TPU_LOG_INFO, TPW__V1__STATUS__STATUS_PEER_DIED,
				  "client disconnected");
		return;
	}
	conn_fail(c, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
		  "receive failed: %s",
		  n == -EBADMSG ? "too many or truncated fds" : strerror((int)-n));
}

/* The socket of a ring session is readable: doorbells, fds, or the end. */
static void ring_on_read(struct tpd_conn *c)
{
	for (int i = 0; i < ROUNDS_PER_WAKEUP && !c->stopped; i++) {
		unsigned fds_before = c->n_fdq;
		ssize_t n = recv_side(c);

		if (n == -EAGAIN || n == -EINTR)
			break;
		if (n <= 0) {
			fail_read(c, n);
			return;
		}
		/* A read of a stream socket stops short only where the queue ran dry or after a
		 * message's fds: a short one without fds emptied it, so no second recvmsg just to
		 * hear EAGAIN (half of this socket's reads under load). Bytes or the end arriving
		 * after it make the socket readable again (level-triggered). */
		if (n < BELLS_PER_READ && c->n_fdq == fds_before)
			break;
	}
	tpd_conn_ring_poll(c);
	tpd_local_spin_kick(tpd_daemon_local(c->d));
}

static void conn_on_read(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_conn *c = arg;

	if (c->ring) {
		ring_on_read(c);
		return;
	}
	for (int i = 0; i < ROUNDS_PER_WAKEUP && !c->stopped; i++) {
		ssize_t n = recv_some(c);

		if (n == -EAGAIN || n == -EINTR)
			break;
		if (n <= 0) {
			fail_read(c, n);
			return;
		}
		parse_frames(c);
		if (c->ring) { /* switched by RingSetup: the rest of the socket is doorbells */
			ring_on_read(c);
			return;
		}
	}
	(void)fds_charge(c); /* the fds of a frame that has not arrived whole */
}

/* ---- life cycle ---------------------------------------------------------------------------- */

void tpd_conn_setup(struct tpd_conn *c, struct tpd_daemon *d, int fd,
		    const struct tpd_conn_ops *ops, void *owner)
{
	c->d = d;
	c->ops = ops;
	c->owner = owner;
	c->fd = fd;
	tpu_list_init(&c->outq);
}

int tpd_conn_start(struct tpd_conn *c, struct tpd_uid_acct *acct)
{
	struct event_base *base = tpd_daemon_base(c->d);
	int r;

	c->acct = acct;
	c->in_cap = IN_MIN_FREE;
	c->in = malloc(c->in_cap);
	c->ev_read = event_new(base, c->fd, EV_READ | EV_PERSIST, conn_on_read, c);
	c->ev_write = event_new(base, c->fd, EV_WRITE | EV_PERSIST, conn_on_write, c);
	if (!c->in || !c->ev_read || !c->ev_write)
		return -ENOMEM;
	r = tpu_fd_nonblock(c->fd);
	if (r < 0)
		return r;
	return event_add(c->ev_read, NULL) < 0 ? -EIO : 0;
}

void tpd_conn_stop(struct tpd_conn *c)
{
	c->stopped = true;
	if (c->ev_read)
		event_del(c->ev_read);
	if (c->ev_write)
		event_del(c->ev_write);
}

void tpd_conn_done(struct tpd_conn *c)
{
	while (!tpu_list_empty(&c->outq)) {
		struct outbuf *o = tpu_list_first(&c->outq, struct outbuf, node);
		tpu_list_remove(&o->node);
		outbuf_free(c, o);
	}
	if (c->acct) {
		tpd_quota_release_out(tpd_daemon_quota(c->d), c->acct, c->outq_bytes);
		tpd_quota_release_in(tpd_daemon_quota(c->d), c->acct, c->in_charged);
	}
	for (unsigned i = 0; i < c->n_fdq; i++)
		tpu_close(c->fdq[i]);
	c->n_fdq = 0;
	fds_uncharge(c, &c->fdq_charged, 0);
	if (c->ring_map)
		munmap(c->ring_map, tpu_ring_map_size(c->ring_size));
	c->ring_map = NULL;
	if (c->ev_read)
		event_free(c->ev_read);
	if (c->ev_write)
		event_free(c->ev_write);
	c->ev_read = c->ev_write = NULL;
	tpu_close(c->fd);
	c->fd = -EBADF;
	free(c->in);
	c->in = NULL;
}

int tpd_conn_flush(struct tpd_conn *c)
{
	return flush_out(c);
}

/* ---- what the session and tpipctl see ------------------------------------------------------ */

int tpd_conn_ring_attach(struct tpd_conn *c, int fd, uint32_t ring_bytes)
{
	int r = tpu_ring_attach(fd, ring_bytes, &c->ring_map);

	if (r < 0) {
		c->ring_map = NULL;
		return r;
	}
	c->ring_size = ring_bytes;
	tpu_ring_init(c->ring_map, c->ring_size, false, &c->ring_tx,
		      &c->ring_rx);
	return 0;
}

int tpd_conn_ring_switch(struct tpd_conn *c)
{
	if (!tpu_list_empty(&c->outq))
		return -EBUSY;
	c->ring = true; /* every later frame goes through the rings */
	return 0;
}

int tpd_conn_send_fd(struct tpd_conn *c, int fd)
{
	static const uint8_t bell;
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} cm = { 0 };
	struct iovec iov = { .iov_base = (void *)&bell, .iov_len = 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
			     .msg_controllen = sizeof(cm.b) };

	if (!c->ring || c->stopped)
		return -EOPNOTSUPP;
	cm.h.cmsg_level = SOL_SOCKET;
	cm.h.cmsg_type = SCM_RIGHTS;
	cm.h.cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(&cm.h), &fd, sizeof(int));
	if (sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
		return -errno;
	return 0;
}

bool tpd_conn_is_ring(const struct tpd_conn *c)
{
	return c->ring;
}

uint32_t tpd_conn_ring_bytes(const struct tpd_conn *c)
{
	return c->ring ? c->ring_size : 0;
}

void tpd_conn_bytes(const struct tpd_conn *c, uint64_t *ret_in, uint64_t *ret_out)
{
	*ret_in = c->bytes_in;
	*ret_out = c->bytes_out;
}
