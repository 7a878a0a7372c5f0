/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite 'ring_raw': raw ring clients (tests/common/tpt_wire.h, tpt_raw_ring_*)
 * against tpipd, each breaking or stretching the control-ring protocol on purpose. Half a frame
 * followed by exit, impossible ring positions, a client that never reads its ring, malformed
 * RingSetups and frames announcing fds that never came close only that session; a refused
 * RingSetup or a second one leaves the session where it was; fds sent ahead of their frames are
 * taken in order, and frames left in the ring when the socket closed are still handled; after
 * each, the daemon serves new clients and gets back to its fds and mappings. Regression cases:
 * the switch to the ring takes neither a frame already in the ring nor a byte right behind the
 * RingSetup for anything else. Well-behaved libtpclient contexts on rings are in test_ring.c.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "ring_common.h"

/* ---- raw ring clients ------------------------------------------------------------------------ */

/* A Listen on @name through the ring; returns the Reply status. */
static int ring_listen(struct tpt_raw *raw, struct tpt_raw_ring *g, const char *name)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Listen li = TPW__V1__LISTEN__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;
	int st;

	li.req_id = 7;
	li.name = (char *)name;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTEN;
	m.listen = &li;
	ck_assert_int_eq(tpt_raw_ring_send(raw, g, &m, NULL, 0, NULL, 0, 0, T_MS), 0);
	ck_assert_int_eq(
		tpt_raw_ring_expect(raw, g, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS, &rep), 0);
	ck_assert_uint_eq(rep->reply->req_id, 7);
	st = rep->reply->status;
	tpw_daemon_msg_free(rep);
	return st;
}

/* Rings the doorbell; a daemon that polled the ring meanwhile may have closed already. */
static void wake_daemon(struct tpt_raw *raw)
{
	int r = tpt_raw_doorbell(raw);

	ck_assert_msg(r == 0 || r == -EPIPE || r == -ECONNRESET, "doorbell: %d", r);
}

/* The session was closed for breaking its ring; the daemon serves others. */
static void check_ring_session_closed(struct tpt_raw *raw, const char *why)
{
	ck_assert_msg(tpt_raw_wait_closed(raw, 10000) == 0, "the session stayed open");
	ring_wait_log(why);
	ring_check_daemon_serves("after-ring-fault");
	ring_check_nothing_left();
}

/* (a) The child publishes half a frame, rings, and exits. */
static int half_frame_child(void *arg)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Listen li = TPW__V1__LISTEN__INIT;
	static uint8_t frame[TPW_HDR_SIZE + 256];
	struct tpw_hdr h = { .magic = TPW_MAGIC, .version = TPW_WIRE_VERSION, .msg_len = 64,
			     .data_len = 60u << 10, .seq = 1 };
	struct tpt_raw raw;
	struct tpt_raw_ring g;
	size_t n;

	TPT_REQUIRE(ring_raw_open(&raw, &g, RING_MIN) == 0, 1, "open");
	if (*(const int *)arg == 0) { /* half of a small Listen frame */
		li.name = "half";
		m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTEN;
		m.listen = &li;
		n = tpw_frame_pack(&m.base, 0, 0, 1, frame);
		n /= 2;
	} else { /* a header announcing 60 KiB, and 256 bytes of it */
		tpw_hdr_pack(&h, frame);
		n = sizeof(frame);
	}
	TPT_REQUIRE(tpt_raw_ring_put(&raw, &g, frame, n, T_MS) == 0, 1, "put");
	TPT_REQUIRE(tpt_raw_doorbell(&raw) == 0, 1, "doorbell");
	return 0; /* exits with the ring half written */
}

START_TEST(test_ring_raw_half_frame_then_exit)
{
	int variant = _i;

	ck_assert(tpt_wait_ok(tpt_fork(half_frame_child, &variant), T_MS, "half-frame client"));
	ring_check_daemon_serves("after-half-frame");
	ring_check_nothing_left();
}
END_TEST

/* (b) The client's published position jumps somewhere impossible. */
START_TEST(test_ring_raw_corrupt_head_closes_session)
{
	struct tpt_raw raw;
	struct tpt_raw_ring g;
	struct tpu_ring_shm *h;

	ck_assert_int_eq(ring_raw_open(&raw, &g, RING_MIN), 0);
	h = tpt_raw_ring_shm(&g);
	ck_assert_int_eq(ring_listen(&raw, &g, "corrupt-head"), TPW__V1__STATUS__STATUS_OK);
	ck_assert_uint_gt(h->c2d.tail, 0); /* the daemon consumed the Listen */
	switch (_i) {
	case 0: /* more than one ring ahead of what the daemon consumed */
		h->c2d.head = h->c2d.tail + RING_MIN + 1;
		break;
	case 1:
		h->c2d.head = UINT64_MAX;
		break;
	default: /* behind what the daemon consumed */
		h->c2d.head = h->c2d.tail - 1;
		break;
	}
	wake_daemon(&raw);
	check_ring_session_closed(&raw, "control ring corrupted");
	ring_raw_close(&raw, &g);
}
END_TEST

/* A Read of an unknown pipe: the daemon answers with ReadDone NOT_FOUND. */
static void ring_unknown_read(struct tpt_raw *raw, struct tpt_raw_ring *g, bool expect_reply)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Read rd = TPW__V1__READ__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;

	rd.pipe_id = 12345;
	rd.msg_id = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_READ;
	m.read = &rd;
	ck_assert_int_eq(tpt_raw_ring_send(raw, g, &m, NULL, 0, NULL, 0, 0, T_MS), 0);
	if (!expect_reply)
		return;
	ck_assert_int_eq(
		tpt_raw_ring_expect(raw, g, TPW__V1__DAEMON_MSG__BODY_READ_DONE, T_MS, &rep), 0);
	ck_assert_int_eq(rep->read_done->status, TPW__V1__STATUS__STATUS_NOT_FOUND);
	tpw_daemon_msg_free(rep);
}

/* (c) The client's consumed position of the daemon->client ring is impossible. */
START_TEST(test_ring_raw_corrupt_tail_closes_session)
{
	struct tpt_raw raw;
	struct tpt_raw_ring g;
	struct tpu_ring_shm *h;

	ck_assert_int_eq(ring_raw_open(&raw, &g, RING_MIN), 0);
	h = tpt_raw_ring_shm(&g);
	if (_i == 0) {
		h->d2c.tail = h->d2c.head + 1; /* consumed more than was published */
	} else {
		/* enough replies that the daemon's position is more than a ring from 0 */
		while (h->d2c.head <= RING_MIN + 1)
			ring_unknown_read(&raw, &g, true);
		h->d2c.tail = 0;
	}
	ring_unknown_read(&raw, &g, false); /* its reply cannot be written */
	check_ring_session_closed(&raw, "control ring corrupted");
	ring_raw_close(&raw, &g);
}
END_TEST

/* A client that never reads its ring: the daemon queues up to --client-queue-bytes, then
 * drops the session; it never blocks on the full ring. */
START_TEST(test_ring_raw_client_that_never_reads_is_dropped)
{
	static const char *const args[] = { "--client-queue-bytes", "1M", NULL };
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Read rd = TPW__V1__READ__INIT;
	struct tpt_raw_ring g;
	struct tpt_raw raw;
	unsigned sent = 0;

	ring_up(args);
	ck_assert_int_eq(ring_raw_open(&raw, &g, RING_MIN), 0);
	rd.pipe_id = 12345; /* unknown: each Read is answered with ReadDone NOT_FOUND */
	m.body_case = TPW__V1__CLIENT_MSG__BODY_READ;
	m.read = &rd;
	for (; sent < 200000; sent++) { /* far more answers than 1 MiB of client queue */
		rd.msg_id = sent + 1;
		if (tpt_raw_ring_send(&raw, &g, &m, NULL, 0, NULL, 0, 0, 2000) != 0)
			break;
	}
	ck_assert_msg(tpt_raw_wait_closed(&raw, 10000) == 0, "still open after %u requests", sent);
	ring_wait_log("client does not read");
	ck_assert_uint_eq(tpt_raw_ring_shm(&g)->d2c.waiting, 1); /* it waited for room */
	ck_assert_uint_eq(tpt_raw_ring_shm(&g)->d2c.tail, 0);
	ring_raw_close(&raw, &g);
	ring_check_daemon_serves("after-deaf-client");
	ring_check_nothing_left();
	ring_down();
}
END_TEST

/* Frames a client left in its ring when it closed the socket are still handled. */
START_TEST(test_ring_raw_frames_before_the_end_are_handled)
{
	static const char *const args[] = { "--spin-us", "0", NULL };
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Listen li = TPW__V1__LISTEN__INIT;
	uint8_t frame[256];
	struct tpt_raw_ring g;
	struct tpt_raw raw;
	struct iovec iov;
	uint64_t deadline;
	uint32_t *sleeping;

	ring_up(args);
	ck_assert_int_eq(ring_raw_open(&raw, &g, RING_MIN), 0);
	deadline = tpt_now_ms() + 10000;
	sleeping = &tpt_raw_ring_shm(&g)->c2d.sleeping;
	for (unsigned i = 0; !__atomic_load_n(sleeping, __ATOMIC_SEQ_CST); i++) {
		ck_assert_msg(tpt_now_ms() < deadline, "the daemon never went to sleep");
		tpt_backoff(i);
	}
	li.req_id = 4;
	li.name = "last-words";
	m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTEN;
	m.listen = &li;
	iov.iov_base = frame;
	iov.iov_len = tpw_frame_pack(&m.base, 0, 0, ++raw.seq, frame);
	/* published, but no doorbell: only the end of the socket wakes the daemon */
	ck_assert_int_eq(tpu_ring_put(&g.tx, &iov, 1, 0), (ssize_t)iov.iov_len);
	ring_raw_close(&raw, &g);
	ring_wait_log("listening on 'last-words'");
	ring_wait_log("client disconnected");
	ring_check_nothing_left();
	ring_down();
}
END_TEST

/* A memfd of @len bytes, sealed against shrinking and growing if @sealed. */
static int memfd_sized(size_t len, bool sealed)
{
	int fd = memfd_create("tpt-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, (off_t)len), 0);
	if (sealed)
		ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
	return fd;
}

/* Listen on @name over the socket: the session still works there. */
static void socket_listen_ok(struct tpt_raw *raw, const char *name)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Listen li = TPW__V1__LISTEN__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;

	li.req_id = 3;
	li.name = (char *)name;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTEN;
	m.listen = &li;
	ck_assert_int_eq(tpt_raw_send(raw, &m, NULL, 0, NULL, 0, 0), 0);
	ck_assert_int_eq(tpt_raw_expect(raw, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS, &rep), 0);
	ck_assert_uint_eq(rep->reply->req_id, 3);
	ck_assert_int_eq(rep->reply->status, TPW__V1__STATUS__STATUS_OK);
	tpw_daemon_msg_free(rep);
}

static const struct refusal {
	const char *why;
	Tpw__V1__Status status;
} refusals[] = {
	{ "not sealed", TPW__V1__STATUS__STATUS_INVALID },
	{ "not a memfd of the announced size", TPW__V1__STATUS__STATUS_INVALID },
	{ "not a memfd", TPW__V1__STATUS__STATUS_INVALID },
	{ "ring-max", TPW__V1__STATUS__STATUS_LIMIT },
	{ "first frame after Hello", TPW__V1__STATUS__STATUS_INVALID },
};

/* (e) An offer the daemon refuses: the session goes on over the socket. */
START_TEST(test_ring_raw_refused_offer_keeps_the_socket)
{
	const struct refusal *want = &refusals[_i];
	uint32_t size = _i == 3 ? 8u << 20 : RING_MIN;
	struct tpt_raw_ring g = { .fd = -1 };
	Tpw__V1__DaemonMsg *rep = NULL;
	struct tpt_raw raw;
	int fd, pfd[2] = { -1, -1 };

	if (_i == 0) {
		fd = memfd_sized(tpu_ring_map_size(size), false);
	} else if (_i == 1) {
		fd = memfd_sized(tpu_ring_map_size(size) + 4096, true);
	} else if (_i == 2) {
		ck_assert_int_eq(pipe2(pfd, O_CLOEXEC), 0);
		fd = pfd[0];
	} else {
		ck_assert_int_eq(tpt_raw_ring_new(&g, size), 0);
		fd = g.fd;
	}
	ck_assert_int_eq(tpt_raw_connect(&raw, ring_dmn.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&raw, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	if (_i == 4) /* too late: another frame came first */
		socket_listen_ok(&raw, "too-late");
	ck_assert_int_eq(tpt_raw_ring_setup(&raw, 5, size, fd, T_MS, &rep), 0);
	ck_assert_int_eq(rep->reply->status, want->status);
	ck_assert_msg(rep->reply->message && strstr(rep->reply->message, want->why),
		      "message '%s', want '%s'", rep->reply->message, want->why);
	tpw_daemon_msg_free(rep);
	ring_wait_log("control ring refused");
	socket_listen_ok(&raw, "refused-ring"); /* frames and answers stay on the socket */
	tpt_raw_close(&raw);
	if (g.map)
		tpt_raw_ring_free(&g);
	else
		close(fd);
	if (pfd[1] >= 0)
		close(pfd[1]);
	ring_check_nothing_left();
}
END_TEST

/* A malformed RingSetup closes the connection. */
START_TEST(test_ring_raw_malformed_setup_closes_session)
{
	/* 0-2: not a power of two in range; 3: no fd; 4: size 0; 5: from a control session */
	static const uint32_t sizes[] = { RING_MIN / 2, RING_MIN + 1, 3 * RING_MIN, RING_MIN, 0,
					  RING_MIN };
	Tpw__V1__Role role = _i == 5 ? TPW__V1__ROLE__ROLE_CONTROL : TPW__V1__ROLE__ROLE_CLIENT;
	Tpw__V1__DaemonMsg *rep = NULL;
	struct tpt_raw_ring g;
	struct tpt_raw raw;

	ck_assert_int_eq(tpt_raw_ring_new(&g, RING_MIN), 0);
	ck_assert_int_eq(tpt_raw_connect(&raw, ring_dmn.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&raw, role, T_MS), 0);
	ck_assert_int_eq(tpt_raw_ring_setup(&raw, 5, sizes[_i], _i == 3 ? -1 : g.fd, 10000, &rep),
			 -ECONNRESET);
	ck_assert_msg(tpt_raw_wait_closed(&raw, 10000) == 0, "the daemon kept the connection");
	ring_raw_close(&raw, &g);
	ring_check_nothing_left();
}
END_TEST

/* A second RingSetup, through the established ring, is refused there; the ring goes on. */
START_TEST(test_ring_raw_second_setup_is_refused)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__RingSetup rs = TPW__V1__RING_SETUP__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;
	struct tpt_raw_ring g, g2;
	struct tpt_raw raw;

	ck_assert_int_eq(ring_raw_open(&raw, &g, RING_MIN), 0);
	ck_assert_int_eq(tpt_raw_ring_new(&g2, RING_MIN), 0);
	rs.req_id = 6;
	rs.ring_bytes = RING_MIN;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_RING_SETUP;
	m.ring_setup = &rs;
	ck_assert_int_eq(tpt_raw_ring_send(&raw, &g, &m, NULL, 0, &g2.fd, 1, 1, T_MS), 0);
	ck_assert_int_eq(tpt_raw_ring_expect(&raw, &g, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS, &rep),
			 0);
	ck_assert_uint_eq(rep->reply->req_id, 6);
	ck_assert_int_eq(rep->reply->status, TPW__V1__STATUS__STATUS_INVALID);
	tpw_daemon_msg_free(rep);
	ck_assert_int_eq(ring_listen(&raw, &g, "second-setup"), TPW__V1__STATUS__STATUS_OK);
	ring_raw_close(&raw, &g);
	tpt_raw_ring_free(&g2);
	ring_check_nothing_left();
}
END_TEST

/* (f) fds ahead of their frames: the listener reads 200 bytes from a registered buffer. */
static int fd_listener(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	struct tp_descriptor *d = NULL;
	uint8_t *dst = malloc(200);
	struct tp_slot slot = { .device = { TP_DEVICE_CPU, 0 }, .data = dst };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	int r = ring_ctx_open(&(struct ring_cl){ 0 }, "fd-listener", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "fdring", NULL, &l);
	tpt_sync_post(&ring_ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	for (unsigned k = 0; k < 3; k++) {
		r = tp_pipe_read_descriptor_sync(p, T_MS, &d);
		TPT_REQUIRE(r == 0 && d->n_tensors == 1 && d->tensors[0].length == 200, 1,
			    "descriptor %u: %d", k, r);
		r = tp_pipe_read_sync(p, d, &a);
		TPT_REQUIRE(r == 0, 1, "read %u: %d", k, r);
		TPT_REQUIRE(tpt_verify(dst, 200, 91 + k, NULL), 1, "message %u differs", k);
	}
	tpt_sync_wait(&ring_done, T_MS);
	free(dst);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

/* A sealed 4096-byte memfd whose last 200 bytes hold pattern @seed. */
static int pattern_memfd(uint64_t seed)
{
	int fd = memfd_sized(4096, false);
	uint8_t *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	ck_assert_ptr_ne(p, MAP_FAILED);
	tpt_fill(p + 3896, 200, seed);
	munmap(p, 4096);
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	return fd;
}

static void ring_request(struct tpt_raw *raw, struct tpt_raw_ring *g, Tpw__V1__ClientMsg *m,
			 const int *fd, uint16_t hdr_nfds)
{
	ck_assert_int_eq(tpt_raw_ring_send(raw, g, m, NULL, 0, fd, fd ? 1 : 0, hdr_nfds, T_MS), 0);
}

static void ring_expect_ok(struct tpt_raw *raw, struct tpt_raw_ring *g, int body, uint64_t id)
{
	Tpw__V1__DaemonMsg *rep = NULL;

	ck_assert_int_eq(tpt_raw_ring_expect(raw, g, body, T_MS, &rep), 0);
	if (body == TPW__V1__DAEMON_MSG__BODY_REPLY) {
		ck_assert_uint_eq(rep->reply->req_id, id);
		ck_assert_int_eq(rep->reply->status, TPW__V1__STATUS__STATUS_OK);
	} else {
		ck_assert_uint_eq(rep->write_done->write_id, id);
		ck_assert_int_eq(rep->write_done->status, TPW__V1__STATUS__STATUS_OK);
	}
	tpw_daemon_msg_free(rep);
}

/* Sends BufferRegister{@id} through the ring. Return: as tpt_raw_ring_send(). */
static int ring_register(struct tpt_raw *raw, struct tpt_raw_ring *g, uint64_t id, const int *fd,
			 uint16_t hdr_nfds)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRegister br = TPW__V1__BUFFER_REGISTER__INIT;

	br.req_id = 100 + id;
	br.buf_id = id;
	br.gen = 1;
	br.size = 4096;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &br;
	return tpt_raw_ring_send(raw, g, &m, NULL, 0, fd, fd ? 1 : 0, hdr_nfds, T_MS);
}

static void ring_write_shm(struct tpt_raw *raw, struct tpt_raw_ring *g, uint64_t buf_id)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Write w = TPW__V1__WRITE__INIT;
	Tpw__V1__Tensor t = TPW__V1__TENSOR__INIT, *ts[] = { &t };
	Tpw__V1__Segment seg = TPW__V1__SEGMENT__INIT;
	Tpw__V1__ShmRef shm = TPW__V1__SHM_REF__INIT;

	shm.buf_id = buf_id;
	shm.gen = 1;
	shm.offset = 3896;
	seg.length = 200;
	seg.loc_case = TPW__V1__SEGMENT__LOC_SHM;
	seg.shm = &shm;
	t.data = &seg;
	w.pipe_id = 1;
	w.write_id = buf_id;
	w.n_tensors = 1;
	w.tensors = ts;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_WRITE;
	m.write = &w;
	ring_request(raw, g, &m, NULL, 0);
	ring_expect_ok(raw, g, TPW__V1__DAEMON_MSG__BODY_WRITE_DONE, buf_id);
}

START_TEST(test_ring_raw_fds_travel_ahead_of_their_frames)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Connect c = TPW__V1__CONNECT__INIT;
	int fds[3] = { pattern_memfd(91), pattern_memfd(92), pattern_memfd(93) };
	pid_t lis = tpt_fork(fd_listener, NULL);
	struct tpt_raw_ring g;
	struct tpt_raw raw;
	int r;

	ck_assert_int_eq(tpt_sync_wait(&ring_ready, T_MS), 0);
	ck_assert_int_eq(ring_raw_open(&raw, &g, RING_MIN), 0);
	ck_assert_int_eq(ring_register(&raw, &g, 1, &fds[0], 1), 0);
	ring_expect_ok(&raw, &g, TPW__V1__DAEMON_MSG__BODY_REPLY, 101);
	/* two fds ahead of two frames: each frame takes the next fd in order */
	ck_assert_int_eq(tpt_raw_send_bytes(&raw, "", 1, &fds[1], 1), 0);
	ck_assert_int_eq(tpt_raw_send_bytes(&raw, "", 1, &fds[2], 1), 0);
	ck_assert_int_eq(ring_register(&raw, &g, 2, NULL, 1), 0);
	ck_assert_int_eq(ring_register(&raw, &g, 3, NULL, 1), 0);
	ring_expect_ok(&raw, &g, TPW__V1__DAEMON_MSG__BODY_REPLY, 102);
	ring_expect_ok(&raw, &g, TPW__V1__DAEMON_MSG__BODY_REPLY, 103);
	c.req_id = 9;
	c.pipe_id = 1;
	c.address = "fdring";
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CONNECT;
	m.connect = &c;
	ring_request(&raw, &g, &m, NULL, 0);
	ring_expect_ok(&raw, &g, TPW__V1__DAEMON_MSG__BODY_REPLY, 9);
	for (uint64_t id = 1; id <= 3; id++)
		ring_write_shm(&raw, &g, id);
	tpt_sync_post(&ring_done, 0);
	ck_assert(tpt_wait_ok(lis, 2 * T_MS, "listener"));
	/* a frame announcing an fd that never came closes the session */
	r = ring_register(&raw, &g, 4, NULL, 1);
	ck_assert_msg(r == 0 || r == -EPIPE || r == -ECONNRESET, "register: %d", r);
	wake_daemon(&raw);
	check_ring_session_closed(&raw, "announces 1 fds, 0 received");
	ring_raw_close(&raw, &g);
	for (int i = 0; i < 3; i++)
		close(fds[i]);
}
END_TEST

/* ---- regressions ----------------------------------------------------------------------------- */

/*
 * Regression (daemon/sessmsg.c handle_ring_setup -> daemon/daemon.c tpd_daemon_spin_kick): when
 * the daemon did not spin (--spin-us 0, or its copier was busy), the kick polled every ring at
 * once, from inside parse_frames() of the socket read that carried the RingSetup. A frame
 * already in the ring made ring_pull() re-enter parse_frames(), which started over at the
 * RingSetup the outer call had not consumed yet: the RingSetup was handled twice, its fd was
 * gone, and the session was closed ("frame 2 announces 1 fds, 0 received"). A client writing
 * its first ring frame right after the Reply hit that window by chance (about 1 context in
 * 100 with TP_CONTEXT_NO_SPIN); a frame put in the ring before the RingSetup makes it certain.
 */
START_TEST(test_ring_frame_waiting_at_setup_is_handled_once)
{
	static const char *const args[] = { "--spin-us", "0", NULL };
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Listen li = TPW__V1__LISTEN__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;
	uint8_t frame[256];
	struct tpt_raw_ring g;
	struct tpt_raw raw;
	struct iovec iov;

	ring_up(args);
	ck_assert_int_eq(tpt_raw_connect(&raw, ring_dmn.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&raw, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	ck_assert_int_eq(tpt_raw_ring_new(&g, RING_MIN), 0);
	li.req_id = 8;
	li.name = "waiting";
	m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTEN;
	m.listen = &li;
	iov.iov_base = frame;
	iov.iov_len = tpw_frame_pack(&m.base, 0, 0, 3, frame);
	ck_assert_int_eq(tpu_ring_put(&g.tx, &iov, 1, 0), (ssize_t)iov.iov_len);
	ck_assert_int_eq(tpt_raw_ring_setup(&raw, 2, RING_MIN, g.fd, T_MS, &rep), 0);
	ck_assert_int_eq(rep->reply->status, TPW__V1__STATUS__STATUS_OK);
	tpw_daemon_msg_free(rep);
	rep = NULL;
	ck_assert_int_eq(
		tpt_raw_ring_expect(&raw, &g, TPW__V1__DAEMON_MSG__BODY_REPLY, 10000, &rep), 0);
	ck_assert_uint_eq(rep->reply->req_id, 8);
	ck_assert_int_eq(rep->reply->status, TPW__V1__STATUS__STATUS_OK);
	tpw_daemon_msg_free(rep);
	ring_raw_close(&raw, &g);
	ring_down();
}
END_TEST

/*
 * Regression (daemon/session.c session_on_read, parse_frames): the socket-mode read loop went
 * on reading after parse_frames() switched the session to its ring, so a byte that followed
 * the RingSetup on the socket (a doorbell, or the byte carrying a BufferRegister's fd) was
 * appended to the input buffer as frame data: the next frame from the ring was parsed one
 * byte off ("bad frame header", session closed) and a doorbell was lost (a client hung until
 * its timeout). Here the byte travels in the same sendmsg() as the RingSetup, so it arrives in
 * the same recvmsg(), which makes it certain.
 */
START_TEST(test_ring_socket_byte_right_after_setup_is_a_doorbell)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__RingSetup rs = TPW__V1__RING_SETUP__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;
	uint8_t frame[256] = { 0 };
	struct tpt_raw_ring g;
	struct tpt_raw raw;
	size_t n;

	ring_up(NULL);
	ck_assert_int_eq(tpt_raw_connect(&raw, ring_dmn.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&raw, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	ck_assert_int_eq(tpt_raw_ring_new(&g, RING_MIN), 0);
	rs.req_id = 2;
	rs.ring_bytes = RING_MIN;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_RING_SETUP;
	m.ring_setup = &rs;
	n = tpw_frame_pack(&m.base, 0, 1, ++raw.seq, frame);
	/* the frame, then one doorbell byte (0) */
	ck_assert_int_eq(tpt_raw_send_bytes(&raw, frame, n + 1, &g.fd, 1), 0);
	ck_assert_int_eq(tpt_raw_recv(&raw, T_MS, &rep, NULL, NULL), 0);
	ck_assert_int_eq(rep->body_case, TPW__V1__DAEMON_MSG__BODY_REPLY);
	ck_assert_int_eq(rep->reply->status, TPW__V1__STATUS__STATUS_OK);
	tpw_daemon_msg_free(rep);
	ck_assert_int_eq(ring_listen(&raw, &g, "after-bell"), TPW__V1__STATUS__STATUS_OK);
	ring_raw_close(&raw, &g);
	ring_down();
}
END_TEST

static Suite *ring_raw_suite(void)
{
	Suite *s = suite_create("ring_raw");
	TCase *raw = tcase_create("raw");
	TCase *data = tcase_create("data");
	TCase *reg = tcase_create("regressions");

	tcase_add_checked_fixture(raw, ring_up_default, ring_down);
	tcase_add_loop_test(raw, test_ring_raw_half_frame_then_exit, 0, 2);
	tcase_add_loop_test(raw, test_ring_raw_corrupt_head_closes_session, 0, 3);
	tcase_add_loop_test(raw, test_ring_raw_corrupt_tail_closes_session, 0, 2);
	tcase_add_loop_test(raw, test_ring_raw_refused_offer_keeps_the_socket, 0,
			    (int)TPU_ARRAY_SIZE(refusals));
	tcase_add_loop_test(raw, test_ring_raw_malformed_setup_closes_session, 0, 6);
	tcase_add_test(raw, test_ring_raw_second_setup_is_refused);
	tcase_add_test(raw, test_ring_raw_fds_travel_ahead_of_their_frames);
	tcase_set_timeout(raw, 120);
	suite_add_tcase(s, raw);

	tcase_add_test(data, test_ring_raw_frames_before_the_end_are_handled);
	tcase_add_test(data, test_ring_raw_client_that_never_reads_is_dropped);
	tcase_set_timeout(data, 240);
	suite_add_tcase(s, data);

	tcase_add_test(reg, test_ring_frame_waiting_at_setup_is_handled_once);
	tcase_add_test(reg, test_ring_socket_byte_right_after_setup_is_a_doorbell);
	tcase_set_timeout(reg, 120);
	suite_add_tcase(s, reg);
	return s;
}

int main(void)
{
	return tpt_run_suite(ring_raw_suite());
}
