/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The local part's state. See local.h. It keeps the list of sessions (session.c adds and
 * removes them), the scratch buffer conn.c packs ring frames in, and runs the spin loop: once a
 * control ring moved, every ring session is polled from a zero timeout between other events
 * until none moves for the spin budget, then the rings' sleeping flags are set and the loop
 * sleeps until a doorbell. It does not read or write any connection itself (conn.c does).
 */
#include <errno.h>
#include <stdlib.h>
#include "conn.h"
#include "copier.h"
#include "core.h"
#include "local.h"
#include "session.h"

struct tpd_local {
	struct tpd_daemon *d;
	const struct tpd_local_pipe_ops *pipe_ops; /* the broker's (tpd_local_set_pipe_ops()) */
	const struct tpd_local_group_ops *group_ops; /* group/'s (tpd_local_set_group_ops()) */
	const struct tpd_local_chan_ops *chan_ops;   /* chan/'s (tpd_local_set_chan_ops()) */
	const struct tpd_local_wq_ops *wq_ops;	     /* chan/wq.c's (tpd_local_set_wq_ops()) */
	struct tpu_list sessions;
	unsigned n_sessions;
	uint64_t next_session_id;
	uint8_t *scratch;	/* frames packed straight into a control ring */
	size_t scratch_cap;
	struct event *ev_spin;	/* polls busy control rings between events */
	bool spinning;		/* ev_spin is active */
	uint64_t spin_until_ns; /* stop polling then, unless a ring moves */
	uint64_t slept_ns;	/* when the rings' sleeping flags were last set */
	struct tpu_spin spin;
};

static void local_on_spin(evutil_socket_t fd, short what, void *arg);

void tpd_local_set_pipe_ops(struct tpd_local *l, const struct tpd_local_pipe_ops *ops)
{
	l->pipe_ops = ops;
}

void tpd_local_set_group_ops(struct tpd_local *l, const struct tpd_local_group_ops *ops)
{
	l->group_ops = ops;
}

const struct tpd_local_group_ops *tpd_local_group_ops(const struct tpd_local *l)
{
	return l->group_ops;
}

void tpd_local_set_chan_ops(struct tpd_local *l, const struct tpd_local_chan_ops *ops)
{
	l->chan_ops = ops;
}

const struct tpd_local_chan_ops *tpd_local_chan_ops(const struct tpd_local *l)
{
	return l->chan_ops;
}

void tpd_local_set_wq_ops(struct tpd_local *l, const struct tpd_local_wq_ops *ops)
{
	l->wq_ops = ops;
}

const struct tpd_local_wq_ops *tpd_local_wq_ops(const struct tpd_local *l)
{
	return l->wq_ops;
}

const struct tpd_local_pipe_ops *tpd_local_pipe_ops(const struct tpd_local *l)
{
	return l->pipe_ops;
}

int tpd_local_new(struct tpd_daemon *d, struct tpd_local **ret)
{
	struct tpd_local *l = calloc(1, sizeof(*l));

	if (!l)
		return -ENOMEM;
	l->d = d;
	l->next_session_id = 1;
	tpu_list_init(&l->sessions);
	l->ev_spin = evtimer_new(tpd_daemon_base(d), local_on_spin, l);
	if (!l->ev_spin) {
		free(l);
		return -ENOMEM;
	}
	*ret = l;
	return 0;
}

void tpd_local_stop(struct tpd_local *l)
{
	struct tpd_session *s, *tmp;

	if (!l)
		return;
	tpu_list_for_each_safe(s, tmp, &l->sessions, node)
		tpd_session_free(s, TPW__V1__STATUS__STATUS_SHUTDOWN);
}

void tpd_local_free(struct tpd_local *l)
{
	if (!l)
		return;
	tpd_local_stop(l);
	event_free(l->ev_spin);
	free(l->scratch);
	free(l);
}

unsigned tpd_local_session_count(const struct tpd_local *l)
{
	return l->n_sessions;
}

struct tpd_session *tpd_local_session_next(struct tpd_local *l, struct tpd_session *prev)
{
	struct tpu_list *n = prev ? prev->node.next : l->sessions.next;

	return n == &l->sessions ? NULL : tpu_container_of(n, struct tpd_session, node);
}

struct tpd_session *tpd_local_session_find(struct tpd_local *l, uint64_t id)
{
	struct tpd_session *s;

	tpu_list_for_each(s, &l->sessions, node) if (s->id == id) return s->dead ? NULL : s;
	return NULL;
}

uint64_t tpd_local_session_add(struct tpd_local *l, struct tpd_session *s)
{
	tpu_list_insert_tail(&l->sessions, &s->node);
	l->n_sessions++;
	return l->next_session_id++;
}

void tpd_local_session_remove(struct tpd_local *l, struct tpd_session *s)
{
	tpu_list_remove(&s->node);
	l->n_sessions--;
}

uint8_t *tpd_local_scratch(struct tpd_local *l, size_t len)
{
	if (len > l->scratch_cap) {
		uint8_t *nb = realloc(l->scratch, len);

		if (!nb)
			return NULL;
		l->scratch = nb;
		l->scratch_cap = len;
	}
	return l->scratch;
}

/* ---- control ring polling ------------------------------------------------------------------ */

/* Polls every ring session once. Return: true if any ring moved. */
static bool spin_poll(struct tpd_local *l)
{
	struct tpd_session *s, *tmp;
	bool moved = false;

	tpu_list_for_each_safe(s, tmp, &l->sessions, node)
		if (tpd_conn_is_ring(&s->conn))
			moved |= tpd_conn_ring_poll(&s->conn);
	return moved;
}

/* Sets every ring's sleeping flag. Return: false if one moved meanwhile (keep polling). */
static bool spin_sleep(struct tpd_local *l)
{
	struct tpd_session *s;
	bool raced = false;

	tpu_list_for_each(s, &l->sessions, node)
		raced |= tpd_conn_ring_sleep(&s->conn);
	if (!raced)
		return true;
	tpu_list_for_each(s, &l->sessions, node)
		tpd_conn_ring_wake(&s->conn);
	return false;
}

/* Runs local_on_spin() again once the loop has polled every fd and run what they woke: a
 * zero timeout, not event_active(), which libevent would run again in the same pass. */
static void spin_rearm(struct tpd_local *l)
{
	static const struct timeval zero = { 0, 0 };

	evtimer_add(l->ev_spin, &zero);
}

static void local_on_spin(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_local *l = arg;
	bool moved = spin_poll(l);
	uint64_t now = tpu_now_ns();

	if (moved) {
		l->spin.cur_ns = l->spin.max_ns;
		l->spin_until_ns = now + l->spin.cur_ns;
		tpu_spin_uncontended();
	}
	/* Sleep when polling is off, when copies are in flight (they need both CPUs more than we
	 * need a quick answer, and their completions wake us anyway), after the budget, or while
	 * other threads hold the CPUs (a yield that kept us off for long: ring.h). */
	if (!tpd_daemon_cfg(l->d)->spin_us || tpd_daemon_bulk_running(l->d) ||
	    (!moved && (now >= l->spin_until_ns || tpu_spin_quiet(now)))) {
		if (spin_sleep(l)) {
			l->spinning = false;
			l->slept_ns = now;
			return;
		}
		l->spin_until_ns = now + l->spin.cur_ns; /* a ring moved meanwhile */
	} else if (!moved && tpu_spin_pause()) {
		tpu_spin_contended(tpu_now_ns());
	}
	spin_rearm(l);
}

void tpd_local_spin_kick(struct tpd_local *l)
{
	struct tpd_session *s;
	uint64_t now, max = (uint64_t)tpd_daemon_cfg(l->d)->spin_us * 1000;

	if (l->spinning)
		return;
	now = tpu_now_ns();
	if (l->spin.max_ns != max)
		tpu_spin_init(&l->spin, max);
	else if (l->slept_ns)
		tpu_spin_slept(&l->spin, now - l->slept_ns + l->spin.cur_ns);
	if (max)
		tpu_list_for_each(s, &l->sessions, node)
			tpd_conn_ring_wake(&s->conn);
	l->spinning = true;
	l->spin_until_ns = now + l->spin.cur_ns;
	spin_rearm(l); /* never polls from here: the caller may be parsing a frame */
}
