/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests of the test harness itself (tests/common/tpt.c), so that an integration failure
 * means the product and not the harness: byte patterns catch any single corrupted byte and
 * differ between seeds, sync channels deliver values and time out, child processes report their
 * status and are killed at their deadline, and commands have their output and status captured.
 * Needs no daemon.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tpt.h"

START_TEST(test_tpt_pattern_detects_every_flipped_byte)
{
	enum { LEN = 1000 };
	uint8_t *buf = malloc(LEN);
	size_t off = 0;

	ck_assert_ptr_nonnull(buf);
	tpt_fill(buf, LEN, 42);
	ck_assert(tpt_verify(buf, LEN, 42, NULL));
	for (size_t i = 0; i < LEN; i += 7) {
		buf[i] ^= 0x01;
		ck_assert(!tpt_verify(buf, LEN, 42, &off));
		ck_assert_uint_eq(off, i);
		buf[i] ^= 0x01;
	}
	ck_assert(!tpt_verify(buf, LEN, 43, NULL));
	ck_assert(tpt_verify(buf, 0, 99, NULL));
	free(buf);
}
END_TEST

START_TEST(test_tpt_pattern_is_position_dependent_and_prefix_stable)
{
	uint8_t a[64], b[13];

	tpt_fill(a, sizeof(a), 7);
	tpt_fill(b, sizeof(b), 7);
	ck_assert_mem_eq(a, b, sizeof(b)); /* a shorter fill is a prefix of a longer one */
	ck_assert(memcmp(a, a + 8, 8) != 0);
	ck_assert(!tpt_verify(a + 8, 8, 7, NULL));
	ck_assert_uint_ne(tpt_seed(0, 1, 0), tpt_seed(0, 0, 1));
	ck_assert_uint_ne(tpt_seed(1, 0, 0), tpt_seed(0, 1, 0));
}
END_TEST

START_TEST(test_tpt_sync_delivers_values_and_times_out)
{
	struct tpt_sync s;

	ck_assert_int_eq(tpt_sync_init(&s), 0);
	ck_assert_int_eq(tpt_sync_wait(&s, 10), -ETIMEDOUT);
	ck_assert_int_eq(tpt_sync_post(&s, 5), 0);
	ck_assert_int_eq(tpt_sync_post(&s, -3), 0);
	ck_assert_int_eq(tpt_sync_wait(&s, 1000), 5);
	ck_assert_int_eq(tpt_sync_wait(&s, 1000), -3);
	tpt_sync_done(&s);
}
END_TEST

static int child_exit_code(void *arg)
{
	return *(int *)arg;
}

static int child_hang(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return 0;
}

START_TEST(test_tpt_children_report_status_and_die_at_deadline)
{
	int zero = 0, three = 3, status = 0;
	uint64_t t0;
	pid_t pid;

	pid = tpt_fork(child_exit_code, &zero);
	ck_assert(tpt_wait_ok(pid, 5000, "zero"));
	pid = tpt_fork(child_exit_code, &three);
	ck_assert(!tpt_wait_ok(pid, 5000, "three"));
	pid = tpt_fork(child_hang, NULL);
	t0 = tpt_now_ms();
	ck_assert_int_eq(tpt_wait(pid, 100, &status), -ETIMEDOUT);
	ck_assert_uint_lt(tpt_now_ms() - t0, 5000);
	ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}
END_TEST

START_TEST(test_tpt_run_captures_output_and_status)
{
	const char *echo[] = { "/bin/sh", "-c", "echo out; echo err >&2; exit 4", NULL };
	const char *slow[] = { "/bin/sh", "-c", "exec sleep 30", NULL };
	struct tpt_cmd_result r;

	ck_assert_int_eq(tpt_run(echo, 5000, &r), 0);
	ck_assert(WIFEXITED(r.status));
	ck_assert_int_eq(WEXITSTATUS(r.status), 4);
	ck_assert_str_eq(r.out, "out\n");
	ck_assert_str_eq(r.err, "err\n");
	ck_assert_uint_eq(r.out_len, 4);
	tpt_cmd_result_free(&r);
	ck_assert_int_eq(tpt_run(slow, 100, &r), -ETIMEDOUT);
}
END_TEST

START_TEST(test_tpt_daemon_start_needs_binary)
{
	struct tpt_daemon d;

	unsetenv("TPIPD_BIN");
	ck_assert_int_eq(tpt_daemon_start(&d, NULL), -ENOENT);
	setenv("TPIPD_BIN", "/bin/false", 1); /* exits at once: reported, nothing left behind */
	ck_assert_int_eq(tpt_daemon_start(&d, NULL), -ECHILD);
	ck_assert_int_eq(d.pid, -1);
}
END_TEST

static Suite *tpt_suite(void)
{
	Suite *s = suite_create("tpt");
	TCase *tc = tcase_create("harness");

	tcase_add_test(tc, test_tpt_pattern_detects_every_flipped_byte);
	tcase_add_test(tc, test_tpt_pattern_is_position_dependent_and_prefix_stable);
	tcase_add_test(tc, test_tpt_sync_delivers_values_and_times_out);
	tcase_add_test(tc, test_tpt_children_report_status_and_die_at_deadline);
	tcase_add_test(tc, test_tpt_run_captures_output_and_status);
	tcase_add_test(tc, test_tpt_daemon_start_needs_binary);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(tpt_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
