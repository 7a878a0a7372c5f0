/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: work queues hosted by the daemon (docs/queues.md), after torch-ipc's
 * workqueue tests. Workers in several processes answer every question exactly once; a worker
 * SIGKILLed with a question taken has it queued again exactly once (at-most-once: answered with
 * -ECONNRESET, never queued again); the owner SIGKILLed closes the queue (workers see -EPIPE,
 * the name is free again); drain waits for taken questions; a reply to an id the handle did not
 * take is refused; the limits per uid and per queue just below and just above, and answers
 * still flow while submits are refused; another uid is refused a private queue and cannot take
 * from or answer to it.
 */
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"

#define T_MS 30000
#define NOBODY 65534
#define N_QUESTIONS 40
#define N_WORKERS 3

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

	if (tpt_ctx_new(d, 0, "wq", &ctx) < 0)
		return NULL;
	return ctx;
}

static int wq_open(struct tp_context *ctx, const char *name, unsigned flags, struct tp_wq **ret)
{
	struct tp_wq_options o = { .size = sizeof(o), .flags = flags, .owner_uid = -1 };

	return tp_wq_open(ctx, name, &o, ret);
}

static int submit_u32(struct tp_wq *q, uint32_t v, uint64_t *ret_id)
{
	return tp_wq_submit(q, &v, sizeof(v), ret_id);
}

/* Takes (or with @answer receives an answer) one 4-byte payload. */
static int get_u32(struct tp_wq *q, bool answer, uint64_t *ret_id, uint32_t *ret, int timeout_ms)
{
	void *p = NULL;
	size_t len = 0;
	int r = answer ? tp_wq_answer(q, ret_id, &p, &len, timeout_ms) :
			 tp_wq_take(q, ret_id, &p, &len, timeout_ms);

	if (r == 0) {
		if (len != sizeof(*ret))
			r = -EPROTO;
		else
			memcpy(ret, p, sizeof(*ret));
	}
	free(p);
	return r;
}

/* `tpipctl queues --json` on @d: field @key of queue @name (-1 if absent). */
static long ctl_field(const struct tpt_daemon *d, const char *name, const char *key)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", d->socket, "--json", "queues", NULL };
	struct tpt_cmd_result res;
	struct json_object *root, *arr, *v;
	long out = -1;

	ck_assert_msg(bin && *bin, "TPIPCTL_BIN is not set");
	ck_assert_int_eq(tpt_run(argv, T_MS, &res), 0);
	ck_assert_msg(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0, "tpipctl: %s",
		      res.err);
	root = json_tokener_parse(res.out);
	ck_assert_ptr_nonnull(root);
	ck_assert(json_object_object_get_ex(root, "queues", &arr));
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *c = json_object_array_get_idx(arr, i), *n;

		if (json_object_object_get_ex(c, "name", &n) &&
		    strcmp(json_object_get_string(n), name) == 0 &&
		    json_object_object_get_ex(c, key, &v))
			out = json_object_get_int64(v);
	}
	json_object_put(root);
	tpt_cmd_result_free(&res);
	return out;
}

/* ---- workers in several processes ---------------------------------------------------------- */

static int worker(void *arg)
{
	const char *name = arg;
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	struct tp_wq *q;
	uint64_t id;
	uint32_t v;
	int r;

	TPT_REQUIRE(ctx, 1, "context");
	TPT_REQUIRE(wq_open(ctx, name, 0, &q) == 0, 1, "open: %s", tp_last_error());
	TPT_REQUIRE(!tp_wq_is_owner(q), 1, "a worker is not the owner");
	while ((r = get_u32(q, false, &id, &v, T_MS)) == 0) {
		v *= 2;
		TPT_REQUIRE(tp_wq_reply(q, id, &v, sizeof(v)) == 0, 1, "reply: %s",
			    tp_last_error());
	}
	TPT_REQUIRE(r == -EPIPE, 1, "take ends with %d, not -EPIPE", r);
	tp_wq_release(q);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_workers_in_processes)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	uint64_t ids[N_QUESTIONS], id;
	bool seen[N_QUESTIONS] = { false };
	pid_t pids[N_WORKERS];
	struct tp_wq *q;
	uint32_t v;

	ck_assert_ptr_nonnull(ctx);
	ck_assert_int_eq(wq_open(ctx, "work", TP_WQ_CREATE | TP_WQ_EXCL, &q), 0);
	ck_assert(tp_wq_is_owner(q));
	for (uint32_t i = 0; i < N_QUESTIONS; i++)
		ck_assert_int_eq(submit_u32(q, i, &ids[i]), 0);
	for (int i = 0; i < N_WORKERS; i++)
		pids[i] = tpt_fork(worker, (void *)"work");
	ck_assert_int_eq(tp_wq_drain(q, T_MS), 0);
	ck_assert_int_eq(tp_wq_close(q), 0);
	ck_assert_int_eq(tp_wq_close(q), 0); /* idempotent */
	for (int i = 0; i < N_QUESTIONS; i++) {
		ck_assert_int_eq(get_u32(q, true, &id, &v, 0), 0);
		ck_assert(v % 2 == 0 && v / 2 < N_QUESTIONS && !seen[v / 2]);
		ck_assert(ids[v / 2] == id);
		seen[v / 2] = true;
	}
	ck_assert_int_eq(get_u32(q, true, &id, &v, 0), -ENOMSG);
	ck_assert_int_eq(submit_u32(q, 1, &id), -EPIPE);
	for (int i = 0; i < N_WORKERS; i++)
		ck_assert(tpt_wait_ok(pids[i], T_MS, "worker"));
	tp_wq_release(q);
	tp_context_free(ctx);
}
END_TEST

/* ---- deaths -------------------------------------------------------------------------------- */

static int take_u32(struct tp_wq *q, uint64_t *ret_id)
{
	uint32_t v;

	return get_u32(q, false, ret_id, &v, T_MS);
}

static uint64_t take_and_die(const char *name)
{
	return tpt_wq_take_and_die(&tpt_fixture_daemon, name, take_u32);
}

START_TEST(test_killed_worker_requeued_once)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	struct tp_wq *q, *w;
	uint64_t id, got;
	uint32_t v;

	ck_assert_int_eq(wq_open(ctx, "alo", TP_WQ_CREATE, &q), 0);
	ck_assert_int_eq(wq_open(ctx, "alo", 0, &w), 0);
	ck_assert_int_eq(submit_u32(q, 77, &id), 0);
	ck_assert_int_eq(take_and_die("alo"), id);
	ck_assert_int_eq(take_and_die("alo"), id); /* once per death */
	ck_assert_int_eq(get_u32(w, false, &got, &v, T_MS), 0);
	ck_assert_int_eq(got, id);
	ck_assert_int_eq(v, 77);
	/* The take above came after both deaths were handled (each requeued it). */
	ck_assert_int_eq(ctl_field(&tpt_fixture_daemon, "alo", "requeued"), 2);
	ck_assert_int_eq(ctl_field(&tpt_fixture_daemon, "alo", "taken"), 1);
	ck_assert_int_eq(ctl_field(&tpt_fixture_daemon, "alo", "queued"), 0);
	ck_assert_int_eq(ctl_field(&tpt_fixture_daemon, "alo", "workers"), 1);
	ck_assert_int_eq(get_u32(w, false, &got, &v, 0), -EAGAIN); /* exactly once */
	ck_assert_int_eq(tp_wq_reply(w, id, &v, sizeof(v)), 0);
	ck_assert_int_eq(get_u32(q, true, &got, &v, T_MS), 0);
	ck_assert_int_eq(got, id);
	ck_assert_int_eq(get_u32(q, true, &got, &v, 0), -ENOMSG);
	tp_wq_release(w);
	tp_wq_release(q);
	tp_context_free(ctx);
}
END_TEST

START_TEST(test_killed_worker_at_most_once)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	struct tp_wq *q, *w;
	uint64_t id, got = 0;
	void *p = (void *)1;
	size_t len = 1;
	uint32_t v;

	ck_assert_int_eq(wq_open(ctx, "amo", TP_WQ_CREATE | TP_WQ_AT_MOST_ONCE, &q), 0);
	ck_assert_int_eq(wq_open(ctx, "amo", 0, &w), 0);
	ck_assert_int_eq(submit_u32(q, 5, &id), 0);
	ck_assert_int_eq(take_and_die("amo"), id);
	ck_assert_int_eq(tp_wq_answer(q, &got, &p, &len, T_MS), -ECONNRESET);
	ck_assert_int_eq(got, id);
	ck_assert_ptr_null(p);
	ck_assert_int_eq(get_u32(w, false, &got, &v, 0), -EAGAIN); /* never queued again */
	ck_assert_int_eq(tp_wq_drain(q, 0), 0);
	tp_wq_release(w);
	tp_wq_release(q);
	tp_context_free(ctx);
}
END_TEST

static int owner(void *arg)
{
	int fd = *(int *)arg;
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	struct tp_wq *q;
	uint64_t id;

	TPT_REQUIRE(ctx, 1, "context");
	TPT_REQUIRE(wq_open(ctx, "owned", TP_WQ_CREATE, &q) == 0, 1, "create");
	TPT_REQUIRE(submit_u32(q, 1, &id) == 0, 1, "submit");
	TPT_REQUIRE(write(fd, &id, sizeof(id)) == sizeof(id), 1, "write");
	for (;;)
		pause();
	return 0;
}

START_TEST(test_owner_killed_closes)
{
	struct tp_context *ctx;
	struct tp_wq *w, *again;
	int fds[2], status;
	uint64_t id;
	uint32_t v;
	pid_t pid;

	ck_assert_int_eq(pipe(fds), 0);
	pid = tpt_fork(owner, &fds[1]);
	close(fds[1]);
	ck_assert_int_eq(read(fds[0], &id, sizeof(id)), sizeof(id));
	close(fds[0]);
	/* Made after the fork: a child forked while a context's thread runs may inherit a lock
	 * that thread held (the allocator's, under ASan) and hang. */
	ctx = ctx_new(&tpt_fixture_daemon);
	ck_assert_ptr_nonnull(ctx);
	ck_assert_int_eq(wq_open(ctx, "owned", 0, &w), 0);
	ck_assert_int_eq(get_u32(w, false, &id, &v, T_MS), 0);
	ck_assert_int_eq(kill(pid, SIGKILL), 0);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	/* Nothing is queued: this take waits until the daemon sees the owner die. */
	ck_assert_int_eq(get_u32(w, false, &id, &v, T_MS), -EPIPE);
	ck_assert_int_eq(tp_wq_reply(w, id, &v, sizeof(v)), -EPIPE);
	ck_assert_int_eq(wq_open(ctx, "owned", TP_WQ_CREATE | TP_WQ_EXCL, &again), 0);
	tp_wq_release(again);
	tp_wq_release(w);
	ck_assert(tpt_daemon_alive(&tpt_fixture_daemon));
	tp_context_free(ctx);
}
END_TEST

/* ---- one process ----------------------------------------------------------------------------- */

START_TEST(test_drain_waits_for_taken)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	struct tp_wq *q, *w;
	uint64_t a, b, got;
	uint32_t v;

	ck_assert_int_eq(wq_open(ctx, "dr", TP_WQ_CREATE, &q), 0);
	ck_assert_int_eq(wq_open(ctx, "dr", 0, &w), 0);
	ck_assert_int_eq(tp_wq_drain(q, 0), 0); /* nothing submitted */
	ck_assert_int_eq(submit_u32(q, 1, &a), 0);
	ck_assert_int_eq(submit_u32(q, 2, &b), 0);
	ck_assert_int_eq(get_u32(w, false, &got, &v, 0), 0);
	ck_assert_int_eq(got, a);
	ck_assert_int_eq(get_u32(w, false, &got, &v, 0), 0);
	ck_assert_int_eq(got, b);
	ck_assert_int_eq(tp_wq_drain(q, 0), -EAGAIN); /* both taken, none answered */
	ck_assert_int_eq(tp_wq_drain(q, 50), -ETIMEDOUT);
	ck_assert_int_eq(tp_wq_reply(w, a, &v, sizeof(v)), 0);
	ck_assert_int_eq(tp_wq_drain(q, 0), -EAGAIN);
	ck_assert_int_eq(tp_wq_reply(w, b, &v, sizeof(v)), 0);
	ck_assert_int_eq(tp_wq_drain(q, T_MS), 0);
	ck_assert_int_eq(get_u32(q, false, &got, &v, 0), -EAGAIN);
	tp_wq_release(w);
	tp_wq_release(q);
	tp_context_free(ctx);
}
END_TEST

START_TEST(test_reply_to_id_not_taken)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	struct tp_wq *q, *w, *w2;
	uint64_t id, got;
	uint32_t v = 3;

	ck_assert_int_eq(wq_open(ctx, "ids", TP_WQ_CREATE, &q), 0);
	ck_assert_int_eq(wq_open(ctx, "ids", 0, &w), 0);
	ck_assert_int_eq(wq_open(ctx, "ids", 0, &w2), 0);
	ck_assert_int_eq(submit_u32(q, 9, &id), 0);
	ck_assert_int_eq(tp_wq_reply(w, id, &v, sizeof(v)), -ENOENT); /* not taken yet */
	ck_assert_int_eq(get_u32(w, false, &got, &v, 0), 0);
	ck_assert_int_eq(tp_wq_reply(w, id + 100, &v, sizeof(v)), -ENOENT);
	ck_assert_ptr_nonnull(strstr(tp_last_error(), "did not take question"));
	ck_assert_int_eq(tp_wq_reply(w2, id, &v, sizeof(v)), -ENOENT); /* another's */
	tp_wq_release(w2);
	ck_assert_int_eq(tp_wq_submit(w, &v, sizeof(v), &got), -EACCES); /* workers do not submit */
	ck_assert_int_eq(tp_wq_reply(w, id, &v, sizeof(v)), 0);
	ck_assert_int_eq(tp_wq_reply(w, id, &v, sizeof(v)), -ENOENT); /* answered already */
	ck_assert_int_eq(get_u32(q, true, &got, &v, 0), 0);
	ck_assert_int_eq(got, id);
	ck_assert_int_eq(wq_open(ctx, "nope", 0, &w2), -ENOENT);
	ck_assert_int_eq(wq_open(ctx, "ids", TP_WQ_CREATE | TP_WQ_EXCL, &w2), -EADDRINUSE);
	ck_assert(tpt_daemon_alive(&tpt_fixture_daemon));
	tp_wq_release(w);
	tp_wq_release(q);
	tp_context_free(ctx);
}
END_TEST

START_TEST(test_limits)
{
	static const char *const args[] = { "--wqs-per-uid", "2", "--wq-questions-max", "3",
					    "--wq-bytes-max", "64", "--wq-answer-bytes-max", "16",
					    NULL };
	uint8_t big[65] = { 0 };
	struct tpt_daemon d;
	struct tp_context *ctx;
	struct tp_wq *a, *b, *c, *w;
	uint64_t id, first, got;
	uint32_t v;

	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ctx = ctx_new(&d);
	ck_assert_ptr_nonnull(ctx);
	ck_assert_int_eq(wq_open(ctx, "l1", TP_WQ_CREATE, &a), 0);
	ck_assert_int_eq(wq_open(ctx, "l2", TP_WQ_CREATE, &b), 0); /* at wqs-per-uid */
	ck_assert_int_eq(wq_open(ctx, "l3", TP_WQ_CREATE, &c), -ENOBUFS);
	ck_assert_int_eq(submit_u32(a, 1, &first), 0);
	ck_assert_int_eq(submit_u32(a, 2, &id), 0);
	ck_assert_int_eq(submit_u32(a, 3, &id), 0); /* at wq-questions-max */
	ck_assert_int_eq(submit_u32(a, 4, &id), -ENOBUFS);
	ck_assert_int_eq(wq_open(ctx, "l1", 0, &w), 0);
	ck_assert_int_eq(get_u32(w, false, &got, &v, 0), 0);
	ck_assert_int_eq(tp_wq_reply(w, got, big, 16), 0); /* at wq-answer-bytes-max */
	ck_assert_int_eq(submit_u32(a, 4, &id), -ENOBUFS); /* the answer is not received yet */
	ck_assert_int_eq(get_u32(w, false, &got, &v, 0), 0);
	ck_assert_int_eq(tp_wq_reply(w, got, big, 1), -ENOBUFS); /* one above */
	/* Answers still flow while submits are refused: no deadlock. */
	ck_assert_int_eq(tp_wq_answer(a, &id, (void **)&c, (size_t *)&got, 0), 0);
	free(c);
	ck_assert_int_eq(id, first);
	ck_assert_int_eq(submit_u32(a, 4, &id), 0);
	ck_assert_int_eq(tp_wq_submit(b, big, 64, &id), 0); /* at wq-bytes-max */
	ck_assert_int_eq(tp_wq_submit(b, big, 1, &id), -ENOBUFS);
	ck_assert_int_eq(wq_open(ctx, "l3", TP_WQ_CREATE, &c), -ENOBUFS);
	tp_wq_release(b);
	ck_assert_int_eq(wq_open(ctx, "l3", TP_WQ_CREATE, &c), 0); /* the owner's release frees */
	tp_wq_release(c);
	tp_wq_release(w);
	tp_wq_release(a);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

/* ---- another uid ----------------------------------------------------------------------------- */

static int other_uid(void *arg)
{
	struct tp_wq_options o = { .size = sizeof(o), .owner_uid = 0 };
	uint64_t qid = *(uint64_t *)arg, got;
	struct tp_context *ctx;
	struct tp_wq *q;
	uint32_t v = 1;
	int r;

	TPT_REQUIRE(setgroups(0, NULL) == 0 && setresgid(NOBODY, NOBODY, NOBODY) == 0 &&
		    setresuid(NOBODY, NOBODY, NOBODY) == 0, 1, "cannot drop to nobody");
	ctx = ctx_new(&tpt_fixture_daemon);
	TPT_REQUIRE(ctx, 1, "context");
	r = tp_wq_open(ctx, "private", &o, &q);
	TPT_REQUIRE(r == -ENOENT, 1, "private queue (as a missing one): %d", r);
	r = tp_wq_open(ctx, "public", &o, &q);
	TPT_REQUIRE(r == 0, 1, "public queue: %d %s", r, tp_last_error());
	r = tp_wq_reply(q, qid, &v, sizeof(v)); /* a question root's worker took */
	TPT_REQUIRE(r == -ENOENT, 1, "reply to another's question: %d", r);
	r = get_u32(q, true, &got, &v, 0);
	TPT_REQUIRE(r == -EACCES, 1, "a worker receives answers: %d", r);
	r = tp_wq_submit(q, &v, sizeof(v), &got);
	TPT_REQUIRE(r == -EACCES, 1, "a worker submits: %d", r);
	tp_wq_release(q);
	o.flags = TP_WQ_CREATE; /* nobody creates in root's names */
	r = tp_wq_open(ctx, "squat", &o, &q);
	TPT_REQUIRE(r == -ENOENT, 1, "create in another uid's names: %d", r);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_other_uid_access)
{
	struct tp_wq_options o = { .size = sizeof(o), .flags = TP_WQ_CREATE, .owner_uid = -1 };
	struct tp_context *ctx;
	struct tp_wq *priv, *pub, *w;
	uint64_t id, got;
	uint32_t v;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_open_to_all(&tpt_fixture_daemon), 0);
	ctx = ctx_new(&tpt_fixture_daemon);
	ck_assert_int_eq(tp_wq_open(ctx, "private", &o, &priv), 0);
	o.access = TP_ACCESS_ANYONE;
	ck_assert_int_eq(tp_wq_open(ctx, "public", &o, &pub), 0);
	ck_assert_int_eq(submit_u32(pub, 1, &id), 0);
	ck_assert_int_eq(wq_open(ctx, "public", 0, &w), 0);
	ck_assert_int_eq(get_u32(w, false, &got, &v, 0), 0);
	ck_assert(tpt_wait_ok(tpt_fork(other_uid, &id), T_MS, "other uid"));
	ck_assert_int_eq(tp_wq_reply(w, id, &v, sizeof(v)), 0); /* still root's worker's */
	tp_wq_release(w);
	tp_wq_release(priv);
	tp_wq_release(pub);
	tp_context_free(ctx);
}
END_TEST

static Suite *wq_suite(void)
{
	Suite *s = suite_create("wq");
	TCase *tc = tcase_create("wq");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_workers_in_processes);
	tcase_add_test(tc, test_killed_worker_requeued_once);
	tcase_add_test(tc, test_killed_worker_at_most_once);
	tcase_add_test(tc, test_owner_killed_closes);
	tcase_add_test(tc, test_drain_waits_for_taken);
	tcase_add_test(tc, test_reply_to_id_not_taken);
	tcase_add_test(tc, test_limits);
	tcase_add_test(tc, test_other_uid_access);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(wq_suite());
}
