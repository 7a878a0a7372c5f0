/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A group member for the service suite's collectives across hosts (group_xcoll.sh). It joins
 * group NAME as RANK of SIZE through the daemon at SOCKET and coordinator COORD, then:
 *
 *   battery  runs every collective against references computed here: all-reduce for every
 *            dtype and built-in op and a user reduction (0, 1, 7, 1031, 300007 and, for a
 *            float sum, 1100003 and 2621447 elements, and for an i64 maximum 2621447: the
 *            last two pipelined in segments, 3 and 5 of them),
 *            whose values make every result exact, so equal to the reference bit for bit),
 *            float sums of pseudo-random values, 200003 elements and 2621447 in place
 *            (printed as hashes: the script checks every rank has the same bits), broadcast
 *            from every root, all-gather, reduce-scatter, barrier, uneven steps (rank r
 *            contributes r + 1 steps; and a pipelined one in which only ranks 0, 3, ...
 *            contribute, then none), three asynchronous calls
 *            at once, and a mismatched call (rank 1 passes another count: -EPROTO on every
 *            rank, then the group goes on). Prints "ok battery" or "FAIL ..." lines.
 *   seg      broadcasts (from every root), all-gathers and reduce-scatters large enough to be
 *            pipelined across hosts (TP_GROUP_PIPELINE decides), of counts whose last segment
 *            is one element and of a prime count, against references computed here; then a
 *            float reduce-scatter of pseudo-random values whose parts it all-gathers and
 *            prints as a hash (the script checks every rank, pipelined or not, has the same
 *            bits); then mismatched all-gathers (-EPROTO on every rank). Prints "ok seg" or
 *            "FAIL ..." lines.
 *   loop     all-reduces 4 MiB (GROUP_COLL_LOOP_N floats if set; GROUP_COLL_LOOP_OP
 *            broadcast or allgather: those instead, from rank 0, of that many floats each)
 *            until a call fails, then prints "failed: ERRNO: MESSAGE".
 *   leave    all-reduces 4 MiB three times, leaves, prints "left".
 *   abort    all-reduces 4 MiB three times, aborts the group, prints "aborted".
 *   rs       one reduce-scatter of 1 MiB parts (i32) checked against the reference, prints
 *            "rs ok", then stays in the group (so that tpipctl shows its counters) until the
 *            file named by GROUP_COLL_HOLD exists.
 *
 * Usage: group_coll SOCKET NAME RANK SIZE COORD MS MODE. Exit 0 ok, 1 failure, 2 usage.
 */
#include <errno.h>
#include <stdbool.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <tpclient.h>
#include <unistd.h>

static int rank, size, fails;
static const char *gname;

#define FAIL(...)                                                                            \
	do {                                                                                 \
		printf("FAIL rank %d: ", rank);                                              \
		printf(__VA_ARGS__);                                                         \
		printf("\n");                                                                \
		fflush(stdout);                                                              \
		fails++;                                                                     \
	} while (0)

static uint64_t fnv(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 1099511628211ull;
	return h;
}

/* The value rank @r contributes at element @i for @op: small integers, so every result is
 * exact in every dtype (products stay within i8 for up to 6 ranks). */
static long val(int op, int r, size_t i)
{
	switch (op) {
	case TP_OP_SUM: return (long)((r + i) % 5);
	case TP_OP_PROD: return (long)((r * 3 + i) % 7 == 0 ? 2 : 1);
	default: return (long)((r * 7 + i) % 11) - 5;
	}
}

static long ref(int op, size_t i, int dt, int n)
{
	long a = val(op, 0, i);

	for (int r = 1; r < n; r++) {
		long b = val(op, r, i);

		a = op == TP_OP_SUM ? a + b : op == TP_OP_PROD ? a * b : op == TP_OP_MIN ?
			(b < a ? b : a) : (b > a ? b : a);
	}
	if (dt == TP_DTYPE_U8 && op >= TP_OP_MIN) /* u8: values shifted by 5 */
		a += 5;
	return a;
}

static uint16_t to_half(long v, int bf)
{
	float f = (float)v;
	uint32_t u;

	memcpy(&u, &f, 4);
	if (bf)
		return (uint16_t)(u >> 16); /* small integers: exact */
	/* binary16 of a small integer: sign, exponent, mantissa (exact for |v| < 2048) */
	if (v == 0)
		return 0;
	{
		uint16_t s = v < 0 ? 0x8000 : 0;
		long a = v < 0 ? -v : v;
		int e = 0;

		while ((a >> e) > 1)
			e++;
		return (uint16_t)(s | ((e + 15) << 10) | ((a << (10 - e)) & 0x3ff));
	}
}

static void put(void *buf, int dt, size_t i, long v)
{
	switch (dt) {
	case TP_DTYPE_F16: ((uint16_t *)buf)[i] = to_half(v, 0); break;
	case TP_DTYPE_BF16: ((uint16_t *)buf)[i] = to_half(v, 1); break;
	case TP_DTYPE_F32: ((float *)buf)[i] = (float)v; break;
	case TP_DTYPE_F64: ((double *)buf)[i] = (double)v; break;
	case TP_DTYPE_I8: ((int8_t *)buf)[i] = (int8_t)v; break;
	case TP_DTYPE_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
	case TP_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
	case TP_DTYPE_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
	}
}

static void user_sum_i32(void *inout, const void *in, size_t n, enum tp_dtype dt, void *u)
{
	int32_t *a = inout;
	const int32_t *b = in;

	(void)dt;
	(void)u;
	for (size_t i = 0; i < n; i++)
		a[i] += b[i];
}

static void allreduce_exact(struct tp_group *g)
{
	static const size_t counts[] = { 0, 1, 7, 1031, 300007, 1100003, 2621447 };

	for (int dt = TP_DTYPE_F16; dt <= TP_DTYPE_I64; dt++)
		for (int op = TP_OP_SUM; op <= TP_OP_MAX; op++)
			for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
				size_t n = counts[k], es = tp_dtype_size((enum tp_dtype)dt);
				uint8_t *in, *out, *want;
				int r;

				if ((k == 4 && dt != TP_DTYPE_F32 && dt != TP_DTYPE_I8) ||
				    (k == 5 && (dt != TP_DTYPE_F32 || op != TP_OP_SUM)) ||
				    (k == 6 && !(dt == TP_DTYPE_F32 && op == TP_OP_SUM) &&
				     !(dt == TP_DTYPE_I64 && op == TP_OP_MAX)))
					continue; /* the big sizes: a few cases are enough (over
						   * 2 MiB through the leaders' shared buffers,
						   * from 8 MiB pipelined in 4 MiB segments, the
						   * last one shorter) */
				in = malloc(n * es + 1);
				out = malloc(n * es + 1);
				want = malloc(n * es + 1);
				for (size_t i = 0; i < n; i++) {
					long s = dt == TP_DTYPE_U8 && op >= TP_OP_MIN ? 5 : 0;

					put(in, dt, i, val(op, rank, i) + s);
					put(want, dt, i, ref(op, i, dt, size));
				}
				r = tp_allreduce(g, in, out, n, (enum tp_dtype)dt,
						 (enum tp_reduce_op)op);
				if (r < 0)
					FAIL("allreduce dt %d op %d n %zu: %s", dt, op, n,
					     tp_last_error());
				else if (n && memcmp(out, want, n * es) != 0)
					FAIL("allreduce dt %d op %d n %zu: wrong result", dt, op, n);
				free(in);
				free(out);
				free(want);
			}
}

static void allreduce_misc(struct tp_group *g)
{
	size_t n = 200003;
	float *f = malloc(n * sizeof(*f));
	int32_t *a = malloc(n * 4), *b = malloc(n * 4);
	uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1);
	int r;

	for (size_t i = 0; i < n; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		f[i] = (float)((double)(seed >> 11) / 9007199254740992.0 - 0.5) * 1e3f;
		a[i] = (int32_t)(i % 1000) * (rank + 1);
	}
	r = tp_allreduce(g, f, f, n, TP_DTYPE_F32, TP_OP_SUM);
	if (r < 0)
		FAIL("float sum: %s", tp_last_error());
	else
		printf("hash float-sum %016" PRIx64 "\n", fnv(f, n * sizeof(*f)));
	r = tp_allreduce_fn(g, a, b, n, TP_DTYPE_I32, user_sum_i32, NULL);
	for (size_t i = 0; r == 0 && i < n; i++)
		if (b[i] != (int32_t)(i % 1000) * size * (size + 1) / 2) {
			FAIL("user reduction: element %zu is %d", i, b[i]);
			break;
		}
	if (r < 0)
		FAIL("user reduction: %s", tp_last_error());
	free(f);
	free(a);
	free(b);
	/* pipelined (over 8 MiB), in place */
	n = 2621447;
	f = malloc(n * sizeof(*f));
	for (size_t i = 0; i < n; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		f[i] = (float)((double)(seed >> 11) / 9007199254740992.0 - 0.5) * 1e3f;
	}
	r = tp_allreduce(g, f, f, n, TP_DTYPE_F32, TP_OP_SUM);
	if (r < 0)
		FAIL("large float sum: %s", tp_last_error());
	else
		printf("hash float-sum-large %016" PRIx64 "\n", fnv(f, n * sizeof(*f)));
	free(f);
}

static void broadcast_gather_scatter(struct tp_group *g)
{
	static const size_t counts[] = { 0, 1, 13, 300001 };

	for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
		size_t n = counts[k];
		int32_t *v = malloc(n * 4 + 4), *all = malloc(n * 4 * (size_t)size + 4);
		int32_t *rs = malloc(n * 4 * (size_t)size + 4), *part = malloc(n * 4 + 4);

		for (int root = 0; root < size; root++) {
			for (size_t i = 0; i < n; i++)
				v[i] = rank == root ? (int32_t)(i * 31 + (size_t)root) : -1;
			if (tp_broadcast(g, v, n, TP_DTYPE_I32, root) < 0)
				FAIL("broadcast root %d n %zu: %s", root, n, tp_last_error());
			for (size_t i = 0; i < n; i++)
				if (v[i] != (int32_t)(i * 31 + (size_t)root)) {
					FAIL("broadcast root %d n %zu: element %zu", root, n, i);
					break;
				}
		}
		for (size_t i = 0; i < n; i++)
			v[i] = (int32_t)(i + 1000000 * (size_t)rank);
		if (tp_allgather(g, v, all, n, TP_DTYPE_I32) < 0)
			FAIL("allgather n %zu: %s", n, tp_last_error());
		for (size_t i = 0; i < n * (size_t)size; i++)
			if (all[i] != (int32_t)(i % n + 1000000 * (i / n))) {
				FAIL("allgather n %zu: element %zu", n, i);
				break;
			}
		for (size_t i = 0; i < n * (size_t)size; i++)
			rs[i] = (int32_t)(i + (size_t)rank);
		if (tp_reduce_scatter(g, rs, part, n, TP_DTYPE_I32, TP_OP_SUM) < 0)
			FAIL("reduce_scatter n %zu: %s", n, tp_last_error());
		for (size_t i = 0; i < n; i++) {
			size_t at = (size_t)rank * n + i;

			if (part[i] != (int32_t)(at * (size_t)size) + size * (size - 1) / 2) {
				FAIL("reduce_scatter n %zu: element %zu", n, i);
				break;
			}
		}
		free(v);
		free(all);
		free(rs);
		free(part);
	}
}

static void uneven(struct tp_group *g)
{
	int64_t x[3], out[3];
	unsigned n = 0;

	for (int step = 0;; step++) {
		for (int i = 0; i < 3; i++)
			x[i] = (int64_t)(rank + 1) * (i + 1);
		if (tp_allreduce_uneven(g, step <= rank ? x : NULL, out, 3, TP_DTYPE_I64,
					TP_OP_SUM, &n) < 0) {
			FAIL("uneven step %d: %s", step, tp_last_error());
			return;
		}
		if (n == 0) {
			if (step != size)
				FAIL("uneven: all finished at step %d, not %d", step, size);
			return;
		}
		if (n != (unsigned)(size - step)) {
			FAIL("uneven step %d: %u contributed", step, n);
			return;
		}
		/* ranks step..size-1 contribute (r + 1)(i + 1) */
		for (int i = 0; i < 3; i++) {
			int64_t want = 0;

			for (int r = step; r < size; r++)
				want += (int64_t)(r + 1) * (i + 1);
			if (out[i] != want)
				FAIL("uneven step %d: element %d is %" PRId64 ", not %" PRId64, step,
				     i, out[i], want);
		}
	}
}

/* A pipelined uneven all-reduce (over 8 MiB): ranks 0, 3, ... contribute (so with ranks 0 and
 * 3 on one host, another host contributes nothing: the identity), then nobody. */
static void uneven_large(struct tp_group *g)
{
	size_t n = 2621447;
	int32_t *x = malloc(n * 4), *out = malloc(n * 4);
	int32_t want = 0;
	unsigned got = 0;

	for (int r = 0; r < size; r += 3)
		want += r + 1;
	for (size_t i = 0; i < n; i++)
		x[i] = (rank + 1) * (int32_t)(i % 1000 + 1);
	if (tp_allreduce_uneven(g, rank % 3 == 0 ? x : NULL, out, n, TP_DTYPE_I32, TP_OP_SUM,
				&got) < 0)
		FAIL("uneven large: %s", tp_last_error());
	else if (got != (unsigned)(size + 2) / 3)
		FAIL("uneven large: %u contributed", got);
	for (size_t i = 0; got && i < n; i++)
		if (out[i] != want * (int32_t)(i % 1000 + 1)) {
			FAIL("uneven large: element %zu is %d", i, out[i]);
			break;
		}
	if (tp_allreduce_uneven(g, NULL, out, n, TP_DTYPE_I32, TP_OP_SUM, &got) < 0)
		FAIL("uneven large, nobody: %s", tp_last_error());
	else if (got != 0)
		FAIL("uneven large, nobody: %u contributed", got);
	free(x);
	free(out);
}

/* Elements per rank of a segment of a pipelined all-gather or reduce-scatter (tpc_plan_xseg():
 * 4 MiB over the ranks' blocks), or of a broadcast (@blocks 1), of i32. */
static size_t seg_of(int blocks)
{
	size_t n = ((size_t)4 << 20) / 4 / (size_t)blocks;

	return n ? n : 1;
}

static void seg_broadcast(struct tp_group *g, size_t n)
{
	int32_t *v = malloc(n * 4);

	for (int root = 0; root < size; root++) {
		for (size_t i = 0; i < n; i++)
			v[i] = rank == root ? (int32_t)(i * 31 + (size_t)root) : -1;
		if (tp_broadcast(g, v, n, TP_DTYPE_I32, root) < 0)
			FAIL("seg broadcast root %d n %zu: %s", root, n, tp_last_error());
		for (size_t i = 0; i < n; i++)
			if (v[i] != (int32_t)(i * 31 + (size_t)root)) {
				FAIL("seg broadcast root %d n %zu: element %zu is %d", root, n, i,
				     v[i]);
				break;
			}
	}
	free(v);
}

static void seg_gather_scatter(struct tp_group *g, size_t n)
{
	size_t all = n * (size_t)size;
	int32_t *v = malloc(n * 4), *out = malloc(all * 4), *rs = malloc(all * 4);

	for (size_t i = 0; i < n; i++)
		v[i] = (int32_t)(i + 1000000 * (size_t)rank);
	memset(out, 0xff, all * 4);
	if (tp_allgather(g, v, out, n, TP_DTYPE_I32) < 0)
		FAIL("seg allgather n %zu: %s", n, tp_last_error());
	for (size_t i = 0; i < all; i++)
		if (out[i] != (int32_t)(i % n + 1000000 * (i / n))) {
			FAIL("seg allgather n %zu: element %zu is %d", n, i, out[i]);
			break;
		}
	for (size_t i = 0; i < all; i++)
		rs[i] = (int32_t)(i + (size_t)rank);
	memset(v, 0xff, n * 4);
	if (tp_reduce_scatter(g, rs, v, n, TP_DTYPE_I32, TP_OP_SUM) < 0)
		FAIL("seg reduce_scatter n %zu: %s", n, tp_last_error());
	for (size_t i = 0; i < n; i++) {
		size_t at = (size_t)rank * n + i;

		if (v[i] != (int32_t)(at * (size_t)size) + size * (size - 1) / 2) {
			FAIL("seg reduce_scatter n %zu: element %zu is %d", n, i, v[i]);
			break;
		}
	}
	free(v);
	free(out);
	free(rs);
}

/* A float sum reduce-scatter (the bits depend on the order of the folds), its parts then
 * all-gathered: every rank prints the hash of the whole. */
static void seg_float_hash(struct tp_group *g, size_t n)
{
	size_t all = n * (size_t)size;
	float *in = malloc(all * 4), *part = malloc(n * 4), *out = malloc(all * 4);
	uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 7);

	for (size_t i = 0; i < all; i++) {
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		in[i] = (float)((double)(seed >> 11) / 9007199254740992.0 - 0.5) * 1e3f;
	}
	if (tp_reduce_scatter(g, in, part, n, TP_DTYPE_F32, TP_OP_SUM) < 0 ||
	    tp_allgather(g, part, out, n, TP_DTYPE_F32) < 0)
		FAIL("seg float reduce_scatter n %zu: %s", n, tp_last_error());
	else
		printf("hash seg-float %016" PRIx64 "\n", fnv(out, all * 4));
	free(in);
	free(part);
	free(out);
}

/* Mismatched pipelined all-gathers: rank 1 alone passes another count (its host's members
 * disagree), then ranks 1 and 2 (the whole of host b in the script's layouts of 4 and of 6
 * ranks: 1 and 2 on different hosts there, so its members disagree too) do: -EPROTO on every
 * rank, before any data moves, and the group goes on. */
static void seg_mismatch(struct tp_group *g, size_t n)
{
	float *v = calloc(n + 1, 4), *out = calloc((n + 1) * (size_t)size, 4);

	for (int k = 0; k < 2; k++) {
		bool other = rank == 1 || (k == 1 && rank == 2);
		int r = tp_allgather(g, v, out, other ? n + 1 : n, TP_DTYPE_F32);

		if (r != -EPROTO)
			FAIL("seg mismatch %d: %d (%s), not -EPROTO", k, r,
			     r < 0 ? tp_last_error() : "ok");
		else
			printf("seg mismatch: %s\n", tp_last_error());
	}
	if (tp_barrier(g) < 0)
		FAIL("barrier after the seg mismatch: %s", tp_last_error());
	free(v);
	free(out);
}

static void seg_battery(struct tp_group *g)
{
	size_t s1 = seg_of(1), sw = seg_of(size);

	seg_broadcast(g, 2 * s1 + 1); /* 8 MiB + 4 bytes: the last segment one element */
	seg_broadcast(g, 2621447);    /* prime */
	seg_gather_scatter(g, 2 * sw + 1);
	seg_gather_scatter(g, 786433); /* prime */
	seg_float_hash(g, 3 * sw + 7);
	seg_mismatch(g, 2 * sw + 1);
}

static void async_and_mismatch(struct tp_group *g)
{
	struct tp_coll_req *q[3];
	int32_t a[3][100];
	int r;

	for (int k = 0; k < 3; k++) {
		for (int i = 0; i < 100; i++)
			a[k][i] = k + i + rank;
		if (tp_allreduce_start(g, a[k], a[k], 100, TP_DTYPE_I32, TP_OP_SUM, &q[k]) < 0)
			FAIL("allreduce_start: %s", tp_last_error());
	}
	for (int k = 0; k < 3; k++) {
		if (tp_coll_wait(q[k]) < 0) /* frees the request */
			FAIL("async %d: %s", k, tp_last_error());
		for (int i = 0; i < 100; i++)
			if (a[k][i] != (k + i) * size + size * (size - 1) / 2) {
				FAIL("async %d: element %d", k, i);
				break;
			}
	}
	r = tp_allreduce(g, a[0], a[1], rank == 1 ? 99 : 100, TP_DTYPE_I32, TP_OP_SUM);
	if (r != -EPROTO)
		FAIL("mismatched count: %d (%s), not -EPROTO", r, r < 0 ? tp_last_error() : "ok");
	else
		printf("mismatch: %s\n", tp_last_error());
	if (tp_barrier(g) < 0)
		FAIL("barrier after the mismatch: %s", tp_last_error());
}

int main(int argc, char **argv)
{
	struct tp_context_options co = { .size = sizeof(co) };
	struct tp_group_options o = { .size = sizeof(o) };
	struct tp_context *ctx;
	struct tp_group *g;
	int r;

	if (argc < 8) {
		fprintf(stderr, "usage: group_coll SOCKET NAME RANK SIZE COORD MS MODE\n");
		return 2;
	}
	co.socket_path = argv[1];
	gname = argv[2];
	o.rank = atoi(argv[3]);
	o.nranks = (unsigned)atoi(argv[4]);
	o.bootstrap = TP_GROUP_BOOTSTRAP_COORDINATOR;
	o.coordinator = argv[5];
	o.join_timeout_ms = atoi(argv[6]);
	o.op_timeout_ms = 60000;
	if (tp_context_new(&co, &ctx) < 0) {
		printf("failed: context: %s\n", tp_last_error());
		return 1;
	}
	r = tp_group_join(ctx, gname, &o, &g);
	if (r < 0) {
		printf("failed: %s: %s\n", strerrorname_np(-r), tp_last_error());
		tp_context_free(ctx);
		return 1;
	}
	rank = tp_group_rank(g);
	size = tp_group_size(g);
	printf("joined rank=%d size=%d host=%d hosts=%d\n", rank, size, tp_group_host_index(g),
	       tp_group_hosts(g));
	fflush(stdout);
	if (!strcmp(argv[7], "loop") || !strcmp(argv[7], "leave") || !strcmp(argv[7], "abort")) {
		const char *ln = getenv("GROUP_COLL_LOOP_N"), *op = getenv("GROUP_COLL_LOOP_OP");
		size_t n = ln ? strtoul(ln, NULL, 10) : 1u << 20;
		bool ag = op && !strcmp(op, "allgather"), bc = op && !strcmp(op, "broadcast");
		float *f = calloc(n * (ag ? (size_t)size + 1 : 1), sizeof(*f));
		int k = strcmp(argv[7], "loop") ? 3 : -1;

		do
			r = bc ? tp_broadcast(g, f, n, TP_DTYPE_F32, 0)
			   : ag ? tp_allgather(g, f + (size_t)size * n, f, n, TP_DTYPE_F32)
				: tp_allreduce(g, f, f, n, TP_DTYPE_F32, TP_OP_SUM);
		while (r == 0 && --k != 0);
		if (r < 0)
			printf("failed: %s: %s\n", strerrorname_np(-r), tp_last_error());
		else if (!strcmp(argv[7], "abort"))
			tp_group_abort(g);
		printf("%s\n", r < 0 ? "" : !strcmp(argv[7], "abort") ? "aborted" : "left");
		free(f);
	} else if (!strcmp(argv[7], "rs")) {
		size_t n = 1u << 18;
		int32_t *in = malloc(n * 4 * (size_t)size), *out = malloc(n * 4);
		const char *hold = getenv("GROUP_COLL_HOLD");

		for (size_t i = 0; i < n * (size_t)size; i++)
			in[i] = (int32_t)(i * 7 + (size_t)rank);
		r = tp_reduce_scatter(g, in, out, n, TP_DTYPE_I32, TP_OP_SUM);
		if (r < 0)
			FAIL("reduce_scatter: %s", tp_last_error());
		for (size_t i = 0; r == 0 && i < n; i++)
			if (out[i] != (int32_t)(((size_t)rank * n + i) * 7 * (size_t)size) +
					      size * (size - 1) / 2) {
				FAIL("reduce_scatter: element %zu", i);
				break;
			}
		if (!fails)
			printf("rs ok\n");
		fflush(stdout);
		while (hold && access(hold, F_OK) != 0) { /* the script reads the counters */
			struct timespec ts = { 0, 10 * 1000000L };

			nanosleep(&ts, NULL);
		}
		free(in);
		free(out);
	} else if (!strcmp(argv[7], "seg")) {
		if (tp_barrier(g) < 0) /* the members learn what each takes in segments */
			FAIL("barrier: %s", tp_last_error());
		seg_battery(g);
		if (!fails)
			printf("ok seg\n");
	} else {
		if (tp_barrier(g) < 0)
			FAIL("barrier: %s", tp_last_error());
		allreduce_exact(g);
		allreduce_misc(g);
		broadcast_gather_scatter(g);
		uneven(g);
		uneven_large(g);
		async_and_mismatch(g);
		if (!fails)
			printf("ok battery\n");
	}
	fflush(stdout);
	tp_group_leave(g);
	tp_context_free(ctx);
	return fails || r < 0 ? 1 : 0;
}
