/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The insides of a verbs context and queue pair, shared by ctx.c, qp.c and write.c and by no
 * one else: the rest of tpipd sees only the opaque types of tpv.h.
 */
#ifndef TPV_INT_H
#define TPV_INT_H

#include "tpu.h"
#include "tpv.h"

struct tpv_qp;

/* One completion queue of a context; its queue pairs' send queues fit in it (@used <= @depth),
 * so it can never overflow. */
struct tpv_cq {
	struct ibv_cq *cq;
	int depth;
	uint32_t used; /* send queue slots of the queue pairs on it */
};

#define TPV_CQS_MAX 64 /* completion queues per context, under the device's max_cq */

struct tpv_ctx {
	const struct tpv_ops *ops;
	struct tpv_nic nic;
	struct ibv_context *verbs;
	struct ibv_pd *pd;
	struct ibv_comp_channel *channel;
	struct tpv_cq cqs[TPV_CQS_MAX]; /* [0] made at open, the others when queue pairs need */
	unsigned n_cqs, max_cqs;	 /* made; allowed (the device's max_cq, at least 1) */
	int cq_depth;			 /* entries of each, within the device's max_cqe */
	uint32_t max_qp_wr;	 /* device limit on a queue's depth */
	uint64_t next_seq;	 /* wr_id of the next write, unique across the context's QPs */
	struct tpu_list qps;	 /* struct tpv_qp.link: completions are matched by qp_num */
};

/* One posted write waiting for its completion; kept in posting order. */
struct tpv_pending {
	uint64_t seq; /* the wr_id of every piece; a reused qp_num never sees an old one again */
	uint64_t cookie;
	uint32_t pieces;
};

struct tpv_qp {
	struct tpv_ctx *ctx;
	struct tpu_list link;
	struct ibv_qp *qp;
	enum tpv_qp_state state;
	struct tpv_qp_params params;
	struct tpv_qp_info local;
	struct tpv_qp_info remote;
	bool have_remote;
	uint32_t max_send_wr;
	unsigned cq;		     /* index in ctx->cqs */
	uint32_t in_flight;	     /* send queue slots used by posted pieces */
	struct tpv_pending *pending; /* ring of max_send_wr entries */
	uint32_t pend_head, pend_n;
};

/* -errno for an int verb's result @r: positive errno, or < 0 with errno set (0 stays 0). */
int tpv_verbs_rc(int r);

/* -errno after a verb returned NULL or -1: errno, or @fallback if the provider left it 0. */
int tpv_verbs_errno(int fallback);

/*
 * tpv_why_add() - append "; <text>" (or just the text if @why is empty) to @why, truncating.
 */
void tpv_why_add(char *why, size_t why_len, const char *fmt, ...) _printf_(3, 4);

/*
 * tpv_sysfs_realpath() - the real path of @root/@rel (symlinks resolved).
 * Ownership: returns owned string, free with free(). Return: the path, or NULL if absent.
 */
char *tpv_sysfs_realpath(const char *root, const char *rel);

/* The numa_node file in PCI device directory @devpath: the node, or -1 if unknown. */
int tpv_sysfs_numa(const char *devpath);

/*
 * tpv_ctx_cq_reserve() - room for @slots completions on a completion queue of @ctx: one with
 * room, else a new one (up to the device's max_cq). Return: its index, or -ENOSPC (every queue
 * full and no more allowed), or the ibv_create_cq -errno (reason in @why).
 */
int tpv_ctx_cq_reserve(struct tpv_ctx *ctx, uint32_t slots, char *why, size_t why_len);

/* The queue pair of @ctx whose number is @qpn, or NULL. */
struct tpv_qp *tpv_ctx_find_qp(struct tpv_ctx *ctx, uint32_t qpn);

#endif
