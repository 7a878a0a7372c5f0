/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: work queue questions and answers as messages (issue 25 part wqmsg;
 * docs/queues.md "Questions and answers as messages"). Multi-part messages (metadata, payloads,
 * tensors, parts of 0 bytes) make the round trip owner -> worker -> owner byte for byte, from
 * and into private memory, shared buffers, one shared slab and both mixed, small (inline) and
 * large (by reference, staged or copied from shared buffers), up to 16 MiB + 3 (above the
 * 1 MiB inline limit of byte payloads); a worker in another process SIGKILLed while it holds a
 * 16 MiB + 3 message question has it queued again exactly once, intact; at-most-once answers
 * it with -ECONNRESET instead; byte and message questions and answers mix (a byte one read by
 * descriptor is one payload, a message refuses the byte calls and stays first); the message's
 * descriptor counts toward wq-bytes-max, just at and just above; a reply to an id not taken is
 * refused; an answer descriptor freed unread drops the answer.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"

#define T_MS 30000
#define BIG ((16u << 20) + 3)
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static void setup(void)
{
	tpt_fixture_start();
}

static void teardown(void)
{
	tpt_fixture_stop();
}

static struct tp_context *ctx_new(const struct tpt_daemon *d)
{
	struct tp_context *ctx = NULL;

	if (tpt_ctx_new(d, 0, "wqmsg", &ctx) < 0)
		return NULL;
	return ctx;
}

static int wq_open(struct tp_context *ctx, const char *name, unsigned flags, struct tp_wq **ret)
{
	struct tp_wq_options o = { .size = sizeof(o), .flags = flags, .owner_uid = -1 };

	return tp_wq_open(ctx, name, &o, ret);
}

/* A question (pipe 0) or answer (pipe 1) spec number @i: 3 payloads and 2 tensors with
 * metadata, the second payload empty, the others of @len bytes and a few more. */
static struct tpt_msg_spec spec(unsigned pipe, unsigned i, size_t len)
{
	struct tpt_msg_spec s = { .pipe = pipe, .index = i, .n_payloads = 3, .n_tensors = 2,
				  .meta_len = 7, .seg_meta_len = 3, .tensor_target = i & 1 };

	s.lens[0] = len;
	s.lens[1] = 0;
	s.lens[2] = len / 2 + 1;
	s.lens[3] = 5;
	s.lens[4] = len + 3;
	return s;
}

/* Submits question @s from memory @mem. */
static int submit(struct tp_context *ctx, struct tp_wq *q, const struct tpt_msg_spec *s,
		  enum tpt_mem mem, uint64_t *ret_id)
{
	struct tpt_msg m;
	int r = tpt_msg_build(ctx, s, mem, &m);

	if (r == 0)
		r = tp_wq_submit_msg(q, &m.m, ret_id);
	tpt_msg_free(ctx, &m);
	return r;
}

static int reply(struct tp_context *ctx, struct tp_wq *q, uint64_t id,
		 const struct tpt_msg_spec *s, enum tpt_mem mem)
{
	struct tpt_msg m;
	int r = tpt_msg_build(ctx, s, mem, &m);

	if (r == 0)
		r = tp_wq_reply_msg(q, id, &m.m);
	tpt_msg_free(ctx, &m);
	return r;
}

/* One round trip of question @qs and answer @as through @q (owner) and @w (worker). */
static void round_trip(struct tp_context *oc, struct tp_wq *q, struct tp_context *wc,
		       struct tp_wq *w, const struct tpt_msg_spec *qs, const struct tpt_msg_spec *as,
		       enum tpt_mem mem)
{
	struct tp_descriptor *d = NULL;
	uint64_t id, got;

	ck_assert_msg(submit(oc, q, qs, mem, &id) == 0, "submit %s: %s", tpt_mem_name(mem),
		      tp_last_error());
	ck_assert_msg(tp_wq_take_descriptor(w, &got, &d, T_MS) == 0, "take: %s", tp_last_error());
	ck_assert_int_eq(got, id);
	ck_assert_int_eq(tpt_wq_msg_read_check(wc, w, d, qs, mem), 0);
	ck_assert_msg(reply(wc, w, id, as, mem) == 0, "reply: %s", tp_last_error());
	ck_assert_msg(tp_wq_answer_descriptor(q, &got, &d, T_MS) == 0, "answer: %s",
		      tp_last_error());
	ck_assert_int_eq(got, id);
	ck_assert_int_eq(tpt_wq_msg_read_check(oc, q, d, as, mem), 0);
}

START_TEST(test_messages_round_trip_both_directions)
{
	static const enum tpt_mem mems[] = { TPT_MEM_PRIVATE, TPT_MEM_SHM, TPT_MEM_SLAB,
					     TPT_MEM_MIXED };
	static const size_t lens[] = { 1, 3000, 70000, (1u << 20) + 5 };
	struct tp_context *oc = ctx_new(&tpt_fixture_daemon), *wc = ctx_new(&tpt_fixture_daemon);
	struct tp_wq *q, *w;
	unsigned i = 0;

	ck_assert_ptr_nonnull(oc);
	ck_assert_ptr_nonnull(wc);
	ck_assert_int_eq(wq_open(oc, "rt", TP_WQ_CREATE, &q), 0);
	ck_assert_int_eq(wq_open(wc, "rt", 0, &w), 0);
	for (size_t m = 0; m < N_OF(mems); m++)
		for (size_t k = 0; k < N_OF(lens); k++, i++) {
			struct tpt_msg_spec qs = spec(0, i, lens[k]), as = spec(1, i, lens[k]);

			round_trip(oc, q, wc, w, &qs, &as, mems[m]);
		}
	ck_assert_int_eq(tp_wq_drain(q, 0), 0);
	tp_wq_release(w);
	tp_wq_release(q);
	tp_context_free(wc);
	tp_context_free(oc);
}
END_TEST

/* 16 MiB + 3, one payload: above the inline limit of byte payloads. */
START_TEST(test_16m_plus_3)
{
	static const enum tpt_mem mems[] = { TPT_MEM_SHM, TPT_MEM_PRIVATE };
	struct tp_context *oc = ctx_new(&tpt_fixture_daemon), *wc = ctx_new(&tpt_fixture_daemon);
	struct tp_wq *q, *w;

	ck_assert_int_eq(wq_open(oc, "big", TP_WQ_CREATE, &q), 0);
	ck_assert_int_eq(wq_open(wc, "big", 0, &w), 0);
	for (unsigned i = 0; i < N_OF(mems); i++) {
		struct tpt_msg_spec qs = { .pipe = 2, .index = i, .n_payloads = 1, .lens = { BIG } };
		struct tpt_msg_spec as = { .pipe = 3, .index = i, .n_payloads = 1, .lens = { BIG } };

		round_trip(oc, q, wc, w, &qs, &as, mems[i]);
	}
	tp_wq_release(w);
	tp_wq_release(q);
	tp_context_free(wc);
	tp_context_free(oc);
}
END_TEST

/* ---- a worker killed holding a message question --------------------------------------------- */

/* Takes a question by descriptor and keeps it (the descriptor is left to the process's end). */
static int take_desc(struct tp_wq *q, uint64_t *ret_id)
{
	struct tp_descriptor *d;

	return tp_wq_take_descriptor(q, ret_id, &d, T_MS);
}

static uint64_t take_and_die(const char *name)
{
	return tpt_wq_take_and_die(&tpt_fixture_daemon, name, take_desc);
}

START_TEST(test_killed_worker_message_requeued_once)
{
	struct tpt_msg_spec qs = { .pipe = 4, .n_payloads = 2, .n_tensors = 1, .meta_len = 9,
				   .lens = { BIG, 0, 17 } };
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	struct tp_descriptor *d;
	struct tp_wq *q, *w;
	uint64_t id, got;

	ck_assert_int_eq(wq_open(ctx, "kill", TP_WQ_CREATE, &q), 0);
	ck_assert_int_eq(wq_open(ctx, "kill", 0, &w), 0);
	ck_assert_int_eq(submit(ctx, q, &qs, TPT_MEM_SHM, &id), 0);
	ck_assert_int_eq(take_and_die("kill"), id);
	ck_assert_int_eq(tp_wq_take_descriptor(w, &got, &d, T_MS), 0);
	ck_assert_int_eq(got, id);
	ck_assert_int_eq(tpt_wq_msg_read_check(ctx, w, d, &qs, TPT_MEM_PRIVATE), 0);
	ck_assert_int_eq(tp_wq_take_descriptor(w, &got, &d, 0), -EAGAIN); /* exactly once */
	ck_assert_int_eq(reply(ctx, w, id, &qs, TPT_MEM_SHM), 0);
	ck_assert_int_eq(tp_wq_answer_descriptor(q, &got, &d, T_MS), 0);
	ck_assert_int_eq(got, id);
	ck_assert_int_eq(tpt_wq_msg_read_check(ctx, q, d, &qs, TPT_MEM_SHM), 0);
	ck_assert_int_eq(tp_wq_answer_descriptor(q, &got, &d, 0), -ENOMSG);
	tp_wq_release(w);
	tp_wq_release(q);
	tp_context_free(ctx);
}
END_TEST

START_TEST(test_killed_worker_message_at_most_once)
{
	struct tpt_msg_spec qs = { .pipe = 5, .n_payloads = 1, .lens = { 100000 } };
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	struct tp_descriptor *d = (void *)1;
	struct tp_wq *q, *w;
	uint64_t id, got = 0;

	ck_assert_int_eq(wq_open(ctx, "amo", TP_WQ_CREATE | TP_WQ_AT_MOST_ONCE, &q), 0);
	ck_assert_int_eq(wq_open(ctx, "amo", 0, &w), 0);
	ck_assert_int_eq(submit(ctx, q, &qs, TPT_MEM_PRIVATE, &id), 0);
	ck_assert_int_eq(take_and_die("amo"), id);
	ck_assert_int_eq(tp_wq_answer_descriptor(q, &got, &d, T_MS), -ECONNRESET);
	ck_assert_int_eq(got, id);
	ck_assert_ptr_null(d);
	ck_assert_int_eq(tp_wq_take_descriptor(w, &got, &d, 0), -EAGAIN); /* never again */
	ck_assert_int_eq(tp_wq_drain(q, 0), 0);
	tp_wq_release(w);
	tp_wq_release(q);
	tp_context_free(ctx);
}
END_TEST

/* ---- mixing, limits ----------------------------------------------------------------------- */

START_TEST(test_bytes_and_messages_mix)
{
	struct tpt_msg_spec one = { .pipe = 6, .n_payloads = 1, .lens = { 20 } };
	struct tpt_msg_spec empty = { .pipe = 7 };
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	struct tp_descriptor *d;
	struct tp_wq *q, *w;
	uint64_t id, id2, got;
	uint8_t bytes[20];
	void *p;
	size_t len;

	tpt_fill(bytes, sizeof(bytes), tpt_seed(6, 0, 0));
	ck_assert_int_eq(wq_open(ctx, "mix", TP_WQ_CREATE, &q), 0);
	ck_assert_int_eq(wq_open(ctx, "mix", 0, &w), 0);
	/* A message question refuses a byte take and stays first. */
	ck_assert_int_eq(submit(ctx, q, &empty, TPT_MEM_PRIVATE, &id), 0);
	ck_assert_int_eq(tp_wq_submit(q, bytes, sizeof(bytes), &id2), 0);
	ck_assert_int_eq(tp_wq_take(w, &got, &p, &len, 0), -EOPNOTSUPP);
	ck_assert_int_eq(tp_wq_take_descriptor(w, &got, &d, 0), 0);
	ck_assert_int_eq(got, id);
	ck_assert_int_eq(tpt_wq_msg_read_check(ctx, w, d, &empty, TPT_MEM_PRIVATE), 0);
	/* A byte question taken by descriptor is one payload. */
	ck_assert_int_eq(tp_wq_take_descriptor(w, &got, &d, 0), 0);
	ck_assert_int_eq(got, id2);
	ck_assert_int_eq(tpt_wq_msg_read_check(ctx, w, d, &one, TPT_MEM_SHM), 0);
	/* A byte answer read by descriptor; a message answer refuses a byte read. */
	ck_assert_int_eq(tp_wq_reply(w, id2, bytes, sizeof(bytes)), 0);
	ck_assert_int_eq(reply(ctx, w, id, &empty, TPT_MEM_SHM), 0);
	ck_assert_int_eq(tp_wq_answer_descriptor(q, &got, &d, T_MS), 0);
	ck_assert_int_eq(got, id2);
	ck_assert_int_eq(tpt_wq_msg_read_check(ctx, q, d, &one, TPT_MEM_PRIVATE), 0);
	ck_assert_int_eq(tp_wq_answer(q, &got, &p, &len, T_MS), -EOPNOTSUPP);
	ck_assert_int_eq(tp_wq_answer_descriptor(q, &got, &d, T_MS), 0);
	ck_assert_int_eq(got, id);
	ck_assert_int_eq(tpt_wq_msg_read_check(ctx, q, d, &empty, TPT_MEM_PRIVATE), 0);
	ck_assert_int_eq(tp_wq_answer(q, &got, &p, &len, 0), -ENOMSG);
	tp_wq_release(w);
	tp_wq_release(q);
	tp_context_free(ctx);
}
END_TEST

/* A message of one 100-byte payload costs its bytes and its descriptor's 4 (PayloadDesc
 * length 100): 104. */
START_TEST(test_descriptor_counts_toward_limits)
{
	static const char *const args[] = { "--wq-bytes-max", "104", "--wq-answer-bytes-max",
					    "104", NULL };
	struct tpt_msg_spec s100 = { .pipe = 8, .n_payloads = 1, .lens = { 100 } };
	struct tpt_msg_spec s101 = { .pipe = 8, .n_payloads = 1, .lens = { 101 } };
	struct tp_descriptor *d;
	struct tpt_daemon dm;
	struct tp_context *ctx;
	struct tp_wq *q, *q2, *w;
	uint64_t id, got;
	uint8_t bytes[104] = { 0 };

	ck_assert_int_eq(tpt_daemon_start(&dm, args), 0);
	ctx = ctx_new(&dm);
	ck_assert_ptr_nonnull(ctx);
	ck_assert_int_eq(wq_open(ctx, "lim", TP_WQ_CREATE, &q), 0);
	ck_assert_int_eq(wq_open(ctx, "lim2", TP_WQ_CREATE, &q2), 0);
	ck_assert_int_eq(wq_open(ctx, "lim", 0, &w), 0);
	ck_assert_int_eq(submit(ctx, q2, &s101, TPT_MEM_PRIVATE, &id), -ENOBUFS); /* 105 */
	ck_assert_int_eq(tp_wq_submit(q2, bytes, 104, &id), 0); /* bytes alone: at the limit */
	ck_assert_int_eq(submit(ctx, q, &s100, TPT_MEM_PRIVATE, &id), 0); /* 104: at it */
	ck_assert_int_eq(tp_wq_submit(q, bytes, 1, &got), -ENOBUFS);
	ck_assert_int_eq(tp_wq_take_descriptor(w, &got, &d, 0), 0);
	ck_assert_int_eq(tpt_wq_msg_read_check(ctx, w, d, &s100, TPT_MEM_PRIVATE), 0);
	ck_assert_int_eq(reply(ctx, w, id, &s101, TPT_MEM_PRIVATE), -ENOBUFS); /* stays taken */
	ck_assert_int_eq(reply(ctx, w, id + 100, &s100, TPT_MEM_PRIVATE), -ENOENT); /* not taken */
	ck_assert_int_eq(reply(ctx, w, id, &s100, TPT_MEM_PRIVATE), 0); /* at the limit */
	/* An answer descriptor freed unread drops it: nothing is outstanding then. */
	ck_assert_int_eq(tp_wq_answer_descriptor(q, &got, &d, T_MS), 0);
	ck_assert_int_eq(got, id);
	ck_assert_int_eq(tp_wq_descriptor_free(d), 0);
	ck_assert_int_eq(tp_wq_answer_descriptor(q, &got, &d, 0), -ENOMSG);
	ck_assert_int_eq(tp_wq_submit(q, bytes, 104, &got), 0); /* the room is back */
	tp_wq_release(w);
	tp_wq_release(q2);
	tp_wq_release(q);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&dm), 0);
}
END_TEST

/* A read the daemon refuses after the library consumed the descriptor is not -EINVAL, which
 * tells the caller it still holds the descriptor: here the worker's staging buffers are
 * refused (--buffer-bytes-max), so its reads go by CMA, and the worker then makes itself
 * non-dumpable. The first such read is refused (-EPERM) and turns CMA off for the session;
 * the next one, still planned with CMA, is refused by the daemon as invalid (-EINVAL there)
 * after tp_wq_read_msg() freed the descriptor. */
START_TEST(test_refused_read_does_not_leave_the_descriptor)
{
	static const char *const args[] = { "--buffer-bytes-max", "64K", NULL };
	const size_t len = 1u << 20;
	uint8_t *src = malloc(len), *dst = malloc(len);
	struct tp_payload pay = { .data = src, .length = len };
	struct tp_message m = { .payloads = &pay, .n_payloads = 1 };
	struct tp_descriptor *d;
	struct tp_context *ctx;
	struct tpt_daemon dm;
	struct tp_wq *q, *w;
	uint64_t id[2], got;
	struct tp_slot slot = { .device = { .type = TP_DEVICE_CPU }, .data = dst };
	struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };
	int r;

	ck_assert(src && dst);
	memset(src, 0x3c, len);
	ck_assert_int_eq(tpt_daemon_start(&dm, args), 0);
	ctx = ctx_new(&dm);
	ck_assert_ptr_nonnull(ctx);
	if (!tp_context_cma_ok(ctx)) {
		printf("skipped: the daemon offers no CMA here\n");
		goto out;
	}
	ck_assert_int_eq(wq_open(ctx, "refused", TP_WQ_CREATE, &q), 0);
	ck_assert_int_eq(wq_open(ctx, "refused", 0, &w), 0);
	for (unsigned i = 0; i < 2; i++)
		ck_assert_msg(tp_wq_submit_msg(q, &m, &id[i]) == 0, "submit: %s", tp_last_error());
	ck_assert_int_eq(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), 0); /* the forked case's own */
	for (unsigned i = 0; i < 2; i++) {
		ck_assert_int_eq(tp_wq_take_descriptor(w, &got, &d, T_MS), 0);
		ck_assert_int_eq(got, id[i]);
		r = tp_wq_read_msg(w, d, &a);
		ck_assert_msg(r < 0, "read %u: CMA into a non-dumpable process went through", i);
		ck_assert_msg(r != -EINVAL, "read %u: %d (%s) tells the caller to keep the "
			      "descriptor the library freed", i, r, tp_last_error());
	}
	ck_assert_int_eq(prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), 0);
	tp_wq_release(w);
	tp_wq_release(q);
out:
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&dm), 0);
	free(src);
	free(dst);
}
END_TEST

static Suite *wq_msg_suite(void)
{
	Suite *s = suite_create("wq_msg");
	TCase *tc = tcase_create("wq_msg");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_messages_round_trip_both_directions);
	tcase_add_test(tc, test_16m_plus_3);
	tcase_add_test(tc, test_killed_worker_message_requeued_once);
	tcase_add_test(tc, test_killed_worker_message_at_most_once);
	tcase_add_test(tc, test_bytes_and_messages_mix);
	tcase_add_test(tc, test_descriptor_counts_toward_limits);
	tcase_add_test(tc, test_refused_read_does_not_leave_the_descriptor);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(wq_msg_suite());
}
