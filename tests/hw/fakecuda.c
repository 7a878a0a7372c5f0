/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * fakecuda: a stand-in for libcuda.so.1 that lets the hw suite run on a machine without a GPU
 * (`meson test --setup fakecuda --suite hw`, which points TPIPD_CUDA_LIBRARY at it for the
 * test, its clients and its daemon). It exports every driver entry point tpcuda binds, under
 * the same ABI names, and emulates just enough of their meaning to move real bytes between
 * processes: "device memory" is a memfd mapped into the process (a CUdeviceptr is its address,
 * so every copy is a memcpy), an IPC memory handle names the memfd by (pid, fd) and is opened
 * through /proc/PID/fd, an event is a pair of counters (recorded, completed) in a shared
 * mapping that IPC event handles name the same way, and each stream is a worker thread running
 * its queue in order (copies, memsets, host functions, event records and waits); the legacy
 * stream is one more such queue, and the synchronous copies run on it and wait. Devices
 * ($FAKECUDA_DEVICES, default 2) are contexts with an ordinal, a made-up PCI bus id and a UUID
 * that $FAKECUDA_UUID_SALT changes (another MIG instance behind the same bus id). A
 * dma-buf for a device range is the memfd reopened read-only at the range's start (for
 * fakeverbs), exported only for whole pages of an allocation of this process, never for a range
 * imported by IPC; $FAKECUDA_NO_DMABUF=1 makes the device say it exports none.
 * It is as strict as the driver where our code could go wrong on a real GPU: events and streams
 * belong to the context current when they were made (an IPC event to the one it was opened
 * in), and cuEventRecord() of an event on a stream of another context fails with
 * CUDA_ERROR_INVALID_HANDLE (a stream may wait for an event of any context, as the driver
 * allows); calls that make or free something, the synchronous copies and work on the legacy
 * stream need a current context (CUDA_ERROR_INVALID_CONTEXT); cuEventCreate() checks its flags
 * and cuIpcGetEventHandle() refuses an event made without CU_EVENT_INTERPROCESS and
 * CU_EVENT_DISABLE_TIMING; a memory handle opened again in one process returns the same
 * pointer and counts the opens, the last cuIpcCloseMemHandle() unmapping it; a close first waits
 * for all work queued in its context, abandoned streams included, as the driver does (so a
 * close behind a stream stuck on a dead process's event never returns). An exporter that
 * frees its allocation (cuMemFree) or exits invalidates every importer's mapping of it: work
 * that touches a stale mapping, or closing one, raises the sticky CUDA_ERROR_ILLEGAL_ADDRESS
 * on that context, as a real GPU does on a stale access; every later call in the context then
 * fails with it until cuDevicePrimaryCtxReset(), which also ends the context's streams, events
 * and IPC mappings (their handles then fail with CUDA_ERROR_INVALID_HANDLE; work queued before it
 * never runs, and it waits for the copy in flight before unmapping). Other devices are
 * unaffected. $FAKECUDA_FAULT_DIR forces the sticky error: a copy on device N finding the file
 * sticky-N there removes it and raises the error (one shot, across processes).
 * $FAKECUDA_DELAY ("cuIpcOpenMemHandle:3000,cuIpcCloseMemHandle:500", milliseconds) makes
 * those calls slow, as a driver can be: IPC opens and closes, cuEventDestroy of an IPC-opened
 * event, cuMemGetHandleForAddressRange; while one is delayed, $FAKECUDA_FAULT_DIR/pending-CALL
 * exists, so that a test can see it is still pending.
 * $FAKECUDA_DTOH_LOG names a file to which every device-to-host copy that ran (cuMemcpyDtoH,
 * cuMemcpyDtoHAsync) appends a line with its byte count, whatever process made it, so that a
 * test can count how many times device memory was read into host memory.
 * GPUDirect RDMA: the device reports CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING from
 * $FAKECUDA_RDMA_ORDERING (default 0: none, writes must be flushed) and supports
 * cuFlushGPUDirectRDMAWrites() (needs a current context; with $FAKECUDA_NO_RDMA_FLUSH the
 * device says it does not), which, like a synchronous read of device memory (cuMemcpyDtoH),
 * lands the writes fakeverbs holds back under FAKEVERBS_WRITE_LAG.
 * Host memory registration (cuMemHostRegister) keeps the registered ranges as the driver does:
 * one overlapping a registered range is refused (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED),
 * unregistering anything but a registered range's start fails.
 * Not emulated: implicit synchronisation between the legacy stream and blocking streams,
 * timing, limits, and anything the hw suite, libtpclient and tpipd do not call. It proves the
 * plumbing and the ordering logic, not the hardware; tests/hw on a real GPU remains the truth.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cuda.h>

#define FAKE_DEVS_MAX 8
#define MEM_MAGIC 0x464b4d48u /* "FKMH" */
#define EV_MAGIC 0x464b4556u  /* "FKEV" */
#define CTX_MAGIC 0x464b4358u /* "FKCX" */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int n_devs;
static bool inited;

/* ---- contexts -------------------------------------------------------------------------------- */

struct fctx {
	uint32_t magic;
	int ordinal;
	bool peer[FAKE_DEVS_MAX];
	_Atomic CUresult sticky; /* CUDA_SUCCESS, or the error every call in it now fails with */
	atomic_uint gen;	 /* raised by cuDevicePrimaryCtxReset(): older objects are dead */
};

/* The sticky error of @c, if any (a context gone bad stays bad until it is reset). */
static CUresult ctx_sticky(const struct fctx *c)
{
	return c ? atomic_load(&c->sticky) : CUDA_SUCCESS;
}

static struct fctx ctxs[FAKE_DEVS_MAX];
static __thread CUcontext ctx_stack[16];
static __thread int ctx_depth;

static struct fctx *ctx_of(CUcontext c)
{
	struct fctx *f = (struct fctx *)c;

	return f && f >= ctxs && f < ctxs + FAKE_DEVS_MAX && f->magic == CTX_MAGIC ? f : NULL;
}

static struct fctx *ctx_current(void)
{
	return ctx_depth ? ctx_of(ctx_stack[ctx_depth - 1]) : NULL;
}

/* ---- memory registry ------------------------------------------------------------------------ */

struct falloc {
	uintptr_t base;
	size_t size;
	int fd;
	int ordinal;
	unsigned long long id;
	bool imported;
	unsigned long long src_id; /* imported: the exporter's allocation id */
	unsigned refs;		   /* imported: opens not yet closed in this process */
	int src_pid;		   /* imported: the exporter */
	struct falloc *next;
};

static struct falloc *allocs;
static unsigned long long next_id;

struct mem_handle {
	uint32_t magic;
	int32_t pid, fd, ordinal;
	uint64_t size;
	uint64_t id; /* the exporter's allocation id */
};

/* The allocation containing @p, or NULL. Locked. */
static struct falloc *alloc_find(uintptr_t p)
{
	for (struct falloc *a = allocs; a; a = a->next)
		if (p >= a->base && p - a->base < a->size)
			return a;
	return NULL;
}

/* Maps @size bytes of @fd and registers them. Return: CUDA_SUCCESS or an error. */
static CUresult alloc_map(int fd, size_t size, int ordinal, unsigned long long src_id,
			  CUdeviceptr *ret)
{
	struct falloc *a = calloc(1, sizeof(*a));
	void *p = a ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;

	if (p == MAP_FAILED) {
		free(a);
		close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*a = (struct falloc){ .base = (uintptr_t)p, .size = size, .fd = fd, .ordinal = ordinal,
			      .imported = src_id != 0, .src_id = src_id, .refs = 1 };
	pthread_mutex_lock(&lock);
	a->id = ((unsigned long long)getpid() << 24) + ++next_id;
	a->next = allocs;
	allocs = a;
	pthread_mutex_unlock(&lock);
	*ret = (CUdeviceptr)a->base;
	return CUDA_SUCCESS;
}

static CUresult alloc_unmap(CUdeviceptr p, bool imported)
{
	struct falloc **pp, *a = NULL;

	pthread_mutex_lock(&lock);
	for (pp = &allocs; *pp; pp = &(*pp)->next) {
		if ((*pp)->base == (uintptr_t)p && (*pp)->imported == imported) {
			a = *pp;
			if (imported && --a->refs) { /* still open elsewhere in this process */
				pthread_mutex_unlock(&lock);
				return CUDA_SUCCESS;
			}
			*pp = a->next;
			break;
		}
	}
	pthread_mutex_unlock(&lock);
	if (!a)
		return CUDA_ERROR_INVALID_VALUE;
	munmap((void *)a->base, a->size);
	if (!imported && ftruncate(a->fd, 0) < 0) /* importers' mappings are stale now */
		abort();
	close(a->fd);
	free(a);
	return CUDA_SUCCESS;
}

/* Opens fd @fd of process @pid (/proc/PID/fd/FD). */
static int open_remote_fd(int pid, int fd)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
	return open(path, O_RDWR | O_CLOEXEC);
}

/* An imported mapping whose exporter freed the allocation (the memfd was emptied) or exited. */
static bool alloc_stale(const struct falloc *a)
{
	struct stat st;

	if (!a->imported)
		return false;
	if (fstat(a->fd, &st) == 0 && (size_t)st.st_size < a->size)
		return true;
	return kill(a->src_pid, 0) < 0 && errno == ESRCH;
}

/* 1 if [@p, @p + @n) touches an imported mapping, 2 if a stale one, else 0. */
static int range_imported(uintptr_t p, size_t n)
{
	int r = 0;

	pthread_mutex_lock(&lock);
	for (struct falloc *a = allocs; a && r < 2; a = a->next)
		if (a->imported && p < a->base + a->size && a->base < p + n)
			r = alloc_stale(a) ? 2 : 1;
	pthread_mutex_unlock(&lock);
	return r;
}

/* A forced sticky error for a copy on device @ordinal ($FAKECUDA_FAULT_DIR/sticky-N, once). */
static bool fault_forced(int ordinal)
{
	const char *dir = getenv("FAKECUDA_FAULT_DIR");
	char path[512];

	if (!dir || !*dir)
		return false;
	snprintf(path, sizeof(path), "%s/sticky-%d", dir, ordinal);
	return unlink(path) == 0;
}

/* Sleeps as long as $FAKECUDA_DELAY says for @call, with the pending-@call marker meanwhile. */
static void fake_delay(const char *call)
{
	const char *e = getenv("FAKECUDA_DELAY"), *dir = getenv("FAKECUDA_FAULT_DIR");
	size_t n = strlen(call);
	char path[512] = "";
	long ms = 0;

	for (const char *p = e; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
		if (strncmp(p, call, n) == 0 && p[n] == ':')
			ms = strtol(p + n + 1, NULL, 10);
	if (ms <= 0)
		return;
	if (dir && *dir) {
		int fd;
		snprintf(path, sizeof(path), "%s/pending-%s", dir, call);
		fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
		if (fd >= 0)
			close(fd);
	}
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
	if (path[0])
		unlink(path);
}

/* ---- events ------------------------------------------------------------------------------- */

struct ev_shared {
	atomic_ullong recorded;
	atomic_ullong completed;
};

struct fevent {
	uint32_t magic;
	int fd;
	struct ev_shared *sh;
	struct fctx *ctx; /* the context it was created or opened in */
	unsigned gen;	  /* @ctx's generation then */
	unsigned flags;	  /* CU_EVENT_* */
	bool imported;	  /* opened from an IPC handle */
	struct fevent *all; /* every event ever made, kept (see cuEventDestroy()) */
};

/* The stand-in never frees events and streams (work still queued may name them), nor what a
 * context reset ended: it keeps them all listed, so that a leak checker sees them reachable. */
static struct fevent *all_events;
static pthread_mutex_t all_lock = PTHREAD_MUTEX_INITIALIZER; /* a leaf */

struct ev_handle {
	uint32_t magic;
	int32_t pid, fd;
};

static struct fevent *ev_of(CUevent e)
{
	struct fevent *f = (struct fevent *)e;

	return f && f->magic == EV_MAGIC && atomic_load(&f->ctx->gen) == f->gen ? f : NULL;
}

static CUresult ev_map(int fd, struct fctx *ctx, unsigned flags, CUevent *ret)
{
	struct fevent *e = calloc(1, sizeof(*e));
	void *p = e ? mmap(NULL, sizeof(struct ev_shared), PROT_READ | PROT_WRITE, MAP_SHARED,
			   fd, 0) : MAP_FAILED;

	if (p == MAP_FAILED) {
		free(e);
		close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*e = (struct fevent){ .magic = EV_MAGIC, .fd = fd, .sh = p, .ctx = ctx, .flags = flags,
			      .gen = atomic_load(&ctx->gen) };
	pthread_mutex_lock(&all_lock);
	e->all = all_events;
	all_events = e;
	pthread_mutex_unlock(&all_lock);
	*ret = (CUevent)e;
	return CUDA_SUCCESS;
}

static void nap(void)
{
	struct timespec ts = { 0, 100000L };

	nanosleep(&ts, NULL);
}

/* Waits until the record numbered @target of @e completed (0: never recorded). */
static void ev_wait(struct fevent *e, unsigned long long target)
{
	while (atomic_load(&e->sh->completed) < target)
		nap();
}

/* ---- streams ------------------------------------------------------------------------------ */

enum job_kind { JOB_COPY, JOB_SET, JOB_HOST, JOB_RECORD, JOB_WAIT };

struct job {
	enum job_kind kind;
	void *dst;
	const void *src;
	size_t n;
	int value;
	CUhostFn fn;
	void *arg;
	struct fevent *ev;
	unsigned long long seq;
	bool dtoh;	  /* JOB_COPY from device to host memory: counted (dtoh_note()) */
	struct fctx *ctx; /* on the legacy stream: the context current when queued */
	unsigned gen;	  /* @ctx's generation when queued: a reset since drops the work */
	struct job *next;
};

/* Held shared while a job touches memory, exclusively while a reset unmaps: like the driver,
 * a reset never frees memory under work in flight, and work queued before it never runs. */
static pthread_rwlock_t run_lock = PTHREAD_RWLOCK_INITIALIZER;

struct fstream {
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct job *head, *tail;
	unsigned long long queued, done;
	bool stop;
	struct fctx *ctx; /* the context it was created in */
	unsigned gen;	  /* @ctx's generation then */
	struct fstream *all; /* every stream ever made, kept like events */
};

static struct fstream *all_streams;

static struct fstream *legacy;

/* Work touching a stale mapping, or a forced fault on one that touches an imported mapping,
 * poisons @ctx instead of running. */
static bool job_faults(const struct job *j, struct fctx *ctx)
{
	int d = range_imported((uintptr_t)j->dst, j->n);
	int s = j->kind == JOB_COPY ? range_imported((uintptr_t)j->src, j->n) : 0;
	bool bad = d == 2 || s == 2 || (ctx && (d || s) && fault_forced(ctx->ordinal));

	if (bad && ctx)
		atomic_store(&ctx->sticky, CUDA_ERROR_ILLEGAL_ADDRESS);
	return bad || ctx_sticky(ctx) != CUDA_SUCCESS;
}

/* The job's context was reset since it was queued: the work went with it. */
static bool job_dropped(const struct job *j, struct fctx *ctx)
{
	return ctx && atomic_load(&ctx->gen) != j->gen;
}

/*
 * Counts a device-to-host copy of @n bytes that ran: one line with @n appended to the file
 * $FAKECUDA_DTOH_LOG names (O_APPEND, one write: the lines of several processes do not mix), so
 * that a test can tell how often device memory was read into host memory, by any process.
 */
static void dtoh_note(size_t n)
{
	const char *path = getenv("FAKECUDA_DTOH_LOG");
	char line[32];
	int fd, len;

	if (!path || !*path)
		return;
	fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	len = snprintf(line, sizeof(line), "%zu\n", n);
	if (write(fd, line, (size_t)len) != len)
		fprintf(stderr, "fakecuda: %s: device-to-host copy not counted\n", path);
	close(fd);
}

static void job_run(struct job *j, struct fctx *ctx)
{
	bool ran;

	unsigned long long c;

	switch (j->kind) {
	case JOB_COPY:
		pthread_rwlock_rdlock(&run_lock);
		ran = !job_dropped(j, ctx) && !job_faults(j, ctx);
		if (ran)
			memmove(j->dst, j->src, j->n);
		pthread_rwlock_unlock(&run_lock);
		if (ran && j->dtoh)
			dtoh_note(j->n);
		break;
	case JOB_SET:
		pthread_rwlock_rdlock(&run_lock);
		if (!job_dropped(j, ctx) && !job_faults(j, ctx))
			memset(j->dst, j->value, j->n);
		pthread_rwlock_unlock(&run_lock);
		break;
	case JOB_HOST: j->fn(j->arg); break;
	case JOB_RECORD:
		c = atomic_load(&j->ev->sh->completed);
		while (c < j->seq && !atomic_compare_exchange_weak(&j->ev->sh->completed, &c, j->seq))
			;
		break;
	case JOB_WAIT: ev_wait(j->ev, j->seq); break;
	}
}

static void *stream_main(void *arg)
{
	struct fstream *s = arg;
	struct job *j;

	pthread_mutex_lock(&s->mu);
	for (;;) {
		while (!s->head && !s->stop)
			pthread_cond_wait(&s->cv, &s->mu);
		if (!s->head)
			break;
		j = s->head;
		s->head = j->next;
		if (!s->head)
			s->tail = NULL;
		pthread_mutex_unlock(&s->mu);
		job_run(j, s == legacy ? j->ctx : s->ctx);
		free(j);
		pthread_mutex_lock(&s->mu);
		s->done++;
		pthread_cond_broadcast(&s->cv);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

static struct fstream *stream_new(void)
{
	struct fstream *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	if (pthread_create(&s->th, NULL, stream_main, s) != 0) {
		free(s);
		return NULL;
	}
	pthread_mutex_lock(&all_lock);
	s->all = all_streams;
	all_streams = s;
	pthread_mutex_unlock(&all_lock);
	return s;
}

static bool stream_legacy(CUstream h)
{
	return !h || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD;
}

/* The context of stream @h: its own, or the current one for the legacy stream (NULL: none). */
static struct fctx *stream_ctx(CUstream h)
{
	return stream_legacy(h) ? ctx_current() : ((struct fstream *)h)->ctx;
}

static struct fstream *stream_of(CUstream h)
{
	if (h && h != CU_STREAM_LEGACY && h != CU_STREAM_PER_THREAD)
		return (struct fstream *)h;
	pthread_mutex_lock(&lock);
	if (!legacy)
		legacy = stream_new();
	pthread_mutex_unlock(&lock);
	return legacy;
}

/* 0 if stream @h is usable: a context, not reset since, not poisoned; else the error. */
static CUresult stream_check(CUstream h)
{
	struct fctx *c = stream_ctx(h);

	if (!c) /* work on the legacy stream goes to the current context's */
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!stream_legacy(h) && ((struct fstream *)h)->gen != atomic_load(&c->gen))
		return CUDA_ERROR_INVALID_HANDLE;
	return ctx_sticky(c);
}

static CUresult stream_push(CUstream h, const struct job *tmpl)
{
	struct fstream *s;
	struct job *j;
	CUresult r = stream_check(h);

	if (r != CUDA_SUCCESS)
		return r;
	s = stream_of(h);
	j = malloc(sizeof(*j));
	if (!s || !j) {
		free(j);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*j = *tmpl;
	j->ctx = stream_ctx(h);
	j->gen = j->ctx ? atomic_load(&j->ctx->gen) : 0;
	j->next = NULL;
	pthread_mutex_lock(&s->mu);
	if (s->tail)
		s->tail->next = j;
	else
		s->head = j;
	s->tail = j;
	s->queued++;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream h)
{
	struct fstream *s;
	unsigned long long target;
	CUresult r = stream_check(h);

	if (r != CUDA_SUCCESS)
		return r;
	s = stream_of(h);
	if (!s)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&s->mu);
	target = s->queued;
	while (s->done < target)
		pthread_cond_wait(&s->cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
	return ctx_sticky(stream_ctx(h)); /* the work may have faulted */
}

/* Queues a copy on @h; @dtoh: from device to host memory (counted when it runs). */
static CUresult copy_on(CUstream h, void *dst, const void *src, size_t n, bool dtoh)
{
	struct job j = { .kind = JOB_COPY, .dst = dst, .src = src, .n = n, .dtoh = dtoh };

	return n ? stream_push(h, &j) : CUDA_SUCCESS;
}

/* A synchronous copy: on the legacy stream, waited for. */
static CUresult copy_sync(void *dst, const void *src, size_t n, bool dtoh)
{
	CUresult r = copy_on(NULL, dst, src, n, dtoh);

	return r == CUDA_SUCCESS ? stream_sync(NULL) : r;
}

/* ---- initialisation, errors, devices -------------------------------------------------------- */

CUresult CUDAAPI cuInit(unsigned int flags)
{
	const char *e = getenv("FAKECUDA_DEVICES");
	int n = e && *e ? atoi(e) : 2;

	pthread_mutex_lock(&lock);
	n_devs = n < 0 ? 0 : n > FAKE_DEVS_MAX ? FAKE_DEVS_MAX : n;
	for (int i = 0; i < FAKE_DEVS_MAX; i++)
		ctxs[i] = (struct fctx){ .magic = CTX_MAGIC, .ordinal = i };
	inited = true;
	pthread_mutex_unlock(&lock);
	return n_devs ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

static const struct {
	CUresult r;
	const char *name, *text;
} errors[] = {
	{ CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
	{ CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
	{ CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
	{ CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
	{ CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
	{ CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
	{ CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
	{ CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
	  "peer access is already enabled" },
	{ CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
	{ CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
	  "an illegal memory access was encountered" },
};

static int error_index(CUresult r)
{
	for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++)
		if (errors[i].r == r)
			return (int)i;
	return -1;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **str)
{
	int i = error_index(error);

	*str = i >= 0 ? errors[i].text : NULL;
	return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **str)
{
	int i = error_index(error);

	*str = i >= 0 ? errors[i].name : NULL;
	return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuDriverGetVersion(int *v)
{
	*v = CUDA_VERSION;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int *count)
{
	*count = n_devs;
	return inited ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

/* Does the device export dma-bufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)? Not with
 * $FAKECUDA_NO_DMABUF set, as on a driver or kernel without them. */
static bool dmabuf_supported(void)
{
	return !getenv("FAKECUDA_NO_DMABUF") || !*getenv("FAKECUDA_NO_DMABUF");
}

static bool dev_ok(CUdevice d)
{
	return inited && d >= 0 && d < n_devs;
}

CUresult CUDAAPI cuDeviceGet(CUdevice *dev, int ordinal)
{
	if (!dev_ok(ordinal))
		return CUDA_ERROR_INVALID_DEVICE;
	*dev = ordinal;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
	if (!dev_ok(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(name, (size_t)len, "fakecuda device %d", dev);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetPCIBusId(char *id, int len, CUdevice dev)
{
	if (!dev_ok(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(id, (size_t)len, "0000:%02x:00.0", 0x10 + dev);
	return CUDA_SUCCESS;
}

/*
 * "FKGPU" + ordinal + $FAKECUDA_UUID_SALT: a process started with another salt sees other
 * devices behind the same PCI bus ids, as a process on another MIG instance of a GPU does.
 */
CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
	const char *salt = getenv("FAKECUDA_UUID_SALT");

	if (!dev_ok(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	memset(uuid, 0, sizeof(*uuid));
	memcpy(uuid->bytes, "FKGPU", 5);
	uuid->bytes[5] = (char)dev;
	uuid->bytes[6] = (char)(salt ? atoi(salt) : 0);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetByPCIBusId(CUdevice *dev, const char *id)
{
	unsigned dom, bus, slot, fn;

	if (!id || sscanf(id, "%x:%x:%x.%x", &dom, &bus, &slot, &fn) != 4 || dom || slot || fn ||
	    !dev_ok((int)bus - 0x10))
		return CUDA_ERROR_INVALID_VALUE;
	*dev = (int)bus - 0x10;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	if (!dev_ok(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	switch (attrib) {
	case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = 0x10 + dev; break;
	case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *pi = 0; break;
	case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *pi = 0; break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
	case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING:
		*pi = getenv("FAKECUDA_RDMA_ORDERING") ? atoi(getenv("FAKECUDA_RDMA_ORDERING")) : 0;
		break;
	case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: *pi = dmabuf_supported(); break;
	case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS:
		*pi = getenv("FAKECUDA_NO_RDMA_FLUSH") ? 0 : CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST;
		break;
	default: *pi = 1; break;
	}
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
	if (!dev_ok(dev) || !dev_ok(peer))
		return CUDA_ERROR_INVALID_DEVICE;
	*can = dev != peer;
	return CUDA_SUCCESS;
}

/* ---- contexts -------------------------------------------------------------------------------- */

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
	if (!dev_ok(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	*ctx = (CUcontext)&ctxs[dev];
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
	return dev_ok(dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* Like the driver: everything made or opened in the context is gone, its error cleared. */
CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev)
{
	struct falloc **pp, *dead = NULL;

	if (!dev_ok(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_rwlock_wrlock(&run_lock);
	pthread_mutex_lock(&lock);
	for (pp = &allocs; *pp;) {
		struct falloc *a = *pp;
		if (a->imported && a->ordinal == (int)dev) {
			*pp = a->next;
			a->next = dead;
			dead = a;
		} else {
			pp = &a->next;
		}
	}
	memset(ctxs[dev].peer, 0, sizeof(ctxs[dev].peer));
	atomic_fetch_add(&ctxs[dev].gen, 1);
	atomic_store(&ctxs[dev].sticky, CUDA_SUCCESS);
	pthread_mutex_unlock(&lock);
	while (dead) {
		struct falloc *a = dead;
		dead = a->next;
		munmap((void *)a->base, a->size);
		close(a->fd);
		free(a);
	}
	pthread_rwlock_unlock(&run_lock);
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
	if (ctx && !ctx_of(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx_depth)
		ctx_stack[ctx_depth - 1] = ctx;
	else if (ctx)
		ctx_stack[ctx_depth++] = ctx;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *ctx)
{
	*ctx = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx)
{
	if (!ctx_of(ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx_depth == (int)(sizeof(ctx_stack) / sizeof(ctx_stack[0])))
		return CUDA_ERROR_OUT_OF_MEMORY;
	ctx_stack[ctx_depth++] = ctx;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent(CUcontext *ctx)
{
	if (!ctx_depth)
		return CUDA_ERROR_INVALID_CONTEXT;
	ctx_depth--;
	if (ctx)
		*ctx = ctx_stack[ctx_depth];
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
	struct fctx *c = ctx_current(), *p = ctx_of(peer);
	CUresult r = CUDA_SUCCESS;

	if (!c || !p)
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&lock);
	if (c->peer[p->ordinal])
		r = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
	c->peer[p->ordinal] = true;
	pthread_mutex_unlock(&lock);
	return r;
}

/* ---- device memory -------------------------------------------------------------------------- */

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t size)
{
	struct fctx *c = ctx_current();
	int fd;

	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!size)
		return CUDA_ERROR_INVALID_VALUE;
	fd = memfd_create("fakecuda", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)size) < 0) {
		if (fd >= 0)
			close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	return alloc_map(fd, size, c->ordinal, 0, dptr);
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr)
{
	if (!ctx_current())
		return CUDA_ERROR_INVALID_CONTEXT;
	return alloc_unmap(dptr, false);
}

CUresult CUDAAPI cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr dptr)
{
	struct falloc *a;

	pthread_mutex_lock(&lock);
	a = alloc_find((uintptr_t)dptr);
	if (a && base)
		*base = (CUdeviceptr)a->base;
	if (a && size)
		*size = a->size;
	pthread_mutex_unlock(&lock);
	return a ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

static CUresult attr_get(void *data, CUpointer_attribute attr, const struct falloc *a)
{
	switch (attr) {
	case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = (CUcontext)&ctxs[a->ordinal]; break;
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned int *)data = CU_MEMORYTYPE_DEVICE; break;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = a->ordinal; break;
	case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data = a->id; break;
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *(int *)data = !a->imported; break;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = a->base; break;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = a->size; break;
	default: return CUDA_ERROR_NOT_SUPPORTED;
	}
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr)
{
	struct falloc *a;
	CUresult r;

	pthread_mutex_lock(&lock);
	a = alloc_find((uintptr_t)ptr);
	r = a ? attr_get(data, attr, a) : CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_unlock(&lock);
	return r;
}

/*
 * A dma-buf for [dptr, dptr + size): the allocation's memfd opened anew, read-only (which is how
 * fakeverbs tells an export from any other fd: see its fv_dmabuf_size()), and positioned at the
 * range's start, so that offset 0 of the "dma-buf" is @dptr as with the real driver; fakeverbs'
 * reg_dmabuf_mr reads that position back. As strict as the driver documents it: both ends
 * aligned to the host page size, inside one allocation of this process made by cuMemAlloc
 * (never rounded past its end), on a device with CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED; a range
 * this process imported by cuIpcOpenMemHandle is refused (CUDA_ERROR_NOT_SUPPORTED), as its
 * export is not documented.
 */
CUresult CUDAAPI cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
					       CUmemRangeHandleType type, unsigned long long flags)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), p = (uintptr_t)dptr;
	CUresult res = CUDA_ERROR_INVALID_VALUE;
	struct falloc *a;
	off_t start = 0;
	int src = -1, fd;

	fake_delay("cuMemGetHandleForAddressRange");
	if (type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || !dmabuf_supported())
		return CUDA_ERROR_NOT_SUPPORTED;
	if (flags == 1) /* CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE (CUDA 12.8+ headers) */
		return CUDA_ERROR_NOT_SUPPORTED; /* no BAR1 mapping on this platform */
	if (flags || !handle || !size || p % page || size % page)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	a = alloc_find(p);
	if (a && a->imported)
		res = CUDA_ERROR_NOT_SUPPORTED;
	else if (a && size <= a->size - (p - a->base)) {
		src = a->fd;
		start = (off_t)(p - a->base);
	}
	fd = -1;
	if (src >= 0) {
		char path[64];

		snprintf(path, sizeof(path), "/proc/self/fd/%d", src);
		fd = open(path, O_RDONLY | O_CLOEXEC);
	}
	pthread_mutex_unlock(&lock);
	if (src < 0)
		return res;
	if (fd < 0 || lseek(fd, start, SEEK_SET) < 0) {
		if (fd >= 0)
			close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*(int *)handle = fd;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr dptr)
{
	struct mem_handle m = { .magic = MEM_MAGIC, .pid = getpid() };
	struct falloc *a;

	pthread_mutex_lock(&lock);
	a = alloc_find((uintptr_t)dptr);
	if (a && a->base == (uintptr_t)dptr && !a->imported) {
		m.fd = a->fd;
		m.ordinal = a->ordinal;
		m.size = a->size;
		m.id = a->id;
	}
	pthread_mutex_unlock(&lock);
	if (!m.size)
		return CUDA_ERROR_INVALID_VALUE;
	memset(h, 0, sizeof(*h));
	memcpy(h->reserved, &m, sizeof(m));
	return CUDA_SUCCESS;
}

/* An open of the exporter's allocation @id in this process, its count raised; or NULL. */
static struct falloc *import_find(unsigned long long id)
{
	struct falloc *a;

	pthread_mutex_lock(&lock);
	for (a = allocs; a; a = a->next)
		if (a->imported && a->src_id == id)
			break;
	if (a)
		a->refs++;
	pthread_mutex_unlock(&lock);
	return a;
}

/* Like the driver: a handle opened again in one process returns the same pointer and counts
 * the opens; cuIpcCloseMemHandle() unmaps at the last close. */
CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *dptr, CUipcMemHandle h, unsigned int flags)
{
	struct mem_handle m;
	struct falloc *a;
	int fd;

	memcpy(&m, h.reserved, sizeof(m));
	if (m.magic != MEM_MAGIC || m.pid == getpid() || !m.id)
		return CUDA_ERROR_INVALID_VALUE;
	fake_delay("cuIpcOpenMemHandle");
	if (!ctx_current())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx_sticky(ctx_current()) != CUDA_SUCCESS)
		return ctx_sticky(ctx_current());
	a = import_find(m.id);
	if (a) {
		*dptr = (CUdeviceptr)a->base;
		return CUDA_SUCCESS;
	}
	fd = open_remote_fd(m.pid, m.fd);
	if (fd < 0)
		return CUDA_ERROR_INVALID_HANDLE;
	if (alloc_map(fd, m.size, m.ordinal, m.id, dptr) != CUDA_SUCCESS)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&lock);
	alloc_find((uintptr_t)*dptr)->src_pid = m.pid;
	pthread_mutex_unlock(&lock);
	return CUDA_SUCCESS;
}

/*
 * Waits until every stream of @c has run the work queued on it before this call, abandoned
 * (destroyed) streams included: the driver synchronizes the context before it unmaps an IPC
 * mapping, so a close behind a stream stuck on an event that never completes (one recorded by
 * a process that then died) never returns.
 */
static void ctx_drain(struct fctx *c)
{
	struct fstream *list, *s;

	pthread_mutex_lock(&all_lock);
	list = all_streams;
	pthread_mutex_unlock(&all_lock);
	for (s = list; s; s = s->all) { /* streams are never freed: the list is stable */
		unsigned long long target;

		if (s == legacy || s->ctx != c || s->gen != atomic_load(&c->gen))
			continue;
		pthread_mutex_lock(&s->mu);
		target = s->queued;
		while (s->done < target)
			pthread_cond_wait(&s->cv, &s->mu);
		pthread_mutex_unlock(&s->mu);
	}
}

/* Closing a mapping whose exporter freed the memory first is undefined for the driver: here it
 * poisons the context, as a stale access would. */
CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	struct fctx *c = ctx_current();
	struct falloc *a;
	bool stale;

	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx_sticky(c) != CUDA_SUCCESS)
		return ctx_sticky(c);
	fake_delay("cuIpcCloseMemHandle");
	ctx_drain(c);
	pthread_mutex_lock(&lock);
	a = alloc_find((uintptr_t)dptr);
	stale = a && a->imported && a->refs == 1 && alloc_stale(a);
	pthread_mutex_unlock(&lock);
	if (stale) {
		atomic_store(&c->sticky, CUDA_ERROR_ILLEGAL_ADDRESS);
		alloc_unmap(dptr, true);
		return CUDA_ERROR_ILLEGAL_ADDRESS;
	}
	return alloc_unmap(dptr, true);
}

/* ---- host memory ---------------------------------------------------------------------------- */

CUresult CUDAAPI cuMemAllocHost(void **pp, size_t size)
{
	if (!ctx_current())
		return CUDA_ERROR_INVALID_CONTEXT;
	return posix_memalign(pp, 4096, size ? size : 1) == 0 ? CUDA_SUCCESS :
								 CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
	return cuMemAllocHost(pp, size);
}

CUresult CUDAAPI cuMemFreeHost(void *p)
{
	if (!ctx_current())
		return CUDA_ERROR_INVALID_CONTEXT;
	free(p);
	return CUDA_SUCCESS;
}

/* Host ranges registered (page-locked), as the driver keeps them: a range overlapping one
 * already registered is refused, and only the start of a registered range unregisters. */
struct hostreg {
	uintptr_t base;
	size_t size;
	struct hostreg *next;
};
static struct hostreg *hostregs; /* under lock */

CUresult CUDAAPI cuMemHostRegister(void *p, size_t size, unsigned int flags)
{
	uintptr_t b = (uintptr_t)p;
	struct hostreg *h;
	CUresult r = CUDA_SUCCESS;

	if (!ctx_current())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!p || !size)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&lock);
	for (h = hostregs; h && r == CUDA_SUCCESS; h = h->next)
		if (b < h->base + h->size && h->base < b + size)
			r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
	if (r == CUDA_SUCCESS && !(h = malloc(sizeof(*h))))
		r = CUDA_ERROR_OUT_OF_MEMORY;
	if (r == CUDA_SUCCESS) {
		*h = (struct hostreg){ .base = b, .size = size, .next = hostregs };
		hostregs = h;
	}
	pthread_mutex_unlock(&lock);
	return r;
}

CUresult CUDAAPI cuMemHostUnregister(void *p)
{
	struct hostreg **pp, *h = NULL;

	if (!ctx_current())
		return CUDA_ERROR_INVALID_CONTEXT;
	pthread_mutex_lock(&lock);
	for (pp = &hostregs; *pp; pp = &(*pp)->next)
		if ((*pp)->base == (uintptr_t)p) {
			h = *pp;
			*pp = h->next;
			break;
		}
	pthread_mutex_unlock(&lock);
	free(h);
	return h ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

/* ---- events --------------------------------------------------------------------------------- */

#define EV_FLAGS (CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS)

/* Like the driver: made in the current context, which it belongs to; an interprocess event
 * must not keep timing. */
CUresult CUDAAPI cuEventCreate(CUevent *ev, unsigned int flags)
{
	struct fctx *c = ctx_current();
	int fd;

	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx_sticky(c) != CUDA_SUCCESS)
		return ctx_sticky(c);
	if ((flags & ~EV_FLAGS) ||
	    ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)))
		return CUDA_ERROR_INVALID_VALUE;
	fd = memfd_create("fakecuda-event", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, sizeof(struct ev_shared)) < 0) {
		if (fd >= 0)
			close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	return ev_map(fd, c, flags, ev);
}

CUresult CUDAAPI cuEventDestroy(CUevent ev)
{
	struct fevent *e = ev_of(ev);

	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	if (e->imported)
		fake_delay("cuEventDestroy");
	/* Work still queued may name it: a real driver defers the release; so do we, forever. */
	e->magic = 0;
	return CUDA_SUCCESS;
}

/* Like the driver: the event and the stream must belong to one context. */
CUresult CUDAAPI cuEventRecord(CUevent ev, CUstream s)
{
	struct fevent *e = ev_of(ev);
	struct job j = { .kind = JOB_RECORD, .ev = e };
	struct fctx *c = stream_ctx(s);

	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (c != e->ctx)
		return CUDA_ERROR_INVALID_HANDLE;
	j.seq = atomic_fetch_add(&e->sh->recorded, 1) + 1;
	return stream_push(s, &j);
}

CUresult CUDAAPI cuEventSynchronize(CUevent ev)
{
	struct fevent *e = ev_of(ev);

	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	ev_wait(e, atomic_load(&e->sh->recorded));
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventQuery(CUevent ev)
{
	struct fevent *e = ev_of(ev);

	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	if (ctx_sticky(e->ctx) != CUDA_SUCCESS)
		return ctx_sticky(e->ctx);
	return atomic_load(&e->sh->completed) >= atomic_load(&e->sh->recorded) ?
		       CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult CUDAAPI cuIpcGetEventHandle(CUipcEventHandle *h, CUevent ev)
{
	struct fevent *e = ev_of(ev);
	struct ev_handle m = { .magic = EV_MAGIC, .pid = getpid() };

	if (!e || (e->flags & (CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING)) !=
			  (CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING))
		return CUDA_ERROR_INVALID_HANDLE;
	m.fd = e->fd;
	memset(h, 0, sizeof(*h));
	memcpy(h->reserved, &m, sizeof(m));
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcOpenEventHandle(CUevent *ev, CUipcEventHandle h)
{
	struct ev_handle m;
	CUresult r;
	int fd;

	memcpy(&m, h.reserved, sizeof(m));
	if (m.magic != EV_MAGIC || m.pid == getpid())
		return CUDA_ERROR_INVALID_VALUE;
	if (!ctx_current()) /* the opened event belongs to the current context */
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx_sticky(ctx_current()) != CUDA_SUCCESS)
		return ctx_sticky(ctx_current());
	fake_delay("cuIpcOpenEventHandle");
	fd = open_remote_fd(m.pid, m.fd);
	if (fd < 0)
		return CUDA_ERROR_INVALID_HANDLE;
	r = ev_map(fd, ctx_current(), CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING, ev);
	if (r == CUDA_SUCCESS)
		((struct fevent *)*ev)->imported = true;
	return r;
}

/* ---- streams and work ----------------------------------------------------------------------- */

CUresult CUDAAPI cuStreamCreate(CUstream *s, unsigned int flags)
{
	struct fctx *c = ctx_current();
	struct fstream *f = c ? stream_new() : NULL;

	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!f)
		return CUDA_ERROR_OUT_OF_MEMORY;
	f->ctx = c;
	f->gen = atomic_load(&c->gen);
	*s = (CUstream)f;
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy(CUstream h)
{
	struct fstream *s = (struct fstream *)h;

	if (!h || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&s->mu);
	s->stop = true; /* the worker finishes what is queued first, as the driver does */
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	pthread_detach(s->th);
	return CUDA_SUCCESS;
}

/* Unlike a record, a wait may name an event of another context or device (as the driver
 * allows); a legacy stream needs a current context. */
CUresult CUDAAPI cuStreamWaitEvent(CUstream s, CUevent ev, unsigned int flags)
{
	struct fevent *e = ev_of(ev);
	struct job j = { .kind = JOB_WAIT, .ev = e };

	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	j.seq = atomic_load(&e->sh->recorded);
	return stream_push(s, &j);
}

CUresult CUDAAPI cuStreamSynchronize(CUstream s)
{
	return stream_sync(s);
}

CUresult CUDAAPI cuLaunchHostFunc(CUstream s, CUhostFn fn, void *arg)
{
	struct job j = { .kind = JOB_HOST, .fn = fn, .arg = arg };

	return stream_push(s, &j);
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s)
{
	struct job j = { .kind = JOB_SET, .dst = (void *)(uintptr_t)dst, .value = v, .n = n };

	return n ? stream_push(s, &j) : CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	return copy_on(s, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, false);
}

CUresult CUDAAPI cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src,
				   CUcontext src_ctx, size_t n, CUstream s)
{
	return copy_on(s, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, false);
}

CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
	return copy_on(s, (void *)(uintptr_t)dst, src, n, false);
}

CUresult CUDAAPI cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
	return copy_on(s, dst, (const void *)(uintptr_t)src, n, true);
}

CUresult CUDAAPI cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
	return copy_on(s, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, false);
}

/* Lands the RDMA writes the stand-in verbs provider of this process holds back (its
 * fakeverbs_flush(), if it is loaded). */
static void rdma_land(void)
{
	const char *lib = getenv("TPIPD_VERBS_LIBRARY");
	void *h = lib && *lib ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
	int (*flush)(void) = h ? (int (*)(void))dlsym(h, "fakeverbs_flush") : NULL;

	if (flush)
		flush();
	if (h)
		dlclose(h);
}

CUresult CUDAAPI cuFlushGPUDirectRDMAWrites(CUflushGPUDirectRDMAWritesTarget target,
					   CUflushGPUDirectRDMAWritesScope scope)
{
	if (target != CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX ||
	    (scope != CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER &&
	     scope != CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_ALL_DEVICES))
		return CUDA_ERROR_INVALID_VALUE;
	if (!ctx_current())
		return CUDA_ERROR_INVALID_CONTEXT;
	rdma_land();
	return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n)
{
	rdma_land(); /* a read through the device: earlier writes land first */
	return copy_sync(dst, (const void *)(uintptr_t)src, n, true);
}

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n)
{
	return copy_sync((void *)(uintptr_t)dst, src, n, false);
}

CUresult CUDAAPI cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
	return copy_sync((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, false);
}
