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
#define TPC_BARRIER_SPIN_MAX_NS 50000u /* the longest a barrier spins (coll.c) */
#define TPC_BARRIER_WAKE_SPIN_NS 1000000u /* ... the wait after one that woke a sleeper */

enum tpc_coll_kind {
	TPC_COLL_BARRIER = 1,
	TPC_COLL_ALLREDUCE = 2,
	TPC_COLL_BROADCAST = 3,
	TPC_COLL_ALLGATHER = 4,
	TPC_COLL_REDUCE_SCATTER = 5,
};

#define TPC_OP_USER 0xffu /* the call's reduction is a tp_reduce_fn */

/*
 * A call's buffer seen in blocks (collx.c's segments of a broadcast, all-gather or
 * reduce-scatter across hosts): the call's elements are blocks of @blk elements, block j at
 * element @map[j] x @stride of the buffer (@map NULL: j x @stride; an entry TPC_VIEW_SKIP: a
 * block this member neither reads nor writes). @blk 0: the buffer is contiguous. An
 * all-gather's receive view places member q's block (of the call's count) at @map[q] x
 * @stride and ignores @blk.
 */
struct tpc_view {
	size_t blk, stride;
	const uint32_t *map;
};

#define TPC_VIEW_SKIP UINT32_MAX

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
	tp_reduce_cuda_fn cuda_fn; /* tp_allreduce_cuda_fn() (op TPC_OP_USER, @fn NULL) */
	int root;
	bool absent;		 /* tp_allreduce_uneven() with send NULL: contributes nothing */
	bool leader_only;	 /* all-reduce: only local rank 0 takes the result (across hosts) */
	unsigned *ret_contrib; /* tp_allreduce_uneven(): members that contributed */
	/* all-reduce in segments (collx.c): when every member's library can (COLL_CAP_SEG), only
	 * the first @seg elements of the @count the call descriptor carries are reduced, and
	 * *@ret_seg says so (false: all @count were); 0: the whole call */
	size_t seg;
	bool *ret_seg;
	size_t total; /* bytes of the whole user call, which decide non-temporal copies (0: this
		       * call's count x dtype size) */
	/* a segment of a call across hosts (collx.c, run_segx()): the count its call descriptor
	 * carries when not @count (the first segment says the whole call's, so that the members'
	 * check is the whole call's); the views of @send (all-reduce) and @recv (all-reduce,
	 * all-gather, broadcast: the root reads it, the others write it) */
	size_t dcount;
	struct tpc_view vsend, vrecv;
	/* the group's collective options when the call was made (tp_group_set_coll_options()):
	 * CUDA buffers are staged through host memory (group.c) */
	bool cuda;
	int cuda_device;
	void *cuda_stream;
};

/* What a host's leader tells its members of a call across hosts (in its call descriptor). */
struct tpc_xverdict {
	int32_t err;	  /* 0, or the call's -errno on every rank */
	uint32_t contrib; /* members of the whole group that contributed (uneven steps) */
	uint32_t field;	  /* -EPROTO: the first argument the hosts disagree on (collx.c) */
	uint32_t nodata;  /* nothing to hand out (every member has finished: uneven steps) */
};

struct tpc_collx; /* collx.c: the part of a group that spans several hosts */

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
	/* the executor's: how long a barrier spins before it sleeps (members that fit the CPUs),
	 * adapted to how long barriers took (coll.c, barrier_wait()) */
	uint64_t spin_ns;
	/* this member, the last to arrive at the one barrier of a small call (a barrier, a direct
	 * all-reduce: @small), woke a member that slept there (@woke): that member comes late to
	 * the next one, a futex wake-up late, so this one's next wait spins up to @wake_spin_ns
	 * rather than sleep before it comes and have to wake it in turn, over and over (two
	 * members each waking the other, each call a wake-up long). @wake_spin_ns adapts: doubled
	 * (up to TPC_BARRIER_WAKE_SPIN_NS) when such a wait ends while spinning; when it sleeps,
	 * twice what it waited where that was within TPC_BARRIER_WAKE_SPIN_NS, else a quarter, so
	 * that members whose calls come unevenly (one computes longer) soon stop spinning for
	 * them (no boost once it is within @spin_ns) (coll.c) */
	bool small, woke;
	uint64_t wake_spin_ns;
	/* an all-reduce or broadcast result of at least this many bytes is copied out with
	 * non-temporal stores (the members' inputs and outputs together outgrow the last-level
	 * cache, so each output line would be read from memory only to be overwritten) */
	size_t stream_min;
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
	struct tpc_collx *x; /* hosts > 1 (set at join, fixed afterwards) */
	/* the group's remote access (tp_group_options.remote): also whom the hosts' leaders'
	 * listener takes pipes from (collx.c) */
	enum tp_remote_access remote;
	char **remote_peers;
	size_t n_remote_peers;
	/* the caller's (tp_group_set_coll_options()): where later calls' buffers live */
	struct tp_device cdev;
	void *cstream;
	/* the executor's: host memory CUDA buffers are staged through, kept for the next call */
	uint8_t *stage;
	size_t stage_len;
	uint64_t xcall;	     /* the executor's: the number of the last call across hosts */
	/* across hosts: this member takes a broadcast, all-gather or reduce-scatter in segments
	 * (it says so in every call descriptor: COLL_CAP_XSEG), and every member of this host
	 * said so in the last call (the executor's; the same on every member of the host) */
	bool xseg_ask, xseg;
	/* capabilities this member's library does not offer in its call descriptors
	 * (TP_GROUP_FEATURES_OFF, tpc_coll_features_off()): the group does without them */
	uint32_t caps_off;
};

/*
 * tpc_coll_features_off() - parses @v, TP_GROUP_FEATURES_OFF: names of the collectives'
 * algorithm features this member's library is not to offer, separated by ',' (direct, seg,
 * step, lfold, xseg; "all"; empty or NULL: none). The members of a group agree call by call
 * on what every one of them offers, so a member that offers less keeps the group on the paths
 * without it: an override to work around one path and to test members of other versions.
 * Return: 0 and the capability bits in *@ret_off; -EINVAL naming an unknown word (tpc_error()).
 */
int tpc_coll_features_off(const char *v, uint32_t *ret_off);

/* tpc_group_world_rank() - the rank in the whole group of this host's member @local. */
uint32_t tpc_group_world_rank(const struct tp_group *g, uint32_t local);

/*
 * tpc_group_spared() - @g's arena failed only by a member that left after the cross-host call
 * now running (tpu_grparena_leave_after()): that call still completes. Borrows @g.
 */
static inline bool tpc_group_spared(const struct tp_group *g)
{
	const struct tpu_grparena_hdr *h = g->hdr;
	uint64_t after;

	if (!g->x || __atomic_load_n(&h->fail_why, __ATOMIC_ACQUIRE) != TPU_GRPARENA_LEFT)
		return false;
	after = __atomic_load_n(&h->fail_after, __ATOMIC_ACQUIRE);
	return after && g->xcall && g->xcall <= after;
}

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
 * tpc_coll_local() - run @c among this host's members over the arena. With @v, local rank 0's
 * verdict @v (its input) reaches every member (@v, output) after the first barrier; a verdict
 * with an error ends the call there with that error and @msg untouched. Called by the one
 * executor of @g at a time. Borrows everything. Return: 0 or -errno (@msg filled but for a
 * verdict's error).
 */
int tpc_coll_local(struct tp_group *g, const struct tpc_coll *c, struct tpc_xverdict *v,
		   char *msg, size_t ml);

/*
 * tpc_collx_new() - the cross-host part of @g from the daemon's answer: each rank's host
 * (@member_hosts, @n = the group's size), each host's daemon address (@addrs, @naddrs = hosts;
 * none from an older coordinator: collectives then fail with -EOPNOTSUPP) and the token the
 * leaders prove to each other. Borrows everything; @ret: returns owned, free with
 * tpc_collx_free(). Return: 0, -EPROTO (an answer that does not add up), -ENOMEM.
 */
int tpc_collx_new(struct tp_group *g, const uint32_t *member_hosts, size_t n,
		  char *const *addrs, size_t naddrs, const uint8_t *token, size_t tlen,
		  struct tpc_collx **ret);

/*
 * tpc_collx_connect() - on a host's leader (local rank 0): open the pipes to the other hosts'
 * leaders that the schedules use (the lower host index dials, through the daemons), each end
 * proving the group's token, within @timeout_ms. Others: nothing. Return: 0 or -errno with
 * @msg filled.
 */
int tpc_collx_connect(struct tp_group *g, int timeout_ms, char *msg, size_t ml);

/* tpc_collx_stats() - stores @x's counters (bytes to and from the other leaders, ns spent on
 * the exchange) into the member's stats in the arena. */
void tpc_collx_stats(const struct tpc_collx *x, uint64_t *out, uint64_t *in, uint64_t *ns);

/* tpc_collx_free() - closes the leader's pipes and frees @x (takes it; NULL accepted). */
void tpc_collx_free(struct tpc_collx *x);

/*
 * tpc_collx_run() - run @c over every host: this host's part over the arena, the leaders'
 * exchange over their pipes (a check that every host makes the same call, then the data),
 * then the result to this host's members over the arena. Borrows everything. Return: 0 or
 * -errno with @msg filled.
 */
int tpc_collx_run(struct tp_group *g, const struct tpc_coll *c, char *msg, size_t ml);

/*
 * tpc_coll_copy_result() - copies @n bytes of a result of @total bytes (all of the call's) from
 * @src to a member's output @dst: with non-temporal stores from @g->stream_min bytes on, else
 * memcpy. Borrows everything.
 */
void tpc_coll_copy_result(const struct tp_group *g, size_t total, void *dst, const void *src,
			  size_t n);

/* tpc_coll_failed() - @g's arena failed: the error and, in @msg, who broke it and how. */
int tpc_coll_failed(struct tp_group *g, char *msg, size_t ml);

/*
 * tpc_coll_barrier() - the arena barrier of @g, waiting at most @timeout_ms (<= 0: no limit);
 * a timeout fails the group for everyone. Return: 0, or -errno with @msg filled.
 */
int tpc_coll_barrier(struct tp_group *g, int timeout_ms, char *msg, size_t ml);

#endif
