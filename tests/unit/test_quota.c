/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests of the daemon's rate-limited logging (daemon/core/quota.c): one line per interval,
 * and a burst per window, each just at and just above its bound, with the count of the lines held
 * back handed to the next line allowed; the per-uid count of waiting calls (waits-per-uid)
 * at and above its bound, given back, root exempt; and fds parked ahead of their frames,
 * charged as kept fds up to kept-fds-per-uid and kept_fds_cap plus TPD_QUOTA_FDS_IN_FLIGHT.
 */
#include <check.h>
#include <errno.h>
#include <string.h>
#include <time.h>
#include "config.h"
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

/* Each source's own bound and the shared one, at and above each: a source over its own bound
 * spends nothing of the shared one, so the others still get their lines. */
START_TEST(test_ratelog_shared_at_and_above_own_and_all)
{
	struct tpd_ratelog a = { 0 }, b = { 0 }, c = { 0 }, all = { 0 };
	unsigned held = 99;

	for (int i = 0; i < 3; i++)
		ck_assert_msg(tpd_quota_ratelog_shared_ok(&a, 3, &all, 5, 50, &held),
			      "line %d of a's 3 refused", i);
	for (int i = 0; i < 10; i++) /* a's flood, over its own bound */
		ck_assert(!tpd_quota_ratelog_shared_ok(&a, 3, &all, 5, 50, &held));
	ck_assert(tpd_quota_ratelog_shared_ok(&b, 3, &all, 5, 50, &held)); /* 4th of all */
	ck_assert_uint_eq(held, 0);
	ck_assert(tpd_quota_ratelog_shared_ok(&b, 3, &all, 5, 50, &held)); /* 5th of all */
	ck_assert(!tpd_quota_ratelog_shared_ok(&b, 3, &all, 5, 50, &held)); /* 6th: over all */
	ck_assert(!tpd_quota_ratelog_shared_ok(&c, 3, &all, 5, 50, &held));
	sleep_ms(60); /* the window itself, not a synchronisation */
	ck_assert(tpd_quota_ratelog_shared_ok(&a, 3, &all, 5, 50, &held));
	ck_assert_uint_eq(held, 10);
	ck_assert(tpd_quota_ratelog_shared_ok(&b, 3, &all, 5, 50, &held));
	ck_assert_uint_eq(held, 1);
	ck_assert(tpd_quota_ratelog_shared_ok(&c, 3, &all, 5, 50, &held));
	ck_assert_uint_eq(held, 1);
}
END_TEST

/* Budgets by name: the host part of an address is the name, an empty name is one name too,
 * and a name over the table's room is cut, not refused. */
START_TEST(test_ratelog_keys_at_and_above_own_and_all)
{
	static struct tpd_ratelog_keys t;
	char longer[TPD_RATELOG_KEY_LEN + 40];
	unsigned held = 99;

	for (int i = 0; i < 2; i++)
		ck_assert(tpd_quota_ratelog_key_ok(&t, "10.0.0.1:7420", 8, 2, 5, 1000, &held));
	ck_assert(!tpd_quota_ratelog_key_ok(&t, "10.0.0.1:9999", 8, 2, 5, 1000, &held));
	ck_assert(tpd_quota_ratelog_key_ok(&t, "10.0.0.2:7420", 8, 2, 5, 1000, &held));
	ck_assert_uint_eq(held, 0);
	ck_assert(tpd_quota_ratelog_key_ok(&t, "", 0, 2, 5, 1000, &held));
	memset(longer, 'a', sizeof(longer));
	ck_assert(tpd_quota_ratelog_key_ok(&t, longer, sizeof(longer), 2, 5, 1000, &held));
	ck_assert(!tpd_quota_ratelog_key_ok(&t, "10.0.0.3:1", 8, 2, 5, 1000, &held)); /* 6th */
}
END_TEST

START_TEST(test_waits_at_and_above_waits_per_uid)
{
	struct tpd_config cfg = { .waits_per_uid = 3 };
	struct tpd_uid_acct a = { .uid = 65534 }, root = { .uid = 0 };
	char why[160];

	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(tpd_quota_charge_wait(&cfg, &a, why, sizeof(why)), 0);
	ck_assert_int_eq(tpd_quota_charge_wait(&cfg, &a, why, sizeof(why)), -ENOBUFS);
	ck_assert_ptr_nonnull(strstr(why, "waits-per-uid"));
	ck_assert_uint_eq(a.waits, 3);
	tpd_quota_release_wait(&a);
	ck_assert_int_eq(tpd_quota_charge_wait(&cfg, &a, why, sizeof(why)), 0);
	for (int i = 0; i < 10; i++) /* root is exempt */
		ck_assert_int_eq(tpd_quota_charge_wait(&cfg, &root, why, sizeof(why)), 0);
}
END_TEST

START_TEST(test_parked_fds_at_and_above_kept_fds_per_uid_plus_in_flight)
{
	struct tpd_config cfg = { .kept_fds_per_uid = 4, .kept_fds_cap = 1000 };
	struct tpd_uid_acct a = { .uid = 65534 }, b = { .uid = 4242 };
	unsigned limit = 4 + TPD_QUOTA_FDS_IN_FLIGHT;
	struct tpd_quota q;
	char why[200];

	tpd_quota_init(&q);
	for (unsigned i = 0; i < 4; i++) /* kept fds up to their own limit */
		ck_assert_int_eq(tpd_quota_charge_fd(&q, &cfg, &a, why, sizeof(why)), 0);
	ck_assert_int_eq(tpd_quota_charge_fd(&q, &cfg, &a, why, sizeof(why)), -EMFILE);
	for (unsigned i = 4; i < limit; i++) /* parked fds: the same count, 24 more */
		ck_assert_int_eq(tpd_quota_charge_parked_fd(&q, &cfg, &a, why, sizeof(why)), 0);
	ck_assert_int_eq(tpd_quota_charge_parked_fd(&q, &cfg, &a, why, sizeof(why)), -EMFILE);
	ck_assert_ptr_nonnull(strstr(why, "kept-fds-per-uid 4, and 24 in flight"));
	ck_assert_uint_eq(atomic_load(&a.kept_fds), limit);
	ck_assert_uint_eq(q.parked_fds_refused, 1);
	ck_assert_int_eq(tpd_quota_charge_parked_fd(&q, &cfg, &b, why, sizeof(why)), 0);
	tpd_quota_release_fd(&q, &a);
	ck_assert_int_eq(tpd_quota_charge_parked_fd(&q, &cfg, &a, why, sizeof(why)), 0);
	ck_assert_uint_eq(atomic_load(&q.kept_fds), limit + 1);
	tpd_quota_done(&q);
}
END_TEST

START_TEST(test_parked_fds_at_and_above_kept_fds_cap_plus_in_flight)
{
	struct tpd_config cfg = { .kept_fds_per_uid = 1000, .kept_fds_cap = 2, .kept_fds_max = 2 };
	struct tpd_uid_acct a = { .uid = 65534 }, root = { .uid = 0 };
	unsigned limit = 2 + TPD_QUOTA_FDS_IN_FLIGHT;
	struct tpd_quota q;
	char why[200];

	tpd_quota_init(&q);
	for (unsigned i = 0; i < limit - 1; i++)
		ck_assert_int_eq(tpd_quota_charge_parked_fd(&q, &cfg, &a, why, sizeof(why)), 0);
	ck_assert_int_eq(tpd_quota_charge_fd(&q, &cfg, &root, why, sizeof(why)), -ENFILE);
	ck_assert_int_eq(tpd_quota_charge_parked_fd(&q, &cfg, &root, why, sizeof(why)), 0);
	/* root, exempt per uid, stops at the daemon-wide bound like anyone */
	ck_assert_int_eq(tpd_quota_charge_parked_fd(&q, &cfg, &root, why, sizeof(why)), -ENFILE);
	ck_assert_int_eq(tpd_quota_charge_parked_fd(&q, &cfg, &a, why, sizeof(why)), -ENFILE);
	ck_assert_ptr_nonnull(strstr(why, "kept-fds-max 2, and 24 in flight"));
	ck_assert_uint_eq(atomic_load(&q.kept_fds), limit);
	tpd_quota_done(&q);
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
	tcase_add_test(tc, test_ratelog_shared_at_and_above_own_and_all);
	tcase_add_test(tc, test_ratelog_keys_at_and_above_own_and_all);
	tcase_add_test(tc, test_waits_at_and_above_waits_per_uid);
	tcase_add_test(tc, test_parked_fds_at_and_above_kept_fds_per_uid_plus_in_flight);
	tcase_add_test(tc, test_parked_fds_at_and_above_kept_fds_cap_plus_in_flight);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
