/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Writes the seed corpus of the peer fuzz target (fuzz_peer.c): sequences of records in which a
 * far "daemon" dials the in-process one over plain TCP (--peer-insecure): its PeerHello on
 * connection 0, the data connections' PeerDataHello quoting the link id the daemon chose (the
 * placeholder FUZZ_PEER_LINK_ID, substituted by the harness), then keepalives, a PeerConnect to
 * the harness's listener "fuzz", descriptors, read requests, raw chunks on data connections, and
 * the local session writing and reading on the pipe so opened; plus violations (wrong version,
 * malformed frames after a valid Hello, a data hello for an unknown link or a bad index, frames
 * out of turn) and hang-ups at awkward moments. Each seed is a valid conversation or a deliberate
 * violation in one, so that mutations start deep in the handlers. Run once by hand,
 * `gen_peer_corpus tests/fuzz/corpus-peer`, and commit the files.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "frame.h"
#include "fuzz_peer.h"
#include "validate.h"

#define OP_SUBST FUZZ_PEER_OP_SUBST
#define OP_HANGUP FUZZ_PEER_OP_HANGUP
#define OP_BATCH FUZZ_PEER_OP_BATCH
#define OP_LOCAL FUZZ_PEER_OP_LOCAL
/* The local session's id of the first pipe it accepts. */
#define ACCEPTED_PIPE (1ull << 63 | 1)
#define STRIPE_MAGIC 0x31435054u /* "TPC1", backends/mpt/stripe.h */
#define STRIPE_HDR 32

static const char *outdir;
static uint8_t seq_buf[1 << 16];
static size_t seq_len;

static void rec_raw(uint8_t op, const uint8_t *b, size_t n)
{
	if (seq_len + 3 + n > sizeof(seq_buf))
		abort();
	seq_buf[seq_len++] = op;
	seq_buf[seq_len++] = (uint8_t)n;
	seq_buf[seq_len++] = (uint8_t)(n >> 8);
	memcpy(seq_buf + seq_len, b, n);
	seq_len += n;
}

/* One record: a frame of @m with @tail_len bytes of tail (0x5a). */
static void rec(uint8_t op, const ProtobufCMessage *m, uint32_t tail_len)
{
	size_t n = tpw_frame_size(m);
	uint8_t *buf = calloc(1, n + tail_len);

	if (!buf)
		abort();
	n = tpw_frame_pack(m, tail_len, 0, 1, buf);
	memset(buf + n, 0x5a, tail_len);
	rec_raw(op, buf, n + tail_len);
	free(buf);
}

static void save(const char *name)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s.bin", outdir, name);
	f = fopen(path, "wb");
	if (!f || fwrite(seq_buf, 1, seq_len, f) != seq_len || fclose(f) != 0) {
		perror(path);
		exit(1);
	}
	seq_len = 0;
}

static void peer_rec(uint8_t op, Tpw__V1__PeerMsg *m, uint32_t tail_len)
{
	rec(op, &m->base, tail_len);
}

/* The dialler's PeerHello on connection 0: @data_conns data connections to follow. */
static void hello_v(uint8_t op, uint32_t major, uint32_t data_conns)
{
	static uint8_t boot[16] = { 0xb0, 0x07, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14 };
	char *backends[] = { "mpt", "basic" };
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerHello h = TPW__V1__PEER_HELLO__INIT;

	h.major = major;
	h.minor = TPW_PEER_PROTO_MINOR;
	h.host = "far";
	h.boot_id.data = boot;
	h.boot_id.len = sizeof(boot);
	h.instance = 0x1234567;
	h.n_backends = 2;
	h.backends = backends;
	h.data_conns = data_conns;
	h.force_cross_host = true;
	h.listen_port = 7420;
	m.body_case = TPW__V1__PEER_MSG__BODY_HELLO;
	m.hello = &h;
	peer_rec(op, &m, 0);
}

static void hello(uint32_t data_conns)
{
	hello_v(0, TPW_PEER_PROTO_MAJOR, data_conns);
}

/* Data connection @c's first frame: PeerDataHello for @link (FUZZ_PEER_LINK_ID: the real one). */
static void data_hello(uint8_t c, uint64_t link, uint32_t index)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerDataHello h = TPW__V1__PEER_DATA_HELLO__INIT;

	h.link_id = link;
	h.index = index;
	m.body_case = TPW__V1__PEER_MSG__BODY_DATA_HELLO;
	m.data_hello = &h;
	peer_rec(c | OP_SUBST, &m, 0);
}

/* A link with @n data connections (1..3) up. */
static void link_up(unsigned n)
{
	hello(n);
	for (unsigned i = 0; i < n; i++)
		data_hello((uint8_t)(1 + i), FUZZ_PEER_LINK_ID, i);
}

static void ping(bool reply)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerPing p = TPW__V1__PEER_PING__INIT;

	p.t_ns = 1000;
	p.reply = reply;
	m.body_case = TPW__V1__PEER_MSG__BODY_PING;
	m.ping = &p;
	peer_rec(0, &m, 0);
}

static void connect_(const char *name, bool expect_uid)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerConnect k = TPW__V1__PEER_CONNECT__INIT;

	k.pipe_id = 1;
	k.name = (char *)name;
	k.remote_name = "far-client";
	k.uid = 1000;
	k.expect_uid_set = expect_uid;
	k.expect_uid = 4242;
	m.body_case = TPW__V1__PEER_MSG__BODY_CONNECT;
	m.connect = &k;
	peer_rec(0, &m, 0);
}

/* A PeerConnect @pipe_id to @name that waits up to @wait_ms for the listener. */
static void connect_wait(uint64_t pipe_id, const char *name, uint32_t wait_ms)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerConnect k = TPW__V1__PEER_CONNECT__INIT;

	k.pipe_id = pipe_id;
	k.name = (char *)name;
	k.remote_name = "far-client";
	k.wait_ms = wait_ms;
	m.body_case = TPW__V1__PEER_MSG__BODY_CONNECT;
	m.connect = &k;
	peer_rec(0, &m, 0);
}

/* The far side gives up on its waiting connect @pipe_id. */
static void connect_cancel(uint64_t pipe_id)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerPipeClose pc = TPW__V1__PEER_PIPE_CLOSE__INIT;

	pc.pipe_id = pipe_id;
	pc.status = TPW__V1__STATUS__STATUS_CANCELED;
	pc.connect_pending = true;
	m.body_case = TPW__V1__PEER_MSG__BODY_PIPE_CLOSE;
	m.pipe_close = &pc;
	peer_rec(0, &m, 0);
}

/* A message of one payload of @len bytes written by the far side on the pipe it opened. */
static void descriptor(uint64_t msg_id, uint64_t len, bool eager)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerDescriptor pd = TPW__V1__PEER_DESCRIPTOR__INIT;
	Tpw__V1__Descriptor d = TPW__V1__DESCRIPTOR__INIT;
	Tpw__V1__PayloadDesc p = TPW__V1__PAYLOAD_DESC__INIT, *pp = &p;

	p.length = len;
	d.msg_id = msg_id;
	d.eager = eager;
	d.n_payloads = 1;
	d.payloads = &pp;
	pd.pipe_id = FUZZ_PEER_PIPE_ID;
	pd.descriptor = &d;
	m.body_case = TPW__V1__PEER_MSG__BODY_DESCRIPTOR;
	m.descriptor = &pd;
	peer_rec(OP_SUBST, &m, eager ? (uint32_t)len : 0);
}

/* A PeerBcast (peer minor 5) of one rendezvous payload of @len bytes to @n targets, each the
 * harness's pipe (n > 1: a pipe named twice), message ids from @msg_id. */
static void bcast(uint64_t msg_id, uint64_t len, size_t n)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerBcast b = TPW__V1__PEER_BCAST__INIT;
	Tpw__V1__Descriptor d = TPW__V1__DESCRIPTOR__INIT;
	Tpw__V1__PayloadDesc p = TPW__V1__PAYLOAD_DESC__INIT, *pp = &p;
	Tpw__V1__PeerBcastTarget t[4], *tp[4];

	p.length = len;
	d.n_payloads = 1;
	d.payloads = &pp;
	for (size_t i = 0; i < n && i < 4; i++) {
		tpw__v1__peer_bcast_target__init(&t[i]);
		t[i].pipe_id = FUZZ_PEER_PIPE_ID;
		t[i].msg_id = msg_id + i;
		tp[i] = &t[i];
	}
	b.descriptor = &d;
	b.n_targets = n < 4 ? n : 4;
	b.targets = tp;
	m.body_case = TPW__V1__PEER_MSG__BODY_BCAST;
	m.bcast = &b;
	peer_rec(OP_SUBST, &m, 0);
}

static void read_req(uint64_t msg_id, uint64_t xfer_id)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerReadReq r = TPW__V1__PEER_READ_REQ__INIT;

	r.pipe_id = FUZZ_PEER_PIPE_ID;
	r.msg_id = msg_id;
	r.xfer_id = xfer_id;
	m.body_case = TPW__V1__PEER_MSG__BODY_READ_REQ;
	m.read_req = &r;
	peer_rec(OP_SUBST, &m, 0);
}

static void consumed(uint64_t msg_id, Tpw__V1__Status st)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerConsumed c = TPW__V1__PEER_CONSUMED__INIT;

	c.pipe_id = FUZZ_PEER_PIPE_ID;
	c.msg_id = msg_id;
	c.status = st;
	m.body_case = TPW__V1__PEER_MSG__BODY_CONSUMED;
	m.consumed = &c;
	peer_rec(OP_SUBST, &m, 0);
}

static void xfer_end(uint64_t xfer_id, uint64_t bytes)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerXferEnd x = TPW__V1__PEER_XFER_END__INIT;

	x.xfer_id = xfer_id;
	x.status = TPW__V1__STATUS__STATUS_IO;
	x.message = "sender gave up";
	x.bytes = bytes;
	m.body_case = TPW__V1__PEER_MSG__BODY_XFER_END;
	m.xfer_end = &x;
	peer_rec(0, &m, 0);
}

static void peer_pipe_close(void)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerPipeClose pc = TPW__V1__PEER_PIPE_CLOSE__INIT;

	pc.pipe_id = FUZZ_PEER_PIPE_ID;
	pc.status = TPW__V1__STATUS__STATUS_CLOSED;
	m.body_case = TPW__V1__PEER_MSG__BODY_PIPE_CLOSE;
	m.pipe_close = &pc;
	peer_rec(OP_SUBST, &m, 0);
}

/* A raw chunk on data connection @c: @len bytes of segment 0 of @xfer_id at @offset. */
static void chunk(uint8_t c, uint64_t xfer_id, uint64_t offset, uint32_t len, uint32_t magic)
{
	uint8_t b[STRIPE_HDR + 256] = { 0 };
	uint32_t seg = 0, flags = 0;

	if (len > sizeof(b) - STRIPE_HDR)
		abort();
	memcpy(b, &magic, 4);
	memcpy(b + 4, &seg, 4);
	memcpy(b + 8, &xfer_id, 8);
	memcpy(b + 16, &offset, 8);
	memcpy(b + 24, &len, 4);
	memcpy(b + 28, &flags, 4);
	memset(b + STRIPE_HDR, 0xa5, len);
	rec_raw(c, b, STRIPE_HDR + len);
}

/* The local session (which listens on "fuzz") writes @len bytes on the accepted pipe: inline
 * (an eager message), or from offset 0 of its buffer 1 (the far side asks for them). */
static void local_write(uint64_t len, bool shm)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Write w = TPW__V1__WRITE__INIT;
	Tpw__V1__Payload p = TPW__V1__PAYLOAD__INIT, *pp = &p;
	Tpw__V1__Segment s = TPW__V1__SEGMENT__INIT;
	Tpw__V1__ShmRef r = TPW__V1__SHM_REF__INIT;

	s.length = len;
	if (shm) {
		r.buf_id = 1;
		r.gen = 1;
		s.loc_case = TPW__V1__SEGMENT__LOC_SHM;
		s.shm = &r;
	} else {
		s.loc_case = TPW__V1__SEGMENT__LOC_INLINE_OFF;
	}
	p.data = &s;
	w.pipe_id = ACCEPTED_PIPE;
	w.write_id = 7;
	w.n_payloads = 1;
	w.payloads = &pp;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_WRITE;
	m.write = &w;
	rec(OP_LOCAL, &m.base, shm ? 0 : (uint32_t)len);
}

static void local_buffer(void)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRegister b = TPW__V1__BUFFER_REGISTER__INIT;
	size_t n;
	uint8_t buf[128];

	b.req_id = 3;
	b.buf_id = 1;
	b.gen = 1;
	b.size = 65536;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &b;
	n = tpw_frame_pack(&m.base, 0, 1, 1, buf);
	rec_raw(OP_LOCAL | OP_SUBST, buf, n); /* with OP_LOCAL, OP_SUBST sends a memfd */
}

/* The local session reads message @msg_id of the accepted pipe into buffer 1, or discards it,
 * or acknowledges it as eager. */
static void local_read(uint64_t msg_id, uint64_t len, bool discard, bool ack_eager)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Read rd = TPW__V1__READ__INIT;
	Tpw__V1__Segment s = TPW__V1__SEGMENT__INIT, *sp = &s;
	Tpw__V1__ShmRef r = TPW__V1__SHM_REF__INIT;

	rd.pipe_id = ACCEPTED_PIPE;
	rd.msg_id = msg_id;
	rd.discard = discard;
	rd.ack_eager = ack_eager;
	if (!discard && !ack_eager) {
		r.buf_id = 1;
		r.gen = 1;
		s.length = len;
		s.loc_case = TPW__V1__SEGMENT__LOC_SHM;
		s.shm = &r;
		rd.n_payloads = 1;
		rd.payloads = &sp;
	}
	m.body_case = TPW__V1__CLIENT_MSG__BODY_READ;
	m.read = &rd;
	rec(OP_LOCAL, &m.base, 0);
}

static void local_pipe_close(void)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__PipeClose pc = TPW__V1__PIPE_CLOSE__INIT;

	pc.pipe_id = ACCEPTED_PIPE;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_PIPE_CLOSE;
	m.pipe_close = &pc;
	rec(OP_LOCAL, &m.base, 0);
}

/* Channels across hosts (issue 25 part xhost): the local session creates channel "fuzzchan" that
 * other hosts may open (its handle: id 1). */
static void local_chan_create(void)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;

	o.req_id = 9;
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	o.name = "fuzzchan";
	o.create = true;
	o.remote = TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &o;
	rec(OP_LOCAL, &m.base, 0);
}

/* The local session writes one item of @len bytes into its handle 1. */
static void local_chan_write(uint64_t len)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;

	o.req_id = 10;
	o.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	o.chan_id = 1;
	o.n_lengths = 1;
	o.lengths = &len;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &o;
	rec(OP_LOCAL, &m.base, (uint32_t)len);
}

/* The far daemon's PeerChanOp @kind on handle @id (OPEN: of "fuzzchan"); a WRITE carries two
 * items of 4 bytes. */
static void peer_chan(uint64_t req, Tpw__V1__ChanOpKind kind, uint64_t id, uint32_t timeout_ms)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerChanOp po = TPW__V1__PEER_CHAN_OP__INIT;
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	uint64_t lens[2] = { 4, 4 };
	bool w = kind == TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;

	o.req_id = req;
	o.op = kind;
	o.chan_id = id;
	o.timeout_ms = timeout_ms;
	if (kind == TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN || kind == TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK)
		o.name = "fuzzchan";
	o.n_lengths = w ? 2 : 0;
	o.lengths = lens;
	po.op = &o;
	po.uid = 0;
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_OP;
	m.chan_op = &po;
	peer_rec(0, &m, w ? 8 : 0);
}

/* Large items (peer minor 6): the far daemon's WRITE on handle @id of an item of 64 bytes that
 * comes over the data connection and one of 4 inline, or its READ into its transfer @xfer_id
 * (room 256; 0: a plain read); and its word that transfer @xfer_id stopped. */
static void peer_chan_big(uint64_t req, Tpw__V1__ChanOpKind kind, uint64_t id, uint64_t xfer_id)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerChanOp po = TPW__V1__PEER_CHAN_OP__INIT;
	Tpw__V1__ChanOp o = TPW__V1__CHAN_OP__INIT;
	uint64_t lens[2] = { 64, 4 };
	protobuf_c_boolean streamed[2] = { true, false };
	bool w = kind == TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;

	o.req_id = req;
	o.op = kind;
	o.chan_id = id;
	if (w) {
		o.n_lengths = 2;
		o.lengths = lens;
		o.n_streamed = 2;
		o.streamed = streamed;
	} else if (xfer_id) {
		o.xfer_id = xfer_id;
		o.room = 256;
	}
	po.op = &o;
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_OP;
	m.chan_op = &po;
	peer_rec(0, &m, w ? 4 : 0);
}

static void chan_xfer_end(uint64_t xfer_id)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerXferEnd x = TPW__V1__PEER_XFER_END__INIT;

	x.xfer_id = xfer_id;
	x.status = TPW__V1__STATUS__STATUS_IO;
	x.message = "writer gone";
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_XFER_END;
	m.chan_xfer_end = &x;
	peer_rec(0, &m, 0);
}

/* The far daemon's PeerWqOp @kind on handle @id (OPEN: of "fuzzq"). */
static void peer_wq(uint64_t req, Tpw__V1__WqOpKind kind, uint64_t id)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerWqOp po = TPW__V1__PEER_WQ_OP__INIT;
	Tpw__V1__WqOp o = TPW__V1__WQ_OP__INIT;
	bool data = kind == TPW__V1__WQ_OP_KIND__WQ_OP_REPLY;

	o.req_id = req;
	o.op = kind;
	o.wq_id = id;
	o.name = kind == TPW__V1__WQ_OP_KIND__WQ_OP_OPEN ? "fuzzq" : NULL;
	o.question_id = 1;
	po.op = &o;
	m.body_case = TPW__V1__PEER_MSG__BODY_WQ_OP;
	m.wq_op = &po;
	peer_rec(0, &m, data ? 4 : 0);
}

/* The local session creates queue "fuzzwq" (any peer may open it; its handle 1) and submits a
 * message question of 64 bytes inline. */
static void local_wq_create_submit(void)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__WqOp o = TPW__V1__WQ_OP__INIT;
	Tpw__V1__Descriptor d = TPW__V1__DESCRIPTOR__INIT;
	Tpw__V1__PayloadDesc pd = TPW__V1__PAYLOAD_DESC__INIT, *pp = &pd;

	o.req_id = 9;
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_OPEN;
	o.name = "fuzzwq";
	o.create = true;
	o.remote = TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_WQ_OP;
	m.wq_op = &o;
	rec(OP_LOCAL, &m.base, 0);
	o = (Tpw__V1__WqOp)TPW__V1__WQ_OP__INIT;
	pd.length = 64;
	d.n_payloads = 1;
	d.payloads = &pp;
	o.req_id = 10;
	o.op = TPW__V1__WQ_OP_KIND__WQ_OP_SUBMIT;
	o.wq_id = 1;
	o.msg_desc = &d;
	rec(OP_LOCAL, &m.base, 64);
}

/* Work queue messages by reference (peer minor 11): the far daemon's op @kind on handle @id of
 * question 1: TAKE by descriptor, a message read into its transfer @xfer_id (room 256), or a
 * REPLY of 64 bytes whose bytes come over the data connection. */
static void peer_wq_big(uint64_t req, Tpw__V1__WqOpKind kind, uint64_t id, uint64_t xfer_id,
			bool read)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerWqOp po = TPW__V1__PEER_WQ_OP__INIT;
	Tpw__V1__WqOp o = TPW__V1__WQ_OP__INIT;
	Tpw__V1__Descriptor d = TPW__V1__DESCRIPTOR__INIT;
	Tpw__V1__PayloadDesc pd = TPW__V1__PAYLOAD_DESC__INIT, *pp = &pd;

	o.req_id = req;
	o.op = kind;
	o.wq_id = id;
	o.question_id = 1;
	if (kind == TPW__V1__WQ_OP_KIND__WQ_OP_OPEN) {
		o.name = "fuzzwq";
		o.question_id = 0;
	} else if (kind == TPW__V1__WQ_OP_KIND__WQ_OP_REPLY) {
		pd.length = 64;
		d.n_payloads = 1;
		d.payloads = &pp;
		o.msg_desc = &d;
		o.stream_len = 64;
	} else if (read) {
		o.msg_read = true;
		o.xfer_id = xfer_id;
		o.room = xfer_id ? 256 : 0;
	} else {
		o.msg = true;
		o.question_id = 0;
	}
	po.op = &o;
	m.body_case = TPW__V1__PEER_MSG__BODY_WQ_OP;
	m.wq_op = &po;
	peer_rec(0, &m, 0);
}

/* Answers the far daemon sends to ops this daemon never forwarded. */
static void peer_answers(void)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerChanReply pc = TPW__V1__PEER_CHAN_REPLY__INIT;
	Tpw__V1__ChanReply c = TPW__V1__CHAN_REPLY__INIT;
	Tpw__V1__PeerWqReply pw = TPW__V1__PEER_WQ_REPLY__INIT;
	Tpw__V1__WqReply w = TPW__V1__WQ_REPLY__INIT;
	uint64_t len = 4, two[2] = { 1, 3 };

	c.req_id = 1;
	c.status = TPW__V1__STATUS__STATUS_OK;
	c.n_lengths = 1;
	c.lengths = &len;
	pc.reply = &c;
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_REPLY;
	m.chan_reply = &pc;
	peer_rec(0, &m, 4);
	/* a batch read's answer (peer minor 10): two items back to back in the tail */
	c.n_lengths = 2;
	c.lengths = two;
	peer_rec(0, &m, 4);
	w.req_id = 2;
	w.status = TPW__V1__STATUS__STATUS_OK;
	w.length = 4;
	pw.reply = &w;
	m.body_case = TPW__V1__PEER_MSG__BODY_WQ_REPLY;
	m.wq_reply = &pw;
	peer_rec(0, &m, 4);
}

int main(int argc, char **argv)
{
	static const uint8_t garbage[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";

	if (argc != 2) {
		fprintf(stderr, "usage: %s DIR\n", argv[0]);
		return 2;
	}
	outdir = argv[1];

	hello(1);
	save("hello");

	link_up(3);
	save("hello-data-conns");

	link_up(1);
	ping(false);
	ping(true);
	save("keepalive");

	hello(1);
	ping(false);
	save("ping-during-handshake");

	link_up(1);
	connect_(FUZZ_PEER_LISTENER, false);
	save("connect");

	link_up(1);
	connect_("missing", false);
	connect_(FUZZ_PEER_LISTENER, true);
	save("connect-refused");

	/* Connects that wait for a listener (peer protocol 2.1): one canceled, one twice (the
	 * second refused), one for the listener that exists, one left waiting when the link goes;
	 * then a wait over the bound, which closes the link. */
	link_up(1);
	connect_wait(5, "late", 60000);
	connect_wait(6, "late", 1);
	connect_wait(6, "late", 1);
	connect_cancel(5);
	connect_cancel(99);
	connect_wait(7, FUZZ_PEER_LISTENER, 1000);
	connect_wait(8, "never", TPW_PEER_WAIT_MS_MAX);
	save("connect-wait");

	link_up(1);
	connect_wait(9, "late", TPW_PEER_WAIT_MS_MAX + 1);
	save("connect-wait-over-bound");

	/* The far side writes: an eager message, then one the local reader pulls over the data
	 * connection (read request with transfer id 1, the link's first), then closes. */
	link_up(1);
	connect_(FUZZ_PEER_LISTENER, false);
	local_buffer();
	descriptor(1, 16, true);
	local_read(1, 0, false, true);
	descriptor(2, 64, false);
	local_read(2, 64, false, false);
	chunk(1, 1, 0, 64, STRIPE_MAGIC);
	descriptor(3, 64, false);
	local_read(3, 64, false, false);
	xfer_end(2, 0);
	descriptor(4, 32, false);
	local_read(4, 0, true, false);
	peer_pipe_close();
	save("far-writes");

	/* The far side broadcasts (one target: the harness has one pipe): the daemon reads the
	 * bytes once into its staging (transfer 1, the link's first) and the reader copies them
	 * from there; then a PeerBcast naming the pipe twice, refused. */
	link_up(1);
	connect_(FUZZ_PEER_LISTENER, false);
	local_buffer();
	bcast(1, 64, 1);
	local_read(1, 64, false, false);
	chunk(1, 1, 0, 64, STRIPE_MAGIC);
	bcast(2, 64, 2);
	descriptor(2, 32, false);
	local_read(2, 0, true, false);
	peer_pipe_close();
	save("far-bcast");

	/* The local session writes: the daemon sends a descriptor, the far side asks for the bytes
	 * (over the data connection), then says it consumed them. */
	link_up(1);
	connect_(FUZZ_PEER_LISTENER, false);
	local_buffer();
	local_write(4096, true);
	read_req(1, 77);
	consumed(1, TPW__V1__STATUS__STATUS_OK);
	local_write(32, false);
	consumed(2, TPW__V1__STATUS__STATUS_CLOSED);
	local_write(8192, true);
	read_req(3, 78);
	consumed(3, TPW__V1__STATUS__STATUS_IO);
	local_pipe_close();
	save("local-writes");

	link_up(1);
	connect_(FUZZ_PEER_LISTENER, false);
	local_write(16, false);
	rec_raw(0 | OP_HANGUP, NULL, 0);
	save("control-hangs-up-with-pipe");

	/* Channels across hosts: the far daemon opens the local session's channel (its handle 2),
	 * waits in a read the local write answers, writes a batch, reads it back, closes and
	 * releases; ops on handles it does not have; a queue that does not exist; answers to ops
	 * never forwarded. */
	/* (The far handle's id depends on what the daemon served before: ids 2..5 are tried.) */
	link_up(1);
	local_chan_create();
	peer_chan(1, TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN, 0, 0);
	for (uint64_t id = 2; id <= 5; id++)
		peer_chan(10 + id, TPW__V1__CHAN_OP_KIND__CHAN_OP_READ, id, UINT32_MAX);
	local_chan_write(16);
	for (uint64_t id = 2; id <= 5; id++) {
		peer_chan(20 + id, TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE, id, 0);
		peer_chan(30 + id, TPW__V1__CHAN_OP_KIND__CHAN_OP_READ, id, 0);
		peer_chan(40 + id, TPW__V1__CHAN_OP_KIND__CHAN_OP_READ, id, 1000);
		peer_chan(50 + id, TPW__V1__CHAN_OP_KIND__CHAN_OP_CLOSE, id, 0);
		peer_chan(60 + id, TPW__V1__CHAN_OP_KIND__CHAN_OP_RELEASE, id, 0);
	}
	peer_wq(9, TPW__V1__WQ_OP_KIND__WQ_OP_OPEN, 0);
	peer_wq(10, TPW__V1__WQ_OP_KIND__WQ_OP_TAKE, 1);
	peer_wq(11, TPW__V1__WQ_OP_KIND__WQ_OP_REPLY, 1);
	peer_answers();
	save("chan-remote-a");

	/* A read left waiting when the link goes; then a channel UNLINK (peer minor 6: answered as
	 * for a missing channel, the daemon has no chan-remote-create-uid). */
	link_up(1);
	local_chan_create();
	peer_chan(1, TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN, 0, 0);
	peer_chan(2, TPW__V1__CHAN_OP_KIND__CHAN_OP_READ, 2, UINT32_MAX);
	peer_chan(3, TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK, 0, 0);
	save("chan-remote-b-unlink");

	/* Large items (peer minor 6): a WRITE whose first item comes over the data connection
	 * (transfer 1, the link's first receive), sent whole; another, ended by the writer's word
	 * after part of it; one never sent when the link goes. A read into the far daemon's
	 * transfer 5 gets the large item the local session wrote; a plain read gets held_len. */
	link_up(1);
	local_chan_create();
	peer_chan(1, TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN, 0, 0);
	peer_chan_big(2, TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE, 2, 0);
	chunk(1, 1, 0, 64, STRIPE_MAGIC);
	peer_chan_big(3, TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE, 2, 0);
	chunk(1, 2, 0, 16, STRIPE_MAGIC);
	chan_xfer_end(2);
	chan_xfer_end(99);
	local_chan_write(200);
	peer_chan_big(4, TPW__V1__CHAN_OP_KIND__CHAN_OP_READ, 2, 0);
	peer_chan_big(5, TPW__V1__CHAN_OP_KIND__CHAN_OP_READ, 2, 5);
	peer_chan_big(6, TPW__V1__CHAN_OP_KIND__CHAN_OP_READ, 2, 6);
	peer_chan_big(7, TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE, 2, 0);
	save("chan-remote-streamed");

	/* Work queue messages by reference (peer minor 11): the far worker takes the local
	 * owner's message question by descriptor, reads it into its transfer 5, replies with 64
	 * bytes over the data connection (the link's first receive, transfer 1) in part, ends
	 * that transfer, replies again and the link goes with the reply's bytes unsent. */
	link_up(1);
	local_wq_create_submit();
	peer_wq_big(1, TPW__V1__WQ_OP_KIND__WQ_OP_OPEN, 0, 0, false);
	for (uint64_t id = 2; id <= 3; id++) {
		peer_wq_big(10 + id, TPW__V1__WQ_OP_KIND__WQ_OP_TAKE, id, 0, false);
		peer_wq_big(20 + id, TPW__V1__WQ_OP_KIND__WQ_OP_TAKE, id, 5, true);
		peer_wq_big(30 + id, TPW__V1__WQ_OP_KIND__WQ_OP_REPLY, id, 0, false);
	}
	chunk(1, 1, 0, 16, STRIPE_MAGIC);
	chan_xfer_end(1);
	for (uint64_t id = 2; id <= 3; id++)
		peer_wq_big(40 + id, TPW__V1__WQ_OP_KIND__WQ_OP_REPLY, id, 0, false);
	chunk(1, 2, 0, 64, STRIPE_MAGIC);
	save("wq-remote-streamed");

	link_up(2);
	connect_(FUZZ_PEER_LISTENER, false);
	chunk(2, 99, 0, 8, STRIPE_MAGIC);
	save("chunk-unknown-xfer");

	link_up(1);
	chunk(1, 1, 0, 8, 0xdeadbeef);
	save("chunk-bad-magic");

	/* Messages an up link may carry, for pipes and transfers it does not have, then one it
	 * may not (a second Hello). */
	link_up(1);
	{
		Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
		Tpw__V1__PeerConnectReply cr = TPW__V1__PEER_CONNECT_REPLY__INIT;
		Tpw__V1__PeerRdma rd = TPW__V1__PEER_RDMA__INIT;

		cr.pipe_id = 5;
		cr.peer_pipe_id = 6;
		m.body_case = TPW__V1__PEER_MSG__BODY_CONNECT_REPLY;
		m.connect_reply = &cr;
		peer_rec(0, &m, 0);
		rd.ports = 1;
		m.body_case = TPW__V1__PEER_MSG__BODY_RDMA;
		m.rdma = &rd;
		peer_rec(0, &m, 0);
	}
	xfer_end(9, 0);
	consumed(1, TPW__V1__STATUS__STATUS_OK);
	read_req(1, 3);
	descriptor(1, 16, true);
	peer_pipe_close();
	hello(1);
	save("stray-messages-on-up-link");

	/* Malformed frames after a valid Hello. */
	hello(1);
	rec_raw(0, garbage, sizeof(garbage) - 1);
	save("bad-frame-after-hello");

	hello(1);
	{
		Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
		Tpw__V1__PeerPing p = TPW__V1__PEER_PING__INIT;
		uint8_t b[64];
		size_t n;

		m.body_case = TPW__V1__PEER_MSG__BODY_PING;
		m.ping = &p;
		n = tpw_frame_pack(&m.base, 0, 0, 1, b);
		b[TPW_HDR_SIZE - 1] ^= 0xff; /* corrupt the header's last field */
		rec_raw(0, b, n);
	}
	save("bad-header-after-hello");

	hello(1);
	{
		uint8_t b[TPW_HDR_SIZE + 4] = { 0 };
		struct tpw_hdr h = { .magic = TPW_MAGIC, .version = TPW_WIRE_VERSION, .msg_len = 4 };

		tpw_hdr_pack(&h, b);
		memset(b + TPW_HDR_SIZE, 0xff, 4); /* a message that does not decode */
		rec_raw(0, b, sizeof(b));
	}
	save("undecodable-after-hello");

	hello(1);
	connect_(FUZZ_PEER_LISTENER, false); /* before the link is up */
	save("connect-during-handshake");

	hello_v(OP_BATCH, TPW_PEER_PROTO_MAJOR, 1); /* both Hellos in one read */
	hello(1);
	save("second-hello");

	/* Data connections that do not fit. */
	data_hello(1, 12345, 0);
	save("data-hello-unknown-link");

	hello(2);
	data_hello(1, FUZZ_PEER_LINK_ID, 5);
	save("data-hello-bad-index");

	hello(2);
	data_hello(1, FUZZ_PEER_LINK_ID, 0);
	data_hello(2, FUZZ_PEER_LINK_ID, 0);
	save("data-hello-index-twice");

	hello(2);
	data_hello(1 | OP_HANGUP, FUZZ_PEER_LINK_ID, 0);
	save("data-hangs-up-before-up");

	hello(0);
	save("hello-no-data-conns");

	hello_v(0, 1, 1);
	save("wrong-version");

	hello_v(0 | OP_HANGUP, TPW_PEER_PROTO_MAJOR, 1);
	rec_raw(1, garbage, sizeof(garbage) - 1);
	save("hello-hangs-up-garbage-data");
	return 0;
}
