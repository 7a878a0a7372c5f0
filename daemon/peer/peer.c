/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Peer links: the link object's lifetime (creation, failure, teardown), sending on the control
 * connection, reading its frames and handing each to peermsg.c, finding or creating the link
 * for a dial. See peer.h and docs/peering.md. Starting and stopping the peer part and the
 * tpipctl snapshot are in peers.c, resolving and connecting a dialled link in peerdial.c, the
 * handshake and data connection set-up in peerhs.c, the TCP peer listener and accepted
 * connections in peerlisten.c, and what they share in peer_int.h. Everything here runs on the
 * loop thread.
 */
#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <unistd.h>
#include "core.h"
#include "frame.h"
#include "rdma/rdma.h"
#include "hmap.h"
#include "log.h"
#include "peer.h"
#include "peer_int.h"
#include "peerauth.h"
#include "peertls.h"
#include "stripe.h"
#include "validate.h"

/* ---- helpers ------------------------------------------------------------------------------- */

const char *tpd_peer_state_name(const struct tpd_peer *pr)
{
	static const char *const names[] = { "connecting", "handshake", "handshake", "handshake",
					     "up", "failed" };

	return names[pr->state];
}

void tpd_peer_sockaddr_text(const struct sockaddr *sa, char *buf, size_t len, bool with_port)
{
	char ip[INET6_ADDRSTRLEN + IF_NAMESIZE] = "?";
	unsigned port = 0;

	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)sa;
		inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
		port = ntohs(in->sin_port);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)sa;
		char zone[IF_NAMESIZE];
		inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
		port = ntohs(in6->sin6_port);
		if (in6->sin6_scope_id && IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) {
			/* fe80::1%eth0, as it is dialled */
			size_t n = strlen(ip);
			if (!if_indextoname(in6->sin6_scope_id, zone))
				snprintf(zone, sizeof(zone), "%u", in6->sin6_scope_id);
			snprintf(ip + n, sizeof(ip) - n, "%%%s", zone);
		}
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

void tpd_peer_log(const struct tpd_peer *pr, int level, const char *fmt, ...)
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

bool tpd_peer_log_ok(struct tpd_peer *pr, unsigned *ret_suppressed)
{
	static struct tpd_ratelog no_link, no_links; /* @pr NULL: no peer to charge */

	_Static_assert(TPD_PEER_PRINCIPAL_LEN < TPD_RATELOG_KEY_LEN - 1, "a principal is a name");
	if (!pr)
		return tpd_quota_ratelog_shared_ok(&no_link, TPD_PEER_LOG_BURST, &no_links,
						   TPD_PEER_LOG_ALL_BURST, TPD_PEER_LOG_WINDOW_MS,
						   ret_suppressed);
	return tpd_quota_ratelog_key_ok(&pr->peers->peer_log, pr->principal,
					strlen(pr->principal), TPD_PEER_LOG_BURST,
					TPD_PEER_LOG_ALL_BURST, TPD_PEER_LOG_WINDOW_MS,
					ret_suppressed);
}

const char *tpd_peer_identity(const struct tpd_peer *pr)
{
	return pr->authenticated && pr->identity[0] ? pr->identity : NULL;
}

const char *tpd_peer_principal(const struct tpd_peer *pr)
{
	return pr->principal;
}

bool tpd_peer_same(const struct tpd_peer *a, const struct tpd_peer *b)
{
	return a && b && (a == b || strcmp(a->principal, b->principal) == 0);
}

void tpd_peer_sending(struct tpd_peer *pr, bool on)
{
	if (!on) {
		pr->sends -= pr->sends > 0;
		return;
	}
	if (pr->sends++ == 0) {
		pr->tx_mark = pr->stripe ? tpb_stripe_bytes_sent(pr->stripe) : 0;
		pr->tx_since_ns = tpu_now_ns();
	}
}

/* Whether @pr's sends have been stuck for longer than @timeout_ms (logged by the caller). */
static bool peer_send_stuck(struct tpd_peer *pr, uint64_t now, uint32_t timeout_ms)
{
	uint64_t sent;

	if (!pr->sends || !pr->stripe)
		return false;
	sent = tpb_stripe_bytes_sent(pr->stripe);
	if (sent != pr->tx_mark || tpb_stripe_local_busy(pr->stripe)) {
		/* moved, or a sender is still reading a process's memory: not the peer's doing */
		pr->tx_mark = sent;
		pr->tx_since_ns = now;
		return false;
	}
	return now - pr->tx_since_ns > (uint64_t)timeout_ms * 1000000ull;
}

void tpd_peer_principal_set(struct tpd_peer *pr)
{
	const char *colon = strrchr(pr->key, ':');
	int n = colon ? (int)(colon - pr->key) : (int)strlen(pr->key);

	if (pr->cert_verified && pr->identity[0])
		snprintf(pr->principal, sizeof(pr->principal), "%s", pr->identity);
	else
		snprintf(pr->principal, sizeof(pr->principal), "addr:%.*s", n, pr->key);
}

const char *tpd_peer_account(const struct tpd_peer *pr, char *buf)
{
	const char *id = tpd_peer_identity(pr);

	if (!id)
		return NULL;
	if (pr->cert_verified) /* the certificate proves the host: a stated name adds nothing */
		snprintf(buf, TPD_PEER_ACCOUNT_LEN, "%s", id);
	else /* where it connects from, not the name it states (that is its choice) */
		snprintf(buf, TPD_PEER_ACCOUNT_LEN, "%s@%s", id, pr->src[0] ? pr->src : "?");
	return buf;
}

bool tpd_peer_identity_matches(const char *entry, const void *arg)
{
	const struct tpd_peer *pr = arg;
	const char *id = tpd_peer_identity(pr);

	if (!id)
		return false;
	if (strcmp(entry, id) == 0)
		return true;
	if (strcmp(entry, "psk") == 0)
		return strncmp(id, "psk:", 4) == 0;
	if (strncmp(entry, "cert:", 5) == 0 && entry[5] && !strchr(entry, '=') && pr->cert_verified)
		return pr->ssl && tpd_peertls_names_host(pr->ssl, entry + 5);
	return false;
}

bool tpd_peer_is_up(const struct tpd_peer *pr)
{
	return pr->state == PEER_UP;
}

bool tpd_peer_is_failed(const struct tpd_peer *pr)
{
	return pr->state == PEER_FAILED;
}

struct tpb_ep *tpd_peer_ep(struct tpd_peer *pr, int channel)
{
	return channel >= 0 && channel < TPB_CHANNELS_MAX ? pr->eps[channel] : NULL;
}

struct tpb_stripe *tpd_peer_stripe(struct tpd_peer *pr)
{
	return pr->stripe;
}

bool tpd_peer_connect_wait_ok(const struct tpd_peer *pr)
{
	return pr->peer_minor >= TPW_PEER_MINOR_CONNECT_WAIT;
}

/* The broker's pipe ops: one daemon per process, registered before the first link. */
static const struct tpd_peer_pipe_ops *pipe_ops;

void tpd_peer_set_pipe_ops(const struct tpd_peer_pipe_ops *ops)
{
	pipe_ops = ops;
}

const struct tpd_peer_pipe_ops *tpd_peer_pipe_ops(void)
{
	return pipe_ops;
}

int tpd_peer_pipe_add(struct tpd_peer *pr, struct tpd_pipe *p)
{
	return tpu_hmap_put(&pr->pipes, pipe_ops->id(p), p);
}

void tpd_peer_pipe_remove(struct tpd_peer *pr, struct tpd_pipe *p)
{
	uint64_t id = pipe_ops->id(p);

	if (tpu_hmap_get(&pr->pipes, id) == p)
		tpu_hmap_del(&pr->pipes, id);
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

/*
 * Frames for an up link wait in @pend until the end of the loop pass, then go out together in
 * one write straight on the socket (tpd_peers_flush()): a burst of frames costs one system call,
 * and the bufferevent's write event is enabled only when the socket cannot take them all. Before
 * the link is up (handshake) frames go through the bufferevent as they come.
 */
static struct evbuffer *peer_outq(struct tpd_peer *pr)
{
	if (pr->state != PEER_UP)
		return bufferevent_get_output(pr->bev);
	if (!pr->pend && !(pr->pend = evbuffer_new()))
		return NULL;
	if (!pr->flush_queued) {
		tpu_list_insert_tail(&pr->peers->flushq, &pr->flush_node);
		pr->flush_queued = true;
	}
	return pr->pend;
}

/*
 * Would @len more bytes take what waits for @pr's control connection above peer-queue-bytes?
 * Then the link fails: a peer daemon that sends requests (a ping, a channel op) and reads none of
 * the answers would otherwise make this daemon hold them all. One frame always goes when nothing
 * waits. Return: true if the link failed.
 */
static bool peer_outq_full(struct tpd_peer *pr, size_t len)
{
	uint64_t max = pr->peers->cfg->peer_outq_max;
	uint64_t queued = evbuffer_get_length(bufferevent_get_output(pr->bev));

	if (pr->pend)
		queued += evbuffer_get_length(pr->pend);
	if (!queued || queued + len <= max)
		return false;
	tpd_peer_fail(pr, -ENOBUFS, "peer daemon does not read its control connection: %llu bytes "
		      "queued (limit %llu, tpipd --peer-queue-bytes)", (unsigned long long)queued,
		      (unsigned long long)max);
	return true;
}

int tpd_peer_send(struct tpd_peer *pr, Tpw__V1__PeerMsg *m, const struct iovec *tail, int n_tail)
{
	struct evbuffer *out;
	struct evbuffer_iovec v;
	uint32_t data_len;
	size_t n, tail_len = 0;

	if (pr->state == PEER_FAILED || !pr->bev)
		return -ENOTCONN;
	for (int i = 0; i < n_tail; i++)
		tail_len += tail[i].iov_len;
	n = tpw_frame_size(&m->base);
	if (n - TPW_HDR_SIZE + tail_len > tpd_peer_chan_frame_max(pr)) {
		tpd_peer_log(pr, TPU_LOG_ERR, "not sending a frame of %zu bytes (message %d) above "
			     "the %u the far daemon accepts, which would fail the link there",
			     n - TPW_HDR_SIZE + tail_len, (int)m->body_case,
			     tpd_peer_chan_frame_max(pr));
		return -EMSGSIZE;
	}
	data_len = (uint32_t)tail_len;
	if (peer_outq_full(pr, n + tail_len))
		return -ENOBUFS;
	out = peer_outq(pr);
	if (!out || evbuffer_reserve_space(out, (ev_ssize_t)n, &v, 1) != 1)
		return -ENOMEM;
	tpw_frame_pack(&m->base, data_len, 0, ++pr->seq_out, v.iov_base);
	v.iov_len = n;
	if (evbuffer_commit_space(out, &v, 1) < 0)
		return -ENOMEM;
	for (int i = 0; i < n_tail; i++)
		if (tail[i].iov_len && evbuffer_add(out, tail[i].iov_base, tail[i].iov_len) < 0)
			return -ENOMEM;
	pr->ctl_out += n + data_len;
	return 0;
}

/* Writes what @pr queued in this pass; what the socket does not take (or an error, which the
 * bufferevent then meets and reports) goes to the bufferevent. */
static void peer_flush(struct tpd_peer *pr)
{
	struct evbuffer *out;
	int fd;

	if (!pr->pend || !evbuffer_get_length(pr->pend))
		return;
	if (!pr->bev || pr->state == PEER_FAILED) {
		evbuffer_drain(pr->pend, evbuffer_get_length(pr->pend));
		return;
	}
	out = bufferevent_get_output(pr->bev);
	if (!evbuffer_get_length(out) && !pr->ssl) { /* under TLS, the bufferevent encrypts */
		fd = bufferevent_getfd(pr->bev);
		while (evbuffer_get_length(pr->pend) && evbuffer_write(pr->pend, fd) > 0)
			;
	}
	if (evbuffer_get_length(pr->pend) && evbuffer_add_buffer(out, pr->pend) < 0)
		tpd_peer_fail(pr, -ENOMEM, "cannot queue control frames");
}

void tpd_peers_flush(struct tpd_daemon *d)
{
	struct tpd_peers *ps = tpd_daemon_peers(d);
	struct tpd_peer *pr;

	while (!tpu_list_empty(&ps->flushq)) {
		pr = tpu_list_first(&ps->flushq, struct tpd_peer, flush_node);
		tpu_list_remove(&pr->flush_node);
		pr->flush_queued = false;
		peer_flush(pr);
	}
}

/*
 * Sends @m on the control socket at once, bypassing the bufferevent (whose buffer libevent
 * drains only from the loop), for the last words before a close: a refusal, a goodbye. Only
 * when nothing else is queued, so frames never interleave; otherwise queues it normally.
 */
void tpd_peer_send_now(struct tpd_peer *pr, Tpw__V1__PeerMsg *m)
{
	uint8_t buf[1024];
	size_t n = tpw_frame_size(&m->base);

	if (!pr->bev || pr->state == PEER_FAILED)
		return;
	if (evbuffer_get_length(bufferevent_get_output(pr->bev)) ||
	    (pr->pend && evbuffer_get_length(pr->pend)) || n > sizeof(buf)) {
		tpd_peer_send(pr, m, NULL, 0);
		return;
	}
	tpw_frame_pack(&m->base, 0, 0, ++pr->seq_out, buf);
	if (pr->ssl) {
		/* Nothing is queued, so the bufferevent has no write of its own pending in @ssl. */
		size_t w = 0;
		ERR_clear_error();
		if (SSL_write_ex(pr->ssl, buf, n, &w) == 1 && w == n)
			pr->ctl_out += n;
		ERR_clear_error();
		return;
	}
	if (send(bufferevent_getfd(pr->bev), buf, n, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)n)
		pr->ctl_out += n;
}

/* ---- lifetime ------------------------------------------------------------------------------ */

void tpd_peer_teardown(struct tpd_peer *pr)
{
	struct tpd_peers *ps = pr->peers;
	size_t n = pr->pipes.len, i = 0, k = 0;
	struct tpd_pipe **v = calloc(n + 1, sizeof(*v));
	struct tpb_ep *eps[TPB_CHANNELS_MAX];
	int mpt = tpd_daemon_mpt(ps->d)->idx;
	uint64_t key;
	void *val;

	pr->state = PEER_FAILED;
	/* Transfers first: their completions see the link failed and fail their messages. */
	memcpy(eps, pr->eps, sizeof(eps));
	memset(pr->eps, 0, sizeof(pr->eps)); /* new ones are refused: -ENOTCONN */
	if (pr->ev_stripe)
		event_free(pr->ev_stripe);
	pr->ev_stripe = NULL;
	tpb_stripe_free(pr->stripe);
	pr->stripe = NULL;
	tpb_ep_close(eps[mpt]);
	tpb_progress(tpd_daemon_mpt(ps->d));
	/* Then the RDMA ones: their sends and receives still running complete inside the close,
	 * with -ECONNRESET. */
	for (int c = 0; c < TPB_CHANNELS_MAX; c++)
		if (c != mpt)
			tpb_ep_close(eps[c]);
	pipe_ops->waits_drop(ps->d, pr);
	tpd_peer_group_link_failed(pr);
	tpd_peer_chan_link_failed(pr);
	while (v && tpu_hmap_next(&pr->pipes, &i, &key, &val))
		v[k++] = val;
	for (i = 0; i < k; i++)
		pipe_ops->link_failed(v[i], pr->fail_err ? pr->fail_err : -ECONNRESET,
				      pr->last_error);
	free(v);
	tpu_hmap_done(&pr->pipes);
	tpu_hmap_done(&pr->xfers);
	tpd_peerdial_done(pr);
	if (pr->bev)
		bufferevent_free(pr->bev);
	if (pr->flush_queued)
		tpu_list_remove(&pr->flush_node);
	if (pr->pend)
		evbuffer_free(pr->pend);
	if (pr->ev_timer)
		event_free(pr->ev_timer);
	if (pr->ev_close)
		event_free(pr->ev_close);
	tpu_list_remove(&pr->node);
	ps->n_links--;
	free(pr);
}

static void peer_on_close(evutil_socket_t fd, short what, void *arg)
{
	tpd_peer_teardown(arg);
}

void tpd_peer_fail(struct tpd_peer *pr, int err, const char *fmt, ...)
{
	va_list ap;

	if (pr->state == PEER_FAILED)
		return;
	va_start(ap, fmt);
	vsnprintf(pr->last_error, sizeof(pr->last_error), fmt, ap);
	va_end(ap);
	tpd_peer_log(pr, err == -ELOOP ? TPU_LOG_INFO : TPU_LOG_WARNING, "link failed: %s",
		     pr->last_error);
	pr->fail_err = err;
	pr->state = PEER_FAILED;
	if (pr->bev)
		bufferevent_disable(pr->bev, EV_READ | EV_WRITE);
	event_active(pr->ev_close, 0, 0);
}

static void peer_on_stripe_error(struct tpb_stripe *st, int err, const char *why, void *arg)
{
	struct tpd_peer *pr = arg;

	/* The transfers the failure ended complete first, while the link is still up. */
	tpb_progress(tpd_daemon_mpt(pr->peers->d));
	tpd_peer_fail(pr, -ECONNRESET, "data connection failed: %s", why);
}

static void peer_on_stripe(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_peer *pr = arg;
	struct tpb_ctx *mpt = tpd_daemon_mpt(pr->peers->d);

	tpb_stripe_progress(pr->stripe); /* ends transfers: their mpt ops wait on the context */
	tpb_progress(mpt);		 /* their completions, in this same pass */
}

static int peer_make_stripe(struct tpd_peer *pr)
{
	const struct tpd_config *cfg = pr->peers->cfg;
	struct tpb_stripe_config sc = { 0 };
	struct tpb_ctx *mpt;
	char name[32];
	int r;

	snprintf(name, sizeof(name), "peer %llu", (unsigned long long)pr->id);
	sc.chunk = cfg->peer_chunk;
	sc.send_size = cfg->peer_send_size;
	sc.name = name;
	sc.on_error = peer_on_stripe_error;
	sc.arg = pr;
	r = tpb_stripe_new(&sc, &pr->stripe);
	if (r < 0)
		return r;
	pr->ev_stripe = event_new(pr->peers->base, tpb_stripe_event_fd(pr->stripe),
				  EV_READ | EV_PERSIST, peer_on_stripe, pr);
	if (!pr->ev_stripe || event_add(pr->ev_stripe, NULL) < 0)
		return -ENOMEM;
	pr->tpeer = (struct tpb_peer){ .name = pr->key, .link = pr, .stripe = pr->stripe,
				       .offers = pr->offers, .link_ops = &tpd_peer_rdma_ops };
	mpt = tpd_daemon_mpt(pr->peers->d);
	return tpb_ep_open(mpt, &pr->tpeer, &pr->eps[mpt->idx]);
}

static void peer_on_timer(evutil_socket_t fd, short what, void *arg);

struct tpd_peer *tpd_peer_new(struct tpd_peers *ps, bool outgoing, const char *key)
{
	struct tpd_peer *pr = calloc(1, sizeof(*pr));

	if (!pr)
		return NULL;
	pr->peers = ps;
	pr->id = ++ps->next_id;
	pr->outgoing = outgoing;
	pr->created_ns = pr->last_rx_ns = tpu_now_ns();
	snprintf(pr->key, sizeof(pr->key), "%s", key);
	tpd_peer_principal_set(pr);
	tpu_hmap_init(&pr->pipes);
	tpu_hmap_init(&pr->xfers);
	pr->ev_timer = evtimer_new(ps->base, peer_on_timer, pr);
	pr->ev_close = event_new(ps->base, -1, 0, peer_on_close, pr);
	if (!pr->ev_timer || !pr->ev_close || peer_make_stripe(pr) < 0) {
		tpb_ep_close(tpd_peer_ep(pr, tpd_daemon_mpt(ps->d)->idx));
		if (pr->ev_stripe)
			event_free(pr->ev_stripe);
		tpb_stripe_free(pr->stripe);
		if (pr->ev_timer)
			event_free(pr->ev_timer);
		if (pr->ev_close)
			event_free(pr->ev_close);
		free(pr);
		return NULL;
	}
	tpu_list_insert_tail(&ps->links, &pr->node);
	ps->n_links++;
	return pr;
}

void tpd_peer_timer_arm_ms(struct event *ev, uint32_t ms)
{
	struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };

	event_base_update_cache_time(event_get_base(ev)); /* from now, not the pass's start */
	tpd_timer_add(ev, &tv);
}

/* ---- control connection -------------------------------------------------------------------- */

/* Parses and dispatches one complete frame at the head of @in. Return: 1 if one was
 * handled, 0 if more bytes are needed, < 0 on a violation (the link failed). */
static int read_one(struct tpd_peer *pr, struct evbuffer *in)
{
	struct tpd_peers *ps = pr->peers;
	struct tpw_hdr h;
	Tpw__V1__PeerMsg *m = NULL;
	uint8_t *p;
	size_t total;
	char why[200];
	int r;

	if (evbuffer_get_length(in) < TPW_HDR_SIZE)
		return 0;
	p = evbuffer_pullup(in, TPW_HDR_SIZE);
	r = tpw_hdr_parse(p, ps->limits->frame_max, &h);
	if (r < 0) {
		tpd_peer_fail(pr, -EPROTO, "bad frame header (%s)", strerror(-r));
		return r;
	}
	total = TPW_HDR_SIZE + (size_t)h.msg_len + h.data_len;
	if (evbuffer_get_length(in) < total)
		return 0;
	p = evbuffer_pullup(in, (ssize_t)total);
	if (!p) {
		tpd_peer_fail(pr, -ENOMEM, "out of memory");
		return -ENOMEM;
	}
	r = tpw_peer_msg_unpack(p + TPW_HDR_SIZE, h.msg_len, &m);
	if (r == 0)
		r = tpw_peer_msg_validate(m, &h, ps->limits, why, sizeof(why));
	else
		snprintf(why, sizeof(why), "message does not decode");
	if (r < 0) {
		tpw_peer_msg_free(m);
		tpd_peer_fail(pr, -EPROTO, "protocol violation: %s", why);
		return r;
	}
	pr->ctl_in += total;
	pr->last_rx_ns = tpu_now_ns();
	tpd_peermsg_dispatch(pr, m, p + TPW_HDR_SIZE + h.msg_len, h.data_len);
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

static void peer_on_read(struct bufferevent *bev, void *arg);
static void peer_on_event(struct bufferevent *bev, short what, void *arg);

/* The dialled control connection is up as TCP: go on over TLS on the same socket (a dup: the
 * plain bufferevent closes its own). Return: 0 or -errno. */
static int dial_tls_start(struct tpd_peer *pr)
{
	SSL *ssl = tpd_peertls_ssl_new(pr->peers->tls, false, pr->dial_host);
	int fd = ssl ? fcntl(bufferevent_getfd(pr->bev), F_DUPFD_CLOEXEC, 3) : -1;
	struct bufferevent *bev;

	if (fd < 0) {
		SSL_free(ssl);
		return -ENOMEM;
	}
	bev = bufferevent_openssl_socket_new(pr->peers->base, fd, ssl, BUFFEREVENT_SSL_CONNECTING,
					     BEV_OPT_CLOSE_ON_FREE);
	if (!bev) {
		SSL_free(ssl);
		close(fd);
		return -ENOMEM;
	}
	bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
	bufferevent_free(pr->bev);
	pr->bev = bev;
	bufferevent_setcb(bev, peer_on_read, NULL, peer_on_event, pr);
	pr->state = PEER_TLS;
	bufferevent_enable(bev, EV_READ | EV_WRITE);
	return 0;
}

/* The OpenSSL errors of @bev's connection as one line. */
static void bev_tls_error(struct tpd_peer *pr, struct bufferevent *bev, char *buf, size_t len)
{
	SSL *ssl = bufferevent_openssl_get_ssl(bev);
	unsigned long e;
	size_t n;

	/* libevent moved OpenSSL's queue into the bufferevent: put it back for the reader. */
	ERR_clear_error();
	while ((e = bufferevent_get_openssl_error(bev)))
		if (ERR_GET_LIB(e)) /* libevent also queues SSL_get_error() codes: not errors */
			ERR_put_error(ERR_GET_LIB(e), 0, ERR_GET_REASON(e), NULL, 0);
	tpd_peertls_error(ssl, buf, len);
	n = strlen(buf);
	if (strcmp(buf, "connection closed") == 0)
		snprintf(buf + n, len - n, " during the TLS handshake (the peer refused it: a "
					   "different key or CA, or a tpipd without TLS)");
	(void)pr;
}

static void peer_on_event(struct bufferevent *bev, short what, void *arg)
{
	struct tpd_peer *pr = arg;
	int err = EVUTIL_SOCKET_ERROR();
	char why[400];

	if (what & BEV_EVENT_CONNECTED) {
		int one = 1;
		if (pr->state == PEER_CONNECTING) {
			tpd_peerdial_connected(pr);
			setsockopt(bufferevent_getfd(bev), IPPROTO_TCP, TCP_NODELAY, &one,
				   sizeof(one));
			if (pr->peers->tls) {
				err = dial_tls_start(pr);
				if (err < 0)
					tpd_peer_fail(pr, err, "out of memory");
				return;
			}
		} else {
			tpd_peerhs_tls_up(pr, bufferevent_openssl_get_ssl(bev));
		}
		pr->state = PEER_HANDSHAKE;
		bufferevent_enable(bev, EV_READ | EV_WRITE);
		tpd_peerhs_send_hello(pr, TPW__V1__STATUS__STATUS_OK, NULL);
		return;
	}
	if (pr->state == PEER_TLS && (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))) {
		bev_tls_error(pr, bev, why, sizeof(why));
		tpd_peer_fail(pr, -EACCES, "TLS handshake failed: %s", why);
		return;
	}
	if (what & BEV_EVENT_EOF) {
		tpd_peer_fail(pr, -ECONNRESET, "peer closed the connection");
		return;
	}
	if (what & BEV_EVENT_ERROR) {
		if (pr->state == PEER_CONNECTING && pr->addr)
			tpd_peerdial_error(pr, err);
		else if (pr->ssl && bufferevent_get_openssl_error(bev))
			tpd_peer_fail(pr, -EPROTO, "TLS error on the control connection");
		else
			tpd_peer_fail(pr, -ECONNRESET, "connection lost: %s", strerror(err));
	}
}

static void peer_on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_peer *pr = arg;
	struct tpd_peers *ps = pr->peers;
	const struct tpd_config *cfg = ps->cfg;
	Tpw__V1__PeerPing p = TPW__V1__PEER_PING__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	uint64_t now = tpu_now_ns();

	if (pr->state == PEER_CONNECTING && pr->outgoing) {
		tpd_peerdial_timeout(pr);
		return;
	}
	if (pr->state != PEER_UP) {
		tpd_peer_fail(pr, -ETIMEDOUT, "no link within %u ms (stuck in %s)",
			      cfg->peer_connect_timeout_ms, tpd_peer_state_name(pr));
		return;
	}
	if (now - pr->last_rx_ns > (uint64_t)cfg->peer_timeout_ms * 1000000ull) {
		tpd_peer_fail(pr, -ECONNRESET, "peer daemon silent for %llu ms (timeout %u ms)",
			      (unsigned long long)((now - pr->last_rx_ns) / 1000000ull),
			      cfg->peer_timeout_ms);
		return;
	}
	if (peer_send_stuck(pr, now, cfg->peer_timeout_ms)) {
		tpd_peer_fail(pr, -ETIMEDOUT, "peer daemon took no chunk of the %u sends "
			      "waiting on its data connections for %llu ms (timeout %u ms)",
			      pr->sends, (unsigned long long)((now - pr->tx_since_ns) / 1000000ull),
			      cfg->peer_timeout_ms);
		return;
	}
	p.t_ns = now;
	m.body_case = TPW__V1__PEER_MSG__BODY_PING;
	m.ping = &p;
	tpd_peer_send(pr, &m, NULL, 0);
	tpd_peer_timer_arm_ms(pr->ev_timer, TPU_MAX(cfg->peer_timeout_ms / 3, 100u));
}

int tpd_peer_bev_setup(struct tpd_peer *pr, int fd, SSL *ssl)
{
	if (ssl) {
		pr->bev = bufferevent_openssl_socket_new(pr->peers->base, fd, ssl,
							 BUFFEREVENT_SSL_OPEN,
							 BEV_OPT_CLOSE_ON_FREE);
		if (pr->bev)
			bufferevent_openssl_set_allow_dirty_shutdown(pr->bev, 1);
	} else {
		pr->bev = bufferevent_socket_new(pr->peers->base, fd, BEV_OPT_CLOSE_ON_FREE);
	}
	if (!pr->bev)
		return -ENOMEM;
	bufferevent_setcb(pr->bev, peer_on_read, NULL, peer_on_event, pr);
	return 0;
}

/*
 * Whether dials to @host:@port may use link @pr. A link this daemon dialled matches what it
 * dialled. An accepted one only matches when TLS verified a certificate that names @host (as a
 * dial to @host would check) and the port is the one its listener has, as it claims: an
 * accepted link authenticated by the shared key alone could be any key holder, so each daemon
 * dials its own.
 */
static bool peer_serves(struct tpd_peer *pr, const char *key, const char *host, uint16_t port)
{
	if (pr->state == PEER_FAILED)
		return false;
	if (pr->outgoing)
		return strcasecmp(pr->key, key) == 0;
	return pr->cert_verified && pr->claimed_port == port && pr->ssl &&
	       tpd_peertls_names_host(pr->ssl, host);
}

int tpd_peer_get(struct tpd_daemon *d, const char *host, uint16_t port, struct tpd_peer **ret,
		 char *why, size_t wl)
{
	struct tpd_peers *ps = tpd_daemon_peers(d);
	struct tpd_peer *pr;
	char key[300];

	snprintf(key, sizeof(key), strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, port);
	tpu_list_for_each(pr, &ps->links, node)
		if (peer_serves(pr, key, host, port)) {
			*ret = pr;
			return 0;
		}
	if (tpd_daemon_stopping(d)) {
		snprintf(why, wl, "daemon stopping");
		return -ESHUTDOWN;
	}
	if (!ps->tls && !ps->cfg->peer_insecure) {
		snprintf(why, wl, "this daemon has no peer authentication configured (peer-key-file, "
				  "or peer-cert with peer-cert-key and peer-ca): it cannot reach "
				  "other hosts");
		return -EACCES;
	}
	if (!tpd_peerlisten_admit_dial(ps, why, wl))
		return -ENOBUFS;
	pr = tpd_peer_new(ps, true, key);
	if (!pr) {
		snprintf(why, wl, "out of memory");
		return -ENOMEM;
	}
	snprintf(pr->dial_host, sizeof(pr->dial_host), "%s", host);
	tpd_peer_log(pr, TPU_LOG_INFO, "dialling");
	tpd_peerdial_start(pr, host, port);
	*ret = pr;
	return 0;
}
