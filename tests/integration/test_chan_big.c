/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: channel items that do not ride inline and batch reads (issue 25 part
 * chanfast; docs/channels.md "Items at any size"). Items from 16 KiB + 1 to 16 MiB written from
 * shared buffers and from private memory (through staging buffers, or by CMA where the daemon
 * leaves no room for them) arrive byte-exact, each exactly once, in 1 and 4 reader processes
 * reading into private memory (tp_chan_read(), tp_chan_read_into()) and into shared buffers; the channel's byte capacity just at and just above an item; a read's
 * allocation just below and at the item's length; batch reads take up to their maximum and the
 * daemon's inline limit, in order, and stop before a large item; the owner's chan-bytes-per-uid
 * counts items by reference just at and just above; two threads reading through one handle
 * get each large item once; a reader that dies while the
 * daemon holds an item for it, and a reader whose allocation the daemon cannot write, lose the
 * item to nobody: the next reader gets it.
 */
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "itest.h"
#include "tpt_wire.h"

#define T_MS 30000
#define N_ITEMS 6
#define MIB (1u << 20)

static void setup(void)
{
	tpt_fixture_start();
}

static void teardown(void)
{
	tpt_fixture_stop();
}

/* Item @i: its length, and its bytes derived from (i, offset). */
static size_t item_len(unsigned i)
{
	static const size_t lens[] = { TPW_CHAN_SHM_ITEM + 1, MIB, 16 * MIB - 3, 3 * MIB + 1,
					 TPW_CHAN_INLINE_ITEM + 1, 16 * MIB };

	return lens[i % TPU_ARRAY_SIZE(lens)];
}

static void item_fill(uint8_t *p, unsigned i, size_t len)
{
	uint32_t x = 2654435761u * (i + 1);

	for (size_t k = 0; k < len; k++) {
		x = x * 1103515245u + 12345u;
		p[k] = (uint8_t)(x >> 16);
	}
	memcpy(p, &i, sizeof(i)); /* the index first */
}

static __thread uint8_t *want; /* item_check()'s, per thread: two threads check items at once */

/* Frees this thread's item_check() buffer (a thread that ends calls it). */
static void item_check_done(void)
{
	free(want);
	want = NULL;
}

/* Checks that @p (@len bytes) is one item; its index into *@ret. Return: 0 or -1. */
static int item_check(const uint8_t *p, size_t len, unsigned *ret)
{
	unsigned i;

	if (len < sizeof(i))
		return -1;
	memcpy(&i, p, sizeof(i));
	if (i >= N_ITEMS || len != item_len(i))
		return -1;
	if (!want && !(want = malloc(16 * MIB)))
		return -1;
	item_fill(want, i, len);
	*ret = i;
	return memcmp(p, want, len) == 0 ? 0 : -1;
}

enum rmode { R_READ, R_INTO_PRIVATE, R_INTO_SHARED };

struct big_run {
	const char *name;
	bool shared_writer;
	enum rmode rmode;
	unsigned readers;
	atomic_uint *got; /* per item: times read (MAP_SHARED) */
	uid_t reader_uid;  /* readers run as this uid (0: as the test), opening root's channel */
	struct tpt_sync created; /* with @reader_uid: the channel exists */
};

/* The daemon of the running case: the fixture's, or one of its own (test_failed_...). */
static struct tpt_daemon *cur = &tpt_fixture_daemon;

static struct tp_context *ctx_new(void)
{
	struct tp_context *ctx = NULL;

	if (tpt_ctx_new(cur, 0, "chanbig", &ctx) < 0)
		return NULL;
	return ctx;
}

/* A reader process: reads items until the channel is drained, checking each. */
static int big_reader(void *arg)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	const struct big_run *br = arg;
	struct tp_context *ctx;
	struct tp_chan *ch;
	void *buf = NULL, *item;
	size_t len;
	unsigned i;
	int r;

	if (br->reader_uid)
		TPT_REQUIRE(setgroups(0, NULL) == 0 && setresgid(br->reader_uid, br->reader_uid,
								 br->reader_uid) == 0 &&
			    setresuid(br->reader_uid, br->reader_uid, br->reader_uid) == 0 &&
			    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) == 0, 1, /* CMA: ptrace-able again */
			    "cannot run as uid %u", (unsigned)br->reader_uid);
	ctx = ctx_new();
	if (br->reader_uid) {
		o.flags = 0; /* root's channel, created by the writer */
		o.owner_uid = 0;
		TPT_REQUIRE(tpt_sync_wait((struct tpt_sync *)&br->created, T_MS) == 1, 1, "created");
	}
	TPT_REQUIRE(ctx, 1, "context");
	TPT_REQUIRE(tp_chan_open(ctx, br->name, &o, &ch) == 0, 1, "open: %s", tp_last_error());
	if (br->rmode == R_INTO_SHARED)
		TPT_REQUIRE(tp_buffer_alloc(ctx, 16 * MIB, &buf) == 0, 1, "buffer");
	else if (br->rmode == R_INTO_PRIVATE)
		buf = malloc(16 * MIB);
	for (;;) {
		if (br->rmode == R_READ) {
			r = tp_chan_read(ch, &item, &len, T_MS);
		} else {
			r = tp_chan_read_into(ch, buf, 16 * MIB, &len, T_MS);
			item = buf;
		}
		if (r == -EPIPE)
			break;
		TPT_REQUIRE(r >= 0, 1, "read: %d %s", r, tp_last_error());
		TPT_REQUIRE(item_check(item, len, &i) == 0, 1, "item of %zu bytes is wrong", len);
		atomic_fetch_add(&br->got[i], 1);
		if (br->rmode == R_READ)
			free(item);
	}
	if (br->rmode == R_INTO_SHARED)
		tp_buffer_free(ctx, buf);
	else
		free(buf);
	tp_chan_release(ch);
	tp_context_free(ctx);
	return 0;
}

/* Writes N_ITEMS items into @br->name from shared or private memory, closes, and checks that
 * the readers got each exactly once. */
static void big_run(struct big_run *br)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *ctx;
	struct tp_chan *ch;
	pid_t pids[4];
	uint8_t *src[2];

	br->got = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ck_assert(br->got != MAP_FAILED);
	if (br->reader_uid) {
		ck_assert_int_eq(tpt_sync_init(&br->created), 0);
		o.access = TP_ACCESS_ANYONE;
	}
	for (unsigned k = 0; k < br->readers; k++)
		pids[k] = tpt_fork(big_reader, br);
	ctx = ctx_new();
	ck_assert_ptr_nonnull(ctx);
	ck_assert_int_eq(tp_chan_open(ctx, br->name, &o, &ch), 0);
	for (unsigned k = 0; br->reader_uid && k < br->readers; k++)
		ck_assert_int_eq(tpt_sync_post(&br->created, 1), 0);
	for (unsigned k = 0; k < 2; k++) {
		if (br->shared_writer)
			ck_assert_int_eq(tp_buffer_alloc(ctx, 16 * MIB, (void **)&src[k]), 0);
		else
			ck_assert_ptr_nonnull(src[k] = malloc(16 * MIB));
	}
	for (unsigned i = 0; i < N_ITEMS; i += 2) { /* batches of two, the buffers reused */
		struct iovec iov[2];

		for (unsigned k = 0; k < 2; k++) {
			item_fill(src[k], i + k, item_len(i + k));
			iov[k] = (struct iovec){ .iov_base = src[k], .iov_len = item_len(i + k) };
		}
		ck_assert_msg(tp_chan_write(ch, iov, 2, T_MS) == 0, "%s", tp_last_error());
	}
	ck_assert_int_eq(tp_chan_close(ch), 0);
	for (unsigned k = 0; k < br->readers; k++)
		ck_assert(tpt_wait_ok(pids[k], 4 * T_MS, "reader"));
	for (unsigned i = 0; i < N_ITEMS; i++)
		ck_assert_msg(br->got[i] == 1, "item %u read %u times", i, br->got[i]);
	for (unsigned k = 0; k < 2; k++) {
		if (br->shared_writer)
			tp_buffer_free(ctx, src[k]);
		else
			free(src[k]);
	}
	tp_chan_release(ch);
	tp_context_free(ctx);
	munmap(br->got, 4096);
	if (br->reader_uid)
		tpt_sync_done(&br->created);
}

START_TEST(test_large_shared_to_shared_4_readers)
{
	struct big_run br = { .name = "big.ss", .shared_writer = true, .rmode = R_INTO_SHARED,
			      .readers = 4 };

	big_run(&br);
}
END_TEST

START_TEST(test_large_private_to_read_1_reader)
{
	struct big_run br = { .name = "big.pr", .rmode = R_READ, .readers = 1 };

	big_run(&br);
}
END_TEST

START_TEST(test_large_private_to_read_4_readers)
{
	struct big_run br = { .name = "big.pr4", .rmode = R_READ, .readers = 4 };

	big_run(&br);
}
END_TEST

START_TEST(test_large_shared_to_private_into_1_reader)
{
	struct big_run br = { .name = "big.sp", .shared_writer = true, .rmode = R_INTO_PRIVATE,
			      .readers = 1 };

	big_run(&br);
}
END_TEST

/* Private memory by CMA both ways: a daemon that leaves no room for staging buffers. */
START_TEST(test_large_private_by_cma)
{
	static const char *const args[] = { "--buffer-bytes-max", "4K", NULL };
	struct big_run a = { .name = "big.cma4", .rmode = R_READ, .readers = 4 };
	struct big_run b = { .name = "big.cma1", .rmode = R_INTO_PRIVATE, .readers = 1 };
	static struct tpt_daemon d;

	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	cur = &d;
	big_run(&a);
	big_run(&b);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
	cur = &tpt_fixture_daemon;
}
END_TEST

/* Readers of another uid whose staging buffers the daemon refuses (buffer-bytes-per-uid, which
 * the library does not know; root, the writer, is exempt): their reads go by CMA instead,
 * nothing lost. */
START_TEST(test_refused_staging_falls_back)
{
	static const char *const args[] = { "--buffer-bytes-per-uid", "64K", NULL };
	struct big_run a = { .name = "big.ref1", .rmode = R_READ, .readers = 1,
			     .reader_uid = 4242 };
	struct big_run b = { .name = "big.ref2", .rmode = R_INTO_PRIVATE, .readers = 1,
			     .reader_uid = 4242 };
	static struct tpt_daemon d;

	if (geteuid() != 0) {
		printf("skipped: needs root to run readers as another uid\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
	cur = &d;
	big_run(&a);
	big_run(&b);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
	cur = &tpt_fixture_daemon;
}
END_TEST

/* Capacity just at and just above a 16 MiB item; a read's allocation just below and at it. */
START_TEST(test_limits_around_16mib)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .capacity_bytes = 16 * MIB };
	struct tp_context *ctx = ctx_new();
	struct iovec iov;
	struct tp_chan *ch;
	uint8_t *p = malloc(16 * MIB + 1);
	size_t len = 0;
	unsigned i;

	ck_assert_ptr_nonnull(p);
	ck_assert_int_eq(tp_chan_open(ctx, "big.cap", &o, &ch), 0);
	iov = (struct iovec){ .iov_base = p, .iov_len = 16 * MIB + 1 };
	ck_assert_int_eq(tp_chan_write(ch, &iov, 1, 0), -EMSGSIZE); /* just above */
	item_fill(p, 5, item_len(5));
	iov.iov_len = item_len(5); /* 16 MiB: just at */
	ck_assert_msg(tp_chan_write(ch, &iov, 1, 0) == 0, "%s", tp_last_error());
	iov.iov_len = 1;
	ck_assert_int_eq(tp_chan_write(ch, &iov, 1, 0), -ENOBUFS); /* full */
	memset(p, 0, 16 * MIB + 1);
	ck_assert_int_eq(tp_chan_read_into(ch, p, 16 * MIB - 1, &len, 0), -EMSGSIZE);
	ck_assert_uint_eq(len, 16 * MIB); /* the item stays */
	ck_assert_int_eq(tp_chan_read_into(ch, p, 16 * MIB, &len, 0), 0);
	ck_assert_uint_eq(len, 16 * MIB);
	ck_assert_int_eq(item_check(p, len, &i), 0);
	ck_assert_uint_eq(i, 5);
	ck_assert_int_eq(tp_chan_read_into(ch, p, 16 * MIB, &len, 0), -EAGAIN);
	free(p);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

static int read_many_u32(struct tp_chan *ch, size_t max, uint32_t *first, size_t *ret_n)
{
	struct tp_chan_item it[300];
	int r = tp_chan_read_many(ch, it, max, ret_n, 0);

	for (size_t k = 0; r >= 0 && k < *ret_n; k++) {
		if (k == 0)
			memcpy(first, it[k].data, sizeof(*first));
		free(it[k].data);
	}
	return r;
}

/* Batch reads: up to their maximum, up to the inline limit (1 MiB: 256 items of 4 KiB), in
 * order; a large item comes alone. */
START_TEST(test_read_many)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *ctx = ctx_new();
	static uint8_t items[300][4096];
	struct iovec iov[300];
	struct tp_chan *ch;
	uint32_t first = 0;
	uint8_t *big = malloc(MIB);
	size_t n = 0;

	ck_assert_int_eq(tp_chan_open(ctx, "big.many", &o, &ch), 0);
	for (uint32_t i = 0; i < 300; i++) {
		memcpy(items[i], &i, sizeof(i));
		iov[i] = (struct iovec){ .iov_base = items[i], .iov_len = 4096 };
	}
	ck_assert_int_eq(tp_chan_write(ch, iov, 200, 0), 0);
	ck_assert_int_eq(tp_chan_write(ch, iov + 200, 100, 0), 0);
	ck_assert_int_eq(read_many_u32(ch, 1, &first, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(first, 0);
	ck_assert_int_eq(read_many_u32(ch, 10, &first, &n), 0);
	ck_assert_uint_eq(n, 10);
	ck_assert_uint_eq(first, 1);
	ck_assert_int_eq(read_many_u32(ch, 300, &first, &n), 0);
	ck_assert_uint_eq(n, 256); /* the inline limit */
	ck_assert_uint_eq(first, 11);
	ck_assert_int_eq(read_many_u32(ch, 300, &first, &n), 0);
	ck_assert_uint_eq(n, 300 - 267);
	ck_assert_uint_eq(first, 267);
	/* small, small, large, small: 2, then the large one alone, then 1 */
	iov[2] = (struct iovec){ .iov_base = big, .iov_len = MIB };
	memcpy(big, &(uint32_t){ 77 }, 4);
	ck_assert_int_eq(tp_chan_write(ch, iov, 4, 0), 0);
	ck_assert_int_eq(read_many_u32(ch, 300, &first, &n), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert_int_eq(read_many_u32(ch, 300, &first, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(first, 77);
	ck_assert_int_eq(read_many_u32(ch, 300, &first, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(first, 3);
	ck_assert_int_eq(tp_chan_close(ch), 0);
	ck_assert_int_eq(read_many_u32(ch, 300, &first, &n), -EPIPE);
	free(big);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

/* A raw client of protocol minor 7 on channel @name: sends a READ of a large item, gets it held
 * (ChanReply.held_len) and exits without taking it. */
static int held_then_die(void *arg)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__DaemonMsg *dm;
	struct tpt_raw r;
	uint64_t id;

	TPT_REQUIRE(tpt_raw_connect(&r, cur->socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	op.name = arg;
	op.create = true;
	op.req_id = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CHAN_OP;
	m.chan_op = &op;
	TPT_REQUIRE(tpt_raw_send(&r, &m, NULL, 0, NULL, 0, 0) == 0, 1, "send");
	TPT_REQUIRE(tpt_raw_expect(&r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm) == 0, 1,
		    "open answer");
	id = dm->chan_reply->chan_id;
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	op = (Tpw__V1__ChanOp)TPW__V1__CHAN_OP__INIT;
	op.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_READ;
	op.chan_id = id;
	op.timeout_ms = UINT32_MAX;
	op.req_id = 2;
	TPT_REQUIRE(tpt_raw_send(&r, &m, NULL, 0, NULL, 0, 0) == 0, 1, "send");
	TPT_REQUIRE(tpt_raw_expect(&r, TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY, T_MS, &dm) == 0, 1,
		    "read answer");
	TPT_REQUIRE(dm->chan_reply->status == TPW__V1__STATUS__STATUS_OK &&
		    dm->chan_reply->held_len == MIB, 1, "not held: status %d, held %llu",
		    dm->chan_reply->status, (unsigned long long)dm->chan_reply->held_len);
	tpw__v1__daemon_msg__free_unpacked(dm, NULL);
	_exit(0); /* dies holding it */
}

/* A reader whose allocation the daemon cannot write (an address CMA refuses; its daemon allows
 * no staging buffer): its read fails, the item stays first. */
static int bad_allocation(void *arg)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *ctx = ctx_new();
	struct tp_chan *ch;
	void *hole = mmap(NULL, 2 * MIB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	size_t len;
	int r;

	TPT_REQUIRE(ctx && hole != MAP_FAILED, 1, "context");
	TPT_REQUIRE(tp_chan_open(ctx, arg, &o, &ch) == 0, 1, "open");
	r = tp_chan_read_into(ch, hole, 2 * MIB, &len, T_MS);
	TPT_REQUIRE(r < 0, 1, "read into a PROT_NONE mapping succeeded");
	tp_chan_release(ch);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_failed_or_dead_reader_loses_nothing)
{
	static const char *const args[] = { "--buffer-bytes-max", "4K", NULL };
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	static struct tpt_daemon d;
	pid_t dead, bad;
	struct tp_context *ctx;
	struct tp_chan *ch;
	uint8_t *p = malloc(MIB);
	struct iovec iov = { .iov_base = p, .iov_len = MIB };
	void *item;
	size_t len;
	unsigned i;

	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	cur = &d;
	dead = tpt_fork(held_then_die, "big.dead");
	bad = tpt_fork(bad_allocation, "big.dead");
	ctx = ctx_new();
	ck_assert_int_eq(tp_chan_open(ctx, "big.dead", &o, &ch), 0);
	item_fill(p, 1, MIB);
	ck_assert_int_eq(tp_chan_write(ch, &iov, 1, T_MS), 0);
	ck_assert(tpt_wait_ok(dead, T_MS, "held then died"));
	ck_assert(tpt_wait_ok(bad, T_MS, "bad allocation"));
	ck_assert_int_eq(tp_chan_read(ch, &item, &len, T_MS), 0);
	ck_assert_int_eq(item_check(item, len, &i), 0);
	ck_assert_uint_eq(i, 1);
	free(item);
	free(p);
	tp_chan_release(ch);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
	cur = &tpt_fixture_daemon;
}
END_TEST

/* The owner's chan-bytes-per-uid counts items copied in by reference, just at and just above,
 * in two channels; a read gives the bytes back. */
START_TEST(test_uid_bytes_by_reference)
{
	static const char *const args[] = { "--chan-bytes-per-uid", "3M", NULL };
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tpt_daemon d;
	struct tp_context *ctx;
	struct tp_chan *a, *b;
	uint8_t *p = malloc(2 * MIB);
	struct iovec iov = { .iov_base = p, .iov_len = 2 * MIB };
	void *item;
	size_t len;

	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(tpt_ctx_new(&d, 0, "uidbytes", &ctx), 0);
	ck_assert_int_eq(tp_chan_open(ctx, "a", &o, &a), 0);
	ck_assert_int_eq(tp_chan_open(ctx, "b", &o, &b), 0);
	memset(p, 7, 2 * MIB);
	ck_assert_int_eq(tp_chan_write(a, &iov, 1, 0), 0); /* 2 MiB */
	iov.iov_len = MIB + 1;
	ck_assert_int_eq(tp_chan_write(b, &iov, 1, 0), -ENOBUFS); /* 3 MiB + 1: just above */
	iov.iov_len = MIB;
	ck_assert_int_eq(tp_chan_write(b, &iov, 1, 0), 0); /* 3 MiB: just at */
	ck_assert_int_eq(tp_chan_read(a, &item, &len, 0), 0);
	ck_assert_uint_eq(len, 2 * MIB);
	free(item);
	iov.iov_len = 2 * MIB;
	ck_assert_int_eq(tp_chan_write(b, &iov, 1, 0), 0); /* room again */
	free(p);
	tp_chan_release(a);
	tp_chan_release(b);
	tp_context_free(ctx);
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

struct thread_reader {
	struct tp_chan *ch;
	atomic_uint *got;
	int r;
};

static void *thread_read(void *arg)
{
	struct thread_reader *t = arg;
	void *item;
	size_t len;
	unsigned i;

	while ((t->r = tp_chan_read(t->ch, &item, &len, T_MS)) >= 0) {
		if (item_check(item, len, &i) < 0)
			t->r = -EBADMSG;
		else
			atomic_fetch_add(&t->got[i], 1);
		free(item);
		if (t->r < 0)
			break;
	}
	item_check_done();
	return NULL;
}

/* Two threads reading large items through one handle: each item once (the daemon holds one
 * item per handle; the thread that finds it taken by the other reads again). */
START_TEST(test_two_threads_one_handle)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *ctx = ctx_new();
	static atomic_uint got[N_ITEMS];
	struct thread_reader t[2];
	pthread_t tid[2];
	struct tp_chan *ch;
	uint8_t *p = malloc(16 * MIB);

	ck_assert_int_eq(tp_chan_open(ctx, "big.threads", &o, &ch), 0);
	for (unsigned k = 0; k < 2; k++) {
		t[k] = (struct thread_reader){ .ch = ch, .got = got };
		ck_assert_int_eq(pthread_create(&tid[k], NULL, thread_read, &t[k]), 0);
	}
	for (unsigned i = 0; i < N_ITEMS; i++) {
		struct iovec iov = { .iov_base = p, .iov_len = item_len(i) };

		item_fill(p, i, item_len(i));
		ck_assert_int_eq(tp_chan_write(ch, &iov, 1, T_MS), 0);
	}
	ck_assert_int_eq(tp_chan_close(ch), 0);
	for (unsigned k = 0; k < 2; k++) {
		pthread_join(tid[k], NULL);
		ck_assert_int_eq(t[k].r, -EPIPE);
	}
	for (unsigned i = 0; i < N_ITEMS; i++)
		ck_assert_uint_eq(got[i], 1);
	free(p);
	tp_chan_release(ch);
	tp_context_free(ctx);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("chan_big");
	TCase *tc = tcase_create("chan_big");

	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_large_shared_to_shared_4_readers);
	tcase_add_test(tc, test_large_private_to_read_1_reader);
	tcase_add_test(tc, test_large_private_to_read_4_readers);
	tcase_add_test(tc, test_large_shared_to_private_into_1_reader);
	tcase_add_test(tc, test_large_private_by_cma);
	tcase_add_test(tc, test_refused_staging_falls_back);
	tcase_add_test(tc, test_limits_around_16mib);
	tcase_add_test(tc, test_read_many);
	tcase_add_test(tc, test_failed_or_dead_reader_loses_nothing);
	tcase_add_test(tc, test_uid_bytes_by_reference);
	tcase_add_test(tc, test_two_threads_one_handle);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
