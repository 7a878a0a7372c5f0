/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpb_rdma: the RDMA channels of peer links, RDMA writes between the daemons of two hosts
 * straight from and into registered memory, on the ibverbs layer of backends/verbs: rdma for
 * shared buffers on both sides (plain host memory), cuda_gdr when GPU memory is on either side
 * (through dma-buf or peer memory). A context per daemon opens every usable RDMA port once (a
 * protection domain and a completion queue) on first use. On a link whose two daemons both
 * offer rdma, or both cuda_gdr, in their Hello, each side announces its ports and their rails
 * (the network each is on), then sends one RC queue-pair record per pair of ports on the same
 * rail (every pair if none shares one, or the peer sent no rails) (struct tpb_rdma_setup, which
 * the daemon carries as PeerRdma); once every pair is connected the link is ready. A transfer
 * uses a port that has a queue pair to the other side's. A write the device fails turns RDMA
 * off on the link; after rebuild_ms (doubling each time, at most a minute) the side that saw the
 * failure frees its queue pairs and announces its ports again, the peer follows, and the link
 * is ready again, up to rebuild_max times in a row without a write completing.
 * A receive then registers the
 * reader's allocation on the port nearest its GPU (host memory: round-robin) and offers it
 * (struct tpb_rdma_offer, carried in the PeerReadReq); the sender registers its sources on the
 * port nearest theirs, waits for the clients' CUDA events, posts the writes on the queue pair
 * between those two ports, and completes once every write has (the daemon then says
 * PeerXferEnd{rdma}). Registrations are cached: a shared buffer's range (in whole 2 MiB steps of
 * the buffer) or a whole CUDA allocation stays registered for later transfers until its client
 * releases it or ends, or, for shared buffers, the cache is over its byte budget (rdma-cache,
 * least recently used regions first; 0 registers every transfer anew).
 *
 * It knows nothing of the daemon, its event loop or the wire: the daemon gives it a
 * configuration (limits, the cache budget, the links' callbacks: the send of a set-up message,
 * a link's name; or they come with the first endpoint, tpb_peer.link_ops), watches
 * tpb_rdma_event_fd() and calls tpb_rdma_progress(), which runs every callback here,
 * on the loop thread; nothing here is thread safe. Without rdma-core in the build, or without
 * a port at run time, nothing here is ever ready and transfers use the data connections.
 */
#ifndef TPB_RDMA_H
#define TPB_RDMA_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "tpb.h"

struct tpb_rdma;
struct tpb_rdma_link;
struct tpb_rdma_recv;
struct tpb_buffer; /* a shared buffer (backends/base/buffer.h) */

/* Bytes of one queue-pair connection record, and of one port's rail (the verbs layer's). */
#define TPB_RDMA_QP_RECORD_BYTES 32
#define TPB_RDMA_RAIL_BYTES 16

/* One source or destination range of a transfer. */
struct tpb_rdma_seg {
	struct tpb_mem mem; /* TPB_LOC_LOCAL or TPB_LOC_CUDA: the only kinds one can register */
	uint64_t len;
	/* TPB_LOC_LOCAL in a client's shared buffer: that buffer (borrowed; whoever builds the
	 * transfer holds a reference until it ends), so a cached region can hold it; else NULL */
	struct tpb_buffer *buf;
};

/* One queue-pair connection record (TPB_RDMA_QP_RECORD_BYTES when well formed). */
struct tpb_rdma_record {
	const uint8_t *data;
	size_t len;
};

/* One RDMA set-up step between the daemons of a link (PeerRdma on the wire). */
struct tpb_rdma_setup {
	uint32_t ports;			    /* this side's RDMA ports (first step), else 0 */
	size_t n_rails;			    /* with @ports: 0, or one per port */
	const struct tpb_rdma_record *rails; /* @n_rails of TPB_RDMA_RAIL_BYTES, borrowed */
	size_t n_qps;			    /* queue-pair records (second step), else 0 */
	const struct tpb_rdma_record *qps; /* @n_qps records, borrowed */
	const char *error; /* this side gives up RDMA on the link (NULL or "": not) */
};

/*
 * struct tpb_rdma_link_ops - how a link's RDMA state reaches the daemon's link (the peer part),
 * the opaque @link given to tpb_rdma_link_new(). Both run on the loop thread and borrow their
 * arguments.
 */
struct tpb_rdma_link_ops {
	/* Queue @m on @link's control connection (copied; a failed link drops it).
	 * Return: 0 or -errno. */
	int (*send)(void *link, const struct tpb_rdma_setup *m);
	/* "HOST:PORT" of @link, for messages. Return: borrowed, valid while @link lives. */
	const char *(*name)(const void *link);
};

struct tpb_rdma_config {
	bool disabled;	      /* --no-rdma / [backends] rdma = no */
	uint64_t cache_bytes; /* rdma-cache: shared-buffer bytes kept registered (0: none) */
	uint32_t ports_max;   /* ports a daemon may announce (the wire's bound) */
	/* RoCE and queue-pair settings; 0 takes the default in brackets */
	uint8_t traffic_class; /* GRH traffic class, 0..255 [0] */
	uint8_t sl;	       /* service level, 0..15 [0] */
	uint8_t timeout;       /* local ACK timeout 4.096 us * 2^timeout, 1..31 [14, ~67 ms] */
	uint8_t retry;	       /* retries before a write fails, 1..7 [7] */
	bool gid_index_set;    /* every port uses GID table entry @gid_index; else the first RoCE
				* v2 IPv4-mapped entry, else the best RoCE one (InfiniBand: 0) */
	uint32_t gid_index;
	uint32_t rebuild_ms;  /* first wait before a link that lost RDMA rebuilds it [1000] */
	uint32_t rebuild_max; /* rebuilds in a row without a write completing; then the link
			       * stays off (0: never rebuild) */
	const struct tpb_rdma_link_ops *link_ops; /* static, or alive until tpb_rdma_ctx_free() */
};

/*
 * tpb_rdma_ctx_new() - the daemon's RDMA context: finds the RDMA ports the registry found
 * viable (none is fine: rdma and cuda_gdr are then never used). Opens no device yet.
 * Copies @cfg; borrows the tables it points to until tpb_rdma_ctx_free().
 * @ret: returns owned context, free with tpb_rdma_ctx_free().
 * Return: 0, or -errno (-ENOMEM, or from epoll/timerfd).
 */
int tpb_rdma_ctx_new(const struct tpb_rdma_config *cfg, struct tpb_rdma **ret);

/* Closes the ports. Every link and receive must be freed first. Takes @g; accepts NULL. */
void tpb_rdma_ctx_free(struct tpb_rdma *g);

/*
 * The same context through the channel op table (tpb.h): rdma's ctx_new (tpb_ctx_new() with
 * tpb_config.rdma set) makes it, and tpb_ctx_free(), tpb_event_fd(), tpb_progress() and
 * tpb_forget() reach it; cuda_gdr is served by it too (one set of ports for both): its own
 * op-table row (backends/cuda_gdr) names the same endpoint entries, on a second head of this
 * context, so a link has an endpoint for each channel over one set of queue pairs.
 * tpb_rdma_of() - the context behind @ctx (borrowed, valid until tpb_ctx_free()), or NULL if
 * @ctx (may be NULL) is not rdma's. tpb_rdma_ctx() - @g's op-table head (borrowed, likewise).
 */
struct tpb_rdma *tpb_rdma_of(struct tpb_ctx *ctx);
struct tpb_ctx *tpb_rdma_ctx(struct tpb_rdma *g);
/* tpb_rdma_gdr_ctx() - @g's second head, cuda_gdr's (its ops: tpb_cuda_gdr_ops, the same
 * endpoint entries; tpb_rdma_of() knows it too): tpb_ep_open() on it gives a link's cuda_gdr
 * endpoint. Borrowed, valid until tpb_ctx_free() of rdma's head; NULL for a NULL @g. */
struct tpb_ctx *tpb_rdma_gdr_ctx(struct tpb_rdma *g);

/* rdma-cache changed (SIGHUP): the new budget applies from the next release on. */
void tpb_rdma_set_cache(struct tpb_rdma *g, uint64_t cache_bytes);

/*
 * tpb_rdma_event_fd() - the fd that turns readable while tpb_rdma_progress() has work (write
 * completions, a CUDA event to poll, a completion decided outside a call). Borrows @g.
 * Return: the fd (borrowed, valid until tpb_rdma_ctx_free(); never close it), or -EOPNOTSUPP
 * (built without RDMA).
 */
int tpb_rdma_event_fd(struct tpb_rdma *g);

/* Runs what is ready: write completions, CUDA event polls, and the callbacks they decide
 * (ready, done). Never blocks. Return: 0, or -EOPNOTSUPP (built without RDMA). */
int tpb_rdma_progress(struct tpb_rdma *g);

/* What a daemon offers its peers: rdma with an RDMA port, cuda_gdr with a CUDA driver too. */
enum tpb_rdma_offer_bits {
	TPB_RDMA_HOST = 1u << 0, /* "rdma" in PeerHello.backends */
	TPB_RDMA_CUDA = 1u << 1, /* "cuda_gdr" */
};

/* The TPB_RDMA_* this daemon offers (0: none). Accepts NULL. */
unsigned tpb_rdma_offers(const struct tpb_rdma *g);

/* The registration cache, for tpipctl status and the metrics. */
struct tpb_rdma_cache_stats {
	uint64_t regions;   /* cached now */
	uint64_t bytes;	    /* registered (pinned) by them */
	uint64_t hits;	    /* segments that found a cached region */
	uint64_t misses;    /* segments that registered memory */
	uint64_t evictions; /* regions dropped for the budget or to make room */
	uint64_t reg_dmabuf; /* CUDA regions registered from a dma-buf (ibv_reg_dmabuf_mr) */
	uint64_t reg_addr;   /* CUDA regions registered by device address (ibv_reg_mr, peermem) */
	uint64_t reg_client_dmabuf; /* CUDA regions registered from their client's dma-buf */
	uint64_t dmabufs;	    /* client-exported dma-bufs held now (tpb_rdma_dmabuf_add()) */
	uint64_t dmabufs_refused;   /* refused by tpb_rdma_dmabuf_add() */
	uint64_t dmabufs_evicted;   /* dropped as their client's least recent beyond the bound */
};

/* Fills @ret (zeros without RDMA). Accepts a NULL @g. */
void tpb_rdma_cache_stats(const struct tpb_rdma *g, struct tpb_rdma_cache_stats *ret);

/*
 * tpb_rdma_dmabuf_add() - client process @owner hands over @fd, a dma-buf it exported of its
 * whole CUDA allocation @handle (TPB_CUDA_HANDLE_BYTES), said to hold @size bytes from the
 * allocation's first byte. Nothing of the claim is trusted: @fd must be a dma-buf for the verbs
 * provider (tpv_dmabuf_size()) of at least @size bytes, @size whole pages. Kept until
 * tpb_rdma_dmabuf_drop() of the same handle, tpb_rdma_dmabuf_drop_owner(), another one for the
 * same handle, or @owner holding @max (the least recently handed over goes first); the fd is
 * closed once that happened and no registration made from it remains (backends/rdma/reg.c
 * registers @owner's segments of that allocation from it, and any other way when that fails).
 * @charge: two counters the caller raised for the fd (the daemon's kept fds per uid and in
 * all), or NULLs; each is lowered by one when the fd is closed, or at once on failure.
 * Takes @fd and @charge (also on failure); borrows @handle; takes a reference on @owner.
 * Accepts a NULL @g.
 * Return: 0; -EOPNOTSUPP (no RDMA port or no CUDA here, no @owner), -EINVAL (not a dma-buf,
 * smaller than claimed), -ENOBUFS (@max is 0), -ENOMEM; the reason in @why.
 */
int tpb_rdma_dmabuf_add(struct tpb_rdma *g, struct tpb_proc *owner, const uint8_t *handle,
			uint64_t size, int fd, atomic_uint *charge[2], unsigned max, char *why,
			size_t why_len);
/* Drops @owner's dma-buf of @handle (the client released the allocation). Borrows both.
 * Accepts a NULL @g. Return: 1 dropped, 0 there was none. */
int tpb_rdma_dmabuf_drop(struct tpb_rdma *g, const struct tpb_proc *owner, const uint8_t *handle);
/* Drops every dma-buf of @owner (its session ends). Borrows @owner. Accepts NULLs. */
void tpb_rdma_dmabuf_drop_owner(struct tpb_rdma *g, const struct tpb_proc *owner);

/*
 * tpb_rdma_forget_buffer() - shared buffer @b leaves its session (released, or the client
 * ended): its cached regions go, now or when the transfers using them end. Call before dropping
 * the session's reference. Borrows @b. Accepts a NULL @g.
 */
void tpb_rdma_forget_buffer(struct tpb_rdma *g, struct tpb_buffer *b);

/* A client released CUDA memory or ended: cached regions of CUDA allocations that nothing but
 * the cache references any more go. Accepts a NULL @g. */
void tpb_rdma_forget_cuda(struct tpb_rdma *g);

/*
 * tpb_rdma_forget_mem() - the op table's forget: cached regions of a shared buffer holding any
 * of [@m->addr, @m->addr + @len) (TPB_LOC_LOCAL), or of the CUDA allocation @m->cuda
 * (TPB_LOC_CUDA), go now or when the transfers using them end. Borrows @m. Accepts a NULL @g.
 * Return: 0.
 */
int tpb_rdma_forget_mem(struct tpb_rdma *g, const struct tpb_mem *m, uint64_t len);

/*
 * tpb_rdma_link_new() - start the RDMA set-up of the daemon's @link with a peer that offered
 * @peer_offers (TPB_RDMA_*): sends the first set-up step (ports). Both sides decide alike,
 * from what both offer. Borrows @g and @link until tpb_rdma_link_free().
 * Return: the link state (owned, free with tpb_rdma_link_free()), or NULL if the two daemons
 * offer nothing in common or memory ran out.
 */
struct tpb_rdma_link *tpb_rdma_link_new(struct tpb_rdma *g, void *link, unsigned peer_offers);

/*
 * tpb_rdma_link_free() - close the link's queue pairs. Sends still running complete, before this
 * returns, with -ECONNRESET ("peer link closed"). Takes @l; accepts NULL.
 */
void tpb_rdma_link_free(struct tpb_rdma_link *l);

/* Handles the peer's set-up step @m (its PeerRdma: set-up steps, or the peer giving up).
 * Borrows @m for the call. Accepts a NULL @l. */
void tpb_rdma_link_on_msg(struct tpb_rdma_link *l, const struct tpb_rdma_setup *m);

/* True once every queue pair of the link is connected. Accepts NULL. */
bool tpb_rdma_link_ready(const struct tpb_rdma_link *l);

/* "ready: 1x1 queue pairs", "off: <why>", "connecting", for tpipctl peers; "" for NULL.
 * Return: borrowed, valid until the link changes state. */
const char *tpb_rdma_link_state(const struct tpb_rdma_link *l);

/* Bytes this daemon RDMA-wrote to the peer, and that the peer said it RDMA-wrote here (counted
 * with tpb_rdma_link_received(), which the endpoint's receives call when the sender's word
 * says every byte arrived). Accepts NULL (zeros). */
void tpb_rdma_link_bytes(const struct tpb_rdma_link *l, uint64_t *sent, uint64_t *received);
void tpb_rdma_link_received(struct tpb_rdma_link *l, uint64_t bytes);

/* Where the writer's daemon may RDMA-write one segment (PeerRdmaRegion on the wire). */
struct tpb_rdma_region {
	uint64_t addr; /* remote address (IOVA) */
	uint32_t rkey;
	uint64_t length; /* the segment's */
	bool cuda;	 /* GPU memory: the transfer counts as cuda_gdr */
};

/* A receive's offer (the rdma_port and rdma fields of the PeerReadReq). */
struct tpb_rdma_offer {
	uint32_t port; /* the reader's port, an index into the ports it announced */
	size_t n;      /* one region per segment; 0: no offer */
	const struct tpb_rdma_region *regions;
};

/* Called once the receive's offer can be sent (@err 0), or never will (@err < 0, @why). */
typedef void (*tpb_rdma_ready_fn)(void *arg, int err, const char *why);

/*
 * tpb_rdma_recv_new() - register the destination @segs of a receive over @l for RDMA writes and
 * wait, off the call, for the reader's CUDA events (its stream's earlier work on that memory);
 * then @ready runs (never inside this call, from tpb_rdma_progress()). CUDA memory whose mapping
 * is not open yet is opened on the CUDA layer's worker (cuIpcOpenMemHandle can block for long)
 * and registered once it is, off the call too; a failure then reaches @ready. With CUDA memory on
 * either side (among @segs, or, @src_cuda, among the writer's tensors) RDMA applies if both
 * daemons offer cuda_gdr; with host memory only, if both offer rdma. The writer's daemon may
 * still decline the offer (a source in private memory): the bytes then come over the data
 * connections.
 * Ownership: borrows @segs and @l until tpb_rdma_recv_free(); returns owned @ret.
 * Return: 0; -EOPNOTSUPP when RDMA does not apply (link not ready, a kind of memory the two
 * daemons do not both offer, memory of a client's private address space) or registration failed
 * (reason in @why), here or later through @ready: use the stripe.
 */
int tpb_rdma_recv_new(struct tpb_rdma_link *l, const struct tpb_rdma_seg *segs, size_t n,
		      bool src_cuda, tpb_rdma_ready_fn ready, void *arg, struct tpb_rdma_recv **ret,
		      char *why, size_t why_len);

/* The offer of @rv into @ret (the caller's; its regions are borrowed from @rv, valid until
 * tpb_rdma_recv_free()). */
void tpb_rdma_recv_offer(const struct tpb_rdma_recv *rv, struct tpb_rdma_offer *ret);

/*
 * tpb_rdma_channel() - the channel an RDMA transfer counts under: "cuda_gdr" if CUDA memory is
 * on this side (@local_cuda), among the regions @offer offers (sender; NULL on the receiver),
 * or (@remote_cuda) among the writer's tensors (receiver); else "rdma". Borrows @offer.
 * Return: a static string.
 */
const char *tpb_rdma_channel(bool local_cuda, const struct tpb_rdma_offer *offer,
			     bool remote_cuda);

/* Deregisters the destination and stops waiting. Takes @rv; accepts NULL. */
void tpb_rdma_recv_free(struct tpb_rdma_recv *rv);

/*
 * tpb_rdma_recv_flush() - the writer's daemon says its writes into @rv's destination completed:
 * make those that went into GPU memory visible to the reader's GPU work before the reader is
 * told (tpb_cuda_rdma_flush() per CUDA segment: nothing where the device orders RDMA writes,
 * else a flush or a read-back). Blocks for the flush. Borrows @rv; accepts NULL.
 * Return: 0, or -errno (reason in @why): the receive failed.
 */
int tpb_rdma_recv_flush(struct tpb_rdma_recv *rv, char *why, size_t why_len);

/*
 * tpb_rdma_recv_end() - the receive into @rv ended (the writer's daemon wrote, or never will):
 * its registration goes now, and its CUDA mappings go idle on the CUDA layer's worker (closed
 * there unless a session holds them), which the reader must not be told the end before.
 * Borrows @rv; accepts NULL. Return: owned request to poll (tpb_cuda_idle_done()) and drop
 * (tpb_cuda_idle_put()), or NULL (nothing to wait for).
 */
struct tpb_cuda_idle *tpb_rdma_recv_end(struct tpb_rdma_recv *rv);

/* An offer as bytes (tpb_op.offer for tpb_start()): u32 port, u32 n, then per region u64 addr,
 * u64 length, u32 rkey, u32 flags (bit 0: cuda); little endian. */
#define TPB_RDMA_OFFER_HDR 8u
#define TPB_RDMA_OFFER_REGION 24u

/* Bytes of the encoded offer of @n regions. */
size_t tpb_rdma_offer_size(size_t n);

/*
 * tpb_rdma_offer_encode() - @of into @buf (@len bytes). Borrows both.
 * Return: the bytes written, or -ENOBUFS (@buf too small).
 */
int tpb_rdma_offer_encode(const struct tpb_rdma_offer *of, void *buf, size_t len);

/*
 * tpb_rdma_offer_decode() - the offer encoded in @buf (@len bytes) into @ret. Borrows @buf
 * and @why. @ret_regions: returns owned array (@ret->regions points into it), free with free();
 * both written only on success.
 * Return: 0; -EOPNOTSUPP (no offer: @buf NULL or short of a header), -EPROTO (@len does not
 * match the count of regions), -ENOMEM; the reason in @why.
 */
int tpb_rdma_offer_decode(const void *buf, size_t len, struct tpb_rdma_region **ret_regions,
			  struct tpb_rdma_offer *ret, char *why, size_t wl);

/*
 * The link's endpoint in the op table (tpb.h): tpb_start() on it RDMA-writes @op's sources
 * (xfers[i].src, TPB_LOC_LOCAL with its buf, or TPB_LOC_CUDA; len) into the regions of the
 * encoded offer in @op->offer (tpb_rdma_offer_encode()), as tpb_rdma_send() does, and completes
 * from tpb_progress() (or, -ECONNRESET, inside tpb_rdma_link_free()); tpb_cancel() stops it as
 * tpb_rdma_send_cancel() does. A failed start leaves the reason in @op->why (-EOPNOTSUPP: not
 * over RDMA, use the stripe; -EPROTO: an offer that does not match). tpb_ep_open() on the
 * context with the daemon's link as @peer->link returns the same endpoint; the link owns it
 * (tpb_ep_close() does nothing). On the reading side, tpb_prepare() on it registers @op's
 * destinations (xfers[i].dst, as tpb_rdma_recv_new() takes them; the writer's kind from
 * xfers[i].src.remote) and returns -EINPROGRESS (or -EOPNOTSUPP, reason in @op->why: use the
 * stripe); its completion, once the reader's CUDA events fired, carries the encoded offer;
 * tpb_release() deregisters (tpb_rdma_recv_free()), also after the link is gone.
 * Return: borrowed, valid until tpb_rdma_link_free(@l); NULL for a NULL @l.
 */
struct tpb_ep *tpb_rdma_link_ep(struct tpb_rdma_link *l);

/*
 * The op table's endpoint entries (rdma.c puts them in tpb_rdma_ops); callers use the tpb_*()
 * wrappers, whose contracts these follow, as above, and:
 * - ep_open: @peer->link with a link made already returns its endpoint (tpb_rdma_link_new()'s
 *   caller keeps owning that link); else, with @peer->link_ops (struct tpb_rdma_link_ops: the
 *   links of one context share them, so a context configured without link_ops takes the
 *   first endpoint's; others are -EINVAL) and rdma or cuda_gdr among @peer->offers, makes the
 *   link and sends its first set-up step (tpb_rdma_link_new()): the link is then the
 *   endpoint's, freed (tpb_rdma_link_free()) by the last tpb_ep_close() of it; -EOPNOTSUPP
 *   for a NULL @peer, or nothing in common.
 * - start with no offer and every source TPB_LOC_REMOTE: a receive. It only waits for the
 *   sender's word, tpb_recv_expect() (the bytes land by the sender's RDMA writes into what
 *   tpb_prepare() registered): status 0 with every byte of its xfers counts them as received
 *   (tpb_ep_query()), 0 with any other count is -EPROTO; tpb_cancel() ends it with
 *   -ECANCELED; the link's end with -ECONNRESET, inside tpb_rdma_link_free().
 * - start and prepare set @op->channel: cuda_gdr's index with CUDA memory on either side (see
 *   tpb_rdma_channel()), else rdma's.
 * - ep_query: ready (tpb_rdma_link_ready()), state (tpb_rdma_link_state()), bytes each way
 *   (tpb_rdma_link_bytes()); ep_msg: @msg is a struct tpb_rdma_setup (tpb_rdma_link_on_msg()).
 * - offer_max: tpb_rdma_offer_size(@n_xfers).
 */
int tpb_rdma_ep_open(struct tpb_ctx *ctx, const struct tpb_peer *peer, struct tpb_ep **ret);
void tpb_rdma_ep_close(struct tpb_ep *ep);
int tpb_rdma_ep_start(struct tpb_ep *ep, struct tpb_op *op);
int tpb_rdma_ep_cancel(struct tpb_ep *ep, struct tpb_op *op);
int tpb_rdma_ep_prepare(struct tpb_ep *ep, struct tpb_op *op, void *offer, size_t *offer_len);
void tpb_rdma_op_release(struct tpb_op *op);
int tpb_rdma_ep_recv_expect(struct tpb_ep *ep, struct tpb_op *op, uint64_t bytes, int status,
			    const char *why);
int tpb_rdma_ep_query(struct tpb_ep *ep, struct tpb_ep_info *ret);
int tpb_rdma_ep_msg(struct tpb_ep *ep, const void *msg);
size_t tpb_rdma_offer_max(size_t n_xfers);

struct tpb_rdma_xfer;

/* Runs once per started send, from tpb_rdma_progress() or tpb_rdma_link_free(). */
typedef void (*tpb_rdma_done_fn)(struct tpb_rdma_xfer *x);

/* One send: the caller's, kept from tpb_rdma_send() until @done has run. */
struct tpb_rdma_xfer {
	/* Set by the caller; borrowed until @done. */
	const struct tpb_rdma_seg *segs;
	size_t n_segs;
	tpb_rdma_done_fn done;
	void *arg;
	/* Results, valid in @done. */
	int status;	/* 0, or -errno (-ECANCELED, -ECONNRESET, -EIO, ...) */
	char why[160];	/* reason when @status < 0 */
	uint64_t bytes; /* written, on success */
	uint64_t total; /* the bytes of @segs */
	uint64_t ns;	/* time from start to done */
	/* The channel's. */
	uint64_t start_ns;
};

/*
 * tpb_rdma_send() - RDMA-write the sources @x->segs into the regions @offer offers. Registers
 * the sources at once, or, for CUDA sources whose mappings are not open yet, once the CUDA
 * layer's worker opened them (cuIpcOpenMemHandle can block for long: never on the loop); waits
 * for the writer's CUDA events, then posts the writes; @x->done runs once every write completed
 * or one failed (@x->bytes is the total on success, else 0). A registration that fails after
 * this call returned completes @x with -EOPNOTSUPP, nothing written: the caller may send over
 * the stripe, as on a -EOPNOTSUPP return.
 * Ownership: keeps @x until @x->done; copies what it needs of @offer.
 * Return: 0; -EOPNOTSUPP (no offer, link not ready, a source in private memory, registration
 * failed; reason in @why) or -EPROTO (an offer that does not match the message): no @done, the
 * caller sends over the stripe or fails the transfer.
 */
int tpb_rdma_send(struct tpb_rdma_link *l, struct tpb_rdma_xfer *x,
		  const struct tpb_rdma_offer *offer, char *why, size_t why_len);

/* Stops @x: writes not posted yet never are; @done runs with -ECANCELED once none is pending.
 * Borrows @l and @x. */
void tpb_rdma_send_cancel(struct tpb_rdma_link *l, struct tpb_rdma_xfer *x);

#endif
