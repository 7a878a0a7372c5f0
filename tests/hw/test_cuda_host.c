/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * hw suite: tensors between CPU and CUDA memory (the daemon copies host <-> device). CPU
 * tensors read into CUDA slots, and CUDA tensors read into CPU memory, arrive intact, with the
 * CPU side in a shared buffer (tp_buffer_alloc) and in private malloc memory (reached by CMA),
 * the CUDA side on a stream of its own and on the legacy default stream, for 1 B, 4 KiB,
 * 1 MiB + 7 and 64 MiB. The tensor's target is only a wish: the reader's descriptor shows it
 * (or shows none), and the reader may read where it likes, also against it. Skips (77) without
 * a CUDA driver or device.
 */
#include <check.h>
#include <stdio.h>
#include "hwtest.h"

#define MIB (1u << 20)

static const enum hwt_mem cpu_mems[] = { HWT_CPU_SHM, HWT_CPU_PRIVATE };

/* _i: bit 0 picks the CPU memory, bit 1 the direction (0: cpu -> cuda, 1: cuda -> cpu). */
START_TEST(test_cuda_host_both_directions_arrive_intact)
{
	bool to_cpu = _i & 2;
	struct hwt_side cpu = { .mem = cpu_mems[_i & 1] };
	struct hwt_side gpu = { .mem = HWT_CUDA, .device = 0, .stream = true };
	struct hwt_side gpu_legacy = { .mem = HWT_CUDA, .device = 0 };
	struct tp_device reader_dev = to_cpu ? (struct tp_device){ TP_DEVICE_CPU, 0 } :
					       (struct tp_device){ TP_DEVICE_CUDA, 0 };
	struct tp_device other_dev = to_cpu ? (struct tp_device){ TP_DEVICE_CUDA, 0 } :
					      (struct tp_device){ TP_DEVICE_CPU, 0 };
	struct hwt_case cases[] = {
		/* no target */
		{ .len = 1, .w = to_cpu ? gpu : cpu, .r = to_cpu ? cpu : gpu },
		/* the target the reader follows */
		{ .len = MIB + 7, .w = to_cpu ? gpu_legacy : cpu, .r = to_cpu ? cpu : gpu_legacy,
		  .has_target = true, .target = reader_dev },
		/* a target the reader ignores */
		{ .len = 64 * MIB, .w = to_cpu ? gpu : cpu, .r = to_cpu ? cpu : gpu,
		  .has_target = true, .target = other_dev },
		{ .len = 4096, .w = to_cpu ? gpu_legacy : cpu, .r = to_cpu ? cpu : gpu },
	};
	struct hwt_xfer x = { .d = &tpt_fixture_daemon, .name = "hw-host", .cases = cases,
			      .n_cases = sizeof(cases) / sizeof(cases[0]), .seed = 30 + _i };

	ck_assert(hwt_xfer_run(&x));
	ck_assert_msg(tpt_daemon_alive(&tpt_fixture_daemon), "tpipd died");
}
END_TEST

/* Without cross-memory attach the daemon stages private memory: the CUDA copy still works. */
START_TEST(test_cuda_host_private_memory_without_cma)
{
	const char *args[] = { "--no-cma", NULL };
	struct hwt_side cpu = { .mem = HWT_CPU_PRIVATE };
	struct hwt_side gpu = { .mem = HWT_CUDA, .device = 0, .stream = true };
	struct hwt_case cases[] = {
		{ .len = 4 * MIB + 1, .w = cpu, .r = gpu },
		{ .len = 4 * MIB + 1, .w = gpu, .r = cpu },
	};
	struct hwt_xfer x = { .d = &tpt_fixture_daemon, .name = "hw-host-nocma", .cases = cases,
			      .n_cases = 2, .seed = 40 };

	ck_assert_int_eq(tpt_daemon_stop(&tpt_fixture_daemon), 0);
	ck_assert_int_eq(tpt_daemon_start(&tpt_fixture_daemon, args), 0);
	ck_assert(hwt_xfer_run(&x));
}
END_TEST

static Suite *cuda_host_suite(void)
{
	Suite *s = suite_create("cuda_host");
	TCase *tc = tcase_create("cuda_host");

	tcase_add_checked_fixture(tc, tpt_fixture_start, tpt_fixture_stop);
	tcase_add_loop_test(tc, test_cuda_host_both_directions_arrive_intact, 0, 4);
	tcase_add_test(tc, test_cuda_host_private_memory_without_cma);
	tcase_set_timeout(tc, 300);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return hwt_main(cuda_host_suite(), 1);
}
