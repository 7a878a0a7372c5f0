/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpv_ops_real: the verbs op table bound to libibverbs. Most entries are the library functions
 * themselves; the verbs that verbs.h defines as static inline functions or macros (poll_cq,
 * post_send, req_notify_cq, query_port, query_gid_ex, reg_mr) are wrapped here so they have an
 * address. No logic lives here: conventions are libibverbs' own, converted by the callers.
 * Also the choice of table at run time: a test stand-in named by $TPIPD_VERBS_LIBRARY, else this.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <infiniband/verbs.h>
#include "tpv.h"

static int ops_query_port(struct ibv_context *verbs, uint8_t port, struct ibv_port_attr *attr)
{
	return ibv_query_port(verbs, port, attr);
}

static int ops_query_gid_ex(struct ibv_context *verbs, uint32_t port, uint32_t index,
			    struct ibv_gid_entry *entry)
{
	return ibv_query_gid_ex(verbs, port, index, entry, 0);
}

static int ops_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return ibv_req_notify_cq(cq, solicited_only);
}

static int ops_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, num_entries, wc);
}

static struct ibv_mr *ops_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr(pd, addr, length, access);
}

static int ops_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	return ibv_post_send(qp, wr, bad_wr);
}

static int ops_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
	return ibv_modify_qp(qp, attr, attr_mask);
}

const struct tpv_ops tpv_ops_real = {
	.get_device_list = ibv_get_device_list,
	.free_device_list = ibv_free_device_list,
	.open_device = ibv_open_device,
	.close_device = ibv_close_device,
	.query_device = ibv_query_device,
	.query_port = ops_query_port,
	.query_gid_ex = ops_query_gid_ex,
	.alloc_pd = ibv_alloc_pd,
	.dealloc_pd = ibv_dealloc_pd,
	.create_comp_channel = ibv_create_comp_channel,
	.destroy_comp_channel = ibv_destroy_comp_channel,
	.create_cq = ibv_create_cq,
	.destroy_cq = ibv_destroy_cq,
	.req_notify_cq = ops_req_notify_cq,
	.get_cq_event = ibv_get_cq_event,
	.ack_cq_events = ibv_ack_cq_events,
	.poll_cq = ops_poll_cq,
	.create_qp = ibv_create_qp,
	.destroy_qp = ibv_destroy_qp,
	.modify_qp = ops_modify_qp,
	.reg_mr = ops_reg_mr,
	.reg_dmabuf_mr = ibv_reg_dmabuf_mr,
	.dereg_mr = ibv_dereg_mr,
	.post_send = ops_post_send,
};

const struct tpv_ops *tpv_ops_load(char *why, size_t why_len)
{
	const char *path = getenv("TPIPD_VERBS_LIBRARY");
	const struct tpv_ops *ops;
	void *lib;

	if (!path || !*path)
		return &tpv_ops_real;
	lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		if (why && why_len)
			snprintf(why, why_len, "TPIPD_VERBS_LIBRARY=%s: dlopen: %s", path,
				 dlerror());
		return NULL;
	}
	ops = dlsym(lib, "tpv_ops_table");
	if (!ops) {
		if (why && why_len)
			snprintf(why, why_len, "TPIPD_VERBS_LIBRARY=%s: dlsym(tpv_ops_table): %s",
				 path, dlerror());
		dlclose(lib);
		return NULL;
	}
	return ops; /* the library stays loaded for the life of the process */
}
