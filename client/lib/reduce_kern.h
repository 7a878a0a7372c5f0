/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The reduction kernels' bodies (reduce.h), compiled once for each instruction set: reduce.c
 * includes this file with KSUF _generic (the architecture's baseline), reduce_avx2.c with KSUF
 * _avx2 (built with -mavx2 -mf16c, where it defines KHALF, its own binary16 and bfloat16 loops).
 * One plain loop per (type, operation), written so that the compiler vectorises them (no
 * aliasing between the destination and the sources, no branches: selects); integers wrap on
 * overflow (computed unsigned). Every variant leaves the same bits (tests/unit/test_reduce.c).
 */
#ifndef KSUF
#error "reduce_kern.h: define KSUF before including it"
#endif

#define KCAT2(a, b) a##b
#define KCAT(a, b) KCAT2(a, b)
#define KNAME(f) KCAT(f, KSUF) /* declared in reduce.h (TPC_REDUCE_DECLARE) */

#define R_SUM(a, b) ((a) + (b))
#define R_PROD(a, b) ((a) * (b))
#define R_MIN(a, b) ((b) < (a) ? (b) : (a))
#define R_MAX(a, b) ((b) > (a) ? (b) : (a))
/*
 * floats: a NaN operand gives a NaN, and every NaN result is the quiet NaN of positive sign
 * (f32 0x7fc00000, f64 0x7ff8000000000000; f16 0x7e00 and bf16 0x7fc0 once narrowed). Which of
 * two NaNs the hardware returns depends on the order in which the compiler put the operands,
 * and a compiler may hand on any NaN's payload; the builds of these loops, by any compiler,
 * for any instruction set, on different hosts of a group, must leave the same bits. Selects
 * after the operation, with both operands loaded first: the compiler vectorises them where it
 * may compute the operation unconditionally (-fno-trapping-math, client/lib/meson.build), not
 * a load under a condition.
 */
#define R_CANON(T, R)                                                                              \
	({                                                                                         \
		T cn_r = (R);                                                                      \
		cn_r != cn_r ? (T)__builtin_nan("") : cn_r;                                        \
	})
#define R_FOP(A, B, OP)                                                                            \
	({                                                                                         \
		__typeof__(B) fo_a = (A), fo_b = (B);                                              \
		R_CANON(__typeof__(B), fo_a OP fo_b);                                              \
	})
#define R_FSUM(a, b) R_FOP(a, b, +)
#define R_FPROD(a, b) R_FOP(a, b, *)
/* min, max: the canonical NaN where either is a NaN, else the smaller (larger) */
#define R_FMINMAX(A, B, M)                                                                         \
	({                                                                                         \
		__typeof__(B) fm_a = (A), fm_b = (B), fm_r = M(fm_a, fm_b);                        \
		__builtin_isunordered(fm_a, fm_b) ? (__typeof__(B))__builtin_nan("") : fm_r;       \
	})
#define R_FMIN(a, b) R_FMINMAX(a, b, R_MIN)
#define R_FMAX(a, b) R_FMINMAX(a, b, R_MAX)

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
		LOOPM(__VA_ARGS__, R_FSUM);                                                        \
		break;                                                                             \
	case TP_OP_PROD:                                                                           \
		LOOPM(__VA_ARGS__, R_FPROD);                                                       \
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

void KNAME(tpc_reduce)(void *acc, const void *in, size_t n, enum tp_dtype dt, enum tp_reduce_op op)
{
	switch (dt) {
	case TP_DTYPE_F32:
		FLOAT_OPS(LOOP, float);
		break;
	case TP_DTYPE_F64:
		FLOAT_OPS(LOOP, double);
		break;
	case TP_DTYPE_F16:
#ifdef KHALF
	case TP_DTYPE_BF16:
		KHALF(acc, acc, in, n, dt, op);
		break;
#else
		FLOAT_OPS(HLOOP, tpc_f16_to_float, tpc_float_to_f16);
		break;
	case TP_DTYPE_BF16:
		FLOAT_OPS(HLOOP, tpc_bf16_to_float, tpc_float_to_bf16);
		break;
#endif
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

void KNAME(tpc_reduce3)(void *dst, const void *a, const void *b, size_t n, enum tp_dtype dt,
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
#ifdef KHALF
	case TP_DTYPE_BF16:
		KHALF(dst, a, b, n, dt, op);
		break;
#else
		FLOAT_OPS(HLOOP3, tpc_f16_to_float, tpc_float_to_f16);
		break;
	case TP_DTYPE_BF16:
		FLOAT_OPS(HLOOP3, tpc_bf16_to_float, tpc_float_to_bf16);
		break;
#endif
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

void KNAME(tpc_reduce_left)(void *acc, const void *in, size_t n, enum tp_dtype dt,
			    enum tp_reduce_op op)
{
	switch (dt) {
	case TP_DTYPE_F32:
		FLOAT_OPS(LOOPL, float);
		break;
	case TP_DTYPE_F64:
		FLOAT_OPS(LOOPL, double);
		break;
	case TP_DTYPE_F16:
#ifdef KHALF
	case TP_DTYPE_BF16:
		KHALF(acc, in, acc, n, dt, op);
		break;
#else
		FLOAT_OPS(HLOOPL, tpc_f16_to_float, tpc_float_to_f16);
		break;
	case TP_DTYPE_BF16:
		FLOAT_OPS(HLOOPL, tpc_bf16_to_float, tpc_float_to_bf16);
		break;
#endif
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
