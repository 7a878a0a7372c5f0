/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The connecting side of a pipe to another host's daemon, on the loop thread: parsing
 * tpip://HOST[:PORT]/NAME, opening the pipe over a peer link (PeerConnect and its reply, the
 * connect deadline, writes held until the remote end accepted, the fall-back to a local connect
 * when the address is this daemon, waiting for a local listener that is not registered yet), and
 * what the link's failure or the local end's leaving does to a pipe. The far daemon's side of
 * the handshake is xaccept.c's; the messages of an open pipe are xpipe.c's; the link is peer.c's.
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

/* A write received while the pipe was still connecting, replayed once it is open. */
struct held_write {
	struct tpu_list node;
	Tpw__V1__ClientMsg *cm;
	uint8_t *tail;
	uint32_t tail_len;
};

static void held_free(struct held_write *h)
{
	tpu_list_remove(&h->node);
	tpw_client_msg_free(h->cm);
	free(h->tail);
	free(h);
}

bool tpd_xconnect_held_cancel(struct tpd_pipe *p, uint64_t write_id)
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
void tpd_xconnect_hold(struct tpd_pipe_end *e, Tpw__V1__ClientMsg *cm, const uint8_t *tail,
		       uint32_t tail_len)
{
	struct tpd_pipe *p = e->pipe;
	const struct tpd_config *cfg = tpd_daemon_cfg(p->d);
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
	struct tpd_pipe_end *e = tpd_xpipe_local_end(p);

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
void tpd_xconnect_done(struct tpd_pipe *p)
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
	struct tpd_pipe_end *e = tpd_xpipe_local_end(p), *re = tpd_xpipe_remote_end(p);
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
	tpd_session_pipe_remove(s, e->local_id);
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
		 (unsigned long long)tpd_daemon_cfg(p->d)->peer_connect_timeout_ms + p->wait_ms,
		 dial[0] ? ": " : "", dial);
	cancel_remote_wait(p);
	xconnect_fail(p, -ETIMEDOUT, why);
}

/* Connect.expect_peers (validated: 0..TPW_REMOTE_PEERS_MAX names) into @p. Return: 0 or
 * -ENOMEM (@p unchanged then). */
static int expect_peers_copy(struct tpd_pipe *p, const Tpw__V1__Connect *c)
{
	int r = tpu_strv_dup(c->expect_peers, c->n_expect_peers, TPW_REMOTE_PEERS_MAX,
			     TPW_NAME_MAX, &p->expect_peers);

	if (r < 0)
		return r;
	p->n_expect_peers = c->n_expect_peers;
	return 0;
}

/* Whether the far daemon of @p's link is one the connecting client expects (Connect.
 * expect_remote): decided on the link's authenticated identity, before anything is sent. */
static bool expect_peer_ok(const struct tpd_pipe *p)
{
	if (p->expect_remote == TPW__V1__REMOTE_ACCESS__REMOTE_UNSPECIFIED)
		return true;
	if (!tpd_peer_identity(p->link))
		return false; /* unauthenticated (--peer-insecure): never */
	if (p->expect_remote == TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER)
		return true;
	for (size_t i = 0; i < p->n_expect_peers; i++)
		if (tpd_peer_identity_matches(p->expect_peers[i], p->link))
			return true;
	return false;
}

void tpd_xconnect_remote(struct tpd_daemon *d, struct tpd_session *s, const Tpw__V1__Connect *c)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(d);
	struct tpd_peer *pr = NULL;
	struct tpd_pipe *p;
	const char *name;
	char host[TPW_TPIP_HOST_MAX + 1], why[280], bad[120];
	uint16_t port;
	int r;

	if (tpw_tpip_parse(c->address, (uint16_t)cfg->peer_port, host, &port, &name, bad,
			   sizeof(bad)) < 0) {
		snprintf(why, sizeof(why), "invalid address '%.100s' (tpip://HOST[:PORT]/NAME): %s",
			 c->address, bad);
		tpd_pipe_connect_fail(s, c, -EINVAL, why);
		return;
	}
	if (tpd_session_pipe_find(s, c->pipe_id)) {
		tpd_pipe_connect_fail(s, c, -EADDRINUSE, "pipe id already in use");
		return;
	}
	if (tpd_session_pipe_count(s) >= cfg->pipes_max) {
		snprintf(why, sizeof(why), "pipe limit of %u per client reached (tpipd "
			 "--pipes-max)",
			 cfg->pipes_max);
		tpd_pipe_connect_fail(s, c, -ENOBUFS, why);
		return;
	}
	r = tpd_peer_get(d, host, port, &pr, why, sizeof(why));
	if (r < 0) {
		tpd_pipe_connect_fail(s, c, r, why);
		return;
	}
	p = tpd_pipe_new(d, name);
	if (!p || !(p->ev_connect = evtimer_new(tpd_daemon_base(d), xpipe_on_connect_timeout, p))) {
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
	p->expect_remote = c->expect_remote;
	tpd_broker_pipe_add(tpd_daemon_broker(d), p);
	if (expect_peers_copy(p, c) < 0 || tpd_session_pipe_add(s, c->pipe_id, &p->end[0]) < 0 ||
	    tpd_peer_pipe_add(pr, p) < 0) {
		tpd_session_pipe_remove(s, c->pipe_id);
		p->end[0].session = NULL;
		p->connecting = false;
		tpd_pipe_connect_fail(s, c, -ENOMEM, "out of memory");
		tpd_pipe_maybe_free(p);
		return;
	}
	{
		/* The far daemon answers within wait_ms: the deadline leaves it that much more. */
		uint64_t ms = (uint64_t)cfg->peer_connect_timeout_ms + p->wait_ms;
		struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
		tpd_xpipe_timer_add_fresh(p->ev_connect, &tv);
	}
	if (p->wait_ms)
		tpd_pipe_log(p, s, TPU_LOG_INFO, "connecting to '%s' on %s, waiting up to %u ms "
			     "for it to listen", name, p->peer_addr, p->wait_ms);
	else
		tpd_pipe_log(p, s, TPU_LOG_INFO, "connecting to '%s' on %s", name, p->peer_addr);
	if (tpd_peer_is_up(pr))
		tpd_xconnect_link_up(p);
}

void tpd_xconnect_link_up(struct tpd_pipe *p)
{
	Tpw__V1__PeerConnect pc = TPW__V1__PEER_CONNECT__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	struct tpd_session *s = tpd_xpipe_local_end(p)->session;

	if (!p->connecting || p->connect_sent || !s)
		return;
	if (!expect_peer_ok(p)) {
		const char *id = tpd_peer_identity(p->link);
		char why[400];

		snprintf(why, sizeof(why), "peer daemon %.150s authenticated as %.150s, not as the "
			 "connect expects", p->peer_addr, id ? id : "nobody (insecure link)");
		tpd_pipe_log(p, s, TPU_LOG_WARNING, "connect to '%s' refused: %s", p->listener, why);
		xconnect_fail(p, -EACCES, why);
		return;
	}
	pc.pipe_id = p->id;
	pc.name = p->listener;
	pc.remote_name = (char *)tpd_session_name(s);
	pc.uid = (uint32_t)tpd_session_uid(s);
	pc.gid = (uint32_t)tpd_session_gid(s);
	pc.pid = (uint32_t)tpd_session_pid(s);
	pc.expect_uid_set = p->expect_uid_set;
	pc.expect_uid = p->expect_uid;
	if (p->wait_ms && !tpd_peer_connect_wait_ok(p->link))
		p->wait_ms = 0; /* a daemon older than wait_ms: answers at once, as documented */
	pc.wait_ms = p->wait_ms;
	pc.queue_max = tpd_daemon_cfg(p->d)->pipe_queue_max;
	pc.queue_bytes = tpd_daemon_cfg(p->d)->pipe_queue_bytes;
	pm.body_case = TPW__V1__PEER_MSG__BODY_CONNECT;
	pm.connect = &pc;
	tpd_xpipe_tell(p, &pm, NULL, 0);
	p->connect_sent = true;
}

/* The tpip:// address of @p, asking to wait, was this daemon's own and names no listener yet:
 * wait for it here, as tpd_xconnect_wait_local() does for a local name, for the whole wait. */
static void xpipe_wait_here(struct tpd_pipe *p)
{
	struct timeval tv = { p->wait_ms / 1000, (p->wait_ms % 1000) * 1000 };

	if (p->link)
		tpd_peer_pipe_remove(p->link, p);
	p->link = NULL;
	p->waiting = true;
	snprintf(p->peer_addr, sizeof(p->peer_addr), "this host");
	tpd_xpipe_timer_add_fresh(p->ev_connect, &tv); /* replaces the peer deadline */
	tpd_pipe_log(p, tpd_xpipe_local_end(p)->session, TPU_LOG_INFO, "address is this daemon: "
		     "waiting up to %u ms for listener '%s'", p->wait_ms, p->listener);
}

/* The tpip:// address was this daemon's own: connect @p to the local listener instead. */
void tpd_xconnect_reroute_local(struct tpd_pipe *p)
{
	struct tpd_pipe_end *e = tpd_xpipe_local_end(p);
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
	tpd_session_pipe_remove(s, e->local_id); /* tpd_pipe_connect_check wants the id free */
	r = tpd_pipe_connect_check(p->d, s, &c, &l, why, sizeof(why));
	if (r == 0 && tpd_session_pipe_add(s, e->local_id, e) < 0)
		r = -ENOMEM;
	if (r < 0) {
		tpd_session_pipe_add(s, e->local_id, e);
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
	tpd_pipe_connect_reply(s, p->connect_req_id, e->local_id, l->name, (uint32_t)l->uid,
				 false);
	tpd_pipe_connect_accepted(l->owner, l, &p->end[1], s);
	held_flush(p, 0, NULL);
}

void tpd_xconnect_wait_local(struct tpd_daemon *d, struct tpd_session *s, const Tpw__V1__Connect *c)
{
	struct timeval tv = { c->wait_ms / 1000, (c->wait_ms % 1000) * 1000 };
	uint32_t pipes_max = tpd_daemon_cfg(d)->pipes_max;
	struct tpd_pipe *p;
	char why[96];

	if (tpd_session_pipe_count(s) >= pipes_max) {
		snprintf(why, sizeof(why), "pipe limit of %u per client reached", pipes_max);
		tpd_pipe_connect_fail(s, c, -ENOBUFS, why);
		return;
	}
	p = tpd_pipe_new(d, c->address);
	if (!p || !(p->ev_connect = evtimer_new(tpd_daemon_base(d), xpipe_on_connect_timeout, p))) {
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
	tpd_broker_pipe_add(tpd_daemon_broker(d), p);
	if (tpd_session_pipe_add(s, c->pipe_id, &p->end[0]) < 0) {
		p->end[0].session = NULL;
		p->connecting = false;
		tpd_pipe_connect_fail(s, c, -ENOMEM, "out of memory");
		tpd_pipe_maybe_free(p);
		return;
	}
	tpd_xpipe_timer_add_fresh(p->ev_connect, &tv);
	tpd_pipe_log(p, s, TPU_LOG_INFO, "waiting up to %u ms for listener '%s'", c->wait_ms,
		     c->address);
}

void tpd_xconnect_link_failed(struct tpd_pipe *p, int err, const char *why)
{
	char msg[200];

	if (p->connecting && err == -ELOOP && tpd_xpipe_local_end(p)->session) {
		tpd_xconnect_reroute_local(p);
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
	tpd_pipe_end_detach(tpd_xpipe_remote_end(p), err == -ESHUTDOWN
							 ? TPW__V1__STATUS__STATUS_SHUTDOWN
							 : TPW__V1__STATUS__STATUS_PEER_DIED);
}

/* The local end of cross-host pipe @p left with @why: tell the peer, stop connecting. */
void tpd_xconnect_local_left(struct tpd_pipe *p, Tpw__V1__Status why)
{
	struct tpd_pipe_end *re = tpd_xpipe_remote_end(p);

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
		tpd_xpipe_tell_close(p->link, p->remote_id, why, NULL);
}

void tpd_xconnect_reply(struct tpd_peer *pr, struct tpd_pipe *p,
			const Tpw__V1__PeerConnectReply *r)
{
	struct tpd_pipe_end *e;
	char why[240];

	if (!p || !p->connecting) {
		/* The pipe ended here before the answer: close the peer's side. */
		if (r->status == TPW__V1__STATUS__STATUS_OK && r->peer_pipe_id)
			tpd_xpipe_tell_close(pr, r->peer_pipe_id, TPW__V1__STATUS__STATUS_CLOSED,
					     NULL);
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
		tpd_xpipe_tell_close(pr, r->peer_pipe_id, TPW__V1__STATUS__STATUS_PERMISSION, NULL);
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
	e = tpd_xpipe_local_end(p);
	p->remote_id = r->peer_pipe_id;
	p->remote_uid = r->owner_uid;
	p->far_queue_max = r->queue_max;
	p->far_queue_bytes = r->queue_bytes;
	p->connecting = false;
	event_del(p->ev_connect);
	tpd_pipe_log(p, e->session, TPU_LOG_INFO, "connected to '%s' on %s", p->listener,
		     p->peer_addr);
	tpd_pipe_connect_reply(e->session, p->connect_req_id, e->local_id, p->listener,
				 r->owner_uid, true);
	held_flush(p, 0, NULL);
}
