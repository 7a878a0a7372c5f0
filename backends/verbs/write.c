/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * RDMA writes and their completions. A write is cut into pieces no longer than the port's
 * largest message, posted as one chain with only the last piece signaled; every piece carries
 * the write's sequence number as wr_id, and each queue pair keeps its writes in posting order,
 * so one completion (or the first failure of any piece, later flushed pieces ignored) finishes
 * exactly one write. Draining follows the completion-channel protocol: take the event,
 * acknowledge it, re-arm, then poll until empty. What a finished write means is the caller's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tpv-int.h"

#define PIECE_DEFAULT (1u << 30) /* a port that reports no max_msg_sz */
#define POLL_BATCH 16

static uint64_t piece_max(uint32_t max)
{
	return max ? max : PIECE_DEFAULT;
}

uint64_t tpv_write_pieces(uint64_t len, uint32_t max)
{
	uint64_t m = piece_max(max);

	return len / m + (len % m != 0);
}

/* Builds the chain for @w in @wr/@sge (@n entries each), all with wr_id @seq. */
static void write_chain(const struct tpv_write *w, uint64_t max, uint64_t seq,
			struct ibv_send_wr *wr, struct ibv_sge *sge, uint64_t n)
{
	uint64_t off = 0;

	for (uint64_t i = 0; i < n; i++) {
		uint64_t len = TPU_MIN(max, w->len - off);

		sge[i] = (struct ibv_sge){ .addr = w->local_addr + off, .length = (uint32_t)len,
					   .lkey = w->lkey };
		wr[i] = (struct ibv_send_wr){ .wr_id = seq, .sg_list = &sge[i], .num_sge = 1,
					      .opcode = IBV_WR_RDMA_WRITE,
					      .send_flags = i + 1 == n ? IBV_SEND_SIGNALED : 0,
					      .next = i + 1 == n ? NULL : &wr[i + 1] };
		wr[i].wr.rdma.remote_addr = w->remote_addr + off;
		wr[i].wr.rdma.rkey = w->rkey;
		off += len;
	}
}

/* Checks that @w can be posted now. Return: its number of pieces, or -errno. */
static int64_t write_check(const struct tpv_qp *qp, const struct tpv_write *w, char *why,
			   size_t why_len)
{
	uint64_t end, n;

	if (qp->state != TPV_QP_RTS)
		return tpu_why(-ENOTCONN, why, why_len, "queue pair in %s, not RTS",
			       tpv_qp_state_name(qp->state));
	if (!w->len || !tpu_add_u64(w->local_addr, w->len, &end) ||
	    !tpu_add_u64(w->remote_addr, w->len, &end))
		return tpu_why(-EINVAL, why, why_len, "bad RDMA write of %llu bytes",
			       (unsigned long long)w->len);
	n = tpv_write_pieces(w->len, qp->ctx->nic.max_msg_sz);
	if (n > qp->max_send_wr)
		return tpu_why(-EMSGSIZE, why, why_len,
			       "RDMA write of %llu bytes needs %llu pieces, send queue holds %u",
			       (unsigned long long)w->len, (unsigned long long)n, qp->max_send_wr);
	if (n > qp->max_send_wr - qp->in_flight || qp->pend_n == qp->max_send_wr)
		return tpu_why(-ENOBUFS, why, why_len,
			       "send queue full: %llu pieces, %u of %u slots in use",
			       (unsigned long long)n, qp->in_flight, qp->max_send_wr);
	return (int64_t)n;
}

int tpv_qp_write(struct tpv_qp *qp, const struct tpv_write *w, char *why, size_t why_len)
{
	_cleanup_free_ struct ibv_send_wr *wr = NULL;
	_cleanup_free_ struct ibv_sge *sge = NULL;
	struct ibv_send_wr *bad = NULL;
	struct tpv_pending *p;
	int64_t n = write_check(qp, w, why, why_len);
	char eb[64];
	int r;

	if (n < 0)
		return (int)n;
	wr = calloc((size_t)n, sizeof(*wr));
	sge = calloc((size_t)n, sizeof(*sge));
	if (!wr || !sge)
		return tpu_why(-ENOMEM, why, why_len, "out of memory");
	write_chain(w, piece_max(qp->ctx->nic.max_msg_sz), qp->ctx->next_seq, wr, sge, (uint64_t)n);
	errno = 0;
	r = tpv_verbs_rc(qp->ctx->ops->post_send(qp->qp, wr, &bad));
	if (r < 0) {
		if (bad != wr) { /* part of the chain went out, unsignaled: no way to account */
			qp->state = TPV_QP_ERROR;
			qp->ctx->next_seq++; /* its pieces' flushes must not match a later write */
		}
		return tpu_why(r, why, why_len, "ibv_post_send: %s%s",
			       tpu_strerror(r, eb, sizeof(eb)),
			       bad != wr ? " (after a partial post; queue pair now in ERROR)" : "");
	}
	p = &qp->pending[(qp->pend_head + qp->pend_n) % qp->max_send_wr];
	*p = (struct tpv_pending){ .seq = qp->ctx->next_seq++, .cookie = w->cookie,
				   .pieces = (uint32_t)n };
	qp->pend_n++;
	qp->in_flight += (uint32_t)n;
	return 0;
}

static int wc_errno(enum ibv_wc_status s)
{
	switch (s) {
	case IBV_WC_SUCCESS:
		return 0;
	case IBV_WC_WR_FLUSH_ERR:
		return -ECANCELED;
	case IBV_WC_LOC_LEN_ERR:
		return -EMSGSIZE;
	case IBV_WC_LOC_PROT_ERR:
		return -EFAULT;
	case IBV_WC_REM_ACCESS_ERR:
		return -EACCES;
	case IBV_WC_REM_INV_REQ_ERR:
		return -EINVAL;
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
		return -ETIMEDOUT;
	default:
		return -EIO;
	}
}

/* Finishes every write of @qp up to and including the one @wc belongs to. */
static void wc_handle(struct tpv_qp *qp, const struct ibv_wc *wc, tpv_done_fn cb, void *arg)
{
	int status = wc_errno(wc->status);
	char why[128] = "";

	if (status)
		snprintf(why, sizeof(why), "RDMA write on qp 0x%x: %s (vendor error 0x%x)",
			 wc->qp_num, tpv_wc_status_str(wc->status), wc->vendor_err);
	while (qp->pend_n) {
		struct tpv_pending p = qp->pending[qp->pend_head];

		if (p.seq > wc->wr_id)
			break; /* a piece of a write already finished by its failure, or a
				* completion of a freed queue pair whose number was reused */
		qp->pend_head = (qp->pend_head + 1) % qp->max_send_wr;
		qp->pend_n--;
		qp->in_flight -= TPU_MIN(p.pieces, qp->in_flight);
		cb(arg, p.cookie, status, status ? why : NULL);
	}
}

/* Takes and acknowledges every pending completion event, then re-arms every queue.
 * Return: 0 or -errno. */
static int cq_rearm(struct tpv_ctx *ctx)
{
	const struct tpv_ops *ops = ctx->ops;
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	int r = 0;

	for (unsigned k = 0; k <= ctx->n_cqs; k++) { /* at most one event per armed queue */
		errno = 0;
		if (ops->get_cq_event(ctx->channel, &ev_cq, &ev_ctx) == 0) {
			ops->ack_cq_events(ev_cq, 1);
			continue;
		}
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return tpv_verbs_errno(-EIO);
		break;
	}
	for (unsigned i = 0; i < ctx->n_cqs && r >= 0; i++)
		r = tpv_verbs_rc(ops->req_notify_cq(ctx->cqs[i].cq, 0));
	return r;
}

/* Polls @cq until empty. Return: the completions polled, or -EIO. */
static int cq_poll(struct tpv_ctx *ctx, struct ibv_cq *cq, tpv_done_fn cb, void *arg)
{
	struct ibv_wc wc[POLL_BATCH];
	int r, i, total = 0;

	do {
		r = ctx->ops->poll_cq(cq, POLL_BATCH, wc);
		if (r < 0)
			return -EIO;
		for (i = 0; i < r; i++) {
			struct tpv_qp *qp = tpv_ctx_find_qp(ctx, wc[i].qp_num);

			if (qp) /* else freed since it posted */
				wc_handle(qp, &wc[i], cb, arg);
		}
		total += r;
	} while (r == POLL_BATCH);
	return total;
}

int tpv_cq_drain(struct tpv_ctx *ctx, tpv_done_fn cb, void *arg)
{
	int r, total = 0;

	r = cq_rearm(ctx);
	if (r < 0)
		return r;
	for (unsigned i = 0; i < ctx->n_cqs; i++) {
		r = cq_poll(ctx, ctx->cqs[i].cq, cb, arg);
		if (r < 0)
			return r;
		total += r;
	}
	return total;
}
