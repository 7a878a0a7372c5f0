/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * hw suite: CUDA tensors between two client processes on device 0 through a real tpipd (the
 * cuda_ipc channel). Sizes 1 B, 4 KiB, 1 MiB and 64 MiB arrive intact, from memory filled on a
 * stream of the writer's own and on the legacy default stream, into slots likewise; a tensor in
 * the middle of a larger allocation (offset 1 MiB + 123 in 3 MiB) lands in the middle of the
 * reader's larger allocation, and only there; device memory released with tp_cuda_release()
 * and freed can be reallocated (often at the same address) and sent again, on both ends, with
 * the new contents; with --cuda-mappings-max 2, messages in ten fresh allocations still arrive
 * intact while older mappings are evicted. Skips (77) without a CUDA driver or device.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hwtest.h"

#define MIB (1u << 20)
#define CUDA0(s) { .mem = HWT_CUDA, .device = 0, .stream = (s) }

static const struct tpt_daemon *D = &tpt_fixture_daemon;

START_TEST(test_cuda_xfer_sizes_arrive_intact)
{
	static const size_t sizes[] = { 1, 4096, MIB, 64 * MIB };
	struct hwt_case cases[8];
	struct hwt_xfer x = { .d = D, .name = "hw-sizes", .cases = cases, .seed = 1 };

	/* Each size twice: own streams on both ends, then the legacy stream on both. */
	for (size_t i = 0; i < 8; i++)
		cases[i] = (struct hwt_case){ .len = sizes[i % 4], .w = CUDA0(i < 4),
					      .r = CUDA0(i < 4) };
	x.n_cases = 8;
	ck_assert(hwt_xfer_run(&x));
	ck_assert_msg(tpt_daemon_alive(D), "tpipd died");
}
END_TEST

/* With --cuda-mappings-max 2 each session keeps at most two allocations (and events) mapped:
 * ten messages in fresh allocations evict older mappings on the way and still arrive intact. */
START_TEST(test_cuda_xfer_mapping_bound_evicts_and_stays_correct)
{
	const char *args[] = { "--cuda-mappings-max", "2", NULL };
	struct hwt_case cases[10];
	struct hwt_xfer x = { .d = D, .name = "hw-evict", .cases = cases, .n_cases = 10,
			      .seed = 9 };

	for (size_t i = 0; i < 10; i++)
		cases[i] = (struct hwt_case){ .len = MIB + i, .w = CUDA0(i % 2),
					      .r = CUDA0(i % 3 == 0) };
	ck_assert_int_eq(tpt_daemon_stop(&tpt_fixture_daemon), 0);
	ck_assert_int_eq(tpt_daemon_start(&tpt_fixture_daemon, args), 0);
	ck_assert(hwt_xfer_run(&x));
	ck_assert_msg(tpt_daemon_alive(D), "tpipd died");
}
END_TEST

START_TEST(test_cuda_xfer_mixed_streams)
{
	/* The writer's stream and the reader's legacy stream, and the other way round. */
	struct hwt_case cases[] = {
		{ .len = 4 * MIB + 5, .w = CUDA0(true), .r = CUDA0(false) },
		{ .len = 4 * MIB + 5, .w = CUDA0(false), .r = CUDA0(true) },
	};
	struct hwt_xfer x = { .d = D, .name = "hw-streams", .cases = cases, .n_cases = 2,
			      .seed = 2 };

	ck_assert(hwt_xfer_run(&x));
}
END_TEST

/*
 * The writer's 3 MiB allocation holds pattern A with pattern B in [1 MiB + 123, 2 MiB + 123);
 * the reader's slot starts 1 MiB + 457 into its own 3 MiB + 556 allocation pre-filled with C:
 * afterwards exactly the slot's range holds B and everything around it still C. Also from such
 * a slice into CPU memory and from CPU memory into such a slice.
 */
START_TEST(test_cuda_xfer_slice_lands_only_in_its_range)
{
	struct hwt_side w = { .mem = HWT_CUDA, .stream = true, .pad_before = MIB + 123,
			      .pad_after = MIB - 123 };
	struct hwt_side r = { .mem = HWT_CUDA, .stream = true, .pad_before = MIB + 457,
			      .pad_after = MIB + 99 };
	struct hwt_side cpu_w = { .mem = HWT_CPU_SHM, .pad_before = 4096 + 17, .pad_after = 31 };
	struct hwt_side cpu_r = { .mem = HWT_CPU_PRIVATE, .pad_before = 77, .pad_after = 4099 };
	struct hwt_case cases[] = {
		{ .len = MIB, .w = w, .r = r },
		{ .len = MIB, .w = w, .r = cpu_r },
		{ .len = MIB, .w = cpu_w, .r = r },
	};
	struct hwt_xfer x = { .d = D, .name = "hw-slice", .cases = cases, .n_cases = 3,
			      .seed = 3 };

	ck_assert(hwt_xfer_run(&x));
}
END_TEST

/*
 * The client names its device by UUID as well as PCI bus id (MIG instances of one GPU share
 * the bus id). A daemon that does not see that device (here: started with another
 * FAKECUDA_UUID_SALT, so the stand-in shows it other devices behind the same bus ids, as MIG
 * does) refuses the tensor with a reason naming the device, instead of mapping it on whatever
 * device holds the bus id; a daemon that sees it moves the tensor. Stand-in only.
 */
START_TEST(test_cuda_xfer_device_the_daemon_cannot_see_is_refused)
{
	struct hwt_case cases[] = { { .len = MIB, .w = CUDA0(true), .r = CUDA0(true) } };
	struct hwt_xfer x = { .d = D, .name = "hw-uuid", .cases = cases, .n_cases = 1,
			      .seed = 12 };
	char line[512];

	ck_assert_int_eq(tpt_daemon_stop(&tpt_fixture_daemon), 0);
	ck_assert_int_eq(setenv("FAKECUDA_UUID_SALT", "7", 1), 0);
	ck_assert_int_eq(tpt_daemon_start(&tpt_fixture_daemon, NULL), 0);
	ck_assert_int_eq(unsetenv("FAKECUDA_UUID_SALT"), 0);
	ck_assert(!hwt_xfer_run(&x));
	ck_assert_int_eq(tpt_daemon_wait_log(D, "not visible to tpipd", 5000, line,
					     sizeof(line)), 0);
	ck_assert_msg(strstr(line, "GPU-464b4750-55") && strstr(line, "MIG instance"), "%s", line);
	ck_assert_msg(tpt_daemon_alive(D), "tpipd died");
	ck_assert_int_eq(tpt_daemon_stop(&tpt_fixture_daemon), 0);
	ck_assert_int_eq(tpt_daemon_start(&tpt_fixture_daemon, NULL), 0);
	ck_assert(hwt_xfer_run(&x));
}
END_TEST

/* ---- tp_cuda_release ------------------------------------------------------------------------ */

#define REL_LEN (8 * MIB)
#define REL_ROUNDS 3

static struct tpt_sync rel_ready, rel_read;

/* Allocates @len bytes on @cu and fills them with the pattern of @seed. */
/* Release semantics that need no transfer: CPU memory is refused, unmapped memory is fine. */
static int rel_check_args(struct tp_context *ctx, const struct hwt_cuda *cu)
{
	CUdeviceptr fresh;
	void *cpu = malloc(4096);
	int r;

	TPT_REQUIRE(cpu, 1, "malloc");
	r = tp_cuda_release(ctx, cpu);
	free(cpu);
	TPT_REQUIRE(r == -EINVAL, 1, "tp_cuda_release(CPU memory): %d, want -EINVAL", r);
	HWT_CU(cu, cuMemAlloc(&fresh, 4096), 1);
	r = tp_cuda_release(ctx, hwt_ptr(fresh));
	cu->api->cuMemFree(fresh);
	TPT_REQUIRE(r == 0, 1, "tp_cuda_release(never sent): %d %s", r, tp_last_error());
	return 0;
}

static int rel_writer(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "rel-writer", .where = "hw-release",
			     .ready = &rel_ready, .timeout_ms = HWT_T_MS };
	struct tp_tensor t = { .device = { TP_DEVICE_CUDA, 0 }, .length = REL_LEN };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	struct hwt_cuda cu;
	CUdeviceptr p;
	int r;

	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	TPT_REQUIRE(rel_check_args(e.ctx, &cu) == 0, 1, "release arguments");
	for (unsigned i = 0; i < REL_ROUNDS; i++) {
		TPT_REQUIRE(hwt_dev_alloc_fill(&cu, REL_LEN, tpt_seed(60, i, 0), &p) == 0, 1, "round %u", i);
		tpt_log("writer: round %u at device address 0x%llx", i, (unsigned long long)p);
		t.data = hwt_ptr(p);
		r = tp_pipe_write_sync(e.p, &m);
		TPT_REQUIRE(r == 0, 1, "round %u: write: %d %s", i, r, tp_last_error());
		/* Any pointer inside the allocation names it. */
		r = tp_cuda_release(e.ctx, hwt_ptr(p + REL_LEN / 2));
		TPT_REQUIRE(r == 0, 1, "round %u: tp_cuda_release: %d %s", i, r, tp_last_error());
		HWT_CU(&cu, cuMemFree(p), 1);
	}
	TPT_REQUIRE(tpt_sync_wait(&rel_read, HWT_T_MS) == 0, 1, "the reader did not finish");
	tpt_end_close(&e);
	hwt_cuda_close(&cu);
	return 0;
}

static int rel_read_round(struct tpt_end *e, const struct hwt_cuda *cu, unsigned i)
{
	struct tp_slot slot = { .device = { TP_DEVICE_CUDA, 0 } };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	struct tp_descriptor *d;
	uint8_t *want = malloc(REL_LEN);
	CUdeviceptr p;
	int r;

	TPT_REQUIRE(want, 1, "malloc");
	tpt_fill(want, REL_LEN, tpt_seed(60, i, 0));
	r = tp_pipe_read_descriptor_sync(e->p, HWT_T_MS, &d);
	TPT_REQUIRE(r == 0, 1, "round %u: descriptor: %d %s", i, r, tp_last_error());
	TPT_REQUIRE(hwt_dev_alloc_fill(cu, REL_LEN, tpt_seed(61, i, 0), &p) == 0, 1, "round %u", i);
	tpt_log("reader: round %u at device address 0x%llx", i, (unsigned long long)p);
	slot.data = hwt_ptr(p);
	r = tp_pipe_read_sync(e->p, d, &a);
	TPT_REQUIRE(r == 0, 1, "round %u: read: %d %s", i, r, tp_last_error());
	r = hwt_dev_expect(cu, p, want, REL_LEN, "released and reallocated slot");
	free(want);
	TPT_REQUIRE(r == 0, 1, "round %u: contents", i);
	r = tp_cuda_release(e->ctx, hwt_ptr(p));
	TPT_REQUIRE(r == 0, 1, "round %u: tp_cuda_release: %d %s", i, r, tp_last_error());
	HWT_CU(cu, cuMemFree(p), 1);
	return 0;
}

static int rel_reader(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "rel-reader", .where = "hw-release",
			     .ready = &rel_ready, .timeout_ms = HWT_T_MS };
	struct hwt_cuda cu;
	int r = 0;

	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	for (unsigned i = 0; r == 0 && i < REL_ROUNDS; i++)
		r = rel_read_round(&e, &cu, i);
	tpt_sync_post(&rel_read, (int8_t)r);
	tpt_end_close(&e);
	hwt_cuda_close(&cu);
	return r;
}

START_TEST(test_cuda_xfer_released_memory_can_be_freed_and_reused)
{
	ck_assert_int_eq(tpt_sync_init(&rel_ready), 0);
	ck_assert_int_eq(tpt_sync_init(&rel_read), 0);
	ck_assert(tpt_run_pair(rel_reader, rel_writer, NULL, 2 * HWT_T_MS));
	ck_assert_msg(tpt_daemon_alive(D), "tpipd died");
	tpt_sync_done(&rel_ready);
	tpt_sync_done(&rel_read);
}
END_TEST

static Suite *cuda_xfer_suite(bool stand_in)
{
	Suite *s = suite_create("cuda_xfer");
	TCase *tc = tcase_create("cuda_xfer");

	tcase_add_checked_fixture(tc, tpt_fixture_start, tpt_fixture_stop);
	tcase_add_test(tc, test_cuda_xfer_sizes_arrive_intact);
	tcase_add_test(tc, test_cuda_xfer_mixed_streams);
	tcase_add_test(tc, test_cuda_xfer_mapping_bound_evicts_and_stays_correct);
	tcase_add_test(tc, test_cuda_xfer_slice_lands_only_in_its_range);
	tcase_add_test(tc, test_cuda_xfer_released_memory_can_be_freed_and_reused);
	if (stand_in) /* the stand-in shows another device to a process with another salt */
		tcase_add_test(tc, test_cuda_xfer_device_the_daemon_cannot_see_is_refused);
	tcase_set_timeout(tc, 300);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	const char *lib = getenv("TPIPD_CUDA_LIBRARY");

	return hwt_main(cuda_xfer_suite(lib && strstr(lib, "fakecuda")), 1);
}
