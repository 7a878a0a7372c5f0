/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpb: the backend layer. Every channel (a way to move tensor bytes) is one op table with
 * honest capability flags and a probe() that says whether it can run on this host; a static,
 * ordered registry lists them and picks the first viable channel for a transfer. This header
 * knows nothing about sessions, pipes or the wire: the daemon describes each transfer as a
 * source and a destination memory reference.
 *
 * Same-host channels in this release:
 *   cma    process_vm_readv/writev into or out of a client's own address space
 *   shm    memcpy between memory the daemon has mapped (shared buffers, held inline data)
 *   basic  bytes carried through the control transport itself (eager descriptors); no copy op
 * Between hosts:
 *   mpt    chunks striped over a peer link's data connections (daemon/stripe.c); no copy op
 */
#ifndef TPB_H
#define TPB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

enum tpb_caps {
	TPB_CAP_HOST_MEM = 1u << 0,    /* moves CPU memory */
	TPB_CAP_SAME_HOST = 1u << 1,   /* both ends on this host */
	TPB_CAP_SRC_LOCAL = 1u << 2,   /* reads memory mapped in the daemon */
	TPB_CAP_SRC_PROCESS = 1u << 3, /* reads a client's address space */
	TPB_CAP_DST_LOCAL = 1u << 4,   /* writes memory mapped in the daemon */
	TPB_CAP_DST_PROCESS = 1u << 5, /* writes a client's address space */
	TPB_CAP_INLINE = 1u << 6,      /* carried by the transport, no copy op */
	TPB_CAP_NEEDS_PROCESS = 1u << 7, /* only pairs where at least one side is a process */
};

enum tpb_loc {
	TPB_LOC_LOCAL = 0, /* @addr is a pointer in the daemon's address space */
	TPB_LOC_PROCESS,   /* @addr is an address in process @pid */
};

struct tpb_mem {
	enum tpb_loc loc;
	pid_t pid;
	uint64_t addr;
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
};

struct tpb_config {
	bool cma_disabled;    /* --no-cma / [backends] cma = no */
	bool shm_disabled;    /* [backends] shm = no */
	const char *priority; /* "name,name,...": these first, in this order; NULL: built-in */
};

struct tpb_channel_ops {
	const char *name;
	uint32_t caps;
	/* 1 viable here, 0 not (reason in @why). */
	int (*probe)(const struct tpb_config *cfg, char *why, size_t why_len);
	/* Synchronous copy, run on a copy thread. Return: 0 or -errno (-EFAULT, -ESRCH, ...). */
	int (*copy)(const struct tpb_xfer *x, struct tpb_scratch *s);
};

extern const struct tpb_channel_ops tpb_cma_ops;
extern const struct tpb_channel_ops tpb_shm_ops;
extern const struct tpb_channel_ops tpb_basic_ops;
extern const struct tpb_channel_ops tpb_mpt_ops;

struct tpb_channel_info {
	const struct tpb_channel_ops *ops;
	bool viable;
	char why[128];
};

/*
 * tpb_registry_init() - order the channels by @cfg->priority and probe each once; call at
 * start-up before tpb_select(). Return: 0, or -EINVAL if the priority list names an unknown
 * channel (the built-in order is kept).
 */
int tpb_registry_init(const struct tpb_config *cfg);

/*
 * tpb_priority_check() - check a priority list ("shm,cma") against the registered channels.
 * Return: 0, or -EINVAL with the first unknown name copied into @bad.
 */
int tpb_priority_check(const char *priority, char *bad, size_t bad_len);

/* Returns borrowed array of every registered channel with its probe result; sets @ret_n. */
const struct tpb_channel_info *tpb_registry_list(size_t *ret_n);

/*
 * tpb_select() - first viable channel that can copy from @src to @dst.
 * Return: the registry index (>= 0), or -EOPNOTSUPP if none can.
 */
int tpb_select(enum tpb_loc src, enum tpb_loc dst);

/* Index of the channel named @name, or -ENOENT. */
int tpb_index(const char *name);

/*
 * tpb_copy() - run the copy @x with registry channel @idx (from tpb_select()).
 * Return: 0, -EOPNOTSUPP for a channel without a copy op, or the channel's -errno.
 */
int tpb_copy(int idx, const struct tpb_xfer *x, struct tpb_scratch *s);

/* Name of registry channel @idx ("?" if out of range). */
const char *tpb_name(int idx);

#endif
