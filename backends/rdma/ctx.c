/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The daemon's RDMA context (struct tpb_rdma, rdma.h) for rdma and cuda_gdr: its ports (a
 * device context, protection domain and completion queue each, opened on first use and closed
 * with the last user), its event fd (an epoll fd over the ports' completion channels and one
 * timerfd) and progress, which drains the completion queues and runs the timers the links and
 * transfers arm (CUDA event polls, completions decided outside a call). Links and transfers
 * are link.c's, registration reg.c's, the op table's endpoint ep.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tpconfig.h"
#if HAVE_RDMA
#include <sys/epoll.h>
#include <sys/timerfd.h>
#endif
#include "log.h"
#include "rdma_int.h"
#include "tpb.h"

#if HAVE_RDMA

#define RDMA_CQ_DEPTH 4096 /* completions per port, shared by its queue pairs */

/* ---- the event fd: completion channels and timers ------------------------------------------ */

/* Arms the timerfd for the first armed timer (or disarms it). */
static void timers_rearm(struct tpb_rdma *g)
{
	struct itimerspec its = { 0 };
	struct rdma_timer *t;
	uint64_t first = UINT64_MAX;

	tpu_list_for_each(t, &g->timers, node)
		first = TPU_MIN(first, t->due_ns);
	if (first != UINT64_MAX) {
		first = TPU_MAX(first, 1); /* 0 would disarm */
		its.it_value.tv_sec = (time_t)(first / 1000000000u);
		its.it_value.tv_nsec = (long)(first % 1000000000u);
	}
	(void)timerfd_settime(g->tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

void tpb_rdma_timer_in_us(struct tpb_rdma *g, struct rdma_timer *t, long us)
{
	t->due_ns = tpu_now_ns() + (uint64_t)us * 1000u;
	if (!t->armed)
		tpu_list_insert_tail(&g->timers, &t->node);
	t->armed = true;
	timers_rearm(g);
}

void tpb_rdma_timer_stop(struct rdma_timer *t)
{
	if (t->armed)
		tpu_list_remove(&t->node);
	t->armed = false;
}

/* Runs the timers due by @now, one at a time (each may arm, stop or free others). */
static void timers_run(struct tpb_rdma *g, uint64_t now)
{
	for (;;) {
		struct rdma_timer *t, *due = NULL;

		tpu_list_for_each(t, &g->timers, node) {
			if (t->due_ns <= now) {
				due = t;
				break;
			}
		}
		if (!due)
			break;
		tpb_rdma_timer_stop(due);
		due->fn(due);
	}
	timers_rearm(g);
}

/* ---- ports --------------------------------------------------------------------------------- */

static void port_on_cq(struct rdma_port *pt)
{
	int r = tpv_cq_drain(pt->ctx, tpb_rdma_write_done, pt->g);

	if (r < 0)
		tpu_log(TPU_LOG_ERR, "rdma: %s port %u: completion queue failed: %s",
			pt->nic->dev, pt->nic->port, strerror(-r));
}

/* Closes @pt's device context and stops watching its completion channel. */
static void port_close(struct rdma_port *pt)
{
	if (pt->ctx)
		(void)epoll_ctl(pt->g->epfd, EPOLL_CTL_DEL, tpv_cq_fd(pt->ctx), NULL);
	tpv_ctx_close(pt->ctx);
	pt->ctx = NULL;
}

void tpb_rdma_port_put(struct rdma_port *pt)
{
	if (--pt->refs)
		return;
	port_close(pt);
}

int tpb_rdma_port_open(struct rdma_port *pt, char *why, size_t wl)
{
	int r;

	if (pt->ctx) {
		pt->refs++;
		return 0;
	}
	if (pt->why[0]) {
		snprintf(why, wl, "%s", pt->why);
		return -EIO;
	}
	r = tpv_ctx_open(pt->g->ops, pt->nic, RDMA_CQ_DEPTH, &pt->ctx, pt->why, sizeof(pt->why));
	if (r == 0) {
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = pt };

		if (epoll_ctl(pt->g->epfd, EPOLL_CTL_ADD, tpv_cq_fd(pt->ctx), &ev) < 0) {
			r = -errno;
			snprintf(pt->why, sizeof(pt->why),
				 "cannot watch the completion channel: %s", strerror(-r));
			tpv_ctx_close(pt->ctx);
			pt->ctx = NULL;
		}
	}
	if (r < 0) {
		tpv_ctx_close(pt->ctx);
		pt->ctx = NULL;
		/* once: the failure is sticky, links and registrations use the other ports */
		tpu_log(TPU_LOG_WARNING, "rdma: %s port %u unusable, skipped: %s", pt->nic->dev,
			pt->nic->port, pt->why);
		snprintf(why, wl, "%s", pt->why);
		return r;
	}
	pt->refs = 1;
	return 0;
}

/* Did the registry find channel @name viable? */
static bool rdma_channel_viable(const char *name)
{
	size_t n;
	const struct tpb_channel_info *ch = tpb_registry_list(&n);
	int i = tpb_index(name);

	return i >= 0 && (size_t)i < n && ch[i].viable;
}

/* With a configured GID index, every port uses that entry; a port where it is empty or unusable
 * is left out (logged). Return: the ports kept, first in g->nics. */
static size_t ctx_use_gid(struct tpb_rdma *g, size_t n)
{
	size_t kept = 0;

	if (!g->cfg.gid_index_set)
		return n;
	for (size_t i = 0; i < n; i++) {
		char why[200] = "";

		if (tpv_nic_use_gid(g->ops, &g->nics[i], (int)TPU_MIN(g->cfg.gid_index, 1024u), why,
				    sizeof(why)) < 0) {
			tpu_log(TPU_LOG_WARNING, "rdma: %s port %u left out: %s (rdma-gid-index)",
				g->nics[i].dev, g->nics[i].port, why);
			continue;
		}
		g->nics[kept++] = g->nics[i];
	}
	return kept;
}

/* Finds the ports of @g (none is fine). Return: 0, or -ENOMEM. */
static int ctx_find_ports(struct tpb_rdma *g)
{
	char why[256] = "";
	size_t n = 0;

	if (g->cfg.disabled) {
		tpu_log(TPU_LOG_INFO, "rdma and cuda_gdr: disabled by configuration");
		return 0;
	}
	/* The registry probed RDMA once at start-up (rdma and cuda_gdr share that probe); its
	 * "channel rdma/cuda_gdr: not viable" lines say why, at info. */
	if (!rdma_channel_viable("rdma"))
		return 0;
	g->cuda = rdma_channel_viable("cuda_gdr");
	g->ops = tpv_ops_load(why, sizeof(why));
	if (!g->ops) {
		/* the probes' "channel rdma/cuda_gdr: not viable" lines say why, at info */
		tpu_log(TPU_LOG_DEBUG, "rdma: %s", why);
		return 0;
	}
	if (tpv_nics_list(g->ops, TPV_SYSFS_ROOT, &g->nics, &n, why, sizeof(why)) < 0)
		return -ENOMEM;
	n = ctx_use_gid(g, n);
	g->ports = calloc(n ? n : 1, sizeof(*g->ports));
	if (!g->ports)
		return -ENOMEM;
	n = TPU_MIN(n, (size_t)g->cfg.ports_max);
	for (size_t i = 0; i < n; i++)
		g->ports[i] = (struct rdma_port){ .g = g, .nic = &g->nics[i] };
	g->n = n;
	if (n)
		tpu_log(TPU_LOG_INFO, "rdma%s: %zu RDMA port%s, first %s port %u",
			g->cuda ? " and cuda_gdr" : "", n, n == 1 ? "" : "s", g->nics[0].dev,
			g->nics[0].port);
	return 0;
}

int tpb_rdma_ctx_new(const struct tpb_rdma_config *cfg, struct tpb_rdma **ret)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
	struct tpb_rdma *g = calloc(1, sizeof(*g));
	int r;

	if (!g)
		return -ENOMEM;
	g->base.ops = &tpb_rdma_ops;
	g->base.idx = tpb_index("rdma");
	g->gdr_base.ops = &tpb_cuda_gdr_ops;
	g->gdr_base.idx = tpb_index("cuda_gdr");
	g->cfg = *cfg;
	g->epfd = g->tfd = -EBADF;
	tpu_list_init(&g->mrs);
	tpu_list_init(&g->dmabufs);
	tpu_list_init(&g->timers);
	tpu_list_init(&g->links);
	g->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (g->epfd >= 0)
		g->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	if (g->epfd < 0 || g->tfd < 0 || epoll_ctl(g->epfd, EPOLL_CTL_ADD, g->tfd, &ev) < 0)
		r = -errno;
	else
		r = ctx_find_ports(g);
	if (r < 0) {
		tpb_rdma_ctx_free(g);
		return r;
	}
	*ret = g;
	return 0;
}

void tpb_rdma_ctx_free(struct tpb_rdma *g)
{
	if (!g)
		return;
	tpb_rdma_cache_stop(g);
	tpb_rdma_dmabuf_stop(g);
	for (size_t i = 0; i < g->n; i++)
		port_close(&g->ports[i]);
	if (g->tfd >= 0)
		close(g->tfd);
	if (g->epfd >= 0)
		close(g->epfd);
	free(g->ports);
	free(g->nics);
	free(g);
}

void tpb_rdma_set_cache(struct tpb_rdma *g, uint64_t cache_bytes)
{
	if (g)
		g->cfg.cache_bytes = cache_bytes;
}

int tpb_rdma_event_fd(struct tpb_rdma *g)
{
	return g->epfd;
}

int tpb_rdma_progress(struct tpb_rdma *g)
{
	uint64_t expirations;

	if (read(g->tfd, &expirations, sizeof(expirations)) < 0) {
		/* EAGAIN: the timer did not fire; a completion channel did */
	}
	for (size_t i = 0; i < g->n; i++)
		if (g->ports[i].ctx)
			port_on_cq(&g->ports[i]);
	tpb_rdma_reg_progress(g);
	timers_run(g, tpu_now_ns());
	return 0;
}

unsigned tpb_rdma_offers(const struct tpb_rdma *g)
{
	if (!g || g->n == 0)
		return 0;
	return TPB_RDMA_HOST | (g->cuda ? TPB_RDMA_CUDA : 0);
}

#else /* !HAVE_RDMA */

struct tpb_rdma {
	struct tpb_ctx base; /* first: the op table's head */
	struct tpb_ctx gdr_base;
};

int tpb_rdma_ctx_new(const struct tpb_rdma_config *cfg, struct tpb_rdma **ret)
{
	struct tpb_rdma *g = calloc(1, sizeof(*g));

	if (!g)
		return -ENOMEM;
	g->base.ops = &tpb_rdma_ops;
	g->base.idx = tpb_index("rdma");
	g->gdr_base.ops = &tpb_cuda_gdr_ops;
	g->gdr_base.idx = tpb_index("cuda_gdr");
	*ret = g;
	return 0;
}

void tpb_rdma_ctx_free(struct tpb_rdma *g)
{
	free(g);
}

void tpb_rdma_set_cache(struct tpb_rdma *g, uint64_t cache_bytes)
{
}

int tpb_rdma_event_fd(struct tpb_rdma *g)
{
	return -EOPNOTSUPP;
}

int tpb_rdma_progress(struct tpb_rdma *g)
{
	return -EOPNOTSUPP;
}

unsigned tpb_rdma_offers(const struct tpb_rdma *g)
{
	return 0;
}

#endif

struct tpb_rdma *tpb_rdma_of(struct tpb_ctx *ctx)
{
	if (ctx && ctx->ops == &tpb_cuda_gdr_ops)
		return tpu_container_of(ctx, struct tpb_rdma, gdr_base);
	return ctx && ctx->ops == &tpb_rdma_ops ? (struct tpb_rdma *)ctx : NULL;
}

struct tpb_ctx *tpb_rdma_ctx(struct tpb_rdma *g)
{
	return g ? &g->base : NULL;
}

struct tpb_ctx *tpb_rdma_gdr_ctx(struct tpb_rdma *g)
{
	return g ? &g->gdr_base : NULL;
}
