/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Shared buffers: sealed memfds mapped here and registered with the daemon (BufferRegister with
 * the fd by SCM_RIGHTS), a registry sorted by address so that any pointer range can be mapped
 * to (buf_id, gen, offset), and a small pool of staging buffers used when private memory must
 * be copied because CMA is not available. Which segments use them is decided by write.c and
 * read.c.
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <syslog.h>
#include "internal.h"

#define STAGE_MIN (64u << 10)
/*
 * Staging buffers kept for reuse (the free list; a buffer in use by an operation is never in
 * it, so concurrent messages never share bytes). Faulting in a fresh memfd, here and in the
 * daemon, costs far more than the copy through it, so free buffers stay mapped within these
 * bounds: POOL_MAX buffers and POOL_BYTES_MAX bytes (or half the daemon's --buffer-bytes-max,
 * if lower), least recently used out first; a buffer left unused for STAGE_IDLE_MS is released
 * (by the io thread, which wakes for it), and all of them at tp_context_free().
 */
#define POOL_MAX 8
#define POOL_BYTES_MAX (1ull << 30)
#define STAGE_IDLE_MS 2000

/* A new memfd of @size bytes (rounded up to pages) mapped read-write into @b. A channel's
 * buffer (@b->chan) stays open to one more seal (F_SEAL_FUTURE_WRITE, tpc_buffer_chan_new()). */
static int buffer_map(size_t size, struct tpc_buf *b, int *ret_fd)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	_cleanup_close_ int fd = -EBADF;
	void *addr;

	if (size > SIZE_MAX - page)
		return -ENOMEM;
	size = (size + page - 1) & ~(page - 1);
	fd = memfd_create(b->chan ? "tpclient-chan" : "tpclient", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) < 0)
		return -errno;
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | (b->chan ? 0 : F_SEAL_SEAL)) < 0)
		return -errno;
	addr = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (addr == MAP_FAILED)
		return -errno;
	b->addr = addr;
	b->size = size;
	*ret_fd = TAKE_FD(fd);
	return 0;
}

/* ---- registry (sorted by address) ---------------------------------------------------------- */

/* Index of the first buffer that starts above @addr. */
static size_t buffer_upper(const struct tp_context *ctx, uintptr_t addr)
{
	size_t lo = 0, hi = ctx->n_bufs;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if ((uintptr_t)ctx->bufs[mid]->addr <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int buffer_insert_locked(struct tp_context *ctx, struct tpc_buf *b)
{
	size_t i;

	if (ctx->n_bufs == ctx->bufs_cap) {
		size_t cap = ctx->bufs_cap ? ctx->bufs_cap * 2 : 16;
		struct tpc_buf **n = realloc(ctx->bufs, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		ctx->bufs = n;
		ctx->bufs_cap = cap;
	}
	i = buffer_upper(ctx, (uintptr_t)b->addr);
	memmove(&ctx->bufs[i + 1], &ctx->bufs[i], (ctx->n_bufs - i) * sizeof(*ctx->bufs));
	ctx->bufs[i] = b;
	ctx->n_bufs++;
	ctx->buf_bytes += b->size;
	return 0;
}

static void buffer_remove_locked(struct tp_context *ctx, struct tpc_buf *b)
{
	size_t i = buffer_upper(ctx, (uintptr_t)b->addr);

	if (i == 0 || ctx->bufs[i - 1] != b)
		return;
	i--;
	memmove(&ctx->bufs[i], &ctx->bufs[i + 1], (ctx->n_bufs - i - 1) * sizeof(*ctx->bufs));
	ctx->n_bufs--;
	ctx->buf_bytes -= b->size;
}

struct tpc_buf *tpc_buffer_lookup_locked(struct tp_context *ctx, const void *ptr, size_t len)
{
	size_t i = buffer_upper(ctx, (uintptr_t)ptr);
	struct tpc_buf *b;

	if (i == 0)
		return NULL;
	b = ctx->bufs[i - 1];
	if (b->staging || !tpu_range_ok((uintptr_t)ptr - (uintptr_t)b->addr, len, b->size))
		return NULL;
	return b;
}

int tpc_buffer_check_range_locked(struct tp_context *ctx, const void *ptr, size_t len,
				  const char *what, size_t idx)
{
	size_t i = buffer_upper(ctx, (uintptr_t)ptr);
	const struct tpc_buf *b;
	uintptr_t off;

	if (i == 0 || len == 0)
		return 0;
	b = ctx->bufs[i - 1];
	off = (uintptr_t)ptr - (uintptr_t)b->addr;
	if (b->staging || off >= b->size || tpu_range_ok(off, len, b->size))
		return 0;
	return tpc_error(-ERANGE, "%s %zu: %zu bytes at offset %zu run past the end of shared "
			 "buffer %llu (%zu bytes)", what, idx, len, (size_t)off, (unsigned long long)b->id,
			 (size_t)b->size);
}

/* ---- registration -------------------------------------------------------------------------- */

static void buffer_on_reply(struct tp_context *ctx, struct tpc_req *req, const Tpw__V1__Reply *r)
{
	struct tpc_buf *b = tpu_container_of(req, struct tpc_buf, req);

	tpc_context_req_done(ctx, req, r);
	if (req->status < 0) {
		b->failed = true;
		tpc_context_log(ctx, LOG_WARNING, "buffer %llu refused by the daemon: %s",
				(unsigned long long)b->id, req->msg);
	}
}

static int buffer_file_locked(struct tp_context *ctx, struct tpc_buf *b)
{
	const struct tpc_limits *lim = &ctx->lim;
	int r = tpc_context_check_locked(ctx);

	if (r < 0)
		return r;
	if (lim->buffers_max && ctx->n_bufs >= lim->buffers_max)
		return tpc_error(-ENOBUFS, "over the daemon's limit of %u buffers (tpipd "
				 "--buffers-max)",
				 lim->buffers_max);
	if (lim->buffer_bytes_max && ctx->buf_bytes + b->size > lim->buffer_bytes_max)
		return tpc_error(-ENOBUFS, "over the daemon's limit of %llu buffer bytes (tpipd "
				 "--buffer-bytes-max)",
				 (unsigned long long)lim->buffer_bytes_max);
	b->id = ++ctx->next_buf_id;
	b->gen = 1;
	if (buffer_insert_locked(ctx, b) < 0)
		return tpc_error(-ENOMEM, "out of memory");
	if (tpc_context_req_start_locked(ctx, &b->req, buffer_on_reply) < 0) {
		buffer_remove_locked(ctx, b);
		return tpc_error(-ENOMEM, "out of memory");
	}
	return 0;
}

/*
 * Maps and registers a buffer. The Reply is not awaited: frames are handled in order, so later
 * frames may already name the buffer. send_lock held.
 */
static int buffer_new_fd(struct tp_context *ctx, size_t size, bool staging, bool chan,
			 struct tpc_buf **ret, int *ret_fd)
{
	Tpw__V1__BufferRegister br = TPW__V1__BUFFER_REGISTER__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	struct tpc_buf *b = calloc(1, sizeof(*b));
	_cleanup_close_ int fd = -EBADF;
	int r;

	if (!b)
		return tpc_error(-ENOMEM, "out of memory");
	tpu_list_init(&b->pool_link);
	b->staging = staging;
	b->chan = chan;
	r = buffer_map(size, b, &fd);
	if (r < 0) {
		free(b);
		return tpc_error(r, "cannot map %zu bytes of shared memory: %s", size,
				 tp_strerror(r));
	}
	pthread_mutex_lock(&ctx->lock);
	r = buffer_file_locked(ctx, b);
	pthread_mutex_unlock(&ctx->lock);
	if (r < 0) {
		munmap(b->addr, b->size);
		free(b);
		return r;
	}
	br.req_id = b->req.id;
	br.buf_id = b->id;
	br.gen = b->gen;
	br.size = b->size;
	br.staging = staging;
	br.chan_map = chan;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &br;
	tpc_wire_send(ctx, &m, NULL, 0, fd); /* failure: connection loss fails the request */
	*ret = b;
	if (ret_fd)
		*ret_fd = TAKE_FD(fd);
	return 0;
}

static int buffer_new(struct tp_context *ctx, size_t size, bool staging, struct tpc_buf **ret)
{
	return buffer_new_fd(ctx, size, staging, false, ret, NULL);
}

/* Unregisters and unmaps @b; send_lock held, lock not held. */
static void buffer_release(struct tp_context *ctx, struct tpc_buf *b)
{
	Tpw__V1__BufferRelease rel = TPW__V1__BUFFER_RELEASE__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	bool tell;

	pthread_mutex_lock(&ctx->lock);
	buffer_remove_locked(ctx, b);
	if (tpc_map_get(&ctx->reqs, b->req.id) == &b->req)
		tpc_map_del(&ctx->reqs, b->req.id);
	tell = !ctx->dead && !b->failed;
	pthread_mutex_unlock(&ctx->lock);
	if (tell) {
		rel.buf_id = b->id;
		rel.gen = b->gen;
		m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_RELEASE;
		m.buffer_release = &rel;
		tpc_wire_send(ctx, &m, NULL, 0, -EBADF);
	}
	munmap(b->addr, b->size);
	free(b);
}

TP_EXPORT int tp_buffer_alloc(struct tp_context *ctx, size_t size, void **ret)
{
	struct tpc_buf *b;
	char msg[TPC_ERRMSG_MAX + 64] = "";
	int r;

	if (!ctx || !ret || size == 0)
		return tpc_error(-EINVAL, "missing context or result pointer, or size 0");
	pthread_mutex_lock(&ctx->send_lock);
	r = buffer_new(ctx, size, false, &b);
	pthread_mutex_unlock(&ctx->send_lock);
	if (r < 0)
		return r;
	/* The io thread cannot wait for the Reply it would have to read itself. */
	if (!tpc_context_on_io_thread(ctx)) {
		pthread_mutex_lock(&ctx->lock);
		r = tpc_context_req_wait_locked(ctx, &b->req, ctx->reply_ms);
		snprintf(msg, sizeof(msg), "cannot register a shared buffer: %s", b->req.msg);
		pthread_mutex_unlock(&ctx->lock);
	}
	if (r < 0) {
		pthread_mutex_lock(&ctx->send_lock);
		buffer_release(ctx, b);
		pthread_mutex_unlock(&ctx->send_lock);
		return tpc_error_msg(r, msg);
	}
	*ret = b->addr;
	return 0;
}

TP_EXPORT int tp_buffer_free(struct tp_context *ctx, void *ptr)
{
	struct tpc_buf *b = NULL;
	size_t i;

	if (!ptr)
		return 0;
	if (!ctx)
		return tpc_error(-EINVAL, "no context");
	pthread_mutex_lock(&ctx->send_lock);
	pthread_mutex_lock(&ctx->lock);
	i = buffer_upper(ctx, (uintptr_t)ptr);
	if (i > 0 && ctx->bufs[i - 1]->addr == ptr && !ctx->bufs[i - 1]->staging)
		b = ctx->bufs[i - 1];
	pthread_mutex_unlock(&ctx->lock);
	if (b)
		buffer_release(ctx, b);
	pthread_mutex_unlock(&ctx->send_lock);
	if (!b)
		return tpc_error(-EINVAL, "%p is not the start of a shared buffer", ptr);
	return 0;
}

/* ---- staging ------------------------------------------------------------------------------- */

static uint64_t pool_bytes_max(const struct tp_context *ctx)
{
	uint64_t max = POOL_BYTES_MAX;

	if (ctx->lim.buffer_bytes_max && ctx->lim.buffer_bytes_max / 2 < max)
		max = ctx->lim.buffer_bytes_max / 2;
	return max;
}

static void pool_remove_locked(struct tp_context *ctx, struct tpc_buf *b)
{
	tpu_list_remove(&b->pool_link);
	ctx->n_pool--;
	ctx->pool_bytes -= b->size;
}

/* Releases @n buffers of @bufs; send_lock held, lock not held. */
static void pool_release(struct tp_context *ctx, struct tpc_buf **bufs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		buffer_release(ctx, bufs[i]);
}

/* Moves up to POOL_MAX free buffers unused since @before_ns (all: UINT64_MAX) to @ret. */
static size_t pool_take_old_locked(struct tp_context *ctx, uint64_t before_ns,
				   struct tpc_buf **ret)
{
	struct tpc_buf *b;
	size_t n = 0;

	while (n < POOL_MAX && (b = tpu_list_first(&ctx->stage_pool, struct tpc_buf, pool_link)) &&
	       b->used_ns <= before_ns) {
		pool_remove_locked(ctx, b);
		ret[n++] = b;
	}
	return n;
}

/* send_lock held, lock not held. */
static void buffer_pool_drain(struct tp_context *ctx)
{
	struct tpc_buf *old[POOL_MAX];
	size_t n;

	do {
		pthread_mutex_lock(&ctx->lock);
		n = pool_take_old_locked(ctx, UINT64_MAX, old);
		pthread_mutex_unlock(&ctx->lock);
		pool_release(ctx, old, n);
	} while (n);
}

/* The smallest free buffer of at least @size bytes, taken out of the pool, or NULL. */
static struct tpc_buf *pool_best_fit_locked(struct tp_context *ctx, size_t size)
{
	struct tpc_buf *b, *best = NULL;

	tpu_list_for_each(b, &ctx->stage_pool, pool_link) {
		if (!b->failed && b->size >= size && (!best || b->size < best->size))
			best = b;
	}
	if (best)
		pool_remove_locked(ctx, best);
	return best;
}

uint64_t tpc_buffer_stage_class(uint64_t size)
{
	uint64_t cls = STAGE_MIN;

	while (cls < size && cls <= UINT64_MAX / 2)
		cls *= 2;
	return cls < size ? UINT64_MAX : cls;
}

/*
 * Faults in the first @len bytes of new buffer @b (its pages allocated and zeroed by one call,
 * MADV_POPULATE_WRITE, Linux 5.14) instead of a page fault every 4 KiB under the first copy
 * into it: a fresh 16 MiB buffer costs its first copy several times a reused one's, most of it
 * allocating and zeroing pages, a fifth of it the faults themselves. Only the bytes the caller
 * is about to write, not the rest of the size class. Best effort: an older kernel faults them
 * in as before.
 */
static void buffer_prefault(struct tpc_buf *b, size_t len)
{
#ifdef MADV_POPULATE_WRITE
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	len = TPU_MIN(len, b->size); /* (a multiple of pages) */
	len = TPU_MIN((len + page - 1) & ~(page - 1), b->size);
	if (len)
		(void)madvise(b->addr, len, MADV_POPULATE_WRITE);
#else
	(void)b;
	(void)len;
#endif
}

int tpc_buffer_chan_new(struct tp_context *ctx, size_t size, struct tpc_buf **ret)
{
	_cleanup_close_ int fd = -EBADF;
	uint64_t cls = tpc_buffer_stage_class(size);
	struct tpc_buf *b;
	int r;

	if (tpc_context_on_io_thread(ctx))
		return -EWOULDBLOCK;
	if (cls > SIZE_MAX)
		return -ENOMEM;
	pthread_mutex_lock(&ctx->send_lock);
	r = buffer_new_fd(ctx, (size_t)cls, true, true, &b, &fd);
	pthread_mutex_unlock(&ctx->send_lock);
	if (r < 0)
		return r;
	buffer_prefault(b, size); /* while the daemon registers it */
	pthread_mutex_lock(&ctx->lock);
	r = tpc_context_req_wait_locked(ctx, &b->req, ctx->reply_ms);
	pthread_mutex_unlock(&ctx->lock);
	/* The daemon mapped it (read-write: it has no write to make into it, but a mapping made
	 * before the seal is its own); from now on nobody maps it writable. Without the seal (a
	 * kernel before 5.1) the daemon hands it to no reader. */
	if (r == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) < 0)
		tpc_context_log(ctx, LOG_INFO, "channel buffer %llu not sealed against writes (%s): "
				"readers will not map it", (unsigned long long)b->id,
				strerror(errno));
	if (r < 0) {
		pthread_mutex_lock(&ctx->send_lock);
		buffer_release(ctx, b);
		pthread_mutex_unlock(&ctx->send_lock);
		return r;
	}
	*ret = b;
	return 0;
}

int tpc_buffer_stage_get(struct tp_context *ctx, size_t size, struct tpc_buf **ret)
{
	size_t cls = STAGE_MIN;
	struct tpc_buf *found;
	int r;

	while (cls < size && cls <= SIZE_MAX / 2)
		cls *= 2;
	if (cls < size)
		return -ENOMEM;
	pthread_mutex_lock(&ctx->lock);
	found = pool_best_fit_locked(ctx, size);
	pthread_mutex_unlock(&ctx->lock);
	if (found) {
		*ret = found;
		return 0;
	}
	r = buffer_new(ctx, cls, true, ret);
	if (r == -ENOBUFS && ctx->n_pool) {
		buffer_pool_drain(ctx);
		r = buffer_new(ctx, cls, true, ret);
	}
	return r;
}

void tpc_buffer_stage_put(struct tp_context *ctx, struct tpc_buf *b, bool reuse)
{
	struct tpc_buf *evict[POOL_MAX];
	size_t n_evict = 0;
	uint64_t max;

	if (!b)
		return;
	pthread_mutex_lock(&ctx->lock);
	max = pool_bytes_max(ctx);
	if (reuse && !b->chan && !b->failed && !ctx->stopping && !ctx->dead && b->size <= max) {
		/* Make room by dropping the least recently used buffers. */
		while (ctx->n_pool && (ctx->n_pool >= POOL_MAX || ctx->pool_bytes + b->size > max)) {
			struct tpc_buf *old =
				tpu_list_first(&ctx->stage_pool, struct tpc_buf, pool_link);
			pool_remove_locked(ctx, old);
			evict[n_evict++] = old;
		}
		b->used_ns = tpu_now_ns();
		tpu_list_insert_tail(&ctx->stage_pool, &b->pool_link);
		ctx->n_pool++;
		ctx->pool_bytes += b->size;
		b = NULL;
	}
	pthread_mutex_unlock(&ctx->lock);
	if (!b && !n_evict)
		return;
	pthread_mutex_lock(&ctx->send_lock);
	pool_release(ctx, evict, n_evict);
	if (b)
		buffer_release(ctx, b);
	pthread_mutex_unlock(&ctx->send_lock);
}

int tpc_buffer_pool_timeout_locked(struct tp_context *ctx)
{
	struct tpc_buf *b = tpu_list_first(&ctx->stage_pool, struct tpc_buf, pool_link);
	uint64_t now = tpu_now_ns(), due;

	if (!b)
		return -1;
	due = b->used_ns + (uint64_t)STAGE_IDLE_MS * 1000000u;
	return due <= now ? 0 : (int)((due - now + 999999u) / 1000000u);
}

void tpc_buffer_pool_expire(struct tp_context *ctx)
{
	struct tpc_buf *old[POOL_MAX];
	uint64_t idle = (uint64_t)STAGE_IDLE_MS * 1000000u, now = tpu_now_ns();
	bool due;
	size_t n;

	if (now < idle)
		return;
	/* Cheap test first: the io thread wakes often while messages flow, and send_lock is on
	 * every writer's path. */
	pthread_mutex_lock(&ctx->lock);
	due = tpc_buffer_pool_timeout_locked(ctx) == 0;
	pthread_mutex_unlock(&ctx->lock);
	if (!due)
		return;
	pthread_mutex_lock(&ctx->send_lock);
	pthread_mutex_lock(&ctx->lock);
	n = pool_take_old_locked(ctx, now - idle, old);
	pthread_mutex_unlock(&ctx->lock);
	pool_release(ctx, old, n);
	pthread_mutex_unlock(&ctx->send_lock);
}

void tpc_buffer_free_all(struct tp_context *ctx)
{
	for (size_t i = 0; i < ctx->n_bufs; i++) {
		munmap(ctx->bufs[i]->addr, ctx->bufs[i]->size);
		free(ctx->bufs[i]);
	}
	free(ctx->bufs);
	ctx->bufs = NULL;
	ctx->n_bufs = ctx->bufs_cap = 0;
	tpu_list_init(&ctx->stage_pool);
	ctx->n_pool = 0;
	ctx->pool_bytes = 0;
}
