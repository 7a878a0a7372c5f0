/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * hw suite: the lifetime of the daemon's mappings of client CUDA memory and what a sticky
 * device error does. By default a mapping lives for the transfer only: when the writer learns
 * that its write is done, the daemon holds no mapping of its memory, so the client may free it
 * at once (without tp_cuda_release()) and exit, and the daemon never touches or closes a
 * mapping of freed memory (on the strict stand-in that would poison the device). A sticky
 * error on device 0 (forced in the stand-in with $FAKECUDA_FAULT_DIR) fails that transfer with
 * a message naming the device and the cause; device 1 keeps serving, and device 0 serves again
 * once its context was reset. A slow driver call (an IPC close taking seconds, made slow in the
 * stand-in with $FAKECUDA_DELAY) does not hold up other sessions: while it is still pending,
 * another pair of clients moves messages and tpipctl answers, whether the close comes at the
 * end of the transfer (default) or of the clients' sessions (cuda-cache-mappings). The forced fault and the delay
 * need the stand-in (two devices); those tests skip on a real GPU. A shared buffer that copies move
 * to or from a GPU is page-locked while it lives, and unpinned when it is freed. Skips (77) without a CUDA
 * driver or device.
 */
#include <check.h>
#include <errno.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "hwtest.h"
#include "ipeer.h"

#define LEN (4u << 20)
#define T_MS TPT_SCALED_MS(30000)
#define NAME "hw-life"

static const struct tpt_daemon *D = &tpt_fixture_daemon;
static struct tpt_sync ready, to_writer, to_reader, to_parent;
static char fault_dir[] = "/tmp/tpipd-life-XXXXXX";

static void setup(void)
{
	ck_assert_ptr_nonnull(mkdtemp(fault_dir));
	setenv("FAKECUDA_FAULT_DIR", fault_dir, 1); /* the daemon inherits it */
	tpt_fixture_start();
	ck_assert_int_eq(tpt_sync_init(&ready), 0);
	ck_assert_int_eq(tpt_sync_init(&to_writer), 0);
	ck_assert_int_eq(tpt_sync_init(&to_reader), 0);
	ck_assert_int_eq(tpt_sync_init(&to_parent), 0);
}

static void teardown(void)
{
	char path[128];

	tpt_sync_done(&ready);
	tpt_sync_done(&to_writer);
	tpt_sync_done(&to_reader);
	tpt_sync_done(&to_parent);
	tpt_fixture_stop();
	for (int d = 0; d < 2; d++) {
		snprintf(path, sizeof(path), "%s/sticky-%d", fault_dir, d);
		unlink(path);
	}
	rmdir(fault_dir);
}

static uint64_t status_u64(const char *key)
{
	uint64_t v = UINT64_MAX;

	tpt_status_u64s(D, &key, 1, &v);
	return v;
}

/* A pair of clients moves one CUDA tensor on @dev and proves it arrived intact. */
static bool moves_on(int dev, const char *name, unsigned seed)
{
	struct hwt_side gpu = { .mem = HWT_CUDA, .device = dev, .stream = true };
	struct hwt_case c = { .len = LEN, .w = gpu, .r = gpu };
	struct hwt_xfer x = { .d = D, .name = name, .cases = &c, .n_cases = 1, .seed = seed };

	return hwt_xfer_run(&x);
}

/* ---- mapped for the transfer only ------------------------------------------------------- */

static int freeing_writer(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "freeing-writer", .where = NAME,
			     .ready = &ready, .timeout_ms = T_MS };
	struct tp_tensor t = { .device = { TP_DEVICE_CUDA, 0 }, .length = LEN };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	struct hwt_cuda cu;
	CUdeviceptr p;
	int r;

	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	TPT_REQUIRE(hwt_dev_alloc_fill(&cu, LEN, 81, &p) == 0, 1, "alloc");
	t.data = hwt_ptr(p);
	r = tp_pipe_write_sync(e.p, &m);
	TPT_REQUIRE(r == 0, 1, "write: %d %s", r, tp_last_error());
	HWT_CU(&cu, cuMemFree(p), 1); /* at once, without tp_cuda_release() */
	tpt_sync_post(&to_parent, 0);
	TPT_REQUIRE(tpt_sync_wait(&to_writer, T_MS) == 0, 1, "the parent did not check");
	return 0; /* _exit: nothing closed or released */
}

static int freeing_reader(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "freeing-reader", .where = NAME,
			     .ready = &ready, .timeout_ms = T_MS };
	struct tp_slot slot = { .device = { TP_DEVICE_CUDA, 0 } };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	struct tp_descriptor *d;
	struct hwt_cuda cu;
	CUdeviceptr p;
	int r;

	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	r = tp_pipe_read_descriptor_sync(e.p, T_MS, &d);
	TPT_REQUIRE(r == 0, 1, "descriptor: %d %s", r, tp_last_error());
	HWT_CU(&cu, cuMemAlloc(&p, LEN), 1);
	slot.data = hwt_ptr(p);
	r = tp_pipe_read_sync(e.p, d, &a);
	TPT_REQUIRE(r == 0, 1, "read: %d %s", r, tp_last_error());
	HWT_CU(&cu, cuMemFree(p), 1);
	tpt_sync_post(&to_parent, 0);
	TPT_REQUIRE(tpt_sync_wait(&to_reader, T_MS) == 0, 1, "the parent did not check");
	return 0;
}

START_TEST(test_cuda_life_memory_freed_after_the_transfer_is_not_mapped)
{
	pid_t rd = tpt_fork(freeing_reader, NULL), wr = tpt_fork(freeing_writer, NULL);

	ck_assert_int_gt(rd, 0);
	ck_assert_int_gt(wr, 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	/* Both completed and freed: the daemon keeps nothing of their memory, open or not. */
	ck_assert_uint_eq(status_u64("cuda_mappings_open"), 0);
	ck_assert_uint_eq(status_u64("cuda_mappings"), 0);
	ck_assert_int_eq(tpt_sync_post(&to_writer, 0), 0);
	ck_assert_int_eq(tpt_sync_post(&to_reader, 0), 0);
	ck_assert(tpt_wait_ok(wr, T_MS, "writer"));
	ck_assert(tpt_wait_ok(rd, T_MS, "reader"));
	/* Their sessions ended with the memory gone: device 0 is still sound. */
	ck_assert_msg(moves_on(0, "hw-life-after", 82), "device 0 no longer serves");
	ck_assert_uint_eq(status_u64("cuda_mappings_open"), 0);
}
END_TEST

/* ---- shared buffers page-locked for GPU copies ------------------------------------------ */

/* One end of a transfer between a shared buffer and CUDA memory: @from_cuda picks the
 * direction, @cpu the end (the shared buffer's or the CUDA memory's). */
struct pin_role {
	bool from_cuda, cpu;
};

/* The end's memory: a shared buffer (filled when it is the source), or CUDA memory. */
static int pinned_mem(const struct pin_role *role, struct tpt_end *e, struct hwt_cuda *cu,
		      bool writer, const uint8_t *want, void **ret)
{
	CUdeviceptr p;
	int r;

	if (role->cpu) {
		r = tp_buffer_alloc(e->ctx, LEN, ret);
		TPT_REQUIRE(r == 0, -1, "tp_buffer_alloc: %d %s", r, tp_last_error());
		if (writer)
			memcpy(*ret, want, LEN);
		return 0;
	}
	TPT_REQUIRE(hwt_cuda_open(0, cu) == 0, -1, "CUDA");
	if (writer)
		TPT_REQUIRE(hwt_dev_alloc_fill(cu, LEN, 86, &p) == 0, -1, "alloc");
	else
		HWT_CU(cu, cuMemAlloc(&p, LEN), -1);
	*ret = hwt_ptr(p);
	return 0;
}

static int pinned_end(void *arg)
{
	const struct pin_role *role = arg;
	bool writer = role->cpu != role->from_cuda;
	struct tpt_end e = { .d = D, .ctx_name = role->cpu ? "pinned-cpu" : "pinned-cuda",
			     .where = NAME, .ready = &ready, .timeout_ms = T_MS };
	struct tp_device dev = { role->cpu ? TP_DEVICE_CPU : TP_DEVICE_CUDA, 0 };
	struct tp_tensor t = { .device = dev, .length = LEN };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	struct tp_slot slot = { .device = dev };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	uint8_t *want = malloc(LEN);
	struct tp_descriptor *d;
	struct hwt_cuda cu;
	void *mem;
	int r;

	TPT_REQUIRE(want, 1, "malloc");
	tpt_fill(want, LEN, 86);
	TPT_REQUIRE((writer ? tpt_end_connect(&e) : tpt_end_listen(&e, true)) == 0, 1, "end");
	TPT_REQUIRE(pinned_mem(role, &e, &cu, writer, want, &mem) == 0, 1, "memory");
	if (writer) {
		t.data = mem;
		r = tp_pipe_write_sync(e.p, &m);
		TPT_REQUIRE(r == 0, 1, "write: %d %s", r, tp_last_error());
	} else {
		r = tp_pipe_read_descriptor_sync(e.p, T_MS, &d);
		TPT_REQUIRE(r == 0, 1, "descriptor: %d %s", r, tp_last_error());
		slot.data = mem;
		r = tp_pipe_read_sync(e.p, d, &a);
		TPT_REQUIRE(r == 0, 1, "read: %d %s", r, tp_last_error());
		TPT_REQUIRE(role->cpu ? memcmp(mem, want, LEN) == 0 :
					hwt_dev_expect(&cu, (CUdeviceptr)(uintptr_t)mem, want, LEN,
						       "slot") == 0,
			    1, "contents");
	}
	if (role->cpu) { /* the parent looks at the daemon, then lets the buffer go */
		tpt_sync_post(&to_parent, 0);
		TPT_REQUIRE(tpt_sync_wait(&to_writer, T_MS) == 0, 1, "never told to free");
		TPT_REQUIRE(tp_buffer_free(e.ctx, mem) == 0, 1, "tp_buffer_free");
		tpt_sync_post(&to_parent, 0);
	}
	TPT_REQUIRE(tpt_sync_wait(role->cpu ? &to_writer : &to_reader, T_MS) == 0, 1,
		    "never told to end");
	tpt_end_close(&e);
	if (!role->cpu) {
		cu.api->cuMemFree((CUdeviceptr)(uintptr_t)mem);
		hwt_cuda_close(&cu);
	}
	free(want);
	return 0;
}

/* Polls the daemon until it pins @n buffers (it unpins on another thread). */
static bool pinned_becomes(uint64_t n)
{
	for (int i = 0; i < T_MS / 10; i++) {
		struct timespec ts = { 0, 10 * 1000000L };

		if (status_u64("cuda_pinned_buffers") == n)
			return true;
		nanosleep(&ts, NULL);
	}
	return false;
}

/*
 * A shared buffer that a copy moves to or from CUDA memory is page-locked once, so the GPU
 * reaches it by DMA, and stays so while the buffer lives; freeing the buffer unpins it (on the
 * stand-in, pinning it again, or a new buffer at the same address, would be refused otherwise).
 */
START_TEST(test_cuda_life_shared_buffers_are_pinned_while_they_live)
{
	struct pin_role cpu_role = { .from_cuda = _i, .cpu = true };
	struct pin_role gpu_role = { .from_cuda = _i, .cpu = false };
	pid_t cpu = tpt_fork(pinned_end, &cpu_role), gpu = tpt_fork(pinned_end, &gpu_role);

	ck_assert_int_gt(cpu, 0);
	ck_assert_int_gt(gpu, 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0); /* the transfer is done */
	ck_assert_uint_eq(status_u64("cuda_pinned_buffers"), 1);
	ck_assert_uint_eq(status_u64("cuda_pinned_bytes"), LEN);
	ck_assert_int_eq(tpt_sync_post(&to_writer, 0), 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0); /* the buffer is freed */
	ck_assert_msg(pinned_becomes(0), "a freed buffer stays pinned");
	ck_assert_uint_eq(status_u64("cuda_pinned_bytes"), 0);
	ck_assert_int_eq(tpt_sync_post(&to_writer, 0), 0);
	ck_assert_int_eq(tpt_sync_post(&to_reader, 0), 0);
	ck_assert(tpt_wait_ok(cpu, T_MS, "cpu end"));
	ck_assert(tpt_wait_ok(gpu, T_MS, "cuda end"));
	/* Again, on buffers the daemon may map where the freed one was. */
	ck_assert_msg(moves_on(0, "hw-life-pin-after", 87), "device 0 no longer serves");
}
END_TEST

/* ---- a sticky error on one device ------------------------------------------------------- */

struct failed {
	int status;
	char msg[512];
};

static int failing_writer(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "sticky-writer", .where = NAME, .ready = &ready,
			     .timeout_ms = T_MS };
	struct tp_tensor t = { .device = { TP_DEVICE_CUDA, 0 }, .length = LEN };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	struct hwt_cuda cu;
	CUdeviceptr p;
	int r;

	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	TPT_REQUIRE(hwt_dev_alloc_fill(&cu, LEN, 83, &p) == 0, 1, "alloc");
	t.data = hwt_ptr(p);
	r = tp_pipe_write_sync(e.p, &m);
	TPT_REQUIRE(r == -EIO, 1, "write on a device with a sticky error: %d %s, want -EIO", r,
		    tp_last_error());
	TPT_REQUIRE(strstr(tp_last_error(), "CUDA device 0") &&
			    strstr(tp_last_error(), "CUDA_ERROR_ILLEGAL_ADDRESS"),
		    1, "the error names neither the device nor the cause: %s", tp_last_error());
	tpt_end_close(&e);
	cu.api->cuMemFree(p);
	hwt_cuda_close(&cu);
	return 0;
}

static int failing_reader(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "sticky-reader", .where = NAME, .ready = &ready,
			     .timeout_ms = T_MS };
	struct tp_slot slot = { .device = { TP_DEVICE_CUDA, 0 } };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	struct tp_descriptor *d;
	struct hwt_cuda cu;
	CUdeviceptr p;
	int r;

	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	r = tp_pipe_read_descriptor_sync(e.p, T_MS, &d);
	TPT_REQUIRE(r == 0, 1, "descriptor: %d %s", r, tp_last_error());
	HWT_CU(&cu, cuMemAlloc(&p, LEN), 1);
	slot.data = hwt_ptr(p);
	r = tp_pipe_read_sync(e.p, d, &a);
	TPT_REQUIRE(r == -EIO && strstr(tp_last_error(), "CUDA device 0"), 1,
		    "read on a device with a sticky error: %d %s, want -EIO naming device 0", r,
		    tp_last_error());
	tpt_end_close(&e);
	cu.api->cuMemFree(p);
	hwt_cuda_close(&cu);
	return 0;
}

START_TEST(test_cuda_life_sticky_error_fails_its_device_which_recovers)
{
	char path[128];
	FILE *f;

	if (!getenv("TPIPD_CUDA_LIBRARY") || !strstr(getenv("TPIPD_CUDA_LIBRARY"), "fakecuda")) {
		printf("SKIP: forcing a sticky error needs the fakecuda stand-in\n");
		return;
	}
	snprintf(path, sizeof(path), "%s/sticky-0", fault_dir);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fclose(f);
	ck_assert(tpt_run_pair(failing_reader, failing_writer, NULL, 2 * T_MS));
	ck_assert_msg(access(path, F_OK) < 0, "the fault was not consumed by the daemon's copy");
	/* Device 1 never noticed; device 0 is reset on its next use and serves again. */
	ck_assert_msg(moves_on(1, "hw-life-dev1", 84), "device 1 stopped serving");
	ck_assert_msg(moves_on(0, "hw-life-dev0", 85), "device 0 did not recover");
	ck_assert_msg(moves_on(0, "hw-life-dev0b", 86), "device 0 did not stay recovered");
	ck_assert_msg(tpt_daemon_alive(D), "tpipd died");
}
END_TEST

/* ---- a slow driver call blocks no other session ------------------------------------------ */

#define SLOW_MS TPT_SCALED_MS(3000)

static void setup_slow(void)
{
	char delay[64];

	snprintf(delay, sizeof(delay), "cuIpcCloseMemHandle:%d", SLOW_MS);
	setenv("FAKECUDA_DELAY", delay, 1); /* for the daemon */
	setup();
	unsetenv("FAKECUDA_DELAY"); /* the clients never close IPC handles anyway */
}

/* The same with mappings cached: the close comes when the clients' sessions end. */
static void setup_slow_cached(void)
{
	const char *args[] = { "--cuda-cache-mappings", "yes", NULL };
	char delay[64];

	ck_assert_ptr_nonnull(mkdtemp(fault_dir));
	setenv("FAKECUDA_FAULT_DIR", fault_dir, 1);
	snprintf(delay, sizeof(delay), "cuIpcCloseMemHandle:%d", SLOW_MS);
	setenv("FAKECUDA_DELAY", delay, 1);
	ck_assert_int_eq(tpt_daemon_start(&tpt_fixture_daemon, args), 0);
	unsetenv("FAKECUDA_DELAY");
	ck_assert_int_eq(tpt_sync_init(&ready), 0);
	ck_assert_int_eq(tpt_sync_init(&to_writer), 0);
	ck_assert_int_eq(tpt_sync_init(&to_reader), 0);
	ck_assert_int_eq(tpt_sync_init(&to_parent), 0);
}

static void teardown_slow(void)
{
	char path[128];

	teardown();
	snprintf(path, sizeof(path), "%s/pending-cuIpcCloseMemHandle", fault_dir);
	unlink(path);
}

static bool pending(void)
{
	char path[128];

	snprintf(path, sizeof(path), "%s/pending-cuIpcCloseMemHandle", fault_dir);
	return access(path, F_OK) == 0;
}

static int gpu_pair(void *arg)
{
	return moves_on(0, "hw-life-slow", 87) ? 0 : 1;
}

static void cpu_spec(unsigned index, struct tpt_msg_spec *ret)
{
	*ret = (struct tpt_msg_spec){ .index = index, .n_payloads = 1, .lens = { 100 },
				      .meta_len = 16 };
}

START_TEST(test_cuda_life_slow_ipc_close_blocks_no_other_session)
{
	struct tpt_xfer x = { .d = D, .name = "hw-life-cpu", .n_msgs = 8, .spec = cpu_spec,
			      .writer_mem = TPT_MEM_PRIVATE, .reader_mem = TPT_MEM_PRIVATE };
	struct timespec step = { 0, 5 * 1000000L };
	pid_t gpu;
	char *out;
	int i;

	if (!getenv("TPIPD_CUDA_LIBRARY") || !strstr(getenv("TPIPD_CUDA_LIBRARY"), "fakecuda")) {
		printf("SKIP: a slow driver call needs the fakecuda stand-in\n");
		return;
	}
	gpu = tpt_fork(gpu_pair, NULL);
	ck_assert_int_gt(gpu, 0);
	/* the daemon reaches the slow close on its own time: a condition with a deadline */
	for (i = 0; i < T_MS / 5 && !pending(); i++)
		nanosleep(&step, NULL);
	ck_assert_msg(pending(), "the daemon never closed the IPC mapping");
	ck_assert_msg(tpt_xfer_run(&x), "another session's messages did not move");
	out = hwt_ctl(D, "status", false);
	ck_assert_msg(out, "tpipctl status did not answer");
	free(out);
	ck_assert_msg(pending(), "the slow close ended before the other session was served: "
				 "it held the other session up (or SLOW_MS is too short here)");
	ck_assert(tpt_wait_ok(gpu, 2 * T_MS, "GPU pair"));
}
END_TEST

static Suite *cuda_life_suite(void)
{
	Suite *s = suite_create("cuda_life");
	TCase *tc = tcase_create("cuda_life");
	TCase *slow = tcase_create("cuda_life_slow");
	TCase *cached = tcase_create("cuda_life_slow_cached");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_cuda_life_memory_freed_after_the_transfer_is_not_mapped);
	tcase_add_loop_test(tc, test_cuda_life_shared_buffers_are_pinned_while_they_live, 0, 2);
	tcase_add_test(tc, test_cuda_life_sticky_error_fails_its_device_which_recovers);
	tcase_set_timeout(tc, 200);
	suite_add_tcase(s, tc);
	tcase_add_checked_fixture(slow, setup_slow, teardown_slow);
	tcase_add_test(slow, test_cuda_life_slow_ipc_close_blocks_no_other_session);
	tcase_set_timeout(slow, 200);
	suite_add_tcase(s, slow);
	tcase_add_checked_fixture(cached, setup_slow_cached, teardown_slow);
	tcase_add_test(cached, test_cuda_life_slow_ipc_close_blocks_no_other_session);
	tcase_set_timeout(cached, 200);
	suite_add_tcase(s, cached);
	return s;
}

int main(void)
{
	return hwt_main(cuda_life_suite(), 1);
}
