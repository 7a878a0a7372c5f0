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
#include "pipe.h"
#include "session.h"
#include "tpb.h"
#include "validate.h"

#define ACCEPT_ID_BASE (1ull << 63)

struct msg_src {
	struct tpb_mem mem;
	struct tpd_buffer *buf; /* reference held for shm sources */
	uint64_t len;
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

static bool end_dying(const struct tpd_pipe_end *e)
{
	return !e->session || e->session->dead;
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

static void msg_free(struct tpd_msg *m)
{
	for (size_t i = 0; i < m->n_src; i++)
		tpd_buffer_unref(m->src[i].buf);
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
	tpu_list_remove(&p->node);
	p->d->n_pipes--;
	pipe_log(p, NULL, TPU_LOG_DEBUG, "freed");
	free(p->listener);
	free(p);
}

void tpd_pipe_channels(const struct tpd_pipe *p, char *buf, size_t len)
{
	size_t n = 0, off = 0;

	buf[0] = '\0';
	for (int i = 0; i < 32 && off < len; i++) {
		if (!(p->channels & (1u << i)))
			continue;
		off += snprintf(buf + off, len - off, "%s%s", n++ ? "," : "", tpb_name(i));
	}
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

	if (strncmp(c->address, "tpip://", 7) == 0) {
		snprintf(why, wl, "cross-host addresses are not supported by this daemon yet");
		return -EOPNOTSUPP;
	}
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

void tpd_pipe_connect(struct tpd_daemon *d, struct tpd_session *s, const Tpw__V1__Connect *c)
{
	struct tpd_listener *l = NULL;
	struct tpd_session *ls;
	struct tpd_pipe *p;
	char why[192];
	int r;

	r = connect_check(d, s, c, &l, why, sizeof(why));
	if (r < 0) {
		connect_fail(s, c, r, why);
		return;
	}
	ls = l->owner;
	p = calloc(1, sizeof(*p));
	if (!p || !(p->listener = strdup(l->name))) {
		free(p);
		connect_fail(s, c, -ENOMEM, "out of memory");
		return;
	}
	p->d = d;
	p->id = d->next_pipe_id++;
	p->created_ns = tpu_now_ns();
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
	for (size_t i = 0; i < w->n_tensors; i++) {
		const Tpw__V1__Device *dev = w->tensors[i]->device;
		if (dev && dev->type == TPW__V1__DEVICE_TYPE__DEVICE_CUDA) {
			snprintf(why, wl, "tensor %zu is on CUDA:%u; CUDA is not supported yet", i,
				 dev->index);
			return -EOPNOTSUPP;
		}
	}
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

/* Sends the Descriptor of @m (written as @w) to the reader, with the bytes if eager. */
static int send_descriptor(struct tpd_pipe_end *r, struct tpd_msg *m, const Tpw__V1__Write *w)
{
	Tpw__V1__Descriptor dd = TPW__V1__DESCRIPTOR__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
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
		write_reject(e, w->write_id, tpw_status_to_errno(g), gone_text(g));
		goto out;
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
	w->copying = false;
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
		msg_consumed(m, r->gone, gone_text(r->gone));
	else
		msg_consumed(m, st, job->status < 0 ? job->why : NULL);
	tpd_copy_job_free(job);
	start_next_copy(w);
	end_owed_maybe(w);
	end_owed_maybe(r);
	pipe_maybe_free(p);
}

static void start_next_copy(struct tpd_pipe_end *w)
{
	struct tpd_msg *m;

	if (w->copying)
		return;
	tpu_list_for_each(m, &w->rq, rnode) {
		if (!m->read_requested)
			return;
		if (m->job && !m->copying) {
			m->copying = true;
			w->copying = true;
			w->pipe->jobs++;
			tpd_copier_submit(w->pipe->d->copier, m->job);
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
		channel = tpb_select(x.src.loc, x.dst.loc);
		if (channel < 0) {
			snprintf(why, wl, "no channel can copy this segment on this host");
			tpd_copy_job_free(job);
			return -EOPNOTSUPP;
		}
		job_add(job, &x, channel);
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
	if (!w->session) {
		send_read_done(r, m->msg_id, w->gone, gone_text(w->gone));
		msg_consumed(m, w->gone, gone_text(w->gone));
		return;
	}
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
	pc.message = e->owed == TPW__V1__STATUS__STATUS_CANCELED ? "closed"
								 : (char *)gone_text(e->owed);
	e->owed = TPW__V1__STATUS__STATUS_UNSPECIFIED;
	if (!s)
		return;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_PIPE_CLOSED;
	dm.pipe_closed = &pc;
	tpd_session_send(s, &dm, NULL, 0);
}

void tpd_pipe_end_detach(struct tpd_pipe_end *e, Tpw__V1__Status why)
{
	struct tpd_pipe_end *peer = tpd_pipe_end_peer(e);
	struct tpd_pipe *p = e->pipe;
	struct tpd_msg *m, *tmp;

	if (!e->session)
		return;
	pipe_log(p, e->session, TPU_LOG_INFO, "end left (%s)", tpw_status_name(why));
	e->session = NULL;
	e->gone = why;
	/* Writes of @e: nobody waits for their completion any more. Rendezvous reads the peer
	 * already asked for fail now; eager messages stay readable. */
	tpu_list_for_each_safe(m, tmp, &e->wq, wnode) {
		tpu_list_remove(&m->wnode);
		msg_maybe_free(m);
	}
	tpu_list_for_each_safe(m, tmp, &e->rq, rnode) {
		if (m->read_requested && !m->copying && !m->eager) {
			send_read_done(peer, m->msg_id, why, gone_text(why));
			msg_consumed(m, why, gone_text(why));
		}
	}
	/* Messages the peer wrote to @e will never be read. */
	tpu_list_for_each_safe(m, tmp, &peer->rq, rnode)
		if (!m->copying)
			msg_consumed(m, why, gone_text(why));
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
