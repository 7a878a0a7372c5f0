/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The verbs op table at run time: libibverbs.so.1 is dlopen()ed (never linked, as libcuda.so.1
 * is not: the same binaries start where rdma-core is absent) and the functions the layer uses
 * are resolved from it into one table. Only symbols libibverbs exports are looked up; the verbs
 * that verbs.h defines as static inline functions or macros either call through the device
 * context's own ops (poll_cq, post_send, req_notify_cq: used as they are) or wrap an exported
 * symbol (query_port, query_gid_ex, reg_mr: wrapped here around the resolved pointer). No logic
 * lives here: conventions are libibverbs' own, converted by the callers. Also the choice of
 * table: a test stand-in named by $TPIPD_VERBS_LIBRARY, else libibverbs.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>
#include "tpu.h"
#include "tpv.h"

/* The exported libibverbs functions behind the wrappers below. */
static struct {
	int (*query_port)(struct ibv_context *verbs, uint8_t port, void *compat_attr);
	int (*query_gid_ex)(struct ibv_context *verbs, uint32_t port, uint32_t index,
			    struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size);
	struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *pd, void *addr, size_t length,
				       uint64_t iova, unsigned int access);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access);
} lib;

static struct tpv_ops real;
static char real_why[256];
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

/* verbs.h's ___ibv_query_port(), calling the resolved ibv_query_port for old providers. */
static int ops_query_port(struct ibv_context *verbs, uint8_t port, struct ibv_port_attr *attr)
{
	struct verbs_context *vctx = verbs_get_ctx_op(verbs, query_port);

	if (!vctx) {
		memset(attr, 0, sizeof(*attr));
		return lib.query_port(verbs, port, attr);
	}
	return vctx->query_port(verbs, port, attr, sizeof(*attr));
}

/* verbs.h's ibv_query_gid_ex(). */
static int ops_query_gid_ex(struct ibv_context *verbs, uint32_t port, uint32_t index,
			    struct ibv_gid_entry *entry)
{
	return lib.query_gid_ex(verbs, port, index, entry, 0, sizeof(*entry));
}

static int ops_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return ibv_req_notify_cq(cq, solicited_only); /* inline: the context's op */
}

static int ops_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, num_entries, wc); /* inline: the context's op */
}

static int ops_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	return ibv_post_send(qp, wr, bad_wr); /* inline: the context's op */
}

/* verbs.h's ibv_reg_mr() for flags not known at compile time; libraries older than
 * ibv_reg_mr_iova2 (rdma-core 23) take the plain call, which is the same without
 * IBV_ACCESS_OPTIONAL_RANGE. */
static struct ibv_mr *ops_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	if (lib.reg_mr_iova2)
		return lib.reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
	return lib.reg_mr(pd, addr, length, access & ~IBV_ACCESS_OPTIONAL_RANGE);
}

/* One symbol to resolve: its name, where the pointer goes, and whether it may be absent. */
struct sym {
	const char *name;
	void **slot;
	bool optional;
};

#define SYM(field, name) { name, (void **)&real.field, false }
#define LIB(field, name, opt) { name, (void **)&lib.field, opt }

static void real_load(void)
{
	const struct sym syms[] = {
		SYM(get_device_list, "ibv_get_device_list"),
		SYM(free_device_list, "ibv_free_device_list"),
		SYM(open_device, "ibv_open_device"),
		SYM(close_device, "ibv_close_device"),
		SYM(query_device, "ibv_query_device"),
		SYM(alloc_pd, "ibv_alloc_pd"),
		SYM(dealloc_pd, "ibv_dealloc_pd"),
		SYM(create_comp_channel, "ibv_create_comp_channel"),
		SYM(destroy_comp_channel, "ibv_destroy_comp_channel"),
		SYM(create_cq, "ibv_create_cq"),
		SYM(destroy_cq, "ibv_destroy_cq"),
		SYM(get_cq_event, "ibv_get_cq_event"),
		SYM(ack_cq_events, "ibv_ack_cq_events"),
		SYM(create_qp, "ibv_create_qp"),
		SYM(destroy_qp, "ibv_destroy_qp"),
		SYM(modify_qp, "ibv_modify_qp"),
		SYM(dereg_mr, "ibv_dereg_mr"),
		/* rdma-core 34 and later; without it GPU memory needs nvidia-peermem */
		{ "ibv_reg_dmabuf_mr", (void **)&real.reg_dmabuf_mr, true },
		LIB(query_port, "ibv_query_port", false),
		LIB(query_gid_ex, "_ibv_query_gid_ex", false),
		LIB(reg_mr_iova2, "ibv_reg_mr_iova2", true),
		LIB(reg_mr, "ibv_reg_mr", false),
	};
	void *h = dlopen(TPV_LIBRARY, RTLD_NOW | RTLD_LOCAL);

	if (!h) {
		snprintf(real_why, sizeof(real_why), "no libibverbs (install rdma-core's "
			 "libibverbs1): %s", dlerror());
		return;
	}
	for (size_t i = 0; i < TPU_ARRAY_SIZE(syms); i++) {
		*syms[i].slot = dlsym(h, syms[i].name);
		if (!*syms[i].slot && !syms[i].optional) {
			snprintf(real_why, sizeof(real_why), "%s lacks %s: rdma-core too old",
				 TPV_LIBRARY, syms[i].name);
			dlclose(h);
			return;
		}
	}
	real.query_port = ops_query_port;
	real.query_gid_ex = ops_query_gid_ex;
	real.req_notify_cq = ops_req_notify_cq;
	real.poll_cq = ops_poll_cq;
	real.reg_mr = ops_reg_mr;
	real.post_send = ops_post_send;
	/* the library stays loaded for the life of the process */
}

/* The stand-in named by $TPIPD_VERBS_LIBRARY (tests only). */
static const struct tpv_ops *standin_load(const char *path, char *why, size_t why_len)
{
	const struct tpv_ops *ops;
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);

	if (!h) {
		if (why && why_len)
			snprintf(why, why_len, "TPIPD_VERBS_LIBRARY=%s: dlopen: %s", path,
				 dlerror());
		return NULL;
	}
	ops = dlsym(h, "tpv_ops_table");
	if (!ops) {
		if (why && why_len)
			snprintf(why, why_len, "TPIPD_VERBS_LIBRARY=%s: dlsym(tpv_ops_table): %s",
				 path, dlerror());
		dlclose(h);
		return NULL;
	}
	return ops; /* the library stays loaded for the life of the process */
}

const struct tpv_ops *tpv_ops_load(char *why, size_t why_len)
{
	const char *path = getenv("TPIPD_VERBS_LIBRARY");

	if (path && *path)
		return standin_load(path, why, why_len);
	pthread_once(&real_once, real_load);
	if (real_why[0]) {
		if (why && why_len)
			snprintf(why, why_len, "%s", real_why);
		return NULL;
	}
	return &real;
}

const char *tpv_wc_status_str(enum ibv_wc_status status)
{
	/* libibverbs' own texts (ibv_wc_status_str()), so that a stand-in prints them too */
	static const char *const names[] = {
		[IBV_WC_SUCCESS] = "success",
		[IBV_WC_LOC_LEN_ERR] = "local length error",
		[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
		[IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
		[IBV_WC_LOC_PROT_ERR] = "local protection error",
		[IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
		[IBV_WC_MW_BIND_ERR] = "memory management operation error",
		[IBV_WC_BAD_RESP_ERR] = "bad response error",
		[IBV_WC_LOC_ACCESS_ERR] = "local access error",
		[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
		[IBV_WC_REM_ACCESS_ERR] = "remote access error",
		[IBV_WC_REM_OP_ERR] = "remote operation error",
		[IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
		[IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
		[IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
		[IBV_WC_REM_ABORT_ERR] = "aborted error",
		[IBV_WC_INV_EECN_ERR] = "invalid EE context number",
		[IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
		[IBV_WC_FATAL_ERR] = "fatal error",
		[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
		[IBV_WC_GENERAL_ERR] = "general error",
		[IBV_WC_TM_ERR] = "TM error",
		[IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
	};

	if ((size_t)status < TPU_ARRAY_SIZE(names) && names[status])
		return names[status];
	return "unknown";
}
