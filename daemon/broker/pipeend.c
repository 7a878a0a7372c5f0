/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The two ends of a pipe, on the loop thread: which end is the other, whether an end is still
 * attached or dying, and an end leaving (PipeClose, its session ending, its remote end going
 * away): what it wrote and what was written to it fail or stay readable, the other end learns
 * why, and the PipeClosed owed to a session is sent once no copy touches its memory. The
 * messages themselves are pipe.c's; connecting two sessions is pipeconnect.c's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "copier.h"
#include "core.h"
#include "log.h"
#include "pipe_int.h"
#include "session.h"
#include "validate.h"

struct tpd_pipe_end *tpd_pipe_end_peer(struct tpd_pipe_end *e)
{
	return e == &e->pipe->end[0] ? &e->pipe->end[1] : &e->pipe->end[0];
}

bool tpd_pipe_end_dying(const struct tpd_pipe_end *e)
{
	if (e->remote)
		return e->gone != TPW__V1__STATUS__STATUS_UNSPECIFIED;
	return !e->session || tpd_session_dead(e->session);
}

/* Attached: a local end with its session, or a remote end that has not gone away. */
bool tpd_pipe_end_attached(const struct tpd_pipe_end *e)
{
	return e->remote ? e->gone == TPW__V1__STATUS__STATUS_UNSPECIFIED : e->session != NULL;
}

/* Why an end that is dying or gone went away. */
Tpw__V1__Status tpd_pipe_end_gone_status(const struct tpd_pipe_end *e)
{
	if (e->session)
		return tpd_session_dead_status(e->session) ? tpd_session_dead_status(e->session)
					       : TPW__V1__STATUS__STATUS_PEER_DIED;
	return e->gone;
}

void tpd_pipe_end_init(struct tpd_pipe_end *e, struct tpd_pipe *p, struct tpd_session *s,
		       uint64_t local_id)
{
	e->pipe = p;
	e->session = s;
	e->local_id = local_id;
	tpu_list_init(&e->wq);
	tpu_list_init(&e->rq);
	tpu_list_init(&e->credit_node);
	tpu_list_init(&e->budget_node);
	e->gone = TPW__V1__STATUS__STATUS_UNSPECIFIED;
}

/* ---- closing ------------------------------------------------------------------------------- */

static void end_detach(struct tpd_pipe_end *e, Tpw__V1__Status why);
static void end_reap(struct tpd_pipe_end *e);

static struct tpd_session *find_session(struct tpd_daemon *d, uint64_t id)
{
	return tpd_local_session_find(tpd_daemon_local(d), id);
}

/*
 * Sends the PipeClosed owed to @e's session once no copy reads or writes @e's memory: only
 * then may its client treat the buffers of its pending operations as free again.
 */
void tpd_pipe_end_owed_maybe(struct tpd_pipe_end *e)
{
	Tpw__V1__PipeClosed pc = TPW__V1__PIPE_CLOSED__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	struct tpd_session *s;

	if (!e->owed || e->copying || tpd_pipe_end_peer(e)->copying || e->pipe->stage_reads)
		return;
	s = find_session(e->pipe->d, e->owed_session);
	pc.pipe_id = e->local_id;
	pc.status = e->owed;
	pc.message = e->owed == TPW__V1__STATUS__STATUS_CANCELED
			 ? "closed"
			 : (char *)tpd_pipe_why(e->pipe, e->owed);
	e->owed = TPW__V1__STATUS__STATUS_UNSPECIFIED;
	if (!s)
		return;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_PIPE_CLOSED;
	dm.pipe_closed = &pc;
	tpd_session_send(s, &dm, NULL, 0);
	if (pc.status != TPW__V1__STATUS__STATUS_CANCELED && e->session == s)
		end_reap(e);
}

/*
 * @e's session has just been told that the other end went away (PipeClosed): from now on its
 * client neither reads nor writes the pipe, and never sends PipeClose for it. Detach @e from
 * the session at once, so that a long-running listener does not keep every pipe its peers
 * closed until its pipe table is full. Pending messages fail as they would have. The caller
 * frees the pipe (tpd_pipe_maybe_free()).
 */
static void end_reap(struct tpd_pipe_end *e)
{
	if (e->remote || !e->session || tpd_session_dead(e->session))
		return;
	tpd_session_pipe_remove(e->session, e->local_id);
	end_detach(e, TPW__V1__STATUS__STATUS_CLOSED);
}

void tpd_pipe_end_detach(struct tpd_pipe_end *e, Tpw__V1__Status why)
{
	struct tpd_pipe *p = e->pipe;

	if (!tpd_pipe_end_attached(e))
		return;
	end_detach(e, why);
	tpd_pipe_maybe_free(p);
}

/* tpd_pipe_end_detach() but the caller frees the pipe. */
static void end_detach(struct tpd_pipe_end *e, Tpw__V1__Status why)
{
	struct tpd_pipe_end *peer = tpd_pipe_end_peer(e);
	struct tpd_pipe *p = e->pipe;
	struct tpd_msg *m, *tmp;

	if (!tpd_pipe_end_attached(e))
		return;
	tpd_pipe_log(p, e->session, TPU_LOG_INFO, "%s end left (%s)",
		     e->remote ? "remote" : "local", tpw_status_name(why));
	e->session = NULL;
	e->gone = why;
	tpd_budget_leave(e);
	if (peer->remote)
		tpd_xconnect_local_left(p, why);
	/* Writes of @e: nobody waits for their completion any more. Rendezvous reads the peer
	 * already asked for fail now; eager messages stay readable. */
	tpu_list_for_each_safe(m, tmp, &e->wq, wnode)
	{
		tpu_list_remove(&m->wnode);
		tpd_pipe_msg_maybe_free(m);
	}
	tpu_list_for_each_safe(m, tmp, &e->rq, rnode)
	{
		if (m->read_requested && !m->copying && !m->eager) {
			tpd_pipe_send_read_done(peer, m->msg_id, why, tpd_pipe_why(p, why));
			tpd_pipe_msg_consumed(m, why, tpd_pipe_why(p, why));
		} else if (m->copying && m->xh) {
			tpd_xh_cancel(
			    m->xh); /* completes, failed, once no thread touches the memory */
		} else if (m->copying && m->ring) {
			tpd_pring_abort(m); /* completes, cancelled, from the loop */
		} else if (m->copying && m->job) {
			/* completes, cancelled: it may be waiting for a stream that never ends */
			tpb_copier_abandon(tpd_daemon_copier(p->d), m->job);
		}
	}
	/* Messages the peer wrote to @e will never be read. */
	tpu_list_for_each_safe(m, tmp, &peer->rq, rnode) if (!m->copying)
	    tpd_pipe_msg_consumed(m, why, tpd_pipe_why(p, why));
	else if (m->xh) tpd_xh_cancel(m->xh);
	else if (m->ring) tpd_pring_abort(m);
	else if (m->job) tpb_copier_abandon(tpd_daemon_copier(p->d), m->job);
	if (peer->session) {
		peer->owed = why;
		peer->owed_session = tpd_session_id(peer->session);
	}
	tpd_pipe_end_owed_maybe(peer);
	tpd_pipe_end_owed_maybe(e);
}

void tpd_pipe_end_close(struct tpd_pipe_end *e)
{
	if (!e->session)
		return;
	e->owed = TPW__V1__STATUS__STATUS_CANCELED;
	e->owed_session = tpd_session_id(e->session);
	tpd_pipe_end_detach(e, TPW__V1__STATUS__STATUS_CLOSED);
}
