/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The inside of the library's work queues (tpclient.h, "work queues"), shared by wq.c (handles,
 * the byte calls, requests and their answers) and wqmsg.c (questions and answers as messages).
 * Nothing else includes it.
 */
#ifndef TPC_WQ_INT_H
#define TPC_WQ_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

struct tpc_msg_desc;

struct tp_wq {
	struct tp_context *ctx;
	uint64_t id;
	bool owner;
	bool remote; /* hosted by another host's daemon: payloads ride inline, */
	bool remote_refs; /* except messages once its daemon streams them (WqReply 661) */
	char *name;
	/* Descriptors of message takes and answer reads not yet read or freed (wqmsg.c); under
	 * ctx->lock. */
	struct tpu_list descs;
};

struct wq_req {
	struct tpc_req req; /* first: the reply handler finds the wq_req from it */
	uint8_t *data;
	size_t len;
	uint64_t wq_id, qid;
	bool owner, remote_refs;
	int answer_err;
	bool idle;
	/* Messages (wqmsg.c): a take or answer read's descriptor (owned, made from WqReply.msg_desc
	 * by the reply handler); a read's bytes copied into its segments (@copied), or inline,
	 * scattered by the handler into the CPU slots of @scatter (@host: the CUDA slots' bytes, at
	 * their offsets in the item). */
	bool msg_held, copied;
	struct tpc_msg_desc *desc;
	const struct tp_allocation *scatter;
	const struct tp_descriptor *scatter_desc;
	uint8_t *host;
};

/* wq.c: sends @op (its req_id filled here) with @len bytes at @data as the data tail and waits
 * up to @wait_ms plus the reply timeout for the answer in @wr. Return: the daemon's status or
 * -errno. */
int tpc_wq_call(struct tp_context *ctx, Tpw__V1__WqOp *op, const void *data, size_t len,
		int wait_ms, struct wq_req *wr);

/* wqmsg.c: the reply handler's part for messages (lock held): a descriptor made, or a read's
 * bytes scattered. Return: 0 or -errno. */
int tpc_wq_msg_on_reply(struct tp_context *ctx, struct wq_req *wr, const Tpw__V1__WqReply *m,
			const uint8_t *tail, size_t tail_len);
/* At release: @q's descriptors outlive it. */
void tpc_wq_msg_orphan(struct tp_wq *q);

#endif
