/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The CUDA layer under the channels cuda_ipc, cuda_basic and cuda_gdr (each in its own folder,
 * backends/cuda_ipc/, backends/cuda_basic/, backends/cuda_gdr/): the devices' primary contexts
 * and peer access, opening the client IPC handles the daemon maps (the table is cudamap.c),
 * each copy or stripe thread's CUDA state (a stream per device, pinned buffers, events) and
 * the steps every CUDA copy takes: open its sides, enter the device that runs it, wait for the
 * clients' events, and wait for the stream before the copy returns, giving up when a client
 * exits. Not responsible for moving bytes: the channels are.
 *
 * The daemon touches only the devices a transfer names: a device's primary context is retained
 * the first time a copy needs it, never at start-up.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <time.h>
#include "../base/buffer.h"
#include "cuda_int.h"
#include "log.h"

#if HAVE_CUDA

static pthread_mutex_t devs_lock = PTHREAD_MUTEX_INITIALIZER;
struct tpb_cuda_dev tpb_cuda_devs[DEVS_MAX];

/* The copies inside the gate (devs_lock), and whether this thread is one of them: a context is
 * reset only when none is, since the reset frees the mappings, streams and events they use. */
static unsigned gate_users;
static pthread_cond_t gate_idle = PTHREAD_COND_INITIALIZER;
static __thread bool gate_held;

int tpb_cuda_available(char *why, size_t why_len)
{
	return tpcuda_api(why, why_len) != NULL;
}

int tpb_cuda_dev_poison(CUresult r, const char *call, char *why, size_t wl)
{
	char cause[200];
	CUcontext cur = NULL;
	int dev = -1;

	tpcuda_why(api(), call, r, cause, sizeof(cause));
	api()->cuCtxGetCurrent(&cur);
	pthread_mutex_lock(&devs_lock);
	for (int d = 0; cur && d < DEVS_MAX && dev < 0; d++)
		if (tpb_cuda_devs[d].ctx == cur)
			dev = d;
	if (dev >= 0 && !tpb_cuda_devs[dev].broken) {
		snprintf(tpb_cuda_devs[dev].cause, sizeof(tpb_cuda_devs[dev].cause), "%s", cause);
		__atomic_store_n(&tpb_cuda_devs[dev].broken, true, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&devs_lock);
	snprintf(why, wl, "CUDA device %d: %s, a sticky error: the device's context is reset and "
		 "its mappings re-opened", dev, cause);
	return -EIO;
}

/* Locked: resets @dev's primary context after a sticky error. Everything made in it is gone:
 * its generation moves on, so mappings and per-thread handles are made again on next use. */
static CUresult dev_reset(int dev)
{
	CUresult r;

	r = api()->cuDevicePrimaryCtxReset((CUdevice)dev);
	if (r != CUDA_SUCCESS)
		return r;
	__atomic_add_fetch(&tpb_cuda_devs[dev].gen, 1, __ATOMIC_RELEASE);
	__atomic_store_n(&tpb_cuda_devs[dev].broken, false, __ATOMIC_RELAXED);
	tpb_cuda_devs[dev].peer = 0;
	for (int d = 0; d < DEVS_MAX; d++)
		tpb_cuda_devs[d].peer &= ~(1ull << dev);
	tpu_log_warn("CUDA device %d: primary context reset after a sticky error", dev);
	return CUDA_SUCCESS;
}

/* The generation of @dev's context (see dev_reset()). */
static unsigned dev_gen(int dev)
{
	return __atomic_load_n(&tpb_cuda_devs[dev].gen, __ATOMIC_ACQUIRE);
}

int tpb_cuda_dev_enter(int dev, char *why, size_t wl)
{
	CUcontext ctx;
	CUresult r = CUDA_SUCCESS;

	if (dev < 0 || dev >= DEVS_MAX)
		return -EINVAL;
	pthread_mutex_lock(&devs_lock);
	if (tpb_cuda_devs[dev].ctx && tpb_cuda_devs[dev].broken && (gate_held || gate_users)) {
		snprintf(why, wl, "CUDA device %d: %s, a sticky error: its context is reset once the "
			 "copies in progress end", dev, tpb_cuda_devs[dev].cause);
		pthread_mutex_unlock(&devs_lock);
		return -EIO;
	}
	if (tpb_cuda_devs[dev].ctx && tpb_cuda_devs[dev].broken &&
	    (r = dev_reset(dev)) != CUDA_SUCCESS) {
		pthread_mutex_unlock(&devs_lock);
		tpcuda_why(api(), "cuDevicePrimaryCtxReset", r, why, wl);
		return -EIO;
	}
	if (!tpb_cuda_devs[dev].ctx) {
		CUdevice d;
		r = api()->cuDeviceGet(&d, dev);
		if (r == CUDA_SUCCESS)
			r = api()->cuDevicePrimaryCtxRetain(&tpb_cuda_devs[dev].ctx, d);
	}
	ctx = tpb_cuda_devs[dev].ctx;
	pthread_mutex_unlock(&devs_lock);
	if (r != CUDA_SUCCESS)
		return fail(r, "cuDevicePrimaryCtxRetain", why, wl);
	r = api()->cuCtxSetCurrent(ctx);
	return r == CUDA_SUCCESS ? 0 : fail(r, "cuCtxSetCurrent", why, wl);
}

/* Locked: a device a sticky error broke, or -1. */
static int dev_broken(void)
{
	for (int d = 0; d < DEVS_MAX; d++)
		if (tpb_cuda_devs[d].ctx && __atomic_load_n(&tpb_cuda_devs[d].broken,
							    __ATOMIC_RELAXED))
			return d;
	return -1;
}

void tpb_cuda_gate_enter(void)
{
	int d;

	pthread_mutex_lock(&devs_lock);
	while ((d = dev_broken()) >= 0) {
		CUresult r;

		if (gate_users) {
			pthread_cond_wait(&gate_idle, &devs_lock);
			continue;
		}
		r = dev_reset(d);
		if (r != CUDA_SUCCESS) {
			char why[200];

			tpcuda_why(api(), "cuDevicePrimaryCtxReset", r, why, sizeof(why));
			tpu_log_err("CUDA device %d: %s; its copies fail until a reset succeeds", d,
				    why);
			break; /* tried: tpb_cuda_dev_enter() answers for it */
		}
	}
	gate_users++;
	gate_held = true;
	pthread_mutex_unlock(&devs_lock);
}

void tpb_cuda_gate_exit(void)
{
	pthread_mutex_lock(&devs_lock);
	if (gate_held && --gate_users == 0)
		pthread_cond_broadcast(&gate_idle);
	gate_held = false;
	pthread_mutex_unlock(&devs_lock);
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

/*
 * The device with @m's UUID. MIG instances of one GPU share its PCI bus id, and a process sees
 * only the instances it was given: a client's device that the daemon cannot see is refused
 * here, clearly, rather than mapped on whatever device holds that bus id.
 */
static int dev_by_uuid(const struct tpb_cuda_map *m, int *ret, char *why, size_t wl)
{
	const uint8_t *u = m->uuid;

	for (int d = 0; d < api()->n_devices && d < DEVS_MAX; d++) {
		CUdevice cd;
		CUuuid id;

		if (api()->cuDeviceGet(&cd, d) == CUDA_SUCCESS &&
		    api()->cuDeviceGetUuid(&id, cd) == CUDA_SUCCESS &&
		    memcmp(id.bytes, u, sizeof(m->uuid)) == 0) {
			*ret = d;
			return 0;
		}
	}
	snprintf(why, wl,
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x "
		 "(bus %s) not visible to tpipd: MIG instance or CUDA_VISIBLE_DEVICES?",
		 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
		 u[13], u[14], u[15], m->bus_id);
	return -ENODEV;
}

/* The daemon's ordinal of @m's device: by UUID where the client sent one and the driver
 * can tell, else by PCI bus id. */
static int map_dev(struct tpb_cuda_map *m)
{
	if (m->has_uuid && api()->cuDeviceGetUuid)
		return dev_by_uuid(m, &m->dev, m->why, sizeof(m->why));
	return dev_by_bus(m->bus_id, &m->dev, m->why, sizeof(m->why));
}

int tpb_cuda_map_open(struct tpb_cuda_map *m, char *why, size_t wl)
{
	int r = 0;

	pthread_mutex_lock(&m->open_lock);
	if (m->state == 1 && __atomic_load_n(&tpb_cuda_devs[m->dev].broken, __ATOMIC_RELAXED))
		tpb_cuda_dev_enter(m->dev, why, wl); /* resets it: the mapping is gone */
	if (m->state != 0 && m->dev >= 0 && m->gen != dev_gen(m->dev))
		m->state = 0; /* the device was reset since: the mapping went with its context */
	if (m->state == 0) {
		CUresult cr;

		r = tpb_cuda_available(m->why, sizeof(m->why)) ? 0 : -EOPNOTSUPP;
		if (r == 0)
			r = map_dev(m);
		if (r == 0)
			r = tpb_cuda_dev_enter(m->dev, m->why, sizeof(m->why));
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
		if (m->dev >= 0)
			m->gen = dev_gen(m->dev);
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
	char why[256];
	CUresult r;

	if (m->gen != dev_gen(m->dev) || tpb_cuda_dev_enter(m->dev, why, sizeof(why)) < 0)
		return; /* a reset of the device closed it already */
	if (m->event)
		r = api()->cuEventDestroy((CUevent)m->ev);
	else
		r = api()->cuIpcCloseMemHandle((CUdeviceptr)m->ptr);
	if (tpcuda_sticky(r)) /* the next use of the device resets it */
		tpb_cuda_dev_poison(r, m->event ? "cuEventDestroy" : "cuIpcCloseMemHandle", why,
				    sizeof(why));
}

struct tpb_cuda_thread *tpb_cuda_thread_state(struct tpb_scratch *s)
{
	if (!s->cuda) {
		struct tpb_cuda_thread *t = calloc(1, sizeof(*t));
		if (t) {
			t->pinned_dev = -1;
			t->reg_dev = -1;
		}
		s->cuda = t;
	}
	return s->cuda;
}

/* This thread's stream on @dev, whose context is current. */
static int thread_stream(struct tpb_cuda_thread *t, int dev, CUstream *ret, char *why, size_t wl)
{
	if (!t->stream[dev]) {
		CUresult r = api()->cuStreamCreate(&t->stream[dev], CU_STREAM_NON_BLOCKING);
		if (r != CUDA_SUCCESS)
			return fail(r, "cuStreamCreate", why, wl);
	}
	*ret = t->stream[dev];
	return 0;
}

int tpb_cuda_side_open(const struct tpb_mem *m, uint64_t off, struct tpb_cuda_side *sd,
		       char *why, size_t wl)
{
	int r;

	*sd = (struct tpb_cuda_side){ .cuda = m->loc == TPB_LOC_CUDA, .dev = -1 };
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

int tpb_cuda_copy_dev(const struct tpb_cuda_side *a, const struct tpb_cuda_side *b)
{
	return b->cuda ? b->dev : a->dev;
}

/* Forgets @t's handles made in @dev's context before a reset (the driver freed them). */
static void thread_sync(struct tpb_cuda_thread *t, int dev)
{
	if (t->gen[dev] == dev_gen(dev))
		return;
	t->stream[dev] = NULL;
	t->done[dev] = NULL;
	t->half[dev][0] = t->half[dev][1] = NULL;
	if (t->pinned_dev == dev)
		t->pinned = NULL;
	if (t->reg_dev == dev)
		t->reg = NULL;
	t->gen[dev] = dev_gen(dev);
}

static bool proc_gone(const struct tpb_proc *p)
{
	return p && !tpb_proc_alive(p);
}

/* Polls @ev until it completes: yields for a while, then sleeps in short steps. */
static int event_poll(const struct tpb_cuda_thread *t, CUevent ev, bool clients, char *why,
		      size_t wl)
{
	struct timespec step = { 0, 20000 };

	for (unsigned n = 0;; n++) {
		CUresult r = api()->cuEventQuery(ev);
		if (r == CUDA_SUCCESS)
			return 0;
		if (r != CUDA_ERROR_NOT_READY)
			return fail(r, "cuEventQuery", why, wl);
		if (clients && n % 64 == 63 &&
		    (proc_gone(t->procs[0]) || proc_gone(t->procs[1]))) {
			snprintf(why, wl, "client process %d exited before its CUDA work completed",
				 (int)tpb_proc_pid(proc_gone(t->procs[0]) ? t->procs[0] : t->procs[1]));
			return -ESRCH;
		}
		if (n < 200)
			sched_yield();
		else
			nanosleep(&step, NULL);
	}
}

/*
 * Waits on the host for a client's event @ev (the work queued on its stream before the
 * message), giving up with -ESRCH when a client of the copy exits. The daemon's streams never
 * wait on a client's event on the device: an event recorded by a process that died before its
 * work ran never completes, and the driver's cuIpcCloseMemHandle() first waits for every stream
 * of the context, so one stuck stream would hang the close and every copy behind it.
 */
static int client_event_wait(const struct tpb_cuda_thread *t, CUevent ev, char *why, size_t wl)
{
	return event_poll(t, ev, true, why, wl);
}

/*
 * Waits until @ev, recorded on one of the thread's own streams, completes. Only the daemon's
 * copies are queued there (see client_event_wait()), so it always does, or fails with the
 * device's error; it is not cut short when a client exits, as the copy may still be writing
 * the other client's memory.
 */
int tpb_cuda_event_wait(struct tpb_cuda_thread *t, int dev, CUevent ev, char *why, size_t wl)
{
	return event_poll(t, ev, false, why, wl);
}

int tpb_cuda_copy_begin(struct tpb_cuda_thread *t, const struct tpb_cuda_side *a,
			const struct tpb_cuda_side *b, CUstream *ret, char *why, size_t wl)
{
	int dev = tpb_cuda_copy_dev(a, b), r = 0;

	if (a->wait)
		r = client_event_wait(t, a->wait, why, wl);
	if (r == 0 && b->wait)
		r = client_event_wait(t, b->wait, why, wl);
	if (r == 0)
		r = tpb_cuda_dev_enter(dev, why, wl);
	if (r == 0)
		thread_sync(t, dev);
	if (r == 0)
		r = thread_stream(t, dev, ret, why, wl);
	return r;
}

int tpb_cuda_event_make(int dev, CUevent *ev, char *why, size_t wl)
{
	CUresult cr;
	int r;

	if (*ev)
		return 0;
	r = tpb_cuda_dev_enter(dev, why, wl);
	if (r < 0)
		return r;
	cr = api()->cuEventCreate(ev, CU_EVENT_DISABLE_TIMING);
	return cr == CUDA_SUCCESS ? 0 : fail(cr, "cuEventCreate", why, wl);
}

int tpb_cuda_stream_wait(struct tpb_cuda_thread *t, int dev, CUstream st, char *why, size_t wl)
{
	CUresult cr;
	int r = tpb_cuda_event_make(dev, &t->done[dev], why, wl);

	if (r < 0)
		return r;
	cr = api()->cuEventRecord(t->done[dev], st);
	if (cr != CUDA_SUCCESS)
		return fail(cr, "cuEventRecord", why, wl);
	return tpb_cuda_event_wait(t, dev, t->done[dev], why, wl);
}

static uint64_t pinned_n, pinned_bytes; /* atomic: shared buffers page-locked now */

void tpb_cuda_pin_count(uint64_t *ret_n, uint64_t *ret_bytes)
{
	*ret_n = __atomic_load_n(&pinned_n, __ATOMIC_RELAXED);
	*ret_bytes = __atomic_load_n(&pinned_bytes, __ATOMIC_RELAXED);
}

void tpb_cuda_buffer_pin(struct tpb_buffer *b, int dev)
{
	int st = atomic_load(&b->pin);
	char why[200];
	CUresult r;

	if (st == TPB_PIN_DONE && b->pin_gen == dev_gen(b->pin_dev))
		return;
	if ((st != TPB_PIN_NONE && st != TPB_PIN_DONE) ||
	    !atomic_compare_exchange_strong(&b->pin, &st, TPB_PIN_BUSY))
		return; /* refused before, or another copy is pinning it: this one goes unpinned */
	/* A reset of the pinning device dropped the old registration with its context. */
	r = api()->cuMemHostRegister(b->map, b->size, CU_MEMHOSTREGISTER_PORTABLE);
	if (r == CUDA_SUCCESS || r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) {
		b->pin_dev = dev;
		b->pin_gen = dev_gen(dev);
		b->unpin = tpb_cuda_buffer_unpin;
		if (st == TPB_PIN_NONE) {
			__atomic_add_fetch(&pinned_n, 1, __ATOMIC_RELAXED);
			__atomic_add_fetch(&pinned_bytes, b->size, __ATOMIC_RELAXED);
		}
		atomic_store(&b->pin, TPB_PIN_DONE);
		return;
	}
	atomic_store(&b->pin, TPB_PIN_REFUSED);
	tpcuda_why(api(), "cuMemHostRegister", r, why, sizeof(why));
	tpu_log_info("shared buffer %llu (%llu bytes) stays pageable for GPU copies: %s",
		     (unsigned long long)b->id, (unsigned long long)b->size, why);
}

void tpb_cuda_buffer_unpin_now(struct tpb_buffer *b)
{
	char why[200];

	if (b->pin_gen == dev_gen(b->pin_dev) &&
	    tpb_cuda_dev_enter(b->pin_dev, why, sizeof(why)) == 0 &&
	    b->pin_gen == dev_gen(b->pin_dev))
		api()->cuMemHostUnregister(b->map);
	__atomic_sub_fetch(&pinned_n, 1, __ATOMIC_RELAXED);
	__atomic_sub_fetch(&pinned_bytes, b->size, __ATOMIC_RELAXED);
	munmap(b->map, b->size);
	free(b);
}

void tpb_cuda_peer_enable(int dev, int peer)
{
	int can = 0;

	pthread_mutex_lock(&devs_lock);
	if (!(tpb_cuda_devs[dev].peer & (1ull << peer)) && tpb_cuda_devs[peer].ctx &&
	    api()->cuDeviceCanAccessPeer(&can, dev, peer) == CUDA_SUCCESS && can) {
		CUresult r = api()->cuCtxEnablePeerAccess(tpb_cuda_devs[peer].ctx, 0);
		if (r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
			tpb_cuda_devs[dev].peer |= 1ull << peer;
	}
	pthread_mutex_unlock(&devs_lock);
}

void tpb_cuda_scratch_done(struct tpb_scratch *s)
{
	struct tpb_cuda_thread *t = s ? s->cuda : NULL;

	if (!t)
		return;
	/* Each in the context that made it (the driver wants one current to free host memory). */
	if (t->reg && tpb_cuda_dev_enter(t->reg_dev, s->why, sizeof(s->why)) == 0)
		api()->cuMemHostUnregister(t->reg);
	if (t->pinned && tpb_cuda_dev_enter(t->pinned_dev, s->why, sizeof(s->why)) == 0)
		api()->cuMemFreeHost(t->pinned);
	for (int d = 0; d < DEVS_MAX; d++) {
		thread_sync(t, d);
		if ((!t->stream[d] && !t->done[d] && !t->half[d][0] && !t->half[d][1]) ||
		    tpb_cuda_dev_enter(d, s->why, sizeof(s->why)) < 0)
			continue;
		for (int i = 0; i < 2; i++)
			if (t->half[d][i])
				api()->cuEventDestroy(t->half[d][i]);
		if (t->done[d])
			api()->cuEventDestroy(t->done[d]);
		if (t->stream[d])
			api()->cuStreamDestroy(t->stream[d]);
	}
	free(t);
	s->cuda = NULL;
}

bool tpb_cuda_xfers_wait(const struct tpb_xfer *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if ((x[i].src.loc == TPB_LOC_CUDA && x[i].src.event) ||
		    (x[i].dst.loc == TPB_LOC_CUDA && x[i].dst.event))
			return true;
	return false;
}

/* 1 when @m's client event completed or cannot be waited for, 0 not yet. */
static int side_ready(const struct tpb_mem *m)
{
	char why[256];
	CUresult cr;

	if (m->loc != TPB_LOC_CUDA || !m->event)
		return 1;
	if (tpb_cuda_map_open(m->event, why, sizeof(why)) < 0 ||
	    tpb_cuda_dev_enter(m->event->dev, why, sizeof(why)) < 0)
		return 1; /* the copy fails with the reason */
	cr = api()->cuEventQuery((CUevent)m->event->ev);
	return cr != CUDA_ERROR_NOT_READY;
}

int tpb_cuda_xfers_ready(const struct tpb_xfer *x, size_t n, struct tpb_proc *const procs[2])
{
	for (size_t i = 0; i < n; i++) {
		if (side_ready(&x[i].src) && side_ready(&x[i].dst))
			continue;
		/* A client that exited never completes its work: let the copy fail now. */
		return proc_gone(procs[0]) || proc_gone(procs[1]);
	}
	return 1;
}

int tpb_cuda_event_done(const struct tpb_mem *m, char *why, size_t wl)
{
	CUresult cr;
	int r;

	if (m->loc != TPB_LOC_CUDA || !m->event)
		return 1;
	if (__atomic_load_n(&m->event->state, __ATOMIC_ACQUIRE) == 0) {
		/* opening is a driver call that may block: never on the loop, poll again later */
		tpb_cuda_map_open_bg(m->event);
		return 0;
	}
	r = tpb_cuda_map_open(m->event, why, wl);
	if (r == 0)
		r = tpb_cuda_dev_enter(m->event->dev, why, wl);
	if (r < 0)
		return r;
	cr = api()->cuEventQuery((CUevent)m->event->ev);
	if (cr == CUDA_ERROR_NOT_READY)
		return 0;
	return cr == CUDA_SUCCESS ? 1 : fail(cr, "cuEventQuery", why, wl);
}

/* @attr of device @dev, or @def if the driver does not know it. */
static int dev_attr(int dev, CUdevice_attribute attr, int def)
{
	CUdevice d;
	int v;

	if (api()->cuDeviceGet(&d, dev) != CUDA_SUCCESS ||
	    api()->cuDeviceGetAttribute(&v, attr, d) != CUDA_SUCCESS)
		return def;
	return v;
}

int tpb_cuda_rdma_flush(const struct tpb_mem *m, uint64_t len, char *why, size_t wl)
{
	uint8_t tail[4];
	uint64_t n;
	CUresult cr;
	int r;

	if (m->loc != TPB_LOC_CUDA || !m->cuda || !len)
		return 0;
	r = tpb_cuda_map_open(m->cuda, why, wl);
	if (r == 0)
		r = tpb_cuda_dev_enter(m->cuda->dev, why, wl);
	if (r < 0)
		return r;
	if (dev_attr(m->cuda->dev, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING, 0) >=
	    CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER)
		return 0; /* the device itself orders remote writes before its own work */
	if (api()->cuFlushGPUDirectRDMAWrites &&
	    dev_attr(m->cuda->dev, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS, 0) &
		    CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST) {
		cr = api()->cuFlushGPUDirectRDMAWrites(
			CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
			CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER);
		return cr == CUDA_SUCCESS ? 0 : fail(cr, "cuFlushGPUDirectRDMAWrites", why, wl);
	}
	n = TPU_MIN(len, sizeof(tail)); /* a read through the device waits for earlier writes */
	cr = api()->cuMemcpyDtoH(tail, (CUdeviceptr)(m->cuda->ptr + m->addr + len - n), n);
	return cr == CUDA_SUCCESS ? 0 : fail(cr, "cuMemcpyDtoH (RDMA flush)", why, wl);
}

#else /* !HAVE_CUDA */

bool tpb_cuda_xfers_wait(const struct tpb_xfer *x, size_t n)
{
	return false;
}

int tpb_cuda_xfers_ready(const struct tpb_xfer *x, size_t n, struct tpb_proc *const procs[2])
{
	return 1;
}

void tpb_cuda_pin_count(uint64_t *ret_n, uint64_t *ret_bytes)
{
	*ret_n = *ret_bytes = 0;
}

void tpb_cuda_buffer_unpin_now(struct tpb_buffer *b)
{
	munmap(b->map, b->size);
	free(b);
}

int tpb_cuda_event_done(const struct tpb_mem *m, char *why, size_t wl)
{
	return 1;
}

int tpb_cuda_rdma_flush(const struct tpb_mem *m, uint64_t len, char *why, size_t wl)
{
	return 0;
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

void tpb_cuda_scratch_done(struct tpb_scratch *s)
{
}
#endif

int tpb_cuda_probe(const struct tpb_config *cfg, char *why, size_t why_len)
{
	return tpb_cuda_available(why, why_len);
}
