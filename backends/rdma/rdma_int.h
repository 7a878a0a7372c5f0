/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Internals shared by ctx.c (ports, the context's event fd), link.c (links), xfer.c
 * (transfers) and reg.c (registration and its cache). Everything here runs on the loop thread,
 * but for reg.c's registration worker (which makes new regions, see there).
 */
#ifndef TPB_RDMA_INT_H
#define TPB_RDMA_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "rdma.h"
#include "tpb.h"
#include "tpconfig.h"
#include "tpu.h"

/* The first CUDA segment of @segs (for locality), or NULL. */
const struct tpb_mem *tpb_rdma_reg_first_cuda(const struct tpb_rdma_seg *segs, size_t n);

#if HAVE_RDMA
#include "tpv.h"

struct rdma_port {
	struct tpb_rdma *g;
	const struct tpv_nic *nic; /* in the daemon's g->nics */
	struct tpv_ctx *ctx; /* open while a queue pair or a registration uses the port */
	unsigned refs;	     /* queue pairs and registrations on @ctx */
	char why[160];	     /* why opening failed (sticky) */
};

/* Work tpb_rdma_progress() runs once CLOCK_MONOTONIC reaches @due_ns. */
struct rdma_timer {
	struct tpu_list node; /* in g->timers while armed */
	uint64_t due_ns;
	bool armed;
	void (*fn)(struct rdma_timer *t);
};

struct tpb_rdma {
	struct tpb_ctx base; /* first: the op table's head */
	struct tpb_ctx gdr_base; /* cuda_gdr's head: its endpoints run on this context too */
	struct tpb_rdma_config cfg;
	int epfd; /* the event fd: the ports' completion channels and @tfd */
	int tfd;  /* timerfd, armed for the first of @timers */
	struct tpu_list timers; /* armed struct rdma_timer */
	struct tpu_list links;	/* struct tpb_rdma_link */
	const struct tpv_ops *ops;
	struct tpv_nic *nics; /* the ports' NICs, as tpv_nic_choose() takes them */
	struct rdma_port *ports;
	size_t n;
	unsigned rr; /* round-robin cursor of tpv_nic_choose() */
	bool cuda;   /* a CUDA driver is there: cuda_gdr is offered too */
	struct tpu_list mrs; /* cached registrations (struct rdma_mr), least recently used first */
	struct tpb_rdma_cache_stats cache;
	uint64_t host_bytes; /* of cache.bytes, in shared buffers (what the rdma-cache budget caps) */
	struct tpu_list dmabufs; /* client-exported dma-bufs (dmabuf.c), in hand-over order */
	uint64_t link_ids;	 /* the last tpb_rdma_link.id given */
	struct rdma_regw *regw;	 /* reg.c's registration worker, started on first use */
};

/* A dma-buf a client exported of its own CUDA allocation (dmabuf.c). */
struct rdma_dmabuf {
	struct tpu_list node;	  /* in g->dmabufs while the client has it handed over */
	struct tpb_proc *owner;	  /* the client's process: a reference */
	uint8_t handle[TPB_CUDA_HANDLE_BYTES]; /* its allocation's IPC handle */
	uint64_t size;		  /* bytes from the allocation's first byte (checked) */
	int fd;
	atomic_uint *charge[2]; /* lowered when @fd closes (tpb_rdma_dmabuf_add()), or NULLs */
	unsigned refs; /* the registry's while listed, one per registration made from it */
};

/* The dma-buf @owner handed over for allocation @handle (borrowed), or NULL. */
struct rdma_dmabuf *tpb_rdma_dmabuf_find(struct tpb_rdma *g, const struct tpb_proc *owner,
					 const uint8_t *handle);
/* A reference on @d (for a registration). Return: @d. */
struct rdma_dmabuf *tpb_rdma_dmabuf_ref(struct rdma_dmabuf *d);
/* Drops a reference; the last closes the fd. Accepts NULL. */
void tpb_rdma_dmabuf_unref(struct rdma_dmabuf *d);
/* Drops every listed dma-buf (the context ends). */
void tpb_rdma_dmabuf_stop(struct tpb_rdma *g);

/* How the CUDA region serving a segment was registered (counted per link, tpipctl peers). */
enum rdma_reg_method {
	RDMA_REG_CLIENT_DMABUF, /* from the dma-buf its client exported (CudaDmabuf) */
	RDMA_REG_DMABUF,	/* from a dma-buf the daemon exported of its IPC mapping */
	RDMA_REG_ADDR,		/* ibv_reg_mr on the device address (peer memory) */
	RDMA_REG_METHODS
};
enum link_state { LINK_PORTS, LINK_CONNECTING, LINK_READY, LINK_OFF };

/* A peer link's RDMA state (link.c), its endpoint (ep.c). */
struct tpb_rdma_link {
	struct tpb_ep ep; /* its endpoint in the op table */
	struct tpb_ep gdr_ep; /* the same link as cuda_gdr's endpoint */
	struct tpb_peer peer;
	struct tpu_list node; /* in g->links */
	struct tpu_list op_sends; /* struct op_send: sends started through the op table */
	struct tpu_list op_recvs; /* struct op_wait: receives started through the op table */
	struct tpb_rdma *g;
	void *link; /* the daemon's */
	bool ep_owned;	 /* made by tpb_ep_open(): freed by the last tpb_ep_close() */
	unsigned ep_refs; /* tpb_ep_open()s not closed yet (@ep_owned) */
	enum link_state state;
	unsigned common; /* TPB_RDMA_* both daemons offer */
	unsigned n_remote;
	bool *pairs;	     /* [local port * n_remote + remote port]: gets a queue pair */
	size_t n_pairs;	     /* of them true */
	struct tpv_qp **qps; /* [local port * n_remote + remote port], NULL where no pair */
	struct tpu_list sends;
	char text[200];
	uint64_t sent, received; /* bytes RDMA-written each way */
	bool closing;		  /* tpb_rdma_link_free() is flushing the queue pairs */
	struct rdma_timer rebuild; /* armed while off after a failed write */
	uint32_t rebuilds;	   /* since a write last completed */
	uint64_t id;		   /* unique in @g, for receives that outlive the link */
	uint64_t reg_by[RDMA_REG_METHODS]; /* CUDA segments of its transfers, by method */
};

/* The link goes (tpb_rdma_link_free()): receives started on its endpoint complete now, inside
 * the call, with -ECONNRESET unless they ended already (ep.c). */
void tpb_rdma_ep_flush(struct tpb_rdma_link *l);

/* Runs @t's work from tpb_rdma_progress() in @us microseconds (0: on the next one); an armed
 * @t is re-armed (ctx.c). */
void tpb_rdma_timer_in_us(struct tpb_rdma *g, struct rdma_timer *t, long us);
/* Disarms @t, armed or not. */
void tpb_rdma_timer_stop(struct rdma_timer *t);

/* A write a send posted completed (a tpv_done_fn, @cookie the send): from the completion queue
 * drain (ctx.c), or flushed by closing its queue pair (link.c). */
void tpb_rdma_write_done(void *arg, uint64_t cookie, int status, const char *why);

/* One segment of a transfer, in a registration: where the peer writes or this side reads. */
struct rdma_reg {
	struct rdma_mr *e; /* NULL for an empty segment */
	uint64_t addr;	  /* of the segment's first byte, inside @e's region */
	uint64_t len;
	uint32_t lkey, rkey;
};

/* The registrations of one transfer's segments, all on @port. */
struct rdma_regs {
	struct rdma_port *port; /* set before tpb_rdma_reg_make() to choose it, else NULL */
	bool opened; /* holds a reference on @port */
	struct rdma_reg *r;
	size_t n;
	size_t next;	     /* the first segment not registered yet */
	struct reg_job *job; /* the worker registers segment @next (reg.c), else NULL */
};

/*
 * The CUDA mappings of a transfer's segments, marked busy (tpb_cuda_maps_busy()) once open,
 * before their registration, until the transfer's end, then idle on the CUDA layer's worker
 * (tpb_cuda_maps_idle_bg()), which closes those no session holds: under the default lifetime
 * contract the daemon holds no mapping of the memory once the client is told the transfer
 * ended (xfer.c).
 */
struct rdma_busy {
	struct tpb_cuda_map **maps; /* references, while @on */
	size_t n;
	bool on;		  /* busy now */
	struct tpb_cuda_idle *idle; /* the idle request, until done */
};

/* Marks the CUDA mappings of @segs busy (once). Return: 0 or -ENOMEM. */
int tpb_rdma_busy_on(struct rdma_busy *b, const struct tpb_rdma_seg *segs, size_t n);
/* Hands @b's mappings to the worker to go idle (if busy). Return: true once that ran (or there
 * was nothing to do), false while it runs (poll again). */
bool tpb_rdma_busy_off(struct rdma_busy *b);
/* Frees @b: mappings still busy go idle on the worker, unwaited. */
void tpb_rdma_busy_free(struct rdma_busy *b);

/* A send on a link (xfer.c); the link fails and finishes it when it goes (link.c). */
struct rdma_send {
	struct tpu_list node; /* in the link's sends */
	struct tpb_rdma_link *l;
	struct tpb_rdma_xfer *x;
	struct rdma_regs regs;
	struct tpv_qp *qp;	 /* set with @regs */
	uint32_t rport;		 /* the reader's port (its offer's) */
	bool registered;	 /* @regs and @qp made: the sources' mappings were open */
	bool ending;		 /* its mappings going idle before it finishes (send_end()) */
	uint64_t *raddr;
	uint32_t *rkey;
	struct rdma_timer timer; /* event polling, and completions decided outside a call */
	size_t next;		 /* next segment to post */
	unsigned pending;	 /* writes posted, not completed */
	bool canceled, posting;
	bool events_ok; /* the writer's CUDA events fired */
	struct rdma_busy busy;	 /* its sources' CUDA mappings, busy from open to end */
	const char *channel; /* "rdma" or "cuda_gdr", for errors */
	int status;
	char why[160];
};

/* @s fails with @err (the first failure is kept; @why is prefixed with the channel). */
void tpb_rdma_send_fail(struct rdma_send *s, int err, const char *why);
/* Ends @s now: removed from its link's sends, registrations released, its transfer's done()
 * called with the outcome; frees @s. */
void tpb_rdma_send_finish(struct rdma_send *s);
/* A write failed on @l: RDMA off (the peer is told), and rebuilt later unless that was tried
 * too often (link.c). */
void tpb_rdma_link_off_rebuild(struct tpb_rdma_link *l, const char *why);

/* Opens @pt if it is not open (a device context, protection domain and completion queue) and
 * takes a reference. Return: 0, or -errno (sticky: a port that failed once stays unusable). */
int tpb_rdma_port_open(struct rdma_port *pt, char *why, size_t wl);
/* Drops a reference taken by tpb_rdma_port_open(); the last one closes the device. */
void tpb_rdma_port_put(struct rdma_port *pt);

/* -EOPNOTSUPP unless every segment is registrable (shared buffers and CUDA memory). */
int tpb_rdma_reg_applicable(const struct tpb_rdma_seg *segs, size_t n, char *why, size_t wl);

/*
 * tpb_rdma_reg_make() - registrations for every non-empty segment of @segs, on @rg->port if set,
 * else on the port nearest their GPU (host memory: round-robin): from the cache where a cached
 * region holds the segment, else registered by the registration worker (and cached, for shared
 * buffers and CUDA allocations, within the rdma-cache budget), never on the calling thread: the
 * export of a CUDA mapping's dma-buf and ibv_reg_(dmabuf_)mr may block for long. Call again
 * (a timer) with the same @segs and @rg while it returns 0. Keeps @segs' memory (its buffers,
 * mappings) referenced while it registers. Return: 1 all registered; 0 the worker is
 * registering one; -errno (reason in @why) with nothing held.
 */
int tpb_rdma_reg_make(struct tpb_rdma *g, const struct tpb_rdma_seg *segs, size_t n,
		    struct rdma_regs *rg, char *why, size_t wl);
/* The method of the region serving segment @i of @rg (made by tpb_rdma_reg_make()), or -1
 * (host memory, an empty segment). */
int tpb_rdma_reg_method(const struct rdma_regs *rg, size_t i);
/* Counts on @l the method of each CUDA segment of @rg (a transfer over @l registered it, or
 * found it cached) and logs the first use of each method on @l (link.c). */
void tpb_rdma_link_note_regs(struct tpb_rdma_link *l, const struct rdma_regs *rg);
/* Releases what tpb_rdma_reg_make() took (if it ran): regions leave or stay in the cache; a
 * registration still running on the worker goes once it ends (tpb_rdma_reg_progress()). */
void tpb_rdma_reg_free(struct rdma_regs *rg);
/* Drops every cached region and stops the registration worker, after the registration it
 * runs (the daemon stops; no transfer may be running). */
void tpb_rdma_cache_stop(struct tpb_rdma *g);
/* From tpb_rdma_progress(): frees the registrations the worker finished for transfers that
 * went meanwhile. */
void tpb_rdma_reg_progress(struct tpb_rdma *g);

#endif /* HAVE_RDMA */
#endif
