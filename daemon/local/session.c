/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One attached client. See session.h. Its identity (SO_PEERCRED, SO_PEERGROUPS, the pinned
 * process and its comm), its admission against the session quotas, the Hello deadline and its
 * life cycle: a failed session is marked dead and freed from its close event, never in the
 * middle of a handler. Reading and writing frames, on the socket or the control rings, is
 * conn.c's; what frames mean is sessmsg.c's.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include "conn.h"
#include "devmem.h"
#include "core.h"
#include "rdma/rdma.h"
#include "frame.h"
#include "local.h"
#include "log.h"
#include "quota.h"
#include "session.h"
#include "sessmsg.h"

#define TPD_GROUPS_MAX 65536u /* the kernel's NGROUPS_MAX */

static void session_on_close(evutil_socket_t fd, short what, void *arg);
static void session_on_hello_timeout(evutil_socket_t fd, short what, void *arg);

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
		if (getsockopt(s->conn.fd, SOL_SOCKET, SO_PEERGROUPS, g, &got) == 0) {
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

	if (getsockopt(s->conn.fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0)
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
	r = tpb_proc_pin(s->conn.fd, uc.pid, uc.uid, uc.gid, s->id, &s->proc, why, sizeof(why));
	read_comm(s);
	if (r < 0) {
		s->proc = NULL;
		tpd_session_log(s, TPU_LOG_INFO, "cannot pin the client process (%s): no CMA",
				why);
	}
	return 0;
}

/* Guards the quota's session_log: lines about sessions are written on the daemon's loop, and
 * a few from other threads. */
static pthread_mutex_t session_log_lock = PTHREAD_MUTEX_INITIALIZER;

bool tpd_session_log_ok(struct tpd_daemon *d, const char *key, unsigned *ret_held)
{
	bool ok;

	pthread_mutex_lock(&session_log_lock);
	ok = tpd_quota_ratelog_key_ok(&tpd_daemon_quota(d)->session_log, key, strlen(key),
				      TPD_SESSION_LOG_BURST, TPD_SESSION_LOG_ALL_BURST,
				      TPD_SESSION_LOG_WINDOW_MS, ret_held);
	pthread_mutex_unlock(&session_log_lock);
	return ok;
}

void tpd_session_log(const struct tpd_session *s, int level, const char *fmt, ...)
{
	char sid[48], pid[48], uid[48], msg[900], held_note[96] = "";
	const char *fields[] = { sid, pid, uid, NULL };
	unsigned held = 0;
	va_list ap;

	if (level > (int)tpu_log_get_level())
		return;
	if (level > TPU_LOG_ERR) { /* what the client provokes, within its uid's budget */
		snprintf(uid, sizeof(uid), "%u", (unsigned)s->uid);
		if (!tpd_session_log_ok(s->d, uid, &held))
			return;
		if (held)
			snprintf(held_note, sizeof(held_note),
				 " (%u lines about sessions of uid %u "
				 "not logged before this one)",
				 held, (unsigned)s->uid);
	}
	snprintf(sid, sizeof(sid), "TPIPD_SESSION=%llu", (unsigned long long)s->id);
	snprintf(pid, sizeof(pid), "TPIPD_CLIENT_PID=%d", (int)s->pid);
	snprintf(uid, sizeof(uid), "TPIPD_CLIENT_UID=%u", (unsigned)s->uid);
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	tpu_log_kv((enum tpu_log_level)level, fields, "session %llu (pid %d, %s): %s%s",
		   (unsigned long long)s->id, (int)s->pid, s->comm, msg, held_note);
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
	(void)!send(s->conn.fd, buf, tpw_frame_pack(&dm.base, 0, 0, 1, buf),
		    MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* Session quotas (quota.c). Return: 0, or -ENOBUFS once the client was told why (logged at
 * most once a second: anyone can connect in a loop). */
static int session_admit(struct tpd_session *s)
{
	struct tpd_daemon *d = s->d;
	bool admin = tpd_quota_is_admin(tpd_daemon_cfg(d), s->uid, s->gid, s->groups, s->n_groups);
	unsigned others = tpd_local_session_count(tpd_daemon_local(d)) - 1;
	unsigned suppressed;
	char why[200];
	int r;

	r = tpd_quota_admit(tpd_daemon_quota(d), tpd_daemon_cfg(d), s->uid, admin, others, &s->acct,
			    why, sizeof(why));
	if (r == 0)
		return 0;
	send_refusal(s, why);
	/* a line a second for each uid, 8 for all (a user refused at will hides no other's) */
	if (tpd_quota_ratelog_uid_ok(&tpd_daemon_quota(d)->refuse_log, s->uid, 1, 8, 1000,
				     &suppressed))
		tpd_session_log(s, TPU_LOG_WARNING, "refused, uid %u: %s (%u more of this uid "
				"refused since its last such line)", (unsigned)s->uid, why,
				suppressed);
	return r;
}

static void session_on_hello_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_session *s = arg;

	if (!s->hello_done)
		tpd_session_fail(s, TPU_LOG_NOTICE, TPW__V1__STATUS__STATUS_TIMEOUT,
				 "no Hello within %u ms", tpd_daemon_cfg(s->d)->hello_timeout_ms);
}
/* ---- what the connection asks of its session (struct tpd_conn_ops) ------------------------- */

static int session_on_frame(void *owner, const struct tpw_hdr *h, const uint8_t *body,
			    const uint8_t *tail, bool tail_shared, int fd)
{
	return tpd_sessmsg_handle(owner, h, body, tail, tail_shared, fd);
}

static void session_on_conn_fail(void *owner, int level, Tpw__V1__Status status, const char *msg)
{
	tpd_session_fail(owner, level, status, "%s", msg);
}

/* Largest frame the client may send now: small until its Hello. */
static uint32_t session_frame_max(const void *owner)
{
	const struct tpd_session *s = owner;
	const struct tpd_config *cfg = tpd_daemon_cfg(s->d);
	uint32_t frame_max = tpd_daemon_limits(s->d)->frame_max;

	if (s->hello_done || cfg->hello_frame_max > frame_max)
		return frame_max;
	return cfg->hello_frame_max;
}

static bool session_ended_clean(const void *owner)
{
	const struct tpd_session *s = owner;

	return s->ended_clean;
}

static const struct tpd_conn_ops session_conn_ops = {
	.on_frame = session_on_frame,
	.on_fail = session_on_conn_fail,
	.frame_max = session_frame_max,
	.ended_clean = session_ended_clean,
};

/* ---- life cycle ---------------------------------------------------------------------------- */

int tpd_session_new(struct tpd_daemon *d, int fd, struct tpd_session **ret)
{
	struct tpd_session *s = calloc(1, sizeof(*s));
	uint32_t hello_ms = tpd_daemon_cfg(d)->hello_timeout_ms;
	struct timeval hello_tv = { (time_t)(hello_ms / 1000),
				    (suseconds_t)(hello_ms % 1000) * 1000 };
	struct event_base *base = tpd_daemon_base(d);
	int r;

	if (!s) {
		tpu_close(fd);
		return -ENOMEM;
	}
	s->d = d;
	tpd_conn_setup(&s->conn, d, fd, &session_conn_ops, s);
	s->attached_ns = tpu_now_ns();
	tpu_list_init(&s->listeners);
	tpu_hmap_init(&s->pipes);
	tpu_hmap_init(&s->buffers);
	s->next_accept_id = 1;
	s->id = tpd_local_session_add(tpd_daemon_local(d), s);
	r = read_creds(s);
	if (r < 0)
		goto fail;
	r = session_admit(s);
	if (r < 0) {
		tpd_session_free(s, TPW__V1__STATUS__STATUS_LIMIT);
		return r;
	}
	r = tpd_conn_start(&s->conn, s->acct);
	if (r < 0)
		goto fail;
	s->ev_close = event_new(base, -1, 0, session_on_close, s);
	s->ev_hello = evtimer_new(base, session_on_hello_timeout, s);
	r = -ENOMEM;
	if (!s->ev_close || !s->ev_hello)
		goto fail;
	event_base_update_cache_time(base); /* the hello deadline runs from now */
	if (tpd_timer_add(s->ev_hello, &hello_tv) < 0)
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
	const struct tpd_local_pipe_ops *ops = tpd_local_pipe_ops(tpd_daemon_local(s->d));
	size_t n = s->pipes.len, i = 0, k = 0;
	struct tpd_pipe_end **ends = calloc(n + 1, sizeof(*ends));
	uint64_t key;
	void *val;

	/* Detaching may send to other sessions but never touches this table. */
	while (ends && tpu_hmap_next(&s->pipes, &i, &key, &val))
		ends[k++] = val;
	for (i = 0; i < k; i++)
		ops->end_detach(ends[i], why);
	free(ends);
	tpu_hmap_done(&s->pipes);
}

static void release_buffers(struct tpd_session *s)
{
	size_t i = 0;
	const struct tpd_local_chan_ops *chan = tpd_local_chan_ops(tpd_daemon_local(s->d));
	uint64_t key;
	void *val;

	while (tpu_hmap_next(&s->buffers, &i, &key, &val)) {
		struct tpb_buffer *b = val;

		tpb_rdma_forget_buffer(tpd_daemon_rdma(s->d), b);
		if (b->map_key && chan)
			chan->buffer_gone(s, b);
		tpb_buffer_unref(b);
	}
	tpu_hmap_done(&s->buffers);
	if (s->acct)
		s->acct->buffer_bytes -= s->buffer_bytes;
	s->buffer_bytes = 0;
	s->n_staging = 0;
	s->staging_bytes = 0;
}

void tpd_session_free(struct tpd_session *s, Tpw__V1__Status why)
{
	struct tpd_listener *l, *tmp;

	if (!s)
		return;
	if (!s->dead && why == TPW__V1__STATUS__STATUS_SHUTDOWN)
		tpd_conn_flush(&s->conn); /* last replies and PipeClosed, best effort */
	s->dead = true;
	tpd_conn_stop(&s->conn); /* sends to @s are refused from here on */
	detach_pipes(s, why);
	if (tpd_local_group_ops(tpd_daemon_local(s->d)))
		tpd_local_group_ops(tpd_daemon_local(s->d))->session_end(s);
	if (tpd_local_chan_ops(tpd_daemon_local(s->d)))
		tpd_local_chan_ops(tpd_daemon_local(s->d))->session_end(s);
	if (tpd_local_wq_ops(tpd_daemon_local(s->d)))
		tpd_local_wq_ops(tpd_daemon_local(s->d))->session_end(s);
	tpu_list_for_each_safe(l, tmp, &s->listeners, session_node)
		tpd_listener_registry_remove(tpd_daemon_registry(s->d), l);
	release_buffers(s);
	tpd_devmem_session_end(s);
	tpd_conn_done(&s->conn); /* releases the queued and buffered bytes before the uid leaves */
	if (s->acct)
		tpd_quota_leave(tpd_daemon_quota(s->d), s->acct);
	if (s->ev_close)
		event_free(s->ev_close);
	if (s->ev_hello)
		event_free(s->ev_hello);
	tpd_local_session_remove(tpd_daemon_local(s->d), s);
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
	tpd_conn_stop(&s->conn);
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
			(void)tpd_conn_flush(&s->conn);
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

uint64_t tpd_session_id(const struct tpd_session *s)
{
	return s->id;
}

bool tpd_session_dead(const struct tpd_session *s)
{
	return s->dead;
}

Tpw__V1__Status tpd_session_dead_status(const struct tpd_session *s)
{
	return s->dead_status;
}

uint32_t tpd_session_client_minor(const struct tpd_session *s)
{
	return s->client_minor;
}

bool tpd_session_pipe_ring(const struct tpd_session *s)
{
	return s->pipe_ring && !s->dead && tpd_conn_is_ring(&s->conn);
}

bool tpd_session_pipe_ring_addr(const struct tpd_session *s)
{
	return s->pipe_ring_addr && tpd_session_pipe_ring(s);
}

int tpd_session_send_fd(struct tpd_session *s, int fd)
{
	return tpd_conn_send_fd(&s->conn, fd);
}

struct tpb_proc *tpd_session_proc(const struct tpd_session *s)
{
	return s->proc;
}

uid_t tpd_session_uid(const struct tpd_session *s)
{
	return s->uid;
}

gid_t tpd_session_gid(const struct tpd_session *s)
{
	return s->gid;
}

pid_t tpd_session_pid(const struct tpd_session *s)
{
	return s->pid;
}

bool tpd_session_in_group(const struct tpd_session *s, gid_t g)
{
	if (s->gid == g)
		return true;
	for (size_t i = 0; i < s->n_groups; i++)
		if (s->groups[i] == g)
			return true;
	return false;
}

struct tpd_daemon *tpd_session_daemon(const struct tpd_session *s)
{
	return s->d;
}

const char *tpd_session_comm(const struct tpd_session *s)
{
	return s->comm;
}

Tpw__V1__Role tpd_session_role(const struct tpd_session *s)
{
	return s->role;
}

unsigned tpd_session_listener_count(const struct tpd_session *s)
{
	return s->n_listeners;
}

unsigned tpd_session_buffer_count(const struct tpd_session *s)
{
	return (unsigned)s->buffers.len;
}

uint64_t tpd_session_buffer_bytes(const struct tpd_session *s)
{
	return s->buffer_bytes;
}

unsigned tpd_session_staging_count(const struct tpd_session *s)
{
	return s->n_staging;
}

uint64_t tpd_session_staging_bytes(const struct tpd_session *s)
{
	return s->staging_bytes;
}

const struct tpd_conn *tpd_session_conn(const struct tpd_session *s)
{
	return &s->conn;
}

bool tpd_session_permitted(const struct tpd_session *s, const struct tpd_listener *l)
{
	return tpd_listener_permits(l, s->uid, s->gid, s->groups, s->n_groups);
}

const char *tpd_session_name(const struct tpd_session *s)
{
	return s->name;
}

struct tpd_pipe_end *tpd_session_pipe_find(const struct tpd_session *s, uint64_t id)
{
	return tpu_hmap_get(&s->pipes, id);
}

int tpd_session_pipe_add(struct tpd_session *s, uint64_t id, struct tpd_pipe_end *e)
{
	return tpu_hmap_put(&s->pipes, id, e);
}

void tpd_session_pipe_remove(struct tpd_session *s, uint64_t id)
{
	tpu_hmap_del(&s->pipes, id);
}

int tpd_session_send(struct tpd_session *s, Tpw__V1__DaemonMsg *m, const struct iovec *tail,
		     int n_tail)
{
	return s ? tpd_conn_send(&s->conn, m, tail, n_tail) : -EPIPE;
}

int tpd_session_send_with_fd(struct tpd_session *s, Tpw__V1__DaemonMsg *m, int fd)
{
	return s ? tpd_conn_send_with_fd(&s->conn, m, fd) : -EPIPE;
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

struct tpb_buffer *tpd_session_buffer(struct tpd_session *s, uint64_t id, uint64_t gen)
{
	struct tpb_buffer *b = tpu_hmap_get(&s->buffers, id);

	return b && b->gen == gen ? b : NULL;
}

int tpd_session_buffer_range(struct tpd_session *s, const Tpw__V1__ShmRef *ref, uint64_t len,
			     struct tpb_buffer **ret_b, void **ret_ptr, char *why, size_t wl)
{
	struct tpb_buffer *b = tpd_session_buffer(s, ref->buf_id, ref->gen);

	if (!b) {
		snprintf(why, wl, "no shared buffer %llu/%llu", (unsigned long long)ref->buf_id,
			 (unsigned long long)ref->gen);
		return -ENOENT;
	}
	if (tpb_buffer_resolve(b, ref->offset, len, ret_ptr) < 0) {
		snprintf(why, wl, "range %llu+%llu outside shared buffer %llu of %llu bytes",
			 (unsigned long long)ref->offset, (unsigned long long)len,
			 (unsigned long long)ref->buf_id, (unsigned long long)b->size);
		return -ERANGE;
	}
	*ret_b = b;
	return 0;
}
