/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A verbs context on one port: the device opened by name, a protection domain, a completion channel
 * whose fd the event loop watches, completion queues shared by the port's queue pairs (one at
 * first, sized within the device's max_cqe; another, up to its max_cq, when a queue pair would no
 * longer fit, so that no queue can overflow), and the memory regions registered against that domain
 * (dma-buf or plain). Queue pairs and writes are qp.c's and write.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include "tpv-int.h"

/* Opens the device called @name. Return: 0 or -errno (reason in @why). */
static int open_by_name(const struct tpv_ops *ops, const char *name, struct ibv_context **ret,
			char *why, size_t why_len)
{
	struct ibv_context *verbs = NULL;
	struct ibv_device **list;
	char eb[64];
	int i, n = 0, r = -ENODEV;

	errno = 0;
	list = ops->get_device_list(&n);
	if (!list) {
		r = tpv_verbs_errno(-ENODEV);
		return tpu_why(r, why, why_len, "ibv_get_device_list: %s",
			       tpu_strerror(r, eb, sizeof(eb)));
	}
	for (i = 0; i < n; i++) {
		if (strcmp(list[i]->name, name))
			continue;
		errno = 0;
		verbs = ops->open_device(list[i]);
		r = verbs ? 0 : tpv_verbs_errno(-ENODEV);
		break;
	}
	ops->free_device_list(list);
	if (r == -ENODEV && i == n)
		return tpu_why(r, why, why_len, "%s: no such RDMA device", name);
	if (r < 0)
		return tpu_why(r, why, why_len, "%s: ibv_open_device: %s", name,
			       tpu_strerror(r, eb, sizeof(eb)));
	*ret = verbs;
	return 0;
}

/* A new completion queue of ctx->cq_depth entries on the channel, armed. Return: 0 or -errno. */
static int ctx_add_cq(struct tpv_ctx *ctx, char *why, size_t why_len)
{
	const struct tpv_ops *ops = ctx->ops;
	struct ibv_cq *cq;
	char eb[64];
	int r;

	errno = 0;
	cq = ops->create_cq(ctx->verbs, ctx->cq_depth, ctx, ctx->channel, 0);
	if (!cq) {
		r = tpv_verbs_errno(-ENOMEM);
		return tpu_why(r, why, why_len, "ibv_create_cq(%d): %s", ctx->cq_depth,
			       tpu_strerror(r, eb, sizeof(eb)));
	}
	ctx->cqs[ctx->n_cqs++] = (struct tpv_cq){ .cq = cq, .depth = ctx->cq_depth };
	r = tpv_verbs_rc(ops->req_notify_cq(cq, 0));
	if (r < 0)
		return tpu_why(r, why, why_len, "ibv_req_notify_cq: %s",
			       tpu_strerror(r, eb, sizeof(eb)));
	return 0;
}

/* Completion channel (non-blocking fd) and the first armed completion queue. */
static int ctx_make_cq(struct tpv_ctx *ctx, char *why, size_t why_len)
{
	const struct tpv_ops *ops = ctx->ops;
	char eb[64];
	int r;

	errno = 0;
	ctx->channel = ops->create_comp_channel(ctx->verbs);
	if (!ctx->channel) {
		r = tpv_verbs_errno(-ENOMEM);
		return tpu_why(r, why, why_len, "ibv_create_comp_channel: %s",
			       tpu_strerror(r, eb, sizeof(eb)));
	}
	r = tpu_fd_nonblock(ctx->channel->fd);
	if (r < 0)
		return tpu_why(r, why, why_len, "completion channel: fcntl: %s",
			       tpu_strerror(r, eb, sizeof(eb)));
	return ctx_add_cq(ctx, why, why_len);
}

int tpv_ctx_cq_reserve(struct tpv_ctx *ctx, uint32_t slots, char *why, size_t why_len)
{
	uint32_t used = 0;
	unsigned i;
	int r;

	for (i = 0; i < ctx->n_cqs; i++) {
		if ((uint64_t)ctx->cqs[i].used + slots <= (uint64_t)ctx->cqs[i].depth) {
			ctx->cqs[i].used += slots;
			return (int)i;
		}
		used += ctx->cqs[i].used;
	}
	if ((uint64_t)slots > (uint64_t)ctx->cq_depth || ctx->n_cqs >= ctx->max_cqs)
		return tpu_why(-ENOSPC, why, why_len,
			       "completion queue%s of %d entries cannot take %u more (%u in use)",
			       ctx->n_cqs > 1 ? "s" : "", ctx->cq_depth, slots, used);
	r = ctx_add_cq(ctx, why, why_len);
	if (r < 0)
		return r;
	ctx->cqs[i].used = slots;
	return (int)i;
}

/* Device limits and the protection domain. */
static int ctx_make_pd(struct tpv_ctx *ctx, char *why, size_t why_len)
{
	struct ibv_device_attr da;
	char eb[64];
	int r;

	memset(&da, 0, sizeof(da));
	r = tpv_verbs_rc(ctx->ops->query_device(ctx->verbs, &da));
	if (r < 0)
		return tpu_why(r, why, why_len, "ibv_query_device: %s",
			       tpu_strerror(r, eb, sizeof(eb)));
	ctx->max_qp_wr = da.max_qp_wr > 0 ? (uint32_t)da.max_qp_wr : 1;
	if (da.max_cqe > 0 && ctx->cq_depth > da.max_cqe)
		ctx->cq_depth = da.max_cqe;
	/* a device that does not say how many it takes gets one, as it always had */
	ctx->max_cqs = da.max_cq > 1 ? TPU_MIN((unsigned)da.max_cq, TPV_CQS_MAX) : 1;
	errno = 0;
	ctx->pd = ctx->ops->alloc_pd(ctx->verbs);
	if (!ctx->pd) {
		r = tpv_verbs_errno(-ENOMEM);
		return tpu_why(r, why, why_len, "ibv_alloc_pd: %s",
			       tpu_strerror(r, eb, sizeof(eb)));
	}
	return 0;
}

int tpv_ctx_open(const struct tpv_ops *ops, const struct tpv_nic *nic, int cq_depth,
		 struct tpv_ctx **ret, char *why, size_t why_len)
{
	struct tpv_ctx *ctx;
	int r;

	if (cq_depth <= 0)
		return tpu_why(-EINVAL, why, why_len, "completion queue depth %d", cq_depth);
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return tpu_why(-ENOMEM, why, why_len, "out of memory");
	ctx->ops = ops;
	ctx->nic = *nic;
	ctx->cq_depth = cq_depth;
	tpu_list_init(&ctx->qps);
	r = open_by_name(ops, nic->dev, &ctx->verbs, why, why_len);
	if (r >= 0)
		r = ctx_make_pd(ctx, why, why_len);
	if (r >= 0)
		r = ctx_make_cq(ctx, why, why_len);
	if (r < 0) {
		tpv_ctx_close(ctx);
		return r;
	}
	*ret = ctx;
	return 0;
}

void tpv_ctx_close(struct tpv_ctx *ctx)
{
	if (!ctx)
		return;
	for (unsigned i = 0; i < ctx->n_cqs; i++)
		ctx->ops->destroy_cq(ctx->cqs[i].cq);
	if (ctx->channel)
		ctx->ops->destroy_comp_channel(ctx->channel);
	if (ctx->pd)
		ctx->ops->dealloc_pd(ctx->pd);
	if (ctx->verbs)
		ctx->ops->close_device(ctx->verbs);
	free(ctx);
}

const struct tpv_nic *tpv_ctx_nic(const struct tpv_ctx *ctx)
{
	return &ctx->nic;
}

int tpv_cq_fd(const struct tpv_ctx *ctx)
{
	return ctx->channel ? ctx->channel->fd : -EBADF;
}

struct tpv_qp *tpv_ctx_find_qp(struct tpv_ctx *ctx, uint32_t qpn)
{
	struct tpv_qp *qp;

	tpu_list_for_each(qp, &ctx->qps, link) {
		if (qp->qp->qp_num == qpn)
			return qp;
	}
	return NULL;
}

const char *tpv_mr_method_name(enum tpv_mr_method m)
{
	return m == TPV_MR_DMABUF ? "dma-buf" : "host";
}

/* ibv_reg_mr on the address; @dmabuf_err says why dma-buf was not used, if it was tried. */
static int mr_reg_host(struct tpv_ctx *ctx, const struct tpv_mr_args *a, const char *dmabuf_err,
		       struct ibv_mr **ret, char *why, size_t why_len)
{
	int r, access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	const char *es;
	char eb[64];

	errno = 0;
	*ret = ctx->ops->reg_mr(ctx->pd, a->addr, a->len, access);
	if (*ret)
		return 0;
	r = tpv_verbs_errno(-EFAULT);
	es = tpu_strerror(r, eb, sizeof(eb));
	if (!a->device_mem)
		return tpu_why(r, why, why_len, "ibv_reg_mr(%zu bytes): %s", a->len, es);
	return tpu_why(r, why, why_len,
		       "ibv_reg_mr on GPU memory (%zu bytes): %s; without a dma-buf fd GPU memory "
		       "can only be registered with the nvidia-peermem kernel module loaded%s%s",
		       a->len, es, dmabuf_err ? "; " : "", dmabuf_err ? dmabuf_err : "");
}

int tpv_mr_reg(struct tpv_ctx *ctx, const struct tpv_mr_args *a, struct tpv_mr **ret,
	       char *why, size_t why_len)
{
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	enum tpv_mr_method method = TPV_MR_HOST;
	char eb[64], dmabuf_err[96] = "";
	struct ibv_mr *mr = NULL;
	struct tpv_mr *m;
	int r;

	if (!a->len)
		return tpu_why(-EINVAL, why, why_len, "empty memory region");
	if (a->dmabuf_fd >= 0) {
		errno = 0;
		mr = ctx->ops->reg_dmabuf_mr(ctx->pd, a->dmabuf_offset, a->len,
					     (uint64_t)(uintptr_t)a->addr, a->dmabuf_fd, access);
		r = mr ? 0 : tpv_verbs_errno(-EIO);
		/* Any failure (no dma-buf in this library or kernel, a driver refusing this
		 * dma-buf): try ibv_reg_mr, which takes host memory and, with peer memory,
		 * GPU memory; its error says why dma-buf was not used. */
		if (r < 0)
			snprintf(dmabuf_err, sizeof(dmabuf_err), "ibv_reg_dmabuf_mr: %s",
				 tpu_strerror(r, eb, sizeof(eb)));
		method = mr ? TPV_MR_DMABUF : TPV_MR_HOST;
		if (!mr && a->dmabuf_only)
			return tpu_why(r, why, why_len, "%s", dmabuf_err);
	}
	if (!mr) {
		r = mr_reg_host(ctx, a, dmabuf_err[0] ? dmabuf_err : NULL, &mr, why, why_len);
		if (r < 0)
			return r;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		ctx->ops->dereg_mr(mr);
		return tpu_why(-ENOMEM, why, why_len, "out of memory");
	}
	*m = (struct tpv_mr){ .mr = mr, .method = method, .addr = (uint64_t)(uintptr_t)a->addr,
			      .len = a->len, .lkey = mr->lkey, .rkey = mr->rkey };
	*ret = m;
	return 0;
}

#ifndef DMA_BUF_MAGIC
#define DMA_BUF_MAGIC 0x444d4142 /* linux/magic.h */
#endif

int tpv_dmabuf_size(const struct tpv_ops *ops, int fd, uint64_t *ret_size)
{
	struct statfs sfs;
	struct stat st;
	uint64_t size = 0;
	int r;

	if (fd < 0)
		return -EBADF;
	if (ops && ops->dmabuf_size) {
		r = ops->dmabuf_size(fd, &size);
		if (r)
			return -abs(r);
	} else {
		if (fstatfs(fd, &sfs) < 0 || fstat(fd, &st) < 0)
			return -errno;
		if ((unsigned long)sfs.f_type != DMA_BUF_MAGIC || st.st_size <= 0)
			return -ENOTTY;
		size = (uint64_t)st.st_size;
	}
	*ret_size = size;
	return 0;
}

int tpv_mr_dereg(struct tpv_ctx *ctx, struct tpv_mr *mr)
{
	int r;

	if (!mr)
		return 0;
	r = tpv_verbs_rc(ctx->ops->dereg_mr(mr->mr));
	free(mr); /* a region the kernel would not release cannot be retried either */
	return r;
}
