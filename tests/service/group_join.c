/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A group member for the service suite's cross-host join tests (group_xjoin.sh). It joins
 * group NAME as RANK (-1: assigned) of SIZE through the daemon at SOCKET with the coordinator
 * COORD (tpip://HOST[:PORT]; "slurm": the Slurm bootstrap, from the environment; "auto": the
 * AUTO bootstrap, which is Slurm's in a Slurm task) and join
 * timeout MS, prints one line "joined rank=R size=N
 * local_rank=L local_size=M host=H hosts=K" (or "failed: ERRNO-NAME: MESSAGE" and exits 1),
 * then with --hold keeps the group until its standard input closes, and leaves.
 *
 * Usage: group_join SOCKET NAME RANK SIZE COORD MS [--hold]. Exit 0 ok, 1 failure, 2 usage.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <tpclient.h>

int main(int argc, char **argv)
{
	struct tp_context_options co = { .size = sizeof(co) };
	struct tp_group_options o = { .size = sizeof(o) };
	struct tp_context *ctx;
	struct tp_group *g;
	char buf[64];
	int r;

	if (argc < 7) {
		fprintf(stderr, "usage: group_join SOCKET NAME RANK SIZE COORD MS [--hold]\n");
		return 2;
	}
	co.socket_path = argv[1];
	o.rank = atoi(argv[3]);
	o.nranks = (unsigned)atoi(argv[4]);
	o.bootstrap = TP_GROUP_BOOTSTRAP_COORDINATOR;
	o.coordinator = argv[5];
	if (strcmp(argv[5], "slurm") == 0 || strcmp(argv[5], "auto") == 0) {
		o.bootstrap = strcmp(argv[5], "auto") ? TP_GROUP_BOOTSTRAP_SLURM
						      : TP_GROUP_BOOTSTRAP_AUTO;
		o.coordinator = NULL;
	}
	o.join_timeout_ms = atoi(argv[6]);
	r = tp_context_new(&co, &ctx);
	if (r < 0) {
		printf("failed: context: %s\n", tp_last_error());
		return 1;
	}
	r = tp_group_join(ctx, argv[2], &o, &g);
	if (r < 0) {
		printf("failed: %s: %s\n", strerrorname_np(-r), tp_last_error());
		fflush(stdout);
		tp_context_free(ctx);
		return 1;
	}
	printf("joined rank=%d size=%d local_rank=%d local_size=%d host=%d hosts=%d\n",
	       tp_group_rank(g), tp_group_size(g), tp_group_local_rank(g),
	       tp_group_local_size(g), tp_group_host_index(g), tp_group_hosts(g));
	fflush(stdout);
	if (argc > 7 && strcmp(argv[7], "--hold") == 0)
		while (fgets(buf, sizeof(buf), stdin))
			;
	tp_group_leave(g);
	tp_context_free(ctx);
	return 0;
}
