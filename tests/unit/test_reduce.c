/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit suite: the collectives' reduction kernels (client/lib/reduce.c, compiled in). binary16
 * conversions agree with a reference by arithmetic (and with the compiler's _Float16 where it
 * has one) for every half value and for float inputs around every rounding boundary; bfloat16 rounds to nearest even and keeps NaN a NaN; every
 * (dtype, op) kernel agrees element by element with a scalar reference, at lengths that are not
 * multiples of a vector and at unaligned offsets; integer sums and products wrap; the AVX2
 * build of the kernels leaves the baseline's bits, NaNs against NaNs included; every NaN
 * result is the canonical quiet NaN, whichever build runs.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reduce.h"
#include "../common/tpt_half.h"

#ifdef __FLT16_MAX__ /* the compiler's binary16 too, where it has one */
static uint16_t cc_f2h(float x)
{
	_Float16 h = (_Float16)x;
	uint16_t u;

	memcpy(&u, &h, 2);
	return u;
}

static float cc_h2f(uint16_t u)
{
	_Float16 h;

	memcpy(&h, &u, 2);
	return (float)h;
}
#else
#define cc_f2h ref_f2h
#define cc_h2f ref_h2f
#endif

START_TEST(test_f16_to_float_every_value)
{
	for (uint32_t h = 0; h < 0x10000; h++) {
		float got = tpc_f16_to_float((uint16_t)h), want = ref_h2f((uint16_t)h);

		if (isnan(want))
			ck_assert_msg(isnan(got) && isnan(cc_h2f((uint16_t)h)), "0x%04x", h);
		else
			ck_assert_msg(memcmp(&got, &want, 4) == 0 && cc_h2f((uint16_t)h) == want,
				      "0x%04x: %a want %a", h, got, want);
	}
}
END_TEST

START_TEST(test_float_to_f16_rounds_like_the_compiler)
{
	/* every half value, and the floats just around the midpoints between neighbours */
	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = tpc_f16_to_float((uint16_t)h);
		uint32_t u;

		if (isnan(f))
			continue;
		memcpy(&u, &f, 4);
		for (int d = -4096; d <= 4096; d += 256) {
			uint32_t v = u + (uint32_t)d;
			float x;
			uint16_t want, got;

			memcpy(&x, &v, 4);
			if (isnan(x))
				continue;
			want = ref_f2h(x);
			got = tpc_float_to_f16(x);
			ck_assert_msg(got == want && cc_f2h(x) == want, "%a: 0x%04x want 0x%04x", x,
				      got, want);
		}
	}
	ck_assert(isnan(tpc_f16_to_float(tpc_float_to_f16(NAN))));
}
END_TEST

START_TEST(test_bf16_rounds_to_nearest_even)
{
	ck_assert_uint_eq(tpc_float_to_bf16(1.0f), 0x3f80);
	/* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: even (1) wins */
	ck_assert_uint_eq(tpc_float_to_bf16(1.0f + 0x1p-8f), 0x3f80);
	/* 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: even (1 + 2^-6) wins */
	ck_assert_uint_eq(tpc_float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
	ck_assert_uint_eq(tpc_float_to_bf16(1.0f + 0x1p-8f + 0x1p-16f), 0x3f81);
	ck_assert(isnan(tpc_bf16_to_float(tpc_float_to_bf16(NAN))));
	ck_assert(isinf(tpc_bf16_to_float(tpc_float_to_bf16(INFINITY))));
	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = tpc_bf16_to_float((uint16_t)h);

		if (!isnan(f))
			ck_assert_uint_eq(tpc_float_to_bf16(f), h);
	}
}
END_TEST

static double ref_op(double a, double b, enum tp_reduce_op op)
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

/* One element of @dt: acc op in, computed the slow way. */
static void ref_elem(enum tp_dtype dt, enum tp_reduce_op op, uint8_t *acc, const uint8_t *in)
{
	switch (dt) {
	case TP_DTYPE_F16: {
		uint16_t a, b;

		memcpy(&a, acc, 2);
		memcpy(&b, in, 2);
		a = tpc_float_to_f16((float)ref_op(tpc_f16_to_float(a), tpc_f16_to_float(b), op));
		memcpy(acc, &a, 2);
		break;
	}
	case TP_DTYPE_BF16: {
		uint16_t a, b;

		memcpy(&a, acc, 2);
		memcpy(&b, in, 2);
		a = tpc_float_to_bf16((float)ref_op(tpc_bf16_to_float(a), tpc_bf16_to_float(b),
						    op));
		memcpy(acc, &a, 2);
		break;
	}
	case TP_DTYPE_F32: {
		float a, b;

		memcpy(&a, acc, 4);
		memcpy(&b, in, 4);
		a = op == TP_OP_SUM ? a + b : op == TP_OP_PROD ? a * b : (float)ref_op(a, b, op);
		memcpy(acc, &a, 4);
		break;
	}
	case TP_DTYPE_F64: {
		double a, b;

		memcpy(&a, acc, 8);
		memcpy(&b, in, 8);
		a = ref_op(a, b, op);
		memcpy(acc, &a, 8);
		break;
	}
	case TP_DTYPE_I8:
	case TP_DTYPE_U8:
	case TP_DTYPE_I32:
	case TP_DTYPE_I64: {
		size_t es = tp_dtype_size(dt);
		int64_t a = 0, b = 0;
		uint64_t r;

		if (dt == TP_DTYPE_I8) {
			a = (int8_t)acc[0];
			b = (int8_t)in[0];
		} else if (dt == TP_DTYPE_U8) {
			a = acc[0];
			b = in[0];
		} else if (dt == TP_DTYPE_I32) {
			int32_t x, y;

			memcpy(&x, acc, 4);
			memcpy(&y, in, 4);
			a = x;
			b = y;
		} else {
			memcpy(&a, acc, 8);
			memcpy(&b, in, 8);
		}
		r = op == TP_OP_SUM ? (uint64_t)a + (uint64_t)b :
		    op == TP_OP_PROD ? (uint64_t)a * (uint64_t)b : (uint64_t)(int64_t)ref_op(
			    (double)a, (double)b, op);
		if (op == TP_OP_MIN || op == TP_OP_MAX) /* exact for 64 bits too */
			r = (uint64_t)(op == TP_OP_MIN ? (b < a ? b : a) : (b > a ? b : a));
		memcpy(acc, &r, es); /* little-endian: the low bytes wrap */
		break;
	}
	}
}

static void fill(uint8_t *p, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)((i * 2654435761u + seed * 40503u) >> 13);
}

/* f16/bf16 patterns that are not NaN (random bytes make many); small floats keep products
 * finite enough to compare. */
static void fill_typed(enum tp_dtype dt, uint8_t *p, size_t n, unsigned seed)
{
	size_t es = tp_dtype_size(dt);

	fill(p, n * es, seed);
	for (size_t i = 0; i < n; i++) {
		float f = (float)((int)((i * 7 + seed * 3) % 41) - 20) / 8.0f;

		if (dt == TP_DTYPE_F16) {
			uint16_t h = tpc_float_to_f16(f);

			memcpy(p + i * 2, &h, 2);
		} else if (dt == TP_DTYPE_BF16) {
			uint16_t h = tpc_float_to_bf16(f);

			memcpy(p + i * 2, &h, 2);
		} else if (dt == TP_DTYPE_F32) {
			memcpy(p + i * 4, &f, 4);
		} else if (dt == TP_DTYPE_F64) {
			double d = (double)f / 3.0;

			memcpy(p + i * 8, &d, 8);
		}
	}
}

START_TEST(test_every_kernel_matches_the_scalar_reference)
{
	static const enum tp_dtype dts[] = { TP_DTYPE_F16, TP_DTYPE_BF16, TP_DTYPE_F32,
					     TP_DTYPE_F64, TP_DTYPE_I8, TP_DTYPE_U8, TP_DTYPE_I32,
					     TP_DTYPE_I64 };
	static const size_t lens[] = { 0, 1, 3, 15, 16, 17, 1000, 4099 };

	for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
		size_t es = tp_dtype_size(dts[d]);

		for (int op = TP_OP_SUM; op <= TP_OP_MAX; op++) {
			for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
				size_t n = lens[l];
				/* +es: the arrays start one element in (not vector aligned) */
				uint8_t *acc = malloc((n + 1) * es), *in = malloc((n + 1) * es);
				uint8_t *ref = malloc((n + 1) * es);

				fill_typed(dts[d], acc + es, n, 1);
				fill_typed(dts[d], in + es, n, 2);
				memcpy(ref, acc, (n + 1) * es);
				for (size_t i = 0; i < n; i++)
					ref_elem(dts[d], op, ref + es + i * es, in + es + i * es);
				tpc_reduce(acc + es, in + es, n, dts[d], op);
				ck_assert_msg(memcmp(acc + es, ref + es, n * es) == 0,
					      "dtype %d op %d n %zu", dts[d], op, n);
				free(acc);
				free(in);
				free(ref);
			}
		}
	}
}
END_TEST

/* tpc_reduce3(dst, a, b) leaves the bits tpc_reduce(b into a copy of a) leaves, NaNs and
 * random bit patterns included, for every dtype and op, and no byte of @dst around them. */
START_TEST(test_reduce3_is_reduce_into_a_copy)
{
	static const enum tp_dtype dts[] = { TP_DTYPE_F16, TP_DTYPE_BF16, TP_DTYPE_F32,
					     TP_DTYPE_F64, TP_DTYPE_I8, TP_DTYPE_U8, TP_DTYPE_I32,
					     TP_DTYPE_I64 };
	static const size_t lens[] = { 0, 1, 3, 15, 16, 17, 1000, 4099 };

	for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
		size_t es = tp_dtype_size(dts[d]);

		for (int op = TP_OP_SUM; op <= TP_OP_MAX; op++) {
			for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
				for (int raw = 0; raw < 2; raw++) {
					size_t n = lens[l], len = (n + 2) * es;
					uint8_t *a = malloc(len), *b = malloc(len);
					uint8_t *dst = malloc(len), *ref = malloc(len);

					if (raw) { /* any bits: NaNs, infinities, subnormals */
						fill(a, len, 3);
						fill(b, len, 4);
					} else {
						fill_typed(dts[d], a + es, n, 1);
						fill_typed(dts[d], b + es, n, 2);
					}
					memset(dst, 0xa5, len);
					memset(ref, 0xa5, len);
					memcpy(ref + es, a + es, n * es);
					tpc_reduce(ref + es, b + es, n, dts[d], op);
					tpc_reduce3(dst + es, a + es, b + es, n, dts[d], op);
					ck_assert_msg(memcmp(dst, ref, len) == 0,
						      "dtype %d op %d n %zu raw %d", dts[d], op, n, raw);
					free(a);
					free(b);
					free(dst);
					free(ref);
				}
			}
		}
	}
}
END_TEST

/* tpc_reduce_left(acc, in) leaves the bits tpc_reduce(acc into a copy of in) leaves, NaNs and
 * random bit patterns included, for every dtype and op, and no byte of @acc around them. */
START_TEST(test_reduce_left_is_reduce_into_a_copy_of_in)
{
	static const enum tp_dtype dts[] = { TP_DTYPE_F16, TP_DTYPE_BF16, TP_DTYPE_F32,
					     TP_DTYPE_F64, TP_DTYPE_I8, TP_DTYPE_U8, TP_DTYPE_I32,
					     TP_DTYPE_I64 };
	static const size_t lens[] = { 0, 1, 3, 15, 16, 17, 1000, 4099 };

	for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
		size_t es = tp_dtype_size(dts[d]);

		for (int op = TP_OP_SUM; op <= TP_OP_MAX; op++) {
			for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
				for (int raw = 0; raw < 2; raw++) {
					size_t n = lens[l], len = (n + 2) * es;
					uint8_t *acc = calloc(1, len), *in = calloc(1, len);
					uint8_t *ref = malloc(len);

					if (raw) { /* any bits: NaNs, infinities, subnormals */
						fill(acc, len, 5);
						fill(in, len, 6);
					} else {
						fill_typed(dts[d], acc + es, n, 3);
						fill_typed(dts[d], in + es, n, 4);
					}
					memcpy(ref, acc, len);
					memcpy(ref + es, in + es, n * es);
					tpc_reduce(ref + es, acc + es, n, dts[d], op);
					tpc_reduce_left(acc + es, in + es, n, dts[d], op);
					ck_assert_msg(memcmp(acc, ref, len) == 0,
						      "dtype %d op %d n %zu raw %d", dts[d], op, n, raw);
					free(acc);
					free(in);
					free(ref);
				}
			}
		}
	}
}
END_TEST

/* The AVX2 build of the kernels (reduce_avx2.c) leaves the same bits as the baseline's for
 * every dtype, op and entry point, on random bit patterns (NaNs of both signs, infinities,
 * subnormals), at every length up to 40 and two long ones, from an odd element on, with the
 * destination apart from and equal to an operand; and for binary16 and bfloat16 every one of
 * the 65536 values against eight others each. Where the CPU lacks AVX2 or F16C (or the build
 * has no AVX2 kernels) it says so and checks nothing more. */
static void isa_case(enum tp_dtype dt, int op, const uint8_t *a, const uint8_t *b, size_t n)
{
	const struct tpc_reduce_kernels *kg = tpc_reduce_kernels(TPC_ISA_GENERIC);
	const struct tpc_reduce_kernels *kv = tpc_reduce_kernels(TPC_ISA_AVX2);
	size_t es = tp_dtype_size(dt), len = n * es;
	uint8_t *g = malloc(len + 1), *v = malloc(len + 1);

	/* dst = a op b */
	memset(g, 0x5a, len + 1);
	memset(v, 0x5a, len + 1);
	kg->reduce3(g, a, b, n, dt, op);
	kv->reduce3(v, a, b, n, dt, op);
	ck_assert_msg(memcmp(g, v, len + 1) == 0, "reduce3 dtype %d op %d n %zu", dt, op, n);
	/* acc op= in */
	memcpy(g, a, len);
	memcpy(v, a, len);
	kg->reduce(g, b, n, dt, op);
	kv->reduce(v, b, n, dt, op);
	ck_assert_msg(memcmp(g, v, len + 1) == 0, "reduce dtype %d op %d n %zu", dt, op, n);
	/* acc = in op acc */
	memcpy(g, a, len);
	memcpy(v, a, len);
	kg->reduce_left(g, b, n, dt, op);
	kv->reduce_left(v, b, n, dt, op);
	ck_assert_msg(memcmp(g, v, len + 1) == 0, "reduce_left dtype %d op %d n %zu", dt, op, n);
	free(g);
	free(v);
}

/* Sets the exponent of most floating elements of @p to all ones: NaNs of assorted payloads and
 * signs (an infinity where the payload is 0); integers as they are. */
static void nan_fill(enum tp_dtype dt, uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++) {
		if ((i * 7 + seed) % 5 == 0)
			continue;
		if (dt == TP_DTYPE_F16)
			p[i * 2 + 1] |= 0x7c;
		else if (dt == TP_DTYPE_BF16)
			p[i * 2 + 1] |= 0x7f, p[i * 2] |= 0x80;
		else if (dt == TP_DTYPE_F32)
			p[i * 4 + 3] |= 0x7f, p[i * 4 + 2] |= 0x80;
		else if (dt == TP_DTYPE_F64)
			p[i * 8 + 7] |= 0x7f, p[i * 8 + 6] |= 0xf0;
	}
}

START_TEST(test_avx2_kernels_leave_the_baselines_bits)
{
	static const enum tp_dtype dts[] = {TP_DTYPE_F16, TP_DTYPE_BF16, TP_DTYPE_F32,
					    TP_DTYPE_F64, TP_DTYPE_I8,	 TP_DTYPE_U8,
					    TP_DTYPE_I32, TP_DTYPE_I64};

	if (!tpc_reduce_avx2_usable()) {
		printf(
		    "reduce: no AVX2 kernels on this CPU or in this build: the baseline's only\n");
		return;
	}
	for (size_t d = 0; d < sizeof(dts) / sizeof(dts[0]); d++) {
		size_t es = tp_dtype_size(dts[d]);

		for (int op = TP_OP_SUM; op <= TP_OP_MAX; op++) {
			for (size_t n = 0; n <= 4099; n = n < 40 ? n + 1 : n < 1000 ? 1000 : 4099) {
				size_t len = (n + 1) * es;
				uint8_t *a = malloc(len), *b = malloc(len);

				for (unsigned seed = 0; seed < 4; seed++) {
					fill(a, len, 7 + seed);
					fill(b, len, 11 + seed * 5);
					if (seed == 2) /* typed values: sums and products round */
						fill_typed(dts[d], b + es, n, 3);
					if (seed == 3) { /* NaNs against NaNs, most of them */
						nan_fill(dts[d], a + es, n, 1);
						nan_fill(dts[d], b + es, n, 2);
					}
					isa_case(dts[d], op, a + es, b + es, n);
				}
				free(a);
				free(b);
				if (n == 4099)
					break;
			}
		}
	}
	for (int bf = 0; bf < 2; bf++) {
		enum tp_dtype dt = bf ? TP_DTYPE_BF16 : TP_DTYPE_F16;
		uint16_t *a = malloc(65536 * 2), *b = malloc(65536 * 2);

		for (uint32_t i = 0; i < 65536; i++)
			a[i] = (uint16_t)i;
		for (unsigned k = 0; k < 8; k++) {
			for (uint32_t i = 0; i < 65536; i++)
				b[i] = (uint16_t)(i * 40503u + k * 9973u + (k << 15));
			for (int op = TP_OP_SUM; op <= TP_OP_MAX; op++)
				isa_case(dt, op, (const uint8_t *)a, (const uint8_t *)b, 65536);
		}
		free(a);
		free(b);
	}
}
END_TEST

/* Every NaN result is the quiet NaN of positive sign, whatever NaNs (signalling, negative, with
 * payloads) went in, whichever build runs and however its compiler ordered the operands: a
 * NaN first operand, a NaN second one, two NaNs, and infinity minus infinity (whose NaN the
 * hardware makes negative). */
static void nan_rules(const char *isa, void (*r3)(void *, const void *, const void *, size_t,
						  enum tp_dtype, enum tp_reduce_op))
{
	uint32_t fa[4] = {0x7f800001u, 0x3f800000u, 0xffc00009u, 0x7f800000u};
	uint32_t fb[4] = {0x3f800000u, 0xff900002u, 0x7f800003u, 0xff800000u}, fx[4];
	uint64_t da[2] = {0xfff0000000000005ull, 0x3ff0000000000000ull};
	uint64_t db[2] = {0x7ff8000000000006ull, 0xfff0000000000007ull}, dx[2];
	uint16_t ha[4] = {0x7c01, 0x3c00, 0xfe09, 0x7c00}, hb[4] = {0x3c00, 0xfd02, 0x7c03, 0xfc00};
	uint16_t ba[4] = {0x7f81, 0x3f80, 0xffc9, 0x7f80}, bb[4] = {0x3f80, 0xff92, 0x7f83, 0xff80};
	uint16_t hx[4], bx[4];

	for (int op = TP_OP_SUM; op <= TP_OP_MAX; op++) {
		size_t n = op == TP_OP_SUM ? 4 : 3; /* inf - inf: a NaN for a sum only */

		r3(fx, fa, fb, n, TP_DTYPE_F32, op);
		r3(dx, da, db, 2, TP_DTYPE_F64, op);
		r3(hx, ha, hb, n, TP_DTYPE_F16, op);
		r3(bx, ba, bb, n, TP_DTYPE_BF16, op);
		for (size_t i = 0; i < n; i++) {
			ck_assert_msg(fx[i] == 0x7fc00000u, "%s f32 op %d [%zu]: %08x", isa, op, i,
				      fx[i]);
			ck_assert_msg(hx[i] == 0x7e00, "%s f16 op %d [%zu]: %04x", isa, op, i,
				      hx[i]);
			ck_assert_msg(bx[i] == 0x7fc0, "%s bf16 op %d [%zu]: %04x", isa, op, i,
				      bx[i]);
		}
		for (size_t i = 0; i < 2; i++)
			ck_assert_msg(dx[i] == 0x7ff8000000000000ull, "%s f64 op %d [%zu]", isa, op,
				      i);
	}
}

START_TEST(test_nan_results_do_not_depend_on_the_build)
{
	nan_rules("generic", tpc_reduce_kernels(TPC_ISA_GENERIC)->reduce3);
	if (tpc_reduce_avx2_usable())
		nan_rules("avx2", tpc_reduce_kernels(TPC_ISA_AVX2)->reduce3);
}
END_TEST

/* TP_REDUCE_ISA's values: unset, empty and "auto" the best; "generic" the baseline; "avx2" only
 * where it runs; anything else -EINVAL, the best chosen all the same. */
START_TEST(test_reduce_isa_values)
{
	enum tpc_reduce_isa best = tpc_reduce_avx2_usable() ? TPC_ISA_AVX2 : TPC_ISA_GENERIC, isa;

	ck_assert_int_eq(tpc_reduce_isa_env(NULL, &isa), 0);
	ck_assert_int_eq(isa, best);
	ck_assert_int_eq(tpc_reduce_isa_env("", &isa), 0);
	ck_assert_int_eq(isa, best);
	ck_assert_int_eq(tpc_reduce_isa_env("auto", &isa), 0);
	ck_assert_int_eq(isa, best);
	ck_assert_int_eq(tpc_reduce_isa_env("generic", &isa), 0);
	ck_assert_int_eq(isa, TPC_ISA_GENERIC);
	ck_assert_int_eq(tpc_reduce_isa_env("avx2", &isa), best == TPC_ISA_AVX2 ? 0 : -ENOTSUP);
	ck_assert_int_eq(isa, best);
	ck_assert_int_eq(tpc_reduce_isa_env("AVX2", &isa), -EINVAL);
	ck_assert_int_eq(tpc_reduce_isa_env("generic ", &isa), -EINVAL);
	ck_assert_int_eq(isa, best);
}
END_TEST

START_TEST(test_integers_wrap_and_nan_wins_min_max)
{
	int8_t a8[2] = { 127, -128 }, b8[2] = { 1, -1 };
	int32_t a32 = INT32_MAX, b32 = 2;
	float fa[2] = { 1.0f, NAN }, fb[2] = { NAN, 1.0f };

	tpc_reduce(a8, b8, 2, TP_DTYPE_I8, TP_OP_SUM);
	ck_assert_int_eq(a8[0], -128);
	ck_assert_int_eq(a8[1], 127);
	tpc_reduce(&a32, &b32, 1, TP_DTYPE_I32, TP_OP_PROD);
	ck_assert_int_eq(a32, -2);
	tpc_reduce(fa, fb, 2, TP_DTYPE_F32, TP_OP_MIN);
	ck_assert(isnan(fa[0]) && isnan(fa[1]));
	ck_assert_uint_eq(tp_dtype_size(TP_DTYPE_BF16), 2);
	ck_assert_uint_eq(tp_dtype_size((enum tp_dtype)99), 0);
}
END_TEST

/* Every length up to 300 and a few large ones, at every alignment of either side mod 16: the
 * bytes copied exactly and nothing around them touched. */
START_TEST(test_copy_stream_exact_at_every_alignment)
{
	enum { PAD = 32, BIG = 70001, SMALL = 301 };
	static const size_t lens[] = { 4096, 65536 + 7, BIG };
	uint8_t *src = malloc(BIG + 2 * PAD), *dst = malloc(BIG + 2 * PAD + 16), guard[PAD + 16];

	ck_assert(src && dst);
	memset(guard, 0xEE, sizeof(guard));
	for (size_t i = 0; i < BIG + 2 * PAD; i++)
		src[i] = (uint8_t)(i * 131 + 7);
	for (size_t n = 0; n < SMALL + sizeof(lens) / sizeof(lens[0]); n++) {
		size_t len = n < SMALL ? n : lens[n - SMALL];

		for (size_t so = 0; so < 16; so++)
			for (size_t dof = 0; dof < 16; dof++) {
				uint8_t *d = dst + PAD + dof;

				memset(dst, 0xEE, len + 2 * PAD + 16);
				tpc_copy_stream(d, src + PAD + so, len);
				ck_assert_msg(memcmp(d, src + PAD + so, len) == 0 &&
					      memcmp(dst, guard, PAD + dof) == 0 &&
					      memcmp(d + len, guard, PAD) == 0,
					      "len %zu src +%zu dst +%zu", len, so, dof);
			}
	}
	free(src);
	free(dst);
}
END_TEST

/* The cache a copy counts on is what sysfs says, at most TPC_CACHE_MAX, the same every call;
 * tpc_copy_far() copies exactly on either side of its threshold (a quarter of it). */
START_TEST(test_copy_far_exact_around_its_threshold)
{
	size_t c = tpc_cache_bytes(), t = c / 4, big = t + 4099;
	uint8_t *src = malloc(big), *dst = malloc(big + 64);

	ck_assert(c > 0 && c <= TPC_CACHE_MAX);
	ck_assert_uint_eq(tpc_cache_bytes(), c);
	ck_assert(src && dst);
	for (size_t i = 0; i < big; i++)
		src[i] = (uint8_t)(i * 37 + 11);
	for (size_t len = t - 1; len <= big; len += 2050) {
		memset(dst, 0xEE, big + 64);
		tpc_copy_far(dst + 3, src, len);
		ck_assert_msg(memcmp(dst + 3, src, len) == 0 && dst[2] == 0xEE &&
			      dst[3 + len] == 0xEE, "len %zu (threshold %zu)", len, t);
	}
	free(src);
	free(dst);
}
END_TEST

static Suite *reduce_suite(void)
{
	Suite *s = suite_create("reduce");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_f16_to_float_every_value);
	tcase_add_test(tc, test_float_to_f16_rounds_like_the_compiler);
	tcase_add_test(tc, test_bf16_rounds_to_nearest_even);
	tcase_add_test(tc, test_every_kernel_matches_the_scalar_reference);
	tcase_add_test(tc, test_reduce3_is_reduce_into_a_copy);
	tcase_add_test(tc, test_reduce_left_is_reduce_into_a_copy_of_in);
	tcase_add_test(tc, test_avx2_kernels_leave_the_baselines_bits);
	tcase_add_test(tc, test_nan_results_do_not_depend_on_the_build);
	tcase_add_test(tc, test_reduce_isa_values);
	tcase_add_test(tc, test_integers_wrap_and_nan_wins_min_max);
	tcase_add_test(tc, test_copy_stream_exact_at_every_alignment);
	tcase_add_test(tc, test_copy_far_exact_around_its_threshold);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(reduce_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
