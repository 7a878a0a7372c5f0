/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: work queues created and owned from another host (issue 25 part xhost;
 * docs/queues.md "Across hosts"). Two daemons on loopback: a client of a opens
 * tpip://b/NAME with TP_WQ_CREATE. Without chan-remote-create-uid on b (the default) the
 * create is answered as for a missing queue and nothing is made. With chan-remote-create-uid
 * 4242 the queue is made on b, owned by uid 4242, and the client's handle is its owner: it
 * submits questions of up to the inline limit that workers on b and on a take byte-exact, gets
 * their answers (ids and bytes intact), drains and closes; an exclusive create again gets
 * -EADDRINUSE, b's wqs-per-uid holds for uid 4242 just at and just above. The owner's process
 * SIGKILLed closes the queue on b (its worker's take gets -EPIPE, the answer nobody received is
 * dropped and logged); the hosting daemon killed fails the owner's wait with -ECONNRESET, and
 * the owner's daemon killed closes the queue for b's worker, both within the peer timeout.
 * Payloads above what the far daemon's frames take (one daemon's inline-max raised above the
 * other's frame-max) are refused with -EMSGSIZE naming the limit, either way, the link staying
 * up (such a frame used to fail the whole link). Message questions and answers cross too,
 * inline, both ways byte for byte; one above the inline limit by reference.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ipeer.h"
#include "itest.h"

#define T_MS 30000
#define CREATOR 4242
#define INLINE (1u << 20) /* the daemons' default inline-max */

static struct tpt_daemon da, db;
static struct tpt_sync go;

static const char *const *b_args(void)
{
	static char timeout[16];
	static const char *args[] = { "--chan-remote-create-uid", "4242", "--wqs-per-uid", "2",
				      "--peer-timeout", timeout, NULL };

	snprintf(timeout, sizeof(timeout), "%d", TPT_PEER_TIMEOUT_MS);
	return args;
}

static void start_pair(bool allow)
{
	ck_assert_int_eq(tpt_daemon_pair_start(&da, tpt_peer_args(), &db,
					       allow ? b_args() : tpt_peer_args()), 0);
}

/* As start_pair(true), with frames of 16 MiB and payloads of 8 MiB on a (@big_a) or on b. */
static void start_pair_big(bool big_a)
{
	static const char *big[] = { "--frame-max", "16777216", "--inline-max", "8388608", NULL };
	const char *bb[16];
	size_t n = 0;

	for (const char *const *a = b_args(); *a; a++)
		bb[n++] = *a;
	if (!big_a)
		for (const char **a = big; *a; a++)
			bb[n++] = *a;
	bb[n] = NULL;
	ck_assert_int_eq(tpt_daemon_pair_start(&da, big_a ? big : tpt_peer_args(), &db, bb), 0);
}

static struct tp_context *ctx_of(const struct tpt_daemon *d)
{
	struct tp_context *ctx = NULL;

	ck_assert_int_eq(tpt_ctx_new(d, 0, "xown", &ctx), 0);
	return ctx;
}

static const char *at(const char *name)
{
	return tpt_peer_at(&db, name);
}

/* Does b's `tpipctl --json queues` list @name (with @field in its row, if given)? */
static bool b_lists(const char *name, const char *field)
{
	return tpt_ctl_lists(&db, "queues", name, field);
}

static struct tp_wq *create_on_b(struct tp_context *ca, const char *name, unsigned flags)
{
	struct tp_wq_options o = { .size = sizeof(o), .flags = TP_WQ_CREATE | flags,
				   .owner_uid = -1 };
	struct tp_wq *q = NULL;

	ck_assert_msg(tp_wq_open(ca, at(name), &o, &q) == 0, "%s", tp_last_error());
	return q;
}

/* A worker's handle of queue @name of uid CREATOR, on b (@remote false) or from a. */
static struct tp_wq *worker(struct tp_context *ctx, const char *name, bool remote)
{
	struct tp_wq_options o = { .size = sizeof(o), .owner_uid = CREATOR };
	struct tp_wq *q = NULL;

	ck_assert_msg(tp_wq_open(ctx, remote ? at(name) : name, &o, &q) == 0, "%s",
		      tp_last_error());
	ck_assert(!tp_wq_is_owner(q));
	return q;
}

static void *pattern(size_t len, uint64_t seed)
{
	void *p = malloc(len);

	ck_assert_ptr_nonnull(p);
	tpt_fill(p, len, seed);
	return p;
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

START_TEST(test_remote_create_refused_by_default)
{
	struct tp_wq_options o = { .size = sizeof(o), .flags = TP_WQ_CREATE, .owner_uid = -1 };
	struct tp_context *ca;
	struct tp_wq *q = NULL;

	start_pair(false);
	ca = ctx_of(&da);
	ck_assert_int_eq(tp_wq_open(ca, at("made"), &o, &q), -ENOENT);
	ck_assert_msg(strstr(tp_last_error(), "creates none for other hosts"), "%s",
		      tp_last_error());
	ck_assert(!b_lists("made", NULL));
	tp_context_free(ca);
	tpt_daemon_stop(&da);
	tpt_daemon_stop(&db);
}
END_TEST

/* One question of @qlen bytes from @own, taken by @w, answered with @alen bytes. */
static void round_trip(struct tp_wq *own, struct tp_wq *w, size_t qlen, size_t alen, uint64_t seed)
{
	void *qd = pattern(qlen, seed), *ad = pattern(alen, seed + 1), *got;
	uint64_t id, taken, answered;
	size_t len, off = 0;

	ck_assert_msg(tp_wq_submit(own, qd, qlen, &id) == 0, "%s", tp_last_error());
	ck_assert_msg(tp_wq_take(w, &taken, &got, &len, T_MS) == 0, "%s", tp_last_error());
	ck_assert_uint_eq(taken, id);
	ck_assert_uint_eq(len, qlen);
	ck_assert_msg(tpt_verify(got, len, seed, &off), "question differs at %zu", off);
	free(got);
	ck_assert_msg(tp_wq_reply(w, taken, ad, alen) == 0, "%s", tp_last_error());
	ck_assert_msg(tp_wq_answer(own, &answered, &got, &len, T_MS) == 0, "%s", tp_last_error());
	ck_assert_uint_eq(answered, id);
	ck_assert_uint_eq(len, alen);
	ck_assert_msg(tpt_verify(got, len, seed + 1, &off), "answer differs at %zu", off);
	free(got);
	free(qd);
	free(ad);
}

START_TEST(test_remote_owner_works_the_queue)
{
	struct tp_context *ca, *ca2, *cb;
	struct tp_wq *own, *wb, *wa, *second, *third = NULL;
	struct tp_wq_options o = { .size = sizeof(o), .flags = TP_WQ_CREATE | TP_WQ_EXCL,
				   .owner_uid = -1 };
	char big[INLINE + 1] = { 0 };
	uint64_t id;
	void *got;
	size_t len;

	start_pair(true);
	ca = ctx_of(&da);
	ca2 = ctx_of(&da);
	cb = ctx_of(&db);
	own = create_on_b(ca, "jobs", 0);
	ck_assert(tp_wq_is_owner(own));
	ck_assert(b_lists("jobs", "\"uid\": 4242"));
	wb = worker(cb, "jobs", false);
	wa = worker(ca2, "jobs", true); /* the creating link may open it as a worker too */
	ck_assert(b_lists("jobs", "\"owner_pid\": 0"));
	ck_assert(b_lists("jobs", "\"workers\": 2"));
	ck_assert(b_lists("jobs", "\"remote_workers\": 1")); /* a's worker, not its owner */
	ck_assert(b_lists("jobs", "\"owner_host\": \"")); /* the link's name */
	ck_assert(!b_lists("jobs", "\"owner_host\": \"\""));
	round_trip(own, wb, 1000, 3000, 10);
	round_trip(own, wa, INLINE, INLINE, 20); /* just at the inline limit, both ways */
	round_trip(own, wb, 65536 + 7, 1, 30);
	ck_assert_int_eq(tp_wq_submit(own, big, INLINE + 1, &id), -EMSGSIZE); /* just above */
	ck_assert_int_eq(tp_wq_drain(own, T_MS), 0);
	ck_assert_int_eq(tp_wq_answer(own, &id, &got, &len, 0), -ENOMSG);
	ck_assert_int_eq(tp_wq_open(ca, at("jobs"), &o, &second), -EADDRINUSE);
	/* wqs-per-uid 2 for uid 4242: a second queue just fits, a third not */
	second = create_on_b(ca, "second", 0);
	o.flags = TP_WQ_CREATE;
	ck_assert_int_eq(tp_wq_open(ca, at("third"), &o, &third), -ENOBUFS);
	ck_assert(!b_lists("third", NULL));
	/* only the owner's handle owns */
	ck_assert_int_eq(tp_wq_submit(wa, "x", 1, &id), -EACCES);
	ck_assert_int_eq(tp_wq_close(own), 0);
	ck_assert_int_eq(tp_wq_take(wb, &id, &got, &len, T_MS), -EPIPE);
	ck_assert_int_eq(tp_wq_take(wa, &id, &got, &len, T_MS), -EPIPE);
	ck_assert_int_eq(tp_wq_release(own), 0); /* the owner's release frees it */
	ck_assert(!b_lists("jobs", NULL));
	ck_assert_int_eq(tp_wq_release(second), 0);
	third = create_on_b(ca, "third", 0); /* the slots came back */
	tp_wq_release(third);
	tp_wq_release(wa);
	tp_wq_release(wb);
	tp_context_free(ca);
	tp_context_free(ca2);
	tp_context_free(cb);
	tpt_daemon_stop(&da);
	tpt_daemon_stop(&db);
}
END_TEST

/* Message questions and answers cross hosts (peer minor 9), inline: from an owner on a to a
 * worker on b and one on a (through b), multi-part, from private memory and shared buffers,
 * both ways byte for byte; a message above the inline limit goes by reference (peer minor 11)
 * and a worker on a reads it intact. */
START_TEST(test_messages_cross_hosts)
{
	static const enum tpt_mem mems[] = { TPT_MEM_PRIVATE, TPT_MEM_SHM };
	struct tp_context *ca = NULL, *ca2, *cb;
	struct tp_descriptor *d;
	struct tp_wq *own, *w[2];
	struct tpt_msg m;
	uint64_t id, got;

	start_pair(true);
	ca = ctx_of(&da);
	ca2 = ctx_of(&da);
	cb = ctx_of(&db);
	own = create_on_b(ca, "msgs", 0);
	w[0] = worker(cb, "msgs", false);
	w[1] = worker(ca2, "msgs", true);
	for (unsigned i = 0; i < 4; i++) {
		struct tpt_msg_spec qs = { .pipe = 20, .index = i, .n_payloads = 2, .n_tensors = 1,
					   .meta_len = 5, .seg_meta_len = 2,
					   .lens = { 1000 * i + 1, 0, i ? 70000 : 3 } };
		struct tpt_msg_spec as = qs;
		struct tp_context *wc = i & 1 ? ca2 : cb;

		as.pipe = 21;
		ck_assert_int_eq(tpt_msg_build(ca, &qs, mems[i / 2], &m), 0);
		ck_assert_msg(tp_wq_submit_msg(own, &m.m, &id) == 0, "%s", tp_last_error());
		tpt_msg_free(ca, &m);
		ck_assert_msg(tp_wq_take_descriptor(w[i & 1], &got, &d, T_MS) == 0, "%s",
			      tp_last_error());
		ck_assert_uint_eq(got, id);
		ck_assert_int_eq(tpt_wq_msg_read_check(wc, w[i & 1], d, &qs, mems[i / 2]), 0);
		ck_assert_int_eq(tpt_msg_build(wc, &as, mems[i / 2], &m), 0);
		ck_assert_msg(tp_wq_reply_msg(w[i & 1], id, &m.m) == 0, "%s", tp_last_error());
		tpt_msg_free(wc, &m);
		ck_assert_msg(tp_wq_answer_descriptor(own, &got, &d, T_MS) == 0, "%s",
			      tp_last_error());
		ck_assert_uint_eq(got, id);
		ck_assert_int_eq(tpt_wq_msg_read_check(ca, own, d, &as, mems[i / 2]), 0);
	}
	struct tpt_msg_spec big = { .pipe = 22, .n_payloads = 1, .lens = { INLINE + 1 } };

	/* Above the inline limit: by reference over the data connections (peer minor 11,
	 * test_wq_xbig.c); it used to be refused. */
	ck_assert_int_eq(tpt_msg_build(ca, &big, TPT_MEM_SHM, &m), 0);
	ck_assert_msg(tp_wq_submit_msg(own, &m.m, &id) == 0, "%s", tp_last_error());
	tpt_msg_free(ca, &m);
	ck_assert_msg(tp_wq_take_descriptor(w[1], &got, &d, T_MS) == 0, "%s", tp_last_error());
	ck_assert_uint_eq(got, id);
	ck_assert_int_eq(tpt_wq_msg_read_check(ca2, w[1], d, &big, TPT_MEM_PRIVATE), 0);
	ck_assert_int_eq(tp_wq_reply(w[1], id, "a", 1), 0);
	ck_assert_int_eq(tp_wq_drain(own, T_MS), 0);
	tp_wq_release(w[1]);
	tp_wq_release(w[0]);
	tp_wq_release(own);
	tp_context_free(ca);
	tp_context_free(ca2);
	tp_context_free(cb);
	tpt_daemon_stop(&da);
	tpt_daemon_stop(&db);
}
END_TEST

/* The owner's process on a: creates "kq" on b, submits two questions, then waits to die. */
static int owner_proc(void *arg)
{
	struct tp_context *ca;
	struct tp_wq *q;
	uint64_t id;

	(void)arg;
	TPT_REQUIRE(tpt_ctx_new(&da, 0, "owner", &ca) == 0, 1, "context: %s", tp_last_error());
	q = create_on_b(ca, "kq", 0);
	TPT_REQUIRE(tp_wq_submit(q, "q1", 2, &id) == 0, 1, "submit: %s", tp_last_error());
	TPT_REQUIRE(tp_wq_submit(q, "q2", 2, &id) == 0, 1, "submit: %s", tp_last_error());
	TPT_REQUIRE(tpt_sync_post(&go, 1) == 0, 1, "post");
	pause();
	return 1;
}

START_TEST(test_remote_owner_killed_closes_the_queue)
{
	struct tp_context *cb;
	struct tp_wq *w;
	uint64_t id;
	void *got;
	size_t len;
	pid_t pid;
	int64_t t0;

	ck_assert_int_eq(tpt_sync_init(&go), 0);
	start_pair(true);
	pid = tpt_fork(owner_proc, NULL);
	ck_assert_int_gt(pid, 0);
	ck_assert_int_eq(tpt_sync_wait(&go, T_MS), 1);
	cb = ctx_of(&db);
	w = worker(cb, "kq", false);
	ck_assert_int_eq(tp_wq_take(w, &id, &got, &len, T_MS), 0);
	ck_assert(len == 2 && memcmp(got, "q1", 2) == 0);
	free(got);
	ck_assert_int_eq(tp_wq_reply(w, id, "a1", 2), 0); /* an answer the owner never receives */
	ck_assert(b_lists("kq", "\"answers\": 1"));
	ck_assert_int_eq(kill(pid, SIGKILL), 0);
	tpt_wait(pid, T_MS, NULL);
	t0 = now_ms();
	ck_assert_int_eq(tpt_daemon_wait_log(&db, "its owner is gone, 1 answers for it dropped",
					     T_MS, NULL, 0), 0);
	ck_assert_int_lt(now_ms() - t0, TPT_PEER_TIMEOUT_MS);
	ck_assert(!b_lists("kq", NULL));
	/* q2 was queued: gone with its owner; the take sees the queue closed */
	ck_assert_int_eq(tp_wq_take(w, &id, &got, &len, T_MS), -EPIPE);
	ck_assert_int_eq(tp_wq_reply(w, id, "a2", 2), -EPIPE);
	tp_wq_release(w);
	tp_context_free(cb);
	tpt_daemon_stop(&da);
	tpt_daemon_stop(&db);
	tpt_sync_done(&go);
}
END_TEST

/* _i 0: b (the queue's host) is killed: the owner's wait on a fails with -ECONNRESET naming b;
 * 1: a (the owner's daemon) is killed: the queue closes on b and its worker's take fails. */
START_TEST(test_link_cut_fails_owner_and_workers)
{
	struct tp_context *ca, *cb;
	struct tp_wq *own, *w;
	uint64_t id;
	void *got;
	size_t len;
	int64_t t0;

	start_pair(true);
	ca = ctx_of(&da);
	cb = ctx_of(&db);
	own = create_on_b(ca, "cut", 0);
	w = worker(cb, "cut", false);
	ck_assert_int_eq(tp_wq_submit(own, "q", 1, &id), 0);
	ck_assert_int_eq(tp_wq_take(w, &id, &got, &len, T_MS), 0);
	free(got);
	t0 = now_ms();
	if (_i == 0) {
		ck_assert_int_eq(tpt_daemon_kill(&db), 0);
		ck_assert_int_eq(tp_wq_answer(own, &id, &got, &len, T_MS), -ECONNRESET);
		ck_assert_msg(strstr(tp_last_error(), "work queue host 127.0.0.1:"), "%s",
			      tp_last_error());
		ck_assert_int_eq(tp_wq_submit(own, "q", 1, &id), -ECONNRESET);
	} else {
		ck_assert_int_eq(tpt_daemon_kill(&da), 0);
		ck_assert_int_eq(tp_wq_take(w, &id, &got, &len, T_MS), -EPIPE);
		ck_assert_int_eq(tp_wq_reply(w, id, "a", 1), -EPIPE);
		ck_assert(!b_lists("cut", NULL));
	}
	ck_assert_int_lt(now_ms() - t0, 3 * TPT_PEER_TIMEOUT_MS + 5000);
	tp_wq_release(own);
	tp_wq_release(w);
	tp_context_free(ca);
	tp_context_free(cb);
	if (_i == 0)
		tpt_daemon_stop(&da);
	else
		tpt_daemon_stop(&db);
}
END_TEST

/* The link stays up between a and b. */
static void link_up(void)
{
	struct tpt_link link;

	ck_assert_msg(tpt_peer_links(&da, &link) == 1 && strcmp(link.state, "up") == 0,
		      "the link is %s: %s", link.state, link.last_error);
}

/* Payloads above what the far daemon's frames take (its frame-max less 64 KiB, 4 MiB by
 * default) while the sender's daemon takes 8 MiB: refused with -EMSGSIZE naming the limit, the
 * link up, smaller ones pass. _i 0: a's client sends them (a question, a reply): refused by a;
 * 1: b's clients send them to a's (an answer to a's owner, a question a's worker takes):
 * refused by b, the question staying queued for b's own worker. */
START_TEST(test_payload_above_the_far_frames_is_refused)
{
	const size_t huge = 5u << 20, fine = 1u << 20;
	struct tp_wq_options lo = { .size = sizeof(lo), .flags = TP_WQ_CREATE, .owner_uid = -1,
				    .remote = TP_REMOTE_ANY_PEER };
	struct tp_wq_options lw = { .size = sizeof(lw), .owner_uid = 0 };
	struct tp_context *ca, *cb;
	struct tp_wq *own, *wb, *lown, *wa, *wl;
	void *big = pattern(huge, 40), *got;
	uint64_t id, taken;
	size_t len;

	start_pair_big(_i == 0);
	ca = ctx_of(&da);
	cb = ctx_of(&db);
	own = create_on_b(ca, "big", 0);
	wb = worker(cb, "big", false);
	ck_assert_int_eq(tp_wq_open(cb, "lq", &lo, &lown), 0); /* b's own, root's */
	ck_assert_msg(tp_wq_open(ca, at("lq"), &lw, &wa) == 0, "%s", tp_last_error());
	ck_assert_int_eq(tp_wq_open(cb, "lq", &lw, &wl), 0);
	if (_i == 0) {
		ck_assert_int_eq(tp_wq_submit(own, big, huge, &id), -EMSGSIZE);
		ck_assert_msg(strstr(tp_last_error(), "is above the 4128768 that cross to it"),
			      "%s", tp_last_error());
		ck_assert_int_eq(tp_wq_submit(lown, "q", 1, &id), 0);
		ck_assert_int_eq(tp_wq_take(wa, &taken, &got, &len, T_MS), 0);
		free(got);
		ck_assert_int_eq(tp_wq_reply(wa, taken, big, huge), -EMSGSIZE);
		ck_assert_int_eq(tp_wq_reply(wa, taken, big, fine), 0);
		ck_assert_int_eq(tp_wq_answer(lown, &id, &got, &len, T_MS), 0);
		ck_assert(len == fine && tpt_verify(got, len, 40, NULL));
		free(got);
	} else {
		ck_assert_int_eq(tp_wq_submit(own, "q", 1, &id), 0);
		ck_assert_int_eq(tp_wq_take(wb, &taken, &got, &len, T_MS), 0);
		free(got);
		ck_assert_int_eq(tp_wq_reply(wb, taken, big, huge), -EMSGSIZE);
		ck_assert_msg(strstr(tp_last_error(), "an answer of 5242880 bytes is above the "
				     "4128768 that cross to"), "%s", tp_last_error());
		ck_assert_int_eq(tp_wq_reply(wb, taken, big, fine), 0); /* still taken: answered */
		ck_assert_int_eq(tp_wq_answer(own, &id, &got, &len, T_MS), 0);
		ck_assert(id == taken && len == fine && tpt_verify(got, len, 40, NULL));
		free(got);
		ck_assert_int_eq(tp_wq_submit(lown, big, huge, &id), 0);
		ck_assert_int_eq(tp_wq_take(wa, &taken, &got, &len, T_MS), -EMSGSIZE);
		ck_assert_msg(strstr(tp_last_error(), "the oldest question of 5242880 bytes"), "%s",
			      tp_last_error());
		ck_assert_int_eq(tp_wq_take(wl, &taken, &got, &len, T_MS), 0); /* b's worker can */
		ck_assert(taken == id && len == huge && tpt_verify(got, len, 40, NULL));
		free(got);
	}
	link_up();
	round_trip(own, wb, fine, fine, 50);
	tp_wq_release(wa);
	tp_wq_release(wl);
	tp_wq_release(lown);
	tp_wq_release(wb);
	tp_wq_release(own);
	free(big);
	tp_context_free(ca);
	tp_context_free(cb);
	tpt_daemon_stop(&da);
	tpt_daemon_stop(&db);
}
END_TEST

static Suite *xown_suite(void)
{
	Suite *s = suite_create("wq_xown");
	TCase *tc = tcase_create("xown");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_remote_create_refused_by_default);
	tcase_add_test(tc, test_remote_owner_works_the_queue);
	tcase_add_test(tc, test_messages_cross_hosts);
	tcase_add_test(tc, test_remote_owner_killed_closes_the_queue);
	tcase_add_loop_test(tc, test_link_cut_fails_owner_and_workers, 0, 2);
	tcase_add_loop_test(tc, test_payload_above_the_far_frames_is_refused, 0, 2);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(xown_suite());
}
