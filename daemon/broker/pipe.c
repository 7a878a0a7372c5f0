/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Pipes and the transfer state machine on the loop thread: a pipe's creation and freeing,
 * accepting a Write (queue limits, message id, descriptor, eager completion), accepting a Read
 * (building the copy, or the cross-host receive), starting copies in order and completing them
 * (ReadDone, WriteDone in write order), flow credit, and which channels served the pipe. See
 * pipe.h and docs/protocol.md ("Transfer of one message"). Connecting two sessions of this host
 * is pipeconnect.c's; the ends' lifetimes (detach, close, the PipeClosed owed) are pipeend.c's.
 * What a message's memory is and how its copy job is built lives in msg.c; pipes to another
 * host's daemon in xpipe.c, xconnect.c and xaccept.c, and the transfers over their links in
 * xh.c. Copies run on the copier's threads and come back through copy_on_done().
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "copier.h"
#include "core.h"
#include "log.h"
#include "peer.h"
#include "pipe_int.h"
#include "quota.h"
#include "session.h"
#include "validate.h"

const char *tpd_pipe_gone_text(Tpw__V1__Status s)
{
	switch (s) {
	case TPW__V1__STATUS__STATUS_PEER_DIED:
		return "peer died";
	case TPW__V1__STATUS__STATUS_SHUTDOWN:
		return "daemon stopping";
	case TPW__V1__STATUS__STATUS_ADMIN_CLOSED:
		return "the other end's session was closed by an administrator (tpipctl close-session)";
	default:
		return "remote end closed the pipe";
	}
}

/* The name a line about @p alone (no session's) is budgeted under (tpd_session_log_ok()): its
 * ends, each a uid, "peer:" and the far daemon's principal, or "-" once gone, the lower first,
 * so that a client making its own pipes' messages fail at will spends its own budget and no
 * other user's, wherever the line is written from. */
static void pipe_log_key(const struct tpd_pipe *p, char *key, size_t kl)
{
	char side[2][TPD_PEER_PRINCIPAL_LEN + 8];

	for (int i = 0; i < 2; i++) {
		const struct tpd_pipe_end *e = &p->end[i];
		struct tpd_session *s = e->session;

		if (e->remote)
			snprintf(side[i], sizeof(side[i]), "peer:%s",
				 p->link ? tpd_peer_principal(p->link) : "-");
		else if (s)
			snprintf(side[i], sizeof(side[i]), "%u", (unsigned)tpd_session_uid(s));
		else
			snprintf(side[i], sizeof(side[i]), "-");
	}
	/* (a long principal is cut: the key's room is shared by both ends) */
	if (strcmp(side[0], side[1]) > 0)
		snprintf(key, kl, "pipe:%.100s/%.100s", side[1], side[0]);
	else
		snprintf(key, kl, "pipe:%.100s/%.100s", side[0], side[1]);
}

void tpd_pipe_log(const struct tpd_pipe *p, const struct tpd_session *s, int level, const char *fmt,
		  ...)
{
	char pid[48], msg[800], key[TPD_RATELOG_KEY_LEN];
	const char *fields[] = {pid, NULL};
	unsigned held = 0;
	va_list ap;

	if (level > (int)tpu_log_get_level())
		return;
	if (!s && level > TPU_LOG_ERR) {
		pipe_log_key(p, key, sizeof(key));
		if (!tpd_session_log_ok(p->d, key, &held))
			return;
	}
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (s) {
		tpd_session_log(s, level, "pipe %llu: %s", (unsigned long long)p->id, msg);
		return;
	}
	snprintf(pid, sizeof(pid), "TPIPD_PIPE=%llu", (unsigned long long)p->id);
	if (held)
		tpu_log_kv((enum tpu_log_level)level, fields, "pipe %llu: %s (%u lines about pipes "
			   "of %s not logged before this one)", (unsigned long long)p->id, msg,
			   held, key + 5);
	else
		tpu_log_kv((enum tpu_log_level)level, fields, "pipe %llu: %s",
			   (unsigned long long)p->id, msg);
}

/* Why the other end went away, for the survivor: the peer link's reason if there is one. */
const char *tpd_pipe_why(const struct tpd_pipe *p, Tpw__V1__Status s)
{
	return p->why[0] ? p->why : tpd_pipe_gone_text(s);
}

/* ---- messages ------------------------------------------------------------------------------ */

void tpd_pipe_msg_maybe_free(struct tpd_msg *m)
{
	if (!tpu_list_linked(&m->wnode) && !tpu_list_linked(&m->rnode) && !m->copying)
		tpd_msg_free(m);
}

static void send_write_done(struct tpd_pipe_end *e, struct tpd_msg *m)
{
	Tpw__V1__WriteDone wd = TPW__V1__WRITE_DONE__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;

	wd.pipe_id = e->local_id;
	wd.write_id = m->write_id;
	wd.status = m->write_status;
	wd.message = m->write_why[0] ? m->write_why : NULL;
	wd.cma_off = e->session && tpd_session_cma_revoked(e->session);
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_WRITE_DONE;
	dm.write_done = &wd;
	tpd_session_send(e->session, &dm, NULL, 0);
}

/* Sends WriteDone for the completed prefix of @e's writes, in write order; a broadcast's
 * delivery whose staging read still reads the writer's CUDA memory waits for it. */
static void write_done_flush(struct tpd_pipe_end *e)
{
	struct tpd_msg *m;

	while ((m = tpu_list_first(&e->wq, struct tpd_msg, wnode)) && m->write_ready &&
	       !tpd_bcast_holds(m)) {
		if (e->session)
			send_write_done(e, m);
		tpu_list_remove(&m->wnode);
		tpd_pipe_msg_maybe_free(m);
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

void tpd_pipe_write_flush(struct tpd_pipe_end *e)
{
	write_done_flush(e);
}

void tpd_pipe_write_complete(struct tpd_msg *m, Tpw__V1__Status st, const char *why)
{
	msg_set_write(m, st, why);
	write_done_flush(m->from);
}

/* The reader is done with @m (successfully or not): complete the write, drop it from rq. */
void tpd_pipe_msg_consumed(struct tpd_msg *m, Tpw__V1__Status st, const char *why)
{
	struct tpd_pipe_end *w = m->from;
	struct tpd_daemon *d = w->pipe->d;

	if (st == TPW__V1__STATUS__STATUS_OK) {
		struct tpd_broker *b = tpd_daemon_broker(d);

		w->msgs_sent++;
		w->bytes_sent += m->bytes;
		b->messages_moved++;
		b->bytes_moved += m->bytes;
	}
	msg_set_write(m, st, why);
	tpd_bcast_unwanted(m); /* a far daemon's broadcast: its staging may go */
	if (w->remote)
		tpd_xpipe_consumed(m, st, why);
	if (tpu_list_linked(&m->rnode)) {
		tpu_list_remove(&m->rnode);
		w->queued--;
		w->queued_bytes -= m->tail_len;
		tpd_daemon_quota(d)->pipe_bytes -= m->cost;
		tpd_pipe_credit(w, m->tail_len);
		tpd_budget_far_wake(w);
	}
	if (tpu_list_linked(&m->wnode)) {
		write_done_flush(w); /* frees @m once its WriteDone is out */
		return;
	}
	tpd_pipe_msg_maybe_free(m);
	write_done_flush(w);
}

void tpd_pipe_send_read_done(struct tpd_pipe_end *r, uint64_t msg_id, Tpw__V1__Status st,
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
	rd.cma_off = tpd_session_cma_revoked(r->session);
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_READ_DONE;
	dm.read_done = &rd;
	tpd_session_send(r->session, &dm, NULL, 0);
}

/* ---- flow control -------------------------------------------------------------------------- */

void tpd_pipe_credit(struct tpd_pipe_end *e, uint64_t bytes)
{
	if (e->remote || !e->session || tpd_session_client_minor(e->session) < TPW_MINOR_FLOW)
		return;
	if (e->credit_msgs == UINT32_MAX)
		tpd_pipes_flow_flush(e->pipe->d); /* not reached: bounded by the frames of a pass */
	e->credit_msgs++;
	e->credit_bytes += bytes;
	if (!tpu_list_linked(&e->credit_node))
		tpu_list_insert_tail(&tpd_daemon_broker(e->pipe->d)->flow_dirty, &e->credit_node);
}

void tpd_pipes_flow_flush(struct tpd_daemon *d)
{
	Tpw__V1__FlowCredit fc = TPW__V1__FLOW_CREDIT__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	struct tpd_broker *b = tpd_daemon_broker(d);
	struct tpd_pipe_end *e;

	dm.body_case = TPW__V1__DAEMON_MSG__BODY_FLOW_CREDIT;
	dm.flow_credit = &fc;
	while ((e = tpu_list_first(&b->flow_dirty, struct tpd_pipe_end, credit_node))) {
		tpu_list_remove(&e->credit_node);
		fc.pipe_id = e->local_id;
		fc.messages = e->credit_msgs;
		fc.bytes = e->credit_bytes;
		e->credit_msgs = 0;
		e->credit_bytes = 0;
		if (e->session && !tpd_session_dead(e->session) && fc.messages)
			tpd_session_send(e->session, &dm, NULL, 0);
	}
	tpd_budget_wake(d);
}

/* ---- pipes --------------------------------------------------------------------------------- */

/* A new pipe of @d to listener @name; the caller sets up its ends. Return: owned pipe, or NULL
 * when out of memory. */
struct tpd_pipe *tpd_pipe_new(struct tpd_daemon *d, const char *name)
{
	struct tpd_pipe *p = calloc(1, sizeof(*p));

	if (!p || !(p->listener = strdup(name))) {
		free(p);
		return NULL;
	}
	p->d = d;
	p->id = tpd_daemon_broker(d)->next_pipe_id++;
	p->created_ns = tpu_now_ns();
	tpu_list_init(&p->held);
	return p;
}

static void end_drop_all(struct tpd_pipe_end *e)
{
	struct tpd_msg *m, *tmp;

	tpu_list_for_each_safe(m, tmp, &e->wq, wnode) tpu_list_remove(&m->wnode);
	tpu_list_for_each_safe(m, tmp, &e->rq, rnode)
	{
		tpu_list_remove(&m->rnode);
		tpd_daemon_quota(e->pipe->d)->pipe_bytes -= m->cost;
		tpd_pipe_msg_maybe_free(m);
	}
	e->queued_bytes = 0;
	e->queued = 0;
}

void tpd_pipe_maybe_free(struct tpd_pipe *p)
{
	if (p->end[0].session || p->end[1].session || p->jobs || p->stage_reads)
		return;
	end_drop_all(&p->end[0]);
	end_drop_all(&p->end[1]);
	tpu_list_remove(&p->end[0].credit_node);
	tpu_list_remove(&p->end[1].credit_node);
	tpd_budget_leave(&p->end[0]);
	tpd_budget_leave(&p->end[1]);
	tpd_xconnect_done(p);
	tpd_pring_free(p->end[0].ring);
	tpd_pring_free(p->end[1].ring);
	tpd_broker_pipe_remove(tpd_daemon_broker(p->d), p);
	tpd_pipe_log(p, NULL, TPU_LOG_DEBUG, "freed");
	for (unsigned i = 0; i < p->n_channel_notes; i++)
		free(p->channel_notes[i]);
	free(p->channel_notes);
	tpu_strv_free(p->expect_peers, p->n_expect_peers);
	free(p->listener);
	free(p);
}

void tpd_pipe_channel_note(struct tpd_pipe *p, const char *what, int channel, const char *why)
{
	if (channel >= 0)
		tpd_pipe_channel_note_name(p, what, tpb_name(channel), why);
}

void tpd_pipe_channel_note_name(struct tpd_pipe *p, const char *what, const char *name,
				const char *why)
{
	char key[96], *note = NULL;
	size_t kl;
	char **v;

	kl = (size_t)snprintf(key, sizeof(key), "%s: %s: ", what, name);
	for (unsigned i = 0; i < p->n_channel_notes; i++)
		if (strncmp(p->channel_notes[i], key, kl) == 0)
			return;
	tpd_pipe_log(p, NULL, TPU_LOG_DEBUG, "channel %s for %s: %s", name, what, why);
	if (p->n_channel_notes >= TPD_PIPE_CHANNEL_NOTES || asprintf(&note, "%s%.300s", key, why) < 0)
		return;
	v = realloc(p->channel_notes, (p->n_channel_notes + 1) * sizeof(*v));
	if (!v) {
		free(note);
		return;
	}
	v[p->n_channel_notes++] = note;
	p->channel_notes = v;
}

static const char *const pair_names[4] = {"cpu>cpu", "cpu>cuda", "cuda>cpu", "cuda>cuda"};

static unsigned pair_of(enum tpb_loc src, enum tpb_loc dst)
{
	return (src == TPB_LOC_CUDA ? 2u : 0u) | (dst == TPB_LOC_CUDA ? 1u : 0u);
}

/* Remembers that @channel served a (source device, destination device) pair on @p. */
void tpd_pipe_pair_record(struct tpd_pipe *p, enum tpb_loc src, enum tpb_loc dst, int channel)
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
	if (p->ring_used && off < len)
		snprintf(buf + off, len - off, "%sring", n ? "," : "");
}

void tpd_pipe_info(const struct tpd_pipe *p, struct tpd_pipe_info *ret)
{
	*ret = (struct tpd_pipe_info){
		.id = p->id,
		.listener = p->listener,
		.connecting = p->connecting,
		.created_ns = p->created_ns,
		.channel_notes = p->channel_notes,
		.n_channel_notes = p->n_channel_notes,
		.peer_addr = p->peer_addr,
		.remote_uid = p->remote_uid,
	};
	for (int i = 0; i < 2; i++) {
		const struct tpd_pipe_end *e = &p->end[i];

		ret->end[i] = (struct tpd_pipe_end_info){
			.session = e->session,
			.remote = e->remote,
			.gone = e->gone != TPW__V1__STATUS__STATUS_UNSPECIFIED,
			.queued = e->queued,
			.queued_bytes = e->queued_bytes,
			.msgs_sent = e->msgs_sent,
			.bytes_sent = e->bytes_sent,
		};
	}
}

/* ---- writes -------------------------------------------------------------------------------- */

/* Completes write @write_id with an error, behind the writes of @e still pending. */
void tpd_pipe_write_reject(struct tpd_pipe_end *e, uint64_t write_id, int err, const char *why)
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
	wd.cma_off = e->session && tpd_session_cma_revoked(e->session);
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_WRITE_DONE;
	dm.write_done = &wd;
	tpd_session_send(e->session, &dm, NULL, 0);
}

/* This pipe's own queue limits, for a message of end @e holding @tail_len inline bytes. */
static int pipe_limits_check(struct tpd_pipe_end *e, uint32_t tail_len, char *why, size_t wl)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(e->pipe->d);

	if (e->queued >= cfg->pipe_queue_max) {
		snprintf(why, wl, "pipe queue full: %u unread messages (limit %u, tpipd "
			 "--pipe-queue-max)", e->queued,
			 cfg->pipe_queue_max);
		return -ENOBUFS;
	}
	if (e->queued_bytes + tail_len > cfg->pipe_queue_bytes) {
		snprintf(why, wl, "pipe queue full: %llu unread inline bytes (limit %llu, tpipd "
			 "--pipe-queue-bytes)",
			 (unsigned long long)e->queued_bytes,
			 (unsigned long long)cfg->pipe_queue_bytes);
		return -ENOBUFS;
	}
	return 0;
}

/*
 * Checks the queue limits of end @e for a message holding @tail_len inline bytes: its own, the
 * far daemon's across hosts, then the daemon-wide budget. Return: 0, -EAGAIN (turn it back:
 * @e waits), or -ENOBUFS with @why.
 */
static int queue_check(struct tpd_pipe_end *e, uint32_t tail_len, size_t n_seg, char *why,
		       size_t wl)
{
	int err;

	if (e->budget != TPD_BUDGET_OPEN)
		return -EAGAIN; /* waits: resend later */
	err = pipe_limits_check(e, tail_len, why, wl);
	if (err == 0)
		err = tpd_budget_far_check(e, tail_len, why, wl);
	if (err < 0) {
		tpd_budget_unreserve(e); /* not taken: the room set aside goes back */
		return err;
	}
	return tpd_budget_check(e, tpd_msg_cost(tail_len, n_seg), why, wl);
}

void tpd_pipe_write(struct tpd_pipe_end *e, Tpw__V1__ClientMsg *cm, const uint8_t *tail,
		    uint32_t tail_len)
{
	if (e->pipe->connecting && !tpd_pipe_end_dying(tpd_pipe_end_peer(e))) {
		tpd_xconnect_hold(e, cm, tail, tail_len);
		return;
	}
	tpd_pipe_write_one(e, cm->write, cm->write->write_id, tail, tail_len, NULL);
	tpw_client_msg_free(cm);
}

void tpd_pipe_write_one(struct tpd_pipe_end *e, const Tpw__V1__Write *w, uint64_t write_id,
			const uint8_t *tail, uint32_t tail_len, struct tpd_bcast *bc)
{
	struct tpd_pipe_end *r = tpd_pipe_end_peer(e);
	struct tpd_msg *m = NULL;
	char why[192] = "";
	int err;

	if (tpd_pipe_end_dying(r)) {
		Tpw__V1__Status g = tpd_pipe_end_gone_status(r);
		tpd_pipe_write_reject(e, write_id, tpw_status_to_errno(g),
				      tpd_pipe_why(e->pipe, g));
		tpd_pipe_credit(e, tail_len);
		return;
	}
	if (e->pipe->connecting) {
		/* not reached with a Write; a Broadcast names pipes that are open */
		snprintf(why, sizeof(why), "broadcast to a pipe still connecting");
		err = -ENOTCONN;
		goto reject;
	}
	err = queue_check(e, tail_len, w->n_payloads + w->n_tensors, why, sizeof(why));
	if (err == -EAGAIN) {
		tpd_budget_refuse(e, write_id, tail_len);
		return;
	}
	if (err < 0)
		goto reject;
	m = calloc(1, sizeof(*m));
	err = -ENOMEM;
	if (!m)
		goto reject;
	tpu_list_init(&m->wnode);
	tpu_list_init(&m->rnode);
	m->from = e;
	m->write_id = write_id;
	err = tpd_msg_resolve(m, e->session, w, tail, why, sizeof(why));
	if (err < 0)
		goto reject;
	if (m->ring_only && (bc || !e->ring_offered || r->remote)) {
		snprintf(why, sizeof(why), "ring address without a pipe ring offered to this end");
		err = -EINVAL;
		goto reject;
	}
	tpd_bcast_attach(bc, m, r);
	m->msg_id = ++e->next_msg_id;
	m->tail_len = tail_len;
	err = tpd_bcast_defer(bc, m, r) ? 0 : tpd_msg_send_descriptor(r, m, w);
	if (err < 0)
		goto reject;
	tpu_list_insert_tail(&e->wq, &m->wnode);
	tpu_list_insert_tail(&e->rq, &m->rnode);
	e->queued++;
	e->queued_bytes += tail_len;
	m->cost = tpd_msg_cost(tail_len, m->n_src);
	tpd_budget_charge(e->pipe->d, m->cost);
	if (m->eager) {
		/* The bytes now travel with the descriptor; the writer's memory is free. */
		msg_set_write(m, TPW__V1__STATUS__STATUS_OK, NULL);
		e->pipe->channels |= 1u << tpb_index("basic");
		tpd_pipe_channel_note(e->pipe, "eager", tpb_index("basic"),
				      "small message: its bytes travel with the descriptor (inline), "
				      "no copy");
		tpd_stats_record(tpd_daemon_stats(e->pipe->d), tpb_index("basic"), m->bytes, 0,
				 false);
		write_done_flush(e);
		return;
	}
	tpd_pring_offer(e, m);
	if (tail_len) {
		/* Rendezvous with some inline parts: keep a copy of the tail, re-point sources. */
		m->tail = malloc(tail_len);
		if (!m->tail) {
			tpd_pipe_msg_consumed(m, TPW__V1__STATUS__STATUS_IO, "out of memory");
			return;
		}
		memcpy(m->tail, tail, tail_len);
		for (size_t i = 0; i < m->n_src; i++) {
			uint64_t a = m->src[i].mem.addr, t = (uint64_t)(uintptr_t)tail;
			if (!m->src[i].buf && m->src[i].mem.loc == TPB_LOC_LOCAL && a >= t &&
			    a <= t + tail_len)
				m->src[i].mem.addr = (uint64_t)(uintptr_t)m->tail + (a - t);
		}
	}
	return;
reject:
	tpd_pipe_log(e->pipe, e->session, TPU_LOG_INFO, "write rejected: %s",
		     why[0] ? why : strerror(-err));
	if (m)
		tpd_msg_free(m);
	tpd_pipe_write_reject(e, write_id, err, why[0] ? why : strerror(-err));
	tpd_pipe_credit(e, tail_len);
}

/* ---- reads --------------------------------------------------------------------------------- */

/*
 * A copy that fails because a process vanished (ESRCH: it has no memory left) or whose end is
 * already going away is the peer dying, not a bad address: say so to the survivor.
 */
static void classify_failure(struct tpb_copy_job *job, const struct tpd_pipe_end *w,
			     const struct tpd_pipe_end *r)
{
	if (job->status == 0 && tpd_pipe_end_dying(w)) {
		/* The writer was told its write was canceled and may have reused the memory
		 * while it was copied: the reader must not take these bytes as good. */
		job->status = tpw_status_to_errno(tpd_pipe_end_gone_status(w));
		snprintf(job->why, sizeof(job->why), "%s during the transfer",
			 tpd_pipe_gone_text(tpd_pipe_end_gone_status(w)));
		return;
	}
	if (job->status == -ECANCELED && job->abandoned &&
	    (tpd_pipe_end_dying(w) || tpd_pipe_end_dying(r))) {
		/* abandoned when an end left (tpd_pipe_end_detach()): say why, as above */
		const struct tpd_pipe_end *gone = tpd_pipe_end_dying(w) ? w : r;

		job->status = tpw_status_to_errno(tpd_pipe_end_gone_status(gone));
		snprintf(job->why, sizeof(job->why), "%s during the transfer",
			 tpd_pipe_gone_text(tpd_pipe_end_gone_status(gone)));
		return;
	}
	if (job->status == 0 || job->status == -ECANCELED)
		return;
	if (job->status == -ESRCH || tpd_pipe_end_dying(w) || tpd_pipe_end_dying(r)) {
		job->status = -ECONNRESET;
		snprintf(job->why, sizeof(job->why), "peer died during the transfer");
	}
}

static void copy_on_done(struct tpb_copy_job *job)
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
		tpd_stats_record(tpd_daemon_stats(p->d), job->channels[i], job->xfers[i].len,
				 job->ns[i], job->status < 0);
	}
	if (job->status < 0)
		tpd_pipe_log(p, NULL, TPU_LOG_INFO, "message %llu: %s",
			     (unsigned long long)m->msg_id, job->why);
	tpd_pipe_send_read_done(r, m->msg_id, st, job->status < 0 ? job->why : NULL);
	if (job->status == 0 && !r->session)
		tpd_pipe_msg_consumed(m, r->gone, tpd_pipe_why(p, r->gone));
	else
		tpd_pipe_msg_consumed(m, st, job->status < 0 ? job->why : NULL);
	tpb_copier_job_free(job);
	tpd_pipe_start_next_copy(w);
	tpd_pipe_end_owed_maybe(w);
	tpd_pipe_end_owed_maybe(r);
	tpd_pipe_maybe_free(p);
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

/* The staging read of broadcast message @m failed: its copy (built, never submitted) fails the
 * same way, in its place in the pipe's order. May free @m. */
static void bcast_copy_fail(struct tpd_pipe_end *w, struct tpd_msg *m)
{
	struct tpb_copy_job *job = TAKE_PTR(m->job);
	const char *why = "";
	int err = tpd_bcast_error(m, &why);
	Tpw__V1__Status st = tpw_status_from_errno(err);

	tpd_pipe_log(w->pipe, NULL, TPU_LOG_INFO, "message %llu: %s",
		     (unsigned long long)m->msg_id, why);
	tpd_pipe_send_read_done(tpd_pipe_end_peer(w), m->msg_id, st, why);
	tpd_pipe_msg_consumed(m, st, why);
	tpb_copier_job_free(job);
}

void tpd_pipe_start_next_copy(struct tpd_pipe_end *w)
{
	struct tpd_msg *m, *tmp;

	tpu_list_for_each_safe(m, tmp, &w->rq, rnode)
	{
		if (!m->read_requested || w->copying >= XH_INFLIGHT)
			return;
		if (m->copying)
			continue;
		if (m->xh) {
			if (tpd_xh_start(m) < 0)
				return; /* failed at once: its completion went on from there */
			continue;
		}
		if (m->job) {
			/* a pipe ring carries a message of this pipe's two clients only, never one
			 * target of a daemon fan-out; it may carry several of them at once */
			bool ring = m->ring && !m->bcast;

			if ((w->copying && !(ring && tpd_pring_can_add(w))) || tpd_bcast_waiting(m))
				return;
			if (tpd_bcast_error(m, NULL) < 0) {
				bcast_copy_fail(w, m);
				continue;
			}
			m->copying = true;
			w->copying++;
			w->pipe->jobs++;
			if (ring && tpd_pring_start(m) == 0)
				continue;
			m->ring = false; /* not handed out: copied as usual */
			tpb_copier_submit(tpd_daemon_copier(w->pipe->d), m->job);
			return;
		}
	}
}

/* Finds the message a Read from @r refers to: the oldest one not yet asked for. */
struct tpd_msg *tpd_pipe_next_unread(struct tpd_pipe_end *w)
{
	struct tpd_msg *m;

	tpu_list_for_each(m, &w->rq, rnode) if (!m->read_requested) return m;
	return NULL;
}

void tpd_pipe_read(struct tpd_pipe_end *r, const Tpw__V1__Read *rd)
{
	struct tpd_pipe_end *w = tpd_pipe_end_peer(r);
	struct tpd_msg *m = tpd_pipe_next_unread(w);
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
			tpd_pipe_send_read_done(r, m->msg_id, TPW__V1__STATUS__STATUS_OK, NULL);
		tpd_pipe_msg_consumed(m, TPW__V1__STATUS__STATUS_OK, NULL);
		return;
	}
	if (m->eager) {
		snprintf(why, sizeof(why), "allocation for an eager message");
		err = -EINVAL;
		goto fail;
	}
	if (m->canceled) {
		tpd_cancel_read_canceled(r, m);
		return;
	}
	m->read_requested = true;
	if (!tpd_pipe_end_attached(w)) {
		tpd_pipe_send_read_done(r, m->msg_id, w->gone, tpd_pipe_why(r->pipe, w->gone));
		tpd_pipe_msg_consumed(m, w->gone, tpd_pipe_why(r->pipe, w->gone));
		return;
	}
	if (w->remote && !m->bcast)
		err = tpd_xh_build_recv(m, r->session, rd, why, sizeof(why));
	else
		err = tpd_msg_build_job(m, r->session, rd, copy_on_done, &m->job, why, sizeof(why));
	if (err == 0 && m->job) {
		m->ring = tpd_pring_choose(m, r->session, m->job, why, sizeof(why));
		if (m->ring || (*why && !m->ring_only))
			tpd_pipe_channel_note_name(r->pipe, "cpu>cpu", m->ring ? "ring" : "cma (no ring)",
						   why);
		if (!m->ring && m->ring_only) {
			/* nothing else reaches the writer's memory */
			snprintf(why, sizeof(why), "the writer's memory is reachable only "
				 "through the pipe ring, which this message cannot take");
			tpb_copier_job_free(TAKE_PTR(m->job));
			err = -EOPNOTSUPP;
		}
	}
	if (err < 0) {
		tpd_pipe_log(r->pipe, r->session, TPU_LOG_INFO, "read rejected: %s", why);
		tpd_pipe_send_read_done(r, m->msg_id, tpw_status_from_errno(err), why);
		tpd_pipe_msg_consumed(m, tpw_status_from_errno(err), why);
		return;
	}
	tpd_pipe_start_next_copy(w);
	return;
fail:
	tpd_pipe_log(r->pipe, r->session, TPU_LOG_INFO, "%s", why);
	tpd_pipe_send_read_done(r, rd->msg_id, tpw_status_from_errno(err), why);
}
