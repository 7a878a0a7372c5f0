/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: who pays for a channel's items (docs/channels.md, "Limits and accounting").
 * The items a writer puts in a channel are charged to the writer's uid (chan-bytes-per-uid, here
 * 1 MiB), not to the channel's owner, whose capacity still bounds the channel. Raw clients of
 * uid 4242 (the owner) and 65534 (a writer the owner lets in):
 *
 * - the writer fills the owner's channel up to its own limit (just below, just at) and a byte
 *   more is refused naming the writer's limit; its own channel then takes not a byte more, and
 *   the owner still writes its whole limit to a channel of its own (a byte above refused);
 * - the owner unlinks its channel and lets go of it while the writer keeps its handle and never
 *   reads: the owner's limit is whole again at once, the writer's items stay the writer's
 *   charge until its handle goes, then its limit is whole again too;
 * - two uids together put no more in one channel than its capacity, each within its own limit;
 * - 40 uids each put their whole limit in one channel, and not a byte more: each finds its own
 *   charge among the others' (payers in the daemon's hash map).
 *
 * (All three charged the owner: a writer of another uid could spend the owner's limit and so
 * fail the owner's writes everywhere, for good once the owner had unlinked the channel.)
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "itest.h"
#include "tpt_wire.h"

#define T_MS 30000
#define OWNER 4242
#define WRITER 65534
#define LIMIT (1u << 20) /* chan-bytes-per-uid */
#define HALF (LIMIT / 2)

#define OK TPW__V1__STATUS__STATUS_OK
#define OVER TPW__V1__STATUS__STATUS_LIMIT

static struct tpt_daemon d;
static struct tpt_sync o_ready, w_done, o_done;

/* Sends ChanOp @op (req_id 1) with @tail and waits for its answer: its status in *@ret_status,
 * its text in @text (@tl bytes; may be NULL), its handle id in *@ret_id (may be NULL).
 * Return: 0 or -errno. */
static int raw_chan(struct tpt_raw *r, Tpw__V1__ChanOp *op, const void *tail, uint32_t tail_len,
		    int *ret_status, char *text, size_t tl, uint64_t *ret_id)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg *dm;
	int ret;

	op->req_id = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = op;
	ret = tpt_raw_send(r, &m, tail, tail_len, NULL, 0, 0);
	if (ret < 0)
		return ret;
	ret = tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm);
	if (ret < 0)
		return ret;
	*ret_status = dm->chan_reply->status;
	if (text)
		snprintf(text, tl, "%s", dm->chan_reply->message ? dm->chan_reply->message : "");
	if (ret_id)
		*ret_id = dm->chan_reply->chan_id;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	return 0;
}

/* Opens channel @name of @owner (-1: creates it in the caller's uid with @access and a
 * capacity of @cap bytes, 0 for the daemon's). Return: 0 or 1 (logged). */
static int open_chan(struct tpt_raw *r, const char *name, long owner, Tpw__V1__Access access,
		     uint64_t cap, uint64_t *ret_id)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	int st = -1;

	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = (char *)name;
	op.create = owner < 0;
	op.owner_set = owner >= 0;
	op.owner_uid = owner >= 0 ? (uint32_t)owner : 0;
	op.access = access;
	op.capacity_bytes = cap;
	TPT_REQUIRE(raw_chan(r, &op, NULL, 0, &st, NULL, 0, ret_id) == 0 && st == OK, 1,
		    "open '%s': %d", name, st);
	return 0;
}

/* A WRITE of one inline item of @len bytes (at most HALF), timeout 0: its status, or -errno. */
static int put(struct tpt_raw *r, uint64_t id, uint32_t len, char *text, size_t tl)
{
	static uint8_t bytes[HALF];
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	uint64_t l = len;
	int st = -1, ret;

	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	op.chan_id = id;
	op.n_lengths = 1;
	op.lengths = &l;
	ret = raw_chan(r, &op, bytes, len, &st, text, tl, NULL);
	return ret < 0 ? ret : st;
}

/* An op on handle @id (RELEASE) or name @name (UNLINK): its status, or -errno. */
static int chan_op(struct tpt_raw *r, Tpw__V1__ChanOpKind kind, uint64_t id, const char *name)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	int st = -1, ret;

	op.op = kind;
	op.chan_id = id;
	op.name = (char *)(name ? name : "");
	ret = raw_chan(r, &op, NULL, 0, &st, NULL, 0, NULL);
	return ret < 0 ? ret : st;
}

/* Becomes @uid and says hello on a raw connection. Return: 0 or 1 (logged). */
static int connect_as(uid_t uid, struct tpt_raw *r)
{
	TPT_REQUIRE(tpt_become(uid) == 0, 1, "cannot become %u", (unsigned)uid);
	TPT_REQUIRE(tpt_raw_connect(r, d.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(r, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	return 0;
}

/* Starts the daemon (chan-bytes-per-uid LIMIT), runs @owner and @writer as children, waits for
 * both and stops the daemon; skips, saying so, where not root. */
static void run_pair(tpt_child_fn owner, tpt_child_fn writer)
{
	static const char *const args[] = { "--chan-bytes-per-uid", "1M", NULL };
	pid_t o, w;

	if (geteuid() != 0) {
		printf("skipped: needs root to run clients as other uids\n");
		return;
	}
	ck_assert_int_eq(tpt_sync_init(&o_ready), 0);
	ck_assert_int_eq(tpt_sync_init(&w_done), 0);
	ck_assert_int_eq(tpt_sync_init(&o_done), 0);
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	o = tpt_fork(owner, NULL);
	w = tpt_fork(writer, NULL);
	ck_assert(tpt_wait_ok(o, 4 * T_MS, "owner"));
	ck_assert(tpt_wait_ok(w, 4 * T_MS, "writer"));
	ck_assert(tpt_daemon_alive(&d));
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
	tpt_sync_done(&o_ready);
	tpt_sync_done(&w_done);
	tpt_sync_done(&o_done);
}

/* ---- a writer of another uid fills the owner's channel ------------------------------------- */

/* uid 4242: a channel anyone may write and one of its own; once the writer filled the first, its
 * own channel still takes its whole limit, not a byte more. */
static int fill_owner(void *arg)
{
	struct tpt_raw r;
	uint64_t jobs, mine;
	int a, b, c;

	(void)arg;
	if (connect_as(OWNER, &r) ||
	    open_chan(&r, "jobs", -1, TPW__V1__ACCESS__ACCESS_ANYONE, 0, &jobs) ||
	    open_chan(&r, "mine", -1, TPW__V1__ACCESS__ACCESS_OWNER, 0, &mine))
		return 1;
	tpt_sync_post(&o_ready, 0);
	TPT_REQUIRE(tpt_sync_wait(&w_done, 4 * T_MS) == 0, 1, "no word from the writer");
	a = put(&r, mine, HALF, NULL, 0);
	b = put(&r, mine, HALF, NULL, 0);
	c = put(&r, mine, 1, NULL, 0);
	tpt_sync_post(&o_done, 0);
	TPT_REQUIRE(a == OK && b == OK, 1, "the owner's own limit with another uid's %u bytes in "
		    "its channel: %d, %d", LIMIT, a, b);
	TPT_REQUIRE(c == OVER, 1, "a byte above the owner's limit: %d", c);
	tpt_raw_close(&r);
	return 0;
}

/* uid 65534: fills the owner's channel up to its own limit (LIMIT - 1, then LIMIT); a byte more
 * is refused naming the writer's limit, and so is a byte to its own channel. */
static int fill_writer(void *arg)
{
	struct tpt_raw r;
	uint64_t jobs, own;
	char why[200] = "";
	int a, b, c, e, f;

	(void)arg;
	if (connect_as(WRITER, &r))
		return 1;
	TPT_REQUIRE(tpt_sync_wait(&o_ready, 4 * T_MS) == 0, 1, "no word from the owner");
	if (open_chan(&r, "jobs", OWNER, TPW__V1__ACCESS__ACCESS_UNSPECIFIED, 0, &jobs) ||
	    open_chan(&r, "own", -1, TPW__V1__ACCESS__ACCESS_OWNER, 0, &own))
		return 1;
	a = put(&r, jobs, HALF, NULL, 0);
	b = put(&r, jobs, HALF - 1, NULL, 0); /* just below the limit */
	c = put(&r, jobs, 1, NULL, 0);	      /* just at it */
	e = put(&r, jobs, 1, why, sizeof(why));
	f = put(&r, own, 1, NULL, 0);
	tpt_sync_post(&w_done, 0);
	TPT_REQUIRE(a == OK && b == OK && c == OK, 1, "up to the writer's limit: %d %d %d", a, b,
		    c);
	TPT_REQUIRE(e == OVER && strstr(why, "writer's chan-bytes-per-uid"), 1,
		    "a byte above the writer's limit: %d '%s'", e, why);
	TPT_REQUIRE(f == OVER, 1, "a byte to its own channel with its limit spent in another "
		    "uid's: %d", f);
	/* the items stay, unread, until the owner checked its limit */
	TPT_REQUIRE(tpt_sync_wait(&o_done, 4 * T_MS) == 0, 1, "no word from the owner");
	tpt_raw_close(&r);
	return 0;
}

START_TEST(test_another_uids_items_are_the_writers_charge)
{
	run_pair(fill_owner, fill_writer);
}
END_TEST

/* ---- the owner unlinks its channel while the writer's items stay unread -------------------- */

/* uid 4242: once the writer put HALF in its channel, unlinks it and releases its handle; its
 * whole limit is its own again. */
static int unlink_owner(void *arg)
{
	struct tpt_raw r;
	uint64_t jobs, mine;
	int u, rel, a, b, c;

	(void)arg;
	if (connect_as(OWNER, &r) ||
	    open_chan(&r, "jobs", -1, TPW__V1__ACCESS__ACCESS_ANYONE, 0, &jobs) ||
	    open_chan(&r, "mine", -1, TPW__V1__ACCESS__ACCESS_OWNER, 0, &mine))
		return 1;
	tpt_sync_post(&o_ready, 0);
	TPT_REQUIRE(tpt_sync_wait(&w_done, 4 * T_MS) == 0, 1, "no word from the writer");
	u = chan_op(&r, TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK, 0, "jobs");
	rel = chan_op(&r, TPW__V1__CHAN_OP_KIND__CHAN_OP_RELEASE, jobs, NULL);
	a = put(&r, mine, HALF, NULL, 0);
	b = put(&r, mine, HALF, NULL, 0);
	c = put(&r, mine, 1, NULL, 0);
	tpt_sync_post(&o_done, 0);
	TPT_REQUIRE(u == OK && rel == OK, 1, "unlink %d, release %d", u, rel);
	TPT_REQUIRE(a == OK && b == OK, 1, "the owner's whole limit with the writer's items "
		    "pinned in its unlinked channel: %d, %d", a, b);
	TPT_REQUIRE(c == OVER, 1, "a byte above the owner's limit: %d", c);
	tpt_raw_close(&r);
	return 0;
}

/* uid 65534: puts HALF in the owner's channel and keeps its handle without reading; the items
 * are its charge (its own channel takes HALF, not a byte more) until it releases the handle
 * (then HALF more, not a byte above). */
static int unlink_writer(void *arg)
{
	struct tpt_raw r;
	uint64_t jobs, own;
	int w, a, b, rel, c, e;

	(void)arg;
	if (connect_as(WRITER, &r))
		return 1;
	TPT_REQUIRE(tpt_sync_wait(&o_ready, 4 * T_MS) == 0, 1, "no word from the owner");
	if (open_chan(&r, "jobs", OWNER, TPW__V1__ACCESS__ACCESS_UNSPECIFIED, 0, &jobs) ||
	    open_chan(&r, "own", -1, TPW__V1__ACCESS__ACCESS_OWNER, 0, &own))
		return 1;
	w = put(&r, jobs, HALF, NULL, 0);
	tpt_sync_post(&w_done, 0);
	TPT_REQUIRE(w == OK, 1, "write to the owner's channel: %d", w);
	TPT_REQUIRE(tpt_sync_wait(&o_done, 4 * T_MS) == 0, 1, "no word from the owner");
	a = put(&r, own, HALF, NULL, 0);
	b = put(&r, own, 1, NULL, 0);
	rel = chan_op(&r, TPW__V1__CHAN_OP_KIND__CHAN_OP_RELEASE, jobs, NULL);
	c = put(&r, own, HALF, NULL, 0);
	e = put(&r, own, 1, NULL, 0);
	TPT_REQUIRE(a == OK && b == OVER, 1, "its items in the unlinked channel still its "
		    "charge: %d, %d", a, b);
	TPT_REQUIRE(rel == OK && c == OK && e == OVER, 1, "its charge gone with the channel: "
		    "release %d, %d, %d", rel, c, e);
	tpt_raw_close(&r);
	return 0;
}

START_TEST(test_unlinked_channel_with_unread_items_leaves_the_owner_whole)
{
	run_pair(unlink_owner, unlink_writer);
}
END_TEST

/* ---- two uids together within one channel's capacity ---------------------------------------- */

/* uid 4242: a channel of capacity LIMIT + HALF anyone may write; once the writer put LIMIT in
 * it, the owner's HALF fits (its own limit is whole), then not a byte: the channel is full. */
static int cap_owner(void *arg)
{
	struct tpt_raw r;
	uint64_t jobs;
	char why[200] = "";
	int a, b, c;

	(void)arg;
	if (connect_as(OWNER, &r) ||
	    open_chan(&r, "jobs", -1, TPW__V1__ACCESS__ACCESS_ANYONE, LIMIT + HALF, &jobs))
		return 1;
	tpt_sync_post(&o_ready, 0);
	TPT_REQUIRE(tpt_sync_wait(&w_done, 4 * T_MS) == 0, 1, "no word from the writer");
	a = put(&r, jobs, HALF, NULL, 0);
	b = put(&r, jobs, 1, why, sizeof(why));
	c = put(&r, jobs, HALF - 1, NULL, 0); /* not this either: the channel is full */
	tpt_sync_post(&o_done, 0);
	TPT_REQUIRE(a == OK, 1, "the channel's last HALF: %d", a);
	TPT_REQUIRE(b != OK && strstr(why, "full"), 1, "a byte above the capacity: %d '%s'", b,
		    why);
	TPT_REQUIRE(c != OK, 1, "more above the capacity: %d", c);
	tpt_raw_close(&r);
	return 0;
}

/* uid 65534: LIMIT into the owner's channel, a byte more refused (its limit). */
static int cap_writer(void *arg)
{
	struct tpt_raw r;
	uint64_t jobs;
	int a, b, c;

	(void)arg;
	if (connect_as(WRITER, &r))
		return 1;
	TPT_REQUIRE(tpt_sync_wait(&o_ready, 4 * T_MS) == 0, 1, "no word from the owner");
	if (open_chan(&r, "jobs", OWNER, TPW__V1__ACCESS__ACCESS_UNSPECIFIED, 0, &jobs))
		return 1;
	a = put(&r, jobs, HALF, NULL, 0);
	b = put(&r, jobs, HALF, NULL, 0);
	c = put(&r, jobs, 1, NULL, 0);
	tpt_sync_post(&w_done, 0);
	TPT_REQUIRE(a == OK && b == OK && c == OVER, 1, "the writer's limit in the channel: "
		    "%d %d %d", a, b, c);
	TPT_REQUIRE(tpt_sync_wait(&o_done, 4 * T_MS) == 0, 1, "no word from the owner");
	tpt_raw_close(&r);
	return 0;
}

START_TEST(test_two_uids_share_one_channels_capacity)
{
	run_pair(cap_owner, cap_writer);
}
END_TEST

/* ---- many writers' uids, each its own payer -------------------------------------------- */

#define MANY 40 /* writers' uids, each paying its whole LIMIT into one channel */

/* uid 4242: a channel anyone may write (capacity: the daemon's 64 MiB), kept open until the
 * writers are done. */
static int many_owner(void *arg)
{
	struct tpt_raw r;
	uint64_t jobs;

	(void)arg;
	if (connect_as(OWNER, &r) ||
	    open_chan(&r, "many", -1, TPW__V1__ACCESS__ACCESS_ANYONE, 0, &jobs))
		return 1;
	tpt_sync_post(&o_ready, 0);
	TPT_REQUIRE(tpt_sync_wait(&w_done, 8 * T_MS) == 0, 1, "no word from the writers");
	tpt_raw_close(&r);
	return 0;
}

/* One writer of uid @uid: its whole limit into the owner's channel (just at), a byte more
 * refused naming its own limit; its items stay there, its charge with them. Return: 0 or 1. */
static int many_one(uid_t uid)
{
	struct tpt_raw r;
	uint64_t jobs;
	char why[200] = "";
	int a, b, c, e;

	if (connect_as(uid, &r) ||
	    open_chan(&r, "many", OWNER, TPW__V1__ACCESS__ACCESS_UNSPECIFIED, 0, &jobs))
		return 1;
	a = put(&r, jobs, HALF, NULL, 0);
	b = put(&r, jobs, HALF - 1, NULL, 0);
	c = put(&r, jobs, 1, NULL, 0);
	e = put(&r, jobs, 1, why, sizeof(why));
	TPT_REQUIRE(a == OK && b == OK && c == OK, 1, "uid %u up to its limit beside %u other "
		    "payers: %d %d %d", (unsigned)uid, MANY, a, b, c);
	TPT_REQUIRE(e == OVER && strstr(why, "writer's chan-bytes-per-uid"), 1,
		    "uid %u a byte above its limit: %d '%s'", (unsigned)uid, e, why);
	tpt_raw_close(&r);
	return 0;
}

/* MANY uids, one after the other, each in a process of its own, then uid 65534 again: every
 * one finds its own charge among the others' (the daemon keeps them in a hash map). */
static int many_writers(void *arg)
{
	int bad = 0, st;

	(void)arg;
	TPT_REQUIRE(tpt_sync_wait(&o_ready, 4 * T_MS) == 0, 1, "no word from the owner");
	for (uid_t i = 0; i < MANY; i++) {
		pid_t pid = fork();

		if (pid == 0)
			_exit(many_one(20000 + i));
		TPT_REQUIRE(pid > 0 && waitpid(pid, &st, 0) == pid, 1, "fork");
		bad |= !WIFEXITED(st) || WEXITSTATUS(st);
	}
	tpt_sync_post(&w_done, 0);
	return bad;
}

START_TEST(test_many_uids_each_pay_their_own)
{
	run_pair(many_owner, many_writers);
}
END_TEST

static Suite *chanpayer_suite(void)
{
	Suite *s = suite_create("sec_chanpayer");
	TCase *tc = tcase_create("chanpayer");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_another_uids_items_are_the_writers_charge);
	tcase_add_test(tc, test_unlinked_channel_with_unread_items_leaves_the_owner_whole);
	tcase_add_test(tc, test_two_uids_share_one_channels_capacity);
	tcase_add_test(tc, test_many_uids_each_pay_their_own);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(chanpayer_suite());
}
