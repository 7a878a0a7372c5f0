/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * hw suite: CUDA tensors as channel items (docs/channels.md, "Items as messages"). A message of
 * a CPU payload and two CUDA tensors (one on a stream of its own whose queued work fills it just
 * before the write, one on the legacy default stream; small and above the inline limit) is
 * written by one process and read by another: its descriptor shows the tensors' device and
 * target, and the bytes arrive intact in CUDA slots (on the reader's stream), in CPU slots, and
 * the other way round (CPU tensors read into CUDA slots). The same messages as work queue
 * questions (docs/queues.md, "Questions and answers as messages"): submitted by the owner's
 * process, taken and read by a worker's the same way, each answered. Skips (77) without a CUDA
 * driver or device.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "hwtest.h"

#define BIG ((1u << 20) + 7)
#define SMALL 100u
#define SEED_A 71
#define SEED_B 72

static const char *const chan_name = "hw-chan";

/* Where the messages go: a channel (@q NULL) or a work queue. */
struct msgs {
	struct tp_chan *ch;
	struct tp_wq *q;
};

static bool use_wq; /* the loop test's _i, set in the parent before the fork */

/* Opens the work queue (@create: as its owner), waiting up to HWT_T_MS for its owner. */
static struct tp_wq *wq_of(struct tp_context *ctx, bool create)
{
	struct tp_wq_options o = { .size = sizeof(o), .flags = create ? TP_WQ_CREATE : 0,
				   .owner_uid = -1 };
	struct tp_wq *q = NULL;

	for (int i = 0; i < HWT_T_MS / 10 && tp_wq_open(ctx, chan_name, &o, &q) < 0; i++)
		usleep(10000);
	return q;
}

static int write_msg(const struct msgs *to, const struct tp_message *m)
{
	uint64_t id;

	return to->q ? tp_wq_submit_msg(to->q, m, &id) : tp_chan_write_msgs(to->ch, m, 1, HWT_T_MS);
}

static struct tp_chan *chan_of(struct tp_context *ctx, unsigned flags)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = flags, .owner_uid = -1 };
	struct tp_chan *ch = NULL;

	if (tp_chan_open(ctx, chan_name, &o, &ch) < 0)
		return NULL;
	return ch;
}

/* Writes, from device memory: payload "hello" (CPU), tensor 0 of BIG bytes on a stream whose
 * queued copy fills it (SEED_A) right before the write, tensor 1 of SMALL bytes (SEED_B) on the
 * legacy stream, wishing for CUDA device 0. Then, from host memory, the same as CPU tensors. */
static int writer(void *arg)
{
	struct hwt_cuda c = { 0 };
	struct tp_context *ctx = NULL;
	struct msgs to = { 0 };
	CUdeviceptr a = 0, b = 0;
	CUstream s = NULL;
	uint8_t *img_a = malloc(BIG), *img_b = malloc(SMALL);
	struct tp_payload p = { .data = "hello", .length = 5 };
	struct tp_tensor t[2] = {
		{ .device = { TP_DEVICE_CUDA, 0 }, .length = BIG, .has_target = true,
		  .target = { TP_DEVICE_CUDA, 0 } },
		{ .device = { TP_DEVICE_CUDA, 0 }, .length = SMALL },
	};
	struct tp_message m = { .metadata = "cuda", .metadata_len = 4, .payloads = &p,
				.n_payloads = 1, .tensors = t, .n_tensors = 2 };
	int r;

	(void)arg;
	TPT_REQUIRE(img_a && img_b, 1, "malloc");
	tpt_fill(img_a, BIG, SEED_A);
	tpt_fill(img_b, SMALL, SEED_B);
	TPT_REQUIRE(hwt_cuda_open(0, &c) == 0, 1, "cuda");
	HWT_CU(&c, cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), 1);
	HWT_CU(&c, cuMemAlloc(&a, BIG), 1);
	TPT_REQUIRE(hwt_dev_set(&c, a, 0, BIG) == 0, 1, "memset");
	TPT_REQUIRE(hwt_dev_alloc_fill(&c, SMALL, SEED_B, &b) == 0, 1, "fill");
	TPT_REQUIRE(tpt_ctx_new(&tpt_fixture_daemon, 0, "w", &ctx) == 0, 1, "ctx");
	if (use_wq)
		to.q = wq_of(ctx, true);
	else
		to.ch = chan_of(ctx, 0);
	TPT_REQUIRE(to.ch || to.q, 1, "open: %s", tp_last_error());
	/* Queued, not waited for: the write must copy after it. */
	TPT_REQUIRE(hwt_dev_put(&c, a, img_a, BIG, s) == 0, 1, "put");
	t[0].data = hwt_ptr(a);
	t[0].cuda_stream = s;
	t[1].data = hwt_ptr(b);
	r = write_msg(&to, &m);
	TPT_REQUIRE(r == 0, 1, "write: %d %s", r, tp_last_error());
	t[0] = (struct tp_tensor){ .device = { TP_DEVICE_CPU, 0 }, .data = img_a, .length = BIG };
	t[1] = (struct tp_tensor){ .device = { TP_DEVICE_CPU, 0 }, .data = img_b, .length = SMALL };
	r = write_msg(&to, &m);
	TPT_REQUIRE(r == 0, 1, "write from host: %d %s", r, tp_last_error());
	for (int i = 0; to.q && i < 2; i++) { /* the worker's answers, dropped */
		struct tp_descriptor *d;
		uint64_t id;

		r = tp_wq_answer_descriptor(to.q, &id, &d, HWT_T_MS);
		TPT_REQUIRE(r == 0, 1, "answer: %d %s", r, tp_last_error());
		tp_wq_descriptor_free(d);
	}
	if (to.q)
		tp_wq_release(to.q);
	else
		tp_chan_release(to.ch);
	tp_context_free(ctx);
	c.api->cuMemFree(a);
	c.api->cuMemFree(b);
	c.api->cuStreamDestroy(s);
	hwt_cuda_close(&c);
	free(img_a);
	free(img_b);
	return 0;
}

/* Reads the message with tensor @cuda_slot (0 or 1) into a CUDA slot on a stream of its own
 * and the other tensor into CPU memory; checks every byte and the descriptor (@from_cuda: the
 * writer's tensors were on the device). Return: 0, or 1 (printed). */
static int read_one(struct hwt_cuda *c, const struct msgs *from, int cuda_slot, bool from_cuda)
{
	static const size_t lens[2] = { BIG, SMALL };
	static const uint64_t seeds[2] = { SEED_A, SEED_B };
	struct tp_descriptor *d = NULL;
	struct tp_slot ps = { .device = { TP_DEVICE_CPU, 0 } }, ts[2];
	struct tp_allocation al = { .payloads = &ps, .n_payloads = 1, .tensors = ts,
				    .n_tensors = 2 };
	CUdeviceptr dev = 0;
	CUstream s = NULL;
	uint8_t *host = malloc(BIG), *want = malloc(BIG);
	struct tp_payload ok = { .data = "ok", .length = 2 };
	struct tp_message answer = { .payloads = &ok, .n_payloads = 1 };
	char pay[5];
	int r, other = 1 - cuda_slot;
	uint64_t id = 0;

	TPT_REQUIRE(host && want, 1, "malloc");
	r = from->q ? tp_wq_take_descriptor(from->q, &id, &d, HWT_T_MS) :
		      tp_chan_read_descriptor(from->ch, &d, HWT_T_MS);
	TPT_REQUIRE(r == 0, 1, "descriptor: %d %s", r, tp_last_error());
	TPT_REQUIRE(d->n_payloads == 1 && d->n_tensors == 2 && d->metadata_len == 4 &&
		    memcmp(d->metadata, "cuda", 4) == 0 && d->tensors[0].length == BIG &&
		    d->tensors[1].length == SMALL, 1, "descriptor's shape");
	TPT_REQUIRE(d->tensors[0].device.type == (from_cuda ? TP_DEVICE_CUDA : TP_DEVICE_CPU) &&
		    d->tensors[0].has_target == from_cuda &&
		    (!from_cuda || (d->tensors[0].target.type == TP_DEVICE_CUDA &&
				    d->tensors[0].target.index == 0)), 1,
		    "descriptor's devices: %d, target %d", d->tensors[0].device.type,
		    d->tensors[0].has_target);
	HWT_CU(c, cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), 1);
	HWT_CU(c, cuMemAlloc(&dev, lens[cuda_slot]), 1);
	ps.data = pay;
	ts[cuda_slot] = (struct tp_slot){ .device = { TP_DEVICE_CUDA, 0 }, .data = hwt_ptr(dev),
					  .cuda_stream = s };
	ts[other] = (struct tp_slot){ .device = { TP_DEVICE_CPU, 0 }, .data = host };
	r = from->q ? tp_wq_read_msg(from->q, d, &al) : tp_chan_read_msg(from->ch, d, &al);
	TPT_REQUIRE(r == 0, 1, "read: %d %s", r, tp_last_error());
	TPT_REQUIRE(memcmp(pay, "hello", 5) == 0, 1, "payload");
	tpt_fill(want, lens[other], seeds[other]);
	TPT_REQUIRE(hwt_same(host, want, lens[other], "CPU slot"), 1, "CPU slot");
	tpt_fill(want, lens[cuda_slot], seeds[cuda_slot]);
	r = hwt_dev_expect(c, dev, want, lens[cuda_slot], "CUDA slot");
	TPT_REQUIRE(r == 0, 1, "CUDA slot: %d", r);
	r = from->q ? tp_wq_reply_msg(from->q, id, &answer) : 0;
	TPT_REQUIRE(r == 0, 1, "reply: %d %s", r, tp_last_error());
	c->api->cuMemFree(dev);
	c->api->cuStreamDestroy(s);
	free(host);
	free(want);
	return 0;
}

static int reader(void *arg)
{
	struct hwt_cuda c = { 0 };
	struct tp_context *ctx = NULL;
	struct msgs from = { 0 };
	int r;

	(void)arg;
	TPT_REQUIRE(hwt_cuda_open(0, &c) == 0, 1, "cuda");
	TPT_REQUIRE(tpt_ctx_new(&tpt_fixture_daemon, 0, "r", &ctx) == 0, 1, "ctx");
	if (use_wq)
		from.q = wq_of(ctx, false);
	else
		from.ch = chan_of(ctx, 0);
	TPT_REQUIRE(from.ch || from.q, 1, "open: %s", tp_last_error());
	r = read_one(&c, &from, 0, true); /* the big CUDA tensor into a CUDA slot (staged) */
	if (r == 0)
		r = read_one(&c, &from, 1, false); /* a CPU tensor into a CUDA slot */
	if (from.q)
		tp_wq_release(from.q);
	else
		tp_chan_release(from.ch);
	tp_context_free(ctx);
	hwt_cuda_close(&c);
	return r;
}

/* _i 0: channel items; 1: work queue questions. */
START_TEST(test_cuda_tensors_as_channel_items)
{
	struct tp_context *ctx = NULL;
	struct tp_chan *ch = NULL;
	pid_t w, r;

	use_wq = _i == 1;
	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, "owner", &ctx), 0);
	if (!use_wq)
		ck_assert_ptr_nonnull((ch = chan_of(ctx, TP_CHAN_CREATE)));
	w = tpt_fork(writer, NULL);
	r = tpt_fork(reader, NULL);
	ck_assert(tpt_wait_ok(w, HWT_T_MS, "writer"));
	ck_assert(tpt_wait_ok(r, HWT_T_MS, "reader"));
	if (ch)
		tp_chan_release(ch);
	tp_context_free(ctx);
	ck_assert_msg(tpt_daemon_alive(&tpt_fixture_daemon), "tpipd died");
}
END_TEST

static Suite *cuda_chan_suite(void)
{
	Suite *s = suite_create("cuda_chan");
	TCase *tc = tcase_create("cuda_chan");

	tcase_add_checked_fixture(tc, tpt_fixture_start, tpt_fixture_stop);
	tcase_add_loop_test(tc, test_cuda_tensors_as_channel_items, 0, 2);
	tcase_set_timeout(tc, 120);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return hwt_main(cuda_chan_suite(), 1);
}
