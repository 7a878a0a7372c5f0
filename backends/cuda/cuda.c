/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The CUDA channels. cuda_ipc copies on one host between client CUDA memory (IPC handles the
 * daemon maps, see cudamap.c) and CUDA memory, mappings the daemon holds (shared buffers) or a
 * client's address space (CMA through pinned buffers, double buffered). Copies run on the copy
 * thread that claimed them, on that thread's own stream for the device, after the clients'
 * events, and are synchronized before the copy op returns: a completion sent afterwards means
 * the bytes are in place. cuda_basic is the cross-host path: the stripe threads stage chunks
 * through their (pinned) bounce buffers with tpb_cuda_stage(). cuda_gdr is viable with a CUDA
 * driver and an active RDMA port; its transfers run in the daemon (backends/rdma/link.c).
 *
 * The daemon touches only the devices a transfer names: a device's primary context is retained
 * the first time a copy needs it, never at start-up.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
#include "tpconfig.h"
#include "cuda_int.h"

#if HAVE_CUDA
#include "tpcuda.h"

#define DEVS_MAX 64
#define PINNED_HALF (4u << 20) /* bytes per half of a thread's pinned buffer */

struct dev {
	CUcontext ctx; /* retained primary context, NULL until first use */
	uint64_t peer; /* bit per device with peer access enabled from this one */
};

static pthread_mutex_t devs_lock = PTHREAD_MUTEX_INITIALIZER;
static struct dev devs[DEVS_MAX];

/* Per copy or stripe thread (tpb_scratch.cuda). */
struct cuda_thread {
	CUstream stream[DEVS_MAX];
	void *pinned; /* 2 * PINNED_HALF, portable */
	CUevent half[2];
	int pinned_dev;
	void *reg; /* the thread's bounce buffer, registered (pinned) once */
	CUevent done; /* recorded behind a copy, polled until it completes */
	struct tpb_proc *procs[2]; /* the clients of the current copy: a wait gives up when one
				    * exits (borrowed for the copy) */
};

int tpb_cuda_available(char *why, size_t why_len)
{
	return tpcuda_api(why, why_len) != NULL;
}

static const struct tpcuda_api *api(void)
{
	return tpcuda_api(NULL, 0);
}

static int fail(CUresult r, const char *call, char *why, size_t wl)
{
	tpcuda_why(api(), call, r, why, wl);
	return tpcuda_errno(r) ? tpcuda_errno(r) : -EIO;
}

/* Makes device @dev's primary context current on this thread (retaining it once). */
static int dev_enter(int dev, char *why, size_t wl)
{
	CUcontext ctx;
	CUresult r = CUDA_SUCCESS;

	if (dev < 0 || dev >= DEVS_MAX)
		return -EINVAL;
	pthread_mutex_lock(&devs_lock);
	if (!devs[dev].ctx) {
		CUdevice d;
		r = api()->cuDeviceGet(&d, dev);
		if (r == CUDA_SUCCESS)
			r = api()->cuDevicePrimaryCtxRetain(&devs[dev].ctx, d);
	}
	ctx = devs[dev].ctx;
	pthread_mutex_unlock(&devs_lock);
	if (r != CUDA_SUCCESS)
		return fail(r, "cuDevicePrimaryCtxRetain", why, wl);
	r = api()->cuCtxSetCurrent(ctx);
	return r == CUDA_SUCCESS ? 0 : fail(r, "cuCtxSetCurrent", why, wl);
}

static int dev_by_bus(const char *bus_id, int *ret, char *why, size_t wl)
{
	CUdevice d;
	CUresult r = api()->cuDeviceGetByPCIBusId(&d, bus_id);

	if (r != CUDA_SUCCESS) {
		snprintf(why, wl, "no CUDA device %s on this host", bus_id);
		return -ENODEV;
	}
	if ((int)d < 0 || (int)d >= DEVS_MAX)
		return -ENODEV;
	*ret = (int)d;
	return 0;
}

int tpb_cuda_map_open(struct tpb_cuda_map *m, char *why, size_t wl)
{
	int r = 0;

	pthread_mutex_lock(&m->open_lock);
	if (m->state == 0) {
		CUresult cr;

		r = tpb_cuda_available(m->why, sizeof(m->why)) ? 0 : -EOPNOTSUPP;
		if (r == 0)
			r = dev_by_bus(m->bus_id, &m->dev, m->why, sizeof(m->why));
		if (r == 0)
			r = dev_enter(m->dev, m->why, sizeof(m->why));
		if (r == 0 && m->event) {
			CUipcEventHandle h;
			memcpy(h.reserved, m->handle, sizeof(h.reserved));
			cr = api()->cuIpcOpenEventHandle((CUevent *)&m->ev, h);
			r = cr == CUDA_SUCCESS ? 0 : fail(cr, "cuIpcOpenEventHandle", m->why,
							    sizeof(m->why));
		} else if (r == 0) {
			CUipcMemHandle h;
			CUdeviceptr p;
			memcpy(h.reserved, m->handle, sizeof(h.reserved));
			cr = api()->cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
			r = cr == CUDA_SUCCESS ? 0 : fail(cr, "cuIpcOpenMemHandle", m->why,
							    sizeof(m->why));
			m->ptr = p;
		}
		__atomic_store_n(&m->state, r == 0 ? 1 : r, __ATOMIC_RELAXED);
	}
	r = m->state == 1 ? 0 : m->state;
	if (r < 0)
		snprintf(why, wl, "%s", m->why);
	pthread_mutex_unlock(&m->open_lock);
	return r;
}

void tpb_cuda_map_close(struct tpb_cuda_map *m)
{
	char why[160];

	if (dev_enter(m->dev, why, sizeof(why)) < 0)
		return;
	if (m->event)
		api()->cuEventDestroy((CUevent)m->ev);
	else
		api()->cuIpcCloseMemHandle((CUdeviceptr)m->ptr);
}

static struct cuda_thread *thread_state(struct tpb_scratch *s)
{
	if (!s->cuda) {
		struct cuda_thread *t = calloc(1, sizeof(*t));
		if (t)
			t->pinned_dev = -1;
		s->cuda = t;
	}
	return s->cuda;
}

/* This thread's stream on @dev, whose context is current. */
static int thread_stream(struct cuda_thread *t, int dev, CUstream *ret, char *why, size_t wl)
{
	if (!t->stream[dev]) {
		CUresult r = api()->cuStreamCreate(&t->stream[dev], CU_STREAM_NON_BLOCKING);
		if (r != CUDA_SUCCESS)
			return fail(r, "cuStreamCreate", why, wl);
	}
	*ret = t->stream[dev];
	return 0;
}

/* A CUDA side of a transfer, opened: device, pointer, event to wait for. */
struct side {
	bool cuda;
	int dev;
	CUdeviceptr ptr;
	CUevent wait;
};

static int side_open(const struct tpb_mem *m, uint64_t off, struct side *sd, char *why, size_t wl)
{
	int r;

	*sd = (struct side){ .cuda = m->loc == TPB_LOC_CUDA, .dev = -1 };
	if (!sd->cuda)
		return 0;
	r = tpb_cuda_map_open(m->cuda, why, wl);
	if (r == 0 && m->event)
		r = tpb_cuda_map_open(m->event, why, wl);
	if (r < 0)
		return r;
	sd->dev = m->cuda->dev;
	sd->ptr = (CUdeviceptr)(m->cuda->ptr + m->addr + off);
	sd->wait = m->event ? (CUevent)m->event->ev : NULL;
	return 0;
}

/* The device whose context and stream run a copy from @a to @b: the destination's if CUDA. */
static int copy_dev(const struct side *a, const struct side *b)
{
	return b->cuda ? b->dev : a->dev;
}

/* Enters the context of the device that runs the copy and waits for both sides' events. */
static int copy_begin(struct cuda_thread *t, const struct side *a, const struct side *b,
		      CUstream *ret, char *why, size_t wl)
{
	int dev = copy_dev(a, b), r;
	CUresult cr = CUDA_SUCCESS;

	r = dev_enter(dev, why, wl);
	if (r == 0)
		r = thread_stream(t, dev, ret, why, wl);
	if (r == 0 && a->wait)
		cr = api()->cuStreamWaitEvent(*ret, a->wait, 0);
	if (r == 0 && cr == CUDA_SUCCESS && b->wait)
		cr = api()->cuStreamWaitEvent(*ret, b->wait, 0);
	if (r == 0 && cr != CUDA_SUCCESS)
		r = fail(cr, "cuStreamWaitEvent", why, wl);
	return r;
}

static bool proc_gone(const struct tpb_proc *p)
{
	return p && !tpb_proc_alive(p);
}

/*
 * Waits until @ev completes: yields for a while, then sleeps in short steps. A copy waits for
 * the clients' own events first, and an event that a client recorded and then died before its
 * work ran may never complete: every millisecond or so the wait checks that both clients are
 * alive and gives up with -ESRCH. The thread's stream on @dev then still holds the stuck wait,
 * so it is abandoned (destroyed; the driver frees it once its work is gone) and the next copy
 * makes a new one.
 */
static int event_wait(struct cuda_thread *t, int dev, CUevent ev, char *why, size_t wl)
{
	struct timespec step = { 0, 20000 };

	for (unsigned n = 0;; n++) {
		CUresult r = api()->cuEventQuery(ev);
		if (r == CUDA_SUCCESS)
			return 0;
		if (r != CUDA_ERROR_NOT_READY)
			return fail(r, "cuEventQuery", why, wl);
		if (n % 64 == 63 && (proc_gone(t->procs[0]) || proc_gone(t->procs[1]))) {
			snprintf(why, wl, "client process %d exited before its CUDA work completed",
				 (int)tpb_proc_pid(proc_gone(t->procs[0]) ? t->procs[0] : t->procs[1]));
			if (t->stream[dev]) {
				api()->cuStreamDestroy(t->stream[dev]);
				t->stream[dev] = NULL;
			}
			return -ESRCH;
		}
		if (n < 200)
			sched_yield();
		else
			nanosleep(&step, NULL);
	}
}

/* Records t->done behind everything queued on @st and waits for it (see event_wait()). */
static int stream_wait(struct cuda_thread *t, int dev, CUstream st, char *why, size_t wl)
{
	CUresult r = CUDA_SUCCESS;

	if (!t->done)
		r = api()->cuEventCreate(&t->done, CU_EVENT_DISABLE_TIMING);
	if (r == CUDA_SUCCESS)
		r = api()->cuEventRecord(t->done, st);
	if (r != CUDA_SUCCESS)
		return fail(r, "cuEventRecord", why, wl);
	return event_wait(t, dev, t->done, why, wl);
}

/* Peer access from @dev (current) to @peer, once, where the hardware allows it. */
static void peer_enable(int dev, int peer)
{
	int can = 0;

	pthread_mutex_lock(&devs_lock);
	if (!(devs[dev].peer & (1ull << peer)) && devs[peer].ctx &&
	    api()->cuDeviceCanAccessPeer(&can, dev, peer) == CUDA_SUCCESS && can) {
		CUresult r = api()->cuCtxEnablePeerAccess(devs[peer].ctx, 0);
		if (r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
			devs[dev].peer |= 1ull << peer;
	}
	pthread_mutex_unlock(&devs_lock);
}

/* The thread's pinned double buffer (made in the current context @dev, portable). */
static int pinned_get(struct cuda_thread *t, char *why, size_t wl)
{
	CUresult r = CUDA_SUCCESS;

	if (!t->pinned)
		r = api()->cuMemHostAlloc(&t->pinned, 2 * (size_t)PINNED_HALF,
					  CU_MEMHOSTALLOC_PORTABLE);
	for (int i = 0; r == CUDA_SUCCESS && i < 2; i++)
		if (!t->half[i])
			r = api()->cuEventCreate(&t->half[i], CU_EVENT_DISABLE_TIMING);
	return r == CUDA_SUCCESS ? 0 : fail(r, "cuMemHostAlloc", why, wl);
}

/* Process memory -> CUDA: CMA into one pinned half while the other half's upload runs. */
static int copy_process_to_cuda(struct cuda_thread *t, const struct tpb_mem *src, int dev,
				CUdeviceptr dst, uint64_t len, CUstream st, struct tpb_scratch *s)
{
	int r = pinned_get(t, s->why, sizeof(s->why));

	for (uint64_t off = 0, i = 0; r == 0 && off < len; off += PINNED_HALF, i++) {
		size_t n = (size_t)TPU_MIN((uint64_t)PINNED_HALF, len - off);
		char *h = (char *)t->pinned + (i % 2) * PINNED_HALF;
		CUresult cr = CUDA_SUCCESS;

		if (i >= 2 && (r = event_wait(t, dev, t->half[i % 2], s->why, sizeof(s->why))) < 0)
			break;
		if ((r = tpb_cma_move(src->proc, h, src->addr + off, n, false, s->why,
					 sizeof(s->why))) < 0)
			break;
		if (cr == CUDA_SUCCESS)
			cr = api()->cuMemcpyHtoDAsync(dst + off, h, n, st);
		if (cr == CUDA_SUCCESS)
			cr = api()->cuEventRecord(t->half[i % 2], st);
		if (cr != CUDA_SUCCESS)
			r = fail(cr, "cuMemcpyHtoDAsync", s->why, sizeof(s->why));
	}
	return r;
}

/* CUDA -> process memory: download the next chunk while CMA writes the previous one. */
static int copy_cuda_to_process(struct cuda_thread *t, int dev, CUdeviceptr src,
				const struct tpb_mem *dst, uint64_t len, CUstream st,
				struct tpb_scratch *s)
{
	uint64_t n_chunks = (len + PINNED_HALF - 1) / PINNED_HALF;
	int r = pinned_get(t, s->why, sizeof(s->why));
	CUresult cr = CUDA_SUCCESS;

	for (uint64_t i = 0; r == 0 && i <= n_chunks; i++) {
		if (i < n_chunks) { /* issue chunk i */
			uint64_t off = i * PINNED_HALF;
			size_t n = (size_t)TPU_MIN((uint64_t)PINNED_HALF, len - off);
			cr = api()->cuMemcpyDtoHAsync((char *)t->pinned + (i % 2) * PINNED_HALF,
						      src + off, n, st);
			if (cr == CUDA_SUCCESS)
				cr = api()->cuEventRecord(t->half[i % 2], st);
		}
		if (cr == CUDA_SUCCESS && i > 0) { /* deliver chunk i - 1 */
			uint64_t off = (i - 1) * PINNED_HALF;
			size_t n = (size_t)TPU_MIN((uint64_t)PINNED_HALF, len - off);
			r = event_wait(t, dev, t->half[(i - 1) % 2], s->why, sizeof(s->why));
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

static int copy_issue(struct cuda_thread *t, const struct tpb_xfer *x, const struct side *a,
		      const struct side *b, CUstream st, struct tpb_scratch *s)
{
	CUresult cr;

	if (a->cuda && b->cuda && a->dev == b->dev)
		cr = api()->cuMemcpyDtoDAsync(b->ptr, a->ptr, x->len, st);
	else if (a->cuda && b->cuda) {
		peer_enable(b->dev, a->dev);
		cr = api()->cuMemcpyPeerAsync(b->ptr, devs[b->dev].ctx, a->ptr, devs[a->dev].ctx,
					      x->len, st);
	} else if (b->cuda && x->src.loc == TPB_LOC_LOCAL)
		cr = api()->cuMemcpyHtoDAsync(b->ptr, (const void *)(uintptr_t)x->src.addr, x->len,
					      st);
	else if (a->cuda && x->dst.loc == TPB_LOC_LOCAL)
		cr = api()->cuMemcpyDtoHAsync((void *)(uintptr_t)x->dst.addr, a->ptr, x->len, st);
	else if (b->cuda)
		return copy_process_to_cuda(t, &x->src, b->dev, b->ptr, x->len, st, s);
	else
		return copy_cuda_to_process(t, a->dev, a->ptr, &x->dst, x->len, st, s);
	return cr == CUDA_SUCCESS ? 0 : fail(cr, "cuMemcpyAsync", s->why, sizeof(s->why));
}

static int cuda_ipc_copy(const struct tpb_xfer *x, struct tpb_scratch *s)
{
	struct cuda_thread *t = thread_state(s);
	struct side a, b;
	CUstream st;
	int r;

	if (!t)
		return -ENOMEM;
	t->procs[0] = x->src.loc == TPB_LOC_LOCAL ? NULL : x->src.proc;
	t->procs[1] = x->dst.loc == TPB_LOC_LOCAL ? NULL : x->dst.proc;
	r = side_open(&x->src, 0, &a, s->why, sizeof(s->why));
	if (r == 0)
		r = side_open(&x->dst, 0, &b, s->why, sizeof(s->why));
	if (r == 0 && !a.cuda && !b.cuda)
		return -EOPNOTSUPP;
	if (r == 0)
		r = copy_begin(t, &a, &b, &st, s->why, sizeof(s->why));
	if (r < 0)
		return r;
	r = copy_issue(t, x, &a, &b, st, s);
	/* Whatever was queued must be finished before the memory may be reused. */
	if (r != -ESRCH || t->stream[copy_dev(&a, &b)]) {
		int w = stream_wait(t, copy_dev(&a, &b), st, s->why, sizeof(s->why));
		r = r < 0 ? r : w;
	}
	return r;
}

/* Pins the thread's bounce buffer once, so that stripe chunks move by DMA. */
static void bounce_register(struct cuda_thread *t, struct tpb_scratch *s)
{
	if (t->reg || !s->bounce || !s->bounce_len)
		return;
	if (api()->cuMemHostRegister(s->bounce, s->bounce_len, CU_MEMHOSTREGISTER_PORTABLE) ==
	    CUDA_SUCCESS)
		t->reg = s->bounce;
}

static int stage_cuda(const struct tpb_mem *m, uint64_t off, void *host, size_t len, bool to_mem,
		      struct tpb_scratch *s, char *why, size_t wl)
{
	struct cuda_thread *t = thread_state(s);
	struct side none = { .dev = -1 }, sd;
	CUstream st;
	CUresult cr;
	int r;

	if (!t)
		return -ENOMEM;
	t->procs[0] = m->proc;
	t->procs[1] = NULL;
	r = side_open(m, off, &sd, why, wl);
	if (r == 0)
		r = copy_begin(t, &none, &sd, &st, why, wl);
	if (r < 0)
		return r;
	bounce_register(t, s);
	cr = to_mem ? api()->cuMemcpyHtoDAsync(sd.ptr, host, len, st) :
		      api()->cuMemcpyDtoHAsync(host, sd.ptr, len, st);
	if (cr != CUDA_SUCCESS)
		return fail(cr, to_mem ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync", why, wl);
	return stream_wait(t, sd.dev, st, why, wl);
}

void tpb_cuda_scratch_done(struct tpb_scratch *s)
{
	struct cuda_thread *t = s ? s->cuda : NULL;

	if (!t)
		return;
	if (t->reg)
		api()->cuMemHostUnregister(t->reg);
	for (int i = 0; i < 2; i++)
		if (t->half[i])
			api()->cuEventDestroy(t->half[i]);
	if (t->done)
		api()->cuEventDestroy(t->done);
	if (t->pinned)
		api()->cuMemFreeHost(t->pinned);
	for (int d = 0; d < DEVS_MAX; d++)
		if (t->stream[d] && dev_enter(d, s->why, sizeof(s->why)) == 0)
			api()->cuStreamDestroy(t->stream[d]);
	free(t);
	s->cuda = NULL;
}

/* ---- for RDMA (cuda_gdr): the daemon's mapping as registrable memory ---- */

int tpb_cuda_rdma_range(const struct tpb_mem *m, struct tpb_cuda_range *ret, char *why,
			size_t wl)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), end;
	int fd = -EBADF, r;

	if (m->loc != TPB_LOC_CUDA || !m->cuda)
		return -EINVAL;
	r = tpb_cuda_map_open(m->cuda, why, wl);
	if (r == 0)
		r = dev_enter(m->cuda->dev, why, wl);
	if (r < 0)
		return r;
	ret->ptr = m->cuda->ptr + m->addr;
	ret->base = m->cuda->ptr & ~(page - 1);
	end = (m->cuda->ptr + m->cuda->size + page - 1) & ~(page - 1);
	ret->len = end - ret->base;
	if (api()->cuMemGetHandleForAddressRange &&
	    api()->cuMemGetHandleForAddressRange(&fd, ret->base, ret->len,
						 CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) !=
		    CUDA_SUCCESS)
		fd = -EBADF; /* registration falls back to the virtual address (peer memory) */
	ret->dmabuf_fd = fd;
	return 0;
}

int tpb_cuda_event_done(const struct tpb_mem *m, char *why, size_t wl)
{
	CUresult cr;
	int r;

	if (m->loc != TPB_LOC_CUDA || !m->event)
		return 1;
	r = tpb_cuda_map_open(m->event, why, wl);
	if (r == 0)
		r = dev_enter(m->event->dev, why, wl);
	if (r < 0)
		return r;
	cr = api()->cuEventQuery((CUevent)m->event->ev);
	if (cr == CUDA_ERROR_NOT_READY)
		return 0;
	return cr == CUDA_SUCCESS ? 1 : fail(cr, "cuEventQuery", why, wl);
}

#else /* !HAVE_CUDA */

int tpb_cuda_rdma_range(const struct tpb_mem *m, struct tpb_cuda_range *ret, char *why,
			size_t wl)
{
	snprintf(why, wl, "tpipd was built without CUDA support");
	return -EOPNOTSUPP;
}

int tpb_cuda_event_done(const struct tpb_mem *m, char *why, size_t wl)
{
	return 1;
}

int tpb_cuda_available(char *why, size_t why_len)
{
	snprintf(why, why_len, "tpipd was built without CUDA support");
	return 0;
}

int tpb_cuda_map_open(struct tpb_cuda_map *m, char *why, size_t why_len)
{
	return -EOPNOTSUPP;
}

void tpb_cuda_map_close(struct tpb_cuda_map *m)
{
}

static int stage_cuda(const struct tpb_mem *m, uint64_t off, void *host, size_t len, bool to_mem,
		      struct tpb_scratch *s, char *why, size_t wl)
{
	return -EOPNOTSUPP;
}

void tpb_cuda_scratch_done(struct tpb_scratch *s)
{
}

#define cuda_ipc_copy NULL
#endif

int tpb_cuda_stage(const struct tpb_mem *m, uint64_t off, void *host, size_t len, bool to_mem,
		   struct tpb_scratch *s, char *why, size_t why_len)
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

static int cuda_probe(const struct tpb_config *cfg, char *why, size_t why_len)
{
	return tpb_cuda_available(why, why_len);
}

static int gdr_probe(const struct tpb_config *cfg, char *why, size_t why_len)
{
	char cuda_why[128];

	if (!tpb_cuda_available(cuda_why, sizeof(cuda_why))) {
		snprintf(why, why_len, "%s", cuda_why);
		return 0;
	}
	return tpb_rdma_viable(why, why_len);
}

const struct tpb_channel_ops tpb_cuda_ipc_ops = {
	.name = "cuda_ipc",
	.caps = TPB_CAP_SAME_HOST | TPB_CAP_SRC_LOCAL | TPB_CAP_SRC_PROCESS | TPB_CAP_SRC_CUDA |
		TPB_CAP_DST_LOCAL | TPB_CAP_DST_PROCESS | TPB_CAP_DST_CUDA | TPB_CAP_NEEDS_CUDA,
	.probe = cuda_probe,
	.copy = cuda_ipc_copy,
	TPB_SYNC_OPS, /* its kernel on the daemon's copy threads */
};

const struct tpb_channel_ops tpb_cuda_basic_ops = {
	.name = "cuda_basic",
	/* CUDA memory on one side at least, staged to or from any CPU memory on the other. */
	.caps = TPB_CAP_CROSS_HOST | TPB_CAP_SRC_LOCAL | TPB_CAP_SRC_PROCESS | TPB_CAP_SRC_CUDA |
		TPB_CAP_DST_LOCAL | TPB_CAP_DST_PROCESS | TPB_CAP_DST_CUDA | TPB_CAP_NEEDS_CUDA,
	.probe = cuda_probe,
	.copy = NULL,
};

const struct tpb_channel_ops tpb_cuda_gdr_ops = {
	.name = "cuda_gdr",
	/* CUDA memory on one side at least; the other side CUDA or a shared buffer (registered). */
	.caps = TPB_CAP_CROSS_HOST | TPB_CAP_SRC_LOCAL | TPB_CAP_SRC_CUDA | TPB_CAP_DST_LOCAL |
		TPB_CAP_DST_CUDA | TPB_CAP_NEEDS_CUDA,
	.probe = gdr_probe,
	.copy = NULL,
};
