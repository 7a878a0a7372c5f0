/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * CUDA memory in libtpclient: turns a device pointer into a CudaRef (the CUDA IPC handle of the
 * allocation that contains it, the offset in it, the device's PCI bus id and an interprocess
 * event recorded on the caller's stream), copies eager bytes into device memory, and implements
 * tp_cuda_release(). Per context it keeps a bounded cache of IPC handles, keyed by the driver's
 * process-unique buffer id, and a pool of interprocess events per CUDA context. The driver is
 * bound at run time (backends/cuda/tpcuda.h) and called only for contexts that use CUDA memory;
 * a build without CUDA answers -EOPNOTSUPP everywhere. Where CUDA segments go in a Write or a
 * Read is write.c's and read.c's job; mapping the handles is the daemon's.
 *
 * Contexts: every call that needs one runs between cuCtxPushCurrent() and cuCtxPopCurrent() of
 * the memory's own context (cuda_in_context()), so the caller's current context is untouched.
 * Locks: ctx->cuda_lock guards the cache and the pools and is a leaf; driver calls other than
 * cuDeviceGetPCIBusId() (once per device) run without it.
 */
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include "tpconfig.h"
#include "internal.h"
#if HAVE_CUDA
#include "tpcuda.h"
#endif

#define NO_CUDA_BUILD "libtpclient was built without CUDA support"

#if HAVE_CUDA

#define HANDLES_MAX 1024 /* IPC handles cached per context */
#define EVENTS_MAX 1024	 /* interprocess events per CUDA context, idle or in use */

_Static_assert(sizeof(CUipcMemHandle) == TPW_CUDA_HANDLE_BYTES, "CUipcMemHandle size");
_Static_assert(sizeof(CUipcEventHandle) == TPW_CUDA_HANDLE_BYTES, "CUipcEventHandle size");
_Static_assert(TPCUDA_BUS_ID_MAX == TPW_BUS_ID_MAX + 1, "bus id buffer size");

/* One allocation, as the driver describes it; the cache holds those that were exported. */
struct cuda_alloc {
	unsigned long long buffer_id; /* CU_POINTER_ATTRIBUTE_BUFFER_ID: never reused */
	CUdeviceptr base;
	size_t size;
	CUcontext cuctx;
	int ordinal;
	uint64_t used; /* clock of the last use: the least recently used is evicted */
	CUipcMemHandle handle;
	bool dmabuf_tried; /* its dma-buf was handed to the daemon, or could not be */
};

struct cuda_pool;

struct tpc_cuda_event {
	CUevent ev;
	CUipcEventHandle handle; /* computed once */
	CUstream stream;	 /* recorded on, while an operation holds it */
	struct cuda_pool *pool;
	struct tpc_cuda_event *next; /* in the pool's idle list or an operation's list */
};

/* The events of one CUDA context. Never destroyed before the tp_context ends, so the daemon
 * may keep the events it opened for as long as the session lives. */
struct cuda_pool {
	CUcontext cuctx;
	pthread_mutex_t *lock; /* the tp_context's cuda_lock */
	struct tpc_cuda_event *idle;
	size_t n_idle;
	size_t n_events; /* idle, held by operations, or being created */
};

struct cuda_uuid {
	CUuuid id;
	bool known;
};

struct tpc_cuda {
	const struct tpcuda_api *api;
	pthread_mutex_t *lock; /* the tp_context's cuda_lock */
	struct cuda_alloc *allocs;
	size_t n_allocs;
	size_t cap_allocs;
	uint64_t clock;
	bool forgot; /* the cache dropped an allocation the daemon may still have mapped */
	struct cuda_pool **pools;
	size_t n_pools;
	char (*bus_ids)[TPCUDA_BUS_ID_MAX]; /* per ordinal; "" until asked */
	struct cuda_uuid *uuids;	    /* per ordinal, asked with the bus id */
};

/* ---- driver calls -------------------------------------------------------------------------- */

/* Records "<what>: <call>: <NAME> (<text>)" as the thread's error. Return: the -errno. */
static int cuda_fail(const struct tpcuda_api *api, const char *what, const char *call,
		     CUresult res)
{
	char buf[200];
	int r = tpcuda_errno(res);

	tpcuda_why(api, call, res, buf, sizeof(buf));
	return tpc_error(r < 0 ? r : -EIO, "%s: %s", what, buf);
}

static CUresult cuda_attr(const struct tpcuda_api *api, void *data, CUpointer_attribute a,
			  const void *ptr)
{
	return api->cuPointerGetAttribute(data, a, (CUdeviceptr)(uintptr_t)ptr);
}

/*
 * Runs @fn(@arg) with @cuctx as the calling thread's current context: pushed before, popped
 * after, whatever @fn returns. Return: @fn's result, or the push's or the pop's failure.
 */
static int cuda_in_context(const struct tpcuda_api *api, const char *what, CUcontext cuctx,
			   int (*fn)(void *arg), void *arg)
{
	CUcontext popped;
	CUresult res;
	int r;

	res = api->cuCtxPushCurrent(cuctx);
	if (res != CUDA_SUCCESS)
		return cuda_fail(api, what, "cuCtxPushCurrent", res);
	r = fn(arg);
	res = api->cuCtxPopCurrent(&popped);
	if (res != CUDA_SUCCESS && r >= 0)
		r = cuda_fail(api, what, "cuCtxPopCurrent", res);
	return r;
}

/* True if a memory type query that returned @res and @type found no device memory. */
static bool cuda_not_device_type(CUresult res, unsigned int type)
{
	if (res == CUDA_ERROR_INVALID_VALUE)
		return true; /* not allocated, mapped or registered by CUDA */
	return res == CUDA_SUCCESS && type != CU_MEMORYTYPE_DEVICE;
}

static int cuda_not_device(const struct tpc_cuda_mem *m)
{
	return tpc_error(-EINVAL, "%s: %p is not CUDA device memory", m->what, m->data);
}

/* After @res, a failed query of @m's buffer id: why @m cannot be used. */
static int cuda_no_buffer_id(const struct tpcuda_api *api, const struct tpc_cuda_mem *m,
			     CUresult res)
{
	unsigned int type = 0;
	CUresult tr = cuda_attr(api, &type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, m->data);

	if (cuda_not_device_type(tr, type))
		return cuda_not_device(m);
	return cuda_fail(api, m->what, "cuPointerGetAttribute(BUFFER_ID)", res);
}

static int cuda_wrong_device(const struct tpc_cuda_mem *m, int ordinal)
{
	return tpc_error(-EINVAL, "%s: %p is memory of CUDA device %d, not of device %d", m->what,
			 m->data, ordinal, m->device);
}

/*
 * Fills @a->ordinal and @a->cuctx for @m and checks that it is device memory of @m->device
 * and, with @ipc, that CUDA IPC can share it. Needs no current context.
 */
static int cuda_describe(const struct tpcuda_api *api, const struct tpc_cuda_mem *m, bool ipc,
			 struct cuda_alloc *a)
{
	unsigned int type = 0, capable = 0;
	CUresult res;

	res = cuda_attr(api, &type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, m->data);
	if (cuda_not_device_type(res, type))
		return cuda_not_device(m);
	if (res == CUDA_SUCCESS)
		res = cuda_attr(api, &a->ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, m->data);
	if (res == CUDA_SUCCESS)
		res = cuda_attr(api, &a->cuctx, CU_POINTER_ATTRIBUTE_CONTEXT, m->data);
	if (res != CUDA_SUCCESS)
		return cuda_fail(api, m->what, "cuPointerGetAttribute", res);
	if (m->device >= 0 && a->ordinal != m->device)
		return cuda_wrong_device(m, a->ordinal);
	/* A driver that cannot answer: let cuIpcGetMemHandle() decide. */
	if (ipc && cuda_attr(api, &capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
			     m->data) == CUDA_SUCCESS && !capable)
		return tpc_error(-EINVAL, "%s: %p cannot be shared by CUDA IPC (memory from "
				 "cudaMallocAsync pools, cuMemCreate or managed memory): use "
				 "cudaMalloc", m->what, m->data);
	if (!a->cuctx)
		return tpc_error(-EINVAL, "%s: %p belongs to no CUDA context", m->what, m->data);
	return 0;
}

/* Checks that @m lies inside the allocation @a. */
static int cuda_check_range(const struct tpc_cuda_mem *m, const struct cuda_alloc *a)
{
	uintptr_t p = (uintptr_t)m->data;

	if (p < a->base || !tpu_range_ok(p - a->base, m->length, a->size))
		return tpc_error(-ERANGE, "%s: %zu bytes at offset %llu exceed their CUDA "
				 "allocation of %zu bytes", m->what, m->length,
				 (unsigned long long)(p - a->base), a->size);
	return 0;
}

/* Fills @a->base and @a->size and checks that @m lies inside. Context pushed. */
static int cuda_range(const struct tpcuda_api *api, const struct tpc_cuda_mem *m,
		      struct cuda_alloc *a)
{
	CUresult res;

	res = api->cuMemGetAddressRange(&a->base, &a->size, (CUdeviceptr)(uintptr_t)m->data);
	if (res != CUDA_SUCCESS)
		return cuda_fail(api, m->what, "cuMemGetAddressRange", res);
	return cuda_check_range(m, a);
}

/* ---- per-context state --------------------------------------------------------------------- */

static int cuda_state(struct tp_context *ctx, struct tpc_cuda **ret)
{
	const struct tpcuda_api *api = tpcuda_api(NULL, 0);
	struct tpc_cuda *st;

	if (!api)
		return tpc_cuda_check(ctx, false);
	pthread_mutex_lock(&ctx->cuda_lock);
	st = ctx->cuda;
	if (!st && (st = calloc(1, sizeof(*st)))) {
		st->bus_ids = calloc((size_t)api->n_devices, sizeof(*st->bus_ids));
		st->uuids = calloc((size_t)api->n_devices, sizeof(*st->uuids));
		if (st->bus_ids && st->uuids) {
			st->api = api;
			st->lock = &ctx->cuda_lock;
			ctx->cuda = st;
		} else {
			free(st->bus_ids);
			free(st->uuids);
			free(st);
			st = NULL;
		}
	}
	pthread_mutex_unlock(&ctx->cuda_lock);
	if (!st)
		return tpc_error(-ENOMEM, "out of memory");
	*ret = st;
	return 0;
}

/*
 * The PCI bus id of device @ordinal into @cs->bus_id (TPCUDA_BUS_ID_MAX bytes) and, where the
 * driver tells, its UUID into @cs->uuid (MIG instances share a bus id); asked once.
 */
static int cuda_bus_id(struct tpc_cuda *st, const char *what, int ordinal,
		       struct tpc_cuda_seg *cs)
{
	char *buf = cs->bus_id;
	const struct tpcuda_api *api = st->api;
	const char *call = "cuDeviceGet";
	CUresult res = CUDA_SUCCESS;
	CUdevice dev;
	char *id;

	if (ordinal < 0 || ordinal >= api->n_devices)
		return tpc_error(-ENODEV, "%s: CUDA device %d, but the driver sees %d", what,
				 ordinal, api->n_devices);
	pthread_mutex_lock(st->lock);
	id = st->bus_ids[ordinal];
	if (!id[0]) {
		res = api->cuDeviceGet(&dev, ordinal);
		if (res == CUDA_SUCCESS) {
			call = "cuDeviceGetPCIBusId";
			res = api->cuDeviceGetPCIBusId(id, TPCUDA_BUS_ID_MAX, dev);
		}
		id[TPCUDA_BUS_ID_MAX - 1] = '\0';
		if (res != CUDA_SUCCESS)
			id[0] = '\0';
		st->uuids[ordinal].known = res == CUDA_SUCCESS && api->cuDeviceGetUuid &&
					   api->cuDeviceGetUuid(&st->uuids[ordinal].id, dev) ==
						   CUDA_SUCCESS;
	}
	memcpy(buf, id, TPCUDA_BUS_ID_MAX);
	cs->has_uuid = st->uuids[ordinal].known;
	memcpy(cs->uuid, st->uuids[ordinal].id.bytes, sizeof(cs->uuid));
	pthread_mutex_unlock(st->lock);
	if (res != CUDA_SUCCESS)
		return cuda_fail(api, what, call, res);
	if (!buf[0])
		return tpc_error(-EIO, "%s: CUDA device %d has no PCI bus id", what, ordinal);
	return 0;
}

/* ---- IPC handle cache ---------------------------------------------------------------------- */

static struct cuda_alloc *cache_find_locked(struct tpc_cuda *st, unsigned long long id)
{
	for (size_t i = 0; i < st->n_allocs; i++)
		if (st->allocs[i].buffer_id == id)
			return &st->allocs[i];
	return NULL;
}

/* Copies the allocation with buffer id @id into @ret if it is cached. */
static bool cache_get(struct tpc_cuda *st, unsigned long long id, struct cuda_alloc *ret)
{
	struct cuda_alloc *a;

	pthread_mutex_lock(st->lock);
	a = cache_find_locked(st, id);
	if (a) {
		a->used = ++st->clock;
		*ret = *a;
	}
	pthread_mutex_unlock(st->lock);
	return a != NULL;
}

/* A free entry: a new one, or the least recently used one, which is forgotten. */
static struct cuda_alloc *cache_slot_locked(struct tpc_cuda *st)
{
	size_t old = 0;

	if (st->n_allocs == st->cap_allocs && st->cap_allocs < HANDLES_MAX) {
		size_t cap = TPU_MIN(st->cap_allocs ? 2 * st->cap_allocs : 16, (size_t)HANDLES_MAX);
		struct cuda_alloc *n = realloc(st->allocs, cap * sizeof(*n));

		if (n) {
			st->allocs = n;
			st->cap_allocs = cap;
		}
	}
	if (st->n_allocs < st->cap_allocs)
		return &st->allocs[st->n_allocs++];
	st->forgot = true; /* tp_cuda_release() must not trust the cache alone any more */
	if (!st->n_allocs)
		return NULL;
	for (size_t i = 1; i < st->n_allocs; i++)
		if (st->allocs[i].used < st->allocs[old].used)
			old = i;
	return &st->allocs[old];
}

static void cache_put(struct tpc_cuda *st, const struct cuda_alloc *a)
{
	struct cuda_alloc *slot;

	pthread_mutex_lock(st->lock);
	/* Filed already if another thread exported the same allocation meanwhile. */
	if (!cache_find_locked(st, a->buffer_id) && (slot = cache_slot_locked(st))) {
		*slot = *a;
		slot->used = ++st->clock;
	}
	pthread_mutex_unlock(st->lock);
}

/*
 * Removes the allocation with buffer id @id. Return: true and its handle, or false, and in
 * *@ret_forgot whether the cache ever dropped an exported allocation.
 */
static bool cache_take(struct tpc_cuda *st, unsigned long long id, CUipcMemHandle *ret,
		       bool *ret_forgot)
{
	struct cuda_alloc *a;

	pthread_mutex_lock(st->lock);
	a = cache_find_locked(st, id);
	if (a) {
		*ret = a->handle;
		*a = st->allocs[--st->n_allocs];
	}
	*ret_forgot = st->forgot;
	pthread_mutex_unlock(st->lock);
	return a != NULL;
}

/* True once per cached allocation @id: the caller is the one to hand over its dma-buf. */
static bool cache_claim_dmabuf(struct tpc_cuda *st, unsigned long long id)
{
	struct cuda_alloc *a;
	bool claim = false;

	pthread_mutex_lock(st->lock);
	a = cache_find_locked(st, id);
	if (a && !a->dmabuf_tried)
		claim = a->dmabuf_tried = true;
	pthread_mutex_unlock(st->lock);
	return claim;
}

/* ---- event pools --------------------------------------------------------------------------- */

static struct cuda_pool *pool_get_locked(struct tpc_cuda *st, CUcontext cuctx)
{
	struct cuda_pool **n, *pool;

	for (size_t i = 0; i < st->n_pools; i++)
		if (st->pools[i]->cuctx == cuctx)
			return st->pools[i];
	n = realloc(st->pools, (st->n_pools + 1) * sizeof(*n));
	if (!n)
		return NULL;
	st->pools = n;
	pool = calloc(1, sizeof(*pool));
	if (!pool)
		return NULL;
	pool->cuctx = cuctx;
	pool->lock = st->lock;
	st->pools[st->n_pools++] = pool;
	return pool;
}

/* A new interprocess event in @pool and its IPC handle. Context pushed. */
static int event_new(const struct tpcuda_api *api, struct cuda_pool *pool, const char *what,
		     struct tpc_cuda_event **ret)
{
	struct tpc_cuda_event *e = calloc(1, sizeof(*e));
	CUresult res;

	if (!e)
		return tpc_error(-ENOMEM, "out of memory");
	res = api->cuEventCreate(&e->ev, CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS);
	if (res != CUDA_SUCCESS) {
		free(e);
		return cuda_fail(api, what, "cuEventCreate", res);
	}
	res = api->cuIpcGetEventHandle(&e->handle, e->ev);
	if (res != CUDA_SUCCESS) {
		int r = cuda_fail(api, what, "cuIpcGetEventHandle", res);

		/* Nothing else can be done about a failure here: the event is unusable anyway. */
		(void)api->cuEventDestroy(e->ev);
		free(e);
		return r;
	}
	e->pool = pool;
	*ret = e;
	return 0;
}

/*
 * An idle event of @cuctx's pool, else a new one (context pushed), else none (*@ret NULL)
 * once the pool holds EVENTS_MAX events.
 */
static int event_take(struct tpc_cuda *st, CUcontext cuctx, const char *what,
		      struct tpc_cuda_event **ret)
{
	struct tpc_cuda_event *e = NULL;
	struct cuda_pool *pool;
	bool create = false;
	int r;

	pthread_mutex_lock(st->lock);
	pool = pool_get_locked(st, cuctx);
	if (pool && (e = pool->idle)) {
		pool->idle = e->next;
		pool->n_idle--;
	} else if (pool && pool->n_events < EVENTS_MAX) {
		pool->n_events++; /* reserved while it is being created */
		create = true;
	}
	pthread_mutex_unlock(st->lock);
	if (!pool)
		return tpc_error(-ENOMEM, "out of memory");
	*ret = e;
	if (!create)
		return 0;
	r = event_new(st->api, pool, what, ret);
	if (r < 0) {
		pthread_mutex_lock(st->lock);
		pool->n_events--;
		pthread_mutex_unlock(st->lock);
	}
	return r;
}

static void event_idle(struct tpc_cuda_event *e)
{
	struct cuda_pool *pool = e->pool;

	pthread_mutex_lock(pool->lock);
	e->stream = NULL;
	e->next = pool->idle;
	pool->idle = e;
	pool->n_idle++;
	pthread_mutex_unlock(pool->lock);
}

void tpc_cuda_events_put(struct tpc_cuda_event *list)
{
	while (list) {
		struct tpc_cuda_event *e = list;

		list = e->next;
		event_idle(e);
	}
}

/* ---- export -------------------------------------------------------------------------------- */

struct export_job {
	struct tpc_cuda *st;
	const struct tpc_cuda_mem *m;
	bool cached; /* alloc came from the cache: base, size and handle are known */
	struct cuda_alloc alloc;
	struct tpc_cuda_event **events; /* the operation's */
	struct tpc_cuda_event *ev;	/* the segment's; NULL: the stream was synchronized */
};

/* Records an event on the segment's stream, or finds this operation's. Context pushed. */
static int export_event(struct export_job *j)
{
	const struct tpcuda_api *api = j->st->api;
	CUstream stream = (CUstream)j->m->stream;
	struct tpc_cuda_event *e;
	CUresult res;
	int r;

	/* Nothing was queued on the stream since that record: it covers this segment too. */
	for (e = *j->events; e; e = e->next) {
		if (e->pool->cuctx == j->alloc.cuctx && e->stream == stream) {
			j->ev = e;
			return 0;
		}
	}
	r = event_take(j->st, j->alloc.cuctx, j->m->what, &e);
	if (r < 0)
		return r;
	if (!e) { /* every event of the context is in use: wait here instead */
		res = api->cuStreamSynchronize(stream);
		if (res != CUDA_SUCCESS)
			return cuda_fail(api, j->m->what, "cuStreamSynchronize", res);
		return 0;
	}
	res = api->cuEventRecord(e->ev, stream);
	if (res != CUDA_SUCCESS) {
		event_idle(e);
		return cuda_fail(api, j->m->what, "cuEventRecord", res);
	}
	e->stream = stream;
	e->next = *j->events;
	*j->events = e;
	j->ev = e;
	return 0;
}

static int export_in_context(void *arg)
{
	struct export_job *j = arg;
	const struct tpcuda_api *api = j->st->api;
	CUresult res;
	int r;

	if (!j->cached) {
		r = cuda_range(api, j->m, &j->alloc);
		if (r < 0)
			return r;
		res = api->cuIpcGetMemHandle(&j->alloc.handle, j->alloc.base);
		if (res != CUDA_SUCCESS)
			return cuda_fail(api, j->m->what, "cuIpcGetMemHandle", res);
	}
	return export_event(j);
}

/* The allocation behind @j->m, from the cache (one attribute query) or from the driver. */
static int export_lookup(struct export_job *j)
{
	const struct tpcuda_api *api = j->st->api;
	const struct tpc_cuda_mem *m = j->m;
	unsigned long long id = 0;
	CUresult res;

	res = cuda_attr(api, &id, CU_POINTER_ATTRIBUTE_BUFFER_ID, m->data);
	if (res != CUDA_SUCCESS)
		return cuda_no_buffer_id(api, m, res);
	j->cached = cache_get(j->st, id, &j->alloc);
	if (!j->cached) {
		j->alloc = (struct cuda_alloc){ .buffer_id = id };
		return cuda_describe(api, m, true, &j->alloc);
	}
	if (j->alloc.ordinal != m->device)
		return cuda_wrong_device(m, j->alloc.ordinal);
	return cuda_check_range(m, &j->alloc);
}

/* ---- dma-buf for the daemon's RDMA registration ------------------------------------------- */

struct dmabuf_job {
	const struct tpcuda_api *api;
	const struct cuda_alloc *alloc;
	int fd;
};

/* Exports the dma-buf of the whole allocation where the driver documents it: memory of
 * cuMemAlloc in this process, whole pages, a device with DMA_BUF_SUPPORTED. Context pushed. */
static int dmabuf_in_context(void *arg)
{
	struct dmabuf_job *j = arg;
	const struct tpcuda_api *api = j->api;
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	int supported = 0, fd = -1;
	CUdevice dev;

	if (!api->cuMemGetHandleForAddressRange || j->alloc->base % page ||
	    j->alloc->size % page)
		return -EOPNOTSUPP;
	if (api->cuDeviceGet(&dev, j->alloc->ordinal) != CUDA_SUCCESS ||
	    api->cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) !=
		    CUDA_SUCCESS || !supported)
		return -EOPNOTSUPP;
	if (api->cuMemGetHandleForAddressRange(&fd, j->alloc->base, j->alloc->size,
					       CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) !=
		    CUDA_SUCCESS || fd < 0)
		return -EOPNOTSUPP;
	j->fd = fd;
	return 0;
}

/* Sends CudaDmabuf{@a} with @fd (borrowed): fire and forget, ahead of the caller's frame. */
static void dmabuf_send(struct tp_context *ctx, const struct cuda_alloc *a, int fd)
{
	Tpw__V1__CudaDmabuf db = TPW__V1__CUDA_DMABUF__INIT;
	Tpw__V1__ClientMsg msg = TPW__V1__CLIENT_MSG__INIT;
	uint8_t bytes[TPW_CUDA_HANDLE_BYTES];
	bool tell;

	memcpy(bytes, &a->handle, sizeof(bytes));
	db.mem_handle = (ProtobufCBinaryData){ sizeof(bytes), bytes };
	db.size = a->size;
	msg.body_case = TPW__V1__CLIENT_MSG__BODY_CUDA_DMABUF;
	msg.cuda_dmabuf = &db;
	pthread_mutex_lock(&ctx->send_lock);
	pthread_mutex_lock(&ctx->lock);
	tell = !ctx->dead;
	pthread_mutex_unlock(&ctx->lock);
	if (tell)
		tpc_wire_send(ctx, &msg, NULL, 0, fd); /* failure: connection loss */
	pthread_mutex_unlock(&ctx->send_lock);
}

/*
 * Hands the daemon the dma-buf of @j's allocation, once per cached allocation, for a pipe to
 * another host (the daemon registers that memory for RDMA from it). Best effort: where the
 * allocation cannot be exported the daemon registers it its own way, so nothing is reported.
 */
static void export_dmabuf(struct tp_context *ctx, struct export_job *j)
{
	struct dmabuf_job dj = { .api = j->st->api, .alloc = &j->alloc, .fd = -EBADF };
	char what[sizeof(j->m->what)];
	int r;

	if (!j->m->remote || ctx->daemon_minor < TPW_MINOR_CUDA_DMABUF ||
	    !cache_claim_dmabuf(j->st, j->alloc.buffer_id))
		return;
	memcpy(what, j->m->what, sizeof(what));
	r = cuda_in_context(dj.api, what, j->alloc.cuctx, dmabuf_in_context, &dj);
	if (r == 0 && dj.fd >= 0)
		dmabuf_send(ctx, &j->alloc, dj.fd);
	if (dj.fd >= 0)
		close(dj.fd);
}

static void export_fill(const struct export_job *j, struct tpc_cuda_seg *cs, Tpw__V1__Segment *s)
{
	Tpw__V1__CudaRef *ref = &cs->ref;

	tpw__v1__cuda_ref__init(ref);
	memcpy(cs->mem_handle, &j->alloc.handle, TPW_CUDA_HANDLE_BYTES);
	ref->mem_handle = (ProtobufCBinaryData){ TPW_CUDA_HANDLE_BYTES, cs->mem_handle };
	ref->offset = (uint64_t)((uintptr_t)j->m->data - j->alloc.base);
	ref->alloc_size = j->alloc.size;
	ref->pci_bus_id = cs->bus_id;
	ref->device = (uint32_t)j->alloc.ordinal;
	if (cs->has_uuid)
		ref->gpu_uuid = (ProtobufCBinaryData){ TPW_CUDA_UUID_BYTES, cs->uuid };
	if (j->ev) {
		memcpy(cs->event_handle, &j->ev->handle, TPW_CUDA_HANDLE_BYTES);
		ref->event_handle.len = TPW_CUDA_HANDLE_BYTES;
		ref->event_handle.data = cs->event_handle;
	}
	s->length = j->m->length;
	s->loc_case = TPW__V1__SEGMENT__LOC_CUDA;
	s->cuda = ref;
}

int tpc_cuda_export(struct tp_context *ctx, const struct tpc_cuda_mem *m, struct tpc_cuda_seg *cs,
		    Tpw__V1__Segment *s, struct tpc_cuda_event **ret_events)
{
	struct export_job j = { .m = m, .events = ret_events };
	int r;

	r = cuda_state(ctx, &j.st);
	if (r == 0)
		r = export_lookup(&j);
	if (r == 0)
		r = cuda_bus_id(j.st, m->what, j.alloc.ordinal, cs);
	if (r == 0)
		r = cuda_in_context(j.st->api, m->what, j.alloc.cuctx, export_in_context, &j);
	if (r < 0)
		return r;
	if (!j.cached)
		cache_put(j.st, &j.alloc);
	export_dmabuf(ctx, &j);
	export_fill(&j, cs, s);
	return 0;
}

/* ---- copies between host and device memory (eager bytes, staged collectives) -------------- */

struct copy_job {
	const struct tpcuda_api *api;
	const struct tpc_cuda_mem *m;
	const void *src;
	void *dst; /* copy out: host memory */
	int status;
};

/* The copy of @arg (struct copy_job), in its context: host to device, or device to host. */
static int copy_in_ctx(void *arg)
{
	struct copy_job *j = arg;
	const struct tpcuda_api *api = j->api;
	CUstream stream = (CUstream)j->m->stream;
	struct cuda_alloc a = { 0 };
	const char *call = "cuMemcpyHtoDAsync";
	CUresult res;
	int r;

	r = cuda_range(api, j->m, &a);
	if (r < 0)
		return r;
	if (j->dst) {
		call = "cuMemcpyDtoHAsync";
		res = api->cuMemcpyDtoHAsync(j->dst, (CUdeviceptr)(uintptr_t)j->m->data,
					     j->m->length, stream);
	} else {
		res = api->cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)j->m->data, j->src,
					     j->m->length, stream);
	}
	if (res == CUDA_SUCCESS) {
		call = "cuStreamSynchronize";
		res = api->cuStreamSynchronize(stream);
	}
	if (res != CUDA_SUCCESS)
		j->status = cuda_fail(api, j->m->what, call, res);
	return 0;
}

/* Runs @j (a copy in, or out with j->dst) in @j->m's context: tpc_cuda_copy_in()/_out(). */
static int copy_run(struct tp_context *ctx, struct copy_job *j, int *ret_status)
{
	struct cuda_alloc a = { 0 };
	int r;

	*ret_status = 0;
	if (!j->api)
		return tpc_cuda_check(ctx, false);
	r = cuda_describe(j->api, j->m, false, &a);
	if (r == 0)
		r = cuda_in_context(j->api, j->m->what, a.cuctx, copy_in_ctx, j);
	if (r == 0)
		*ret_status = j->status;
	return r;
}

int tpc_cuda_copy_in(struct tp_context *ctx, const struct tpc_cuda_mem *m, const void *src,
		     int *ret_status)
{
	struct copy_job j = { .api = tpcuda_api(NULL, 0), .m = m, .src = src };

	return copy_run(ctx, &j, ret_status);
}

int tpc_cuda_copy_out(struct tp_context *ctx, const struct tpc_cuda_mem *m, void *dst,
		      int *ret_status)
{
	struct copy_job j = { .api = tpcuda_api(NULL, 0), .m = m, .dst = dst };

	return copy_run(ctx, &j, ret_status);
}

/* ---- a user reduction on the device (tp_allreduce_cuda_fn()) ------------------------------- */

struct fold_job {
	const struct tpcuda_api *api;
	const struct tpc_cuda_mem *m;
	void *acc;
	const void *in;
	size_t n, bytes;
	enum tp_dtype dt;
	tp_reduce_cuda_fn fn;
	void *user;
};

/* The fold of @arg (struct fold_job) in the call's context: scratch in, @fn, result out. */
static int fold_in_ctx(void *arg)
{
	struct fold_job *j = arg;
	const struct tpcuda_api *api = j->api;
	CUstream stream = (CUstream)j->m->stream;
	const char *call = "cuMemAlloc";
	CUdeviceptr d = 0;
	CUresult res;

	res = api->cuMemAlloc(&d, 2 * j->bytes);
	if (res == CUDA_SUCCESS) {
		call = "cuMemcpyHtoDAsync";
		res = api->cuMemcpyHtoDAsync(d, j->acc, j->bytes, stream);
	}
	if (res == CUDA_SUCCESS)
		res = api->cuMemcpyHtoDAsync(d + j->bytes, j->in, j->bytes, stream);
	if (res == CUDA_SUCCESS) {
		j->fn((void *)(uintptr_t)d, (const void *)(uintptr_t)(d + j->bytes), j->n, j->dt,
		      j->m->stream, j->user);
		call = "cuMemcpyDtoHAsync";
		res = api->cuMemcpyDtoHAsync(j->acc, d, j->bytes, stream);
	}
	if (res == CUDA_SUCCESS) {
		call = "cuStreamSynchronize";
		res = api->cuStreamSynchronize(stream);
	}
	if (d) {
		/* after the stream (a failed wait: the driver defers the free to the work) */
		CUresult fr = api->cuMemFree(d);

		if (res == CUDA_SUCCESS && fr != CUDA_SUCCESS)
			call = "cuMemFree", res = fr;
	}
	return res == CUDA_SUCCESS ? 0 : cuda_fail(api, j->m->what, call, res);
}

int tpc_cuda_fold(struct tp_context *ctx, const struct tpc_cuda_mem *m, void *acc, const void *in,
		  size_t n, enum tp_dtype dt, tp_reduce_cuda_fn fn, void *user)
{
	struct fold_job j = { .api = tpcuda_api(NULL, 0), .m = m, .acc = acc, .in = in, .n = n,
			      .bytes = n * tp_dtype_size(dt), .dt = dt, .fn = fn, .user = user };
	struct cuda_alloc a = { 0 };
	int r;

	if (!j.api)
		return tpc_cuda_check(ctx, false);
	if (j.bytes == 0)
		return 0;
	r = cuda_describe(j.api, m, false, &a);
	return r < 0 ? r : cuda_in_context(j.api, m->what, a.cuctx, fold_in_ctx, &j);
}

/* ---- release ------------------------------------------------------------------------------- */

static int release_in_context(void *arg)
{
	struct export_job *j = arg;
	const struct tpcuda_api *api = j->st->api;

	if (cuda_range(api, j->m, &j->alloc) < 0)
		return -ENOENT;
	/* Memory CUDA IPC cannot share was never exported: nothing to release. */
	if (api->cuIpcGetMemHandle(&j->alloc.handle, j->alloc.base) != CUDA_SUCCESS)
		return -ENOENT;
	return 0;
}

/*
 * The handle the daemon may have mapped for the allocation containing @m->data, taken out of
 * the cache. Return: 1 and *@ret, 0 if the daemon cannot have it mapped, -errno.
 */
static int release_find(struct tp_context *ctx, const struct tpc_cuda_mem *m,
			CUipcMemHandle *ret)
{
	struct export_job j = { .m = m };
	unsigned long long id = 0;
	bool forgot;
	CUresult res;
	int r;

	r = cuda_state(ctx, &j.st);
	if (r < 0)
		return r;
	res = cuda_attr(j.st->api, &id, CU_POINTER_ATTRIBUTE_BUFFER_ID, m->data);
	if (res != CUDA_SUCCESS)
		return cuda_no_buffer_id(j.st->api, m, res);
	if (cache_take(j.st, id, ret, &forgot))
		return 1;
	r = cuda_describe(j.st->api, m, false, &j.alloc);
	if (r < 0 || !forgot)
		return r;
	/* The cache forgot allocations the daemon may still map: this may be one of them. */
	r = cuda_in_context(j.st->api, m->what, j.alloc.cuctx, release_in_context, &j);
	if (r == -ENOENT)
		return 0;
	if (r == 0)
		*ret = j.alloc.handle;
	return r < 0 ? r : 1;
}

/* Sends CudaRelease{@h}: fire and forget, like BufferRelease. */
static void release_send(struct tp_context *ctx, const CUipcMemHandle *h)
{
	Tpw__V1__CudaRelease rel = TPW__V1__CUDA_RELEASE__INIT;
	Tpw__V1__ClientMsg msg = TPW__V1__CLIENT_MSG__INIT;
	uint8_t bytes[TPW_CUDA_HANDLE_BYTES];
	bool tell;

	memcpy(bytes, h, sizeof(bytes));
	rel.mem_handle = (ProtobufCBinaryData){ sizeof(bytes), bytes };
	msg.body_case = TPW__V1__CLIENT_MSG__BODY_CUDA_RELEASE;
	msg.cuda_release = &rel;
	pthread_mutex_lock(&ctx->send_lock);
	pthread_mutex_lock(&ctx->lock);
	tell = !ctx->dead; /* a daemon that is gone has dropped its mappings */
	pthread_mutex_unlock(&ctx->lock);
	if (tell)
		tpc_wire_send(ctx, &msg, NULL, 0, -EBADF); /* failure: connection loss */
	pthread_mutex_unlock(&ctx->send_lock);
}

/* tp_cuda_release() once the driver is known to be there. */
static int cuda_release(struct tp_context *ctx, void *ptr)
{
	struct tpc_cuda_mem m = { .data = ptr, .device = -1, .what = "tp_cuda_release" };
	CUipcMemHandle h;
	int r;

	r = release_find(ctx, &m, &h);
	if (r > 0)
		release_send(ctx, &h);
	return r < 0 ? r : 0;
}

/* ---- teardown ------------------------------------------------------------------------------ */

struct pool_job {
	const struct tpcuda_api *api;
	struct cuda_pool *pool;
	CUresult res; /* the first failure */
};

static int pool_destroy_in_context(void *arg)
{
	struct pool_job *j = arg;

	for (struct tpc_cuda_event *e = j->pool->idle; e; e = e->next) {
		CUresult res = j->api->cuEventDestroy(e->ev);

		if (res != CUDA_SUCCESS && j->res == CUDA_SUCCESS)
			j->res = res;
	}
	return 0;
}

static void pool_free(struct tp_context *ctx, struct tpc_cuda *st, struct cuda_pool *pool)
{
	struct pool_job j = { .api = st->api, .pool = pool, .res = CUDA_SUCCESS };
	char why[200];
	int r;

	if (pool->n_idle != pool->n_events) {
		/* Operations still hold events (a bug): leak the pool rather than free them. */
		tpc_context_log(ctx, LOG_ERR, "%zu CUDA events still in use at context teardown",
				pool->n_events - pool->n_idle);
		return;
	}
	r = pool->idle ? cuda_in_context(st->api, "context teardown", pool->cuctx,
					 pool_destroy_in_context, &j)
		       : 0;
	if (r < 0) /* e.g. the CUDA context was destroyed first, taking its events along */
		tpc_context_log(ctx, LOG_WARNING, "CUDA events not destroyed: %s", tp_last_error());
	else if (j.res != CUDA_SUCCESS)
		tpc_context_log(ctx, LOG_WARNING, "CUDA events not destroyed: %s",
				tpcuda_why(st->api, "cuEventDestroy", j.res, why, sizeof(why)));
	while (pool->idle) {
		struct tpc_cuda_event *e = pool->idle;

		pool->idle = e->next;
		free(e);
	}
	free(pool);
}

void tpc_cuda_free(struct tp_context *ctx)
{
	struct tpc_cuda *st = ctx->cuda;
	char saved[TPC_ERRMSG_MAX];

	if (!st)
		return;
	snprintf(saved, sizeof(saved), "%s", tp_last_error());
	for (size_t i = 0; i < st->n_pools; i++)
		pool_free(ctx, st, st->pools[i]);
	tpc_error_msg(0, saved); /* teardown leaves the caller's last error alone */
	free(st->pools);
	free(st->allocs);
	free(st->bus_ids);
	free(st->uuids);
	free(st);
	ctx->cuda = NULL;
}

#else /* !HAVE_CUDA */

int tpc_cuda_export(struct tp_context *ctx, const struct tpc_cuda_mem *m, struct tpc_cuda_seg *cs,
		    Tpw__V1__Segment *s, struct tpc_cuda_event **ret_events)
{
	return tpc_error(-EOPNOTSUPP, NO_CUDA_BUILD);
}

int tpc_cuda_copy_in(struct tp_context *ctx, const struct tpc_cuda_mem *m, const void *src,
		     int *ret_status)
{
	*ret_status = 0;
	return tpc_error(-EOPNOTSUPP, NO_CUDA_BUILD);
}

int tpc_cuda_copy_out(struct tp_context *ctx, const struct tpc_cuda_mem *m, void *dst,
		      int *ret_status)
{
	*ret_status = 0;
	return tpc_error(-EOPNOTSUPP, NO_CUDA_BUILD);
}

int tpc_cuda_fold(struct tp_context *ctx, const struct tpc_cuda_mem *m, void *acc, const void *in,
		  size_t n, enum tp_dtype dt, tp_reduce_cuda_fn fn, void *user)
{
	return tpc_error(-EOPNOTSUPP, NO_CUDA_BUILD);
}

void tpc_cuda_events_put(struct tpc_cuda_event *list)
{
}

void tpc_cuda_free(struct tp_context *ctx)
{
}

static int cuda_release(struct tp_context *ctx, void *ptr)
{
	return tpc_error(-EOPNOTSUPP, NO_CUDA_BUILD);
}

#endif /* HAVE_CUDA */

int tpc_cuda_check(struct tp_context *ctx, bool daemon)
{
#if HAVE_CUDA
	char why[TPC_ERRMSG_MAX];

	if (daemon && ctx->daemon_minor < TPW_MINOR_CUDA)
		return tpc_error(-EOPNOTSUPP, "the daemon does not support CUDA memory (it speaks "
				 "protocol %u.%u, CUDA needs %u.%u)", TPW_PROTO_MAJOR,
				 ctx->daemon_minor, TPW_PROTO_MAJOR, TPW_MINOR_CUDA);
	if (!tpcuda_api(why, sizeof(why)))
		return tpc_error(-EOPNOTSUPP, "%s", why);
	return 0;
#else
	return tpc_error(-EOPNOTSUPP, NO_CUDA_BUILD);
#endif
}

TP_EXPORT int tp_cuda_release(struct tp_context *ctx, void *ptr)
{
	int r;

	if (!ctx || !ptr)
		return tpc_error(-EINVAL, "missing context or pointer");
	r = tpc_cuda_check(ctx, false);
	return r < 0 ? r : cuda_release(ctx, ptr);
}
