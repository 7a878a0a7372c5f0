/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: a daemon stopped (SIGTERM, its normal shutdown) while channel items are on
 * their way frees every one of them. A writer writes large items, from private memory (staging
 * buffers it lends, or CMA) or from a shared buffer (handed off to waiting reads), and readers
 * read them (copied out, packed several to a call, lent, or mapped) when the daemon is told to
 * stop, at once or after its drain; it must exit with status 0. Meant for the sanitized build
 * (build-asan: LeakSanitizer makes a daemon that leaks an item, its buffer or its accounting
 * exit non-zero) and for `meson test --setup valgrind` (the daemon under memcheck, a definite
 * leak exits 99); elsewhere it checks the clean stop only. Each case stops the daemon at a few
 * moments of the stream.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"

#define T_MS 30000
#define MIB (1u << 20)
#define ITEM_LEN (8 * MIB + 5)
#define ROUNDS 3

enum rmode { R_READ, R_INTO_PRIVATE, R_INTO_SHARED, R_PACKED_SHARED };

struct stop_run {
	struct tpt_daemon *d;
	enum rmode rmode;
	bool shared_writer; /* items written from a shared buffer (handed off to waiting reads) */
	unsigned readers;
	unsigned lag;	       /* items the first reader reads before it says so */
	struct tpt_sync reading; /* the first reader has read @lag items */
};

/* A writer: writes batches of two large private items until the daemon goes. */
static int stop_writer(void *arg)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .capacity_items = 8 };
	struct stop_run *sr = arg;
	struct tp_context *ctx = NULL;
	struct tp_chan *ch;
	uint8_t *src = NULL;

	TPT_REQUIRE(tpt_ctx_new(sr->d, 0, "stopw", &ctx) == 0, 1, "context");
	if (sr->shared_writer)
		TPT_REQUIRE(tp_buffer_alloc(ctx, 2 * (size_t)ITEM_LEN, (void **)&src) == 0, 1,
			    "buffer");
	else
		src = malloc(2 * (size_t)ITEM_LEN);
	TPT_REQUIRE(src, 1, "memory");
	memset(src, 0x5a, 2 * (size_t)ITEM_LEN);
	TPT_REQUIRE(tp_chan_open(ctx, "stop", &o, &ch) == 0, 1, "open: %s", tp_last_error());
	for (;;) {
		struct iovec iov[2] = { { src, ITEM_LEN }, { src + ITEM_LEN, ITEM_LEN } };

		if (tp_chan_write(ch, iov, 2, T_MS) < 0)
			break; /* the daemon went */
	}
	tp_chan_release(ch);
	if (sr->shared_writer)
		tp_buffer_free(ctx, src);
	else
		free(src);
	tp_context_free(ctx);
	return 0;
}

/* A reader: reads items until the daemon goes; the first tells when it has read @lag. */
static int stop_reader(void *arg)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .capacity_items = 8 };
	struct stop_run *sr = arg;
	struct tp_context *ctx = NULL;
	struct tp_chan *ch;
	void *buf = NULL, *item;
	size_t len;
	unsigned n = 0;

	TPT_REQUIRE(tpt_ctx_new(sr->d, 0, "stopr", &ctx) == 0, 1, "context");
	TPT_REQUIRE(tp_chan_open(ctx, "stop", &o, &ch) == 0, 1, "open: %s", tp_last_error());
	if (sr->rmode == R_INTO_SHARED || sr->rmode == R_PACKED_SHARED)
		TPT_REQUIRE(tp_buffer_alloc(ctx, 32 * MIB, &buf) == 0, 1, "buffer");
	else if (sr->rmode == R_INTO_PRIVATE)
		TPT_REQUIRE(buf = malloc(16 * MIB), 1, "memory");
	for (;; n++) {
		int r;

		if (n == sr->lag)
			tpt_sync_post(&sr->reading, 1);
		if (sr->rmode == R_READ) {
			r = tp_chan_read(ch, &item, &len, T_MS);
			if (r >= 0)
				free(item);
		} else if (sr->rmode == R_PACKED_SHARED) {
			struct tp_chan_item items[4];
			size_t n_got;

			r = tp_chan_read_many_into(ch, buf, 32 * MIB, items, 4, &n_got, T_MS);
		} else {
			r = tp_chan_read_into(ch, buf, 16 * MIB, &len, T_MS);
		}
		if (r < 0)
			break; /* the daemon went */
	}
	if (sr->rmode == R_INTO_SHARED || sr->rmode == R_PACKED_SHARED)
		tp_buffer_free(ctx, buf);
	else
		free(buf);
	tp_chan_release(ch);
	tp_context_free(ctx);
	return 0;
}

/* Starts a daemon, a writer and @sr->readers readers, stops the daemon once the first reader
 * has read @sr->lag items, and checks that it stopped cleanly (nothing leaked, with a leak
 * checker). */
static void stop_run(struct stop_run *sr, const char *const *args)
{
	struct tpt_daemon d;
	pid_t pids[5];
	unsigned n = 0;

	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	sr->d = &d;
	ck_assert_int_eq(tpt_sync_init(&sr->reading), 0);
	pids[n++] = tpt_fork(stop_writer, sr);
	for (unsigned k = 0; k < sr->readers; k++)
		pids[n++] = tpt_fork(stop_reader, sr);
	ck_assert_int_eq(tpt_sync_wait(&sr->reading, 4 * T_MS), 1);
	ck_assert_msg(tpt_daemon_stop(&d) == 0, "the daemon did not stop cleanly (leaks?)");
	for (unsigned k = 0; k < n; k++)
		tpt_wait(pids[k], T_MS, NULL);
	tpt_sync_done(&sr->reading);
}

/* --drain-ms 0: the daemon stops at once, whatever copies are running (a longer drain lets
 * most of them end first, and a stop then cuts short only those still running at its
 * deadline). */
static const char *const no_drain[] = { "--drain-ms", "0", NULL };

/* Items read into memory the library allocates (copied out, lent or mapped); the first round
 * with the default drain. */
START_TEST(test_stop_mid_read)
{
	struct stop_run sr = { .rmode = R_READ, .readers = 2, .lag = 1 + (unsigned)_i };

	stop_run(&sr, _i ? no_drain : NULL);
}
END_TEST

/* Items copied out into the readers' private and shared memory. */
START_TEST(test_stop_mid_read_into)
{
	struct stop_run sr = { .rmode = _i % 2 ? R_INTO_SHARED : R_INTO_PRIVATE, .readers = 2,
			       .lag = 1 + (unsigned)_i };

	stop_run(&sr, no_drain);
}
END_TEST

/* No room for staging buffers: the items go in and out by CMA. */
START_TEST(test_stop_mid_cma)
{
	static const char *const args[] = { "--buffer-bytes-max", "4K", "--drain-ms", "0",
					    NULL };
	struct stop_run sr = { .rmode = _i % 2 ? R_READ : R_INTO_PRIVATE, .readers = 2,
			       .lag = 1 + (unsigned)_i };

	stop_run(&sr, args);
}
END_TEST

/* Items from a shared buffer handed off to waiting reads, or copied several to a packed read. */
START_TEST(test_stop_mid_hand_off)
{
	struct stop_run sr = { .rmode = _i % 2 ? R_PACKED_SHARED : R_INTO_SHARED,
			       .shared_writer = true, .readers = 3, .lag = 1 + (unsigned)_i };

	stop_run(&sr, no_drain);
}
END_TEST

static Suite *chan_stop_suite(void)
{
	Suite *s = suite_create("chan_stop");
	TCase *tc = tcase_create("stop");

	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_stop_mid_read, 0, ROUNDS);
	tcase_add_loop_test(tc, test_stop_mid_read_into, 0, ROUNDS);
	tcase_add_loop_test(tc, test_stop_mid_cma, 0, ROUNDS);
	tcase_add_loop_test(tc, test_stop_mid_hand_off, 0, 2 * ROUNDS);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(chan_stop_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
