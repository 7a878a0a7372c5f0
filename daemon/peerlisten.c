/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The TCP peer listener: parses and binds the peer-listen address, accepts connections and reads
 * each one's first frame within the connect timeout, then turns a PeerHello into a new answering
 * link (the handshake goes on in peerhs.c) and attaches a PeerDataHello, once its MAC and index
 * check out, to its link's stripe. It does not run the handshake, own links (peer.c) or dial.
 * Everything here runs on the loop thread.
 */
#include <arpa/inet.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "daemon.h"
#include "frame.h"
#include "log.h"
#include "peer.h"
#include "peer_int.h"
#include "peerauth.h"
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

/* At most one line a second for each limit: whoever reaches the port can hit them at will. */
static void limit_log(struct tpd_daemon *d, int which, const char *fmt, ...) _printf_(3, 4);

static void limit_log(struct tpd_daemon *d, int which, const char *fmt, ...)
{
	static struct tpd_ratelog logs[3];
	unsigned suppressed;
	char msg[300];
	va_list ap;

	(void)d;
	if (!tpd_ratelog_ok(&logs[which], 1000, &suppressed))
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	tpu_log_warn("%s (%u more refused since the last such line)", msg, suppressed);
}

/*
 * A connection from @addr was accepted: may it wait for its first frame? Bounded in total and
 * per source address, so that idle connections cannot take every fd. Return: true if so.
 */
static bool admit_pending(struct tpd_daemon *d, const char *addr)
{
	unsigned all = 0, same = 0;
	struct peer_conn *c;

	tpu_list_for_each(c, &d->peer_conns, node) {
		all++;
		same += same_host(c->addr, addr);
	}
	if (all >= d->cfg.peer_pending_max) {
		limit_log(d, 0, "peer connection from %s refused: %u connections wait for their "
			  "first frame (limit %u)", addr, all, d->cfg.peer_pending_max);
		return false;
	}
	if (same >= d->cfg.peer_pending_per_source) {
		limit_log(d, 0, "peer connection from %s refused: %u connections from that address "
			  "wait for their first frame (limit %u)", addr, same,
			  d->cfg.peer_pending_per_source);
		return false;
	}
	return true;
}

bool tpd_peerlisten_admit_link(struct tpd_daemon *d, const char *addr)
{
	unsigned all = 0, same = 0;
	struct tpd_peer *pr;

	tpu_list_for_each(pr, &d->peers, node) {
		if (pr->outgoing || pr->state == PEER_FAILED)
			continue;
		all++;
		same += same_host(pr->key, addr);
	}
	if (all >= d->cfg.peer_links_max) {
		limit_log(d, 1, "peer link from %s refused: %u links from other daemons (limit %u)",
			  addr, all, d->cfg.peer_links_max);
		return false;
	}
	if (same >= d->cfg.peer_links_per_source) {
		limit_log(d, 1, "peer link from %s refused: %u links from that address (limit %u)",
			  addr, same, d->cfg.peer_links_per_source);
		return false;
	}
	return true;
}

bool tpd_peerlisten_admit_data(struct tpd_daemon *d, const char *addr)
{
	unsigned all = 0;
	struct tpd_peer *pr;

	tpu_list_for_each(pr, &d->peers, node)
		if (pr->stripe)
			all += tpd_stripe_conns(pr->stripe);
	if (all < d->cfg.peer_data_conns_max)
		return true;
	limit_log(d, 2, "peer data connection from %s refused: %u data connections (limit %u)",
		  addr, all, d->cfg.peer_data_conns_max);
	return false;
}

bool tpd_peerlisten_admit_dial(struct tpd_daemon *d, char *why, size_t wl)
{
	unsigned links = 0, conns = 0;
	struct tpd_peer *pr;

	tpu_list_for_each(pr, &d->peers, node) {
		unsigned have = pr->stripe ? tpd_stripe_conns(pr->stripe) : 0;
		unsigned will = pr->outgoing ? d->cfg.peer_data_conns : pr->data_expected;

		if (pr->state == PEER_FAILED)
			continue;
		links += pr->outgoing;
		conns += have > will ? have : will;
	}
	if (links >= d->cfg.peer_links_max) {
		snprintf(why, wl, "this daemon has %u links to other daemons (limit %u)", links,
			 d->cfg.peer_links_max);
		limit_log(d, 1, "new peer link refused: %s", why);
		return false;
	}
	if (conns + d->cfg.peer_data_conns > d->cfg.peer_data_conns_max) {
		snprintf(why, wl, "this daemon's links have %u data connections, %u more would "
			 "exceed %u", conns, d->cfg.peer_data_conns, d->cfg.peer_data_conns_max);
		limit_log(d, 2, "new peer link refused: %s", why);
		return false;
	}
	return true;
}

/* ---- accepting ----------------------------------------------------------------------------- */

void tpd_peerlisten_conn_free(struct peer_conn *c)
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
		tpd_peerlisten_conn_free(c);
		return;
	}
	if (d->peer_keyed) {
		tpd_peerauth_mac(&d->peer_key, LABEL_DATA, pr->nonce_mine, 32, pr->nonce_theirs, 32,
				 h->index, mac);
		if (!tpd_peerauth_mac_ok(mac, h->mac.data, h->mac.len)) {
			tpd_peer_log(pr, TPU_LOG_WARNING,
				     "data connection from %s failed authentication", c->addr);
			tpd_peerlisten_conn_free(c);
			return;
		}
	}
	if (h->index >= pr->data_expected || pr->data_seen[h->index]) {
		tpd_peerlisten_conn_free(c);
		tpd_peer_fail(pr, -EPROTO, "bad data connection index %u", h->index);
		return;
	}
	if (!tpd_peerlisten_admit_data(d, c->addr)) {
		tpd_peerlisten_conn_free(c);
		tpd_peer_fail(pr, -ENOBUFS, "data connection limit of %u reached on this daemon",
			      d->cfg.peer_data_conns_max);
		return;
	}
	pr->data_seen[h->index] = true;
	r = tpd_stripe_add_conn(pr->stripe, c->fd);
	c->fd = -EBADF;
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
	struct tpd_daemon *d = c->d;
	struct tpd_peer *pr;
	int fd = c->fd;

	if (!tpd_peerlisten_admit_link(d, c->addr)) {
		tpd_peerlisten_conn_free(c);
		return;
	}
	pr = tpd_peer_new(d, false, c->addr);

	c->fd = -EBADF;
	tpd_peerlisten_conn_free(c);
	if (!pr || tpd_peer_bev_setup(pr, fd) < 0) {
		tpu_close(fd); /* still ours: the bufferevent that would take it does not exist */
		if (pr)
			tpd_peer_teardown(pr);
		tpu_log_warn("peer connection: out of memory");
		return;
	}
	pr->state = PEER_HANDSHAKE;
	if (tpd_peerauth_instance(&pr->link_id) < 0)
		pr->link_id = pr->id;
	tpd_peer_timer_arm_ms(pr->ev_timer, d->cfg.peer_connect_timeout_ms);
	bufferevent_enable(pr->bev, EV_READ | EV_WRITE);
	tpd_peer_log(pr, TPU_LOG_INFO, "accepted from %s", h->host ? h->host : "?");
	tpd_peerhs_answer_on_hello(pr, h);
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
		tpd_peerlisten_conn_free(c);
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
		tpd_peerlisten_conn_free(c);
		return;
	}
	n = recv(c->fd, c->buf + c->len, c->want - c->len, 0);
	if (n <= 0) {
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		tpu_log_info("peer connection from %s closed before its hello", c->addr);
		tpd_peerlisten_conn_free(c);
		return;
	}
	c->len += (size_t)n;
	if (c->len < c->want)
		return;
	r = tpw_hdr_parse(c->buf, FIRST_FRAME_MAX, &h);
	if (r < 0 || h.data_len) {
		tpu_log_info("peer connection from %s: bad first frame (%s), closing", c->addr,
			     r < 0 ? strerror(-r) : "data tail");
		tpd_peerlisten_conn_free(c);
		return;
	}
	if (c->want == TPW_HDR_SIZE) {
		c->want += h.msg_len;
		return;
	}
	event_del(c->ev);
	conn_first_frame(c, &h);
}

static void peer_on_accept_resume(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_daemon *d = arg;

	if (d->ev_peer_accept && !d->stopping) /* NULL once the peer listener closed */
		event_add(d->ev_peer_accept, NULL);
}

/*
 * accept() failed with @err (EMFILE, ENFILE, ENOBUFS...): the connection stays in the backlog
 * and the socket stays readable, so stop watching it for a second instead of spinning, and say
 * so at most every 10 s.
 */
static void accept_pause(struct tpd_daemon *d, int err)
{
	static const struct timeval one = { 1, 0 };
	unsigned suppressed;

	if (tpd_ratelog_ok(&d->peer_accept_log, 10000, &suppressed))
		tpu_log_warn("peer accept failed: %s; pausing peer accepts for 1 s (%u more pauses "
			     "since the last such line)", strerror(err), suppressed);
	if (!d->ev_peer_accept_resume)
		d->ev_peer_accept_resume = evtimer_new(d->base, peer_on_accept_resume, d);
	if (!d->ev_peer_accept_resume)
		return; /* cannot pause: keep accepting */
	event_del(d->ev_peer_accept);
	evtimer_add(d->ev_peer_accept_resume, &one);
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
			accept_pause(d, errno);
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
	tpd_peer_sockaddr_text((struct sockaddr *)&ss, c->addr, sizeof(c->addr), true);
	if (!admit_pending(d, c->addr)) {
		close(fd);
		free(c);
		return;
	}
	tpu_list_insert_tail(&d->peer_conns, &c->node);
	c->ev = event_new(d->base, fd, EV_READ | EV_PERSIST, conn_on_read, c);
	if (!c->ev) {
		tpd_peerlisten_conn_free(c);
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

int tpd_peerlisten_open(struct tpd_daemon *d, const char *spec)
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
	tpd_peer_sockaddr_text((struct sockaddr *)&ss, d->peer_listen_addr,
			       sizeof(d->peer_listen_addr), true);
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
