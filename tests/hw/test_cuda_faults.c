/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * hw suite: clients with CUDA memory that exit without cleaning up (_exit: no pipe close, no
 * tp_cuda_release, no cuMemFree, no context teardown) while the daemon holds their IPC
 * mappings. After a completed transfer: the other end learns that its peer died (-ECONNRESET).
 * In the middle of a large transfer whose copy waits for slow work queued on the exiting
 * client's stream (so the copy cannot have finished): a dead writer fails the reader's pending
 * read, a dead reader fails the writer's pending write, both with -ECONNRESET and within a
 * deadline (the daemon must not wait forever for an event of a dead process). Each time the
 * daemon stays up, `tpipctl status` answers, and a new pair of clients moves CUDA tensors.
 * Skips (77) without a CUDA driver or device.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "hwtest.h"

#define BIG (256u << 20)
#define SLOW_MS 3000 /* the work queued ahead of the exiting client's event */
#define T_MS TPT_SCALED_MS(30000)
#define NAME "hw-faults"

static const struct tpt_daemon *D = &tpt_fixture_daemon;
static struct tpt_sync ready, to_writer, to_reader, to_parent;

static void setup(void)
{
	tpt_fixture_start();
	ck_assert_int_eq(tpt_sync_init(&ready), 0);
	ck_assert_int_eq(tpt_sync_init(&to_writer), 0);
	ck_assert_int_eq(tpt_sync_init(&to_reader), 0);
	ck_assert_int_eq(tpt_sync_init(&to_parent), 0);
}

static void teardown(void)
{
	tpt_sync_done(&ready);
	tpt_sync_done(&to_writer);
	tpt_sync_done(&to_reader);
	tpt_sync_done(&to_parent);
	tpt_fixture_stop();
}

/* The daemon is up, answers tpipctl, and a new pair of clients moves CUDA tensors. */
static void check_daemon_serves(unsigned seed)
{
	struct hwt_side gpu = { .mem = HWT_CUDA, .device = 0, .stream = true };
	struct hwt_side cpu = { .mem = HWT_CPU_SHM };
	struct hwt_case cases[] = {
		{ .len = 64u << 20, .w = gpu, .r = gpu },
		{ .len = 1u << 20, .w = gpu, .r = cpu },
		{ .len = 1u << 20, .w = cpu, .r = gpu },
	};
	struct hwt_xfer x = { .d = D, .name = "hw-after", .cases = cases, .n_cases = 3,
			      .seed = seed };
	char *out;

	ck_assert_msg(tpt_daemon_alive(D), "tpipd died");
	out = hwt_ctl(D, "status", false);
	ck_assert_msg(out, "tpipctl status failed");
	free(out);
	ck_assert_msg(hwt_xfer_run(&x), "a new pair of clients cannot move CUDA tensors");
	out = hwt_ctl(D, "status", false);
	ck_assert_msg(out, "tpipctl status failed after the new pair");
	free(out);
}

static void CUDA_CB slow_fn(void *arg)
{
	struct timespec ts = { SLOW_MS / 1000, (SLOW_MS % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* @len bytes of CUDA memory holding the pattern of @seed. */
/*
 * Before a client exits mid-transfer: a grace period in which the daemon, which received the
 * operation, opens the client's IPC handles and starts waiting for its event. Either order must
 * end in -ECONNRESET for the survivor; this one (handles already open, an event that will never
 * complete) is the harder, and nothing outside the daemon shows when it is reached, hence a
 * fixed pause, well inside the SLOW_MS of queued work that keeps the copy from finishing.
 */
static void let_the_daemon_wait(void)
{
	struct timespec ts = { 0, 500 * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* A stream with SLOW_MS of work queued on it. */
static int slow_stream(const struct hwt_cuda *cu, CUstream *ret)
{
	HWT_CU(cu, cuStreamCreate(ret, CU_STREAM_NON_BLOCKING), -EIO);
	HWT_CU(cu, cuLaunchHostFunc(*ret, slow_fn, NULL), -EIO);
	return 0;
}

/* ---- exit after a completed transfer ----------------------------------------------------- */

static int done_writer(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "exiting-writer", .where = NAME,
			     .ready = &ready, .timeout_ms = T_MS };
	struct tp_tensor t = { .device = { TP_DEVICE_CUDA, 0 }, .length = 64u << 20 };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	struct hwt_cuda cu;
	CUdeviceptr p;
	int r;

	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	TPT_REQUIRE(hwt_dev_alloc_fill(&cu, t.length, 70, &p) == 0, 1, "alloc");
	t.data = hwt_ptr(p);
	r = tp_pipe_write_sync(e.p, &m);
	TPT_REQUIRE(r == 0, 1, "write: %d %s", r, tp_last_error());
	TPT_REQUIRE(tpt_sync_wait(&to_writer, T_MS) == 0, 1, "the reader did not check");
	return 0; /* tpt_fork() _exit()s: nothing is closed, released or freed */
}

static int done_reader(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "exiting-reader", .where = NAME,
			     .ready = &ready, .timeout_ms = T_MS };
	struct tp_slot slot = { .device = { TP_DEVICE_CUDA, 0 } };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	struct tp_descriptor *d;
	uint8_t *want = malloc(64u << 20);
	struct hwt_cuda cu;
	CUdeviceptr p;
	int r;

	TPT_REQUIRE(want, 1, "malloc");
	tpt_fill(want, 64u << 20, 70);
	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	r = tp_pipe_read_descriptor_sync(e.p, T_MS, &d);
	TPT_REQUIRE(r == 0, 1, "descriptor: %d %s", r, tp_last_error());
	HWT_CU(&cu, cuMemAlloc(&p, 64u << 20), 1);
	slot.data = hwt_ptr(p);
	r = tp_pipe_read_sync(e.p, d, &a);
	TPT_REQUIRE(r == 0, 1, "read: %d %s", r, tp_last_error());
	TPT_REQUIRE(hwt_dev_expect(&cu, p, want, 64u << 20, "slot") == 0, 1, "contents");
	tpt_sync_post(&to_writer, 0); /* the writer exits now */
	r = tp_pipe_read_descriptor_sync(e.p, T_MS, &d);
	TPT_REQUIRE(r == -ECONNRESET, 1, "read_descriptor after the writer exited: %d (%s), want "
		    "-ECONNRESET", r, tp_last_error());
	return 0; /* exits holding its mapped slot too */
}

START_TEST(test_cuda_faults_exit_after_transfer)
{
	ck_assert(tpt_run_pair(done_reader, done_writer, NULL, 2 * T_MS));
	check_daemon_serves(71);
}
END_TEST

/* ---- the writer exits mid-transfer --------------------------------------------------------- */

static int dying_writer(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "dying-writer", .where = NAME,
			     .ready = &ready, .timeout_ms = T_MS };
	struct tp_tensor t = { .device = { TP_DEVICE_CUDA, 0 }, .length = BIG };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	static struct tpt_done done;
	struct tpt_done_arg da = { &done, 0 };
	struct hwt_cuda cu;
	CUdeviceptr p;
	CUstream s;
	int r;

	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	TPT_REQUIRE(hwt_dev_alloc_fill(&cu, BIG, 72, &p) == 0, 1, "alloc");
	TPT_REQUIRE(slow_stream(&cu, &s) == 0, 1, "stream");
	HWT_CU(&cu, cuMemsetD8Async(p, 0x5a, BIG, s), 1);
	t.data = hwt_ptr(p);
	t.cuda_stream = s;
	tpt_done_init(&done);
	r = tp_pipe_write(e.p, &m, tpt_done_cb, &da);
	TPT_REQUIRE(r == 0, 1, "write: %d %s", r, tp_last_error());
	TPT_REQUIRE(tpt_sync_wait(&to_writer, T_MS) == 0, 1, "never told to exit");
	let_the_daemon_wait();
	TPT_REQUIRE(tpt_done_wait(&done, 1, 0) == -ETIMEDOUT, 1,
		    "the write completed (%d) before the stream's work", done.last_status);
	return 0; /* _exit while the copy waits for this process's stream */
}

static int surviving_reader(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "surviving-reader", .where = NAME,
			     .ready = &ready, .timeout_ms = T_MS };
	struct tp_slot slot = { .device = { TP_DEVICE_CUDA, 0 } };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	static struct tpt_done done;
	struct tpt_done_arg da = { &done, 0 };
	struct tp_descriptor *d;
	struct hwt_cuda cu;
	CUdeviceptr p;
	int r;

	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	r = tp_pipe_read_descriptor_sync(e.p, T_MS, &d);
	TPT_REQUIRE(r == 0, 1, "descriptor: %d %s", r, tp_last_error());
	HWT_CU(&cu, cuMemAlloc(&p, BIG), 1);
	slot.data = hwt_ptr(p);
	tpt_done_init(&done);
	r = tp_pipe_read(e.p, d, &a, tpt_done_cb, &da);
	TPT_REQUIRE(r == 0, 1, "read: %d %s", r, tp_last_error());
	tpt_sync_post(&to_parent, 0);
	TPT_REQUIRE(tpt_done_wait(&done, 1, T_MS) == 0, 1,
		    "the pending read never completed after the writer exited");
	TPT_REQUIRE(done.last_status == -ECONNRESET, 1,
		    "pending read when the writer exited: %d, want -ECONNRESET", done.last_status);
	r = tp_pipe_read_descriptor_sync(e.p, T_MS, &d);
	TPT_REQUIRE(r == -ECONNRESET, 1, "read_descriptor after the writer exited: %d", r);
	tpt_end_close(&e);
	cu.api->cuMemFree(p);
	hwt_cuda_close(&cu);
	return 0;
}

START_TEST(test_cuda_faults_writer_exits_mid_transfer)
{
	pid_t rd = tpt_fork(surviving_reader, NULL), wr = tpt_fork(dying_writer, NULL);

	ck_assert_int_gt(rd, 0);
	ck_assert_int_gt(wr, 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	ck_assert_int_eq(tpt_sync_post(&to_writer, 0), 0);
	ck_assert(tpt_wait_ok(wr, T_MS, "writer"));
	ck_assert(tpt_wait_ok(rd, 2 * T_MS, "reader"));
	check_daemon_serves(73);
}
END_TEST

/* ---- the reader exits mid-transfer --------------------------------------------------------- */

static int surviving_writer(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "surviving-writer", .where = NAME,
			     .ready = &ready, .timeout_ms = T_MS };
	struct tp_tensor t = { .device = { TP_DEVICE_CUDA, 0 }, .length = BIG };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	static struct tpt_done done;
	struct tpt_done_arg da = { &done, 0 };
	struct hwt_cuda cu;
	CUdeviceptr p;
	int r;

	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	TPT_REQUIRE(hwt_dev_alloc_fill(&cu, BIG, 74, &p) == 0, 1, "alloc");
	t.data = hwt_ptr(p);
	tpt_done_init(&done);
	r = tp_pipe_write(e.p, &m, tpt_done_cb, &da);
	TPT_REQUIRE(r == 0, 1, "write: %d %s", r, tp_last_error());
	TPT_REQUIRE(tpt_done_wait(&done, 1, T_MS) == 0, 1,
		    "the pending write never completed after the reader exited");
	TPT_REQUIRE(done.last_status == -ECONNRESET, 1,
		    "pending write when the reader exited: %d, want -ECONNRESET", done.last_status);
	tpt_end_close(&e);
	cu.api->cuMemFree(p);
	hwt_cuda_close(&cu);
	return 0;
}

static int dying_reader(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "dying-reader", .where = NAME,
			     .ready = &ready, .timeout_ms = T_MS };
	struct tp_slot slot = { .device = { TP_DEVICE_CUDA, 0 } };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	static struct tpt_done done;
	struct tpt_done_arg da = { &done, 0 };
	struct tp_descriptor *d;
	struct hwt_cuda cu;
	CUdeviceptr p;
	CUstream s;
	int r;

	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	r = tp_pipe_read_descriptor_sync(e.p, T_MS, &d);
	TPT_REQUIRE(r == 0, 1, "descriptor: %d %s", r, tp_last_error());
	HWT_CU(&cu, cuMemAlloc(&p, BIG), 1);
	TPT_REQUIRE(slow_stream(&cu, &s) == 0, 1, "stream");
	slot.data = hwt_ptr(p);
	slot.cuda_stream = s;
	tpt_done_init(&done);
	r = tp_pipe_read(e.p, d, &a, tpt_done_cb, &da);
	TPT_REQUIRE(r == 0, 1, "read: %d %s", r, tp_last_error());
	tpt_sync_post(&to_parent, 0);
	TPT_REQUIRE(tpt_sync_wait(&to_reader, T_MS) == 0, 1, "never told to exit");
	let_the_daemon_wait();
	TPT_REQUIRE(tpt_done_wait(&done, 1, 0) == -ETIMEDOUT, 1,
		    "the read completed (%d) before the stream's work", done.last_status);
	return 0; /* _exit while the copy waits for this process's stream */
}

START_TEST(test_cuda_faults_reader_exits_mid_transfer)
{
	pid_t rd = tpt_fork(dying_reader, NULL), wr = tpt_fork(surviving_writer, NULL);

	ck_assert_int_gt(rd, 0);
	ck_assert_int_gt(wr, 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	ck_assert_int_eq(tpt_sync_post(&to_reader, 0), 0);
	ck_assert(tpt_wait_ok(rd, T_MS, "reader"));
	ck_assert(tpt_wait_ok(wr, 2 * T_MS, "writer"));
	check_daemon_serves(75);
}
END_TEST

/* ---- a stream that never completes holds no copy thread ------------------------------------ */

#define HELD 3 /* messages held, one more than the daemon's copy threads */

static int release_fd[2]; /* the attacker's host function blocks reading [0] */

static void CUDA_CB blocked_fn(void *arg)
{
	char c;

	while (read(release_fd[0], &c, 1) < 0 && errno == EINTR)
		;
}

/* A pipe from @e's context to its own listener: the writer's end in *@w, the reader's in *@r. */
static int connect_accept(struct tpt_end *e, struct tp_pipe **w, struct tp_pipe **r)
{
	int ret = tp_connect(e->ctx, e->where, w);

	if (ret == 0)
		ret = tp_listener_accept_sync(e->l, T_MS, r);
	if (ret == 0)
		ret = tp_pipe_wait_connected(*w, T_MS);
	return ret;
}

/*
 * A client of its own listener: HELD CUDA messages whose writer's stream has a host function
 * blocked ahead of their events, each read into CUDA memory, so the daemon has HELD copies that
 * wait for work which does not end until the test releases it.
 */
static int holding_client(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "holding-client", .where = "hw-held",
			     .timeout_ms = T_MS };
	struct tp_tensor t = { .device = { TP_DEVICE_CUDA, 0 }, .length = 1u << 20 };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	struct tp_slot slots[HELD];
	struct tp_allocation a[HELD];
	static struct tpt_done wdone, rdone;
	struct tpt_done_arg wda = { &wdone, 0 }, rda = { &rdone, 0 };
	struct tp_pipe *wp[HELD], *rp[HELD];
	struct tp_descriptor *d;
	struct hwt_cuda cu;
	CUdeviceptr src, dst[HELD];
	CUstream s;
	uint8_t *want = malloc(t.length);
	int r;

	TPT_REQUIRE(want, 1, "malloc");
	tpt_fill(want, t.length, 76);
	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	TPT_REQUIRE(tpt_end_listen(&e, false) == 0, 1, "listen");
	TPT_REQUIRE(hwt_dev_alloc_fill(&cu, t.length, 76, &src) == 0, 1, "alloc");
	HWT_CU(&cu, cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), 1);
	HWT_CU(&cu, cuLaunchHostFunc(s, blocked_fn, NULL), 1);
	t.data = hwt_ptr(src);
	t.cuda_stream = s;
	tpt_done_init(&wdone);
	tpt_done_init(&rdone);
	for (int i = 0; i < HELD; i++) {
		r = connect_accept(&e, &wp[i], &rp[i]);
		TPT_REQUIRE(r == 0, 1, "pipe %d: %d %s", i, r, tp_last_error());
		r = tp_pipe_write(wp[i], &m, tpt_done_cb, &wda);
		TPT_REQUIRE(r == 0, 1, "write %d: %d %s", i, r, tp_last_error());
		r = tp_pipe_read_descriptor_sync(rp[i], T_MS, &d);
		TPT_REQUIRE(r == 0, 1, "descriptor %d: %d %s", i, r, tp_last_error());
		HWT_CU(&cu, cuMemAlloc(&dst[i], t.length), 1);
		slots[i] = (struct tp_slot){ .device = { TP_DEVICE_CUDA, 0 }, .data = hwt_ptr(dst[i]) };
		a[i] = (struct tp_allocation){ .tensors = &slots[i], .n_tensors = 1 };
		r = tp_pipe_read(rp[i], d, &a[i], tpt_done_cb, &rda);
		TPT_REQUIRE(r == 0, 1, "read %d: %d %s", i, r, tp_last_error());
	}
	tpt_sync_post(&to_parent, 0); /* every copy is with the daemon, waiting */
	TPT_REQUIRE(tpt_done_wait(&rdone, HELD, 0) == -ETIMEDOUT, 1,
		    "a read completed before the stream's work");
	if (arg && strcmp(arg, "close") == 0) { /* closes every pipe, its stream still blocked */
		for (int i = 0; i < HELD; i++) {
			tp_pipe_close(wp[i]);
			tp_pipe_close(rp[i]);
		}
		tpt_sync_post(&to_parent, 0);
		TPT_REQUIRE(tpt_sync_wait(&to_writer, T_MS) == 0, 1, "never told to end");
		tpt_end_close(&e);
		free(want);
		return 0;
	}
	if (arg) /* killed here by the test, its stream still blocked */
		for (;;)
			pause();
	TPT_REQUIRE(tpt_done_wait(&rdone, HELD, T_MS) == 0, 1, "the held reads never completed");
	TPT_REQUIRE(tpt_done_wait(&wdone, HELD, T_MS) == 0, 1, "the held writes never completed");
	TPT_REQUIRE(rdone.last_status == 0 && wdone.last_status == 0, 1, "status %d %d",
		    rdone.last_status, wdone.last_status);
	for (int i = 0; i < HELD; i++)
		TPT_REQUIRE(hwt_dev_expect(&cu, dst[i], want, t.length, "slot") == 0, 1, "contents");
	tpt_end_close(&e);
	free(want);
	return 0;
}

/*
 * One local user's CUDA stream that does not complete must not stall anyone else's copies: with
 * more of its messages waiting than the daemon has copy threads, another pair of clients still
 * moves CUDA and CPU tensors; once released, the held messages arrive intact.
 */
START_TEST(test_cuda_faults_stuck_stream_holds_no_copy_thread)
{
	pid_t pid;

	ck_assert_int_eq(pipe(release_fd), 0);
	pid = tpt_fork(holding_client, NULL);
	ck_assert_int_gt(pid, 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	check_daemon_serves(77);
	ck_assert_int_eq(write(release_fd[1], "x", 1), 1);
	ck_assert(tpt_wait_ok(pid, T_MS, "holding client"));
	close(release_fd[0]);
	close(release_fd[1]);
}
END_TEST

/* The daemon's status line "pipes: N" (tpipctl status), or -1. */
static long daemon_pipes(void)
{
	char *out = hwt_ctl(D, "status", false), *at = out ? strstr(out, "pipes:") : NULL;
	long n = at ? strtol(at + strlen("pipes:"), NULL, 10) : -1;

	free(out);
	return n;
}

/*
 * A holder killed while its messages wait for its blocked stream: the waits end (the client
 * exited), its pipes fail and are freed, and the daemon goes on serving everyone else.
 */
START_TEST(test_cuda_faults_stuck_stream_holder_killed)
{
	uint64_t deadline = tpt_now_ms() + T_MS;
	pid_t pid;

	ck_assert_int_eq(pipe(release_fd), 0);
	pid = tpt_fork(holding_client, "die");
	ck_assert_int_gt(pid, 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	ck_assert_int_eq(daemon_pipes(), HELD);
	ck_assert_int_eq(kill(pid, SIGKILL), 0);
	ck_assert_int_ge(tpt_wait(pid, T_MS, NULL), 0);
	while (daemon_pipes() != 0 && tpt_now_ms() < deadline)
		nanosleep(&(struct timespec){ 0, 10000000 }, NULL); /* poll interval */
	ck_assert_int_eq(daemon_pipes(), 0);
	check_daemon_serves(79);
	close(release_fd[0]);
	close(release_fd[1]);
}
END_TEST

/*
 * A holder that closes its pipes while its messages wait for its blocked stream, and stays
 * alive: the waits are abandoned, the pipes are freed at once (they no longer count against its
 * session, so they must not linger), and the daemon goes on serving everyone else.
 */
START_TEST(test_cuda_faults_stuck_stream_pipes_closed)
{
	uint64_t deadline = tpt_now_ms() + T_MS;
	pid_t pid;

	ck_assert_int_eq(pipe(release_fd), 0);
	pid = tpt_fork(holding_client, "close");
	ck_assert_int_gt(pid, 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0); /* held */
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0); /* closed */
	while (daemon_pipes() != 0 && tpt_now_ms() < deadline)
		nanosleep(&(struct timespec){ 0, 10000000 }, NULL); /* poll interval */
	ck_assert_msg(daemon_pipes() == 0, "closed pipes linger while their copies wait");
	check_daemon_serves(81);
	ck_assert_int_eq(write(release_fd[1], "x", 1), 1);
	ck_assert_int_eq(tpt_sync_post(&to_writer, 0), 0);
	ck_assert(tpt_wait_ok(pid, T_MS, "holding client"));
	close(release_fd[0]);
	close(release_fd[1]);
}
END_TEST

static Suite *cuda_faults_suite(void)
{
	Suite *s = suite_create("cuda_faults");
	TCase *tc = tcase_create("cuda_faults");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_cuda_faults_exit_after_transfer);
	tcase_add_test(tc, test_cuda_faults_writer_exits_mid_transfer);
	tcase_add_test(tc, test_cuda_faults_reader_exits_mid_transfer);
	tcase_add_test(tc, test_cuda_faults_stuck_stream_holds_no_copy_thread);
	tcase_add_test(tc, test_cuda_faults_stuck_stream_holder_killed);
	tcase_add_test(tc, test_cuda_faults_stuck_stream_pipes_closed);
	tcase_set_timeout(tc, 300);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return hwt_main(cuda_faults_suite(), 1);
}
