/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: work queue questions and answers as messages (issue 25 part wqmsg;
 * docs/queues.md "Questions and answers as messages") against a hostile client speaking the raw
 * protocol on a queue it owns and works for, and on another's queue it works for. Bad message
 * descriptors (lengths that do not add up, more parts than segments-max, metadata above
 * metadata-max, an unknown device) fail that submit or reply only; a payload by reference in a
 * buffer the session never registered, or at an address its process does not map, fails with
 * nothing queued and no room kept; a payload by reference above wq-bytes-max (up to 1 TiB) is
 * refused before the daemon allocates anything; a read of a question the handle did not take, of
 * slots that do not add up to the item, a reply to an id not taken or taken by the other handle,
 * an answer dropped by a worker or never held are refused. Nothing of this closes the session;
 * the queue then serves a well-formed question byte for byte. A read that names two of take,
 * read and drop at once, or a payload by reference without a descriptor, closes that session
 * only.
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
#define SEGS 16u   /* the daemon's --segments-max */
#define META 4096u /* the daemon's --metadata-max */
#define ST_OK TPW__V1__STATUS__STATUS_OK

static struct tpt_daemon d;

/* Sends WqOp @op (req_id 1) with @tail; returns the answer's status or -errno; *@ret: the
 * answer (free with tpw__v1__daemon_msg__free_unpacked()) when not NULL. */
static int raw_wq(struct tpt_raw *r, Tpw__V1__WqOp *op, const void *tail, size_t tail_len,
		  Tpw__V1__DaemonMsg **ret)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg *dm;
	int st, ret_;

	op->req_id = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_WQ_OP;
	m.wq_op = op;
	ret_ = tpt_raw_send(r, &m, tail, tail_len, NULL, 0, 0);
	if (ret_ < 0)
		return ret_;
	ret_ = tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_WQ_REPLY, T_MS, &dm);
	if (ret_ < 0)
		return ret_;
	st = dm->wq_reply->status;
	if (ret)
		*ret = dm;
	else
		tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	return st;
}

static uint64_t open_wq(struct tpt_raw *r, const char *name, bool create)
{
	Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;
	Tpw__V1__DaemonMsg *dm = NULL;
	uint64_t id = 0;

	op.op = TPW__V1__WQ_OP_KIND__WQ_OP_OPEN;
	op.name = (char *)name;
	op.create = create;
	if (raw_wq(r, &op, NULL, 0, &dm) == ST_OK)
		id = dm->wq_reply->wq_id;
	if (dm)
		tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	return id;
}

/* SUBMIT (@qid 0) or REPLY to @qid on handle @h: @len bytes at @tail or at segment @g, as
 * message @m. */
static int send_msg(struct tpt_raw *r, uint64_t h, uint64_t qid, Tpw__V1__Descriptor *m,
		    Tpw__V1__Segment *g, const void *tail, size_t len)
{
	Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;

	op.op = qid ? TPW__V1__WQ_OP_KIND__WQ_OP_REPLY : TPW__V1__WQ_OP_KIND__WQ_OP_SUBMIT;
	op.wq_id = h;
	op.question_id = qid;
	op.msg_desc = m;
	op.segment = g;
	return raw_wq(r, &op, g ? NULL : tail, g ? 0 : len, NULL);
}

/* TAKE by descriptor (@read 0), or a read of question @read's bytes into @g (NULL: inline). */
static int take(struct tpt_raw *r, uint64_t h, uint64_t read, Tpw__V1__Segment **g, size_t n,
		Tpw__V1__DaemonMsg **ret)
{
	Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;

	op.op = TPW__V1__WQ_OP_KIND__WQ_OP_TAKE;
	op.wq_id = h;
	op.msg = !read;
	op.msg_read = read != 0;
	op.question_id = read;
	op.n_segments = n;
	op.segments = g;
	return raw_wq(r, &op, NULL, 0, ret);
}

/* Sends WqOp @op, which validation refuses: the daemon closes the session. Return: 0 or 1. */
static int send_closes(struct tpt_raw *r, Tpw__V1__WqOp *op)
{
	Tpw__V1__ClientMsg cm = TPW__V1__CLIENT_MSG__INIT;

	cm.body_case = TPW__V1__CLIENT_MSG__BODY_WQ_OP;
	cm.wq_op = op;
	TPT_REQUIRE(tpt_raw_send(r, &cm, NULL, 0, NULL, 0, 0) == 0, 1, "send");
	TPT_REQUIRE(tpt_raw_wait_closed(r, T_MS) == 0, 1, "the session stayed open");
	tpt_raw_close(r);
	return 0;
}

static int attacker(void *arg)
{
	static Tpw__V1__PayloadDesc pd[SEGS + 1], *pp[SEGS + 1];
	static uint8_t meta[META + 1], tail[8] = "abcdefgh";
	Tpw__V1__TensorDesc td = TPW__V1__TENSOR_DESC__INIT, *tp = &td;
	Tpw__V1__Device dev = TPW__V1__DEVICE__INIT;
	Tpw__V1__Descriptor m = TPW__V1__DESCRIPTOR__INIT;
	Tpw__V1__Segment g = TPW__V1__SEGMENT__INIT, *gp = &g;
	Tpw__V1__ShmRef ref = TPW__V1__SHM_REF__INIT;
	Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;
	Tpw__V1__DaemonMsg *dm = NULL;
	struct tpt_raw r;
	uint64_t q, w, qid;
	int st;

	(void)arg;
	TPT_REQUIRE(tpt_raw_connect(&r, d.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	q = open_wq(&r, "own", true);
	w = open_wq(&r, "own", false);
	TPT_REQUIRE(q && w, 1, "open");
	for (unsigned i = 0; i <= SEGS; i++) {
		tpw__v1__payload_desc__init(&pd[i]);
		pp[i] = &pd[i];
	}
	m.payloads = pp;
	m.n_payloads = 1;
	/* Lengths that do not add up, more parts than segments-max, metadata, a device. */
	pd[0].length = 5;
	st = send_msg(&r, q, 0, &m, NULL, tail, 4);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_INVALID, 1, "5 bytes in 4: %d", st);
	pd[0].length = 0;
	m.n_payloads = SEGS + 1;
	st = send_msg(&r, q, 0, &m, NULL, NULL, 0);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_LIMIT, 1, "%u payloads: %d", SEGS + 1, st);
	m.n_payloads = 1;
	pd[0].length = 4;
	m.metadata = (ProtobufCBinaryData){ META + 1, meta };
	st = send_msg(&r, q, 0, &m, NULL, tail, 4);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_TOO_BIG, 1, "metadata above the limit: %d", st);
	m.metadata = (ProtobufCBinaryData){ 0, NULL };
	m.n_payloads = 0;
	m.n_tensors = 1;
	m.tensors = &tp;
	td.length = 4;
	dev.type = 77;
	td.device = &dev;
	st = send_msg(&r, q, 0, &m, NULL, tail, 4);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_INVALID, 1, "device type 77: %d", st);
	m.n_tensors = 0;
	m.n_payloads = 1;
	/* By reference: a buffer never registered, an address not mapped, above wq-bytes-max. */
	pd[0].length = 100000;
	g.length = 100000;
	g.loc_case = TPW__V1__SEGMENT__LOC_SHM;
	ref.buf_id = 4242;
	g.shm = &ref;
	st = send_msg(&r, q, 0, &m, &g, NULL, 0);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_NOT_FOUND, 1, "a buffer not its own: %d", st);
	g.loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	g.cma_addr = 4096; /* never mapped */
	st = send_msg(&r, q, 0, &m, &g, NULL, 0);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_FAULT || st == TPW__V1__STATUS__STATUS_IO ||
		    st == TPW__V1__STATUS__STATUS_INVALID, 1, "an address not mapped (or no CMA for "
		    "this client): %d", st);
	pd[0].length = 1ull << 40;
	g.length = 1ull << 40;
	st = send_msg(&r, q, 0, &m, &g, NULL, 0);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_LIMIT, 1, "1 TiB by reference: %d", st);
	/* Nothing was queued by any of these. */
	st = take(&r, w, 0, NULL, 0, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_TIMEOUT, 1, "a take after bad submits: %d", st);
	/* A well-formed question of 4 bytes, taken by descriptor. */
	pd[0].length = 4;
	TPT_REQUIRE(send_msg(&r, q, 0, &m, NULL, tail, 4) == ST_OK, 1, "good submit");
	st = take(&r, w, 0, NULL, 0, &dm);
	TPT_REQUIRE(st == ST_OK && dm->wq_reply->msg_held && dm->wq_reply->msg_len == 4, 1,
		    "take: %d", st);
	qid = dm->wq_reply->question_id;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	/* Reads of a question not taken, and into 3 bytes of slots for 4. */
	st = take(&r, w, qid + 1, NULL, 0, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_NOT_FOUND, 1, "read not taken: %d", st);
	st = take(&r, q, qid, NULL, 0, NULL); /* the owner's handle did not take it */
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_NOT_FOUND, 1, "read by the owner: %d", st);
	g.length = 3;
	g.cma_addr = (uint64_t)(uintptr_t)meta;
	st = take(&r, w, qid, &gp, 1, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_INVALID, 1, "3 bytes of room for 4: %d", st);
	/* Replies: to an id not taken; a bad descriptor leaves the question taken. */
	st = send_msg(&r, w, qid + 1, &m, NULL, tail, 4);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_NOT_FOUND, 1, "reply not taken: %d", st);
	st = send_msg(&r, q, qid, &m, NULL, tail, 4); /* taken by the other handle */
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_NOT_FOUND, 1, "reply by another handle: %d", st);
	pd[0].length = 3;
	st = send_msg(&r, w, qid, &m, NULL, tail, 4);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_INVALID, 1, "bad reply: %d", st);
	/* The question is intact: read inline, byte for byte. */
	st = take(&r, w, qid, NULL, 0, NULL);
	TPT_REQUIRE(st == ST_OK, 1, "read inline: %d", st);
	pd[0].length = 4;
	TPT_REQUIRE(send_msg(&r, w, qid, &m, NULL, tail, 4) == ST_OK, 1, "good reply");
	/* Drops: by a worker, of nothing held. */
	op.op = TPW__V1__WQ_OP_KIND__WQ_OP_ANSWER;
	op.wq_id = w;
	op.msg_drop = true;
	op.question_id = qid;
	st = raw_wq(&r, &op, NULL, 0, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_PERMISSION, 1, "a worker's drop: %d", st);
	op.wq_id = q;
	st = raw_wq(&r, &op, NULL, 0, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_NOT_FOUND, 1, "a drop of nothing held: %d", st);
	/* The answer, a message, refuses a byte read, then arrives whole. */
	op.msg_drop = false;
	op.question_id = 0;
	st = raw_wq(&r, &op, NULL, 0, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_UNSUPPORTED, 1, "byte answer read: %d", st);
	op.msg = true;
	st = raw_wq(&r, &op, NULL, 0, &dm);
	TPT_REQUIRE(st == ST_OK && dm->wq_reply->msg_held && dm->wq_reply->msg_len == 4 &&
		    dm->wq_reply->question_id == qid, 1, "answer: %d", st);
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	op.msg = false;
	op.msg_read = true;
	op.question_id = qid;
	st = raw_wq(&r, &op, NULL, 0, &dm);
	TPT_REQUIRE(st == ST_OK && dm->wq_reply->length == 4, 1, "answer read: %d", st);
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	st = raw_wq(&r, &op, NULL, 0, NULL); /* read: no longer held */
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_NOT_FOUND, 1, "answer read twice: %d", st);
	/* A payload by reference without a descriptor closes the session. */
	op = (Tpw__V1__WqOp)TPW__V1__WQ_OP__INIT;
	op.op = TPW__V1__WQ_OP_KIND__WQ_OP_SUBMIT;
	op.wq_id = q;
	g.length = 4;
	op.segment = &g;
	return send_closes(&r, &op);
}

/* Take, read and drop named at once: the session closes. */
static int mixer(void *arg)
{
	Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;
	struct tpt_raw r;
	uint64_t q;

	(void)arg;
	TPT_REQUIRE(tpt_raw_connect(&r, d.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	q = open_wq(&r, "hostile", false);
	TPT_REQUIRE(q, 1, "open");
	op.op = TPW__V1__WQ_OP_KIND__WQ_OP_ANSWER;
	op.wq_id = q;
	op.msg = true;
	op.msg_drop = true;
	op.question_id = 1;
	return send_closes(&r, &op);
}

START_TEST(test_hostile_messages_fail_their_op_only)
{
	const char *args[] = { "--segments-max", "16", "--metadata-max", "4096", "--wq-bytes-max",
			       "1048576", NULL };
	struct tpt_msg_spec s = { .pipe = 9, .n_payloads = 2, .lens = { 300000, 0 } };
	struct tp_context *ctx;
	struct tp_descriptor *desc;
	struct tp_wq *q, *w;
	struct tpt_msg msg;
	uint64_t id, got;

	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&d, 0, "victim", &ctx), 0);
	ck_assert_int_eq(tp_wq_open(ctx, "hostile", &(struct tp_wq_options){
		.size = sizeof(struct tp_wq_options), .flags = TP_WQ_CREATE,
		.access = TP_ACCESS_ANYONE, .owner_uid = -1 }, &q), 0);
	ck_assert_int_eq(tp_wq_open(ctx, "hostile", NULL, &w), 0);
	ck_assert(tpt_wait_ok(tpt_fork(attacker, NULL), 4 * T_MS, "attacker"));
	ck_assert(tpt_wait_ok(tpt_fork(mixer, NULL), 4 * T_MS, "mixer"));
	/* The queue serves a well-formed question byte for byte. */
	ck_assert_int_eq(tpt_msg_build(ctx, &s, TPT_MEM_SHM, &msg), 0);
	ck_assert_int_eq(tp_wq_submit_msg(q, &msg.m, &id), 0);
	tpt_msg_free(ctx, &msg);
	ck_assert_int_eq(tp_wq_take_descriptor(w, &got, &desc, T_MS), 0);
	ck_assert_int_eq(got, id);
	ck_assert_int_eq(tpt_wq_msg_read_check(ctx, w, desc, &s, TPT_MEM_PRIVATE), 0);
	tp_wq_release(w);
	tp_wq_release(q);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

static Suite *wqmsg_suite(void)
{
	Suite *s = suite_create("sec_wqmsg");
	TCase *tc = tcase_create("wqmsg");

	tcase_set_timeout(tc, 90);
	tcase_add_test(tc, test_hostile_messages_fail_their_op_only);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(wqmsg_suite());
}
