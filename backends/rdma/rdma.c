/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * rdma channel: tensors between hosts whose bytes are in shared buffers on both sides, moved by
 * RDMA writes from the writer's daemon into the reader's registered allocation (link.c runs
 * them, on the ibverbs layer of backends/verbs). Viable with rdma-core in the build and an
 * active RDMA port at run time; no CUDA driver needed. Private memory cannot be registered by
 * the daemon, so such tensors keep to mpt. It has no copy op; its context in the op table is
 * the daemon's RDMA context (rdma.h: ports, event fd, progress, forget), which serves
 * cuda_gdr too, and its endpoints are the peer links' RDMA states: opened with the link's
 * callbacks they set the link up (ep_msg, ep_query), start and cancel the sender's RDMA writes,
 * prepare and release the receiver's registration and offer, and a started receive learns its
 * end from recv_expect.
 */
#include <errno.h>
#include <stdio.h>
#include "tpconfig.h"
#include "../tpb.h"
#include "../tpb_int.h"
#include "rdma.h"
#if HAVE_RDMA
#include "tpv.h"
#endif

/* Probes the RDMA ports. */
static int rdma_probe_now(char *why, size_t why_len)
{
#if HAVE_RDMA
	const struct tpv_ops *ops = tpv_ops_load(why, why_len);

	return ops ? tpv_probe(ops, why, why_len) : 0;
#else
	snprintf(why, why_len, "tpipd was built without RDMA support (rdma-core)");
	return 0;
#endif
}

/* One probe per registry round: rdma and cuda_gdr both ask (they used to probe twice). */
int tpb_rdma_viable(char *why, size_t why_len)
{
	static unsigned round;
	static bool probed;
	static int viable;
	static char reason[128];

	if (!probed || round != tpb_probe_round) {
		reason[0] = '\0';
		viable = rdma_probe_now(reason, sizeof(reason));
		round = tpb_probe_round;
		probed = true;
	}
	snprintf(why, why_len, "%s", reason);
	return viable;
}

static int rdma_probe(const struct tpb_config *cfg, char *why, size_t why_len)
{
	return tpb_rdma_viable(why, why_len);
}

/* The daemon's RDMA context (link.c), for rdma and cuda_gdr alike. */
static int rdma_ctx_new(const struct tpb_channel_ops *self, const struct tpb_config *cfg,
			const struct tpb_engine *engine, struct tpb_ctx **ret)
{
	struct tpb_rdma *g;
	int r;

	if (!cfg || !cfg->rdma)
		return -EOPNOTSUPP;
	r = tpb_rdma_ctx_new(cfg->rdma, &g);
	if (r < 0)
		return r;
	*ret = tpb_rdma_ctx(g);
	return 0;
}

static void rdma_ctx_free(struct tpb_ctx *ctx)
{
	tpb_rdma_ctx_free(tpb_rdma_of(ctx));
}

static int rdma_event_fd(struct tpb_ctx *ctx)
{
	return tpb_rdma_event_fd(tpb_rdma_of(ctx));
}

static int rdma_progress(struct tpb_ctx *ctx)
{
	return tpb_rdma_progress(tpb_rdma_of(ctx));
}

static int rdma_forget(struct tpb_ctx *ctx, const struct tpb_mem *m, uint64_t len)
{
	return tpb_rdma_forget_mem(tpb_rdma_of(ctx), m, len);
}

const struct tpb_channel_ops tpb_rdma_ops = {
	.name = "rdma",
	.caps = TPB_CAP_HOST_MEM | TPB_CAP_CROSS_HOST | TPB_CAP_SRC_LOCAL | TPB_CAP_DST_LOCAL,
	.probe = rdma_probe,
	.copy = NULL,
	.ctx_new = rdma_ctx_new,
	.ctx_free = rdma_ctx_free,
	.ep_open = tpb_rdma_ep_open,
	.ep_close = tpb_rdma_ep_close,
	.start = tpb_rdma_ep_start,
	.cancel = tpb_rdma_ep_cancel,
	.prepare = tpb_rdma_ep_prepare,
	.release = tpb_rdma_op_release,
	.recv_expect = tpb_rdma_ep_recv_expect,
	.ep_query = tpb_rdma_ep_query,
	.ep_msg = tpb_rdma_ep_msg,
	.offer_max = tpb_rdma_offer_max,
	.event_fd = rdma_event_fd,
	.progress = rdma_progress,
	.forget = rdma_forget,
};
