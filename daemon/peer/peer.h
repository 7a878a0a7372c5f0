/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_peer: one link to another host's daemon. A link is one control connection (PeerMsg frames
 * through a bufferevent) plus N data connections handed to a tpb_stripe. This module dials and
 * accepts links (the TCP peer listener), runs TLS 1.3 on every connection (peertls.c) and the
 * Hello handshake inside it, attaches data connections bound to their link's TLS session, sends
 * keepalives and declares a silent peer dead, and dispatches the pipe messages it receives
 * through the pipe ops the broker registered (struct tpd_peer_pipe_ops). A failed link fails
 * every pipe over it and is gone; the next connect to that host dials a new one. The module is
 * peers.c (the part's start, stop and tpipctl snapshot), peer.c (a link's lifetime, control
 * connection), peermsg.c (what its frames mean), peerhs.c (handshake), peerdial.c (dial) and
 * peerlisten.c (listener), sharing the private peer_int.h.
 */
#ifndef TPD_PEER_H
#define TPD_PEER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>
#include "tpu.h"
#include "tpw.pb-c.h"

struct tpd_daemon;
struct tpd_peer;
struct tpd_peers;
struct tpd_pipe;
struct tpb_stripe;
struct tpb_ep;
struct tpb_rdma_link_ops;

/*
 * tpd_peers_new() - the peer part of daemon @d, with no link and no listener yet; the daemon
 * keeps it and returns it from tpd_daemon_peers(). Call it once the daemon's event loop exists.
 * Borrows @d (kept: it outlives the part).
 * @ret: returns owned part, free with tpd_peers_free().
 * Return: 0 or -ENOMEM.
 */
int tpd_peers_new(struct tpd_daemon *d, struct tpd_peers **ret);

/*
 * tpd_peers_free() - stop @ps as tpd_peers_stop() does if that has not happened, then free the
 * resolver and @ps itself, once the loop has stopped and every other event of the daemon is
 * freed (it runs what a canceled resolution left queued on the loop). Only from outside the
 * loop. Takes @ps; accepts NULL.
 */
void tpd_peers_free(struct tpd_peers *ps);

/*
 * tpd_peers_start() - load the key file, read the host identity, bind the peer listener (unless
 * "off"). An explicitly configured address that cannot be bound is an error; the default one
 * only logs a warning.
 * Return: 0 or -errno (logged).
 */
int tpd_peers_start(struct tpd_daemon *d);

/* Fails every link with STATUS_SHUTDOWN and frees them, closes the listener. The resolver
 * stays until tpd_peers_free(). Does nothing before tpd_peers_new(), and nothing the second
 * time. Borrows @d. */
void tpd_peers_stop(struct tpd_daemon *d);

/*
 * tpd_peer_get() - the link to @host:@port: an existing one that is not failing, or a new one
 * being dialled.
 * @ret: returns borrowed link, valid until its pipes are told it failed.
 * Return: 0 or -errno (-EMFILE, -ENOMEM, ...), with @why filled.
 */
int tpd_peer_get(struct tpd_daemon *d, const char *host, uint16_t port, struct tpd_peer **ret,
		 char *why, size_t why_len);

/* True if the far daemon of @pr knows PeerConnect.wait_ms (peer protocol 2.1 and later). */
bool tpd_peer_connect_wait_ok(const struct tpd_peer *pr);

/* True once the link is up (handshake done, data connections attached). */
bool tpd_peer_is_up(const struct tpd_peer *pr);

/* True once the link failed: its pipes are about to be told why, from the loop. */
bool tpd_peer_is_failed(const struct tpd_peer *pr);

/* "HOST:PORT" of the link, for messages. */
const char *tpd_peer_name(const struct tpd_peer *pr);

/* Room for tpd_peer_principal(), its terminating NUL included. */
#define TPD_PEER_PRINCIPAL_LEN 208

/* What tpd_peer_log_ok() allows: lines of a peer in each window, lines of all peers together. */
#define TPD_PEER_LOG_WINDOW_MS 10000
#define TPD_PEER_LOG_BURST 20
#define TPD_PEER_LOG_ALL_BURST 100

/*
 * tpd_peer_log_ok() - may a line about what the far daemon of @pr sent (a refusal, a request
 * for nothing) be logged now? A peer sends such things as fast as its links carry them, so
 * each peer (tpd_peer_principal(): every link of one peer shares it) has its own budget
 * (TPD_PEER_LOG_BURST lines in each TPD_PEER_LOG_WINDOW_MS) and all peers together a larger
 * one (TPD_PEER_LOG_ALL_BURST): one peer's flood neither fills the log nor hides another
 * peer's lines. Budgets are kept for the TPD_RATELOG_KEYS peers logged most recently; the
 * shared one still bounds the log where more peers flood. @pr may be NULL (a source of its
 * own).
 * @ret_suppressed: @pr's lines refused since its last logged one (written when true).
 * Return: true to log.
 */
bool tpd_peer_log_ok(struct tpd_peer *pr, unsigned *ret_suppressed);

/*
 * tpd_peer_identity() - who the far daemon of @pr proved to be in the TLS handshake, as shown by
 * tpipctl: "psk:tpipd" (it holds the pre-shared key) or "cert:CN=...,DNS:..." (a certificate of
 * the cluster CA). The only thing a listener's remote access is decided on, never a uid the far
 * daemon claims. Return: borrowed string valid as long as @pr, or NULL for an unauthenticated
 * (--peer-insecure) link.
 */
const char *tpd_peer_identity(const struct tpd_peer *pr);

/*
 * tpd_peer_principal() - the far daemon of @pr, for the limits that are per peer
 * (chan-peer-ops-max, chan-peer-bytes-max, group-peer-groups-max, the staging of its
 * broadcasts): its verified certificate identity where a certificate of peer-ca proved it
 * ("cert:CN=...", distinct per peer), else the address its link came from or was dialled at,
 * without the port ("addr:10.0.0.7": every holder of the pre-shared key proves the same
 * identity, and an insecure link none). Every link of one peer has the same one, so opening
 * more links (peer-links-per-source allows several per address) multiplies no limit; it is a
 * name, never a pointer, so a later, unrelated link never takes over what an earlier one was
 * charged. Return: borrowed string valid as long as @pr (set once its TLS handshake is done).
 */
const char *tpd_peer_principal(const struct tpd_peer *pr);

/*
 * tpd_peer_sending() - a send over @pr's data connections starts (@on true) or ended (false).
 * While one runs, the link fails once its data connections have sent no chunk for
 * peer-timeout: a peer daemon that answers pings but stops reading its data connections would
 * otherwise hold the send, the writer's memory and its WriteDone and PipeClosed for ever (a
 * chunk being written cannot be taken back). Borrows @pr; each start is ended exactly once.
 */
void tpd_peer_sending(struct tpd_peer *pr, bool on);

/* Whether links @a and @b are of the same peer (tpd_peer_principal()); NULL is no peer's. */
bool tpd_peer_same(const struct tpd_peer *a, const struct tpd_peer *b);

/* Room for tpd_peer_account(): an identity, '@' and an address. */
#define TPD_PEER_ACCOUNT_LEN 460

/*
 * tpd_peer_account() - whom this daemon charges for the channels and queues the far daemon of
 * @pr creates here (chan-remote-create-per-peer) and the channel items its writes hold here
 * (chan-remote-bytes-per-peer): its verified
 * certificate identity alone where a certificate proved it; else (the pre-shared key, the same
 * identity for every holder) "IDENTITY@ADDRESS", its tpd_peer_identity() and the far address
 * of its link's control connection as the kernel reports it (getpeername(), without the port;
 * IPv4-mapped addresses as IPv4): never the host name its PeerHello states, which a key holder chooses freely (each
 * name it stated used to get it another share). Daemons behind one address (NAT) share one
 * account. It stays the same across the far daemon's reconnects and restarts from that
 * address, so what it created before still counts.
 * @buf: TPD_PEER_ACCOUNT_LEN bytes. Return: @buf, or NULL for an unauthenticated link.
 */
const char *tpd_peer_account(const struct tpd_peer *pr, char *buf);

/*
 * tpd_peer_identity_matches() - does @entry, one of a listener's remote peers, name the far
 * daemon of @pr? "psk" (or "psk:tpipd") names any link that proved the pre-shared key;
 * "cert:NAME" a link whose verified certificate names host NAME (a subjectAltName DNS name or IP
 * address, as a dial checks it); the full identity shown by tpipctl names that identity. An
 * unauthenticated link matches nothing. @pr is a const void * so that it fits
 * tpd_remote_match_fn (listener.h). Borrows both.
 */
bool tpd_peer_identity_matches(const char *entry, const void *pr);

/*
 * tpd_peer_dial_text() - while @pr is being dialled, each address tried so far and why it
 * failed, then the one being tried ("ADDR: no answer"); "" for a link past its connect or one
 * that was accepted.
 * Borrows @pr; writes at most @len bytes into @buf.
 * Return: @buf.
 */
char *tpd_peer_dial_text(const struct tpd_peer *pr, char *buf, size_t len);

/* The link's data connections. */
struct tpb_stripe *tpd_peer_stripe(struct tpd_peer *pr);

/*
 * tpd_peer_ep() - the link's endpoint of registry channel @channel (tpb.h op table): mpt's over
 * its data connections from the start, those of the RDMA channels (rdma, cuda_gdr) once the
 * link is up where both daemons offer them. Borrows @pr.
 * Return: borrowed, valid until the link is torn down; NULL for a channel without one on this
 * link, an index out of range, or once the link is being torn down.
 */
struct tpb_ep *tpd_peer_ep(struct tpd_peer *pr, int channel);

/*
 * struct tpd_peer_offer - a reader's offer as the writer's daemon keeps it: the bytes the
 * channel's tpb_start() takes (opaque to the broker) and, per segment, the kind of memory the
 * reader offered (TPB_LOC_LOCAL or TPB_LOC_CUDA).
 */
struct tpd_peer_offer {
	uint8_t *bytes;
	size_t len;
	int *kinds; /* enum tpb_loc */
	size_t n;   /* segments offered; 0: no offer */
};

/*
 * tpd_peer_rdma_offer_in() - the RDMA offer of the reader's @rr (its rdma_port and rdma fields)
 * as a struct tpd_peer_offer (@ret: the caller's, filled only on success: n 0 when @rr offers
 * nothing; release with tpd_peer_rdma_offer_done()). Borrows @rr.
 * Return: 0 or -ENOMEM.
 */
int tpd_peer_rdma_offer_in(const Tpw__V1__PeerReadReq *rr, struct tpd_peer_offer *ret);
/* Frees what @o holds and zeroes it; accepts a zeroed one. Borrows @o. */
void tpd_peer_rdma_offer_done(struct tpd_peer_offer *o);

/*
 * tpd_peer_rdma_offer_out() - the offer bytes @offer (@len), as a tpb_prepare() on the link's
 * RDMA endpoint wrote them, into @rr's rdma_port and rdma fields. Borrows @offer and @rr;
 * @ret_store: returns owned memory @rr's fields point into, free with free() once @rr is sent.
 * Return: 0, or -errno (-EPROTO: not an offer of the form; -ENOMEM) with the reason in @why.
 */
int tpd_peer_rdma_offer_out(const void *offer, size_t len, Tpw__V1__PeerReadReq *rr,
			    void **ret_store, char *why, size_t wl);

/*
 * struct tpd_peer_pipe_ops - what the part above (the broker's cross-host pipes) does with a
 * link's pipe messages and link events; the peer part calls up only through it. Every op runs
 * on the loop thread and borrows its arguments; @p is a pipe added with tpd_peer_pipe_add().
 */
struct tpd_peer_pipe_ops {
	/* @p's local id (the key of the link's pipe table) and the far end's (0: not known yet). */
	uint64_t (*id)(const struct tpd_pipe *p);
	uint64_t (*remote_id)(const struct tpd_pipe *p);
	/* The link of @p is up, or failed with @err (@why: the link's last error). */
	void (*link_up)(struct tpd_pipe *p);
	void (*link_failed)(struct tpd_pipe *p, int err, const char *why);
	/* The link @pr goes away: forget the far daemon's connects waiting for a listener. */
	void (*waits_drop)(struct tpd_daemon *d, struct tpd_peer *pr);
	/* PeerPipeClose with connect_pending: the far daemon gave up its waiting connect. */
	void (*wait_cancel)(struct tpd_daemon *d, struct tpd_peer *pr, uint64_t pipe_id);
	/* PeerMsg bodies for pipes; @p is NULL in connect_reply if the pipe already ended here. */
	void (*connect)(struct tpd_daemon *d, struct tpd_peer *pr, const Tpw__V1__PeerConnect *c);
	void (*connect_reply)(struct tpd_peer *pr, struct tpd_pipe *p,
			      const Tpw__V1__PeerConnectReply *r);
	void (*descriptor)(struct tpd_pipe *p, const Tpw__V1__Descriptor *dd, const uint8_t *tail,
			   uint32_t tail_len);
	void (*read_req)(struct tpd_pipe *p, const Tpw__V1__PeerReadReq *rr);
	void (*consumed)(struct tpd_pipe *p, const Tpw__V1__PeerConsumed *c);
	void (*close)(struct tpd_pipe *p, Tpw__V1__Status st, const char *why);
	/* The sender of receive @arg (from tpd_peer_xfer_add()) stopped sending. */
	void (*xfer_end)(struct tpd_peer *pr, void *arg, const Tpw__V1__PeerXferEnd *xe);
	/* PeerBcast: @pipes[i] is the pipe of this link that target i names, NULL if none (the
	 * broker refuses the request then). */
	void (*bcast)(struct tpd_peer *pr, const Tpw__V1__PeerBcast *b, struct tpd_pipe **pipes);
};

/*
 * tpd_peer_set_pipe_ops() - register the pipe ops of this process's daemon, before
 * tpd_peers_start(). Keeps @ops (static storage) for the life of the process.
 */
void tpd_peer_set_pipe_ops(const struct tpd_peer_pipe_ops *ops);

/*
 * struct tpd_peer_group_ops - what the group part (daemon/group/groupx.c) does with a link's
 * group messages (PeerGroupJoin, PeerGroupJoined, PeerGroupGone, validated) and link events.
 * Every op runs on the loop thread and borrows its arguments; link_failed runs while @pr is
 * torn down (its last error in @why), after which @pr is gone.
 */
struct tpd_peer_group_ops {
	void (*msg)(struct tpd_daemon *d, struct tpd_peer *pr, const Tpw__V1__PeerMsg *m);
	void (*link_up)(struct tpd_daemon *d, struct tpd_peer *pr);
	void (*link_failed)(struct tpd_daemon *d, struct tpd_peer *pr, int err, const char *why);
};

/* tpd_peer_group_set_ops() - register the group ops (static storage, kept for the life of the
 * process), before tpd_peers_start(). Until then group messages are refused (the link fails). */
void tpd_peer_group_set_ops(const struct tpd_peer_group_ops *ops);

/*
 * struct tpd_peer_chan_ops - what the channel part (daemon/chan/chanx.c) does with a link's
 * channel and queue messages (PeerChanOp, PeerChanReply, PeerWqOp, PeerWqReply, validated; @tail
 * their data tail, valid during the call) and link events. Every op runs on the loop thread and
 * borrows its arguments; link_failed runs while @pr is torn down (its last error in @why), after
 * which @pr is gone.
 */
struct tpd_peer_chan_ops {
	void (*msg)(struct tpd_daemon *d, struct tpd_peer *pr, const Tpw__V1__PeerMsg *m,
		    const uint8_t *tail, uint32_t tail_len);
	void (*link_up)(struct tpd_daemon *d, struct tpd_peer *pr);
	void (*link_failed)(struct tpd_daemon *d, struct tpd_peer *pr, int err, const char *why);
};

/* tpd_peer_chan_set_ops() - register the channel ops (static storage, kept for the life of the
 * process), before tpd_peers_start(). Until then channel messages are refused (the link
 * fails). */
void tpd_peer_chan_set_ops(const struct tpd_peer_chan_ops *ops);

/* True if the far daemon of @pr (up) knows channel and queue messages (peer protocol 2.3 and
 * later): none is sent to one that does not, as it would fail the whole link. */
bool tpd_peer_chan_supported(const struct tpd_peer *pr);

/* The far daemon's peer protocol minor version (its Hello), for messages. */
unsigned tpd_peer_chan_far_minor(const struct tpd_peer *pr);

/* What a frame holds besides its data tail, at most, as the daemon's inline-max is kept below
 * its frame-max. */
#define TPD_PEER_FRAME_SLACK 65536u

/* The largest data tail (a work queue payload) a message to the far daemon of @pr (up) may
 * carry: its frame-max (PeerHello.frame_max, peer minor >= 8; TPW_DEFAULT_FRAME_MAX assumed for
 * an older daemon) less TPD_PEER_FRAME_SLACK. A larger frame would fail the whole link there. */
uint32_t tpd_peer_chan_tail_max(const struct tpd_peer *pr);

/* The largest frame (message plus data tail, without the header) the far daemon of @pr accepts:
 * its PeerHello.frame_max, or TPW_DEFAULT_FRAME_MAX for a daemon that states none (older than
 * peer minor 8) or before its Hello. */
uint32_t tpd_peer_chan_frame_max(const struct tpd_peer *pr);

/* The far daemon's instance (random per daemon start, from its Hello): the host identity groups
 * use (daemons in two network namespaces of one machine are two hosts). 0 before the Hello. */
uint64_t tpd_peer_group_far_instance(const struct tpd_peer *pr);

/* This daemon's own instance (what its Hello says); 0 before tpd_peers_start(). Borrows @d. */
uint64_t tpd_peer_group_instance(const struct tpd_daemon *d);

/* The far daemon's host name as its Hello says (display only). Borrowed, valid as @pr. */
const char *tpd_peer_group_host(const struct tpd_peer *pr);

/* True if the link's far daemon proved an identity (TLS with the key or a certificate). */
bool tpd_peer_group_authenticated(const struct tpd_peer *pr);

/* Whether the far daemon of @pr speaks peer minor TPW_PEER_MINOR_GROUP_REMOTE or later: it
 * carries and enforces a group's remote access (PeerGroupJoin.remote). Borrows @pr. */
bool tpd_peer_group_remote_ok(const struct tpd_peer *pr);

/*
 * tpd_peer_group_far_addr() - the address at which the far daemon's peer listener can be dialled
 * from here, "HOST:PORT" ("[IPV6]:PORT"): the address dialled for a link this daemon opened; the
 * link's remote IP and the listener port its Hello claims for one it accepted. Writes "" when the
 * far daemon has no listener. Borrows @pr and @buf. Return: @buf.
 */
char *tpd_peer_group_far_addr(const struct tpd_peer *pr, char *buf, size_t len);

/*
 * tpd_peer_pipe_add() - @p (whose local id is the ops' id(p)) now runs over @pr: pipe messages
 * for it are dispatched through the registered struct tpd_peer_pipe_ops, whose link_up and
 * link_failed tell it about the link.
 * Return: 0 or -ENOMEM.
 */
int tpd_peer_pipe_add(struct tpd_peer *pr, struct tpd_pipe *p);
/* @p no longer uses @pr. Accepts a pipe that is not on the link. */
void tpd_peer_pipe_remove(struct tpd_peer *pr, struct tpd_pipe *p);

/*
 * tpd_peer_send() - queue PeerMsg @m and @n_tail data pieces on the control connection.
 * @m, @tail: borrowed; copied. Sending over a failed link is a no-op. A frame above what the far
 * daemon accepts (tpd_peer_chan_frame_max()), which would fail the whole link there, is not sent:
 * -EMSGSIZE, and one log line. Callers that forward what a client sent check the size first and
 * refuse that client's op (chanx.c). A frame that would take the bytes waiting for the control
 * connection above peer-queue-bytes (a peer that does not read) fails the link: -ENOBUFS.
 * Return: 0 or -errno.
 */
int tpd_peer_send(struct tpd_peer *pr, Tpw__V1__PeerMsg *m, const struct iovec *tail, int n_tail);

/* tpd_peers_flush() - write the control frames every link queued during this loop pass, each
 * link's in one go. The daemon's loop calls it at the end of every pass. */
void tpd_peers_flush(struct tpd_daemon *d);

/* A new transfer id for a receive on @pr, registered to @arg until tpd_peer_xfer_drop(). */
uint64_t tpd_peer_xfer_add(struct tpd_peer *pr, void *arg);
void tpd_peer_xfer_drop(struct tpd_peer *pr, uint64_t xfer_id);

/* Fills the CtlPeer list for tpipctl; @ret is an array of calloc'ed entries. Frees with
 * tpd_peers_ctl_free(). */
int tpd_peers_ctl(struct tpd_daemon *d, Tpw__V1__CtlPeer ***ret, size_t *n);
void tpd_peers_ctl_free(Tpw__V1__CtlPeer **v, size_t n);

/*
 * tpd_peers_auth() - how this daemon's peer links authenticate, for tpipctl status: "tls: psk",
 * "tls: certificates", "tls: psk, certificates" (each with ", data plaintext" when
 * peer-data-encryption = no), "insecure", or "none" (no listener, no dialling).
 * Return: a static string.
 */
const char *tpd_peers_auth(const struct tpd_daemon *d);

/*
 * What tpipctl status, the metrics page and tests read of the peer part of @d (borrowed); before
 * tpd_peers_new() they read as a part with no link and no listener. Strings are borrowed from
 * the part, valid until tpd_peers_free().
 */
/* Links, in any state (tpipctl status "peers"). */
unsigned tpd_peers_count(const struct tpd_daemon *d);
/* Accepted connections whose first frame is not read yet; data connections being dialled in
 * *@ret_dials. */
unsigned tpd_peers_pending(const struct tpd_daemon *d, unsigned *ret_dials);
/* The bound peer listener address ("IP:PORT", "[IPV6]:PORT"), "" when there is none. */
const char *tpd_peers_listen_addr(const struct tpd_daemon *d);
/* The bound peer listener port, 0 when there is none. */
uint16_t tpd_peers_port(const struct tpd_daemon *d);
/* This host's name, as PeerHello tells it. */
const char *tpd_peers_hostname(const struct tpd_daemon *d);
/* This host's boot id in hex (tpipctl status "host id"): daemons with the same one share a host. */
const char *tpd_peers_host_id(const struct tpd_daemon *d);

/* What a link's RDMA state (backends/rdma) calls up into (peerrdma.c): every link hands it to
 * the RDMA endpoints it opens (tpb_peer.link_ops); its @link is the struct tpd_peer. */
extern const struct tpb_rdma_link_ops tpd_peer_rdma_ops;

#endif
