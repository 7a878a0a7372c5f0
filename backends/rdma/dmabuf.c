/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Client-exported dma-bufs (issue 28, item 4): the dma-buf of a whole CUDA allocation that its
 * owning client exported itself and handed over (CudaDmabuf, fd by SCM_RIGHTS), kept per client
 * process and allocation handle so that reg.c registers that allocation from it
 * (ibv_reg_dmabuf_mr) rather than from a dma-buf of the range the daemon imported by IPC, which
 * the driver does not document. This file checks what it is given (a dma-buf for the verbs
 * provider, at least as large as claimed: the claim is the client's and not trusted), holds it
 * (bounded per client, least recently handed over dropped first) and finds it again; it neither
 * registers memory (reg.c) nor talks to the client (daemon/local/devmem.c). An entry holds its
 * fd until the client drops it and the last registration made from it ends. Loop thread only.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "log.h"
#include "rdma_int.h"

#if HAVE_RDMA

/* Closes @fd (if any) and lowers the counters it was charged to. */
static void fd_close(int fd, atomic_uint *charge[2])
{
	if (fd >= 0)
		close(fd);
	for (int i = 0; i < 2; i++)
		if (charge && charge[i])
			atomic_fetch_sub(charge[i], 1);
}

static void dmabuf_free(struct rdma_dmabuf *d)
{
	fd_close(d->fd, d->charge);
	tpb_proc_unref(d->owner);
	free(d);
}

void tpb_rdma_dmabuf_unref(struct rdma_dmabuf *d)
{
	if (d && --d->refs == 0)
		dmabuf_free(d);
}

struct rdma_dmabuf *tpb_rdma_dmabuf_ref(struct rdma_dmabuf *d)
{
	d->refs++;
	return d;
}

/* Takes @d out of the registry (its registrations keep it until they end). */
static void dmabuf_unlist(struct tpb_rdma *g, struct rdma_dmabuf *d)
{
	tpu_list_remove(&d->node);
	g->cache.dmabufs--;
	tpb_rdma_dmabuf_unref(d);
}

struct rdma_dmabuf *tpb_rdma_dmabuf_find(struct tpb_rdma *g, const struct tpb_proc *owner,
					 const uint8_t *handle)
{
	struct rdma_dmabuf *d;

	if (!owner || !handle)
		return NULL;
	tpu_list_for_each(d, &g->dmabufs, node)
		if (d->owner == owner && !memcmp(d->handle, handle, sizeof(d->handle)))
			return d;
	return NULL;
}

/* Checks @fd against the claim of @size bytes. Return: 0, or -errno with @why set. */
static int dmabuf_check(const struct tpb_rdma *g, int fd, uint64_t size, char *why, size_t wl)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), have = 0;
	int r = tpv_dmabuf_size(g->ops, fd, &have);

	if (r == -EBADF)
		return tpu_why(-EINVAL, why, wl, "no open fd");
	if (r < 0)
		return tpu_why(-EINVAL, why, wl, "the fd is not a dma-buf");
	if (size % page)
		return tpu_why(-EINVAL, why, wl, "a dma-buf of %llu bytes, not whole pages",
			       (unsigned long long)size);
	if (have < size)
		return tpu_why(-EINVAL, why, wl, "a dma-buf of %llu bytes said to hold %llu",
			       (unsigned long long)have, (unsigned long long)size);
	return 0;
}

/* Drops the least recently handed over of @owner's while it holds @max or more. */
static void dmabuf_trim(struct tpb_rdma *g, const struct tpb_proc *owner, unsigned max)
{
	for (;;) {
		struct rdma_dmabuf *d, *old = NULL;
		unsigned n = 0;

		tpu_list_for_each(d, &g->dmabufs, node) {
			if (d->owner != owner)
				continue;
			n++;
			if (!old)
				old = d; /* the list is in hand-over order */
		}
		if (n < max || !old)
			return;
		dmabuf_unlist(g, old);
		g->cache.dmabufs_evicted++;
	}
}

int tpb_rdma_dmabuf_add(struct tpb_rdma *g, struct tpb_proc *owner, const uint8_t *handle,
			uint64_t size, int fd, atomic_uint *charge[2], unsigned max, char *why,
			size_t wl)
{
	struct rdma_dmabuf *d, *old;
	int r = 0;

	if (!g || !g->cuda || g->n == 0)
		r = tpu_why(-EOPNOTSUPP, why, wl, "no RDMA with CUDA on this host");
	else if (!owner)
		r = tpu_why(-EOPNOTSUPP, why, wl, "the client's process is not pinned");
	else if (max == 0)
		r = tpu_why(-ENOBUFS, why, wl, "cuda-dmabufs-max is 0");
	else
		r = dmabuf_check(g, fd, size, why, wl);
	d = r == 0 ? calloc(1, sizeof(*d)) : NULL;
	if (r == 0 && !d)
		r = tpu_why(-ENOMEM, why, wl, "out of memory");
	if (r < 0) {
		fd_close(fd, charge);
		if (g)
			g->cache.dmabufs_refused++;
		return r;
	}
	old = tpb_rdma_dmabuf_find(g, owner, handle);
	if (old) /* a new export of the same allocation replaces the old one */
		dmabuf_unlist(g, old);
	dmabuf_trim(g, owner, max); /* room for the new one */
	d->owner = tpb_proc_ref(owner);
	memcpy(d->handle, handle, sizeof(d->handle));
	d->size = size;
	d->fd = fd;
	d->charge[0] = charge ? charge[0] : NULL;
	d->charge[1] = charge ? charge[1] : NULL;
	d->refs = 1; /* the registry's */
	tpu_list_insert_tail(&g->dmabufs, &d->node);
	g->cache.dmabufs++;
	return 0;
}

int tpb_rdma_dmabuf_drop(struct tpb_rdma *g, const struct tpb_proc *owner, const uint8_t *handle)
{
	struct rdma_dmabuf *d = g ? tpb_rdma_dmabuf_find(g, owner, handle) : NULL;

	if (!d)
		return 0;
	dmabuf_unlist(g, d);
	return 1;
}

void tpb_rdma_dmabuf_drop_owner(struct tpb_rdma *g, const struct tpb_proc *owner)
{
	struct rdma_dmabuf *d, *tmp;

	if (!g || !owner)
		return;
	tpu_list_for_each_safe(d, tmp, &g->dmabufs, node)
		if (d->owner == owner)
			dmabuf_unlist(g, d);
}

void tpb_rdma_dmabuf_stop(struct tpb_rdma *g)
{
	struct rdma_dmabuf *d, *tmp;

	tpu_list_for_each_safe(d, tmp, &g->dmabufs, node)
		dmabuf_unlist(g, d);
}

#else /* !HAVE_RDMA */

int tpb_rdma_dmabuf_add(struct tpb_rdma *g, struct tpb_proc *owner, const uint8_t *handle,
			uint64_t size, int fd, atomic_uint *charge[2], unsigned max, char *why,
			size_t wl)
{
	if (fd >= 0)
		close(fd);
	for (int i = 0; i < 2; i++)
		if (charge && charge[i])
			atomic_fetch_sub(charge[i], 1);
	snprintf(why, wl, "tpipd was built without RDMA support");
	return -EOPNOTSUPP;
}

int tpb_rdma_dmabuf_drop(struct tpb_rdma *g, const struct tpb_proc *owner, const uint8_t *handle)
{
	return 0;
}

void tpb_rdma_dmabuf_drop_owner(struct tpb_rdma *g, const struct tpb_proc *owner)
{
}

#endif
