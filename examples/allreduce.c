/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tp-allreduce: torch-ipc's all-reduce example in C. N processes join group NAME through the
 * local tpipd; each fills a tensor with its rank, all-reduces it (a sum, then a user reduction
 * that keeps the larger of each pair, as torch-ipc's example passes a Lua function), and
 * broadcasts a value from the last rank. Run by hand in N shells:
 *     tp-allreduce 0 2 & tp-allreduce 1 2
 * (rank "auto" lets the daemon assign ranks), or let it start the N processes itself:
 *     tp-allreduce --spawn 4
 * Across hosts, every process names the same coordinator, the peer address of one daemon
 * (usually the first host's), the daemons need a peer key or certificates, and every process
 * says which peer daemons may take part (the group's remote access, none by default; here by
 * TP_GROUP_REMOTE: "any-peer", or the daemons' identities separated by ';'):
 *     TP_GROUP_REMOTE="cert:gn01;cert:gn02" tp-allreduce 0 4 --coordinator tpip://gn01
 *     (and ranks 1..3, on gn01 and gn02)
 * Under Slurm, rank and size come from srun (or "auto 0": the AUTO bootstrap picks Slurm); a
 * step over several nodes needs TP_GROUP_REMOTE too:
 *     srun -n 4 --export=ALL,TP_GROUP_REMOTE=any-peer tp-allreduce --slurm
 * The daemon socket follows the library's rules ($TPIPD_SOCKET, ...).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tpclient.h>

#define COUNT 1000000

/* user reduction: inout = max(inout, in) */
static void keep_max(void *inout, const void *in, size_t n, enum tp_dtype dtype, void *user)
{
	float *a = inout;
	const float *b = in;

	(void)dtype;
	(void)user;
	for (size_t i = 0; i < n; i++)
		a[i] = b[i] > a[i] ? b[i] : a[i];
}

static const char *coordinator; /* --coordinator */
static bool slurm;		/* --slurm */

static int run(int rank, unsigned n, const char *name)
{
	struct tp_group_options o = { .size = sizeof(o), .rank = rank, .nranks = n };
	struct tp_context *ctx;
	struct tp_group *g;
	float *t = malloc(COUNT * sizeof(float)), v;
	int r, me;

	if (coordinator) {
		o.bootstrap = TP_GROUP_BOOTSTRAP_COORDINATOR;
		o.coordinator = coordinator;
	} else if (slurm) {
		o.bootstrap = TP_GROUP_BOOTSTRAP_SLURM;
	}
	r = tp_context_new(NULL, &ctx);
	if (r < 0) {
		fprintf(stderr, "cannot reach tpipd: %s\n", tp_last_error());
		return 1;
	}
	r = tp_group_join(ctx, name, &o, &g);
	if (r < 0) {
		fprintf(stderr, "cannot join %s: %s\n", name, tp_last_error());
		tp_context_free(ctx);
		return 1;
	}
	me = tp_group_rank(g);
	n = (unsigned)tp_group_size(g);
	for (size_t i = 0; i < COUNT; i++)
		t[i] = (float)me;
	r = tp_allreduce(g, t, t, COUNT, TP_DTYPE_F32, TP_OP_SUM);
	if (r == 0)
		printf("rank %d of %d: sum of ranks %g (expected %u)\n", me, tp_group_size(g), t[0],
		       n * (n - 1) / 2);
	for (size_t i = 0; r == 0 && i < COUNT; i++)
		t[i] = (float)((me * 7919 + (int)i) % 1000);
	if (r == 0)
		r = tp_allreduce_fn(g, t, t, COUNT, TP_DTYPE_F32, keep_max, NULL);
	if (r == 0)
		printf("rank %d: max of element 0 %g\n", me, t[0]);
	v = (float)me * 10;
	if (r == 0)
		r = tp_broadcast(g, &v, 1, TP_DTYPE_F32, (int)n - 1);
	if (r == 0)
		printf("rank %d: broadcast from rank %u: %g\n", me, n - 1, v);
	if (r < 0)
		fprintf(stderr, "rank %d: %s\n", me, tp_last_error());
	tp_group_leave(g);
	tp_context_free(ctx);
	free(t);
	return r < 0;
}

int main(int argc, char **argv)
{
	const char *name = "tp-allreduce";
	int bad = 0;

	/* the options that may follow: --coordinator ADDR, --slurm */
	for (int i = 1; i < argc; i++) {
		int k = 0;

		if (!strcmp(argv[i], "--coordinator") && i + 1 < argc) {
			coordinator = argv[i + 1];
			k = 2;
		} else if (!strcmp(argv[i], "--slurm")) {
			slurm = true;
			k = 1;
		}
		if (k) {
			memmove(&argv[i], &argv[i + k], (size_t)(argc - i - k + 1) * sizeof(*argv));
			argc -= k;
			i--;
		}
	}
	if (slurm)
		return run(-1, 0, argc > 1 ? argv[1] : name);
	if (argc >= 3 && !strcmp(argv[1], "--spawn")) {
		unsigned n = (unsigned)atoi(argv[2]);

		if (argc > 3)
			name = argv[3];
		for (unsigned q = 0; q < n; q++)
			if (fork() == 0)
				return run((int)q, n, name);
		for (unsigned q = 0; q < n; q++) {
			int st;

			if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
				bad = 1;
		}
		return bad;
	}
	if (argc < 3 || atoi(argv[2]) < 0) { /* NRANKS 0: Slurm's, in a Slurm task (AUTO) */
		fprintf(stderr, "usage: %s RANK|auto NRANKS [NAME] [--coordinator tpip://HOST[:PORT]]\n"
			"       %s --spawn N [NAME]\n       %s --slurm [NAME]\n", argv[0], argv[0],
			argv[0]);
		return 2;
	}
	if (argc > 3)
		name = argv[3];
	return run(strcmp(argv[1], "auto") ? atoi(argv[1]) : -1, (unsigned)atoi(argv[2]), name);
}
