/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit suite for backends/: the registry's probe results and channel selection by capability,
 * and real copies by the shm and cma channels within this process (no hardware needed).
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tpb.h"

static struct tpb_mem local(void *p)
{
	return (struct tpb_mem){ .loc = TPB_LOC_LOCAL, .addr = (uint64_t)(uintptr_t)p };
}

static struct tpb_mem proc(void *p)
{
	return (struct tpb_mem){ .loc = TPB_LOC_PROCESS, .pid = getpid(),
				 .addr = (uint64_t)(uintptr_t)p };
}

START_TEST(test_select_prefers_shm_for_local_memory)
{
	struct tpb_config cfg = { 0 };

	tpb_registry_init(&cfg);
	ck_assert_str_eq(tpb_name(tpb_select(TPB_LOC_LOCAL, TPB_LOC_LOCAL)), "shm");
}
END_TEST

START_TEST(test_select_uses_cma_for_process_memory)
{
	struct tpb_config cfg = { 0 };

	tpb_registry_init(&cfg);
	ck_assert_str_eq(tpb_name(tpb_select(TPB_LOC_PROCESS, TPB_LOC_LOCAL)), "cma");
	ck_assert_str_eq(tpb_name(tpb_select(TPB_LOC_LOCAL, TPB_LOC_PROCESS)), "cma");
	ck_assert_str_eq(tpb_name(tpb_select(TPB_LOC_PROCESS, TPB_LOC_PROCESS)), "cma");
}
END_TEST

START_TEST(test_cma_disabled_is_not_viable_with_reason)
{
	struct tpb_config cfg = { .cma_disabled = true };
	const struct tpb_channel_info *ch;
	size_t n;
	int idx;

	tpb_registry_init(&cfg);
	ck_assert_int_eq(tpb_select(TPB_LOC_PROCESS, TPB_LOC_LOCAL), -EOPNOTSUPP);
	ch = tpb_registry_list(&n);
	idx = tpb_index("cma");
	ck_assert_int_ge(idx, 0);
	ck_assert(!ch[idx].viable);
	ck_assert_str_eq(ch[idx].why, "disabled by configuration");
	/* shm still serves local memory */
	ck_assert_str_eq(tpb_name(tpb_select(TPB_LOC_LOCAL, TPB_LOC_LOCAL)), "shm");
}
END_TEST

START_TEST(test_basic_has_no_copy_op)
{
	struct tpb_config cfg = { 0 };
	struct tpb_xfer x = { 0 };

	tpb_registry_init(&cfg);
	ck_assert_int_eq(tpb_copy(tpb_index("basic"), &x, NULL), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_copy(99, &x, NULL), -EOPNOTSUPP);
	ck_assert_int_eq(tpb_index("nope"), -ENOENT);
}
END_TEST

START_TEST(test_priority_reorders_but_cma_never_takes_local_pairs)
{
	struct tpb_config cfg = { .priority = "cma,shm" };
	const struct tpb_channel_info *ch;
	size_t n;

	ck_assert_int_eq(tpb_registry_init(&cfg), 0);
	ch = tpb_registry_list(&n);
	ck_assert_str_eq(ch[0].ops->name, "cma");
	ck_assert_str_eq(ch[1].ops->name, "shm");
	ck_assert_str_eq(ch[2].ops->name, "basic");
	ck_assert_str_eq(tpb_name(tpb_select(TPB_LOC_PROCESS, TPB_LOC_LOCAL)), "cma");
	ck_assert_str_eq(tpb_name(tpb_select(TPB_LOC_LOCAL, TPB_LOC_LOCAL)), "shm");
}
END_TEST

START_TEST(test_priority_with_unknown_channel_keeps_builtin_order)
{
	struct tpb_config cfg = { .priority = "cma,gpu" };
	const struct tpb_channel_info *ch;
	char bad[16];
	size_t n;

	ck_assert_int_eq(tpb_priority_check("shm, cma", bad, sizeof(bad)), 0);
	ck_assert_int_eq(tpb_priority_check("cma,gpu", bad, sizeof(bad)), -EINVAL);
	ck_assert_str_eq(bad, "gpu");
	ck_assert_int_eq(tpb_registry_init(&cfg), -EINVAL);
	ch = tpb_registry_list(&n);
	ck_assert_str_eq(ch[0].ops->name, "shm");
	ck_assert_str_eq(ch[1].ops->name, "cma");
}
END_TEST

START_TEST(test_shm_disabled_leaves_no_channel_for_local_pairs)
{
	struct tpb_config cfg = { .shm_disabled = true };

	ck_assert_int_eq(tpb_registry_init(&cfg), 0);
	ck_assert_int_eq(tpb_select(TPB_LOC_LOCAL, TPB_LOC_LOCAL), -EOPNOTSUPP);
	ck_assert_str_eq(tpb_name(tpb_select(TPB_LOC_LOCAL, TPB_LOC_PROCESS)), "cma");
}
END_TEST

static void check_copy(const char *chan, bool src_proc, bool dst_proc, size_t len)
{
	struct tpb_config cfg = { 0 };
	char *a = malloc(len + 1), *b = calloc(1, len + 1);
	struct tpb_scratch s = { .bounce = malloc(4096), .bounce_len = 4096 };
	struct tpb_xfer x;

	tpb_registry_init(&cfg);
	for (size_t i = 0; i < len; i++)
		a[i] = (char)(i * 7 + 3);
	x.src = src_proc ? proc(a) : local(a);
	x.dst = dst_proc ? proc(b) : local(b);
	x.len = len;
	ck_assert_int_eq(tpb_copy(tpb_index(chan), &x, &s), 0);
	ck_assert_int_eq(memcmp(a, b, len), 0);
	free(a);
	free(b);
	free(s.bounce);
}

START_TEST(test_shm_copies)
{
	check_copy("shm", false, false, 100000);
}
END_TEST

START_TEST(test_cma_reads_writes_and_bounces)
{
	check_copy("cma", true, false, 100000);
	check_copy("cma", false, true, 100000);
	check_copy("cma", true, true, 100000); /* through a 4 KiB bounce buffer, many rounds */
}
END_TEST

START_TEST(test_cma_unmapped_address_fails_cleanly)
{
	struct tpb_config cfg = { 0 };
	char buf[64];
	struct tpb_xfer x = { .src = { .loc = TPB_LOC_PROCESS, .pid = getpid(), .addr = 8 },
			      .dst = local(buf), .len = sizeof(buf) };

	tpb_registry_init(&cfg);
	ck_assert_int_eq(tpb_copy(tpb_index("cma"), &x, NULL), -EFAULT);
}
END_TEST

static Suite *backends_suite(void)
{
	Suite *s = suite_create("backends");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_select_prefers_shm_for_local_memory);
	tcase_add_test(tc, test_select_uses_cma_for_process_memory);
	tcase_add_test(tc, test_cma_disabled_is_not_viable_with_reason);
	tcase_add_test(tc, test_basic_has_no_copy_op);
	tcase_add_test(tc, test_priority_reorders_but_cma_never_takes_local_pairs);
	tcase_add_test(tc, test_priority_with_unknown_channel_keeps_builtin_order);
	tcase_add_test(tc, test_shm_disabled_leaves_no_channel_for_local_pairs);
	tcase_add_test(tc, test_shm_copies);
	tcase_add_test(tc, test_cma_reads_writes_and_bounces);
	tcase_add_test(tc, test_cma_unmapped_address_fails_cleanly);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(backends_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
