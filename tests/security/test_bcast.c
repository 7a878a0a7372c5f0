/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: the daemon's fan-out (Broadcast, docs/fanout.md) against an unprivileged local
 * user (uid 65534) speaking the raw protocol. A Broadcast names pipes by the sender's own ids
 * only: guessed ids of a victim's pipes (uid 4242: its connector ids and its accepted ids) each
 * get WriteDone{NOT_FOUND}, nothing reaches the victim's readers and its pipes keep working;
 * more targets than bcast-pipes-max are refused per target (STATUS_LIMIT), just below are looked
 * up; a Broadcast with no targets, more than the wire's 4096 or no message closes the attacker's
 * session only.
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
#define VICTIM_UID 4242
#define GUESSES 64
#define ACCEPT_BASE (1ull << 63)

static struct tpt_daemon d;
static struct tpt_sync ready, done;

static int drop_to(uid_t uid)
{
	if (setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 ||
	    setresuid(uid, uid, uid) < 0)
		return -errno;
	return 0;
}

/*
 * Sends Broadcast of a 4-byte inline payload to @n targets: pipe ids from @ids, write ids 1..n.
 * Return: 0, or -errno.
 */
static int raw_bcast(struct tpt_raw *r, const uint64_t *ids, size_t n, bool with_write)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Broadcast b = TPW__V1__BROADCAST__INIT;
	Tpw__V1__Write w = TPW__V1__WRITE__INIT;
	Tpw__V1__Payload pl = TPW__V1__PAYLOAD__INIT;
	Tpw__V1__Payload *plp = &pl;
	Tpw__V1__Segment seg = TPW__V1__SEGMENT__INIT;
	Tpw__V1__BroadcastTarget *tg = calloc(n + 1, sizeof(*tg));
	Tpw__V1__BroadcastTarget **tgp = calloc(n + 1, sizeof(*tgp));
	int ret = -ENOMEM;

	if (!tg || !tgp)
		goto out;
	seg.length = 4;
	seg.loc_case = TPW__V1__SEGMENT__LOC_INLINE_OFF;
	seg.inline_off = 0;
	pl.data = &seg;
	w.n_payloads = 1;
	w.payloads = &plp;
	for (size_t i = 0; i < n; i++) {
		tpw__v1__broadcast_target__init(&tg[i]);
		tg[i].pipe_id = ids[i];
		tg[i].write_id = i + 1;
		tgp[i] = &tg[i];
	}
	b.write = with_write ? &w : NULL;
	b.n_targets = n;
	b.targets = tgp;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BROADCAST;
	m.broadcast = &b;
	ret = tpt_raw_send(r, &m, with_write ? "evil" : NULL, with_write ? 4 : 0, NULL, 0, 0);
out:
	free(tg);
	free(tgp);
	return ret;
}

/* Receives @n WriteDone, one per write id 1..n, each with @status. Return: 0 or 1. */
static int expect_write_dones(struct tpt_raw *r, size_t n, Tpw__V1__Status status)
{
	uint8_t seen[8192] = { 0 };

	for (size_t i = 0; i < n; i++) {
		Tpw__V1__DaemonMsg *dm = NULL;
		int ret = tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_WRITE_DONE, T_MS, &dm);
		uint64_t id;

		TPT_REQUIRE(ret == 0, 1, "WriteDone %zu of %zu: %d", i, n, ret);
		id = dm->write_done->write_id;
		ret = dm->write_done->status == status && id >= 1 && id <= n && !seen[id];
		seen[id < n + 1 ? id : 0] = 1;
		tpw__v1__daemon_msg__free_unpacked(dm, NULL);
		TPT_REQUIRE(ret, 1, "write %llu: wrong status or repeated",
			    (unsigned long long)id);
	}
	return 0;
}

/* A fresh raw session of the attacker. */
static int attacker_session(struct tpt_raw *r)
{
	TPT_REQUIRE(tpt_raw_connect(r, d.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(r, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	return 0;
}

static int attacker_run(void)
{
	uint64_t ids[2 * GUESSES + 1];
	uint64_t *many = NULL;
	struct tpt_raw r;

	TPT_REQUIRE(tpt_sync_wait(&ready, T_MS) == 0, 1, "victim not ready");
	TPT_REQUIRE(drop_to(NOBODY) == 0, 1, "cannot drop to nobody");
	if (attacker_session(&r))
		return 1;
	/* the victim's connector ids (chosen by its library from 1) and accepted ids */
	for (uint64_t i = 0; i < GUESSES; i++) {
		ids[i] = i + 1;
		ids[GUESSES + i] = ACCEPT_BASE + i;
	}
	ids[2 * GUESSES] = 0;
	TPT_REQUIRE(raw_bcast(&r, ids, 2 * GUESSES + 1, true) == 0, 1, "send");
	if (expect_write_dones(&r, 2 * GUESSES + 1, TPW__V1__STATUS__STATUS_NOT_FOUND))
		return 1;
	/* bcast-pipes-max is 130: 131 targets are refused as a limit, before any lookup */
	ids[0] = ACCEPT_BASE + GUESSES;
	many = calloc(4097, sizeof(*many));
	TPT_REQUIRE(many != NULL, 1, "memory");
	for (size_t i = 0; i < 4097; i++)
		many[i] = ACCEPT_BASE + i;
	TPT_REQUIRE(raw_bcast(&r, many, 131, true) == 0, 1, "send");
	if (expect_write_dones(&r, 131, TPW__V1__STATUS__STATUS_LIMIT))
		return 1;
	TPT_REQUIRE(raw_bcast(&r, many, 130, true) == 0, 1, "send");
	if (expect_write_dones(&r, 130, TPW__V1__STATUS__STATUS_NOT_FOUND))
		return 1;
	/* malformed: each closes the attacker's own session */
	TPT_REQUIRE(raw_bcast(&r, many, 0, true) == 0, 1, "send");
	TPT_REQUIRE(tpt_raw_wait_closed(&r, T_MS) == 0, 1, "0 targets: the session stayed open");
	tpt_raw_close(&r);
	if (attacker_session(&r))
		return 1;
	TPT_REQUIRE(raw_bcast(&r, many, 4097, true) == 0, 1, "send");
	TPT_REQUIRE(tpt_raw_wait_closed(&r, T_MS) == 0, 1, "4097 targets: the session stayed open");
	tpt_raw_close(&r);
	if (attacker_session(&r))
		return 1;
	TPT_REQUIRE(raw_bcast(&r, many, 1, false) == 0, 1, "send");
	TPT_REQUIRE(tpt_raw_wait_closed(&r, T_MS) == 0, 1, "no message: the session stayed open");
	tpt_raw_close(&r);
	free(many);
	return 0;
}

static int attacker(void *arg)
{
	int r = attacker_run();

	(void)arg;
	tpt_sync_post(&done, (int8_t)(r ? -1 : 0)); /* the victim checks its pipes either way */
	return r;
}

/* The victim (uid 4242): a listener, a pipe to itself, broadcasts through its own set; after the
 * attack nothing arrived on its pipe and both directions still work. */
static int victim(void *arg)
{
	struct tp_context *ctx = NULL;
	struct tp_listener *l = NULL;
	struct tp_pipe *conn = NULL, *acc = NULL;
	struct tp_pipe_set *s = NULL;
	struct tp_descriptor *desc = NULL;
	struct tp_pipe *rp = NULL;
	char buf[8] = "", ok[8] = "ok";
	struct tp_payload pl = { .data = ok, .length = 3 };
	struct tp_message m = { .payloads = &pl, .n_payloads = 1 };
	struct tp_slot slot = { .data = buf };
	struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };
	int st = 1, r;

	(void)arg;
	TPT_REQUIRE(drop_to(VICTIM_UID) == 0, 1, "cannot drop to %d", VICTIM_UID);
	r = tpt_ctx_new(&d, 0, "victim", &ctx);
	if (r == 0)
		r = tp_listen(ctx, "victim", NULL, &l);
	if (r == 0)
		r = tp_connect(ctx, "victim", &conn);
	if (r == 0)
		r = tp_listener_accept_sync(l, T_MS, &acc);
	if (r == 0)
		r = tp_set_new(ctx, 1, &s);
	if (r == 0)
		r = tp_set_add(s, acc);
	TPT_REQUIRE(r == 0, 1, "set up: %d %s", r, tp_last_error());
	tpt_sync_post(&ready, 0);
	TPT_REQUIRE(tpt_sync_wait(&done, 4 * T_MS) == 0, 1, "attacker did not finish");
	/* nothing of the attacker's arrived on either end */
	r = tp_pipe_read_descriptor_sync(conn, 200, &desc);
	TPT_REQUIRE(r == -ETIMEDOUT, 1, "the victim's connector got a message: %d", r);
	r = tp_set_read_any(s, 200, &rp, &desc);
	TPT_REQUIRE(r == -ETIMEDOUT, 1, "the victim's accepted pipe got a message: %d", r);
	/* its own broadcast, fanned out by the daemon (eager: done once queued), still works */
	TPT_REQUIRE(tp_set_set_fanout(s, TP_FANOUT_DAEMON) == 0, 1, "mode");
	r = tp_set_broadcast(s, &m, T_MS, &st, 1);
	TPT_REQUIRE(r == 1 && st == 0, 1, "own broadcast: %d %d %s", r, st, tp_last_error());
	r = tp_pipe_read_descriptor_sync(conn, T_MS, &desc);
	if (r == 0)
		r = tp_pipe_read_sync(conn, desc, &a);
	TPT_REQUIRE(r == 0 && strcmp(buf, "ok") == 0, 1, "own read: %d %s", r, tp_last_error());
	tp_set_free(s);
	tp_pipe_close(conn);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_bcast_names_no_pipe_of_another_session_or_uid)
{
	static const char *const args[] = { "--bcast-pipes-max", "130", NULL };

	if (geteuid() != 0) {
		printf("skipped: needs root to run clients as other uids\n");
		return;
	}
	ck_assert_int_eq(tpt_sync_init(&ready), 0);
	ck_assert_int_eq(tpt_sync_init(&done), 0);
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	{
		pid_t v = tpt_fork(victim, NULL);
		bool ok = tpt_wait_ok(tpt_fork(attacker, NULL), 4 * T_MS, "attacker");

		ok = tpt_wait_ok(v, 4 * T_MS, "victim") && ok;
		ck_assert(ok);
	}
	ck_assert(tpt_daemon_alive(&d));
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
	tpt_sync_done(&ready);
	tpt_sync_done(&done);
}
END_TEST

static Suite *bcast_suite(void)
{
	Suite *s = suite_create("sec_bcast");
	TCase *tc = tcase_create("bcast");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_bcast_names_no_pipe_of_another_session_or_uid);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(bcast_suite());
}
