/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: channels across hosts (docs/channels.md, "Across hosts") against an
 * unprivileged local user (uid 65534) speaking the raw protocol to its own daemon (a) about a
 * channel hosted by the other daemon (b) that admits other hosts. A forwarded op whose ChanOp
 * carries fields the daemon does not know is forwarded without them: the daemon survives and
 * answers (it used to pass on their count without their bytes, and died packing the frame).
 * The user's handle ids are its own: a victim's handle of the same remote channel, guessed by
 * id, is not found for read, write, close and release; the victim's remote handle, its channel
 * and its item stay as they were.
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

#define T_MS TPT_SCALED_MS(30000)
#define NOBODY 65534

static char addr[256];

static int drop_to_nobody(void)
{
	if (setgroups(0, NULL) < 0 || setresgid(NOBODY, NOBODY, NOBODY) < 0 ||
	    setresuid(NOBODY, NOBODY, NOBODY) < 0)
		return -errno;
	return 0;
}

/* Sends ChanOp @op (req_id 1) and returns the answer's status (its handle in *@ret_id), or
 * -errno. */
static int raw_chan(struct tpt_raw *r, Tpw__V1__ChanOp *op, const void *tail, uint32_t tail_len,
		    uint64_t *ret_id)
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
	if (ret_id)
		*ret_id = dm->chan_reply->chan_id;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	return st;
}

static int attacker(void *arg)
{
	static const Tpw__V1__ChanOpKind kinds[] = {
		TPW__V1__CHAN_OP_KIND__CHAN_OP_READ, TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE,
		TPW__V1__CHAN_OP_KIND__CHAN_OP_CLOSE, TPW__V1__CHAN_OP_KIND__CHAN_OP_RELEASE,
	};
	uint8_t junk[1] = { 7 };
	ProtobufCMessageUnknownField uf = { .tag = 999, .wire_type = PROTOBUF_C_WIRE_TYPE_VARINT,
					    .len = 1, .data = junk };
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	uint64_t id = 0, len = 4;
	struct tpt_raw r;
	int st;

	(void)arg;
	TPT_REQUIRE(drop_to_nobody() == 0, 1, "cannot drop to nobody");
	TPT_REQUIRE(tpt_raw_connect(&r, tpt_peer_a.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	o.name = addr;
	o.owner_set = true;
	o.owner_uid = 0;
	st = raw_chan(&r, &o, NULL, 0, &id);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && id, 1, "open %s: %d", addr, st);
	/* A read carrying a field the daemon does not know: forwarded without it, answered. */
	Tpw__V1__ChanOp rd = TPW__V1__CHAN_OP__INIT;

	rd.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	rd.chan_id = id;
	rd.base.n_unknown_fields = 1;
	rd.base.unknown_fields = &uf;
	st = raw_chan(&r, &rd, NULL, 0, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_TIMEOUT, 1, "read with an unknown field: %d", st);
	/* The victim's handles (local ids below ours) are not ours. */
	for (uint64_t g = 0; g < id; g++) {
		for (size_t k = 0; k < TPU_ARRAY_SIZE(kinds); k++) {
			Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
			bool w = kinds[k] == TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;

			op.op = kinds[k];
			op.chan_id = g;
			op.n_lengths = w;
			op.lengths = w ? &len : NULL;
			st = raw_chan(&r, &op, w ? "evil" : NULL, w ? 4 : 0, NULL);
			TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_NOT_FOUND, 1,
				    "op %d on id %llu: %d", (int)kinds[k], (unsigned long long)g, st);
		}
	}
	tpt_raw_close(&r);
	return 0;
}

START_TEST(test_attacker_cannot_crash_or_touch_remote_handles)
{
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = -1 };
	const char item[] = "kept";
	struct iovec iov = { .iov_base = (void *)item, .iov_len = 4 };
	struct tp_context *ca, *cb;
	struct tp_chan *hb, *ha;
	void *got;
	size_t len;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		return;
	}
	tpt_peer_fixture_start();
	ck_assert_int_eq(tpt_daemon_open_to_all(&tpt_peer_a), 0);
	ck_assert_int_eq(tpt_ctx_new(&tpt_peer_b, 0, "host", &cb), 0);
	o.flags = TP_CHAN_CREATE;
	o.access = TP_ACCESS_ANYONE;
	o.remote = TP_REMOTE_ANY_PEER;
	ck_assert_int_eq(tp_chan_open(cb, "shared", &o, &hb), 0);
	tpt_peer_address(&tpt_peer_b, "shared", addr, sizeof(addr));
	ck_assert_int_eq(tpt_ctx_new(&tpt_peer_a, 0, "victim", &ca), 0);
	ck_assert_int_eq(tp_chan_open(ca, addr, NULL, &ha), 0);
	ck_assert(tpt_wait_ok(tpt_fork(attacker, NULL), 4 * T_MS, "attacker"));
	ck_assert(tpt_daemon_alive(&tpt_peer_a));
	ck_assert(tpt_daemon_alive(&tpt_peer_b));
	ck_assert_int_eq(tp_chan_write(ha, &iov, 1, 0), 0); /* the victim's handle still works */
	ck_assert_int_eq(tp_chan_read(hb, &got, &len, 5000), 0); /* the channel is still open */
	ck_assert_uint_eq(len, 4);
	ck_assert_int_eq(memcmp(got, item, 4), 0);
	free(got);
	tp_chan_release(ha);
	tp_chan_release(hb);
	tp_context_free(ca);
	tp_context_free(cb);
	tpt_peer_fixture_stop();
}
END_TEST

static Suite *chanx_suite(void)
{
	Suite *s = suite_create("sec_chanx");
	TCase *tc = tcase_create("chanx");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_attacker_cannot_crash_or_touch_remote_handles);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(chanx_suite());
}
