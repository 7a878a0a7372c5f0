/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests of the cross-host plan (client/lib/plan.c), without processes: members group by
 * host identity whatever the rank order (200 ranks over 25 hosts), leaders and local ranks
 * follow, the algorithm follows size and the override, and both schedules (ring and recursive
 * doubling, 1 to 40 hosts) are simulated on symbolic values: every leader ends with every
 * segment folded from every host exactly once, in the same order as every other leader, sends
 * and receives pair up, and the ring moves 2(H-1)/H of the tensor per leader. Limits are tried
 * just below and above. The executor (planrun.c) runs the schedules with one thread per
 * leader over in-memory queues: results are bitwise identical on every leader and right, in
 * any chunking; a 200-rank all-reduce over 25 hosts (local folds, leaders, copy-out) is exact
 * and identical on every rank; a leader whose transport fails makes every leader return an error.
 */
#include <check.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include "plan.h"
#include "reduce.h"

#define SIM_HOSTS 64

/* One leader's value of one segment: the hosts folded into it, in fold order. */
struct sym {
	uint32_t n;
	uint8_t who[SIM_HOSTS];
};

static uint64_t host_id_of(uint32_t rank, uint32_t hosts)
{
	/* interleaved (rank 0 on host A, rank 1 on host B, ...) and far-apart identities */
	return 0x5eed000000000000ull + ((rank * 7u) % hosts) * 0x9e3779b97f4a7c15ull;
}

START_TEST(test_plan_200_ranks_over_25_hosts_group_by_host_identity)
{
	uint64_t ids[200];
	struct tpc_plan *p = NULL;

	for (uint32_t r = 0; r < 200; r++)
		ids[r] = host_id_of(r, 25);
	ck_assert_int_eq(tpc_plan_build(ids, 200, &p), 0);
	ck_assert_uint_eq(p->nranks, 200);
	ck_assert_uint_eq(p->nhosts, 25);
	ck_assert_uint_eq(p->host_of[0], 0);
	for (uint32_t h = 0; h < 25; h++) {
		uint32_t lead = tpc_plan_leader(p, h);

		ck_assert_uint_eq(tpc_plan_local_size(p, h), 8);
		ck_assert_uint_eq(p->host_of[lead], h);
		ck_assert_uint_eq(p->local_rank[lead], 0);
		if (h > 0) /* hosts are numbered by their lowest rank */
			ck_assert_uint_lt(tpc_plan_leader(p, h - 1), lead);
		for (uint32_t j = 0; j < 8; j++) {
			uint32_t r = p->by_host[p->host_first[h] + j];

			ck_assert_uint_eq(p->host_of[r], h);
			ck_assert_uint_eq(p->local_rank[r], j);
			ck_assert(ids[r] == ids[lead]);
			if (j > 0)
				ck_assert_uint_lt(p->by_host[p->host_first[h] + j - 1], r);
		}
	}
	for (uint32_t r = 0; r < 200; r++)
		for (uint32_t s = 0; s < 200; s++)
			ck_assert((p->host_of[r] == p->host_of[s]) == (ids[r] == ids[s]));
	tpc_plan_free(p);
}
END_TEST

START_TEST(test_plan_uneven_hosts_and_one_host)
{
	uint64_t ids[7] = { 9, 3, 3, 9, 1, 3, 3 };
	struct tpc_plan *p = NULL;

	ck_assert_int_eq(tpc_plan_build(ids, 7, &p), 0);
	ck_assert_uint_eq(p->nhosts, 3);
	ck_assert_uint_eq(tpc_plan_leader(p, 0), 0);
	ck_assert_uint_eq(tpc_plan_leader(p, 1), 1);
	ck_assert_uint_eq(tpc_plan_leader(p, 2), 4);
	ck_assert_uint_eq(tpc_plan_local_size(p, 0), 2);
	ck_assert_uint_eq(tpc_plan_local_size(p, 1), 4);
	ck_assert_uint_eq(tpc_plan_local_size(p, 2), 1);
	ck_assert_uint_eq(p->local_rank[6], 3);
	ck_assert_uint_eq(p->local_rank[3], 1);
	tpc_plan_free(p);
	memset(ids, 0, sizeof(ids));
	ck_assert_int_eq(tpc_plan_build(ids, 7, &p), 0);
	ck_assert_uint_eq(p->nhosts, 1);
	ck_assert_uint_eq(tpc_plan_local_size(p, 0), 7);
	ck_assert_uint_eq(tpc_plan_nsteps(1, tpc_plan_choose(1, 1u << 30, TPC_PLAN_RING)), 0);
	tpc_plan_free(p);
}
END_TEST

START_TEST(test_plan_member_limits)
{
	uint64_t *ids = calloc(TPC_PLAN_RANKS_MAX + 1, sizeof(*ids));
	struct tpc_plan *p = NULL;

	ck_assert_ptr_nonnull(ids);
	for (uint32_t r = 0; r <= TPC_PLAN_RANKS_MAX; r++)
		ids[r] = r / 8;
	ck_assert_int_eq(tpc_plan_build(ids, 0, &p), -EINVAL);
	ck_assert_int_eq(tpc_plan_build(ids, TPC_PLAN_RANKS_MAX + 1, &p), -EINVAL);
	ck_assert_ptr_null(p);
	ck_assert_int_eq(tpc_plan_build(ids, TPC_PLAN_RANKS_MAX, &p), 0);
	ck_assert_uint_eq(p->nhosts, TPC_PLAN_RANKS_MAX / 8);
	ck_assert_uint_eq(tpc_plan_leader(p, p->nhosts - 1), TPC_PLAN_RANKS_MAX - 8);
	tpc_plan_free(p);
	free(ids);
}
END_TEST

START_TEST(test_plan_algorithm_by_size_and_override)
{
	enum tpc_plan_algo a;

	ck_assert_int_eq(tpc_plan_choose(1, 1u << 30, TPC_PLAN_AUTO), TPC_PLAN_NONE);
	ck_assert_int_eq(tpc_plan_choose(1, 4, TPC_PLAN_RD), TPC_PLAN_NONE);
	ck_assert_int_eq(tpc_plan_choose(2, TPC_PLAN_RING_MIN - 1, TPC_PLAN_AUTO), TPC_PLAN_RD);
	ck_assert_int_eq(tpc_plan_choose(2, TPC_PLAN_RING_MIN, TPC_PLAN_AUTO), TPC_PLAN_RING);
	ck_assert_int_eq(tpc_plan_choose(25, 0, TPC_PLAN_AUTO), TPC_PLAN_RD);
	ck_assert_int_eq(tpc_plan_choose(25, 4, TPC_PLAN_RING), TPC_PLAN_RING);
	ck_assert_int_eq(tpc_plan_choose(25, 1u << 30, TPC_PLAN_RD), TPC_PLAN_RD);
	ck_assert_int_eq(tpc_plan_algo_parse("ring", &a), 0);
	ck_assert_int_eq(a, TPC_PLAN_RING);
	ck_assert_int_eq(tpc_plan_algo_parse("rd", &a), 0);
	ck_assert_int_eq(a, TPC_PLAN_RD);
	ck_assert_int_eq(tpc_plan_algo_parse("tree", &a), 0);
	ck_assert_int_eq(a, TPC_PLAN_RD);
	ck_assert_int_eq(tpc_plan_algo_parse("auto", &a), 0);
	ck_assert_int_eq(a, TPC_PLAN_AUTO);
	ck_assert_int_eq(tpc_plan_algo_parse("Ring", &a), -EINVAL);
	ck_assert_int_eq(tpc_plan_algo_parse("", &a), -EINVAL);
	ck_assert_int_eq(tpc_plan_algo_parse(NULL, &a), -EINVAL);
	ck_assert_str_eq(tpc_plan_algo_name(TPC_PLAN_RD), "recursive-doubling");
	ck_assert_str_eq(tpc_plan_algo_name(TPC_PLAN_RING), "ring");
}
END_TEST

START_TEST(test_plan_describe_shows_hosts_leaders_and_algorithm_by_size)
{
	uint64_t ids[10] = { 1, 2, 2, 1, 3, 3, 1, 2, 1, 2 };
	struct tpc_plan *p = NULL;
	char buf[256], small[16];

	ck_assert_int_eq(tpc_plan_build(ids, 10, &p), 0);
	tpc_plan_describe(p, TPC_PLAN_AUTO, buf, sizeof(buf));
	ck_assert_str_eq(buf, "3 hosts (members 4,4,2; leaders 0,1,4); across hosts: "
			      "recursive-doubling below 262144 bytes (3 steps), ring from there "
			      "(4 steps); collectives from 8388608 bytes pipelined in 4194304-byte "
			      "segments where the members ask");
	tpc_plan_describe(p, TPC_PLAN_RING, buf, sizeof(buf));
	ck_assert_str_eq(buf, "3 hosts (members 4,4,2; leaders 0,1,4); across hosts: ring at "
			      "every size (4 steps); collectives from 8388608 bytes pipelined in "
			      "4194304-byte segments where the members ask");
	ck_assert_int_eq(tpc_plan_describe(p, TPC_PLAN_RD, small, sizeof(small)),
			 (int)strlen("3 hosts (members 4,4,2; leaders 0,1,4); across hosts: "
				     "recursive-doubling at every size (3 steps); collectives "
				     "from 8388608 bytes pipelined in 4194304-byte segments where "
				     "the members ask"));
	ck_assert_str_eq(small, "3 hosts (member");
	tpc_plan_free(p);
	for (uint32_t r = 0; r < 10; r++)
		ids[r] = r;
	ck_assert_int_eq(tpc_plan_build(ids, 10, &p), 0);
	tpc_plan_describe(p, TPC_PLAN_AUTO, buf, sizeof(buf));
	ck_assert_ptr_nonnull(strstr(buf, "(members 1,1,1,1,1,1,1,1,...; "
					  "leaders 0,1,2,3,4,5,6,7,...)"));
	tpc_plan_free(p);
	memset(ids, 0, sizeof(ids));
	ck_assert_int_eq(tpc_plan_build(ids, 10, &p), 0);
	tpc_plan_describe(p, TPC_PLAN_AUTO, buf, sizeof(buf));
	ck_assert_str_eq(buf, "1 host (members 10; leaders 0); nothing crosses hosts");
	tpc_plan_free(p);
}
END_TEST

/* Applies what @st says leader @i receives, taken from @old (the values before the step). */
static void sim_recv(uint32_t n, struct sym *old, struct sym *cur, uint32_t i,
		     const struct tpc_plan_step *st)
{
	for (uint32_t k = 0; k < st->recv_nseg; k++) {
		uint32_t seg = st->recv_seg + k;
		const struct sym *in = &old[(size_t)st->recv_from * n + seg];
		struct sym *me = &cur[(size_t)i * n + seg], out = { 0 };

		if (st->recv == TPC_PLAN_COPY) {
			*me = *in;
			continue;
		}
		ck_assert(st->recv == TPC_PLAN_FOLD_LEFT || st->recv == TPC_PLAN_FOLD_RIGHT);
		ck_assert_uint_le(in->n + me->n, SIM_HOSTS);
		const struct sym *a = st->recv == TPC_PLAN_FOLD_LEFT ? in : me;
		const struct sym *b = st->recv == TPC_PLAN_FOLD_LEFT ? me : in;

		memcpy(out.who, a->who, a->n);
		memcpy(out.who + a->n, b->who, b->n);
		out.n = a->n + b->n;
		*me = out;
	}
}

/* Checks that @st[i] pairs with what its peers expect in the same step. */
static void sim_check_pairs(uint32_t n, struct tpc_plan_step *st, uint32_t i)
{
	const struct tpc_plan_step *s = &st[i];

	if (s->send_to >= 0) {
		const struct tpc_plan_step *t = &st[s->send_to];

		ck_assert_int_eq(t->recv_from, (int32_t)i);
		ck_assert_uint_eq(t->recv_seg, s->send_seg);
		ck_assert_uint_eq(t->recv_nseg, s->send_nseg);
		ck_assert_uint_le(s->send_seg + s->send_nseg, n);
	}
	if (s->recv_from >= 0) {
		ck_assert_int_eq(st[s->recv_from].send_to, (int32_t)i);
		ck_assert_int_ne(s->recv, TPC_PLAN_RECV_NONE);
	} else {
		ck_assert_int_eq(s->recv, TPC_PLAN_RECV_NONE);
	}
}

/* Runs @algo among @n leaders on symbolic values; returns the segments each leader sent. */
static void simulate(uint32_t n, enum tpc_plan_algo algo, uint32_t *sent)
{
	uint32_t steps = tpc_plan_nsteps(n, algo);
	struct tpc_plan_step *all = calloc((size_t)n * (steps + 1), sizeof(*all));
	struct tpc_plan_step *row = calloc(n, sizeof(*row));
	struct sym *cur = calloc((size_t)n * n, sizeof(*cur));
	struct sym *old = calloc((size_t)n * n, sizeof(*old));

	ck_assert(all && row && cur && old);
	for (uint32_t i = 0; i < n; i++) {
		struct tpc_plan_step *mine = all + (size_t)i * (steps + 1);

		ck_assert_int_eq(tpc_plan_steps(n, algo, i, mine), (int)steps);
		for (uint32_t s = 0; s < n; s++)
			cur[(size_t)i * n + s] = (struct sym){ .n = 1, .who = { (uint8_t)i } };
		sent[i] = 0;
	}
	for (uint32_t k = 0; k < steps; k++) {
		for (uint32_t i = 0; i < n; i++)
			row[i] = all[(size_t)i * (steps + 1) + k];
		memcpy(old, cur, (size_t)n * n * sizeof(*cur));
		for (uint32_t i = 0; i < n; i++) {
			sim_check_pairs(n, row, i);
			sent[i] += row[i].send_to >= 0 ? row[i].send_nseg : 0;
			if (row[i].recv_from >= 0)
				sim_recv(n, old, cur, i, &row[i]);
		}
	}
	for (uint32_t s = 0; s < n; s++) {
		const struct sym *ref = &cur[s];
		uint64_t seen[SIM_HOSTS / 64] = { 0 };

		ck_assert_uint_eq(ref->n, n); /* every host folded in, once */
		for (uint32_t j = 0; j < n; j++) {
			ck_assert(!(seen[ref->who[j] / 64] & (1ull << (ref->who[j] % 64))));
			seen[ref->who[j] / 64] |= 1ull << (ref->who[j] % 64);
		}
		for (uint32_t i = 1; i < n; i++) /* the same order on every leader */
			ck_assert_mem_eq(&cur[(size_t)i * n + s], ref, sizeof(*ref));
	}
	free(old), free(cur), free(row), free(all);
}

START_TEST(test_plan_schedules_fold_every_host_once_in_one_order)
{
	uint32_t sent[SIM_HOSTS];

	for (uint32_t n = 2; n <= 40; n++) {
		uint32_t l = 0;

		simulate(n, TPC_PLAN_RING, sent);
		for (uint32_t i = 0; i < n; i++) /* 2(H-1) segments of 1/H each */
			ck_assert_uint_eq(sent[i], 2 * (n - 1));
		simulate(n, TPC_PLAN_RD, sent);
		while ((2u << l) <= n)
			l++;
		ck_assert_uint_eq(tpc_plan_nsteps(n, TPC_PLAN_RD), l + ((1u << l) < n ? 2 : 0));
		for (uint32_t i = 0; i < n; i++) /* at most log2 H + 1 whole tensors */
			ck_assert_uint_le(sent[i], (l + 1) * n);
	}
}
END_TEST

START_TEST(test_plan_steps_refuse_bad_arguments)
{
	struct tpc_plan_step st[8];

	ck_assert_int_eq(tpc_plan_steps(4, TPC_PLAN_RING, 4, st), -EINVAL);
	ck_assert_int_eq(tpc_plan_steps(4, TPC_PLAN_RING, 3, st), 6);
	ck_assert_int_eq(tpc_plan_steps(4, TPC_PLAN_AUTO, 0, st), -EINVAL);
	ck_assert_int_eq(tpc_plan_steps(4, TPC_PLAN_NONE, 0, st), -EINVAL);
	ck_assert_int_eq(tpc_plan_steps(1, TPC_PLAN_RING, 0, st), 0);
	ck_assert_int_eq(tpc_plan_steps(0, TPC_PLAN_RING, 0, st), -EINVAL);
}
END_TEST

START_TEST(test_plan_segments_cover_the_tensor_aligned)
{
	static const size_t counts[] = { 0, 1, 2, 15, 16, 17, 97, 1021, 65537, 1000003 };
	static const size_t sizes[] = { 1, 2, 4, 8 };

	for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
		for (size_t e = 0; e < 4; e++)
			for (uint32_t nseg = 1; nseg <= 25; nseg++) {
				size_t at = 0, off, n;

				for (uint32_t s = 0; s < nseg; s++) {
					tpc_plan_segment(counts[c], sizes[e], nseg, s, &off, &n);
					ck_assert_uint_eq(off, at);
					if (n && off < counts[c])
						ck_assert_uint_eq(off * sizes[e] % 64, 0);
					at += n;
				}
				ck_assert_uint_eq(at, counts[c]);
			}
}
END_TEST

/* ---- the executor over threads and queues ------------------------------------------------ */

#define RUN_HOSTS 25 /* leaders the queue world holds */
#define RUN_SWEEP 9  /* leaders the sweep of sizes and chunkings goes up to */

struct msg {
	struct msg *next;
	size_t len;
	uint8_t data[];
};

struct world {
	uint32_t n;
	pthread_mutex_t lk;
	pthread_cond_t cv;
	struct msg *head[RUN_HOSTS][RUN_HOSTS], **tail[RUN_HOSTS][RUN_HOSTS]; /* [from][to] */
	int dead;	    /* a leader failed: -ECONNRESET to whoever waits */
	int fail_host;	    /* this leader's transport fails ... */
	unsigned fail_after; /* ... after this many exchanges (-1: never) */
	unsigned max_pend;   /* the most exchanges a leader had started at once */
	bool left;	     /* the leaders fold the received value first in one pass (fold_left) */
	unsigned min_late;   /* the fewest in flight when a leader started one, past its first
			      * TPC_PLAN_DEPTH (a drain between steps shows as 0) */
};

struct pending {
	int32_t from;
	void *rbuf;
	size_t rlen;
	const void *sbuf; /* a real transport reads it until the exchange is waited for */
	size_t slen;
};

static bool bytes_overlap(const void *a, size_t an, const void *b, size_t bn)
{
	const char *x = a, *y = b;

	return an && bn && x < y + bn && y < x + an;
}

struct leader {
	struct world *w;
	uint32_t me;
	unsigned calls;
	struct pending pend[TPC_PLAN_DEPTH]; /* started exchanges' receives, oldest first */
	unsigned first, npend, max_pend, starts, min_late;
	struct tpc_plan_run_args a;
	int ret;
	/* a run in segments: what ready() and done() saw */
	size_t ready_end, done_end;
	unsigned ready_calls, ready_waits, done_calls;
	unsigned ready_fail_at; /* ready() of this segment fails (0: never) */
	bool lazy;		/* ready() says "not yet" once a segment, then yes */
};

/* Sends now; the receive waits for q_wait(), in start order. */
static int q_start(void *t, int32_t to, const void *sbuf, size_t slen, int32_t from, void *rbuf,
		   size_t rlen)
{
	struct leader *l = t;
	struct world *w = l->w;
	struct pending *pd;

	if ((int)l->me == w->fail_host && l->calls++ >= w->fail_after) {
		pthread_mutex_lock(&w->lk);
		w->dead = 1;
		pthread_cond_broadcast(&w->cv);
		pthread_mutex_unlock(&w->lk);
		return -EHOSTUNREACH;
	}
	ck_assert(to >= 0 || from >= 0);
	ck_assert_uint_lt(l->npend, TPC_PLAN_DEPTH); /* the run keeps to the depth */
	/* An exchange's memory is the transport's until its wait: nothing started later may
	 * receive into what an earlier one sends or receives, nor send what one receives. */
	for (unsigned i = 0; i < l->npend; i++) {
		const struct pending *e = &l->pend[(l->first + i) % TPC_PLAN_DEPTH];
		size_t sl = to >= 0 ? slen : 0, rl = from >= 0 ? rlen : 0;

		ck_assert(!bytes_overlap(rbuf, rl, e->sbuf, e->slen));
		ck_assert(!bytes_overlap(rbuf, rl, e->rbuf, e->rlen));
		ck_assert(!bytes_overlap(sbuf, sl, e->rbuf, e->rlen));
	}
	if (l->starts++ >= TPC_PLAN_DEPTH && l->npend < l->min_late)
		l->min_late = l->npend;
	pd = &l->pend[(l->first + l->npend++) % TPC_PLAN_DEPTH];
	l->max_pend = l->npend > l->max_pend ? l->npend : l->max_pend;
	*pd = (struct pending){ .from = from, .rbuf = rbuf, .rlen = from >= 0 ? rlen : 0,
				.sbuf = sbuf, .slen = to >= 0 ? slen : 0 };
	if (to >= 0) {
		struct msg *m = malloc(sizeof(*m) + slen);

		ck_assert_ptr_nonnull(m);
		m->next = NULL, m->len = slen;
		memcpy(m->data, sbuf, slen);
		pthread_mutex_lock(&w->lk);
		*w->tail[l->me][to] = m;
		w->tail[l->me][to] = &m->next;
		pthread_cond_broadcast(&w->cv);
		pthread_mutex_unlock(&w->lk);
	}
	return 0;
}

static int q_wait(void *t)
{
	struct leader *l = t;
	struct world *w = l->w;
	struct pending pd;
	struct msg *m;
	int r;

	ck_assert_uint_gt(l->npend, 0);
	pd = l->pend[l->first];
	l->first = (l->first + 1) % TPC_PLAN_DEPTH, l->npend--;
	if (pd.from < 0)
		return 0;
	pthread_mutex_lock(&w->lk);
	while (!w->head[pd.from][l->me] && !w->dead)
		pthread_cond_wait(&w->cv, &w->lk);
	m = w->head[pd.from][l->me];
	if (!m) {
		r = -ECONNRESET;
	} else {
		w->head[pd.from][l->me] = m->next;
		if (!m->next)
			w->tail[pd.from][l->me] = &w->head[pd.from][l->me];
		r = m->len == pd.rlen ? 0 : -EPROTO;
		memcpy(pd.rbuf, m->data, m->len < pd.rlen ? m->len : pd.rlen);
		free(m);
	}
	pthread_mutex_unlock(&w->lk);
	return r;
}

static const struct tpc_plan_xport_ops q_ops = { .start = q_start, .wait = q_wait };

static void q_fold(void *inout, const void *in, size_t count, int dtype, void *user)
{
	tpc_reduce(inout, in, count, (enum tp_dtype)dtype, *(enum tp_reduce_op *)user);
}

static void q_fold_left(void *inout, const void *in, size_t count, int dtype, void *user)
{
	tpc_reduce_left(inout, in, count, (enum tp_dtype)dtype, *(enum tp_reduce_op *)user);
}

static void *leader_main(void *arg)
{
	struct leader *l = arg;

	l->ret = tpc_plan_run(&l->a);
	ck_assert_uint_eq(l->npend, 0); /* every started exchange waited for, error or not */
	return NULL;
}

static void world_init(struct world *w, uint32_t n)
{
	memset(w, 0, sizeof(*w));
	w->n = n;
	w->fail_host = -1;
	w->min_late = UINT_MAX;
	pthread_mutex_init(&w->lk, NULL);
	pthread_cond_init(&w->cv, NULL);
	for (uint32_t i = 0; i < RUN_HOSTS; i++)
		for (uint32_t j = 0; j < RUN_HOSTS; j++)
			w->tail[i][j] = &w->head[i][j];
}

/* Frees what is left queued; returns how many messages were. */
static unsigned world_done(struct world *w)
{
	unsigned left = 0;

	for (uint32_t i = 0; i < RUN_HOSTS; i++)
		for (uint32_t j = 0; j < RUN_HOSTS; j++)
			while (w->head[i][j]) {
				struct msg *m = w->head[i][j];

				w->head[i][j] = m->next;
				free(m);
				left++;
			}
	pthread_mutex_destroy(&w->lk);
	pthread_cond_destroy(&w->cv);
	return left;
}

/* Runs @algo among @n leaders over @bufs (n x count elements of @es bytes); returns errors. */
static void run_all(struct world *w, enum tpc_plan_algo algo, uint8_t *bufs, size_t count,
		    size_t es, enum tp_dtype dt, enum tp_reduce_op *op, size_t chunk, int *rets)
{
	struct leader l[RUN_HOSTS];
	pthread_t th[RUN_HOSTS];
	size_t stride = (count * es + 64) / 64 * 64; /* aligned, never 0 */
	uint8_t *scratch = aligned_alloc(64, w->n * stride);

	ck_assert_ptr_nonnull(scratch);
	for (uint32_t i = 0; i < w->n; i++) {
		l[i] = (struct leader){ .w = w, .me = i, .min_late = UINT_MAX };
		l[i].a = (struct tpc_plan_run_args){
			.nhosts = w->n, .host = i, .algo = algo, .buf = bufs + i * count * es,
			.count = count, .es = es, .chunk = chunk,
			.scratch = scratch + i * stride, .fold = q_fold,
			.fold_left = w->left ? q_fold_left : NULL, .dtype = dt,
			.user = op, .ops = &q_ops, .t = &l[i],
		};
		ck_assert_int_eq(pthread_create(&th[i], NULL, leader_main, &l[i]), 0);
	}
	for (uint32_t i = 0; i < w->n; i++) {
		pthread_join(th[i], NULL);
		rets[i] = l[i].ret;
		w->max_pend = l[i].max_pend > w->max_pend ? l[i].max_pend : w->max_pend;
		w->min_late = l[i].min_late < w->min_late ? l[i].min_late : w->min_late;
	}
	free(scratch);
}

static float f_in(uint32_t h, size_t i)
{
	return (float)(h + 1) * 0.1f + (float)i * 1e-3f;
}

static uint64_t q_in(uint32_t h, size_t i)
{
	return (uint64_t)(h * 1000003u + i) << 33; /* the sum wraps */
}

/* Runs @algo among @n leaders in @cnt elements of f32 then i64, chunks of @chunk bytes, and
 * checks every leader's result against the others' bits and against the sum. */
static void check_run(uint32_t n, enum tpc_plan_algo algo, size_t cnt, size_t chunk)
{
	float *f = calloc(n * cnt + 1, sizeof(float));
	uint64_t *q = calloc(n * cnt + 1, sizeof(uint64_t));
	enum tp_reduce_op op = TP_OP_SUM;
	int rf[RUN_HOSTS], rq[RUN_HOSTS];
	struct world w;

	ck_assert(f && q);
	for (uint32_t h = 0; h < n; h++)
		for (size_t i = 0; i < cnt; i++)
			f[h * cnt + i] = f_in(h, i), q[h * cnt + i] = q_in(h, i);
	world_init(&w, n);
	run_all(&w, algo, (uint8_t *)f, cnt, 4, TP_DTYPE_F32, &op, chunk, rf);
	ck_assert_uint_eq(world_done(&w), 0);
	world_init(&w, n);
	run_all(&w, algo, (uint8_t *)q, cnt, 8, TP_DTYPE_I64, &op, chunk, rq);
	ck_assert_uint_eq(world_done(&w), 0);
	for (uint32_t h = 0; h < n; h++) {
		ck_assert_int_eq(rf[h], 0);
		ck_assert_int_eq(rq[h], 0);
		ck_assert_mem_eq(f + h * cnt, f, cnt * sizeof(float));
		ck_assert_mem_eq(q + h * cnt, q, cnt * sizeof(uint64_t));
	}
	for (size_t i = 0; i < cnt; i++) {
		double want = 0;
		uint64_t iw = 0;

		for (uint32_t h = 0; h < n; h++)
			want += f_in(h, i), iw += q_in(h, i);
		ck_assert(fabs(f[i] - want) <= 1e-5 * fabs(want) + 1e-6);
		ck_assert_uint_eq(q[i], iw);
	}
	free(f), free(q);
}

START_TEST(test_plan_run_results_identical_and_right)
{
	static const size_t counts[] = { 0, 1, 17, 1021, 4099 };
	static const size_t chunks[] = { 0, 4, 64, 1000 };

	for (uint32_t n = 2; n <= RUN_SWEEP; n++)
		for (int algo = TPC_PLAN_RING; algo <= TPC_PLAN_RD; algo++)
			for (size_t c = 0; c < 5; c++)
				for (size_t k = 0; k < 4; k++)
					if (chunks[k] == 0 || chunks[k] >= 64 || counts[c] <= 17)
						check_run(n, algo, counts[c], chunks[k]);
}
END_TEST

/*
 * A whole all-reduce of 200 ranks over 25 hosts, as the group will run it: each host folds its
 * members in local rank order (the arena's part), the 25 leaders run the schedule, every member
 * copies its leader's result. Every rank ends with the same bits and the exact (wrapping) sum.
 */
/* A run whose leaders fold the received value first in one pass (fold_left) leaves the bits of
 * one that folds into the scratch and copies back, every leader, in float (where the order of
 * the operands shows in NaNs' payloads) and in every schedule. */
START_TEST(test_plan_run_fold_left_leaves_the_same_bits)
{
	static const size_t counts[] = { 1, 17, 1021 };
	static const size_t chunks[] = { 0, 64, 1000 };

	for (uint32_t n = 2; n <= RUN_SWEEP; n++)
		for (int algo = TPC_PLAN_RING; algo <= TPC_PLAN_RD; algo++)
			for (size_t c = 0; c < 3; c++)
				for (size_t k = 0; k < 3; k++) {
					size_t cnt = counts[c], len = n * cnt * 4;
					enum tp_reduce_op op = (enum tp_reduce_op)(TP_OP_SUM + k);
					uint8_t *a = malloc(len), *b = malloc(len);
					int ra[RUN_HOSTS], rb[RUN_HOSTS];
					struct world w;

					ck_assert(a && b);
					for (size_t i = 0; i < len; i++) /* any bits, NaNs too */
						a[i] = (uint8_t)((i * 2654435761u) >> 13 ^ n ^ c);
					memcpy(b, a, len);
					world_init(&w, n);
					run_all(&w, algo, a, cnt, 4, TP_DTYPE_F32, &op, chunks[k], ra);
					ck_assert_uint_eq(world_done(&w), 0);
					world_init(&w, n);
					w.left = true;
					run_all(&w, algo, b, cnt, 4, TP_DTYPE_F32, &op, chunks[k], rb);
					ck_assert_uint_eq(world_done(&w), 0);
					for (uint32_t h = 0; h < n; h++)
						ck_assert(ra[h] == 0 && rb[h] == 0);
					ck_assert_mem_eq(a, b, len);
					free(a), free(b);
				}
}
END_TEST

START_TEST(test_plan_200_ranks_all_reduce_composes)
{
	enum { RANKS = 200, HOSTS = 25, CNT = 3001 };
	uint64_t ids[RANKS], *in = calloc((size_t)RANKS * CNT, 8), *part = calloc(HOSTS * CNT, 8);
	enum tp_reduce_op op = TP_OP_SUM;
	struct tpc_plan *p = NULL;
	int rets[RUN_HOSTS];

	ck_assert(in && part);
	for (uint32_t r = 0; r < RANKS; r++) {
		ids[r] = host_id_of(r, HOSTS);
		for (size_t i = 0; i < CNT; i++)
			in[(size_t)r * CNT + i] = q_in(r, i) ^ (i * 0x9e3779b97f4a7c15ull);
	}
	ck_assert_int_eq(tpc_plan_build(ids, RANKS, &p), 0);
	ck_assert_uint_eq(p->nhosts, HOSTS);
	for (int algo = TPC_PLAN_RING; algo <= TPC_PLAN_RD; algo++) {
		struct world w;

		for (uint32_t h = 0; h < HOSTS; h++) {
			uint64_t *acc = part + (size_t)h * CNT;

			memcpy(acc, in + (size_t)tpc_plan_leader(p, h) * CNT, CNT * 8);
			for (uint32_t j = 1; j < tpc_plan_local_size(p, h); j++) {
				uint32_t r = p->by_host[p->host_first[h] + j];

				tpc_reduce(acc, in + (size_t)r * CNT, CNT, TP_DTYPE_I64, TP_OP_SUM);
			}
		}
		world_init(&w, HOSTS);
		run_all(&w, algo, (uint8_t *)part, CNT, 8, TP_DTYPE_I64, &op, 4096, rets);
		/* recursive doubling's whole-tensor steps span 6 chunks: the next is on the wire
		 * while one is folded */
		if (algo == TPC_PLAN_RD)
			ck_assert_uint_eq(w.max_pend, TPC_PLAN_DEPTH);
		ck_assert_uint_eq(world_done(&w), 0);
		for (uint32_t r = 0; r < RANKS; r++) {
			const uint64_t *got = part + (size_t)p->host_of[r] * CNT;

			ck_assert_int_eq(rets[p->host_of[r]], 0);
			ck_assert_mem_eq(got, part, CNT * 8);
		}
		for (size_t i = 0; i < CNT; i++) {
			uint64_t want = 0;

			for (uint32_t r = 0; r < RANKS; r++)
				want += in[(size_t)r * CNT + i];
			ck_assert_uint_eq(part[i], want);
		}
	}
	tpc_plan_free(p);
	free(part), free(in);
}
END_TEST

/*
 * The ring's steps follow one another without a drain: step t + 1 sends chunk k once step t's
 * chunk k has landed, so every exchange after the first few starts with TPC_PLAN_DEPTH - 1
 * others in flight, at every step boundary too (results still right and identical).
 */
START_TEST(test_plan_ring_keeps_exchanges_in_flight_across_steps)
{
	enum { CNT = 4096 };

	for (uint32_t n = 2; n <= 4; n++) {
		uint64_t *q = calloc((size_t)n * CNT, 8);
		enum tp_reduce_op op = TP_OP_SUM;
		int rets[RUN_HOSTS];
		struct world w;

		ck_assert_ptr_nonnull(q);
		for (uint32_t h = 0; h < n; h++)
			for (size_t i = 0; i < CNT; i++)
				q[(size_t)h * CNT + i] = q_in(h, i);
		world_init(&w, n);
		run_all(&w, TPC_PLAN_RING, (uint8_t *)q, CNT, 8, TP_DTYPE_I64, &op, 16 * 8, rets);
		ck_assert_uint_eq(w.min_late, TPC_PLAN_DEPTH - 1);
		ck_assert_uint_eq(world_done(&w), 0);
		for (uint32_t h = 0; h < n; h++) {
			ck_assert_int_eq(rets[h], 0);
			ck_assert_mem_eq(q + (size_t)h * CNT, q, CNT * 8);
		}
		for (size_t i = 0; i < CNT; i++) {
			uint64_t want = 0;

			for (uint32_t h = 0; h < n; h++)
				want += q_in(h, i);
			ck_assert_uint_eq(q[i], want);
		}
		free(q);
	}
}
END_TEST

static int seg_ready(void *t, size_t end, bool wait)
{
	struct leader *l = t;

	/* called once a segment, in order, before that segment's exchanges and never again */
	ck_assert_uint_le(end, l->a.count);
	if (wait) { /* only after a "not yet" of the same segment */
		ck_assert(l->lazy);
		ck_assert_uint_eq(end, l->ready_end);
	} else {
		ck_assert_uint_gt(end, l->ready_end);
		l->ready_calls++;
	}
	ck_assert_uint_le(l->done_end, l->ready_end);
	l->ready_end = end;
	if (l->ready_fail_at && l->ready_calls == l->ready_fail_at)
		return -ECANCELED;
	if (wait) {
		l->ready_waits++;
		ck_assert_uint_eq(l->npend, 0); /* what was in flight landed first */
		return 1;
	}
	return l->lazy ? 0 : 1;
}

static void seg_done(void *t, size_t end)
{
	struct leader *l = t;

	ck_assert_uint_gt(end, l->done_end); /* in order, each once */
	ck_assert_uint_le(end, l->ready_end);
	ck_assert(end == l->a.count || end % l->a.seg == 0); /* whole segments */
	l->done_end = end;
	l->done_calls++;
}

/* A run of @cnt elements in segments of @seg, each leader's callbacks @lazy and failing at
 * segment @fail_at (0: never), against the same run without segments segment by segment. */
static void check_segments(uint32_t n, enum tpc_plan_algo algo, size_t cnt, size_t seg,
			   bool lazy, unsigned fail_at)
{
	size_t nseg = (cnt + seg - 1) / seg, stride = (cnt * 4 + 64) / 64 * 64;
	float *f = calloc(n * cnt + 1, 4), *ref = calloc(n * cnt + 1, 4);
	uint8_t *scratch = aligned_alloc(64, n * stride);
	enum tp_reduce_op op = TP_OP_SUM;
	struct leader l[RUN_HOSTS];
	pthread_t th[RUN_HOSTS];
	int rets[RUN_HOSTS];
	struct world w;

	ck_assert(f && ref && scratch);
	for (uint32_t h = 0; h < n; h++)
		for (size_t i = 0; i < cnt; i++)
			f[h * cnt + i] = ref[h * cnt + i] = f_in(h, i) * (float)(i % 7 + 1);
	for (size_t o = 0; o < cnt; o += seg) { /* the reference: each segment a run of its own */
		size_t k = cnt - o < seg ? cnt - o : seg;
		float *part = calloc(n * k, 4);

		for (uint32_t h = 0; h < n; h++)
			memcpy(part + h * k, ref + h * cnt + o, k * 4);
		world_init(&w, n);
		run_all(&w, algo, (uint8_t *)part, k, 4, TP_DTYPE_F32, &op, 16 * 4, rets);
		ck_assert_uint_eq(world_done(&w), 0);
		for (uint32_t h = 0; h < n; h++)
			memcpy(ref + h * cnt + o, part + h * k, k * 4);
		free(part);
	}
	world_init(&w, n);
	for (uint32_t i = 0; i < n; i++) {
		l[i] = (struct leader){ .w = &w, .me = i, .min_late = UINT_MAX, .lazy = lazy,
					.ready_fail_at = fail_at };
		l[i].a = (struct tpc_plan_run_args){
			.nhosts = n, .host = i, .algo = algo, .buf = f + i * cnt, .count = cnt,
			.es = 4, .chunk = 16 * 4, .scratch = scratch + i * stride,
			.fold = q_fold, .dtype = TP_DTYPE_F32, .user = &op, .ops = &q_ops,
			.t = &l[i], .seg = seg, .ready = seg_ready, .done = seg_done,
		};
		ck_assert_int_eq(pthread_create(&th[i], NULL, leader_main, &l[i]), 0);
	}
	for (uint32_t i = 0; i < n; i++) {
		pthread_join(th[i], NULL);
		if (fail_at) {
			/* the run stops before that segment: every segment before it is done */
			ck_assert_int_eq(l[i].ret, -ECANCELED);
			ck_assert_uint_eq(l[i].done_end, (fail_at - 1) * seg);
			ck_assert_mem_eq(f + i * cnt, ref, (fail_at - 1) * seg * 4);
			continue;
		}
		ck_assert_int_eq(l[i].ret, 0);
		ck_assert_uint_eq(l[i].ready_calls, nseg);
		ck_assert_uint_eq(l[i].ready_waits, lazy ? nseg : 0);
		ck_assert_uint_eq(l[i].done_end, cnt);
		ck_assert_uint_le(l[i].done_calls, nseg);
		/* the same bits as segment by segment, on every leader */
		ck_assert_mem_eq(f + i * cnt, ref, cnt * 4);
		/* no drain between segments when each is ready at once (and has chunks enough
		 * for a step to overlap the next) */
		if (!lazy && algo == TPC_PLAN_RING && seg >= 1000 && cnt % seg == 0)
			ck_assert_uint_eq(l[i].min_late, TPC_PLAN_DEPTH - 1);
	}
	ck_assert_uint_eq(world_done(&w), 0);
	free(f), free(ref), free(scratch);
}

/*
 * A run in segments (a pipelined all-reduce): the schedule over each segment in turn, the same
 * bits as one run per segment; ready() before each segment, done() once each has landed, in
 * order; the ring keeps TPC_PLAN_DEPTH exchanges on the wire across segments; a "not yet"
 * lands what is in flight before the run waits; a failing ready() stops the run after the
 * segments before it, every exchange waited for.
 */
START_TEST(test_plan_run_in_segments)
{
	for (uint32_t n = 2; n <= 4; n++)
		for (int algo = TPC_PLAN_RING; algo <= TPC_PLAN_RD; algo++) {
			check_segments(n, algo, 4099, 1000, false, 0);
			check_segments(n, algo, 4000, 1000, false, 0);
			check_segments(n, algo, 4000, 1000, true, 0);
			check_segments(n, algo, 37, 1, false, 0);
			check_segments(n, algo, 4099, 1000, false, 3);
		}
}
END_TEST

START_TEST(test_plan_run_transport_failure_ends_every_leader)
{
	enum tp_reduce_op op = TP_OP_SUM;
	size_t cnt = 1000;

	for (int algo = TPC_PLAN_RING; algo <= TPC_PLAN_RD; algo++)
		for (unsigned after = 0; after < 3; after++) {
			float *f = calloc(5 * cnt, sizeof(float));
			int rets[RUN_HOSTS];
			struct world w;

			world_init(&w, 5);
			w.fail_host = 2;
			w.fail_after = after;
			run_all(&w, algo, (uint8_t *)f, cnt, 4, TP_DTYPE_F32, &op, 256, rets);
			world_done(&w);
			ck_assert_int_eq(rets[2], -EHOSTUNREACH);
			for (uint32_t h = 0; h < 5; h++)
				ck_assert_int_lt(rets[h], 0);
			free(f);
		}
}
END_TEST

/* A pipelined broadcast, all-gather or reduce-scatter (collx.c run_segx()): segments of each
 * rank's count, and every host's pieces of every segment, tile the tensor exactly once. */
START_TEST(test_plan_pipelined_pieces_tile_the_tensor)
{
	static const size_t counts[] = { 1, 2, 174763, 262144, 262145, 524287, 1048583 };
	static const uint32_t nranks[] = { 1, 2, 4, 5, 6, 64 };
	uint64_t ids[64];
	struct tpc_plan *p;

	/* TPC_PLAN_SEG over the blocks a segment spans, at least one element */
	ck_assert_uint_eq(tpc_plan_xseg(4, 1), TPC_PLAN_SEG / 4);
	ck_assert_uint_eq(tpc_plan_xseg(4, 4), TPC_PLAN_SEG / 16);
	ck_assert_uint_eq(tpc_plan_xseg(4, 6), 174762); /* not a multiple of anything */
	ck_assert_uint_eq(tpc_plan_xseg(8, 65536), 8);
	ck_assert_uint_eq(tpc_plan_xseg(8, 1u << 30), 1);
	ck_assert_uint_eq(tpc_plan_xseg(0, 4), 1);
	for (size_t w = 0; w < sizeof(nranks) / sizeof(nranks[0]); w++) {
		uint32_t n = nranks[w], hosts = n < 3 ? n : 3;

		for (uint32_t r = 0; r < n; r++)
			ids[r] = host_id_of(r, hosts); /* interleaved */
		ck_assert_int_eq(tpc_plan_build(ids, n, &p), 0);
		for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
			size_t cnt = counts[k], es = k & 1 ? 2 : 4, seg = tpc_plan_xseg(es, n);
			size_t len = (size_t)n * cnt * es, segs = 0;
			uint8_t *hit;

			if (len > (24u << 20))
				continue;
			hit = calloc(len, 1);
			for (size_t off = 0; off < cnt; segs++) {
				size_t m = cnt - off < seg ? cnt - off : seg;

				for (uint32_t h = 0; h < p->nhosts; h++)
					for (uint32_t i = 0; i < tpc_plan_local_size(p, h); i++) {
						size_t at = tpc_plan_piece(p, h, i, cnt, off, es);

						ck_assert_uint_le(at + m * es, len);
						for (size_t b = 0; b < m * es; b++)
							if (hit[at + b]++)
								ck_abort_msg("byte %zu twice", at + b);
					}
				off += m;
			}
			for (size_t b = 0; b < len; b++)
				if (hit[b] != 1)
					ck_abort_msg("byte %zu of %zu covered %u times", b, len, hit[b]);
			ck_assert_uint_eq(segs, (cnt + seg - 1) / seg);
			free(hit);
		}
		tpc_plan_free(p);
	}
}
END_TEST

START_TEST(test_plan_run_refuses_bad_arguments)
{
	enum tp_reduce_op op = TP_OP_SUM;
	float x[4] = { 0 }, s[4];
	struct tpc_plan_run_args a = {
		.nhosts = 2, .host = 0, .algo = TPC_PLAN_RING, .buf = x, .count = 4, .es = 4,
		.scratch = s, .fold = q_fold, .dtype = TP_DTYPE_F32, .user = &op, .ops = &q_ops,
	};

	a.es = 0;
	ck_assert_int_eq(tpc_plan_run(&a), -EINVAL);
	a.es = 4, a.host = 2;
	ck_assert_int_eq(tpc_plan_run(&a), -EINVAL);
	a.host = 0, a.algo = TPC_PLAN_AUTO;
	ck_assert_int_eq(tpc_plan_run(&a), -EINVAL);
	a.algo = TPC_PLAN_RING, a.scratch = NULL;
	ck_assert_int_eq(tpc_plan_run(&a), -EINVAL);
	a.scratch = s, a.fold = NULL;
	ck_assert_int_eq(tpc_plan_run(&a), -EINVAL);
	a.nhosts = 1, a.algo = TPC_PLAN_NONE; /* one host: nothing crosses */
	ck_assert_int_eq(tpc_plan_run(&a), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("plan");
	TCase *tc = tcase_create("plan");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_plan_200_ranks_over_25_hosts_group_by_host_identity);
	tcase_add_test(tc, test_plan_uneven_hosts_and_one_host);
	tcase_add_test(tc, test_plan_member_limits);
	tcase_add_test(tc, test_plan_algorithm_by_size_and_override);
	tcase_add_test(tc, test_plan_describe_shows_hosts_leaders_and_algorithm_by_size);
	tcase_add_test(tc, test_plan_schedules_fold_every_host_once_in_one_order);
	tcase_add_test(tc, test_plan_steps_refuse_bad_arguments);
	tcase_add_test(tc, test_plan_segments_cover_the_tensor_aligned);
	tcase_add_test(tc, test_plan_run_results_identical_and_right);
	tcase_add_test(tc, test_plan_run_fold_left_leaves_the_same_bits);
	tcase_add_test(tc, test_plan_200_ranks_all_reduce_composes);
	tcase_add_test(tc, test_plan_ring_keeps_exchanges_in_flight_across_steps);
	tcase_add_test(tc, test_plan_run_in_segments);
	tcase_add_test(tc, test_plan_run_transport_failure_ends_every_leader);
	tcase_add_test(tc, test_plan_run_refuses_bad_arguments);
	tcase_add_test(tc, test_plan_pipelined_pieces_tile_the_tensor);
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
