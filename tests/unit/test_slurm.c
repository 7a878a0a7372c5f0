/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests of the Slurm bootstrap (client/lib/slurm.c): host lists expand as Slurm expands
 * them (ranges, zero padding, commas inside brackets, several bracket groups), tasks-per-node
 * lists expand, a task's rank, size, local rank and size, node, key and coordinator come out
 * of the variables srun sets, and every malformed or oversized value is refused with a reason.
 * Each limit is tried just below and just above.
 */
#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"

/* Expands @list and checks the names, given as NULL-terminated arguments. */
static void expect_hosts(const char *list, ...)
{
	struct tpc_hostlist *hl = NULL;
	const char *want;
	uint32_t i = 0;
	va_list ap;
	int r = tpc_slurm_hostlist_parse(list, &hl);

	ck_assert_msg(r == 0, "\"%s\": %d (%s)", list, r, tp_last_error());
	va_start(ap, list);
	while ((want = va_arg(ap, const char *))) {
		ck_assert_msg(i < hl->n, "\"%s\": only %u hosts", list, hl->n);
		ck_assert_str_eq(tpc_slurm_hostlist_name(hl, i), want);
		i++;
	}
	va_end(ap);
	ck_assert_msg(i == hl->n, "\"%s\": %u hosts, expected %u", list, hl->n, i);
	tpc_slurm_hostlist_free(hl);
}

/* Expects @list refused with @err and a message containing @why. */
static void expect_bad(const char *list, int err, const char *why)
{
	struct tpc_hostlist *hl = NULL;
	int r = tpc_slurm_hostlist_parse(list, &hl);

	ck_assert_msg(r == err, "\"%.60s\": %d, expected %d (%s)", list, r, err, tp_last_error());
	ck_assert_ptr_null(hl);
	ck_assert_msg(strstr(tp_last_error(), why), "\"%.60s\": message \"%s\" lacks \"%s\"", list,
		      tp_last_error(), why);
}

/* The number of hosts @list expands to, or its error. */
static int count_hosts(const char *list)
{
	struct tpc_hostlist *hl = NULL;
	int r = tpc_slurm_hostlist_parse(list, &hl);

	if (r < 0)
		return r;
	r = (int)hl->n;
	tpc_slurm_hostlist_free(hl);
	return r;
}

/* A string of @n copies of @c (static storage, replaced by the next call). */
static const char *rep(char c, size_t n)
{
	static char buf[TPC_SLURM_LIST_MAX + 16];

	ck_assert_uint_lt(n, sizeof(buf));
	memset(buf, c, n);
	buf[n] = '\0';
	return buf;
}

START_TEST(test_hostlist_expands_ranges_and_keeps_padding)
{
	expect_hosts("gn[01-04,10],gpu7", "gn01", "gn02", "gn03", "gn04", "gn10", "gpu7", NULL);
	expect_hosts("gpu7", "gpu7", NULL);
	expect_hosts("n[008-011]", "n008", "n009", "n010", "n011", NULL);
	expect_hosts("n[098-101]", "n098", "n099", "n100", "n101", NULL);
	expect_hosts("n[9-10]", "n9", "n10", NULL);
	expect_hosts("n[1-010]", "n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", "n10", NULL);
	expect_hosts("n[5]", "n5", NULL);
	expect_hosts("n[0]", "n0", NULL);
	expect_hosts("[1-3]", "1", "2", "3", NULL);
	expect_hosts("node-1.example_x,b", "node-1.example_x", "b", NULL);
}
END_TEST

START_TEST(test_hostlist_commas_inside_brackets_do_not_split)
{
	expect_hosts("a[1,3-4],b[2],c", "a1", "a3", "a4", "b2", "c", NULL);
	expect_hosts("a[1,1],a", "a1", "a1", "a", NULL); /* duplicates kept, as Slurm keeps them */
}
END_TEST

START_TEST(test_hostlist_several_groups_last_fastest)
{
	expect_hosts("rack[1-2]_n[3-4]", "rack1_n3", "rack1_n4", "rack2_n3", "rack2_n4", NULL);
	expect_hosts("a[1-2]b[3,5]", "a1b3", "a1b5", "a2b3", "a2b5", NULL);
	expect_hosts("r[0-1]c[0]n[01-02],x", "r0c0n01", "r0c0n02", "r1c0n01", "r1c0n02", "x",
		     NULL);
	expect_hosts("a[1]b[2]c[3]d[4]", "a1b2c3d4", NULL);
}
END_TEST

START_TEST(test_hostlist_refuses_malformed)
{
	expect_bad("", -EINVAL, "empty");
	expect_bad(",", -EINVAL, "empty host name");
	expect_bad("a,", -EINVAL, "empty host name");
	expect_bad(",a", -EINVAL, "empty host name");
	expect_bad("a,,b", -EINVAL, "at character 3: empty host name");
	expect_bad("a b", -EINVAL, "byte 0x20");
	expect_bad("a\tb", -EINVAL, "byte 0x09");
	expect_bad("a/b", -EINVAL, "byte 0x2f");
	expect_bad("a\x01", -EINVAL, "byte 0x01");
	expect_bad("a\xc3\xa9", -EINVAL, "byte 0xc3");
	expect_bad("a[1-2", -EINVAL, "'[' at character 2 is never closed");
	expect_bad("a[1,", -EINVAL, "number was expected");
	expect_bad("a1-2]", -EINVAL, "']' without '['");
	expect_bad("a[1]]", -EINVAL, "']' without '['");
	expect_bad("a[]", -EINVAL, "number was expected");
	expect_bad("a[1-]", -EINVAL, "number was expected");
	expect_bad("a[-1]", -EINVAL, "signed number");
	expect_bad("a[+1]", -EINVAL, "signed number");
	expect_bad("a[1--2]", -EINVAL, "signed number");
	expect_bad("a[3-1]", -EINVAL, "descending range 3-1");
	expect_bad("a[1-2]b", -EINVAL, "text after the last ']'");
	expect_bad("a[1-2]b,c", -EINVAL, "text after the last ']'");
	expect_bad("a[[1]]", -EINVAL, "number was expected");
	expect_bad("a[1[2]]", -EINVAL, "'[' in brackets");
	expect_bad("a[1,]", -EINVAL, "number was expected");
	expect_bad("a[,1]", -EINVAL, "number was expected");
	expect_bad("a[a]", -EINVAL, "number was expected");
	expect_bad("a[1a]", -EINVAL, "'a' in brackets");
	expect_bad("a[1 ]", -EINVAL, "'?' in brackets");
	expect_bad("a[1-2-3]", -EINVAL, "'-' in brackets");
	expect_bad("bgl[123x456]", -EINVAL, "3-D box");
	expect_bad("bgl[x]", -EINVAL, "3-D box");
}
END_TEST

START_TEST(test_hostlist_host_count_limit)
{
	char buf[64];

	ck_assert_int_eq(count_hosts("n[0-65535]"), (int)TPC_SLURM_HOSTS_MAX);
	ck_assert_int_eq(count_hosts("n[1-65536]"), (int)TPC_SLURM_HOSTS_MAX);
	ck_assert_int_eq(count_hosts("n[1-65535],x"), (int)TPC_SLURM_HOSTS_MAX);
	expect_bad("n[0-65535],x", -ENOBUFS, "more than 65536 hosts");
	expect_bad("x,n[0-65535]", -ENOBUFS, "more than 65536 hosts");
	/* Within one group, across its ranges. */
	ck_assert_int_eq(count_hosts("n[0-32767,40000-72767]"), 65536);
	expect_bad("n[0-32767,40000-72768]", -ENOBUFS, "more than 65536 hosts");
	/* Across groups: the product. */
	ck_assert_int_eq(count_hosts("a[1-256]b[1-256]"), 65536);
	expect_bad("a[1-256]b[1-257]", -ENOBUFS, "more than 65536 hosts");
	expect_bad("a[1-65536]b[1-65536]", -ENOBUFS, "more than 65536 hosts");
	snprintf(buf, sizeof(buf), "n[0-%u]", TPC_SLURM_HOSTS_MAX);
	expect_bad(buf, -ENOBUFS, "spans more than 65536 values");
}
END_TEST

START_TEST(test_hostlist_range_span_limit)
{
	ck_assert_int_eq(count_hosts("n[100000-165535]"), 65536);
	expect_bad("n[100000-165536]", -ENOBUFS, "range 100000-165536 spans more than 65536");
	expect_bad("n[0-999999999999999999]", -ENOBUFS, "spans more than");
}
END_TEST

START_TEST(test_hostlist_number_digits_limit)
{
	expect_hosts("n[999999999999999999]", "n999999999999999999", NULL);
	expect_hosts("n[000000000000000001]", "n000000000000000001", NULL);
	expect_bad("n[1000000000000000000]", -EMSGSIZE, "more than 18 digits");
	expect_bad("n[1-0000000000000000002]", -EMSGSIZE, "more than 18 digits");
}
END_TEST

START_TEST(test_hostlist_group_count_limit)
{
	expect_hosts("a[1]b[2]c[3]d[4]", "a1b2c3d4", NULL);
	expect_bad("a[1]b[2]c[3]d[4]e[5]", -ENOBUFS, "more than 4 bracket groups");
}
END_TEST

/* @pre, @n copies of @c, @post (static storage, replaced by the next call). */
static const char *mk(const char *pre, char c, size_t n, const char *post)
{
	static char buf[1024];
	size_t a = strlen(pre), b = strlen(post);

	ck_assert_uint_lt(a + n + b, sizeof(buf));
	memcpy(buf, pre, a);
	memset(buf + a, c, n);
	memcpy(buf + a + n, post, b + 1);
	return buf;
}

START_TEST(test_hostlist_name_length_limit)
{
	struct tpc_hostlist *hl = NULL;

	/* A plain name. */
	ck_assert_int_eq(count_hosts(rep('a', TPC_SLURM_NAME_MAX)), 1);
	expect_bad(rep('a', TPC_SLURM_NAME_MAX + 1), -EMSGSIZE, "longer than 255 characters");
	/* A generated one: 252 + "999" fits, 252 + "1000" does not. */
	ck_assert_int_eq(count_hosts(mk("", 'p', 252, "[998-999]")), 2);
	expect_bad(mk("", 'p', 252, "[998-1000]"), -EMSGSIZE, "longer than 255 characters");
	/* Padding counts: 250 + 5 digits fits, 250 + 6 does not. */
	ck_assert_int_eq(tpc_slurm_hostlist_parse(mk("", 'p', 250, "[00001]"), &hl), 0);
	ck_assert_uint_eq(strlen(tpc_slurm_hostlist_name(hl, 0)), 255);
	tpc_slurm_hostlist_free(hl);
	expect_bad(mk("", 'p', 250, "[000001]"), -EMSGSIZE, "longer than 255 characters");
	/* Literal text between groups counts too. */
	ck_assert_int_eq(count_hosts(mk("a[1]", 'q', 252, "[1]")), 1);
	expect_bad(mk("a[1]", 'q', 253, "[1]"), -EMSGSIZE, "longer than 255 characters");
}
END_TEST

/* A list of exactly @len characters: names of up to 200 characters separated by commas. */
static char *list_of_length(size_t len)
{
	char *s = malloc(len + 1);
	size_t i = 0;

	ck_assert_ptr_nonnull(s);
	while (i < len) {
		size_t n = TPU_MIN((size_t)200, len - i);

		if (len - i - n == 1) /* never leave a lone comma for the end */
			n--;
		memset(s + i, 'h', n);
		i += n;
		if (i < len)
			s[i++] = ',';
	}
	s[len] = '\0';
	return s;
}

START_TEST(test_hostlist_length_limit)
{
	char *s = list_of_length(TPC_SLURM_LIST_MAX);

	ck_assert_uint_eq(strlen(s), TPC_SLURM_LIST_MAX);
	ck_assert_int_gt(count_hosts(s), 600);
	free(s);
	s = list_of_length(TPC_SLURM_LIST_MAX + 1);
	expect_bad(s, -EMSGSIZE, "longer than 131072 characters");
	free(s);
}
END_TEST

/* Expects @s over @nodes nodes to expand to the NUL-less counts given, then 0. */
static void expect_tasks(const char *s, uint32_t nodes, uint32_t total, ...)
{
	uint32_t *counts = NULL, t = 0;
	va_list ap;
	int r = tpc_slurm_tasks_parse(s, nodes, &counts, &t);

	ck_assert_msg(r == 0, "\"%s\": %d (%s)", s, r, tp_last_error());
	ck_assert_uint_eq(t, total);
	va_start(ap, total);
	for (uint32_t i = 0; i < nodes; i++) {
		uint32_t want = va_arg(ap, uint32_t);

		if (!want)
			break;
		ck_assert_uint_eq(counts[i], want);
	}
	va_end(ap);
	free(counts);
}

static void expect_tasks_bad(const char *s, uint32_t nodes, int err, const char *why)
{
	uint32_t *counts = NULL;
	int r = tpc_slurm_tasks_parse(s, nodes, &counts, NULL);

	ck_assert_msg(r == err, "\"%s\": %d, expected %d (%s)", s, r, err, tp_last_error());
	ck_assert_ptr_null(counts);
	ck_assert_msg(strstr(tp_last_error(), why), "\"%s\": message \"%s\" lacks \"%s\"", s,
		      tp_last_error(), why);
}

START_TEST(test_tasks_expand_repeats)
{
	expect_tasks("2(x3),1", 4, 7, 2u, 2u, 2u, 1u, 0u);
	expect_tasks("4", 1, 4, 4u, 0u);
	expect_tasks("1,2,3", 3, 6, 1u, 2u, 3u, 0u);
	expect_tasks("3(x1)", 1, 3, 3u, 0u);
	expect_tasks("1(x2),5(x2)", 4, 12, 1u, 1u, 5u, 5u, 0u);
}
END_TEST

START_TEST(test_tasks_refuse_malformed)
{
	expect_tasks_bad("", 1, -EINVAL, "a task count expected");
	expect_tasks_bad("0", 1, -EINVAL, "a task count of 0");
	expect_tasks_bad("2(x0)", 1, -EINVAL, "a repeat count of 0");
	expect_tasks_bad("2(3)", 3, -EINVAL, "\"(x\" expected");
	expect_tasks_bad("2(x3", 3, -EINVAL, "')' expected");
	expect_tasks_bad("2(x)", 3, -EINVAL, "a repeat count expected");
	expect_tasks_bad("2,,1", 3, -EINVAL, "a task count expected");
	expect_tasks_bad("2,", 2, -EINVAL, "a task count expected");
	expect_tasks_bad("-1", 1, -EINVAL, "a task count expected");
	expect_tasks_bad("2 (x3)", 3, -EINVAL, "',' expected");
	expect_tasks_bad("2(x3)1", 4, -EINVAL, "',' expected");
	expect_tasks_bad("2(x3),1", 3, -EINVAL, "describes 4 nodes, the node list has 3");
	expect_tasks_bad("2(x3),1", 5, -EINVAL, "describes 4 nodes, the node list has 5");
}
END_TEST

START_TEST(test_tasks_limits)
{
	char buf[64];

	/* Tasks: 2^20 in all. */
	expect_tasks("1048576", 1, TPC_SLURM_RANKS_MAX, 1048576u, 0u);
	expect_tasks_bad("1048577", 1, -ENOBUFS, "a task count over 1048576");
	expect_tasks("524288(x2)", 2, TPC_SLURM_RANKS_MAX, 524288u, 524288u, 0u);
	expect_tasks_bad("524288(x2),1", 3, -ENOBUFS, "more than 1048576 tasks");
	expect_tasks_bad("99999999999999999999", 1, -ENOBUFS, "a task count over");
	/* Nodes: 65536. */
	expect_tasks("1(x65536)", TPC_SLURM_HOSTS_MAX, TPC_SLURM_HOSTS_MAX, 1u, 0u);
	expect_tasks_bad("1(x65537)", TPC_SLURM_HOSTS_MAX, -ENOBUFS, "a repeat count over 65536");
	expect_tasks_bad("1(x65536),1", TPC_SLURM_HOSTS_MAX, -ENOBUFS, "more than 65536 nodes");
	snprintf(buf, sizeof(buf), "1(x%u)", TPC_SLURM_HOSTS_MAX - 1);
	expect_tasks(buf, TPC_SLURM_HOSTS_MAX - 1, TPC_SLURM_HOSTS_MAX - 1, 1u, 0u);
}
END_TEST

/* The variables of task 5 of 7 on the third of four nodes, "2(x3),1". */
static struct tpc_slurm_vars good_vars(void)
{
	return (struct tpc_slurm_vars){
		.job_id = "1234",
		.step_id = "0",
		.procid = "5",
		.ntasks = "7",
		.nprocs = "7",
		.step_num_tasks = "7",
		.localid = "1",
		.nodeid = "2",
		.step_nodelist = "gn[01-03],gpu7",
		.job_nodelist = "gn[01-08],gpu[7-9]",
		.step_tasks_per_node = "2(x3),1",
		.tasks_per_node = "1(x11)",
	};
}

static void expect_vars_bad(const struct tpc_slurm_vars *v, int err, const char *why)
{
	struct tpc_slurm t;
	int r;

	memset(&t, 0x5a, sizeof(t));
	r = tpc_slurm_from_vars(v, &t);
	ck_assert_msg(r == err, "%d, expected %d (%s)", r, err, tp_last_error());
	ck_assert_msg(strstr(tp_last_error(), why), "message \"%s\" lacks \"%s\"", tp_last_error(),
		      why);
	ck_assert_uint_eq(t.rank, 0x5a5a5a5au); /* untouched on failure */
}

START_TEST(test_env_derives_rank_node_key_coordinator)
{
	struct tpc_slurm_vars v = good_vars();
	struct tpc_slurm t;

	ck_assert_int_eq(tpc_slurm_from_vars(&v, &t), 0);
	ck_assert_uint_eq(t.job_id, 1234);
	ck_assert_uint_eq(t.step_id, 0);
	ck_assert_uint_eq(t.rank, 5);
	ck_assert_uint_eq(t.size, 7);
	ck_assert_uint_eq(t.local_rank, 1);
	ck_assert_uint_eq(t.local_size, 2);
	ck_assert_uint_eq(t.node, 2);
	ck_assert_uint_eq(t.nodes, 4);
	ck_assert_str_eq(t.key, "slurm:1234.0");
	ck_assert_str_eq(t.coordinator, "gn01");
	ck_assert_str_eq(t.node_name, "gn03");
	/* The last task: alone on gpu7. */
	v.procid = "6", v.nodeid = "3", v.localid = "0";
	ck_assert_int_eq(tpc_slurm_from_vars(&v, &t), 0);
	ck_assert_uint_eq(t.local_size, 1);
	ck_assert_str_eq(t.node_name, "gpu7");
	ck_assert_str_eq(t.coordinator, "gn01");
}
END_TEST

START_TEST(test_env_step_values_win_job_values_are_fallbacks)
{
	struct tpc_slurm_vars v = good_vars();
	struct tpc_slurm t;

	/* Without the step's lists, the job's: 11 nodes of one task each. */
	v.step_nodelist = NULL, v.step_tasks_per_node = NULL;
	v.ntasks = v.nprocs = v.step_num_tasks = "11";
	v.nodeid = "9", v.localid = "0", v.procid = "9";
	ck_assert_int_eq(tpc_slurm_from_vars(&v, &t), 0);
	ck_assert_uint_eq(t.nodes, 11);
	ck_assert_str_eq(t.coordinator, "gn01");
	ck_assert_str_eq(t.node_name, "gpu8");
	ck_assert_uint_eq(t.local_size, 1);
	/* Any one of the three task counts does. */
	v.ntasks = v.nprocs = NULL;
	ck_assert_int_eq(tpc_slurm_from_vars(&v, &t), 0);
	v.step_num_tasks = NULL, v.nprocs = "11";
	ck_assert_int_eq(tpc_slurm_from_vars(&v, &t), 0);
	ck_assert_uint_eq(t.size, 11);
	/* Step ids beyond 2^31 (Slurm's special steps) are numbers like any other. */
	v.step_id = "4294967291", v.job_id = "4294967295";
	ck_assert_int_eq(tpc_slurm_from_vars(&v, &t), 0);
	ck_assert_str_eq(t.key, "slurm:4294967295.4294967291");
}
END_TEST

START_TEST(test_env_missing_variables_name_themselves)
{
	struct tpc_slurm_vars v;

	v = good_vars(), v.job_id = NULL;
	expect_vars_bad(&v, -ENOENT, "SLURM_JOB_ID is not set");
	v = good_vars(), v.step_id = NULL;
	expect_vars_bad(&v, -ENOENT, "SLURM_STEP_ID is not set");
	v = good_vars(), v.procid = NULL;
	expect_vars_bad(&v, -ENOENT, "SLURM_PROCID is not set");
	v = good_vars(), v.localid = NULL;
	expect_vars_bad(&v, -ENOENT, "SLURM_LOCALID is not set");
	v = good_vars(), v.nodeid = NULL;
	expect_vars_bad(&v, -ENOENT, "SLURM_NODEID is not set");
	v = good_vars(), v.ntasks = v.nprocs = v.step_num_tasks = NULL;
	expect_vars_bad(&v, -ENOENT, "SLURM_NPROCS is set");
	v = good_vars(), v.step_nodelist = v.job_nodelist = NULL;
	expect_vars_bad(&v, -ENOENT, "neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST");
	v = good_vars(), v.step_tasks_per_node = v.tasks_per_node = NULL;
	expect_vars_bad(&v, -ENOENT, "neither SLURM_STEP_TASKS_PER_NODE nor");
}
END_TEST

START_TEST(test_env_refuses_malformed_numbers)
{
	static const char *const bad[] = { "", "-1", "+1", " 1", "1 ", "0x10", "1e3", "abc",
					   "12345678901", "\x01", "5\n" };
	struct tpc_slurm_vars v;

	for (size_t i = 0; i < TPU_ARRAY_SIZE(bad); i++) {
		v = good_vars(), v.procid = bad[i];
		expect_vars_bad(&v, -EINVAL, "SLURM_PROCID=\"");
		v = good_vars(), v.job_id = bad[i];
		expect_vars_bad(&v, -EINVAL, "SLURM_JOB_ID=\"");
		v = good_vars(), v.ntasks = bad[i];
		expect_vars_bad(&v, -EINVAL, "SLURM_NTASKS=\"");
	}
	v = good_vars(), v.job_id = "4294967296";
	expect_vars_bad(&v, -EINVAL, "SLURM_JOB_ID=4294967296 is over 4294967295");
	v = good_vars(), v.nodeid = "\x1b[31m";
	expect_vars_bad(&v, -EINVAL, "SLURM_NODEID=\"?[31m\" is not a decimal number");
	v = good_vars(), v.nodeid = rep('9', 500);
	expect_vars_bad(&v, -EINVAL, "99999...\" is not a decimal number");
}
END_TEST

START_TEST(test_env_refuses_inconsistent_values)
{
	struct tpc_slurm_vars v;

	v = good_vars(), v.procid = "7";
	expect_vars_bad(&v, -EINVAL, "SLURM_PROCID=7 is not below the task count 7");
	v = good_vars(), v.nodeid = "4";
	expect_vars_bad(&v, -EINVAL, "SLURM_NODEID=4 is not below the node count 4");
	v = good_vars(), v.localid = "2";
	expect_vars_bad(&v, -EINVAL, "SLURM_LOCALID=2 is not below the 2 tasks of node 2");
	v = good_vars(), v.nodeid = "3", v.localid = "1";
	expect_vars_bad(&v, -EINVAL, "SLURM_LOCALID=1 is not below the 1 tasks of node 3");
	v = good_vars(), v.ntasks = v.nprocs = v.step_num_tasks = "8", v.procid = "7";
	expect_vars_bad(&v, -EINVAL, "the tasks per node add up to 7, the task count is 8");
	v = good_vars(), v.ntasks = "8";
	expect_vars_bad(&v, -EINVAL, "SLURM_STEP_NUM_TASKS=7 and SLURM_NTASKS=8 disagree");
	v = good_vars(), v.nprocs = "6";
	expect_vars_bad(&v, -EINVAL, "SLURM_NPROCS=6 disagree");
	v = good_vars(), v.ntasks = v.nprocs = v.step_num_tasks = "0";
	expect_vars_bad(&v, -EINVAL, "SLURM_STEP_NUM_TASKS=0");
	v = good_vars(), v.step_tasks_per_node = "2(x4)";
	expect_vars_bad(&v, -EINVAL, "the tasks per node add up to 8, the task count is 7");
}
END_TEST

START_TEST(test_env_list_errors_name_the_variable)
{
	struct tpc_slurm_vars v;

	v = good_vars(), v.step_nodelist = "gn[01-03";
	expect_vars_bad(&v, -EINVAL, "SLURM_STEP_NODELIST: host list: '[' at character 3");
	v = good_vars(), v.step_nodelist = NULL, v.job_nodelist = "a,,b";
	expect_vars_bad(&v, -EINVAL, "SLURM_JOB_NODELIST: host list: at character 3");
	v = good_vars(), v.step_tasks_per_node = "2(x3),1,1";
	expect_vars_bad(&v, -EINVAL, "SLURM_STEP_TASKS_PER_NODE: tasks per node: describes 5");
	v = good_vars(), v.step_tasks_per_node = NULL;
	expect_vars_bad(&v, -EINVAL, "SLURM_TASKS_PER_NODE: tasks per node: describes 11 nodes");
}
END_TEST

START_TEST(test_env_limits)
{
	struct tpc_slurm_vars v = good_vars();
	struct tpc_slurm t;

	/* The last rank of the largest step: 2^20 tasks, 16 on each of 65536 nodes. */
	v.step_nodelist = "n[0-65535]", v.step_tasks_per_node = "16(x65536)";
	v.ntasks = v.nprocs = v.step_num_tasks = "1048576";
	v.procid = "1048575", v.nodeid = "65535", v.localid = "15";
	ck_assert_int_eq(tpc_slurm_from_vars(&v, &t), 0);
	ck_assert_uint_eq(t.rank, TPC_SLURM_RANKS_MAX - 1);
	ck_assert_uint_eq(t.size, TPC_SLURM_RANKS_MAX);
	ck_assert_uint_eq(t.nodes, TPC_SLURM_HOSTS_MAX);
	ck_assert_str_eq(t.node_name, "n65535");
	v.procid = "1048576";
	expect_vars_bad(&v, -EINVAL, "SLURM_PROCID=1048576 is over 1048575");
	v = good_vars(), v.ntasks = v.nprocs = v.step_num_tasks = "1048577";
	expect_vars_bad(&v, -EINVAL, "SLURM_STEP_NUM_TASKS=1048577 is over 1048576");
	v = good_vars(), v.nodeid = "65536";
	expect_vars_bad(&v, -EINVAL, "SLURM_NODEID=65536 is over 65535");
	v = good_vars(), v.localid = "1048576";
	expect_vars_bad(&v, -EINVAL, "SLURM_LOCALID=1048576 is over 1048575");
}
END_TEST

START_TEST(test_env_read_from_environment)
{
	struct tpc_slurm_vars v;
	struct tpc_slurm t;

	clearenv();
	tpc_slurm_vars_from_env(&v);
	ck_assert(!tpc_slurm_detected(&v));
	ck_assert_int_eq(tpc_slurm_from_env(&t), -ENOENT);
	/* The older spellings: SLURM_JOBID, SLURM_STEPID, SLURM_NODELIST. */
	setenv("SLURM_JOBID", "77", 1);
	setenv("SLURM_STEPID", "3", 1);
	setenv("SLURM_PROCID", "1", 1);
	setenv("SLURM_NPROCS", "2", 1);
	setenv("SLURM_LOCALID", "1", 1);
	setenv("SLURM_NODEID", "0", 1);
	setenv("SLURM_NODELIST", "vm", 1);
	setenv("SLURM_TASKS_PER_NODE", "2", 1);
	tpc_slurm_vars_from_env(&v);
	ck_assert(tpc_slurm_detected(&v));
	ck_assert_int_eq(tpc_slurm_from_env(&t), 0);
	ck_assert_str_eq(t.key, "slurm:77.3");
	ck_assert_str_eq(t.coordinator, "vm");
	ck_assert_uint_eq(t.local_size, 2);
	/* The current spellings win. */
	setenv("SLURM_JOB_ID", "78", 1);
	setenv("SLURM_STEP_ID", "4", 1);
	setenv("SLURM_JOB_NODELIST", "a,vm2", 1);
	setenv("SLURM_STEP_NODELIST", "vm3", 1);
	setenv("SLURM_STEP_TASKS_PER_NODE", "2", 1);
	setenv("SLURM_NTASKS", "2", 1);
	setenv("SLURM_STEP_NUM_TASKS", "2", 1);
	ck_assert_int_eq(tpc_slurm_from_env(&t), 0);
	ck_assert_str_eq(t.key, "slurm:78.4");
	ck_assert_str_eq(t.coordinator, "vm3");
	setenv("SLURM_NTASKS", "3", 1);
	ck_assert_int_eq(tpc_slurm_from_env(&t), -EINVAL);
}
END_TEST

static Suite *slurm_suite(void)
{
	Suite *s = suite_create("slurm");
	TCase *tc = tcase_create("hostlist");

	tcase_add_test(tc, test_hostlist_expands_ranges_and_keeps_padding);
	tcase_add_test(tc, test_hostlist_commas_inside_brackets_do_not_split);
	tcase_add_test(tc, test_hostlist_several_groups_last_fastest);
	tcase_add_test(tc, test_hostlist_refuses_malformed);
	tcase_add_test(tc, test_hostlist_host_count_limit);
	tcase_add_test(tc, test_hostlist_range_span_limit);
	tcase_add_test(tc, test_hostlist_number_digits_limit);
	tcase_add_test(tc, test_hostlist_group_count_limit);
	tcase_add_test(tc, test_hostlist_name_length_limit);
	tcase_add_test(tc, test_hostlist_length_limit);
	suite_add_tcase(s, tc);
	tc = tcase_create("tasks");
	tcase_add_test(tc, test_tasks_expand_repeats);
	tcase_add_test(tc, test_tasks_refuse_malformed);
	tcase_add_test(tc, test_tasks_limits);
	suite_add_tcase(s, tc);
	tc = tcase_create("env");
	tcase_add_test(tc, test_env_derives_rank_node_key_coordinator);
	tcase_add_test(tc, test_env_step_values_win_job_values_are_fallbacks);
	tcase_add_test(tc, test_env_missing_variables_name_themselves);
	tcase_add_test(tc, test_env_refuses_malformed_numbers);
	tcase_add_test(tc, test_env_refuses_inconsistent_values);
	tcase_add_test(tc, test_env_list_errors_name_the_variable);
	tcase_add_test(tc, test_env_limits);
	tcase_add_test(tc, test_env_read_from_environment);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(slurm_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
