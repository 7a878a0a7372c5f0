/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: configured limits, each just at (accepted, and the data arrives) and just
 * above (refused with the documented error, and the session carries on). A daemon started with
 * small limits: --segments-max, --metadata-max, --message-bytes-max, --pipes-max,
 * --pipe-queue-max, --buffers-max, --buffer-bytes-max, --sessions-max and --frame-max.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "itest.h"
#include "tpt_wire.h"

#define T_MS 30000
#define SEGMENTS_MAX 8
#define METADATA_MAX 256
#define MESSAGE_BYTES_MAX (1u << 20)
#define PIPES_MAX 4
#define QUEUE_MAX 4

static const char *const limit_args[] = {
	"--segments-max", "8", "--metadata-max", "256", "--message-bytes-max", "1M",
	"--pipes-max", "4", "--pipe-queue-max", "4", "--buffers-max", "2",
	"--buffer-bytes-max", "1M", "--sessions-max", "16", NULL,
};

static struct tpt_sync to_a, to_b;

static void setup(void)
{
	ck_assert_int_eq(tpt_daemon_start(&tpt_fixture_daemon, limit_args), 0);
	ck_assert_int_eq(tpt_sync_init(&to_a), 0);
	ck_assert_int_eq(tpt_sync_init(&to_b), 0);
}

static void teardown(void)
{
	tpt_sync_done(&to_a);
	tpt_sync_done(&to_b);
	tpt_fixture_stop();
}

/* ---- message limits: a list of attempts, each accepted or refused ---------------------------- */

struct attempt {
	struct tpt_msg_spec s;
	int want; /* 0, or the error the write must fail with */
};

static struct attempt attempts[8];
static unsigned n_attempts;

static void add(int want, size_t np, size_t nt, const size_t *lens, size_t meta, size_t seg_meta)
{
	struct attempt *a = &attempts[n_attempts];

	memset(a, 0, sizeof(*a));
	a->want = want;
	a->s.pipe = 60;
	a->s.index = n_attempts++;
	a->s.n_payloads = np;
	a->s.n_tensors = nt;
	a->s.meta_len = meta;
	a->s.seg_meta_len = seg_meta;
	for (size_t k = 0; k < np + nt; k++)
		a->s.lens[k] = lens ? lens[k] : 10 + k;
}

/* Writes @m and waits for its completion. Return: the synchronous or the completion status. */
static int write_wait(struct tp_pipe *p, const struct tp_message *m)
{
	struct tpt_done done;
	struct tpt_done_arg da = { &done, 0 };
	int r;

	tpt_done_init(&done);
	r = tp_pipe_write(p, m, tpt_done_cb, &da);
	if (r < 0)
		return r;
	if (tpt_done_wait(&done, 1, T_MS) < 0)
		return -ETIMEDOUT;
	return done.last_status;
}

static int attempts_writer(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;
	struct tpt_msg *m = malloc(sizeof(*m));
	int r, bad = 0;

	TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "listener not ready");
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, "writer", &ctx);
	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_connect(ctx, "limits", &p);
	TPT_REQUIRE(r == 0 && tp_pipe_wait_connected(p, T_MS) == 0, 1, "connect");
	for (unsigned i = 0; i < n_attempts; i++) {
		struct attempt *a = &attempts[i];
		r = tpt_msg_build(ctx, &a->s, TPT_MEM_PRIVATE, m);
		if (r == 0)
			r = write_wait(p, &m->m);
		tpt_msg_free(ctx, m);
		if (r != a->want) {
			tpt_log("attempt %u (%zu+%zu segments, %zu+%zu metadata): %d, want %d", i,
				a->s.n_payloads, a->s.n_tensors, a->s.meta_len, a->s.seg_meta_len,
				r, a->want);
			bad++;
		}
	}
	tpt_sync_wait(&to_a, T_MS);
	free(m);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return bad ? 1 : 0;
}

static int attempts_reader(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "reader", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "limits", NULL, &l);
	tpt_sync_post(&to_b, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	for (unsigned i = 0; i < n_attempts; i++) {
		if (attempts[i].want != 0)
			continue;
		r = tpt_msg_read_check(ctx, p, &attempts[i].s, TPT_MEM_PRIVATE, T_MS);
		TPT_REQUIRE(r == 0, 1, "accepted attempt %u: %d", i, r);
	}
	tpt_sync_post(&to_a, 0);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

static bool run_attempts(void)
{
	pid_t rd = tpt_fork(attempts_reader, NULL), wr = tpt_fork(attempts_writer, NULL);
	bool ok = tpt_wait_ok(wr, 2 * T_MS, "writer");

	return tpt_wait_ok(rd, 2 * T_MS, "reader") && ok;
}

START_TEST(test_limits_segments_max_at_limit_passes_above_fails)
{
	add(0, 4, 4, NULL, 0, 0);
	add(-E2BIG, 5, 4, NULL, 0, 0);
	add(-E2BIG, 0, 9, NULL, 0, 0);
	add(0, 0, 8, NULL, 0, 0);
	add(0, 8, 0, NULL, 0, 0);
	ck_assert(run_attempts());
}
END_TEST

START_TEST(test_limits_metadata_max_at_limit_passes_above_fails)
{
	add(0, 1, 1, NULL, 56, 100);	       /* 56 + 100 + 100 = 256 */
	add(-EMSGSIZE, 1, 1, NULL, 57, 100);   /* 257 */
	add(0, 0, 0, NULL, METADATA_MAX, 0);
	add(-EMSGSIZE, 0, 0, NULL, METADATA_MAX + 1, 0);
	add(-EMSGSIZE, 0, 2, NULL, 0, 129);    /* 258 in tensor metadata alone */
	add(0, 0, 2, NULL, 0, 128);
	ck_assert(run_attempts());
}
END_TEST

START_TEST(test_limits_message_bytes_max_at_limit_passes_above_fails)
{
	static const size_t one[] = { MESSAGE_BYTES_MAX };
	static const size_t one_over[] = { MESSAGE_BYTES_MAX + 1 };
	static const size_t two[] = { MESSAGE_BYTES_MAX / 2, MESSAGE_BYTES_MAX / 2 };
	static const size_t two_over[] = { MESSAGE_BYTES_MAX / 2, MESSAGE_BYTES_MAX / 2 + 1 };

	add(0, 0, 1, one, 0, 0);
	add(-EMSGSIZE, 0, 1, one_over, 0, 0);
	add(0, 1, 1, two, 0, 0);
	add(-EMSGSIZE, 1, 1, two_over, 0, 0);
	add(-EMSGSIZE, 1, 0, one_over, 0, 0);
	ck_assert(run_attempts());
}
END_TEST

/* ---- pipes per session -------------------------------------------------------------------- */

static int pipes_acceptor(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p[PIPES_MAX];
	struct tpt_msg_spec s;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "acceptor", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "pipes", NULL, &l);
	tpt_sync_post(&to_b, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	for (int i = 0; i < PIPES_MAX; i++) {
		r = tp_listener_accept_sync(l, T_MS, &p[i]);
		TPT_REQUIRE(r == 0, 1, "accept %d: %d", i, r);
	}
	memset(&s, 0, sizeof(s));
	s.pipe = 61;
	s.n_payloads = 1;
	s.lens[0] = 5000;
	r = tpt_msg_read_check(ctx, p[PIPES_MAX - 1], &s, TPT_MEM_PRIVATE, T_MS);
	TPT_REQUIRE(r == 0, 1, "read on the last pipe within the limit: %d", r);
	tpt_sync_wait(&to_a, T_MS);
	for (int i = 0; i < PIPES_MAX; i++)
		tp_pipe_close(p[i]);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

static int pipes_connector(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p[PIPES_MAX + 1];
	struct tpt_msg_spec s;
	struct tpt_msg m;
	int r;

	TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "listener not ready");
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, "connector", &ctx);
	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	for (int i = 0; i < PIPES_MAX; i++) {
		r = tp_connect(ctx, "pipes", &p[i]);
		if (r == 0)
			r = tp_pipe_wait_connected(p[i], T_MS);
		TPT_REQUIRE(r == 0, 1, "pipe %d of %d: %d %s", i + 1, PIPES_MAX, r,
			    tp_last_error());
	}
	r = tp_connect(ctx, "pipes", &p[PIPES_MAX]);
	if (r == 0) {
		r = tp_pipe_wait_connected(p[PIPES_MAX], T_MS);
		tp_pipe_close(p[PIPES_MAX]);
	}
	TPT_REQUIRE(r == -ENOBUFS, 1, "pipe %d over a limit of %d: %d (want -ENOBUFS)",
		    PIPES_MAX + 1, PIPES_MAX, r);
	TPT_REQUIRE(strstr(tp_last_error(), "tpipd --pipes-max"), 1,
		    "the error does not name the option: %s", tp_last_error());
	memset(&s, 0, sizeof(s));
	s.pipe = 61;
	s.n_payloads = 1;
	s.lens[0] = 5000;
	TPT_REQUIRE(tpt_msg_build(ctx, &s, TPT_MEM_PRIVATE, &m) == 0, 1, "build");
	r = tp_pipe_write_sync(p[PIPES_MAX - 1], &m.m);
	tpt_msg_free(ctx, &m);
	TPT_REQUIRE(r == 0, 1, "write on the last pipe within the limit: %d", r);
	tpt_sync_post(&to_a, 0);
	for (int i = 0; i < PIPES_MAX; i++)
		tp_pipe_close(p[i]);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_limits_pipes_max_at_limit_passes_above_fails)
{
	pid_t a = tpt_fork(pipes_acceptor, NULL), c = tpt_fork(pipes_connector, NULL);
	bool ok = tpt_wait_ok(c, 2 * T_MS, "connector");

	ck_assert(tpt_wait_ok(a, 2 * T_MS, "acceptor") && ok);
}
END_TEST

/* ---- messages queued per pipe direction ----------------------------------------------------- */

#define QLEN (256u << 10) /* rendezvous: stays queued until read */

static int queue_writer(void *arg)
{
	static struct tpt_done done;
	struct tpt_done_arg da[QUEUE_MAX + 1];
	struct tp_context *ctx;
	struct tp_pipe *p;
	struct tp_tensor t = { .device = { TP_DEVICE_CPU, 0 }, .length = QLEN };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	int r;

	TPT_REQUIRE(tpt_sync_wait(&to_b, T_MS) == 0, 1, "listener not ready");
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, "writer", &ctx);
	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_connect(ctx, "queue", &p);
	TPT_REQUIRE(r == 0 && tp_pipe_wait_connected(p, T_MS) == 0, 1, "connect");
	t.data = malloc(QLEN);
	tpt_fill(t.data, QLEN, 5);
	tpt_done_init(&done);
	/* One write over the queue limit: the library holds it until the reader makes room
	 * (flow control); the daemon's hard limit is tested with a raw client (test_flow). */
	for (unsigned i = 0; i <= QUEUE_MAX; i++) {
		da[i] = (struct tpt_done_arg){ &done, i };
		r = tp_pipe_write(p, &m, tpt_done_cb, &da[i]);
		TPT_REQUIRE(r == 0, 1, "write %u: %d", i, r);
	}
	tpt_sync_post(&to_a, 0); /* let the reader drain */
	r = tpt_done_wait(&done, QUEUE_MAX + 1, T_MS);
	TPT_REQUIRE(r == 0, 1, "only %u of %d writes completed", done.count, QUEUE_MAX + 1);
	for (unsigned i = 0; i <= QUEUE_MAX; i++)
		TPT_REQUIRE(done.status[i] == 0, 1, "write %u: %d", i, done.status[i]);
	TPT_REQUIRE(done.order_errors == 0, 1, "completions out of order");
	tpt_sync_wait(&to_a, T_MS);
	free(t.data);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

static int queue_reader(void *arg)
{
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *p;
	struct tpt_msg_spec s;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "reader", &ctx);

	if (r == 0)
		r = tp_listen(ctx, "queue", NULL, &l);
	tpt_sync_post(&to_b, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "listen: %d", r);
	r = tp_listener_accept_sync(l, T_MS, &p);
	TPT_REQUIRE(r == 0, 1, "accept: %d", r);
	TPT_REQUIRE(tpt_sync_wait(&to_a, T_MS) == 0, 1, "writer did not fill the queue");
	memset(&s, 0, sizeof(s));
	s.n_tensors = 1;
	s.lens[0] = QLEN;
	for (unsigned i = 0; i <= QUEUE_MAX; i++) {
		struct tp_descriptor *d = NULL;
		void *buf = malloc(QLEN);
		struct tp_slot slot = { .device = { TP_DEVICE_CPU, 0 }, .data = buf };
		struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };

		r = tp_pipe_read_descriptor_sync(p, T_MS, &d);
		if (r == 0)
			r = tp_pipe_read_sync(p, d, &a);
		TPT_REQUIRE(r == 0 && tpt_verify(buf, QLEN, 5, NULL), 1, "message %u: %d", i, r);
		free(buf);
	}
	tpt_sync_post(&to_a, 0);
	tp_pipe_close(p);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_limits_pipe_queue_max_holds_a_write_over_it)
{
	pid_t rd = tpt_fork(queue_reader, NULL), wr = tpt_fork(queue_writer, NULL);
	bool ok = tpt_wait_ok(wr, 2 * T_MS, "writer");

	ck_assert(tpt_wait_ok(rd, 2 * T_MS, "reader") && ok);
}
END_TEST

/* ---- shared buffers per session -------------------------------------------------------------- */

static int buffers_client(void *arg)
{
	struct tp_context *ctx;
	void *a = NULL, *b = NULL, *c = NULL;
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "buffers", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_buffer_alloc(ctx, 1u << 20, &a);
	TPT_REQUIRE(r == 0, 1, "a buffer of exactly --buffer-bytes-max: %d %s", r,
		    tp_last_error());
	r = tp_buffer_alloc(ctx, 4096, &b);
	TPT_REQUIRE(r == -ENOBUFS, 1, "bytes over --buffer-bytes-max: %d (want -ENOBUFS)", r);
	TPT_REQUIRE(strstr(tp_last_error(), "tpipd --buffer-bytes-max"), 1, "error: %s",
		    tp_last_error());
	TPT_REQUIRE(tp_buffer_free(ctx, a) == 0, 1, "free");
	r = tp_buffer_alloc(ctx, (1u << 20) + 1, &a);
	TPT_REQUIRE(r == -ENOBUFS, 1, "one buffer over --buffer-bytes-max: %d (want -ENOBUFS)", r);
	r = tp_buffer_alloc(ctx, 4096, &a);
	TPT_REQUIRE(r == 0, 1, "buffer 1 of 2: %d %s", r, tp_last_error());
	r = tp_buffer_alloc(ctx, 4096, &b);
	TPT_REQUIRE(r == 0, 1, "buffer 2 of 2: %d %s", r, tp_last_error());
	r = tp_buffer_alloc(ctx, 4096, &c);
	TPT_REQUIRE(r == -ENOBUFS, 1, "buffer 3 over --buffers-max 2: %d (want -ENOBUFS)", r);
	TPT_REQUIRE(strstr(tp_last_error(), "tpipd --buffers-max"), 1, "error: %s",
		    tp_last_error());
	TPT_REQUIRE(tp_buffer_free(ctx, b) == 0, 1, "free");
	r = tp_buffer_alloc(ctx, 4096, &c);
	TPT_REQUIRE(r == 0, 1, "buffer after a free: %d %s", r, tp_last_error());
	tp_buffer_free(ctx, a);
	tp_buffer_free(ctx, c);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_limits_buffers_max_and_bytes_at_limit_pass_above_fail)
{
	ck_assert(tpt_wait_ok(tpt_fork(buffers_client, NULL), T_MS, "client"));
}
END_TEST

/* ---- sessions and frames (raw) ------------------------------------------------------------- */

START_TEST(test_limits_sessions_max_at_limit_passes_above_fails)
{
	struct tpt_raw raw[17];
	int r;

	for (int i = 0; i < 16; i++) {
		ck_assert_int_eq(tpt_raw_connect(&raw[i], tpt_fixture_daemon.socket), 0);
		ck_assert_msg(tpt_raw_hello(&raw[i], TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0,
			      "session %d of 16 refused", i + 1);
	}
	r = tpt_raw_connect(&raw[16], tpt_fixture_daemon.socket);
	if (r == 0)
		r = tpt_raw_hello(&raw[16], TPW__V1__ROLE__ROLE_CLIENT, T_MS);
	ck_assert_msg(r < 0 && r != -ETIMEDOUT, "session 17 over --sessions-max 16: %d", r);
	tpt_raw_close(&raw[16]);
	tpt_raw_close(&raw[0]);
	/* a slot frees up once a session ends */
	for (unsigned round = 0;; round++) {
		ck_assert_int_eq(tpt_raw_connect(&raw[16], tpt_fixture_daemon.socket), 0);
		r = tpt_raw_hello(&raw[16], TPW__V1__ROLE__ROLE_CLIENT, T_MS);
		if (r == 0 || round > 200)
			break;
		tpt_raw_close(&raw[16]);
		tpt_backoff(round);
	}
	ck_assert_int_eq(r, 0);
	for (int i = 1; i <= 16; i++)
		tpt_raw_close(&raw[i]);
}
END_TEST

/* Sends Listen{@name} padded with an unknown field so that msg_len is exactly @body bytes. */
static void send_sized_listen(struct tpt_raw *raw, const char *name, size_t body)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Listen l = TPW__V1__LISTEN__INIT;
	uint8_t buf[8192];
	size_t n, fill;
	struct tpw_hdr h = { TPW_MAGIC, TPW_WIRE_VERSION, 0, (uint32_t)body, 0, 0 };

	l.req_id = 5;
	l.name = (char *)name;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTEN;
	m.listen = &l;
	n = protobuf_c_message_pack(&m.base, buf + TPW_HDR_SIZE);
	fill = body - n - 4;
	ck_assert(fill >= 128 && fill < (1u << 14) && TPW_HDR_SIZE + body <= sizeof(buf));
	buf[TPW_HDR_SIZE + n] = 0x82; /* field 16, length-delimited: a two-byte tag */
	buf[TPW_HDR_SIZE + n + 1] = 0x01;
	buf[TPW_HDR_SIZE + n + 2] = (uint8_t)((fill & 0x7f) | 0x80);
	buf[TPW_HDR_SIZE + n + 3] = (uint8_t)(fill >> 7);
	memset(buf + TPW_HDR_SIZE + n + 4, 'x', fill);
	h.seq = ++raw->seq;
	tpw_hdr_pack(&h, buf);
	ck_assert_int_eq(tpt_raw_send_bytes(raw, buf, TPW_HDR_SIZE + body, NULL, 0), 0);
}

START_TEST(test_limits_frame_max_at_limit_passes_above_closes)
{
	const char *args[] = { "--frame-max", "4096", NULL };
	struct tpt_raw raw;
	Tpw__V1__DaemonMsg *rep = NULL;

	ck_assert_int_eq(tpt_daemon_stop(&tpt_fixture_daemon), 0);
	ck_assert_int_eq(tpt_daemon_start(&tpt_fixture_daemon, args), 0);
	ck_assert_int_eq(tpt_raw_connect(&raw, tpt_fixture_daemon.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&raw, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	/* frame_max bounds msg_len + data_len: 4096 is the largest frame accepted */
	send_sized_listen(&raw, "at-limit", 4096);
	ck_assert_int_eq(tpt_raw_expect(&raw, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS, &rep), 0);
	ck_assert_int_eq(rep->reply->status, TPW__V1__STATUS__STATUS_OK);
	tpw_daemon_msg_free(rep);
	send_sized_listen(&raw, "over-limit", 4097);
	ck_assert_msg(tpt_raw_wait_closed(&raw, 10000) == 0, "frame over the limit kept open");
	tpt_raw_close(&raw);
	ck_assert(tpt_daemon_alive(&tpt_fixture_daemon));
}
END_TEST

static Suite *limits_suite(void)
{
	Suite *s = suite_create("limits");
	TCase *tc = tcase_create("limits");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_limits_segments_max_at_limit_passes_above_fails);
	tcase_add_test(tc, test_limits_metadata_max_at_limit_passes_above_fails);
	tcase_add_test(tc, test_limits_message_bytes_max_at_limit_passes_above_fails);
	tcase_add_test(tc, test_limits_pipes_max_at_limit_passes_above_fails);
	tcase_add_test(tc, test_limits_pipe_queue_max_holds_a_write_over_it);
	tcase_add_test(tc, test_limits_buffers_max_and_bytes_at_limit_pass_above_fail);
	tcase_add_test(tc, test_limits_sessions_max_at_limit_passes_above_fails);
	tcase_add_test(tc, test_limits_frame_max_at_limit_passes_above_closes);
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(limits_suite());
}
