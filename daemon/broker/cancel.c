/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Cancel (protocol minor 5, tp_cancel()): a client gives up on one of its pending writes or
 * reads, on the loop thread. What can still be stopped is stopped and completes with
 * STATUS_CANCELED; what is being copied (or already completed) completes with its real result,
 * so that a completion always means that no copy uses the operation's memory any more. The
 * pipe stays usable: message ids, write order and read order are kept. Part of the pipe module
 * (pipe_int.h); what a write or read is and how copies run is pipe.c's, msg.c's and xh.c's.
 *
 * A write the daemon holds but whose bytes nobody copies: its WriteDone says CANCELED at once
 * and its sources are released; the message stays in line, so that the reader, which may have
 * its descriptor already, gets ReadDone{CANCELED, "the writer cancelled this message"} when it
 * reads it (a discard is fine), and the messages behind it keep their order. A read whose
 * copy has not started: ReadDone{CANCELED} to the reader, and the message is discarded: its
 * write completes with CANCELED, "the reader cancelled its read of this message". Across
 * hosts the same holds for what has not started on the peer link; a send or receive already
 * running on the link cannot be stopped and completes with its result.
 */
#include <errno.h>
#include <stdio.h>
#include "log.h"
#include "pipe_int.h"

#define WHY_WRITER "the writer cancelled this message"
#define WHY_READER "the reader cancelled its read of this message"

static struct tpd_msg *find_write(struct tpd_pipe_end *e, uint64_t write_id)
{
	struct tpd_msg *m;

	tpu_list_for_each(m, &e->wq, wnode) if (m->write_id == write_id) return m;
	return NULL;
}

static struct tpd_msg *find_read(struct tpd_pipe_end *w, uint64_t msg_id)
{
	struct tpd_msg *m;

	tpu_list_for_each(m, &w->rq, rnode) if (m->msg_id == msg_id) return m;
	return NULL;
}

static void cancel_write(struct tpd_pipe_end *e, uint64_t write_id)
{
	struct tpd_pipe_end *r = tpd_pipe_end_peer(e);
	struct tpd_msg *m;

	if (e->pipe->connecting) {
		if (tpd_xconnect_held_cancel(e->pipe, write_id))
			tpd_pipe_write_reject(e, write_id, -ECANCELED, "cancelled");
		return;
	}
	m = find_write(e, write_id);
	/* Completed (its WriteDone waits for earlier writes), eager, or being copied. */
	if (!m || m->write_ready || m->eager || m->copying || m->canceled)
		return;
	tpd_pipe_log(e->pipe, e->session, TPU_LOG_DEBUG, "write %llu (message %llu) cancelled",
		     (unsigned long long)write_id, (unsigned long long)m->msg_id);
	if (m->read_requested) {
		/* The reader's allocation is in: its copy or send waits for an earlier one. */
		if (m->xh)
			tpd_xh_abandon(m, TPW__V1__STATUS__STATUS_CANCELED, WHY_WRITER);
		if (!r->remote)
			tpd_pipe_send_read_done(r, m->msg_id, TPW__V1__STATUS__STATUS_CANCELED,
						WHY_WRITER);
		tpd_pipe_msg_consumed(m, TPW__V1__STATUS__STATUS_CANCELED, "cancelled");
		tpd_pipe_start_next_copy(e);
		return;
	}
	/* Nobody asked for it yet: it stays in line until the reader reads or drops it. */
	m->canceled = true;
	tpd_msg_release_src(m);
	tpd_pipe_write_complete(m, TPW__V1__STATUS__STATUS_CANCELED, "cancelled");
}

static void cancel_read(struct tpd_pipe_end *r, uint64_t msg_id)
{
	struct tpd_pipe_end *w = tpd_pipe_end_peer(r);
	struct tpd_msg *m = find_read(w, msg_id);

	if (!m || !m->read_requested || m->eager || m->copying)
		return;
	tpd_pipe_log(r->pipe, r->session, TPU_LOG_DEBUG, "read of message %llu cancelled",
		     (unsigned long long)msg_id);
	if (m->xh) /* a receive from another host that has not asked for the bytes yet */
		tpd_xh_abandon(m, TPW__V1__STATUS__STATUS_CANCELED, WHY_READER);
	tpb_copier_job_free(m->job);
	m->job = NULL;
	tpd_pipe_send_read_done(r, m->msg_id, TPW__V1__STATUS__STATUS_CANCELED, "cancelled");
	tpd_pipe_msg_consumed(m, TPW__V1__STATUS__STATUS_CANCELED, WHY_READER);
	tpd_pipe_start_next_copy(w);
}

void tpd_cancel_handle(struct tpd_pipe_end *e, const Tpw__V1__Cancel *c)
{
	if (!tpd_pipe_end_attached(e))
		return;
	if (c->kind == TPW__V1__CANCEL_KIND__CANCEL_WRITE)
		cancel_write(e, c->id);
	else
		cancel_read(e, c->id);
}

void tpd_cancel_read_canceled(struct tpd_pipe_end *r, struct tpd_msg *m)
{
	m->read_requested = true;
	tpd_pipe_send_read_done(r, m->msg_id, TPW__V1__STATUS__STATUS_CANCELED, WHY_WRITER);
	tpd_pipe_msg_consumed(m, TPW__V1__STATUS__STATUS_CANCELED, WHY_WRITER);
}

void tpd_cancel_peer_read_canceled(struct tpd_pipe_end *w, struct tpd_msg *m, uint64_t xfer_id)
{
	m->read_requested = true;
	tpd_xh_tell_end(w->pipe, xfer_id, TPW__V1__STATUS__STATUS_CANCELED, WHY_WRITER, 0, false);
	tpd_pipe_msg_consumed(m, TPW__V1__STATUS__STATUS_CANCELED, WHY_WRITER);
	tpd_pipe_start_next_copy(w);
}
