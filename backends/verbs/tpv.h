/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpv: the ibverbs layer under the cuda_gdr channel. It finds every RDMA device and every active
 * port, picks the port nearest a GPU by PCI topology, opens a protection domain and a completion
 * queue per port (with a completion-channel fd for the event loop), registers memory (dma-buf
 * for GPU memory where the kernel has it, else plain ibv_reg_mr, which reaches GPU memory only
 * through nvidia-peermem), walks RC queue pairs through RESET -> INIT -> RTR -> RTS from the
 * peer's connection info, and posts RDMA writes cut to the port's maximum message size. Every
 * verbs call goes through one op table (struct tpv_ops) so the logic runs in unit tests against
 * a fake. It knows nothing about peers, pipes or the wire: the caller carries the encoded
 * struct tpv_qp_info over its own control connection and decides what a completion means.
 * Objects are not thread safe; use them from one thread (the daemon's event loop).
 */
#ifndef TPV_H
#define TPV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

/*
 * The verbs calls the layer makes, with libibverbs' own conventions: constructors return NULL
 * and set errno; ibv_get_cq_event() and ibv_close_device() return -1 and set errno; the other
 * int calls return 0 or a positive errno; poll_cq returns the number of completions or < 0.
 * query_gid_ex fills one GID table entry (ENODATA for an empty slot).
 */
struct tpv_ops {
	struct ibv_device **(*get_device_list)(int *num);
	void (*free_device_list)(struct ibv_device **list);
	struct ibv_context *(*open_device)(struct ibv_device *dev);
	int (*close_device)(struct ibv_context *verbs);
	int (*query_device)(struct ibv_context *verbs, struct ibv_device_attr *attr);
	int (*query_port)(struct ibv_context *verbs, uint8_t port, struct ibv_port_attr *attr);
	int (*query_gid_ex)(struct ibv_context *verbs, uint32_t port, uint32_t index,
			    struct ibv_gid_entry *entry);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *verbs);
	int (*dealloc_pd)(struct ibv_pd *pd);
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *verbs);
	int (*destroy_comp_channel)(struct ibv_comp_channel *channel);
	struct ibv_cq *(*create_cq)(struct ibv_context *verbs, int cqe, void *cq_context,
				    struct ibv_comp_channel *channel, int comp_vector);
	int (*destroy_cq)(struct ibv_cq *cq);
	int (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);
	int (*get_cq_event)(struct ibv_comp_channel *channel, struct ibv_cq **cq,
			    void **cq_context);
	void (*ack_cq_events)(struct ibv_cq *cq, unsigned int nevents);
	int (*poll_cq)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
	int (*destroy_qp)(struct ibv_qp *qp);
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t length,
					uint64_t iova, int fd, int access);
	int (*dereg_mr)(struct ibv_mr *mr);
	int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
	/* Not a verbs call: what the provider takes as a dma-buf. 0 and its size in bytes, or
	 * a positive errno for an fd that is none. NULL (libibverbs): the kernel's dma-buf, an
	 * fd on the dma-buf file system (tpv_dmabuf_size()). A stand-in names its own. */
	int (*dmabuf_size)(int fd, uint64_t *ret_size);
};

/* The library tpv_ops_load() binds at run time; tpipd is never linked to libibverbs. */
#define TPV_LIBRARY "libibverbs.so.1"

/*
 * tpv_ops_load() - the verbs table to use: libibverbs itself, dlopen()ed as TPV_LIBRARY on the
 * first call (thread safe) with the functions the layer uses resolved from it (the inline verbs
 * wrapped); or, when $TPIPD_VERBS_LIBRARY names a test stand-in (tests/hw/fakeverbs.c: one fake
 * RoCE port whose "RDMA writes" are copies between processes on this host), that library's
 * exported `const struct tpv_ops tpv_ops_table`. For tests only: a stand-in says nothing about
 * real hardware. Repeated calls load a library once and return the same table.
 * @why: filled when NULL is returned ("no libibverbs (install rdma-core's libibverbs1):
 * libibverbs.so.1: cannot open shared object file: ...", "TPIPD_VERBS_LIBRARY=/x.so: dlopen:
 * ...") (may be NULL).
 *
 * Ownership: returns borrowed pointer valid for the life of the process (the library is never
 * unloaded). Return: the table, or NULL if the library cannot be loaded or lacks a function.
 */
const struct tpv_ops *tpv_ops_load(char *why, size_t why_len);

/* The text libibverbs' ibv_wc_status_str() gives for @status, without libibverbs loaded. */
const char *tpv_wc_status_str(enum ibv_wc_status status);

#define TPV_SYSFS_ROOT "/sys"
#define TPV_NAME_MAX 64	  /* IBV_SYSFS_NAME_MAX */
#define TPV_PCI_ID_MAX 32 /* "0000:3b:00.0" plus room */
#define TPV_GID_BYTES 16
#define TPV_RAIL_BYTES 16

enum tpv_link {
	TPV_LINK_IB = 0, /* InfiniBand: addressed by LID */
	TPV_LINK_ETH,	 /* RoCE: addressed by GID, with a GRH */
};

/* One active port of one RDMA device, ready to open with tpv_ctx_open(). */
struct tpv_nic {
	char dev[TPV_NAME_MAX];	     /* "mlx5_0" */
	uint8_t port;		     /* 1-based */
	enum tpv_link link;
	enum ibv_mtu mtu;	     /* active MTU */
	uint16_t lid;		     /* IB only */
	int gid_index;		     /* RoCE: the chosen GID; IB: 0; -1 if none */
	uint8_t gid[TPV_GID_BYTES];
	/* The network the port is on, for pairing ports of two hosts that can reach each other:
	 * kind (1 InfiniBand subnet prefix, 2 IPv4 network, 3 IPv6 /64), prefix length, then the
	 * prefix's bytes, zero-padded. Equal keys: same subnet (same rail). */
	uint8_t rail[TPV_RAIL_BYTES];
	uint32_t max_msg_sz;	     /* the port's largest message */
	char pci[TPV_PCI_ID_MAX];    /* "0000:3b:00.0", or "" if sysfs does not say */
	int numa_node;		     /* -1 if unknown */
};

/* Text for @link: "InfiniBand" or "Ethernet". */
const char *tpv_link_name(enum tpv_link link);

/*
 * tpv_nics_list() - every active, usable port of every RDMA device, in device then port order.
 * @ops: the verbs table (tpv_ops_load(), or a fake in tests).
 * @sysfs_root: where sysfs is mounted (TPV_SYSFS_ROOT; a temp dir in tests), for PCI and NUMA.
 * @ret, @ret_n: the ports found (possibly none).
 * @why: filled with the reasons for devices and ports left out, or "" (may be NULL).
 *
 * Ownership: borrows @ops and @sysfs_root; returns owned @ret, free with free().
 * Return: 0 (even when nothing was found), or -ENOMEM.
 */
int tpv_nics_list(const struct tpv_ops *ops, const char *sysfs_root, struct tpv_nic **ret,
		  size_t *ret_n, char *why, size_t why_len);

/*
 * tpv_nic_use_gid() - make GID table entry @index of @nic's port the one its queue pairs use
 * (a configured GID index) in place of the one tpv_nics_list() chose, and recompute its rail.
 * Ownership: borrows @ops; changes @nic only on success.
 * Return: 0, -ENODATA for an empty or unusable entry, or the verbs -errno (reason in @why).
 */
int tpv_nic_use_gid(const struct tpv_ops *ops, struct tpv_nic *nic, int index, char *why,
		    size_t why_len);

/*
 * tpv_probe() - can RDMA run on this host: is there at least one active, usable port?
 * @why: filled with the first usable port ("mlx5_0 port 1 (InfiniBand)") or the reason there is
 * none ("no RDMA device (ibv_get_device_list found none)", "mlx5_0: no active port").
 *
 * Ownership: borrows @ops. Return: 1 viable, 0 not.
 */
int tpv_probe(const struct tpv_ops *ops, char *why, size_t why_len);

/*
 * tpv_nic_choose() - the port nearest a GPU: the NIC whose PCI path in sysfs shares the longest
 * prefix with the GPU's (same PCIe switch, then same root port), then one on the GPU's NUMA node,
 * then round-robin among equals through @rr.
 * @gpu_bus_id: the GPU's PCI bus id as CUDA prints it ("0000:3B:00.0"), or NULL if unknown; a
 * GPU or NIC sysfs does not know ranks last, so an unknown topology means plain round-robin.
 * @rr: the caller's round-robin cursor (start at 0), advanced on each call.
 *
 * Ownership: borrows everything. Return: an index into @nics, or -ENOENT if @n is 0.
 */
int tpv_nic_choose(const struct tpv_nic *nics, size_t n, const char *sysfs_root,
		   const char *gpu_bus_id, unsigned int *rr);

/* One port opened: device context, protection domain, completion channel and queue. */
struct tpv_ctx;

/*
 * tpv_ctx_open() - open @nic's device, allocate a protection domain, a completion channel (its
 * fd non-blocking) and a completion queue of @cq_depth entries (at most the device's max_cqe)
 * armed for notification. Queue pairs that no longer fit in it get another of the same size
 * on the same channel, up to the device's max_cq (one if the device does not say).
 * @ops: must outlive the context.
 *
 * Ownership: borrows @nic, keeps @ops; returns owned @ret, free with tpv_ctx_close().
 * Return: 0, or -errno with the failing call named in @why ("ibv_alloc_pd: ...").
 */
int tpv_ctx_open(const struct tpv_ops *ops, const struct tpv_nic *nic, int cq_depth,
		 struct tpv_ctx **ret, char *why, size_t why_len);

/*
 * tpv_ctx_close() - release the context. Every queue pair and memory region made from it must
 * already be freed. Accepts NULL and half-built contexts.
 */
void tpv_ctx_close(struct tpv_ctx *ctx);

/* Returns borrowed pointer to the port the context was opened on, valid until tpv_ctx_close(). */
const struct tpv_nic *tpv_ctx_nic(const struct tpv_ctx *ctx);

/*
 * tpv_cq_fd() - the completion channel's fd (non-blocking) for the event loop: when it is
 * readable, call tpv_cq_drain(). Ownership: returns borrowed fd, valid until tpv_ctx_close().
 */
int tpv_cq_fd(const struct tpv_ctx *ctx);

/*
 * Completion of one tpv_qp_write(): @status 0, or -errno (-ECANCELED for a write flushed from a
 * failed queue pair, -EACCES for a bad remote key, -ETIMEDOUT when retries ran out, -EIO...)
 * with @why ("RDMA write on qp 0x1234: remote access error").
 */
typedef void (*tpv_done_fn)(void *arg, uint64_t cookie, int status, const char *why);

/*
 * tpv_cq_drain() - take the completion events there are, acknowledge them, re-arm every
 * completion queue of @ctx, then poll every completion and call @cb once per finished write.
 *
 * Ownership: borrows @cb and @arg for the duration of the call; @cb may post new writes but
 * must not free a queue pair of @ctx. Return: the number of completions polled, or -errno if
 * re-arming or polling failed (the queue is then unusable: close the context).
 */
int tpv_cq_drain(struct tpv_ctx *ctx, tpv_done_fn cb, void *arg);

enum tpv_mr_method {
	TPV_MR_HOST = 0, /* ibv_reg_mr on a virtual address (host memory, or GPU via peermem) */
	TPV_MR_DMABUF,	 /* ibv_reg_dmabuf_mr on a dma-buf fd (GPU memory, kernel >= 5.12) */
};

struct tpv_mr_args {
	void *addr;		/* start of the region here (the GPU VA for GPU memory) */
	size_t len;
	int dmabuf_fd;		/* from cuMemGetHandleForAddressRange(DMA_BUF_FD), or -EBADF */
	uint64_t dmabuf_offset; /* where @addr lies inside the dma-buf */
	bool device_mem;	/* @addr is GPU memory (only improves the error message) */
	bool dmabuf_only;	/* with a dma-buf fd: no ibv_reg_mr if ibv_reg_dmabuf_mr fails */
};

struct tpv_mr {
	struct ibv_mr *mr;
	enum tpv_mr_method method;
	uint64_t addr;
	size_t len;
	uint32_t lkey;
	uint32_t rkey;
};

/*
 * tpv_mr_reg() - register memory for local access and remote writes. With a dma-buf fd,
 * ibv_reg_dmabuf_mr (IOVA = @addr, so the peer writes to the same addresses); if that fails for
 * any reason (no dma-buf in the library or kernel, a driver refusing this dma-buf), or there is
 * no fd, ibv_reg_mr on @addr (@ret's method says which).
 *
 * Ownership: borrows @ctx (which must outlive the region) and @a->dmabuf_fd (the caller may
 * close it once this returns); returns owned @ret, free with tpv_mr_dereg().
 * Return: 0, or -errno of ibv_reg_mr with the reason in @why (for GPU memory: a note that
 * ibv_reg_mr needs the nvidia-peermem module, and why dma-buf failed if it was tried).
 */
int tpv_mr_reg(struct tpv_ctx *ctx, const struct tpv_mr_args *a, struct tpv_mr **ret,
	       char *why, size_t why_len);

/*
 * tpv_dmabuf_size() - whether @fd is a dma-buf for @ops's provider, and its size: the
 * provider's dmabuf_size op where it has one, else the kernel's (an fd on the dma-buf file
 * system, fstatfs() DMA_BUF_MAGIC, whose size fstat() gives). Regular files, pipes, sockets,
 * memfds are none. Borrows @ops and @fd.
 * Return: 0 and *@ret_size; -EBADF (not an open fd), -ENOTTY (open, but no dma-buf), -errno.
 */
int tpv_dmabuf_size(const struct tpv_ops *ops, int fd, uint64_t *ret_size);

/*
 * tpv_mr_dereg() - deregister and free @mr (NULL is fine).
 * Ownership: takes @mr (freed also on failure). Return: 0, or -errno from ibv_dereg_mr.
 */
int tpv_mr_dereg(struct tpv_ctx *ctx, struct tpv_mr *mr);

/* Text for @m: "host" or "dma-buf". */
const char *tpv_mr_method_name(enum tpv_mr_method m);

/* What one side of an RC connection tells the other. */
enum tpv_qp_info_flags {
	TPV_QP_INFO_ROCE = 1u << 0, /* Ethernet link layer: address by @gid with a GRH */
};

struct tpv_qp_info {
	uint32_t qpn; /* 24 bits */
	uint32_t psn; /* 24 bits */
	uint16_t lid;
	uint8_t gid[TPV_GID_BYTES];
	uint8_t mtu;  /* enum ibv_mtu, 1 (256) .. 5 (4096) */
	uint8_t port;
	uint8_t flags; /* enum tpv_qp_info_flags */
};

#define TPV_QP_INFO_VERSION 1
#define TPV_QP_INFO_BYTES 32

/*
 * tpv_qp_info_encode() - @info as TPV_QP_INFO_BYTES little-endian bytes: version, flags, port,
 * mtu, qpn (4), psn (4), lid (2), two zero bytes, gid (16). Ownership: borrows both.
 */
void tpv_qp_info_encode(const struct tpv_qp_info *info, uint8_t out[TPV_QP_INFO_BYTES]);

/*
 * tpv_qp_info_decode() - parse what tpv_qp_info_encode() wrote, from an untrusted peer.
 * Return: 0 (@ret written), -EBADMSG for a wrong length, an unknown flag, an out-of-range field
 * or reserved bytes not zero, -EPROTONOSUPPORT for another version.
 */
int tpv_qp_info_decode(const uint8_t *buf, size_t len, struct tpv_qp_info *ret);

enum tpv_qp_state {
	TPV_QP_RESET = 0,
	TPV_QP_INIT,
	TPV_QP_RTR,
	TPV_QP_RTS,
	TPV_QP_ERROR,
};

/* "RESET", "INIT", "RTR", "RTS", "ERROR". */
const char *tpv_qp_state_name(enum tpv_qp_state s);

/* RC queue pair tunables; zero fields take the defaults in brackets. */
struct tpv_qp_params {
	uint32_t max_send_wr;  /* send queue depth [128], clamped to the device's limit */
	uint8_t timeout;       /* local ACK timeout, 4.096 us * 2^timeout [14] */
	uint8_t retry_cnt;     /* [7] */
	uint8_t rnr_retry;     /* [7: infinite] */
	uint8_t min_rnr_timer; /* [12] */
	uint8_t max_rd_atomic; /* outstanding RDMA reads/atomics, both directions [1] */
	uint8_t hop_limit;     /* GRH hop limit for RoCE [64] */
	uint8_t traffic_class; /* GRH traffic class [0] */
	uint8_t sl;	       /* service level [0] */
};

struct tpv_qp;

/*
 * tpv_qp_new() - create an RC queue pair in RESET on a completion queue of @ctx with room for
 * its whole send queue (a new one if none has), with a random starting PSN; its tpv_qp_local()
 * info is ready to send to the peer.
 * @params: NULL for the defaults.
 *
 * Ownership: keeps @ctx (must outlive the QP), borrows @params; returns owned @ret, free with
 * tpv_qp_free(). Return: 0, -ENOSPC when no completion queue has room and no more may be made,
 * or -errno with "ibv_create_qp: ..." (or "ibv_create_cq(...): ...") in @why.
 */
int tpv_qp_new(struct tpv_ctx *ctx, const struct tpv_qp_params *params, struct tpv_qp **ret,
	       char *why, size_t why_len);

/*
 * tpv_qp_free() - destroy the queue pair; once this returns the device touches none of its
 * writes' memory, and those still pending never complete. Accepts NULL and half-built ones.
 */
void tpv_qp_free(struct tpv_qp *qp);

/*
 * tpv_qp_close() - tpv_qp_free(), after which every write still pending is finished through
 * @cb with -ECANCELED ("queue pair closed"), in posting order. Accepts NULL.
 * Ownership: takes @qp; borrows @cb and @arg for the duration of the call.
 */
void tpv_qp_close(struct tpv_qp *qp, tpv_done_fn cb, void *arg);

/* Returns borrowed pointer to this side's connection info, valid until tpv_qp_free(). */
const struct tpv_qp_info *tpv_qp_local(const struct tpv_qp *qp);

/* The queue pair's connection state. */
enum tpv_qp_state tpv_qp_state(const struct tpv_qp *qp);

/*
 * tpv_qp_set_remote() - record the peer's info (from tpv_qp_info_decode()) for the RTR step.
 * Ownership: copies @remote. Return: 0, or -EPROTO if the link layers differ (one side
 * InfiniBand, the other RoCE), -EINVAL if an InfiniBand peer has no LID or a RoCE peer no GID
 * (reason in @why).
 */
int tpv_qp_set_remote(struct tpv_qp *qp, const struct tpv_qp_info *remote, char *why,
		      size_t why_len);

/*
 * tpv_qp_step() - move one step: RESET -> INIT -> RTR -> RTS. A failed ibv_modify_qp leaves the
 * queue pair in ERROR with "modify_qp(RTR): <strerror>" in @why.
 * Return: the new state, -EDESTADDRREQ for RTR without tpv_qp_set_remote() (state unchanged),
 * -EALREADY in RTS, -EIO in ERROR, or the modify_qp -errno.
 */
int tpv_qp_step(struct tpv_qp *qp, char *why, size_t why_len);

/*
 * tpv_qp_connect() - tpv_qp_set_remote() then tpv_qp_step() until RTS.
 * Return: 0, or the first -errno (reason in @why).
 */
int tpv_qp_connect(struct tpv_qp *qp, const struct tpv_qp_info *remote, char *why,
		   size_t why_len);

/* One RDMA write from registered local memory to the peer's registered memory. */
struct tpv_write {
	uint64_t local_addr; /* inside a tpv_mr of this context */
	uint32_t lkey;
	uint64_t remote_addr; /* inside the peer's region */
	uint32_t rkey;
	uint64_t len;	      /* > 0 */
	uint64_t cookie;      /* handed back to the tpv_done_fn */
};

/*
 * tpv_qp_write() - post @w as RDMA writes of at most the port's maximum message size each, only
 * the last one signaled; its completion (or the first failure of any piece) calls the drain
 * callback once with @w->cookie.
 * Ownership: copies @w; the memory must stay registered until the callback.
 * Return: 0 (one callback later, from tpv_cq_drain()), -ENOTCONN unless in RTS, -EINVAL for an
 * empty write or one past the end of the address space, -EMSGSIZE if it needs more pieces than
 * the send queue holds, -ENOBUFS if the queue has no room for every piece now (retry after a
 * completion), or the ibv_post_send -errno (reason in @why; no callback; if the provider took
 * part of the chain the queue pair goes to ERROR and must be freed).
 */
int tpv_qp_write(struct tpv_qp *qp, const struct tpv_write *w, char *why, size_t why_len);

/* Number of pieces tpv_qp_write() cuts @len into for a port whose largest message is @max. */
uint64_t tpv_write_pieces(uint64_t len, uint32_t max);

#endif
