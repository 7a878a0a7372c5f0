/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * hw suite: cuda_basic, CUDA tensors between two daemons that treat each other as remote hosts
 * (the peer fixture: --peer-force-cross-host on loopback), staged through the stripe threads'
 * bounce buffers over the data connections (RDMA off). With one data connection per link, one
 * stripe thread on each daemon downloads or uploads every chunk: tensors on device 0 and then
 * on device 1, device to device, from and into private memory and across the devices, all
 * arrive intact. A driver refuses to record an event made in one device's context on another
 * device's stream, so this fails unless each thread keeps its events per device. The daemons
 * close the clients' mappings before they say the transfer ended (no context reset). Needs two
 * CUDA devices (or the stand-in of `--setup fakecuda`); skips (77) with the reason otherwise.
 */
#include <check.h>
#include <stdio.h>
#include "hwtest.h"
#include "ipeer.h"

#define MIB (1u << 20)

START_TEST(test_cuda_basic_one_stripe_thread_serves_both_devices)
{
	const char *const *t = tpt_peer_args();
	const char *args[9] = { t[0], t[1], t[2], t[3], "--peer-data-conns", "1", "--no-rdma" };
	struct hwt_side d0 = { .mem = HWT_CUDA, .device = 0, .stream = true };
	struct hwt_side d1 = { .mem = HWT_CUDA, .device = 1, .stream = true };
	struct hwt_side cpu = { .mem = HWT_CPU_PRIVATE };
	struct hwt_case cases[] = {
		{ .len = MIB, .w = d0, .r = d0 },
		{ .len = MIB, .w = d1, .r = d1 },
		{ .len = 3 * MIB + 3, .w = cpu, .r = d1 },
		{ .len = 3 * MIB + 5, .w = d0, .r = cpu },
		{ .len = 3 * MIB + 5, .w = d1, .r = cpu },
		{ .len = MIB + 1, .w = d1, .r = d0 },
	};
	char addr[128];
	struct hwt_xfer x = { .d = &tpt_peer_b, .name = "basic-devs", .cases = cases,
			      .n_cases = sizeof(cases) / sizeof(cases[0]), .seed = 80,
			      .writer_d = &tpt_peer_a };

	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_a), 0);
	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_b), 0);
	ck_assert_int_eq(tpt_daemon_pair_start(&tpt_peer_a, args, &tpt_peer_b, args), 0);
	x.address = tpt_peer_address(&tpt_peer_b, "basic-devs", addr, sizeof(addr));
	ck_assert(hwt_xfer_run(&x));
	ck_assert_msg(tpt_daemon_alive(&tpt_peer_a) && tpt_daemon_alive(&tpt_peer_b),
		      "a tpipd died");
	/* Each client frees its memory as soon as its WriteDone or ReadDone arrives: a daemon
	 * still mapping it then closes a stale mapping, which the strict stand-in answers with
	 * a sticky error and the daemon with a context reset. Neither may have met one. */
	for (int i = 0; i < 2; i++) {
		const struct tpt_daemon *d = i ? &tpt_peer_b : &tpt_peer_a;
		int n = tpt_daemon_log_count(d, "primary context reset after a sticky error");

		ck_assert_msg(n == 0, "%s: %d context resets: a mapping outlived its transfer",
			      d->socket, n);
	}
}
END_TEST

static Suite *cuda_basic_suite(void)
{
	Suite *s = suite_create("cuda_basic");
	TCase *tc = tcase_create("cuda_basic");

	tcase_add_checked_fixture(tc, tpt_peer_fixture_start, tpt_peer_fixture_stop);
	tcase_add_test(tc, test_cuda_basic_one_stripe_thread_serves_both_devices);
	tcase_set_timeout(tc, 300);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return hwt_main(cuda_basic_suite(), 2);
}
