/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * hw suite: CUDA tensors between devices. A tensor on device 0 read into device 1 and one on
 * device 1 read into device 0 arrive intact (the daemon copies peer to peer, or through the
 * host where the devices cannot reach each other), the reader's descriptor names the writer's
 * device and the writer's target wish, and a slice inside a larger allocation lands only in its
 * range. One copy thread serves both devices in turn. Needs two CUDA devices: skips (77) with "needs 2 CUDA devices" otherwise.
 */
#include <check.h>
#include <stdio.h>
#include "hwtest.h"

#define MIB (1u << 20)

START_TEST(test_cuda_peer_between_devices_arrives_intact)
{
	struct hwt_side d0 = { .mem = HWT_CUDA, .device = 0, .stream = true };
	struct hwt_side d1 = { .mem = HWT_CUDA, .device = 1, .stream = true };
	struct hwt_side d1_legacy = { .mem = HWT_CUDA, .device = 1 };
	struct hwt_side d1_slice = { .mem = HWT_CUDA, .device = 1, .pad_before = 4096 + 3,
				     .pad_after = MIB };
	struct hwt_case cases[] = {
		{ .len = MIB, .w = d0, .r = d1 },
		{ .len = 64 * MIB, .w = d0, .r = d1, .has_target = true,
		  .target = { TP_DEVICE_CUDA, 1 } },
		{ .len = 64 * MIB, .w = d1, .r = d0, .has_target = true,
		  .target = { TP_DEVICE_CUDA, 0 } },
		{ .len = 4096 + 1, .w = d1_legacy, .r = d0 },
		{ .len = MIB + 1, .w = d0, .r = d1_slice },
	};
	struct hwt_xfer x = { .d = &tpt_fixture_daemon, .name = "hw-peer", .cases = cases,
			      .n_cases = sizeof(cases) / sizeof(cases[0]), .seed = 20 };

	ck_assert(hwt_xfer_run(&x));
	ck_assert_msg(tpt_daemon_alive(&tpt_fixture_daemon), "tpipd died");
}
END_TEST

/*
 * One copy thread (--copy-threads 1) serves device 0 and then device 1, device to device, from
 * and into private CPU memory (its pinned double buffer, several rounds of it) and across the
 * devices: every copy arrives intact. A driver refuses to record an event made in one device's
 * context on another device's stream, so this fails unless the thread keeps its events per
 * device (the fakecuda stand-in refuses it as the driver does).
 */
START_TEST(test_cuda_peer_one_copy_thread_serves_both_devices)
{
	const char *args[] = { "--copy-threads", "1", NULL };
	struct hwt_side d0 = { .mem = HWT_CUDA, .device = 0, .stream = true };
	struct hwt_side d1 = { .mem = HWT_CUDA, .device = 1, .stream = true };
	struct hwt_side cpu = { .mem = HWT_CPU_PRIVATE };
	struct hwt_case cases[] = {
		{ .len = MIB, .w = d0, .r = d0 },
		{ .len = MIB, .w = d1, .r = d1 },
		{ .len = 9 * MIB + 3, .w = cpu, .r = d0 },
		{ .len = 9 * MIB + 3, .w = cpu, .r = d1 },
		{ .len = 9 * MIB + 5, .w = d0, .r = cpu },
		{ .len = 9 * MIB + 5, .w = d1, .r = cpu },
		{ .len = MIB + 1, .w = d1, .r = d0 },
		{ .len = MIB + 1, .w = d0, .r = d1 },
	};
	struct hwt_xfer x = { .d = &tpt_fixture_daemon, .name = "hw-peer-thread", .cases = cases,
			      .n_cases = sizeof(cases) / sizeof(cases[0]), .seed = 21 };

	ck_assert_int_eq(tpt_daemon_stop(&tpt_fixture_daemon), 0);
	ck_assert_int_eq(tpt_daemon_start(&tpt_fixture_daemon, args), 0);
	ck_assert(hwt_xfer_run(&x));
	ck_assert_msg(tpt_daemon_alive(&tpt_fixture_daemon), "tpipd died");
}
END_TEST

static Suite *cuda_peer_suite(void)
{
	Suite *s = suite_create("cuda_peer");
	TCase *tc = tcase_create("cuda_peer");

	tcase_add_checked_fixture(tc, tpt_fixture_start, tpt_fixture_stop);
	tcase_add_test(tc, test_cuda_peer_between_devices_arrives_intact);
	tcase_add_test(tc, test_cuda_peer_one_copy_thread_serves_both_devices);
	tcase_set_timeout(tc, 300);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return hwt_main(cuda_peer_suite(), 2);
}
