/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: large channel items from a hostile forwarding daemon (issue 25 part xhost,
 * peer minor 6; docs/channels.md "Large items across hosts"). A raw dialler over an insecure
 * link (--peer-insecure) opens a channel that admits any peer and writes items whose bytes it
 * says come over the data connection (ChanOp.streamed):
 * - one larger than the channel's capacity is refused with STATUS_TOO_BIG before any byte is
 *   asked for;
 * - a PeerMsg.chan_xfer_end for a transfer nobody posted is ignored (the link stays up);
 * - once admitted (ChanReply.xfer_id), its own chan_xfer_end fails the write with that status,
 *   and the channel holds nothing, no bytes reserved;
 * - admitted, it sends 4 KiB and then nothing while it keeps the link alive with pings: after
 *   the peer timeout (1 s) the write fails with STATUS_TIMEOUT;
 * - admitted again, it sends half the item over the data connection and drops the link: the
 *   write never completes, the channel holds nothing, no bytes reserved, and a local client
 *   writes and reads on as before.
 * And a hostile worker of a work queue (peer minor 11) that answers a message question with
 * bytes it says come over the data connection (WqOp.stream_len): above wq-answer-bytes-max
 * refused before any byte is asked for; its own chan_xfer_end fails the reply with that status,
 * the question still taken; half an answer and a dropped link leave no answer and the question
 * queued again exactly once, intact for a local worker.
 * The hosting daemon survives all of it.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "ipeer.h"
#include "itest.h"
#include "tpt_wire.h"

#define T_MS TPT_SCALED_MS(30000)
#define CAP (4u << 20)
#define ITEM (1u << 20)

static struct tpt_daemon host;
static struct tpt_sync go, back; /* child -> parent, parent -> child */

static int peer_send(struct tpt_raw *r, Tpw__V1__PeerMsg *m)
{
	size_t n = tpw_frame_size(&m->base);
	uint8_t *buf = malloc(n);
	int e;

	if (!buf)
		return -ENOMEM;
	n = tpw_frame_pack(&m->base, 0, 0, ++r->seq, buf);
	e = tpt_raw_send_bytes(r, buf, n, NULL, 0);
	free(buf);
	return e;
}

static int peer_chan(struct tpt_raw *r, Tpw__V1__ChanOp *op, uint64_t req_id)
{
	Tpw__V1__PeerChanOp po = TPW__V1__PEER_CHAN_OP__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	op->req_id = req_id;
	po.op = op;
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_OP;
	m.chan_op = &po;
	return peer_send(r, &m);
}

static int xfer_end(struct tpt_raw *r, uint64_t xfer_id, Tpw__V1__Status st)
{
	Tpw__V1__PeerXferEnd xe = TPW__V1__PEER_XFER_END__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	xe.xfer_id = xfer_id;
	xe.status = st;
	xe.message = "the writer's memory went away";
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_XFER_END;
	m.chan_xfer_end = &xe;
	return peer_send(r, &m);
}

/* The next PeerChanReply (pings skipped): its status; req_id, chan_id and xfer_id into @ret_*.
 * Return: the status, or -errno. */
static int peer_reply(struct tpt_raw *r, uint64_t *ret_req, uint64_t *ret_id,
		      uint64_t *ret_xfer)
{
	Tpw__V1__PeerMsg *m = NULL;
	int e, st;

	for (;;) {
		e = tpt_raw_recv_peer(r, T_MS, &m);
		if (e < 0)
			return e;
		if (m->body_case == TPW__V1__PEER_MSG__BODY_CHAN_REPLY)
			break;
		tpw_peer_msg_free(m);
	}
	st = m->chan_reply->reply->status;
	*ret_req = m->chan_reply->reply->req_id;
	if (ret_id)
		*ret_id = m->chan_reply->reply->chan_id;
	if (ret_xfer)
		*ret_xfer = m->chan_reply->reply->xfer_id;
	tpw_peer_msg_free(m);
	return st;
}

/* As peer_reply(), while it keeps the link alive with a ping every 200 ms (the daemon's keepalive
 * sees a live peer). */
static int peer_reply_pinging(struct tpt_raw *r, uint64_t *ret_req)
{
	Tpw__V1__PeerPing p = TPW__V1__PEER_PING__INIT;
	Tpw__V1__PeerMsg ping = TPW__V1__PEER_MSG__INIT, *m = NULL;
	int e, st;

	ping.body_case = TPW__V1__PEER_MSG__BODY_PING;
	ping.ping = &p;
	for (int ticks = 0; ticks < 150; ticks++) { /* 30 s */
		uint64_t until = tpt_now_ms() + 200;

		if (peer_send(r, &ping) < 0)
			return -EPIPE;
		for (;;) { /* what comes within the tick: pongs are skipped */
			uint64_t now = tpt_now_ms();

			e = now < until ? tpt_raw_recv_peer(r, (int)(until - now), &m) : -ETIMEDOUT;
			if (e == -ETIMEDOUT)
				break;
			if (e < 0)
				return e;
			if (m->body_case != TPW__V1__PEER_MSG__BODY_CHAN_REPLY) {
				tpw_peer_msg_free(m);
				continue;
			}
			st = m->chan_reply->reply->status;
			*ret_req = m->chan_reply->reply->req_id;
			tpw_peer_msg_free(m);
			return st;
		}
	}
	return -ETIMEDOUT;
}

/* Dials @host's peer port as a daemon would (insecure: plain frames), up to the link being up. */
static int peer_dial(struct tpt_raw *c, struct tpt_raw *data)
{
	const struct tpt_raw_peer_hello h = { .port = host.peer_port, .boot_base = 0xb0,
					      .instance = 0x5eed, .timeout_ms = T_MS };

	return tpt_raw_peer_dial(&h, c, data);
}

/* One chunk of transfer @xfer_id at @off: @len bytes of 0x5a. */
static int send_chunk(struct tpt_raw *data, uint64_t xfer_id, uint64_t off, uint32_t len)
{
	return tpt_raw_send_chunk(data, xfer_id, off, len, 0x5a);
}

/* A WRITE of one streamed item of @len bytes on handle @id, as op @req. */
static int write_streamed(struct tpt_raw *c, uint64_t id, uint64_t req, uint64_t len)
{
	Tpw__V1__ChanOp w = TPW__V1__CHAN_OP__INIT;
	protobuf_c_boolean streamed = true;

	w.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	w.chan_id = id;
	w.n_lengths = 1;
	w.lengths = &len;
	w.n_streamed = 1;
	w.streamed = &streamed;
	w.timeout_ms = 0;
	return peer_chan(c, &w, req);
}

static int hostile_writer(void *arg)
{
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	uint64_t id = 0, req = 0, xfer = 0;
	int st;

	(void)arg;
	TPT_REQUIRE(peer_dial(&c, &data) == 0, 1, "dial");
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	o.name = "hosted";
	TPT_REQUIRE(peer_chan(&c, &o, 1) == 0, 1, "open");
	st = peer_reply(&c, &req, &id, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && req == 1 && id, 1, "open: %d", st);
	/* Above the capacity: refused at once, no transfer asked for. */
	TPT_REQUIRE(write_streamed(&c, id, 2, CAP + 1) == 0, 1, "write");
	st = peer_reply(&c, &req, NULL, &xfer);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_TOO_BIG && req == 2 && !xfer, 1,
		    "a write above the capacity: %d, xfer %llu", st, (unsigned long long)xfer);
	/* An end for a transfer nobody posted: ignored. */
	TPT_REQUIRE(xfer_end(&c, 777, TPW__V1__STATUS__STATUS_IO) == 0, 1, "end");
	/* Admitted, then ended by the writer: the write fails with its status. */
	TPT_REQUIRE(write_streamed(&c, id, 3, ITEM) == 0, 1, "write");
	st = peer_reply(&c, &req, NULL, &xfer);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && req == 3 && xfer, 1, "go: %d", st);
	TPT_REQUIRE(send_chunk(&data, xfer, 0, 4096) == 0, 1, "chunk");
	TPT_REQUIRE(xfer_end(&c, xfer, TPW__V1__STATUS__STATUS_IO) == 0, 1, "end");
	st = peer_reply(&c, &req, NULL, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_IO && req == 3, 1, "the ended write: %d", st);
	/* Admitted, then nothing sent while the link stays up: after the peer timeout (1 s) the
	 * write fails with STATUS_TIMEOUT and its room comes back. */
	TPT_REQUIRE(write_streamed(&c, id, 5, ITEM) == 0, 1, "write");
	st = peer_reply(&c, &req, NULL, &xfer);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && req == 5 && xfer, 1, "go: %d", st);
	TPT_REQUIRE(send_chunk(&data, xfer, 0, 4096) == 0, 1, "chunk");
	st = peer_reply_pinging(&c, &req);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_TIMEOUT && req == 5, 1, "the stalled write: %d",
		    st);
	/* Admitted, half sent, then the link goes. */
	TPT_REQUIRE(write_streamed(&c, id, 4, ITEM) == 0, 1, "write");
	st = peer_reply(&c, &req, NULL, &xfer);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && req == 4 && xfer, 1, "go: %d", st);
	TPT_REQUIRE(send_chunk(&data, xfer, 0, ITEM / 2) == 0, 1, "chunk");
	TPT_REQUIRE(tpt_sync_post(&go, 1) == 0, 1, "post"); /* the parent checks the channel */
	TPT_REQUIRE(tpt_sync_wait(&back, T_MS) == 2, 1, "parent");
	tpt_raw_close(&data);
	tpt_raw_close(&c);
	return 0;
}

/* Waits for the child @pid's post on go (its value), or its end (-ECHILD: it failed first). */
static int wait_post(pid_t pid)
{
	for (int i = 0; i < 4 * T_MS / 200; i++) {
		int r = tpt_sync_wait(&go, 200);

		if (r != -ETIMEDOUT)
			return r;
		if (waitpid(pid, NULL, WNOHANG) == pid)
			return -ECHILD;
	}
	return -ETIMEDOUT;
}

/* What `tpipctl --json channels` shows of "hosted": @field (a number) or -1. */
static long chan_field(const char *field)
{
	char want[64], *out = tpt_ctl(&host, "channels", true), *p;
	long v = -1;

	snprintf(want, sizeof(want), "\"%s\": ", field);
	p = strstr(out, want);
	if (p)
		v = strtol(p + strlen(want), NULL, 10);
	free(out);
	return v;
}

START_TEST(test_hostile_writer_leaves_no_partial_item)
{
	static const char *const args[] = { "--peer-insecure", "--peer-timeout", "1000", NULL };
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .capacity_bytes = CAP, .remote = TP_REMOTE_ANY_PEER };
	const char item[] = "kept";
	struct iovec iov = { .iov_base = (void *)item, .iov_len = 4 };
	struct tp_context *ctx;
	struct tp_chan *ch;
	void *got;
	size_t len;
	pid_t pid;
	int i;

	ck_assert_int_eq(tpt_sync_init(&go), 0);
	ck_assert_int_eq(tpt_sync_init(&back), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&host, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&host, 0, "host", &ctx), 0);
	ck_assert_int_eq(tp_chan_open(ctx, "hosted", &o, &ch), 0);
	pid = tpt_fork(hostile_writer, NULL);
	ck_assert_int_gt(pid, 0);
	ck_assert_int_eq(wait_post(pid), 1);
	/* Half an item in, its room reserved: nothing to read. */
	ck_assert_int_eq(tp_chan_read(ch, &got, &len, 0), -EAGAIN);
	ck_assert_int_eq(chan_field("items"), 0);
	ck_assert_int_eq(chan_field("bytes"), ITEM);
	ck_assert_int_eq(tpt_sync_post(&back, 2), 0);
	ck_assert(tpt_wait_ok(pid, 4 * T_MS, "hostile writer"));
	for (i = 0; i < 200 && chan_field("bytes") != 0; i++)
		usleep(50000); /* polling what tpipctl shows, not a synchronisation */
	ck_assert_int_eq(chan_field("bytes"), 0);
	ck_assert_int_eq(chan_field("items"), 0);
	ck_assert_int_eq(chan_field("remote_handles"), 0);
	ck_assert(tpt_daemon_alive(&host));
	ck_assert_int_eq(tp_chan_read(ch, &got, &len, 0), -EAGAIN);
	ck_assert_int_eq(tp_chan_write(ch, &iov, 1, 0), 0); /* the channel works on */
	ck_assert_int_eq(tp_chan_read(ch, &got, &len, 1000), 0);
	ck_assert_uint_eq(len, 4);
	free(got);
	tp_chan_release(ch);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&host), 0);
	tpt_sync_done(&go);
	tpt_sync_done(&back);
}
END_TEST

/* ---- a work queue's messages (peer minor 11) ------------------------------------------------ */

#define WQA (2u << 20) /* the host's wq-answer-bytes-max */

static int peer_wq(struct tpt_raw *r, Tpw__V1__WqOp *op, uint64_t req_id)
{
	Tpw__V1__PeerWqOp po = TPW__V1__PEER_WQ_OP__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	op->req_id = req_id;
	po.op = op;
	m.body_case = TPW__V1__PEER_MSG__BODY_WQ_OP;
	m.wq_op = &po;
	return peer_send(r, &m);
}

/* The next PeerWqReply (pings skipped): its status; req_id, wq_id, question_id and xfer_id into
 * @ret (4 numbers). Return: the status, or -errno. */
static int peer_wq_reply(struct tpt_raw *r, uint64_t ret[4])
{
	Tpw__V1__PeerMsg *m = NULL;
	int e, st;

	for (;;) {
		e = tpt_raw_recv_peer(r, T_MS, &m);
		if (e < 0)
			return e;
		if (m->body_case == TPW__V1__PEER_MSG__BODY_WQ_REPLY)
			break;
		tpw_peer_msg_free(m);
	}
	st = m->wq_reply->reply->status;
	ret[0] = m->wq_reply->reply->req_id;
	ret[1] = m->wq_reply->reply->wq_id;
	ret[2] = m->wq_reply->reply->question_id;
	ret[3] = m->wq_reply->reply->xfer_id;
	tpw_peer_msg_free(m);
	return st;
}

/* A message REPLY to question @q on handle @id, as op @req: one payload of @len bytes whose
 * bytes come over the data connection. */
static int reply_streamed(struct tpt_raw *c, uint64_t id, uint64_t q, uint64_t req, uint64_t len)
{
	Tpw__V1__WqOp o = TPW__V1__WQ_OP__INIT;
	Tpw__V1__Descriptor d = TPW__V1__DESCRIPTOR__INIT;
	Tpw__V1__PayloadDesc pd = TPW__V1__PAYLOAD_DESC__INIT, *pp = &pd;

	pd.length = len;
	d.n_payloads = 1;
	d.payloads = &pp;
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_REPLY;
	o.wq_id = id;
	o.question_id = q;
	o.msg_desc = &d;
	o.stream_len = len;
	return peer_wq(c, &o, req);
}

static int hostile_worker(void *arg)
{
	Tpw__V1__WqOp o = TPW__V1__WQ_OP__INIT;
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	uint64_t id, q, a[4];
	int st;

	(void)arg;
	TPT_REQUIRE(peer_dial(&c, &data) == 0, 1, "dial");
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_OPEN;
	o.name = "hq";
	o.owner_set = true;
	TPT_REQUIRE(peer_wq(&c, &o, 1) == 0, 1, "open");
	st = peer_wq_reply(&c, a);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && a[0] == 1 && a[1], 1, "open: %d", st);
	id = a[1];
	o = (Tpw__V1__WqOp)TPW__V1__WQ_OP__INIT;
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_TAKE;
	o.wq_id = id;
	o.msg = true;
	TPT_REQUIRE(peer_wq(&c, &o, 2) == 0, 1, "take");
	st = peer_wq_reply(&c, a);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && a[2], 1, "take: %d", st);
	q = a[2];
	/* Above wq-answer-bytes-max: refused at once, no transfer asked for. */
	TPT_REQUIRE(reply_streamed(&c, id, q, 3, WQA + 1) == 0, 1, "reply");
	st = peer_wq_reply(&c, a);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_LIMIT && a[0] == 3 && !a[3], 1,
		    "a reply above wq-answer-bytes-max: %d, xfer %llu", st,
		    (unsigned long long)a[3]);
	/* Admitted, then ended by the sender: the reply fails with its status; still taken. */
	TPT_REQUIRE(reply_streamed(&c, id, q, 4, ITEM) == 0, 1, "reply");
	st = peer_wq_reply(&c, a);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && a[0] == 4 && a[3], 1, "go: %d", st);
	TPT_REQUIRE(send_chunk(&data, a[3], 0, 4096) == 0, 1, "chunk");
	TPT_REQUIRE(xfer_end(&c, a[3], TPW__V1__STATUS__STATUS_IO) == 0, 1, "end");
	st = peer_wq_reply(&c, a);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_IO && a[0] == 4, 1, "the ended reply: %d", st);
	/* Admitted again (the question is still this handle's), half sent, then the link goes. */
	TPT_REQUIRE(reply_streamed(&c, id, q, 5, ITEM) == 0, 1, "reply");
	st = peer_wq_reply(&c, a);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && a[0] == 5 && a[3], 1, "go: %d", st);
	TPT_REQUIRE(send_chunk(&data, a[3], 0, ITEM / 2) == 0, 1, "chunk");
	TPT_REQUIRE(tpt_sync_post(&go, 1) == 0, 1, "post"); /* the parent checks the queue */
	TPT_REQUIRE(tpt_sync_wait(&back, T_MS) == 2, 1, "parent");
	tpt_raw_close(&data);
	tpt_raw_close(&c);
	return 0;
}

/* What `tpipctl --json queues` shows of "hq": @field (a number) or -1. */
static long wq_field(const char *field)
{
	char want[64], *out = tpt_ctl(&host, "queues", true), *p;
	long v = -1;

	snprintf(want, sizeof(want), "\"%s\": ", field);
	p = strstr(out, want);
	if (p)
		v = strtol(p + strlen(want), NULL, 10);
	free(out);
	return v;
}

/* A hostile worker on another host answers a message question of hq with bytes it says come
 * over the data connection: above wq-answer-bytes-max it is refused before any byte is asked
 * for; its own end of the transfer fails the reply with that status, the question still its
 * own; half an answer and a dropped link leave no answer at all and the question queued again
 * exactly once, intact for a local worker. */
START_TEST(test_hostile_worker_leaves_no_partial_answer)
{
	static const char *const args[] = { "--peer-insecure", "--peer-timeout", "1000",
					    "--wq-answer-bytes-max", "2097152", NULL };
	struct tp_wq_options o = { .size = sizeof(o), .flags = TP_WQ_CREATE, .owner_uid = -1,
				   .remote = TP_REMOTE_ANY_PEER };
	struct tp_wq_options wo = { .size = sizeof(wo), .owner_uid = -1 };
	struct tp_payload pl = { .data = (void *)"question", .length = 8 };
	struct tp_message m = { .payloads = &pl, .n_payloads = 1 };
	struct tp_descriptor *d;
	struct tp_context *ctx;
	struct tp_wq *own, *w;
	uint64_t q, got;
	void *bytes;
	size_t len;
	pid_t pid;
	int i;

	ck_assert_int_eq(tpt_sync_init(&go), 0);
	ck_assert_int_eq(tpt_sync_init(&back), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&host, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&host, 0, "host", &ctx), 0);
	ck_assert_int_eq(tp_wq_open(ctx, "hq", &o, &own), 0);
	ck_assert_int_eq(tp_wq_submit_msg(own, &m, &q), 0);
	pid = tpt_fork(hostile_worker, NULL);
	ck_assert_int_gt(pid, 0);
	ck_assert_int_eq(wait_post(pid), 1);
	/* Half an answer in, its room reserved: nothing to receive. */
	ck_assert_int_eq(tp_wq_answer_descriptor(own, &got, &d, 0), -EAGAIN);
	ck_assert_int_eq(wq_field("answers"), 0);
	ck_assert_int_gt(wq_field("answer_bytes"), ITEM);
	ck_assert_int_eq(tpt_sync_post(&back, 2), 0);
	ck_assert(tpt_wait_ok(pid, 4 * T_MS, "hostile worker"));
	for (i = 0; i < 200 && wq_field("answer_bytes") != 0; i++)
		usleep(50000); /* polling what tpipctl shows, not a synchronisation */
	ck_assert_int_eq(wq_field("answer_bytes"), 0);
	ck_assert_int_eq(wq_field("answers"), 0);
	ck_assert_int_eq(wq_field("requeued"), 1);
	ck_assert_int_eq(wq_field("queued"), 1);
	ck_assert(tpt_daemon_alive(&host));
	ck_assert_int_eq(tp_wq_answer_descriptor(own, &got, &d, 0), -EAGAIN);
	ck_assert_int_eq(tp_wq_open(ctx, "hq", &wo, &w), 0);
	ck_assert_int_eq(tp_wq_take(w, &got, &bytes, &len, 0), -EOPNOTSUPP); /* a message */
	ck_assert_int_eq(tp_wq_take_descriptor(w, &got, &d, 1000), 0);
	ck_assert_uint_eq(got, q);
	{
		char buf[8];
		struct tp_slot slot = { .device = { .type = TP_DEVICE_CPU }, .data = buf };
		struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };

		ck_assert_int_eq(tp_wq_read_msg(w, d, &a), 0);
		ck_assert_int_eq(memcmp(buf, "question", 8), 0);
	}
	ck_assert_int_eq(tp_wq_reply(w, q, "ok", 2), 0);
	ck_assert_int_eq(tp_wq_answer(own, &got, &bytes, &len, 1000), 0);
	ck_assert(got == q && len == 2 && memcmp(bytes, "ok", 2) == 0);
	free(bytes);
	tp_wq_release(w);
	tp_wq_release(own);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&host), 0);
	tpt_sync_done(&go);
	tpt_sync_done(&back);
}
END_TEST

/* ---- a chunk sent twice counts once ------------------------------------------------------- */

#define SECRET 0xc3

/* Writes one streamed item of ITEM bytes to "hosted" once the parent said so, sending its first
 * half twice and its second half never; posts the write's status (+1) on go, or 127 when the
 * link failed instead (the daemon's answer to a chunk that overlaps one it has: a protocol
 * violation). */
static int twice_writer(void *arg)
{
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	uint64_t id = 0, req = 0, xfer = 0;
	int st;

	(void)arg;
	TPT_REQUIRE(peer_dial(&c, &data) == 0, 1, "dial");
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	o.name = "hosted";
	TPT_REQUIRE(peer_chan(&c, &o, 1) == 0, 1, "open");
	st = peer_reply(&c, &req, &id, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && req == 1 && id, 1, "open: %d", st);
	TPT_REQUIRE(tpt_sync_post(&go, 1) == 0, 1, "post");
	TPT_REQUIRE(tpt_sync_wait(&back, T_MS) == 1, 1, "parent");
	TPT_REQUIRE(write_streamed(&c, id, 2, ITEM) == 0, 1, "write");
	st = peer_reply(&c, &req, NULL, &xfer);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && req == 2 && xfer, 1, "go: %d", st);
	TPT_REQUIRE(send_chunk(&data, xfer, 0, ITEM / 2) == 0, 1, "chunk");
	TPT_REQUIRE(send_chunk(&data, xfer, 0, ITEM / 2) == 0, 1, "chunk again");
	st = peer_reply_pinging(&c, &req);
	TPT_REQUIRE(st < 0 || req == 2, 1, "an answer to request %llu", (unsigned long long)req);
	TPT_REQUIRE(tpt_sync_post(&go, (int8_t)(st < 0 ? 127 : st + 1)) == 0, 1, "post");
	TPT_REQUIRE(tpt_sync_wait(&back, T_MS) == 2, 1, "parent");
	tpt_raw_close(&data);
	tpt_raw_close(&c);
	return 0;
}

/*
 * A peer's streamed item is complete only once each of its bytes arrived. A forwarding daemon
 * that sends the first half twice and the second half never must not get an item whose second
 * half is whatever the hosting daemon's buffer held before: here, a local user's item of another
 * channel (no remote access) read just before, whose buffer the daemon keeps for reuse.
 */
START_TEST(test_hostile_writer_chunk_twice_gets_no_item_of_stale_bytes)
{
	static const char *const args[] = { "--peer-insecure", "--peer-timeout", "1000", NULL };
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .capacity_bytes = CAP, .remote = TP_REMOTE_ANY_PEER };
	struct tp_chan_options po = { .size = sizeof(po), .flags = TP_CHAN_CREATE,
				      .owner_uid = -1, .capacity_bytes = CAP };
	uint8_t *secret = NULL, *got = NULL;
	struct iovec iov = { .iov_len = ITEM };
	struct tp_context *ctx, *vctx;
	struct tp_chan *ch, *priv;
	size_t len = 0, stale = 0, foreign = 0;
	int st;
	pid_t pid;

	ck_assert_int_eq(tpt_sync_init(&go), 0);
	ck_assert_int_eq(tpt_sync_init(&back), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&host, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&host, 0, "host", &ctx), 0);
	ck_assert_int_eq(tp_chan_open(ctx, "hosted", &o, &ch), 0);
	pid = tpt_fork(twice_writer, NULL);
	ck_assert_int_gt(pid, 0);
	ck_assert_int_eq(wait_post(pid), 1);
	/* another context's item on a channel no peer may reach, written from its shared buffer
	 * (the daemon copies it into an item of its own) and read */
	ck_assert_int_eq(tpt_ctx_new(&host, 0, "victim", &vctx), 0);
	ck_assert_int_eq(tp_buffer_alloc(vctx, ITEM, (void **)&secret), 0);
	memset(secret, SECRET, ITEM);
	iov.iov_base = secret;
	ck_assert_int_eq(tp_chan_open(vctx, "private", &po, &priv), 0);
	ck_assert_int_eq(tp_chan_write(priv, &iov, 1, 1000), 0);
	ck_assert_int_eq(tp_chan_read(priv, (void **)&got, &len, 1000), 0);
	ck_assert_uint_eq(len, ITEM);
	free(got);
	got = NULL;
	tp_chan_release(priv);
	ck_assert_int_eq(tp_buffer_free(vctx, secret), 0);
	tp_context_free(vctx);
	ck_assert_int_eq(tpt_sync_post(&back, 1), 0);
	st = wait_post(pid);
	ck_assert_int_gt(st, 0);
	if (st - 1 == TPW__V1__STATUS__STATUS_OK) {
		ck_assert_int_eq(tp_chan_read(ch, (void **)&got, &len, 1000), 0);
		for (size_t i = 0; i < len; i++) {
			stale += got[i] != 0x5a;
			foreign += got[i] == SECRET;
		}
		fprintf(stderr, "the peer's item of %zu bytes (half of it sent, twice) was accepted: "
			"%zu bytes it never sent, %zu of them the local user's item\n", len, stale,
			foreign);
		free(got);
		got = NULL;
	}
	fprintf(stderr, "the peer's write: %s\n", st == 127 ? "its link failed" :
		st - 1 == TPW__V1__STATUS__STATUS_OK ? "accepted" : "refused");
	ck_assert_int_ne(st - 1, TPW__V1__STATUS__STATUS_OK);
	/* No item, and its room comes back. */
	ck_assert_int_eq(tp_chan_read(ch, (void **)&got, &len, 0), -EAGAIN);
	for (int i = 0; i < 200 && chan_field("bytes") != 0; i++)
		usleep(50000); /* polling what tpipctl shows, not a synchronisation */
	ck_assert_int_eq(chan_field("bytes"), 0);
	ck_assert_int_eq(tpt_sync_post(&back, 2), 0);
	ck_assert(tpt_wait_ok(pid, 4 * T_MS, "hostile writer"));
	ck_assert(tpt_daemon_alive(&host));
	ck_assert_uint_eq(stale, 0);
	tp_chan_release(ch);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&host), 0);
	tpt_sync_done(&go);
	tpt_sync_done(&back);
}
END_TEST

/* ---- a stalled item kept alive by chunks of no transfer ------------------------------------ */

/* Writes one streamed item of ITEM bytes to "hosted", sends 4 KiB of it, then for 5 s (five
 * peer timeouts) only a 1-byte chunk of a transfer nobody posted every 200 ms, and pings; posts
 * on go the write's status + 1, or 1 if it was still unanswered. */
static int trickle_writer(void *arg)
{
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__PeerPing p = TPW__V1__PEER_PING__INIT;
	Tpw__V1__PeerMsg ping = TPW__V1__PEER_MSG__INIT, *m = NULL;
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	uint64_t id = 0, req = 0, xfer = 0;
	int st, res = 0;

	(void)arg;
	ping.body_case = TPW__V1__PEER_MSG__BODY_PING;
	ping.ping = &p;
	TPT_REQUIRE(peer_dial(&c, &data) == 0, 1, "dial");
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	o.name = "hosted";
	TPT_REQUIRE(peer_chan(&c, &o, 1) == 0, 1, "open");
	st = peer_reply(&c, &req, &id, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && req == 1 && id, 1, "open: %d", st);
	TPT_REQUIRE(write_streamed(&c, id, 2, ITEM) == 0, 1, "write");
	st = peer_reply(&c, &req, NULL, &xfer);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && req == 2 && xfer, 1, "go: %d", st);
	TPT_REQUIRE(send_chunk(&data, xfer, 0, 4096) == 0, 1, "chunk");
	for (int tick = 0; tick < 25 && !res; tick++) {
		TPT_REQUIRE(peer_send(&c, &ping) == 0, 1, "ping");
		TPT_REQUIRE(send_chunk(&data, xfer + 1000003, 0, 1) == 0, 1, "stray chunk");
		while (tpt_raw_recv_peer(&c, 200, &m) == 0) {
			if (m->body_case == TPW__V1__PEER_MSG__BODY_CHAN_REPLY &&
			    m->chan_reply->reply->req_id == 2)
				res = m->chan_reply->reply->status + 1;
			tpw_peer_msg_free(m);
		}
	}
	TPT_REQUIRE(tpt_sync_post(&go, (int8_t)(res + 1)) == 0, 1, "post");
	TPT_REQUIRE(tpt_sync_wait(&back, T_MS) == 2, 1, "parent");
	tpt_raw_close(&data);
	tpt_raw_close(&c);
	return 0;
}

/*
 * A forwarding daemon that stops sending an admitted item while its link stays up loses the
 * write after --peer-timeout without bytes (test_hostile_writer_leaves_no_partial_item). Chunks
 * of a transfer nobody posted are drained, not bytes of that item: they must not keep its room
 * (and the daemon's item buffer) reserved beyond that.
 */
START_TEST(test_hostile_writer_stray_chunks_do_not_keep_a_stalled_item)
{
	static const char *const args[] = { "--peer-insecure", "--peer-timeout", "1000", NULL };
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .capacity_bytes = CAP, .remote = TP_REMOTE_ANY_PEER };
	struct tp_context *ctx;
	struct tp_chan *ch;
	long bytes;
	int st;
	pid_t pid;

	ck_assert_int_eq(tpt_sync_init(&go), 0);
	ck_assert_int_eq(tpt_sync_init(&back), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&host, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&host, 0, "host", &ctx), 0);
	ck_assert_int_eq(tp_chan_open(ctx, "hosted", &o, &ch), 0);
	pid = tpt_fork(trickle_writer, NULL);
	ck_assert_int_gt(pid, 0);
	st = wait_post(pid);
	bytes = chan_field("bytes");
	fprintf(stderr, "after 5 peer timeouts of stray chunks: write %s, channel bytes %ld\n",
		st == 1 ? "unanswered" : "answered", bytes);
	ck_assert_int_eq(tpt_sync_post(&back, 2), 0);
	ck_assert(tpt_wait_ok(pid, 4 * T_MS, "hostile writer"));
	ck_assert(tpt_daemon_alive(&host));
	ck_assert_int_eq(st, 1 + 1 + TPW__V1__STATUS__STATUS_TIMEOUT);
	ck_assert_int_eq(bytes, 0);
	tp_chan_release(ch);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&host), 0);
	tpt_sync_done(&go);
	tpt_sync_done(&back);
}
END_TEST

static Suite *chanxbig_suite(void)
{
	Suite *s = suite_create("sec_chanxbig");
	TCase *tc = tcase_create("hostile");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_hostile_writer_leaves_no_partial_item);
	tcase_add_test(tc, test_hostile_worker_leaves_no_partial_answer);
	tcase_add_test(tc, test_hostile_writer_chunk_twice_gets_no_item_of_stale_bytes);
	tcase_add_test(tc, test_hostile_writer_stray_chunks_do_not_keep_a_stalled_item);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(chanxbig_suite());
}
