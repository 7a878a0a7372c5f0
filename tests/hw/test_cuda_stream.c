/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * hw suite: stream order. A writer queues slow work on its stream (a host function that sleeps
 * 300 ms) and behind it the memset that produces the tensor's final bytes, then calls
 * tp_pipe_write() with that stream at once: the call does not wait for the stream, the reader
 * sees the final bytes (the daemon's copy waited for the event recorded behind the memset), and
 * the write completes only after the slow work. Symmetrically a reader queues the slow function
 * and a memset of its slot to 0xEE, then tp_pipe_read() with that stream: after ReadDone the
 * slot holds the writer's bytes (the copy came after the memset, not before) and the slow work
 * had finished. Each for a stream of the client's own and for the legacy default stream, with
 * the other end in CUDA memory or in a shared CPU buffer. Skips (77) without a CUDA driver.
 */
#include <check.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "hwtest.h"

#define LEN (16u << 20)
#define SLOW_MS 300
#define OLD 0x11   /* the writer's tensor before the queued memset */
#define FINAL 0x5a /* and after it */
#define PRE 0x33   /* the reader's slot before anything was queued */
#define LATE 0xee  /* the reader's queued memset, which the read must land after */

static struct tpt_sync ready, finished;
static bool use_stream; /* a stream of our own (else the legacy stream) */
static bool other_cpu;	/* the other end's memory is a shared CPU buffer (else CUDA) */

struct slow {
	atomic_int done;
};

static void CUDA_CB slow_fn(void *arg)
{
	struct slow *s = arg;
	struct timespec ts = { 0, SLOW_MS * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
	atomic_store(&s->done, 1);
}

/* One asynchronous write or read and whether the slow work had finished when it completed. */
struct stream_op {
	struct tpt_done done;
	struct tpt_done_arg da;
	struct slow slow;
	int slow_done_at_cb;
};

static void stream_op_init(struct stream_op *op)
{
	memset(op, 0, sizeof(*op));
	tpt_done_init(&op->done);
	op->da.done = &op->done;
}

static void stream_op_cb(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	struct stream_op *op = arg;

	op->slow_done_at_cb = atomic_load(&op->slow.done);
	if (status != 0)
		tpt_log("completion: %d %s", status, errmsg ? errmsg : "");
	tpt_done_cb(&op->da, p, status, errmsg);
}

/* Waits for @op and checks it succeeded after the slow work. Return: 0 or 1 (printed). */
static int stream_op_check(struct stream_op *op, const char *what)
{
	TPT_REQUIRE(tpt_done_wait(&op->done, 1, HWT_T_MS) == 0, 1, "%s never completed", what);
	TPT_REQUIRE(op->done.last_status == 0, 1, "%s: %d", what, op->done.last_status);
	TPT_REQUIRE(op->slow_done_at_cb, 1,
		    "%s completed before the work queued ahead of it on the stream", what);
	return 0;
}

/* Queues the slow function and a memset of @len bytes at @p to @value on @s. */
static int queue_slow_memset(const struct hwt_cuda *cu, CUstream s, struct slow *slow,
			     CUdeviceptr p, uint8_t value)
{
	HWT_CU(cu, cuLaunchHostFunc(s, slow_fn, slow), 1);
	HWT_CU(cu, cuMemsetD8Async(p, value, LEN, s), 1);
	return 0;
}

static int make_stream(const struct hwt_cuda *cu, CUstream *ret)
{
	*ret = NULL;
	if (use_stream)
		HWT_CU(cu, cuStreamCreate(ret, CU_STREAM_NON_BLOCKING), 1);
	return 0;
}

/* ---- the writer's stream -------------------------------------------------------------------- */

static int slow_writer(void *arg)
{
	struct tpt_end e = { .d = &tpt_fixture_daemon, .ctx_name = "slow-writer",
			     .where = "hw-stream", .ready = &ready, .timeout_ms = HWT_T_MS };
	struct tp_tensor t = { .device = { TP_DEVICE_CUDA, 0 }, .length = LEN };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	struct stream_op op;
	struct hwt_cuda cu;
	CUdeviceptr p;
	CUstream s;
	int r;

	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	HWT_CU(&cu, cuMemAlloc(&p, LEN), 1);
	TPT_REQUIRE(hwt_dev_set(&cu, p, OLD, LEN) == 0, 1, "memset");
	TPT_REQUIRE(make_stream(&cu, &s) == 0, 1, "stream");
	stream_op_init(&op);
	TPT_REQUIRE(queue_slow_memset(&cu, s, &op.slow, p, FINAL) == 0, 1, "queue");
	t.data = hwt_ptr(p);
	t.cuda_stream = s;
	r = tp_pipe_write(e.p, &m, stream_op_cb, &op);
	TPT_REQUIRE(r == 0, 1, "write: %d %s", r, tp_last_error());
	TPT_REQUIRE(!atomic_load(&op.slow.done), 1,
		    "tp_pipe_write() waited for the stream (%d ms of queued work)", SLOW_MS);
	TPT_REQUIRE(stream_op_check(&op, "the write") == 0, 1, "write");
	TPT_REQUIRE(tpt_sync_wait(&finished, HWT_T_MS) == 0, 1, "the reader did not finish");
	tp_cuda_release(e.ctx, hwt_ptr(p));
	tpt_end_close(&e);
	hwt_cuda_close(&cu);
	return 0;
}

/* Reads one LEN-byte tensor into CUDA memory pre-set to PRE, or into a shared buffer. */
static int plain_read(struct tpt_end *e, uint8_t value)
{
	struct tp_slot slot = { .device = { TP_DEVICE_CUDA, 0 } };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	struct tp_descriptor *d;
	uint8_t *want = NULL;
	struct hwt_cuda cu = { 0 };
	CUdeviceptr p = 0;
	int r;

	if (other_cpu) {
		slot.device = (struct tp_device){ TP_DEVICE_CPU, 0 };
		TPT_REQUIRE(tp_buffer_alloc(e->ctx, LEN, &slot.data) == 0, 1, "tp_buffer_alloc");
		memset(slot.data, PRE, LEN);
	} else {
		TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
		HWT_CU(&cu, cuMemAlloc(&p, LEN), 1);
		TPT_REQUIRE(hwt_dev_set(&cu, p, PRE, LEN) == 0, 1, "memset");
		slot.data = hwt_ptr(p);
	}
	r = tp_pipe_read_descriptor_sync(e->p, HWT_T_MS, &d);
	TPT_REQUIRE(r == 0, 1, "descriptor: %d %s", r, tp_last_error());
	r = tp_pipe_read_sync(e->p, d, &a);
	TPT_REQUIRE(r == 0, 1, "read: %d %s", r, tp_last_error());
	if (p) {
		r = hwt_dev_expect_byte(&cu, p, value, LEN, "the slot");
		hwt_cuda_close(&cu);
	} else {
		want = malloc(LEN);
		TPT_REQUIRE(want, 1, "malloc");
		memset(want, value, LEN);
		r = hwt_same(slot.data, want, LEN, "the shared buffer") ? 0 : 1;
		free(want);
	}
	return r;
}

static int plain_reader(void *arg)
{
	struct tpt_end e = { .d = &tpt_fixture_daemon, .ctx_name = "plain-reader",
			     .where = "hw-stream", .ready = &ready, .timeout_ms = HWT_T_MS };
	int r;

	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	r = plain_read(&e, FINAL);
	if (r != 0)
		tpt_log("the reader did not see the bytes queued behind the slow work");
	tpt_sync_post(&finished, (int8_t)r);
	tpt_end_close(&e);
	return r;
}

/* _i: bit 0 a stream of our own (else the legacy stream), bit 1 the reader in CPU memory. */
START_TEST(test_cuda_stream_write_waits_for_the_writers_stream)
{
	use_stream = _i & 1;
	other_cpu = _i & 2;
	printf("writer on %s, reader in %s\n", use_stream ? "its own stream" : "the legacy stream",
	       other_cpu ? "a shared CPU buffer" : "CUDA memory");
	ck_assert(tpt_run_pair(plain_reader, slow_writer, NULL, 2 * HWT_T_MS));
}
END_TEST

/* ---- the reader's stream -------------------------------------------------------------------- */

#define SEED 0x5eed

static int plain_writer(void *arg)
{
	struct tpt_end e = { .d = &tpt_fixture_daemon, .ctx_name = "plain-writer",
			     .where = "hw-stream", .ready = &ready, .timeout_ms = HWT_T_MS };
	struct tp_tensor t = { .device = { TP_DEVICE_CUDA, 0 }, .length = LEN };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	uint8_t *img = malloc(LEN);
	struct hwt_cuda cu = { 0 };
	CUdeviceptr p = 0;
	int r;

	TPT_REQUIRE(img, 1, "malloc");
	tpt_fill(img, LEN, SEED);
	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	if (other_cpu) {
		t.device = (struct tp_device){ TP_DEVICE_CPU, 0 };
		TPT_REQUIRE(tp_buffer_alloc(e.ctx, LEN, &t.data) == 0, 1, "tp_buffer_alloc");
		memcpy(t.data, img, LEN);
	} else {
		TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
		HWT_CU(&cu, cuMemAlloc(&p, LEN), 1);
		TPT_REQUIRE(hwt_dev_put(&cu, p, img, LEN, NULL) == 0, 1, "fill");
		t.data = hwt_ptr(p);
	}
	r = tp_pipe_write_sync(e.p, &m);
	TPT_REQUIRE(r == 0, 1, "write: %d %s", r, tp_last_error());
	TPT_REQUIRE(tpt_sync_wait(&finished, HWT_T_MS) == 0, 1, "the reader did not finish");
	tpt_end_close(&e);
	hwt_cuda_close(&cu);
	free(img);
	return 0;
}

/* Reads behind the slow function and the LATE memset on the slot's stream. */
static int slow_read(struct tpt_end *e, const struct hwt_cuda *cu, CUdeviceptr p,
		     struct stream_op *op)
{
	struct tp_slot slot = { .device = { TP_DEVICE_CUDA, 0 }, .data = hwt_ptr(p) };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	struct tp_descriptor *d;
	CUstream s;
	int r = tp_pipe_read_descriptor_sync(e->p, HWT_T_MS, &d);

	TPT_REQUIRE(r == 0, 1, "descriptor: %d %s", r, tp_last_error());
	TPT_REQUIRE(make_stream(cu, &s) == 0, 1, "stream");
	TPT_REQUIRE(queue_slow_memset(cu, s, &op->slow, p, LATE) == 0, 1, "queue");
	slot.cuda_stream = s;
	r = tp_pipe_read(e->p, d, &a, stream_op_cb, op);
	TPT_REQUIRE(r == 0, 1, "read: %d %s", r, tp_last_error());
	TPT_REQUIRE(!atomic_load(&op->slow.done), 1,
		    "tp_pipe_read() waited for the stream (%d ms of queued work)", SLOW_MS);
	return stream_op_check(op, "the read");
}

static int slow_reader(void *arg)
{
	struct tpt_end e = { .d = &tpt_fixture_daemon, .ctx_name = "slow-reader",
			     .where = "hw-stream", .ready = &ready, .timeout_ms = HWT_T_MS };
	uint8_t *want = malloc(LEN);
	struct stream_op op;
	struct hwt_cuda cu;
	CUdeviceptr p;
	int r;

	TPT_REQUIRE(want, 1, "malloc");
	tpt_fill(want, LEN, SEED);
	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	HWT_CU(&cu, cuMemAlloc(&p, LEN), 1);
	TPT_REQUIRE(hwt_dev_set(&cu, p, PRE, LEN) == 0, 1, "memset");
	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	stream_op_init(&op);
	r = slow_read(&e, &cu, p, &op);
	if (r == 0)
		r = hwt_dev_expect(&cu, p, want, LEN, "the slot after ReadDone");
	if (r == 1)
		tpt_log("0x%02x bytes: the read landed before the queued memset; 0x%02x: the read "
			"was not done", LATE, PRE);
	tpt_sync_post(&finished, (int8_t)r);
	tpt_end_close(&e);
	hwt_cuda_close(&cu);
	free(want);
	return r;
}

/* _i: bit 0 a stream of our own (else the legacy stream), bit 1 the writer in CPU memory. */
START_TEST(test_cuda_stream_read_waits_for_the_readers_stream)
{
	use_stream = _i & 1;
	other_cpu = _i & 2;
	printf("reader on %s, writer in %s\n", use_stream ? "its own stream" : "the legacy stream",
	       other_cpu ? "a shared CPU buffer" : "CUDA memory");
	ck_assert(tpt_run_pair(slow_reader, plain_writer, NULL, 2 * HWT_T_MS));
}
END_TEST

static void setup(void)
{
	tpt_fixture_start();
	ck_assert_int_eq(tpt_sync_init(&ready), 0);
	ck_assert_int_eq(tpt_sync_init(&finished), 0);
}

static void teardown(void)
{
	tpt_sync_done(&ready);
	tpt_sync_done(&finished);
	tpt_fixture_stop();
}

static Suite *cuda_stream_suite(void)
{
	Suite *s = suite_create("cuda_stream");
	TCase *tc = tcase_create("cuda_stream");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_loop_test(tc, test_cuda_stream_write_waits_for_the_writers_stream, 0, 4);
	tcase_add_loop_test(tc, test_cuda_stream_read_waits_for_the_readers_stream, 0, 4);
	tcase_set_timeout(tc, 200);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return hwt_main(cuda_stream_suite(), 1);
}
