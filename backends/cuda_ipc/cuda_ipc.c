/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The cuda_ipc channel: copies on one host between client CUDA memory (IPC handles the daemon
 * maps, backends/cuda/cudamap.c) and CUDA memory, mappings the daemon holds (shared buffers) or
 * a client's address space (CMA through pinned buffers, double buffered). Copies run on the
 * copy thread that claimed them, on that thread's own stream for the device, once the clients'
 * events have completed (waited for on the host, never by the stream), and are synchronized
 * before the copy op returns: a completion sent afterwards means
 * the bytes are in place. Devices, streams and the waits are the CUDA layer's (backends/cuda/).
 */
#include <errno.h>
#include <stdint.h>
#include "../cuda/cuda_int.h"

#if HAVE_CUDA

#define PINNED_HALF (4u << 20) /* bytes per half of a thread's pinned buffer */

/*
 * The thread's pinned double buffer (portable: made once, in the context of the first device
 * that needs it) and @dev's events for its halves, made in @dev's context (left current).
 */
static int pinned_get(struct tpb_cuda_thread *t, int dev, char *why, size_t wl)
{
	int r = 0;

	for (int i = 0; r == 0 && i < 2; i++)
		r = tpb_cuda_event_make(dev, &t->half[dev][i], why, wl);
	if (r == 0 && !t->pinned) {
		CUresult cr = api()->cuMemHostAlloc(&t->pinned, 2 * (size_t)PINNED_HALF,
						    CU_MEMHOSTALLOC_PORTABLE);
		if (cr != CUDA_SUCCESS)
			return fail(cr, "cuMemHostAlloc", why, wl);
		t->pinned_dev = dev;
	}
	return r;
}

/* Process memory -> CUDA: CMA into one pinned half while the other half's upload runs. */
static int copy_process_to_cuda(struct tpb_cuda_thread *t, const struct tpb_mem *src, int dev,
				CUdeviceptr dst, uint64_t len, CUstream st, struct tpb_scratch *s)
{
	CUevent *half = t->half[dev];
	int r = pinned_get(t, dev, s->why, sizeof(s->why));

	for (uint64_t off = 0, i = 0; r == 0 && off < len; off += PINNED_HALF, i++) {
		size_t n = (size_t)TPU_MIN((uint64_t)PINNED_HALF, len - off);
		char *h = (char *)t->pinned + (i % 2) * PINNED_HALF;
		CUresult cr = CUDA_SUCCESS;

		if (i >= 2 &&
		    (r = tpb_cuda_event_wait(t, dev, half[i % 2], s->why, sizeof(s->why))) < 0)
			break;
		if ((r = tpb_cma_move(src->proc, h, src->addr + off, n, false, s->why,
					 sizeof(s->why))) < 0)
			break;
		if (cr == CUDA_SUCCESS)
			cr = api()->cuMemcpyHtoDAsync(dst + off, h, n, st);
		if (cr == CUDA_SUCCESS)
			cr = api()->cuEventRecord(half[i % 2], st);
		if (cr != CUDA_SUCCESS)
			r = fail(cr, "cuMemcpyHtoDAsync", s->why, sizeof(s->why));
	}
	return r;
}

/* CUDA -> process memory: download the next chunk while CMA writes the previous one. */
static int copy_cuda_to_process(struct tpb_cuda_thread *t, int dev, CUdeviceptr src,
				const struct tpb_mem *dst, uint64_t len, CUstream st,
				struct tpb_scratch *s)
{
	uint64_t n_chunks = (len + PINNED_HALF - 1) / PINNED_HALF;
	CUevent *half = t->half[dev];
	int r = pinned_get(t, dev, s->why, sizeof(s->why));
	CUresult cr = CUDA_SUCCESS;

	for (uint64_t i = 0; r == 0 && i <= n_chunks; i++) {
		if (i < n_chunks) { /* issue chunk i */
			uint64_t off = i * PINNED_HALF;
			size_t n = (size_t)TPU_MIN((uint64_t)PINNED_HALF, len - off);
			cr = api()->cuMemcpyDtoHAsync((char *)t->pinned + (i % 2) * PINNED_HALF,
						      src + off, n, st);
			if (cr == CUDA_SUCCESS)
				cr = api()->cuEventRecord(half[i % 2], st);
		}
		if (cr == CUDA_SUCCESS && i > 0) { /* deliver chunk i - 1 */
			uint64_t off = (i - 1) * PINNED_HALF;
			size_t n = (size_t)TPU_MIN((uint64_t)PINNED_HALF, len - off);
			r = tpb_cuda_event_wait(t, dev, half[(i - 1) % 2], s->why,
						sizeof(s->why));
			if (r == 0)
				r = tpb_cma_move(dst->proc,
						 (char *)t->pinned + ((i - 1) % 2) * PINNED_HALF,
						 dst->addr + off, n, true, s->why, sizeof(s->why));
		}
		if (cr != CUDA_SUCCESS)
			r = fail(cr, "cuMemcpyDtoHAsync", s->why, sizeof(s->why));
	}
	return r;
}

static int copy_issue(struct tpb_cuda_thread *t, const struct tpb_xfer *x,
		      const struct tpb_cuda_side *a, const struct tpb_cuda_side *b, CUstream st,
		      struct tpb_scratch *s)
{
	CUresult cr;

	if (a->cuda && b->cuda && a->dev == b->dev)
		cr = api()->cuMemcpyDtoDAsync(b->ptr, a->ptr, x->len, st);
	else if (a->cuda && b->cuda) {
		tpb_cuda_peer_enable(b->dev, a->dev);
		cr = api()->cuMemcpyPeerAsync(b->ptr, tpb_cuda_devs[b->dev].ctx, a->ptr,
					      tpb_cuda_devs[a->dev].ctx, x->len, st);
	} else if (b->cuda && x->src.loc == TPB_LOC_LOCAL) {
		if (x->src.buf)
			tpb_cuda_buffer_pin(x->src.buf, b->dev);
		cr = api()->cuMemcpyHtoDAsync(b->ptr, (const void *)(uintptr_t)x->src.addr, x->len,
					      st);
	} else if (a->cuda && x->dst.loc == TPB_LOC_LOCAL) {
		if (x->dst.buf)
			tpb_cuda_buffer_pin(x->dst.buf, a->dev);
		cr = api()->cuMemcpyDtoHAsync((void *)(uintptr_t)x->dst.addr, a->ptr, x->len, st);
	}
	else if (b->cuda)
		return copy_process_to_cuda(t, &x->src, b->dev, b->ptr, x->len, st, s);
	else
		return copy_cuda_to_process(t, a->dev, a->ptr, &x->dst, x->len, st, s);
	return cr == CUDA_SUCCESS ? 0 : fail(cr, "cuMemcpyAsync", s->why, sizeof(s->why));
}

static int gated_copy(const struct tpb_xfer *x, struct tpb_scratch *s)
{
	struct tpb_cuda_thread *t = tpb_cuda_thread_state(s);
	struct tpb_cuda_side a, b;
	CUstream st;
	int r, w;

	if (!t)
		return -ENOMEM;
	t->procs[0] = x->src.loc == TPB_LOC_LOCAL ? NULL : x->src.proc;
	t->procs[1] = x->dst.loc == TPB_LOC_LOCAL ? NULL : x->dst.proc;
	r = tpb_cuda_side_open(&x->src, 0, &a, s->why, sizeof(s->why));
	if (r == 0)
		r = tpb_cuda_side_open(&x->dst, 0, &b, s->why, sizeof(s->why));
	if (r == 0 && !a.cuda && !b.cuda)
		return -EOPNOTSUPP;
	if (r == 0)
		r = tpb_cuda_copy_begin(t, &a, &b, &st, s->why, sizeof(s->why));
	if (r < 0)
		return r;
	r = copy_issue(t, x, &a, &b, st, s);
	/* Whatever was queued must be finished before the memory may be reused. */
	w = tpb_cuda_stream_wait(t, tpb_cuda_copy_dev(&a, &b), st, s->why, sizeof(s->why));
	return r < 0 ? r : w;
}

static int cuda_ipc_copy(const struct tpb_xfer *x, struct tpb_scratch *s)
{
	int r;

	tpb_cuda_gate_enter();
	r = gated_copy(x, s);
	tpb_cuda_gate_exit();
	return r;
}

#else /* !HAVE_CUDA */

#define cuda_ipc_copy NULL
#endif

const struct tpb_channel_ops tpb_cuda_ipc_ops = {
	.name = "cuda_ipc",
	.caps = TPB_CAP_SAME_HOST | TPB_CAP_SRC_LOCAL | TPB_CAP_SRC_PROCESS | TPB_CAP_SRC_CUDA |
		TPB_CAP_DST_LOCAL | TPB_CAP_DST_PROCESS | TPB_CAP_DST_CUDA | TPB_CAP_NEEDS_CUDA,
	.probe = tpb_cuda_probe,
	.copy = cuda_ipc_copy,
	TPB_SYNC_OPS, /* its kernel on the daemon's copy threads */
};
