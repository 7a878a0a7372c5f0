/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * hw suite: the driver's rules that tpipd and libtpclient must follow, checked against the
 * driver itself (a real GPU, or the fakecuda stand-in, which must be as strict): an event is
 * recorded only on a stream of its own context (a stream may wait for an event of another);
 * streams and events are made in the current context and need one; an IPC event handle exists
 * only for an event made with CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING, and
 * CU_EVENT_INTERPROCESS alone is refused; a memory handle opened twice in one process gives the
 * same pointer, and the mapping stays usable until the last close. The cross-context cases need
 * two devices and skip the rest of the test with one. Skips (77) without a CUDA driver.
 */
#include <check.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "hwtest.h"

#define LEN 8192

/* Check's fork mode runs each test in its own process: CUDA is opened there only. */
static const struct tpcuda_api *api_open(void)
{
	char why[256];
	const struct tpcuda_api *api = tpcuda_api(why, sizeof(why));

	ck_assert_msg(api, "CUDA: %s", why);
	return api;
}

static CUcontext ctx_enter(const struct tpcuda_api *api, int ordinal)
{
	CUcontext c;

	ck_assert_int_eq(api->cuDevicePrimaryCtxRetain(&c, ordinal), CUDA_SUCCESS);
	ck_assert_int_eq(api->cuCtxSetCurrent(c), CUDA_SUCCESS);
	return c;
}

START_TEST(test_cuda_rules_event_records_only_on_its_own_context)
{
	const struct tpcuda_api *api = api_open();
	CUevent e0, e1;
	CUstream s0, s1;

	if (api->n_devices < 2)
		return; /* one device: nothing to cross */
	ctx_enter(api, 0);
	ck_assert_int_eq(api->cuEventCreate(&e0, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	ck_assert_int_eq(api->cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ctx_enter(api, 1);
	ck_assert_int_eq(api->cuEventCreate(&e1, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	ck_assert_int_eq(api->cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ck_assert_int_eq(api->cuEventRecord(e0, s1), CUDA_ERROR_INVALID_HANDLE);
	ck_assert_int_eq(api->cuEventRecord(e1, s0), CUDA_ERROR_INVALID_HANDLE);
	ck_assert_int_eq(api->cuEventRecord(e1, s1), CUDA_SUCCESS);
	ck_assert_int_eq(api->cuEventRecord(e0, s0), CUDA_SUCCESS);
	/* waiting across contexts is allowed */
	ck_assert_int_eq(api->cuStreamWaitEvent(s1, e0, 0), CUDA_SUCCESS);
	ck_assert_int_eq(api->cuStreamSynchronize(s1), CUDA_SUCCESS);
	ck_assert_int_eq(api->cuEventSynchronize(e1), CUDA_SUCCESS);
}
END_TEST

START_TEST(test_cuda_rules_making_needs_a_current_context)
{
	const struct tpcuda_api *api = api_open();
	CUevent e;
	CUstream s;
	void *h;

	ck_assert_int_eq(api->cuCtxSetCurrent(NULL), CUDA_SUCCESS);
	ck_assert_int_eq(api->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING),
			 CUDA_ERROR_INVALID_CONTEXT);
	ck_assert_int_eq(api->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING),
			 CUDA_ERROR_INVALID_CONTEXT);
	ck_assert_int_eq(api->cuMemHostAlloc(&h, 4096, CU_MEMHOSTALLOC_PORTABLE),
			 CUDA_ERROR_INVALID_CONTEXT);
	ctx_enter(api, 0);
	ck_assert_int_eq(api->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	ck_assert_int_eq(api->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	ck_assert_int_eq(api->cuMemHostAlloc(&h, 4096, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
	ck_assert_int_eq(api->cuMemFreeHost(h), CUDA_SUCCESS);
}
END_TEST

START_TEST(test_cuda_rules_ipc_events_need_both_flags)
{
	const struct tpcuda_api *api = api_open();
	CUipcEventHandle h;
	CUevent e;

	ctx_enter(api, 0);
	ck_assert_int_ne(api->cuEventCreate(&e, CU_EVENT_INTERPROCESS), CUDA_SUCCESS);
	ck_assert_int_eq(api->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	ck_assert_int_ne(api->cuIpcGetEventHandle(&h, e), CUDA_SUCCESS);
	ck_assert_int_eq(api->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS),
			 CUDA_SUCCESS);
	ck_assert_int_eq(api->cuIpcGetEventHandle(&h, e), CUDA_SUCCESS);
}
END_TEST

/* ---- one handle opened twice ---- */

struct exporter {
	int to_test[2], from_test[2];
};

/* Allocates LEN bytes filled with 0x5a, sends the IPC handle, waits for the test to finish. */
static int exporter_main(void *arg)
{
	struct exporter *x = arg;
	const struct tpcuda_api *api = tpcuda_api(NULL, 0);
	static uint8_t img[LEN];
	CUipcMemHandle h;
	CUcontext c;
	CUdeviceptr p;
	char done;

	memset(img, 0x5a, sizeof(img));
	if (!api || api->cuDevicePrimaryCtxRetain(&c, 0) || api->cuCtxSetCurrent(c) ||
	    api->cuMemAlloc(&p, LEN) || api->cuMemcpyHtoD(p, img, LEN) ||
	    api->cuIpcGetMemHandle(&h, p))
		return 1;
	if (write(x->to_test[1], &h, sizeof(h)) != (ssize_t)sizeof(h))
		return 1;
	return read(x->from_test[0], &done, 1) == 1 ? 0 : 1;
}

START_TEST(test_cuda_rules_handle_opened_twice_is_one_counted_mapping)
{
	struct exporter x;
	CUipcMemHandle h;
	CUdeviceptr a, b;
	uint8_t got[16];
	pid_t pid;
	const struct tpcuda_api *api;

	ck_assert_int_eq(pipe(x.to_test), 0);
	ck_assert_int_eq(pipe(x.from_test), 0);
	pid = tpt_fork(exporter_main, &x); /* before this process opens CUDA */
	ck_assert_int_gt(pid, 0);
	ck_assert_int_eq(read(x.to_test[0], &h, sizeof(h)), (ssize_t)sizeof(h));
	api = api_open();
	ctx_enter(api, 0);
	ck_assert_int_eq(api->cuIpcOpenMemHandle(&a, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
			 CUDA_SUCCESS);
	ck_assert_int_eq(api->cuIpcOpenMemHandle(&b, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
			 CUDA_SUCCESS);
	ck_assert_msg(a == b, "the second open gave another pointer");
	ck_assert_int_eq(api->cuIpcCloseMemHandle(a), CUDA_SUCCESS);
	/* still open once: readable */
	ck_assert_int_eq(api->cuMemcpyDtoH(got, b + LEN - sizeof(got), sizeof(got)), CUDA_SUCCESS);
	for (size_t i = 0; i < sizeof(got); i++)
		ck_assert_int_eq(got[i], 0x5a);
	ck_assert_int_eq(api->cuIpcCloseMemHandle(b), CUDA_SUCCESS);
	ck_assert_int_eq(write(x.from_test[1], "x", 1), 1);
	ck_assert(tpt_wait_ok(pid, 10000, "exporter"));
}
END_TEST

static Suite *cuda_rules_suite(void)
{
	Suite *s = suite_create("cuda_rules");
	TCase *tc = tcase_create("cuda_rules");

	tcase_add_test(tc, test_cuda_rules_event_records_only_on_its_own_context);
	tcase_add_test(tc, test_cuda_rules_making_needs_a_current_context);
	tcase_add_test(tc, test_cuda_rules_ipc_events_need_both_flags);
	tcase_add_test(tc, test_cuda_rules_handle_opened_twice_is_one_counted_mapping);
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return hwt_main(cuda_rules_suite(), 1);
}
