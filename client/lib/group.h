/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libtpclient groups, shared by group.c (joining, leaving, queries, the queue of collectives
 * and its thread) and coll.c (running one collective over the arena). Internal: names tpc_.
 */
#ifndef TPC_GROUP_H
#define TPC_GROUP_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "grparena.h"
#include "validate.h"
#include "tpclient.h"
#include "tpu.h"

#define TPC_GROUP_MSG_MAX 512

enum tpc_coll_kind {
	TPC_COLL_BARRIER = 1,
	TPC_COLL_ALLREDUCE = 2,
	TPC_COLL_BROADCAST = 3,
	TPC_COLL_ALLGATHER = 4,
	TPC_COLL_REDUCE_SCATTER = 5,
};

#define TPC_OP_USER 0xffu /* the call's reduction is a tp_reduce_fn */

/* One collective call, as the caller made it (buffers borrowed until it ends). */
struct tpc_coll {
	enum tpc_coll_kind kind;
	const void *send;
	void *recv;
	size_t count;
	enum tp_dtype dtype;
	unsigned op; /* enum tp_reduce_op, or TPC_OP_USER */
	tp_reduce_fn fn;
	void *user;
	int root;
	bool absent;		 /* tp_allreduce_uneven() with send NULL: contributes nothing */
	unsigned *ret_contrib; /* tp_allreduce_uneven(): members that contributed */
};

struct tp_group {
	struct tp_context *ctx;
	struct tpu_list ctx_node; /* ctx->groups (ctx->lock) */
	char name[TPW_GROUP_NAME_MAX + 1];
	uint64_t id;
	/* rank and size: in the arena, this host's members (the whole group on one host) */
	uint32_t rank, size, local_rank, local_size, host_index, hosts;
	uint32_t world_rank, world_size; /* in the whole group (tp_group_rank(), _size()) */
	uint64_t arena_bytes, chunk;
	uint8_t *base;
	struct tpu_grparena_hdr *hdr;
	int op_timeout_ms;
	bool spin; /* members fit the CPUs: spin briefly before sleeping in a barrier */
	pid_t pid;
	/* the executor's (one collective runs at a time: busy) */
	uint64_t seq;  /* calls made */
	unsigned bank; /* data bank of the next chunk (0, 1), the same on every member */
	uint64_t wait_ns; /* time waiting in barriers, all calls */
	bool *absent;	  /* per rank, the running call: contributes nothing (uneven steps) */
	unsigned contrib; /* members contributing to the running call */
	/* lock */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct tpu_list queue; /* struct tp_coll_req, call order */
	bool busy;
	bool stop;
	bool thread_up;
	pthread_t thread;
	int lost_err; /* a request freed unwaited failed */
};

struct tp_coll_req {
	struct tpu_list node;
	struct tp_group *g;
	struct tpc_coll c;
	bool done;
	bool orphan; /* tp_coll_free()d before it ended: the executor frees it */
	int status;
	char msg[TPC_GROUP_MSG_MAX];
};

/*
 * tpc_coll_run() - run @c on @g over the arena: the call check, then the chunks. Called by the
 * one executor of @g at a time. Borrows everything. Return: 0 or -errno with @msg filled.
 */
int tpc_coll_run(struct tp_group *g, const struct tpc_coll *c, char *msg, size_t ml);

/*
 * tpc_coll_barrier() - the arena barrier of @g, waiting at most @timeout_ms (<= 0: no limit);
 * a timeout fails the group for everyone. Return: 0, or -errno with @msg filled.
 */
int tpc_coll_barrier(struct tp_group *g, int timeout_ms, char *msg, size_t ml);

#endif
