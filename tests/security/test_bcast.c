/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: the daemon's fan-out (Broadcast, docs/fanout.md) against an unprivileged local
 * user (uid 65534) speaking the raw protocol. A Broadcast names pipes by the sender's own ids
 * only: guessed ids of a victim's pipes (uid 4242: its connector ids and its accepted ids) each
 * get WriteDone{NOT_FOUND}, nothing reaches the victim's readers and its pipes keep working;
 * more targets than bcast-pipes-max are refused per target (STATUS_LIMIT), just below are looked
 * up; a Broadcast with no targets, more than the wire's 4096 or no message closes the attacker's
 * session only.
 *
 * And a hostile peer daemon (a raw dialler over an insecure link): a PeerBcast naming pipe ids
 * that are not its link's (the host's local pipe among the guesses) or a pipe twice is refused
 * (PeerConsumed{INVALID} for the targets on its pipes) and the link stays; a valid one whose
 * bytes it then refuses to send fails both deliveries only; 4097 targets fail its link; the
 * host's local pipe gets nothing and the daemon lives.
 */
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "frame.h"
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

/* ---- a hostile peer daemon ----------------------------------------------------------------- */

static struct tpt_daemon host;
static struct tpt_sync peer_ready, local_ready;

/* Dials @host's peer port as a daemon would (insecure: plain frames), up to the link being up. */
static int peer_dial(struct tpt_raw *c, struct tpt_raw *data)
{
	const struct tpt_raw_peer_hello h = { .port = host.peer_port, .boot_base = 0xb0,
					      .instance = 0xbca5, .timeout_ms = T_MS };

	return tpt_raw_peer_dial(&h, c, data);
}

/* The next peer message of kind @body (others, pings included, are dropped). */
static int peer_expect(struct tpt_raw *c, int body, Tpw__V1__PeerMsg **ret)
{
	for (;;) {
		int e = tpt_raw_recv_peer(c, T_MS, ret);

		if (e < 0)
			return e;
		if ((int)(*ret)->body_case == body)
			return 0;
		tpw_peer_msg_free(*ret);
	}
}

/* Opens pipe @id to the host's listener "fan". Return: the host's pipe id, or 0. */
static uint64_t peer_connect(struct tpt_raw *c, uint64_t id)
{
	Tpw__V1__PeerConnect pc = TPW__V1__PEER_CONNECT__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT, *in = NULL;
	uint64_t host_id = 0;

	pc.pipe_id = id;
	pc.name = "fan";
	pc.remote_name = "hostile";
	m.body_case = TPW__V1__PEER_MSG__BODY_CONNECT;
	m.connect = &pc;
	if (tpt_raw_send_peer(c, &m) < 0 ||
	    peer_expect(c, TPW__V1__PEER_MSG__BODY_CONNECT_REPLY, &in) < 0)
		return 0;
	if (in->connect_reply->pipe_id == id &&
	    in->connect_reply->status == TPW__V1__STATUS__STATUS_OK)
		host_id = in->connect_reply->peer_pipe_id;
	tpw_peer_msg_free(in);
	return host_id;
}

/* Sends PeerBcast of one @len-byte payload (rendezvous) to @n pipes @ids, message ids 1..n. */
static int peer_bcast_len(struct tpt_raw *c, const uint64_t *ids, size_t n, uint64_t len)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerBcast b = TPW__V1__PEER_BCAST__INIT;
	Tpw__V1__Descriptor dd = TPW__V1__DESCRIPTOR__INIT;
	Tpw__V1__PayloadDesc pd = TPW__V1__PAYLOAD_DESC__INIT, *pdp = &pd;
	Tpw__V1__PeerBcastTarget *t = calloc(n + 1, sizeof(*t));
	Tpw__V1__PeerBcastTarget **tp = calloc(n + 1, sizeof(*tp));
	int r = -ENOMEM;

	if (t && tp) {
		pd.length = len;
		dd.n_payloads = 1;
		dd.payloads = &pdp;
		for (size_t i = 0; i < n; i++) {
			tpw__v1__peer_bcast_target__init(&t[i]);
			t[i].pipe_id = ids[i];
			t[i].msg_id = i + 1;
			tp[i] = &t[i];
		}
		b.descriptor = &dd;
		b.n_targets = n;
		b.targets = tp;
		m.body_case = TPW__V1__PEER_MSG__BODY_BCAST;
		m.bcast = &b;
		r = tpt_raw_send_peer(c, &m);
	}
	free(t);
	free(tp);
	return r;
}

/* Sends PeerBcast of one 4 KiB payload (rendezvous) to @n pipes @ids, message ids 1..n. */
static int peer_bcast(struct tpt_raw *c, const uint64_t *ids, size_t n)
{
	return peer_bcast_len(c, ids, n, 4096);
}

/* The next PeerConsumed: 0 if it is for pipe @pipe (the hostile side's id) with @status. */
static int peer_consumed(struct tpt_raw *c, uint64_t pipe, Tpw__V1__Status status)
{
	Tpw__V1__PeerMsg *in = NULL;
	int ok;

	if (peer_expect(c, TPW__V1__PEER_MSG__BODY_CONSUMED, &in) < 0)
		return -1;
	ok = in->consumed->pipe_id == pipe && in->consumed->status == status;
	tpw_peer_msg_free(in);
	return ok ? 0 : -1;
}

static int hostile_bcast_peer(void *arg)
{
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT, *in = NULL;
	Tpw__V1__PeerXferEnd xe = TPW__V1__PEER_XFER_END__INIT;
	uint64_t a, b, ids[10], *many;
	int st;

	(void)arg;
	TPT_REQUIRE(peer_dial(&c, &data) == 0, 1, "dial");
	a = peer_connect(&c, 1);
	b = peer_connect(&c, 2);
	TPT_REQUIRE(a && b, 1, "connects refused");
	tpt_sync_post(&peer_ready, 0);
	TPT_REQUIRE(tpt_sync_wait(&local_ready, T_MS) == 0, 1, "no local pipe");
	/* pipe ids that are not this link's (the host's own local pipe among them) */
	ids[0] = a;
	for (uint64_t i = 1; i < 10; i++)
		ids[i] = b + i;
	TPT_REQUIRE(peer_bcast(&c, ids, 10) == 0, 1, "send");
	TPT_REQUIRE(peer_consumed(&c, 1, TPW__V1__STATUS__STATUS_INVALID) == 0, 1,
		    "pipe a not refused");
	/* a pipe named twice */
	ids[1] = a;
	TPT_REQUIRE(peer_bcast(&c, ids, 2) == 0, 1, "send");
	TPT_REQUIRE(peer_consumed(&c, 1, TPW__V1__STATUS__STATUS_INVALID) == 0 &&
			    peer_consumed(&c, 1, TPW__V1__STATUS__STATUS_INVALID) == 0, 1,
		    "a twice not refused");
	/* a valid one: the host reads it once (PeerReadReq.bcast); refusing to send the bytes
	 * fails both deliveries, and the link stays */
	ids[0] = a;
	ids[1] = b;
	TPT_REQUIRE(peer_bcast(&c, ids, 2) == 0, 1, "send");
	TPT_REQUIRE(peer_expect(&c, TPW__V1__PEER_MSG__BODY_READ_REQ, &in) == 0, 1, "no read");
	TPT_REQUIRE(in->read_req->bcast && (in->read_req->pipe_id == 1 ||
					    in->read_req->pipe_id == 2), 1, "not a broadcast read");
	xe.xfer_id = in->read_req->xfer_id;
	xe.status = TPW__V1__STATUS__STATUS_IO;
	xe.message = "not sending";
	tpw_peer_msg_free(in);
	m.body_case = TPW__V1__PEER_MSG__BODY_XFER_END;
	m.xfer_end = &xe;
	TPT_REQUIRE(tpt_raw_send_peer(&c, &m) == 0, 1, "xfer end");
	for (int k = 0; k < 2; k++) {
		TPT_REQUIRE(peer_expect(&c, TPW__V1__PEER_MSG__BODY_CONSUMED, &in) == 0, 1,
			    "no consumed");
		st = in->consumed->status;
		tpw_peer_msg_free(in);
		TPT_REQUIRE(st != TPW__V1__STATUS__STATUS_OK, 1, "a delivery without bytes");
	}
	/* over the wire's bound: a malformed frame, the link fails */
	many = calloc(4097, sizeof(*many));
	TPT_REQUIRE(many != NULL, 1, "memory");
	for (size_t i = 0; i < 4097; i++)
		many[i] = a;
	TPT_REQUIRE(peer_bcast(&c, many, 4097) == 0, 1, "send");
	free(many);
	for (;;) {
		st = tpt_raw_recv_peer(&c, T_MS, &in);
		if (st < 0)
			break;
		tpw_peer_msg_free(in);
	}
	TPT_REQUIRE(st == -ECONNRESET, 1, "the link stayed after 4097 targets: %d", st);
	tpt_raw_close(&data);
	tpt_raw_close(&c);
	return 0;
}

START_TEST(test_bcast_hostile_peer_fails_its_request_then_its_link_only)
{
	static const char *const args[] = { "--peer-insecure", NULL };
	struct tp_listen_options lo = { .size = sizeof(lo), .remote = TP_REMOTE_ANY_PEER };
	struct tp_context *ctx, *v;
	struct tp_listener *l, *lv;
	struct tp_pipe *pa, *pb, *vc, *va;
	struct tp_descriptor *dsc = NULL;
	char buf[4096];
	struct tp_slot slot = { .data = buf };
	struct tp_allocation al = { .payloads = &slot, .n_payloads = 1 };
	pid_t pid;

	ck_assert_int_eq(tpt_sync_init(&peer_ready), 0);
	ck_assert_int_eq(tpt_sync_init(&local_ready), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&host, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&host, 0, "readers", &ctx), 0);
	ck_assert_int_eq(tp_listen(ctx, "fan", &lo, &l), 0);
	pid = tpt_fork(hostile_bcast_peer, NULL);
	ck_assert_int_eq(tpt_sync_wait(&peer_ready, T_MS), 0);
	ck_assert_int_eq(tp_listener_accept_sync(l, T_MS, &pa), 0);
	ck_assert_int_eq(tp_listener_accept_sync(l, T_MS, &pb), 0);
	/* a local pipe, whose id follows the link's */
	ck_assert_int_eq(tpt_ctx_new(&host, 0, "victim", &v), 0);
	ck_assert_int_eq(tp_listen(v, "local", NULL, &lv), 0);
	ck_assert_int_eq(tp_connect(v, "local", &vc), 0);
	ck_assert_int_eq(tp_listener_accept_sync(lv, T_MS, &va), 0);
	ck_assert_int_eq(tpt_sync_post(&local_ready, 0), 0);
	/* the valid broadcast's two deliveries: a descriptor each, and a failed read */
	ck_assert_int_eq(tp_pipe_read_descriptor_sync(pa, T_MS, &dsc), 0);
	ck_assert_int_lt(tp_pipe_read_sync(pa, dsc, &al), 0);
	ck_assert_int_eq(tp_pipe_read_descriptor_sync(pb, T_MS, &dsc), 0);
	ck_assert_int_lt(tp_pipe_read_sync(pb, dsc, &al), 0);
	ck_assert(tpt_wait_ok(pid, 4 * T_MS, "hostile peer"));
	ck_assert(tpt_daemon_alive(&host));
	/* nothing reached the local pipe, which still works */
	ck_assert_int_eq(tp_pipe_read_descriptor_sync(va, 200, &dsc), -ETIMEDOUT);
	ck_assert_int_eq(tp_pipe_read_descriptor_sync(vc, 200, &dsc), -ETIMEDOUT);
	tp_pipe_close(vc);
	tp_pipe_close(va);
	tp_listener_close(lv);
	tp_context_free(v);
	tp_pipe_close(pa);
	tp_pipe_close(pb);
	tp_listener_close(l);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&host), 0);
	tpt_sync_done(&peer_ready);
	tpt_sync_done(&local_ready);
}
END_TEST

/* ---- a peer that stalls its broadcast's one transfer ---------------------------------------- */

#define STALL_LEN (16ull << 20)
#define STALL_SENT (15ull << 20)
#define STALL_TIMEOUT_MS 1000

static struct tpt_sync stall_staged, stall_gone;

/* `tpipctl --json status` of @host: member @key, or UINT64_MAX. */
static uint64_t status_u64(const char *key)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", host.socket, "--json", "status", NULL };
	struct tpt_cmd_result res;
	struct json_object *o, *v;
	uint64_t val = UINT64_MAX;

	if (!bin || tpt_run(argv, T_MS, &res) < 0)
		return UINT64_MAX;
	o = json_tokener_parse(res.out);
	if (o && json_object_object_get_ex(o, key, &v))
		val = (uint64_t)json_object_get_int64(v);
	json_object_put(o);
	tpt_cmd_result_free(&res);
	return val;
}

/* Keeps the link alive (a ping every 200 ms, everything received dropped) until @until posts. */
/* Set in the stalling peer: keep_alive() also sends a 1-byte chunk of a transfer nobody posted
 * on this data connection at each ping (bytes on the link, none of the stalled transfer's). */
static struct tpt_raw *stray_data;

static void keep_alive(struct tpt_raw *c, struct tpt_sync *until)
{
	Tpw__V1__PeerPing ping = TPW__V1__PEER_PING__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT, *in = NULL;

	pm.body_case = TPW__V1__PEER_MSG__BODY_PING;
	pm.ping = &ping;
	for (;;) {
		if (tpt_sync_wait(until, 0) == 0)
			return;
		ping.t_ns++;
		if (tpt_raw_send_peer(c, &pm) < 0)
			return;
		if (stray_data && tpt_raw_send_chunk(stray_data, 0x5eed5eed, 0, 1, 0x5a) < 0)
			return;
		while (tpt_raw_recv_peer(c, 200, &in) == 0)
			tpw_peer_msg_free(in);
	}
}

static struct tpt_sync stall_left;

/* Broadcasts 16 MiB to one pipe of its link, sends 15 MiB of the host's one read, then stops
 * sending while it keeps the link alive; with @arg, it sends the last 1 MiB once stall_left
 * posts. */
static int stalling_bcast_peer(void *arg)
{
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	Tpw__V1__PeerMsg *in = NULL;
	uint64_t a, xfer;

	TPT_REQUIRE(peer_dial(&c, &data) == 0, 1, "dial");
	a = peer_connect(&c, 1);
	TPT_REQUIRE(a, 1, "connect refused");
	TPT_REQUIRE(peer_bcast_len(&c, &a, 1, STALL_LEN) == 0, 1, "send");
	TPT_REQUIRE(peer_expect(&c, TPW__V1__PEER_MSG__BODY_READ_REQ, &in) == 0, 1, "no read");
	TPT_REQUIRE(in->read_req->bcast, 1, "not a broadcast read");
	xfer = in->read_req->xfer_id;
	tpw_peer_msg_free(in);
	for (uint64_t off = 0; off < STALL_SENT; off += 1u << 20)
		TPT_REQUIRE(tpt_raw_send_chunk(&data, xfer, off, 1u << 20, 0x5a) == 0, 1,
			    "chunk");
	tpt_sync_post(&stall_staged, 0);
	if (arg == &stray_data) {
		stray_data = &data;
		arg = NULL;
	}
	if (arg) {
		keep_alive(&c, &stall_left);
		TPT_REQUIRE(tpt_raw_send_chunk(&data, xfer, STALL_SENT, 1u << 20, 0x5a) == 0, 1,
			    "last chunk");
	}
	keep_alive(&c, &stall_gone);
	tpt_raw_close(&data);
	tpt_raw_close(&c);
	return 0;
}

/*
 * A peer's broadcast is staged in the host daemon's memory (charged to the link, not to the
 * reader). Once its only reader has closed its pipe, a sender that stalls mid-transfer while its
 * link stays alive must not keep that staging: like a channel item's receive
 * (tpd_chan_stream_deadline()), it has to end after --peer-timeout without bytes.
 */
START_TEST(test_bcast_stalled_peer_does_not_hold_staging_after_its_readers)
{
	static const char *const args[] = { "--peer-insecure", "--peer-timeout", "1000", NULL };
	struct tp_listen_options lo = { .size = sizeof(lo), .remote = TP_REMOTE_ANY_PEER };
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *pa;
	struct tp_descriptor *dsc = NULL;
	uint64_t held = UINT64_MAX;
	pid_t pid;

	ck_assert_int_eq(tpt_sync_init(&stall_staged), 0);
	ck_assert_int_eq(tpt_sync_init(&stall_gone), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&host, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&host, 0, "reader", &ctx), 0);
	ck_assert_int_eq(tp_listen(ctx, "fan", &lo, &l), 0);
	pid = tpt_fork(stalling_bcast_peer, NULL);
	ck_assert_int_eq(tp_listener_accept_sync(l, T_MS, &pa), 0);
	ck_assert_int_eq(tp_pipe_read_descriptor_sync(pa, T_MS, &dsc), 0);
	ck_assert_int_eq(tpt_sync_wait(&stall_staged, T_MS), 0);
	ck_assert_uint_eq(status_u64("bcast_stage_held"), STALL_LEN);
	/* the only reader drops the message and goes */
	tp_descriptor_free(dsc);
	tp_pipe_close(pa);
	tp_listener_close(l);
	tp_context_free(ctx);
	for (int i = 0; i < 8 * STALL_TIMEOUT_MS / 250; i++) {
		usleep(250 * 1000);
		held = status_u64("bcast_stage_held");
		if (held == 0)
			break;
	}
	fprintf(stderr, "staging held %llu bytes %d ms after the last reader left, link alive, "
		"daemon RSS %ld KiB\n", (unsigned long long)held, 8 * STALL_TIMEOUT_MS,
		tpt_daemon_rss_kb(&host));
	tpt_sync_post(&stall_gone, 0);
	ck_assert(tpt_wait_ok(pid, 4 * T_MS, "stalling peer"));
	ck_assert(tpt_daemon_alive(&host));
	if (held != 0) { /* what ends it today: the link's end */
		uint64_t after = UINT64_MAX;

		for (int i = 0; i < 40 && after != 0; i++) {
			usleep(250 * 1000);
			after = status_u64("bcast_stage_held");
		}
		fprintf(stderr, "staging held %llu bytes once the peer closed its link\n",
			(unsigned long long)after);
	}
	ck_assert_uint_eq(held, 0);
	ck_assert_int_eq(tpt_daemon_stop(&host), 0);
	tpt_sync_done(&stall_staged);
	tpt_sync_done(&stall_gone);
}
END_TEST

/* @ms as a flag's value, scaled by tpt_time_scale() (a daemon under valgrind is slower). */
static const char *scaled_arg(char *buf, size_t len, int ms)
{
	snprintf(buf, len, "%d", TPT_SCALED_MS(ms));
	return buf;
}

/* `tpipctl status`'s bcast_stage_held, polled every 250 ms for up to @ms (scaled) until it is
 * 0. */
static uint64_t held_after(int ms)
{
	uint64_t held = status_u64("bcast_stage_held");

	for (int i = 0; i < TPT_SCALED_MS(ms) / 250 && held != 0; i++) {
		usleep(250 * 1000);
		held = status_u64("bcast_stage_held");
	}
	return held;
}

/* The peer gets the stall_gone word and ends well; the host daemon lives and stops. */
static void stall_end(pid_t peer)
{
	tpt_sync_post(&stall_gone, 0);
	ck_assert(tpt_wait_ok(peer, 4 * T_MS, "stalling peer"));
	ck_assert(tpt_daemon_alive(&host));
	ck_assert_int_eq(tpt_daemon_stop(&host), 0);
	tpt_sync_done(&stall_staged);
	tpt_sync_done(&stall_gone);
	tpt_sync_done(&stall_left);
}

/* Starts the host with --peer-timeout @timeout_ms (scaled). */
static void stall_init(int timeout_ms)
{
	char ms[16];
	const char *args[] = { "--peer-insecure", "--peer-timeout",
			       scaled_arg(ms, sizeof(ms), timeout_ms), NULL };

	ck_assert_int_eq(tpt_sync_init(&stall_staged), 0);
	ck_assert_int_eq(tpt_sync_init(&stall_gone), 0);
	ck_assert_int_eq(tpt_sync_init(&stall_left), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&host, args), 0);
}

struct read_end {
	int status; /* 1 until the read's callback ran */
	uint64_t ms;
};

static void read_on_done(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	struct read_end *e = arg;

	(void)p;
	(void)errmsg;
	e->ms = tpt_now_ms();
	__atomic_store_n(&e->status, status, __ATOMIC_RELEASE);
}

static struct tpt_sync reader_listening, reader_reads;

/* A reader in a process of its own: accepts the peer's pipe, asks for the broadcast's bytes
 * into its private memory and waits to be killed. */
static int doomed_reader(void *arg)
{
	struct tp_listen_options lo = { .size = sizeof(lo), .remote = TP_REMOTE_ANY_PEER };
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	struct tp_descriptor *dsc = NULL;
	struct tp_slot slot = { .data = malloc(STALL_LEN) };
	struct tp_allocation al = { .payloads = &slot, .n_payloads = 1 };
	struct read_end e = { .status = 1 };

	(void)arg;
	TPT_REQUIRE(slot.data, 1, "memory");
	TPT_REQUIRE(tpt_ctx_new(&host, 0, "doomed", &ctx) == 0, 1, "context");
	TPT_REQUIRE(tp_listen(ctx, "fan", &lo, &l) == 0, 1, "listen");
	tpt_sync_post(&reader_listening, 0);
	TPT_REQUIRE(tp_listener_accept_sync(l, T_MS, &p) == 0, 1, "accept");
	TPT_REQUIRE(tp_pipe_read_descriptor_sync(p, T_MS, &dsc) == 0, 1, "descriptor");
	TPT_REQUIRE(tp_pipe_read(p, dsc, &al, read_on_done, &e) == 0, 1, "read");
	tpt_sync_post(&reader_reads, 0);
	for (;;)
		pause();
	return 1;
}

/*
 * The same stalled broadcast, whose only reader is killed while its read of the message waits
 * for the staging: the staging goes with the reader, well before any deadline (--peer-timeout
 * 60000).
 */
START_TEST(test_bcast_stalled_peer_does_not_hold_staging_after_its_reader_is_killed)
{
	pid_t rd, pid;
	uint64_t held;
	int status;

	stall_init(60000);
	ck_assert_int_eq(tpt_sync_init(&reader_listening), 0);
	ck_assert_int_eq(tpt_sync_init(&reader_reads), 0);
	rd = tpt_fork(doomed_reader, NULL);
	ck_assert_int_eq(tpt_sync_wait(&reader_listening, T_MS), 0);
	pid = tpt_fork(stalling_bcast_peer, NULL);
	ck_assert_int_eq(tpt_sync_wait(&reader_reads, T_MS), 0);
	ck_assert_int_eq(tpt_sync_wait(&stall_staged, T_MS), 0);
	ck_assert_uint_eq(status_u64("bcast_stage_held"), STALL_LEN);
	ck_assert_int_eq(kill(rd, SIGKILL), 0);
	ck_assert_int_eq(tpt_wait(rd, T_MS, &status), 0);
	held = held_after(4000);
	fprintf(stderr, "staging held %llu bytes within 4 s after the reader was killed\n",
		(unsigned long long)held);
	ck_assert_uint_eq(held, 0);
	stall_end(pid);
	tpt_sync_done(&reader_listening);
	tpt_sync_done(&reader_reads);
}
END_TEST

/* The same, but the peer sends the broadcast's last chunk after the only reader dropped the
 * message and closed its pipe: the staging goes all the same. */
START_TEST(test_bcast_peer_finishing_after_its_reader_left_does_not_hold_staging)
{
	struct tp_listen_options lo = { .size = sizeof(lo), .remote = TP_REMOTE_ANY_PEER };
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *pa;
	struct tp_descriptor *dsc = NULL;
	uint64_t held;
	pid_t pid;

	stall_init(60000);
	ck_assert_int_eq(tpt_ctx_new(&host, 0, "reader", &ctx), 0);
	ck_assert_int_eq(tp_listen(ctx, "fan", &lo, &l), 0);
	pid = tpt_fork(stalling_bcast_peer, &stall_left);
	ck_assert_int_eq(tp_listener_accept_sync(l, T_MS, &pa), 0);
	ck_assert_int_eq(tp_pipe_read_descriptor_sync(pa, T_MS, &dsc), 0);
	ck_assert_int_eq(tpt_sync_wait(&stall_staged, T_MS), 0);
	tp_descriptor_free(dsc);
	tp_pipe_close(pa);
	tp_listener_close(l);
	tp_context_free(ctx);
	tpt_sync_post(&stall_left, 0);
	held = held_after(4000);
	fprintf(stderr, "staging held %llu bytes within 4 s after the broadcast's last chunk "
		"came\n", (unsigned long long)held);
	ck_assert_uint_eq(held, 0);
	stall_end(pid);
}
END_TEST

/*
 * A reader that waits for the stalled broadcast's bytes, its pipe open: with --peer-timeout 1000
 * its read fails within a few seconds (no byte of the transfer for that long), the staging goes
 * and the link stays.
 */
START_TEST(test_bcast_stalled_peer_fails_its_staging_receive_after_peer_timeout)
{
	void *how = _i ? (void *)&stray_data : NULL; /* 1: chunks of no transfer keep coming */
	struct tp_listen_options lo = { .size = sizeof(lo), .remote = TP_REMOTE_ANY_PEER };
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *pa;
	struct tp_descriptor *dsc = NULL;
	struct tp_slot slot = { .data = malloc(STALL_LEN) };
	struct tp_allocation al = { .payloads = &slot, .n_payloads = 1 };
	struct read_end e = { .status = 1 };
	uint64_t t0, held;
	pid_t pid;

	ck_assert_ptr_nonnull(slot.data);
	stall_init(1000);
	ck_assert_int_eq(tpt_ctx_new(&host, 0, "reader", &ctx), 0);
	ck_assert_int_eq(tp_listen(ctx, "fan", &lo, &l), 0);
	pid = tpt_fork(stalling_bcast_peer, how);
	ck_assert_int_eq(tp_listener_accept_sync(l, T_MS, &pa), 0);
	ck_assert_int_eq(tp_pipe_read_descriptor_sync(pa, T_MS, &dsc), 0);
	ck_assert_int_eq(tpt_sync_wait(&stall_staged, T_MS), 0);
	t0 = tpt_now_ms();
	ck_assert_int_eq(tp_pipe_read(pa, dsc, &al, read_on_done, &e), 0);
	for (int i = 0; i < TPT_SCALED_MS(10000) / 250 &&
			__atomic_load_n(&e.status, __ATOMIC_ACQUIRE) == 1; i++)
		usleep(250 * 1000);
	held = status_u64("bcast_stage_held");
	fprintf(stderr, "read ended with %d after %llu ms, staging held %llu bytes then\n",
		__atomic_load_n(&e.status, __ATOMIC_ACQUIRE),
		(unsigned long long)(e.ms ? e.ms - t0 : 0), (unsigned long long)held);
	ck_assert_int_lt(__atomic_load_n(&e.status, __ATOMIC_ACQUIRE), 0);
	ck_assert_uint_lt(e.ms - t0, TPT_SCALED_MS(5000));
	ck_assert_uint_eq(held, 0);
	tp_pipe_close(pa);
	tp_listener_close(l);
	tp_context_free(ctx);
	free(slot.data);
	/* the link stays: the peer, still pinging, ends well */
	stall_end(pid);
}
END_TEST

/* ---- a peer with two links: one staging limit ---------------------------------------------- */

#define TWO_LIMIT (1ull << 20)

static struct tpt_sync two_sent;

/* Opens two links from the same address, a pipe to "fan" over each, and broadcasts
 * bcast-stage-bytes-per-uid's worth to each pipe (never sending a byte); keeps the first link
 * alive until stall_gone. */
static int two_link_peer(void *arg)
{
	struct tpt_raw c[2] = { { .fd = -1 }, { .fd = -1 } };
	struct tpt_raw data[2] = { { .fd = -1 }, { .fd = -1 } };
	Tpw__V1__PeerMsg *in = NULL;
	uint64_t a[2];

	(void)arg;
	for (int i = 0; i < 2; i++) {
		TPT_REQUIRE(peer_dial(&c[i], &data[i]) == 0, 1, "dial %d", i);
		a[i] = peer_connect(&c[i], 1);
		TPT_REQUIRE(a[i], 1, "connect refused on link %d", i);
	}
	TPT_REQUIRE(peer_bcast_len(&c[0], &a[0], 1, TWO_LIMIT) == 0, 1, "send");
	/* staged: the host asks for the bytes at once */
	TPT_REQUIRE(peer_expect(&c[0], TPW__V1__PEER_MSG__BODY_READ_REQ, &in) == 0, 1, "no read");
	TPT_REQUIRE(in->read_req->bcast, 1, "not a broadcast read");
	tpw_peer_msg_free(in);
	TPT_REQUIRE(peer_bcast_len(&c[1], &a[1], 1, TWO_LIMIT) == 0, 1, "send");
	tpt_sync_post(&two_sent, 0);
	keep_alive(&c[0], &stall_gone);
	for (int i = 0; i < 2; i++) {
		tpt_raw_close(&data[i]);
		tpt_raw_close(&c[i]);
	}
	return 0;
}

/*
 * The staging of a peer's broadcasts is charged to the peer (here, its address: an insecure
 * link proves no identity), not to each of its links: with bcast-stage-bytes-per-uid 1 MiB, a
 * peer that opens two links from one address and broadcasts 1 MiB over each gets the first
 * staged (just at the limit) and the second not (1 MiB above it): 1 MiB held, not 2.
 */
START_TEST(test_bcast_two_links_of_one_peer_share_its_staging_limit)
{
	char ms[16];
	const char *args[] = { "--peer-insecure", "--peer-timeout",
			       scaled_arg(ms, sizeof(ms), 60000), "--bcast-stage-bytes-per-uid",
			       "1M", NULL };
	struct tp_listen_options lo = { .size = sizeof(lo), .remote = TP_REMOTE_ANY_PEER };
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p[2];
	struct tp_descriptor *dsc[2] = { NULL, NULL };
	uint64_t held, unstaged;
	pid_t pid;

	ck_assert_int_eq(tpt_sync_init(&two_sent), 0);
	ck_assert_int_eq(tpt_sync_init(&stall_gone), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&host, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&host, 0, "reader", &ctx), 0);
	ck_assert_int_eq(tp_listen(ctx, "fan", &lo, &l), 0);
	pid = tpt_fork(two_link_peer, NULL);
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(tp_listener_accept_sync(l, T_MS, &p[i]), 0);
	ck_assert_int_eq(tpt_sync_wait(&two_sent, T_MS), 0);
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(tp_pipe_read_descriptor_sync(p[i], T_MS, &dsc[i]), 0);
	held = status_u64("bcast_stage_held");
	unstaged = status_u64("bcast_unstaged");
	fprintf(stderr, "two links of one peer: %llu bytes staged, %llu broadcasts not staged\n",
		(unsigned long long)held, (unsigned long long)unstaged);
	ck_assert_uint_eq(held, TWO_LIMIT);
	ck_assert_uint_eq(unstaged, 1);
	for (int i = 0; i < 2; i++) {
		tp_descriptor_free(dsc[i]);
		tp_pipe_close(p[i]);
	}
	tp_listener_close(l);
	tp_context_free(ctx);
	tpt_sync_post(&stall_gone, 0);
	ck_assert(tpt_wait_ok(pid, 4 * T_MS, "two-link peer"));
	ck_assert(tpt_daemon_alive(&host));
	ck_assert_uint_eq(held_after(4000), 0);
	ck_assert_int_eq(tpt_daemon_stop(&host), 0);
	tpt_sync_done(&two_sent);
	tpt_sync_done(&stall_gone);
}
END_TEST

/* ---- a reader's daemon that stops reading its data connection ------------------------------ */

#define UNREAD_LEN (64ull << 20)

static struct tpt_sync unread_asked, unread_done;

/* Opens @arg (1 or 2) pipes to "fan" on one link, asks for the bytes of the first message the
 * host announces (a PeerDescriptor, or a PeerBcast's first target), then never reads its data
 * connection while it keeps the link alive with pings. */
static int unread_data_peer(void *arg)
{
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	Tpw__V1__PeerReadReq rr = TPW__V1__PEER_READ_REQ__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT, *in = NULL;
	size_t n = (size_t)(uintptr_t)arg;
	uint64_t a[2] = { 0, 0 };

	TPT_REQUIRE(peer_dial(&c, &data) == 0, 1, "dial");
	for (size_t i = 0; i < n; i++) {
		a[i] = peer_connect(&c, i + 1);
		TPT_REQUIRE(a[i], 1, "connect refused");
	}
	for (;;) {
		TPT_REQUIRE(tpt_raw_recv_peer(&c, T_MS, &in) == 0, 1, "no announcement");
		if (in->body_case == TPW__V1__PEER_MSG__BODY_DESCRIPTOR) {
			rr.pipe_id = a[in->descriptor->pipe_id == 2];
			rr.msg_id = in->descriptor->descriptor->msg_id;
			break;
		}
		if (in->body_case == TPW__V1__PEER_MSG__BODY_BCAST) {
			rr.pipe_id = a[in->bcast->targets[0]->pipe_id == 2];
			rr.msg_id = in->bcast->targets[0]->msg_id;
			rr.bcast = true;
			break;
		}
		tpw_peer_msg_free(in);
	}
	tpw_peer_msg_free(in);
	rr.xfer_id = 1;
	pm.body_case = TPW__V1__PEER_MSG__BODY_READ_REQ;
	pm.read_req = &rr;
	TPT_REQUIRE(tpt_raw_send_peer(&c, &pm) == 0, 1, "read request");
	tpt_sync_post(&unread_asked, 0);
	keep_alive(&c, &unread_done);
	tpt_raw_close(&data);
	tpt_raw_close(&c);
	return 0;
}

static void unread_start(const char *who, struct tp_context **ctx, struct tp_listener **l)
{
	char ms[16];
	const char *args[] = { "--peer-insecure", "--peer-timeout",
			       scaled_arg(ms, sizeof(ms), 1000), NULL };
	struct tp_listen_options lo = { .size = sizeof(lo), .remote = TP_REMOTE_ANY_PEER };

	ck_assert_int_eq(tpt_sync_init(&unread_asked), 0);
	ck_assert_int_eq(tpt_sync_init(&unread_done), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&host, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&host, 0, who, ctx), 0);
	ck_assert_int_eq(tp_listen(*ctx, "fan", &lo, l), 0);
}

static void unread_end(pid_t pid)
{
	tpt_sync_post(&unread_done, 0);
	ck_assert(tpt_wait_ok(pid, 4 * T_MS, "peer that stops reading"));
	ck_assert(tpt_daemon_alive(&host));
	ck_assert_int_eq(tpt_daemon_stop(&host), 0);
	tpt_sync_done(&unread_asked);
	tpt_sync_done(&unread_done);
}

/*
 * A reader's daemon that asks for a 64 MiB message, then answers pings but never reads its data
 * connection, so the send blocks once the socket buffers are full: with --peer-timeout 1000 the
 * link fails after a second without a chunk sent, and the writer's write completes (failed)
 * within a few seconds instead of waiting for ever with its memory.
 */
START_TEST(test_peer_that_stops_reading_fails_the_send_after_peer_timeout)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *pa;
	struct tp_payload pl = { .data = calloc(1, UNREAD_LEN), .length = UNREAD_LEN };
	struct tp_message msg = { .payloads = &pl, .n_payloads = 1 };
	struct read_end e = { .status = 1 };
	uint64_t t0;
	pid_t pid;

	ck_assert_ptr_nonnull(pl.data);
	unread_start("writer", &ctx, &l);
	pid = tpt_fork(unread_data_peer, (void *)(uintptr_t)1);
	ck_assert_int_eq(tp_listener_accept_sync(l, T_MS, &pa), 0);
	t0 = tpt_now_ms();
	ck_assert_int_eq(tp_pipe_write(pa, &msg, read_on_done, &e), 0);
	ck_assert_int_eq(tpt_sync_wait(&unread_asked, T_MS), 0);
	for (int i = 0; i < TPT_SCALED_MS(10000) / 250 &&
			__atomic_load_n(&e.status, __ATOMIC_ACQUIRE) == 1; i++)
		usleep(250 * 1000);
	fprintf(stderr, "write ended with %d after %llu ms\n",
		__atomic_load_n(&e.status, __ATOMIC_ACQUIRE),
		(unsigned long long)(e.ms ? e.ms - t0 : 0));
	ck_assert_int_lt(__atomic_load_n(&e.status, __ATOMIC_ACQUIRE), 0);
	ck_assert_uint_lt(e.ms - t0, TPT_SCALED_MS(8000));
	tp_pipe_close(pa);
	tp_listener_close(l);
	tp_context_free(ctx);
	free(pl.data);
	unread_end(pid);
}
END_TEST

/* The same for the one send behind a broadcast to two pipes of that link (PeerBcast), which
 * the writer's closing cannot cancel: tp_set_broadcast() returns, both deliveries failed, within
 * a few seconds. */
START_TEST(test_peer_that_stops_reading_fails_the_broadcast_after_peer_timeout)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe_set *set;
	struct tp_payload pl = { .data = calloc(1, UNREAD_LEN), .length = UNREAD_LEN };
	struct tp_message msg = { .payloads = &pl, .n_payloads = 1 };
	int st[2] = { 1, 1 }, r;
	uint64_t t0;
	pid_t pid;

	ck_assert_ptr_nonnull(pl.data);
	unread_start("writer", &ctx, &l);
	ck_assert_int_eq(tp_set_new(ctx, 2, &set), 0);
	pid = tpt_fork(unread_data_peer, (void *)(uintptr_t)2);
	ck_assert_int_eq(tp_set_wait_pipes(set, l, 2, T_MS), 0);
	t0 = tpt_now_ms();
	r = tp_set_broadcast(set, &msg, -1, st, 2);
	fprintf(stderr, "broadcast returned %d (%d, %d) after %llu ms\n", r, st[0], st[1],
		(unsigned long long)(tpt_now_ms() - t0));
	ck_assert_int_eq(r, 0);
	ck_assert_int_lt(st[0], 0);
	ck_assert_int_lt(st[1], 0);
	ck_assert_uint_lt(tpt_now_ms() - t0, TPT_SCALED_MS(8000));
	tp_set_free(set);
	tp_listener_close(l);
	tp_context_free(ctx);
	free(pl.data);
	unread_end(pid);
}
END_TEST

static Suite *bcast_suite(void)
{
	Suite *s = suite_create("sec_bcast");
	TCase *tc = tcase_create("bcast");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_bcast_names_no_pipe_of_another_session_or_uid);
	tcase_add_test(tc, test_bcast_hostile_peer_fails_its_request_then_its_link_only);
	tcase_add_test(tc, test_bcast_stalled_peer_does_not_hold_staging_after_its_readers);
	tcase_add_test(tc,
		       test_bcast_stalled_peer_does_not_hold_staging_after_its_reader_is_killed);
	tcase_add_test(tc, test_bcast_peer_finishing_after_its_reader_left_does_not_hold_staging);
	tcase_add_loop_test(tc, test_bcast_stalled_peer_fails_its_staging_receive_after_peer_timeout,
			    0, 2);
	tcase_add_test(tc, test_bcast_two_links_of_one_peer_share_its_staging_limit);
	tcase_add_test(tc, test_peer_that_stops_reading_fails_the_send_after_peer_timeout);
	tcase_add_test(tc, test_peer_that_stops_reading_fails_the_broadcast_after_peer_timeout);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(bcast_suite());
}
