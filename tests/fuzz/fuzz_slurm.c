/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target for the Slurm bootstrap of libtpclient (client/lib/slurm.c): host lists,
 * tasks-per-node lists and whole sets of Slurm variables, all of which a task reads from an
 * environment it does not control. On top of "no crash, no leak, no undefined behaviour", it
 * checks that whatever the parsers accept keeps their contract (fuzz_slurm.h). Built with
 * -fsanitize=fuzzer only by clang; replay_slurm.c runs the same function over the committed
 * corpus (tests/fuzz/corpus-slurm) in every build.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "fuzz_slurm.h"
#include "internal.h"

static bool name_ok(const char *name)
{
	size_t len = strlen(name);

	if (len == 0 || len > TPC_SLURM_NAME_MAX)
		return false;
	for (size_t i = 0; i < len; i++) {
		char c = name[i];

		if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      c == '-' || c == '.' || c == '_'))
			return false;
	}
	return true;
}

static int check_hostlist(const char *s)
{
	struct tpc_hostlist *hl = NULL;
	size_t joined = 0;

	if (tpc_slurm_hostlist_parse(s, &hl) < 0)
		return 0;
	if (hl->n == 0 || hl->n > TPC_SLURM_HOSTS_MAX)
		abort();
	for (uint32_t i = 0; i < hl->n; i++) {
		const char *name = tpc_slurm_hostlist_name(hl, i);

		if (!name_ok(name))
			abort();
		joined += strlen(name) + 1;
	}
	/* Without brackets, the list is its own expansion. */
	if (!strchr(s, '[') && joined != strlen(s) + 1)
		abort();
	tpc_slurm_hostlist_free(hl);
	return 1;
}

static int check_tasks(const char *s)
{
	const char *nl = strchr(s, '\n');
	uint32_t *counts = NULL, total = 0;
	uint64_t sum = 0;
	unsigned long nodes;
	char *end;

	if (!nl)
		return 0;
	nodes = strtoul(s, &end, 10);
	if (end != nl || nodes == 0 || nodes > TPC_SLURM_HOSTS_MAX)
		return 0;
	if (tpc_slurm_tasks_parse(nl + 1, (uint32_t)nodes, &counts, &total) < 0)
		return 0;
	for (unsigned long i = 0; i < nodes; i++) {
		if (counts[i] == 0)
			abort();
		sum += counts[i];
	}
	if (sum != total || total > TPC_SLURM_RANKS_MAX)
		abort();
	free(counts);
	return 1;
}

static const struct {
	const char *name;
	size_t off;
} var_names[] = {
	{ "SLURM_JOB_ID", offsetof(struct tpc_slurm_vars, job_id) },
	{ "SLURM_STEP_ID", offsetof(struct tpc_slurm_vars, step_id) },
	{ "SLURM_PROCID", offsetof(struct tpc_slurm_vars, procid) },
	{ "SLURM_NTASKS", offsetof(struct tpc_slurm_vars, ntasks) },
	{ "SLURM_NPROCS", offsetof(struct tpc_slurm_vars, nprocs) },
	{ "SLURM_STEP_NUM_TASKS", offsetof(struct tpc_slurm_vars, step_num_tasks) },
	{ "SLURM_LOCALID", offsetof(struct tpc_slurm_vars, localid) },
	{ "SLURM_NODEID", offsetof(struct tpc_slurm_vars, nodeid) },
	{ "SLURM_STEP_NODELIST", offsetof(struct tpc_slurm_vars, step_nodelist) },
	{ "SLURM_JOB_NODELIST", offsetof(struct tpc_slurm_vars, job_nodelist) },
	{ "SLURM_STEP_TASKS_PER_NODE", offsetof(struct tpc_slurm_vars, step_tasks_per_node) },
	{ "SLURM_TASKS_PER_NODE", offsetof(struct tpc_slurm_vars, tasks_per_node) },
};

/* Splits @s (modified) into lines NAME=VALUE and points @v's fields at the values. */
static void vars_from_lines(char *s, struct tpc_slurm_vars *v)
{
	memset(v, 0, sizeof(*v));
	for (char *line = s, *next; line; line = next) {
		char *eq;

		if ((next = strchr(line, '\n')))
			*next++ = '\0';
		if (!(eq = strchr(line, '=')))
			continue;
		*eq = '\0';
		for (size_t i = 0; i < sizeof(var_names) / sizeof(var_names[0]); i++)
			if (strcmp(line, var_names[i].name) == 0)
				*(const char **)((char *)v + var_names[i].off) = eq + 1;
	}
}

static int check_vars(char *s)
{
	struct tpc_slurm_vars v;
	struct tpc_slurm t;

	vars_from_lines(s, &v);
	if (tpc_slurm_from_vars(&v, &t) < 0)
		return 0;
	if (t.rank >= t.size || t.size > TPC_SLURM_RANKS_MAX || t.local_rank >= t.local_size ||
	    t.local_size > t.size || t.node >= t.nodes || t.nodes > TPC_SLURM_HOSTS_MAX ||
	    strncmp(t.key, "slurm:", 6) != 0 || !name_ok(t.coordinator) || !name_ok(t.node_name))
		abort();
	return 1;
}

int fuzz_slurm_check(const uint8_t *data, size_t size)
{
	char *s;
	int ok = 0;

	if (size < 1 || !(s = malloc(size)))
		return 0;
	memcpy(s, data + 1, size - 1);
	s[size - 1] = '\0';
	switch (data[0]) {
	case 'h':
		ok = check_hostlist(s);
		break;
	case 't':
		ok = check_tasks(s);
		break;
	case 'e':
		ok = check_vars(s);
		break;
	}
	free(s);
	return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_slurm_check(data, size);
	return 0;
}
