/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Registration of transfer memory for rdma and cuda_gdr, with a cache. See rdma.h and rdma_int.h.
 *
 * Registering memory pins it and programs the device's translation tables: on real hardware it
 * costs on the order of moving a few MiB, so registering every transfer anew would eat much of
 * what RDMA saves. A region stays registered after its transfer and serves every later segment
 * it holds, on the same port:
 *   - a shared buffer: the segment's range rounded out to REG_STEP boundaries of the buffer,
 *     widened to take in cached regions of that buffer it overlaps or touches (they go once
 *     unused), so a buffer reused at shifting offsets converges on one region;
 *   - a CUDA allocation: the whole allocation, as it was registered before the cache: from the
 *     dma-buf its client exported and handed over (dmabuf.c) where there is one, else from one
 *     the daemon exports of its mapping, else by address; a region made from a client's
 *     dma-buf serves that client's segments only.
 * A cached region holds a reference to its buffer or allocation, so neither the mapping nor the
 * address it was registered at can go away under it. It goes when its client releases the
 * buffer or ends (tpb_rdma_forget_buffer()), when nothing but the cache references its CUDA
 * allocation any more (checked at every registration and release, and by tpb_rdma_forget_cuda()),
 * or, least recently used first, when shared-buffer regions hold more than rdma-cache bytes
 * (the budget is for pinned host memory: GPU memory registered stays until its allocation goes).
 * A registration that fails is retried once after dropping every unused region, GPU ones
 * included (the device, its BAR or RLIMIT_MEMLOCK may be full of them). Memory that is neither
 * (data the daemon holds itself) is registered for its transfer only. A cached region stays
 * writable by the peer daemon it was offered to until it goes; rdma-cache = 0 deregisters every
 * region when its transfer ends. New regions are made on the context's registration worker,
 * never on the loop (the export and the registration may block for long): tpb_rdma_reg_make()
 * says "not yet" meanwhile, and the cache is touched only on the loop.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include "base/buffer.h"
#include "log.h"
#include "rdma_int.h"

const struct tpb_mem *tpb_rdma_reg_first_cuda(const struct tpb_rdma_seg *segs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (segs[i].len && segs[i].mem.loc == TPB_LOC_CUDA)
			return &segs[i].mem;
	return NULL;
}

#if HAVE_RDMA

#define REG_STEP (2ull << 20) /* shared-buffer regions start and end on these boundaries */

/* One registered region: cached (in g->mrs), or used by transfers only until they end. */
struct rdma_mr {
	struct tpu_list node;	   /* in g->mrs while @cached */
	struct rdma_port *port;	   /* holds a reference */
	struct tpv_mr *mr;
	struct tpb_buffer *buf;	   /* shared buffer: a reference, else NULL */
	struct tpb_cuda_map *cuda; /* CUDA allocation: a reference, else NULL */
	uint64_t base, len;	   /* the region: daemon addresses, device addresses for CUDA */
	uint64_t cuda_ptr;	   /* CUDA: device address of the allocation's first byte */
	struct rdma_dmabuf *dmabuf; /* CUDA: its client's dma-buf it was made from (a
				     * reference), else NULL */
	unsigned users;		   /* transfers using it */
	int how;		   /* enum reg_how */
	bool exported;		   /* CUDA: the daemon exported a dma-buf for it */
	bool cached;
};

static void mr_free(struct rdma_mr *e)
{
	tpv_mr_dereg(e->port->ctx, e->mr);
	tpb_rdma_port_put(e->port);
	tpb_buffer_unref(e->buf);
	tpb_cuda_map_unref(e->cuda);
	tpb_rdma_dmabuf_unref(e->dmabuf);
	free(e);
}

/* Takes @e out of the cache: freed now if unused, else by its last user. */
static void mr_uncache(struct tpb_rdma *g, struct rdma_mr *e)
{
	if (!e->cached)
		return;
	tpu_list_remove(&e->node);
	e->cached = false;
	g->cache.regions--;
	g->cache.bytes -= e->len;
	g->host_bytes -= e->cuda ? 0 : e->len;
	if (!e->users)
		mr_free(e);
}

/* True if nothing but the cache references @e's buffer or allocation any more. */
static bool mr_orphan(const struct rdma_mr *e)
{
	if (e->buf)
		return tpb_buffer_only_ref(e->buf);
	return e->cuda && tpb_cuda_map_refs(e->cuda) == 1;
}

/*
 * Drops unused regions: orphans; then, least recently used first, shared-buffer regions while
 * they hold more than @cap bytes, or (@all) every unused region. Return: how many went besides
 * orphans.
 */
static size_t cache_trim(struct tpb_rdma *g, uint64_t cap, bool all)
{
	struct rdma_mr *e, *tmp;
	size_t n = 0;

	tpu_list_for_each_safe(e, tmp, &g->mrs, node) {
		if (e->users)
			continue;
		if (mr_orphan(e)) {
			mr_uncache(g, e);
		} else if (all || (!e->cuda && g->host_bytes > cap)) {
			mr_uncache(g, e);
			g->cache.evictions++;
			n++;
		}
	}
	return n;
}

static uint64_t cache_cap(const struct tpb_rdma *g)
{
	return g->cfg.cache_bytes;
}

/* A cached region of @pt holding [@addr, @addr + @len) of @buf / all of @cuda, or NULL. */
static struct rdma_mr *cache_find(struct tpb_rdma *g, const struct rdma_port *pt,
				 const struct tpb_buffer *buf, const struct tpb_cuda_map *cuda,
				 const struct rdma_dmabuf *d, uint64_t addr, uint64_t len)
{
	struct rdma_mr *e;

	tpu_list_for_each(e, &g->mrs, node) {
		/* a region made from one client's dma-buf serves that client's segments only */
		if (e->port != pt || e->buf != buf || e->cuda != cuda || e->dmabuf != d)
			continue;
		if (cuda || (addr >= e->base && addr - e->base <= e->len &&
			     len <= e->len - (addr - e->base)))
			return e;
	}
	return NULL;
}

/* Sets @e's region for segment @s of shared buffer @s->buf: whole REG_STEPs of the buffer,
 * taking in the cached regions of that buffer on @pt it overlaps or touches (they leave the
 * cache). */
static void host_span(struct tpb_rdma *g, const struct rdma_port *pt,
		      const struct tpb_rdma_seg *s, struct rdma_mr *e)
{
	const struct tpb_buffer *b = s->buf;
	uint64_t map, size, off, lo, hi;
	struct rdma_mr *c, *tmp;

	map = (uint64_t)(uintptr_t)b->map;
	size = b->size;
	off = s->mem.addr - map;
	lo = map + off / REG_STEP * REG_STEP;
	hi = map + TPU_MIN(size, (off + s->len + REG_STEP - 1) / REG_STEP * REG_STEP);

	tpu_list_for_each_safe(c, tmp, &g->mrs, node) {
		if (c->port != pt || c->buf != b || c->base > hi || c->base + c->len < lo)
			continue;
		lo = TPU_MIN(lo, c->base);
		hi = TPU_MAX(hi, c->base + c->len);
		mr_uncache(g, c);
	}
	e->base = lo;
	e->len = hi - lo;
}

/* How a region was registered (tpipctl status counts the CUDA ones). */
enum reg_how {
	REG_HOST,	   /* host memory: ibv_reg_mr */
	REG_CLIENT_DMABUF, /* CUDA: the dma-buf its client exported (CudaDmabuf) */
	REG_DMABUF,	   /* CUDA: a dma-buf the daemon exported of its IPC mapping */
	REG_ADDR,	   /* CUDA: ibv_reg_mr on the device address (nvidia-peermem) */
};

/* Counts how a CUDA region was registered (tpipctl status) and says once per method. */
static void reg_method_count(struct tpb_rdma *g, enum reg_how how, bool exported)
{
	static bool told[REG_ADDR + 1];

	if (how == REG_CLIENT_DMABUF)
		g->cache.reg_client_dmabuf++;
	else if (how == REG_DMABUF)
		g->cache.reg_dmabuf++;
	else if (how == REG_ADDR)
		g->cache.reg_addr++;
	if (how == REG_HOST || (unsigned)how >= TPU_ARRAY_SIZE(told) || told[how])
		return;
	told[how] = true;
	if (how == REG_CLIENT_DMABUF)
		tpu_log_info("rdma: CUDA memory registered from the dma-buf its client exported");
	else if (how == REG_DMABUF)
		tpu_log_notice("rdma: CUDA memory registered from a dma-buf of the daemon's IPC "
			       "mapping (its client exported none)");
	else
		tpu_log_notice("rdma: CUDA memory registered by its device address (needs "
			       "nvidia-peermem), not by dma-buf: %s",
			       exported ? "ibv_reg_dmabuf_mr refused the export"
					: "the CUDA driver exported no dma-buf for it");
}

/* tpv_mr_reg() on @pt: runs on the registration worker (the loop trims the cache and asks
 * again if it fails, reg_job_end()). */
static int mr_reg(struct rdma_port *pt, const struct tpv_mr_args *a, struct tpv_mr **ret,
		  char *why, size_t wl)
{
	return tpv_mr_reg(pt->ctx, a, ret, why, wl);
}

/* Registers the region @a of @e from the client's dma-buf @d, where it holds that region. */
static int client_dmabuf_reg(struct rdma_port *pt, struct rdma_dmabuf *d,
			     struct rdma_mr *e, struct tpv_mr_args *a, char *why, size_t wl)
{
	/* byte 0 of the dma-buf is the allocation's first byte, which the mapping's is */
	if (e->base != e->cuda_ptr || e->len > d->size)
		return tpu_why(-ERANGE, why, wl, "its dma-buf of %llu bytes does not hold the "
			       "%llu bytes at offset %llu", (unsigned long long)d->size,
			       (unsigned long long)e->len,
			       (unsigned long long)(e->base - e->cuda_ptr));
	a->dmabuf_fd = d->fd;
	a->dmabuf_offset = 0;
	a->dmabuf_only = true;
	return mr_reg(pt, a, &e->mr, why, wl);
}

/* Registers CUDA segment @s's whole allocation into @e: from its client's dma-buf @d if any,
 * else (or if that fails) from the daemon's own export, else by address. Runs on the
 * registration worker (the export and the registration may block for long). */
static int cuda_reg(struct rdma_port *pt, const struct tpb_rdma_seg *s,
		    struct rdma_dmabuf *d, struct rdma_mr *e, char *why, size_t wl)
{
	static bool told;
	struct tpv_mr_args a = { .dmabuf_fd = -EBADF, .device_mem = true };
	struct tpb_cuda_range cr;
	char dwhy[192];
	int r;

	r = tpb_cuda_gdr_range(&s->mem, !d, &cr, why, wl);
	if (r < 0)
		return r;
	e->base = cr.base;
	e->len = cr.len;
	e->cuda_ptr = cr.ptr - s->mem.addr;
	a.addr = (void *)(uintptr_t)e->base;
	a.len = e->len;
	if (d) {
		r = client_dmabuf_reg(pt, d, e, &a, dwhy, sizeof(dwhy));
		if (r == 0) {
			e->how = REG_CLIENT_DMABUF; /* e->dmabuf: its reference, on the loop */
			return 0;
		}
		if (!told)
			tpu_log_notice("rdma: a client's dma-buf of its CUDA memory is not usable, "
				       "registering it another way: %s", dwhy);
		told = true;
		r = tpb_cuda_gdr_range(&s->mem, true, &cr, why, wl);
		if (r < 0)
			return r;
		a = (struct tpv_mr_args){ .addr = a.addr, .len = a.len, .device_mem = true };
	}
	a.dmabuf_fd = cr.dmabuf_fd;
	r = mr_reg(pt, &a, &e->mr, why, wl);
	if (cr.dmabuf_fd >= 0)
		close(cr.dmabuf_fd);
	if (r == 0)
		e->how = e->mr->method == TPV_MR_DMABUF ? REG_DMABUF : REG_ADDR;
	e->exported = cr.dmabuf_fd >= 0;
	return r;
}

/* ---- the registration worker ---------------------------------------------------------------- */

/*
 * Registering (ibv_reg_dmabuf_mr, ibv_reg_mr) and the daemon's dma-buf export of a CUDA mapping
 * (cuMemGetHandleForAddressRange) are driver calls that may block for long: a worker thread of
 * @g makes every new region, and the loop asks again (the transfers' timers) until it is done.
 * A job belongs to the loop: the worker only runs it between taking it off @todo and setting
 * @done, then wakes the loop through @efd (in @g's event fd). A job whose transfer went first
 * waits in @orphans until it ran, then goes (tpb_rdma_reg_progress()).
 */
struct rdma_regw {
	pthread_t th;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct tpu_list todo;	 /* struct reg_job by @qnode, under @lock */
	bool stop;		 /* under @lock */
	int efd;		 /* eventfd: a job ran */
	struct tpu_list orphans; /* struct reg_job by @node, loop only */
};

struct reg_job {
	struct tpu_list qnode;	 /* in the worker's todo until it takes it */
	struct tpu_list node;	 /* in the worker's orphans once its transfer went */
	struct rdma_port *pt;	 /* a reference (passed to the region) */
	struct rdma_mr *e;	 /* being made */
	struct tpb_rdma_seg seg; /* the segment; its CUDA mapping held by @cuda */
	struct tpb_cuda_map *cuda; /* a reference, busy until the job goes, or NULL */
	/* The segment's shared buffer, borrowed: for the cache once the job ran, while its
	 * transfer still holds it (an orphan's buffer may go meanwhile: the kernel pins what is
	 * mapped while it registers, and the orphan's region is never offered, only dropped). */
	struct tpb_buffer *buf;
	struct rdma_dmabuf *d;	 /* its client's dma-buf: a reference, or NULL */
	bool cache;		 /* the region goes into the cache */
	bool retried;		 /* asked again after trimming the cache */
	bool done;		 /* atomic: the worker ran it */
	int r;
	char why[160];
};

/* On the worker: makes @j's region. */
static void reg_job_run(struct reg_job *j)
{
	struct tpv_mr_args a = { .dmabuf_fd = -EBADF };

	if (j->seg.mem.loc == TPB_LOC_CUDA) {
		j->r = cuda_reg(j->pt, &j->seg, j->d, j->e, j->why, sizeof(j->why));
		return;
	}
	a.addr = (void *)(uintptr_t)j->e->base;
	a.len = j->e->len;
	j->r = mr_reg(j->pt, &a, &j->e->mr, j->why, sizeof(j->why));
}

static void *regw_main(void *arg)
{
	struct rdma_regw *w = arg;
	uint64_t one = 1;

	pthread_mutex_lock(&w->lock);
	for (;;) {
		struct reg_job *j;

		while (!w->stop && tpu_list_empty(&w->todo))
			pthread_cond_wait(&w->cond, &w->lock);
		if (w->stop)
			break;
		j = tpu_list_first(&w->todo, struct reg_job, qnode);
		tpu_list_remove(&j->qnode);
		pthread_mutex_unlock(&w->lock);
		reg_job_run(j);
		__atomic_store_n(&j->done, true, __ATOMIC_RELEASE);
		if (write(w->efd, &one, sizeof(one)) < 0) {
			/* the counter is full: the loop is awake already */
		}
		pthread_mutex_lock(&w->lock);
	}
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

/* @g's worker, started on first use. Return: it, or NULL (no thread: jobs run on the loop). */
static struct rdma_regw *regw_get(struct tpb_rdma *g)
{
	struct epoll_event ev = { .events = EPOLLIN };
	struct rdma_regw *w = g->regw;

	if (w)
		return w;
	w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	tpu_list_init(&w->todo);
	tpu_list_init(&w->orphans);
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	w->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (w->efd < 0 || epoll_ctl(g->epfd, EPOLL_CTL_ADD, w->efd, &ev) < 0 ||
	    pthread_create(&w->th, NULL, regw_main, w) != 0) {
		if (w->efd >= 0)
			close(w->efd);
		pthread_cond_destroy(&w->cond);
		pthread_mutex_destroy(&w->lock);
		free(w);
		return NULL;
	}
	g->regw = w;
	return w;
}

/* Hands @j to the worker (on the loop if there can be none). */
static void reg_job_queue(struct tpb_rdma *g, struct reg_job *j)
{
	struct rdma_regw *w = regw_get(g);

	__atomic_store_n(&j->done, false, __ATOMIC_RELAXED);
	if (!w) {
		reg_job_run(j);
		__atomic_store_n(&j->done, true, __ATOMIC_RELEASE);
		return;
	}
	pthread_mutex_lock(&w->lock);
	tpu_list_insert_tail(&w->todo, &j->qnode);
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

/* Frees @j (not running) and what it holds, its region if it made one. */
static void reg_job_free(struct reg_job *j)
{
	if (j->e && j->e->mr)
		tpv_mr_dereg(j->pt->ctx, j->e->mr);
	free(j->e);
	if (j->cuda) /* idle on the CUDA layer's worker (where it may close) */
		tpb_cuda_idle_put(tpb_cuda_maps_idle_bg(&j->cuda, 1));
	tpb_cuda_map_unref(j->cuda);
	tpb_rdma_dmabuf_unref(j->d);
	if (j->pt)
		tpb_rdma_port_put(j->pt);
	free(j);
}

/* Starts making a region for segment @s on @rg's port (@rg->job), CUDA memory from its client's
 * dma-buf @d where there is one. Return: 0, or -errno. */
static int reg_job_start(struct tpb_rdma *g, struct rdma_regs *rg, const struct tpb_rdma_seg *s,
			 struct rdma_dmabuf *d, bool cache, char *why, size_t wl)
{
	struct reg_job *j = calloc(1, sizeof(*j));
	int r;

	if (j)
		j->e = calloc(1, sizeof(*j->e));
	if (!j || !j->e) {
		free(j);
		return -ENOMEM;
	}
	r = tpb_rdma_port_open(rg->port, why, wl); /* already open: a reference for the region */
	if (r < 0) {
		free(j->e);
		free(j);
		return r;
	}
	j->pt = rg->port;
	j->seg = *s;
	j->cache = cache;
	j->cuda = s->mem.loc == TPB_LOC_CUDA ? tpb_cuda_map_ref(s->mem.cuda) : NULL;
	if (j->cuda) /* open until the job goes, even if its transfer goes first */
		tpb_cuda_maps_busy(&j->cuda, 1);
	j->buf = s->buf;
	j->d = d ? tpb_rdma_dmabuf_ref(d) : NULL;
	if (s->mem.loc != TPB_LOC_CUDA && cache && s->buf) {
		host_span(g, rg->port, s, j->e);
	} else if (s->mem.loc != TPB_LOC_CUDA) {
		j->e->base = s->mem.addr;
		j->e->len = s->len;
	}
	rg->job = j;
	reg_job_queue(g, j);
	return 0;
}

/* The region @j made (it ran, successfully): counted, cached if it is to be; frees @j. */
static struct rdma_mr *reg_job_take(struct tpb_rdma *g, struct reg_job *j)
{
	struct rdma_mr *e = TAKE_PTR(j->e);

	e->port = TAKE_PTR(j->pt);
	if (e->how == REG_CLIENT_DMABUF)
		e->dmabuf = TAKE_PTR(j->d);
	g->cache.misses++;
	if (j->cuda)
		reg_method_count(g, e->how, e->exported);
	if (j->cache && (j->buf || j->cuda)) {
		e->buf = j->buf ? tpb_buffer_ref(j->buf) : NULL;
		e->cuda = j->cuda ? tpb_cuda_map_ref(j->cuda) : NULL;
		e->cached = true;
		tpu_list_insert_tail(&g->mrs, &e->node);
		g->cache.regions++;
		g->cache.bytes += e->len;
		g->host_bytes += e->cuda ? 0 : e->len;
	}
	reg_job_free(j);
	return e;
}

/*
 * @rg's job, if it ran: its region in @ret (1); failed (-errno, @why), after asking once more
 * if dropping every unused cached region freed some (the device, its BAR or RLIMIT_MEMLOCK may
 * be full of them). Return: 0 while it runs.
 */
static int reg_job_end(struct tpb_rdma *g, struct rdma_regs *rg, struct rdma_mr **ret,
		       char *why, size_t wl)
{
	struct reg_job *j = rg->job;
	int r;

	if (!__atomic_load_n(&j->done, __ATOMIC_ACQUIRE))
		return 0;
	if (j->r < 0 && !j->retried && cache_trim(g, 0, true) > 0) {
		j->retried = true;
		reg_job_queue(g, j);
		return 0;
	}
	rg->job = NULL;
	if (j->r < 0) {
		r = j->r;
		snprintf(why, wl, "%s", j->why);
		reg_job_free(j);
		return r;
	}
	*ret = reg_job_take(g, j);
	return 1;
}

/* @rg goes with its job unfinished: freed now if it ran, else once it has. */
static void reg_job_abandon(struct tpb_rdma *g, struct rdma_regs *rg)
{
	struct reg_job *j = TAKE_PTR(rg->job);

	if (!j)
		return;
	if (__atomic_load_n(&j->done, __ATOMIC_ACQUIRE) || !g->regw)
		reg_job_free(j);
	else
		tpu_list_insert_tail(&g->regw->orphans, &j->node);
}

void tpb_rdma_reg_progress(struct tpb_rdma *g)
{
	struct reg_job *j, *tmp;
	uint64_t n;

	if (!g->regw)
		return;
	if (read(g->regw->efd, &n, sizeof(n)) < 0) {
		/* EAGAIN: no job ran since */
	}
	tpu_list_for_each_safe(j, tmp, &g->regw->orphans, node) {
		if (!__atomic_load_n(&j->done, __ATOMIC_ACQUIRE))
			continue;
		tpu_list_remove(&j->node);
		reg_job_free(j);
	}
}

/* Stops @g's worker (after the job it runs) and frees every job left. */
static void regw_stop(struct tpb_rdma *g)
{
	struct rdma_regw *w = TAKE_PTR(g->regw);
	struct reg_job *j, *tmp;

	if (!w)
		return;
	pthread_mutex_lock(&w->lock);
	w->stop = true;
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
	pthread_join(w->th, NULL);
	tpu_list_for_each_safe(j, tmp, &w->orphans, node) {
		tpu_list_remove(&j->node);
		reg_job_free(j);
	}
	(void)epoll_ctl(g->epfd, EPOLL_CTL_DEL, w->efd, NULL);
	close(w->efd);
	pthread_cond_destroy(&w->cond);
	pthread_mutex_destroy(&w->lock);
	free(w);
}

/* ---- a transfer's registrations --------------------------------------------------------------- */

/*
 * The registration of segment @s on @rg's port into @out: a cached region holding it, else a
 * new one the worker makes (@rg->job). Return: 1 done, 0 registering (ask again), -errno.
 */
static int reg_one(struct tpb_rdma *g, struct rdma_regs *rg, const struct tpb_rdma_seg *s,
		   struct rdma_reg *out, char *why, size_t wl)
{
	struct tpb_cuda_map *cuda = s->mem.loc == TPB_LOC_CUDA ? s->mem.cuda : NULL;
	/* A CUDA allocation only while a session holds its mapping (cuda-cache-mappings): under
	 * the default contract the mapping goes with the transfer, and a region kept past it
	 * would keep the mapping open after the client was told it may free the memory. */
	bool cache = cache_cap(g) > 0 && (!cuda || tpb_cuda_map_held(cuda));
	struct rdma_dmabuf *d = NULL;
	struct rdma_mr *e = NULL;
	int r;

	if (rg->job) {
		r = reg_job_end(g, rg, &e, why, wl);
		if (r <= 0)
			return r;
	} else {
		if (cuda)
			d = tpb_rdma_dmabuf_find(g, s->mem.proc, tpb_cuda_gdr_handle(&s->mem));
		if (cache && (s->buf || cuda))
			e = cache_find(g, rg->port, s->buf, cuda, d, s->mem.addr, s->len);
		if (!e)
			return reg_job_start(g, rg, s, d, cache, why, wl);
		g->cache.hits++;
		tpu_list_remove(&e->node); /* now the most recently used */
		tpu_list_insert_tail(&g->mrs, &e->node);
	}
	e->users++;
	out->e = e;
	out->addr = cuda ? e->cuda_ptr + s->mem.addr : s->mem.addr;
	out->len = s->len;
	out->lkey = e->mr->lkey;
	out->rkey = e->mr->rkey;
	return 1;
}

/* The port for memory on the GPU @bus_id (NULL: host memory): nearest by topology, else next. */
static struct rdma_port *port_for(struct tpb_rdma *g, const char *bus_id)
{
	int k = tpv_nic_choose(g->nics, g->n, TPV_SYSFS_ROOT, bus_id, &g->rr);

	return &g->ports[k < 0 ? 0 : k];
}

int tpb_rdma_reg_applicable(const struct tpb_rdma_seg *segs, size_t n, char *why, size_t wl)
{
	for (size_t i = 0; i < n; i++) {
		if (segs[i].len && segs[i].mem.loc != TPB_LOC_CUDA &&
		    segs[i].mem.loc != TPB_LOC_LOCAL) {
			snprintf(why, wl, "segment %zu is in a client's private memory", i);
			return -EOPNOTSUPP;
		}
	}
	return 0;
}

int tpb_rdma_reg_method(const struct rdma_regs *rg, size_t i)
{
	const struct rdma_mr *e = rg->r && i < rg->n ? rg->r[i].e : NULL;

	if (!e || e->how == REG_HOST)
		return -1;
	return e->how == REG_CLIENT_DMABUF ? RDMA_REG_CLIENT_DMABUF
	       : e->how == REG_DMABUF	   ? RDMA_REG_DMABUF
					   : RDMA_REG_ADDR;
}

void tpb_rdma_reg_free(struct rdma_regs *rg)
{
	struct tpb_rdma *g = rg->port ? rg->port->g : NULL;

	if (g)
		reg_job_abandon(g, rg);
	for (size_t i = 0; rg->r && i < rg->n; i++) {
		struct rdma_mr *e = rg->r[i].e;

		if (e && --e->users == 0 && !e->cached)
			mr_free(e);
	}
	free(rg->r);
	rg->r = NULL;
	rg->next = 0;
	if (rg->opened)
		tpb_rdma_port_put(rg->port);
	rg->opened = false;
	if (g)
		cache_trim(g, cache_cap(g), false);
}

int tpb_rdma_reg_make(struct tpb_rdma *g, const struct tpb_rdma_seg *segs, size_t n,
		    struct rdma_regs *rg, char *why, size_t wl)
{
	int r = 0;

	if (!rg->r) { /* the first call */
		if (!rg->port) /* else the caller's choice */
			rg->port = port_for(g, tpb_cuda_bus_id(tpb_rdma_reg_first_cuda(segs, n)));
		rg->n = n;
		rg->next = 0;
		rg->r = calloc(n ? n : 1, sizeof(*rg->r));
		if (!rg->r)
			return -ENOMEM;
		r = tpb_rdma_port_open(rg->port, why, wl);
		rg->opened = r == 0;
	}
	for (; r == 0 && rg->next < n; rg->next++) {
		if (!segs[rg->next].len)
			continue;
		r = reg_one(g, rg, &segs[rg->next], &rg->r[rg->next], why, wl);
		if (r == 0)
			return 0; /* the worker registers it: asked again */
		r = r > 0 ? 0 : r;
	}
	if (r < 0) {
		tpb_rdma_reg_free(rg);
		return r;
	}
	return 1;
}

void tpb_rdma_cache_stop(struct tpb_rdma *g)
{
	struct rdma_mr *e, *tmp;

	regw_stop(g);
	tpu_list_for_each_safe(e, tmp, &g->mrs, node)
		mr_uncache(g, e);
}

void tpb_rdma_forget_buffer(struct tpb_rdma *g, struct tpb_buffer *b)
{
	struct rdma_mr *e, *tmp;

	if (!g)
		return;
	tpu_list_for_each_safe(e, tmp, &g->mrs, node)
		if (e->buf == b)
			mr_uncache(g, e);
}

void tpb_rdma_forget_cuda(struct tpb_rdma *g)
{
	struct rdma_mr *e, *tmp;

	if (!g)
		return;
	tpu_list_for_each_safe(e, tmp, &g->mrs, node)
		if (e->cuda && !e->users && mr_orphan(e))
			mr_uncache(g, e);
}

int tpb_rdma_forget_mem(struct tpb_rdma *g, const struct tpb_mem *m, uint64_t len)
{
	struct rdma_mr *e, *tmp;

	if (!g)
		return 0;
	tpu_list_for_each_safe(e, tmp, &g->mrs, node) {
		bool hit = m->loc == TPB_LOC_CUDA ? e->cuda && e->cuda == m->cuda
						  : e->buf && e->base < m->addr + len &&
							    m->addr < e->base + e->len;
		if (hit)
			mr_uncache(g, e);
	}
	return 0;
}

void tpb_rdma_cache_stats(const struct tpb_rdma *g, struct tpb_rdma_cache_stats *ret)
{
	*ret = g ? g->cache : (struct tpb_rdma_cache_stats){0};
}

#else /* !HAVE_RDMA */

void tpb_rdma_forget_buffer(struct tpb_rdma *g, struct tpb_buffer *b)
{
}

void tpb_rdma_forget_cuda(struct tpb_rdma *g)
{
}

int tpb_rdma_forget_mem(struct tpb_rdma *g, const struct tpb_mem *m, uint64_t len)
{
	return 0;
}

void tpb_rdma_cache_stats(const struct tpb_rdma *g, struct tpb_rdma_cache_stats *ret)
{
	*ret = (struct tpb_rdma_cache_stats){0};
}

#endif
