/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The TCP peer listener: parses and binds the peer-listen address, accepts connections, runs each
 * one's TLS 1.3 handshake (refusing, with one log line, a peer that speaks the plaintext protocol)
 * and reads its first frame within the connect timeout, then turns a PeerHello into a new
 * answering link (the handshake goes on in peerhs.c) and attaches a PeerDataHello, once it
 * proves its link's control session and its index checks out, to its link's stripe, answering
 * with this side's proof. With --peer-insecure the same runs over plain TCP. It does not own
 * links (peer.c) or dial. Everything here runs on the loop thread.
 */
#include <arpa/inet.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "addr.h"
#include "core.h"
#include "frame.h"
#include "log.h"
#include "peer.h"
#include "peer_int.h"
#include "peerauth.h"
#include "peertls.h"
#include "stripe.h"
#include "validate.h"

/* ---- limits -------------------------------------------------------------------------------- */

/* Length of the host part of "HOST:PORT" (IPv6 hosts are bracketed or bare: the last colon). */
static size_t host_len(const char *addr)
{
	const char *colon = strrchr(addr, ':');

	return colon ? (size_t)(colon - addr) : strlen(addr);
}

static bool same_host(const char *a, const char *b)
{
	size_t n = host_len(a);

	return n == host_len(b) && memcmp(a, b, n) == 0;
}

/* At most one line a second for each limit and source address (@addr, NULL for this daemon's
 * own dials), eight for all sources: whoever reaches the port can hit them at will, and one
 * source's flood must not hide another's. */
static void limit_log(struct tpd_peers *ps, int which, const char *addr, const char *fmt, ...)
	_printf_(4, 5);

static void limit_log(struct tpd_peers *ps, int which, const char *addr, const char *fmt, ...)
{
	unsigned suppressed;
	char msg[300];
	va_list ap;

	if (!tpd_quota_ratelog_key_ok(&ps->limit_log[which], addr ? addr : "",
				      addr ? host_len(addr) : 0, 1, 8, 1000, &suppressed))
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	tpu_log_warn("%s (%u more from there refused since its last such line)", msg, suppressed);
}

/*
 * A connection from @addr was accepted: may it wait for its first frame? Bounded in total and
 * per source address, so that idle connections cannot take every fd. Return: true if so.
 */
static bool admit_pending(struct tpd_peers *ps, const char *addr)
{
	const struct tpd_config *cfg = ps->cfg;
	unsigned all = 0, same = 0;
	struct peer_conn *c;

	tpu_list_for_each(c, &ps->conns, node) {
		all++;
		same += same_host(c->addr, addr);
	}
	if (all >= cfg->peer_pending_max) {
		limit_log(ps, 0, addr,
			  "peer connection from %s refused: %u connections wait for their first "
			  "frame (limit %u)", addr, all, cfg->peer_pending_max);
		return false;
	}
	if (same >= cfg->peer_pending_per_source) {
		limit_log(ps, 0, addr,
			  "peer connection from %s refused: %u connections from that address "
			  "wait for their first frame (limit %u)", addr, same,
			  cfg->peer_pending_per_source);
		return false;
	}
	return true;
}

bool tpd_peerlisten_admit_link(struct tpd_peers *ps, const char *addr)
{
	const struct tpd_config *cfg = ps->cfg;
	unsigned all = 0, same = 0;
	struct tpd_peer *pr;

	tpu_list_for_each(pr, &ps->links, node) {
		if (pr->outgoing || pr->state == PEER_FAILED)
			continue;
		all++;
		same += same_host(pr->key, addr);
	}
	if (all >= cfg->peer_links_max) {
		limit_log(ps, 1, addr,
			  "peer link from %s refused: %u links from other daemons (limit %u)",
			  addr, all, cfg->peer_links_max);
		return false;
	}
	if (same >= cfg->peer_links_per_source) {
		limit_log(ps, 1, addr,
			  "peer link from %s refused: %u links from that address (limit %u)",
			  addr, same, cfg->peer_links_per_source);
		return false;
	}
	return true;
}

bool tpd_peerlisten_admit_data(struct tpd_peers *ps, const char *addr)
{
	const struct tpd_config *cfg = ps->cfg;
	unsigned all = 0;
	struct tpd_peer *pr;

	tpu_list_for_each(pr, &ps->links, node)
		if (pr->stripe)
			all += tpb_stripe_conns(pr->stripe);
	if (all < cfg->peer_data_conns_max)
		return true;
	limit_log(ps, 2, addr,
		  "peer data connection from %s refused: %u data connections (limit %u)",
		  addr, all, cfg->peer_data_conns_max);
	return false;
}

bool tpd_peerlisten_admit_dial(struct tpd_peers *ps, char *why, size_t wl)
{
	const struct tpd_config *cfg = ps->cfg;
	unsigned links = 0, conns = 0;
	struct tpd_peer *pr;

	tpu_list_for_each(pr, &ps->links, node) {
		unsigned have = pr->stripe ? tpb_stripe_conns(pr->stripe) : 0;
		unsigned will = pr->outgoing ? cfg->peer_data_conns : pr->data_expected;

		if (pr->state == PEER_FAILED)
			continue;
		links += pr->outgoing;
		conns += have > will ? have : will;
	}
	if (links >= cfg->peer_links_max) {
		snprintf(why, wl, "this daemon has %u links to other daemons (limit %u)", links,
			 cfg->peer_links_max);
		limit_log(ps, 1, NULL, "new peer link refused: %s", why);
		return false;
	}
	if (conns + cfg->peer_data_conns > cfg->peer_data_conns_max) {
		snprintf(why, wl, "this daemon's links have %u data connections, %u more would "
			 "exceed %u", conns, cfg->peer_data_conns, cfg->peer_data_conns_max);
		limit_log(ps, 2, NULL, "new peer link refused: %s", why);
		return false;
	}
	return true;
}

/* ---- accepting ----------------------------------------------------------------------------- */

/*
 * Refusals of connections that failed authentication are warnings, and connections closed or
 * timed out before their hello, or whose first frame is bad, are noted, but anyone who reaches
 * the port can cause them: at most REFUSALS_LOGGED per REFUSAL_WINDOW_MS are logged for each
 * source address, and REFUSALS_LOGGED_ALL for all (so that one source's flood hides no
 * other's), and the number left out is logged with that source's first refusal of a later
 * window.
 */
#define REFUSALS_LOGGED 20
#define REFUSALS_LOGGED_ALL 100
#define REFUSAL_WINDOW_MS 10000

static bool refusal_log_ok(struct peer_conn *c)
{
	size_t n = host_len(c->addr);
	unsigned dropped;

	if (!tpd_quota_ratelog_key_ok(&c->peers->refusal_log, c->addr, n, REFUSALS_LOGGED,
				      REFUSALS_LOGGED_ALL, REFUSAL_WINDOW_MS, &dropped))
		return false;
	if (dropped)
		tpu_log_warn("%u more refused peer connections from %.*s were not logged", dropped,
			     (int)n, c->addr);
	return true;
}

void tpd_peerlisten_conn_free(struct peer_conn *c)
{
	if (c->ev)
		event_free(c->ev);
	SSL_free(c->ssl);
	tpu_close(c->fd);
	tpu_list_remove(&c->node);
	free(c);
}

/* Answers data connection @c of @pr with this side's PeerDataHello (and its proof under TLS).
 * Return: 0 or -errno with @why. */
static int data_answer(struct peer_conn *c, struct tpd_peer *pr, unsigned index, char *why,
		       size_t wl)
{
	Tpw__V1__PeerDataHello h = TPW__V1__PEER_DATA_HELLO__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	uint8_t bind[TPD_PEERTLS_BIND_LEN], buf[TPW_HDR_SIZE + 128];
	size_t done = 0, n;
	bool ww;
	int r;

	h.link_id = pr->link_id;
	h.index = index;
	if (c->ssl) {
		if (tpd_peertls_binding(pr->link_key, c->ssl, index, false, bind) < 0) {
			snprintf(why, wl, "cannot derive the link proof");
			return -EIO;
		}
		h.mac.data = bind;
		h.mac.len = sizeof(bind);
	}
	m.body_case = TPW__V1__PEER_MSG__BODY_DATA_HELLO;
	m.data_hello = &h;
	n = tpw_frame_size(&m.base);
	if (n > sizeof(buf))
		return -EMSGSIZE;
	tpw_frame_pack(&m.base, 0, 0, 1, buf);
	/* The first bytes on a fresh connection: the socket buffer takes them at once. */
	r = tpd_peerhs_data_io(c->fd, c->ssl, true, buf, &done, n, &ww, why, wl);
	if (r == 0) {
		snprintf(why, wl, "cannot send the answer");
		r = -EAGAIN;
	}
	return r < 0 ? r : 0;
}

static void accept_data(struct peer_conn *c, const Tpw__V1__PeerDataHello *h)
{
	struct tpd_peers *ps = c->peers;
	const struct tpd_config *cfg = ps->cfg;
	struct tpd_peer *pr;
	uint8_t bind[TPD_PEERTLS_BIND_LEN];
	char why[240];
	SSL *keep;
	int r;

	tpu_list_for_each(pr, &ps->links, node)
		if (!pr->outgoing && pr->state == PEER_DATA && pr->link_id == h->link_id)
			break;
	if (&pr->node == &ps->links) {
		if (refusal_log_ok(c))
			tpu_log_info("peer connection from %s: data connection for unknown link %llu",
				     c->addr, (unsigned long long)h->link_id);
		tpd_peerlisten_conn_free(c);
		return;
	}
	if (c->ssl && (tpd_peertls_binding(pr->link_key, c->ssl, h->index, true, bind) < 0 ||
		       !tpd_peertls_binding_ok(bind, h->mac.data, h->mac.len))) {
		/* Not this link's dialler: another peer's token, a replayed or forged one. The link
		 * itself is untouched. */
		tpd_peer_log(pr, TPU_LOG_WARNING,
			     "data connection from %s refused: it does not prove this link's TLS "
			     "session (wrong or replayed binding token)", c->addr);
		tpd_peerlisten_conn_free(c);
		return;
	}
	if (h->index >= pr->data_expected || pr->data_seen[h->index]) {
		tpd_peerlisten_conn_free(c);
		tpd_peer_fail(pr, -EPROTO, "bad data connection index %u", h->index);
		return;
	}
	if (!tpd_peerlisten_admit_data(ps, c->addr)) {
		tpd_peerlisten_conn_free(c);
		tpd_peer_fail(pr, -ENOBUFS, "data connection limit of %u reached on this daemon",
			      cfg->peer_data_conns_max);
		return;
	}
	r = data_answer(c, pr, h->index, why, sizeof(why));
	if (r < 0) {
		tpd_peerlisten_conn_free(c);
		tpd_peer_fail(pr, r, "data connection %u: %s", h->index, why);
		return;
	}
	pr->data_seen[h->index] = true;
	keep = cfg->peer_data_encryption ? c->ssl : NULL;
	if (c->ssl)
		pr->data_prot = keep ? tpd_peertls_ktls(keep) : "plaintext";
	if (!keep)
		SSL_free(c->ssl); /* no TLS shutdown: the bytes after the hellos are plaintext */
	c->ssl = NULL;
	r = tpb_stripe_add_conn_tls(pr->stripe, TAKE_FD(c->fd), keep);
	tpd_peerlisten_conn_free(c);
	if (r < 0) {
		tpd_peer_fail(pr, r, "data connection: %s", strerror(-r));
		return;
	}
	if (++pr->data_attached == pr->data_expected) {
		tpd_peerhs_send_ready(pr, TPW__V1__STATUS__STATUS_OK, NULL, true);
		tpd_peerhs_link_up(pr);
	}
}

static void accept_control(struct peer_conn *c, const Tpw__V1__PeerHello *h)
{
	struct tpd_peers *ps = c->peers;
	struct tpd_peer *pr;
	int fd = c->fd;
	SSL *ssl = c->ssl;

	if (!tpd_peerlisten_admit_link(ps, c->addr)) {
		tpd_peerlisten_conn_free(c);
		return;
	}
	pr = tpd_peer_new(ps, false, c->addr);

	c->fd = -EBADF;
	c->ssl = NULL;
	tpd_peerlisten_conn_free(c);
	if (!pr || tpd_peer_bev_setup(pr, fd, ssl) < 0) {
		SSL_free(ssl); /* still ours: the bufferevent that would take them does not exist */
		tpu_close(fd);
		if (pr)
			tpd_peer_teardown(pr);
		tpu_log_warn("peer connection: out of memory");
		return;
	}
	pr->state = PEER_HANDSHAKE;
	if (tpd_peerauth_instance(&pr->link_id) < 0)
		pr->link_id = pr->id;
	if (ssl)
		tpd_peerhs_tls_up(pr, ssl);
	tpd_peer_timer_arm_ms(pr->ev_timer, ps->cfg->peer_connect_timeout_ms);
	bufferevent_enable(pr->bev, EV_READ | EV_WRITE);
	if (ssl)
		tpd_peer_log(pr, TPU_LOG_INFO, "accepted from %s, authenticated as %s",
			     h->host ? h->host : "?", pr->identity);
	else
		tpd_peer_log(pr, TPU_LOG_WARNING,
			     "accepted from %s WITHOUT authentication (--peer-insecure)",
			     h->host ? h->host : "?");
	tpd_peerhs_answer_on_hello(pr, h);
}

/* A complete first frame is in c->buf. */
static void conn_first_frame(struct peer_conn *c, const struct tpw_hdr *h)
{
	Tpw__V1__PeerMsg *m = NULL;
	char why[200] = "message does not decode";
	int r = tpw_peer_msg_unpack(c->buf + TPW_HDR_SIZE, h->msg_len, &m);

	if (r == 0)
		r = tpw_peer_msg_validate(m, h, c->peers->limits, why, sizeof(why));
	if (r == 0 && m->body_case == TPW__V1__PEER_MSG__BODY_HELLO)
		accept_control(c, m->hello);
	else if (r == 0 && m->body_case == TPW__V1__PEER_MSG__BODY_DATA_HELLO)
		accept_data(c, m->data_hello);
	else {
		if (refusal_log_ok(c))
			tpu_log_info("peer connection from %s: %s, closing", c->addr,
				     r < 0 ? why : "first frame is neither hello nor data hello");
		tpd_peerlisten_conn_free(c);
	}
	tpw_peer_msg_free(m);
}

static void conn_on_event(evutil_socket_t fd, short what, void *arg);

/* Waits for @c's socket to be readable or (@write) writable, within what is left of the
 * connect timeout (armed at accept). Return: 0 or -ENOMEM. */
static int conn_wait(struct peer_conn *c, bool write)
{
	struct timeval tv = { 0, 0 };
	uint64_t now = tpu_now_ns();

	if (c->deadline_ns > now) {
		uint64_t left_us = (c->deadline_ns - now) / 1000u;
		tv.tv_sec = (time_t)(left_us / 1000000u);
		tv.tv_usec = (suseconds_t)(left_us % 1000000u);
	}
	if (c->ev)
		event_free(c->ev);
	c->ev = event_new(c->peers->base, c->fd, write ? EV_WRITE : EV_READ, conn_on_event, c);
	if (!c->ev || tpd_timer_add(c->ev, &tv) < 0)
		return -ENOMEM;
	return 0;
}

/*
 * Tells a plaintext dialler, in its own protocol, why it is refused (an old daemon logs "refused
 * by the peer: ..." instead of a bare close), then drains what it sent so that the close is a
 * FIN, not a reset that could destroy the answer. Nothing it sent is parsed.
 */
static void refuse_plaintext(struct peer_conn *c)
{
	Tpw__V1__PeerHello h = TPW__V1__PEER_HELLO__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	uint8_t buf[512];

	h.major = TPW_PEER_PROTO_MAJOR;
	h.minor = TPW_PEER_PROTO_MINOR;
	h.status = TPW__V1__STATUS__STATUS_PERMISSION;
	h.message = "this daemon accepts only TLS-authenticated peers (peer protocol 2): give both "
		    "daemons the same peer-key-file or certificates from one CA, and the same tpipd "
		    "release";
	m.body_case = TPW__V1__PEER_MSG__BODY_HELLO;
	m.hello = &h;
	if (tpw_frame_size(&m.base) <= sizeof(buf)) {
		size_t n = tpw_frame_pack(&m.base, 0, 0, 1, buf);
		(void)!send(c->fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
	}
	shutdown(c->fd, SHUT_WR);
	for (int i = 0; i < 16 && recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT) > 0; i++)
		;
}

/* The first byte tells TLS (a handshake record, 0x16) from the plaintext protocol ("TPW1").
 * Return: 1 the right kind for this daemon, 0 wait, < 0 refused (logged, @c freed). */
static int conn_sniff(struct peer_conn *c)
{
	uint8_t b;
	ssize_t n = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);

	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return 0;
	if (n <= 0) {
		if (refusal_log_ok(c))
			tpu_log_info("peer connection from %s closed before its hello", c->addr);
		tpd_peerlisten_conn_free(c);
		return -ECONNRESET;
	}
	if (c->ssl && b != 0x16) {
		if (refusal_log_ok(c))
			tpu_log_warn("peer connection from %s refused: it speaks the plaintext peer "
				     "protocol (a tpipd older than peer protocol %u, or one started "
				     "with --peer-insecure); this daemon accepts only "
				     "TLS-authenticated peers",
				     c->addr, TPW_PEER_PROTO_MAJOR);
		refuse_plaintext(c);
		tpd_peerlisten_conn_free(c);
		return -EPROTO;
	}
	if (!c->ssl && b == 0x16) {
		if (refusal_log_ok(c))
			tpu_log_warn("peer connection from %s refused: it starts TLS, but this daemon "
				     "runs with --peer-insecure (no authentication); configure the same "
				     "peer authentication on both",
				     c->addr);
		tpd_peerlisten_conn_free(c);
		return -EPROTO;
	}
	return 1;
}

static void conn_on_event(evutil_socket_t fd, short what, void *arg)
{
	struct peer_conn *c = arg;
	struct tpw_hdr h;
	char why[300];
	bool ww = false;
	int r;

	if (what & EV_TIMEOUT) {
		if (refusal_log_ok(c))
			tpu_log_info("peer connection from %s: no %s in time, closing", c->addr,
				     c->ssl && !c->tls_done ? "TLS handshake" : "hello");
		tpd_peerlisten_conn_free(c);
		return;
	}
	if (!c->sniffed) {
		r = conn_sniff(c);
		if (r < 0)
			return;
		if (r == 0)
			goto wait;
		c->sniffed = true;
	}
	if (c->ssl && !c->tls_done) {
		ERR_clear_error();
		r = tpd_peertls_step(c->ssl, SSL_do_handshake(c->ssl), &ww, why, sizeof(why));
		if (r < 0) {
			if (refusal_log_ok(c))
				tpu_log_warn("peer connection from %s: TLS handshake failed: %s",
					     c->addr, why);
			tpd_peerlisten_conn_free(c);
			return;
		}
		if (r == 0)
			goto wait;
		c->tls_done = true;
	}
	for (;;) {
		r = tpd_peerhs_data_io(c->fd, c->ssl, false, c->buf, &c->len, c->want, &ww, why,
				       sizeof(why));
		if (r < 0) {
			if (refusal_log_ok(c))
				tpu_log_info("peer connection from %s closed before its hello (%s)",
					     c->addr, why);
			tpd_peerlisten_conn_free(c);
			return;
		}
		if (r == 0)
			goto wait;
		r = tpw_hdr_parse(c->buf, FIRST_FRAME_MAX, &h);
		if (r < 0 || h.data_len) {
			if (refusal_log_ok(c))
				tpu_log_info("peer connection from %s: bad first frame (%s), closing",
					     c->addr, r < 0 ? strerror(-r) : "data tail");
			tpd_peerlisten_conn_free(c);
			return;
		}
		if (c->want > TPW_HDR_SIZE || !h.msg_len)
			break;
		c->want += h.msg_len;
	}
	event_free(c->ev);
	c->ev = NULL;
	conn_first_frame(c, &h);
	return;
wait:
	if (conn_wait(c, ww) < 0)
		tpd_peerlisten_conn_free(c);
}

static void peer_on_accept_resume(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_peers *ps = arg;

	if (ps->ev_accept && !tpd_daemon_stopping(ps->d)) /* NULL once the peer listener closed */
		event_add(ps->ev_accept, NULL);
}

/*
 * accept() failed with @err (EMFILE, ENFILE, ENOBUFS...): the connection stays in the backlog
 * and the socket stays readable, so stop watching it for a second instead of spinning, and say
 * so at most every 10 s.
 */
static void accept_pause(struct tpd_peers *ps, int err)
{
	static const struct timeval one = { 1, 0 };
	unsigned suppressed;

	if (tpd_quota_ratelog_ok(&ps->accept_log, 10000, &suppressed))
		tpu_log_warn("peer accept failed: %s; pausing peer accepts for 1 s (%u more pauses "
			     "since the last such line)", strerror(err), suppressed);
	if (!ps->ev_accept_resume)
		ps->ev_accept_resume = evtimer_new(ps->base, peer_on_accept_resume, ps);
	if (!ps->ev_accept_resume)
		return; /* cannot pause: keep accepting */
	event_del(ps->ev_accept);
	tpd_timer_add(ps->ev_accept_resume, &one);
}

static void peer_on_accept(evutil_socket_t lfd, short what, void *arg)
{
	struct tpd_peers *ps = arg;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	struct peer_conn *c;
	int fd;

	fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd < 0) {
		if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
			accept_pause(ps, errno);
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
	c->peers = ps;
	c->fd = fd;
	c->want = TPW_HDR_SIZE;
	c->deadline_ns = tpu_now_ns() + (uint64_t)ps->cfg->peer_connect_timeout_ms * 1000000u;
	tpd_peer_sockaddr_text((struct sockaddr *)&ss, c->addr, sizeof(c->addr), true);
	if (!admit_pending(ps, c->addr)) {
		close(fd);
		free(c);
		return;
	}
	tpu_list_insert_tail(&ps->conns, &c->node);
	if (ps->tls) {
		c->ssl = tpd_peerhs_data_tls(ps, fd, true, NULL);
		if (!c->ssl) {
			tpd_peerlisten_conn_free(c);
			return;
		}
	}
	if (conn_wait(c, false) < 0)
		tpd_peerlisten_conn_free(c);
}

/* ---- listener ------------------------------------------------------------------------------ */

int tpd_peerlisten_open(struct tpd_peers *ps, const char *spec)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	int one = 1, zero = 0, fd, r;

	r = tpd_addr_peer_listen(spec, &ss, &sl);
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
	tpd_peer_sockaddr_text((struct sockaddr *)&ss, ps->listen_addr, sizeof(ps->listen_addr),
			       true);
	ps->port_bound = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
						       : ((struct sockaddr_in6 *)&ss)->sin6_port);
	ps->listen_fd = fd;
	ps->ev_accept = event_new(ps->base, fd, EV_READ | EV_PERSIST, peer_on_accept, ps);
	if (!ps->ev_accept)
		return -ENOMEM;
	event_add(ps->ev_accept, NULL);
	if (ps->tls)
		tpu_log_notice("peer listener on %s (TLS 1.3, peers authenticated by %s%s%s)",
			       ps->listen_addr, ps->tls->psk ? "pre-shared key" : "",
			       ps->tls->psk && ps->tls->certs ? " or " : "",
			       ps->tls->certs ? "certificate" : "");
	else
		tpu_log_warn("peer listener on %s INSECURE (--peer-insecure): peers are neither "
			     "authenticated nor encrypted; any host that reaches this port can open "
			     "pipes. For test fabrics only", ps->listen_addr);
	return 0;
}
