/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Peer links: the TCP peer listener, dialling, the handshake (PeerHello, PeerAuth, PeerReady),
 * data connection set-up, keepalives, failure, and dispatch of pipe messages. See peer.h and
 * docs/peering.md. Everything here runs on the loop thread.
 */
#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/dns.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "daemon.h"
#include "frame.h"
#include "gdr.h"
#include "hmap.h"
#include "log.h"
#include "peer.h"
#include "peerauth.h"
#include "pipe.h"
#include "stripe.h"
#include "validate.h"

#define FIRST_FRAME_MAX 4096
#define LABEL_ANSWER "tpipd-peer-answer"
#define LABEL_DIAL "tpipd-peer-dial"
#define LABEL_DATA "tpipd-peer-data"

enum peer_state { PEER_CONNECTING, PEER_HANDSHAKE, PEER_DATA, PEER_UP, PEER_FAILED };

static const char *const state_names[] = { "connecting", "handshake", "handshake", "up",
					   "failed" };

struct tpd_peer {
	struct tpu_list node;
	struct tpd_daemon *d;
	uint64_t id;
	enum peer_state state;
	bool outgoing;
	bool authenticated;
	bool hello_seen;
	bool last_words; /* send_hello/send_ready: send at once (refusal) */
	char key[300];	 /* "HOST:PORT" to match dials: as dialled, or remote address + port */
	char host[256];	 /* the peer's host name */
	struct bufferevent *bev;
	struct event *ev_timer;
	struct event *ev_close;
	struct tpd_stripe *stripe;
	uint8_t nonce_mine[32], nonce_theirs[32];
	uint64_t link_id;
	unsigned data_expected, data_attached;
	bool data_seen[TPD_STRIPE_CONNS_MAX];
	struct tpu_hmap pipes; /* local pipe id -> struct tpd_pipe */
	struct tpu_hmap xfers; /* receive xfer id -> opaque (pipe.c) */
	uint64_t next_xfer_id;
	uint64_t seq_out;
	uint64_t created_ns, up_ns, last_rx_ns, rtt_us;
	uint64_t ctl_in, ctl_out;
	int fail_err;
	char last_error[200];
	bool peer_gdr;		    /* the peer offered cuda_gdr in its Hello */
	struct tpd_gdr_link *gdr;   /* RDMA set-up and sends (NULL: not on this link) */
};

/* An accepted connection whose first frame says what it is. */
struct peer_conn {
	struct tpu_list node;
	struct tpd_daemon *d;
	int fd;
	struct event *ev;
	uint8_t buf[TPW_HDR_SIZE + FIRST_FRAME_MAX];
	size_t len, want;
	uint64_t deadline_ns;
	char addr[80];
};

static void peer_fail(struct tpd_peer *pr, int err, const char *fmt, ...) _printf_(3, 4);

/* ---- helpers ------------------------------------------------------------------------------- */

static void sockaddr_text(const struct sockaddr *sa, char *buf, size_t len, bool with_port)
{
	char ip[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;

	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)sa;
		inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
		port = ntohs(in->sin_port);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)sa;
		inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
		port = ntohs(in6->sin6_port);
		if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
			inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], ip, sizeof(ip));
			snprintf(buf, len, with_port ? "%s:%u" : "%s", ip, port);
			return;
		}
		snprintf(buf, len, with_port ? "[%s]:%u" : "%s", ip, port);
		return;
	}
	snprintf(buf, len, with_port ? "%s:%u" : "%s", ip, port);
}

static void peer_log(const struct tpd_peer *pr, int level, const char *fmt, ...) _printf_(3, 4);

static void peer_log(const struct tpd_peer *pr, int level, const char *fmt, ...)
{
	char f[48], msg[600];
	const char *fields[] = { f, NULL };
	va_list ap;

	if (level > (int)tpu_log_get_level())
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	snprintf(f, sizeof(f), "TPIPD_PEER=%llu", (unsigned long long)pr->id);
	tpu_log_kv((enum tpu_log_level)level, fields, "peer %llu (%s): %s",
		   (unsigned long long)pr->id, pr->key, msg);
}

const char *tpd_peer_name(const struct tpd_peer *pr)
{
	return pr->key;
}

bool tpd_peer_is_up(const struct tpd_peer *pr)
{
	return pr->state == PEER_UP;
}

struct tpd_gdr_link *tpd_peer_gdr(struct tpd_peer *pr)
{
	return pr->gdr;
}

struct tpd_stripe *tpd_peer_stripe(struct tpd_peer *pr)
{
	return pr->stripe;
}

int tpd_peer_pipe_add(struct tpd_peer *pr, struct tpd_pipe *p)
{
	return tpu_hmap_put(&pr->pipes, p->id, p);
}

void tpd_peer_pipe_remove(struct tpd_peer *pr, struct tpd_pipe *p)
{
	if (tpu_hmap_get(&pr->pipes, p->id) == p)
		tpu_hmap_del(&pr->pipes, p->id);
}

uint64_t tpd_peer_xfer_add(struct tpd_peer *pr, void *arg)
{
	uint64_t id = ++pr->next_xfer_id;

	if (tpu_hmap_put(&pr->xfers, id, arg) < 0)
		return 0;
	return id;
}

void tpd_peer_xfer_drop(struct tpd_peer *pr, uint64_t xfer_id)
{
	tpu_hmap_del(&pr->xfers, xfer_id);
}

/* ---- sending ------------------------------------------------------------------------------- */

int tpd_peer_send(struct tpd_peer *pr, Tpw__V1__PeerMsg *m, const struct iovec *tail, int n_tail)
{
	struct evbuffer *out;
	uint32_t data_len = 0;
	size_t n;
	uint8_t *buf;

	if (pr->state == PEER_FAILED || !pr->bev)
		return -ENOTCONN;
	for (int i = 0; i < n_tail; i++)
		data_len += (uint32_t)tail[i].iov_len;
	n = tpw_frame_size(&m->base);
	buf = malloc(n);
	if (!buf)
		return -ENOMEM;
	tpw_frame_pack(&m->base, data_len, 0, ++pr->seq_out, buf);
	out = bufferevent_get_output(pr->bev);
	if (evbuffer_add(out, buf, n) < 0) {
		free(buf);
		return -ENOMEM;
	}
	free(buf);
	for (int i = 0; i < n_tail; i++)
		if (tail[i].iov_len && evbuffer_add(out, tail[i].iov_base, tail[i].iov_len) < 0)
			return -ENOMEM;
	pr->ctl_out += n + data_len;
	return 0;
}

/*
 * Sends @m on the control socket at once, bypassing the bufferevent (whose buffer libevent
 * drains only from the loop), for the last words before a close: a refusal, a goodbye. Only
 * when nothing else is queued, so frames never interleave; otherwise queues it normally.
 */
static void send_now(struct tpd_peer *pr, Tpw__V1__PeerMsg *m)
{
	uint8_t buf[1024];
	size_t n = tpw_frame_size(&m->base);

	if (!pr->bev || pr->state == PEER_FAILED)
		return;
	if (evbuffer_get_length(bufferevent_get_output(pr->bev)) || n > sizeof(buf)) {
		tpd_peer_send(pr, m, NULL, 0);
		return;
	}
	tpw_frame_pack(&m->base, 0, 0, ++pr->seq_out, buf);
	if (send(bufferevent_getfd(pr->bev), buf, n, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)n)
		pr->ctl_out += n;
}

/* ---- lifetime ------------------------------------------------------------------------------ */

static void peer_teardown(struct tpd_peer *pr)
{
	struct tpd_daemon *d = pr->d;
	size_t n = pr->pipes.len, i = 0, k = 0;
	struct tpd_pipe **v = calloc(n + 1, sizeof(*v));
	uint64_t key;
	void *val;

	pr->state = PEER_FAILED;
	/* Transfers first: their completions see the link failed and fail their messages. */
	tpd_stripe_free(pr->stripe);
	pr->stripe = NULL;
	tpd_gdr_link_free(pr->gdr);
	pr->gdr = NULL;
	while (v && tpu_hmap_next(&pr->pipes, &i, &key, &val))
		v[k++] = val;
	for (i = 0; i < k; i++)
		tpd_xpipe_link_failed(v[i], pr->fail_err ? pr->fail_err : -ECONNRESET,
				     pr->last_error);
	free(v);
	tpu_hmap_done(&pr->pipes);
	tpu_hmap_done(&pr->xfers);
	if (pr->bev)
		bufferevent_free(pr->bev);
	if (pr->ev_timer)
		event_free(pr->ev_timer);
	if (pr->ev_close)
		event_free(pr->ev_close);
	tpu_list_remove(&pr->node);
	d->n_peers--;
	free(pr);
}

static void peer_on_close(evutil_socket_t fd, short what, void *arg)
{
	peer_teardown(arg);
}

static void peer_fail(struct tpd_peer *pr, int err, const char *fmt, ...)
{
	va_list ap;

	if (pr->state == PEER_FAILED)
		return;
	va_start(ap, fmt);
	vsnprintf(pr->last_error, sizeof(pr->last_error), fmt, ap);
	va_end(ap);
	peer_log(pr, err == -ELOOP ? TPU_LOG_INFO : TPU_LOG_WARNING, "link failed: %s",
		 pr->last_error);
	pr->fail_err = err;
	pr->state = PEER_FAILED;
	if (pr->bev)
		bufferevent_disable(pr->bev, EV_READ | EV_WRITE);
	event_active(pr->ev_close, 0, 0);
}

static void peer_on_stripe_error(struct tpd_stripe *st, int err, const char *why, void *arg)
{
	peer_fail(arg, -ECONNRESET, "data connection failed: %s", why);
}

static int peer_make_stripe(struct tpd_peer *pr)
{
	struct tpd_stripe_config sc = { 0 };
	char name[32];

	snprintf(name, sizeof(name), "peer %llu", (unsigned long long)pr->id);
	sc.chunk = pr->d->cfg.peer_chunk;
	sc.name = name;
	sc.on_error = peer_on_stripe_error;
	sc.arg = pr;
	return tpd_stripe_new(pr->d->base, &sc, &pr->stripe);
}

static void peer_on_timer(evutil_socket_t fd, short what, void *arg);

static struct tpd_peer *peer_new(struct tpd_daemon *d, bool outgoing, const char *key)
{
	struct tpd_peer *pr = calloc(1, sizeof(*pr));

	if (!pr)
		return NULL;
	pr->d = d;
	pr->id = ++d->next_peer_id;
	pr->outgoing = outgoing;
	pr->created_ns = pr->last_rx_ns = tpu_now_ns();
	snprintf(pr->key, sizeof(pr->key), "%s", key);
	tpu_hmap_init(&pr->pipes);
	tpu_hmap_init(&pr->xfers);
	pr->ev_timer = evtimer_new(d->base, peer_on_timer, pr);
	pr->ev_close = event_new(d->base, -1, 0, peer_on_close, pr);
	if (!pr->ev_timer || !pr->ev_close || peer_make_stripe(pr) < 0 ||
	    tpd_peerauth_nonce(pr->nonce_mine) < 0) {
		tpd_stripe_free(pr->stripe);
		if (pr->ev_timer)
			event_free(pr->ev_timer);
		if (pr->ev_close)
			event_free(pr->ev_close);
		free(pr);
		return NULL;
	}
	tpu_list_insert_tail(&d->peers, &pr->node);
	d->n_peers++;
	return pr;
}

static void timer_arm_ms(struct event *ev, uint32_t ms)
{
	struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };

	evtimer_add(ev, &tv);
}

/* ---- handshake ----------------------------------------------------------------------------- */

static void send_hello(struct tpd_peer *pr, Tpw__V1__Status st, const char *msg)
{
	struct tpd_daemon *d = pr->d;
	Tpw__V1__PeerHello h = TPW__V1__PEER_HELLO__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	char *backends[] = { "mpt", "basic", "cuda_gdr" };
	uint8_t mac[32];

	h.major = TPW_PROTO_MAJOR;
	h.minor = TPW_PROTO_MINOR;
	h.host = d->hostname;
	h.boot_id.data = d->boot_id;
	h.boot_id.len = sizeof(d->boot_id);
	h.instance = d->instance;
	h.n_backends = TPU_ARRAY_SIZE(backends) - !tpd_gdr_offered(d);
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
		send_now(pr, &m);
	else
		tpd_peer_send(pr, &m, NULL, 0);
}

static void send_ready(struct tpd_peer *pr, Tpw__V1__Status st, const char *msg, bool data_up)
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
		send_now(pr, &m);
	else
		tpd_peer_send(pr, &m, NULL, 0);
}

/* Refuses the peer: tells it why (when it can still listen), logs, fails the link. */
static void refuse(struct tpd_peer *pr, bool as_hello, int err, const char *why)
{
	Tpw__V1__Status st = tpw_status_from_errno(err);

	pr->last_words = true;
	if (as_hello)
		send_hello(pr, st, why);
	else if (!pr->outgoing)
		send_ready(pr, st, why, false);
	peer_fail(pr, err, "%s", why);
}

static void link_up(struct tpd_peer *pr)
{
	size_t n = pr->pipes.len, i = 0, k = 0;
	struct tpd_pipe **v = calloc(n + 1, sizeof(*v));
	uint64_t key;
	void *val;

	pr->state = PEER_UP;
	pr->up_ns = tpu_now_ns();
	peer_log(pr, TPU_LOG_NOTICE, "link up to %s with %u data connections%s", pr->host,
		 pr->data_attached, pr->authenticated ? ", authenticated" : ", NOT authenticated");
	timer_arm_ms(pr->ev_timer, TPU_MAX(pr->d->cfg.peer_timeout_ms / 3, 100u));
	if (pr->peer_gdr)
		pr->gdr = tpd_gdr_link_new(pr->d, pr);
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
	for (size_t i = 0; i < h->n_backends; i++)
		pr->peer_gdr |= strcmp(h->backends[i], "cuda_gdr") == 0;
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

static void dial_on_hello(struct tpd_peer *pr, const Tpw__V1__PeerHello *h)
{
	struct tpd_daemon *d = pr->d;
	Tpw__V1__PeerAuth a = TPW__V1__PEER_AUTH__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	uint8_t mac[32];
	char why[240];
	int r;

	if (h->status && h->status != TPW__V1__STATUS__STATUS_OK) {
		peer_fail(pr, tpw_status_to_errno(h->status), "refused by the peer: %s",
			  h->message ? h->message : tpw_status_name(h->status));
		return;
	}
	r = check_hello(pr, h, why, sizeof(why));
	if (r < 0) {
		peer_fail(pr, r, "%s", why);
		return;
	}
	if (d->peer_keyed) {
		tpd_peerauth_mac(&d->peer_key, LABEL_ANSWER, pr->nonce_mine, 32, pr->nonce_theirs,
				 32, -1, mac);
		if (!tpd_peerauth_mac_ok(mac, h->mac.data, h->mac.len)) {
			peer_fail(pr, -EACCES, "peer failed authentication (wrong pre-shared key)");
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

static void answer_on_hello(struct tpd_peer *pr, const Tpw__V1__PeerHello *h)
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
			sockaddr_text((struct sockaddr *)&ss, ip, sizeof(ip), false);
			snprintf(pr->key, sizeof(pr->key), strchr(ip, ':') ? "[%s]:%u" : "%s:%u",
				 ip, h->listen_port);
		}
	}
	send_hello(pr, TPW__V1__STATUS__STATUS_OK, NULL);
	if (pr->d->peer_keyed)
		return; /* PeerAuth next */
	pr->state = PEER_DATA;
	send_ready(pr, TPW__V1__STATUS__STATUS_OK, NULL, false);
}

static void answer_on_auth(struct tpd_peer *pr, const Tpw__V1__PeerAuth *a)
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
	send_ready(pr, TPW__V1__STATUS__STATUS_OK, NULL, false);
}

struct data_dial {
	struct tpu_list node; /* in d->data_dials */
	struct tpd_daemon *d;
	uint64_t peer_id;
	int fd;
	unsigned index;
	struct event *ev;
};

static void data_dial_on_connect(evutil_socket_t fd, short what, void *arg);

/* Dials the data connections of a link whose answerer is ready for them. */
static void dial_data(struct tpd_peer *pr)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	if (getpeername(bufferevent_getfd(pr->bev), (struct sockaddr *)&ss, &sl) < 0) {
		peer_fail(pr, -errno, "getpeername: %m");
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
			peer_fail(pr, e, "data connection %u: %s", i, strerror(-e));
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
			peer_fail(pr, -ENOMEM, "out of memory");
			return;
		}
		tpu_list_insert_tail(&pr->d->data_dials, &dd->node);
		event_add(dd->ev, NULL);
	}
}

static void data_dial_free(struct data_dial *dd)
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
		data_dial_free(dd);
		return;
	}
	if (getsockopt(dd->fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err) {
		peer_fail(pr, -(err ? err : errno), "data connection %u: %s", dd->index,
			  strerror(err ? err : errno));
		data_dial_free(dd);
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
	data_dial_free(dd);
	if (r < 0)
		peer_fail(pr, r, "data connection: %s", strerror(-r));
}

static void dial_on_ready(struct tpd_peer *pr, const Tpw__V1__PeerReady *r)
{
	if (r->status && r->status != TPW__V1__STATUS__STATUS_OK) {
		peer_fail(pr, tpw_status_to_errno(r->status), "refused by the peer: %s",
			  r->message ? r->message : tpw_status_name(r->status));
		return;
	}
	if (!r->data_up) {
		if (pr->state != PEER_HANDSHAKE) {
			peer_fail(pr, -EPROTO, "unexpected ready");
			return;
		}
		pr->link_id = r->link_id;
		dial_data(pr);
		return;
	}
	if (pr->state != PEER_DATA) {
		peer_fail(pr, -EPROTO, "unexpected ready");
		return;
	}
	pr->data_attached = tpd_stripe_conns(pr->stripe);
	link_up(pr);
}

/* ---- control connection -------------------------------------------------------------------- */

static void on_ping(struct tpd_peer *pr, const Tpw__V1__PeerPing *p)
{
	Tpw__V1__PeerPing pong = TPW__V1__PEER_PING__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	uint64_t now = tpu_now_ns();

	if (p->reply) {
		if (p->t_ns && p->t_ns <= now)
			pr->rtt_us = (now - p->t_ns) / 1000;
		return;
	}
	pong.t_ns = p->t_ns;
	pong.reply = true;
	m.body_case = TPW__V1__PEER_MSG__BODY_PING;
	m.ping = &pong;
	tpd_peer_send(pr, &m, NULL, 0);
}

static struct tpd_pipe *find_pipe(struct tpd_peer *pr, uint64_t id)
{
	return tpu_hmap_get(&pr->pipes, id);
}

/* Handles a pipe message on an up link. Unknown pipe ids are stale (the pipe ended here
 * first) and dropped. */
static void dispatch_up(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
			uint32_t tail_len)
{
	struct tpd_pipe *p;

	switch (m->body_case) {
	case TPW__V1__PEER_MSG__BODY_CONNECT:
		tpd_xpipe_peer_connect(pr->d, pr, m->connect);
		return;
	case TPW__V1__PEER_MSG__BODY_CONNECT_REPLY:
		tpd_xpipe_peer_connect_reply(pr, find_pipe(pr, m->connect_reply->pipe_id),
					    m->connect_reply);
		return;
	case TPW__V1__PEER_MSG__BODY_DESCRIPTOR:
		if ((p = find_pipe(pr, m->descriptor->pipe_id)))
			tpd_xpipe_peer_descriptor(p, m->descriptor->descriptor, tail, tail_len);
		return;
	case TPW__V1__PEER_MSG__BODY_READ_REQ:
		if ((p = find_pipe(pr, m->read_req->pipe_id)))
			tpd_xpipe_peer_read_req(p, m->read_req);
		return;
	case TPW__V1__PEER_MSG__BODY_XFER_END: {
		void *arg = tpu_hmap_get(&pr->xfers, m->xfer_end->xfer_id);
		if (arg)
			tpd_xh_peer_xfer_end(pr, arg, m->xfer_end);
		return;
	}
	case TPW__V1__PEER_MSG__BODY_CONSUMED:
		if ((p = find_pipe(pr, m->consumed->pipe_id)))
			tpd_xpipe_peer_consumed(p, m->consumed);
		return;
	case TPW__V1__PEER_MSG__BODY_PIPE_CLOSE:
		if ((p = find_pipe(pr, m->pipe_close->pipe_id)))
			tpd_xpipe_peer_close(p, m->pipe_close->status, m->pipe_close->message);
		return;
	case TPW__V1__PEER_MSG__BODY_PING:
		on_ping(pr, m->ping);
		return;
	case TPW__V1__PEER_MSG__BODY_RDMA:
		tpd_gdr_link_on_msg(pr->gdr, m->rdma);
		return;
	default:
		peer_fail(pr, -EPROTO, "unexpected %s message on an up link",
			  m->base.descriptor->name);
	}
}

static void dispatch(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
		     uint32_t tail_len)
{
	bool dial = pr->outgoing;

	if (m->body_case == TPW__V1__PEER_MSG__BODY_PING && pr->state != PEER_UP) {
		on_ping(pr, m->ping);
		return;
	}
	switch (pr->state) {
	case PEER_HANDSHAKE:
		if (m->body_case == TPW__V1__PEER_MSG__BODY_HELLO && dial && !pr->hello_seen) {
			pr->hello_seen = true;
			dial_on_hello(pr, m->hello);
			return;
		}
		if (m->body_case == TPW__V1__PEER_MSG__BODY_AUTH && !dial && pr->d->peer_keyed &&
		    !pr->authenticated) {
			answer_on_auth(pr, m->auth);
			return;
		}
		if (m->body_case == TPW__V1__PEER_MSG__BODY_READY && dial) {
			dial_on_ready(pr, m->ready);
			return;
		}
		break;
	case PEER_DATA:
		if (m->body_case == TPW__V1__PEER_MSG__BODY_READY && dial) {
			dial_on_ready(pr, m->ready);
			return;
		}
		break;
	case PEER_UP:
		dispatch_up(pr, m, tail, tail_len);
		return;
	default:
		return;
	}
	peer_fail(pr, -EPROTO, "unexpected %s message during the handshake",
		  m->base.descriptor->name);
}

/* Parses and dispatches one complete frame at the head of @in. Return: 1 if one was
 * handled, 0 if more bytes are needed, < 0 on a violation (the link failed). */
static int read_one(struct tpd_peer *pr, struct evbuffer *in)
{
	struct tpd_daemon *d = pr->d;
	struct tpw_hdr h;
	Tpw__V1__PeerMsg *m = NULL;
	uint8_t *p;
	size_t total;
	char why[200];
	int r;

	if (evbuffer_get_length(in) < TPW_HDR_SIZE)
		return 0;
	p = evbuffer_pullup(in, TPW_HDR_SIZE);
	r = tpw_hdr_parse(p, d->limits.frame_max, &h);
	if (r < 0) {
		peer_fail(pr, -EPROTO, "bad frame header (%s)", strerror(-r));
		return r;
	}
	total = TPW_HDR_SIZE + (size_t)h.msg_len + h.data_len;
	if (evbuffer_get_length(in) < total)
		return 0;
	p = evbuffer_pullup(in, (ssize_t)total);
	if (!p) {
		peer_fail(pr, -ENOMEM, "out of memory");
		return -ENOMEM;
	}
	r = tpw_peer_msg_unpack(p + TPW_HDR_SIZE, h.msg_len, &m);
	if (r == 0)
		r = tpw_peer_msg_validate(m, &h, &d->limits, why, sizeof(why));
	else
		snprintf(why, sizeof(why), "message does not decode");
	if (r < 0) {
		tpw_peer_msg_free(m);
		peer_fail(pr, -EPROTO, "protocol violation: %s", why);
		return r;
	}
	pr->ctl_in += total;
	pr->last_rx_ns = tpu_now_ns();
	dispatch(pr, m, p + TPW_HDR_SIZE + h.msg_len, h.data_len);
	tpw_peer_msg_free(m);
	evbuffer_drain(in, total);
	return 1;
}

static void peer_on_read(struct bufferevent *bev, void *arg)
{
	struct tpd_peer *pr = arg;
	struct evbuffer *in = bufferevent_get_input(bev);

	while (pr->state != PEER_FAILED && read_one(pr, in) > 0)
		;
}

static void peer_on_event(struct bufferevent *bev, short what, void *arg)
{
	struct tpd_peer *pr = arg;
	int err = EVUTIL_SOCKET_ERROR();

	if (what & BEV_EVENT_CONNECTED) {
		int one = 1;
		setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		pr->state = PEER_HANDSHAKE;
		bufferevent_enable(bev, EV_READ | EV_WRITE);
		send_hello(pr, TPW__V1__STATUS__STATUS_OK, NULL);
		return;
	}
	if (what & BEV_EVENT_EOF) {
		peer_fail(pr, -ECONNRESET, "peer closed the connection");
		return;
	}
	if (what & BEV_EVENT_ERROR) {
		int dns = bufferevent_socket_get_dns_error(bev);
		if (dns)
			peer_fail(pr, -EHOSTUNREACH, "cannot resolve the host: %s",
				  evutil_gai_strerror(dns));
		else if (pr->state == PEER_CONNECTING)
			peer_fail(pr, err == ECONNREFUSED ? -ECONNREFUSED : -EHOSTUNREACH,
				  "cannot connect: %s", strerror(err));
		else
			peer_fail(pr, -ECONNRESET, "connection lost: %s", strerror(err));
	}
}

static void peer_on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_peer *pr = arg;
	struct tpd_daemon *d = pr->d;
	Tpw__V1__PeerPing p = TPW__V1__PEER_PING__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	uint64_t now = tpu_now_ns();

	if (pr->state != PEER_UP) {
		peer_fail(pr, -ETIMEDOUT, "no link within %u ms (stuck in %s)",
			  d->cfg.peer_connect_timeout_ms, state_names[pr->state]);
		return;
	}
	if (now - pr->last_rx_ns > (uint64_t)d->cfg.peer_timeout_ms * 1000000ull) {
		peer_fail(pr, -ECONNRESET, "peer daemon silent for %llu ms (timeout %u ms)",
			  (unsigned long long)((now - pr->last_rx_ns) / 1000000ull),
			  d->cfg.peer_timeout_ms);
		return;
	}
	p.t_ns = now;
	m.body_case = TPW__V1__PEER_MSG__BODY_PING;
	m.ping = &p;
	tpd_peer_send(pr, &m, NULL, 0);
	timer_arm_ms(pr->ev_timer, TPU_MAX(d->cfg.peer_timeout_ms / 3, 100u));
}

static int peer_bev_setup(struct tpd_peer *pr, int fd)
{
	pr->bev = bufferevent_socket_new(pr->d->base, fd, BEV_OPT_CLOSE_ON_FREE);
	if (!pr->bev)
		return -ENOMEM;
	bufferevent_setcb(pr->bev, peer_on_read, NULL, peer_on_event, pr);
	return 0;
}

static struct evdns_base *dns_base(struct tpd_daemon *d)
{
	if (!d->dns) {
		d->dns = evdns_base_new(d->base, EVDNS_BASE_INITIALIZE_NAMESERVERS |
							 EVDNS_BASE_NAMESERVERS_NO_DEFAULT);
		if (!d->dns)
			d->dns = evdns_base_new(d->base, 0);
	}
	return d->dns;
}

int tpd_peer_get(struct tpd_daemon *d, const char *host, uint16_t port, struct tpd_peer **ret,
		 char *why, size_t wl)
{
	struct tpd_peer *pr;
	char key[300];

	snprintf(key, sizeof(key), strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, port);
	tpu_list_for_each(pr, &d->peers, node)
		if (pr->state != PEER_FAILED && strcasecmp(pr->key, key) == 0) {
			*ret = pr;
			return 0;
		}
	if (d->stopping) {
		snprintf(why, wl, "daemon stopping");
		return -ESHUTDOWN;
	}
	pr = peer_new(d, true, key);
	if (!pr || peer_bev_setup(pr, -1) < 0) {
		if (pr)
			peer_teardown(pr);
		snprintf(why, wl, "out of memory");
		return -ENOMEM;
	}
	timer_arm_ms(pr->ev_timer, d->cfg.peer_connect_timeout_ms);
	peer_log(pr, TPU_LOG_INFO, "dialling");
	if (bufferevent_socket_connect_hostname(pr->bev, dns_base(d), AF_UNSPEC, host, port) < 0)
		peer_fail(pr, -EHOSTUNREACH, "cannot connect to %s", key);
	*ret = pr;
	return 0;
}

/* ---- accepting ----------------------------------------------------------------------------- */

static void conn_free(struct peer_conn *c)
{
	if (c->ev)
		event_free(c->ev);
	tpu_close(c->fd);
	tpu_list_remove(&c->node);
	free(c);
}

static void accept_data(struct peer_conn *c, const Tpw__V1__PeerDataHello *h)
{
	struct tpd_daemon *d = c->d;
	struct tpd_peer *pr;
	uint8_t mac[32];
	int r;

	tpu_list_for_each(pr, &d->peers, node)
		if (!pr->outgoing && pr->state == PEER_DATA && pr->link_id == h->link_id)
			break;
	if (&pr->node == &d->peers) {
		tpu_log_info("peer connection from %s: data connection for unknown link %llu",
			     c->addr, (unsigned long long)h->link_id);
		conn_free(c);
		return;
	}
	if (d->peer_keyed) {
		tpd_peerauth_mac(&d->peer_key, LABEL_DATA, pr->nonce_mine, 32, pr->nonce_theirs, 32,
				 h->index, mac);
		if (!tpd_peerauth_mac_ok(mac, h->mac.data, h->mac.len)) {
			peer_log(pr, TPU_LOG_WARNING, "data connection from %s failed authentication",
				 c->addr);
			conn_free(c);
			return;
		}
	}
	if (h->index >= pr->data_expected || pr->data_seen[h->index]) {
		conn_free(c);
		peer_fail(pr, -EPROTO, "bad data connection index %u", h->index);
		return;
	}
	pr->data_seen[h->index] = true;
	r = tpd_stripe_add_conn(pr->stripe, c->fd);
	c->fd = -EBADF;
	conn_free(c);
	if (r < 0) {
		peer_fail(pr, r, "data connection: %s", strerror(-r));
		return;
	}
	if (++pr->data_attached == pr->data_expected) {
		send_ready(pr, TPW__V1__STATUS__STATUS_OK, NULL, true);
		link_up(pr);
	}
}

static void accept_control(struct peer_conn *c, const Tpw__V1__PeerHello *h)
{
	struct tpd_daemon *d = c->d;
	struct tpd_peer *pr = peer_new(d, false, c->addr);
	int fd = c->fd;

	c->fd = -EBADF;
	conn_free(c);
	if (!pr || peer_bev_setup(pr, fd) < 0) {
		if (pr)
			peer_teardown(pr);
		else
			tpu_close(fd);
		tpu_log_warn("peer connection: out of memory");
		return;
	}
	pr->state = PEER_HANDSHAKE;
	if (tpd_peerauth_instance(&pr->link_id) < 0)
		pr->link_id = pr->id;
	timer_arm_ms(pr->ev_timer, d->cfg.peer_connect_timeout_ms);
	bufferevent_enable(pr->bev, EV_READ | EV_WRITE);
	peer_log(pr, TPU_LOG_INFO, "accepted from %s", h->host ? h->host : "?");
	answer_on_hello(pr, h);
}

/* A complete first frame is in c->buf. */
static void conn_first_frame(struct peer_conn *c, const struct tpw_hdr *h)
{
	Tpw__V1__PeerMsg *m = NULL;
	char why[200] = "message does not decode";
	int r = tpw_peer_msg_unpack(c->buf + TPW_HDR_SIZE, h->msg_len, &m);

	if (r == 0)
		r = tpw_peer_msg_validate(m, h, &c->d->limits, why, sizeof(why));
	if (r == 0 && m->body_case == TPW__V1__PEER_MSG__BODY_HELLO)
		accept_control(c, m->hello);
	else if (r == 0 && m->body_case == TPW__V1__PEER_MSG__BODY_DATA_HELLO)
		accept_data(c, m->data_hello);
	else {
		tpu_log_info("peer connection from %s: %s, closing", c->addr,
			     r < 0 ? why : "first frame is neither hello nor data hello");
		conn_free(c);
	}
	tpw_peer_msg_free(m);
}

static void conn_on_read(evutil_socket_t fd, short what, void *arg)
{
	struct peer_conn *c = arg;
	struct tpw_hdr h;
	ssize_t n;
	int r;

	if (what & EV_TIMEOUT) {
		tpu_log_info("peer connection from %s: no hello in time, closing", c->addr);
		conn_free(c);
		return;
	}
	n = recv(c->fd, c->buf + c->len, c->want - c->len, 0);
	if (n <= 0) {
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		tpu_log_info("peer connection from %s closed before its hello", c->addr);
		conn_free(c);
		return;
	}
	c->len += (size_t)n;
	if (c->len < c->want)
		return;
	r = tpw_hdr_parse(c->buf, FIRST_FRAME_MAX, &h);
	if (r < 0 || h.data_len) {
		tpu_log_info("peer connection from %s: bad first frame (%s), closing", c->addr,
			     r < 0 ? strerror(-r) : "data tail");
		conn_free(c);
		return;
	}
	if (c->want == TPW_HDR_SIZE) {
		c->want += h.msg_len;
		return;
	}
	event_del(c->ev);
	conn_first_frame(c, &h);
}

static void peer_on_accept(evutil_socket_t lfd, short what, void *arg)
{
	struct tpd_daemon *d = arg;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	struct timeval tv;
	struct peer_conn *c;
	int fd;

	fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd < 0) {
		if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
			tpu_log_warn("peer accept failed: %m");
		return;
	}
	/* Control frames are small and latency-bound: never wait for Nagle (data connections set
	 * it again when they join a stripe). */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){ 1 }, sizeof(int));
	c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return;
	}
	c->d = d;
	c->fd = fd;
	c->want = TPW_HDR_SIZE;
	sockaddr_text((struct sockaddr *)&ss, c->addr, sizeof(c->addr), true);
	tpu_list_insert_tail(&d->peer_conns, &c->node);
	c->ev = event_new(d->base, fd, EV_READ | EV_PERSIST, conn_on_read, c);
	if (!c->ev) {
		conn_free(c);
		return;
	}
	tv.tv_sec = d->cfg.peer_connect_timeout_ms / 1000;
	tv.tv_usec = (d->cfg.peer_connect_timeout_ms % 1000) * 1000;
	event_add(c->ev, &tv);
}

/* ---- listener ------------------------------------------------------------------------------ */

/* Parses "ADDR:PORT", "*:PORT", "[V6]:PORT" into @ss. */
static int parse_listen(const char *spec, struct sockaddr_storage *ss, socklen_t *sl)
{
	char host[80];
	const char *colon = strrchr(spec, ':');
	unsigned long port;
	char *end;

	if (!colon || colon == spec || (size_t)(colon - spec) >= sizeof(host))
		return -EINVAL;
	port = strtoul(colon + 1, &end, 10);
	if (*end || port > 65535 || colon[1] == '\0')
		return -EINVAL;
	memcpy(host, spec, (size_t)(colon - spec));
	host[colon - spec] = '\0';
	memset(ss, 0, sizeof(*ss));
	if (strcmp(host, "*") == 0 || strcmp(host, "[::]") == 0) {
		struct sockaddr_in6 *in6 = (void *)ss;
		in6->sin6_family = AF_INET6;
		in6->sin6_addr = in6addr_any;
		in6->sin6_port = htons((uint16_t)port);
		*sl = sizeof(*in6);
		return 0;
	}
	if (host[0] == '[') {
		struct sockaddr_in6 *in6 = (void *)ss;
		size_t l = strlen(host);
		if (l < 3 || host[l - 1] != ']')
			return -EINVAL;
		host[l - 1] = '\0';
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons((uint16_t)port);
		*sl = sizeof(*in6);
		return inet_pton(AF_INET6, host + 1, &in6->sin6_addr) == 1 ? 0 : -EINVAL;
	}
	{
		struct sockaddr_in *in = (void *)ss;
		in->sin_family = AF_INET;
		in->sin_port = htons((uint16_t)port);
		*sl = sizeof(*in);
		return inet_pton(AF_INET, host, &in->sin_addr) == 1 ? 0 : -EINVAL;
	}
}

static int listen_on(struct tpd_daemon *d, const char *spec)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	int one = 1, zero = 0, fd, r;

	r = parse_listen(spec, &ss, &sl);
	if (r < 0) {
		tpu_log_err("peer-listen: '%s' is not ADDR:PORT, *:PORT, [V6ADDR]:PORT or off",
			    spec);
		return r;
	}
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0 && ss.ss_family == AF_INET6 && strncmp(spec, "*:", 2) == 0) {
		/* No IPv6 here: all IPv4 addresses. */
		struct sockaddr_in *in = (void *)&ss;
		uint16_t port = ((struct sockaddr_in6 *)&ss)->sin6_port;
		memset(&ss, 0, sizeof(ss));
		in->sin_family = AF_INET;
		in->sin_port = port;
		sl = sizeof(*in);
		fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	}
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (ss.ss_family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
	if (bind(fd, (struct sockaddr *)&ss, sl) < 0 || listen(fd, 128) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	sl = sizeof(ss);
	getsockname(fd, (struct sockaddr *)&ss, &sl);
	sockaddr_text((struct sockaddr *)&ss, d->peer_listen_addr, sizeof(d->peer_listen_addr),
		      true);
	d->peer_port_bound = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
							   : ((struct sockaddr_in6 *)&ss)->sin6_port);
	d->peer_fd = fd;
	d->ev_peer_accept = event_new(d->base, fd, EV_READ | EV_PERSIST, peer_on_accept, d);
	if (!d->ev_peer_accept)
		return -ENOMEM;
	event_add(d->ev_peer_accept, NULL);
	if (d->peer_keyed)
		tpu_log_notice("peer listener on %s (pre-shared key required)", d->peer_listen_addr);
	else
		tpu_log_warn("peer listener on %s (no key: peers not authenticated; set [peer] "
			     "key-file outside trusted networks)", d->peer_listen_addr);
	return 0;
}

int tpd_peers_start(struct tpd_daemon *d)
{
	const struct tpd_config *c = &d->cfg;
	char why[300] = "";
	int r;

	tpu_list_init(&d->peers);
	tpu_list_init(&d->peer_conns);
	tpu_list_init(&d->data_dials);
	d->peer_fd = -EBADF;
	if (gethostname(d->hostname, sizeof(d->hostname) - 1) < 0)
		snprintf(d->hostname, sizeof(d->hostname), "unknown");
	r = tpd_peerauth_boot_id(d->boot_id);
	if (r < 0)
		tpu_log_warn("cannot read the boot id (%s): same-host peers are not recognised",
			     strerror(-r));
	for (size_t i = 0; i < sizeof(d->boot_id); i++)
		snprintf(d->boot_id_hex + 2 * i, 3, "%02x", d->boot_id[i]);
	r = tpd_peerauth_instance(&d->instance);
	if (r < 0)
		return r;
	if (c->peer_key_file[0]) {
		r = tpd_peerauth_key_load(c->peer_key_file, &d->peer_key, why, sizeof(why));
		if (r < 0) {
			tpu_log_err("peer key file: %s", why);
			return r;
		}
		d->peer_keyed = true;
	}
	if (strcmp(c->peer_listen, "off") == 0 || !c->peer_listen[0])
		return 0;
	r = listen_on(d, c->peer_listen);
	if (r < 0 && r != -EINVAL && strcmp(c->peer_listen, "*:7420") == 0) {
		tpu_log_warn("peer listener on %s: %s; cross-host pipes can still be dialled from "
			     "here, but other hosts cannot reach this daemon",
			     c->peer_listen, strerror(-r));
		return 0;
	}
	if (r < 0 && r != -EINVAL)
		tpu_log_err("peer listener on %s: %s", c->peer_listen, strerror(-r));
	return r;
}

/* Tells the peer that every pipe over @pr ends because this daemon stops, and pushes it out. */
static void say_goodbye(struct tpd_peer *pr)
{
	Tpw__V1__PeerPipeClose pc = TPW__V1__PEER_PIPE_CLOSE__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	size_t i = 0;
	uint64_t key;
	void *val;

	pc.status = TPW__V1__STATUS__STATUS_SHUTDOWN;
	pc.message = "the peer daemon is stopping";
	m.body_case = TPW__V1__PEER_MSG__BODY_PIPE_CLOSE;
	m.pipe_close = &pc;
	while (tpu_hmap_next(&pr->pipes, &i, &key, &val)) {
		struct tpd_pipe *p = val;
		if (!p->remote_id)
			continue;
		pc.pipe_id = p->remote_id;
		send_now(pr, &m);
	}
}

void tpd_peers_stop(struct tpd_daemon *d)
{
	struct tpd_peer *pr, *tmp;
	struct peer_conn *c, *ctmp;

	if (!d->peers.next)
		return;
	tpu_list_for_each_safe(pr, tmp, &d->peers, node) {
		if (pr->state == PEER_UP)
			say_goodbye(pr);
		if (pr->state != PEER_FAILED) {
			snprintf(pr->last_error, sizeof(pr->last_error), "daemon stopping");
			pr->fail_err = -ESHUTDOWN;
		}
		pr->state = PEER_FAILED;
		peer_teardown(pr);
	}
	tpu_list_for_each_safe(c, ctmp, &d->peer_conns, node)
		conn_free(c);
	while (!tpu_list_empty(&d->data_dials))
		data_dial_free(tpu_list_first(&d->data_dials, struct data_dial, node));
	if (d->ev_peer_accept)
		event_free(d->ev_peer_accept);
	d->ev_peer_accept = NULL;
	tpu_close(d->peer_fd);
	d->peer_fd = -EBADF;
	if (d->dns)
		evdns_base_free(d->dns, 0);
	d->dns = NULL;
	if (d->peer_keyed)
		tpd_peerauth_key_done(&d->peer_key);
	d->peer_keyed = false;
}

/* ---- tpipctl ------------------------------------------------------------------------------- */

int tpd_peers_ctl(struct tpd_daemon *d, Tpw__V1__CtlPeer ***ret, size_t *n)
{
	Tpw__V1__CtlPeer **v = calloc(d->n_peers + 1, sizeof(*v));
	struct tpd_peer *pr;
	size_t k = 0;
	uint64_t now = tpu_now_ns();

	if (!v)
		return -ENOMEM;
	tpu_list_for_each(pr, &d->peers, node) {
		Tpw__V1__CtlPeer *e = calloc(1, sizeof(*e));
		if (!e || k >= d->n_peers) {
			free(e);
			break;
		}
		tpw__v1__ctl_peer__init(e);
		e->id = pr->id;
		e->address = pr->key;
		e->host = pr->host;
		e->state = (char *)state_names[pr->state];
		e->outgoing = pr->outgoing;
		e->data_conns = pr->stripe ? tpd_stripe_conns(pr->stripe) : 0;
		e->rtt_us = pr->rtt_us;
		e->bytes_sent = pr->ctl_out + (pr->stripe ? tpd_stripe_bytes_sent(pr->stripe) : 0);
		e->bytes_received = pr->ctl_in +
				    (pr->stripe ? tpd_stripe_bytes_received(pr->stripe) : 0);
		e->rdma = (char *)tpd_gdr_link_state(pr->gdr);
		tpd_gdr_link_bytes(pr->gdr, &e->rdma_bytes_sent, &e->rdma_bytes_received);
		e->bytes_sent += e->rdma_bytes_sent;
		e->bytes_received += e->rdma_bytes_received;
		e->pipes = (uint32_t)pr->pipes.len;
		e->last_error = pr->last_error;
		e->authenticated = pr->authenticated;
		e->up_ms = pr->state == PEER_UP ? (now - pr->up_ns) / 1000000ull : 0;
		v[k++] = e;
	}
	*ret = v;
	*n = k;
	return 0;
}

void tpd_peers_ctl_free(Tpw__V1__CtlPeer **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}
