/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One attached client's connection. See session.h. Reading: recvmsg into a growing input buffer,
 * fds into a FIFO, then every complete frame (its header checked here) goes to sessmsg.c, which
 * unpacks, validates and handles it; what messages mean is not this file's business. Writing:
 * frames are sent at once when the output queue is empty, else queued with EV_WRITE interest.
 * Any protocol violation fails the session; it is freed from its close event.
 *
 * With a control ring (RingSetup, the frame after Hello), the same byte stream goes through the
 * two shared rings instead: input is copied out of the client->daemon ring into the input
 * buffer (so a frame cannot change once validated), output is copied into the daemon->client
 * ring, and the socket only carries doorbell bytes (wake-ups of a sleeping side), fds (sent by
 * the client just before the frame that announces them is written to the ring) and the end of
 * the session. The daemon's spin loop polls busy rings between events (daemon.c).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include "devmem.h"
#include "daemon.h"
#include "rdma/rdma.h"
#include "frame.h"
#include "log.h"
#include "pipe.h"
#include "quota.h"
#include "session.h"
#include "sessmsg.h"
#include "validate.h"

#define IN_MIN_FREE (64u << 10)
#define TPD_GROUPS_MAX 65536u /* the kernel's NGROUPS_MAX */
#define ROUNDS_PER_WAKEUP 16

struct outbuf {
	struct tpu_list node;
	size_t len;
	size_t off;
	uint8_t data[];
};

static void session_on_read(evutil_socket_t fd, short what, void *arg);
static void session_on_write(evutil_socket_t fd, short what, void *arg);
static void session_on_close(evutil_socket_t fd, short what, void *arg);
static void session_on_hello_timeout(evutil_socket_t fd, short what, void *arg);
static int flush_out(struct tpd_session *s);
static void fail_output(struct tpd_session *s, int r);

/* ---- credentials --------------------------------------------------------------------------- */

static void read_comm(struct tpd_session *s)
{
	_cleanup_close_ int fd = tpb_proc_openat(s->proc, "comm");
	ssize_t n;

	snprintf(s->comm, sizeof(s->comm), "?");
	if (fd < 0)
		return;
	n = read(fd, s->comm, sizeof(s->comm) - 1);
	if (n <= 0) {
		snprintf(s->comm, sizeof(s->comm), "?");
		return;
	}
	s->comm[n] = '\0';
	s->comm[strcspn(s->comm, "\n")] = '\0';
}

/* Supplementary groups the peer had when it connected, for group access checks. */
static int read_groups(struct tpd_session *s)
{
	socklen_t len = 64 * sizeof(gid_t);

	for (;;) {
		gid_t *g = realloc(s->groups, len ? len : sizeof(gid_t));
		socklen_t got = len;

		if (!g)
			return -ENOMEM;
		s->groups = g;
		if (getsockopt(s->fd, SOL_SOCKET, SO_PEERGROUPS, g, &got) == 0) {
			s->n_groups = got / sizeof(gid_t);
			return 0;
		}
		/* The kernel says how much it needs; anything past the kernel's own maximum
		 * (NGROUPS_MAX) is not a group list. */
		if (errno != ERANGE || got <= len || got > TPD_GROUPS_MAX * sizeof(gid_t))
			return errno == ERANGE ? -E2BIG : -errno;
		len = got;
	}
}

static int read_creds(struct tpd_session *s)
{
	struct ucred uc;
	socklen_t len = sizeof(uc);
	char why[160];
	int r;

	if (getsockopt(s->fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0)
		return -errno;
	s->pid = uc.pid;
	s->uid = uc.uid;
	s->gid = uc.gid;
	r = read_groups(s);
	if (r < 0) {
		tpd_session_log(s, TPU_LOG_WARNING, "cannot read the peer's groups: %s",
				strerror(-r));
		return r;
	}
	r = tpb_proc_pin(s->fd, uc.pid, uc.uid, uc.gid, s->id, &s->proc, why, sizeof(why));
	read_comm(s);
	if (r < 0) {
		s->proc = NULL;
		tpd_session_log(s, TPU_LOG_INFO, "cannot pin the client process (%s): no CMA",
				why);
	}
	return 0;
}

void tpd_session_log(const struct tpd_session *s, int level, const char *fmt, ...)
{
	char sid[48], pid[48], uid[48], msg[900];
	const char *fields[] = { sid, pid, uid, NULL };
	va_list ap;

	if (level > (int)tpu_log_get_level())
		return;
	snprintf(sid, sizeof(sid), "TPIPD_SESSION=%llu", (unsigned long long)s->id);
	snprintf(pid, sizeof(pid), "TPIPD_CLIENT_PID=%d", (int)s->pid);
	snprintf(uid, sizeof(uid), "TPIPD_CLIENT_UID=%u", (unsigned)s->uid);
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	tpu_log_kv((enum tpu_log_level)level, fields, "session %llu (pid %d, %s): %s",
		   (unsigned long long)s->id, (int)s->pid, s->comm, msg);
}

/* ---- admission ----------------------------------------------------------------------------- */

/* Tells a refused client why, as the answer to the Hello it is about to send: one small frame
 * into an empty socket buffer, then the connection closes. */
static void send_refusal(struct tpd_session *s, const char *why)
{
	Tpw__V1__HelloReply hr = TPW__V1__HELLO_REPLY__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	uint8_t buf[1024];

	hr.major = TPW_PROTO_MAJOR;
	hr.minor = TPW_PROTO_MINOR;
	hr.daemon_version = TP_VERSION;
	hr.status = TPW__V1__STATUS__STATUS_LIMIT;
	hr.message = (char *)why;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY;
	dm.hello_reply = &hr;
	if (tpw_frame_size(&dm.base) > sizeof(buf))
		return;
	(void)!send(s->fd, buf, tpw_frame_pack(&dm.base, 0, 0, 1, buf),
		    MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* Session quotas (quota.c). Return: 0, or -ENOBUFS once the client was told why (logged at
 * most once a second: anyone can connect in a loop). */
static int session_admit(struct tpd_session *s)
{
	struct tpd_daemon *d = s->d;
	bool admin = tpd_quota_is_admin(d, s->uid, s->gid, s->groups, s->n_groups);
	unsigned suppressed;
	char why[200];
	int r;

	r = tpd_quota_admit(d, s->uid, admin, d->n_sessions - 1, &s->acct, why, sizeof(why));
	if (r == 0)
		return 0;
	send_refusal(s, why);
	if (tpd_quota_ratelog_ok(&d->quota.refuse_log, 1000, &suppressed))
		tpd_session_log(s, TPU_LOG_WARNING, "refused, uid %u: %s (%u more refused since "
				"the last such line)", (unsigned)s->uid, why, suppressed);
	return r;
}

static void session_on_hello_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_session *s = arg;

	if (!s->hello_done)
		tpd_session_fail(s, TPU_LOG_NOTICE, TPW__V1__STATUS__STATUS_TIMEOUT,
				 "no Hello within %u ms", s->d->cfg.hello_timeout_ms);
}

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

	if (charge > s->in_charged) {
		r = tpd_quota_charge_in(s->d, s->acct, charge - s->in_charged, why, wl);
		if (r < 0)
			return r;
	}
	nb = realloc(s->in, cap);
	if (!nb) {
		if (charge > s->in_charged)
			tpd_quota_release_in(s->d, s->acct, charge - s->in_charged);
		snprintf(why, wl, "out of memory for a %zu byte input buffer", cap);
		return -ENOMEM;
	}
	if (charge < s->in_charged)
		tpd_quota_release_in(s->d, s->acct, s->in_charged - charge);
	s->in_charged = charge;
	s->in = nb;
	s->in_cap = cap;
	return 0;
}

/* The log of a budget hit with @r (-EDQUOT per uid, -ENOBUFS daemon-wide), or NULL. */
static struct tpd_ratelog *budget_log(struct tpd_session *s, int r)
{
	if (r != -EDQUOT && r != -ENOBUFS)
		return NULL;
	return &s->d->quota.budget_log[r == -ENOBUFS];
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

/* ---- life cycle ---------------------------------------------------------------------------- */

int tpd_session_new(struct tpd_daemon *d, int fd, struct tpd_session **ret)
{
	struct tpd_session *s = calloc(1, sizeof(*s));
	struct timeval hello_tv = { (time_t)(d->cfg.hello_timeout_ms / 1000),
				    (suseconds_t)(d->cfg.hello_timeout_ms % 1000) * 1000 };
	int r;

	if (!s) {
		tpu_close(fd);
		return -ENOMEM;
	}
	s->d = d;
	s->fd = fd;
	s->id = d->next_session_id++;
	s->attached_ns = tpu_now_ns();
	tpu_list_init(&s->outq);
	tpu_list_init(&s->listeners);
	tpu_hmap_init(&s->pipes);
	tpu_hmap_init(&s->buffers);
	s->next_accept_id = 1;
	tpu_list_insert_tail(&d->sessions, &s->node);
	d->n_sessions++;
	r = read_creds(s);
	if (r < 0)
		goto fail;
	r = session_admit(s);
	if (r < 0) {
		tpd_session_free(s, TPW__V1__STATUS__STATUS_LIMIT);
		return r;
	}
	s->in_cap = IN_MIN_FREE;
	s->in = malloc(s->in_cap);
	s->ev_read = event_new(d->base, fd, EV_READ | EV_PERSIST, session_on_read, s);
	s->ev_write = event_new(d->base, fd, EV_WRITE | EV_PERSIST, session_on_write, s);
	s->ev_close = event_new(d->base, -1, 0, session_on_close, s);
	s->ev_hello = evtimer_new(d->base, session_on_hello_timeout, s);
	r = -ENOMEM;
	if (!s->in || !s->ev_read || !s->ev_write || !s->ev_close || !s->ev_hello)
		goto fail;
	r = tpu_fd_nonblock(fd);
	event_base_update_cache_time(d->base); /* the hello deadline runs from now */
	if (r < 0 || event_add(s->ev_read, NULL) < 0 || evtimer_add(s->ev_hello, &hello_tv) < 0)
		goto fail;
	tpd_session_log(s, TPU_LOG_INFO, "attached, uid %u", (unsigned)s->uid);
	*ret = s;
	return 0;
fail:
	tpd_session_log(s, TPU_LOG_WARNING, "cannot attach: %s", strerror(-r));
	tpd_session_free(s, TPW__V1__STATUS__STATUS_IO);
	return r;
}

static void detach_pipes(struct tpd_session *s, Tpw__V1__Status why)
{
	size_t n = s->pipes.len, i = 0, k = 0;
	struct tpd_pipe_end **ends = calloc(n + 1, sizeof(*ends));
	uint64_t key;
	void *val;

	/* Detaching may send to other sessions but never touches this table. */
	while (ends && tpu_hmap_next(&s->pipes, &i, &key, &val))
		ends[k++] = val;
	for (i = 0; i < k; i++)
		tpd_pipe_end_detach(ends[i], why);
	free(ends);
	tpu_hmap_done(&s->pipes);
}

static void release_buffers(struct tpd_session *s)
{
	size_t i = 0;
	uint64_t key;
	void *val;

	while (tpu_hmap_next(&s->buffers, &i, &key, &val)) {
		tpb_rdma_forget_buffer(tpd_daemon_rdma(s->d), val);
		tpd_buffer_unref(val);
	}
	tpu_hmap_done(&s->buffers);
	if (s->acct)
		s->acct->buffer_bytes -= s->buffer_bytes;
	s->buffer_bytes = 0;
}

void tpd_session_free(struct tpd_session *s, Tpw__V1__Status why)
{
	struct tpd_listener *l, *tmp;

	if (!s)
		return;
	if (!s->dead && why == TPW__V1__STATUS__STATUS_SHUTDOWN)
		flush_out(s); /* last replies and PipeClosed, best effort */
	s->dead = true;
	detach_pipes(s, why);
	tpu_list_for_each_safe(l, tmp, &s->listeners, session_node)
		tpd_listener_registry_remove(&s->d->registry, l);
	release_buffers(s);
	tpd_devmem_session_end(s);
	while (!tpu_list_empty(&s->outq)) {
		struct outbuf *o = tpu_list_first(&s->outq, struct outbuf, node);
		tpu_list_remove(&o->node);
		free(o);
	}
	if (s->acct) {
		tpd_quota_release_out(s->d, s->acct, s->outq_bytes);
		tpd_quota_release_in(s->d, s->acct, s->in_charged);
		tpd_quota_leave(s->d, s->acct);
	}
	for (unsigned i = 0; i < s->n_fdq; i++)
		tpu_close(s->fdq[i]);
	if (s->ring_map)
		munmap(s->ring_map, tpu_ring_map_size(s->ring_size));
	if (s->ev_read)
		event_free(s->ev_read);
	if (s->ev_write)
		event_free(s->ev_write);
	if (s->ev_close)
		event_free(s->ev_close);
	if (s->ev_hello)
		event_free(s->ev_hello);
	tpu_close(s->fd);
	tpu_list_remove(&s->node);
	s->d->n_sessions--;
	free(s->in);
	free(s->groups);
	free(s->name);
	tpb_proc_unref(s->proc);
	free(s);
}

static void session_on_close(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_session *s = arg;

	tpd_session_free(s, s->dead_status);
}

void tpd_session_fail(struct tpd_session *s, int level, Tpw__V1__Status status, const char *fmt,
		      ...)
{
	char msg[512];
	va_list ap;

	if (s->dead)
		return;
	s->dead = true;
	s->dead_status = status;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	tpd_session_log(s, level, "%s, closing", msg);
	event_del(s->ev_read);
	event_del(s->ev_write);
	event_active(s->ev_close, 0, 0);
}

void tpd_session_end(struct tpd_session *s, int level, Tpw__V1__Status status, const char *msg)
{
	Tpw__V1__SessionEnd se = TPW__V1__SESSION_END__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;

	if (s->dead)
		return;
	if (s->role == TPW__V1__ROLE__ROLE_CLIENT && s->client_minor >= TPW_MINOR_SESSION_END) {
		se.status = status;
		se.message = (char *)msg;
		dm.body_case = TPW__V1__DAEMON_MSG__BODY_SESSION_END;
		dm.session_end = &se;
		if (tpd_session_send(s, &dm, NULL, 0) == 0)
			(void)flush_out(s);
	}
	tpd_session_fail(s, level, status, "%s", msg);
}

bool tpd_session_cma(const struct tpd_session *s)
{
	return s->cma_ok && !tpb_proc_cma_off(s->proc);
}

bool tpd_session_cma_revoked(const struct tpd_session *s)
{
	return s->cma_ok && tpb_proc_cma_off(s->proc);
}

unsigned tpd_session_pipe_count(const struct tpd_session *s)
{
	return (unsigned)s->pipes.len;
}

/* ---- output -------------------------------------------------------------------------------- */

/* Wakes the client if it sleeps on the ring (one doorbell byte; a full socket already holds
 * doorbells, so EAGAIN is fine). */
static void ring_doorbell(struct tpd_session *s)
{
	static const uint8_t bell;

	(void)!send(s->fd, &bell, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* flush_out() for a ring session. Return: 0 or -EPROTO (the client broke the ring). */
static int ring_flush_out(struct tpd_session *s)
{
	bool put = false;

	while (!tpu_list_empty(&s->outq)) {
		struct outbuf *o = tpu_list_first(&s->outq, struct outbuf, node);
		struct iovec iov = { o->data + o->off, o->len - o->off };
		ssize_t n = tpu_ring_put(&s->ring_tx, &iov, 1, 0);
		uint32_t seq;

		if (n < 0)
			return (int)n;
		if (n == 0) {
			/* Full: the client rings the doorbell once it has made room. */
			if (!tpu_ring_wait_space_prepare(&s->ring_tx, &seq))
				break;
			continue;
		}
		put = true;
		o->off += (size_t)n;
		s->outq_bytes -= (uint64_t)n;
		tpd_quota_release_out(s->d, s->acct, (uint64_t)n);
		s->bytes_out += (uint64_t)n;
		if (o->off < o->len)
			continue;
		tpu_list_remove(&o->node);
		free(o);
	}
	if (put && tpu_ring_consumer_asleep(&s->ring_tx))
		ring_doorbell(s);
	return 0;
}

/* Writes queued output. Return: 0 (all or some sent), -errno on a dead connection. */
static int flush_out(struct tpd_session *s)
{
	if (s->ring)
		return ring_flush_out(s);
	while (!tpu_list_empty(&s->outq)) {
		struct outbuf *o = tpu_list_first(&s->outq, struct outbuf, node);
		ssize_t n = send(s->fd, o->data + o->off, o->len - o->off,
				 MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				return 0;
			return -errno;
		}
		o->off += (size_t)n;
		s->outq_bytes -= (uint64_t)n;
		tpd_quota_release_out(s->d, s->acct, (uint64_t)n);
		s->bytes_out += (uint64_t)n;
		if (o->off < o->len)
			return 0;
		tpu_list_remove(&o->node);
		free(o);
	}
	return 0;
}

static void update_write_interest(struct tpd_session *s)
{
	if (tpu_list_empty(&s->outq) || s->ring)
		event_del(s->ev_write);
	else
		event_add(s->ev_write, NULL);
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
 * scratch buffer and copy it into the ring, with no allocation. Return: true if sent.
 */
static bool ring_send_direct(struct tpd_session *s, Tpw__V1__DaemonMsg *m,
			     const struct iovec *tail, int n_tail, size_t len, size_t tail_len)
{
	struct tpd_daemon *d = s->d;
	struct iovec iov[1 + TPD_SEND_TAIL_MAX];
	ssize_t space = tpu_ring_space(&s->ring_tx), n;

	if (space < (ssize_t)len || n_tail > TPD_SEND_TAIL_MAX || !tpu_list_empty(&s->outq))
		return false;
	if (len - tail_len > d->scratch_cap) {
		uint8_t *nb = realloc(d->scratch, len - tail_len);

		if (!nb)
			return false;
		d->scratch = nb;
		d->scratch_cap = len - tail_len;
	}
	iov[0].iov_base = d->scratch;
	iov[0].iov_len = tpw_frame_pack(&m->base, (uint32_t)tail_len, 0, ++s->seq_out, d->scratch);
	for (int i = 0; i < n_tail; i++)
		iov[1 + i] = tail[i];
	n = tpu_ring_put(&s->ring_tx, iov, 1 + (size_t)n_tail, 0);
	if (n != (ssize_t)len) { /* cannot happen: we checked the room and we are the producer */
		fail_output(s, -EPROTO);
		return true;
	}
	s->bytes_out += len;
	if (tpu_ring_consumer_asleep(&s->ring_tx))
		ring_doorbell(s);
	return true;
}

int tpd_session_send(struct tpd_session *s, Tpw__V1__DaemonMsg *m, const struct iovec *tail,
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
	if (s->outq_bytes + len > s->d->cfg.outq_max) {
		tpd_session_fail(s, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
				 "client does not read: %llu bytes queued (limit %llu, tpipd "
				 "--client-queue-bytes)",
				 (unsigned long long)s->outq_bytes,
				 (unsigned long long)s->d->cfg.outq_max);
		return -ENOBUFS;
	}
	if (s->ring && ring_send_direct(s, m, tail, n_tail, len, tail_len))
		return s->dead ? -EPROTO : 0;
	r = tpd_quota_charge_out(s->d, s->acct, len, why, sizeof(why));
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
		tpd_quota_release_out(s->d, s->acct, len);
		tpd_session_fail(s, TPU_LOG_ERR, TPW__V1__STATUS__STATUS_IO, "out of memory");
		return -ENOMEM;
	}
	off = tpw_frame_pack(&m->base, (uint32_t)tail_len, 0, ++s->seq_out, o->data);
	for (int i = 0; i < n_tail; i++) {
		if (tail[i].iov_len) /* an empty piece may have no base: memcpy(_, NULL, 0) is UB */
			memcpy(o->data + off, tail[i].iov_base, tail[i].iov_len);
		off += tail[i].iov_len;
	}
	o->len = len;
	o->off = 0;
	was_empty = tpu_list_empty(&s->outq);
	tpu_list_insert_tail(&s->outq, &o->node);
	s->outq_bytes += len;
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

void tpd_session_reply(struct tpd_session *s, uint64_t req_id, int err, const char *why, uint64_t id,
		       const char *remote_name)
{
	Tpw__V1__Reply rep = TPW__V1__REPLY__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;

	rep.req_id = req_id;
	rep.status = tpw_status_from_errno(err);
	rep.message = (char *)why;
	rep.id = id;
	rep.remote_name = (char *)remote_name;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_REPLY;
	dm.reply = &rep;
	tpd_session_send(s, &dm, NULL, 0);
}

struct tpd_buffer *tpd_session_buffer(struct tpd_session *s, uint64_t id, uint64_t gen)
{
	struct tpd_buffer *b = tpu_hmap_get(&s->buffers, id);

	return b && b->gen == gen ? b : NULL;
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

	if (s->dead || !s->n_fdq || s->ring)
		return; /* ring: fds come ahead of their frames; the queue's size bounds them */
	if (s->in_len > 0 && s->in_len < TPW_HDR_SIZE)
		return; /* header not complete yet */
	if (s->in_len >= TPW_HDR_SIZE && tpw_hdr_parse(s->in, s->d->limits.frame_max, &h) == 0)
		allowed = h.nfds;
	if (s->n_fdq > allowed)
		tpd_session_fail(s, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
				 "%u fds received that no frame announced", s->n_fdq - allowed);
}

/* Largest frame @s may send now: small until its Hello. */
static uint32_t frame_limit(const struct tpd_session *s)
{
	const struct tpd_daemon *d = s->d;

	if (s->hello_done || d->cfg.hello_frame_max > d->limits.frame_max)
		return d->limits.frame_max;
	return d->cfg.hello_frame_max;
}

/* Gives back an input buffer grown for a large frame once it holds little again and the frame
 * it has begun (@pending bytes, 0 if none) is small. */
static void in_shrink(struct tpd_session *s, size_t pending)
{
	char why[200];

	if (s->dead || s->in_cap <= 2 * IN_MIN_FREE || s->in_len > IN_MIN_FREE / 2 ||
	    pending > IN_MIN_FREE / 2)
		return;
	(void)in_resize(s, IN_MIN_FREE, why, sizeof(why)); /* shrinking cannot fail the budget */
}

/* Processes every complete frame in the input buffer. */
static void parse_frames(struct tpd_session *s)
{
	bool was_ring = s->ring;
	size_t off = 0, pending = 0;

	while (!s->dead && s->in_len - off >= TPW_HDR_SIZE) {
		struct tpw_hdr h;
		size_t need;
		int r = tpw_hdr_parse(s->in + off, frame_limit(s), &h);

		if (r < 0) {
			tpd_session_fail(s, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
					 "bad frame header: %s", strerror(-r));
			return;
		}
		need = TPW_HDR_SIZE + (size_t)h.msg_len + h.data_len;
		if (s->in_len - off < need) {
			pending = need;
			if (need > s->in_cap) {
				char why[200];

				if (off) { /* make room at the front first */
					memmove(s->in, s->in + off, s->in_len - off);
					s->in_len -= off;
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
		s->bytes_in += need;
		if (tpd_sessmsg_handle(s, &h, s->in + off + TPW_HDR_SIZE) < 0)
			return;
		off += need;
		if (s->ring && !was_ring) {
			/* Switched to the rings: whatever followed RingSetup on the socket can only
			 * be doorbell and fd bytes (the client waits for the answer). */
			off = s->in_len;
			break;
		}
	}
	if (off) {
		memmove(s->in, s->in + off, s->in_len - off);
		s->in_len -= off;
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
			if (s->n_fdq < TPU_ARRAY_SIZE(s->fdq))
				s->fdq[s->n_fdq++] = fds[i];
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

	if (s->in_cap - s->in_len >= IN_MIN_FREE / 4)
		return 0;
	r = in_resize(s, s->in_cap + IN_MIN_FREE, why, sizeof(why));
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

	n = recvmsg(s->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
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
	n = recv_msg(s, s->in + s->in_len, s->in_cap - s->in_len);
	if (n > 0)
		s->in_len += (size_t)n;
	return n;
}

/* ---- control ring -------------------------------------------------------------------------- */

/* One read of a ring session's socket: doorbell bytes (dropped) and fds. Return: as recv_msg. */
static ssize_t recv_side(struct tpd_session *s)
{
	uint8_t bells[64];

	return recv_msg(s, bells, sizeof(bells));
}

void tpd_session_ring_take_side(struct tpd_session *s)
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
	bool got = false;

	for (int i = 0; i < ROUNDS_PER_WAKEUP && !s->dead; i++) {
		ssize_t n;

		if (in_reserve(s) < 0) {
			tpd_session_fail(s, TPU_LOG_ERR, TPW__V1__STATUS__STATUS_IO, "out of memory");
			break;
		}
		n = tpu_ring_get(&s->ring_rx, s->in + s->in_len, s->in_cap - s->in_len);
		if (n < 0)
			tpd_session_fail(s, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
					 "control ring corrupted by the client (impossible write "
					 "position)");
		if (n <= 0)
			break;
		got = true;
		s->in_len += (size_t)n;
		tpu_ring_producer_waiting(&s->ring_rx); /* wakes a client blocked on a full ring */
		parse_frames(s);
	}
	return got;
}

bool tpd_session_ring_poll(struct tpd_session *s)
{
	uint64_t queued;
	bool moved;
	int r;

	if (!s->ring || s->dead)
		return false;
	moved = ring_pull(s);
	if (tpu_list_empty(&s->outq) || s->dead)
		return moved;
	queued = s->outq_bytes;
	r = flush_out(s);
	if (r < 0)
		fail_output(s, r);
	return moved || s->outq_bytes != queued;
}

bool tpd_session_ring_sleep(struct tpd_session *s)
{
	return s->ring && !s->dead && tpu_ring_sleep_prepare(&s->ring_rx);
}

void tpd_session_ring_wake(struct tpd_session *s)
{
	if (s->ring && !s->dead)
		tpu_ring_sleep_cancel(&s->ring_rx);
}

/* Fails @s after a read that returned @n: 0 (the end) or -errno (not EAGAIN or EINTR). */
static void fail_read(struct tpd_session *s, ssize_t n)
{
	if (n == 0 || n == -ECONNRESET) {
		/* A client that exits with frames still unread resets the connection: the same
		 * ordinary end as a clean close. Frames already in its ring still count. */
		if (s->ring)
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
	tpd_session_ring_poll(s);
	tpd_daemon_spin_kick(s->d);
}

static void session_on_read(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_session *s = arg;

	if (s->ring) {
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
		if (s->ring) { /* switched by RingSetup: the rest of the socket is doorbells */
			ring_on_read(s);
			return;
		}
	}
}
