/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: channels across hosts (docs/channels.md, "Across hosts") against an
 * unprivileged local user (uid 65534) speaking the raw protocol to its own daemon (a) about a
 * channel hosted by the other daemon (b) that admits other hosts. A forwarded op whose ChanOp
 * carries fields the daemon does not know is forwarded without them: the daemon survives and
 * answers (it used to pass on their count without their bytes, and died packing the frame); so
 * is a read asking to map a lent item (that is for channels of this host; the far daemon took
 * it as malformed and failed the link, the victim's handle with it).
 * So is a message item whose frame is exactly this daemon's frame-max, which once wrapped for
 * the link is a few bytes above the far daemon's: refused to that client with -EMSGSIZE (it used
 * to fail the whole link at the far daemon).
 * The user's handle ids are its own: a victim's handle of the same remote channel, guessed by
 * id, is not found for read, write, close and release; the victim's remote handle, its channel
 * and its item stay as they were.
 *
 * And a hostile peer daemon (a raw dialler over an insecure link, as --peer-insecure allows):
 * its reads wait up to chan-peer-ops-max (3) and one more is refused with STATUS_LIMIT while a
 * try-once read is still answered, over its two links from one address together too; a
 * guessed handle id is not found; an answer to an op the daemon never forwarded is dropped; an
 * UNLINK naming an address (a protocol violation: peer minor 6 lets a plain UNLINK cross,
 * chan-remote-create-uid decides) fails its link, which drops its handles and waits, while the
 * channel, its items and a local reader are untouched.
 *
 * And a peer daemon whose frames are smaller than this daemon's (256 KiB in its Hello) that takes
 * a 300 KiB message item inline: refused with -EMSGSIZE, the link up, the item back in the
 * channel on release (it used to be sent in a frame that failed the link there).
 *
 * And a hostile hosting daemon (a raw answerer the daemon dials): one that speaks peer protocol
 * 2.2 gets no channel message (the open fails with -EOPNOTSUPP naming its version, the link
 * stays up); one of 2.3 that answers a read without an item, answers ops it was never sent, and
 * answers a close with an item: the client gets an error for the first and a plain success for
 * the close, the others are dropped, and a later item arrives intact; its protocol violation
 * then fails the client's waiting read with -ECONNRESET naming the host. One of 2.7 is sent no
 * work queue creation (it would open the queue as a worker's): the open fails with
 * -EOPNOTSUPP naming its version, the link stays up. One of 2.8 is sent a worker's open and
 * release but no work queue message op (it would take them for byte ops): the take by
 * descriptor and the message reply fail with -EOPNOTSUPP naming its version, the link up.
 * One of 2.10 is sent no work queue message by reference: a message above the inline limit,
 * submitted or replied from a shared buffer or private memory, fails with -EMSGSIZE naming its
 * version, the link up.
 * One of 2.9 is asked for one item per batch read; one of 2.10 for the batch, and its answer
 * of more items than asked is refused to the client with the link up, an answer with fields
 * for this host's clients alone (lent staging, 1025 released buffers) reaches the client without
 * them (its library ended the whole context on them), one whose lengths miss its tail fails
 * the link. One of 2.11 answers a worker's work queue open, take and reply with fields of
 * other ops' answers (a descriptor held, a worker's death, nobody waiting, ownership): the
 * client gets a plain handle, a clean error for that take only (-EPROTO) and a plain reply,
 * the link and the context up.
 *
 * And a hostile peer daemon against a work queue on a daemon that lets other hosts create
 * queues (chan-remote-create-uid): it creates none over its insecure link, is never the owner,
 * sends bytes and an end for a transfer nobody asked for (dropped), replies to ids it never took
 * (-ENOENT), and a plain open naming remote peers fails its link; the queue is untouched.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ipeer.h"
#include "itest.h"
#include "tpt_wire.h"

#define T_MS TPT_SCALED_MS(30000)
/* What a frame to a far daemon holds besides its tail at most (daemon/peer/peer.h) */
#define TPD_PEER_FRAME_SLACK_BYTES 65536u
#define NOBODY 65534

static char addr[256];
static struct tpt_sync go;

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

/* Writes to handle @id one message item of a frame of exactly TPW_DEFAULT_FRAME_MAX bytes (the
 * daemons' frame-max here): the most metadata a message may have and a payload that fills the
 * rest. Return: the answer's status, or -errno. */
static int oversized_write(struct tpt_raw *r, uint64_t id)
{
	static uint8_t meta[TPW_DEFAULT_METADATA_MAX];
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__Descriptor d = TPW__V1__DESCRIPTOR__INIT, *dp = &d;
	Tpw__V1__PayloadDesc pd = TPW__V1__PAYLOAD_DESC__INIT, *pdp = &pd;
	uint64_t len = 4u << 20; /* a 4-byte varint, as the final length's */
	_cleanup_free_ uint8_t *tail = NULL;
	size_t msg_len;

	memset(meta, 'm', sizeof(meta));
	op.req_id = 1;
	op.chan_id = id;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	op.n_lengths = 1;
	op.lengths = &len;
	op.n_msgs = 1;
	op.msgs = &dp;
	d.metadata = (ProtobufCBinaryData){ sizeof(meta), meta };
	d.n_payloads = 1;
	d.payloads = &pdp;
	pd.length = len;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &op;
	msg_len = tpw_frame_size(&m.base) - TPW_HDR_SIZE;
	len = TPW_DEFAULT_FRAME_MAX - msg_len;
	pd.length = len;
	if (msg_len != tpw_frame_size(&m.base) - TPW_HDR_SIZE || len > TPW_DEFAULT_FRAME_MAX -
	    TPD_PEER_FRAME_SLACK_BYTES)
		return -ERANGE; /* the test's own arithmetic */
	tail = calloc(1, len);
	if (!tail)
		return -ENOMEM;
	return raw_chan(r, &op, tail, (uint32_t)len, NULL);
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
	TPT_REQUIRE(tpt_become(NOBODY) == 0, 1, "cannot drop to nobody");
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
	/* A read asking to map (a channel of this host's only): forwarded without it, answered;
	 * a peer daemon takes those fields as malformed, which used to fail the whole link. */
	uint64_t keys[1] = { 12345 };

	rd.base.n_unknown_fields = 0;
	rd.base.unknown_fields = NULL;
	rd.map_ok = true;
	rd.n_mapped = 1;
	rd.mapped = keys;
	st = raw_chan(&r, &rd, NULL, 0, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_TIMEOUT, 1, "read asking to map: %d", st);
	/* A message item whose frame is exactly this daemon's frame-max, its payload at the most
	 * that crosses inline and its descriptor's metadata at the limit: once wrapped for the link
	 * the frame is a few bytes above the far daemon's frame-max, which used to fail the whole
	 * link (the victim's handle with it). It is refused to this client alone. */
	st = oversized_write(&r, id);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_TOO_BIG, 1, "a write just under this daemon's "
		    "frames but over the far one's once wrapped: %d", st);
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
				    "op %d on id %llu: %d", (int)kinds[k],
				    (unsigned long long)g, st);
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

/* ---- a hostile peer daemon ---------------------------------------------------------------- */

#define OPS_MAX 3

static struct tpt_daemon host;

static int peer_send(struct tpt_raw *r, Tpw__V1__PeerMsg *m, const void *tail, uint32_t len)
{
	size_t n = tpw_frame_size(&m->base);
	uint8_t *buf = malloc(n + len);
	int e;

	if (!buf)
		return -ENOMEM;
	n = tpw_frame_pack(&m->base, len, 0, ++r->seq, buf);
	if (len)
		memcpy(buf + n, tail, len);
	e = tpt_raw_send_bytes(r, buf, n + len, NULL, 0);
	free(buf);
	return e;
}

static int peer_chan(struct tpt_raw *r, Tpw__V1__ChanOp *op, uint64_t req_id, const void *tail,
		     uint32_t len)
{
	Tpw__V1__PeerChanOp po = TPW__V1__PEER_CHAN_OP__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	op->req_id = req_id;
	po.op = op;
	po.uid = 0;
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_OP;
	m.chan_op = &po;
	return peer_send(r, &m, tail, len);
}

/* The next PeerChanReply (pings are skipped): its status, req_id into *@ret_req, chan_id into
 * *@ret_id. Return: the status, or -errno. */
static int peer_reply(struct tpt_raw *r, uint64_t *ret_req, uint64_t *ret_id)
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
	tpw_peer_msg_free(m);
	return st;
}

/* Dials @host's peer port as a daemon would (insecure: plain frames) that takes frames of at
 * most @frame_max (0: says nothing), up to the link being up. */
static int peer_dial_frames(struct tpt_raw *c, struct tpt_raw *data, uint32_t frame_max)
{
	const struct tpt_raw_peer_hello h = { .port = host.peer_port, .boot_base = 0xa0,
					      .instance = 0x5eed, .frame_max = frame_max,
					      .timeout_ms = T_MS };

	return tpt_raw_peer_dial(&h, c, data);
}

static int peer_dial(struct tpt_raw *c, struct tpt_raw *data)
{
	return peer_dial_frames(c, data, 0);
}

static int hostile_peer(void *arg)
{
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ChanReply fr = TPW__V1__CHAN_REPLY__INIT;
	Tpw__V1__PeerChanReply pfr = TPW__V1__PEER_CHAN_REPLY__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT, *in = NULL;
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	uint64_t id = 0, req = 0;
	int st;

	(void)arg;
	TPT_REQUIRE(peer_dial(&c, &data) == 0, 1, "dial");
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	o.name = "hosted";
	TPT_REQUIRE(peer_chan(&c, &o, 1, NULL, 0) == 0, 1, "open");
	st = peer_reply(&c, &req, &id);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && req == 1 && id, 1, "open: %d", st);
	/* OPS_MAX reads wait (no answer), one more is refused, a try-once read is answered. */
	for (uint64_t i = 0; i <= OPS_MAX; i++) {
		Tpw__V1__ChanOp rd = TPW__V1__CHAN_OP__INIT;

		rd.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
		rd.chan_id = id;
		rd.timeout_ms = UINT32_MAX;
		TPT_REQUIRE(peer_chan(&c, &rd, 10 + i, NULL, 0) == 0, 1, "read %llu",
			    (unsigned long long)i);
	}
	st = peer_reply(&c, &req, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_LIMIT && req == 10 + OPS_MAX, 1,
		    "the read above chan-peer-ops-max: status %d for req %llu", st,
		    (unsigned long long)req);
	Tpw__V1__ChanOp once = TPW__V1__CHAN_OP__INIT;

	once.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	once.chan_id = id;
	TPT_REQUIRE(peer_chan(&c, &once, 20, NULL, 0) == 0, 1, "try-once read");
	st = peer_reply(&c, &req, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_TIMEOUT && req == 20, 1, "try-once read: %d", st);
	/* A guessed handle. */
	once.chan_id = id + 1000;
	TPT_REQUIRE(peer_chan(&c, &once, 21, NULL, 0) == 0, 1, "guessed read");
	st = peer_reply(&c, &req, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_NOT_FOUND && req == 21, 1, "guessed: %d", st);
	/* An answer to nothing this daemon forwarded: dropped, the link stays. */
	fr.req_id = 777;
	fr.chan_id = 1;
	pfr.reply = &fr;
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_REPLY;
	m.chan_reply = &pfr;
	TPT_REQUIRE(peer_send(&c, &m, NULL, 0) == 0, 1, "forged answer");
	once.chan_id = id;
	TPT_REQUIRE(peer_chan(&c, &once, 22, NULL, 0) == 0, 1, "read after the forged answer");
	st = peer_reply(&c, &req, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_TIMEOUT && req == 22, 1, "after forged: %d", st);
	/* Once the parent saw the reads wait, break the protocol: the link fails. */
	TPT_REQUIRE(tpt_sync_wait(&go, T_MS) == 1, 1, "parent");
	Tpw__V1__ChanOp un = TPW__V1__CHAN_OP__INIT;

	un.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK;
	un.name = "tpip://127.0.0.1/hosted"; /* an address never crosses a link */
	TPT_REQUIRE(peer_chan(&c, &un, 30, NULL, 0) == 0, 1, "unlink");
	for (;;) {
		st = tpt_raw_recv_peer(&c, T_MS, &in);
		if (st < 0)
			break;
		TPT_REQUIRE(in->body_case == TPW__V1__PEER_MSG__BODY_PING, 1,
			    "message %d after an unlink", (int)in->body_case);
		tpw_peer_msg_free(in);
	}
	TPT_REQUIRE(st == -ECONNRESET, 1, "the link stayed: %d", st);
	tpt_raw_close(&data);
	tpt_raw_close(&c);
	return 0;
}

/* A peer daemon whose frames are small (its Hello: 256 KiB, so 192 KiB of items inline) takes
 * a 300 KiB message item inline: refused (-EMSGSIZE) instead of a frame that would fail the link
 * there; it releases its handle, which gives the item back to the channel. */
#define SMALL_FRAMES (256u << 10)

static int small_frames_peer(void *arg)
{
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__PeerMsg *in = NULL;
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	uint64_t id = 0, req = 0;
	int st;

	(void)arg;
	TPT_REQUIRE(peer_dial_frames(&c, &data, SMALL_FRAMES) == 0, 1, "dial");
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	o.name = "hosted";
	TPT_REQUIRE(peer_chan(&c, &o, 1, NULL, 0) == 0, 1, "open");
	st = peer_reply(&c, &req, &id);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && req == 1 && id, 1, "open: %d", st);
	o = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	o.chan_id = id;
	o.msg = true;
	o.timeout_ms = 5000;
	TPT_REQUIRE(peer_chan(&c, &o, 2, NULL, 0) == 0, 1, "descriptor read");
	for (;;) {
		TPT_REQUIRE(tpt_raw_recv_peer(&c, T_MS, &in) == 0, 1, "descriptor answer");
		if (in->body_case == TPW__V1__PEER_MSG__BODY_CHAN_REPLY)
			break;
		tpw_peer_msg_free(in);
	}
	TPT_REQUIRE(in->chan_reply->reply->status == TPW__V1__STATUS__STATUS_OK &&
			    in->chan_reply->reply->msg_held, 1, "descriptor: %d",
		    (int)in->chan_reply->reply->status);
	tpw_peer_msg_free(in);
	o.take_held = true;
	TPT_REQUIRE(peer_chan(&c, &o, 3, NULL, 0) == 0, 1, "take");
	st = peer_reply(&c, &req, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_TOO_BIG && req == 3, 1,
		    "a 300 KiB take by a daemon of 256 KiB frames: status %d", st);
	o = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_RELEASE;
	o.chan_id = id;
	TPT_REQUIRE(peer_chan(&c, &o, 4, NULL, 0) == 0, 1, "release");
	st = peer_reply(&c, &req, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && req == 4, 1, "release: %d", st);
	tpt_raw_close(&data);
	tpt_raw_close(&c);
	return 0;
}

START_TEST(test_small_frames_peer_takes_within_them)
{
	static const char *const args[] = { "--peer-insecure", NULL };
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = -1 };
	struct tp_payload pl = { .length = 300u << 10 };
	struct tp_message msg = { .payloads = &pl, .n_payloads = 1 };
	struct tp_descriptor *d = NULL;
	struct tp_context *ctx;
	struct tp_chan *ch;
	uint8_t *buf = malloc(pl.length), *got = malloc(pl.length);

	ck_assert(buf && got);
	for (size_t i = 0; i < pl.length; i++)
		buf[i] = (uint8_t)(i * 7 + 1);
	pl.data = buf;
	ck_assert_int_eq(tpt_daemon_start_peer(&host, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&host, 0, "host", &ctx), 0);
	o.flags = TP_CHAN_CREATE;
	o.remote = TP_REMOTE_ANY_PEER;
	ck_assert_int_eq(tp_chan_open(ctx, "hosted", &o, &ch), 0);
	ck_assert_int_eq(tp_chan_write_msgs(ch, &msg, 1, 0), 0);
	ck_assert(tpt_wait_ok(tpt_fork(small_frames_peer, NULL), 4 * T_MS, "small-frames peer"));
	ck_assert(tpt_daemon_alive(&host));
	/* the item is back, whole (the peer's release was answered: the link was up) */
	ck_assert_msg(tp_chan_read_descriptor(ch, &d, 5000) == 0, "%s", tp_last_error());
	ck_assert_uint_eq(d->payloads[0].length, pl.length);
	struct tp_slot slot = { .data = got };
	struct tp_allocation al = { .payloads = &slot, .n_payloads = 1 };

	ck_assert_msg(tp_chan_read_msg(ch, d, &al) == 0, "%s", tp_last_error());
	ck_assert_int_eq(memcmp(buf, got, pl.length), 0);
	tp_chan_release(ch);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&host), 0);
	free(buf);
	free(got);
}
END_TEST

static bool chan_waiting(unsigned n)
{
	char want[64], *out = tpt_ctl(&host, "channels", true);
	bool ok;

	snprintf(want, sizeof(want), "\"readers_waiting\": %u", n);
	ok = strstr(out, want) != NULL;
	free(out);
	return ok;
}

START_TEST(test_hostile_peer_fails_its_link_only)
{
	static const char *const args[] = { "--peer-insecure", "--chan-peer-ops-max", "3", NULL };
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = -1 };
	const char item[] = "kept";
	struct iovec iov = { .iov_base = (void *)item, .iov_len = 4 };
	struct tp_context *ctx;
	struct tp_chan *ch;
	void *got;
	size_t len;
	pid_t pid;
	int i;

	ck_assert_int_eq(tpt_sync_init(&go), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&host, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&host, 0, "host", &ctx), 0);
	o.flags = TP_CHAN_CREATE;
	o.remote = TP_REMOTE_ANY_PEER;
	ck_assert_int_eq(tp_chan_open(ctx, "hosted", &o, &ch), 0);
	ck_assert_int_eq(tp_chan_write(ch, &iov, 1, 0), 0);
	ck_assert_int_eq(tp_chan_read(ch, &got, &len, 0), 0); /* empty again */
	free(got);
	pid = tpt_fork(hostile_peer, NULL);
	ck_assert_int_gt(pid, 0);
	for (i = 0; i < 200 && !chan_waiting(OPS_MAX); i++)
		usleep(50000); /* polling what tpipctl shows, not a synchronisation */
	ck_assert_msg(chan_waiting(OPS_MAX), "the hostile peer's reads do not wait");
	ck_assert_int_eq(tpt_sync_post(&go, 1), 0);
	ck_assert(tpt_wait_ok(pid, 4 * T_MS, "hostile peer"));
	ck_assert(tpt_daemon_alive(&host));
	for (i = 0; i < 200 && !chan_waiting(0); i++)
		usleep(50000);
	ck_assert_msg(chan_waiting(0), "the failed link's reads still wait");
	ck_assert_int_eq(tp_chan_write(ch, &iov, 1, 0), 0); /* the channel is untouched */
	ck_assert_int_eq(tp_chan_read(ch, &got, &len, 1000), 0);
	ck_assert_uint_eq(len, 4);
	free(got);
	tp_chan_release(ch);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&host), 0);
	tpt_sync_done(&go);
}
END_TEST

/* Sends a read of handle @id on @c that waits (for ever), as request @req. */
static int peer_read_waits(struct tpt_raw *c, uint64_t id, uint64_t req)
{
	Tpw__V1__ChanOp rd = TPW__V1__CHAN_OP__INIT;

	rd.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	rd.chan_id = id;
	rd.timeout_ms = UINT32_MAX;
	return peer_chan(c, &rd, req, NULL, 0);
}

/* Opens "hosted" over two links from one address: OPS_MAX - 1 reads wait over the first, one
 * more over the second (OPS_MAX in all), and the next over the second is refused. */
static int two_link_peer(void *arg)
{
	struct tpt_raw c[2] = { { .fd = -1 }, { .fd = -1 } };
	struct tpt_raw data[2] = { { .fd = -1 }, { .fd = -1 } };
	Tpw__V1__ChanOp once = TPW__V1__CHAN_OP__INIT;
	uint64_t id[2], req = 0;
	int st;

	(void)arg;
	for (int i = 0; i < 2; i++) {
		Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;

		TPT_REQUIRE(peer_dial(&c[i], &data[i]) == 0, 1, "dial %d", i);
		o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
		o.name = "hosted";
		TPT_REQUIRE(peer_chan(&c[i], &o, 1, NULL, 0) == 0, 1, "open");
		st = peer_reply(&c[i], &req, &id[i]);
		TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && req == 1 && id[i], 1, "open: %d",
			    st);
	}
	for (uint64_t i = 0; i < OPS_MAX - 1; i++)
		TPT_REQUIRE(peer_read_waits(&c[0], id[0], 10 + i) == 0, 1, "read");
	/* a try-once read answered over the first link: its waiting reads are in */
	once.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	once.chan_id = id[0];
	TPT_REQUIRE(peer_chan(&c[0], &once, 20, NULL, 0) == 0, 1, "try-once read");
	st = peer_reply(&c[0], &req, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_TIMEOUT && req == 20, 1, "try-once read: %d", st);
	TPT_REQUIRE(peer_read_waits(&c[1], id[1], 10) == 0, 1, "read");
	TPT_REQUIRE(peer_read_waits(&c[1], id[1], 11) == 0, 1, "read");
	st = peer_reply(&c[1], &req, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_LIMIT && req == 11, 1,
		    "the peer's read above chan-peer-ops-max over its second link: status %d for "
		    "req %llu", st, (unsigned long long)req);
	TPT_REQUIRE(tpt_sync_wait(&go, T_MS) == 1, 1, "parent");
	for (int i = 0; i < 2; i++) {
		tpt_raw_close(&data[i]);
		tpt_raw_close(&c[i]);
	}
	return 0;
}

/*
 * chan-peer-ops-max counts per peer, not per link: a peer that opens a second link from the
 * same address gets no more waiting reads (3 wait over its two links, the 4th is refused; each
 * link alone would have taken 3).
 */
START_TEST(test_two_links_of_one_peer_share_its_ops_limit)
{
	static const char *const args[] = { "--peer-insecure", "--chan-peer-ops-max", "3", NULL };
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = -1 };
	struct tp_context *ctx;
	struct tp_chan *ch;
	pid_t pid;
	int i;

	ck_assert_int_eq(tpt_sync_init(&go), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&host, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&host, 0, "host", &ctx), 0);
	o.flags = TP_CHAN_CREATE;
	o.remote = TP_REMOTE_ANY_PEER;
	ck_assert_int_eq(tp_chan_open(ctx, "hosted", &o, &ch), 0);
	pid = tpt_fork(two_link_peer, NULL);
	ck_assert_int_gt(pid, 0);
	for (i = 0; i < 200 && !chan_waiting(OPS_MAX); i++)
		usleep(50000); /* polling what tpipctl shows, not a synchronisation */
	ck_assert_msg(chan_waiting(OPS_MAX), "the peer's reads do not wait");
	ck_assert_int_eq(tpt_sync_post(&go, 1), 0);
	ck_assert(tpt_wait_ok(pid, 4 * T_MS, "two-link peer"));
	ck_assert(tpt_daemon_alive(&host));
	tp_chan_release(ch);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&host), 0);
	tpt_sync_done(&go);
}
END_TEST

/* ---- a hostile peer daemon and work queues ------------------------------------------------- */

static int peer_wq(struct tpt_raw *r, Tpw__V1__WqOp *op, uint64_t req_id, const void *tail,
		   uint32_t len)
{
	Tpw__V1__PeerWqOp po = TPW__V1__PEER_WQ_OP__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	op->req_id = req_id;
	po.op = op;
	m.body_case = TPW__V1__PEER_MSG__BODY_WQ_OP;
	m.wq_op = &po;
	return peer_send(r, &m, tail, len);
}

/* The next PeerWqReply (others skipped), answering @req: returned owned (free with
 * tpw_peer_msg_free()), or NULL. */
static Tpw__V1__PeerMsg *peer_wq_reply(struct tpt_raw *r, uint64_t req)
{
	Tpw__V1__PeerMsg *m = NULL;

	for (;;) {
		if (tpt_raw_recv_peer(r, T_MS, &m) < 0)
			return NULL;
		if (m->body_case == TPW__V1__PEER_MSG__BODY_WQ_REPLY &&
		    m->wq_reply->reply->req_id == req)
			return m;
		tpw_peer_msg_free(m);
	}
}

/* Sends @op as request @req and returns the answer's status (-1: none), its handle in
 * *@ret_id, its question id in *@ret_q, whether it says owner in *@ret_owner. */
static int wq_call(struct tpt_raw *c, Tpw__V1__WqOp *op, uint64_t req, const char *tail,
		   uint64_t *ret_id, uint64_t *ret_q, bool *ret_owner)
{
	Tpw__V1__PeerMsg *m;
	int st;

	if (peer_wq(c, op, req, tail, tail ? (uint32_t)strlen(tail) : 0) < 0)
		return -1;
	m = peer_wq_reply(c, req);
	if (!m)
		return -1;
	st = m->wq_reply->reply->status;
	if (ret_id)
		*ret_id = m->wq_reply->reply->wq_id;
	if (ret_q)
		*ret_q = m->wq_reply->reply->question_id;
	if (ret_owner)
		*ret_owner = m->wq_reply->reply->owner;
	tpw_peer_msg_free(m);
	return st;
}

/* One chunk of transfer @xfer_id (nobody posted it) on the data connection: 64 bytes. */
static int stray_chunk(struct tpt_raw *data, uint64_t xfer_id)
{
	return tpt_raw_send_chunk(data, xfer_id, 0, 64, 0x5a);
}

static int hostile_wq_peer(void *arg)
{
	Tpw__V1__PeerXferEnd xe = TPW__V1__PEER_XFER_END__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT, *in = NULL;
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	char *peers[] = { "psk" };
	uint64_t id = 0, q = 0, got = 0;
	bool owner = true;
	int st;

	(void)arg;
	TPT_REQUIRE(peer_dial(&c, &data) == 0, 1, "dial");
	/* Creation: never over an insecure link, chan-remote-create-uid or not. */
	Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;

	op.op = TPW__V1__WQ_OP_KIND__WQ_OP_OPEN;
	op.name = "made";
	op.create = true;
	st = wq_call(&c, &op, 1, NULL, &id, NULL, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_NOT_FOUND, 1, "create over an insecure link: %d",
		    st);
	/* A create of an existing queue opens it as a worker: never its owner. */
	op.name = "hq";
	op.owner_set = true;
	op.owner_uid = 0;
	st = wq_call(&c, &op, 2, NULL, &id, NULL, &owner);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && id && !owner, 1, "open hq: %d owner %d",
		    st, owner);
	Tpw__V1__WqOp sub = TPW__V1__WQ_OP__INIT;

	sub.op = TPW__V1__WQ_OP_KIND__WQ_OP_SUBMIT;
	sub.wq_id = id;
	st = wq_call(&c, &sub, 3, "forged", NULL, NULL, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_PERMISSION, 1, "a worker's submit: %d", st);
	Tpw__V1__WqOp take = TPW__V1__WQ_OP__INIT;

	take.op = TPW__V1__WQ_OP_KIND__WQ_OP_TAKE;
	take.wq_id = id;
	st = wq_call(&c, &take, 4, NULL, NULL, &q, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && q, 1, "take: %d", st);
	/* Bytes for a transfer nobody asked for, and its end: dropped, the link stays. */
	TPT_REQUIRE(stray_chunk(&data, 99) == 0, 1, "stray chunk");
	xe.xfer_id = 99;
	xe.status = TPW__V1__STATUS__STATUS_OK;
	xe.bytes = 64;
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_XFER_END;
	m.chan_xfer_end = &xe;
	TPT_REQUIRE(peer_send(&c, &m, NULL, 0) == 0, 1, "stray xfer end");
	Tpw__V1__WqOp rep = TPW__V1__WQ_OP__INIT;

	rep.op = TPW__V1__WQ_OP_KIND__WQ_OP_REPLY;
	rep.wq_id = id;
	rep.question_id = q + 5; /* never taken */
	st = wq_call(&c, &rep, 5, "lie", NULL, NULL, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_NOT_FOUND, 1, "a reply to %llu: %d",
		    (unsigned long long)rep.question_id, st);
	rep.question_id = q;
	st = wq_call(&c, &rep, 6, "ans", NULL, &got, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK, 1, "the reply: %d", st);
	/* Remote peers on an open that creates nothing: a protocol violation, the link fails. */
	op.create = false;
	op.remote = TPW__V1__REMOTE_ACCESS__REMOTE_PEERS; /* valid as a creation's */
	op.n_remote_peers = 1;
	op.remote_peers = peers;
	TPT_REQUIRE(peer_wq(&c, &op, 7, NULL, 0) == 0, 1, "open with remote peers");
	for (;;) {
		st = tpt_raw_recv_peer(&c, T_MS, &in);
		if (st < 0)
			break;
		TPT_REQUIRE(in->body_case == TPW__V1__PEER_MSG__BODY_PING, 1,
			    "message %d after a violation", (int)in->body_case);
		tpw_peer_msg_free(in);
	}
	TPT_REQUIRE(st == -ECONNRESET, 1, "the link stayed: %d", st);
	tpt_raw_close(&data);
	tpt_raw_close(&c);
	return 0;
}

/* A hostile peer daemon (a raw dialler over an insecure link) and a work queue hq of root that
 * admits any peer, on a daemon whose chan-remote-create-uid is set: it creates no queue (never
 * over an insecure link), is no owner for a create of hq (a worker's handle), may not submit,
 * takes the question, sends bytes and an end for a transfer nobody asked for (dropped, the link
 * up), replies to an id it never took (-ENOENT) and to its own (the owner gets its bytes
 * intact), and fails its link with remote peers on a plain open; hq is untouched. */
START_TEST(test_hostile_peer_cannot_own_or_stream_into_a_queue)
{
	static const char *const args[] = { "--peer-insecure", "--chan-remote-create-uid", "4242",
					    NULL };
	struct tp_wq_options o = { .size = sizeof(o), .flags = TP_WQ_CREATE, .owner_uid = -1,
				   .remote = TP_REMOTE_ANY_PEER };
	struct tp_wq_options wo = { .size = sizeof(wo), .owner_uid = -1 };
	struct tp_context *ctx;
	struct tp_wq *own, *w;
	uint64_t q, a;
	void *got;
	size_t len;
	char *out;
	pid_t pid;

	ck_assert_int_eq(tpt_daemon_start_peer(&host, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&host, 0, "host", &ctx), 0);
	ck_assert_int_eq(tp_wq_open(ctx, "hq", &o, &own), 0);
	ck_assert_int_eq(tp_wq_submit(own, "abc", 3, &q), 0);
	pid = tpt_fork(hostile_wq_peer, NULL);
	ck_assert_int_gt(pid, 0);
	ck_assert(tpt_wait_ok(pid, 4 * T_MS, "hostile peer"));
	ck_assert(tpt_daemon_alive(&host));
	ck_assert_int_eq(tp_wq_answer(own, &a, &got, &len, T_MS), 0);
	ck_assert(a == q && len == 3 && memcmp(got, "ans", 3) == 0);
	free(got);
	out = tpt_ctl(&host, "queues", true);
	ck_assert_msg(!strstr(out, "\"made\""), "%s", out);
	free(out);
	ck_assert_int_eq(tp_wq_submit(own, "def", 3, &q), 0); /* hq goes on */
	ck_assert_int_eq(tp_wq_open(ctx, "hq", &wo, &w), 0);
	ck_assert_int_eq(tp_wq_take(w, &a, &got, &len, T_MS), 0);
	ck_assert(a == q && len == 3 && memcmp(got, "def", 3) == 0);
	free(got);
	tp_wq_release(w);
	tp_wq_release(own);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&host), 0);
}
END_TEST

/* ---- a hostile hosting daemon -------------------------------------------------------------- */

struct fake_host {
	int lfd;
	unsigned minor;
};

static int loopback_listen(int *ret_port)
{
	struct sockaddr_in sin = { .sin_family = AF_INET,
				   .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sin);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	ck_assert_int_eq(listen(fd, 8), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sin, &sl), 0);
	*ret_port = ntohs(sin.sin_port);
	return fd;
}

/* The next message of @r other than a ping (answered), or NULL on an error. */
static Tpw__V1__PeerMsg *recv_no_ping(struct tpt_raw *r)
{
	Tpw__V1__PeerMsg *m = NULL;

	for (;;) {
		if (tpt_raw_recv_peer(r, T_MS, &m) < 0)
			return NULL;
		if (m->body_case != TPW__V1__PEER_MSG__BODY_PING)
			return m;
		if (!m->ping->reply) {
			Tpw__V1__PeerPing pong = TPW__V1__PEER_PING__INIT;
			Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;

			pong.t_ns = m->ping->t_ns;
			pong.reply = true;
			pm.body_case = TPW__V1__PEER_MSG__BODY_PING;
			pm.ping = &pong;
			tpt_raw_send_peer(r, &pm);
		}
		tpw_peer_msg_free(m);
	}
}

/* Answers the dial of the daemon on @fh->lfd up to the link being up (control in @c). */
static int fake_accept(const struct fake_host *fh, struct tpt_raw *c, struct tpt_raw *data)
{
	Tpw__V1__PeerHello h = TPW__V1__PEER_HELLO__INIT;
	Tpw__V1__PeerReady rd = TPW__V1__PEER_READY__INIT;
	Tpw__V1__PeerDataHello dh = TPW__V1__PEER_DATA_HELLO__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT, *in;
	uint8_t boot[16];

	for (unsigned i = 0; i < 16; i++)
		boot[i] = (uint8_t)(0xb0 + i);
	c->fd = accept4(fh->lfd, NULL, NULL, SOCK_CLOEXEC);
	TPT_REQUIRE(c->fd >= 0, -1, "accept");
	in = recv_no_ping(c);
	TPT_REQUIRE(in && in->body_case == TPW__V1__PEER_MSG__BODY_HELLO, -1, "no hello");
	tpw_peer_msg_free(in);
	h.major = TPW_PEER_PROTO_MAJOR;
	h.minor = fh->minor;
	h.host = "fakehost";
	h.boot_id.data = boot;
	h.boot_id.len = 16;
	h.instance = 0xfa6e;
	h.data_conns = 1;
	m.body_case = TPW__V1__PEER_MSG__BODY_HELLO;
	m.hello = &h;
	TPT_REQUIRE(tpt_raw_send_peer(c, &m) == 0, -1, "hello");
	rd.link_id = 77;
	m.body_case = TPW__V1__PEER_MSG__BODY_READY;
	m.ready = &rd;
	TPT_REQUIRE(tpt_raw_send_peer(c, &m) == 0, -1, "ready");
	data->fd = accept4(fh->lfd, NULL, NULL, SOCK_CLOEXEC);
	TPT_REQUIRE(data->fd >= 0, -1, "accept data");
	TPT_REQUIRE(tpt_raw_recv_peer(data, T_MS, &in) == 0 &&
			    in->body_case == TPW__V1__PEER_MSG__BODY_DATA_HELLO, -1, "data hello");
	tpw_peer_msg_free(in);
	dh.link_id = 77;
	m.body_case = TPW__V1__PEER_MSG__BODY_DATA_HELLO;
	m.data_hello = &dh;
	TPT_REQUIRE(tpt_raw_send_peer(data, &m) == 0, -1, "data hello back");
	rd.data_up = true;
	m.body_case = TPW__V1__PEER_MSG__BODY_READY;
	m.ready = &rd;
	TPT_REQUIRE(tpt_raw_send_peer(c, &m) == 0, -1, "ready, data up");
	return 0;
}

/* Receives the next PeerChanOp (its kind must be @want). Return: its req_id, 0 on an error. */
static uint64_t fake_op(struct tpt_raw *c, Tpw__V1__ChanOpKind want)
{
	Tpw__V1__PeerMsg *in = recv_no_ping(c);
	uint64_t req = 0;

	if (in && in->body_case == TPW__V1__PEER_MSG__BODY_CHAN_OP && in->chan_op->op->op == want)
		req = in->chan_op->op->req_id;
	else
		fprintf(stderr, "fake host: expected op %d, got message %d\n", (int)want,
			in ? (int)in->body_case : -1);
	tpw_peer_msg_free(in);
	return req;
}

/* Answers @req with the items @lens[0..@n) of @tail (their lengths as claimed). */
static int fake_batch(struct tpt_raw *c, uint64_t req, uint64_t *lens, size_t n, const char *tail)
{
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	Tpw__V1__PeerChanReply pr = TPW__V1__PEER_CHAN_REPLY__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	r.req_id = req;
	r.status = TPW__V1__STATUS__STATUS_OK;
	r.chan_id = 5;
	r.n_lengths = n;
	r.lengths = lens;
	pr.reply = &r;
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_REPLY;
	m.chan_reply = &pr;
	return peer_send(c, &m, tail, (uint32_t)strlen(tail));
}

/* Answers @req with the item @tail and fields for this host's clients alone: its staging lent,
 * and more released buffers than a client's answer may carry. */
static int fake_reply_lent(struct tpt_raw *c, uint64_t req, const char *tail)
{
	static uint64_t released[TPW_CHAN_RELEASED_MAX + 1];
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	Tpw__V1__PeerChanReply pr = TPW__V1__PEER_CHAN_REPLY__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	uint64_t len = strlen(tail);

	for (size_t i = 0; i < TPU_ARRAY_SIZE(released); i++)
		released[i] = i + 1;
	r.req_id = req;
	r.status = TPW__V1__STATUS__STATUS_OK;
	r.chan_id = 5;
	r.n_lengths = 1;
	r.lengths = &len;
	r.lent = true;
	r.n_released = TPU_ARRAY_SIZE(released);
	r.released = released;
	pr.reply = &r;
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_REPLY;
	m.chan_reply = &pr;
	return peer_send(c, &m, tail, (uint32_t)len);
}

static int fake_reply(struct tpt_raw *c, uint64_t req, const char *item, uint64_t claimed)
{
	return fake_batch(c, req, &claimed, item ? 1 : 0, item ? item : "");
}

/* Answers the next PeerWqOp, which must be of kind @want, with STATUS_OK and handle 5. */
static int fake_wq_answer(struct tpt_raw *c, Tpw__V1__WqOpKind want)
{
	Tpw__V1__PeerMsg *in = recv_no_ping(c);
	Tpw__V1__WqReply r = TPW__V1__WQ_REPLY__INIT;
	Tpw__V1__PeerWqReply pr = TPW__V1__PEER_WQ_REPLY__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	if (!in || in->body_case != TPW__V1__PEER_MSG__BODY_WQ_OP || in->wq_op->op->op != want) {
		fprintf(stderr, "fake host: expected work queue op %d, got message %d\n",
			(int)want, in ? (int)in->body_case : -1);
		tpw_peer_msg_free(in);
		return -1;
	}
	r.req_id = in->wq_op->op->req_id;
	tpw_peer_msg_free(in);
	r.status = TPW__V1__STATUS__STATUS_OK;
	r.wq_id = 5;
	pr.reply = &r;
	m.body_case = TPW__V1__PEER_MSG__BODY_WQ_REPLY;
	m.wq_reply = &pr;
	return peer_send(c, &m, NULL, 0);
}

static int fake_host_run(void *arg)
{
	const struct fake_host *fh = arg;
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	Tpw__V1__PeerPing ping = TPW__V1__PEER_PING__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT, *in;
	uint64_t open, rd, cl;

	TPT_REQUIRE(fake_accept(fh, &c, &data) == 0, 1, "handshake");
	/* a worker's open, then its release only */
	if (fh->minor == TPW_PEER_MINOR_WQ_MSG - 1 || fh->minor == TPW_PEER_MINOR_WQ_STREAM - 1) {
		TPT_REQUIRE(fake_wq_answer(&c, TPW__V1__WQ_OP_KIND__WQ_OP_OPEN) == 0, 1, "open");
		TPT_REQUIRE(fake_wq_answer(&c, TPW__V1__WQ_OP_KIND__WQ_OP_RELEASE) == 0, 1,
			    "a message op reached a 2.%u daemon", fh->minor);
	}
	if (fh->minor < TPW_PEER_MINOR_CHAN || fh->minor == TPW_PEER_MINOR_WQ_CREATE - 1 ||
	    fh->minor == TPW_PEER_MINOR_WQ_MSG - 1 || fh->minor == TPW_PEER_MINOR_WQ_STREAM - 1) {
		/* The client was refused; a ping answered next proves nothing came before it. */
		TPT_REQUIRE(tpt_sync_wait(&go, T_MS) == 1, 1, "parent");
		ping.t_ns = 1;
		m.body_case = TPW__V1__PEER_MSG__BODY_PING;
		m.ping = &ping;
		TPT_REQUIRE(tpt_raw_send_peer(&c, &m) == 0, 1, "ping");
		TPT_REQUIRE(tpt_raw_recv_peer(&c, T_MS, &in) == 0, 1, "pong");
		TPT_REQUIRE(in->body_case == TPW__V1__PEER_MSG__BODY_PING && in->ping->reply &&
				    in->ping->t_ns == 1, 1, "message %d to a 2.%u daemon",
			    (int)in->body_case, fh->minor);
		tpw_peer_msg_free(in);
		TPT_REQUIRE(tpt_sync_wait(&go, T_MS) == 2, 1, "parent, done");
		return 0;
	}
	open = fake_op(&c, TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN);
	TPT_REQUIRE(open && fake_reply(&c, open, NULL, 0) == 0, 1, "open");
	rd = fake_op(&c, TPW__V1__CHAN_OP_KIND__CHAN_OP_READ);
	TPT_REQUIRE(rd && fake_reply(&c, rd, NULL, 0) == 0, 1, "a read without its item");
	cl = fake_op(&c, TPW__V1__CHAN_OP_KIND__CHAN_OP_CLOSE);
	TPT_REQUIRE(cl, 1, "close");
	TPT_REQUIRE(fake_reply(&c, cl + 1000, "none", 4) == 0, 1, "an answer to nothing");
	TPT_REQUIRE(fake_reply(&c, open, NULL, 0) == 0, 1, "the open answered again");
	TPT_REQUIRE(fake_reply(&c, cl, "junk", 4) == 0, 1, "a close answered with an item");
	rd = fake_op(&c, TPW__V1__CHAN_OP_KIND__CHAN_OP_READ);
	TPT_REQUIRE(rd && fake_reply(&c, rd, "good", 4) == 0, 1, "an item");
	rd = fake_op(&c, TPW__V1__CHAN_OP_KIND__CHAN_OP_READ);
	TPT_REQUIRE(rd && fake_reply(&c, rd, "bad", 9) == 0, 1, "a violation");
	TPT_REQUIRE(tpt_sync_wait(&go, T_MS) == 2, 1, "parent, done");
	tpt_raw_close(&data);
	tpt_raw_close(&c);
	return 0;
}

/* Starts the daemon (a peer of the fake host: insecure, one data connection) and forks the fake
 * host, which runs @run with @fh; *@ctx a client of the daemon, @a the address of the fake
 * host's channel "x". Return: the fake host's pid. */
static pid_t fake_host_start(struct fake_host *fh, tpt_child_fn run, struct tp_context **ctx,
			     char *a, size_t al)
{
	static const char *const args[] = { "--peer-insecure", "--peer-data-conns", "1", NULL };
	pid_t pid;
	int port;

	ck_assert_int_eq(tpt_sync_init(&go), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&host, args), 0);
	fh->lfd = loopback_listen(&port);
	pid = tpt_fork(run, fh);
	ck_assert_int_gt(pid, 0);
	ck_assert_int_eq(tpt_ctx_new(&host, 0, "client", ctx), 0);
	snprintf(a, al, "tpip://127.0.0.1:%d/x", port);
	return pid;
}

/* Tells the fake host @pid to finish; it must have passed, and the daemon must be up still. */
static void fake_host_stop(struct fake_host *fh, pid_t pid, struct tp_context *ctx)
{
	ck_assert_int_eq(tpt_sync_post(&go, 2), 0);
	ck_assert(tpt_wait_ok(pid, 4 * T_MS, "fake host"));
	ck_assert(tpt_daemon_alive(&host));
	close(fh->lfd);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&host), 0);
	tpt_sync_done(&go);
}

/* _i 0: the far daemon speaks peer protocol 2.2; 1: 2.3, and lies; 2: the minor before work
 * queues created from other hosts, asked to create one (which it would open as a worker's
 * instead); 3: the minor before work queue messages, asked for them by a worker (it would take
 * them for byte ops); 4: the minor before work queue messages by reference, sent a message
 * above the inline limit (it would take the op without its bytes). */
START_TEST(test_hostile_host_fails_its_link_only)
{
	static const unsigned minors[] = { TPW_PEER_MINOR_CHAN - 1, TPW_PEER_MINOR_CHAN,
					   TPW_PEER_MINOR_WQ_CREATE - 1, TPW_PEER_MINOR_WQ_MSG - 1,
					   TPW_PEER_MINOR_WQ_STREAM - 1 };
	struct fake_host fh = { .minor = minors[_i] };
	struct tp_wq_options wo = { .size = sizeof(wo), .flags = TP_WQ_CREATE, .owner_uid = -1 };
	struct tp_wq *wq = NULL;
	struct tp_context *ctx;
	struct tpt_link link;
	struct tp_chan *ch;
	char a[128];
	void *got;
	size_t len;
	pid_t pid = fake_host_start(&fh, fake_host_run, &ctx, a, sizeof(a));

	if (_i == 4) {
		struct tpt_msg_spec big = { .pipe = 7, .n_payloads = 1,
					    .lens = { (1u << 20) + 1 } };
		struct tpt_msg m;
		char want[80];
		uint64_t id;

		ck_assert_int_eq(tp_wq_open(ctx, a, NULL, &wq), 0);
		snprintf(want, sizeof(want), "peer protocol 2.%u: messages cross hosts inline",
			 TPW_PEER_MINOR_WQ_STREAM - 1);
		for (int k = 0; k < 2; k++) { /* from a shared buffer, then from private memory */
			ck_assert_int_eq(tpt_msg_build(ctx, &big, k ? TPT_MEM_PRIVATE : TPT_MEM_SHM,
						       &m), 0);
			ck_assert_int_eq(tp_wq_submit_msg(wq, &m.m, &id), -EMSGSIZE);
			ck_assert_msg(strstr(tp_last_error(), want), "%s", tp_last_error());
			ck_assert_int_eq(tp_wq_reply_msg(wq, 1, &m.m), -EMSGSIZE);
			ck_assert_msg(strstr(tp_last_error(), want), "%s", tp_last_error());
			tpt_msg_free(ctx, &m);
		}
		ck_assert_int_eq(tp_wq_release(wq), 0);
		ck_assert_msg(tpt_peer_links(&host, &link) == 1 && strcmp(link.state, "up") == 0,
			      "the link is %s: %s", link.state, link.last_error);
		ck_assert_int_eq(tpt_sync_post(&go, 1), 0);
	} else if (_i == 3) {
		struct tp_message msg = { 0 };
		struct tp_descriptor *d = NULL;
		char want[64];
		uint64_t id;

		ck_assert_int_eq(tp_wq_open(ctx, a, NULL, &wq), 0);
		snprintf(want, sizeof(want), "peer protocol 2.%u", TPW_PEER_MINOR_WQ_MSG - 1);
		ck_assert_int_eq(tp_wq_take_descriptor(wq, &id, &d, 0), -EOPNOTSUPP);
		ck_assert_msg(strstr(tp_last_error(), want), "%s", tp_last_error());
		ck_assert_int_eq(tp_wq_reply_msg(wq, 1, &msg), -EOPNOTSUPP);
		ck_assert_msg(strstr(tp_last_error(), want), "%s", tp_last_error());
		ck_assert_int_eq(tp_wq_release(wq), 0);
		ck_assert_msg(tpt_peer_links(&host, &link) == 1 && strcmp(link.state, "up") == 0,
			      "the link is %s: %s", link.state, link.last_error);
		ck_assert_int_eq(tpt_sync_post(&go, 1), 0);
	} else if (_i == 2) {
		ck_assert_int_eq(tp_wq_open(ctx, a, &wo, &wq), -EOPNOTSUPP);
		char want[64];

		snprintf(want, sizeof(want), "peer protocol 2.%u, which creates no work queue",
			 TPW_PEER_MINOR_WQ_CREATE - 1);
		ck_assert_msg(strstr(tp_last_error(), want), "%s", tp_last_error());
		ck_assert_msg(tpt_peer_links(&host, &link) == 1 && strcmp(link.state, "up") == 0,
			      "the link is %s: %s", link.state, link.last_error);
		ck_assert_int_eq(tpt_sync_post(&go, 1), 0);
	} else if (!_i) {
		ck_assert_int_eq(tp_chan_open(ctx, a, NULL, &ch), -EOPNOTSUPP);
		ck_assert_ptr_nonnull(strstr(tp_last_error(), "peer protocol 2.2"));
		/* the link to the old daemon is still up */
		ck_assert_msg(tpt_peer_links(&host, &link) == 1 && strcmp(link.state, "up") == 0,
			      "the link is %s: %s", link.state, link.last_error);
		ck_assert_int_eq(tpt_sync_post(&go, 1), 0);
	} else {
		ck_assert_int_eq(tp_chan_open(ctx, a, NULL, &ch), 0);
		ck_assert_int_eq(tp_chan_read(ch, &got, &len, 5000), -EINVAL);
		ck_assert_int_eq(tp_chan_close(ch), 0);
		ck_assert_int_eq(tp_chan_read(ch, &got, &len, 5000), 0);
		ck_assert_uint_eq(len, 4);
		ck_assert_int_eq(memcmp(got, "good", 4), 0);
		free(got);
		ck_assert_int_eq(tp_chan_read(ch, &got, &len, 5000), -ECONNRESET);
		ck_assert_ptr_nonnull(strstr(tp_last_error(), "channel host 127.0.0.1:"));
		tp_chan_release(ch);
	}
	fake_host_stop(&fh, pid, ctx);
}
END_TEST

/* The next READ forwarded to the fake host: its req_id (0 on an error) and max_items. */
static uint64_t fake_read(struct tpt_raw *c, uint32_t *ret_max)
{
	Tpw__V1__PeerMsg *in = recv_no_ping(c);
	uint64_t req = 0;

	if (in && in->body_case == TPW__V1__PEER_MSG__BODY_CHAN_OP &&
	    in->chan_op->op->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_READ) {
		req = in->chan_op->op->req_id;
		*ret_max = in->chan_op->op->max_items;
	}
	tpw_peer_msg_free(in);
	return req;
}

/* A hosting daemon of @fh->minor answering batch reads of 3 items: before peer minor 10 it is
 * asked for one item a read; from 10 for 3, and it answers 4 (more than asked), then 2, then 2
 * whose lengths miss the tail (a protocol violation). */
static int fake_batch_host_run(void *arg)
{
	const struct fake_host *fh = arg;
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	uint64_t open, rd, four[4] = { 1, 1, 1, 1 }, two[2] = { 2, 3 }, lie[2] = { 2, 9 };
	uint32_t max = 99;

	TPT_REQUIRE(fake_accept(fh, &c, &data) == 0, 1, "handshake");
	open = fake_op(&c, TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN);
	TPT_REQUIRE(open && fake_reply(&c, open, NULL, 0) == 0, 1, "open");
	rd = fake_read(&c, &max);
	if (fh->minor < TPW_PEER_MINOR_CHAN_BATCH) {
		TPT_REQUIRE(rd && max == 0, 1, "a 2.%u daemon asked for %u items", fh->minor, max);
		TPT_REQUIRE(fake_reply(&c, rd, "one", 3) == 0, 1, "one item");
	} else {
		TPT_REQUIRE(rd && max == 3, 1, "asked for %u items, not 3", max);
		TPT_REQUIRE(fake_batch(&c, rd, four, 4, "wxyz") == 0, 1, "four items");
		rd = fake_read(&c, &max);
		TPT_REQUIRE(rd && fake_batch(&c, rd, two, 2, "abcde") == 0, 1, "two items");
		rd = fake_read(&c, &max);
		TPT_REQUIRE(rd && fake_reply_lent(&c, rd, "xyz") == 0, 1, "an item lent");
		rd = fake_read(&c, &max);
		TPT_REQUIRE(rd && fake_batch(&c, rd, lie, 2, "abcde") == 0, 1, "a violation");
	}
	TPT_REQUIRE(tpt_sync_wait(&go, T_MS) == 2, 1, "parent, done");
	tpt_raw_close(&data);
	tpt_raw_close(&c);
	return 0;
}

/*
 * Batch reads against a hostile hosting daemon. _i 0: it speaks peer protocol 2.9, so the read
 * is forwarded for one item (a larger batch would have failed that daemon's check and the link).
 * 1: 2.10: an answer of more items than asked is refused to the client (-EINVAL) with the link
 * up; a batch of 2 arrives intact; an item whose answer says it is lent and releases 1025
 * buffers arrives intact without those fields (the client's library would end its context on
 * them); lengths that miss the tail fail the link, and the client's read with -ECONNRESET; the
 * daemon stays up.
 */
START_TEST(test_hostile_host_batch_reads)
{
	struct fake_host fh = { .minor = _i ? TPW_PEER_MINOR_CHAN_BATCH
					    : TPW_PEER_MINOR_CHAN_BATCH - 1 };
	struct tp_chan_item it[3];
	struct tp_context *ctx;
	struct tpt_link link;
	struct tp_chan *ch;
	size_t n = 0;
	char a[128];
	pid_t pid = fake_host_start(&fh, fake_batch_host_run, &ctx, a, sizeof(a));

	ck_assert_int_eq(tp_chan_open(ctx, a, NULL, &ch), 0);
	if (_i == 0) {
		ck_assert_msg(tp_chan_read_many(ch, it, 3, &n, 5000) == 0, "%s", tp_last_error());
		ck_assert(n == 1 && it[0].len == 3 && memcmp(it[0].data, "one", 3) == 0);
		free(it[0].data);
	} else {
		ck_assert_int_eq(tp_chan_read_many(ch, it, 3, &n, 5000), -EINVAL);
		ck_assert_msg(tpt_peer_links(&host, &link) == 1 && strcmp(link.state, "up") == 0,
			      "the link is %s: %s", link.state, link.last_error);
		ck_assert_msg(tp_chan_read_many(ch, it, 3, &n, 5000) == 0, "%s", tp_last_error());
		ck_assert(n == 2 && it[0].len == 2 && it[1].len == 3);
		ck_assert(memcmp(it[0].data, "ab", 2) == 0 && memcmp(it[1].data, "cde", 3) == 0);
		free(it[0].data);
		free(it[1].data);
		/* An answer saying the item's staging is lent, with 1025 buffers released: fields
		 * for this host's clients only, not passed on (the library refused the frame and
		 * ended the whole context). */
		ck_assert_msg(tp_chan_read_many(ch, it, 3, &n, 5000) == 0, "%s", tp_last_error());
		ck_assert(n == 1 && it[0].len == 3 && memcmp(it[0].data, "xyz", 3) == 0);
		free(it[0].data);
		ck_assert_int_eq(tp_chan_read_many(ch, it, 3, &n, 5000), -ECONNRESET);
	}
	tp_chan_release(ch);
	fake_host_stop(&fh, pid, ctx);
}
END_TEST

#define XBIG (2u << 20)

/* The next PeerWqOp (its kind must be @want) into @ret (owned: tpw_peer_msg_free()). Return: its
 * op, or NULL. */
static const Tpw__V1__WqOp *fake_wq_op(struct tpt_raw *c, Tpw__V1__WqOpKind want,
				       Tpw__V1__PeerMsg **ret)
{
	Tpw__V1__PeerMsg *in = recv_no_ping(c);

	while (in && in->body_case == TPW__V1__PEER_MSG__BODY_CHAN_XFER_END) { /* its lie's */
		tpw_peer_msg_free(in);
		in = recv_no_ping(c);
	}
	*ret = in;
	if (in && in->body_case == TPW__V1__PEER_MSG__BODY_WQ_OP && in->wq_op->op->op == want)
		return in->wq_op->op;
	fprintf(stderr, "fake host: expected work queue op %d, got message %d\n", (int)want,
		in ? (int)in->body_case : -1);
	return NULL;
}

/* Answers @req: @r as given (req_id, status and handle set here). */
static int fake_wq_send(struct tpt_raw *c, uint64_t req, Tpw__V1__WqReply *r)
{
	Tpw__V1__PeerWqReply pr = TPW__V1__PEER_WQ_REPLY__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	r->req_id = req;
	r->status = TPW__V1__STATUS__STATUS_OK;
	r->answer_status = TPW__V1__STATUS__STATUS_OK;
	r->wq_id = 5;
	pr.reply = r;
	m.body_case = TPW__V1__PEER_MSG__BODY_WQ_REPLY;
	m.wq_reply = &pr;
	return peer_send(c, &m, NULL, 0);
}

/* A take by descriptor: question 8, one payload of XBIG bytes. */
static int fake_wq_held(struct tpt_raw *c)
{
	Tpw__V1__WqReply r = TPW__V1__WQ_REPLY__INIT;
	Tpw__V1__Descriptor d = TPW__V1__DESCRIPTOR__INIT;
	Tpw__V1__PayloadDesc pd = TPW__V1__PAYLOAD_DESC__INIT, *pp = &pd;
	Tpw__V1__PeerMsg *in;
	const Tpw__V1__WqOp *o = fake_wq_op(c, TPW__V1__WQ_OP_KIND__WQ_OP_TAKE, &in);
	int e = -1;

	pd.length = XBIG;
	d.n_payloads = 1;
	d.payloads = &pp;
	r.question_id = 8;
	r.msg_held = true;
	r.msg_desc = &d;
	r.msg_len = XBIG;
	if (o && o->msg)
		e = fake_wq_send(c, o->req_id, &r);
	tpw_peer_msg_free(in);
	return e;
}

/* A message read (its transfer and room into @ret_xfer, @ret_room). Return: its req_id, or 0. */
static uint64_t fake_wq_read(struct tpt_raw *c, uint64_t *ret_xfer, uint64_t *ret_room)
{
	Tpw__V1__PeerMsg *in;
	const Tpw__V1__WqOp *o = fake_wq_op(c, TPW__V1__WQ_OP_KIND__WQ_OP_TAKE, &in);
	uint64_t req = o && o->msg_read && o->xfer_id && o->room == XBIG ? o->req_id : 0;

	if (req) {
		*ret_xfer = o->xfer_id;
		*ret_room = o->room;
	}
	tpw_peer_msg_free(in);
	return req;
}

/* A hosting daemon of peer minor 11 that lies about a message read: an admission for a read
 * (nothing to send), an item above the read's room, then half the item and its link gone. */
static int fake_wq_read_host_run(void *arg)
{
	const struct fake_host *fh = arg;
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	Tpw__V1__WqReply r = TPW__V1__WQ_REPLY__INIT;
	uint64_t req, xfer = 0, room = 0;

	TPT_REQUIRE(fake_accept(fh, &c, &data) == 0, 1, "handshake");
	TPT_REQUIRE(fake_wq_answer(&c, TPW__V1__WQ_OP_KIND__WQ_OP_OPEN) == 0, 1, "open");
	for (int k = 0; k < 3; k++) {
		TPT_REQUIRE(fake_wq_held(&c) == 0, 1, "take %d", k);
		req = fake_wq_read(&c, &xfer, &room);
		TPT_REQUIRE(req, 1, "read %d: no transfer of %u bytes of room", k, XBIG);
		r = (Tpw__V1__WqReply)TPW__V1__WQ_REPLY__INIT;
		if (k == 0) {
			r.xfer_id = 77; /* "send me the item": a read sends nothing */
		} else {
			r.msg_copied = true;
			r.question_id = 8;
			r.msg_len = k == 1 ? room + 1 : room;
		}
		if (k == 2)
			TPT_REQUIRE(tpt_raw_send_chunk(&data, xfer, 0, XBIG / 2, 0x5a) == 0, 1,
				    "half the item");
		TPT_REQUIRE(fake_wq_send(&c, req, &r) == 0, 1, "answer %d", k);
	}
	TPT_REQUIRE(tpt_sync_wait(&go, T_MS) == 1, 1, "parent");
	tpt_raw_close(&data); /* the link goes with half the item sent */
	tpt_raw_close(&c);
	TPT_REQUIRE(tpt_sync_wait(&go, T_MS) == 2, 1, "parent, done");
	return 0;
}

/* Message reads against a hostile hosting daemon of peer minor 11: an answer that asks a read
 * for bytes, or says it copied more than the read's room, fails that read (-EIO) with the
 * link up; half the item and a dropped link fail the read with -ECONNRESET naming the host. */
START_TEST(test_hostile_host_wq_reads)
{
	struct fake_host fh = { .minor = TPW_PEER_MINOR_WQ_STREAM };
	struct tp_slot slot = { .device = { .type = TP_DEVICE_CPU } };
	struct tp_allocation al = { .payloads = &slot, .n_payloads = 1 };
	struct tp_descriptor *d;
	struct tp_context *ctx;
	struct tpt_link link;
	struct tp_wq *wq;
	uint64_t id;
	char a[128];
	pid_t pid = fake_host_start(&fh, fake_wq_read_host_run, &ctx, a, sizeof(a));

	slot.data = malloc(XBIG);
	ck_assert_ptr_nonnull(slot.data);
	ck_assert_int_eq(tp_wq_open(ctx, a, NULL, &wq), 0);
	for (int k = 0; k < 2; k++) {
		ck_assert_msg(tp_wq_take_descriptor(wq, &id, &d, 5000) == 0, "%s",
			      tp_last_error());
		ck_assert_int_eq(tp_wq_read_msg(wq, d, &al), -EIO); /* EPROTO on the wire */
		ck_assert_msg(tpt_peer_links(&host, &link) == 1 && strcmp(link.state, "up") == 0,
			      "the link is %s: %s", link.state, link.last_error);
	}
	ck_assert_msg(strstr(tp_last_error(), "bytes for a read's room of 2097152"), "%s",
		      tp_last_error());
	ck_assert_msg(tp_wq_take_descriptor(wq, &id, &d, 5000) == 0, "%s", tp_last_error());
	ck_assert_int_eq(tpt_sync_post(&go, 1), 0);
	ck_assert_int_eq(tp_wq_read_msg(wq, d, &al), -ECONNRESET);
	ck_assert_msg(strstr(tp_last_error(), "work queue host 127.0.0.1:"), "%s",
		      tp_last_error());
	tp_wq_release(wq);
	free(slot.data);
	fake_host_stop(&fh, pid, ctx);
}
END_TEST

/* The next PeerWqOp other than a transfer's end, which must be of kind @want, answered OK. */
static int fake_wq_answer_skip(struct tpt_raw *c, Tpw__V1__WqOpKind want)
{
	Tpw__V1__PeerMsg *in;
	const Tpw__V1__WqOp *o = fake_wq_op(c, want, &in);
	Tpw__V1__WqReply r = TPW__V1__WQ_REPLY__INIT;
	int e = o ? fake_wq_send(c, o->req_id, &r) : -1;

	tpw_peer_msg_free(in);
	return e;
}

/* A hosting daemon that lies about two message reads, each of a worker of its own context
 * (opened, the question taken by descriptor, read, released): an admission for a read, then
 * an item above the read's room. The link stays up. */
static int fake_wq_stale_host_run(void *arg)
{
	const struct fake_host *fh = arg;
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	Tpw__V1__WqReply r;
	uint64_t req, xfer = 0, room = 0;

	TPT_REQUIRE(fake_accept(fh, &c, &data) == 0, 1, "handshake");
	for (int k = 0; k < 2; k++) {
		TPT_REQUIRE(fake_wq_answer_skip(&c, TPW__V1__WQ_OP_KIND__WQ_OP_OPEN) == 0, 1,
			    "open %d", k);
		TPT_REQUIRE(fake_wq_held(&c) == 0, 1, "take %d", k);
		req = fake_wq_read(&c, &xfer, &room);
		TPT_REQUIRE(req, 1, "read %d: no transfer of %u bytes of room", k, XBIG);
		r = (Tpw__V1__WqReply)TPW__V1__WQ_REPLY__INIT;
		if (k == 0) {
			r.xfer_id = 77;
		} else {
			r.msg_copied = true;
			r.question_id = 8;
			r.msg_len = room + 1;
		}
		TPT_REQUIRE(fake_wq_send(&c, req, &r) == 0, 1, "answer %d", k);
		TPT_REQUIRE(fake_wq_answer_skip(&c, TPW__V1__WQ_OP_KIND__WQ_OP_RELEASE) == 0, 1,
			    "release %d", k);
	}
	TPT_REQUIRE(tpt_sync_wait(&go, T_MS) == 2, 1, "parent, done");
	tpt_raw_close(&data);
	tpt_raw_close(&c);
	return 0;
}

/*
 * A read whose answer the daemon refuses (a far daemon's lie) ends the receive it had started
 * for the read's bytes: two workers, each of its own context, read a 2 MiB question against a
 * lying hosting daemon (-EIO each, the link up) and go; then the daemon maps no buffer of
 * theirs, though the link is still up. Before, each receive stayed registered until the link
 * failed, holding the worker's buffer (a mapping of a gone client, beyond its quota).
 */
START_TEST(test_hostile_host_refused_read_ends_its_receive)
{
	struct fake_host fh = { .minor = TPW_PEER_PROTO_MINOR };
	struct tp_context *ctx, *w;
	struct tpt_link link;
	int before, now = 0;
	char a[128];
	pid_t pid = fake_host_start(&fh, fake_wq_stale_host_run, &ctx, a, sizeof(a));

	before = tpt_daemon_memfd_maps(&host);
	ck_assert_int_ge(before, 0);
	for (int k = 0; k < 2; k++) {
		struct tp_slot slot = { .device = { .type = TP_DEVICE_CPU } };
		struct tp_allocation al = { .payloads = &slot, .n_payloads = 1 };
		struct tp_descriptor *d;
		struct tp_wq *wq;
		uint64_t id;

		ck_assert_int_eq(tpt_ctx_new(&host, 0, "worker", &w), 0);
		ck_assert_msg(tp_wq_open(w, a, NULL, &wq) == 0, "%s", tp_last_error());
		ck_assert_msg(tp_wq_take_descriptor(wq, &id, &d, 5000) == 0, "%s",
			      tp_last_error());
		slot.data = malloc(XBIG);
		ck_assert_ptr_nonnull(slot.data);
		ck_assert_int_eq(tp_wq_read_msg(wq, d, &al), -EIO);
		free(slot.data);
		tp_wq_release(wq);
		tp_context_free(w);
	}
	ck_assert_msg(tpt_peer_links(&host, &link) == 1 && strcmp(link.state, "up") == 0,
		      "the link is %s: %s", link.state, link.last_error);
	for (int i = 0; i < 100 && (now = tpt_daemon_memfd_maps(&host)) > before; i++)
		usleep(50 * 1000);
	ck_assert_msg(now <= before, "the daemon maps %d buffers of workers that are gone",
		      now - before);
	fake_host_stop(&fh, pid, ctx);
}
END_TEST

/* A hosting daemon that answers a channel read with a message taken and a held item's length
 * together (its validation lets both through; a client's refuses them). */
static int fake_taken_held_host_run(void *arg)
{
	const struct fake_host *fh = arg;
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	Tpw__V1__PeerChanReply pr = TPW__V1__PEER_CHAN_REPLY__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	uint64_t open, rd;
	uint32_t max = 0;

	TPT_REQUIRE(fake_accept(fh, &c, &data) == 0, 1, "handshake");
	open = fake_op(&c, TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN);
	TPT_REQUIRE(open && fake_reply(&c, open, NULL, 0) == 0, 1, "open");
	rd = fake_read(&c, &max);
	TPT_REQUIRE(rd, 1, "read");
	r.req_id = rd;
	r.status = TPW__V1__STATUS__STATUS_OK;
	r.chan_id = 5;
	r.msg_taken = true;
	r.held_len = 5;
	pr.reply = &r;
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_REPLY;
	m.chan_reply = &pr;
	TPT_REQUIRE(peer_send(&c, &m, NULL, 0) == 0, 1, "taken and held");
	TPT_REQUIRE(tpt_sync_wait(&go, T_MS) == 2, 1, "parent, done");
	tpt_raw_close(&data);
	tpt_raw_close(&c);
	return 0;
}

/* Whatever fields a far daemon's answer combines, the client's context survives: a read
 * answered with a message taken and a held length ends (no -ECONNRESET of the context), and a
 * local channel of the same context works after it. Before, the library refused the frame and
 * dropped its daemon connection: every pipe, channel and queue of the context failed. */
START_TEST(test_hostile_host_answer_cannot_end_the_context)
{
	struct fake_host fh = { .minor = TPW_PEER_PROTO_MINOR };
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *ctx;
	struct tp_chan *ch, *loc;
	struct iovec iov = { (void *)"hi", 2 };
	char a[128];
	void *got = NULL;
	size_t len;
	int r;
	pid_t pid = fake_host_start(&fh, fake_taken_held_host_run, &ctx, a, sizeof(a));

	ck_assert_int_eq(tp_chan_open(ctx, a, NULL, &ch), 0);
	ck_assert_int_eq(tp_chan_open(ctx, "local", &o, &loc), 0);
	r = tp_chan_read(ch, &got, &len, 5000);
	ck_assert_msg(r != -ECONNRESET && r != -ENOTCONN, "the context failed: %d %s", r,
		      tp_last_error());
	free(got);
	ck_assert_msg(tp_chan_write(loc, &iov, 1, 1000) == 0, "the context's local channel: %s",
		      tp_last_error());
	tp_chan_release(loc);
	tp_chan_release(ch);
	fake_host_stop(&fh, pid, ctx);
}
END_TEST

/* Answers @req (status OK, handle 5) with @r's other fields as set, @tail its data. */
static int fake_wq_send_tail(struct tpt_raw *c, uint64_t req, Tpw__V1__WqReply *r,
			     const char *tail)
{
	Tpw__V1__PeerWqReply pr = TPW__V1__PEER_WQ_REPLY__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	r->req_id = req;
	r->status = TPW__V1__STATUS__STATUS_OK;
	r->wq_id = 5;
	r->length = tail ? strlen(tail) : 0;
	pr.reply = r;
	m.body_case = TPW__V1__PEER_MSG__BODY_WQ_REPLY;
	m.wq_reply = &pr;
	return peer_send(c, &m, tail, (uint32_t)r->length);
}

/* Answers the next PeerWqOp, of kind @want (and not by descriptor), with fields of other ops'
 * answers: a descriptor held (question 8, 3 bytes), a worker's death (answer_status), nobody
 * waiting (idle) and ownership. */
static int fake_wq_stray_fields(struct tpt_raw *c, Tpw__V1__WqOpKind want)
{
	Tpw__V1__WqReply r = TPW__V1__WQ_REPLY__INIT;
	Tpw__V1__Descriptor d = TPW__V1__DESCRIPTOR__INIT;
	Tpw__V1__PayloadDesc pd = TPW__V1__PAYLOAD_DESC__INIT, *pp = &pd;
	Tpw__V1__PeerMsg *in;
	const Tpw__V1__WqOp *o = fake_wq_op(c, want, &in);
	int e = -1;

	pd.length = 3;
	d.n_payloads = 1;
	d.payloads = &pp;
	r.question_id = 8;
	r.msg_held = true;
	r.msg_desc = &d;
	r.msg_len = 3;
	r.answer_status = TPW__V1__STATUS__STATUS_PEER_DIED;
	r.idle = true;
	r.owner = true;
	if (o && !o->msg)
		e = fake_wq_send_tail(c, o->req_id, &r, NULL);
	tpw_peer_msg_free(in);
	return e;
}

/* A hosting daemon of peer minor 11 whose answers to a worker's open, take and reply carry
 * fields of other ops' answers; its second take's answer is a plain question. */
static int fake_wq_fields_host_run(void *arg)
{
	const struct fake_host *fh = arg;
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	Tpw__V1__WqReply r = TPW__V1__WQ_REPLY__INIT;
	Tpw__V1__PeerMsg *in;
	const Tpw__V1__WqOp *o;

	TPT_REQUIRE(fake_accept(fh, &c, &data) == 0, 1, "handshake");
	TPT_REQUIRE(fake_wq_stray_fields(&c, TPW__V1__WQ_OP_KIND__WQ_OP_OPEN) == 0, 1, "open");
	TPT_REQUIRE(fake_wq_stray_fields(&c, TPW__V1__WQ_OP_KIND__WQ_OP_TAKE) == 0, 1, "take");
	o = fake_wq_op(&c, TPW__V1__WQ_OP_KIND__WQ_OP_TAKE, &in);
	r.question_id = 9;
	r.answer_status = TPW__V1__STATUS__STATUS_OK;
	TPT_REQUIRE(o && !o->msg && fake_wq_send_tail(&c, o->req_id, &r, "abc") == 0, 1,
		    "a plain take");
	tpw_peer_msg_free(in);
	TPT_REQUIRE(fake_wq_stray_fields(&c, TPW__V1__WQ_OP_KIND__WQ_OP_REPLY) == 0, 1, "reply");
	TPT_REQUIRE(fake_wq_answer(&c, TPW__V1__WQ_OP_KIND__WQ_OP_RELEASE) == 0, 1, "release");
	TPT_REQUIRE(tpt_sync_wait(&go, T_MS) == 2, 1, "parent, done");
	tpt_raw_close(&data);
	tpt_raw_close(&c);
	return 0;
}

/* A worker's queue ops against a hosting daemon that answers them with fields of other ops'
 * answers (a descriptor held, a worker's death, nobody waiting, ownership): the open gives a
 * plain worker's handle; the take gets a clean error for that take only (-EPROTO, an answer
 * without a question: before, the client took a descriptor nobody freed and reported a
 * worker's death for a take); the next take gets its question byte-exact, the reply a plain
 * success; the link and the context stay up. */
START_TEST(test_hostile_host_wq_answer_fields)
{
	struct fake_host fh = { .minor = TPW_PEER_MINOR_WQ_STREAM };
	struct tp_context *ctx;
	struct tpt_link link;
	struct tp_wq *wq;
	uint64_t id = 0;
	size_t len = 0;
	void *got = NULL;
	char a[128];
	pid_t pid = fake_host_start(&fh, fake_wq_fields_host_run, &ctx, a, sizeof(a));

	ck_assert_msg(tp_wq_open(ctx, a, NULL, &wq) == 0, "%s", tp_last_error());
	ck_assert_int_eq(tp_wq_take(wq, &id, &got, &len, 5000), -EPROTO);
	ck_assert_msg(strstr(tp_last_error(), "an answer without a payload"), "%s",
		      tp_last_error());
	ck_assert_ptr_null(got);
	ck_assert_msg(tp_wq_take(wq, &id, &got, &len, 5000) == 0, "%s", tp_last_error());
	ck_assert(id == 9 && len == 3 && memcmp(got, "abc", 3) == 0);
	free(got);
	ck_assert_msg(tp_wq_reply(wq, 9, "xyz", 3) == 0, "%s", tp_last_error());
	ck_assert_msg(tpt_peer_links(&host, &link) == 1 && strcmp(link.state, "up") == 0,
		      "the link is %s: %s", link.state, link.last_error);
	ck_assert_int_eq(tp_wq_release(wq), 0);
	fake_host_stop(&fh, pid, ctx);
}
END_TEST

/* ---- one local uid's share of a link's forwarded ops ---------------------------------------- */

#define UID_SHARE 3
#define VICTIM 4242
static struct tpt_sync parked;
static char addr2[256];

/* As nobody, parks UID_SHARE reads that wait for a minute on the empty remote channel at addr
 * (the last one fits), sees one more refused at once with STATUS_LIMIT, and holds the parked
 * ones until the parent says so. */
static int share_parker(void *arg)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__DaemonMsg *dm;
	uint64_t id = 0, req;
	struct tpt_raw r;
	int st;

	(void)arg;
	TPT_REQUIRE(tpt_become(NOBODY) == 0, 1, "cannot drop to nobody");
	TPT_REQUIRE(tpt_raw_connect(&r, tpt_peer_a.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	o.name = addr;
	o.owner_set = true;
	o.owner_uid = 0;
	st = raw_chan(&r, &o, NULL, 0, &id);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_OK && id, 1, "open %s: %d", addr, st);
	for (req = 10; req <= 10 + UID_SHARE; req++) {
		Tpw__V1__ChanOp rd = TPW__V1__CHAN_OP__INIT;

		rd.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
		rd.chan_id = id;
		rd.req_id = req;
		rd.timeout_ms = 60000;
		m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
		m.chan_op = &rd;
		TPT_REQUIRE(tpt_raw_send(&r, &m, NULL, 0, NULL, 0, 0) == 0, 1, "send read %llu",
			    (unsigned long long)req);
	}
	/* The first answer is the refusal of the read above the share: those below it wait. */
	TPT_REQUIRE(tpt_raw_expect(&r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm) == 0, 1,
		    "no answer to the read above chan-peer-ops-per-uid");
	st = dm->chan_reply->status;
	req = dm->chan_reply->req_id;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	TPT_REQUIRE(st == TPW__V1__STATUS__STATUS_LIMIT && req == 10 + UID_SHARE, 1,
		    "the read above chan-peer-ops-per-uid: status %d for req %llu", st,
		    (unsigned long long)req);
	TPT_REQUIRE(tpt_sync_post(&parked, 1) == 0, 1, "post");
	TPT_REQUIRE(tpt_sync_wait(&go, 4 * T_MS) == 1, 1, "parent");
	tpt_raw_close(&r);
	return 0;
}

/* As VICTIM, writes an item to the remote channel at addr2 and reads it back over the link
 * nobody fills. */
static int share_victim(void *arg)
{
	const char item[] = "mine";
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = 0 };
	struct iovec iov = { .iov_base = (void *)item, .iov_len = 4 };
	struct tp_context *ctx;
	struct tp_chan *ch;
	void *got = NULL;
	size_t len = 0;
	int r;

	(void)arg;
	TPT_REQUIRE(tpt_become(VICTIM) == 0, 1, "cannot become %d", VICTIM);
	TPT_REQUIRE(tpt_ctx_new(&tpt_peer_a, 0, "victim", &ctx) == 0, 1, "context");
	r = tp_chan_open(ctx, addr2, &o, &ch);
	TPT_REQUIRE(r == 0, 1, "open over the link: %d", r);
	r = tp_chan_write(ch, &iov, 1, 0);
	TPT_REQUIRE(r == 0, 1, "write over the link: %d", r);
	r = tp_chan_read(ch, &got, &len, 5000);
	TPT_REQUIRE(r == 0 && len == 4 && !memcmp(got, item, 4), 1, "read over the link: %d", r);
	free(got);
	tp_chan_release(ch);
	tp_context_free(ctx);
	return 0;
}

/* chan-peer-ops-per-uid: nobody's reads parked on a remote channel stop at its share of the
 * link (the last below fits and waits, one above is refused at once) while uid 4242 still
 * writes and reads over the same link. */
START_TEST(test_one_uid_cannot_take_a_links_ops)
{
	const char *const *pa = tpt_peer_args();
	const char *args[64];
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = -1 };
	struct tp_context *cb;
	struct tp_chan *hb, *hf;
	size_t n = 0;
	pid_t pid;

	if (geteuid() != 0) {
		printf("skipped: needs root to run clients as other uids\n");
		return;
	}
	while (pa[n] && n < 60) {
		args[n] = pa[n];
		n++;
	}
	args[n++] = "--chan-peer-ops-per-uid";
	args[n++] = "3"; /* UID_SHARE */
	args[n] = NULL;
	ck_assert_int_eq(tpt_sync_init(&go), 0);
	ck_assert_int_eq(tpt_sync_init(&parked), 0);
	ck_assert_int_eq(tpt_daemon_pair_start(&tpt_peer_a, args, &tpt_peer_b, pa), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&tpt_peer_a), 0);
	ck_assert_int_eq(tpt_ctx_new(&tpt_peer_b, 0, "host", &cb), 0);
	o.flags = TP_CHAN_CREATE;
	o.access = TP_ACCESS_ANYONE;
	o.remote = TP_REMOTE_ANY_PEER;
	ck_assert_int_eq(tp_chan_open(cb, "parking", &o, &hb), 0);
	tpt_peer_address(&tpt_peer_b, "parking", addr, sizeof(addr));
	ck_assert_int_eq(tp_chan_open(cb, "free", &o, &hf), 0);
	tpt_peer_address(&tpt_peer_b, "free", addr2, sizeof(addr2));
	pid = tpt_fork(share_parker, NULL);
	ck_assert_int_gt(pid, 0);
	ck_assert_msg(tpt_sync_wait(&parked, 4 * T_MS) == 1, "nobody's reads were not parked");
	ck_assert(tpt_wait_ok(tpt_fork(share_victim, NULL), 4 * T_MS, "uid 4242 over the link"));
	ck_assert_int_eq(tpt_sync_post(&go, 1), 0);
	ck_assert(tpt_wait_ok(pid, 4 * T_MS, "nobody"));
	ck_assert(tpt_daemon_alive(&tpt_peer_a));
	tp_chan_release(hf);
	tp_chan_release(hb);
	tp_context_free(cb);
	tpt_peer_fixture_stop();
	tpt_sync_done(&parked);
	tpt_sync_done(&go);
}
END_TEST

static Suite *chanx_suite(void)
{
	Suite *s = suite_create("sec_chanx");
	TCase *tc = tcase_create("chanx");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_attacker_cannot_crash_or_touch_remote_handles);
	tcase_add_test(tc, test_one_uid_cannot_take_a_links_ops);
	tcase_add_test(tc, test_hostile_peer_fails_its_link_only);
	tcase_add_test(tc, test_two_links_of_one_peer_share_its_ops_limit);
	tcase_add_test(tc, test_small_frames_peer_takes_within_them);
	tcase_add_test(tc, test_hostile_peer_cannot_own_or_stream_into_a_queue);
	tcase_add_loop_test(tc, test_hostile_host_fails_its_link_only, 0, 5);
	tcase_add_loop_test(tc, test_hostile_host_batch_reads, 0, 2);
	tcase_add_test(tc, test_hostile_host_wq_reads);
	tcase_add_test(tc, test_hostile_host_wq_answer_fields);
	tcase_add_test(tc, test_hostile_host_refused_read_ends_its_receive);
	tcase_add_test(tc, test_hostile_host_answer_cannot_end_the_context);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(chanx_suite());
}
