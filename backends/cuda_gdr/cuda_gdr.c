/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The cuda_gdr channel: CUDA memory between hosts by RDMA writes straight from and into the
 * daemon's mappings of client allocations (GPUDirect RDMA). This folder holds its registry
 * entry, its probe (a CUDA driver and an active RDMA port), its op-table row and the CUDA side
 * of a registration (tpb_cuda_gdr_range()); its endpoints are the peer links' RDMA states on
 * the rdma context's second head (tpb_rdma_gdr_ctx()), whose transfers run in backends/rdma
 * (link.c, reg.c, ep.c) over the verbs layer (backends/verbs/). Mappings and device contexts
 * are the CUDA layer's (backends/cuda/).
 */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>
#include "../cuda/cuda_int.h"
#include "../rdma/rdma.h"

#if HAVE_CUDA

/* ---- for RDMA (cuda_gdr): the daemon's mapping as registrable memory ---- */

int tpb_cuda_gdr_range(const struct tpb_mem *m, bool export, struct tpb_cuda_range *ret,
		       char *why, size_t wl)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), end;
	int fd = -EBADF, r;

	if (m->loc != TPB_LOC_CUDA || !m->cuda)
		return -EINVAL;
	r = tpb_cuda_map_open(m->cuda, why, wl);
	if (r == 0)
		r = tpb_cuda_dev_enter(m->cuda->dev, why, wl);
	if (r < 0)
		return r;
	ret->ptr = m->cuda->ptr + m->addr;
	ret->base = m->cuda->ptr & ~(page - 1);
	end = (m->cuda->ptr + m->cuda->size + page - 1) & ~(page - 1);
	ret->len = end - ret->base;
	/* Only the mapping itself, never rounded past its end: a range of whole pages. */
	if (export && ret->base == m->cuda->ptr && ret->len == m->cuda->size &&
	    api()->cuMemGetHandleForAddressRange &&
	    api()->cuMemGetHandleForAddressRange(&fd, ret->base, ret->len,
						 CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) !=
		    CUDA_SUCCESS)
		fd = -EBADF; /* registration falls back to the virtual address (peer memory) */
	ret->dmabuf_fd = fd;
	return 0;
}

const uint8_t *tpb_cuda_gdr_handle(const struct tpb_mem *m)
{
	return m && m->loc == TPB_LOC_CUDA && m->cuda ? m->cuda->handle : NULL;
}

int tpb_cuda_gdr_poll_open(const struct tpb_mem *m, char *why, size_t wl)
{
	int r;

	if (m->loc != TPB_LOC_CUDA || !m->cuda)
		return 1;
	if (__atomic_load_n(&m->cuda->state, __ATOMIC_ACQUIRE) == 0) {
		/* cuIpcOpenMemHandle may block: never on the loop, poll again later */
		tpb_cuda_map_open_bg(m->cuda);
		return 0;
	}
	r = tpb_cuda_map_open(m->cuda, why, wl);
	return r < 0 ? r : 1;
}

#else /* !HAVE_CUDA */

int tpb_cuda_gdr_range(const struct tpb_mem *m, bool export, struct tpb_cuda_range *ret,
		       char *why, size_t wl)
{
	snprintf(why, wl, "tpipd was built without CUDA support");
	return -EOPNOTSUPP;
}

const uint8_t *tpb_cuda_gdr_handle(const struct tpb_mem *m)
{
	return NULL;
}

int tpb_cuda_gdr_poll_open(const struct tpb_mem *m, char *why, size_t wl)
{
	return 1;
}

#endif

static int gdr_probe(const struct tpb_config *cfg, char *why, size_t why_len)
{
	char cuda_why[128];

	if (!tpb_cuda_available(cuda_why, sizeof(cuda_why))) {
		snprintf(why, why_len, "%s", cuda_why);
		return 0;
	}
	return tpb_rdma_viable(why, why_len);
}

const struct tpb_channel_ops tpb_cuda_gdr_ops = {
	.name = "cuda_gdr",
	/* CUDA memory on one side at least; the other side CUDA or a shared buffer (registered). */
	.caps = TPB_CAP_CROSS_HOST | TPB_CAP_SRC_LOCAL | TPB_CAP_SRC_CUDA | TPB_CAP_DST_LOCAL |
		TPB_CAP_DST_CUDA | TPB_CAP_NEEDS_CUDA,
	.probe = gdr_probe,
	.copy = NULL,
	/* Its endpoints: a peer link's RDMA state, on rdma's context (its second head,
	 * tpb_rdma_gdr_ctx(): made, polled and freed as rdma's, so no ctx_new here). */
	.ep_open = tpb_rdma_ep_open,
	.ep_close = tpb_rdma_ep_close,
	.prepare = tpb_rdma_ep_prepare,
	.release = tpb_rdma_op_release,
	.recv_expect = tpb_rdma_ep_recv_expect,
	.start = tpb_rdma_ep_start,
	.cancel = tpb_rdma_ep_cancel,
	.ep_query = tpb_rdma_ep_query,
	.ep_msg = tpb_rdma_ep_msg,
	.offer_max = tpb_rdma_offer_max,
};
