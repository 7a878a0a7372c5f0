/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Reduction kernels (reduce.h): one plain loop per (type, operation), written so that the
 * compiler vectorises them (no aliasing between @acc and @in, no branches but min/max), the
 * binary16/bfloat16 conversions, and the copies that go around the cache. Integers wrap on
 * overflow (computed unsigned). Which ranks fold in which order is coll.c's.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "reduce.h"

void tpc_copy_stream(void *dst, const void *src, size_t n)
{
#if defined(__x86_64__)
	uint8_t *d = dst;
	const uint8_t *s = src;
	size_t head = (16 - ((uintptr_t)d & 15)) & 15;

	if (n < 256) {
		memcpy(d, s, n);
		return;
	}
	memcpy(d, s, head); /* @d on 16 bytes from here */
	d += head, s += head, n -= head;
	for (; n >= 64; d += 64, s += 64, n -= 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)s);
		__m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(s + 48));

		_mm_stream_si128((__m128i *)d, a);
		_mm_stream_si128((__m128i *)(d + 16), b);
		_mm_stream_si128((__m128i *)(d + 32), c);
		_mm_stream_si128((__m128i *)(d + 48), e);
	}
	memcpy(d, s, n);
	_mm_sfence(); /* the stores are seen (by a barrier's release, by other members) in order */
#else
	memcpy(dst, src, n);
#endif
}

static long cache_sysfs(void)
{
	FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "re");
	char unit = 0;
	long v = 0;

	if (f) {
		int n = fscanf(f, "%ld%c", &v, &unit);

		fclose(f);
		if (n >= 1 && v > 0)
			return unit == 'K' ? v << 10 : unit == 'M' ? v << 20 : v;
	}
	v = sysconf(_SC_LEVEL3_CACHE_SIZE);
	return v > 0 ? v : 0;
}

size_t tpc_cache_bytes(void)
{
	static size_t cached; /* 0: not looked up yet; every thread finds the same value */
	size_t v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
	long llc;

	if (v)
		return v;
	llc = cache_sysfs();
	v = llc > 0 && (size_t)llc < TPC_CACHE_MAX ? (size_t)llc : TPC_CACHE_MAX;
	__atomic_store_n(&cached, v, __ATOMIC_RELAXED);
	return v;
}

void tpc_copy_far(void *dst, const void *src, size_t n)
{
	if (n >= tpc_cache_bytes() / 4)
		tpc_copy_stream(dst, src, n);
	else
		memcpy(dst, src, n);
}

size_t tp_dtype_size(enum tp_dtype dtype) __attribute__((visibility("default")));

size_t tp_dtype_size(enum tp_dtype dtype)
{
	switch (dtype) {
	case TP_DTYPE_I8:
	case TP_DTYPE_U8:
		return 1;
	case TP_DTYPE_F16:
	case TP_DTYPE_BF16:
		return 2;
	case TP_DTYPE_F32:
	case TP_DTYPE_I32:
		return 4;
	case TP_DTYPE_F64:
	case TP_DTYPE_I64:
		return 8;
	}
	return 0;
}

static uint32_t f2u(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static float u2f(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

float tpc_f16_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;

	if (exp == 0x1f) /* inf, NaN */
		return u2f(sign | 0x7f800000u | (man << 13));
	if (exp == 0) { /* zero, subnormal: man * 2^-24 */
		float f = (float)man * u2f(0x33800000u);

		return sign ? -f : f;
	}
	return u2f(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t tpc_float_to_f16(float f)
{
	uint32_t u = f2u(f), sign = (u >> 16) & 0x8000, a = u & 0x7fffffffu;

	if (a >= 0x7f800000u) /* inf, NaN (kept quiet) */
		return (uint16_t)(sign | 0x7c00 | (a > 0x7f800000u ? 0x200 : 0));
	if (a >= 0x477ff000u) /* rounds to >= 65520: inf */
		return (uint16_t)(sign | 0x7c00);
	if (a < 0x38800000u) { /* below 2^-14: subnormal or zero, man = round(|f| * 2^24) */
		float m = u2f(a) * u2f(0x4b800000u); /* exact: a power of two */
		uint32_t i = (uint32_t)m;
		float rest = m - (float)i;

		if (rest > 0.5f || (rest == 0.5f && (i & 1)))
			i++;
		return (uint16_t)(sign | i);
	}
	/* normal: drop 13 mantissa bits with round to nearest even (carry may bump exp) */
	a += 0xfff + ((a >> 13) & 1);
	return (uint16_t)(sign | ((a - (112u << 23)) >> 13));
}

float tpc_bf16_to_float(uint16_t h)
{
	return u2f((uint32_t)h << 16);
}

uint16_t tpc_float_to_bf16(float f)
{
	uint32_t u = f2u(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
	u += 0x7fff + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

#define R_SUM(a, b) ((a) + (b))
#define R_PROD(a, b) ((a) * (b))
#define R_MIN(a, b) ((b) < (a) ? (b) : (a))
#define R_MAX(a, b) ((b) > (a) ? (b) : (a))
/* floats: NaN in either operand gives NaN */
#define R_FMIN(a, b) ((a) != (a) ? (a) : (b) != (b) ? (b) : R_MIN(a, b))
#define R_FMAX(a, b) ((a) != (a) ? (a) : (b) != (b) ? (b) : R_MAX(a, b))

#define LOOP(T, F)                                                                                 \
	do {                                                                                       \
		T *restrict x = acc;                                                               \
		const T *restrict y = in;                                                          \
		for (size_t i = 0; i < n; i++)                                                     \
			x[i] = F(x[i], y[i]);                                                      \
	} while (0)

/* Signed integers through their unsigned type: wrap, no undefined overflow. */
#define ULOOP(T, U, F)                                                                             \
	do {                                                                                       \
		T *restrict x = acc;                                                               \
		const T *restrict y = in;                                                          \
		for (size_t i = 0; i < n; i++)                                                     \
			x[i] = (T)F((U)x[i], (U)y[i]);                                             \
	} while (0)

#define HLOOP(TO, FROM, F)                                                                         \
	do {                                                                                       \
		uint16_t *restrict x = acc;                                                        \
		const uint16_t *restrict y = in;                                                   \
		for (size_t i = 0; i < n; i++)                                                     \
			x[i] = FROM(F(TO(x[i]), TO(y[i])));                                        \
	} while (0)

#define FLOAT_OPS(LOOPM, ...)                                                                      \
	switch (op) {                                                                              \
	case TP_OP_SUM:                                                                            \
		LOOPM(__VA_ARGS__, R_SUM);                                                         \
		break;                                                                             \
	case TP_OP_PROD:                                                                           \
		LOOPM(__VA_ARGS__, R_PROD);                                                        \
		break;                                                                             \
	case TP_OP_MIN:                                                                            \
		LOOPM(__VA_ARGS__, R_FMIN);                                                        \
		break;                                                                             \
	case TP_OP_MAX:                                                                            \
		LOOPM(__VA_ARGS__, R_FMAX);                                                        \
		break;                                                                             \
	}

/* sum and prod wrap through U; min and max compare as T */
#define INT_OPS(T, U)                                                                              \
	switch (op) {                                                                              \
	case TP_OP_SUM:                                                                            \
		ULOOP(T, U, R_SUM);                                                                \
		break;                                                                             \
	case TP_OP_PROD:                                                                           \
		ULOOP(T, U, R_PROD);                                                               \
		break;                                                                             \
	case TP_OP_MIN:                                                                            \
		LOOP(T, R_MIN);                                                                    \
		break;                                                                             \
	case TP_OP_MAX:                                                                            \
		LOOP(T, R_MAX);                                                                    \
		break;                                                                             \
	}

void tpc_reduce(void *acc, const void *in, size_t n, enum tp_dtype dt, enum tp_reduce_op op)
{
	switch (dt) {
	case TP_DTYPE_F32:
		FLOAT_OPS(LOOP, float);
		break;
	case TP_DTYPE_F64:
		FLOAT_OPS(LOOP, double);
		break;
	case TP_DTYPE_F16:
		FLOAT_OPS(HLOOP, tpc_f16_to_float, tpc_float_to_f16);
		break;
	case TP_DTYPE_BF16:
		FLOAT_OPS(HLOOP, tpc_bf16_to_float, tpc_float_to_bf16);
		break;
	case TP_DTYPE_I8:
		INT_OPS(int8_t, uint32_t);
		break;
	case TP_DTYPE_U8:
		INT_OPS(uint8_t, uint32_t);
		break;
	case TP_DTYPE_I32:
		INT_OPS(int32_t, uint32_t);
		break;
	case TP_DTYPE_I64:
		INT_OPS(int64_t, uint64_t);
		break;
	}
}

/* The same with a separate destination: @dst[i] = F(@a[i], @b[i]). */
#define LOOP3(T, F)                                                                                \
	do {                                                                                       \
		T *restrict x = dst;                                                               \
		const T *restrict p = a, *restrict q = b;                                          \
		for (size_t i = 0; i < n; i++)                                                     \
			x[i] = F(p[i], q[i]);                                                      \
	} while (0)

#define ULOOP3(T, U, F)                                                                            \
	do {                                                                                       \
		T *restrict x = dst;                                                               \
		const T *restrict p = a, *restrict q = b;                                          \
		for (size_t i = 0; i < n; i++)                                                     \
			x[i] = (T)F((U)p[i], (U)q[i]);                                             \
	} while (0)

#define HLOOP3(TO, FROM, F)                                                                        \
	do {                                                                                       \
		uint16_t *restrict x = dst;                                                        \
		const uint16_t *restrict p = a, *restrict q = b;                                   \
		for (size_t i = 0; i < n; i++)                                                     \
			x[i] = FROM(F(TO(p[i]), TO(q[i])));                                        \
	} while (0)

#define INT_OPS3(T, U)                                                                             \
	switch (op) {                                                                              \
	case TP_OP_SUM:                                                                            \
		ULOOP3(T, U, R_SUM);                                                               \
		break;                                                                             \
	case TP_OP_PROD:                                                                           \
		ULOOP3(T, U, R_PROD);                                                              \
		break;                                                                             \
	case TP_OP_MIN:                                                                            \
		LOOP3(T, R_MIN);                                                                   \
		break;                                                                             \
	case TP_OP_MAX:                                                                            \
		LOOP3(T, R_MAX);                                                                   \
		break;                                                                             \
	}

void tpc_reduce3(void *dst, const void *a, const void *b, size_t n, enum tp_dtype dt,
		 enum tp_reduce_op op)
{
	switch (dt) {
	case TP_DTYPE_F32:
		FLOAT_OPS(LOOP3, float);
		break;
	case TP_DTYPE_F64:
		FLOAT_OPS(LOOP3, double);
		break;
	case TP_DTYPE_F16:
		FLOAT_OPS(HLOOP3, tpc_f16_to_float, tpc_float_to_f16);
		break;
	case TP_DTYPE_BF16:
		FLOAT_OPS(HLOOP3, tpc_bf16_to_float, tpc_float_to_bf16);
		break;
	case TP_DTYPE_I8:
		INT_OPS3(int8_t, uint32_t);
		break;
	case TP_DTYPE_U8:
		INT_OPS3(uint8_t, uint32_t);
		break;
	case TP_DTYPE_I32:
		INT_OPS3(int32_t, uint32_t);
		break;
	case TP_DTYPE_I64:
		INT_OPS3(int64_t, uint64_t);
		break;
	}
}

/* The same with the operands swapped: @acc[i] = F(@in[i], @acc[i]). */
#define LOOPL(T, F)                                                                                \
	do {                                                                                       \
		T *restrict x = acc;                                                               \
		const T *restrict y = in;                                                          \
		for (size_t i = 0; i < n; i++)                                                     \
			x[i] = F(y[i], x[i]);                                                      \
	} while (0)

#define ULOOPL(T, U, F)                                                                            \
	do {                                                                                       \
		T *restrict x = acc;                                                               \
		const T *restrict y = in;                                                          \
		for (size_t i = 0; i < n; i++)                                                     \
			x[i] = (T)F((U)y[i], (U)x[i]);                                             \
	} while (0)

#define HLOOPL(TO, FROM, F)                                                                        \
	do {                                                                                       \
		uint16_t *restrict x = acc;                                                        \
		const uint16_t *restrict y = in;                                                   \
		for (size_t i = 0; i < n; i++)                                                     \
			x[i] = FROM(F(TO(y[i]), TO(x[i])));                                        \
	} while (0)

#define INT_OPSL(T, U)                                                                             \
	switch (op) {                                                                              \
	case TP_OP_SUM:                                                                            \
		ULOOPL(T, U, R_SUM);                                                               \
		break;                                                                             \
	case TP_OP_PROD:                                                                           \
		ULOOPL(T, U, R_PROD);                                                              \
		break;                                                                             \
	case TP_OP_MIN:                                                                            \
		LOOPL(T, R_MIN);                                                                   \
		break;                                                                             \
	case TP_OP_MAX:                                                                            \
		LOOPL(T, R_MAX);                                                                   \
		break;                                                                             \
	}

void tpc_reduce_left(void *acc, const void *in, size_t n, enum tp_dtype dt, enum tp_reduce_op op)
{
	switch (dt) {
	case TP_DTYPE_F32:
		FLOAT_OPS(LOOPL, float);
		break;
	case TP_DTYPE_F64:
		FLOAT_OPS(LOOPL, double);
		break;
	case TP_DTYPE_F16:
		FLOAT_OPS(HLOOPL, tpc_f16_to_float, tpc_float_to_f16);
		break;
	case TP_DTYPE_BF16:
		FLOAT_OPS(HLOOPL, tpc_bf16_to_float, tpc_float_to_bf16);
		break;
	case TP_DTYPE_I8:
		INT_OPSL(int8_t, uint32_t);
		break;
	case TP_DTYPE_U8:
		INT_OPSL(uint8_t, uint32_t);
		break;
	case TP_DTYPE_I32:
		INT_OPSL(int32_t, uint32_t);
		break;
	case TP_DTYPE_I64:
		INT_OPSL(int64_t, uint64_t);
		break;
	}
}
