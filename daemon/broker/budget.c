/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The daemon-wide budget for unread messages (pipe-queue-bytes-max) as a wait rather than a
 * refusal, for clients that keep to flow control (minor >= 5). Each pipe's write window bounds
 * that pipe alone; many pipes within their windows can still spend the budget. A Write that does
 * not fit then is refused with WriteDone{resend} (not taken, its room returned with FlowCredit),
 * its pipe end joins a FIFO of waiting ends, and every Write of that end is refused the same way
 * until the budget has room for the first one: the daemon sets that room aside for the end and
 * sends it FlowResume; the client answers FlowResume and resends, in order. Waiting ends are
 * woken in the order they started to wait, and an end that does not wait may not pass them, so
 * no pipe starves. The bytes held (pipe_bytes) plus the room set aside never exceed the budget.
 * Older clients, and a message larger than the budget itself, still get -ENOBUFS. The same wait
 * keeps a cross-host pipe's local writer within the far daemon's per-pipe queue limits (which
 * may be smaller than ours; learnt at pipe set-up): it resumes as the far reader consumes. What
 * a message costs, and the local per-pipe limits, are pipe.c's and msg.c's. Loop thread only.
 */
#include <stdio.h>
#include "core.h"
#include "log.h"
#include "pipe_int.h"
#include "session.h"

void tpd_budget_unreserve(struct tpd_pipe_end *e)
{
	tpd_daemon_quota(e->pipe->d)->pipe_reserved -= e->reserved;
	e->reserved = 0;
}

void tpd_budget_charge(struct tpd_daemon *d, uint64_t cost)
{
	struct tpd_quota *q = tpd_daemon_quota(d);

	q->pipe_bytes += cost;
	if (q->pipe_bytes + q->pipe_reserved > q->pipe_bytes_peak)
		q->pipe_bytes_peak = q->pipe_bytes + q->pipe_reserved;
}

static bool end_waits(const struct tpd_pipe_end *e)
{
	return !e->remote && e->session && tpd_session_client_minor(e->session) >= TPW_MINOR_FLOW;
}

int tpd_budget_check(struct tpd_pipe_end *e, uint64_t cost, char *why, size_t wl)
{
	struct tpd_daemon *d = e->pipe->d;
	struct tpd_broker *b = tpd_daemon_broker(d);
	struct tpd_quota *q = tpd_daemon_quota(d);
	uint64_t total = tpd_daemon_cfg(d)->pipe_queue_bytes_total;
	bool resumed = e->reserved != 0;

	if (e->budget != TPD_BUDGET_OPEN)
		return -EAGAIN; /* sent before its client learnt that it waits */
	tpd_budget_unreserve(e); /* the room set aside goes with this write */
	if (q->pipe_bytes + q->pipe_reserved + cost <= total &&
	    (resumed || !end_waits(e) || tpu_list_empty(&b->budget_wait)))
		return 0;
	if (!end_waits(e) || cost > total) {
		snprintf(why, wl, "pipe queues of this daemon full: %llu bytes held for unread "
			 "messages in all pipes, this one needs %llu (limit %llu, tpipd "
			 "--pipe-queue-bytes-max)",
			 (unsigned long long)(q->pipe_bytes + q->pipe_reserved),
			 (unsigned long long)cost, (unsigned long long)total);
		return -ENOBUFS;
	}
	e->budget = TPD_BUDGET_WAITING;
	e->budget_need = cost;
	tpu_list_insert_tail(&b->budget_wait, &e->budget_node);
	q->budget_waits++;
	tpd_pipe_log(e->pipe, e->session, TPU_LOG_DEBUG, "waits for %llu bytes of the daemon-wide "
		     "budget (%llu of %llu held or set aside)", (unsigned long long)cost,
		     (unsigned long long)(q->pipe_bytes + q->pipe_reserved),
		     (unsigned long long)total);
	return -EAGAIN;
}

void tpd_budget_refuse(struct tpd_pipe_end *e, uint64_t write_id, uint32_t tail_len)
{
	Tpw__V1__WriteDone wd = TPW__V1__WRITE_DONE__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;

	wd.pipe_id = e->local_id;
	wd.write_id = write_id;
	wd.status = TPW__V1__STATUS__STATUS_LIMIT;
	wd.message = "the daemon-wide budget is spent (tpipd --pipe-queue-bytes-max): resend";
	wd.resend = true;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_WRITE_DONE;
	dm.write_done = &wd;
	tpd_session_send(e->session, &dm, NULL, 0);
	tpd_pipe_credit(e, tail_len);
}

void tpd_budget_leave(struct tpd_pipe_end *e)
{
	tpu_list_remove(&e->budget_node);
	tpd_budget_unreserve(e);
	e->budget = TPD_BUDGET_OPEN;
}

void tpd_budget_resumed(struct tpd_pipe_end *e, const Tpw__V1__FlowResume *fr)
{
	if (e->budget != TPD_BUDGET_RESUMED)
		return; /* not asked for: nothing changes */
	e->budget = TPD_BUDGET_OPEN;
	if (fr->nothing_held)
		tpd_budget_unreserve(e);
}

void tpd_budget_wake(struct tpd_daemon *d)
{
	Tpw__V1__FlowResume fr = TPW__V1__FLOW_RESUME__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	struct tpd_broker *b = tpd_daemon_broker(d);
	struct tpd_quota *q = tpd_daemon_quota(d);
	struct tpd_pipe_end *e;

	dm.body_case = TPW__V1__DAEMON_MSG__BODY_FLOW_RESUME;
	dm.flow_resume = &fr;
	while ((e = tpu_list_first(&b->budget_wait, struct tpd_pipe_end, budget_node))) {
		if (q->pipe_bytes + q->pipe_reserved + e->budget_need >
		    tpd_daemon_cfg(d)->pipe_queue_bytes_total)
			return; /* strictly in order: the first waiter is served first */
		tpu_list_remove(&e->budget_node);
		if (!e->session || tpd_session_dead(e->session)) {
			e->budget = TPD_BUDGET_OPEN;
			continue;
		}
		e->budget = TPD_BUDGET_RESUMED;
		e->reserved = e->budget_need;
		q->pipe_reserved += e->reserved;
		tpd_budget_charge(d, 0); /* the peak counts room set aside */
		fr.pipe_id = e->local_id;
		tpd_session_send(e->session, &dm, NULL, 0);
	}
}

/* ---- the far daemon's queue of a cross-host pipe ---- */

static bool far_fits(const struct tpd_pipe_end *e, uint64_t tail_len)
{
	const struct tpd_pipe *p = e->pipe;

	return (!p->far_queue_max || e->queued < p->far_queue_max) &&
	       (!p->far_queue_bytes || e->queued_bytes + tail_len <= p->far_queue_bytes);
}

int tpd_budget_far_check(struct tpd_pipe_end *e, uint32_t tail_len, char *why, size_t wl)
{
	const struct tpd_pipe *p = e->pipe;

	if (!tpd_pipe_end_peer(e)->remote || far_fits(e, tail_len))
		return 0;
	if (p->far_queue_bytes && tail_len > p->far_queue_bytes) {
		snprintf(why, wl, "a message of %u inline bytes is over the reader's daemon's "
			 "limit of %llu (tpipd --pipe-queue-bytes on the reader's host)", tail_len,
			 (unsigned long long)p->far_queue_bytes);
		return -ENOBUFS;
	}
	if (!end_waits(e)) {
		snprintf(why, wl, "pipe queue full on the reader's host: %u unread messages, %llu "
			 "inline bytes (its limits %u, %llu: tpipd --pipe-queue-max, "
			 "--pipe-queue-bytes there)", e->queued,
			 (unsigned long long)e->queued_bytes, p->far_queue_max,
			 (unsigned long long)p->far_queue_bytes);
		return -ENOBUFS;
	}
	e->budget = TPD_BUDGET_WAITING_FAR;
	e->budget_need = tail_len;
	return -EAGAIN;
}

void tpd_budget_far_wake(struct tpd_pipe_end *e)
{
	Tpw__V1__FlowResume fr = TPW__V1__FLOW_RESUME__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;

	if (e->budget != TPD_BUDGET_WAITING_FAR || !far_fits(e, e->budget_need))
		return;
	if (!e->session || tpd_session_dead(e->session)) {
		e->budget = TPD_BUDGET_OPEN;
		return;
	}
	e->budget = TPD_BUDGET_RESUMED;
	fr.pipe_id = e->local_id;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_FLOW_RESUME;
	dm.flow_resume = &fr;
	tpd_session_send(e->session, &dm, NULL, 0);
}
