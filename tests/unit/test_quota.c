/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests of the daemon's rate-limited logging (daemon/core/quota.c): one line per interval,
 * and a burst per window, each just at and just above its bound, with the count of the lines held
 * back handed to the next line allowed.
 */
#include <check.h>
#include <time.h>
#include "quota.h"

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) != 0)
		;
}

START_TEST(test_ratelog_one_line_per_interval)
{
	struct tpd_ratelog rl = { 0 };
	unsigned held = 99;

	ck_assert(tpd_quota_ratelog_ok(&rl, 50, &held));
	ck_assert_uint_eq(held, 0);
	ck_assert(!tpd_quota_ratelog_ok(&rl, 50, &held));
	ck_assert(!tpd_quota_ratelog_ok(&rl, 50, &held));
	sleep_ms(60); /* the interval itself, not a synchronisation */
	ck_assert(tpd_quota_ratelog_ok(&rl, 50, &held));
	ck_assert_uint_eq(held, 2);
}
END_TEST

START_TEST(test_ratelog_burst_at_and_above_its_bound)
{
	struct tpd_ratelog rl = { 0 };
	unsigned held = 99;

	for (int i = 0; i < 20; i++) {
		ck_assert_msg(tpd_quota_ratelog_burst_ok(&rl, 50, 20, &held),
			      "line %d of 20 refused", i);
		ck_assert_uint_eq(held, 0);
	}
	ck_assert(!tpd_quota_ratelog_burst_ok(&rl, 50, 20, &held)); /* the 21st */
	ck_assert(!tpd_quota_ratelog_burst_ok(&rl, 50, 20, &held));
	sleep_ms(60);
	ck_assert(tpd_quota_ratelog_burst_ok(&rl, 50, 20, &held));
	ck_assert_uint_eq(held, 2);
	ck_assert(tpd_quota_ratelog_burst_ok(&rl, 50, 20, &held));
	ck_assert_uint_eq(held, 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("quota");
	TCase *tc = tcase_create("ratelog");
	SRunner *sr;
	int failed;

	tcase_add_test(tc, test_ratelog_one_line_per_interval);
	tcase_add_test(tc, test_ratelog_burst_at_and_above_its_bound);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
