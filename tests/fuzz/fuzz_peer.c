/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target for the peer protocol as the answering daemon sees it: bytes reach the real peer
 * listener of an in-process daemon (--peer-insecure, so plain TCP on 127.0.0.1) over up to four
 * loopback connections at once, and go through the accepted connection's first frame (PeerHello
 * or PeerDataHello), the handshake, the data connections joining the link's stripe (then raw
 * chunks, read by the stripe's receiver threads), and the control frames of an up link
 * (PeerConnect to a real listener, descriptors, read requests, consumed, pipe close, keepalives,
 * RDMA set-up). It is responsible for driving the daemon and for the invariants checked after
 * each input (no crash, every link, accepted connection, data dial, pipe, session and listener
 * gone once everything closed); not for TLS (OpenSSL's) nor for dialling (the daemon never dials
 * here), nor for the wire format alone (fuzz_frame.c).
 *
 * Before each input a local session (a socketpair, as fuzz_session.c does) says Hello and listens
 * on "fuzz" open to every peer daemon, so that a PeerConnect finds a listener. An input is a
 * sequence of records: op (1 byte), len (2 bytes, little endian), then len bytes.
 *   op & 0x03  which connection to the peer port (0..3), connected on first use; 0 is the one
 *              whose frames from the daemon the harness reads (link id, pipe id)
 *   op & 0x04  substitute the daemon's ids for the placeholders first (fuzz_peer.h); with 0x20:
 *              a sealed 64 KiB memfd rides with the bytes (SCM_RIGHTS)
 *   op & 0x08  that connection hangs up after sending
 *   op & 0x10  no event loop pass after this record (batch it with the next one)
 *   op & 0x20  the bytes go to the local session instead (ClientMsg frames: write, read, close
 *              on the pipe a PeerConnect opened)
 * Built as a libFuzzer target by clang (LLVMFuzzerTestOneInput, -DFUZZ_PEER_LIBFUZZER); the corpus
 * replays through fuzz_peer_run() in every build (replay_daemon.c). FUZZ_PEER_LOG=1 shows the
 * daemon's debug log and counters on stderr.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include "daemon.h"
#include "frame.h"
#include "fuzz_daemon.h"
#include "fuzz_peer.h"
#include "log.h"
#include "peer.h"
#include "pipe.h"
#include "session.h"

#define CONNS 4
#define PASSES_PER_RECORD 8
#define DRAIN_DEADLINE_NS (5ull * 1000 * 1000 * 1000)
#define VARINT_MAX 10

static struct tpd_daemon *daemon_;

/* What one input has open, and the ids the daemon chose so far. */
struct run {
	int conn[CONNS];
	int local;
	uint8_t rx[1 << 16]; /* connection 0's bytes from the daemon, not yet parsed */
	size_t rx_len;
	bool rx_broken; /* a frame too large to hold: stop parsing until it reconnects */
	uint64_t link_id, pipe_id;
};

static void adjust(struct tpd_config *cfg)
{
	snprintf(cfg->peer_listen, sizeof(cfg->peer_listen), "127.0.0.1:0");
	cfg->peer_insecure = true;
	cfg->no_rdma = true;
}

/* The frames in r->rx: keeps the link id of a PeerReady and the pipe id of an accepted
 * PeerConnectReply. */
static void parse_rx(struct run *r)
{
	while (!r->rx_broken && r->rx_len >= TPW_HDR_SIZE) {
		Tpw__V1__PeerMsg *m = NULL;
		struct tpw_hdr h;
		size_t total;

		if (tpw_hdr_parse(r->rx, sizeof(r->rx) - TPW_HDR_SIZE, &h) < 0) {
			r->rx_broken = true;
			return;
		}
		total = TPW_HDR_SIZE + (size_t)h.msg_len + h.data_len;
		if (r->rx_len < total)
			return;
		if (tpw_peer_msg_unpack(r->rx + TPW_HDR_SIZE, h.msg_len, &m) == 0) {
			if (m->body_case == TPW__V1__PEER_MSG__BODY_READY)
				r->link_id = m->ready->link_id;
			if (m->body_case == TPW__V1__PEER_MSG__BODY_CONNECT_REPLY &&
			    m->connect_reply->status == TPW__V1__STATUS__STATUS_OK)
				r->pipe_id = m->connect_reply->peer_pipe_id;
			tpw_peer_msg_free(m);
		}
		memmove(r->rx, r->rx + total, r->rx_len - total);
		r->rx_len -= total;
	}
}

/* Reads and drops whatever the daemon sent on @fd (closing any fds that came with it); on
 * connection 0 (@rx) its frames are parsed first. */
static void drain(struct run *r, int fd, bool rx)
{
	char buf[65536];
	ssize_t n;

	while ((n = fuzz_daemon_recv(fd, buf, sizeof(buf))) > 0) {
		if (!rx || r->rx_broken)
			continue;
		if ((size_t)n > sizeof(r->rx) - r->rx_len) {
			r->rx_broken = true;
			continue;
		}
		memcpy(r->rx + r->rx_len, buf, (size_t)n);
		r->rx_len += (size_t)n;
		parse_rx(r);
	}
}

/* One pass of the daemon's loop, as tpd_daemon_run() makes it, then a drain of every socket. */
static void loop_passes(struct run *r, unsigned passes)
{
	for (unsigned p = 0; p < passes; p++) {
		event_base_loop(daemon_->base, EVLOOP_NONBLOCK);
		tpd_peers_flush(daemon_);
		if (!r)
			continue;
		for (int i = 0; i < CONNS; i++)
			if (r->conn[i] >= 0)
				drain(r, r->conn[i], i == 0);
		if (r->local >= 0)
			drain(r, r->local, false);
	}
}

static void stall(void *r)
{
	loop_passes(r, 1);
}

/* A TCP connection to the daemon's peer port; the daemon accepts it on its next pass. */
static int peer_connect(void)
{
	struct sockaddr_in sin = { .sin_family = AF_INET,
				   .sin_port = htons(tpd_peers_port(daemon_)),
				   .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		abort();
	/* Loopback with room in the backlog: the connect completes without the daemon's loop. */
	if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
		close(fd);
		return -1;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){ 1 }, sizeof(int));
	fcntl(fd, F_SETFL, O_NONBLOCK);
	return fd;
}

/* Frame of @m (no tail) sent on the local session. */
static void local_send(struct run *r, Tpw__V1__ClientMsg *m)
{
	uint8_t buf[256];

	if (tpw_frame_size(&m->base) > sizeof(buf))
		abort();
	fuzz_daemon_send(r->local, buf, tpw_frame_pack(&m->base, 0, 0, 1, buf), false, stall, r);
}

/* The local session: Hello, then a listener every peer daemon may connect to. */
static int local_attach(struct run *r)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Hello h = TPW__V1__HELLO__INIT;
	Tpw__V1__Listen l = TPW__V1__LISTEN__INIT;
	struct tpd_session *s;
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	if (tpd_session_new(daemon_, sv[0], &s) < 0) {
		close(sv[1]);
		return -1;
	}
	r->local = sv[1];
	h.major = TPW_PROTO_MAJOR;
	h.minor = TPW_PROTO_MINOR;
	h.role = TPW__V1__ROLE__ROLE_CLIENT;
	h.name = "local";
	m.body_case = TPW__V1__CLIENT_MSG__BODY_HELLO;
	m.hello = &h;
	local_send(r, &m);
	l.req_id = 1;
	l.name = FUZZ_PEER_LISTENER;
	l.access = TPW__V1__ACCESS__ACCESS_OWNER;
	l.remote = TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTEN;
	m.listen = &l;
	local_send(r, &m);
	loop_passes(r, 2);
	return 0;
}

/* 10-byte varint of @v: canonical when bit 63 is set, padded with 0x80 bytes otherwise. */
static void varint10(uint64_t v, uint8_t *out)
{
	for (int i = 0; i < VARINT_MAX - 1; i++)
		out[i] = (uint8_t)((v >> (7 * i)) & 0x7f) | 0x80;
	out[VARINT_MAX - 1] = (uint8_t)(v >> 63);
}

/* Replaces each placeholder in @buf by the id the daemon chose (fuzz_peer.h). */
static void substitute(const struct run *r, uint8_t *buf, size_t len)
{
	static const uint64_t ph[2] = { FUZZ_PEER_LINK_ID, FUZZ_PEER_PIPE_ID };
	const uint64_t real[2] = { r->link_id, r->pipe_id };

	for (int k = 0; k < 2; k++) {
		uint8_t from[VARINT_MAX], to[VARINT_MAX];

		varint10(ph[k], from);
		varint10(real[k], to);
		for (size_t i = 0; i + VARINT_MAX <= len; i++)
			if (memcmp(buf + i, from, VARINT_MAX) == 0) {
				memcpy(buf + i, to, VARINT_MAX);
				i += VARINT_MAX - 1;
			}
	}
}

/* Sessions still attached (the local part's count). */
static unsigned sessions_left(void)
{
	return tpd_local_session_count(tpd_daemon_local(daemon_));
}

/* Whether the peer part still has links, accepted connections (*@conns) or data dials (*@dials). */
static bool peer_part_busy(unsigned *conns, unsigned *dials)
{
	*conns = tpd_peers_pending(daemon_, dials);
	return tpd_peers_count(daemon_) || *conns || *dials;
}

/* After everything closed: every link, accepted connection, pipe, session and listener must go
 * within the deadline. */
static void check_all_gone(void)
{
	uint64_t deadline = tpu_now_ns() + DRAIN_DEADLINE_NS;
	unsigned conns, dials;

	while (peer_part_busy(&conns, &dials) || tpd_broker_pipe_count(tpd_daemon_broker(daemon_)) ||
	       sessions_left() ||
	       daemon_->registry.count) {
		if (tpu_now_ns() > deadline) {
			fprintf(stderr,
				"fuzz_peer: %u links, %s accepted connections, %s data dials, %u pipes, "
				"%u sessions, %u listeners left after everything closed\n",
				tpd_peers_count(daemon_), conns ? "some" : "no",
				dials ? "some" : "no",
				tpd_broker_pipe_count(tpd_daemon_broker(daemon_)),
				sessions_left(), daemon_->registry.count);
			abort();
		}
		loop_passes(NULL, 1);
		sched_yield();
	}
	fuzz_daemon_report("fuzz_peer");
}

void fuzz_peer_run(const uint8_t *data, size_t len)
{
	static struct run r;
	static uint8_t rec[1 << 16];
	size_t off = 0;

	if (!daemon_) {
		daemon_ = fuzz_daemon_start("FUZZ_PEER_LOG", adjust);
		if (!tpd_peers_port(daemon_)) {
			fprintf(stderr, "fuzz_peer: the daemon has no peer listener\n");
			abort();
		}
	}
	r.rx_len = 0;
	r.rx_broken = false;
	r.link_id = r.pipe_id = 0;
	for (int i = 0; i < CONNS; i++)
		r.conn[i] = -1;
	r.local = -1;
	local_attach(&r);
	while (len - off >= 3) {
		uint8_t op = data[off];
		size_t n = (size_t)data[off + 1] | (size_t)data[off + 2] << 8;
		bool local = op & FUZZ_PEER_OP_LOCAL, subst = op & FUZZ_PEER_OP_SUBST;
		int c = op & FUZZ_PEER_OP_CONN;
		int *fd = local ? &r.local : &r.conn[c];

		off += 3;
		if (n > len - off)
			n = len - off;
		if (*fd < 0 && !local) {
			*fd = peer_connect();
			if (c == 0) {
				r.rx_len = 0;
				r.rx_broken = false;
			}
		}
		if (*fd >= 0) {
			memcpy(rec, data + off, n);
			if (subst && !local)
				substitute(&r, rec, n);
			fuzz_daemon_send(*fd, rec, n, subst && local, stall, &r);
		}
		off += n;
		if ((op & FUZZ_PEER_OP_HANGUP) && *fd >= 0) {
			close(*fd);
			*fd = -1;
		}
		if (!(op & FUZZ_PEER_OP_BATCH))
			loop_passes(&r, PASSES_PER_RECORD);
	}
	for (int i = 0; i < CONNS; i++)
		if (r.conn[i] >= 0)
			close(r.conn[i]);
	if (r.local >= 0)
		close(r.local);
	check_all_gone();
}

#ifdef FUZZ_PEER_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_peer_run(data, size);
	return 0;
}
#endif
