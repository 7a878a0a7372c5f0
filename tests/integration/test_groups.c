/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: groups and collectives on one host (docs/collectives.md). N = 1..8 member
 * processes join through one daemon (ranks given or assigned); all-reduce of every dtype and
 * operation, broadcast from every root, all-gather and reduce-scatter, over 0, 1, prime and
 * larger-than-a-chunk element counts, are checked against a reference the test computes in rank
 * order, and every rank's result is bitwise the same; a user reduction; asynchronous calls in
 * order; uneven steps (finished members contribute nothing, every member learns how many
 * did); a mismatched call fails on every rank with -EPROTO and the group goes on; a member
 * SIGKILLed inside a collective fails the survivors with -ECONNRESET naming it, with no hang,
 * and another group of the same user is untouched; a member that leaves fails the others' next
 * call; a join that misses members times out naming them; the daemon's group limits just below
 * and above; tpipctl groups shows members, plan and per-member counters; the daemon dying fails
 * pending and later collectives instead of leaving them waiting.
 */
#include <check.h>
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "frame.h"
#include "grouptest.h"
#include "grparena.h"
#include "../common/tpt_half.h"

#define T_MS 60000

static struct gt_shared *sh;

static void setup(void)
{
	tpt_fixture_start();
	sh = gt_shared_new();
	ck_assert_ptr_nonnull(sh);
}

static void teardown(void)
{
	gt_shared_free(sh);
	tpt_fixture_stop();
}

/* ---- reference arithmetic (independent of the library's kernels) -------------------------- */

static const enum tp_dtype dtypes[] = { TP_DTYPE_F16, TP_DTYPE_BF16, TP_DTYPE_F32, TP_DTYPE_F64,
					TP_DTYPE_I8, TP_DTYPE_U8, TP_DTYPE_I32, TP_DTYPE_I64 };
static const enum tp_reduce_op ops[] = { TP_OP_SUM, TP_OP_PROD, TP_OP_MIN, TP_OP_MAX };

static float bf16_f(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

static uint16_t f_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	if (isnan(f))
		return (uint16_t)((u >> 16) | 0x40);
	return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* binary16 by arithmetic (frexp/ldexp/nearbyint, round to nearest even), independent of the
 * library's bit twiddling and of the compiler's _Float16 (which clang lacks on some targets). */
static double fop(double a, double b, enum tp_reduce_op op)
{
	switch (op) {
	case TP_OP_SUM:
		return a + b;
	case TP_OP_PROD:
		return a * b;
	case TP_OP_MIN:
		return b < a ? b : a;
	default:
		return b > a ? b : a;
	}
}

static int64_t iop(int64_t a, int64_t b, enum tp_reduce_op op)
{
	switch (op) {
	case TP_OP_SUM:
		return (int64_t)((uint64_t)a + (uint64_t)b);
	case TP_OP_PROD:
		return (int64_t)((uint64_t)a * (uint64_t)b);
	case TP_OP_MIN:
		return b < a ? b : a;
	default:
		return b > a ? b : a;
	}
}

/* Element @i of rank @r's input: small values whose products over 8 ranks stay finite. */
static void input_elem(enum tp_dtype dt, unsigned r, size_t i, void *dst)
{
	int v = (int)((r * 7 + i * 13) % 17) - 8;
	float f = (float)v * 0.25f + 0.125f;

	switch (dt) {
	case TP_DTYPE_F16: {
		uint16_t h = ref_f2h(f);

		memcpy(dst, &h, 2);
		break;
	}
	case TP_DTYPE_BF16: {
		uint16_t h = f_bf16(f);

		memcpy(dst, &h, 2);
		break;
	}
	case TP_DTYPE_F32:
		memcpy(dst, &f, 4);
		break;
	case TP_DTYPE_F64: {
		double x = (double)f / 3.0;

		memcpy(dst, &x, 8);
		break;
	}
	case TP_DTYPE_I8:
		*(int8_t *)dst = (int8_t)(v * 15);
		break;
	case TP_DTYPE_U8:
		*(uint8_t *)dst = (uint8_t)(v * 29 + 7);
		break;
	case TP_DTYPE_I32: {
		int32_t x = v * 100003;

		memcpy(dst, &x, 4);
		break;
	}
	case TP_DTYPE_I64: {
		int64_t x = (int64_t)v * 1000000007ll + (int64_t)i;

		memcpy(dst, &x, 8);
		break;
	}
	}
}

/* acc = acc op in, one element, as the documented semantics say (rank order is the caller's). */
static void ref_fold(enum tp_dtype dt, enum tp_reduce_op op, void *acc, const void *in)
{
	switch (dt) {
	case TP_DTYPE_F16: {
		uint16_t a, b;

		memcpy(&a, acc, 2);
		memcpy(&b, in, 2);
		a = ref_f2h((float)fop(ref_h2f(a), ref_h2f(b), op));
		memcpy(acc, &a, 2);
		break;
	}
	case TP_DTYPE_BF16: {
		uint16_t a, b;

		memcpy(&a, acc, 2);
		memcpy(&b, in, 2);
		a = f_bf16((float)fop(bf16_f(a), bf16_f(b), op));
		memcpy(acc, &a, 2);
		break;
	}
	case TP_DTYPE_F32: {
		float a, b;

		memcpy(&a, acc, 4);
		memcpy(&b, in, 4);
		switch (op) { /* float arithmetic, not double */
		case TP_OP_SUM:
			a = a + b;
			break;
		case TP_OP_PROD:
			a = a * b;
			break;
		default:
			a = (float)fop(a, b, op);
		}
		memcpy(acc, &a, 4);
		break;
	}
	case TP_DTYPE_F64: {
		double a, b;

		memcpy(&a, acc, 8);
		memcpy(&b, in, 8);
		a = fop(a, b, op);
		memcpy(acc, &a, 8);
		break;
	}
	case TP_DTYPE_I8:
		*(int8_t *)acc = (int8_t)iop(*(int8_t *)acc, *(const int8_t *)in, op);
		break;
	case TP_DTYPE_U8:
		*(uint8_t *)acc = (uint8_t)iop(*(uint8_t *)acc, *(const uint8_t *)in, op);
		break;
	case TP_DTYPE_I32: {
		int32_t a, b;

		memcpy(&a, acc, 4);
		memcpy(&b, in, 4);
		a = (int32_t)iop(a, b, op);
		memcpy(acc, &a, 4);
		break;
	}
	case TP_DTYPE_I64: {
		int64_t a, b;

		memcpy(&a, acc, 8);
		memcpy(&b, in, 8);
		a = iop(a, b, op);
		memcpy(acc, &a, 8);
		break;
	}
	}
}

/* The reference all-reduce of @n ranks' inputs at element offset @base: rank order. */
static void *ref_allreduce(enum tp_dtype dt, enum tp_reduce_op op, unsigned n, size_t count,
			   size_t base)
{
	size_t es = tp_dtype_size(dt);
	uint8_t *out = malloc(count * es + 1), tmp[8];

	for (size_t i = 0; i < count; i++) {
		input_elem(dt, 0, base + i, out + i * es);
		for (unsigned r = 1; r < n; r++) {
			input_elem(dt, r, base + i, tmp);
			ref_fold(dt, op, out + i * es, tmp);
		}
	}
	return out;
}

static void *make_input(enum tp_dtype dt, unsigned r, size_t count)
{
	size_t es = tp_dtype_size(dt);
	uint8_t *p = malloc(count * es + 1);

	for (size_t i = 0; i < count; i++)
		input_elem(dt, r, i, p + i * es);
	return p;
}

static int mfail(struct gt_member *m, int r, const char *what)
{
	fprintf(stderr, "rank %d: %s: %d %s\n", tp_group_rank(m->g), what, r, tp_last_error());
	return 1;
}

/* ---- join ---------------------------------------------------------------------------------- */

static int body_join(struct gt_member *m)
{
	int r = tp_barrier(m->g);

	if (r < 0)
		return mfail(m, r, "barrier");
	if (tp_group_size(m->g) != (int)m->n || tp_group_local_size(m->g) != (int)m->n ||
	    tp_group_local_rank(m->g) != tp_group_rank(m->g) || tp_group_host_index(m->g) != 0 ||
	    tp_group_hosts(m->g) != 1) {
		fprintf(stderr, "member %u: size %d local %d/%d host %d/%d\n", m->idx,
			tp_group_size(m->g), tp_group_local_rank(m->g), tp_group_local_size(m->g),
			tp_group_host_index(m->g), tp_group_hosts(m->g));
		return 1;
	}
	return tp_barrier(m->g) < 0;
}

START_TEST(test_join_one_to_eight_ranks_given_and_assigned)
{
	for (unsigned n = 1; n <= GT_MAX; n++) {
		for (int assign = 0; assign < 2; assign++) {
			unsigned seen = 0;

			memset(sh, 0, sizeof(*sh));
			ck_assert_msg(gt_run(&tpt_fixture_daemon, "join", n, assign, body_join, NULL,
					     sh, T_MS), "n=%u assign=%d", n, assign);
			for (unsigned i = 0; i < n; i++) {
				ck_assert_int_lt(sh->rank_of[i], (int)n);
				if (!assign)
					ck_assert_int_eq(sh->rank_of[i], (int)i);
				seen |= 1u << sh->rank_of[i];
			}
			ck_assert_uint_eq(seen, (1u << n) - 1); /* every rank once */
		}
	}
}
END_TEST

/* ---- all-reduce of every dtype and op ------------------------------------------------------ */

static const size_t counts[] = { 0, 1, 7, 1021, 262147 }; /* 262147 f32: over a 1 MiB chunk */

static int check_allreduce(struct gt_member *m, enum tp_dtype dt, enum tp_reduce_op op,
			   size_t count, unsigned slot, bool in_place)
{
	size_t es = tp_dtype_size(dt);
	uint8_t *in = make_input(dt, (unsigned)tp_group_rank(m->g), count);
	uint8_t *out = in_place ? in : malloc(count * es + 1);
	uint8_t *ref = ref_allreduce(dt, op, m->n, count, 0);
	int r = tp_allreduce(m->g, in, out, count, dt, op), bad = 0;

	if (r < 0)
		bad = mfail(m, r, "allreduce");
	else if (memcmp(out, ref, count * es) != 0) {
		for (size_t i = 0; i < count; i++)
			if (memcmp(out + i * es, ref + i * es, es)) {
				fprintf(stderr, "rank %d dtype %d op %d count %zu: element %zu "
					"differs from the reference\n", tp_group_rank(m->g), dt, op,
					count, i);
				break;
			}
		bad = 1;
	}
	sh->hash[m->idx][slot % 64] ^= gt_hash(out, count * es) + slot;
	if (!in_place)
		free(out);
	free(in);
	free(ref);
	return bad;
}

static int body_every_dtype_op(struct gt_member *m)
{
	unsigned slot = 0;
	int bad = 0;

	for (size_t d = 0; d < GT_ARRAY_SIZE(dtypes); d++)
		for (size_t o = 0; o < GT_ARRAY_SIZE(ops); o++)
			for (size_t c = 0; c < GT_ARRAY_SIZE(counts); c++)
				bad |= check_allreduce(m, dtypes[d], ops[o], counts[c], slot++,
						       c == 2);
	return bad;
}

static void assert_same_hashes(unsigned n)
{
	for (unsigned i = 1; i < n; i++)
		ck_assert_msg(memcmp(sh->hash[0], sh->hash[i], sizeof(sh->hash[0])) == 0,
			      "member %u's results differ from member 0's", i);
}

START_TEST(test_allreduce_every_dtype_and_op_matches_reference)
{
	ck_assert(gt_run(&tpt_fixture_daemon, "dtypes", 3, false, body_every_dtype_op, NULL, sh,
			 T_MS * 2));
	assert_same_hashes(3);
}
END_TEST

static int body_sums(struct gt_member *m)
{
	static const size_t c2[] = { 0, 1, 2, 3, 31, 4099, 524309 };
	unsigned slot = 0;
	int bad = 0;

	for (size_t c = 0; c < GT_ARRAY_SIZE(c2); c++) {
		bad |= check_allreduce(m, TP_DTYPE_F32, TP_OP_SUM, c2[c], slot++, false);
		bad |= check_allreduce(m, TP_DTYPE_F64, TP_OP_SUM, c2[c], slot++, true);
	}
	return bad;
}

START_TEST(test_allreduce_f32_f64_sum_one_to_eight_ranks_bitwise_equal)
{
	for (unsigned n = 1; n <= GT_MAX; n++) {
		memset(sh, 0, sizeof(*sh));
		ck_assert_msg(gt_run(&tpt_fixture_daemon, "sums", n, n % 2, body_sums, NULL, sh,
				     T_MS), "n=%u", n);
		assert_same_hashes(n);
	}
}
END_TEST

/* ---- members whose libraries offer different features ------------------------------------- */

/* Around the paths' bounds for 2 to 4 members: the direct path (64 KiB over all slots), the
 * 256 KiB step after the first chunk, the 1 MiB chunk, several chunks. */
static int body_mixed(struct gt_member *m)
{
	static const size_t c4[] = { 1, 31, 4099, 8192, 16385, 65537, 262147, 600001 };
	unsigned slot = 0;
	int bad = 0;

	for (size_t c = 0; c < GT_ARRAY_SIZE(c4); c++) {
		bad |= check_allreduce(m, TP_DTYPE_F32, TP_OP_SUM, c4[c], slot++, false);
		bad |= check_allreduce(m, TP_DTYPE_F64, TP_OP_SUM, c4[c], slot++, true);
		bad |= check_allreduce(m, TP_DTYPE_BF16, TP_OP_MAX, c4[c], slot++, false);
	}
	return bad;
}

/*
 * Members of one group whose libraries offer different algorithm features (as libraries of
 * other versions do; TP_GROUP_FEATURES_OFF makes a member offer less): every call takes the
 * paths every member offers, and every rank gets the reference's bits. Each member copies its
 * first chunk in before it learns what the others offer, so a member taking a path the others
 * do not would read slots they never filled.
 */
START_TEST(test_members_offering_different_features_agree)
{
	static const struct {
		unsigned n;
		const char *off[4];
	} mix[] = {
		{ 2, { "all", "" } },
		{ 2, { "", "direct" } },
		{ 2, { "step", "" } },
		{ 3, { "", "direct,step", "" } },
		{ 4, { "", "", "", "all" } },
		{ 4, { "direct", "", "step", "" } },
	};

	for (size_t k = 0; k < GT_ARRAY_SIZE(mix); k++) {
		memset(sh, 0, sizeof(*sh));
		for (unsigned i = 0; i < mix[k].n; i++)
			snprintf(sh->features_off[i], sizeof(sh->features_off[i]), "%s",
				 mix[k].off[i]);
		ck_assert_msg(gt_run(&tpt_fixture_daemon, "mixed", mix[k].n, false, body_mixed,
				     NULL, sh, T_MS * 2),
			      "mix %zu (%u members)", k, mix[k].n);
		assert_same_hashes(mix[k].n);
	}
}
END_TEST

/* A word TP_GROUP_FEATURES_OFF does not know fails the join with -EINVAL naming it. */
START_TEST(test_features_off_unknown_word_fails_the_join)
{
	struct tp_group_options o = { .size = sizeof(o), .rank = 0, .nranks = 1 };
	struct tp_context *ctx;
	struct tp_group *g;

	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, NULL, &ctx), 0);
	setenv("TP_GROUP_FEATURES_OFF", "step,warp", 1);
	ck_assert_int_eq(tp_group_join(ctx, "feat", &o, &g), -EINVAL);
	ck_assert_msg(strstr(tp_last_error(), "'warp'"), "%s", tp_last_error());
	setenv("TP_GROUP_FEATURES_OFF", "step,,lfold,", 1); /* empty words are nothing */
	ck_assert_int_eq(tp_group_join(ctx, "feat", &o, &g), 0);
	tp_group_leave(g);
	unsetenv("TP_GROUP_FEATURES_OFF");
	tp_context_free(ctx);
}
END_TEST

/*
 * Members whose kernels are different builds (TP_REDUCE_ISA=generic beside the AVX2 build, as
 * on hosts of different CPUs) fold their slices each with its own and get the reference's bits,
 * every dtype and op, on 2 to 4 members. Where the CPU lacks AVX2 or F16C every member runs the
 * baseline and this says so.
 */
START_TEST(test_members_on_different_kernel_builds_agree)
{
	static const struct {
		unsigned n;
		const char *isa[4];
	} mix[] = {
		{ 2, { "generic", "" } },
		{ 3, { "", "generic", "avx2" } },
		{ 4, { "generic", "", "generic", "" } },
	};
	struct tp_group_options o = { .size = sizeof(o), .rank = 0, .nranks = 1 };
	struct tp_context *ctx;
	struct tp_group *g;
	int avx2;

	/* does this library and CPU have the AVX2 build? a join asking for it says */
	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, NULL, &ctx), 0);
	setenv("TP_REDUCE_ISA", "avx2", 1);
	avx2 = tp_group_join(ctx, "isa-probe", &o, &g) == 0;
	unsetenv("TP_REDUCE_ISA");
	if (avx2)
		tp_group_leave(g);
	else
		printf("groups: no AVX2 kernels here (%s): every member runs the baseline's\n",
		       tp_last_error());
	tp_context_free(ctx);
	for (size_t k = 0; k < GT_ARRAY_SIZE(mix); k++) {
		memset(sh, 0, sizeof(*sh));
		for (unsigned i = 0; i < mix[k].n; i++)
			snprintf(sh->reduce_isa[i], sizeof(sh->reduce_isa[i]), "%s",
				 avx2 ? mix[k].isa[i] : "generic");
		ck_assert_msg(gt_run(&tpt_fixture_daemon, "isa", mix[k].n, false,
				     body_every_dtype_op, NULL, sh, T_MS * 2),
			      "mix %zu (%u members)", k, mix[k].n);
		assert_same_hashes(mix[k].n);
	}
}
END_TEST

/* A TP_REDUCE_ISA the library does not know fails the join with -EINVAL naming it; "generic"
 * and "auto" join. */
START_TEST(test_reduce_isa_unknown_value_fails_the_join)
{
	struct tp_group_options o = { .size = sizeof(o), .rank = 0, .nranks = 1 };
	struct tp_context *ctx;
	struct tp_group *g;

	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, NULL, &ctx), 0);
	setenv("TP_REDUCE_ISA", "sse9", 1);
	ck_assert_int_eq(tp_group_join(ctx, "isa", &o, &g), -EINVAL);
	ck_assert_msg(strstr(tp_last_error(), "'sse9'"), "%s", tp_last_error());
	setenv("TP_REDUCE_ISA", "generic", 1);
	ck_assert_int_eq(tp_group_join(ctx, "isa", &o, &g), 0);
	tp_group_leave(g);
	setenv("TP_REDUCE_ISA", "auto", 1);
	ck_assert_int_eq(tp_group_join(ctx, "isa", &o, &g), 0);
	tp_group_leave(g);
	unsetenv("TP_REDUCE_ISA");
	tp_context_free(ctx);
}
END_TEST

/* ---- user reduction ------------------------------------------------------------------------ */

/* a = 2a + b (not commutative: the order shows) */
static void user_fold(void *inout, const void *in, size_t count, enum tp_dtype dt, void *user)
{
	int64_t *a = inout;
	const int64_t *b = in;

	(void)dt;
	(*(int *)user)++;
	for (size_t i = 0; i < count; i++)
		a[i] = 2 * a[i] + b[i];
}

static int user_once(struct gt_member *m, size_t count)
{
	int64_t *in = malloc(count * 8), *out = malloc(count * 8);
	int calls = 0, r, bad = 0;

	for (size_t i = 0; i < count; i++)
		in[i] = (int64_t)(i % 1000) * (tp_group_rank(m->g) + 1);
	r = tp_allreduce_fn(m->g, in, out, count, TP_DTYPE_I64, user_fold, &calls);
	if (r < 0)
		bad = mfail(m, r, "allreduce_fn");
	for (size_t i = 0; !bad && i < count; i++) {
		int64_t want = (int64_t)(i % 1000);

		for (unsigned q = 1; q < m->n; q++)
			want = 2 * want + (int64_t)(i % 1000) * (q + 1);
		if (out[i] != want) {
			fprintf(stderr, "user fold: element %zu %lld want %lld\n", i,
				(long long)out[i], (long long)want);
			bad = 1;
		}
	}
	if (m->n > 1 && calls == 0) {
		fprintf(stderr, "the user function was never called on rank %d (%zu elements)\n",
			tp_group_rank(m->g), count);
		bad = 1;
	}
	free(in);
	free(out);
	return bad;
}

/* Over a chunk (and over several 256 KiB steps after a 1 MiB first chunk), and on both sides of
 * the one-barrier path's size (TPC_COLL_DIRECT_MAX over all slots: 2048 i64 elements for 4
 * members) */
static int body_user(struct gt_member *m)
{
	static const size_t uc[] = { 100003, 300007, 1, 1000, 2047, 2048, 2049, 4099 };
	int bad = 0;

	for (size_t i = 0; i < GT_ARRAY_SIZE(uc); i++)
		bad |= user_once(m, uc[i]);
	return bad;
}

START_TEST(test_allreduce_user_function_in_rank_order)
{
	ck_assert(gt_run(&tpt_fixture_daemon, "user", 4, false, body_user, NULL, sh, T_MS));
}
END_TEST

/* ---- uneven steps ------------------------------------------------------------------------- */

/* Rank r takes r + 1 steps; each step all-reduces (sum) a vector of r + 1 + step; a rank that
 * has finished calls with send NULL until every rank has (0 contributors). */
static int uneven_once(struct gt_member *m, size_t count)
{
	int me = tp_group_rank(m->g), step = 0, bad = 0;
	float *in = malloc(count * 4), *out = malloc(count * 4);

	for (;; step++) {
		unsigned contrib = 99, want = 0;
		float sum = 0;
		bool mine = step < me + 1;
		int r;

		for (unsigned q = 0; q < m->n; q++)
			if (step < (int)q + 1) {
				want++;
				sum += (float)(q + 1 + (unsigned)step);
			}
		for (size_t i = 0; mine && i < count; i++)
			in[i] = (float)(me + 1 + step);
		out[0] = out[count - 1] = -1;
		r = tp_allreduce_uneven(m->g, mine ? in : NULL, out, count, TP_DTYPE_F32, TP_OP_SUM,
					&contrib);
		if (r < 0)
			return mfail(m, r, "allreduce_uneven");
		if (contrib != want || (want && (out[0] != sum || out[count - 1] != sum)) ||
		    (!want && out[0] != -1)) {
			fprintf(stderr, "rank %d step %d (%zu elements): %u contributors (want %u), "
				"%g (want %g)\n", me, step, count, contrib, want, out[0], sum);
			bad = 1;
		}
		if (contrib == 0)
			break;
	}
	if (step != (int)m->n) {
		fprintf(stderr, "rank %d stopped after %d steps\n", me, step);
		bad = 1;
	}
	free(in);
	free(out);
	return bad;
}

/* Over a chunk, and on both sides of the one-barrier path's size (4096 f32 elements for 4) */
static int body_uneven(struct gt_member *m)
{
	static const size_t uc[] = { 300007, 1, 4095, 4096, 4097 };
	int bad = 0;

	for (size_t i = 0; i < GT_ARRAY_SIZE(uc); i++)
		bad |= uneven_once(m, uc[i]);
	return bad;
}

START_TEST(test_uneven_steps_count_contributors)
{
	ck_assert(gt_run(&tpt_fixture_daemon, "uneven", 4, false, body_uneven, NULL, sh, T_MS));
}
END_TEST

/* ---- broadcast, all-gather, reduce-scatter ------------------------------------------------- */

static int body_others(struct gt_member *m)
{
	static const size_t cs[] = { 0, 1, 13, 300007 };
	unsigned me = (unsigned)tp_group_rank(m->g), n = m->n;
	int bad = 0, r;

	for (size_t c = 0; c < GT_ARRAY_SIZE(cs); c++) {
		size_t count = cs[c];

		for (unsigned root = 0; root < n; root++) {
			float *buf = make_input(TP_DTYPE_F32, me, count);
			float *want = make_input(TP_DTYPE_F32, root, count);

			r = tp_broadcast(m->g, buf, count, TP_DTYPE_F32, (int)root);
			if (r < 0 || memcmp(buf, want, count * 4))
				bad |= r < 0 ? mfail(m, r, "broadcast") : 1;
			free(buf);
			free(want);
		}
		{
			int32_t *in = make_input(TP_DTYPE_I32, me, count);
			int32_t *out = malloc(n * count * 4 + 1);

			r = tp_allgather(m->g, in, out, count, TP_DTYPE_I32);
			if (r < 0)
				bad |= mfail(m, r, "allgather");
			for (unsigned q = 0; r == 0 && q < n; q++) {
				int32_t *w = make_input(TP_DTYPE_I32, q, count);

				if (memcmp(out + q * count, w, count * 4)) {
					fprintf(stderr, "allgather: rank %u's part differs\n", q);
					bad = 1;
				}
				free(w);
			}
			sh->hash[m->idx][c] = gt_hash(out, n * count * 4);
			free(in);
			free(out);
		}
		{
			/* rank r's send: n parts, part p = the reference inputs at p * count */
			double *in = malloc(n * count * 8 + 8), *out = malloc(count * 8 + 8);
			double *ref = ref_allreduce(TP_DTYPE_F64, TP_OP_SUM, n, count, me * count);

			for (size_t i = 0; i < n * count; i++)
				input_elem(TP_DTYPE_F64, me, i, &in[i]);
			r = tp_reduce_scatter(m->g, in, out, count, TP_DTYPE_F64, TP_OP_SUM);
			if (r < 0)
				bad |= mfail(m, r, "reduce_scatter");
			else if (memcmp(out, ref, count * 8)) {
				fprintf(stderr, "reduce_scatter: rank %u differs (count %zu)\n", me,
					count);
				bad = 1;
			}
			free(in);
			free(out);
			free(ref);
		}
	}
	return bad;
}

START_TEST(test_broadcast_allgather_reduce_scatter)
{
	for (unsigned n = 1; n <= 4; n++) {
		memset(sh, 0, sizeof(*sh));
		ck_assert_msg(gt_run(&tpt_fixture_daemon, "others", n, false, body_others, NULL, sh,
				     T_MS), "n=%u", n);
		assert_same_hashes(n);
	}
}
END_TEST

/* ---- asynchronous calls -------------------------------------------------------------------- */

static int body_async(struct gt_member *m)
{
	enum { K = 6 };
	size_t count = 200003;
	float *in[K], *out[K];
	struct tp_coll_req *q[K + 1];
	int bad = 0, r;

	for (int k = 0; k < K; k++) {
		in[k] = make_input(TP_DTYPE_F32, (unsigned)tp_group_rank(m->g) + (unsigned)k, count);
		out[k] = malloc(count * 4);
		r = tp_allreduce_start(m->g, in[k], out[k], count, TP_DTYPE_F32, TP_OP_SUM, &q[k]);
		if (r < 0)
			return mfail(m, r, "allreduce_start");
	}
	r = tp_barrier_start(m->g, &q[K]);
	if (r < 0)
		return mfail(m, r, "barrier_start");
	r = tp_barrier(m->g); /* a blocking call runs after the queued ones */
	if (r < 0 || tp_coll_test(q[K]) != 1)
		bad |= r < 0 ? mfail(m, r, "barrier") : 1;
	for (int k = K; k >= 0; k--) {
		r = tp_coll_wait(q[k]);
		if (r < 0)
			bad |= mfail(m, r, "wait");
	}
	for (int k = 0; k < K; k++) {
		float *ref = malloc(count * 4), *tmp = make_input(TP_DTYPE_F32, (unsigned)k, count);

		memcpy(ref, tmp, count * 4);
		for (unsigned q2 = 1; q2 < m->n; q2++) {
			float *o = make_input(TP_DTYPE_F32, q2 + (unsigned)k, count);

			for (size_t i = 0; i < count; i++)
				ref[i] = ref[i] + o[i];
			free(o);
		}
		if (memcmp(ref, out[k], count * 4)) {
			fprintf(stderr, "async allreduce %d differs\n", k);
			bad = 1;
		}
		free(ref);
		free(tmp);
		free(in[k]);
		free(out[k]);
	}
	return bad;
}

START_TEST(test_async_calls_complete_in_order)
{
	ck_assert(gt_run(&tpt_fixture_daemon, "async", 3, false, body_async, NULL, sh, T_MS));
}
END_TEST

/* ---- mismatched calls ---------------------------------------------------------------------- */

static int body_mismatch(struct gt_member *m)
{
	float buf[64] = { 0 };
	int me = tp_group_rank(m->g), r, bad = 0;

	/* rank 1 calls broadcast where the others call allreduce */
	if (me == 1)
		r = tp_broadcast(m->g, buf, 64, TP_DTYPE_F32, 0);
	else
		r = tp_allreduce(m->g, buf, buf, 64, TP_DTYPE_F32, TP_OP_SUM);
	sh->status[m->idx][0] = r;
	snprintf(sh->msg[m->idx], sizeof(sh->msg[0]), "%s", tp_last_error());
	/* a count that differs on the last rank */
	r = tp_allreduce(m->g, buf, buf, me == (int)m->n - 1 ? 63 : 64, TP_DTYPE_F32, TP_OP_SUM);
	sh->status[m->idx][1] = r;
	/* another dtype */
	r = tp_allreduce(m->g, buf, buf, 16, me == 0 ? TP_DTYPE_I32 : TP_DTYPE_F32, TP_OP_SUM);
	sh->status[m->idx][2] = r;
	/* the group goes on */
	r = tp_allreduce(m->g, buf, buf, 64, TP_DTYPE_F32, TP_OP_SUM);
	if (r < 0)
		bad = mfail(m, r, "allreduce after mismatches");
	return bad;
}

START_TEST(test_mismatched_calls_fail_on_every_rank)
{
	ck_assert(gt_run(&tpt_fixture_daemon, "mismatch", 3, false, body_mismatch, NULL, sh,
			 T_MS));
	for (unsigned i = 0; i < 3; i++) {
		for (unsigned k = 0; k < 3; k++)
			ck_assert_int_eq(sh->status[i][k], -EPROTO);
		ck_assert_msg(strstr(sh->msg[i], "mismatched collective") &&
			      strstr(sh->msg[i], "broadcast") && strstr(sh->msg[i], "allreduce"),
			      "message: %s", sh->msg[i]);
	}
}
END_TEST

/* ---- a member killed inside a collective --------------------------------------------------- */

static struct tpt_sync in_fold;

/* rank 2's reduction: says it is inside the collective, then waits to be killed */
static void fold_then_hang(void *inout, const void *in, size_t count, enum tp_dtype dt,
			   void *user)
{
	(void)inout;
	(void)in;
	(void)count;
	(void)dt;
	(void)user;
	tpt_sync_post(&in_fold, 0);
	for (;;)
		pause();
}

static void fold_sum(void *inout, const void *in, size_t count, enum tp_dtype dt, void *user)
{
	float *a = inout;
	const float *b = in;

	(void)user;
	(void)dt;
	for (size_t i = 0; i < count; i++)
		a[i] += b[i];
}

static int body_killed(struct gt_member *m)
{
	size_t count = 1 << 20;
	float *buf = calloc(count, 4);
	int me = tp_group_rank(m->g), r;

	/* every member's reduction is a user function; rank 2's hangs inside its first slice */
	r = tp_allreduce_fn(m->g, buf, buf, count, TP_DTYPE_F32,
			    me == 2 ? fold_then_hang : fold_sum, NULL);
	sh->status[m->idx][0] = r;
	snprintf(sh->msg[m->idx], sizeof(sh->msg[0]), "%s", tp_last_error());
	/* a later call fails the same way, at once */
	sh->status[m->idx][1] = tp_barrier(m->g);
	free(buf);
	return 0;
}

static int body_bystander(struct gt_member *m)
{
	struct tpt_sync *go = m->arg;
	int r;

	if (tpt_sync_wait(go, T_MS) < 0)
		return 1;
	r = tp_barrier(m->g);
	if (r == 0)
		r = tp_allreduce(m->g, (float[4]){ 1, 2, 3, 4 }, (float[4]){ 0 }, 4, TP_DTYPE_F32,
				 TP_OP_SUM);
	return r < 0 ? mfail(m, r, "bystander group") : 0;
}

static int run_bystanders(void *arg)
{
	struct gt_shared *own = gt_shared_new();

	return gt_run(&tpt_fixture_daemon, "bystander", 2, false, body_bystander, arg, own,
		      T_MS) ? 0 : 1;
}

START_TEST(test_member_killed_mid_collective_fails_survivors)
{
	struct tpt_sync go;
	pid_t pids[3], by;
	int status;

	ck_assert_int_eq(tpt_sync_init(&in_fold), 0);
	ck_assert_int_eq(tpt_sync_init(&go), 0);
	by = tpt_fork(run_bystanders, &go);
	for (unsigned i = 0; i < 3; i++) {
		static struct gt_member m[3];

		m[i] = (struct gt_member){ .d = &tpt_fixture_daemon, .name = "killed", .idx = i,
					   .n = 3, .rank_ask = (int)i, .join_ms = T_MS, .sh = sh,
					   .body = body_killed };
		pids[i] = tpt_fork(gt_member_main, &m[i]);
		ck_assert_int_gt(pids[i], 0);
	}
	ck_assert_int_eq(tpt_sync_wait(&in_fold, T_MS), 0); /* rank 2 is inside the all-reduce */
	kill(pids[2], SIGKILL);
	ck_assert_int_eq(tpt_wait(pids[2], T_MS, &status), 0);
	for (unsigned i = 0; i < 2; i++) {
		ck_assert(tpt_wait_ok(pids[i], T_MS, "survivor"));
		ck_assert_int_eq(sh->status[i][0], -ECONNRESET);
		ck_assert_int_eq(sh->status[i][1], -ECONNRESET);
		ck_assert_msg(strstr(sh->msg[i], "rank 2") && strstr(sh->msg[i], "died"),
			      "message: %s", sh->msg[i]);
	}
	/* another group of the same user is untouched */
	tpt_sync_post(&go, 0);
	tpt_sync_post(&go, 0);
	ck_assert(tpt_wait_ok(by, T_MS, "bystanders"));
	tpt_sync_done(&go);
	tpt_sync_done(&in_fold);
}
END_TEST

/* ---- leaving, join timeout ----------------------------------------------------------------- */

static int body_leave(struct gt_member *m)
{
	int me = tp_group_rank(m->g), r;

	if (tp_barrier(m->g) < 0)
		return 1;
	if (me == 0)
		return 0; /* leaves (gt_member_main) */
	r = tp_barrier(m->g);
	sh->status[m->idx][0] = r;
	snprintf(sh->msg[m->idx], sizeof(sh->msg[0]), "%s", tp_last_error());
	return 0;
}

START_TEST(test_member_leaving_fails_the_others_next_call)
{
	ck_assert(gt_run(&tpt_fixture_daemon, "leave", 3, false, body_leave, NULL, sh, T_MS));
	for (unsigned i = 1; i < 3; i++) {
		ck_assert_int_eq(sh->status[i][0], -EPIPE);
		ck_assert_msg(strstr(sh->msg[i], "rank 0") && strstr(sh->msg[i], "left"),
			      "message: %s", sh->msg[i]);
	}
}
END_TEST

/* Every member exits without leaving: the last session's end frees the group (reading none of
 * it afterwards: a use after free here took the daemon down under AddressSanitizer), and the
 * name serves a new group. */
static int body_exit_unleft(struct gt_member *m)
{
	if (tp_barrier(m->g) < 0)
		return 1;
	_exit(0);
}

static int body_barrier(struct gt_member *m)
{
	return tp_barrier(m->g) < 0;
}

/* Barriers where the others have gone to sleep (a member arrives 3 ms late, in turn), then many
 * back to back on more members than CPUs, where they spin, yield and sleep in every mix: the
 * last to arrive wakes only the members that counted themselves asleep, and none is missed. */
static int body_late_barriers(struct gt_member *m)
{
	for (unsigned i = 0; i < 60; i++) {
		if (i % m->n == m->idx)
			usleep(3000);
		if (tp_barrier(m->g) < 0)
			return mfail(m, -EIO, "late barrier");
	}
	for (unsigned i = 0; i < 3000; i++)
		if (tp_barrier(m->g) < 0)
			return mfail(m, -EIO, "barrier");
	return 0;
}

START_TEST(test_barriers_wake_the_sleepers_and_no_one_else)
{
	ck_assert(gt_run(&tpt_fixture_daemon, "sleepy", 2, false, body_late_barriers, NULL, sh, T_MS));
	ck_assert(gt_run(&tpt_fixture_daemon, "sleepy", 4, false, body_late_barriers, NULL, sh, T_MS));
}
END_TEST

START_TEST(test_members_exiting_without_leaving_free_the_group)
{
	ck_assert(gt_run(&tpt_fixture_daemon, "unleft", 3, false, body_exit_unleft, NULL, sh, T_MS));
	ck_assert(gt_run(&tpt_fixture_daemon, "unleft", 2, false, body_barrier, NULL, sh, T_MS));
	ck_assert_msg(tpt_daemon_alive(&tpt_fixture_daemon), "tpipd died");
}
END_TEST

/* A member on the socket (TP_CONTEXT_NO_RING) or on a control ring: the arena's memfd comes
 * with its GroupJoined either way. Members 0 and 2 on the socket, 1 on a ring. */
static int socket_member(void *arg)
{
	unsigned idx = (unsigned)(uintptr_t)arg;
	struct tp_group_options o = { .size = sizeof(o), .rank = (int)idx, .nranks = 3 };
	double in[1000], out[1000];
	struct tp_context *ctx;
	struct tp_group *g;
	int r, bad = 0;

	TPT_REQUIRE(tpt_ctx_new(&tpt_fixture_daemon, idx == 1 ? 0 : TP_CONTEXT_NO_RING, NULL,
				&ctx) == 0, 2, "context: %s", tp_last_error());
	r = tp_group_join(ctx, "socket", &o, &g);
	TPT_REQUIRE(r == 0, 3, "member %u: join: %s", idx, tp_last_error());
	for (size_t i = 0; i < 1000; i++)
		in[i] = (double)(idx * 1000 + i);
	r = tp_allreduce(g, in, out, 1000, TP_DTYPE_F64, TP_OP_SUM);
	TPT_REQUIRE(r == 0, 4, "member %u: all-reduce: %s", idx, tp_last_error());
	for (size_t i = 0; i < 1000; i++)
		bad |= out[i] != (double)(3000 + 3 * i);
	tp_group_leave(g);
	tp_context_free(ctx);
	return bad;
}

START_TEST(test_members_on_the_socket_get_the_arena_too)
{
	pid_t p[3];

	for (unsigned i = 0; i < 3; i++)
		p[i] = tpt_fork(socket_member, (void *)(uintptr_t)i);
	for (unsigned i = 0; i < 3; i++)
		ck_assert(tpt_wait_ok(p[i], T_MS, "member"));
}
END_TEST

/* ---- a daemon that hands over an arena the library must not map ---------------------------- */

/* What the stand-in daemon answers a GroupJoin with: an older daemon's path, a memfd that is
 * not sealed, a sealed one of another size than announced. */
enum fake_arena { FAKE_PATH, FAKE_UNSEALED, FAKE_SIZE };

struct fake_daemon {
	char path[108];
	int lfd, fd;
	enum fake_arena kind;
};

static int fake_recv(int fd, Tpw__V1__ClientMsg **ret)
{
	uint8_t hb[TPW_HDR_SIZE], *body;
	struct tpw_hdr h;
	int r;

	if (recv(fd, hb, sizeof(hb), MSG_WAITALL) != (ssize_t)sizeof(hb) ||
	    tpw_hdr_parse(hb, TPW_FRAME_MAX_HARD, &h) < 0)
		return -EIO;
	body = malloc((size_t)h.msg_len + h.data_len + 1);
	if (!body)
		return -ENOMEM;
	r = recv(fd, body, (size_t)h.msg_len + h.data_len, MSG_WAITALL) ==
			    (ssize_t)(h.msg_len + h.data_len)
		    ? tpw_client_msg_unpack(body, h.msg_len, ret)
		    : -EIO;
	free(body);
	return r < 0 ? r : 0;
}

/* Sends @m on @fd, with @afd (>= 0) attached to its first byte. */
static void fake_send(int fd, Tpw__V1__DaemonMsg *m, int afd)
{
	static uint64_t seq;
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} cm = { 0 };
	uint8_t buf[4096];
	struct iovec iov = { buf, tpw_frame_pack(&m->base, 0, 0, ++seq, buf) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (afd >= 0) {
		mh.msg_control = cm.b;
		mh.msg_controllen = sizeof(cm.b);
		cm.h.cmsg_level = SOL_SOCKET;
		cm.h.cmsg_type = SCM_RIGHTS;
		cm.h.cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(&cm.h), &afd, sizeof(int));
	}
	ck_assert_int_eq(sendmsg(fd, &mh, MSG_NOSIGNAL), (ssize_t)iov.iov_len);
}

/* The arena fd of @kind for an arena of @bytes, or -1 (FAKE_PATH). */
static int fake_arena_fd(enum fake_arena kind, uint64_t bytes)
{
	int fd;

	if (kind == FAKE_PATH)
		return -1;
	fd = memfd_create("fake-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)(kind == FAKE_SIZE ? bytes + 4096 : bytes)), 0);
	if (kind == FAKE_SIZE)
		ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
	return fd;
}

/* Serves one client: answers its Hello, and its GroupJoin as @f->kind says; then reads until
 * the client goes. */
static void *fake_serve(void *arg)
{
	struct fake_daemon *f = arg;
	Tpw__V1__DaemonMsg out = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__HelloReply hr = TPW__V1__HELLO_REPLY__INIT;
	Tpw__V1__Limits lim = TPW__V1__LIMITS__INIT;
	Tpw__V1__GroupJoined j = TPW__V1__GROUP_JOINED__INIT;
	Tpw__V1__ClientMsg *m;

	f->fd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
	while (f->fd >= 0 && fake_recv(f->fd, &m) == 0) {
		if (m->body_case == TPW__V1__CLIENT_MSG__BODY_HELLO) {
			hr.major = TPW_PROTO_MAJOR;
			hr.minor = TPW_PROTO_MINOR;
			hr.status = TPW__V1__STATUS__STATUS_OK;
			hr.session_id = 1;
			hr.limits = &lim;
			out.body_case = TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY;
			out.hello_reply = &hr;
			fake_send(f->fd, &out, -1);
		} else if (m->body_case == TPW__V1__CLIENT_MSG__BODY_GROUP_JOIN) {
			int afd;

			j.req_id = m->group_join->req_id;
			j.status = TPW__V1__STATUS__STATUS_OK;
			j.group_id = 1;
			j.size = j.local_size = j.hosts = 1;
			j.chunk_bytes = 65536;
			j.arena_bytes = tpu_grparena_bytes(1, j.chunk_bytes);
			j.arena_path = f->kind == FAKE_PATH ? "/dev/shm/tpipd-group-0123" : "";
			afd = fake_arena_fd(f->kind, j.arena_bytes);
			j.arena_fd = afd >= 0;
			out.body_case = TPW__V1__DAEMON_MSG__BODY_GROUP_JOINED;
			out.group_joined = &j;
			fake_send(f->fd, &out, afd);
			if (afd >= 0)
				close(afd);
		}
		tpw_client_msg_free(m);
	}
	return NULL;
}

/* tp_group_join() through a stand-in daemon answering as @kind says. Return: its result, with
 * tp_last_error() in @msg. */
static int fake_join(enum fake_arena kind, char *msg, size_t ml)
{
	struct fake_daemon f = { .kind = kind, .fd = -1 };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct tp_context_options o = { .size = sizeof(o), .flags = TP_CONTEXT_NO_RING };
	struct tp_group_options go = { .size = sizeof(go), .rank = 0, .nranks = 1,
				       .join_timeout_ms = 5000 };
	struct tp_context *ctx;
	struct tp_group *g = NULL;
	pthread_t th;
	int r;

	snprintf(f.path, sizeof(f.path), "/tmp/tpt-fakegrp-%d.sock", (int)getpid());
	unlink(f.path);
	memcpy(sa.sun_path, f.path, strlen(f.path) + 1);
	f.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(f.lfd, 0);
	ck_assert_int_eq(bind(f.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(f.lfd, 1), 0);
	ck_assert_int_eq(pthread_create(&th, NULL, fake_serve, &f), 0);
	o.socket_path = f.path;
	ck_assert_int_eq(tp_context_new(&o, &ctx), 0);
	r = tp_group_join(ctx, "fake", &go, &g);
	snprintf(msg, ml, "%s", tp_last_error());
	ck_assert_ptr_null(g);
	tp_context_free(ctx);
	pthread_join(th, NULL);
	close(f.fd);
	close(f.lfd);
	unlink(f.path);
	return r;
}

/* The library maps only a sealed memfd of the size the answer announces: an older daemon's path
 * is never opened, an unsealed memfd or one of another size is refused, each named. */
START_TEST(test_library_refuses_an_arena_it_cannot_trust)
{
	char msg[512];

	ck_assert_int_eq(fake_join(FAKE_PATH, msg, sizeof(msg)), -EPROTO);
	ck_assert_msg(strstr(msg, "older tpipd") && strstr(msg, "upgrade tpipd"), "%s", msg);
	ck_assert_int_eq(fake_join(FAKE_UNSEALED, msg, sizeof(msg)), -EPROTO);
	ck_assert_msg(strstr(msg, "not a memfd sealed against shrinking"), "%s", msg);
	ck_assert_int_eq(fake_join(FAKE_SIZE, msg, sizeof(msg)), -EPROTO);
	ck_assert_msg(strstr(msg, "not a file of"), "%s", msg);
}
END_TEST

START_TEST(test_join_times_out_naming_missing_ranks)
{
	struct tp_group_options o = { .size = sizeof(o), .rank = 1, .nranks = 3,
				      .join_timeout_ms = 300 };
	struct tp_context *ctx;
	struct tp_group *g = NULL;

	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, NULL, &ctx), 0);
	ck_assert_int_eq(tp_group_join(ctx, "lonely", &o, &g), -ETIMEDOUT);
	ck_assert_ptr_null(g);
	ck_assert_msg(strstr(tp_last_error(), "missing ranks 0, 2"), "%s", tp_last_error());
	/* the name is free again: a group of 1 of that name forms */
	o.rank = 0;
	o.nranks = 1;
	ck_assert_int_eq(tp_group_join(ctx, "lonely", &o, &g), 0);
	ck_assert_int_eq(tp_barrier(g), 0);
	ck_assert_int_eq(tp_group_leave(g), 0);
	tp_context_free(ctx);
}
END_TEST

START_TEST(test_join_refusals)
{
	struct tp_group_options o = { .size = sizeof(o), .rank = 0, .nranks = 2,
				      .join_timeout_ms = 5000 };
	struct tp_group_options o2 = o;
	char longname[200];
	struct tp_context *ctx;
	struct tp_group *g = NULL;

	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, NULL, &ctx), 0);
	o.bootstrap = TP_GROUP_BOOTSTRAP_COORDINATOR; /* without its address */
	ck_assert_int_eq(tp_group_join(ctx, "x", &o, &g), -EINVAL);
	o.bootstrap = TP_GROUP_BOOTSTRAP_SLURM; /* outside a Slurm task: no SLURM_JOB_ID */
	if (!getenv("SLURM_JOB_ID") && !getenv("SLURM_JOBID"))
		ck_assert_int_eq(tp_group_join(ctx, "x", &o, &g), -ENOENT);
	memset(longname, 'a', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = 0;
	ck_assert_int_eq(tp_group_join(ctx, longname, &o2, &g), -ENAMETOOLONG);
	o2.rank = 2;
	ck_assert_int_eq(tp_group_join(ctx, "x", &o2, &g), -EINVAL);
	tp_context_free(ctx);
}
END_TEST

/* A group's remote access in tp_group_options: a caller built before it (a shorter struct)
 * joins with the default; 32 peer identities pass, 33 do not; peers only with
 * TP_REMOTE_PEERS; TP_GROUP_REMOTE applies to the default only and must parse. */
START_TEST(test_join_remote_access_options)
{
	const char *peers[33];
	struct tp_group_options o = { .size = offsetof(struct tp_group_options, remote),
				      .rank = 0, .nranks = 1, .join_timeout_ms = 5000 };
	struct tp_context *ctx;
	struct tp_group *g = NULL;

	for (size_t i = 0; i < 33; i++)
		peers[i] = "psk";
	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, NULL, &ctx), 0);
	ck_assert_int_eq(tp_group_join(ctx, "old-struct", &o, &g), 0); /* before remote */
	ck_assert_int_eq(tp_group_leave(g), 0);
	o.size = sizeof(o);
	o.remote = TP_REMOTE_PEERS;
	o.remote_peers = peers;
	o.n_remote_peers = 32;
	ck_assert_int_eq(tp_group_join(ctx, "peers32", &o, &g), 0);
	ck_assert_int_eq(tp_group_leave(g), 0);
	o.n_remote_peers = 33;
	ck_assert_int_eq(tp_group_join(ctx, "peers33", &o, &g), -EINVAL);
	o.n_remote_peers = 0;
	ck_assert_int_eq(tp_group_join(ctx, "peers0", &o, &g), -EINVAL);
	o.remote = TP_REMOTE_ANY_PEER;
	o.n_remote_peers = 1;
	ck_assert_int_eq(tp_group_join(ctx, "anypeers", &o, &g), -EINVAL);
	o.remote = (enum tp_remote_access)3;
	o.n_remote_peers = 0;
	ck_assert_int_eq(tp_group_join(ctx, "unknown", &o, &g), -EINVAL);
	o.remote = TP_REMOTE_NONE;
	setenv("TP_GROUP_REMOTE", ";; ;", 1); /* no identity */
	ck_assert_int_eq(tp_group_join(ctx, "env", &o, &g), -EINVAL);
	setenv("TP_GROUP_REMOTE", "psk; cert:gn02", 1);
	ck_assert_int_eq(tp_group_join(ctx, "env", &o, &g), 0);
	ck_assert_int_eq(tp_group_leave(g), 0);
	o.remote = TP_REMOTE_ANY_PEER; /* the caller's choice: the environment is not read */
	setenv("TP_GROUP_REMOTE", ";; ;", 1);
	ck_assert_int_eq(tp_group_join(ctx, "env2", &o, &g), 0);
	ck_assert_int_eq(tp_group_leave(g), 0);
	unsetenv("TP_GROUP_REMOTE");
	tp_context_free(ctx);
}
END_TEST

/* ---- limits -------------------------------------------------------------------------------- */

static int join1(struct tp_context *ctx, const char *name, unsigned n, struct tp_group **ret)
{
	struct tp_group_options o = { .size = sizeof(o), .rank = 0, .nranks = n,
				      .join_timeout_ms = 200 };

	return tp_group_join(ctx, name, &o, ret);
}

START_TEST(test_limits_below_and_above)
{
	/* arena of a group of 1 with the default 1 MiB chunk: 8 KiB + 4 MiB */
	uint64_t one = 8192 + (4u << 20);
	char bytes[32];
	struct tpt_daemon d;
	struct tp_context *ctx;
	struct tp_group *g1, *g2, *g3;

	snprintf(bytes, sizeof(bytes), "%llu", (unsigned long long)(2 * one));
	const char *args[] = { "--groups-per-uid", "3", "--group-members-max", "2",
			       "--group-bytes-per-uid", bytes, NULL };
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&d, 0, NULL, &ctx), 0);
	/* members: 2 is the limit (times out for want of a second member), 3 is over */
	ck_assert_int_eq(join1(ctx, "m2", 2, &g1), -ETIMEDOUT);
	ck_assert_int_eq(join1(ctx, "m3", 3, &g1), -ENOBUFS);
	ck_assert_msg(strstr(tp_last_error(), "group-members-max"), "%s", tp_last_error());
	/* bytes: two arenas of a group of 1 fit, a third does not */
	ck_assert_int_eq(join1(ctx, "b1", 1, &g1), 0);
	ck_assert_uint_eq(tp_group_arena_bytes(g1), one);
	ck_assert_int_eq(join1(ctx, "b2", 1, &g2), 0);
	ck_assert_int_eq(join1(ctx, "b3", 1, &g3), -ENOBUFS);
	ck_assert_msg(strstr(tp_last_error(), "group-bytes-per-uid"), "%s", tp_last_error());
	ck_assert_int_eq(tp_group_leave(g2), 0);
	ck_assert_int_eq(tp_group_leave(g1), 0);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);

	/* groups per uid: 3 is the limit, the 4th is refused */
	const char *args2[] = { "--groups-per-uid", "3", NULL };
	struct tp_group *gs[4];

	ck_assert_int_eq(tpt_daemon_start(&d, args2), 0);
	ck_assert_int_eq(tpt_ctx_new(&d, 0, NULL, &ctx), 0);
	for (int i = 0; i < 3; i++) {
		char name[8];

		snprintf(name, sizeof(name), "g%d", i);
		ck_assert_int_eq(join1(ctx, name, 1, &gs[i]), 0);
	}
	ck_assert_int_eq(join1(ctx, "g3", 1, &gs[3]), -ENOBUFS);
	ck_assert_msg(strstr(tp_last_error(), "groups-per-uid"), "%s", tp_last_error());
	ck_assert_int_eq(tp_group_leave(gs[0]), 0);
	ck_assert_int_eq(join1(ctx, "g3", 1, &gs[3]), 0); /* room again */
	for (int i = 1; i < 4; i++)
		ck_assert_int_eq(tp_group_leave(gs[i]), 0);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

static char *tpipctl_on(const struct tpt_daemon *d, const char *a1, const char *a2)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", d->socket, a1, a2, NULL };
	struct tpt_cmd_result res;
	char *out;

	ck_assert_msg(bin && *bin, "TPIPCTL_BIN is not set");
	ck_assert_int_eq(tpt_run(argv, T_MS, &res), 0);
	ck_assert_msg(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0, "tpipctl: %s",
		      res.err);
	out = res.out;
	res.out = NULL;
	tpt_cmd_result_free(&res);
	return out;
}

static char *tpipctl(const char *a1, const char *a2)
{
	return tpipctl_on(&tpt_fixture_daemon, a1, a2);
}

/* ---- the daemon dies ----------------------------------------------------------------------- */

static struct tpt_daemon dying;
static struct tpt_sync waiting, go_on;

static int body_daemon_dies(struct gt_member *m)
{
	int r;

	tpt_sync_post(&waiting, 0);
	/* rank 1 calls only once rank 0's barrier has ended */
	if (tp_group_rank(m->g) == 1 && tpt_sync_wait(&go_on, T_MS) < 0)
		return 1;
	r = tp_barrier(m->g); /* rank 0 waits in it for rank 1 when the daemon dies */
	sh->status[m->idx][0] = r;
	snprintf(sh->msg[m->idx], sizeof(sh->msg[0]), "%s", tp_last_error());
	if (tp_group_rank(m->g) == 0)
		tpt_sync_post(&waiting, 1);
	return 0;
}

static int run_dying_members(void *arg)
{
	(void)arg;
	return gt_run(&dying, "dying", 2, false, body_daemon_dies, NULL, sh, T_MS) ? 0 : 1;
}

START_TEST(test_daemon_dying_fails_collectives_instead_of_hanging)
{
	pid_t p;

	ck_assert_int_eq(tpt_sync_init(&waiting), 0);
	ck_assert_int_eq(tpt_sync_init(&go_on), 0);
	ck_assert_int_eq(tpt_daemon_start(&dying, NULL), 0);
	p = tpt_fork(run_dying_members, NULL);
	ck_assert_int_eq(tpt_sync_wait(&waiting, T_MS), 0);
	ck_assert_int_eq(tpt_sync_wait(&waiting, T_MS), 0);
	/* until the daemon has seen both members ready (and unlinked the arena's name, which a
	 * daemon killed before that would leave behind) */
	for (uint64_t end = tpt_now_ms() + T_MS;;) {
		char *out = tpipctl_on(&dying, "groups", "--json");
		const char *q = strstr(out, "\"ready\"");
		bool both = q && strstr(q + 1, "\"ready\"");

		free(out);
		if (both)
			break;
		ck_assert_msg(tpt_now_ms() < end, "the members never became ready");
	}
	kill(dying.pid, SIGKILL);
	ck_assert_int_eq(tpt_sync_wait(&waiting, T_MS), 1); /* rank 0's barrier failed */
	tpt_sync_post(&go_on, 0);
	ck_assert(tpt_wait_ok(p, T_MS, "members"));
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(sh->status[i][0], -ECONNRESET);
		ck_assert_msg(strstr(sh->msg[i], "lost its daemon connection"), "%s", sh->msg[i]);
	}
	tpt_daemon_stop(&dying); /* reaps it; its status is SIGKILL's */
	tpt_sync_done(&waiting);
	tpt_sync_done(&go_on);
}
END_TEST

/* ---- tpipctl groups ------------------------------------------------------------------------ */

static struct tpt_sync ctl_ready, ctl_go;

static int body_ctl(struct gt_member *m)
{
	float buf[1000] = { 0 };
	int r = tp_allreduce(m->g, buf, buf, 1000, TP_DTYPE_F32, TP_OP_SUM);

	if (r < 0)
		return mfail(m, r, "allreduce");
	tpt_sync_post(&ctl_ready, 0);
	if (tpt_sync_wait(&ctl_go, T_MS) < 0)
		return 1;
	return tp_barrier(m->g) < 0;
}

static int run_ctl_members(void *arg)
{
	(void)arg;
	return gt_run(&tpt_fixture_daemon, "ctl", 2, false, body_ctl, NULL, sh, T_MS) ? 0 : 1;
}

static uint64_t jget(struct json_object *o, const char *key)
{
	struct json_object *v;

	ck_assert_msg(json_object_object_get_ex(o, key, &v), "no %s", key);
	return (uint64_t)json_object_get_int64(v);
}

START_TEST(test_tpipctl_groups_shows_members_plan_and_counters)
{
	struct json_object *root, *groups, *g, *members, *v;
	char *out;
	pid_t p;

	ck_assert_int_eq(tpt_sync_init(&ctl_ready), 0);
	ck_assert_int_eq(tpt_sync_init(&ctl_go), 0);
	p = tpt_fork(run_ctl_members, NULL);
	ck_assert_int_eq(tpt_sync_wait(&ctl_ready, T_MS), 0);
	ck_assert_int_eq(tpt_sync_wait(&ctl_ready, T_MS), 0);
	out = tpipctl("groups", "--json");
	root = json_tokener_parse(out);
	ck_assert_msg(root && json_object_object_get_ex(root, "groups", &groups), "%s", out);
	ck_assert_int_eq(json_object_array_length(groups), 1);
	g = json_object_array_get_idx(groups, 0);
	ck_assert(json_object_object_get_ex(g, "name", &v));
	ck_assert_str_eq(json_object_get_string(v), "ctl");
	ck_assert(json_object_object_get_ex(g, "state", &v));
	ck_assert_str_eq(json_object_get_string(v), "formed");
	ck_assert(json_object_object_get_ex(g, "plan", &v));
	ck_assert_msg(strstr(json_object_get_string(v), "reduce-scatter"), "%s", out);
	ck_assert_msg(strstr(json_object_get_string(v), "all-reduce up to 32768 bytes = every "
			     "member folds the 2 slots in rank order, 1 barrier"), "%s", out);
	ck_assert_uint_eq(jget(g, "size"), 2);
	ck_assert(json_object_object_get_ex(g, "members", &members));
	ck_assert_int_eq(json_object_array_length(members), 2);
	for (int i = 0; i < 2; i++) {
		struct json_object *m = json_object_array_get_idx(members, i);

		ck_assert_uint_eq(jget(m, "rank"), (uint64_t)i);
		ck_assert_uint_eq(jget(m, "pid"), (uint64_t)sh->pid[i]);
		ck_assert_uint_eq(jget(m, "calls"), 1);
		ck_assert_uint_eq(jget(m, "bytes"), 4000);
		ck_assert(json_object_object_get_ex(m, "state", &v));
		ck_assert_str_eq(json_object_get_string(v), "ready");
	}
	json_object_put(root);
	free(out);
	out = tpipctl("groups", NULL);
	ck_assert_msg(strstr(out, "'ctl'") && strstr(out, "plan:") && strstr(out, "RANK"), "%s",
		      out);
	free(out);
	tpt_sync_post(&ctl_go, 0);
	tpt_sync_post(&ctl_go, 0);
	ck_assert(tpt_wait_ok(p, T_MS, "members"));
	out = tpipctl("groups", "--json"); /* every member left: the group is gone */
	root = json_tokener_parse(out);
	ck_assert_msg(root && json_object_object_get_ex(root, "groups", &groups), "%s", out);
	ck_assert_msg(json_object_array_length(groups) == 0, "%s", out);
	json_object_put(root);
	free(out);
	tpt_sync_done(&ctl_ready);
	tpt_sync_done(&ctl_go);
}
END_TEST

static Suite *groups_suite(void)
{
	Suite *s = suite_create("groups");
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, test_join_one_to_eight_ranks_given_and_assigned);
	tcase_add_test(tc, test_allreduce_every_dtype_and_op_matches_reference);
	tcase_add_test(tc, test_allreduce_f32_f64_sum_one_to_eight_ranks_bitwise_equal);
	tcase_add_test(tc, test_members_offering_different_features_agree);
	tcase_add_test(tc, test_features_off_unknown_word_fails_the_join);
	tcase_add_test(tc, test_members_on_different_kernel_builds_agree);
	tcase_add_test(tc, test_reduce_isa_unknown_value_fails_the_join);
	tcase_add_test(tc, test_allreduce_user_function_in_rank_order);
	tcase_add_test(tc, test_broadcast_allgather_reduce_scatter);
	tcase_add_test(tc, test_uneven_steps_count_contributors);
	tcase_add_test(tc, test_async_calls_complete_in_order);
	tcase_add_test(tc, test_mismatched_calls_fail_on_every_rank);
	tcase_add_test(tc, test_member_killed_mid_collective_fails_survivors);
	tcase_add_test(tc, test_member_leaving_fails_the_others_next_call);
	tcase_add_test(tc, test_members_exiting_without_leaving_free_the_group);
	tcase_add_test(tc, test_barriers_wake_the_sleepers_and_no_one_else);
	tcase_add_test(tc, test_members_on_the_socket_get_the_arena_too);
	tcase_add_test(tc, test_library_refuses_an_arena_it_cannot_trust);
	tcase_add_test(tc, test_join_times_out_naming_missing_ranks);
	tcase_add_test(tc, test_join_refusals);
	tcase_add_test(tc, test_join_remote_access_options);
	tcase_add_test(tc, test_limits_below_and_above);
	tcase_add_test(tc, test_tpipctl_groups_shows_members_plan_and_counters);
	tcase_add_test(tc, test_daemon_dying_fails_collectives_instead_of_hanging);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(groups_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
