/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Pipes to another host's daemon once open, on the loop thread: the peer messages of an open
 * pipe (descriptors of the remote writer's messages, within this host's queue limits; read
 * requests of the remote reader; consumed messages; closes), telling the far daemon, and the
 * table of ops the peer part calls the broker through. Opening the pipe is xconnect.c's (this
 * host connects) and xaccept.c's (the far daemon connects); the transfers themselves are xh.c's;
 * the link is peer.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <event2/event.h>
#include "core.h"
#include "log.h"
#include "peer.h"
#include "pipe_int.h"
#include "session.h"
#include "validate.h"

void tpd_xpipe_tell(struct tpd_pipe *p, Tpw__V1__PeerMsg *pm, const struct iovec *iov, int n)
{
	if (p->link)
		tpd_peer_send(p->link, pm, iov, n);
}

void tpd_xpipe_tell_close(struct tpd_peer *link, uint64_t remote_id, Tpw__V1__Status st,
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

void tpd_xpipe_consumed(struct tpd_msg *m, Tpw__V1__Status st, const char *why)
{
	Tpw__V1__PeerConsumed c = TPW__V1__PEER_CONSUMED__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	struct tpd_pipe *p = m->from->pipe;

	if (!p->remote_id || !tpd_pipe_end_attached(m->from))
		return; /* the writer's end is gone there: nobody waits */
	c.pipe_id = p->remote_id;
	c.msg_id = m->msg_id;
	c.status = st;
	c.message = why && *why ? (char *)why : NULL;
	pm.body_case = TPW__V1__PEER_MSG__BODY_CONSUMED;
	pm.consumed = &c;
	tpd_xpipe_tell(p, &pm, NULL, 0);
}

void tpd_xpipe_listener_added(struct tpd_daemon *d, const char *name)
{
	struct tpd_listener *l = tpd_listener_registry_find(tpd_daemon_registry(d), name);
	struct tpd_broker *b = tpd_daemon_broker(d);
	struct tpd_pipe *p, *tmp;

	if (l)
		tpd_xaccept_listener_added(d, l);

	tpu_list_for_each_safe(p, tmp, &b->pipes, node)
		if (p->waiting && p->connecting && tpd_xpipe_local_end(p)->session &&
		    strcmp(p->listener, name) == 0)
			tpd_xconnect_reroute_local(p); /* checks access; connects or fails it */
}

/*
 * The same queue limits as for a local writer (pipe-queue-max, pipe-queue-bytes): a message of
 * remote writer end @w over them is refused back to the writer's daemon (its write fails with
 * STATUS_LIMIT) and never queued here, whatever that daemon let its client write. Once an
 * eager message was refused (its write completed on the writer's host, so the pipe fails there),
 * every later message of @w is refused too, whatever room frees meanwhile: the reader must never
 * read message N+1 where N was dropped. Logged within the link's budget (tpd_peer_log_ok()):
 * the peer sends at will.
 * Return: true if refused.
 */
static bool remote_queue_full(struct tpd_pipe *p, struct tpd_pipe_end *w, uint64_t msg_id,
			      bool eager, uint32_t tail_len, size_t n_seg)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(p->d);
	struct tpd_quota *q = tpd_daemon_quota(p->d);
	struct tpd_msg m = { .from = w, .msg_id = msg_id };
	char why[224];
	unsigned suppressed;

	if (w->dropped)
		snprintf(why, sizeof(why), "an earlier message of this pipe was dropped on the "
			 "reader's host");
	else if (w->queued >= cfg->pipe_queue_max)
		snprintf(why, sizeof(why), "pipe queue full on the reader's host: %u unread messages "
			 "(limit %u, tpipd --pipe-queue-max)", w->queued, cfg->pipe_queue_max);
	else if (w->queued_bytes + tail_len > cfg->pipe_queue_bytes)
		snprintf(why, sizeof(why), "pipe queue full on the reader's host: %llu unread inline "
			 "bytes (limit %llu, tpipd --pipe-queue-bytes)",
			 (unsigned long long)w->queued_bytes,
			 (unsigned long long)cfg->pipe_queue_bytes);
	else if (q->pipe_bytes + q->pipe_reserved +
		 tpd_msg_cost(tail_len, n_seg) > cfg->pipe_queue_bytes_total)
		snprintf(why, sizeof(why), "pipe queues full on the reader's host: %llu bytes held "
			 "for unread messages in all pipes (limit %llu, tpipd "
			 "--pipe-queue-bytes-max)",
			 (unsigned long long)q->pipe_bytes,
			 (unsigned long long)cfg->pipe_queue_bytes_total);
	else
		return false;
	q->remote_refused++;
	w->dropped |= eager;
	if (tpd_peer_log_ok(p->link, &suppressed))
		tpd_pipe_log(p, NULL, TPU_LOG_WARNING, "remote message %llu refused: %s (%u lines "
			     "about this peer not logged before this one)",
			     (unsigned long long)msg_id, why, suppressed);
	tpd_xpipe_consumed(&m, TPW__V1__STATUS__STATUS_LIMIT, why);
	return true;
}

void tpd_xpipe_peer_descriptor(struct tpd_pipe *p, const Tpw__V1__Descriptor *dd,
			       const uint8_t *tail, uint32_t tail_len)
{
	struct tpd_pipe_end *w = tpd_xpipe_remote_end(p), *r = tpd_xpipe_local_end(p);
	Tpw__V1__Descriptor out = *dd;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	struct iovec iov = {(void *)tail, tail_len};
	struct tpd_msg *m;

	if (!r->session || tpd_pipe_end_dying(w) || p->connecting)
		return; /* the reader left: the writer's daemon learns it from our PipeClose */
	if (remote_queue_full(p, w, dd->msg_id, dd->eager, tail_len,
			      dd->n_payloads + dd->n_tensors))
		return;
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
	m->cost = tpd_msg_cost(tail_len, m->n_src);
	tpd_budget_charge(p->d, m->cost);
	m->tail_len = tail_len;
	if (m->eager) {
		int basic = tpb_index("basic");
		p->channels |= 1u << basic;
		tpd_stats_record(tpd_daemon_stats(p->d), basic, m->bytes, 0, false);
	}
	out.pipe_id = r->local_id;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR;
	dm.descriptor = &out;
	tpd_session_send(r->session, &dm, &iov, dd->eager && tail_len ? 1 : 0);
}

void tpd_xpipe_peer_read_req(struct tpd_pipe *p, const Tpw__V1__PeerReadReq *rr)
{
	struct tpd_pipe_end *w = tpd_xpipe_local_end(p);
	struct tpd_msg *m;
	unsigned suppressed;

	if (!w->session) {
		tpd_xh_tell_end(p, rr->xfer_id, TPW__V1__STATUS__STATUS_CLOSED,
				"writer closed the pipe", 0, false);
		return;
	}
	if (rr->bcast) {
		tpd_bcast_peer_read(p, rr); /* a broadcast's one read, out of the pipe's order */
		return;
	}
	m = tpd_pipe_next_unread(w);
	if (!m || m->msg_id != rr->msg_id || m->eager) {
		if (tpd_peer_log_ok(p->link, &suppressed)) /* the peer asks at will */
			tpd_pipe_log(p, NULL, TPU_LOG_WARNING, "peer asked for message %llu, next "
				     "is %llu (%u lines about this peer not logged before this "
				     "one)",
				     (unsigned long long)rr->msg_id,
				     m ? (unsigned long long)m->msg_id : 0ull, suppressed);
		tpd_xh_tell_end(p, rr->xfer_id, TPW__V1__STATUS__STATUS_INVALID, "no such message",
				0, false);
		return;
	}
	if (m->canceled) {
		tpd_cancel_peer_read_canceled(w, m, rr->xfer_id);
		return;
	}
	if (tpd_xh_build_send(m, rr) < 0) {
		tpd_xh_tell_end(p, rr->xfer_id, TPW__V1__STATUS__STATUS_IO, "out of memory", 0,
				false);
		return;
	}
	m->read_requested = true;
	tpd_pipe_start_next_copy(w);
}

/*
 * The reader's daemon dropped eager message @m (its daemon-wide budget, or limits it lowered
 * since the pipe was set up) although its write completed here when it was sent: the writer
 * cannot learn it from that write any more, so the pipe fails, both ways, with the reason. The
 * reader still reads what was queued before. Logged within the link's budget (tpd_peer_log_ok()).
 */
static void eager_dropped(struct tpd_pipe *p, const struct tpd_msg *m,
			  const Tpw__V1__PeerConsumed *c)
{
	const char *reason = c->message && *c->message ? c->message : tpw_status_name(c->status);
	unsigned suppressed;
	char why[200];

	snprintf(why, sizeof(why), "the reader's daemon dropped message %llu, written already: "
		 "%.140s", (unsigned long long)m->msg_id, reason);
	if (tpd_peer_log_ok(p->link, &suppressed))
		tpd_pipe_log(p, NULL, TPU_LOG_WARNING, "%s; failing the pipe (%u lines about this "
			     "peer not logged before this one)", why, suppressed);
	if (p->link && p->remote_id)
		tpd_xpipe_tell_close(p->link, p->remote_id, c->status, why);
	tpd_xpipe_peer_close(p, c->status, why);
}

void tpd_xpipe_peer_consumed(struct tpd_pipe *p, const Tpw__V1__PeerConsumed *c)
{
	struct tpd_pipe_end *w = tpd_xpipe_local_end(p);
	struct tpd_msg *m;

	tpu_list_for_each(m, &w->rq, rnode)
	{
		if (m->msg_id != c->msg_id)
			continue;
		if (m->copying && m->xh) {
			/* The reader is done before the send: stop it, complete after. */
			tpd_xh_stop_early(m->xh, c->status ? c->status : TPW__V1__STATUS__STATUS_IO,
					  c->message);
			return;
		}
		if (m->eager && c->status != TPW__V1__STATUS__STATUS_OK &&
		    c->status != TPW__V1__STATUS__STATUS_CANCELED &&
		    !tpd_pipe_end_dying(tpd_xpipe_remote_end(p))) {
			eager_dropped(p, m, c); /* consumes @m with the rest of the pipe */
			return;
		}
		m->read_requested = true;
		tpd_pipe_msg_consumed(m, c->status, c->message);
		tpd_pipe_start_next_copy(w);
		return;
	}
}

void tpd_xpipe_peer_close(struct tpd_pipe *p, Tpw__V1__Status st, const char *why)
{
	if (why && *why)
		snprintf(p->why, sizeof(p->why), "%s", why);
	if (st == TPW__V1__STATUS__STATUS_UNSPECIFIED || st == TPW__V1__STATUS__STATUS_OK)
		st = TPW__V1__STATUS__STATUS_CLOSED;
	tpd_pipe_end_detach(tpd_xpipe_remote_end(p), st);
}

static uint64_t xpipe_id(const struct tpd_pipe *p)
{
	return p->id;
}

static uint64_t xpipe_remote_id(const struct tpd_pipe *p)
{
	return p->remote_id;
}

/* What a peer link calls up into: this file's peer messages and link events, and xh.c's. */
static const struct tpd_peer_pipe_ops xpipe_peer_ops = {
	.id = xpipe_id,
	.remote_id = xpipe_remote_id,
	.link_up = tpd_xconnect_link_up,
	.link_failed = tpd_xconnect_link_failed,
	.waits_drop = tpd_xaccept_waits_drop,
	.wait_cancel = tpd_xaccept_wait_cancel,
	.connect = tpd_xaccept_connect,
	.connect_reply = tpd_xconnect_reply,
	.descriptor = tpd_xpipe_peer_descriptor,
	.read_req = tpd_xpipe_peer_read_req,
	.consumed = tpd_xpipe_peer_consumed,
	.close = tpd_xpipe_peer_close,
	.xfer_end = tpd_xh_peer_xfer_end,
	.bcast = tpd_bcast_peer,
};

void tpd_xpipe_start(void)
{
	tpd_peer_set_pipe_ops(&xpipe_peer_ops);
}
