/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Peer link handshake, inside TLS 1.3 (peertls.c; plain TCP only with --peer-insecure): PeerHello
 * (versions, host identity, the loop, same-host and data encryption checks), PeerReady, the
 * dialling side's data connections (dialled once the answerer is ready: each runs its own TLS
 * handshake, then proves with its PeerDataHello that it belongs to this link's control session,
 * and checks the answerer's proof in the PeerDataHello it gets back), and the link going up. It
 * does not read frames or own a link's lifetime (peer.c), nor accept connections
 * (peerlisten.c). Everything here runs on the loop thread.
 */
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include "core.h"
#include "frame.h"
#include "rdma/rdma.h"
#include "hmap.h"
#include "peer.h"
#include "peer_int.h"
#include "peerauth.h"
#include "peertls.h"
#include "stripe.h"
#include "tpb.h"
#include "validate.h"

/* Offer rdma and cuda_gdr only where the RDMA context found a port for them. */
static bool hello_keeps(const char *name, void *arg)
{
	unsigned rdma = tpb_rdma_offers(tpd_daemon_rdma(arg));

	if (strcmp(name, "rdma") == 0)
		return rdma & TPB_RDMA_HOST;
	if (strcmp(name, "cuda_gdr") == 0)
		return rdma & TPB_RDMA_CUDA;
	return true;
}

void tpd_peerhs_send_hello(struct tpd_peer *pr, Tpw__V1__Status st, const char *msg)
{
	struct tpd_peers *ps = pr->peers;
	const struct tpd_config *cfg = ps->cfg;
	Tpw__V1__PeerHello h = TPW__V1__PEER_HELLO__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	const char *backends[16];
	/* The registry's viable channels between hosts, in this daemon's priority order. */
	size_t n_backends = tpb_peer_offers(hello_keeps, ps->d, backends, TPU_ARRAY_SIZE(backends));

	h.major = TPW_PEER_PROTO_MAJOR;
	h.minor = TPW_PEER_PROTO_MINOR;
	h.host = ps->hostname;
	h.boot_id.data = ps->boot_id;
	h.boot_id.len = sizeof(ps->boot_id);
	h.instance = ps->instance;
	h.n_backends = n_backends;
	h.backends = (char **)backends;
	h.data_conns = pr->outgoing ? cfg->peer_data_conns : 0;
	h.data_plaintext = !cfg->peer_data_encryption;
	h.force_cross_host = cfg->peer_force_cross_host;
	h.listen_port = ps->port_bound;
	h.frame_max = ps->limits->frame_max;
	h.status = st;
	h.message = (char *)msg;
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

/* The link is up: opens its endpoints of the RDMA channels (rdma, cuda_gdr) through the op
 * table where both daemons offer them, which starts their set-up (PeerRdma). */
static void peerhs_open_eps(struct tpd_peer *pr)
{
	struct tpb_rdma *g = tpd_daemon_rdma(pr->peers->d);
	struct tpb_ctx *ctxs[] = { tpb_rdma_ctx(g), tpb_rdma_gdr_ctx(g) };

	for (size_t i = 0; i < TPU_ARRAY_SIZE(ctxs); i++) {
		struct tpb_ep *ep;

		if (ctxs[i] && !pr->eps[ctxs[i]->idx] && tpb_ep_open(ctxs[i], &pr->tpeer, &ep) == 0)
			pr->eps[ctxs[i]->idx] = ep;
	}
}

void tpd_peerhs_link_up(struct tpd_peer *pr)
{
	size_t n = pr->pipes.len, i = 0, k = 0;
	struct tpd_pipe **v = calloc(n + 1, sizeof(*v));
	uint64_t key;
	void *val;

	pr->state = PEER_UP;
	pr->up_ns = tpu_now_ns();
	if (pr->authenticated)
		tpd_peer_log(pr, TPU_LOG_NOTICE,
			     "link up to %s with %u data connections, authenticated as %s, TLS 1.3%s",
			     pr->host, pr->data_attached, pr->identity,
			     pr->data_prot && strcmp(pr->data_prot, "plaintext") == 0
				     ? ", tensor bytes NOT encrypted (peer-data-encryption = no)"
				     : "");
	else
		tpd_peer_log(pr, TPU_LOG_WARNING,
			     "link up to %s with %u data connections, INSECURE: not authenticated, "
			     "not encrypted (--peer-insecure)",
			     pr->host, pr->data_attached);
	tpd_peer_log(pr, TPU_LOG_DEBUG, "data connections protected by %s",
		     pr->data_prot ? pr->data_prot : "nothing");
	tpd_peer_timer_arm_ms(pr->ev_timer, TPU_MAX(pr->peers->cfg->peer_timeout_ms / 3, 100u));
	peerhs_open_eps(pr);
	while (v && tpu_hmap_next(&pr->pipes, &i, &key, &val))
		v[k++] = val;
	for (i = 0; i < k; i++)
		tpd_peer_pipe_ops()->link_up(v[i]);
	free(v);
	tpd_peer_group_link_up(pr);
	tpd_peer_chan_link_up(pr);
}

/* Checks the peer's Hello (both sides). Return: 0 or -errno with @why filled. */
static int check_hello(struct tpd_peer *pr, const Tpw__V1__PeerHello *h, char *why, size_t wl)
{
	struct tpd_peers *ps = pr->peers;
	const struct tpd_config *cfg = ps->cfg;

	snprintf(pr->host, sizeof(pr->host), "%s", h->host ? h->host : "");
	pr->peer_minor = h->minor;
	pr->far_instance = h->instance;
	pr->far_frame_max = h->minor >= TPW_PEER_MINOR_WQ_CREATE && h->frame_max
				    ? h->frame_max : TPW_DEFAULT_FRAME_MAX;
	for (size_t i = 0; i < h->n_backends && pr->tpeer.n_offers < TPB_CHANNELS_MAX; i++) {
		int idx = tpb_index(h->backends[i]); /* the endpoints see the names they know */

		if (idx >= 0)
			pr->offers[pr->tpeer.n_offers++] = tpb_name(idx);
	}
	if (h->major != TPW_PEER_PROTO_MAJOR) {
		snprintf(why, wl, "peer speaks peer protocol %u.%u, this daemon %u.%u: run the same "
				  "tpipd release on both hosts", h->major, h->minor,
			 TPW_PEER_PROTO_MAJOR, TPW_PEER_PROTO_MINOR);
		return -EPROTONOSUPPORT;
	}
	if (h->instance == ps->instance) {
		snprintf(why, wl, "the address is this daemon's own");
		return -ELOOP;
	}
	if (h->boot_id.len == 16 && memcmp(h->boot_id.data, ps->boot_id, 16) == 0 &&
	    !cfg->peer_force_cross_host && !h->force_cross_host) {
		snprintf(why, wl, "the peer daemon runs on this host (same boot id); connect to its "
				  "socket, or start both daemons with --peer-force-cross-host");
		return -EOPNOTSUPP;
	}
	if (h->data_plaintext != !cfg->peer_data_encryption) {
		snprintf(why, wl, "peer-data-encryption differs: %s here, %s on the peer; set the "
				  "same on both daemons",
			 cfg->peer_data_encryption ? "yes" : "no",
			 h->data_plaintext ? "no" : "yes");
		return -EPROTO;
	}
	return 0;
}

void tpd_peerhs_dial_on_hello(struct tpd_peer *pr, const Tpw__V1__PeerHello *h)
{
	char why[240];
	int r;

	if (h->status && h->status != TPW__V1__STATUS__STATUS_OK) {
		tpd_peer_fail(pr, tpw_status_to_errno(h->status), "refused by the peer: %s",
			      h->message ? h->message : tpw_status_name(h->status));
		return;
	}
	r = check_hello(pr, h, why, sizeof(why));
	if (r < 0)
		tpd_peer_fail(pr, r, "%s", why);
}

void tpd_peerhs_answer_on_hello(struct tpd_peer *pr, const Tpw__V1__PeerHello *h)
{
	char why[240];
	int r = check_hello(pr, h, why, sizeof(why));

	if (r == 0 && (h->data_conns < 1 || h->data_conns > TPB_STRIPE_CONNS_MAX)) {
		snprintf(why, sizeof(why), "peer asks for %u data connections (1..%d)",
			 h->data_conns, TPB_STRIPE_CONNS_MAX);
		r = -EPROTO;
	}
	if (r == -ELOOP)
		r = 0; /* our own dial: answer, the dialling side notices and stops */
	if (r < 0) {
		refuse(pr, true, r, why);
		return;
	}
	pr->data_expected = h->data_conns;
	/* A claim: tpd_peer_get() reuses the link for dials to this port only when the peer's
	 * certificate names the host dialled. */
	pr->claimed_port = (uint16_t)h->listen_port;
	if (pr->ssl && tpd_peertls_link_key(pr->ssl, pr->link_id, pr->link_key) < 0) {
		refuse(pr, true, -EIO, "cannot export the link key from the TLS session");
		return;
	}
	tpd_peerhs_send_hello(pr, TPW__V1__STATUS__STATUS_OK, NULL);
	pr->state = PEER_DATA;
	tpd_peerhs_send_ready(pr, TPW__V1__STATUS__STATUS_OK, NULL, false);
}

void tpd_peerhs_tls_up(struct tpd_peer *pr, SSL *ssl)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	int fd = SSL_get_fd(ssl);

	pr->ssl = ssl;
	pr->authenticated = true;
	if (fd >= 0 && getpeername(fd, (struct sockaddr *)&ss, &sl) == 0)
		tpd_peer_sockaddr_text((struct sockaddr *)&ss, pr->src, sizeof(pr->src), false);
	tpd_peertls_identity(ssl, pr->identity, sizeof(pr->identity), &pr->cert_verified);
	tpd_peer_principal_set(pr);
	tpd_peer_log(pr, TPU_LOG_DEBUG, "TLS 1.3 (%s) with %s", SSL_get_cipher_name(ssl),
		     pr->identity);
}

SSL *tpd_peerhs_data_tls(struct tpd_peers *ps, int fd, bool server, const char *host)
{
	SSL *ssl = tpd_peertls_ssl_new(ps->tls, server, host);

	if (!ssl)
		return NULL;
	if (!SSL_set_fd(ssl, fd)) {
		SSL_free(ssl);
		return NULL;
	}
	if (ps->cfg->peer_data_encryption)
		SSL_set_options(ssl, SSL_OP_ENABLE_KTLS);
	if (server)
		SSL_set_accept_state(ssl);
	else
		SSL_set_connect_state(ssl);
	return ssl;
}

int tpd_peerhs_data_io(int fd, SSL *ssl, bool write, uint8_t *buf, size_t *done, size_t want,
		       bool *want_write, char *why, size_t wl)
{
	while (*done < want) {
		size_t n = 0;
		ssize_t k;
		int r;

		if (ssl) {
			ERR_clear_error();
			r = write ? SSL_write_ex(ssl, buf + *done, want - *done, &n)
				  : SSL_read_ex(ssl, buf + *done, want - *done, &n);
			r = tpd_peertls_step(ssl, r, want_write, why, wl);
			if (r <= 0)
				return r;
			*done += n;
			continue;
		}
		k = write ? send(fd, buf + *done, want - *done, MSG_NOSIGNAL | MSG_DONTWAIT)
			  : recv(fd, buf + *done, want - *done, MSG_DONTWAIT);
		if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
			*want_write = write;
			return 0;
		}
		if (k <= 0) {
			snprintf(why, wl, "%s", k ? strerror(errno) : "closed by the peer");
			return k ? -errno : -ECONNRESET;
		}
		*done += (size_t)k;
	}
	return 1;
}

static void data_dial_on_event(evutil_socket_t fd, short what, void *arg);

/* Waits for @dd's socket to be readable or (@write) writable, within the connect timeout. */
static int data_dial_wait(struct data_dial *dd, bool write)
{
	const struct tpd_config *cfg = dd->peers->cfg;
	struct timeval tv = { cfg->peer_connect_timeout_ms / 1000,
			      (cfg->peer_connect_timeout_ms % 1000) * 1000 };

	if (dd->ev)
		event_free(dd->ev);
	dd->ev = event_new(dd->peers->base, dd->fd, write ? EV_WRITE : EV_READ, data_dial_on_event,
			   dd);
	if (!dd->ev || tpd_timer_add(dd->ev, &tv) < 0)
		return -ENOMEM;
	return 0;
}

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
	for (unsigned i = 0; i < pr->peers->cfg->peer_data_conns; i++) {
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
		dd->peers = pr->peers;
		dd->peer_id = pr->id;
		dd->fd = fd;
		dd->index = i;
		dd->step = DATA_CONNECT;
		tpu_list_insert_tail(&pr->peers->data_dials, &dd->node);
		if (data_dial_wait(dd, true) < 0) {
			tpd_peerhs_data_dial_free(dd);
			tpd_peer_fail(pr, -ENOMEM, "out of memory");
			return;
		}
	}
}

void tpd_peerhs_data_dial_free(struct data_dial *dd)
{
	if (dd->ev)
		event_free(dd->ev);
	SSL_free(dd->ssl);
	tpu_close(dd->fd);
	tpu_list_remove(&dd->node);
	free(dd);
}

/* Finds live link @id (a data dial may outlive its link). */
static struct tpd_peer *peer_by_id(struct tpd_peers *ps, uint64_t id)
{
	struct tpd_peer *pr;

	tpu_list_for_each(pr, &ps->links, node)
		if (pr->id == id && pr->state != PEER_FAILED)
			return pr;
	return NULL;
}

/* Packs @dd's PeerDataHello (with its proof of the link under TLS) into dd->buf. */
static int data_dial_hello(struct tpd_peer *pr, struct data_dial *dd)
{
	Tpw__V1__PeerDataHello h = TPW__V1__PEER_DATA_HELLO__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	uint8_t bind[TPD_PEERTLS_BIND_LEN];

	h.link_id = pr->link_id;
	h.index = dd->index;
	if (dd->ssl) {
		if (tpd_peertls_binding(pr->link_key, dd->ssl, dd->index, true, bind) < 0)
			return -EIO;
		h.mac.data = bind;
		h.mac.len = sizeof(bind);
	}
	m.body_case = TPW__V1__PEER_MSG__BODY_DATA_HELLO;
	m.data_hello = &h;
	dd->want = tpw_frame_size(&m.base);
	if (dd->want > sizeof(dd->buf))
		return -EMSGSIZE;
	tpw_frame_pack(&m.base, 0, 0, 1, dd->buf);
	dd->len = 0;
	return 0;
}

/* The answerer's PeerDataHello is in dd->buf: it must name this link and connection and, under
 * TLS, prove the link's control session. Return: 0 or -errno with @why. */
static int data_dial_check(struct tpd_peer *pr, struct data_dial *dd, char *why, size_t wl)
{
	Tpw__V1__PeerMsg *m = NULL;
	struct tpw_hdr h;
	uint8_t bind[TPD_PEERTLS_BIND_LEN];
	int r = tpw_hdr_parse(dd->buf, sizeof(dd->buf) - TPW_HDR_SIZE, &h);

	if (r == 0)
		r = tpw_peer_msg_unpack(dd->buf + TPW_HDR_SIZE, h.msg_len, &m);
	if (r == 0 && (r = tpw_peer_msg_validate(m, &h, pr->peers->limits, why, wl)) < 0)
		goto out;
	if (r < 0 || m->body_case != TPW__V1__PEER_MSG__BODY_DATA_HELLO) {
		snprintf(why, wl, "the answer is not a data hello");
		r = -EPROTO;
		goto out;
	}
	if (m->data_hello->link_id != pr->link_id || m->data_hello->index != dd->index) {
		snprintf(why, wl, "the answer names link %llu connection %u",
			 (unsigned long long)m->data_hello->link_id, m->data_hello->index);
		r = -EPROTO;
		goto out;
	}
	if (dd->ssl && (tpd_peertls_binding(pr->link_key, dd->ssl, dd->index, false, bind) < 0 ||
			!tpd_peertls_binding_ok(bind, m->data_hello->mac.data,
						m->data_hello->mac.len))) {
		snprintf(why, wl, "the answerer does not prove this link's TLS session");
		r = -EACCES;
	}
out:
	tpw_peer_msg_free(m);
	return r;
}

/* Link up on the dialling side once PeerReady(data_up) came and every connection attached. */
static void dial_maybe_up(struct tpd_peer *pr)
{
	if (!pr->ready_seen || pr->data_attached < pr->peers->cfg->peer_data_conns)
		return;
	pr->data_attached = tpb_stripe_conns(pr->stripe);
	tpd_peerhs_link_up(pr);
}

/* @dd finished its exchange: hand its socket (and TLS, if tensor bytes stay encrypted) to the
 * stripe. Return: 0 or -errno. */
static int data_attach(struct tpd_peer *pr, int *fd, SSL **ssl)
{
	SSL *keep = pr->peers->cfg->peer_data_encryption ? *ssl : NULL;

	if (*ssl) {
		pr->data_prot = keep ? tpd_peertls_ktls(keep) : "plaintext";
		if (!keep)
			SSL_free(*ssl); /* no TLS shutdown: the bytes after the hellos are plaintext */
	} else {
		pr->data_prot = NULL;
	}
	*ssl = NULL;
	return tpb_stripe_add_conn_tls(pr->stripe, TAKE_FD(*fd), keep);
}

/* One step of @dd; Return: 1 attached, 0 waiting, < 0 failed with @why. */
static int data_dial_step(struct tpd_peer *pr, struct data_dial *dd, bool *ww, char *why,
			  size_t wl)
{
	int err = 0, r;
	socklen_t el = sizeof(err);

	switch (dd->step) {
	case DATA_CONNECT:
		if (getsockopt(dd->fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err) {
			err = err ? err : errno;
			snprintf(why, wl, "%s", strerror(err));
			return -err;
		}
		if (pr->peers->tls) {
			dd->ssl = tpd_peerhs_data_tls(pr->peers, dd->fd, false, pr->dial_host);
			if (!dd->ssl) {
				snprintf(why, wl, "out of memory");
				return -ENOMEM;
			}
		}
		dd->step = DATA_TLS;
		/* fall through */
	case DATA_TLS:
		if (dd->ssl) {
			ERR_clear_error();
			r = tpd_peertls_step(dd->ssl, SSL_do_handshake(dd->ssl), ww, why, wl);
			if (r <= 0) {
				if (r < 0) {
					char t[200];
					snprintf(t, sizeof(t), "%s", why);
					snprintf(why, wl, "TLS handshake failed: %s", t);
				}
				return r;
			}
		}
		r = data_dial_hello(pr, dd);
		if (r < 0) {
			snprintf(why, wl, "cannot build the data hello: %s", strerror(-r));
			return r;
		}
		dd->step = DATA_SEND;
		/* fall through */
	case DATA_SEND:
		r = tpd_peerhs_data_io(dd->fd, dd->ssl, true, dd->buf, &dd->len, dd->want, ww, why,
				       wl);
		if (r <= 0)
			return r;
		dd->step = DATA_RECV;
		dd->len = 0;
		dd->want = TPW_HDR_SIZE;
		/* fall through */
	case DATA_RECV:
		for (;;) {
			struct tpw_hdr h;
			r = tpd_peerhs_data_io(dd->fd, dd->ssl, false, dd->buf, &dd->len, dd->want,
					       ww, why, wl);
			if (r <= 0)
				return r;
			r = tpw_hdr_parse(dd->buf, sizeof(dd->buf) - TPW_HDR_SIZE, &h);
			if (r < 0 || h.data_len) {
				snprintf(why, wl, "bad answer frame");
				return -EPROTO;
			}
			if (dd->want > TPW_HDR_SIZE || !h.msg_len)
				break;
			dd->want += h.msg_len;
		}
		r = data_dial_check(pr, dd, why, wl);
		if (r < 0)
			return r;
		r = data_attach(pr, &dd->fd, &dd->ssl);
		if (r < 0) {
			snprintf(why, wl, "%s", strerror(-r));
			return r;
		}
		return 1;
	}
	return -EINVAL;
}

static void data_dial_on_event(evutil_socket_t fd, short what, void *arg)
{
	struct data_dial *dd = arg;
	struct tpd_peer *pr = peer_by_id(dd->peers, dd->peer_id);
	char why[300] = "";
	bool ww = false;
	unsigned index = dd->index;
	int r;

	if (!pr || pr->state != PEER_DATA) {
		tpd_peerhs_data_dial_free(dd);
		return;
	}
	if (what & EV_TIMEOUT) {
		snprintf(why, sizeof(why), "no answer within %u ms",
			 pr->peers->cfg->peer_connect_timeout_ms);
		r = -ETIMEDOUT;
	} else {
		r = data_dial_step(pr, dd, &ww, why, sizeof(why));
	}
	if (r == 0 && data_dial_wait(dd, ww) == 0)
		return;
	tpd_peerhs_data_dial_free(dd);
	if (r < 0) {
		tpd_peer_fail(pr, r, "data connection %u: %s", index, why);
		return;
	}
	if (r == 0) {
		tpd_peer_fail(pr, -ENOMEM, "out of memory");
		return;
	}
	pr->data_attached++;
	dial_maybe_up(pr);
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
		if (pr->ssl && tpd_peertls_link_key(pr->ssl, pr->link_id, pr->link_key) < 0) {
			tpd_peer_fail(pr, -EIO, "cannot export the link key from the TLS session");
			return;
		}
		dial_data(pr);
		return;
	}
	if (pr->state != PEER_DATA || pr->ready_seen) {
		tpd_peer_fail(pr, -EPROTO, "unexpected ready");
		return;
	}
	pr->ready_seen = true;
	dial_maybe_up(pr);
}
