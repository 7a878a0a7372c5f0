/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The reduction kernels of the collectives (reduce.c): element-wise sum, product, minimum and
 * maximum for every tp_dtype, and the half-precision conversions they use. Pure functions over
 * memory, no state: the collectives engine (coll.c) decides which slices to fold in which order,
 * and the unit suite (tests/unit/test_reduce.c) checks them against scalar references.
 */
#ifndef TPC_REDUCE_H
#define TPC_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "tpclient.h"

/* Is @op a built-in reduction (TP_OP_SUM..TP_OP_MAX)? */
static inline int tpc_reduce_op_valid(int op)
{
	return op >= TP_OP_SUM && op <= TP_OP_MAX;
}

/*
 * tpc_reduce() - @acc[i] = @op(@acc[i], @in[i]) for @n elements of @dt; f16 and bf16 are computed
 * in float and rounded to nearest even after each step. Borrows @acc and @in (may not
 * overlap). @dt and @op must be valid (tp_dtype_size() != 0, tpc_reduce_op_valid()).
 */
void tpc_reduce(void *acc, const void *in, size_t n, enum tp_dtype dt, enum tp_reduce_op op);

/*
 * tpc_reduce3() - @dst[i] = @op(@a[i], @b[i]) for @n elements of @dt: tpc_reduce() of @b into a
 * copy of @a, bit for bit, in one pass. Borrows all three (@dst may not overlap @a or @b).
 */
void tpc_reduce3(void *dst, const void *a, const void *b, size_t n, enum tp_dtype dt,
		 enum tp_reduce_op op);

/*
 * tpc_reduce_left() - @acc[i] = @op(@in[i], @acc[i]) for @n elements of @dt: the received value
 * first, as tpc_reduce() into a copy of @in leaves it, bit for bit, without that copy (a
 * leader's fold of another host's partial result ahead of its own, client/lib/planrun.c).
 * Borrows @acc and @in (may not overlap).
 */
void tpc_reduce_left(void *acc, const void *in, size_t n, enum tp_dtype dt, enum tp_reduce_op op);

/*
 * tpc_copy_stream() - copies @n bytes from @src to @dst with non-temporal stores where the CPU
 * has them (x86-64), so that a large result written once goes to memory without first reading
 * every destination line into the cache; plain memcpy elsewhere. For destinations that will
 * not be read again soon. Borrows both (may not overlap).
 */
void tpc_copy_stream(void *dst, const void *src, size_t n);

/* The most of the last-level cache a copy can count on (tpc_cache_bytes()): a virtual machine
 * reports its host's whole cache, shared with other guests (a 2-CPU guest on a 105 MiB cache
 * read a 16 MiB buffer back at 19 GB/s and a 32 MiB one at 10 GB/s, memory's rate). */
#define TPC_CACHE_MAX ((size_t)32 << 20)

/*
 * tpc_cache_bytes() - the last-level cache as sysfs (else sysconf) reports it, at most
 * TPC_CACHE_MAX; TPC_CACHE_MAX where neither says. Looked up once per process (thread safe).
 */
size_t tpc_cache_bytes(void);

/*
 * tpc_copy_far() - copies @n bytes from @src to @dst for another core or a later pass to read
 * (a channel item into the buffer its readers map, or out of it into the reader's memory):
 * from a quarter of tpc_cache_bytes() on (two such copies in flight, each with its source and
 * destination, outgrow the cache) with non-temporal stores, tpc_copy_stream(), which spare
 * reading every destination line from memory first; below, memcpy. Borrows both (may not
 * overlap).
 */
void tpc_copy_far(void *dst, const void *src, size_t n);

/*
 * The kernels' builds (reduce_kern.h): TPC_ISA_GENERIC, the architecture's baseline, and
 * TPC_ISA_AVX2 (x86-64 with AVX2 and F16C, where the library was built with it). Both leave
 * the same bits for the same inputs, so members on different CPUs agree. tpc_reduce_isa() is
 * the one the three calls above take in this process, chosen at the first call from
 * TP_REDUCE_ISA in the environment (tpc_reduce_isa_env()).
 */
enum tpc_reduce_isa {
	TPC_ISA_GENERIC = 1,
	TPC_ISA_AVX2 = 2,
};
enum tpc_reduce_isa tpc_reduce_isa(void);
/*
 * tpc_reduce_isa_env() - the build a TP_REDUCE_ISA value @v asks for: unset, empty or "auto"
 * the best this CPU runs, "generic" the baseline, "avx2" the AVX2 build (-ENOTSUP where this
 * CPU or library has none; *@ret is then the best there is); -EINVAL for any other value (and
 * *@ret the best). tp_group_join() refuses what this refuses, naming the value.
 */
int tpc_reduce_isa_env(const char *v, enum tpc_reduce_isa *ret);
/* Does this CPU run the AVX2 build, and was the library built with it? */
int tpc_reduce_avx2_usable(void);
/* Each build's three kernels (reduce_kern.h defines them; the _avx2 ones only where the library
 * is built with them, TPC_HAVE_AVX2). */
#define TPC_REDUCE_DECLARE(S)                                                                      \
	void tpc_reduce##S(void *acc, const void *in, size_t n, enum tp_dtype dt,                  \
			   enum tp_reduce_op op);                                                  \
	void tpc_reduce3##S(void *dst, const void *a, const void *b, size_t n, enum tp_dtype dt,   \
			    enum tp_reduce_op op);                                                 \
	void tpc_reduce_left##S(void *acc, const void *in, size_t n, enum tp_dtype dt,             \
				enum tp_reduce_op op)
TPC_REDUCE_DECLARE(_generic);
TPC_REDUCE_DECLARE(_avx2);

struct tpc_reduce_kernels {
	void (*reduce)(void *acc, const void *in, size_t n, enum tp_dtype dt, enum tp_reduce_op op);
	void (*reduce3)(void *dst, const void *a, const void *b, size_t n, enum tp_dtype dt,
			enum tp_reduce_op op);
	void (*reduce_left)(void *acc, const void *in, size_t n, enum tp_dtype dt,
			    enum tp_reduce_op op);
};
/*
 * tpc_reduce_kernels() - the three kernels of build @isa, or NULL where this library has no
 * such build; they may run only where tpc_reduce_isa_env() would choose them (for AVX2:
 * tpc_reduce_avx2_usable()). The three calls above take tpc_reduce_kernels(tpc_reduce_isa());
 * the unit suite and bench_reduce compare the builds through it.
 */
const struct tpc_reduce_kernels *tpc_reduce_kernels(enum tpc_reduce_isa isa);

/* binary16 <-> float (exact widening; narrowing rounds to nearest even, NaN stays NaN). */
float tpc_f16_to_float(uint16_t h);
uint16_t tpc_float_to_f16(float f);
/* bfloat16 <-> float (likewise). */
float tpc_bf16_to_float(uint16_t h);
uint16_t tpc_float_to_bf16(float f);

#endif
