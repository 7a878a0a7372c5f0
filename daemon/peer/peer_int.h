/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Private to the peer link files (peers.c, peer.c, peerdial.c, peerhs.c, peerlisten.c,
 * peermsg.c); not installed and included nowhere else. Holds what they share: the part's state
 * (struct tpd_peers), the link object, the accepted connection whose first frame is not read
 * yet, the data connection being dialled, and the functions one of these files calls in
 * another. The rest of the daemon uses peer.h only.
 */
#ifndef TPD_PEER_INT_H
#define TPD_PEER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <event2/util.h>
#include <sys/socket.h>
#include "frame.h"
#include "hmap.h"
#include "peer.h"
#include "peerauth.h"
#include "quota.h"
#include "stripe.h"
#include "tpb.h"
#include "tpu.h"
#include "tpw.pb-c.h"

#define FIRST_FRAME_MAX 4096

/* PEER_TLS: the dialler's TLS handshake on the control connection (the answerer's runs before
 * the link exists, in peerlisten.c). */
enum peer_state { PEER_CONNECTING, PEER_TLS, PEER_HANDSHAKE, PEER_DATA, PEER_UP, PEER_FAILED };

struct ssl_st;

struct evdns_getaddrinfo_request;
struct tpd_peertls;

/*
 * struct tpd_peers - the peer part of one daemon (tpd_peers_new()): its links, the connections
 * being accepted or dialled, the listener, this host's identity and how links authenticate. It
 * reads the daemon's settings through the daemon's accessors only (daemon.h): @cfg, @base and
 * @limits are what tpd_daemon_cfg(), _base() and _limits() returned, valid as long as the daemon.
 */
struct tpd_peers {
	struct tpd_daemon *d; /* the owner: its accessors, the pipe ops' and cuda_gdr's handle */
	const struct tpd_config *cfg;	 /* tpd_daemon_cfg(d): changes in place on SIGHUP */
	struct event_base *base;	 /* tpd_daemon_base(d) */
	const struct tpw_limits *limits; /* tpd_daemon_limits(d): every frame is checked on them */
	struct tpu_list links;		 /* struct tpd_peer */
	struct tpu_list flushq; /* links with control frames to send at the end of the pass */
	unsigned n_links;
	uint64_t next_id;
	struct tpu_list conns;	    /* accepted, first frame not read yet */
	struct tpu_list data_dials; /* data connections being dialled */
	int listen_fd;
	struct event *ev_accept;
	struct event *ev_accept_resume; /* accepts paused (EMFILE); freed by tpd_peers_free() */
	struct tpd_ratelog accept_log;
	struct tpd_ratelog_keys refusal_log; /* refused connections, by source (peerlisten.c) */
	struct tpd_ratelog_keys limit_log[3]; /* connections over a limit, by source, by kind */
	struct tpd_ratelog_keys peer_log; /* tpd_peer_log_ok(): by principal */
	char listen_addr[80]; /* bound address, "" when off */
	uint16_t port_bound;
	char hostname[256];
	uint8_t boot_id[16];
	char boot_id_hex[33];
	uint64_t instance;
	struct tpd_peer_key key;
	bool keyed;
	struct tpd_peertls *tls; /* NULL: no authentication configured, or --peer-insecure */
	struct evdns_base *dns;	 /* created on first dial */
};

struct tpd_peer {
	struct tpu_list node;	 /* in peers->links */
	struct tpd_peers *peers; /* the part it belongs to */
	uint64_t id;
	enum peer_state state;
	bool outgoing;
	bool authenticated; /* TLS verified the peer (PSK or certificate) */
	bool cert_verified; /* ... by a certificate chaining to peer-ca */
	bool hello_seen;
	bool ready_seen;    /* dialler: PeerReady with data_up came, data connections may lag */
	bool last_words; /* tpd_peerhs_send_hello/_send_ready: send at once (refusal) */
	char key[300];	 /* "HOST:PORT": as dialled, or the remote address of an accepted link */
	char dial_host[256]; /* dialler: the host as dialled (its certificate must name it) */
	char host[256];	 /* the peer's host name (its claim, for display) */
	char identity[200]; /* TLS-verified identity, tpd_peertls_identity() */
	char principal[TPD_PEER_PRINCIPAL_LEN]; /* tpd_peer_principal() */
	/* The far end's address as the kernel reports it for the control connection, without
	 * the port (set at the TLS handshake; "" before): what tpd_peer_account() charges a
	 * pre-shared key holder under, since the host name its hello states is its choice. */
	char src[64];
	uint16_t claimed_port; /* answerer: the peer's listener port, as it claims */
	struct ssl_st *ssl;    /* the control connection's TLS (owned by @bev), NULL insecure */
	uint8_t link_key[32];  /* exported from @ssl: what data connections prove */
	const char *data_prot; /* "kTLS", "OpenSSL", "plaintext" once data connections attach */
	struct bufferevent *bev;
	struct evbuffer *pend;	   /* up: frames queued in this loop pass (tpd_peers_flush()) */
	struct tpu_list flush_node; /* in peers->flushq while @pend has bytes */
	bool flush_queued;
	struct event *ev_timer;
	struct event *ev_close;
	struct tpb_stripe *stripe;
	struct event *ev_stripe; /* the stripe's event fd: its completions run from the loop */
	/* What every endpoint borrows: this link, its stripe, the callbacks of the RDMA set-up
	 * (tpd_peer_rdma_ops) and @offers. */
	struct tpb_peer tpeer;
	/* One endpoint per cross-host channel, by registry index (tpd_peer_ep()); all NULL once
	 * the link is being torn down. */
	struct tpb_ep *eps[TPB_CHANNELS_MAX];
	const char *offers[TPB_CHANNELS_MAX]; /* channels of the peer's Hello known here */
	uint64_t link_id;
	unsigned data_expected, data_attached;
	bool data_seen[TPB_STRIPE_CONNS_MAX];
	struct tpu_hmap pipes; /* local pipe id -> struct tpd_pipe */
	struct tpu_hmap xfers; /* receive xfer id -> opaque (xh.c) */
	uint64_t next_xfer_id;
	uint64_t seq_out;
	uint64_t created_ns, up_ns, last_rx_ns, rtt_us;
	/* Sends over the data connections running (tpd_peer_sending()), the stripe's bytes sent
	 * when last seen moving, and since when. */
	unsigned sends;
	uint64_t tx_mark, tx_since_ns;
	uint64_t ctl_in, ctl_out;
	int fail_err;
	char last_error[200];
	uint32_t peer_minor;	    /* the peer protocol minor version of its Hello */
	uint32_t far_frame_max;	    /* the largest frame the far daemon accepts (its Hello) */
	uint64_t far_instance;	    /* the far daemon's instance, from its Hello (groups' host id) */
	/* Dialling (peerdial.c), while PEER_CONNECTING: */
	struct evdns_getaddrinfo_request *dns_req; /* resolving the host */
	struct evutil_addrinfo *addrs, *addr;	    /* what it resolved to; the one tried */
	uint64_t dial_deadline_ns;
	char dial_errs[200]; /* each address tried: why it failed */
};

/* An accepted connection whose first frame (inside TLS unless insecure) says what it is. */
struct peer_conn {
	struct tpu_list node; /* in peers->conns */
	struct tpd_peers *peers;
	int fd;
	struct ssl_st *ssl; /* NULL: insecure, plain TCP */
	bool sniffed;	    /* the first byte showed the expected protocol */
	bool tls_done;
	uint64_t deadline_ns; /* TLS handshake and first frame by then */
	struct event *ev;
	uint8_t buf[TPW_HDR_SIZE + FIRST_FRAME_MAX];
	size_t len, want;
	char addr[80];
};

/* A data connection of an outgoing link being dialled: TCP connect, TLS handshake, its
 * PeerDataHello out, the answerer's PeerDataHello back, then it joins the stripe. */
enum data_step { DATA_CONNECT, DATA_TLS, DATA_SEND, DATA_RECV };

struct data_dial {
	struct tpu_list node; /* in peers->data_dials */
	struct tpd_peers *peers;
	uint64_t peer_id;
	int fd;
	struct ssl_st *ssl;
	enum data_step step;
	unsigned index;
	struct event *ev;
	uint8_t buf[TPW_HDR_SIZE + 256];
	size_t len, want;
};

/* ---- peer.c -------------------------------------------------------------------------------- */

/* (Re)computes pr->principal (tpd_peer_principal()) from pr->key and, once TLS is up, the
 * verified certificate identity. Borrows @pr. */
void tpd_peer_principal_set(struct tpd_peer *pr);

/* The state of @pr as tpipctl and log lines name it. Borrows @pr. Return: a static string. */
const char *tpd_peer_state_name(const struct tpd_peer *pr);

/*
 * tpd_peer_sockaddr_text() - @sa as "IP" or, with @with_port, "IP:PORT" ("[IPV6]:PORT"); an
 * IPv4-mapped IPv6 address reads as IPv4, a link-local one with its zone ("fe80::1%eth0").
 * Borrows @sa; writes at most @len bytes into @buf.
 */
void tpd_peer_sockaddr_text(const struct sockaddr *sa, char *buf, size_t len, bool with_port);

/*
 * tpd_peer_log() - log "peer ID (HOST:PORT): MESSAGE" at @level with the link's TPIPD_PEER field,
 * if @level is enabled.
 * Borrows @pr.
 */
void tpd_peer_log(const struct tpd_peer *pr, int level, const char *fmt, ...) _printf_(3, 4);

/*
 * tpd_peer_send_now() - send @m on the control socket at once, bypassing the bufferevent, for
 * last words before a close; queues it as tpd_peer_send() does when other bytes are queued or it
 * is too large. Does nothing on a failed link.
 * Borrows @pr and @m (packed, not kept).
 */
void tpd_peer_send_now(struct tpd_peer *pr, Tpw__V1__PeerMsg *m);

/*
 * tpd_peer_teardown() - free @pr now: its stripe and cuda_gdr state, its pipes told the link
 * failed, its bufferevent and events; unlinks it from the daemon's list.
 * Takes @pr. Never call it from one of @pr's own callbacks: tpd_peer_fail() defers it.
 */
void tpd_peer_teardown(struct tpd_peer *pr);

/*
 * tpd_peer_fail() - mark @pr failed with @err and the reason @fmt, log it once, stop its I/O and
 * schedule its teardown on the loop. Does nothing if @pr already failed; safe in @pr's callbacks.
 * Borrows @pr, which stays valid until the loop runs the teardown.
 */
void tpd_peer_fail(struct tpd_peer *pr, int err, const char *fmt, ...) _printf_(3, 4);

/*
 * tpd_peer_new() - a new link in state connecting, with its timer, close event, stripe and nonce,
 * added to @ps's list of links.
 * Borrows @ps (kept in the link: it outlives every link) and @key (copied).
 * Return: the link, owned by @ps's list until tpd_peer_teardown() (directly or through
 * tpd_peer_fail()); NULL when its events, stripe or nonce cannot be made.
 */
struct tpd_peer *tpd_peer_new(struct tpd_peers *ps, bool outgoing, const char *key);

/* tpd_peer_timer_arm_ms() - (re)arm timer @ev to fire in @ms milliseconds. Borrows @ev. */
void tpd_peer_timer_arm_ms(struct event *ev, uint32_t ms);

/*
 * tpd_peer_bev_setup() - the control connection's bufferevent on @fd (-1: dialled later), with
 * the link's read and event callbacks; over @ssl (its handshake done) unless it is NULL.
 * Takes @fd and @ssl on success (closed and freed with the bufferevent); on failure both stay
 * the caller's.
 * Return: 0 or -ENOMEM.
 */
int tpd_peer_bev_setup(struct tpd_peer *pr, int fd, struct ssl_st *ssl);

/* ---- peerhs.c ------------------------------------------------------------------------------ */

/*
 * tpd_peerhs_send_hello() - send this daemon's PeerHello with status @st and @msg (NULL for
 * none). Queued, or sent at once when the link has its last words.
 * Borrows @pr and @msg.
 */
void tpd_peerhs_send_hello(struct tpd_peer *pr, Tpw__V1__Status st, const char *msg);

/*
 * tpd_peerhs_send_ready() - send PeerReady with the link id, status @st and @msg; @data_up says
 * that every data connection has attached. Queued, or sent at once for last words.
 * Borrows @pr and @msg.
 */
void tpd_peerhs_send_ready(struct tpd_peer *pr, Tpw__V1__Status st, const char *msg,
			   bool data_up);

/*
 * tpd_peerhs_link_up() - the link is up: log it, start keepalives, set up cuda_gdr when the peer
 * offered it, and tell every pipe over the link.
 * Borrows @pr.
 */
void tpd_peerhs_link_up(struct tpd_peer *pr);

/*
 * tpd_peerhs_dial_on_hello() - the dialling side got the answerer's PeerHello: check it (version,
 * same host, data encryption). Fails the link on any mismatch.
 * Borrows @pr and @h.
 */
void tpd_peerhs_dial_on_hello(struct tpd_peer *pr, const Tpw__V1__PeerHello *h);

/*
 * tpd_peerhs_answer_on_hello() - the answering side got the dialler's PeerHello (its first
 * frame, inside TLS): check it, then refuse the link or answer with a PeerHello and PeerReady.
 * The listener port the peer claims is kept for tpd_peer_get(), which trusts it only with a
 * certificate naming the host dialled.
 * Borrows @pr and @h.
 */
void tpd_peerhs_answer_on_hello(struct tpd_peer *pr, const Tpw__V1__PeerHello *h);

/*
 * tpd_peerhs_tls_up() - the control connection's TLS handshake finished: record the peer's
 * verified identity on @pr (and log it at debug). Borrows @pr and @ssl (kept in pr->ssl).
 */
void tpd_peerhs_tls_up(struct tpd_peer *pr, struct ssl_st *ssl);

/*
 * tpd_peerhs_data_io() - move bytes of a connection's first frames without blocking: read
 * (@write false) or write @buf[*@done..@want) on @fd, through @ssl unless it is NULL.
 * Return: 1 when all moved, 0 to wait (for writability when *@want_write), < 0 failed (@why).
 */
int tpd_peerhs_data_io(int fd, struct ssl_st *ssl, bool write, uint8_t *buf, size_t *done,
		       size_t want, bool *want_write, char *why, size_t why_len);

/*
 * tpd_peerhs_data_tls() - an SSL object for a data connection on @fd of a link of @ps: kTLS
 * allowed when tensor bytes are encrypted, never when they go plaintext after the handshake.
 * Borrows @ps and @host; @fd stays the caller's (the SSL object uses it, never closes it).
 * Return: owned SSL, free with SSL_free(); or NULL (out of memory).
 */
struct ssl_st *tpd_peerhs_data_tls(struct tpd_peers *ps, int fd, bool server, const char *host);

/*
 * tpd_peerhs_dial_on_ready() - the dialling side got PeerReady: a refusal fails the link; without
 * data_up, dial the data connections; with it, the link is up.
 * Borrows @pr and @r.
 */
void tpd_peerhs_dial_on_ready(struct tpd_peer *pr, const Tpw__V1__PeerReady *r);

/*
 * tpd_peerhs_data_dial_free() - close a data connection being dialled and unlink it from the
 * daemon's list.
 * Takes @dd.
 */
void tpd_peerhs_data_dial_free(struct data_dial *dd);

/* ---- peerdial.c ---------------------------------------------------------------------------- */

/*
 * tpd_peerdial_start() - resolve @host and connect @pr's control connection to @port on the
 * first of its addresses that accepts, trying them in turn, within --peer-connect-timeout (armed
 * here on pr->ev_timer). Failures end in tpd_peer_fail(), possibly before this returns.
 * Borrows @pr and @host.
 */
void tpd_peerdial_start(struct tpd_peer *pr, const char *host, uint16_t port);

/*
 * tpd_peerdial_error() - the connect to the address being tried failed with errno @err: try the
 * next one, or fail the link naming every address and why it failed.
 * Borrows @pr.
 */
void tpd_peerdial_error(struct tpd_peer *pr, int err);

/*
 * tpd_peerdial_timeout() - @pr's timer fired while connecting: give up on the address being
 * tried and go on to the next, or fail the link (also when the host has not resolved).
 * Borrows @pr.
 */
void tpd_peerdial_timeout(struct tpd_peer *pr);

/*
 * tpd_peerdial_connected() - the control connection is up: drop the addresses and leave the
 * handshake what is left of the connect timeout.
 * Borrows @pr.
 */
void tpd_peerdial_connected(struct tpd_peer *pr);

/*
 * tpd_peerdial_done() - cancel a pending resolution and drop the addresses (link teardown).
 * Borrows @pr.
 */
void tpd_peerdial_done(struct tpd_peer *pr);

/*
 * tpd_peer_dial_dns_free() - free the resolver (if a dial made one), once the loop has stopped and
 * every other event of the daemon is freed: it first runs what a canceled resolution left queued
 * on the loop, which libevent otherwise never frees. Only from outside the loop (tpd_peers_free()).
 * Borrows @ps.
 */
void tpd_peer_dial_dns_free(struct tpd_peers *ps);

/* ---- peerlisten.c -------------------------------------------------------------------------- */

/*
 * tpd_peerlisten_open() - bind and listen on @spec ("ADDR:PORT", "*:PORT", "[V6ADDR]:PORT"; "*"
 * falls back to IPv4 without IPv6), record the bound address and port in @ps, accept on the
 * loop. Borrows @spec; the socket and its accept event stay @ps's (closed by tpd_peers_stop()).
 * Return: 0; -EINVAL when @spec is not an address (logged); -errno of socket, bind or listen, or
 * -ENOMEM (not logged, the caller logs).
 */
int tpd_peerlisten_open(struct tpd_peers *ps, const char *spec);

/*
 * tpd_peerlisten_conn_free() - close an accepted connection whose first frame is not handled yet
 * and unlink it from its part's list.
 * Takes @c.
 */
void tpd_peerlisten_conn_free(struct peer_conn *c);

/*
 * tpd_peerlisten_admit_link() - may a connection from @addr ("HOST:PORT") become a link? Bounds
 * the links other daemons open here, in total and per source address (logged, rate-limited).
 * Call it before the handshake starts. Borrows @ps and @addr. Return: true if so.
 */
bool tpd_peerlisten_admit_link(struct tpd_peers *ps, const char *addr);

/*
 * tpd_peerlisten_admit_data() - may one more data connection (two threads) join a link? Bounds
 * the data connections of all links together (logged, rate-limited). Borrows @ps and @addr.
 * Return: true if so.
 */
bool tpd_peerlisten_admit_data(struct tpd_peers *ps, const char *addr);

/*
 * tpd_peerlisten_admit_dial() - may this daemon open one more link (a client asked for a new
 * tpip:// address)? Bounds the links it dials (--peer-links-max) and the data connections of
 * all its links, counting those a link will open (--peer-data-conns-max).
 * Borrows @ps; writes at most @wl bytes into @why.
 * Return: true if so; false with the reason in @why (logged, rate-limited).
 */
bool tpd_peerlisten_admit_dial(struct tpd_peers *ps, char *why, size_t wl);

/*
 * tpd_peermsg_dispatch() - handle validated PeerMsg @m of @pr's control connection (peermsg.c):
 * run its handler if @pr's state expects it, else fail @pr (a link still connecting, or failed,
 * ignores it). Borrows @m and @tail (the frame's data tail, @tail_len bytes) for the call.
 */
void tpd_peermsg_dispatch(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
			  uint32_t tail_len);

/* peergroup.c: @pr is up, or is being torn down; the group ops hear of it. Borrows @pr. */
void tpd_peer_group_link_up(struct tpd_peer *pr);
void tpd_peer_group_link_failed(struct tpd_peer *pr);

/* peergroup.c: a group message (validated) of an up link, to the group ops. Return: 0, or
 * -EPROTO when no group part registered (the link fails). */
int tpd_peer_group_on_msg(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m);

/* peerchan.c: @pr is up, or is being torn down; the channel ops hear of it. Borrows @pr. */
void tpd_peer_chan_link_up(struct tpd_peer *pr);
void tpd_peer_chan_link_failed(struct tpd_peer *pr);

/* peerchan.c: a channel or queue message (validated) of an up link and its data tail, to the
 * channel ops. Return: 0, or -EPROTO when no channel part registered (the link fails). */
int tpd_peer_chan_on_msg(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
			 uint32_t tail_len);

/* The registered pipe ops (tpd_peer_set_pipe_ops()). Return: borrowed, static. */
const struct tpd_peer_pipe_ops *tpd_peer_pipe_ops(void);

/* The peer's PeerRdma @m (validated), handed to @pr's RDMA state, if it has one, in its plain
 * form (peerrdma.c). Borrows @pr and @m for the call. */
void tpd_peer_rdma_on_msg(struct tpd_peer *pr, const Tpw__V1__PeerRdma *m);

#endif
