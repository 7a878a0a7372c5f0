/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Reduction kernels (reduce.h): the binary16/bfloat16 conversions, the copies that go around
 * the cache, and the choice, once per process, of the kernels' build (reduce_kern.h) for the
 * CPU: the baseline's (below) or AVX2 with F16C (reduce_avx2.c). Which ranks fold in which
 * order is coll.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "reduce.h"
#include "tpu.h"

void tpc_copy_stream(void *dst, const void *src, size_t n)
{
	tpu_copy_stream(dst, src, n);
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

#define KSUF _generic
#include "reduce_kern.h"

int tpc_reduce_avx2_usable(void)
{
#if TPC_HAVE_AVX2
	unsigned int a, b, c, d;

	/* AVX2 as the compiler's runtime sees it (which checks that the kernel saves the
	 * registers), F16C from CPUID leaf 1 */
	if (!__builtin_cpu_supports("avx2") || !__get_cpuid(1, &a, &b, &c, &d))
		return 0;
	return (c & bit_F16C) != 0;
#else
	return 0;
#endif
}

int tpc_reduce_isa_env(const char *v, enum tpc_reduce_isa *ret)
{
	*ret = tpc_reduce_avx2_usable() ? TPC_ISA_AVX2 : TPC_ISA_GENERIC;
	if (!v || !*v || !strcmp(v, "auto"))
		return 0;
	if (!strcmp(v, "generic")) {
		*ret = TPC_ISA_GENERIC;
		return 0;
	}
	if (!strcmp(v, "avx2"))
		return *ret == TPC_ISA_AVX2 ? 0 : -ENOTSUP;
	return -EINVAL;
}

enum tpc_reduce_isa tpc_reduce_isa(void)
{
	static int chosen; /* 0: not yet; every thread chooses the same */
	int v = __atomic_load_n(&chosen, __ATOMIC_RELAXED);
	enum tpc_reduce_isa isa;

	if (v)
		return (enum tpc_reduce_isa)v;
	/* a bad value gives the best there is (a join refused it already) */
	tpc_reduce_isa_env(getenv("TP_REDUCE_ISA"), &isa);
	__atomic_store_n(&chosen, (int)isa, __ATOMIC_RELAXED);
	return isa;
}

static const struct tpc_reduce_kernels kernels_generic = {tpc_reduce_generic, tpc_reduce3_generic,
							  tpc_reduce_left_generic};
#if TPC_HAVE_AVX2
static const struct tpc_reduce_kernels kernels_avx2 = {tpc_reduce_avx2, tpc_reduce3_avx2,
						       tpc_reduce_left_avx2};
#endif

const struct tpc_reduce_kernels *tpc_reduce_kernels(enum tpc_reduce_isa isa)
{
#if TPC_HAVE_AVX2
	if (isa == TPC_ISA_AVX2)
		return &kernels_avx2;
#endif
	return isa == TPC_ISA_GENERIC ? &kernels_generic : NULL;
}

void tpc_reduce(void *acc, const void *in, size_t n, enum tp_dtype dt, enum tp_reduce_op op)
{
	tpc_reduce_kernels(tpc_reduce_isa())->reduce(acc, in, n, dt, op);
}

void tpc_reduce3(void *dst, const void *a, const void *b, size_t n, enum tp_dtype dt,
		 enum tp_reduce_op op)
{
	tpc_reduce_kernels(tpc_reduce_isa())->reduce3(dst, a, b, n, dt, op);
}

void tpc_reduce_left(void *acc, const void *in, size_t n, enum tp_dtype dt, enum tp_reduce_op op)
{
	tpc_reduce_kernels(tpc_reduce_isa())->reduce_left(acc, in, n, dt, op);
}
