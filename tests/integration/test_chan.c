/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: named channels hosted by the daemon (docs/channels.md), after torch-ipc's
 * channel tests. Producers and consumers in several processes on each side move every item
 * exactly once; batches stay contiguous; close then drain (CLOSED with the items left, then
 * -EPIPE; writes after close refused; close is idempotent); a reader blocked in another
 * process is woken by close; the oldest waiting reader gets the first item; try-once and timed
 * reads; release is not close, persistent channels outlive their handles until unlinked; a
 * three-process pipeline shuts down by cascading closes; bad input (unknown name, exclusive
 * create of an existing name, bad name, empty item, a batch above capacity, a full channel);
 * the limits per uid and per channel just below and just above; another uid is refused a
 * private channel and admitted to an "anyone" one, and cannot create in another uid's names.
 */
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"

#define T_MS 30000
#define NOBODY 65534

static void setup(void)
{
	tpt_fixture_start();
}

static void teardown(void)
{
	tpt_fixture_stop();
}

static struct tp_context *ctx_new(const struct tpt_daemon *d)
{
	struct tp_context *ctx = NULL;

	if (tpt_ctx_new(d, 0, "chan", &ctx) < 0)
		return NULL;
	return ctx;
}

static int chan_open(struct tp_context *ctx, const char *name, unsigned flags,
		     struct tp_chan **ret)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = flags, .owner_uid = -1 };

	return tp_chan_open(ctx, name, &o, ret);
}

static int write_u32(struct tp_chan *ch, const uint32_t *v, size_t n)
{
	struct iovec iov[64];

	for (size_t i = 0; i < n; i++) {
		iov[i].iov_base = (void *)&v[i];
		iov[i].iov_len = sizeof(v[i]);
	}
	return tp_chan_write(ch, iov, n, 0);
}

/* Reads one 4-byte item into *@ret. Return: tp_chan_read()'s result, -EPROTO for a bad size. */
static int read_u32(struct tp_chan *ch, uint32_t *ret, int timeout_ms)
{
	void *item = NULL;
	size_t len = 0;
	int r = tp_chan_read(ch, &item, &len, timeout_ms);

	if (r >= 0) {
		if (len != sizeof(*ret))
			r = -EPROTO;
		else
			memcpy(ret, item, sizeof(*ret));
		free(item);
	}
	return r;
}

/* `tpipctl channels --json` on @d: field @key of channel @name (-1 if absent). */
static long ctl_field(const struct tpt_daemon *d, const char *name, const char *key)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", d->socket, "--json", "channels", NULL };
	struct tpt_cmd_result res;
	struct json_object *root, *arr, *v;
	long out = -1;

	ck_assert_msg(bin && *bin, "TPIPCTL_BIN is not set");
	ck_assert_int_eq(tpt_run(argv, T_MS, &res), 0);
	ck_assert_msg(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0, "tpipctl: %s",
		      res.err);
	root = json_tokener_parse(res.out);
	ck_assert_ptr_nonnull(root);
	ck_assert(json_object_object_get_ex(root, "channels", &arr));
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *c = json_object_array_get_idx(arr, i), *n;

		if (json_object_object_get_ex(c, "name", &n) &&
		    strcmp(json_object_get_string(n), name) == 0 &&
		    json_object_object_get_ex(c, key, &v))
			out = json_object_get_int64(v);
	}
	json_object_put(root);
	tpt_cmd_result_free(&res);
	return out;
}

/* Runs until `tpipctl channels` shows @want in field @key of @name, or fails the test. */
static void wait_field(const char *name, const char *key, long want)
{
	uint64_t end = tpt_now_ms() + T_MS;

	while (ctl_field(&tpt_fixture_daemon, name, key) != want)
		ck_assert_msg(tpt_now_ms() < end, "never %s %ld on %s", key, want, name);
}

static void wait_readers(const char *name, long want)
{
	wait_field(name, "readers_waiting", want);
}

/* ---- one process --------------------------------------------------------------------------- */

START_TEST(test_close_then_drain)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	const uint32_t v[3] = { 7, 8, 9 };
	struct tp_chan *ch, *other;
	uint32_t got;

	ck_assert_ptr_nonnull(ctx);
	ck_assert_int_eq(chan_open(ctx, "cd", TP_CHAN_CREATE, &ch), 0);
	ck_assert_int_eq(chan_open(ctx, "cd", 0, &other), 0);
	ck_assert_int_eq(write_u32(ch, v, 3), 0);
	ck_assert_int_eq(tp_chan_close(other), 0);
	ck_assert_int_eq(tp_chan_close(ch), 0); /* idempotent */
	ck_assert_int_eq(write_u32(ch, v, 1), -EPIPE);
	ck_assert_str_eq(ctl_field(&tpt_fixture_daemon, "cd", "items") == 3 ? "3" : "?", "3");
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(read_u32(other, &got, 0), TP_CHAN_CLOSED);
		ck_assert_uint_eq(got, v[i]);
	}
	ck_assert_int_eq(read_u32(ch, &got, 0), -EPIPE);
	ck_assert_int_eq(read_u32(ch, &got, 1000), -EPIPE);
	tp_chan_release(other);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

START_TEST(test_try_once_and_timeout)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	const uint32_t v = 5;
	struct tp_chan *ch;
	uint32_t got;
	uint64_t t0;

	ck_assert_ptr_nonnull(ctx);
	ck_assert_int_eq(chan_open(ctx, "t", TP_CHAN_CREATE, &ch), 0);
	ck_assert_int_eq(read_u32(ch, &got, 0), -EAGAIN);
	t0 = tpt_now_ms();
	ck_assert_int_eq(read_u32(ch, &got, 100), -ETIMEDOUT);
	ck_assert_uint_ge(tpt_now_ms() - t0, 100);
	ck_assert_int_eq(write_u32(ch, &v, 1), 0);
	ck_assert_int_eq(read_u32(ch, &got, 0), 0);
	ck_assert_uint_eq(got, 5);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

START_TEST(test_release_is_not_close_and_persistence)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	const uint32_t v = 11;
	struct tp_chan *a, *b;
	uint32_t got;

	ck_assert_ptr_nonnull(ctx);
	/* Not persistent: lives while a handle is open, whoever opened it. */
	ck_assert_int_eq(chan_open(ctx, "tmp", TP_CHAN_CREATE, &a), 0);
	ck_assert_int_eq(chan_open(ctx, "tmp", 0, &b), 0);
	ck_assert_int_eq(write_u32(a, &v, 1), 0);
	ck_assert_int_eq(tp_chan_release(a), 0);
	ck_assert_int_eq(read_u32(b, &got, 0), 0); /* not closed by the release */
	ck_assert_int_eq(tp_chan_release(b), 0);
	ck_assert_int_eq(chan_open(ctx, "tmp", 0, &a), -ENOENT);
	/* Persistent: outlives its handles until unlinked. */
	ck_assert_int_eq(chan_open(ctx, "keep", TP_CHAN_CREATE | TP_CHAN_PERSISTENT, &a), 0);
	ck_assert_int_eq(write_u32(a, &v, 1), 0);
	ck_assert_int_eq(tp_chan_release(a), 0);
	ck_assert_int_eq(chan_open(ctx, "keep", 0, &a), 0);
	ck_assert_int_eq(read_u32(a, &got, 0), 0);
	ck_assert_uint_eq(got, 11);
	ck_assert_int_eq(tp_chan_unlink(ctx, "keep", -1), 0);
	ck_assert_int_eq(write_u32(a, &v, 1), 0); /* the open handle keeps it */
	ck_assert_int_eq(chan_open(ctx, "keep", 0, &b), -ENOENT);
	ck_assert_int_eq(tp_chan_unlink(ctx, "keep", -1), -ENOENT);
	tp_chan_release(a);
	tp_context_free(ctx);
}
END_TEST

START_TEST(test_bad_input)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE,
				     .capacity_items = 4, .owner_uid = -1 };
	const uint32_t v[5] = { 1, 2, 3, 4, 5 };
	struct iovec empty = { .iov_base = (void *)v, .iov_len = 0 };
	struct tp_chan *ch, *x;
	uint32_t got;

	ck_assert_ptr_nonnull(ctx);
	ck_assert_int_eq(chan_open(ctx, "nosuch", 0, &x), -ENOENT);
	ck_assert_int_eq(chan_open(ctx, "bad/name", TP_CHAN_CREATE, &x), -EINVAL);
	ck_assert_int_eq(tp_chan_open(ctx, "cap", &o, &ch), 0);
	ck_assert_int_eq(chan_open(ctx, "cap", TP_CHAN_CREATE | TP_CHAN_EXCL, &x), -EADDRINUSE);
	ck_assert_int_eq(tp_chan_write(ch, &empty, 1, 0), -EINVAL);
	ck_assert_int_eq(tp_chan_write(ch, &empty, 0, 0), -EINVAL);
	ck_assert_int_eq(write_u32(ch, v, 5), -EMSGSIZE); /* just above the capacity */
	ck_assert_int_eq(write_u32(ch, v, 3), 0);
	ck_assert_int_eq(write_u32(ch, v, 2), -ENOBUFS); /* 5 > 4: nothing written */
	ck_assert_int_eq(write_u32(ch, v + 3, 1), 0);	  /* just at the capacity */
	ck_assert_int_eq(write_u32(ch, v, 1), -ENOBUFS);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(read_u32(ch, &got, 0), 0);
		ck_assert_uint_eq(got, v[i]);
	}
	ck_assert_int_eq(read_u32(ch, &got, 0), 0);
	ck_assert_uint_eq(got, 4);
	tp_chan_release(ch);
	ck_assert(tpt_daemon_alive(&tpt_fixture_daemon));
	tp_context_free(ctx);
}
END_TEST

/* ---- limits -------------------------------------------------------------------------------- */

START_TEST(test_limits_per_uid_and_channel)
{
	static const char *const args[] = { "--chans-per-uid", "2", "--chan-items-max", "3",
					    "--chan-bytes-max", "64", NULL };
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	const uint32_t v[4] = { 1, 2, 3, 4 };
	struct tpt_daemon d;
	struct tp_context *ctx;
	struct tp_chan *a, *b, *c;
	uint8_t big[65];
	struct iovec iov = { .iov_base = big, .iov_len = 64 };

	memset(big, 1, sizeof(big));
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ctx = ctx_new(&d);
	ck_assert_ptr_nonnull(ctx);
	ck_assert_int_eq(chan_open(ctx, "l1", TP_CHAN_CREATE, &a), 0);
	ck_assert_int_eq(chan_open(ctx, "l2", TP_CHAN_CREATE, &b), 0); /* at chans-per-uid */
	ck_assert_int_eq(chan_open(ctx, "l3", TP_CHAN_CREATE, &c), -ENOBUFS);
	ck_assert_int_eq(write_u32(a, v, 3), 0);			  /* at chan-items-max */
	ck_assert_int_eq(write_u32(a, v, 1), -ENOBUFS);
	ck_assert_int_eq(tp_chan_write(b, &iov, 1, 0), 0); /* at chan-bytes-max */
	tp_chan_release(b);
	ck_assert_int_eq(chan_open(ctx, "l2", TP_CHAN_CREATE, &b), 0);
	iov.iov_len = 65;
	ck_assert_int_eq(tp_chan_write(b, &iov, 1, 0), -EMSGSIZE);
	tp_chan_release(b);
	o.capacity_items = 4; /* above chan-items-max */
	ck_assert_int_eq(tp_chan_open(ctx, "l2", &o, &b), -ENOBUFS);
	o.capacity_items = 3;
	ck_assert_int_eq(tp_chan_open(ctx, "l2", &o, &b), 0);
	tp_chan_release(b);
	tp_chan_release(a);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

START_TEST(test_bytes_per_uid)
{
	static const char *const args[] = { "--chan-bytes-per-uid", "8", NULL };
	const uint32_t v[3] = { 1, 2, 3 };
	struct tpt_daemon d;
	struct tp_context *ctx;
	struct tp_chan *a, *b;

	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ctx = ctx_new(&d);
	ck_assert_ptr_nonnull(ctx);
	ck_assert_int_eq(chan_open(ctx, "u1", TP_CHAN_CREATE, &a), 0);
	ck_assert_int_eq(chan_open(ctx, "u2", TP_CHAN_CREATE, &b), 0);
	ck_assert_int_eq(write_u32(a, v, 1), 0);
	ck_assert_int_eq(write_u32(b, v, 1), 0);	/* 8 bytes: at the limit */
	ck_assert_int_eq(write_u32(b, v, 1), -ENOBUFS); /* 12: above */
	tp_chan_release(b);
	tp_chan_release(a);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

/* ---- several processes --------------------------------------------------------------------- */

#define PC_WRITERS 3
#define PC_READERS 3
#define PC_BATCHES 100
#define PC_BATCH 2

static uint8_t *seen; /* shared: [writer][seq] times read */

static int pc_writer(void *arg)
{
	unsigned w = (unsigned)(uintptr_t)arg;
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	struct tp_chan *ch;
	uint32_t v[PC_BATCH];
	int r;

	TPT_REQUIRE(ctx, 1, "context");
	TPT_REQUIRE(chan_open(ctx, "pc", 0, &ch) == 0, 1, "open: %s", tp_last_error());
	for (unsigned b = 0; b < PC_BATCHES; b++) {
		for (unsigned i = 0; i < PC_BATCH; i++)
			v[i] = w << 16 | (b * PC_BATCH + i);
		r = write_u32(ch, v, PC_BATCH);
		TPT_REQUIRE(r == 0, 1, "write: %d %s", r, tp_last_error());
	}
	tp_chan_release(ch);
	tp_context_free(ctx);
	return 0;
}

static int pc_reader(void *arg)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	struct tp_chan *ch;
	uint32_t v;
	int r;

	(void)arg;
	TPT_REQUIRE(ctx, 1, "context");
	TPT_REQUIRE(chan_open(ctx, "pc", 0, &ch) == 0, 1, "open: %s", tp_last_error());
	while ((r = read_u32(ch, &v, -1)) >= 0) {
		TPT_REQUIRE((v >> 16) < PC_WRITERS && (v & 0xffff) < PC_BATCHES * PC_BATCH, 1,
			    "item %x", v);
		__atomic_add_fetch(&seen[(v >> 16) * PC_BATCHES * PC_BATCH + (v & 0xffff)], 1,
				   __ATOMIC_RELAXED);
	}
	TPT_REQUIRE(r == -EPIPE, 1, "read ended with %d %s", r, tp_last_error());
	tp_chan_release(ch);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_producers_consumers)
{
	size_t n = PC_WRITERS * PC_BATCHES * PC_BATCH;
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	pid_t w[PC_WRITERS], rd[PC_READERS];
	struct tp_chan *ch;

	seen = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ck_assert_ptr_ne(seen, MAP_FAILED);
	ck_assert_int_eq(chan_open(ctx, "pc", TP_CHAN_CREATE, &ch), 0);
	for (unsigned i = 0; i < PC_READERS; i++)
		rd[i] = tpt_fork(pc_reader, NULL);
	for (unsigned i = 0; i < PC_WRITERS; i++)
		w[i] = tpt_fork(pc_writer, (void *)(uintptr_t)i);
	for (unsigned i = 0; i < PC_WRITERS; i++)
		ck_assert(tpt_wait_ok(w[i], T_MS, "writer"));
	ck_assert_int_eq(tp_chan_close(ch), 0);
	for (unsigned i = 0; i < PC_READERS; i++)
		ck_assert(tpt_wait_ok(rd[i], T_MS, "reader"));
	for (size_t i = 0; i < n; i++)
		ck_assert_msg(seen[i] == 1, "item %zx read %u times", i, seen[i]);
	tp_chan_release(ch);
	tp_context_free(ctx);
	munmap(seen, n);
}
END_TEST

#define BC_BATCHES 50
#define BC_BATCH 8

static int bc_writer(void *arg)
{
	unsigned w = (unsigned)(uintptr_t)arg;
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	struct tp_chan *ch;
	uint32_t v[BC_BATCH];

	TPT_REQUIRE(ctx, 1, "context");
	TPT_REQUIRE(chan_open(ctx, "bc", 0, &ch) == 0, 1, "open: %s", tp_last_error());
	for (unsigned b = 0; b < BC_BATCHES; b++) {
		for (unsigned i = 0; i < BC_BATCH; i++)
			v[i] = w << 16 | b << 4 | i;
		TPT_REQUIRE(write_u32(ch, v, BC_BATCH) == 0, 1, "write: %s", tp_last_error());
	}
	tp_chan_release(ch);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_batches_are_contiguous)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	struct tp_chan *ch;
	uint32_t v, first;
	pid_t a, b;

	ck_assert_int_eq(chan_open(ctx, "bc", TP_CHAN_CREATE, &ch), 0);
	a = tpt_fork(bc_writer, (void *)(uintptr_t)1);
	b = tpt_fork(bc_writer, (void *)(uintptr_t)2);
	ck_assert(tpt_wait_ok(a, T_MS, "writer 1"));
	ck_assert(tpt_wait_ok(b, T_MS, "writer 2"));
	for (unsigned k = 0; k < 2 * BC_BATCHES; k++) {
		ck_assert_int_eq(read_u32(ch, &first, 0), 0);
		ck_assert_uint_eq(first & 0xf, 0);
		for (unsigned i = 1; i < BC_BATCH; i++) {
			ck_assert_int_eq(read_u32(ch, &v, 0), 0);
			ck_assert_msg(v == first + i, "item %x follows batch start %x", v, first);
		}
	}
	ck_assert_int_eq(read_u32(ch, &v, 0), -EAGAIN);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

/* A reader in its own process: blocks on "@arg" with no deadline, exits 0 on -EPIPE; exits 10 +
 * the item's value when it gets one. */
static int blocked_reader(void *arg)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	struct tp_chan *ch;
	uint32_t v = 0;
	int r;

	TPT_REQUIRE(ctx, 1, "context");
	TPT_REQUIRE(chan_open(ctx, arg, 0, &ch) == 0, 1, "open: %s", tp_last_error());
	r = read_u32(ch, &v, -1);
	tp_chan_release(ch);
	tp_context_free(ctx);
	if (r == -EPIPE)
		return 0;
	return r >= 0 ? 10 + (int)v : 2;
}

static int exit_code(pid_t pid)
{
	int st;

	ck_assert_int_eq(tpt_wait(pid, T_MS, &st), 0);
	ck_assert(WIFEXITED(st));
	return WEXITSTATUS(st);
}

START_TEST(test_close_wakes_blocked_reader_in_other_process)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	struct tp_chan *ch;
	pid_t p;

	ck_assert_int_eq(chan_open(ctx, "wake", TP_CHAN_CREATE, &ch), 0);
	p = tpt_fork(blocked_reader, "wake");
	wait_readers("wake", 1);
	ck_assert_int_eq(tp_chan_close(ch), 0);
	ck_assert_int_eq(exit_code(p), 0);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

START_TEST(test_oldest_waiting_reader_first)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	const uint32_t one = 1, two = 2;
	struct tp_chan *ch;
	pid_t a, b;

	ck_assert_int_eq(chan_open(ctx, "fair", TP_CHAN_CREATE, &ch), 0);
	a = tpt_fork(blocked_reader, "fair");
	wait_readers("fair", 1);
	b = tpt_fork(blocked_reader, "fair");
	wait_readers("fair", 2);
	ck_assert_int_eq(write_u32(ch, &one, 1), 0);
	ck_assert_int_eq(exit_code(a), 11); /* the first reader got the first item */
	wait_readers("fair", 1);
	ck_assert_int_eq(write_u32(ch, &two, 1), 0);
	ck_assert_int_eq(exit_code(b), 12);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

/* Pipeline stage @arg (1 or 2): reads from "s<arg>", writes value + 1 to "s<arg+1>", and on
 * drain closes its output (the cascade). */
static int stage(void *arg)
{
	unsigned k = (unsigned)(uintptr_t)arg;
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	char in_name[8], out_name[8];
	struct tp_chan *in, *out;
	uint32_t v;
	int r;

	TPT_REQUIRE(ctx, 1, "context");
	snprintf(in_name, sizeof(in_name), "s%u", k);
	snprintf(out_name, sizeof(out_name), "s%u", k + 1);
	TPT_REQUIRE(chan_open(ctx, in_name, 0, &in) == 0, 1, "open: %s", tp_last_error());
	TPT_REQUIRE(chan_open(ctx, out_name, 0, &out) == 0, 1, "open: %s", tp_last_error());
	while ((r = read_u32(in, &v, -1)) >= 0) {
		v++;
		TPT_REQUIRE(write_u32(out, &v, 1) == 0, 1, "write: %s", tp_last_error());
	}
	TPT_REQUIRE(r == -EPIPE, 1, "read: %d", r);
	TPT_REQUIRE(tp_chan_close(out) == 0, 1, "close: %s", tp_last_error());
	tp_chan_release(in);
	tp_chan_release(out);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_pipeline_cascading_close)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	struct tp_chan *s1, *s2, *s3;
	uint32_t v, sum = 0;
	unsigned n = 0;
	pid_t a, b;
	int r;

	ck_assert_int_eq(chan_open(ctx, "s1", TP_CHAN_CREATE, &s1), 0);
	ck_assert_int_eq(chan_open(ctx, "s2", TP_CHAN_CREATE, &s2), 0);
	ck_assert_int_eq(chan_open(ctx, "s3", TP_CHAN_CREATE, &s3), 0);
	a = tpt_fork(stage, (void *)(uintptr_t)1);
	b = tpt_fork(stage, (void *)(uintptr_t)2);
	for (uint32_t i = 0; i < 100; i++)
		ck_assert_int_eq(write_u32(s1, &i, 1), 0);
	ck_assert_int_eq(tp_chan_close(s1), 0);
	while ((r = read_u32(s3, &v, T_MS)) >= 0) {
		sum += v;
		n++;
	}
	ck_assert_int_eq(r, -EPIPE);
	ck_assert_uint_eq(n, 100);
	ck_assert_uint_eq(sum, 99 * 100 / 2 + 200);
	ck_assert(tpt_wait_ok(a, T_MS, "stage 1"));
	ck_assert(tpt_wait_ok(b, T_MS, "stage 2"));
	tp_chan_release(s1);
	tp_chan_release(s2);
	tp_chan_release(s3);
	tp_context_free(ctx);
}
END_TEST

/* A reader dies while it waits: the daemon drops its wait, the next reader gets the item. */
START_TEST(test_dead_reader_loses_nothing)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	const uint32_t v = 3;
	struct tp_chan *ch;
	uint32_t got;
	pid_t p;
	int st;

	ck_assert_int_eq(chan_open(ctx, "dead", TP_CHAN_CREATE, &ch), 0);
	p = tpt_fork(blocked_reader, "dead");
	wait_readers("dead", 1);
	kill(p, SIGKILL);
	ck_assert_int_eq(tpt_wait(p, T_MS, &st), 0);
	wait_readers("dead", 0);
	ck_assert_int_eq(write_u32(ch, &v, 1), 0);
	ck_assert_int_eq(read_u32(ch, &got, 0), 0);
	ck_assert_uint_eq(got, 3);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

/* A writer in its own process: one 4-byte item @arg->v into "bp", waiting without deadline;
 * exits 0 when written, 3 on -EPIPE. */
static int blocked_writer(void *arg)
{
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	uint32_t v = (uint32_t)(uintptr_t)arg;
	struct iovec iov = { .iov_base = &v, .iov_len = sizeof(v) };
	struct tp_chan *ch;
	int r;

	TPT_REQUIRE(ctx, 1, "context");
	TPT_REQUIRE(chan_open(ctx, "bp", 0, &ch) == 0, 1, "open: %s", tp_last_error());
	r = tp_chan_write(ch, &iov, 1, -1);
	tp_chan_release(ch);
	tp_context_free(ctx);
	return r == 0 ? 0 : r == -EPIPE ? 3 : 2;
}

/*
 * A timed write on a full channel fails no earlier than its timeout, every time: the daemon's
 * timers read a precise clock (libevent's default, CLOCK_MONOTONIC_COARSE, ticks every 4 ms
 * here, and a 10 ms timeout then ended after as little as 6 ms).
 */
START_TEST(test_timed_write_never_ends_early)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE,
				     .capacity_items = 1, .owner_uid = -1 };
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	const uint32_t v = 7;
	struct iovec iov = { .iov_base = (void *)&v, .iov_len = 4 };
	struct tp_chan *ch;

	ck_assert_int_eq(tp_chan_open(ctx, "early", &o, &ch), 0);
	ck_assert_int_eq(write_u32(ch, &v, 1), 0);
	for (int i = 0; i < 30; i++) {
		struct timespec a, b;
		int64_t us;

		clock_gettime(CLOCK_MONOTONIC, &a);
		ck_assert_int_eq(tp_chan_write(ch, &iov, 1, 10), -ETIMEDOUT);
		clock_gettime(CLOCK_MONOTONIC, &b);
		us = (b.tv_sec - a.tv_sec) * 1000000 + (b.tv_nsec - a.tv_nsec) / 1000;
		ck_assert_msg(us >= 10000, "try %d: a 10 ms timeout ended after %lld us", i,
			      (long long)us);
	}
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

START_TEST(test_write_waits_for_room)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE,
				     .capacity_items = 2, .owner_uid = -1 };
	struct tp_context *ctx = ctx_new(&tpt_fixture_daemon);
	const uint32_t v[2] = { 1, 2 };
	struct iovec iov = { .iov_base = (void *)v, .iov_len = 4 };
	struct tp_chan *ch;
	uint32_t got;
	uint64_t t0;
	pid_t p;

	ck_assert_int_eq(tp_chan_open(ctx, "bp", &o, &ch), 0);
	ck_assert_int_eq(write_u32(ch, v, 2), 0);
	t0 = tpt_now_ms();
	ck_assert_int_eq(tp_chan_write(ch, &iov, 1, 100), -ETIMEDOUT); /* timed: nothing written */
	ck_assert_uint_ge(tpt_now_ms() - t0, 100);
	ck_assert_int_eq(ctl_field(&tpt_fixture_daemon, "bp", "items"), 2);
	p = tpt_fork(blocked_writer, (void *)(uintptr_t)3);
	wait_field("bp", "writers_waiting", 1);
	ck_assert_int_eq(read_u32(ch, &got, 0), 0); /* room: the waiting write goes in */
	ck_assert_uint_eq(got, 1);
	ck_assert_int_eq(exit_code(p), 0);
	ck_assert_int_eq(read_u32(ch, &got, 0), 0);
	ck_assert_uint_eq(got, 2);
	ck_assert_int_eq(read_u32(ch, &got, 0), 0);
	ck_assert_uint_eq(got, 3);
	/* A write waiting when the channel closes fails with -EPIPE. */
	ck_assert_int_eq(write_u32(ch, v, 2), 0);
	p = tpt_fork(blocked_writer, (void *)(uintptr_t)4);
	wait_field("bp", "writers_waiting", 1);
	ck_assert_int_eq(tp_chan_close(ch), 0);
	ck_assert_int_eq(exit_code(p), 3);
	ck_assert_int_eq(ctl_field(&tpt_fixture_daemon, "bp", "items"), 2);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

/* ---- another uid ----------------------------------------------------------------------------- */

static int other_uid(void *arg)
{
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = 0 };
	struct tp_context *ctx;
	struct tp_chan *ch;
	int r;

	(void)arg;
	TPT_REQUIRE(setgroups(0, NULL) == 0 && setresgid(NOBODY, NOBODY, NOBODY) == 0 &&
		    setresuid(NOBODY, NOBODY, NOBODY) == 0, 1, "cannot drop to nobody");
	ctx = ctx_new(&tpt_fixture_daemon);
	TPT_REQUIRE(ctx, 1, "context");
	r = tp_chan_open(ctx, "private", &o, &ch);
	TPT_REQUIRE(r == -ENOENT, 1, "private channel (as a missing one): %d", r);
	r = tp_chan_open(ctx, "public", &o, &ch);
	TPT_REQUIRE(r == 0, 1, "public channel: %d %s", r, tp_last_error());
	tp_chan_release(ch);
	o.flags = TP_CHAN_CREATE; /* nobody creates in root's names */
	r = tp_chan_open(ctx, "squat", &o, &ch);
	TPT_REQUIRE(r == -ENOENT, 1, "create in another uid's names: %d", r);
	r = tp_chan_unlink(ctx, "public", 0);
	TPT_REQUIRE(r == -EACCES, 1, "unlink of another uid's channel: %d", r);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_other_uid_access)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *ctx;
	struct tp_chan *priv, *pub;

	if (geteuid() != 0) {
		printf("skipped: needs root to run a client as another uid\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_open_to_all(&tpt_fixture_daemon), 0);
	ctx = ctx_new(&tpt_fixture_daemon);
	ck_assert_int_eq(tp_chan_open(ctx, "private", &o, &priv), 0);
	o.access = TP_ACCESS_ANYONE;
	ck_assert_int_eq(tp_chan_open(ctx, "public", &o, &pub), 0);
	ck_assert(tpt_wait_ok(tpt_fork(other_uid, NULL), T_MS, "other uid"));
	tp_chan_release(priv);
	tp_chan_release(pub);
	tp_context_free(ctx);
}
END_TEST

static Suite *chan_suite(void)
{
	Suite *s = suite_create("chan");
	TCase *tc = tcase_create("chan");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_close_then_drain);
	tcase_add_test(tc, test_try_once_and_timeout);
	tcase_add_test(tc, test_timed_write_never_ends_early);
	tcase_add_test(tc, test_release_is_not_close_and_persistence);
	tcase_add_test(tc, test_bad_input);
	tcase_add_test(tc, test_limits_per_uid_and_channel);
	tcase_add_test(tc, test_bytes_per_uid);
	tcase_add_test(tc, test_producers_consumers);
	tcase_add_test(tc, test_batches_are_contiguous);
	tcase_add_test(tc, test_close_wakes_blocked_reader_in_other_process);
	tcase_add_test(tc, test_oldest_waiting_reader_first);
	tcase_add_test(tc, test_pipeline_cascading_close);
	tcase_add_test(tc, test_dead_reader_loses_nothing);
	tcase_add_test(tc, test_write_waits_for_room);
	tcase_add_test(tc, test_other_uid_access);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(chan_suite());
}
