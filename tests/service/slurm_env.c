/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A task for the real-Slurm service test (slurm.sh): derives its place in the step from the
 * variables srun gave it, through libtpclient's Slurm bootstrap (client/lib/slurm.c, compiled
 * in), and prints one line of key=value pairs; the script checks the lines of all tasks agree.
 * On failure it prints "error: <reason>" on stderr and exits 1. Nothing else is done here.
 */
#include <stdio.h>
#include <stdlib.h>
#include "internal.h"

int main(void)
{
	struct tpc_slurm_vars v;
	struct tpc_slurm t;
	int r;

	tpc_slurm_vars_from_env(&v);
	if (!tpc_slurm_detected(&v)) {
		fprintf(stderr, "error: not a Slurm task (SLURM_JOB_ID or SLURM_PROCID unset)\n");
		return EXIT_FAILURE;
	}
	r = tpc_slurm_from_vars(&v, &t);
	if (r < 0) {
		fprintf(stderr, "error: %s (%d)\n", tp_last_error(), r);
		return EXIT_FAILURE;
	}
	printf("rank=%u size=%u local_rank=%u local_size=%u node=%u nodes=%u key=%s "
	       "coordinator=%s node_name=%s\n",
	       t.rank, t.size, t.local_rank, t.local_size, t.node, t.nodes, t.key, t.coordinator,
	       t.node_name);
	return fflush(stdout) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
