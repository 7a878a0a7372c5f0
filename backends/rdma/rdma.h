/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpb_rdma: the RDMA channels of peer links, RDMA writes between the daemons of two hosts straight
 * from and into registered memory, on the ibverbs layer of backends/verbs: rdma for shared
 * buffers on both sides (plain host memory), cuda_gdr when GPU memory is on either side (through
 * dma-buf or peer memory). Each daemon opens every usable RDMA port once (a protection domain and
 * a completion queue whose channel fd is on the event loop). On a link whose two daemons both
 * offer rdma, or both cuda_gdr, in their Hello, each side announces its ports (PeerRdma.ports),
 * then sends one RC queue-pair record per pair of ports (PeerRdma.qps); once every pair is
 * connected the link is ready. A receive then registers the reader's allocation on the port
 * nearest its GPU (host memory: round-robin) and offers it in the PeerReadReq; the sender
 * registers its sources on the port nearest theirs, waits for the clients' CUDA events, posts the
 * writes on the queue pair between those two ports, and says PeerXferEnd{rdma} once every write
 * has completed. Registrations are cached: a shared buffer's range (in whole 2 MiB steps of the
 * buffer) or a whole CUDA allocation stays registered for later transfers until its client
 * releases it or ends, or, for shared buffers, the cache is over its byte budget (rdma-cache,
 * least recently used regions first; 0 registers every transfer anew). Everything runs on the loop thread. Without rdma-core in the build, or without
 * a port at run time, nothing here is ever ready and transfers use the data connections.
 */
#ifndef TPB_RDMA_H
#define TPB_RDMA_H

#include <stdbool.h>
#include <stddef.h>
#include "tpw.pb-c.h"

struct tpd_daemon;
struct tpd_peer;
struct tpd_stripe_seg;
struct tpd_stripe_xfer;
struct tpb_rdma;
struct tpb_rdma_link;
struct tpb_rdma_recv;
struct tpd_buffer;

/*
 * tpb_rdma_start() - find the RDMA ports (none is fine: rdma and cuda_gdr are then never used).
 * Opens no device yet. Return: 0, or -ENOMEM.
 */
int tpb_rdma_start(struct tpd_daemon *d);

/* Closes the ports. Every link and receive must be freed first. */
void tpb_rdma_stop(struct tpd_daemon *d);

/* What a daemon offers its peers: rdma with an RDMA port, cuda_gdr with a CUDA driver too. */
enum tpb_rdma_offer_bits {
	TPB_RDMA_HOST = 1u << 0, /* "rdma" in PeerHello.backends */
	TPB_RDMA_CUDA = 1u << 1, /* "cuda_gdr" */
};

/* The TPB_RDMA_* this daemon offers (0: none). */
unsigned tpb_rdma_offers(const struct tpd_daemon *d);

/* The registration cache, for tpipctl status and the metrics. */
struct tpb_rdma_cache_stats {
	uint64_t regions;   /* cached now */
	uint64_t bytes;	    /* registered (pinned) by them */
	uint64_t hits;	    /* segments that found a cached region */
	uint64_t misses;    /* segments that registered memory */
	uint64_t evictions; /* regions dropped for the budget or to make room */
};

/* Fills @ret (zeros without RDMA). */
void tpb_rdma_cache_stats(const struct tpd_daemon *d, struct tpb_rdma_cache_stats *ret);

/*
 * tpb_rdma_forget_buffer() - shared buffer @b leaves its session (released, or the client ended):
 * its cached regions go, now or when the transfers using them end. Call before dropping the
 * session's reference. Accepts a daemon without RDMA.
 */
void tpb_rdma_forget_buffer(struct tpd_daemon *d, struct tpd_buffer *b);

/* A client released CUDA memory or ended: cached regions of CUDA allocations that nothing but
 * the cache references any more go. Accepts a daemon without RDMA. */
void tpb_rdma_forget_cuda(struct tpd_daemon *d);

/*
 * struct tpb_rdma_link_ops - how a link's RDMA state reaches the link above it (the peer part);
 * this part calls the peer part only through it. Both run on the loop thread and borrow their
 * arguments.
 */
struct tpb_rdma_link_ops {
	/* Queue @m on @pr's control connection (copied; a failed link drops it). Return: 0 or
	 * -errno. */
	int (*send)(struct tpd_peer *pr, Tpw__V1__PeerMsg *m);
	/* "HOST:PORT" of @pr, for messages. Return: borrowed, valid while @pr lives. */
	const char *(*name)(const struct tpd_peer *pr);
};

/*
 * tpb_rdma_set_link_ops() - register the link ops of this process's daemon, before the first
 * tpb_rdma_link_new(). Keeps @ops (static storage) for the life of the process.
 */
void tpb_rdma_set_link_ops(const struct tpb_rdma_link_ops *ops);

/*
 * tpb_rdma_link_new() - start the RDMA set-up of link @pr with a peer that offered @peer_offers
 * (TPB_RDMA_*): sends PeerRdma{ports}. Both sides decide alike, from what both offer.
 * Return: the link state (owned, free with tpb_rdma_link_free()), or NULL if the two daemons
 * offer nothing in common or memory ran out.
 */
struct tpb_rdma_link *tpb_rdma_link_new(struct tpd_daemon *d, struct tpd_peer *pr,
				      unsigned peer_offers);

/*
 * tpb_rdma_link_free() - close the link's queue pairs. Sends still running complete, before this
 * returns, with -ECONNRESET ("peer link closed"). Accepts NULL.
 */
void tpb_rdma_link_free(struct tpb_rdma_link *l);

/* Handles the peer's PeerRdma message (set-up steps, or the peer giving up). */
void tpb_rdma_link_on_msg(struct tpb_rdma_link *l, const Tpw__V1__PeerRdma *m);

/* True once every queue pair of the link is connected. Accepts NULL. */
bool tpb_rdma_link_ready(const struct tpb_rdma_link *l);

/* "ready: 1x1 queue pairs", "off: <why>", "connecting", for tpipctl peers; "" for NULL. */
const char *tpb_rdma_link_state(const struct tpb_rdma_link *l);

/* Bytes this daemon RDMA-wrote to the peer, and that the peer said it RDMA-wrote here (counted
 * with tpb_rdma_link_received()). Accepts NULL (zeros). */
void tpb_rdma_link_bytes(const struct tpb_rdma_link *l, uint64_t *sent, uint64_t *received);
void tpb_rdma_link_received(struct tpb_rdma_link *l, uint64_t bytes);

/* Called once the receive's offer can be sent (@err 0), or never will (@err < 0, @why). */
typedef void (*tpb_rdma_ready_fn)(void *arg, int err, const char *why);

/*
 * tpb_rdma_recv_new() - register the destination @segs of a receive over @l for RDMA writes and
 * wait, off the call, for the reader's CUDA events (its stream's earlier work on that memory);
 * then @ready runs (never inside this call). With CUDA memory on either side (among @segs, or,
 * @src_cuda, among the writer's tensors) RDMA applies if both daemons offer cuda_gdr; with host
 * memory only, if both offer rdma. The writer's daemon may still decline the offer (a source in
 * private memory): the bytes then come over the data connections.
 * Ownership: borrows @segs and @l until tpb_rdma_recv_free(); returns owned @ret.
 * Return: 0; -EOPNOTSUPP when RDMA does not apply (link not ready, a kind of memory the two
 * daemons do not both offer, memory of a client's private address space) or registration failed
 * (reason in @why): use the stripe.
 */
int tpb_rdma_recv_new(struct tpb_rdma_link *l, const struct tpd_stripe_seg *segs, size_t n,
		     bool src_cuda, tpb_rdma_ready_fn ready, void *arg, struct tpb_rdma_recv **ret,
		     char *why, size_t why_len);

/* Adds the offer of @rv to @rr (pointers into @rv: send @rr before freeing @rv). */
void tpb_rdma_recv_offer(struct tpb_rdma_recv *rv, Tpw__V1__PeerReadReq *rr);

/*
 * tpb_rdma_channel() - the channel an RDMA transfer counts under: "cuda_gdr" if CUDA memory is
 * among @segs, among the regions @rr offers (sender; NULL on the receiver), or (@remote_cuda)
 * among the writer's tensors (receiver); else "rdma".
 */
const char *tpb_rdma_channel(const struct tpd_stripe_seg *segs, size_t n,
			    const Tpw__V1__PeerReadReq *rr, bool remote_cuda);

/* Deregisters the destination and stops waiting. Accepts NULL. */
void tpb_rdma_recv_free(struct tpb_rdma_recv *rv);

/*
 * tpb_rdma_send() - RDMA-write the sources @x->segs into the regions @rr offers. Registers the
 * sources at once; waits for the writer's CUDA events, then posts the writes; @x->done runs once
 * every write completed or one failed (@x->bytes is the total on success, else 0).
 * Ownership: keeps @x until @x->done; copies what it needs of @rr.
 * Return: 0; -EOPNOTSUPP (no offer, link not ready, a source in private memory, registration
 * failed; reason in @why) or -EPROTO (an offer that does not match the message): no @done, the
 * caller sends over the stripe or fails the transfer.
 */
int tpb_rdma_send(struct tpb_rdma_link *l, struct tpd_stripe_xfer *x,
		 const Tpw__V1__PeerReadReq *rr, char *why, size_t why_len);

/* Stops @x: writes not posted yet never are; @done runs with -ECANCELED once none is pending. */
void tpb_rdma_send_cancel(struct tpb_rdma_link *l, struct tpd_stripe_xfer *x);

#endif
