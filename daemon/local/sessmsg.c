/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What a session's frames mean. conn.c cuts complete frames out of the input (socket or
 * control ring) and hands each one here with the fd it announced, if any: this file unpacks
 * it with the bounded allocator, validates it, checks that the session's state allows its type
 * (Hello first; a control session sends only CtlRequest), and dispatches it through one const
 * table indexed by body case (sessmsg_cmds), whose entries say which messages come before
 * Hello, which a control session may send, and which leave the session free to set up its
 * ring. Hello and RingSetup are answered here; listeners and shared buffers enter and leave the
 * session's tables here; writes, reads, connects and pipe closes go to pipe.c, CtlRequest to
 * the handler ctl.c registers (tpd_sessmsg_set_ctl()), CUDA releases to devmem.c. It does not
 * read or write the socket or the rings and never frees the session: a violation fails it
 * (tpd_session_fail()) and session.c closes it from its deferred event.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/uio.h>
#include "conn.h"
#include "devmem.h"
#include "core.h"
#include "rdma/rdma.h"
#include "frame.h"
#include "local.h"
#include "log.h"
#include "session.h"
#include "sessmsg.h"
#include "validate.h"
#include "tpconfig.h"

/* ---- handlers ------------------------------------------------------------------------------ */

/*
 * The Hello probe: read 8 bytes at the address the client named in the pinned process, as that
 * client (tpb_cma_move()); a client whose probe fails, or whose uid this daemon cannot take,
 * stages through shared buffers instead.
 */
/* The broker's handlers of pipe messages (tpd_broker_serve_local()). */
static const struct tpd_local_pipe_ops *pipe_ops(const struct tpd_session *s)
{
	return tpd_local_pipe_ops(tpd_daemon_local(s->d));
}

static bool cma_probe(struct tpd_session *s, const Tpw__V1__Hello *h)
{
	uint64_t v = 0;
	char why[256];
	int r;

	if (!tpd_daemon_cma_viable(s->d) || !h->cma_probe_addr || !s->proc)
		return false;
	if (!tpb_cma_as_allowed(s->uid)) {
		tpd_session_log(s, TPU_LOG_INFO,
				"no CMA: this daemon cannot act as uid %u (no CAP_SETUID/CAP_SETGID)",
				(unsigned)s->uid);
		return false;
	}
	r = tpb_cma_move(s->proc, &v, h->cma_probe_addr, sizeof(v), false, why, sizeof(why));
	if (r < 0)
		tpd_session_log(s, TPU_LOG_INFO, "no CMA: probe failed: %s",
				r == -EPERM || r == -ESRCH ? why : strerror(-r));
	return r == 0 && v == h->cma_probe_value;
}

/*
 * Maps the control ring of RingSetup @m (@fd borrowed). Return: 0, or -errno with @why set; the
 * session then stays on the socket.
 */
static int ring_accept(struct tpd_session *s, const Tpw__V1__RingSetup *m, int fd, const char **why)
{
	uint32_t max = tpd_daemon_cfg(s->d)->ring_max;
	int r;

	*why = NULL;
	if (!s->ring_allowed) {
		*why = "RingSetup must be a client's first frame after Hello";
		return -EINVAL;
	}
	if (!max) {
		*why = "control rings are off on this daemon (ring-max = 0)";
		return -EOPNOTSUPP;
	}
	if (m->ring_bytes > max) {
		*why = "ring larger than the daemon's ring-max";
		return -ENOBUFS;
	}
	r = tpd_conn_ring_attach(&s->conn, fd, m->ring_bytes);
	if (r < 0) {
		if (r != -EPERM && r != -EBADF && r != -EACCES) {
			*why = "cannot map the ring";
			return -EIO;
		}
		*why = r == -EPERM    ? "ring memfd not sealed against shrinking"
		       : r == -EACCES ? "ring memfd sealed against writing"
				      : "ring fd is not a memfd of the announced size";
		return -EINVAL;
	}
	return 0;
}

/* RingSetup: map the rings, answer on the socket, then switch both directions to them. */
static void handle_ring_setup(struct tpd_session *s, const Tpw__V1__RingSetup *m, int fd)
{
	const char *why;
	int r = ring_accept(s, m, fd, &why);

	s->ring_allowed = false;
	tpd_session_reply(s, m->req_id, r, why, 0, NULL);
	if (r < 0) {
		tpd_session_log(s, TPU_LOG_INFO, "control ring refused (%s): staying on the socket",
				why);
		return;
	}
	if (s->dead)
		return;
	if (tpd_conn_ring_switch(&s->conn) < 0) {
		tpd_session_fail(s, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
				 "client does not read the answer to its RingSetup");
		return;
	}
	tpd_session_log(s, TPU_LOG_DEBUG, "control ring of %u bytes per direction",
			tpd_conn_ring_bytes(&s->conn));
	tpd_local_spin_kick(tpd_daemon_local(s->d)); /* ends with the ring's sleeping flag set */
}

static void handle_hello(struct tpd_session *s, const Tpw__V1__Hello *h)
{
	Tpw__V1__HelloReply hr = TPW__V1__HELLO_REPLY__INIT;
	Tpw__V1__Limits lim = TPW__V1__LIMITS__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	const struct tpd_config *cfg = tpd_daemon_cfg(s->d);
	char name[TPW_NAME_MAX + 1];

	hr.major = TPW_PROTO_MAJOR;
	hr.minor = TPW_PROTO_MINOR;
	hr.daemon_version = TP_VERSION;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY;
	dm.hello_reply = &hr;
	if (h->major != TPW_PROTO_MAJOR) {
		hr.status = TPW__V1__STATUS__STATUS_VERSION;
		hr.message = "protocol major version not supported";
		tpd_session_send(s, &dm, NULL, 0);
		tpd_session_fail(s, TPU_LOG_NOTICE, TPW__V1__STATUS__STATUS_VERSION,
				 "protocol version %u.%u, expected %u.x", h->major, h->minor,
				 TPW_PROTO_MAJOR);
		return;
	}
	s->role = h->role;
	s->client_minor = h->minor;
	s->pipe_ring = h->pipe_ring;
	s->group_arena_fd = h->group_arena_fd;
	s->pipe_ring_addr = h->pipe_ring_addr;
	if (h->name && *h->name)
		snprintf(name, sizeof(name), "%s", h->name);
	else
		snprintf(name, sizeof(name), "%s:%d", s->comm, (int)s->pid);
	s->name = strdup(name);
	s->cma_ok = s->role == TPW__V1__ROLE__ROLE_CLIENT && cma_probe(s, h);
	s->hello_done = true;
	s->ring_allowed = s->role == TPW__V1__ROLE__ROLE_CLIENT;
	hr.status = TPW__V1__STATUS__STATUS_OK;
	hr.session_id = s->id;
	hr.cma_ok = s->cma_ok;
	lim.frame_max = cfg->wire.frame_max;
	lim.inline_max = cfg->wire.inline_max;
	lim.segments_max = cfg->wire.segments_max;
	lim.message_bytes_max = cfg->wire.message_bytes_max;
	lim.metadata_max = cfg->wire.metadata_max;
	lim.buffers_max = cfg->buffers_max;
	lim.buffer_bytes_max = cfg->buffer_bytes_max;
	lim.pipes_max = cfg->pipes_max;
	lim.pipe_queue_max = cfg->pipe_queue_max;
	lim.pipe_queue_bytes = cfg->pipe_queue_bytes;
	lim.bcast_pipes_max = cfg->bcast_pipes_max;
	hr.limits = &lim;
	tpd_session_send(s, &dm, NULL, 0);
	tpd_session_log(s, TPU_LOG_DEBUG, "hello from '%s', cma %s", s->name,
			s->cma_ok ? "yes" : "no");
}

static void handle_listen(struct tpd_session *s, const Tpw__V1__Listen *m)
{
	struct tpd_registry *reg = tpd_daemon_registry(s->d);
	struct tpd_listener *l;
	char why[320];
	int r = -ENOBUFS;

	if (s->n_listeners < tpd_daemon_cfg(s->d)->listeners_max)
		r = tpd_listener_registry_add(reg, m->name, s, s->uid, m->access, m->gid, &l);
	if (r == 0 &&
	    tpd_listener_set_remote(l, m->remote, m->remote_peers, m->n_remote_peers) < 0) {
		tpd_listener_registry_remove(reg, l);
		r = -ENOMEM;
	}
	if (r < 0) {
		if (r == -EACCES)
			snprintf(why, sizeof(why),
				 "names '@UID:...' are reserved to uid UID (you are uid %u)",
				 (unsigned)s->uid);
		else if (r == -EADDRINUSE)
			snprintf(why, sizeof(why), "listener name '%s' is already taken", m->name);
		else if (r == -ENOBUFS)
			snprintf(why, sizeof(why), "listener limit of %u per client reached (tpipd "
				 "--listeners-max)",
				 tpd_daemon_cfg(s->d)->listeners_max);
		else
			snprintf(why, sizeof(why), "cannot listen on '%s': %s", m->name,
				 strerror(-r));
		tpd_session_log(s, TPU_LOG_INFO, "%s", why);
		tpd_session_reply(s, m->req_id, r, why, 0, NULL);
		return;
	}
	tpu_list_insert_tail(&s->listeners, &l->session_node);
	s->n_listeners++;
	tpd_session_log(s, TPU_LOG_INFO, "listening on '%s'%s", l->name,
			l->remote == TPW__V1__REMOTE_ACCESS__REMOTE_NONE ? ""
			: l->remote == TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER
				? ", open to every peer daemon"
				: ", open to listed peer daemons");
	tpd_session_reply(s, m->req_id, 0, NULL, l->id, NULL);
	pipe_ops(s)->listener_added(s->d, l->name);
}

static void handle_listener_close(struct tpd_session *s, const Tpw__V1__ListenerClose *m)
{
	struct tpd_registry *reg = tpd_daemon_registry(s->d);
	struct tpd_listener *l = tpd_listener_registry_find_id(reg, m->listener_id);

	if (!l || l->owner != s)
		return; /* already gone: closing is idempotent */
	tpd_session_log(s, TPU_LOG_INFO, "stopped listening on '%s'", l->name);
	tpd_listener_registry_remove(reg, l);
	s->n_listeners--;
}

static int buffer_check(struct tpd_session *s, const Tpw__V1__BufferRegister *m, char *why,
			size_t wl)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(s->d);

	if (tpu_hmap_get(&s->buffers, m->buf_id) || m->buf_id == 0) {
		snprintf(why, wl, "buffer id %llu in use or invalid",
			 (unsigned long long)m->buf_id);
		return -EADDRINUSE;
	}
	if (s->buffers.len >= cfg->buffers_max) {
		snprintf(why, wl, "buffer limit of %u per client reached (tpipd --buffers-max)",
			 cfg->buffers_max);
		return -ENOBUFS;
	}
	if (m->size > cfg->buffer_bytes_max - s->buffer_bytes) {
		snprintf(why, wl, "buffer bytes limit of %llu per client reached (tpipd "
			 "--buffer-bytes-max)",
			 (unsigned long long)cfg->buffer_bytes_max);
		return -ENOBUFS;
	}
	if (s->uid != 0 && (m->size > cfg->buffer_bytes_per_uid ||
			    s->acct->buffer_bytes > cfg->buffer_bytes_per_uid - m->size)) {
		snprintf(why, wl, "buffer bytes limit of %llu per uid reached for uid %u (tpipd "
			 "--buffer-bytes-per-uid)",
			 (unsigned long long)cfg->buffer_bytes_per_uid, (unsigned)s->uid);
		return -ENOBUFS;
	}
	return 0;
}

/*
 * Keeps @fd of chan_map buffer @b for its readers, charged to the session's uid. Over
 * kept-fds-per-uid or kept-fds-max the buffer stays a plain one (mapped, its fd closed by the
 * caller): readers get its items copied by the daemon, and the writer's library, which cannot
 * tell, goes on working. Logged at most a few times a second, daemon-wide.
 * Return: 0 (kept or not), or -errno with @why set (the registration fails).
 */
static int keep_map_fd(struct tpd_session *s, struct tpb_buffer *b, int fd, char *why, size_t wl)
{
	struct tpd_quota *q = tpd_daemon_quota(s->d);
	unsigned suppressed = 0;
	char over[160];
	int r;

	r = tpd_quota_charge_fd(q, tpd_daemon_cfg(s->d), s->acct, over, sizeof(over));
	if (r < 0) {
		if (tpd_quota_ratelog_uid_ok(&q->kept_fds_log, s->uid, 4, 16, 1000, &suppressed))
			tpd_session_log(s, TPU_LOG_NOTICE, "buffer %llu registered without its fd: %s; "
					"readers get its items copied (%u such lines held back)",
					(unsigned long long)b->id, over, suppressed);
		return 0;
	}
	r = tpb_buffer_keep_fd(b, fd, (atomic_uint *[2]){ &s->acct->kept_fds, &q->kept_fds });
	if (r < 0) {
		tpd_quota_release_fd(q, s->acct);
		snprintf(why, wl, "cannot keep the buffer's fd: %s", strerror(-r));
	}
	return r;
}

static void handle_buffer_register(struct tpd_session *s, const Tpw__V1__BufferRegister *m,
				   int fd)
{
	_cleanup_close_ int owned = fd;
	struct tpb_buffer *b = NULL;
	char why[192] = "";
	int r;

	r = buffer_check(s, m, why, sizeof(why));
	if (r == 0) {
		r = tpb_buffer_new(owned, m->buf_id, m->gen, m->size, &b);
		if (r == -EPERM)
			snprintf(why, sizeof(why), "buffer fd is not sealed against shrinking");
		else if (r < 0)
			snprintf(why, sizeof(why), "cannot map buffer of %llu bytes: %s",
				 (unsigned long long)m->size, strerror(-r));
	}
	/* A channel handle's buffer: its fd kept for the readers that map it (chan/chanio.c). */
	if (r == 0 && m->chan_map && (r = keep_map_fd(s, b, owned, why, sizeof(why))) < 0)
		tpb_buffer_unref(b);
	if (r == 0 && tpu_hmap_put(&s->buffers, m->buf_id, b) < 0) {
		tpb_buffer_unref(b);
		r = -ENOMEM;
		snprintf(why, sizeof(why), "out of memory");
	}
	if (r < 0) {
		tpd_session_log(s, TPU_LOG_INFO, "buffer %llu refused: %s",
				(unsigned long long)m->buf_id, why);
		tpd_session_reply(s, m->req_id, r, why, m->buf_id, NULL);
		return;
	}
	s->buffer_bytes += m->size;
	s->acct->buffer_bytes += m->size;
	b->staging = m->staging;
	if (b->staging) {
		s->n_staging++;
		s->staging_bytes += m->size;
	}
	tpd_session_reply(s, m->req_id, 0, NULL, m->buf_id, NULL);
}

static void handle_buffer_release(struct tpd_session *s, const Tpw__V1__BufferRelease *m)
{
	struct tpb_buffer *b = tpd_session_buffer(s, m->buf_id, m->gen);

	if (!b)
		return;
	tpu_hmap_del(&s->buffers, m->buf_id);
	s->buffer_bytes -= b->size;
	s->acct->buffer_bytes -= b->size;
	if (b->staging) {
		s->n_staging--;
		s->staging_bytes -= b->size;
	}
	tpb_rdma_forget_buffer(tpd_daemon_rdma(s->d), b);
	if (b->map_key && tpd_local_chan_ops(tpd_daemon_local(s->d)))
		tpd_local_chan_ops(tpd_daemon_local(s->d))->buffer_gone(s, b);
	tpb_buffer_unref(b);
}

static struct tpd_pipe_end *find_end(struct tpd_session *s, uint64_t id)
{
	return tpu_hmap_get(&s->pipes, id);
}

static void reply_unknown_pipe(struct tpd_session *s, Tpw__V1__ClientMsg *m)
{
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__WriteDone wd = TPW__V1__WRITE_DONE__INIT;
	Tpw__V1__ReadDone rd = TPW__V1__READ_DONE__INIT;

	if (m->body_case == TPW__V1__CLIENT_MSG__BODY_WRITE) {
		wd.pipe_id = m->write->pipe_id;
		wd.write_id = m->write->write_id;
		wd.status = TPW__V1__STATUS__STATUS_NOT_FOUND;
		wd.message = "no such pipe";
		dm.body_case = TPW__V1__DAEMON_MSG__BODY_WRITE_DONE;
		dm.write_done = &wd;
	} else {
		if (m->read->ack_eager)
			return;
		rd.pipe_id = m->read->pipe_id;
		rd.msg_id = m->read->msg_id;
		rd.status = TPW__V1__STATUS__STATUS_NOT_FOUND;
		rd.message = "no such pipe";
		dm.body_case = TPW__V1__DAEMON_MSG__BODY_READ_DONE;
		dm.read_done = &rd;
	}
	tpd_session_send(s, &dm, NULL, 0);
}

static void handle_pipe_close(struct tpd_session *s, const Tpw__V1__PipeClose *m)
{
	struct tpd_pipe_end *e = tpu_hmap_del(&s->pipes, m->pipe_id);
	Tpw__V1__PipeClosed pc = TPW__V1__PIPE_CLOSED__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;

	if (e) {
		pipe_ops(s)->end_close(e); /* acknowledges once no copy uses the end's memory */
		return;
	}
	/* Already gone (failed connect, remote end gone): nothing can touch its memory. */
	pc.pipe_id = m->pipe_id;
	pc.status = TPW__V1__STATUS__STATUS_CANCELED;
	pc.message = "closed";
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_PIPE_CLOSED;
	dm.pipe_closed = &pc;
	tpd_session_send(s, &dm, NULL, 0);
}

/* What a handler gets beside the message: the frame and the one fd it carried. */
struct sessmsg_in {
	const struct tpw_hdr *h;
	const uint8_t *tail;	/* the frame's data tail (inline payloads) */
	int *fd;		/* the frame's fd or -EBADF; a handler that keeps it takes it */
};

/* A ClientMsg's handler. Return: true if it took @m, false if the dispatcher frees it. */
typedef bool sessmsg_handler_fn(struct tpd_session *s, Tpw__V1__ClientMsg *m,
				struct sessmsg_in *in);

static bool on_hello(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	(void)in;
	handle_hello(s, m->hello);
	return false;
}

static bool on_listen(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	(void)in;
	handle_listen(s, m->listen);
	return false;
}

static bool on_listener_close(struct tpd_session *s, Tpw__V1__ClientMsg *m,
			      struct sessmsg_in *in)
{
	(void)in;
	handle_listener_close(s, m->listener_close);
	return false;
}

static bool on_connect(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	(void)in;
	pipe_ops(s)->connect(s->d, s, m->connect);
	return false;
}

static bool on_buffer_register(struct tpd_session *s, Tpw__V1__ClientMsg *m,
			       struct sessmsg_in *in)
{
	handle_buffer_register(s, m->buffer_register, TAKE_FD(*in->fd));
	return false;
}

static bool on_buffer_release(struct tpd_session *s, Tpw__V1__ClientMsg *m,
			      struct sessmsg_in *in)
{
	(void)in;
	handle_buffer_release(s, m->buffer_release);
	return false;
}

static bool on_cuda_release(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	(void)in;
	tpd_devmem_release(s, m->cuda_release);
	return false;
}

static bool on_cuda_dmabuf(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	tpd_devmem_dmabuf(s, m->cuda_dmabuf, TAKE_FD(*in->fd));
	return false;
}

static bool on_write(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	struct tpd_pipe_end *e = find_end(s, m->write->pipe_id);

	if (!e) {
		reply_unknown_pipe(s, m);
		return false;
	}
	pipe_ops(s)->write(e, m, in->tail, in->h->data_len);
	return true;
}

static bool on_broadcast(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	pipe_ops(s)->broadcast(s, m->broadcast, in->tail, in->h->data_len);
	return false;
}

static bool on_read(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	struct tpd_pipe_end *e = find_end(s, m->read->pipe_id);

	(void)in;
	if (e)
		pipe_ops(s)->read(e, m->read);
	if (!find_end(s, m->read->pipe_id)) /* also when the read ended the pipe */
		reply_unknown_pipe(s, m);
	return false;
}

static bool on_pipe_close(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	(void)in;
	handle_pipe_close(s, m->pipe_close);
	return false;
}

static bool on_cancel(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	/* Only this session's pipes: another session's operations cannot be named. */
	struct tpd_pipe_end *e = find_end(s, m->cancel->pipe_id);

	(void)in;
	if (e)
		pipe_ops(s)->cancel(e, m->cancel);
	return false;
}

static bool on_ring_done(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	/* Only this session's pipes: another session's transfers cannot be named. */
	struct tpd_pipe_end *e = find_end(s, m->ring_done->pipe_id);

	(void)in;
	if (e)
		pipe_ops(s)->ring_done(e, m->ring_done);
	return false;
}

static bool on_flow_resume(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	struct tpd_pipe_end *e = find_end(s, m->flow_resume->pipe_id);

	(void)in;
	if (e)
		pipe_ops(s)->flow_resumed(e, m->flow_resume);
	return false;
}

static bool on_session_end(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	/* tp_context_free(): the disconnect that follows is a clean close. */
	(void)m;
	(void)in;
	s->ended_clean = true;
	tpd_session_log(s, TPU_LOG_DEBUG, "client is closing its context");
	return false;
}

/* Who answers CtlRequest: the ctl part, registered at daemon start. */
static tpd_sessmsg_ctl_fn *ctl_fn;

void tpd_sessmsg_set_ctl(tpd_sessmsg_ctl_fn *fn)
{
	ctl_fn = fn;
}

static bool on_ctl(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	(void)in;
	ctl_fn(s, m->ctl);
	return false;
}

static bool on_ring_setup(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	_cleanup_close_ int fd = TAKE_FD(*in->fd);

	handle_ring_setup(s, m->ring_setup, fd);
	return false;
}

static bool on_group_join(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	(void)in;
	tpd_local_group_ops(tpd_daemon_local(s->d))->join(s, m->group_join);
	return false;
}

static bool on_group_ready(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	(void)in;
	tpd_local_group_ops(tpd_daemon_local(s->d))->ready(s, m->group_ready);
	return false;
}

static bool on_group_leave(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	(void)in;
	tpd_local_group_ops(tpd_daemon_local(s->d))->leave(s, m->group_leave);
	return false;
}

static bool on_chan_op(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	const struct tpd_local_chan_ops *ops = tpd_local_chan_ops(tpd_daemon_local(s->d));

	if (ops)
		ops->op(s, m->chan_op, in->tail, in->h->data_len);
	else
		tpd_session_log(s, TPU_LOG_WARNING, "channel op without a channel registry");
	return false;
}

static bool on_wq_op(struct tpd_session *s, Tpw__V1__ClientMsg *m, struct sessmsg_in *in)
{
	const struct tpd_local_wq_ops *ops = tpd_local_wq_ops(tpd_daemon_local(s->d));

	if (ops)
		ops->op(s, m->wq_op, in->tail, in->h->data_len);
	else
		tpd_session_log(s, TPU_LOG_WARNING, "work queue op without a queue registry");
	return false;
}

#define SESSMSG_HELLO 0x1u	/* the first message, and only then */
#define SESSMSG_CONTROL 0x2u	/* allowed on a control session (tpipctl) */
#define SESSMSG_RING 0x4u	/* leaves the session free to set up its control ring */

struct sessmsg_cmd {
	sessmsg_handler_fn *fn;
	unsigned flags; /* SESSMSG_* */
};

/* Every ClientMsg, indexed by body case; an empty slot is dropped (validation refuses it
 * first). A session may set up its ring only before any message but Hello and RingSetup. */
static const struct sessmsg_cmd sessmsg_cmds[] = {
	[TPW__V1__CLIENT_MSG__BODY_HELLO] = { on_hello, SESSMSG_HELLO | SESSMSG_RING },
	[TPW__V1__CLIENT_MSG__BODY_LISTEN] = { on_listen, 0 },
	[TPW__V1__CLIENT_MSG__BODY_LISTENER_CLOSE] = { on_listener_close, 0 },
	[TPW__V1__CLIENT_MSG__BODY_CONNECT] = { on_connect, 0 },
	[TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER] = { on_buffer_register, 0 },
	[TPW__V1__CLIENT_MSG__BODY_BUFFER_RELEASE] = { on_buffer_release, 0 },
	[TPW__V1__CLIENT_MSG__BODY_WRITE] = { on_write, 0 },
	[TPW__V1__CLIENT_MSG__BODY_READ] = { on_read, 0 },
	[TPW__V1__CLIENT_MSG__BODY_PIPE_CLOSE] = { on_pipe_close, 0 },
	[TPW__V1__CLIENT_MSG__BODY_CTL] = { on_ctl, SESSMSG_CONTROL },
	[TPW__V1__CLIENT_MSG__BODY_RING_SETUP] = { on_ring_setup, SESSMSG_RING },
	[TPW__V1__CLIENT_MSG__BODY_CUDA_RELEASE] = { on_cuda_release, 0 },
	[TPW__V1__CLIENT_MSG__BODY_SESSION_END] = { on_session_end, 0 },
	[TPW__V1__CLIENT_MSG__BODY_CANCEL] = { on_cancel, 0 },
	[TPW__V1__CLIENT_MSG__BODY_FLOW_RESUME] = { on_flow_resume, 0 },
	[TPW__V1__CLIENT_MSG__BODY_GROUP_JOIN] = { on_group_join, 0 },
	[TPW__V1__CLIENT_MSG__BODY_GROUP_READY] = { on_group_ready, 0 },
	[TPW__V1__CLIENT_MSG__BODY_GROUP_LEAVE] = { on_group_leave, 0 },
	[TPW__V1__CLIENT_MSG__BODY_CHAN_OP] = { on_chan_op, 0 },
	[TPW__V1__CLIENT_MSG__BODY_WQ_OP] = { on_wq_op, 0 },
	[TPW__V1__CLIENT_MSG__BODY_CUDA_DMABUF] = { on_cuda_dmabuf, 0 },
	[TPW__V1__CLIENT_MSG__BODY_BROADCAST] = { on_broadcast, 0 },
	[TPW__V1__CLIENT_MSG__BODY_RING_DONE] = { on_ring_done, 0 },
};

/* The table entry of @m's body case, or NULL for a case it does not know. */
static const struct sessmsg_cmd *sessmsg_cmd(const Tpw__V1__ClientMsg *m)
{
	size_t c = (size_t)m->body_case;

	if (c >= TPU_ARRAY_SIZE(sessmsg_cmds) || !sessmsg_cmds[c].fn)
		return NULL;
	return &sessmsg_cmds[c];
}

/* ---- frames -------------------------------------------------------------------------------- */

/* Checks the message type against the session's state. Return: true if it may proceed. */
static bool state_allows(struct tpd_session *s, const struct sessmsg_cmd *cmd)
{
	unsigned f = cmd ? cmd->flags : 0;

	if (!s->hello_done)
		return f & SESSMSG_HELLO;
	if (f & SESSMSG_HELLO)
		return false;
	if (s->role == TPW__V1__ROLE__ROLE_CONTROL)
		return f & SESSMSG_CONTROL;
	return true;
}

int tpd_sessmsg_handle(struct tpd_session *s, const struct tpw_hdr *h, const uint8_t *body,
		       const uint8_t *tail, bool tail_shared, int frame_fd)
{
	Tpw__V1__ClientMsg *m = NULL;
	_cleanup_close_ int fd = frame_fd;
	_cleanup_free_ uint8_t *own = NULL;
	struct sessmsg_in in = { .h = h, .tail = tail, .fd = &fd };
	const struct sessmsg_cmd *cmd;
	char why[256];
	int r;

	r = tpw_client_msg_unpack(body, h->msg_len, &m);
	if (r < 0) {
		tpd_session_fail(s, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
				 "frame %llu does not decode", (unsigned long long)h->seq);
		return r;
	}
	r = tpw_client_msg_validate(m, h, tpd_daemon_limits(s->d), why, sizeof(why));
	cmd = sessmsg_cmd(m);
	if (r == 0 && !state_allows(s, cmd)) {
		snprintf(why, sizeof(why), "message type %d not allowed now", (int)m->body_case);
		r = -EBADMSG;
	}
	if (r < 0) {
		tpd_session_fail(s, TPU_LOG_WARNING, TPW__V1__STATUS__STATUS_PEER_DIED,
				 "invalid frame %llu: %s", (unsigned long long)h->seq, why);
		tpw_client_msg_free(m);
		return r;
	}
	if (!cmd || !(cmd->flags & SESSMSG_RING))
		s->ring_allowed = false;
	if (tail_shared && m->body_case != TPW__V1__CLIENT_MSG__BODY_WRITE) {
		/* only a Write's bytes are passed on as they are; anything else reads its own copy */
		own = malloc(h->data_len);
		if (!own) {
			tpd_session_fail(s, TPU_LOG_ERR, TPW__V1__STATUS__STATUS_IO, "out of memory");
			tpw_client_msg_free(m);
			return -ENOMEM;
		}
		memcpy(own, tail, h->data_len);
		in.tail = own;
	}
	if (!cmd || !cmd->fn(s, m, &in))
		tpw_client_msg_free(m);
	return 0;
}
