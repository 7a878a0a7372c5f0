/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One session's connection: the Unix socket or, once the client set them up, the two shared
 * control rings. See conn.h. Reading: recvmsg into a growing input buffer (the part beyond the
 * base size charged to the uid's quota), fds into a FIFO, then every complete frame (its header
 * checked here, the fds it announced taken from the FIFO) goes to sessmsg.c, which unpacks,
 * validates and handles it; what messages mean
 * is not this file's business, nor who the client is or when the session ends (session.c).
 * Writing: frames are sent at once when the output queue is empty, else queued with EV_WRITE
 * interest. Any protocol violation fails the session; it is freed from its close event.
 *
 * With a control ring (RingSetup, the frame after Hello), the same byte stream goes through the
 * two shared rings instead: input is copied out of the client->daemon ring into the input
 * buffer (so a frame cannot change once validated), output is copied into the daemon->client
 * ring, and the socket only carries doorbell bytes (wake-ups of a sleeping side), fds (sent by
 * the client just before the frame that announces them is written to the ring) and the end of
 * the session. The spin loop polls busy rings between events (local.c).
 */
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
#include "session.h"
#include "sessmsg.h"

#define IN_MIN_FREE (64u << 10)
#define ROUNDS_PER_WAKEUP 16

struct outbuf {
	struct tpu_list node;
	size_t len;
	size_t off;
	uint8_t data[];
};

static void session_on_read(evutil_socket_t fd, short what, void *arg);
static void session_on_write(evutil_socket_t fd, short what, void *arg);
static int flush_out(struct tpd_session *s);
static void fail_output(struct tpd_session *s, int r);
static void ring_take_side(struct tpd_session *s);

/* ---- buffering ----------------------------------------------------------------------------- */


/*
 * Resizes the input buffer to @cap bytes, the part beyond the base buffer charged to the uid's
 * quota. Return: 0, -EDQUOT or -ENOBUFS (per-uid or daemon-wide budget, reason in @why), or
 * -ENOMEM.
 */
static int in_resize(struct tpd_session *s, size_t cap, char *why, size_t wl)
{
	size_t charge = cap > IN_MIN_FREE ? cap - IN_MIN_FREE : 0;
	uint8_t *nb;
	int r;

	if (charge > s->conn.in_charged) {
		r = tpd_quota_charge_in(tpd_daemon_quota(s->d), tpd_daemon_cfg(s->d), s->acct,
					charge - s->conn.in_charged, why, wl);
		if (r < 0)
			return r;
	}
	nb = realloc(s->conn.in, cap);
	if (!nb) {
		if (charge > s->conn.in_charged)
			tpd_quota_release_in(tpd_daemon_quota(s->d), s->acct,
					     charge - s->conn.in_charged);
		snprintf(why, wl, "out of memory for a %zu byte input buffer", cap);
		return -ENOMEM;
	}
	if (charge < s->conn.in_charged)
		tpd_quota_release_in(tpd_daemon_quota(s->d), s->acct, s->conn.in_charged - charge);
	s->conn.in_charged = charge;
	s->conn.in = nb;
	s->conn.in_cap = cap;
	return 0;
}

/* The log of a budget hit with @r (-EDQUOT per uid, -ENOBUFS daemon-wide), or NULL. */
static struct tpd_ratelog *budget_log(struct tpd_session *s, int r)
{
	if (r != -EDQUOT && r != -ENOBUFS)
		return NULL;
	return &tpd_daemon_quota(s->d)->budget_log[r == -ENOBUFS];
}

/* Fails @s whose input buffer could not grow (@r from in_resize()); budget hits are logged at
 * most once a second per kind: a client can provoke them at will. */
static void in_resize_failed(struct tpd_session *s, int r, const char *why)
{
	struct tpd_ratelog *rl = budget_log(s, r);
	unsigned suppressed = 0;

	if (!rl) {
		tpd_session_fail(s, TPU_LOG_ERR, TPW__V1__STATUS__STATUS_IO, "%s", why);
		return;
	}
	if (!tpd_quota_ratelog_ok(rl, 1000, &suppressed)) {
		tpd_session_fail(s, TPU_LOG_DEBUG, TPW__V1__STATUS__STATUS_LIMIT, "%s", why);
		return;
	}
	tpd_session_fail(s, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_LIMIT,
			 "%s (%u similar closes since the last such line)", why, suppressed);
}

/* ---- output -------------------------------------------------------------------------------- */

/* Wakes the client if it sleeps on the ring (one doorbell byte; a full socket already holds
 * doorbells, so EAGAIN is fine). */
static void ring_doorbell(struct tpd_session *s)
{
	static const uint8_t bell;

	(void)!send(s->conn.fd, &bell, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* flush_out() for a ring session. Return: 0 or -EPROTO (the client broke the ring). */
static int ring_flush_out(struct tpd_session *s)
{
	bool put = false;

	while (!tpu_list_empty(&s->conn.outq)) {
		struct outbuf *o = tpu_list_first(&s->conn.outq, struct outbuf, node);
		struct iovec iov = { o->data + o->off, o->len - o->off };
		ssize_t n = tpu_ring_put(&s->conn.ring_tx, &iov, 1, 0);
		uint32_t seq;

		if (n < 0)
			return (int)n;
		if (n == 0) {
			/* Full: the client rings the doorbell once it has made room. */
			if (!tpu_ring_wait_space_prepare(&s->conn.ring_tx, &seq))
				break;
			continue;
		}
		put = true;
		o->off += (size_t)n;
		s->conn.outq_bytes -= (uint64_t)n;
		tpd_quota_release_out(tpd_daemon_quota(s->d), s->acct, (uint64_t)n);
		s->conn.bytes_out += (uint64_t)n;
		if (o->off < o->len)
			continue;
		tpu_list_remove(&o->node);
		free(o);
	}
	if (put && tpu_ring_consumer_asleep(&s->conn.ring_tx))
		ring_doorbell(s);
	return 0;
}

/* Writes queued output. Return: 0 (all or some sent), -errno on a dead connection. */
static int flush_out(struct tpd_session *s)
{
	if (s->conn.ring)
		return ring_flush_out(s);
	while (!tpu_list_empty(&s->conn.outq)) {
		struct outbuf *o = tpu_list_first(&s->conn.outq, struct outbuf, node);
		ssize_t n = send(s->conn.fd, o->data + o->off, o->len - o->off,
				 MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				return 0;
			return -errno;
		}
		o->off += (size_t)n;
		s->conn.outq_bytes -= (uint64_t)n;
		tpd_quota_release_out(tpd_daemon_quota(s->d), s->acct, (uint64_t)n);
		s->conn.bytes_out += (uint64_t)n;
		if (o->off < o->len)
			return 0;
		tpu_list_remove(&o->node);
		free(o);
	}
	return 0;
}

static void update_write_interest(struct tpd_session *s)
{
	if (tpu_list_empty(&s->conn.outq) || s->conn.ring)
		event_del(s->conn.ev_write);
	else
		event_add(s->conn.ev_write, NULL);
}

static void fail_output(struct tpd_session *s, int r)
{
	if (r == -EPROTO)
		tpd_session_fail(s, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
				 "control ring corrupted by the client (impossible read position)");
	else if (s->ended_clean && (r == -EPIPE || r == -ECONNRESET))
		tpd_session_fail(s, TPU_LOG_INFO, TPW__V1__STATUS__STATUS_CLOSED,
				 "client closed its context");
	else
		tpd_session_fail(s, TPU_LOG_INFO, TPW__V1__STATUS__STATUS_PEER_DIED,
				 "send failed: %s", strerror(-r));
}

static void session_on_write(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_session *s = arg;
	int r = flush_out(s);

	if (r < 0) {
		fail_output(s, r);
		return;
	}
	update_write_interest(s);
}

/*
 * A ring session with nothing queued and room for the whole frame: pack it into the daemon's
 * scratch buffer (local.c) and copy it into the ring, with no allocation. Return: true if sent.
 */
static bool ring_send_direct(struct tpd_session *s, Tpw__V1__DaemonMsg *m,
			     const struct iovec *tail, int n_tail, size_t len, size_t tail_len)
{
	struct iovec iov[1 + TPD_SEND_TAIL_MAX];
	ssize_t space = tpu_ring_space(&s->conn.ring_tx), n;
	uint8_t *scratch;

	if (space < (ssize_t)len || n_tail > TPD_SEND_TAIL_MAX || !tpu_list_empty(&s->conn.outq))
		return false;
	scratch = tpd_local_scratch(tpd_daemon_local(s->d), len - tail_len);
	if (!scratch)
		return false;
	iov[0].iov_base = scratch;
	iov[0].iov_len = tpw_frame_pack(&m->base, (uint32_t)tail_len, 0, ++s->conn.seq_out,
					scratch);
	for (int i = 0; i < n_tail; i++)
		iov[1 + i] = tail[i];
	n = tpu_ring_put(&s->conn.ring_tx, iov, 1 + (size_t)n_tail, 0);
	if (n != (ssize_t)len) { /* cannot happen: we checked the room and we are the producer */
		fail_output(s, -EPROTO);
		return true;
	}
	s->conn.bytes_out += len;
	if (tpu_ring_consumer_asleep(&s->conn.ring_tx))
		ring_doorbell(s);
	return true;
}

int tpd_conn_send(struct tpd_session *s, Tpw__V1__DaemonMsg *m, const struct iovec *tail,
		  int n_tail)
{
	size_t tail_len = 0, len, off;
	struct outbuf *o;
	bool was_empty;
	char why[200];
	int r;

	if (!s || s->dead)
		return -EPIPE;
	for (int i = 0; i < n_tail; i++)
		tail_len += tail[i].iov_len;
	len = tpw_frame_size(&m->base) + tail_len;
	if (s->conn.outq_bytes + len > tpd_daemon_cfg(s->d)->outq_max) {
		tpd_session_fail(s, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
				 "client does not read: %llu bytes queued (limit %llu, tpipd "
				 "--client-queue-bytes)",
				 (unsigned long long)s->conn.outq_bytes,
				 (unsigned long long)tpd_daemon_cfg(s->d)->outq_max);
		return -ENOBUFS;
	}
	if (s->conn.ring && ring_send_direct(s, m, tail, n_tail, len, tail_len))
		return s->dead ? -EPROTO : 0;
	r = tpd_quota_charge_out(tpd_daemon_quota(s->d), tpd_daemon_cfg(s->d), s->acct, len, why,
				 sizeof(why));
	if (r < 0) {
		unsigned suppressed = 0;
		bool loud = tpd_quota_ratelog_ok(budget_log(s, r), 1000, &suppressed);

		tpd_session_fail(s, loud ? TPU_LOG_WARNING : TPU_LOG_DEBUG,
				 TPW__V1__STATUS__STATUS_PEER_DIED,
				 "client does not read: %s (%u similar closes since the last such "
				 "line)", why, suppressed);
		return r;
	}
	o = malloc(sizeof(*o) + len);
	if (!o) {
		tpd_quota_release_out(tpd_daemon_quota(s->d), s->acct, len);
		tpd_session_fail(s, TPU_LOG_ERR, TPW__V1__STATUS__STATUS_IO, "out of memory");
		return -ENOMEM;
	}
	off = tpw_frame_pack(&m->base, (uint32_t)tail_len, 0, ++s->conn.seq_out, o->data);
	for (int i = 0; i < n_tail; i++) {
		if (tail[i].iov_len) /* an empty piece may have no base: memcpy(_, NULL, 0) is UB */
			memcpy(o->data + off, tail[i].iov_base, tail[i].iov_len);
		off += tail[i].iov_len;
	}
	o->len = len;
	o->off = 0;
	was_empty = tpu_list_empty(&s->conn.outq);
	tpu_list_insert_tail(&s->conn.outq, &o->node);
	s->conn.outq_bytes += len;
	if (!was_empty)
		return 0;
	r = flush_out(s);
	if (r < 0) {
		fail_output(s, r);
		return r;
	}
	update_write_interest(s);
	return 0;
}

/* ---- input --------------------------------------------------------------------------------- */

/*
 * fds travel with the first bytes of the frame that announces them, so once every complete
 * frame is handled, the queue may only hold fds of the frame that starts the buffer.
 */
static void check_stray_fds(struct tpd_session *s)
{
	struct tpw_hdr h;
	unsigned allowed = 0;

	if (s->dead || !s->conn.n_fdq || s->conn.ring)
		return; /* ring: fds come ahead of their frames; the queue's size bounds them */
	if (s->conn.in_len > 0 && s->conn.in_len < TPW_HDR_SIZE)
		return; /* header not complete yet */
	if (s->conn.in_len >= TPW_HDR_SIZE &&
	    tpw_hdr_parse(s->conn.in, tpd_daemon_limits(s->d)->frame_max, &h) == 0)
		allowed = h.nfds;
	if (s->conn.n_fdq > allowed)
		tpd_session_fail(s, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
				 "%u fds received that no frame announced",
				 s->conn.n_fdq - allowed);
}

/* Largest frame @s may send now: small until its Hello. */
static uint32_t frame_limit(const struct tpd_session *s)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(s->d);
	uint32_t frame_max = tpd_daemon_limits(s->d)->frame_max;

	if (s->hello_done || cfg->hello_frame_max > frame_max)
		return frame_max;
	return cfg->hello_frame_max;
}

/* Gives back an input buffer grown for a large frame once it holds little again and the frame
 * it has begun (@pending bytes, 0 if none) is small. */
static void in_shrink(struct tpd_session *s, size_t pending)
{
	char why[200];

	if (s->dead || s->conn.in_cap <= 2 * IN_MIN_FREE || s->conn.in_len > IN_MIN_FREE / 2 ||
	    pending > IN_MIN_FREE / 2)
		return;
	(void)in_resize(s, IN_MIN_FREE, why, sizeof(why)); /* shrinking cannot fail the budget */
}

/*
 * Takes the fds frame @h announces out of @s's fd queue: the first into @ret_fd (owned by the
 * caller), the others closed (no message takes more than one). Return: 0, or -EBADMSG after
 * failing @s (fewer fds than announced).
 */
static int claim_fds(struct tpd_session *s, const struct tpw_hdr *h, int *ret_fd)
{
	struct tpd_conn *c = &s->conn;

	if (h->nfds > c->n_fdq && c->ring)
		ring_take_side(s); /* the client sent them before writing this frame */
	if (h->nfds > c->n_fdq) {
		tpd_session_fail(s, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
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
	}
	return 0;
}

/* Processes every complete frame in the input buffer. */
static void parse_frames(struct tpd_session *s)
{
	bool was_ring = s->conn.ring;
	size_t off = 0, pending = 0;

	while (!s->dead && s->conn.in_len - off >= TPW_HDR_SIZE) {
		struct tpw_hdr h;
		size_t need;
		int fd, r = tpw_hdr_parse(s->conn.in + off, frame_limit(s), &h);

		if (r < 0) {
			tpd_session_fail(s, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
					 "bad frame header: %s", strerror(-r));
			return;
		}
		need = TPW_HDR_SIZE + (size_t)h.msg_len + h.data_len;
		if (s->conn.in_len - off < need) {
			pending = need;
			if (need > s->conn.in_cap) {
				char why[200];

				if (off) { /* make room at the front first */
					memmove(s->conn.in, s->conn.in + off, s->conn.in_len - off);
					s->conn.in_len -= off;
					off = 0;
				}
				r = in_resize(s, need + IN_MIN_FREE, why, sizeof(why));
				if (r < 0) {
					in_resize_failed(s, r, why);
					return;
				}
			}
			break;
		}
		s->conn.bytes_in += need;
		if (claim_fds(s, &h, &fd) < 0 ||
		    tpd_sessmsg_handle(s, &h, s->conn.in + off + TPW_HDR_SIZE, fd) < 0)
			return;
		off += need;
		if (s->conn.ring && !was_ring) {
			/* Switched to the rings: whatever followed RingSetup on the socket can only
			 * be doorbell and fd bytes (the client waits for the answer). */
			off = s->conn.in_len;
			break;
		}
	}
	if (off) {
		memmove(s->conn.in, s->conn.in + off, s->conn.in_len - off);
		s->conn.in_len -= off;
	}
	in_shrink(s, pending);
	check_stray_fds(s);
}

/* Queues fds received with a recvmsg. Return: 0 or -EBADMSG (too many). */
static int take_fds(struct tpd_session *s, struct msghdr *mh)
{
	int r = 0;

	for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
		size_t n;
		int *fds;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		fds = (int *)CMSG_DATA(c);
		for (size_t i = 0; i < n; i++) {
			if (s->conn.n_fdq < TPU_ARRAY_SIZE(s->conn.fdq))
				s->conn.fdq[s->conn.n_fdq++] = fds[i];
			else {
				tpu_close(fds[i]);
				r = -EBADMSG;
			}
		}
	}
	return r;
}

/* Keeps room in the input buffer for the next read. Return: 0 or -ENOMEM. */
static int in_reserve(struct tpd_session *s)
{
	char why[200];
	int r;

	if (s->conn.in_cap - s->conn.in_len >= IN_MIN_FREE / 4)
		return 0;
	r = in_resize(s, s->conn.in_cap + IN_MIN_FREE, why, sizeof(why));
	if (r < 0)
		in_resize_failed(s, r, why);
	return r;
}

/* One recvmsg into @buf, fds into the queue. Return: bytes read, 0 on EOF, -EAGAIN, -errno. */
static ssize_t recv_msg(struct tpd_session *s, void *buf, size_t len)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * TPW_FDS_MAX * 2)];
		struct cmsghdr align;
	} cm;
	struct iovec iov = { buf, len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
			     .msg_controllen = sizeof(cm.buf) };
	ssize_t n;

	n = recvmsg(s->conn.fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n < 0)
		return -errno;
	if (take_fds(s, &mh) < 0 || (mh.msg_flags & MSG_CTRUNC))
		return -EBADMSG;
	return n;
}

/* One recvmsg into the input buffer. Return: bytes read, 0 on EOF, -EAGAIN, or -errno. */
static ssize_t recv_some(struct tpd_session *s)
{
	ssize_t n;

	if (in_reserve(s) < 0)
		return -ENOMEM;
	n = recv_msg(s, s->conn.in + s->conn.in_len, s->conn.in_cap - s->conn.in_len);
	if (n > 0)
		s->conn.in_len += (size_t)n;
	return n;
}

/* ---- control ring -------------------------------------------------------------------------- */

/* One read of a ring session's socket: doorbell bytes (dropped) and fds. Return: as recv_msg. */
static ssize_t recv_side(struct tpd_session *s)
{
	uint8_t bells[64];

	return recv_msg(s, bells, sizeof(bells));
}

/* Takes the fds waiting on the socket of ring session @s into its fd queue (a ring client sends
 * them before it writes the frame that announces them); doorbell bytes are dropped. Too many or
 * truncated fds fail @s. */
static void ring_take_side(struct tpd_session *s)
{
	for (int i = 0; i < ROUNDS_PER_WAKEUP; i++) {
		ssize_t n = recv_side(s);

		if (n == -EBADMSG)
			tpd_session_fail(s, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
					 "receive failed: too many or truncated fds");
		if (n <= 0)
			break;
	}
}

/* Copies what the client->daemon ring holds into the input buffer and handles its frames.
 * Return: true if bytes came. */
static bool ring_pull(struct tpd_session *s)
{
	struct tpd_conn *c = &s->conn;
	bool got = false;

	for (int i = 0; i < ROUNDS_PER_WAKEUP && !s->dead; i++) {
		ssize_t n;

		if (in_reserve(s) < 0) {
			tpd_session_fail(s, TPU_LOG_ERR, TPW__V1__STATUS__STATUS_IO,
					 "out of memory");
			break;
		}
		n = tpu_ring_get(&c->ring_rx, c->in + c->in_len, c->in_cap - c->in_len);
		if (n < 0)
			tpd_session_fail(s, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
					 "control ring corrupted by the client (impossible write "
					 "position)");
		if (n <= 0)
			break;
		got = true;
		c->in_len += (size_t)n;
		tpu_ring_producer_waiting(&c->ring_rx); /* wakes a client blocked on a full ring */
		parse_frames(s);
	}
	return got;
}

bool tpd_conn_ring_poll(struct tpd_session *s)
{
	uint64_t queued;
	bool moved;
	int r;

	if (!s->conn.ring || s->dead)
		return false;
	moved = ring_pull(s);
	if (tpu_list_empty(&s->conn.outq) || s->dead)
		return moved;
	queued = s->conn.outq_bytes;
	r = flush_out(s);
	if (r < 0)
		fail_output(s, r);
	return moved || s->conn.outq_bytes != queued;
}

bool tpd_conn_ring_sleep(struct tpd_session *s)
{
	return s->conn.ring && !s->dead && tpu_ring_sleep_prepare(&s->conn.ring_rx);
}

void tpd_conn_ring_wake(struct tpd_session *s)
{
	if (s->conn.ring && !s->dead)
		tpu_ring_sleep_cancel(&s->conn.ring_rx);
}

/* Fails @s after a read that returned @n: 0 (the end) or -errno (not EAGAIN or EINTR). */
static void fail_read(struct tpd_session *s, ssize_t n)
{
	if (n == 0 || n == -ECONNRESET) {
		/* A client that exits with frames still unread resets the connection: the same
		 * ordinary end as a clean close. Frames already in its ring still count. */
		if (s->conn.ring)
			ring_pull(s);
		if (s->ended_clean)
			tpd_session_fail(s, TPU_LOG_INFO, TPW__V1__STATUS__STATUS_CLOSED,
					 "client closed its context");
		else
			tpd_session_fail(s, TPU_LOG_INFO, TPW__V1__STATUS__STATUS_PEER_DIED,
					 "client disconnected");
		return;
	}
	tpd_session_fail(s, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
			 "receive failed: %s",
			 n == -EBADMSG ? "too many or truncated fds" : strerror((int)-n));
}

/* The socket of a ring session is readable: doorbells, fds, or the end. */
static void ring_on_read(struct tpd_session *s)
{
	for (int i = 0; i < ROUNDS_PER_WAKEUP && !s->dead; i++) {
		ssize_t n = recv_side(s);

		if (n == -EAGAIN || n == -EINTR)
			break;
		if (n <= 0) {
			fail_read(s, n);
			return;
		}
	}
	tpd_conn_ring_poll(s);
	tpd_local_spin_kick(tpd_daemon_local(s->d));
}

static void session_on_read(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_session *s = arg;

	if (s->conn.ring) {
		ring_on_read(s);
		return;
	}
	for (int i = 0; i < ROUNDS_PER_WAKEUP && !s->dead; i++) {
		ssize_t n = recv_some(s);

		if (n == -EAGAIN || n == -EINTR)
			return;
		if (n <= 0) {
			fail_read(s, n);
			return;
		}
		parse_frames(s);
		if (s->conn.ring) { /* switched by RingSetup: the rest of the socket is doorbells */
			ring_on_read(s);
			return;
		}
	}
}

/* ---- life cycle ---------------------------------------------------------------------------- */

void tpd_conn_setup(struct tpd_session *s, int fd)
{
	s->conn.fd = fd;
	tpu_list_init(&s->conn.outq);
}

int tpd_conn_start(struct tpd_session *s)
{
	struct event_base *base = tpd_daemon_base(s->d);
	int r;

	s->conn.in_cap = IN_MIN_FREE;
	s->conn.in = malloc(s->conn.in_cap);
	s->conn.ev_read = event_new(base, s->conn.fd, EV_READ | EV_PERSIST, session_on_read, s);
	s->conn.ev_write = event_new(base, s->conn.fd, EV_WRITE | EV_PERSIST, session_on_write, s);
	if (!s->conn.in || !s->conn.ev_read || !s->conn.ev_write)
		return -ENOMEM;
	r = tpu_fd_nonblock(s->conn.fd);
	if (r < 0)
		return r;
	return event_add(s->conn.ev_read, NULL) < 0 ? -EIO : 0;
}

void tpd_conn_stop(struct tpd_session *s)
{
	event_del(s->conn.ev_read);
	event_del(s->conn.ev_write);
}

void tpd_conn_done(struct tpd_session *s)
{
	while (!tpu_list_empty(&s->conn.outq)) {
		struct outbuf *o = tpu_list_first(&s->conn.outq, struct outbuf, node);
		tpu_list_remove(&o->node);
		free(o);
	}
	if (s->acct) {
		tpd_quota_release_out(tpd_daemon_quota(s->d), s->acct, s->conn.outq_bytes);
		tpd_quota_release_in(tpd_daemon_quota(s->d), s->acct, s->conn.in_charged);
	}
	for (unsigned i = 0; i < s->conn.n_fdq; i++)
		tpu_close(s->conn.fdq[i]);
	s->conn.n_fdq = 0;
	if (s->conn.ring_map)
		munmap(s->conn.ring_map, tpu_ring_map_size(s->conn.ring_size));
	s->conn.ring_map = NULL;
	if (s->conn.ev_read)
		event_free(s->conn.ev_read);
	if (s->conn.ev_write)
		event_free(s->conn.ev_write);
	s->conn.ev_read = s->conn.ev_write = NULL;
	tpu_close(s->conn.fd);
	s->conn.fd = -EBADF;
	free(s->conn.in);
	s->conn.in = NULL;
}

int tpd_conn_flush(struct tpd_session *s)
{
	return flush_out(s);
}

/* ---- what the session and tpipctl see ------------------------------------------------------ */

int tpd_conn_ring_attach(struct tpd_session *s, int fd, uint32_t ring_bytes)
{
	int r = tpu_ring_attach(fd, ring_bytes, &s->conn.ring_map);

	if (r < 0) {
		s->conn.ring_map = NULL;
		return r;
	}
	s->conn.ring_size = ring_bytes;
	tpu_ring_init(s->conn.ring_map, s->conn.ring_size, false, &s->conn.ring_tx,
		      &s->conn.ring_rx);
	return 0;
}

int tpd_conn_ring_switch(struct tpd_session *s)
{
	if (!tpu_list_empty(&s->conn.outq))
		return -EBUSY;
	s->conn.ring = true; /* every later frame goes through the rings */
	return 0;
}

bool tpd_conn_is_ring(const struct tpd_session *s)
{
	return s->conn.ring;
}

uint32_t tpd_conn_ring_bytes(const struct tpd_session *s)
{
	return s->conn.ring ? s->conn.ring_size : 0;
}

void tpd_conn_bytes(const struct tpd_session *s, uint64_t *ret_in, uint64_t *ret_out)
{
	*ret_in = s->conn.bytes_in;
	*ret_out = s->conn.bytes_out;
}
