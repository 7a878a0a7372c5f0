/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpb: the backend layer. Every channel (a way to move tensor bytes) is one op table with
 * honest capability flags and a probe() that says whether it can run on this host, plus the
 * asynchronous ops (context, endpoint, prepare, start, cancel, forget, event fd, progress)
 * behind dispatch wrappers; a static, ordered registry lists them and one selection function
 * (tpb_select_pair()) picks the first viable channel, in [backends] priority order, for any
 * pair of memory references, on this host or between hosts. This header knows nothing about
 * sessions, pipes or the wire: the daemon describes each transfer as a source and a
 * destination memory reference.
 *
 * Same-host channels in this release:
 *   cma    process_vm_readv/writev into or out of a client's own address space
 *   shm    memcpy between memory the daemon has mapped (shared buffers, held inline data)
 *   basic  bytes carried through the control transport itself (eager descriptors); no copy op
 *   cuda_ipc  CUDA memory of a client (an IPC handle the daemon maps) to or from CUDA, a
 *          mapping or a client's address space, on the daemon's own streams
 * Between hosts:
 *   mpt    chunks striped over a peer link's data connections (backends/mpt/stripe.c); no copy
 *          op; the async table over the link's stripe (backends/mpt/mpt.c)
 *   rdma   RDMA writes between shared buffers on both hosts (backends/rdma/link.c); no copy op
 *   cuda_basic  CUDA memory staged chunk by chunk through host buffers of the stripe threads
 *          (tpb_cuda_basic_stage()), so it rides the mpt connections; no copy op
 *   cuda_gdr  RDMA writes straight from and into registered memory over ibverbs (GPUDirect),
 *          run by the daemon (backends/rdma/link.c); probed here (CUDA driver and an RDMA port);
 *          no copy op
 */
#ifndef TPB_H
#define TPB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "tpu.h"

enum tpb_caps {
	TPB_CAP_HOST_MEM = 1u << 0,    /* moves CPU memory */
	TPB_CAP_SAME_HOST = 1u << 1,   /* both ends on this host */
	TPB_CAP_SRC_LOCAL = 1u << 2,   /* reads memory mapped in the daemon */
	TPB_CAP_SRC_PROCESS = 1u << 3, /* reads a client's address space */
	TPB_CAP_DST_LOCAL = 1u << 4,   /* writes memory mapped in the daemon */
	TPB_CAP_DST_PROCESS = 1u << 5, /* writes a client's address space */
	TPB_CAP_INLINE = 1u << 6,      /* carried by the transport, no copy op */
	TPB_CAP_NEEDS_PROCESS = 1u << 7, /* only pairs where at least one side is a process */
	TPB_CAP_SRC_CUDA = 1u << 8,    /* reads CUDA device memory */
	TPB_CAP_DST_CUDA = 1u << 9,    /* writes CUDA device memory */
	TPB_CAP_NEEDS_CUDA = 1u << 10, /* only pairs where at least one side is CUDA memory */
	TPB_CAP_CROSS_HOST = 1u << 11, /* between hosts (over a peer link) */
};

enum tpb_loc {
	TPB_LOC_LOCAL = 0, /* @addr is a pointer in the daemon's address space */
	TPB_LOC_PROCESS,   /* @addr is an address in the pinned process @proc */
	TPB_LOC_CUDA,	   /* @addr is an offset inside the client allocation @cuda */
	TPB_LOC_REMOTE,	   /* memory on another host (over a peer link), of kind @remote */
};

struct tpb_cuda_map;
struct tpb_cuda_idle;
struct tpb_stripe;
struct tpb_proc;
struct tpb_buffer;

struct tpb_mem {
	enum tpb_loc loc;
	/* TPB_LOC_PROCESS (and the owner of TPB_LOC_CUDA memory, or NULL): the client process,
	 * borrowed; whoever builds the transfer holds a reference (tpb_proc_ref()) until it ends. */
	struct tpb_proc *proc;
	uint64_t addr;
	/* TPB_LOC_CUDA: borrowed; whoever builds the transfer holds a reference until it ends. */
	struct tpb_cuda_map *cuda;  /* the allocation */
	struct tpb_cuda_map *event; /* the client's event to wait for first, or NULL */
	/* TPB_LOC_REMOTE: the kind of memory on the other host as far as this side knows it
	 * (TPB_LOC_LOCAL: a shared buffer there, TPB_LOC_PROCESS: private memory, TPB_LOC_CUDA). */
	enum tpb_loc remote;
	/* TPB_LOC_LOCAL inside a client's shared buffer: that buffer (borrowed, as @proc), so that
	 * a channel that registers memory (rdma) can keep a registration with it; else NULL. */
	struct tpb_buffer *buf;
};

/* One contiguous copy. */
struct tpb_xfer {
	struct tpb_mem src;
	struct tpb_mem dst;
	uint64_t len;
};

/* Per-thread scratch space a copy may use (bounce buffer for process -> process). */
struct tpb_scratch {
	void *bounce;
	size_t bounce_len;
	void *cuda; /* the thread's CUDA streams and pinned buffers, made on first use */
	char why[160]; /* set by a copy that fails with more to say than its errno */
};

/* Releases what copies made in @s (CUDA streams, pinned memory); not @s->bounce. Borrows @s. */
void tpb_cuda_scratch_done(struct tpb_scratch *s);

struct tpb_rdma_config;

struct tpb_config {
	bool cma_disabled;    /* --no-cma / [backends] cma = no */
	bool shm_disabled;    /* [backends] shm = no */
	bool rdma_disabled;   /* --no-rdma / [backends] rdma = no: rdma and cuda_gdr */
	const char *priority; /* "name,name,...": these first, in this order; NULL: built-in */
	/* ctx_new of rdma (backends/rdma/rdma.h, serving cuda_gdr too): its settings, borrowed
	 * for the call (copied); NULL: rdma makes no context (-EOPNOTSUPP). */
	const struct tpb_rdma_config *rdma;
};

/* ---- the asynchronous channel op table ------------------------------------------------------
 *
 * Every channel, same host or not, is driven through one op table, in the spirit of UCX's uct
 * and rdma-core's provider ops:
 *
 *   probe                      is it viable on this host? (once, by the registry)
 *   ctx_new / ctx_free         the channel's context, one per daemon
 *   ep_open / ep_close         an endpoint per peer (NULL peer: this host)
 *   prepare / release          the receiving side registers its memory and builds an offer
 *                              (bytes the daemon carries to the other side), e.g. RDMA keys,
 *                              at once or (-EINPROGRESS) through a later completion; release
 *                              drops the registration once the transfer is over
 *   start                      starts a transfer; 0: its @done runs exactly once, later, on the
 *                              thread that calls progress (the loop), never inside start
 *   recv_expect                the receiving side learns how the sender's side ended (its
 *                              PeerXferEnd), so a started receive completes accordingly
 *   cancel                     asks a started transfer to stop; it completes with -ECANCELED
 *                              once the channel touches its memory no more
 *   forget                     drops what the context caches about memory (registrations)
 *   event_fd / progress        an fd that turns readable when completions wait, and the call
 *                              that runs them: the daemon polls the fd on its loop, so no
 *                              channel ever touches the event loop itself
 *
 * Callers use the tpb_*() dispatch wrappers below, never the table: a missing op is
 * -EOPNOTSUPP there. A same-host channel keeps its synchronous kernel (@copy) and gets the rest
 * from the shared adapter (TPB_SYNC_OPS, backends/base/sync.c), which runs the kernel on an
 * engine the daemon supplies (its copy threads) and completes through the context's event fd.
 */

struct tpb_channel_ops;
struct tpb_op;

/* Registry rows at most (a link keeps one endpoint per row: tpd_peer_ep()). */
#define TPB_CHANNELS_MAX 16

/* The head of every channel context: channels embed it first and dispatch through @ops. */
struct tpb_ctx {
	const struct tpb_channel_ops *ops;
	int idx; /* registry index when made (tpb_name()) */
};

/* The other side of an endpoint. Borrowed by ep_open() until ep_close(). */
struct tpb_peer {
	const char *name;		/* for messages: the link's address */
	const char *const *offers;	/* the peer's channel names (its PeerHello.backends) */
	size_t n_offers;
	void *link;			/* the daemon's link, opaque here */
	struct tpb_stripe *stripe;	/* mpt: the link's data connections (mpt/stripe.h) */
	/* The channel's calls up into @link (rdma: struct tpb_rdma_link_ops, to send its set-up
	 * steps and name the link), static; NULL: ep_open() only finds an endpoint made already. */
	const void *link_ops;
};

/* What an endpoint says about itself (tpb_ep_query()), for tpipctl peers and the daemon. */
struct tpb_ep_info {
	bool ready;	   /* transfers may start (e.g. rdma: every queue pair connected) */
	const char *state; /* "ready: 1x1 queue pairs", "connecting", "off: <why>", or "" */
	uint64_t sent;	   /* bytes this side moved to the peer over it, and the peer to us */
	uint64_t received;
	/* rdma, cuda_gdr: CUDA segments of transfers over it (either way) by how the region
	 * serving them was registered: the client's dma-buf, the daemon's export, by address */
	uint64_t reg_client_dmabuf, reg_dmabuf, reg_addr;
};

/* The head of every endpoint: channels embed it first. */
struct tpb_ep {
	struct tpb_ctx *ctx;
	const struct tpb_peer *peer; /* NULL: this host */
};

/*
 * The engine a same-host channel's kernel runs on: the daemon's copy threads
 * (tpb_copier_engine()), or NULL in a context, to run the kernel inside start() (tests, tools;
 * the completion still comes later, from progress()).
 */
struct tpb_engine {
	/* Runs the kernel of registry channel @channel over @op->xfers off the calling thread,
	 * then calls tpb_sync_engine_done(@op, ...) exactly once, from any thread. Keeps @op until
	 * then. Return: 0, or -errno (nothing taken, no tpb_sync_engine_done()). */
	int (*submit)(void *arg, int channel, struct tpb_op *op);
	void *arg;
};

/* Runs on the thread calling tpb_progress(), exactly once per started op; from then on @op is
 * its owner's again (the channel holds no pointer to it). */
typedef void (*tpb_op_done_fn)(struct tpb_op *op);

/* One transfer. The caller owns it and keeps it alive until @done has run. */
struct tpb_op {
	/* Set by the caller. @xfers (and the memory they name) borrowed until @done. */
	const struct tpb_xfer *xfers;
	size_t n_xfers;
	const void *offer; /* start, between hosts: the other side's offer (prepare()), or NULL */
	size_t offer_len;
	uint64_t xfer_id;  /* between hosts: the receiver's id for the transfer on the link */
	/* A receive between hosts: the op tpb_prepare()d for the same destination (its offer is
	 * where the bytes land; the channel finishes them there before the receive ends), or NULL. */
	struct tpb_op *prepared;
	/* Set by tpb_start() / tpb_prepare() to the registry index of @ep's channel; a channel
	 * whose endpoint serves several rows (rdma, cuda_gdr) may set the one the bytes count
	 * under (tpb_name()). */
	int channel;
	tpb_op_done_fn done;
	void *arg;
	/* Set by the channel before @done runs. */
	int status;	/* 0, -ECANCELED, or the channel's -errno */
	uint64_t bytes; /* moved, on success (mpt: also how far a failed one got) */
	char why[160];	/* with a failure: more than the errno says, or "" */
	/* The channel's own, from start() until @done. */
	struct tpb_ep *ep;
	struct tpu_list cq_node;     /* completion queue (base/cq.h) */
	struct tpb_op *next_pending; /* the endpoint's started ops */
	unsigned state;
	bool canceled;
	/* The channel's own, from a tpb_prepare() that did not fail until tpb_release(). */
	const struct tpb_channel_ops *prep_ops;
	void *prep;
};

struct tpb_channel_ops {
	const char *name;
	uint32_t caps;
	/* 1 viable here, 0 not (reason in @why). Borrows @cfg for the call. */
	int (*probe)(const struct tpb_config *cfg, char *why, size_t why_len);
	/* Synchronous copy, run on a copy thread. Borrows @x and @s for the call.
 * Return: 0 or -errno (-EFAULT, -ESRCH, ...). */
	int (*copy)(const struct tpb_xfer *x, struct tpb_scratch *s);

	/* The asynchronous table: see above, and the tpb_*() wrappers for each op's contract. */
	int (*ctx_new)(const struct tpb_channel_ops *self, const struct tpb_config *cfg,
		       const struct tpb_engine *engine, struct tpb_ctx **ret);
	void (*ctx_free)(struct tpb_ctx *ctx);
	int (*ep_open)(struct tpb_ctx *ctx, const struct tpb_peer *peer, struct tpb_ep **ret);
	void (*ep_close)(struct tpb_ep *ep);
	int (*prepare)(struct tpb_ep *ep, struct tpb_op *op, void *offer, size_t *offer_len);
	void (*release)(struct tpb_op *op);
	int (*recv_expect)(struct tpb_ep *ep, struct tpb_op *op, uint64_t bytes, int status,
			   const char *why);
	int (*recv_progress)(struct tpb_ep *ep, struct tpb_op *op, uint64_t *ret_bytes);
	int (*recv_stalled)(struct tpb_ep *ep, struct tpb_op *op, const char *why);
	int (*start)(struct tpb_ep *ep, struct tpb_op *op);
	int (*cancel)(struct tpb_ep *ep, struct tpb_op *op);
	int (*forget)(struct tpb_ctx *ctx, const struct tpb_mem *m, uint64_t len);
	int (*event_fd)(struct tpb_ctx *ctx);
	int (*progress)(struct tpb_ctx *ctx);
	/* Between hosts: the endpoint's state, a set-up step from the peer's side of the channel,
	 * and the largest offer prepare() writes and start() takes for @n_xfers xfers. */
	int (*ep_query)(struct tpb_ep *ep, struct tpb_ep_info *ret);
	int (*ep_msg)(struct tpb_ep *ep, const void *msg);
	size_t (*offer_max)(size_t n_xfers);
};

/*
 * tpb_ctx_new() - the context of registry channel @idx (one per daemon), after
 * tpb_registry_init(). @cfg: borrowed for the call. @engine: borrowed until tpb_ctx_free(), or
 * NULL (a same-host channel then runs its kernel inside tpb_start()).
 * @ret: returns owned context, free with tpb_ctx_free().
 * Return: 0; -EOPNOTSUPP (no such op, or @idx out of range), -ENODEV (not viable here),
 * -ENOMEM.
 */
int tpb_ctx_new(int idx, const struct tpb_config *cfg, const struct tpb_engine *engine,
		struct tpb_ctx **ret);

/*
 * tpb_ctx_free() - free @ctx. Every endpoint must be closed; completions still owed run first,
 * from inside this call (waiting for the engine to finish the kernels it runs). Takes @ctx.
 * Accepts NULL.
 */
void tpb_ctx_free(struct tpb_ctx *ctx);

/*
 * tpb_ep_open() - an endpoint of @ctx to @peer (NULL: this host).
 * Ownership: borrows @ctx and @peer until tpb_ep_close(); returns owned @ret.
 * Return: 0; -EOPNOTSUPP (no such op, or a peer this channel cannot reach: a same-host channel
 * and a remote peer, a peer that does not offer this channel), -ENOMEM.
 */
int tpb_ep_open(struct tpb_ctx *ctx, const struct tpb_peer *peer, struct tpb_ep **ret);

/*
 * tpb_ep_close() - close @ep: its started ops are canceled (each still completes, with
 * -ECANCELED, from a later tpb_progress()); @ep itself goes once the last has. Takes @ep (the
 * caller must not use it again). Accepts NULL.
 */
void tpb_ep_close(struct tpb_ep *ep);

/*
 * tpb_prepare() - the receiving side of a transfer between hosts: register the destination of
 * @op (xfers[i].dst; xfers[i].src is TPB_LOC_REMOTE, its @remote the writer's kind of memory)
 * and write the offer the other side's tpb_start() needs into @offer (@offer_len: its size in).
 * Either at once (return 0; @offer_len: the offer's length out), or, where the channel must
 * wait first (rdma, cuda_gdr: the reader's CUDA events), later: -EINPROGRESS, and @op->done
 * runs exactly once, never inside this call, from tpb_progress() on @ep's context, with
 * @op->status 0 and the offer in @offer (@op->offer points there, @op->offer_len its length),
 * or @op->status < 0 (no offer: the registration is gone; reason in @op->why).
 * Ownership: borrows @ep, @op and @offer_len for the call; on -EINPROGRESS keeps @op, its xfers
 * and @offer until @op->done. Unless it fails, the destination stays registered (the channel
 * keeps @op's xfers' memory) until tpb_release(@op), which the caller must call, also after a
 * failed completion (it then does nothing).
 * Return: 0, -EINPROGRESS, -EOPNOTSUPP (no such op: this channel needs no offer; or not over
 * this channel here, reason in @op->why), -ENOBUFS (@offer too small), -EINVAL (-EINPROGRESS
 * would need a done callback), or the channel's -errno (reason in @op->why).
 */
int tpb_prepare(struct tpb_ep *ep, struct tpb_op *op, void *offer, size_t *offer_len);

/*
 * tpb_release() - drop what a tpb_prepare() of @op keeps (the destination's registration), at
 * once: a completion still owed to @op never runs. Call once the transfer is over (the other
 * side wrote, or will never write) and before @op's memory goes; @op's endpoint may be gone.
 * Borrows @op. Accepts an @op never prepared, or released already (does nothing).
 */
void tpb_release(struct tpb_op *op);

/*
 * tpb_start() - start @op on @ep. Ownership: keeps @op (and the memory of its xfers) until
 * @op->done has run.
 * Return: 0 (@op->done runs exactly once, later, from tpb_progress() on @ep's context, never
 * inside this call), or -errno with no callback (-EOPNOTSUPP: no such op; -EINVAL: no done
 * callback; -EPROTO: an offer longer than tpb_offer_max() (reason in @op->why); -ESHUTDOWN:
 * @ep is closing; the engine's -errno). A send into an offer (rdma, cuda_gdr) that completes
 * with @op->status -EOPNOTSUPP wrote nothing (its sources could not be registered once their
 * mappings opened, reason in @op->why): the caller may send the op's bytes another way.
 */
int tpb_start(struct tpb_ep *ep, struct tpb_op *op);

/*
 * tpb_offer_max() - the largest offer the channel of @ep writes (tpb_prepare()) and takes
 * (tpb_start()) for an op of @n_xfers xfers: the size of the caller's offer buffer. Borrows @ep.
 * Return: the bytes; 0 when the channel takes no offer (no such op).
 */
size_t tpb_offer_max(struct tpb_ep *ep, size_t n_xfers);

/*
 * tpb_ep_query() - @ep's state (ready, its text for tpipctl, bytes each way) into @ret (the
 * caller's; @ret->state borrowed, valid until the endpoint changes state or closes). Borrows @ep.
 * Return: 0, or -EOPNOTSUPP (no such op; @ret untouched).
 */
int tpb_ep_query(struct tpb_ep *ep, struct tpb_ep_info *ret);

/*
 * tpb_ep_msg() - a set-up step @msg (the channel's own form, e.g. struct tpb_rdma_setup) that
 * the peer's side of @ep's channel sent over the link. Borrows @ep and @msg for the call.
 * Return: 0, or -EOPNOTSUPP (no such op: the channel needs no set-up).
 */
int tpb_ep_msg(struct tpb_ep *ep, const void *msg);

/*
 * tpb_recv_expect() - the sender ended receive @op (started on @ep, between hosts) after @bytes
 * with @status (0 or -errno; @why: its message, or NULL), as its daemon said (PeerXferEnd):
 * the receive completes once @bytes have arrived, with @status (a status of 0 with fewer bytes
 * than the receive's total: -EIO; rdma, whose receive only waits for this word: -EPROTO for
 * any other count). A status of 0 with every byte, or a receive that has ended
 * already, changes nothing. Borrows @ep, @op and @why for the call.
 * Return: 0, -EOPNOTSUPP (no such op: this channel learns the end itself), -ENOENT (@op is not
 * a receive pending on @ep).
 */
int tpb_recv_expect(struct tpb_ep *ep, struct tpb_op *op, uint64_t bytes, int status,
		    const char *why);

/*
 * tpb_recv_progress() - the bytes receive @op (started on @ep, between hosts) took so far, chunks
 * still arriving included: what tells a sender that stalls from a slow one. Borrows @ep, @op.
 * Return: 0 (*@ret_bytes set), -EOPNOTSUPP (no such op), -ENOENT (@op is not a receive pending
 * on @ep).
 */
int tpb_recv_progress(struct tpb_ep *ep, struct tpb_op *op, uint64_t *ret_bytes);

/*
 * tpb_recv_stalled() - the sender of receive @op stopped sending it: @op ends with -ETIMEDOUT
 * (@why) once the channel touches its memory no more, and a connection held in the middle of
 * one of its chunks is failed (nothing else would free the thread writing there). Borrows @ep,
 * @op and @why for the call.
 * Return: 0, -EOPNOTSUPP (no such op), -ENOENT (@op is not a receive pending on @ep).
 */
int tpb_recv_stalled(struct tpb_ep *ep, struct tpb_op *op, const char *why);

/*
 * tpb_cancel() - ask @op, started on @ep, to stop. Its @done runs with -ECANCELED once the
 * channel touches its memory no more (a kernel already running finishes first). Borrows @ep
 * and @op (which stays kept by tpb_start() until its @done).
 * Return: 0, -EOPNOTSUPP (no such op), -ENOENT (@op is not pending on @ep: completed already).
 */
int tpb_cancel(struct tpb_ep *ep, struct tpb_op *op);

/*
 * tpb_forget() - drop whatever @ctx caches about [@m, @m + @len) (registrations), now or
 * when the transfers using it end; call before that memory goes away. Borrows @ctx and @m.
 * Return: 0, or -EOPNOTSUPP (no such op: this channel caches nothing).
 */
int tpb_forget(struct tpb_ctx *ctx, const struct tpb_mem *m, uint64_t len);

/*
 * tpb_event_fd() - the fd that is readable while completions of @ctx wait for tpb_progress().
 * Borrows @ctx.
 * Return: the fd (borrowed, valid until tpb_ctx_free(); never close it), or -EOPNOTSUPP.
 */
int tpb_event_fd(struct tpb_ctx *ctx);

/*
 * tpb_progress() - run the completions of @ctx that are ready (their @done callbacks, on the
 * calling thread); never blocks. Borrows @ctx; each @done gets its op back.
 * Return: how many ran, or -EOPNOTSUPP.
 */
int tpb_progress(struct tpb_ctx *ctx);

/*
 * tpb_sync_engine_done() - an engine finished @op's kernel with @status (0 or -errno; @why: more
 * about a failure, or NULL: copied). Any thread; exactly once per tpb_engine.submit(). Gives
 * @op back to its context: the engine must not touch @op after this call. The context delivers
 * the completion from its next tpb_progress().
 */
void tpb_sync_engine_done(struct tpb_op *op, int status, uint64_t bytes, const char *why);

/*
 * The shared adapter for same-host channels (backends/base/sync.c): a context with an eventfd
 * and a locked completion queue; start submits the channel's @copy kernel to the engine. Only
 * for op tables (TPB_SYNC_OPS): callers use the tpb_*() wrappers, whose Ownership and Return
 * these follow (ep_open: -EOPNOTSUPP for any @peer but NULL; ctx_new: -EOPNOTSUPP without a
 * @copy kernel, -errno from eventfd()).
 */
int tpb_sync_ctx_new(const struct tpb_channel_ops *self, const struct tpb_config *cfg,
		     const struct tpb_engine *engine, struct tpb_ctx **ret);
void tpb_sync_ctx_free(struct tpb_ctx *ctx);
int tpb_sync_ep_open(struct tpb_ctx *ctx, const struct tpb_peer *peer, struct tpb_ep **ret);
void tpb_sync_ep_close(struct tpb_ep *ep);
int tpb_sync_start(struct tpb_ep *ep, struct tpb_op *op);
int tpb_sync_cancel(struct tpb_ep *ep, struct tpb_op *op);
int tpb_sync_event_fd(struct tpb_ctx *ctx);
int tpb_sync_progress(struct tpb_ctx *ctx);

/* The asynchronous ops of a same-host channel: its kernel on the shared adapter. */
#define TPB_SYNC_OPS                                                                    \
	.ctx_new = tpb_sync_ctx_new, .ctx_free = tpb_sync_ctx_free,                     \
	.ep_open = tpb_sync_ep_open, .ep_close = tpb_sync_ep_close,                     \
	.start = tpb_sync_start, .cancel = tpb_sync_cancel,                             \
	.event_fd = tpb_sync_event_fd, .progress = tpb_sync_progress

extern const struct tpb_channel_ops tpb_cma_ops;
extern const struct tpb_channel_ops tpb_shm_ops;
extern const struct tpb_channel_ops tpb_basic_ops;
extern const struct tpb_channel_ops tpb_mpt_ops;
extern const struct tpb_channel_ops tpb_rdma_ops;

/* 1 if an RDMA port is usable (rdma-core built in, a device with an active port), else 0 with
 * the reason in @why (borrowed, @why_len bytes). Probes once per tpb_registry_init() (rdma and
 * cuda_gdr share the answer); later calls return it. */
int tpb_rdma_viable(char *why, size_t why_len);
extern const struct tpb_channel_ops tpb_cuda_ipc_ops;
extern const struct tpb_channel_ops tpb_cuda_basic_ops;
extern const struct tpb_channel_ops tpb_cuda_gdr_ops;

struct tpb_channel_info {
	const struct tpb_channel_ops *ops;
	bool viable;
	char why[128];
};

/*
 * tpb_registry_init() - order the channels by @cfg->priority and probe each once; call at
 * start-up before tpb_select(). Borrows @cfg for the call (the priority list is copied).
 * Return: 0, or -EINVAL if the priority list names an unknown
 * channel (the built-in order is kept).
 */
int tpb_registry_init(const struct tpb_config *cfg);

/*
 * tpb_priority_check() - check a priority list ("shm,cma") against the registered channels.
 * Borrows @priority and @bad (@bad_len bytes).
 * Return: 0, or -EINVAL with the first unknown name copied into @bad.
 */
int tpb_priority_check(const char *priority, char *bad, size_t bad_len);

/* Returns borrowed array of every registered channel with its probe result, valid until the
 * next tpb_registry_init(); sets @ret_n. */
const struct tpb_channel_info *tpb_registry_list(size_t *ret_n);

/*
 * tpb_select_pair() - the one channel selection, for any (@src, @dst) pair, same host or not:
 * the first viable channel in priority order ([backends] priority) whose capabilities cover
 * both sides. Same host (neither side TPB_LOC_REMOTE): channels with a copy op. One side
 * TPB_LOC_REMOTE: channels with TPB_CAP_CROSS_HOST, judged on this side's memory and on the
 * other side's kind (@mem.remote), e.g. rdma only between shared buffers, cuda_gdr and
 * cuda_basic only with CUDA memory on a side, mpt for CPU memory of any kind.
 * @why (if not NULL) receives the reason the chosen channel won and why each channel tried
 * before it could not serve, e.g. "first viable for process>process memory in priority order;
 * passed over: shm: cannot copy these kinds of memory".
 * Ownership: borrows @src and @dst (only their kinds are read).
 * Return: the registry index (>= 0), or -EOPNOTSUPP if none can (the reasons in @why), or
 * -EINVAL if both sides are remote.
 */
int tpb_select_pair(const struct tpb_mem *src, const struct tpb_mem *dst, char *why,
		    size_t why_len);

/*
 * tpb_select() - tpb_select_pair() for two kinds of memory of this host.
 * Return: the registry index (>= 0), or -EOPNOTSUPP if none can.
 */
int tpb_select(enum tpb_loc src, enum tpb_loc dst);

/* tpb_select(), with the reasons as tpb_select_pair() gives them. Borrows @why. */
int tpb_select_why(enum tpb_loc src, enum tpb_loc dst, char *why, size_t why_len);

/* "local", "process", "cuda" or "remote". Return: a static string. */
const char *tpb_loc_name(enum tpb_loc l);

/*
 * tpb_peer_offers() - the channels this daemon names to a peer daemon (PeerHello.backends):
 * every viable channel that can serve between hosts (TPB_CAP_CROSS_HOST) or rides the peer
 * link itself (TPB_CAP_INLINE: basic), in priority order; a channel for which @keep (if not
 * NULL) returns false is left out (the daemon's RDMA engine may have found no port).
 * @keep runs within the call, on the calling thread, with @arg (borrowed for the call).
 * @ret: filled with up to @max borrowed names (static strings).
 * Return: how many were written.
 */
size_t tpb_peer_offers(bool (*keep)(const char *name, void *arg), void *arg, const char **ret,
		       size_t max);

/* ---- the process a CMA copy may touch (backends/cma/proc.c) ---- */

/*
 * struct tpb_proc: one client process pinned at attach (a pidfd, and its /proc directory opened
 * while the pidfd said alive) with the credentials the kernel gave for its socket (SO_PEERCRED).
 * Immutable but for a one-way "CMA off" flag; reference counted, so a copy thread keeps it alive
 * after the session that made it is gone. Every CMA access to it runs in a short-lived child
 * task sharing the daemon's memory, with that task's credentials switched to @uid/@gid and no
 * effective capabilities (tpb_cma_as_enter()), so the kernel's own ptrace check (same uid and
 * gid, dumpable, Yama) decides atomically inside process_vm_readv/writev, as if the client
 * itself asked, and the client's user can signal only that child, never the daemon.
 */

/*
 * tpb_proc_pin() - pin the peer process of the connected Unix socket @sock, whose SO_PEERCRED
 * gave @pid, @uid and @gid: SO_PEERPIDFD where the kernel has it (6.5+), else pidfd_open(@pid);
 * then /proc/<pid> opened and checked to belong to the same live process with effective uid
 * @uid. Borrows @sock (never closed or kept) and @why (@why_len bytes).
 * @label: a number for messages (the session id).
 * @ret: returns owned process, drop with tpb_proc_unref().
 * Return: 0, or -errno with the reason in @why (the client then gets no CMA).
 */
int tpb_proc_pin(int sock, pid_t pid, uid_t uid, gid_t gid, uint64_t label,
		 struct tpb_proc **ret, char *why, size_t why_len);

/*
 * tpb_proc_new() - a process from an open pidfd, for tests and callers that pinned it
 * themselves. @pidfd, @procfd: takes both (also on failure); @procfd may be -EBADF.
 * @ret: returns owned process, drop with tpb_proc_unref(). Return: 0 or -ENOMEM.
 */
int tpb_proc_new(int pidfd, int procfd, pid_t pid, uid_t uid, gid_t gid, uint64_t label,
		 struct tpb_proc **ret);
/* Returns @p with one more reference (thread safe; @p may be NULL): owned, drop with
 * tpb_proc_unref(). */
struct tpb_proc *tpb_proc_ref(struct tpb_proc *p);
/* Drops a reference (thread safe): takes one reference of @p; the last one closes the fds.
 * Accepts NULL. */
void tpb_proc_unref(struct tpb_proc *p);
/* The pid it had at attach (for messages only: never address a process by it). */
pid_t tpb_proc_pid(const struct tpb_proc *p);
/* Is the pinned process still running (its pidfd not readable)? NULL: false. */
bool tpb_proc_alive(const struct tpb_proc *p);
/* Has a CMA access been refused (EPERM/ESRCH), turning CMA off for it for good? */
bool tpb_proc_cma_off(const struct tpb_proc *p);
/* Returns owned fd of @name under the pinned /proc directory (O_RDONLY), or -errno; the caller
 * closes it. Borrows @p and @name. */
int tpb_proc_openat(const struct tpb_proc *p, const char *name);

/*
 * Credentials of the calling task while it accesses a client's memory (backends/cma/proc.c).
 * Switching is per thread (raw syscalls, not glibc's all-threads wrappers); the copies run it
 * in their child task, which never switches back.
 */
struct tpb_cma_as {
	uid_t ruid, euid, suid;
	gid_t rgid, egid, sgid;
	uint32_t caps[6]; /* the thread's capability sets before (2 x effective/permitted/inh.) */
	bool uid_switched, gid_switched, caps_dropped;
};

/*
 * tpb_cma_as_probe() - can this process take another uid and gid on a thread (CAP_SETUID and
 * CAP_SETGID effective)? Decided once at start-up (the registry's cma probe calls it); later
 * calls return the first answer. Return: 1 yes, 0 no (CMA only for clients of our own uid).
 */
int tpb_cma_as_probe(void);

/* May a client of @uid be accessed by CMA here (we can switch, or it is our own uid)? */
bool tpb_cma_as_allowed(uid_t uid);

/*
 * tpb_cma_as_enter() - make the calling thread act as @uid/@gid (real, effective; the saved ids
 * stay ours) with no effective capabilities. Without the means to switch, only our own uid is
 * accepted (capabilities are still dropped).
 * @ret: what tpb_cma_as_leave() restores (the caller's storage, written only on success).
 * Return: 0, or -EPERM/-errno with the thread unchanged.
 */
int tpb_cma_as_enter(uid_t uid, gid_t gid, struct tpb_cma_as *ret);

/* Restores the thread's credentials from @as (borrowed); abort()s if the kernel refuses (never
 * expected). */
void tpb_cma_as_leave(const struct tpb_cma_as *as);

/*
 * tpb_cma_move() - move @len bytes between @buf in the daemon and @addr in the pinned process
 * @p by cross-memory attach (@write: into @p), across partial transfers, as @p's own user (in a
 * child task: see struct tpb_proc). The process must be alive before, and after a read (else
 * the bytes are wiped from @buf and the move fails). -EPERM or -ESRCH, or a child that was
 * killed (-EINTR) or stopped (-ETIMEDOUT), turns CMA off for @p for good.
 * Ownership: borrows @p, @buf and @why for the call (the caller holds @p's reference).
 * Return: 0, or -errno (-EFAULT for an unmapped range, -ESRCH (exited), -EPERM (refused by the
 * kernel: credentials changed, not dumpable, Yama)) with the reason in @why.
 */
int tpb_cma_move(struct tpb_proc *p, void *buf, uint64_t addr, uint64_t len, bool write,
		 char *why, size_t why_len);

/*
 * tpb_cma_bounce() - move @len bytes from @src_addr in @src to @dst_addr in @dst through
 * @bounce (@bounce_len bytes), reading as @src's user and writing as @dst's (switched once when
 * they are the same user), each access checked as in tpb_cma_move().
 * Ownership: borrows @src, @dst, @bounce and @why for the call.
 * Return: as tpb_cma_move().
 */
int tpb_cma_bounce(struct tpb_proc *src, uint64_t src_addr, struct tpb_proc *dst,
		   uint64_t dst_addr, uint64_t len, void *bounce, size_t bounce_len, char *why,
		   size_t why_len);

/*
 * tpb_cuda_basic_stage() - move @len bytes between the host buffer @host and @m at offset @off
 * (@to_mem: host -> @m, else @m -> host), for the stripe threads: CMA for TPB_LOC_PROCESS, a
 * CUDA copy for TPB_LOC_CUDA (waiting for @m's event first), memcpy for TPB_LOC_LOCAL.
 * Ownership: borrows @m (the caller holds its references), @host and @why for the call.
 * @s: the calling thread's scratch (its CUDA state lives there), borrowed.
 * Return: 0, -EFAULT/-ESRCH (CMA), -EIO or another -errno for CUDA, with the reason in @why.
 */
int tpb_cuda_basic_stage(const struct tpb_mem *m, uint64_t off, void *host, size_t len,
			 bool to_mem, struct tpb_scratch *s, char *why, size_t why_len);

/* ---- CUDA memory of clients (backends/cuda/cudamap.c) ---- */

#define TPB_CUDA_HANDLE_BYTES 64

/* 1 if CUDA memory can be used on this host (driver and device), else 0 with @why (borrowed). */
int tpb_cuda_viable(char *why, size_t why_len);

/*
 * tpb_cuda_map_get() - the daemon-wide mapping of a client's CUDA IPC handle: a memory handle
 * (@event false; @size bytes on the device with PCI bus id @bus_id) or an event handle. Makes
 * no driver call: the handle is opened by the first copy that uses it, on a copy thread (so
 * check tpb_cuda_viable() first). Borrows @handle (TPB_CUDA_HANDLE_BYTES) and @bus_id (both
 * copied) and @why.
 * @ret: returns a new reference, drop with tpb_cuda_map_unref().
 * Return: 0, -EINVAL (same handle, other device or size, reason in @why), -ENOMEM.
 */
int tpb_cuda_map_get(const uint8_t *handle, bool event, const char *bus_id, uint64_t size,
		     struct tpb_cuda_map **ret, char *why, size_t why_len);
#define TPB_CUDA_UUID_BYTES 16

/*
 * tpb_cuda_map_claim_uuid() - the client says @m lives on the device with UUID @uuid
 * (TPB_CUDA_UUID_BYTES, copied): a copy that opens @m then finds its device by this UUID
 * rather than by PCI bus id, which MIG instances share. Borrows @m, @uuid and @why.
 * Return: 0; -EINVAL when @m is already known on a device of another UUID (reason in @why).
 */
int tpb_cuda_map_claim_uuid(struct tpb_cuda_map *m, const uint8_t *uuid, char *why,
			    size_t why_len);
/* Returns @m with one more reference: owned, drop with tpb_cuda_map_unref(). */
struct tpb_cuda_map *tpb_cuda_map_ref(struct tpb_cuda_map *m);
/* Drops a reference (takes one reference of @m); the last one closes the handle if a copy
 * opened it. Accepts NULL. */
void tpb_cuda_map_unref(struct tpb_cuda_map *m);
/*
 * tpb_cuda_maps_busy() - copy jobs are about to use the @n mappings @maps (borrowed; NULL
 * entries skipped); tpb_cuda_maps_idle() says they are done, on the copy thread, before the job
 * completes: a mapping no session caches (tpb_cuda_hold()) and no other job uses is then
 * closed with the driver there (the default lifetime: mapped for the transfer only), so that
 * the client may free its memory as soon as it learns that the transfer ended.
 */
void tpb_cuda_maps_busy(struct tpb_cuda_map *const *maps, size_t n);
/*
 * tpb_cuda_maps_idle_bg() - tpb_cuda_maps_idle() of @maps, for a caller on the event loop (the
 * close may block): run by the CUDA layer's worker, which holds references to @maps meanwhile.
 * cuda_gdr marks the mappings of a transfer busy once registered and idle this way once its
 * writes ended, and tells the daemon the transfer ended only once tpb_cuda_idle_done().
 * Borrows @maps (NULL entries skipped).
 * Return: owned request, drop with tpb_cuda_idle_put() (also before it is done: the close still
 * happens); NULL when it already ran on the caller's thread (no memory, no worker).
 */
struct tpb_cuda_idle *tpb_cuda_maps_idle_bg(struct tpb_cuda_map *const *maps, size_t n);
/*
 * tpb_cuda_maps_idle_then() - tpb_cuda_maps_idle_bg() without a request to poll: the worker
 * runs @then(@arg) once @maps went idle (on the caller's thread, before this returns, when it
 * ran there). mpt and cuda_basic push the transfer's completion onto their queue from @then.
 * Borrows @maps; keeps @arg until @then.
 */
void tpb_cuda_maps_idle_then(struct tpb_cuda_map *const *maps, size_t n,
			     void (*then)(void *arg), void *arg);
/* True once @q ran (or @q is NULL). Borrows @q. */
bool tpb_cuda_idle_done(const struct tpb_cuda_idle *q);
/* Drops the caller's reference to @q. Takes @q; accepts NULL. */
void tpb_cuda_idle_put(struct tpb_cuda_idle *q);
void tpb_cuda_maps_idle(struct tpb_cuda_map *const *maps, size_t n);
/*
 * tpb_cuda_xfers_wait() - whether any of the @n transfers @x (borrowed) has a client's CUDA event
 * to wait for before its copy may start (tpb_mem.event).
 */
bool tpb_cuda_xfers_wait(const struct tpb_xfer *x, size_t n);
/*
 * tpb_cuda_xfers_ready() - may the copies of @x start: 1 when every client event of the @n
 * transfers completed, or when waiting is pointless (a client in @procs, borrowed, exited, or
 * an event cannot be opened or queried: the copy then fails with the reason); 0 not yet. Opens
 * the events' mappings with the driver if needed, so it may block in the driver: for the
 * copier's waiter thread (backends/base/copier.c), never the event loop.
 */
int tpb_cuda_xfers_ready(const struct tpb_xfer *x, size_t n, struct tpb_proc *const procs[2]);
/* Mappings alive (referenced), and how many of them a copy has opened, into the caller's
 * @ret_alive and @ret_open. */
void tpb_cuda_map_count(unsigned *ret_alive, unsigned *ret_open);
/* Client shared buffers page-locked for GPU copies now (see tpb_cuda_buffer_pin() in
 * backends/cuda/cuda_int.h) and their bytes, into the caller's @ret_n and @ret_bytes. */
void tpb_cuda_pin_count(uint64_t *ret_n, uint64_t *ret_bytes);
/* How many references @m has now (the RDMA registration cache drops a region of an allocation
 * that only it references). Borrows @m. */
unsigned tpb_cuda_map_refs(const struct tpb_cuda_map *m);
/* True while a session holds @m (cuda-cache-mappings = yes: tpb_cuda_hold()), so that it may
 * stay open after its transfers; false under the default contract. Borrows @m. */
bool tpb_cuda_map_held(const struct tpb_cuda_map *m);

/* A session's held mappings: the ones its recent messages used, least recently used dropped
 * beyond a bound, all dropped when the session ends. Not thread safe (loop thread). */
struct tpb_cuda_holds;

/* Return: owned holds keeping at most @max mappings, free with tpb_cuda_holds_free(); NULL. */
struct tpb_cuda_holds *tpb_cuda_holds_new(unsigned max);
/* Drops every held mapping (copies still running keep their own references). Takes @h.
 * Accepts NULL. */
void tpb_cuda_holds_free(struct tpb_cuda_holds *h);
/*
 * tpb_cuda_hold() - the mapping for @handle, held by @h (found, or got and held). Borrows @h,
 * @handle, @bus_id and @why, as tpb_cuda_map_get().
 * @ret: returns borrowed pointer, valid until the next call on @h: take a reference to keep it.
 * Return: as tpb_cuda_map_get().
 */
int tpb_cuda_hold(struct tpb_cuda_holds *h, const uint8_t *handle, bool event,
		  const char *bus_id, uint64_t size, struct tpb_cuda_map **ret, char *why,
		  size_t why_len);
/* Stops holding the memory mapping of @handle (the client frees it). Borrows @h and @handle.
 * Return: 1 found, 0 not. */
int tpb_cuda_unhold(struct tpb_cuda_holds *h, const uint8_t *handle);
/* Mappings held by @h (borrowed). */
unsigned tpb_cuda_holds_count(const struct tpb_cuda_holds *h);

/* The daemon's mapping of a client allocation, as memory to register with an RDMA device. */
struct tpb_cuda_range {
	uint64_t base;	/* page-aligned start of the mapping of the whole allocation */
	uint64_t len;	/* page-rounded length from @base */
	uint64_t ptr;	/* device address of the tpb_mem's first byte (inside the range) */
	int dmabuf_fd;	/* dma-buf of [base, base + len) (the caller closes it), or -EBADF */
};

/*
 * tpb_cuda_gdr_range() - open @m's mapping if no copy has yet (a driver call: slow the first
 * time) and describe it for RDMA registration (cuda_gdr), with (@export) a dma-buf fd of the
 * mapping where the driver exports one for the range the daemon imported (undocumented by the
 * driver, and tried only for a mapping of whole pages: never rounded past its end). Borrows @m
 * and @why. @ret: the caller's, written only on success; its @dmabuf_fd is then owned by the
 * caller, who closes it.
 * Return: 0, or -errno with the reason in @why.
 */
int tpb_cuda_gdr_range(const struct tpb_mem *m, bool export, struct tpb_cuda_range *ret,
		       char *why, size_t why_len);

/*
 * tpb_cuda_gdr_poll_open() - is the mapping of CUDA memory @m open (polled, never blocks in the
 * driver: a mapping not opened yet is opened by the CUDA layer's worker thread meanwhile, and
 * this answers 0 until it is)? For registrations made on the event loop. Borrows @m and @why.
 * Return: 1 open (or @m is not CUDA memory), 0 not yet, -errno (reason in @why).
 */
int tpb_cuda_gdr_poll_open(const struct tpb_mem *m, char *why, size_t why_len);

/* The IPC handle (TPB_CUDA_HANDLE_BYTES) of CUDA memory @m's allocation; NULL for memory that
 * is not CUDA, or a build without CUDA. Return: borrowed, valid while @m's mapping is held. */
const uint8_t *tpb_cuda_gdr_handle(const struct tpb_mem *m);

/* The PCI bus id of the device holding CUDA memory @m, as its client named it (no driver
 * call); NULL for NULL, memory that is not CUDA, or an unknown device. Borrows @m.
 * Return: borrowed string, valid while the caller holds @m's mapping (m->cuda). */
const char *tpb_cuda_bus_id(const struct tpb_mem *m);

/*
 * tpb_cuda_event_done() - has the client's event @m waits for fired (polled, never blocks: an
 * event not opened yet is opened by the CUDA layer's worker thread meanwhile, and this answers
 * 0 until it is). Borrows @m and @why.
 * Return: 1 yes (or @m has none, or is not CUDA memory), 0 not yet, -errno (reason in @why).
 */
int tpb_cuda_event_done(const struct tpb_mem *m, char *why, size_t why_len);

/*
 * tpb_cuda_rdma_flush() - make RDMA writes that landed in CUDA memory @m (@len bytes) visible
 * to the device's own work before its client is told they are done: nothing where the device
 * orders GPUDirect RDMA writes for its owner (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING
 * at least OWNER), else cuFlushGPUDirectRDMAWrites(current context, to owner) where the device
 * supports it, else a read-back of the last bytes through the device (cuMemcpyDtoH). Blocks
 * for as long as the flush takes. Borrows @m and @why.
 * Return: 0 (also for memory that is not CUDA), or -errno (reason in @why).
 */
int tpb_cuda_rdma_flush(const struct tpb_mem *m, uint64_t len, char *why, size_t why_len);

/* Index of the channel named @name (borrowed), or -ENOENT. */
int tpb_index(const char *name);

/*
 * tpb_copy() - run the copy @x with registry channel @idx (from tpb_select()). Borrows @x and
 * @s for the call (the caller holds the references of @x's memory).
 * Return: 0, -EOPNOTSUPP for a channel without a copy op, or the channel's -errno.
 */
int tpb_copy(int idx, const struct tpb_xfer *x, struct tpb_scratch *s);

/* Does registry channel @idx move bytes into memory the receiving side prepared and offered
 * (it has a prepare op: rdma, cuda_gdr)? False for an index out of range. */
bool tpb_takes_offer(int idx);

/* Name of registry channel @idx ("?" if out of range). Return: a static string. */
const char *tpb_name(int idx);

#endif
