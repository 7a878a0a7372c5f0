/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: channel items as messages (issue 25 part msg; docs/channels.md "Items as
 * messages") against a hostile client speaking the raw protocol on a channel it may write. Bad
 * message descriptors (as many as the items or not, lengths that do not add up or overflow,
 * payloads and tensors above segments_max, metadata above metadata_max, pipe fields, an
 * unknown device) fail that write only: the session stays, the channel holds only what was
 * written well, byte-exact. A take of a held message whose destinations do not add up fails and
 * leaves the item held; a take with nothing held is not found; a byte read (plain or batch) of a
 * message item is refused and leaves it first. Nothing of this closes the session, and the
 * channel's readers get exactly the well-formed items. A client of protocol minor 7 never reads
 * a message item as bytes, small or large: refused, the item stays first.
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

static struct tpt_daemon d;

/* Sends ChanOp @op (req_id 1) with @tail and returns the answer's status (its msg_held in
 * *@ret_held when not NULL), or -errno. */
static int raw_chan(struct tpt_raw *r, Tpw__V1__ChanOp *op, const void *tail, size_t tail_len,
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

/* A WRITE of @n items of @lens, @tail inline, described by @msgs (as many as @n_msgs). */
static int write_msgs(struct tpt_raw *r, uint64_t id, uint64_t *lens, size_t n,
		      Tpw__V1__Descriptor **msgs, size_t n_msgs, const void *tail, size_t tail_len)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;

	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	op.chan_id = id;
	op.n_lengths = n;
	op.lengths = lens;
	op.n_msgs = n_msgs;
	op.msgs = msgs;
	return raw_chan(r, &op, tail, tail_len, NULL);
}

/* A READ on handle @id: @msg, @take (take_held), @g destinations (NULL: none), @max. */
static int read_op(struct tpt_raw *r, uint64_t id, bool msg, bool take, Tpw__V1__Segment **g,
		   size_t n_g, uint32_t max)
{
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;

	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = id;
	op.msg = msg;
	op.take_held = take;
	op.n_segments = n_g;
	op.segments = g;
	op.max_items = max;
	return raw_chan(r, &op, NULL, 0, NULL);
}

#define REQ(cond, ...) TPT_REQUIRE(cond, 1, __VA_ARGS__)
#define ST_OK TPW__V1__STATUS__STATUS_OK

static int attacker(void *arg)
{
	static Tpw__V1__PayloadDesc pd[SEGS + 1], *pp[SEGS + 1];
	static uint8_t meta[META + 1], tail[8] = "abcdefgh";
	Tpw__V1__TensorDesc td = TPW__V1__TENSOR_DESC__INIT, *tp = &td;
	Tpw__V1__Device dev = TPW__V1__DEVICE__INIT;
	Tpw__V1__Descriptor m = TPW__V1__DESCRIPTOR__INIT, *mp[2] = { &m, &m };
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__Segment g = TPW__V1__SEGMENT__INIT, *gp = &g;
	struct tpt_raw r;
	uint64_t id = 0, len4 = 4, lens2[2] = { 4, 4 }, len0 = 0;
	int st;

	(void)arg;
	REQ(tpt_raw_connect(&r, d.socket) == 0, "connect");
	REQ(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, "hello");
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = "victim";
	st = raw_chan(&r, &op, NULL, 0, &id);
	REQ(st == ST_OK, "open: %d", st);
	for (unsigned i = 0; i <= SEGS; i++) {
		tpw__v1__payload_desc__init(&pd[i]);
		pp[i] = &pd[i];
	}
	m.payloads = pp;
	/* One descriptor for two items. */
	pd[0].length = 4;
	m.n_payloads = 1;
	st = write_msgs(&r, id, lens2, 2, mp, 1, tail, 8);
	REQ(st == TPW__V1__STATUS__STATUS_INVALID, "one descriptor for two items: %d", st);
	/* Lengths that do not add up: 5 bytes of payload in an item of 4, then 3. */
	pd[0].length = 5;
	st = write_msgs(&r, id, &len4, 1, mp, 1, tail, 4);
	REQ(st == TPW__V1__STATUS__STATUS_INVALID, "5 bytes in 4: %d", st);
	pd[0].length = 3;
	st = write_msgs(&r, id, &len4, 1, mp, 1, tail, 4);
	REQ(st == TPW__V1__STATUS__STATUS_INVALID, "3 bytes in 4: %d", st);
	/* Lengths that overflow to the item's. */
	pd[0].length = UINT64_MAX;
	pd[1].length = 5;
	m.n_payloads = 2;
	st = write_msgs(&r, id, &len4, 1, mp, 1, tail, 4);
	REQ(st == TPW__V1__STATUS__STATUS_INVALID, "overflowing lengths: %d", st);
	/* Counts above segments_max, and at it. */
	for (unsigned i = 0; i <= SEGS; i++)
		pd[i].length = 0;
	m.n_payloads = SEGS + 1;
	st = write_msgs(&r, id, &len0, 1, mp, 1, NULL, 0);
	REQ(st == TPW__V1__STATUS__STATUS_LIMIT, "%u payloads: %d", SEGS + 1, st);
	m.n_payloads = SEGS;
	m.n_tensors = 1;
	m.tensors = &tp;
	st = write_msgs(&r, id, &len0, 1, mp, 1, NULL, 0);
	REQ(st == TPW__V1__STATUS__STATUS_LIMIT, "%u payloads and a tensor: %d", SEGS, st);
	/* Metadata above metadata_max in all (message and part), an unknown device, pipe fields. */
	m.n_payloads = 1;
	m.n_tensors = 0;
	pd[0].length = 4;
	m.metadata = (ProtobufCBinaryData){ META, meta };
	pd[0].metadata = (ProtobufCBinaryData){ 1, meta };
	st = write_msgs(&r, id, &len4, 1, mp, 1, tail, 4);
	REQ(st == TPW__V1__STATUS__STATUS_TOO_BIG, "metadata above the limit: %d", st);
	pd[0].metadata = (ProtobufCBinaryData){ 0, NULL };
	m.n_payloads = 0;
	m.n_tensors = 1;
	td.length = 4;
	dev.type = 77;
	td.device = &dev;
	st = write_msgs(&r, id, &len4, 1, mp, 1, tail, 4);
	REQ(st == TPW__V1__STATUS__STATUS_INVALID, "device type 77: %d", st);
	dev.type = TPW__V1__DEVICE_TYPE__DEVICE_CUDA;
	m.msg_id = 3;
	st = write_msgs(&r, id, &len4, 1, mp, 1, tail, 4);
	REQ(st == TPW__V1__STATUS__STATUS_INVALID, "a pipe field: %d", st);
	/* Well formed: at the limits (metadata_max in all, a CUDA tensor), written. */
	m.msg_id = 0;
	st = write_msgs(&r, id, &len4, 1, mp, 1, tail, 4);
	REQ(st == ST_OK, "a good message: %d", st);
	/* A byte read of a message item is refused and leaves it first; so is a batch read. */
	REQ((st = read_op(&r, id, false, false, NULL, 0, 0)) == TPW__V1__STATUS__STATUS_UNSUPPORTED,
	    "plain read of a message: %d", st);
	REQ((st = read_op(&r, id, false, false, NULL, 0, 8)) == TPW__V1__STATUS__STATUS_UNSUPPORTED,
	    "batch read of a message: %d", st);
	/* A take with nothing held; then a take whose destinations do not add up. */
	REQ((st = read_op(&r, id, true, true, NULL, 0, 0)) == TPW__V1__STATUS__STATUS_NOT_FOUND,
	    "a take of nothing: %d", st);
	REQ((st = read_op(&r, id, true, false, NULL, 0, 0)) == ST_OK, "descriptor: %d", st);
	g.length = 3;
	g.loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	g.cma_addr = (uint64_t)(uintptr_t)meta;
	REQ((st = read_op(&r, id, true, true, &gp, 1, 0)) == TPW__V1__STATUS__STATUS_INVALID,
	    "3 bytes of room for 4: %d", st);
	/* The session is still there, and the item is still held by it: the release gives it back
	 * to the channel for the victim. */
	op = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_RELEASE;
	op.chan_id = id;
	REQ((st = raw_chan(&r, &op, NULL, 0, NULL)) == ST_OK, "release: %d", st);
	tpt_raw_close(&r);
	return 0;
}

START_TEST(test_bad_message_descriptors_fail_their_op_only)
{
	const char *args[] = { "--segments-max", "16", "--metadata-max", "4096", NULL };
	struct tp_context *ctx;
	struct tp_descriptor *desc;
	struct tp_chan *ch;
	uint8_t got[4];

	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&d, 0, "victim", &ctx), 0);
	ck_assert_int_eq(tp_chan_open(ctx, "victim", &(struct tp_chan_options){
		.size = sizeof(struct tp_chan_options), .flags = TP_CHAN_CREATE, .owner_uid = -1 },
		&ch), 0);
	ck_assert(tpt_wait_ok(tpt_fork(attacker, NULL), 4 * T_MS, "attacker"));
	ck_assert(tpt_daemon_alive(&d));
	/* Exactly the one good message, byte-exact, is in the channel. */
	ck_assert_int_eq(tp_chan_read_descriptor(ch, &desc, 0), 0);
	ck_assert(desc->n_payloads == 0 && desc->n_tensors == 1 && desc->metadata_len == META &&
		  desc->tensors[0].length == 4 && desc->tensors[0].device.type == TP_DEVICE_CUDA);
	ck_assert_int_eq(tp_chan_read_msg(ch, desc, &(struct tp_allocation){
		.tensors = (struct tp_slot[]){ { .data = got } }, .n_tensors = 1 }), 0);
	ck_assert(memcmp(got, "abcd", 4) == 0);
	ck_assert_int_eq(tp_chan_read_descriptor(ch, &desc, 0), -EAGAIN);
	tp_chan_release(ch);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

/* A client of protocol minor 7 (before message items): its byte reads, plain, batch and of a
 * large item, are refused with STATUS_UNSUPPORTED and the message stays first, whole. */
static int old_client(void *arg)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Hello h = TPW__V1__HELLO__INIT;
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;
	struct tpt_raw r;
	uint64_t id = 0;
	int st;

	(void)arg;
	REQ(tpt_raw_connect(&r, d.socket) == 0, "connect");
	h.major = TPW_PROTO_MAJOR;
	h.minor = TPW_MINOR_CHAN_MSG - 1;
	h.role = TPW__V1__ROLE__ROLE_CLIENT;
	h.name = "old";
	m.body_case = TPW__V1__CLIENT_MSG__BODY_HELLO;
	m.hello = &h;
	REQ(tpt_raw_send(&r, &m, NULL, 0, NULL, 0, 0) == 0, "hello");
	REQ(tpt_raw_expect(&r, TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY, T_MS, &rep) == 0 &&
	    rep->hello_reply->status == ST_OK, "hello answer");
	tpw__v1__daemon_msg__free_unpacked(rep, NULL);
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = "victim";
	REQ((st = raw_chan(&r, &op, NULL, 0, &id)) == ST_OK, "open: %d", st);
	for (int k = 0; k < 2; k++) { /* the small message first, then the large one */
		REQ((st = read_op(&r, id, false, false, NULL, 0, 0)) ==
		    TPW__V1__STATUS__STATUS_UNSUPPORTED, "plain read %d: %d", k, st);
		REQ((st = read_op(&r, id, false, false, NULL, 0, 8)) ==
		    TPW__V1__STATUS__STATUS_UNSUPPORTED, "batch read %d: %d", k, st);
		if (k == 0) {
			op = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
			op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
			op.chan_id = id;
			op.msg = true; /* (a field it does not know: as a newer one would) */
			REQ((st = raw_chan(&r, &op, NULL, 0, NULL)) == ST_OK, "msg read: %d", st);
			op.take_held = true;
			op.msg_drop = true;
			REQ((st = raw_chan(&r, &op, NULL, 0, NULL)) == ST_OK, "drop: %d", st);
		}
	}
	tpt_raw_close(&r);
	return 0;
}

START_TEST(test_old_client_never_reads_a_message_as_bytes)
{
	static uint8_t big[(1u << 20) + 3];
	struct tp_payload p = { .data = big, .length = sizeof(big) };
	struct tp_message small = { .metadata = "s", .metadata_len = 1 };
	struct tp_message large = { .metadata = "l", .metadata_len = 1, .payloads = &p,
				    .n_payloads = 1 };
	struct tp_context *ctx;
	struct tp_descriptor *desc;
	struct tp_chan *ch;

	ck_assert_int_eq(tpt_daemon_start(&d, NULL), 0);
	ck_assert_int_eq(tpt_ctx_new(&d, 0, "victim", &ctx), 0);
	ck_assert_int_eq(tp_chan_open(ctx, "victim", &(struct tp_chan_options){
		.size = sizeof(struct tp_chan_options), .flags = TP_CHAN_CREATE, .owner_uid = -1 },
		&ch), 0);
	memset(big, 0x6b, sizeof(big));
	ck_assert_int_eq(tp_chan_write_msgs(ch, &small, 1, 0), 0);
	ck_assert_int_eq(tp_chan_write_msgs(ch, &large, 1, 0), 0);
	ck_assert(tpt_wait_ok(tpt_fork(old_client, NULL), 4 * T_MS, "old client"));
	ck_assert(tpt_daemon_alive(&d));
	ck_assert_int_eq(tp_chan_read_descriptor(ch, &desc, 0), 0);
	ck_assert(desc->metadata_len == 1 && memcmp(desc->metadata, "l", 1) == 0 &&
		  desc->n_payloads == 1 && desc->payloads[0].length == sizeof(big));
	ck_assert_int_eq(tp_chan_descriptor_free(desc), 0);
	ck_assert_int_eq(tp_chan_read_descriptor(ch, &desc, 0), -EAGAIN);
	tp_chan_release(ch);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

static Suite *chanmsg_suite(void)
{
	Suite *s = suite_create("sec_chanmsg");
	TCase *tc = tcase_create("chanmsg");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_bad_message_descriptors_fail_their_op_only);
	tcase_add_test(tc, test_old_client_never_reads_a_message_as_bytes);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(chanmsg_suite());
}
