/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Peer link handshake: PeerHello (versions, identity, nonces, the loop and same-host checks), the
 * HMAC-SHA256 challenge-response (the MAC in the answerer's Hello, then PeerAuth), PeerReady, the
 * dialling side's data connections (dialled once the answerer is ready, each opened with a
 * PeerDataHello), and the link going up. It decides what is proved over which nonces; peerauth.c
 * computes the MACs. It does not read frames or own a link's lifetime (peer.c), nor accept
 * connections (peerlisten.c). Everything here runs on the loop thread.
 */
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include "daemon.h"
#include "frame.h"
#include "gdr.h"
#include "hmap.h"
#include "peer.h"
#include "peer_int.h"
#include "peerauth.h"
#include "pipe.h"
#include "stripe.h"
#include "validate.h"

void tpd_peerhs_send_hello(struct tpd_peer *pr, Tpw__V1__Status st, const char *msg)
{
	struct tpd_daemon *d = pr->d;
	Tpw__V1__PeerHello h = TPW__V1__PEER_HELLO__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	unsigned rdma = tpd_gdr_offers(d);
	char *backends[4] = { "mpt", "basic" };
	size_t n_backends = 2;
	uint8_t mac[32];

	if (rdma & TPD_GDR_HOST)
		backends[n_backends++] = "rdma";
	if (rdma & TPD_GDR_CUDA)
		backends[n_backends++] = "cuda_gdr";

	h.major = TPW_PROTO_MAJOR;
	h.minor = TPW_PROTO_MINOR;
	h.host = d->hostname;
	h.boot_id.data = d->boot_id;
	h.boot_id.len = sizeof(d->boot_id);
	h.instance = d->instance;
	h.n_backends = n_backends;
	h.backends = backends;
	h.data_conns = pr->outgoing ? d->cfg.peer_data_conns : 0;
	h.nonce.data = pr->nonce_mine;
	h.nonce.len = sizeof(pr->nonce_mine);
	h.keyed = d->peer_keyed;
	h.force_cross_host = d->cfg.peer_force_cross_host;
	h.listen_port = d->peer_port_bound;
	h.status = st;
	h.message = (char *)msg;
	if (!pr->outgoing && d->peer_keyed && st == TPW__V1__STATUS__STATUS_OK) {
		tpd_peerauth_mac(&d->peer_key, LABEL_ANSWER, pr->nonce_theirs, 32, pr->nonce_mine,
				 32, -1, mac);
		h.mac.data = mac;
		h.mac.len = sizeof(mac);
	}
	m.body_case = TPW__V1__PEER_MSG__BODY_HELLO;
	m.hello = &h;
	if (pr->last_words)
		tpd_peer_send_now(pr, &m);
	else
		tpd_peer_send(pr, &m, NULL, 0);
}

void tpd_peerhs_send_ready(struct tpd_peer *pr, Tpw__V1__Status st, const char *msg, bool data_up)
{
	Tpw__V1__PeerReady r = TPW__V1__PEER_READY__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	r.link_id = pr->link_id;
	r.status = st;
	r.message = (char *)msg;
	r.data_up = data_up;
	m.body_case = TPW__V1__PEER_MSG__BODY_READY;
	m.ready = &r;
	if (pr->last_words)
		tpd_peer_send_now(pr, &m);
	else
		tpd_peer_send(pr, &m, NULL, 0);
}

/* Refuses the peer: tells it why (when it can still listen), logs, fails the link. */
static void refuse(struct tpd_peer *pr, bool as_hello, int err, const char *why)
{
	Tpw__V1__Status st = tpw_status_from_errno(err);

	pr->last_words = true;
	if (as_hello)
		tpd_peerhs_send_hello(pr, st, why);
	else if (!pr->outgoing)
		tpd_peerhs_send_ready(pr, st, why, false);
	tpd_peer_fail(pr, err, "%s", why);
}

void tpd_peerhs_link_up(struct tpd_peer *pr)
{
	size_t n = pr->pipes.len, i = 0, k = 0;
	struct tpd_pipe **v = calloc(n + 1, sizeof(*v));
	uint64_t key;
	void *val;

	pr->state = PEER_UP;
	pr->up_ns = tpu_now_ns();
	tpd_peer_log(pr, TPU_LOG_NOTICE, "link up to %s with %u data connections%s", pr->host,
		     pr->data_attached,
		     pr->authenticated ? ", authenticated" : ", NOT authenticated");
	tpd_peer_timer_arm_ms(pr->ev_timer, TPU_MAX(pr->d->cfg.peer_timeout_ms / 3, 100u));
	if (pr->peer_rdma)
		pr->gdr = tpd_gdr_link_new(pr->d, pr, pr->peer_rdma);
	while (v && tpu_hmap_next(&pr->pipes, &i, &key, &val))
		v[k++] = val;
	for (i = 0; i < k; i++)
		tpd_xpipe_link_up(v[i]);
	free(v);
}

/* Checks the peer's Hello (both sides). Return: 0 or -errno with @why filled. */
static int check_hello(struct tpd_peer *pr, const Tpw__V1__PeerHello *h, char *why, size_t wl)
{
	struct tpd_daemon *d = pr->d;

	snprintf(pr->host, sizeof(pr->host), "%s", h->host ? h->host : "");
	for (size_t i = 0; i < h->n_backends; i++) {
		if (strcmp(h->backends[i], "rdma") == 0)
			pr->peer_rdma |= TPD_GDR_HOST;
		else if (strcmp(h->backends[i], "cuda_gdr") == 0)
			pr->peer_rdma |= TPD_GDR_CUDA;
	}
	if (h->major != TPW_PROTO_MAJOR) {
		snprintf(why, wl, "peer speaks protocol %u.%u, this daemon %u.%u", h->major, h->minor,
			 TPW_PROTO_MAJOR, TPW_PROTO_MINOR);
		return -EPROTONOSUPPORT;
	}
	if (h->nonce.len != 32) {
		snprintf(why, wl, "peer hello without nonce");
		return -EPROTO;
	}
	memcpy(pr->nonce_theirs, h->nonce.data, 32);
	if (h->instance == d->instance) {
		snprintf(why, wl, "the address is this daemon's own");
		return -ELOOP;
	}
	if (h->boot_id.len == 16 && memcmp(h->boot_id.data, d->boot_id, 16) == 0 &&
	    !d->cfg.peer_force_cross_host && !h->force_cross_host) {
		snprintf(why, wl, "the peer daemon runs on this host (same boot id); connect to its "
				  "socket, or start both daemons with --peer-force-cross-host");
		return -EOPNOTSUPP;
	}
	if (d->peer_keyed && !h->keyed) {
		snprintf(why, wl, "peer has no pre-shared key but this daemon requires one");
		return -EACCES;
	}
	if (!d->peer_keyed && h->keyed) {
		snprintf(why, wl, "peer requires a pre-shared key but this daemon has none");
		return -EACCES;
	}
	return 0;
}

void tpd_peerhs_dial_on_hello(struct tpd_peer *pr, const Tpw__V1__PeerHello *h)
{
	struct tpd_daemon *d = pr->d;
	Tpw__V1__PeerAuth a = TPW__V1__PEER_AUTH__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	uint8_t mac[32];
	char why[240];
	int r;

	if (h->status && h->status != TPW__V1__STATUS__STATUS_OK) {
		tpd_peer_fail(pr, tpw_status_to_errno(h->status), "refused by the peer: %s",
			      h->message ? h->message : tpw_status_name(h->status));
		return;
	}
	r = check_hello(pr, h, why, sizeof(why));
	if (r < 0) {
		tpd_peer_fail(pr, r, "%s", why);
		return;
	}
	if (d->peer_keyed) {
		tpd_peerauth_mac(&d->peer_key, LABEL_ANSWER, pr->nonce_mine, 32, pr->nonce_theirs,
				 32, -1, mac);
		if (!tpd_peerauth_mac_ok(mac, h->mac.data, h->mac.len)) {
			tpd_peer_fail(pr, -EACCES,
				      "peer failed authentication (wrong pre-shared key)");
			return;
		}
		tpd_peerauth_mac(&d->peer_key, LABEL_DIAL, pr->nonce_theirs, 32, pr->nonce_mine, 32,
				 -1, mac);
		a.mac.data = mac;
		a.mac.len = sizeof(mac);
		m.body_case = TPW__V1__PEER_MSG__BODY_AUTH;
		m.auth = &a;
		tpd_peer_send(pr, &m, NULL, 0);
		pr->authenticated = true;
	}
}

void tpd_peerhs_answer_on_hello(struct tpd_peer *pr, const Tpw__V1__PeerHello *h)
{
	char why[240];
	int r = check_hello(pr, h, why, sizeof(why));

	if (r == 0 && (h->data_conns < 1 || h->data_conns > TPD_STRIPE_CONNS_MAX)) {
		snprintf(why, sizeof(why), "peer asks for %u data connections (1..%d)",
			 h->data_conns, TPD_STRIPE_CONNS_MAX);
		r = -EPROTO;
	}
	if (r == -ELOOP)
		r = 0; /* our own dial: answer, the dialling side notices and stops */
	if (r < 0) {
		refuse(pr, true, r, why);
		return;
	}
	pr->data_expected = h->data_conns;
	if (h->listen_port) {
		/* Later dials to this peer's listener reuse the link. */
		char ip[80];
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		if (getpeername(bufferevent_getfd(pr->bev), (struct sockaddr *)&ss, &sl) == 0) {
			tpd_peer_sockaddr_text((struct sockaddr *)&ss, ip, sizeof(ip), false);
			snprintf(pr->key, sizeof(pr->key), strchr(ip, ':') ? "[%s]:%u" : "%s:%u",
				 ip, h->listen_port);
		}
	}
	tpd_peerhs_send_hello(pr, TPW__V1__STATUS__STATUS_OK, NULL);
	if (pr->d->peer_keyed)
		return; /* PeerAuth next */
	pr->state = PEER_DATA;
	tpd_peerhs_send_ready(pr, TPW__V1__STATUS__STATUS_OK, NULL, false);
}

void tpd_peerhs_answer_on_auth(struct tpd_peer *pr, const Tpw__V1__PeerAuth *a)
{
	uint8_t mac[32];

	tpd_peerauth_mac(&pr->d->peer_key, LABEL_DIAL, pr->nonce_mine, 32, pr->nonce_theirs, 32,
			 -1, mac);
	if (!tpd_peerauth_mac_ok(mac, a->mac.data, a->mac.len)) {
		refuse(pr, false, -EACCES, "peer failed authentication (wrong pre-shared key)");
		return;
	}
	pr->authenticated = true;
	pr->state = PEER_DATA;
	tpd_peerhs_send_ready(pr, TPW__V1__STATUS__STATUS_OK, NULL, false);
}

static void data_dial_on_connect(evutil_socket_t fd, short what, void *arg);

/* Dials the data connections of a link whose answerer is ready for them. */
static void dial_data(struct tpd_peer *pr)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	if (getpeername(bufferevent_getfd(pr->bev), (struct sockaddr *)&ss, &sl) < 0) {
		tpd_peer_fail(pr, -errno, "getpeername: %m");
		return;
	}
	pr->state = PEER_DATA;
	for (unsigned i = 0; i < pr->d->cfg.peer_data_conns; i++) {
		struct data_dial *dd = calloc(1, sizeof(*dd));
		int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (!dd || fd < 0 ||
		    (connect(fd, (struct sockaddr *)&ss, sl) < 0 && errno != EINPROGRESS)) {
			int e = -errno;
			free(dd);
			tpu_close(fd);
			tpd_peer_fail(pr, e, "data connection %u: %s", i, strerror(-e));
			return;
		}
		dd->d = pr->d;
		dd->peer_id = pr->id;
		dd->fd = fd;
		dd->index = i;
		dd->ev = event_new(pr->d->base, fd, EV_WRITE, data_dial_on_connect, dd);
		if (!dd->ev) {
			tpu_close(fd);
			free(dd);
			tpd_peer_fail(pr, -ENOMEM, "out of memory");
			return;
		}
		tpu_list_insert_tail(&pr->d->data_dials, &dd->node);
		event_add(dd->ev, NULL);
	}
}

void tpd_peerhs_data_dial_free(struct data_dial *dd)
{
	if (dd->ev)
		event_free(dd->ev);
	tpu_close(dd->fd);
	tpu_list_remove(&dd->node);
	free(dd);
}

/* Finds live link @id (a data dial may outlive its link). */
static struct tpd_peer *peer_by_id(struct tpd_daemon *d, uint64_t id)
{
	struct tpd_peer *pr;

	tpu_list_for_each(pr, &d->peers, node)
		if (pr->id == id && pr->state != PEER_FAILED)
			return pr;
	return NULL;
}

static int send_frame_blocking(int fd, Tpw__V1__PeerMsg *m)
{
	uint8_t buf[256];
	size_t n = tpw_frame_size(&m->base);
	ssize_t w;

	if (n > sizeof(buf))
		return -EMSGSIZE;
	tpw_frame_pack(&m->base, 0, 0, 1, buf);
	w = send(fd, buf, n, MSG_NOSIGNAL);
	if (w < 0)
		return -errno;
	return (size_t)w == n ? 0 : -EAGAIN;
}

static void data_dial_on_connect(evutil_socket_t fd, short what, void *arg)
{
	struct data_dial *dd = arg;
	Tpw__V1__PeerDataHello h = TPW__V1__PEER_DATA_HELLO__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	struct tpd_peer *pr;
	uint8_t mac[32];
	int err = 0, r;
	socklen_t el = sizeof(err);

	pr = peer_by_id(dd->d, dd->peer_id);
	if (!pr || pr->state != PEER_DATA) {
		tpd_peerhs_data_dial_free(dd);
		return;
	}
	if (getsockopt(dd->fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err) {
		tpd_peer_fail(pr, -(err ? err : errno), "data connection %u: %s", dd->index,
			      strerror(err ? err : errno));
		tpd_peerhs_data_dial_free(dd);
		return;
	}
	h.link_id = pr->link_id;
	h.index = dd->index;
	if (pr->d->peer_keyed) {
		tpd_peerauth_mac(&pr->d->peer_key, LABEL_DATA, pr->nonce_theirs, 32, pr->nonce_mine,
				 32, dd->index, mac);
		h.mac.data = mac;
		h.mac.len = sizeof(mac);
	}
	m.body_case = TPW__V1__PEER_MSG__BODY_DATA_HELLO;
	m.data_hello = &h;
	r = send_frame_blocking(dd->fd, &m);
	if (r == 0) {
		r = tpd_stripe_add_conn(pr->stripe, dd->fd); /* takes the fd */
		dd->fd = -EBADF;
	}
	tpd_peerhs_data_dial_free(dd);
	if (r < 0)
		tpd_peer_fail(pr, r, "data connection: %s", strerror(-r));
}

void tpd_peerhs_dial_on_ready(struct tpd_peer *pr, const Tpw__V1__PeerReady *r)
{
	if (r->status && r->status != TPW__V1__STATUS__STATUS_OK) {
		tpd_peer_fail(pr, tpw_status_to_errno(r->status), "refused by the peer: %s",
			      r->message ? r->message : tpw_status_name(r->status));
		return;
	}
	if (!r->data_up) {
		if (pr->state != PEER_HANDSHAKE) {
			tpd_peer_fail(pr, -EPROTO, "unexpected ready");
			return;
		}
		pr->link_id = r->link_id;
		dial_data(pr);
		return;
	}
	if (pr->state != PEER_DATA) {
		tpd_peer_fail(pr, -EPROTO, "unexpected ready");
		return;
	}
	pr->data_attached = tpd_stripe_conns(pr->stripe);
	tpd_peerhs_link_up(pr);
}

