/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One collective over a group's arena (group.h, common/grparena.h): the barrier (a futex word
 * every member and the daemon share), the call check that makes mismatched calls fail on every
 * member, and the chunked data paths. Each chunk uses one of two banks, alternating across
 * calls, so that writing the next chunk never races with a member still reading the last.
 * All-reduce: each member copies its chunk into its slot; after a barrier member r reduces
 * slice r of the chunk over every slot in rank order into the bank's result; after a second
 * barrier each member copies the result out. Every element is reduced in rank order 0..N-1 by
 * exactly one member, so results are bitwise identical everywhere. A small all-reduce takes
 * one barrier: every member folds every slot in that order itself (direct_call()). Queuing
 * calls and threads are group.c's.
 */
#include <errno.h>
#include <sched.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "group.h"
#include "internal.h"
#include "reduce.h"

struct coll_desc {
	uint64_t seq;
	uint32_t kind, dtype, op, root;
	uint64_t count;
	uint32_t pid;
	uint32_t valid;
	uint32_t absent; /* uneven steps: this member contributes nothing (not compared) */
	/* across hosts, local rank 0's (the host's leader) only: the verdict on the whole group's
	 * call that it hands the host's members (struct tpc_xverdict; not compared) */
	int32_t xerr;
	uint32_t xcontrib, xfield, xnodata;
	/* what this member's library can do (COLL_CAP_*; not compared: a library without a
	 * capability leaves it 0, and the others do without it) */
	uint32_t caps;
};

#define COLL_CAP_DIRECT 1u /* the one-barrier small all-reduce (direct_call()) */
#define COLL_CAP_SEG 2u	   /* asks for an all-reduce's first segment alone (tpc_coll.seg) */
#define COLL_CAP_XSEG 4u   /* takes a broadcast, all-gather or reduce-scatter across hosts in
			    * segments (tp_group.xseg_ask: in every call; collx.c) */
#define COLL_CAP_STEP 8u   /* an all-reduce's chunks after its first of ALLREDUCE_STEP bytes */
#define COLL_CAP_LFOLD 16u /* this call may run as a leader's fold (lfold_ask()) */

int tpc_coll_features_off(const char *v, uint32_t *ret_off)
{
	static const struct {
		const char *name;
		uint32_t cap;
	} names[] = { { "direct", COLL_CAP_DIRECT }, { "seg", COLL_CAP_SEG },
		      { "xseg", COLL_CAP_XSEG },     { "step", COLL_CAP_STEP },
		      { "lfold", COLL_CAP_LFOLD },   { "all", ~0u } };
	uint32_t off = 0;

	*ret_off = 0;
	while (v && *v) {
		size_t len = strcspn(v, ","), i;

		for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
			if (len == strlen(names[i].name) && !strncmp(v, names[i].name, len))
				break;
		if (len && i == sizeof(names) / sizeof(names[0]))
			return tpc_error(-EINVAL, "TP_GROUP_FEATURES_OFF: unknown feature '%.*s' "
					 "(known: direct, seg, xseg, step, lfold, all)",
					 (int)TPU_MIN(len, 40), v);
		if (len)
			off |= names[i].cap;
		v += len + (v[len] == ',');
	}
	*ret_off = off;
	return 0;
}

/* Bytes of a slot that one barrier of an all-reduce covers after its first chunk, when every
 * member's library can (COLL_CAP_STEP; the first chunk goes in before the members know, so it
 * fills the slot as before). A step's slots, results and slices, about 2.5 times this a member,
 * stay in the core's level-2 cache between a member writing them and another reading them;
 * whole 1 MiB slots did not (16 and 64 MiB of 2 and 4 members: 10 to 20 % less CPU a call for
 * 4 times the barriers; docs/benchmarks.md). */
#define ALLREDUCE_STEP (256u << 10)

_Static_assert(sizeof(struct coll_desc) <= TPU_GRPARENA_CALL, "a call descriptor fits its slot");

#define BARRIER_YIELDS 16 /* sched_yield()s before a barrier sleeps, members over the CPUs */
/* A barrier of members that fit the CPUs spins up to g->spin_ns (TPC_BARRIER_SPIN_MAX_NS at
 * most, BARRIER_SPIN_MIN_NS at least) before it sleeps: a wait that ends while spinning doubles
 * the budget, one that had to sleep for more than twice the most halves it (the others were
 * not on their way: another process holds their CPUs, or they compute), so a loaded machine
 * spins about as little as before (200 pauses). A futex sleep and wake cost tens of
 * microseconds, more than a whole small all-reduce. No spinning in a quiet period (ring.h). */
#define BARRIER_SPIN_MIN_NS 2000u

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static int group_failed(struct tp_group *g, char *msg, size_t ml)
{
	struct tpu_grparena_hdr *h = g->hdr;
	uint32_t why = __atomic_load_n(&h->fail_why, __ATOMIC_ACQUIRE);
	uint32_t rank = __atomic_load_n(&h->fail_rank, __ATOMIC_RELAXED);
	uint32_t pid = __atomic_load_n(&h->fail_pid, __ATOMIC_RELAXED);

	switch (why) {
	case TPU_GRPARENA_DIED:
		snprintf(msg, ml, "group '%s': rank %u (pid %u) died (its daemon session ended)",
			 g->name, rank, pid);
		return -ECONNRESET;
	case TPU_GRPARENA_LEFT:
		snprintf(msg, ml, "group '%s': rank %u (pid %u) left the group", g->name, rank, pid);
		return -EPIPE;
	case TPU_GRPARENA_ABORTED:
		snprintf(msg, ml, "group '%s': rank %u (pid %u) aborted the group", g->name, rank,
			 pid);
		return -EPIPE;
	case TPU_GRPARENA_TIMEOUT:
		snprintf(msg, ml, "group '%s': rank %u (pid %u) gave up waiting for the others "
			 "(op timeout)", g->name, rank, pid);
		return -ETIMEDOUT;
	case TPU_GRPARENA_HOST:
		snprintf(msg, ml, "group '%s': the daemons lost the peer link to rank %u's host "
			 "(tpipctl groups names it)", g->name, rank);
		return -ECONNRESET;
	case TPU_GRPARENA_XLINK:
		snprintf(msg, ml, "group '%s': rank %u (pid %u), its host's leader, lost its pipe to "
			 "another host's leader", g->name, rank, pid);
		return -ECONNRESET;
	case TPU_GRPARENA_LOST:
		snprintf(msg, ml, "group '%s': rank %u (pid %u) lost its daemon connection", g->name,
			 rank, pid);
		return -ECONNRESET;
	default:
		snprintf(msg, ml, "group '%s' failed", g->name);
		return -EPIPE;
	}
}

int tpc_coll_failed(struct tp_group *g, char *msg, size_t ml)
{
	return group_failed(g, msg, ml);
}

static int futex_wait(uint32_t *word, uint32_t val, const struct timespec *rel)
{
	if (syscall(SYS_futex, word, FUTEX_WAIT, val, rel, NULL, 0) < 0)
		return -errno;
	return 0;
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int barrier_sleep(struct tp_group *g, uint32_t gen, int64_t end, char *msg, size_t ml);

/* Waits until the generation moves past @gen. */
static int barrier_wait(struct tp_group *g, uint32_t gen, int timeout_ms, char *msg, size_t ml)
{
	uint32_t *w = &g->hdr->word;
	int64_t end = timeout_ms > 0 ? now_ms() + timeout_ms : 0;
	uint32_t v;
	int r;

	/* members that fit the CPUs spin; more members than CPUs yield a few times (the one that
	 * has not arrived may be waiting for this CPU) before they sleep */
	if (g->spin) {
		uint64_t t0 = tpu_now_ns();
		bool woke = g->woke, boost = woke && g->wake_spin_ns > g->spin_ns;
		uint64_t budget = boost ? g->wake_spin_ns : g->spin_ns, waited;

		g->woke = false;

		for (unsigned i = 1; !tpu_spin_quiet(t0); i++) { /* not on a busy machine (ring.h) */
			v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
			if ((v & TPU_GRPARENA_GEN) != gen) {
				g->spin_ns = TPU_MIN(2 * g->spin_ns, TPC_BARRIER_SPIN_MAX_NS);
				if (boost)
					g->wake_spin_ns = TPU_MIN(2 * g->wake_spin_ns,
								  TPC_BARRIER_WAKE_SPIN_NS);
				return 0;
			}
			if ((v & TPU_GRPARENA_FAILED) && !tpc_group_spared(g))
				return group_failed(g, msg, ml);
			cpu_relax();
			if (!(i & 63) && tpu_now_ns() - t0 >= budget)
				break;
		}
		r = barrier_sleep(g, gen, end, msg, ml);
		waited = tpu_now_ns() - t0;
		/* after a wake-up this member handed out: long enough to cover it next time, or,
		 * where the others came later than any spin should wait, a quarter */
		if (r == 0 && woke)
			g->wake_spin_ns = waited <= TPC_BARRIER_WAKE_SPIN_NS
						  ? TPU_MIN(2 * waited, TPC_BARRIER_WAKE_SPIN_NS)
						  : g->wake_spin_ns / 4;
		if (r == 0 && waited > 2 * TPC_BARRIER_SPIN_MAX_NS)
			g->spin_ns = TPU_MAX(g->spin_ns / 2, BARRIER_SPIN_MIN_NS);
		return r;
	}
	for (int i = BARRIER_YIELDS; i > 0; i--) {
		v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
		if ((v & TPU_GRPARENA_GEN) != gen)
			return 0;
		if ((v & TPU_GRPARENA_FAILED) && !tpc_group_spared(g))
			return group_failed(g, msg, ml);
		if (tpu_spin_quiet(tpu_now_ns()) || tpu_spin_pause()) {
			/* other threads hold the CPUs (ring.h): sleep, to be woken ahead */
			tpu_spin_contended(tpu_now_ns());
			break;
		}
	}
	return barrier_sleep(g, gen, end, msg, ml);
}

/* The sleeping half of barrier_wait(). */
static int barrier_sleep(struct tp_group *g, uint32_t gen, int64_t end, char *msg, size_t ml)
{
	uint32_t *w = &g->hdr->word;
	uint32_t v;

	for (;;) {
		struct timespec rel = { 0, 0 };
		int64_t left = 0;
		bool spared = false;

		v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
		if ((v & TPU_GRPARENA_GEN) != gen)
			return 0;
		if ((v & TPU_GRPARENA_FAILED) && !(spared = tpc_group_spared(g)))
			return group_failed(g, msg, ml);
		if (end) {
			left = end - now_ms();
			if (left <= 0) {
				tpu_grparena_fail(g->hdr, g->world_rank, (uint32_t)g->pid,
						  TPU_GRPARENA_TIMEOUT);
				return group_failed(g, msg, ml);
			}
			rel.tv_sec = left / 1000;
			rel.tv_nsec = (left % 1000) * 1000000;
		}
		if (spared && (!end || left > 50)) { /* a later failure may replace it unseen */
			rel.tv_sec = 0;
			rel.tv_nsec = 50 * 1000000L;
		}
		/* Counted before the last look at the word, which the last to arrive changes before
		 * it reads the count (both sequentially consistent): either it sees us and wakes, or
		 * we see the new generation and do not sleep. */
		__atomic_fetch_add(&g->hdr->sleepers, 1, __ATOMIC_SEQ_CST);
		if (__atomic_load_n(w, __ATOMIC_SEQ_CST) == v)
			futex_wait(w, v, end || spared ? &rel : NULL);
		__atomic_fetch_sub(&g->hdr->sleepers, 1, __ATOMIC_RELAXED);
	}
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int tpc_coll_barrier(struct tp_group *g, int timeout_ms, char *msg, size_t ml)
{
	struct tpu_grparena_hdr *h = g->hdr;
	uint32_t v = __atomic_load_n(&h->word, __ATOMIC_ACQUIRE), old, nv;

	if ((v & TPU_GRPARENA_FAILED) && !tpc_group_spared(g))
		return group_failed(g, msg, ml);
	if (__atomic_fetch_add(&h->count, 1, __ATOMIC_ACQ_REL) != g->size - 1) {
		uint64_t t0 = now_ns();
		int r = barrier_wait(g, v & TPU_GRPARENA_GEN, timeout_ms, msg, ml);

		g->wait_ns += now_ns() - t0;
		return r;
	}
	/* the last to arrive: reset the count, then open the next generation */
	__atomic_store_n(&h->count, 0, __ATOMIC_RELAXED);
	old = __atomic_load_n(&h->word, __ATOMIC_RELAXED);
	do
		nv = (old & TPU_GRPARENA_FAILED) | ((old + 1) & TPU_GRPARENA_GEN);
	while (!__atomic_compare_exchange_n(&h->word, &old, nv, false, __ATOMIC_SEQ_CST,
					    __ATOMIC_RELAXED));
	if (g->size > 1 && __atomic_load_n(&h->sleepers, __ATOMIC_SEQ_CST)) {
		tpu_grparena_wake(&h->word); /* a futex call costs about a microsecond */
		g->woke = g->small;
	}
	return 0;
}

/* ---- the arena's parts ---------------------------------------------------------------------- */

static struct coll_desc *desc_of(struct tp_group *g, uint64_t seq, uint32_t rank)
{
	return (struct coll_desc *)(g->base + tpu_grparena_calls_off() +
				    ((seq & 1) * g->size + rank) * TPU_GRPARENA_CALL);
}

static uint8_t *slot_of(struct tp_group *g, unsigned bank, uint32_t rank)
{
	return g->base + tpu_grparena_data_off(g->size) + ((uint64_t)bank * g->size + rank) * g->chunk;
}

static uint8_t *result_of(struct tp_group *g, unsigned bank)
{
	return g->base + tpu_grparena_data_off(g->size) + (2ull * g->size + bank) * g->chunk;
}

/* ---- the call check ------------------------------------------------------------------------ */

static const char *kind_name(uint32_t k)
{
	static const char *const names[] = { "?", "barrier", "allreduce", "broadcast",
					     "allgather", "reduce_scatter" };

	return k < TPU_ARRAY_SIZE(names) ? names[k] : "?";
}

static void desc_str(const struct coll_desc *d, char *buf, size_t len)
{
	snprintf(buf, len, "%s(dtype %u, op %u, %" PRIu64 " elements, root %u) as call %" PRIu64,
		 kind_name(d->kind), d->dtype, d->op, d->count, d->root, d->seq);
}

static bool desc_same(const struct coll_desc *a, const struct coll_desc *b)
{
	return a->seq == b->seq && a->kind == b->kind && a->dtype == b->dtype && a->op == b->op &&
	       a->count == b->count && a->root == b->root && a->valid == b->valid;
}

static bool all_can(struct tp_group *g, uint64_t seq, uint32_t cap);

/* After the first barrier of call @seq: every member compares every descriptor with rank 0's,
 * so that all of them find the same mismatch. */
static int desc_check(struct tp_group *g, uint64_t seq, char *msg, size_t ml)
{
	struct coll_desc d0 = *desc_of(g, seq, 0);

	if (g->x) /* what the next call across hosts may do */
		g->xseg = all_can(g, seq, COLL_CAP_XSEG);
	for (uint32_t r = 1; r < g->size; r++) {
		struct coll_desc dr = *desc_of(g, seq, r);
		char a[160], b[160];

		if (desc_same(&d0, &dr))
			continue;
		desc_str(&d0, a, sizeof(a));
		desc_str(&dr, b, sizeof(b));
		snprintf(msg, ml, "group '%s': mismatched collective: rank %u called %s, rank %u "
			 "called %s", g->name, tpc_group_world_rank(g, 0), a,
			 tpc_group_world_rank(g, r), b);
		return -EPROTO;
	}
	g->contrib = 0;
	for (uint32_t r = 0; r < g->size; r++) {
		g->absent[r] = __atomic_load_n(&desc_of(g, seq, r)->absent, __ATOMIC_RELAXED) != 0;
		g->contrib += !g->absent[r];
	}
	return 0;
}

/* ---- data paths ---------------------------------------------------------------------------- */

static void fold(const struct tpc_coll *c, void *acc, const void *in, size_t n)
{
	if (c->op == TPC_OP_USER)
		c->fn(acc, in, n, c->dtype, c->user);
	else
		tpc_reduce(acc, in, n, c->dtype, (enum tp_reduce_op)c->op);
}

static void copy_out(struct tp_group *g, const struct tpc_coll *c, uint8_t *dst, const uint8_t *src,
		     size_t n);

static bool has_view(const struct tpc_coll *c)
{
	return c->vsend.blk || c->vrecv.blk || c->vrecv.map || c->vrecv.stride;
}

/* Copies the call's elements [@lo, @lo + @n) between @base seen through @v and the contiguous
 * @lin: into the view (@out, with copy_out()) or out of it. Skipped blocks are left alone. */
static void view_copy(struct tp_group *g, const struct tpc_coll *c, const struct tpc_view *v,
		      uint8_t *base, uint8_t *lin, size_t lo, size_t n, bool out)
{
	size_t es = tp_dtype_size(c->dtype);

	if (!v->blk) {
		if (out)
			copy_out(g, c, base + lo * es, lin, n * es);
		else
			memcpy(lin, base + lo * es, n * es);
		return;
	}
	for (size_t e = lo; e < lo + n;) {
		size_t j = e / v->blk, i = e % v->blk;
		size_t len = TPU_MIN(v->blk - i, lo + n - e);
		uint32_t m = v->map ? v->map[j] : (uint32_t)j;

		if (m != TPC_VIEW_SKIP) {
			uint8_t *p = base + ((size_t)m * v->stride + i) * es;

			if (out)
				copy_out(g, c, p, lin + (e - lo) * es, len * es);
			else
				memcpy(lin + (e - lo) * es, p, len * es);
		}
		e += len;
	}
}

/* Member @r's part of a chunk from element @off on: this member's own from @mine, the others'
 * from their slots. */
static const uint8_t *part_of(struct tp_group *g, const struct tpc_coll *c, unsigned bank,
			      const uint8_t *mine, size_t off, uint32_t r)
{
	return r == g->rank ? mine : slot_of(g, bank, r) + off * tp_dtype_size(c->dtype);
}

/* Bytes of the result a built-in reduction folds at a time (reduce_range()): small enough that
 * the block is still in the level-1 cache when it is copied out. */
#define FOLD_BLOCK (16u << 10)

/* Reduces this member's slice (@off, @n elements) of the chunk at @done in rank order into
 * @dst: the other members' parts from their slots, its own straight from its input (only it
 * reads that part, so chunk_in() does not copy it into the slot). With @out, each block also
 * goes to this member's output as soon as it is folded, while it is in the cache, so the copy
 * out after the barrier only takes the others' slices (one pass over the slice saved, and the
 * slice's output written from the level-1 cache instead of the result bank). A user reduction
 * folds the slice in one call, as before. */
static void reduce_range(struct tp_group *g, const struct tpc_coll *c, unsigned bank,
			 size_t done, size_t off, size_t n, uint8_t *dst, bool out)
{
	size_t es = tp_dtype_size(c->dtype), blk = n;
	const uint8_t *mine = c->send ? (const uint8_t *)c->send + (done + off) * es : NULL;

	uint32_t first = 0;

	if (n == 0)
		return;
	if (c->vsend.blk) /* its input in blocks: the whole chunk went into its slot */
		mine = slot_of(g, bank, g->rank) + off * es;
	while (g->absent[first]) /* some member contributes (coll_run() checked) */
		first++;
	if (c->op != TPC_OP_USER && FOLD_BLOCK / es < n)
		blk = FOLD_BLOCK / es;
	for (size_t b = 0; b < n; b += blk) {
		size_t m = TPU_MIN(blk, n - b);
		uint8_t *acc = dst + b * es;
		uint32_t r = first + 1;

		while (r < g->size && g->absent[r])
			r++;
		if (c->op != TPC_OP_USER && r < g->size) { /* the first two in one pass */
			tpc_reduce3(acc, part_of(g, c, bank, mine, off, first) + b * es,
				    part_of(g, c, bank, mine, off, r) + b * es, m, c->dtype,
				    (enum tp_reduce_op)c->op);
			r++;
		} else {
			memcpy(acc, part_of(g, c, bank, mine, off, first) + b * es, m * es);
		}
		for (; r < g->size; r++)
			if (!g->absent[r])
				fold(c, acc, part_of(g, c, bank, mine, off, r) + b * es, m);
		if (out) /* after its input was read: in place, the output is the input */
			copy_out(g, c, (uint8_t *)c->recv + (done + off + b) * es, acc, m * es);
	}
}

/*
 * A small all-reduce (one chunk, at most TPU_GRPARENA_DIRECT_MAX bytes over all the slots): each
 * member copies its whole input into its slot, and after the one barrier every member that
 * takes the result folds all the slots in rank order straight into its output. Each member
 * reads N times the input instead of sharing the work, which below this size costs less than
 * the second barrier and the copy out that it saves. The fold order is the sliced path's, so
 * the bits are too.
 */
static bool direct_call(const struct tp_group *g, const struct tpc_coll *c)
{
	size_t es = tp_dtype_size(c->dtype);

	return c->kind == TPC_COLL_ALLREDUCE && c->count && !has_view(c) &&
	       c->count <= TPU_GRPARENA_DIRECT_MAX / es / g->size && c->count * es <= g->chunk;
}

/* After the first barrier of call @seq: whether every member's library has @cap (a member
 * whose library lacks one takes the path without it, so the others must too). */
static bool all_can(struct tp_group *g, uint64_t seq, uint32_t cap)
{
	for (uint32_t r = 0; r < g->size; r++)
		if (!(__atomic_load_n(&desc_of(g, seq, r)->caps, __ATOMIC_RELAXED) & cap))
			return false;
	return true;
}

/* The direct path's fold (direct_call()) of @n elements from the slots of @bank into @dst: its
 * own contribution from its slot too, not from its input, which @dst may be (in place). */
static void reduce_all(struct tp_group *g, const struct tpc_coll *c, unsigned bank, size_t n,
		       uint8_t *dst)
{
	uint32_t first = 0;

	while (g->absent[first]) /* some member contributes (coll_run() checked) */
		first++;
	memmove(dst, slot_of(g, bank, first), n * tp_dtype_size(c->dtype));
	for (uint32_t r = first + 1; r < g->size; r++)
		if (!g->absent[r])
			fold(c, dst, slot_of(g, bank, r), n);
}

/* Elements of this member's slice of a chunk of @n elements (slices start on 64 bytes). */
static void my_slice(struct tp_group *g, size_t n, size_t es, size_t *ret_off, size_t *ret_n)
{
	size_t align = 64 / es, per = (n + g->size - 1) / g->size, lo, hi;

	per = (per + align - 1) / align * align;
	lo = per * g->rank;
	hi = lo + per;
	lo = lo < n ? lo : n;
	hi = hi < n ? hi : n;
	*ret_off = lo;
	*ret_n = hi - lo;
}

/*
 * Whether this member offers to run all-reduce @c as a leader's fold: across hosts (only local
 * rank 0 takes the host's result, @c->leader_only) on a host of two members, the leader folds
 * every chunk whole, its own input with the other member's slot, straight into its output, and
 * the other member only copies its input into its slot. Against the sliced path that spares
 * the leader its input's copy into the slot and the copy of the other's slice out of the result
 * bank, and the other member its fold (one copy of the tensor less on the host, two fewer on
 * the leader's path); the elements are folded in the same order, so the bits are the same.
 * Every member of the call must offer (COLL_CAP_LFOLD, tpc_coll_local()): a member whose
 * library does not, a view, or a leader whose output is its input (the kernels' output may not
 * be their input) keeps the sliced path. The other member copies its whole input into its slot
 * whenever it offers (its own slice too, which only this path reads).
 */
static bool lfold_ask(const struct tp_group *g, const struct tpc_coll *c)
{
	return c->kind == TPC_COLL_ALLREDUCE && c->leader_only && g->size == 2 && !has_view(c) &&
	       (g->rank != 0 || c->send != c->recv) && !(g->caps_off & COLL_CAP_LFOLD);
}

/* One chunk's data goes in before the first barrier of a call (with the descriptor), so each
 * path below starts after its first chunk's input is in place: @first is that chunk. */
static void chunk_in(struct tp_group *g, const struct tpc_coll *c, size_t done, size_t n,
		     unsigned bank, bool direct)
{
	size_t es = tp_dtype_size(c->dtype);

	size_t off, k;

	switch (c->kind) {
	case TPC_COLL_ALLREDUCE: /* all but this member's own slice (reduce_range()) */
		if (c->absent)
			break;
		if (c->vsend.blk) { /* in blocks: all of it, its own slice too */
			view_copy(g, c, &c->vsend, (uint8_t *)c->send, slot_of(g, bank, g->rank),
				  done, n, false);
			break;
		}
		if (direct) { /* all of it: every member reads every slot (or, with a member
			       * whose library cannot, the sliced path reads what it needs) */
			memcpy(slot_of(g, bank, g->rank), c->send, n * es);
			break;
		}
		if (g->rank != 0 && lfold_ask(g, c)) { /* all of it: the leader may fold it */
			memcpy(slot_of(g, bank, g->rank), (const uint8_t *)c->send + done * es,
			       n * es);
			break;
		}
		my_slice(g, n, es, &off, &k);
		memcpy(slot_of(g, bank, g->rank), (const uint8_t *)c->send + done * es, off * es);
		memcpy(slot_of(g, bank, g->rank) + (off + k) * es,
		       (const uint8_t *)c->send + (done + off + k) * es, (n - off - k) * es);
		break;
	case TPC_COLL_ALLGATHER:
		memcpy(slot_of(g, bank, g->rank), (const uint8_t *)c->send + done * es, n * es);
		break;
	case TPC_COLL_BROADCAST:
		if ((uint32_t)c->root == g->rank)
			view_copy(g, c, &c->vrecv, c->recv, result_of(g, bank), done, n, false);
		break;
	case TPC_COLL_REDUCE_SCATTER:
		for (uint32_t r = 0; r < g->size; r++)
			memcpy(slot_of(g, bank, g->rank) + (size_t)r * n * es,
			       (const uint8_t *)c->send + (r * c->count + done) * es, n * es);
		break;
	case TPC_COLL_BARRIER:
		break;
	}
}

void tpc_coll_copy_result(const struct tp_group *g, size_t total, void *dst, const void *src,
			  size_t n)
{
	if (total >= g->stream_min)
		tpc_copy_stream(dst, src, n);
	else
		memcpy(dst, src, n);
}

/* A chunk of @c's result to this member's output (tpc_coll_copy_result()). */
static void copy_out(struct tp_group *g, const struct tpc_coll *c, uint8_t *dst, const uint8_t *src,
		     size_t n)
{
	tpc_coll_copy_result(g, c->total ? c->total : c->count * tp_dtype_size(c->dtype), dst, src,
			     n);
}

/* The rest of a chunk other than an all-reduce's (allreduce_chunks()) once its input is in
 * and the first barrier passed. */
static void chunk_out(struct tp_group *g, const struct tpc_coll *c, size_t done, size_t n,
		      unsigned bank)
{
	size_t es = tp_dtype_size(c->dtype);

	switch (c->kind) {
	case TPC_COLL_ALLREDUCE: /* allreduce_chunks() */
		break;
	case TPC_COLL_BROADCAST:
		if ((uint32_t)c->root != g->rank)
			view_copy(g, c, &c->vrecv, c->recv, result_of(g, bank), done, n, true);
		break;
	case TPC_COLL_ALLGATHER: /* member q's block at q x count, or where the view says */
		for (uint32_t q = 0; q < g->size && (!c->leader_only || g->rank == 0); q++) {
			size_t at = c->vrecv.map ? c->vrecv.map[q] : q;

			memcpy((uint8_t *)c->recv + (at * (c->vrecv.stride ? c->vrecv.stride :
							  c->count) + done) * es,
			       slot_of(g, bank, q), n * es);
		}
		break;
	case TPC_COLL_REDUCE_SCATTER: {
		uint8_t *dst = (uint8_t *)c->recv + done * es;

		memcpy(dst, slot_of(g, bank, 0) + (size_t)g->rank * n * es, n * es);
		for (uint32_t q = 1; q < g->size; q++)
			fold(c, dst, slot_of(g, bank, q) + (size_t)g->rank * n * es, n);
		break;
	}
	case TPC_COLL_BARRIER:
		break;
	}
}

/*
 * The sliced all-reduce of @n elements a chunk (the first chunk's input in), one barrier a
 * chunk: a member folds its slice of chunk k into the result and copies chunk k + 1 in (the
 * other bank) before the barrier, and copies chunk k's result out after it. What it writes
 * before a barrier was last read before the barrier ahead of it (the other bank's slots by
 * chunk k - 1's folds, this bank's result by chunk k - 2's copy out), so no member overwrites
 * what a slower one still reads.
 */
static int allreduce_chunks(struct tp_group *g, const struct tpc_coll *c, size_t per, size_t n,
			    bool lfold, char *msg, size_t ml)
{
	size_t es = tp_dtype_size(c->dtype), done = 0, off, k, next;
	bool out = !c->leader_only || g->rank == 0;
	/* an output seen through a view may overlap the input elsewhere: all of it after the
	 * barrier, as the input of the next chunk is in by then */
	bool early = out && !has_view(c);
	/* a host's leader whose members do not take the result (across hosts, part A): nobody
	 * else reads its slice of the result bank, so it folds the slice straight into its output,
	 * sparing the copy from the bank (not in place: the kernels' output may not be their
	 * input) */
	bool into_out = early && c->leader_only && c->send != c->recv;
	int r = 0;

	while (r == 0 && n) {
		unsigned bank = g->bank;

		g->bank ^= 1;
		if (lfold) { /* lfold_ask(): the leader folds the whole chunk, nobody copies out */
			if (g->rank == 0)
				reduce_range(g, c, bank, done, 0, n,
					     (uint8_t *)c->recv + done * es, false);
			next = c->count - done - n < per ? c->count - done - n : per;
			if (next && g->rank != 0)
				chunk_in(g, c, done + n, next, g->bank, false);
			r = tpc_coll_barrier(g, g->op_timeout_ms, msg, ml);
			done += n;
			n = next;
			continue;
		}
		my_slice(g, n, es, &off, &k);
		if (into_out)
			reduce_range(g, c, bank, done, off, k,
				     (uint8_t *)c->recv + (done + off) * es, false);
		else
			reduce_range(g, c, bank, done, off, k, result_of(g, bank) + off * es,
				     early);
		next = c->count - done - n < per ? c->count - done - n : per;
		if (next)
			chunk_in(g, c, done + n, next, g->bank, false);
		r = tpc_coll_barrier(g, g->op_timeout_ms, msg, ml);
		if (r == 0 && early) { /* its own slice is out already */
			copy_out(g, c, (uint8_t *)c->recv + done * es, result_of(g, bank), off * es);
			copy_out(g, c, (uint8_t *)c->recv + (done + off + k) * es,
				 result_of(g, bank) + (off + k) * es, (n - off - k) * es);
		} else if (r == 0 && out) {
			view_copy(g, c, &c->vrecv, c->recv, result_of(g, bank), done, n, true);
		}
		done += n;
		n = next;
	}
	return r;
}

/* Elements per chunk: what one slot holds (reduce-scatter: a slot holds size pieces). */
static size_t chunk_elems(struct tp_group *g, const struct tpc_coll *c)
{
	size_t es = tp_dtype_size(c->dtype), per = g->chunk / es;

	if (c->kind == TPC_COLL_REDUCE_SCATTER)
		per = g->chunk / g->size / es;
	return per ? per : 1;
}

/* This member's counters in the arena (tpipctl groups shows them). */
static void stats_add(struct tp_group *g, const struct tpc_coll *c, uint64_t busy)
{
	struct tpu_grparena_stats *st = (struct tpu_grparena_stats *)(g->base +
		tpu_grparena_stats_off(g->size)) + g->rank;
	size_t es = c->kind == TPC_COLL_BARRIER ? 0 : tp_dtype_size(c->dtype);
	size_t n = c->kind == TPC_COLL_REDUCE_SCATTER ? c->count * g->size : c->count;

	__atomic_store_n(&st->calls, st->calls + 1, __ATOMIC_RELAXED);
	__atomic_store_n(&st->bytes, st->bytes + n * es, __ATOMIC_RELAXED);
	__atomic_store_n(&st->busy_ns, st->busy_ns + busy, __ATOMIC_RELAXED);
	__atomic_store_n(&st->wait_ns, g->wait_ns, __ATOMIC_RELAXED);
	if (g->x)
		tpc_collx_stats(g->x, &st->xbytes_out, &st->xbytes_in, &st->xbusy_ns);
}

int tpc_coll_run(struct tp_group *g, const struct tpc_coll *c, char *msg, size_t ml)
{
	uint64_t t0 = now_ns();
	int r = g->x ? tpc_collx_run(g, c, msg, ml) : tpc_coll_local(g, c, NULL, msg, ml);

	stats_add(g, c, now_ns() - t0);
	return r;
}

/* After the first barrier of call @seq with a verdict: local rank 0's verdict into @v. */
static void verdict_read(struct tp_group *g, uint64_t seq, struct tpc_xverdict *v)
{
	const struct coll_desc *d0 = desc_of(g, seq, 0);

	v->err = d0->xerr;
	v->contrib = d0->xcontrib;
	v->field = d0->xfield;
	v->nodata = d0->xnodata;
}

/* A call of a member alone in its arena (a group of one, or the only member on its host): the
 * result is its input, moved at most once, with no slot or result bank in between (which took
 * two more copies of the tensor, and the broadcast of a leader's result to nobody a third). */
static void solo_call(const struct tpc_coll *c)
{
	size_t bytes = c->count * tp_dtype_size(c->dtype);

	switch (c->kind) {
	case TPC_COLL_ALLREDUCE:
	case TPC_COLL_ALLGATHER:
	case TPC_COLL_REDUCE_SCATTER: /* of one part */
		if (bytes && !c->absent && c->recv != c->send)
			memcpy(c->recv, c->send, bytes);
		break;
	case TPC_COLL_BROADCAST: /* its own root: the bytes are in place */
	case TPC_COLL_BARRIER:
		break;
	}
}

int tpc_coll_local(struct tp_group *g, const struct tpc_coll *c, struct tpc_xverdict *v,
		   char *msg, size_t ml)
{
	uint64_t seq = g->seq++;
	struct coll_desc *d = desc_of(g, seq, g->rank);
	size_t per = c->kind == TPC_COLL_BARRIER ? 1 : chunk_elems(g, c);
	size_t n = c->count < per ? c->count : per, done = 0;
	size_t step = c->kind == TPC_COLL_BARRIER ? 1 : ALLREDUCE_STEP / tp_dtype_size(c->dtype);
	bool direct = direct_call(g, c) && !(g->caps_off & COLL_CAP_DIRECT);
	bool solo = g->size == 1 && !c->seg && (!has_view(c) || c->kind == TPC_COLL_BROADCAST);
	bool lfold;
	int r;

	*d = (struct coll_desc){ .seq = seq, .kind = c->kind, .dtype = c->dtype, .op = c->op,
				 .root = (uint32_t)c->root, .count = c->dcount ? c->dcount : c->count,
				 .pid = (uint32_t)g->pid, .valid = 1, .absent = c->absent,
				 .caps = COLL_CAP_DIRECT | COLL_CAP_STEP |
					 (c->seg ? COLL_CAP_SEG : 0) |
					 (g->xseg_ask ? COLL_CAP_XSEG : 0) |
					 (lfold_ask(g, c) ? COLL_CAP_LFOLD : 0) };
	d->caps &= ~g->caps_off; /* TP_GROUP_FEATURES_OFF: as a library without them */
	if (v && g->rank == 0) {
		d->xerr = v->err;
		d->xcontrib = v->contrib;
		d->xfield = v->field;
		d->xnodata = v->nodata;
	}
	if (n && !solo)
		chunk_in(g, c, 0, n, g->bank, direct);
	g->small = direct || c->kind == TPC_COLL_BARRIER;
	r = tpc_coll_barrier(g, g->op_timeout_ms, msg, ml);
	g->small = false;
	if (r == 0)
		r = desc_check(g, seq, msg, ml);
	if (r == 0 && v) {
		verdict_read(g, seq, v);
		if (v->err < 0)
			return v->err; /* the caller says why */
		if (v->nodata)
			n = 0;
	}
	if (r == 0 && c->ret_contrib)
		*c->ret_contrib = g->contrib;
	if (g->contrib == 0) /* every member has finished (uneven steps): nothing to reduce */
		n = 0;
	if (r == 0 && solo) {
		if (n)
			solo_call(c);
		return 0;
	}
	lfold = r == 0 && lfold_ask(g, c) && all_can(g, seq, COLL_CAP_LFOLD);
	if (r == 0 && n && direct && all_can(g, seq, COLL_CAP_DIRECT)) {
		unsigned bank = g->bank;

		g->bank ^= 1;
		if (!c->leader_only || g->rank == 0)
			reduce_all(g, c, bank, n, c->recv);
		return 0;
	}
	if (r == 0 && c->kind == TPC_COLL_ALLREDUCE && per > step && all_can(g, seq, COLL_CAP_STEP))
		per = step; /* the chunks after the first */
	if (r == 0 && c->kind == TPC_COLL_ALLREDUCE && c->seg && c->seg < c->count) {
		/* the first segment alone when every member takes the call in segments (each
		 * checked the whole count above); the first chunk is in its slot already */
		struct tpc_coll s = *c;

		*c->ret_seg = all_can(g, seq, COLL_CAP_SEG);
		if (*c->ret_seg) {
			s.count = c->seg;
			n = n < s.count ? n : s.count;
		}
		return allreduce_chunks(g, &s, per, n, lfold, msg, ml);
	}
	if (r == 0 && c->kind == TPC_COLL_ALLREDUCE)
		return allreduce_chunks(g, c, per, n, lfold, msg, ml);
	while (r == 0 && n) {
		unsigned bank = g->bank;

		g->bank ^= 1;
		chunk_out(g, c, done, n, bank);
		done += n;
		n = c->count - done < per ? c->count - done : per;
		if (n == 0)
			break;
		chunk_in(g, c, done, n, g->bank, false);
		r = tpc_coll_barrier(g, g->op_timeout_ms, msg, ml);
	}
	return r;
}
