/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: named channels (docs/channels.md) against an unprivileged local user (uid
 * 65534) speaking the raw protocol. Handle ids are the session's own: guessed ids of another
 * session's handles are refused (not found) for read, write, close and release, and the victim's
 * channel keeps its item and stays open; a channel op whose item lengths do not match its data
 * tail closes the attacker's session only; the attacker cannot open a private channel, create
 * names in the victim's uid, or spend the victim's chans-per-uid, and cannot tell a private
 * channel from a missing one by opening (exclusively creating, unlinking) it.
 */
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "itest.h"
#include "tpt_wire.h"

#define T_MS 30000
#define NOBODY 65534

static struct tpt_daemon d;

static int drop_to_nobody(void)
{
	if (setgroups(0, NULL) < 0 || setresgid(NOBODY, NOBODY, NOBODY) < 0 ||
	    setresuid(NOBODY, NOBODY, NOBODY) < 0)
		return -errno;
	return 0;
}

/* Sends ChanOp @op (req_id 1) and returns the answer's status, or -errno; its text into
 * @text (@tl bytes) unless NULL. */
static int raw_chan_text(struct tpt_raw *r, Tpw__V1__ChanOp *op, const void *tail,
			 uint32_t tail_len, char *text, size_t tl)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg *dm;
	int st, ret;

	op->req_id = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = op;
	ret = tpt_raw_send(r, &m, tail, tail_len, NULL, 0, 0);
	if (ret < 0)
		return ret;
	ret = tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm);
	if (ret < 0)
		return ret;
	st = dm->chan_reply->status;
	if (text)
		snprintf(text, tl, "%s", dm->chan_reply->message ? dm->chan_reply->message : "");
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	return st;
}

static int raw_chan(struct tpt_raw *r, Tpw__V1__ChanOp *op, const void *tail, uint32_t tail_len)
{
	return raw_chan_text(r, op, tail, tail_len, NULL, 0);
}

/*
 * Opens (or with @create, creates exclusively; with @unlink, unlinks) root's channel "secret",
 * whose access mode refuses uid 65534, and root's "missing", which does not exist: the answers
 * must be the same, -ENOENT with the same text, so that the name cannot be probed. Return: 0 or
 * 1 (said why).
 */
static int probe_same(struct tpt_raw *r, bool create, bool unlink)
{
	char text[2][256];
	int st[2];

	for (int i = 0; i < 2; i++) {
		Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;

		o.op = unlink ? TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK
			      : TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
		o.name = i ? "missing" : "secret";
		o.owner_set = true;
		o.owner_uid = 0;
		o.create = o.exclusive = create;
		st[i] = raw_chan_text(r, &o, NULL, 0, text[i], sizeof(text[i]));
	}
	TPT_REQUIRE(st[0] == TPW__V1__STATUS__STATUS_NOT_FOUND && st[0] == st[1] &&
		    strcmp(text[0], text[1]) == 0, 1, "%s%s of a private channel: %d '%s', of a "
		    "missing one: %d '%s'", unlink ? "unlink" : "open",
		    create ? " (exclusive create)" : "", st[0], text[0], st[1], text[1]);
	return 0;
}

static int attacker(void *arg)
{
	static const Tpw__V1__ChanOpKind kinds[] = {
		TPW__V1__CHAN_OP_KIND__CHAN_OP_READ, TPW__V1__CHAN_OP_KIND__CHAN_OP_CLOSE,
		TPW__V1__CHAN_OP_KIND__CHAN_OP_RELEASE,
	};
	uint64_t len = 4;
	struct tpt_raw r;
	int st;

	(void)arg;
	TPT_REQUIRE(drop_to_nobody() == 0, 1, "cannot drop to nobody");
	TPT_REQUIRE(tpt_raw_connect(&r, d.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	for (uint64_t id = 0; id < 64; id++) {
		for (size_t k = 0; k < TPU_ARRAY_SIZE(kinds); k++) {
			Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;

			op.op = kinds[k];
			op.chan_id = id;
			st = raw_chan(&r, &op, NULL, 0);
			TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_NOT_FOUND, 1, "op %d on id %llu: %d",
				    (int)kinds[k], (unsigned long long)id, st);
		}
		Tpw__V1__ChanOp w = TPW__V1__CHAN_OP__INIT;

		w.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
		w.chan_id = id;
		w.n_lengths = 1;
		w.lengths = &len;
		st = raw_chan(&r, &w, "evil", 4);
		TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_NOT_FOUND, 1, "write on id %llu: %d",
			    (unsigned long long)id, st);
	}
	/* Open the private channel by name, create it exclusively, unlink it: answered as a
	 * missing one. Create in root's names. */
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;

	if (probe_same(&r, false, false) || probe_same(&r, true, false) ||
	    probe_same(&r, false, true))
		return 1;
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	o.owner_set = true;
	o.owner_uid = 0;
	o.name = "fresh";
	o.create = true;
	TPT_REQUIRE(raw_chan(&r, &o, NULL, 0) == TPW__V1__STATUS__STATUS_NOT_FOUND, 1, "squat");
	/* Spend its own chans-per-uid (2), not root's. */
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	o.owner_set = false;
	o.name = "a1";
	TPT_REQUIRE(raw_chan(&r, &o, NULL, 0) == TPW__V1__STATUS__STATUS_OK, 1, "a1");
	o.name = "a2";
	TPT_REQUIRE(raw_chan(&r, &o, NULL, 0) == TPW__V1__STATUS__STATUS_OK, 1, "a2");
	o.name = "a3";
	TPT_REQUIRE(raw_chan(&r, &o, NULL, 0) == TPW__V1__STATUS__STATUS_LIMIT, 1, "a3");
	/* Lengths that do not add up to the tail: the session is closed. */
	Tpw__V1__ChanOp bad = TPW__V1__CHAN_OP__INIT;

	len = 5;
	bad.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	bad.chan_id = 1;
	bad.n_lengths = 1;
	bad.lengths = &len;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;

	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &bad;
	TPT_REQUIRE(tpt_raw_send(&r, &m, "evil", 4, NULL, 0, 0) == 0, 1, "send");
	TPT_REQUIRE(tpt_raw_wait_closed(&r, T_MS) == 0, 1, "the session stayed open");
	tpt_raw_close(&r);
	return 0;
}

START_TEST(test_attacker_cannot_touch_another_uids_channel)
{
	static const char *const args[] = { "--chans-per-uid", "2", NULL };
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	const uint32_t v = 42;
	struct iovec iov = { .iov_base = (void *)&v, .iov_len = sizeof(v) };
	struct tp_context *ctx;
	struct tp_chan *ch, *other;
	void *item;
	size_t len;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	ck_assert_int_eq(tpt_ctx_new(&d, 0, "victim", &ctx), 0);
	ck_assert_int_eq(tp_chan_open(ctx, "secret", &o, &ch), 0);
	ck_assert_int_eq(tp_chan_write(ch, &iov, 1, 0), 0);
	ck_assert(tpt_wait_ok(tpt_fork(attacker, NULL), 4 * T_MS, "attacker"));
	ck_assert(tpt_daemon_alive(&d));
	ck_assert_int_eq(tp_chan_read(ch, &item, &len, 0), 0); /* still open, item kept */
	ck_assert_uint_eq(len, 4);
	ck_assert_int_eq(memcmp(item, &v, 4), 0);
	free(item);
	ck_assert_int_eq(tp_chan_open(ctx, "mine", &o, &other), 0); /* root's quota untouched */
	tp_chan_release(other);
	tp_chan_release(ch);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

/* ---- one user's handles and everyone else's calls ------------------------------------------ */

#define HOG_SESSIONS 64	 /* of uid 65534, well within sessions-per-uid (128) */
#define HOG_HANDLES 1024 /* each: the most one session may hold */
#define PROBE_OPS 20000	 /* reads of an empty channel, timed by the daemon's CPU */
#define PIPELINE 256	 /* ops in flight on one connection */

static struct tpt_sync hog_ready, hog_done;

/* Sends @n ChanOp @op (req_id 1..@n) before reading their answers, which must all be @status;
 * each answer's chan_id into @ret_ids[i] unless NULL. Return: 0, or 1 (said why). */
static int raw_chan_burst(struct tpt_raw *r, Tpw__V1__ChanOp *op, unsigned n, int status,
			  uint64_t *ret_ids)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;

	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = op;
	for (unsigned i = 0; i < n; i++) {
		op->req_id = i + 1;
		TPT_REQUIRE(tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0) == 0, 1, "send %u", i);
	}
	for (unsigned i = 0; i < n; i++) {
		Tpw__V1__DaemonMsg *dm;
		int st;

		TPT_REQUIRE(tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm) == 0,
			    1, "answer %u of %u", i, n);
		st = dm->chan_reply->status;
		if (ret_ids)
			ret_ids[i] = dm->chan_reply->chan_id;
		tpw__v1__daemon_msg__free_unpacked(dm, NULL);
		TPT_REQUIRE(st == status, 1, "answer %u: status %d, not %d", i, st, status);
	}
	return 0;
}

/* uid 65534: HOG_SESSIONS sessions holding HOG_HANDLES handles of its own channel each, kept
 * until the parent is done; one more open of a session is refused (its limit). */
static int hog(void *arg)
{
	static struct tpt_raw r[HOG_SESSIONS];
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;

	(void)arg;
	TPT_REQUIRE(drop_to_nobody() == 0, 1, "cannot drop to nobody");
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	o.name = "hog";
	o.create = true;
	for (int i = 0; i < HOG_SESSIONS; i++) {
		TPT_REQUIRE(tpt_raw_connect(&r[i], d.socket) == 0, 1, "connect %d", i);
		TPT_REQUIRE(tpt_raw_hello(&r[i], TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1,
			    "hello %d", i);
		for (unsigned k = 0; k < HOG_HANDLES; k += PIPELINE)
			if (raw_chan_burst(&r[i], &o, PIPELINE, TPW__V1__STATUS__STATUS_OK, NULL))
				return 1;
	}
	TPT_REQUIRE(raw_chan(&r[0], &o, NULL, 0) == TPW__V1__STATUS__STATUS_LIMIT, 1,
		    "handle %u of a session", HOG_HANDLES + 1);
	tpt_sync_post(&hog_ready, 0);
	TPT_REQUIRE(tpt_sync_wait(&hog_done, 20 * T_MS) == 0, 1, "no word from the parent");
	for (int i = 0; i < HOG_SESSIONS; i++)
		tpt_raw_close(&r[i]);
	return 0;
}

/* The daemon's CPU ticks for PROBE_OPS reads (timeout 0) of channel "mine" (empty) through a
 * handle @r opens for them, the newest of the daemon's. */
static long probe_ticks(void *arg)
{
	struct tpt_raw *r = arg;
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	long t0, t1;
	uint64_t id;

	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	o.name = "mine";
	o.create = true;
	ck_assert_int_eq(raw_chan_burst(r, &o, 1, TPW__V1__STATUS__STATUS_OK, &id), 0);
	o = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
	t0 = tpt_cpu_ticks(d.pid);
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	o.chan_id = id;
	for (unsigned k = 0; k < PROBE_OPS; k += PIPELINE)
		ck_assert_int_eq(raw_chan_burst(r, &o, PIPELINE, TPW__V1__STATUS__STATUS_TIMEOUT,
						NULL), 0);
	t1 = tpt_cpu_ticks(d.pid);
	ck_assert(t0 >= 0 && t1 >= t0);
	return t1 - t0;
}

/*
 * A user's handles cost other users' calls nothing: with uid 65534 holding 65536 channel
 * handles (64 sessions of 1024), root's reads of its own channel take the daemon about the CPU
 * they took before. The daemon used to find a call's handle, and count an open's, by walking
 * every handle of every session: each call of every user cost as much as all the handles held,
 * and one user with many made the loop that serves everyone crawl (here about 20 times the
 * CPU; an open of the hog's took 65536 steps). Ticks (1/100 s) of the daemon's CPU time, not
 * the wall clock: other work on the machine does not count.
 */
START_TEST(test_another_users_handles_do_not_slow_channel_calls)
{
	long before, after;
	struct tpt_raw r;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_start(&d, NULL), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	ck_assert_int_eq(tpt_raw_connect(&r, d.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	ck_assert_int_eq(
	    tpt_cpu_beside(d.pid, probe_ticks, &r, hog, &hog_ready, &hog_done, 20 * T_MS,
			   "root's reads beside 65536 handles of another uid", &before, &after),
	    0);
	ck_assert_msg(tpt_cpu_beside_ok(before, after), "reads took %ld ticks of the daemon's "
		      "CPU beside another uid's handles, %ld alone", after, before);
	tpt_raw_close(&r);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

/* ---- one user's handles and a peer daemon's calls ------------------------------------------ */

#define PEER_PIPELINE 64 /* reads waiting at once on the peer's handle (the most one may have) */
#define PEER_PROBE_OPS 5120 /* a peer's reads, timed by the daemon's CPU */

/* Sends @n PeerChanOp @op (req_id 1..@n) over the raw peer link @c before reading their answers
 * (pings skipped), which must all be @status; the last one's chan_id into @ret_id unless NULL.
 * Return: 0, or 1 (said why). */
static int peer_chan_burst(struct tpt_raw *c, Tpw__V1__ChanOp *op, unsigned n, int status,
			   uint64_t *ret_id)
{
	Tpw__V1__PeerChanOp po = TPW__V1__PEER_CHAN_OP__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT, *in = NULL;
	unsigned got = 0;

	po.op = op;
	po.uid = 0; /* its claim: uid 0's channel names */
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_OP;
	m.chan_op = &po;
	for (unsigned i = 0; i < n; i++) {
		op->req_id = i + 1;
		TPT_REQUIRE(tpt_raw_send_peer(c, &m) == 0, 1, "send %u", i);
	}
	while (got < n) {
		int st;

		TPT_REQUIRE(tpt_raw_recv_peer(c, T_MS, &in) == 0, 1, "answer %u of %u", got, n);
		if (in->body_case != TPW__V1__PEER_MSG__BODY_CHAN_REPLY) {
			tpw_peer_msg_free(in);
			continue;
		}
		st = in->chan_reply->reply->status;
		if (ret_id)
			*ret_id = in->chan_reply->reply->chan_id;
		tpw_peer_msg_free(in);
		TPT_REQUIRE(st == status, 1, "answer %u: status %d, not %d", got, st, status);
		got++;
	}
	return 0;
}

/* The daemon's CPU ticks for PEER_PROBE_OPS reads of root's channel "pub" (empty, admitting any
 * peer) that wait a millisecond each, by the raw peer @c through a handle it opens for them. */
static long peer_probe_ticks(void *arg)
{
	struct tpt_raw *c = arg;
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	uint64_t id = 0;
	long t0, t1;

	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	o.name = "pub";
	ck_assert_int_eq(peer_chan_burst(c, &o, 1, TPW__V1__STATUS__STATUS_OK, &id), 0);
	o = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	o.chan_id = id;
	o.timeout_ms = 1; /* a wait, which the peer's chan-peer-ops-max counts */
	t0 = tpt_cpu_ticks(d.pid);
	for (unsigned k = 0; k < PEER_PROBE_OPS; k += PEER_PIPELINE)
		ck_assert_int_eq(peer_chan_burst(c, &o, PEER_PIPELINE,
						 TPW__V1__STATUS__STATUS_TIMEOUT, NULL), 0);
	t1 = tpt_cpu_ticks(d.pid);
	ck_assert(t0 >= 0 && t1 >= t0);
	return t1 - t0;
}

/*
 * A user's handles cost a peer daemon's calls nothing either: with uid 65534 holding 65536
 * channel handles, a raw peer's reads of root's channel that admits any peer (each waits, and
 * is counted against the peer's chan-peer-ops-max) take the daemon about the CPU they took
 * before. The daemon used to count a peer's waiting calls by walking every channel handle of
 * every user for each of them: a peer's calls cost as much as all the handles held, so that
 * one user's handles and a peer's calls together made the loop that serves everyone crawl (and
 * the peer's own handles, 1024 a link, did the same to every call it made). Ticks of the
 * daemon's CPU time, not the wall clock.
 */
START_TEST(test_another_users_handles_do_not_slow_a_peers_channel_calls)
{
	const char *args[] = { "--peer-insecure", NULL };
	const struct tpt_raw_peer_hello ph = { .boot_base = 0x70, .instance = 0x7eed,
					       .timeout_ms = T_MS };
	struct tpt_raw_peer_hello h = ph;
	struct tpt_raw r, c = { .fd = -1 }, data = { .fd = -1 };
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	long before, after;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_start_peer(&d, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	ck_assert_int_eq(tpt_raw_connect(&r, d.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	o.name = "pub";
	o.create = true;
	o.remote = TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER;
	ck_assert_int_eq(raw_chan(&r, &o, NULL, 0), TPW__V1__STATUS__STATUS_OK);
	h.port = d.peer_port;
	ck_assert_int_eq(tpt_raw_peer_dial(&h, &c, &data), 0);
	ck_assert_int_eq(tpt_cpu_beside(d.pid, peer_probe_ticks, &c, hog, &hog_ready, &hog_done,
					20 * T_MS, "a peer's reads beside 65536 handles of "
					"another uid", &before, &after), 0);
	ck_assert_msg(tpt_cpu_beside_ok(before, after), "a peer's reads took %ld ticks of the "
		      "daemon's CPU beside another uid's handles, %ld alone", after, before);
	tpt_raw_close(&data);
	tpt_raw_close(&c);
	tpt_raw_close(&r);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

static Suite *chan_suite(void)
{
	Suite *s = suite_create("sec_chan");
	TCase *tc = tcase_create("chan");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_attacker_cannot_touch_another_uids_channel);
	tcase_add_test(tc, test_another_users_handles_do_not_slow_channel_calls);
	tcase_add_test(tc, test_another_users_handles_do_not_slow_a_peers_channel_calls);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(chan_suite());
}
