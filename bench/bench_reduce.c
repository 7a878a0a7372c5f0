/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_reduce: the collectives' reduction kernels alone (client/lib/reduce.c and the builds of
 * reduce_kern.h), dst = a op b (tpc_reduce3, what a member's fold of two parts runs), for every
 * dtype and operation, each build the CPU runs: the baseline's ("generic") and, where the
 * library has it and the CPU runs it, AVX2 with F16C ("avx2"). Prints one line per (build,
 * dtype, op, block):
 *   reduce isa=avx2 dtype=f16 op=sum block=16384 GBps=9.13
 * GB/s of output, the best of R rounds of enough calls to take about 10 ms each: a block of
 * 16 KiB is what the arena's fold works on (in the level-1 cache); a larger one (--block)
 * measures memory. Figures only; nothing here passes or fails.
 *   bench_reduce [--block BYTES[,BYTES...]] [--rounds R] [--dtype f16,bf16,...] [--op sum,...]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "reduce.h"

typedef void (*reduce3_fn)(void *, const void *, const void *, size_t, enum tp_dtype,
			   enum tp_reduce_op);

static const struct {
	const char *name;
	enum tp_dtype dt;
} dtypes[] = {{"f16", TP_DTYPE_F16}, {"bf16", TP_DTYPE_BF16}, {"f32", TP_DTYPE_F32},
	      {"f64", TP_DTYPE_F64}, {"i8", TP_DTYPE_I8},     {"u8", TP_DTYPE_U8},
	      {"i32", TP_DTYPE_I32}, {"i64", TP_DTYPE_I64}};
static const char *const op_names[] = {"", "sum", "prod", "min", "max"};

static int listed(const char *list, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = list; p && *p;) {
		const char *e = strchr(p, ',');
		size_t len = e ? (size_t)(e - p) : strlen(p);

		if (len == n && !strncmp(p, name, n))
			return 1;
		p = e ? e + 1 : NULL;
	}
	return !list;
}

/* small values (exact sums, no infinities); the same bytes for every build */
static void fill(uint8_t *p, size_t len, enum tp_dtype dt, unsigned seed)
{
	size_t es = tp_dtype_size(dt);

	for (size_t i = 0; i < len / es; i++) {
		float f = (float)((i * 7 + seed) % 17) / 4.0f + 0.5f;
		double d = f;
		uint16_t h = dt == TP_DTYPE_F16 ? tpc_float_to_f16(f) : tpc_float_to_bf16(f);
		uint64_t v = (i * 2654435761u + seed) >> 7;

		if (dt == TP_DTYPE_F16 || dt == TP_DTYPE_BF16)
			memcpy(p + i * 2, &h, 2);
		else if (dt == TP_DTYPE_F32)
			memcpy(p + i * 4, &f, 4);
		else if (dt == TP_DTYPE_F64)
			memcpy(p + i * 8, &d, 8);
		else
			memcpy(p + i * es, &v, es);
	}
}

static double run(reduce3_fn fn, uint8_t *dst, const uint8_t *a, const uint8_t *b, size_t len,
		  enum tp_dtype dt, int op, unsigned rounds)
{
	size_t n = len / tp_dtype_size(dt);
	unsigned calls = 1;
	double best = 0;
	uint64_t t0;

	/* as many calls as take about 10 ms, from one timed call */
	t0 = bench_now_ns();
	fn(dst, a, b, n, dt, (enum tp_reduce_op)op);
	calls = (unsigned)(10e6 / (double)(bench_now_ns() - t0 + 1)) + 1;
	for (unsigned r = 0; r < rounds; r++) {
		double gbps;

		t0 = bench_now_ns();
		for (unsigned c = 0; c < calls; c++) {
			fn(dst, a, b, n, dt, (enum tp_reduce_op)op);
			__asm__ volatile("" : : "r"(dst) : "memory");
		}
		gbps = (double)len * calls / (double)(bench_now_ns() - t0);
		best = gbps > best ? gbps : best;
	}
	return best;
}

int main(int argc, char **argv)
{
	const char *blocks = "16384", *dt_list = NULL, *op_list = NULL;
	unsigned rounds = 7;
	struct {
		const char *name;
		reduce3_fn fn;
		int ok;
	} isas[] = {{"generic", tpc_reduce_kernels(TPC_ISA_GENERIC)->reduce3, 1},
		    {"avx2", NULL, tpc_reduce_avx2_usable()}};

	if (isas[1].ok) /* the AVX2 build exists where it is usable */
		isas[1].fn = tpc_reduce_kernels(TPC_ISA_AVX2)->reduce3;
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(argv[i], "--block") && v)
			blocks = argv[++i];
		else if (!strcmp(argv[i], "--rounds") && v)
			rounds = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--dtype") && v)
			dt_list = argv[++i];
		else if (!strcmp(argv[i], "--op") && v)
			op_list = argv[++i];
		else {
			fprintf(stderr,
				"usage: %s [--block BYTES[,BYTES...]] [--rounds R] "
				"[--dtype f16,bf16,f32,...] [--op sum,prod,min,max]\n",
				argv[0]);
			return 2;
		}
	}
	if (!isas[1].ok)
		printf("# avx2: not run (the library was built without it, or this CPU lacks AVX2 "
		       "or F16C)\n");
	for (const char *p = blocks; p && *p;) {
		size_t len;
		char tok[32];
		const char *e = strchr(p, ',');
		size_t tl = e ? (size_t)(e - p) : strlen(p);

		snprintf(tok, sizeof(tok), "%.*s", (int)(tl < 31 ? tl : 31), p);
		p = e ? e + 1 : NULL;
		if (bench_parse_size(tok, &len) < 0 || len < 64) {
			fprintf(stderr, "bench_reduce: bad block %s\n", tok);
			return 2;
		}
		for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); d++) {
			uint8_t *a, *b, *dst;

			if (!listed(dt_list, dtypes[d].name))
				continue;
			a = aligned_alloc(64, len);
			b = aligned_alloc(64, len);
			dst = aligned_alloc(64, len);
			if (!a || !b || !dst)
				return 1;
			fill(a, len, dtypes[d].dt, 1);
			fill(b, len, dtypes[d].dt, 2);
			memset(dst, 0, len);
			for (int op = TP_OP_SUM; op <= TP_OP_MAX; op++) {
				if (!listed(op_list, op_names[op]))
					continue;
				for (size_t k = 0; k < 2; k++)
					if (isas[k].ok)
						printf("reduce isa=%s dtype=%s op=%s block=%zu "
						       "GBps=%.2f\n",
						       isas[k].name, dtypes[d].name, op_names[op],
						       len,
						       run(isas[k].fn, dst, a, b, len, dtypes[d].dt,
							   op, rounds));
				fflush(stdout);
			}
			free(a);
			free(b);
			free(dst);
		}
	}
	return 0;
}
