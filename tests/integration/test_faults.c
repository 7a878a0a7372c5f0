/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: faults. A client SIGKILLed in the middle of a transfer fails exactly its
 * pipes (the other end's pending calls complete with -ECONNRESET), the daemon stays up, serves a
 * new pair of clients, and gets back to the fd count it had before the clients came; descriptors
 * of large messages announced before a writer died are not handed out (read_descriptor fails
 * with -ECONNRESET) while an eager one received before still reads. Malformed
 * or oversized frames from a raw socket close that connection only, while another client's open
 * pipe keeps working. A Write naming bytes outside a registered shared buffer is refused with
 * STATUS_RANGE and delivers nothing; the library refuses a payload or slot that starts in a
 * shared buffer and runs past its end with -ERANGE at once (instead of CMA's -EFAULT later).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "itest.h"
#include "tpt_wire.h"

#define T_MS 30000
#define BIG (256u << 20)

static struct tpt_sync to_a, to_b, to_parent;
static int fd_baseline;
static size_t xfer_len = BIG; /* bytes of the tensor in the kill scenarios */

static void setup(void)
{
	tpt_fixture_start();
	ck_assert_int_eq(tpt_sync_init(&to_a), 0);
	ck_assert_int_eq(tpt_sync_init(&to_b), 0);
	ck_assert_int_eq(tpt_sync_init(&to_parent), 0);
	fd_baseline = tpt_daemon_fd_settle(&tpt_fixture_daemon, 200, 5000);
	ck_assert_int_gt(fd_baseline, 0);
}

static void teardown(void)
{
	tpt_sync_done(&to_a);
	tpt_sync_done(&to_b);
	tpt_sync_done(&to_parent);
	tpt_fixture_stop();
}

/* ---- a simple pair that proves the daemon still serves ------------------------------------- */

static void probe_spec(unsigned index, struct tpt_msg_spec *s)
{
	s->pipe = 50;
	s->index = index;
	s->n_payloads = 1;
	s->n_tensors = 1;
	s->lens[0] = 100;
	s->lens[1] = (1u << 20) + index;
}

static void check_daemon_serves(const char *name)
{
	struct tpt_xfer x = {
		.d = &tpt_fixture_daemon,
		.name = name,
		.n_msgs = 3,
		.spec = probe_spec,
		.writer_mem = TPT_MEM_PRIVATE,
		.reader_mem = TPT_MEM_SHM,
		.timeout_ms = T_MS,
	};

	ck_assert_msg(tpt_daemon_alive(&tpt_fixture_daemon), "tpipd died");
	ck_assert_msg(tpt_xfer_run(&x), "a new pair of clients cannot transfer");
}

static void check_fds_back_to_baseline(void)
{
	int n = tpt_daemon_wait_fds(&tpt_fixture_daemon, fd_baseline, 10000);

	ck_assert_msg(n >= 0, "tpipd fds did not return to the baseline of %d", fd_baseline);
}

/* ---- killed clients ----------------------------------------------------------------------- */

/* The victim writes a 256 MiB private tensor, then waits to be killed. */
static int victim_writer(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;
	struct tp_tensor t = { .device = { TP_DEVICE_CPU, 0 }, .length = 0 };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	static struct tpt_done done;
	struct tpt_done_arg da = { &done, 0 };
	int r;

	TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "listener not ready");
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, "victim", &ctx);
	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_connect(ctx, "victim", &p);
	TPT_REQUIRE(r == 0 && tp_pipe_wait_connected(p, T_MS) == 0, 1, "connect");
	t.length = xfer_len;
	t.data = malloc(xfer_len);
	TPT_REQUIRE(t.data, 1, "malloc");
	tpt_fill(t.data, xfer_len, 77);
	tpt_done_init(&done);
	r = tp_pipe_write(p, &m, tpt_done_cb, &da);
	TPT_REQUIRE(r == 0, 1, "write: %d", r);
	tpt_sync_wait(&to_a, T_MS); /* killed while waiting here */
	return 2;
}

/*
 * The survivor reads the descriptor, starts the read, tells the parent (which kills the writer)
 * and checks that the read and the next read_descriptor fail with -ECONNRESET. The read may
 * also have finished before the kill landed; then its bytes must be right.
 */
static int survivor_reader(void *arg)
{
	static struct tpt_done done;
	struct tpt_done_arg da = { &done, 0 };
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	struct tp_descriptor *d = NULL;
	struct tp_slot slot = { .device = { TP_DEVICE_CPU, 0 } };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "survivor", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "victim", NULL, &l);
	tpt_sync_post(&to_b, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	r = tp_pipe_read_descriptor_sync(p, T_MS, &d);
	TPT_REQUIRE(r == 0, 1, "descriptor: %d", r);
	slot.data = malloc(xfer_len);
	tpt_done_init(&done);
	r = tp_pipe_read(p, d, &a, tpt_done_cb, &da);
	TPT_REQUIRE(r == 0, 1, "read: %d", r);
	tpt_sync_post(&to_parent, 0);
	TPT_REQUIRE(tpt_done_wait(&done, 1, T_MS) == 0, 1, "pending read never completed");
	if (done.last_status == 0) {
		tpt_log("note: the 256 MiB read finished before the writer was killed");
		TPT_REQUIRE(tpt_verify(slot.data, xfer_len, 77, NULL), 1,
			    "completed read is corrupt");
	} else {
		TPT_REQUIRE(done.last_status == -ECONNRESET, 1,
			    "pending read when the writer died: %d (want -ECONNRESET)",
			    done.last_status);
	}
	r = tp_pipe_read_descriptor_sync(p, T_MS, &d);
	TPT_REQUIRE(r == -ECONNRESET, 1, "read_descriptor after the writer died: %d", r);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	free(slot.data);
	return 0;
}

START_TEST(test_faults_writer_killed_mid_transfer_resets_reader)
{
	pid_t rd = tpt_fork(survivor_reader, NULL), wr = tpt_fork(victim_writer, NULL);
	int status;

	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	ck_assert_int_eq(kill(wr, SIGKILL), 0);
	ck_assert_int_eq(tpt_wait(wr, T_MS, &status), 0);
	ck_assert(WIFSIGNALED(status));
	ck_assert(tpt_wait_ok(rd, 2 * T_MS, "reader"));
	check_daemon_serves("after-writer-death");
	check_fds_back_to_baseline();
}
END_TEST

/* ---- descriptors of messages announced before the writer died ------------------------------ */

#define ANNOUNCED 6

static void announced_spec(unsigned index, struct tpt_msg_spec *s)
{
	*s = (struct tpt_msg_spec){ .pipe = 61, .index = index };
	if (index == 0) {
		s->n_payloads = 1; /* small: its bytes travel with the descriptor */
		s->lens[0] = 100;
	} else {
		s->n_tensors = 1; /* large: its bytes stay with the writer until read */
		s->lens[0] = 4u << 20;
	}
}

/* Writes one eager message and ANNOUNCED large ones, makes sure the daemon has them all, and
 * waits to be killed. */
static int announcing_writer(void *arg)
{
	static struct tpt_msg msgs[ANNOUNCED + 1];
	static struct tpt_done done;
	struct tpt_done_arg da = { &done, 0 };
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	int r;

	TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "listener not ready");
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, "announcer", &ctx);
	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_connect(ctx, "announced", &p);
	TPT_REQUIRE(r == 0 && tp_pipe_wait_connected(p, T_MS) == 0, 1, "connect");
	tpt_done_init(&done);
	for (unsigned i = 0; i <= ANNOUNCED; i++) {
		struct tpt_msg_spec s;

		announced_spec(i, &s);
		TPT_REQUIRE(tpt_msg_build(ctx, &s, TPT_MEM_PRIVATE, &msgs[i]) == 0, 1, "build");
		r = tp_pipe_write(p, &msgs[i].m, tpt_done_cb, &da);
		TPT_REQUIRE(r == 0, 1, "write %u: %d", i, r);
	}
	/* The daemon answers in order: once this listen is answered, it has every write. */
	r = tp_listen(ctx, "announcer-barrier", NULL, &l);
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	tpt_sync_post(&to_parent, 0);
	tpt_sync_wait(&to_a, T_MS); /* killed while waiting here */
	return 2;
}

/* After the writer died: the eager message still reads; then read_descriptor fails with the
 * pipe's error instead of handing out the large messages' descriptors. */
static int announced_reader(void *arg)
{
	struct tp_message probe = { 0 };
	struct tp_descriptor *d = NULL;
	struct tpt_msg_spec s;
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "announced", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "announced", NULL, &l);
	tpt_sync_post(&to_b, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	TPT_REQUIRE(tpt_sync_wait(&to_a, T_MS) == 0, 1, "no word that the writer died");
	/* Answered after the daemon told us of the writer's death (or refused at once after). */
	r = tp_pipe_write_sync(p, &probe);
	TPT_REQUIRE(r == -ECONNRESET, 1, "write to the dead writer: %d", r);
	announced_spec(0, &s);
	r = tpt_msg_read_check(ctx, p, &s, TPT_MEM_PRIVATE, T_MS);
	TPT_REQUIRE(r == 0, 1, "the eager message received before the death: %d", r);
	for (unsigned i = 1; i <= ANNOUNCED; i++) {
		r = tp_pipe_read_descriptor_sync(p, T_MS, &d);
		TPT_REQUIRE(r == -ECONNRESET, 1, "read_descriptor %u after the writer died: %d", i,
			    r);
	}
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_faults_writer_death_fails_descriptors_announced_before_it)
{
	pid_t rd = tpt_fork(announced_reader, NULL), wr = tpt_fork(announcing_writer, NULL);
	int status;

	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	ck_assert_int_eq(kill(wr, SIGKILL), 0);
	ck_assert_int_eq(tpt_wait(wr, T_MS, &status), 0);
	ck_assert(WIFSIGNALED(status));
	ck_assert_int_eq(tpt_sync_post(&to_a, 0), 0);
	ck_assert(tpt_wait_ok(rd, 2 * T_MS, "reader"));
}
END_TEST

/* The survivor writes a 256 MiB private tensor and expects -ECONNRESET when the reader dies. */
static int survivor_writer(void *arg)
{
	static struct tpt_done done;
	struct tpt_done_arg da = { &done, 0 };
	struct tp_context *ctx;
	struct tp_pipe *p;
	struct tp_tensor t = { .device = { TP_DEVICE_CPU, 0 }, .length = 0 };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	struct tp_descriptor *d = NULL;
	int r;

	TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "listener not ready");
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, "survivor", &ctx);
	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_connect(ctx, "victim", &p);
	TPT_REQUIRE(r == 0 && tp_pipe_wait_connected(p, T_MS) == 0, 1, "connect");
	t.length = xfer_len;
	t.data = malloc(xfer_len);
	TPT_REQUIRE(t.data, 1, "malloc");
	tpt_fill(t.data, xfer_len, 78);
	tpt_done_init(&done);
	r = tp_pipe_write(p, &m, tpt_done_cb, &da);
	TPT_REQUIRE(r == 0, 1, "write: %d", r);
	TPT_REQUIRE(tpt_done_wait(&done, 1, T_MS) == 0, 1, "pending write never completed");
	TPT_REQUIRE(done.last_status == -ECONNRESET || done.last_status == 0, 1,
		    "pending write when the reader died: %d (want -ECONNRESET)", done.last_status);
	if (done.last_status == 0)
		tpt_log("note: the 256 MiB write finished before the reader was killed");
	/* Once the pipe's end is known (PipeClosed), every call reports why: peer died. */
	r = tp_pipe_read_descriptor_sync(p, T_MS, &d);
	TPT_REQUIRE(r == -ECONNRESET, 1, "read_descriptor after the reader died: %d", r);
	r = tp_pipe_write_sync(p, &m);
	TPT_REQUIRE(r == -ECONNRESET, 1, "write after the reader died: %d", r);
	tp_pipe_close(p);
	tp_context_free(ctx);
	free(t.data);
	return 0;
}

/* The victim reads the descriptor and, if @arg says so, starts the read; then waits to die. */
static int victim_reader(void *arg)
{
	const bool start_read = *(const bool *)arg;
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	struct tp_descriptor *d = NULL;
	struct tp_slot slot = { .device = { TP_DEVICE_CPU, 0 } };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	static struct tpt_done done;
	struct tpt_done_arg da = { &done, 0 };
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "victim", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "victim", NULL, &l);
	tpt_sync_post(&to_b, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	r = tp_pipe_read_descriptor_sync(p, T_MS, &d);
	TPT_REQUIRE(r == 0, 1, "descriptor: %d", r);
	if (start_read) {
		slot.data = malloc(xfer_len);
		tpt_done_init(&done);
		r = tp_pipe_read(p, d, &a, tpt_done_cb, &da);
		TPT_REQUIRE(r == 0, 1, "read: %d", r);
	}
	tpt_sync_post(&to_parent, 0);
	tpt_sync_wait(&to_a, T_MS); /* killed while waiting here */
	return 2;
}

/* Kills the reader of a pending write, before (@start_read false) or during its read. */
static void kill_reader(bool start_read)
{
	pid_t rd = tpt_fork(victim_reader, &start_read);
	pid_t wr = tpt_fork(survivor_writer, NULL);
	int status;

	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	ck_assert_int_eq(kill(rd, SIGKILL), 0);
	ck_assert_int_eq(tpt_wait(rd, T_MS, &status), 0);
	ck_assert(WIFSIGNALED(status));
	ck_assert(tpt_wait_ok(wr, 2 * T_MS, "writer"));
}

START_TEST(test_faults_reader_killed_fails_pending_write)
{
	kill_reader(_i == 1);
	check_daemon_serves("after-reader-death");
	check_fds_back_to_baseline();
}
END_TEST

START_TEST(test_faults_repeated_client_deaths_leak_nothing)
{
	long rss0, rss1;

	xfer_len = 8u << 20;
	kill_reader(false); /* warm up: copy threads, bounce buffers */
	kill_reader(true);
	check_fds_back_to_baseline();
	rss0 = tpt_daemon_rss_kb(&tpt_fixture_daemon);
	for (int i = 0; i < 20; i++)
		kill_reader(i % 2);
	check_fds_back_to_baseline();
	rss1 = tpt_daemon_rss_kb(&tpt_fixture_daemon);
	printf("tpipd RSS %ld KiB after one death, %ld KiB after 20 more\n", rss0, rss1);
	ck_assert_int_gt(rss0, 0);
	ck_assert_msg(rss1 - rss0 < 32 * 1024, "tpipd grew by %ld KiB over 20 client deaths",
		      rss1 - rss0);
	check_daemon_serves("after-deaths");
}
END_TEST

/* ---- the daemon stops under its clients ------------------------------------------------------ */

/* One end of an open pipe with a read_descriptor pending when tpipd stops. */
static int stop_end(void *arg)
{
	const bool listener = *(const bool *)arg;
	struct tp_context *ctx;
	struct tp_listener *l = NULL;
	struct tp_pipe *p;
	struct tp_descriptor *d = NULL;
	uint64_t t0;
	int r = 0;

	if (!listener)
		TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "listener not ready");
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, listener ? "stop-l" : "stop-c", &ctx);
	if (r == 0 && listener)
		r = tp_listen(ctx, "stop", NULL, &l);
	if (listener)
		tpt_sync_post(&to_b, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "context/listen: %d", r);
	r = listener ? tp_listener_accept_sync(l, T_MS, &p) : tp_connect(ctx, "stop", &p);
	if (r == 0 && !listener)
		r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == 0, 1, "pipe: %d", r);
	tpt_sync_post(&to_parent, 0);
	t0 = tpt_now_ms();
	r = tp_pipe_read_descriptor_sync(p, T_MS, &d);
	TPT_REQUIRE(r < 0 && r != -ETIMEDOUT, 1,
		    "pending read when tpipd stopped: %d after %llu ms", r,
		    (unsigned long long)(tpt_now_ms() - t0));
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_faults_daemon_stop_fails_pending_calls_and_exits_cleanly)
{
	static const bool yes = true, no = false;
	pid_t a = tpt_fork(stop_end, (void *)&yes), b = tpt_fork(stop_end, (void *)&no);

	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	ck_assert_int_eq(tpt_daemon_stop(&tpt_fixture_daemon), 0); /* SIGTERM, exit status 0 */
	ck_assert(tpt_wait_ok(a, T_MS, "listener end"));
	ck_assert(tpt_wait_ok(b, T_MS, "connector end"));
	ck_assert_int_eq(tpt_daemon_start(&tpt_fixture_daemon, NULL), 0); /* for the teardown */
}
END_TEST

/* ---- malformed frames ------------------------------------------------------------------------ */

/* A pair with an open pipe: after the parent's go (to_a), the writer sends one message. */
static int bystander_writer(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;
	struct tpt_msg_spec s;
	struct tpt_msg m;
	int r;

	TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "listener not ready");
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, "bystander-w", &ctx);
	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_connect(ctx, "bystander", &p);
	TPT_REQUIRE(r == 0 && tp_pipe_wait_connected(p, T_MS) == 0, 1, "connect");
	tpt_sync_post(&to_parent, 0);
	TPT_REQUIRE(tpt_sync_wait(&to_a, T_MS) == 0, 1, "no go from the parent");
	memset(&s, 0, sizeof(s));
	probe_spec(0, &s);
	TPT_REQUIRE(tpt_msg_build(ctx, &s, TPT_MEM_PRIVATE, &m) == 0, 1, "build");
	r = tp_pipe_write_sync(p, &m.m);
	tpt_msg_free(ctx, &m);
	TPT_REQUIRE(r == 0, 1, "write on the open pipe: %d %s", r, tp_last_error());
	tpt_sync_wait(&to_a, T_MS);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

static int bystander_reader(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	struct tpt_msg_spec s;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "bystander-r", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "bystander", NULL, &l);
	tpt_sync_post(&to_b, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	memset(&s, 0, sizeof(s));
	probe_spec(0, &s);
	r = tpt_msg_read_check(ctx, p, &s, TPT_MEM_PRIVATE, T_MS);
	tpt_sync_post(&to_a, 0);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	TPT_REQUIRE(r == 0, 1, "read on the open pipe: %d", r);
	return 0;
}

/* Sends Hello then broken frame number @which; the connection must be closed. */
static void send_malformed(struct tpt_raw *raw, int which)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Write w = TPW__V1__WRITE__INIT;
	Tpw__V1__Payload pl = TPW__V1__PAYLOAD__INIT, *pls[] = { &pl };
	Tpw__V1__Segment seg = TPW__V1__SEGMENT__INIT;
	Tpw__V1__PipeClose pc = TPW__V1__PIPE_CLOSE__INIT;
	uint8_t buf[64] = { 0 };
	struct tpw_hdr h = { TPW_MAGIC, TPW_WIRE_VERSION, 0, 8, 0, 2 };
	int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);

	if (which != 7)
		ck_assert_int_eq(tpt_raw_hello(raw, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	seg.length = 16;
	seg.loc_case = TPW__V1__SEGMENT__LOC_INLINE_OFF;
	seg.inline_off = 8; /* 8 + 16 > the 16-byte tail */
	pl.data = &seg;
	w.pipe_id = 1;
	w.n_payloads = 1;
	w.payloads = pls;
	pc.pipe_id = 1;
	switch (which) {
	case 0: /* bad magic */
		h.magic = 0x12345678;
		tpw_hdr_pack(&h, buf);
		ck_assert_int_eq(tpt_raw_send_bytes(raw, buf, TPW_HDR_SIZE + 8, NULL, 0), 0);
		break;
	case 1: /* msg_len above frame_max (the daemon must not wait for 64 MiB to arrive) */
		h.msg_len = TPW_FRAME_MAX_HARD;
		tpw_hdr_pack(&h, buf);
		ck_assert_int_eq(tpt_raw_send_bytes(raw, buf, TPW_HDR_SIZE + 8, NULL, 0), 0);
		break;
	case 2: /* garbage protobuf */
		tpw_hdr_pack(&h, buf);
		memset(buf + TPW_HDR_SIZE, 0xff, 8);
		ck_assert_int_eq(tpt_raw_send_bytes(raw, buf, TPW_HDR_SIZE + 8, NULL, 0), 0);
		break;
	case 3: /* Write whose inline range leaves the data tail */
		m.body_case = TPW__V1__CLIENT_MSG__BODY_WRITE;
		m.write = &w;
		ck_assert_int_eq(tpt_raw_send(raw, &m, buf, 16, NULL, 0, 0), 0);
		break;
	case 4: /* header announces one fd, none attached */
		m.body_case = TPW__V1__CLIENT_MSG__BODY_PIPE_CLOSE;
		m.pipe_close = &pc;
		ck_assert_int_eq(tpt_raw_send(raw, &m, NULL, 0, NULL, 0, 1), 0);
		break;
	case 5: /* an fd attached that the header does not announce */
		m.body_case = TPW__V1__CLIENT_MSG__BODY_PIPE_CLOSE;
		m.pipe_close = &pc;
		ck_assert_int_eq(tpt_raw_send(raw, &m, NULL, 0, &devnull, 1, 0), 0);
		break;
	case 6: /* an announced fd on a message that takes none */
		m.body_case = TPW__V1__CLIENT_MSG__BODY_PIPE_CLOSE;
		m.pipe_close = &pc;
		ck_assert_int_eq(tpt_raw_send(raw, &m, NULL, 0, &devnull, 1, 1), 0);
		break;
	default: /* a request before Hello */
		m.body_case = TPW__V1__CLIENT_MSG__BODY_PIPE_CLOSE;
		m.pipe_close = &pc;
		ck_assert_int_eq(tpt_raw_send(raw, &m, NULL, 0, NULL, 0, 0), 0);
		break;
	}
	close(devnull);
}

START_TEST(test_faults_malformed_frame_closes_only_that_connection)
{
	static const char *what[] = { "bad magic", "oversize", "garbage protobuf",
				      "inline range outside tail", "missing fd", "unannounced fd",
				      "fd on a message that takes none", "request before hello" };
	pid_t rd = tpt_fork(bystander_reader, NULL), wr = tpt_fork(bystander_writer, NULL);
	struct tpt_raw raw;
	int r;

	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0); /* the pipe is open */
	ck_assert_int_eq(tpt_raw_connect(&raw, tpt_fixture_daemon.socket), 0);
	send_malformed(&raw, _i);
	r = tpt_raw_wait_closed(&raw, 10000);
	ck_assert_msg(r == 0, "%s: the daemon kept the connection open (%d)", what[_i], r);
	tpt_raw_close(&raw);
	ck_assert_msg(tpt_daemon_alive(&tpt_fixture_daemon), "%s killed tpipd", what[_i]);
	tpt_sync_post(&to_a, 0); /* go: the bystanders transfer on their open pipe */
	ck_assert(tpt_wait_ok(rd, 2 * T_MS, "bystander reader"));
	ck_assert(tpt_wait_ok(wr, 2 * T_MS, "bystander writer"));
	check_fds_back_to_baseline();
}
END_TEST

/* ---- ranges outside a registered buffer ------------------------------------------------------ */

/* Accepts, expects exactly one descriptor (a 200-byte tensor, metadata "good"), reads it. */
static int range_listener(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	struct tp_descriptor *d = NULL;
	uint8_t *dst = malloc(200);
	struct tp_slot slot = { .device = { TP_DEVICE_CPU, 0 }, .data = dst };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "range", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "range", NULL, &l);
	tpt_sync_post(&to_parent, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	r = tp_pipe_read_descriptor_sync(p, T_MS, &d);
	TPT_REQUIRE(r == 0, 1, "descriptor: %d", r);
	TPT_REQUIRE(d->n_tensors == 1 && d->n_payloads == 0 && d->tensors[0].length == 200 &&
			    d->metadata_len == 4 && memcmp(d->metadata, "good", 4) == 0,
		    1, "the first descriptor is not the in-range write (%zu tensors, %zu bytes)",
		    d->n_tensors, d->n_tensors ? d->tensors[0].length : 0);
	r = tp_pipe_read_sync(p, d, &a);
	TPT_REQUIRE(r == 0, 1, "read: %d", r);
	TPT_REQUIRE(tpt_verify(dst, 200, 91, NULL), 1, "in-range bytes differ");
	r = tp_pipe_read_descriptor_sync(p, 300, &d);
	TPT_REQUIRE(r == -ETIMEDOUT || r == -EPIPE || r == -ECONNRESET, 1,
		    "an out-of-range write was delivered (%d)", r);
	tpt_sync_post(&to_a, 0);
	free(dst);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

/* A sealed memfd of 4096 bytes whose last 200 bytes hold pattern 91. */
static int sealed_memfd(void)
{
	int fd = memfd_create("tpt-range", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	uint8_t *p;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, 4096), 0);
	p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	ck_assert_ptr_ne(p, MAP_FAILED);
	tpt_fill(p + 3896, 200, 91);
	munmap(p, 4096);
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	return fd;
}

static void raw_request(struct tpt_raw *raw, Tpw__V1__ClientMsg *m, const int *fd, int want)
{
	Tpw__V1__DaemonMsg *rep = NULL;

	ck_assert_int_eq(tpt_raw_send(raw, m, NULL, 0, fd, fd ? 1 : 0, fd ? 1 : 0), 0);
	ck_assert_int_eq(tpt_raw_expect(raw, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS, &rep), 0);
	ck_assert_int_eq(rep->reply->status, want);
	tpw_daemon_msg_free(rep);
}

static Tpw__V1__Status raw_write(struct tpt_raw *raw, uint64_t write_id, uint64_t off,
				 uint64_t len, uint64_t buf_id)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Write w = TPW__V1__WRITE__INIT;
	Tpw__V1__Tensor t = TPW__V1__TENSOR__INIT, *ts[] = { &t };
	Tpw__V1__Segment seg = TPW__V1__SEGMENT__INIT;
	Tpw__V1__ShmRef shm = TPW__V1__SHM_REF__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;
	Tpw__V1__Status st;

	shm.buf_id = buf_id;
	shm.gen = 1;
	shm.offset = off;
	seg.length = len;
	seg.loc_case = TPW__V1__SEGMENT__LOC_SHM;
	seg.shm = &shm;
	t.data = &seg;
	w.pipe_id = 1;
	w.write_id = write_id;
	w.metadata = (ProtobufCBinaryData){ 4, (uint8_t *)(write_id == 9 ? "good" : "evil") };
	w.n_tensors = 1;
	w.tensors = ts;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_WRITE;
	m.write = &w;
	ck_assert_int_eq(tpt_raw_send(raw, &m, NULL, 0, NULL, 0, 0), 0);
	ck_assert_int_eq(tpt_raw_expect(raw, TPW__V1__DAEMON_MSG__BODY_WRITE_DONE, T_MS, &rep), 0);
	ck_assert_uint_eq(rep->write_done->write_id, write_id);
	st = rep->write_done->status;
	tpw_daemon_msg_free(rep);
	return st;
}

START_TEST(test_faults_shm_range_outside_buffer_is_rejected)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRegister br = TPW__V1__BUFFER_REGISTER__INIT;
	Tpw__V1__Connect c = TPW__V1__CONNECT__INIT;
	pid_t lis = tpt_fork(range_listener, NULL);
	int fd = sealed_memfd();
	struct tpt_raw raw;

	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	ck_assert_int_eq(tpt_raw_connect(&raw, tpt_fixture_daemon.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&raw, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	br = (Tpw__V1__BufferRegister)TPW__V1__BUFFER_REGISTER__INIT;
	br.req_id = 1;
	br.buf_id = 1;
	br.gen = 1;
	br.size = 4096;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &br;
	raw_request(&raw, &m, &fd, TPW__V1__STATUS__STATUS_OK);
	c.req_id = 2;
	c.pipe_id = 1;
	c.address = "range";
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CONNECT;
	m.connect = &c;
	raw_request(&raw, &m, NULL, TPW__V1__STATUS__STATUS_OK);

	ck_assert_int_eq(raw_write(&raw, 1, 4000, 200, 1), TPW__V1__STATUS__STATUS_RANGE);
	ck_assert_int_eq(raw_write(&raw, 2, UINT64_MAX - 10, 200, 1),
			 TPW__V1__STATUS__STATUS_RANGE);
	ck_assert_int_eq(raw_write(&raw, 3, 4096, 1, 1), TPW__V1__STATUS__STATUS_RANGE);
	ck_assert_int_eq(raw_write(&raw, 4, 0, 4097, 1), TPW__V1__STATUS__STATUS_RANGE);
	ck_assert_int_ne(raw_write(&raw, 5, 0, 10, 77), TPW__V1__STATUS__STATUS_OK); /* no buffer */
	/* exactly at the end: accepted, and the only message the listener sees */
	ck_assert_int_eq(raw_write(&raw, 9, 3896, 200, 1), TPW__V1__STATUS__STATUS_OK);
	ck_assert(tpt_wait_ok(lis, 2 * T_MS, "listener"));
	ck_assert(tpt_daemon_alive(&tpt_fixture_daemon));
	tpt_raw_close(&raw);
	close(fd);
}
END_TEST

/* ---- shared-buffer ranges from the library -------------------------------------------------- */

#define RANGE_BUF (1u << 20)

/* Writes a message whose tensor runs past a shared buffer (refused with -ERANGE, nothing
 * sent), then one that ends exactly at its end; the reader expects that one only. */
static int range_writer(void *arg)
{
	struct tp_tensor t = { .device = { TP_DEVICE_CPU, 0 } };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	struct tp_context *ctx;
	struct tp_pipe *p;
	char *buf;
	int r;

	TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "listener not ready");
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, "range-writer", &ctx);
	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_connect(ctx, "lib-range", &p);
	TPT_REQUIRE(r == 0 && tp_pipe_wait_connected(p, T_MS) == 0, 1, "connect");
	TPT_REQUIRE(tp_buffer_alloc(ctx, RANGE_BUF, (void **)&buf) == 0, 1, "buffer");
	tpt_fill(buf, RANGE_BUF, 5);
	t.data = buf + RANGE_BUF / 2;
	t.length = RANGE_BUF / 2 + 1; /* one byte past the end (a rendezvous-sized message) */
	r = tp_pipe_write_sync(p, &m);
	TPT_REQUIRE(r == -ERANGE, 1, "write one byte past the buffer: %d (%s)", r, tp_last_error());
	TPT_REQUIRE(strstr(tp_last_error(), "tensor 0: "), 1, "the error names no segment: %s",
		    tp_last_error());
	t.data = buf + RANGE_BUF - 100;
	t.length = 101; /* one byte past the end (small enough to go inline) */
	r = tp_pipe_write_sync(p, &m);
	TPT_REQUIRE(r == -ERANGE, 1, "inline write past the buffer: %d (%s)", r, tp_last_error());
	t.data = buf + RANGE_BUF / 2;
	t.length = RANGE_BUF / 2; /* exactly to the end: fine */
	r = tp_pipe_write_sync(p, &m);
	TPT_REQUIRE(r == 0, 1, "write to the end of the buffer: %d (%s)", r, tp_last_error());
	TPT_REQUIRE(tpt_sync_wait(&to_a, T_MS) == 0, 1, "reader did not finish");
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

/* Reads into a shared buffer: a slot that runs past it is refused with -ERANGE. */
static int range_reader(void *arg)
{
	struct tp_slot slot = { .device = { TP_DEVICE_CPU, 0 } };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	struct tp_descriptor *d;
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	char *buf;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "range-reader", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "lib-range", NULL, &l);
	tpt_sync_post(&to_b, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	TPT_REQUIRE(tp_buffer_alloc(ctx, RANGE_BUF, (void **)&buf) == 0, 1, "buffer");
	r = tp_pipe_read_descriptor_sync(p, T_MS, &d);
	TPT_REQUIRE(r == 0, 1, "descriptor: %d", r);
	TPT_REQUIRE(d->n_tensors == 1 && d->tensors[0].length == RANGE_BUF / 2, 1,
		    "the refused writes were delivered (%zu bytes)", d->tensors[0].length);
	slot.data = buf + RANGE_BUF / 2 + 1; /* one byte short of room */
	r = tp_pipe_read_sync(p, d, &a);
	TPT_REQUIRE(r == -ERANGE, 1, "read one byte past the buffer: %d (%s)", r, tp_last_error());
	TPT_REQUIRE(strstr(tp_last_error(), "tensor slot 0: "), 1, "the error names no slot: %s",
		    tp_last_error());
	tpt_sync_post(&to_a, 0);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_faults_library_refuses_ranges_past_a_shared_buffer)
{
	ck_assert(tpt_run_pair(range_reader, range_writer, NULL, 2 * T_MS));
}
END_TEST

static Suite *faults_suite(void)
{
	Suite *s = suite_create("faults");
	TCase *k = tcase_create("kill");
	TCase *w = tcase_create("wire");

	tcase_add_checked_fixture(k, setup, teardown);
	tcase_add_test(k, test_faults_writer_killed_mid_transfer_resets_reader);
	tcase_add_loop_test(k, test_faults_reader_killed_fails_pending_write, 0, 2);
	tcase_add_test(k, test_faults_repeated_client_deaths_leak_nothing);
	tcase_add_test(k, test_faults_writer_death_fails_descriptors_announced_before_it);
	tcase_add_test(k, test_faults_daemon_stop_fails_pending_calls_and_exits_cleanly);
	tcase_set_timeout(k, 120);
	suite_add_tcase(s, k);

	tcase_add_checked_fixture(w, setup, teardown);
	tcase_add_loop_test(w, test_faults_malformed_frame_closes_only_that_connection, 0, 8);
	tcase_add_test(w, test_faults_shm_range_outside_buffer_is_rejected);
	tcase_add_test(w, test_faults_library_refuses_ranges_past_a_shared_buffer);
	tcase_set_timeout(w, 60);
	suite_add_tcase(s, w);
	return s;
}

int main(void)
{
	return tpt_run_suite(faults_suite());
}
