/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Writes the seed corpus of the frame fuzz target: one valid frame of each client message type,
 * a few valid daemon frames, peer frames of the handshake, pipe traffic and RDMA set-up, and
 * broken frames (bad header fields, cut or garbage protobuf, rule violations). Names carry the expected verdict (see replay_frame.c). Run once by hand,
 * `gen_corpus tests/fuzz/corpus`, and commit the files; it is not part of the test run.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "frame.h"
#include "validate.h"

static const char *outdir;

static void save(const char *name, const uint8_t *buf, size_t len)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s.bin", outdir, name);
	f = fopen(path, "wb");
	if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
		perror(path);
		exit(1);
	}
}

/* Saves a frame of @msg followed by @tail_len bytes of tail (0x5a), header fields as given. */
static void frame(const char *name, const ProtobufCMessage *msg, uint32_t tail_len, uint16_t nfds)
{
	size_t n = tpw_frame_size(msg);
	uint8_t *buf = calloc(1, n + tail_len);

	if (!buf)
		exit(1);
	n = tpw_frame_pack(msg, tail_len, nfds, 1, buf);
	memset(buf + n, 0x5a, tail_len);
	save(name, buf, n + tail_len);
	free(buf);
}

static void client(const char *name, Tpw__V1__ClientMsg *m, uint32_t tail_len, uint16_t nfds)
{
	frame(name, &m->base, tail_len, nfds);
}

/* Connects with TP_CONNECT_EXPECT_PEER (Connect.expect_remote, expect_peers: fields 840 and
 * 841): the forms a client sends, and what validation refuses (NONE stated, peers without
 * REMOTE_PEERS or none with it, an empty identity, 33 identities). */
static void gen_connect_expect_peer(Tpw__V1__ClientMsg *m, Tpw__V1__Connect *c)
{
	static char *peers[TPW_REMOTE_PEERS_MAX + 1];
	static char *two[] = { "cert:gn02", "psk" }, *empty[] = { "" };

	for (unsigned i = 0; i <= TPW_REMOTE_PEERS_MAX; i++)
		peers[i] = "psk";
	c->pipe_id = 2;
	c->address = "tpip://gn02:7420/trainer0";
	c->expect_remote = TPW__V1__REMOTE_ACCESS__REMOTE_PEERS;
	c->expect_peers = two;
	c->n_expect_peers = 2;
	client("client-ok-connect-expect-peers", m, 0, 0);
	c->expect_peers = peers;
	c->n_expect_peers = TPW_REMOTE_PEERS_MAX;
	client("client-ok-connect-expect-32-peers", m, 0, 0);
	c->n_expect_peers = TPW_REMOTE_PEERS_MAX + 1;
	client("client-bad-connect-expect-33-peers", m, 0, 0);
	c->expect_peers = empty;
	c->n_expect_peers = 1;
	client("client-bad-connect-expect-empty-peer", m, 0, 0);
	c->n_expect_peers = 0;
	client("client-bad-connect-expect-peers-none-named", m, 0, 0);
	c->expect_remote = TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER;
	client("client-ok-connect-expect-any-peer", m, 0, 0);
	c->expect_peers = two;
	c->n_expect_peers = 2;
	client("client-bad-connect-expect-any-peer-with-peers", m, 0, 0);
	c->n_expect_peers = 0;
	c->expect_remote = TPW__V1__REMOTE_ACCESS__REMOTE_NONE;
	client("client-bad-connect-expect-none", m, 0, 0);
	c->expect_remote = (Tpw__V1__RemoteAccess)7;
	client("client-bad-connect-expect-unknown", m, 0, 0);
	c->expect_remote = TPW__V1__REMOTE_ACCESS__REMOTE_UNSPECIFIED;
	c->expect_peers = NULL;
	c->pipe_id = 1;
	c->address = "trainer0";
}

static void gen_session(void)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Hello h = TPW__V1__HELLO__INIT;
	Tpw__V1__Listen l = TPW__V1__LISTEN__INIT;
	Tpw__V1__ListenerClose lc = TPW__V1__LISTENER_CLOSE__INIT;
	Tpw__V1__Connect c = TPW__V1__CONNECT__INIT;
	Tpw__V1__CtlRequest ctl = TPW__V1__CTL_REQUEST__INIT;
	Tpw__V1__PipeClose pc = TPW__V1__PIPE_CLOSE__INIT;

	h.major = TPW_PROTO_MAJOR;
	h.role = TPW__V1__ROLE__ROLE_CLIENT;
	h.name = "trainer:1234";
	h.cma_probe_addr = 0x7ffd12345678ull;
	h.cma_probe_value = 0x1122334455667788ull;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_HELLO;
	m.hello = &h;
	client("client-ok-hello", &m, 0, 0);
	client("client-bad-tail-on-hello", &m, 3, 0);
	h.role = TPW__V1__ROLE__ROLE_CONTROL;
	client("client-ok-hello-control", &m, 0, 0);
	h.role = 7;
	client("client-bad-hello-role", &m, 0, 0);

	l.req_id = 1;
	l.name = "trainer0";
	l.access = TPW__V1__ACCESS__ACCESS_GROUP;
	l.gid = 100;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTEN;
	m.listen = &l;
	client("client-ok-listen", &m, 0, 0);
	l.name = "bad name";
	client("client-bad-listen-name", &m, 0, 0);

	lc.listener_id = 3;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTENER_CLOSE;
	m.listener_close = &lc;
	client("client-ok-listener-close", &m, 0, 0);

	c.req_id = 2;
	c.pipe_id = 1;
	c.address = "trainer0";
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CONNECT;
	m.connect = &c;
	client("client-ok-connect", &m, 0, 0);
	c.pipe_id = 1ull << 63;
	client("client-bad-connect-pipe-id", &m, 0, 0);
	gen_connect_expect_peer(&m, &c);

	ctl.req_id = 9;
	ctl.what = TPW__V1__CTL_WHAT__CTL_PIPES;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CTL;
	m.ctl = &ctl;
	client("client-ok-ctl-pipes", &m, 0, 0);

	pc.pipe_id = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_PIPE_CLOSE;
	m.pipe_close = &pc;
	client("client-ok-pipe-close", &m, 0, 0);
	client("client-bad-fd-on-pipe-close", &m, 0, 1);
}

static void gen_buffers(void)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRegister br = TPW__V1__BUFFER_REGISTER__INIT;
	Tpw__V1__BufferRelease rel = TPW__V1__BUFFER_RELEASE__INIT;

	br.req_id = 4;
	br.buf_id = 1;
	br.gen = 1;
	br.size = 1 << 20;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &br;
	client("client-ok-buffer-register", &m, 0, 1);
	client("client-bad-buffer-register-no-fd", &m, 0, 0);
	rel.buf_id = 1;
	rel.gen = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_RELEASE;
	m.buffer_release = &rel;
	client("client-ok-buffer-release", &m, 0, 0);
}

static void gen_write(void)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Write w = TPW__V1__WRITE__INIT;
	Tpw__V1__Segment s[3] = { TPW__V1__SEGMENT__INIT, TPW__V1__SEGMENT__INIT,
				  TPW__V1__SEGMENT__INIT };
	Tpw__V1__ShmRef shm = TPW__V1__SHM_REF__INIT;
	Tpw__V1__Payload p = TPW__V1__PAYLOAD__INIT;
	Tpw__V1__Tensor t[2] = { TPW__V1__TENSOR__INIT, TPW__V1__TENSOR__INIT };
	Tpw__V1__Device dev = TPW__V1__DEVICE__INIT;
	Tpw__V1__Payload *ps[] = { &p };
	Tpw__V1__Tensor *ts[] = { &t[0], &t[1] };

	w.pipe_id = 1;
	w.write_id = 1;
	w.metadata = (ProtobufCBinaryData){ 4, (uint8_t *)"meta" };
	m.body_case = TPW__V1__CLIENT_MSG__BODY_WRITE;
	m.write = &w;
	client("client-ok-write-empty", &m, 0, 0);

	s[0].length = 16;
	s[0].loc_case = TPW__V1__SEGMENT__LOC_INLINE_OFF;
	p.data = &s[0];
	p.metadata = (ProtobufCBinaryData){ 2, (uint8_t *)"pm" };
	w.n_payloads = 1;
	w.payloads = ps;
	client("client-ok-write-inline", &m, 16, 0);
	client("client-bad-write-inline-outside-tail", &m, 15, 0);
	client("client-bad-write-with-fd", &m, 16, 1);

	shm.buf_id = 1;
	shm.gen = 1;
	shm.offset = 4096;
	s[1].length = 1 << 20;
	s[1].loc_case = TPW__V1__SEGMENT__LOC_SHM;
	s[1].shm = &shm;
	s[2].length = 65536;
	s[2].loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	s[2].cma_addr = 0x7f0000000000ull;
	dev.type = TPW__V1__DEVICE_TYPE__DEVICE_CPU;
	t[0].data = &s[1];
	t[0].device = &dev;
	t[1].data = &s[2];
	w.n_tensors = 2;
	w.tensors = ts;
	client("client-ok-write-mixed", &m, 16, 0);
	s[2].cma_addr = UINT64_MAX - 100;
	client("client-bad-write-cma-wraps", &m, 16, 0);
}

/* Broadcast (issue 25): a valid one, one without targets, one without a message. */
static void gen_broadcast(void)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Broadcast b = TPW__V1__BROADCAST__INIT;
	Tpw__V1__Write w = TPW__V1__WRITE__INIT;
	Tpw__V1__Segment s = TPW__V1__SEGMENT__INIT;
	Tpw__V1__Payload p = TPW__V1__PAYLOAD__INIT;
	Tpw__V1__Payload *ps[] = { &p };
	Tpw__V1__BroadcastTarget t[2] = { TPW__V1__BROADCAST_TARGET__INIT,
					  TPW__V1__BROADCAST_TARGET__INIT };
	Tpw__V1__BroadcastTarget *tp[] = { &t[0], &t[1] };

	s.length = 16;
	s.loc_case = TPW__V1__SEGMENT__LOC_INLINE_OFF;
	p.data = &s;
	w.n_payloads = 1;
	w.payloads = ps;
	t[0].pipe_id = 1;
	t[0].write_id = 1;
	t[1].pipe_id = 1ull << 63;
	t[1].write_id = 2;
	b.write = &w;
	b.n_targets = 2;
	b.targets = tp;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BROADCAST;
	m.broadcast = &b;
	client("client-ok-broadcast-inline", &m, 16, 0);
	client("client-bad-broadcast-inline-outside-tail", &m, 15, 0);
	b.n_targets = 0;
	client("client-bad-broadcast-no-targets", &m, 16, 0);
	b.n_targets = 2;
	b.write = NULL;
	client("client-bad-broadcast-no-message", &m, 0, 0);
}

static void gen_read(void)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Read r = TPW__V1__READ__INIT;
	Tpw__V1__Segment s = TPW__V1__SEGMENT__INIT;
	Tpw__V1__ShmRef shm = TPW__V1__SHM_REF__INIT;
	Tpw__V1__Segment *ss[] = { &s };

	r.pipe_id = 1ull << 63;
	r.msg_id = 1;
	r.ack_eager = true;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_READ;
	m.read = &r;
	client("client-ok-read-ack", &m, 0, 0);
	r.ack_eager = false;
	r.discard = true;
	client("client-ok-read-discard", &m, 0, 0);
	r.discard = false;
	shm.buf_id = 2;
	shm.gen = 1;
	s.length = 1 << 20;
	s.loc_case = TPW__V1__SEGMENT__LOC_SHM;
	s.shm = &shm;
	r.n_tensors = 1;
	r.tensors = ss;
	client("client-ok-read-shm", &m, 0, 0);
	r.ack_eager = true;
	client("client-bad-read-ack-with-segments", &m, 0, 0);
	r.ack_eager = false;
	s.loc_case = TPW__V1__SEGMENT__LOC_INLINE_OFF;
	s.inline_off = 0;
	client("client-bad-read-inline", &m, 0, 0);
}

static void gen_cancel(void)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Cancel c = TPW__V1__CANCEL__INIT;

	c.pipe_id = 1;
	c.kind = TPW__V1__CANCEL_KIND__CANCEL_WRITE;
	c.id = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CANCEL;
	m.cancel = &c;
	client("client-ok-cancel-write", &m, 0, 0);
	c.pipe_id = 1ull << 63;
	c.kind = TPW__V1__CANCEL_KIND__CANCEL_READ;
	client("client-ok-cancel-read", &m, 0, 0);
	c.kind = TPW__V1__CANCEL_KIND__CANCEL_UNSPECIFIED;
	client("client-bad-cancel-kind", &m, 0, 0);
	c.kind = TPW__V1__CANCEL_KIND__CANCEL_READ;
	c.id = 0;
	client("client-bad-cancel-zero-id", &m, 0, 0);
}

/* Channel items as messages (ChanOp fields 610-612): a WRITE of message items (one empty), one
 * whose descriptor does not add up (a valid frame: the daemon fails that op), and the READs of a
 * message read's two steps; broken: descriptors on a READ, a drop without a take. */
static void gen_chan_msg(void)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__Descriptor d[2] = { TPW__V1__DESCRIPTOR__INIT, TPW__V1__DESCRIPTOR__INIT };
	Tpw__V1__Descriptor *dp[2] = { &d[0], &d[1] };
	Tpw__V1__PayloadDesc pd = TPW__V1__PAYLOAD_DESC__INIT, *pdp = &pd;
	Tpw__V1__TensorDesc td = TPW__V1__TENSOR_DESC__INIT, *tdp = &td;
	Tpw__V1__Device dev = TPW__V1__DEVICE__INIT;
	Tpw__V1__ShmRef shm[2] = { TPW__V1__SHM_REF__INIT, TPW__V1__SHM_REF__INIT };
	Tpw__V1__Segment g[2] = { TPW__V1__SEGMENT__INIT, TPW__V1__SEGMENT__INIT };
	Tpw__V1__Segment *gp[2] = { &g[0], &g[1] };
	uint64_t lens[2] = { 12, 0 };
	static uint8_t meta[] = "meta";

	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &op;
	op.req_id = 1;
	op.chan_id = 1;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	op.n_lengths = 2;
	op.lengths = lens;
	op.n_msgs = 2;
	op.msgs = dp;
	d[0].metadata = (ProtobufCBinaryData){ 4, meta };
	d[0].n_payloads = 1;
	d[0].payloads = &pdp;
	d[0].n_tensors = 1;
	d[0].tensors = &tdp;
	pd.length = 4;
	pd.metadata = (ProtobufCBinaryData){ 4, meta };
	td.length = 8;
	dev.type = TPW__V1__DEVICE_TYPE__DEVICE_CUDA;
	td.device = &dev;
	td.target = &dev;
	client("client-ok-chan-write-msg", &m, 12, 0);
	pd.length = UINT64_MAX - 3; /* adds up to 4 by wrapping: the daemon refuses the op */
	client("client-ok-chan-write-msg-bad-lengths", &m, 12, 0);
	pd.length = 4;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.n_lengths = 0;
	client("client-bad-chan-read-with-msgs", &m, 0, 0);
	op.n_msgs = 0;
	op.msg = true;
	client("client-ok-chan-read-msg", &m, 0, 0);
	op.take_held = true;
	client("client-ok-chan-read-msg-take-inline", &m, 0, 0);
	for (int i = 0; i < 2; i++) {
		shm[i].buf_id = 1;
		shm[i].gen = 1;
		shm[i].offset = (uint64_t)i * 4096;
		g[i].length = 6;
		g[i].loc_case = TPW__V1__SEGMENT__LOC_SHM;
		g[i].shm = &shm[i];
	}
	op.n_segments = 2;
	op.segments = gp;
	client("client-ok-chan-read-msg-take-slots", &m, 0, 0);
	op.take_held = false;
	client("client-bad-chan-read-msg-slots-without-take", &m, 0, 0);
	op.n_segments = 0;
	op.msg_drop = true;
	client("client-bad-chan-drop-without-take", &m, 0, 0);
	op.take_held = true;
	client("client-ok-chan-drop", &m, 0, 0);
	op.take_held = false; /* a packed batch read into one buffer (ChanOp.pack) */
	op.msg_drop = false;
	op.msg = false;
	op.pack = true;
	op.max_items = 16;
	op.n_segments = 1;
	g[0].length = 8192;
	client("client-ok-chan-read-packed", &m, 0, 0);
	op.n_segments = 2;
	client("client-bad-chan-read-packed-two-rooms", &m, 0, 0);
	op.n_segments = 1;
	op.msg = true;
	client("client-bad-chan-read-packed-msg", &m, 0, 0);
}

/* Channel ops and answers across hosts, which carry their items in the data tail: a peer's
 * WRITE of inline items (one of them streamed), a batch read's answer and one item's; the same
 * for a client's WRITE by segments with inline items, and a daemon's batch answer. Broken: items
 * one byte short of or past the tail, a tail on a READ and on an answer that holds its item. */
static void gen_chan_tails(void)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerChanOp pc = TPW__V1__PEER_CHAN_OP__INIT;
	Tpw__V1__PeerChanReply pr = TPW__V1__PEER_CHAN_REPLY__INIT;
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	Tpw__V1__ShmRef shm = TPW__V1__SHM_REF__INIT;
	Tpw__V1__Segment g[2] = { TPW__V1__SEGMENT__INIT, TPW__V1__SEGMENT__INIT };
	Tpw__V1__Segment *gp[2] = { &g[0], &g[1] };
	uint64_t lens[3] = { 5, 7, 1u << 20 };
	protobuf_c_boolean streamed[3] = { 0, 0, 1 };

	pm.body_case = TPW__V1__PEER_MSG__BODY_CHAN_OP;
	pm.chan_op = &pc;
	pc.op = &op;
	pc.uid = 1000;
	pc.pid = 42;
	op.req_id = 1;
	op.chan_id = 1;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	op.n_lengths = 2;
	op.lengths = lens;
	frame("peer-ok-chan-write-inline", &pm.base, 12, 0);
	frame("peer-bad-chan-write-short-tail", &pm.base, 11, 0);
	frame("peer-bad-chan-write-long-tail", &pm.base, 13, 0);
	op.n_lengths = 3;
	op.n_streamed = 3;
	op.streamed = streamed;
	frame("peer-ok-chan-write-streamed", &pm.base, 12, 0);
	op.n_lengths = 0;
	op.n_streamed = 0;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.max_items = 16;
	frame("peer-ok-chan-read-many", &pm.base, 0, 0);
	frame("peer-bad-chan-read-with-tail", &pm.base, 4, 0);
	op.max_items = 0;

	pm.body_case = TPW__V1__PEER_MSG__BODY_CHAN_REPLY;
	pm.chan_reply = &pr;
	pr.reply = &r;
	r.req_id = 1;
	r.status = TPW__V1__STATUS__STATUS_OK;
	r.n_lengths = 2;
	r.lengths = lens;
	frame("peer-ok-chan-reply-batch", &pm.base, 12, 0);
	frame("peer-bad-chan-reply-batch-short-tail", &pm.base, 11, 0);
	r.n_lengths = 1;
	frame("peer-ok-chan-reply-one", &pm.base, 5, 0);
	r.n_lengths = 0;
	r.held_len = 1u << 20;
	frame("peer-ok-chan-reply-held", &pm.base, 0, 0);
	frame("peer-bad-chan-reply-held-with-tail", &pm.base, 5, 0);
	r.held_len = 0;

	dm.body_case = TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY;
	dm.chan_reply = &r;
	r.n_lengths = 2;
	frame("daemon-ok-chan-reply-batch", &dm.base, 12, 0);
	frame("daemon-bad-chan-reply-batch-long-tail", &dm.base, 13, 0);
	r.n_lengths = 0;

	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &op;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE;
	op.n_lengths = 2;
	lens[1] = 1u << 20;
	g[0].length = 5;
	g[0].loc_case = TPW__V1__SEGMENT__LOC_INLINE_OFF;
	g[0].inline_off = 0;
	shm.buf_id = 1;
	shm.gen = 1;
	g[1].length = 1u << 20;
	g[1].loc_case = TPW__V1__SEGMENT__LOC_SHM;
	g[1].shm = &shm;
	op.n_segments = 2;
	op.segments = gp;
	client("client-ok-chan-write-inline-and-shm", &m, 5, 0);
	client("client-bad-chan-write-inline-and-shm-long-tail", &m, 6, 0);
}

/* Work queue questions and answers as messages (WqOp, WqReply 650-655): a SUBMIT of a message
 * inline, empty and by reference; a TAKE by descriptor, a read into slots and inline, a drop;
 * the answers of a take and a read; a peer's op inline. Broken: a payload by reference without a
 * descriptor or with a tail, a read without its question, take and drop mixed, a drop on a
 * TAKE, a descriptor on an answer that holds nothing, a copied read with a tail, a peer's op by
 * reference. */
static void gen_wq_msg(void)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerWqOp pw = TPW__V1__PEER_WQ_OP__INIT;
	Tpw__V1__WqOp op = TPW__V1__WQ_OP__INIT;
	Tpw__V1__WqReply r = TPW__V1__WQ_REPLY__INIT;
	Tpw__V1__Descriptor d = TPW__V1__DESCRIPTOR__INIT;
	Tpw__V1__PayloadDesc pd = TPW__V1__PAYLOAD_DESC__INIT, *pdp = &pd;
	Tpw__V1__ShmRef shm = TPW__V1__SHM_REF__INIT;
	Tpw__V1__Segment g = TPW__V1__SEGMENT__INIT, *gp[2] = { &g, &g };
	static uint8_t meta[] = "meta";

	m.body_case = TPW__V1__CLIENT_MSG__BODY_WQ_OP;
	m.wq_op = &op;
	op.req_id = 1;
	op.wq_id = 1;
	op.op = TPW__V1__WQ_OP_KIND__WQ_OP_SUBMIT;
	d.metadata = (ProtobufCBinaryData){ 4, meta };
	d.n_payloads = 1;
	d.payloads = &pdp;
	pd.length = 12;
	op.msg_desc = &d;
	client("client-ok-wq-submit-msg", &m, 12, 0);
	d.n_payloads = 0;
	client("client-ok-wq-submit-msg-empty", &m, 0, 0);
	d.n_payloads = 1;
	pd.length = 1u << 24;
	shm.buf_id = 1;
	shm.gen = 1;
	g.length = 1u << 24;
	g.loc_case = TPW__V1__SEGMENT__LOC_SHM;
	g.shm = &shm;
	op.segment = &g;
	client("client-ok-wq-submit-msg-shm", &m, 0, 0);
	client("client-bad-wq-submit-segment-and-tail", &m, 4, 0);
	op.msg_desc = NULL;
	client("client-bad-wq-submit-segment-without-descriptor", &m, 0, 0);
	op.segment = NULL;
	op.op = TPW__V1__WQ_OP_KIND__WQ_OP_TAKE;
	op.msg = true;
	client("client-ok-wq-take-msg", &m, 0, 0);
	op.msg = false;
	op.msg_read = true;
	client("client-bad-wq-read-without-question", &m, 0, 0);
	op.question_id = 3;
	client("client-ok-wq-read-inline", &m, 0, 0);
	g.length = 6;
	op.n_segments = 2;
	op.segments = gp;
	client("client-ok-wq-read-slots", &m, 0, 0);
	op.n_segments = 0;
	op.msg_read = false;
	op.msg_drop = true;
	client("client-bad-wq-drop-on-take", &m, 0, 0);
	op.op = TPW__V1__WQ_OP_KIND__WQ_OP_ANSWER;
	client("client-ok-wq-drop", &m, 0, 0);
	op.msg = true;
	client("client-bad-wq-take-and-drop", &m, 0, 0);
	op.msg_drop = false;

	dm.body_case = TPW__V1__DAEMON_MSG__BODY_WQ_REPLY;
	dm.wq_reply = &r;
	r.req_id = 1;
	r.status = TPW__V1__STATUS__STATUS_OK;
	r.question_id = 3;
	r.msg_held = true;
	r.msg_len = 12;
	r.msg_desc = &d;
	pd.length = 12;
	frame("daemon-ok-wq-reply-msg-held", &dm.base, 0, 0);
	r.msg_held = false;
	frame("daemon-bad-wq-reply-descriptor-not-held", &dm.base, 0, 0);
	r.msg_desc = NULL;
	r.msg_len = 0;
	r.msg_copied = true;
	frame("daemon-ok-wq-reply-copied", &dm.base, 0, 0);
	r.length = 4;
	frame("daemon-bad-wq-reply-copied-with-tail", &dm.base, 4, 0);

	pm.body_case = TPW__V1__PEER_MSG__BODY_WQ_OP;
	pm.wq_op = &pw;
	pw.op = &op;
	op.msg = false;
	op.op = TPW__V1__WQ_OP_KIND__WQ_OP_SUBMIT;
	op.question_id = 0;
	op.msg_desc = &d;
	frame("peer-ok-wq-submit-msg", &pm.base, 12, 0);
	op.segment = &g;
	g.length = 12;
	frame("peer-bad-wq-submit-by-reference", &pm.base, 0, 0);
}

static void gen_daemon(void)
{
	Tpw__V1__DaemonMsg m = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__Descriptor d = TPW__V1__DESCRIPTOR__INIT;
	Tpw__V1__PayloadDesc pd = TPW__V1__PAYLOAD_DESC__INIT;
	Tpw__V1__PayloadDesc *pds[] = { &pd };
	Tpw__V1__WriteDone wd = TPW__V1__WRITE_DONE__INIT;
	Tpw__V1__FlowCredit fc = TPW__V1__FLOW_CREDIT__INIT;

	pd.length = 32;
	d.pipe_id = 1;
	d.msg_id = 1;
	d.eager = true;
	d.n_payloads = 1;
	d.payloads = pds;
	m.body_case = TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR;
	m.descriptor = &d;
	frame("daemon-ok-descriptor-eager", &m.base, 32, 0);
	frame("daemon-bad-descriptor-short-tail", &m.base, 31, 0);
	wd.pipe_id = 1;
	wd.write_id = 1;
	wd.status = TPW__V1__STATUS__STATUS_PEER_DIED;
	wd.message = "peer died";
	m.body_case = TPW__V1__DAEMON_MSG__BODY_WRITE_DONE;
	m.write_done = &wd;
	frame("daemon-ok-write-done", &m.base, 0, 0);
	frame("daemon-bad-write-done-with-fd", &m.base, 0, 1);
	fc.pipe_id = 1;
	fc.messages = 2;
	fc.bytes = 2ull * TPW_FRAME_MAX_HARD;
	m.body_case = TPW__V1__DAEMON_MSG__BODY_FLOW_CREDIT;
	m.flow_credit = &fc;
	frame("daemon-ok-flow-credit", &m.base, 0, 0);
	fc.bytes++;
	frame("daemon-bad-flow-credit-bytes", &m.base, 0, 0);
	fc.messages = 0;
	fc.bytes = 0;
	frame("daemon-bad-flow-credit-no-message", &m.base, 0, 0);
}

/* Daemon <-> daemon control frames: the handshake, pipe traffic, RDMA set-up. */
static void gen_peer_handshake(void)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerHello h = TPW__V1__PEER_HELLO__INIT;
	Tpw__V1__PeerAuth a = TPW__V1__PEER_AUTH__INIT;
	Tpw__V1__PeerReady rd = TPW__V1__PEER_READY__INIT;
	Tpw__V1__PeerDataHello dh = TPW__V1__PEER_DATA_HELLO__INIT;
	static uint8_t bytes[32];
	static char *backends[] = { "mpt", "basic", "rdma" };

	h.major = TPW_PROTO_MAJOR;
	h.host = "hostY";
	h.boot_id = (ProtobufCBinaryData){ 16, bytes };
	h.instance = 42;
	h.n_backends = 3;
	h.backends = backends;
	h.data_conns = 4;
	h.nonce = (ProtobufCBinaryData){ 32, bytes };
	h.listen_port = 7420;
	m.body_case = TPW__V1__PEER_MSG__BODY_HELLO;
	m.hello = &h;
	frame("peer-ok-hello", &m.base, 0, 0);
	frame("peer-bad-hello-with-fd", &m.base, 0, 1);
	frame("peer-bad-hello-with-tail", &m.base, 8, 0);
	h.boot_id.len = 15;
	frame("peer-bad-hello-boot-id-15", &m.base, 0, 0);
	h.boot_id.len = 16;
	h.nonce.len = 31;
	frame("peer-bad-hello-nonce-31", &m.base, 0, 0);
	h.nonce.len = 32;
	h.data_conns = 17;
	frame("peer-bad-hello-17-data-conns", &m.base, 0, 0);
	h.data_conns = 4;
	h.mac = (ProtobufCBinaryData){ 20, bytes };
	frame("peer-bad-hello-mac-20", &m.base, 0, 0);

	a.mac = (ProtobufCBinaryData){ 32, bytes };
	m.body_case = TPW__V1__PEER_MSG__BODY_AUTH;
	m.auth = &a;
	frame("peer-ok-auth", &m.base, 0, 0);
	a.mac.len = 0;
	frame("peer-bad-auth-no-mac", &m.base, 0, 0);

	rd.link_id = 7;
	rd.data_up = true;
	m.body_case = TPW__V1__PEER_MSG__BODY_READY;
	m.ready = &rd;
	frame("peer-ok-ready", &m.base, 0, 0);

	dh.link_id = 7;
	dh.index = 3;
	dh.mac = (ProtobufCBinaryData){ 32, bytes };
	m.body_case = TPW__V1__PEER_MSG__BODY_DATA_HELLO;
	m.data_hello = &dh;
	frame("peer-ok-data-hello", &m.base, 0, 0);
	dh.mac.len = 16;
	frame("peer-bad-data-hello-mac-16", &m.base, 0, 0);
}

static void gen_peer_pipes(void)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerConnect c = TPW__V1__PEER_CONNECT__INIT;
	Tpw__V1__PeerDescriptor pd = TPW__V1__PEER_DESCRIPTOR__INIT;
	Tpw__V1__Descriptor d = TPW__V1__DESCRIPTOR__INIT;
	Tpw__V1__PayloadDesc pl = TPW__V1__PAYLOAD_DESC__INIT;
	Tpw__V1__PayloadDesc *pls[] = { &pl };
	Tpw__V1__PeerReadReq rr = TPW__V1__PEER_READ_REQ__INIT;
	Tpw__V1__PeerRdmaRegion reg = TPW__V1__PEER_RDMA_REGION__INIT;
	Tpw__V1__PeerRdmaRegion *regs[TPW_DEFAULT_SEGMENTS_MAX + 1];
	Tpw__V1__PeerPing ping = TPW__V1__PEER_PING__INIT;

	c.pipe_id = 1;
	c.name = "trainer0";
	c.remote_name = "worker:7";
	m.body_case = TPW__V1__PEER_MSG__BODY_CONNECT;
	m.connect = &c;
	frame("peer-ok-connect", &m.base, 0, 0);
	c.name = "bad name";
	frame("peer-bad-connect-name", &m.base, 0, 0);

	pl.length = 32;
	d.msg_id = 1;
	d.eager = true;
	d.n_payloads = 1;
	d.payloads = pls;
	pd.pipe_id = 1;
	pd.descriptor = &d;
	m.body_case = TPW__V1__PEER_MSG__BODY_DESCRIPTOR;
	m.descriptor = &pd;
	frame("peer-ok-descriptor-eager", &m.base, 32, 0);
	frame("peer-bad-descriptor-short-tail", &m.base, 31, 0);
	pd.descriptor = NULL;
	frame("peer-bad-descriptor-missing", &m.base, 0, 0);

	reg.addr = 0x10000;
	reg.rkey = 5;
	reg.length = 4096;
	for (size_t i = 0; i < TPW_DEFAULT_SEGMENTS_MAX + 1; i++)
		regs[i] = &reg;
	rr.pipe_id = 1;
	rr.msg_id = 1;
	rr.xfer_id = 9;
	rr.n_rdma = 2;
	rr.rdma = regs;
	m.body_case = TPW__V1__PEER_MSG__BODY_READ_REQ;
	m.read_req = &rr;
	frame("peer-ok-read-req-rdma", &m.base, 0, 0);
	rr.n_rdma = TPW_DEFAULT_SEGMENTS_MAX + 1;
	frame("peer-bad-read-req-too-many-regions", &m.base, 0, 0);

	ping.t_ns = 123456789;
	m.body_case = TPW__V1__PEER_MSG__BODY_PING;
	m.ping = &ping;
	frame("peer-ok-ping", &m.base, 0, 0);
	frame("peer-bad-ping-with-tail", &m.base, 4, 0);
}

static void gen_peer_rdma(void)
{
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	Tpw__V1__PeerRdma r = TPW__V1__PEER_RDMA__INIT;
	static uint8_t rec[TPW_RDMA_QP_RECORD_BYTES];
	ProtobufCBinaryData qps[] = { { sizeof(rec), rec } };

	r.ports = 1;
	r.n_qps = 1;
	r.qps = qps;
	m.body_case = TPW__V1__PEER_MSG__BODY_RDMA;
	m.rdma = &r;
	frame("peer-ok-rdma", &m.base, 0, 0);
	qps[0].len = sizeof(rec) - 1;
	frame("peer-bad-rdma-short-record", &m.base, 0, 0);
	qps[0].len = sizeof(rec);
	r.ports = TPW_RDMA_PORTS_MAX + 1;
	frame("peer-bad-rdma-too-many-ports", &m.base, 0, 0);
}

/* Header-level damage applied to a valid Hello frame. */
static void gen_broken(void)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Hello h = TPW__V1__HELLO__INIT;
	static const uint8_t garbage[] = { 0x3a, 0x05, 0xff, 0xff, 0xff, 0xff, 0xff };
	static const uint8_t unknown_field[] = { 0x78, 0x01 }; /* field 15: no body */
	uint8_t buf[256];
	struct tpw_hdr hd = { TPW_MAGIC, TPW_WIRE_VERSION, 0, 0, 0, 1 };
	size_t n;

	h.major = 1;
	h.role = TPW__V1__ROLE__ROLE_CLIENT;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_HELLO;
	m.hello = &h;
	n = tpw_frame_pack(&m.base, 0, 0, 1, buf);
	buf[0] ^= 0xff;
	save("client-bad-magic", buf, n);
	buf[0] ^= 0xff;
	buf[4] = 2;
	save("client-bad-version", buf, n);
	buf[4] = 1;
	buf[11] = 0x7f; /* msg_len far above frame_max */
	save("client-bad-oversize", buf, n);
	n = tpw_frame_pack(&m.base, 0, 0, 1, buf);
	save("client-bad-truncated", buf, n - 2);

	hd.msg_len = sizeof(garbage);
	tpw_hdr_pack(&hd, buf);
	memcpy(buf + TPW_HDR_SIZE, garbage, sizeof(garbage));
	save("client-bad-garbage", buf, TPW_HDR_SIZE + sizeof(garbage));
	hd.msg_len = sizeof(unknown_field);
	tpw_hdr_pack(&hd, buf);
	memcpy(buf + TPW_HDR_SIZE, unknown_field, sizeof(unknown_field));
	save("client-bad-no-body", buf, TPW_HDR_SIZE + sizeof(unknown_field));
	save("daemon-bad-no-body", buf, TPW_HDR_SIZE + sizeof(unknown_field));
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s OUTDIR\n", argv[0]);
		return 2;
	}
	outdir = argv[1];
	gen_session();
	gen_buffers();
	gen_write();
	gen_broadcast();
	gen_read();
	gen_cancel();
	gen_chan_msg();
	gen_wq_msg();
	gen_daemon();
	gen_chan_tails();
	gen_peer_handshake();
	gen_peer_pipes();
	gen_peer_rdma();
	gen_broken();
	return 0;
}
