/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Internals shared by link.c (ports, links, transfers) and reg.c (registration and its
 * cache). Everything here runs on the loop thread.
 */
#ifndef TPD_GDR_INT_H
#define TPD_GDR_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "rdma.h"
#include "tpb.h"
#include "tpconfig.h"
#include "tpu.h"

struct tpd_stripe_seg;

/* The first CUDA segment of @segs (for locality), or NULL. */
const struct tpb_mem *tpd_gdrreg_first_cuda(const struct tpd_stripe_seg *segs, size_t n);

#if HAVE_RDMA
#include "tpv.h"

struct gdr_port {
	struct tpd_gdr *g;
	const struct tpv_nic *nic; /* in the daemon's g->nics */
	struct tpv_ctx *ctx; /* open while a queue pair or a registration uses the port */
	struct event *ev;    /* its completion channel */
	unsigned refs;	     /* queue pairs and registrations on @ctx */
	char why[160];	     /* why opening failed (sticky) */
};

struct tpd_gdr {
	struct tpd_daemon *d;
	const struct tpv_ops *ops;
	struct tpv_nic *nics; /* the ports' NICs, as tpv_nic_choose() takes them */
	struct gdr_port *ports;
	size_t n;
	unsigned rr; /* round-robin cursor of tpv_nic_choose() */
	bool cuda;   /* a CUDA driver is there: cuda_gdr is offered too */
	struct tpu_list mrs; /* cached registrations (struct gdr_mr), least recently used first */
	struct tpd_gdrreg_cache_stats cache;
	uint64_t host_bytes; /* of cache.bytes, in shared buffers (what the rdma-cache budget caps) */
};

/* One segment of a transfer, in a registration: where the peer writes or this side reads. */
struct gdr_reg {
	struct gdr_mr *e; /* NULL for an empty segment */
	uint64_t addr;	  /* of the segment's first byte, inside @e's region */
	uint64_t len;
	uint32_t lkey, rkey;
};

/* The registrations of one transfer's segments, all on @port. */
struct gdr_regs {
	struct gdr_port *port;
	bool opened; /* holds a reference on @port */
	struct gdr_reg *r;
	size_t n;
};

/* Opens @pt if it is not open (a device context, protection domain and completion queue) and
 * takes a reference. Return: 0, or -errno (sticky: a port that failed once stays unusable). */
int tpd_gdr_port_open(struct gdr_port *pt, char *why, size_t wl);
/* Drops a reference taken by tpd_gdr_port_open(); the last one closes the device. */
void tpd_gdr_port_put(struct gdr_port *pt);

/* -EOPNOTSUPP unless every segment is registrable (shared buffers and CUDA memory). */
int tpd_gdrreg_applicable(const struct tpd_stripe_seg *segs, size_t n, char *why, size_t wl);

/*
 * tpd_gdrreg_make() - registrations for every non-empty segment of @segs, on the port nearest
 * their GPU (host memory: round-robin): from the cache where a cached region holds the segment,
 * else registered now (and cached, for shared buffers and CUDA allocations, within the
 * rdma-cache budget). Return: 0, or -errno (reason in @why) with nothing held.
 */
int tpd_gdrreg_make(struct tpd_gdr *g, const struct tpd_stripe_seg *segs, size_t n,
		    struct gdr_regs *rg, char *why, size_t wl);
/* Releases what tpd_gdrreg_make() took (if it ran): regions leave or stay in the cache. */
void tpd_gdrreg_free(struct gdr_regs *rg);
/* Drops every cached region (the daemon stops; no transfer may be running). */
void tpd_gdrreg_cache_stop(struct tpd_gdr *g);

#endif /* HAVE_RDMA */
#endif
