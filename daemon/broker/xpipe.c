/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Pipes to another host's daemon, on the loop thread: parsing tpip://HOST[:PORT]/NAME, opening
 * the pipe over a peer link (PeerConnect and its reply, the connect deadline, writes held until
 * the remote end accepted, the fall-back to a local connect when the address is this daemon),
 * answering the peer's PeerConnect for a local listener (decided on the link's authenticated
 * identity and the listener's remote access, never on the uid the peer claims; a connect that
 * asks to wait is kept until a listener that admits the link registers), and the peer
 * messages of an open pipe (descriptors, read requests, consumed messages, closes). The
 * transfers themselves are xh.c's; the link is peer.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <event2/event.h>
#include "daemon.h"
#include "log.h"
#include "peer.h"
#include "pipe_int.h"
#include "session.h"
#include "validate.h"

/* A write received while the pipe was still connecting, replayed once it is open. */
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

/*
 * Arms a wait deadline @tv from now. libevent measures it from the time cached at the start of
 * the loop pass, which long work in the same pass (or valgrind) leaves tens of milliseconds
 * stale: the wait would end early. Refresh the cache first.
 */
static void timer_add_fresh(struct event *ev, const struct timeval *tv)
{
	event_base_update_cache_time(event_get_base(ev));
	evtimer_add(ev, tv);
}

void tpd_xpipe_tell(struct tpd_pipe *p, Tpw__V1__PeerMsg *pm, const struct iovec *iov, int n)
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

static void held_free(struct held_write *h)
{
	tpu_list_remove(&h->node);
	tpw_client_msg_free(h->cm);
	free(h->tail);
	free(h);
}

bool tpd_xpipe_held_cancel(struct tpd_pipe *p, uint64_t write_id)
{
	struct held_write *h;

	tpu_list_for_each(h, &p->held, node) {
		if (h->cm->write->write_id != write_id)
			continue;
		p->n_held--;
		p->held_bytes -= h->tail_len;
		held_free(h);
		return true;
	}
	return false;
}

/* A write on a pipe still connecting: keep it (within the queue limits) for later. */
void tpd_xpipe_hold(struct tpd_pipe_end *e, Tpw__V1__ClientMsg *cm, const uint8_t *tail,
		    uint32_t tail_len)
{
	struct tpd_pipe *p = e->pipe;
	const struct tpd_config *cfg = &p->d->cfg;
	struct held_write *h;

	if (p->n_held >= cfg->pipe_queue_max || p->held_bytes + tail_len > cfg->pipe_queue_bytes) {
		tpd_pipe_write_reject(e, cm->write->write_id, -ENOBUFS,
				      "pipe queue full while the connect is pending");
		tpd_pipe_credit(e, tail_len);
		tpw_client_msg_free(cm);
		return;
	}
	h = calloc(1, sizeof(*h));
	if (!h || (tail_len && !(h->tail = malloc(tail_len)))) {
		free(h);
		tpd_pipe_write_reject(e, cm->write->write_id, -ENOMEM, "out of memory");
		tpd_pipe_credit(e, tail_len);
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
			tpd_pipe_write_reject(e, h->cm->write->write_id, err, why);
			tpd_pipe_credit(e, h->tail_len);
		}
		tpu_list_init(&h->node);
		held_free(h);
	}
	p->n_held = 0;
	p->held_bytes = 0;
}

/* Frees the cross-host state of @p (tpd_pipe_maybe_free). */
void tpd_xpipe_done(struct tpd_pipe *p)
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

/* The far daemon may hold @p's connect waiting for a listener: tell it to forget it. */
static void cancel_remote_wait(struct tpd_pipe *p)
{
	Tpw__V1__PeerPipeClose pc = TPW__V1__PEER_PIPE_CLOSE__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;

	if (!p->link || !p->connect_sent || !p->wait_ms || p->waiting)
		return;
	pc.pipe_id = p->id;
	pc.status = TPW__V1__STATUS__STATUS_CANCELED;
	pc.connect_pending = true;
	pm.body_case = TPW__V1__PEER_MSG__BODY_PIPE_CLOSE;
	pm.pipe_close = &pc;
	tpd_peer_send(p->link, &pm, NULL, 0);
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
		tpd_pipe_maybe_free(p);
		return;
	}
	if (p->waiting)
		snprintf(addr, sizeof(addr), "%s", p->listener);
	else
		snprintf(addr, sizeof(addr), "tpip://%s/%s", p->peer_addr, p->listener);
	c.req_id = p->connect_req_id;
	c.pipe_id = e->local_id;
	c.address = addr;
	held_flush(p, err, why);
	tpu_hmap_del(&s->pipes, e->local_id);
	e->session = NULL;
	tpd_pipe_connect_fail(s, &c, err, why);
	tpd_pipe_maybe_free(p);
}

static void xpipe_on_connect_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_pipe *p = arg;
	char why[400], dial[200] = ""; /* why: the text below with both %s at their longest */

	if (!p->connecting)
		return;
	if (p->waiting) {
		snprintf(why, sizeof(why), "no listener named '%.255s' appeared within %u ms",
			 p->listener, p->wait_ms);
		xconnect_fail(p, -ETIMEDOUT, why);
		return;
	}
	if (p->link) {
		/* The link's own timer may have run out in the same pass of the loop: its failure,
		 * already on its way to this pipe, says more (each address and why it failed). */
		if (tpd_peer_is_failed(p->link))
			return;
		tpd_peer_dial_text(p->link, dial, sizeof(dial));
	}
	snprintf(why, sizeof(why), "no answer from tpipd at %.120s within %llu ms%s%s",
		 p->peer_addr,
		 (unsigned long long)p->d->cfg.peer_connect_timeout_ms + p->wait_ms,
		 dial[0] ? ": " : "", dial);
	cancel_remote_wait(p);
	xconnect_fail(p, -ETIMEDOUT, why);
}

void tpd_xpipe_connect(struct tpd_daemon *d, struct tpd_session *s, const Tpw__V1__Connect *c)
{
	struct tpd_peer *pr = NULL;
	struct tpd_pipe *p;
	const char *name;
	char host[TPW_TPIP_HOST_MAX + 1], why[280], bad[120];
	uint16_t port;
	int r;

	if (tpw_tpip_parse(c->address, (uint16_t)d->cfg.peer_port, host, &port, &name, bad,
			   sizeof(bad)) < 0) {
		snprintf(why, sizeof(why), "invalid address '%.100s' (tpip://HOST[:PORT]/NAME): %s",
			 c->address, bad);
		tpd_pipe_connect_fail(s, c, -EINVAL, why);
		return;
	}
	if (tpu_hmap_get(&s->pipes, c->pipe_id)) {
		tpd_pipe_connect_fail(s, c, -EADDRINUSE, "pipe id already in use");
		return;
	}
	if (tpd_session_pipe_count(s) >= d->cfg.pipes_max) {
		snprintf(why, sizeof(why), "pipe limit of %u per client reached (tpipd "
			 "--pipes-max)",
			 d->cfg.pipes_max);
		tpd_pipe_connect_fail(s, c, -ENOBUFS, why);
		return;
	}
	r = tpd_peer_get(d, host, port, &pr, why, sizeof(why));
	if (r < 0) {
		tpd_pipe_connect_fail(s, c, r, why);
		return;
	}
	p = tpd_pipe_new(d, name);
	if (!p || !(p->ev_connect = evtimer_new(d->base, xpipe_on_connect_timeout, p))) {
		if (p)
			free(p->listener);
		free(p);
		tpd_pipe_connect_fail(s, c, -ENOMEM, "out of memory");
		return;
	}
	snprintf(p->peer_addr, sizeof(p->peer_addr), "%s", tpd_peer_name(pr));
	tpd_pipe_end_init(&p->end[0], p, s, c->pipe_id);
	tpd_pipe_end_init(&p->end[1], p, NULL, 0);
	p->end[1].remote = true;
	p->link = pr;
	p->connecting = true;
	p->connect_req_id = c->req_id;
	p->expect_uid_set = c->expect_uid_set;
	p->expect_uid = c->expect_uid;
	p->wait_ms = TPU_MIN(c->wait_ms, TPW_PEER_WAIT_MS_MAX); /* the far daemon's bound */
	tpu_list_insert_tail(&d->pipes, &p->node);
	d->n_pipes++;
	if (tpu_hmap_put(&s->pipes, c->pipe_id, &p->end[0]) < 0 || tpd_peer_pipe_add(pr, p) < 0) {
		tpu_hmap_del(&s->pipes, c->pipe_id);
		p->end[0].session = NULL;
		p->connecting = false;
		tpd_pipe_connect_fail(s, c, -ENOMEM, "out of memory");
		tpd_pipe_maybe_free(p);
		return;
	}
	{
		/* The far daemon answers within wait_ms: the deadline leaves it that much more. */
		uint64_t ms = (uint64_t)d->cfg.peer_connect_timeout_ms + p->wait_ms;
		struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
		timer_add_fresh(p->ev_connect, &tv);
	}
	if (p->wait_ms)
		tpd_pipe_log(p, s, TPU_LOG_INFO, "connecting to '%s' on %s, waiting up to %u ms "
			     "for it to listen", name, p->peer_addr, p->wait_ms);
	else
		tpd_pipe_log(p, s, TPU_LOG_INFO, "connecting to '%s' on %s", name, p->peer_addr);
	if (tpd_peer_is_up(pr))
		tpd_xpipe_link_up(p);
}

void tpd_xpipe_link_up(struct tpd_pipe *p)
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
	pc.expect_uid_set = p->expect_uid_set;
	pc.expect_uid = p->expect_uid;
	if (p->wait_ms && !tpd_peer_connect_wait_ok(p->link))
		p->wait_ms = 0; /* a daemon older than wait_ms: answers at once, as documented */
	pc.wait_ms = p->wait_ms;
	pc.queue_max = p->d->cfg.pipe_queue_max;
	pc.queue_bytes = p->d->cfg.pipe_queue_bytes;
	pm.body_case = TPW__V1__PEER_MSG__BODY_CONNECT;
	pm.connect = &pc;
	tpd_xpipe_tell(p, &pm, NULL, 0);
	p->connect_sent = true;
}

/* The tpip:// address of @p, asking to wait, was this daemon's own and names no listener yet:
 * wait for it here, as tpd_xpipe_wait_local() does for a local name, for the whole wait. */
static void xpipe_wait_here(struct tpd_pipe *p)
{
	struct timeval tv = { p->wait_ms / 1000, (p->wait_ms % 1000) * 1000 };

	if (p->link)
		tpd_peer_pipe_remove(p->link, p);
	p->link = NULL;
	p->waiting = true;
	snprintf(p->peer_addr, sizeof(p->peer_addr), "this host");
	timer_add_fresh(p->ev_connect, &tv); /* replaces the peer deadline */
	tpd_pipe_log(p, local_end(p)->session, TPU_LOG_INFO, "address is this daemon: waiting up "
		     "to %u ms for listener '%s'", p->wait_ms, p->listener);
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
	c.expect_uid_set = p->expect_uid_set;
	c.expect_uid = p->expect_uid;
	tpu_hmap_del(&s->pipes, e->local_id); /* tpd_pipe_connect_check wants the id free */
	r = tpd_pipe_connect_check(p->d, s, &c, &l, why, sizeof(why));
	if (r == 0 && tpu_hmap_put(&s->pipes, e->local_id, e) < 0)
		r = -ENOMEM;
	if (r < 0) {
		tpu_hmap_put(&s->pipes, e->local_id, e);
		if (r == -ENOENT && p->wait_ms && !p->waiting)
			xpipe_wait_here(p);
		else
			xconnect_fail(p, r, why);
		return;
	}
	if (p->link)
		tpd_peer_pipe_remove(p->link, p);
	p->link = NULL;
	p->connecting = false;
	event_del(p->ev_connect);
	tpd_pipe_end_init(&p->end[1], p, l->owner,
			  TPD_PIPE_ACCEPT_ID_BASE +
			      ((struct tpd_session *)l->owner)->next_accept_id++);
	p->end[1].remote = false;
	if (tpu_hmap_put(&((struct tpd_session *)l->owner)->pipes, p->end[1].local_id, &p->end[1]) <
	    0) {
		p->end[1].remote = true;
		p->end[1].session = NULL;
		xconnect_fail(p, -ENOMEM, "out of memory");
		return;
	}
	l->accepted++;
	if (p->waiting)
		tpd_pipe_log(p, s, TPU_LOG_INFO,
			     "connected to '%s' (session %llu) once it listened", l->name,
			     (unsigned long long)((struct tpd_session *)l->owner)->id);
	else
		tpd_pipe_log(p, s, TPU_LOG_INFO,
			     "address is this daemon: connected to '%s' locally", l->name);
	p->waiting = false;
	tpd_pipe_reply_connected(s, p->connect_req_id, e->local_id, l->name, (uint32_t)l->uid,
				 false);
	tpd_pipe_send_accepted(l->owner, l, &p->end[1], s);
	held_flush(p, 0, NULL);
}

void tpd_xpipe_wait_local(struct tpd_daemon *d, struct tpd_session *s, const Tpw__V1__Connect *c)
{
	struct timeval tv = { c->wait_ms / 1000, (c->wait_ms % 1000) * 1000 };
	struct tpd_pipe *p;
	char why[96];

	if (tpd_session_pipe_count(s) >= d->cfg.pipes_max) {
		snprintf(why, sizeof(why), "pipe limit of %u per client reached", d->cfg.pipes_max);
		tpd_pipe_connect_fail(s, c, -ENOBUFS, why);
		return;
	}
	p = tpd_pipe_new(d, c->address);
	if (!p || !(p->ev_connect = evtimer_new(d->base, xpipe_on_connect_timeout, p))) {
		if (p)
			free(p->listener);
		free(p);
		tpd_pipe_connect_fail(s, c, -ENOMEM, "out of memory");
		return;
	}
	snprintf(p->peer_addr, sizeof(p->peer_addr), "this host");
	tpd_pipe_end_init(&p->end[0], p, s, c->pipe_id);
	tpd_pipe_end_init(&p->end[1], p, NULL, 0);
	p->end[1].remote = true; /* no session yet: held writes, connect_fail as for tpip:// */
	p->connecting = true;
	p->waiting = true;
	p->wait_ms = c->wait_ms;
	p->connect_req_id = c->req_id;
	p->expect_uid_set = c->expect_uid_set;
	p->expect_uid = c->expect_uid;
	tpu_list_insert_tail(&d->pipes, &p->node);
	d->n_pipes++;
	if (tpu_hmap_put(&s->pipes, c->pipe_id, &p->end[0]) < 0) {
		p->end[0].session = NULL;
		p->connecting = false;
		tpd_pipe_connect_fail(s, c, -ENOMEM, "out of memory");
		tpd_pipe_maybe_free(p);
		return;
	}
	timer_add_fresh(p->ev_connect, &tv);
	tpd_pipe_log(p, s, TPU_LOG_INFO, "waiting up to %u ms for listener '%s'", c->wait_ms,
		     c->address);
}

/*
 * A far daemon's connect to a name that no listener admitting its link has registered here (yet),
 * with wait_ms: kept until one does (then answered as any PeerConnect), wait_ms passes
 * (STATUS_TIMEOUT naming the listener), the far daemon cancels it or the link goes away. At most
 * pipes-max per link: the far daemon holds its clients to that limit each, and a hostile one
 * cannot make this daemon hold more.
 */
struct xwait {
	struct tpu_list node; /* in d->xwaits */
	struct tpd_daemon *d;
	struct tpd_peer *link;
	struct event *ev;
	Tpw__V1__PeerConnect c; /* with its own copies of the strings */
};

static void xwait_free(struct xwait *w)
{
	tpu_list_remove(&w->node);
	if (w->ev)
		event_free(w->ev);
	free(w->c.name);
	free(w->c.remote_name);
	free(w);
}

static void xwait_on_timeout(evutil_socket_t fd, short what, void *arg)
{
	Tpw__V1__PeerConnectReply rep = TPW__V1__PEER_CONNECT_REPLY__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	struct xwait *w = arg;
	char why[400];

	snprintf(why, sizeof(why), "no listener named '%.255s' on %.60s appeared within %u ms",
		 w->c.name, tpd_peers_hostname(w->d), w->c.wait_ms);
	rep.pipe_id = w->c.pipe_id;
	rep.status = TPW__V1__STATUS__STATUS_TIMEOUT;
	rep.message = why;
	pm.body_case = TPW__V1__PEER_MSG__BODY_CONNECT_REPLY;
	pm.connect_reply = &rep;
	tpd_peer_send(w->link, &pm, NULL, 0);
	xwait_free(w);
}

/* Keeps connect @c of @pr waiting. Return: 0, or -errno with @why filled (answered by then). */
static int xwait_add(struct tpd_daemon *d, struct tpd_peer *pr, const Tpw__V1__PeerConnect *c,
		     char *why, size_t wl)
{
	struct timeval tv = { c->wait_ms / 1000, (c->wait_ms % 1000) * 1000 };
	unsigned n = 0, n_all = 0;
	struct xwait *w;

	tpu_list_for_each(w, &d->xwaits, node) {
		n_all++;
		if (w->link != pr)
			continue;
		if (w->c.pipe_id == c->pipe_id)
			return tpu_why(-EADDRINUSE, why, wl, "connect %llu is already waiting",
				       (unsigned long long)c->pipe_id);
		n++;
	}
	if (n >= d->cfg.pipes_max)
		return tpu_why(-ENOBUFS, why, wl, "%u connects from this host already wait for a "
			       "listener (limit %u, tpipd --pipes-max)", n, d->cfg.pipes_max);
	/* Per link alone, the authenticated peers together could keep pipes-max times
	 * peer-links-max waiting. */
	if (n_all >= d->cfg.peer_connect_waits_max)
		return tpu_why(-ENOBUFS, why, wl, "%u connects from other hosts already wait for a "
			       "listener here (limit %u, tpipd --peer-connect-waits-max)", n_all,
			       d->cfg.peer_connect_waits_max);
	w = calloc(1, sizeof(*w));
	if (!w)
		return tpu_why(-ENOMEM, why, wl, "out of memory");
	tpu_list_init(&w->node);
	w->d = d;
	w->link = pr;
	w->c = *c;
	w->c.base.n_unknown_fields = 0;
	w->c.base.unknown_fields = NULL;
	w->c.name = strdup(c->name);
	w->c.remote_name = strdup(c->remote_name ? c->remote_name : "");
	w->ev = evtimer_new(d->base, xwait_on_timeout, w);
	if (!w->c.name || !w->c.remote_name || !w->ev) {
		xwait_free(w);
		return tpu_why(-ENOMEM, why, wl, "out of memory");
	}
	tpu_list_insert_tail(&d->xwaits, &w->node);
	timer_add_fresh(w->ev, &tv);
	tpu_log_debug("peer %s: connect to '%s' waits up to %u ms for the listener",
		      tpd_peer_name(pr), c->name, c->wait_ms);
	return 0;
}

void tpd_xpipe_peer_waits_drop(struct tpd_daemon *d, struct tpd_peer *pr)
{
	struct xwait *w, *tmp;
	unsigned n = 0;

	if (!d->xwaits.next)
		return;
	tpu_list_for_each_safe(w, tmp, &d->xwaits, node) {
		if (w->link == pr) {
			xwait_free(w);
			n++;
		}
	}
	if (n)
		tpu_log_debug("peer %s: %u connects waiting for a listener dropped with the link",
			      tpd_peer_name(pr), n);
}

void tpd_xpipe_peer_wait_cancel(struct tpd_daemon *d, struct tpd_peer *pr, uint64_t pipe_id)
{
	struct xwait *w;

	tpu_list_for_each(w, &d->xwaits, node) {
		if (w->link == pr && w->c.pipe_id == pipe_id) {
			tpu_log_debug("peer %s: connect to '%s' canceled while waiting for the "
				      "listener", tpd_peer_name(pr), w->c.name);
			xwait_free(w);
			return;
		}
	}
}

/* Listener @l was just registered: answer the waiting connects it admits, as any connect. */
static void xwaits_listener_added(struct tpd_daemon *d, struct tpd_listener *l)
{
	struct xwait *w, *tmp;

	tpu_list_for_each_safe(w, tmp, &d->xwaits, node) {
		Tpw__V1__PeerConnect c = w->c;
		const char *ident = tpd_peer_identity(w->link);

		if (strcmp(w->c.name, l->name) != 0 ||
		    !tpd_listener_permits_remote(l, ident ? tpd_peer_identity_matches : NULL,
						 w->link))
			continue; /* to that far daemon, still no such listener */
		c.wait_ms = 0;
		tpd_xpipe_peer_connect(d, w->link, &c); /* the access checks and the answer */
		xwait_free(w);
	}
}

void tpd_xpipe_listener_added(struct tpd_daemon *d, const char *name)
{
	struct tpd_listener *l = tpd_listener_registry_find(&d->registry, name);
	struct tpd_pipe *p, *tmp;

	if (l)
		xwaits_listener_added(d, l);

	tpu_list_for_each_safe(p, tmp, &d->pipes, node)
		if (p->waiting && p->connecting && local_end(p)->session &&
		    strcmp(p->listener, name) == 0)
			xpipe_reroute_local(p); /* checks access; connects or fails the connect */
}

void tpd_xpipe_link_failed(struct tpd_pipe *p, int err, const char *why)
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
		snprintf(msg, sizeof(msg), "cannot reach tpipd at %.60s: %.110s", p->peer_addr,
			 why);
		xconnect_fail(p, err == -ECONNRESET ? -EHOSTUNREACH : err, msg);
		return;
	}
	snprintf(p->why, sizeof(p->why), "lost the peer daemon at %.60s: %.110s", p->peer_addr,
		 why);
	tpd_pipe_end_detach(remote_end(p), err == -ESHUTDOWN ? TPW__V1__STATUS__STATUS_SHUTDOWN
							     : TPW__V1__STATUS__STATUS_PEER_DIED);
}

/* The local end of cross-host pipe @p left with @why: tell the peer, stop connecting. */
void tpd_xpipe_local_left(struct tpd_pipe *p, Tpw__V1__Status why)
{
	struct tpd_pipe_end *re = remote_end(p);

	if (p->connecting) {
		/* A later OK reply finds no pipe and closes the peer's side; a connect the far
		 * daemon holds for its listener is forgotten there. */
		cancel_remote_wait(p);
		p->connecting = false;
		re->gone = why;
		while (!tpu_list_empty(&p->held))
			held_free(tpu_list_first(&p->held, struct held_write, node));
		return;
	}
	if (p->link && p->remote_id && tpd_pipe_end_attached(re))
		tell_close(p->link, p->remote_id, why, NULL);
}

void tpd_xpipe_peer_connect(struct tpd_daemon *d, struct tpd_peer *pr,
			    const Tpw__V1__PeerConnect *c)
{
	Tpw__V1__PeerConnectReply rep = TPW__V1__PEER_CONNECT_REPLY__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__Accepted a = TPW__V1__ACCEPTED__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	struct tpd_listener *l = tpd_listener_registry_find(&d->registry, c->name);
	const char *ident = tpd_peer_identity(pr);
	struct tpd_session *ls;
	struct tpd_pipe *p = NULL;
	char why[256] = "", logwhy[120] = "";
	int err = 0;

	/* A listener that does not admit this link is, to the peer, no listener at all: the same
	 * status and text as a missing name, so that names cannot be probed from other hosts. */
	if (l && !tpd_listener_permits_remote(l, ident ? tpd_peer_identity_matches : NULL, pr)) {
		snprintf(logwhy, sizeof(logwhy), "listener does not accept pipes from %s",
			 l->remote == TPW__V1__REMOTE_ACCESS__REMOTE_NONE ? "other hosts"
			 : ident ? "this peer's identity"
				 : "unauthenticated peers");
		l = NULL;
	}
	ls = l ? l->owner : NULL;
	if (!l && c->wait_ms && !d->stopping) {
		err = xwait_add(d, pr, c, why, sizeof(why));
		if (err == 0)
			return;
	} else if (!l) {
		snprintf(why, sizeof(why),
			 "no listener named '%.100s' on %.60s accepts pipes from other hosts",
			 c->name, tpd_peers_hostname(d));
		err = -ENOENT;
	} else if (c->expect_uid_set && (uint32_t)l->uid != c->expect_uid) {
		snprintf(why, sizeof(why),
			 "listener '%s' is owned by uid %u, not the expected uid %u", l->name,
			 (unsigned)l->uid, (unsigned)c->expect_uid);
		err = -EACCES;
	} else if (tpd_session_pipe_count(ls) >= d->cfg.pipes_max) {
		snprintf(why, sizeof(why), "pipe limit of %u per client reached (tpipd "
			 "--pipes-max)",
			 d->cfg.pipes_max);
		err = -ENOBUFS;
	} else if (d->stopping) {
		snprintf(why, sizeof(why), "daemon stopping");
		err = -ESHUTDOWN;
	} else if (!(p = tpd_pipe_new(d, l->name))) {
		snprintf(why, sizeof(why), "out of memory");
		err = -ENOMEM;
	}
	if (p) {
		snprintf(p->peer_addr, sizeof(p->peer_addr), "%s", tpd_peer_name(pr));
		tpd_pipe_end_init(&p->end[0], p, NULL, 0);
		p->end[0].remote = true;
		tpd_pipe_end_init(&p->end[1], p, ls,
				  TPD_PIPE_ACCEPT_ID_BASE + ls->next_accept_id++);
		p->link = pr;
		p->remote_id = c->pipe_id;
		p->remote_uid = c->uid; /* a claim, shown and passed on, never checked */
		p->far_queue_max = c->queue_max;
		p->far_queue_bytes = c->queue_bytes;
		tpu_list_insert_tail(&d->pipes, &p->node);
		d->n_pipes++;
		if (tpu_hmap_put(&ls->pipes, p->end[1].local_id, &p->end[1]) < 0 ||
		    tpd_peer_pipe_add(pr, p) < 0) {
			tpu_hmap_del(&ls->pipes, p->end[1].local_id);
			p->end[1].session = NULL;
			p->end[0].gone = TPW__V1__STATUS__STATUS_IO;
			tpd_pipe_maybe_free(p);
			p = NULL;
			snprintf(why, sizeof(why), "out of memory");
			err = -ENOMEM;
		}
	}
	rep.pipe_id = c->pipe_id;
	rep.peer_pipe_id = p ? p->id : 0;
	rep.status = tpw_status_from_errno(err);
	rep.message = why[0] ? why : NULL;
	rep.owner_known = p != NULL;
	rep.owner_uid = p ? (uint32_t)l->uid : 0;
	rep.queue_max = p ? d->cfg.pipe_queue_max : 0;
	rep.queue_bytes = p ? d->cfg.pipe_queue_bytes : 0;
	pm.body_case = TPW__V1__PEER_MSG__BODY_CONNECT_REPLY;
	pm.connect_reply = &rep;
	tpd_peer_send(pr, &pm, NULL, 0);
	if (!p) {
		/* A peer can send connects as fast as its link carries them: a burst is logged. */
		static struct tpd_ratelog refusals;
		unsigned held;

		if (tpd_quota_ratelog_burst_ok(&refusals, 10000, 20, &held))
			tpu_log_info("peer %s: connect to '%s' refused: %s (%u refusals not logged "
				     "before this one)", tpd_peer_name(pr), c->name,
				     logwhy[0] ? logwhy : why, held);
		return;
	}
	l->accepted++;
	tpd_pipe_log(p, ls, TPU_LOG_INFO, "accepted '%s' from %s",
		     c->remote_name ? c->remote_name : "", tpd_peer_name(pr));
	a.listener_id = l->id;
	a.pipe_id = p->end[1].local_id;
	a.remote_name = c->remote_name;
	a.remote_pid = 0; /* a process on another host */
	a.remote_uid = c->uid;
	a.remote_host = true;
	a.remote_peer = (char *)(ident ? ident : "");
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_ACCEPTED;
	dm.accepted = &a;
	tpd_session_send(ls, &dm, NULL, 0);
}

void tpd_xpipe_peer_connect_reply(struct tpd_peer *pr, struct tpd_pipe *p,
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
		snprintf(why, sizeof(why), "%s",
			 r->message ? r->message : tpw_status_name(r->status));
		xconnect_fail(p, tpw_status_to_errno(r->status), why);
		return;
	}
	if (p->expect_uid_set && (!r->owner_known || r->owner_uid != p->expect_uid)) {
		/* The far daemon did not check (or answered wrongly): the held writes never
		 * leave this host, and its side of the pipe is closed. */
		tell_close(pr, r->peer_pipe_id, TPW__V1__STATUS__STATUS_PERMISSION, NULL);
		if (r->owner_known)
			snprintf(why, sizeof(why),
				 "listener '%.60s' on %.60s is owned by uid %u (as its daemon "
				 "claims), not the expected uid %u",
				 p->listener, p->peer_addr, r->owner_uid, p->expect_uid);
		else
			snprintf(why, sizeof(why),
				 "tpipd at %.60s does not say who owns listener '%.60s': cannot "
				 "check the expected uid",
				 p->peer_addr, p->listener);
		xconnect_fail(p, -EACCES, why);
		return;
	}
	e = local_end(p);
	p->remote_id = r->peer_pipe_id;
	p->remote_uid = r->owner_uid;
	p->far_queue_max = r->queue_max;
	p->far_queue_bytes = r->queue_bytes;
	p->connecting = false;
	event_del(p->ev_connect);
	tpd_pipe_log(p, e->session, TPU_LOG_INFO, "connected to '%s' on %s", p->listener,
		     p->peer_addr);
	tpd_pipe_reply_connected(e->session, p->connect_req_id, e->local_id, p->listener,
				 r->owner_uid, true);
	held_flush(p, 0, NULL);
}

/*
 * The same queue limits as for a local writer (pipe-queue-max, pipe-queue-bytes): a message of
 * remote writer end @w over them is refused back to the writer's daemon (its write fails with
 * STATUS_LIMIT) and never queued here, whatever that daemon let its client write. Logged at most
 * once a second: the peer sends at will. Return: true if refused.
 */
static bool remote_queue_full(struct tpd_pipe *p, struct tpd_pipe_end *w, uint64_t msg_id,
			      uint32_t tail_len, size_t n_seg)
{
	static struct tpd_ratelog log;
	const struct tpd_config *cfg = &p->d->cfg;
	struct tpd_msg m = { .from = w, .msg_id = msg_id };
	char why[224];
	unsigned suppressed;

	if (w->queued >= cfg->pipe_queue_max)
		snprintf(why, sizeof(why), "pipe queue full on the reader's host: %u unread messages "
			 "(limit %u, tpipd --pipe-queue-max)", w->queued, cfg->pipe_queue_max);
	else if (w->queued_bytes + tail_len > cfg->pipe_queue_bytes)
		snprintf(why, sizeof(why), "pipe queue full on the reader's host: %llu unread inline "
			 "bytes (limit %llu, tpipd --pipe-queue-bytes)",
			 (unsigned long long)w->queued_bytes,
			 (unsigned long long)cfg->pipe_queue_bytes);
	else if (p->d->quota.pipe_bytes + p->d->quota.pipe_reserved +
		 tpd_msg_cost(tail_len, n_seg) > cfg->pipe_queue_bytes_total)
		snprintf(why, sizeof(why), "pipe queues full on the reader's host: %llu bytes held "
			 "for unread messages in all pipes (limit %llu, tpipd "
			 "--pipe-queue-bytes-max)",
			 (unsigned long long)p->d->quota.pipe_bytes,
			 (unsigned long long)cfg->pipe_queue_bytes_total);
	else
		return false;
	p->d->quota.remote_refused++;
	if (tpd_quota_ratelog_ok(&log, 1000, &suppressed))
		tpd_pipe_log(p, NULL, TPU_LOG_WARNING, "remote message %llu refused: %s (%u more "
			     "refused since the last such line)", (unsigned long long)msg_id, why,
			     suppressed);
	tpd_xpipe_consumed(&m, TPW__V1__STATUS__STATUS_LIMIT, why);
	return true;
}

void tpd_xpipe_peer_descriptor(struct tpd_pipe *p, const Tpw__V1__Descriptor *dd,
			       const uint8_t *tail, uint32_t tail_len)
{
	struct tpd_pipe_end *w = remote_end(p), *r = local_end(p);
	Tpw__V1__Descriptor out = *dd;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	struct iovec iov = {(void *)tail, tail_len};
	struct tpd_msg *m;

	if (!r->session || tpd_pipe_end_dying(w) || p->connecting)
		return; /* the reader left: the writer's daemon learns it from our PipeClose */
	if (remote_queue_full(p, w, dd->msg_id, tail_len, dd->n_payloads + dd->n_tensors))
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
		tpd_stats_record(&p->d->stats, basic, m->bytes, 0, false);
	}
	out.pipe_id = r->local_id;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR;
	dm.descriptor = &out;
	tpd_session_send(r->session, &dm, &iov, dd->eager && tail_len ? 1 : 0);
}

void tpd_xpipe_peer_read_req(struct tpd_pipe *p, const Tpw__V1__PeerReadReq *rr)
{
	struct tpd_pipe_end *w = local_end(p);
	struct tpd_msg *m;

	if (!w->session) {
		tpd_xh_tell_end(p, rr->xfer_id, TPW__V1__STATUS__STATUS_CLOSED,
				"writer closed the pipe", 0, false);
		return;
	}
	m = tpd_pipe_next_unread(w);
	if (!m || m->msg_id != rr->msg_id || m->eager) {
		tpd_pipe_log(p, NULL, TPU_LOG_WARNING, "peer asked for message %llu, next is %llu",
			     (unsigned long long)rr->msg_id,
			     m ? (unsigned long long)m->msg_id : 0ull);
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
 * reader still reads what was queued before. Logged at most once a second.
 */
static void eager_dropped(struct tpd_pipe *p, const struct tpd_msg *m,
			  const Tpw__V1__PeerConsumed *c)
{
	const char *reason = c->message && *c->message ? c->message : tpw_status_name(c->status);
	static struct tpd_ratelog log;
	unsigned suppressed;
	char why[200];

	snprintf(why, sizeof(why), "the reader's daemon dropped message %llu, written already: "
		 "%.140s", (unsigned long long)m->msg_id, reason);
	if (tpd_quota_ratelog_ok(&log, 1000, &suppressed))
		tpd_pipe_log(p, NULL, TPU_LOG_WARNING, "%s; failing the pipe (%u more since the "
			     "last such line)", why, suppressed);
	if (p->link && p->remote_id)
		tell_close(p->link, p->remote_id, c->status, why);
	tpd_xpipe_peer_close(p, c->status, why);
}

void tpd_xpipe_peer_consumed(struct tpd_pipe *p, const Tpw__V1__PeerConsumed *c)
{
	struct tpd_pipe_end *w = local_end(p);
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
		    !tpd_pipe_end_dying(remote_end(p))) {
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
	tpd_pipe_end_detach(remote_end(p), st);
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
	.link_up = tpd_xpipe_link_up,
	.link_failed = tpd_xpipe_link_failed,
	.waits_drop = tpd_xpipe_peer_waits_drop,
	.wait_cancel = tpd_xpipe_peer_wait_cancel,
	.connect = tpd_xpipe_peer_connect,
	.connect_reply = tpd_xpipe_peer_connect_reply,
	.descriptor = tpd_xpipe_peer_descriptor,
	.read_req = tpd_xpipe_peer_read_req,
	.consumed = tpd_xpipe_peer_consumed,
	.close = tpd_xpipe_peer_close,
	.xfer_end = tpd_xh_peer_xfer_end,
};

void tpd_xpipe_start(void)
{
	tpd_peer_set_pipe_ops(&xpipe_peer_ops);
}
