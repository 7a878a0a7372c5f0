/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit suite for backends/verbs/ (the ibverbs layer under cuda_gdr), run against a fake verbs op
 * table and a fake sysfs tree in a temp dir: port enumeration, NIC choice by PCI locality, the
 * queue pair info encoding, the RC state machine's exact attributes and masks and its failures,
 * memory registration choices, and RDMA writes cut by the port's maximum message size with their
 * completions. The only real verbs call is the probe on this machine, which must answer "not
 * viable" with a reason when there is no RDMA device. Nothing here needs RDMA hardware.
 */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "tpv.h"

/* ---- the fake verbs table ---------------------------------------------------------------- */

#define FAKE_DEVS 3
#define FAKE_PORTS 2
#define FAKE_GIDS 8
#define FAKE_MAX 64

struct fake_port {
	struct ibv_port_attr attr;
	struct ibv_gid_entry gid[FAKE_GIDS];
	int n_gid;
};

struct fake_post {
	struct ibv_send_wr wr;
	struct ibv_sge sge;
};

static struct fake {
	struct ibv_device dev[FAKE_DEVS];
	struct ibv_device *list[FAKE_DEVS + 1];
	int n_dev;
	bool list_null; /* get_device_list fails with ENOSYS */
	int n_port[FAKE_DEVS];
	struct fake_port port[FAKE_DEVS][FAKE_PORTS];
	int live;	/* objects created and not yet destroyed */
	int fail_alloc_pd;
	int modify_calls, modify_fail_at, modify_errno;
	struct ibv_qp_attr attr[4];
	int mask[4];
	struct ibv_qp_init_attr qp_init;
	uint32_t next_qpn;
	struct fake_post post[FAKE_MAX];
	int n_post, post_errno;
	struct ibv_cq *cq;
	bool event;
	int acks, notifies;
	struct ibv_wc wc[FAKE_MAX];
	int n_wc, wc_pos;
	int reg_mr_calls, reg_mr_errno, dmabuf_calls, dmabuf_errno;
	uint64_t dmabuf_offset, dmabuf_iova;
	int dmabuf_fd;
} F;

static struct ibv_device **fake_get_device_list(int *num)
{
	if (F.list_null) {
		errno = ENOSYS;
		return NULL;
	}
	for (int i = 0; i < F.n_dev; i++)
		F.list[i] = &F.dev[i];
	F.list[F.n_dev] = NULL;
	*num = F.n_dev;
	F.live++;
	return F.list;
}

static void fake_free_device_list(struct ibv_device **list)
{
	F.live--;
}

static void *fake_obj(size_t size)
{
	F.live++;
	return calloc(1, size);
}

static int fake_free(void *p)
{
	F.live--;
	free(p);
	return 0;
}

static struct ibv_context *fake_open_device(struct ibv_device *dev)
{
	struct ibv_context *c = fake_obj(sizeof(*c));

	c->device = dev;
	return c;
}

static int fake_close_device(struct ibv_context *c)
{
	return fake_free(c);
}

static int dev_index(struct ibv_context *c)
{
	return (int)(c->device - F.dev);
}

static int fake_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
	memset(a, 0, sizeof(*a));
	a->phys_port_cnt = (uint8_t)F.n_port[dev_index(c)];
	a->max_qp_wr = 16384;
	a->max_cqe = 65536;
	return 0;
}

static int fake_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a)
{
	*a = F.port[dev_index(c)][port - 1].attr;
	return 0;
}

static int fake_query_gid_ex(struct ibv_context *c, uint32_t port, uint32_t index,
			     struct ibv_gid_entry *e)
{
	struct fake_port *p = &F.port[dev_index(c)][port - 1];

	if ((int)index >= p->n_gid)
		return ENODATA;
	*e = p->gid[index];
	return 0;
}

static struct ibv_pd *fake_alloc_pd(struct ibv_context *c)
{
	struct ibv_pd *pd;

	if (F.fail_alloc_pd) {
		errno = F.fail_alloc_pd;
		return NULL;
	}
	pd = fake_obj(sizeof(*pd));
	pd->context = c;
	return pd;
}

static int fake_dealloc_pd(struct ibv_pd *pd)
{
	return fake_free(pd);
}

static struct ibv_comp_channel *fake_create_comp_channel(struct ibv_context *c)
{
	struct ibv_comp_channel *ch = fake_obj(sizeof(*ch));
	int p[2];

	ck_assert_int_eq(pipe2(p, O_CLOEXEC), 0);
	close(p[1]);
	ch->fd = p[0];
	ch->context = c;
	return ch;
}

static int fake_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	close(ch->fd);
	return fake_free(ch);
}

static struct ibv_cq *fake_create_cq(struct ibv_context *c, int cqe, void *cq_context,
				     struct ibv_comp_channel *ch, int vector)
{
	struct ibv_cq *cq = fake_obj(sizeof(*cq));

	cq->context = c;
	cq->channel = ch;
	cq->cq_context = cq_context;
	cq->cqe = cqe;
	F.cq = cq;
	return cq;
}

static int fake_destroy_cq(struct ibv_cq *cq)
{
	return fake_free(cq);
}

static int fake_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	F.notifies++;
	return 0;
}

static int fake_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context)
{
	if (!F.event) {
		errno = EAGAIN;
		return -1;
	}
	F.event = false;
	*cq = F.cq;
	*cq_context = F.cq->cq_context;
	return 0;
}

static void fake_ack_cq_events(struct ibv_cq *cq, unsigned int n)
{
	F.acks += (int)n;
}

static int fake_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	int k = 0;

	while (k < n && F.wc_pos < F.n_wc)
		wc[k++] = F.wc[F.wc_pos++];
	return k;
}

static struct ibv_qp *fake_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct ibv_qp *qp = fake_obj(sizeof(*qp));

	F.qp_init = *attr;
	qp->context = pd->context;
	qp->pd = pd;
	qp->qp_num = F.next_qpn++;
	qp->qp_type = attr->qp_type;
	return qp;
}

static int fake_destroy_qp(struct ibv_qp *qp)
{
	return fake_free(qp);
}

static int fake_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	int i = F.modify_calls++;

	if (i < 4) {
		F.attr[i] = *attr;
		F.mask[i] = mask;
	}
	return F.modify_fail_at == i + 1 ? F.modify_errno : 0;
}

static struct ibv_mr *fake_mr(struct ibv_pd *pd, void *addr, size_t len)
{
	struct ibv_mr *mr = fake_obj(sizeof(*mr));

	mr->pd = pd;
	mr->addr = addr;
	mr->length = len;
	mr->lkey = 0x11;
	mr->rkey = 0x22;
	return mr;
}

static struct ibv_mr *fake_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	F.reg_mr_calls++;
	ck_assert_int_eq(access, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (F.reg_mr_errno) {
		errno = F.reg_mr_errno;
		return NULL;
	}
	return fake_mr(pd, addr, len);
}

static struct ibv_mr *fake_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
					 uint64_t iova, int fd, int access)
{
	F.dmabuf_calls++;
	F.dmabuf_offset = offset;
	F.dmabuf_iova = iova;
	F.dmabuf_fd = fd;
	ck_assert_int_eq(access, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (F.dmabuf_errno) {
		errno = F.dmabuf_errno;
		return NULL;
	}
	return fake_mr(pd, (void *)(uintptr_t)iova, len);
}

static int fake_dereg_mr(struct ibv_mr *mr)
{
	return fake_free(mr);
}

static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	if (F.post_errno) {
		*bad = wr;
		return F.post_errno;
	}
	for (; wr; wr = wr->next) {
		ck_assert_int_lt(F.n_post, FAKE_MAX);
		ck_assert_int_eq(wr->num_sge, 1);
		F.post[F.n_post].wr = *wr;
		F.post[F.n_post].sge = wr->sg_list[0];
		F.n_post++;
	}
	return 0;
}

static const struct tpv_ops fake_ops = {
	.get_device_list = fake_get_device_list,
	.free_device_list = fake_free_device_list,
	.open_device = fake_open_device,
	.close_device = fake_close_device,
	.query_device = fake_query_device,
	.query_port = fake_query_port,
	.query_gid_ex = fake_query_gid_ex,
	.alloc_pd = fake_alloc_pd,
	.dealloc_pd = fake_dealloc_pd,
	.create_comp_channel = fake_create_comp_channel,
	.destroy_comp_channel = fake_destroy_comp_channel,
	.create_cq = fake_create_cq,
	.destroy_cq = fake_destroy_cq,
	.req_notify_cq = fake_req_notify_cq,
	.get_cq_event = fake_get_cq_event,
	.ack_cq_events = fake_ack_cq_events,
	.poll_cq = fake_poll_cq,
	.create_qp = fake_create_qp,
	.destroy_qp = fake_destroy_qp,
	.modify_qp = fake_modify_qp,
	.reg_mr = fake_reg_mr,
	.reg_dmabuf_mr = fake_reg_dmabuf_mr,
	.dereg_mr = fake_dereg_mr,
	.post_send = fake_post_send,
};

/* ---- fixtures ------------------------------------------------------------------------------ */

static void fake_port_set(int d, int p, enum ibv_port_state state, uint8_t link, uint16_t lid)
{
	struct ibv_port_attr *a = &F.port[d][p - 1].attr;

	a->state = state;
	a->link_layer = link;
	a->lid = lid;
	a->active_mtu = IBV_MTU_4096;
	a->max_msg_sz = 1u << 30;
	a->gid_tbl_len = FAKE_GIDS;
	if (F.n_port[d] < p)
		F.n_port[d] = p;
}

static void fake_gid_add(int d, int p, uint32_t type, const uint8_t gid[16])
{
	struct fake_port *fp = &F.port[d][p - 1];
	struct ibv_gid_entry *e = &fp->gid[fp->n_gid];

	memcpy(e->gid.raw, gid, 16);
	e->gid_index = (uint32_t)fp->n_gid++;
	e->port_num = (uint32_t)p;
	e->gid_type = type;
}

static void fake_dev_add(const char *name)
{
	snprintf(F.dev[F.n_dev++].name, sizeof(F.dev[0].name), "%s", name);
}

static const uint8_t gid_ll[16] = { 0xfe, 0x80, [8] = 0x02, [15] = 0x01 };
static const uint8_t gid_v4[16] = { [10] = 0xff, [11] = 0xff, [12] = 10, [15] = 1 };
static const uint8_t gid_ib[16] = { 0xfe, 0x80, [8] = 0xaa, [15] = 0x07 };

static void setup(void)
{
	memset(&F, 0, sizeof(F));
	F.next_qpn = 0x1234;
	fake_dev_add("mlx5_0");
	fake_port_set(0, 1, IBV_PORT_ACTIVE, IBV_LINK_LAYER_INFINIBAND, 7);
	fake_gid_add(0, 1, IBV_GID_TYPE_IB, gid_ib);
}

static void teardown(void)
{
}

static struct tpv_nic nic_ib(void)
{
	struct tpv_nic n = { .dev = "mlx5_0", .port = 1, .link = TPV_LINK_IB, .mtu = IBV_MTU_4096,
			     .lid = 7, .gid_index = 0, .max_msg_sz = 1u << 30, .numa_node = -1 };

	memcpy(n.gid, gid_ib, 16);
	return n;
}

static struct tpv_nic nic_roce(void)
{
	struct tpv_nic n = { .dev = "mlx5_0", .port = 1, .link = TPV_LINK_ETH, .mtu = IBV_MTU_1024,
			     .gid_index = 3, .max_msg_sz = 1u << 30, .numa_node = -1 };

	memcpy(n.gid, gid_v4, 16);
	return n;
}

static struct tpv_ctx *ctx_open(const struct tpv_nic *nic)
{
	struct tpv_ctx *ctx = NULL;
	char why[256] = "";

	ck_assert_msg(tpv_ctx_open(&fake_ops, nic, 256, &ctx, why, sizeof(why)) == 0, "%s", why);
	return ctx;
}

static struct tpv_qp *qp_new(struct tpv_ctx *ctx, const struct tpv_qp_params *p)
{
	struct tpv_qp *qp = NULL;
	char why[256] = "";

	ck_assert_msg(tpv_qp_new(ctx, p, &qp, why, sizeof(why)) == 0, "%s", why);
	return qp;
}

static struct tpv_qp_info remote_ib(void)
{
	return (struct tpv_qp_info){ .qpn = 0xabcdef, .psn = 0x123456, .lid = 9,
				     .mtu = IBV_MTU_2048, .port = 1 };
}

static struct tpv_qp_info remote_roce(void)
{
	struct tpv_qp_info r = { .qpn = 0x42, .psn = 0x777, .mtu = IBV_MTU_4096, .port = 2,
				 .flags = TPV_QP_INFO_ROCE };

	memcpy(r.gid, gid_v4, 16);
	r.gid[15] = 2;
	return r;
}

/* ---- connection info ----------------------------------------------------------------------- */

START_TEST(test_info_round_trips_little_endian)
{
	struct tpv_qp_info in = remote_roce(), out;
	uint8_t buf[TPV_QP_INFO_BYTES];

	in.lid = 0x0102;
	tpv_qp_info_encode(&in, buf);
	ck_assert_int_eq(buf[0], TPV_QP_INFO_VERSION);
	ck_assert_int_eq(buf[1], TPV_QP_INFO_ROCE);
	ck_assert_int_eq(buf[2], 2);
	ck_assert_int_eq(buf[3], IBV_MTU_4096);
	ck_assert_int_eq(buf[4], 0x42);
	ck_assert_int_eq(buf[8], 0x77);
	ck_assert_int_eq(buf[9], 0x07);
	ck_assert_int_eq(buf[12], 0x02);
	ck_assert_int_eq(buf[13], 0x01);
	ck_assert_int_eq(tpv_qp_info_decode(buf, sizeof(buf), &out), 0);
	ck_assert_mem_eq(&in, &out, sizeof(in));
}
END_TEST

START_TEST(test_info_decode_rejects_bad_input)
{
	struct tpv_qp_info in = remote_ib(), out = { .qpn = 99 };
	uint8_t buf[TPV_QP_INFO_BYTES + 1], bad[TPV_QP_INFO_BYTES];
	static const struct {
		int off;
		uint8_t val;
		int err;
	} cases[] = {
		{ 0, 2, -EPROTONOSUPPORT }, { 0, 0, -EPROTONOSUPPORT }, { 1, 0x02, -EBADMSG },
		{ 1, 0x80, -EBADMSG },	    { 2, 0, -EBADMSG },		 { 3, 0, -EBADMSG },
		{ 3, 6, -EBADMSG },	    { 7, 1, -EBADMSG },		 { 11, 1, -EBADMSG },
		{ 14, 1, -EBADMSG },	    { 15, 0xff, -EBADMSG },
	};

	tpv_qp_info_encode(&in, buf);
	ck_assert_int_eq(tpv_qp_info_decode(buf, 0, &out), -EBADMSG);
	ck_assert_int_eq(tpv_qp_info_decode(buf, 1, &out), -EBADMSG);
	ck_assert_int_eq(tpv_qp_info_decode(buf, TPV_QP_INFO_BYTES - 1, &out), -EBADMSG);
	ck_assert_int_eq(tpv_qp_info_decode(buf, TPV_QP_INFO_BYTES + 1, &out), -EBADMSG);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		memcpy(bad, buf, sizeof(bad));
		bad[cases[i].off] = cases[i].val;
		ck_assert_msg(tpv_qp_info_decode(bad, sizeof(bad), &out) == cases[i].err,
			      "byte %d = 0x%x", cases[i].off, cases[i].val);
	}
	memset(bad, 0xa5, sizeof(bad));
	ck_assert_int_lt(tpv_qp_info_decode(bad, sizeof(bad), &out), 0);
	ck_assert_int_eq(out.qpn, 99); /* never written on failure */
}
END_TEST

/* ---- the RC state machine ------------------------------------------------------------------ */

START_TEST(test_qp_walks_to_rts_with_exact_ib_attributes)
{
	struct tpv_nic nic = nic_ib();
	struct tpv_ctx *ctx = ctx_open(&nic);
	struct tpv_qp_params p = { .max_send_wr = 64, .sl = 3 };
	struct tpv_qp *qp = qp_new(ctx, &p);
	const struct tpv_qp_info *l = tpv_qp_local(qp);
	struct tpv_qp_info rem = remote_ib();
	struct ibv_qp_attr *a;
	char why[128] = "";

	ck_assert_int_eq(F.qp_init.qp_type, IBV_QPT_RC);
	ck_assert_int_eq(F.qp_init.cap.max_send_wr, 64);
	ck_assert_int_eq(F.qp_init.sq_sig_all, 0);
	ck_assert_ptr_eq(F.qp_init.send_cq, F.cq);
	ck_assert_int_eq(l->qpn, 0x1234);
	ck_assert_int_le(l->psn, 0xffffff);
	ck_assert_int_eq(l->lid, 7);
	ck_assert_int_eq(l->mtu, IBV_MTU_4096);
	ck_assert_int_eq(l->flags, 0);
	ck_assert_int_eq(tpv_qp_state(qp), TPV_QP_RESET);

	ck_assert_int_eq(tpv_qp_step(qp, why, sizeof(why)), TPV_QP_INIT);
	a = &F.attr[0];
	ck_assert_int_eq(F.mask[0], IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					    IBV_QP_ACCESS_FLAGS);
	ck_assert_int_eq(a->qp_state, IBV_QPS_INIT);
	ck_assert_int_eq(a->pkey_index, 0);
	ck_assert_int_eq(a->port_num, 1);
	ck_assert_int_eq(a->qp_access_flags, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE);

	ck_assert_int_eq(tpv_qp_step(qp, why, sizeof(why)), -EDESTADDRREQ);
	ck_assert_int_eq(tpv_qp_state(qp), TPV_QP_INIT);
	ck_assert_int_eq(tpv_qp_set_remote(qp, &rem, why, sizeof(why)), 0);
	ck_assert_int_eq(tpv_qp_step(qp, why, sizeof(why)), TPV_QP_RTR);
	a = &F.attr[1];
	ck_assert_int_eq(F.mask[1], IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					    IBV_QP_MIN_RNR_TIMER);
	ck_assert_int_eq(a->qp_state, IBV_QPS_RTR);
	ck_assert_int_eq(a->path_mtu, IBV_MTU_2048); /* the smaller of 4096 and 2048 */
	ck_assert_int_eq(a->dest_qp_num, 0xabcdef);
	ck_assert_int_eq(a->rq_psn, 0x123456);
	ck_assert_int_eq(a->max_dest_rd_atomic, 1);
	ck_assert_int_eq(a->min_rnr_timer, 12);
	ck_assert_int_eq(a->ah_attr.dlid, 9);
	ck_assert_int_eq(a->ah_attr.sl, 3);
	ck_assert_int_eq(a->ah_attr.port_num, 1);
	ck_assert_int_eq(a->ah_attr.is_global, 0);

	ck_assert_int_eq(tpv_qp_step(qp, why, sizeof(why)), TPV_QP_RTS);
	a = &F.attr[2];
	ck_assert_int_eq(F.mask[2], IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					    IBV_QP_MAX_QP_RD_ATOMIC);
	ck_assert_int_eq(a->qp_state, IBV_QPS_RTS);
	ck_assert_int_eq(a->timeout, 14);
	ck_assert_int_eq(a->retry_cnt, 7);
	ck_assert_int_eq(a->rnr_retry, 7);
	ck_assert_int_eq(a->sq_psn, l->psn);
	ck_assert_int_eq(a->max_rd_atomic, 1);

	ck_assert_int_eq(tpv_qp_step(qp, why, sizeof(why)), -EALREADY);
	ck_assert_int_eq(F.modify_calls, 3);
	tpv_qp_free(qp);
	tpv_ctx_close(ctx);
	ck_assert_int_eq(F.live, 0);
}
END_TEST

START_TEST(test_qp_roce_rtr_addresses_by_gid)
{
	struct tpv_nic nic = nic_roce();
	struct tpv_ctx *ctx = ctx_open(&nic);
	struct tpv_qp *qp = qp_new(ctx, NULL);
	struct tpv_qp_info rem = remote_roce(), nogid = remote_roce();
	struct ibv_qp_attr *a = &F.attr[1];
	char why[128] = "";

	memset(nogid.gid, 0, sizeof(nogid.gid));
	ck_assert_int_eq(tpv_qp_set_remote(qp, &nogid, why, sizeof(why)), -EINVAL);
	ck_assert_str_eq(why, "RoCE peer without a GID");
	ck_assert_int_eq(tpv_qp_local(qp)->flags, TPV_QP_INFO_ROCE);
	ck_assert_mem_eq(tpv_qp_local(qp)->gid, gid_v4, 16);
	ck_assert_int_eq(F.qp_init.cap.max_send_wr, 128);
	ck_assert_msg(tpv_qp_connect(qp, &rem, why, sizeof(why)) == 0, "%s", why);
	ck_assert_int_eq(tpv_qp_state(qp), TPV_QP_RTS);
	ck_assert_int_eq(F.modify_calls, 3);
	ck_assert_int_eq(a->path_mtu, IBV_MTU_1024);
	ck_assert_int_eq(a->ah_attr.is_global, 1);
	ck_assert_mem_eq(a->ah_attr.grh.dgid.raw, rem.gid, 16);
	ck_assert_int_eq(a->ah_attr.grh.sgid_index, 3);
	ck_assert_int_eq(a->ah_attr.grh.hop_limit, 64);
	ck_assert_int_eq(a->ah_attr.port_num, 1); /* ours, not the peer's port 2 */
	ck_assert_int_eq(a->dest_qp_num, 0x42);
	tpv_qp_free(qp);
	tpv_ctx_close(ctx);
	ck_assert_int_eq(F.live, 0);
}
END_TEST

START_TEST(test_qp_modify_failure_at_each_step_is_reported)
{
	static const char *const want[] = { "modify_qp(INIT): Invalid argument",
					    "modify_qp(RTR): Invalid argument",
					    "modify_qp(RTS): Invalid argument" };
	struct tpv_nic nic = nic_ib();
	struct tpv_qp_info rem = remote_ib();

	for (int step = 1; step <= 3; step++) {
		struct tpv_ctx *ctx = ctx_open(&nic);
		struct tpv_qp *qp = qp_new(ctx, NULL);
		char why[128] = "";

		F.modify_calls = 0;
		F.modify_fail_at = step;
		F.modify_errno = EINVAL;
		ck_assert_int_eq(tpv_qp_connect(qp, &rem, why, sizeof(why)), -EINVAL);
		ck_assert_str_eq(why, want[step - 1]);
		ck_assert_int_eq(tpv_qp_state(qp), TPV_QP_ERROR);
		ck_assert_int_eq(F.modify_calls, step);
		ck_assert_int_eq(tpv_qp_step(qp, why, sizeof(why)), -EIO);
		ck_assert_int_eq(F.modify_calls, step);
		tpv_qp_free(qp);
		tpv_ctx_close(ctx);
	}
	ck_assert_int_eq(F.live, 0);
}
END_TEST

START_TEST(test_qp_rejects_peer_on_other_link_layer)
{
	struct tpv_nic nic = nic_ib();
	struct tpv_ctx *ctx = ctx_open(&nic);
	struct tpv_qp *qp = qp_new(ctx, NULL);
	struct tpv_qp_info rem = remote_roce(), nolid = remote_ib();
	char why[128] = "";

	ck_assert_int_eq(tpv_qp_connect(qp, &rem, why, sizeof(why)), -EPROTO);
	ck_assert_str_eq(why,
			 "link layers differ: this port is InfiniBand, the peer's is Ethernet");
	nolid.lid = 0;
	ck_assert_int_eq(tpv_qp_set_remote(qp, &nolid, why, sizeof(why)), -EINVAL);
	ck_assert_str_eq(why, "InfiniBand peer without a LID");
	ck_assert_int_eq(F.modify_calls, 0);
	ck_assert_int_eq(tpv_qp_state(qp), TPV_QP_RESET);
	tpv_qp_free(qp);
	tpv_ctx_close(ctx);
}
END_TEST

START_TEST(test_qps_cannot_overcommit_the_cq)
{
	struct tpv_nic nic = nic_ib();
	struct tpv_ctx *ctx = ctx_open(&nic); /* 256 entries */
	struct tpv_qp_params p = { .max_send_wr = 200 };
	struct tpv_qp *a = qp_new(ctx, &p), *b = NULL;
	char why[128] = "";

	ck_assert_int_eq(tpv_qp_new(ctx, &p, &b, why, sizeof(why)), -ENOSPC);
	ck_assert_ptr_null(b);
	ck_assert_str_eq(why, "completion queue of 256 entries cannot take 200 more (200 in use)");
	p.max_send_wr = 56;
	b = qp_new(ctx, &p);
	tpv_qp_free(a);
	tpv_qp_free(b);
	tpv_ctx_close(ctx);
	ck_assert_int_eq(F.live, 0);
}
END_TEST

START_TEST(test_ctx_open_names_the_failing_call)
{
	struct tpv_nic nic = nic_ib();
	struct tpv_ctx *ctx = NULL;
	char why[128] = "";

	F.fail_alloc_pd = ENOMEM;
	ck_assert_int_eq(tpv_ctx_open(&fake_ops, &nic, 64, &ctx, why, sizeof(why)), -ENOMEM);
	ck_assert_str_eq(why, "ibv_alloc_pd: Cannot allocate memory");
	ck_assert_ptr_null(ctx);
	ck_assert_int_eq(F.live, 0);
	snprintf(nic.dev, sizeof(nic.dev), "mlx9_9");
	ck_assert_int_eq(tpv_ctx_open(&fake_ops, &nic, 64, &ctx, why, sizeof(why)), -ENODEV);
	ck_assert_str_eq(why, "mlx9_9: no such RDMA device");
	ck_assert_int_eq(F.live, 0);
}
END_TEST

START_TEST(test_cq_fd_is_nonblocking_and_armed)
{
	struct tpv_nic nic = nic_ib();
	struct tpv_ctx *ctx = ctx_open(&nic);
	int fd = tpv_cq_fd(ctx);

	ck_assert_int_ge(fd, 0);
	ck_assert(fcntl(fd, F_GETFL) & O_NONBLOCK);
	ck_assert_int_eq(F.notifies, 1);
	ck_assert_int_eq(F.cq->cqe, 256);
	tpv_ctx_close(ctx);
}
END_TEST

/* ---- memory registration ------------------------------------------------------------------- */

START_TEST(test_mr_uses_dmabuf_when_given_an_fd)
{
	struct tpv_nic nic = nic_ib();
	struct tpv_ctx *ctx = ctx_open(&nic);
	struct tpv_mr_args a = { .addr = (void *)0x7f0000001000, .len = 1 << 20, .dmabuf_fd = 5,
				 .dmabuf_offset = 0x1000, .device_mem = true };
	struct tpv_mr *mr = NULL;
	char why[256] = "";

	ck_assert_msg(tpv_mr_reg(ctx, &a, &mr, why, sizeof(why)) == 0, "%s", why);
	ck_assert_int_eq(mr->method, TPV_MR_DMABUF);
	ck_assert_str_eq(tpv_mr_method_name(mr->method), "dma-buf");
	ck_assert_int_eq(F.dmabuf_calls, 1);
	ck_assert_int_eq(F.reg_mr_calls, 0);
	ck_assert_int_eq(F.dmabuf_fd, 5);
	ck_assert_int_eq(F.dmabuf_offset, 0x1000);
	ck_assert_int_eq(F.dmabuf_iova, 0x7f0000001000);
	ck_assert_int_eq(mr->rkey, 0x22);
	ck_assert_int_eq(mr->lkey, 0x11);
	ck_assert_int_eq(tpv_mr_dereg(ctx, mr), 0);
	tpv_ctx_close(ctx);
	ck_assert_int_eq(F.live, 0);
}
END_TEST

START_TEST(test_mr_host_memory_uses_reg_mr)
{
	struct tpv_nic nic = nic_ib();
	struct tpv_ctx *ctx = ctx_open(&nic);
	char buf[4096];
	struct tpv_mr_args a = { .addr = buf, .len = sizeof(buf), .dmabuf_fd = -EBADF };
	struct tpv_mr *mr = NULL;
	char why[256] = "";

	ck_assert_int_eq(tpv_mr_reg(ctx, &a, &mr, why, sizeof(why)), 0);
	ck_assert_int_eq(mr->method, TPV_MR_HOST);
	ck_assert_int_eq(mr->addr, (uint64_t)(uintptr_t)buf);
	ck_assert_int_eq(F.dmabuf_calls, 0);
	ck_assert_int_eq(F.reg_mr_calls, 1);
	tpv_mr_dereg(ctx, mr);
	a.len = 0;
	ck_assert_int_eq(tpv_mr_reg(ctx, &a, &mr, why, sizeof(why)), -EINVAL);
	tpv_ctx_close(ctx);
	ck_assert_int_eq(F.live, 0);
}
END_TEST

START_TEST(test_mr_dmabuf_failure_falls_back_and_names_peermem)
{
	struct tpv_nic nic = nic_ib();
	struct tpv_ctx *ctx = ctx_open(&nic);
	struct tpv_mr_args a = { .addr = (void *)0x7f0000000000, .len = 4096, .dmabuf_fd = 5,
				 .device_mem = true };
	struct tpv_mr *mr = NULL;
	char why[512] = "";

	F.dmabuf_errno = EOPNOTSUPP;
	ck_assert_int_eq(tpv_mr_reg(ctx, &a, &mr, why, sizeof(why)), 0);
	ck_assert_int_eq(mr->method, TPV_MR_HOST); /* peer memory did it */
	tpv_mr_dereg(ctx, mr);
	mr = NULL;
	F.reg_mr_errno = EFAULT;
	ck_assert_int_eq(tpv_mr_reg(ctx, &a, &mr, why, sizeof(why)), -EFAULT);
	ck_assert_ptr_null(mr);
	ck_assert_msg(strstr(why, "nvidia-peermem"), "%s", why);
	ck_assert_msg(strstr(why, "ibv_reg_dmabuf_mr: Operation not supported"), "%s", why);
	/* any dma-buf failure falls back too (issue 28, item 4), and says why it was not used */
	F.dmabuf_errno = EINVAL;
	ck_assert_int_eq(tpv_mr_reg(ctx, &a, &mr, why, sizeof(why)), -EFAULT);
	ck_assert_ptr_null(mr);
	ck_assert_msg(strstr(why, "nvidia-peermem"), "%s", why);
	ck_assert_msg(strstr(why, "ibv_reg_dmabuf_mr: Invalid argument"), "%s", why);
	F.reg_mr_errno = 0;
	ck_assert_int_eq(tpv_mr_reg(ctx, &a, &mr, why, sizeof(why)), 0);
	ck_assert_int_eq(mr->method, TPV_MR_HOST);
	tpv_mr_dereg(ctx, mr);
	tpv_ctx_close(ctx);
	ck_assert_int_eq(F.live, 0);
}
END_TEST

/* ---- RDMA writes and completions --------------------------------------------------------- */

struct done {
	int n;
	uint64_t cookie[8];
	int status[8];
	char why[8][128];
};

static void on_done(void *arg, uint64_t cookie, int status, const char *why)
{
	struct done *d = arg;

	ck_assert_int_lt(d->n, 8);
	d->cookie[d->n] = cookie;
	d->status[d->n] = status;
	snprintf(d->why[d->n], sizeof(d->why[0]), "%s", why ? why : "");
	d->n++;
}

static struct tpv_qp *qp_rts(struct tpv_ctx *ctx, uint32_t depth)
{
	struct tpv_qp_params p = { .max_send_wr = depth };
	struct tpv_qp *qp = qp_new(ctx, &p);
	struct tpv_qp_info rem = remote_ib();
	char why[128] = "";

	ck_assert_msg(tpv_qp_connect(qp, &rem, why, sizeof(why)) == 0, "%s", why);
	return qp;
}

static void wc_push(uint64_t wr_id, enum ibv_wc_status status, uint32_t qpn)
{
	F.wc[F.n_wc++] = (struct ibv_wc){ .wr_id = wr_id, .status = status, .qp_num = qpn,
					  .opcode = IBV_WC_RDMA_WRITE };
}

START_TEST(test_write_pieces_by_max_message_size)
{
	ck_assert_int_eq(tpv_write_pieces(0, 1000), 0);
	ck_assert_int_eq(tpv_write_pieces(1, 1000), 1);
	ck_assert_int_eq(tpv_write_pieces(999, 1000), 1);
	ck_assert_int_eq(tpv_write_pieces(1000, 1000), 1);
	ck_assert_int_eq(tpv_write_pieces(1001, 1000), 2);
	ck_assert_int_eq(tpv_write_pieces(3000, 1000), 3);
	ck_assert_int_eq(tpv_write_pieces(1ull << 40, 1u << 31), 512);
	ck_assert_int_eq(tpv_write_pieces(1ull << 30, 0), 1); /* unknown: 1 GiB */
	ck_assert_int_eq(tpv_write_pieces((1ull << 30) + 1, 0), 2);
}
END_TEST

START_TEST(test_write_is_cut_and_only_the_last_piece_signaled)
{
	struct tpv_nic nic = nic_ib();
	struct tpv_ctx *ctx;
	struct tpv_qp *qp;
	struct tpv_write w = { .local_addr = 0x10000, .lkey = 0x11, .remote_addr = 0x900000,
			       .rkey = 0x22, .len = 2500, .cookie = 77 };
	struct done d = { 0 };
	char why[128] = "";

	nic.max_msg_sz = 1000;
	ctx = ctx_open(&nic);
	qp = qp_rts(ctx, 16);
	ck_assert_msg(tpv_qp_write(qp, &w, why, sizeof(why)) == 0, "%s", why);
	ck_assert_int_eq(F.n_post, 3);
	for (int i = 0; i < 3; i++) {
		struct fake_post *p = &F.post[i];

		ck_assert_int_eq(p->wr.opcode, IBV_WR_RDMA_WRITE);
		ck_assert_int_eq(p->sge.addr, 0x10000 + 1000 * i);
		ck_assert_int_eq(p->sge.length, i < 2 ? 1000 : 500);
		ck_assert_int_eq(p->sge.lkey, 0x11);
		ck_assert_int_eq(p->wr.wr.rdma.remote_addr, 0x900000 + 1000 * i);
		ck_assert_int_eq(p->wr.wr.rdma.rkey, 0x22);
		ck_assert_int_eq(p->wr.send_flags, i == 2 ? IBV_SEND_SIGNALED : 0);
		ck_assert_int_eq(p->wr.wr_id, F.post[0].wr.wr_id);
	}
	ck_assert_int_eq(tpv_cq_drain(ctx, on_done, &d), 0);
	ck_assert_int_eq(d.n, 0);
	wc_push(F.post[2].wr.wr_id, IBV_WC_SUCCESS, 0x1234);
	F.event = true;
	ck_assert_int_eq(tpv_cq_drain(ctx, on_done, &d), 1);
	ck_assert_int_eq(F.acks, 1);
	ck_assert_int_eq(F.notifies, 3); /* at open, and after each drain */
	ck_assert_int_eq(d.n, 1);
	ck_assert_int_eq(d.cookie[0], 77);
	ck_assert_int_eq(d.status[0], 0);
	tpv_qp_free(qp);
	tpv_ctx_close(ctx);
	ck_assert_int_eq(F.live, 0);
}
END_TEST

START_TEST(test_write_failure_finishes_each_write_once)
{
	struct tpv_nic nic = nic_ib();
	struct tpv_ctx *ctx;
	struct tpv_qp *qp;
	struct tpv_write w1 = { .local_addr = 0x1000, .remote_addr = 0x2000, .len = 300,
				.cookie = 1 };
	struct tpv_write w2 = w1;
	struct done d = { 0 };
	char why[128] = "";

	nic.max_msg_sz = 100;
	ctx = ctx_open(&nic);
	qp = qp_rts(ctx, 8);
	w2.cookie = 2;
	ck_assert_int_eq(tpv_qp_write(qp, &w1, why, sizeof(why)), 0);
	ck_assert_int_eq(tpv_qp_write(qp, &w2, why, sizeof(why)), 0);
	ck_assert_int_eq(F.n_post, 6);
	/* the first piece fails; every other piece is flushed, unsignaled ones included */
	wc_push(F.post[0].wr.wr_id, IBV_WC_REM_ACCESS_ERR, 0x1234);
	for (int i = 1; i < 6; i++)
		wc_push(F.post[i].wr.wr_id, IBV_WC_WR_FLUSH_ERR, 0x1234);
	F.event = true;
	ck_assert_int_eq(tpv_cq_drain(ctx, on_done, &d), 6);
	ck_assert_int_eq(d.n, 2);
	ck_assert_int_eq(d.cookie[0], 1);
	ck_assert_int_eq(d.status[0], -EACCES);
	ck_assert_str_eq(d.why[0],
			 "RDMA write on qp 0x1234: remote access error (vendor error 0x0)");
	ck_assert_int_eq(d.cookie[1], 2);
	ck_assert_int_eq(d.status[1], -ECANCELED);
	tpv_qp_free(qp);
	tpv_ctx_close(ctx);
}
END_TEST

START_TEST(test_write_respects_send_queue_room)
{
	struct tpv_nic nic = nic_ib();
	struct tpv_ctx *ctx;
	struct tpv_qp *qp;
	struct tpv_write w = { .local_addr = 0x1000, .remote_addr = 0x2000, .len = 300 };
	struct done d = { 0 };
	char why[128] = "";

	nic.max_msg_sz = 100;
	ctx = ctx_open(&nic);
	qp = qp_rts(ctx, 4);
	ck_assert_int_eq(tpv_qp_write(qp, &w, why, sizeof(why)), 0); /* 3 of 4 slots */
	ck_assert_int_eq(tpv_qp_write(qp, &w, why, sizeof(why)), -ENOBUFS);
	ck_assert_str_eq(why, "send queue full: 3 pieces, 3 of 4 slots in use");
	wc_push(F.post[2].wr.wr_id, IBV_WC_SUCCESS, 0x1234);
	ck_assert_int_eq(tpv_cq_drain(ctx, on_done, &d), 1);
	ck_assert_int_eq(tpv_qp_write(qp, &w, why, sizeof(why)), 0);
	w.cookie = 5;
	ck_assert_int_eq(tpv_qp_write(qp, &w, why, sizeof(why)), -ENOBUFS);
	w.len = 401;
	ck_assert_int_eq(tpv_qp_write(qp, &w, why, sizeof(why)), -EMSGSIZE);
	w.len = 0;
	ck_assert_int_eq(tpv_qp_write(qp, &w, why, sizeof(why)), -EINVAL);
	w.len = 10;
	w.remote_addr = UINT64_MAX - 5;
	ck_assert_int_eq(tpv_qp_write(qp, &w, why, sizeof(why)), -EINVAL);
	/* closing finishes what is still pending: the second 300-byte write */
	d.n = 0;
	tpv_qp_close(qp, on_done, &d);
	ck_assert_int_eq(d.n, 1);
	ck_assert_int_eq(d.status[0], -ECANCELED);
	ck_assert_str_eq(d.why[0], "queue pair closed");
	tpv_ctx_close(ctx);
	ck_assert_int_eq(F.live, 0);
}
END_TEST

START_TEST(test_write_needs_rts_and_reports_post_errors)
{
	struct tpv_nic nic = nic_ib();
	struct tpv_ctx *ctx = ctx_open(&nic);
	struct tpv_qp *qp = qp_new(ctx, NULL), *qp2;
	struct tpv_write w = { .local_addr = 0x1000, .remote_addr = 0x2000, .len = 10 };
	char why[128] = "";

	ck_assert_int_eq(tpv_qp_write(qp, &w, why, sizeof(why)), -ENOTCONN);
	ck_assert_str_eq(why, "queue pair in RESET, not RTS");
	qp2 = qp_rts(ctx, 8);
	F.post_errno = ENOMEM;
	ck_assert_int_eq(tpv_qp_write(qp2, &w, why, sizeof(why)), -ENOMEM);
	ck_assert_str_eq(why, "ibv_post_send: Cannot allocate memory");
	ck_assert_int_eq(tpv_qp_state(qp2), TPV_QP_RTS); /* nothing went out */
	tpv_qp_free(qp);
	tpv_qp_free(qp2);
	tpv_ctx_close(ctx);
	ck_assert_int_eq(F.live, 0);
}
END_TEST

START_TEST(test_drain_routes_completions_to_their_qp)
{
	struct tpv_nic nic = nic_ib();
	struct tpv_ctx *ctx = ctx_open(&nic);
	struct tpv_qp *a = qp_rts(ctx, 8), *b = qp_rts(ctx, 8);
	struct tpv_write w = { .local_addr = 0x1000, .remote_addr = 0x2000, .len = 10 };
	struct done d = { 0 };
	char why[128] = "";

	w.cookie = 10;
	ck_assert_int_eq(tpv_qp_write(a, &w, why, sizeof(why)), 0);
	w.cookie = 20;
	ck_assert_int_eq(tpv_qp_write(b, &w, why, sizeof(why)), 0);
	wc_push(F.post[1].wr.wr_id, IBV_WC_RETRY_EXC_ERR, tpv_qp_local(b)->qpn);
	wc_push(F.post[0].wr.wr_id, IBV_WC_SUCCESS, tpv_qp_local(a)->qpn);
	wc_push(99, IBV_WC_SUCCESS, 0x999); /* a queue pair that is gone */
	ck_assert_int_eq(tpv_cq_drain(ctx, on_done, &d), 3);
	ck_assert_int_eq(d.n, 2);
	ck_assert_int_eq(d.cookie[0], 20);
	ck_assert_int_eq(d.status[0], -ETIMEDOUT);
	ck_assert_int_eq(d.cookie[1], 10);
	ck_assert_int_eq(d.status[1], 0);
	tpv_qp_free(a);
	tpv_qp_free(b);
	tpv_ctx_close(ctx);
}
END_TEST

START_TEST(test_drain_ignores_a_freed_qp_whose_number_was_reused)
{
	struct tpv_nic nic = nic_ib();
	struct tpv_ctx *ctx = ctx_open(&nic);
	struct tpv_qp *a = qp_rts(ctx, 8), *b;
	struct tpv_write w = { .local_addr = 0x1000, .remote_addr = 0x2000, .len = 10,
			       .cookie = 1 };
	struct done d = { 0 };
	char why[128] = "";

	ck_assert_int_eq(tpv_qp_write(a, &w, why, sizeof(why)), 0);
	tpv_qp_free(a);
	F.next_qpn = 0x1234; /* the device hands the number out again */
	b = qp_rts(ctx, 8);
	ck_assert_int_eq(tpv_qp_local(b)->qpn, 0x1234);
	w.cookie = 2;
	ck_assert_int_eq(tpv_qp_write(b, &w, why, sizeof(why)), 0);
	wc_push(F.post[0].wr.wr_id, IBV_WC_WR_FLUSH_ERR, 0x1234); /* a's, left in the queue */
	wc_push(F.post[1].wr.wr_id, IBV_WC_SUCCESS, 0x1234);
	ck_assert_int_eq(tpv_cq_drain(ctx, on_done, &d), 2);
	ck_assert_int_eq(d.n, 1);
	ck_assert_int_eq(d.cookie[0], 2);
	ck_assert_int_eq(d.status[0], 0);
	tpv_qp_free(b);
	tpv_ctx_close(ctx);
}
END_TEST

/* ---- enumeration, probe and NIC locality --------------------------------------------------- */

static char root[64];

static void mkdir_p(const char *rel)
{
	char path[1024], *p;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	for (p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
		*p = '\0';
		mkdir(path, 0755);
		*p = '/';
	}
	mkdir(path, 0755);
}

static void put_file(const char *rel, const char *text)
{
	char path[1024];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

/* A PCI device at @rel under devices/, with its numa_node, linked from bus/pci/devices. */
static void pci_dev(const char *rel, int numa)
{
	char path[300], link[600], node[16];
	const char *id = strrchr(rel, '/') + 1;

	snprintf(path, sizeof(path), "devices/%s", rel);
	mkdir_p(path);
	snprintf(link, sizeof(link), "%s/numa_node", path);
	snprintf(node, sizeof(node), "%d\n", numa);
	put_file(link, node);
	mkdir_p("bus/pci/devices");
	snprintf(link, sizeof(link), "%s/bus/pci/devices/%s", root, id);
	snprintf(path, sizeof(path), "../../../devices/%s", rel);
	ck_assert_int_eq(symlink(path, link), 0);
}

/* RDMA device @name whose PCI function is @rel under devices/. */
static void ib_dev(const char *name, const char *rel)
{
	char dir[256], link[400], target[400];

	snprintf(dir, sizeof(dir), "class/infiniband/%s", name);
	mkdir_p(dir);
	snprintf(link, sizeof(link), "%s/%s/device", root, dir);
	snprintf(target, sizeof(target), "%s/devices/%s", root, rel);
	ck_assert_int_eq(symlink(target, link), 0);
}

#define GPU "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:3b:00.0"
#define NIC_NEAR "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:04:00.0"
#define NIC_FAR "pci0000:80/0000:80:01.0/0000:81:00.0"
#define NIC_ROOT "pci0000:00/0000:00:02.0/0000:05:00.0"
#define NIC_NODE0 "pci0000:40/0000:40:01.0/0000:41:00.0"

/* Once per test case, in the parent, so the tree goes away even when a test fails. */
static void sysfs_setup(void)
{
	snprintf(root, sizeof(root), "/tmp/tpv-sysfs.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(root));
	pci_dev(GPU, 0);
	pci_dev(NIC_FAR, 1);
	pci_dev(NIC_NEAR, 0);
	pci_dev(NIC_ROOT, 0);
	ib_dev("mlx5_0", NIC_FAR);
	ib_dev("mlx5_1", NIC_NEAR);
	ib_dev("mlx5_2", NIC_ROOT);
	pci_dev(NIC_NODE0, 0);
	ib_dev("mlx5_3", NIC_NODE0);
}

static void sysfs_teardown(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", root);
}

static struct tpv_nic named(const char *dev, uint8_t port)
{
	struct tpv_nic n = nic_ib();

	snprintf(n.dev, sizeof(n.dev), "%s", dev);
	n.port = port;
	return n;
}

START_TEST(test_nics_list_every_active_port_with_pci_and_gid)
{
	struct tpv_nic *nics = NULL;
	size_t n = 0;
	char why[256] = "";

	/* mlx5_0: port 1 InfiniBand, port 2 RoCE; mlx5_1: port down; mlx5_2: RoCE with no GID */
	fake_port_set(0, 2, IBV_PORT_ACTIVE, IBV_LINK_LAYER_ETHERNET, 0);
	fake_gid_add(0, 2, IBV_GID_TYPE_ROCE_V1, gid_ll);
	fake_gid_add(0, 2, IBV_GID_TYPE_ROCE_V2, gid_ll);
	fake_gid_add(0, 2, IBV_GID_TYPE_ROCE_V1, gid_v4);
	fake_gid_add(0, 2, IBV_GID_TYPE_ROCE_V2, gid_v4);
	F.port[0][1].attr.active_mtu = IBV_MTU_1024;
	fake_dev_add("mlx5_1");
	fake_port_set(1, 1, IBV_PORT_DOWN, IBV_LINK_LAYER_INFINIBAND, 0);
	fake_dev_add("mlx5_2");
	fake_port_set(2, 1, IBV_PORT_ACTIVE, IBV_LINK_LAYER_ETHERNET, 0);

	ck_assert_int_eq(tpv_nics_list(&fake_ops, root, &nics, &n, why, sizeof(why)), 0);
	ck_assert_int_eq(n, 2);
	ck_assert_str_eq(nics[0].dev, "mlx5_0");
	ck_assert_int_eq(nics[0].port, 1);
	ck_assert_int_eq(nics[0].link, TPV_LINK_IB);
	ck_assert_int_eq(nics[0].lid, 7);
	ck_assert_int_eq(nics[0].gid_index, 0);
	ck_assert_str_eq(nics[0].pci, "0000:81:00.0");
	ck_assert_int_eq(nics[0].numa_node, 1);
	ck_assert_int_eq(nics[0].max_msg_sz, 1u << 30);
	ck_assert_str_eq(nics[1].dev, "mlx5_0");
	ck_assert_int_eq(nics[1].port, 2);
	ck_assert_int_eq(nics[1].link, TPV_LINK_ETH);
	ck_assert_int_eq(nics[1].mtu, IBV_MTU_1024);
	ck_assert_int_eq(nics[1].gid_index, 3); /* RoCE v2, IPv4-mapped */
	ck_assert_mem_eq(nics[1].gid, gid_v4, 16);
	ck_assert_str_eq(why, "mlx5_1: no active port; mlx5_2 port 1: no usable RoCE GID");
	ck_assert_int_eq(F.live, 0);
	free(nics);
}
END_TEST

START_TEST(test_nics_list_without_devices_says_why)
{
	struct tpv_nic *nics = NULL;
	size_t n = 1;
	char why[256] = "";

	F.n_dev = 0;
	ck_assert_int_eq(tpv_nics_list(&fake_ops, root, &nics, &n, why, sizeof(why)), 0);
	ck_assert_int_eq(n, 0);
	ck_assert_str_eq(why, "no RDMA device (ibv_get_device_list found none)");
	free(nics);
	F.list_null = true;
	ck_assert_int_eq(tpv_nics_list(&fake_ops, root, &nics, &n, why, sizeof(why)), 0);
	ck_assert_int_eq(n, 0);
	ck_assert_str_eq(why, "no RDMA device (ibv_get_device_list: Function not implemented)");
	free(nics);
	/* an InfiniBand port without a LID (no subnet manager) is not usable either */
	F.list_null = false;
	F.n_dev = 1;
	F.port[0][0].attr.lid = 0;
	ck_assert_int_eq(tpv_nics_list(&fake_ops, root, &nics, &n, why, sizeof(why)), 0);
	ck_assert_int_eq(n, 0);
	ck_assert_str_eq(why, "mlx5_0 port 1: no LID (is a subnet manager running?)");
	free(nics);
}
END_TEST

START_TEST(test_choose_prefers_the_nic_on_the_gpus_switch)
{
	struct tpv_nic nics[] = { named("mlx5_0", 1), named("mlx5_2", 1), named("mlx5_1", 1) };
	unsigned int rr = 0;

	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(tpv_nic_choose(nics, 3, root, "0000:3b:00.0", &rr), 2);
	/* CUDA's spelling (upper case) and NVML's (8-digit domain) */
	ck_assert_int_eq(tpv_nic_choose(nics, 3, root, "0000:3B:00.0", &rr), 2);
	ck_assert_int_eq(tpv_nic_choose(nics, 3, root, "00000000:3B:00.0", &rr), 2);
	/* without the switch NIC, the one under the same root complex wins */
	ck_assert_int_eq(tpv_nic_choose(nics, 2, root, "0000:3b:00.0", &rr), 1);
	ck_assert_int_eq(tpv_nic_choose(nics, 0, root, "0000:3b:00.0", &rr), -ENOENT);
}
END_TEST

START_TEST(test_choose_breaks_ties_by_numa_node)
{
	struct tpv_nic nics[] = { named("mlx5_0", 1), named("mlx5_3", 1) };
	unsigned int rr = 0;

	/* mlx5_3 on another root complex but the GPU's NUMA node; mlx5_0 on node 1 */
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(tpv_nic_choose(nics, 2, root, "0000:3b:00.0", &rr), 1);
}
END_TEST

START_TEST(test_choose_round_robins_among_equals)
{
	/* two ports of the near NIC, and the far one */
	struct tpv_nic nics[] = { named("mlx5_1", 1), named("mlx5_0", 1), named("mlx5_1", 2) };
	unsigned int rr = 0;

	ck_assert_int_eq(tpv_nic_choose(nics, 3, root, "0000:3b:00.0", &rr), 0);
	ck_assert_int_eq(tpv_nic_choose(nics, 3, root, "0000:3b:00.0", &rr), 2);
	ck_assert_int_eq(tpv_nic_choose(nics, 3, root, "0000:3b:00.0", &rr), 0);
	/* unknown GPU, or none: every port is equal */
	rr = 0;
	ck_assert_int_eq(tpv_nic_choose(nics, 3, root, "0000:99:00.0", &rr), 0);
	ck_assert_int_eq(tpv_nic_choose(nics, 3, root, NULL, &rr), 1);
	ck_assert_int_eq(tpv_nic_choose(nics, 3, root, "garbage", &rr), 2);
	ck_assert_int_eq(tpv_nic_choose(nics, 3, root, "0000:3b:00.0x", &rr), 0);
}
END_TEST

START_TEST(test_probe_on_this_machine_gives_a_reason)
{
	char why[256] = "";
	const struct tpv_ops *ops = tpv_ops_load(why, sizeof(why));
	int r = ops ? tpv_probe(ops, why, sizeof(why)) : 0;

	printf("tpv_probe on this host: %d (%s)\n", r, why);
	ck_assert(r == 0 || r == 1);
	ck_assert_int_gt(strlen(why), 0);
	/* No device here, unless a stand-in provider is loaded instead of libibverbs (the hw
	 * suite's fakeverbs and fakecuda setups set TPIPD_VERBS_LIBRARY): it has ports. */
	if (access("/sys/class/infiniband", F_OK) < 0 && !getenv("TPIPD_VERBS_LIBRARY")) {
		ck_assert_int_eq(r, 0);
		ck_assert_ptr_nonnull(strstr(why, "no RDMA device"));
	}
}
END_TEST

/* tpv_wc_status_str() gives libibverbs' own texts (where the library is installed). */
START_TEST(test_wc_status_texts_are_libibverbs_own)
{
	const char *(*lib_str)(enum ibv_wc_status);
	void *h = dlopen(TPV_LIBRARY, RTLD_NOW | RTLD_LOCAL);

	if (!h) {
		printf("no %s here: %s\n", TPV_LIBRARY, dlerror());
		return;
	}
	*(void **)&lib_str = dlsym(h, "ibv_wc_status_str");
	ck_assert_ptr_nonnull(lib_str);
	for (int i = IBV_WC_SUCCESS; i <= IBV_WC_TM_RNDV_INCOMPLETE + 1; i++)
		ck_assert_str_eq(tpv_wc_status_str((enum ibv_wc_status)i),
				 lib_str((enum ibv_wc_status)i));
	dlclose(h);
}
END_TEST

static Suite *verbs_suite(void)
{
	Suite *s = suite_create("verbs");
	TCase *tc = tcase_create("fake");
	TCase *topo = tcase_create("sysfs");
	TCase *real = tcase_create("real");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_info_round_trips_little_endian);
	tcase_add_test(tc, test_info_decode_rejects_bad_input);
	tcase_add_test(tc, test_qp_walks_to_rts_with_exact_ib_attributes);
	tcase_add_test(tc, test_qp_roce_rtr_addresses_by_gid);
	tcase_add_test(tc, test_qp_modify_failure_at_each_step_is_reported);
	tcase_add_test(tc, test_qp_rejects_peer_on_other_link_layer);
	tcase_add_test(tc, test_qps_cannot_overcommit_the_cq);
	tcase_add_test(tc, test_ctx_open_names_the_failing_call);
	tcase_add_test(tc, test_cq_fd_is_nonblocking_and_armed);
	tcase_add_test(tc, test_mr_uses_dmabuf_when_given_an_fd);
	tcase_add_test(tc, test_mr_host_memory_uses_reg_mr);
	tcase_add_test(tc, test_mr_dmabuf_failure_falls_back_and_names_peermem);
	tcase_add_test(tc, test_write_pieces_by_max_message_size);
	tcase_add_test(tc, test_write_is_cut_and_only_the_last_piece_signaled);
	tcase_add_test(tc, test_write_failure_finishes_each_write_once);
	tcase_add_test(tc, test_write_respects_send_queue_room);
	tcase_add_test(tc, test_write_needs_rts_and_reports_post_errors);
	tcase_add_test(tc, test_drain_routes_completions_to_their_qp);
	tcase_add_test(tc, test_drain_ignores_a_freed_qp_whose_number_was_reused);
	suite_add_tcase(s, tc);
	tcase_add_unchecked_fixture(topo, sysfs_setup, sysfs_teardown);
	tcase_add_checked_fixture(topo, setup, teardown);
	tcase_add_test(topo, test_nics_list_every_active_port_with_pci_and_gid);
	tcase_add_test(topo, test_nics_list_without_devices_says_why);
	tcase_add_test(topo, test_choose_prefers_the_nic_on_the_gpus_switch);
	tcase_add_test(topo, test_choose_breaks_ties_by_numa_node);
	tcase_add_test(topo, test_choose_round_robins_among_equals);
	suite_add_tcase(s, topo);
	tcase_add_test(real, test_probe_on_this_machine_gives_a_reason);
	tcase_add_test(real, test_wc_status_texts_are_libibverbs_own);
	suite_add_tcase(s, real);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(verbs_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
