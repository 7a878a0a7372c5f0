/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Writes the seed corpus of the session fuzz target (fuzz_session.c): sequences of records in
 * which up to three clients say Hello, listen, connect, register shared buffers, write and read
 * messages (inline, eager and through shared buffers), close pipes and listeners, ask for
 * tpipctl tables, and hang up at awkward moments. Each seed is a valid conversation (or a
 * deliberate violation in an otherwise valid one) so that mutations start deep in the handlers.
 * Run once by hand, `gen_session_corpus tests/fuzz/corpus-session`, and commit the files.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "frame.h"
#include "validate.h"

#define OP_FD 0x04
#define OP_HANGUP 0x08
#define OP_BATCH 0x10
#define ACCEPTED_PIPE (1ull << 63 | 1) /* the first pipe a session accepts */

static const char *outdir;
static uint8_t seq_buf[1 << 16];
static size_t seq_len;
static uint64_t frame_seq[3];

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

/* One record: a frame of @m with @tail_len bytes of tail (0x5a) from client (op & 3). */
static void rec(uint8_t op, Tpw__V1__ClientMsg *m, uint32_t tail_len, uint16_t nfds)
{
	size_t n = tpw_frame_size(&m->base);
	uint8_t *buf = calloc(1, n + tail_len);

	if (!buf)
		abort();
	n = tpw_frame_pack(&m->base, tail_len, nfds, ++frame_seq[op & 3], buf);
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
	memset(frame_seq, 0, sizeof(frame_seq));
}

static void hello(uint8_t c, Tpw__V1__Role role)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Hello h = TPW__V1__HELLO__INIT;

	h.major = TPW_PROTO_MAJOR;
	h.minor = TPW_PROTO_MINOR;
	h.role = role;
	h.name = c ? "writer" : "reader";
	m.body_case = TPW__V1__CLIENT_MSG__BODY_HELLO;
	m.hello = &h;
	rec(c, &m, 0, 0);
}

static void listen_(uint8_t c, const char *name, Tpw__V1__Access access)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Listen l = TPW__V1__LISTEN__INIT;

	l.req_id = 1;
	l.name = (char *)name;
	l.access = access;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTEN;
	m.listen = &l;
	rec(c, &m, 0, 0);
}

static void connect_(uint8_t c, const char *address)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Connect k = TPW__V1__CONNECT__INIT;

	k.req_id = 2;
	k.pipe_id = 1;
	k.address = (char *)address;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CONNECT;
	m.connect = &k;
	rec(c, &m, 0, 0);
}

/* A connect of pipe @pipe_id with TP_CONNECT_EXPECT_PEER (Connect fields 840, 841): any
 * authenticated peer, or the peers @peers (NULL-terminated). */
static void connect_expect(uint8_t c, uint64_t pipe_id, const char *address, char **peers)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Connect k = TPW__V1__CONNECT__INIT;

	k.req_id = 3;
	k.pipe_id = pipe_id;
	k.address = (char *)address;
	k.expect_remote = peers ? TPW__V1__REMOTE_ACCESS__REMOTE_PEERS :
				  TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER;
	while (peers && peers[k.n_expect_peers])
		k.n_expect_peers++;
	k.expect_peers = peers;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CONNECT;
	m.connect = &k;
	rec(c, &m, 0, 0);
}

static void buffer(uint8_t c, uint64_t id, uint64_t size)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRegister b = TPW__V1__BUFFER_REGISTER__INIT;

	b.req_id = 3;
	b.buf_id = id;
	b.gen = 1;
	b.size = size;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &b;
	rec(c | OP_FD, &m, 0, 1);
}

/* Write of one payload of @len bytes: inline in the tail, or at @shm_off in buffer 1. */
static void write_(uint8_t c, uint64_t pipe, uint64_t len, bool shm, uint64_t shm_off)
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
		r.offset = shm_off;
		s.loc_case = TPW__V1__SEGMENT__LOC_SHM;
		s.shm = &r;
	} else {
		s.loc_case = TPW__V1__SEGMENT__LOC_INLINE_OFF;
		s.inline_off = 0;
	}
	p.data = &s;
	w.pipe_id = pipe;
	w.write_id = 7;
	w.n_payloads = 1;
	w.payloads = &pp;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_WRITE;
	m.write = &w;
	rec(c, &m, shm ? 0 : (uint32_t)len, 0);
}

/* Read of message @msg on @pipe into buffer 1 at offset 0 (@len bytes), or discarded. */
static void read_(uint8_t c, uint64_t pipe, uint64_t msg, uint64_t len, bool discard)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Read rd = TPW__V1__READ__INIT;
	Tpw__V1__Segment s = TPW__V1__SEGMENT__INIT, *sp = &s;
	Tpw__V1__ShmRef r = TPW__V1__SHM_REF__INIT;

	rd.pipe_id = pipe;
	rd.msg_id = msg;
	rd.discard = discard;
	if (!discard) {
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
	rec(c, &m, 0, 0);
}

static void pipe_close(uint8_t c, uint64_t pipe)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__PipeClose pc = TPW__V1__PIPE_CLOSE__INIT;

	pc.pipe_id = pipe;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_PIPE_CLOSE;
	m.pipe_close = &pc;
	rec(c, &m, 0, 0);
}

static void ctl(uint8_t c, Tpw__V1__CtlWhat what)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__CtlRequest q = TPW__V1__CTL_REQUEST__INIT;

	q.req_id = 9;
	q.what = what;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CTL;
	m.ctl = &q;
	rec(c, &m, 0, 0);
}

/* Reader (0) listens on "f", writer (1) connects; both register buffer 1 of 64 KiB. */
static void pipe_setup(void)
{
	hello(0, TPW__V1__ROLE__ROLE_CLIENT);
	listen_(0, "f", TPW__V1__ACCESS__ACCESS_OWNER);
	buffer(0, 1, 65536);
	hello(1, TPW__V1__ROLE__ROLE_CLIENT);
	buffer(1, 1, 65536);
	connect_(1, "f");
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s DIR\n", argv[0]);
		return 2;
	}
	outdir = argv[1];

	hello(0, TPW__V1__ROLE__ROLE_CLIENT);
	save("hello");

	hello(2, TPW__V1__ROLE__ROLE_CONTROL);
	ctl(2, TPW__V1__CTL_WHAT__CTL_STATUS);
	ctl(2, TPW__V1__CTL_WHAT__CTL_SESSIONS);
	ctl(2, TPW__V1__CTL_WHAT__CTL_LISTENERS);
	ctl(2, TPW__V1__CTL_WHAT__CTL_PIPES);
	save("ctl-tables");

	pipe_setup();
	write_(1, 1, 16, false, 0);
	read_(0, ACCEPTED_PIPE, 1, 16, false);
	pipe_close(1, 1);
	save("pipe-inline");

	pipe_setup();
	write_(1, 1, 4096, true, 0);
	read_(0, ACCEPTED_PIPE, 1, 4096, false);
	write_(1, 1, 8192, true, 4096);
	read_(0, ACCEPTED_PIPE, 2, 8192, true);
	pipe_close(0, ACCEPTED_PIPE);
	save("pipe-shm");

	pipe_setup();
	write_(1, 1, 65536, true, 1);
	write_(1, 1, 16, false, 0);
	save("pipe-shm-out-of-range");

	pipe_setup();
	write_(1 | OP_HANGUP, 1, 4096, true, 0);
	read_(0, ACCEPTED_PIPE, 1, 4096, false);
	save("writer-hangs-up");

	pipe_setup();
	write_(1, 1, 4096, true, 0);
	read_(0 | OP_HANGUP | OP_BATCH, ACCEPTED_PIPE, 1, 4096, false);
	write_(1, 1, 16, false, 0);
	save("reader-hangs-up-mid-read");

	hello(0, TPW__V1__ROLE__ROLE_CLIENT);
	listen_(0, "g", TPW__V1__ACCESS__ACCESS_OWNER);
	listen_(1, "g", TPW__V1__ACCESS__ACCESS_OWNER);
	hello(1, TPW__V1__ROLE__ROLE_CLIENT);
	listen_(1, "g", TPW__V1__ACCESS__ACCESS_OWNER);
	connect_(1, "missing");
	connect_(1, "g");
	save("listen-before-hello-and-taken");

	/* the far daemon's identity expected: to a tpip:// address (port 1: nothing listens), and
	 * to a local name, which the daemon refuses */
	hello(1, TPW__V1__ROLE__ROLE_CLIENT);
	connect_expect(1, 1, "tpip://127.0.0.1:1/f", (char *[]){ "psk", "cert:gn02", NULL });
	connect_expect(1, 2, "f", NULL);
	connect_expect(1, 3, "tpip://127.0.0.1:1/g", NULL);
	save("connect-expect-peer");
	return 0;
}
