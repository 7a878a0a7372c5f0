/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The cuda_basic channel: CUDA memory between hosts over the mpt data connections. The stripe
 * threads (backends/mpt/stripe_io.c) stage each chunk through their (pinned) bounce buffers with
 * tpb_cuda_basic_stage(), which serves host memory too (memcpy, CMA); a CUDA copy runs on the
 * calling thread's own stream (the CUDA layer, backends/cuda/) and is synchronized before it
 * returns. Its registry entry has no copy op: the data connections move the bytes; its
 * endpoint entries are mpt's, on the mpt context's second head (tpb_mpt_cuda_basic_ctx()).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include "../cuda/cuda_int.h"
#include "../mpt/mpt.h"

#if HAVE_CUDA

/* Pins the thread's bounce buffer once (portable; in the current context, @dev's), so that
 * stripe chunks move by DMA. */
static void bounce_register(struct tpb_cuda_thread *t, int dev, struct tpb_scratch *s)
{
	if (t->reg || !s->bounce || !s->bounce_len)
		return;
	if (api()->cuMemHostRegister(s->bounce, s->bounce_len, CU_MEMHOSTREGISTER_PORTABLE) ==
	    CUDA_SUCCESS) {
		t->reg = s->bounce;
		t->reg_dev = dev;
	}
}

static int gated_stage(const struct tpb_mem *m, uint64_t off, void *host, size_t len,
		       bool to_mem, struct tpb_scratch *s, char *why, size_t wl)
{
	struct tpb_cuda_thread *t = tpb_cuda_thread_state(s);
	struct tpb_cuda_side none = { .dev = -1 }, sd;
	CUstream st;
	CUresult cr;
	int r;

	if (!t)
		return -ENOMEM;
	t->procs[0] = m->proc;
	t->procs[1] = NULL;
	r = tpb_cuda_side_open(m, off, &sd, why, wl);
	if (r == 0)
		r = tpb_cuda_copy_begin(t, &none, &sd, &st, why, wl);
	if (r < 0)
		return r;
	bounce_register(t, sd.dev, s);
	cr = to_mem ? api()->cuMemcpyHtoDAsync(sd.ptr, host, len, st) :
		      api()->cuMemcpyDtoHAsync(host, sd.ptr, len, st);
	if (cr != CUDA_SUCCESS)
		return fail(cr, to_mem ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync", why, wl);
	return tpb_cuda_stream_wait(t, sd.dev, st, why, wl);
}

static int stage_cuda(const struct tpb_mem *m, uint64_t off, void *host, size_t len, bool to_mem,
		      struct tpb_scratch *s, char *why, size_t wl)
{
	int r;

	tpb_cuda_gate_enter();
	r = gated_stage(m, off, host, len, to_mem, s, why, wl);
	tpb_cuda_gate_exit();
	return r;
}

#else /* !HAVE_CUDA */

static int stage_cuda(const struct tpb_mem *m, uint64_t off, void *host, size_t len, bool to_mem,
		      struct tpb_scratch *s, char *why, size_t wl)
{
	return -EOPNOTSUPP;
}

#endif

int tpb_cuda_basic_stage(const struct tpb_mem *m, uint64_t off, void *host, size_t len,
			 bool to_mem, struct tpb_scratch *s, char *why, size_t why_len)
{
	void *p = (void *)(uintptr_t)(m->addr + off);

	switch (m->loc) {
	case TPB_LOC_LOCAL:
		if (to_mem)
			memcpy(p, host, len);
		else
			memcpy(host, p, len);
		return 0;
	case TPB_LOC_PROCESS:
		return tpb_cma_move(m->proc, host, m->addr + off, len, to_mem, why, why_len);
	case TPB_LOC_CUDA:
		return stage_cuda(m, off, host, len, to_mem, s, why, why_len);
	case TPB_LOC_REMOTE:
		break; /* another host's memory: never staged here */
	}
	return -EINVAL;
}

const struct tpb_channel_ops tpb_cuda_basic_ops = {
	.name = "cuda_basic",
	/* CUDA memory on one side at least, staged to or from any CPU memory on the other. */
	.caps = TPB_CAP_CROSS_HOST | TPB_CAP_SRC_LOCAL | TPB_CAP_SRC_PROCESS | TPB_CAP_SRC_CUDA |
		TPB_CAP_DST_LOCAL | TPB_CAP_DST_PROCESS | TPB_CAP_DST_CUDA | TPB_CAP_NEEDS_CUDA,
	.probe = tpb_cuda_probe,
	.copy = NULL,
	/* Its endpoints: stripe transfers over a link's data connections, on mpt's context (its
	 * second head, tpb_mpt_cuda_basic_ctx(): made, polled and freed as mpt's, so no ctx_new
	 * here); the stripe threads stage the CUDA segments with tpb_cuda_basic_stage(). */
	.ep_open = tpb_mpt_ep_open,
	.ep_close = tpb_mpt_ep_close,
	.start = tpb_mpt_start,
	.cancel = tpb_mpt_cancel,
	.recv_expect = tpb_mpt_recv_expect,
	.recv_progress = tpb_mpt_recv_progress,
	.recv_stalled = tpb_mpt_recv_stalled,
};
