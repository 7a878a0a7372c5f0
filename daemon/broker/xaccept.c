/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The accepting side of a pipe from another host's daemon, on the loop thread: answering the
 * peer's PeerConnect for a local listener (decided on the link's authenticated identity and the
 * listener's remote access, never on the uid the peer claims), and keeping a connect that asks
 * to wait until a listener that admits the link registers, wait_ms passes, the far daemon
 * cancels it or the link goes away. The connecting side is xconnect.c's; the messages of an
 * open pipe are xpipe.c's; the link is peer.c's.
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

/*
 * A far daemon's connect to a name that no listener admitting its link has registered here (yet),
 * with wait_ms: kept until one does (then answered as any PeerConnect), wait_ms passes
 * (STATUS_TIMEOUT naming the listener), the far daemon cancels it or the link goes away. At most
 * pipes-max per link: the far daemon holds its clients to that limit each, and a hostile one
 * cannot make this daemon hold more; at most peer-connect-waits-per-peer of one peer (all its
 * links: tpd_peer_same()), so that one peer cannot take every place of peer-connect-waits-max
 * and have every other peer's waiting connects refused.
 */
struct xwait {
	struct tpu_list node; /* in the broker's xwaits */
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

/* The waiting connects one peer may have here: peer-connect-waits-per-peer (0: a quarter of
 * peer-connect-waits-max, at least 1), never above peer-connect-waits-max. */
static uint32_t peer_share(const struct tpd_config *cfg)
{
	uint32_t share = cfg->peer_connect_waits_per_peer;

	if (!share)
		share = cfg->peer_connect_waits_max / 4 ? cfg->peer_connect_waits_max / 4 : 1;
	return share < cfg->peer_connect_waits_max ? share : cfg->peer_connect_waits_max;
}

/* Keeps connect @c of @pr waiting. Return: 0, or -errno with @why filled (answered by then). */
static int xwait_add(struct tpd_daemon *d, struct tpd_peer *pr, const Tpw__V1__PeerConnect *c,
		     char *why, size_t wl)
{
	struct timeval tv = { c->wait_ms / 1000, (c->wait_ms % 1000) * 1000 };
	const struct tpd_config *cfg = tpd_daemon_cfg(d);
	struct tpd_broker *b = tpd_daemon_broker(d);
	unsigned n = 0, n_peer = 0, n_all = 0;
	struct xwait *w;

	tpu_list_for_each(w, &b->xwaits, node) {
		n_all++;
		n_peer += tpd_peer_same(w->link, pr);
		if (w->link != pr)
			continue;
		if (w->c.pipe_id == c->pipe_id)
			return tpu_why(-EADDRINUSE, why, wl, "connect %llu is already waiting",
				       (unsigned long long)c->pipe_id);
		n++;
	}
	if (n >= cfg->pipes_max)
		return tpu_why(-ENOBUFS, why, wl, "%u connects from this host already wait for a "
			       "listener (limit %u, tpipd --pipes-max)", n, cfg->pipes_max);
	/* Per link alone, the authenticated peers together could keep pipes-max times
	 * peer-links-max waiting. */
	if (n_all >= cfg->peer_connect_waits_max)
		return tpu_why(-ENOBUFS, why, wl, "%u connects from other hosts already wait for a "
			       "listener here (limit %u, tpipd --peer-connect-waits-max)", n_all,
			       cfg->peer_connect_waits_max);
	/* One peer alone could take every place of that bound (pipes-max, its default, on one
	 * link), and every other peer's waiting connect was refused while it held them. */
	if (n_peer >= peer_share(cfg))
		return tpu_why(-ENOBUFS, why, wl, "%u connects from this peer already wait for a "
			       "listener here (limit %u, tpipd --peer-connect-waits-per-peer)",
			       n_peer, peer_share(cfg));
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
	w->ev = evtimer_new(tpd_daemon_base(d), xwait_on_timeout, w);
	if (!w->c.name || !w->c.remote_name || !w->ev) {
		xwait_free(w);
		return tpu_why(-ENOMEM, why, wl, "out of memory");
	}
	tpu_list_insert_tail(&b->xwaits, &w->node);
	tpd_xpipe_timer_add_fresh(w->ev, &tv);
	tpu_log_debug("peer %s: connect to '%s' waits up to %u ms for the listener",
		      tpd_peer_name(pr), c->name, c->wait_ms);
	return 0;
}

void tpd_xaccept_waits_drop(struct tpd_daemon *d, struct tpd_peer *pr)
{
	struct tpd_broker *b = tpd_daemon_broker(d);
	struct xwait *w, *tmp;
	unsigned n = 0;

	if (!b)
		return; /* a daemon that failed to start */
	tpu_list_for_each_safe(w, tmp, &b->xwaits, node) {
		if (w->link == pr) {
			xwait_free(w);
			n++;
		}
	}
	if (n)
		tpu_log_debug("peer %s: %u connects waiting for a listener dropped with the link",
			      tpd_peer_name(pr), n);
}

void tpd_xaccept_wait_cancel(struct tpd_daemon *d, struct tpd_peer *pr, uint64_t pipe_id)
{
	struct tpd_broker *b = tpd_daemon_broker(d);
	struct xwait *w;

	tpu_list_for_each(w, &b->xwaits, node) {
		if (w->link == pr && w->c.pipe_id == pipe_id) {
			tpu_log_debug("peer %s: connect to '%s' canceled while waiting for the "
				      "listener", tpd_peer_name(pr), w->c.name);
			xwait_free(w);
			return;
		}
	}
}

/* Listener @l was just registered: answer the waiting connects it admits, as any connect. */
void tpd_xaccept_listener_added(struct tpd_daemon *d, struct tpd_listener *l)
{
	struct tpd_broker *b = tpd_daemon_broker(d);
	struct xwait *w, *tmp;

	tpu_list_for_each_safe(w, tmp, &b->xwaits, node) {
		Tpw__V1__PeerConnect c = w->c;
		const char *ident = tpd_peer_identity(w->link);

		if (strcmp(w->c.name, l->name) != 0 ||
		    !tpd_listener_permits_remote(l, ident ? tpd_peer_identity_matches : NULL,
						 w->link))
			continue; /* to that far daemon, still no such listener */
		c.wait_ms = 0;
		tpd_xaccept_connect(d, w->link, &c); /* the access checks and the answer */
		xwait_free(w);
	}
}

void tpd_xaccept_connect(struct tpd_daemon *d, struct tpd_peer *pr,
			 const Tpw__V1__PeerConnect *c)
{
	Tpw__V1__PeerConnectReply rep = TPW__V1__PEER_CONNECT_REPLY__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__Accepted a = TPW__V1__ACCEPTED__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	const struct tpd_config *cfg = tpd_daemon_cfg(d);
	struct tpd_listener *l = tpd_listener_registry_find(tpd_daemon_registry(d), c->name);
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
	if (!l && c->wait_ms && !tpd_daemon_stopping(d)) {
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
	} else if (tpd_session_pipe_count(ls) >= cfg->pipes_max) {
		snprintf(why, sizeof(why), "pipe limit of %u per client reached (tpipd "
			 "--pipes-max)",
			 cfg->pipes_max);
		err = -ENOBUFS;
	} else if (tpd_daemon_stopping(d)) {
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
		tpd_broker_pipe_add(tpd_daemon_broker(d), p);
		if (tpd_session_pipe_add(ls, p->end[1].local_id, &p->end[1]) < 0 ||
		    tpd_peer_pipe_add(pr, p) < 0) {
			tpd_session_pipe_remove(ls, p->end[1].local_id);
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
	rep.queue_max = p ? cfg->pipe_queue_max : 0;
	rep.queue_bytes = p ? cfg->pipe_queue_bytes : 0;
	pm.body_case = TPW__V1__PEER_MSG__BODY_CONNECT_REPLY;
	pm.connect_reply = &rep;
	tpd_peer_send(pr, &pm, NULL, 0);
	if (!p) {
		/* A peer can send connects as fast as its link carries them: logged within its
		 * link's budget. */
		unsigned held;

		if (tpd_peer_log_ok(pr, &held))
			tpu_log_info("peer %s: connect to '%s' refused: %s (%u lines about this "
				     "peer not logged before this one)", tpd_peer_name(pr), c->name,
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
