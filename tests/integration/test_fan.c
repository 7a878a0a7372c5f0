/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: pipe sets (tp_set_*), a server's fan-in and fan-out over its accepted
 * pipes. The server waits for N pipes (and times out with fewer); reads any pipe fairly across
 * four writers, each writer's messages in order, each end reported once; broadcasts 16 MiB from
 * a shared buffer and from private memory to four readers that check every byte; a reader killed
 * during a broadcast fails only its own delivery; the set's limits (size, pipes of another
 * context). Each case has its own daemon; the server and the clients are child processes.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "itest.h"

#define T_MS 30000
#define NAME "fan"
#define BIG ((size_t)16 << 20)

static struct tpt_sync ready, go;

static void fan_setup(void)
{
	tpt_fixture_start();
	ck_assert_int_eq(tpt_sync_init(&ready), 0);
	ck_assert_int_eq(tpt_sync_init(&go), 0);
}

static void fan_teardown(void)
{
	tpt_sync_done(&ready);
	tpt_sync_done(&go);
	tpt_fixture_stop();
}

static uint8_t byte_of(unsigned who, unsigned idx, size_t i)
{
	return (uint8_t)(who * 131 + idx * 7 + i * 13 + (i >> 12));
}

/* Server side: context + listener, then one ready post per client. */
static int server_open(unsigned clients, struct tp_context **ctx, struct tp_listener **l)
{
	int r = tpt_ctx_new(&tpt_fixture_daemon, 0, "server", ctx);

	if (r == 0)
		r = tp_listen(*ctx, NAME, NULL, l);
	for (unsigned i = 0; i < clients; i++)
		tpt_sync_post(&ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, r, "listen: %d %s", r, tp_last_error());
	return 0;
}

static int client_open(struct tp_context **ctx, struct tp_pipe **p)
{
	int r = tpt_sync_wait(&ready, T_MS);

	TPT_REQUIRE(r == 0, r < 0 ? r : -EIO, "listener not ready: %d", r);
	r = tpt_ctx_new(&tpt_fixture_daemon, 0, "client", ctx);
	if (r == 0)
		r = tp_connect(*ctx, NAME, p);
	if (r == 0)
		r = tp_pipe_wait_connected(*p, T_MS);
	TPT_REQUIRE(r == 0, r, "connect: %d %s", r, tp_last_error());
	return 0;
}

/* Forks @n clients running @fn(index) and the server @srv; true if all exit 0. */
static bool run_fan(tpt_child_fn srv, tpt_child_fn fn, unsigned n)
{
	pid_t pids[8];
	bool ok;

	for (unsigned i = 0; i < n; i++)
		pids[i] = tpt_fork(fn, (void *)(uintptr_t)i);
	ok = tpt_wait_ok(tpt_fork(srv, NULL), T_MS * 2, "server");
	for (unsigned i = 0; i < n; i++)
		ok = tpt_wait_ok(pids[i], T_MS * 2, "client") && ok;
	return ok;
}

/* ---- waiting for N pipes -------------------------------------------------------------------- */

static int idle_client(void *arg)
{
	struct tp_context *ctx = NULL;
	struct tp_pipe *p = NULL;
	int r = client_open(&ctx, &p);

	(void)arg;
	if (r == 0)
		r = tpt_sync_wait(&go, T_MS);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return r < 0 ? 1 : 0;
}

static int wait_server(void *arg)
{
	struct tp_context *ctx = NULL;
	struct tp_listener *l = NULL;
	struct tp_pipe_set *s = NULL;
	int r;

	(void)arg;
	if (server_open(3, &ctx, &l))
		return 1;
	TPT_REQUIRE(tp_set_new(ctx, 3, &s) == 0, 1, "set: %s", tp_last_error());
	r = tp_set_wait_pipes(s, l, 4, 100);
	TPT_REQUIRE(r == -E2BIG, 1, "waiting for more than the set holds: %d", r);
	r = tp_set_wait_pipes(s, l, 3, T_MS);
	TPT_REQUIRE(r == 0 && tp_set_size(s) == 3, 1, "wait for 3: %d %s", r, tp_last_error());
	tp_set_free(s);
	TPT_REQUIRE(tp_set_new(ctx, 4, &s) == 0, 1, "set: %s", tp_last_error());
	r = tp_set_wait_pipes(s, l, 1, 300);
	TPT_REQUIRE(r == -ETIMEDOUT && tp_set_size(s) == 0, 1, "fewer than 1: %d", r);
	tp_set_free(s);
	for (unsigned i = 0; i < 3; i++)
		tpt_sync_post(&go, 0);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_fan_server_waits_for_n_pipes_and_times_out_with_fewer)
{
	ck_assert(run_fan(wait_server, idle_client, 3));
}
END_TEST

/* ---- fair fan-in ------------------------------------------------------------------------- */

#define WRITERS 4
#define FEW 20
#define MANY 200
#define SMALL 512

static unsigned writer_count(unsigned w)
{
	return w == 0 ? MANY : FEW;
}

static int fair_writer(void *arg)
{
	unsigned w = (unsigned)(uintptr_t)arg, n = writer_count(w);
	static uint8_t data[MANY][SMALL];
	static uint8_t meta[MANY][2];
	static struct tp_payload pl[MANY];
	static struct tp_message m[MANY];
	static struct tpt_done_arg args[MANY];
	struct tp_context *ctx = NULL;
	struct tp_pipe *p = NULL;
	struct tpt_done done;
	int r = client_open(&ctx, &p);

	if (r)
		return 1;
	tpt_done_init(&done);
	for (unsigned i = 0; i < n; i++) {
		for (size_t k = 0; k < SMALL; k++)
			data[i][k] = byte_of(w, i, k);
		meta[i][0] = (uint8_t)w;
		meta[i][1] = (uint8_t)i;
		pl[i] = (struct tp_payload){ .data = data[i], .length = SMALL };
		m[i] = (struct tp_message){ .metadata = meta[i], .metadata_len = 2,
					    .payloads = &pl[i], .n_payloads = 1 };
		args[i] = (struct tpt_done_arg){ .done = &done, .index = i };
		r = tp_pipe_write(p, &m[i], tpt_done_cb, &args[i]);
		TPT_REQUIRE(r == 0, 1, "write %u: %d %s", i, r, tp_last_error());
	}
	/* small writes complete once the daemon holds them: all are there before the reads */
	r = tpt_done_wait(&done, n, T_MS);
	TPT_REQUIRE(r == 0 && done.order_errors == 0, 1, "writes: %d", r);
	tpt_sync_post(&go, 0);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

/* Reads one message of @d on @p and checks it; returns its writer or -1. */
static int fair_read(struct tp_pipe *p, struct tp_descriptor *d, unsigned *next)
{
	uint8_t buf[SMALL], meta[2];
	struct tp_slot slot = { .data = buf };
	struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };
	unsigned w;
	int r;

	if (d->metadata_len != 2 || d->n_payloads != 1 || d->payloads[0].length != SMALL) {
		tp_descriptor_free(d);
		return -1;
	}
	memcpy(meta, d->metadata, 2);
	w = meta[0];
	r = tp_pipe_read_sync(p, d, &a);
	if (r || w >= WRITERS || meta[1] != (uint8_t)next[w]) {
		fprintf(stderr, "read from %u: %d, index %u wanted %u\n", w, r, meta[1], next[w]);
		return -1;
	}
	for (size_t k = 0; k < SMALL; k++)
		if (buf[k] != byte_of(w, next[w], k))
			return -1;
	next[w]++;
	return (int)w;
}

/* One request answered by the daemon (a shared buffer registered and dropped). */
static int settle(struct tp_context *ctx)
{
	void *b = NULL;
	int r = tp_buffer_alloc(ctx, 4096, &b);

	if (r == 0)
		r = tp_buffer_free(ctx, b);
	return r;
}

static int fair_server(void *arg)
{
	unsigned next[WRITERS] = { 0 }, seen_first[WRITERS] = { 0 }, ends = 0, reads = 0;
	struct tp_context *ctx = NULL;
	struct tp_listener *l = NULL;
	struct tp_pipe_set *s = NULL;
	int r;

	(void)arg;
	if (server_open(WRITERS, &ctx, &l))
		return 1;
	TPT_REQUIRE(tp_set_new(ctx, WRITERS, &s) == 0, 1, "set: %s", tp_last_error());
	r = tp_set_wait_pipes(s, l, WRITERS, T_MS);
	TPT_REQUIRE(r == 0, 1, "wait: %d %s", r, tp_last_error());
	for (unsigned i = 0; i < WRITERS; i++)
		TPT_REQUIRE(tpt_sync_wait(&go, T_MS) == 0, 1, "writer %u did not write", i);
	for (;;) {
		struct tp_descriptor *d = NULL;
		struct tp_pipe *p = NULL;
		int w;

		r = tp_set_read_any(s, T_MS, &p, &d);
		if (r == -ENOENT)
			break;
		TPT_REQUIRE(r >= 0, 1, "read_any: %d %s", r, tp_last_error());
		if (r == 1) {
			TPT_REQUIRE(d == NULL && tp_set_last_status(s) < 0, 1, "end without error");
			tp_pipe_close(p);
			ends++;
			continue;
		}
		w = fair_read(p, d, next);
		TPT_REQUIRE(w >= 0, 1, "bad message");
		/* a round trip to the daemon: the refilled descriptor requests have been answered,
		 * so every writer with messages left is ready at the next call and the choice is the
		 * set's alone */
		r = settle(ctx);
		TPT_REQUIRE(r == 0, 1, "round trip: %d", r);
		if (reads++ < WRITERS * FEW * 3 / 4)
			seen_first[w]++;
	}
	TPT_REQUIRE(ends == WRITERS, 1, "%u ends reported, wanted %u", ends, WRITERS);
	for (unsigned w = 0; w < WRITERS; w++)
		TPT_REQUIRE(next[w] == writer_count(w), 1, "writer %u: %u messages", w, next[w]);
	/* round-robin: in the first 60 reads, while every writer has messages waiting, each gets
	 * about a quarter (15); the busy writer takes no more than its share */
	for (unsigned w = 0; w < WRITERS; w++)
		TPT_REQUIRE(seen_first[w] >= 12 && seen_first[w] <= 18, 1,
			    "writer %u: %u of the first 60 reads", w, seen_first[w]);
	tp_set_free(s);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_fan_read_any_is_fair_in_order_and_reports_each_end_once)
{
	ck_assert(run_fan(fair_server, fair_writer, WRITERS));
}
END_TEST

/* ---- broadcast ----------------------------------------------------------------------------- */

#define READERS 4
#define VICTIM 3

static bool kill_victim;

static int bcast_reader(void *arg)
{
	unsigned who = (unsigned)(uintptr_t)arg;
	struct tp_context *ctx = NULL;
	struct tp_pipe *p = NULL;
	uint8_t *buf = malloc(BIG);
	int r = client_open(&ctx, &p);

	TPT_REQUIRE(r == 0 && buf, 1, "open");
	for (unsigned round = 0; round < (kill_victim ? 1u : 2u); round++) {
		struct tp_descriptor *d = NULL;
		struct tp_slot slot = { .data = buf };
		struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };

		r = tp_pipe_read_descriptor_sync(p, T_MS, &d);
		TPT_REQUIRE(r == 0, 1, "descriptor: %d %s", r, tp_last_error());
		if (kill_victim && who == VICTIM)
			raise(SIGKILL);
		TPT_REQUIRE(d->n_payloads == 1 && d->payloads[0].length == BIG, 1, "shape");
		r = tp_pipe_read_sync(p, d, &a);
		TPT_REQUIRE(r == 0, 1, "read: %d %s", r, tp_last_error());
		for (size_t k = 0; k < BIG; k++)
			TPT_REQUIRE(buf[k] == byte_of(9, round, k), 1, "byte %zu round %u", k, round);
	}
	if (!kill_victim)
		tpt_sync_post(&go, 0);
	free(buf);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

static int bcast_server(void *arg)
{
	struct tp_context *ctx = NULL;
	struct tp_listener *l = NULL;
	struct tp_pipe_set *s = NULL;
	int st[READERS];
	void *shm = NULL;
	uint8_t *priv = malloc(BIG);
	unsigned want = kill_victim ? READERS - 1 : READERS;
	int r;

	(void)arg;
	if (server_open(READERS, &ctx, &l) || !priv)
		return 1;
	TPT_REQUIRE(tp_set_new(ctx, READERS, &s) == 0, 1, "set: %s", tp_last_error());
	r = tp_set_wait_pipes(s, l, READERS, T_MS);
	TPT_REQUIRE(r == 0, 1, "wait: %d %s", r, tp_last_error());
	r = tp_buffer_alloc(ctx, BIG, &shm);
	TPT_REQUIRE(r == 0, 1, "buffer: %d", r);
	for (size_t k = 0; k < BIG; k++) {
		((uint8_t *)shm)[k] = byte_of(9, 0, k);
		priv[k] = byte_of(9, 1, k);
	}
	for (unsigned round = 0; round < 2; round++) {
		struct tp_payload pl = { .data = round ? (void *)priv : shm, .length = BIG };
		struct tp_message m = { .payloads = &pl, .n_payloads = 1 };

		if (round && kill_victim) /* the victim is gone: nothing more to it */
			break;
		r = tp_set_broadcast(s, &m, T_MS, st, READERS);
		TPT_REQUIRE(r == (int)want, 1, "round %u: %d delivered %s", round, r,
			    tp_last_error());
		for (unsigned i = 0, ok = 0; i < READERS; i++) { /* the victim's own error */
			ok += st[i] == 0;
			TPT_REQUIRE(st[i] <= 0 && (i + 1 < READERS || ok == want), 1,
				    "pipe %u: %d, %u delivered", i, st[i], ok);
		}
	}
	if (!kill_victim)
		for (unsigned i = 0; i < READERS; i++)
			TPT_REQUIRE(tpt_sync_wait(&go, T_MS) == 0, 1, "reader %u", i);
	tp_set_free(s);
	tp_buffer_free(ctx, shm);
	free(priv);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_fan_broadcast_16mib_from_shared_and_private_memory)
{
	kill_victim = false;
	ck_assert(run_fan(bcast_server, bcast_reader, READERS));
}
END_TEST

START_TEST(test_fan_reader_killed_in_broadcast_fails_only_its_delivery)
{
	pid_t pids[READERS];
	bool ok = true;

	kill_victim = true;
	for (unsigned i = 0; i < READERS; i++)
		pids[i] = tpt_fork(bcast_reader, (void *)(uintptr_t)i);
	ok = tpt_wait_ok(tpt_fork(bcast_server, NULL), T_MS * 2, "server");
	for (unsigned i = 0; i < READERS; i++) {
		int status = 0;

		if (i == VICTIM) {
			ck_assert_int_eq(tpt_wait(pids[i], T_MS, &status), 0);
			ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
		} else {
			ok = tpt_wait_ok(pids[i], T_MS * 2, "reader") && ok;
		}
	}
	ck_assert(ok);
}
END_TEST

/* ---- a slow reader --------------------------------------------------------------------- */

/* Reader 0 never reads until told; the others read one 16 MiB broadcast. */
static int slow_reader(void *arg)
{
	unsigned who = (unsigned)(uintptr_t)arg;
	struct tp_context *ctx = NULL;
	struct tp_pipe *p = NULL;
	struct tp_descriptor *d = NULL;
	uint8_t *buf = malloc(BIG);
	struct tp_slot slot = { .data = buf };
	struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };
	int r = client_open(&ctx, &p);

	TPT_REQUIRE(r == 0 && buf, 1, "open");
	if (who == 0) {
		r = tpt_sync_wait(&go, T_MS);
	} else {
		r = tp_pipe_read_descriptor_sync(p, T_MS, &d);
		if (r == 0)
			r = tp_pipe_read_sync(p, d, &a);
		for (size_t k = 0; r == 0 && k < BIG; k++)
			r = buf[k] == byte_of(9, 0, k) ? 0 : -EILSEQ;
	}
	TPT_REQUIRE(r == 0, 1, "reader %u: %d %s", who, r, tp_last_error());
	free(buf);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

static int slow_server(void *arg)
{
	struct tp_context *ctx = NULL;
	struct tp_listener *l = NULL;
	struct tp_pipe_set *s = NULL;
	struct tp_pipe *slow = NULL;
	struct tp_payload pl = { .length = BIG };
	struct tp_message m = { .payloads = &pl, .n_payloads = 1 };
	int st[READERS];
	void *shm = NULL;
	int r;

	(void)arg;
	if (server_open(READERS, &ctx, &l))
		return 1;
	TPT_REQUIRE(tp_set_new(ctx, READERS, &s) == 0, 1, "set: %s", tp_last_error());
	r = tp_set_wait_pipes(s, l, READERS, T_MS);
	TPT_REQUIRE(r == 0, 1, "wait: %d %s", r, tp_last_error());
	r = tp_buffer_alloc(ctx, BIG, &shm);
	TPT_REQUIRE(r == 0, 1, "buffer: %d", r);
	for (size_t k = 0; k < BIG; k++)
		((uint8_t *)shm)[k] = byte_of(9, 0, k);
	pl.data = shm;
	r = tp_set_broadcast(s, &m, 1000, st, READERS);
	TPT_REQUIRE(r == READERS - 1, 1, "%d delivered %s", r, tp_last_error());
	/* which pipe is reader 0's is not known here: exactly one failed, cancelled */
	for (unsigned i = 0; i < READERS; i++) {
		TPT_REQUIRE(st[i] == 0 || st[i] == -ECANCELED, 1, "pipe %u: %d", i, st[i]);
		if (st[i])
			slow = tp_set_pipe(s, i);
	}
	TPT_REQUIRE(slow != NULL, 1, "no cancelled delivery");
	tpt_sync_post(&go, 0);
	tp_set_free(s);
	tp_buffer_free(ctx, shm);
	tp_listener_close(l);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_fan_slow_reader_fails_only_its_own_delivery)
{
	ck_assert(run_fan(slow_server, slow_reader, READERS));
}
END_TEST

/* ---- limits --------------------------------------------------------------------------------- */

START_TEST(test_fan_set_limits_and_pipes_of_another_context)
{
	struct tp_context *a = NULL, *b = NULL;
	struct tp_listener *l = NULL;
	struct tp_pipe_set *s = NULL;
	struct tp_pipe *pa = NULL, *pb = NULL, *acc = NULL;

	ck_assert_int_eq(tp_set_new(NULL, 1, &s), -EINVAL);
	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, "a", &a), 0);
	ck_assert_int_eq(tpt_ctx_new(&tpt_fixture_daemon, 0, "b", &b), 0);
	ck_assert_int_eq(tp_set_new(a, 0, &s), -EINVAL);
	ck_assert_int_eq(tp_set_new(a, TP_SET_MAX_PIPES + 1, &s), -EINVAL);
	ck_assert_int_eq(tp_set_new(a, TP_SET_MAX_PIPES, &s), 0);
	tp_set_free(s);
	ck_assert_int_eq(tp_set_new(a, 1, &s), 0);
	{
		struct tp_message empty = { 0 };
		struct tp_pipe *rp = NULL;
		struct tp_descriptor *rd = NULL;

		ck_assert_int_eq(tp_set_broadcast(s, &empty, 0, NULL, 0), -ENOENT);
		ck_assert_int_eq(tp_set_read_any(s, 0, &rp, &rd), -ENOENT);
	}
	ck_assert_int_eq(tp_listen(a, NAME, NULL, &l), 0);
	ck_assert_int_eq(tp_connect(b, NAME, &pb), 0);
	ck_assert_int_eq(tp_listener_accept_sync(l, T_MS, &acc), 0);
	ck_assert_int_eq(tp_connect(a, NAME, &pa), 0);
	/* b's pipe cannot join a's set: a set only ever holds its own context's pipes */
	ck_assert_int_eq(tp_set_add(s, pb), -EXDEV);
	ck_assert_int_eq(tp_set_add(s, acc), 0);	  /* at the limit */
	ck_assert_int_eq(tp_set_add(s, acc), -EEXIST);
	ck_assert_int_eq(tp_set_add(s, pa), -E2BIG); /* just above */
	ck_assert_int_eq(tp_set_size(s), 1);
	ck_assert_ptr_eq(tp_set_pipe(s, 0), acc);
	/* staging: private bytes just above TP_SET_STAGE_MAX, in one payload or two, are refused
	 * before any memory is read or mapped (only the pointers are compared) */
	{
		static char one;
		struct tp_payload pl[2] = { { .data = &one, .length = TP_SET_STAGE_MAX + 1 },
					    { .data = &one, .length = 1 } };
		struct tp_message m = { .payloads = pl, .n_payloads = 1 };
		int st = 1;

		ck_assert_int_eq(tp_set_broadcast(s, &m, T_MS, &st, 1), -E2BIG);
		pl[0].length = TP_SET_STAGE_MAX;
		m.n_payloads = 2;
		ck_assert_int_eq(tp_set_broadcast(s, &m, T_MS, &st, 1), -E2BIG);
		ck_assert_int_eq(st, 1); /* nothing was delivered, no result written */
		pl[0].length = 1;
		ck_assert_int_eq(tp_set_broadcast(s, &m, T_MS, &st, 1), 1); /* just below */
		ck_assert_int_eq(st, 0);
	}
	ck_assert_ptr_null(tp_set_pipe(s, 1));
	tp_set_free(s);
	tp_pipe_close(pa);
	tp_pipe_close(pb);
	tp_listener_close(l);
	tp_context_free(b);
	tp_context_free(a);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("fan");
	TCase *tc = tcase_create("fan");

	tcase_add_checked_fixture(tc, fan_setup, fan_teardown);
	tcase_add_test(tc, test_fan_server_waits_for_n_pipes_and_times_out_with_fewer);
	tcase_add_test(tc, test_fan_read_any_is_fair_in_order_and_reports_each_end_once);
	tcase_add_test(tc, test_fan_broadcast_16mib_from_shared_and_private_memory);
	tcase_add_test(tc, test_fan_reader_killed_in_broadcast_fails_only_its_delivery);
	tcase_add_test(tc, test_fan_slow_reader_fails_only_its_own_delivery);
	tcase_add_test(tc, test_fan_set_limits_and_pipes_of_another_context);
	tcase_set_timeout(tc, 150);
	suite_add_tcase(s, tc);
	return tpt_run_suite(s);
}
