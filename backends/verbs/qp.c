/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * RC queue pairs and their connection state machine: the connection info each side sends the
 * other (a fixed little-endian encoding, decoded as untrusted input), and the RESET -> INIT ->
 * RTR -> RTS steps with the attributes and masks an RC queue pair needs for RDMA writes
 * (addressed by LID on InfiniBand, by GID with a global route header on RoCE). Carrying the info
 * to the peer is the caller's job; posting writes is write.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include "tpv-int.h"

#define QPN_MAX 0xffffffu
#define PSN_MASK 0xffffffu

static void put_le16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void tpv_qp_info_encode(const struct tpv_qp_info *info, uint8_t out[TPV_QP_INFO_BYTES])
{
	memset(out, 0, TPV_QP_INFO_BYTES);
	out[0] = TPV_QP_INFO_VERSION;
	out[1] = info->flags;
	out[2] = info->port;
	out[3] = info->mtu;
	put_le32(out + 4, info->qpn);
	put_le32(out + 8, info->psn);
	put_le16(out + 12, info->lid);
	memcpy(out + 16, info->gid, TPV_GID_BYTES);
}

int tpv_qp_info_decode(const uint8_t *buf, size_t len, struct tpv_qp_info *ret)
{
	struct tpv_qp_info info;

	if (len < 1)
		return -EBADMSG;
	if (buf[0] != TPV_QP_INFO_VERSION)
		return -EPROTONOSUPPORT;
	if (len != TPV_QP_INFO_BYTES)
		return -EBADMSG;
	memset(&info, 0, sizeof(info));
	info.flags = buf[1];
	info.port = buf[2];
	info.mtu = buf[3];
	info.qpn = get_le32(buf + 4);
	info.psn = get_le32(buf + 8);
	info.lid = (uint16_t)(buf[12] | buf[13] << 8);
	memcpy(info.gid, buf + 16, TPV_GID_BYTES);
	if (info.flags & ~TPV_QP_INFO_ROCE || !info.port || info.mtu < IBV_MTU_256 ||
	    info.mtu > IBV_MTU_4096 || info.qpn > QPN_MAX || info.psn > PSN_MASK || buf[14] ||
	    buf[15])
		return -EBADMSG;
	*ret = info;
	return 0;
}

const char *tpv_qp_state_name(enum tpv_qp_state s)
{
	static const char *const names[] = { "RESET", "INIT", "RTR", "RTS", "ERROR" };

	return (unsigned int)s < TPU_ARRAY_SIZE(names) ? names[s] : "?";
}

static void params_fill(struct tpv_qp_params *p, const struct tpv_qp_params *in)
{
	static const struct tpv_qp_params def = { .max_send_wr = 128, .timeout = 14,
						   .retry_cnt = 7, .rnr_retry = 7,
						   .min_rnr_timer = 12, .max_rd_atomic = 1,
						   .hop_limit = 64 };

	*p = in ? *in : def;
	p->max_send_wr = p->max_send_wr ? p->max_send_wr : def.max_send_wr;
	p->timeout = p->timeout ? p->timeout : def.timeout;
	p->retry_cnt = p->retry_cnt ? p->retry_cnt : def.retry_cnt;
	p->rnr_retry = p->rnr_retry ? p->rnr_retry : def.rnr_retry;
	p->min_rnr_timer = p->min_rnr_timer ? p->min_rnr_timer : def.min_rnr_timer;
	p->max_rd_atomic = p->max_rd_atomic ? p->max_rd_atomic : def.max_rd_atomic;
	p->hop_limit = p->hop_limit ? p->hop_limit : def.hop_limit;
}

static uint32_t random_psn(void)
{
	uint32_t v;

	if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != sizeof(v))
		v = (uint32_t)tpu_now_ns();
	return v & PSN_MASK;
}

/* Reserves @qp's share of a completion queue and its pending ring. */
static int qp_reserve(struct tpv_qp *qp, char *why, size_t why_len)
{
	struct tpv_ctx *ctx = qp->ctx;
	int k;

	qp->max_send_wr = TPU_MIN(qp->params.max_send_wr, ctx->max_qp_wr);
	k = tpv_ctx_cq_reserve(ctx, qp->max_send_wr, why, why_len);
	if (k < 0) {
		qp->max_send_wr = 0; /* nothing reserved */
		return k;
	}
	qp->cq = (unsigned)k;
	qp->pending = calloc(qp->max_send_wr, sizeof(*qp->pending));
	return qp->pending ? 0 : tpu_why(-ENOMEM, why, why_len, "out of memory");
}

static int qp_create(struct tpv_qp *qp, char *why, size_t why_len)
{
	struct tpv_ctx *ctx = qp->ctx;
	struct ibv_qp_init_attr ia;
	char eb[64];

	memset(&ia, 0, sizeof(ia));
	ia.qp_context = qp;
	ia.send_cq = ctx->cqs[qp->cq].cq;
	ia.recv_cq = ctx->cqs[qp->cq].cq;
	ia.cap.max_send_wr = qp->max_send_wr;
	ia.cap.max_recv_wr = 1;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.qp_type = IBV_QPT_RC;
	ia.sq_sig_all = 0;
	errno = 0;
	qp->qp = ctx->ops->create_qp(ctx->pd, &ia);
	if (!qp->qp) {
		int r = tpv_verbs_errno(-ENOMEM);

		return tpu_why(r, why, why_len, "ibv_create_qp: %s",
			       tpu_strerror(r, eb, sizeof(eb)));
	}
	return 0;
}

int tpv_qp_new(struct tpv_ctx *ctx, const struct tpv_qp_params *params, struct tpv_qp **ret,
	       char *why, size_t why_len)
{
	const struct tpv_nic *nic = &ctx->nic;
	struct tpv_qp *qp;
	int r;

	qp = calloc(1, sizeof(*qp));
	if (!qp)
		return tpu_why(-ENOMEM, why, why_len, "out of memory");
	qp->ctx = ctx;
	tpu_list_init(&qp->link);
	params_fill(&qp->params, params);
	r = qp_reserve(qp, why, why_len);
	if (r >= 0)
		r = qp_create(qp, why, why_len);
	if (r < 0) {
		tpv_qp_free(qp);
		return r;
	}
	qp->state = TPV_QP_RESET;
	qp->local = (struct tpv_qp_info){
		.qpn = qp->qp->qp_num, .psn = random_psn(), .lid = nic->lid, .mtu = nic->mtu,
		.port = nic->port, .flags = nic->link == TPV_LINK_ETH ? TPV_QP_INFO_ROCE : 0,
	};
	memcpy(qp->local.gid, nic->gid, TPV_GID_BYTES);
	tpu_list_insert_tail(&ctx->qps, &qp->link);
	*ret = qp;
	return 0;
}

void tpv_qp_close(struct tpv_qp *qp, tpv_done_fn cb, void *arg)
{
	if (!qp)
		return;
	if (tpu_list_linked(&qp->link))
		tpu_list_remove(&qp->link);
	if (qp->qp)
		qp->ctx->ops->destroy_qp(qp->qp);
	for (; cb && qp->pend_n; qp->pend_n--) {
		cb(arg, qp->pending[qp->pend_head].cookie, -ECANCELED, "queue pair closed");
		qp->pend_head = (qp->pend_head + 1) % qp->max_send_wr;
	}
	if (qp->max_send_wr)
		qp->ctx->cqs[qp->cq].used -= qp->max_send_wr;
	free(qp->pending);
	free(qp);
}

void tpv_qp_free(struct tpv_qp *qp)
{
	tpv_qp_close(qp, NULL, NULL);
}

const struct tpv_qp_info *tpv_qp_local(const struct tpv_qp *qp)
{
	return &qp->local;
}

enum tpv_qp_state tpv_qp_state(const struct tpv_qp *qp)
{
	return qp->state;
}

int tpv_qp_set_remote(struct tpv_qp *qp, const struct tpv_qp_info *remote, char *why,
		      size_t why_len)
{
	bool local_roce = qp->local.flags & TPV_QP_INFO_ROCE;
	bool remote_roce = remote->flags & TPV_QP_INFO_ROCE;

	if (local_roce != remote_roce)
		return tpu_why(-EPROTO, why, why_len,
			       "link layers differ: this port is %s, the peer's is %s",
			       local_roce ? "Ethernet" : "InfiniBand",
			       remote_roce ? "Ethernet" : "InfiniBand");
	if (!remote_roce && !remote->lid)
		return tpu_why(-EINVAL, why, why_len, "InfiniBand peer without a LID");
	if (remote_roce && !memcmp(remote->gid, (uint8_t[TPV_GID_BYTES]){ 0 }, TPV_GID_BYTES))
		return tpu_why(-EINVAL, why, why_len, "RoCE peer without a GID");
	qp->remote = *remote;
	qp->have_remote = true;
	return 0;
}

static int attr_init(const struct tpv_qp *qp, struct ibv_qp_attr *a)
{
	a->qp_state = IBV_QPS_INIT;
	a->pkey_index = 0;
	a->port_num = qp->local.port;
	a->qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	return IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
}

static int attr_rtr(const struct tpv_qp *qp, struct ibv_qp_attr *a)
{
	const struct tpv_qp_info *rem = &qp->remote;

	a->qp_state = IBV_QPS_RTR;
	a->path_mtu = (enum ibv_mtu)TPU_MIN(qp->local.mtu, rem->mtu);
	a->dest_qp_num = rem->qpn;
	a->rq_psn = rem->psn;
	a->max_dest_rd_atomic = qp->params.max_rd_atomic;
	a->min_rnr_timer = qp->params.min_rnr_timer;
	a->ah_attr.dlid = rem->lid;
	a->ah_attr.sl = qp->params.sl;
	a->ah_attr.src_path_bits = 0;
	a->ah_attr.port_num = qp->local.port;
	if (rem->flags & TPV_QP_INFO_ROCE) {
		a->ah_attr.is_global = 1;
		memcpy(a->ah_attr.grh.dgid.raw, rem->gid, TPV_GID_BYTES);
		a->ah_attr.grh.sgid_index = (uint8_t)qp->ctx->nic.gid_index;
		a->ah_attr.grh.hop_limit = qp->params.hop_limit;
		a->ah_attr.grh.traffic_class = qp->params.traffic_class;
		a->ah_attr.grh.flow_label = 0;
	}
	return IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
	       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
}

static int attr_rts(const struct tpv_qp *qp, struct ibv_qp_attr *a)
{
	a->qp_state = IBV_QPS_RTS;
	a->timeout = qp->params.timeout;
	a->retry_cnt = qp->params.retry_cnt;
	a->rnr_retry = qp->params.rnr_retry;
	a->sq_psn = qp->local.psn;
	a->max_rd_atomic = qp->params.max_rd_atomic;
	return IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
	       IBV_QP_MAX_QP_RD_ATOMIC;
}

/* One ibv_modify_qp to @to; ERROR on failure. Return: @to or -errno. */
static int qp_modify(struct tpv_qp *qp, enum tpv_qp_state to, char *why, size_t why_len)
{
	struct ibv_qp_attr attr;
	char eb[64];
	int mask, r;

	memset(&attr, 0, sizeof(attr));
	if (to == TPV_QP_INIT)
		mask = attr_init(qp, &attr);
	else if (to == TPV_QP_RTR)
		mask = attr_rtr(qp, &attr);
	else
		mask = attr_rts(qp, &attr);
	errno = 0;
	r = tpv_verbs_rc(qp->ctx->ops->modify_qp(qp->qp, &attr, mask));
	if (r < 0) {
		qp->state = TPV_QP_ERROR;
		return tpu_why(r, why, why_len, "modify_qp(%s): %s", tpv_qp_state_name(to),
			       tpu_strerror(r, eb, sizeof(eb)));
	}
	qp->state = to;
	return to;
}

int tpv_qp_step(struct tpv_qp *qp, char *why, size_t why_len)
{
	switch (qp->state) {
	case TPV_QP_RESET:
		return qp_modify(qp, TPV_QP_INIT, why, why_len);
	case TPV_QP_INIT:
		if (!qp->have_remote)
			return tpu_why(-EDESTADDRREQ, why, why_len,
				       "RTR needs the peer's queue pair info");
		return qp_modify(qp, TPV_QP_RTR, why, why_len);
	case TPV_QP_RTR:
		return qp_modify(qp, TPV_QP_RTS, why, why_len);
	case TPV_QP_RTS:
		return tpu_why(-EALREADY, why, why_len, "queue pair already in RTS");
	default:
		return tpu_why(-EIO, why, why_len, "queue pair in ERROR");
	}
}

int tpv_qp_connect(struct tpv_qp *qp, const struct tpv_qp_info *remote, char *why,
		   size_t why_len)
{
	int r = tpv_qp_set_remote(qp, remote, why, why_len);

	while (r >= 0 && qp->state != TPV_QP_RTS)
		r = tpv_qp_step(qp, why, why_len);
	return r < 0 ? r : 0;
}
