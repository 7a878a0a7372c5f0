/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The plan of a group across hosts (see plan.h): grouping members by host identity, leaders,
 * the algorithm by size, and each leader's schedule for ring reduce-scatter + all-gather and
 * for recursive doubling. Deterministic: every leader that follows its schedule folds each
 * segment in the same order as every other leader sees it, so results are bitwise identical.
 * Pure computation; the transfers that follow a schedule are elsewhere.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "plan.h"

struct member {
	uint64_t host_id;
	uint32_t rank;
};

struct host {
	uint32_t start, n; /* in the sorted members */
	uint32_t lowest;   /* lowest rank */
};

static int member_cmp(const void *a, const void *b)
{
	const struct member *x = a, *y = b;

	if (x->host_id != y->host_id)
		return x->host_id < y->host_id ? -1 : 1;
	return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static int host_cmp(const void *a, const void *b)
{
	const struct host *x = a, *y = b;

	return x->lowest < y->lowest ? -1 : x->lowest > y->lowest;
}

void tpc_plan_free(struct tpc_plan *p)
{
	if (!p)
		return;
	free(p->host_of);
	free(p->local_rank);
	free(p->host_first);
	free(p->by_host);
	free(p);
}

/* Fills @p's tables from @m (sorted by host then rank) and @h (its hosts, by lowest rank). */
static void plan_fill(struct tpc_plan *p, const struct member *m, const struct host *h)
{
	uint32_t at = 0;

	for (uint32_t i = 0; i < p->nhosts; i++) {
		p->host_first[i] = at;
		for (uint32_t j = 0; j < h[i].n; j++) {
			uint32_t r = m[h[i].start + j].rank;

			p->by_host[at++] = r;
			p->host_of[r] = i;
			p->local_rank[r] = j;
		}
	}
	p->host_first[p->nhosts] = at;
}

int tpc_plan_build(const uint64_t *host_ids, uint32_t nranks, struct tpc_plan **ret)
{
	struct member *m = NULL;
	struct host *h = NULL;
	struct tpc_plan *p = NULL;
	uint32_t nh = 0;
	int r = -ENOMEM;

	if (nranks == 0 || nranks > TPC_PLAN_RANKS_MAX)
		return -EINVAL;
	m = calloc(nranks, sizeof(*m));
	h = calloc(nranks, sizeof(*h));
	p = calloc(1, sizeof(*p));
	if (!m || !h || !p)
		goto out;
	for (uint32_t i = 0; i < nranks; i++)
		m[i] = (struct member){ .host_id = host_ids[i], .rank = i };
	qsort(m, nranks, sizeof(*m), member_cmp);
	for (uint32_t i = 0; i < nranks; i++) {
		if (i == 0 || m[i].host_id != m[i - 1].host_id)
			h[nh++] = (struct host){ .start = i, .lowest = m[i].rank };
		h[nh - 1].n++;
	}
	qsort(h, nh, sizeof(*h), host_cmp);
	p->nranks = nranks;
	p->nhosts = nh;
	p->host_of = calloc(nranks, sizeof(uint32_t));
	p->local_rank = calloc(nranks, sizeof(uint32_t));
	p->by_host = calloc(nranks, sizeof(uint32_t));
	p->host_first = calloc((size_t)nh + 1, sizeof(uint32_t));
	if (!p->host_of || !p->local_rank || !p->by_host || !p->host_first)
		goto out;
	plan_fill(p, m, h);
	*ret = p;
	p = NULL;
	r = 0;
out:
	tpc_plan_free(p);
	free(h);
	free(m);
	return r;
}

uint32_t tpc_plan_leader(const struct tpc_plan *p, uint32_t h)
{
	return p->by_host[p->host_first[h]];
}

uint32_t tpc_plan_local_size(const struct tpc_plan *p, uint32_t h)
{
	return p->host_first[h + 1] - p->host_first[h];
}

enum tpc_plan_algo tpc_plan_choose(uint32_t nhosts, uint64_t bytes, enum tpc_plan_algo force)
{
	if (nhosts <= 1)
		return TPC_PLAN_NONE;
	if (force == TPC_PLAN_RING || force == TPC_PLAN_RD)
		return force;
	return bytes >= TPC_PLAN_RING_MIN ? TPC_PLAN_RING : TPC_PLAN_RD;
}

int tpc_plan_algo_parse(const char *s, enum tpc_plan_algo *ret)
{
	if (!s)
		return -EINVAL;
	if (!strcmp(s, "auto"))
		*ret = TPC_PLAN_AUTO;
	else if (!strcmp(s, "ring"))
		*ret = TPC_PLAN_RING;
	else if (!strcmp(s, "rd") || !strcmp(s, "tree"))
		*ret = TPC_PLAN_RD;
	else
		return -EINVAL;
	return 0;
}

const char *tpc_plan_algo_name(enum tpc_plan_algo a)
{
	switch (a) {
	case TPC_PLAN_RING:
		return "ring";
	case TPC_PLAN_RD:
		return "recursive-doubling";
	case TPC_PLAN_NONE:
		return "none";
	default:
		return "auto";
	}
}

/* The largest power of two <= @n (n >= 1) and its log2. */
static uint32_t pow2_floor(uint32_t n, uint32_t *ret_log)
{
	uint32_t p = 1, l = 0;

	while (p <= n / 2)
		p *= 2, l++;
	*ret_log = l;
	return p;
}

uint32_t tpc_plan_nsteps(uint32_t nhosts, enum tpc_plan_algo algo)
{
	uint32_t l, p;

	if (nhosts <= 1)
		return 0;
	if (algo == TPC_PLAN_RING)
		return 2 * (nhosts - 1);
	if (algo != TPC_PLAN_RD)
		return 0;
	p = pow2_floor(nhosts, &l);
	return l + (p < nhosts ? 2 : 0);
}

/*
 * Ring among H leaders, segment k of H. Reduce-scatter step s: leader i sends segment i - s to
 * i + 1 and folds segment i - s - 1 from i - 1 (received first), so that after H - 1 steps it
 * holds segment i + 1 reduced in ring order i + 2, ..., i + 1 (every leader receives exactly
 * that value later). All-gather step s: it sends segment i + 1 - s on and copies segment i - s.
 */
static int ring_steps(uint32_t n, uint32_t i, struct tpc_plan_step *st)
{
	uint32_t next = (i + 1) % n, prev = (i + n - 1) % n, k = 0;

	for (uint32_t s = 0; s + 1 < n; s++, k++)
		st[k] = (struct tpc_plan_step){
			.send_to = (int32_t)next, .recv_from = (int32_t)prev,
			.send_seg = (i + n - s) % n, .send_nseg = 1,
			.recv_seg = (i + 2 * n - s - 1) % n, .recv_nseg = 1,
			.recv = TPC_PLAN_FOLD_LEFT,
		};
	for (uint32_t s = 0; s + 1 < n; s++, k++)
		st[k] = (struct tpc_plan_step){
			.send_to = (int32_t)next, .recv_from = (int32_t)prev,
			.send_seg = (i + 1 + n - s) % n, .send_nseg = 1,
			.recv_seg = (i + n - s) % n, .recv_nseg = 1,
			.recv = TPC_PLAN_COPY,
		};
	return (int)k;
}

/* A whole-tensor exchange step: send to @to (or -1), receive from @from (or -1). */
static struct tpc_plan_step whole(uint32_t n, int32_t to, int32_t from, enum tpc_plan_recv how)
{
	return (struct tpc_plan_step){
		.send_to = to, .recv_from = from, .send_nseg = to >= 0 ? n : 0,
		.recv_nseg = from >= 0 ? n : 0, .recv = from >= 0 ? how : TPC_PLAN_RECV_NONE,
	};
}

/*
 * Recursive doubling among H leaders, P the largest power of two <= H. The H - P extra leaders
 * (P..H-1) first send to leader i - P, which folds them after its own; the first P then swap
 * with i ^ 2^j for each j, the lower index's value first (both partners hold the same bits
 * afterwards); finally each extra leader gets the result from i - P.
 */
static int rd_steps(uint32_t n, uint32_t i, struct tpc_plan_step *st)
{
	uint32_t l, p = pow2_floor(n, &l), k = 0;
	bool extra = i >= p, helper = i < n - p;

	if (p < n)
		st[k++] = extra ? whole(n, (int32_t)(i - p), -1, TPC_PLAN_RECV_NONE)
				: whole(n, -1, helper ? (int32_t)(i + p) : -1, TPC_PLAN_FOLD_RIGHT);
	for (uint32_t j = 0; j < l; j++) {
		uint32_t peer = i ^ (1u << j);

		st[k++] = extra ? whole(n, -1, -1, TPC_PLAN_RECV_NONE)
				: whole(n, (int32_t)peer, (int32_t)peer,
					peer < i ? TPC_PLAN_FOLD_LEFT : TPC_PLAN_FOLD_RIGHT);
	}
	if (p < n)
		st[k++] = extra ? whole(n, -1, (int32_t)(i - p), TPC_PLAN_COPY)
				: whole(n, helper ? (int32_t)(i + p) : -1, -1, TPC_PLAN_RECV_NONE);
	return (int)k;
}

int tpc_plan_steps(uint32_t nhosts, enum tpc_plan_algo algo, uint32_t host,
		   struct tpc_plan_step *steps)
{
	if (host >= nhosts)
		return -EINVAL;
	if (nhosts == 1)
		return 0;
	if (algo == TPC_PLAN_RING)
		return ring_steps(nhosts, host, steps);
	if (algo == TPC_PLAN_RD)
		return rd_steps(nhosts, host, steps);
	return -EINVAL;
}

void tpc_plan_segment(size_t count, size_t es, uint32_t nseg, uint32_t seg, size_t *ret_off,
		      size_t *ret_n)
{
	size_t align = es && TPC_PLAN_ALIGN % es == 0 ? TPC_PLAN_ALIGN / es : 1;
	size_t per = (count + nseg - 1) / nseg, lo, hi;

	per = (per + align - 1) / align * align;
	lo = per * seg;
	hi = lo + per;
	lo = lo < count ? lo : count;
	hi = hi < count ? hi : count;
	*ret_off = lo;
	*ret_n = hi - lo;
}

size_t tpc_plan_xseg(size_t es, uint32_t nblocks)
{
	size_t per = es && nblocks ? TPC_PLAN_SEG / es / nblocks : 0;

	return per ? per : 1;
}

size_t tpc_plan_piece(const struct tpc_plan *p, uint32_t h, uint32_t i, size_t count, size_t off,
		      size_t es)
{
	return ((size_t)p->by_host[p->host_first[h] + i] * count + off) * es;
}

/* snprintf() at offset @o of @buf (@len bytes), counting on past the end as snprintf does. */
#define PUT_AT(o, ...) ((o) += (size_t)snprintf(buf + ((o) < len ? (o) : len), \
						(o) < len ? len - (o) : 0, __VA_ARGS__))
#define PUT(...) PUT_AT(o, __VA_ARGS__)

/* Appends the values @at(p, h) of the first 8 hosts to @buf at *@ro, comma-separated. */
static void list_put(const struct tpc_plan *p, uint32_t (*at)(const struct tpc_plan *, uint32_t),
		     char *buf, size_t len, size_t *ro)
{
	size_t o = *ro;

	for (uint32_t h = 0; h < p->nhosts && h < 8; h++)
		PUT("%s%u", h ? "," : "", at(p, h));
	if (p->nhosts > 8)
		PUT(",...");
	*ro = o;
}

int tpc_plan_describe(const struct tpc_plan *p, enum tpc_plan_algo force, char *buf, size_t len)
{
	uint32_t n = p->nhosts;
	size_t o = 0;

	PUT("%u host%s (members ", n, n == 1 ? "" : "s");
	list_put(p, tpc_plan_local_size, buf, len, &o);
	PUT("; leaders ");
	list_put(p, tpc_plan_leader, buf, len, &o);
	if (n == 1)
		PUT("); nothing crosses hosts");
	else if (force == TPC_PLAN_RING || force == TPC_PLAN_RD)
		PUT("); across hosts: %s at every size (%u steps)", tpc_plan_algo_name(force),
		    tpc_plan_nsteps(n, force));
	else
		PUT("); across hosts: recursive-doubling below %u bytes (%u steps), ring from "
		    "there (%u steps)", TPC_PLAN_RING_MIN, tpc_plan_nsteps(n, TPC_PLAN_RD),
		    tpc_plan_nsteps(n, TPC_PLAN_RING));
	if (n > 1)
		PUT("; collectives from %u bytes pipelined in %u-byte segments where the members "
		    "ask", TPC_PLAN_SEG_MIN, TPC_PLAN_SEG);
	return o > INT32_MAX ? INT32_MAX : (int)o;
}
