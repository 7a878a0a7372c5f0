/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: work queue messages by reference across hosts (issue 25, peer minor 11;
 * docs/queues.md "Across hosts"). Two daemons on loopback; the queues live on b.
 * - An owner on a (created on b from a) and a worker on a (through b) and one on b: questions
 *   and answers of 16 MiB + 3, of one part and of several, from private memory and from shared
 *   buffers, go both ways byte for byte: a's submit and reply stream into b's item, b streams
 *   the question to a's worker and the answer to a's owner.
 * - A worker on a killed after taking and reading a question of 16 MiB + 3: the question is
 *   queued again exactly once and b's own worker reads it intact; with TP_WQ_AT_MOST_ONCE the
 *   owner gets -ECONNRESET with the question's id instead.
 * - Limits as on one host, with b's: chan-peer-bytes-max (bytes arriving over one link) just at
 *   and just above a question's bytes, wq-bytes-max refusing a second question that does not
 *   fit, -ENOBUFS naming the limit, the queue and the link going on.
 * - The hosting daemon killed after a worker on a took a large question's descriptor: the read
 *   fails with -ECONNRESET naming the host.
 * - A read from a naming more room than the question's bytes: refused by b before the item
 *   leaves, and a keeps no receive, nor mapping, of the worker's buffer once it is gone.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ipeer.h"
#include "itest.h"

#define T_MS 30000
#define CREATOR 4242
#define BIG ((16u << 20) + 3)

static struct tpt_daemon da, db;

/* Starts a and b; b lets a create queues (uid CREATOR) and takes @extra (NULL-terminated,
 * at most 6 entries) too. */
static void start_pair(const char *const *extra)
{
	static char timeout[16];
	const char *bb[16] = { "--chan-remote-create-uid", "4242", "--peer-timeout", timeout };
	size_t n = 4;

	snprintf(timeout, sizeof(timeout), "%d", TPT_PEER_TIMEOUT_MS);
	for (const char *const *a = extra; a && *a; a++)
		bb[n++] = *a;
	bb[n] = NULL;
	ck_assert_int_eq(tpt_daemon_pair_start(&da, tpt_peer_args(), &db, bb), 0);
}

static void stop_pair(void)
{
	tpt_daemon_stop(&da);
	tpt_daemon_stop(&db);
}

static struct tp_context *ctx_of(const struct tpt_daemon *d)
{
	struct tp_context *ctx = NULL;

	ck_assert_int_eq(tpt_ctx_new(d, 0, "xbig", &ctx), 0);
	return ctx;
}

/* Queue @name created on b by a client of a (its owner). */
static struct tp_wq *create_on_b(struct tp_context *ca, const char *name, unsigned flags)
{
	struct tp_wq_options o = { .size = sizeof(o), .flags = TP_WQ_CREATE | flags,
				   .owner_uid = -1 };
	struct tp_wq *q = NULL;

	ck_assert_msg(tp_wq_open(ca, tpt_peer_at(&db, name), &o, &q) == 0, "%s",
		      tp_last_error());
	return q;
}

/* A worker's handle of queue @name of uid CREATOR, on b (@remote false) or from a. */
static struct tp_wq *worker(struct tp_context *ctx, const char *name, bool remote)
{
	struct tp_wq_options o = { .size = sizeof(o), .owner_uid = CREATOR };
	struct tp_wq *q = NULL;

	ck_assert_msg(tp_wq_open(ctx, remote ? tpt_peer_at(&db, name) : name, &o, &q) == 0, "%s",
		      tp_last_error());
	return q;
}

/* The spec of question (@answer false) or answer @i: one part of BIG bytes, or (odd @i) a
 * payload, an empty one and a tensor of BIG bytes, with metadata. */
static struct tpt_msg_spec spec(unsigned i, bool answer)
{
	struct tpt_msg_spec s = { .pipe = answer ? 41 : 40, .index = i, .n_payloads = 1,
				  .lens = { BIG } };

	if (i & 1)
		s = (struct tpt_msg_spec){ .pipe = answer ? 41 : 40, .index = i, .n_payloads = 2,
					   .n_tensors = 1, .meta_len = 7, .seg_meta_len = 3,
					   .lens = { 5000 + i, 0, BIG } };
	return s;
}

static void submit(struct tp_context *ctx, struct tp_wq *own, const struct tpt_msg_spec *s,
		   enum tpt_mem mem, uint64_t *ret_id)
{
	struct tpt_msg m;

	ck_assert_int_eq(tpt_msg_build(ctx, s, mem, &m), 0);
	ck_assert_msg(tp_wq_submit_msg(own, &m.m, ret_id) == 0, "%s", tp_last_error());
	tpt_msg_free(ctx, &m);
}

/* Worker @w (of context @wc) takes question @id, checks it against @qs, answers @as; the owner
 * @own (of @oc) gets the answer, checked. All in memory of kind @mem. */
static void work(struct tp_context *oc, struct tp_wq *own, struct tp_context *wc, struct tp_wq *w,
		 uint64_t id, const struct tpt_msg_spec *qs, const struct tpt_msg_spec *as,
		 enum tpt_mem mem)
{
	struct tp_descriptor *d;
	struct tpt_msg m;
	uint64_t got;

	ck_assert_msg(tp_wq_take_descriptor(w, &got, &d, T_MS) == 0, "%s", tp_last_error());
	ck_assert_uint_eq(got, id);
	ck_assert_int_eq(tpt_wq_msg_read_check(wc, w, d, qs, mem), 0);
	ck_assert_int_eq(tpt_msg_build(wc, as, mem, &m), 0);
	ck_assert_msg(tp_wq_reply_msg(w, id, &m.m) == 0, "%s", tp_last_error());
	tpt_msg_free(wc, &m);
	ck_assert_msg(tp_wq_answer_descriptor(own, &got, &d, T_MS) == 0, "%s", tp_last_error());
	ck_assert_uint_eq(got, id);
	ck_assert_int_eq(tpt_wq_msg_read_check(oc, own, d, as, mem), 0);
}

/* _i 0: private memory, 1: shared buffers. Questions of 16 MiB + 3 from an owner on a, taken
 * by a worker on a (both ways over the link) and one on b; their answers of the same size back
 * to the owner; one part or several. */
START_TEST(test_large_messages_cross_hosts)
{
	enum tpt_mem mem = _i ? TPT_MEM_SHM : TPT_MEM_PRIVATE;
	struct tp_context *ca = NULL, *ca2, *cb;
	struct tp_wq *own, *w[2];
	uint64_t id;

	start_pair(NULL);
	ca = ctx_of(&da);
	ca2 = ctx_of(&da);
	cb = ctx_of(&db);
	own = create_on_b(ca, "big", 0);
	w[0] = worker(ca2, "big", true);
	w[1] = worker(cb, "big", false);
	for (unsigned i = 0; i < 4; i++) {
		struct tpt_msg_spec qs = spec(i, false), as = spec(i, true);

		submit(ca, own, &qs, mem, &id);
		work(ca, own, i < 2 ? ca2 : cb, w[i < 2 ? 0 : 1], id, &qs, &as, mem);
	}
	ck_assert_int_eq(tp_wq_drain(own, T_MS), 0);
	tp_wq_release(w[1]);
	tp_wq_release(w[0]);
	tp_wq_release(own);
	tp_context_free(ca);
	tp_context_free(ca2);
	tp_context_free(cb);
	stop_pair();
}
END_TEST

static const struct tpt_msg_spec killed_spec = { .pipe = 42, .n_payloads = 1, .lens = { BIG } };

/* Takes a question by descriptor and reads it intact (in the child of
 * tpt_wq_take_and_die()). */
static int take_big(struct tp_wq *q, uint64_t *ret_id)
{
	struct tp_descriptor *d;
	struct tp_slot slot = { .device = { .type = TP_DEVICE_CPU } };
	struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };
	int r = tp_wq_take_descriptor(q, ret_id, &d, T_MS);

	if (r < 0)
		return r;
	slot.data = malloc(BIG);
	if (!slot.data)
		return -ENOMEM;
	r = tp_wq_read_msg(q, d, &a);
	if (r == 0 && !tpt_verify(slot.data, BIG, tpt_seed(42, 0, 0), NULL))
		r = -EIO;
	free(slot.data);
	return r;
}

/* _i 0: a worker on a that took and read a question of 16 MiB + 3 is killed: the question is
 * queued again once, and b's worker reads it intact; 1: at-most-once, the owner gets
 * -ECONNRESET with its id. The owner is a local one of b. */
START_TEST(test_far_worker_killed_with_large_question)
{
	struct tp_wq_options o = { .size = sizeof(o), .flags = TP_WQ_CREATE, .owner_uid = -1,
				   .remote = TP_REMOTE_ANY_PEER };
	struct tp_wq_options wo = { .size = sizeof(wo), .owner_uid = -1 };
	struct tp_descriptor *d;
	struct tp_context *cb;
	struct tp_wq *own, *w;
	struct tpt_msg m;
	uint64_t id, taken, got;

	if (_i)
		o.flags |= TP_WQ_AT_MOST_ONCE;
	start_pair(NULL);
	cb = ctx_of(&db);
	ck_assert_int_eq(tp_wq_open(cb, "kq", &o, &own), 0);
	ck_assert_int_eq(tpt_msg_build(cb, &killed_spec, TPT_MEM_SHM, &m), 0);
	ck_assert_msg(tp_wq_submit_msg(own, &m.m, &id) == 0, "%s", tp_last_error());
	tpt_msg_free(cb, &m);
	taken = tpt_wq_take_and_die(&da, tpt_peer_at(&db, "kq"), take_big);
	ck_assert_uint_eq(taken, id);
	ck_assert_int_eq(tp_wq_open(cb, "kq", &wo, &w), 0);
	if (_i) {
		ck_assert_int_eq(tp_wq_answer_descriptor(own, &got, &d, T_MS), -ECONNRESET);
		ck_assert_uint_eq(got, id);
		ck_assert_int_eq(tp_wq_take_descriptor(w, &got, &d, 0), -EAGAIN);
	} else {
		ck_assert_msg(tp_wq_take_descriptor(w, &got, &d, T_MS) == 0, "%s", tp_last_error());
		ck_assert_uint_eq(got, id);
		ck_assert(tpt_ctl_lists(&db, "queues", "kq", "\"requeued\": 1"));
		ck_assert_int_eq(tpt_wq_msg_read_check(cb, w, d, &killed_spec, TPT_MEM_PRIVATE),
				 0);
	}
	tp_wq_release(w);
	tp_wq_release(own);
	tp_context_free(cb);
	stop_pair();
}
END_TEST

/* b's chan-peer-bytes-max is one question's bytes: a question of that many is taken, one of a
 * byte more refused with -ENOBUFS naming the limit; b's wq-bytes-max holds one such question
 * and its descriptor but not two: the second is refused with -ENOBUFS. Both ways the queue and
 * the link go on (a worker on a reads the first question intact). */
START_TEST(test_limits_just_at_and_above)
{
	static const char *const args[] = { "--chan-peer-bytes-max", "16777219", "--wq-bytes-max",
					    "33554432", NULL };
	struct tpt_msg_spec at = { .pipe = 43, .n_payloads = 1, .lens = { BIG } };
	struct tpt_msg_spec above = { .pipe = 43, .index = 1, .n_payloads = 1,
				      .lens = { BIG + 1 } };
	struct tp_context *ca, *ca2;
	struct tp_descriptor *d;
	struct tpt_link link;
	struct tpt_msg m;
	struct tp_wq *own, *w;
	uint64_t id, got;

	start_pair(args);
	ca = ctx_of(&da);
	ca2 = ctx_of(&da);
	own = create_on_b(ca, "lim", 0);
	w = worker(ca2, "lim", true);
	ck_assert_int_eq(tpt_msg_build(ca, &above, TPT_MEM_SHM, &m), 0);
	ck_assert_int_eq(tp_wq_submit_msg(own, &m.m, &id), -ENOBUFS);
	ck_assert_msg(strstr(tp_last_error(), "chan-peer-bytes-max 16777219"), "%s",
		      tp_last_error());
	tpt_msg_free(ca, &m);
	submit(ca, own, &at, TPT_MEM_SHM, &id);
	ck_assert_int_eq(tpt_msg_build(ca, &at, TPT_MEM_PRIVATE, &m), 0);
	ck_assert_int_eq(tp_wq_submit_msg(own, &m.m, &got), -ENOBUFS);
	ck_assert_msg(strstr(tp_last_error(), "wq-bytes-max"), "%s", tp_last_error());
	tpt_msg_free(ca, &m);
	ck_assert_msg(tp_wq_take_descriptor(w, &got, &d, T_MS) == 0, "%s", tp_last_error());
	ck_assert_uint_eq(got, id);
	ck_assert_int_eq(tpt_wq_msg_read_check(ca2, w, d, &at, TPT_MEM_PRIVATE), 0);
	ck_assert_msg(tpt_peer_links(&da, &link) == 1 && strcmp(link.state, "up") == 0,
		      "the link is %s: %s", link.state, link.last_error);
	tp_wq_release(w);
	tp_wq_release(own);
	tp_context_free(ca);
	tp_context_free(ca2);
	stop_pair();
}
END_TEST

/* The queue's host b is killed once a worker on a took a large question's descriptor: the read
 * fails with -ECONNRESET naming the host, no byte of it written. */
START_TEST(test_host_killed_fails_the_read)
{
	struct tpt_msg_spec qs = { .pipe = 44, .n_payloads = 1, .lens = { BIG } };
	struct tp_slot slot = { .device = { .type = TP_DEVICE_CPU } };
	struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };
	struct tp_wq_options o = { .size = sizeof(o), .flags = TP_WQ_CREATE, .owner_uid = -1,
				   .remote = TP_REMOTE_ANY_PEER };
	struct tp_wq_options wo = { .size = sizeof(wo), .owner_uid = 0 };
	struct tp_context *ca, *cb;
	struct tp_descriptor *d;
	struct tp_wq *own, *w;
	uint64_t id, got;

	start_pair(NULL);
	ca = ctx_of(&da);
	cb = ctx_of(&db);
	ck_assert_int_eq(tp_wq_open(cb, "hk", &o, &own), 0);
	ck_assert_msg(tp_wq_open(ca, tpt_peer_at(&db, "hk"), &wo, &w) == 0, "%s", tp_last_error());
	submit(cb, own, &qs, TPT_MEM_SHM, &id);
	ck_assert_msg(tp_wq_take_descriptor(w, &got, &d, T_MS) == 0, "%s", tp_last_error());
	slot.data = calloc(1, BIG);
	ck_assert_ptr_nonnull(slot.data);
	ck_assert_int_eq(tpt_daemon_kill(&db), 0);
	ck_assert_int_eq(tp_wq_read_msg(w, d, &a), -ECONNRESET);
	ck_assert_msg(strstr(tp_last_error(), "work queue host 127.0.0.1:"), "%s", tp_last_error());
	free(slot.data);
	tp_wq_release(w);
	tp_wq_release(own); /* its daemon is gone: the handle is freed all the same */
	tp_context_free(ca);
	tp_context_free(cb);
	tpt_daemon_stop(&da);
}
END_TEST

/*
 * A worker on a whose read of a 1 MiB + 3 question names more room than the message has (its
 * descriptor's length raised by 4 KiB: the library takes the caller's descriptor as it is) is
 * refused by the hosting daemon before the item leaves (naming both counts), and a
 * keeps nothing of it: three such workers come and go, and once they are gone a maps no
 * buffer of theirs. Before, b sent the item, a refused it (-EIO) and left its receive running,
 * holding the worker's buffer until the link failed.
 */
START_TEST(test_read_naming_more_room_is_refused)
{
	const unsigned len = (1u << 20) + 3;
	struct tpt_msg_spec qs = { .pipe = 45, .n_payloads = 1, .lens = { len } };
	struct tp_wq_options o = { .size = sizeof(o), .flags = TP_WQ_CREATE, .owner_uid = -1,
				   .remote = TP_REMOTE_ANY_PEER };
	struct tp_wq_options wo = { .size = sizeof(wo), .owner_uid = 0 };
	struct tp_context *cb, *ca;
	struct tp_wq *own, *w;
	int before, now = 0;
	uint64_t id, got;

	start_pair(NULL);
	cb = ctx_of(&db);
	ck_assert_int_eq(tp_wq_open(cb, "room", &o, &own), 0);
	submit(cb, own, &qs, TPT_MEM_SHM, &id);
	before = tpt_daemon_memfd_maps(&da);
	ck_assert_int_ge(before, 0);
	for (int k = 0; k < 3; k++) {
		struct tp_slot slot = { .device = { .type = TP_DEVICE_CPU } };
		struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };
		struct tp_descriptor *d;

		ca = ctx_of(&da);
		ck_assert_msg(tp_wq_open(ca, tpt_peer_at(&db, "room"), &wo, &w) == 0, "%s",
			      tp_last_error());
		ck_assert_msg(tp_wq_take_descriptor(w, &got, &d, T_MS) == 0, "%s", tp_last_error());
		ck_assert_uint_eq(got, id);
		((struct tp_payload_desc *)d->payloads)[0].length += 4096;
		slot.data = malloc(len + 4096);
		ck_assert_ptr_nonnull(slot.data);
		ck_assert_int_eq(tp_wq_read_msg(w, d, &a), -EIO); /* -EINVAL, taken all the same */
		ck_assert_msg(strstr(tp_last_error(), "1048579 bytes for a read's room of 1052675: "
				     "a read from another host names exactly"), "%s",
			      tp_last_error());
		free(slot.data);
		tp_wq_release(w); /* the question goes back to the queue on b */
		tp_context_free(ca);
	}
	for (int i = 0; i < 100 && (now = tpt_daemon_memfd_maps(&da)) > before; i++)
		usleep(50 * 1000);
	ck_assert_msg(now <= before, "a maps %d buffers of workers that are gone", now - before);
	/* the question is whole and still there: a worker on b reads it */
	ck_assert_int_eq(tp_wq_open(cb, "room", &wo, &w), 0);
	{
		struct tp_descriptor *d;

		ck_assert_msg(tp_wq_take_descriptor(w, &got, &d, T_MS) == 0, "%s", tp_last_error());
		ck_assert_uint_eq(got, id);
		ck_assert_int_eq(tpt_wq_msg_read_check(cb, w, d, &qs, TPT_MEM_SHM), 0);
	}
	tp_wq_release(w);
	tp_wq_release(own);
	tp_context_free(cb);
	stop_pair();
}
END_TEST

static Suite *xbig_suite(void)
{
	Suite *s = suite_create("wq_xbig");
	TCase *tc = tcase_create("xbig");

	tcase_set_timeout(tc, 240);
	tcase_add_loop_test(tc, test_large_messages_cross_hosts, 0, 2);
	tcase_add_loop_test(tc, test_far_worker_killed_with_large_question, 0, 2);
	tcase_add_test(tc, test_limits_just_at_and_above);
	tcase_add_test(tc, test_host_killed_fails_the_read);
	tcase_add_test(tc, test_read_naming_more_room_is_refused);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(xbig_suite());
}
