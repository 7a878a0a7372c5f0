/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Pipes and the transfer state machine. See pipe.h and docs/protocol.md ("Transfer of one
 * message"). Everything here runs on the loop thread; copies run on the copier's threads and
 * come back through copy_on_done().
 *
 * A message written by end W lives on W's lists: wq until its WriteDone is sent (in order), rq
 * until the reader has consumed it (eager ack, completed copy, discard, or failure). It is freed
 * when it is on neither list and no copy uses it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "daemon.h"
#include "log.h"
#include "peer.h"
#include "pipe.h"
#include "session.h"
#include "stripe.h"
#include "tpb.h"
#include "validate.h"
#include "devmem.h"
#include "gdr.h"

#define ACCEPT_ID_BASE (1ull << 63)

struct msg_src {
	struct tpb_mem mem;
	struct tpd_buffer *buf; /* reference held for shm sources */
	uint64_t len;
	bool remote_cuda;	/* written on another host from CUDA memory */
};

struct tpd_msg {
	struct tpu_list wnode;
	struct tpu_list rnode;
	struct tpd_pipe_end *from;
	uint64_t msg_id;
	uint64_t write_id;
	uint64_t bytes;
	uint8_t *tail; /* inline data held for a rendezvous message */
	uint32_t tail_len;
	struct msg_src *src; /* payloads then tensors */
	size_t n_src;
	struct tpd_copy_job *job; /* built at Read, submitted in order */
	struct tpd_xh *xh;	  /* cross-host: the send or receive of this message */
	bool eager;
	bool read_requested;
	bool copying;
	bool write_ready;
	Tpw__V1__Status write_status;
	char write_why[160];
};

struct tpd_pipe_end *tpd_pipe_end_peer(struct tpd_pipe_end *e)
{
	return e == &e->pipe->end[0] ? &e->pipe->end[1] : &e->pipe->end[0];
}

static const char *gone_text(Tpw__V1__Status s)
{
	switch (s) {
	case TPW__V1__STATUS__STATUS_PEER_DIED:
		return "peer died";
	case TPW__V1__STATUS__STATUS_SHUTDOWN:
		return "daemon stopping";
	default:
		return "remote end closed the pipe";
	}
}

/* Logs through @s's session logger with a TPIPD_PIPE field, or plainly without a session. */
static void pipe_log(const struct tpd_pipe *p, const struct tpd_session *s, int level,
		     const char *fmt, ...) _printf_(4, 5);

static void pipe_log(const struct tpd_pipe *p, const struct tpd_session *s, int level,
		     const char *fmt, ...)
{
	char pid[48], msg[800];
	const char *fields[] = { pid, NULL };
	va_list ap;

	if (level > (int)tpu_log_get_level())
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (s) {
		tpd_session_log(s, level, "pipe %llu: %s", (unsigned long long)p->id, msg);
		return;
	}
	snprintf(pid, sizeof(pid), "TPIPD_PIPE=%llu", (unsigned long long)p->id);
	tpu_log_kv((enum tpu_log_level)level, fields, "pipe %llu: %s", (unsigned long long)p->id,
		   msg);
}

/* Why the other end went away, for the survivor: the peer link's reason if there is one. */
static const char *why_text(const struct tpd_pipe *p, Tpw__V1__Status s)
{
	return p->why[0] ? p->why : gone_text(s);
}

static bool end_dying(const struct tpd_pipe_end *e)
{
	if (e->remote)
		return e->gone != TPW__V1__STATUS__STATUS_UNSPECIFIED;
	return !e->session || e->session->dead;
}

/* Attached: a local end with its session, or a remote end that has not gone away. */
static bool end_attached(const struct tpd_pipe_end *e)
{
	return e->remote ? e->gone == TPW__V1__STATUS__STATUS_UNSPECIFIED : e->session != NULL;
}

/* Why an end that is dying or gone went away. */
static Tpw__V1__Status end_gone_status(const struct tpd_pipe_end *e)
{
	if (e->session)
		return e->session->dead_status ? e->session->dead_status
					       : TPW__V1__STATUS__STATUS_PEER_DIED;
	return e->gone;
}

/* ---- messages ------------------------------------------------------------------------------ */

static void xh_free(struct tpd_xh *xh);

/* Tells the peer daemon @m (written there) is consumed with @st. */
static void peer_consumed(struct tpd_msg *m, Tpw__V1__Status st, const char *why);

static void msg_free(struct tpd_msg *m)
{
	xh_free(m->xh);
	for (size_t i = 0; i < m->n_src; i++) {
		tpd_buffer_unref(m->src[i].buf);
		tpd_devmem_put(&m->src[i].mem);
	}
	tpd_copy_job_free(m->job);
	free(m->src);
	free(m->tail);
	free(m);
}

static void msg_maybe_free(struct tpd_msg *m)
{
	if (!tpu_list_linked(&m->wnode) && !tpu_list_linked(&m->rnode) && !m->copying)
		msg_free(m);
}

static void send_write_done(struct tpd_pipe_end *e, struct tpd_msg *m)
{
	Tpw__V1__WriteDone wd = TPW__V1__WRITE_DONE__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;

	wd.pipe_id = e->local_id;
	wd.write_id = m->write_id;
	wd.status = m->write_status;
	wd.message = m->write_why[0] ? m->write_why : NULL;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_WRITE_DONE;
	dm.write_done = &wd;
	tpd_session_send(e->session, &dm, NULL, 0);
}

/* Sends WriteDone for the completed prefix of @e's writes, in write order. */
static void write_done_flush(struct tpd_pipe_end *e)
{
	struct tpd_msg *m;

	while ((m = tpu_list_first(&e->wq, struct tpd_msg, wnode)) && m->write_ready) {
		if (e->session)
			send_write_done(e, m);
		tpu_list_remove(&m->wnode);
		msg_maybe_free(m);
	}
}

static void msg_set_write(struct tpd_msg *m, Tpw__V1__Status st, const char *why)
{
	if (m->write_ready)
		return;
	m->write_ready = true;
	m->write_status = st;
	snprintf(m->write_why, sizeof(m->write_why), "%s", why ? why : "");
}

/* The reader is done with @m (successfully or not): complete the write, drop it from rq. */
static void msg_consumed(struct tpd_msg *m, Tpw__V1__Status st, const char *why)
{
	struct tpd_pipe_end *w = m->from;
	struct tpd_daemon *d = w->pipe->d;

	if (st == TPW__V1__STATUS__STATUS_OK) {
		w->msgs_sent++;
		w->bytes_sent += m->bytes;
		d->messages_moved++;
		d->bytes_moved += m->bytes;
	}
	msg_set_write(m, st, why);
	if (w->remote)
		peer_consumed(m, st, why);
	if (tpu_list_linked(&m->rnode)) {
		tpu_list_remove(&m->rnode);
		w->queued--;
		w->queued_bytes -= m->tail_len;
	}
	if (tpu_list_linked(&m->wnode)) {
		write_done_flush(w); /* frees @m once its WriteDone is out */
		return;
	}
	msg_maybe_free(m);
	write_done_flush(w);
}

static void send_read_done(struct tpd_pipe_end *r, uint64_t msg_id, Tpw__V1__Status st,
			   const char *why)
{
	Tpw__V1__ReadDone rd = TPW__V1__READ_DONE__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;

	if (!r->session)
		return;
	rd.pipe_id = r->local_id;
	rd.msg_id = msg_id;
	rd.status = st;
	rd.message = why && *why ? (char *)why : NULL;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_READ_DONE;
	dm.read_done = &rd;
	tpd_session_send(r->session, &dm, NULL, 0);
}

/* ---- pipes --------------------------------------------------------------------------------- */

static void end_init(struct tpd_pipe_end *e, struct tpd_pipe *p, struct tpd_session *s,
		     uint64_t local_id)
{
	e->pipe = p;
	e->session = s;
	e->local_id = local_id;
	tpu_list_init(&e->wq);
	tpu_list_init(&e->rq);
	e->gone = TPW__V1__STATUS__STATUS_UNSPECIFIED;
}

/* A new pipe of @d to listener @name; the caller sets up its ends. Return: owned pipe, or NULL
 * when out of memory. */
static struct tpd_pipe *pipe_new(struct tpd_daemon *d, const char *name)
{
	struct tpd_pipe *p = calloc(1, sizeof(*p));

	if (!p || !(p->listener = strdup(name))) {
		free(p);
		return NULL;
	}
	p->d = d;
	p->id = d->next_pipe_id++;
	p->created_ns = tpu_now_ns();
	tpu_list_init(&p->held);
	return p;
}

static void xpipe_done(struct tpd_pipe *p);

static void end_drop_all(struct tpd_pipe_end *e)
{
	struct tpd_msg *m, *tmp;

	tpu_list_for_each_safe(m, tmp, &e->wq, wnode)
		tpu_list_remove(&m->wnode);
	tpu_list_for_each_safe(m, tmp, &e->rq, rnode) {
		tpu_list_remove(&m->rnode);
		msg_maybe_free(m);
	}
}

static void pipe_maybe_free(struct tpd_pipe *p)
{
	if (p->end[0].session || p->end[1].session || p->jobs)
		return;
	end_drop_all(&p->end[0]);
	end_drop_all(&p->end[1]);
	xpipe_done(p);
	tpu_list_remove(&p->node);
	p->d->n_pipes--;
	pipe_log(p, NULL, TPU_LOG_DEBUG, "freed");
	free(p->listener);
	free(p);
}

static const char *const pair_names[4] = { "cpu>cpu", "cpu>cuda", "cuda>cpu", "cuda>cuda" };

static unsigned pair_of(enum tpb_loc src, enum tpb_loc dst)
{
	return (src == TPB_LOC_CUDA ? 2u : 0u) | (dst == TPB_LOC_CUDA ? 1u : 0u);
}

/* Remembers that @channel served a (source device, destination device) pair on @p. */
static void pair_record(struct tpd_pipe *p, enum tpb_loc src, enum tpb_loc dst, int channel)
{
	if (channel >= 0 && channel < 32)
		p->pair_channels[pair_of(src, dst)] |= 1u << channel;
}

/* CPU channels by name ("shm,cma"), then every channel of a pair with CUDA memory as
 * "NAME(SRC>DST)", e.g. "shm,cuda_ipc(cuda>cuda),cuda_ipc(cpu>cuda)". */
void tpd_pipe_channels(const struct tpd_pipe *p, char *buf, size_t len)
{
	unsigned cuda = p->pair_channels[1] | p->pair_channels[2] | p->pair_channels[3];
	unsigned cpu = p->channels & ~(cuda & ~p->pair_channels[0]);
	size_t n = 0, off = 0;

	buf[0] = '\0';
	for (int i = 0; i < 32 && off < len; i++) {
		if (!(cpu & (1u << i)))
			continue;
		off += snprintf(buf + off, len - off, "%s%s", n++ ? "," : "", tpb_name(i));
	}
	for (unsigned k = 1; k < 4; k++)
		for (int i = 0; i < 32 && off < len; i++)
			if (p->pair_channels[k] & (1u << i))
				off += snprintf(buf + off, len - off, "%s%s(%s)", n++ ? "," : "",
						tpb_name(i), pair_names[k]);
}

static void connect_fail(struct tpd_session *s, const Tpw__V1__Connect *c, int err,
			 const char *why)
{
	Tpw__V1__PipeClosed pc = TPW__V1__PIPE_CLOSED__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;

	tpd_session_log(s, TPU_LOG_INFO, "connect to '%s' failed: %s", c->address, why);
	tpd_session_reply(s, c->req_id, err, why, c->pipe_id, NULL);
	pc.pipe_id = c->pipe_id;
	pc.status = tpw_status_from_errno(err);
	pc.message = (char *)why;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_PIPE_CLOSED;
	dm.pipe_closed = &pc;
	tpd_session_send(s, &dm, NULL, 0);
}

static void send_accepted(struct tpd_session *ls, struct tpd_listener *l, struct tpd_pipe_end *e,
			  struct tpd_session *cs)
{
	Tpw__V1__Accepted a = TPW__V1__ACCEPTED__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;

	a.listener_id = l->id;
	a.pipe_id = e->local_id;
	a.remote_name = cs->name;
	a.remote_pid = (uint32_t)cs->pid;
	a.remote_uid = (uint32_t)cs->uid;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_ACCEPTED;
	dm.accepted = &a;
	tpd_session_send(ls, &dm, NULL, 0);
}

/* Checks that a connect can go ahead; on refusal returns -errno and fills @why. */
static int connect_check(struct tpd_daemon *d, struct tpd_session *s, const Tpw__V1__Connect *c,
			 struct tpd_listener **ret, char *why, size_t wl)
{
	struct tpd_listener *l;
	struct tpd_session *ls;

	if (!tpw_name_valid(c->address)) {
		snprintf(why, wl, "invalid address '%.64s'", c->address);
		return -EINVAL;
	}
	if (tpu_hmap_get(&s->pipes, c->pipe_id)) {
		snprintf(why, wl, "pipe id %llu already in use", (unsigned long long)c->pipe_id);
		return -EADDRINUSE;
	}
	l = tpd_registry_find(&d->registry, c->address);
	if (!l) {
		snprintf(why, wl, "no listener named '%s'", c->address);
		return -ENOENT;
	}
	ls = l->owner;
	if (!tpd_listener_permits(l, s->uid, s->gid, s->groups, s->n_groups)) {
		snprintf(why, wl, "listener '%s' refuses uid %u", l->name, (unsigned)s->uid);
		return -EACCES;
	}
	if (tpd_session_pipe_count(s) >= d->cfg.pipes_max ||
	    tpd_session_pipe_count(ls) >= d->cfg.pipes_max) {
		snprintf(why, wl, "pipe limit of %u per client reached", d->cfg.pipes_max);
		return -ENOBUFS;
	}
	*ret = l;
	return 0;
}

static void xpipe_connect(struct tpd_daemon *d, struct tpd_session *s, const Tpw__V1__Connect *c);

void tpd_pipe_connect(struct tpd_daemon *d, struct tpd_session *s, const Tpw__V1__Connect *c)
{
	struct tpd_listener *l = NULL;
	struct tpd_session *ls;
	struct tpd_pipe *p;
	char why[192];
	int r;

	if (strncmp(c->address, "tpip://", 7) == 0) {
		xpipe_connect(d, s, c);
		return;
	}
	r = connect_check(d, s, c, &l, why, sizeof(why));
	if (r < 0) {
		connect_fail(s, c, r, why);
		return;
	}
	ls = l->owner;
	p = pipe_new(d, l->name);
	if (!p) {
		connect_fail(s, c, -ENOMEM, "out of memory");
		return;
	}
	end_init(&p->end[0], p, s, c->pipe_id);
	end_init(&p->end[1], p, ls, ACCEPT_ID_BASE + ls->next_accept_id++);
	if (tpu_hmap_put(&s->pipes, p->end[0].local_id, &p->end[0]) < 0 ||
	    tpu_hmap_put(&ls->pipes, p->end[1].local_id, &p->end[1]) < 0) {
		tpu_hmap_del(&s->pipes, p->end[0].local_id);
		free(p->listener);
		free(p);
		connect_fail(s, c, -ENOMEM, "out of memory");
		return;
	}
	tpu_list_insert_tail(&d->pipes, &p->node);
	d->n_pipes++;
	l->accepted++;
	pipe_log(p, s, TPU_LOG_INFO, "connected to '%s' (session %llu)", l->name,
		 (unsigned long long)ls->id);
	tpd_session_reply(s, c->req_id, 0, NULL, c->pipe_id, l->name);
	send_accepted(ls, l, &p->end[1], s);
}

/* ---- writes -------------------------------------------------------------------------------- */

/* Completes write @write_id with an error, behind the writes of @e still pending. */
static void write_reject(struct tpd_pipe_end *e, uint64_t write_id, int err, const char *why)
{
	Tpw__V1__WriteDone wd = TPW__V1__WRITE_DONE__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	struct tpd_msg *m;

	if (!tpu_list_empty(&e->wq) && (m = calloc(1, sizeof(*m)))) {
		tpu_list_init(&m->wnode);
		tpu_list_init(&m->rnode);
		m->from = e;
		m->write_id = write_id;
		msg_set_write(m, tpw_status_from_errno(err), why);
		tpu_list_insert_tail(&e->wq, &m->wnode);
		write_done_flush(e);
		return;
	}
	wd.pipe_id = e->local_id;
	wd.write_id = write_id;
	wd.status = tpw_status_from_errno(err);
	wd.message = (char *)why;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_WRITE_DONE;
	dm.write_done = &wd;
	tpd_session_send(e->session, &dm, NULL, 0);
}

static int resolve_src(struct tpd_session *s, const Tpw__V1__Segment *seg, const uint8_t *tail,
		       struct msg_src *out, char *why, size_t wl)
{
	void *ptr;
	int r;

	out->len = seg->length;
	out->mem.loc = TPB_LOC_LOCAL;
	switch (seg->loc_case) {
	case TPW__V1__SEGMENT__LOC_INLINE_OFF:
		out->mem.addr = (uint64_t)(uintptr_t)(tail + seg->inline_off);
		return 0;
	case TPW__V1__SEGMENT__LOC_SHM:
		out->buf = tpd_session_buffer(s, seg->shm->buf_id, seg->shm->gen);
		if (!out->buf) {
			snprintf(why, wl, "no shared buffer %llu/%llu",
				 (unsigned long long)seg->shm->buf_id,
				 (unsigned long long)seg->shm->gen);
			return -ENOENT;
		}
		r = tpd_buffer_resolve(out->buf, seg->shm->offset, seg->length, &ptr);
		if (r < 0) {
			snprintf(why, wl, "range %llu+%llu outside shared buffer %llu of %llu bytes",
				 (unsigned long long)seg->shm->offset,
				 (unsigned long long)seg->length,
				 (unsigned long long)seg->shm->buf_id,
				 (unsigned long long)out->buf->size);
			out->buf = NULL;
			return r;
		}
		tpd_buffer_ref(out->buf);
		out->mem.addr = (uint64_t)(uintptr_t)ptr;
		return 0;
	case TPW__V1__SEGMENT__LOC_CMA_ADDR:
		if (!s->cma_ok) {
			snprintf(why, wl, "cross-memory attach is not available for this client");
			return -EINVAL;
		}
		out->mem.loc = TPB_LOC_PROCESS;
		out->mem.pid = s->pid;
		out->mem.addr = seg->cma_addr;
		return 0;
	case TPW__V1__SEGMENT__LOC_CUDA:
		return tpd_devmem_resolve(s, seg->cuda, &out->mem, why, wl);
	default:
		out->mem.addr = 0; /* zero length, validated */
		return 0;
	}
}

static const Tpw__V1__Segment *write_segment(const Tpw__V1__Write *w, size_t i)
{
	return i < w->n_payloads ? w->payloads[i]->data : w->tensors[i - w->n_payloads]->data;
}

/* Resolves every source of @w into @m; fills @why on failure. */
static int msg_resolve(struct tpd_msg *m, struct tpd_session *s, const Tpw__V1__Write *w,
		       const uint8_t *tail, char *why, size_t wl)
{
	m->n_src = w->n_payloads + w->n_tensors;
	m->src = calloc(m->n_src ? m->n_src : 1, sizeof(*m->src));
	if (!m->src)
		return -ENOMEM;
	m->eager = true;
	for (size_t i = 0; i < m->n_src; i++) {
		const Tpw__V1__Segment *seg = write_segment(w, i);
		int r = resolve_src(s, seg, tail, &m->src[i], why, wl);
		if (r < 0)
			return r;
		m->bytes += seg->length;
		if (seg->length && seg->loc_case != TPW__V1__SEGMENT__LOC_INLINE_OFF)
			m->eager = false;
	}
	return 0;
}

static void fill_desc(Tpw__V1__Descriptor *dd, const Tpw__V1__Write *w, Tpw__V1__PayloadDesc *pd,
		      Tpw__V1__PayloadDesc **pdp, Tpw__V1__TensorDesc *td,
		      Tpw__V1__TensorDesc **tdp)
{
	static Tpw__V1__Device cpu = TPW__V1__DEVICE__INIT;

	cpu.type = TPW__V1__DEVICE_TYPE__DEVICE_CPU;
	dd->metadata = w->metadata;
	for (size_t i = 0; i < w->n_payloads; i++) {
		tpw__v1__payload_desc__init(&pd[i]);
		pd[i].length = w->payloads[i]->data->length;
		pd[i].metadata = w->payloads[i]->metadata;
		pdp[i] = &pd[i];
	}
	for (size_t i = 0; i < w->n_tensors; i++) {
		tpw__v1__tensor_desc__init(&td[i]);
		td[i].length = w->tensors[i]->data->length;
		td[i].metadata = w->tensors[i]->metadata;
		td[i].device = w->tensors[i]->device ? w->tensors[i]->device : &cpu;
		td[i].target = w->tensors[i]->target;
		tdp[i] = &td[i];
	}
	dd->n_payloads = w->n_payloads;
	dd->payloads = pdp;
	dd->n_tensors = w->n_tensors;
	dd->tensors = tdp;
}

/* Sends the descriptor of @m (written as @w) to the reader @r, with the bytes if eager: to its
 * session, or through the peer link when @r is on another host. */
static int send_descriptor(struct tpd_pipe_end *r, struct tpd_msg *m, const Tpw__V1__Write *w)
{
	Tpw__V1__Descriptor dd = TPW__V1__DESCRIPTOR__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__PeerDescriptor pd_ = TPW__V1__PEER_DESCRIPTOR__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	size_t n = w->n_payloads + w->n_tensors;
	Tpw__V1__PayloadDesc *pd = calloc(w->n_payloads + 1, sizeof(*pd));
	Tpw__V1__PayloadDesc **pdp = calloc(w->n_payloads + 1, sizeof(*pdp));
	Tpw__V1__TensorDesc *td = calloc(w->n_tensors + 1, sizeof(*td));
	Tpw__V1__TensorDesc **tdp = calloc(w->n_tensors + 1, sizeof(*tdp));
	struct iovec *iov = calloc(n + 1, sizeof(*iov));
	int r_ = -ENOMEM;

	if (!pd || !pdp || !td || !tdp || !iov)
		goto out;
	fill_desc(&dd, w, pd, pdp, td, tdp);
	dd.pipe_id = r->local_id;
	dd.msg_id = m->msg_id;
	dd.eager = m->eager;
	for (size_t i = 0; m->eager && i < n; i++) {
		iov[i].iov_base = (void *)(uintptr_t)m->src[i].mem.addr;
		iov[i].iov_len = m->src[i].len;
	}
	if (r->remote) {
		dd.pipe_id = 0; /* the peer daemon names the pipe in PeerDescriptor */
		pd_.pipe_id = r->pipe->remote_id;
		pd_.descriptor = &dd;
		pm.body_case = TPW__V1__PEER_MSG__BODY_DESCRIPTOR;
		pm.descriptor = &pd_;
		r_ = r->pipe->link ? tpd_peer_send(r->pipe->link, &pm, iov, m->eager ? (int)n : 0)
				   : -ECONNRESET;
		goto out;
	}
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR;
	dm.descriptor = &dd;
	r_ = tpd_session_send(r->session, &dm, iov, m->eager ? (int)n : 0);
out:
	free(pd);
	free(pdp);
	free(td);
	free(tdp);
	free(iov);
	return r_;
}

static void xpipe_hold(struct tpd_pipe_end *e, Tpw__V1__ClientMsg *cm, const uint8_t *tail,
		       uint32_t tail_len);

/* Checks the queue limits of end @e for a message holding @tail_len inline bytes. */
static int queue_check(struct tpd_pipe_end *e, uint32_t tail_len, char *why, size_t wl)
{
	const struct tpd_config *cfg = &e->pipe->d->cfg;

	if (e->queued >= cfg->pipe_queue_max) {
		snprintf(why, wl, "pipe queue full: %u unread messages (limit %u)", e->queued,
			 cfg->pipe_queue_max);
		return -ENOBUFS;
	}
	if (e->queued_bytes + tail_len > cfg->pipe_queue_bytes) {
		snprintf(why, wl, "pipe queue full: %llu unread inline bytes (limit %llu)",
			 (unsigned long long)e->queued_bytes,
			 (unsigned long long)cfg->pipe_queue_bytes);
		return -ENOBUFS;
	}
	return 0;
}

void tpd_pipe_write(struct tpd_pipe_end *e, Tpw__V1__ClientMsg *cm, const uint8_t *tail,
		    uint32_t tail_len)
{
	const Tpw__V1__Write *w = cm->write;
	struct tpd_pipe_end *r = tpd_pipe_end_peer(e);
	struct tpd_msg *m = NULL;
	char why[192] = "";
	int err;

	if (end_dying(r)) {
		Tpw__V1__Status g = end_gone_status(r);
		write_reject(e, w->write_id, tpw_status_to_errno(g), why_text(e->pipe, g));
		goto out;
	}
	if (e->pipe->connecting) {
		xpipe_hold(e, cm, tail, tail_len);
		return;
	}
	err = queue_check(e, tail_len, why, sizeof(why));
	if (err < 0)
		goto reject;
	m = calloc(1, sizeof(*m));
	err = -ENOMEM;
	if (!m)
		goto reject;
	tpu_list_init(&m->wnode);
	tpu_list_init(&m->rnode);
	m->from = e;
	m->write_id = w->write_id;
	err = msg_resolve(m, e->session, w, tail, why, sizeof(why));
	if (err < 0)
		goto reject;
	m->msg_id = ++e->next_msg_id;
	m->tail_len = tail_len;
	err = send_descriptor(r, m, w);
	if (err < 0)
		goto reject;
	tpu_list_insert_tail(&e->wq, &m->wnode);
	tpu_list_insert_tail(&e->rq, &m->rnode);
	e->queued++;
	e->queued_bytes += tail_len;
	if (m->eager) {
		/* The bytes now travel with the descriptor; the writer's memory is free. */
		msg_set_write(m, TPW__V1__STATUS__STATUS_OK, NULL);
		e->pipe->channels |= 1u << tpb_index("basic");
		tpd_stats_record(&e->pipe->d->stats, tpb_index("basic"), m->bytes, 0, false);
		write_done_flush(e);
	} else if (tail_len) {
		/* Rendezvous with some inline parts: keep a copy of the tail, re-point sources. */
		m->tail = malloc(tail_len);
		if (!m->tail) {
			msg_consumed(m, TPW__V1__STATUS__STATUS_IO, "out of memory");
			goto out;
		}
		memcpy(m->tail, tail, tail_len);
		for (size_t i = 0; i < m->n_src; i++) {
			uint64_t a = m->src[i].mem.addr, t = (uint64_t)(uintptr_t)tail;
			if (!m->src[i].buf && m->src[i].mem.loc == TPB_LOC_LOCAL && a >= t &&
			    a <= t + tail_len)
				m->src[i].mem.addr = (uint64_t)(uintptr_t)m->tail + (a - t);
		}
	}
	goto out;
reject:
	pipe_log(e->pipe, e->session, TPU_LOG_INFO, "write rejected: %s",
		 why[0] ? why : strerror(-err));
	if (m)
		msg_free(m);
	write_reject(e, w->write_id, err, why[0] ? why : strerror(-err));
out:
	tpw_client_msg_free(cm);
}

/* ---- reads --------------------------------------------------------------------------------- */

static void start_next_copy(struct tpd_pipe_end *w);
static void end_owed_maybe(struct tpd_pipe_end *e);
static int xh_start(struct tpd_msg *m);
static int xh_build_recv(struct tpd_msg *m, struct tpd_session *s, const Tpw__V1__Read *rd,
			 char *why, size_t wl);


/*
 * A copy that fails because a process vanished (ESRCH: it has no memory left) or whose end is
 * already going away is the peer dying, not a bad address: say so to the survivor.
 */
static void classify_failure(struct tpd_copy_job *job, const struct tpd_pipe_end *w,
			     const struct tpd_pipe_end *r)
{
	if (job->status == 0 && end_dying(w)) {
		/* The writer was told its write was canceled and may have reused the memory
		 * while it was copied: the reader must not take these bytes as good. */
		job->status = tpw_status_to_errno(end_gone_status(w));
		snprintf(job->why, sizeof(job->why), "%s during the transfer",
			 gone_text(end_gone_status(w)));
		return;
	}
	if (job->status == 0 || job->status == -ECANCELED)
		return;
	if (job->status == -ESRCH || end_dying(w) || end_dying(r)) {
		job->status = -ECONNRESET;
		snprintf(job->why, sizeof(job->why), "peer died during the transfer");
	}
}

static void copy_on_done(struct tpd_copy_job *job)
{
	struct tpd_msg *m = job->arg;
	struct tpd_pipe_end *w = m->from;
	struct tpd_pipe_end *r = tpd_pipe_end_peer(w);
	struct tpd_pipe *p = w->pipe;
	Tpw__V1__Status st;

	classify_failure(job, w, r);
	st = tpw_status_from_errno(job->status);

	m->job = NULL;
	m->copying = false;
	w->copying--;
	p->jobs--;
	for (size_t i = 0; i < job->n; i++) {
		p->channels |= 1u << job->channels[i];
		tpd_stats_record(&p->d->stats, job->channels[i], job->xfers[i].len, job->ns[i],
				 job->status < 0);
	}
	if (job->status < 0)
		pipe_log(p, NULL, TPU_LOG_INFO, "message %llu: %s", (unsigned long long)m->msg_id,
			 job->why);
	send_read_done(r, m->msg_id, st, job->status < 0 ? job->why : NULL);
	if (job->status == 0 && !r->session)
		msg_consumed(m, r->gone, why_text(p, r->gone));
	else
		msg_consumed(m, st, job->status < 0 ? job->why : NULL);
	tpd_copy_job_free(job);
	start_next_copy(w);
	end_owed_maybe(w);
	end_owed_maybe(r);
	pipe_maybe_free(p);
}

/*
 * Starts the copies of @w's messages the reader has asked for, in order. On one host one copy
 * job runs at a time per pipe direction (the copier spreads it over its threads). Across hosts
 * up to XH_INFLIGHT sends or receives run at once, so that the control round trip before one
 * message's bytes move overlaps the bytes of the previous ones; the stripe serves them in order,
 * and completions reach clients in order whatever order they finish in (WriteDone by the
 * writer's queue, ReadDone by the client library's).
 */
#define XH_INFLIGHT 8

static void start_next_copy(struct tpd_pipe_end *w)
{
	struct tpd_msg *m, *tmp;

	tpu_list_for_each_safe(m, tmp, &w->rq, rnode) {
		if (!m->read_requested || w->copying >= XH_INFLIGHT)
			return;
		if (m->copying)
			continue;
		if (m->xh) {
			if (xh_start(m) < 0)
				return; /* failed at once: its completion went on from there */
			continue;
		}
		if (m->job) {
			if (!w->copying) {
				m->copying = true;
				w->copying++;
				w->pipe->jobs++;
				tpd_copier_submit(w->pipe->d->copier, m->job);
			}
			return;
		}
	}
}

static const Tpw__V1__Segment *read_segment(const Tpw__V1__Read *rd, size_t i)
{
	return i < rd->n_payloads ? rd->payloads[i] : rd->tensors[i - rd->n_payloads];
}

/* Resolves the reader's destination for source @src into @x, taking buffer refs into @job. */
static int resolve_dst(struct tpd_session *s, const Tpw__V1__Segment *seg,
		       const struct msg_src *src, struct tpd_copy_job *job, struct tpb_xfer *x,
		       char *why, size_t wl)
{
	struct tpd_buffer *b;
	void *ptr;

	if (seg->length != src->len) {
		snprintf(why, wl, "allocation of %llu bytes for a segment of %llu",
			 (unsigned long long)seg->length, (unsigned long long)src->len);
		return -EINVAL;
	}
	x->src = src->mem;
	x->len = src->len;
	if (seg->loc_case == TPW__V1__SEGMENT__LOC_CMA_ADDR) {
		if (!s->cma_ok) {
			snprintf(why, wl, "cross-memory attach is not available for this client");
			return -EINVAL;
		}
		x->dst = (struct tpb_mem){ .loc = TPB_LOC_PROCESS, .pid = s->pid,
					   .addr = seg->cma_addr };
		return 0;
	}
	if (seg->loc_case == TPW__V1__SEGMENT__LOC_CUDA) {
		int r = tpd_devmem_resolve(s, seg->cuda, &x->dst, why, wl);
		if (r < 0)
			return r;
		job->maps[job->n_maps++] = x->dst.cuda; /* the job owns these references */
		if (x->dst.event)
			job->maps[job->n_maps++] = x->dst.event;
		return 0;
	}
	if (seg->loc_case != TPW__V1__SEGMENT__LOC_SHM) {
		snprintf(why, wl, "segment of %llu bytes without destination",
			 (unsigned long long)seg->length);
		return -EINVAL;
	}
	b = tpd_session_buffer(s, seg->shm->buf_id, seg->shm->gen);
	if (!b) {
		snprintf(why, wl, "no shared buffer %llu/%llu", (unsigned long long)seg->shm->buf_id,
			 (unsigned long long)seg->shm->gen);
		return -ENOENT;
	}
	if (tpd_buffer_resolve(b, seg->shm->offset, seg->length, &ptr) < 0) {
		snprintf(why, wl, "range %llu+%llu outside shared buffer %llu of %llu bytes",
			 (unsigned long long)seg->shm->offset, (unsigned long long)seg->length,
			 (unsigned long long)seg->shm->buf_id, (unsigned long long)b->size);
		return -ERANGE;
	}
	job->refs[job->n_refs++] = tpd_buffer_ref(b);
	x->dst = (struct tpb_mem){ .loc = TPB_LOC_LOCAL, .addr = (uint64_t)(uintptr_t)ptr };
	return 0;
}

/* Builds the copy job for @m into the reader's allocation @rd. */
/*
 * Segments above CHUNK_SPLIT bytes are copied as CHUNK-byte transfers, so that every copy
 * thread can work on one large tensor at once.
 */
#define CHUNK (2u << 20)
#define CHUNK_SPLIT (4u << 20)

static size_t chunks_of(uint64_t len)
{
	return len <= CHUNK_SPLIT ? (len ? 1 : 0) : (size_t)((len + CHUNK - 1) / CHUNK);
}

static struct tpb_mem mem_at(struct tpb_mem m, uint64_t off)
{
	m.addr += off;
	return m;
}

/* Appends @x to @job as transfers of at most CHUNK bytes (one if it is small). */
static void job_add(struct tpd_copy_job *job, const struct tpb_xfer *x, int channel)
{
	uint64_t step = x->len <= CHUNK_SPLIT ? x->len : CHUNK;

	for (uint64_t off = 0; off < x->len; off += step) {
		struct tpb_xfer *c = &job->xfers[job->n];

		c->src = mem_at(x->src, off);
		c->dst = mem_at(x->dst, off);
		c->len = TPU_MIN(step, x->len - off);
		job->channels[job->n++] = channel;
	}
	job->bytes += x->len;
}

/* The job keeps the source's CUDA mappings alive even if the message goes first. */
static void job_hold_cuda(struct tpd_copy_job *job, const struct tpb_mem *m)
{
	if (m->loc != TPB_LOC_CUDA)
		return;
	job->maps[job->n_maps++] = tpb_cuda_map_ref(m->cuda);
	if (m->event)
		job->maps[job->n_maps++] = tpb_cuda_map_ref(m->event);
}

/* Builds the copy job for @m into the reader's allocation @rd. */
static int build_job(struct tpd_msg *m, struct tpd_session *s, const Tpw__V1__Read *rd,
		     struct tpd_copy_job **ret, char *why, size_t wl)
{
	struct tpd_copy_job *job;
	size_t n = rd->n_payloads + rd->n_tensors, n_xfers = 0;

	if (n != m->n_src) {
		snprintf(why, wl, "allocation has %zu segments, message has %zu", n, m->n_src);
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++)
		n_xfers += chunks_of(m->src[i].len);
	job = tpd_copy_job_new(n_xfers, 2 * n);
	if (!job)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const struct msg_src *src = &m->src[i];
		struct tpb_xfer x;
		int r, channel;

		if (src->len == 0)
			continue;
		r = resolve_dst(s, read_segment(rd, i), src, job, &x, why, wl);
		if (r < 0) {
			tpd_copy_job_free(job);
			return r;
		}
		if (src->buf)
			job->refs[job->n_refs++] = tpd_buffer_ref(src->buf);
		job_hold_cuda(job, &src->mem);
		channel = tpb_select(x.src.loc, x.dst.loc);
		if (channel < 0) {
			snprintf(why, wl, "no channel can copy this segment on this host");
			tpd_copy_job_free(job);
			return -EOPNOTSUPP;
		}
		job_add(job, &x, channel);
		pair_record(m->from->pipe, x.src.loc, x.dst.loc, channel);
	}
	job->done = copy_on_done;
	job->arg = m;
	*ret = job;
	return 0;
}

/* Finds the message a Read from @r refers to: the oldest one not yet asked for. */
static struct tpd_msg *next_unread(struct tpd_pipe_end *w)
{
	struct tpd_msg *m;

	tpu_list_for_each(m, &w->rq, rnode)
		if (!m->read_requested)
			return m;
	return NULL;
}

void tpd_pipe_read(struct tpd_pipe_end *r, const Tpw__V1__Read *rd)
{
	struct tpd_pipe_end *w = tpd_pipe_end_peer(r);
	struct tpd_msg *m = next_unread(w);
	char why[192] = "";
	int err;

	if (!m || m->msg_id != rd->msg_id) {
		snprintf(why, sizeof(why), "read of message %llu, expected %llu",
			 (unsigned long long)rd->msg_id, m ? (unsigned long long)m->msg_id : 0ull);
		err = -EINVAL;
		goto fail;
	}
	if (rd->ack_eager || rd->discard) {
		if (rd->ack_eager && !m->eager) {
			snprintf(why, sizeof(why), "eager acknowledgement of a rendezvous message");
			err = -EINVAL;
			goto fail;
		}
		m->read_requested = true;
		if (rd->discard)
			send_read_done(r, m->msg_id, TPW__V1__STATUS__STATUS_OK, NULL);
		msg_consumed(m, TPW__V1__STATUS__STATUS_OK, NULL);
		return;
	}
	if (m->eager) {
		snprintf(why, sizeof(why), "allocation for an eager message");
		err = -EINVAL;
		goto fail;
	}
	m->read_requested = true;
	if (!end_attached(w)) {
		send_read_done(r, m->msg_id, w->gone, why_text(r->pipe, w->gone));
		msg_consumed(m, w->gone, why_text(r->pipe, w->gone));
		return;
	}
	if (w->remote)
		err = xh_build_recv(m, r->session, rd, why, sizeof(why));
	else
		err = build_job(m, r->session, rd, &m->job, why, sizeof(why));
	if (err < 0) {
		pipe_log(r->pipe, r->session, TPU_LOG_INFO, "read rejected: %s", why);
		send_read_done(r, m->msg_id, tpw_status_from_errno(err), why);
		msg_consumed(m, tpw_status_from_errno(err), why);
		return;
	}
	start_next_copy(w);
	return;
fail:
	pipe_log(r->pipe, r->session, TPU_LOG_INFO, "%s", why);
	send_read_done(r, rd->msg_id, tpw_status_from_errno(err), why);
}

/* ---- closing ------------------------------------------------------------------------------- */

static struct tpd_session *find_session(struct tpd_daemon *d, uint64_t id)
{
	struct tpd_session *s;

	tpu_list_for_each(s, &d->sessions, node)
		if (s->id == id)
			return s->dead ? NULL : s;
	return NULL;
}

/*
 * Sends the PipeClosed owed to @e's session once no copy reads or writes @e's memory: only
 * then may its client treat the buffers of its pending operations as free again.
 */
static void end_owed_maybe(struct tpd_pipe_end *e)
{
	Tpw__V1__PipeClosed pc = TPW__V1__PIPE_CLOSED__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	struct tpd_session *s;

	if (!e->owed || e->copying || tpd_pipe_end_peer(e)->copying)
		return;
	s = find_session(e->pipe->d, e->owed_session);
	pc.pipe_id = e->local_id;
	pc.status = e->owed;
	pc.message = e->owed == TPW__V1__STATUS__STATUS_CANCELED
			     ? "closed"
			     : (char *)why_text(e->pipe, e->owed);
	e->owed = TPW__V1__STATUS__STATUS_UNSPECIFIED;
	if (!s)
		return;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_PIPE_CLOSED;
	dm.pipe_closed = &pc;
	tpd_session_send(s, &dm, NULL, 0);
}

static void xpipe_local_left(struct tpd_pipe *p, Tpw__V1__Status why);
static void xh_cancel(struct tpd_xh *xh);

void tpd_pipe_end_detach(struct tpd_pipe_end *e, Tpw__V1__Status why)
{
	struct tpd_pipe_end *peer = tpd_pipe_end_peer(e);
	struct tpd_pipe *p = e->pipe;
	struct tpd_msg *m, *tmp;

	if (!end_attached(e))
		return;
	pipe_log(p, e->session, TPU_LOG_INFO, "%s end left (%s)", e->remote ? "remote" : "local",
		 tpw_status_name(why));
	e->session = NULL;
	e->gone = why;
	if (peer->remote)
		xpipe_local_left(p, why);
	/* Writes of @e: nobody waits for their completion any more. Rendezvous reads the peer
	 * already asked for fail now; eager messages stay readable. */
	tpu_list_for_each_safe(m, tmp, &e->wq, wnode) {
		tpu_list_remove(&m->wnode);
		msg_maybe_free(m);
	}
	tpu_list_for_each_safe(m, tmp, &e->rq, rnode) {
		if (m->read_requested && !m->copying && !m->eager) {
			send_read_done(peer, m->msg_id, why, why_text(p, why));
			msg_consumed(m, why, why_text(p, why));
		} else if (m->copying && m->xh) {
			xh_cancel(m->xh); /* completes, failed, once no thread touches the memory */
		}
	}
	/* Messages the peer wrote to @e will never be read. */
	tpu_list_for_each_safe(m, tmp, &peer->rq, rnode)
		if (!m->copying)
			msg_consumed(m, why, why_text(p, why));
		else if (m->xh)
			xh_cancel(m->xh);
	if (peer->session) {
		peer->owed = why;
		peer->owed_session = peer->session->id;
	}
	end_owed_maybe(peer);
	end_owed_maybe(e);
	pipe_maybe_free(p);
}

void tpd_pipe_end_close(struct tpd_pipe_end *e)
{
	if (!e->session)
		return;
	e->owed = TPW__V1__STATUS__STATUS_CANCELED;
	e->owed_session = e->session->id;
	tpd_pipe_end_detach(e, TPW__V1__STATUS__STATUS_CLOSED);
}

/* ---- cross-host pipes ---------------------------------------------------------------------- */

/*
 * The send (writer's daemon) or receive (reader's daemon) of one message over the link's
 * stripe. A send reads the writer's sources; a receive writes the reader's allocation and holds
 * references to its shared buffers. Either marks its message and writer end as copying until
 * its done callback, so that close acknowledgements wait for it.
 */
struct tpd_xh {
	struct tpd_stripe_xfer x;
	struct tpd_stripe_seg *segs;
	struct tpd_copy_job *holder; /* receive: buffer references of the destination */
	struct tpd_msg *m;
	struct tpd_peer *link;
	bool send;
	bool started;
	Tpw__V1__Status early; /* send: the reader finished (failed) before the send ended */
	char early_why[160];
	/* cuda_gdr. Send: the reader's RDMA offer (a copy of its PeerReadReq), gdr once the
	 * writes run. Receive: the offered registration, gdr once the sender said it wrote. */
	Tpw__V1__PeerReadReq *offer;
	struct tpd_gdr_recv *gdr_recv;
	bool gdr;
	int gdr_status;
	uint64_t gdr_bytes;
	char gdr_why[160];
};

struct held_write {
	struct tpu_list node;
	Tpw__V1__ClientMsg *cm;
	uint8_t *tail;
	uint32_t tail_len;
};

static struct tpd_pipe_end *remote_end(struct tpd_pipe *p)
{
	return p->end[0].remote ? &p->end[0] : &p->end[1];
}

static struct tpd_pipe_end *local_end(struct tpd_pipe *p)
{
	return p->end[0].remote ? &p->end[1] : &p->end[0];
}

static void peer_tell(struct tpd_pipe *p, Tpw__V1__PeerMsg *pm, const struct iovec *iov, int n)
{
	if (p->link)
		tpd_peer_send(p->link, pm, iov, n);
}

static void tell_close(struct tpd_peer *link, uint64_t remote_id, Tpw__V1__Status st,
		       const char *why)
{
	Tpw__V1__PeerPipeClose pc = TPW__V1__PEER_PIPE_CLOSE__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;

	pc.pipe_id = remote_id;
	pc.status = st;
	pc.message = (char *)why;
	pm.body_case = TPW__V1__PEER_MSG__BODY_PIPE_CLOSE;
	pm.pipe_close = &pc;
	tpd_peer_send(link, &pm, NULL, 0);
}

static void peer_consumed(struct tpd_msg *m, Tpw__V1__Status st, const char *why)
{
	Tpw__V1__PeerConsumed c = TPW__V1__PEER_CONSUMED__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	struct tpd_pipe *p = m->from->pipe;

	if (!p->remote_id || !end_attached(m->from))
		return; /* the writer's end is gone there: nobody waits */
	c.pipe_id = p->remote_id;
	c.msg_id = m->msg_id;
	c.status = st;
	c.message = why && *why ? (char *)why : NULL;
	pm.body_case = TPW__V1__PEER_MSG__BODY_CONSUMED;
	pm.consumed = &c;
	peer_tell(p, &pm, NULL, 0);
}

static void xh_free(struct tpd_xh *xh)
{
	if (!xh)
		return;
	tpd_copy_job_free(xh->holder);
	tpd_gdr_recv_free(xh->gdr_recv);
	if (xh->offer)
		tpw__v1__peer_read_req__free_unpacked(xh->offer, NULL);
	free(xh->segs);
	free(xh);
}

static void xh_cancel(struct tpd_xh *xh)
{
	struct tpd_stripe *st;

	if (!xh->started || !xh->link)
		return;
	if (xh->send && xh->gdr) {
		if (tpd_peer_gdr(xh->link))
			tpd_gdr_send_cancel(tpd_peer_gdr(xh->link), &xh->x);
		return;
	}
	st = tpd_peer_stripe(xh->link);
	if (!st)
		return;
	if (xh->send)
		tpd_stripe_send_cancel(st, &xh->x);
	else
		tpd_stripe_recv_cancel(st, &xh->x);
}

/* Common end of a send or receive: flags, statistics, next message. */
static void xh_finish(struct tpd_msg *m, struct tpd_xh *xh)
{
	struct tpd_pipe *p = m->from->pipe;
	int ch = tpb_index(xh->gdr ? "cuda_gdr" : "mpt");

	m->xh = NULL;
	m->copying = false;
	m->from->copying--;
	p->jobs--;
	if (ch >= 0) {
		p->channels |= 1u << ch;
		tpd_stats_record(&p->d->stats, ch, xh->x.bytes, xh->x.ns, xh->x.status < 0);
	}
	for (size_t i = 0; i < xh->x.n_segs && !xh->gdr; i++)
		if (xh->segs[i].mem.loc == TPB_LOC_CUDA) /* staged through the stripe's buffers */
			p->channels |= 1u << tpb_index("cuda_basic");
	/* The reader's daemon knows both ends of each segment: CUDA pairs show as such. */
	for (size_t i = 0; i < xh->x.n_segs && !xh->send && xh->x.status == 0; i++) {
		enum tpb_loc src = m->src[i].remote_cuda ? TPB_LOC_CUDA : TPB_LOC_LOCAL;
		enum tpb_loc dst = xh->segs[i].mem.loc;
		bool cuda = src == TPB_LOC_CUDA || dst == TPB_LOC_CUDA;

		if (cuda && xh->segs[i].len)
			pair_record(p, src, dst, tpb_index(xh->gdr ? "cuda_gdr" : "cuda_basic"));
	}
	xh_free(xh);
}

static void xh_after(struct tpd_pipe_end *w)
{
	struct tpd_pipe *p = w->pipe;

	start_next_copy(w);
	end_owed_maybe(w);
	end_owed_maybe(tpd_pipe_end_peer(w));
	pipe_maybe_free(p);
}

/* Tells the reader's daemon that transfer @xfer_id ended with @st (@why: NULL when OK). */
static void tell_xfer_end(struct tpd_pipe *p, uint64_t xfer_id, Tpw__V1__Status st, const char *why,
			  uint64_t bytes, bool rdma)
{
	Tpw__V1__PeerXferEnd xe = TPW__V1__PEER_XFER_END__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;

	xe.xfer_id = xfer_id;
	xe.status = st;
	xe.message = (char *)why;
	xe.bytes = bytes;
	xe.rdma = rdma;
	pm.body_case = TPW__V1__PEER_MSG__BODY_XFER_END;
	pm.xfer_end = &xe;
	peer_tell(p, &pm, NULL, 0);
}

static void xh_send_done(struct tpd_stripe_xfer *x)
{
	struct tpd_xh *xh = x->arg;
	struct tpd_msg *m = xh->m;
	struct tpd_pipe_end *w = m->from;
	Tpw__V1__Status st = tpw_status_from_errno(x->status);
	Tpw__V1__Status early;
	char why[160], early_why[160];

	if (xh->started)
		w->pipe->d->xh_running--;
	snprintf(why, sizeof(why), "%s", x->status < 0 ? x->why : "");
	if (end_dying(w)) {
		/* The writer was told its write was canceled and may reuse the memory. */
		st = end_gone_status(w);
		snprintf(why, sizeof(why), "%s during the transfer", gone_text(st));
	} else if (x->status < 0 && end_dying(tpd_pipe_end_peer(w))) {
		st = end_gone_status(tpd_pipe_end_peer(w));
		snprintf(why, sizeof(why), "%.150s", why_text(w->pipe, st));
	} else if (x->status == -ESRCH) {
		st = TPW__V1__STATUS__STATUS_PEER_DIED;
		snprintf(why, sizeof(why), "writer died during the transfer");
	}
	tell_xfer_end(w->pipe, x->xfer_id, st, why[0] ? why : NULL, x->bytes, xh->gdr);
	if (st != TPW__V1__STATUS__STATUS_OK)
		pipe_log(w->pipe, NULL, TPU_LOG_INFO, "message %llu: send failed: %s",
			 (unsigned long long)m->msg_id, why);
	early = xh->early;
	snprintf(early_why, sizeof(early_why), "%s", xh->early_why);
	xh_finish(m, xh); /* frees @xh */
	if (early)
		msg_consumed(m, early, early_why);
	else if (st != TPW__V1__STATUS__STATUS_OK)
		msg_consumed(m, st, why);
	/* else: the write completes when the reader's daemon says PeerConsumed. */
	xh_after(w);
}

static void xh_recv_done(struct tpd_stripe_xfer *x)
{
	struct tpd_xh *xh = x->arg;
	struct tpd_msg *m = xh->m;
	struct tpd_pipe_end *w = m->from, *r = tpd_pipe_end_peer(w);
	int status = x->status;
	char why[160];

	if (xh->started)
		w->pipe->d->xh_running--;
	snprintf(why, sizeof(why), "%s", status < 0 ? x->why : "");
	if (xh->gdr && (status == 0 || status == -ECANCELED)) {
		/* The sender RDMA-wrote the bytes; the stripe's registration was only dropped. */
		status = x->status = xh->gdr_status;
		x->bytes = status == 0 ? xh->gdr_bytes : 0;
		if (xh->link)
			tpd_gdr_link_received(tpd_peer_gdr(xh->link), x->bytes);
		snprintf(why, sizeof(why), "%s", xh->gdr_why);
	}
	if (xh->link)
		tpd_peer_xfer_drop(xh->link, x->xfer_id);
	if ((status == 0 || status == -ECANCELED || status == -ECONNRESET) && end_dying(w)) {
		/* The writer's end went away: its bytes may be torn, never deliver them. */
		status = tpw_status_to_errno(end_gone_status(w));
		snprintf(why, sizeof(why), "%.120s during the transfer",
			 why_text(w->pipe, end_gone_status(w)));
	} else if (status == -ESRCH || (status < 0 && end_dying(r))) {
		status = -ECONNRESET;
		snprintf(why, sizeof(why), "reader died during the transfer");
	}
	if (status < 0)
		pipe_log(w->pipe, NULL, TPU_LOG_INFO, "message %llu: receive failed: %s",
			 (unsigned long long)m->msg_id, why);
	xh_finish(m, xh);
	send_read_done(r, m->msg_id, tpw_status_from_errno(status), status < 0 ? why : NULL);
	msg_consumed(m, tpw_status_from_errno(status), status < 0 ? why : NULL);
	xh_after(w);
}

/* Written on another host with a tensor in CUDA memory there. */
static bool msg_remote_cuda(const struct tpd_msg *m)
{
	for (size_t i = 0; i < m->n_src; i++)
		if (m->src[i].remote_cuda)
			return true;
	return false;
}

/*
 * Receive: asks the writer's daemon for the bytes, with the RDMA offer if there is one. Runs
 * at once without an offer, or once the offer's registration is ready (@err < 0: it failed,
 * so ask without).
 */
static void xh_gdr_ready(void *arg, int err, const char *why)
{
	Tpw__V1__PeerReadReq rr = TPW__V1__PEER_READ_REQ__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	struct tpd_xh *xh = arg;
	struct tpd_pipe *p = xh->m->from->pipe;

	if (err < 0) {
		pipe_log(p, NULL, TPU_LOG_INFO, "message %llu: not over RDMA: %s",
			 (unsigned long long)xh->m->msg_id, why);
		tpd_gdr_recv_free(xh->gdr_recv);
		xh->gdr_recv = NULL;
	}
	rr.pipe_id = p->remote_id;
	rr.msg_id = xh->m->msg_id;
	rr.xfer_id = xh->x.xfer_id;
	if (xh->gdr_recv)
		tpd_gdr_recv_offer(xh->gdr_recv, &rr);
	pm.body_case = TPW__V1__PEER_MSG__BODY_READ_REQ;
	pm.read_req = &rr;
	peer_tell(p, &pm, NULL, 0);
}

/* Send: RDMA-writes @xh if the reader offered it and this side can. Return: 0 or -errno. */
static int xh_send_gdr(struct tpd_xh *xh)
{
	struct tpd_pipe *p = xh->m->from->pipe;
	char why[160] = "";
	int r;

	if (!xh->offer)
		return -EOPNOTSUPP;
	r = tpd_gdr_send(tpd_peer_gdr(xh->link), &xh->x, xh->offer, why, sizeof(why));
	if (r < 0)
		pipe_log(p, NULL, r == -EPROTO ? TPU_LOG_WARNING : TPU_LOG_INFO,
			 "message %llu: not over RDMA: %s", (unsigned long long)xh->m->msg_id,
			 why);
	xh->gdr = r == 0;
	return r;
}

/* Starts @m's send or receive. Return: 0, or -errno when it failed at once and has completed. */
static int xh_start(struct tpd_msg *m)
{
	struct tpd_xh *xh = m->xh;
	struct tpd_pipe_end *w = m->from;
	struct tpd_pipe *p = w->pipe;
	int r = -ENOTCONN;

	m->copying = true;
	w->copying++;
	p->jobs++;
	xh->link = p->link;
	xh->x.arg = xh;
	if (xh->link && xh->send) {
		xh->x.done = xh_send_done;
		r = xh_send_gdr(xh);
		if (r < 0)
			r = tpd_stripe_send(tpd_peer_stripe(xh->link), &xh->x);
	} else if (xh->link) {
		char why[160];

		xh->x.done = xh_recv_done;
		xh->x.xfer_id = tpd_peer_xfer_add(xh->link, xh);
		r = xh->x.xfer_id ? tpd_stripe_recv(tpd_peer_stripe(xh->link), &xh->x) : -ENOMEM;
		if (r == 0 && tpd_gdr_recv_new(tpd_peer_gdr(xh->link), xh->segs, xh->x.n_segs,
					       msg_remote_cuda(m), xh_gdr_ready, xh, &xh->gdr_recv,
					       why, sizeof(why)) < 0) {
			xh_gdr_ready(xh, 0, NULL); /* no offer: ask for the bytes at once */
		} else if (r < 0 && xh->x.xfer_id) {
			tpd_peer_xfer_drop(xh->link, xh->x.xfer_id);
		}
	}
	if (r == 0) {
		xh->started = true;
		p->d->xh_running++;
		return 0;
	}
	/* Not started: the link is gone or going (its pipes learn why next). */
	r = r == -ENOTCONN ? -ECONNRESET : r;
	xh->x.status = r;
	snprintf(xh->x.why, sizeof(xh->x.why), "peer link down");
	xh->x.done(&xh->x); /* frees @xh */
	return r;
}

static struct tpd_xh *xh_new(struct tpd_msg *m, bool send)
{
	struct tpd_xh *xh = calloc(1, sizeof(*xh));

	if (!xh)
		return NULL;
	xh->segs = calloc(m->n_src ? m->n_src : 1, sizeof(*xh->segs));
	if (!xh->segs) {
		free(xh);
		return NULL;
	}
	xh->m = m;
	xh->send = send;
	xh->x.segs = xh->segs;
	xh->x.n_segs = m->n_src;
	return xh;
}

/* The reader's allocation @rd for message @m of a remote writer: a receive, started in turn. */
static int xh_build_recv(struct tpd_msg *m, struct tpd_session *s, const Tpw__V1__Read *rd,
			 char *why, size_t wl)
{
	size_t n = rd->n_payloads + rd->n_tensors;
	struct tpd_xh *xh;

	if (n != m->n_src) {
		snprintf(why, wl, "allocation has %zu segments, message has %zu", n, m->n_src);
		return -EINVAL;
	}
	xh = xh_new(m, false);
	if (!xh || !(xh->holder = tpd_copy_job_new(1, n))) {
		xh_free(xh);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		struct tpb_xfer x;
		int r;

		if (m->src[i].len == 0)
			continue;
		r = resolve_dst(s, read_segment(rd, i), &m->src[i], xh->holder, &x, why, wl);
		if (r < 0) {
			xh_free(xh);
			return r;
		}
		xh->segs[i].mem = x.dst;
		xh->segs[i].len = x.len;
	}
	m->xh = xh;
	return 0;
}

static void held_free(struct held_write *h)
{
	tpu_list_remove(&h->node);
	tpw_client_msg_free(h->cm);
	free(h->tail);
	free(h);
}

/* A write on a pipe still connecting: keep it (within the queue limits) for later. */
static void xpipe_hold(struct tpd_pipe_end *e, Tpw__V1__ClientMsg *cm, const uint8_t *tail,
		       uint32_t tail_len)
{
	struct tpd_pipe *p = e->pipe;
	const struct tpd_config *cfg = &p->d->cfg;
	struct held_write *h;

	if (p->n_held >= cfg->pipe_queue_max || p->held_bytes + tail_len > cfg->pipe_queue_bytes) {
		write_reject(e, cm->write->write_id, -ENOBUFS,
			     "pipe queue full while the connect is pending");
		tpw_client_msg_free(cm);
		return;
	}
	h = calloc(1, sizeof(*h));
	if (!h || (tail_len && !(h->tail = malloc(tail_len)))) {
		free(h);
		write_reject(e, cm->write->write_id, -ENOMEM, "out of memory");
		tpw_client_msg_free(cm);
		return;
	}
	h->cm = cm;
	h->tail_len = tail_len;
	if (tail_len)
		memcpy(h->tail, tail, tail_len);
	tpu_list_insert_tail(&p->held, &h->node);
	p->n_held++;
	p->held_bytes += tail_len;
}

/* Replays (or with @err, rejects) the writes held while connecting, in order. */
static void held_flush(struct tpd_pipe *p, int err, const char *why)
{
	struct tpd_pipe_end *e = local_end(p);

	while (!tpu_list_empty(&p->held)) {
		struct held_write *h = tpu_list_first(&p->held, struct held_write, node);
		tpu_list_remove(&h->node);
		if (err == 0 && e->session) {
			tpd_pipe_write(e, h->cm, h->tail, h->tail_len); /* takes h->cm */
			h->cm = NULL;
		} else if (e->session) {
			write_reject(e, h->cm->write->write_id, err, why);
		}
		tpu_list_init(&h->node);
		held_free(h);
	}
	p->n_held = 0;
	p->held_bytes = 0;
}

/* Frees the cross-host state of @p (pipe_maybe_free). */
static void xpipe_done(struct tpd_pipe *p)
{
	while (p->held.next && !tpu_list_empty(&p->held))
		held_free(tpu_list_first(&p->held, struct held_write, node));
	if (p->ev_connect)
		event_free(p->ev_connect);
	p->ev_connect = NULL;
	if (p->link)
		tpd_peer_pipe_remove(p->link, p);
	p->link = NULL;
}

/* The connect of @p failed: answer the client, reject held writes, end the pipe. */
static void xconnect_fail(struct tpd_pipe *p, int err, const char *why)
{
	struct tpd_pipe_end *e = local_end(p), *re = remote_end(p);
	struct tpd_session *s = e->session;
	Tpw__V1__Connect c = TPW__V1__CONNECT__INIT;
	char addr[320];

	p->connecting = false;
	re->gone = tpw_status_from_errno(err);
	snprintf(p->why, sizeof(p->why), "%s", why);
	if (!s) {
		pipe_maybe_free(p);
		return;
	}
	snprintf(addr, sizeof(addr), "tpip://%s/%s", p->peer_addr, p->listener);
	c.req_id = p->connect_req_id;
	c.pipe_id = e->local_id;
	c.address = addr;
	held_flush(p, err, why);
	tpu_hmap_del(&s->pipes, e->local_id);
	e->session = NULL;
	connect_fail(s, &c, err, why);
	pipe_maybe_free(p);
}

static void xpipe_on_connect_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_pipe *p = arg;
	char why[200];

	if (!p->connecting)
		return;
	snprintf(why, sizeof(why), "no answer from tpipd at %.120s within %u ms", p->peer_addr,
		 p->d->cfg.peer_connect_timeout_ms);
	xconnect_fail(p, -ETIMEDOUT, why);
}

/* Parses tpip://HOST[:PORT]/NAME. */
static int parse_tpip(const char *a, uint16_t def_port, char *host, size_t hl, uint16_t *port,
		      const char **name)
{
	const char *h = a + 7, *slash, *hend, *pstart = NULL;
	unsigned long pv = def_port;

	if (*h == '[') {
		hend = strchr(h, ']');
		if (!hend)
			return -EINVAL;
		h++;
		if (hend[1] == ':')
			pstart = hend + 2;
		else if (hend[1] != '/')
			return -EINVAL;
	} else {
		hend = h + strcspn(h, ":/");
		if (*hend == ':')
			pstart = hend + 1;
	}
	slash = strchr(pstart ? pstart : hend, '/');
	if (!slash || hend == h || (size_t)(hend - h) >= hl)
		return -EINVAL;
	if (pstart) {
		char *end;
		pv = strtoul(pstart, &end, 10);
		if (end != slash || pv == 0 || pv > 65535)
			return -EINVAL;
	}
	memcpy(host, h, (size_t)(hend - h));
	host[hend - h] = '\0';
	*port = (uint16_t)pv;
	*name = slash + 1;
	return tpw_name_valid(*name) ? 0 : -EINVAL;
}

static void xpipe_connect(struct tpd_daemon *d, struct tpd_session *s, const Tpw__V1__Connect *c)
{
	struct tpd_peer *pr = NULL;
	struct tpd_pipe *p;
	const char *name;
	char host[256], why[240];
	uint16_t port;
	int r;

	if (parse_tpip(c->address, (uint16_t)d->cfg.peer_port, host, sizeof(host), &port, &name) <
	    0) {
		snprintf(why, sizeof(why), "invalid address '%.150s' (tpip://HOST[:PORT]/NAME)",
			 c->address);
		connect_fail(s, c, -EINVAL, why);
		return;
	}
	if (tpu_hmap_get(&s->pipes, c->pipe_id)) {
		connect_fail(s, c, -EADDRINUSE, "pipe id already in use");
		return;
	}
	if (tpd_session_pipe_count(s) >= d->cfg.pipes_max) {
		snprintf(why, sizeof(why), "pipe limit of %u per client reached", d->cfg.pipes_max);
		connect_fail(s, c, -ENOBUFS, why);
		return;
	}
	r = tpd_peer_get(d, host, port, &pr, why, sizeof(why));
	if (r < 0) {
		connect_fail(s, c, r, why);
		return;
	}
	p = pipe_new(d, name);
	if (!p || !(p->ev_connect = evtimer_new(d->base, xpipe_on_connect_timeout, p))) {
		if (p)
			free(p->listener);
		free(p);
		connect_fail(s, c, -ENOMEM, "out of memory");
		return;
	}
	snprintf(p->peer_addr, sizeof(p->peer_addr), "%s", tpd_peer_name(pr));
	end_init(&p->end[0], p, s, c->pipe_id);
	end_init(&p->end[1], p, NULL, 0);
	p->end[1].remote = true;
	p->link = pr;
	p->connecting = true;
	p->connect_req_id = c->req_id;
	tpu_list_insert_tail(&d->pipes, &p->node);
	d->n_pipes++;
	if (tpu_hmap_put(&s->pipes, c->pipe_id, &p->end[0]) < 0 || tpd_peer_pipe_add(pr, p) < 0) {
		tpu_hmap_del(&s->pipes, c->pipe_id);
		p->end[0].session = NULL;
		p->connecting = false;
		connect_fail(s, c, -ENOMEM, "out of memory");
		pipe_maybe_free(p);
		return;
	}
	{
		struct timeval tv = { d->cfg.peer_connect_timeout_ms / 1000,
				      (d->cfg.peer_connect_timeout_ms % 1000) * 1000 };
		evtimer_add(p->ev_connect, &tv);
	}
	pipe_log(p, s, TPU_LOG_INFO, "connecting to '%s' on %s", name, p->peer_addr);
	if (tpd_peer_is_up(pr))
		tpd_pipe_link_up(p);
}

void tpd_pipe_link_up(struct tpd_pipe *p)
{
	Tpw__V1__PeerConnect pc = TPW__V1__PEER_CONNECT__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	struct tpd_session *s = local_end(p)->session;

	if (!p->connecting || p->connect_sent || !s)
		return;
	pc.pipe_id = p->id;
	pc.name = p->listener;
	pc.remote_name = s->name;
	pc.uid = (uint32_t)s->uid;
	pc.gid = (uint32_t)s->gid;
	pc.pid = (uint32_t)s->pid;
	pm.body_case = TPW__V1__PEER_MSG__BODY_CONNECT;
	pm.connect = &pc;
	peer_tell(p, &pm, NULL, 0);
	p->connect_sent = true;
}

/* The tpip:// address was this daemon's own: connect @p to the local listener instead. */
static void xpipe_reroute_local(struct tpd_pipe *p)
{
	struct tpd_pipe_end *e = local_end(p);
	struct tpd_session *s = e->session;
	struct tpd_listener *l = NULL;
	Tpw__V1__Connect c = TPW__V1__CONNECT__INIT;
	char why[192];
	int r;

	c.req_id = p->connect_req_id;
	c.pipe_id = e->local_id;
	c.address = p->listener;
	tpu_hmap_del(&s->pipes, e->local_id); /* connect_check wants the id free */
	r = connect_check(p->d, s, &c, &l, why, sizeof(why));
	if (r == 0 && tpu_hmap_put(&s->pipes, e->local_id, e) < 0)
		r = -ENOMEM;
	if (r < 0) {
		tpu_hmap_put(&s->pipes, e->local_id, e);
		xconnect_fail(p, r, why);
		return;
	}
	if (p->link)
		tpd_peer_pipe_remove(p->link, p);
	p->link = NULL;
	p->connecting = false;
	event_del(p->ev_connect);
	end_init(&p->end[1], p, l->owner,
		 ACCEPT_ID_BASE + ((struct tpd_session *)l->owner)->next_accept_id++);
	p->end[1].remote = false;
	if (tpu_hmap_put(&((struct tpd_session *)l->owner)->pipes, p->end[1].local_id, &p->end[1]) <
	    0) {
		p->end[1].remote = true;
		p->end[1].session = NULL;
		xconnect_fail(p, -ENOMEM, "out of memory");
		return;
	}
	l->accepted++;
	pipe_log(p, s, TPU_LOG_INFO, "address is this daemon: connected to '%s' locally", l->name);
	tpd_session_reply(s, p->connect_req_id, 0, NULL, e->local_id, l->name);
	send_accepted(l->owner, l, &p->end[1], s);
	held_flush(p, 0, NULL);
}

void tpd_pipe_link_failed(struct tpd_pipe *p, int err, const char *why)
{
	char msg[200];

	if (p->connecting && err == -ELOOP && local_end(p)->session) {
		xpipe_reroute_local(p);
		return;
	}
	if (p->link)
		tpd_peer_pipe_remove(p->link, p);
	p->link = NULL;
	if (p->connecting) {
		snprintf(msg, sizeof(msg), "cannot reach tpipd at %.60s: %.110s", p->peer_addr, why);
		xconnect_fail(p, err == -ECONNRESET ? -EHOSTUNREACH : err, msg);
		return;
	}
	snprintf(p->why, sizeof(p->why), "lost the peer daemon at %.60s: %.110s", p->peer_addr, why);
	tpd_pipe_end_detach(remote_end(p), err == -ESHUTDOWN ? TPW__V1__STATUS__STATUS_SHUTDOWN
							  : TPW__V1__STATUS__STATUS_PEER_DIED);
}

/* The local end of cross-host pipe @p left with @why: tell the peer, stop connecting. */
static void xpipe_local_left(struct tpd_pipe *p, Tpw__V1__Status why)
{
	struct tpd_pipe_end *re = remote_end(p);

	if (p->connecting) {
		/* A later OK reply finds no pipe and closes the peer's side. */
		p->connecting = false;
		re->gone = why;
		while (!tpu_list_empty(&p->held))
			held_free(tpu_list_first(&p->held, struct held_write, node));
		return;
	}
	if (p->link && p->remote_id && end_attached(re))
		tell_close(p->link, p->remote_id, why, NULL);
}

void tpd_pipe_peer_connect(struct tpd_daemon *d, struct tpd_peer *pr,
			   const Tpw__V1__PeerConnect *c)
{
	Tpw__V1__PeerConnectReply rep = TPW__V1__PEER_CONNECT_REPLY__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__Accepted a = TPW__V1__ACCEPTED__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	struct tpd_listener *l = tpd_registry_find(&d->registry, c->name);
	struct tpd_session *ls = l ? l->owner : NULL;
	struct tpd_pipe *p = NULL;
	char why[200] = "";
	int err = 0;

	if (!l) {
		snprintf(why, sizeof(why), "no listener named '%.100s' on %.60s", c->name, d->hostname);
		err = -ENOENT;
	} else if (!tpd_listener_permits(l, c->uid, c->gid, NULL, 0)) {
		snprintf(why, sizeof(why), "listener '%s' refuses uid %u", l->name, c->uid);
		err = -EACCES;
	} else if (tpd_session_pipe_count(ls) >= d->cfg.pipes_max) {
		snprintf(why, sizeof(why), "pipe limit of %u per client reached", d->cfg.pipes_max);
		err = -ENOBUFS;
	} else if (d->stopping) {
		snprintf(why, sizeof(why), "daemon stopping");
		err = -ESHUTDOWN;
	} else if (!(p = pipe_new(d, l->name))) {
		snprintf(why, sizeof(why), "out of memory");
		err = -ENOMEM;
	}
	if (p) {
		snprintf(p->peer_addr, sizeof(p->peer_addr), "%s", tpd_peer_name(pr));
		end_init(&p->end[0], p, NULL, 0);
		p->end[0].remote = true;
		end_init(&p->end[1], p, ls, ACCEPT_ID_BASE + ls->next_accept_id++);
		p->link = pr;
		p->remote_id = c->pipe_id;
		tpu_list_insert_tail(&d->pipes, &p->node);
		d->n_pipes++;
		if (tpu_hmap_put(&ls->pipes, p->end[1].local_id, &p->end[1]) < 0 ||
		    tpd_peer_pipe_add(pr, p) < 0) {
			tpu_hmap_del(&ls->pipes, p->end[1].local_id);
			p->end[1].session = NULL;
			p->end[0].gone = TPW__V1__STATUS__STATUS_IO;
			pipe_maybe_free(p);
			p = NULL;
			snprintf(why, sizeof(why), "out of memory");
			err = -ENOMEM;
		}
	}
	rep.pipe_id = c->pipe_id;
	rep.peer_pipe_id = p ? p->id : 0;
	rep.status = tpw_status_from_errno(err);
	rep.message = why[0] ? why : NULL;
	pm.body_case = TPW__V1__PEER_MSG__BODY_CONNECT_REPLY;
	pm.connect_reply = &rep;
	tpd_peer_send(pr, &pm, NULL, 0);
	if (!p) {
		tpu_log_info("peer %s: connect to '%s' refused: %s", tpd_peer_name(pr), c->name,
			     why);
		return;
	}
	l->accepted++;
	pipe_log(p, ls, TPU_LOG_INFO, "accepted '%s' from %s", c->remote_name ? c->remote_name : "",
		 tpd_peer_name(pr));
	a.listener_id = l->id;
	a.pipe_id = p->end[1].local_id;
	a.remote_name = c->remote_name;
	a.remote_pid = 0; /* a process on another host */
	a.remote_uid = c->uid;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_ACCEPTED;
	dm.accepted = &a;
	tpd_session_send(ls, &dm, NULL, 0);
}

void tpd_pipe_peer_connect_reply(struct tpd_peer *pr, struct tpd_pipe *p,
				 const Tpw__V1__PeerConnectReply *r)
{
	struct tpd_pipe_end *e;
	char why[240];

	if (!p || !p->connecting) {
		/* The pipe ended here before the answer: close the peer's side. */
		if (r->status == TPW__V1__STATUS__STATUS_OK && r->peer_pipe_id)
			tell_close(pr, r->peer_pipe_id, TPW__V1__STATUS__STATUS_CLOSED, NULL);
		return;
	}
	if (r->status != TPW__V1__STATUS__STATUS_OK) {
		snprintf(why, sizeof(why), "%s", r->message ? r->message : tpw_status_name(r->status));
		xconnect_fail(p, tpw_status_to_errno(r->status), why);
		return;
	}
	e = local_end(p);
	p->remote_id = r->peer_pipe_id;
	p->connecting = false;
	event_del(p->ev_connect);
	pipe_log(p, e->session, TPU_LOG_INFO, "connected to '%s' on %s", p->listener, p->peer_addr);
	tpd_session_reply(e->session, p->connect_req_id, 0, NULL, e->local_id, p->listener);
	held_flush(p, 0, NULL);
}

void tpd_pipe_peer_descriptor(struct tpd_pipe *p, const Tpw__V1__Descriptor *dd,
			      const uint8_t *tail, uint32_t tail_len)
{
	struct tpd_pipe_end *w = remote_end(p), *r = local_end(p);
	Tpw__V1__Descriptor out = *dd;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	struct iovec iov = { (void *)tail, tail_len };
	struct tpd_msg *m;

	if (!r->session || end_dying(w) || p->connecting)
		return; /* the reader left: the writer's daemon learns it from our PipeClose */
	m = calloc(1, sizeof(*m));
	if (m)
		m->src = calloc(dd->n_payloads + dd->n_tensors + 1, sizeof(*m->src));
	if (!m || !m->src) {
		if (m)
			free(m);
		tpd_session_fail(r->session, TPU_LOG_ERR, TPW__V1__STATUS__STATUS_IO,
				 "out of memory for a remote message");
		return;
	}
	tpu_list_init(&m->wnode);
	tpu_list_init(&m->rnode);
	m->from = w;
	m->msg_id = dd->msg_id;
	m->eager = dd->eager;
	m->n_src = dd->n_payloads + dd->n_tensors;
	for (size_t i = 0; i < m->n_src; i++) {
		m->src[i].len = i < dd->n_payloads ? dd->payloads[i]->length
						   : dd->tensors[i - dd->n_payloads]->length;
		m->bytes += m->src[i].len;
		if (i >= dd->n_payloads && dd->tensors[i - dd->n_payloads]->device)
			m->src[i].remote_cuda = dd->tensors[i - dd->n_payloads]->device->type ==
						TPW__V1__DEVICE_TYPE__DEVICE_CUDA;
	}
	w->next_msg_id = dd->msg_id;
	tpu_list_insert_tail(&w->rq, &m->rnode);
	w->queued++;
	w->queued_bytes += tail_len;
	m->tail_len = tail_len;
	if (m->eager) {
		int basic = tpb_index("basic");
		p->channels |= 1u << basic;
		tpd_stats_record(&p->d->stats, basic, m->bytes, 0, false);
	}
	out.pipe_id = r->local_id;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR;
	dm.descriptor = &out;
	tpd_session_send(r->session, &dm, &iov, dd->eager && tail_len ? 1 : 0);
}

/* A copy of the reader's RDMA offer in @rr, kept until the send starts; NULL without memory
 * (the send then uses the stripe). */
static Tpw__V1__PeerReadReq *offer_copy(const Tpw__V1__PeerReadReq *rr)
{
	size_t len = tpw__v1__peer_read_req__get_packed_size(rr);
	_cleanup_free_ uint8_t *buf = malloc(len ? len : 1);

	if (!buf)
		return NULL;
	tpw__v1__peer_read_req__pack(rr, buf);
	return tpw__v1__peer_read_req__unpack(NULL, len, buf);
}

void tpd_pipe_peer_read_req(struct tpd_pipe *p, const Tpw__V1__PeerReadReq *rr)
{
	struct tpd_pipe_end *w = local_end(p);
	struct tpd_msg *m;
	struct tpd_xh *xh;

	if (!w->session) {
		tell_xfer_end(p, rr->xfer_id, TPW__V1__STATUS__STATUS_CLOSED,
			      "writer closed the pipe", 0, false);
		return;
	}
	m = next_unread(w);
	if (!m || m->msg_id != rr->msg_id || m->eager) {
		pipe_log(p, NULL, TPU_LOG_WARNING, "peer asked for message %llu, next is %llu",
			 (unsigned long long)rr->msg_id, m ? (unsigned long long)m->msg_id : 0ull);
		tell_xfer_end(p, rr->xfer_id, TPW__V1__STATUS__STATUS_INVALID, "no such message",
			      0, false);
		return;
	}
	xh = xh_new(m, true);
	if (!xh) {
		tell_xfer_end(p, rr->xfer_id, TPW__V1__STATUS__STATUS_IO, "out of memory", 0, false);
		return;
	}
	for (size_t i = 0; i < m->n_src; i++) {
		xh->segs[i].mem = m->src[i].mem;
		xh->segs[i].len = m->src[i].len;
	}
	xh->x.xfer_id = rr->xfer_id;
	if (rr->n_rdma)
		xh->offer = offer_copy(rr);
	m->xh = xh;
	m->read_requested = true;
	start_next_copy(w);
}

void tpd_pipe_peer_xfer_end(struct tpd_peer *pr, void *arg, const Tpw__V1__PeerXferEnd *xe)
{
	struct tpd_xh *xh = arg;
	struct tpd_stripe *st = tpd_peer_stripe(pr);

	if (!st || !xh->started)
		return;
	if (xe->rdma) {
		/* The bytes went by RDMA (only ever into an offer): drop the stripe's receive. */
		xh->gdr = true;
		xh->gdr_status = xh->gdr_recv ? tpw_status_to_errno(xe->status) : -EPROTO;
		xh->gdr_bytes = xe->bytes;
		snprintf(xh->gdr_why, sizeof(xh->gdr_why), "%s",
			 !xh->gdr_recv ? "peer says it RDMA-wrote without an offer"
			 : xe->status ? (xe->message ? xe->message : tpw_status_name(xe->status))
				      : "");
		if (xh->gdr_status == 0 && xe->bytes != xh->x.total) {
			xh->gdr_status = -EPROTO;
			snprintf(xh->gdr_why, sizeof(xh->gdr_why),
				 "peer RDMA-wrote %llu of %llu bytes", (unsigned long long)xe->bytes,
				 (unsigned long long)xh->x.total);
		}
		tpd_stripe_recv_cancel(st, &xh->x);
		return;
	}
	tpd_stripe_recv_expect(st, &xh->x, xe->bytes, tpw_status_to_errno(xe->status),
			       xe->message ? xe->message : tpw_status_name(xe->status));
}

void tpd_pipe_peer_consumed(struct tpd_pipe *p, const Tpw__V1__PeerConsumed *c)
{
	struct tpd_pipe_end *w = local_end(p);
	struct tpd_msg *m;

	tpu_list_for_each(m, &w->rq, rnode) {
		if (m->msg_id != c->msg_id)
			continue;
		if (m->copying && m->xh) {
			/* The reader is done before the send: stop it, complete after. */
			m->xh->early = c->status ? c->status : TPW__V1__STATUS__STATUS_IO;
			snprintf(m->xh->early_why, sizeof(m->xh->early_why), "%s",
				 c->message ? c->message : "");
			xh_cancel(m->xh);
			return;
		}
		m->read_requested = true;
		msg_consumed(m, c->status, c->message);
		start_next_copy(w);
		return;
	}
}

void tpd_pipe_peer_close(struct tpd_pipe *p, Tpw__V1__Status st, const char *why)
{
	if (why && *why)
		snprintf(p->why, sizeof(p->why), "%s", why);
	if (st == TPW__V1__STATUS__STATUS_UNSPECIFIED || st == TPW__V1__STATUS__STATUS_OK)
		st = TPW__V1__STATUS__STATUS_CLOSED;
	tpd_pipe_end_detach(remote_end(p), st);
}
