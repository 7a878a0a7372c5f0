/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The reduction kernels (reduce_kern.h) built for AVX2 with F16C (this file's compile flags,
 * client/lib/meson.build), which reduce.c calls where the CPU has both. Every loop of the
 * template is vectorised by the compiler with 256-bit registers; binary16 and bfloat16, whose
 * scalar conversions the compiler cannot vectorise, have their own loops here: widen 8
 * elements to float (VCVTPH2PS, or a shift), fold, narrow with round to nearest even
 * (VCVTPS2PH, or the same integer rounding as tpc_float_to_bf16()); a NaN result is the
 * canonical one, as in the template, so that both builds leave the same bits for the same
 * inputs (tests/unit/test_reduce.c compares them on random bit patterns and on every half
 * value).
 */
#include <immintrin.h>
#include <string.h>

#include "reduce.h"

#define HV 8 /* elements a vector */

static inline __m256 h_widen(const uint16_t *p, int bf)
{
	__m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);

	if (bf)
		return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
	return _mm256_cvtph_ps(v);
}

/* tpc_float_to_bf16() of each lane, in its low 16 bits: + 0x7fff + lsb (round to nearest even),
 * which leaves the canonical NaN, 0x7fc00000, 0x7fc0 */
static inline __m256i bf_round(__m256 x)
{
	__m256i u = _mm256_castps_si256(x);
	__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));

	return _mm256_srli_epi32(
	    _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
}

/* @x has no NaN but the canonical one (h_op()): narrowed to 0x7e00 (f16) or 0x7fc0 (bf16). */
static inline __m128i h_narrow(__m256 x, int bf)
{
	if (bf) {
		__m256i r = bf_round(x);

		return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
	}
	return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* FLOAT_OPS of reduce_kern.h: a + b, a * b, b < a ? b : a, b > a ? b : a; a NaN result (for
 * min and max: a NaN operand) is the canonical NaN. */
static inline __m256 h_op(__m256 a, __m256 b, enum tp_reduce_op op)
{
	__m256 canon = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), r;

	switch (op) {
	case TP_OP_SUM:
		r = _mm256_add_ps(a, b);
		break;
	case TP_OP_PROD:
		r = _mm256_mul_ps(a, b);
		break;
	case TP_OP_MIN:
		return _mm256_blendv_ps(_mm256_min_ps(b, a), canon,
					_mm256_cmp_ps(a, b, _CMP_UNORD_Q)); /* b < a ? b : a */
	default:
		return _mm256_blendv_ps(_mm256_max_ps(b, a), canon,
					_mm256_cmp_ps(a, b, _CMP_UNORD_Q)); /* b > a ? b : a */
	}
	return _mm256_blendv_ps(r, canon, _mm256_cmp_ps(r, r, _CMP_UNORD_Q));
}

/* @dst[i] = @op(@p[i], @q[i]) for @bf and @op constants (always inlined, so that each
 * instance has neither test in its loop); @dst may be @p or @q (each vector is read before it
 * is written), not overlap them otherwise. */
static inline __attribute__((always_inline)) void
half_loop(uint16_t *x, const uint16_t *a, const uint16_t *b, size_t n, int bf, enum tp_reduce_op op)
{
	size_t i = 0;

	/* bfloat16, 16 elements a pass: interleaved with zeros (each element the upper half of a
	 * float) and packed back after rounding, in the same lane order */
	for (; bf && i + 2 * HV <= n; i += 2 * HV) {
		const __m256i z = _mm256_setzero_si256();
		__m256i va = _mm256_loadu_si256((const __m256i *)(const void *)(a + i));
		__m256i vb = _mm256_loadu_si256((const __m256i *)(const void *)(b + i));
		__m256 lo = h_op(_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, va)),
				 _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, vb)), op);
		__m256 hi = h_op(_mm256_castsi256_ps(_mm256_unpackhi_epi16(z, va)),
				 _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, vb)), op);

		_mm256_storeu_si256((__m256i *)(void *)(x + i),
				    _mm256_packus_epi32(bf_round(lo), bf_round(hi)));
	}
	for (; i + 2 * HV <= n; i += 2 * HV) {
		__m256 a0 = h_widen(a + i, bf), b0 = h_widen(b + i, bf);
		__m256 a1 = h_widen(a + i + HV, bf), b1 = h_widen(b + i + HV, bf);

		_mm_storeu_si128((__m128i *)(void *)(x + i), h_narrow(h_op(a0, b0, op), bf));
		_mm_storeu_si128((__m128i *)(void *)(x + i + HV), h_narrow(h_op(a1, b1, op), bf));
	}
	for (; i < n; i += HV) { /* the rest through a vector's worth of scratch */
		uint16_t ta[HV] = {0}, tb[HV] = {0}, tx[HV];
		size_t k = n - i < HV ? n - i : HV;

		memcpy(ta, a + i, k * 2);
		memcpy(tb, b + i, k * 2);
		_mm_storeu_si128((__m128i *)(void *)tx,
				 h_narrow(h_op(h_widen(ta, bf), h_widen(tb, bf), op), bf));
		memcpy(x + i, tx, k * 2);
	}
}

static void half_avx2(void *dst, const void *p, const void *q, size_t n, enum tp_dtype dt,
		      enum tp_reduce_op op)
{
	int bf = dt == TP_DTYPE_BF16;

#define HALF_CASE(O)                                                                               \
	case O:                                                                                    \
		if (bf)                                                                            \
			half_loop(dst, p, q, n, 1, O);                                             \
		else                                                                               \
			half_loop(dst, p, q, n, 0, O);                                             \
		break
	switch (op) {
		HALF_CASE(TP_OP_SUM);
		HALF_CASE(TP_OP_PROD);
		HALF_CASE(TP_OP_MIN);
		HALF_CASE(TP_OP_MAX);
	}
#undef HALF_CASE
}

#define KSUF _avx2
#define KHALF half_avx2
#include "reduce_kern.h"
