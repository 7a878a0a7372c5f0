/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The plan of a group across hosts, as pure functions (no I/O, no daemon, no threads): which
 * members share a host (by the daemons' host identity, never by address or rank arithmetic),
 * each member's local rank and host index, one leader per host, the algorithm among the leaders
 * chosen by size (recursive doubling for small tensors, ring reduce-scatter + all-gather for
 * large ones; overridable), and each leader's schedule of steps: whom it sends which segment
 * to, whom it receives from, and whether what arrives is folded or copied. Moving the bytes is
 * not done here. Internal to libtpclient: names tpc_plan_.
 */
#ifndef TPC_PLAN_H
#define TPC_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TPC_PLAN_RANKS_MAX 65536u	     /* members of one plan */
#define TPC_PLAN_RING_MIN (256u * 1024u)     /* bytes from which AUTO picks the ring */
/* An all-reduce (broadcast: its tensor; all-gather: its output; reduce-scatter: its input) of
 * at least TPC_PLAN_SEG_MIN bytes runs pipelined in segments of TPC_PLAN_SEG bytes (collx.c): a
 * host's part of one segment overlaps the leaders' exchange of another. */
#define TPC_PLAN_SEG_MIN (8u << 20)
#define TPC_PLAN_SEG (4u << 20)
#define TPC_PLAN_ALIGN 64u		     /* segments start on this many bytes */

enum tpc_plan_algo {
	TPC_PLAN_AUTO = 0, /* by size: RD below TPC_PLAN_RING_MIN bytes, RING from there */
	TPC_PLAN_RING = 1, /* ring reduce-scatter then ring all-gather among the leaders */
	TPC_PLAN_RD = 2,   /* recursive doubling (non-powers of two fold the extra hosts in) */
	TPC_PLAN_NONE = 3, /* one host: nothing crosses hosts */
};

/* What a leader does with the data of a step that it receives. */
enum tpc_plan_recv {
	TPC_PLAN_RECV_NONE = 0,
	TPC_PLAN_COPY = 1,	/* it replaces the leader's segments */
	TPC_PLAN_FOLD_LEFT = 2, /* mine = received op mine (the received value comes first) */
	TPC_PLAN_FOLD_RIGHT = 3 /* mine = mine op received */
};

/*
 * One step of one leader. Segments are [seg, seg + nseg) of the plan's nhosts segments (ring:
 * one; recursive doubling: all). Sends and receives of a step run at once; a step ends when
 * both are done. A host that sits a step out has neither (to/from -1).
 */
struct tpc_plan_step {
	int32_t send_to, recv_from; /* host indices, or -1 */
	uint32_t send_seg, send_nseg;
	uint32_t recv_seg, recv_nseg;
	enum tpc_plan_recv recv;
};

struct tpc_plan {
	uint32_t nranks, nhosts;
	uint32_t *host_of;    /* [nranks]: host index of each rank */
	uint32_t *local_rank; /* [nranks]: rank among the members of its host */
	uint32_t *host_first; /* [nhosts + 1]: host h's members are by_host[first[h]..first[h+1]) */
	uint32_t *by_host;    /* [nranks]: ranks by host, ascending within a host */
};

/*
 * tpc_plan_build() - group @nranks members by @host_ids[rank] (the identity of the daemon each
 * member joined through). Hosts are numbered in the order of their lowest rank, so host 0 holds
 * rank 0; a host's leader is its lowest rank. Borrows @host_ids. @ret: returns an owned plan,
 * free with tpc_plan_free(). Return: 0, -EINVAL (no member, or over TPC_PLAN_RANKS_MAX),
 * -ENOMEM.
 */
int tpc_plan_build(const uint64_t *host_ids, uint32_t nranks, struct tpc_plan **ret);

/* tpc_plan_free() - frees @p (takes @p; NULL is accepted). */
void tpc_plan_free(struct tpc_plan *p);

/* tpc_plan_leader() - the leader (lowest rank) of host @h < nhosts. Borrows @p. */
uint32_t tpc_plan_leader(const struct tpc_plan *p, uint32_t h);

/* tpc_plan_local_size() - members of host @h < nhosts. Borrows @p. */
uint32_t tpc_plan_local_size(const struct tpc_plan *p, uint32_t h);

/*
 * tpc_plan_choose() - the algorithm among @nhosts leaders for a collective of @bytes: @force
 * when it is not AUTO, else RD below TPC_PLAN_RING_MIN and RING from there; NONE for one host.
 * Return: the algorithm.
 */
enum tpc_plan_algo tpc_plan_choose(uint32_t nhosts, uint64_t bytes, enum tpc_plan_algo force);

/*
 * tpc_plan_algo_parse() - "auto", "ring" or "rd" (also "tree": recursive doubling) as in the
 * TP_GROUP_ALGO variable. Borrows @s. Return: 0 with @ret set, or -EINVAL.
 */
int tpc_plan_algo_parse(const char *s, enum tpc_plan_algo *ret);

/* tpc_plan_algo_name() - "ring", "recursive-doubling", "auto" or "none". */
const char *tpc_plan_algo_name(enum tpc_plan_algo a);

/* tpc_plan_nsteps() - steps of @algo among @nhosts leaders (the same for every leader). */
uint32_t tpc_plan_nsteps(uint32_t nhosts, enum tpc_plan_algo algo);

/*
 * tpc_plan_steps() - the schedule of leader @host (< @nhosts) under @algo (RING or RD) into
 * @steps, which has room for tpc_plan_nsteps() entries. Borrows @steps. Return: the number of
 * steps written, or -EINVAL (@host out of range, AUTO or NONE with more than one host).
 */
int tpc_plan_steps(uint32_t nhosts, enum tpc_plan_algo algo, uint32_t host,
		   struct tpc_plan_step *steps);

/*
 * tpc_plan_segment() - elements [*@ret_off, *@ret_off + *@ret_n) of segment @seg of @count
 * elements of @es bytes cut in @nseg segments, each starting on TPC_PLAN_ALIGN bytes where @es
 * divides it (trailing segments may be empty).
 */
void tpc_plan_segment(size_t count, size_t es, uint32_t nseg, uint32_t seg, size_t *ret_off,
		      size_t *ret_n);

/*
 * tpc_plan_xseg() - elements per rank of one segment of a broadcast (@nblocks 1), all-gather
 * or reduce-scatter (@nblocks: the group's size) pipelined across hosts: TPC_PLAN_SEG bytes
 * over the @nblocks blocks of @es-byte elements that a segment spans, at least 1. Segment k
 * is elements [k x it, (k + 1) x it) of each rank's count (the last one shorter), the same on
 * every host. Return: the elements.
 */
size_t tpc_plan_xseg(size_t es, uint32_t nblocks);

/*
 * tpc_plan_piece() - the byte offset of member @i (< its local size) of host @h's piece of a
 * segment starting at element @off of a tensor of @count elements of @es bytes per rank, in
 * rank order: (rank x @count + @off) x @es. Borrows @p. Return: the offset.
 */
size_t tpc_plan_piece(const struct tpc_plan *p, uint32_t h, uint32_t i, size_t count, size_t off,
		      size_t es);

/*
 * tpc_plan_describe() - one line for tpipctl and logs: hosts, members per host, leaders, and
 * the algorithm by size ("3 hosts (members 4,4,2; leaders 0,1,5); across hosts:
 * recursive-doubling below 262144 bytes (3 steps), ring from there (4 steps); collectives from
 * 8388608 bytes pipelined in 4194304-byte segments where the members ask"), or what @force
 * fixes. Lists of more than 8 hosts end in ",...". Borrows @p and @buf.
 * Return: the length snprintf() reports (>= @len: truncated).
 */
int tpc_plan_describe(const struct tpc_plan *p, enum tpc_plan_algo force, char *buf, size_t len);

/*
 * Running one leader's schedule (planrun.c) over a transport the caller supplies: the peer
 * links between daemons in a group, threads with queues in the unit suite.
 */
#define TPC_PLAN_DEPTH 4 /* exchanges a run keeps started at once */

struct tpc_plan_xport_ops {
	/*
	 * Starts sending @slen bytes of @sbuf to leader @to and receiving @rlen bytes from
	 * leader @from into @rbuf (either may be -1: none). Keeps the buffers until the wait that
	 * ends this exchange. At most TPC_PLAN_DEPTH are started and not yet waited for.
	 * Return: 0 (started: wait() will end it) or -errno (not started; the run stops).
	 */
	int (*start)(void *t, int32_t to, const void *sbuf, size_t slen, int32_t from, void *rbuf,
		     size_t rlen);
	/* Waits for the oldest started exchange to end. Return: 0 or -errno (the run stops). */
	int (*wait)(void *t);
};

/* A built-in reduction (op 1..4 of enum tp_reduce_op) or a user one (fn, user). */
typedef void (*tpc_plan_fold_fn)(void *inout, const void *in, size_t count, int dtype,
				 void *user);

struct tpc_plan_run_args {
	uint32_t nhosts, host;
	enum tpc_plan_algo algo; /* RING or RD (NONE: nothing to do) */
	void *buf;		 /* this host's partial result in, the group's result out */
	size_t count, es;	 /* elements of es bytes */
	size_t chunk;		 /* bytes per exchange (pipelining); 0: whole segments */
	void *scratch;		 /* count * es bytes the run receives what it folds into (what
				  * a step copies lands straight in @buf) */
	tpc_plan_fold_fn fold;	 /* inout = inout op in */
	/* inout = in op inout, or NULL: a step that folds the received value first folds into
	 * @scratch and copies the result back (one more pass over what it folds) */
	tpc_plan_fold_fn fold_left;
	int dtype;
	void *user;
	const struct tpc_plan_xport_ops *ops;
	void *t;
	/*
	 * In segments (0: one, the whole tensor): the schedule runs over each @seg elements of the
	 * tensor in turn (the last segment shorter), as if each were a tensor of its own, with no
	 * drain between them: the first exchanges of segment k + 1 start while the last of k are
	 * on the wire. Before segment k's first exchange the run calls @ready with the end of
	 * segment k in elements (without @wait: 1 when @buf holds this host's part up to there,
	 * else 0, and the run lands what it has in flight before it asks again with @wait, when
	 * @ready returns 1 once @buf does; -errno stops the run), and once every exchange of
	 * segment k has landed, @done with that end (@buf holds the result up to there). Either
	 * may be NULL.
	 */
	size_t seg;
	int (*ready)(void *t, size_t end, bool wait);
	void (*done)(void *t, size_t end);
};

/*
 * tpc_plan_run() - run leader @a->host's schedule: every exchange, in chunks of @a->chunk
 * bytes (whole elements), folding or copying as each step says, TPC_PLAN_DEPTH exchanges
 * started at once, across steps too: an exchange starts once nothing in flight would still
 * land where it sends from or receives into (a ring's step t + 1 sends chunk k once step t's
 * chunk k is folded; a recursive-doubling step, which sends what the last one received, waits
 * for all of it), and a copy, received in place, once nothing in flight still sends from where
 * it lands. On an error every started exchange is waited for before the return. @a->buf and
 * @a->scratch are aligned to @a->es (the kernels load whole elements). Borrows everything in
 * @a for the call. Return: 0 (@a->buf holds the result, bitwise the same on every leader), -EINVAL
 * (bad arguments), or the transport's -errno.
 */
int tpc_plan_run(const struct tpc_plan_run_args *a);


#endif
