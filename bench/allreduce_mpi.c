/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Baseline for bench_allreduce: Open MPI's MPI_Allreduce (float32, sum) over MPI_COMM_WORLD, one
 * size after another. Each iteration starts after a barrier; every rank times its own call, and
 * an iteration's time is that of its slowest rank (MPI_MAX over the ranks once the size is done,
 * so that no extra message falls inside a timed call). Rank 0 prints, per size, the line
 * bench/run_allreduce.sh collects:
 *   allreduce impl=LABEL n=N size=BYTES median_us=T busbw_GBps=B
 * with busbw = 2(N-1)/N x size / median. The result is checked once per size (each rank adds
 * rank + 1: every element must be N(N+1)/2). Numbers only: the transport is whatever mpirun
 * selected (bench/run_allreduce.sh passes --mca btl self,vader or self,tcp).
 *
 * Usage: mpirun -n N allreduce_mpi [-l LABEL] [-s SIZES] [-i ITERS] [-t SECONDS]
 *   -l  impl label printed (default mpi)
 *   -s  comma-separated sizes in bytes with K/M suffixes (default 4K,64K,1M,16M,64M)
 *   -i  most timed iterations per size (default 200); -t seconds budget per size (default 2):
 *       fewer iterations for large sizes, never fewer than 5
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SIZES_MAX 32
#define ITERS_MIN 5

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static int parse_sizes(char *s, size_t *sizes)
{
	int n = 0;

	for (char *tok = strtok(s, ","); tok && n < SIZES_MAX; tok = strtok(NULL, ",")) {
		char *end;
		unsigned long long v = strtoull(tok, &end, 10);

		if (*end == 'K' || *end == 'k')
			v <<= 10, end++;
		else if (*end == 'M' || *end == 'm')
			v <<= 20, end++;
		if (*end || v == 0 || v % sizeof(float))
			return -1;
		sizes[n++] = (size_t)v;
	}
	return n;
}

/* Times up to @iters calls on @count floats; returns the median of the slowest ranks' times. */
static double run_size(float *send, float *recv, size_t count, int iters, int rank)
{
	double *t = calloc((size_t)iters, sizeof(*t)), *tmax = calloc((size_t)iters, sizeof(*t));
	double median = 0;

	if (!t || !tmax)
		MPI_Abort(MPI_COMM_WORLD, 1);
	for (int i = 0; i < iters; i++) {
		double t0;

		MPI_Barrier(MPI_COMM_WORLD);
		t0 = MPI_Wtime();
		MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		t[i] = MPI_Wtime() - t0;
	}
	MPI_Reduce(t, tmax, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
	if (rank == 0) {
		qsort(tmax, (size_t)iters, sizeof(*tmax), cmp_double);
		median = iters % 2 ? tmax[iters / 2] : (tmax[iters / 2 - 1] + tmax[iters / 2]) / 2;
	}
	free(t);
	free(tmax);
	return median;
}

/* How many iterations fit @budget seconds, from one timed call (agreed by every rank). */
static int iterations(float *send, float *recv, size_t count, int most, double budget)
{
	double t0, one, slowest;

	MPI_Barrier(MPI_COMM_WORLD);
	t0 = MPI_Wtime();
	MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
	one = MPI_Wtime() - t0;
	MPI_Allreduce(&one, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	if (slowest <= 0)
		return most;
	return (int)(budget / slowest) < ITERS_MIN ? ITERS_MIN :
	       (int)(budget / slowest) > most	    ? most :
						      (int)(budget / slowest);
}

int main(int argc, char **argv)
{
	char sizes_arg[256] = "4K,64K,1M,16M,64M";
	const char *label = "mpi";
	size_t sizes[SIZES_MAX];
	int rank, n, nsizes, most = 200, c, bad = 0;
	double budget = 2.0;

	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	while ((c = getopt(argc, argv, "l:s:i:t:")) != -1) {
		if (c == 'l')
			label = optarg;
		else if (c == 's')
			snprintf(sizes_arg, sizeof(sizes_arg), "%s", optarg);
		else if (c == 'i')
			most = atoi(optarg);
		else if (c == 't')
			budget = atof(optarg);
		else
			MPI_Abort(MPI_COMM_WORLD, 2);
	}
	nsizes = parse_sizes(sizes_arg, sizes);
	if (nsizes <= 0 || most < ITERS_MIN) {
		if (rank == 0)
			fprintf(stderr, "allreduce_mpi: bad -s or -i\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	for (int k = 0; k < nsizes; k++) {
		size_t count = sizes[k] / sizeof(float);
		float *send = malloc(sizes[k]), *recv = malloc(sizes[k]);
		float want = (float)n * (float)(n + 1) / 2;
		double med;
		int iters;

		if (!send || !recv)
			MPI_Abort(MPI_COMM_WORLD, 1);
		for (size_t i = 0; i < count; i++)
			send[i] = (float)(rank + 1);
		memset(recv, 0, sizes[k]);
		/* Warm-up (connections, shared segments, pages), which also checks the result. */
		MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		for (size_t i = 0; i < count; i++)
			if (recv[i] != want) {
				fprintf(stderr, "allreduce_mpi: rank %d: element %zu is %g, not %g\n",
					rank, i, (double)recv[i], (double)want);
				bad = 1;
				break;
			}
		iters = iterations(send, recv, count, most, budget);
		med = run_size(send, recv, count, iters, rank);
		if (rank == 0)
			printf("allreduce impl=%s n=%d size=%zu median_us=%.1f busbw_GBps=%.3f "
			       "iters=%d\n",
			       label, n, sizes[k], med * 1e6,
			       2.0 * (n - 1) / n * (double)sizes[k] / med / 1e9, iters);
		fflush(stdout);
		free(send);
		free(recv);
	}
	MPI_Finalize();
	return bad;
}
