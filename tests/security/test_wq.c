/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: work queues (docs/queues.md) against an unprivileged local user (uid 65534)
 * speaking the raw protocol. Handle ids are the session's own: guessed ids of another session's
 * handles are refused (not found) for submit, answer, take, reply, drain, close and release, and
 * the victim's queue keeps its questions (taken and queued) and stays open; the attacker cannot
 * open a private queue or tell it from a missing one (open, exclusive create: the same -ENOENT),
 * create names in the victim's uid, or spend the victim's wqs-per-uid; a
 * reply on its own worker handle to the victim's worker's question is refused; a payload-less
 * submit closes the attacker's session only.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "itest.h"
#include "tpt_wire.h"

#define T_MS 30000
#define NOBODY 65534

static struct tpt_daemon d;

/* Sends WqOp @op (req_id 1) and returns the answer's status, or -errno; *@ret_id: wq_id; its
 * text into @text (@tl bytes) unless NULL. */
static int raw_wq_text(struct tpt_raw *r, Tpw__V1__WqOp *op, const void *tail,
		       uint32_t tail_len, uint64_t *ret_id, char *text, size_t tl)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg *dm;
	int st, ret;

	op->req_id = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_WQ_OP;
	m.wq_op = op;
	ret = tpt_raw_send(r, &m, tail, tail_len, NULL, 0, 0);
	if (ret < 0)
		return ret;
	ret = tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_WQ_REPLY, T_MS, &dm);
	if (ret < 0)
		return ret;
	st = dm->wq_reply->status;
	if (ret_id)
		*ret_id = dm->wq_reply->wq_id;
	if (text)
		snprintf(text, tl, "%s", dm->wq_reply->message ? dm->wq_reply->message : "");
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	return st;
}

static int raw_wq(struct tpt_raw *r, Tpw__V1__WqOp *op, const void *tail, uint32_t tail_len,
		  uint64_t *ret_id)
{
	return raw_wq_text(r, op, tail, tail_len, ret_id, NULL, 0);
}

/*
 * Opens (or with @create, creates exclusively) root's queue "secret", whose access mode refuses
 * uid 65534, and root's "missing", which does not exist: the answers must be the same, -ENOENT
 * with the same text, so that the name cannot be probed. Return: 0 or 1 (said why).
 */
static int probe_same(struct tpt_raw *r, bool create)
{
	char text[2][256];
	int st[2];

	for (int i = 0; i < 2; i++) {
		Tpw__V1__WqOp o = TPW__V1__WQ_OP__INIT;

		o.op = TPW__V1__WQ_OP_KIND__WQ_OP_OPEN;
		o.name = i ? "missing" : "secret";
		o.owner_set = true;
		o.owner_uid = 0;
		o.create = o.exclusive = create;
		st[i] = raw_wq_text(r, &o, NULL, 0, NULL, text[i], sizeof(text[i]));
	}
	TPT_REQUIRE(st[0] == TPW__V1__STATUS__STATUS_NOT_FOUND && st[0] == st[1] &&
		    strcmp(text[0], text[1]) == 0, 1, "open%s of a private queue: %d '%s', of a "
		    "missing one: %d '%s'", create ? " (exclusive create)" : "", st[0], text[0],
		    st[1], text[1]);
	return 0;
}

static int attacker(void *arg)
{
	static const Tpw__V1__WqOpKind kinds[] = {
		TPW__V1__WQ_OP_KIND__WQ_OP_SUBMIT, TPW__V1__WQ_OP_KIND__WQ_OP_ANSWER,
		TPW__V1__WQ_OP_KIND__WQ_OP_TAKE,   TPW__V1__WQ_OP_KIND__WQ_OP_REPLY,
		TPW__V1__WQ_OP_KIND__WQ_OP_DRAIN,  TPW__V1__WQ_OP_KIND__WQ_OP_CLOSE,
		TPW__V1__WQ_OP_KIND__WQ_OP_RELEASE,
	};
	uint64_t qid = *(uint64_t *)arg, hid = 0;
	Tpw__V1__WqOp o = TPW__V1__WQ_OP__INIT;
	struct tpt_raw r;
	int st;

	TPT_REQUIRE(tpt_become(NOBODY) == 0, 1, "cannot drop to nobody");
	TPT_REQUIRE(tpt_raw_connect(&r, d.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	for (uint64_t id = 0; id < 64; id++) {
		for (size_t k = 0; k < TPU_ARRAY_SIZE(kinds); k++) {
			Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;
			bool data = kinds[k] == TPW__V1__WQ_OP_KIND__WQ_OP_SUBMIT ||
				    kinds[k] == TPW__V1__WQ_OP_KIND__WQ_OP_REPLY;

			op.op = kinds[k];
			op.wq_id = id;
			op.question_id = qid;
			st = raw_wq(&r, &op, data ? "evil" : NULL, data ? 4 : 0, NULL);
			TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_NOT_FOUND, 1, "op %d on id %llu: %d",
				    (int)kinds[k], (unsigned long long)id, st);
		}
	}
	if (probe_same(&r, false) || probe_same(&r, true)) /* as a missing queue */
		return 1;
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_OPEN;
	o.owner_set = true;
	o.owner_uid = 0;
	o.name = "fresh";
	o.create = true;
	TPT_REQUIRE(raw_wq(&r, &o, NULL, 0, NULL) == TPW__V1__STATUS__STATUS_NOT_FOUND, 1, "squat");
	/* A worker of the public queue: the victim's worker's question is not its own. */
	o.create = false;
	o.name = "public";
	TPT_REQUIRE(raw_wq(&r, &o, NULL, 0, &hid) == TPW__V1__STATUS__STATUS_OK, 1, "public");
	Tpw__V1__WqOp rep = TPW__V1__WQ_OP__INIT;

	rep.op = TPW__V1__WQ_OP_KIND__WQ_OP_REPLY;
	rep.wq_id = hid;
	rep.question_id = qid;
	TPT_REQUIRE(raw_wq(&r, &rep, "evil", 4, NULL) == TPW__V1__STATUS__STATUS_NOT_FOUND, 1,
		    "reply to another's question");
	rep.op = TPW__V1__WQ_OP_KIND__WQ_OP_ANSWER;
	TPT_REQUIRE(raw_wq(&r, &rep, NULL, 0, NULL) == TPW__V1__STATUS__STATUS_PERMISSION, 1,
		    "a worker receives answers");
	rep.op = TPW__V1__WQ_OP_KIND__WQ_OP_CLOSE;
	TPT_REQUIRE(raw_wq(&r, &rep, NULL, 0, NULL) == TPW__V1__STATUS__STATUS_PERMISSION, 1,
		    "a worker closes");
	/* Spend its own wqs-per-uid (2), not root's. */
	o.owner_set = false;
	o.create = true;
	o.name = "a1";
	TPT_REQUIRE(raw_wq(&r, &o, NULL, 0, NULL) == TPW__V1__STATUS__STATUS_OK, 1, "a1");
	o.name = "a2";
	TPT_REQUIRE(raw_wq(&r, &o, NULL, 0, NULL) == TPW__V1__STATUS__STATUS_OK, 1, "a2");
	o.name = "a3";
	TPT_REQUIRE(raw_wq(&r, &o, NULL, 0, NULL) == TPW__V1__STATUS__STATUS_LIMIT, 1, "a3");
	/* A submit without a payload: the session is closed. */
	Tpw__V1__WqOp bad = TPW__V1__WQ_OP__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;

	bad.op = TPW__V1__WQ_OP_KIND__WQ_OP_SUBMIT;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_WQ_OP;
	m.wq_op = &bad;
	TPT_REQUIRE(tpt_raw_send(&r, &m, NULL, 0, NULL, 0, 0) == 0, 1, "send");
	TPT_REQUIRE(tpt_raw_wait_closed(&r, T_MS) == 0, 1, "the session stayed open");
	tpt_raw_close(&r);
	return 0;
}

START_TEST(test_attacker_cannot_touch_another_uids_queue)
{
	static const char *const args[] = { "--wqs-per-uid", "2", NULL };
	struct tp_wq_options o = { .size = sizeof(o), .flags = TP_WQ_CREATE, .owner_uid = -1 };
	const uint32_t v = 42;
	struct tp_context *ctx;
	struct tp_wq *priv, *pub, *w;
	uint64_t id, got, taken;
	void *data;
	size_t len;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	ck_assert_int_eq(tpt_ctx_new(&d, 0, "victim", &ctx), 0);
	ck_assert_int_eq(tp_wq_open(ctx, "secret", &o, &priv), 0);
	ck_assert_int_eq(tp_wq_submit(priv, &v, sizeof(v), &id), 0);
	o.access = TP_ACCESS_ANYONE;
	ck_assert_int_eq(tp_wq_open(ctx, "public", &o, &pub), 0);
	ck_assert_int_eq(tp_wq_submit(pub, &v, sizeof(v), &taken), 0);
	o.flags = 0;
	ck_assert_int_eq(tp_wq_open(ctx, "public", &o, &w), 0);
	ck_assert_int_eq(tp_wq_take(w, &got, &data, &len, 0), 0);
	free(data);
	ck_assert_int_eq(got, taken);
	ck_assert(tpt_wait_ok(tpt_fork(attacker, &taken), 4 * T_MS, "attacker"));
	ck_assert(tpt_daemon_alive(&d));
	ck_assert_int_eq(tp_wq_reply(w, taken, &v, sizeof(v)), 0); /* still the victim's */
	ck_assert_int_eq(tp_wq_answer(pub, &got, &data, &len, 0), 0);
	free(data);
	ck_assert_int_eq(got, taken);
	ck_assert_int_eq(tp_wq_submit(priv, &v, sizeof(v), &got), 0); /* still open */
	ck_assert_int_eq(tp_wq_drain(priv, 0), -EAGAIN);		/* both questions kept */
	tp_wq_release(w);
	tp_wq_release(pub);
	tp_wq_release(priv);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

/* ---- one user's handles and everyone else's calls ------------------------------------------ */

#define HOG_SESSIONS 64	 /* of uid 65534, well within sessions-per-uid (128) */
#define HOG_HANDLES 1024 /* each: the most one session may hold */
#define PROBE_OPS 20000	 /* takes from an empty queue, timed by the daemon's CPU */
#define PIPELINE 256	 /* ops in flight on one connection */

static struct tpt_sync hog_ready, hog_done;

/* Sends @n WqOp @op (req_id 1..@n) before reading their answers, which must all have the first
 * one's status (*@ret_status: it); the first answer's wq_id into @ret_id unless NULL. Return: 0,
 * or 1 (said why). */
static int raw_wq_burst(struct tpt_raw *r, Tpw__V1__WqOp *op, unsigned n, int *ret_status,
			uint64_t *ret_id)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;

	m.body_case = TPW__V1__CLIENT_MSG__BODY_WQ_OP;
	m.wq_op = op;
	for (unsigned i = 0; i < n; i++) {
		op->req_id = i + 1;
		TPT_REQUIRE(tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0) == 0, 1, "send %u", i);
	}
	for (unsigned i = 0; i < n; i++) {
		Tpw__V1__DaemonMsg *dm;
		int st;

		TPT_REQUIRE(tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_WQ_REPLY, T_MS, &dm) == 0,
			    1, "answer %u of %u", i, n);
		st = dm->wq_reply->status;
		if (!i && ret_id)
			*ret_id = dm->wq_reply->wq_id;
		tpw__v1__daemon_msg__free_unpacked(dm, NULL);
		if (!i)
			*ret_status = st;
		TPT_REQUIRE(st == *ret_status, 1, "answer %u: status %d, not %d", i, st,
			    *ret_status);
	}
	return 0;
}

/* uid 65534: HOG_SESSIONS sessions holding HOG_HANDLES handles of its own queue each, kept until
 * the parent is done; one more open of a session is refused (its limit). */
static int hog(void *arg)
{
	static struct tpt_raw r[HOG_SESSIONS];
	Tpw__V1__WqOp o = TPW__V1__WQ_OP__INIT;
	int st;

	(void)arg;
	TPT_REQUIRE(tpt_become(NOBODY) == 0, 1, "cannot drop to nobody");
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_OPEN;
	o.name = "hog";
	o.create = true;
	for (int i = 0; i < HOG_SESSIONS; i++) {
		TPT_REQUIRE(tpt_raw_connect(&r[i], d.socket) == 0, 1, "connect %d", i);
		TPT_REQUIRE(tpt_raw_hello(&r[i], TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1,
			    "hello %d", i);
		for (unsigned k = 0; k < HOG_HANDLES; k += PIPELINE) {
			if (raw_wq_burst(&r[i], &o, PIPELINE, &st, NULL))
				return 1;
			TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK, 1, "open: %d", st);
		}
	}
	TPT_REQUIRE(raw_wq(&r[0], &o, NULL, 0, NULL) == TPW__V1__STATUS__STATUS_LIMIT, 1,
		    "handle %u of a session", HOG_HANDLES + 1);
	tpt_sync_post(&hog_ready, 0);
	TPT_REQUIRE(tpt_sync_wait(&hog_done, 20 * T_MS) == 0, 1, "no word from the parent");
	for (int i = 0; i < HOG_SESSIONS; i++)
		tpt_raw_close(&r[i]);
	return 0;
}

/* The daemon's CPU ticks for PROBE_OPS takes (timeout 0) from queue "mine" (empty) through a
 * worker handle @r opens for them, the newest of the daemon's. */
static long probe_ticks(void *arg)
{
	struct tpt_raw *r = arg;
	Tpw__V1__WqOp o = TPW__V1__WQ_OP__INIT;
	uint64_t id = 0;
	long t0, t1;
	int st;

	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_OPEN;
	o.name = "mine";
	ck_assert_int_eq(raw_wq_burst(r, &o, 1, &st, &id), 0);
	ck_assert_int_eq(st, TPW__V1__STATUS__STATUS_OK);
	o = (Tpw__V1__WqOp)TPW__V1__WQ_OP__INIT;
	t0 = tpt_cpu_ticks(d.pid);
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_TAKE;
	o.wq_id = id;
	for (unsigned k = 0; k < PROBE_OPS; k += PIPELINE) {
		ck_assert_int_eq(raw_wq_burst(r, &o, PIPELINE, &st, NULL), 0);
		ck_assert_int_ne(st, TPW__V1__STATUS__STATUS_NOT_FOUND); /* the handle's own */
	}
	t1 = tpt_cpu_ticks(d.pid);
	ck_assert(t0 >= 0 && t1 >= t0);
	return t1 - t0;
}

/*
 * A user's handles cost other users' work queue calls nothing: with uid 65534 holding 65536
 * queue handles (64 sessions of 1024), root's takes from its own empty queue take the daemon
 * about the CPU they took before. As for channels (sec_chan), the daemon walked every handle of
 * every session to find a call's and to count an open's. Ticks of the daemon's CPU time.
 */
START_TEST(test_another_users_handles_do_not_slow_queue_calls)
{
	Tpw__V1__WqOp o = TPW__V1__WQ_OP__INIT;
	long before, after;
	struct tpt_raw r;
	int st;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_start(&d, NULL), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	ck_assert_int_eq(tpt_raw_connect(&r, d.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_OPEN; /* the owner's handle */
	o.name = "mine";
	o.create = true;
	ck_assert_int_eq(raw_wq_burst(&r, &o, 1, &st, NULL), 0);
	ck_assert_int_eq(st, TPW__V1__STATUS__STATUS_OK);
	ck_assert_int_eq(
	    tpt_cpu_beside(d.pid, probe_ticks, &r, hog, &hog_ready, &hog_done, 20 * T_MS,
			   "root's takes beside 65536 handles of another uid", &before, &after),
	    0);
	ck_assert_msg(tpt_cpu_beside_ok(before, after), "takes took %ld ticks of the daemon's "
		      "CPU beside another uid's handles, %ld alone", after, before);
	tpt_raw_close(&r);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

/* ---- one user's handles and a peer daemon's calls ------------------------------------------ */

#define PEER_PIPELINE 64 /* takes waiting at once on the peer's handle (the most one may have) */
#define PEER_PROBE_OPS 5120 /* a peer's takes, timed by the daemon's CPU */

/* Sends @n PeerWqOp @op (req_id 1..@n) over the raw peer link @c before reading their answers
 * (pings skipped), which must all be @status; the last one's wq_id into @ret_id unless NULL.
 * Return: 0, or 1 (said why). */
static int peer_wq_burst(struct tpt_raw *c, Tpw__V1__WqOp *op, unsigned n, int status,
			 uint64_t *ret_id)
{
	Tpw__V1__PeerWqOp po = TPW__V1__PEER_WQ_OP__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT, *in = NULL;
	unsigned got = 0;

	po.op = op;
	po.uid = 0; /* its claim: uid 0's queue names */
	m.body_case = TPW__V1__PEER_MSG__BODY_WQ_OP;
	m.wq_op = &po;
	for (unsigned i = 0; i < n; i++) {
		op->req_id = i + 1;
		TPT_REQUIRE(tpt_raw_send_peer(c, &m) == 0, 1, "send %u", i);
	}
	while (got < n) {
		int st;

		TPT_REQUIRE(tpt_raw_recv_peer(c, T_MS, &in) == 0, 1, "answer %u of %u", got, n);
		if (in->body_case != TPW__V1__PEER_MSG__BODY_WQ_REPLY) {
			tpw_peer_msg_free(in);
			continue;
		}
		st = in->wq_reply->reply->status;
		if (ret_id)
			*ret_id = in->wq_reply->reply->wq_id;
		tpw_peer_msg_free(in);
		TPT_REQUIRE(st == status, 1, "answer %u: status %d, not %d", got, st, status);
		got++;
	}
	return 0;
}

/* The daemon's CPU ticks for PEER_PROBE_OPS takes from root's queue "pub" (empty, admitting any
 * peer) that wait a millisecond each, by the raw peer @c through a worker handle it opens. */
static long peer_probe_ticks(void *arg)
{
	struct tpt_raw *c = arg;
	Tpw__V1__WqOp o = TPW__V1__WQ_OP__INIT;
	uint64_t id = 0;
	long t0, t1;

	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_OPEN;
	o.name = "pub";
	ck_assert_int_eq(peer_wq_burst(c, &o, 1, TPW__V1__STATUS__STATUS_OK, &id), 0);
	o = (Tpw__V1__WqOp)TPW__V1__WQ_OP__INIT;
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_TAKE;
	o.wq_id = id;
	o.timeout_ms = 1; /* a wait, which the peer's chan-peer-ops-max counts */
	t0 = tpt_cpu_ticks(d.pid);
	for (unsigned k = 0; k < PEER_PROBE_OPS; k += PEER_PIPELINE)
		ck_assert_int_eq(peer_wq_burst(c, &o, PEER_PIPELINE,
					       TPW__V1__STATUS__STATUS_TIMEOUT, NULL), 0);
	t1 = tpt_cpu_ticks(d.pid);
	ck_assert(t0 >= 0 && t1 >= t0);
	return t1 - t0;
}

/*
 * A user's handles cost a peer daemon's queue calls nothing either: with uid 65534 holding
 * 65536 queue handles, a raw peer's takes from root's queue that admits any peer (each waits,
 * counted against the peer's chan-peer-ops-max) take the daemon about the CPU they took before.
 * As for channels (sec_chan), the daemon counted a peer's waiting calls by walking every queue
 * handle of every user for each. Ticks of the daemon's CPU time.
 */
START_TEST(test_another_users_handles_do_not_slow_a_peers_queue_calls)
{
	const char *args[] = { "--peer-insecure", NULL };
	struct tpt_raw_peer_hello h = { .boot_base = 0x70, .instance = 0x7eed,
					.timeout_ms = T_MS };
	struct tpt_raw r, c = { .fd = -1 }, data = { .fd = -1 };
	Tpw__V1__WqOp o = TPW__V1__WQ_OP__INIT;
	long before, after;
	int st;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_start_peer(&d, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	ck_assert_int_eq(tpt_raw_connect(&r, d.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_OPEN; /* the owner's handle */
	o.name = "pub";
	o.create = true;
	o.remote = TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER;
	ck_assert_int_eq(raw_wq_burst(&r, &o, 1, &st, NULL), 0);
	ck_assert_int_eq(st, TPW__V1__STATUS__STATUS_OK);
	h.port = d.peer_port;
	ck_assert_int_eq(tpt_raw_peer_dial(&h, &c, &data), 0);
	ck_assert_int_eq(tpt_cpu_beside(d.pid, peer_probe_ticks, &c, hog, &hog_ready, &hog_done,
					20 * T_MS, "a peer's takes beside 65536 handles of "
					"another uid", &before, &after), 0);
	ck_assert_msg(tpt_cpu_beside_ok(before, after), "a peer's takes took %ld ticks of the "
		      "daemon's CPU beside another uid's handles, %ld alone", after, before);
	tpt_raw_close(&data);
	tpt_raw_close(&c);
	tpt_raw_close(&r);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

static Suite *wq_suite(void)
{
	Suite *s = suite_create("sec_wq");
	TCase *tc = tcase_create("wq");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_attacker_cannot_touch_another_uids_queue);
	tcase_add_test(tc, test_another_users_handles_do_not_slow_queue_calls);
	tcase_add_test(tc, test_another_users_handles_do_not_slow_a_peers_queue_calls);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(wq_suite());
}
