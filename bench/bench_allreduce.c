/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_allreduce: float32 sum all-reduce among N processes through tpipd (a group per N).
 * For each N and size it forks N ranks, each with its own context; every iteration starts
 * after a barrier, and its time is the slowest rank's. Prints one line per (N, size):
 *   allreduce impl=tpipd n=N size=S median_us=T busbw_GBps=B iters=I cpu_us=C
 * with T the median over iterations of the slowest rank's time and B = 2(N-1)/N x S / T (bus
 * bandwidth, as nccl-tests and the issue define it), and C the CPU time per iteration
 * (barrier and call) of the rank that used the most (the same work costing several times the
 * usual CPU time marks a run disturbed by other work; bench/python/run.sh). Needs a running
 * tpipd (--socket or the library's rules); with --xhost SOCKA,SOCKB,tpip://HOST[:PORT] the
 * first half of the ranks use the daemon at SOCKA and the second half the one at SOCKB (two
 * hosts, e.g. daemons in two network namespaces: a Unix socket path reaches across them),
 * joined through that coordinator, the group's remote access any peer. --op times another collective instead (the line starts
 * with its name): reduce-scatter (also --reduce-scatter), S being each rank's input (its
 * output S/N) and B = (N-1)/N x S / T; allgather, S being each rank's output (its input S/N),
 * B = (N-1)/N x S / T; broadcast from rank 0, B = S / T (as nccl-tests count them). --dtype
 * f16 or bf16 moves and sums binary16 or bfloat16 elements instead of float32 (the line then
 * ends in dtype=f16 or dtype=bf16; S is still bytes). Figures only; nothing here passes or
 * fails.
 *   bench_allreduce [--socket PATH] [--ranks 2,4] [--sizes 4K,64K,1M,16M,64M] [--iters K]
 *                   [--secs S] [--xhost SOCKA,SOCKB,COORD]
 *                   [--op allreduce|broadcast|allgather|reduce-scatter] [--dtype f32|f16|bf16]
 * (-n, -s, -t: --ranks, --sizes, --secs, as bench/run_allreduce.sh calls it.)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"

#define MAX_RANKS 64
#define MAX_ITERS 200

struct shared {
	double t_us[MAX_RANKS][MAX_ITERS];
	double cpu_us[MAX_RANKS]; /* per timed iteration */
	int failed;
	char why[256];
};

struct opts {
	const char *socket;
	unsigned ranks[16], n_ranks;
	size_t sizes[32], n_sizes;
	unsigned iters; /* 0: by size */
	double secs;	/* scales the iterations by size (1: about 256 MiB of input per rank) */
	char *xsock[2]; /* --xhost: the two hosts' daemons */
	const char *coord;
	enum { OP_ALLREDUCE, OP_BROADCAST, OP_ALLGATHER, OP_RS } op; /* --op */
	enum tp_dtype dtype; /* --dtype: TP_DTYPE_F32 (default), _F16 or _BF16 */
};

static const char *const op_name[] = { "allreduce", "broadcast", "allgather",
				       "reduce_scatter" };

static unsigned iters_for(const struct opts *o, size_t size)
{
	size_t n;

	if (o->iters)
		return o->iters < MAX_ITERS ? o->iters : MAX_ITERS;
	n = (size_t)((double)(256u << 20) / (double)size * (o->secs > 0 ? o->secs : 1));
	return n < 5 ? 5 : n > 100 ? 100 : (unsigned)n;
}

static double cpu_now_us(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
	       (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

/* Element values: small integers, exact in every --dtype (and so are their sums: binary16
 * holds integers to 2048 exactly, bfloat16 to 256, so the half types cycle over 4 and stay
 * exact up to 16 ranks). */
static unsigned val_mod(const struct opts *o)
{
	return o->dtype == TP_DTYPE_F32 ? 100 : 4;
}

static size_t elem_size(const struct opts *o)
{
	return o->dtype == TP_DTYPE_F32 ? 4 : 2;
}

/* the integer @v (below 2048) as element @i of @p */
static void put_int(const struct opts *o, void *p, size_t i, unsigned v)
{
	float f = (float)v;
	uint32_t u;
	uint16_t h = 0;

	memcpy(&u, &f, 4);
	if (o->dtype == TP_DTYPE_F32) {
		memcpy((char *)p + i * 4, &f, 4);
		return;
	}
	if (o->dtype == TP_DTYPE_BF16)
		h = (uint16_t)(u >> 16); /* exact: at most 8 significant bits */
	else if (v) /* binary16: exponent rebiased, 10 of float's 23 mantissa bits */
		h = (uint16_t)((((u >> 23) & 0xff) - 112) << 10 | ((u >> 13) & 0x3ff));
	memcpy((char *)p + i * 2, &h, 2);
}

/* element @i of @p as a float (integers only, as put_int() writes them) */
static float get_num(const struct opts *o, const void *p, size_t i)
{
	uint16_t h;
	uint32_t u;
	float f;

	if (o->dtype == TP_DTYPE_F32) {
		memcpy(&f, (const char *)p + i * 4, 4);
		return f;
	}
	memcpy(&h, (const char *)p + i * 2, 2);
	if (o->dtype == TP_DTYPE_BF16)
		u = (uint32_t)h << 16;
	else if (h & 0x7fff)
		u = (uint32_t)(h & 0x8000) << 16 | ((((uint32_t)h >> 10) & 0x1f) + 112) << 23 |
		    (uint32_t)(h & 0x3ff) << 13;
	else
		u = (uint32_t)(h & 0x8000) << 16;
	memcpy(&f, &u, 4);
	return f;
}

/* Whether the last element of rank @rank's result (@res, @count elements; @part: each rank's
 * share) is right: inputs are (i % val_mod()) + rank. */
static bool bench_check(const struct opts *o, unsigned n, unsigned rank, const void *res,
			size_t count, size_t part)
{
	float last = get_num(o, res, count - 1);
	unsigned m = val_mod(o);

	switch (o->op) {
	case OP_BROADCAST: /* rank 0's */
		return last == (float)((count - 1) % m);
	case OP_ALLGATHER: /* rank n - 1's last */
		return part == 0 || last == (float)((part - 1) % m) + (float)(n - 1);
	case OP_RS:
		return last == (float)n * (float)((rank * part + count - 1) % m) +
				       (float)(n * (n - 1) / 2);
	default:
		return last == (float)n * (float)((count - 1) % m) + (float)(n * (n - 1) / 2);
	}
}

static int rank_main(const struct opts *o, unsigned n, unsigned rank, struct shared *sh)
{
	struct tp_group_options go = { .size = sizeof(go), .rank = (int)rank, .nranks = n,
				       .join_timeout_ms = 60000 };
	struct tp_context *ctx;
	struct tp_group *g;
	char name[64];
	int r;

	if (o->coord) {
		go.bootstrap = TP_GROUP_BOOTSTRAP_COORDINATOR;
		go.coordinator = o->coord;
		/* the two daemons prove the pre-shared key: let the other's members in (a
		 * TP_GROUP_REMOTE in the environment would only apply to the default) */
		go.remote = TP_REMOTE_ANY_PEER;
	}
	if (bench_context_open(o->coord ? o->xsock[rank >= n / 2] : o->socket, 0, &ctx) < 0)
		return 1;
	snprintf(name, sizeof(name), "bench-allreduce-%d-%u", (int)getppid(), n);
	r = tp_group_join(ctx, name, &go, &g);
	if (r < 0) {
		snprintf(sh->why, sizeof(sh->why), "join: %s", tp_last_error());
		sh->failed = 1;
		tp_context_free(ctx);
		return 1;
	}
	for (size_t s = 0; s < o->n_sizes && r == 0; s++) {
		size_t es = elem_size(o), count = o->sizes[s] / es;
		size_t part = count / n; /* reduce-scatter's output, all-gather's input */
		void *in = malloc(count * es + 4), *out = malloc(count * es + 4);
		unsigned it = iters_for(o, o->sizes[s]);
		double cpu0 = 0;

		for (size_t i = 0; i < count; i++)
			put_int(o, in, i, (unsigned)(i % val_mod(o)) + rank);
		memset(out, 0, count * es); /* touch the pages before timing */
		for (unsigned k = 0; k < it + 2 && r == 0; k++) {
			uint64_t t0;

			if (k == 2)
				cpu0 = cpu_now_us();
			r = tp_barrier(g);
			t0 = bench_now_ns();
			if (r == 0 && o->op == OP_RS)
				r = tp_reduce_scatter(g, in, out, part, o->dtype, TP_OP_SUM);
			else if (r == 0 && o->op == OP_ALLGATHER)
				r = tp_allgather(g, in, out, part, o->dtype);
			else if (r == 0 && o->op == OP_BROADCAST)
				r = tp_broadcast(g, rank ? out : in, count, o->dtype, 0);
			else if (r == 0)
				r = tp_allreduce(g, in, out, count, o->dtype, TP_OP_SUM);
			if (k >= 2)
				sh->t_us[rank][k - 2] = (double)(bench_now_ns() - t0) / 1e3;
		}
		sh->cpu_us[rank] = (cpu_now_us() - cpu0) / it;
		if (o->op == OP_RS)
			count = part; /* its last element is element rank x part + part - 1 */
		if (o->op == OP_ALLGATHER)
			count = part * n;
		if (r == 0 && count &&
		    !bench_check(o, n, rank, o->op == OP_BROADCAST && !rank ? in : out, count, part)) {
			snprintf(sh->why, sizeof(sh->why), "wrong result at size %zu", o->sizes[s]);
			r = -EIO;
		}
		free(in);
		free(out);
		/* the parent reads this size's times between sizes */
		if (r == 0)
			r = tp_barrier(g);
		if (rank == 0 && r == 0) {
			double slow[MAX_ITERS], cpu = 0;
			struct bench_stats st;

			for (unsigned k = 0; k < it; k++) {
				slow[k] = 0;
				for (unsigned q = 0; q < n; q++)
					slow[k] = sh->t_us[q][k] > slow[k] ? sh->t_us[q][k] : slow[k];
			}
			for (unsigned q = 0; q < n; q++)
				cpu = sh->cpu_us[q] > cpu ? sh->cpu_us[q] : cpu;
			bench_stats_compute(slow, it, &st);
			printf("%s impl=tpipd n=%u size=%zu median_us=%.1f busbw_GBps=%.3f "
			       "iters=%u cpu_us=%.1f%s\n", op_name[o->op], n, o->sizes[s], st.median,
			       (o->op == OP_ALLREDUCE ? 2.0 * (n - 1) / n : o->op == OP_BROADCAST ?
				1.0 : (double)(n - 1) / n) * (double)o->sizes[s] / (st.median * 1e3),
			       it, cpu, o->dtype == TP_DTYPE_F16 ? " dtype=f16" :
			       o->dtype == TP_DTYPE_BF16 ? " dtype=bf16" : "");
			fflush(stdout);
		}
		if (r == 0)
			r = tp_barrier(g); /* nobody writes times before rank 0 printed */
	}
	if (r < 0 && !sh->failed) {
		snprintf(sh->why, sizeof(sh->why), "rank %u: %s", rank, tp_last_error());
		sh->failed = 1;
	}
	tp_group_leave(g);
	tp_context_free(ctx);
	return r < 0;
}

static int run_n(const struct opts *o, unsigned n, struct shared *sh)
{
	pid_t pids[MAX_RANKS];
	int bad = 0;

	for (unsigned q = 0; q < n; q++) {
		pids[q] = fork();
		if (pids[q] == 0)
			_exit(rank_main(o, n, q, sh));
	}
	for (unsigned q = 0; q < n; q++) {
		int st;

		if (pids[q] < 0 || waitpid(pids[q], &st, 0) < 0 || !WIFEXITED(st) ||
		    WEXITSTATUS(st))
			bad = 1;
	}
	if (bad)
		fprintf(stderr, "bench_allreduce: n=%u failed: %s\n", n, sh->why);
	return bad;
}

static int parse_list(const char *s, bool sizes, struct opts *o)
{
	char *dup = strdup(s), *save = NULL;

	for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		size_t v;

		if (bench_parse_size(t, &v) < 0 || v == 0) {
			free(dup);
			return -EINVAL;
		}
		if (sizes && o->n_sizes < 32)
			o->sizes[o->n_sizes++] = v;
		else if (!sizes && o->n_ranks < 16 && v <= MAX_RANKS)
			o->ranks[o->n_ranks++] = (unsigned)v;
	}
	free(dup);
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o = { 0 };
	struct shared *sh;
	int bad = 0;

	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		const char *a = argv[i];

		if (!strcmp(a, "--socket") && v)
			o.socket = argv[++i];
		else if ((!strcmp(a, "--ranks") || !strcmp(a, "-n")) && v &&
			 parse_list(argv[++i], false, &o) == 0)
			;
		else if ((!strcmp(a, "--sizes") || !strcmp(a, "-s")) && v &&
			 parse_list(argv[++i], true, &o) == 0)
			;
		else if (!strcmp(a, "--reduce-scatter"))
			o.op = OP_RS;
		else if (!strcmp(a, "--op") && v) {
			const char *op = argv[++i];
			int k = 0;

			while (k < 4 && strcmp(op, op_name[k]) &&
			       (k != OP_RS || strcmp(op, "reduce-scatter")))
				k++;
			if (k == 4)
				goto usage;
			o.op = k;
		}
		else if (!strcmp(a, "--dtype") && v) {
			const char *t = argv[++i];

			if (!strcmp(t, "f32"))
				o.dtype = TP_DTYPE_F32;
			else if (!strcmp(t, "f16"))
				o.dtype = TP_DTYPE_F16;
			else if (!strcmp(t, "bf16"))
				o.dtype = TP_DTYPE_BF16;
			else
				goto usage;
		} else if (!strcmp(a, "--iters") && v)
			o.iters = (unsigned)atoi(argv[++i]);
		else if ((!strcmp(a, "--secs") || !strcmp(a, "-t")) && v)
			o.secs = atof(argv[++i]);
		else if (!strcmp(a, "--xhost") && v && !o.coord) {
			char *c1, *c2;

			o.xsock[0] = strdup(argv[++i]);
			c1 = strchr(o.xsock[0], ',');
			c2 = c1 ? strchr(c1 + 1, ',') : NULL;
			if (!c2)
				goto usage;
			*c1 = *c2 = '\0';
			o.xsock[1] = c1 + 1;
			o.coord = c2 + 1;
		} else {
usage:
			fprintf(stderr, "usage: %s [--socket PATH] [--ranks 2,4] "
				"[--sizes 4K,64K,1M,16M,64M] [--iters K] [--secs S] "
				"[--xhost SOCKA,SOCKB,tpip://HOST[:PORT]] "
				"[--op allreduce|broadcast|allgather|reduce-scatter] "
				"[--dtype f32|f16|bf16]\n",
				argv[0]);
			return 2;
		}
	}
	if (!o.dtype)
		o.dtype = TP_DTYPE_F32;
	if (!o.n_ranks)
		parse_list("2,4", false, &o);
	if (!o.n_sizes)
		parse_list("4K,64K,1M,16M,64M", true, &o);
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED)
		return 1;
	for (unsigned i = 0; i < o.n_ranks; i++) {
		memset(sh, 0, sizeof(*sh));
		bad |= run_n(&o, o.ranks[i], sh);
	}
	munmap(sh, sizeof(*sh));
	free(o.xsock[0]);
	return bad;
}
